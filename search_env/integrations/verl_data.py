"""Write the parquet files verl's multi-turn recipes read (and SkyRL reads), for one protocol.

    python -m search_env.integrations.verl_data --protocol search-r1 --output-dir ~/data/searchqa

writes ``train.parquet`` and ``test.parquet``, one row per question: the columns verl's RL dataset and
tool agent loop read (``data_source`` = ``searchqa/<protocol>``, ``prompt`` as the protocol's chat
messages, ``ability``, ``reward_model.ground_truth``, ``agent_name`` = ``tool_agent``, and in
``extra_info`` the question, the reward preset and its options for
:func:`search_env.integrations.verl.compute_score`, and ``tools_kwargs`` for
:class:`search_env.integrations.verl_tool.SearchQATool`), plus SkyRL's (``env_class`` and
``reward_spec``, for :class:`search_env.integrations.skyrl.SearchQASkyRLEnv`). The prompt is the one
``gym.make("SearchQA-v0")`` renders from (for NL-DAG protocols, naming the tools these sources offer);
a protocol whose prompt opens the assistant's turn (R1-Searcher's ``<think>``) loses that prefix, which
chat messages cannot hold. Needs pyarrow (extra ``data``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from search_env._optional import requires_extra
from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from search_env.integrations.verl import data_source

__all__ = ["rows", "write", "main"]

#: ``env_class`` of SkyRL rows (the id :func:`search_env.integrations.skyrl.register` uses).
SKYRL_ENV_CLASS = "searchqa"
#: The verl tool's function name (``search_env.integrations.verl_tool.TOOL_NAME``, which needs verl to import).
TOOL_NAME = "search"


def _plain(value: Any) -> Any:
    """Options as JSON-able values (tuples become lists)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def rows(env: SearchQAEnv, examples: Sequence[QAExample], split: str) -> list[dict[str, Any]]:
    """One row per example with ``env``'s protocol, reward and prompt (see the module docstring)."""
    if not isinstance(env.reward, str):
        raise ValueError("a staged reward (a StepReward) cannot be written to a data file; give a preset name")
    options = json.dumps(_plain(env.reward_options), sort_keys=True)
    out = []
    for index, example in enumerate(examples):
        truth = {"target": list(example.golden_answers)}
        out.append({
            "data_source": data_source(env.protocol.name),
            "prompt": env.protocol.messages(example.question),
            "ability": "search",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "agent_name": "tool_agent",
            "env_class": SKYRL_ENV_CLASS,
            "reward_spec": {"method": "rule", "ground_truth": truth},
            "extra_info": {
                "index": index, "split": split, "id": example.id, "question": example.question,
                "reward": env.reward, "reward_options": options, "need_tools_kwargs": True,
                "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"question": example.question, "ground_truth": truth}}},
            },
        })
    return out


def write(env: SearchQAEnv, output_dir: str | Path, *, test_size: int, train_size: int | None = None) -> dict[str, Path]:
    """Write ``test.parquet`` (the dataset's first ``test_size`` questions) and ``train.parquet`` (the next
    ``train_size``, default all the rest) into ``output_dir``; returns their paths."""
    with requires_extra("data", "writing parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

    examples = list(env.examples)
    if not 0 <= test_size < len(examples):
        raise ValueError(f"test_size must be in [0, {len(examples)}), got {test_size}")
    train = examples[test_size:] if train_size is None else examples[test_size:test_size + train_size]
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, chosen in (("train", train), ("test", examples[:test_size])):
        paths[split] = output_dir / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(rows(env, chosen, split)), paths[split])
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m search_env.integrations.verl_data", description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="search-r1", help="the protocol whose prompt, tags and reward the rows use")
    parser.add_argument("--dataset", default="synthetic", help="'synthetic' or a dataset name/path load_dataset reads")
    parser.add_argument("--test-size", type=int, default=100, help="questions in test.parquet (the dataset's first ones)")
    parser.add_argument("--train-size", type=int, default=None, help="questions in train.parquet (default: all the rest)")
    parser.add_argument("--output-dir", type=Path, required=True, help="where train.parquet and test.parquet go")
    args = parser.parse_args(argv)
    env = SearchQAEnv(args.protocol, dataset=args.dataset)
    paths = write(env, args.output_dir, test_size=args.test_size, train_size=args.train_size)
    env.close()
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
