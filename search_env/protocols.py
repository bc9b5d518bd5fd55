"""Protocols: the tag dialects of the seed systems, as data.

A protocol (what ``protocol=`` and ``env.protocol`` name) is a :class:`Dialect`; the class is not called
``Protocol`` so that no reader takes it for ``typing.Protocol``. A dialect says how the prompt looks,
which tags open and close a search call and an answer, how a call's content becomes a query (or an
NL-DAG plan), how results and errors are written back, and which reward preset scores the episode. The
environment reads nothing else, so a new dialect is a new ``Dialect`` passed to
``gym.make("SearchQA-v0", protocol=...)`` or registered by name with :func:`register_protocol`; the
environment's code is untouched. The exact strings of the five built-ins come from
../shared/PROTOCOLS.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rewards.name_registry import Registry

from search_env.sources.base import Passage
from search_env.tool_calls import ToolCalling

__all__ = [
    "Dialect",
    "register_protocol",
    "get_protocol",
    "available_protocols",
    "SEARCH_R1_COMPACT",
    "SEED_PROTOCOLS",
    "SEARCH_R1_INVALID_ACTION",
    "TOOL_CALLS",
    "tool_calls_protocol",
]

DocFormatter = Callable[[Sequence[Passage]], str]


def _collapse(query: str) -> str:
    return " ".join(query.split())


def _r1_clean_query(query: str) -> str:
    return _collapse(query.replace('"', ""))


@dataclass(frozen=True)
class Dialect:
    """One tag dialect. Every field is plain data or a small function, so users can ``replace()`` one.

    Attributes:
        name: registry name, e.g. ``"search-r1"``.
        call_open / call_close: the tags around a search call written by the agent.
        answer_open / answer_close: the tags around the final answer; the close tag ends the episode.
        result_open / result_close: the tags the environment writes around results (the agent writing
            them itself is counted as an event).
        user_template: user message, ``{question}`` is filled in.
        system: optional system message (chat rendering) or preamble (plain rendering).
        base_template: optional full plain-text prompt for base models; used when no chat template is used.
        assistant_prefix: text appended after the rendered prompt (R1-Searcher opens ``<think>`` for the model).
        question_rule: turns the raw question into what the template receives.
        clean_query: turns the text between the call tags into the query sent to the source.
        call_kind: ``"query"`` (one query), ``"dag"`` (an NL-DAG plan of sub-queries) or ``"tools"``
            (native tool calls, read at the end of the agent's turn: :mod:`search_env.tool_calls`).
        result_prefix / result_suffix: written before / after the formatted documents.
        format_docs: formats the retrieved passages of one query.
        empty_results_text: what stands between the result tags when nothing was found.
        error_template: error observation; ``{message}`` is filled in. Masked like results.
        invalid_action_text: observation for a close tag with no open tag in the turn (None: use error_template).
        empty_query_ends_episode: R1-Searcher ends the episode on an empty query.
        answer_ends_episode: the answer's close tag ends the episode (ReSearch instead runs on to the
            end-of-sequence token, which its reward requires).
        top_k: passages per query.
        max_turns: searches allowed per episode (None: unlimited; a further call gets an error observation).
        reward: reward preset name in :mod:`rewards`.
        reward_options: keyword options for that preset.
        untrained_agent_spans: (open, close) pairs of agent-written spans that are not trained on.
        default_eos_string: the EOS text the reward's "solution" uses when the tokenizer has none of its own.
        stop_strings: where an LLM rollout should stop generating and hand the chunk to the environment.
        plan_tools: NL-DAG protocols: the tools the prompt offers a plan's nodes, as (name, what it
            searches) pairs, written where the system message holds ``{tools}``
            ("General (web search), News (news articles) or Academy (...)"). The environment keeps
            them when its sources serve every name and otherwise offers its own source names
            instead, so the prompt never names a tool the environment cannot run.
        thought_template: how the agent writes a thought (``{text}`` is filled in); ``"{text} "`` where
            thoughts have no tags of their own (R1-Searcher thinks inside the ``<think>`` its prompt
            opened; R-Search has no think tag).
        answer_template: what the agent writes between the answer tags (``{answer}`` is filled in);
            ReSearch's puts it in ``\\boxed{}``.
        answer_prefix: what the agent writes right before its answer (R1-Searcher's ``</think>``, which
            closes the think block the prompt opened).
        evidence_open / evidence_close: the tags of the evidence block the agent writes before its answer
            (R-Search's ``<original_evidence>``); None: the dialect has none.
        tool_calling: ``"tools"`` dialects: the call format, the tools and how the prompt and the tool
            turn are written (the environment fits it to its sources and tokenizer).
    """

    name: str
    call_open: str
    call_close: str
    result_open: str
    result_close: str
    user_template: str
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"
    system: str | None = None
    base_template: str | None = None
    assistant_prefix: str = ""
    question_rule: Callable[[str], str] = str.strip
    clean_query: Callable[[str], str] = _collapse
    call_kind: str = "query"
    result_prefix: str = ""
    result_suffix: str = ""
    format_docs: DocFormatter = lambda passages: "".join(f"({p.title}) {p.text}\n" for p in passages)
    empty_results_text: str = ""
    error_template: str = "{message}"
    invalid_action_text: str | None = None
    empty_query_ends_episode: bool = False
    answer_ends_episode: bool = True
    top_k: int = 3
    max_turns: int | None = 10
    reward: str = "search-r1"
    reward_options: dict[str, Any] = field(default_factory=dict)
    untrained_agent_spans: tuple[tuple[str, str], ...] = ()
    plan_tools: tuple[tuple[str, str], ...] = ()
    thought_template: str = "<think> {text} </think>"
    answer_template: str = "{answer}"
    answer_prefix: str = ""
    evidence_open: str | None = None
    evidence_close: str | None = None
    tool_calling: ToolCalling | None = None

    def __post_init__(self) -> None:
        for attr in ("call_open", "call_close", "answer_open", "answer_close"):
            if not getattr(self, attr):
                raise ValueError(f"protocol {self.name!r}: {attr} must be a non-empty string")
        if self.call_kind not in ("query", "dag", "tools"):
            raise ValueError(f"protocol {self.name!r}: call_kind must be 'query', 'dag' or 'tools', not {self.call_kind!r}")
        if (self.call_kind == "tools") != (self.tool_calling is not None):
            raise ValueError(f"protocol {self.name!r}: give tool_calling exactly when call_kind is 'tools'")
        if self.top_k < 1:
            raise ValueError(f"protocol {self.name!r}: top_k must be >= 1")
        for attr, slot in (("thought_template", "text"), ("answer_template", "answer")):
            _check_template(self.name, attr, getattr(self, attr), slot)
        if (self.evidence_open is None) != (self.evidence_close is None):
            raise ValueError(f"protocol {self.name!r}: give both evidence_open and evidence_close, or neither")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Where a rollout engine should stop generating (besides the EOS token). Tool calls run when the
        turn ends, at the EOS token, so only the answer's close tag stops a ``"tools"`` dialect's turn."""
        if self.call_kind == "tools":
            return (self.answer_close,)
        return (self.call_close, self.answer_close) if self.answer_ends_episode else (self.call_close,)

    def with_options(self, **changes: Any) -> "Dialect":
        """A copy with some fields changed (e.g. ``top_k=5`` for evaluation)."""
        return dataclasses.replace(self, **changes)

    # -- rendering -------------------------------------------------------------------------------
    def messages(self, question: str) -> list[dict[str, str]]:
        """Chat messages for ``question``: the system message (if any) and the user message."""
        messages = [{"role": "system", "content": self._with_tools(self.system)}] if self.system else []
        messages.append({"role": "user", "content": self.user_template.format(question=self.question_rule(question))})
        return messages

    @property
    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The tools for the chat template (``apply_chat_template(tools=...)``), where it lists them itself."""
        calling = self.tool_calling
        return calling.schemas() if calling is not None and calling.native_prompt else None

    def call_left_open(self, turn: bytes) -> bool:
        """Whether the text of a turn that a budget cut short holds a call that never ran."""
        if self.tool_calling is not None:
            return self.tool_calling.find(turn.decode("utf-8", "replace")) is not None
        return turn.rfind(self.call_open.encode()) > turn.rfind(self.call_close.encode())

    def plain_prompt(self, question: str) -> str:
        """The prompt without a chat template (base models, and tokenizers without one)."""
        q = self.question_rule(question)
        if self.base_template is not None:
            return self.base_template.format(question=q)
        body = self.user_template.format(question=q)
        return (f"{self._with_tools(self.system)}\n\n{body}" if self.system else body) + self.assistant_prefix

    @property
    def tools_text(self) -> str:
        """How the prompt lists :attr:`plan_tools`: ``"A (what), B (what) or C"``."""
        named = [f"{name} ({what})" if what else name for name, what in self.plan_tools]
        if len(named) <= 1:
            return "".join(named)
        return ", ".join(named[:-1]) + " or " + named[-1]

    def _with_tools(self, system: str) -> str:
        """A ``"tools"`` dialect's system message ends with its tool listing unless the chat template
        lists the tools itself. Otherwise ``{tools}`` becomes :attr:`tools_text`, and an example plan's
        ``{tool_1}``/``{tool_2}`` the first and second offered tools' names (the first when one is
        offered), so that the example never names a tool the environment does not have."""
        calling = self.tool_calling
        if calling is not None and not calling.native_prompt:
            return f"{system}\n\n{calling.listing()}"
        if not self.plan_tools:
            return system
        names = [name for name, _ in self.plan_tools]
        # str.replace, not str.format: system messages hold literal braces (ReSearch's \boxed{}).
        return (system.replace("{tools}", self.tools_text).replace("{tool_1}", names[0])
                .replace("{tool_2}", names[1] if len(names) > 1 else names[0]))

    def results_text(self, passages: Sequence[Passage]) -> str:
        """The whole observation appended after a successful call."""
        docs = self.format_docs(passages) if passages else self.empty_results_text
        return f"{self.result_prefix}{docs}{self.result_suffix}"

    def error_text(self, message: str) -> str:
        """An error observation (empty query, budget exhausted, source failure, invalid plan...)."""
        return self.error_template.format(message=message)


def _check_template(protocol: str, attr: str, template: str, slot: str) -> None:
    """A writing template must fill in its one slot (literal braces doubled, as in ``str.format``)."""
    marker = "\x00"
    try:
        filled = template.format(**{slot: marker})
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"protocol {protocol!r}: {attr} {template!r} is not a format string with only {{{slot}}} "
                         f"(double literal braces): {exc}") from None
    if marker not in filled:
        raise ValueError(f"protocol {protocol!r}: {attr} {template!r} has no {{{slot}}}")


# ---------------------------------------------------------------------------------------------------
# The five seed systems (strings from ../shared/PROTOCOLS.md)

SEARCH_R1_INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)

_SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)


def _search_r1_question(question: str) -> str:
    question = question.strip()
    return question if question.endswith("?") else question + "?"


SEARCH_R1 = Dialect(
    name="search-r1",
    call_open="<search>",
    call_close="</search>",
    result_open="<information>",
    result_close="</information>",
    user_template=_SEARCH_R1_PROMPT,
    question_rule=_search_r1_question,
    result_prefix="\n\n<information>",
    result_suffix="</information>\n\n",
    format_docs=lambda ps: "".join(f"Doc {i}(Title: {p.title}) {p.text}\n" for i, p in enumerate(ps, 1)),
    error_template="\n\n<information>{message}</information>\n\n",
    invalid_action_text=SEARCH_R1_INVALID_ACTION,
    top_k=3,
    max_turns=10,
    reward="search-r1",
)

_R1_INSTRUCTION = (
    "The User asks a question, and the Assistant solves it. The Assistant first thinks about the reasoning "
    "process in the mind and then provides the User with the final answer. The output format of reasoning "
    'process and final answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, '
    'i.e., "<think> reasoning process here </think><answer> final answer here </answer>". During the thinking '
    "process, the Assistant can perform searching for uncertain knowledge if necessary with the format of "
    '"<|begin_of_query|> search query (only list keywords, such as "keyword_1 keyword_2 ...")<|end_of_query|>". '
    "A query must involve only a single triple. Then, the search system will provide the Assistant with the "
    'retrieval information with the format of "<|begin_of_documents|> ...search results... <|end_of_documents|>".'
)

R1_SEARCHER = Dialect(
    name="r1-searcher",
    call_open="<|begin_of_query|>",
    call_close="<|end_of_query|>",
    result_open="<|begin_of_documents|>",
    result_close="<|end_of_documents|>",
    system=_R1_INSTRUCTION,
    user_template="{question}",
    base_template=_R1_INSTRUCTION + "\n\nUser:{question}\nAssistant: <think>",
    assistant_prefix="<think>",
    clean_query=_r1_clean_query,
    result_prefix="\n\n<|begin_of_documents|>\n",
    result_suffix="<|end_of_documents|>\n\n",
    format_docs=lambda ps: "".join(f"({i}){p.title}\n{p.text}\n" for i, p in enumerate(ps, 1)),
    empty_results_text="None",
    error_template="\n\n<|begin_of_documents|>\n{message}<|end_of_documents|>\n\n",
    empty_query_ends_episode=True,
    top_k=3,
    max_turns=8,
    reward="r1-searcher",
    thought_template="{text} ",
    answer_prefix="</think>",
)

_RESEARCH_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. During thinking, the assistant can invoke the wikipedia search tool to search for fact "
    "information about specific topics if needed. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags respectively, and the search query and result are enclosed "
    "within <search> </search> and <result> </result> tags respectively. For example, <think> This is the "
    "reasoning process. </think> <search> search query here </search> <result> search result here </result> "
    "<think> This is the reasoning process. </think> <answer> The final answer is \\[ \\boxed{{answer here}} "
    "\\] </answer>. In the last part of the answer, the final exact answer is enclosed within \\boxed{{}} with "
    "latex format."
)

RESEARCH = Dialect(
    name="research",
    call_open="<search>",
    call_close="</search>",
    result_open="<result>",
    result_close="</result>",
    system=_RESEARCH_INSTRUCTION.replace("{{", "{").replace("}}", "}"),
    user_template="{question}",
    base_template=_RESEARCH_INSTRUCTION + " User: {question}. Assistant:",
    result_prefix=" <result>\n",
    result_suffix="\n</result>",
    format_docs=lambda ps: "\n\n".join(f"{p.title}\n{p.text}" for p in ps),
    error_template=" <result>\n{message}\n</result>",
    answer_ends_episode=False,
    top_k=5,
    max_turns=None,
    reward="research",
    answer_template="The final answer is \\[ \\boxed{{{answer}}} \\]",
)

_R_SEARCH_SYSTEM = (
    "You are a helpful assistant that can solve the given question step by step. For each step, start by "
    "explaining your thought process. If additional information is needed, provide a specific query enclosed "
    "in <search> and </search>. The system will return the top search results within <observation> and "
    "</observation>. You can perform multiple searches as needed.\nWhen you know the final answer, use "
    "<original_evidence> and </original_evidence> to provide all potentially relevant original information "
    "from the observations. Ensure the information is complete and preserves the original wording without "
    "modification. If no searches were conducted or observations were made, omit the evidence section. "
    "Finally, provide the final answer within <answer> and </answer> tags."
)

R_SEARCH = Dialect(
    name="r-search",
    call_open="<search>",
    call_close="</search>",
    result_open="<observation>",
    result_close="</observation>",
    system=_R_SEARCH_SYSTEM,
    user_template="{question}",
    result_prefix="\n\n<observation>",
    result_suffix="</observation>\n\n",
    format_docs=lambda ps: "".join(f"(Title: {p.title}) {p.text}\n" for p in ps),
    error_template="\n\n<observation>{message}</observation>\n\n",
    top_k=3,
    max_turns=4,
    reward="r-search",
    thought_template="{text} ",
    evidence_open="<original_evidence>",
    evidence_close="</original_evidence>",
)

_REASONING_SEARCH_SYSTEM = (
    "Answer the user's question by planning searches. Write exactly four sections, in this order: "
    "<think> your reasoning </think>, then <search> a search plan </search>, then wait: the system fills in "
    "<result> ... </result> (never write <result> yourself), then <answer> the final answer </answer>.\n"
    "The search plan is a graph of sub-queries. Write a line 'Nodes:' followed by one line per node, "
    "'Label: sub-query (Tool)', where Label is one capital letter, the sub-query has at most 10 words and Tool "
    "is {tools}. Then write a "
    "line 'Edges:' followed by edges 'A -> B' (B needs the answer of A), several separated by ';'. Use at most "
    "8 nodes, edges only between declared nodes, no self-loops and no cycles. Use no other tags and no "
    "Markdown.\nExample plan:\nNodes:\nA: US tariffs 2024 ({tool_2})\nB: Tariffs impact on 401k & CPI ({tool_1})\n"
    "C: new US tariff list commodities 2024 ({tool_2})\nEdges:\nA -> B ; C -> B"
)


def _dag_docs(passages: Sequence[Passage]) -> str:
    return "".join(f"Doc {i}(Title: {p.title}) {p.text}\n" for i, p in enumerate(passages, 1))


REASONING_SEARCH = Dialect(
    name="reasoning-search",
    call_open="<search>",
    call_close="</search>",
    result_open="<result>",
    result_close="</result>",
    system=_REASONING_SEARCH_SYSTEM,
    user_template="{question}",
    call_kind="dag",
    result_prefix="\n<result>\n",
    result_suffix="\n</result>\n",
    format_docs=_dag_docs,
    empty_results_text="No results.\n",
    error_template="\n<result>\n{message}\n</result>\n",
    top_k=3,
    max_turns=1,
    reward="reasoning-search",
    plan_tools=(("General", "web search"), ("News", "news articles"), ("Academy", "papers; use English keywords")),
)

# ---------------------------------------------------------------------------------------------------
# Derived dialects

SEARCH_R1_COMPACT = SEARCH_R1.with_options(
    name="search-r1-compact",
    user_template="Question: {question}\n",
    result_prefix="\n<information>",
    result_suffix="</information>\n",
    format_docs=lambda ps: "".join(f"{p.text}\n" for p in ps),
    error_template="\n<information>{message}</information>\n",
    top_k=2,
)
"""Search-R1's tags, stop strings and reward with a one-line prompt and results without the ``Doc i(Title:
...)`` prefixes, for a small model trained from scratch (the embedded demo): it gets nothing from
instruction text, and every token of context costs it compute, so an episode is about half as long."""

_TOOL_CALLS_SYSTEM = (
    "Answer the given question. You may reason inside <think> and </think>. If you lack some knowledge, call "
    "the search tools, as many times as you want; several calls in one turn run together. When you need no "
    "further knowledge, give the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>."
)


def tool_calls_protocol(call_format: str = "hermes", **changes: Any) -> Dialect:
    """The ``tool-calls`` protocol (:mod:`search_env.tool_calls`) with calls in ``call_format``
    (``hermes``: ``tool-calls``; ``llama3``, ``mistral``: ``tool-calls-llama3``, ``tool-calls-mistral``), other
    fields changed by ``changes``. Results, answer and reward are Search-R1's: ``Doc i(Title: ...)`` passages,
    the last ``<answer>`` scored by EM. ``call_open``/``call_close`` are the format's call tags (``{``/``}`` for
    ``llama3``'s lone JSON calls, ``]`` closing ``mistral``'s list): the environment reads calls with the call
    format, never by them."""
    calling = ToolCalling(call_format=call_format)
    fields: dict[str, Any] = dict(
        name="tool-calls" if call_format == "hermes" else f"tool-calls-{call_format}", call_kind="tools",
        tool_calling=calling, call_open=calling.format.call_open or "{",
        call_close=calling.format.call_close or ("]" if calling.format.json_lists else "}"),
        result_open="<tool_response>", result_close="</tool_response>", system=_TOOL_CALLS_SYSTEM,
        user_template="Question: {question}\n", question_rule=_search_r1_question, empty_results_text="No results.",
        format_docs=lambda ps: "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(ps, 1)),
        error_template="Error: {message}", top_k=3, max_turns=10, reward="search-r1",
    )
    return Dialect(**{**fields, **changes})


TOOL_CALLS = tool_calls_protocol()

_REGISTRY: Registry[Dialect] = Registry("protocol")
for _seed in (SEARCH_R1, R1_SEARCHER, RESEARCH, R_SEARCH, REASONING_SEARCH):
    _REGISTRY.add(_seed.name, _seed)
del _seed

SEED_PROTOCOLS: tuple[str, ...] = tuple(_REGISTRY)
"""The five seed systems' protocols (registered at import; :func:`available_protocols` also lists the
derived dialects and any protocol registered since, e.g. by a plug-in)."""

for _derived in (SEARCH_R1_COMPACT, TOOL_CALLS, tool_calls_protocol("llama3"), tool_calls_protocol("mistral")):
    _REGISTRY.add(_derived.name, _derived)
del _derived


def register_protocol(protocol: Dialect, *, replace: bool = False) -> Dialect:
    """Make ``protocol`` available by name to ``gym.make("SearchQA-v0", protocol=name)``.

    Registering a name taken by another dialect raises ``ValueError`` unless ``replace=True`` (the keyword
    every registry of the project uses), so two plug-ins cannot silently clash.
    """
    return _REGISTRY.add(protocol.name, protocol, replace=replace)


def get_protocol(protocol: str | Dialect) -> Dialect:
    """The registered protocol of that name (or ``protocol`` itself when it already is one);
    :class:`~rewards.UnknownNameError` lists the known names."""
    if isinstance(protocol, Dialect):
        return protocol
    return _REGISTRY.lookup(protocol)


def available_protocols() -> list[str]:
    """Names of every registered protocol."""
    return _REGISTRY.names()

