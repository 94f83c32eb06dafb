"""The tokenizer alone: words/s of `ElmoCharTokenizer.batch` for the two character vocabularies, side by side.

    python benchmarks/bench_tokenizer.py [--sentences 2000] [--length 25] [--batch-size 64] [--repeats 5]

Sentences of random words (a Zipfian draw from a vocabulary of 50,000 words, of Latin and Cyrillic letters) in
batches of `--batch-size`: the byte vocabulary (AllenNLP's and bilm-tf's models) and a lexicon model's
(ELMoForManyLangs': a character table of those letters and a word table of 40,000 of the words, the others
`<oov>`), each the median of `--repeats` passes; the ratio is lexicon / bytes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import time

from hf_elmo import ElmoCharTokenizer
from hf_elmo.runtime import cpu_name

LETTERS = string.ascii_letters + "абвгдежзийклмнопрстуфхцчшщъыьэюя"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--length", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    vocabulary = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 14))) for _ in range(50_000)]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    sentences = [rng.choices(vocabulary, weights, k=args.length) for _ in range(args.sentences)]
    batches = [sentences[i : i + args.batch_size] for i in range(0, len(sentences), args.batch_size)]
    markers = ["<oov>", "<pad>", "<bos>", "<eos>", "<bow>", "<eow>"]
    tokenizers = {
        "bytes": ElmoCharTokenizer(),
        "lexicon": ElmoCharTokenizer.with_lexicons(
            {entry: i for i, entry in enumerate([*markers, *LETTERS])},
            {entry: i for i, entry in enumerate([*markers[:4], *dict.fromkeys(vocabulary[:40_000])])}),
    }
    words = args.sentences * args.length
    print(f"machine: {cpu_name()}; {args.sentences} sentences x {args.length} words, batches of {args.batch_size}")
    rates = {}
    for name, tokenizer in tokenizers.items():
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            for batch in batches:
                tokenizer.batch(batch)
            seconds.append(time.perf_counter() - start)
        rates[name] = words / statistics.median(seconds)
        print(f"{name:<8} {rates[name]:>12,.0f} words/s", flush=True)
    print(f"ratio lexicon / bytes: {rates['lexicon'] / rates['bytes']:.2f}")


if __name__ == "__main__":
    main()
