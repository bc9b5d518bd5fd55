"""Each benchmark's command line runs with tiny arguments and prints its table, and every command's
``--help`` shows defaults. The figures themselves are the benchmarks' business; here the tables'
deterministic cells (recall on a hand-made corpus, rewards of scripted agents) are checked."""
from __future__ import annotations

import csv
import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

from agents import DialectWriter
from search_env.data.example import QAExample
from tests.conftest import skip_without

CORPUS = [
    {"id": "p1", "title": "Zarbo", "text": "Zarbo is a company founded by Bob Smith."},
    {"id": "p2", "title": "Bob Smith", "text": "Bob Smith married Alice Jones in 1990."},
    {"id": "p3", "title": "Quill", "text": "Quill is a river that crosses Norland."},
    {"id": "p4", "title": "Vessa", "text": "Vessa is the capital city of Norland."},
    {"id": "p5", "title": "Tarn", "text": "Tarn is a village with a stone bridge."},
]


def _row(qid: str, question: str, answer: str, gold: list[str], steps: list[dict] | None = None) -> dict:
    contexts = [{"title": "", "text": "", "is_supporting": True, "corpus_id": pid} for pid in gold]
    return {"id": qid, "question": question, "golden_answers": [answer], "contexts": contexts,
            "metadata": {"question_decomposition": steps} if steps else {}}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A corpus and the three multi-hop sets retrieval_recall reads, small enough to work by hand."""
    def write(name: str, rows: list[dict]) -> None:
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    write("corpus.jsonl", CORPUS)
    write("hotpotqa_dev.jsonl", [_row("h1", "Which company did Bob Smith found?", "Zarbo", ["p1"])])
    write("2wikimultihopqa_dev.jsonl", [_row("w1", "Vessa is the capital of which land?", "Norland", ["p4"])])
    # one search finds only the first hop (no passage says "spouse" or "founder"); the decomposition
    # finds both, the second step with the first step's answer substituted
    write("musique_dev.jsonl", [_row("m1", "Who is the spouse of the Zarbo founder?", "Alice Jones", ["p1", "p2"],
                                     [{"question": "Zarbo >> founded by", "answer": "Bob Smith"},
                                      {"question": "#1 >> married", "answer": "Alice Jones"}])])
    return tmp_path


def _rows(output: str, first_cell: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.startswith(first_cell)]


# --- evaluate --------------------------------------------------------------------------------------


def test_evaluate_prints_rewards_with_their_ranges(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.evaluate import main

    table = main(["--episodes", "3", "--protocols", "search-r1", "r-search", "--agents", "oracle"])
    out = capsys.readouterr().out
    rows = {row[0]: row for row in _rows(out, "search-r1") + _rows(out, "r-search")}
    # the oracle: EM 1 under search-r1 (range [0, 1]); under r-search answer F1 1 + 0.2 + 0.2 for
    # the two well-formed blocks, evidence F1 0 without an evidence model (range [0, 2.4])
    assert rows["search-r1"][1:5] == ["oracle", "1.000", "[0,", "1]"]
    assert rows["r-search"][1:5] == ["oracle", "1.400", "[0,", "2.4]"]
    assert "(3 episodes each, synthetic world seed 0, episode seed 0)" in out
    assert "note: r-search: evidence F1 counted 0: no evidence model was given" in out
    assert [r["reward_range"] for r in table] == [(0.0, 1.0), (0.0, 2.4)]


def test_evaluate_marks_a_reward_without_a_declared_range(capsys: pytest.CaptureFixture[str]) -> None:
    import rewards
    from benchmarks.evaluate import evaluate, print_table

    rewards.register("test-unranged", lambda response, golds, **_: 7.0, replace=True)
    row = evaluate("search-r1", "no-search", 2, reward="test-unranged")
    assert row["reward"] == 7.0 and row["reward_range"] is None
    print_table([row], "data")
    (printed,) = _rows(capsys.readouterr().out, "search-r1")
    assert printed[2:4] == ["7.000", "?"]


class AnswersZarboAgent:
    """A user's agent, loaded as ``module:Class``: answers "Zarbo" without searching."""

    def start(self, example: QAExample) -> None:
        pass

    def next_text(self, writer: DialectWriter, observation_text: str) -> str | None:
        return writer.think("I know it.") + writer.answer("Zarbo")


def test_evaluate_runs_a_dataset_with_a_corpus_and_a_users_agent(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.evaluate import main

    dataset = data_dir / "hotpotqa_dev.jsonl"
    main(["--episodes", "5", "--protocols", "search-r1", "--dataset", str(dataset), "--corpus", str(data_dir / "corpus.jsonl"),
          "--agents", "retrieve-then-answer", f"{__name__}:AnswersZarboAgent"])
    out = capsys.readouterr().out
    rows = _rows(out, "search-r1")
    # retrieve-then-answer searches the question and answers the top title, Zarbo: the gold
    # columns 7-10: searches, failed searches, share of episodes without a search, gold recall
    assert rows[0][:3] == ["search-r1", "retrieve-then-answer", "1.000"] and rows[0][7:11] == ["1.00", "0.00", "0.00", "1.000"]
    assert rows[1][:3] == ["search-r1", f"{__name__}:AnswersZarboAgent", "1.000"] and rows[1][7:10] == ["0.00", "0.00", "1.00"]
    assert f"(1 episodes each, {dataset} searched with BM25 over {data_dir / 'corpus.jsonl'}, episode seed 0)" in out
    assert "synthetic" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "x.jsonl"], "give --dataset and --corpus together"),
        (["--agents", "nobody"], "unknown agent 'nobody'"),
        (["--agents", "no_such_module:Agent"], "cannot load agent 'no_such_module:Agent'"),
        (["--agents", "agents:DialectWriter"], "lacks start and next_text"),
    ],
)
def test_evaluate_refuses_bad_arguments_in_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.evaluate import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# --- the performance benchmarks --------------------------------------------------------------------


def _written(folder: Path, name: str, command: str) -> tuple[list[str], dict, list[dict[str, str]]]:
    """A command's result files: the markdown's lines (its heading and provenance checked), the JSON (its
    command checked) and the CSV's rows."""
    lines = (folder / f"{name}.md").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# ") and lines[2].startswith("Generated ") and f"by `{command}`; machine: " in lines[2]
    saved = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
    assert saved["command"] == command and saved["machine"]["cores"] >= 1 and saved["date"] in lines[2]
    with open(folder / f"{name}.csv", encoding="utf-8", newline="") as handle:
        return lines, saved, list(csv.DictReader(handle))


def _png(path: Path) -> None:
    if importlib.util.find_spec("matplotlib") is not None:  # the core install has none: the PNG is left out
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_env_overhead_prints_every_measure_and_writes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.env_overhead import main

    argv = ["--tokens", "40", "--chunk", "8", "--envs", "2", "--repeats", "2", "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    labels = ("token step, raw env", "token step, via gym.make wrappers", "step closing </answer> (reward)",
              "step closing </search> (BM25 search)", "chunk mode (8 ids/chunk)", "batched, 2 envs x 1 token")
    printed = {}
    for label in labels:
        (line,) = [line for line in out.splitlines() if line.startswith(label)]
        printed[label] = float(line[len(label):].split()[0].replace(",", ""))
        assert printed[label] > 0
    lines, saved, rows = _written(tmp_path, "env_overhead", "python -m benchmarks.env_overhead " + " ".join(argv))
    assert [m["name"] for m in saved["measures"]] == [r["name"] for r in rows] == list(labels)
    for measure, row in zip(saved["measures"], rows):
        assert len(measure["values"]) == measure["runs"] == 2 and measure["median"] == pytest.approx(sum(measure["values"]) / 2)
        assert float(row["median"]) == measure["median"] and measure["median"] == pytest.approx(printed[measure["name"]], rel=0.01, abs=0.01)
    assert saved["settings"]["chunk"] == 8 and saved["measures"][0]["unit"] == "µs" and not saved["measures"][4]["lower_is_better"]
    assert lines[4] == "| name | unit | median | min | max | runs |" and lines[6].startswith("| token step, raw env | µs | ")


def test_dag_critical_path_prints_its_table_and_writes_every_dag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.dag_critical_path import main

    argv = ["--dags", "3", "--min-nodes", "5", "--max-nodes", "6", "--latency", "0.001", "--repeats", "1", "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (everything,) = _rows(out, "all ")
    assert everything[1] == "3"  # every DAG executed and counted
    lines, saved, rows = _written(tmp_path, "dag_critical_path", "python -m benchmarks.dag_critical_path " + " ".join(argv))
    assert [int(r["dag"]) for r in rows] == [d["dag"] for d in saved["dags"]] == [0, 1, 2]
    for dag in saved["dags"]:
        assert 5 <= dag["nodes"] <= 6 and 1 <= dag["depth"] <= dag["nodes"]
        assert dag["bound_ms"] == pytest.approx(dag["depth"] * 1.0)  # 1 ms per search on the critical path
        assert dag["wall_over_bound"] == pytest.approx(dag["wall_ms"] / dag["bound_ms"]) and dag["wall_over_bound"] >= 1
        assert dag["speedup"] == pytest.approx(dag["sequential_ms"] / dag["wall_ms"])
    (summary,) = [row for row in saved["summary"] if row["nodes"] == "all"]
    assert summary["DAGs"] == 3 and summary["max"] == max(d["wall_over_bound"] for d in saved["dags"])
    assert "| nodes | DAGs | depth | wall ms | wall/bound | p90 | max | speed-up | calls/node |" in lines
    assert any(line.startswith("| all | 3 | ") for line in lines)
    _png(tmp_path / "dag_critical_path.png")


def test_dag_parse_adversarial_prints_one_row_per_plan_and_writes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.dag_parse_adversarial import TARGET_MS, adversarial_plans, main

    assert main(["--size", "2000", "--repeats", "1", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    names = [line[:28].strip() for line in out.splitlines()]
    plans = adversarial_plans(2000)
    assert all(names.count(name) == 1 for name in plans)
    lines, saved, rows = _written(tmp_path, "dag_parse_adversarial",
                                  f"python -m benchmarks.dag_parse_adversarial --size 2000 --repeats 1 --output-dir {tmp_path}")
    assert [r["plan"] for r in rows] == [p["plan"] for p in saved["plans"]] == list(plans)
    for row in saved["plans"]:
        assert row["chars"] == len(plans[row["plan"]]) and row["min_ms"] == row["median_ms"] == row["max_ms"]  # one run
    assert saved["over_target"] == sum(row["median_ms"] >= TARGET_MS for row in saved["plans"])
    assert f"| one huge query | {len(plans['one huge query'])} | 4 | " in "\n".join(lines)
    _png(tmp_path / "dag_parse_adversarial.png")


def test_retrieval_recall_with_bm25_only_builds_no_encoder(data_dir: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import search_env.sources.encoders as encoders
    from benchmarks.retrieval_recall import main

    def refuse(*args, **kwargs):
        raise AssertionError("BM25 alone must not load an encoder")

    monkeypatch.setattr(encoders, "TransformersEncoder", refuse)
    out_dir = data_dir / "out"
    argv = ["--data-dir", str(data_dir), "--retrievers", "bm25", "--ks", "1,5", "--runs", "1", "--output-dir", str(out_dir)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dense" not in out and "retrievers: bm25" in out
    # dataset, mode, system, n, R@1, R@5, all@5 -- worked by hand from the corpus above
    assert _rows(out, "hotpotqa_dev") == [["hotpotqa_dev", "single", "bm25", "1", "1.000", "1.000", "1.000"]]
    assert _rows(out, "2wikimultihopqa_dev") == [["2wikimultihopqa_dev", "single", "bm25", "1", "1.000", "1.000", "1.000"]]
    assert _rows(out, "musique_dev") == [
        ["musique_dev", "single", "bm25", "1", "0.500", "0.500", "0.000"],
        ["musique_dev", "decomposed", "bm25", "1", "1.000", "1.000", "1.000"],
    ]
    lines, saved, rows = _written(out_dir, "retrieval_recall", "python -m benchmarks.retrieval_recall " + " ".join(argv))
    assert [(r["dataset"], r["mode"], r["R@1"], r["all@5"]) for r in rows] == [
        ("hotpotqa_dev", "single", "1.0", "1.0"), ("2wikimultihopqa_dev", "single", "1.0", "1.0"),
        ("musique_dev", "single", "0.5", "0.0"), ("musique_dev", "decomposed", "1.0", "1.0")]
    assert saved["recall"][2] == {"dataset": "musique_dev", "mode": "single", "system": "bm25", "n": 1, "R@1": 0.5, "all@1": 0.0,
                                  "R@5": 0.5, "all@5": 0.0}
    assert saved["passages"] == 5 and set(saved["latency_ms"]) == {"bm25 search 1 query top-10"}
    assert "| musique_dev | decomposed | bm25 | 1 | 1 | 1 | 1 | 1 |" in lines and saved["builds"][0].startswith("BM25 index build")


def test_the_peers_build_time_is_quoted_as_recorded_and_compared_only_on_its_corpus(tmp_path: Path) -> None:
    import argparse
    from types import SimpleNamespace

    from benchmarks.retrieval_recall import dense_build_line

    args = argparse.Namespace(index="flat", peer_build_seconds=800.0)
    stats = SimpleNamespace(reused_embeddings=False, encode_seconds=100.0, index_seconds=60.0)
    line = dense_build_line(SimpleNamespace(stats=stats, passages=[None] * 13_778), tmp_path, 170.0, args)
    assert "160.0 s = 100.0 s encoding (138 passages/s) + 60.00 s indexing" in line
    assert ("5.0x less than Search-R1's server, which took 800 s on this corpus and machine (a recorded figure, quoted, "
            "not measured in this run") in line
    line = dense_build_line(SimpleNamespace(stats=stats, passages=[None] * 10), tmp_path, 170.0, args)
    assert "no ratio here" in line and "x less" not in line


@pytest.mark.slow  # loads the real MiniLM encoder: about 20 s
def test_retrieval_recall_dense_and_hybrid(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_without("dense", "faiss")
    from benchmarks.retrieval_recall import main

    main(["--data-dir", str(data_dir), "--retrievers", "bm25,dense,hybrid", "--index-dir", str(tmp_path / "cache"),
          "--backend", "torch", "--ks", "1,5", "--runs", "1"])
    out = capsys.readouterr().out
    assert "dense index build (flat), one run:" in out
    assert "the quoted peer build time is for the 13778-passage shared corpus, so no ratio here" in out
    assert [row[2] for row in _rows(out, "musique_dev")] == ["bm25", "dense", "hybrid"] * 2
    for row in _rows(out, "hotpotqa_dev"):  # five passages: every system has the gold in its top 5
        assert row[5] == "1.000"


@pytest.mark.slow  # starts the server in a subprocess
def test_retrieval_throughput_through_the_bm25_server(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_without("server", "starlette", "uvicorn", "requests")
    from benchmarks.retrieval_throughput import main

    argv = ["--corpus", str(data_dir / "corpus.jsonl"), "--questions", str(data_dir / "hotpotqa_dev.jsonl"), "--retrievers", "bm25",
            "--runs", "1", "--queries", "8", "--max-seconds", "5", "--index-dir", str(tmp_path / "index"), "--output-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    labels = ("1/request", "16/request", "8 clients", "16 envs (RemoteSource)", "in-process 1/call", "in-process 16/call")
    for label in labels:
        (row,) = _rows(out, label)
        assert float(row[len(label.split())]) > 0
    lines, saved, rows = _written(tmp_path, "retrieval_throughput", "python -m benchmarks.retrieval_throughput " + " ".join(argv))
    assert [r["queries/s"] for r in rows] == list(labels) and set(saved["queries_per_s"]) == {"bm25"}
    for row in saved["table"]:
        assert row["bm25"] == saved["queries_per_s"]["bm25"][row["queries/s"]] > 0
        assert row["dense/then"] is None  # no dense retriever: no ratio against the peer
    assert [r["target"] for r in rows] == [">=2x", "", ">=3x", "", "", ""]


# --- --help everywhere -----------------------------------------------------------------------------

COMMANDS = ["benchmarks.evaluate", "benchmarks.env_overhead", "benchmarks.dag_critical_path", "benchmarks.dag_parse_adversarial",
            "benchmarks.grpo_step_vs_trl", "benchmarks.learning", "benchmarks.rollout_overhead", "benchmarks.retrieval_recall",
            "benchmarks.retrieval_throughput", "benchmarks.data_parallel", "benchmarks.memory_soak", "search_env.server.__main__"]
AGENTS_EXTRA = ("agents", "torch", "transformers", "yaml")
NEEDS = {  # the extra, and its packages, that a command's module imports; the others need the core only
    "benchmarks.grpo_step_vs_trl": AGENTS_EXTRA,  # TRL itself is imported when the command runs
    "benchmarks.learning": AGENTS_EXTRA,
    "benchmarks.rollout_overhead": AGENTS_EXTRA,
    "benchmarks.memory_soak": AGENTS_EXTRA,
    "benchmarks.retrieval_throughput": ("server", "requests"),
    "search_env.server.__main__": ("server", "starlette"),
}


@pytest.mark.parametrize("module", COMMANDS)
def test_help_shows_defaults(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    if module in NEEDS:
        skip_without(*NEEDS[module])
    entry = importlib.import_module(module)
    with pytest.raises(SystemExit) as exit_info:
        (entry.parse_args if hasattr(entry, "parse_args") else entry.main)(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    assert exit_info.value.code == 0
    assert out.count("(default: ") >= 3
    assert not MARKUP.findall(out), MARKUP.findall(out)


#: Sphinx roles, inline literals and strong emphasis: the API documentation's markup, not a terminal's.
MARKUP = re.compile(r":[a-z]+:`|``|\*\*\w")


def test_the_algorithm_benchmarks_help_has_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and not MARKUP.findall(out), [line for line in out.splitlines() if MARKUP.search(line)]
    assert "The ladder (--ladder quick|full, --rungs to select" in " ".join(out.split())


@pytest.mark.parametrize(("module", "argv", "hint"), [
    ("benchmarks.evaluate", ["--episodez", "3"], "(--episodez: did you mean --episodes?)"),
    ("benchmarks.algorithms", ["--jobz", "2"], "(--jobz: did you mean --jobs?)"),
])
def test_a_mistyped_option_is_one_line_naming_the_nearest(module: str, argv: list[str], hint: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    if module == "benchmarks.algorithms":
        skip_without(*AGENTS_EXTRA)
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(module).main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and hint in err, err
    assert err.startswith(f"python -m {module}: error: unrecognized arguments: {' '.join(argv)} ")


def test_a_mistyped_set_field_names_the_nearest_as_set_takes_it(capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--set", "run.stepz=3", "--output-dir", "unused"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert "--set run.stepz=3: no field run.stepz (did you mean run.steps?)" in err and "--run.steps" not in err


def test_set_changes_the_recipe_before_or_after_config_and_every_set_counts() -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.algorithms import _parser
    from benchmarks.learning import DEMO_RECIPE, demo_config

    parser = _parser()
    recipe = demo_config()
    assert (recipe.run.steps, recipe.eval.questions) != (3, 5)
    for argv in (["--set", "run.steps=3", "--config", str(DEMO_RECIPE), "--set", "eval.questions=5"],
                 ["--config", str(DEMO_RECIPE), "--set", "run.steps=3", "eval.questions=5"]):
        args = parser.parse_args(argv)
        config = demo_config(args.set, recipe=args.config)
        assert (config.run.steps, config.eval.questions, config.eval.every) == (3, 5, recipe.eval.every), argv


def test_learning_reads_the_demo_recipe_with_typed_changes(capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*NEEDS["benchmarks.learning"])
    from benchmarks.learning import demo_config, main

    demo = demo_config()
    assert demo.env.protocol == "search-r1-compact" and demo.eval.by_hops and demo.run.steps > 0
    changed = demo_config(["optim.learning_rate=1e-3", "warm_start.learning_rate=1", "run.steps=20", "run.progress=true"])
    assert (changed.optim.learning_rate, changed.warm_start.learning_rate, changed.run.steps, changed.run.progress) == (0.001, 1.0, 20, True)
    assert type(changed.optim.learning_rate) is float and type(changed.warm_start.learning_rate) is float
    assert changed.model == demo.model  # what is not changed is the recipe's
    with pytest.raises(ValueError, match="learning_rat"):
        demo_config(["optim.learning_rat=1e-3"])
    with pytest.raises(ValueError, match="learning_rate"):
        demo_config(["optim.learning_rate=fast"])
    with pytest.raises(SystemExit) as exit_info:
        main(["--set", "optim.learning_rate"])
    assert exit_info.value.code == 2 and "GROUP.FIELD=VALUE" in capsys.readouterr().err


def test_learning_runs_the_readme_pair_and_ten_fresh_pairs_by_default() -> None:
    """The default list is the README's pair and ten pairs that share no seed or world with it, with the
    earlier untuned pairs, or with one another: a benchmark of the warm start's robustness on seeds that
    did not choose the recipe."""
    skip_without(*NEEDS["benchmarks.learning"])
    from benchmarks.learning import FRESH_PAIRS, README_PAIR, UNTUNED_PAIRS, default_pairs

    assert len(FRESH_PAIRS) >= 10
    seeds = [p.seed for p in (README_PAIR, *UNTUNED_PAIRS, *FRESH_PAIRS)]
    worlds = [w for p in (README_PAIR, *UNTUNED_PAIRS, *FRESH_PAIRS) for w in (p.world_seed, p.eval_world_seed)]
    assert len(set(seeds)) == len(seeds) and len(set(worlds)) == len(worlds)
    assert default_pairs() == [str(p) for p in (README_PAIR, *FRESH_PAIRS)]


@pytest.mark.slow
def test_learning_jobs_run_pairs_in_processes_of_their_own_with_the_same_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two pairs run two at a time (spawned processes, in order in the results); the second measures what
    it measures when run alone in this process."""
    skip_without(*NEEDS["benchmarks.learning"])
    from benchmarks.learning import main

    tiny = ["run.steps=1", "eval.every=1", "eval.questions=2", "warm_start.steps=2", "warm_start.examples=16",
            "warm_start.copy_steps=1", "warm_start.num_threads=1", "data.world_size=50", "data.world_scale=1",
            "rollout.questions_per_step=2", "algorithm.group_size=2", "rollout.env_worker=false"]
    assert main(["--pairs", "0:5:6", "1:7:8", "--jobs", "2", "--output-dir", str(tmp_path / "jobs2"), "--set", *tiny]) == 0
    runs = json.loads((tmp_path / "jobs2" / "results.json").read_text())["runs"]
    assert [(r["seed"], r["world_seed"]) for r in runs] == [(0, 5), (1, 7)]
    assert main(["--pairs", "1:7:8", "--output-dir", str(tmp_path / "alone"), "--set", *tiny]) == 0
    (alone,) = json.loads((tmp_path / "alone" / "results.json").read_text())["runs"]
    assert alone["evaluations"] == runs[1]["evaluations"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["--jobs", "0"])
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err


def test_learning_runs_the_recipe_through_the_trainer_and_records_its_curve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*NEEDS["benchmarks.learning"])
    from benchmarks.learning import main

    out_dir = tmp_path / "learning"
    assert main(["--pairs", "0:5:6", "--output-dir", str(out_dir), "--set", "run.steps=2", "eval.every=1", "eval.questions=2",
                 "warm_start.steps=2", "warm_start.examples=16", "warm_start.copy_steps=1", "data.world_size=50",
                 "data.world_scale=1", "rollout.questions_per_step=2", "algorithm.group_size=2", "rollout.env_worker=false"]) == 0
    out = capsys.readouterr().out
    table = {(row[0], row[2]): row for row in _rows(out, "0 ")}
    assert set(table) == {("0", "start"), ("0", "warm"), ("0", "final")}
    final = table[("0", "final")]
    assert final[1] == "5/6" and final[9] == "2"  # the worlds; RL steps, after four EM cells, minutes and CPU minutes
    assert final[-1] == "missed"  # two RL evaluations cannot make the last three
    assert "seed 0 worlds 5/6: 2-hop greedy EM >= 0.9 first at" in out and "target met by 0 of 1 runs" in out
    assert (out_dir / "curve.png").stat().st_size > 0
    results = json.loads((out_dir / "results.json").read_text())
    (run,) = results["runs"]
    assert results["config"]["run"]["steps"] == 2 and run["rl_steps"] == 2 and run["rl_tokens_per_s"] > 0
    assert (run["seed"], run["world_seed"], run["eval_world_seed"], run["target_met"]) == (0, 5, 6, False)
    assert (out_dir / "seed0-world5" / "metrics.jsonl").exists()
    assert set(run["evaluations"]) == {"start", "warm start", "final"}
    assert set(run["evaluations"]["final"]) == {"greedy 1-hop", "greedy 2-hop", "sampled 1-hop", "sampled 2-hop"}
    # one point per evaluation: before training, after the warm start, after each step (the last is "final")
    assert [(p["stage"], p["step"]) for p in run["curve"]] == [("start", 0), ("warm start", 0), (None, 1), ("final", 2)]
    minutes = [p["minutes"] for p in run["curve"]]
    assert minutes == sorted(minutes) and run["train_minutes"] == minutes[-1] > run["warm_start_minutes"] > 0
    assert all(0 <= p[key] <= 1 for p in run["curve"] for key in ("greedy_1hop", "greedy_2hop"))


def test_learning_reads_back_pairs_that_finished_and_trains_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second command with the same settings reads the finished pair's record instead of training it (its
    metrics file is left as it was) and trains the new pair; a changed setting trains the pair again."""
    skip_without(*NEEDS["benchmarks.learning"])
    from benchmarks.learning import RECORD_FILE, main

    tiny = ["run.steps=1", "eval.every=1", "eval.questions=2", "warm_start.steps=2", "warm_start.examples=16",
            "warm_start.copy_steps=1", "data.world_size=50", "data.world_scale=1", "rollout.questions_per_step=2",
            "algorithm.group_size=2", "rollout.env_worker=false"]
    out_dir = tmp_path / "learning"
    assert main(["--pairs", "0:5:6", "--output-dir", str(out_dir), "--set", *tiny]) == 0
    first = json.loads((out_dir / "results.json").read_text())["runs"]
    metrics = out_dir / "seed0-world5" / "metrics.jsonl"
    written = metrics.read_bytes()
    assert (out_dir / "seed0-world5" / RECORD_FILE).is_file()
    capsys.readouterr()
    assert main(["--pairs", "0:5:6", "1:7:8", "--output-dir", str(out_dir), "--set", *tiny, "warm_start.num_threads=1"]) == 0
    out = capsys.readouterr().out
    assert "seed 0 worlds 5/6: finished already" in out and "seed 1 worlds 7/8: finished already" not in out
    runs = json.loads((out_dir / "results.json").read_text())["runs"]
    assert [(r["seed"], r["world_seed"]) for r in runs] == [(0, 5), (1, 7)]
    assert runs[0] == first[0] and metrics.read_bytes() == written
    assert main(["--pairs", "0:5:6", "--output-dir", str(out_dir), "--set", *tiny, "eval.questions=3"]) == 0
    assert "finished already" not in capsys.readouterr().out
    assert metrics.read_bytes() != written


def test_learning_target_needs_the_last_three_evaluations_and_the_first_hop() -> None:
    skip_without(*NEEDS["benchmarks.learning"])
    from benchmarks.learning import Pair, SeedRun, target_met

    def run_with(two_hop: list[float], final_one_hop: float) -> SeedRun:
        curve = [{"stage": "start", "greedy_2hop": 0.0}, {"stage": "warm start", "greedy_2hop": 0.0}]
        curve += [{"stage": None, "greedy_2hop": em} for em in two_hop[:-1]] + [{"stage": "final", "greedy_2hop": two_hop[-1]}]
        final = {"greedy 1-hop": {"em": final_one_hop}, "greedy 2-hop": {"em": two_hop[-1]}}
        return SeedRun(seed=0, evaluations={"final": final}, curve=curve)

    assert target_met(run_with([0.5, 0.9, 0.91, 0.95], 0.95))
    assert not target_met(run_with([0.5, 0.89, 0.91, 0.95], 0.95))  # one of the last three below 0.9
    assert not target_met(run_with([0.9, 0.91, 0.95, 0.89], 1.0))  # the final one below
    assert not target_met(run_with([0.9, 0.91, 0.95], 0.94))  # 1-hop lost
    assert not target_met(run_with([0.95, 0.95], 1.0))  # fewer than three evaluations after the warm start
    assert Pair.parse("3:30:31") == Pair(3, 30, 31) and str(Pair(3, 30, 31)) == "3:30:31"
    with pytest.raises(ValueError, match="SEED:WORLD_SEED:EVAL_WORLD_SEED"):
        Pair.parse("3:30")


def test_rollout_overhead_reuses_a_policy_cache_made_with_the_same_settings_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_without(*AGENTS_EXTRA)
    from benchmarks.common.warm_start_cache import RECORD_FILE
    from benchmarks.rollout_overhead import main

    cache = str(tmp_path / "cache")
    args = ["--runs", "1", "--warm-start-examples", "4", "--warm-start-copy-steps", "2", "--policy-cache", cache]
    first = main(args + ["--warm-start-steps", "1", "--output-dir", str(tmp_path)])
    command = "python -m benchmarks.rollout_overhead " + " ".join(args + ["--warm-start-steps", "1", "--output-dir", str(tmp_path)])
    lines, saved, rows = _written(tmp_path, "rollout_overhead", command)
    assert [(r["mode"], r["run"]) for r in rows] == [("in-process", "0"), ("worker", "0")]
    assert float(rows[1]["total_s"]) == first["runs"]["worker"][0]["total_s"] == saved["median"]["worker"]["total_s"]
    assert saved["judged"] == first["judged"] and saved["args"]["runs"] == 1
    assert any(line.startswith("| worker | ") for line in lines)
    assert f"env + search = {first['env_plus_search']:.2%} of rollout time, {first['judged']} as the demo steps it" in "\n".join(lines)
    again = main(args + ["--warm-start-steps", "1"])  # loads the cached policy: the same seeded rollout follows
    for mode in ("in-process", "worker"):
        assert again["runs"][mode][0]["agent_tokens_mean"] == first["runs"][mode][0]["agent_tokens_mean"]
        assert again["runs"][mode][0]["reward_mean"] == first["runs"][mode][0]["reward_mean"]
    assert first["runs"]["worker"][0]["worker_busy"] > 0 and first["runs"]["worker"][0]["time_search"] == 0
    (made,) = Path(cache).iterdir()  # one folder per set of settings: the second run made none
    main(args + ["--warm-start-steps", "2"])  # other settings: a warm start of their own, beside the first
    assert len(list(Path(cache).iterdir())) == 2
    record = made / RECORD_FILE
    record.write_text(record.read_text().replace('"warm_start.steps": 1', '"warm_start.steps": 5'))
    with pytest.raises(SystemExit) as exit_info:  # a folder whose record is not its name's settings is refused
        main(args + ["--warm-start-steps", "1"])
    assert exit_info.value.code == 2 and "other settings than its name says" in capsys.readouterr().err
