"""Training throughput of a biLM on CPU: optimizer steps of `hf_elmo.training.BidirectionalLMLoss` on random text.

    python benchmarks/bench_training.py --preset small --num-sampled 8192 --vocab-size 100000
    python benchmarks/bench_training.py --recipe recipes/ptb_cpu.yaml
    python benchmarks/bench_training.py --recipe recipes/english_default.yaml --vocab-size 50000 \
        --batch-tokens 2048 --num-sampled 4096 --model-config '{"cell_clip": 3, "proj_clip": 3}'   # one lever at a time

Prints tokens/s (targets per direction = words + one `</S>` per sentence, the unit of `elmo pretrain`'s log) for
batches of `--batch-tokens` padded positions of sentences of 10-40 words drawn from a Zipfian vocabulary, median
of `--steps` timed steps after `--warmup` steps (forward, backward, gradient clipping, optimizer step: Adagrad, or
the recipe's Adam). Also prints the step's matmul and convolution FLOP/s (forward + backward, counted by torch's
`FlopCounterMode`) and its fraction of the machine's float32 matmul throughput (square 2048 matmuls, same threads).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import time

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoForBidirectionalLM, ElmoKernelOptions
from hf_elmo.kernel_plan import KernelPlan
from hf_elmo.runtime import cpu_name, native_bf16_cpu
from hf_elmo.training import BidirectionalLMLoss, WordVocabulary, encode_batch, group_by_length, split_line
from hf_elmo.weight_forms import linear


def random_corpus(n_sentences: int, vocab_size: int, seed: int = 0) -> tuple[WordVocabulary, list[list[str]]]:
    """A vocabulary of `vocab_size` random words and sentences of 10-40 of them, word k drawn with probability
    ~ 1 / (k + 1)."""
    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < vocab_size - 3:
        words["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 10)))] = None
    vocabulary = WordVocabulary(["<S>", "</S>", "<UNK>", *words])
    weights = [1.0 / (k + 1) for k in range(len(words))]
    return vocabulary, [rng.choices(list(words), weights, k=rng.randint(10, 40)) for _ in range(n_sentences)]


def matmul_flops_per_second(size: int = 2048, repeats: int = 5) -> dict[str, float]:
    """The machine's matmul throughput at the current thread count, best of `repeats` square matmuls: float32
    through MKL (`torch.mm`, what autograd uses) and through oneDNN (`linear` without gradient, what inference
    uses; MKL takes a slower AVX2 path on some CPUs, e.g. AMD's), and bf16 (`torch.mm`, oneDNN; native on CPUs with
    AVX512-BF16 or AMX, emulated elsewhere)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a16, b16 = a.bfloat16(), b.bfloat16()
    with torch.inference_mode():
        onednn = KernelPlan.make(ElmoKernelOptions(onednn=True), a, [a, b])  # whatever the float32 default here
        paths = {"mkl": lambda: torch.mm(a, b), "onednn": lambda: linear(a, b, None, onednn.onednn),
                 "bf16": lambda: torch.mm(a16, b16)}
        rates = {}
        for name, function in paths.items():
            rates[name] = 2 * size**3 / best_seconds(function, repeats)
    return rates


def best_seconds(function, repeats: int, calls: int = 1) -> float:
    """Best of `repeats` means over `calls` calls of `function`, after a warm-up call."""
    function()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        timings.append((time.perf_counter() - start) / calls)
    return min(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", help="small, medium or original (a recipe names its own)")
    parser.add_argument("--recipe", help="an `elmo pretrain` YAML recipe: its model_config, batch_tokens, num_sampled, "
                        "optimizer (the options below override it)")
    parser.add_argument("--vocab-size", type=int, default=10_000)
    parser.add_argument("--num-sampled", type=int, help="0 = full softmax (default: the recipe's, else 0)")
    parser.add_argument("--batch-tokens", type=int, help="padded positions per batch (default: recipe, else 2048)")
    parser.add_argument("--model-config", default="{}", help="JSON of ElmoConfig fields over the recipe's")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--peak-size", type=int, default=2048, help="side of the square matmuls timed for the peak")
    parser.add_argument("--bf16", action="store_true", help="steps under bf16 autocast (as `elmo pretrain "
                        "--mixed_precision bf16`); the fraction of peak is then of the bf16 matmul rate")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    recipe = yaml.safe_load(open(args.recipe)) if args.recipe else {}
    model_config = {**recipe.get("model_config", {}), **json.loads(args.model_config)}
    batch_tokens = args.batch_tokens or recipe.get("batch_tokens", 2048)
    num_sampled = args.num_sampled if args.num_sampled is not None else recipe.get("num_sampled", 0)
    vocabulary, sentences = random_corpus(2000, args.vocab_size)
    config = ElmoConfig.from_preset(recipe.get("preset", args.preset), **model_config, vocab_size=len(vocabulary))
    lm = ElmoForBidirectionalLM(config)
    objective = BidirectionalLMLoss(lm, num_sampled=num_sampled).train()
    if recipe.get("optimizer") == "adam":
        optimizer = torch.optim.Adam(objective.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.Adagrad(objective.parameters(), lr=0.2, initial_accumulator_value=1.0)
    tokenizer = ElmoCharTokenizer(max_characters_per_token=config.max_characters_per_token)
    segments = [s for words in sentences for s in split_line(words, None)]
    batches = group_by_length(segments, batch_tokens)
    random.Random(0).shuffle(batches)
    batches = [encode_batch(b, tokenizer, vocabulary) for b in batches[: args.warmup + args.steps]]

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16)
    rates, flop_rates = [], []
    for index, batch in enumerate(batches):
        with FlopCounterMode(display=False) as counter:  # matmul and convolution FLOPs, forward and backward
            with autocast:
                loss = objective(**batch).loss
            loss.backward()  # counted apart: the counter slows the step it watches
        optimizer.zero_grad()
        start = time.perf_counter()
        with autocast:
            output = objective(**batch)
        output.loss.backward()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 10.0)
        optimizer.step()
        optimizer.zero_grad()
        seconds = time.perf_counter() - start
        if index >= args.warmup:
            rates.append(int(output.n_targets) / seconds)
            flop_rates.append(counter.get_total_flops() / seconds)
    peaks = matmul_flops_per_second(args.peak_size)
    peak = peaks["bf16"] if args.bf16 else max(peaks["mkl"], peaks["onednn"])
    print(json.dumps({
        "model": args.recipe or args.preset,
        "parameters": sum(p.numel() for p in lm.parameters()),
        "vocab_size": len(vocabulary),
        "softmax": f"sampled {num_sampled}" if num_sampled else "full",
        "batch_tokens": batch_tokens,
        "clipping": [config.cell_clip, config.proj_clip],
        "threads": args.threads,
        "dtype": "bf16 autocast" if args.bf16 else "float32",
        "tokens_per_second": round(statistics.median(rates)),
        "step_gflops_per_second": round(statistics.median(flop_rates) / 1e9, 1),
        "matmul_peak_gflops_per_second": {name: round(rate / 1e9, 1) for name, rate in peaks.items()},
        "fraction_of_matmul_peak": round(statistics.median(flop_rates) / peak, 3),
        "cpu": cpu_name(),
        "native_bf16": native_bf16_cpu(),
        "load_average": os.getloadavg()[0],
    }))


if __name__ == "__main__":
    main()
