"""`serve`: what `elmo serve` runs: a model behind the app (`app.create_app`) in this process, run by uvicorn (`run`)
until SIGTERM or Ctrl-C: it stops taking requests, answers those it holds, then returns."""

from __future__ import annotations

import errno
import os
import signal
import socket
from collections.abc import Callable

from ..runtime import bound_onednn_caches, set_threads
from .options import ServeError, ServeOptions


def serve(model: str | os.PathLike, settings: object, options: ServeOptions, threads: int | None = None,
          announce: Callable[[str], object] = print) -> None:
    """Serve `model` (a name, directory or Hub id, loaded once) with `settings` (an `EmbedSettings`) within
    `options`; `announce` is given one line once the model is loaded and the address is the server's."""
    from ..embed import ElmoEmbedder
    from .app import create_app

    set_threads(threads)
    bound_onednn_caches()
    embedder = ElmoEmbedder(model, settings=settings)
    app = create_app(embedder, options)
    run(app, options, lambda url: announce(f"serving {options.model_id} on {url} (TEI's and OpenAI's embedding "
                                           "APIs; /docs)"))


def run(app: object, options: ServeOptions, announce: Callable[[str], object] | None = None) -> None:
    """Run the ASGI `app` on `options`' address until SIGTERM or Ctrl-C (a second Ctrl-C: at once), the requests
    held answered. The address is taken first (`ServeError` where it cannot be), then `announce` is given its URL
    (port 0: the port the system picked)."""
    import uvicorn

    with bound(options) as listening:
        if announce is not None:
            announce(f"http://{_host(options.hostname)}:{listening.getsockname()[1]}")
        config = uvicorn.Config(app, host=options.hostname, port=options.port, log_level="warning",
                                access_log=False, timeout_graceful_shutdown=None, lifespan="on")
        # uvicorn raises the signal that stopped it again once it is done, under the handlers it found: the normal
        # way a service is stopped ends here as a return.
        previous = {number: signal.signal(number, lambda *_: None) for number in (signal.SIGTERM, signal.SIGINT)}
        try:
            uvicorn.Server(config).run(sockets=[listening])
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)


def bound(options: ServeOptions) -> socket.socket:
    """A socket bound to `options`' address, as uvicorn binds one; `ServeError` in one line where it cannot be."""
    address = f"{_host(options.hostname)}:{options.port}"
    listening = socket.socket(socket.AF_INET6 if ":" in options.hostname else socket.AF_INET)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((options.hostname, options.port))
    except OSError as error:
        listening.close()
        if error.errno == errno.EADDRINUSE:
            raise ServeError(f"{address} is in use (another server listens there): stop it, or pass another --port"
                             ) from None
        raise ServeError(f"cannot listen on {address}: {error.strerror or error}: pass a --hostname of this "
                         "machine (127.0.0.1, 0.0.0.0, or one of its addresses) and a --port it may use") from None
    return listening


def _host(hostname: str) -> str:
    return f"[{hostname}]" if ":" in hostname else hostname
