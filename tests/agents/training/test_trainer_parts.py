"""The trainer's parts on their own: the torch backend (warm-up, clipping, accumulation, state), atomic
checkpoints and random-state capture, the run logger, episode metrics, and the question order."""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import random

import numpy as np
import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.training.backends import BackendSettings, TorchBackend  # noqa: E402
from agents.rollout.batch import TrainBatch  # noqa: E402
from agents.training.checkpoint import capture_rng, load_checkpoint, load_run, restore_rng, save_checkpoint, save_run  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.evaluation import EvalResult, format_table, predicted_answer, reward_component_means, summarize  # noqa: E402
from agents.training.loggers import JsonLinesLogger, read_metrics  # noqa: E402
from agents.training.run_files import RunFiles  # noqa: E402
from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.policies.policy import HFPolicy, ValueModel, position_ids_from_mask  # noqa: E402
from agents.training.data import QuestionOrder  # noqa: E402
from search_env.trajectory import AGENT, ENVIRONMENT, ToolCall, Trajectory  # noqa: E402


# -- backend --------------------------------------------------------------------------------------
def tiny_policy(seed: int = 0, **kwargs) -> HFPolicy:
    return HFPolicy(tiny_causal_lm(4096, layers=1, hidden=32, heads=2, seed=seed), None, **kwargs)


def hand_batch(rows: int = 4, width: int = 9, seed: int = 0) -> TrainBatch:
    """Right-padded rows of random ids; the last tokens of each row are trained on."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 4096, (rows, width), generator=gen)
    lengths = torch.tensor([width - (i % 3) for i in range(rows)])
    attention = (torch.arange(width)[None, :] < lengths[:, None]).long()
    trained = ((torch.arange(width)[None, :] >= 3) & attention.bool()).float()
    return TrainBatch(
        input_ids=ids * attention, attention_mask=attention, position_ids=position_ids_from_mask(attention),
        trained_mask=trained, token_rewards=torch.zeros(rows, width), scores=torch.zeros(rows),
        group_index=torch.zeros(rows, dtype=torch.long), group_ids=["q"] * rows, trajectories=[None] * rows,
    )


def nll_step(backend: TorchBackend, batch: TrainBatch) -> float:
    """One optimiser step on the mean negative log-likelihood of the trained tokens, scaled by the
    whole batch's token count (the trainer's contract) and accumulated over the backend's micro-batches."""
    tokens = batch.trained_mask.sum()
    backend.train()
    for mb in backend.micro_batches(batch):
        out = backend.forward(mb)
        backend.backward(-(out.logprobs * mb.trained_mask).sum() / tokens)
    return backend.step()


def optim_config(**optim) -> TrainConfig:
    return TrainConfig().updated({f"optim.{name}": value for name, value in optim.items()})


def test_warmup_is_linear_then_constant():
    backend = TorchBackend(tiny_policy(), BackendSettings.of(optim_config(learning_rate=0.1, warmup_steps=4)))
    rates = []
    for _ in range(5):
        rates.append(backend.learning_rate)
        nll_step(backend, hand_batch())
        nll_step(backend, hand_batch())  # a second optimiser step of the same training step: no advance
        backend.finish_step()
    assert rates == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1])


def test_micro_batches_accumulate_to_the_full_batch_step():
    batch = hand_batch(rows=4)
    policy = tiny_policy()
    whole = TorchBackend(policy, BackendSettings.of(optim_config(learning_rate=1e-2, micro_batch_size=4, max_grad_norm=0.0)))
    split = TorchBackend(copy.deepcopy(policy), BackendSettings.of(optim_config(learning_rate=1e-2, micro_batch_size=1, max_grad_norm=0.0)))
    assert [len(mb) for mb in split.micro_batches(batch)] == [1, 1, 1, 1]
    norm_whole, norm_split = nll_step(whole, batch), nll_step(split, batch)
    # The norm catches a rescaled accumulation (Adam's step alone would not: it is scale-invariant).
    assert norm_split == pytest.approx(norm_whole, rel=1e-5)
    for a, b in zip(whole.policy.parameters(), split.policy.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)  # 0.1% of an Adam step of lr 1e-2


def test_step_reports_the_gradient_norm_before_clipping_and_skips_non_finite_ones():
    batch = hand_batch()
    backend = TorchBackend(tiny_policy(), BackendSettings.of(optim_config(learning_rate=1e-2, max_grad_norm=1e-3)))
    tokens = batch.trained_mask.sum()
    loss = -(backend.forward(batch).logprobs * batch.trained_mask).sum() / tokens
    backend.backward(loss)
    expected = math.sqrt(sum(float(p.grad.double().square().sum()) for p in backend.policy.parameters() if p.grad is not None))
    assert backend.step() == pytest.approx(expected, rel=1e-4)  # float32 sums vs float64
    assert expected > 1e-3  # so it was clipped
    before = [p.detach().clone() for p in backend.policy.parameters()]
    backend.backward(backend.forward(batch).logprobs.sum() * float("nan"))
    assert math.isnan(backend.step())
    assert all(torch.equal(a, b) for a, b in zip(before, backend.policy.parameters()))
    assert all(p.grad is None for p in backend.policy.parameters())


def test_reference_stays_frozen_and_state_round_trips_with_a_separate_critic():
    policy = tiny_policy()
    critic = ValueModel(copy.deepcopy(policy.model))
    backend = TorchBackend(policy, BackendSettings.of(optim_config(learning_rate=1e-2, warmup_steps=3)), critic=critic,
                           critic_learning_rate=1e-3, with_reference=True)
    batch = hand_batch()
    reference_before = backend.reference_logprobs(batch)

    def step() -> None:
        backend.train()
        out = backend.forward(batch, with_values=True)
        backend.backward(-(out.logprobs * batch.trained_mask).sum() / 10 + out.values.square().sum() + (out.values - 1).square().sum())
        backend.step()
        backend.finish_step()

    critic_before = copy.deepcopy(critic.state_dict())
    step()
    assert torch.equal(backend.reference_logprobs(batch), reference_before)
    assert any(not torch.equal(v, critic_before[k]) for k, v in critic.state_dict().items())
    assert backend.critic_optimizer.param_groups[0]["lr"] == 1e-3
    saved = copy.deepcopy(backend.state_dict())
    step()
    moved = backend.forward(batch).logprobs
    backend.load_state_dict(saved)
    step()  # the same step again from the restored state gives the same weights
    torch.testing.assert_close(backend.forward(batch).logprobs, moved, rtol=0, atol=0)
    backend.reset_reference()
    assert torch.equal(backend.reference_logprobs(batch), backend.forward(batch).logprobs.detach())


# -- checkpoints and random state ----------------------------------------------------------------
def test_checkpoint_round_trip(tmp_path):
    state = {"step": 3, "weights": {"w": torch.arange(6.0).reshape(2, 3)}, "betas": (0.9, 0.99), "rng": capture_rng()}
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    loaded = load_checkpoint(path)
    assert loaded["step"] == 3 and loaded["betas"] == (0.9, 0.99)
    assert torch.equal(loaded["weights"]["w"], state["weights"]["w"])


def test_a_crash_mid_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})

    def dies_half_way(obj, handle):
        handle.write(b"PK\x03\x04 half a zip file")
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr("agents.training.checkpoint.torch.save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    monkeypatch.undo()
    loaded = load_checkpoint(path)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temporary file left behind


def test_missing_checkpoint_is_a_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "checkpoint.pt")


def test_a_run_checkpoint_names_its_backend_folder_and_resumes_exactly(tmp_path, monkeypatch):
    config = optim_config(learning_rate=1e-2, warmup_steps=3)
    path = tmp_path / "checkpoint.pt"

    def train_step(backend, seed):
        nll_step(backend, hand_batch(seed=seed))
        backend.finish_step()

    backend = TorchBackend(tiny_policy(), BackendSettings.of(config))
    train_step(backend, 0)
    save_run(path, 1, {"step": 1, "data": {"epoch": 0, "offset": 4}}, backend)
    assert load_checkpoint(path)["backend_dir"] == "checkpoints/step-1"
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "step-1").iterdir()) == ["backend.pt"]
    train_step(backend, 1)
    expected = copy.deepcopy(backend.state_dict())

    resumed = TorchBackend(tiny_policy(seed=1), BackendSettings.of(config))  # other weights, fresh optimiser and schedule
    assert load_run(path, resumed) == {"step": 1, "data": {"epoch": 0, "offset": 4}}
    train_step(resumed, 1)
    got = resumed.state_dict()
    for key, value in expected["policy"].items():
        assert torch.equal(value, got["policy"][key]), key
    assert expected["optimizer"]["state"].keys() == got["optimizer"]["state"].keys() != set()
    for index, slots in expected["optimizer"]["state"].items():
        for name, value in slots.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(got["optimizer"]["state"][index][name])), name
    assert expected["scheduler"] == got["scheduler"] and resumed.learning_rate == backend.learning_rate

    save_run(path, 2, {"step": 2}, resumed)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-2"]  # the older step is removed

    def dies_half_way(directory):
        (directory / "backend.pt").write_bytes(b"half a file")
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(resumed, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        save_run(path, 3, {"step": 3}, resumed)
    assert load_run(path, TorchBackend(tiny_policy(seed=2), BackendSettings.of(config))) == {"step": 2}  # the last complete one


def test_random_state_is_restored_through_a_checkpoint_file(tmp_path):
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    save_checkpoint(tmp_path / "rng.pt", capture_rng())
    first = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    restore_rng(load_checkpoint(tmp_path / "rng.pt"))
    second = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1] and torch.equal(first[2], second[2])


# -- logs -----------------------------------------------------------------------------------------
class FakeRun:
    """What the loggers read of a trainer."""

    def __init__(self, output_dir, step=0, resumed=False):
        self.files, self.step, self.resumed = RunFiles(output_dir), step, resumed


def test_json_lines_logger_cuts_steps_after_the_resumed_checkpoint(tmp_path):
    logger = JsonLinesLogger()
    run = FakeRun(tmp_path)
    logger.on_run_start(run)
    for step in range(5):
        logger.on_log(run, step, {"reward": step / 10, "nan": float("nan"), "tensor": torch.tensor(2.5)})
    assert read_metrics(tmp_path / "metrics.jsonl")[1] == {"step": 1, "reward": 0.1, "nan": None, "tensor": 2.5}
    resumed = JsonLinesLogger()
    resumed_run = FakeRun(tmp_path, step=2, resumed=True)
    resumed.on_run_start(resumed_run)
    resumed.on_log(resumed_run, 3, {"reward": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]
    resumed.on_run_end(resumed_run, None)
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    JsonLinesLogger().on_run_start(FakeRun(tmp_path))  # a new run starts a new file
    assert read_metrics(tmp_path / "metrics.jsonl") == []


# -- episode metrics ------------------------------------------------------------------------------
def episode(answer, golden, *, reward=0.0, searches=0, agent_tokens=2, components=None, failed=0) -> Trajectory:
    producers = bytearray([ENVIRONMENT] * 3 + [AGENT] * agent_tokens)
    return Trajectory(
        question="q", golden_answers=golden, protocol="search-r1", example_id="e", prompt_length=3,
        token_ids=list(range(len(producers))), producers=producers, trained=bytearray(producers),
        tool_calls=[ToolCall(turn=i, kind="query", content="x", sources=["all"], k=3,
                             error="SourceError: down" if i < failed else None) for i in range(searches)],
        answer=answer, reward=reward, reward_components=components or {},
    )


def test_summary_of_hand_made_episodes():
    episodes = [
        episode("Paris", ["paris"], reward=1.0, searches=1, agent_tokens=4),
        # "the" is dropped by SQuAD normalisation: 2 of 2 predicted tokens in a 3-token gold -> F1 0.8
        episode("the big city", ["big apple city"], reward=0.0, searches=3, agent_tokens=8, failed=2),
        episode(None, ["x"], reward=0.5, searches=2, agent_tokens=6),
    ]
    summary = summarize(episodes)
    assert summary == EvalResult(em=pytest.approx(1 / 3), f1=pytest.approx(1.8 / 3), reward=pytest.approx(0.5),
                                 searches=2.0, response_tokens=6.0, episodes=3, failed_searches=pytest.approx(2 / 3))
    assert summary.as_dict("eval/greedy/")["eval/greedy/searches/failed"] == pytest.approx(2 / 3)


def test_predicted_answer_is_what_the_reward_read():
    assert predicted_answer(episode("raw", ["x"], components={"answer": "extracted"})) == "extracted"
    assert predicted_answer(episode("raw", ["x"], components={"prediction": "plan answer"})) == "plan answer"
    assert predicted_answer(episode("The final answer is \\[ \\boxed{Oslo} \\]", ["x"])) == "Oslo"
    assert predicted_answer(episode(None, ["x"])) == ""


def test_reward_component_means_skip_text_and_missing_parts():
    episodes = [
        episode("a", ["a"], components={"em": 1.0, "format": True, "answer": "a", "judge": None}),
        episode("b", ["a"], components={"em": 0.0, "format": False, "answer": "b", "judge": 0.5}),
    ]
    assert reward_component_means(episodes) == {"em": 0.5, "format": 0.5, "judge": 0.5}


def test_table_has_a_row_per_stage_and_decoding():
    result = EvalResult(em=0.25, f1=0.5, reward=0.25, searches=1.5, response_tokens=20.0, episodes=8, failed_searches=0.0)
    failing = dataclasses.replace(result, em=0.0, failed_searches=1.5)
    table = format_table({"start": {"greedy": result}, "final": {"greedy": failing, "sampled": result}})
    lines = table.splitlines()
    assert lines[0].split() == ["stage", "decoding", "EM", "F1", "reward", "searches", "failed", "tokens", "episodes"]
    assert [line.split()[:3] for line in lines[2:]] == [["start", "greedy", "0.250"], ["final", "greedy", "0.000"],
                                                      ["final", "sampled", "0.250"]]
    assert "0.000 (searches failed)" in lines[3] and "failed" not in lines[2] + lines[4]
    assert lines[3].split()[-3] == "1.50"  # the failed column


# -- question order -------------------------------------------------------------------------------
def test_question_order_covers_each_epoch_and_resumes_exactly():
    order = QuestionOrder(5, seed=3)
    taken = order.take(4) + order.take(4) + order.take(2)
    assert sorted(taken[:5]) == list(range(5)) and sorted(taken[5:]) == list(range(5))
    assert taken[:5] != taken[5:]  # reshuffled each epoch
    state = json.loads(json.dumps(order.state_dict()))
    upcoming = order.take(7)
    again = QuestionOrder(5, seed=3)
    again.load_state_dict(state)
    assert again.take(7) == upcoming
