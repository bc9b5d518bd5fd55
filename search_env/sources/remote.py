"""A Source that queries a retrieval server over HTTP, speaking the API of Search-R1 / FlashRAG servers.

The API, and how its replies are read: :mod:`search_env.sources.retrieve_api`.

Why a batching client: a vector environment runs many episodes whose search calls arrive at almost
the same moment from different threads. Each HTTP round trip costs far more than one more query in
the same request (and a dense retriever encodes a batch much faster than its queries one by one), so
:class:`RemoteSource` queues concurrent calls and sends whatever has queued while its sender threads
were busy as one request ("natural batching": no added wait when the client is idle).

Why a deadline per call (:mod:`search_env.http_retry`): socket timeouts bound each read, not a request.
``timeout_s`` is the most a ``search`` call waits, queueing, connecting, retries and backoff included;
when it runs out the call raises :class:`SourceError` (an error observation in the environment) and the
request still in flight is cut by shutting its socket.

Why replicas: one retrieval server is one point of failure for a training run that lasts days. Given
several URLs serving the same index, :class:`RemoteSource` spreads its requests over them and, when one
dies or hangs, sends its requests to the others within the same deadline, and tries the dead one
again after a cool-down; the log says when a replica went down and when it came back.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Sequence

from urllib3.connection import HTTPConnection
from urllib3.exceptions import NewConnectionError
from urllib3.exceptions import TimeoutError as ConnectionTimeout

from search_env._fork import forget_threads_after_fork
from search_env.http_retry import TRANSPORT_ERRORS, SocketCut, backoff_wait, exchange, is_final_rejection, unreachable
from search_env.sources.base import Passage, Source, SourceError
from search_env.sources.replicas import Replica, ReplicaPool, ReplicaStatus
from search_env.sources.retrieve_api import (
    document_to_passage, format_contents, parse_retrieve_response, passage_to_document, replica_urls,
)

__all__ = [
    "DEFAULT_COOLDOWN_S",
    "DEFAULT_TIMEOUT_S",
    "RemoteSource",
    "document_to_passage",
    "format_contents",
    "parse_retrieve_response",
    "passage_to_document",
    "replica_urls",
]


DEFAULT_TIMEOUT_S = 5.0
"""Default deadline of one ``search`` call. A healthy retrieval server answers a batch in well under a
second; five seconds leave room for a cold cache or a queue on the server, and cap what a hung server
costs a training step (per-read socket timeouts with retries let one call wait several times longer)."""

DEFAULT_COOLDOWN_S = 10.0
"""Default time a failed replica is skipped before a request tries it again. Long enough that a dead
replica costs the other replicas' callers one failed attempt per cool-down, not one per request; short
enough that a restarted server (a retrieval server answers 503 while it builds its index) rejoins soon
after it is ready."""

_HEADERS = {"Content-Type": "application/json"}

logger = logging.getLogger(__name__)


class _ReplicaFailed(Exception):
    """One attempt on one replica failed in a way another replica (or a later retry) may not."""


@dataclass(eq=False)
class _Call:
    """One ``search`` call: its queries, its deadline (``time.monotonic()``) and its result."""

    queries: list[str]
    k: int
    deadline: float
    future: Future = field(default_factory=Future)
    batch: _Batch | None = None  # set when a sender takes the call


@dataclass(eq=False)
class _Batch:
    """Calls that one sender sends together. ``waiting`` counts callers that have not given up; ``cut``
    shuts the socket of the request in flight when the last of them gives up or the source closes, and
    once fired tells the sender to stop."""

    calls: list[_Call]
    waiting: int
    cut: SocketCut = field(default_factory=SocketCut)

    @property
    def deadline(self) -> float:
        """The latest caller's deadline: earlier callers stop waiting on their own."""
        return max(call.deadline for call in self.calls)


class RemoteSource(Source):
    """A Source backed by a Search-R1-compatible retrieval server, or by several replicas of one.

    Args:
        url: the server's ``/retrieve`` URL (or its base URL); for replicas serving the same index,
            a list of URLs or one string of comma-separated URLs.
        name: the source name the environment and NL-DAG plans use.
        timeout_s: deadline of one ``search`` call, everything included (waiting for a free sender,
            connecting, every attempt on every replica and the backoff between them); default
            :data:`DEFAULT_TIMEOUT_S` (5 s). Past it the call raises :class:`SourceError`.
        retries: further rounds after a round in which every replica tried failed (connection error,
            5xx, 408/429, malformed reply), with exponential backoff from ``backoff_s``, as long as
            the deadline allows. Other 4xx replies are final: the request itself is wrong. With one
            server a round is one attempt.
        max_batch: most queries in one HTTP request; concurrent calls are merged up to this size
            and a larger call is sent in several requests.
        max_in_flight: sender threads, i.e. requests that may be under way at once. Calls arriving
            while all senders are busy are merged into the next request.
        backoff_s: wait before the second round; doubled for each later one.
        cooldown_s: how long a replica that failed is skipped; default :data:`DEFAULT_COOLDOWN_S`.

    Replicas: each request goes to the next replica in turn (round robin) among those up. A failed
    attempt marks its replica down and the request moves on at once to the next one; a down replica
    is skipped for ``cooldown_s``, then the next request to it is the probe that brings it back (or
    marks it down for another cool-down). Only when no other replica is left does a request try a
    down one early, so a pool that is all down is still tried as a lone server is. An attempt's socket
    operations wait at most its share of the time left, divided evenly over the replicas this round
    still has to try (those up; once none is, the down ones), so a replica that hangs cannot use up
    the deadline of a call another replica could answer. A replica going down and coming back is logged
    once each (a ``logging`` warning); :meth:`replica_status` counts requests and failures per replica.

    ``search`` is thread-safe. Every failure reaches the caller as :class:`SourceError`. Sender
    threads start on the first search and stop in :meth:`close`; each keeps one keep-alive urllib3
    connection per replica (:mod:`search_env.http_retry` says why not a session).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        name: str = "remote",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = 2,
        max_batch: int = 64,
        max_in_flight: int = 2,
        backoff_s: float = 0.05,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError(f"max_batch and max_in_flight must be >= 1, got {max_batch} and {max_in_flight}")
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be >= 0, got {cooldown_s}")
        self._pool = ReplicaPool(replica_urls(url), cooldown_s)
        self.urls: tuple[str, ...] = tuple(replica.url for replica in self._pool.replicas)
        self.url = ",".join(self.urls)  # one URL, or the replicas' comma-separated as they may be given
        self.name = name
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.backoff_s = backoff_s
        self.cooldown_s = cooldown_s
        self._closed = False
        self._forget_senders()
        forget_threads_after_fork(self, RemoteSource._forget_senders)
        self.requests_sent = 0  # HTTP attempts, for tests and benchmarks that check batching

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Retrieve at most ``k`` passages per query; raises SourceError when no replica answers
        within ``timeout_s``."""
        queries = list(queries)
        if not all(isinstance(q, str) for q in queries):
            raise SourceError(f"source {self.name!r}: every query must be a string")
        if not queries or k <= 0:
            return [[] for _ in queries]
        call = _Call(queries, k, time.monotonic() + self.timeout_s)
        with self._cond:
            if self._closed:
                raise SourceError(f"source {self.name!r} is closed")
            self._pending.append(call)
            if len(self._senders) < self.max_in_flight:
                self._start_sender()
            self._cond.notify()
        try:
            return call.future.result(timeout=self.timeout_s)
        except FutureTimeout:
            self._give_up(call)
        raise SourceError(f"source {self.name!r}: no reply within {self.timeout_s:g} s from {self.url}")

    def replica_status(self) -> dict[str, ReplicaStatus]:
        """Each replica's counters and state, by URL (in the order given), as of now."""
        with self._cond:
            return self._pool.status()

    def _forget_senders(self) -> None:
        """No queue, no sender threads (at start, and in a forked child, where the parent's do not exist)."""
        self._pending: collections.deque[_Call] = collections.deque()
        self._cond = threading.Condition()
        self._senders: list[threading.Thread] = []
        self._in_flight: set[_Batch] = set()

    def close(self) -> None:
        """Stop the sender threads: calls still queued fail with SourceError, requests in flight are cut."""
        with self._cond:
            self._closed = True
            abandoned = list(self._pending)
            self._pending.clear()
            for batch in self._in_flight:
                batch.cut.fire()
            self._cond.notify_all()
            senders = list(self._senders)
        for call in abandoned:
            if call.future.set_running_or_notify_cancel():
                call.future.set_exception(SourceError(f"source {self.name!r} was closed before the call was sent"))
        for thread in senders:
            thread.join(timeout=self.timeout_s + 1.0)

    def _give_up(self, call: _Call) -> None:
        """The caller's deadline passed: drop the call if it is still queued; cut its request if no
        other caller of the batch still waits for it."""
        with self._cond:
            if call.future.cancel():  # still queued: senders skip it
                return
            batch = call.batch
            if batch is None:
                return
            batch.waiting -= 1
            if batch.waiting == 0:
                batch.cut.fire()

    def _start_sender(self) -> None:
        thread = threading.Thread(target=self._sender_loop, name=f"RemoteSource-{self.name}-{len(self._senders)}", daemon=True)
        self._senders.append(thread)
        thread.start()

    def _sender_loop(self) -> None:
        connections: dict[int, HTTPConnection] = {}  # by replica index, opened on first use
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    batch = self._take_batch()
                if batch is not None:
                    self._send(batch, connections)
        finally:
            for connection in connections.values():
                connection.close()

    def _take_batch(self) -> _Batch | None:
        """The oldest live call plus every queued call with the same k, up to ``max_batch`` queries
        (called under ``self._cond``, as cancellation is, so a call is either sent or cancelled)."""
        calls: list[_Call] = []
        size = 0
        kept: collections.deque[_Call] = collections.deque()
        while self._pending:
            call = self._pending.popleft()
            if call.future.cancelled():
                continue
            if calls and (call.k != calls[0].k or size + len(call.queries) > self.max_batch):
                kept.append(call)
                continue
            call.future.set_running_or_notify_cancel()
            calls.append(call)
            size += len(call.queries)
        self._pending = kept
        if not calls:
            return None
        batch = _Batch(calls, waiting=len(calls))
        for call in calls:
            call.batch = batch
        return batch

    def _send(self, batch: _Batch, connections: dict[int, HTTPConnection]) -> None:
        flat = [q for call in batch.calls for q in call.queries]
        try:
            results: list[list[Passage]] = []
            for start in range(0, len(flat), self.max_batch):
                results.extend(self._post(flat[start : start + self.max_batch], batch, connections))
        except Exception as exc:  # every caller must hear back, whatever went wrong
            message = str(exc) if isinstance(exc, SourceError) else f"source {self.name!r}: {exc!r}"
            for call in batch.calls:  # one exception object per caller: each raises it on its own thread
                call.future.set_exception(SourceError(message))
            return
        offset = 0
        for call in batch.calls:
            call.future.set_result(results[offset : offset + len(call.queries)])
            offset += len(call.queries)

    def _post(self, queries: list[str], batch: _Batch, connections: dict[int, HTTPConnection]) -> list[list[Passage]]:
        """Send one request: rounds over the replicas (see the class docstring) until one answers,
        the retries are spent or the batch's deadline passes."""
        body = json.dumps({"queries": queries, "topk": batch.calls[0].k, "return_scores": True}).encode("utf-8")
        problems: dict[str, str] = {}  # the latest problem of each replica tried, by URL
        attempts = 0
        for round_index in range(self.retries + 1):
            if round_index:
                time.sleep(max(0.0, min(backoff_wait(self.backoff_s, round_index), batch.deadline - time.monotonic())))
            tried: set[int] = set()
            while len(tried) < len(self._pool):
                remaining = batch.deadline - time.monotonic()
                with self._cond:
                    if remaining <= 0 or batch.waiting == 0 or self._closed:
                        raise SourceError(self._failure_message(problems, attempts))
                    index = self._pool.choose(tried)
                    share = remaining / self._pool.sharing(index, tried)
                    tried.add(index)
                    replica = self._pool.replicas[index]
                    replica.requests += 1
                    self.requests_sent += 1
                    self._in_flight.add(batch)
                attempts += 1
                try:
                    results = self._attempt(replica, index, connections, body, share, batch, len(queries))
                except _ReplicaFailed as exc:
                    problems[replica.url] = str(exc)
                    self._mark_failed(replica, str(exc))
                    continue
                except SourceError:  # the request was refused: by a replica that answers
                    self._mark_answered(replica)
                    raise
                self._mark_answered(replica)
                return [row[: batch.calls[0].k] for row in results]
        raise SourceError(self._failure_message(problems, attempts))

    def _attempt(
        self, replica: Replica, index: int, connections: dict[int, HTTPConnection], body: bytes, timeout_s: float,
        batch: _Batch, n_queries: int,
    ) -> list[list[Passage]]:
        """One request to one replica: its passages; :class:`_ReplicaFailed` when another replica (or
        a later retry) may answer; SourceError when the request itself is refused. Each socket operation
        waits at most ``timeout_s``; the batch's deadline as a whole is kept by its callers, who fire
        its cut."""
        connection = connections.get(index)
        if connection is None:
            connection = connections[index] = replica.target.connect()
        try:
            reply = exchange(connection, replica.target.path, body, _HEADERS, timeout_s, batch.cut)
        except TRANSPORT_ERRORS as exc:
            connection.close()  # its state is unknown; the next attempt opens a new one
            if time.monotonic() >= batch.deadline or batch.cut.fired:
                raise _ReplicaFailed(f"no reply within {self.timeout_s:g} s") from None
            if isinstance(exc, NewConnectionError):  # before timeouts: urllib3 derives it from ConnectTimeoutError
                raise _ReplicaFailed(f"cannot reach the server ({exc})") from None
            if isinstance(exc, (TimeoutError, ConnectionTimeout)):
                raise _ReplicaFailed(f"no reply within {timeout_s:.3g} s") from None
            raise _ReplicaFailed(unreachable(exc)) from None
        finally:
            batch.cut.disarm()
            with self._cond:
                self._in_flight.discard(batch)
        if is_final_rejection(reply.status):
            raise SourceError(f"source {self.name!r}: {replica.url} rejected the request with HTTP {reply.status}: "
                              f"{_reply_detail(reply.data)}")
        if reply.status != 200:
            raise _ReplicaFailed(f"HTTP {reply.status}: {_reply_detail(reply.data)}")
        try:
            return parse_retrieve_response(json.loads(reply.data), n_queries)
        except ValueError as exc:  # includes a body that is not JSON (or not UTF-8)
            raise _ReplicaFailed(f"malformed reply: {exc}") from None

    def _mark_failed(self, replica: Replica, problem: str) -> None:
        """Count the failure and skip the replica for a cool-down; say so when it goes down."""
        with self._cond:
            if self._closed:  # cut by close(): not the replica's doing
                return
            went_down = self._pool.failed(replica, problem)
            up = self._pool.up()
        if went_down:
            logger.warning("source %r: replica %s is down (%s); skipping it for %g s, %d of %d replica(s) up",
                           self.name, replica.url, problem, self.cooldown_s, up, len(self._pool))

    def _mark_answered(self, replica: Replica) -> None:
        """A reply: the replica is up again (said once, when it was down)."""
        with self._cond:
            failed = self._pool.answered(replica)
        if failed is not None:
            logger.warning("source %r: replica %s answers again after %d failed attempt(s)", self.name, replica.url, failed)

    def _failure_message(self, problems: dict[str, str], attempts: int) -> str:
        """Why a request got no answer: each replica's latest problem (or that time ran out first)."""
        if not problems:
            return f"source {self.name!r}: no reply within {self.timeout_s:g} s from {self.url}"
        if len(self._pool) == 1:
            return f"source {self.name!r}: {self.url} failed after {attempts} attempt(s): {problems[self.url]}"
        said = "; ".join(f"{url}: {problem}" for url, problem in problems.items())
        return f"source {self.name!r}: no replica answered ({attempts} attempt(s) on {len(problems)} of {len(self._pool)}): {said}"



def _reply_detail(data: bytes, limit: int = 300) -> str:
    """The server's error message (its ``detail`` field, as Search-R1's FastAPI server and ours send it) or the start of the body."""
    try:
        body = json.loads(data)
    except ValueError:
        return data[:limit].decode("utf-8", "replace") or "(empty body)"
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:limit]
    return str(body)[:limit]
