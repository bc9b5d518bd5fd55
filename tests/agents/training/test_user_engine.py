"""A rollout engine of a user's own module is reachable as the built-in ones are: one file and one
:func:`~agents.rollout.engines.register_engine` call, then ``rollout.engine: NAME`` in ``build_trainer``,
``--import MODULE --rollout.engine NAME`` on the training command line, and ``--import MODULE --agents
NAME:MODEL`` in ``benchmarks.evaluate``, each with the engine's own options.

The engines are defined below: the HF sampler over the policy, counting what is asked of them. The
command lines import this very module by its import path."""
from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")

from agents.rollout.engines import DEFAULT_TIS_CAP, ENGINES, EngineSetup, RolloutEngine, lookup_engine, register_engine  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from tests.agents.training.tiny import records, run, small_config  # noqa: E402

NAME = "test-toy"
#: The same engine, declaring that its log-probs are not the trainer's (as vLLM's are not).
SEPARATE = "test-toy-separate"


@dataclass
class ToyEngineOptions:
    """Attributes:
        label: kept by the engine, to show that the run's ``engine`` group reaches it.
    """

    label: str = "default"


class ToyEngine:
    """The HF sampler over the policy; ``calls`` counts each method's calls (``step``: the backend's
    optimiser steps, seen through the post-step hook that :meth:`attach` adds)."""

    logprobs_are_trainers = True
    decodes_trained_policy = True
    needs_policy = True
    reuse_logprobs = False
    #: Every engine built, in order (a command line's run builds its own in the module it imported).
    built: list[ToyEngine] = []

    def __init__(self, policy: Any, options: ToyEngineOptions, temperature: float, top_p: float) -> None:
        self.policy, self.options, self.temperature, self.top_p = policy, options, temperature, top_p
        self.calls: Counter[str] = Counter()
        type(self).built.append(self)

    @classmethod
    def build(cls, options: ToyEngineOptions, setup: EngineSetup) -> ToyEngine:
        return cls(setup.policy, options, setup.temperature, setup.top_p)

    def agent(self, *, greedy: bool, seed: int, first_row: int = 0) -> HFSampler:
        self.calls["agent"] += 1
        return HFSampler(self.policy, temperature=self.temperature, top_p=self.top_p, greedy=greedy, seed=seed,
                         first_row=first_row)

    def attach(self, backend: Any) -> ToyEngine:
        self.calls["attach"] += 1
        backend.add_post_step_hook(self._after_step)
        return self

    def _after_step(self) -> None:
        self.calls["step"] += 1

    def sync(self) -> None:
        self.calls["sync"] += 1

    def sleep(self) -> None:
        self.calls["sleep"] += 1

    def wake_up(self) -> None:
        self.calls["wake_up"] += 1

    def close(self) -> None:
        self.calls["close"] += 1


class SeparateToyEngine(ToyEngine):
    """The toy engine, its log-probs declared its own: truncated importance sampling is on by default."""

    logprobs_are_trainers = False


register_engine(NAME, ToyEngine, options=ToyEngineOptions)
register_engine(SEPARATE, SeparateToyEngine, options=ToyEngineOptions)


def test_the_toy_engine_is_a_rollout_engine():
    assert isinstance(ToyEngine(None, ToyEngineOptions(), 1.0, 1.0), RolloutEngine)
    assert lookup_engine(NAME).default_tis_cap == 0.0 and lookup_engine(SEPARATE).default_tis_cap == DEFAULT_TIS_CAP


def test_build_trainer_trains_and_evaluates_with_a_registered_engine(tmp_path):
    config = small_config("grpo", tmp_path, {"rollout.engine": NAME, "engine.label": "python"})
    ToyEngine.built.clear()
    trainer, result = run(config)
    assert result.steps_run == 2
    engine = trainer.engine
    assert ToyEngine.built == [engine] and engine.options == ToyEngineOptions("python") and engine.policy is trainer.policy
    steps = [r for r in records(tmp_path / "metrics.jsonl") if "updates/applied" in r]
    optimiser_steps = sum(r["updates/applied"] + r["updates/skipped"] for r in steps)
    # one rollout per step; the start and final evaluations, greedy and sampled; one wake-up per evaluation;
    # closed once when the trainer closes its environments
    assert engine.calls == Counter(attach=1, agent=2 + 2 * 2, wake_up=2, step=optimiser_steps, close=1), engine.calls
    assert optimiser_steps == 2 * 4  # two passes of two mini-batches per step: the hook saw each one
    assert trainer.algorithm.config.tis_cap == 0.0  # the engine's log-probs are the trainer's: no correction
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rollout"]["engine"] == NAME and written["engine"] == {"label": "python"}


def test_an_engines_default_tis_cap_reaches_the_algorithm_and_not_the_config(tmp_path):
    config = small_config("grpo", tmp_path, {"rollout.engine": SEPARATE, "run.steps": 1, "eval.questions": 0,
                                             "optim.update_epochs": 1, "optim.mini_batch_size": 0})
    trainer, _ = run(config)
    assert trainer.algorithm.config.tis_cap == DEFAULT_TIS_CAP and trainer.algorithm.config is not config.algorithm
    assert config.algorithm.tis_cap is None
    assert json.loads((tmp_path / "config.json").read_text())["algorithm"]["tis_cap"] is None
    step = records(tmp_path / "metrics.jsonl")[-1]
    assert "rollout_correction/weight" in step  # the correction ran against the engine's log-probs


@pytest.fixture
def fresh_module():
    """Neither this module nor its engines are known before the test (so ``--import`` has the work to do);
    after it, the registry entries are removed and the module put back."""
    this = sys.modules[__name__]
    for name in (NAME, SEPARATE):
        ENGINES.pop(name, None)
    sys.modules.pop(__name__)
    yield
    imported = sys.modules.get(__name__)
    sys.modules[__name__] = this
    register_engine(NAME, ToyEngine, options=ToyEngineOptions)
    register_engine(SEPARATE, SeparateToyEngine, options=ToyEngineOptions)
    assert imported is not this


def test_the_command_line_imports_and_trains_with_a_users_engine(tmp_path, fresh_module, capsys):
    import agents.train

    with pytest.raises(ValueError, match=f"unknown rollout.engine '{NAME}'"):
        lookup_engine(NAME)
    status = agents.train.main([
        "--import", __name__, "--rollout.engine", NAME, "--engine.label", "cli", "--algorithm.group_size", "2",
        "--run.steps", "2", "--rollout.questions_per_step", "2", "--env.max_new_tokens", "16",
        "--data.world_size", "30", "--eval.questions", "0", "--run.report_to", "[]", "--run.progress", "false",
        "--run.output_dir", str(tmp_path),
    ])
    out = capsys.readouterr()
    assert status == 0, out.err
    registered = lookup_engine(NAME).engine
    assert registered.__module__ == __name__ and registered is not ToyEngine  # the command line's import registered it
    [engine] = registered.built
    assert engine.options.label == "cli" and engine.calls["agent"] == 2 and engine.calls["attach"] == 1
    assert json.loads((tmp_path / "config.json").read_text())["engine"] == {"label": "cli"}


def test_the_command_line_refuses_an_option_the_engine_lacks(tmp_path, capsys):
    import agents.train

    status = agents.train.main(["--import", __name__, "--rollout.engine", NAME, "--engine.memory_fraction", "0.5",
                                "--run.output_dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "engine.memory_fraction" in err[0], err


def test_the_evaluation_harness_plays_a_users_engine_as_hf_plays_the_same_model(tmp_path):
    from benchmarks.evaluate import main

    ToyEngine.built.clear()
    out = tmp_path / "run"
    table = main(["--import", __name__, "--protocols", "search-r1", "--agents", f"{NAME}:tiny", "hf:tiny",
                  "--episodes", "2", "--max-new-tokens", "8", "--engine-option", f"{NAME}.label=eval", "--output-dir", str(out)])
    [engine] = ToyEngine.built
    assert engine.options.label == "eval" and engine.calls == Counter(agent=1, close=1), engine.calls
    toy, hf = table
    assert toy["agent"] == f"{NAME}:tiny" and toy["decoding"] == hf["decoding"] == "greedy"
    assert {k: v for k, v in toy.items() if k not in ("agent", "seconds")} == \
        {k: v for k, v in hf.items() if k not in ("agent", "seconds")}
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    by_agent = {agent: [e["text"] for e in episodes if e["agent"] == agent] for agent in (f"{NAME}:tiny", "hf:tiny")}
    assert by_agent[f"{NAME}:tiny"] == by_agent["hf:tiny"] and len(by_agent["hf:tiny"]) == 2
    settings = json.loads((out / "settings.json").read_text())
    assert settings["engine_options"] == {NAME: {"label": "eval"}}


@pytest.mark.parametrize(("argv", "message"), [
    (["--engine-option", f"{NAME}.size=3"], f"engine {NAME} has no option size"),
    (["--engine-option", "nosuch.label=x"], "nosuch"),
    (["--engine-option", "label=x"], "give ENGINE.FIELD=VALUE"),
    (["--engine-option", "vllm.memory_fraction=2"], "engine.memory_fraction must be in (0, 1]"),
    (["--agents", "endpoint"], "give endpoint:URL#MODEL"),
    (["--agents", f"{NAME}"], f"give {NAME}:MODEL"),
    (["--import", "tests.no_such_module"], "--import tests.no_such_module"),
])
def test_bad_engine_arguments_of_the_harness_are_one_line(argv, message, capsys):
    from benchmarks.evaluate import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--import", __name__, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and message in err[-1], err
