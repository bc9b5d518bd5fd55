"""The HTTP API: ``POST /retrieve`` exactly as Search-R1 / FlashRAG retrieval servers answer it, plus
``GET /health``, over any Source, or over a :class:`~search_env.server.readiness.SourceBuild` whose index
is still being built (both answer HTTP 503 until it is ready).

Compatibility is the point: a Search-R1-style client (``requests.post(url, json=payload).json()["result"]``)
must work against this server unchanged, so the request fields, the default top-k rule (missing, null
or 0 means the default) and the response layout follow Search-R1's ``retrieval_server.py``. Two
deliberate differences, both where the reference misbehaves:

- ``"return_scores": false`` answers each query with its list of bare documents, which is what the
  reference's response code builds; the reference itself fails with HTTP 500 there for any batch but
  one of exactly two queries (it unpacks a one-value return into two names).
- requests are bounded (body bytes, the time the body may take to arrive, number of queries, query
  length, top-k) and malformed ones get a 4xx status with a ``{"detail": "..."}`` message saying what
  is wrong, instead of a 500 or a hang. A body still arriving after ``body_timeout_s`` is answered 408
  and its connection closed (a client sending a byte now and then would otherwise hold it for ever);
  a client that disconnects mid-body, an ordinary client event, is one log line, not a traceback.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import AsyncIterator

from search_env._optional import requires_extra

with requires_extra("server", "the retrieval server"):
    from pydantic import BaseModel, ConfigDict, ValidationError
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

from search_env.server.batching import MicroBatcher
from search_env.server.readiness import SourceBuild
from search_env.sources.base import Passage, Source
from search_env.sources.remote import passage_to_document

__all__ = ["RETRY_AFTER_S", "RetrieveRequest", "ServerLimits", "create_app"]

#: Where the app's one-line notes go: uvicorn's own log, so they show at the server's log level.
LOG = logging.getLogger("uvicorn.error")

RETRY_AFTER_S = 10
"""The ``Retry-After`` of a ``/retrieve`` refused while the source is being built: an index takes
minutes, so polling faster only adds load."""


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on one ``/retrieve`` request, so one client cannot exhaust the server's memory or time.

    The defaults admit what Search-R1 training sends: every active rollout's query in one request
    (thousands of short queries), top-k of a few (or a few dozen before reranking).
    """

    max_body_bytes: int = 4 * 1024 * 1024
    max_queries: int = 4096
    max_query_chars: int = 2048
    max_topk: int = 200
    #: Seconds a request body may take to arrive in full (a 4 MiB body on a slow link takes well under it).
    body_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_queries", "max_query_chars", "max_topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.body_timeout_s < float("inf"):
            raise ValueError(f"ServerLimits.body_timeout_s must be a positive number of seconds, got {self.body_timeout_s}")


class RetrieveRequest(BaseModel):
    """The body of ``POST /retrieve``. Types are strict (a string is not a list, "3" is not 3);
    unknown fields are ignored, as the reference server does."""

    model_config = ConfigDict(strict=True, extra="ignore")

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def create_app(
    source: Source,
    *,
    default_topk: int = 3,
    limits: ServerLimits | None = None,
    max_batch: int = 128,
    max_wait_s: float = 0.002,
    concurrency: int = 1,
) -> Starlette:
    """Build the retrieval app serving ``source``.

    Args:
        source: answers every request, from up to ``concurrency`` worker threads at once. A
            :class:`~search_env.server.readiness.SourceBuild` is started with the app (if it was not
            already), and until it is ready ``/health`` and ``/retrieve`` answer 503 saying so.
        default_topk: passages per query when a request gives no (or a 0) ``topk``; Search-R1's default is 3.
        limits: request bounds; see :class:`ServerLimits`.
        max_batch, max_wait_s, concurrency: cross-request batching and how many source calls may
            run at once, see :class:`MicroBatcher`.

    The caller keeps ownership of ``source`` (the app does not close it).
    """
    limits = limits or ServerLimits()
    if not 1 <= default_topk <= limits.max_topk:
        raise ValueError(f"default_topk must be between 1 and max_topk={limits.max_topk}, got {default_topk}")
    batcher = MicroBatcher(source, max_batch=max_batch, max_wait_s=max_wait_s, concurrency=concurrency)
    build = source if isinstance(source, SourceBuild) else None

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if build is not None:
            build.start()
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    async def health(_: Request) -> Response:
        """Readiness plus batching counters (how many source calls served how many queries); 503
        with the build's state while the source is being built or failed to build."""
        if build is not None and build.state != "ready":
            state = {"status": build.state, "source": build.name, "seconds": round(build.seconds, 1)}
            if build.error is not None:
                state["error"] = build.error
            return JSONResponse(state, status_code=503)
        return JSONResponse({"status": "ok", "source": source.name, "source_calls": batcher.calls,
                             "inline_calls": batcher.inline_calls, "queries": batcher.queries})

    async def retrieve(request: Request) -> Response:
        """Answer ``{"queries", "topk", "return_scores"}`` with ``{"result": [...]}``, one list per query."""
        if build is not None and build.state != "ready":
            return JSONResponse({"detail": build.describe()}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})
        with batcher.expect():  # a batch being gathered now may wait for this request
            try:
                body = await _read_body(request, limits.max_body_bytes, limits.body_timeout_s)
            except ClientDisconnect:
                client = request.scope.get("client")
                LOG.warning("client %s disconnected while sending its request body; nothing was searched",
                            ":".join(map(str, client)) if client else "?")
                return Response(status_code=400)  # nobody reads it: the connection is gone
            parsed = _parse_request(body)
            topk = _resolve_topk(parsed.topk, default_topk, limits.max_topk)
            _check_queries(parsed.queries, limits)
        try:
            results = await batcher.search(parsed.queries, topk, client=request.scope.get("client"))
        except Exception as exc:
            return JSONResponse({"detail": f"retrieval failed: {type(exc).__name__}: {exc}"}, status_code=500)
        payload = {"result": [_layout(row[:topk], parsed.return_scores) for row in results]}
        return Response(json.dumps(payload, ensure_ascii=False), media_type="application/json")

    app = Starlette(
        routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])],
        exception_handlers={HTTPException: _error_response},
        lifespan=lifespan,
    )
    return app


async def _error_response(_: Request, exc: Exception) -> Response:
    """Every refusal (ours, and Starlette's 404/405) as ``{"detail": "..."}``, the reference's error layout."""
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """Read the body, refusing (413) as soon as it is known to exceed ``limit`` bytes, and (408, closing the
    connection) when it has not arrived in full within ``timeout_s`` seconds."""
    try:
        return await asyncio.wait_for(_read_limited(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise HTTPException(408, f"request body not received in full within {timeout_s:g} s",
                            headers={"Connection": "close"}) from None


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise HTTPException(400, f"invalid Content-Length header {declared!r}") from None
        if size > limit:
            raise HTTPException(413, f"request body of {size} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_request(body: bytes) -> RetrieveRequest:
    """Validate the JSON body; 400 when it is not JSON, 422 with every field problem otherwise."""
    try:
        return RetrieveRequest.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(error["type"] == "json_invalid" for error in errors):
            raise HTTPException(400, f"request body is not valid JSON: {errors[0]['msg']}") from None
        problems = "; ".join(f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}" for error in errors)
        raise HTTPException(
            422, f'invalid request ({problems}); expected {{"queries": [str, ...], "topk": int, "return_scores": bool}}'
        ) from None


def _resolve_topk(topk: int | None, default: int, max_topk: int) -> int:
    if not topk:  # the reference's rule: missing, null and 0 all mean the default
        return default
    if not 1 <= topk <= max_topk:
        raise HTTPException(422, f"topk must be between 1 and {max_topk} (or 0/null for the default {default}), got {topk}")
    return topk


def _check_queries(queries: list[str], limits: ServerLimits) -> None:
    if len(queries) > limits.max_queries:
        raise HTTPException(413, f"{len(queries)} queries in one request; the limit is {limits.max_queries}")
    for i, query in enumerate(queries):
        if len(query) > limits.max_query_chars:
            raise HTTPException(413, f"query {i} has {len(query)} characters; the limit is {limits.max_query_chars}")


def _layout(passages: list[Passage], with_scores: bool) -> list[dict]:
    if with_scores:
        return [{"document": passage_to_document(p), "score": float(p.score)} for p in passages]
    return [passage_to_document(p) for p in passages]
