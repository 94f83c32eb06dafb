"""Ray clusters for the tests: two nodes of one CPU each on this machine (`two_nodes`), reached from here only,
without Ray's token authentication (`RAY_ENV`: a cluster started in this process and one started by another would
each write its token file)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from hf_elmo.serve.options import PROXY_READY_SECONDS

# (and Serve's HTTP proxy given the time a busy machine needs to start it, as `elmo serve --ray` gives a local cluster)
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": PROXY_READY_SECONDS}


@contextmanager
def ray_environment(**extra: str) -> Iterator[None]:
    """`RAY_ENV` and `extra` in this process's environment (a cluster started here takes them to its processes), then
    the environment as it was."""
    variables = {**RAY_ENV, **extra}
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)


@contextmanager
def two_nodes() -> Iterator[str]:
    """Two Ray nodes of one CPU each, this process connected to them as a driver; their address."""
    import ray
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        nodes.add_node(num_cpus=1)
        nodes.wait_for_nodes()
        ray.init(address=nodes.address, log_to_driver=False)
        yield nodes.address
    finally:
        ray.shutdown()
        nodes.shutdown()
