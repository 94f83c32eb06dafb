"""Continuous batching for a server: the sentences of concurrent requests join the biLM's steps as they come and
leave as they end (`hf_elmo.stream`), on threads of their own, each request answered as soon as its last sentence
has ended.

The sentences run in lanes, each a stream of its own (`work`: an `EmbedderStream`) on a thread of its own: on a CPU
one lane a torch thread, each on one of them (a stream on one thread loses nothing to OpenMP's teams waiting for a
thread that the event loop holds; docs/serving.md), on a GPU one lane. Between two advances of a few steps, a lane
takes queued sentences in arrival order, up to its share of all those in flight and queued, while the lanes hold at
most `max_batch_tokens` words (an empty lane takes one in any case); then its sentences advance, and those that
ended are answered. A sentence never waits for a batch to end, nor for another's clients: the steps hold as many
sentences as are in flight. A sentence alone in the server, none queued, runs to its end in one advance on all the
threads (as the library runs one sentence), on the first lane: one that comes meanwhile waits at most that sentence's
time. Only the first lane's thread ever runs on more than its share: OpenMP's teams of two threads would otherwise
hold more threads than the cores, and every team then waits for its threads asleep (a sentence twice as slow).

A request whose client went away before its sentences joined is dropped from the queue. Sentences that fail to join
fail their requests (`BatchFailed`); an advance that fails fails the requests with sentences in that lane, which
starts again empty.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class BatchFailed(RuntimeError):
    """The sentences of a request failed in the biLM (their one line)."""


class StreamWork(Protocol):
    """What a lane runs (`hf_elmo.embed.streaming.EmbedderStream`)."""

    def add(self, sentences: Sequence[Sequence[str]], keys: Sequence[Hashable]) -> None: ...

    def advance(self, to_the_end: bool = False) -> list[tuple[Hashable, Any]]: ...

    def drop(self) -> list[Hashable]: ...


@dataclass(eq=False)
class _Request:
    """One request's sentences on their way through the lanes: their results as they come, the future the request
    awaits (on the event loop), how many of its sentences are queued, and whether it was dropped (its client went
    away or one of its sentences failed: its queued sentences are then skipped)."""

    sentences: Sequence[Sequence[str]]
    future: asyncio.Future
    results: list[Any] = field(default_factory=list)
    left: int = 0
    queued: int = 0
    dropped: bool = False


@dataclass(eq=False)
class _Lane:
    """A stream on a thread of its own, and its sentences in flight (each → its words)."""

    work: StreamWork
    in_flight: dict[tuple[_Request, int], int] = field(default_factory=dict)
    thread: threading.Thread | None = None


class Streamer:
    """Requests' sentences through `lanes` streams, each made by `make_work()`, on a thread that `set_threads(n)`
    gives n torch threads (OpenMP's setting is per thread): `threads` in all, shared among the lanes. `on_join(
    sentences, words)` is called for each group of sentences that joined a lane together and `on_advance(sentences,
    seconds)` after each advance (the metrics), on the lane's thread."""

    def __init__(self, make_work: Callable[[], StreamWork], max_batch_tokens: int, lanes: int = 1, threads: int = 1,
                 set_threads: Callable[[int], Any] | None = None, on_join: Callable[[int, int], Any] | None = None,
                 on_advance: Callable[[int, float], Any] | None = None):
        self.max_batch_tokens, self.threads, self.set_threads = max_batch_tokens, threads, set_threads
        self.on_join, self.on_advance = on_join, on_advance
        self.lanes = [_Lane(make_work()) for _ in range(lanes)]
        self.queue: deque[tuple[_Request, int]] = deque()
        self._waiting = 0  # queued sentences of requests not dropped
        self._changed = threading.Condition()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for index, lane in enumerate(self.lanes):
            lane.thread = threading.Thread(target=self._run, args=(lane,), name=f"elmo-lane-{index}", daemon=True)
            lane.thread.start()

    async def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for lane in self.lanes:
            if lane.thread is not None:
                await asyncio.to_thread(lane.thread.join)

    @property
    def alive(self) -> bool:
        """Whether every lane runs (started, not stopped)."""
        return not self._stopping and all(lane.thread is not None and lane.thread.is_alive() for lane in self.lanes)

    @property
    def queued(self) -> int:
        """Sentences waiting to join (not those of requests gone or failed, skipped when their turn comes)."""
        return self._waiting

    @property
    def running(self) -> int:
        """Sentences in the lanes."""
        return sum(len(lane.in_flight) for lane in self.lanes)

    async def vectors(self, sentences: Sequence[Sequence[str]]) -> list[Any]:
        """Each sentence's result from its lane's `work`; `BatchFailed` when one of them fails. Cancelled (the
        client went away), its sentences not yet joined are dropped."""
        if not sentences:
            return []
        request = _Request(sentences, asyncio.get_running_loop().create_future(), [None] * len(sentences),
                           len(sentences))
        with self._changed:
            self.queue.extend((request, index) for index in range(len(sentences)))
            request.queued = len(sentences)
            self._waiting += len(sentences)
            self._changed.notify_all()
        try:
            return await request.future
        except asyncio.CancelledError:
            self._drop(request)
            raise

    def _drop(self, request: _Request) -> None:
        """`request`'s queued sentences will not join (its client went away, or it failed)."""
        with self._changed:
            if not request.dropped:
                request.dropped = True
                self._waiting -= request.queued
                request.queued = 0

    # -- on the lanes' threads (`_changed` held where the queue or the lanes' sentences are read to decide) -----------
    def _share(self, lane: _Lane) -> int:
        """How many queued sentences `lane` may take now: up to its share of all in flight and queued; a sentence
        alone in the server is the first lane's (the one lane that ever runs on all the threads)."""
        waiting, running = self._waiting, self.running
        if not waiting:
            return 0
        if running == 0 and waiting == 1:
            return int(lane is self.lanes[0])
        share = -(-(running + waiting) // len(self.lanes))
        return max(0, share - len(lane.in_flight))

    def _run(self, lane: _Lane) -> None:
        if self.set_threads is not None:
            self.set_threads(self.threads // len(self.lanes))
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopping or lane.in_flight or self._share(lane))
                if self._stopping:
                    break
                joining = self._joining(lane)
                if joining:
                    lane.in_flight.update(((request, index), len(request.sentences[index]))
                                          for request, index in joining)
                alone = lane is self.lanes[0] and self.running == 1 and not self._waiting
            if joining:
                self._join(lane, joining)
            if lane.in_flight:
                self._advance(lane, alone)
        for key in lane.work.drop():
            self._fail(key, "the server stopped")

    def _joining(self, lane: _Lane) -> list[tuple[_Request, int]]:
        """Queued sentences in order, up to the lane's share, while the lanes hold at most `max_batch_tokens` words
        (one at least when the lane is empty); those of requests dropped leave the queue."""
        most = self._share(lane)
        joining, words = [], sum(sum(other.in_flight.values()) for other in self.lanes)
        while self.queue and len(joining) < most:
            request, index = self.queue[0]
            if request.dropped:
                self.queue.popleft()
                continue
            size = len(request.sentences[index])
            if (lane.in_flight or joining) and words + size > self.max_batch_tokens:
                break
            joining.append(self.queue.popleft())
            request.queued -= 1
            self._waiting -= 1
            words += size
        return joining

    def _join(self, lane: _Lane, joining: list[tuple[_Request, int]]) -> None:
        sentences = [request.sentences[index] for request, index in joining]
        try:
            lane.work.add(sentences, joining)
        except Exception as error:  # any failure fails these sentences' requests, never the server
            self._leave(lane, joining)
            for key in joining:
                self._fail(key, _one_line(error))
            return
        if self.on_join is not None:
            self.on_join(len(sentences), sum(len(words) for words in sentences))

    def _advance(self, lane: _Lane, alone: bool) -> None:
        """One advance of the lane; `alone` (the first lane, its one sentence the server's only, none queued): to its
        end, on all the threads."""
        sentences, started = len(lane.in_flight), time.perf_counter()
        all_threads = alone and len(self.lanes) > 1 and self.set_threads is not None
        try:
            if all_threads:
                self.set_threads(self.threads)
            ended = lane.work.advance(to_the_end=alone)
        except Exception as error:
            reason = _one_line(error)
            dropped = lane.work.drop()
            self._leave(lane, list(lane.in_flight))
            for key in dropped:
                self._fail(key, reason)
            return
        finally:
            if all_threads:
                self.set_threads(self.threads // len(self.lanes))
        if self.on_advance is not None:
            self.on_advance(sentences, time.perf_counter() - started)
        self._leave(lane, [key for key, _ in ended])
        for key, result in ended:
            self._loop.call_soon_threadsafe(_answer, key, result)

    def _leave(self, lane: _Lane, keys: list[tuple[_Request, int]]) -> None:
        """Sentences leave `lane` (the other lanes' shares and room change)."""
        with self._changed:
            for key in keys:
                del lane.in_flight[key]
            self._changed.notify_all()

    def _fail(self, key: tuple[_Request, int], reason: str) -> None:
        self._drop(key[0])
        self._loop.call_soon_threadsafe(_failed, key[0], reason)


def _answer(key: tuple[_Request, int], result: Any) -> None:
    """On the event loop: one sentence's result; the request answered with its last."""
    request, index = key
    if request.future.done():
        return
    request.results[index] = result
    request.left -= 1
    if request.left == 0:
        request.future.set_result(request.results)


def _failed(request: _Request, reason: str) -> None:
    if not request.future.done():
        request.future.set_exception(BatchFailed(reason))


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__
