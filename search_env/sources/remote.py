"""A Source that queries a retrieval server over HTTP, speaking the API of Search-R1 / FlashRAG servers.

The API (the same one this project's own server, :mod:`search_env.server`, speaks)::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    200             {"result": [[{"document": {"id": "7", "contents": "\\"Title\\"\\ntext"}, "score": 0.83}, ...], ...]}

One inner list per query, best first. ``contents`` is the wiki-18 layout: the title in double quotes on
the first line, the passage text after the first newline. With ``"return_scores": false`` each inner
list holds the bare document objects instead of ``{"document", "score"}`` pairs. A missing, null or 0
``topk`` means the server's default.

Why a batching client: a vector environment runs many episodes whose search calls arrive at almost
the same moment from different threads. Each HTTP round trip costs far more than one more query in
the same request (and a dense retriever encodes a batch much faster than its queries one by one), so
:class:`RemoteSource` queues concurrent calls and sends whatever has queued while its sender threads
were busy as one request ("natural batching": no added wait when the client is idle).
"""
from __future__ import annotations

import collections
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import urllib3
from urllib3.exceptions import HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3Timeout

from search_env.data.corpus import split_wiki18_contents
from search_env.sources.base import Passage, Source, SourceError

__all__ = [
    "RemoteSource",
    "document_to_passage",
    "format_contents",
    "parse_retrieve_response",
    "passage_to_document",
]


def format_contents(title: str, text: str) -> str:
    """Write a passage as wiki-18 ``contents``: ``"title"`` on the first line, then the text.

    Newlines inside the title become spaces, because clients split ``contents`` on the first
    newline to recover the title.
    """
    one_line_title = " ".join(title.splitlines())
    return f'"{one_line_title}"\n{text}'


def passage_to_document(passage: Passage) -> dict[str, str]:
    """The ``document`` object of the API for a passage: ``{"id", "contents"}``, as a wiki-18 corpus row."""
    return {"id": passage.id, "contents": format_contents(passage.title, passage.text)}


def document_to_passage(document: Any, score: Any = 0.0) -> Passage:
    """Read one ``document`` object (wiki-18 ``{id, contents}`` or ``{id, title, text}``) as a Passage.

    Raises ValueError with the reason when the object has neither layout. A document without an
    ``id`` (Search-R1's BM25 server omits it) gets its title as id, so passages stay distinguishable.
    """
    if not isinstance(document, dict):
        raise ValueError(f"a document must be a JSON object, got {type(document).__name__}")
    if isinstance(document.get("contents"), str):
        title, text = split_wiki18_contents(document["contents"])
    elif isinstance(document.get("title"), str) and isinstance(document.get("text"), str):
        title, text = document["title"], document["text"]
    else:
        raise ValueError(f"a document needs a string 'contents' (or 'title' and 'text'), got keys {sorted(document)}")
    doc_id = document.get("id", title)
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise ValueError(f"a document id must be a string or an integer, got {type(doc_id).__name__}")
    if isinstance(score, bool) or not isinstance(score, (int, float, str)):
        raise ValueError(f"a score must be a number, got {type(score).__name__}")
    try:
        value = float(score)
    except ValueError:
        raise ValueError(f"a score must be a number, got {score!r}") from None
    return Passage(id=str(doc_id), title=title, text=text, score=value)


def parse_retrieve_response(payload: Any, n_queries: int) -> list[list[Passage]]:
    """Turn a ``/retrieve`` reply into one passage list per query; ValueError says what is malformed.

    Accepts both layouts (``{"document", "score"}`` entries and bare documents), so the client also
    works against servers that ignore ``return_scores``.
    """
    if not isinstance(payload, dict) or "result" not in payload:
        raise ValueError("the reply is not a JSON object with a 'result' field")
    result = payload["result"]
    if not isinstance(result, list) or len(result) != n_queries:
        got = f"{len(result)} lists" if isinstance(result, list) else type(result).__name__
        raise ValueError(f"'result' must hold one list per query ({n_queries}), got {got}")
    passages: list[list[Passage]] = []
    for i, entries in enumerate(result):
        if not isinstance(entries, list):
            raise ValueError(f"result[{i}] must be a list, got {type(entries).__name__}")
        row = []
        for j, entry in enumerate(entries):
            try:
                if isinstance(entry, dict) and "document" in entry:
                    row.append(document_to_passage(entry["document"], entry.get("score", 0.0)))
                else:
                    row.append(document_to_passage(entry))
            except ValueError as exc:
                raise ValueError(f"result[{i}][{j}]: {exc}") from None
        passages.append(row)
    return passages


def _retrieve_url(url: str) -> str:
    """Accept a server's base URL or its full ``/retrieve`` URL (what Search-R1 configs hold)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"RemoteSource needs an http(s) URL such as http://127.0.0.1:8000/retrieve, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/retrieve")
    return urlunsplit(parts)


@dataclass
class _Call:
    """One ``search`` call waiting for a sender thread."""

    queries: list[str]
    k: int
    future: Future


_RETRIED_CLIENT_STATUSES = (408, 429)  # the server asks to come back later; every other 4xx is final


class RemoteSource(Source):
    """A Source backed by a Search-R1-compatible retrieval server.

    Args:
        url: the server's ``/retrieve`` URL (or its base URL).
        name: the source name the environment and NL-DAG plans use.
        timeout_s: connect and read timeout of one HTTP attempt.
        retries: further attempts after a failed one (connection error, timeout, 5xx, 408/429,
            malformed reply), with exponential backoff from ``backoff_s``. Other 4xx replies are
            not retried: the request itself is wrong.
        max_batch: most queries in one HTTP request; concurrent calls are merged up to this size
            and a larger call is sent in several requests.
        max_in_flight: sender threads, i.e. requests that may be under way at once. Calls arriving
            while all senders are busy are merged into the next request.
        backoff_s: wait before the first retry; doubled for each later one.

    ``search`` is thread-safe. Every failure reaches the caller as :class:`SourceError`. Sender
    threads start on the first search and stop in :meth:`close`. They share a pool of keep-alive
    connections (urllib3, one connection per sender): on a 2-core machine, requests' extra layers
    cost about twice urllib3's CPU time per request, which is the whole budget of a BM25 query.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "remote",
        timeout_s: float = 10.0,
        retries: int = 2,
        max_batch: int = 64,
        max_in_flight: int = 2,
        backoff_s: float = 0.05,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if max_batch < 1 or max_in_flight < 1:
            raise ValueError(f"max_batch and max_in_flight must be >= 1, got {max_batch} and {max_in_flight}")
        self.url = _retrieve_url(url)
        parts = urlsplit(self.url)
        self._path = f"{parts.path}?{parts.query}" if parts.query else parts.path
        self._pool = urllib3.connection_from_url(
            self.url, maxsize=max_in_flight, block=True, retries=False, timeout=urllib3.Timeout(connect=timeout_s, read=timeout_s)
        )
        self.name = name
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.backoff_s = backoff_s
        self._pending: collections.deque[_Call] = collections.deque()
        self._cond = threading.Condition()
        self._senders: list[threading.Thread] = []
        self._closed = False
        self.requests_sent = 0  # HTTP attempts, for tests and benchmarks that check batching

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Retrieve at most ``k`` passages per query; raises SourceError when the server fails."""
        queries = list(queries)
        if not all(isinstance(q, str) for q in queries):
            raise SourceError(f"source {self.name!r}: every query must be a string")
        if not queries or k <= 0:
            return [[] for _ in queries]
        call = _Call(queries, k, Future())
        with self._cond:
            if self._closed:
                raise SourceError(f"source {self.name!r} is closed")
            self._pending.append(call)
            if len(self._senders) < self.max_in_flight:
                self._start_sender()
            self._cond.notify()
        return call.future.result()

    def close(self) -> None:
        """Stop the sender threads; calls still queued fail with SourceError."""
        with self._cond:
            self._closed = True
            abandoned = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
            senders = list(self._senders)
        for call in abandoned:
            call.future.set_exception(SourceError(f"source {self.name!r} was closed before the call was sent"))
        for thread in senders:
            thread.join(timeout=self.timeout_s * (self.retries + 1) + 1.0)
        self._pool.close()

    def _start_sender(self) -> None:
        thread = threading.Thread(target=self._sender_loop, name=f"RemoteSource-{self.name}-{len(self._senders)}", daemon=True)
        self._senders.append(thread)
        thread.start()

    def _sender_loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = self._take_batch()
            self._send(batch)

    def _take_batch(self) -> list[_Call]:
        """The oldest call plus every queued call with the same k, up to ``max_batch`` queries."""
        first = self._pending.popleft()
        batch, size = [first], len(first.queries)
        kept: collections.deque[_Call] = collections.deque()
        while self._pending:
            call = self._pending.popleft()
            if call.k == first.k and size + len(call.queries) <= self.max_batch:
                batch.append(call)
                size += len(call.queries)
            else:
                kept.append(call)
        self._pending = kept
        return batch

    def _send(self, batch: list[_Call]) -> None:
        flat = [q for call in batch for q in call.queries]
        try:
            results: list[list[Passage]] = []
            for start in range(0, len(flat), self.max_batch):
                results.extend(self._post(flat[start : start + self.max_batch], batch[0].k))
        except Exception as exc:  # every caller must hear back, whatever went wrong
            message = str(exc) if isinstance(exc, SourceError) else f"source {self.name!r}: {exc!r}"
            for call in batch:  # one exception object per caller: each raises it on its own thread
                call.future.set_exception(SourceError(message))
            return
        offset = 0
        for call in batch:
            call.future.set_result(results[offset : offset + len(call.queries)])
            offset += len(call.queries)

    def _post(self, queries: list[str], k: int) -> list[list[Passage]]:
        body = json.dumps({"queries": queries, "topk": k, "return_scores": True}).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        problem = "no attempt was made"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            with self._cond:
                self.requests_sent += 1
            try:
                reply = self._pool.urlopen("POST", self._path, body=body, headers=headers)
            except NewConnectionError as exc:  # (a subclass of urllib3's timeout error: test it first)
                problem = f"cannot reach the server ({exc})"
                continue
            except Urllib3Timeout:
                problem = f"no reply within {self.timeout_s} s"
                continue
            except HTTPError as exc:
                problem = f"cannot reach the server ({type(exc).__name__}: {exc})"
                continue
            if 400 <= reply.status < 500 and reply.status not in _RETRIED_CLIENT_STATUSES:
                raise SourceError(f"source {self.name!r}: {self.url} rejected the request with HTTP {reply.status}: {_reply_detail(reply.data)}")
            if reply.status != 200:
                problem = f"HTTP {reply.status}: {_reply_detail(reply.data)}"
                continue
            try:
                results = parse_retrieve_response(json.loads(reply.data), len(queries))
            except ValueError as exc:  # includes a body that is not JSON (or not UTF-8)
                problem = f"malformed reply: {exc}"
                continue
            return [row[:k] for row in results]
        raise SourceError(f"source {self.name!r}: {self.url} failed after {self.retries + 1} attempt(s): {problem}")


def _reply_detail(data: bytes, limit: int = 300) -> str:
    """The server's error message (its ``detail`` field, as Search-R1's FastAPI server and ours send it) or the start of the body."""
    try:
        body = json.loads(data)
    except ValueError:
        return data[:limit].decode("utf-8", "replace") or "(empty body)"
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:limit]
    return str(body)[:limit]
