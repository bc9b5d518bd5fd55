"""Retrieval record and replay through ``python -m benchmarks.evaluate``: a replay gives the recorded
run's episodes without building an index, a search the file lacks stops the run in one line (or is
searched live and added), and real HotpotQA questions run over BM25 on the shared corpus."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.evaluate import main
from search_env.sources.bm25 import BM25Source
from tests.benchmarks.test_evaluate_harness import _episodes, _without_timing
from tests.conftest import skip_without


def _refuse_indexing(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, building any BM25 index fails the test."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a BM25 index was built during a replay")

    monkeypatch.setattr(BM25Source, "__init__", refuse)


def _searches(path: Path) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, path.read_text(encoding="utf-8").splitlines()) if line["kind"] == "search"]


def test_a_replay_plays_the_recorded_episodes_again_without_building_an_index(
        real_format: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    questions, corpus = real_format
    recording = tmp_path / "searches.jsonl"
    common = ["--dataset", "synthetic", str(questions), "--protocols", "search-r1", "reasoning-search",
              "--agents", "oracle", "retrieve-then-answer", "--episodes", "2"]
    recorded = main([*common, "--corpus", str(corpus), "--record-retrieval", str(recording), "--output-dir", str(tmp_path / "a")])
    assert {line["source"] for line in _searches(recording)} == {0, 1, 2, 3}  # the world's sources and the corpus
    expected = [_without_timing(e) for e in _episodes(tmp_path / "a")]

    _refuse_indexing(monkeypatch)
    # no retriever flags: the recording's corpus configuration; then a corpus path that does not exist here
    for folder, flags in (("b", []), ("c", ["--corpus", str(tmp_path / "elsewhere" / "corpus.jsonl")])):
        replayed = main([*common, *flags, "--replay-retrieval", str(recording), "--output-dir", str(tmp_path / folder)])
        assert [_without_timing(e) for e in _episodes(tmp_path / folder)] == expected
        assert [(r["em"], r["f1"], r["reward"], r["searches"]) for r in replayed] == \
            [(r["em"], r["f1"], r["reward"], r["searches"]) for r in recorded]
        assert replayed[-1]["retriever"] == f"BM25, replayed from {recording}"


def test_a_search_missing_from_the_replay_stops_the_run_or_is_searched_live(
        real_format: tuple[Path, Path], tmp_path: Path) -> None:
    questions, corpus = real_format
    recording, out = tmp_path / "searches.jsonl", tmp_path / "run"
    common = ["--dataset", str(questions), "--protocols", "search-r1", "--agents", "retrieve-then-answer", "--batch-size", "1"]
    main([*common, "--episodes", "1", "--corpus", str(corpus), "--record-retrieval", str(recording)])
    assert len(_searches(recording)) == 1

    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--episodes", "2", "--replay-retrieval", str(recording), "--output-dir", str(out)])
    message = exit_info.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith(f"error: --replay-retrieval {recording} has no search of 'Vessa is the capital of which land'")
    assert "--replay-missing live" in message
    assert [e["example_id"] for e in _episodes(out)] == ["q1"]  # the episode that searched blind was not kept

    table = main([*common, "--episodes", "2", "--replay-retrieval", str(recording), "--replay-missing", "live",
                  "--corpus", str(corpus), "--output-dir", str(out)])
    # the top passage's title: "Zarbo" is right for q1, "Vessa" wrong for q2
    assert [e["example_id"] for e in _episodes(out)] == ["q1", "q2"] and table[0]["em"] == 0.5
    assert [s["query"] for s in _searches(recording)] == ["Which company did Bob Smith found", "Vessa is the capital of which land"]


def test_real_hotpotqa_questions_over_bm25_on_the_shared_corpus_record_and_replay(
        shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recording = tmp_path / "searches.jsonl"
    common = ["--dataset", "hotpotqa", "--data-dir", str(shared_data), "--protocols", "search-r1",
              "--agents", "oracle", "retrieve-then-answer", "--episodes", "3"]
    oracle, retrieve = main([*common, "--corpus", str(shared_data / "corpus.jsonl"), "--record-retrieval", str(recording),
                             "--output-dir", str(tmp_path / "a")])
    # without a gold decomposition the oracle searches each of its two gold passages by title, then answers;
    # retrieve-then-answer searches once
    assert (oracle["em"], oracle["cover_em"], oracle["searches"]) == (1.0, 1.0, 2.0)
    assert retrieve["searches"] == 1.0 and retrieve["retrieved_tokens"] > 0 and 0.0 <= retrieve["gold_recall"] <= 1.0
    assert retrieve["subset"] == "first 3 of 439" and retrieve["corpus"] == str(shared_data / "corpus.jsonl")
    episodes = _episodes(tmp_path / "a")
    assert all(e["tool_calls"][0]["passage_ids"] for e in episodes if e["agent"] == "retrieve-then-answer")

    _refuse_indexing(monkeypatch)
    main([*common, "--replay-retrieval", str(recording), "--output-dir", str(tmp_path / "b")])
    assert [_without_timing(e) for e in _episodes(tmp_path / "b")] == [_without_timing(e) for e in episodes]


def test_real_questions_through_a_retrieval_server_replay_without_it(real_format: tuple[Path, Path], tmp_path: Path) -> None:
    skip_without("server", "starlette", "pydantic", "uvicorn")
    from search_env.server import RetrievalServer

    questions, corpus = real_format
    recording = tmp_path / "searches.jsonl"
    common = ["--dataset", str(questions), "--protocols", "search-r1", "--agents", "retrieve-then-answer"]
    local = main([*common, "--corpus", str(corpus), "--output-dir", str(tmp_path / "local")])
    with RetrievalServer(BM25Source(corpus, name="wiki")) as server:
        remote = main([*common, "--retrieval-url", server.url, "--record-retrieval", str(recording),
                       "--output-dir", str(tmp_path / "remote")])
    assert remote[0]["retriever"] == "retrieval server" and remote[0]["corpus"] == server.url
    replayed = main([*common, "--replay-retrieval", str(recording), "--output-dir", str(tmp_path / "replayed")])
    assert replayed[0]["retriever"] == f"retrieval server, replayed from {recording}"
    for folder in ("remote", "replayed"):  # the server's BM25 is the local one
        assert [_without_timing(e) for e in _episodes(tmp_path / folder)] == [_without_timing(e) for e in _episodes(tmp_path / "local")]
    assert local[0]["em"] == remote[0]["em"] == replayed[0]["em"] == 0.5


@pytest.mark.slow  # the default encoder loads (and converts) in tens of seconds on two busy cores
def test_dense_retrieval_over_the_corpus(real_format: tuple[Path, Path], tmp_path: Path) -> None:
    skip_without("dense", "faiss", "torch", "transformers")
    questions, corpus = real_format
    (row,) = main(["--dataset", str(questions), "--corpus", str(corpus), "--retriever", "dense", "--protocols", "search-r1",
                   "--agents", "retrieve-then-answer", "--top-k", "2", "--output-dir", str(tmp_path / "run")])
    assert row["retriever"] == "dense (default encoder, flat index)" and row["top_k"] == 2
    assert row["searches"] == 1.0 and row["retrieved_tokens"] > 0
    assert all(len(e["tool_calls"][0]["passage_ids"]) == 2 for e in _episodes(tmp_path / "run"))


def test_a_retriever_a_module_registers_searches_the_corpus(real_format: tuple[Path, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import importlib
    import sys

    module_name = "tests.search_env.sources.user_retriever"
    if module_name in sys.modules:
        sys.modules[module_name].forget()
    questions, corpus = real_format
    common = ["--dataset", str(questions), "--corpus", str(corpus), "--protocols", "search-r1", "--agents",
              "retrieve-then-answer", "--top-k", "1", "--retriever", "word-overlap"]
    try:
        with pytest.raises(SystemExit):
            main([*common, "--output-dir", str(tmp_path / "refused")])  # not imported: not known
        assert "error: --retriever: unknown retriever 'word-overlap'; known: bm25, dense" in capsys.readouterr().err
        (row,) = main([*common, "--import", module_name, "--output-dir", str(tmp_path / "run")])
        module = importlib.import_module(module_name)
        assert [(str(built), options.name) for built, options in module.BUILT] == [(str(corpus), "wiki")]
        assert row["retriever"] == "word-overlap" and row["searches"] == 1.0
    finally:
        if module_name in sys.modules:
            sys.modules[module_name].forget()


# --- the corpus and the agent by their content --------------------------------------------------------


@pytest.fixture
def digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A digest cache of the test's own."""
    from benchmarks.evaluation import digests

    monkeypatch.setattr(digests, "DIGEST_CACHE", tmp_path / "digests.json")
    return tmp_path / "digests.json"


def _other_corpus(corpus: Path, folder: Path) -> Path:
    """A corpus with ``corpus``'s file name and another passage."""
    folder.mkdir()
    other = folder / corpus.name
    other.write_text(corpus.read_text(encoding="utf-8").replace("Bob Smith", "Ann Lee"), encoding="utf-8")
    return other


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def test_a_recording_made_against_another_corpus_of_the_same_name_is_refused(
        real_format: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], digest_cache: Path) -> None:
    questions, corpus = real_format
    recording = tmp_path / "searches.jsonl"
    common = ["--dataset", str(questions), "--protocols", "search-r1", "--agents", "retrieve-then-answer"]
    main([*common, "--corpus", str(corpus), "--record-retrieval", str(recording)])
    other = _other_corpus(corpus, tmp_path / "other")
    err = _refused([*common, "--corpus", str(other), "--replay-retrieval", str(recording)], capsys)
    assert err.startswith(f"error: --replay-retrieval {recording} was recorded against another corpus.jsonl (content sha256 ")
    assert f"--corpus {other} is " in err and "give the corpus it was recorded with, or record again" in err
    main([*common, "--corpus", str(corpus), "--replay-retrieval", str(recording)])  # the same content replays
    assert len(json.loads(digest_cache.read_text(encoding="utf-8"))) == 2  # each corpus read once, its digest kept


def test_resuming_an_output_folder_with_another_corpus_of_the_same_name_is_refused(
        real_format: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], digest_cache: Path) -> None:
    questions, corpus = real_format
    out = tmp_path / "run"
    common = ["--dataset", str(questions), "--protocols", "search-r1", "--agents", "retrieve-then-answer", "--output-dir", str(out)]
    main([*common, "--corpus", str(corpus), "--episodes", "1"])
    err = _refused([*common, "--corpus", str(_other_corpus(corpus, tmp_path / "other")), "--episodes", "2"], capsys)
    assert err.startswith(f"error: {out} holds a run with retrieval=") and "'corpus_sha256'" in err
    assert [e["example_id"] for e in _episodes(out)] == ["q1"]  # nothing of the other corpus was mixed in


def test_the_empty_probe_answers_every_search_with_nothing_and_a_resume_must_keep_it(real_format, tmp_path, capsys):
    """--probe empty: the same searches are made, none returns a passage, and an output folder played with the
    probe is not resumed without it (its episodes would mix two retrievals)."""
    questions, corpus = real_format
    out = tmp_path / "probed"
    argv = ["--dataset", str(questions), "--corpus", str(corpus), "--protocols", "search-r1",
            "--agents", "retrieve-then-answer", "--output-dir", str(out)]
    (live,) = main(argv[:-2] + ["--output-dir", str(tmp_path / "live")])
    (probed,) = main(argv + ["--probe", "empty"])
    assert probed["searches"] == live["searches"] > 0
    assert probed["retrieved_tokens"] < live["retrieved_tokens"]  # the result tags alone
    calls = [call for episode in _episodes(out) for call in episode["tool_calls"]]
    assert calls and all(call["passage_ids"] == [] for call in calls)
    assert any(call["passage_ids"] for episode in _episodes(tmp_path / "live") for call in episode["tool_calls"])
    with pytest.raises(SystemExit):
        main(argv)
    assert "probe" in capsys.readouterr().err
