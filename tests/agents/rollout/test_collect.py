"""Rollouts with the KV-cached sampler: token-in/token-out over every protocol, the cache's holes, stops.

A random tiny model almost never writes a tag, so the model here gets a bigram bias towards the
protocol's tags (:class:`TagBiasedLM`): episodes then mix searches, answers, error observations for
stray close tags, EOS and budget cuts, with tags split over several tokens where the tokenizer splits
them. Every test checks the ids against the environment's trajectory, so a wrong stop, a wrong position
or a stale cache entry shows up as a failure rather than as slightly different text.
"""
from __future__ import annotations

import os

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402
from torch import nn  # noqa: E402

import agents.rollout.hf_sampler as sampler_module  # noqa: E402
from search_env.protocols import SEARCH_R1_COMPACT  # noqa: E402
from agents.rollout.agent import Chunk  # noqa: E402
from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.policies.policy import HFPolicy  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.batch import build_batch  # noqa: E402
from agents.rollout.hf_sampler import HFSampler, cache_keyword  # noqa: E402
from search_env import AGENT, SEED_PROTOCOLS, BatchSearchQAEnv, get_protocol  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402


class TagBiasedLM(nn.Module):
    """A tiny random causal LM whose logits get a bias towards the protocol's tags: a tag's first token
    is likely anywhere, its next tokens after the previous one (and, where the vocabulary has one, a
    longer token that ends the tag inside it). It counts the tokens fed through a cache."""

    def __init__(self, codec, protocol, *, seed=0, start=3.0, follow=12.0, eos=0.5):
        super().__init__()
        self.lm = tiny_causal_lm(codec.vocab_size, seed=seed)
        self.config = self.lm.config
        bias = torch.zeros(self.config.vocab_size)
        pairs = set()
        for tag in (protocol.call_open, protocol.call_close, protocol.answer_open, protocol.answer_close):
            ids = codec.encode(tag)
            bias[ids[0]] = start
            pairs.update(zip(ids, ids[1:]))
            last = codec.token_bytes[ids[-1]]
            if len(ids) > 1:
                longer = [i for i, b in enumerate(codec.token_bytes) if b != last and b.startswith(last)][:2]
                pairs.update((ids[-2], i) for i in longer)
        if protocol.call_kind == "tools":  # a turn of native tool calls ends with EOS, which runs them
            pairs.add((codec.encode(protocol.call_close)[-1], min(codec.eos_ids)))
        bias[list(codec.eos_ids)] = eos
        self.register_buffer("bias", bias)
        self.register_buffer("after", torch.tensor(sorted(a for a, _ in pairs), dtype=torch.long))
        self.register_buffer("then", torch.tensor([b for _, b in sorted(pairs)], dtype=torch.long))
        self.follow = follow
        self.fed_tokens = 0
        self.decode_batch_sizes: list[int] = []

    def get_input_embeddings(self):
        return self.lm.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None, cache=None, **kwargs):
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, **{cache_keyword(self.lm): cache}, **kwargs)
        if cache is not None:
            self.fed_tokens += int(attention_mask[:, -input_ids.shape[1] :].sum())
            if input_ids.shape[1] == 1:
                self.decode_batch_sizes.append(input_ids.shape[0])
        current = input_ids[:, -out.logits.shape[1] :]
        logits = out.logits + self.bias
        if len(self.after):
            hits = (current[..., None] == self.after).to(logits.dtype) * self.follow
            logits = logits.index_add(2, self.then, hits)
        out.logits = logits
        return out


def biased_policy(codec, protocol, seed=0, **bias) -> HFPolicy:
    return HFPolicy(TagBiasedLM(codec, get_protocol(protocol), seed=seed, **bias), codec)


def last_agent_token(traj) -> int:
    return max(t for t in range(len(traj.token_ids)) if traj.producers[t] == AGENT)


def tokens_fed_once(trajectories) -> int:
    """What a sampler that keeps its cache across turns runs through the model: the prompts' common prefix
    once, the rest of each distinct prompt once (a question's samples share it), then every token up to an
    episode's last agent token once. Re-running a context at a later turn would add to it."""
    prompts = list(dict.fromkeys(tuple(t.token_ids[: t.prompt_length]) for t in trajectories))
    shared = min(len(os.path.commonprefix(prompts)), min(map(len, prompts)) - 1)
    return shared + sum(len(p) - shared for p in prompts) + sum(last_agent_token(t) - t.prompt_length for t in trajectories)


def check_token_in_token_out(policy, sampler, rollout, *, atol=1e-4):
    """Trajectories, learner batch, sampler cache and sampled log-probs all hold the same ids. (The model
    never needs what the environment wrote after an episode's last agent token, e.g. an error text
    for a closing tag that was also the last token of the budget.)"""
    trajectories = rollout.trajectories
    batch = build_batch(trajectories, rollout.group_ids, policy.codec.pad_id)
    for b, traj in enumerate(trajectories):
        n = len(traj.token_ids)
        assert batch.input_ids[b, :n].tolist() == traj.token_ids
        assert batch.trained_mask[b, :n].tolist() == list(traj.trained)
        assert batch.attention_mask[b].sum() == n and batch.trained_mask[b, n:].sum() == 0
        last = last_agent_token(traj)
        assert sampler.context_ids(b) == traj.token_ids[: last + 1]
        assert all(p != AGENT for p in traj.producers[last + 1 :])
    with torch.no_grad():
        out = policy(batch.input_ids, batch.attention_mask, batch.position_ids, temperature=sampler.sampling.temperature)
    agent = torch.zeros_like(batch.trained_mask, dtype=torch.bool)
    sampled = torch.zeros_like(out.logprobs)
    for b, (traj, logprobs) in enumerate(zip(trajectories, rollout.sampled_logprobs)):
        agent[b, : len(traj.producers)] = torch.tensor(list(traj.producers)) == AGENT
        sampled[b, : len(logprobs)] = torch.tensor(logprobs)
    assert torch.allclose(out.logprobs[agent], sampled[agent], atol=atol)
    assert torch.all(sampled[~agent] == 0)
    return batch


def multi_turn(traj) -> bool:
    """An episode where the agent wrote after the environment had appended tokens mid-episode."""
    seen_env = False
    for t in range(traj.prompt_length, len(traj.token_ids)):
        if traj.producers[t] != AGENT:
            seen_env = True
        elif seen_env:
            return True
    return False


@pytest.fixture(scope="module")
def codec():
    return as_codec(None)


@pytest.mark.parametrize("protocol", [*SEED_PROTOCOLS, SEARCH_R1_COMPACT.name, "tool-calls"])
def test_token_in_token_out_over_every_protocol_with_the_builtin_tokenizer(codec, protocol):
    policy = biased_policy(codec, protocol)
    env = BatchSearchQAEnv(8, protocol=protocol, tokenizer=codec, max_new_tokens=96)
    sampler = HFSampler(policy, temperature=0.9, seed=1)
    rollout = collect_rollouts(sampler, env, [0, 1, 2, 3], group_size=2)
    check_token_in_token_out(policy, sampler, rollout)
    assert any(multi_turn(t) for t in rollout.trajectories)
    assert policy.model.fed_tokens == tokens_fed_once(rollout.trajectories)
    if protocol == "tool-calls":  # a turn of calls ends with EOS, and the sampler writes on after its tool turn
        eos = min(codec.eos_ids)
        assert any(eos in t.token_ids[t.prompt_length : -1] for t in rollout.trajectories)


def test_tags_split_over_tokens_and_ending_inside_a_token_stop_where_the_env_does(split_tag_tokenizer):
    codec = as_codec(split_tag_tokenizer)
    assert len(codec.encode("</answer>")) > 1
    policy = biased_policy(codec, "search-r1", seed=3, start=4.0)
    env = BatchSearchQAEnv(8, protocol="search-r1", tokenizer=codec, max_new_tokens=80, max_context=4096,
                           chat_template=False)
    sampler = HFSampler(policy, seed=2)
    rollout = collect_rollouts(sampler, env, [0, 1, 2, 3, 4, 5, 6, 7])
    check_token_in_token_out(policy, sampler, rollout)
    assert any(multi_turn(t) for t in rollout.trajectories)


class CountingSampler(HFSampler):
    """Counts the chunks it generated."""

    chunks = 0

    def generate(self, rows, budgets):
        out = super().generate(rows, budgets)
        self.chunks += len(out)
        return out


@pytest.mark.parametrize("park, compact", [(0.0, 0.0), (1.01, 1.0)])
def test_parking_idle_rows_and_compacting_holes_keep_every_row_exact(codec, monkeypatch, park, compact):
    """Set idle rows aside at every stop and compact at every turn, or never: the same checks hold; and
    with parking, a decoding step runs on the rows still generating only."""
    monkeypatch.setattr(sampler_module, "PARK_FRACTION", park)
    monkeypatch.setattr(sampler_module, "COMPACT_HOLE_FRACTION", compact)
    monkeypatch.setattr(sampler_module, "_COMPACT_MIN_LENGTH", 0)
    policy = biased_policy(codec, "search-r1", seed=4)
    env = BatchSearchQAEnv(6, tokenizer=codec, max_new_tokens=80)
    sampler = CountingSampler(policy, seed=3)
    rollout = collect_rollouts(sampler, env, [5, 6, 7], group_size=2)
    check_token_in_token_out(policy, sampler, rollout)
    # A chunk's ids are fed one decoding step each, but its last id waits for the next turn's block.
    fed_while_decoding = sum(sum(t.producers) for t in rollout.trajectories) - sampler.chunks
    rows_decoded = sum(policy.model.decode_batch_sizes)
    assert rows_decoded == fed_while_decoding if park == 0.0 else rows_decoded > fed_while_decoding


def test_dropout_is_off_while_sampling_and_the_mode_is_restored(codec):
    lm = tiny_causal_lm(codec.vocab_size, dropout=0.5, seed=5)
    policy = HFPolicy(lm, codec).train()
    env = BatchSearchQAEnv(2, tokenizer=codec, max_new_tokens=24)
    sampler = HFSampler(policy, seed=0)
    rollout = collect_rollouts(sampler, env, [0, 1])
    assert lm.training
    lm.eval()
    check_token_in_token_out(policy, sampler, rollout)


def test_the_same_seed_gives_the_same_rollout_and_greedy_equals_a_tiny_top_p(codec):
    policy = biased_policy(codec, "search-r1", seed=6)
    env = BatchSearchQAEnv(4, tokenizer=codec, max_new_tokens=40)

    def ids(**options):
        return [t.token_ids for t in collect_rollouts(HFSampler(policy, **options), env, [0, 1, 2, 3]).trajectories]

    assert ids(seed=1) == ids(seed=1)
    assert ids(seed=1) != ids(seed=2)
    assert ids(greedy=True) == ids(top_p=1e-6, seed=3)


def test_samples_follow_the_tempered_distribution_and_top_p_drops_the_tail(codec):
    policy = HFPolicy(tiny_causal_lm(codec.vocab_size, seed=7), codec)
    prompt = codec.encode("Who founded the city")
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt])).logits[0, -1] / 0.1
    probs = torch.softmax(logits, -1)
    n = 3000

    def first_tokens(top_p):
        sampler = HFSampler(policy, temperature=0.1, top_p=top_p, seed=11)
        sampler.begin([prompt] * n, examples=[None] * n, protocol=get_protocol("search-r1"), codec=codec)
        return torch.tensor([c.ids[0] for c in sampler.generate(list(range(n)), [1] * n)])

    drawn = first_tokens(1.0)
    top = probs.argsort(descending=True)[:3]
    for token in top:
        p = float(probs[token])
        assert abs(float((drawn == token).float().mean()) - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-3
    nucleus = first_tokens(float(probs[top[0]]) + 1e-4)  # just past the top id's mass: two ids survive
    assert set(nucleus.tolist()) <= {int(top[0]), int(top[1])}
    share = float((nucleus == top[0]).float().mean())
    expected = float(probs[top[0]] / (probs[top[0]] + probs[top[1]]))
    assert abs(share - expected) < 4 * (expected * (1 - expected) / n) ** 0.5 + 1e-3


def test_chunks_respect_budgets_and_the_sampler_checks_its_inputs(codec, split_tag_tokenizer):
    policy = HFPolicy(tiny_causal_lm(codec.vocab_size, seed=8), codec)
    sampler = HFSampler(policy, seed=0)
    protocol = get_protocol("search-r1")
    with pytest.raises(ValueError, match="not the policy's"):
        sampler.begin([[5, 6]], examples=[None], protocol=protocol, codec=as_codec(split_tag_tokenizer))
    sampler.begin([[5, 6, 7], [8]], examples=[None, None], protocol=protocol, codec=codec)
    chunks = sampler.generate([0, 1], [3, 1])
    assert len(chunks[1].ids) == 1 and 1 <= len(chunks[0].ids) <= 3
    with pytest.raises(ValueError, match="exactly the rows still running"):
        sampler.generate([0], [4])
    with pytest.raises(ValueError, match="at least one token"):
        sampler.generate([0, 1], [0, 4])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        HFSampler(policy, temperature=0)


class _Scripted:
    """A rollout agent that writes fixed chunks: for checking what the rollout does with bad ones."""

    def __init__(self, chunks):
        self.chunks = chunks

    def begin(self, prompt_ids, *, examples, protocol, codec):
        self.codec = codec

    def generate(self, rows, budgets):
        return [Chunk(self.codec.encode(self.chunks)) for _ in rows]

    def feed(self, row, token_ids):
        pass

    def finish(self, row):
        pass


def test_a_chunk_that_runs_past_a_stop_string_is_refused(codec):
    env = BatchSearchQAEnv(1, tokenizer=codec)
    with pytest.raises(RuntimeError, match="ended the turn inside the chunk"):
        collect_rollouts(_Scripted("<search> who </search> and more"), env, [0])
    with pytest.raises(RuntimeError, match="budget"):
        collect_rollouts(_Scripted("word " * 40), BatchSearchQAEnv(1, tokenizer=codec, max_new_tokens=8), [0])
