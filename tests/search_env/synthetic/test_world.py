"""The built-in synthetic world: determinism, gold data that is right by construction, difficulty."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import asdict
from itertools import combinations
from pathlib import Path

import bm25s
import networkx as nx
import pytest

from search_env.synthetic import SyntheticWorld, WorldConfig, generate_world
from tests.conftest import REPO_ROOT

REPO = REPO_ROOT
SOURCES = {"wiki", "news", "papers"}
# Words that the world uses on purpose around invented stems ("Zarbo Corp", "University of Velun").
NAME_FRAME_WORDS = {"corp", "labs", "works", "group", "systems", "holdings", "university", "of", "institute",
                    "review", "journal", "studies", "letters", "annals"}
COMMON_WORDS = set("""
a about after again air all also always an and animal another answer any are around as ask at away back
bank be because been before began being below best better between big bird black blue board boat body
book both box boy bring brown but by call came can car care carry case cat center change child children
city close cold color come common could country course cut dark day did different do does dog done door
down draw during each early earth east eat end even every eye face fact fall family far farm father fast
feet few field find fire first fish five follow food foot for form found four free friend from full game
gave get girl give go gold good got great green ground group grow had half hand hard has have he head hear
heart help her here high him his hold home horse hot house how i idea if in into is it its just keep kind
king land large last late learn leave left let letter life light like line list little live long look
love low made main make man many map mark may me mean men might mile mind miss money moon more morning most
mother move much music must my name near need never new next night no north not note now number of off
often old on once one only open or order other our out over own page paper part party people pick place
plan plant play point port power press put queen question quick rain ran read real red river road rock
room round rule run said same saw say school sea second see seem self sent set she ship short should show
side sing size sky small snow so some song soon sound south space stand star start state stay step still
stone stop story street strong study such sun sure table take talk team tell ten than that the their them
then there these they thing think this those three through time to today together too took town tree
true try turn two under unit until up us use very voice wait walk wall want war warm was watch water way
we weather well went were west what when where which while white who whole why wide will wind window
winter with without woman wood word work world would write year yes yet you young your zero zone
kid kin van zoo quiz jazz fox box tax wax key sky yak yell jury joke keen kiss
paris london berlin rome madrid tokyo beijing moscow cairo delhi sydney boston texas india china japan
france spain italy russia egypt kenya peru cuba chile korea vienna prague oslo lima kyoto zurich
john mary james david maria anna peter paul mark luke kate jack max alex sam tom
""".split())


@pytest.fixture(scope="module")
def worlds() -> dict[int, SyntheticWorld]:
    """One default-sized world per difficulty, shared by the read-only tests below."""
    return {d: generate_world(seed=0, n_questions=500, difficulty=d) for d in (1, 2, 3)}


def _digest(world: SyntheticWorld) -> str:
    payload = {"sources": world.sources, "questions": [asdict(q) for q in world.questions]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _substitute(query: str, answers: dict[str, str]) -> str:
    return re.sub(r"\{([A-Z])\}", lambda m: answers[m.group(1)], query)


def test_same_seed_gives_the_same_world() -> None:
    first, second = generate_world(seed=5, n_questions=300, difficulty=2), generate_world(5, 300, 2)
    assert first.sources == second.sources
    assert first.questions == second.questions
    assert first.split(0.7) == second.split(0.7)


def test_world_is_identical_in_other_processes() -> None:
    # A fresh interpreter with another string-hash seed must rebuild exactly this world.
    code = (
        "import hashlib, json; from dataclasses import asdict; from search_env.synthetic import generate_world; "
        "w = generate_world(seed=11, n_questions=200, difficulty=3); "
        "p = {'sources': w.sources, 'questions': [asdict(q) for q in w.questions]}; "
        "print(hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest())"
    )
    expected = _digest(generate_world(seed=11, n_questions=200, difficulty=3))
    env = {**os.environ, "PYTHONHASHSEED": str(hash("probe") % 1000 + 1)}  # not this process's hash seed
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == expected


def test_different_seeds_give_different_worlds() -> None:
    a, b = generate_world(seed=0, n_questions=100), generate_world(seed=1, n_questions=100)
    assert a.sources != b.sources
    assert {q.question for q in a.questions} != {q.question for q in b.questions}
    shared = set(a.entities) & set(b.entities)
    assert len(shared) < 0.05 * len(a.entities)


def test_entities_and_passages_do_not_depend_on_the_number_of_questions() -> None:
    assert generate_world(seed=4, n_questions=10).sources == generate_world(seed=4, n_questions=400).sources


def test_sources_hold_short_passages_with_stable_ids(worlds: dict[int, SyntheticWorld]) -> None:
    for world in worlds.values():
        assert set(world.sources) == SOURCES
        all_ids = [p["id"] for p in world.passages()]
        assert len(all_ids) == len(set(all_ids)) == sum(len(ps) for ps in world.sources.values())
        for source, passages in world.sources.items():
            assert passages, source
            for passage in passages:
                assert set(passage) == {"id", "title", "text"}
                assert re.fullmatch(rf"{source}-\d{{5}}", passage["id"])
                assert passage["title"] in world.entities
                assert passage["title"] in passage["text"]
                assert 1 <= len(re.findall(r"[.?!](\s|$)", passage["text"])) <= 3, passage
                assert world.passage(passage["id"]) is passage
    with pytest.raises(KeyError, match="wiki-99999"):
        worlds[1].passage("wiki-99999")


def test_each_kind_of_fact_is_stated_in_one_source_only(worlds: dict[int, SyntheticWorld]) -> None:
    cues = {
        "wiki": (" was born in ", " is a city in ", " is a country founded in ", "Its capital is "),
        "news": (" works for ", " is a company founded by ", " is headquartered in "),
        "papers": (" studied at ", " publishes in ", " is a university in ", " is a journal published by "),
    }
    for world in worlds.values():
        for source, passages in world.sources.items():
            text = "\n".join(p["text"] for p in passages)
            for cue_source, source_cues in cues.items():
                for cue in source_cues:
                    assert (cue in text) == (cue_source == source), (source, cue)


def test_questions_have_ids_types_and_the_configured_mix(worlds: dict[int, SyntheticWorld]) -> None:
    for difficulty, world in worlds.items():
        questions = world.questions
        assert len(questions) == 500
        assert len({q.id for q in questions}) == 500
        assert len({q.question for q in questions}) == 500
        kinds = Counter(q.metadata["type"] for q in questions)
        assert kinds == {"chain": 300, "comparison": 100, "yes_no": 100}
        for q in questions:
            assert q.metadata["seed"] == 0 and q.metadata["difficulty"] == difficulty
            assert q.question.endswith("?") and q.question[0].isupper()
            assert len(q.golden_answers) == 1


def test_gold_passages_exist_and_state_each_lookup_answer(worlds: dict[int, SyntheticWorld]) -> None:
    for world in worlds.values():
        for q in world.questions:
            lookups = [node for node in q.decomposition if node.source is not None]
            assert len(q.gold_passage_ids) == len(lookups) == q.metadata["hops"]
            for node, passage_id in zip(lookups, q.gold_passage_ids):
                passage = world.passage(passage_id)
                assert passage_id.startswith(node.source + "-")
                assert re.search(rf"\b{re.escape(node.answer)}\b", passage["text"]), (q.question, node, passage)
            answer = q.golden_answers[0]
            last_passage = world.passage(q.gold_passage_ids[-1])
            if q.metadata["type"] == "chain":
                assert answer in last_passage["text"]
            elif q.metadata["type"] == "comparison":
                assert answer in {world.passage(pid)["title"] for pid in q.gold_passage_ids}
            else:
                assert answer in {"yes", "no"}


def test_decompositions_are_dags_whose_answers_chain(worlds: dict[int, SyntheticWorld]) -> None:
    for world in worlds.values():
        for q in world.questions:
            labels = [node.label for node in q.decomposition]
            assert labels == [chr(ord("A") + i) for i in range(len(labels))]
            graph = nx.DiGraph()
            graph.add_nodes_from(labels)
            answers: dict[str, str] = {}
            for node in q.decomposition:
                assert set(node.parents) <= set(answers), "parents must come before their children"
                graph.add_edges_from((parent, node.label) for parent in node.parents)
                for parent in node.parents:
                    assert "{" + parent + "}" in node.query
                resolved = _substitute(node.query, answers)
                assert "{" not in resolved
                for parent in node.parents:
                    assert answers[parent] in resolved
                answers[node.label] = node.answer
            assert nx.is_directed_acyclic_graph(graph)
            sinks = [label for label in labels if graph.out_degree(label) == 0]
            assert sinks == [labels[-1]]
            assert q.decomposition[-1].answer == q.golden_answers[0]


def test_each_hop_looks_up_the_previous_answer(worlds: dict[int, SyntheticWorld]) -> None:
    # In a chain, hop i+1 is about the entity that hop i returned: its gold passage has that title; and a
    # chain never comes back to an entity it has visited ("the capital of the country containing X" = X).
    for world in worlds.values():
        for q in world.questions:
            if q.metadata["type"] == "comparison":
                continue
            lookups = [node for node in q.decomposition if node.source is not None]
            titles = [world.passage(pid)["title"] for pid in q.gold_passage_ids]
            assert titles[1:] == [node.answer for node in lookups[:-1]]
            assert len(set(titles)) == len(titles) and lookups[-1].answer not in titles


def test_hop_counts_match_the_decomposition(worlds: dict[int, SyntheticWorld]) -> None:
    for difficulty, world in worlds.items():
        max_hops = world.config.max_hops
        assert max_hops == difficulty + 1
        for q in world.questions:
            hops, kind, nodes = q.metadata["hops"], q.metadata["type"], q.decomposition
            assert len(q.metadata["relations"]) == hops
            if kind == "chain":
                assert len(nodes) == hops and all(node.source for node in nodes)
            elif kind == "yes_no":
                assert len(nodes) == hops + 1 and nodes[-1].source is None
            else:
                assert hops == 2 and [node.parents for node in nodes] == [[], [], ["A", "B"]]
        chain_hops = Counter(q.metadata["hops"] for q in world.questions if q.metadata["type"] == "chain")
        assert sorted(chain_hops) == list(range(1, max_hops + 1))
        assert max(chain_hops.values()) - min(chain_hops.values()) <= 1


def test_yes_no_answers_agree_with_the_looked_up_value(worlds: dict[int, SyntheticWorld]) -> None:
    for world in worlds.values():
        answers = Counter()
        for q in world.questions:
            if q.metadata["type"] != "yes_no":
                continue
            check, last_lookup = q.decomposition[-1], q.decomposition[-2]
            candidate = re.fullmatch(r"Is \{[A-Z]\} the same as (.+)\?", check.query).group(1)
            assert candidate in q.question
            assert q.golden_answers == ["yes" if candidate == last_lookup.answer else "no"]
            answers[q.golden_answers[0]] += 1
        assert min(answers["yes"], answers["no"]) > 0.3 * sum(answers.values())


def test_comparison_answers_follow_the_looked_up_values(worlds: dict[int, SyntheticWorld]) -> None:
    for world in worlds.values():
        for q in world.questions:
            if q.metadata["type"] != "comparison":
                continue
            (a, b) = (int(node.answer) for node in q.decomposition[:2])
            x, y = (world.passage(pid)["title"] for pid in q.gold_passage_ids)
            assert a != b and q.question.index(x) < q.question.index(y)
            wins_x = a > b if "larger" in q.question else a < b
            assert q.golden_answers == [x if wins_x else y]


def test_names_are_invented_words(worlds: dict[int, SyntheticWorld]) -> None:
    words = {w.lower() for world in worlds.values() for name in world.entities for w in name.split()}
    invented = words - NAME_FRAME_WORDS
    assert len(invented) > 500
    assert not invented & COMMON_WORDS


def test_names_are_rare_in_real_wikipedia_text(shared_data: Path, worlds: dict[int, SyntheticWorld]) -> None:
    vocabulary: set[str] = set()
    with open(shared_data / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            vocabulary.update(re.findall(r"[a-z]+", (row["title"] + " " + row["text"]).lower()))
    words = {w.lower() for world in worlds.values() for name in world.entities for w in name.split()}
    invented = words - NAME_FRAME_WORDS
    found = invented & vocabulary
    assert len(found) <= 0.005 * len(invented), sorted(found)


def _near_duplicate_pairs(world: SyntheticWorld) -> int:
    """Same-type name pairs that share an invented word or are one letter apart (counted here, not read
    from the world's own sibling list)."""
    count = 0
    for entity_type in ("person", "city", "country", "company", "university", "journal"):
        names = world.entities_of(entity_type)
        for a, b in combinations(names, 2):
            shared = ({w.lower() for w in a.split()} & {w.lower() for w in b.split()}) - NAME_FRAME_WORDS
            one_apart = len(a) == len(b) and sum(ca != cb for ca, cb in zip(a, b)) == 1
            if (shared and entity_type != "person") or one_apart or (
                entity_type == "person" and a.split()[-1] == b.split()[-1]
            ):
                count += 1
    return count


def test_difficulty_changes_hops_size_names_and_distractors(worlds: dict[int, SyntheticWorld]) -> None:
    max_hops = [max(q.metadata["hops"] for q in worlds[d].questions) for d in (1, 2, 3)]
    n_passages = [len(worlds[d].passages()) for d in (1, 2, 3)]
    # Per entity, so that these grow with the knobs and not just with the world's size.
    near_duplicates = [_near_duplicate_pairs(worlds[d]) / len(worlds[d].entities) for d in (1, 2, 3)]
    distractors = [(len(worlds[d].passages()) - len(worlds[d].fact_passages)) / len(worlds[d].entities)
                   for d in (1, 2, 3)]
    assert max_hops == [2, 3, 4]
    assert n_passages[0] < n_passages[1] < n_passages[2]
    assert near_duplicates[0] == 0 < near_duplicates[1] < near_duplicates[2]
    assert distractors[0] == 0 < distractors[1] < distractors[2]


def test_lookups_are_found_by_lexical_search_in_their_source(worlds: dict[int, SyntheticWorld]) -> None:
    # The world is learnable with the default BM25 source: each resolved sub-query finds its passage.
    world = worlds[1]
    retrievers = {}
    for source, passages in world.sources.items():
        retriever = bm25s.BM25()
        corpus = [f"{p['title']} {p['text']}" for p in passages]
        retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
        retrievers[source] = retriever
    found = total = 0
    for q in world.questions:
        answers: dict[str, str] = {}
        lookups = [node for node in q.decomposition if node.source is not None]
        for node, gold in zip(lookups, q.gold_passage_ids):
            query = bm25s.tokenize([_substitute(node.query, answers)], stopwords="en", show_progress=False)
            hits, _ = retrievers[node.source].retrieve(query, k=3, show_progress=False)
            found += gold in {world.sources[node.source][i]["id"] for i in hits[0]}
            total += 1
            answers[node.label] = node.answer
    assert found >= 0.95 * total


def test_split_is_deterministic_and_partitions_the_questions(worlds: dict[int, SyntheticWorld]) -> None:
    world = worlds[1]
    train, test = world.split(0.8)
    assert (train, test) == world.split(0.8)
    assert len(train) == 400 and len(test) == 100
    assert sorted(q.id for q in train + test) == sorted(q.id for q in world.questions)
    assert [q.id for q in train] != sorted(q.id for q in train), "the split should shuffle"
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="train_fraction"):
            world.split(bad)


def test_invalid_settings_are_rejected_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="difficulty"):
        generate_world(difficulty=4)
    with pytest.raises(ValueError, match="max_hops"):
        WorldConfig(max_hops=5)
    with pytest.raises(ValueError, match="n_countries"):
        WorldConfig(n_countries=20, n_cities=10)
    with pytest.raises(ValueError, match="distinct questions"):
        generate_world(n_questions=3000, difficulty=1)


def test_a_stem_token_count_gives_names_of_such_stems_and_keeps_the_rest() -> None:
    from search_env.synthetic.tokenizer import load_builtin_tokenizer

    tokenizer = load_builtin_tokenizer()
    base = WorldConfig(n_people=40, n_companies=10, n_cities=10, n_countries=4)
    exact, free = (generate_world(seed=7, n_questions=50, config=WorldConfig(**{**asdict(base), "stem_tokens": m}))
                   for m in (2, None))

    def stem_tokens(world: SyntheticWorld) -> Counter:
        # Country names are a stem with a suffix glued on: their own words are not stems.
        words = {w for name, kind in world.entities.items() if kind != "country" for w in name.split()
                 if w.lower() not in NAME_FRAME_WORDS}
        return Counter(len(tokenizer.encode(" " + w).ids) for w in words)

    assert stem_tokens(exact).keys() == {2} and stem_tokens(exact)[2] > 60
    assert stem_tokens(free)[3] + stem_tokens(free)[4] > stem_tokens(free)[2]  # unlimited: most take 3 or 4
    assert Counter(exact.entities.values()) == Counter(free.entities.values())
    with pytest.raises(ValueError, match="stem_tokens"):
        WorldConfig(stem_tokens=1)


def test_invented_words_are_the_stems_of_every_kind_of_name() -> None:
    world = generate_world(seed=2, n_questions=0)
    words = world.invented_words()
    for name, kind in world.entities.items():
        if kind == "country":
            assert any(name == w + suffix for w in words for suffix in ("ia", "and", "ar", "esh"))
        else:
            assert {w for w in name.split() if w.lower() not in NAME_FRAME_WORDS} <= words
    assert not {w.lower() for w in words} & NAME_FRAME_WORDS


def test_excluded_stems_keep_another_worlds_words_out() -> None:
    config = WorldConfig(n_people=200, n_companies=60, n_cities=60, n_countries=20, stem_tokens=2)
    first = generate_world(seed=1, n_questions=0, config=config)
    second, apart = (generate_world(seed=2, n_questions=0, config=c)
                     for c in (config, WorldConfig(**{**asdict(config), "excluded_stems": first.invented_words()})))
    assert second.invented_words() & first.invented_words()  # two-token stems are few: worlds share some
    assert not apart.invented_words() & first.invented_words()
    assert Counter(apart.entities.values()) == Counter(second.entities.values())


def test_a_custom_config_replaces_the_preset() -> None:
    config = WorldConfig(max_hops=1, n_people=10, n_companies=4, n_cities=4, n_countries=2, n_universities=3,
                         n_journals=3, comparison_fraction=0.0, yes_no_fraction=0.0)
    world = generate_world(seed=2, n_questions=40, config=config)
    assert Counter(world.entities.values())["person"] == 10
    assert {q.metadata["type"] for q in world.questions} == {"chain"}
    assert {q.metadata["hops"] for q in world.questions} == {1}


def test_facts_are_consistent_with_each_other(worlds: dict[int, SyntheticWorld]) -> None:
    for world in worlds.values():
        facts = world.facts
        for country in world.entities_of("country"):
            assert facts[facts[country]["capital"]]["located_in"] == country
        for company in world.entities_of("company"):
            assert facts[company]["founding_year"] > facts[facts[company]["founded_by"]]["birth_year"]
        for journal in world.entities_of("journal"):
            assert facts[journal]["founding_year"] >= facts[facts[journal]["published_by"]]["founding_year"]
        for name in world.entities:
            assert facts[name], name
            assert all(isinstance(value, int) or value in world.entities for value in facts[name].values())
