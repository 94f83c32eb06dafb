"""Dynamic batching for a server: the sentences of concurrent requests gathered into batches of at most
`max_batch_tokens` words, run off the event loop on threads of their own, each request answered as soon as the batch
holding its last sentence is done.

The batches share the server's torch threads, each taking its share when it starts. With no batch running, what is
queued is split among the threads, a batch each (a lone sentence takes them all): on a CPU, small batches side by
side on one thread each embed more words a second than one batch on all of them (docs/serving.md), and while one
runs, the answers of another go out and its clients' next requests come in. With batches running, the next takes
the threads they left free once it holds as many sentences a thread as they do: batches keep their size instead of
the free threads taking each sentence as it comes. A batch on several threads runs on the thread of the first
(OpenMP's team of a thread is kept: two teams on the same cores spin against each other).

After a batch, its threads wait (a tenth of that batch's time at most) until as many sentences are queued as that
batch held: the clients it answered send their next requests meanwhile. Without it, clients that each wait for their
answer split into ever smaller batches, and the throughput falls (`bench_serve.py`); a lone request (its last batch
held one sentence) never waits.

A request whose client went away before its sentences were batched is dropped from the queue; a batch that fails
fails the requests it holds (`BatchFailed`) and the next batch runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class BatchFailed(RuntimeError):
    """The batch holding a request's sentences failed (its one line)."""


@dataclass(eq=False)
class _Request:
    """One request's sentences on their way through the batches: their vectors as they come, and the future the
    request awaits."""

    sentences: Sequence[Sequence[str]]
    future: asyncio.Future
    vectors: list[np.ndarray | None] = field(default_factory=list)
    left: int = 0
    cancelled: bool = False


class Batcher:
    """Batches across requests for `embed` (sentences → per sentence its vectors), up to `threads` at once, each on
    a thread of its own that `set_threads(n)` gives its share of torch's threads before it runs. `on_batch(sentences,
    words, seconds)` is called after each batch that ran (the metrics)."""

    def __init__(self, embed: Callable[[list[Sequence[str]]], list[np.ndarray]], max_batch_tokens: int,
                 on_batch: Callable[[int, int, float], Any] | None = None, threads: int = 1,
                 set_threads: Callable[[int], Any] | None = None):
        self.embed, self.max_batch_tokens, self.on_batch = embed, max_batch_tokens, on_batch
        self.threads, self.set_threads = threads, set_threads
        self.queue: deque[tuple[_Request, int]] = deque()
        self.executors = [ThreadPoolExecutor(1, thread_name_prefix=f"elmo-batches-{i}") for i in range(threads)]
        self.free = list(range(threads))  # the threads (their executors) that no batch holds, lowest first
        self.running = 0  # sentences of the batches being embedded now
        self._running_threads = 0  # threads of the batches being embedded now
        self._gathering = 0  # batches done, whose threads wait for their clients' next sentences
        self._batches: set[asyncio.Task] = set()
        self._changed: asyncio.Condition | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._changed = asyncio.Condition()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        tasks = [task for task in (self._task, *self._batches) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for executor in self.executors:
            executor.shutdown(wait=True)

    @property
    def alive(self) -> bool:
        """Whether batches run (started, not stopped)."""
        return self._task is not None and not self._task.done()

    @property
    def queued(self) -> int:
        """Sentences waiting for a batch (not those of requests gone or failed, dropped when their turn comes)."""
        return sum(1 for request, _ in self.queue if not (request.cancelled or request.future.done()))

    async def vectors(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Each sentence's vectors, computed in the batches; `BatchFailed` when one of them fails. Cancelled (the
        client went away), its sentences not yet batched are dropped."""
        request = _Request(sentences, asyncio.get_running_loop().create_future(), [None] * len(sentences),
                           len(sentences))
        if not sentences:
            return []
        self.queue.extend((request, index) for index in range(len(sentences)))
        await self._notify()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            raise

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _next_batch(self, most: int) -> list[tuple[_Request, int]]:
        """Queued sentences in order, up to `most` sentences and `max_batch_tokens` words (at least one)."""
        batch, words = [], 0
        while self.queue and len(batch) < most:
            request, index = self.queue[0]
            if request.cancelled or request.future.done():  # its client went away, or another batch failed it
                self.queue.popleft()
                continue
            size = len(request.sentences[index])
            if batch and words + size > self.max_batch_tokens:
                break
            batch.append(self.queue.popleft())
            words += size
        return batch

    def _ready(self) -> bool:
        """Whether a batch may start: threads free, sentences queued, no batch gathering its clients' next ones,
        and as many sentences a thread as the batches being embedded have (with none, any)."""
        queued, free = self.queued, len(self.free)
        return bool(free and queued and not self._gathering
                    and queued * self._running_threads >= self.running * free)

    async def _run(self) -> None:
        """Starts batches whenever `_ready`: with all threads free, what is queued split among them; else one batch
        on the threads free."""
        loop = asyncio.get_running_loop()
        while True:
            async with self._changed:
                await self._changed.wait_for(self._ready)
            parts = min(len(self.free), self.queued) if len(self.free) == self.threads else 1
            for part in range(parts, 0, -1):
                batch = self._next_batch(-(-self.queued // part))
                if not batch:
                    break
                threads = self.free[: len(self.free) // part]
                del self.free[: len(threads)]
                task = loop.create_task(self._embed(batch, threads))
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def _embed(self, batch: list[tuple[_Request, int]], threads: list[int]) -> None:
        """Runs one batch on `threads` (on the first one's executor), answers its requests, then frees the threads
        once the clients it answered have sent their next sentences (a tenth of its time at most)."""
        sentences = [request.sentences[index] for request, index in batch]
        self.running += len(sentences)
        self._running_threads += len(threads)
        started = time.perf_counter()
        try:
            vectors = await asyncio.get_running_loop().run_in_executor(self.executors[threads[0]], self._call,
                                                                       len(threads), sentences)
        except Exception as error:  # any failure of the batch fails its requests, never the server
            reason = " ".join(str(error).split()) or type(error).__name__
            for request, _ in batch:
                if not request.future.done():
                    request.future.set_exception(BatchFailed(reason))
            vectors = None
        finally:
            self.running -= len(sentences)
            self._running_threads -= len(threads)
        self._gathering += 1
        try:
            if vectors is not None:
                for (request, index), vector in zip(batch, vectors, strict=True):
                    request.vectors[index] = vector
                    request.left -= 1
                    if request.left == 0 and not request.future.done():
                        request.future.set_result(request.vectors)
                seconds = time.perf_counter() - started
                if self.on_batch is not None:
                    self.on_batch(len(sentences), sum(len(s) for s in sentences), seconds)
                with contextlib.suppress(asyncio.TimeoutError):
                    async with self._changed:
                        await asyncio.wait_for(self._changed.wait_for(lambda: self.queued >= len(sentences)),
                                               seconds / 10)
        finally:
            self._gathering -= 1
            self.free = sorted(self.free + threads)
            await self._notify()

    def _call(self, threads: int, sentences: list[Sequence[str]]) -> list[np.ndarray]:
        if self.set_threads is not None:
            self.set_threads(threads)
        return self.embed(sentences)
