"""Peak memory of `elmo embed` as the input grows: it should stay flat (batches are streamed to the output).

    python benchmarks/bench_embed_memory.py --model default --tokens 100000 1000000
    python benchmarks/bench_embed_memory.py --model default --tokens 100000 --one-line \
        --max-sentence-words 1000 100000000                  # one huge line: windows vs. the whole line

For each size, writes a text file of random sentences (10-40 words from a Zipfian vocabulary, one per line), runs
`elmo embed MODEL INPUT OUTPUT.npy --layers average` in a fresh process and prints its wall time, tokens/s, peak
resident memory (the process's maxrss, from `os.wait4`) and output size, then the ratio of the largest to the
smallest peak. With `--one-line` the words are one line (one sentence), embedded once per `--max-sentence-words`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_training import random_corpus

from hf_elmo.runtime import cpu_name


def write_corpus(path: Path, n_tokens: int, seed: int = 0, one_line: bool = False) -> int:
    """Write sentences until `n_tokens` words (all on one line with `one_line`); returns the number of lines."""
    _, sentences = random_corpus(n_tokens // 10, vocab_size=50_000, seed=seed)
    written = count = 0
    with path.open("w", encoding="utf-8") as file:
        for words in sentences:
            if written >= n_tokens:
                break
            file.write(" ".join(words) + (" " if one_line else "\n"))
            written += len(words)
            count += 1
        if one_line:
            file.write("\n")
    return 1 if one_line else count


def run_embed(
    model: str, input_file: Path, output_file: Path, threads: int, layers: str, max_sentence_words: int
) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of one `elmo embed` process."""
    command = [sys.executable, "-m", "elmo_cli", "embed", model, str(input_file), str(output_file), "--tokenized",
               "--layers", layers, "--threads", str(threads), "--max-sentence-words", str(max_sentence_words),
               "--quiet"]
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
    parser.add_argument("--one-line", action="store_true", help="all words on one line (one sentence)")
    parser.add_argument("--max-sentence-words", type=int, nargs="+", default=[1000],
                        help="windows of longer lines (several: one run each)")
    args = parser.parse_args()
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs; model {args.model}; "
          f"--layers {args.layers}; {args.threads} threads")
    print(f"{'tokens':>10} {'lines':>8} {'window':>10} {'seconds':>9} {'tokens/s':>9} {'peak RSS MB':>12} "
          f"{'output MB':>10}")
    peaks = []
    with tempfile.TemporaryDirectory() as folder:
        for n_tokens in args.tokens:
            input_file, output_file = Path(folder) / "input.txt", Path(folder) / "vectors.npy"
            lines = write_corpus(input_file, n_tokens, one_line=args.one_line)
            for window in args.max_sentence_words:
                seconds, peak = run_embed(args.model, input_file, output_file, args.threads, args.layers, window)
                peaks.append(peak)
                print(f"{n_tokens:>10,} {lines:>8,} {window:>10,} {seconds:>9.1f} {n_tokens / seconds:>9,.0f} "
                      f"{peak / 2**20:>12,.0f} {output_file.stat().st_size / 2**20:>10,.0f}")
                output_file.unlink()
    print(f"peak memory ratio, last vs first run: {peaks[-1] / peaks[0]:.2f}")


if __name__ == "__main__":
    main()
