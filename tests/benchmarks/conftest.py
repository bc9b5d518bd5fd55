"""Fixtures shared by the benchmark tests: the evaluation harness's small real-format dataset, which the
retrieval replay tests use as well."""
from tests.benchmarks.test_evaluate_harness import real_format

__all__ = ["real_format"]
