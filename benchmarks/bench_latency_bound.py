"""How far exact eager kernels can take one-sentence latency: the model as it is, and the same calls with the LSTM's
element-wise gate math removed.

    python benchmarks/bench_latency_bound.py --threads 2 [--presets small] [--allennlp-python PATH]

The input is `bench_inference.py`'s 20-word sentence, the weights random per preset, the token cache off and the
packed weights kept (an `ElmoInferenceCache(token_cache_size=0)`), as in its latency column. "Without gate math"
replaces each LSTM step's sigmoid, tanh, cell update and clipping by nothing: the step keeps its two matmuls (the
recurrent one and the projection of the gate pre-activations' first D columns) and everything outside the steps
stays. Its vectors are wrong; its time bounds what any faster gate math (fused kernels included) could reach with
these matmuls. The two variants alternate call by call (`--calls` each, after 20 warm-up pairs; the median and the
25th percentile of each); with `--allennlp-python`, AllenNLP's latency on the same weights and sentence
(`bench_inference.run_allennlp`, median of `--calls` calls) gives the ratios to the medians.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
from bench_inference import random_sentences, run_allennlp  # benchmarks/ (the script's directory)
from transformers.utils import logging as hf_logging

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoInferenceCache, ElmoModel, kernels
from hf_elmo.formulas import LstmWeights
from hf_elmo.runtime import cpu_name


def matmuls_only(weights: LstmWeights, gates: torch.Tensor, c: torch.Tensor, project: Callable) -> tuple:
    """The LSTM cell (`formulas.lstm_cell`, as the kernels call it) without its element-wise operations: the
    projection matmul of the first D gate columns."""
    return project(gates[..., : c.shape[-1]]), c


def alternated_ms(calls: dict[str, Callable[[], object]], n: int) -> dict[str, list[float]]:
    """Each call's times in ms, the calls alternated `n` times after 20 untimed rounds; sorted."""
    timings: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(n + 20):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_ >= 20:
                timings[name].append((time.perf_counter() - start) * 1e3)
    return {name: sorted(values) for name, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--presets", default="small")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--allennlp-python", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    tokenizer = ElmoCharTokenizer()
    single = dict(tokenizer([random_sentences(1, 20, seed=1)[0]], is_split_into_words=True, return_tensors="pt"))
    print(f"machine: {cpu_name()}, torch {torch.__version__}, {args.threads} threads; one 20-word sentence; "
          f"{args.calls} alternated calls of each; ms: median (25th percentile)")
    print(f"{'preset':<9} {'as is':>15} {'no gate math':>15}" + (
        f" {'AllenNLP ms':>11} {'ratio as is':>11} {'ratio bound':>11}" if args.allennlp_python else ""))
    for name in args.presets.split(","):
        torch.manual_seed(0)
        model = ElmoModel(ElmoConfig.from_preset(name)).eval()
        call = functools.partial(model, **single, inference_cache=ElmoInferenceCache(token_cache_size=0))

        def without_gate_math(call=call) -> None:
            with mock.patch.object(kernels, "lstm_cell", matmuls_only):
                call()

        with torch.inference_mode():
            timings = alternated_ms({"as is": call, "bound": without_gate_math}, args.calls)
        medians = {key: statistics.median(values) for key, values in timings.items()}
        row = f"{name:<9}" + "".join(
            f" {medians[key]:>7.2f} ({values[len(values) // 4]:>5.2f})" for key, values in timings.items())
        if args.allennlp_python:
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(Path(folder) / "model")
                theirs, _ = run_allennlp(args.allennlp_python, Path(folder) / "model", [single], single,
                                         args.threads, 1, args.calls, Path(folder), torch.device("cpu"))
            their_ms = theirs["latency"] * 1e3
            row += f" {their_ms:>11.1f} {their_ms / medians['as is']:>11.2f} {their_ms / medians['bound']:>11.2f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
