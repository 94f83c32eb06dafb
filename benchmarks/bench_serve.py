"""`elmo serve` under load, beside `elmo embed` and the library on the same sentences and cores: throughput at
`--clients` concurrent clients, the latency of one 20-word request, p50/p99 at half and at twice the sustainable rate,
the server's memory over many requests.

    python benchmarks/bench_serve.py --model default --sentences 3000 --memory-requests 20000

The sentences are PTB's validation lines of 1 to 40 words (../shared/data/ptb; random Zipfian sentences where it is
missing), one per request, sent to `/embed` by a lean asyncio client in this process; the server is `elmo serve
MODEL` in a process of its own on 127.0.0.1, started and stopped (SIGTERM) by this script.

- Throughput: the sentences through each `--clients` count of clients, each sending its next request as its last
  is answered, in words per second; beside it, `elmo embed MODEL INPUT OUTPUT --layers average --pool mean` on the
  same sentences, its start-up (a one-line job) taken off; their ratio. A sample of the served vectors is checked
  against elmo embed's (the float32 bound of a sentence's vectors across batches). Beside each: the sentences an
  advance of the server's stream held (/metrics), and the library's rate through the same stream holding as many
  sentences as there are clients, in arrival order, without HTTP (the most such a server can do: docs/serving.md).
- Latency: one 20-word request at a time to the idle server before the loads (median of `--calls`), beside the
  library's `ElmoEmbedder.embed_sentence` on the same sentence in this process, alternated with it.
- Rates: requests sent on a fixed schedule (open loop) for `--rate-seconds` at half and at twice the throughput's
  requests per second, the server started with `--max-concurrent-requests` `--overload-limit`: p50/p99 of the
  answered requests and how many were refused (429).
- Memory: the server's RSS before and after `--memory-requests` requests (the throughput's clients).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import psutil

from hf_elmo.embed import ElmoEmbedder, read_vectors
from hf_elmo.embed.streaming import EmbedderStream
from hf_elmo.runtime import cpu_name, set_threads
from hf_elmo.text import split_into_words

PTB = Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb" / "ptb.valid.txt"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def sentences_of(count: int) -> list[str]:
    """`count` lines of 1 to 40 words: PTB's validation text (cycled), else random sentences."""
    if PTB.is_file():
        lines = [line.strip() for line in PTB.read_text(encoding="utf-8").splitlines()]
    else:
        rng = np.random.default_rng(0)
        vocabulary = [f"w{i}" for i in range(5000)]
        lines = [" ".join(rng.choice(vocabulary, size=int(rng.integers(1, 41)))) for _ in range(count)]
    lines = [line for line in lines if 1 <= len(line.split()) <= 40]
    return [lines[i % len(lines)] for i in range(count)]


class Server:
    """`elmo serve MODEL OPTIONS` on `port` of 127.0.0.1 (None: a free one), in a process this object starts and
    stops."""

    def __init__(self, model: str, options: list[str], threads: int, port: int | None):
        if port is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "elmo_cli", "serve", model, "--port", str(port), "--threads", str(threads),
             *options], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"elmo serve ended ({self.process.returncode}): {self.process.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit("elmo serve did not answer /health within 300 s")
            time.sleep(0.1)

    def rss(self) -> int:
        return psutil.Process(self.process.pid).memory_info().rss

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stderr.close()


class Connection:
    """One keep-alive HTTP/1.1 connection to the server, as lean as a load tool's (requests made beforehand, answers
    read by their length, unparsed): the client's CPU, on the server's machine, stays small."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.closing = False  # the server said it closes the connection (an answer given before the body was read)

    @classmethod
    async def open(cls, url: str) -> Connection:
        host, port = url.removeprefix("http://").split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def post(self, request: bytes) -> tuple[int, bytes]:
        """The status and body of the answer to `request` (`request_of`'s bytes)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").lower().split("\r\n")
        length = next(int(line.split(":")[1]) for line in lines if line.startswith("content-length:"))
        self.closing = "connection: close" in lines
        return int(lines[0].split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def request_of(text: str, normalize: bool = True) -> bytes:
    """A `POST /embed` of `text`."""
    body = json.dumps({"inputs": text, "normalize": normalize}).encode()
    return (b"POST /embed HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


async def closed_loop(url: str, texts: list[str], clients: int, keep: int = 0) -> tuple[float, list[np.ndarray]]:
    """Seconds to send every text to `/embed` from `clients` clients (each its next text as its last is answered),
    and the vectors of the first `keep` texts."""
    requests = [request_of(text, normalize=False) for text in texts]
    connections = [await Connection.open(url) for _ in range(clients)]
    kept: dict[int, np.ndarray] = {}
    next_text = iter(range(len(texts)))

    async def one_client(connection: Connection) -> None:
        for index in next_text:
            status, body = await connection.post(requests[index])
            if status != 200:
                raise SystemExit(f"/embed answered {status}: {body[:300]}")
            if index < keep:
                kept[index] = np.asarray(json.loads(body)[0], dtype=np.float32)

    started = time.perf_counter()
    await asyncio.gather(*(one_client(connection) for connection in connections))
    seconds = time.perf_counter() - started
    for connection in connections:
        connection.close()
    return seconds, [kept[index] for index in sorted(kept)]


async def open_loop(url: str, texts: list[str], rate: float, seconds: float) -> tuple[list[float], int]:
    """Requests sent at `rate` per second for `seconds` (each on a free connection, or a new one, as HTTP clients
    pool them), whatever is answered: the answered ones' latencies and how many were refused (429)."""
    latencies, refused, idle = [], 0, []

    async def one(index: int) -> None:
        nonlocal refused
        sent = time.perf_counter()
        request = request_of(texts[index % len(texts)])
        connection = idle.pop() if idle else await Connection.open(url)
        try:
            status, body = await connection.post(request)
        except (asyncio.IncompleteReadError, ConnectionError):  # idle past the server's keep-alive: a new one
            connection.close()
            connection = await Connection.open(url)
            status, body = await connection.post(request)
        if status == 429:
            refused += 1
        elif status != 200:
            raise SystemExit(f"/embed answered {status}: {body[:300]}")
        else:
            latencies.append(time.perf_counter() - sent)
        if connection.closing:
            connection.close()
        else:
            idle.append(connection)

    started, tasks = time.perf_counter(), []
    for index in range(int(rate * seconds)):
        await asyncio.sleep(max(0.0, started + index / rate - time.perf_counter()))
        tasks.append(asyncio.ensure_future(one(index)))
    await asyncio.gather(*tasks)
    for connection in idle:
        connection.close()
    return latencies, refused


async def one_at_a_time(url: str, request: bytes, call: Callable[[], object], calls: int) -> tuple[float, float]:
    """The median seconds of `request` sent to an idle server, each after the last is answered, and of `call` (the
    library's, in this process), alternated in rounds of 5 of each (one warm-up of each first): side by side, so that
    the host's speed moves both alike."""
    connection = await Connection.open(url)
    served, library = [], []
    for size in [1] + [5] * (calls // 5) + [calls % 5]:
        for _ in range(size):
            started = time.perf_counter()
            status, body = await connection.post(request)
            if status != 200:
                raise SystemExit(f"/embed answered {status}: {body[:300]}")
            served.append(time.perf_counter() - started)
        for _ in range(size):
            started = time.perf_counter()
            call()
            library.append(time.perf_counter() - started)
    connection.close()
    return float(np.median(served[1:])), float(np.median(library[1:]))


def elmo_embed(model: str, source: Path, output: Path, threads: int) -> float:
    command = [sys.executable, "-m", "elmo_cli", "embed", model, str(source), str(output), "--layers", "average",
               "--pool", "mean", "--threads", str(threads), "-q"]
    started = time.perf_counter()
    result = subprocess.run(command, env=ENV, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {result.stderr.strip()[-2000:]}")
    return time.perf_counter() - started


def streamed(embedder: ElmoEmbedder, sentences: list[list[str]], in_flight: int) -> float:
    """Seconds of `embedder`'s vectors of `sentences` through its stream (`EmbedderStream`, the server's) holding
    `in_flight` at a time, the next joining as one ends, in this process without HTTP: the most a server with
    `in_flight` one-sentence clients can do."""
    stream, joined = EmbedderStream(embedder), 0
    started = time.perf_counter()
    while joined < len(sentences) or len(stream):
        count = min(in_flight - len(stream), len(sentences) - joined)
        stream.add(sentences[joined : joined + count], range(joined, joined + count))
        joined += count
        stream.advance()
    return time.perf_counter() - started


def advance_sentences(url: str) -> tuple[float, float]:
    """(advances of the stream, the sentences they held) so far, from the server's /metrics."""
    figures = dict(line.split() for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines()
                   if line.startswith(("elmo_advance_sentences_count ", "elmo_advance_sentences_sum ")))
    return float(figures["elmo_advance_sentences_count"]), float(figures["elmo_advance_sentences_sum"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a name, save_pretrained directory or Hub id")
    parser.add_argument("--sentences", type=int, default=3000, help="sentences of the throughput runs")
    parser.add_argument("--clients", type=int, nargs="+", default=[32, 128], help="concurrent clients of the "
                        "throughput runs (the first: the memory run's, and the sustainable rate's)")
    parser.add_argument("--calls", type=int, default=50, help="one-request latencies measured (median)")
    parser.add_argument("--rate-seconds", type=float, default=10.0)
    parser.add_argument("--overload-limit", type=int, default=64, help="the server's --max-concurrent-requests "
                        "in the rate runs")
    parser.add_argument("--memory-requests", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of every run")
    parser.add_argument("--port", type=int, help="the servers' port on 127.0.0.1 [default: a free one]")
    args = parser.parse_args()
    texts = sentences_of(args.sentences)
    words = sum(len(text.split()) for text in texts)
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs; model {args.model}; {len(texts):,} sentences of 1-40 "
          f"words, {words:,} words; {args.threads} threads in the server, elmo embed and the library")

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "input.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
        (folder / "one.txt").write_text(texts[0] + "\n", encoding="utf-8")
        start_up = elmo_embed(args.model, folder / "one.txt", folder / "one.parquet", args.threads)
        batch_seconds = elmo_embed(args.model, folder / "input.txt", folder / "all.parquet", args.threads)
        expected = read_vectors(folder / "all.parquet")
    # None: the input is too small to time apart from the start-up's noise (toy sizes)
    batch_rate = words / (batch_seconds - start_up) if batch_seconds > 1.5 * start_up else None

    set_threads(args.threads)
    library = ElmoEmbedder(args.model, layers="average", pool="mean")
    twenty = " ".join(" ".join(texts).split()[:20])
    sentence = split_into_words(twenty, library.tokenizer.word_tokenizer)
    sentences = [split_into_words(text, library.tokenizer.word_tokenizer) for text in texts]
    ceilings = {clients: words / streamed(library, sentences, clients) for clients in args.clients}

    server = Server(args.model, [], args.threads, args.port)
    try:
        print(f"elmo embed: {f'{batch_rate:,.0f}' if batch_rate else 'n/a'} words/s ({start_up:.1f} s of start-up "
              f"taken off {batch_seconds:.1f} s)")
        served_latency, library_latency = asyncio.run(one_at_a_time(
            server.url, request_of(twenty), lambda: library.embed_sentence(sentence), args.calls))
        for clients in args.clients:
            advances_before = advance_sentences(server.url)
            seconds, served = asyncio.run(closed_loop(server.url, texts, clients, keep=200))
            advances, held = (after - before for after, before in zip(advance_sentences(server.url), advances_before))
            difference = max(float(np.abs(a - b).max()) for a, b in zip(served, expected, strict=False))
            if clients == args.clients[0]:
                requests_per_second = len(texts) / seconds
            print(f"elmo serve, {clients} clients: {words / seconds:,.0f} words/s ({len(texts) / seconds:,.1f} "
                  f"requests/s), x{f'{words / seconds / batch_rate:.2f}' if batch_rate else 'n/a'} elmo embed's (goal "
                  f"at 32: >= 0.85); its first {len(served)} vectors against elmo embed's: max abs diff "
                  f"{difference:.1e}; {held / advances:.1f} sentences an advance. The library's stream of {clients} "
                  f"of these sentences at a time, without HTTP: {ceilings[clients]:,.0f} words/s (x"
                  f"{f'{ceilings[clients] / batch_rate:.2f}' if batch_rate else 'n/a'} elmo embed's); the server "
                  f"reaches x{words / seconds / ceilings[clients]:.2f} of it")

        print(f"one 20-word request: elmo serve {served_latency * 1000:.1f} ms, the library's embed_sentence "
              f"{library_latency * 1000:.1f} ms: {(served_latency - library_latency) * 1000:+.1f} ms "
              f"(x{served_latency / library_latency:.2f}; goal within 10 % or 5 ms)")

        before = server.rss()
        memory_texts = [texts[i % len(texts)] for i in range(args.memory_requests)]
        memory_seconds, _ = asyncio.run(closed_loop(server.url, memory_texts, args.clients[0]))
        after = server.rss()
        print(f"memory: RSS {before / 2**20:,.0f} MiB before {args.memory_requests:,} requests, {after / 2**20:,.0f} "
              f"MiB after ({(after - before) / 2**20:+,.1f} MiB; {args.memory_requests / memory_seconds:,.0f} "
              "requests/s)")
    finally:
        server.stop()

    server = Server(args.model, ["--max-concurrent-requests", str(args.overload_limit)], args.threads,
                    args.port)
    try:
        asyncio.run(closed_loop(server.url, texts[:300], args.clients[0]))  # its first batches of each shape
        for share in (0.5, 2.0):
            latencies, refused = asyncio.run(open_loop(server.url, texts, share * requests_per_second,
                                                       args.rate_seconds))
            p50, p99 = (np.percentile(latencies, q) * 1000 if latencies else float("nan") for q in (50, 99))
            print(f"x{share} the sustainable rate ({share * requests_per_second:,.1f} requests/s for "
                  f"{args.rate_seconds:.0f} s, --max-concurrent-requests {args.overload_limit}): p50 {p50:.1f} ms, "
                  f"p99 {p99:.1f} ms over {len(latencies):,} answered; {refused:,} refused (429)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
