"""Rollouts from a vLLM engine that lives in the trainer's process, behind the rollout-agent protocol.

:class:`VLLMEngine` builds one ``vllm.LLM`` from an :class:`~agents.policies.policy.HFPolicy` (the policy
is written once as a model folder and vLLM loads it), colocated with the trainer: in the same process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and on the same device, taking ``memory_fraction`` of its memory.
In training (:meth:`VLLMEngine.build`) the folder holds no weights: the engine starts from vLLM's placeholder
weights and its first sync streams the trained ones in. So every data-parallel rank builds its own engine the
same way, the colocated layout (TRL's ``vllm_mode="colocate"``, verl's hybrid engine), and a sharded policy is
never gathered whole for it.
:meth:`VLLMEngine.agent` gives a :class:`VLLMAgent` for one rollout. It is the ``vllm`` rollout engine
(:mod:`agents.rollout.engines`): ``rollout.engine: vllm`` in training, ``vllm:MODEL`` in ``benchmarks.evaluate``.

Token-in/token-out: every turn sends each row's whole context as token ids (the prompt's ids, the ids
it sampled, the environment's ids, never text); prefix caching makes the part vLLM has seen before
cost nothing, so a turn costs the prefill of the environment's new tokens. The sampled ids go to the
environment as vLLM returns them. vLLM finds the protocol's stop strings in its decoded text and ends
the output at the whole token that completes one (``include_stop_str_in_output``, so the tag stays);
the environment, which reads token bytes, decides where the call ends, as with the HF sampler.
End-of-sequence ids are the codec's (``stop_token_ids``), not vLLM's own guess from the model config.

Log-probs are vLLM's ``processed_logprobs``: those of the distribution sampled from (temperature
applied), the quantity an importance ratio against the trainer's log-probs at the same temperature
needs. The trainer logs their gap to its own (``rollout/logprob_gap_mean``); the learners' truncated
importance sampling (``algorithm.tis_cap``) corrects for it.

Weights: after the optimiser steps of an update :meth:`VLLMEngine.sync` (made due by
:meth:`VLLMEngine.attach`'s post-step hook on the training backend, run before the next rollout) streams
the trained model's weights into the engine through the model runner's ``reload_weights`` (which re-runs
vLLM's post-load processing; a model's ``load_weights`` alone does not take effect on every backend),
from the backend's :meth:`~agents.training.backends.base.TrainingBackend.rollout_weights`: one tensor at a time,
which a ZeRO-3 backend gathers in turn (unless they are whole already, within its ``generation()``), so
that beyond its shards and vLLM's copy a rank need not hold the whole model. The iterator is handed over
as it is, not as a list of every tensor: the engine runs in this process with one worker, which consumes
it as it loads. The prefix cache, computed with the old weights, is reset.

A policy with LoRA adapters (``model.lora_rank``) is served as vLLM serves adapters: the engine holds
the frozen base (``enable_lora``, ``max_lora_rank`` the smallest vLLM supports at or above the rank), and
each sync writes the current adapters in peft's format into the engine's folder and adds them under a
new ``LoRARequest`` id (vLLM caches an adapter by its id), removing the previous one; every request
carries the current one, so the log-probs are those of the trainer's adapted model, and the base is
never reloaded.

With ``sleep=True`` the engine releases its memory during the update (:meth:`VLLMEngine.sleep`) and is
woken, weights reloaded, before the next rollout (with adapters the frozen base is kept in host memory
meanwhile and comes back as it was); vLLM's CPU backend has no sleep mode, where this is a no-op.
"""
from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, get_args

import numpy as np
import torch

from agents.policies.policy import HFPolicy
from agents.rollout.agent import Chunk, SamplingParams, turn_stop_strings
from agents.rollout.engine_weights import EngineWithWeights
from agents.rollout.engines import EngineSetup, register_engine
from agents.rollout.vllm_folder import write_model_folder
from search_env.data.example import QAExample
from search_env.protocols import Dialect
from search_env.tokenization import TokenCodec

__all__ = ["VLLMAgent", "VLLMEngine", "VLLMEngineOptions"]

#: The KV cache a CPU engine takes when ``VLLM_CPU_KVCACHE_SPACE`` does not say (GiB), as a ceiling on
#: ``memory_fraction`` of the machine's memory: the trainer and the environment need the rest.
CPU_KV_CACHE_GIB_MAX = 2.0


@dataclass
class VLLMEngineOptions:
    """Options of ``rollout.engine: vllm`` (the run config's ``engine`` group).

    Attributes:
        memory_fraction: the share of the accelerator's memory vLLM may take (its
            ``gpu_memory_utilization``; the trainer's model shares the device). On a CPU it sizes vLLM's
            KV cache as that share of the machine's memory.
        sleep: put the engine to sleep (weights and KV cache released) during the update, and wake it
            before the next rollout; its weights are always reloaded after waking.
    """

    memory_fraction: float = 0.3
    sleep: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"engine.memory_fraction must be in (0, 1], got {self.memory_fraction}")


def _import_vllm() -> Any:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: weights pass by reference
    try:
        import vllm
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ModuleNotFoundError("rollout.engine: vllm needs the vllm package (pip install -e '.[vllm]', or "
                                  "bash .ci/vllm_venv.sh for the CPU build this project is tested with)") from exc
    return vllm


@contextmanager
def _modules_vllm_cannot_scan() -> Iterator[None]:
    """Hide, while the engine starts, the loaded modules that vLLM's start-up scan trips over.

    Without Triton's CPU backend, vLLM's CPU platform swaps some Triton kernels for C++ ones and, to
    rebind every reference, reads ``vars(value).get("kernel")`` for each attribute of every loaded
    module. llvmlite's ffi module (loaded by numba, which ``bm25s`` imports when it is installed, as
    vllm-cpu installs it) holds objects whose ``vars()`` is no dict, and the scan fails with
    ``AttributeError``. Those modules hold no kernels, so they sit out the scan and are put back after.
    """
    hidden = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for value in list(namespace.values()):
            try:
                if hasattr(value, "__dict__"):
                    vars(value).get("kernel")
            except Exception:
                hidden[name] = module
                break
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


def _lora_rank_slot(policy: HFPolicy) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts (it builds its kernels for a fixed set of ranks) that
    holds the policy's adapters."""
    from vllm.config.lora import MaxLoRARanks

    config = policy.model.peft_config[policy.model.active_adapter]
    rank = max([config.r, *config.rank_pattern.values()])
    slots = get_args(MaxLoRARanks)
    if rank > max(slots):
        raise ValueError(f"model.lora_rank {rank} is above the largest LoRA rank vLLM serves ({max(slots)})")
    return min(slot for slot in slots if slot >= rank)


class VLLMEngine(EngineWithWeights):
    """A vLLM engine over ``policy``'s weights, kept in step with them: a
    :class:`~agents.rollout.engines.RolloutEngine` whose log-probs are its own (not the trainer's) and
    whose copy of the weights follows the backend's optimiser steps (:meth:`attach`), an
    :class:`~agents.rollout.engine_weights.EngineWithWeights`.

    Args:
        policy: the trained policy; its LM and tokenizer are written to a temporary model folder that
            vLLM loads (removed by :meth:`close`); with LoRA adapters, its frozen base, the adapters
            being added apart (module docstring). Under ZeRO-3, with ``preload``, build the engine within the
            backend's ``generation()``, where the weights it writes are whole.
        memory_fraction: the share of the device's memory vLLM may take (``gpu_memory_utilization``). On a
            CPU the KV cache is that share of the machine's memory, at most :data:`CPU_KV_CACHE_GIB_MAX` GiB
            (``VLLM_CPU_KVCACHE_SPACE`` overrides it).
        max_model_len: the longest context (prompt, generated and environment tokens) a row may reach.
        dtype: the engine's weights (``"float32"`` matches a float32 trainer; ``"auto"``: the model's).
        sleep: release the engine's memory between rollouts (:meth:`sleep`, :meth:`wake_up`).
        seed: the engine's seed (each rollout's requests also carry their own seeds).
        temperature / top_p: how its sampled agents sample, unless :meth:`agent` says otherwise.
        preload: write the policy's weights into the folder for vLLM to load at start. ``False``: the folder
            holds the config and tokenizer alone, vLLM starts from placeholder weights (its ``dummy`` load)
            and the engine counts as stale, so its first use syncs the weights one tensor at a time (with LoRA,
            the frozen base once, then the adapters); any rank of a data-parallel run can build it so.
        engine_kwargs: further ``vllm.LLM`` arguments.
    """

    logprobs_are_trainers = False
    decodes_trained_policy = False
    needs_policy = True
    reuse_logprobs = False

    def __init__(self, policy: HFPolicy, *, memory_fraction: float = 0.3, max_model_len: int = 4096,
                 dtype: str = "float32", sleep: bool = False, seed: int = 0, temperature: float = 1.0,
                 top_p: float = 1.0, preload: bool = True, **engine_kwargs: Any) -> None:
        vllm = _import_vllm()
        self.policy, self.codec = policy, policy.codec
        self.temperature, self.top_p = temperature, top_p
        self.sleep_enabled = bool(sleep)
        #: The precision the engine computes in (the sync check's tolerance depends on it).
        self.dtype = dtype
        self._asleep = False
        self._folder = tempfile.mkdtemp(prefix="searchqa-vllm-")
        # Removed by close(), or when the engine is collected or the interpreter exits without it.
        self._remove_folder = weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)
        write_model_folder(policy, self._folder, weights=preload)
        self._device_type = next(policy.model.parameters()).device.type
        on_cpu = self._device_type == "cpu"
        kwargs: dict[str, Any] = {
            "model": self._folder, "tokenizer": self._folder, "dtype": dtype, "seed": seed,
            "max_model_len": max_model_len, "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs", "gpu_memory_utilization": memory_fraction,
            "enforce_eager": True,
        }
        if not preload:
            kwargs["load_format"] = "dummy"
        if on_cpu:
            # A prompt prefilled in chunks over several engine steps rewinds its request's random
            # generator after each partial step, and a CPU generator has no offset to rewind: every
            # seeded request (all of ours) fails with "CPU Generator does not use offset" once a
            # turn's new prompt tokens exceed one step's budget. Whole prompts per step avoid it.
            kwargs["enable_chunked_prefill"] = False
            if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
                total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                kwargs["kv_cache_memory_bytes"] = int(min(memory_fraction * total, CPU_KV_CACHE_GIB_MAX * 2**30))
        elif self.sleep_enabled:
            kwargs["enable_sleep_mode"] = True
        #: Whether the engine serves the policy's LoRA adapters on its frozen base (module docstring).
        self.lora = policy.has_adapters
        if self.lora:
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=_lora_rank_slot(policy))
        kwargs.update(engine_kwargs)
        try:
            with _modules_vllm_cannot_scan(), self.own_precision():
                self.llm = vllm.LLM(**kwargs)
        except BaseException:
            self._remove_folder()
            raise
        self.syncs = 0
        #: The policy's weights changed since the engine last loaded them (see :meth:`attach`), or never were.
        self.stale = not preload
        #: A LoRA engine's frozen base is still vLLM's placeholder (``preload=False``): the first sync loads it.
        self._base_pending = self.lora and not preload
        #: Where the weights come from: the policy's own tensors, until :meth:`attach` names a backend.
        self._weights: Callable[..., Iterator[tuple[str, torch.Tensor]]] = self._policy_weights
        #: The adapters every request carries (``None`` without LoRA), and the ids given out so far.
        self.lora_request: Any = None
        self._lora_ids = itertools.count(1)
        if self.lora and preload:
            try:
                self._load_adapters()
            except BaseException:
                self.close()
                raise

    @classmethod
    def build(cls, options: VLLMEngineOptions, setup: EngineSetup) -> VLLMEngine:
        """The engine of ``rollout.engine: vllm``, with no weights until its first use syncs them (``preload``
        off): on one process and on every data-parallel rank alike, and a sharded policy is read one gathered
        tensor at a time, never whole (``setup.whole_weights`` is not needed)."""
        return cls(setup.policy, memory_fraction=options.memory_fraction, max_model_len=setup.max_context,
                   sleep=options.sleep, seed=setup.seed, temperature=setup.temperature, top_p=setup.top_p,
                   preload=False)

    def own_precision(self) -> torch.autocast:
        """Within the block a caller's autocast is off for the engine's device: vLLM computes in its own
        ``dtype``, also where the trainer rolls out within a bf16 backend's ``generation()`` (autocast).

        The calling thread's OpenMP threads are set to torch's count first: vLLM's CPU attention plans its
        work for ``torch.get_num_threads()`` threads and fails unless its kernel runs with as many, and a
        thread other than the main one (a rollout generated ahead, ``rollout.max_staleness``) starts with
        OpenMP's default instead."""
        torch.set_num_threads(torch.get_num_threads())
        return torch.autocast(self._device_type, enabled=False)

    # -- weights --------------------------------------------------------------------------------------
    def attach(self, backend: Any) -> VLLMEngine:
        """Keep the engine in step with ``backend``'s optimiser steps (warm-start steps included).

        The backend's post-step hook marks the engine's weights stale (and, with ``sleep``, puts the
        engine to sleep for the rest of the update); the next :meth:`agent` or :meth:`logprobs` call
        reloads them first, so several optimiser steps of one update cost one reload. The weights also
        count as stale from the start, so a trainer that loaded a checkpoint after the engine was built
        samples from the loaded weights. They are read through ``backend.rollout_weights`` (whole, one at
        a time, from a sharded backend too).
        """
        self.stale = True
        self._weights = backend.rollout_weights
        backend.add_post_step_hook(self._after_step)
        return self

    def _after_step(self) -> None:
        self.stale = True
        self.sleep()

    def _policy_weights(self, *, adapters: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.policy.named_weights(adapters=adapters):
            yield name, tensor.detach()

    @torch.no_grad()
    def sync(self, weights: Callable[..., Iterator[tuple[str, torch.Tensor]]] | None = None) -> None:
        """Load the policy's current weights (with LoRA, its adapters), or those ``weights`` yields (a
        snapshot of earlier ones: ``rollout.max_staleness`` 2 and more), into the engine and drop the prefix
        cache (its keys and values were computed with the old weights)."""
        source = self._weights if weights is None else weights
        if self._asleep:
            self._wake()
        if self._base_pending:  # the frozen base, once, from the live weights (a snapshot holds adapters alone)
            with self.own_precision():
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._weights()})
            self._base_pending = False
        if self.lora:
            self._load_adapters(source)
        else:
            with self.own_precision():
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": source()})
        self.llm.reset_prefix_cache()
        self.syncs += 1
        self.stale = False

    def _load_adapters(self, source: Callable[..., Iterator[tuple[str, torch.Tensor]]] | None = None) -> None:
        """Write the current adapters (``source``'s, by default the engine's weight source's) in peft's format
        and add them under a new id (an id vLLM has seen is served from its cache, whatever the folder holds
        now); then remove the previous adapters from the engine and their folder, so one set is held at a
        time. The current folder stays until the next sync: vLLM reads an adapter from its path again
        should it ever drop it from its cache."""
        from vllm.lora.request import LoRARequest

        source = self._weights if source is None else source
        lora_id = next(self._lora_ids)
        folder = os.path.join(self._folder, f"adapter-{lora_id}")
        self.policy.model.save_pretrained(folder, state_dict=dict(source(adapters=True)))
        engine, previous = self.llm.llm_engine, self.lora_request
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        request = LoRARequest(f"policy-{lora_id}", lora_id, folder)
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the policy's LoRA adapters from {folder}")
        self.lora_request = request

    def sleep(self) -> None:
        """Release the engine's weights and KV cache until the next rollout (``sleep=True`` only). With
        adapters the frozen base moves to host memory instead (vLLM's sleep level 1), as nothing reloads it."""
        if self.sleep_enabled and not self._asleep:
            self.llm.sleep(level=1 if self.lora else 2)
            self._asleep = True

    def wake_up(self) -> None:
        """Ready for a rollout: woken, and its weights reloaded if it slept (sleep drops them) or they are stale."""
        if self._asleep or self.stale:
            self.sync()

    def _wake(self) -> None:
        self.llm.wake_up()
        self._asleep = False

    # -- rollouts -------------------------------------------------------------------------------------
    def agent(self, *, greedy: bool = False, seed: int = 0, first_row: int = 0, temperature: float | None = None,
              top_p: float | None = None) -> VLLMAgent:
        """The rollout agent for one rollout (see :class:`VLLMAgent`; ``first_row``: its first episode's index
        in the rollout's whole batch), sampling at the engine's temperature and top-p unless given others;
        the engine is woken (weights reloaded when stale) first."""
        self.wake_up()
        return VLLMAgent(self, temperature=self.temperature if temperature is None else temperature,
                         top_p=self.top_p if top_p is None else top_p, greedy=greedy, seed=seed, first_row=first_row)

    def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The engine's log-prob of each id given the ids before it (temperature 1), token-aligned like
        :meth:`HFPolicy.forward <agents.policies.policy.HFPolicy.forward>`: entry 0 is 0."""
        vllm = _import_vllm()
        self.wake_up()
        params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        with self.own_precision():
            outs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params, use_tqdm=False,
                                     lora_request=self.lora_request)
        rows = []
        for seq, out in zip(sequences, outs):
            row = [0.0]
            for token, entry in zip(seq[1:], out.prompt_logprobs[1:]):
                row.append(float(entry[token].logprob))
            rows.append(row)
        return rows

    def close(self) -> None:
        """Shut the engine down and remove its model folder."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            del self.llm
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
        self._remove_folder()


class VLLMAgent:
    """A :class:`~agents.rollout.agent.RolloutAgent` sampling from a :class:`VLLMEngine`.

    Each ``generate`` sends every running row's context (ids) as one request; vLLM batches them and
    reuses cached prefixes. Each request is seeded from ``seed``, the episode's index in the rollout's
    whole batch (``first_row`` plus the row's place among the rows of every ``begin`` so far) and the
    row's turn, never from which rows share the call or the rank, so a rollout is reproducible for fixed
    weights and one process and N ranks sample the same episodes. ``greedy`` decodes with vLLM's greedy
    sampler (its log-probs are then those of the untempered distribution).
    """

    streams_chunks = False

    def __init__(self, engine: VLLMEngine, *, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
                 seed: int = 0, first_row: int = 0) -> None:
        #: How it samples (checked there; the HF sampler's kind of value).
        self.sampling = SamplingParams(temperature, top_p, greedy, seed, first_row)
        self.engine, self.codec = engine, engine.codec
        self._contexts: list[list[int]] = []
        self._turn = 0
        self._first_row = self._next_row = first_row  # the rollout index of this begin()'s first row, of the next's

    def begin(self, prompt_ids: Sequence[Sequence[int]], *, examples: Sequence[QAExample], protocol: Dialect, codec: TokenCodec) -> None:
        if codec is not self.codec and codec.token_bytes != self.codec.token_bytes:
            raise ValueError("the environment's tokenizer is not the policy's: build the env with tokenizer=policy.codec")
        self._stops = list(turn_stop_strings(protocol))
        self._contexts = [list(ids) for ids in prompt_ids]
        self._turn = 0
        self._first_row, self._next_row = self._next_row, self._next_row + len(prompt_ids)

    def request_seed(self, row: int) -> int:
        """The seed of ``row``'s request this turn: from ``seed``, the row's index in the rollout and the turn."""
        state = np.random.SeedSequence([self.sampling.seed, self._first_row + row, self._turn]).generate_state(1)
        return int(state[0]) & 0x7FFFFFFF

    def _params(self, row: int, budget: int) -> Any:
        vllm = _import_vllm()
        temperature, top_p = self.sampling.requested()
        return vllm.SamplingParams(
            n=1, temperature=temperature, top_p=top_p,
            max_tokens=budget, stop=self._stops, include_stop_str_in_output=True,
            stop_token_ids=sorted(self.codec.eos_ids), ignore_eos=True, logprobs=0,
            seed=self.request_seed(row),
            skip_special_tokens=False, spaces_between_special_tokens=False,
        )

    def generate(self, rows: Sequence[int], budgets: Sequence[int]) -> list[Chunk]:
        if not rows:
            return []
        if min(budgets) < 1:
            raise ValueError("every row needs a budget of at least one token")
        prompts = [{"prompt_token_ids": self._contexts[row]} for row in rows]
        params = [self._params(row, budget) for row, budget in zip(rows, budgets)]
        with self.engine.own_precision():
            outs = self.engine.llm.generate(prompts, params, use_tqdm=False, lora_request=self.engine.lora_request)
        self._turn += 1
        chunks = []
        for row, out in zip(rows, outs):
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [float(entry[token].logprob) for token, entry in zip(ids, sample.logprobs)]
            self._contexts[row] += ids
            chunks.append(Chunk(ids, logprobs))
        return chunks

    def feed(self, row: int, token_ids: Sequence[int]) -> None:
        self._contexts[row] += list(token_ids)

    def finish(self, row: int) -> None:
        pass

    def context_ids(self, row: int) -> list[int]:
        """The ids ``row``'s next request would send: its whole context as the engine sees it."""
        return list(self._contexts[row])


register_engine("vllm", VLLMEngine, options=VLLMEngineOptions)
