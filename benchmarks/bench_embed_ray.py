"""`elmo embed` in one process vs. `elmo embed --ray` with its defaults (and other worker counts), on the same cores
and input: wall time, the start-up of each kind of run reported apart, the ratios to one process with and without it,
and on a two-node `ray.cluster_utils.Cluster` what each node reaches.

    python benchmarks/bench_embed_ray.py --model default --words 236000 --workers 1

The input is the first lines of PTB's training text (a sentence per line, ../shared/data/ptb) until `--words` words
(random Zipfian sentences where it is missing). Every run is `elmo embed [--ray ...] MODEL INPUT OUTPUT --pool mean`
in a process of its own (raw text split by the model's word tokenizer, as a user runs it), its cluster (for `--ray`
without an address, a local one started for the job), workers, model loads and exit all included. Start-up is a
one-line job of the same kind: what a run costs before its first sentence and after its last. The steady ratio is
(one process's time - its start-up) / (the run's time - its start-up). Every output is checked against one
process's (float32 rounding: a sentence's vectors depend on its batch only there).

`--workers W` adds `--ray --workers W --cpus-per-worker (cores / W)` runs beside the defaults; the two-node run
(`--no-nodes` leaves it out) starts two nodes of half the cores each and runs the defaults on them through
`--ray-address`, then reads from each shard which node wrote it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hf_elmo.embed import read_vectors
from hf_elmo.runtime import cpu_name

PTB = Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb" / "ptb.train.txt"
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}


def write_input(path: Path, words: int) -> tuple[int, int]:
    """The first PTB training lines up to `words` words (else random sentences) into `path`; (lines, words)."""
    if not PTB.is_file():
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_embed_memory import write_corpus

        lines = write_corpus(path, words)
        return lines, sum(len(line.split()) for line in path.read_text(encoding="utf-8").splitlines())
    taken, count = [], 0
    with PTB.open(encoding="utf-8") as source:
        for line in source:
            if count >= words:
                break
            taken.append(line.strip() + "\n")
            count += len(line.split())
    path.write_text("".join(taken), encoding="utf-8")
    return len(taken), count


def embed(model: str, source: Path, output: Path, options: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds of one `elmo embed` process and its last line on stderr (the summary)."""
    command = [sys.executable, "-m", "elmo_cli", "embed", *options, model, str(source), str(output), "--pool", "mean"]
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {result.stderr.strip().splitlines()[-1:]}")
    return elapsed, (result.stderr.strip().splitlines() or [""])[-1]


def largest_difference(output: Path, expected: list[np.ndarray]) -> float:
    return max(float(np.abs(a - b).max(initial=0)) for a, b in zip(read_vectors(output), expected, strict=True))


def per_node(output: Path, summary: str) -> list[tuple[str, int, int, float]]:
    """Per node of a `--ray` output: its id, sentences, words, and words per second over the job's embedding time."""
    import pyarrow.parquet as pq

    seconds = float(re.search(r"embedded in ([0-9.]+) s", summary).group(1))
    nodes: dict[str, list[int]] = {}
    for shard in sorted(output.glob("part-*.parquet")):
        node = json.loads(pq.read_schema(shard).metadata[b"elmo"])["written_by"]["node"]
        words = sum(len(w) for w in pq.read_table(shard, columns=["words"]).column("words").to_pylist())
        totals = nodes.setdefault(node, [0, 0])
        totals[0] += pq.ParquetFile(shard).metadata.num_rows
        totals[1] += words
    return [(node[:8], rows, words, words / seconds) for node, (rows, words) in nodes.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a save_pretrained directory, Hub id or `default`")
    parser.add_argument("--words", type=int, default=236_000)
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="CPUs of every run")
    parser.add_argument("--workers", type=int, nargs="*", default=[1], help="`--ray --workers W` runs besides the "
                        "defaults")
    parser.add_argument("--no-nodes", action="store_true", help="leave out the two-node run")
    args = parser.parse_args()
    env = {**ENV, "OMP_NUM_THREADS": str(args.cores)}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        lines, words = write_input(folder / "input.txt", args.words)
        print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs; model {args.model}; {lines:,} lines, {words:,} words; "
              f"{args.cores} cores in every run")
        (folder / "one.txt").write_text("the bank raised rates\n", encoding="utf-8")
        runs = {"one process": ["--threads", str(args.cores)], "--ray (defaults)": ["--ray"]}
        runs.update({f"--ray --workers {w}": ["--ray", "--workers", str(w), "--cpus-per-worker",
                                               str(max(1, args.cores // w))] for w in args.workers})
        start_up = {name: embed(args.model, folder / "one.txt", folder / f"start-{i}", options, env)[0]
                    for i, (name, options) in enumerate(runs.items())}
        print(f"{'run':>24} {'seconds':>8} {'start-up':>9} {'words/s':>8} {'ratio':>6} {'steady':>7} "
              f"{'max abs diff':>13}  summary")
        expected = None
        for i, (name, options) in enumerate(runs.items()):
            output = folder / f"run-{i}" if "--ray" in options else folder / "one.parquet"
            seconds, summary = embed(args.model, folder / "input.txt", output, options, env)
            if expected is None:
                expected, base, base_start = read_vectors(output), seconds, start_up[name]
            difference = largest_difference(output, expected)
            steady = (base - base_start) / (seconds - start_up[name])
            print(f"{name:>24} {seconds:>8.1f} {start_up[name]:>9.1f} {words / seconds:>8,.0f} {base / seconds:>6.2f} "
                  f"{steady:>7.2f} {difference:>13.1e}  {summary.split(' (')[-1] if '--ray' in options else ''}")
        added = start_up["--ray (defaults)"] - base_start
        print(f"Ray's start-up beyond one process's (the one-line jobs): {added:.1f} s with the defaults")
        if not args.no_nodes:
            two_nodes(args, folder, env, expected)


def two_nodes(args: argparse.Namespace, folder: Path, env: dict[str, str],
              expected: list[np.ndarray]) -> None:
    """The defaults on two nodes of half the cores each (`ray.cluster_utils.Cluster`), and what each node did."""
    from ray.cluster_utils import Cluster

    half = max(1, args.cores // 2)
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": half, "include_dashboard": False})
    try:
        nodes.add_node(num_cpus=half)
        nodes.wait_for_nodes()
        output = folder / "two-nodes"
        seconds, summary = embed(args.model, folder / "input.txt", output, ["--ray", "--ray-address", nodes.address],
                                 {**env, "RAY_AUTH_MODE": "disabled"})
    finally:
        nodes.shutdown()
    print(f"two nodes of {half} CPUs: {seconds:.1f} s ({summary.split(' (')[-1]}), max abs diff "
          f"{largest_difference(output, expected):.1e}")
    done = per_node(output, summary)
    for node, rows, node_words, rate in done:
        print(f"  node {node}: {rows:,} sentences, {node_words:,} words ({node_words / sum(d[2] for d in done):.0%}), "
              f"{rate:,.0f} words/s")


if __name__ == "__main__":
    main()
