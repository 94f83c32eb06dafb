"""A gate for the `elmo embed --ray` driver in the tests: a job that cannot finish before the test has done what it
came to do (interrupt, kill or stop something), whatever the machine's speed.

The driver hands out shard i only once the gate file holds a number greater than i (`open_to`); while it waits it
writes i to `GATE.waiting` (`held_at` tells a test where the job is held). `interrupt N` in the gate file: the driver
is interrupted (`KeyboardInterrupt`) when it would hand out shard N. No gate file: no wait. Installed in this process
(`gated`, `install`), or run as a driver process of its own: `python tests/ray_gate.py GATE embed --ray ...`
(SIGUSR1: it writes every thread's stack to stderr).
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import time
from pathlib import Path


def gated(give, gate: Path):
    """`_Pool._give`, held at `gate`; where the gate says `interrupt N`, shard N raises `KeyboardInterrupt` (as Ctrl-C
    would, there) instead."""

    def give_when_open(pool, worker, shard, shards) -> None:
        if (setting := _setting(gate))[0] == "interrupt" and shard.index >= int(setting[1]):
            raise KeyboardInterrupt
        while shard.index >= _limit(setting := _setting(gate)):
            mark = f"{shard.index} {setting[-1]}"
            waiting = gate.with_name(f"{gate.name}.waiting")
            if _text(waiting) != mark:
                waiting.write_text(mark)
            time.sleep(0.05)
        give(pool, worker, shard, shards)

    return give_when_open


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _setting(gate: Path) -> list[str]:
    """What the gate says: [limit, token] or [`interrupt`, N, token]; open (`inf`) when there is no gate."""
    return _text(gate).split() or ["inf", ""]


def _limit(setting: list[str]) -> float:
    return float("inf") if setting[0] == "interrupt" else float(setting[0])


def open_to(gate: Path, shards: float | str) -> None:
    """Let the driver hand out shards below `shards` (`float("inf")`: all; `"interrupt N"`: interrupt it at N). Each
    setting has a token of its own, so that `held_at` never reports a wait at an earlier one."""
    partial = gate.with_name(f".{gate.name}.partial")
    partial.write_text(f"{shards} {time.monotonic_ns()}")
    partial.replace(gate)


def held_at(gate: Path) -> int | None:
    """The shard the driver waits at under the gate's present setting, if it waits there."""
    index, _, token = _text(gate.with_name(f"{gate.name}.waiting")).partition(" ")
    return int(index) if index and token == _setting(gate)[-1] else None


def install(gate: Path) -> None:
    """Hold this process's `--ray` jobs at `gate`."""
    from hf_elmo.embed import ray_job

    ray_job._Pool._give = gated(ray_job._Pool._give, gate)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # what every thread is doing, when a test asks
    install(Path(sys.argv[1]))
    from elmo_cli import app

    app(sys.argv[2:], prog_name="elmo")
