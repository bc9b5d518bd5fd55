"""NL-DAG plans: read them (:func:`parse_plan`), check them (:func:`validate_plan`, or
:func:`validate_strict` for the reward's reference rules), run them on the critical path
(:func:`execute_plan`) and write the result block (:func:`format_dag_results`).

Typical use by a protocol, given the text of a call (``call_content``) and the sources it may name::

    from search_env.dag import SourceTable, execute_plan, format_dag_results, format_violations, parse_plan, validate_plan
    from search_env.sources import BM25Source

    sources = {"wiki": BM25Source([{"id": "w1", "title": "Tariffs", "text": "US tariffs on steel rose in 2024."}]),
               "papers": BM25Source([{"id": "p1", "title": "Prices", "text": "Tariffs raise consumer prices."}], name="papers")}
    call_content = "Nodes:\\nA: US tariffs 2024 (General)\\nB: tariffs and consumer prices (Academy)\\nEdges:\\nA -> B"

    plan = parse_plan(call_content)
    table = SourceTable(sources, aliases={"general": "wiki", "academy": "papers"})
    violations = validate_plan(plan, known_sources=table.names())
    if violations:
        observation = format_violations(violations)
    else:
        run = execute_plan(plan, table, k=3)
        observation = format_dag_results(run, lambda passages: "".join(f"({p.title}) {p.text}\\n" for p in passages))
"""
from search_env.dag.execute import (
    DagRun,
    InvalidPlanError,
    NodeRun,
    SourceTable,
    Substitute,
    execute_plan,
    format_dag_results,
)
from search_env.dag.parser import Plan, PlanNode, Violation, format_plan, parse_plan
from search_env.dag.validate import format_violations, validate_plan, validate_strict

__all__ = [
    "DagRun",
    "InvalidPlanError",
    "NodeRun",
    "Plan",
    "PlanNode",
    "SourceTable",
    "Substitute",
    "Violation",
    "execute_plan",
    "format_dag_results",
    "format_plan",
    "format_violations",
    "parse_plan",
    "validate_plan",
    "validate_strict",
]
