"""Pre-built data (:func:`agents.training.data.build_data`) for :func:`agents.training.build.build_trainer`:
a trainer built on it has the environments of one built from its config, data made for another config is
refused, and the held-out world is the one the straightforward construction makes."""
from __future__ import annotations

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")

from agents.training.build import build_trainer  # noqa: E402
from agents.training.data import RunData, build_data, data_settings, split_data, synthetic_data  # noqa: E402
from tests.agents.training.tiny import small_config  # noqa: E402

#: The demo's kind of data, small: two-token stems, chain questions, the light stemmer, a held-out world of new words.
DEMO_KIND = {"data.world_size": 40, "data.world_scale": 2, "data.world_chain_only": True, "data.world_stem_tokens": 2,
             "data.bm25_stemmer": "light", "data.eval_world_seed": 7, "data.eval_new_words": True,
             "eval.questions": 3, "eval.by_hops": True}


def _searches(sources, questions) -> list:
    queries = [q.question for q in questions] + [node.query for q in questions for node in q.decomposition]
    return [(name, source.search(queries, 3)) for name, source in sorted(sources.items())]


def test_a_trainer_on_prebuilt_data_has_the_environments_of_one_built_from_its_config(tmp_path) -> None:
    config = small_config("grpo", tmp_path / "own", DEMO_KIND)
    own = build_trainer(config)
    data = build_data(config)
    assert data.settings == data_settings(config) and data.held_out is not None
    shared = [build_trainer(config.updated({"run.output_dir": str(tmp_path / name)}), data=data) for name in ("a", "b")]
    try:
        for trainer in shared:
            assert trainer.env.examples == own.env.examples and trainer.env.num_envs == own.env.num_envs
            assert trainer.eval_env.examples == own.eval_env.examples and trainer.eval_questions == own.eval_questions
            for env, own_env in ((trainer.env, own.env), (trainer.eval_env, own.eval_env)):
                assert _searches(env.searcher.sources, env.examples) == _searches(own_env.searcher.sources, own_env.examples)
            # the data's own sources, not copies: built once for every trainer
            assert all(trainer.env.searcher.sources[name] is source for name, source in data.train[1].items())
            assert all(trainer.eval_env.searcher.sources[name] is source for name, source in data.held_out[1].items())
    finally:
        own.close_environments()
        for trainer in shared:
            trainer.close()
        data.close()


def test_data_made_for_another_config_is_refused_in_one_line(tmp_path) -> None:
    config = small_config("grpo", tmp_path, DEMO_KIND)
    data = build_data(config)
    with pytest.raises(ValueError, match=r"^the pre-built data was made for another config: data.world_seed is 0 there, 5 here$"):
        build_trainer(config.updated({"data.world_seed": 5}), data=data)
    with pytest.raises(ValueError, match=r"^the pre-built data was made for another config: eval.questions is 3 there, 4 here, "
                                         r"eval.by_hops is True there, False here$"):
        data.check(config.updated({"eval.questions": 4, "eval.by_hops": False}))
    # other groups are not the data's business; a run without evaluation leaves the held-out questions out
    data.check(config.updated({"algo": "ppo", "rollout.questions_per_step": 1, "run.seed": 9}))
    train, held_out = data.for_config(config.updated({"eval.questions": 0}))
    assert train is data.train and held_out is None
    trainer = build_trainer(config.updated({"eval.questions": 0}), data=data)
    assert trainer.eval_env is None and trainer.env.examples == data.train[0]
    with pytest.raises(ValueError, match=r"^the pre-built data was made for another config: eval.questions is 0 there, 3 here$"):
        build_data(config.updated({"eval.questions": 0})).check(config)


def test_the_held_out_world_is_the_one_made_beside_a_fresh_copy_of_the_trained_world(tmp_path) -> None:
    """split_data excludes the trained world's words from the world it has built already; the
    straightforward construction makes that world again (without questions) to read them."""
    config = small_config("grpo", tmp_path, DEMO_KIND)
    (train, train_sources), (held_out, held_out_sources) = split_data(config)
    size = 4 * 3 * 2  # eval.by_hops: 4 x eval.questions x world_max_hops
    expected, expected_sources = synthetic_data(config.data, 7, size, held_out_from=0)
    assert held_out == expected and _searches(held_out_sources, held_out) == _searches(expected_sources, expected)
    assert train == synthetic_data(config.data, 0, 40)[0]


def test_close_closes_each_source_once() -> None:
    closed = []

    class Source:
        def close(self) -> None:
            closed.append(self)

    shared, other = Source(), Source()
    RunData(([], {"wiki": shared, "all": shared}), ([], {"wiki": shared, "news": other}), {}).close()
    assert closed == [shared, other]
