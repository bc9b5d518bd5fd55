"""One update of a tiny policy on a fixed global batch, on one process (``--backend torch``) or on each
rank of a ``torchrun`` group (``--backend deepspeed``), each rank holding one question group; rank 0 writes
the updated parameters and the logged statistics to ``--out``. The DeepSpeed tests compare the two.

    python -m tests.agents.training.ds_equivalence --algo grpo --backend torch --out a.pt
    torchrun --nproc_per_node 2 -m tests.agents.training.ds_equivalence --algo grpo --backend deepspeed --zero 3 --out b.pt
"""
from __future__ import annotations

import argparse
import os

import torch

GROUPS = 2  #: question groups in the global batch
GROUP_SIZE = 3  #: rows per group (micro-batches of 2: a rank's share is two uneven micro-batches)


def global_batch(vocab: int):
    """Six rows of uneven length (5..13 tokens after a 4-token prompt), each with an untrained observation
    span inside its response, rewards 0/1 differing within each group; the same on every process."""
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
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    last = torch.tensor([max(i for i in range(width) if trained[r, i]) for r in range(rows)])
    token_rewards = torch.zeros(rows, width)
    token_rewards[torch.arange(rows), last] = scores
    return TrainBatch(ids, attention, position, trained, token_rewards, scores,
                      torch.arange(rows) // GROUP_SIZE, [f"q{r // GROUP_SIZE}" for r in range(rows)], [None] * rows)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", default="grpo")
    parser.add_argument("--backend", default="torch")
    parser.add_argument("--zero", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from agents.learners.registry import lookup_algorithm
    from agents.policies.loading import load_policy
    from agents.training.backend import build_backend
    from agents.training.config import TrainConfig
    from agents.training.update import by_length, score_batch, update_batch

    torch.set_num_threads(1)
    changes = {
        "run.backend": args.backend, "run.zero_stage": args.zero, "rollout.questions_per_step": GROUPS,
        "algorithm.group_size": GROUP_SIZE, "optim.micro_batch_size": 2, "optim.mini_batch_size": 0,
        "optim.update_epochs": 2, "optim.learning_rate": 1e-3, "algorithm.kl_coef": 0.01, "env.max_new_tokens": 16,
        "model.tiny_hidden": 32, "model.tiny_heads": 2, "model.tiny_layers": 1,
    }
    if args.algo == "ppo":
        changes["algorithm.critic"] = "head"
    config = TrainConfig(args.algo).updated(changes)
    algorithm = lookup_algorithm(config.algo)(config.algorithm, max_new_tokens=config.env.max_new_tokens)
    policy = load_policy(config.model, value_head=algorithm.value_head, seed=0)
    backend = build_backend(config, policy, algorithm)
    if backend.world_size > 1:
        algorithm.reduce_sum = backend.all_reduce_sum
    batch = global_batch(policy.vocab_size)
    if backend.world_size > 1:  # this rank's question groups
        per = GROUPS // backend.world_size
        batch = batch.select([r for r in range(len(batch)) if int(batch.group_index[r]) // per == backend.rank])
    batch = batch.select(by_length(batch, torch.arange(len(batch))))
    score_batch(backend, algorithm, config.optim, batch)
    algorithm.compute_advantages(batch)
    stats, _ = update_batch(backend, algorithm, config.optim, batch, shuffle_seed=0, with_entropy=algorithm.needs_entropy)
    summed = {k: float(backend.all_reduce_sum(torch.tensor(v, dtype=torch.float64))) for k, v in stats.items()
              if k.startswith("loss/")}
    with backend.generation():
        params = {name: p.detach().clone().cpu() for name, p in policy.named_parameters()}
    if backend.rank == 0:
        torch.save({"params": params, "loss": summed, "grad_norm": stats["grad_norm"]}, args.out)
    backend.barrier()
    if "RANK" in os.environ and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
