"""The server's batches across requests (`hf_elmo.serve.batching.Batcher`) on a machine of two threads, with a
stand-in for the embedder that records each batch (its sentences, the threads it was given, the thread it ran on) and
holds the batches a test names until the test lets them go: which batches run, and beside which, is decided by the
batcher alone, never by a machine's speed."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hf_elmo.serve.app import _thread_shares
from hf_elmo.serve.batching import Batcher, BatchFailed

WAIT = 60  # seconds a held batch or a barrier waits at most before the test fails


class Embedder:
    """`embed` for a `Batcher`: per sentence the vector [its first word's number, its length]; a batch holding a
    sentence whose first word is in `held` waits for `go[word]`; `side_by_side` batches meet at a barrier first."""

    def __init__(self, held: tuple[str, ...] = (), side_by_side: int = 0):
        self.go = {word: threading.Event() for word in held}
        self.barrier = threading.Barrier(side_by_side, timeout=WAIT) if side_by_side else None
        self.threads: dict[int, int] = {}  # thread → the torch threads it was last given
        self.batches: list[tuple[list[str], int, int]] = []  # (first words, threads given, thread)

    def set_threads(self, count: int) -> None:
        self.threads[threading.get_ident()] = count

    def embed(self, sentences: list[list[str]]) -> list[np.ndarray]:
        me = threading.get_ident()
        self.batches.append(([words[0] for words in sentences], self.threads[me], me))
        if self.barrier is not None:
            self.barrier.wait()
        for words in sentences:
            if words[0] in self.go:
                assert self.go[words[0]].wait(WAIT), f"batch of {words[0]} held past {WAIT} s"
        return [np.array([float(words[0][1:]), len(words)]) for words in sentences]


def sentence(name: str, length: int = 3) -> list[str]:
    return [name, *["word"] * (length - 1)]


def check(answer: list[np.ndarray], sentences: list[list[str]]) -> None:
    assert [vector.tolist() for vector in answer] == [[float(s[0][1:]), len(s)] for s in sentences]


def run(test) -> None:
    asyncio.run(asyncio.wait_for(test(), WAIT))


def test_what_is_queued_while_no_batch_runs_is_split_among_the_threads_and_run_side_by_side():
    """Four one-sentence requests at once: two batches of two, one thread each, on two threads at once (they meet at
    a barrier), each request its own vector."""
    embedder = Embedder(side_by_side=2)

    async def test() -> None:
        batcher = Batcher(embedder.embed, 4096, threads=2, set_threads=embedder.set_threads)
        batcher.start()
        requests = [[sentence(f"s{i}", i + 2)] for i in range(4)]
        answers = await asyncio.gather(*(batcher.vectors(request) for request in requests))
        await batcher.stop()
        for answer, request in zip(answers, requests):
            check(answer, request)

    run(test)
    assert sorted((words, threads) for words, threads, _ in embedder.batches) == [(["s0", "s1"], 1),
                                                                                   (["s2", "s3"], 1)]
    assert len({thread for _, _, thread in embedder.batches}) == 2


def test_a_lone_request_runs_on_all_the_threads_and_a_failing_batch_frees_them():
    """One sentence alone: one batch on both threads (and again, on the same thread: OpenMP's team of a thread is
    kept); a batch that fails fails its request only, and the next batch has both threads again."""
    embedder = Embedder()

    async def test() -> None:
        batcher = Batcher(embedder.embed, 4096, threads=2, set_threads=embedder.set_threads)
        batcher.start()
        check(await batcher.vectors([sentence("s1", 4)]), [sentence("s1", 4)])
        check(await batcher.vectors([sentence("s2", 5)]), [sentence("s2", 5)])
        with pytest.raises(BatchFailed, match="could not convert"):
            await batcher.vectors([sentence("bad")])  # the stand-in's float("ad") fails: the batch fails
        check(await batcher.vectors([sentence("s3")]), [sentence("s3")])
        await batcher.stop()

    run(test)
    assert [(words, threads) for words, threads, _ in embedder.batches] == [
        (["s1"], 2), (["s2"], 2), (["bad"], 2), (["s3"], 2)]
    assert len({thread for _, _, thread in embedder.batches}) == 1


def test_a_free_thread_waits_for_as_many_sentences_as_the_running_batch_holds_then_runs_beside_it():
    """Two requests of four sentences at once: a batch of four on each thread, both held. The second let go, its
    thread is free while the first still runs: one sentence queued does not start a batch; four do, as one batch on
    that thread, answered while the first batch still runs. No more threads than the machine's are ever given."""
    embedder = Embedder(held=("a0", "b0"))

    async def test() -> None:
        batcher = Batcher(embedder.embed, 4096, threads=2, set_threads=embedder.set_threads)
        batcher.start()
        a = [sentence(f"a{i}") for i in range(4)]
        b = [sentence(f"b{i}") for i in range(4)]
        first, second = (asyncio.ensure_future(batcher.vectors(request)) for request in (a, b))
        while len(embedder.batches) < 2:
            await asyncio.sleep(0.01)
        embedder.go["b0"].set()
        check(await second, b)
        c = [sentence("c1")]
        one = asyncio.ensure_future(batcher.vectors(c))
        await asyncio.sleep(0.3)  # time enough to start a batch of it, were that the rule
        assert len(embedder.batches) == 2 and batcher.queued == 1
        d = [sentence(f"d{i}") for i in range(3)]
        check(await batcher.vectors(d), d)
        check(await one, c)
        assert not first.done()  # the first batch is still held
        embedder.go["a0"].set()
        check(await first, a)
        await batcher.stop()

    run(test)
    assert [(words, threads) for words, threads, _ in embedder.batches] == [
        (["a0", "a1", "a2", "a3"], 1), (["b0", "b1", "b2", "b3"], 1), (["c1", "d0", "d1", "d2"], 1)]


def test_on_a_cpu_as_many_batches_as_torch_threads_on_a_gpu_one_with_all_of_them():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _thread_shares(SimpleNamespace(device=torch.device("cpu"))) == (2, torch.set_num_threads)
        batches, give = _thread_shares(SimpleNamespace(device=torch.device("cuda")))
        torch.set_num_threads(1)
        give(1)  # a GPU's one batch: all of the threads whatever it is asked
        assert batches == 1 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
