"""TRL's ``GRPOTrainer`` on SearchQA-v0: :class:`SearchQARollout` (its ``rollout_func``) and
:func:`environment_reward` (its reward function).

TRL documents two hooks for environments: ``environment_factory`` (the environment's methods become
tools the model calls through its chat template's JSON tool calls) and ``rollout_func`` (the trainer
hands over the generation batch and takes back token ids). SearchQA's protocols are tag dialects
(``<search> ... </search>``) whose exact tokens matter to the environment, so this adapter is a
``rollout_func``: ``rollout_func(prompts, trainer)`` receives the batch's prompts (the ``prompt``
column, each already repeated ``num_generations`` times) and returns per episode the prompt ids, the
completion ids, the sampling log-probs and an ``env_mask`` (1 on the model's tokens, 0 on the
environment's, which TRL leaves out of the loss); further fields reach the reward functions, here
``episode_reward``, which :func:`environment_reward` returns as TRL's reward.

An episode is played turn by turn with what the hook offers: per turn, ``generate`` on the trainer's
unwrapped model over each whole context so far (transformers, with the trainer's
``generation_config``: its sampling, temperature, top-p), stopped at the protocol's stop strings; the
chunk, cut after its first stop string, goes to a :class:`search_env.BatchSearchQAEnv`, whose
observation tokens are appended. The log-probs are those of the processed scores (the distribution
sampled from). Generation through TRL's vLLM server is not used: ``use_vllm`` plays no part here.

Needs TRL (extra ``trl``).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Sequence

from search_env._optional import requires_extra
from search_env.data.example import QAExample
from search_env.integrations._text import chunk_end
from search_env.tokenization import TokenCodec
from search_env.trajectory import AGENT
from search_env.vector import BatchSearchQAEnv

with requires_extra("trl", "the TRL adapter"):
    import torch
    from transformers import PreTrainedTokenizerFast
    from trl.models import unwrap_model_for_generation

__all__ = ["RolloutRecord", "SearchQARollout", "environment_reward", "hf_tokenizer"]


def hf_tokenizer(codec: TokenCodec) -> PreTrainedTokenizerFast:
    """The environment's tokenizer as the transformers tokenizer TRL and ``generate`` require (same ids;
    left padding, as batched generation needs)."""
    tokenizer = codec.tokenizer
    if isinstance(tokenizer, PreTrainedTokenizerFast):
        return tokenizer
    eos = min(codec.eos_ids)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=copy.deepcopy(tokenizer), padding_side="left")
    wrapped.eos_token = tokenizer.id_to_token(eos)
    wrapped.pad_token = tokenizer.id_to_token(codec.pad_id)
    return wrapped


@dataclass
class RolloutRecord:
    """The last rollout's wall time and number of turns (``generate`` calls)."""

    seconds: float = 0.0
    turns: int = 0


class SearchQARollout:
    """A ``rollout_func`` for ``GRPOTrainer`` that plays multi-turn SearchQA-v0 episodes.

    Args:
        env: the episodes' environment; None builds one from ``settings`` (:class:`~search_env.SearchQAEnv`'s
            keyword arguments, e.g. ``protocol``, ``max_new_tokens``, ``tokenizer``). A batch of another
            size gets its own environment on the same data, sources and tokenizer.
        examples: the questions the dataset's prompts ask (default: the environment's dataset); TRL passes
            only the prompt text, so each is looked up by its question.
        tokenizer: the transformers tokenizer of the model (default: the environment's, wrapped).
    """

    def __init__(self, env: BatchSearchQAEnv | None = None, *, examples: Sequence[QAExample] | None = None,
                 tokenizer: PreTrainedTokenizerFast | None = None, **settings: Any) -> None:
        if env is not None and settings:
            raise ValueError("give an environment or its settings, not both")
        env = env or BatchSearchQAEnv(1, **settings)
        self._envs = {env.num_envs: env}
        self._first = env
        self.codec: TokenCodec = env.codec
        self.protocol = env.protocol
        self.tokenizer = tokenizer or hf_tokenizer(self.codec)
        self.examples = list(examples if examples is not None else env.examples)
        self.by_question: dict[str, QAExample] = {}
        self._ambiguous: set[str] = set()
        for example in self.examples:
            if self.by_question.setdefault(example.question, example).golden_answers != example.golden_answers:
                self._ambiguous.add(example.question)
        self.stop_strings = list(self.protocol.stop_strings)
        self.budget = env.max_new_tokens
        self.last = RolloutRecord()

    @property
    def questions(self) -> list[str]:
        """The examples' questions, in order: the ``prompt`` column of a dataset for ``GRPOTrainer``."""
        return [example.question for example in self.examples]

    def env_for(self, n: int) -> BatchSearchQAEnv:
        """The environment of ``n`` episodes (built on first use, sharing data, sources and tokenizer)."""
        env = self._envs.get(n)
        if env is None:
            first = self._first.envs[0]
            env = self._envs[n] = BatchSearchQAEnv(
                n, protocol=first.protocol, dataset=first.examples, sources=first.sources, tokenizer=first.codec,
                default_source=first.default_source, source_aliases=first.source_aliases, reward=first.reward,
                reward_options=first.reward_options, max_new_tokens=first.max_new_tokens, max_context=first.max_context,
                max_turns=first.max_turns, top_k=first.top_k, max_result_tokens=first.max_result_tokens,
                chat_template=first.use_chat, evidence_model=first.evidence_model, judge=first.judge,
            )
        return env

    def example(self, prompt: str) -> QAExample:
        """The example whose question is ``prompt``."""
        if prompt in self._ambiguous:
            raise ValueError(f"two examples ask {prompt!r} with different answers; TRL passes only the text")
        try:
            return self.by_question[prompt]
        except KeyError:
            raise ValueError(f"no example asks {prompt!r}: the dataset's prompts must be the examples' questions") from None

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, list]:
        """Play one episode per prompt with ``trainer``'s model; returns TRL's rollout fields."""
        start = time.perf_counter()
        n = len(prompts)
        env = self.env_for(n)
        env.set_reward_step(int(trainer.state.global_step))  # a staged reward follows the training step
        observations, _ = env.reset(options=[{"example": self.example(p)} for p in prompts])
        contexts = [list(obs["token_ids"]) for obs in observations]
        prompt_ids = [list(c) for c in contexts]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        used = [0] * n
        active = list(range(n))
        config = copy.deepcopy(trainer.generation_config)
        config.stop_strings = self.stop_strings
        config.output_scores = True
        config.return_dict_in_generate = True
        turns = 0
        while active:
            config.max_new_tokens = max(self.budget - used[i] for i in active)
            rows, row_logps = self._sample(trainer, config, [contexts[i] for i in active])
            turns += 1
            actions: list[list[int] | None] = [None] * n
            chunk_logps = []
            for i, row, lps in zip(active, rows, row_logps):
                end = chunk_end(self.codec, self.stop_strings, row)  # generate pads a finished row; a turn ends at its stop
                actions[i] = row[:end]
                chunk_logps.append(lps[:end])
            observations, _, terminated, truncated, infos = env.step(actions)
            still = []
            for i, chunk_lp in zip(active, chunk_logps):
                obs = observations[i]
                # The observation echoes the consumed agent tokens, with any environment tokens among them.
                agent_lps = iter(chunk_lp)
                logprobs[i] += [next(agent_lps) if who == AGENT else 0.0 for who in obs["producers"]]
                contexts[i] += obs["token_ids"]
                used[i] += infos[i]["consumed"]
                if not (terminated[i] or truncated[i]):
                    still.append(i)
            active = still
        trajectories = [e.trajectory for e in env.envs]
        completion_ids = [t.token_ids[t.prompt_length:] for t in trajectories]
        env_mask = [list(t.trained[t.prompt_length:]) for t in trajectories]
        for ids, mask, lps in zip(completion_ids, env_mask, logprobs):
            if not len(ids) == len(mask) == len(lps):
                raise RuntimeError("rollout bookkeeping broke: completion, mask and log-probs differ in length")
        self.last = RolloutRecord(seconds=time.perf_counter() - start, turns=turns)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs,
                "env_mask": env_mask, "episode_reward": [float(t.reward) for t in trajectories]}

    def _sample(self, trainer: Any, config: Any, contexts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        """One turn for the given contexts: left-padded ``generate`` over each whole context; returns each
        row's generated ids and their sampling log-probs (the caller cuts each row where its turn ends)."""
        pad = self.tokenizer.pad_token_id
        width = max(len(c) for c in contexts)
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        attention_mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        with (
            unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, generation_kwargs=trainer.generation_kwargs) as model,
            torch.no_grad(),
        ):
            out = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                                 generation_config=config, tokenizer=self.tokenizer)
        new = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1).log_softmax(dim=-1)  # processed scores: the sampling distribution
        sampled = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return new.tolist(), sampled.tolist()

    def close(self) -> None:
        """Close the environments (and the sources they share)."""
        for env in self._envs.values():
            env.close()


def environment_reward(prompts: list, completions: list, episode_reward: list[float], **_: Any) -> list[float]:
    """TRL reward function: each episode's reward as the environment computed it (forwarded by
    :class:`SearchQARollout` in the ``episode_reward`` field)."""
    return [float(r) for r in episode_reward]
