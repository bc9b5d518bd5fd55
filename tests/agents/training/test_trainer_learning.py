"""Each algorithm raises the reward on 1-hop synthetic questions from a warm start (slow: a shared warm
start of about a minute, then under a minute of RL per algorithm on two busy cores).

Set-up: the tiny policy is cloned from scripted demonstrations (:func:`agents.training.warm_start.warm_start`) on a
1-hop world, under the demo task's compact Search-R1 dialect (:mod:`agents.demo_task`: a one-line
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
from agents.demo_task import COMPACT_SEARCH_R1  # noqa: E402
from agents.training.evaluation import summarize  # noqa: E402
from agents.learners import lookup_algorithm  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from agents.training.warm_start import warm_start  # noqa: E402
from agents.train import build_trainer  # noqa: E402

QUESTIONS = 4


def learning_config(algo: str, output_dir, **changes):
    _, config_cls = lookup_algorithm(algo)
    settings = dict(
        algo=algo, protocol=COMPACT_SEARCH_R1.name, world_max_hops=1, world_size=QUESTIONS, tiny_hidden=64,
        steps=10, questions_per_step=QUESTIONS, group_size=8, max_new_tokens=32, learning_rate=1e-3,
        kl_coef=0.0, entropy_coef=0.0, micro_batch_size=32, eval_questions=0, sft_examples=256, sft_lr=1e-2,
        tensorboard=False, progress=False, output_dir=str(output_dir),
    )
    if algo == "ppo":
        settings["critic"] = "head"
    settings.update(changes)
    return config_cls(**settings)


def sampled_reward(trainer) -> float:
    sampler = HFSampler(trainer.policy, temperature=trainer.config.temperature, seed=123)
    rollout = collect_rollouts(sampler, trainer.env, list(range(QUESTIONS)), group_size=32)
    return summarize(rollout.trajectories).reward


@pytest.fixture(scope="module")
def warm_weights(tmp_path_factory):
    """The policy after 150 warm-start steps of 16 demonstrations of a 64-question world (the same
    world's entities as the four training questions), shared by the four algorithms."""
    config = learning_config("grpo", tmp_path_factory.mktemp("warm"), world_size=64, sft_steps=150)
    trainer = build_trainer(config)
    try:
        warm_start(trainer.policy, config, trainer.env, batch_size=16)
    finally:
        trainer.env.close()
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
        trainer.env.close()
    assert after >= before + 0.1, (before, after)  # 13+ more right answers of 128
