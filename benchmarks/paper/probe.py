"""What each biLM layer captures (the paper's Table 6, on CoNLL-2003): a linear classifier per layer, trained on
frozen vectors of the training sentences, scored on the dev sentences, for POS tags (accuracy) and named entities
(IOB2 tags per token, scored as entity F1).

    python benchmarks/paper/probe.py --model default                   # all of train/dev (minutes on a CPU)
    python benchmarks/paper/probe.py --model default --quick           # 500 / 200 sentences (seconds)
    python benchmarks/paper/probe.py --model runs/old-default --json probe.json
    python benchmarks/paper/probe.py --model default --bf16            # vectors from the bf16 mode (CPUs with AMX)
    python benchmarks/paper/probe.py --model default --int8            # vectors from the int8 mode (x86 with AVX2)

Rows: each layer (0 = the char-CNN token layer, then each biLSTM layer) and their average. Words are CoNLL's gold
tokens, one sentence per biLM row. With `--bf16` / `--int8` the vectors come from that opt-in mode
(`ElmoEmbedder(bf16=True)` / `ElmoEmbedder(quantize="int8")`), and the script first prints how far the dev vectors are
from float32's.
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import islice
from pathlib import Path

import numpy as np
import torch

from hf_elmo import ElmoModel, model_location
from hf_elmo.embed import ElmoEmbedder
from hf_elmo.runtime import cpu_name
from spacy_elmo.corpora import conll_sentences

CONLL = Path(__file__).resolve().parents[3] / "shared" / "data" / "conll2003" / "iob2"


def read_conll(path: Path, limit: int | None = None) -> list[tuple[list[str], list[str], list[str]]]:
    """(words, POS tags, IOB2 entity tags) per sentence (`spacy_elmo.corpora.conll_sentences`)."""
    rows = (sentence for sentence in conll_sentences(path) if sentence is not None)
    return [([r[0] for r in s], [r[1] for r in s], [r[-1] for r in s]) for s in islice(rows, limit)]


MODES = ("bf16", "int8")


def layer_features(model: ElmoModel, sentences: list[list[str]], mode: str | None = None) -> np.ndarray:
    """(layers, tokens, width) float32: every layer of every word, sentences concatenated; `mode` ("bf16", "int8"):
    computed in that mode."""
    embedder = ElmoEmbedder(model, layers="all", bf16=mode == "bf16", quantize="int8" if mode == "int8" else None)
    return np.concatenate(list(embedder.embed_sentences(sentences)), axis=1)


def mode_difference(model: ElmoModel, sentences: list[list[str]], mode: str) -> list[dict]:
    """Per layer: max abs difference, largest abs value, and min / mean cosine of the word vectors of `mode` against
    float32."""
    exact, reduced = layer_features(model, sentences), layer_features(model, sentences, mode)
    rows = []
    for j, (a, b) in enumerate(zip(exact, reduced)):
        cosine = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
        rows.append({"layer": j, "max_abs_difference": float(np.abs(a - b).max()), "max_abs": float(np.abs(a).max()),
                     "min_cosine": float(cosine.min()), "mean_cosine": float(cosine.mean())})
    return rows


def train_linear_probe(
    train_x: torch.Tensor, train_y: torch.Tensor, n_classes: int, l2: float = 1e-4, steps: int = 150
) -> torch.nn.Linear:
    """A softmax classifier on standardised features, full-batch L-BFGS (deterministic)."""
    torch.manual_seed(0)
    probe = torch.nn.Linear(train_x.shape[1], n_classes)
    optimizer = torch.optim.LBFGS(probe.parameters(), max_iter=steps, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(probe(train_x), train_y) + l2 * probe.weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return probe


def entities(tags: list[str]) -> set[tuple[int, int, str]]:
    """(start, end, type) of the IOB2 entities of a tag sequence (an I- without its B- starts an entity)."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        if tag == "O" or tag.startswith("B-") or (tag.startswith("I-") and tag[2:] != kind):
            if start is not None:
                spans.add((start, i, kind))
            start, kind = (i, tag[2:]) if tag != "O" else (None, None)
    return spans


def entity_f1(gold: list[list[str]], predicted: list[list[str]]) -> float:
    gold_spans = {(n, *span) for n, tags in enumerate(gold) for span in entities(tags)}
    predicted_spans = {(n, *span) for n, tags in enumerate(predicted) for span in entities(tags)}
    correct = len(gold_spans & predicted_spans)
    return 2 * correct / max(len(gold_spans) + len(predicted_spans), 1)


def probe_layers(model: ElmoModel, train, dev, mode: str | None = None) -> list[dict]:
    """Per layer (and the average of all): POS accuracy and NER entity F1 of linear probes, on dev; `mode`: on
    vectors of that mode."""
    train_features = layer_features(model, [words for words, _, _ in train], mode)
    dev_features = layer_features(model, [words for words, _, _ in dev], mode)
    results = []
    layers = [*((str(j), [j]) for j in range(len(train_features))), ("average", list(range(len(train_features))))]
    for name, index in layers:
        train_x = torch.from_numpy(train_features[index].mean(axis=0))
        dev_x = torch.from_numpy(dev_features[index].mean(axis=0))
        mean, std = train_x.mean(dim=0), train_x.std(dim=0) + 1e-6
        train_x, dev_x = (train_x - mean) / std, (dev_x - mean) / std
        row = {"layer": name}
        for task, column in (("pos_accuracy", 1), ("ner_entity_f1", 2)):
            labels = sorted({tag for sentence in train for tag in sentence[column]})
            ids = {tag: i for i, tag in enumerate(labels)}
            train_y = torch.tensor([ids[tag] for sentence in train for tag in sentence[column]])
            probe = train_linear_probe(train_x, train_y, len(labels))
            with torch.no_grad():
                predicted = [labels[i] for i in probe(dev_x).argmax(dim=1).tolist()]
            gold = [tag for sentence in dev for tag in sentence[column]]
            if task == "pos_accuracy":
                row[task] = float(np.mean([p == g for p, g in zip(predicted, gold)]))
            else:
                offsets = np.cumsum([0, *(len(words) for words, _, _ in dev)])
                row[task] = entity_f1([s[2] for s in dev], [predicted[a:b] for a, b in zip(offsets, offsets[1:])])
        results.append(row)
    return results


def format_table(results: list[dict]) -> str:
    lines = ["| layer | POS accuracy | NER entity F1 |", "|---|---|---|"]
    lines += [f"| {r['layer']} | {100 * r['pos_accuracy']:.1f} | {100 * r['ner_entity_f1']:.1f} |" for r in results]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default", help="a biLM directory, Hub id or 'default'")
    parser.add_argument("--quick", action="store_true", help="500 training and 200 dev sentences")
    parser.add_argument("--train-sentences", type=int, help="limit (default: all; --quick: 500)")
    parser.add_argument("--dev-sentences", type=int, help="limit (default: all; --quick: 200)")
    parser.add_argument("--threads", type=int, default=2)
    modes = parser.add_mutually_exclusive_group()
    for name in MODES:
        modes.add_argument(f"--{name}", action="store_true", help=f"vectors from the {name} mode (see the docstring)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train = read_conll(CONLL / "train.txt", args.train_sentences or (500 if args.quick else None))
    dev = read_conll(CONLL / "valid.txt", args.dev_sentences or (200 if args.quick else None))
    model = ElmoModel.from_pretrained(model_location(args.model))
    mode = next((name for name in MODES if getattr(args, name)), None)
    difference = mode_difference(model, [words for words, _, _ in dev], mode) if mode else None
    if difference:
        print(f"{mode} vs float32, dev words:", json.dumps(difference))
    start = time.perf_counter()
    results = probe_layers(model, train, dev, mode)
    machine = cpu_name()
    print(f"model {args.model}{f' ({mode} mode)' if mode else ''}: {len(train)} training / {len(dev)} dev "
          f"sentences of CoNLL-2003, {time.perf_counter() - start:.0f} s on {machine}")
    print(format_table(results))
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "mode": mode or "float32", "vs_float32": difference,
                                         "train_sentences": len(train), "dev_sentences": len(dev),
                                         "layers": results}, indent=1))


if __name__ == "__main__":
    main()
