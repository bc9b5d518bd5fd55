"""The strict NL-DAG reading (PROTOCOLS.md, reasoning-search), rule by rule."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards.dag import read_strict_dag

PROMPT_EXAMPLE = (
    "Nodes:\nA: US tariffs 2024 (News)\nB: Tariffs impact on 401k & CPI (General)\n"
    "C: new US tariff list commodities 2024 (News)\nEdges:\nA -> B ; C -> B"
)


def test_prompt_example_plan():
    dag = read_strict_dag(PROMPT_EXAMPLE)
    assert dag.nodes == {
        "A": ("US tariffs 2024", "news"),
        "B": ("Tariffs impact on 401k & CPI", "general"),
        "C": ("new US tariff list commodities 2024", "news"),
    }
    assert dag.edges == [("A", "B"), ("C", "B")]
    assert dag.violations == [] and dag.valid


def test_lower_case_labels_and_aliases():
    dag = read_strict_dag("Nodes:\na: q1 (search)\nb: q2 (ACADEMY)\nEdges:\na -> b")
    assert dag.nodes == {"A": ("q1", "general"), "B": ("q2", "academy")}
    assert dag.edges == [("A", "B")] and dag.valid


def test_full_width_punctuation_and_chinese_tools():
    dag = read_strict_dag("节点：\nA：天气 预报（新闻）\nB： 论文 综述 (学术)；\nEdges： A → B；B→C")
    assert dag.nodes == {"A": ("天气 预报", "news"), "B": ("论文 综述", "academy")}
    assert dag.edges == [("A", "B"), ("B", "C")]
    assert dag.violations == ["unknown_node:C"]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("A: q [News)", ("A", "q", "news")),  # brackets need not pair
        ("A: q (News) ;", ("A", "q", "news")),  # trailing spaces and one ';'
        ("- A: q (News)", ("A", "q", "news")),  # leading text ignored
        ("1. B: q (General)", ("B", "q", "general")),
        ("Node C: q (Academy)", ("C", "q", "academy")),
        ("A :\tq\t\t( News )", ("A", "q", "news")),  # spaces before the colon, tabs, padded tool
        ("A: q (x) (News)", ("A", "q (x)", "news")),  # the tool is the bracket at the end
        ("A: (News)", ("A", "", "news")),  # a single space is a query
        ("Nodes: A: q (News)", ("S", "A: q", "news")),  # the first letter-and-colon is "s:"
        ("A: q (web_search-2)", ("A", "q", "web_search-2")),
    ],
)
def test_node_line_forms(line, expected):
    label, query, tool = expected
    dag = read_strict_dag(line)
    assert dag.nodes == {label: (query, tool)}


@pytest.mark.parametrize("line", ["A: q", "A:(News)", "A: q (News) extra", "A: q (News!)", "A: q ()", "AB q (News)", "(News)"])
def test_lines_that_are_not_nodes(line):
    dag = read_strict_dag(line)
    assert dag.nodes == {} and dag.violations == ["no_nodes"] and not dag.valid


@pytest.mark.parametrize(
    "edges, expected",
    [
        ("A -> B -> A", [("A", "B")]),  # one edge per ';' part: the first
        ("Node A -> Node B", [("A", "N")]),
        ("a->b;b→c", [("A", "B"), ("B", "C")]),
        ("A  ->   B ; ; junk ; C -> A", [("A", "B"), ("C", "A")]),
        ("A - > B", []),
    ],
)
def test_edge_parts(edges, expected):
    dag = read_strict_dag(f"A: x (News)\nB: y (News)\nC: z (News)\nEdges: {edges}")
    assert dag.edges == expected


def test_edges_header_any_case_and_rest_of_line():
    assert read_strict_dag("A: x (News)\nB: y (News)\nEDGES A->B").edges == [("A", "B")]
    assert read_strict_dag("A: x (News)\nB: y (News)\n  edges:\nA->B\n\nB->A").edges == [("A", "B"), ("B", "A")]


def test_node_lines_after_edges_are_edges_only():
    dag = read_strict_dag("A: x (News)\nEdges:\nB: y (News)\nA -> B")
    assert list(dag.nodes) == ["A"]
    assert dag.edges == [("A", "B")]
    assert dag.violations == ["unknown_node:B"]


def test_unknown_tool():
    dag = read_strict_dag("A: x (General Search)\nB: y (Web)\nC: z (Web)")
    assert dag.violations == ["unknown_tool:general search", "unknown_tool:web"]


def test_self_loop_and_cycle():
    assert read_strict_dag("A: x (News)\nEdges: A -> A").violations == ["self_loop:A"]
    dag = read_strict_dag("A: x (News)\nB: y (News)\nC: z (News)\nEdges: A -> B; B -> C; C -> A")
    assert dag.violations == ["cycle"] and not dag.valid
    assert read_strict_dag("A: x (News)\nB: y (News)\nEdges: A -> B; A -> B").valid  # duplicate edge is fine


def test_unknown_node_reported_once():
    dag = read_strict_dag("A: x (News)\nEdges: A -> Z; Z -> A; Q -> Q")
    assert dag.violations == ["unknown_node:Z", "unknown_node:Q", "self_loop:Q"]


@pytest.mark.parametrize("content", ["", "   ", "Nodes:\nEdges:", "Edges: A -> B", "just some words"])
def test_no_nodes(content):
    assert "no_nodes" in read_strict_dag(content).violations


def test_repeated_label_replaces_before_the_cap():
    dag = read_strict_dag("A: q1 (News)\nA: q2 (General)")
    assert dag.nodes == {"A": ("q2", "general")} and dag.valid


def test_node_cap_drops_later_lines():
    lines = [f"{label}: q{label} (News)" for label in "ABCDEFG"]
    dag = read_strict_dag("\n".join(lines))
    assert list(dag.nodes) == list("ABCDEF")
    assert dag.dropped == ["G"]
    assert dag.valid  # the reference drops the 7th silently
    dag = read_strict_dag("\n".join(lines + ["A: changed (General)", "Edges: F -> G"]))
    assert dag.nodes["A"] == ("qA", "news")  # a repeated label at the cap is dropped too
    assert dag.dropped == ["G", "A"]
    assert dag.violations == ["unknown_node:G"]


def test_blank_lines_and_surrounding_whitespace():
    dag = read_strict_dag("\n\n  Nodes:  \n\n   A:   x    y   (News)   \n\n Edges: \n\n")
    assert dag.nodes == {"A": ("x y", "news")} and dag.valid


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(list("ABCab:：;；，、()[]（）-→> \t\n新闻") + ["->", "Edges:", "(News)", "(general)", "学术", "Nodes:\n"]),
        max_size=60,
    ).map("".join)
    | st.text(max_size=120)
)
def test_never_raises_and_is_consistent(content):
    dag = read_strict_dag(content)
    assert dag.valid == (not dag.violations)
    assert 0 <= len(dag.nodes) <= 6
    for label, (query, tool) in dag.nodes.items():
        assert len(label) == 1 and "A" <= label <= "Z"
        assert tool == tool.strip().lower()
    for source, target in dag.edges:
        assert "A" <= source <= "Z" and "A" <= target <= "Z"
    if dag.valid:
        assert dag.nodes and all(source in dag.nodes and target in dag.nodes and source != target for source, target in dag.edges)


def test_a_tools_list_replaces_the_reference_tools_and_aliases_yield_to_it():
    plan = "Nodes:\nA: q1 (Wiki)\nB: q2 (my  notes)\nC: q3 (search)\nEdges:\nA -> B"
    assert read_strict_dag(plan).violations == ["unknown_tool:wiki", "unknown_tool:my notes"], "default: the reference's tools"
    dag = read_strict_dag(plan, tools=["wiki", "My Notes", "general"])
    assert dag.valid and dag.nodes["C"] == ("q3", "general"), "search is still read as general when only general is listed"
    assert read_strict_dag(plan, tools=["wiki", "my notes", "search"]).nodes["C"] == ("q3", "search")
    assert read_strict_dag(plan, tools=["wiki"]).violations == ["unknown_tool:my notes", "unknown_tool:general"]
    with pytest.raises(TypeError, match="collection"):
        read_strict_dag(plan, tools="wiki")
