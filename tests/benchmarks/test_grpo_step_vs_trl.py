"""The GRPO-step benchmark against TRL: its peer side plays the same episodes correctly, and the
benchmark runs end to end and reports both sides. Skipped when TRL (an optional extra) is absent."""
import json
import os

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "yaml")
skip_without("trl", "trl", "datasets")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import torch  # noqa: E402

from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.policies.policy import HFPolicy  # noqa: E402
from benchmarks import grpo_step_vs_trl  # noqa: E402
from benchmarks.peers.trl_grpo import SearchQARollout, StepClock, build_trainer, hf_tokenizer  # noqa: E402
from search_env import AGENT, ENVIRONMENT, BatchSearchQAEnv  # noqa: E402


def calling_model(codec):
    """A tiny LM whose next token ignores the context: ``<search>`` and ``</search>`` a quarter of the
    time each, any other id uniformly otherwise - so episodes search again and again (multi-turn)."""
    model = tiny_causal_lm(codec.vocab_size, eos_id=min(codec.eos_ids), pad_id=codec.pad_id, seed=0)
    model.config.tie_word_embeddings = False
    head = torch.nn.Linear(model.config.hidden_size, codec.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        tags = codec.encode("<search>") + codec.encode("</search>")
        assert len(tags) == 2, "the built-in tokenizer has the search tags as single tokens"
        # exp(b) / (exp(b) * 2 + vocab - 2) = 1/4  =>  exp(b) = (vocab - 2) / 2
        head.bias[tags] = torch.log(torch.tensor((codec.vocab_size - 2) / 2.0))
    model.lm_head = head
    return model


@pytest.fixture(scope="module")
def env():
    env = BatchSearchQAEnv(4, protocol="search-r1", max_new_tokens=24)
    yield env
    env.close()


def test_peer_rollout_records_the_episodes_and_their_sampling_logprobs(env):
    codec = env.envs[0].codec
    torch.manual_seed(0)
    model = calling_model(codec)
    examples = env.envs[0].examples[:2]
    tokenizer = hf_tokenizer(codec)
    rollout = SearchQARollout(env, examples, tokenizer, env.envs[0].protocol.stop_strings)
    trainer = build_trainer(model, tokenizer, rollout, [ex.question for ex in examples], steps=1, group_size=2,
                            micro_batch_size=2, learning_rate=1e-6, temperature=1.0, top_p=1.0, beta=0.0,
                            max_new_tokens=24, seed=0, callbacks=[])
    prompts = [ex.question for ex in examples for _ in range(2)]  # TRL repeats each prompt group-size times
    out = rollout(prompts, trainer)

    trajectories = [e.trajectory for e in env.envs]
    assert [t.question for t in trajectories] == prompts
    assert rollout.last.turns > 1 and any(t.tool_calls for t in trajectories)
    policy = HFPolicy(model, codec)
    search_close = codec.encode("</search>")[0]
    for t, prompt_ids, completion, mask, logprobs in zip(
        trajectories, out["prompt_ids"], out["completion_ids"], out["env_mask"], out["logprobs"]
    ):
        assert prompt_ids + completion == t.token_ids
        assert mask == list(t.trained[t.prompt_length:])
        assert sum(mask) == 24  # no answer tag: every episode spends its whole agent budget
        assert any(p == ENVIRONMENT for p in t.producers[t.prompt_length:])
        # Each turn was cut right after its stop string: the environment answers the very next token.
        for k in range(t.prompt_length, len(t.token_ids) - 1):
            if t.token_ids[k] == search_close and t.producers[k] == AGENT:
                assert t.producers[k + 1] == ENVIRONMENT
        # The recorded log-probs are the model's own (an independent forward pass over the episode), 0 on env tokens.
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            expected = policy(ids, torch.ones_like(ids)).logprobs[0, t.prompt_length:]
        got = torch.tensor(logprobs)
        agent = torch.tensor(mask, dtype=torch.bool)
        torch.testing.assert_close(got[agent], expected[agent], atol=1e-4, rtol=0)
        assert torch.all(got[~agent] == 0)


def test_step_clock_times_each_step_and_calls_between_in_order():
    calls = []
    clock = StepClock(lambda step: calls.append((step, len(clock.step_seconds))))
    clock.on_train_begin(None, None, None)
    clock.on_step_end(None, None, None)
    clock.on_step_end(None, None, None)
    assert calls == [(1, 1), (2, 2)]
    assert all(s >= 0 for s in clock.step_seconds)


def test_benchmark_runs_both_sides_on_the_same_work(capsys):
    args = ["--steps", "1", "--warmup", "1", "--prompts", "2", "--group", "2", "--max-new-tokens", "8",
            "--micro-batch", "2", "--warm-start-steps", "0"]
    trl_records, our_records = grpo_step_vs_trl.run(grpo_step_vs_trl.parse_args(args))
    assert len(trl_records) == len(our_records) == 2
    for trl_step, our_step in zip(trl_records, our_records):
        assert trl_step.episodes == our_step.episodes == 4
        # The same questions, so the same prompts; both sample up to the same agent budget.
        assert trl_step.prompt_tokens == our_step.prompt_tokens
        assert 0 < trl_step.agent_tokens <= 4 * 8 and 0 < our_step.agent_tokens <= 4 * 8
        assert 0 < trl_step.rollout_s < trl_step.total_s and 0 < our_step.rollout_s < our_step.total_s
    table = grpo_step_vs_trl.report(trl_records, our_records, grpo_step_vs_trl.parse_args(args))
    rows = {line.split()[0] for line in table.splitlines() if line}
    assert {"TRL", "ours", "TRL/ours", "target:"} <= rows


def test_bad_batch_split_is_refused():
    with pytest.raises(SystemExit):
        grpo_step_vs_trl.parse_args(["--prompts", "3", "--group", "3", "--micro-batch", "2"])


def test_peer_cuts_a_turn_after_a_stop_string_spread_over_several_tokens(split_tag_tokenizer):
    env = BatchSearchQAEnv(1, protocol="search-r1", tokenizer=split_tag_tokenizer)
    codec = env.envs[0].codec
    rollout = SearchQARollout(env, env.envs[0].examples[:1], hf_tokenizer(codec), env.envs[0].protocol.stop_strings)
    for text in ("where people <search> the answer </search> is in the", "the answer </answer> live", "no tag at all"):
        ids = codec.encode(text)
        # Independently: the shortest prefix whose text holds a stop string (the whole row when none does).
        expected = next((k for k in range(1, len(ids) + 1) if any(s in codec.decode(ids[:k]) for s in ("</search>", "</answer>"))), len(ids))
        assert rollout._chunk_end(ids) == expected
    eos = min(codec.eos_ids)
    assert rollout._chunk_end(codec.encode("the answer") + [eos] + codec.encode("</search>")) == len(codec.encode("the answer")) + 1
    env.close()


def test_the_command_writes_the_medians_and_ratios_of_the_timed_steps(tmp_path, monkeypatch, capsys):
    def record(rollout_s, total_s, agent_tokens=40):
        return grpo_step_vs_trl.StepRecord(rollout_s=rollout_s, total_s=total_s, episodes=4, prompt_tokens=48,
                                           agent_tokens=agent_tokens, env_tokens=20, searches=2, reward=0.5)

    # a warm-up step per side (dropped from the medians), then three timed ones
    trl_records = [record(9.0, 90.0), record(2.0, 6.0), record(3.0, 8.0), record(4.0, 7.0)]
    our_records = [record(5.0, 50.0), record(1.0, 2.0), record(1.0, 4.0), record(2.0, 3.0, agent_tokens=60)]
    monkeypatch.setattr(grpo_step_vs_trl, "run", lambda args: (trl_records, our_records))
    argv = ["--steps", "3", "--warmup", "1", "--prompts", "2", "--group", "2", "--micro-batch", "2", "--output-dir", str(tmp_path)]
    assert grpo_step_vs_trl.main(argv) == 0
    assert "target: ours >= 1.5x faster per step: met (2.33x)" in capsys.readouterr().out  # 7 s / 3 s
    saved = json.loads((tmp_path / "grpo_step_vs_trl.json").read_text(encoding="utf-8"))
    assert saved["command"] == "python -m benchmarks.grpo_step_vs_trl " + " ".join(argv)
    trl, ours = saved["summary"]
    assert (trl["side"], trl["rollout_s"], trl["update_s"], trl["total_s"]) == ("TRL", 3.0, 4.0, 7.0)
    assert (ours["side"], ours["rollout_s"], ours["update_s"], ours["total_s"]) == ("ours", 1.0, 1.0, 3.0)  # updates 1, 3, 1 s
    assert ours["agent_tokens_per_s"] == 20.0 and ours["agent_tokens_per_episode"] == 10.0 and ours["searches_per_episode"] == 0.5
    assert saved["trl_over_ours"] == {"rollout_s": 3.0, "update_s": 4.0, "total_s": 7 / 3}
    assert [step["warmup"] for step in saved["steps"]["ours"]] == [True, False, False, False]
    assert saved["steps"]["TRL"][0]["update_s"] == 81.0
    markdown = (tmp_path / "grpo_step_vs_trl.md").read_text(encoding="utf-8")
    assert "| ours | 1 | 1 | 3 | 20.0 | 4 | 10.0 | 5 | 12.0 | 0.5 | 0.5 |" in markdown
    assert "TRL / ours: rollout 3.00x, update 4.00x, whole step 2.33x. target: ours >= 1.5x faster per step: met (2.33x)." in markdown
    assert (tmp_path / "grpo_step_vs_trl.csv").read_text(encoding="utf-8").splitlines()[2].startswith("ours,1.0,1.0,3.0,20.0,4,")
