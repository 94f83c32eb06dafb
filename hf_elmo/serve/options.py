"""How `elmo serve` serves: its limits and where it listens, with Text Embeddings Inference's names and, where they
fit ELMo, its defaults (`ServeOptions`); and the embedding settings a server starts from (`SERVE_SETTINGS`).

This module imports nothing but the standard library when it is loaded: `elmo` reads it without importing the
package, for its defaults and help. Keep it so.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a server embeds with unless told otherwise: one vector per input, the mean over its words of the average of
# the biLM's layers (`/embed`; `/embed_all` gives the words' vectors of the same layers).
SERVE_SETTINGS = {"layers": "average", "pool": "mean"}
# `--ray`: seconds Serve gives its HTTP proxy to become ready before it kills it
# (`RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S`; Serve's 5 are less than a busy 2-core machine needs to start it), in the
# environment a local cluster starts with.
PROXY_READY_SECONDS = "60"


@dataclass(frozen=True)
class ServeOptions:
    """Where a server listens and what it takes (TEI's flags). `hostname`, `port`: its address (loopback unless
    told). `api_key`: without `Authorization: Bearer <api_key>`, a request gets 401 (health and ping stay open).
    `max_batch_tokens`: the words in the biLM at once across requests, and the most words of one input (longer: 413,
    or cut with `truncate`). `max_client_batch_size`: inputs per request. `max_concurrent_requests`: requests being
    served at once; more get 429 at once. `payload_limit`: bytes of a request body (413). `auto_truncate`: cut
    inputs that are too long unless a request says otherwise. `model_id`: the model's name in answers."""

    hostname: str = "127.0.0.1"
    port: int = 3000
    api_key: str | None = None
    max_batch_tokens: int = 4096
    max_client_batch_size: int = 32
    max_concurrent_requests: int = 512
    payload_limit: int = 2_000_000
    auto_truncate: bool = False
    model_id: str = "default"


class ServeError(RuntimeError):
    """A server that cannot serve (one line: why, and what to do): its address taken, or Ray Serve not started."""
