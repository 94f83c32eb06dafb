"""`elmo embed` in one process vs. several under torchrun, on the same cores: wall time, tokens/s, speed-up.

    python benchmarks/bench_embed_processes.py --model default --tokens 200000 --cores 2 --processes 2

Writes random sentences (10-40 words from a Zipfian vocabulary, one per line), embeds them with
`elmo embed MODEL INPUT OUT.npy --layers average` once in one process with `--cores` threads, then for each
`--processes` P under `torchrun --nproc-per-node P` with `--cores / P` threads per process (the join included),
and prints each run's time and its speed-up over the one-process run, and the largest difference between the
outputs (they should agree to ~1e-6: a sentence's vectors do not depend on its batch).
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

from hf_elmo.runtime import cpu_name


def embed(model: str, input_file: Path, output_file: Path, processes: int, threads: int) -> float:
    """Seconds of one `elmo embed` run (under torchrun when `processes` > 1)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    command = [*(launcher if processes > 1 else [sys.executable]), "-m", "elmo_cli", "embed", model,
               str(input_file), str(output_file), "--tokenized", "--layers", "average", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    subprocess.run([*command, "--threads", str(threads)], check=True, env=env)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a save_pretrained directory, Hub id or `default`")
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="threads of the one-process run")
    parser.add_argument("--processes", type=int, nargs="+", default=[2])
    args = parser.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs; model {args.model}; "
          f"{args.tokens:,} words; {args.cores} cores in every run")
    with tempfile.TemporaryDirectory() as folder:
        input_file = Path(folder) / "input.txt"
        lines = write_corpus(input_file, args.tokens)
        reference = Path(folder) / "one.npy"
        seconds = embed(args.model, input_file, reference, 1, args.cores)
        print(f"{'processes x threads':>20} {'seconds':>9} {'tokens/s':>9} {'speed-up':>9} {'max abs diff':>13}")
        print(f"{f'1 x {args.cores}':>20} {seconds:>9.1f} {args.tokens / seconds:>9,.0f} {1:>9.2f} {0:>13.1e}")
        expected = np.load(reference)
        for processes in args.processes:
            threads = max(1, args.cores // processes)
            output = Path(folder) / f"{processes}.npy"
            elapsed = embed(args.model, input_file, output, processes, threads)
            difference = np.abs(np.load(output) - expected).max()
            print(f"{f'{processes} x {threads}':>20} {elapsed:>9.1f} {args.tokens / elapsed:>9,.0f} "
                  f"{seconds / elapsed:>9.2f} {difference:>13.1e}")
    print(f"{lines:,} lines")


if __name__ == "__main__":
    main()
