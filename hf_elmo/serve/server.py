"""`serve`: what `elmo serve` runs: a model behind the app (`app.create_app`) in this process, run by uvicorn (`run`)
until SIGTERM or Ctrl-C: it stops taking requests, answers those it holds, then returns."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from ..runtime import bound_onednn_caches, set_threads
from .options import ServeOptions


def serve(model: str | os.PathLike, settings: object, options: ServeOptions, threads: int | None = None,
          announce: Callable[[str], object] = print) -> None:
    """Serve `model` (a name, directory or Hub id, loaded once) with `settings` (an `EmbedSettings`) within
    `options`; `announce` is given one line once the model is loaded, before the server listens."""
    from ..embed import ElmoEmbedder
    from .app import create_app

    set_threads(threads)
    bound_onednn_caches()
    embedder = ElmoEmbedder(model, settings=settings)
    app = create_app(embedder, options)
    announce(f"serving {options.model_id} on http://{_host(options.hostname)}:{options.port} (TEI's and OpenAI's "
             "embedding APIs; /docs)")
    run(app, options)


def run(app: object, options: ServeOptions) -> None:
    """Run the ASGI `app` on `options`' address until SIGTERM or Ctrl-C (a second Ctrl-C: at once), the requests
    held answered."""
    import uvicorn

    config = uvicorn.Config(app, host=options.hostname, port=options.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=None, lifespan="on")
    # uvicorn raises the signal that stopped it again once it is done, under the handlers it found: the normal way
    # a service is stopped ends here as a return.
    previous = {number: signal.signal(number, lambda *_: None) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        uvicorn.Server(config).run()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _host(hostname: str) -> str:
    return f"[{hostname}]" if ":" in hostname else hostname
