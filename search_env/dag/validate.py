"""Checks that a parsed plan can be executed, naming every violation.

The environment turns the violations into the agent's error observation (and counters), so each one
says what is wrong and where, and all of them are reported at once rather than the first only.

Rules (``Violation.rule``), in the order they are reported:

=================  ====================================================================
bad_node_syntax    a line in the ``Nodes:`` section is not ``Label: query (Source)``
bad_edge_syntax    an edge statement is not ``A -> B`` (labels and arrows only)
duplicate_label    a label is declared twice (the first declaration is kept)
missing_source     a node line has no ``(Source)`` at its end
empty_query        a node's query is empty
too_many_edges     more than :data:`~search_env.dag.parser.MAX_EDGES` edges (reading stopped)
too_many_issues    :data:`~search_env.dag.parser.MAX_ISSUES` of the above (reading stopped)
too_many_nodes     more than :data:`~search_env.dag.parser.MAX_NODES` nodes (reading stopped), or more
                   than ``max_nodes``
no_nodes           the plan declares no node
unknown_source     a node names a source that is neither a source nor an alias
unknown_node       an edge names a label that no node declares
self_loop          an edge ``A -> A``
cycle              a cycle among declared nodes (one violation per strongly connected set)
=================  ====================================================================

:func:`validate_strict` is the reward's reading instead: it reproduces the reference rules exactly
(1–6 nodes, tools general/news/academy, its own tolerant-but-different line grammar) by delegating
to :func:`rewards.dag.read_strict_dag`, so the environment and the reward can never disagree.
"""
from __future__ import annotations

from collections.abc import Collection, Sequence

import networkx as nx

from search_env.dag.parser import Plan, Violation

__all__ = ["DEFAULT_MAX_NODES", "Violation", "format_violations", "normalize_source_name", "validate_plan", "validate_strict"]

DEFAULT_MAX_NODES = 8
"""The node limit the ``reasoning-search`` prompt states (its reward enforces 6: see strict mode)."""


def normalize_source_name(name: str) -> str:
    """Source names match case-insensitively and ignore extra whitespace (``" News "`` is ``news``)."""
    return " ".join(name.split()).lower()


def validate_plan(
    plan: Plan, *, known_sources: Collection[str], max_nodes: int = DEFAULT_MAX_NODES
) -> list[Violation]:
    """Every violation of ``plan``: what the parser could not read, then the structural rules.

    ``known_sources`` are the names a node may use: source names and alias names together (compared
    case-insensitively). An empty list means the plan is executable.
    """
    violations = list(plan.issues)
    if not plan.nodes:
        violations.append(Violation("no_nodes", "the plan declares no node ('A: query (Source)')"))
    elif len(plan.nodes) > max_nodes and not _reading_stopped_at_nodes(plan):  # said once is enough
        violations.append(Violation("too_many_nodes", f"{len(plan.nodes)} nodes, at most {max_nodes} allowed"))
    violations.extend(_unknown_sources(plan, known_sources))
    violations.extend(_unknown_nodes(plan))
    violations.extend(
        Violation("self_loop", f"edge {parent} -> {child}") for parent, child in plan.edges if parent == child
    )
    violations.extend(_cycles(plan))
    return violations


def _reading_stopped_at_nodes(plan: Plan) -> bool:
    """Whether the reader stopped at its node limit (its last issue says so)."""
    return bool(plan.issues) and plan.issues[-1].rule == "too_many_nodes"


def validate_strict(search_content: str) -> list[Violation]:
    """The reference (reward) reading of a plan's text: its violations, rule names as
    :mod:`rewards.dag` gives them (``"unknown_tool:x"`` becomes ``Violation("unknown_tool", "x")``).

    Pass the content of the first call tag, as the reward reads it (``Plan.text`` holds it).
    """
    from rewards.dag import read_strict_dag  # the reward module owns the strict rules

    strict = read_strict_dag(search_content)
    violations = []
    for entry in strict.violations:
        rule, _, detail = entry.partition(":")
        violations.append(Violation(rule.strip(), detail.strip()))
    return violations


def format_violations(violations: Sequence[Violation], *, limit: int = 10, line_chars: int = 200) -> str:
    """One violation per line, at most ``limit`` of them and a count of the rest, each line cut to
    ``line_chars`` characters (a violation may quote a long tool name or list many edges): the text of
    the agent's error observation stays short however broken the plan."""
    lines = [_cut(f"- {violation}", line_chars) for violation in violations[:limit]]
    if len(violations) > limit:
        lines.append(f"- ... and {len(violations) - limit} more")
    return "\n".join(lines)


def _cut(line: str, chars: int) -> str:
    return line if len(line) <= chars else line[: chars - 3] + "..."


def _unknown_sources(plan: Plan, known_sources: Collection[str]) -> list[Violation]:
    known = {normalize_source_name(name) for name in known_sources}
    listing = ", ".join(sorted(known)) or "none"
    return [
        Violation("unknown_source", f"node {node.label} uses {node.source!r}; known sources: {listing}")
        for node in plan.nodes.values()
        if node.source is not None and normalize_source_name(node.source) not in known
    ]


def _unknown_nodes(plan: Plan) -> list[Violation]:
    mentions: dict[str, list[str]] = {}
    for parent, child in plan.edges:
        for label in dict.fromkeys((parent, child)):
            if label not in plan.nodes:
                mentions.setdefault(label, []).append(f"{parent} -> {child}")
    return [
        Violation("unknown_node", f"{label} is not a declared node (in {', '.join(edges)})")
        for label, edges in mentions.items()
    ]


def _cycles(plan: Plan) -> list[Violation]:
    # Only nodes with edges can be on a cycle: the graph holds at most 2 * MAX_EDGES nodes however
    # many nodes a hostile plan declares.
    graph = nx.DiGraph()
    graph.add_edges_from(
        (parent, child)
        for parent, child in plan.edges
        if parent != child and parent in plan.nodes and child in plan.nodes
    )
    components = sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)
    return [Violation("cycle", _show_path(_cycle_in(graph, component))) for component in components]


def _cycle_in(graph: nx.DiGraph, component: list[str]) -> list[str]:
    """One cycle of a strongly connected ``component``, closed (first node repeated at the end).

    Every node of such a component has a successor inside it, so walking from its first node to the
    first successor inside until a node repeats finds a cycle in one pass (``nx.find_cycle`` on the
    subgraph does the same with a full depth-first search, several times slower).
    """
    members = set(component)
    path, position = [component[0]], {component[0]: 0}
    while True:
        step = next(node for node in graph.successors(path[-1]) if node in members)
        if step in position:
            return path[position[step]:] + [step]
        position[step] = len(path)
        path.append(step)


def _show_path(cycle: list[str], limit: int = 10) -> str:
    """``A -> B -> A``; a cycle longer than ``limit`` nodes is cut, so one violation stays one line."""
    if len(cycle) <= limit + 1:
        return " -> ".join(cycle)
    return " -> ".join(cycle[:limit]) + f" -> ... ({len(cycle) - 1} nodes)"
