"""The evaluation harness behind ``python -m benchmarks.evaluate``, one job per module.

- :mod:`~benchmarks.evaluation.metrics`: what one episode scores, and the mean of a row;
- :mod:`~benchmarks.evaluation.datasets`: dataset names and files, the questions of a run;
- :mod:`~benchmarks.evaluation.retrieval`: the sources each dataset is searched with, recorded or replayed;
- :mod:`~benchmarks.evaluation.agent_specs`: what ``--agents`` accepts and how each agent is built;
- :mod:`~benchmarks.evaluation.digests`: the corpus, model weights and agent code by their content;
- :mod:`~benchmarks.evaluation.store`: the output folder: the run's settings and its episode log (resume);
- :mod:`~benchmarks.evaluation.runner`: playing the episodes over a batch environment;
- :mod:`~benchmarks.evaluation.report`: the rows and their markdown, CSV, chart and terminal forms.
"""


class HarnessError(RuntimeError):
    """A run cannot go on (a replay that lacks a search, an output folder of another run's settings);
    the one-line message says what to do."""
