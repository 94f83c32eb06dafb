"""The paper's experiments and analyses (Peters et al. 2018, sections 4-5) with the shipped spaCy configs, as one
command. Every figure is a development-set score (test splits are not provided).

    python benchmarks/paper/run.py --quick --out /tmp/paper      # minutes: every experiment on tiny slices (CI)
    python benchmarks/paper/run.py                                # hours: full training sets, three seeds
    python benchmarks/paper/run.py --only results --tasks ner --seeds 0 1 2 --max-steps 3000

Experiments (`--only`): `results` (with vs. without ELMo, same task model and budget, relative error reduction;
Table 1), `layers` (top layer only / average / learned mix from the average with lambda 1 and 0.001 / learned mix
from the top layer; Table 2), `placement` (ELMo at the input only vs. input and output; Table 3), `efficiency`
(with vs. without ELMo on 1 %, 10 %, 100 % of the training set; Figure 1), `weights` (the learned softmax(s) of
every mix of the `results` pipelines; Figure 2), `probe` (a linear POS / NER probe per biLM layer; Table 6),
`neighbours` (contextual nearest neighbours of "play", top layer vs. token layer; Table 4). Each writes
`<out>/<experiment>.md` and `.json` (and a PNG for Figures 1-2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import spacy
import torch
from spacy.cli.train import train as spacy_train
from spacy.tokens import Doc
from spacy.vocab import Vocab

from hf_elmo.runtime import cpu_name
from spacy_elmo.cli import elmo_mixes, make_config
from spacy_elmo.corpora import read_conll2003, read_sst2, read_sst5, write_docbin
from spacy_elmo.mix_weights import format_mix_weights, mix_weights, plot_mix_weights

sys.path.insert(0, str(Path(__file__).parent))
import probe  # noqa: E402 (benchmarks/paper/probe.py)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


class Task(NamedTuple):
    config: str
    read: Callable[..., Iterator[Doc]]
    train_file: str
    dev_file: str
    score_key: str
    score_name: str
    # Steps per run unless --max-steps says otherwise (SST-5: at 2,000 steps, less than one pass over its phrases,
    # the runs with and without ELMo were both still climbing; benchmarks/paper/README.md).
    max_steps: int
    # The reader's options for the training file: SST-5 and SST-2 train on the labelled phrases of the trees (as the
    # paper's SST-5 model did) and are scored on the dev sentences.
    train_options: dict = {}
    # The task encoder (`spacy_elmo.cli.ENCODERS`); None = the shipped config's.
    encoder: str | None = None


TASKS = {
    "ner": Task("ner", read_conll2003, "conll2003/iob2/train.txt", "conll2003/iob2/valid.txt", "ents_f", "entity F1",
                1500),
    "sst5": Task("textcat", read_sst5, "sst5/trees/train.txt", "sst5/dev.tsv", "cats_micro_f", "accuracy", 4400,
                 {"phrases": True}),
    # SST-5 with the paper's SST-5 task model: the biattentive classification network's encoder (ELMo at its input
    # and at its integrating biLSTM's output) under the shipped classifier's pooling and maxout layer.
    "sst5-bcn": Task("textcat", read_sst5, "sst5/trees/train.txt", "sst5/dev.tsv", "cats_micro_f", "accuracy", 4400,
                     {"phrases": True}, "bcn"),
    # SST-2 as GLUE builds it, from SST-5's (cased) trees: the non-neutral phrases, binary labels; the same 872 dev
    # sentences as sst2/stsa.binary.dev (lowercased there).
    "sst2": Task("textcat", read_sst2, "sst5/trees/train.txt", "sst5/trees/dev.txt", "cats_micro_f", "accuracy",
                 4000, {"phrases": True}),
    # SST-2 on the 6,920 training sentences only (cased; stsa.binary.train lowercased), for what the phrases add.
    "sst2-sentences": Task("textcat", read_sst2, "sst5/trees/train.txt", "sst5/trees/dev.txt", "cats_micro_f",
                           "accuracy", 2000),
}
# What a command runs unless --tasks says otherwise (the paper's tasks; sst2-sentences only when asked for).
DEFAULT_TASKS = ["ner", "sst5", "sst2"]
EXPERIMENTS = ("results", "layers", "placement", "efficiency", "weights", "probe", "neighbours")
# Layer weighting (Table 2): overrides of every ELMo mix of the task model.
LAYER_VARIANTS = {
    "top layer only": {"trainable": False, "initial_scalars": [-1e4, -1e4, 0.0]},
    "average (fixed)": {"trainable": False, "initial_scalars": None},
    "learned, lambda = 1": {"l2": 1.0, "initial_scalars": None},
    "learned, lambda = 0.001": {"l2": 0.001, "initial_scalars": None},
    "learned from the top layer": {"l2": 0.001, "initial_scalars": [-2.0, 0.0, 2.0]},
}


def model_fingerprint(model: str) -> str:
    """The first 16 hex digits of the SHA-256 of the biLM's weights (a directory or a Hub id in the local cache):
    what tells runs of two biLMs apart when both are called "default"."""
    from huggingface_hub import hf_hub_download

    from hf_elmo import model_location

    location = Path(model_location(model))
    weights = location / "model.safetensors" if location.is_dir() else Path(
        hf_hub_download(str(model), "model.safetensors"))
    digest = hashlib.sha256()
    with weights.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


class Runner:
    """Trains the shipped configs with `spacy train` (in this process) and remembers every run's best dev score in
    `<out>/runs.json`, written after each run, and its config in its directory. A run already there, or in a `--reuse`
    directory's `runs.json`, with the same config and settings (budget, device and, with ELMo, the biLM's weights) is
    not trained again, whatever its variant is called: an interrupted command goes on where it stopped, the runs
    without ELMo serve every biLM, and a change to a shipped config trains its runs again. One command at a time per
    `--out`."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.out: Path = args.out
        self.corpora = self.out / "corpora"
        self.fingerprint = model_fingerprint(args.model)
        self.runs: dict[str, dict] = {}
        self.earlier: list[dict[str, dict]] = [json.loads((directory / "runs.json").read_text())
                                               for directory in [self.out, *args.reuse]
                                               if (directory / "runs.json").exists()]

    def settings(self, task: str, elmo: bool) -> dict:
        """What a run's score depends on besides its task, variant, seed and share of the training set."""
        args, spec = self.args, TASKS[task]
        settings = {"train_data": " ".join([spec.train_file, *(f"{k}={v}" for k, v in spec.train_options.items())]),
                    "max_steps": max_steps(args, task), "eval_frequency": args.eval_frequency,
                    "train_docs": args.train_docs, "dev_docs": args.dev_docs,
                    "device": "gpu" if args.gpu_id >= 0 else "cpu", "model": self.fingerprint if elmo else None}
        if elmo and args.frozen_cache_mb is not None:
            # A Doc's layers vary with its batch at float32 rounding (up to ~1e-5), so which Docs come from the cache
            # moves the training run a little: a run with another cache is another run.
            settings["frozen_cache_mb"] = args.frozen_cache_mb
        return settings

    def save(self) -> None:
        path = self.out / "runs.json"
        runs = {**json.loads(path.read_text()), **self.runs} if path.exists() else self.runs
        path.with_suffix(".tmp").write_text(json.dumps(runs, indent=1))
        path.with_suffix(".tmp").replace(path)

    def corpus(self, task: str, split: str) -> Path:
        spec, path = TASKS[task], self.corpora / f"{task}-{split}.spacy"
        if not path.exists():
            if split == "train":
                docs = spec.read(DATA / spec.train_file, Vocab(), **spec.train_options)
            else:
                docs = spec.read(DATA / spec.dev_file, Vocab())
            write_docbin(docs, path, self.args.train_docs if split == "train" else self.args.dev_docs)
        return path

    def train(self, task: str, name: str, seed: int, elmo: str | None = None, mix: dict | None = None,
              fraction: float = 1.0) -> float:
        """Best dev score of the task's shipped config (ELMo at `elmo`, every mix overridden by `mix`)."""
        key = f"{task}/{name}/seed{seed}/{fraction:g}"
        config_name, score_key = TASKS[task].config, TASKS[task].score_key
        config = make_config(config_name, self.args.model, elmo, TASKS[task].encoder)
        for task_mix in elmo_mixes(config, config_name):
            task_mix.update(mix or {})
        settings = self.settings(task, elmo != "none")
        if key not in self.runs:
            self.reuse(key, settings, config.to_str())
        if key in self.runs:
            return self.runs[key]["score"]
        output = self.out / "runs" / key.replace("/", "-").replace(" ", "_").replace(",", "")
        output.mkdir(parents=True, exist_ok=True)
        config_path = output / "config.cfg"
        config.to_disk(config_path)
        train_path = self.corpus(task, "train")
        n_train = len(spacy.tokens.DocBin().from_disk(train_path))
        # model-best is chosen by the score reported (accuracy for SST, where spaCy's default is macro F).
        selection = {f"training.score_weights.{key}": 0.0
                     for key, weight in config["training"]["score_weights"].items() if weight is not None}
        overrides = {
            **selection, f"training.score_weights.{score_key}": 1.0,
            "paths.train": str(train_path), "paths.dev": str(self.corpus(task, "dev")),
            "system.seed": seed, "training.max_steps": max_steps(self.args, task),
            "training.eval_frequency": self.args.eval_frequency, "training.patience": 0,
            "corpora.train.limit": max(1, round(fraction * n_train)) if fraction < 1 else 0,
            "training.logger": {"@loggers": "spacy.ConsoleLogger.v3", "progress_bar": None, "console_output": False,
                                "output_file": str(output / "log.jsonl")},
        }
        if "frozen_cache_mb" in settings:
            overrides["components.elmo.frozen_cache_mb"] = settings["frozen_cache_mb"]
        start = time.perf_counter()
        spacy_train(config_path, output, use_gpu=self.args.gpu_id, overrides=overrides)
        meta = json.loads((output / "model-best" / "meta.json").read_text())
        score = float(meta["performance"][score_key])
        self.runs[key] = {"score": score, "seconds": round(time.perf_counter() - start), "path": str(output),
                          "settings": settings}
        self.save()
        print(f"{key}: {score_key} {100 * score:.2f} ({self.runs[key]['seconds']} s)", flush=True)
        return score

    def reuse(self, key: str, settings: dict, config: str) -> None:
        """Take a finished run of the same task, seed and share of the training set, with the same settings and
        the same config (whatever its variant's name: the shipped config is also a variant of `layers`)."""
        for runs in [self.runs, *self.earlier]:
            for other, run in runs.items():
                config_file = Path(run["path"]) / "config.cfg"
                if (same_data(other, key) and run.get("settings") == settings
                        and config_file.is_file() and config_file.read_text(encoding="utf-8") == config):
                    self.runs[key] = run
                    print(f"{key}: {100 * run['score']:.2f} from {run['path']}", flush=True)
                    return

    def scores(self, task: str, name: str, **settings) -> list[float]:
        return [self.train(task, name, seed, **settings) for seed in self.args.seeds]


def max_steps(args: argparse.Namespace, task: str) -> int:
    """Steps per run of `task`: --max-steps, else the task's own budget."""
    return TASKS[task].max_steps if args.max_steps is None else args.max_steps


def same_data(key: str, other: str) -> bool:
    """Whether two run keys (task/variant/seed/share) name the same task, seed and share of the training set."""
    (task, _, seed, share), (other_task, _, other_seed, other_share) = key.split("/"), other.split("/")
    return (task, seed, share) == (other_task, other_seed, other_share)


def mean_std(values: Sequence[float]) -> str:
    values = 100 * np.asarray(values)
    return f"{values.mean():.2f} ± {values.std():.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def relative_error_reduction(baseline: float, system: float) -> float:
    return (system - baseline) / (1.0 - baseline) if baseline < 1 else 0.0


def results(runner: Runner) -> tuple[str, dict]:
    lines = ["| task | dev score | without ELMo | with ELMo | relative error reduction |", "|---|---|---|---|---|"]
    data = {}
    for task in runner.args.tasks:
        without, with_elmo = runner.scores(task, "without", elmo="none"), runner.scores(task, "with")
        rer = relative_error_reduction(float(np.mean(without)), float(np.mean(with_elmo)))
        lines.append(f"| {task} | {TASKS[task].score_name} | {mean_std(without)} | {mean_std(with_elmo)} "
                     f"| {100 * rer:.1f} % |")
        data[task] = {"without": without, "with": with_elmo, "relative_error_reduction": rer}
    return "\n".join(lines), data


def layers(runner: Runner) -> tuple[str, dict]:
    lines = ["| task | " + " | ".join(LAYER_VARIANTS) + " |", "|---" * (len(LAYER_VARIANTS) + 1) + "|"]
    data = {}
    for task in runner.args.tasks:
        data[task] = {name: runner.scores(task, name, mix=mix) for name, mix in LAYER_VARIANTS.items()}
        lines.append(f"| {task} | " + " | ".join(mean_std(v) for v in data[task].values()) + " |")
    return "\n".join(lines), data


def placement(runner: Runner) -> tuple[str, dict]:
    lines = ["| task | input only | input and output |", "|---|---|---|"]
    data = {}
    for task in runner.args.tasks:
        data[task] = {where: runner.scores(task, where, elmo=where) for where in ("input", "input+output")}
        lines.append(f"| {task} | {mean_std(data[task]['input'])} | {mean_std(data[task]['input+output'])} |")
    return "\n".join(lines), data


def efficiency(runner: Runner) -> tuple[str, dict]:
    fractions = (0.01, 0.1, 1.0)
    lines = ["| task | share of training set | without ELMo | with ELMo |", "|---|---|---|---|"]
    data = {}
    for task in runner.args.tasks:
        data[task] = {}
        for fraction in fractions:
            without = runner.scores(task, "without", elmo="none", fraction=fraction)
            with_elmo = runner.scores(task, "with", fraction=fraction)
            data[task][fraction] = {"without": without, "with": with_elmo}
            lines.append(f"| {task} | {100 * fraction:g} % | {mean_std(without)} | {mean_std(with_elmo)} |")
    plot_efficiency(data, runner.out / "efficiency.png")
    return "\n".join(lines), {task: {str(k): v for k, v in rows.items()} for task, rows in data.items()}


def plot_efficiency(data: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(data), figsize=(4 * len(data), 3.2), squeeze=False)
    for axis, (task, rows) in zip(axes[0], data.items()):
        shares = [100 * fraction for fraction in rows]
        for variant, style in (("without", "o--"), ("with", "o-")):
            axis.plot(shares, [100 * np.mean(row[variant]) for row in rows.values()], style, label=f"{variant} ELMo")
        axis.set_xscale("log")
        axis.set_xlabel("% of the training set")
        axis.set_ylabel(f"dev {TASKS[task].score_name}")
        axis.set_title(task)
        axis.legend()
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)


def weights(runner: Runner) -> tuple[str, dict]:
    mixes = []
    for task in runner.args.tasks:
        runner.train(task, "with", runner.args.seeds[0])
        path = Path(runner.runs[f"{task}/with/seed{runner.args.seeds[0]}/1"]["path"]) / "model-best"
        for mix in mix_weights(spacy.load(path)):
            mix.component = task
            mixes.append(mix)
    plot_mix_weights(mixes, runner.out / "weights.png")
    data = [{"task": m.component, "position": m.position, "weights": m.weights.tolist(), "gamma": m.gamma}
            for m in mixes]
    return "```\n" + format_mix_weights(mixes) + "\n```", data


def probe_experiment(runner: Runner) -> tuple[str, dict]:
    from hf_elmo import ElmoModel, model_location

    train = probe.read_conll(DATA / "conll2003" / "iob2" / "train.txt", runner.args.probe_sentences)
    dev = probe.read_conll(DATA / "conll2003" / "iob2" / "valid.txt", runner.args.probe_sentences)
    rows = probe.probe_layers(ElmoModel.from_pretrained(model_location(runner.args.model)), train, dev)
    return probe.format_table(rows), {"train_sentences": len(train), "dev_sentences": len(dev), "layers": rows}


# Two senses of "play" (Table 4): the queries whose nearest contexts are listed.
NEIGHBOUR_QUERIES = [
    "Chico Ruiz made a spectacular play on Alusik 's grounder .",
    "Olivia De Havilland signed to do a Broadway play for Garson .",
]


def neighbours(runner: Runner) -> tuple[str, dict]:
    """The sentences of `pretrain-en` (the held-out file, then the training shards until `--neighbour-sentences`
    are found) whose "play" is nearest to each query's, by the cosine of the top biLM layer and of the token layer
    (the same vector for every occurrence: no context)."""
    import gzip

    from hf_elmo import ElmoModel, model_location
    from hf_elmo.embed import ElmoEmbedder
    from hf_elmo.text import get_word_tokenizer

    model = ElmoModel.from_pretrained(model_location(runner.args.model))
    tokenize = get_word_tokenizer(model.config.word_tokenizer or "spacy:en")  # lines -> words per line
    sentencizer = spacy.blank("en")
    sentencizer.add_pipe("sentencizer")
    corpus, files = [], []
    for path in [DATA / "pretrain-en" / "valid.txt.gz", *sorted((DATA / "pretrain-en").glob("shard-*.txt.gz"))]:
        if len(corpus) >= runner.args.neighbour_sentences:
            break
        files.append(path.name)
        with gzip.open(path, "rt", encoding="utf-8") as lines:
            for line in lines:
                for sentence in sentencizer(line.strip()[:5000]).sents if " play " in line else ():
                    [words] = tokenize([sentence.text])
                    if "play" in words and len(words) <= 60:
                        corpus.append(words)
                if len(corpus) >= runner.args.neighbour_sentences:
                    break
    queries = tokenize(NEIGHBOUR_QUERIES)
    embedder = ElmoEmbedder(model, layers="all")
    vectors = [layers[:, words.index("play")] for words, layers in
               zip(queries + corpus, embedder.embed_sentences(queries + corpus))]
    lines, data = [], []
    for layer, name in ((-1, "top biLM layer"), (0, "token layer")):
        matrix = np.stack([v[layer] for v in vectors])
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        for q, query in enumerate(queries):
            similarity = matrix[len(queries):] @ matrix[q]
            best = [int(i) for i in np.argsort(-similarity, kind="stable")[:3]]
            lines.append(f"| {name} | {' '.join(query)} | " + "<br>".join(
                f"{similarity[i]:.3f} {' '.join(corpus[i])}" for i in best) + " |")
            nearest = [[float(similarity[i]), corpus[i]] for i in best]
            data.append({"layer": name, "query": query, "neighbours": nearest})
    header = [f"{len(corpus)} sentences with 'play' from pretrain-en ({', '.join(files)})", "",
              "| layer | query | nearest contexts (cosine) |", "|---|---|---|"]
    return "\n".join(header + lines), data


EXPERIMENT_FUNCTIONS = {"results": results, "layers": layers, "placement": placement, "efficiency": efficiency,
                        "weights": weights, "probe": probe_experiment, "neighbours": neighbours}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with the defaults of the full or the --quick form filled in."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny slices and budgets: minutes in all")
    parser.add_argument("--only", nargs="+", choices=EXPERIMENTS, default=list(EXPERIMENTS))
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=DEFAULT_TASKS)
    parser.add_argument("--model", default="default", help="the biLM: 'default', a directory or a Hub id")
    parser.add_argument("--seeds", nargs="+", type=int, help="default: 0 1 2 (--quick: 0)")
    parser.add_argument("--max-steps", type=int,
                        help="steps per run (default per task: "
                             + ", ".join(f"{name} {task.max_steps}" for name, task in TASKS.items()) + "; --quick 6)")
    parser.add_argument("--eval-frequency", type=int, help="default 200 (--quick 3)")
    parser.add_argument("--train-docs", type=int, help="training Docs per task (default all; --quick 12)")
    parser.add_argument("--dev-docs", type=int, help="dev Docs per task (default all; --quick 8)")
    parser.add_argument("--probe-sentences", type=int, help="default all (--quick 100)")
    parser.add_argument("--neighbour-sentences", type=int, help="default 2000 (--quick 30)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--frozen-cache-mb", type=int,
                        help="MB of the frozen biLM's layers kept for later epochs (default: the config's 2048; "
                             "SST-5's phrases need about 6,700 to run the biLM over them once)")
    parser.add_argument("--gpu-id", type=int, default=-1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--reuse", nargs="+", type=Path, default=[],
                        help="directories of earlier commands whose runs (same settings) are not trained again")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = dict(seeds=[0] if quick else [0, 1, 2], max_steps=6 if quick else None,
                    eval_frequency=3 if quick else 200, train_docs=12 if quick else None, dev_docs=8 if quick else None,
                    probe_sentences=100 if quick else None, neighbour_sentences=30 if quick else 2000)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    runner = Runner(args)
    for experiment in args.only:
        start = time.perf_counter()
        table, data = EXPERIMENT_FUNCTIONS[experiment](runner)
        steps = ", ".join(f"{task} {max_steps(args, task)}" for task in args.tasks)
        budget = (f"model {args.model} (weights {runner.fingerprint}); steps per run {steps}; seeds "
                  f"{args.seeds}, train docs {args.train_docs or 'all'}, dev docs {args.dev_docs or 'all'}; "
                  f"{cpu_name()}, {args.threads} threads; {time.perf_counter() - start:.0f} s")
        (args.out / f"{experiment}.md").write_text(f"# {experiment}\n\n{budget}\n\n{table}\n", encoding="utf-8")
        (args.out / f"{experiment}.json").write_text(json.dumps({"budget": budget, "data": data}, indent=1))
        print(f"\n## {experiment}\n{budget}\n{table}\n", flush=True)
    runner.save()  # with the runs reused from --reuse directories


if __name__ == "__main__":
    main()
