"""Rollouts: what an agent must do to play episodes (:mod:`~agents.rollout.agent`), the loop that plays
many at once over a batch environment (:mod:`~agents.rollout.collect`), the learner's padded batch
(:mod:`~agents.rollout.batch`), and the rollout engines that generate them, each a registered name
(:mod:`~agents.rollout.engines`: the protocol, the registry, :func:`~agents.rollout.engines.register_engine`):

* ``hf`` (:mod:`~agents.rollout.hf_engine`): the trained model itself samples, keeping its KV cache across
  turns (:mod:`~agents.rollout.hf_sampler`);
* ``vllm`` (:mod:`~agents.rollout.vllm_engine`): a vLLM engine in the trainer's process, loading the policy
  from a model folder (:mod:`~agents.rollout.vllm_folder`);
* ``vllm-server`` (:mod:`~agents.rollout.vllm_server_engine`): vLLM servers in processes of their own
  (:mod:`~agents.rollout.vllm_server_process`: their launcher, weight receiver and handles);
* ``endpoint`` (:mod:`~agents.rollout.endpoint`): an OpenAI-compatible server, for evaluation only.

An engine with its own copy of the weights has its syncs checked against the trainer's policy
(:mod:`~agents.rollout.sync_check`).

Imports :mod:`agents.policies` only. The agent protocol needs neither torch nor a model; an engine's module
is imported when its name is first looked up.
"""
