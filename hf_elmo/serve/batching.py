"""Dynamic batching for a server: the sentences of concurrent requests gathered into batches of at most
`max_batch_tokens` words, run one batch at a time on a thread of their own (off the event loop), each request answered
as soon as the batch holding its last sentence is done.

After a batch, the next waits (a tenth of that batch's time at most) until as many sentences are queued as that batch
held: the clients it answered send their next requests meanwhile. Without it, clients that each wait for their answer
split into two halves taking turns, each batch half as large and the throughput far lower (`bench_serve.py`); a lone
request (its last batch held one sentence) never waits.

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
    """Batches across requests for `embed` (sentences → per sentence its vectors, run on one thread of its own).
    `on_batch(sentences, words, seconds)` is called after each batch that ran (the metrics)."""

    def __init__(self, embed: Callable[[list[Sequence[str]]], list[np.ndarray]], max_batch_tokens: int,
                 on_batch: Callable[[int, int], Any] | None = None, initializer: Callable[[], Any] | None = None):
        self.embed, self.max_batch_tokens, self.on_batch = embed, max_batch_tokens, on_batch
        self.queue: deque[tuple[_Request, int]] = deque()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="elmo-batches", initializer=initializer)
        self.running = 0  # sentences of the batch being embedded now
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.executor.shutdown(wait=True)

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
        self._wake.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            raise

    def _next_batch(self) -> list[tuple[_Request, int]]:
        """Queued sentences in order, up to `max_batch_tokens` words (at least one sentence)."""
        batch, words = [], 0
        while self.queue:
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

    async def _gathered(self, sentences: int, seconds: float) -> None:
        """Returns once `sentences` are queued, or after `seconds`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self.queued < sentences and (left := deadline - loop.time()) > 0:
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while batch := self._next_batch():
                sentences = [request.sentences[index] for request, index in batch]
                self.running, started = len(sentences), time.perf_counter()
                try:
                    vectors = await loop.run_in_executor(self.executor, self.embed, sentences)
                except Exception as error:  # any failure of the batch fails its requests, never the server
                    reason = " ".join(str(error).split()) or type(error).__name__
                    for request, _ in batch:
                        if not request.future.done():
                            request.future.set_exception(BatchFailed(reason))
                    continue
                finally:
                    self.running = 0
                for (request, index), vector in zip(batch, vectors, strict=True):
                    request.vectors[index] = vector
                    request.left -= 1
                    if request.left == 0 and not request.future.done():
                        request.future.set_result(request.vectors)
                seconds = time.perf_counter() - started
                if self.on_batch is not None:
                    self.on_batch(len(sentences), sum(len(s) for s in sentences), seconds)
                await self._gathered(len(sentences), seconds / 10)
