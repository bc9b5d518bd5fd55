"""A rollout engine's read of the policy's weights (``TrainingBackend.rollout_weights``) on one process
(``--backend torch``) or on each rank of a ``torchrun`` group (``--backend deepspeed``, ``fsdp``); each rank writes
what it was given, and under ZeRO-3 the most parameters it held whole at any yield, to ``--out``'s
``rank{N}.pt``; then rank 0 alone reads them again within ``backend.generation()``, as an evaluation
would. ``test_rollout_weights.py`` compares them with the single-process model's state dict. Each rank also
scores a probe within ``backend.scoring()`` (as the sync check does), recording the most parameters whole at
any module's forward pass, and within ``generation()`` (whole) for comparison.

    torchrun --nproc_per_node 2 -m tests.agents.training.ds_rollout_weights --backend deepspeed --zero 3 --out DIR
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch


def tiny_policy(lora_rank: int = 0):
    """The tiny policy of these tests (the same on every process); with ``lora_rank`` its adapters' ``B`` is
    drawn from a fixed generator, so that the adapted model differs from its base."""
    from agents.policies.config import ModelConfig
    from agents.policies.loading import load_policy

    policy = load_policy(ModelConfig(tiny_hidden=32, tiny_heads=2, tiny_layers=2, lora_rank=lora_rank), seed=0)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return policy


def gathered(policy: torch.nn.Module) -> int:
    """Parameters ZeRO-3 partitions that are whole on this rank now."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return sum(p.ds_status == ZeroParamStatus.AVAILABLE and not p.ds_persist for p in policy.parameters())


def whole_parameters(policy: torch.nn.Module) -> int:
    """Parameters whole on this rank now: ZeRO-3's gathered ones, or FSDP's unsharded ones (not DTensors)."""
    from torch.distributed.tensor import DTensor

    if any(hasattr(p, "ds_status") for p in policy.parameters()):
        return gathered(policy)
    return sum(not isinstance(p, DTensor) for p in policy.parameters())


def scored(backend, policy, probe: list[list[int]]) -> tuple[list[list[float]], int]:
    """The policy's log-probs of ``probe`` within ``backend.scoring()``, and the most parameters whole on this
    rank at any module's forward pass meanwhile."""
    from agents.rollout.sync_check import policy_logprobs

    most = [0]
    hooks = [m.register_forward_pre_hook(lambda *_: most.__setitem__(0, max(most[0], whole_parameters(policy))))
             for m in policy.modules()]
    try:
        backend.eval()
        with backend.scoring():
            logprobs = policy_logprobs(policy, probe)
    finally:
        for hook in hooks:
            hook.remove()
    return logprobs, most[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--zero", type=int, default=3)
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from agents.learners import GRPO
    from agents.training.backends import build_backend
    from agents.training.config import TrainConfig

    torch.set_num_threads(1)
    changes = {"run.backend": args.backend, "rollout.questions_per_step": 2, "model.lora_rank": args.lora_rank}
    if args.backend == "deepspeed":
        changes["backend.zero_stage"] = args.zero
    config = TrainConfig("grpo").updated(changes)
    policy = tiny_policy(args.lora_rank)
    backend = build_backend(config, policy, GRPO(config.algorithm))
    sharded = args.backend == "deepspeed" and args.zero == 3
    result: dict = {"partitioned": 0, "most_gathered": 0}
    if sharded:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        result["partitioned"] = sum(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in policy.parameters())
    for part in ("weights", "adapters") if args.lora_rank else ("weights",):
        read = {}
        for name, tensor in backend.rollout_weights(adapters=part == "adapters"):
            if sharded:
                result["most_gathered"] = max(result["most_gathered"], gathered(policy))
            read[name] = tensor  # held, not copied: a later gather must not overwrite it
        result[part] = {name: tensor.cpu().clone() for name, tensor in read.items()}
    if sharded:
        result["gathered_after"] = gathered(policy)
    if args.backend != "torch":  # the sync check's scoring: module by module, every rank on the same probe
        from agents.rollout.sync_check import policy_logprobs

        probe = [list(range(3, 19)), list(range(40, 52))]
        result["parameters"] = len(list(policy.parameters()))
        result["scored"], result["scoring_most_whole"] = scored(backend, policy, probe)
        with backend.generation():
            result["scored_whole"] = policy_logprobs(policy, probe)
    # As an evaluation does: rank 0 alone reads within generation(), where the weights are whole (no gather).
    with backend.generation():
        if backend.rank == 0:
            result["in_generation"] = {name: tensor.cpu().clone() for name, tensor in backend.rollout_weights()}
    backend.barrier()
    torch.save(result, Path(args.out) / f"rank{backend.rank}.pt")


if __name__ == "__main__":
    from agents.training.rank_exit import run_main

    run_main(main)
