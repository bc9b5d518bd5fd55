"""A Source that calls a tool of an MCP (Model Context Protocol) server: any search an MCP server offers
(a web search, a company wiki, a code index) becomes a named source of the environment.

The server is started by a command and spoken to over its stdin/stdout (stdio transport), or reached by
URL (streamable HTTP transport). Each query is one ``tools/call`` of the tool, with the query and the
number of passages as arguments. What the tool returns becomes passages: a JSON list of
``{id, title, text}`` (or wiki-18 ``{id, contents}``) objects when the server returns that, in its
structured content or in its text blocks, else one passage per text block.

Why a private event loop: the MCP client is async, the environment's sources are synchronous and called
from many threads at once (a vector environment, the NL-DAG executor). One background thread runs an
asyncio loop that owns the connection for the source's lifetime; ``search`` hands its queries to that
loop and waits for them, so every query of every caller is in flight at once on one connection.

Why a deadline per call: a server that hangs must not stall an episode. ``timeout_s`` is the most a
``search`` call waits; past it, or when the server has died or the tool reports an error, the call raises
:class:`SourceError` (an error observation in the environment, a one-line message) and the counters
``failed_searches`` (and ``timeouts``) say how often.

Needs the ``mcp`` extra (``pip install -e '.[mcp]'``); ``examples/mcp_search_server.py`` is a server to try.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shlex
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from search_env._optional import requires_extra
from search_env.sources.base import Passage, Source, SourceError
from search_env.sources.registry import Corpus, SourceOptions, register_source
from search_env.sources.retrieve_api import document_to_passage

__all__ = ["DEFAULT_START_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "MCPSource", "register_mcp_source", "tool_result_passages"]

DEFAULT_TIMEOUT_S = 10.0
"""Default deadline of one ``search`` call. Longer than a retrieval server's: an MCP tool may search a
remote service; short enough that a hung server costs an episode seconds, not a training step."""

DEFAULT_START_TIMEOUT_S = 30.0
"""Default time for the server to start and answer the MCP handshake (a server may build an index first)."""

_CLOSE_TIMEOUT_S = 10.0  # the stdio transport closes stdin, waits 2 s, sends SIGTERM, waits 2 s, kills


class MCPSource(Source):
    """A tool of an MCP server as a search source.

    Args:
        command: the command that starts a stdio server: a list of arguments, or one string split
            the shell's way. Give this or ``url``.
        url: the streamable-HTTP endpoint of a running server (``http://host:port/mcp``).
        tool: the tool that searches.
        name: the source name the environment and NL-DAG plans use.
        query_argument: the tool's argument that takes the query.
        k_argument: the tool's argument that takes the number of passages; None when the tool has none
            (the passages are cut to ``k`` here either way).
        arguments: further arguments sent with every call.
        timeout_s: deadline of one ``search`` call (all its queries); default :data:`DEFAULT_TIMEOUT_S`.
        start_timeout_s: deadline for starting and connecting; default :data:`DEFAULT_START_TIMEOUT_S`.
        env: environment variables for a stdio server, over the MCP SDK's safe defaults (``PATH``,
            ``HOME``, ...; the SDK does not pass the rest of this process's environment on purpose).
        cwd: the working directory of a stdio server.

    The server starts (and the tool is looked up) here: a command that cannot start, a server that
    does not answer, or a missing tool raises :class:`SourceError` with one line saying why. ``search``
    is thread-safe; every failure reaches the caller as :class:`SourceError`. :meth:`close` ends the
    session and stops a stdio server (stdin closed, then SIGTERM, then SIGKILL).

    Counters: ``tool_calls`` (one per query sent), ``failed_searches`` (``search`` calls that raised)
    and ``timeouts`` (those of them that ran out of time).
    """

    def __init__(
        self,
        command: str | Sequence[str] | None = None,
        *,
        url: str | None = None,
        tool: str = "search",
        name: str = "mcp",
        query_argument: str = "query",
        k_argument: str | None = "k",
        arguments: Mapping[str, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("MCPSource needs exactly one of command= (a stdio server) and url= (a streamable-HTTP server)")
        if timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError(f"timeout_s and start_timeout_s must be positive, got {timeout_s} and {start_timeout_s}")
        with requires_extra("mcp", "MCPSource"):  # here, not on the loop's thread, so a missing extra is said plainly
            import mcp  # noqa: F401
        self.command: list[str] | None = None
        if command is not None:
            self.command = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
            if not self.command:
                raise ValueError("MCPSource: the server command is empty")
        self.url = url
        self.tool = tool
        self.name = name
        self.query_argument = query_argument
        self.k_argument = k_argument
        self.arguments = dict(arguments or {})
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.tool_calls = 0
        self.failed_searches = 0
        self.timeouts = 0
        self._counter_lock = threading.Lock()
        self._closed = False
        self._ended: str | None = None  # why the connection ended on its own, once it has
        self._session: Any = None
        self._starting: Any = None  # the start's cancel scope, on the loop, until the handshake is done
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"MCPSource-{name}", daemon=True)
        self._thread.start()
        self._stop = asyncio.Event()  # bound to the loop that first waits on it (Python 3.10+)
        ready: Future[None] = Future()
        self._lifetime = self._submit(self._connect(ready, env, cwd))
        try:
            ready.result(timeout=start_timeout_s + _CLOSE_TIMEOUT_S)  # the start's own deadline comes first
        except FutureTimeout:
            self.close()
            raise SourceError(f"source {name!r}: the MCP server {self._server} did not start within {start_timeout_s:g} s") from None
        except Exception as exc:
            self.close()
            raise SourceError(f"source {name!r}: cannot start the MCP server {self._server}: {_describe(exc)}") from None

    @property
    def fork_safe(self) -> bool:
        """False: the connection lives on this process's event-loop thread (and its server's pipes)."""
        return False

    @property
    def _server(self) -> str:
        return shlex.join(self.command) if self.command is not None else str(self.url)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """At most ``k`` passages per query, one tool call per query, all in flight at once; raises
        SourceError when the server fails, has died or does not answer within ``timeout_s``."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not a single string")
        queries = list(queries)
        if not all(isinstance(q, str) for q in queries):
            raise SourceError(f"source {self.name!r}: every query must be a string")
        if not queries or k <= 0:
            return [[] for _ in queries]
        if self._closed:
            raise SourceError(f"source {self.name!r} is closed")
        if self._ended is not None:
            self._count_failure(timed_out=False)
            raise SourceError(f"source {self.name!r}: the MCP server {self._server} is gone: {self._ended}")
        try:
            future = self._submit(self._search_all(queries, k))
        except RuntimeError:  # the loop was closed by a close() on another thread
            raise SourceError(f"source {self.name!r} is closed") from None
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            future.cancel()
            self._count_failure(timed_out=True)
            raise SourceError(f"source {self.name!r}: no reply from the MCP server {self._server} within "
                              f"{self.timeout_s:g} s ({len(queries)} queries)") from None
        except SourceError:
            self._count_failure(timed_out=False)
            raise
        except Exception as exc:  # the session's own errors (connection closed, protocol errors)
            self._count_failure(timed_out=False)
            raise SourceError(f"source {self.name!r}: MCP tool {self.tool!r} failed: {_describe(exc)}") from None

    def close(self) -> None:
        """End the session and stop a stdio server; waits for both (bounded). Searches after it raise SourceError."""
        if self._closed:
            return
        self._closed = True
        if not self._loop.is_closed():
            if self._session is None:  # still starting (close from __init__): stop waiting for the server
                self._loop.call_soon_threadsafe(self._stop_starting)
            else:
                self._loop.call_soon_threadsafe(self._stop.set)
            with contextlib.suppress(Exception):
                self._lifetime.result(timeout=_CLOSE_TIMEOUT_S)
            with contextlib.suppress(Exception):
                self._submit(_cancel_other_tasks()).result(timeout=_CLOSE_TIMEOUT_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=_CLOSE_TIMEOUT_S)
            if not self._thread.is_alive():
                self._loop.close()

    def _stop_starting(self) -> None:
        """On the loop: end a start still in progress. Through the start's anyio cancel scope, which
        cancels until the task has left it; a bare task cancel can be absorbed by the SDK's own scopes."""
        if self._starting is not None:
            self._starting.cancel()
        else:  # the task has not run yet
            self._lifetime.cancel()

    def _submit(self, coroutine: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _count_failure(self, *, timed_out: bool) -> None:
        with self._counter_lock:
            self.failed_searches += 1
            self.timeouts += int(timed_out)

    async def _connect(self, ready: Future[None], env: Mapping[str, str] | None, cwd: str | os.PathLike[str] | None) -> None:
        """The connection's whole life, in one task (the SDK's contexts are entered and left in the same
        task): open the transport and session, find the tool, say ready, wait for :meth:`close`. The
        start has ``start_timeout_s`` to finish, as an anyio deadline: it unwinds the SDK's contexts
        (which stop a stdio server) before ``ready`` says the start timed out."""
        import anyio
        from mcp import ClientSession

        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self.start_timeout_s) as starting:
                self._starting = starting
                async with contextlib.AsyncExitStack() as stack:
                    read, write = (await stack.enter_async_context(self._transport(env, cwd)))[:2]
                    session = await stack.enter_async_context(ClientSession(read, write))
                    await session.initialize()
                    tools = [tool.name for tool in (await session.list_tools()).tools]
                    if self.tool not in tools:
                        raise SourceError(f"it has no tool {self.tool!r} (its tools: {', '.join(tools) or 'none'})")
                    starting.deadline = math.inf
                    self._session = session
                    ready.set_result(None)
                    await self._stop.wait()
            if not ready.done():  # the start's deadline passed, or close() ended the start
                ready.set_exception(FutureTimeout())
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else SourceError(_describe(exc)))
            elif not self._closed:
                self._ended = _describe(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            if not self._closed:
                self._ended = "the connection ended"

    def _transport(self, env: Mapping[str, str] | None, cwd: str | os.PathLike[str] | None) -> Any:
        """The SDK's client transport: a stdio server started here, or a streamable-HTTP connection."""
        if self.command is not None:
            from mcp import StdioServerParameters, stdio_client

            parameters = StdioServerParameters(command=self.command[0], args=self.command[1:],
                                               env=dict(env) if env is not None else None, cwd=cwd)
            return stdio_client(parameters)
        from mcp.client.streamable_http import streamable_http_client

        return streamable_http_client(str(self.url))

    async def _search_all(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Every query's tool call at once; the first failure (in query order) is the call's."""
        results = await asyncio.gather(*(self._call(query, k) for query in queries), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results  # type: ignore[return-value]  # no exceptions left

    async def _call(self, query: str, k: int) -> list[Passage]:
        arguments = {**self.arguments, self.query_argument: query}
        if self.k_argument is not None:
            arguments[self.k_argument] = k
        with self._counter_lock:
            self.tool_calls += 1
        result = await self._session.call_tool(self.tool, arguments)  # the deadline is search()'s
        if result.is_error:
            raise SourceError(f"source {self.name!r}: MCP tool {self.tool!r} reported an error: "
                              f"{_first_line(_texts(result.content)) or '(no message)'}")
        try:
            return tool_result_passages(result.structured_content, _texts(result.content))[:k]
        except ValueError as exc:
            raise SourceError(f"source {self.name!r}: MCP tool {self.tool!r} returned {exc}") from None


def tool_result_passages(structured: Any, texts: Sequence[str]) -> list[Passage]:
    """The passages in a tool's result: the documents of its structured content (a list, or a list under
    ``result`` as the SDK's servers wrap a returned list), else those of its text blocks, where a block that
    is a JSON document or list of documents gives those and any other block is one passage (id ``"1"``,
    ``"2"``, ... by position). Raises ValueError for a document of neither layout."""
    if isinstance(structured, Mapping) and set(structured) == {"result"}:
        structured = structured["result"]
    if isinstance(structured, list) and all(isinstance(item, Mapping) for item in structured):
        return [_passage(document) for document in structured]
    passages: list[Passage] = []
    for text in texts:
        parsed = _json_or_none(text)
        if isinstance(parsed, list) and parsed and all(isinstance(item, dict) for item in parsed):
            passages.extend(_passage(document) for document in parsed)
        elif isinstance(parsed, dict) and ("text" in parsed or "contents" in parsed):
            passages.append(_passage(parsed))
        else:
            passages.append(Passage(id=str(len(passages) + 1), title="", text=text))
    return passages


def register_mcp_source(retriever: str, command: str | Sequence[str] | None = None, *, url: str | None = None,
                        replace: bool = False, **options: Any) -> None:
    """Make an MCP server's tool the retriever ``retriever`` (:mod:`search_env.sources.registry`), so
    ``data.retriever``, ``benchmarks.evaluate --retriever`` and the retrieval server can choose it by name.
    The server searches its own collection: the corpus those commands name is not sent to it. ``options``
    are :class:`MCPSource`'s (``tool=``, ``timeout_s=``, ...); the source's name is the registry's."""

    def build(corpus: Corpus, source_options: SourceOptions) -> Source:
        return MCPSource(command, url=url, name=source_options.name, **options)

    register_source(retriever, build, replace=replace)


async def _cancel_other_tasks() -> None:
    """Cancel the searches still in flight on the loop (at close) and let them finish."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _passage(document: Mapping[str, Any]) -> Passage:
    return document_to_passage(dict(document), document.get("score", 0.0))


def _texts(content: Sequence[Any]) -> list[str]:
    return [block.text for block in content if getattr(block, "type", None) == "text"]


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _first_line(texts: Sequence[str]) -> str:
    return next((line.strip() for text in texts for line in text.splitlines() if line.strip()), "")


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside the exception groups the SDK's task groups raise."""
    while isinstance(getattr(exc, "exceptions", None), tuple) and exc.exceptions:  # an ExceptionGroup (Python 3.10: backport)
        exc = exc.exceptions[0]
    message = _first_line([str(exc)])
    if isinstance(exc, SourceError):
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
