"""``python -m benchmarks.evaluate`` end to end: the synthetic world with scripted and token-level agents
writing every output, a killed run resumed, an endpoint agent with a judge, sampled decoding, agent
specs and one-line refusals."""
from __future__ import annotations

import csv
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from agents import NoSearchAgent, OracleAgent, ScriptedRolloutAgent
from benchmarks.evaluate import main
from benchmarks.evaluation.agent_specs import AGENT_KINDS, AgentOptions, Decoding, agent_from_object, register_agent_kind
from search_env.data.example import QAExample
from tests.conftest import skip_without

CORPUS = [
    {"id": "p1", "title": "Zarbo", "text": "Zarbo is a company founded by Bob Smith."},
    {"id": "p2", "title": "Vessa", "text": "Vessa is the capital city of Norland."},
    {"id": "p3", "title": "Tarn", "text": "Tarn is a village with a stone bridge."},
]
QUESTIONS = [
    {"id": "q1", "question": "Which company did Bob Smith found?", "golden_answers": ["Zarbo"]},
    {"id": "q2", "question": "Vessa is the capital of which land?", "golden_answers": ["Norland"]},
]


@pytest.fixture
def real_format(tmp_path: Path) -> tuple[Path, Path]:
    """A FlashRAG-format question file and its passage corpus, small enough to work by hand."""
    corpus, questions = tmp_path / "corpus.jsonl", tmp_path / "qa.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in CORPUS), encoding="utf-8")
    questions.write_text("".join(json.dumps(row) + "\n" for row in QUESTIONS), encoding="utf-8")
    return questions, corpus


def _csv(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: v for k, v in row.items() if k not in drop} for row in csv.DictReader(f)]


def _episodes(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "episodes.jsonl").read_text(encoding="utf-8").splitlines()]


def _without_timing(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "metrics": {k: v for k, v in record["metrics"].items() if k != "seconds"}}


# --- the synthetic world, scripted agents -----------------------------------------------------------


def test_the_synthetic_world_end_to_end_writes_the_table_chart_and_episodes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    table = main(["--protocols", "search-r1", "--agents", "oracle", "no-search", "--episodes", "3", "--output-dir", str(out)])
    assert {p.name for p in out.iterdir()} == {"results.md", "results.csv", "results.png", "episodes.jsonl", "settings.json"}
    oracle, no_search = _csv(out / "results.csv")
    assert oracle["agent"] == "oracle" and oracle["em"] == oracle["cover_em"] == oracle["reward"] == "1.0"
    assert (oracle["questions"], oracle["seeds"], oracle["episodes"], oracle["top_k"], oracle["max_turns"]) == ("3", "1", "3", "3", "10")
    assert (oracle["retriever"], oracle["subset"], oracle["decoding"], oracle["judge"]) == ("BM25", "first 3 of 1000", "scripted", "")
    assert no_search["searches"] == no_search["retrieved_tokens"] == "0.0"
    assert (oracle["no_search"], no_search["no_search"]) == ("0.0", "1.0")  # the share of episodes without a search
    assert [row["em"] for row in table] == [1.0, float(no_search["em"])]

    episodes = _episodes(out)
    assert [(e["agent"], e["seed"]) for e in episodes] == [("oracle", 0)] * 3 + [("no-search", 0)] * 3
    first = episodes[0]
    assert first["question"] in first["text"] and "<search>" in first["text"] and "<information>" in first["text"]
    assert first["prediction"] == first["golden_answers"][0] and first["reward_components"]["em"] == 1.0
    assert first["metrics"]["searches"] == len(first["tool_calls"]) >= 1 and first["metrics"]["retrieved_tokens"] > 0

    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "| retriever | BM25 |" in markdown and "| subset | first 3 of 1000 |" in markdown and "| top-k | 3 |" in markdown
    assert "| synthetic | search-r1 | oracle | 3 | 1 | 1.000 | 1.000 | 1.000 |" in markdown
    assert "| searches | failed searches | no search |" in markdown and "| 0.00 | 0.00 | 1.00 |" in markdown  # no-search's row
    from matplotlib.image import imread

    assert imread(out / "results.png").shape[2] in (3, 4)


def test_results_md_gets_the_table_in_its_generated_section_and_keeps_the_rest(tmp_path: Path) -> None:
    history = tmp_path / "RESULTS.md"
    history.write_text("# Results\n\nHand-written history.\n", encoding="utf-8")
    argv = ["--protocols", "search-r1", "--agents", "oracle", "--results-md", str(history)]
    main([*argv, "--episodes", "2"])
    text = history.read_text(encoding="utf-8")
    assert text.startswith("# Results\n\nHand-written history.\n")
    section = text[text.index("<!-- generated section evaluation: begin"):]
    assert "## Evaluation harness" in section and "| synthetic | search-r1 | oracle | 2 | 1 | 1.000 |" in section
    assert not [line for line in section.splitlines() if line.startswith("# ")]  # a section of the file, not a title
    assert "- synthetic: 2 episodes each, synthetic world seed" in section and "--results-md" in section
    main([*argv, "--episodes", "3"])  # a second run replaces the section
    again = history.read_text(encoding="utf-8")
    assert again.count("<!-- generated section evaluation: begin") == 1 and "| synthetic | search-r1 | oracle | 3 |" in again
    assert "| synthetic | search-r1 | oracle | 2 |" not in again


def tiny_policy_agent(greedy: bool, seed: int):
    """A user's token-level agent, given as module:function: the tiny policy (seed 0) under the HF sampler."""
    from agents.policies.loading import load_policy
    from agents.rollout.hf_sampler import HFSampler

    return HFSampler(load_policy("tiny"), greedy=greedy, seed=seed)


def test_a_token_level_agent_plays_as_training_evaluates_it(tmp_path: Path) -> None:
    skip_without("agents", "torch", "transformers")
    from agents.policies.loading import load_policy
    from agents.rollout.hf_sampler import HFSampler
    from agents.training.evaluation import evaluate
    from search_env import BatchSearchQAEnv

    policy = load_policy("tiny")
    folder = policy.save_pretrained(tmp_path / "policy")  # a trained run's policy/ folder looks like this
    out = tmp_path / "run"
    agents = [f"{__name__}:tiny_policy_agent", "hf:tiny", str(folder)]
    main(["--protocols", "search-r1", "--agents", *agents, "--episodes", "2", "--max-new-tokens", "8", "--output-dir", str(out)])
    by_agent = {agent: [e for e in _episodes(out) if e["agent"] == agent] for agent in agents}
    assert [row["decoding"] for row in _csv(out / "results.csv")] == ["greedy"] * 3

    env = BatchSearchQAEnv(2, protocol="search-r1", tokenizer=policy.codec, max_new_tokens=8)
    result, trajectories = evaluate(HFSampler(policy, greedy=True), env, [0, 1])
    for episodes in by_agent.values():
        assert [e["text"] for e in episodes] == [env.codec.decode(t.token_ids) for t in trajectories]
        assert sum(e["metrics"]["agent_tokens"] for e in episodes) / 2 == result.response_tokens
        assert sum(e["metrics"]["em"] for e in episodes) / 2 == result.em


# --- a killed run, resumed -------------------------------------------------------------------------


class CountingOracle(OracleAgent):
    """The oracle, noting every question it starts (which episodes a resumed run plays again)."""

    started: list[str] = []

    def start(self, example: QAExample) -> None:
        type(self).started.append(example.id)
        super().start(example)


def test_a_killed_run_resumes_playing_only_the_missing_episodes_and_gives_the_same_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    argv = ["--protocols", "search-r1", "research", "--agents", f"{__name__}:CountingOracle", "--episodes", "3",
            "--batch-size", "2", "--output-dir", str(out)]
    CountingOracle.started = []
    main(argv)
    assert len(CountingOracle.started) == 6
    table, episodes = _csv(out / "results.csv", drop=("seconds",)), _episodes(out)

    # killed while writing the fifth episode: four whole lines, then half of one
    lines = (out / "episodes.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (out / "episodes.jsonl").write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2], encoding="utf-8")
    CountingOracle.started = []
    capsys.readouterr()
    main(argv)
    assert CountingOracle.started == [episodes[4]["example_id"], episodes[5]["example_id"]]
    assert f"resuming {out / 'episodes.jsonl'}: 4 episodes kept, its torn last line dropped" in capsys.readouterr().err
    assert [_without_timing(e) for e in _episodes(out)] == [_without_timing(e) for e in episodes]
    assert _csv(out / "results.csv", drop=("seconds",)) == table

    CountingOracle.started = []
    main(argv)
    assert CountingOracle.started == []  # everything is in the log: nothing plays


def test_resuming_with_other_settings_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    main(["--protocols", "search-r1", "--agents", "no-search", "--episodes", "1", "--output-dir", str(out)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--protocols", "search-r1", "--agents", "no-search", "--episodes", "1", "--top-k", "5", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "holds a run with top_k=None, and this run asks for 5" in err
    # more questions, protocols or agents are a resume, not a conflict
    main(["--protocols", "search-r1", "research", "--agents", "no-search", "oracle", "--episodes", "2", "--output-dir", str(out)])
    assert len(_episodes(out)) == 8


# --- an endpoint agent, an LLM judge, sampled decoding ---------------------------------------------


class _FakeServer(BaseHTTPRequestHandler):
    """A completions endpoint that always answers "Zarbo", and a chat judge that says yes when the
    prediction is the first gold."""

    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, **body})
        if self.path.endswith("/chat/completions"):
            prompt = body["messages"][-1]["content"]
            gold = prompt.split("Gold answers: ")[1].split("\n")[0]
            predicted = prompt.split("Predicted answer: ")[1].split("\n")[0]
            payload = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "yes" if gold == predicted else "no"}}]}
        else:
            payload = {"choices": [{"index": 0, "text": "<answer> Zarbo", "finish_reason": "stop", "stop_reason": "</answer>"}]}
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[type[_FakeServer], str]]:
    handler = type("Handler", (_FakeServer,), {"requests": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_an_endpoint_agent_is_judged_and_sampled_with_one_seed_per_sample(
        server: tuple[type[_FakeServer], str], real_format: tuple[Path, Path], tmp_path: Path) -> None:
    skip_without("judge", "httpx")
    handler, url = server
    questions, corpus = real_format
    out = tmp_path / "run"
    table = main(["--dataset", str(questions), "--corpus", str(corpus), "--protocols", "search-r1",
                  "--agents", f"endpoint:{url}#fake-model", "no-search", "--sampled", "2", "--temperature", "0.7",
                  "--judge-url", url, "--judge-model", "fake-judge", "--output-dir", str(out)])
    endpoint, no_search = table
    # "Zarbo" is right for q1 and wrong for q2, for both seeds; the judge agrees with EM
    assert (endpoint["seeds"], endpoint["episodes"], endpoint["em"], endpoint["judge"]) == (2, 4, 0.5, 0.5)
    assert endpoint["decoding"] == "sampled (T=0.7, top-p 1), mean of 2 seeds"
    assert (no_search["seeds"], no_search["episodes"], no_search["decoding"]) == (1, 2, "scripted")  # a scripted agent plays once
    completions = [r for r in handler.requests if r["path"] == "/v1/completions"]
    assert sorted(r["seed"] for r in completions) == [0, 0, 1, 1] and {r["temperature"] for r in completions} == {0.7}
    assert {r["model"] for r in handler.requests if r["path"].endswith("/chat/completions")} == {"fake-judge"}
    judged = [e for e in _episodes(out) if e["agent"].startswith("endpoint")]
    assert [(e["example_id"], e["metrics"]["judge"], e["judge_reply"]) for e in judged if e["seed"] == 1] == \
        [("q1", 1.0, "yes"), ("q2", 0.0, "no")]
    assert "| judge | fake-judge |" in (out / "results.md").read_text(encoding="utf-8")
    assert "judge (fake-judge)" in (out / "results.md").read_text(encoding="utf-8")


class BudgetReader(ScriptedRolloutAgent):
    """A no-search agent that keeps the search budget of the protocol it is given."""

    budgets: list[int | None] = []

    def __init__(self) -> None:
        super().__init__(NoSearchAgent)

    def begin(self, prompt_ids, *, examples, protocol, codec) -> None:
        BudgetReader.budgets.append(protocol.max_turns)
        super().begin(prompt_ids, examples=examples, protocol=protocol, codec=codec)


def test_the_search_budget_of_max_turns_is_in_the_protocol_an_agent_is_given() -> None:
    BudgetReader.budgets = []
    main(["--protocols", "research", "--agents", f"{__name__}:BudgetReader", "--episodes", "2", "--max-turns", "2"])
    main(["--protocols", "search-r1", "--agents", f"{__name__}:BudgetReader", "--episodes", "2"])
    assert BudgetReader.budgets == [2, 10]  # research has no budget of its own; search-r1's is 10


# --- agent specs -----------------------------------------------------------------------------------


def test_a_rollout_agent_factory_gets_the_decoding_keywords_it_takes() -> None:
    calls: list[tuple[int, float]] = []

    def factory(seed: int, temperature: float) -> ScriptedRolloutAgent:
        calls.append((seed, temperature))
        return ScriptedRolloutAgent(NoSearchAgent)

    sampled = agent_from_object("mine", factory, AgentOptions(decoding=Decoding(samples=3, temperature=0.6)))
    assert sampled.seeded and sampled.decoding == "sampled (T=0.6, top-p 1), mean of 3 seeds"
    sampled.build(5)
    assert calls == [(5, 0.6)]
    assert not agent_from_object("mine", factory).seeded  # greedy: one seed is enough
    assert agent_from_object("plain", lambda: ScriptedRolloutAgent(NoSearchAgent)).decoding == "its own"
    with pytest.raises(TypeError, match="made a str, which lacks begin, generate, feed and finish"):
        agent_from_object("bad", lambda: "not an agent").build(0)


def test_a_registered_agent_kind_is_an_agent_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    register_agent_kind("always-no-search", lambda name, argument: lambda options: agent_from_object(name, NoSearchAgent, options))
    try:
        table = main(["--protocols", "search-r1", "--agents", "always-no-search", "--episodes", "1"])
        assert table[0]["agent"] == "always-no-search"
        with pytest.raises(ValueError, match="already registered"):
            register_agent_kind("always-no-search", AGENT_KINDS["oracle"])
    finally:
        AGENT_KINDS.pop("always-no-search")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--agents", "hf"], "give hf:MODEL"),
        (["--agents", "hf:/no/such/folder"], "is not an existing model folder"),
        (["--agents", "endpoint:localhost:8000#m"], "is not an http(s) URL"),
        (["--agents", "endpoint:http://localhost:8000/v1"], "give endpoint:URL#MODEL"),
        (["--agents", "oracle:x"], "oracle takes no argument"),
        (["--dataset", "nosuch.jsonl", "--corpus", "{corpus}"], "no dataset file 'nosuch.jsonl'"),
        (["--dataset", "bamboogle", "--data-dir", "{tmp}", "--corpus", "{corpus}"], "bamboogle_test.jsonl, which does not exist"),
        (["--corpus", "{corpus}", "--retrieval-url", "http://x:1"], "not both"),
        (["--dataset", "{qa}", "--corpus", "{tmp}/absent.jsonl"], "no corpus file"),
        (["--record-retrieval", "a.jsonl", "--replay-retrieval", "b.jsonl"], "not both"),
        (["--replay-retrieval", "{tmp}/absent.jsonl"], "does not exist"),
        (["--replay-missing", "live"], "applies to --replay-retrieval"),
        (["--judge-url", "http://x:1"], "give --judge-url and --judge-model together"),
        (["--sampled", "-1"], "--sampled must be at least 0"),
        (["--sampled", "2", "--temperature", "0"], "--temperature must be > 0"),
        (["--protocols", "nobody"], "nobody"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(argv: list[str], message: str, real_format: tuple[Path, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    questions, corpus = real_format
    argv = [a.format(corpus=corpus, qa=questions, tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err.strip().splitlines()[-1]


# --- a retriever that is down ----------------------------------------------------------------------


class _DownRetriever(BaseHTTPRequestHandler):
    """A retrieval server that refuses every search."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        data = b'{"detail": "index not loaded"}'
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_failed_searches_are_counted_in_every_table_and_said_beside_the_em(
        real_format: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    questions, _ = real_format
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _DownRetriever)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    out = tmp_path / "run"
    try:
        table = main(["--dataset", str(questions), "--retrieval-url", f"http://127.0.0.1:{httpd.server_address[1]}",
                      "--protocols", "search-r1", "--agents", "retrieve-then-answer", "--output-dir", str(out)])
    finally:
        httpd.shutdown()
        httpd.server_close()
    (row,) = table
    assert row["searches"] == row["failed_searches"] == 1.0 and row["em"] == 0.0
    assert all(e["metrics"]["failed_searches"] == 1.0 for e in _episodes(out))
    printed = capsys.readouterr().out
    header, _, line = printed.splitlines()[:3]
    assert line.split()[header.split().index("failed")] == "1.00"
    assert ("note: searches failed, so these EMs count answers given without passages: retrieve-then-answer on "
            f"{questions} under search-r1 (EM 0.000, 1.00 of 1.00 searches per question failed)") in printed
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "| 0.000 (searches failed) |" in markdown and "failed searches" in markdown
    assert _csv(out / "results.csv")[0]["failed_searches"] == "1.0"


# --- resumed episodes are kept only for the agent that played them ------------------------------------


def test_a_resume_after_the_agents_source_changed_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.evaluation import digests

    monkeypatch.setattr(digests, "DIGEST_CACHE", tmp_path / "digests.json")
    module = tmp_path / "modules" / "changing_agent.py"
    module.parent.mkdir()
    module.write_text("from agents import NoSearchAgent\n\n\nclass Agent(NoSearchAgent):\n    pass\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(module.parent))
    out = tmp_path / "run"
    argv = ["--protocols", "search-r1", "--agents", "changing_agent:Agent", "oracle", "--episodes", "1", "--output-dir", str(out)]
    main(argv)
    main(argv)  # the same code resumes (nothing left to play)
    module.write_text(module.read_text(encoding="utf-8") + "\n# answers differently now\n", encoding="utf-8")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {out} holds episodes of agent 'changing_agent:Agent' with source digest ")
    assert ", and its source digest is now " in err  # the digest, not the source, changed
    assert err.rstrip().endswith(f"give another --output-dir (or delete {out}) to start fresh")
    assert len(_episodes(out)) == 2  # the old episodes were not mixed with new ones


def test_a_model_folder_is_known_by_its_weights_and_a_module_agent_by_its_source(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.evaluation import digests
    from benchmarks.evaluation.digests import agent_producer

    monkeypatch.setattr(digests, "DIGEST_CACHE", tmp_path / "digests.json")
    model = tmp_path / "policy"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    (model / "model.safetensors").write_bytes(b"weights one")
    first = agent_producer(f"hf:{model}")
    assert first["weights"] is not None and first["source"] is None
    assert agent_producer(str(model)) == agent_producer(f"ircot:hf:{model}") == first  # wherever the folder sits in the spec
    (model / "config.json").write_text('{"a": 1}', encoding="utf-8")
    assert agent_producer(f"hf:{model}") == first  # only the weights count
    (model / "model.safetensors").write_bytes(b"weights two")
    assert agent_producer(f"hf:{model}")["weights"] not in (None, first["weights"])
    assert agent_producer("oracle") == agent_producer("hf:tiny") == {"weights": None, "source": None}
    assert agent_producer(f"{__name__}:CountingOracle")["source"] == digests.file_digest(__file__)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "nosuch.jsonl", "--corpus", "{corpus}"], "error: no dataset file 'nosuch.jsonl'"),
        (["--dataset", "{qa}", "--corpus", "{tmp}/absent.jsonl"], "error: no corpus file"),
        (["--replay-retrieval", "{tmp}/absent.jsonl"], "error: --replay-retrieval"),
        (["--dataset", "{corpus}", "--corpus", "{corpus}"], "error: "),  # passages are no questions
        (["--results-md", "{tmp}/no/RESULTS.md"], "error: --results-md: no folder"),
    ],
)
def test_data_errors_are_one_line_without_the_usage_text(argv: list[str], message: str, real_format: tuple[Path, Path],
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    questions, corpus = real_format
    with pytest.raises(SystemExit) as exit_info:
        main([a.format(corpus=corpus, qa=questions, tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and err.startswith(message) and "usage" not in err, err
