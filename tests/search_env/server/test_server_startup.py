"""The retrieval server answers while its index is being built: ``/health`` and ``/retrieve`` say 503
"building" until the source is ready, then serve; a failed build is reported (and stops the CLI).

The build is a function blocked on an Event the test opens, so no step depends on timing; servers run
over loopback on background threads (the CLI in a subprocess) and every wait is bounded.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import pytest

from search_env.sources.base import Passage, Source, SourceError
from tests.conftest import REPO_ROOT, CountingSource, skip_without

skip_without("server", "starlette", "pydantic", "uvicorn", "requests")
import requests  # noqa: E402

from search_env.server import RetrievalServer, serve  # noqa: E402
from search_env.server.app import RETRY_AFTER_S  # noqa: E402
from search_env.server.readiness import SourceBuild, SourceBuildFailed  # noqa: E402
from search_env.sources.remote import RemoteSource  # noqa: E402

WAIT_S = 10.0


def gated_build(gate: threading.Event, source: Source | None = None, error: Exception | None = None) -> Callable[[], Source]:
    """A build that waits for ``gate``, then returns ``source`` or raises ``error``."""

    def build() -> Source:
        assert gate.wait(WAIT_S), "test gate never opened"
        if error is not None:
            raise error
        assert source is not None
        return source

    return build


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # a test that failed half-way leaves no build thread waiting


def health(server: RetrievalServer) -> requests.Response:
    return requests.get(f"{server.url}/health", timeout=WAIT_S)


def retrieve(server: RetrievalServer, queries: list[str]) -> requests.Response:
    return requests.post(server.retrieve_url, json={"queries": queries, "topk": 1, "return_scores": True}, timeout=WAIT_S)


def test_health_and_retrieve_say_building_then_the_source_serves(gate: threading.Event) -> None:
    source = CountingSource("wiki")
    build = SourceBuild(gated_build(gate, source), name="wiki")
    with RetrievalServer(build) as server:
        reply = health(server)
        assert reply.status_code == 503
        state = reply.json()
        assert (state["status"], state["source"]) == ("building", "wiki") and state["seconds"] >= 0
        refused = retrieve(server, ["q"])
        assert refused.status_code == 503 and refused.headers["Retry-After"] == str(RETRY_AFTER_S)
        assert "source 'wiki' is still being built" in refused.json()["detail"]
        assert source.calls == []

        gate.set()
        assert build.wait(WAIT_S)
        ready = health(server)
        assert ready.status_code == 200 and ready.json()["status"] == "ok" and ready.json()["source"] == "wiki"
        answered = retrieve(server, ["capital"])
        assert answered.status_code == 200
        assert answered.json()["result"][0][0]["document"]["id"] == "capital-0"
    assert source.calls == [["capital"]]


def test_a_failed_build_is_reported_by_health_and_retrieve(gate: threading.Event) -> None:
    build = SourceBuild(gated_build(gate, error=ValueError("the corpus file has no passages")), name="wiki")
    with RetrievalServer(build) as server:
        gate.set()
        assert build.wait(WAIT_S)
        reply = health(server)
        assert reply.status_code == 503
        assert reply.json() == {"status": "failed", "source": "wiki", "seconds": reply.json()["seconds"],
                                "error": "ValueError: the corpus file has no passages"}
        refused = retrieve(server, ["q"])
        assert refused.status_code == 503
        assert refused.json()["detail"] == "building source 'wiki' failed: ValueError: the corpus file has no passages"


def test_a_client_of_a_building_server_gets_a_source_error_and_replicas_cover_for_it(gate: threading.Event) -> None:
    building = SourceBuild(gated_build(gate, CountingSource("wiki")), name="wiki")
    ready = CountingSource("wiki")
    with RetrievalServer(building) as server_building, RetrievalServer(ready) as server_ready:
        alone = RemoteSource(server_building.url, retries=0)
        pair = RemoteSource([server_building.url, server_ready.url], retries=0)
        try:
            with pytest.raises(SourceError, match=r"HTTP 503: source 'wiki' is still being built"):
                alone.search(["q"], 1)
            assert pair.search(["q"], 1) == [[Passage("q-0", "T0 q", "text 0 about q", 1.0)]]
            assert pair.replica_status()[server_building.retrieve_url].down
        finally:
            alone.close()
            pair.close()
    assert ready.calls == [["q"]]


def test_searching_the_build_itself_before_it_is_ready_is_a_source_error(gate: threading.Event) -> None:
    build = SourceBuild(gated_build(gate, CountingSource("wiki")), name="wiki")
    with pytest.raises(SourceError, match="still being built"):
        build.search(["q"], 1)
    build.start()
    build.start()  # a second start does nothing (the app starts a build its caller already started)
    gate.set()
    assert build.wait(WAIT_S) and build.state == "ready"
    assert build.search(["q"], 1)[0][0].id == "q-0"


def test_serve_stops_and_raises_when_the_build_fails() -> None:
    def unreadable() -> Source:
        raise OSError("index folder unreadable")

    build = SourceBuild(unreadable, name="wiki")
    with pytest.raises(SourceBuildFailed, match="^building source 'wiki' failed: OSError: index folder unreadable$"):
        serve(build, port=0, log_level="warning")


def test_the_cli_exits_with_an_error_when_its_index_cannot_be_built(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "search_env.server", "--corpus", str(tmp_path / "missing.jsonl"), "--port", "0",
         "--log-level", "warning"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: building source 'wiki' failed: FileNotFoundError")
