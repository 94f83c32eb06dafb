"""Inference speed of the biLM presets with random weights, side by side with AllenNLP 2.10.1 (CPU by default).

    python benchmarks/bench_inference.py [--threads 2] [--presets small,medium,original]
                                         [--allennlp-python /path/to/allennlp-venv/bin/python] [--matmuls mkl]
                                         [--device cuda] [--bf16 | --int8]

For each preset: tokens/s (words; `<S>`/`</S>` not counted) over `--sentences` sentences of `--length` words in
batches of `--batch-size` (median of `--repeats` passes after a warm-up pass), and the latency of one 20-word
sentence (median of `--latency-calls` calls after 5 untimed ones, AllenNLP's too), under `torch.inference_mode`,
with the token cache off (every word through the char CNN, as AllenNLP); then tokens/s with the token cache warm
(the same sentences seen before: the best case of repetitive text).
With `--allennlp-python` (or `$ALLENNLP_PYTHON`), AllenNLP's `_ElmoBiLm` runs the same weights (exported with
`export_hdf5`) on the same inputs in its own virtualenv (see benchmarks/README.md), and the table adds its figures,
the ratios (to the cache-off figures), and the max abs difference of all layers of the first batch (both from the
zero state). `--matmuls mkl` / `onednn` runs this project's float32 matmuls through `F.linear` (MKL) / oneDNN instead of
the choice `ElmoKernelOptions(onednn="auto")` makes for this CPU; `--device cuda`
runs both models on the GPU (AllenNLP's virtualenv then needs a CUDA build of torch). `--bf16` / `--int8` add the
project's bf16 / int8 mode beside its float32 (tokens/s and latency with their ratios to float32, max abs difference
and minimum row cosine of the first batch's layers to float32; on random weights: the speed, not the quality).

On a CPU the float32 figures are set against the machine's matmul ceiling: 2048² float32 matmuls through MKL
(`torch.mm`) and through oneDNN (`linear`), measured alternately with the model in this process (before and after
each measurement: the host's noise moves both), and the fraction of the faster ceiling the model's useful matmul
FLOPs reach (`flops_per_position`), in batches of `--batch-size` and at `ElmoEmbedder`'s default batching (its
`batch_tokens`, over `--embedder-sentences` sentences, tokenization and output arrays included); beside each, the
most the recurrence's shape allows (`recurrence_bound`: the steps' matmuls at the rate they reach alone for that many
rows, every other matmul at the ceiling, nothing else taking time). `--profile` adds
where one forward of the first batch spends its time in each mode run (`profiling.forward_shares`: the token layer,
the LSTM's matmuls, its gate arithmetic, copies).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from bench_lstm_step import step_timings  # benchmarks/ (the script's directory)
from bench_training import matmul_flops_per_second
from profiling import SHARES, forward_shares
from transformers.utils import logging as hf_logging

from hf_elmo import (
    ElmoCharTokenizer,
    ElmoConfig,
    ElmoEmbedder,
    ElmoInferenceCache,
    ElmoKernelOptions,
    ElmoModel,
    ElmoModelOutput,
    load_model,
)
from hf_elmo.kernel_plan import uses_onednn
from hf_elmo.original_format import export_hdf5
from hf_elmo.runtime import cpu_name, onednn_available

WORKER = Path(__file__).with_name("allennlp_worker.py")


def random_sentences(n: int, length: int, seed: int = 0) -> list[list[str]]:
    """Words of 1-12 lowercase letters from a fixed vocabulary of 5000, so some repeat like real text."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 12))) for _ in range(5000)]
    return [[rng.choice(vocab) for _ in range(length)] for _ in range(n)]


LATENCY_WARM_UP = 5  # untimed single-sentence calls before the timed ones (the worker has the same)


def median_seconds(functions: list[Callable[[], object]], repeats: int, device: torch.device,
                   warm_up: int = 1) -> list[float]:
    """Median seconds of each of `functions`, timed in turn `repeats` times after `warm_up` untimed calls each:
    alternately, so that the host's noise moves them alike."""
    for function in functions:
        for _ in range(warm_up):
            function()
    timings: list[list[float]] = [[] for _ in functions]
    for _ in range(repeats):
        for function, times in zip(functions, timings):
            start = time.perf_counter()
            function()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in timings]


def forward_in(mode: str | None, model: ElmoModel, cache: ElmoInferenceCache) -> Callable[[dict], ElmoModelOutput]:
    """The model's forward of one batch of inputs in `mode` (None: float32, "bf16", "int8"), keeping the weights'
    forms (and token representations) in `cache`."""
    options = {"quantize": "int8"} if mode == "int8" else {}
    device_type = next(model.parameters()).device.type

    def forward(inputs: dict) -> ElmoModelOutput:
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=mode == "bf16"):
            return model(**inputs, inference_cache=cache, **options)

    return forward


def measure(modes: list[str | None], model: ElmoModel, batches: list[dict], single: dict, repeats: int,
            latency_calls: int, device: torch.device, cache_tokens: bool = False
            ) -> list[tuple[float, float, list[torch.Tensor]]]:
    """Per mode of `modes` (`forward_in`), timed alternately with the others pass by pass and call by call: seconds
    per pass over `batches` and per `single` sentence, and the first batch's layers, the weights' forms kept between
    calls (and the token representations with `cache_tokens`, then only the seconds per pass)."""
    forwards = [forward_in(mode, model, ElmoInferenceCache(**({} if cache_tokens else {"token_cache_size": 0})))
                for mode in modes]
    with torch.inference_mode():
        seconds = median_seconds([lambda f=f: [f(b) for b in batches] for f in forwards], repeats, device)
        if cache_tokens:
            return [(s, 0.0, []) for s in seconds]
        latencies = median_seconds([lambda f=f: f(single) for f in forwards], latency_calls, device,
                                   warm_up=LATENCY_WARM_UP)
        firsts = [[layer.float().cpu() for layer in f(batches[0]).hidden_states] for f in forwards]
    return list(zip(seconds, latencies, firsts))


def profile_forward(mode: str | None, model: ElmoModel, batch: dict) -> dict[str, float]:
    """`profiling.forward_shares` of one forward of `batch` in `mode` (as `measure` runs it, after a warm-up)."""
    forward = forward_in(mode, model, ElmoInferenceCache(token_cache_size=0))
    with torch.inference_mode():
        forward(batch)
        return forward_shares(lambda: forward(batch))


def read_bandwidth(megabytes: int = 256, repeats: int = 10) -> float:
    """Bytes per second this machine reads from memory (a sum over `megabytes` of float32, median of `repeats`)."""
    data = torch.ones(megabytes * 2**18)
    data.sum()
    return data.numel() * 4 / median_seconds([data.sum], repeats, torch.device("cpu"))[0]


def step_weights(model: ElmoModel) -> int:
    """The weights one LSTM step of every layer reads (recurrent and projection weights of both directions): what
    every position of a one-sentence call reads from memory, since a step's weights outgrow the caches."""
    return sum(w.numel() for layer in model.bilstm.layers for w in (layer.weights().recurrent_weight,
                                                                     layer.weights().projection_weight)
               if w is not None)


def flops_per_position(model: ElmoModel, characters: float) -> float:
    """2 x the multiply-adds one position costs the biLM, counting useful work only: the char CNN's filters over the
    windows that fit in a word's own `characters` (its letters and the two markers, not the padding slots), the
    highway, the token projection, and every LSTM layer's input, recurrent and projection matmuls, both directions."""
    cnn = model.char_cnn.weights()
    macs = sum(n * width * chars * max(0.0, characters - width + 1)
               for n, chars, width in (tuple(weight.shape) for weight, _ in cnn.filters))
    macs += sum(weight.numel() for weight, _ in cnn.highway) + cnn.projection[0].numel()
    for layer in model.bilstm.layers:
        weights = layer.weights()
        macs += sum(w.numel() for w in (weights.input_weight, weights.recurrent_weight, weights.projection_weight)
                    if w is not None)
    return 2 * macs


def recurrence_bound(model: ElmoModel, rows: int, flops: float, words_per_position: float, ceiling: float,
                     options: ElmoKernelOptions) -> float:
    """The FLOP/s a forward of `rows` sentences (`flops` per word) could reach at most if every matmul but the
    recurrent steps' ran at `ceiling` and nothing else took time, the steps' recurrent and projection matmuls at the
    rate they reach alone for `rows` rows (`bench_lstm_step.step_timings`): the bound their shape puts on it."""
    seconds, step_flops = 0.0, 0.0  # per position
    for layer in model.bilstm.layers:
        _, matmuls = step_timings(layer, rows, False, options, repeats=3)
        seconds += matmuls / rows
        step_flops += 2 * sum(w.numel() for w in (layer.weights().recurrent_weight, layer.weights().projection_weight)
                              if w is not None)
    per_word = seconds / words_per_position + (flops - step_flops / words_per_position) / ceiling
    return flops / per_word


class Ceiling:
    """The machine's float32 matmul rates (FLOP/s) through MKL and oneDNN, sampled between the model's measurements;
    each reported as the median of its samples."""

    def __init__(self, size: int) -> None:
        self.size = size  # the side of the square matmuls timed
        self.samples: dict[str, list[float]] = {"mkl": [], "onednn": []}

    def sample(self) -> None:
        rates = matmul_flops_per_second(self.size, repeats=3)
        for name in self.samples:
            self.samples[name].append(rates[name])

    def rate(self, name: str) -> float:
        return statistics.median(self.samples[name])

    def best(self) -> float:
        return max(self.rate(name) for name in self.samples)

    def describe(self, reached: dict[str, tuple[float, float]]) -> str:
        """The ceilings, and the fraction of the faster one each of `reached` (label: FLOP/s reached, and the bound
        the recurrence's shape puts on it) is."""
        fractions = ", ".join(f"{label} {rate / 1e9:.0f} GFLOP/s = {rate / self.best():.0%} (the recurrence's "
                              f"shape allows at most {bound / 1e9:.0f} = {bound / self.best():.0%})"
                              for label, (rate, bound) in reached.items())
        return (f"MKL {self.rate('mkl') / 1e9:.0f}, oneDNN {self.rate('onednn') / 1e9:.0f} GFLOP/s "
                f"({len(self.samples['mkl'])} samples each, alternately with the model); reached: {fractions}")


def embedder_seconds(model: ElmoModel, sentences: list[list[str]], repeats: int) -> float:
    """Seconds `ElmoEmbedder` (its default batching, all layers) takes to embed `sentences` (its inference cache
    warm with the weights' forms, no token representations kept: every word through the char CNN)."""
    embedder = ElmoEmbedder(model)
    embedder.inference_cache = ElmoInferenceCache(token_cache_size=0)
    return median_seconds([lambda: list(embedder.embed_sentences(sentences))], repeats, torch.device("cpu"))[0]


def run_allennlp(python: str, model_dir: Path, batches: list[dict], single: dict, threads: int, repeats: int,
                 latency_calls: int, work_dir: Path, device: torch.device) -> tuple[dict, list[np.ndarray]]:
    """AllenNLP's seconds per pass, single-sentence latency and first-batch layers, from its own virtualenv."""
    export_hdf5(load_model(model_dir), f"{work_dir}{os.sep}")
    without_boundaries = [b["input_ids"][:, 1:-1].numpy() for b in [*batches, single]]  # equal-length rows
    np.savez(work_dir / "batches.npz", **{str(i): ids for i, ids in enumerate(without_boundaries[:-1])})
    np.save(work_dir / "single.npy", without_boundaries[-1])
    subprocess.run([python, str(WORKER), str(work_dir), str(threads), str(repeats), str(latency_calls), str(device)],
                   check=True)
    layers = np.load(work_dir / "layers.npz")
    return json.loads((work_dir / "result.json").read_text()), [layers[f"arr_{i}"] for i in range(len(layers.files))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--presets", default="small,medium,original")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--length", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--profile", action="store_true",
                        help="also profile one forward of the first batch per mode (where its time goes)")
    parser.add_argument("--embedder-sentences", type=int, default=320,
                        help="sentences for the row at ElmoEmbedder's default batching (CPU; 0: no such row)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peak-size", type=int, default=2048, help="side of the square matmuls timed for the "
                        "float32 ceiling")
    parser.add_argument("--latency-calls", type=int, default=100,
                        help=f"timed single-sentence calls (median), after {LATENCY_WARM_UP} untimed ones")
    parser.add_argument("--allennlp-python", default=os.environ.get("ALLENNLP_PYTHON"))
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (both models on it)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--bf16", action="store_true", help="also run this project's model under bf16 autocast "
                       "(CPUs with AVX512-BF16 / AMX, GPUs); AllenNLP stays float32")
    modes.add_argument("--int8", action="store_true", help="also run this project's int8 mode (CPUs with AVX2)")
    parser.add_argument("--matmuls", choices=["auto", "onednn", "mkl"], default="auto",
                        help="this project's CPU float32 matmuls: ElmoKernelOptions' choice for this CPU (the "
                        "default), oneDNN or F.linear (MKL), to compare")
    args = parser.parse_args()
    options = ElmoKernelOptions(onednn="auto" if args.matmuls == "auto" else args.matmuls == "onednn")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()

    tokenizer = ElmoCharTokenizer()
    sentences = random_sentences(args.sentences, args.length)
    batches = [
        dict(tokenizer(sentences[i : i + args.batch_size], is_split_into_words=True, padding=True,
                       return_tensors="pt"))
        for i in range(0, len(sentences), args.batch_size)
    ]
    single = dict(tokenizer([random_sentences(1, 20, seed=1)[0]], is_split_into_words=True, return_tensors="pt"))
    on_device = [{key: value.to(device) for key, value in batch.items()} for batch in [*batches, single]]
    device_batches, device_single = on_device[:-1], on_device[-1]
    n_tokens = args.sentences * args.length
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"float32 matmuls: {'oneDNN' if uses_onednn(options) and onednn_available() else 'F.linear (MKL)'}")
    mode = "bf16" if args.bf16 else "int8" if args.int8 else None
    print(f"machine: {cpu_name()} {os.cpu_count()} cpus, torch {torch.__version__}, {args.threads} threads; "
          f"{args.sentences} sentences x {args.length} words, batch {args.batch_size}; latency: 1 x 20 words; "
          f"{where}{f'; this project also in {mode}' if mode else ''}")
    if not args.allennlp_python:
        print("AllenNLP columns skipped: AllenNLP is not installed here (pass --allennlp-python; see "
              "benchmarks/README.md)")

    header = f"{'preset':<9} {'tokens/s':>9} {'latency ms':>10} {'cached tok/s':>12}"
    if mode:
        header += (f" {mode + ' tok/s':>10} {'ratio':>6} {mode + ' ms':>8} {'ratio':>6} {'|diff| f32':>10}"
                   f" {'min cos':>8}")
    if args.allennlp_python:
        header += f" {'AllenNLP tok/s':>14} {'ratio':>6} {'AllenNLP ms':>11} {'ratio':>6} {'max |diff|':>10}"
    print(header)
    ceilings: list[str] = []
    matmul_ceilings: list[str] = []
    profiles: list[str] = []
    embedder_sentences = random_sentences(args.embedder_sentences, args.length, seed=2)
    characters = statistics.mean(len(word) + 2 for sentence in sentences for word in sentence)
    for name in args.presets.split(","):
        torch.manual_seed(0)
        model = ElmoModel(ElmoConfig.from_preset(name)).eval().to(device)
        model.config.kernel_options = asdict(options)

        run = dict(model=model, batches=device_batches, single=device_single, repeats=args.repeats,
                   latency_calls=args.latency_calls, device=device)
        ceiling = Ceiling(args.peak_size) if device.type == "cpu" else None
        if ceiling:
            ceiling.sample()
        (seconds, latency, ours_first), *in_mode = measure([None, mode] if mode else [None], **run)
        if ceiling:
            ceiling.sample()
        [(cached_seconds, _, _)] = measure([None], **run, cache_tokens=True)
        row = f"{name:<9} {n_tokens / seconds:>9.0f} {latency * 1e3:>10.1f} {n_tokens / cached_seconds:>12.0f}"
        if mode:  # side by side with float32; over every row (boundaries and padding included: every row is a word)
            [(mode_seconds, mode_latency, mode_first)] = in_mode
            if mode == "int8":
                positions, bandwidth = device_single["input_ids"].shape[1], read_bandwidth()
                bound = [positions * step_weights(model) * size / bandwidth for size in (4, 1)]
                ceilings.append(f"{name}: {step_weights(model) * 4 / 1e6:.0f} MB float32 / "
                                f"{step_weights(model) / 1e6:.0f} MB int8 of step weights per position, {positions} "
                                f"positions at {bandwidth / 1e9:.1f} GB/s: latency >= {bound[0] * 1e3:.1f} / "
                                f"{bound[1] * 1e3:.1f} ms; measured {latency / bound[0]:.2f} / "
                                f"{mode_latency / bound[1]:.2f} times that")
            difference = max(float((a - b).abs().max()) for a, b in zip(mode_first, ours_first))
            cosine = min(float(torch.cosine_similarity(a.flatten(0, -2), b.flatten(0, -2), dim=-1).min())
                         for a, b in zip(mode_first, ours_first))
            row += (f" {n_tokens / mode_seconds:>10.0f} {seconds / mode_seconds:>6.2f} {mode_latency * 1e3:>8.1f}"
                    f" {latency / mode_latency:>6.2f} {difference:>10.2e} {cosine:>8.5f}")
        if args.allennlp_python:
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(Path(folder) / "model")
                theirs, their_layers = run_allennlp(args.allennlp_python, Path(folder) / "model", batches, single,
                                                    args.threads, args.repeats, args.latency_calls, Path(folder),
                                                    device)
            difference = max(float(np.abs(a.numpy() - b).max()) for a, b in zip(ours_first, their_layers))
            row += (f" {n_tokens / theirs['seconds']:>14.0f} {theirs['seconds'] / seconds:>6.2f}"
                    f" {theirs['latency'] * 1e3:>11.1f} {theirs['latency'] / latency:>6.2f} {difference:>10.2e}")
        print(row, flush=True)
        for profiled in [None, mode] if args.profile else []:
            shares = profile_forward(profiled, model, device_batches[0])
            profiles.append(f"{name} {profiled or 'float32'}: {shares['ms']:.0f} ms of operations; " + ", ".join(
                f"{share} {shares[share]:.0%}" for share in SHARES))
        if ceiling:
            positions = args.length + 2  # the words and <S>, </S>
            flops = flops_per_position(model, characters) * positions / args.length  # per word
            bound = dict(model=model, flops=flops, words_per_position=args.length / positions, options=options)
            reached = {f"batch {args.batch_size}": (
                flops * n_tokens / seconds, recurrence_bound(rows=args.batch_size, ceiling=ceiling.best(), **bound))}
            if args.embedder_sentences:
                embedder_tokens = args.embedder_sentences * args.length
                rate = flops * embedder_tokens / embedder_seconds(model, embedder_sentences, max(1, args.repeats // 2))
                ceiling.sample()
                rows = min(args.embedder_sentences, ElmoEmbedder(model).batch_tokens // positions)  # its batches
                reached["ElmoEmbedder"] = (rate, recurrence_bound(rows=rows, ceiling=ceiling.best(), **bound))
            matmul_ceilings.append(f"{name} ({flops / 1e9:.3f} GFLOP per word): {ceiling.describe(reached)}")
    for line in profiles:
        print(f"profile of one forward of batch {args.batch_size}, {line}")
    for line in matmul_ceilings:
        print(f"float32 matmul ceiling, {line}")
    for line in ceilings:
        print(f"memory-bound ceiling of the latency, {line}")


if __name__ == "__main__":
    main()
