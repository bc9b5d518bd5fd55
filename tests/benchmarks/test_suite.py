"""The performance suite: ratios and spreads computed as stated, a failing or skipped benchmark reported with
its reason while the others run, and a --quick run whose report has the promised structure."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from benchmarks import suite
from benchmarks.common.perf_report import Comparison, Measure, Section, format_markdown, report_dict

MACHINE = {"cpu": "Test CPU", "cores": 2, "usable_cores": 2, "load_average": [1.0, 1.0, 1.0], "memory_bytes": 2**33, "gpus": [],
           "python": "3.x", "torch": None, "commit": None}


def test_a_ratio_says_how_many_times_better_ours_is_whatever_the_unit() -> None:
    time_ours, time_peer = Measure("step", "s", [1.0, 3.0, 2.0], True), Measure("step", "s", [4.0, 5.0, 6.0], True)
    assert (time_ours.median, time_ours.as_dict()["min"], time_ours.as_dict()["max"], time_ours.as_dict()["runs"]) == (2.0, 1.0, 3.0, 3)
    assert Comparison("step", time_ours, time_peer, "peer").advantage == 2.5  # 5 s / 2 s: ours 2.5x faster
    rate_ours, rate_peer = Measure("qps", "queries/s", [100.0], False), Measure("qps", "queries/s", [40.0], False)
    assert Comparison("qps", rate_ours, rate_peer, "peer").advantage == 2.5  # 100 / 40
    with pytest.raises(ValueError, match="no values"):
        Measure("empty", "s", [], True)


def test_the_markdown_report_lists_ratios_figures_and_every_skip_and_failure_with_its_reason() -> None:
    ok = Section("fast", "A fast one.", seconds=1.5, measures=[Measure("step", "s", [0.5, 0.25, 1.0], True)])
    ok.comparisons = [Comparison("step", ok.measures[0], Measure("step", "s", [1.0], True), "the peer")]
    slow = Section("slow", "A slow one.", measures=[Measure("turn", "µs", [10.0], True), Measure("rate", "q/s", [50.0], False)])
    slow.comparisons = [Comparison("turn", slow.measures[0], Measure("turn", "µs", [8.0], True), "GEM"),
                        Comparison("rate", slow.measures[1], Measure("rate", "q/s", [100.0], False), "server")]
    sections = [ok, slow, Section("heavy", "A heavy one.", status="skipped", reason="quick mode: minutes"),
                Section("broken", "A broken one.", status="failed", reason="RuntimeError: no")]
    report = report_dict(sections, MACHINE, quick=True, seconds=3.0, not_in_suite={"slow_one": "not speed"})
    assert [c["advantage"] for c in report["comparisons"]] == [2.0, 0.8, 0.5] and report["comparisons"][0]["benchmark"] == "fast"
    text = format_markdown(report)
    assert "quick mode, 3 s in all; machine: Test CPU, 2 of 2 cores usable, 8 GiB, no GPU; load average 1.00 1.00 1.00" in text
    assert "| fast | step | s | 0.5 | the peer | 1 | 2.00x faster |" in text
    assert "| step | s | 0.5 | 0.25 | 1 | 3 |" in text
    assert "| slow | turn | µs | 10.0 | GEM | 8 | 1.25x slower |" in text and "| slow | rate | q/s | 50.0 | server | 100.0 | 2.00x lower |" in text
    assert "## heavy (skipped: quick mode: minutes)" in text and "## broken (failed: RuntimeError: no)" in text
    assert "- slow_one: not speed" in text


def test_a_failing_benchmark_is_reported_in_one_line_and_the_others_still_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    def fails(options: suite.Options, section: Section) -> None:
        section.measures.append(Measure("before the failure", "s", [1.0], True))
        raise RuntimeError("the server\nwent away")

    def exits(options: suite.Options, section: Section) -> None:
        raise SystemExit("zero3 failed:\ntraceback")

    def skips(options: suite.Options, section: Section) -> None:
        raise suite.Skipped("not here")

    def works(options: suite.Options, section: Section) -> None:
        section.measures.append(Measure("fine", "ms", [2.0, 4.0], True))

    monkeypatch.setattr(suite, "BENCHMARKS", {"a": ("A.", fails), "b": ("B.", exits), "c": ("C.", skips), "d": ("D.", works)})
    assert suite.main(["--output-dir", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    by_name = {b["name"]: b for b in report["benchmarks"]}
    assert [b["name"] for b in report["benchmarks"]] == ["a", "b", "c", "d"]
    assert (by_name["a"]["status"], by_name["a"]["reason"]) == ("failed", "RuntimeError: the server went away")
    assert by_name["a"]["measures"][0]["name"] == "before the failure"  # kept
    assert (by_name["b"]["status"], by_name["b"]["reason"]) == ("failed", "SystemExit: zero3 failed: traceback")
    assert (by_name["c"]["status"], by_name["c"]["reason"]) == ("skipped", "not here")
    assert by_name["d"]["status"] == "ok" and by_name["d"]["measures"][0]["median"] == 3.0
    assert "failed: a, b" in capsys.readouterr().out


def test_the_report_goes_into_the_generated_section_of_a_results_file_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def works(options: suite.Options, section: Section) -> None:
        section.measures.append(Measure("fine", "ms", [2.0, 4.0], True))

    monkeypatch.setattr(suite, "BENCHMARKS", {"d": ("D.", works)})
    results = tmp_path / "RESULTS.md"
    history = "# Benchmark results\n\nHand-written history.\n"
    results.write_text(history, encoding="utf-8")
    assert suite.main(["--output-dir", str(tmp_path / "plain")]) == 0
    assert results.read_text(encoding="utf-8") == history  # off by default
    with open(tmp_path / "plain" / "report.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["benchmark"], r["name"], r["unit"], r["median"], r["values"], r["runs"]) for r in rows] == [("d", "fine", "ms", "3.0", "2.0 4.0", "2")]

    argv = ["--output-dir", str(tmp_path / "out"), "--results-md", str(results)]
    for _ in range(2):  # the second run replaces the section the first one added
        assert suite.main(argv) == 0
        text = results.read_text(encoding="utf-8")
        assert text.startswith(history + "\n<!-- generated section suite: begin") and text.count("generated section suite: begin") == 1
        assert text.endswith("\n<!-- generated section suite: end -->\n")
        section = text[len(history):]
        assert "\n## Performance report\n\nGenerated " in section and f"by `python -m benchmarks.suite {' '.join(argv)}`; machine: " in section
        assert "\n### d (" in section and "| fine | ms | 3 | 2 | 4 | 2 |" in section
        assert not [line for line in section.splitlines() if line.startswith("# ")]  # a section of the file, not a title
    assert f"the generated section 'suite' of {results} now holds this report" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        suite.main(["--results-md", str(tmp_path / "missing" / "RESULTS.md")])
    assert exit_info.value.code == 2 and "--results-md: no folder" in capsys.readouterr().err


#: A server that accepts connections and never answers: a health check times out reading.
SILENT_SERVER = """
import socket, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
listener = socket.socket()
listener.bind(("127.0.0.1", port))
listener.listen()
held = []
while True:
    held.append(listener.accept()[0])
"""


def test_a_server_whose_start_fails_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("requests")
    from benchmarks import retrieval_throughput

    (tmp_path / "silent_server.py").write_text(SILENT_SERVER)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    started = []
    popen = retrieval_throughput.subprocess.Popen

    def record(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(retrieval_throughput.subprocess, "Popen", record)
    with pytest.raises(TimeoutError, match="did not start within"):  # a server that never answers /health
        suite._server_class()([], 3.0, module="silent_server")
    (process,) = started
    assert process.poll() is not None  # stopped, not left running


def test_quick_runs_every_benchmark_or_says_why_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus, questions = tmp_path / "corpus.jsonl", tmp_path / "questions.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "title": f"Town {i}", "text": f"Town {i} lies on river {i % 7}."}) + "\n"
                              for i in range(60)))
    questions.write_text("".join(json.dumps({"question": f"Which river does town {i} lie on?"}) + "\n" for i in range(20)))
    out = tmp_path / "out"
    code = suite.main(["--quick", "--corpus", str(corpus), "--questions", str(questions), "--index-dir", str(tmp_path / "index"),
                       "--policy-cache", str(tmp_path / "cache"), "--output-dir", str(out)])
    report = json.loads((out / "report.json").read_text())
    failed = {b["name"]: b["reason"] for b in report["benchmarks"] if b["status"] == "failed"}
    assert code == 0 and not failed, failed
    assert [b["name"] for b in report["benchmarks"]] == list(suite.BENCHMARKS)
    assert report["quick"] is True and report["machine"]["cores"] >= 1 and len(report["machine"]["load_average"]) == 3
    for name in ("cpu", "memory_bytes", "python", "torch", "gpus"):
        assert name in report["machine"]
    by_name = {b["name"]: b for b in report["benchmarks"]}
    for name in ("rollout_overhead", "data_parallel", "rollout_throughput"):
        assert by_name[name]["status"] == "skipped" and "quick mode" in by_name[name]["reason"]
    gem = by_name["gem_answer_turn"]  # ours alone unless GEM's virtualenv is built (then side by side)
    assert gem["status"] in ("ok", "skipped")
    if gem["status"] == "ok" and not gem["comparisons"]:
        assert any(note.startswith("no peer: ") for note in gem["notes"])
    for name in ("env_overhead", "dag_critical_path", "dag_parse_adversarial"):  # core: run on every install
        assert by_name[name]["status"] == "ok", name
    assert len(by_name["env_overhead"]["measures"]) == 6
    for section in report["benchmarks"]:
        assert (section["status"] == "skipped") == bool(section["reason"])
        for m in section["measures"]:
            assert m["min"] <= m["median"] <= m["max"] and m["runs"] == len(m["values"]) >= 1, m["name"]
    gathered = [(c["benchmark"], c["name"]) for c in report["comparisons"]]
    assert gathered == [(s["name"], c["name"]) for s in report["benchmarks"] for c in s["comparisons"]]
    assert ("dag_critical_path", "wall time per DAG") in gathered
    if by_name["grpo_step_vs_trl"]["status"] == "ok":
        assert [c["name"] for c in by_name["grpo_step_vs_trl"]["comparisons"]] == [
            "GRPO step, rollout", "GRPO step, update", "GRPO step, whole step"]
    if by_name["retrieval_throughput"]["status"] == "ok":  # BM25 only in quick mode: no peer
        assert not by_name["retrieval_throughput"]["comparisons"]
        assert {m["name"] for m in by_name["retrieval_throughput"]["measures"]} >= {"bm25: 1/request", "bm25: in-process 1/call"}
    with open(out / "report.csv", encoding="utf-8", newline="") as handle:
        lines = [(row["benchmark"], row["name"], float(row["median"])) for row in csv.DictReader(handle)]
    assert lines == [(s["name"], m["name"], m["median"]) for s in report["benchmarks"] for m in s["measures"]]
    text = (out / "report.md").read_text()
    assert text.startswith("# Performance report\n") and "## Ratios against peers, measured in this run" in text
    for section in report["benchmarks"]:
        assert f"## {section['name']} (" in text
    assert "## Not in the suite" in text and "report: " in capsys.readouterr().out


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        suite.main(["--help"])
    assert exit_info.value.code == 0 and " ".join(capsys.readouterr().out.split()).count("(default: ") >= 4


def _options(tmp_path: Path) -> suite.Options:
    return suite.Options(False, tmp_path / "corpus.jsonl", tmp_path / "questions.jsonl", tmp_path / "index", tmp_path / "cache")


def test_rollout_throughput_runs_in_the_vllm_virtualenv_when_this_python_lacks_vllm(tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for the virtualenv's interpreter: it records its arguments and prints what the benchmark
    # prints (log lines, a table, then its JSON result).
    python = tmp_path / "vllm-venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    result = {"rows": [{"engine": "hf", "batch": 8, "tokens_per_s": 100.0}, {"engine": "vllm", "batch": 8, "tokens_per_s": 250.0}]}
    python.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'args'}\necho 'starting the engine' >&2\necho 'engine batch'\n"
                      f"echo '{json.dumps(result)}'\n", encoding="utf-8")
    python.chmod(0o755)
    monkeypatch.setenv("SEARCHQA_VLLM_VENV", str(python.parent.parent))
    monkeypatch.setattr(suite.importlib.util, "find_spec", lambda name, *args: None)  # no vLLM in this Python
    section = suite.run_section("rollout_throughput", _options(tmp_path))
    assert section.status == "ok", section.reason
    assert (tmp_path / "args").read_text().split() == ["-m", "benchmarks.rollout_throughput", "--model", "scripted",
                                                       "--batch-sizes", "8", "64", "--repeats", "3"]
    assert [(m.name, m.median) for m in section.measures] == [("hf, batch 8: agent tokens/s", 100.0),
                                                              ("vllm, batch 8: agent tokens/s", 250.0)]
    assert f"run by the vLLM virtualenv's Python, {python}" in section.notes
    assert "batch 8: vLLM 2.50x the HF sampler's agent tokens/s" in section.notes


def test_rollout_throughput_without_vllm_or_its_virtualenv_is_skipped_saying_how_to_build_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEARCHQA_VLLM_VENV", str(tmp_path / "none"))
    monkeypatch.setattr(suite.importlib.util, "find_spec", lambda name, *args: None)
    section = suite.run_section("rollout_throughput", _options(tmp_path))
    assert section.status == "skipped" and "bash .ci/vllm_venv.sh builds it" in section.reason
