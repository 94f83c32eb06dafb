"""The guard of a local Ray cluster (`ray_cluster`), run as a script of its own (`python ray_guard.py MARK`, nothing
else imported): once its standard input closes (the command that started it ended, however it ended: a SIGKILL
runs no handler), it ends the cluster's processes. Ray's agents otherwise outlive a killed command: they wait a
minute or more on their dead GCS.

The cluster's processes: those whose environment (as they were started) holds `ELMO_RAY_CLUSTER=MARK` (the GCS,
the raylet, the workers), and every process they start (the raylet starts its agents with an environment of its
own), noted while they run: an agent is a child of the raylet only until the raylet dies.

Linux only (it reads /proc). SIGINT and SIGTERM are ignored: a Ctrl-C or a kill of the command's process group must
not stop it before it has done its work."""

from __future__ import annotations

import os
import select
import signal
import sys
import time

VARIABLE = "ELMO_RAY_CLUSTER"
LOOK_SECONDS = 0.5  # how often the guard notes the cluster's processes


def _processes() -> dict[int, tuple[int, int]]:
    """Every live process of /proc (the guard and zombies excepted): its (parent, start time)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()  # after "pid (name)"
        except OSError:
            continue
        if fields[0] != b"Z":
            found[int(name)] = (int(fields[1]), int(fields[19]))
    return found


def _marked(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return entry in environ.read().split(b"\0")
    except OSError:  # gone, or another user's
        return False


def cluster(mark: str, known: dict[int, int]) -> dict[int, int]:
    """`known` (pid → start time) with the cluster's processes now: the marked ones and their descendants (those of
    `known` too), each known by its start time (a pid reused by another process is not the cluster's)."""
    entry = f"{VARIABLE}={mark}".encode()
    processes = _processes()
    found = {pid: start for pid, start in known.items() if processes.get(pid, (0, None))[1] == start}
    found.update({pid: start for pid, (_, start) in processes.items() if pid not in found and _marked(pid, entry)})
    grown = True
    while grown:
        children = {pid: start for pid, (parent, start) in processes.items() if parent in found and pid not in found}
        found.update(children)
        grown = bool(children)
    return found


def main() -> None:
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    mark, known = sys.argv[1], {}
    while not select.select([sys.stdin], [], [], LOOK_SECONDS)[0]:
        known = cluster(mark, known)
    # The command has ended (its end closed the pipe): SIGKILL to what is left, again while new ones appear (a dying
    # raylet may still start one), for at most 10 s.
    deadline = time.monotonic() + 10
    while (known := cluster(mark, known)) and time.monotonic() < deadline:
        for pid in known:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        time.sleep(0.1)


if __name__ == "__main__":
    main()
