"""Writes the reference pages that are generated from the code, before Sphinx reads the sources.

* ``reference/cli.md``: every ``python -m agents.train`` option, read from the parser the command itself
  builds (:mod:`agents.train`, whose groups are the config dataclasses and whose help is their docstrings),
  once for the default choices and once per registered algorithm, rollout engine and backend for the group
  that choice decides. Nothing is copied by hand, so a new field appears on the next build.
* ``reference/metrics.md``: the metrics glossary, from :data:`agents.training.metric_keys.METRIC_KEYS`.
* ``reference/protocols.md``: the protocols table, from the protocols :mod:`search_env.protocols` registers.
* ``reference/benchmarks.md``: every benchmark command with the first line of its module's docstring, from
  :data:`benchmarks.__main__.COMMANDS` (what ``python -m benchmarks`` lists).
* ``figures.md``: every figure in ``benchmarks/figures/``, each with the title of the ``benchmarks/RESULTS.md``
  section that names it (where its numbers, command and machine are), so a new figure shows on the next build.

These files are build outputs (ignored by git).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

#: The choices that decide a group's class: (flag, group, the registry's names).
_CHOICE_GROUPS = (("--algo", "algorithm"), ("--rollout.engine", "engine"), ("--run.backend", "backend"))


#: Every punctuation mark that could start Markdown markup.
_MARKUP = re.compile(r"([\\`*_\[\]{}<>()#+!|~])")


def _escape(text: str) -> str:
    """``text`` as literal Markdown, its whitespace collapsed."""
    return _MARKUP.sub(r"\\\1", " ".join(text.split()))


def _type_name(action: Any) -> str:
    hint = getattr(action, "_typehint", None)
    if hint is None:
        return ""
    name = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    return name or str(hint).replace("typing.", "")


def _option_lines(parser: Any, group_name: str | None) -> list[str]:
    """One bullet per option of ``parser``'s group ``group_name`` (None: the top-level options)."""
    lines = []
    for group in parser._action_groups:
        if getattr(group, "dest", None) != group_name or (group_name is None and group.title != "options"):
            continue
        for action in group._group_actions:
            flag = next((s for s in action.option_strings if s.startswith("--")), None)
            if flag is None or flag == "--help" or action.help == "Path to a configuration file.":
                continue
            details = [f"`{_type_name(action)}`"] if _type_name(action) else []
            if action.default is not None and not str(action.default).startswith("==SUPPRESS"):
                details.append(f"default `{action.default!r}`")
            head = f"- **`{flag}`**" + (f" ({', '.join(details)})" if details else "")
            text = action.help or ""
            if "%(" in text:  # argparse's placeholders, filled as --help fills them
                text = text % {**vars(action), "prog": parser.prog}
            lines.append(f"{head}: {_escape(text)}")
    return lines


def _group_title(parser: Any, group_name: str) -> str:
    return next(_escape(group.title) for group in parser._action_groups if getattr(group, "dest", None) == group_name)


def cli_page() -> str:
    """The Markdown of the ``agents.train`` options page."""
    from agents.learners.registry import ALGORITHMS
    from agents.rollout.engines import ENGINES
    from agents.train import _parser
    from agents.training.backends.base import BACKENDS
    from agents.training.config import GROUPS

    parser, choices = _parser([])
    out = ["# `agents.train` options", "",
           "Generated from the config dataclasses (`agents.training.config`) by the parser `python -m agents.train` "
           "builds, so it lists exactly what `--help` does. Flags are `--GROUP.FIELD VALUE`; a YAML recipe "
           "(`--config`) sets the same fields as `GROUP: {FIELD: VALUE}`.", "",
           "## Top-level options", "", *_option_lines(parser, None), ""]
    for name in GROUPS:
        out += [f"## `{name}`", "", _group_title(parser, name), "", *_option_lines(parser, name), ""]
    names = {"algorithm": list(ALGORITHMS), "engine": ENGINES.names(), "backend": BACKENDS.names()}
    for flag, group in _CHOICE_GROUPS:
        out += [f"## `{group}` (chosen by `{flag}`)", "",
                f"The `{group}` group's fields depend on `{flag}`; default `{choices[flag.lstrip('-')]}`.", ""]
        for choice in names[group]:
            chosen, _ = _parser([flag, choice])
            options = _option_lines(chosen, group)
            out += [f"### `{flag} {choice}`", "", _group_title(chosen, group), "",
                    *(options or ["No options of its own."]), ""]
    return "\n".join(out)


def metrics_page() -> str:
    """The Markdown of the metrics glossary."""
    from agents.training.metric_keys import METRIC_KEYS

    rows = [f"| `{entry.pattern}` | {entry.meaning.replace('|', '&#124;')} | {entry.unit} |" for entry in METRIC_KEYS]
    return "\n".join([
        "# Metrics glossary", "",
        "Every key a training run writes to `metrics.jsonl` (and TensorBoard or W&B), generated from "
        "`agents.training.metric_keys.METRIC_KEYS`; a test fails on a logged key without an entry. "
        "`{name}` stands for one path segment (`eval/{decoding}/em`: `eval/greedy/em`, `eval/sampled/em`). "
        "Unit `share`: a fraction in [0, 1]; `nats`: natural-log units.", "",
        "| Key | Meaning | Unit |", "| --- | --- | --- |", *rows, ""])


def _cell(text: str | None) -> str:
    """``text`` as a code span in a Markdown table cell (``|`` escaped, as tables require); ``-`` for none."""
    return f"`{text.replace('|', chr(92) + '|')}`" if text else "-"


def protocols_page() -> str:
    """The Markdown of the protocols table, from the protocols registered by name."""
    from search_env.protocols import available_protocols, get_protocol

    rows = []
    for name in available_protocols():
        dialect = get_protocol(name)
        turns = "unlimited" if dialect.max_turns is None else dialect.max_turns
        rows.append(f"| `{name}` | {dialect.call_kind} | {_cell(dialect.call_open)} {_cell(dialect.call_close)} | "
                    f"{_cell(dialect.answer_open)} {_cell(dialect.answer_close)} | {_cell(dialect.result_open)} "
                    f"{_cell(dialect.result_close)} | `{dialect.reward}` | {turns} | {dialect.top_k} |")
    return "\n".join([
        "# Protocols", "",
        "The protocols registered by name (`env.protocol`, `gym.make(\"SearchQA-v0\", protocol=...)`), generated from "
        "`search_env.protocols`. Call kind: `query` (one query per call), `dag` (an NL-DAG plan of sub-queries) or "
        "`tools` (native tool calls, read when the agent's turn ends; the tags shown are the call format's). "
        "Max turns: searches allowed per episode; top k: passages per query. The reward is the default preset "
        "(`env.reward` overrides it).", "",
        "| Protocol | Call kind | Search call | Answer | Results | Default reward | Max turns | Top k |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |", *rows, ""])


def benchmarks_page() -> str:
    """The benchmark commands (``python -m benchmarks``'s list), each with what it measures."""
    from benchmarks.__main__ import COMMANDS, description

    def cell(text: str) -> str:  # the docstring's ``literals`` as code, the rest as plain text
        parts = " ".join(text.split()).split("``")
        return "".join(f"`{part}`" if i % 2 else _MARKUP.sub(r"\\\1", part) for i, part in enumerate(parts))

    rows = [f"| `python -m benchmarks.{name}` | {cell(description(name))} |" for name in COMMANDS]
    return "\n".join([
        "# Benchmark commands", "",
        "Each is `python -m benchmarks.NAME` (`--help` for its options; `--quick` where it has one runs it in "
        "minutes); what each measured, with which command and on which machine, is in [the results](../results.md).",
        "", "| Command | What it measures |", "| --- | --- |", *rows, ""])


def figures_page(benchmarks: Path) -> str:
    """The figures of ``benchmarks/figures/``, each with the last heading of ``benchmarks/RESULTS.md`` before
    its first mention there (the section that says what it measured)."""
    lines = (benchmarks / "RESULTS.md").read_text(encoding="utf-8").splitlines()
    parts = ["# Figures", "",
             "Every figure the benchmarks drew, under the section of [the results](results.md) that says what it "
             "measured, with which command and on which machine.", ""]
    for figure in sorted((benchmarks / "figures").glob("*.png")):
        heading = current = None
        for line in lines:
            if line.startswith("#"):
                current = line.lstrip("#").strip()
            if figure.name in line:
                heading = current
                break
        where = f"In the results: *{_escape(heading)}*." if heading else "Not named in the results."
        parts += [f"## `{figure.name}`", "", where, "", f"![{figure.name}](../benchmarks/figures/{figure.name})", ""]
    return "\n".join(parts)


def write_pages(app: Any) -> None:
    """Sphinx ``builder-inited`` hook: (re)write the generated pages, only when their text changed (so an
    unchanged page is not rebuilt)."""
    source = Path(app.srcdir)
    pages = {"reference/cli.md": cli_page(), "reference/metrics.md": metrics_page(),
             "reference/protocols.md": protocols_page(), "reference/benchmarks.md": benchmarks_page(),
             "figures.md": figures_page(source.parent / "benchmarks")}
    for name, text in pages.items():
        path = source / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", write_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
