"""Each LLM baseline, played by a scripted LLM in the environment: the calls it writes (searches with
the question or a reasoning sentence, an answer parsed from the LLM's text) and what its LLM was shown."""
from __future__ import annotations

import pytest

from agents.baselines import (
    BASELINES, BaselineAgent, ChainOfThought, Direct, IRCoT, NaiveRAG, NoGoldPassages, OraclePassages, RolloutTextGenerator,
    gold_passages,
)
from agents.baselines.prompts import short_answer, stated_answer
from agents.rollout.agent import Chunk, RolloutAgent, turn_stop_strings
from agents.rollout.collect import collect_rollouts
from search_env import SEED_PROTOCOLS, BatchSearchQAEnv, get_protocol
from search_env.data.example import QAExample
from search_env.tokenization import as_codec
from search_env.trajectory import Trajectory
from tests.agents.baselines.fake_llm import ScriptedLLM, by_prompt
from tests.conftest import CountingSource

QUESTION = "Who founded Zarbo?"
EXAMPLE = QAExample("z", QUESTION, ["Bob Smith"])
ANSWER_KEY = "short answer (a name"  # in the reader's instruction, which every baseline ends with
STEP_KEY = "one short sentence at a time"  # in IRCoT's reasoning-step instruction
COT_KEY = "Think step by step"


def play(baseline, llm: ScriptedLLM, protocol: str = "search-r1", examples=(EXAMPLE,),
         **env) -> tuple[list[Trajectory], CountingSource]:
    source = CountingSource("wiki")  # the name an NL-DAG plan's General tool reaches
    batch = BatchSearchQAEnv(len(examples), protocol=protocol, dataset=list(examples), sources=source, **env)
    agent = BaselineAgent(baseline, llm)
    assert isinstance(agent, RolloutAgent)
    return collect_rollouts(agent, batch, list(examples)).trajectories, source


def queries(trajectory: Trajectory) -> list[str]:
    return [call.content.strip() for call in trajectory.tool_calls]


def test_the_registry_names_every_baseline() -> None:
    assert sorted(BASELINES) == ["cot", "direct", "ircot", "naive-rag", "oracle-passages"]
    assert all(make().name == name for name, make in BASELINES.items())


@pytest.mark.parametrize("protocol", SEED_PROTOCOLS)
def test_direct_answers_what_the_llm_says_without_searching(protocol: str) -> None:
    llm = ScriptedLLM(by_prompt((ANSWER_KEY, " Bob Smith.\nIt was founded in 1990.")))
    (traj,), source = play(Direct(), llm, protocol)
    assert source.calls == [] and traj.tool_calls == []
    assert traj.answer is not None and "Bob Smith" in traj.answer and "1990" not in traj.answer
    (call,) = llm.calls
    assert f"Question: {QUESTION}" in call.prompt and call.prompt.endswith("Answer:") and call.stop == "\n\n"


def test_an_answer_is_read_off_the_first_line_without_labels_or_a_full_stop() -> None:
    assert short_answer('\n  Answer: "Bob Smith".\nMore') == "Bob Smith"
    assert short_answer("**Paris**") == "Paris"
    assert short_answer("\nNo, they were not.") == "No" and short_answer("Nobody knows") == "Nobody knows"
    assert stated_answer("Bob founded it. So the answer is: Bob Smith. Done.") == "Bob Smith"
    assert stated_answer("Bob founded it.") is None


@pytest.mark.parametrize("protocol", SEED_PROTOCOLS)
def test_llm_text_cannot_open_or_close_a_call(protocol: str) -> None:
    p = get_protocol(protocol)
    llm = ScriptedLLM(by_prompt((ANSWER_KEY, f"Bob {p.answer_close}{p.call_open} Zarbo {p.call_close} <think>")))
    (traj,), source = play(Direct(), llm, protocol)
    assert source.calls == [] and traj.counters.get("invalid_calls", 0) == 0
    assert "Bob Zarbo" in (traj.answer or "")


@pytest.mark.parametrize("protocol", SEED_PROTOCOLS)
def test_naive_rag_searches_the_question_once_and_reads_the_results(protocol: str) -> None:
    llm = ScriptedLLM(by_prompt((ANSWER_KEY, "Bob Smith")))
    (traj,), source = play(NaiveRAG(), llm, protocol)
    query = QUESTION
    assert source.calls == [[query]]
    assert len(traj.tool_calls) == 1 and query in traj.tool_calls[0].content
    (call,) = llm.calls
    assert f"text 0 about {query}" in call.prompt and f"Question: {QUESTION}" in call.prompt
    assert "<" not in call.prompt.split("Passages:")[1]  # the results as the reader reads them: no tags
    assert traj.answer is not None and "Bob Smith" in traj.answer
    if p_evidence := get_protocol(protocol).evidence_open:  # R-Search cites what was retrieved
        assert f"{p_evidence} Doc" not in traj.response_text
        assert f"text 0 about {query}" in traj.response_text.split(p_evidence)[1]


@pytest.mark.parametrize("protocol", ["search-r1", "research", "reasoning-search"])
def test_ircot_searches_each_reasoning_sentence_until_one_states_the_answer(protocol: str) -> None:
    def reply(prompt: str) -> str:
        if STEP_KEY not in prompt:
            raise AssertionError("the chain stated its answer: the reader must not be asked")
        if "Zarbo was founded by Bob." not in prompt:
            return " Zarbo was founded by Bob. He was a baker.\nnext line"
        return "So the answer is: Bob Smith."

    llm = ScriptedLLM(reply)
    (traj,), source = play(IRCoT(max_searches=3), llm, protocol, max_turns=3)
    assert [q for call in source.calls for q in call] == [QUESTION, "Zarbo was founded by Bob."]
    assert len(traj.tool_calls) == 2
    first, second = llm.calls
    assert "text 0 about Who founded Zarbo?" in first.prompt and first.prompt.endswith("\n")
    # the next step continues the reasoning so far, with what its sentence retrieved
    assert second.prompt.endswith("Zarbo was founded by Bob. ") and "text 0 about Zarbo was founded by Bob." in second.prompt
    assert first.stop == "\n"
    assert "So the answer is: Bob Smith." in traj.response_text  # the stating sentence is the answer's thought
    assert traj.answer is not None and "Bob Smith" in traj.answer


def test_ircot_stops_at_its_search_budget_then_asks_the_reader() -> None:
    counter = iter(range(100))
    llm = ScriptedLLM(lambda prompt: "Bob Smith" if STEP_KEY not in prompt else f"Step {next(counter)} is here.")
    (traj,), source = play(IRCoT(), llm, "r-search")  # the protocol's budget: 4 searches
    assert [q for call in source.calls for q in call] == [QUESTION, "Step 0 is here.", "Step 1 is here.", "Step 2 is here."]
    *steps, reader = llm.calls
    assert len(steps) == 4 and STEP_KEY not in reader.prompt
    assert "Reasoning: Step 0 is here. Step 1 is here. Step 2 is here. Step 3 is here." in reader.prompt
    assert "Step 3 is here." in traj.response_text and traj.answer is not None and "Bob Smith" in traj.answer


def test_ircot_stops_when_a_search_returns_nothing_new() -> None:
    llm = ScriptedLLM(lambda prompt: "Bob Smith" if STEP_KEY not in prompt else "Zarbo is old.")
    (traj,), source = play(IRCoT(max_searches=10), llm, "search-r1")
    assert [q for call in source.calls for q in call] == [QUESTION, "Zarbo is old.", "Zarbo is old."]
    assert len(llm.calls) == 2 + 1  # two steps, then the reader
    assert "Bob Smith" in (traj.answer or "")


def test_ircot_under_a_smaller_environment_budget_stops_on_the_repeated_refusal() -> None:
    counter = iter(range(100))
    llm = ScriptedLLM(lambda prompt: "Bob Smith" if STEP_KEY not in prompt else f"Step {next(counter)} is here.")
    (traj,), source = play(IRCoT(), llm, "search-r1", max_turns=1)
    assert source.calls == [[QUESTION]]
    assert traj.counters["budget_exhausted_calls"] == 2 and "Bob Smith" in (traj.answer or "")


@pytest.mark.parametrize("protocol", ["search-r1", "r1-searcher", "research"])
def test_cot_writes_its_reasoning_as_the_thought_and_answers_what_it_states(protocol: str) -> None:
    llm = ScriptedLLM(by_prompt((COT_KEY, "Zarbo is a bakery. Bob started it. So the answer is: Bob Smith.\n\nExtra")))
    (traj,), source = play(ChainOfThought(), llm, protocol)
    assert source.calls == [] and len(llm.calls) == 1 and llm.calls[0].stop == "\n\n"
    assert "Zarbo is a bakery. Bob started it." in traj.response_text and "Extra" not in traj.response_text
    assert "Bob Smith" in (traj.answer or "")


def test_cot_asks_the_reader_when_its_reasoning_states_no_answer() -> None:
    llm = ScriptedLLM(by_prompt((COT_KEY, "Zarbo is a bakery\nin Tarn."), (ANSWER_KEY, "Bob Smith")))
    (traj,), _ = play(ChainOfThought(), llm)
    assert len(llm.calls) == 2 and "Reasoning: Zarbo is a bakery in Tarn." in llm.calls[1].prompt
    assert "Bob Smith" in (traj.answer or "")


GOLD = QAExample("h", "Who founded the company that owns Zarbo?", ["Bob Smith"], metadata={"contexts": [
    {"title": "Zarbo", "text": "Zarbo is owned by Acme.", "is_supporting": True, "corpus_id": "7"},
    {"title": "Tarn", "text": "Tarn has a bridge.", "is_supporting": False, "corpus_id": "8"},
    {"title": "Acme", "text": "Acme was founded by Bob Smith.", "is_supporting": True, "corpus_id": "9"},
]})


@pytest.mark.parametrize("protocol", ["search-r1", "r-search"])
def test_oracle_passages_reads_the_gold_passages_as_the_environment_formats_them(protocol: str) -> None:
    llm = ScriptedLLM(by_prompt((ANSWER_KEY, "Bob Smith")))
    (traj,), source = play(OraclePassages(), llm, protocol, examples=(GOLD,))
    assert source.calls == [] and traj.tool_calls == []
    (call,) = llm.calls
    expected = {"search-r1": "Doc 1(Title: Zarbo) Zarbo is owned by Acme.\nDoc 2(Title: Acme)",
                "r-search": "(Title: Zarbo) Zarbo is owned by Acme.\n(Title: Acme)"}[protocol]
    assert expected in call.prompt and "Tarn" not in call.prompt
    assert get_protocol(protocol).evidence_open is None or get_protocol(protocol).evidence_open not in traj.response_text
    assert "Bob Smith" in (traj.answer or "")


def test_the_gold_passages_of_a_synthetic_question_are_its_worlds() -> None:
    from search_env.synthetic import generate_world

    world = generate_world(seed=0, n_questions=20)
    for example in world.questions:
        assert [p.text for p in gold_passages(example)] == [world.passage(i)["text"] for i in example.gold_passage_ids]
    with pytest.raises(NoGoldPassages, match="example 'z' has no gold passages"):
        gold_passages(EXAMPLE)


def test_the_rows_of_a_turn_ask_the_llm_in_one_batch_and_research_answers_end_with_eos() -> None:
    examples = [QAExample(f"q{i}", f"Who founded Zarbo {i}?", ["Bob"]) for i in range(3)]
    llm = ScriptedLLM(by_prompt((ANSWER_KEY, "Bob")))
    trajectories, source = play(NaiveRAG(), llm, "research", examples=examples)
    assert llm.batches == [3] and len(source.calls) == 1 and len(source.calls[0]) == 3
    assert [t.end_reason for t in trajectories] == ["eos"] * 3
    assert all(t.reward > 0 for t in trajectories)


def test_a_baseline_that_yields_something_else_is_a_clear_error() -> None:
    class Broken:
        name = "broken"

        def play(self, example, writer):
            yield "text"

    with pytest.raises(TypeError, match="baseline 'broken' yielded a str, not an Ask or a Write"):
        play(Broken(), ScriptedLLM(lambda prompt: ""))


class EchoEngine:
    """A rollout agent that writes, for each row, its prompt reversed and then more text past "|"."""

    def begin(self, prompt_ids, *, examples, protocol, codec) -> None:
        self.codec, self.stops = codec, turn_stop_strings(protocol)
        self.prompts = [codec.decode(ids) for ids in prompt_ids]
        self.finished: list[int] = []

    def generate(self, rows, budgets):
        return [Chunk(self.codec.encode(self.prompts[row][::-1] + "|and more")[:budget]) for row, budget in zip(rows, budgets)]

    def feed(self, row, token_ids) -> None:
        raise AssertionError("a completion is one turn: nothing is fed")

    def finish(self, row) -> None:
        self.finished.append(row)


def test_a_rollout_agent_completes_text_up_to_the_stop_string() -> None:
    engine = EchoEngine()
    generator = RolloutTextGenerator(engine)
    assert generator.codec is None  # an engine without a tokenizer of its own (a server's)
    assert generator.complete(["abc 中文", "xyz"], max_new_tokens=64, stop="|") == ["文中 cba", "zyx"]
    assert engine.stops == ("|",) and engine.prompts == ["abc 中文", "xyz"] and engine.finished == [0, 1]
    codec = as_codec(None)
    assert generator.complete(["abcdefgh"], max_new_tokens=2, stop="|") == [codec.decode(codec.encode("hgfedcba|and more")[:2])]
    with pytest.raises(ValueError, match="non-empty stop string"):
        generator.complete(["x"], max_new_tokens=4, stop="")
