"""One command that checks every GPU path of the project and measures it, in at most 8 minutes.

    python benchmarks/gpu_check.py [--quick] [--out DIR] [--device cuda|cpu] [--phases tests,parity,...]
    make gpu-check

Phases, each job a fresh process under its own time limit (one slow job cannot eat the others):
- `tests`: the CUDA tests (`pytest -m cuda`);
- `parity`: the default model's layers on the device against the CPU's in float32, and the drift of bf16 and fp16
  autocast from float32 (max abs difference and minimum row cosine per layer) on CoNLL-2003 dev sentences;
- `inference`: the default model over CoNLL-2003 dev sentences tokenized beforehand, words/s at batch 1 / 32 / 256 in
  float32, bf16 and fp16, and the median latency of one 24-word sentence;
- `embed`: `elmo embed --device cuda` of the same sentences into .npy and .hdf5, float32 and `--bf16`: seconds and
  words/s of each command (the model's loading included), its warnings, and the bf16 output's drift;
- `spacy`: `spacy train` (`--gpu-id 0`) of the shipped NER config with ELMo, with `mixed_precision = true`, and
  without ELMo (`init-config --elmo none`), and of the textcat config with and without ELMo: steps/s (evaluation
  left out), training words/s, the host ms per step of each stage (the biLM, the ELMo mixes, the task's features,
  the rest; `bench_spacy_train.py`) in steps where the biLM read Docs and in steps served by its cache, the dev
  score, peak GPU memory, GPU utilisation (NVML / `nvidia-smi`, sampled every 0.2 s), the warnings printed during
  the steps, and the trained pipeline's `nlp.pipe` words/s on the dev set;
- `pretrain`: `elmo pretrain` of the default and the small architecture with their GPU recipes' batch sizes, loader
  workers and bf16, on Penn Treebank: tokens/s (the log's, after the first window), peak memory, warnings, and a
  second command that resumes from the checkpoint and goes on.

Without CUDA (or with `--device cpu`) the same phases run on the CPU at toy sizes (a CI test runs this form).
The report goes to `--out` (default `$OUT` if set, else `gpu_check/`): gpu_check.json, gpu_check.md, and
gpu_check.log with every job's output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
CONLL = DATA / "conll2003" / "iob2"
PTB = DATA / "ptb"
# A tiny biLM for the CPU form of the pretraining phase.
TOY_ARCHITECTURE = {"char_embedding_dim": 4, "filters": [[1, 8], [2, 8]], "n_highway": 1, "lstm_dim": 32,
                    "projection_dim": 16}


@dataclass(frozen=True)
class Sizes:
    """How much each phase does: the GPU form (`quick` halves the spaCy and pretraining steps) or the CPU toy form."""

    parity_sentences: int
    inference_sentences: int
    batch_sizes: tuple[int, ...]
    latency_calls: int
    spacy_steps: int
    spacy_batch_words: int | None  # None: the config's
    spacy_train_docs: int | None  # None: all
    spacy_dev_docs: int | None
    pretrain_steps: int
    pretrain_resume_steps: int
    pretrain_logging_steps: int
    toy: bool


GPU = Sizes(64, 3250, (1, 32, 256), 50, 300, None, None, None, 60, 20, 20, False)
GPU_QUICK = Sizes(64, 1024, (1, 32, 256), 30, 150, None, None, None, 30, 10, 10, False)
CPU_TOY = Sizes(4, 16, (1, 8), 3, 4, 300, 24, 12, 4, 2, 2, True)


# -- the parent: jobs, limits, sampling, report ------------------------------------------------------------------


class GpuSampler:
    """GPU utilisation (%) and memory used (MiB) of device 0, sampled every `interval` seconds in a thread through
    NVML (pynvml) or `nvidia-smi`; nothing on a machine with neither."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.samples = interval, []
        self._stop = threading.Event()
        self._read = self._reader()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _reader(self) -> Callable[[], tuple[float, float]] | None:
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return lambda: (float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                            pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20)
        if shutil.which("nvidia-smi"):
            def smi() -> tuple[float, float]:
                output = subprocess.run(["nvidia-smi", "--id=0", "--query-gpu=utilization.gpu,memory.used",
                                         "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
                utilisation, memory = output.stdout.split(",")
                return float(utilisation), float(memory)
            return smi
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.samples.append(self._read())

    def __enter__(self) -> GpuSampler:
        if self._read is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        utilisation = [u for u, _ in self.samples]
        return {"samples": len(utilisation), "utilisation_mean": round(statistics.mean(utilisation), 1),
                "utilisation_max": max(utilisation),
                "utilisation_zero_fraction": round(sum(u == 0 for u in utilisation) / len(utilisation), 3),
                "memory_used_peak_mib": round(max(m for _, m in self.samples))}


def run_job(name: str, args: list[str], limit: float, work: Path, log: Path) -> dict:
    """This script in a fresh process as the worker `args`, killed after `limit` seconds; its JSON result (or why
    there is none) with the wall time and the GPU samples."""
    result_file = work / f"{name.replace('/', '-')}.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", *args, "--result", str(result_file)]
    start = time.perf_counter()
    with log.open("a", encoding="utf-8") as out, GpuSampler() as sampler:
        out.write(f"\n===== {name}: {' '.join(command[2:])} (limit {limit:.0f} s)\n")
        out.flush()
        try:
            process = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=limit,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", "ANSI_COLORS_DISABLED": "1",
                                          "TQDM_DISABLE": "1"})
            status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    if status == "ok" and not result:
        status = "failed (no result)"
    return {"job": name, "status": status, "wall_seconds": round(time.perf_counter() - start, 1),
            "gpu": sampler.summary(), **result}


def jobs(sizes: Sizes, device: str) -> dict[str, list[tuple[str, list[str], float]]]:
    """Per phase its jobs: (name, worker arguments, time limit in seconds); the limits add up to 7.8 minutes."""
    common = ["--device", device, "--sizes", json.dumps(sizes.__dict__)]
    spacy_runs = [("ner", "elmo", 70), ("ner", "elmo-mixed", 70), ("ner", "none", 35), ("textcat", "elmo", 40),
                  ("textcat", "none", 25)]
    return {
        "tests": [("tests", ["tests", *common], 45)],
        "parity": [("parity", ["parity", *common], 30)],
        "inference": [("inference", ["inference", *common], 45)],
        "embed": [("embed", ["embed", *common], 35)],
        "spacy": [(f"spacy/{task}-{elmo}", ["spacy", task, elmo, *common], limit) for task, elmo, limit in spacy_runs],
        "pretrain": [(f"pretrain/{recipe}", ["pretrain", recipe, *common], 40)
                     for recipe in ("english_default_gpu", "english_small")],
    }


def headline(phase: str, result: dict) -> str:
    """The figures of a job that the summary table shows."""
    if result["status"] != "ok":
        return ""
    gpu = result.get("gpu")
    utilisation = f"; GPU busy {gpu['utilisation_mean']} % on average" if gpu else ""
    if phase == "tests":
        return f"{result['passed']} passed, {result['failures'] + result['errors']} failed, {result['skipped']} skipped"
    if phase == "parity":
        return "; ".join(f"{name} max abs {max(result[name]['max_abs_per_layer']):.2g}, min cosine "
                         f"{result[name]['min_row_cosine']:.5f}" for name in ("float32", "bf16", "fp16"))
    if phase == "inference":
        rates = ", ".join(f"{key} {value:,}" for key, value in result["words_per_second"].items())
        latency = ", ".join(f"{key} {value} ms" for key, value in result["latency_ms_24_words"].items())
        return f"words/s: {rates}; one sentence: {latency}"
    if phase == "embed":
        rates = ", ".join(f"{key} {value['words_per_second']:,}" for key, value in result["commands"].items())
        return (f"words/s (loading included): {rates}; bf16 max abs {result['bf16_max_abs']:.2g}, "
                f"{result['warnings_total']} warnings")
    if phase == "spacy":
        score = next(f"{key[4:]} {value}" for key, value in result.items() if key.startswith("dev_"))
        stages = "".join(
            f"; {kind} steps {result[key]['step']} ms, ELMo {result[key]['elmo'] + result[key]['elmo mixes']:.1f} "
            f"ms of it" for kind, key in (("biLM-reading", "ms_per_step_reading"), ("cached", "ms_per_step_cached"))
            if key in result)
        return (f"{result['steps_per_second']} steps/s, {result['training_words_per_second']:,} words/s, dev {score}, "
                f"{result['warnings_per_step']} warnings/step, pipeline {result['pipeline_words_per_second_dev']:,} "
                f"words/s{stages}{utilisation}")
    return (f"{result['tokens_per_second']:,} tokens/s ({result['mixed_precision']}, batches of "
            f"{result['batch_tokens']:,}, {result['num_workers']} workers), resume "
            f"{'ok' if result['resume_ok'] else 'FAILED'}, {result['warnings_total']} warnings{utilisation}")


def write_report(report: dict, out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    lines = [f"# gpu_check: {report['device']}", "", f"{report['started']}, {report['sizes']} sizes, "
             f"{report['wall_seconds']:.0f} s in all; {report['versions']}", "",
             "| job | status | s | figures |", "|---|---|---|---|"]
    for phase, results in report["phases"].items():
        lines += [f"| {r['job']} | {r['status']} | {r['wall_seconds']} | {headline(phase, r)} |" for r in results]
    lines.append("")
    for phase, results in report["phases"].items():
        lines += [f"## {phase}", ""]
        for result in results:
            lines.append(f"- **{result['job']}**: {result['status']}, {result['wall_seconds']} s")
            lines += [f"  - {key}: {json.dumps(value)}" for key, value in result.items()
                      if key not in ("job", "status", "wall_seconds")]
        lines.append("")
    (out / "gpu_check.md").write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="half the spaCy and pretraining steps")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check"))
    parser.add_argument("--phases", default="tests,parity,inference,embed,spacy,pretrain",
                        help="phases, or single jobs by name (e.g. spacy/ner-elmo,pretrain/english_small)")
    parser.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    import torch

    from hf_elmo.kernels import cpu_name

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    sizes = CPU_TOY if device == "cpu" else GPU_QUICK if args.quick else GPU
    args.out.mkdir(parents=True, exist_ok=True)
    # The jobs' data, pipelines and outputs (GBs on a GPU) stay out of --out, which holds the report alone.
    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    log = args.out / "gpu_check.log"
    log.write_text("", encoding="utf-8")
    cpu = f"CPU ({cpu_name()}, {os.cpu_count()} cores)"
    name = torch.cuda.get_device_name(0) if device == "cuda" else cpu
    report = {"device": name, "sizes": "toy (CPU)" if sizes.toy else "quick" if args.quick else "full",
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "versions": versions(), "phases": {}}
    start = time.perf_counter()
    selected = args.phases.split(",")
    try:
        for phase, phase_jobs in jobs(sizes, device).items():
            phase_jobs = [job for job in phase_jobs if phase in selected or job[0] in selected]
            if not phase_jobs:
                continue
            report["phases"][phase] = []
            for job_name, job_args, limit in phase_jobs:
                result = run_job(job_name, [*job_args, "--work", str(work)], limit, work, log)
                report["phases"][phase].append(result)
                print(f"{job_name}: {result['status']} ({result['wall_seconds']} s)", flush=True)
                report["wall_seconds"] = time.perf_counter() - start
                write_report(report, args.out)  # as it goes: a killed run leaves what it measured
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["wall_seconds"] = time.perf_counter() - start
    write_report(report, args.out)
    failed = [r["job"] for results in report["phases"].values() for r in results if r["status"] != "ok"]
    print(f"report: {args.out / 'gpu_check.md'}; " + (f"not ok: {', '.join(failed)}" if failed else "all jobs ok"))
    sys.exit(1 if failed else 0)


def versions() -> str:
    import spacy
    import thinc
    import torch
    import transformers

    cupy = "none"
    with contextlib.suppress(ImportError):
        import cupy as cupy_module

        cupy = cupy_module.__version__
    return (f"torch {torch.__version__}, transformers {transformers.__version__}, spaCy {spacy.__version__}, "
            f"thinc {thinc.__version__}, cupy {cupy}")


# -- the workers ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def counted_warnings(stage: Callable[[], str] = lambda: "") -> Iterator[Counter]:
    """Every warning shown while inside (each occurrence, not once per place), counted by `stage()` when shown,
    category and message."""
    counts: Counter = Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def count(message, category, filename, lineno, file=None, line=None) -> None:
            counts[f"{stage()}{category.__name__}: {str(message)[:120]} ({Path(filename).name}:{lineno})"] += 1
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = count
        try:
            yield counts
        finally:
            warnings.showwarning = shown


def conll_sentences(split: str, limit: int) -> list[list[str]]:
    """The first `limit` sentences of a CoNLL-2003 split, as words."""
    sentences, words = [], []
    for line in (CONLL / f"{split}.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append(line.split()[0])
        elif words:
            sentences.append(words)
            words = []
            if len(sentences) == limit:
                break
    return sentences


def peak_memory(device: str) -> dict:
    import torch

    if device != "cuda":
        return {}
    return {"torch_peak_memory_mib": round(torch.cuda.max_memory_allocated() / 2**20)}


def worker_tests(device: str, sizes: Sizes, work: Path) -> dict:
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "--junitxml",
               str(work / "cuda-tests.xml")]
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    print(process.stdout[-4000:], process.stderr[-2000:])
    import xml.etree.ElementTree as ElementTree

    suite = ElementTree.parse(work / "cuda-tests.xml").getroot().find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed_tests": failed, "exit_code": process.returncode}


def worker_parity(device: str, sizes: Sizes, work: Path) -> dict:
    import torch
    import torch.nn.functional as F

    from hf_elmo import DEFAULT_MODEL_NAME, ElmoInferenceCache, ElmoModel, load_model, load_tokenizer

    sentences = conll_sentences("valid", sizes.parity_sentences)
    tokenizer = load_tokenizer(DEFAULT_MODEL_NAME)
    model = load_model(DEFAULT_MODEL_NAME, ElmoModel).eval()
    batch = tokenizer.batch(sentences)
    with torch.inference_mode():
        reference = [layer.float() for layer in model(**batch).hidden_states]
        model.to(device)
        cache, on_device = ElmoInferenceCache(), batch.to(device)
        mask = batch.attention_mask.bool()
        result = {"sentences": len(sentences)}
        for name, dtype in (("float32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
            with counted_warnings() as caught, torch.autocast(device, dtype=dtype or torch.float32,
                                                              enabled=dtype is not None):
                layers = [layer.float().cpu() for layer in model(**on_device, inference_cache=cache).hidden_states]
            rows = [(a[mask], b[mask]) for a, b in zip(layers, reference)]
            result[name] = {
                "max_abs_per_layer": [float((a - b).abs().max()) for a, b in rows],
                "min_row_cosine": min(float(F.cosine_similarity(a, b, dim=-1).min()) for a, b in rows),
                "warnings": dict(caught)}
    result["compared_with"] = "the CPU in float32 (on a CPU: the same computation, so float32 gives 0)"
    return result


def run_batches(model, batches: list, device: str, autocast, cache) -> None:
    """The biLM over `batches` (each copied to the device as it goes), waiting for the device to finish."""
    import torch

    with autocast:
        for batch in batches:
            model(**batch.to(device, non_blocking=True), inference_cache=cache)
    if device == "cuda":
        torch.cuda.synchronize()


def worker_inference(device: str, sizes: Sizes, work: Path) -> dict:
    import torch

    from hf_elmo import DEFAULT_MODEL_NAME, ElmoInferenceCache, ElmoModel, load_model, load_tokenizer

    sentences = sorted(conll_sentences("valid", sizes.inference_sentences), key=len)
    words = sum(map(len, sentences))
    tokenizer = load_tokenizer(DEFAULT_MODEL_NAME)
    model = load_model(DEFAULT_MODEL_NAME, ElmoModel).eval().to(device)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    single = next((s for s in sentences if len(s) >= 24), sentences[-1])[:24]
    dtypes = [("float32", None), ("bf16", torch.bfloat16)] + ([("fp16", torch.float16)] if device == "cuda" else [])
    result = {"sentences": len(sentences), "words": words, "words_per_second": {}, "latency_ms_24_words": {}}
    with counted_warnings() as caught, torch.inference_mode():
        for name, dtype in dtypes:
            autocast = torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None)
            cache = ElmoInferenceCache(token_cache_size=0)  # every word through the char CNN: text never seen
            for batch_size in sizes.batch_sizes:
                batches = [tokenizer.batch(sentences[i : i + batch_size]).pin_memory() if device == "cuda" else
                           tokenizer.batch(sentences[i : i + batch_size]) for i in range(0, len(sentences), batch_size)]
                if batch_size == 1:  # batch 1: the first 200 sentences are enough
                    batches = batches[:200]

                run_batches(model, batches, device, autocast, cache)  # warm-up: the cache's weights, cuDNN's plans
                start = time.perf_counter()
                run_batches(model, batches, device, autocast, cache)
                seconds = time.perf_counter() - start
                counted = sum(sum(batch.word_counts) for batch in batches)
                result["words_per_second"][f"{name}, batch {batch_size}"] = round(counted / seconds)
            one = tokenizer.batch([single])
            timings = []
            for call in range(sizes.latency_calls + 5):
                start = time.perf_counter()
                with autocast:
                    model(**one.to(device, non_blocking=True), inference_cache=cache)
                synchronize()
                if call >= 5:
                    timings.append(time.perf_counter() - start)
            result["latency_ms_24_words"][name] = round(1e3 * statistics.median(timings), 2)
    result["warnings"] = dict(caught)
    return {**result, **peak_memory(device)}


def worker_embed(device: str, sizes: Sizes, work: Path) -> dict:
    """`elmo embed` (the CLI, in this process) of CoNLL-2003 dev sentences, one per line, into .npy and .hdf5, in
    float32 and with `--bf16`: seconds per command (the model's loading included), words/s, warnings, and the
    bf16 output's distance from float32's."""
    import numpy as np

    from hf_elmo.cli import app

    sentences = conll_sentences("valid", sizes.inference_sentences)
    source = work / "conll-dev.txt"
    source.write_text("".join(" ".join(words) + "\n" for words in sentences), encoding="utf-8")
    words = sum(map(len, sentences))
    result: dict = {"sentences": len(sentences), "words": words, "commands": {}}
    with counted_warnings() as caught:
        for precision in ("float32", "bf16"):
            for suffix in (".npy", ".hdf5"):
                output = work / f"embed-{precision}{suffix}"
                command = ["embed", "default", str(source), str(output), "--tokenized", "--layers", "all",
                           "--device", device, "--quiet", *(["--bf16"] if precision == "bf16" else [])]
                before = sum(caught.values())
                start = time.perf_counter()
                app(command, standalone_mode=False)
                seconds = time.perf_counter() - start
                result["commands"][f"{precision} {suffix}"] = {
                    "seconds": round(seconds, 2), "words_per_second": round(words / seconds),
                    "warnings": sum(caught.values()) - before, "bytes": output.stat().st_size}
    exact, low = np.load(work / "embed-float32.npy"), np.load(work / "embed-bf16.npy")
    rows = exact.reshape(-1, exact.shape[-1]), low.reshape(-1, low.shape[-1])
    cosine = (rows[0] * rows[1]).sum(-1) / (np.linalg.norm(rows[0], axis=-1) * np.linalg.norm(rows[1], axis=-1))
    return {**result, "shape": list(exact.shape), "finite": bool(np.isfinite(exact).all() and np.isfinite(low).all()),
            "bf16_max_abs": float(np.abs(exact - low).max()), "bf16_min_row_cosine": float(cosine.min()),
            "warnings": dict(caught), "warnings_total": sum(caught.values()), **peak_memory(device)}


def worker_spacy(task: str, elmo: str, device: str, sizes: Sizes, work: Path) -> dict:
    import spacy
    from bench_spacy_train import MAIN_SCORES, StageTimer, train_and_time
    from spacy.tokens import DocBin
    from thinc.api import require_gpu

    timer = StageTimer()  # host times: the steps run as in any training, never waiting for the device
    with counted_warnings(lambda: "steps | " if timer.steps else "set-up | ") as caught:
        pipeline, dev_path = train_and_time(
            task, elmo != "none", work, timer, steps=sizes.spacy_steps, gpu_id=0 if device == "cuda" else -1,
            mixed_precision=elmo == "elmo-mixed", batch_words=sizes.spacy_batch_words,
            train_docs=sizes.spacy_train_docs, dev_docs=sizes.spacy_dev_docs)
    in_steps = sum(n for key, n in caught.items() if key.startswith("steps"))
    last = timer.evaluations[-1]
    main_score = MAIN_SCORES[task]
    if device == "cuda":
        require_gpu(0)
    nlp = spacy.load(pipeline)
    texts = [doc.text for doc in DocBin().from_disk(dev_path).get_docs(nlp.vocab)]
    list(nlp.pipe(texts[:32]))  # warm-up
    start = time.perf_counter()
    n_words = sum(len(doc) for doc in nlp.pipe(texts, batch_size=128))
    pipe_seconds = time.perf_counter() - start
    return {"steps": last["step"], **timer.summary(warm_up=1 if sizes.toy else max(2, sizes.spacy_steps // 10)),
            f"dev_{main_score}": round(100 * last["other_scores"].get(main_score, 0.0), 2),
            "warnings_in_steps": in_steps, "warnings_per_step": round(in_steps / max(last["step"], 1), 3),
            "warnings": dict(caught), "pipeline_words_per_second_dev": round(n_words / pipe_seconds),
            **peak_memory(device)}


def worker_pretrain(recipe: str, device: str, sizes: Sizes, work: Path) -> dict:
    import yaml

    from hf_elmo.training.pretrain import main as pretrain

    settings = yaml.safe_load((REPO / "training" / f"{recipe}.yaml").read_text(encoding="utf-8"))
    architecture = TOY_ARCHITECTURE if sizes.toy else settings.get("model_config", {})
    output = work / f"pretrain-{recipe}"
    ptb = PTB / "ptb.train.txt"
    common = [
        "--train_files", str(ptb), "--word_tokenizer", "whitespace", "--output_dir", str(output),
        "--model_config", json.dumps(architecture), "--preset", settings.get("preset", "small"),
        "--num_sampled", str(min(settings.get("num_sampled", 0), 512 if sizes.toy else 8192)),
        "--optimizer", settings["optimizer"], "--learning_rate", str(settings["learning_rate"]),
        "--batch_tokens", str(256 if sizes.toy else settings["batch_tokens"]),
        "--num_workers", str(1 if sizes.toy else settings["num_workers"]), "--block_lines", "2000",
        "--max_words", "100", "--logging_steps", str(sizes.pretrain_logging_steps),
        "--save_steps", str(sizes.pretrain_steps), "--max_steps",
    ]
    if device == "cpu":
        common = ["--cpu", "--threads", "2", *common[:-1], "--mixed_precision", "no", common[-1]]
    else:
        common = [*common[:-1], "--mixed_precision", settings.get("mixed_precision", "bf16"), common[-1]]
    log = output / "training_log.jsonl"
    with counted_warnings() as caught:
        pretrain([*common, str(sizes.pretrain_steps)])
        first_run = [json.loads(line) for line in log.read_text().splitlines()]
        pretrain([*common, str(sizes.pretrain_steps + sizes.pretrain_resume_steps), "--resume"])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    speeds = [r["tokens_per_second"] for r in first_run if "tokens_per_second" in r]
    resumed = [r for r in records[len(first_run):] if "tokens_per_second" in r]
    return {"architecture": architecture, "batch_tokens": int(common[common.index("--batch_tokens") + 1]),
            "num_workers": int(common[common.index("--num_workers") + 1]),
            "mixed_precision": common[common.index("--mixed_precision") + 1],
            "tokens_per_second_per_window": [round(speed) for speed in speeds],
            "tokens_per_second": round(statistics.mean(speeds[1:] or speeds)) if speeds else None,
            "resumed_from_step": sizes.pretrain_steps, "steps_after_resume": [r["step"] for r in resumed],
            "resume_ok": bool(resumed) and resumed[-1]["step"] == sizes.pretrain_steps + sizes.pretrain_resume_steps
            and all(r["step"] > sizes.pretrain_steps for r in resumed),
            "warnings": dict(caught), "warnings_total": sum(caught.values()), **peak_memory(device)}


def worker(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpu_check.py --worker")
    parser.add_argument("phase")
    parser.add_argument("names", nargs="*")
    parser.add_argument("--device", required=True)
    parser.add_argument("--sizes", required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    sizes = Sizes(**{**json.loads(args.sizes), "batch_sizes": tuple(json.loads(args.sizes)["batch_sizes"])})
    phases = {"tests": worker_tests, "parity": worker_parity, "inference": worker_inference, "embed": worker_embed,
              "spacy": worker_spacy, "pretrain": worker_pretrain}
    result = phases[args.phase](*args.names, device=args.device, sizes=sizes, work=args.work)
    args.result.write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
