"""Where a `spacy train` step spends its time, with ELMo and without: time per stage of each step.

    python benchmarks/bench_spacy_train.py [--task ner|textcat] [--steps 60] [--widths toy|real] [--gpu-id -1]
                                           [--sync] [--train-docs 2000] [--batch-words N] [--threads 2]

Runs spaCy's own training loop (`spacy.cli.train.train`) on the shipped config with ELMo and without it
(`init-config --elmo none`), in that order in one process, and times every step (the interval between two calls of
the training logger; steps that evaluate are left out) and three stages within it:
- `elmo`: the `elmo` component's update: the frozen biLM over the batch's Docs it has not read yet, else its cache;
  where the biLM ran, its parts too (`elmo: doc_sentences`, `elmo: sentence_batches`, `elmo: each_batch` with the
  host's `elmo: char ids` inside it, `elmo: strip_boundaries`, `elmo: to_docs`);
- `task features`: the task component's `tok2vec`, forward and backward (hash embeddings, the ELMo listeners and
  mixes, the task biLSTM), of which `elmo mixes` is the ELMo branches (listener, scalar mix, dropout, projection);
- `rest`: the step's remaining time: spaCy's parser or classifier, the optimizer, batching, the loop.
Steps in which the biLM read Docs (`reading`: the first epoch) and steps served by its cache (`cached`) are
reported apart, as medians in ms.

`--widths toy` shrinks the networks (a biLM of 16-dim projections, task layers 8 wide) until the arithmetic is
negligible: a step's time on a CPU is then the host's, the Python and dispatch cost that a GPU cannot hide (the CPU
still runs the biLM's LSTMs step by step where a GPU runs one cuDNN kernel). On a GPU the stage times are host times
(the device runs asynchronously; a stage that waits for the device, such as the parser copying its scores to the
host, takes on the device time of the stages before it); `--sync` waits for the device at the end of every stage so
that each carries its own device time, at some cost in speed. The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profiling import StepProfiler

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
# A biLM too small to cost anything but the host's time (its LSTMs, highway and char CNN run all the same), without
# clipping as the default model (on a GPU: cuDNN's LSTM).
TOY_ARCHITECTURE = {"char_embedding_dim": 4, "filters": [[1, 8], [2, 8]], "n_highway": 1, "lstm_dim": 32,
                    "projection_dim": 16, "cell_clip": None, "proj_clip": None}
MAIN_SCORES = {"ner": "ents_f", "textcat": "cats_macro_f"}


class StageTimer:
    """Per training step: its seconds, the seconds of each stage, the Docs the biLM read, whether it evaluated.

    `attach(nlp)` (run as `[initialize] after_init`) wraps the stages; `log_step` (the training logger's) closes a
    step. `sync` is called at the end of every timed call (`torch.cuda.synchronize` for `--sync`); `profile` puts a
    window of steps under torch.profiler (`profiling.StepProfiler`, on `device`)."""

    def __init__(self, sync: Callable[[], None] = lambda: None, profile: tuple[int, int] | None = None,
                 device: str = "cpu") -> None:
        self.sync = sync
        # (first, count): the steps first + 1 .. first + count under torch.profiler, summarised in `profile_summary`.
        self.profile_window = profile
        self.profiler = StepProfiler(device) if profile else None
        self.profile_summary: dict[str, Any] | None = None
        self.steps: list[dict[str, Any]] = []
        self.evaluations: list[dict[str, Any]] = []
        self._stages: Counter = Counter()
        self._read_docs = self._words = 0
        self._last = time.perf_counter()

    def timed(self, stage: str, func: Callable) -> Callable:
        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            result = func(*args, **kwargs)
            self.sync()
            self._stages[stage] += time.perf_counter() - start
            return result

        return timed_call

    def time_layer(self, layer, stage: str, count_words: bool = False) -> None:
        """Time a Thinc layer's forward and its backprop callback as `stage`."""
        forward = layer._func

        def timed_forward(model, inputs, is_train):
            if count_words and is_train:
                self._words += sum(len(doc) for doc in inputs)
            outputs, backprop = self.timed(stage, forward)(model, inputs, is_train)
            return outputs, self.timed(stage, backprop)

        layer._func = timed_forward

    def attach(self, nlp) -> None:
        from spacy_elmo.layers import ElmoListener
        from spacy_elmo.pipeline_component import Elmo

        for _, component in nlp.pipeline:
            if isinstance(component, Elmo):
                component.update = self.timed("elmo", component.update)
                # Within it, the biLM layer's own layers (sentences, length batches, each batch through the biLM,
                # boundaries stripped, per-Doc arrays) and, inside each batch, the character ids made on the host.
                for layer in component.model.layers:
                    self.time_layer(layer, f"elmo: {layer.name.removeprefix('elmo_')}")
                if component.model.has_ref("elmo_torch"):
                    attrs = component.model.get_ref("elmo_torch").attrs
                    attrs["convert_inputs"] = self.timed("elmo: char ids", attrs["convert_inputs"])
                self._count_read_docs(component)
            elif getattr(component, "model", None) is not None and component.model.has_ref("tok2vec"):
                tok2vec = component.model.get_ref("tok2vec")
                self.time_layer(tok2vec, "task features", count_words=True)
                for node in tok2vec.walk():
                    if node.layers and isinstance(node.layers[0], ElmoListener):
                        self.time_layer(node, "elmo mixes")

    def _count_read_docs(self, component) -> None:
        """Count the Docs the frozen biLM of the `elmo` component reads: those its cache lacks (the shipped configs
        freeze it)."""
        layers = component.frozen_cache.layers

        def counted_layers(docs, predict):
            def counted_predict(missing):
                self._read_docs += len(missing)
                return predict(missing)

            return layers(docs, counted_predict)

        component.frozen_cache.layers = counted_layers

    def log_step(self, info: dict | None) -> None:
        now = time.perf_counter()
        stages = {stage: self._stages[stage] for stage in ("elmo", "task features", "elmo mixes")}
        stages |= {stage: seconds for stage, seconds in self._stages.items() if stage.startswith("elmo: ")}
        self.steps.append({"seconds": now - self._last, "stages": stages, "read_docs": self._read_docs,
                           "words": self._words, "evaluated": info is not None})
        if info is not None:
            self.evaluations.append({**info, "at": len(self.steps) - 1})
        self._stages.clear()
        self._read_docs = self._words = 0
        if self.profiler is not None:
            first, count = self.profile_window
            if len(self.steps) == first:
                self.profiler.start()
            elif len(self.steps) == first + count:
                self.profile_summary = self.profiler.stop(count)
        self._last = time.perf_counter()

    def summary(self, warm_up: int) -> dict[str, Any]:
        """Steps/s and words/s over the timed steps (after `warm_up`, evaluations left out), and the median ms of
        each stage in the steps that read Docs with the biLM and in those that did not."""
        timed = [step for step in self.steps[warm_up:] if not step["evaluated"]]
        seconds = sum(step["seconds"] for step in timed)
        result: dict[str, Any] = {
            "timed_steps": len(timed),
            "steps_per_second": round(len(timed) / seconds, 2) if seconds else None,
            "training_words_per_second": round(sum(step["words"] for step in timed) / seconds) if seconds else None,
            "words_per_step": round(statistics.mean(step["words"] for step in timed)) if timed else None,
        }
        for kind, steps in (("reading", [s for s in timed if s["read_docs"]]),
                            ("cached", [s for s in timed if not s["read_docs"]])):
            if steps:
                result[f"ms_per_step_{kind}"] = stage_medians(steps) | {"steps": len(steps)}
        return result


def stage_medians(steps: list[dict]) -> dict[str, float]:
    """Median ms per step of the whole step and of each stage (`task features` without its `elmo mixes`, `rest`
    = the step less the stages; the `elmo: ...` parts of `elmo`, where it ran the biLM)."""
    def median_ms(values) -> float:
        return round(1e3 * statistics.median(values), 2)

    stages = [step["stages"] for step in steps]
    return {
        "step": median_ms(step["seconds"] for step in steps),
        "elmo": median_ms(s["elmo"] for s in stages),
        "elmo mixes": median_ms(s["elmo mixes"] for s in stages),
        "task features": median_ms(s["task features"] - s["elmo mixes"] for s in stages),
        "rest": median_ms(step["seconds"] - step["stages"]["elmo"] - step["stages"]["task features"]
                          for step in steps),
    } | {part: median_ms(s.get(part, 0.0) for s in stages) for part in sorted({key for s in stages for key in s})
         if part.startswith("elmo: ")}


def spacy_data(task: str, work: Path, train_docs: int | None, dev_docs: int | None) -> tuple[Path, Path]:
    """The task's train and dev .spacy files (CoNLL-2003 NER, SST-5 sentences; the first `train_docs` and
    `dev_docs`, None = all), converted once per `work` directory."""
    from spacy.vocab import Vocab

    from spacy_elmo.corpora import read_conll2003, read_sst5, write_docbin

    paths = work / f"{task}-{train_docs or 'all'}-train.spacy", work / f"{task}-{dev_docs or 'all'}-dev.spacy"
    if not all(path.exists() for path in paths):
        if task == "ner":
            conll = DATA / "conll2003" / "iob2"
            sources = [read_conll2003(conll / "train.txt", Vocab()), read_conll2003(conll / "valid.txt", Vocab())]
        else:
            sources = [read_sst5(DATA / "sst5" / "train.tsv", Vocab()), read_sst5(DATA / "sst5" / "dev.tsv", Vocab())]
        for docs, path, limit in zip(sources, paths, (train_docs, dev_docs)):
            write_docbin(docs, path, limit)
    return paths


def shrink_to_toy(config, task: str) -> None:
    """The config's networks at toy widths: the task layers 8 wide and, with ELMo, a random toy biLM."""
    model = config["components"][task]["model"]
    tok2vec = model["tok2vec"]
    tok2vec["width"] = tok2vec["embed"]["width"] = 8
    for key in ("hidden_width", "maxout_width"):
        if key in model:
            model[key] = 8
    for slot in ("elmo", "elmo_output"):
        if slot in tok2vec:
            tok2vec[slot]["project_to"] = 8
    if "elmo" in config["components"]:
        config["initialize"]["components"]["elmo"]["weights"] = {
            "@misc": "spacy-elmo.RandomWeights.v1", "preset": None, "config": TOY_ARCHITECTURE}
        config["elmo"]["width"] = 2 * TOY_ARCHITECTURE["projection_dim"]


def train_and_time(task: str, elmo: bool, work: Path, timer: StageTimer, *, steps: int, gpu_id: int = -1,
                   toy: bool = False, mixed_precision: bool = False, batch_words: int | None = None,
                   train_docs: int | None = None, dev_docs: int | None = None) -> tuple[Path, Path]:
    """`spacy train` of the shipped `task` config for `steps` steps (evaluating after the last), timed by `timer`;
    returns the trained pipeline's directory and the dev data."""
    import spacy
    from spacy.cli.train import train

    from spacy_elmo.cli import make_config

    spacy.registry.loggers.register("bench_spacy_train.StageTimer.v1",
                                    func=lambda: lambda nlp, stdout=None, stderr=None: (timer.log_step, lambda: None))
    spacy.registry.callbacks.register("bench_spacy_train.attach.v1", func=lambda: timer.attach)
    train_path, dev_path = spacy_data(task, work, train_docs, dev_docs)
    config = make_config(task, elmo=None if elmo else "none")
    config["training"]["logger"] = {"@loggers": "bench_spacy_train.StageTimer.v1"}
    config["training"].update(max_steps=steps, eval_frequency=steps, max_epochs=0)
    config["initialize"]["after_init"] = {"@callbacks": "bench_spacy_train.attach.v1"}
    if elmo and mixed_precision:
        config["components"]["elmo"]["model"]["mixed_precision"] = True
    if batch_words:
        config["training"]["batcher"]["size"] = batch_words
    if toy:
        shrink_to_toy(config, task)
    name = f"{task}-{'elmo' if elmo else 'none'}{'-mixed' if mixed_precision else ''}{'-toy' if toy else ''}"
    config_path = work / f"{name}.cfg"
    config.to_disk(config_path)
    output = work / name
    train(config_path, output, use_gpu=gpu_id, overrides={"paths.train": str(train_path), "paths.dev": str(dev_path)})
    return output / "model-last", dev_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(MAIN_SCORES), default="ner")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--widths", choices=("toy", "real"), default="toy")
    parser.add_argument("--gpu-id", type=int, default=-1)
    parser.add_argument("--sync", action="store_true", help="wait for the device at the end of every stage")
    parser.add_argument("--train-docs", type=int, default=2000, help="0: the whole training set")
    parser.add_argument("--batch-words", type=int, help="the batcher's size (default: the config's)")
    parser.add_argument("--warm-up", type=int, default=2, help="steps left out at the start")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_spacy_train"))
    args = parser.parse_args()
    import torch

    from hf_elmo.runtime import cpu_name

    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(args.gpu_id) if args.gpu_id >= 0 else f"CPU {cpu_name()}"
    print(f"{args.task}, {args.widths} widths, {args.steps} steps, {device}, {args.threads} threads")
    figures: dict[str, Any] = {"task": args.task, "widths": args.widths, "device": device}
    sync = torch.cuda.synchronize if args.sync and args.gpu_id >= 0 else lambda: None
    for elmo in (True, False):
        timer = StageTimer(sync)
        train_and_time(args.task, elmo, args.work, timer, steps=args.steps, gpu_id=args.gpu_id,
                       toy=args.widths == "toy", batch_words=args.batch_words, train_docs=args.train_docs or None,
                       dev_docs=200)
        summary = timer.summary(args.warm_up)
        figures["elmo" if elmo else "none"] = summary
        print(f"{'with' if elmo else 'without'} ELMo: {summary['steps_per_second']} steps/s, "
              f"{summary['words_per_step']} words/step")
        for kind in ("reading", "cached"):
            if f"ms_per_step_{kind}" in summary:
                stages = summary[f"ms_per_step_{kind}"]
                print(f"  {kind:>7} ({stages['steps']} steps): " + ", ".join(
                    f"{stage} {ms:.1f}" for stage, ms in stages.items() if stage != "steps") + " ms")
    for kind in ("reading", "cached"):
        with_elmo = figures["elmo"].get(f"ms_per_step_{kind}")
        if with_elmo:
            ratio = with_elmo["step"] / figures["none"]["ms_per_step_cached"]["step"]
            figures[f"step_ratio_{kind}"] = round(ratio, 2)
            print(f"step with ELMo ({kind}) / without: {ratio:.2f}")
    print(json.dumps(figures))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
