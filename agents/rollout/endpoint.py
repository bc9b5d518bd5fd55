"""An agent behind an OpenAI-compatible ``/completions`` endpoint (vLLM, SGLang, llama.cpp, TGI...).

**For evaluation only.** The server returns *text*, which is re-encoded here with the environment's
tokenizer; the ids in the trajectory are therefore those of that text, not necessarily the ids the
server sampled (a different but equivalent segmentation is possible), and no log-probs come back. The
environment and the reward still read one record, but the trajectories are not fit to train on:
training needs a token-in/token-out sampler such as :class:`agents.rollout.hf_sampler.HFSampler`.
:class:`EndpointEngine` is the registered ``endpoint`` engine (:mod:`agents.rollout.engines`) that makes
these agents: ``endpoint:URL#MODEL`` in ``benchmarks.evaluate``; as ``rollout.engine`` it refuses to train.

Each turn sends one request per running row (``max_concurrency`` at a time) with the row's whole
context as the prompt, ``max_tokens`` set to the row's budget and the protocol's stop strings as
``stop``. A server leaves the matched stop string out of the text; it is put back: the one the server
names (vLLM's ``stop_reason``), else the close tag of the call or answer the text left open. A
``"stop"`` finish with no stop string means the model ended its sequence: the end-of-sequence id follows.
The text is cut to what the row's token budget can hold before it is encoded, so a server that ignores
``max_tokens`` costs no more than one that keeps it.

Why a deadline per request rather than socket timeouts: a socket timeout bounds each read, so a server
(or a proxy) that sends a byte now and then would hold a rollout for as long as it likes. ``timeout_s``
is the most one request takes, connecting, every attempt and the backoff between them included; the
socket of a request still under way at the deadline is shut. Transient failures (a refused or reset
connection, HTTP 408, 429 and 5xx, a malformed reply) are retried with exponential backoff (a
``Retry-After`` header is followed) while the deadline allows, so one overloaded moment of the server
does not end an evaluation. What is left fails as :class:`EndpointError` (:class:`EndpointTimeout` past
the deadline): one line naming the URL and what was wrong.
"""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit

from urllib3.connection import HTTPConnection

from agents.rollout.agent import Chunk, turn_stop_strings
from agents.rollout.engines import EngineSetup, register_engine
from search_env.data.example import QAExample
from search_env.http_retry import (
    TRANSPORT_ERRORS, DeadlinePassed, HttpTarget, SocketCut, backoff_wait, exchange, is_final_rejection, retry_after_s,
    unreachable,
)
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec

__all__ = ["CompletionsEndpointAgent", "EndpointEngine", "EndpointEngineOptions", "EndpointError", "EndpointTimeout"]

_DETAIL_CHARS = 300  # of a server's error message, in an error's one line


class EndpointError(RuntimeError):
    """A completions request failed for good: the one-line message names the URL and what was wrong."""


class EndpointTimeout(EndpointError, TimeoutError):
    """A completions request did not complete within the agent's ``timeout_s``."""


class CompletionsEndpointAgent:
    """A :class:`~agents.rollout.agent.RolloutAgent` that asks an OpenAI-compatible completions server.

    Args:
        base_url: the API root, e.g. ``"http://localhost:8000/v1"`` (``/completions`` is appended).
        model: the model name the server expects.
        temperature / top_p: sampling parameters sent with every request (temperature 0: greedy).
        api_key: sent as a bearer token when given.
        send_ids: send the context as token ids instead of text (vLLM and SGLang accept them), so the
            prompt side is exact; the generated side is re-encoded text either way.
        timeout_s: deadline of one request, everything included (connecting, every attempt, the backoff
            between them, reading the reply); past it the request fails with :class:`EndpointTimeout`.
        max_concurrency: requests in flight at once.
        extra_body: more fields for every request (e.g. ``{"seed": 0}``).
        retries: further attempts after a transient failure (see the module docstring), as long as the
            deadline allows; other 4xx replies are not retried (the request itself is wrong).
        backoff_s: wait before the first retry, doubled for each later one (a ``Retry-After`` header
            from the server takes its place; one that points past the deadline ends the request).
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
        retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries and backoff_s must be >= 0, got {retries} and {backoff_s}")
        self.url = base_url.rstrip("/") + "/completions"
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL such as http://localhost:8000/v1, got {base_url!r}")
        self._target = HttpTarget.from_url(self.url)
        self.model, self.temperature, self.top_p, self.send_ids = model, temperature, top_p, send_ids
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.extra_body = dict(extra_body or {})
        self._headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._local = threading.local()  # each request thread's keep-alive connection
        self._connections: list[HTTPConnection] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="completions")

    def begin(self, prompt_ids: Sequence[Sequence[int]], *, examples: Sequence[QAExample], protocol: Dialect, codec: TokenCodec) -> None:
        self._codec, self._eos = codec, min(codec.eos_ids)
        # The most characters one token can stand for (a character is at least one byte): a chunk of
        # ``budget`` tokens never spans more than ``budget`` times this many characters of the text.
        if getattr(self, "_token_chars_codec", None) is not codec:  # a scan of the vocabulary, once per codec
            self._token_chars_codec = codec
            self._token_chars = max(1, max(map(len, codec.token_bytes), default=1))
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
        """Close the request threads and their connections."""
        self._pool.shutdown(wait=True)
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()

    def _complete(self, row: int, budget: int) -> Chunk:
        context = self._contexts[row]
        body = {
            "model": self.model, "prompt": context if self.send_ids else self._codec.decode(context),
            "max_tokens": budget, "temperature": self.temperature, "top_p": self.top_p, "stop": list(self._stops),
            **self.extra_body,
        }
        choice = self._request(json.dumps(body).encode("utf-8"))
        text = choice.get("text") or ""
        suffix = self._stop_suffix(text, choice)
        full = text + suffix
        # Cut before encoding, generously: ``budget`` tokens span at most ``budget * token_chars``
        # characters, and the margin keeps the tokens at the cut (which it may change) past the budget.
        limit = (2 * budget + 64) * self._token_chars
        ids = self._codec.encode(full[:limit])
        if choice.get("finish_reason") == "stop" and not suffix:
            ids.append(self._eos)  # the model ended its sequence (past the budget when the text was cut)
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

    # -- one request, within its deadline ---------------------------------------------------------------
    def _request(self, body: bytes) -> dict[str, Any]:
        """POST ``body`` and return the reply's first choice, retrying transient failures until the deadline."""
        deadline = time.monotonic() + self.timeout_s
        problem, attempts, wait = "", 0, 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                if time.monotonic() + wait >= deadline:
                    break
                time.sleep(wait)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            attempts += 1
            wait = backoff_wait(self.backoff_s, attempt + 1)
            try:
                status, headers, data = self._exchange(body, remaining, deadline)
            except DeadlinePassed:
                break
            except TRANSPORT_ERRORS as exc:
                if time.monotonic() >= deadline:
                    break
                problem = unreachable(exc)
                continue
            if status == 200:
                try:
                    return _first_choice(data)
                except ValueError as exc:
                    problem = f"malformed reply: {exc}"
                    continue
            if is_final_rejection(status):
                raise EndpointError(f"{self.url} rejected the request with HTTP {status}: {_reply_detail(data)}")
            problem = f"HTTP {status}: {_reply_detail(data)}"
            asked = retry_after_s(headers.get("Retry-After"))
            if asked is not None:
                if time.monotonic() + asked >= deadline:
                    raise EndpointError(f"{self.url} failed after {attempts} attempt(s): {problem} "
                                        f"(it asks to retry in {asked:g} s, past the {self.timeout_s:g} s deadline)")
                wait = asked
        if not problem or time.monotonic() >= deadline:
            raise EndpointTimeout(f"{self.url}: no complete reply within {self.timeout_s:g} s "
                                  f"({attempts} attempt(s){'; last: ' + problem if problem else ''})")
        raise EndpointError(f"{self.url} failed after {attempts} attempt(s): {problem}")

    def _connection(self) -> HTTPConnection:
        """This thread's keep-alive connection."""
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._local.connection = self._target.connect()
            with self._lock:
                self._connections.append(connection)
        return connection

    def _exchange(self, body: bytes, timeout_s: float, deadline: float) -> tuple[int, Any, bytes]:
        """One attempt: status, headers and the whole body. Each socket operation waits at most
        ``timeout_s``, and a timer shuts the socket at ``deadline``, so that a reply that trickles in
        cannot outlast it (raises :class:`~search_env.http_retry.DeadlinePassed` then)."""
        connection = self._connection()
        cut = SocketCut()
        timer = threading.Timer(max(0.0, deadline - time.monotonic()), cut.fire)
        timer.daemon = True
        timer.start()
        try:
            reply = exchange(connection, self._target.path, body, self._headers, timeout_s, cut)
        except Exception:
            connection.close()  # its state is unknown: the next attempt opens a new one
            if cut.disarm():
                raise DeadlinePassed("the request's deadline passed") from None
            raise
        finally:
            timer.cancel()
        if cut.disarm():  # the deadline passed as the reply ended: the socket may be shut
            connection.close()
            raise DeadlinePassed("the request's deadline passed")
        return reply.status, reply.headers, reply.data


@dataclass
class EndpointEngineOptions:
    """Options of the ``endpoint`` engine (``--engine.FIELD`` with ``rollout.engine: endpoint``; the
    ``endpoint:URL#MODEL`` agents of ``benchmarks.evaluate`` set ``url`` and ``model``).

    Attributes:
        url: the API root, e.g. ``http://localhost:8000/v1``.
        model: the model name the server expects.
        api_key_env: the environment variable holding the API key (unset or empty: none is sent).
        send_ids / timeout_s / max_concurrency / retries / backoff_s: as :class:`CompletionsEndpointAgent`
            takes them.
    """

    url: str = ""
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    send_ids: bool = False
    timeout_s: float = 120.0
    max_concurrency: int = 8
    retries: int = 3
    backoff_s: float = 0.5

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if self.url and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise ValueError(f"engine.url must be an http(s) URL such as http://localhost:8000/v1, got {self.url!r}")
        if not self.timeout_s > 0 or self.max_concurrency < 1 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError(f"engine.timeout_s must be > 0, engine.max_concurrency >= 1, engine.retries and engine.backoff_s "
                             f">= 0; got {self.timeout_s}, {self.max_concurrency}, {self.retries}, {self.backoff_s}")


class EndpointEngine:
    """The ``endpoint`` rollout engine: agents that ask an OpenAI-compatible server (one
    :class:`CompletionsEndpointAgent` per rollout, greedy as temperature 0, sampled with the agent's seed
    in the request).

    **Evaluation only**: the server serves weights of its own, which the trainer cannot update, and its
    trajectories are re-encoded text (module docstring). :meth:`attach` and :meth:`sync` raise a one-line
    ``ValueError``, so ``rollout.engine: endpoint`` stops when the trainer is built.
    """

    logprobs_are_trainers = False
    decodes_trained_policy = False
    needs_policy = False
    reuse_logprobs = False

    def __init__(self, options: EndpointEngineOptions, *, temperature: float = 1.0, top_p: float = 1.0) -> None:
        if not options.url or not options.model:
            raise ValueError("the endpoint engine needs engine.url and engine.model (e.g. http://localhost:8000/v1 and its model name)")
        self.options, self.temperature, self.top_p = options, temperature, top_p
        self.api_key = os.environ.get(options.api_key_env) or None

    @classmethod
    def build(cls, options: EndpointEngineOptions, setup: EngineSetup) -> EndpointEngine:
        return cls(options, temperature=setup.temperature, top_p=setup.top_p)

    def agent(self, *, greedy: bool, seed: int, first_row: int = 0) -> CompletionsEndpointAgent:
        """An agent whose sampled requests all carry ``seed``: the server samples each request alone, so no
        row's sample depends on the others' and ``first_row`` changes nothing (an endpoint is not trained,
        so it never rolls out a rank's share)."""
        options = self.options
        return CompletionsEndpointAgent(options.url, options.model, temperature=0.0 if greedy else self.temperature,
                                        top_p=self.top_p, api_key=self.api_key, send_ids=options.send_ids,
                                        timeout_s=options.timeout_s, max_concurrency=options.max_concurrency,
                                        retries=options.retries, backoff_s=options.backoff_s,
                                        extra_body=None if greedy else {"seed": seed})

    def attach(self, backend: Any) -> EndpointEngine:
        raise ValueError(f"rollout.engine: endpoint serves fixed weights ({self.options.url}) and cannot be trained; "
                         "it is for evaluation (benchmarks.evaluate --agents endpoint:URL#MODEL)")

    def sync(self) -> None:
        self.attach(None)

    def sleep(self) -> None:
        """Nothing held here: the server keeps its own memory."""

    def wake_up(self) -> None:
        """Always ready."""

    def close(self) -> None:
        """Nothing held: each agent closes its own connections."""


register_engine("endpoint", EndpointEngine, options=EndpointEngineOptions)


def _first_choice(data: bytes) -> dict[str, Any]:
    """The first choice of a completions reply; ``ValueError`` saying what is wrong with a malformed one."""
    try:
        payload = json.loads(data)
    except ValueError:
        raise ValueError(f"not JSON: {_start(data)}") from None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"no choices in {_start(data)}")
    choice = choices[0]
    if not isinstance(choice.get("text"), (str, type(None))):
        raise ValueError(f"the choice's text is not a string: {_start(data)}")
    return choice


def _start(data: bytes) -> str:
    """The start of a reply's body, on one line."""
    text = data[:_DETAIL_CHARS].decode("utf-8", "replace")
    return " ".join(text.split()) or "(empty body)"


def _reply_detail(data: bytes) -> str:
    """The server's error message (an OpenAI-style ``{"error": {"message"}}``, a ``detail`` or
    ``message`` field) or the start of the body, on one line."""
    try:
        body = json.loads(data)
    except ValueError:
        return _start(data)
    if isinstance(body, dict):
        error = body.get("error")
        found = error.get("message") if isinstance(error, dict) else error
        found = found or body.get("detail") or body.get("message")
        if found:
            return " ".join(str(found).split())[:_DETAIL_CHARS]
    return _start(data)
