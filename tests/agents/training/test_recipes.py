"""The recipes in agents/configs/: each reads through the command line's own parser into a
:class:`~agents.training.config.TrainConfig` (so every key is a real field with a value of its type), names a
real protocol and real reward presets, leaves the model to the user (the seed systems' recipes), and carries
its reference's training settings, written out below from the reference scripts each recipe names:

* Search-R1: ``scripts/nq_hotpotqa/v0.2/train_grpo.sh`` / ``train_ppo.sh`` on its verl fork;
* R1-Searcher: ``scripts/llama_reinforce_plus_train_stage1.sh`` on its OpenRLHF fork (``group_norm``);
* R-Search: ``scripts/train_grpo_7b.sh`` on its verl fork;
* ReSearch: ``scripts/train/train.sh`` on its verl fork.

Warm-up is checked in training steps (ratio x ``run.steps``, rounded down as verl does), the unit the
references count it in.
"""
from __future__ import annotations

import dataclasses

import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, skip_without

skip_without("agents", "torch", "yaml", "jsonargparse")
import yaml  # noqa: E402

from agents.learners.config import warmup_steps  # noqa: E402
from agents.train import MISSING, parse_config  # noqa: E402
from rewards.registry import get as get_preset  # noqa: E402
from search_env.protocols import get_protocol  # noqa: E402

CONFIGS = REPO_ROOT / "agents" / "configs"
#: The real-model recipes: SmolLM2 on a CPU, and its GPU line (model left to the user).
REAL_RECIPES = ["real-smollm2", "real-qwen2.5-3b"]
SEED_RECIPES = ["r-search-grpo", "r1-searcher-grpo", "research-grpo", "search-r1-grpo", "search-r1-ppo"]

# verl's GRPO in Search-R1, R-Search and ReSearch: low_var_kl (k3) as a loss term, clamped to [-10, 10];
# clip 0.2; entropy bonus 0.001; masked token mean; AdamW(weight_decay 1e-2, betas (0.9, 0.999)).
_VERL_GRPO = dict(algo="grpo", group_size=5, learning_rate=1e-6, temperature=1.0, kl_coef=0.001, kl_estimator="k3",
                  kl_in_reward=False, kl_clamp=10.0, entropy_coef=0.001, loss_agg_mode="token-mean", clip_low=0.2,
                  clip_high=0.2, scale_rewards=True, weight_decay=0.01, adam_betas=(0.9, 0.999), max_grad_norm=1.0,
                  update_epochs=1)

PAPERS = {
    "search-r1-grpo": {
        **_VERL_GRPO, "protocol": "search-r1", "reward": "search-r1", "steps": 1005, "questions_per_step": 512,
        "warmup_training_steps": 286,  # lr_warmup_steps_ratio 0.285 x 1005 training steps
        "top_p": 0.95, "max_turns": 4, "top_k": 3, "mini_batch_size": 256, "eval_every": 100, "save_every": 100,
    },
    "search-r1-ppo": {
        "algo": "ppo", "protocol": "search-r1", "reward": "search-r1", "steps": 1005, "questions_per_step": 512,
        "group_size": 1, "learning_rate": 1e-6, "warmup_training_steps": 286, "temperature": 1.0, "top_p": 1.0,
        "max_turns": 4, "top_k": 3, "kl_coef": 0.001, "kl_estimator": "k1", "kl_in_reward": True, "kl_clamp": None,
        "entropy_coef": 0.001, "loss_agg_mode": "token-mean", "clip_low": 0.2, "clip_high": 0.2, "mini_batch_size": 256,
        "weight_decay": 0.01, "adam_betas": (0.9, 0.999), "max_grad_norm": 1.0, "update_epochs": 1,
        "critic": "separate", "critic_lr": 1e-5,
        "critic_warmup_training_steps": 15,  # critic.optim.lr_warmup_steps_ratio 0.015 x 1005 training steps
        "value_clip": 0.5, "gamma": 1.0, "lam": 1.0, "whiten_advantages": True, "eval_every": 100, "save_every": 100,
    },
    "r1-searcher-grpo": {
        "algo": "grpo", "protocol": "r1-searcher", "reward_stages": ["r1-searcher-stage1", "r1-searcher-stage2"],
        "group_size": 16, "learning_rate": 2e-6, "warmup_training_steps": 0, "temperature": 1.0, "top_p": 0.95,
        "max_turns": 8, "questions_per_step": 15, "mini_batch_size": 60, "kl_coef": 1e-4, "kl_estimator": "k1",
        "kl_in_reward": True, "kl_clamp": None, "entropy_coef": 0.0, "loss_agg_mode": "seq-mean-token-mean",
        "clip_low": 0.2, "clip_high": 0.2, "scale_rewards": True, "weight_decay": 0.0, "adam_betas": (0.9, 0.95),
        "max_grad_norm": 1.0, "update_epochs": 1,
    },
    "r-search-grpo": {
        **_VERL_GRPO, "protocol": "r-search", "reward": "r-search", "steps": 120, "questions_per_step": 256,
        "warmup_training_steps": 114,  # lr_warmup_steps_ratio 0.95 x 120 training steps
        "top_p": 0.95, "max_turns": 4, "top_k": 3, "mini_batch_size": 256, "eval_every": 15, "save_every": 15,
    },
    "research-grpo": {
        **_VERL_GRPO, "protocol": "research", "reward": "research", "questions_per_step": 256,
        "warmup_training_steps": 0, "top_p": 1.0,
        "mini_batch_size": 1280,  # ppo_mini_batch_size 256 questions x rollout.n 5
        "eval_every": 10, "save_every": 10,
    },
}

# The embedded demo (the README's main command), as benchmarks/learning.py's demo_config() set it.
DEMO = {
    "algo": "grpo", "model.name": "tiny", "model.tiny_layers": 2, "model.tiny_hidden": 96, "model.tiny_heads": 4,
    "model.tiny_head_dim": 32, "model.tiny_arch": "qwen2", "env.protocol": "search-r1-compact", "data.dataset": "synthetic", "data.world_seed": 10,
    "data.world_size": 60000, "data.world_scale": 500, "data.world_chain_only": True, "data.world_stem_tokens": 2,
    "data.bm25_stemmer": "light", "data.eval_world_seed": 11, "data.eval_new_words": True, "data.world_max_hops": 2,
    "env.max_new_tokens": 96, "env.max_context": 1024, "env.max_turns": 4, "env.top_k": 2,
    "rollout.questions_per_step": 8, "rollout.temperature": 0.7, "rollout.env_worker": True,
    "algorithm.group_size": 8, "algorithm.kl_coef": 0.0, "algorithm.entropy_coef": 0.0,
    "optim.learning_rate": 1e-4, "optim.micro_batch_size": 8,
    "warm_start.steps": 2600, "warm_start.copy_steps": 300, "warm_start.examples": 60000,
    "warm_start.learning_rate": 3e-3, "warm_start.second_hop_rate": 0.3, "warm_start.batch_size": 32,
    "warm_start.num_threads": None,
    "eval.questions": 100, "eval.every": 10, "eval.by_hops": True,
    "run.steps": 60, "run.seed": 0, "run.output_dir": "runs/demo", "run.report_to": [], "run.progress": None,
    "run.log_entropy": False,
}


def _recipe(name: str) -> Path:
    return CONFIGS / f"{name}.yaml"


def _config(name: str):
    return parse_config(["--config", str(_recipe(name)), "--model.name", "tiny"])


def _settings(config) -> dict:
    """The settings PAPERS names, read off a parsed config (warm-up in training steps)."""
    algo = config.algorithm
    out = {
        "algo": config.algo, "protocol": config.env.protocol, "reward": config.env.reward,
        "reward_stages": [preset for _, preset in config.env.reward_stages or []],
        "steps": config.run.steps, "questions_per_step": config.rollout.questions_per_step,
        "warmup_training_steps": warmup_steps(config.optim.warmup_steps, config.optim.warmup_ratio, config.run.steps),
        "temperature": config.rollout.temperature, "top_p": config.rollout.top_p, "max_turns": config.env.max_turns,
        "top_k": config.env.top_k, "mini_batch_size": config.optim.mini_batch_size,
        "learning_rate": config.optim.learning_rate, "weight_decay": config.optim.weight_decay,
        "adam_betas": config.optim.adam_betas, "max_grad_norm": config.optim.max_grad_norm,
        "update_epochs": config.optim.update_epochs, "eval_every": config.eval.every, "save_every": config.run.save_every,
    }
    out.update(vars(algo))
    if config.algo == "ppo":
        out["critic_warmup_training_steps"] = warmup_steps(algo.critic_warmup_steps, algo.critic_warmup_ratio, config.run.steps)
    return out


def _leaf_keys(mapping: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in mapping.items():
        if isinstance(value, dict):
            keys |= _leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.add(f"{prefix}{key}")
    return keys


def test_the_recipe_set():
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(SEED_RECIPES + ["demo", *REAL_RECIPES])
    assert set(PAPERS) == set(SEED_RECIPES)


@pytest.mark.parametrize("name", SEED_RECIPES)
def test_recipe_carries_its_papers_settings(name):
    settings = _settings(_config(name))
    expected = PAPERS[name]
    assert {key: settings[key] for key in expected} == expected


@pytest.mark.parametrize("name", SEED_RECIPES + ["demo", *REAL_RECIPES])
def test_every_recipe_key_is_a_field_and_names_real_parts(name):
    raw = yaml.safe_load(_recipe(name).read_text(encoding="utf-8"))
    config = _config(name) if raw["model"]["name"] == MISSING else parse_config(["--config", str(_recipe(name))])
    # Every key the recipe sets is a field of the parsed config (the parser refuses any other).
    parsed = _leaf_keys(config.as_dict())
    assert _leaf_keys(raw) - {"algo"} <= parsed, sorted(_leaf_keys(raw) - parsed)
    get_protocol(config.env.protocol)
    presets = [config.env.reward] if config.env.reward else []
    presets += [preset for _, preset in config.env.reward_stages or []]
    for preset in presets:
        get_preset(preset)


@pytest.mark.parametrize("name", SEED_RECIPES)
def test_seed_recipes_leave_the_model_to_the_user_and_name_their_sources(name):
    text = _recipe(name).read_text(encoding="utf-8")
    assert yaml.safe_load(text)["model"] == {"name": MISSING}
    with pytest.raises(ValueError, match=r"leaves model\.name to you"):
        parse_config(["--config", str(_recipe(name))])
    # Each setting carries a comment naming where its value comes from.
    uncommented = [line for line in text.splitlines()
                   if re.match(r"^\s*[a-z_]+:\s*\S", line) and "#" not in line]
    assert not uncommented, uncommented


def test_a_recipe_key_that_is_no_field_is_refused(tmp_path):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("algo: grpo\noptim:\n  learning_rat: 1.0e-6\n", encoding="utf-8")
    with pytest.raises(ValueError, match="learning_rat"):
        parse_config(["--config", str(recipe)])
    recipe.write_text("algo: ppo\nalgorithm:\n  scale_rewards: true\n", encoding="utf-8")  # a GRPO field
    with pytest.raises(ValueError, match="scale_rewards"):
        parse_config(["--config", str(recipe)])


def test_r1_searcher_switches_from_stage_one_to_stage_two_within_the_run():
    config = _config("r1-searcher-grpo")
    stages = config.env.reward_stages
    assert [preset for _, preset in stages] == ["r1-searcher-stage1", "r1-searcher-stage2"]
    assert stages[0][0] == 0 < stages[1][0] < config.run.steps


def test_flags_override_a_recipe():
    config = parse_config(["--config", str(_recipe("search-r1-grpo")), "--model.name", "tiny",
                           "--run.steps", "100", "--algorithm.group_size", "3"])
    assert (config.run.steps, config.algorithm.group_size, config.rollout.top_p) == (100, 3, 0.95)
    assert warmup_steps(config.optim.warmup_steps, config.optim.warmup_ratio, config.run.steps) == 28  # the ratio follows


def test_the_demo_recipe_is_the_demo():
    config = parse_config(["--config", str(_recipe("demo"))])
    flat = {f"{group}.{name}": value for group, fields in config.as_dict().items() if isinstance(fields, dict)
            for name, value in fields.items()}
    flat["algo"] = config.algo
    assert {key: flat[key] for key in DEMO} == DEMO
    assert "import" not in _recipe("demo").read_text(encoding="utf-8")


def test_the_real_model_gpu_line_is_the_cpu_task_at_the_papers_budgets():
    """Same questions, split, protocol and reward as the SmolLM2 recipe, which trains only on the questions
    its search answers (a 135M model's groups on the others are all wrong); Search-R1's GRPO settings and budgets."""
    cpu = parse_config(["--config", str(_recipe("real-smollm2"))])
    gpu = _config("real-qwen2.5-3b")
    assert (cpu.data.answerable_at, gpu.data.answerable_at) == (3, None)
    assert gpu.data == dataclasses.replace(cpu.data, answerable_at=None) and gpu.env.protocol == cpu.env.protocol == "search-r1"
    assert (cpu.data.dataset, cpu.data.eval_dataset) == ("real-qa@train", "real-qa@held-out")
    paper = PAPERS["search-r1-grpo"]
    assert {key: _settings(gpu)[key] for key in paper} == paper
    assert (gpu.rollout.engine, gpu.run.dtype, gpu.warm_start.steps) == ("vllm", "bf16", 0)
    assert cpu.warm_start.steps > 0 and cpu.warm_start.answerable_only and cpu.model.name == "smollm2"
