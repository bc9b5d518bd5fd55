"""The pieces of the performance report (:mod:`benchmarks.suite`): a measure with its runs, a ratio
against a peer measured in the same run, one benchmark's section, and the report as JSON and markdown.

A measure keeps every run's value, so the report gives the median and the spread (lowest and highest
run) rather than one number; where a benchmark hands back only its own median, the measure has one value
and says so (``runs`` 1). A ratio is always written as how many times better ours is (faster, or more
per second), so that above 1 means ours wins whatever the unit; the markdown writes one below 1 the
other way round ("1.25x slower" for 0.8).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from benchmarks.common.machine import machine_line
from benchmarks.common.report_files import format_number

__all__ = ["Comparison", "Measure", "Section", "format_markdown", "report_dict"]


@dataclass
class Measure:
    """One figure of a benchmark over its runs.

    Attributes:
        name: what was measured.
        unit: its unit (``µs``, ``queries/s`` ...).
        values: one value per run.
        lower_is_better: a time (True) or a rate (False).
    """

    name: str
    unit: str
    values: list[float]
    lower_is_better: bool

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"measure {self.name!r} has no values")
        self.values = [float(v) for v in self.values]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def as_dict(self) -> dict[str, Any]:
        """Its fields with the median, lowest and highest value and the number of runs."""
        return {**asdict(self), "median": self.median, "min": min(self.values), "max": max(self.values), "runs": len(self.values)}


@dataclass
class Comparison:
    """Ours against a peer on the same figure, both measured in this run.

    Attributes:
        name: the figure compared.
        ours / peer: the two measures (same unit); ``peer_name`` says what the peer is.
    """

    name: str
    ours: Measure
    peer: Measure
    peer_name: str

    @property
    def advantage(self) -> float:
        """How many times better ours is: the peer's median over ours for a time, ours over the peer's for a rate."""
        ours, peer = self.ours.median, self.peer.median
        return peer / ours if self.ours.lower_is_better else ours / peer

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "peer_name": self.peer_name, "unit": self.ours.unit, "ours_median": self.ours.median,
                "peer_median": self.peer.median, "advantage": self.advantage, "lower_is_better": self.ours.lower_is_better}


@dataclass
class Section:
    """One benchmark's part of the report.

    Attributes:
        name: the benchmark (its module under ``benchmarks/``, or the comparison it makes).
        title: a line saying what it measures.
        status: ``ok``, ``skipped`` or ``failed``.
        reason: why it was skipped or how it failed (one line).
        seconds: wall time it took.
        settings: what it ran with.
        measures / comparisons: its figures, and its ratios against peers.
        notes: lines for the reader (targets, what a figure means, what could not be measured).
        details: more figures for the JSON report only (e.g. one row per plan).
    """

    name: str
    title: str
    status: str = "ok"
    reason: str = ""
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    measures: list[Measure] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "title": self.title, "status": self.status, "reason": self.reason, "seconds": self.seconds,
                "settings": self.settings, "measures": [m.as_dict() for m in self.measures],
                "comparisons": [c.as_dict() for c in self.comparisons], "notes": self.notes, "details": self.details}


def report_dict(sections: Sequence[Section], machine: Mapping[str, Any], **header: Any) -> dict[str, Any]:
    """The JSON report: ``header`` (mode, times ...), the machine, every section, and every ratio against
    a peer gathered in one list."""
    return {**header, "machine": dict(machine), "benchmarks": [s.as_dict() for s in sections],
            "comparisons": [{"benchmark": s.name, **c.as_dict()} for s in sections for c in s.comparisons]}


def format_markdown(report: Mapping[str, Any], level: int = 1) -> str:
    """The report (:func:`report_dict`) as markdown: the machine, the ratios against peers, then one section
    per benchmark with its medians and spreads; a skipped or failed benchmark is listed with its reason.
    ``level`` is the title's heading level (2 inside a longer file such as ``benchmarks/RESULTS.md``)."""
    mode = "quick" if report.get("quick") else "full"
    h = "#" * level
    lines = [f"{h} Performance report", "",
             f"{mode} mode, {report.get('seconds', 0.0):.0f} s in all; machine: {machine_line(report['machine'])}", ""]
    lines += [f"{h}# Ratios against peers, measured in this run", ""]
    if report["comparisons"]:
        lines += ["| benchmark | figure | unit | ours | peer | peer's | ours is |", "|---|---|---|---|---|---|---|"]
        for c in report["comparisons"]:
            ahead = c["advantage"] >= 1
            word = ("faster" if ahead else "slower") if c["lower_is_better"] else ("higher" if ahead else "lower")
            times = c["advantage"] if ahead else 1 / c["advantage"]
            lines.append(f"| {c['benchmark']} | {c['name']} | {c['unit']} | {format_number(c['ours_median'])} | {c['peer_name']} | "
                         f"{format_number(c['peer_median'])} | {times:.2f}x {word} |")
    else:
        lines.append("None in this run (each section below says why its peer did not run).")
    for section in report["benchmarks"]:
        state = f"{section['seconds']:.1f} s" if section["status"] == "ok" else f"{section['status']}: {section['reason']}"
        lines += ["", f"{h}# {section['name']} ({state})", "", section["title"]]
        if section["settings"]:
            lines += ["", "Settings: " + ", ".join(f"{k} {v}" for k, v in section["settings"].items()) + "."]
        if section["measures"]:
            lines += ["", "| figure | unit | median | min | max | runs |", "|---|---|---|---|---|---|"]
            lines += [f"| {m['name']} | {m['unit']} | {format_number(m['median'])} | {format_number(m['min'])} "
                      f"| {format_number(m['max'])} | {m['runs']} |"
                      for m in section["measures"]]
        if section["notes"]:
            lines += [""] + [f"- {note}" for note in section["notes"]]
    if report.get("not_in_suite"):
        lines += ["", f"{h}# Not in the suite", ""] + [f"- {name}: {why}" for name, why in report["not_in_suite"].items()]
    return "\n".join(lines) + "\n"
