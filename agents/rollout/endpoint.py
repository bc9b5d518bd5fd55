"""An agent behind an OpenAI-compatible ``/completions`` endpoint (vLLM, SGLang, llama.cpp, TGI...).

**For evaluation only.** The server returns *text*, which is re-encoded here with the environment's
tokenizer; the ids in the trajectory are therefore those of that text, not necessarily the ids the
server sampled (a different but equivalent segmentation is possible), and no log-probs come back. The
environment and the reward still read one record, but the trajectories are not fit to train on:
training needs a token-in/token-out sampler such as :class:`agents.rollout.hf_sampler.HFSampler`.

Each turn sends one request per running row (``max_concurrency`` at a time) with the row's whole
context as the prompt, ``max_tokens`` set to the row's budget and the protocol's stop strings as
``stop``. A server leaves the matched stop string out of the text; it is put back: the one the server
names (vLLM's ``stop_reason``), else the close tag of the call or answer the text left open. A
``"stop"`` finish with no stop string means the model ended its sequence: the end-of-sequence id follows.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import httpx

from agents.rollout.agent import Chunk, turn_stop_strings
from search_env.data.example import QAExample
from search_env.protocols import Protocol
from search_env.tokenization import TokenCodec

__all__ = ["CompletionsEndpointAgent"]


class CompletionsEndpointAgent:
    """A :class:`~agents.rollout.agent.RolloutAgent` that asks an OpenAI-compatible completions server.

    Args:
        base_url: the API root, e.g. ``"http://localhost:8000/v1"`` (``/completions`` is appended).
        model: the model name the server expects.
        temperature / top_p: sampling parameters sent with every request (temperature 0: greedy).
        api_key: sent as a bearer token when given.
        send_ids: send the context as token ids instead of text (vLLM and SGLang accept them), so the
            prompt side is exact; the generated side is re-encoded text either way.
        timeout_s: per-request time limit.
        max_concurrency: requests in flight at once.
        extra_body: more fields for every request (e.g. ``{"seed": 0}``).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        api_key: str | None = None,
        send_ids: bool = False,
        timeout_s: float = 120.0,
        max_concurrency: int = 8,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.url = base_url.rstrip("/") + "/completions"
        self.model, self.temperature, self.top_p, self.send_ids = model, temperature, top_p, send_ids
        self.extra_body = dict(extra_body or {})
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="completions")

    def begin(self, prompt_ids: Sequence[Sequence[int]], *, examples: Sequence[QAExample], protocol: Protocol, codec: TokenCodec) -> None:
        self._codec, self._eos = codec, min(codec.eos_ids)
        self._stops = turn_stop_strings(protocol)
        # Each stop string's opening tag, to tell which one a server that does not say stopped at.
        opening = {protocol.call_close: protocol.call_open, protocol.answer_close: protocol.answer_open}
        self._pairs = [(opening[s], s) for s in self._stops if s in opening]
        self._contexts = [list(ids) for ids in prompt_ids]

    def generate(self, rows: Sequence[int], budgets: Sequence[int]) -> list[Chunk]:
        return list(self._pool.map(self._complete, rows, budgets))

    def feed(self, row: int, token_ids: Sequence[int]) -> None:
        self._contexts[row].extend(token_ids)

    def finish(self, row: int) -> None:
        self._contexts[row] = []

    def close(self) -> None:
        """Close the HTTP client and the request threads."""
        self._pool.shutdown(wait=True)
        self._client.close()

    def _complete(self, row: int, budget: int) -> Chunk:
        context = self._contexts[row]
        body = {
            "model": self.model, "prompt": context if self.send_ids else self._codec.decode(context),
            "max_tokens": budget, "temperature": self.temperature, "top_p": self.top_p, "stop": list(self._stops),
            **self.extra_body,
        }
        response = self._client.post(self.url, json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        text = choice.get("text") or ""
        suffix = self._stop_suffix(text, choice)
        ids = self._codec.encode(text + suffix)
        if choice.get("finish_reason") == "stop" and not suffix:
            ids.append(self._eos)  # the model ended its sequence
        ids = ids[:budget] or [self._eos]
        context.extend(ids)
        return Chunk(ids)

    def _stop_suffix(self, text: str, choice: dict[str, Any]) -> str:
        """The stop string the server cut off, or "" (a length cut, or the model's end of sequence)."""
        if choice.get("finish_reason") != "stop":
            return ""
        named = choice.get("stop_reason")
        if isinstance(named, str) and named in self._stops:
            return named
        # No name given: the tag left open in this chunk (the latest opened) is the one that was closed.
        open_at = {close: text.rfind(open_) for open_, close in self._pairs if text.rfind(open_) > text.rfind(close)}
        return max(open_at, key=open_at.get) if open_at else ""
