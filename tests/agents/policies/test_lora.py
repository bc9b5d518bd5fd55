"""LoRA policies (peft): only the adapters train, the adapters off give the base model exactly, the
adapters start seeded and as the identity, the sampler decodes with them, gradient checkpointing reaches
them, and a saved policy is the merged model (what every tool loads) with the adapters beside it."""
from __future__ import annotations

import copy

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
skip_without("lora", "peft")
import torch  # noqa: E402

from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.loading import load_policy  # noqa: E402
from agents.policies.policy import ADAPTER_DIR, merged_state_dict  # noqa: E402
from agents.rollout.batch import build_batch  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from search_env import BatchSearchQAEnv  # noqa: E402

SHAPE = {"tiny_layers": 2, "tiny_hidden": 32, "tiny_heads": 2}


def lora_policy(rank: int = 4, **changes):
    return load_policy(ModelConfig(**SHAPE, lora_rank=rank, **changes))


def base_policy():
    return load_policy(ModelConfig(**SHAPE))


def trained_adapters(policy, seed: int = 0, scale: float = 0.2) -> None:
    """Stand-in for training: random ``B`` matrices, so the adapters change what the policy computes."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def batch_of(vocab: int, rows: int = 3, width: int = 14):
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (rows, width), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # a left-padded row
    return ids, mask


def logprobs(policy, ids, mask):
    with torch.no_grad():
        return policy(ids, mask).logprobs


def test_only_the_adapters_train_and_they_are_rank_r_on_every_linear_layer_but_the_head():
    policy = lora_policy(rank=4)
    trainable = {name: p for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in name or ".lora_B." in name for name in trainable)
    # An independent count: r x (in + out) for each linear layer of the plain model, its output head aside.
    plain = base_policy().model
    expected = sum(4 * (m.in_features + m.out_features) for name, m in plain.named_modules()
                   if isinstance(m, torch.nn.Linear) and name != "lm_head")
    assert sum(p.numel() for p in trainable.values()) == expected
    assert policy.has_adapters and not base_policy().has_adapters


def test_target_modules_by_name_and_an_unknown_name_is_one_line():
    policy = lora_policy(lora_target_modules=["q_proj", "v_proj"])
    adapted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name, p in policy.named_parameters() if p.requires_grad}
    assert adapted == {"q_proj", "v_proj"}
    with pytest.raises(ValueError) as error:
        lora_policy(lora_target_modules=["no_such_proj"])
    assert "\n" not in str(error.value) and str(error.value).startswith("model.lora_target_modules ['no_such_proj']:")


def test_adapters_start_as_the_identity_seeded_and_leave_the_global_generator_alone():
    ids, mask = batch_of(4096)
    state = torch.get_rng_state()
    first, second = lora_policy(), lora_policy()
    assert torch.equal(torch.get_rng_state(), state)
    a_first = {n: p for n, p in first.named_parameters() if "lora_A" in n}
    assert all(torch.equal(p, dict(second.named_parameters())[n]) for n, p in a_first.items())
    assert any(p.abs().sum() > 0 for p in a_first.values())
    other_seed = load_policy(ModelConfig(**SHAPE, lora_rank=4), seed=1)
    assert any(not torch.equal(p, dict(other_seed.named_parameters())[n]) for n, p in a_first.items())
    assert torch.equal(logprobs(first, ids, mask), logprobs(base_policy(), ids, mask))


def test_adapters_off_is_the_base_model_exactly():
    policy = lora_policy()
    trained_adapters(policy)
    ids, mask = batch_of(policy.vocab_size)
    adapted = logprobs(policy, ids, mask)
    with policy.adapters_off():
        base = logprobs(policy, ids, mask)
    assert torch.equal(base, logprobs(base_policy(), ids, mask))
    assert (adapted - base).abs().max() > 1e-3
    assert torch.equal(logprobs(policy, ids, mask), adapted)  # on again after the block
    with pytest.raises(ValueError, match="no adapters"):
        with base_policy().adapters_off():
            pass


def test_the_sampler_decodes_with_the_adapters_on():
    policy = lora_policy()
    trained_adapters(policy, scale=1.0)
    env = BatchSearchQAEnv(4, tokenizer=policy.codec, max_new_tokens=24)
    sampler = HFSampler(policy, seed=3)
    rollout = collect_rollouts(sampler, env, [0, 1], group_size=2)
    batch = build_batch(rollout.trajectories, rollout.group_ids, policy.codec.pad_id, rollout.sampled_logprobs)
    agent = batch.trained_mask.bool()
    adapted = logprobs(policy, batch.input_ids, batch.attention_mask)
    with policy.adapters_off():
        base = logprobs(policy, batch.input_ids, batch.attention_mask)
    sampled = batch.rollout_logprobs
    assert agent.sum() > 10
    assert torch.allclose(sampled[agent], adapted[agent], atol=1e-4)
    assert (sampled[agent] - base[agent]).abs().max() > 1e-2


def test_gradient_checkpointing_gives_the_adapters_the_same_gradients():
    policy = lora_policy()
    trained_adapters(policy)
    ids, mask = batch_of(policy.vocab_size, rows=4, width=16)

    def gradients():
        policy.zero_grad(set_to_none=True)
        policy.train()
        (-policy(ids, mask).logprobs.sum()).backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad}

    plain = gradients()
    policy.set_gradient_checkpointing(True)
    checkpointed = gradients()
    assert all(g.abs().sum() > 0 for g in plain.values())  # every adapter gets a gradient (A's through B != 0)
    for name, grad in plain.items():
        assert torch.allclose(grad, checkpointed[name], rtol=0, atol=1e-6), name
    assert not any(p.grad is not None for p in policy.parameters() if not p.requires_grad)


def test_a_saved_policy_is_the_merged_model_with_the_adapters_beside_it(tmp_path):
    from peft import PeftModel

    policy = lora_policy()
    trained_adapters(policy)
    ids, mask = batch_of(policy.vocab_size)
    adapted = logprobs(policy, ids, mask)
    # The merge, against peft's own merge of a copy.
    theirs = copy.deepcopy(policy.model).merge_and_unload().state_dict()
    ours = merged_state_dict(policy.model)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    policy.save_pretrained(tmp_path)
    assert torch.equal(logprobs(policy, ids, mask), adapted)  # the policy itself is left unmerged
    reloaded = load_policy(str(tmp_path))
    assert not reloaded.has_adapters
    assert torch.allclose(logprobs(reloaded, ids, mask), adapted, atol=1e-5)
    # The adapters alone, on a base loaded independently, compute the adapted policy exactly.
    base = base_policy()
    base.model = PeftModel.from_pretrained(base.model, tmp_path / ADAPTER_DIR)
    assert torch.equal(logprobs(base, ids, mask), adapted)


def test_a_policy_saved_unmerged_is_its_base_with_the_adapters_beside_it(tmp_path):
    """What vLLM's LoRA engine loads: the frozen base's weights; the adapters on it give the policy."""
    from peft import PeftModel

    policy = lora_policy()
    trained_adapters(policy)
    ids, mask = batch_of(policy.vocab_size)
    adapted = logprobs(policy, ids, mask)
    policy.save_pretrained(tmp_path, merge_adapters=False)
    reloaded = load_policy(str(tmp_path))
    assert reloaded.model.state_dict().keys() == base_policy().model.state_dict().keys()
    assert torch.equal(logprobs(reloaded, ids, mask), logprobs(base_policy(), ids, mask))
    reloaded.model = PeftModel.from_pretrained(reloaded.model, tmp_path / ADAPTER_DIR)
    assert torch.equal(logprobs(reloaded, ids, mask), adapted)


def test_a_bf16_base_keeps_fp32_adapters():
    policy = load_policy(ModelConfig(**SHAPE, lora_rank=4), dtype=torch.bfloat16)
    dtypes = {p.dtype for p in policy.parameters() if p.requires_grad}
    frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
    assert dtypes == {torch.float32} and frozen == {torch.bfloat16}


@pytest.mark.parametrize("changes, message", [
    ({"lora_rank": -1}, "model.lora_rank must be >= 0"),
    ({"lora_alpha": 0.0}, "model.lora_alpha must be a finite number > 0"),
    ({"lora_alpha": float("inf")}, "model.lora_alpha must be a finite number > 0"),
    ({"lora_dropout": 1.0}, r"model.lora_dropout must be in \[0, 1\)"),
    ({"lora_target_modules": []}, "model.lora_target_modules must name modules"),
    ({"lora_target_modules": ["all-linear", "q_proj"]}, "all-linear stands alone"),
])
def test_bad_lora_settings_are_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as error:
        ModelConfig(**changes)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("algo, changes, message", [
    ("grpo", {"warm_start.steps": 5}, "a warm start cannot precede it"),
    ("grpo", {"warm_start.copy_steps": 5}, "a warm start cannot precede it"),
    ("ppo", {}, "use --algorithm.critic head"),
])
def test_what_lora_cannot_run_with_is_refused_when_the_config_is_built(algo, changes, message):
    with pytest.raises(ValueError, match=message) as error:
        TrainConfig(algo).updated({"model.lora_rank": 8, **changes})
    assert "\n" not in str(error.value)
    TrainConfig(algo).updated(changes)  # fine without LoRA
    if algo == "ppo":
        TrainConfig("ppo").updated({"model.lora_rank": 8, "algorithm.critic": "head"})


def test_lora_runs_with_the_vllm_engine():
    """vLLM serves the adapters on the frozen base (tested in ``tests/agents/rollout/test_vllm_engine.py``)."""
    assert TrainConfig("grpo").updated({"model.lora_rank": 8, "rollout.engine": "vllm"}).rollout.engine == "vllm"
