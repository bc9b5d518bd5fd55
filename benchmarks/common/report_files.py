"""The files a benchmark command leaves behind, written one way for every command: a figure means little
without the command, date and machine that produced it, so each file carries them.

A command given ``--output-dir DIR`` calls :func:`write_results`, which writes ``DIR/<name>.md`` (a title,
the provenance line, the command's tables), ``DIR/<name>.json`` (the provenance, the settings and every
figure, for scripts), ``DIR/<name>.csv`` (one line per table row, where the result is a table) and
``DIR/<name>.png`` (where the command has a plot and matplotlib, the ``agents`` extra, is installed: the
core benchmarks run without it, so a missing matplotlib leaves the PNG out rather than failing the run).
Files are named after the command so that several commands can share one folder.

:func:`replace_generated_section` keeps a generated section of a hand-written markdown file (such as
``benchmarks/RESULTS.md``) up to date: it rewrites only what lies between the section's two marker
comments and leaves every byte outside them as it was.
"""
from __future__ import annotations

import csv
import json
import re
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from benchmarks.common.machine import machine_info, machine_line
from search_env.files import write_atomically

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["command_line", "format_number", "markdown_table", "replace_generated_section", "run_header", "write_csv",
           "write_results"]


def format_number(value: float) -> str:
    """A figure with as many digits as it needs: thousands grouped, small values to three significant digits."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, (list, tuple)):
        return " ".join(map(_cell, value))
    return str(value).replace("|", "\\|").replace("<", "\\<").replace("\n", " ")  # "</answer>" is not an HTML tag


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """``rows`` as a markdown table whose header is ``columns`` (default: every key of the rows, in order of
    appearance); floats are written by :func:`format_number`, a list's items side by side, a missing value as
    ``-``, and ``|`` and ``<`` escaped."""
    columns = list(columns) if columns is not None else list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(column)) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """One line per row, every key a column (in order of appearance), a missing value empty and a list's
    items joined by spaces."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if value is None else " ".join(map(str, value)) if isinstance(value, (list, tuple)) else value
                             for key, value in row.items()})
    return path


def command_line(prog: str | None = None, argv: Sequence[str] | None = None) -> str:
    """The command as a person would type it again: ``prog`` (default: ``python -m`` and the running
    module, or the script) and ``argv`` (default: this process's arguments), shell-quoted."""
    if prog is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        prog = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    words = sys.argv[1:] if argv is None else list(argv)
    return f"{prog} {shlex.join(words)}" if words else prog


def run_header(command: str) -> dict[str, Any]:
    """What every result file starts with: the command, the date and time (UTC) and the machine
    (:func:`benchmarks.common.machine.machine_info`)."""
    return {"command": command, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info()}


def _provenance(header: Mapping[str, Any]) -> str:
    return f"Generated {header['date']} by `{header['command']}`; machine: {machine_line(header['machine'])}."


def write_results(output_dir: Path, name: str, *, title: str, command: str, body: str, data: Mapping[str, Any],
                  rows: Sequence[Mapping[str, Any]] | None = None, plot: Callable[[Figure], None] | None = None) -> list[Path]:
    """Write a command's results into ``output_dir`` (made when missing) and return the paths written.

    Args:
        name: the files' stem (the command's module name).
        title: the markdown's heading.
        command: the command line (:func:`command_line`), recorded in every file.
        body: the markdown under the heading and the provenance line (tables, notes).
        data: what the JSON holds besides the provenance (settings, every figure); values JSON cannot
            hold (paths) are written as text, and a key named like one of the provenance's (command, date,
            machine) gives way to it.
        rows: the CSV's lines, where the result is a table.
        plot: draws the PNG on a blank figure (matplotlib's Agg canvas, no display needed).
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    header = run_header(command)
    markdown = output_dir / f"{name}.md"
    markdown.write_text(f"# {title}\n\n{_provenance(header)}\n\n{body.strip()}\n", encoding="utf-8")
    results = output_dir / f"{name}.json"
    content = {**header, **{key: value for key, value in data.items() if key not in header}}
    results.write_text(json.dumps(content, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    written = [markdown, results]
    if rows:
        written.append(write_csv(output_dir / f"{name}.csv", rows))
    if plot is not None:
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ModuleNotFoundError:
            print(f"no {name}.png: matplotlib is not installed (pip install 'searchqa-gym[agents]')")
        else:
            figure = Figure(figsize=(6.4, 4.2), layout="constrained")
            FigureCanvasAgg(figure)
            plot(figure)
            figure.savefig(output_dir / f"{name}.png", dpi=120)
            written.append(output_dir / f"{name}.png")
    print(f"results: {', '.join(str(path) for path in written)}")
    return written


def _markers(name: str) -> tuple[re.Pattern[str], re.Pattern[str], str, str]:
    """The begin and end markers of section ``name``: patterns to find them, and the lines to write."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"a generated section's name is letters, digits, '_', '.' or '-', got {name!r}")
    begin = f"<!-- generated section {name}: begin (rewritten by the command named below; edit outside these markers) -->"
    end = f"<!-- generated section {name}: end -->"
    found_begin = re.compile(rf"^<!-- generated section {re.escape(name)}: begin\b[^\n]*-->$", re.M)
    return found_begin, re.compile(rf"^{re.escape(end)}$", re.M), begin, end


def replace_generated_section(path: Path, name: str, markdown: str, *, command: str | None = None,
                              machine: Mapping[str, Any] | None = None, date: str | None = None) -> Path:
    """Put ``markdown`` into the section ``name`` of the markdown file at ``path``, between its marker comments
    (``<!-- generated section NAME: begin ... -->`` and ``<!-- generated section NAME: end -->``): the section is
    replaced where the file has it, appended at its end where not, and the file made where it does not exist.
    Every byte outside the markers is kept as it was, and the file is replaced in one step
    (:func:`search_env.files.write_atomically`: a killed run cannot leave hand-written history half-written).

    The section states what produced it: the date (default: now, UTC), the command (default: this
    process's, :func:`command_line`) and the machine (default: this one). That line follows the first line
    of ``markdown`` when it is a heading, else comes first.

    Raises:
        ValueError: ``name`` is not a plain word, or the file marks the section more than once or only
            half (a begin without its end, or the end first).
    """
    path = Path(path)
    found_begin, found_end, begin, end = _markers(name)
    header = run_header(command if command is not None else command_line())
    if machine is not None:
        header["machine"] = dict(machine)
    if date is not None:
        header["date"] = date
    body = markdown.strip("\n")
    heading, _, rest = body.partition("\n") if body.startswith("#") else ("", "", body)
    rest = rest.strip("\n")
    block = "\n".join([begin, *([heading, ""] if heading else []), _provenance(header), *(["", rest] if rest else []), end])
    text = path.read_bytes().decode("utf-8") if path.exists() else ""  # bytes: a CRLF file keeps its CRLFs
    begins, ends = list(found_begin.finditer(text)), list(found_end.finditer(text))
    if len(begins) > 1 or len(ends) > 1:
        raise ValueError(f"{path} marks the generated section {name!r} more than once")
    if begins and ends and begins[0].start() < ends[0].start():
        text = text[:begins[0].start()] + block + text[ends[0].end():]
    elif begins or ends:
        raise ValueError(f"{path} has the generated section {name!r} half-marked: its begin and end markers must both be there, in order")
    else:
        text += ("" if not text else "\n" if text.endswith("\n") else "\n\n") + block + "\n"
    return write_atomically(path, text.encode("utf-8"))
