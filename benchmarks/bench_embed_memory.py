"""Peak memory of `elmo embed` as the input grows: it should stay flat (batches are streamed to the output).

    python benchmarks/bench_embed_memory.py --model default --tokens 100000 1000000

For each size, writes a text file of random sentences (10-40 words from a Zipfian vocabulary, one per line), runs
`elmo embed MODEL INPUT OUTPUT.npy --layers average` in a fresh process and prints its wall time, tokens/s, peak
resident memory (the process's maxrss, from `os.wait4`) and output size, then the ratio of the largest to the
smallest peak.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_training import random_corpus


def write_corpus(path: Path, n_tokens: int, seed: int = 0) -> int:
    """Write sentences until `n_tokens` words; returns the number of sentences."""
    _, sentences = random_corpus(n_tokens // 10, vocab_size=50_000, seed=seed)
    written = count = 0
    with path.open("w", encoding="utf-8") as file:
        for words in sentences:
            if written >= n_tokens:
                break
            file.write(" ".join(words) + "\n")
            written += len(words)
            count += 1
    return count


def run_embed(model: str, input_file: Path, output_file: Path, threads: int, layers: str) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of one `elmo embed` process."""
    command = [sys.executable, "-m", "hf_elmo.cli", "embed", model, str(input_file), str(output_file), "--tokenized",
               "--layers", layers, "--threads", str(threads), "--quiet"]
    started = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"elmo embed failed: {' '.join(command)}")
    return elapsed, usage.ru_maxrss * 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a save_pretrained directory, Hub id or `default`")
    parser.add_argument("--tokens", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--layers", default="average", help="all, top, average or mix (output size only)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; model {args.model}; "
          f"--layers {args.layers}; {args.threads} threads")
    print(f"{'tokens':>10} {'sentences':>10} {'seconds':>9} {'tokens/s':>9} {'peak RSS MB':>12} {'output MB':>10}")
    peaks = []
    with tempfile.TemporaryDirectory() as folder:
        for n_tokens in args.tokens:
            input_file, output_file = Path(folder) / "input.txt", Path(folder) / "vectors.npy"
            sentences = write_corpus(input_file, n_tokens)
            seconds, peak = run_embed(args.model, input_file, output_file, args.threads, args.layers)
            peaks.append(peak)
            print(f"{n_tokens:>10,} {sentences:>10,} {seconds:>9.1f} {n_tokens / seconds:>9,.0f} "
                  f"{peak / 2**20:>12,.0f} {output_file.stat().st_size / 2**20:>10,.0f}")
            output_file.unlink()
    print(f"peak memory ratio, {args.tokens[-1]:,} vs {args.tokens[0]:,} tokens: {peaks[-1] / peaks[0]:.2f}")


if __name__ == "__main__":
    main()
