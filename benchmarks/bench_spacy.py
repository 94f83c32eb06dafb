"""Speed of `nlp.pipe` with the spaCy `elmo` component on CPU, and the memory it keeps on each Doc.

    python benchmarks/bench_spacy.py [--threads 2] [--presets small,medium,original] [--words 6000]
                                     [--mixed-precision]

For each preset (random weights): words/s of `nlp.pipe` over documents of 3 sentences x 20 words (a blank English
pipeline: tokenizer + `elmo`, sentences from a sentencizer or, without one, windows of 200 tokens), median of
`--repeats` passes after a warm-up pass; and the bytes per token of `doc._.elmo_layers` (float32 and float16).
`--mixed-precision` sets the component's `mixed_precision` (on a CPU: the biLM in bf16).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import string
import time
from functools import partial

import spacy
import torch
from spacy.training import Example
from transformers.utils import logging as hf_logging

from hf_elmo.runtime import cpu_name
from spacy_elmo.weights import random_bilm


def random_texts(n_words: int, seed: int = 0) -> list[str]:
    """Documents of 3 sentences of 20 words (1-12 lowercase letters, 5000-word vocabulary) ending in '.'."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 12))) for _ in range(5000)]
    sentences = [" ".join(rng.choices(vocab, k=19)) + " ." for _ in range(3 * max(1, n_words // 60))]
    return [" ".join(sentences[i : i + 3]) for i in range(0, len(sentences), 3)]


def pipeline(preset: str, sentencizer: bool, mixed_precision: bool = False) -> spacy.Language:
    nlp = spacy.blank("en")
    if sentencizer:
        nlp.add_pipe("sentencizer")
    elmo = nlp.add_pipe("elmo", config={"model": {"mixed_precision": mixed_precision}})
    doc = nlp.make_doc("warm up")
    elmo.initialize(lambda: [Example(doc, doc)], weights=partial(random_bilm, preset))
    return nlp


def words_per_second(nlp: spacy.Language, texts: list[str], batch_size: int, repeats: int) -> float:
    n_words = sum(len(doc) for doc in nlp.tokenizer.pipe(texts))
    list(nlp.pipe(texts[:batch_size], batch_size=batch_size))  # warm-up
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _doc in nlp.pipe(texts, batch_size=batch_size):
            pass
        timings.append(time.perf_counter() - start)
    return n_words / statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--presets", default="small,medium,original")
    parser.add_argument("--words", type=int, default=6000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mixed-precision", action="store_true", help="the component's mixed_precision (CPU: bf16)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    texts = random_texts(args.words)
    print(f"machine: {cpu_name()} {os.cpu_count()} cpus, torch {torch.__version__}, spaCy {spacy.__version__}, "
          f"{args.threads} threads; {len(texts)} docs x 60 words, nlp.pipe batch_size {args.batch_size}"
          f"{'; mixed_precision' if args.mixed_precision else ''}")
    print(f"{'preset':<9} {'words/s':>8} {'+ sentencizer':>13} {'bytes/token f32':>15} {'f16':>6}")
    for preset in args.presets.split(","):
        speeds = []
        for sentencizer in (False, True):
            nlp = pipeline(preset, sentencizer, args.mixed_precision)
            speeds.append(words_per_second(nlp, texts, args.batch_size, args.repeats))
        layers = nlp(texts[0])._.elmo_layers  # what `store_dtype = "float16"` keeps is exactly half
        per_token = layers.nbytes // layers.shape[1]
        print(f"{preset:<9} {speeds[0]:>8.0f} {speeds[1]:>13.0f} {per_token:>15,} {per_token // 2:>6,}", flush=True)


if __name__ == "__main__":
    main()
