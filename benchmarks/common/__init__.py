"""What the benchmark commands share and are not commands themselves: the machine a figure was measured
on, the result files every command writes, the performance report's pieces, the warm-started policies
kept between runs, where the peers' virtualenvs live, the collapse rule of a training curve, and the
algorithm benchmark's run records. The commands are the modules of :mod:`benchmarks` itself
(``python -m benchmarks`` lists them)."""
