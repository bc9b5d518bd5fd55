"""The answer turn (the step that closes an answer and scores it): ours against GEM's, side by side.

Ours against GEM's ``ToolEnvWrapper.step``, on the same text, in rounds that alternate so both run under
the same load.

The turn: the agent's last text, ``<answer> X </answer>`` by default, after a prompt.
GEM (axon-rl's General Experience Maker) takes it as text: its ``ToolEnvWrapper`` offers it to its
``SearchTool`` (no ``<search>`` in it), then steps its ``QaEnv``, which extracts the last answer and
scores exact match. Ours takes token ids: ``env.step`` on the ids of the same text as one chunk (what an
LLM's generation up to the stop string is), on ``gym.make("SearchQA-v0")`` with the search-r1 protocol,
whose reward is the same exact match; it appends the ids, finds the close tag in their bytes, records the
trajectory and computes the reward. Both score the same question and gold answer (correct), and every
repetition steps an episode just reset, the reset left out of the timed region.

Figures, each a list with one value per round (the median of that round's repetitions):

- ``answer_turn``: our answer turn on the environment ``gym.make`` returns, µs;
- ``answer_turn_unwrapped``: the same on ``env.unwrapped`` (without Gymnasium's wrappers), µs;
- ``gem_answer_turn``: GEM's, µs (when GEM runs);
- ``chunk_3``: our step on a 3-token chunk that closes no tag, µs;
- ``token``: our step on one token that closes no tag (the per-token path), µs;

and ``ratio`` (``ratio_unwrapped``), ours over GEM's answer turn per round (below 1: ours is faster).

GEM runs in a virtualenv of its own (``bash .ci/gem_venv.sh`` builds it, once, in a few minutes: gem-llm
pins versions of nltk, reasoning-gym and msgspec), as a subprocess that times its steps and reports them
as JSON (:mod:`benchmarks.peers.gem_answer_turn`). ``--gem build`` (the default) builds the venv when it
is missing, ``--gem existing`` uses it only when it is there, ``--gem off`` measures ours alone.

Run: ``python -m benchmarks.answer_turn`` (``--quick`` for a smoke run; ``--output-dir DIR`` writes
``answer_turn.json`` and ``answer_turn.md``). :func:`measure` returns the figures for other scripts.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import gymnasium as gym

import search_env  # noqa: F401  (registers SearchQA-v0)
from benchmarks.common.machine import machine_info, machine_line
from benchmarks.common.peer_venvs import venv_dir
from search_env.console import HelpFormatter
from search_env.data.example import QAExample

__all__ = ["TEXT", "QUESTION", "ANSWERS", "GemPeer", "gem_venv_python", "measure", "format_markdown", "main"]

_REPO = Path(__file__).resolve().parents[1]
_PEER = _REPO / "benchmarks" / "peers" / "gem_answer_turn.py"
_VENV_SCRIPT = _REPO / ".ci" / "gem_venv.sh"

TEXT = "<answer> Zarbo </answer>"  #: the agent's answer turn (the default)
QUESTION = "Who founded the company that built the Arvel bridge?"  #: the question both environments ask
ANSWERS = ["Zarbo"]  #: its gold answer: the answer turn is correct on both sides
PLAIN = " the city of"  #: ordinary text, no tag: the 3-token chunk and the single token are taken from it

FIGURES = {
    "answer_turn": "ours: answer turn (chunk of ids), gym.make env",
    "answer_turn_unwrapped": "ours: answer turn, env.unwrapped",
    "gem_answer_turn": "GEM: ToolEnvWrapper.step on the answer text",
    "chunk_3": "ours: 3-token chunk, no tag",
    "token": "ours: 1 token, no tag",
}
"""Each figure's label. ``answer_turn_unwrapped`` leaves out the wrappers ``gym.make`` adds (Gymnasium's
order enforcing and passive checker, whose steps are pass-throughs after the first): the environment's
own cost, what batched stepping pays."""


def _timed(step: Callable[[], Any], before: Callable[[], Any], repeats: int) -> float:
    """Median µs of ``step()`` over ``repeats`` calls, each after an untimed ``before()``."""
    times = []
    clock = time.perf_counter
    for _ in range(repeats):
        before()
        start = clock()
        step()
        times.append(clock() - start)
    return statistics.median(times) * 1e6


class _Ours:
    """Our environment, each timed step taken from the same point: an episode of :data:`QUESTION` just
    reset for the answer turn, an episode with room left in its token budget for the others."""

    def __init__(self, text: str) -> None:
        self.env = gym.make("SearchQA-v0")
        self.raw = self.env.unwrapped
        codec = self.raw.codec
        self.example = QAExample(id="answer-turn", question=QUESTION, golden_answers=list(ANSWERS))
        self.answer_ids = codec.encode(text)
        plain = codec.encode(PLAIN)
        if len(plain) < 3:
            raise ValueError(f"{PLAIN!r} encodes to fewer than 3 tokens")
        self.chunk, self.token = plain[:3], plain[0]
        self.reset()
        _, reward, terminated, _, info = self.env.step(self.answer_ids)
        if not terminated or info.get("end_reason") != "answer" or reward != 1.0:
            raise RuntimeError(f"our answer turn did not end the episode with a correct answer: reward {reward}, info {info}")
        self._left = 0

    def reset(self) -> None:
        self.env.reset(options={"example": self.example})

    def answer_turn_us(self, repeats: int) -> float:
        return _timed(lambda: self.env.step(self.answer_ids), self.reset, repeats)

    def answer_turn_unwrapped_us(self, repeats: int) -> float:
        return _timed(lambda: self.raw.step(self.answer_ids), self.reset, repeats)

    def _room_for(self, cost: int) -> Callable[[], None]:
        """An untimed ``before`` that resets the episode when fewer than ``cost`` agent tokens are left of
        half the token budget, so that no timed step ends the episode."""
        self._left = 0
        budget = self.raw.max_new_tokens // 2

        def before() -> None:
            if self._left < cost:
                self.reset()
                self._left = budget
            self._left -= cost

        return before

    def chunk_us(self, repeats: int) -> float:
        return _timed(lambda: self.env.step(self.chunk), self._room_for(len(self.chunk)), repeats)

    def token_us(self, repeats: int) -> float:
        return _timed(lambda: self.env.step(self.token), self._room_for(1), repeats)

    def close(self) -> None:
        self.env.close()


def gem_venv_python(mode: str) -> tuple[str | None, str]:
    """The GEM virtualenv's Python and a line saying where it came from, or None and why there is none.
    ``mode``: ``build`` (build the venv with ``.ci/gem_venv.sh`` when missing), ``existing`` (only a venv
    already built at ``$SEARCHQA_GEM_VENV`` or the script's default place) or ``off``."""
    if mode == "off":
        return None, "GEM left out (--gem off)"
    if mode == "build":
        run = subprocess.run(["bash", str(_VENV_SCRIPT)], capture_output=True, text=True, timeout=1800)
        if run.returncode != 0:
            last = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
            return None, f"building GEM's virtualenv failed: {last}"
        venv = Path(run.stdout.strip().splitlines()[-1])
    else:
        venv = venv_dir("SEARCHQA_GEM_VENV", "gem-venv")
    python = venv / "bin" / "python"
    if not python.is_file():
        return None, f"GEM's virtualenv is not built at {venv} (bash .ci/gem_venv.sh builds it)"
    return str(python), f"GEM from {venv}"


class GemPeer:
    """GEM's side, a subprocess in GEM's venv (:mod:`benchmarks.peers.gem_answer_turn`): :meth:`round`
    has it time ``repeats`` answer turns and returns their median in µs."""

    def __init__(self, python: str, text: str) -> None:
        spec = json.dumps({"question": QUESTION, "answers": ANSWERS, "text": text})
        self._errors = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty stderr cannot block the child
        self.process = subprocess.Popen([python, str(_PEER), spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._errors, text=True, cwd=_REPO)
        try:
            hello = self._read()
        except BaseException:
            self.close()
            raise
        self.version, self.python = hello["gem_version"], hello["python"]

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            self._errors.seek(0)
            error = self._errors.read()
            raise RuntimeError(f"GEM's side stopped (exit {self.process.returncode}): {error.strip()[-2000:]}")
        return json.loads(line)

    def round(self, repeats: int) -> float:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"repeats": repeats}) + "\n")
        self.process.stdin.flush()
        return statistics.median(self._read()["times_s"]) * 1e6

    def close(self) -> None:
        """End the subprocess (it exits at the end of its input)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:  # it has stopped already
                pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._errors.close()


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(*, rounds: int = 7, repeats: int = 2000, text: str = TEXT, gem: str = "build") -> dict[str, Any]:
    """Measure the figures of the module docstring in ``rounds`` rounds of ``repeats`` repetitions each
    (after one untimed warm-up round), the figures taken in turn within a round, in reverse order every
    other round.

    Returns ``{"figures": {name: {"label", "unit", "values", "median", "min", "max"}}, "ratio": {"values",
    "median", "min", "max"} or None, "ratio_unwrapped": the same for the unwrapped env, "gem": {"status",
    "version", "python"}, "settings": {...}, "machine": {...}}``; ``values`` has one entry per round (that
    round's median). ``gem``: see :func:`gem_venv_python`; GEM's figure and the ratios are absent (None)
    when GEM does not run, and ``gem["status"]`` says why.
    """
    python, status = gem_venv_python(gem)
    ours = _Ours(text)
    try:
        peer = GemPeer(python, text) if python is not None else None
    except BaseException:
        ours.close()
        raise
    steps: dict[str, Callable[[int], float]] = {
        "answer_turn": ours.answer_turn_us, "answer_turn_unwrapped": ours.answer_turn_unwrapped_us,
        "chunk_3": ours.chunk_us, "token": ours.token_us,
    }
    if peer is not None:
        steps["gem_answer_turn"] = peer.round
    order = [name for name in FIGURES if name in steps]
    values: dict[str, list[float]] = {name: [] for name in order}
    try:
        for r in range(rounds + 1):
            gc.collect()
            for name in (order if r % 2 == 0 else order[::-1]):
                value = steps[name](repeats)
                if r > 0:  # round 0 warms both sides up
                    values[name].append(value)
    finally:
        ours.close()
        if peer is not None:
            peer.close()
    figures = {name: {"label": FIGURES[name], "unit": "µs", "values": v, **_summary(v)} for name, v in values.items()}

    def ratio(name: str) -> dict[str, Any] | None:
        if peer is None:
            return None
        per_round = [a / g for a, g in zip(values[name], values["gem_answer_turn"])]
        return {"values": per_round, **_summary(per_round)}

    return {
        "figures": figures,
        "ratio": ratio("answer_turn"),
        "ratio_unwrapped": ratio("answer_turn_unwrapped"),
        "gem": {"status": status, "version": peer.version if peer else None, "python": peer.python if peer else None},
        "settings": {"rounds": rounds, "repeats": repeats, "text": text, "question": QUESTION, "answers": ANSWERS,
                     "protocol": "search-r1", "answer_ids": len(ours.answer_ids)},
        "machine": machine_info(),
    }


def format_markdown(result: dict[str, Any]) -> str:
    """The result as a markdown table (median and min-max over rounds), with the ratio and the settings."""
    settings = result["settings"]
    lines = [
        "# The answer turn, ours against GEM",
        "",
        f"Machine: {machine_line(result['machine'])}.",
        f"Text: `{settings['text']}` ({settings['answer_ids']} ids for ours); {settings['rounds']} rounds of "
        f"{settings['repeats']} repetitions, alternating; each value is a round's median. GEM: {result['gem']['status']}"
        + (f", gem-llm {result['gem']['version']} (Python {result['gem']['python']})." if result["gem"]["version"] else "."),
        "",
        "| figure | median µs | min-max µs |",
        "| --- | --- | --- |",
    ]
    for figure in result["figures"].values():
        lines.append(f"| {figure['label']} | {figure['median']:.2f} | {figure['min']:.2f}-{figure['max']:.2f} |")
    lines.append("")
    if result["ratio"] is None:
        lines.append("No ratio: GEM did not run.")
    for key, env in (("ratio", "gym.make env"), ("ratio_unwrapped", "env.unwrapped")):
        ratio = result[key]
        if ratio is not None:
            lines.append(f"Ours / GEM, answer turn, {env}: {ratio['median']:.2f} (rounds {ratio['min']:.2f}-{ratio['max']:.2f}; "
                         "below 1: ours is faster).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The command: measures, prints the markdown table, writes the files, and returns what :func:`measure` returns."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.answer_turn", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 7; 2 with --quick)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repetitions per round and figure (default 2000; 200 with --quick)")
    parser.add_argument("--text", default=TEXT, help=f"the agent's answer turn; it must answer {ANSWERS[0]!r}, the gold answer")
    parser.add_argument("--gem", choices=["build", "existing", "off"], default="build",
                        help="GEM's venv: build it when missing, use it only when built, or leave GEM out")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds and repetitions")
    parser.add_argument("--output-dir", type=Path, default=None, help="write answer_turn.json and answer_turn.md here")
    args = parser.parse_args(argv)
    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 7)
    repeats = args.repeats if args.repeats is not None else (200 if args.quick else 2000)
    result = measure(rounds=rounds, repeats=repeats, text=args.text, gem=args.gem)
    report = format_markdown(result)
    print(report, end="")
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
        (args.output_dir / "answer_turn.json").write_text(text, encoding="utf-8")
        (args.output_dir / "answer_turn.md").write_text(report, encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
