"""The tests' own process starters and server ports: what they start can be interrupted however the test run itself was
started, and listens where no other socket is put."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from elmo_fixtures import server_port
from processes import Processes, interruptible

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def ignored_signals(pid: int) -> set[int]:
    """The signals process `pid` ignores (its SigIgn mask in /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {number for number in range(1, 65) if mask >> (number - 1) & 1}
    raise AssertionError(f"no SigIgn in /proc/{pid}/status")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_children_take_ctrl_c_even_where_the_test_run_ignores_it(processes: Processes):
    """A test run started in the background of a script ignores SIGINT and SIGQUIT, and so would every process it
    starts (a SIGINT sent by a test then never arrives: its driver waited at its gate until the test timed out)."""
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGQUIT)}
    try:
        inherited = subprocess.Popen(SLEEP)
        started = [processes.start(SLEEP), subprocess.Popen(SLEEP, preexec_fn=interruptible)]
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    try:
        assert {signal.SIGINT, signal.SIGQUIT} <= ignored_signals(inherited.pid)  # what a plain child gets
        for process in started:
            assert not {signal.SIGINT, signal.SIGQUIT} & ignored_signals(process.pid)
        started[1].send_signal(signal.SIGINT)
        assert started[1].wait(timeout=30) == -signal.SIGINT
    finally:
        for process in (inherited, *started):
            process.kill()
            process.wait()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_servers_port_is_free_and_never_one_the_kernel_or_ray_hands_out(monkeypatch):
    """Between Ray's worker ports and the kernel's ephemeral range, each xdist worker in its own part of it."""
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    middle = 20000 + (ephemeral - 20000) // 2
    for worker, (low, high) in (("gw0", (20000, middle)), ("gw1", (middle, ephemeral))):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        for _ in range(20):
            port = server_port()
            assert low <= port < high
            with socket.socket() as server:
                server.bind(("127.0.0.1", port))
