"""The baselines in ``python -m benchmarks.evaluate``: EM through the harness with a scripted LLM that
can only answer from the passages its prompt holds, the ``BASELINE:LLM`` agent specs over a local model
and an OpenAI-compatible endpoint, and one-line refusals."""
from __future__ import annotations

import json
import re
import threading
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from agents.baselines import BaselineAgent, Direct, NaiveRAG, OraclePassages
from benchmarks.evaluate import main
from benchmarks.evaluation.agent_specs import parse_agent
from search_env.data.example import QAExample
from tests.agents.baselines.fake_llm import ScriptedLLM
from tests.conftest import skip_without, write_real_files

EPISODES = 8


@lru_cache(maxsize=1)
def _world() -> Any:
    from search_env.synthetic import generate_world

    return generate_world(seed=0, n_questions=1000)  # the harness's synthetic world


def _questions() -> dict[str, QAExample]:
    return {example.question: example for example in _world().questions[:EPISODES]}


def world_reader(prompt: str) -> str:
    """An LLM that knows nothing: it answers a question right only when every gold passage of it is in
    the prompt, and says "yes" otherwise."""
    example = _questions()[re.search(r"^Question: (.*)$", prompt, re.M).group(1)]
    golds = [_world().passage(pid)["text"] for pid in example.gold_passage_ids]
    return example.golden_answers[0] if all(text in prompt for text in golds) else "yes"


def direct_reader() -> BaselineAgent:
    return BaselineAgent(Direct(), ScriptedLLM(world_reader))


def naive_rag_reader() -> BaselineAgent:
    return BaselineAgent(NaiveRAG(), ScriptedLLM(world_reader))


def oracle_passages_reader() -> BaselineAgent:
    return BaselineAgent(OraclePassages(), ScriptedLLM(world_reader))


def _episodes(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "episodes.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("protocol", ["search-r1", "reasoning-search"])
def test_em_through_the_harness_is_what_each_baseline_could_read(protocol: str, tmp_path: Path) -> None:
    agents = [f"{__name__}:{name}" for name in ("direct_reader", "naive_rag_reader", "oracle_passages_reader")]
    table = main(["--protocols", protocol, "--agents", *agents, "--episodes", str(EPISODES), "--output-dir", str(tmp_path)])
    em = {row["agent"].split(":")[1]: row["em"] for row in table}
    examples = list(_questions().values())
    says_yes = [example.golden_answers[0] == "yes" for example in examples]
    assert em["direct_reader"] == pytest.approx(sum(says_yes) / EPISODES)
    assert em["oracle_passages_reader"] == 1.0
    searched = [e for e in _episodes(tmp_path) if e["agent"].endswith("naive_rag_reader")]
    assert [e["question"] for e in searched] == [example.question for example in examples]
    assert all(len(e["tool_calls"]) == 1 for e in searched)
    found = [set(example.gold_passage_ids) <= set(e["tool_calls"][0]["passage_ids"]) for e, example in zip(searched, examples)]
    assert 0 < sum(found) < EPISODES  # the check below tells reading from guessing
    assert em["naive_rag_reader"] == pytest.approx(sum(f or yes for f, yes in zip(found, says_yes)) / EPISODES)


def test_a_baseline_over_a_local_model_is_an_agent_by_name(tmp_path: Path) -> None:
    skip_without("agents", "torch", "transformers")
    agents = ["naive-rag:tiny", "protocol:hf:tiny", "direct:tiny"]
    table = main(["--protocols", "search-r1", "--agents", *agents, "--episodes", "2", "--max-new-tokens", "200",
                  "--output-dir", str(tmp_path)])
    assert [(row["agent"], row["decoding"], row["episodes"]) for row in table] == [(name, "greedy", 2) for name in agents]
    by_agent = {name: [e for e in _episodes(tmp_path) if e["agent"] == name] for name in agents}
    assert all(e["tool_calls"][0]["content"].strip() == e["question"] for e in by_agent["naive-rag:tiny"])
    assert all(e["tool_calls"] == [] and e["end_reason"] == "answer" for e in by_agent["direct:tiny"])
    assert all("Answer the given question." in e["text"] for e in by_agent["protocol:hf:tiny"])  # the environment's prompt


class _Completions(BaseHTTPRequestHandler):
    """A completions endpoint that always answers "Zarbo" (and stops, as if at the stop string)."""

    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        type(self).requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        data = json.dumps({"choices": [{"index": 0, "text": " Zarbo", "finish_reason": "stop"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[type[_Completions], str]]:
    handler = type("Handler", (_Completions,), {"requests": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def real_format(tmp_path: Path) -> tuple[Path, Path]:
    return write_real_files(tmp_path, [
        {"id": "q1", "question": "Which company did Bob Smith found?", "golden_answers": ["Zarbo"]},
        {"id": "q2", "question": "Vessa is the capital of which land?", "golden_answers": ["Norland"]},
    ])


def test_a_baseline_over_an_endpoint_asks_it_the_baselines_prompts(
        endpoint: tuple[type[_Completions], str], real_format: tuple[Path, Path], tmp_path: Path) -> None:
    handler, url = endpoint
    questions, corpus = real_format
    table = main(["--dataset", str(questions), "--corpus", str(corpus), "--protocols", "search-r1",
                  "--agents", f"naive-rag:endpoint:{url}#fake-model", "--output-dir", str(tmp_path)])
    assert [(row["agent"], row["em"], row["searches"]) for row in table] == [(f"naive-rag:endpoint:{url}#fake-model", 0.5, 1.0)]
    assert [r["model"] for r in handler.requests] == ["fake-model"] * 2 and all(r["stop"] == ["\n\n"] for r in handler.requests)
    (prompt,) = [r["prompt"] for r in handler.requests if "Question: Which company did Bob Smith found?" in r["prompt"]]
    assert prompt.startswith("Answer the question with a short answer") and prompt.endswith("Answer:")
    assert "Passages:\nDoc 1(Title: Zarbo) Zarbo is a company founded by Bob Smith." in prompt  # the environment's results


def test_oracle_passages_is_not_played_on_a_dataset_without_gold_passages_and_the_report_says_why(
        endpoint: tuple[type[_Completions], str], real_format: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    handler, url = endpoint
    questions, corpus = real_format
    oracle, rag = f"oracle-passages:endpoint:{url}#m", f"naive-rag:endpoint:{url}#m"
    table = main(["--dataset", str(questions), "--corpus", str(corpus), "--protocols", "search-r1",
                  "--agents", oracle, rag, "--output-dir", str(tmp_path)])
    assert [row["agent"] for row in table] == [rag]  # the other agent's row is played and kept
    assert len(handler.requests) == 2  # the oracle asked nothing
    reason = f"not played: {oracle} on {table[0]['dataset']} (example 'q1' has no gold passages"
    assert reason in (tmp_path / "results.md").read_text(encoding="utf-8")
    assert reason in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("direct", "give direct:LLM, where LLM is smollm2, tiny, a model folder, hf:MODEL or endpoint:URL#MODEL"),
        ("cot:/no/such/folder", "is not an existing model folder"),
        ("ircot:hf:", "give hf:MODEL"),
        ("protocol:endpoint:localhost:8000#m", "is not an http(s) URL"),
        ("oracle-passages:endpoint:http://localhost:8000/v1", "give endpoint:URL#MODEL"),
    ],
)
def test_bad_baseline_specs_are_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_agent(spec)
