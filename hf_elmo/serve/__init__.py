"""ELMo as a service (`elmo serve`, the `serve` extra): Text Embeddings Inference's and OpenAI's embedding APIs over
an `ElmoEmbedder`, batched across requests.

- `options`: `ServeOptions`, the server's address and limits (TEI's names), and `ServeError` (it cannot serve);
  read by `elmo` without the package.
- `batching`: `Streamer`, the sentences of concurrent requests joining and leaving the biLM's steps (continuous
  batching), at most `max_batch_tokens` words at once.
- `app`: `create_app`, the FastAPI app: routes, errors in one line, authorization, limits.
- `metrics`: its Prometheus metrics.
- `server`: `serve`, the app run by uvicorn in this process; `ray_serve`: the same app on Ray Serve.
"""

from .app import create_app
from .options import SERVE_SETTINGS, ServeOptions
from .server import serve

__all__ = ["SERVE_SETTINGS", "ServeOptions", "create_app", "serve"]
