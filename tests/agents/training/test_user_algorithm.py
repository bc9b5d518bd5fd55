"""An algorithm of a user's own module is reachable as the built-in ones are: ``--import MODULE --algo
NAME`` on the command line, and ``TrainConfig.from_dict({"algo": NAME, ...})`` in Python.

The algorithm is defined below; the command line imports this very module by its import path."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")

from agents.learners import ALGORITHMS, Algorithm, AlgorithmConfig, lookup_algorithm, register_algorithm  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402

NAME = "test-centred-pg"


@dataclass
class CentredPGConfig(AlgorithmConfig):
    """Attributes:
        baseline: subtracted from every score.
    """

    group_size: int = 2
    kl_coef: float = 0.0
    baseline: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.baseline <= 1.0:
            raise ValueError(f"baseline must be in [0, 1], got {self.baseline}")


@register_algorithm
class CentredPG(Algorithm):
    """Score minus a constant baseline on every trained token."""

    name = NAME
    config_class = CentredPGConfig
    config: CentredPGConfig
    #: Advantage computations of this class (the command line's run counts them).
    advantage_calls = 0

    def compute_advantages(self, batch):
        type(self).advantage_calls += 1
        centred = (batch.scores.to(batch.token_rewards.dtype) - self.config.baseline)[:, None]
        batch.advantages = centred * batch.trained_mask
        return self._advantage_stats(batch, None)


@pytest.fixture
def fresh_module():
    """Neither this module nor its algorithm is known before the test (so ``--import`` has the work to
    do); after it, the registry entry is removed and the module put back."""
    this = sys.modules[__name__]
    ALGORITHMS.pop(NAME, None)
    sys.modules.pop(__name__)
    yield
    ALGORITHMS.pop(NAME, None)
    imported = sys.modules.get(__name__)
    sys.modules[__name__] = this
    assert imported is not this


def test_the_command_line_imports_and_trains_a_users_algorithm(tmp_path, fresh_module, capsys):
    import agents.train

    with pytest.raises(ValueError, match=f"unknown algorithm '{NAME}'"):
        lookup_algorithm(NAME)
    status = agents.train.main([
        "--import", __name__, "--algo", NAME, "--algorithm.baseline", "0.25", "--algorithm.group_size", "2",
        "--run.steps", "2", "--rollout.questions_per_step", "2", "--env.max_new_tokens", "16",
        "--data.world_size", "30", "--eval.questions", "0", "--run.report_to", "[]", "--run.progress", "false",
        "--run.output_dir", str(tmp_path),
    ])
    out = capsys.readouterr()
    assert status == 0, out.err
    assert out.out.splitlines()[0] == f"{NAME}: 2 of 2 steps"
    registered = lookup_algorithm(NAME)
    assert registered.__module__ == __name__ and registered is sys.modules[__name__].CentredPG
    assert registered is not CentredPG  # the command line's import registered it anew
    assert registered.advantage_calls == 2  # one advantage computation per step
    import json

    written = json.loads((tmp_path / "config.json").read_text())
    assert written["algo"] == NAME and written["algorithm"]["baseline"] == 0.25


def test_a_config_mapping_names_a_registered_users_algorithm():
    register_algorithm(CentredPG, replace=True)
    try:
        config = TrainConfig.from_dict({"algo": NAME, "algorithm": {"baseline": 0.75}, "run": {"steps": 3}})
        assert isinstance(config.algorithm, CentredPGConfig) and config.algorithm.baseline == 0.75
        assert config.algorithm.group_size == 2 and config.run.steps == 3
        assert TrainConfig.from_dict(config.as_dict()) == config
        with pytest.raises(ValueError, match=r"^baseline must be in \[0, 1\], got 2$"):
            TrainConfig.from_dict({"algo": NAME, "algorithm": {"baseline": 2}})
        with pytest.raises(ValueError, match="unknown config field 'algorithm.clip_ratio'"):
            TrainConfig.from_dict({"algo": NAME, "algorithm": {"clip_ratio": 0.2}})
    finally:
        ALGORITHMS.pop(NAME, None)
    with pytest.raises(ValueError, match=f"unknown algorithm '{NAME}'"):
        TrainConfig.from_dict({"algo": NAME})
