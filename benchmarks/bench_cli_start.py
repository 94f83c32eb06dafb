"""How long the `elmo` command takes to answer when it has no model to run: `--help`, `--version` and usage errors,
each a fresh process (median of `--runs`), beside what importing `hf_elmo` costs (torch and transformers), which
those answers no longer pay.

    python benchmarks/bench_cli_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hf_elmo.runtime import cpu_name

# (what, the command's arguments, its expected exit code)
COMMANDS = [
    ("elmo --help", ["--help"], 0),
    ("elmo --version", ["--version"], 0),
    ("elmo embed --help", ["embed", "--help"], 0),
    ("usage error: elmo embed (no arguments)", ["embed"], 2),
    ("usage error: elmo embed --layers middle a b", ["embed", "--layers", "middle", "a", "b"], 2),
    ("usage error: elmo embed missing.txt out.npy", ["embed", "missing.txt", "out.npy"], 2),
]


def seconds(command: list[str], expected: int, runs: int) -> float:
    """The median wall time of `command` in a fresh process over `runs` runs (after one untimed run)."""
    timings = []
    for run in range(runs + 1):
        start = time.perf_counter()
        result = subprocess.run(command, capture_output=True)
        if run:
            timings.append(time.perf_counter() - start)
        if result.returncode != expected:
            raise SystemExit(f"{' '.join(command)} exited {result.returncode}, not {expected}: "
                             f"{result.stderr[-500:]!r}")
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    beside = Path(sys.executable).with_name("elmo")  # this interpreter's virtualenv's, else the PATH's
    elmo = str(beside) if beside.exists() else shutil.which("elmo") or sys.exit("no elmo command: pip install -e .")
    print(f"machine: {cpu_name()}; median of {args.runs} fresh processes each")
    baseline = seconds([sys.executable, "-c", "import hf_elmo"], 0, args.runs)
    name = "python -c 'import hf_elmo' (torch, transformers)"
    print(f"{name:<50} {baseline:>6.2f} s")
    for name, arguments, expected in COMMANDS:
        taken = seconds([elmo, *arguments], expected, args.runs)
        print(f"{name:<50} {taken:>6.2f} s  ({baseline / taken:.1f}x faster than the import)")


if __name__ == "__main__":
    main()
