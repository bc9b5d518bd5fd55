"""The rollout-engine options of a run: the HF sampler's own log-probs agree with the trainer's
recomputation (so ``engine.reuse_logprobs`` may stand in for it, and the trainer lets it only for an
engine whose log-probs are its own), the engine's default for the learners' correction, and one-line
errors for bad settings. The vLLM engine itself is tested in ``tests/agents/rollout/test_vllm_engine.py``
(its own virtualenv); an engine of a user's own in ``test_user_engine.py``."""
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
from agents.rollout.engines import DEFAULT_TIS_CAP, lookup_engine  # noqa: E402
from agents.rollout.hf_engine import HFEngine  # noqa: E402
from agents.training.build import algorithm_config, build_trainer  # noqa: E402
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
                         rollout=RolloutConfig(temperature=TEMPERATURE),
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


def test_an_unset_tis_cap_is_the_engines_default_for_the_algorithm_and_stays_unset_in_the_config():
    hf = TrainConfig("grpo")
    assert algorithm_config(hf).tis_cap == 0.0 and hf.algorithm.tis_cap is None  # the trainer's own log-probs
    vllm = TrainConfig("grpo").updated({"rollout.engine": "vllm"})
    assert lookup_engine("vllm").default_tis_cap == DEFAULT_TIS_CAP == 2.0
    resolved = algorithm_config(vllm)
    assert resolved.tis_cap == 2.0 and vllm.algorithm.tis_cap is None and vllm.as_dict()["algorithm"]["tis_cap"] is None
    assert resolved == type(vllm.algorithm)(**{**vllm.as_dict()["algorithm"], "tis_cap": 2.0})  # nothing else changed
    off = TrainConfig("grpo").updated({"rollout.engine": "vllm", "algorithm.tis_cap": 0.0})
    assert algorithm_config(off).tis_cap == 0.0
    chosen = TrainConfig("ppo").updated({"rollout.engine": "vllm", "algorithm.tis_cap": 5.0})
    assert algorithm_config(chosen) is chosen.algorithm and chosen.algorithm.tis_cap == 5.0
    endpoint = TrainConfig("grpo").updated({"rollout.engine": "endpoint"})
    assert algorithm_config(endpoint).tis_cap == 2.0


@pytest.mark.parametrize("changes, match", [
    ({"rollout.engine": "sglang"}, "unknown rollout.engine 'sglang'"),
    ({"rollout.engine": "vllm", "engine.memory_fraction": 0.0}, "engine.memory_fraction"),
    ({"rollout.engine": "vllm", "engine.memory_fraction": 1.5}, "engine.memory_fraction"),
    ({"rollout.engine": "vllm", "engine.reuse_logprobs": True}, "engine.reuse_logprobs"),
    ({"engine.memory_fraction": 0.5}, "engine.memory_fraction"),
    ({"rollout.engine": "endpoint", "engine.url": "localhost:8000"}, "engine.url"),
    ({"rollout.engine": "endpoint", "engine.timeout_s": 0}, "engine.timeout_s"),
])
def test_bad_engine_settings_are_one_line_errors(changes, match):
    with pytest.raises(ValueError, match=match) as error:
        TrainConfig("grpo").updated(changes)
    assert "\n" not in str(error.value)


def test_an_endpoint_cannot_be_the_training_engine(tmp_path):
    from tests.agents.training.tiny import small_config

    config = small_config("grpo", tmp_path, {"rollout.engine": "endpoint", "engine.url": "http://localhost:8000/v1",
                                             "engine.model": "m", "eval.questions": 0})
    with pytest.raises(ValueError, match="rollout.engine: endpoint serves fixed weights") as error:
        build_trainer(config)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("own_logprobs, asked, reused", [(True, True, True), (True, False, False), (False, True, False)])
def test_the_update_reuses_the_rollouts_logprobs_only_where_they_are_the_trainers_and_asked_for(
        tmp_path, monkeypatch, own_logprobs, asked, reused):
    import agents.training.trainer as trainer_module
    from tests.agents.training.tiny import small_config

    seen: list[bool] = []
    real = trainer_module.score_batch

    def score_batch(*args, reuse_logprobs: bool = False, **kwargs):
        seen.append(reuse_logprobs)
        return real(*args, reuse_logprobs=reuse_logprobs, **kwargs)

    monkeypatch.setattr(trainer_module, "score_batch", score_batch)

    class Engine(HFEngine):
        logprobs_are_trainers = own_logprobs

    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 1, "eval.questions": 0, "engine.reuse_logprobs": asked}))
    assert trainer.engine.reuse_logprobs is asked  # the hf engine's option
    trainer.engine = Engine(trainer.policy, temperature=1.0, reuse_logprobs=asked)
    try:
        trainer.train_step()
    finally:
        trainer.close_environments()
    assert seen == [reused]


def test_with_a_rollout_engine_the_trained_policy_is_not_gathered_for_decoding(tmp_path):
    """A rollout engine holds its own weights and takes them parameter by parameter when stale: the trainer
    neither enters the backend's generation block (which gathers a ZeRO-3 policy whole) for its rollouts
    and evaluations, nor lets rank 0's evaluation be the first to refresh the engine (every rank's engine
    is woken before it). The engine here is a recorder in front of the HF sampler that says it holds its
    own weights: what is tested is the trainer's side of the contract, the vLLM engine itself is tested in
    its own virtualenv."""
    from contextlib import contextmanager

    from tests.agents.training.tiny import small_config

    trainer = build_trainer(small_config("grpo", tmp_path, {"run.steps": 2, "eval.every": 1, "eval.questions": 2}))
    calls: list[str] = []

    class Recorder(HFEngine):
        decodes_trained_policy = False

        def agent(self, *, greedy: bool, seed: int, first_row: int = 0):
            calls.append("agent")
            return super().agent(greedy=greedy, seed=seed, first_row=first_row)

        def wake_up(self) -> None:
            calls.append("wake_up")

    trainer.engine = Recorder(trainer.policy)
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
