"""RemoteSource over several replicas of a retrieval server: requests spread over them, a replica that
dies or hangs is skipped (and said so, once) while the others answer within the same deadline, a pool
that is all down fails with SourceError, and a replica that comes back is used again.

Servers are this project's, over loopback, on background threads (stopped to "kill" them) or, for the
real process kill, subprocesses of ``python -m search_env.server``. A hung server is a listening socket
that never accepts: the kernel completes the connection, and no reply ever comes. Every wait is bounded
and no verdict depends on how fast anything ran.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import pytest

from search_env.sources.base import Passage, SourceError
from search_env.sources.remote import RemoteSource, replica_urls
from tests.conftest import REPO_ROOT, skip_without
from tests.search_env.sources.test_remote_source import FakeSource, closed_port, expected_passage, good_reply
from tests.search_env.sources.test_remote_source import scripted  # noqa: F401  (a fixture)

skip_without("server", "starlette", "pydantic", "uvicorn")
from search_env.server import RetrievalServer  # noqa: E402

WAIT_S = 10.0  # upper bound for any wait in this file
LOGGER = "search_env.sources.remote"


class ReplicaSource(FakeSource):
    """The served passages of FakeSource; every search fails (HTTP 500 from the server) while ``fail`` is set."""

    fail = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        if self.fail:
            raise SourceError("the index is unreadable")
        return super().search(queries, k)


@pytest.fixture
def replicas() -> Iterator[list[tuple[RetrievalServer, ReplicaSource]]]:
    """Two running servers, each over its own source (so each one's calls can be counted)."""
    started = []
    try:
        for name in ("a", "b"):
            source = ReplicaSource(name)
            started.append((RetrievalServer(source).start(), source))
        yield started
    finally:
        for server, _ in started:
            server.stop()


@pytest.fixture
def hung_url() -> Iterator[str]:
    """The URL of a server that accepts connections (in the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/retrieve"


def down_warnings(caplog: pytest.LogCaptureFixture, url: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and url in r.getMessage() and "is down" in r.getMessage()]


def back_warnings(caplog: pytest.LogCaptureFixture, url: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and url in r.getMessage() and "answers again" in r.getMessage()]


# --- URLs ------------------------------------------------------------------------------------------


def test_one_url_a_comma_separated_string_or_a_list() -> None:
    assert replica_urls("http://h:1") == ["http://h:1/retrieve"]
    assert replica_urls(" http://h:1/retrieve , http://h:2 ") == ["http://h:1/retrieve", "http://h:2/retrieve"]
    assert replica_urls(["http://h:1", "https://h:2/search"]) == ["http://h:1/retrieve", "https://h:2/search"]
    remote = RemoteSource("http://h:1,http://h:2")
    assert remote.urls == ("http://h:1/retrieve", "http://h:2/retrieve")
    assert remote.url == "http://h:1/retrieve,http://h:2/retrieve"
    assert list(remote.replica_status()) == list(remote.urls)
    remote.close()


@pytest.mark.parametrize(
    "urls, message",
    [("", "at least one server URL"), ([], "at least one server URL"), ("http://h:1,h:2", "http"),
     ("http://h:1,http://h:1/retrieve", "repeat http://h:1/retrieve"), ([b"http://h:1"], "list of URLs")],
)
def test_bad_replica_lists_are_refused(urls, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RemoteSource(urls)


def test_bad_cooldown_is_refused() -> None:
    with pytest.raises(ValueError, match="cooldown_s"):
        RemoteSource("http://h:1", cooldown_s=-1)


# --- spreading and failover ------------------------------------------------------------------------


def test_requests_take_turns_over_the_replicas(replicas) -> None:
    (server_a, source_a), (server_b, source_b) = replicas
    remote = RemoteSource([server_a.url, server_b.url], max_in_flight=1)
    try:
        for i in range(6):
            assert remote.search([f"q{i}"], 2) == [[expected_passage(f"q{i}", r, 2) for r in range(2)]]
        status = remote.replica_status()
    finally:
        remote.close()
    assert len(source_a.calls) == len(source_b.calls) == 3  # one request at a time: strict turns
    assert [s.requests for s in status.values()] == [3, 3]
    assert not any(s.failures or s.down for s in status.values())


def test_a_stopped_replica_is_skipped_said_once_and_counted(replicas, caplog: pytest.LogCaptureFixture) -> None:
    (server_a, source_a), (server_b, source_b) = replicas
    url_a, url_b = server_a.retrieve_url, server_b.retrieve_url
    remote = RemoteSource([url_a, url_b], max_in_flight=1, cooldown_s=WAIT_S * 10)
    try:
        for i in range(2):
            remote.search([f"before {i}"], 1)
        assert source_a.calls and source_b.calls
        server_a.stop()
        calls_a = len(source_a.calls)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            got = [remote.search([f"after {i}"], 1) for i in range(6)]
        status = remote.replica_status()
    finally:
        remote.close()
    assert got == [[[expected_passage(f"after {i}", 0, 1)]] for i in range(6)]
    assert len(source_a.calls) == calls_a
    assert [q for call in source_b.calls for q in call][-6:] == [f"after {i}" for i in range(6)]
    # One failed attempt, then skipped for the whole (long) cool-down; said once.
    assert (status[url_a].failures, status[url_a].down) == (1, True)
    assert "cannot reach the server" in status[url_a].last_problem
    assert (status[url_b].failures, status[url_b].down) == (0, False)
    assert len(down_warnings(caplog, url_a)) == 1 and "1 of 2 replica(s) up" in down_warnings(caplog, url_a)[0]
    assert not down_warnings(caplog, url_b)


def test_a_failing_replica_fails_over_within_the_call(replicas, caplog: pytest.LogCaptureFixture) -> None:
    """HTTP 500 from one replica: the same call is answered by the other, with no retry round."""
    (server_a, source_a), (server_b, _) = replicas
    remote = RemoteSource([server_a.url, server_b.url], retries=0)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            source_a.fail = True
            assert remote.search(["q"], 1) == [[expected_passage("q", 0, 1)]]  # A first (its turn), then B
        status = remote.replica_status()
    finally:
        remote.close()
    assert status[server_a.retrieve_url].failures == 1
    assert status[server_a.retrieve_url].last_problem.startswith("HTTP 500")
    assert len(down_warnings(caplog, server_a.retrieve_url)) == 1


def test_a_hung_replica_costs_its_share_of_the_deadline_not_all_of_it(replicas, hung_url: str) -> None:
    _, (server_b, _) = replicas
    remote = RemoteSource([hung_url, server_b.url], timeout_s=2.0, retries=0, cooldown_s=WAIT_S * 10)
    try:
        assert remote.search(["q"], 1) == [[expected_passage("q", 0, 1)]]  # the hung one's turn comes first
        status = remote.replica_status()
    finally:
        remote.close()
    assert status[hung_url].down and status[hung_url].last_problem.startswith("no reply within")
    assert status[server_b.retrieve_url].requests == 1


def test_with_every_replica_down_a_hung_one_still_gets_only_its_share(scripted, hung_url: str) -> None:  # noqa: F811 - a fixture
    """Round one: the hung replica times out, the other answers 500; both are down. Round two tries
    both again, and the hung one must leave the other the time to answer."""
    url, seen = scripted([(500, b'{"detail": "warming up"}', 0.0), (200, good_reply, 0.0)])
    remote = RemoteSource([hung_url, url], timeout_s=3.0, retries=1, backoff_s=0.01, cooldown_s=WAIT_S * 10)
    try:
        assert [p.id for p in remote.search(["q"], 1)[0]] == ["q-0"]
        status = remote.replica_status()
    finally:
        remote.close()
    assert len(seen) == 2
    assert (status[hung_url].requests, status[hung_url].failures, status[hung_url].down) == (2, 2, True)
    assert (status[url].failures, status[url].down) == (1, False)


def test_every_replica_down_is_a_source_error_within_the_deadline(hung_url: str) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/retrieve"
    timeout_s = 1.0
    remote = RemoteSource([dead, hung_url], timeout_s=timeout_s, retries=5, backoff_s=0.01)
    started = time.monotonic()
    try:
        with pytest.raises(SourceError) as raised:
            remote.search(["q"], 1)
        elapsed = time.monotonic() - started
        status = remote.replica_status()
    finally:
        remote.close()
    assert elapsed < timeout_s + WAIT_S  # a bound (a hang fails here), not a timing verdict
    assert "no reply within 1 s" in str(raised.value)  # the hung one held the call to its deadline
    assert status[dead].failures >= 1 and status[dead].down


def test_every_replica_refusing_names_each_problem() -> None:
    dead = [f"http://127.0.0.1:{closed_port()}/retrieve" for _ in range(2)]
    remote = RemoteSource(dead, retries=1, backoff_s=0.01, timeout_s=WAIT_S)
    try:
        with pytest.raises(SourceError, match="no replica answered") as raised:
            remote.search(["q"], 1)
    finally:
        remote.close()
    assert all(f"{url}: cannot reach the server" in str(raised.value) for url in dead)
    assert remote.requests_sent == 4  # two rounds (retries=1) over both replicas


def test_a_rejected_request_is_not_sent_to_another_replica(replicas) -> None:
    """A 4xx says the request itself is wrong: another replica would refuse it too."""
    (server_a, source_a), (server_b, source_b) = replicas
    remote = RemoteSource([server_a.url, server_b.url])
    try:
        with pytest.raises(SourceError, match="HTTP 413"):
            remote.search(["x" * 100_000], 1)  # over the server's query length limit
        status = remote.replica_status()
    finally:
        remote.close()
    assert [s.requests for s in status.values()] == [1, 0]
    assert not source_a.calls and not source_b.calls and not status[server_a.retrieve_url].down


def test_a_replica_that_comes_back_is_used_again_after_its_cooldown(replicas, caplog: pytest.LogCaptureFixture) -> None:
    (server_a, source_a), (server_b, _) = replicas
    url_a = server_a.retrieve_url
    cooldown_s = 0.5
    remote = RemoteSource([url_a, server_b.url], max_in_flight=1, cooldown_s=cooldown_s)
    port_a = server_a.port
    try:
        server_a.stop()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            remote.search(["down"], 1)  # A's turn: fails over to B and marks A down
            assert remote.replica_status()[url_a].down
            with RetrievalServer(source_a, port=port_a) as restarted:
                assert restarted.retrieve_url == url_a
                marked_down_at = time.monotonic()
                time.sleep(cooldown_s)  # the cool-down has passed once this returns (monotonic clock)
                assert time.monotonic() - marked_down_at >= cooldown_s
                calls_a = len(source_a.calls)
                for i in range(2):  # A is up again for the round robin: one of two requests is its
                    assert remote.search([f"back {i}"], 1) == [[expected_passage(f"back {i}", 0, 1)]]
                status = remote.replica_status()
    finally:
        remote.close()
    assert len(source_a.calls) == calls_a + 1
    assert not status[url_a].down and status[url_a].failures == 1
    assert len(down_warnings(caplog, url_a)) == 1 and len(back_warnings(caplog, url_a)) == 1


def test_concurrent_callers_all_get_answers_while_a_replica_dies(replicas) -> None:
    (server_a, _), (server_b, _) = replicas
    remote = RemoteSource([server_a.url, server_b.url], max_batch=3, timeout_s=WAIT_S)
    errors: list[BaseException] = []
    halfway = threading.Barrier(9)

    def worker(t: int) -> None:
        try:
            for j in range(6):
                if j == 3:
                    halfway.wait(WAIT_S)
                queries = [f"t{t} j{j}"]
                assert remote.search(queries, 1) == [[expected_passage(queries[0], 0, 1)]]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    try:
        for thread in threads:
            thread.start()
        halfway.wait(WAIT_S)  # every worker has had three answers; none asks more until A is gone
        server_a.stop()
        for thread in threads:
            thread.join(WAIT_S)
    finally:
        remote.close()
    assert not errors
    assert not any(thread.is_alive() for thread in threads)


# --- a real process killed ------------------------------------------------------------------------


def start_server_process(tmp_path: Path, processes: list[subprocess.Popen]) -> str:
    """``python -m search_env.server`` over the synthetic world's news source, once it answers /health."""
    import json
    import urllib.request

    port = closed_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "search_env.server", "--synthetic", "--synthetic-source", "news", "--port", str(port),
         "--log-level", "warning"], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
    )
    processes.append(process)  # the caller stops it, whatever happens here
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited with {process.returncode}: {process.stderr.read().decode()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0) as reply:
                if json.load(reply)["status"] == "ok":
                    return f"{url}/retrieve"
        except OSError:  # refused while starting, 503 while building
            time.sleep(0.1)
    raise AssertionError("the server did not become ready within 60 s")


@pytest.mark.slow
def test_a_killed_server_process_is_failed_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    processes: list[subprocess.Popen] = []
    try:
        urls = [start_server_process(tmp_path, processes) for _ in range(2)]
        remote = RemoteSource(urls, max_in_flight=1, cooldown_s=WAIT_S * 10)
        try:
            before = [remote.search([f"company founded {i}"], 2) for i in range(2)]
            assert all(len(rows[0]) == 2 for rows in before)
            processes[0].send_signal(signal.SIGKILL)
            processes[0].wait(WAIT_S)
            with caplog.at_level(logging.WARNING, logger=LOGGER):
                after = [remote.search([f"company founded {i}"], 2) for i in range(4)]
            status = remote.replica_status()
        finally:
            remote.close()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(WAIT_S)
    assert after[:2] == before  # the same index answers through the survivor
    assert status[urls[0]].down and status[urls[0]].failures == 1
    assert status[urls[1]].requests == 1 + 4
    assert len(down_warnings(caplog, urls[0])) == 1
