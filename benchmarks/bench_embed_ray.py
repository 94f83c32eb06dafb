"""`elmo embed` in one process vs. `elmo embed --ray` with 1 and 2 workers, on the same cores and input: wall time,
tokens/s, the ratio to one process, and Ray's start-up overhead.

    python benchmarks/bench_embed_ray.py --model default --tokens 200000 --cores 2 --workers 1 2

Writes random sentences (10-40 words from a Zipfian vocabulary, one per line), embeds them with `elmo embed MODEL
INPUT OUT.parquet --layers top` in one process with `--cores` threads, then for each `--workers` W with `elmo embed
--ray` on a local cluster started for the job, W workers of `--cores / W` CPUs each (cluster start, model loads and
the job all included), and prints each run's time and its ratio to the one-process run, and the largest difference
between the outputs (float32 rounding: a sentence's vectors depend on its batch only there). The overhead is one
`--ray` run on a one-line input, minus a one-process run on it: what Ray adds before the first sentence (its
cluster, its workers' start and model loads) and after the last.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_embed_memory import write_corpus

from hf_elmo.embed import read_vectors
from hf_elmo.runtime import cpu_name


def embed(model: str, input_file: Path, output: Path, threads: int, workers: int = 0, shard_size: int = 10_000
          ) -> float:
    """Seconds of one `elmo embed` run (`--ray` with `workers` workers when `workers` > 0)."""
    if workers:
        options = ["--ray", "--workers", str(workers), "--cpus-per-worker", str(max(1, threads // workers)),
                   "--shard-size", str(shard_size)]
    else:
        options = ["--threads", str(threads)]
    command = [sys.executable, "-m", "elmo_cli", "embed", *options, model, str(input_file), str(output),
               "--tokenized", "--layers", "top", "--quiet"]
    started = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a save_pretrained directory, Hub id or `default`")
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="CPUs of every run")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shard-size", type=int, default=10_000)
    args = parser.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs; model {args.model}; {args.tokens:,} words; "
          f"{args.cores} cores in every run")
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        lines = write_corpus(folder / "input.txt", args.tokens)
        (folder / "one.txt").write_text("the bank raised rates\n", encoding="utf-8")
        one_line = embed(args.model, folder / "one.txt", folder / "one-line.parquet", args.cores)
        overhead = embed(args.model, folder / "one.txt", folder / "one-line-ray", args.cores, 1) - one_line
        seconds = embed(args.model, folder / "input.txt", folder / "one.parquet", args.cores)
        expected = read_vectors(folder / "one.parquet")
        print(f"{'run':>24} {'seconds':>9} {'tokens/s':>9} {'ratio':>7} {'max abs diff':>13}")
        print(f"{f'one process x {args.cores}':>24} {seconds:>9.1f} {args.tokens / seconds:>9,.0f} {1:>7.2f} "
              f"{0:>13.1e}")
        for workers in args.workers:
            output = folder / f"ray-{workers}"
            elapsed = embed(args.model, folder / "input.txt", output, args.cores, workers, args.shard_size)
            difference = max(float(np.abs(a - b).max(initial=0)) for a, b in zip(read_vectors(output), expected,
                                                                                   strict=True))
            name = f"--ray {workers} x {max(1, args.cores // workers)}"
            print(f"{name:>24} {elapsed:>9.1f} {args.tokens / elapsed:>9,.0f} {seconds / elapsed:>7.2f} "
                  f"{difference:>13.1e}")
    print(f"{lines:,} lines; Ray's start-up overhead (a one-line job, --ray 1 x {args.cores} minus one process): "
          f"{overhead:.1f} s")


if __name__ == "__main__":
    main()
