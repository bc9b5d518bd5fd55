"""Cross-request micro-batching: many concurrent HTTP requests, few ``source.search`` calls.

Why: a dense retriever encodes a batch of queries for far less than the sum of single-query encodes,
so a server that searched request by request would waste most of its time. Requests that arrive
while the searches are running queue up and are answered together by the next call. Up to
``concurrency`` calls run at once on worker threads, so on a multi-core machine one batch is encoded
while the next is gathered and encoded beside it; with one call at a time, one core encodes while
the other mostly waits for responses to go out and requests to come in.

Before a search starts, the batcher waits up to ``max_wait_s`` only for requests the server has
already begun to read (announced with :meth:`MicroBatcher.expect`), never on speculation: a fixed
wait adds its full length to every request of a lone client, which costs a sequential client much of
its throughput.

A lone client (every recent request on one connection, nothing else queued or running) has its
small requests searched on the event-loop thread itself: nothing else needs the loop meanwhile, and
skipping the hand-over to a worker thread (which wakes a thread on another, idle core) shortens each
request. A second connection turns this off for :data:`SHARED_WINDOW_S`, so concurrent clients never
wait behind another's search. The measured figures behind these rules are in ``benchmarks/RESULTS.md``.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from search_env.sources.base import Passage, Source

__all__ = ["MicroBatcher"]

#: After requests from two different connections within this many seconds, searches go to the
#: worker threads (not the event loop) until this long has passed without such an overlap.
SHARED_WINDOW_S = 1.0
#: Largest lone request searched on the event-loop thread: a bigger one would keep the loop (and
#: so /health and new connections) waiting too long.
INLINE_MAX_QUERIES = 16


@dataclass
class _Job:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)
    inline: bool = False  # a lone client's small request: search it on the event-loop thread


class MicroBatcher:
    """Answers ``search`` coroutines from many requests with few, larger ``source.search`` calls.

    Jobs are grouped by ``k`` (one call per distinct k in a gathered batch). The source runs on
    worker threads (a lone client's small requests excepted), so the event loop stays free to
    accept the next requests meanwhile. If a merged
    call fails and it held several requests, each request is retried alone, so one request's bad
    query cannot fail the others.

    Args:
        source: any Source; called from the worker threads and, for a lone client, the event loop.
        max_batch: stop gathering once this many queries are queued (a single request may exceed it).
        max_wait_s: how long a batch below ``max_batch`` may wait for requests in sight (see the
            module docstring).
        concurrency: ``source.search`` calls that may run at once, each on its own worker thread
            (sources are thread-safe; see :mod:`search_env.sources.base`). 1 means the source
            never sees two calls at once; the number of cores lets a CPU-bound source (a dense
            encoder) keep every core busy under concurrent clients.
    """

    def __init__(self, source: Source, *, max_batch: int = 128, max_wait_s: float = 0.002, concurrency: int = 1) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.source = source
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.concurrency = concurrency
        self.calls = 0  # source.search calls made
        self.queries = 0  # queries answered through them
        self._expected = 0  # requests announced by expect() and not queued (or abandoned) yet
        self._wakeup = asyncio.Event()  # set when a job is queued or an announced request leaves
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()  # batches being answered
        self._executor: ThreadPoolExecutor | None = None
        self._last_client: Hashable | None = None  # connection of the latest request, and when
        self._last_client_at = float("-inf")
        self._shared_until = float("-inf")  # no inline searches before this loop time
        self.inline_calls = 0  # of ``calls``, those run on the event-loop thread

    async def start(self) -> None:
        """Start the gathering task on the running event loop (the app's lifespan calls this)."""
        if self._task is not None:
            raise RuntimeError("MicroBatcher already started")
        self._queue = asyncio.Queue()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"search-{self.source.name}")
        self._task = asyncio.create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        """Stop gathering, fail the requests still queued or being searched and release the worker threads."""
        if self._task is None:
            return
        tasks = (self._task, *self._running)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        assert self._queue is not None and self._executor is not None
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if not job.future.done():
                job.future.set_exception(RuntimeError("the server is shutting down"))
        self._executor.shutdown(wait=True)
        self._task = self._queue = self._executor = None

    @contextlib.contextmanager
    def expect(self) -> Iterator[None]:
        """Announce a request that is being read and checked and will then call :meth:`search`, so
        a batch being gathered may wait (up to ``max_wait_s``) for it. Leave the block right before
        calling ``search`` (nothing is awaited in between, so no batch can miss the request); a
        request rejected on the way simply leaves it."""
        self._expected += 1
        try:
            yield
        finally:
            self._expected -= 1
            self._wakeup.set()

    async def search(self, queries: list[str], k: int, *, client: Hashable | None = None) -> list[list[Passage]]:
        """Queue one request's queries and wait for its share of a batched search.

        ``client`` identifies the connection the request came on (e.g. ASGI's ``scope["client"]``);
        it lets a lone client's small requests run on the event-loop thread (see the module
        docstring). None never runs inline."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.search called before start()")
        if not queries:
            return []
        loop = asyncio.get_running_loop()
        now = loop.time()
        if client != self._last_client and now - self._last_client_at < SHARED_WINDOW_S:
            self._shared_until = now + SHARED_WINDOW_S
        self._last_client, self._last_client_at = client, now
        inline = client is not None and now >= self._shared_until and len(queries) <= INLINE_MAX_QUERIES
        job = _Job(queries, k, loop.create_future(), inline)
        self._queue.put_nowait(job)
        self._wakeup.set()
        return await job.future

    async def _run(self) -> None:
        assert self._queue is not None
        slots = asyncio.Semaphore(self.concurrency)
        while True:
            await slots.acquire()  # with every slot busy, requests queue up into the next batch
            jobs = [await self._queue.get()]
            try:
                await self._gather(jobs)
            except asyncio.CancelledError:  # stop() while gathering
                for job in jobs:
                    _fail(job, RuntimeError("the server is shutting down"))
                raise
            task = asyncio.create_task(self._answer_batch(jobs))
            self._running.add(task)
            task.add_done_callback(lambda done: (self._running.discard(done), slots.release()))

    async def _answer_batch(self, jobs: list[_Job]) -> None:
        by_k: dict[int, list[_Job]] = {}
        for job in jobs:
            if not job.future.done():  # a client that went away cancels its future
                by_k.setdefault(job.k, []).append(job)
        try:
            for k, group in by_k.items():
                await self._answer(group, k, inline=len(jobs) == 1 and jobs[0].inline)
        except asyncio.CancelledError:  # stop() during the search: nobody will answer these
            for job in jobs:
                _fail(job, RuntimeError("the server is shutting down"))
            raise

    async def _gather(self, jobs: list[_Job]) -> None:
        """Add queued jobs to ``jobs`` until ``max_batch`` queries, or ``max_wait_s`` has passed, or
        no announced request is left to wait for."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        size = len(jobs[0].queries)
        await asyncio.sleep(0)  # let requests whose bytes have already arrived reach the queue
        while size < self.max_batch:
            if self._queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0 or not self._expected:
                    return
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:
                    return
                continue
            job = self._queue.get_nowait()
            jobs.append(job)
            size += len(job.queries)

    async def _answer(self, group: list[_Job], k: int, *, inline: bool = False) -> None:
        flat = [q for job in group for q in job.queries]
        try:
            results = await self._search(flat, k, inline=inline)
        except Exception as exc:
            if len(group) > 1:
                for job in group:
                    await self._answer([job], k)
                return
            _fail(group[0], exc)
            return
        offset = 0
        for job in group:
            if not job.future.done():
                job.future.set_result(results[offset : offset + len(job.queries)])
            offset += len(job.queries)

    async def _search(self, queries: list[str], k: int, *, inline: bool = False) -> list[list[Passage]]:
        assert self._executor is not None and self._queue is not None
        loop = asyncio.get_running_loop()
        # Inline only if still alone: nothing else running, queued or being read.
        if inline and len(self._running) <= 1 and self._queue.empty() and not self._expected and loop.time() >= self._shared_until:
            results = self.source.search(queries, k)
            self.inline_calls += 1
        else:
            results = await loop.run_in_executor(self._executor, self.source.search, queries, k)
        if len(results) != len(queries):
            raise RuntimeError(f"source {self.source.name!r} returned {len(results)} result lists for {len(queries)} queries")
        self.calls += 1
        self.queries += len(queries)
        return results


def _fail(job: _Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)
