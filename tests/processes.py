"""Processes a test starts, ended when the test ends whatever happened (`Processes.end`, the `processes` fixture):
each in a session of its own, so that what it started (a local Ray cluster, its workers) is found and ended with it;
each killed by the kernel if the test process dies first (`PR_SET_PDEATHSIG`), so that a pytest stopped by a timeout
leaves none running."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

import psutil

PR_SET_PDEATHSIG = 1


def interruptible() -> None:
    """In a child before it runs its command: Ctrl-C's signals at their defaults, as a shell starts a foreground
    command. A test run started in the background of a script (`make test &`) has SIGINT and SIGQUIT ignored, every
    process it starts inherits that, and Python then never raises `KeyboardInterrupt`: a test's SIGINT would be lost."""
    for number in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)


def _started_child() -> None:
    """`interruptible`, and killed by the kernel when the test process dies."""
    interruptible()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def session_processes(leader: int) -> list[psutil.Process]:
    """The live processes of the session `leader` started (itself and all it started that stayed in it)."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == leader and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def kill_session(process: subprocess.Popen) -> None:
    """Kill `process` and what it started in its session (which may hold its output pipes open)."""
    for member in session_processes(process.pid):
        try:
            member.kill()
        except psutil.Error:
            pass
    process.kill()


class Processes:
    """Starts processes (`start`) and ends every one, with its session, in `end`."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, command: list[object], env: dict[str, str] | None = None, **options) -> subprocess.Popen:
        """`command` (its items as text) in a session of its own, its output captured, SIGINT at its default
        (`interruptible`)."""
        process = subprocess.Popen([str(item) for item in command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env, start_new_session=True, preexec_fn=_started_child, **options)
        self.started.append(process)
        return process

    def end(self, timeout: float = 30.0) -> None:
        """Kill every process started, and what each started in its session; wait until all are gone."""
        for process in self.started:
            kill_session(process)
            process.communicate()
        deadline = time.monotonic() + timeout
        for process in self.started:
            while session_processes(process.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        self.started.clear()
