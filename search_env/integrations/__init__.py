"""SearchQA-v0 inside trainers we do not write: TRL, SkyRL-gym, GEM and verl.

One module per framework, each importing its framework only when used (so ``import search_env`` never
imports a trainer), and each naming the extra that installs it:

- :mod:`search_env.integrations.trl`: a ``rollout_func`` for TRL's ``GRPOTrainer`` that plays multi-turn
  episodes with the trainer's model, and the reward function that hands TRL the environment's reward
  (extra ``trl``).
- :mod:`search_env.integrations.skyrl`: a SkyRL-gym text environment, one episode per instance (extra
  ``skyrl``).
- :mod:`search_env.integrations.gem`: a GEM environment, one episode per instance (GEM's own virtualenv,
  ``.ci/gem_venv.sh``).
- :mod:`search_env.integrations.verl`: the retrieval behind verl's tool interface and the seed rewards in
  verl's ``compute_score`` form; :mod:`search_env.integrations.verl_data` writes the parquet files verl's
  multi-turn recipes read (verl itself is needed only for the tool class).

Every adapter drives the public :class:`~search_env.SearchQAEnv`, so an episode through an adapter has
the tokens and the reward it has through ``gym.make("SearchQA-v0")``. Nothing here imports ``agents``.
"""
