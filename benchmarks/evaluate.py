"""Evaluate agents on SearchQA-v0: datasets x protocols x agents, with every setting the numbers depend on.

With no arguments it runs on the embedded default (the synthetic world, its BM25 sources, the built-in
tokenizer): the scripted oracle, retrieve-then-answer and no-search agents under every built-in
protocol, in seconds. Every figure is read from the episodes' trajectories, the record a learner
trains on, and every agent plays through the rollout loop training uses.

Agents (--agents, several side by side):
  oracle, retrieve-then-answer, no-search   scripted baselines
  hf:MODEL or a model folder                a local transformers model or a trained run's policy/ folder
                                            (hf:tiny, hf:smollm2 too), sampled with the HF sampler
  endpoint:URL#MODEL                        an OpenAI-compatible completions server (key: --api-key-env)
  ENGINE:MODEL                              any registered rollout engine over a model, as training builds
                                            it: vllm:MODEL, or one a module given to --import registers;
                                            its options: --engine-option ENGINE.FIELD=VALUE
  module:Name                               a scripted agent class (start, next_text) or a RolloutAgent
                                            class or factory (begin, generate, feed, finish)
  BASELINE:LLM                              an LLM baseline of the papers' tables (agents.baselines):
                                            direct, cot, naive-rag, ircot, oracle-passages (reads the gold
                                            passages: an upper bound; not played on a dataset without
                                            them, the report says so) or protocol (the protocol's own
                                            prompt), over LLM = smollm2, tiny, a folder, hf:MODEL or
                                            endpoint:URL#MODEL; e.g. ircot:smollm2
Datasets (--dataset, several): synthetic; nq, triviaqa, popqa, hotpotqa, 2wiki, musique, bamboogle (the
  FlashRAG files in --data-dir, else $SEARCHQA_DATA, else ../shared/data); a part of their fixed split
  (nq@held-out, real-qa@validation: search_env.data.splits); or a jsonl/parquet path. The
  first --episodes questions of each are asked. Real questions are searched with --retriever (bm25,
  dense, or one a module given to --import registers) over --corpus, or with a retrieval server (--retrieval-url).
Metrics, per dataset x protocol x agent: EM, F1 and cover-EM of the extracted answer against every gold
  alias (SQuAD normalisation; cover-EM: a gold is a substring of the answer), an LLM judge's score
  (--judge-url, --judge-model), the protocol's reward, searches, agent tokens, retrieved tokens and
  seconds per question. Greedy decoding, or --sampled K: K seeds, their mean.
Outputs (--output-dir DIR): results.md (settings block and table), results.csv, results.png (bar chart),
  episodes.jsonl (each episode: trajectory text, answer, metrics, reward components) and settings.json.
  Rerunning with the same DIR resumes: episodes already in episodes.jsonl are not played again (a torn
  last line is dropped), and the tables are recomputed from it. A resume under other settings, another corpus
  content (its SHA-256), or an agent whose model weights or module source changed is refused in one line. --results-md PATH also rewrites the
  generated section "evaluation" of that markdown file (benchmarks/RESULTS.md keeps the latest run there).
Retrieval record/replay: --record-retrieval FILE keeps every search (source configuration, query, k ->
  passages); --replay-retrieval FILE answers a later run from it with no retriever built (identical
  scores). A search the file lacks stops the run, or with --replay-missing live is searched and added.
  --probe empty answers every search of real questions with no passages (search_env.sources.probes):
  an agent's drop then says how much of its score comes from what it finds.

Run: python -m benchmarks.evaluate [--episodes 100] [--protocols search-r1 research]
     [--dataset hotpotqa nq --corpus ../shared/data/corpus.jsonl] [--agents oracle hf:runs/demo/policy]
     [--output-dir results/hotpotqa] [--record-retrieval searches.jsonl] [--json table.json]
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import search_env
from agents.rollout.endpoint import EndpointError
from rewards.models import LLMJudge, ModelCallError
from search_env import BatchSearchQAEnv
from search_env.console import CommandParser, HelpFormatter
from search_env.sources.registry import available_sources, lookup_source

from benchmarks.common.report_files import command_line, replace_generated_section
from benchmarks.evaluation import HarnessError
from benchmarks.evaluation.agent_specs import SCRIPTED, AgentOptions, Decoding, agent_from_object, options_of_engine, parse_agent
from benchmarks.evaluation.datasets import DATASET_FILES, SYNTHETIC, WORLD_SEED, Dataset, load_datasets
from benchmarks.evaluation.digests import agent_producer
from benchmarks.evaluation.report import print_legend, print_table, summarize, table_rows, to_markdown, write_chart, write_csv
from benchmarks.evaluation.retrieval import Retrieval, RetrievalOptions
from benchmarks.evaluation.runner import EnvOptions, Plan, play, run
from benchmarks.evaluation.store import EPISODES_FILE, EpisodeLog, check_settings

__all__ = ["evaluate", "main", "print_table"]

RESULT_FILES = {"markdown": "results.md", "csv": "results.csv", "chart": "results.png"}
#: The section of ``--results-md`` that a run rewrites.
RESULTS_SECTION = "evaluation"


def evaluate(protocol: str, agent: str | type, episodes: int, seed: int = 0, **env_kwargs: Any) -> dict[str, Any]:
    """Run one agent (an ``--agents`` spec or a class) on the first ``episodes`` questions under one
    protocol; return the row: mean figures, the reward's preset and range, notes on reward parts that
    could not count.

    ``env_kwargs`` go to the environment (default: the synthetic world); sources passed in them are
    the caller's to close."""
    loaded = agent_from_object(agent.__name__, agent) if isinstance(agent, type) else parse_agent(agent)(AgentOptions())
    rollout_agent = loaded.build(seed)
    codec = getattr(rollout_agent, "codec", None)
    if codec is not None:
        env_kwargs.setdefault("tokenizer", codec)
    env = BatchSearchQAEnv(8, protocol=protocol, **env_kwargs)
    try:
        examples = env.examples[:episodes]
        records = play(rollout_agent, env, examples, {"dataset": "", "protocol": protocol, "agent": loaded.name, "seed": seed})
    finally:
        if "sources" not in env_kwargs:
            env.close()
        close = getattr(rollout_agent, "close", None)
        if callable(close):
            close()
        loaded.release()
    return {"protocol": protocol, "agent": loaded.name, "episodes": len(records), **summarize(records)}


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="python -m benchmarks.evaluate", description=__doc__, formatter_class=HelpFormatter)
    what = parser.add_argument_group("what to evaluate")
    what.add_argument("--agents", nargs="+", default=list(SCRIPTED), metavar="AGENT",
                      help="scripted names, hf:MODEL, a model folder, endpoint:URL#MODEL, ENGINE:MODEL, module:Name or BASELINE:LLM")
    what.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                      help="import MODULE first (the rollout engines, protocols and rewards it registers can then be named)")
    what.add_argument("--dataset", nargs="+", default=[SYNTHETIC], metavar="DATASET",
                      help=f"{SYNTHETIC}, a short name ({', '.join(DATASET_FILES)}), a split (nq@held-out) "
                           "or a FlashRAG jsonl / Search-R1 parquet path")
    what.add_argument("--data-dir", type=Path, default=None,
                      help="folder of the short-named datasets (unset: $SEARCHQA_DATA, else ../shared/data)")
    what.add_argument("--protocols", nargs="+", default=search_env.available_protocols(), help="registered protocol names")
    what.add_argument("--episodes", type=int, default=100, help="questions per dataset (the first ones of its file)")
    search = parser.add_argument_group("retrieval")
    search.add_argument("--corpus", type=Path, default=None, help="passage jsonl that real questions are answered from")
    search.add_argument("--retriever", default="bm25",
                        help=f"how --corpus is searched: {', '.join(available_sources())}, or one --import registers")
    search.add_argument("--retrieval-url", default=None, help="a retrieval server (POST /retrieve) instead of --corpus")
    search.add_argument("--encoder", default=None, help="dense retrieval's encoder folder (unset: the offline default)")
    search.add_argument("--dense-index", choices=("flat", "hnsw", "ivf"), default="flat", help="dense retrieval's faiss index")
    search.add_argument("--index-dir", type=Path, default=None, help="keep dense embeddings and index here between runs")
    search.add_argument("--top-k", type=int, default=None, help="passages per search (unset: each protocol's own)")
    search.add_argument("--probe", choices=("empty",), default=None,
                        help="answer every search of real questions with no passages: what a score owes to searching")
    search.add_argument("--record-retrieval", type=Path, default=None, metavar="FILE", help="record every search into FILE")
    search.add_argument("--replay-retrieval", type=Path, default=None, metavar="FILE",
                        help="answer every search from FILE (recorded earlier), building no retriever")
    search.add_argument("--replay-missing", choices=("error", "live"), default="error",
                        help="a search --replay-retrieval lacks: stop with an error, or search it live and add it")
    budget = parser.add_argument_group("budgets and decoding")
    budget.add_argument("--max-turns", type=int, default=None, help="searches per episode (unset: each protocol's own)")
    budget.add_argument("--max-new-tokens", type=int, default=1024, help="agent tokens per episode")
    budget.add_argument("--max-context", type=int, default=8192, help="tokens per episode, prompt included")
    budget.add_argument("--sampled", type=int, default=0, metavar="K", help="sample with K seeds and report their mean (0: greedy)")
    budget.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (with --sampled)")
    budget.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (with --sampled)")
    budget.add_argument("--seed", type=int, default=0, help="the first sampling seed (and the scripted agents' episode seed)")
    models = parser.add_argument_group("models")
    models.add_argument("--batch-size", type=int, default=8, help="episodes played side by side")
    models.add_argument("--device", default=None, help="where hf: models run (unset: CUDA when available)")
    models.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                        help="hf: models' weights (auto: bfloat16 on CUDA, float32 on the CPU)")
    models.add_argument("--tokenizer", default=None,
                        help="tokenizer folder of the environments of agents without their own (an endpoint's model; "
                             "unset: the built-in one)")
    models.add_argument("--engine-option", dest="engine_option", action="append", default=[], metavar="ENGINE.FIELD=VALUE",
                        help="an option of a rollout engine's agents (VALUE read as JSON, else as a string), e.g. "
                             "vllm.memory_fraction=0.5; repeat for more")
    models.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding endpoints' and the judge's API key")
    models.add_argument("--judge-url", default=None, help="an OpenAI-compatible server whose model judges every answer")
    models.add_argument("--judge-model", default=None, help="the judge's model name (with --judge-url)")
    out = parser.add_argument_group("outputs")
    out.add_argument("--output-dir", type=Path, default=None,
                     help="write results.md/.csv/.png and episodes.jsonl here; an earlier run's folder resumes it")
    out.add_argument("--json", help="also write the table to this JSON file")
    out.add_argument("--results-md", type=Path, default=None, metavar="PATH",
                     help="also put the table into the generated section 'evaluation' of this markdown file (usually "
                          "benchmarks/RESULTS.md), with the date, command and machine; the rest of the file is kept as it was")
    return parser


def _data_error(message: str) -> NoReturn:
    """Stop on a file or folder that is missing or holds something else: one ``error:`` line and status 2,
    without the usage text ``parser.error`` prints (the flags were fine; the data was not)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line each, what cannot run, before anything is loaded."""
    _check_numbers(parser, args)
    _check_retrieval(parser, args)
    if args.tokenizer is not None and not Path(args.tokenizer).exists():
        _data_error(f"no tokenizer at {args.tokenizer}")
    if (args.judge_url is None) != (args.judge_model is None):
        parser.error("give --judge-url and --judge-model together")
    for protocol in args.protocols:
        try:
            search_env.get_protocol(protocol)
        except search_env.UnknownNameError as exc:
            parser.error(str(exc))


def _check_numbers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Counts, budgets and sampling settings in their ranges."""
    for name, low in (("episodes", 1), ("sampled", 0), ("batch_size", 1), ("top_k", 1), ("max_turns", 0), ("max_new_tokens", 1)):
        value = getattr(args, name)
        if value is not None and value < low:
            parser.error(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    if args.temperature <= 0 or not 0 < args.top_p <= 1:
        parser.error(f"--temperature must be > 0 and --top-p in (0, 1], got {args.temperature} and {args.top_p}")


def _check_retrieval(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What real questions are searched with, and the record or replay of their searches."""
    if args.results_md is not None and not args.results_md.parent.is_dir():
        _data_error(f"--results-md: no folder {args.results_md.parent}")
    real = [spec for spec in args.dataset if spec != SYNTHETIC]
    has_retriever = args.corpus is not None or args.retrieval_url is not None
    if args.corpus is not None and args.retrieval_url is not None:
        parser.error("give --corpus or --retrieval-url, not both")
    if bool(real) != has_retriever and not (real and args.replay_retrieval is not None):
        parser.error("give --dataset and --corpus together (or --retrieval-url, or --replay-retrieval): "
                     "the synthetic world has its own sources, real questions need a corpus")
    if args.retrieval_url is not None and args.retriever != "bm25":
        parser.error("--retriever applies to --corpus; a retrieval server retrieves its own way")
    if args.record_retrieval is not None and args.replay_retrieval is not None:
        parser.error("give --record-retrieval or --replay-retrieval, not both (a replay with --replay-missing live adds to its file)")
    if args.replay_retrieval is not None and not args.replay_retrieval.is_file():
        _data_error(f"--replay-retrieval {args.replay_retrieval} does not exist")
    if args.replay_missing == "live" and args.replay_retrieval is None:
        parser.error("--replay-missing applies to --replay-retrieval")
    if args.replay_missing == "live" and real and not has_retriever:
        parser.error("--replay-missing live searches what the recording lacks: give --corpus or --retrieval-url")
    if args.corpus is not None and args.replay_retrieval is None and not args.corpus.is_file():
        _data_error(f"no corpus file {args.corpus}")
    try:
        lookup_source(args.retriever)
    except search_env.UnknownNameError as exc:
        parser.error(f"--retriever: {exc}")


def _engine_options(parser: argparse.ArgumentParser, given: list[str]) -> dict[str, dict[str, Any]]:
    """``--engine-option ENGINE.FIELD=VALUE`` as ``{engine: {field: value}}``, each engine's checked against
    its options class (one line for an unknown engine or field, or a bad value)."""
    options: dict[str, dict[str, Any]] = {}
    for item in given:
        key, equals, text = item.partition("=")
        engine, dot, name = key.partition(".")
        if not equals or not dot or not engine or not name:
            parser.error(f"--engine-option {item!r}: give ENGINE.FIELD=VALUE, e.g. vllm.memory_fraction=0.5")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        options.setdefault(engine, {})[name] = value
    for engine in options:
        try:
            options_of_engine(engine, AgentOptions(engine_options=options))
        except (ValueError, TypeError) as exc:  # an unknown engine or field, a bad value
            parser.error(f"--engine-option: {exc}")
    return options


def _settings(args: argparse.Namespace, retrieval: Retrieval, datasets: list[Dataset]) -> dict[str, Any]:
    """What episodes' outcomes depend on beyond their key, checked when an output folder is resumed
    (the real-data retriever as a replay of it names it too, so recording, replaying and searching
    live resume one another)."""
    decoding = "greedy" if not args.sampled else f"sampled (T={args.temperature:g}, top-p {args.top_p:g})"
    real = any(dataset.world is None for dataset in datasets)
    return {"retrieval": retrieval.real_config() if real else None, "top_k": args.top_k, "max_turns": args.max_turns,
            "max_new_tokens": args.max_new_tokens, "max_context": args.max_context, "decoding": decoding,
            "tokenizer": args.tokenizer, "dtype": args.dtype, "judge_model": args.judge_model,
            "engine_options": args.engine_options or None, **({"probe": args.probe} if args.probe else {})}


def _data_line(dataset: Dataset, retrieval: Retrieval, args: argparse.Namespace) -> str:
    """Which questions a dataset's rows are over and how they were searched, under its terminal table."""
    where = (f"synthetic world seed {WORLD_SEED}" if dataset.world is not None
             else f"{dataset.name} searched with {retrieval.searched_with(dataset)}")
    seeds = f"episode seed {args.seed}" if not args.sampled else f"sampling seeds {args.seed}-{args.seed + args.sampled - 1}"
    return f"{len(dataset.examples)} episodes each, {where}, {seeds}"


def _parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The arguments, with ``--import`` modules imported and every check passed."""
    parser = _parser()
    args = parser.parse_args(argv)
    for module in args.imports:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            parser.error(f"--import {module}: {' '.join(str(exc).split())}")
    _check_arguments(parser, args)
    args.engine_options = _engine_options(parser, args.engine_option)
    return parser, args


def _prepare(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Plan, Retrieval, list[Dataset]]:
    """The plan of what to play, its retrieval and datasets: agents parsed and loaded, datasets read, and an
    output folder's settings checked against the run resumed there."""
    loaders = []
    for spec in args.agents:
        try:
            loaders.append(parse_agent(spec))
        except ValueError as exc:
            parser.error(str(exc))
    try:
        datasets = load_datasets(args.dataset, args.episodes, args.data_dir)
    except (FileNotFoundError, ValueError) as exc:
        _data_error(str(exc))
    options = RetrievalOptions(retriever=args.retriever, corpus=args.corpus, url=args.retrieval_url, encoder=args.encoder,
                               dense_index=args.dense_index, index_dir=args.index_dir, record=args.record_retrieval,
                               replay=args.replay_retrieval, replay_missing=args.replay_missing, probe=args.probe)
    try:
        retrieval = Retrieval(options)
        for dataset in datasets:
            retrieval.describe(dataset)  # a replay's configuration is checked before anything runs
        if args.output_dir is not None:
            check_settings(args.output_dir, _settings(args, retrieval, datasets), {spec: agent_producer(spec) for spec in args.agents})
    except (HarnessError, ValueError, OSError) as exc:
        _data_error(str(exc))

    agent_options = AgentOptions(decoding=Decoding(args.sampled, args.temperature, args.top_p), device=args.device,
                                 dtype=args.dtype, api_key_env=args.api_key_env, max_context=args.max_context,
                                 engine_options=args.engine_options)
    try:
        agents = [load(agent_options) for load in loaders]
    except ValueError as exc:  # an engine's options that cannot go together (an endpoint's with --engine-option)
        parser.error(str(exc))
    judge = None
    if args.judge_url is not None:
        judge = LLMJudge.http(args.judge_url, args.judge_model, api_key_env=args.api_key_env)
    env = EnvOptions(top_k=args.top_k, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
                     max_context=args.max_context, tokenizer=args.tokenizer)
    plan = Plan(datasets, args.protocols, agents, env, seed=args.seed,
                samples=args.sampled, batch_size=args.batch_size, judge=judge)
    return plan, retrieval, datasets


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser, args = _parse(argv)
    plan, retrieval, datasets = _prepare(parser, args)
    judge = plan.judge
    try:
        log = EpisodeLog(args.output_dir / EPISODES_FILE if args.output_dir is not None else None)
    except ValueError as exc:
        _data_error(str(exc))
    not_played = [f"{agent.name} on {dataset.name} ({reason})" for agent, dataset, reason in plan.not_played()]
    for line in not_played:
        print(f"not played: {line}", file=sys.stderr)
    if len(log):
        torn = ", its torn last line dropped" if log.dropped_torn_line else ""
        print(f"resuming {log.path}: {len(log)} episodes kept{torn}", file=sys.stderr)
    try:
        run(plan, retrieval, log)
    except (HarnessError, EndpointError, ModelCallError) as exc:  # one line each; the episodes played are kept
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        if log.path is None:
            raise
        sys.exit(f"interrupted: {len(log)} episodes are in {log.path}; run the same command again to resume")
    finally:
        log.close()
        retrieval.close()
        if judge is not None:
            judge.chat.close()

    table = table_rows(plan, log, retrieval, args.judge_model)
    _write_outputs(table, datasets, retrieval, args, argv, not_played)
    return table


def _write_outputs(table: list[dict[str, Any]], datasets: list[Dataset], retrieval: Retrieval, args: argparse.Namespace,
                   argv: list[str] | None, not_played: list[str]) -> None:
    """The tables on the terminal, and the files ``--output-dir``, ``--json`` and ``--results-md`` ask for."""
    for dataset in datasets:
        rows = [row for row in table if row["dataset"] == dataset.name]
        if rows:
            print_table(rows, _data_line(dataset, retrieval, args))
    print_legend(table)
    for line in not_played:
        print(f"note: not played: {line}")
    if args.output_dir is not None:
        (args.output_dir / RESULT_FILES["markdown"]).write_text(to_markdown(table, not_played=not_played), encoding="utf-8")
        write_csv(table, args.output_dir / RESULT_FILES["csv"])
        write_chart(table, args.output_dir / RESULT_FILES["chart"])
        print(f"wrote {', '.join(RESULT_FILES.values())} and {EPISODES_FILE} in {args.output_dir}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(table, f, indent=2)
    if args.results_md is not None:
        data_lines = "\n".join(f"- {dataset.name}: {_data_line(dataset, retrieval, args)}" for dataset in datasets)
        replace_generated_section(args.results_md, RESULTS_SECTION,
                                  f"## Evaluation harness\n\n{data_lines}\n\n"
                                  f"{to_markdown(table, 'Settings and results', not_played=not_played, level=3)}",
                                  command=command_line("python -m benchmarks.evaluate", argv))
        print(f"wrote the section {RESULTS_SECTION!r} of {args.results_md}")


if __name__ == "__main__":
    main()
