"""The training data pipeline alone (no model): tokens/s of `elmo pretrain`'s batches with N DataLoader workers.

    python benchmarks/bench_data.py --workers 0,1,2 [--word-tokenizer spacy:en] [--batch-tokens 16384]
                                    [--files ...] [--batches 250]

The batches are what `elmo pretrain` trains on (`hf_elmo.training.LMBatches`: lines read and shuffled in blocks,
split into words, length-sorted batches, character ids, softmax labels), taken from a DataLoader as the training loop
takes them. Tokens are prediction targets per direction (words + one `</S>` per line), the unit of the training log.
For each worker count it prints tokens/s after the first batch (the workers' start), and per worker; a GPU host
needs the workers that make the GPU's tokens/s (the last column: workers for 1 M tokens/s at this rate per worker).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import torch
from torch.utils.data import DataLoader

from hf_elmo import ElmoCharTokenizer
from hf_elmo.runtime import cpu_name
from hf_elmo.text import expand_files, get_word_tokenizer, read_lines
from hf_elmo.training import DataPosition, LMBatches, WordVocabulary


def tokens_per_second(data: LMBatches, workers: int, batches: int) -> float:
    """Targets per second of `batches` batches from a DataLoader of `workers` workers, timed from the first batch."""
    data.set_position(DataPosition.start(0, workers))
    loader = iter(DataLoader(data, batch_size=None, num_workers=workers))
    next(loader)  # the workers have started
    start, tokens = time.perf_counter(), 0
    for _, batch in zip(range(batches), loader):
        labels = batch["labels"]
        tokens += int((labels[:, 1:] != -100).sum())  # the forward LM's targets: words + </S>
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", default="../shared/data/pretrain-en/shard-0000[0-3].txt.gz")
    parser.add_argument("--word-tokenizer", default="spacy:en")
    parser.add_argument("--vocab-size", type=int, default=50_000, help="built from the first 100,000 lines")
    parser.add_argument("--batch-tokens", type=int, default=16_384)
    parser.add_argument("--block-lines", type=int, default=10_000)
    parser.add_argument("--workers", default="0,1,2", help="comma-separated worker counts")
    parser.add_argument("--batches", type=int, default=250, help="timed batches (blocks make bursts: time many)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    files = expand_files([args.files])
    word_tokenizer = get_word_tokenizer(args.word_tokenizer)
    counts: Counter[str] = Counter()
    for index, line in enumerate(read_lines(files[0])):
        if index == 100_000:
            break
        counts.update(line.split())
    vocabulary = WordVocabulary.from_counts(counts, max_size=args.vocab_size)
    data = LMBatches(files, word_tokenizer, vocabulary, ElmoCharTokenizer(), batch_tokens=args.batch_tokens,
                     max_words=100, block_lines=args.block_lines)
    print(f"machine: {cpu_name()}, {os.cpu_count()} cpus, torch {torch.__version__}; word tokenizer "
          f"{args.word_tokenizer}, batches of {args.batch_tokens:,} padded positions, {args.batches} batches")
    print(f"{'workers':>7} {'tokens/s':>10} {'per worker':>10} {'for 1M/s':>8}")
    results = []
    for workers in (int(w) for w in args.workers.split(",")):
        rate = tokens_per_second(data, workers, args.batches)
        per_worker = rate / max(workers, 1)
        results.append({"workers": workers, "tokens_per_second": round(rate), "per_worker": round(per_worker)})
        print(f"{workers:>7} {rate:>10,.0f} {per_worker:>10,.0f} {1e6 / per_worker:>8.1f}", flush=True)
    print(json.dumps({"word_tokenizer": args.word_tokenizer, "batch_tokens": args.batch_tokens, "results": results}))


if __name__ == "__main__":
    main()
