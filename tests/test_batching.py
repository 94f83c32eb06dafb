"""The server's continuous batching (`hf_elmo.serve.batching.Streamer`) with a stand-in for the biLM's stream (one per
lane) that records what each advance held and holds the advances a test names until the test lets them go: which
sentences join which lane, when, and beside which, is decided by the streamer alone, never by a machine's speed. The
real stream's vectors are `test_stream.py`'s; a real server's, `test_serve.py`'s."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from hf_elmo.serve.batching import BatchFailed, Streamer

WAIT = 60  # seconds a held advance waits at most before the test fails


class Work:
    """A stand-in `EmbedderStream`: a sentence ends after as many advances as it has words, its result [its first
    word, its length]; an advance holding a sentence whose first word is in `held` waits for `go[word]`; a sentence
    "bad" fails to join, an advance holding "boom" fails."""

    def __init__(self, held: tuple[str, ...] = (), given: dict[int, int] | None = None):
        self.go = {word: threading.Event() for word in held}
        self.given = given  # the threads each thread was last given (a stand-in `set_threads`'s), if any
        self.advance_threads: list[int] = []  # per advance, its thread's
        self.rows: dict = {}  # key → (words, advances left)
        self.added: list[list[str]] = []  # per join, the first words
        self.advances: list[list[str]] = []  # per advance, the first words of the sentences it held
        self.threads: list[int] = []  # torch's threads on the stream's thread, at each join
        self.to_the_end: list[bool] = []  # per advance, whether it was to run every sentence to its end

    def add(self, sentences, keys) -> None:
        if any(words[0] == "bad" for words in sentences):
            raise ValueError("a bad sentence")
        self.threads.append(torch.get_num_threads())
        self.added.append([words[0] for words in sentences])
        self.rows.update((key, (words, len(words))) for key, words in zip(keys, sentences))

    def advance(self, to_the_end: bool = False) -> list:
        firsts = [words[0] for words, _ in self.rows.values()]
        self.advances.append(firsts)
        self.to_the_end.append(to_the_end)
        if self.given is not None:
            self.advance_threads.append(self.given[threading.get_ident()])
        if "boom" in firsts:
            raise RuntimeError("an advance that fails")
        for word in firsts:
            if word in self.go:
                assert self.go[word].wait(WAIT), f"advance of {word} held past {WAIT} s"
        ended = []
        for key, (words, left) in list(self.rows.items()):
            if left == 1:
                del self.rows[key]
                ended.append((key, [words[0], len(words)]))
            else:
                self.rows[key] = (words, left - 1)
        return ended

    def drop(self) -> list:
        keys = list(self.rows)
        self.rows.clear()
        return keys


def sentence(name: str, length: int) -> list[str]:
    return [name, *["word"] * (length - 1)]


async def until(condition) -> None:
    for _ in range(WAIT * 100):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def run(test) -> None:
    asyncio.run(asyncio.wait_for(test(), WAIT))


async def held_then_queued(streamer: Streamer, work: Work, first: list[list[str]], then: list[list[str]]
                           ) -> tuple[asyncio.Future, asyncio.Future]:
    """Request `first`, wait until an advance holds it, then request `then` and wait until all of it is queued."""
    held = asyncio.ensure_future(streamer.vectors(first))
    await until(lambda: work.advances)
    queued = asyncio.ensure_future(streamer.vectors(then))
    await until(lambda: streamer.queued == len(then))
    return held, queued


def test_sentences_join_between_advances_as_they_come_and_leave_as_they_end():
    """"a" (4 words) held in its first advance; "b" (2) comes meanwhile, joins at the next advance beside "a" and
    leaves two advances later, while "a" goes on."""
    work = Work(held=("a",))

    async def test() -> None:
        streamer = Streamer(lambda: work, 100)
        streamer.start()
        a, b = await held_then_queued(streamer, work, [sentence("a", 4)], [sentence("b", 2)])
        assert streamer.running == 1
        work.go["a"].set()
        assert await b == [["b", 2]] and await a == [["a", 4]]
        await streamer.stop()

    run(test)
    assert work.advances == [["a"], ["a", "b"], ["a", "b"], ["a"]]
    assert work.added == [["a"], ["b"]]
    # "a" alone with none queued: to its end (the stand-in runs one step still); beside "b", or "b" queued: a few
    assert work.to_the_end == [True, False, False, True]


def test_the_stream_holds_at_most_max_batch_tokens_words_and_sentences_join_in_arrival_order():
    """At most 6 words in the stream: "b" (3 words) waits for "a" (4) to end, and "c" (2), which would fit beside "a",
    waits behind "b"; then both join together."""
    work = Work(held=("a",))

    async def test() -> None:
        streamer = Streamer(lambda: work, 6)
        streamer.start()
        a, rest = await held_then_queued(streamer, work, [sentence("a", 4)], [sentence("b", 3), sentence("c", 2)])
        work.go["a"].set()
        assert await a == [["a", 4]] and await rest == [["b", 3], ["c", 2]]
        await streamer.stop()

    run(test)
    assert work.advances == [["a"]] * 4 + [["b", "c"], ["b", "c"], ["b"]]
    assert work.added == [["a"], ["b", "c"]]


def test_sentences_that_fail_to_join_fail_their_request_and_a_failing_advance_fails_those_in_flight_only():
    """"bad" fails its request alone; "boom" joins beside the held "x", and the advance holding both fails both
    requests; the stream then starts again empty and "y" is answered."""
    work = Work(held=("x",))

    async def test() -> None:
        streamer = Streamer(lambda: work, 100)
        streamer.start()
        with pytest.raises(BatchFailed, match="a bad sentence"):
            await streamer.vectors([sentence("bad", 2)])
        x, boom = await held_then_queued(streamer, work, [sentence("x", 3)], [sentence("boom", 2)])
        work.go["x"].set()
        for request in (x, boom):
            with pytest.raises(BatchFailed, match="an advance that fails"):
                await request
        assert await streamer.vectors([sentence("y", 2)]) == [["y", 2]]
        assert streamer.running == 0 and streamer.alive
        await streamer.stop()
        assert not streamer.alive

    run(test)
    assert work.added == [["x"], ["boom"], ["y"]]


def test_a_failed_requests_sentences_still_queued_leave_the_count_and_never_join():
    """"boom" joins beside the held "x" (5 of 6 words), its request's "big" stays queued (5 words more); the advance
    fails both requests, and "big" is no longer counted as queued and never joins; "y" then is."""
    work = Work(held=("x",))

    async def test() -> None:
        streamer = Streamer(lambda: work, 6)
        streamer.start()
        x, failing = await held_then_queued(streamer, work, [sentence("x", 3)],
                                            [sentence("boom", 2), sentence("big", 5)])
        work.go["x"].set()
        for request in (x, failing):
            with pytest.raises(BatchFailed, match="an advance that fails"):
                await request
        assert streamer.queued == 0 and streamer.running == 0
        assert await streamer.vectors([sentence("y", 2)]) == [["y", 2]]
        assert streamer.queued == 0 and not streamer.queue
        await streamer.stop()

    run(test)
    assert work.added == [["x"], ["boom"], ["y"]]


def test_a_request_whose_client_went_away_before_it_joined_is_dropped_from_the_queue():
    work = Work(held=("a",))

    async def test() -> None:
        streamer = Streamer(lambda: work, 100)
        streamer.start()
        a, gone = await held_then_queued(streamer, work, [sentence("a", 2)], [sentence("gone", 2)])
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert streamer.queued == 0
        work.go["a"].set()
        assert await a == [["a", 2]]
        assert await streamer.vectors([sentence("c", 2)]) == [["c", 2]]
        await streamer.stop()

    run(test)
    assert work.added == [["a"], ["c"]]


def test_on_two_lanes_sentences_at_once_are_shared_and_a_sentence_alone_runs_on_all_the_threads():
    """Two lanes, two threads: four sentences at once, two on each lane (held until all four have joined), each lane
    on one thread; then a sentence alone runs to its end on both threads, on the first lane, back to one after."""
    given: dict[int, int] = {}
    works: list[Work] = []

    def make_work() -> Work:
        works.append(Work(held=tuple(f"h{i}" for i in range(4)), given=given))
        return works[-1]

    def set_threads(count: int) -> None:
        given[threading.get_ident()] = count

    async def test() -> None:
        streamer = Streamer(make_work, 100, lanes=2, threads=2, set_threads=set_threads)
        streamer.start()
        together = asyncio.ensure_future(streamer.vectors([sentence(f"h{i}", 2) for i in range(4)]))
        await until(lambda: all(work.advances for work in works))
        assert sorted(len(work.added[0]) for work in works) == [2, 2] and streamer.running == 4
        for work in works:
            for event in work.go.values():
                event.set()
        assert await together == [[f"h{i}", 2] for i in range(4)]
        assert await streamer.vectors([sentence("alone", 3)]) == [["alone", 3]]
        await streamer.stop()

    run(test)
    held = [work for work in works if ["alone"] not in work.advances]
    lone = [work for work in works if ["alone"] in work.advances]
    assert len(held) == 1 and lone == works[:1]  # the first lane's (the only one that runs on all the threads)
    assert held[0].advance_threads == [1, 1] and held[0].to_the_end == [False, False]
    lone_advances = [i for i, firsts in enumerate(lone[0].advances) if firsts == ["alone"]]
    # the stand-in runs one step an advance: each of the three alone, to the end, on both threads
    assert [lone[0].advance_threads[i] for i in lone_advances] == [2, 2, 2]
    assert [lone[0].to_the_end[i] for i in lone_advances] == [True] * 3
    assert sorted(set(given.values())) == [1]  # each lane's thread back to its share


def test_a_lanes_thread_is_given_its_torch_threads():
    """OpenMP's thread count is per thread: a lane's thread, given one more than torch's default here, has them (a
    thread left at the default would have one fewer, on any machine)."""
    before = torch.get_num_threads()
    work = Work()
    try:
        async def test() -> None:
            streamer = Streamer(lambda: work, 100, threads=before + 1, set_threads=torch.set_num_threads)
            streamer.start()
            assert await streamer.vectors([sentence("a", 1)]) == [["a", 1]]
            await streamer.stop()

        run(test)
    finally:
        torch.set_num_threads(before)
    assert work.threads == [before + 1]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_app_runs_a_lane_a_torch_thread_on_a_cpu_and_one_lane_on_all_of_them_on_a_gpu(device):
    """`create_app`'s lanes from the embedder's device alone (no GPU needed to check the GPU's), with two torch
    threads: on a CPU two lanes, each given one; on a GPU one, given both."""
    from types import SimpleNamespace

    from hf_elmo.serve import ServeOptions, create_app

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        embedder = SimpleNamespace(device=torch.device(device))
        streamer = create_app(embedder, ServeOptions(), make_work=Work).state.streamer
    finally:
        torch.set_num_threads(before)
    assert len(streamer.lanes) == (2 if device == "cpu" else 1) and streamer.threads == 2
    assert all(isinstance(lane.work, Work) for lane in streamer.lanes)
