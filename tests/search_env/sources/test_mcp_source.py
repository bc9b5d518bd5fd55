"""MCPSource against the example MCP server (examples/mcp_search_server.py), started over stdio (and once
over streamable HTTP): it starts, answers as a BM25 source over the same passages does, answers several
queries (and several callers) at once, turns a killed, hung or missing server into a one-line SourceError
with its counters, never a hang, and stops its server on close. The failure tests use a server that starts
faster (mcp_text_server.py, no index to build; it also answers in plain text and has a tool that fails).
Server processes are found in /proc as children of this process; every wait is bounded."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from search_env.sources.base import SourceError
from search_env.sources.bm25 import BM25Source
from search_env.synthetic import generate_world
from tests.conftest import REPO_ROOT, skip_without

skip_without("mcp", "mcp")
from search_env.sources.mcp import MCPSource, register_mcp_source, tool_result_passages  # noqa: E402

SERVER = REPO_ROOT / "examples" / "mcp_search_server.py"
TEXT_SERVER = Path(__file__).with_name("mcp_text_server.py")
COMMAND = [sys.executable, str(SERVER)]
QUERIES = ["capital of Vroultiar", "country founded in 1568", "who founded the company", "zzz unknown words"]
WAIT_S = 10.0  # upper bound for any wait in this file

if not Path("/proc/self/stat").exists():
    pytest.skip("finding the server's process needs /proc", allow_module_level=True)


def server_pids(server: Path = TEXT_SERVER) -> list[int]:
    """The processes of ``server`` that are children of this process (a stdio server is one)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and server.name.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not been reaped (a zombie counts as gone)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def bm25() -> BM25Source:
    """What the example server searches by default: BM25 over the synthetic world of seed 0."""
    return BM25Source(generate_world(seed=0, n_questions=0).passages(), name="wiki")


@pytest.fixture(scope="module")
def shared() -> Iterator[MCPSource]:
    """One server for the tests that only search."""
    source = MCPSource(COMMAND, name="wiki")
    yield source
    source.close()


@pytest.fixture
def own() -> Iterator[tuple[MCPSource, int]]:
    """A server of the test's own (the quick one to start) and its process id, for the tests that kill or
    stop it; killed and closed after."""
    before = set(server_pids())
    source = MCPSource([sys.executable, str(TEXT_SERVER), "0"], name="wiki", timeout_s=2.0)
    (pid,) = set(server_pids()) - before
    yield source, pid
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    source.close()


def test_a_started_server_answers_as_bm25_over_the_same_passages(shared: MCPSource, bm25: BM25Source) -> None:
    assert shared.name == "wiki" and len(server_pids(SERVER)) == 1
    assert shared.search(QUERIES, 3) == bm25.search(QUERIES, 3)
    assert shared.search(QUERIES[:1], 1) == bm25.search(QUERIES[:1], 1)
    assert shared.search([], 3) == [] and shared.search(["x"], 0) == [[]]
    assert shared.failed_searches == 0 and shared.tool_calls == len(QUERIES) + 1


def test_several_queries_and_several_callers_at_once(shared: MCPSource, bm25: BM25Source) -> None:
    expected = bm25.search(QUERIES, 2)
    results: dict[int, object] = {}

    def call(caller: int) -> None:
        results[caller] = shared.search(QUERIES, 2)

    threads = [threading.Thread(target=call, args=(caller,)) for caller in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert results == {caller: expected for caller in range(4)}


def test_a_killed_server_is_a_failed_search_with_a_counter_not_a_hang(own: tuple[MCPSource, int]) -> None:
    own, pid = own
    assert len(own.search(QUERIES[:1], 2)[0]) == 2
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    for attempt in (1, 2):
        with pytest.raises(SourceError) as info:
            own.search(QUERIES, 2)
        assert str(info.value).startswith("source 'wiki': ") and "\n" not in str(info.value)
        assert own.failed_searches == attempt
    assert time.monotonic() - started < WAIT_S


def test_in_the_environment_a_dead_server_is_an_error_observation(own: tuple[MCPSource, int]) -> None:
    from search_env.env import SearchQAEnv

    source, pid = own
    env = SearchQAEnv("search-r1", sources={"wiki": source})
    env.reset(seed=0, options={"index": 0})
    env.step(env.codec.encode("<search> zarbo </search>"))
    assert "hit 1 for zarbo" in env.response_text and env.trajectory.tool_calls[0].error is None
    os.kill(pid, signal.SIGKILL)
    env.step(env.codec.encode("<search> vessa </search>"))
    assert env.trajectory.counters["source_errors"] == 1 and source.failed_searches == 1
    assert env.trajectory.tool_calls[1].error.startswith("SourceError: source 'wiki': ")
    assert "hit 1 for vessa" not in env.response_text


def test_a_hung_server_is_a_timeout_after_timeout_s(own: tuple[MCPSource, int]) -> None:
    own, pid = own
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"^source 'wiki': no reply from the MCP server .* within 2 s \(2 queries\)$"):
        own.search(QUERIES[:2], 2)
    assert own.timeout_s <= time.monotonic() - started < WAIT_S
    assert (own.failed_searches, own.timeouts) == (1, 1)


def test_a_server_command_that_does_not_exist_is_one_line() -> None:
    with pytest.raises(SourceError) as info:
        MCPSource(["no-such-mcp-server-command"], name="web")
    message = str(info.value)
    assert message.startswith("source 'web': cannot start the MCP server no-such-mcp-server-command: ")
    assert "No such file" in message and "\n" not in message


def test_a_server_that_never_answers_the_handshake_fails_after_start_timeout_s() -> None:
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    started = time.monotonic()
    with pytest.raises(SourceError, match=r"^source 'wiki': the MCP server .* did not start within 1 s$"):
        MCPSource(silent, name="wiki", start_timeout_s=1.0)
    assert time.monotonic() - started < WAIT_S


def test_a_missing_tool_is_one_line_naming_the_tools() -> None:
    before = server_pids()
    with pytest.raises(SourceError, match=r"^source 'wiki': cannot start .*: it has no tool 'lookup' \(its tools: search, broken\)$"):
        MCPSource([sys.executable, str(TEXT_SERVER), "0"], name="wiki", tool="lookup")
    assert server_pids() == before  # the server that was started for the check is stopped


def test_close_stops_the_server(own: tuple[MCPSource, int]) -> None:
    own, pid = own
    started = time.monotonic()
    own.close()
    assert not alive(pid) and time.monotonic() - started < WAIT_S
    with pytest.raises(SourceError, match=r"^source 'wiki' is closed$"):
        own.search(QUERIES[:1], 1)


def test_a_registered_mcp_retriever_is_built_by_name(bm25: BM25Source) -> None:
    from search_env.sources.registry import SOURCES, SourceOptions, build_source

    register_mcp_source("example-mcp", COMMAND, timeout_s=5.0)
    try:
        source = build_source("example-mcp", [], SourceOptions(name="news"))
        try:
            assert isinstance(source, MCPSource) and source.name == "news" and source.timeout_s == 5.0
            assert source.search(QUERIES[:1], 2) == bm25.search(QUERIES[:1], 2)
        finally:
            source.close()
    finally:
        SOURCES.pop("example-mcp", None)


def test_tool_results_become_passages() -> None:
    documents = [{"id": "d1", "title": "T", "text": "one", "score": 2.0}, {"id": 7, "contents": "\"W\"\ntwo"}]
    from_structured = tool_result_passages({"result": documents}, ["ignored"])
    assert [(p.id, p.title, p.text, p.score) for p in from_structured] == [("d1", "T", "one", 2.0), ("7", "W", "two", 0.0)]
    import json

    assert tool_result_passages(None, [json.dumps(documents)]) == from_structured
    assert tool_result_passages(None, [json.dumps(d) for d in documents]) == from_structured
    plain = tool_result_passages(None, ["first hit", "second hit"])
    assert [(p.id, p.title, p.text) for p in plain] == [("1", "", "first hit"), ("2", "", "second hit")]
    with pytest.raises(ValueError, match="a document needs"):
        tool_result_passages([{"id": "x", "body": "?"}], [])


def test_queries_in_flight_together_overlap_and_text_blocks_become_passages() -> None:
    source = MCPSource([sys.executable, str(TEXT_SERVER), "1.0"], name="web", timeout_s=WAIT_S)
    try:
        started = time.monotonic()
        results = source.search(["a", "b", "c", "d"], 2)
        elapsed = time.monotonic() - started
    finally:
        source.close()
    assert [[(p.id, p.title, p.text) for p in passages] for passages in results] == [
        [("1", "", f"hit 1 for {query}"), ("2", "", f"hit 2 for {query}")] for query in "abcd"]
    assert elapsed < 3.0  # each call waits 1 s on the server: one after another would take 4 s


def test_a_tool_that_reports_an_error_is_a_failed_search_with_its_first_line() -> None:
    source = MCPSource([sys.executable, str(TEXT_SERVER), "0"], name="web", tool="broken")
    try:
        with pytest.raises(SourceError, match=r"^source 'web': MCP tool 'broken' reported an error: .*the index behind this tool is offline$"):
            source.search(["x"], 1)
        assert source.failed_searches == 1 and source.timeouts == 0
    finally:
        source.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_server_over_streamable_http(bm25: BM25Source) -> None:
    port = free_port()
    process = subprocess.Popen([*COMMAND, "--transport", "streamable-http", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 3 * WAIT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.1)
        source = MCPSource(url=f"http://127.0.0.1:{port}/mcp", name="wiki", timeout_s=3.0)
        try:
            assert source.search(QUERIES, 3) == bm25.search(QUERIES, 3)
            process.kill()
            process.wait(WAIT_S)
            with pytest.raises(SourceError, match=r"^source 'wiki': ") as info:
                source.search(QUERIES[:1], 3)
            assert "\n" not in str(info.value) and source.failed_searches == 1
        finally:
            source.close()
    finally:
        process.kill()
        process.wait(WAIT_S)
