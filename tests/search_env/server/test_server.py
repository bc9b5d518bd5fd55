"""The project's retrieval server: Search-R1 API compatibility, request bounds, batching, the CLI.

Servers run over loopback (127.0.0.1, port 0) on a background thread or, for the CLI, a subprocess;
each is stopped by its test. Every loop and wait is bounded.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import pytest

from tests.conftest import REPO_ROOT, skip_without

skip_without("server", "starlette", "pydantic", "uvicorn", "requests")
import requests  # noqa: E402

from search_env.server import MicroBatcher, RetrievalServer, ServerLimits  # noqa: E402
from search_env.server.build import STAMP_FILE, build_source, synthetic_passages  # noqa: E402
from search_env.sources.base import Passage, Source, SourceError  # noqa: E402
from search_env.sources.bm25 import BM25Source  # noqa: E402
from search_env.sources.remote import RemoteSource  # noqa: E402

WAIT_S = 10.0
REPO = REPO_ROOT


class FakeSource(Source):
    """Query-derived passages, optionally slow, failing on queries that contain "boom"."""

    def __init__(self, delay_s: float = 0.0, gate: threading.Event | None = None) -> None:
        self.name = "fake"
        self.delay_s = delay_s
        self.gate = gate  # when given, the first call waits for it
        self.calls: list[tuple[list[str], int]] = []

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        self.calls.append((list(queries), k))
        if self.gate is not None and len(self.calls) == 1:
            assert self.gate.wait(WAIT_S), "test gate never opened"
        if self.delay_s:
            time.sleep(self.delay_s)
        if any("boom" in q for q in queries):
            raise SourceError("the index exploded")
        return [[Passage(id=f"{q}/{i}", title=f"About {q}", text=f"Passage {i} on {q}.\nMore.", score=10.0 - i) for i in range(k)] for q in queries]


LIMITS = ServerLimits(max_body_bytes=4096, max_queries=8, max_query_chars=100, max_topk=10)


@pytest.fixture(scope="module")
def shared_fake() -> FakeSource:
    return FakeSource()


@pytest.fixture(scope="module")
def shared_server(shared_fake: FakeSource):
    with RetrievalServer(shared_fake, default_topk=2, limits=LIMITS) as running:
        yield running


@pytest.fixture
def fake(shared_fake: FakeSource) -> FakeSource:
    """The served source, with its call log cleared for this test."""
    shared_fake.calls.clear()
    return shared_fake


@pytest.fixture
def server(shared_server: RetrievalServer, fake: FakeSource) -> RetrievalServer:
    """A server shared by the module's tests (starting one per test would dominate the run time)."""
    return shared_server


def post(server: RetrievalServer, body: object) -> requests.Response:
    return requests.post(server.retrieve_url, json=body, timeout=WAIT_S)


# --- the Search-R1 API ------------------------------------------------------------------------------


def test_layout_with_scores_is_exactly_search_r1s(server: RetrievalServer) -> None:
    reply = post(server, {"queries": ["paris", "rome"], "topk": 2, "return_scores": True})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {
        "result": [
            [
                {"document": {"id": "paris/0", "contents": '"About paris"\nPassage 0 on paris.\nMore.'}, "score": 10.0},
                {"document": {"id": "paris/1", "contents": '"About paris"\nPassage 1 on paris.\nMore.'}, "score": 9.0},
            ],
            [
                {"document": {"id": "rome/0", "contents": '"About rome"\nPassage 0 on rome.\nMore.'}, "score": 10.0},
                {"document": {"id": "rome/1", "contents": '"About rome"\nPassage 1 on rome.\nMore.'}, "score": 9.0},
            ],
        ]
    }


def test_without_scores_each_query_gets_bare_documents(server: RetrievalServer) -> None:
    reply = post(server, {"queries": ["paris", "rome", "oslo"], "topk": 1, "return_scores": False})
    assert reply.status_code == 200
    assert reply.json() == {
        "result": [
            [{"id": "paris/0", "contents": '"About paris"\nPassage 0 on paris.\nMore.'}],
            [{"id": "rome/0", "contents": '"About rome"\nPassage 0 on rome.\nMore.'}],
            [{"id": "oslo/0", "contents": '"About oslo"\nPassage 0 on oslo.\nMore.'}],
        ]
    }


@pytest.mark.parametrize("extra", [{}, {"topk": None}, {"topk": 0}])
def test_missing_null_or_zero_topk_means_the_default(server: RetrievalServer, extra: dict) -> None:
    reply = post(server, {"queries": ["x"], **extra})  # return_scores defaults to false, as in the reference
    assert reply.status_code == 200
    assert [doc["id"] for doc in reply.json()["result"][0]] == ["x/0", "x/1"]  # default_topk=2


def test_a_client_written_like_search_r1s_works(server: RetrievalServer) -> None:
    """Search-R1's generation code: requests.post(url, json=payload).json()["result"], then its
    passages-to-string formatting, which takes the first line of contents as the title."""
    payload = {"queries": ["paris", "rome"], "topk": 2, "return_scores": True}
    results = requests.post(server.retrieve_url, json=payload).json()["result"]
    formatted = []
    for retrieval_result in results:
        reference = ""
        for idx, doc_item in enumerate(retrieval_result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            reference += f"Doc {idx + 1}(Title: {title}) {text}\n"
        formatted.append(reference)
    assert formatted[0] == (
        'Doc 1(Title: "About paris") Passage 0 on paris.\nMore.\n' 'Doc 2(Title: "About paris") Passage 1 on paris.\nMore.\n'
    )


def test_empty_query_list_gives_empty_result(server: RetrievalServer, fake: FakeSource) -> None:
    reply = post(server, {"queries": [], "topk": 3})
    assert reply.status_code == 200 and reply.json() == {"result": []}
    assert fake.calls == []


def test_unknown_fields_are_ignored(server: RetrievalServer) -> None:
    reply = post(server, {"queries": ["x"], "topk": 1, "return_scores": True, "request_id": "abc"})
    assert reply.status_code == 200 and len(reply.json()["result"][0]) == 1


def test_health(server: RetrievalServer) -> None:
    before = requests.get(f"{server.url}/health", timeout=WAIT_S).json()
    post(server, {"queries": ["a", "b"], "topk": 1})
    reply = requests.get(f"{server.url}/health", timeout=WAIT_S)
    assert reply.status_code == 200
    after = reply.json()
    inline = after.pop("inline_calls")  # whether this lone request ran inline depends on the module's earlier clients
    assert after == {"status": "ok", "source": "fake", "source_calls": before["source_calls"] + 1, "queries": before["queries"] + 2}
    assert before["inline_calls"] <= inline <= before["inline_calls"] + 1


def test_binds_loopback_by_default(server: RetrievalServer) -> None:
    assert server.host == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")


# --- malformed and oversize requests -----------------------------------------------------------------


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"this is not json", 400, "not valid JSON"),
        (b'{"queries": ["a"', 400, "not valid JSON"),
        (b"[1, 2]", 422, "body"),
        (b"{}", 422, "queries: Field required"),
        (b'{"topk": 3}', 422, "queries: Field required"),
        (b'{"queries": "one string"}', 422, "queries: Input should be a valid array"),
        (b'{"queries": ["ok", 7]}', 422, "queries.1: Input should be a valid string"),
        (b'{"queries": ["a"], "topk": "3"}', 422, "topk: Input should be a valid integer"),
        (b'{"queries": ["a"], "topk": 2.5}', 422, "topk"),
        (b'{"queries": ["a"], "return_scores": "yes"}', 422, "return_scores"),
        (b'{"queries": ["a"], "topk": -1}', 422, "topk must be between 1 and 10"),
        (b'{"queries": ["a"], "topk": 11}', 422, "topk must be between 1 and 10"),
    ],
)
def test_malformed_requests_get_4xx_with_a_clear_message(server: RetrievalServer, fake: FakeSource, body: bytes, status: int, message: str) -> None:
    reply = requests.post(server.retrieve_url, data=body, headers={"Content-Type": "application/json"}, timeout=WAIT_S)
    assert reply.status_code == status
    assert message in reply.json()["detail"]
    assert fake.calls == []


def test_body_over_the_byte_limit_is_413(server: RetrievalServer) -> None:
    reply = post(server, {"queries": ["x" * 50] * 100})  # ~5.4 kB > 4096
    assert reply.status_code == 413
    assert "exceeds the limit of 4096 bytes" in reply.json()["detail"]


def test_chunked_body_over_the_byte_limit_is_413(server: RetrievalServer) -> None:
    chunks = (b" " * 1000 for _ in range(10))  # a generator body is sent chunked, without Content-Length
    reply = requests.post(server.retrieve_url, data=chunks, timeout=WAIT_S)
    assert reply.status_code == 413


def _raw_request_head(server: RetrievalServer, length: int) -> socket.socket:
    """A loopback connection that has sent a ``/retrieve`` request's head declaring ``length`` body bytes."""
    sock = socket.create_connection((server.host, server.port), timeout=WAIT_S)
    sock.sendall(f"POST /retrieve HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode())
    return sock


def test_a_client_that_disconnects_mid_body_is_one_log_line(server: RetrievalServer, fake: FakeSource,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    body = json.dumps({"queries": ["alpha", "beta"]}).encode()
    with caplog.at_level(logging.INFO):
        with _raw_request_head(server, len(body)) as sock:
            sock.sendall(body[:10])
            time.sleep(0.1)  # the server is reading the body when the client goes
        deadline = time.monotonic() + WAIT_S
        while not any("disconnected" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.01)
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(logged) == 1 and logged[0].exc_info is None, [r.getMessage() for r in logged]
    message = logged[0].getMessage()
    assert message.startswith("client 127.0.0.1:") and message.endswith("disconnected while sending its request body; nothing was searched")
    assert "\n" not in message and fake.calls == []
    assert post(server, {"queries": ["after"]}).status_code == 200  # the server goes on serving


def test_a_body_that_trickles_in_is_cut_at_the_body_deadline_with_408(fake: FakeSource) -> None:
    body = json.dumps({"queries": ["slow"]}).encode()
    limits = ServerLimits(max_body_bytes=4096, body_timeout_s=0.5)
    with RetrievalServer(fake, limits=limits) as server, _raw_request_head(server, len(body)) as sock:
        started = time.monotonic()
        sock.settimeout(0.05)
        reply = b""
        for byte in body:  # one byte every 50 ms: the whole body would take over 1 s
            try:
                sock.sendall(bytes([byte]))
                reply += sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:  # the server closed the connection
                break
            if reply:
                break
        sock.settimeout(WAIT_S)
        while True:  # the rest of the answer, then the server's close
            try:
                chunk = sock.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            reply += chunk
        elapsed = time.monotonic() - started
    assert reply.startswith(b"HTTP/1.1 408 "), reply
    assert b"request body not received in full within 0.5 s" in reply
    assert 0.5 <= elapsed < 0.5 + WAIT_S / 2 and fake.calls == []


def test_body_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="body_timeout_s must be a positive number of seconds"):
        ServerLimits(body_timeout_s=0)


def test_too_many_queries_is_413(server: RetrievalServer, fake: FakeSource) -> None:
    reply = post(server, {"queries": [f"q{i}" for i in range(9)]})
    assert reply.status_code == 413 and "9 queries in one request; the limit is 8" in reply.json()["detail"]
    assert fake.calls == []


def test_too_long_query_is_413(server: RetrievalServer) -> None:
    reply = post(server, {"queries": ["short", "y" * 101]})
    assert reply.status_code == 413 and "query 1 has 101 characters" in reply.json()["detail"]


def test_wrong_method_and_path(server: RetrievalServer) -> None:
    assert requests.get(server.retrieve_url, timeout=WAIT_S).status_code == 405
    assert requests.post(f"{server.url}/search", json={"queries": ["a"]}, timeout=WAIT_S).status_code == 404


def test_source_failure_is_500_and_the_server_keeps_serving(server: RetrievalServer) -> None:
    reply = post(server, {"queries": ["boom"]})
    assert reply.status_code == 500 and "the index exploded" in reply.json()["detail"]
    assert post(server, {"queries": ["fine"]}).status_code == 200


def test_remote_source_turns_server_side_4xx_into_source_error(server: RetrievalServer) -> None:
    remote = RemoteSource(server.retrieve_url, retries=0)
    try:
        with pytest.raises(SourceError, match="HTTP 413"):
            remote.search(["z" * 101], 1)
    finally:
        remote.close()


# --- concurrency and batching --------------------------------------------------------------------


def test_concurrent_clients_get_their_own_answers_in_fewer_source_calls() -> None:
    slow = FakeSource(delay_s=0.02)  # requests pile up while a search runs
    with RetrievalServer(slow, limits=LIMITS) as server:
        errors: list[BaseException] = []

        def client(c: int) -> None:
            session = requests.Session()
            try:
                for j in range(6):
                    queries = [f"c{c} r{j} a", f"c{c} r{j} b"][: 1 + (j % 2)]
                    reply = session.post(server.retrieve_url, json={"queries": queries, "topk": 3, "return_scores": True}, timeout=WAIT_S)
                    got = [[entry["document"]["id"] for entry in row] for row in reply.json()["result"]]
                    assert got == [[f"{q}/{i}" for i in range(3)] for q in queries]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S * 3)
        assert not errors
        assert not any(thread.is_alive() for thread in threads)
        assert sum(len(queries) for queries, _ in slow.calls) == 8 * 9  # every query searched once
        assert len(slow.calls) < 8 * 6  # and fewer source calls than requests


def run_async(coro):
    return asyncio.run(asyncio.wait_for(coro, WAIT_S))


def test_micro_batcher_merges_queued_requests_and_groups_by_k() -> None:
    gate = threading.Event()
    source = FakeSource(gate=gate)

    async def scenario() -> list:
        batcher = MicroBatcher(source, max_wait_s=0.0)
        await batcher.start()
        try:
            first = asyncio.create_task(batcher.search(["first"], 1))
            while not source.calls:  # the first search is running (and blocked) on the worker thread
                await asyncio.sleep(0.005)
            rest = [asyncio.create_task(batcher.search([f"q{i}"], 1 + i % 2)) for i in range(5)]
            await asyncio.sleep(0.05)
            gate.set()
            return await asyncio.gather(first, *rest)
        finally:
            gate.set()
            await batcher.stop()

    results = run_async(scenario())
    assert [call[1] for call in source.calls] == [1, 1, 2]  # first alone, then one call per k
    assert sorted(source.calls[1][0]) == ["q0", "q2", "q4"] and sorted(source.calls[2][0]) == ["q1", "q3"]
    assert [[p.id for p in rows[0]] for rows in results] == [["first/0"], ["q0/0"], ["q1/0", "q1/1"], ["q2/0"], ["q3/0", "q3/1"], ["q4/0"]]


def test_micro_batcher_waits_for_a_request_being_read() -> None:
    source = FakeSource()

    async def scenario() -> None:
        batcher = MicroBatcher(source, max_wait_s=5.0)  # a long bound: the wait must end on arrival
        await batcher.start()
        try:
            with batcher.expect():  # a second request is being read
                first = asyncio.create_task(batcher.search(["q0"], 1))
                await asyncio.sleep(0.05)
                assert source.calls == []  # the batch holds for the announced request
            second = asyncio.create_task(batcher.search(["q1"], 1))
            await asyncio.gather(first, second)
        finally:
            await batcher.stop()

    run_async(scenario())
    assert [sorted(queries) for queries, _ in source.calls] == [["q0", "q1"]]


def test_micro_batcher_does_not_wait_without_announced_requests() -> None:
    source = FakeSource()

    async def scenario() -> tuple[bool, bool]:
        batcher = MicroBatcher(source, max_wait_s=5.0)
        await batcher.start()
        # a timer of the batcher's whole wait, started first on the same loop: a batch that waited
        # its bound out would end after it
        bound = asyncio.create_task(asyncio.sleep(batcher.max_wait_s))
        try:
            await batcher.search(["alone"], 1)  # nothing announced: no wait at all
            alone_first = not bound.done()
            with batcher.expect():  # announced, then rejected before searching: the wait ends with it
                first = asyncio.create_task(batcher.search(["again"], 1))
                await asyncio.sleep(0.05)
            await first
            return alone_first, not bound.done()
        finally:
            bound.cancel()
            await batcher.stop()

    alone_first, rejected_first = run_async(scenario())
    assert alone_first and rejected_first  # neither waited for its bound
    assert [queries for queries, _ in source.calls] == [["alone"], ["again"]]


def test_micro_batcher_caps_a_batch_at_max_batch() -> None:
    source = FakeSource()

    async def scenario() -> None:
        batcher = MicroBatcher(source, max_batch=3)
        await batcher.start()
        try:
            await asyncio.gather(*(batcher.search([f"q{i}"], 1) for i in range(4)))
        finally:
            await batcher.stop()

    run_async(scenario())
    assert [sorted(queries) for queries, _ in source.calls] == [["q0", "q1", "q2"], ["q3"]]


def test_one_bad_request_does_not_fail_its_batch_mates() -> None:
    gate = threading.Event()
    source = FakeSource(gate=gate)

    async def scenario() -> list:
        batcher = MicroBatcher(source, max_wait_s=0.0)
        await batcher.start()
        try:
            first = asyncio.create_task(batcher.search(["first"], 1))
            while not source.calls:
                await asyncio.sleep(0.005)
            good = asyncio.create_task(batcher.search(["good"], 1))
            bad = asyncio.create_task(batcher.search(["boom"], 1))
            await asyncio.sleep(0.05)
            gate.set()
            return await asyncio.gather(first, good, bad, return_exceptions=True)
        finally:
            gate.set()
            await batcher.stop()

    first, good, bad = run_async(scenario())
    assert [p.id for p in good[0]] == ["good/0"]
    assert isinstance(bad, SourceError)
    assert sorted(source.calls[1][0]) == ["boom", "good"]  # merged first, then retried one by one


class ThreadRecordingSource(FakeSource):
    """Records the thread each call ran on; a call whose queries include "hold" waits for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []
        self.release = threading.Event()
        self.holding = threading.Event()

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        self.threads.append(threading.get_ident())
        if "hold" in queries:
            self.holding.set()
            assert self.release.wait(WAIT_S), "test never released the held call"
        return super().search(queries, k)


def test_micro_batcher_runs_up_to_concurrency_calls_at_once() -> None:
    source = ThreadRecordingSource()

    async def scenario() -> list:
        batcher = MicroBatcher(source, max_wait_s=0.0, concurrency=2)
        await batcher.start()
        try:
            held = asyncio.create_task(batcher.search(["hold"], 1))
            while not source.holding.is_set():
                await asyncio.sleep(0.005)
            # the first call is blocked on its thread; the second must still be answered
            second = await batcher.search(["free"], 1)
            source.release.set()
            return [await held, second]
        finally:
            source.release.set()
            await batcher.stop()

    held, second = run_async(scenario())
    assert [p.id for p in held[0]] == ["hold/0"] and [p.id for p in second[0]] == ["free/0"]
    assert [queries for queries, _ in source.calls] == [["free"], ["hold"]]  # "free" finished while "hold" ran
    assert source.threads[0] != source.threads[1]


def test_micro_batcher_one_call_at_a_time_by_default() -> None:
    source = ThreadRecordingSource()

    async def scenario() -> None:
        batcher = MicroBatcher(source, max_wait_s=0.0)
        await batcher.start()
        try:
            held = asyncio.create_task(batcher.search(["hold"], 1))
            while not source.holding.is_set():
                await asyncio.sleep(0.005)
            waiting = asyncio.create_task(batcher.search(["queued"], 1))
            await asyncio.sleep(0.05)
            assert len(source.threads) == 1  # the second request waits for the first call
            source.release.set()
            await asyncio.gather(held, waiting)
        finally:
            source.release.set()
            await batcher.stop()

    run_async(scenario())
    assert [queries for queries, _ in source.calls] == [["hold"], ["queued"]]
    assert len(set(source.threads)) == 1


def test_lone_client_is_searched_on_the_event_loop_and_a_second_client_stops_that() -> None:
    source = ThreadRecordingSource()

    async def scenario() -> tuple[int, int]:
        batcher = MicroBatcher(source, max_wait_s=0.0, concurrency=2)
        await batcher.start()
        try:
            loop_thread = threading.get_ident()
            for i in range(3):  # one client, one request after another
                await batcher.search([f"a{i}"], 1, client=("127.0.0.1", 1000))
            lone_calls = batcher.inline_calls
            await batcher.search(["b0"], 1, client=("127.0.0.1", 2000))  # a second connection
            await batcher.search(["a3"], 1, client=("127.0.0.1", 1000))
            await batcher.search(["anonymous"], 1)  # no client identity: never inline
            return loop_thread, lone_calls
        finally:
            await batcher.stop()

    loop_thread, lone_calls = run_async(scenario())
    assert lone_calls == 3
    on_loop = [thread == loop_thread for thread in source.threads]
    assert on_loop == [True, True, True, False, False, False]


def test_large_lone_request_goes_to_a_worker_thread() -> None:
    from search_env.server.batching import INLINE_MAX_QUERIES

    source = ThreadRecordingSource()

    async def scenario() -> int:
        batcher = MicroBatcher(source, max_wait_s=0.0)
        await batcher.start()
        try:
            await batcher.search([f"q{i}" for i in range(INLINE_MAX_QUERIES + 1)], 1, client=("127.0.0.1", 1000))
            await batcher.search(["small"], 1, client=("127.0.0.1", 1000))
            return threading.get_ident()
        finally:
            await batcher.stop()

    loop_thread = run_async(scenario())
    assert [thread == loop_thread for thread in source.threads] == [False, True]


def test_stop_fails_requests_whose_search_is_running() -> None:
    source = ThreadRecordingSource()

    async def scenario() -> BaseException | list:
        batcher = MicroBatcher(source, max_wait_s=0.0, concurrency=2)
        await batcher.start()
        held = asyncio.create_task(batcher.search(["hold"], 1))
        while not source.holding.is_set():
            await asyncio.sleep(0.005)
        # stop() joins the worker thread (blocking the loop), so the release must come from a thread
        release = threading.Timer(0.1, source.release.set)
        release.start()
        await batcher.stop()
        release.join()
        return (await asyncio.gather(held, return_exceptions=True))[0]

    outcome = run_async(scenario())
    assert isinstance(outcome, RuntimeError) and "shutting down" in str(outcome)


# --- a real source end to end, and the command line ----------------------------------------------------

CORPUS = [
    {"id": "p1", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "p2", "title": "Rome", "text": "Rome is the capital city of Italy."},
    {"id": "p3", "title": "Oslo", "text": "Oslo is the capital of Norway, on the Oslofjord."},
    {"id": "p4", "title": "Seine", "text": "The Seine is a river that flows through Paris."},
]


def test_bm25_through_the_server_equals_in_process() -> None:
    source = BM25Source(CORPUS, name="wiki")
    queries = ["capital of France", "river through Paris", "Norway capital"]
    with RetrievalServer(source) as server:
        remote = RemoteSource(server.retrieve_url, name="wiki")
        try:
            assert remote.search(queries, 3) == source.search(queries, 3)
        finally:
            remote.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> dict:
    """The /health reply once the server is ready (it answers 503 while its index is being built)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}: {process.stderr.read().decode()}")
        try:
            reply = requests.get(f"{url}/health", timeout=1.0)
        except requests.ConnectionError:
            reply = None
        if reply is not None and reply.status_code == 200:
            return reply.json()
        time.sleep(0.1)
    raise AssertionError(f"server did not become healthy within {timeout_s} s")


def run_cli(args: list[str], tmp_path: Path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "search_env.server", "--port", str(port), *args], cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    return f"http://127.0.0.1:{port}", process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(WAIT_S)


def test_cli_serves_a_bm25_corpus_and_saves_its_index(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS), encoding="utf-8")
    index_dir = tmp_path / "index"
    url, process = run_cli(["--corpus", str(corpus), "--retriever", "bm25", "--index-dir", str(index_dir)], tmp_path)
    try:
        assert wait_healthy(url, process, 60)["status"] == "ok"
        reply = requests.post(f"{url}/retrieve", json={"queries": ["capital of Italy"], "topk": 1, "return_scores": True}, timeout=WAIT_S)
        assert reply.json()["result"][0][0]["document"] == {"id": "p2", "contents": '"Rome"\nRome is the capital city of Italy.'}
    finally:
        stop(process)
    assert any(index_dir.iterdir())  # the next start loads instead of re-indexing


def test_cli_serves_a_synthetic_world_source(tmp_path: Path) -> None:
    url, process = run_cli(["--synthetic", "--synthetic-source", "news", "--retriever", "bm25"], tmp_path)
    try:
        assert wait_healthy(url, process, 60)["source"] == "news"
        reply = requests.post(f"{url}/retrieve", json={"queries": ["company founded"], "topk": 2}, timeout=WAIT_S)
        documents = reply.json()["result"][0]
        assert len(documents) == 2 and all(doc["id"].startswith("news-") for doc in documents)
    finally:
        stop(process)


@pytest.mark.parametrize(
    "argv, complaint",
    [
        (["--retriever", "bm25"], "exactly one of --corpus PATH and --synthetic"),
        (["--corpus", "c.jsonl", "--synthetic"], "exactly one of --corpus PATH and --synthetic"),
        (["--corpus", "c.jsonl", "--synthetic-source", "news"], "--synthetic-source needs --synthetic"),
        (["--corpus", "c.jsonl", "--retriever", "tfidf"], "--retriever: unknown retriever 'tfidf'; known: bm25, dense, hybrid"),
        (["--corpus", "c.jsonl", "--body-timeout-s", "0"], "--body-timeout-s must be a positive number of seconds, got 0.0"),
    ],
)
def test_cli_refuses_bad_arguments(argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]) -> None:
    from search_env.server.__main__ import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert complaint in capsys.readouterr().err


def test_cli_defaults_bind_loopback_with_search_r1_topk() -> None:
    from search_env.server.__main__ import parse_args

    args = parse_args(["--corpus", "c.jsonl"])
    assert (args.host, args.port, args.topk, args.retriever) == ("127.0.0.1", 8000, 3, "bm25")
    assert not args.compile  # compiling the encoder costs about a minute at start: opt-in only
    assert parse_args(["--corpus", "c.jsonl", "--retriever", "dense", "--compile"]).compile


def test_cli_serves_a_retriever_a_module_registers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib
    import sys

    from search_env.server.__main__ import parse_args

    module_name = "tests.search_env.sources.user_retriever"
    if module_name in sys.modules:
        sys.modules[module_name].forget()
    try:
        with pytest.raises(SystemExit):
            parse_args(["--corpus", "c.jsonl", "--retriever", "word-overlap"])  # not imported: not known
        assert "--retriever: unknown retriever 'word-overlap'; known: bm25, dense, hybrid" in capsys.readouterr().err
        args = parse_args(["--import", module_name, "--corpus", "c.jsonl", "--retriever", "word-overlap"])
        assert args.retriever == "word-overlap"
        module = importlib.import_module(module_name)
        source = build_source(args.retriever, passages=CORPUS, index_dir=tmp_path / "index", name="wiki")
        assert isinstance(source, module.WordOverlapSource) and source.name == "wiki"
        [(_, options)] = module.BUILT
        assert options.index_dir == tmp_path / "index" / "word-overlap" and options.encoder_threads == 1
        with pytest.raises(SystemExit):
            parse_args(["--import", "tests.no_such_module", "--corpus", "c.jsonl"])
        assert "--import tests.no_such_module: No module named 'tests.no_such_module'" in capsys.readouterr().err
    finally:
        if module_name in sys.modules:
            sys.modules[module_name].forget()


# --- building the served source ------------------------------------------------------------------


def test_bm25_index_dir_is_reused_and_rebuilt_when_the_corpus_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS), encoding="utf-8")
    index_dir = tmp_path / "index"
    built = build_source("bm25", corpus=corpus, index_dir=index_dir, name="wiki")
    stamp = json.loads((index_dir / "bm25" / STAMP_FILE).read_text())
    assert stamp["corpus"] == str(corpus.resolve())
    with caplog.at_level(logging.INFO, logger="search_env.server.build"):
        loaded = build_source("bm25", corpus=corpus, index_dir=index_dir, name="wiki")
    assert "loading the bm25 index" in caplog.text
    assert loaded.search(["capital of Norway"], 2) == built.search(["capital of Norway"], 2)

    rows = CORPUS + [{"id": "p5", "title": "Bergen", "text": "Bergen is a city in Norway."}]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="search_env.server.build"):
        rebuilt = build_source("bm25", corpus=corpus, index_dir=index_dir, name="wiki")
    assert "built from another corpus; rebuilding" in caplog.text
    assert [p.id for p in rebuilt.search(["Bergen"], 1)[0]] == ["p5"]


def test_build_source_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of corpus= and passages="):
        build_source("bm25")
    with pytest.raises(ValueError, match="unknown retriever 'tfidf'"):
        build_source("tfidf", passages=CORPUS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no source 'blogs'"):
        synthetic_passages(source="blogs")


@pytest.mark.slow
@pytest.mark.parametrize("retriever", ["dense", "hybrid"])
def test_minilm_retrievers_through_the_server_equal_in_process(retriever: str) -> None:
    source = build_source(retriever, passages=CORPUS, name="wiki")
    queries = ["Which city is the capital of Italy?", "a river in France"]
    with RetrievalServer(source) as server:
        remote = RemoteSource(server.retrieve_url, name="wiki")
        try:
            via_http = remote.search(queries, 2)
        finally:
            remote.close()
    direct = source.search(queries, 2)
    source.close()
    assert [[p.id for p in row] for row in via_http] == [[p.id for p in row] for row in direct]
    assert via_http[0][0].id == "p2"
    for http_row, direct_row in zip(via_http, direct):
        for a, b in zip(http_row, direct_row):
            assert (a.title, a.text) == (b.title, b.text) and a.score == pytest.approx(b.score, abs=1e-6)
