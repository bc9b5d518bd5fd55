"""NL-DAG plans: read them (:func:`parse_plan`), check them (:func:`validate_plan`, or
:func:`validate_strict` for the reward's reference rules), run them on the critical path
(:func:`execute_plan`) and write the result block (:func:`format_dag_results`).

Typical use by a protocol::

    plan = parse_plan(call_content)
    table = SourceTable(sources, aliases={"general": "wiki", "academy": "papers"})
    violations = validate_plan(plan, known_sources=table.names())
    if violations:
        observation = format_violations(violations)
    else:
        run = execute_plan(plan, table, k=3)
        observation = format_dag_results(run, doc_formatter)
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
