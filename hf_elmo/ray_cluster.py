"""The Ray cluster a command runs on (`elmo embed --ray`, `elmo serve --ray`): the one at an address, or a local one of
the command's own, every process of it listening on the loopback interface only (Ray accepts drivers without
authentication: nothing off this machine may reach it), stopped with the command however it ends (a SIGKILL
included: `ray_guard.py`)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def ray_cluster(ray: Any, address: str | None) -> Iterator[dict[str, float]]:
    """Ray, and the cluster's resources: the cluster at `address` (or the one this process is connected to
    already), else a local one of this process's own, listening on loopback only, stopped after it. Python's SIGTERM
    handler is kept (Ray's core installs one that dumps its stack and aborts)."""
    started = not ray.is_initialized()
    guard = None
    if started:
        handler = signal.getsignal(signal.SIGTERM)
        with _loopback_only(address is None), _guarded(address is None) as guard:
            ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, **({"_node_ip_address": "127.0.0.1"} if address is None else {}))
        if threading.current_thread() is threading.main_thread() and handler is not None:
            signal.signal(signal.SIGTERM, handler)
    try:
        yield ray.cluster_resources()
    finally:
        if started:
            with shielded():
                ray.shutdown()
                if guard is not None:  # what Ray left running ends now
                    guard.stdin.close()
                    guard.wait(timeout=60)


@contextmanager
def _guarded(local: bool) -> Iterator[subprocess.Popen | None]:
    """While a local cluster starts (on Linux): its processes carry a mark in their environment, and a guard
    (`ray_guard.py`, started first) ends every process with the mark once this process's end closes its input:
    the guard's process, or None."""
    if not local or sys.platform != "linux":
        yield None
        return
    from . import ray_guard

    mark = uuid.uuid4().hex
    guard = subprocess.Popen([sys.executable, "-I", ray_guard.__file__, mark], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ[ray_guard.VARIABLE] = mark
    try:
        yield guard
    except BaseException:
        guard.stdin.close()
        guard.wait(timeout=60)
        raise
    finally:
        os.environ.pop(ray_guard.VARIABLE, None)


@contextmanager
def _loopback_only(local: bool) -> Iterator[None]:
    """While a local cluster starts: Ray's single-machine mode, whose node address is the loopback one, so that its
    GCS, raylet, agents and workers (which inherit the setting) listen there alone. Ray's only switch for it is the
    variable it reads for Windows and macOS, where it is the default."""
    if not local:
        yield
        return
    from ray._private import ray_constants

    saved = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]
        if saved[0] is None:
            os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)
        else:
            os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = saved[0]


@contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while Ray's processes are stopped: a second Ctrl-C must not leave them running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
