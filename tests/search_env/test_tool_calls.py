"""The tool-calls protocol: calls in a model family's native format, run together when the agent's turn
ends, answered by one tool turn; bad calls are error responses and counters, never exceptions."""
from __future__ import annotations

import json
import threading

import pytest

from search_env import SearchQAEnv, get_protocol
from search_env.data.example import QAExample
from search_env.sources.base import Passage, Source
from search_env.tool_calls import ToolCalling
from tests.conftest import CountingSource

EXAMPLES = [QAExample("q1", "Who founded the city", ["Bob Smith"])]

SYSTEM = (
    "Answer the given question. You may reason inside <think> and </think>. If you lack some knowledge, call "
    "the search tools, as many times as you want; several calls in one turn run together. When you need no "
    "further knowledge, give the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>."
)
# The two tools in transformers' JSON-schema tool format, as json.dumps writes them.
WIKI_SCHEMA = ('{"type": "function", "function": {"name": "wiki", "description": "Search encyclopedia articles.", '
               '"parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "the search '
               'query"}}, "required": ["query"]}}}')
NEWS_SCHEMA = WIKI_SCHEMA.replace('"wiki"', '"news"').replace("encyclopedia articles", "news articles")
# Qwen2.5's tool instructions around the schemas.
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    f"signatures within <tools></tools> XML tags:\n<tools>\n{WIKI_SCHEMA}\n{NEWS_SCHEMA}\n</tools>\n\nFor each function "
    "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def make_env(protocol: str = "tool-calls", *, tokenizer=None, sources=None, **settings) -> SearchQAEnv:
    sources = sources or {"wiki": CountingSource("wiki"), "news": CountingSource("news")}
    return SearchQAEnv(protocol, dataset=EXAMPLES, sources=sources, default_source="wiki", tokenizer=tokenizer, **settings)


def docs(query: str, k: int = 3) -> str:
    """What the protocol writes for a CountingSource's k passages on ``query`` (Search-R1's document lines)."""
    return "\n".join(f"Doc {i + 1}(Title: T{i} {query}) text {i} about {query}" for i in range(k))


def hermes(name: str, arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def play_turn(env: SearchQAEnv, text: str, *, eos: bool = True):
    """Step one agent turn (its end-of-sequence id after it); returns the environment's text and the step."""
    ids = env.codec.encode(text) + ([min(env.codec.eos_ids)] if eos else [])
    obs, reward, terminated, truncated, info = env.step(ids)
    env_ids = [t for t, who in zip(obs["token_ids"], obs["producers"]) if who == 0]
    return env.codec.decode(env_ids), (reward, terminated, truncated, info), env_ids


def test_the_fallback_prompt_lists_every_source_as_a_tool_byte_for_byte() -> None:
    env = make_env()
    expected = f"{SYSTEM}\n\n{TOOLS_BLOCK}\n\nQuestion: Who founded the city?\n"
    assert env.render_prompt("Who founded the city") == expected
    obs, _ = env.reset(seed=0)
    assert list(obs["token_ids"]) == env.codec.encode(expected)
    assert env.protocol.tool_calling.tools == (("wiki", "encyclopedia articles"), ("news", "news articles"))


def test_the_llama3_fallback_prompt_asks_for_json_calls_with_parameters() -> None:
    prompt = make_env("tool-calls-llama3").render_prompt("Who founded the city")
    assert prompt == (f"{SYSTEM}\n\nGiven the following functions, please respond with a JSON for a function call with its "
                      "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function "
                      "name, \"parameters\": dictionary of argument name and its value}. Do not use variables. Several "
                      f"calls go one per line.\n\n{WIKI_SCHEMA}\n{NEWS_SCHEMA}\n\nQuestion: Who founded the city?\n")


def test_the_mistral_fallback_prompt_lists_the_tools_as_one_json_list_byte_for_byte() -> None:
    prompt = make_env("tool-calls-mistral").render_prompt("Who founded the city")
    assert prompt == (f"{SYSTEM}\n\n[AVAILABLE_TOOLS] [{WIKI_SCHEMA}, {NEWS_SCHEMA}][/AVAILABLE_TOOLS]\n\nTo call functions, "
                      "write [TOOL_CALLS] followed by a JSON list of the calls:\n[TOOL_CALLS] [{\"name\": <function-name>, "
                      "\"arguments\": <args-json-object>}]\n\nQuestion: Who founded the city?\n")


def test_mistral_calls_of_one_list_run_together_and_come_back_in_call_order() -> None:
    env = make_env("tool-calls-mistral")
    env.reset(seed=0)
    turn = ('<think> t </think>[TOOL_CALLS] [{"name": "news", "arguments": {"query": "the city"}, "id": "abcdefghi"}, '
            '{"name": "wiki", "arguments": {"query": "who founded"}}][TOOL_CALLS] [{"name": "news", "arguments": {"query": "x"}}]')
    text, (_, terminated, _, _), _ = play_turn(env, turn)
    assert text == (f"\n<tool_response>\n{docs('the city')}\n</tool_response>\n<tool_response>\n{docs('who founded')}\n"
                    f"</tool_response>\n<tool_response>\n{docs('x')}\n</tool_response>\n")
    assert not terminated and env.sources["news"].calls == [["the city", "x"]] and env.sources["wiki"].calls == [["who founded"]]
    assert env.protocol.tool_calling.write([("wiki", "a"), ("news", "b")]) == (
        '[TOOL_CALLS] [{"name": "wiki", "arguments": {"query": "a"}}, {"name": "news", "arguments": {"query": "b"}}]')


@pytest.mark.parametrize(("turn", "message", "counter"), [
    ('[TOOL_CALLS] [{"name": "wiki", "arguments": oops}]', "the call is not valid JSON", "invalid_calls"),
    ('[TOOL_CALLS] [{"name": "wiki", "arguments": {"query": "who', "the call was cut off before its JSON closed",
     "unterminated_calls"),
    ("[TOOL_CALLS]", "no call follows [TOOL_CALLS]", "invalid_calls"),
    ("[TOOL_CALLS] []", "no call follows [TOOL_CALLS]", "invalid_calls"),
    ('[TOOL_CALLS] ["wiki"]', "a call must be a JSON object", "invalid_calls"),
    ('[TOOL_CALLS] [{"name": "wiki", "arguments": {"query": "  "}}]', "the query is empty", "empty_queries"),
])
def test_a_bad_mistral_call_is_an_error_response_and_a_counter(turn: str, message: str, counter: str) -> None:
    env = make_env("tool-calls-mistral")
    env.reset(seed=0)
    text, (_, terminated, truncated, _), _ = play_turn(env, turn)
    assert text.startswith(f"\n<tool_response>\nError: {message}") and text.endswith("\n</tool_response>\n")
    assert text.count("<tool_response>") == 1 and not (terminated or truncated)
    assert env.trajectory.counters[counter] == 1 and env.trajectory.counters["searches"] == 0


def test_a_source_that_describes_itself_is_offered_with_its_description_behind_a_cache() -> None:
    wiki = CountingSource("wiki")
    wiki.description = "the company's handbook"
    env = make_env(sources={"wiki": wiki, "papers": CountingSource("papers"), "kb": CountingSource("kb")}, cache_size=4)
    assert env.protocol.tool_calling.tools == (("wiki", "the company's handbook"), ("papers", "research papers"),
                                               ("kb", "the kb collection"))


def test_calls_of_one_turn_run_together_and_come_back_in_one_tool_turn_in_call_order() -> None:
    env = make_env()
    env.reset(seed=0)
    turn = "<think> two lookups </think>\n" + hermes("news", {"query": "the  city"}) + "\n" + hermes("wiki", {"query": "who founded"})
    text, (reward, terminated, truncated, info), _ = play_turn(env, turn)
    assert text == (f"\n<tool_response>\n{docs('the city')}\n</tool_response>\n<tool_response>\n{docs('who founded')}\n"
                    "</tool_response>\n")
    assert not (terminated or truncated) and [e["event"] for e in info["events"]] == ["results"]
    assert env.sources["news"].calls == [["the city"]] and env.sources["wiki"].calls == [["who founded"]]
    traj = env.trajectory
    assert [(c.kind, c.content, c.sources) for c in traj.tool_calls] == [("tool", "the city", ["news"]), ("tool", "who founded", ["wiki"])]
    assert traj.counters["searches"] == 2
    _, (reward, terminated, _, _), _ = play_turn(env, "<answer> Bob Smith </answer>", eos=False)
    assert terminated and reward == 1.0 and traj.end_reason == "answer"


def test_each_response_is_cut_to_the_result_token_cap() -> None:
    env = make_env(max_result_tokens=4)
    env.reset(seed=0)
    text, _, _ = play_turn(env, hermes("wiki", {"query": "who"}) + hermes("news", {"query": "city"}))
    bodies = [part.split("\n</tool_response>")[0] for part in text.split("<tool_response>\n")[1:]]
    assert len(bodies) == 2
    for body, query in zip(bodies, ("who", "city")):
        assert docs(query).startswith(body) and len(env.codec.encode(body)) == 4


class MeetingSource(Source):
    """Answers only once every source of the test is searching at the same time (a barrier they all wait at)."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier

    def search(self, queries, k):
        self.barrier.wait()
        return [[Passage(q, q, f"found {q}", 1.0)] for q in queries]


def test_calls_to_different_sources_are_searched_in_parallel() -> None:
    barrier = threading.Barrier(2, timeout=10)  # one source searched after the other would break it
    env = make_env(sources={"wiki": MeetingSource(barrier), "news": MeetingSource(barrier)})
    env.reset(seed=0)
    text, _, _ = play_turn(env, hermes("wiki", {"query": "a"}) + hermes("news", {"query": "b"}))
    assert "Doc 1(Title: a) found a" in text and "Doc 1(Title: b) found b" in text
    assert env.trajectory.counters["source_errors"] == 0


BAD_CALLS = [
    ('<tool_call>\n{"name": "wiki", "arguments": {"query": "x"}\n</tool_call>', "the call is not valid JSON", "invalid_calls"),
    (hermes("web", {"query": "x"}), "unknown tool 'web'; the tools are wiki, news", "invalid_calls"),
    (hermes("wiki", {"query": 7}), "\"query\" of 'wiki' must be a string, not int", "invalid_calls"),
    (hermes("wiki", {"q": "x"}), "'wiki' takes only \"query\", not 'q'", "invalid_calls"),
    (hermes("wiki", ["x"]), "the call of 'wiki' has no \"arguments\" object", "invalid_calls"),
    ('<tool_call>\n["wiki", "x"]\n</tool_call>', "a call must be a JSON object", "invalid_calls"),
    (hermes("wiki", {"query": "  "}), "the query is empty", "empty_queries"),
    ('<tool_call>\n{"name": "wiki", "arguments": {"query": "x', "the call was cut off before </tool_call>", "unterminated_calls"),
]


@pytest.mark.parametrize(("turn", "message", "counter"), BAD_CALLS)
def test_a_bad_call_is_an_error_response_and_a_counter(turn: str, message: str, counter: str) -> None:
    env = make_env()
    env.reset(seed=0)
    text, (_, terminated, truncated, info), _ = play_turn(env, turn)
    assert text.startswith(f"\n<tool_response>\nError: {message}") and text.endswith("\n</tool_response>\n")
    assert not (terminated or truncated) and [e["event"] for e in info["events"]] == ["invalid_call"]
    assert env.trajectory.counters[counter] == 1 and env.trajectory.counters["searches"] == 0
    assert env.sources["wiki"].calls == [] and not env.trajectory.tool_calls


def test_a_bad_call_beside_good_ones_gets_its_own_slot() -> None:
    env = make_env("tool-calls-llama3")
    env.reset(seed=0)
    turn = '<think> t </think><|python_tag|>{"name": "wiki", "parameters": {"query": "who"}}; {"name": "news", "parameters": oops}'
    text, _, _ = play_turn(env, turn)
    assert text.startswith(f"\n<tool_response>\n{docs('who')}\n</tool_response>\n<tool_response>\nError: the call is not valid JSON")
    assert env.trajectory.counters["invalid_calls"] == 1 and env.trajectory.counters["searches"] == 1


def test_a_llama3_call_cut_off_inside_its_json_is_counted_as_unterminated() -> None:
    env = make_env("tool-calls-llama3")
    env.reset(seed=0)
    text, _, _ = play_turn(env, '{"name": "wiki", "parameters": {"query": "who founded')
    assert text == "\n<tool_response>\nError: the call was cut off before its JSON closed\n</tool_response>\n"
    assert env.trajectory.counters["unterminated_calls"] == 1


def test_calls_past_the_search_budget_and_the_turn_limit_get_errors() -> None:
    env = make_env(max_turns=1)
    env.reset(seed=0)
    text, _, _ = play_turn(env, hermes("wiki", {"query": "a"}) + hermes("wiki", {"query": "b"}))
    assert text.endswith("<tool_response>\nError: Search budget of 1 calls is used up; give the final answer.\n</tool_response>\n")
    assert env.trajectory.counters["budget_exhausted_calls"] == 1 and env.sources["wiki"].calls == [["a"]]

    env = make_env(max_turns=None)
    env.reset(seed=0)
    text, _, _ = play_turn(env, "".join(hermes("wiki", {"query": f"q{i}"}) for i in range(9)))
    assert text.count("Doc 1(") == 8 and "Error: at most 8 calls run in one turn" in text
    assert env.trajectory.counters["invalid_calls"] == 1


def test_a_call_cut_by_the_token_budget_is_counted_and_ends_the_episode_truncated() -> None:
    env = make_env()
    env.reset(seed=0)
    ids = env.codec.encode(hermes("wiki", {"query": "who"}))
    env = make_env(max_new_tokens=len(ids) - 2)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step(ids)
    assert truncated and not terminated and reward == 0.0 and info["end_reason"] == "max_new_tokens"
    assert env.trajectory.counters["unterminated_calls"] == 1 and env.sources["wiki"].calls == []


def test_a_failing_source_is_an_error_response() -> None:
    env = make_env(sources={"wiki": CountingSource("wiki", fail=True), "news": CountingSource("news")})
    env.reset(seed=0)
    text, _, _ = play_turn(env, hermes("wiki", {"query": "a"}) + hermes("news", {"query": "b"}))
    assert "<tool_response>\nError: Search failed: " in text and docs("b") in text
    assert env.trajectory.counters["source_errors"] == 1 and env.trajectory.tool_calls[0].error


def test_a_turn_without_calls_ends_the_episode_at_its_eos() -> None:
    env = make_env()
    env.reset(seed=0)
    text, (reward, terminated, _, info), _ = play_turn(env, "<think> no idea </think> Bob")
    assert text == "" and terminated and reward == 0.0 and info["end_reason"] == "eos"


def test_the_protocol_stops_generation_only_at_the_answer_and_knows_its_call_formats() -> None:
    assert get_protocol("tool-calls").stop_strings == ("</answer>",)
    assert get_protocol("tool-calls").reward == get_protocol("tool-calls-llama3").reward == "search-r1"
    with pytest.raises(ValueError, match="unknown call_format 'gorilla'; choose one of hermes, llama3, mistral"):
        ToolCalling(call_format="gorilla")


def _chat_renderer(source: str):
    """A chat template's render function (``messages``, ``tools``, ``add_generation_prompt``) for the
    jinja ``source``, with transformers' ``raise_exception``."""
    jinja2 = pytest.importorskip("jinja2")

    def refuse(message):
        raise ValueError(message)

    environment = jinja2.Environment()
    environment.globals["raise_exception"] = refuse
    template = environment.from_string(source)

    def render(messages, tools=None, add_generation_prompt=True):
        return template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)

    return render


def test_a_template_that_takes_one_call_per_turn_still_gives_its_tool_turn() -> None:
    from search_env.tool_calls import template_turn

    render = _chat_renderer(  # Llama 3.1's layout, which refuses two calls in one turn
        "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}"
        "{% if m.tool_calls | length != 1 %}{{ raise_exception('single tool-calls only') }}{% endif %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
        "{% elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
        "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

    turn = template_turn(render, [{"role": "user", "content": "Q"}], "<|eot_id|>", ToolCalling(call_format="llama3"))
    ipython = "<|start_header_id|>ipython<|end_header_id|>\n\n"
    assert turn == (ipython, "<|eot_id|>" + ipython, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert template_turn(render, [{"role": "user", "content": "Q"}], "</s>", ToolCalling()) is None  # not its EOS


@pytest.mark.parametrize(("turn", "message", "counter"), BAD_CALLS)
def test_every_call_the_environment_answers_with_an_error_costs_the_format_reward(turn: str, message: str, counter: str) -> None:
    env = make_env(reward="tool-calls-format")
    env.reset(seed=0)
    play_turn(env, hermes("wiki", {"query": "who"}))
    play_turn(env, turn)
    _, (reward, terminated, _, info), _ = play_turn(env, "<answer> Bob Smith </answer>", eos=False)
    assert terminated and reward == pytest.approx(0.8) and not info["reward_components"]["format_valid"]

    env.reset(seed=0)
    play_turn(env, hermes("wiki", {"query": "who"}) + hermes("news", {"query": "city"}))
    _, (reward, _, _, info), _ = play_turn(env, "<answer> Bob Smith </answer>", eos=False)
    assert reward == 1.0 and info["reward_components"]["format_error"] is None


def test_a_template_that_asks_for_call_ids_gets_the_fallback_tool_turn() -> None:
    from search_env.tool_calls import template_turn

    render = _chat_renderer(  # Mistral-7B-Instruct-v0.3's rule: every call has an id of 9 characters
        "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS] ["
        "{% for c in m.tool_calls %}{% if c.id is not defined or c.id | length != 9 %}"
        "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{% endif %}"
        "{{ c.function | tojson }}{% endfor %}]</s>{% elif m.role == 'tool' %}[TOOL_RESULTS] {{ m.content }}[/TOOL_RESULTS]"
        "{% else %}[INST] {{ m.content }}[/INST]{% endif %}{% endfor %}")

    assert template_turn(render, [{"role": "user", "content": "Q"}], "</s>", ToolCalling(call_format="mistral")) is None
