"""LLM baselines of the search-agent papers' tables, played in the same environment with the same LLM.

Each baseline prompts its LLM with its own instructions (:mod:`~agents.baselines.text`: one text
interface over the HF sampler or an OpenAI-compatible endpoint) and writes into the environment only
the protocol's calls - a thought, a search, the answer - so the environment's sources, budgets, reward
and counters apply to every row alike (:mod:`~agents.baselines.play`). One module per family:

- :mod:`~agents.baselines.closed_book`: ``direct`` (answer the bare question) and ``cot`` (reason
  step by step, then answer);
- :mod:`~agents.baselines.rag`: ``naive-rag`` (one search with the question, answer from the results);
- :mod:`~agents.baselines.ircot`: ``ircot`` (interleave reasoning sentences with searches for them);
- :mod:`~agents.baselines.oracle_passages`: ``oracle-passages`` (answer from the gold passages: an
  upper bound).

The ``protocol`` row of such a table is the LLM itself writing freely under the environment's prompt:
the rollout agent of the model (:class:`~agents.rollout.hf_sampler.HFSampler`,
:class:`~agents.rollout.endpoint.CompletionsEndpointAgent`), with no baseline around it.

Example, with a local model on the first eight questions of the built-in synthetic world::

    from agents.baselines import BASELINES, BaselineAgent, RolloutTextGenerator
    from agents.policies.loading import load_policy
    from agents.rollout.collect import collect_rollouts
    from agents.rollout.hf_sampler import HFSampler
    from search_env import BatchSearchQAEnv

    sampler = HFSampler(load_policy("smollm2"), greedy=True)
    agent = BaselineAgent(BASELINES["ircot"](), RolloutTextGenerator(sampler))
    rollout = collect_rollouts(agent, BatchSearchQAEnv(8, tokenizer=agent.codec), range(8))
"""
from __future__ import annotations

from typing import Callable

from agents.baselines.closed_book import ChainOfThought, Direct
from agents.baselines.ircot import IRCoT
from agents.baselines.oracle_passages import NoGoldPassages, OraclePassages, gold_passages
from agents.baselines.play import Ask, Baseline, BaselineAgent, Episode, Write
from agents.baselines.rag import NaiveRAG
from agents.baselines.text import RolloutTextGenerator, TextGenerator

__all__ = ["BASELINES", "Ask", "Baseline", "BaselineAgent", "ChainOfThought", "Direct", "Episode", "IRCoT", "NaiveRAG",
           "NoGoldPassages", "OraclePassages", "RolloutTextGenerator", "TextGenerator", "Write", "gold_passages"]

#: The baselines by name (each a class made with no arguments).
BASELINES: dict[str, Callable[[], Baseline]] = {
    cls.name: cls for cls in (Direct, ChainOfThought, NaiveRAG, IRCoT, OraclePassages)
}
