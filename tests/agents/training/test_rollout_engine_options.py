"""The rollout-engine options of a run: the HF sampler's own log-probs agree with the trainer's
recomputation (so ``rollout.reuse_logprobs`` may stand in for it), the engine's defaults for the
learners' correction, and one-line errors for bad settings. The vLLM engine itself is tested in
``tests/agents/rollout/test_vllm_engine.py`` (its own virtualenv)."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.learners import GRPO, GRPOConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from agents.rollout.batch import build_batch  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from agents.training.backends import build_backend  # noqa: E402
from agents.training.build import VLLM_TIS_CAP, engine_defaults  # noqa: E402
from agents.training.config import OptimConfig, RolloutConfig, TrainConfig  # noqa: E402
from agents.training.update import score_batch  # noqa: E402
from search_env import BatchSearchQAEnv  # noqa: E402

TEMPERATURE = 0.7


def _rollout_batch():
    policy = load_policy("tiny", seed=0)
    env = BatchSearchQAEnv(4, protocol="search-r1", tokenizer=policy.codec, max_new_tokens=24)
    rollout = collect_rollouts(HFSampler(policy, temperature=TEMPERATURE, seed=1), env, [0, 1], group_size=2)
    return policy, build_batch(rollout.trajectories, rollout.group_ids, policy.codec.pad_id, rollout.sampled_logprobs)


def test_sampler_logprobs_agree_with_the_trainers_recomputation():
    policy, batch = _rollout_batch()
    config = TrainConfig("grpo", algorithm=GRPOConfig(group_size=2, kl_coef=0.0),
                         rollout=RolloutConfig(temperature=TEMPERATURE, reuse_logprobs=True),
                         optim=OptimConfig(update_epochs=2))
    algorithm = GRPO(config.algorithm, max_new_tokens=24)
    backend = build_backend(config, policy, algorithm)
    score_batch(backend, algorithm, config.optim, batch)  # recomputed: one forward pass
    recomputed = batch.old_logprobs.clone()
    score_batch(backend, algorithm, config.optim, batch, reuse_logprobs=True)  # the sampler's, no pass
    keep = batch.trained_mask.bool()
    assert keep.sum() > 20
    assert torch.equal(batch.old_logprobs, batch.rollout_logprobs)
    gap = (recomputed - batch.rollout_logprobs)[keep].abs().max()
    assert float(gap) < 1e-4, f"sampler and trainer log-probs differ by {float(gap)}"


def test_reuse_keeps_the_update_pass_when_that_is_free():
    # One pass of one optimiser step: the update's own forward gives the old log-probs (exact), reuse or not.
    policy, batch = _rollout_batch()
    config = TrainConfig("grpo", algorithm=GRPOConfig(group_size=2, kl_coef=0.0))
    algorithm = GRPO(config.algorithm, max_new_tokens=24)
    score_batch(build_backend(config, policy, algorithm), algorithm, config.optim, batch, reuse_logprobs=True)
    assert batch.old_logprobs is None


def test_engine_defaults_turn_truncated_importance_sampling_on_for_vllm_only():
    hf = TrainConfig("grpo")
    engine_defaults(hf)
    assert hf.algorithm.tis_cap is None
    vllm = TrainConfig("grpo", rollout=RolloutConfig(engine="vllm"))
    engine_defaults(vllm)
    assert vllm.algorithm.tis_cap == VLLM_TIS_CAP
    off = TrainConfig("grpo", rollout=RolloutConfig(engine="vllm"), algorithm=GRPOConfig(tis_cap=0.0))
    engine_defaults(off)
    assert off.algorithm.tis_cap == 0.0
    chosen = TrainConfig("ppo", rollout=RolloutConfig(engine="vllm")).updated({"algorithm.tis_cap": 5.0})
    engine_defaults(chosen)
    assert chosen.algorithm.tis_cap == 5.0


@pytest.mark.parametrize("changes, match", [
    ({"engine": "sglang"}, "rollout.engine"),
    ({"vllm_memory_fraction": 0.0}, "vllm_memory_fraction"),
    ({"vllm_memory_fraction": 1.5}, "vllm_memory_fraction"),
    ({"engine": "vllm", "reuse_logprobs": True}, "reuse_logprobs"),
])
def test_bad_engine_settings_are_one_line_errors(changes, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(**changes)


def test_with_a_rollout_engine_the_trained_policy_is_not_gathered_for_decoding(tmp_path):
    """A rollout engine holds its own weights and takes them parameter by parameter when stale: the trainer
    neither enters the backend's generation block (which gathers a ZeRO-3 policy whole) for its rollouts
    and evaluations, nor lets rank 0's evaluation be the first to refresh the engine (every rank's engine
    is woken before it). The engine here is a recorder in front of the HF sampler: what is tested is the
    trainer's side of the contract, the vLLM engine itself is tested in its own virtualenv."""
    from contextlib import contextmanager

    from agents.training.build import build_trainer
    from tests.agents.training.tiny import small_config

    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 2, "eval.every": 1, "eval.questions": 2}))
    calls: list[str] = []

    class Recorder:
        def wake_up(self) -> None:
            calls.append("wake_up")

    def factory(greedy: bool, seed: int):
        calls.append("agent")
        return trainer._sampler(greedy, seed)

    factory.engine = Recorder()
    trainer.agent_factory = factory
    real = trainer.backend.generation

    @contextmanager
    def generation():
        calls.append("generation")
        with real():
            yield

    trainer.backend.generation = generation
    try:
        trainer.train()
    finally:
        trainer.close_environments()
    assert "agent" in calls and "wake_up" in calls
    # export of the final policy is the one gathering (rank 0 writes it whole); no rollout or evaluation gathers
    assert calls.count("generation") == 1 and calls[-1] == "generation", calls
    # each evaluation (start, step 1, final) wakes the engine before its first agent is made
    evaluations = [i for i, c in enumerate(calls) if c == "wake_up"]
    assert len(evaluations) == 3 and all(calls[i + 1] == "agent" for i in evaluations), calls
