"""The warm-start cache shared by the benchmarks (:mod:`benchmarks.common.warm_start_cache`): its key holds
every setting but those known not to matter, and a warm start made once is the trainer's own, loaded back
by a command that builds its own trainer or names the folder as its model."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import skip_without

AGENTS_EXTRA = ("agents", "torch", "transformers", "yaml")

#: The demo recipe made tiny: a 50-question world and a 2-step warm start.
TINY = ["warm_start.steps=2", "warm_start.examples=16", "warm_start.copy_steps=1", "data.world_size=50", "data.world_scale=1",
        "rollout.questions_per_step=2", "algorithm.group_size=2", "rollout.env_worker=false", "eval.questions=2"]


def _config(changes: dict[str, Any] | None = None) -> Any:
    skip_without(*AGENTS_EXTRA)
    from agents.training.config import TrainConfig

    return TrainConfig("grpo").updated({"warm_start.steps": 10, **(changes or {})})


@pytest.mark.parametrize("change", [{"run.device": "cuda"}, {"run.dtype": "bf16"}, {"optim.max_grad_norm": 0.5},
                                    {"run.seed": 1}, {"run.num_threads": 2}, {"warm_start.num_threads": 2},
                                    {"model.tiny_hidden": 32}, {"data.world_seed": 5}, {"env.max_new_tokens": 64},
                                    {"optim.micro_batch_size": 4}, {"optim.weight_decay": 0.1}, {"run.backend": "deepspeed"}])
def test_a_setting_that_changes_the_warm_starts_weights_changes_the_key(change: dict[str, Any]) -> None:
    from benchmarks.common.warm_start_cache import cache_key

    assert cache_key(_config(change)) != cache_key(_config())


def test_the_key_holds_the_device_auto_resolves_to(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from benchmarks.common.warm_start_cache import cache_key

    assert cache_key(_config())["run.device"] == "cpu"
    assert cache_key(_config({"run.device": "cpu"})) == cache_key(_config())  # the same weights here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cache_key(_config())["run.device"] == "cuda:0"


@pytest.mark.parametrize("change", [{"run.output_dir": "elsewhere"}, {"eval.every": 7}, {"eval.questions": 3},
                                    {"run.report_to": []}, {"run.steps": 3}, {"optim.learning_rate": 1e-3},
                                    {"rollout.temperature": 0.5}, {"warm_start.save_every": 2}])
def test_a_setting_that_does_not_matter_leaves_the_key_as_it_was(change: dict[str, Any]) -> None:
    from benchmarks.common.warm_start_cache import cache_key

    assert cache_key(_config(change)) == cache_key(_config())


def test_the_key_is_every_field_of_the_config_but_those_left_out() -> None:
    import torch

    from benchmarks.common.warm_start_cache import NOT_IN_KEY, cache_key

    config = _config({"rollout.engine": "vllm"})  # an engine whose options group has fields
    groups = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    fields = {name for name, group in groups.items() if not dataclasses.is_dataclass(group)}
    fields |= {f"{name}.{f.name}" for name, group in groups.items() if dataclasses.is_dataclass(group) for f in dataclasses.fields(group)}
    assert NOT_IN_KEY <= fields | set(groups)  # each name left out is a field or group: a renamed field is back in the key
    left_out = {name for name in fields if name in NOT_IN_KEY or name.split(".")[0] in NOT_IN_KEY}
    assert "engine.memory_fraction" in left_out and "optim.max_grad_norm" not in left_out
    key = cache_key(config)
    assert set(key) == (fields - left_out) | {"torch"}
    assert key["torch"] == torch.__version__ and key["optim.adam_betas"] == [0.9, 0.999]  # plain JSON values


def test_the_cached_warm_start_is_the_trainers_warm_start_saved_once_and_loaded_by_either_way(tmp_path: Path) -> None:
    skip_without(*AGENTS_EXTRA)
    import torch

    from agents.policies.loading import load_policy
    from agents.training.build import build_trainer
    from benchmarks.common.warm_start_cache import RECORD_FILE, cached_warm_start, warm_started
    from benchmarks.learning import demo_config

    config = demo_config([*TINY, f"run.output_dir={tmp_path / 'run'}"])
    made = cached_warm_start(config, tmp_path / "cache", log=lambda line: None)
    again = cached_warm_start(config, tmp_path / "cache", log=lambda line: None)
    other = cached_warm_start(config.updated({"run.seed": 1}), tmp_path / "cache", log=lambda line: None)
    assert (made.reused, again.reused, other.reused) == (False, True, False)
    assert again.policy_dir == made.policy_dir != other.policy_dir and made.stats["warm_start/steps"] == 2
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([made.digest, other.digest])  # no partial folders

    loaded = load_policy(str(made.policy_dir))
    trainer = build_trainer(config)  # the same warm start, in the trainer's own backend
    warm_started(trainer.backend, config, trainer.env, None)
    _assert_same_weights(trainer.policy.state_dict(), loaded.state_dict())
    text = "<search> who founded Zarbo </search><answer> Bob </answer>"
    assert loaded.codec.encode(text) == trainer.policy.codec.encode(text) and loaded.codec.eos_ids == trainer.policy.codec.eos_ids
    trainer.close_environments()

    # a trainer built with the cache loads the folder's weights into its own policy, making no new folder
    trainer = build_trainer(config.updated({"run.seed": 1}))
    fresh = {name: value.clone() for name, value in trainer.policy.state_dict().items()}
    warm_started(trainer.backend, config.updated({"run.seed": 1}), trainer.env, tmp_path / "cache")
    _assert_same_weights(trainer.policy.state_dict(), load_policy(str(other.policy_dir)).state_dict())
    assert any(not torch.equal(fresh[name], value) for name, value in trainer.policy.state_dict().items())
    assert len(list((tmp_path / "cache").iterdir())) == 2
    trainer.close_environments()

    record = made.policy_dir.parent / RECORD_FILE
    record.write_text(record.read_text().replace('"run.seed": 0', '"run.seed": 7'))
    with pytest.raises(ValueError, match="other settings"):
        cached_warm_start(config, tmp_path / "cache")



def _assert_same_weights(live: dict[str, Any], saved: dict[str, Any]) -> None:
    import torch

    assert saved and all(torch.equal(live[name], value) for name, value in saved.items())
