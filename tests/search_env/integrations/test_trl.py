"""The TRL adapter: scripted rollouts give the tokens, mask and reward of ``gym.make("SearchQA-v0")``
for every protocol; with a real model its log-probs are the model's and ``GRPOTrainer`` trains on the
environment's rewards; the README's example runs."""
from __future__ import annotations

import os
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO_ROOT, skip_without

skip_without("trl", "trl", "datasets", "torch", "transformers")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from search_env import AGENT, ENVIRONMENT, BatchSearchQAEnv  # noqa: E402
from search_env.integrations._text import chunk_end  # noqa: E402
from search_env.integrations.trl import SearchQARollout, environment_reward, hf_tokenizer  # noqa: E402
from tests.search_env.integrations.scripted import (  # noqa: E402
    PROTOCOLS, base_env, plan_tool, reference, script, shared_settings, stop_cut,
)


@pytest.fixture(scope="module")
def base():
    return base_env()


class ScriptedRollout(SearchQARollout):
    """The adapter with generation replaced by scripted rows: per episode (told apart by its prompt), each
    turn's row is the turn's ids, padded after an EOS when the turn held no stop string, as ``generate``
    leaves a row that stopped; each id's "log-prob" is a distinct number, to check where it lands."""

    def __init__(self, *args, rows_by_prompt, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows_by_prompt = rows_by_prompt
        self.turn = {prompt: 0 for prompt in rows_by_prompt}

    def _sample(self, trainer, config, contexts):
        rows, logps = [], []
        for context in contexts:
            prompt = next(p for p in self.rows_by_prompt if tuple(context[:len(p)]) == p)
            row = self.rows_by_prompt[prompt][self.turn[prompt]]
            self.turn[prompt] += 1
            rows.append(row)
            logps.append([-(k + 1) / 1000 for k in range(len(row))])
        return rows, logps


def fake_trainer():
    return SimpleNamespace(state=SimpleNamespace(global_step=0), generation_config=GenerationConfig())


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_scripted_rollout_matches_gym_make(base, protocol):
    settings = shared_settings(base, protocol)
    examples = [base.examples[3], base.examples[7]]
    tool = plan_tool(base, protocol)
    refs = [reference(settings, ex, script(protocol, ex, tool)) for ex in examples]
    codec = base.codec
    eos, pad = min(codec.eos_ids), codec.pad_id
    rows_by_prompt = {}
    for ex, ref in zip(examples, refs):
        rows = []
        for turn in script(protocol, ex, tool)[:len(ref.chunks)]:
            ids = codec.encode(turn.text(protocol))
            stopped = stop_cut(codec, protocol, ids)[1]
            rows.append(ids if stopped else ids + [eos, pad, pad])  # generation ran past its stop string, or ended
        rows_by_prompt[tuple(ref.prompt_ids)] = rows
    rollout = ScriptedRollout(BatchSearchQAEnv(1, **settings), rows_by_prompt=rows_by_prompt)
    out = rollout([ex.question for ex in examples], fake_trainer())

    rewards = environment_reward([], [], **{k: v for k, v in out.items() if k == "episode_reward"})
    for ref, prompt_ids, completion, mask, logprobs, reward in zip(
        refs, out["prompt_ids"], out["completion_ids"], out["env_mask"], out["logprobs"], rewards
    ):
        assert prompt_ids + completion == ref.token_ids
        assert mask == ref.trained[len(prompt_ids):]
        assert reward == ref.reward and reward > 0
        # Each turn's log-probs sit on that turn's agent tokens, in order; environment tokens get 0.
        producers = rollout.env_for(2).envs[refs.index(ref)].trajectory.producers[len(prompt_ids):]
        expected = []
        for chunk, env_ids in zip(ref.chunks, ref.env_ids):
            expected += [-(k + 1) / 1000 for k in range(len(chunk))] + [0.0] * len(env_ids)
        assert logprobs == expected
        assert [lp for lp, who in zip(logprobs, producers) if who == ENVIRONMENT] == [0.0] * sum(map(len, ref.env_ids))
    assert rollout.last.turns == max(len(ref.chunks) for ref in refs)


def test_a_turn_ends_after_a_stop_string_spread_over_several_tokens(split_tag_tokenizer):
    env = BatchSearchQAEnv(1, protocol="search-r1", tokenizer=split_tag_tokenizer)
    codec = env.codec
    stops = env.protocol.stop_strings
    for text in ("where people <search> the answer </search> is in the", "the answer </answer> live", "no tag at all"):
        ids = codec.encode(text)
        # Independently: the shortest prefix whose text holds a stop string (the whole row when none does).
        expected = next((k for k in range(1, len(ids) + 1) if any(s in codec.decode(ids[:k]) for s in stops)), len(ids))
        assert chunk_end(codec, stops, ids) == expected
    eos = min(codec.eos_ids)
    assert chunk_end(codec, stops, codec.encode("the answer") + [eos] + codec.encode("</search>")) == len(codec.encode("the answer")) + 1
    env.close()


def calling_model(codec):
    """A tiny Llama whose next token ignores the context: ``<search>`` and ``</search>`` a quarter of the
    time each, any other id uniformly otherwise - so episodes search again and again (multi-turn)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=codec.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, eos_token_id=min(codec.eos_ids),
                         pad_token_id=codec.pad_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    head = torch.nn.Linear(config.hidden_size, codec.vocab_size, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        tags = codec.encode("<search>") + codec.encode("</search>")
        assert len(tags) == 2, "the built-in tokenizer has the search tags as single tokens"
        # exp(b) / (exp(b) * 2 + vocab - 2) = 1/4  =>  exp(b) = (vocab - 2) / 2
        head.bias[tags] = torch.log(torch.tensor((codec.vocab_size - 2) / 2.0))
    model.lm_head = head
    return model


def grpo_args(tmp_path: Path, **changes) -> GRPOConfig:
    settings = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                    save_strategy="no", disable_tqdm=True, per_device_train_batch_size=4, num_generations=2,
                    max_completion_length=24, temperature=1.0, top_p=1.0, learning_rate=1e-3, beta=0.0, seed=0,
                    logging_steps=1, shuffle_dataset=False)
    return GRPOConfig(**{**settings, **changes})


@pytest.mark.slow
def test_grpo_trainer_trains_on_the_environments_rewards_with_the_models_logprobs(tmp_path):
    rollout = SearchQARollout(protocol="search-r1", max_new_tokens=24)
    codec = rollout.codec
    model = calling_model(codec)
    seen = []  # per rollout: the rewards TRL was given, the environment's rewards, and the rollout itself

    def recorded(prompts, completions, episode_reward, **kwargs):
        assert len(prompts) == 4 and len(set(prompts)) == 2  # TRL's sampler repeats each question per generation
        rewards = environment_reward(prompts, completions, episode_reward)
        seen.append((rewards, [e.trajectory.reward for e in rollout.env_for(len(prompts)).envs],
                     [e.trajectory for e in rollout.env_for(len(prompts)).envs]))
        return rewards

    def searches(prompts, completions, **kwargs):
        """A second reward that varies within a group (a random policy's answers rarely earn the environment's
        reward), so that the advantages, and the update, are not zero."""
        return [float(len(e.trajectory.tool_calls)) for e in rollout.env_for(len(prompts)).envs]

    recorded.__name__ = "environment_reward"
    trainer = GRPOTrainer(model=model, args=grpo_args(tmp_path, max_steps=2), reward_funcs=[recorded, searches],
                          processing_class=rollout.tokenizer, rollout_func=rollout,
                          train_dataset=Dataset.from_dict({"prompt": rollout.questions[:4]}))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2
    for rewards, env_rewards, _ in seen:
        assert rewards == env_rewards
    logged = [log["rewards/environment_reward/mean"] for log in trainer.state.log_history if "reward" in log]
    assert logged == pytest.approx([sum(r) / len(r) for r, _, _ in seen])
    assert rollout.last.turns > 1 and any(t.tool_calls for _, _, trajs in seen for t in trajs)

    # The last rollout's log-probs are the sampling model's own (one forward pass over each episode; the
    # update changed the weights since, so they are checked on a fresh rollout with the trained model).
    out = rollout([rollout.questions[0]] * 2, trainer)
    for prompt_ids, completion, mask, logprobs, env in zip(out["prompt_ids"], out["completion_ids"], out["env_mask"],
                                                          out["logprobs"], rollout.env_for(2).envs):
        t = env.trajectory
        assert prompt_ids + completion == list(t.token_ids) and mask == list(t.trained[t.prompt_length:])
        assert sum(mask) == 24  # no answer tag: every episode spends its whole agent budget
        ids = torch.tensor([t.token_ids])
        with torch.no_grad():
            expected = model(ids).logits[0, :-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0][t.prompt_length - 1:]
        agent = torch.tensor([who == AGENT for who in t.producers[t.prompt_length:]])
        got = torch.tensor(logprobs)
        torch.testing.assert_close(got[agent], expected[agent], atol=1e-4, rtol=0)
        assert torch.all(got[~agent] == 0)
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters()), "two steps changed no weight"


def test_prompts_that_are_not_the_examples_questions_are_refused(base):
    rollout = SearchQARollout(BatchSearchQAEnv(1, **shared_settings(base, "search-r1")))
    with pytest.raises(ValueError, match="no example asks"):
        rollout(["not a question of the dataset"], fake_trainer())
    with pytest.raises(ValueError, match="not both"):
        SearchQARollout(rollout.env_for(1), protocol="search-r1")
    assert hf_tokenizer(rollout.codec).convert_tokens_to_ids(rollout.tokenizer.eos_token) == min(rollout.codec.eos_ids)


@pytest.mark.slow
def test_the_readme_example_trains_two_steps(tmp_path, monkeypatch, capsys):
    example = REPO_ROOT / "examples" / "trl_grpo.py"
    readme = (REPO_ROOT / "README.rst").read_text(encoding="utf-8")
    lines = example.read_text(encoding="utf-8").splitlines()[1:]  # after the docstring
    shown = "\n".join("    " + line if line.strip() else "" for line in lines)
    assert shown in readme, "the README shows examples/trl_grpo.py as it is"
    count = sum(1 for line in lines if line.strip())
    assert count < 20 and f"``examples/trl_grpo.py``, {count} lines" in readme, "a TRL user trains in under 20 lines"
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(example), run_name="__main__")
    assert "\nsteps: 2 rewards: [" in capsys.readouterr().out
