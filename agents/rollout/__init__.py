"""Rollouts: what an agent must do to play episodes (:mod:`~agents.rollout.agent`), the loop that plays
many at once over a batch environment (:mod:`~agents.rollout.collect`), the learner's padded batch
(:mod:`~agents.rollout.batch`), and the engines that generate: a local ``transformers`` model
(:mod:`~agents.rollout.hf_sampler`) and an OpenAI-compatible server (:mod:`~agents.rollout.endpoint`).

Imports :mod:`agents.policies` only. The agent protocol needs neither torch nor a model.
"""
