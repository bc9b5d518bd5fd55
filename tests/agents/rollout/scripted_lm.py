"""A tiny Llama whose weights write one protocol's search-then-answer episode, for running rollout
engines on multi-turn episodes without training a model.

An untrained model never calls search, and a warm-started one costs minutes of CPU and still samples
differently from run to run. :func:`scripted_lm` instead sets the weights of a one-layer Llama by hand
so that greedy decoding (and sampling: the chosen id leads by tens of nats) writes a fixed search call,
and once the environment has appended its results, a fixed answer. It is a plain
``LlamaForCausalLM`` (untied LM head), so the HF sampler and vLLM run it like any checkpoint.

How the weights decide the next id: it is a function of the current id and of one bit, whether a
*marker* id occurs in the context so far. The embedding holds a constant unit, a unit per id the script
uses (every other id shares a "default" unit) and an empty *phase* unit. One attention head of the
layer (the other is all zeros) attends from every position to the marker, whose value writes 1 into
the phase unit (the head's query and key use the rotary pair of lowest frequency, so the score barely
depends on distance); before the marker there is nothing to attend to that writes anything, and the
phase stays 0. The MLP writes nothing. The LM head reads the id's unit: for every id the script uses,
a large weight on the id that follows it. An id followed by different ids before and after the marker
gets both, tilted apart by the constant and the phase unit.

The marker is the first id of the search call that no prompt holds: the prompts mention the protocol's
tags (so neither a tag nor the results' closing tag can tell a prompt from an answered call), and the
environment's results may end with the same id as the prompt (Search-R1: both end with a newline).
Because the next id depends on the current one, the script is spelt with ids chosen so that no id is
followed by two different ids in one phase (:func:`script_episode` searches for such a spelling; a
protocol can be spelt in more than one way, and the environment reads bytes, not a canonical
tokenization).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from search_env.protocols import Dialect
from search_env.sources.base import Passage
from search_env.tokenization import TokenCodec

__all__ = ["ScriptedEpisode", "script_episode", "script_texts", "scripted_lm", "scriptable_protocols"]

#: The LM head's weight on an id's successor. After the final norm an id's unit is 1/sqrt(3) or
#: 1/sqrt(2), so the successor leads every other id by more than SUCCESSOR_WEIGHT / 4 / sqrt(3) nats.
SUCCESSOR_WEIGHT = 240.0
#: The attention score of the marker (before the rotary factor, at least cos(0.55) within 4096
#: positions): its softmax weight is 1 within float precision however long the context.
MARKER_SCORE = 40.0
#: :func:`scripted_lm` refuses weights whose chosen id leads by less than this (nats), so that no
#: kernel's rounding can change an episode.
MIN_MARGIN = 20.0

_HEAD_DIM = 64
_ROTARY_SLOW = _HEAD_DIM // 2 - 1  # the query/key dimension rotated by the lowest rotary frequency
_CONSTANT, _PHASE, _DEFAULT = 0, 1, 2  # residual units; the script's ids take the units after these


@dataclass
class ScriptedEpisode:
    """What a scripted model writes under one protocol, and the transitions that make it write it.

    Attributes:
        protocol: the protocol's name.
        search_ids: the first agent chunk: the search call, from the call's open tag to its close tag.
        answer_ids: the agent's last chunk(s): the answer, then end-of-sequence where the protocol's
            episodes run on past the answer (ReSearch).
        marker: the id whose presence in the context switches the model to answering.
        starts: the ids prompts end with (each is followed by the call).
        resumes: the ids the environment's observations end with (each is followed by the answer).
        successors: (phase, id) -> the id the model writes next; phase 1 once the marker has occurred.
    """

    protocol: str
    search_ids: list[int]
    answer_ids: list[int]
    marker: int
    starts: frozenset[int]
    resumes: frozenset[int]
    successors: dict[tuple[int, int], int]

    @property
    def agent_ids(self) -> list[int]:
        """Every id the agent writes in an episode, in order."""
        return self.search_ids + self.answer_ids


def scriptable_protocols() -> list[str]:
    """The registered protocols a scripted model can write: all but native tool calls, whose JSON
    repeats the quote id with different successors (the built-in tokenizer has no id holding a quote
    and anything else), which no spelling with one successor per id can write."""
    from search_env import available_protocols, get_protocol

    return [name for name in available_protocols() if get_protocol(name).call_kind != "tools"]


def script_texts(protocol: Dialect, query: str, answer: str) -> tuple[str, str]:
    """The search call and the answer a scripted model writes, in the protocol's dialect.

    A close tag follows its content without the usual space: the built-in tokenizer has a single space
    id, which could not be followed by two different close tags in one phase. An NL-DAG call is a
    one-node plan on the protocol's first plan tool.
    """
    if protocol.call_kind == "dag":
        tool = protocol.plan_tools[0][0] if protocol.plan_tools else "General"
        call = f"{protocol.call_open}A: {query} ({tool}){protocol.call_close}"
    else:
        call = f"{protocol.call_open} {query}{protocol.call_close}"
    written = f"{protocol.answer_open} {protocol.answer_template.format(answer=answer)}{protocol.answer_close}"
    return call, protocol.answer_prefix + written


def _observation_ends(protocol: Dialect, codec: TokenCodec) -> frozenset[int]:
    """The ids an observation of the protocol can end with: results, no results, an error, and a
    result block cut to its suffix."""
    texts = [protocol.results_text([Passage("p1", "Title", "Some text.")]), protocol.results_text([]),
             protocol.error_text("An error."), protocol.result_suffix]
    return frozenset(codec.encode(text)[-1] for text in texts if text)


class _Speller:
    """Spells texts with ids so that every (phase, id) has one successor; see :func:`script_episode`."""

    def __init__(self, codec: TokenCodec, prompt_ids: frozenset[int]) -> None:
        self.prompt_ids = prompt_ids
        self.by_bytes: dict[bytes, list[int]] = {}
        special = set(codec.eos_ids) | {codec.pad_id}
        for tid, piece in enumerate(codec.token_bytes):
            if piece and tid not in special:
                self.by_bytes.setdefault(piece, []).append(tid)
        self.longest = max(map(len, self.by_bytes))
        self.successors: dict[tuple[int, int], int] = {}
        self.marker: int | None = None

    def link(self, before: list[tuple[int, int]], tid: int) -> list[tuple[int, int]] | None:
        """Make ``tid`` the successor of every (phase, id) in ``before``; the links added, or None when
        one of them already has another successor."""
        added = []
        for key in before:
            known = self.successors.get(key)
            if known is None:
                self.successors[key] = tid
                added.append(key)
            elif known != tid:
                for undo in added:
                    del self.successors[undo]
                return None
        return added

    def spell(self, text: bytes, before: list[tuple[int, int]], phase: int, pos: int = 0) -> list[int] | None:
        """Ids spelling ``text[pos:]``, the first of them following every (phase, id) in ``before``; in
        phase 0 the first id no prompt holds becomes the marker and starts phase 1. Longer ids first,
        backtracking on a conflict; None when no spelling fits."""
        if pos == len(text):
            return []
        for length in range(min(self.longest, len(text) - pos), 0, -1):
            for tid in self.by_bytes.get(text[pos : pos + length], ()):
                marks = phase == 0 and tid not in self.prompt_ids
                added = self.link(before, tid)
                if added is None:
                    continue
                if marks:
                    self.marker = tid
                rest = self.spell(text, [(1 if marks else phase, tid)], 1 if marks else phase, pos + length)
                if rest is not None:
                    return [tid] + rest
                if marks:
                    self.marker = None
                for key in added:
                    del self.successors[key]
        return None


def script_episode(protocol: Dialect, codec: TokenCodec, prompts: Sequence[Sequence[int]], *,
                   query: str = "studied", answer: str = "yes") -> ScriptedEpisode:
    """The episode a scripted model writes under ``protocol`` after any of ``prompts`` (the prompt ids
    of every question it will be given: the marker must occur in none of them).

    Raises:
        ValueError: no spelling of the protocol's texts gives every (phase, id) one successor, or every
            id of the call occurs in a prompt (there is no marker).
    """
    call, written = script_texts(protocol, query, answer)
    starts = frozenset(p[-1] for p in prompts)
    resumes = _observation_ends(protocol, codec)
    speller = _Speller(codec, frozenset(i for p in prompts for i in p))
    search_ids = speller.spell(call.encode(), [(0, s) for s in sorted(starts)], 0)
    if search_ids is None or speller.marker is None:
        raise ValueError(f"protocol {protocol.name!r}: no spelling of {call!r} has a marker and one successor per id and phase")
    answer_ids = speller.spell(written.encode(), [(1, r) for r in sorted(resumes)], 1)
    if answer_ids is None:
        raise ValueError(f"protocol {protocol.name!r}: no spelling of {written!r} has one successor per id and phase")
    eos = min(codec.eos_ids)
    if speller.link([(1, answer_ids[-1])], eos) is None:
        raise ValueError(f"protocol {protocol.name!r}: the answer's last id is followed by another id already")
    if not protocol.answer_ends_episode:
        answer_ids = answer_ids + [eos]
    return ScriptedEpisode(protocol.name, search_ids, answer_ids, speller.marker, starts, resumes,
                           dict(speller.successors))


def scripted_lm(episode: ScriptedEpisode, codec: TokenCodec, *, hidden: int = 128,
                max_positions: int = 4096) -> LlamaForCausalLM:
    """A one-layer Llama over ``codec``'s vocabulary that writes ``episode`` (see the module docstring).

    ``hidden`` (a multiple of 64, the heads' width) must leave a unit for every id the episode's
    transitions read. All shapes depend on ``codec`` and ``hidden`` alone, so the models of two
    protocols can replace each other's weights in a running engine.

    Raises:
        ValueError: ``hidden`` does not fit, or the built model's choice of a successor leads by less
            than :data:`MIN_MARGIN` nats (checked by running the model on every scripted transition).
    """
    eos = min(codec.eos_ids)
    reads = sorted({tid for _, tid in episode.successors} | {episode.marker})
    unit = {tid: _DEFAULT + 1 + i for i, tid in enumerate(reads)}
    if hidden % _HEAD_DIM or _DEFAULT + 1 + len(reads) > hidden:
        raise ValueError(f"hidden={hidden} is not a multiple of {_HEAD_DIM} of at least {_DEFAULT + 1 + len(reads)} "
                         f"({len(reads)} scripted ids and 3 more units)")
    config = LlamaConfig(
        vocab_size=codec.vocab_size, hidden_size=hidden, intermediate_size=_HEAD_DIM, num_hidden_layers=1,
        num_attention_heads=hidden // _HEAD_DIM, num_key_value_heads=hidden // _HEAD_DIM, head_dim=_HEAD_DIM,
        max_position_embeddings=max_positions, tie_word_embeddings=False, rms_norm_eps=1e-6,
        eos_token_id=eos, pad_token_id=codec.pad_id, bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        embed = model.model.embed_tokens.weight
        embed[:, _CONSTANT] = 1.0
        embed[:, _DEFAULT] = 1.0
        for tid, u in unit.items():
            embed[tid, _DEFAULT] = 0.0
            embed[tid, u] = 1.0
        layer = model.model.layers[0]
        # Every embedding has two unit entries, so this norm's weight makes it the identity.
        layer.input_layernorm.weight.fill_((2.0 / hidden) ** 0.5)
        layer.post_attention_layernorm.weight.fill_(1.0)
        scale = (MARKER_SCORE * _HEAD_DIM**0.5) ** 0.5  # query * key / sqrt(head_dim) = MARKER_SCORE
        attention = layer.self_attn
        attention.q_proj.weight[_ROTARY_SLOW, _CONSTANT] = scale
        attention.k_proj.weight[_ROTARY_SLOW, unit[episode.marker]] = scale
        attention.v_proj.weight[0, unit[episode.marker]] = 1.0
        attention.o_proj.weight[_PHASE, 0] = 1.0
        model.model.norm.weight.fill_(hidden**-0.5)  # the final hidden state, divided by its length
        head = model.lm_head.weight
        head[eos, _DEFAULT] = SUCCESSOR_WEIGHT
        for tid in reads:
            before, after = episode.successors.get((0, tid)), episode.successors.get((1, tid))
            for successor in {before, after} - {None}:
                head[successor, unit[tid]] = SUCCESSOR_WEIGHT
            if before is not None and after is not None and before != after:
                head[after, _CONSTANT] -= SUCCESSOR_WEIGHT / 4
                head[after, _PHASE] += SUCCESSOR_WEIGHT / 2
    model.eval()
    _check_margins(model, episode, codec)
    return model


@torch.no_grad()
def _check_margins(model: LlamaForCausalLM, episode: ScriptedEpisode, codec: TokenCodec) -> None:
    """Run the model on each scripted transition (the id alone for phase 0, after the marker for
    phase 1) and on an unscripted id, and check the intended successor leads by :data:`MIN_MARGIN`."""
    eos = min(codec.eos_ids)
    unscripted = next(t for t in range(codec.vocab_size) if all(t != k for _, k in episode.successors) and t != episode.marker)
    cases = [((phase, tid), nxt) for (phase, tid), nxt in episode.successors.items()]
    cases += [((0, unscripted), eos), ((1, unscripted), eos)]
    for (phase, tid), nxt in cases:
        ids = [episode.marker, tid] if phase else [tid]
        logits = model(torch.tensor([ids])).logits[0, -1, : codec.vocab_size]
        top = torch.topk(logits, 2)
        if int(top.indices[0]) != nxt or float(top.values[0] - top.values[1]) < MIN_MARGIN:
            raise ValueError(f"the scripted model follows id {tid} (phase {phase}) with {int(top.indices[0])} leading by "
                             f"{float(top.values[0] - top.values[1]):.1f}, not with {nxt} by {MIN_MARGIN}")
