"""Training: the run's config groups, the trainer and its callbacks, training backends, the supervised
warm start, evaluation, logs and checkpoints.

The top room of ``agents``: it uses policies, rollouts, scripted demonstrations and learners; only the
command ``python -m agents.train`` sits above it.
"""
