"""Cross-request micro-batching: many concurrent HTTP requests, one ``source.search`` call.

Why: a dense retriever encodes a batch of queries for far less than the sum of single-query encodes
(on one CPU core MiniLM answers 2-3x more queries per second in batches of 8 than one by one), so a
server that searched request by request would waste most of its time. Requests that arrive while a
search is running queue up and are answered together by the next call (with eight single-query
clients the batches settle at two alternating groups of four, so the encoder never idles). Before a
search starts, the batcher waits up to ``max_wait_s`` only for requests the server has already begun
to read (announced with :meth:`MicroBatcher.expect`), never on speculation: a fixed wait adds its full
length to every request of a lone client, which on a busy 2-core machine measured as half the
throughput of a sequential client against BM25.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from search_env.sources.base import Passage, Source

__all__ = ["MicroBatcher"]


@dataclass
class _Job:
    queries: list[str]
    k: int
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    """Answers ``search`` coroutines from many requests with few, larger ``source.search`` calls.

    Jobs are grouped by ``k`` (one call per distinct k in a gathered batch). The source runs on one
    worker thread, so it never sees two calls at once and the event loop stays free to accept the
    next requests meanwhile. If a merged call fails and it held several requests, each request is
    retried alone, so one request's bad query cannot fail the others.

    Args:
        source: any Source; called only from the worker thread.
        max_batch: stop gathering once this many queries are queued (a single request may exceed it).
        max_wait_s: how long a batch below ``max_batch`` may wait for requests in sight (see the
            module docstring).
    """

    def __init__(self, source: Source, *, max_batch: int = 128, max_wait_s: float = 0.002) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        self.source = source
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.calls = 0  # source.search calls made
        self.queries = 0  # queries answered through them
        self._expected = 0  # requests announced by expect() and not queued (or abandoned) yet
        self._wakeup = asyncio.Event()  # set when a job is queued or an announced request leaves
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        """Start the gathering task on the running event loop (the app's lifespan calls this)."""
        if self._task is not None:
            raise RuntimeError("MicroBatcher already started")
        self._queue = asyncio.Queue()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"search-{self.source.name}")
        self._task = asyncio.create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        """Stop gathering, fail the requests still queued and release the worker thread."""
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self._task
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

    async def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Queue one request's queries and wait for its share of a batched search."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.search called before start()")
        if not queries:
            return []
        job = _Job(queries, k, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(job)
        self._wakeup.set()
        return await job.future

    async def _run(self) -> None:
        assert self._queue is not None
        while True:
            jobs = [await self._queue.get()]
            await self._gather(jobs)
            by_k: dict[int, list[_Job]] = {}
            for job in jobs:
                if not job.future.done():  # a client that went away cancels its future
                    by_k.setdefault(job.k, []).append(job)
            for k, group in by_k.items():
                await self._answer(group, k)

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

    async def _answer(self, group: list[_Job], k: int) -> None:
        flat = [q for job in group for q in job.queries]
        try:
            results = await self._search(flat, k)
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

    async def _search(self, queries: list[str], k: int) -> list[list[Passage]]:
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._executor, self.source.search, queries, k)
        if len(results) != len(queries):
            raise RuntimeError(f"source {self.source.name!r} returned {len(results)} result lists for {len(queries)} queries")
        self.calls += 1
        self.queries += len(queries)
        return results


def _fail(job: _Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)
