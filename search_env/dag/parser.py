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

Reading costs time linear in the text, whatever the text: every step is one pass over a line
(string methods, or regular expressions without overlapping quantifiers, so no catastrophic
backtracking), an edge group adds each distinct edge once (``A A A -> B B B`` is one edge, not nine
lookups), and reading stops at :data:`MAX_NODES` nodes, at :data:`MAX_EDGES` edges and at
:data:`MAX_ISSUES` problems: past any of them the plan cannot be executed whatever follows, so the rest
is not read. A model can emit 100 KB inside one call tag; ``python -m benchmarks.dag_parse_adversarial``
measures such plans.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["MAX_EDGES", "MAX_ISSUES", "MAX_NODES", "Plan", "PlanNode", "Violation", "format_plan", "parse_plan"]

MAX_NODES = 1024
"""Far above any node limit a plan is validated against (8 by default): past this many nodes the reader
reports ``too_many_nodes`` and stops, so that thousands of node lines cost no more than a thousand."""

MAX_EDGES = 1024
"""Edge groups (``A, B, C -> D, E``) expand to a product; past this many distinct edges the reader
reports ``too_many_edges`` and stops, so a hostile block can blow up neither memory nor time."""

MAX_ISSUES = 100
"""A plan with this many problems is not a plan: the reader stops there and reports
``too_many_issues``, so that the issue list (and the error observation built from it) stays bounded."""

_DETAIL_CHARS = 80  # quoted input in an issue is cut to this length: issues become observations

# Full-width punctuation models emit, mapped to the ASCII the grammar uses. Arrows are handled
# separately (only on edge text) so that node queries keep their own characters.
_FULL_WIDTH_CHARS = {"：": ":", "；": ";", "，": ",", "、": ",", "（": "(", "）": ")", "【": "[", "】": "]", "\u3000": " "}
_FULL_WIDTH = str.maketrans(_FULL_WIDTH_CHARS)
_FULL_WIDTH_RE = re.compile("[" + "".join(_FULL_WIDTH_CHARS) + "]")
_ARROW = "→"
# The lookbehind makes a run of dashes cost one scan, not one scan per position (linear time).
_ARROW_RE = re.compile(r"(?<![-=—－])[-=—－]+[>＞]|[⟶⇒➔➜➝⇾]")
# A character every match of _ARROW_RE holds: searching for it first is several times cheaper on the
# lines (node lines, prose) that hold no arrow.
_ARROW_HINT_RE = re.compile("[>＞⟶⇒➔➜➝⇾]")
_BULLET_CHARS = "-*•·+>#–—"
_NUMBERING_RE = re.compile(r"(?:\d{1,3}[.)]|\(\d{1,3}\))(?: |$)")
_PREFIX_WORD_RE = re.compile(r"(?:node|step) (?=[a-z][0-9]* ?[:.)])", re.IGNORECASE)
_HEADER_RE = re.compile(r"(nodes?|edges?)(?: ?:|$)", re.IGNORECASE)
_LABEL_RE = re.compile(r"([A-Za-z][0-9]{0,3}) ?(?::|[.)](?= |$))")
_TOOL_RE = re.compile(r"[\w\- ]+")
# One side of an arrow: labels and the filler words "and"/"node(s)", separated by spaces, ",", "&"
# or "+". Token and separator characters are disjoint, so matching never backtracks across tokens.
_GROUP_RE = re.compile(r"[ ,&+]*(?:(?:[A-Za-z][0-9]{0,3}|[Aa][Nn][Dd]|[Nn][Oo][Dd][Ee][Ss]?)(?:[ ,&+]+|$))+")
_GROUP_TOKEN_RE = re.compile(r"[A-Z0-9]+")
_CHAIN_RE = re.compile(r"[A-Za-z][0-9]{0,3}(?: ?" + _ARROW + r" ?[A-Za-z][0-9]{0,3})+")
_GROUP_FILLER = frozenset({"AND", "NODE", "NODES"})
_CLOSE_BRACKETS = ")]"
# First characters that _strip_bullets can act on besides decimal digits: a bullet, a space, "(" of
# numbering, or "Node"/"Step" ("ſ" folds to "s" under IGNORECASE).
_STRIPPABLE_START = frozenset(_BULLET_CHARS + " (nNsSſ")
_HEADER_START = frozenset("nNeE")
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
    # Full-width punctuation and Markdown bold are rewritten once for the whole text: neither can
    # span a line break, so this equals doing it line by line, at a fraction of the cost.
    normalised = text.translate(_FULL_WIDTH) if _FULL_WIDTH_RE.search(text) else text
    if "**" in normalised:
        normalised = normalised.replace("**", "")
    reader.read(normalised.splitlines())
    return Plan(nodes=reader.nodes, edges=reader.edges, issues=reader.issues, text=text)


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


class _StopReading(Exception):
    """Raised inside the reader when :data:`MAX_ISSUES` is reached; :meth:`_Reader.read` catches it."""


_UNSEEN = object()


class _Reader:
    """Line-by-line state: which section we are in, and what has been read so far.

    Hostile text repeats itself, so memos keep repetition cheap without changing the result:
    a line read before in the same section that added no node and no issue can only re-add known
    edges (or change the section the same way), so it is skipped; so is a statement read before
    without an issue (``a -> b, c -> d;`` repeated on one line); and each distinct side of an arrow,
    and each distinct pair of adjacent sides, is worked out once.
    """

    def __init__(self) -> None:
        self.section: str | None = None  # None (no header seen yet), "nodes" or "edges"
        self.nodes: dict[str, PlanNode] = {}
        self.edges: list[tuple[str, str]] = []
        self.issues: list[Violation] = []
        self._children: dict[str, set[str]] = {}  # parent -> children: the edges as a lookup
        self._groups: dict[str, tuple[str, ...] | None] = {}  # side of an arrow -> its labels
        self._connected: set[tuple[str, str]] = set()  # adjacent sides already connected
        self._harmless_statements: set[str] = set()  # statements read without an issue: re-reading adds nothing

    def read(self, lines: list[str]) -> None:
        """Read every line, in order, until the end or :data:`MAX_ISSUES`."""
        harmless: dict[tuple[str | None, str], str | None] = {}  # (section, line) -> section after it
        try:
            for number, raw in enumerate(lines, start=1):
                key = (self.section, raw)
                section = harmless.get(key, _UNSEEN)
                if section is not _UNSEEN:
                    self.section = section  # type: ignore[assignment]
                    continue
                issues, nodes = len(self.issues), len(self.nodes)
                self.read_line(number, raw)
                if len(self.issues) == issues and len(self.nodes) == nodes:
                    harmless[key] = self.section
        except _StopReading:
            pass

    def read_line(self, number: int, raw: str) -> None:
        # Whitespace is collapsed first: a blank line (the commonest filler) costs one split.
        line = " ".join(raw.split())
        if not line:
            return
        if line[0] in _STRIPPABLE_START or line[0].isdecimal():
            line = _strip_bullets(line)
        if not line or line.startswith("```"):
            return
        if line[0] in _HEADER_START:
            header = _HEADER_RE.match(line)
            if header:
                self.section = "edges" if header.group(1).lower().startswith("edge") else "nodes"
                line = line[header.end():].strip()
                if not line:
                    return
                line = _strip_bullets(line)
        arrowed = _ARROW_RE.sub(_ARROW, line) if _ARROW_HINT_RE.search(line) is not None else line
        has_arrow = _ARROW in arrowed
        label = _LABEL_RE.match(line)
        if label and not (self.section == "edges" and has_arrow):
            self._read_node(number, line, label)
        elif has_arrow:
            self._read_edges(number, arrowed)
        elif self.section is None or line.lower() in _EMPTY_EDGE_LIST:
            return  # before any header, other text is the model's prose around the plan
        elif self.section == "nodes":
            self._issue("bad_node_syntax", f"line {number}: {_quote(line)} is not 'Label: query (Source)'", number)
        else:
            self._issue("bad_edge_syntax", f"line {number}: {_quote(line)} has no 'A -> B' edge", number)

    def _issue(self, rule: str, detail: str, number: int) -> None:
        self.issues.append(Violation(rule, detail))
        if len(self.issues) >= MAX_ISSUES:
            self._stop("too_many_issues", f"line {number}: {MAX_ISSUES} problems; the rest of the plan is not read")

    def _stop(self, rule: str, detail: str) -> None:
        """Report why reading ends here, and end it."""
        self.issues.append(Violation(rule, detail))
        raise _StopReading

    def _read_node(self, number: int, line: str, label_match: re.Match[str]) -> None:
        label = label_match.group(1).upper()
        rest = line[label_match.end():].strip().rstrip(" ;,.")
        query, source = _split_tool(rest)
        if label in self.nodes:
            first = self.nodes[label].line
            self._issue("duplicate_label", f"line {number}: label {label} already declared on line {first}", number)
            return
        if len(self.nodes) >= MAX_NODES:
            self._stop("too_many_nodes", f"line {number}: more than {MAX_NODES} nodes; the rest of the plan is not read")
        if source is None:
            self._issue("missing_source", f"line {number}: node {label} has no '(Source)' at the end", number)
        if not query:
            self._issue("empty_query", f"line {number}: node {label} has an empty query", number)
        self.nodes[label] = PlanNode(label, query, source, number)  # positional: a third cheaper per node

    def _read_edges(self, number: int, arrowed: str) -> None:
        issues = self.issues
        for statement in _statements(arrowed):
            if not statement or statement in self._harmless_statements:
                continue
            before = len(issues)
            self._read_statement(number, statement)
            if len(issues) == before:
                self._harmless_statements.add(statement)

    def _read_statement(self, number: int, statement: str) -> None:
        """One non-empty statement: a chain ``A -> B -> C``, groups ``A, C -> B``, or an empty-list marker."""
        if _CHAIN_RE.fullmatch(statement):  # the common case, "A -> B -> C": one label a side
            labels = _GROUP_TOKEN_RE.findall(statement.upper())
            for parent, child in zip(labels, labels[1:]):
                self._add_edge(parent, child, number)
            return
        if statement.lower() in _EMPTY_EDGE_LIST:
            return
        sides = statement.split(_ARROW)
        groups = [self._label_group(side) for side in sides]
        if len(groups) < 2 or None in groups:
            shown = _quote(statement.replace(_ARROW, "->"))
            self._issue("bad_edge_syntax", f"line {number}: {shown} is not 'A -> B'", number)
            return
        for index in range(len(sides) - 1):
            pair = (sides[index], sides[index + 1])
            if pair not in self._connected:
                self._connect(groups[index], groups[index + 1], number)  # type: ignore[arg-type]
                self._connected.add(pair)

    def _label_group(self, side: str) -> tuple[str, ...] | None:
        """Distinct labels of one side of an arrow (``A``, ``A, C``, ``A & C``, ``Node A``), upper-cased,
        in order of first mention; None when the side is empty or holds anything that is not a label."""
        if side in self._groups:
            return self._groups[side]
        labels = None
        if _GROUP_RE.fullmatch(side):
            tokens = [token for token in _GROUP_TOKEN_RE.findall(side.upper()) if token not in _GROUP_FILLER]
            labels = tuple(dict.fromkeys(tokens)) or None
        self._groups[side] = labels
        return labels

    def _connect(self, parents: tuple[str, ...], children: tuple[str, ...], number: int) -> None:
        """Add each new ``parent -> child`` edge in reading order. A parent whose children already
        include the whole group is passed over by one set comparison, so re-stating known edges
        costs set work, not a lookup per pair."""
        wanted = frozenset(children)
        for parent in parents:
            known = self._children.get(parent)
            if known is not None and len(known) >= len(wanted) and known >= wanted:
                continue
            for child in children:
                self._add_edge(parent, child, number)

    def _add_edge(self, parent: str, child: str, number: int) -> None:
        """Record ``parent -> child`` unless known; past :data:`MAX_EDGES` edges, stop reading."""
        known = self._children.get(parent)
        if known is None:
            known = self._children[parent] = set()
        elif child in known:
            return
        if len(self.edges) >= MAX_EDGES:
            self._stop("too_many_edges", f"line {number}: more than {MAX_EDGES} edges; the rest of the plan is not read")
        known.add(child)
        self.edges.append((parent, child))


def _strip_bullets(line: str) -> str:
    """Bullets, numbering and a leading ``Node``/``Step`` word removed."""
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
