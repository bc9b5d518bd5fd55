"""Native tool calling, the ``tool-calls`` protocol: search calls written the way chat models call tools.

Every source of the environment is one search tool, named as the source and described by its
``description`` where it has one (:func:`describe_source`), taking ``{"query": string}``.
The agent writes one or more calls in its model family's format (the call format, :data:`CALL_FORMATS`)
and ends its turn with its end-of-sequence token (``<|im_end|>`` for a ChatML model); the environment
then reads every call of the turn, runs them as parallel searches (one plan of independent nodes, so
calls to one source share a batch), and appends one tool turn with a response per call, in call order.
A turn that ends without a call ends the episode, as a chat turn without a tool call ends a chat. The
final answer is written as ``<answer> ... </answer>``, whose close tag ends the episode.

Call formats:

* ``hermes`` (Hermes, Qwen2.5 and Qwen3): one block per call,
  ``<tool_call>\\n{"name": "wiki", "arguments": {"query": "..."}}\\n</tool_call>``;
* ``llama3`` (Llama 3.1 to 3.3 JSON calls): the turn's text after its reasoning (after its last
  ``</think>``; a leading ``<|python_tag|>`` is skipped) is one or more JSON objects
  ``{"name": "wiki", "parameters": {"query": "..."}}`` (one after another, or in a JSON list);
* ``mistral`` (Mistral's ``[TOOL_CALLS]``, as Mistral-7B-Instruct-v0.3 writes it): ``[TOOL_CALLS]``, then
  the turn's calls as one JSON list ``[{"name": "wiki", "arguments": {"query": "..."}}, ...]`` (an ``id``
  beside ``name`` is allowed; several ``[TOOL_CALLS]`` in a turn add their calls).

Every format accepts ``arguments`` or ``parameters``, and arguments given as a JSON string.

Prompt: where the tokenizer's chat template renders tools (``apply_chat_template(messages, tools=...)``
changes the text), the template lists them, in transformers' JSON-schema tool format
(:meth:`ToolCalling.schemas`). Otherwise (no chat template, as the built-in tokenizer; a template that
ignores ``tools``) the system message ends with the fallback listing, :meth:`ToolCalling.listing`:
the call format's instructions around one JSON schema per line (for ``hermes``, Qwen2.5's own text), or
for ``mistral`` a JSON list of them in Mistral's ``[AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS]``.

Tool turn: with a chat template, the template's own rendering of tool messages (:func:`template_turn`:
the text a conversation gains when tool messages follow the assistant's turn, plus what the template
writes after the end-of-sequence token that closed that turn). Without one (or where the template
cannot render tool messages after an assistant turn, as Mistral's, which asks for call ids the model
never wrote) the fallback :data:`FALLBACK_TURN`: ``\\n<tool_response>\\n{result}\\n</tool_response>\\n`` per call.
The whole turn is encoded once.

Bad calls never raise: broken JSON, an unknown tool, arguments of the wrong type, an empty query, a
call cut off by the end of the turn, calls beyond the search budget or past :data:`MAX_CALLS_PER_TURN`
each get an error response in their slot of the tool turn, and a counter
(:meth:`ParsedCall.counter`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

__all__ = [
    "CALL_FORMATS", "CallFormat", "FALLBACK_TURN", "MAX_CALLS_PER_TURN", "ParsedCall", "ToolCalling",
    "describe_source", "fit_protocol", "fit_tool_calling", "template_turn",
]

#: Calls read from one turn at most; further calls get an error response.
MAX_CALLS_PER_TURN = 8

#: The tool turn without a chat template: (head, between two responses, tail) around the responses.
FALLBACK_TURN = ("\n<tool_response>\n", "\n</tool_response>\n<tool_response>\n", "\n</tool_response>\n")

#: What a tool is said to search when its source has no ``description`` of its own.
_KNOWN_SOURCES = {
    "all": "every collection at once", "wiki": "encyclopedia articles", "news": "news articles",
    "papers": "research papers",
}


_COUNTERS = {"empty": "empty_queries", "cut": "unterminated_calls", "budget": "budget_exhausted_calls"}


@dataclass(frozen=True)
class ParsedCall:
    """One call as read from a turn: the tool ``name`` and ``query``, or the ``error`` that makes it
    unusable (``kind`` says which counter it goes to: ``invalid``, ``empty``, ``cut`` or ``budget``)."""

    name: str | None = None
    query: str | None = None
    error: str | None = None
    kind: str = "invalid"

    @property
    def counter(self) -> str:
        """The episode counter a bad call adds to."""
        return _COUNTERS.get(self.kind, "invalid_calls")


def _bad(error: str, kind: str = "invalid") -> ParsedCall:
    return ParsedCall(error=error, kind=kind)


def _call_from_value(value: Any) -> ParsedCall:
    """A decoded JSON call ``{"name": ..., "arguments" | "parameters": {"query": ...}}`` checked."""
    if not isinstance(value, dict):
        return _bad('a call must be a JSON object {"name": ..., "arguments": {"query": ...}}')
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return _bad('the call has no "name" string')
    args = value.get("arguments", value.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return _bad(f"the arguments of {name!r} are not valid JSON")
    if not isinstance(args, dict):
        return _bad(f'the call of {name!r} has no "arguments" object')
    extra = sorted(set(args) - {"query"})
    if extra:
        return _bad(f"{name!r} takes only \"query\", not {', '.join(map(repr, extra))}")
    query = args.get("query")
    if not isinstance(query, str):
        return _bad(f'"query" of {name!r} must be a string, not {type(query).__name__ if "query" in args else "missing"}')
    query = " ".join(query.split())
    if not query:
        return _bad("the query is empty", "empty")
    return ParsedCall(name=name.strip(), query=query)


def _json_call(text: str) -> ParsedCall:
    try:
        return _call_from_value(json.loads(text))
    except json.JSONDecodeError as exc:
        return _bad(f"the call is not valid JSON ({exc.msg} at character {exc.pos})")


def _unclosed(text: str) -> bool:
    """Whether JSON ``text`` ends inside a string or an open object or list (a call cut off)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return in_string or depth > 0


@dataclass(frozen=True)
class CallFormat:
    """A model family's way of writing tool calls.

    Attributes:
        name: what ``call_format=`` names.
        call_open / call_close: the text around one call's JSON ('' where the JSON stands alone).
        arguments_key: the key the family writes the arguments under.
        find: where a turn's calls begin (their character offset), or None when it holds no call.
        read: the calls of a turn that holds some.
        instructions: the fallback listing's text; ``{schemas}`` is filled in, one JSON schema a line (the
            items of one JSON list with ``json_lists``).
        json_lists: the family writes a turn's calls, and the listing its schemas, as one JSON list after
            ``call_open`` (Mistral's), not one call a line.
    """

    name: str
    call_open: str
    call_close: str
    arguments_key: str
    find: Callable[[str], int | None]
    read: Callable[[str], list[ParsedCall]]
    instructions: str
    json_lists: bool = False

    def write(self, calls: Sequence[tuple[str, str]]) -> str:
        """The text of ``calls`` ((tool, query) pairs) as the family writes them, one a line (or one list)."""
        lines = [json.dumps({"name": tool, self.arguments_key: {"query": query}}, ensure_ascii=False) for tool, query in calls]
        if self.json_lists:
            return f"{self.call_open} [{', '.join(lines)}]"
        if not self.call_open:
            return "\n".join(lines)
        return "\n".join(f"{self.call_open}\n{line}\n{self.call_close}" for line in lines)


_HERMES_CALL = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.S)


def _hermes_find(turn: str) -> int | None:
    at = turn.find("<tool_call>")
    return None if at == -1 else at


def _hermes_read(turn: str) -> list[ParsedCall]:
    calls = []
    for match in _HERMES_CALL.finditer(turn):
        if not match.group(2):
            calls.append(_bad("the call was cut off before </tool_call>", "cut"))
        else:
            calls.append(_json_call(match.group(1)))
    return calls


def _llama3_region(turn: str) -> tuple[int, str]:
    """The offset and text of a turn's call region: after its last ``</think>``, stripped, without a
    leading ``<|python_tag|>``."""
    at = turn.rfind("</think>")
    at = 0 if at == -1 else at + len("</think>")
    region = turn[at:]
    at += len(region) - len(region.lstrip())
    region = region.strip()
    if region.startswith("<|python_tag|>"):
        region = region[len("<|python_tag|>"):].lstrip()
    return at, region


def _llama3_find(turn: str) -> int | None:
    at, region = _llama3_region(turn)
    return at if region.startswith(("{", "[")) else None


def _llama3_read(turn: str) -> list[ParsedCall]:
    return _read_json_calls(_llama3_region(turn)[1])


def _read_json_calls(region: str) -> list[ParsedCall]:
    """The calls of ``region``: JSON objects one after another (``;`` or ``,`` between them allowed) or in
    JSON lists; what does not decode is one last bad call (cut off where the JSON never closed)."""
    decoder, pos, calls = json.JSONDecoder(), 0, []
    while pos < len(region):
        try:
            value, pos = decoder.raw_decode(region, pos)
        except json.JSONDecodeError as exc:
            rest = region[pos:]
            if _unclosed(rest):
                calls.append(_bad("the call was cut off before its JSON closed", "cut"))
            else:
                calls.append(_bad(f"the call is not valid JSON ({exc.msg} at character {exc.pos})"))
            break
        calls.extend(_call_from_value(v) for v in (value if isinstance(value, list) else [value]))
        while pos < len(region) and (region[pos].isspace() or region[pos] in ";,"):
            pos += 1
    return calls


_MISTRAL_OPEN = "[TOOL_CALLS]"


def _mistral_find(turn: str) -> int | None:
    at = turn.find(_MISTRAL_OPEN)
    return None if at == -1 else at


def _mistral_read(turn: str) -> list[ParsedCall]:
    calls = []
    for region in turn.split(_MISTRAL_OPEN)[1:]:
        found = _read_json_calls(region.strip())
        calls.extend(found or [_bad(f"no call follows {_MISTRAL_OPEN}")])
    return calls


_HERMES_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\nFor each function "
    "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)

_LLAMA3_INSTRUCTIONS = (
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    'that best answers the given prompt.\n\nRespond in the format {{"name": function name, "parameters": '
    "dictionary of argument name and its value}}. Do not use variables. Several calls go one per line.\n\n{schemas}"
)

_MISTRAL_INSTRUCTIONS = (
    "[AVAILABLE_TOOLS] [{schemas}][/AVAILABLE_TOOLS]\n\nTo call functions, write [TOOL_CALLS] followed by a JSON "
    'list of the calls:\n[TOOL_CALLS] [{{"name": <function-name>, "arguments": <args-json-object>}}]'
)

CALL_FORMATS: dict[str, CallFormat] = {
    "hermes": CallFormat("hermes", "<tool_call>", "</tool_call>", "arguments", _hermes_find, _hermes_read, _HERMES_INSTRUCTIONS),
    "llama3": CallFormat("llama3", "", "", "parameters", _llama3_find, _llama3_read, _LLAMA3_INSTRUCTIONS),
    "mistral": CallFormat("mistral", _MISTRAL_OPEN, "", "arguments", _mistral_find, _mistral_read, _MISTRAL_INSTRUCTIONS,
                          json_lists=True),
}
"""The call formats by name (what ``call_format=`` takes)."""


@dataclass(frozen=True)
class ToolCalling:
    """What the ``tool-calls`` protocol knows beyond its tags: the call format, the tools offered, and
    how the prompt and the tool turn are written for the environment's tokenizer.

    Attributes:
        call_format: a key of :data:`CALL_FORMATS`.
        tools: (name, what it searches) per tool; the environment offers its sources here
            (:func:`fit_tool_calling`), its default source first.
        native_prompt: the chat template lists the tools itself (``apply_chat_template(tools=...)``);
            False: the system message holds :meth:`listing`.
        turn: the tool turn's (head, between two responses, tail).
    """

    call_format: str = "hermes"
    tools: tuple[tuple[str, str], ...] = (("search", "a search engine"),)
    native_prompt: bool = False
    turn: tuple[str, str, str] = FALLBACK_TURN

    def __post_init__(self) -> None:
        if self.call_format not in CALL_FORMATS:
            raise ValueError(f"unknown call_format {self.call_format!r}; choose one of {', '.join(CALL_FORMATS)}")
        if not self.tools:
            raise ValueError("tool calling needs at least one tool")

    @property
    def format(self) -> CallFormat:
        return CALL_FORMATS[self.call_format]

    @property
    def default_tool(self) -> str:
        """The first tool: where a single query goes (the environment's default source)."""
        return self.tools[0][0]

    def schemas(self) -> list[dict[str, Any]]:
        """The tools in transformers' JSON-schema tool format (what ``apply_chat_template(tools=)`` takes)."""
        return [
            {"type": "function", "function": {
                "name": name, "description": f"Search {what}." if what else "Search.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "the search query"}},
                               "required": ["query"]},
            }}
            for name, what in self.tools
        ]

    def listing(self) -> str:
        """The fallback tool listing for the system message: the format's instructions around the schemas."""
        between = ", " if self.format.json_lists else "\n"
        schemas = between.join(json.dumps(schema, ensure_ascii=False) for schema in self.schemas())
        return self.format.instructions.format(schemas=schemas)

    def find(self, turn: str) -> int | None:
        """The offset where the turn's calls begin, or None when it holds no call."""
        return self.format.find(turn)

    def read(self, turn: str) -> list[ParsedCall]:
        """The calls of ``turn`` (a turn :meth:`find` found calls in)."""
        return self.format.read(turn)

    def write(self, calls: Sequence[tuple[str, str]]) -> str:
        """``calls`` ((tool, query) pairs) written in the call format."""
        return self.format.write(calls)

    def tool_turn(self, responses: Sequence[str]) -> str:
        """The tool turn holding ``responses``, one per call, in call order."""
        head, between, tail = self.turn
        return head + between.join(responses) + tail


def describe_source(name: str, source: Any) -> str:
    """What a tool searches: the source's own ``description`` when it has one (looked for through the
    cache and time-limit wrappers, which keep the source they wrap as ``source``), else a known name's."""
    for _ in range(4):
        described = getattr(source, "description", None)
        if isinstance(described, str) and described.strip():
            return described.strip()
        source = getattr(source, "source", None)
    return _KNOWN_SOURCES.get(name.lower(), f"the {name} collection")


_SENTINEL, _MARKS = "TOOLCALLSASSISTANTTEXT", ("TOOLCALLSRESULTZERO", "TOOLCALLSRESULTONE")


def template_turn(render: Callable[..., str], messages: list[dict[str, Any]], eos_text: str | None,
                  calling: ToolCalling) -> tuple[str, str, str] | None:
    """The chat template's tool turn as (head, between, tail), or None where the template cannot render
    tool messages after an assistant turn the way the environment needs.

    ``render(messages, tools=..., add_generation_prompt=...)`` renders with the template. The turn is
    what the conversation gains when two tool messages follow an assistant turn with two calls, ending
    in the next assistant turn's opening, preceded by what the template writes after the
    end-of-sequence text ``eos_text`` that closes the assistant's turn (ChatML's newline after
    ``<|im_end|>``): the agent's own end-of-sequence token stands for that text up to its end. A template
    that takes one call per turn (Llama 3.1's) is asked with one call."""
    tool = calling.default_tool
    tools = calling.schemas() if calling.native_prompt else None
    for queries in (("a", "b"), ("a",)):
        calls = [{"type": "function", "function": {"name": tool, "arguments": {"query": q}}} for q in queries]
        said = [*messages, {"role": "assistant", "content": _SENTINEL, "tool_calls": calls}]
        answered = said + [{"role": "tool", "name": tool, "content": mark} for mark in _MARKS]
        try:
            before = render(said, tools=tools, add_generation_prompt=False)
            after = render(answered, tools=tools, add_generation_prompt=True)
            break
        except Exception:  # noqa: BLE001 - a template that cannot render this conversation falls back
            continue
    else:
        return None
    if not after.startswith(before) or _SENTINEL not in before or not eos_text:
        return None
    closing = before[before.rindex(_SENTINEL) + len(_SENTINEL):]
    if eos_text not in closing:
        return None
    added = after[len(before):]
    if added.count(_MARKS[0]) != 1 or added.count(_MARKS[1]) != 1:
        return None
    head, rest = added.split(_MARKS[0])
    between, tail = rest.split(_MARKS[1])
    return closing[closing.rindex(eos_text) + len(eos_text):] + head, between, tail


def fit_protocol(protocol: Any, sources: Mapping[str, Any], default_source: str, codec: Any, use_chat: bool) -> Any:
    """A ``"tools"`` dialect fitted to an environment (:func:`fit_tool_calling`): its sources, and its
    tokenizer's chat template where the prompt is rendered with it (``use_chat``)."""
    calling = protocol.tool_calling
    bare = protocol.with_options(tool_calling=replace(calling, native_prompt=True)).messages("Question")
    fitted = fit_tool_calling(calling, sources, default_source, render=codec.render_chat if use_chat else None,
                              messages=bare, eos_text=getattr(codec.tokenizer, "eos_token", None))
    return protocol.with_options(tool_calling=fitted)


def fit_tool_calling(calling: ToolCalling, sources: Mapping[str, Any], default_source: str, *,
                     render: Callable[..., str] | None, messages: list[dict[str, Any]], eos_text: str | None) -> ToolCalling:
    """``calling`` fitted to an environment: its sources as the tools (the default source first), and
    with a chat template (``render``, which renders ``messages``-like conversations) whether it lists
    tools itself and its tool turn. Without ``render`` (no chat template) the fallbacks are kept."""
    names = [default_source, *(name for name in sources if name != default_source)]
    fitted = replace(calling, tools=tuple((name, describe_source(name, sources[name])) for name in names),
                     native_prompt=False, turn=FALLBACK_TURN)
    if render is None:
        return fitted
    try:
        native = render(messages, tools=fitted.schemas(), add_generation_prompt=True) != render(
            messages, tools=None, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that rejects tools lists them in the system message
        native = False
    fitted = replace(fitted, native_prompt=native)
    turn = template_turn(render, messages, eos_text, fitted)
    return fitted if turn is None else replace(fitted, turn=turn)
