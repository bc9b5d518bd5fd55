"""RecordedSource and RetrievalRecording: what a recording run writes, a replay answers from it without
its retriever, misses are errors (or searched live, once), and a file torn by a kill still reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from search_env import BatchSearchQAEnv, QAExample
from search_env.sources.base import Passage, SourceError
from search_env.sources.recorded import MissingSearchError, RecordedSource, RetrievalRecording
from tests.conftest import CountingSource

CONFIG = {"retriever": "bm25", "corpus": "corpus.jsonl", "source": "wiki"}


def _never() -> CountingSource:
    raise AssertionError("the live source was built, though the recording holds every search")


def _record(path: Path, queries: list[str], k: int = 2) -> list[list[Passage]]:
    live = CountingSource("wiki")
    recording = RetrievalRecording(path)
    results = RecordedSource(recording, CONFIG, name="wiki", live=live, replay=False).search(queries, k)
    recording.close()
    return results


def test_a_replay_answers_what_the_recording_run_got_without_building_the_retriever(tmp_path: Path) -> None:
    path = tmp_path / "searches.jsonl"
    recorded = _record(path, ["who founded zarbo", "capital of norland"])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["source", "search", "search"] and lines[0]["config"] == CONFIG
    assert lines[1]["passages"][0] == {"id": "who founded zarbo-0", "title": "T0 who founded zarbo",
                                       "text": "text 0 about who founded zarbo", "score": 2.0}

    replay = RecordedSource(RetrievalRecording(path, must_exist=True), CONFIG, name="wiki", live=_never)
    assert replay.search(["capital of norland", "who founded zarbo"], 2) == [recorded[1], recorded[0]]
    assert not replay.live_built


def test_a_search_the_recording_lacks_is_an_error_the_caller_can_see(tmp_path: Path) -> None:
    path = tmp_path / "searches.jsonl"
    _record(path, ["who founded zarbo"])
    recording = RetrievalRecording(path)
    replay = RecordedSource(recording, CONFIG, name="wiki")
    for queries, k in ((["who founded zarbo"], 3), (["a new query"], 2)):  # another k is another search
        with pytest.raises(MissingSearchError, match=f"has no search of '{queries[0]}' \\(k={k}\\) by corpus=corpus.jsonl"):
            replay.search(queries, k)
    assert issubclass(MissingSearchError, SourceError)  # so the environment makes it an observation, never a crash
    assert [(m.query, m.k) for m in recording.misses] == [("who founded zarbo", 3), ("a new query", 2)]
    # the same query under another configuration (another corpus) is another search
    other = RecordedSource(recording, {**CONFIG, "corpus": "other.jsonl"}, name="wiki")
    with pytest.raises(MissingSearchError):
        other.search(["who founded zarbo"], 2)


def test_the_environment_turns_a_replay_miss_into_an_error_observation(tmp_path: Path) -> None:
    recording = RetrievalRecording(tmp_path / "empty.jsonl")
    env = BatchSearchQAEnv(1, protocol="search-r1", dataset=[QAExample("q", "Who founded Zarbo?", ["Bob"])],
                           sources=RecordedSource(recording, CONFIG, name="wiki"))
    env.reset(options=[{"index": 0}])
    env.step([env.codec.encode("<search> zarbo </search>")])
    (call,) = env.envs[0].trajectory.tool_calls
    assert "has no search of 'zarbo'" in call.error and len(recording.misses) == 1


def test_a_miss_is_searched_live_once_built_and_added_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "searches.jsonl"
    _record(path, ["known"])
    built: list[CountingSource] = []

    def build() -> CountingSource:
        built.append(CountingSource("wiki"))
        return built[-1]

    replay = RecordedSource(RetrievalRecording(path), CONFIG, name="wiki", live=build)
    assert replay.search(["known"], 2)[0][0].id == "known-0" and not built  # nothing missing: nothing built
    results = replay.search(["new", "known", "new"], 2)
    assert [r[0].id for r in results] == ["new-0", "known-0", "new-0"]
    assert len(built) == 1 and built[0].calls == [["new"]]  # one live call, for the missing query only, once
    replay.search(["other"], 2)
    assert len(built) == 1 and built[0].calls == [["new"], ["other"]]
    assert {line["query"] for line in map(json.loads, path.read_text().splitlines()) if line["kind"] == "search"} == \
        {"known", "new", "other"}


def test_a_recording_run_searches_live_every_time_and_writes_each_search_once(tmp_path: Path) -> None:
    path = tmp_path / "searches.jsonl"
    live = CountingSource("wiki")
    source = RecordedSource(RetrievalRecording(path), CONFIG, name="wiki", live=live, replay=False)
    source.search(["a", "b"], 2)
    source.search(["a"], 2)
    assert live.calls == [["a", "b"], ["a"]]
    assert [line["kind"] for line in map(json.loads, path.read_text().splitlines())] == ["source", "search", "search"]
    source.close()
    with pytest.raises(ValueError, match="needs a live source"):
        RecordedSource(RetrievalRecording(path), CONFIG, name="wiki", replay=False)


def test_a_torn_last_line_is_dropped_and_cut_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "searches.jsonl"
    _record(path, ["a", "b"])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind": "search", "source": 0, "query": "c", "k": 2, "passa')  # killed mid-write
    recording = RetrievalRecording(path)
    assert len(recording) == 2
    RecordedSource(recording, CONFIG, name="wiki", live=CountingSource("wiki"), replay=False).search(["d"], 2)
    recording.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole again
    assert [line.get("query") for line in lines] == [None, "a", "b", "d"]


def test_a_damaged_line_in_the_middle_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "searches.jsonl"
    _record(path, ["a"])
    path.write_text(path.read_text() + "not json\n" + path.read_text().splitlines()[1] + "\n")
    with pytest.raises(ValueError, match=r"searches.jsonl line 3 is not a retrieval record"):
        RetrievalRecording(path)
    with pytest.raises(FileNotFoundError, match="no retrieval recording"):
        RetrievalRecording(tmp_path / "absent.jsonl", must_exist=True)
