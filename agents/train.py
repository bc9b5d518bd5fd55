"""Train a search agent from the command line, or build the same run in Python.

    python -m agents.train --algo grpo                                  # the embedded default, on a CPU
    python -m agents.train --config agents/configs/search-r1-grpo.yaml --model ~/models/qwen2.5-3b \\
        --dataset ../shared/data/hotpotqa_train_sample.jsonl --corpus ../shared/data/corpus.jsonl
    python -m agents.train --algo ppo --steps 200 --eval_every 20 --output_dir runs/ppo --resume true

Every field of the algorithm's config dataclass (:mod:`agents.learners`) is a ``--field value`` flag;
``--config recipe.yaml`` loads a recipe first (flags after it override it). Parsing is jsonargparse's.
Bad input - an unknown algorithm or field, a missing model, dataset or corpus file, a tokenizer of
another model - ends the program with one ``error:`` line and exit status 2. At the end the program
prints a before/after evaluation table and where the curve, logs and checkpoint are.

In Python, :func:`build_trainer` assembles what the command runs (policy, environments, algorithm,
backend, trainer) from a config object.
"""
from __future__ import annotations

import argparse
import copy
import random
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import yaml

from agents.backend import TorchBackend
from agents.config import TrainConfig
from agents.evaluation import format_table
from agents.learners import ALGORITHMS, build_algorithm, lookup_algorithm
from agents.models import load_policy
from agents.policy import ValueModel
from agents.trainer import Trainer, TrainResult
from search_env import BatchSearchQAEnv
from search_env.console import progress_enabled
from search_env.data.example import QAExample
from search_env.sources.base import Source

__all__ = ["parse_config", "build_trainer", "main"]

#: A recipe's placeholder for a value the user must give (e.g. ``model: ???``).
MISSING = "???"


def parse_config(argv: Sequence[str]) -> TrainConfig:
    """The config that ``argv`` (``--algo``, ``--config``, ``--field value`` flags) describes.

    Raises ``ValueError`` (one line) for an unknown algorithm, field or value, a missing recipe file,
    or a value the recipe leaves to the user (``???``) that is still unset.
    """
    from jsonargparse import ActionConfigFile, ArgumentParser
    from jsonargparse import ArgumentError as JsonArgumentError

    algo = _chosen_algorithm(argv)
    config_cls = lookup_algorithm(algo)[1] if algo is not None else TrainConfig
    parser = ArgumentParser(
        prog="python -m agents.train", exit_on_error=False, allow_abbrev=False,
        description=f"Train a search agent. Algorithms: {', '.join(ALGORITHMS)}.",
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML recipe of config fields (agents/configs/*.yaml)")
    parser.add_class_arguments(config_cls, nested_key=None, as_positional=False)
    try:
        namespace = parser.parse_args(list(argv))
    except JsonArgumentError as exc:
        raise ValueError(_one_line(str(exc))) from None
    if algo is None:
        raise ValueError(f"choose an algorithm: --algo {{{','.join(ALGORITHMS)}}}")
    values = {k: v for k, v in namespace.clone(with_meta=False).as_dict().items() if k != "config"}
    values["algo"] = algo
    unset = [name for name, value in values.items() if value == MISSING]
    if unset:
        raise ValueError("the recipe leaves " + ", ".join(unset) + " to you: pass " + " ".join(f"--{n} ..." for n in unset))
    return config_cls(**values)


def _chosen_algorithm(argv: Sequence[str]) -> str | None:
    """``--algo`` from the command line, else the recipe's ``algo``; checked against the registry."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--algo")
    pre.add_argument("--config", action="append", default=[])
    known, _ = pre.parse_known_args(list(argv))
    algo = known.algo
    if algo is None:
        for path in known.config:
            if not Path(path).is_file():
                raise ValueError(f"recipe file not found: {path}")
            try:
                recipe = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
            except yaml.YAMLError as exc:
                raise ValueError(f"recipe {path} is not valid YAML: {_one_line(str(exc))}") from None
            if isinstance(recipe, dict) and "algo" in recipe:
                algo = recipe["algo"]
    if algo is not None:
        lookup_algorithm(algo)
    return algo


def build_trainer(config: TrainConfig) -> Trainer:
    """The policy, environments, algorithm, backend and trainer of a run, from its config.

    Seeds Python's, NumPy's and torch's generators with ``config.seed`` and sets torch's thread count;
    with ``config.resume`` the trainer continues from the checkpoint in ``config.output_dir``. Raises
    ``ValueError``/``KeyError``/``OSError`` (one line) for bad input.
    """
    torch.set_num_threads(max(config.num_threads, 1))
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    algorithm = build_algorithm(config)
    policy = load_policy(
        config.model, config.tokenizer, value_head=algorithm.value_head, tiny_layers=config.tiny_layers,
        tiny_hidden=config.tiny_hidden, tiny_heads=config.tiny_heads, tiny_head_dim=config.tiny_head_dim, seed=config.seed,
    ).to(config.device)
    critic, critic_lr = None, None
    if algorithm.uses_critic and not algorithm.value_head:  # PPO's separate critic starts as a copy of the policy
        critic, critic_lr = ValueModel(copy.deepcopy(policy.model)).to(config.device), config.critic_lr
    backend = TorchBackend(policy, config, critic=critic, critic_learning_rate=critic_lr, with_reference=algorithm.uses_reference)
    train_data, eval_data = _datasets(config)
    env_options = _env_options(config, policy.codec)
    env = BatchSearchQAEnv(config.questions_per_step * config.group_size, dataset=train_data[0], sources=train_data[1], **env_options)
    eval_env, eval_questions = None, []
    if eval_data is not None:
        examples, sources = eval_data
        eval_env = BatchSearchQAEnv(min(len(examples), env.num_envs), dataset=examples, sources=sources, **env_options)
        eval_questions = list(range(len(examples)))
    return Trainer(config, policy, env, algorithm, backend, eval_env=eval_env, eval_questions=eval_questions)


Data = tuple[list[QAExample], dict[str, Source]]


def _datasets(config: TrainConfig) -> tuple[Data, Data | None]:
    """Training questions with their sources, and held-out questions with theirs (None: no evaluation).

    Synthetic: a world of ``world_size`` questions from ``world_seed``; held out, the first
    ``eval_questions`` of a world from ``eval_world_seed`` (new names, so the policy must search).
    Real data: the dataset over ``corpus``; held out, ``eval_dataset`` or else the dataset's last
    ``eval_questions`` questions (which training then does not see).
    """
    n_eval = config.eval_questions
    if config.dataset == "synthetic":
        if config.corpus is not None:
            raise ValueError("--corpus is for a real --dataset; the synthetic world brings its own passages")
        train = _synthetic(config.world_seed, config.world_size, config.world_max_hops, config.world_scale)
        if config.eval_dataset is not None:
            raise ValueError("--eval_dataset needs a real --dataset and --corpus (held-out synthetic questions come from --eval_world_seed)")
        held_out = _synthetic(config.eval_world_seed, n_eval, config.world_max_hops, config.world_scale) if n_eval > 0 else None
        return train, held_out
    from search_env.data.loaders import load_dataset

    if config.corpus is None:
        raise ValueError(f"dataset {config.dataset!r} needs --corpus: the passages to search (a {{id, title, text}} jsonl)")
    sources = {"wiki": _corpus_source(config)}
    examples = load_dataset(config.dataset)
    if n_eval <= 0:
        return (examples, sources), None
    if config.eval_dataset is not None:
        return (examples, sources), (load_dataset(config.eval_dataset, limit=n_eval), sources)
    if len(examples) <= n_eval:
        raise ValueError(f"dataset {config.dataset!r} has {len(examples)} questions: too few to hold out eval_questions={n_eval}")
    return (examples[:-n_eval], sources), (examples[-n_eval:], sources)


def _synthetic(seed: int, size: int, max_hops: int, scale: int = 1) -> Data:
    """A synthetic world's questions (at most ``max_hops`` lookups each; ``scale`` times the default
    world's entities) and a BM25 source per world source, plus ``"all"`` over every passage, as the
    environment's default world has."""
    from search_env.resolve import resolve_sources
    from search_env.synthetic import WorldConfig, generate_world

    # Comparison questions take two lookups: a 1-hop world has none.
    world_config = WorldConfig(max_hops=max_hops, **({"comparison_fraction": 0.0} if max_hops < 2 else {})).scaled(scale)
    world = generate_world(seed=seed, n_questions=size, config=world_config)
    return list(world.questions), resolve_sources(None, world)


def _corpus_source(config: TrainConfig) -> Source:
    """The corpus as one source named ``wiki`` (where the NL-DAG protocols' tool names point)."""
    if not Path(config.corpus).is_file():
        raise FileNotFoundError(f"corpus file not found: {config.corpus}")
    if config.retriever == "bm25":
        from search_env.sources.bm25 import BM25Source

        return BM25Source(config.corpus, name="wiki")
    if config.retriever == "dense":
        from search_env.sources.dense import DenseSource

        return DenseSource(config.corpus, index_dir=Path(config.output_dir) / "dense-index", name="wiki",
                           show_progress=progress_enabled(config.progress))
    raise ValueError(f"unknown retriever {config.retriever!r}; known: bm25, dense")


def _env_options(config: TrainConfig, codec: Any) -> dict[str, Any]:
    """The environment settings shared by the training and the held-out environments."""
    options: dict[str, Any] = {
        "protocol": config.protocol, "tokenizer": codec, "max_new_tokens": config.max_new_tokens,
        "max_context": config.max_context, "max_turns": -1 if config.max_turns is None else config.max_turns,
        "reward": _reward(config),
    }
    if config.evidence_model is not None:
        from rewards.models import AnswerModel

        options["evidence_model"] = AnswerModel.local(None if config.evidence_model == "smollm2" else config.evidence_model)
    return options


def _reward(config: TrainConfig) -> Any:
    """``reward_stages`` as a :class:`rewards.schedule.StagedReward`, else the ``reward`` preset (or None:
    the protocol's)."""
    if config.reward_stages is None:
        return config.reward
    if config.reward is not None:
        raise ValueError("give either reward or reward_stages, not both")
    from rewards.schedule import StagedReward

    try:
        stages = [(int(start), str(preset)) for start, preset in config.reward_stages]
    except (TypeError, ValueError):
        raise ValueError(f"reward_stages must be [start_step, preset] pairs, got {config.reward_stages!r}") from None
    return StagedReward(stages)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (see the module docstring); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        config = parse_config(argv)
        if not progress_enabled(config.progress):
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # loading bars would bury the one-line errors and the report
        trainer = build_trainer(config)
    except (ValueError, KeyError, OSError, ImportError) as exc:  # bad input; anything else is a bug: traceback
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # KeyError's str is a repr
        print(f"error: {_one_line(str(message))}", file=sys.stderr)
        return 2
    try:
        result = trainer.train()
    finally:
        trainer.env.close()
        if trainer.eval_env is not None:
            trainer.eval_env.close()
    print(_report(result, config))
    return 0


def _report(result: TrainResult, config: TrainConfig) -> str:
    lines = [f"{config.algo}: {result.step} of {config.steps} steps"]
    if result.evaluations:
        lines += ["", format_table(result.evaluations), ""]
    lines += [
        f"curve:       {result.curve_path}",
        f"metrics:     {result.metrics_path}",
        *( [f"tensorboard: {result.tensorboard_dir}"] if result.tensorboard_dir else []),
        f"checkpoint:  {result.checkpoint_path}",
    ]
    return "\n".join(lines)


def _one_line(message: str) -> str:
    return " ".join(message.split())


if __name__ == "__main__":
    sys.exit(main())
