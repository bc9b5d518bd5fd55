"""RemoteSource: the HTTP client for Search-R1-style retrieval servers.

Everything runs over loopback (127.0.0.1, port 0) against this project's server (serving an in-test
Source), a tiny scripted HTTP server that misbehaves on purpose (500s, slow replies, malformed
bodies), or a raw socket server that never answers or sends its reply a byte at a time. Every wait
is bounded, and every misbehaving handler stops by itself.
"""
from __future__ import annotations

import http.server
import json
import socket
import socketserver
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

import pytest

from search_env.sources.base import Passage, Source, SourceError
from search_env.sources.remote import RemoteSource, document_to_passage, parse_retrieve_response
from tests.conftest import in_forked_child, skip_without

if TYPE_CHECKING:
    from search_env.server import RetrievalServer

WAIT_S = 10.0  # upper bound for any wait in this file


class FakeSource(Source):
    """Deterministic passages derived from the query; titles with quotes, texts with newlines."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.calls: list[list[str]] = []
        self.gate: threading.Event | None = None  # when set, the first call waits for it

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        self.calls.append(list(queries))
        if self.gate is not None and len(self.calls) == 1:
            assert self.gate.wait(WAIT_S), "test gate never opened"
        return [[expected_passage(q, i, k) for i in range(k)] for q in queries]


def expected_passage(query: str, rank: int, k: int) -> Passage:
    return Passage(id=f"{query}#{rank}", title=f'Title "{query}" é', text=f"text {rank} of {query}\nsecond line", score=float(k - rank) / 2)


@pytest.fixture(scope="module")
def shared_source() -> FakeSource:
    return FakeSource()


@pytest.fixture(scope="module")
def shared_server(shared_source: FakeSource):
    skip_without("server", "starlette", "pydantic", "uvicorn")
    from search_env.server import RetrievalServer

    with RetrievalServer(shared_source) as running:
        yield running


@pytest.fixture
def fake_source(shared_source: FakeSource) -> FakeSource:
    """The served source, reset for this test."""
    shared_source.calls.clear()
    shared_source.gate = None
    return shared_source


@pytest.fixture
def server(shared_server: RetrievalServer, fake_source: FakeSource) -> RetrievalServer:
    """A server shared by the module's tests (starting one per test would dominate the run time)."""
    return shared_server


class ScriptedHandler(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the next (status, body, delay_s) of the server's script (the last repeats)."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length", 0))
        payload = json.loads(self.rfile.read(length))
        script = self.server.script  # type: ignore[attr-defined]
        self.server.requests.append(payload)  # type: ignore[attr-defined]
        status, body, delay_s = script[min(len(self.server.requests), len(script)) - 1]  # type: ignore[attr-defined]
        if delay_s:
            time.sleep(delay_s)
        data = body(payload) if callable(body) else body
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass

    def log_message(self, *args: object) -> None:
        pass


Reply = tuple[int, "bytes | Callable[[dict], bytes]", float]


@pytest.fixture
def scripted():
    """Start a scripted HTTP server: ``scripted([(status, body, delay_s), ...]) -> (url, requests_seen)``."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(script: list[Reply]) -> tuple[str, list[dict]]:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ScriptedHandler)
        httpd.daemon_threads = True
        httpd.script = script  # type: ignore[attr-defined]
        httpd.requests = []  # type: ignore[attr-defined]
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/retrieve", httpd.requests  # type: ignore[attr-defined]

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def good_reply(payload: dict) -> bytes:
    """What a Search-R1 server sends: one list of {document, score} per query."""
    result = [
        [{"document": {"id": f"{q}-{i}", "contents": f'"T{i}"\nbody {q}'}, "score": 1.0 - i / 10} for i in range(payload["topk"])]
        for q in payload["queries"]
    ]
    return json.dumps({"result": result}).encode()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- against the project's own server -------------------------------------------------------------


def test_round_trip_gives_the_served_passages_exactly(server: RetrievalServer) -> None:
    remote = RemoteSource(server.retrieve_url, name="wiki")
    try:
        got = remote.search(["capital of France", "ünïcode ✓"], 3)
    finally:
        remote.close()
    assert got == [[expected_passage(q, i, 3) for i in range(3)] for q in ["capital of France", "ünïcode ✓"]]
    assert remote.name == "wiki"


def test_base_url_is_completed_with_retrieve_path(server: RetrievalServer) -> None:
    remote = RemoteSource(server.url)
    try:
        assert remote.url == server.retrieve_url
        assert remote.search(["q"], 1) == [[expected_passage("q", 0, 1)]]
    finally:
        remote.close()


def test_concurrent_calls_are_merged_into_one_request(server: RetrievalServer, fake_source: FakeSource) -> None:
    """While the only sender waits on a blocked first request, seven calls queue and go out as one."""
    fake_source.gate = threading.Event()
    remote = RemoteSource(server.retrieve_url, max_in_flight=1)
    results: dict[int, list[list[Passage]]] = {}

    def call(i: int) -> None:
        results[i] = remote.search([f"query {i}"], 2)

    try:
        first = threading.Thread(target=call, args=(0,))
        first.start()
        deadline = time.monotonic() + WAIT_S
        while not fake_source.calls:  # the first request reached the source and is blocked
            assert time.monotonic() < deadline
            time.sleep(0.005)
        others = [threading.Thread(target=call, args=(i,)) for i in range(1, 8)]
        for thread in others:
            thread.start()
        while len(remote._pending) < 7:
            assert time.monotonic() < deadline, "the seven calls never queued"
            time.sleep(0.005)
        fake_source.gate.set()
        for thread in [first, *others]:
            thread.join(WAIT_S)
    finally:
        fake_source.gate.set()
        remote.close()
    assert remote.requests_sent == 2
    assert sorted(fake_source.calls[1]) == sorted(f"query {i}" for i in range(1, 8))
    assert results == {i: [[expected_passage(f"query {i}", r, 2) for r in range(2)]] for i in range(8)}


def test_many_threads_each_get_their_own_results(server: RetrievalServer) -> None:
    remote = RemoteSource(server.retrieve_url, max_batch=5)
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for j in range(5):
                queries = [f"t{t} j{j} a", f"t{t} j{j} b"]
                assert remote.search(queries, 2) == [[expected_passage(q, r, 2) for r in range(2)] for q in queries]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
    finally:
        remote.close()
    assert not errors
    assert not any(thread.is_alive() for thread in threads)


def test_call_larger_than_max_batch_is_split_in_order(server: RetrievalServer, fake_source: FakeSource) -> None:
    queries = [f"q{i}" for i in range(7)]
    remote = RemoteSource(server.retrieve_url, max_batch=3)
    try:
        got = remote.search(queries, 1)
    finally:
        remote.close()
    assert got == [[expected_passage(q, 0, 1)] for q in queries]
    assert [len(c) for c in fake_source.calls] == [3, 3, 1]


def test_empty_batch_and_zero_k_send_nothing(server: RetrievalServer, fake_source: FakeSource) -> None:
    remote = RemoteSource(server.retrieve_url)
    try:
        assert remote.search([], 3) == []
        assert remote.search(["a", "b"], 0) == [[], []]
    finally:
        remote.close()
    assert remote.requests_sent == 0 and fake_source.calls == []


def test_search_after_close_raises_source_error(server: RetrievalServer) -> None:
    remote = RemoteSource(server.retrieve_url)
    remote.search(["warm"], 1)
    remote.close()
    with pytest.raises(SourceError, match="closed"):
        remote.search(["q"], 1)


# --- failures become SourceError -------------------------------------------------------------------


def test_server_down_raises_after_retries() -> None:
    remote = RemoteSource(f"http://127.0.0.1:{closed_port()}/retrieve", retries=2, backoff_s=0.01, timeout_s=2.0)
    try:
        with pytest.raises(SourceError, match="cannot reach the server"):
            remote.search(["q"], 3)
    finally:
        remote.close()
    assert remote.requests_sent == 3


def test_slow_reply_fails_at_the_deadline_with_one_attempt(scripted) -> None:
    """The deadline covers the call, retries included: a reply slower than it uses one attempt."""
    url, seen = scripted([(200, good_reply, 3.0)])
    remote = RemoteSource(url, timeout_s=0.5, retries=2, backoff_s=0.01)
    try:
        with pytest.raises(SourceError, match="no reply within 0.5 s"):
            remote.search(["slow"], 2)
    finally:
        remote.close()
    # Per-attempt timeouts would have sent all three attempts (each 0.5 s < 3 s); the call's deadline
    # leaves no time for a second one. Counted, not timed.
    assert remote.requests_sent == 1


DRIP_S = 0.05
DRIP_LIMIT = 200  # a misbehaving handler stops by itself after 200 bytes or waits: 10 s at most
ANSWER = json.dumps({"result": [[{"document": {"id": "7", "contents": '"T"\nbody'}, "score": 1.0}]]}).encode()


class MisbehavingHandler(socketserver.BaseRequestHandler):
    """Reads a request's head, then answers in the server's next mode: "silent" (never), "drip-status"
    (the status line a byte at a time), "drip-body" (headers, then the body a byte at a time) or
    "answer" (one passage at once). Records when the client cut a request that never finished."""

    def handle(self) -> None:
        server = self.server
        self.request.settimeout(DRIP_S)
        received = b""
        for _ in range(DRIP_LIMIT):
            if b"\r\n\r\n" in received:
                break
            try:
                received += self.request.recv(65536) or b"\0"
            except TimeoutError:
                continue
        modes = server.modes  # type: ignore[attr-defined]
        server.requests.append(received)  # type: ignore[attr-defined]
        mode = modes[min(len(server.requests), len(modes)) - 1]  # type: ignore[attr-defined]
        status = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
        if mode == "answer":
            self.request.sendall(status + b"Content-Length: %d\r\n\r\n" % len(ANSWER) + ANSWER)
            return
        stream = status + b"Content-Length: 100000\r\n\r\n" + b"{" * DRIP_LIMIT
        if mode == "drip-body":
            self.request.sendall(stream[: stream.index(b"\r\n\r\n") + 4])
            stream = b"{" * DRIP_LIMIT
        for index in range(DRIP_LIMIT):
            try:
                if mode == "silent":
                    if self.request.recv(1) == b"":
                        break  # the client closed its side
                else:
                    self.request.sendall(stream[index : index + 1])
                    time.sleep(DRIP_S)
            except TimeoutError:
                continue
            except OSError:
                break
        else:
            return  # ran to the end: the client never cut the connection
        server.cut.set()  # type: ignore[attr-defined]


@pytest.fixture
def misbehaving():
    """Start a misbehaving server: ``misbehaving([mode, ...]) -> (url, server)``; the last mode repeats."""
    servers: list[socketserver.ThreadingTCPServer] = []

    def start(modes: list[str]) -> tuple[str, socketserver.ThreadingTCPServer]:
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), MisbehavingHandler)
        server.daemon_threads = True
        server.modes, server.requests, server.cut = modes, [], threading.Event()  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/retrieve", server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", ["silent", "drip-status", "drip-body"])
def test_a_server_that_never_finishes_is_cut_at_the_deadline(misbehaving, mode: str) -> None:
    """Per-read socket timeouts never fire against a byte every 50 ms; the call's deadline does, and
    the request in flight is cut (the server sees its connection close) before close() is called."""
    url, server = misbehaving([mode])
    remote = RemoteSource(url, timeout_s=0.5, retries=2, backoff_s=0.01)
    try:
        with pytest.raises(SourceError, match="no reply within 0.5 s"):  # a hang here fails by pytest-timeout
            remote.search(["q"], 2)
        assert server.cut.wait(5.0), "the request was left running after the deadline"
    finally:
        remote.close()
    assert len(server.requests) == 1


def test_the_source_answers_again_after_a_cut_request(misbehaving) -> None:
    """The cut connection is not reused: the next call opens a new one and gets its answer."""
    url, server = misbehaving(["drip-body", "answer"])
    remote = RemoteSource(url, timeout_s=0.5, retries=0, max_in_flight=1)
    try:
        with pytest.raises(SourceError, match="no reply within"):
            remote.search(["q"], 1)
        assert remote.search(["q"], 1) == [[Passage("7", "T", "body", 1.0)]]
    finally:
        remote.close()
    assert len(server.requests) == 2


def test_close_cuts_a_request_in_flight(misbehaving) -> None:
    url, server = misbehaving(["silent"])
    remote = RemoteSource(url, timeout_s=30.0)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            remote.search(["q"], 1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + WAIT_S
    while not server.requests:
        assert time.monotonic() < deadline, "the request never arrived"
        time.sleep(0.01)
    remote.close()
    caller.join(WAIT_S)
    assert not caller.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], SourceError)
    assert server.cut.wait(WAIT_S)


def test_http_500_is_retried_then_raises(scripted) -> None:
    url, seen = scripted([(500, b'{"detail": "index exploded"}', 0.0)])
    remote = RemoteSource(url, retries=2, backoff_s=0.01)
    try:
        with pytest.raises(SourceError, match="HTTP 500: index exploded"):
            remote.search(["q"], 2)
    finally:
        remote.close()
    assert len(seen) == 3


def test_transient_500_recovers_on_retry(scripted) -> None:
    url, seen = scripted([(500, b"oops", 0.0), (200, good_reply, 0.0)])
    remote = RemoteSource(url, retries=1, backoff_s=0.01)
    try:
        got = remote.search(["q"], 2)
    finally:
        remote.close()
    assert len(seen) == 2
    assert [p.id for p in got[0]] == ["q-0", "q-1"]
    assert got[0][1] == Passage(id="q-1", title="T1", text="body q", score=pytest.approx(0.9))


def test_client_error_is_not_retried(scripted) -> None:
    url, seen = scripted([(422, b'{"detail": "topk must be between 1 and 200"}', 0.0)])
    remote = RemoteSource(url, retries=3, backoff_s=0.01)
    try:
        with pytest.raises(SourceError, match="HTTP 422: topk must be between 1 and 200"):
            remote.search(["q"], 2)
    finally:
        remote.close()
    assert len(seen) == 1


@pytest.mark.parametrize(
    "body, message",
    [
        (b"<html>not json</html>", "malformed reply"),
        (b'{"results": []}', "'result' field"),
        (b'{"result": [[]]}', "one list per query"),  # two queries asked, one list back
        (b'{"result": [[{"document": {"id": "1"}, "score": 1}], []]}', "contents"),
        (b'{"result": [[{"document": {"id": "1", "contents": "x"}, "score": "high"}], []]}', "score"),
    ],
)
def test_malformed_reply_raises_after_retries(scripted, body: bytes, message: str) -> None:
    url, seen = scripted([(200, body, 0.0)])
    remote = RemoteSource(url, retries=1, backoff_s=0.01)
    try:
        with pytest.raises(SourceError, match=message):
            remote.search(["a", "b"], 1)
    finally:
        remote.close()
    assert len(seen) == 2


def test_request_payload_is_the_search_r1_one(scripted) -> None:
    url, seen = scripted([(200, good_reply, 0.0)])
    remote = RemoteSource(url)
    try:
        remote.search(["who wrote it?"], 5)
    finally:
        remote.close()
    assert seen == [{"queries": ["who wrote it?"], "topk": 5, "return_scores": True}]


def test_more_passages_than_asked_are_cut_to_k(scripted) -> None:
    url, _ = scripted([(200, lambda payload: good_reply({**payload, "topk": 4}), 0.0)])
    remote = RemoteSource(url)
    try:
        assert [p.id for p in remote.search(["q"], 2)[0]] == ["q-0", "q-1"]
    finally:
        remote.close()


# --- parsing and arguments -------------------------------------------------------------------------


def test_documents_in_every_known_layout_are_read() -> None:
    scored = {"result": [[{"document": {"id": "7", "contents": '"Paris"\nCapital of France.\nMore.'}, "score": 12.5}]]}
    bare = {"result": [[{"id": 7, "contents": '"Paris"\nCapital of France.\nMore.'}]]}
    titled = {"result": [[{"title": "Paris", "text": "Capital of France.\nMore.", "contents": "ignored\nwhen contents exists"}]]}
    assert parse_retrieve_response(scored, 1) == [[Passage("7", "Paris", "Capital of France.\nMore.", 12.5)]]
    assert parse_retrieve_response(bare, 1) == [[Passage("7", "Paris", "Capital of France.\nMore.", 0.0)]]
    # Search-R1's BM25 server sends title/text/contents without an id: the title stands in for it
    assert parse_retrieve_response(titled, 1) == [[Passage("ignored", "ignored", "when contents exists", 0.0)]]
    assert document_to_passage({"title": "A", "text": "b"}) == Passage("A", "A", "b", 0.0)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        RemoteSource("127.0.0.1:8000")
    with pytest.raises(ValueError, match="timeout_s"):
        RemoteSource("http://127.0.0.1:8000", timeout_s=0)
    remote = RemoteSource("http://127.0.0.1:8000")
    with pytest.raises(SourceError, match="string"):
        remote.search([b"bytes"], 1)  # type: ignore[list-item]
    remote.close()


def test_a_forked_child_searches_through_a_source_the_parent_used(server: RetrievalServer) -> None:
    # The parent's sender threads do not exist in a fork (an EnvWorker): the child must start its own.
    source = RemoteSource(server.url, name="remote", timeout_s=WAIT_S, max_in_flight=1)  # no second sender
    try:
        assert source.search(["parent"], 2) == [[expected_passage("parent", r, 2) for r in range(2)]]
        assert source._senders  # threads were started here
        found = in_forked_child(lambda: source.search(["child", "two"], 1), timeout_s=WAIT_S)
        assert found == [[expected_passage("child", 0, 1)], [expected_passage("two", 0, 1)]]
    finally:
        source.close()
