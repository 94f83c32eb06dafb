"""`serve_on_ray`: `elmo serve --ray`, the same app (`app.create_app`: its routes, limits and batches) as a Ray Serve
deployment: each replica loads the model once and batches its own requests; Serve's HTTP proxy, on the head node at
`options`' address, spreads the requests over the replicas and replaces a replica that dies.

Without an address the cluster is the server's own (`ray_cluster`): every process of it listens on the loopback
interface only, but for the serving port on `--hostname`. On a cluster at an address (`--ray-address`), stopping
deletes the app and leaves Serve running, as the cluster's own. Each answer names its replica (`x-elmo-replica`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from ..ray_cluster import ray_cluster, shielded
from .options import ServeError, ServeOptions
from .server import bound

APP_NAME = "elmo"
# Autoscaling (--max-replicas): a replica is added when the requests it serves at once pass a batch's worth.
TARGET_ONGOING_REQUESTS = 32
REPLICA_HEADER = b"x-elmo-replica"


class Replica:
    """One replica: the model loaded once (`threads` torch threads), the app serving it, each answer naming the
    replica. `settings` as `EmbedSettings.to_dict` gives them, `options` as `dataclasses.asdict`; `local`: on a
    local cluster (its servers on loopback)."""

    def __init__(self, model: str, settings: dict[str, Any], options: dict[str, Any], threads: int, local: bool):
        from ray import serve

        from ..embed import ElmoEmbedder, EmbedSettings
        from ..runtime import bound_onednn_caches, set_threads
        from .app import create_app

        if local:
            _internal_server_on_loopback()
        set_threads(threads)
        bound_onednn_caches()
        embedder = ElmoEmbedder(model, settings=EmbedSettings.from_dict(settings))
        self._app = _naming(create_app(embedder, ServeOptions(**options)),
                            serve.get_replica_context().replica_id.unique_id)

    def __serve_build_asgi_app__(self) -> Callable:
        return self._app


def serve_on_ray(model: str | os.PathLike, settings: Any, options: ServeOptions, address: str | None = None,
                 replicas: int | None = None, max_replicas: int | None = None, threads: int | None = None,
                 announce: Callable[[str], object] = print) -> None:
    """Serve `model` with `settings` (an `EmbedSettings`) on Ray Serve within `options` (per replica) until SIGTERM
    or Ctrl-C: `replicas` of `threads` CPUs each (default: as many as the cluster's CPUs hold), or autoscaled up to
    `max_replicas`; on the cluster at `address`, else a local one. `announce` is given one line once every replica
    has loaded the model."""
    import ray
    from ray import serve

    threads = threads or 1
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if address is not None and options.port == 0:
        raise ServeError("--port 0 picks a free port of this machine, but with --ray-address Serve listens on the "
                         "cluster's head node: pass its --port")
    holding = contextlib.ExitStack()
    if address is None:  # the serving port is this machine's: taken, it is said before a cluster starts; else it is
        # held, listening, while the cluster starts (none of its processes may take it), then given to Serve
        held = holding.enter_context(bound(options))
        held.listen()
        options = dataclasses.replace(options, port=held.getsockname()[1])
    with holding, ray_cluster(ray, address) as resources:
        count = replicas or max(1, int(resources.get("CPU", 1) // threads))
        scaling: dict[str, Any] = ({"num_replicas": count} if max_replicas is None else {"autoscaling_config": {
            "min_replicas": count if replicas else 1, "max_replicas": max(max_replicas, replicas or 1),
            "target_ongoing_requests": TARGET_ONGOING_REQUESTS}})
        # A replica takes --max-concurrent-requests at once; Serve's proxy holds as many again for all of them at
        # most, and answers 503 past that (its back-pressure): never an unbounded queue.
        deployment = serve.deployment(
            serve.ingress()(Replica), name=APP_NAME, ray_actor_options={"num_cpus": threads},
            max_ongoing_requests=options.max_concurrent_requests,
            max_queued_requests=options.max_concurrent_requests * (max_replicas or count), **scaling)
        stopped = _stop_event()
        try:
            try:
                holding.close()
                serve.start(proxy_location="HeadOnly", http_options={"host": options.hostname, "port": options.port})
            except ray.exceptions.RayError as error:  # e.g. its HTTP proxy killed by Serve, not ready in time
                reason = _last_line(error) or type(error).__name__
                raise ServeError(f"Ray Serve could not start: {reason} (Ray's logs: {_logs()})") from None
            try:
                serve.run(deployment.bind(str(model), settings.to_dict(), dataclasses.asdict(options), threads,
                                          address is None),
                          name=APP_NAME, route_prefix="/")
            except RuntimeError:  # Serve's "Deploying application ... failed"; the replica's error is its status
                raise ServeError(f"the replicas could not start: {_replica_error(serve)} (Ray's logs: {_logs()})"
                                 ) from None
            announce(f"serving {options.model_id} on http://{options.hostname}:{options.port} with Ray Serve "
                     f"({_replicas_text(scaling)}; TEI's and OpenAI's embedding APIs; /docs)")
            stopped.wait()
        finally:
            with shielded():  # the replicas answer what they hold first
                serve.shutdown() if address is None else serve.delete(APP_NAME)


def _internal_server_on_loopback() -> None:
    """In this replica's process: Serve's inter-deployment gRPC server (started once the replica is built) on the
    loopback interface, where Serve binds it on every interface with no setting to say otherwise
    (ray-project/ray#64544); on a local cluster every peer of it is on this machine's loopback."""
    from ray.serve._private import replica

    add_port = replica.add_port_to_grpc_server
    replica.add_port_to_grpc_server = lambda server, address: add_port(server, address.replace("[::]", "127.0.0.1"))


def _naming(app: Callable, replica: str) -> Callable:
    """`app` with the header `x-elmo-replica: replica` on each answer (ASGI)."""
    name = replica.encode()

    async def named(scope: dict, receive: Callable, send: Callable) -> None:
        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (REPLICA_HEADER, name)]}
            await send(message)

        await app(scope, receive, sending if scope["type"] == "http" else send)

    return named


def _stop_event() -> threading.Event:
    """An event set by SIGTERM or Ctrl-C (in the main thread; elsewhere, never)."""
    stopped = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda *_: stopped.set())
    return stopped


def _replicas_text(scaling: dict[str, Any]) -> str:
    if "num_replicas" in scaling:
        return f"{scaling['num_replicas']} replica{'s' if scaling['num_replicas'] > 1 else ''}"
    autoscaling = scaling["autoscaling_config"]
    return f"{autoscaling['min_replicas']} to {autoscaling['max_replicas']} replicas"


def _replica_error(serve: Any) -> str:
    """The replica's own error, as the deployment's status holds it."""
    try:
        message = serve.status().applications[APP_NAME].deployments[APP_NAME].message
    except (KeyError, AttributeError):
        message = ""
    return _last_line(message) or "see the logs"


def _last_line(text: object) -> str:
    """The last line of an error's text: after a traceback, the exception itself ("" for none)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _logs() -> str:
    from ray._private.worker import global_worker

    node = getattr(global_worker, "node", None)
    return f"{node.get_logs_dir_path()}/serve" if node is not None else "the cluster's session directory"
