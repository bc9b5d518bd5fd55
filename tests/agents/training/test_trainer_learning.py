"""Each algorithm raises the reward on 1-hop synthetic questions from a warm start (slow: a shared warm
start of about a minute, then under a minute of RL per algorithm on two busy cores).

Set-up: the tiny policy is cloned from scripted demonstrations (:func:`agents.training.warm_start.warm_start`) on a
1-hop world, under the demo's compact Search-R1 dialect (``search-r1-compact``: a one-line
prompt and bare passages, so that the warm start takes a minute, not ten). The warm-started policy
answers the training questions right greedily but only about half the time when sampling. RL then
trains on four of the world's questions, eight samples each per step, for ten steps: a small problem
on which a working learner must raise the sampled reward clearly. Reward is measured before and after
on the same seeds (the four questions x 32 samples); everything is seeded, so "after" equals "before"
exactly when the update does nothing, and falls when the update pushes the wrong way.
"""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "yaml", "matplotlib")

from agents.training.config import TrainConfig  # noqa: E402
from agents.training.evaluation import summarize  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from agents.training.warm_start import warm_start  # noqa: E402
from agents.training.build import build_trainer  # noqa: E402

QUESTIONS = 4


def learning_config(algo: str, output_dir, changes=None):
    settings = {
        "env.protocol": "search-r1-compact", "data.world_max_hops": 1, "data.world_size": QUESTIONS,
        "model.tiny_hidden": 64, "run.steps": 10, "rollout.questions_per_step": QUESTIONS, "algorithm.group_size": 8,
        "env.max_new_tokens": 32, "optim.learning_rate": 1e-3, "algorithm.kl_coef": 0.0, "algorithm.entropy_coef": 0.0,
        "optim.micro_batch_size": 32, "eval.questions": 0, "warm_start.examples": 256, "warm_start.learning_rate": 1e-2,
        "run.report_to": [], "run.progress": False, "run.output_dir": str(output_dir),
    }
    if algo == "ppo":
        settings["algorithm.critic"] = "head"
    return TrainConfig(algo).updated({**settings, **(changes or {})})


def sampled_reward(trainer) -> float:
    sampler = HFSampler(trainer.policy, temperature=trainer.config.rollout.temperature, seed=123)
    rollout = collect_rollouts(sampler, trainer.env, list(range(QUESTIONS)), group_size=32)
    return summarize(rollout.trajectories).reward


@pytest.fixture(scope="module")
def warm_weights(tmp_path_factory):
    """The policy after 150 warm-start steps of 16 demonstrations of a 64-question world (the same
    world's entities as the four training questions), shared by the four algorithms."""
    config = learning_config("grpo", tmp_path_factory.mktemp("warm"), {"data.world_size": 64, "warm_start.steps": 150,
                                                                      "warm_start.batch_size": 16})
    trainer = build_trainer(config)
    try:
        warm_start(trainer.backend, config, trainer.env)
    finally:
        trainer.close_environments()
    return {key: value.clone() for key, value in trainer.policy.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "grpo", "reinforce++", "reinforce++-baseline"])
def test_each_algorithm_raises_the_reward_from_a_warm_start(algo, warm_weights, tmp_path):
    trainer = build_trainer(learning_config(algo, tmp_path))
    try:
        missing, unexpected = trainer.policy.load_state_dict(warm_weights, strict=False)
        assert not unexpected and all(key.startswith("value_head") for key in missing)
        before = sampled_reward(trainer)
        assert 0.2 <= before <= 0.7  # the warm start knows the task, but its samples often go wrong
        trainer.train()
        after = sampled_reward(trainer)
    finally:
        trainer.close_environments()
    assert after >= before + 0.1, (before, after)  # 13+ more right answers of 128
