"""GEM's answer turn, timed for :mod:`benchmarks.answer_turn`: the peer side, run in GEM's own virtualenv.

GEM (axon-rl's General Experience Maker, PyPI ``gem-llm``) takes text actions. Its search agent is a
``QaEnv`` (one question, exact-match reward on the last ``<answer>…</answer>``) inside a
``ToolEnvWrapper`` with a ``SearchTool``: each ``step`` first offers the text to the tool (which looks for
``<search>…</search>``) and, when no tool takes it, steps the QA environment, which extracts and scores
the answer. That ``ToolEnvWrapper.step`` on the answer's text is what is timed here, each repetition on
an episode just reset (the reset is outside the timed region). The text holds no search call, so the
tool never reaches its server: its URL points at a closed local port and is never contacted.

Run as a script by the venv's Python (``.ci/gem_venv.sh`` builds it); it imports only GEM, ``datasets``
(GEM's QA environment is built on a ``datasets.Dataset``) and the standard library. It speaks JSON
lines: the first argument is a JSON object ``{"question", "answers", "text"}``; it prints
``{"ready": true, "gem_version", "python"}``, then for each request line ``{"repeats": n}`` one line
``{"times_s": [...]}`` (one per repetition, in seconds), and exits at the end of its input. The caller
alternates these rounds with its own measurements, so both sides run under the same machine load.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
from gem.envs.qa_env import QaEnv  # noqa: E402
from gem.tools.search_tool import SearchTool  # noqa: E402
from gem.tools.tool_env_wrapper import ToolEnvWrapper  # noqa: E402

#: Rows of the one-question dataset: GEM's QaEnv reshuffles its dataset when an epoch ends, so many copies
#: of the question keep resets cheap (they are untimed, but the benchmark's wall time counts them).
ROWS = 4096


def build(question: str, answers: list[str]) -> ToolEnvWrapper:
    """GEM's QA environment on ``question`` behind its tool wrapper with a search tool, as its search
    examples build it."""
    dataset = datasets.Dataset.from_dict({"question": [question] * ROWS, "answer": [answers] * ROWS})
    env = QaEnv(dataset=dataset, question_key="question", answer_key="answer")
    return ToolEnvWrapper(env, tools=[SearchTool(search_url="http://127.0.0.1:9/retrieve", topk=3)], max_tool_uses=10)


def time_steps(env: ToolEnvWrapper, text: str, repeats: int) -> list[float]:
    """Seconds of ``env.step(text)`` on a freshly reset episode, ``repeats`` times."""
    times = []
    clock = time.perf_counter
    for _ in range(repeats):
        env.reset()
        start = clock()
        env.step(text)
        times.append(clock() - start)
    return times


def main() -> None:
    logging.disable(logging.INFO)  # gem's import sets up INFO logging; each reset would not log, but be sure
    spec = json.loads(sys.argv[1])
    env = build(spec["question"], list(spec["answers"]))
    env.reset()
    _, reward, terminated, _, _ = env.step(spec["text"])
    if not terminated or reward != 1.0:  # the same answer turn as ours: it ends the episode, correct
        raise SystemExit(f"GEM did not score the answer turn as a correct final answer: reward {reward}, terminated {terminated}")
    from importlib.metadata import version

    print(json.dumps({"ready": True, "gem_version": version("gem-llm"), "python": sys.version.split()[0]}), flush=True)
    gc.collect()
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps({"times_s": time_steps(env, spec["text"], int(request["repeats"]))}), flush=True)


if __name__ == "__main__":
    main()
