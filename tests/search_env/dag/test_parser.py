"""The NL-DAG reader: the reference syntax, the variants models emit, what it reports, fuzzing."""
from __future__ import annotations

import random
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from search_env.dag import parser as parser_module
from search_env.dag import validate as validate_module
from search_env.dag.parser import MAX_EDGES, MAX_ISSUES, MAX_NODES, Plan, format_plan, parse_plan
from search_env.dag.validate import validate_plan

REFERENCE = (
    "Nodes:\nA: US tariffs 2024 (News)\nB: Tariffs impact on 401k & CPI (General)\n"
    "C: new US tariff list commodities 2024 (News)\nEdges:\nA -> B ; C -> B"
)


def nodes_of(plan: Plan) -> dict[str, tuple[str, str | None]]:
    return {label: (node.query, node.source) for label, node in plan.nodes.items()}


def rules(plan: Plan) -> list[str]:
    return [issue.rule for issue in plan.issues]


def test_reference_example() -> None:
    plan = parse_plan(REFERENCE)
    assert nodes_of(plan) == {
        "A": ("US tariffs 2024", "News"),
        "B": ("Tariffs impact on 401k & CPI", "General"),
        "C": ("new US tariff list commodities 2024", "News"),
    }
    assert plan.edges == [("A", "B"), ("C", "B")]
    assert plan.issues == []
    assert [node.line for node in plan.nodes.values()] == [2, 3, 4]
    assert plan.text == REFERENCE


TWO_NODES = {"A": ("who wrote Hamlet", "General"), "B": ("birthplace of {A}", "News")}


@pytest.mark.parametrize(
    "text",
    [
        "Nodes:\nA: who wrote Hamlet (General)\nB: birthplace of {A} (News)\nEdges:\nA -> B",
        # full-width punctuation and arrow
        "Nodes：\nA： who wrote Hamlet （General）\nB：birthplace of {A}（News）\nEdges：\nA → B；",
        # no section headers at all
        "A: who wrote Hamlet (General)\nB: birthplace of {A} (News)\nA -> B",
        # extra whitespace everywhere
        "  Nodes :  \n\n   A  :   who   wrote\tHamlet   (  General )  \n B:birthplace of {A}(News)\n\n Edges:\n  A   ->   B  ",
        # lower-case labels in nodes and edges
        "Nodes:\na: who wrote Hamlet (General)\nb: birthplace of {A} (News)\nEdges:\na -> b",
        # bracket styles, trailing semicolons
        "Nodes:\nA: who wrote Hamlet [General];\nB: birthplace of {A} 【News】\nEdges:\nA -> B;",
        # bullets, numbering, Markdown headers, 'Node' word
        "**Nodes:**\n- Node A: who wrote Hamlet (General)\n* 2. B: birthplace of {A} (News)\n### Edges\n- Node A -> Node B",
        "Nodes:\n1. A: who wrote Hamlet (General)\n(2) B: birthplace of {A} (News)\nEdges:\n1. A -> B",
        # content on the header lines, arrow spellings
        "Nodes: A: who wrote Hamlet (General)\nB: birthplace of {A} (News)\nEdges: A => B",
        "Nodes:\nA: who wrote Hamlet (General)\nB: birthplace of {A} (News)\nEdges:\nA --> B\nEdges: none",
        "Nodes:\nA. who wrote Hamlet (General)\nB) birthplace of {A} (News)\nEdges:\nA ⟶ B",
        # prose before the plan and a code fence are ignored
        "Here is my plan.\n```\nNodes:\nA: who wrote Hamlet (General)\nB: birthplace of {A} (News)\nEdges:\nA->B\n```",
    ],
)
def test_variants_read_the_same_plan(text: str) -> None:
    plan = parse_plan(text)
    assert nodes_of(plan) == TWO_NODES
    assert plan.edges == [("A", "B")]
    assert plan.issues == []


@pytest.mark.parametrize(
    ("edges_text", "expected"),
    [
        ("A -> B -> C", [("A", "B"), ("B", "C")]),
        ("A -> B ; B -> C", [("A", "B"), ("B", "C")]),
        ("A -> C, B -> C", [("A", "C"), ("B", "C")]),
        ("A, B -> C", [("A", "C"), ("B", "C")]),
        ("A & B -> C", [("A", "C"), ("B", "C")]),
        ("A and B -> C", [("A", "C"), ("B", "C")]),
        ("A -> B, C", [("A", "B"), ("A", "C")]),
        ("A、B → C", [("A", "C"), ("B", "C")]),
        ("A -> B\nA -> B\nB -> C", [("A", "B"), ("B", "C")]),
        ("a->b->c", [("A", "B"), ("B", "C")]),
    ],
)
def test_edge_forms(edges_text: str, expected: list[tuple[str, str]]) -> None:
    plan = parse_plan(f"Nodes:\nA: x (News)\nB: y (News)\nC: z (News)\nEdges:\n{edges_text}")
    assert plan.edges == expected
    assert plan.issues == []


def test_query_keeps_its_own_brackets_colons_and_arrows() -> None:
    plan = parse_plan("Nodes:\nA: effect of (x) on y: a -> b (Academy)\nB1: CJK 美国关税 2024 (新闻)\nEdges:\nA -> B1")
    assert nodes_of(plan) == {"A": ("effect of (x) on y: a -> b", "Academy"), "B1": ("CJK 美国关税 2024", "新闻")}
    assert plan.edges == [("A", "B1")]


def test_unreadable_lines_are_reported_with_line_numbers() -> None:
    text = "Nodes:\nA: first (News)\nthis is not a node\nB: no tool here\nC:  (News)\nA: again (General)\nEdges:\nA -> ; Q ; B -> C (because)"
    plan = parse_plan(text)
    assert rules(plan) == [
        "bad_node_syntax",
        "missing_source",
        "empty_query",
        "duplicate_label",
        "bad_edge_syntax",
        "bad_edge_syntax",
        "bad_edge_syntax",
    ]
    assert "line 3" in plan.issues[0].detail
    assert "line 6" in plan.issues[3].detail and "line 2" in plan.issues[3].detail
    # The first declaration wins; nodes with problems are kept so edges to them are not "unknown".
    assert nodes_of(plan) == {"A": ("first", "News"), "B": ("no tool here", None), "C": ("", "News")}
    assert plan.edges == []


def test_prose_outside_sections_is_not_an_issue() -> None:
    plan = parse_plan("I will search twice.\nA: x (News)\nThat is all.")
    assert nodes_of(plan) == {"A": ("x", "News")}
    assert plan.issues == []


def test_edges_to_undeclared_nodes_are_kept_for_validation() -> None:
    plan = parse_plan("A: x (News)\nEdges:\nA -> Z")
    assert plan.edges == [("A", "Z")]


def test_edge_explosion_is_capped() -> None:
    left = ",".join(f"A{i}" for i in range(100))
    right = ",".join(f"B{i}" for i in range(100))
    plan = parse_plan(f"Edges:\n{left} -> {right}")
    assert len(plan.edges) == MAX_EDGES
    assert rules(plan) == ["too_many_edges"]


def test_reading_stops_at_the_edge_limit() -> None:
    labels = [f"{chr(65 + i % 26)}{i // 26}" for i in range(MAX_EDGES + 11)]
    chain = "".join(f"{parent} -> {child}\n" for parent, child in zip(labels, labels[1:]))
    plan = parse_plan("Edges:\n" + chain + "Nodes:\nZ: late (News)\nnot a node")
    assert plan.edges == list(zip(labels, labels[1:]))[:MAX_EDGES]
    assert rules(plan) == ["too_many_edges"]
    assert f"line {MAX_EDGES + 2}" in plan.issues[0].detail  # the header is line 1
    assert plan.nodes == {}  # nothing after the limit was read


def test_reading_stops_at_the_node_limit() -> None:
    labels = [f"{chr(65 + i % 26)}{i // 26}" for i in range(MAX_NODES + 5)]
    plan = parse_plan("Nodes:\n" + "".join(f"{label}: q (News)\n" for label in labels) + "Edges:\nA0 -> B0")
    assert list(plan.nodes) == labels[:MAX_NODES]
    assert rules(plan) == ["too_many_nodes"]
    assert f"line {MAX_NODES + 2}" in plan.issues[0].detail
    assert plan.edges == []
    violations = validate_plan(plan, known_sources=["news"])
    assert [v.rule for v in violations].count("too_many_nodes") == 1  # said once, by the reader


def test_exactly_max_nodes_is_read_whole_and_judged_by_the_validator() -> None:
    labels = [f"{chr(65 + i % 26)}{i // 26}" for i in range(MAX_NODES)]
    plan = parse_plan("Nodes:\n" + "".join(f"{label}: q (News)\n" for label in labels) + "Edges:\nA0 -> B0")
    assert len(plan.nodes) == MAX_NODES and plan.edges == [("A0", "B0")] and plan.issues == []
    violations = validate_plan(plan, known_sources=["news"])
    assert [v.rule for v in violations] == ["too_many_nodes"]


def test_issue_details_are_short_for_long_lines() -> None:
    plan = parse_plan("Nodes:\n" + "x" * 5000)
    assert rules(plan) == ["bad_node_syntax"]
    assert len(plan.issues[0].detail) < 200


def test_groups_add_each_distinct_edge_once() -> None:
    plan = parse_plan("Edges:\nA A B -> C C ; B, A -> C")
    assert plan.edges == [("A", "C"), ("B", "C")]
    assert plan.issues == []


def test_reading_stops_at_max_issues() -> None:
    plan = parse_plan("Nodes:\n" + "not a node\n" * (MAX_ISSUES + 50) + "A: late (News)")
    assert rules(plan) == ["bad_node_syntax"] * MAX_ISSUES + ["too_many_issues"]
    assert f"line {MAX_ISSUES + 1}" in plan.issues[-1].detail
    assert plan.nodes == {}  # the node after the cut was not read


def test_a_repeated_line_is_read_again_in_another_section() -> None:
    # before any header "x" is prose; in the nodes section it is a problem each time it appears
    plan = parse_plan("x\nx\nNodes:\nx\nEdges:\nA -> B\nNodes:\nx\nEdges:\nA -> B\nB -> C")
    assert [issue.detail.split(":")[0] for issue in plan.issues] == ["line 4", "line 8"]
    assert plan.edges == [("A", "B"), ("B", "C")]


def test_a_statement_repeated_on_one_line_is_read_once_unless_it_had_an_issue(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    original = parser_module._Reader._read_statement

    def counting(self, number, statement):  # type: ignore[no-untyped-def]
        read.append(statement)
        original(self, number, statement)

    monkeypatch.setattr(parser_module._Reader, "_read_statement", counting)
    plan = parse_plan("a -> b, c -> d; " * 50 + "A -> ; " * 3 + "b -> c")
    assert read == ["a → b", "c → d", "A →", "A →", "A →", "b → c"]
    assert plan.edges == [("A", "B"), ("C", "D"), ("B", "C")]
    assert [issue.rule for issue in plan.issues] == ["bad_edge_syntax"] * 3


def _count_lines_run(text: str) -> int:
    """Work done reading and validating ``text``: Python lines executed in the parser and validator
    (their loops, per-token comprehensions included). Regular expressions and string methods run in C
    on one line or one side of an arrow at a time, each linear in it."""
    files = {parser_module.__file__, validate_module.__file__}
    count = 0

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal count
        if event == "line":
            count += 1
        return local

    def calls(frame, event, arg):  # type: ignore[no-untyped-def]
        return local if frame.f_code.co_filename in files else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        validate_plan(parse_plan(text), known_sources=["news"])
    finally:
        sys.settrace(previous)
    return count


def _labels(count: int) -> list[str]:
    return [f"{chr(65 + i % 26)}{i // 26}" for i in range(count)]


def _random_edges(rng: random.Random, n: int) -> str:
    """Random but well-formed edge text: labels joined by arrows, group separators and newlines."""
    pieces = [rng.choice(["A", "B1", "c", "D22"]) + rng.choice([" -> ", "->", " & ", ", ", "\n"]) for _ in range(n // 4)]
    return "".join(pieces) + "E"


# Plans of about n characters, each of a shape that once cost, or could cost, more than linear time.
GROWING = {
    "label groups": lambda n: "Edges:\n" + "A " * (n // 4) + "-> " + "B " * (n // 4),
    "comma groups": lambda n: "A," * (n // 4) + "->" + "B," * (n // 4),
    "distinct label groups": lambda n: " ".join(_labels(n // 8)) + " -> " + " ".join(_labels(n // 8)),
    "8x8 groups per line": lambda n: "Edges:\n" + "".join(
        f"{' '.join(_labels(8 + i % 3))} -> {', '.join(_labels(16)[8 - i % 3:])}\n" for i in range(n // 60)
    ),
    "group chain": lambda n: "A B -> C D -> " * (n // 14) + "E",
    "edge chain": lambda n: "Edges:\n" + " -> ".join(_labels(n // 6)),
    "edge lines": lambda n: "Edges:\n" + "".join(f"{a} -> {b}\n" for a, b in zip(_labels(n // 10), _labels(n // 10)[1:])),
    "statements": lambda n: "a -> b, c -> d; " * (n // 16),
    "node lines": lambda n: "Nodes:\n" + "".join(f"{label}: q (Elsewhere)\n" for label in _labels(n // 16)),
    "prose lines": lambda n: "".join(f"w{i}\n" for i in range(n // 5)),
    "dash run": lambda n: "Edges:\nA " + "-" * n + " B",
    "open brackets": lambda n: "A: " + "(" * n + ")",
    "label soup": lambda n: "A1 " * (n // 3) + "-> B",
    "full-width": lambda n: "Ａ：" * (n // 2),
    "random edge text": lambda n: _random_edges(random.Random(n), n),
}


@pytest.mark.parametrize("name", sorted(GROWING))
def test_work_grows_linearly_with_the_plan(name: str) -> None:
    """Four times the text, at most about four times the work (a quadratic reader does sixteen)."""
    small, large = (_count_lines_run(GROWING[name](n)) for n in (2_000, 8_000))
    assert small > 0
    assert large <= 4.5 * small, f"{name}: {small} -> {large} lines run for 4x the text"


PLAN_ALPHABET = "AaBbCcZz019 :;,.-=>()[]{}（）【】：；，、→⟶#*\n\t"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet=PLAN_ALPHABET)))
def test_never_raises(text: str) -> None:
    plan = parse_plan(text)
    assert all(issue.rule and issue.detail for issue in plan.issues)
    assert all(node.label == node.label.upper() for node in plan.nodes.values())


WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789'?&%$美国关税", min_size=1, max_size=8)
QUERY = st.lists(WORD, min_size=1, max_size=6).map(" ".join).filter(lambda q: q[0].isalpha())
SOURCE = st.sampled_from(["General", "News", "Academy", "wiki", "web-search", "新闻", "my_papers"])


@st.composite
def well_formed_plans(draw: st.DrawFn) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str]]]:
    labels = draw(
        st.lists(st.sampled_from([chr(c) for c in range(65, 91)] + ["A1", "B2", "Q10"]), min_size=1, max_size=8, unique=True)
    )
    nodes = {label: (draw(QUERY), draw(SOURCE)) for label in labels}
    pairs = [(labels[i], labels[j]) for i in range(len(labels)) for j in range(i + 1, len(labels))]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=10)) if pairs else []
    return nodes, edges


@settings(max_examples=200, deadline=None)
@given(well_formed_plans())
def test_format_plan_round_trips(plan_parts: tuple[dict[str, tuple[str, str]], list[tuple[str, str]]]) -> None:
    nodes, edges = plan_parts
    text = "Nodes:\n" + "\n".join(f"{label}: {q} ({s})" for label, (q, s) in nodes.items())
    text += "\nEdges:\n" + " ; ".join(f"{u} -> {v}" for u, v in edges)
    plan = parse_plan(text)
    assert nodes_of(plan) == nodes
    assert plan.edges == edges
    assert plan.issues == []
    again = parse_plan(format_plan(plan))
    assert nodes_of(again) == nodes and again.edges == edges and again.issues == []


@settings(max_examples=200, deadline=None)
@given(
    well_formed_plans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from(["", "- ", "* ", "1. ", "Node "]),
    st.sampled_from([("(", ")"), ("[", "]"), ("（", "）"), ("【", "】")]),
    st.sampled_from([" -> ", "->", " → ", " => "]),
    st.sampled_from(["; ", "；", "\n", ", "]),
    st.booleans(),
)
def test_variant_writings_round_trip(
    plan_parts: tuple[dict[str, tuple[str, str]], list[tuple[str, str]]],
    lower_labels: bool,
    full_width_colon: bool,
    bullet: str,
    brackets: tuple[str, str],
    arrow: str,
    separator: str,
    headers: bool,
) -> None:
    nodes, edges = plan_parts
    colon = "：" if full_width_colon else ":"

    def name(label: str) -> str:
        return label.lower() if lower_labels else label

    lines = ["Nodes:"] if headers else []
    lines += [f"{bullet}{name(label)}{colon} {q} {brackets[0]}{s}{brackets[1]}" for label, (q, s) in nodes.items()]
    if headers:
        lines.append("Edges:")
    if edges:
        lines.append(separator.join(f"{name(u)}{arrow}{name(v)}" for u, v in edges))
    plan = parse_plan("\n".join(lines))
    assert nodes_of(plan) == nodes
    assert plan.edges == edges
    assert plan.issues == []
