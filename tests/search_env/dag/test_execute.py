"""Critical-path execution: overlap, ordering, batching, substitution, errors in place.

Sources here sleep for a fixed latency or block until released. Tests assert the order of the
recorded start and end times and the number of calls, never a wall-clock bound (the test machine is
shared); how close runs come to the critical-path bound is measured by benchmarks/dag_critical_path.py.
"""
from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest

import search_env.dag.execute as execute_module
from search_env.dag.execute import DagRun, InvalidPlanError, NodeRun, SourceTable, execute_plan, format_dag_results
from search_env.dag.parser import Plan, PlanNode, parse_plan
from search_env.sources.base import Passage, Source, SourceError


class SleepySource(Source):
    """Answers every query with five passages titled ``<name>:<query>:<rank>`` after ``latency`` s."""

    def __init__(self, name: str, latency: float = 0.0, error: Exception | None = None, results: object = None,
                 meet: threading.Barrier | None = None) -> None:
        self.name = name
        self.latency = latency
        self.meet = meet  # wait here for the other sources sharing the barrier: proves calls overlap
        self.error = error
        self.results = results
        self.calls: list[list[str]] = []
        self.threads: list[str] = []
        self._lock = threading.Lock()

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        with self._lock:
            self.calls.append(list(queries))
            self.threads.append(threading.current_thread().name)
        if self.meet is not None:
            self.meet.wait(30)
        time.sleep(self.latency)
        if self.error is not None:
            raise self.error
        if self.results is not None:
            return self.results  # type: ignore[return-value]
        return [[Passage(f"{self.name}/{q}/{r}", f"{self.name}:{q}:{r}", f"text {r}") for r in range(5)] for q in queries]


class BlockedSource(Source):
    """Answers nothing until ``release`` is set (30 s at most, so a failing test cannot hang)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = threading.Event()
        self.finished = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        self.release.wait(30)
        self.finished = True
        return [[] for _ in queries]


def labels(run: DagRun) -> list[str]:
    return [node.label for node in run.nodes]


DIAMOND = "Nodes:\nA: a (General)\nB: b (News)\nC: c (Academy)\nD: d (General)\nEdges:\nA -> B ; A -> C ; B -> D ; C -> D"


def test_diamond_overlaps_its_middle_nodes() -> None:
    middle = threading.Barrier(2)  # B's and C's calls each wait for the other: they must overlap
    sources = {"general": SleepySource("general", 0.01)} | {name: SleepySource(name, 0.01, meet=middle) for name in ("news", "academy")}
    run = execute_plan(parse_plan(DIAMOND), sources)
    # Three levels, not four: B and C run together between A and D.
    a, b, c, d = (run.node(label) for label in "ABCD")
    assert b.start >= a.end and c.start >= a.end
    assert d.start >= max(b.end, c.end)
    assert b.start < c.end and c.start < b.end  # B and C ran at the same time
    assert all(node.ok and len(node.passages) == 3 for node in run.nodes)
    assert labels(run)[0] == "A" and labels(run)[-1] == "D"
    assert run.calls == 4


def test_chain_runs_one_after_another() -> None:
    source = SleepySource("wiki", 0.05)
    run = execute_plan(parse_plan("A: a (wiki)\nB: b (wiki)\nC: c (wiki)\nA -> B -> C"), {"wiki": source})
    assert labels(run) == ["A", "B", "C"]
    a, b, c = run.nodes
    assert a.end <= b.start and b.end <= c.start <= c.end <= run.wall_s
    assert source.calls == [["a"], ["b"], ["c"]] and run.calls == 3


def test_a_node_starts_when_its_own_parents_are_done_not_its_level() -> None:
    slow = BlockedSource("slow")

    class Fast(SleepySource):
        def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
            if "c" in queries:
                slow.release.set()  # B ends only once C has been searched
            return super().search(queries, k)

    run = execute_plan(parse_plan("A: a (fast)\nB: b (slow)\nC: c (fast)\nA -> C"), {"fast": Fast("fast"), "slow": slow})
    a, b, c = run.node("A"), run.node("B"), run.node("C")
    assert c.start >= a.end
    assert c.start <= b.end  # C started while B was held; level by level would have waited for B first
    assert labels(run) == ["A", "B", "C"], "listed in plan order although C finished before B"


def test_nodes_ready_together_on_one_source_are_one_call() -> None:
    wiki = SleepySource("wiki", 0.02)
    # "General" is an alias of wiki and names are case-insensitive: A and B hit the same source.
    run = execute_plan(
        parse_plan("A: a (General)\nB: b (WIKI)\nC: c (general)\nD: d (wiki)\nA -> C ; B -> D"),
        {"Wiki": wiki},
        aliases={"general": "wiki"},
    )
    assert wiki.calls == [["a", "b"], ["c", "d"]]
    assert run.calls == 2
    assert run.node("A").batch == run.node("B").batch != run.node("C").batch == run.node("D").batch


def test_queued_batch_absorbs_nodes_that_become_ready_for_its_source() -> None:
    news, wiki = SleepySource("news", 0.05), SleepySource("wiki", 0.05)
    run = execute_plan(parse_plan("A: a (news)\nB: b (wiki)\nC: c (wiki)\nA -> C"), {"news": news, "wiki": wiki}, max_concurrency=1)
    assert news.calls == [["a"]]
    assert wiki.calls == [["b", "c"]]
    assert run.calls == 2


def test_max_concurrency_one_serialises_calls() -> None:
    sources = {name: SleepySource(name, 0.05) for name in ("general", "news", "academy")}
    run = execute_plan(parse_plan(DIAMOND), sources, max_concurrency=1)
    ordered = sorted(run.nodes, key=lambda node: node.start)
    assert all(first.end <= second.start for first, second in zip(ordered, ordered[1:]))
    assert len({node.batch for node in run.nodes}) == run.calls == 4  # one call per node, none merged


def test_results_are_in_plan_order_generation_then_label_whatever_the_latencies() -> None:
    # Generations: {B, Y} are roots, {A, Z} need a root, {C} needs Z. Timing must not matter.
    text = "Y: y (s1)\nB: b (s2)\nA: a (s3)\nZ: z (s1)\nC: c (s2)\nEdges:\nY -> A ; B -> Z ; Z -> C"
    rng = random.Random(7)
    orders, blocks = set(), set()
    for _ in range(12):
        sources = {name: SleepySource(name, rng.uniform(0.0, 0.02)) for name in ("s1", "s2", "s3")}
        run = execute_plan(parse_plan(text), sources)
        orders.add(tuple(labels(run)))
        blocks.add(format_dag_results(run, lambda passages: "".join(p.title + "\n" for p in passages)))
    assert orders == {("B", "Y", "A", "Z", "C")}
    assert len(blocks) == 1


def test_top_passage_title_fills_ancestor_placeholders() -> None:
    wiki = SleepySource("wiki")
    text = "A: who wrote X (wiki)\nB: birthplace of {a} (wiki)\nC: {A} and {B} and {C} and {Q} (wiki)\nA -> B -> C"
    run = execute_plan(parse_plan(text), {"wiki": wiki})
    assert run.node("B").query == "birthplace of wiki:who wrote X:0"
    assert run.node("B").substitutions == {"A": "wiki:who wrote X:0"}
    # Grandparent A and parent B are filled; the node itself and an undeclared label are left as written.
    assert run.node("C").query == "wiki:who wrote X:0 and wiki:birthplace of wiki:who wrote X:0:0 and {C} and {Q}"


def test_callable_substitution_and_no_substitution() -> None:
    wiki = SleepySource("wiki")
    seen: list[NodeRun] = []

    def extract(parent: NodeRun) -> str:
        seen.append(parent)
        return f"answer-{parent.label}-{len(parent.passages)}"

    plan = parse_plan("A: a (wiki)\nB: b {A} (wiki)\nC: c {A} (wiki)\nA -> B ; A -> C")
    run = execute_plan(plan, {"wiki": wiki}, k=2, substitute=extract)
    assert run.node("B").query == "b answer-A-2" and run.node("C").query == "c answer-A-2"
    assert [parent.label for parent in seen] == ["A"]  # computed once per ancestor
    kept = execute_plan(plan, {"wiki": wiki}, substitute=False)
    assert kept.node("B").query == "b {A}" and kept.node("B").substitutions == {}


def test_failed_source_is_reported_in_place_and_children_still_run() -> None:
    broken = SleepySource("news", error=SourceError("server down"))
    wiki = SleepySource("wiki")
    run = execute_plan(
        parse_plan("A: a (news)\nB: b (wiki)\nC: after {A} from {B} (wiki)\nA -> C ; B -> C"), {"news": broken, "wiki": wiki}
    )
    a, c = run.node("A"), run.node("C")
    assert a.error == "SourceError: server down" and a.passages == () and not a.ok
    assert c.ok and c.query == "after from wiki:b:0"  # the failed parent's placeholder is removed
    assert c.substitutions == {"A": None, "B": "wiki:b:0"}
    assert wiki.calls[-1] == ["after from wiki:b:0"]


def test_node_whose_query_empties_is_skipped_without_a_call() -> None:
    broken = SleepySource("news", error=RuntimeError("boom"))
    wiki = SleepySource("wiki")
    run = execute_plan(parse_plan("A: a (news)\nB: {A} (wiki)\nC: c (wiki)\nA -> B -> C"), {"news": broken, "wiki": wiki})
    b = run.node("B")
    assert b.batch is None and b.error is not None and "empty" in b.error
    assert wiki.calls == [["c"]]
    assert run.node("C").ok


def test_unknown_and_missing_sources_are_errors_in_place() -> None:
    wiki = SleepySource("wiki")
    plan = Plan(
        nodes={
            "A": PlanNode("A", "a", "radio", 1),
            "B": PlanNode("B", "b", None, 2),
            "C": PlanNode("C", "c", "wiki", 3),
        },
        edges=[("A", "C"), ("B", "C")],
    )
    run = execute_plan(plan, {"wiki": wiki})
    assert run.node("A").error is not None and "unknown source 'radio'" in run.node("A").error  # type: ignore[operator]
    assert "wiki" in run.node("A").error  # type: ignore[operator]
    assert run.node("B").error == "the node names no source"
    assert run.node("A").batch is None and run.node("B").batch is None
    assert run.node("C").ok and wiki.calls == [["c"]]


def test_timeout_is_reported_and_does_not_hold_the_children() -> None:
    slow = BlockedSource("slow")
    sources = {"slow": slow, "fast": SleepySource("fast", 0.01)}
    try:
        run = execute_plan(parse_plan("A: a (slow)\nB: b (fast)\nA -> B"), sources, timeout_s=0.1)
        assert not slow.finished  # the run ended while A's call was still blocked: it did not wait for it
    finally:
        slow.release.set()
    a, b = run.node("A"), run.node("B")
    assert a.error == "timed out after 0.1 s"
    assert a.end >= 0.1 - 1e-9  # not given up before its limit
    assert b.ok and b.start >= a.end


def test_wrong_result_count_and_k_truncation() -> None:
    short = SleepySource("short", results=[])
    run = execute_plan(parse_plan("A: a (short)\nB: b (wiki)"), {"short": short, "wiki": SleepySource("wiki")}, k=2)
    assert run.node("A").error == "source 'short' returned 0 result lists for 1 queries"
    assert [p.title for p in run.node("B").passages] == ["wiki:b:0", "wiki:b:1"]


class ReturnsAsIs(Source):
    """A buggy plug-in that returns ``results`` whatever it is asked."""

    def __init__(self, results: object) -> None:
        self.name, self.results = "bad", results

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return self.results  # type: ignore[return-value]


@pytest.mark.parametrize("results", [None, [None], [["not a passage"]], "a"])
def test_results_that_are_not_lists_of_passages_are_a_node_error(results: object) -> None:
    run = execute_plan(parse_plan("A: a (bad)\nB: b (wiki)"), {"bad": ReturnsAsIs(results), "wiki": SleepySource("wiki")})
    assert run.node("A").error.startswith("source 'bad' returned") and run.node("A").passages == ()
    assert run.node("B").ok


def test_queries_longer_than_max_query_chars_are_cut_after_substitution() -> None:
    wiki = SleepySource("wiki")
    text = "A: short (wiki)\nB: {A} " + "x" * 30 + " (wiki)\nA -> B"
    run = execute_plan(parse_plan(text), {"wiki": wiki}, max_query_chars=20)
    assert not run.node("A").query_cut and run.node("A").query == "short"
    assert run.node("B").query_cut and run.node("B").query == ("wiki:short:0 " + "x" * 30)[:20]
    assert wiki.calls[-1] == [run.node("B").query]
    with pytest.raises(ValueError):
        execute_plan(parse_plan(text), {"wiki": wiki}, max_query_chars=0)


@pytest.mark.parametrize(
    ("edges", "message"),
    [("A -> B -> A", "cycle"), ("A -> A", "self-loop"), ("A -> Z", "undeclared")],
)
def test_unschedulable_graphs_raise(edges: str, message: str) -> None:
    with pytest.raises(InvalidPlanError, match=message):
        execute_plan(parse_plan(f"A: a (wiki)\nB: b (wiki)\n{edges}"), {"wiki": SleepySource("wiki")})


def test_bad_arguments_raise() -> None:
    plan, sources = parse_plan("A: a (wiki)"), {"wiki": SleepySource("wiki")}
    with pytest.raises(ValueError, match="k must"):
        execute_plan(plan, sources, k=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        execute_plan(plan, sources, max_concurrency=0)
    with pytest.raises(ValueError, match="'web', which is not a source"):
        SourceTable(sources, {"general": "web"})


def test_source_table_resolves_names_and_aliases() -> None:
    wiki = SleepySource("wiki")
    table = SourceTable({"Wiki": wiki}, {"General": "WIKI"})
    assert table.names() == {"wiki", "general"}
    assert table.resolve(" general ") == ("wiki", wiki)
    assert table.resolve("news") is None
    run = execute_plan(parse_plan("A: a (General)"), table)
    assert run.node("A").ok
    with pytest.raises(ValueError, match="SourceTable"):
        execute_plan(parse_plan("A: a (General)"), table, aliases={"x": "wiki"})


def test_calls_share_one_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[ThreadPoolExecutor] = []

    class CountingPool(ThreadPoolExecutor):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            created.append(self)

    monkeypatch.setattr(execute_module, "ThreadPoolExecutor", CountingPool)
    monkeypatch.setattr(execute_module, "_shared_pool", None)
    wiki = SleepySource("wiki")
    try:
        for _ in range(5):
            execute_plan(parse_plan("A: a (wiki)\nB: b (wiki)\nA -> B"), {"wiki": wiki})
        assert len(created) == 1
        assert all(name.startswith("dag-source") for name in wiki.threads)
    finally:
        for pool in created:
            pool.shutdown(wait=True)


def test_a_given_executor_is_used() -> None:
    submitted: list[object] = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
            submitted.append(fn)
            return super().submit(fn, *args, **kwargs)

    with Recording(max_workers=2) as pool:
        run = execute_plan(parse_plan("A: a (wiki)\nB: b (news)"), {"wiki": SleepySource("wiki"), "news": SleepySource("news")}, executor=pool)
    assert len(submitted) == run.calls == 2


def test_format_dag_results_sections() -> None:
    sources = {"wiki": SleepySource("wiki"), "news": SleepySource("news", error=SourceError("down")), "empty": SleepySource("empty", results=[[]])}
    run = execute_plan(parse_plan("A: a (Wiki)\nB: b (News)\nC: c (empty)\nA -> B -> C"), sources, k=2)

    def docs(passages: Sequence[Passage]) -> str:
        return "".join(f"Doc {i}(Title: {p.title}) {p.text}\n" for i, p in enumerate(passages, 1))

    assert format_dag_results(run, docs) == (
        "A (Wiki): a\nDoc 1(Title: wiki:a:0) text 0\nDoc 2(Title: wiki:a:1) text 1\n\n"
        "B (News): b\nError: SourceError: down\n\n"
        "C (empty): c\nNo results."
    )


def test_node_record_is_json_ready() -> None:
    run = execute_plan(parse_plan("A: a (wiki)\nB: b {A} (wiki)\nA -> B"), {"wiki": SleepySource("wiki")}, k=1)
    record = json.loads(json.dumps([node.to_dict() for node in run.nodes]))
    assert record[1]["label"] == "B" and record[1]["passage_ids"] == ["wiki/b wiki:a:0/0"]
    assert record[1]["substitutions"] == {"A": "wiki:a:0"}
    assert record[0]["end"] <= record[1]["start"]
