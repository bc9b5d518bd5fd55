"""The strict reading of a Reasoning-search NL-DAG plan, as its reference reward parses it.

The environment's validator reuses this in strict mode, so the reward and the environment agree on
which plans are valid. The rules (PROTOCOLS.md, reasoning-search) in brief::

    Nodes:
    A: US tariffs 2024 (News)
    B: Tariffs impact on 401k & CPI (General)
    Edges:
    A -> B ; C -> B

Node lines are ``Label: query (Tool)``; labels are single letters read upper-cased; tools are
General, News or Academy (aliases ``search``, ``新闻``, ``学术``); at most 6 nodes are kept; edges
must join declared nodes, without self-loops or cycles.

The tool list is the reference's by default (parity). An environment whose plans may name other
sources passes its own names as ``tools=`` (the ``reasoning-search`` preset's ``tools`` option), so
that a plan the environment executes is not scored ``unknown_tool``; the reference's aliases then
apply only to names that are not themselves in the list.
"""
from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

import networkx as nx

__all__ = ["StrictDag", "read_strict_dag", "STRICT_TOOLS", "STRICT_MAX_NODES"]

STRICT_TOOLS = frozenset({"general", "news", "academy"})
STRICT_MAX_NODES = 6
_TOOL_ALIASES = {"search": "general", "新闻": "news", "学术": "academy"}

_FULL_WIDTH = str.maketrans({"：": ":", "，": ";", "；": ";", "、": ";"})
_SPACES = re.compile(r"[ \t]+")
# A node line is: a letter, spaces, a colon, ≥1 character of query, then a bracketed tool at the very
# end of the line (optionally followed by spaces and one ";"); brackets need not pair up. One regex for
# all that backtracks quadratically on long junk lines, so it is matched in two linear steps: the tool
# suffix is unique (tool characters exclude brackets), and the label is the first letter-and-colon
# before it (if a later one fits, the first does too: its query absorbs the difference).
_TOOL_SUFFIX = re.compile(r"[(\[（]([A-Za-z0-9_\- \u4e00-\u9fff]+)[)\]）] *;?$")
_LABEL = re.compile(r"([A-Za-z]) *:")
_EDGE = re.compile(r"([A-Za-z]) *(?:->|→) *([A-Za-z])")


@dataclass
class StrictDag:
    """A plan read strictly.

    ``nodes`` maps label → (query, tool) with the tool lower-cased and aliased; ``edges`` lists every
    edge read (including bad ones); ``violations`` names each broken rule: ``no_nodes``,
    ``unknown_tool:<tool>``, ``unknown_node:<X>``, ``self_loop:<X>``, ``cycle``;
    ``dropped`` holds the labels of node lines ignored because 6 nodes were already held (the
    reference drops them silently: they make the plan invalid only if an edge names them).
    """

    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """True iff no rule is broken."""
        return not self.violations


def _read_edges(part_source: str, edges: list[tuple[str, str]]) -> None:
    for part in part_source.split(";"):
        match = _EDGE.search(part)
        if match:
            edges.append((match.group(1).upper(), match.group(2).upper()))


def _read_node_line(line: str, tools: Collection[str]) -> tuple[str, str, str] | None:
    suffix = _TOOL_SUFFIX.search(line)
    if suffix is None:
        return None
    head = line[: suffix.start()]
    label = _LABEL.search(head)
    if label is None or label.end() == len(head):
        return None
    tool = suffix.group(1).strip().lower()
    return label.group(1).upper(), head[label.end() :].strip(), tool if tool in tools else _TOOL_ALIASES.get(tool, tool)


def read_strict_dag(
    search_content: str, *, max_nodes: int = STRICT_MAX_NODES, tools: Collection[str] = STRICT_TOOLS
) -> StrictDag:
    """Read a plan (the content of the ``<search>`` block) by the strict rules and validate it.

    ``tools`` are the tool names a node may use (compared lower-cased; default: the reference's).
    Never raises on malformed text: anything unreadable is skipped and shows up as a violation
    (``no_nodes`` when nothing was read).
    """
    if isinstance(tools, str):
        raise TypeError(f"tools must be a collection of tool names, not the str {tools!r}")
    tools = frozenset(" ".join(str(tool).split()).lower() for tool in tools)
    dag = StrictDag()
    text = _SPACES.sub(" ", search_content.strip().translate(_FULL_WIDTH))
    in_edges = False
    for raw_line in text.split("\n"):
        line = raw_line.strip()
        if not line:
            continue
        if in_edges:
            _read_edges(line, dag.edges)
        elif line.lower().startswith("edges"):
            in_edges = True
            _read_edges(line[5:], dag.edges)
        else:
            node = _read_node_line(line, tools)
            if node is None:
                continue
            label, query, tool = node
            if len(dag.nodes) >= max_nodes:
                dag.dropped.append(label)
            else:
                dag.nodes[label] = (query, tool)
    _validate(dag, tools)
    return dag


def _validate(dag: StrictDag, tools: frozenset[str]) -> None:
    if not dag.nodes:
        dag.violations.append("no_nodes")
    for _, tool in dag.nodes.values():
        if tool not in tools and f"unknown_tool:{tool}" not in dag.violations:
            dag.violations.append(f"unknown_tool:{tool}")
    graph = nx.DiGraph()
    graph.add_nodes_from(dag.nodes)
    for source, target in dag.edges:
        unknown = [label for label in (source, target) if label not in dag.nodes]
        for label in unknown:
            if f"unknown_node:{label}" not in dag.violations:
                dag.violations.append(f"unknown_node:{label}")
        if source == target:
            if f"self_loop:{source}" not in dag.violations:
                dag.violations.append(f"self_loop:{source}")
        elif not unknown:
            graph.add_edge(source, target)
    if not nx.is_directed_acyclic_graph(graph):
        dag.violations.append("cycle")
