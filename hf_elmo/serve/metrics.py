"""The server's Prometheus metrics (`prometheus_client`, in a registry of the app's own): requests by route and
status, their latency, the sentences and words joining the stream together, the sentences and seconds of each
advance, and the sentences waiting to join and in the stream."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
WORD_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Metrics:
    """What `/metrics` exposes: `elmo_requests_total{route,status}`, `elmo_request_duration_seconds{route}`,
    `elmo_joined_sentences`, `elmo_joined_words` (per group of sentences that joined the stream together),
    `elmo_advance_sentences`, `elmo_advance_duration_seconds` (per advance of the stream: the sentences it held),
    and now: `elmo_queue_sentences` (waiting to join), `elmo_running_sentences` (in the stream),
    `elmo_serving_requests` (being served)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("elmo_requests", "Requests answered, by route and status", ["route", "status"],
                                registry=self.registry)
        self.latency = Histogram("elmo_request_duration_seconds", "Seconds from a request to its answer", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.joined_sentences = Histogram("elmo_joined_sentences", "Sentences joining the stream together",
                                          buckets=SENTENCE_BUCKETS, registry=self.registry)
        self.joined_words = Histogram("elmo_joined_words", "Words of the sentences joining the stream together",
                                      buckets=WORD_BUCKETS, registry=self.registry)
        self.advance_sentences = Histogram("elmo_advance_sentences", "Sentences in the stream per advance",
                                           buckets=SENTENCE_BUCKETS, registry=self.registry)
        self.advance_seconds = Histogram("elmo_advance_duration_seconds", "Seconds of an advance of the stream",
                                         buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue = Gauge("elmo_queue_sentences", "Sentences waiting to join the stream", registry=self.registry)
        self.running = Gauge("elmo_running_sentences", "Sentences in the stream", registry=self.registry)
        self.serving = Gauge("elmo_serving_requests", "Requests being served", registry=self.registry)

    def request_done(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def joined(self, sentences: int, words: int) -> None:
        self.joined_sentences.observe(sentences)
        self.joined_words.observe(words)

    def advanced(self, sentences: int, seconds: float) -> None:
        self.advance_sentences.observe(sentences)
        self.advance_seconds.observe(seconds)

    def exposition(self, queued: int, running: int, serving: int) -> bytes:
        self.queue.set(queued)
        self.running.set(running)
        self.serving.set(serving)
        return generate_latest(self.registry)
