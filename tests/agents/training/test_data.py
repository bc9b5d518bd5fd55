"""A run's synthetic data (:mod:`agents.training.data`): large worlds of chain questions with two-token
names, BM25 over lightly stemmed words, held-out worlds of new words; and the compact Search-R1 dialect
the demo trains with."""
import pytest

from agents.scripted.agents import OracleAgent, run_episode
from agents.training.config import DataConfig
from agents.training.data import light_stem, synthetic_data
from search_env import SearchQAEnv, get_protocol
from search_env.synthetic import generate_world
from tests.conftest import write_real_files


COMPACT_SEARCH_R1 = get_protocol("search-r1-compact")


def demo_world(seed, size, *, scale=50, held_out_from=None):
    """The demo's kind of world (``agents/configs/demo.yaml``'s data settings) at ``scale``."""
    data = DataConfig(world_scale=scale, world_chain_only=True, world_max_hops=2, world_stem_tokens=2, bm25_stemmer="light")
    return synthetic_data(data, seed, size, held_out_from=held_out_from)


def test_compact_protocol_keeps_search_r1s_tags_and_reward():
    base = get_protocol("search-r1")
    assert get_protocol("search-r1-compact") is COMPACT_SEARCH_R1
    for attr in ("call_open", "call_close", "answer_open", "answer_close", "result_open", "result_close", "reward", "stop_strings"):
        assert getattr(COMPACT_SEARCH_R1, attr) == getattr(base, attr)
    assert COMPACT_SEARCH_R1.plain_prompt("Where was Ann born") == "Question: Where was Ann born?\n"


def test_compact_episodes_are_shorter_and_still_solved():
    world = generate_world(seed=2, n_questions=60)
    lengths = {}
    for protocol in ("search-r1", COMPACT_SEARCH_R1):
        env = SearchQAEnv(protocol=protocol, world_seed=2, world_size=60)
        trajs = [run_episode(env, OracleAgent(), options={"index": i}) for i, ex in enumerate(world.questions)
                 if ex.metadata["type"] == "chain"]
        assert all(t.reward == 1.0 for t in trajs)
        lengths[env.protocol.name] = sum(len(t.token_ids) for t in trajs) / len(trajs)
        if protocol is COMPACT_SEARCH_R1:
            text = env.codec.decode(trajs[0].token_ids)
            assert "Doc 1" not in text and "Title:" not in text and "<information>" in text
    assert lengths["search-r1-compact"] < 0.6 * lengths["search-r1"]


def test_demo_world_has_chain_questions_and_scaled_entities():
    small, small_sources = demo_world(3, 200, scale=1)
    big, sources = demo_world(3, 200, scale=4)
    assert {ex.metadata["type"] for ex in big} == {"chain"}
    assert {ex.metadata["hops"] for ex in big} == {1, 2}
    assert set(sources) == {"wiki", "news", "papers", "all"}
    # Every entity has one passage per source that states its facts: 4x the entities, 4x the passages.
    assert len(sources["all"]) == 4 * len(small_sources["all"])
    assert len(sources["all"]) == sum(len(sources[name]) for name in ("wiki", "news", "papers"))
    with pytest.raises(ValueError, match=r"^data.world_scale must be >= 1, got 0$"):
        demo_world(3, 10, scale=0)
    with pytest.raises(ValueError, match=r"^unknown data.bm25_stemmer 'porter'; known: light"):
        DataConfig(bm25_stemmer="porter")


def test_without_chain_only_a_world_has_other_questions_and_max_hops_bounds_them():
    examples, sources = synthetic_data(DataConfig(), 3, 200)
    assert {ex.metadata["type"] for ex in examples} > {"chain"}
    one_hop, _ = synthetic_data(DataConfig(world_max_hops=1), 3, 100)
    assert {ex.metadata["hops"] for ex in one_hop} == {1}


def test_light_stem_matches_question_verbs_to_passage_verbs():
    assert [light_stem(w) for w in ("studied", "study", "works", "work", "publishes", "published", "cities")] == [
        "study", "study", "work", "work", "publish", "publish", "city"]
    assert light_stem("is") == "is" and light_stem("Kouze") == "Kouze"


def test_demo_world_retrieves_every_gold_passage_in_the_compact_top_k():
    """With stemming, the oracle's sub-questions find the passage that answers them among the compact
    protocol's top-2 results, for every relation of the world, and nearly always first (without it, BM25
    ties a person's passages and about a quarter of a demo world's lookups put the answer second or third;
    with it, only a few "In which country is <city>?" lookups rank another passage naming the city first)."""
    examples, sources = demo_world(5, 300, scale=2)
    env = SearchQAEnv(protocol=COMPACT_SEARCH_R1, dataset=examples, sources=sources)
    relations = set()
    first = []
    for i, ex in enumerate(examples):
        traj = run_episode(env, OracleAgent(), options={"index": i})
        for call, gold, relation in zip(traj.tool_calls, ex.gold_passage_ids, ex.metadata["relations"]):
            assert gold in call.passage_ids and len(call.passage_ids) == 2, (relation, call.content)
            first.append(call.passage_ids[0] == gold)
            relations.add(relation)
    assert len(relations) == 16
    assert sum(first) >= 0.95 * len(first)


def test_a_held_out_demo_world_uses_none_of_the_training_worlds_words():
    from search_env.synthetic.names import invented_words

    def words(examples):
        return {w for ex in examples for w in ex.question.replace("?", "").split() if w[:1].isupper()}

    train, _ = demo_world(3, 400, scale=4)
    held, _ = demo_world(4, 400, scale=4, held_out_from=3)
    shared, _ = demo_world(4, 400, scale=4)
    frame = {"In", "What", "Which", "Who", "Where", "When", "How", "University", "Institute", "Journal", "Studies",
             "Review", "Letters", "Annals", "Corp", "Labs", "Works", "Group", "Systems", "Holdings"}
    assert (words(shared) & words(train)) - frame  # without it, two-token stems repeat across worlds
    assert not (words(held) & words(train)) - frame
    assert invented_words("Zrolxo Systems", "company") == {"Zrolxo"}


def test_dataset_files_are_read_before_the_corpus_is_indexed(tmp_path, monkeypatch):
    """A bad dataset fails before any index is built (on a full Wikipedia corpus that is minutes)."""
    import search_env.sources.bm25 as bm25
    from agents.training.config import TrainConfig
    from agents.training.data import split_data

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "1", "title": "A", "text": "a passage"}\n')
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    built = []
    monkeypatch.setattr(bm25.BM25Source, "__init__", lambda self, *a, **k: built.append(a))
    config = TrainConfig("grpo").updated({"data.dataset": str(tmp_path / "bad.jsonl"), "data.corpus": str(corpus)})
    with pytest.raises(ValueError):
        split_data(config)
    assert built == []


def _real_files(tmp_path):
    return write_real_files(tmp_path, [
        {"id": "q1", "question": "Which company did Bob Smith found?", "golden_answers": ["zarbo."]},  # normalised, in it
        {"id": "q2", "question": "What is the capital city of Norland?", "golden_answers": ["Old Vessa", "Vessa"]},  # the second
        {"id": "q3", "question": "Which is the capital city of Norland?", "golden_answers": ["Oslo"]},  # found passage, no gold
        {"id": "q4", "question": "Who founded Zarbo?", "golden_answers": ["Smith"]},  # a word of a longer name counts
        {"id": "q5", "question": "Which city is the capital?", "golden_answers": ["Norland"]}])


def test_answerable_keeps_the_questions_whose_gold_their_own_search_returns(tmp_path):
    from agents.training.data import answerable
    from search_env.data.loaders import load_dataset
    from search_env.sources.bm25 import BM25Source

    questions, corpus = _real_files(tmp_path)
    source = BM25Source(corpus)
    examples = load_dataset(str(questions))
    assert [e.id for e in answerable(examples, source, 1)] == ["q1", "q2", "q4", "q5"]
    assert [e.id for e in answerable(examples[2:3] + examples[4:], source, 1)] == ["q5"]
    with pytest.raises(ValueError, match=r"^no training question has its gold answer in the first 1 passages"):
        answerable(examples[2:3], source, 1)


def test_answerable_at_filters_training_questions_and_never_the_held_out_ones(tmp_path):
    from agents.training.config import TrainConfig
    from agents.training.data import split_data

    questions, corpus = _real_files(tmp_path)
    settings = {"data.dataset": str(questions), "data.corpus": str(corpus), "eval.questions": 2,
                "run.output_dir": str(tmp_path / "run")}
    (train, _), (held_out, _) = split_data(TrainConfig("grpo").updated(settings))
    assert [e.id for e in train] == ["q1", "q2", "q3"] and [e.id for e in held_out] == ["q4", "q5"]
    (train, _), (held_out, _) = split_data(TrainConfig("grpo").updated({**settings, "data.answerable_at": 1}))
    assert [e.id for e in train] == ["q1", "q2"] and [e.id for e in held_out] == ["q4", "q5"]
    with pytest.raises(ValueError, match=r"^data.answerable_at is for a real data.dataset"):
        TrainConfig("grpo").updated({"data.answerable_at": 1})
