"""One update of a tiny policy on a fixed global batch, on one process (``--backend torch``) or on each
rank of a ``torchrun`` group (``--backend deepspeed`` or ``fsdp``), each rank holding one question group;
rank 0 writes the updated parameters (and a separate critic's) and the logged statistics to ``--out``. The
DeepSpeed and FSDP tests compare the two.

    python -m tests.agents.training.ds_equivalence --algo grpo --backend torch --out a.pt
    torchrun --nproc_per_node 2 -m tests.agents.training.ds_equivalence --algo grpo --backend deepspeed --zero 3 --out b.pt
    torchrun --nproc_per_node 2 -m tests.agents.training.ds_equivalence --algo grpo --backend fsdp --out c.pt

``--algo ppo`` trains a value head; ``--algo ppo --critic separate`` a separate critic, with a learning rate
and a warm-up of its own, so that a critic stepped with the policy's settings shows. ``--lora-rank 4`` trains
LoRA adapters instead of the whole model (the reference is then the base, adapters off). ``--warm-start``
runs a warm start (copy warm-up, then demonstrations) first and writes every rank's weights after it;
``--resume`` adds a checkpoint round trip (see the option's help).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

GROUPS = 2  #: question groups in the global batch
GROUP_SIZE = 3  #: rows per group (micro-batches of 2: a rank's share is two uneven micro-batches)


def global_batch(vocab: int, *, second_group_equal: bool = False):
    """Six rows of uneven length (5..13 tokens after a 4-token prompt), each with an untrained observation
    span inside its response, rewards 0/1 differing within each group (``second_group_equal``: all 0 in the
    second group, which DAPO's dynamic sampling drops); the same on every process."""
    from agents.rollout.batch import TrainBatch

    gen = torch.Generator().manual_seed(1234)
    rows = GROUPS * GROUP_SIZE
    lengths = [9, 17, 12, 14, 8, 16]
    width = max(lengths)
    ids = torch.zeros(rows, width, dtype=torch.long)
    attention = torch.zeros(rows, width)
    trained = torch.zeros(rows, width)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.randint(5, vocab, (n,), generator=gen)
        attention[r, :n] = 1
        trained[r, 4:n] = 1
        trained[r, 6:8] = 0  # an observation the agent did not produce
    position = (attention.cumsum(1) - 1).clamp_min(0).long() * attention.long()
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0 if second_group_equal else 1.0])
    last = torch.tensor([max(i for i in range(width) if trained[r, i]) for r in range(rows)])
    token_rewards = torch.zeros(rows, width)
    token_rewards[torch.arange(rows), last] = scores
    return TrainBatch(ids, attention, position, trained, token_rewards, scores,
                      torch.arange(rows) // GROUP_SIZE, [f"q{r // GROUP_SIZE}" for r in range(rows)], [None] * rows)


def whole_parameters(backend, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s parameters, whole (gathered on every rank from a ZeRO-3 engine's or FSDP's shards)."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in module.parameters()):
        return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone().cpu()
                for name, p in module.named_parameters()}
    if getattr(backend, "stage", 0) < 3:
        return {name: p.detach().clone().cpu() for name, p in module.named_parameters()}
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters

    with GatheredParameters(list(module.parameters())):
        return {name: p.detach().clone().cpu() for name, p in module.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", default="grpo")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--critic", default="head", choices=["head", "separate"])
    parser.add_argument("--dynamic-sampling", action="store_true",
                        help="GRPO's dynamic sampling, which drops the second group: all of rank 1's rows")
    parser.add_argument("--warm-start", action="store_true",
                        help="first a warm start (copy warm-up and demonstrations), the same on every rank")
    parser.add_argument("--resume", action="store_true",
                        help="then save a checkpoint, update again, load it and take the second update once more")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from agents.learners.registry import lookup_algorithm
    from agents.policies.loading import load_policy
    from agents.training.backends import build_backend
    from agents.training.config import TrainConfig
    from agents.training.update import by_length, score_batch, update_batch

    torch.set_num_threads(1)
    changes = {
        "run.backend": args.backend, "rollout.questions_per_step": GROUPS,
        "algorithm.group_size": GROUP_SIZE, "optim.micro_batch_size": 2, "optim.mini_batch_size": 0,
        "optim.update_epochs": 2, "optim.learning_rate": 1e-3, "algorithm.kl_coef": 0.01, "env.max_new_tokens": 16,
        "model.tiny_hidden": 32, "model.tiny_heads": 2, "model.tiny_layers": 1, "model.lora_rank": args.lora_rank,
    }
    if args.backend == "deepspeed":
        changes["backend.zero_stage"] = args.zero
    if args.algo == "ppo":
        changes["algorithm.critic"] = args.critic
        if args.critic == "separate":
            changes.update({"algorithm.critic_lr": 3e-3, "algorithm.critic_warmup_steps": 3,
                            "algorithm.critic_warmup_ratio": 0.0})
    if args.dynamic_sampling:
        changes["algorithm.dynamic_sampling"] = True
    if args.warm_start:
        changes.update({"warm_start.steps": 3, "warm_start.copy_steps": 2, "warm_start.examples": 8,
                        "warm_start.batch_size": 4, "warm_start.learning_rate": 3e-3, "run.progress": False})
    config = TrainConfig(args.algo).updated(changes)
    algorithm = lookup_algorithm(config.algo)(config.algorithm, max_new_tokens=config.env.max_new_tokens)
    policy = load_policy(config.model, value_head=algorithm.value_head, seed=0)
    backend = build_backend(config, policy, algorithm)
    if backend.world_size > 1:
        algorithm.reduce_sum = backend.all_reduce_sum
    batch = global_batch(policy.vocab_size, second_group_equal=args.dynamic_sampling)
    if backend.world_size > 1:  # this rank's question groups
        per = GROUPS // backend.world_size
        batch = batch.select([r for r in range(len(batch)) if int(batch.group_index[r]) // per == backend.rank])
    batch = algorithm.filter_batch(batch)  # as the trainer's rollout does: each rank filters its own groups
    shares = torch.zeros(backend.world_size, dtype=torch.float64)
    shares[backend.rank] = len(batch)
    rows = [int(n) for n in backend.all_reduce_sum(shares)]  # every rank's rows
    batch = batch.select(by_length(batch, torch.arange(len(batch))))

    def update() -> dict[str, float]:
        score_batch(backend, algorithm, config.optim, batch)
        algorithm.compute_advantages(batch)
        stats, _ = update_batch(backend, algorithm, config.optim, batch, shuffle_seed=0, with_entropy=algorithm.needs_entropy)
        return stats

    def weights() -> dict[str, dict[str, torch.Tensor]]:
        with backend.generation():
            params = {name: p.detach().clone().cpu() for name, p in policy.named_parameters()}
        critic = whole_parameters(backend, backend.critic) if getattr(backend, "critic", None) is not None else {}
        return {"params": params, "critic": critic}

    warm, warm_norms = [], []
    if args.warm_start:  # then every rank's weights and the gradient norms of its steps, before the update
        from agents.training.warm_start import warm_start
        from search_env import SearchQAEnv

        def recorded_step() -> float:
            warm_norms.append(step())
            return warm_norms[-1]

        step, backend.step = backend.step, recorded_step
        warm_start(backend, config, SearchQAEnv(protocol="search-r1", world_seed=4, world_size=60))
        del backend.step
        backend.reset_reference()
        mine = weights()
        warm = [mine]
        if backend.world_size > 1:
            warm = [None] * backend.world_size
            torch.distributed.all_gather_object(warm, mine)
    stats = update()
    keys = backend.broadcast_object(sorted(k for k in stats if k.startswith("loss/")))  # a rank may have no rows
    summed = {k: float(backend.all_reduce_sum(torch.tensor(stats.get(k, 0.0), dtype=torch.float64))) for k in keys}
    result = {**weights(), "loss": summed, "grad_norm": stats["grad_norm"], "warm": warm, "warm_norms": warm_norms, "rows": rows}
    if args.resume:  # a second step, then the same second step again from the checkpoint taken before it
        backend.finish_step()
        folder = Path(f"{args.out}.checkpoint")
        folder.mkdir(exist_ok=True)
        backend.barrier()
        backend.save(folder)
        update()
        backend.finish_step()
        result["uninterrupted"] = weights()
        backend.load(folder)
        update()
        result["resumed"] = weights()
    if backend.rank == 0:
        torch.save(result, args.out)
    backend.barrier()


if __name__ == "__main__":
    from agents.training.rank_exit import run_main

    run_main(main)
