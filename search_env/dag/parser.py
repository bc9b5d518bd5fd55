"""Tolerant, linear-time reader of NL-DAG plans (the ``reasoning-search`` call syntax).

A plan is written inside the call tag as::

    Nodes:
    A: US tariffs 2024 (News)
    B: Tariffs impact on 401k & CPI (General)
    Edges:
    A -> B ; C -> B

Models write many variants of this, and a training run should score what the model meant rather
than crash or silently drop nodes, so the reader accepts:

- full-width punctuation (``：，；、（）【】``) and arrow spellings (``->``, ``-->``, ``=>``, ``→``,
  ``⟶``, ``⇒``, ``—>``);
- missing ``Nodes:``/``Edges:`` headers (a ``label: ... (Tool)`` line is a node, a line with an arrow
  is an edge line), content on the header line itself (``Edges: A -> B``), headers in Markdown
  (``**Nodes:**``, ``### Edges``);
- bullets and numbering (``- ``, ``* ``, ``• ``, ``1. ``, ``(2) ``), a ``Node``/``Step`` word before the
  label, lower-case labels (read upper-cased) and labels with digits (``A1``), label separators
  ``:``, ``. `` and ``) ``;
- the tool in ``(Tool)``, ``[Tool]``, ``（Tool）`` or ``【Tool】`` at the end of the node line, optionally
  followed by ``;``, ``,`` or ``.``;
- edge chains (``A -> B -> C``), several edges per line separated by ``;`` or ``,``, label groups
  (``A, C -> B``; ``A & C -> B``; ``A -> B, C`` means A→B and A→C), ``Node A -> Node B``, and an
  explicit empty edge list (``Edges: none``).

Reading never raises and never guesses silently: anything it cannot read becomes an entry of
:attr:`Plan.issues` (a :class:`Violation`), which :func:`search_env.dag.validate.validate_plan` reports
together with the structural rules.

Every step is a single pass over a line: string methods, or anchored regular expressions without
nested or unbounded overlapping quantifiers, so the time is linear in the input length whatever the
input (no catastrophic backtracking; see ``benchmarks/dag_critical_path.py`` for the measurement).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["MAX_EDGES", "Plan", "PlanNode", "Violation", "format_plan", "parse_plan"]

MAX_EDGES = 1024
"""Edge groups (``A, B, C -> D, E``) expand to a product; past this many distinct edges the reader
stops adding edges and reports ``too_many_edges`` so a hostile block cannot blow up memory."""

_DETAIL_CHARS = 80  # quoted input in an issue is cut to this length: issues become observations

# Full-width punctuation models emit, mapped to the ASCII the grammar uses. Arrows are handled
# separately (only on edge text) so that node queries keep their own characters.
_FULL_WIDTH = str.maketrans(
    {"：": ":", "；": ";", "，": ",", "、": ",", "（": "(", "）": ")", "【": "[", "】": "]", "\u3000": " "}
)
_ARROW = "→"
# The lookbehind makes a run of dashes cost one scan, not one scan per position (linear time).
_ARROW_RE = re.compile(r"(?<![-=—－])[-=—－]+[>＞]|[⟶⇒➔➜➝⇾]")
_BULLET_CHARS = "-*•·+>#–—"
_NUMBERING_RE = re.compile(r"(?:\d{1,3}[.)]|\(\d{1,3}\))(?: |$)")
_PREFIX_WORD_RE = re.compile(r"(?:node|step) (?=[a-z][0-9]* ?[:.)])", re.IGNORECASE)
_HEADER_RE = re.compile(r"(nodes?|edges?)(?: ?:|$)", re.IGNORECASE)
_LABEL_RE = re.compile(r"([A-Za-z][0-9]{0,3}) ?(?::|[.)](?= |$))")
_LABEL_TOKEN_RE = re.compile(r"[A-Za-z][0-9]{0,3}")
_TOOL_RE = re.compile(r"[\w\- ]+")
_GROUP_SPLIT_RE = re.compile(r"[ ,&+]+")
_CLOSE_BRACKETS = ")]"
_GROUP_FILLER = frozenset({"and", "node", "nodes"})
_EMPTY_EDGE_LIST = frozenset({"none", "(none)", "no edges", "n/a", "-", "nil", "empty", "无", "(无)"})


@dataclass(frozen=True, slots=True)
class Violation:
    """One named reason why a plan is not acceptable: ``rule`` is a stable identifier (used for
    counters and tests), ``detail`` says where and what, for the agent's error observation."""

    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}" if self.detail else self.rule


@dataclass(frozen=True, slots=True)
class PlanNode:
    """A node as read: upper-cased ``label``, the sub-``query`` (whitespace collapsed; may hold
    ``{X}`` placeholders), the ``source`` name as written (None when the line had no ``(Tool)``)
    and the 1-based ``line`` it came from."""

    label: str
    query: str
    source: str | None
    line: int


@dataclass(frozen=True)
class Plan:
    """A parsed plan: ``nodes`` by label in declaration order, ``edges`` (parent, child) in reading
    order without repeats (they may name undeclared nodes: validation reports those), ``issues``
    found while reading, and the original ``text`` (the strict reward reading re-reads it)."""

    nodes: dict[str, PlanNode]
    edges: list[tuple[str, str]]
    issues: list[Violation] = field(default_factory=list)
    text: str = ""


def parse_plan(text: str) -> Plan:
    """Read a plan from the content of a call tag. Never raises; see the module docstring for the
    accepted variants and :attr:`Plan.issues` for what could not be read."""
    reader = _Reader()
    for number, raw in enumerate(text.splitlines(), start=1):
        reader.read_line(number, raw)
    return Plan(nodes=reader.nodes, edges=list(reader.edges), issues=reader.issues, text=text)


def format_plan(plan: Plan) -> str:
    """Write ``plan`` in the canonical syntax (what the prompt asks for); ``parse_plan`` reads it back
    to the same nodes and edges. Useful to turn a gold decomposition into a demonstration plan."""
    lines = ["Nodes:"]
    for node in plan.nodes.values():
        tool = f" ({node.source})" if node.source is not None else ""
        lines.append(f"{node.label}: {node.query}{tool}")
    lines.append("Edges:")
    if plan.edges:
        lines.append(" ; ".join(f"{parent} -> {child}" for parent, child in plan.edges))
    return "\n".join(lines)


def _quote(text: str) -> str:
    return repr(text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "...")


class _Reader:
    """Line-by-line state: which section we are in, and what has been read so far."""

    def __init__(self) -> None:
        self.section: str | None = None  # None (no header seen yet), "nodes" or "edges"
        self.nodes: dict[str, PlanNode] = {}
        self.edges: dict[tuple[str, str], None] = {}  # insertion-ordered set
        self.issues: list[Violation] = []
        self._edges_capped = False

    def read_line(self, number: int, raw: str) -> None:
        line = _clean(raw)
        if not line or line.startswith("```"):
            return
        header = _HEADER_RE.match(line)
        if header:
            self.section = "edges" if header.group(1).lower().startswith("edge") else "nodes"
            line = line[header.end():].strip()
            if not line:
                return
            line = _strip_bullets(line)
        arrowed = _ARROW_RE.sub(_ARROW, line)
        has_arrow = _ARROW in arrowed
        label = _LABEL_RE.match(line)
        if label and not (self.section == "edges" and has_arrow):
            self._read_node(number, line, label)
        elif has_arrow:
            self._read_edges(number, arrowed)
        elif line.lower() in _EMPTY_EDGE_LIST:
            return
        elif self.section == "nodes":
            self.issues.append(
                Violation("bad_node_syntax", f"line {number}: {_quote(line)} is not 'Label: query (Source)'")
            )
        elif self.section == "edges":
            self.issues.append(
                Violation("bad_edge_syntax", f"line {number}: {_quote(line)} has no 'A -> B' edge")
            )
        # Before any header, other text is the model's prose around the plan: not part of it.

    def _read_node(self, number: int, line: str, label_match: re.Match[str]) -> None:
        label = label_match.group(1).upper()
        rest = line[label_match.end():].strip().rstrip(" ;,.")
        query, source = _split_tool(rest)
        if label in self.nodes:
            first = self.nodes[label].line
            self.issues.append(
                Violation("duplicate_label", f"line {number}: label {label} already declared on line {first}")
            )
            return
        if source is None:
            self.issues.append(
                Violation("missing_source", f"line {number}: node {label} has no '(Source)' at the end")
            )
        if not query:
            self.issues.append(Violation("empty_query", f"line {number}: node {label} has an empty query"))
        self.nodes[label] = PlanNode(label=label, query=query, source=source, line=number)

    def _read_edges(self, number: int, arrowed: str) -> None:
        for statement in _statements(arrowed):
            if not statement or statement.lower() in _EMPTY_EDGE_LIST:
                continue
            groups = [_label_group(part) for part in statement.split(_ARROW)]
            if len(groups) < 2 or any(group is None for group in groups):
                self.issues.append(
                    Violation(
                        "bad_edge_syntax",
                        f"line {number}: {_quote(statement.replace(_ARROW, '->'))} is not 'A -> B'",
                    )
                )
                continue
            for parents, children in zip(groups, groups[1:]):
                for parent in parents:  # type: ignore[union-attr]
                    for child in children:  # type: ignore[union-attr]
                        self._add_edge(parent, child, number)

    def _add_edge(self, parent: str, child: str, number: int) -> None:
        edge = (parent, child)
        if edge in self.edges:
            return
        if len(self.edges) >= MAX_EDGES:
            if not self._edges_capped:
                self._edges_capped = True
                self.issues.append(
                    Violation("too_many_edges", f"line {number}: more than {MAX_EDGES} edges; the rest are ignored")
                )
            return
        self.edges[edge] = None


def _clean(raw: str) -> str:
    """Full-width punctuation to ASCII, Markdown bold removed, whitespace collapsed, bullets,
    numbering and a leading ``Node``/``Step`` word stripped."""
    line = " ".join(raw.translate(_FULL_WIDTH).replace("**", "").split())
    return _strip_bullets(line)


def _strip_bullets(line: str) -> str:
    line = line.lstrip(_BULLET_CHARS + " ")
    numbering = _NUMBERING_RE.match(line)
    if numbering:
        line = line[numbering.end():].lstrip(_BULLET_CHARS + " ")
    prefix = _PREFIX_WORD_RE.match(line)
    if prefix:
        line = line[prefix.end():]
    return line


def _split_tool(rest: str) -> tuple[str, str | None]:
    """Split ``query (Tool)`` at the last bracket pair that closes the line. The tool must be made of
    word characters (letters of any script, digits, ``_``), ``-`` and spaces; otherwise the bracket
    belongs to the query and the node has no tool."""
    if not rest or rest[-1] not in _CLOSE_BRACKETS:
        return rest, None
    opening = max(rest.rfind("("), rest.rfind("["))
    if opening < 0:
        return rest, None
    tool = rest[opening + 1 : -1].strip()
    if not tool or not _TOOL_RE.fullmatch(tool):
        return rest, None
    return rest[:opening].strip(), tool


def _statements(arrowed: str) -> list[str]:
    """Split an edge line into statements: on ``;`` always, and on ``,`` only when every
    comma-separated piece holds an arrow (``A -> B, C -> B``); otherwise commas list labels of a
    group (``A, C -> B``)."""
    statements: list[str] = []
    for part in arrowed.split(";"):
        pieces = part.split(",")
        if len(pieces) > 1 and all(_ARROW in piece for piece in pieces):
            statements.extend(piece.strip() for piece in pieces)
        else:
            statements.append(part.strip())
    return statements


def _label_group(part: str) -> list[str] | None:
    """Labels of one side of an arrow (``A``, ``A, C``, ``A & C``, ``Node A``), upper-cased; None when
    the side is empty or holds anything that is not a label."""
    tokens = [token for token in _GROUP_SPLIT_RE.split(part) if token and token.lower() not in _GROUP_FILLER]
    if not tokens or not all(_LABEL_TOKEN_RE.fullmatch(token) for token in tokens):
        return None
    return [token.upper() for token in tokens]
