"""The supervised warm start: masked cross-entropy on the demonstrations' trained tokens."""
import copy
import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.training.backends import BackendSettings, TorchBackend  # noqa: E402
from agents.training.backends.schedules import warmup_cosine  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.scripted.demonstrations import make_demonstrations  # noqa: E402
from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.policies.policy import HFPolicy  # noqa: E402
from agents.rollout.batch import build_batch  # noqa: E402
from agents.training.warm_start import warm_start_loss, trained_token_logprobs, warm_start  # noqa: E402
from search_env import SearchQAEnv  # noqa: E402


@pytest.fixture(scope="module")
def env():
    return SearchQAEnv(protocol="search-r1", world_seed=4, world_size=120)


def _policy(env, seed=0):
    codec = env.codec
    return HFPolicy(tiny_causal_lm(codec.vocab_size, layers=1, hidden=32, heads=2, seed=seed), codec)


def _config(**changes) -> TrainConfig:
    return TrainConfig().updated({"run.progress": False, **changes})


def _warm_start(policy, config, env):
    return warm_start(TorchBackend(policy, BackendSettings.of(config)), config, env)


def test_loss_is_the_mean_negative_log_prob_of_trained_tokens():
    logprobs = torch.tensor([[0.0, -1.0, -2.0, -3.0], [0.0, -0.5, -4.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    loss = warm_start_loss(logprobs, mask, total_trained=3.0)
    assert loss.item() == pytest.approx((1.0 + 3.0 + 0.5) / 3)
    loss.backward()
    # Only trained tokens get a gradient, each -1/3.
    assert torch.equal(logprobs.grad, -mask / 3.0)


def test_environment_tokens_carry_no_loss(env):
    """The batch's trained mask is 0 on the prompt and on the search results, and the loss does not
    change when the observation tokens' log-probs do."""
    demos = make_demonstrations(env, env.examples, 6, second_hop_rate=1.0, seed=0)
    batch = build_batch(demos.trajectories, [t.example_id for t in demos.trajectories], env.codec.pad_id)
    for b, traj in enumerate(demos.trajectories):
        env_positions = [t for t, p in enumerate(traj.producers) if p == 0]
        assert len(env_positions) > traj.prompt_length  # results were inserted
        assert batch.trained_mask[b, env_positions].sum() == 0
    policy = _policy(env)
    logprobs = policy(batch.input_ids, batch.attention_mask, batch.position_ids).logprobs
    total = float(batch.trained_mask.sum())
    shuffled = torch.where(batch.trained_mask.bool(), logprobs, torch.randn_like(logprobs) * 10)
    assert warm_start_loss(logprobs, batch.trained_mask, total).item() == pytest.approx(warm_start_loss(shuffled, batch.trained_mask, total).item())


def test_learning_rate_warms_up_then_decays_on_a_cosine():
    assert warmup_cosine(0, 4, 20) == pytest.approx(0.25)
    assert warmup_cosine(3, 4, 20) == pytest.approx(1.0)
    assert warmup_cosine(4, 4, 20) == pytest.approx(1.0)
    assert warmup_cosine(12, 4, 20) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert warmup_cosine(20, 4, 20) == pytest.approx(0.0)


def test_warm_start_lowers_the_loss_and_is_seeded(env):
    config = _config(**{"warm_start.steps": 25, "warm_start.examples": 48, "warm_start.learning_rate": 1e-2,
                        "warm_start.second_hop_rate": 0.5, "warm_start.batch_size": 8, "optim.micro_batch_size": 4})
    torch.manual_seed(0)
    policy = _policy(env)
    result = _warm_start(policy, config, env)
    assert len(result.losses) == 25
    assert sum(result.losses[-5:]) / 5 < sum(result.losses[:5]) / 5 - 2.0  # nats per trained token
    stats = result.as_dict()
    assert stats["warm_start/demonstrations"] == 48 and stats["warm_start/loss_last"] == result.losses[-1]
    again = _policy(env)
    _warm_start(again, config, env)
    for p, q in zip(policy.parameters(), again.parameters()):
        assert torch.equal(p, q)


def test_micro_batches_give_the_full_batch_step(env):
    """Splitting a step's demonstrations into micro-batches gives the same update (losses are divided by
    the whole batch's trained tokens)."""
    results = []
    for micro in (8, 3):
        policy = _policy(env, seed=1)
        config = _config(**{"warm_start.steps": 1, "warm_start.examples": 8, "warm_start.learning_rate": 1e-3,
                            "warm_start.batch_size": 8, "optim.micro_batch_size": micro})
        out = _warm_start(policy, config, env)
        results.append((out.losses[0], [p.detach().clone() for p in policy.parameters()]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    for p, q in zip(results[0][1], results[1][1]):
        assert torch.allclose(p, q, atol=1e-6)


def test_warm_start_runs_on_its_own_thread_count_then_restores_the_process_s(env, monkeypatch):
    seen = []
    config = _config(**{"warm_start.steps": 2, "warm_start.examples": 4, "warm_start.batch_size": 2,
                        "warm_start.num_threads": 2})
    backend = TorchBackend(_policy(env), BackendSettings.of(config))
    step = backend.step
    monkeypatch.setattr(backend, "step", lambda: (seen.append(torch.get_num_threads()), step())[1])
    assert torch.get_num_threads() == 1  # the suite's
    warm_start(backend, config, env)
    assert seen == [2, 2] and torch.get_num_threads() == 1
    with pytest.raises(ValueError, match=r"^warm_start.num_threads must be >= 1, got 0$"):
        _config(**{"warm_start.num_threads": 0})


def test_unset_threads_follow_the_free_cores_and_leave_the_numbers_as_one_thread_gives_them(env, monkeypatch):
    """With ``warm_start.num_threads`` unset, the warm start looks at the free cores at every step here
    (``every_s`` 0) and takes them: 2, 1, 2, 1 ... ; its losses and weights are those of a run on one thread."""
    from agents.training import cpu_threads

    runs = []
    for threads in (1, None):
        free = iter([2, 1] * 4)
        monkeypatch.setattr(cpu_threads, "free_cpu_cores", lambda own_threads=1: next(free))
        monkeypatch.setattr(cpu_threads.FollowFreeCores.__init__, "__defaults__", (0.0,))
        config = _config(**{"warm_start.steps": 4, "warm_start.examples": 8, "warm_start.batch_size": 4,
                            "warm_start.num_threads": threads})
        backend = TorchBackend(_policy(env, seed=3), BackendSettings.of(config))
        seen: list[int] = []
        step = backend.step
        monkeypatch.setattr(backend, "step", lambda: (seen.append(torch.get_num_threads()), step())[1])
        out = warm_start(backend, config, env)
        runs.append((seen, out.losses, out.threads, [p.detach().clone() for p in backend.policy.parameters()]))
    assert runs[0][0] == [1, 1, 1, 1] and runs[1][0] == [1, 2, 1, 2]  # begins on 2, then looks before each step
    assert torch.get_num_threads() == 1  # the suite's, restored
    assert runs[0][2] == 1.0 and 1.0 <= runs[1][2] <= 2.0
    assert runs[1][1] == runs[0][1]
    for p, q in zip(runs[0][3], runs[1][3]):
        assert torch.equal(p, q)


def test_bad_input(env):
    with pytest.raises(ValueError, match=r"^warm_start.steps must be >= 1 for a warm start, got 0$"):
        _warm_start(_policy(env), _config(), env)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_trained_token_logprobs_equal_the_policys_at_trained_positions(env, arch):
    demos = make_demonstrations(env, env.examples, 4, second_hop_rate=1.0, seed=0)
    batch = build_batch(demos.trajectories, [t.example_id for t in demos.trajectories], env.codec.pad_id)
    policy = HFPolicy(tiny_causal_lm(env.codec.vocab_size, arch=arch, layers=1, hidden=32, heads=2, seed=3), env.codec)
    full = policy(batch.input_ids, batch.attention_mask, batch.position_ids).logprobs
    fast = trained_token_logprobs(policy, batch.input_ids, batch.attention_mask, batch.position_ids, batch.trained_mask)
    on = batch.trained_mask.bool()
    assert torch.allclose(fast[on], full[on], atol=1e-5)
    assert torch.all(fast[~on] == 0)


def test_off_a_terminal_a_line_every_tenth_of_the_steps(env, capsys):
    """No bar without a terminal: a plain line on stderr every tenth of the steps, counting to the last."""
    config = _config(**{"warm_start.steps": 20, "warm_start.examples": 8, "warm_start.batch_size": 4})
    _warm_start(_policy(env), config, env)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warm start:")]
    assert [line.split()[3] for line in lines] == [f"{n}/20" for n in range(2, 21, 2)], lines
    assert lines[-1].startswith("warm start: step 20/20 (100%), ") and lines[-1].endswith("~0s left")


def test_a_checkpointed_warm_start_goes_on_to_the_same_weights(env):
    """Stopped in its 4th of 5 steps (after a 3-step copy warm-up), the warm start goes on from the state
    saved at step 2 - progress and backend, into a backend of other initial weights - to the weights
    and losses of an uninterrupted one, without a second copy warm-up."""
    config = _config(**{"warm_start.steps": 5, "warm_start.examples": 8, "warm_start.batch_size": 4,
                        "warm_start.save_every": 2, "warm_start.copy_steps": 3})
    whole = TorchBackend(_policy(env), BackendSettings.of(config))
    expected = warm_start(whole, config, env)

    stopped = TorchBackend(_policy(env), BackendSettings.of(config))
    step, calls, saved = stopped.step, [], []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 3 + 4:  # the copy warm-up's 3 steps, then the warm start's 4th
            raise KeyboardInterrupt
        return step()

    stopped.step = interrupted_step
    with pytest.raises(KeyboardInterrupt):
        warm_start(stopped, config, env, save=lambda progress: saved.append((progress, copy.deepcopy(stopped.state_dict()))))
    assert [progress.step for progress, _ in saved] == [2]  # none after the last step
    progress, state = saved[0]
    resumed = TorchBackend(_policy(env, seed=1), BackendSettings.of(config))
    resumed.load_state_dict(state)
    copy_steps = []
    resumed_step = resumed.step
    resumed.step = lambda: copy_steps.append(1) or resumed_step()
    result = warm_start(resumed, config, env, progress=progress)
    assert len(copy_steps) == 3  # the warm start's steps 3 to 5 only
    assert result.losses == expected.losses and result.copy_losses == expected.copy_losses
    for (name, got), want in zip(resumed.policy.state_dict().items(), whole.policy.state_dict().values()):
        assert torch.equal(got, want), name
