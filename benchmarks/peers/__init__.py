"""Stand-ins for other projects' servers, run beside ours by the benchmarks for side-by-side ratios."""
