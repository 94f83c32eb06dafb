"""Inference throughput of the biLM presets with random weights on CPU.

    python benchmarks/bench_inference.py [--threads 2] [--presets small,medium,original]

Prints tokens/s (words, `<S>`/`</S>` not counted) for `--sentences` sentences of `--length` words in batches of
`--batch-size`, median of `--repeats` timed passes after one warm-up pass, under `torch.inference_mode`.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import string
import time

import torch

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoModel


def random_sentences(n: int, length: int, seed: int = 0) -> list[list[str]]:
    """Words of 1-12 lowercase letters from a fixed vocabulary of 5000, so some repeat like real text."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 12))) for _ in range(5000)]
    return [[rng.choice(vocab) for _ in range(length)] for _ in range(n)]


def tokens_per_second(model: ElmoModel, batches: list[dict], n_tokens: int, repeats: int) -> float:
    with torch.inference_mode():
        for batch in batches:  # warm-up
            model(**batch)
        timings = []
        for _ in range(repeats):
            start = time.perf_counter()
            for batch in batches:
                model(**batch)
            timings.append(time.perf_counter() - start)
    return n_tokens / statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--presets", default="small,medium,original")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--length", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    tokenizer = ElmoCharTokenizer()
    sentences = random_sentences(args.sentences, args.length)
    batches = [
        dict(tokenizer(sentences[i : i + args.batch_size], is_split_into_words=True, padding=True,
                       return_tensors="pt"))
        for i in range(0, len(sentences), args.batch_size)
    ]
    n_tokens = args.sentences * args.length
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} threads; {args.sentences} sentences x {args.length} words, batch {args.batch_size}")
    print(f"{'preset':<10} {'parameters':>12} {'tokens/s':>10}")
    for name in args.presets.split(","):
        model = ElmoModel(ElmoConfig.from_preset(name)).eval()
        n_parameters = sum(p.numel() for p in model.parameters())
        rate = tokens_per_second(model, batches, n_tokens, args.repeats)
        print(f"{name:<10} {n_parameters:>12,} {rate:>10.0f}")


if __name__ == "__main__":
    main()
