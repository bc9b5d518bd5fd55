"""``python -m agents.train --help`` marks exactly the settings a resume may change, read from the
``metadata=RESUME_FREE`` of their fields, in every group and for every choice of algorithm, rollout engine
and backend: no list of them is kept by hand to fall behind the fields."""
from __future__ import annotations

import dataclasses
import re

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "jsonargparse")
from agents.learners import ALGORITHMS  # noqa: E402
from agents.rollout.engines import ENGINES  # noqa: E402
from agents.train import parse_config  # noqa: E402
from agents.training.backends.base import BACKENDS  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.resume import FREE_NOTE  # noqa: E402
from tests.agents.training.tiny import ProbedGRPO  # noqa: E402



def _help(capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, str]:
    """Each ``--flag``'s help text in ``--help`` for these choices (up to the next flag), whitespace collapsed."""
    with pytest.raises(SystemExit) as exit_:
        parse_config([*flags, "--help"])
    assert exit_.value.code == 0
    blocks = re.split(r"\n  (?=--)", capsys.readouterr().out)
    return {block.split()[0]: " ".join(block.split()) for block in blocks[1:] if block.startswith("--")}


def _declared(config: TrainConfig) -> dict[str, bool]:
    """``{"--group.field": declared free}`` for every field of every group of ``config``."""
    return {f"--{group.name}.{f.name}": bool(f.metadata.get("resume_free"))
            for group in dataclasses.fields(config) if dataclasses.is_dataclass(getattr(config, group.name))
            for f in dataclasses.fields(getattr(config, group.name))}


def _check_marks(flags: dict[str, str], declared: dict[str, bool]) -> None:
    marked = {flag for flag, text in flags.items() if FREE_NOTE in text}
    free = {flag for flag, is_free in declared.items() if is_free}
    assert free <= flags.keys(), f"free settings missing from --help: {sorted(free - flags.keys())}"
    assert marked == free, f"marked but not free: {sorted(marked - free)}; free but not marked: {sorted(free - marked)}"


def test_help_marks_every_setting_declared_free_and_no_other(capsys):
    flags = _help(capsys)
    declared = _declared(TrainConfig())
    _check_marks(flags, declared)
    assert {"--run.steps", "--run.resume", "--eval.every", "--rollout.env_worker"} <= {f for f in flags if FREE_NOTE in flags[f]}
    assert FREE_NOTE not in flags["--run.seed"] and FREE_NOTE not in flags["--optim.learning_rate"]
    assert FREE_NOTE not in flags["--algo"] and FREE_NOTE not in flags["--config"]


@pytest.mark.parametrize("flag", ["--algo", "--rollout.engine", "--run.backend"])
def test_each_choices_own_options_are_marked_from_their_fields(flag, capsys):
    registry = {"--algo": ALGORITHMS, "--rollout.engine": ENGINES, "--run.backend": BACKENDS}[flag]
    for name in sorted({*registry, *registry.built_in}):  # the built-in ones too, imported on first use
        config = TrainConfig(name) if flag == "--algo" else TrainConfig().updated({flag[2:]: name})
        _check_marks(_help(capsys, flag, name), _declared(config))


def test_a_registered_algorithms_free_setting_is_marked(monkeypatch, capsys):
    monkeypatch.setitem(ALGORITHMS, ProbedGRPO.name, ProbedGRPO)
    flags = _help(capsys, "--algo", ProbedGRPO.name)
    assert FREE_NOTE in flags["--algorithm.probe_every"]
    _check_marks(flags, _declared(TrainConfig(ProbedGRPO.name)))
