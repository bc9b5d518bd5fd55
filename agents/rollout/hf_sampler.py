"""Batched multi-turn sampling from a local ``transformers`` model that keeps its KV cache across turns.

A rollout alternates generation and environment tokens. Re-running the whole context through the model
at every turn costs a prefill per turn; :class:`HFSampler` instead keeps one ``DynamicCache`` for all
rows and appends to it: the environment's tokens (with the row's last sampled token, not yet in the
cache) go in as one block per turn, generated tokens one column per step.

Rows move at different paces, so the cache has *holes*: columns where a row had nothing to add (it
had stopped, or its block was shorter than another row's). Holes are masked out by an explicit 2-D
attention mask, and ``position_ids`` count each row's real tokens only, so every row sees exactly the
positions and context it would see alone. Rows that have stopped stop costing: once enough rows of a
decoding batch are idle they are set aside (their cache rows copied out) and the rest decode on; the
parts are joined again, padded with holes, before the next block. When holes make up most of the
cache it is compacted (each row's real columns gathered to the right). A row whose episode ended is
dropped from the cache. The cache grows in place (``DynamicCache`` with layers that append into spare
capacity instead of concatenating the whole cache at every token).

Prompts share work: the prefix common to all of them (a protocol's instructions) runs through the
model once, each distinct prompt's remainder once (the ``group_size`` samples of a question share it),
and the rows get copies of the result.

Stop strings are found on the exact bytes of the sampled ids: only ids whose bytes hold the last byte
of a stop string (a table built once per protocol) get a byte-level look, so the per-step cost is a few
tensor ops on the whole batch.

Every episode draws from a random stream of its own, keyed by the sampler's seed and the episode's index
(:func:`row_keys`): its k-th token takes the k-th number of that stream (:func:`uniforms`, counter-based,
so no generator state is shared between rows). A row's tokens therefore do not depend on which rows share
its batch or when they stop: the same rows sampled together, in smaller batches, or on other
data-parallel ranks (each starting at its share's ``first_row``) draw the same tokens, up to the float
rounding a batch's shape may change in the logits.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agents.rollout.agent import Chunk, SamplingParams, turn_stop_strings
from agents.policies.policy import HFPolicy
from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec

__all__ = ["HFSampler", "StopScanner", "cache_keyword", "row_keys", "uniforms"]

#: Set idle rows aside once they are at least this share of the decoding batch.
PARK_FRACTION = 0.25
#: Compact the cache when holes are more than this share of its entries (and it has some length).
COMPACT_HOLE_FRACTION = 0.5
_COMPACT_MIN_LENGTH = 64


@dataclass
class _KVBatch:
    """Some rows' KV cache with, per column, the attention mask and the id that was fed there."""

    cache: DynamicCache
    mask: torch.Tensor  # (B, L) long: 1 where the row has a real token
    ids: torch.Tensor  # (B, L) long: the id fed at each column (pad in holes)
    rows: torch.Tensor  # (B,) long: the episode row of each cache row
    pos: torch.Tensor  # (B,) long: real tokens in the cache (the next token's position)

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def select(self, index: torch.Tensor, config) -> _KVBatch:
        """A copy holding the rows at ``index`` (in that order), spare capacity included."""
        layers = [(layer.key_buf.index_select(0, index), layer.value_buf.index_select(0, index))
                  for layer in self.cache.layers if layer.is_initialized]
        return _KVBatch(_cache(config, layers, self.length), self.mask[index], self.ids[index], self.rows[index], self.pos[index])

    def compacted(self, config) -> _KVBatch:
        """The same rows with each row's real columns moved right, in order, and all-hole columns gone."""
        order = torch.argsort(self.mask, dim=1, stable=True)  # holes first, then real columns in order
        keep = int(self.mask.sum(1).max())
        index = order[:, self.length - keep :]
        layers = []
        for layer in self.cache.layers:
            k, v = layer.keys, layer.values
            layers.append((k.gather(2, index[:, None, :, None].expand(k.shape[0], k.shape[1], keep, k.shape[3])),
                           v.gather(2, index[:, None, :, None].expand(v.shape[0], v.shape[1], keep, v.shape[3]))))
        return _KVBatch(_cache(config, layers, keep), self.mask.gather(1, index), self.ids.gather(1, index), self.rows, self.pos)


class _GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends into spare capacity. ``DynamicLayer.update`` concatenates, which
    copies the whole cache at every generated token (O(batch x length) per step, the largest cost of a
    small model's decoding step on a CPU); here a step writes its columns in place and the storage grows
    by half when full. ``keys``/``values`` are views of the filled columns, as the model expects."""

    def adopt(self, key_buf: torch.Tensor, value_buf: torch.Tensor, used: int) -> None:
        """Take (B, H, capacity, D) storage whose first ``used`` columns are filled (and finite)."""
        self.lazy_initialization(key_buf, value_buf)
        self.key_buf, self.value_buf, self.used = key_buf, value_buf, used
        self.keys, self.values = key_buf[:, :, :used], value_buf[:, :, :used]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        used, new = (self.used, key_states.shape[-2]) if self.is_initialized else (0, key_states.shape[-2])
        if not self.is_initialized or used + new > self.key_buf.shape[-2]:
            capacity = _capacity(used + new)
            key_buf = key_states.new_empty((*key_states.shape[:2], capacity, key_states.shape[3]))
            value_buf = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[3]))
            if used:
                key_buf[:, :, :used], value_buf[:, :, :used] = self.keys, self.values
            self.adopt(key_buf, value_buf, used)
        self.key_buf[:, :, used : used + new] = key_states
        self.value_buf[:, :, used : used + new] = value_states
        self.used = used + new
        self.keys, self.values = self.key_buf[:, :, : self.used], self.value_buf[:, :, : self.used]
        return self.keys, self.values


def _capacity(length: int) -> int:
    return length + max(64, length // 2)


def _cache(config, layers: list[tuple[torch.Tensor, torch.Tensor]] | None = None, used: int = 0) -> DynamicCache:
    """A ``DynamicCache`` of growing full-attention layers that adopt ``layers``' storage (``used`` columns filled)."""
    cache = DynamicCache(config=config)
    if any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ValueError("HFSampler supports full-attention models only (this model's cache has sliding-window or other layers)")
    cache.layers = [_GrowingLayer() for _ in cache.layers]
    for layer, (keys, values) in zip(cache.layers, layers or ()):
        layer.adopt(keys, values, used)
    return cache


def _join(parts: list[_KVBatch], config, pad_id: int) -> _KVBatch:
    """One batch of all ``parts``' rows, shorter parts padded with holes (zeros, masked) on the right;
    each layer is copied once, into storage with spare capacity."""
    if len(parts) == 1:
        return parts[0]
    length = max(p.length for p in parts)
    layers = [
        (_stacked([p.cache.layers[i].keys for p in parts], length), _stacked([p.cache.layers[i].values for p in parts], length))
        for i in range(len(parts[0].cache.layers))
    ]
    pad = torch.nn.functional.pad
    return _KVBatch(
        _cache(config, layers, length),
        torch.cat([pad(p.mask, (0, length - p.length)) for p in parts]),
        torch.cat([pad(p.ids, (0, length - p.length), value=pad_id) for p in parts]),
        torch.cat([p.rows for p in parts]), torch.cat([p.pos for p in parts]),
    )


def _stacked(tensors: list[torch.Tensor], length: int) -> torch.Tensor:
    """The rows of (B_i, H, L_i, D) ``tensors`` in one (sum B_i, H, capacity, D) storage; columns ``L_i`` to
    ``length`` are holes, zero-filled (a masked column gets weight 0, and 0 times garbage may be NaN)."""
    first = tensors[0]
    buf = first.new_empty((sum(t.shape[0] for t in tensors), first.shape[1], _capacity(length), first.shape[3]))
    row = 0
    for t in tensors:
        buf[row : row + t.shape[0], :, : t.shape[2]] = t
        buf[row : row + t.shape[0], :, t.shape[2] : length] = 0
        row += t.shape[0]
    return buf


class StopScanner:
    """Where a chunk must stop: the token whose bytes complete one of the stop strings.

    ``may_complete[id]`` says whether an id's bytes hold the last byte of some stop string; only such
    ids can complete one, so a sampler checks bytes for those alone. :meth:`completes` then looks at
    the turn's bytes before the token (at least ``lookback`` of them) and the token's own bytes, and
    counts only a match that ends inside the token (one that ended earlier was handled then).
    """

    def __init__(self, stop_strings: Sequence[str], token_bytes: Sequence[bytes]) -> None:
        if not stop_strings or not all(stop_strings):
            raise ValueError("stop strings must be non-empty")
        self.stops = tuple(s.encode("utf-8") for s in stop_strings)
        self.lookback = max(len(s) for s in self.stops) - 1
        last = {s[-1] for s in self.stops}
        self.may_complete = [any(b in last for b in tb) for tb in token_bytes]

    def completes(self, before: bytes, token: bytes) -> bool:
        """Does a stop string end within ``token``, given the bytes ``before`` it in the same turn?"""
        head = before[-self.lookback :] if self.lookback else b""
        window = head + token
        return any(window.find(s, max(0, len(head) - len(s) + 1)) != -1 for s in self.stops)


#: SplitMix64's constants (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014),
#: as the signed 64-bit integers torch holds; its multiplications wrap as the unsigned ones do.
_GOLDEN, _MIX1, _MIX2 = (c - 2**64 for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """``z >> bits`` of the unsigned 64-bit integers ``z`` holds (torch shifts signed integers arithmetically)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def row_keys(seed: int, first_row: int, rows: int) -> list[int]:
    """The stream keys of episodes ``first_row`` .. ``first_row + rows - 1`` of a rollout seeded by ``seed``:
    64-bit integers (signed, as torch holds them) from NumPy's ``SeedSequence([seed, row])``."""
    rows_keyed = range(first_row, first_row + rows)
    return [int(np.random.SeedSequence([seed, row]).generate_state(1, dtype=np.uint64).view(np.int64)[0]) for row in rows_keyed]


def uniforms(keys: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Number ``draws[i]`` (counted from 0) of the SplitMix64 stream seeded by ``keys[i]``, as a float32 in
    [0, 1) with 24 random bits: counter-based, so each row's numbers depend on its key and count alone.
    ``keys`` and ``draws`` are int64 tensors of one shape, on any device."""
    z = keys + (draws + 1) * _GOLDEN
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    z = z ^ _shift_right(z, 31)
    return _shift_right(z, 40).to(torch.float32) * 2.0**-24


def cache_keyword(model: torch.nn.Module) -> str:
    """The name ``model.forward`` takes its KV cache by: transformers 5.24 renamed ``past_key_values`` to
    ``cache`` (the old name still works, with a deprecation warning on every call)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class HFSampler:
    """A :class:`~agents.rollout.agent.RolloutAgent` sampling from an :class:`~agents.policies.policy.HFPolicy`.

    Args:
        policy: the policy to sample from; the environment must use the same tokenizer (checked).
        temperature: softmax temperature; the recorded log-probs are of this tempered distribution.
        top_p: nucleus sampling (1.0: off). The recorded log-probs stay those of the full tempered
            distribution, which is what :meth:`HFPolicy.forward` computes.
        greedy: take the most likely id (log-probs still recorded at ``temperature``).
        seed: the rollout's seed (the global RNG is not used).
        first_row: the index of the sampler's first episode in the rollout's whole batch (on a
            data-parallel rank, where the rank's share starts). Episode ``first_row + i`` samples from the
            stream keyed by (``seed``, ``first_row + i``), where ``i`` counts the rows of every
            :meth:`begin` in turn (a rollout's waves), so the batches a rollout is split into change no
            episode (module docstring).

    ``generate`` must be asked for every row still running (the rollout does). Dropout is off while
    sampling: the model is in eval mode from ``begin`` until the last row has finished, then back in
    the mode it was in (switching modes walks every module, too slow to do at every turn). After a
    rollout, :meth:`context_ids` gives the ids each row's cache was built from, to check token-in/token-out.
    """

    def __init__(self, policy: HFPolicy, *, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False, seed: int = 0,
                 first_row: int = 0) -> None:
        #: How it samples (checked there).
        self.sampling = SamplingParams(temperature, top_p, greedy, seed, first_row)
        self.policy, self.model, self.codec = policy, policy.model, policy.codec
        self.device = next(policy.model.parameters()).device
        self._next_row = first_row  # the rollout index of the next begin()'s first row
        self._pad = self.codec.pad_id
        self._eos = torch.zeros(self.codec.vocab_size, dtype=torch.bool, device=self.device)
        self._eos[list(self.codec.eos_ids)] = True
        self._scanners: dict[tuple[str, ...], tuple[StopScanner, torch.Tensor]] = {}
        self._kv: _KVBatch | None = None
        self._cache_arg = cache_keyword(policy.lm)  # a peft wrapper passes it on to the model it adapts

    # -- RolloutAgent -------------------------------------------------------------------------------
    def begin(self, prompt_ids: Sequence[Sequence[int]], *, examples: Sequence[QAExample], protocol: Dialect, codec: TokenCodec) -> None:
        if codec is not self.codec and codec.token_bytes != self.codec.token_bytes:
            raise ValueError("the environment's tokenizer is not the policy's: build the env with tokenizer=policy.codec")
        stops = turn_stop_strings(protocol)
        if stops not in self._scanners:
            scanner = StopScanner(stops, self.codec.token_bytes)
            self._scanners[stops] = (scanner, torch.tensor(scanner.may_complete, dtype=torch.bool, device=self.device))
        self._scanner, self._may_stop = self._scanners[stops]
        n = len(prompt_ids)
        self._restore_training = self.model.training
        self.model.eval()
        self._pending: list[list[int]] = [list(ids) for ids in prompt_ids]
        self._turn_bytes = [b""] * n  # the last bytes the row wrote since the environment last spoke
        self._finished: set[int] = set()
        self._contexts: dict[int, list[int]] = {}
        self._keys = torch.tensor(row_keys(self.sampling.seed, self._next_row, n), dtype=torch.long, device=self.device)
        self._draws = torch.zeros(n, dtype=torch.long, device=self.device)  # numbers each row's stream gave so far
        self._next_row += n
        empty = torch.zeros((n, 0), dtype=torch.long, device=self.device)
        self._kv = _KVBatch(_cache(self.model.config), empty, empty.clone(),
                            torch.arange(n, device=self.device), torch.zeros(n, dtype=torch.long, device=self.device))

    #: :meth:`generate` takes ``on_chunks`` (see :class:`~agents.rollout.agent.StreamingRolloutAgent`).
    streams_chunks = True

    def generate(self, rows: Sequence[int], budgets: Sequence[int], *,
                 on_chunks: Callable[[dict[int, Chunk]], None] | None = None) -> list[Chunk]:
        if not rows:
            return []
        if min(budgets) < 1:
            raise ValueError("every row needs a budget of at least one token")
        if self.model.training:  # switched back since begin()
            self.model.eval()
        with torch.inference_mode():
            kv = self._take(list(rows))
            kv, logits = self._feed_pending(kv)
            kv, parts, chunks = self._decode(kv, logits, dict(zip(rows, budgets)), on_chunks)
            self._kv = _join([kv, *parts], self.model.config, self._pad)
        tb, keep = self.codec.token_bytes, self._scanner.lookback
        for row, chunk in chunks.items():
            self._pending[row] = [chunk.ids[-1]]
            written = self._turn_bytes[row] + b"".join([tb[t] for t in chunk.ids])
            self._turn_bytes[row] = written[-keep:] if keep else b""
        return [chunks[row] for row in rows]

    def feed(self, row: int, token_ids: Sequence[int]) -> None:
        if token_ids:
            self._pending[row].extend(token_ids)
            self._turn_bytes[row] = b""  # stop strings are searched after the environment's text, as the env does

    def finish(self, row: int) -> None:
        self._finished.add(row)
        if len(self._finished) == len(self._pending) and self._restore_training:
            self.model.train()

    def context_ids(self, row: int) -> list[int]:
        """The ids in ``row``'s KV cache, in order (holes skipped), followed by the ids still waiting to be
        fed (the last sampled id, and any environment tokens): the row's whole context as the model saw it."""
        if row in self._contexts:
            return self._contexts[row] + self._pending[row]
        at = int((self._kv.rows == row).nonzero()[0, 0])
        return self._kv.ids[at][self._kv.mask[at].bool()].tolist() + self._pending[row]

    # -- internals ----------------------------------------------------------------------------------
    def _take(self, rows: list[int]) -> _KVBatch:
        """The cache without the rows that finished (their context kept), compacted when mostly holes."""
        config, kv = self.model.config, self._kv
        member = kv.rows.tolist()
        if self._finished.intersection(member):
            alive = []
            for i, row in enumerate(member):
                if row in self._finished:
                    self._contexts[row] = kv.ids[i][kv.mask[i].bool()].tolist()
                else:
                    alive.append(i)
            kv = kv.select(torch.tensor(alive, dtype=torch.long, device=self.device), config)
            member = kv.rows.tolist()
        if sorted(rows) != sorted(member):
            raise ValueError("HFSampler.generate needs exactly the rows still running (not finished)")
        if kv.length >= _COMPACT_MIN_LENGTH and kv.mask.sum() < (1 - COMPACT_HOLE_FRACTION) * kv.mask.numel():
            kv = kv.compacted(config)
        return kv

    def _forward(self, kv: _KVBatch, block_ids: torch.Tensor, block_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Append a block of columns to ``kv`` and return each row's logits at the block's last column."""
        kv.mask = torch.cat([kv.mask, block_mask], dim=1)
        kv.ids = torch.cat([kv.ids, block_ids], dim=1)
        out = self.model(input_ids=block_ids, attention_mask=kv.mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1, **{self._cache_arg: kv.cache})
        kv.pos = kv.pos + block_mask.sum(1)
        return out.logits[:, -1, : self.codec.vocab_size]

    def _feed_pending(self, kv: _KVBatch) -> tuple[_KVBatch, torch.Tensor]:
        """Feed every row's waiting ids; the batch (a new one after the prompts) and each row's next logits."""
        pending = [self._pending[row] for row in kv.rows.tolist()]
        if not all(pending):
            raise RuntimeError("a row has nothing to condition its next chunk on (begin() and generate() out of order)")
        for row in kv.rows.tolist():
            self._pending[row] = []
        if kv.length == 0:
            return self._prefill(kv, pending)
        return kv, self._feed_block(kv, pending)

    def _prefill(self, kv: _KVBatch, prompts: list[list[int]]) -> tuple[_KVBatch, torch.Tensor]:
        """The prompts, sharing work: the prefix common to all (a protocol's instructions) runs once, each
        distinct prompt's rest once (a question's ``group_size`` samples share one), then rows get copies."""
        config = self.model.config
        distinct: dict[tuple[int, ...], int] = {}
        which = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], device=self.device)
        unique = list(distinct)
        shared = min(len(os.path.commonprefix(unique)), min(map(len, unique)) - 1)  # each keeps a token for its logits
        one = torch.zeros((1, 0), dtype=torch.long, device=self.device)
        base = _KVBatch(_cache(config), one, one.clone(), kv.rows[:1], torch.zeros(1, dtype=torch.long, device=self.device))
        if shared:
            self._feed_block(base, [list(unique[0][:shared])])
        firsts = base.select(torch.zeros(len(unique), dtype=torch.long, device=self.device), config)
        logits = self._feed_block(firsts, [list(p[shared:]) for p in unique])
        rows = firsts.select(which, config)
        rows.rows = kv.rows
        return rows, logits[which]

    def _feed_block(self, kv: _KVBatch, blocks: list[list[int]]) -> torch.Tensor:
        """Feed each row its ids as one left-padded block (holes on the left of short rows); the logits after."""
        width = max(map(len, blocks))
        block = torch.tensor([[self._pad] * (width - len(b)) + b for b in blocks], dtype=torch.long, device=self.device)
        lengths = torch.tensor([len(b) for b in blocks], device=self.device)
        offsets = torch.arange(width, device=self.device)[None, :] - (width - lengths)[:, None]
        positions = kv.pos[:, None] + offsets.clamp(min=0)
        return self._forward(kv, block, (offsets >= 0).long(), positions)

    def _sample(self, logits: torch.Tensor, rows: torch.Tensor, draws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One id per row and its log-prob under the tempered distribution; ``rows`` are the episode rows
        of ``logits``' rows, ``draws`` how many numbers each has taken from its stream before.

        Sampling inverts the cumulative distribution with one uniform number per row (``multinomial``
        draws an exponential variate per vocabulary entry, many times slower on a CPU)."""
        sampling = self.sampling
        logp = torch.log_softmax(logits.float() / sampling.temperature, dim=-1)
        if sampling.greedy:
            ids = logp.argmax(-1)
        else:
            probs = logp.exp()
            if sampling.top_p < 1:
                ranked, order = probs.sort(dim=-1, descending=True)
                # Keep the most likely ids until their mass reaches top_p (always at least one). The
                # distribution stays in id order: sorted, ids of nearly equal probability would swap
                # places at a rounding difference of the logits and take each other's samples.
                dropped = ranked.cumsum(-1) - ranked >= sampling.top_p
                probs = probs.masked_fill(torch.empty_like(dropped).scatter_(-1, order, dropped), 0.0)
            cdf = probs.cumsum(-1)
            u = uniforms(self._keys[rows], draws)[:, None] * cdf[:, -1:]
            ids = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[1] - 1).squeeze(-1)
        return ids, logp.gather(-1, ids[:, None]).squeeze(-1)

    def _decode(self, kv: _KVBatch, logits: torch.Tensor, budgets: dict[int, int],
                on_chunks: Callable[[dict[int, Chunk]], None] | None = None) -> tuple[_KVBatch, list[_KVBatch], dict[int, Chunk]]:
        """Sample every row of ``kv`` until it stops; returns the final batch, the parts set aside on the
        way, and each episode row's chunk. ``on_chunks`` gets the chunks of the rows that stopped at each
        decoding step, as they stop."""
        n, rows = len(kv), kv.rows.tolist()
        budget = torch.tensor([budgets[r] for r in rows], device=self.device)
        ids_buf = torch.empty((n, int(budget.max())), dtype=torch.long, device=self.device)
        logp_buf = torch.empty(ids_buf.shape, dtype=torch.float32, device=self.device)
        slots = torch.arange(n, device=self.device)  # cache row -> buffer row (= index into `rows`)
        working = torch.ones(n, dtype=torch.bool, device=self.device)
        lengths = [0] * n
        parts: list[_KVBatch] = []
        step = 0
        while True:
            # A row still writing takes the number of its stream after those of its earlier chunks.
            ids, logp = self._sample(logits, kv.rows, self._draws[kv.rows] + step)
            ids_buf[slots, step] = ids
            logp_buf[slots, step] = logp
            stop = working & (self._eos[ids] | (budget[slots] <= step + 1))
            maybe = working & ~stop & self._may_stop[ids]
            if bool((stop | maybe).any()):
                for k in maybe.nonzero().squeeze(1).tolist():
                    slot = int(slots[k])
                    stop[k] = self._completes(rows[slot], ids_buf[slot, max(0, step - self._scanner.lookback) : step + 1].tolist())
                stopped = [int(slots[k]) for k in stop.nonzero().squeeze(1).tolist()]
                for slot in stopped:
                    lengths[slot] = step + 1
                if on_chunks is not None and stopped:
                    on_chunks({rows[slot]: Chunk(ids_buf[slot, : step + 1].tolist(), logp_buf[slot, : step + 1].tolist())
                               for slot in stopped})
                working &= ~stop
                active = int(working.sum())
                if active == 0:
                    break
                if len(working) - active >= PARK_FRACTION * len(working):
                    keep, idle = working.nonzero().squeeze(1), (~working).nonzero().squeeze(1)
                    parts.append(kv.select(idle, self.model.config))
                    kv = kv.select(keep, self.model.config)
                    ids, slots, working = ids[keep], slots[keep], working[keep]
            logits = self._forward(kv, torch.where(working, ids, self._pad)[:, None], working.long()[:, None], kv.pos[:, None])
            step += 1
        self._draws[torch.tensor(rows, device=self.device)] += torch.tensor(lengths, device=self.device)
        ids_rows, logp_rows = ids_buf[:, : step + 1].tolist(), logp_buf[:, : step + 1].tolist()
        chunks = {row: Chunk(ids_rows[i][: lengths[i]], logp_rows[i][: lengths[i]]) for i, row in enumerate(rows)}
        return kv, parts, chunks

    def _completes(self, row: int, recent: list[int]) -> bool:
        """Does the last of ``recent`` (this chunk's latest ids) complete a stop string in the row's turn?"""
        tb = self.codec.token_bytes
        before = self._turn_bytes[row] + b"".join([tb[t] for t in recent[:-1]])
        return self._scanner.completes(before, tb[recent[-1]])
