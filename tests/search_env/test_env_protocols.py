"""Each built-in protocol round-trips a scripted episode with the exact token masks expected."""
from __future__ import annotations

import dataclasses

import pytest

from search_env import AGENT, ENVIRONMENT, Dialect, available_protocols, get_protocol, register_protocol
from search_env.data.example import QAExample
from search_env.env import SearchQAEnv
from tests.conftest import CountingSource, skip_without

EXAMPLE = QAExample("q1", "Who founded Zarbo", ["Bob Smith"])

# (protocol, agent text before the call's close, what the environment must append, agent text after)
# The appended text is written out literally from ../shared/PROTOCOLS.md, not taken from the code.
DOCS_R1 = ("Doc 1(Title: T0 zarbo founder) text 0 about zarbo founder\nDoc 2(Title: T1 zarbo founder) text 1 about zarbo founder\n"
           "Doc 3(Title: T2 zarbo founder) text 2 about zarbo founder\n")
CASES = [
    (
        "search-r1",
        "<think> I need the founder. </think><search> zarbo founder </search>",
        "\n\n<information>" + DOCS_R1 + "</information>\n\n",
        "<think> found </think><answer> Bob Smith </answer>",
    ),
    (
        "r1-searcher",
        ' I search. </think><|begin_of_query|> "zarbo"   founder <|end_of_query|>',
        "\n\n<|begin_of_documents|>\n(1)T0 zarbo founder\ntext 0 about zarbo founder\n(2)T1 zarbo founder\ntext 1 about zarbo founder\n"
        "(3)T2 zarbo founder\ntext 2 about zarbo founder\n<|end_of_documents|>\n\n",
        "<answer> Bob Smith </answer>",
    ),
    (
        "research",
        "<think> search </think> <search> zarbo founder </search>",
        " <result>\n" + "\n\n".join(f"T{i} zarbo founder\ntext {i} about zarbo founder" for i in range(5)) + "\n</result>",
        " <think> ok </think> <answer> The final answer is \\[ \\boxed{Bob Smith} \\] </answer>",
    ),
    (
        "r-search",
        "I should look it up. <search> zarbo founder </search>",
        "\n\n<observation>" + "".join(f"(Title: T{i} zarbo founder) text {i} about zarbo founder\n" for i in range(3)) + "</observation>\n\n",
        "<original_evidence> text 0 about zarbo founder </original_evidence><answer> Bob Smith </answer>",
    ),
]


def scripted(tokenizer, protocol, before, appended, after, **kwargs):
    env = SearchQAEnv(protocol, dataset=[EXAMPLE], sources=CountingSource(), tokenizer=tokenizer, **kwargs)
    obs, _ = env.reset(seed=0)
    codec = env.codec
    a, b = codec.encode(before), codec.encode(after)
    if not env.protocol.answer_ends_episode:  # ReSearch runs on to the EOS token its reward requires
        b = b + [min(codec.eos_ids)]
    for t in a:
        env.step(t)
    _, reward, terminated, truncated, info = env.step(b)
    return env, codec, a, b, reward, terminated, truncated, info


@pytest.mark.parametrize("protocol,before,appended,after", CASES, ids=[c[0] for c in CASES])
def test_scripted_episode_masks_and_text(split_tag_tokenizer, protocol, before, appended, after):
    env, codec, a, b, reward, terminated, truncated, info = scripted(split_tag_tokenizer, protocol, before, appended, after)
    traj = env.trajectory
    env_ids = codec.encode(appended)
    p = traj.prompt_length
    assert traj.token_ids[p:] == a + env_ids + b, "agent ids must be kept as sampled; results tokenised once"
    assert list(traj.producers) == [ENVIRONMENT] * p + [AGENT] * len(a) + [ENVIRONMENT] * len(env_ids) + [AGENT] * len(b)
    assert list(traj.trained) == [0] * p + [1] * len(a) + [0] * len(env_ids) + [1] * len(b)
    assert traj.response_text == before + appended + after
    assert terminated and not truncated and traj.end_reason == ("answer" if env.protocol.answer_ends_episode else "eos")
    assert traj.answer is not None and "Bob Smith" in traj.answer
    assert reward > 0, f"a correct answer must be rewarded under {protocol}: {traj.reward_components}"
    assert [s.kind for s in traj.spans] == ["call", "result", "answer"]
    result = traj.spans[1]
    assert (result.start, result.end) == (p + len(a), p + len(a) + len(env_ids))
    call = traj.tool_calls[0]
    assert call.content == "zarbo founder" and call.k == get_protocol(protocol).top_k


def test_prompt_follows_the_protocol_text(split_tag_tokenizer):
    env = SearchQAEnv("search-r1", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer)
    assert env.render_prompt(" Who founded Zarbo ").endswith("For example, <answer> Beijing </answer>. Question: Who founded Zarbo?\n")
    r1 = SearchQAEnv("r1-searcher", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer)
    assert r1.render_prompt("Q").endswith("\n\nUser:Q\nAssistant: <think>")


def test_a_prompt_kept_from_an_earlier_episode_starts_a_fresh_one(split_tag_tokenizer):
    # reset keeps each question's encoded prompt: a later episode must start exactly as the first did,
    # and nothing an episode appends may reach the kept prompt.
    env = SearchQAEnv("search-r1", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer)
    expected = tuple(split_tag_tokenizer.encode(env.render_prompt(EXAMPLE.question)).ids)
    first, _ = env.reset(options={"index": 0})
    env.step(env.codec.encode("<search> zarbo founder </search>"))
    assert len(env.trajectory.token_ids) > len(expected) and env.response_text
    second, info = env.reset(options={"index": 0})
    assert first["token_ids"] == second["token_ids"] == expected and info["prompt_length"] == len(expected)
    assert env.trajectory.token_ids == list(expected) and env.response_text == ""
    small = SearchQAEnv("search-r1", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer,
                        max_context=len(expected))
    for _ in range(2):  # a prompt too long is refused every time, not kept
        with pytest.raises(ValueError, match="not below max_context"):
            small.reset(options={"index": 0})


def test_r_search_evidence_is_trained_and_a_protocol_can_exclude_a_span(split_tag_tokenizer):
    env, codec, a, b, *_ = scripted(split_tag_tokenizer, *CASES[3])
    assert all(env.trajectory.trained[-len(b):]), "R-Search's evidence is agent text and is trained on"
    quiet = get_protocol("search-r1").with_options(name="search-r1-quiet-think", untrained_agent_spans=(("<think>", "</think>"),))
    env, codec, a, b, *_ = scripted(split_tag_tokenizer, quiet, *CASES[0][1:])
    traj = env.trajectory
    think_ids = codec.encode("<think> I need the founder. </think>")
    p = traj.prompt_length
    assert not any(traj.trained[p : p + len(think_ids) - 1]), "the think span must be excluded from training"
    assert traj.trained[p + len(a) - 1] == 1, "the search call stays trained"


def test_a_user_registers_a_new_protocol_without_touching_the_env(split_tag_tokenizer):
    custom = Dialect(
        name="bracket-tools", call_open="[[search:", call_close="]]", result_open="{{", result_close="}}",
        answer_open="[[answer:", answer_close="]]!", user_template="Q: {question}\n", result_prefix="{{",
        result_suffix="}}", format_docs=lambda ps: "|".join(p.title for p in ps), top_k=2, reward="search-r1",
    )
    register_protocol(custom, replace=True)
    assert "bracket-tools" in available_protocols()
    env = SearchQAEnv("bracket-tools", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=split_tag_tokenizer)
    env.reset(seed=0)
    env.step(env.codec.encode("[[search: zarbo ]]"))
    assert env.response_text.endswith("{{T0 zarbo|T1 zarbo}}")
    register_protocol(custom)  # the same dialect again (a module imported twice) is no clash
    with pytest.raises(ValueError, match="already registered"):
        register_protocol(dataclasses.replace(custom, top_k=3))  # another dialect under a taken name is


def test_non_ascii_tags_delimit_the_query_and_the_answer_by_their_bytes(split_tag_tokenizer):
    # The record's offsets are bytes: a tag of multi-byte characters must be skipped by its encoded length.
    tags = Dialect(
        name="guillemet-tags", call_open="«search»", call_close="«/search»", result_open="«result»",
        result_close="«/result»", answer_open="«答え»", answer_close="«/答え»", user_template="Q: {question}\n",
        top_k=1, reward="search-r1",
    )
    source = CountingSource()
    env = SearchQAEnv(tags, dataset=[EXAMPLE], sources=source, tokenizer=split_tag_tokenizer)
    env.reset(seed=0)
    env.step(env.codec.encode("«search»zarbo founder«/search»"))
    assert source.calls == [["zarbo founder"]]
    call = next(s for s in env.trajectory.spans if s.kind == "call")
    assert env.codec.decode(env.trajectory.token_ids[call.start : call.end]) == "«search»zarbo founder«/search»"
    *_, info = env.step(env.codec.encode("«答え»Bob Smith«/答え»"))
    assert info["answer"] == env.trajectory.answer == "Bob Smith"
    answer = next(s for s in env.trajectory.spans if s.kind == "answer")
    assert env.codec.decode(env.trajectory.token_ids[answer.start : answer.end]) == "«答え»Bob Smith«/答え»"


def test_chat_template_renders_the_prompt_when_the_tokenizer_has_one(tmp_path):
    skip_without("agents", "transformers")
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    raw = Tokenizer(models.WordLevel({"<unk>": 0, "<|endoftext|>": 1, "a": 2}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", unk_token="<unk>")
    hf.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    env = SearchQAEnv("r-search", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=hf)
    prompt = env.render_prompt("Who?")
    assert prompt.startswith("<system>You are a helpful assistant") and prompt.endswith("<user>Who?<assistant>")
    plain = SearchQAEnv("r-search", dataset=[EXAMPLE], sources=CountingSource(), tokenizer=hf, chat_template=False)
    assert "<user>" not in plain.render_prompt("Who?")


def _dag_env(tokenizer, protocol="reasoning-search"):
    sources = {"wiki": CountingSource("wiki"), "news": CountingSource("news"), "papers": CountingSource("papers")}
    env = SearchQAEnv(protocol, dataset=[EXAMPLE], sources=sources, tokenizer=tokenizer)
    env.reset(seed=0)
    return env, sources


def test_reasoning_search_runs_one_plan_into_one_result_block(split_tag_tokenizer):
    env, sources = _dag_env(split_tag_tokenizer)
    codec = env.codec
    plan = "<think> plan </think><search>\nNodes:\nA: zarbo founder (News)\nb: {A} birthplace (General)\nEdges:\nA -> B\n</search>"
    a = codec.encode(plan)
    env.step(a)
    assert sources["news"].calls == [["zarbo founder"]]
    assert sources["wiki"].calls == [["T0 zarbo founder birthplace"]], "the parent's top title fills {A}"
    traj = env.trajectory
    expected_block = (
        "\n<result>\nA (News): zarbo founder\n"
        + "".join(f"Doc {i + 1}(Title: T{i} zarbo founder) text {i} about zarbo founder\n" for i in range(3)).rstrip("\n")
        + "\n\nB (General): T0 zarbo founder birthplace\n"
        + "".join(f"Doc {i + 1}(Title: T{i} T0 zarbo founder birthplace) text {i} about T0 zarbo founder birthplace\n" for i in range(3)).rstrip("\n")
        + "\n</result>\n"
    )
    assert env.response_text == plan + expected_block
    env_ids = codec.encode(expected_block)
    p = traj.prompt_length
    assert list(traj.producers[p:]) == [1] * len(a) + [0] * len(env_ids)
    assert [n["label"] for n in traj.tool_calls[0].nodes] == ["A", "B"]
    *_, terminated, _, info = env.step(codec.encode("<answer> Bob Smith </answer>"))
    assert terminated and info["reward_components"]["dag_valid"] and env.trajectory.reward == 1.0
    # one plan, one search round: a second plan gets the budget error instead
    env2, sources2 = _dag_env(split_tag_tokenizer)
    env2.step(codec.encode("<search>Nodes:\nA: x (News)\n</search><search>Nodes:\nA: y (News)\n</search>"))
    assert sources2["news"].calls == [["x"]] and env2.trajectory.counters["budget_exhausted_calls"] == 1


def test_an_invalid_plan_is_an_error_observation_naming_each_violation(split_tag_tokenizer):
    env, sources = _dag_env(split_tag_tokenizer)
    env.step(env.codec.encode("<search>Nodes:\nA: x (News)\nB: y (Blogs)\nEdges:\nA -> B -> A ; A -> C\n</search>"))
    text = env.response_text
    assert "Invalid search plan" in text and "cycle" in text and "unknown_source" in text and "unknown_node" in text
    assert all(not s.calls for s in sources.values())
    assert env.trajectory.counters["invalid_plans"] == 1


def test_any_protocol_can_opt_into_dag_calls(split_tag_tokenizer):
    dag_r1 = get_protocol("search-r1").with_options(name="search-r1-dag", call_kind="dag", max_turns=3)
    env, sources = _dag_env(split_tag_tokenizer, dag_r1)
    env.step(env.codec.encode("<search>A: q1 (news)\nB: q2 (academy)\n</search>"))
    assert sources["news"].calls == [["q1"]] and sources["papers"].calls == [["q2"]]
    assert "<information>" in env.response_text


class JitterySource(CountingSource):
    """Answers like CountingSource after a random delay, so nodes finish in a random order."""

    def __init__(self, name: str, rng) -> None:
        super().__init__(name)
        self.rng = rng

    def search(self, queries, k):
        import time

        time.sleep(self.rng.uniform(0.0, 0.01))
        return super().search(queries, k)


def test_the_same_plan_gives_the_same_observation_whatever_the_source_latencies(split_tag_tokenizer):
    import random

    rng = random.Random(0)
    plan = "<search>Nodes:\nC: c (news)\nA: a (wiki)\nB: b (papers)\nD: {A} d (news)\nEdges:\nA -> D ; B -> D\n</search>"
    observations, orders = set(), set()
    for _ in range(10):
        sources = {name: JitterySource(name, rng) for name in ("wiki", "news", "papers")}
        env = SearchQAEnv("reasoning-search", dataset=[EXAMPLE], sources=sources, tokenizer=split_tag_tokenizer)
        env.reset(seed=0)
        obs, *_ = env.step(env.codec.encode(plan))
        observations.add(obs["token_ids"])
        orders.add(tuple(node["label"] for node in env.trajectory.tool_calls[0].nodes))
    assert orders == {("A", "B", "C", "D")} and len(observations) == 1
