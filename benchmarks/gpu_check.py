"""One command that checks every GPU path of the project and measures it, in at most 7 minutes on an H100.

    python benchmarks/gpu_check.py [--quick] [--out DIR] [--device cuda|cpu] [--phases tests,parity,...]
    make gpu-check

Phases, each job a fresh process under its own time limit (one slow job cannot eat the others; on a GPU the limits
of the default run add up to at most 7 minutes, each at least 1.5 times the job's time measured or estimated; on a
CPU each is 4 times the job's time on a 2-core AVX2 machine, `--limit-scale` for a slower one):
- `tests`: the CUDA tests (`pytest -m cuda`, over the test files that mark any);
- `parity`: the default model's layers on the device against the CPU's in float32, and the drift of bf16 and fp16
  autocast from float32 (max abs difference and minimum row cosine per layer) on CoNLL-2003 dev sentences;
- `inference`: the default model over CoNLL-2003 dev sentences tokenized beforehand, words/s at batch 1 (sentences
  in their own order: a representative sample of lengths) / 32 / 256 in float32, bf16 and fp16, the median latency
  of one 24-word sentence, and a profile of batches of 256 in each precision;
- `embed`: `elmo embed --device cuda` of the same sentences into .npy and .hdf5, float32 and `--bf16`: seconds and
  words/s of each command (the model's loading included), and the bf16 output's drift;
- `spacy`: `spacy train` (`--gpu-id 0`) of the shipped NER config with ELMo and without (`init-config --elmo none`),
  and of the textcat config with and without ELMo, on the first training documents (so that the frozen biLM's cache
  serves the later steps): steps/s (evaluation left out), training words/s, the host ms per step of each stage
  (`bench_spacy_train.py`), in steps where the biLM read Docs and in steps its cache served, the dev score, and the
  trained pipeline's `nlp.pipe` words/s on dev (`spacy/ner-elmo-mixed`, with `mixed_precision = true`, by name only);
- `pretrain`: `elmo pretrain` of the default and the small architecture with their GPU recipes' batch sizes, loader
  workers and bf16, on Penn Treebank: tokens/s (the log's, after the first window), the host ms in each step and
  between steps (the loader), which recurrence the biLSTM took, and a second command that resumes from the
  checkpoint and goes on.

Every job but `tests` and `parity` also profiles a few of its steps (`profiling.py`: the 10 operations with the most
host and device time, kernels and launches per step, the share of a step the device is busy), samples the GPU's
utilisation and memory, and counts every warning by origin (each distinct one once, with its count). Results are
written as they come: a job that times out keeps what it measured. `targets` compares the figures with the project's
GPU targets.

Without CUDA (or with `--device cpu`) the same phases run on the CPU at toy sizes (a CI test runs this form).
The report goes to `--out` (default `$OUT` if set, else `gpu_check/`): gpu_check.json, gpu_check.md, and
gpu_check.log with each job's output (at most 160 KB of it per job, its start and end).
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
PROJECT = tuple(str(REPO / package) for package in ("hf_elmo", "spacy_elmo", "recipes", "benchmarks"))
# A tiny biLM for the CPU form of the pretraining phase.
TOY_ARCHITECTURE = {"char_embedding_dim": 4, "filters": [[1, 8], [2, 8]], "n_highway": 1, "lstm_dim": 32,
                    "projection_dim": 16}
# The output of a job kept in gpu_check.log: its first and last KB.
LOG_HEAD, LOG_TAIL = 32_000, 128_000


@dataclass(frozen=True)
class Sizes:
    """How much each phase does: the GPU form (`quick`: about half) or the CPU toy form."""

    parity_sentences: int
    inference_sentences: int
    batch_sizes: tuple[int, ...]
    latency_sentences: int  # batch 1: this many sentences in their own order
    latency_calls: int  # the 24-word sentence
    spacy_steps: int  # NER; textcat takes two thirds of them
    spacy_batch_words: int | None  # None: the config's
    spacy_train_docs: int
    spacy_dev_docs: int
    pretrain_steps: int
    pretrain_resume_steps: int
    pretrain_logging_steps: int
    profile_steps: int
    toy: bool


GPU = Sizes(64, 3250, (1, 32, 256), 200, 50, 90, None, 360, 200, 30, 10, 10, 3, False)
GPU_QUICK = Sizes(32, 1024, (1, 32, 256), 100, 30, 45, None, 180, 100, 20, 10, 10, 2, False)
CPU_TOY = Sizes(4, 16, (1, 8), 4, 3, 6, 300, 24, 12, 4, 2, 2, 2, True)

# Per phase its jobs: (name, worker arguments, time limit in seconds on a GPU, on a CPU). On a GPU the default run's
# limits add up to 418 s, each about 1.5 times the job's time on the H100 of 2026-11-27 scaled to these sizes: tests
# 76 s there (7 of them failing early; ~82 passing), parity 12, inference 22 (+2 of profiles), embed 17, NER with ELMo
# 68 s for 300 steps of ~130 ms, the whole CoNLL training set converted and the whole dev set evaluated (~30 s at 90
# steps on 360 documents), pretraining 24-28 s for 80 steps (~20 at 40). On a CPU (toy sizes) each is 4 times the
# job's time on an idle 2-core AMD EPYC Zen 3 (AVX2, no native bf16: the slowest CPU measured) on 2026-11-28: tests
# 11 s, parity 7, inference 11, embed 6, NER 19 / 8 (with ELMo / without), textcat 10 / 7, pretraining 8 and 8, so
# that such a machine also busy with another job of the same size passes.
JOBS = {
    "tests": [("tests", ["tests"], 125, 45)],
    "parity": [("parity", ["parity"], 18, 30)],
    "inference": [("inference", ["inference"], 34, 45)],
    "embed": [("embed", ["embed"], 25, 25)],
    "spacy": [(f"spacy/{task}-{elmo}", ["spacy", task, elmo], gpu, cpu) for task, elmo, gpu, cpu in
              (("ner", "elmo", 46, 75), ("ner", "none", 38, 35), ("textcat", "elmo", 34, 40),
               ("textcat", "none", 28, 30))],
    "pretrain": [(f"pretrain/{recipe}", ["pretrain", recipe], 36, 35) for recipe in ("english_default_gpu",
                                                                                     "english_small")],
}
# Jobs run only when named in --phases.
EXTRA_JOBS = {"spacy": [("spacy/ner-elmo-mixed", ["spacy", "ner", "elmo-mixed"], 48, 80)]}


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


def kept_output(text: str) -> str:
    """A job's output as the log keeps it: all of it, or its first `LOG_HEAD` and last `LOG_TAIL` characters."""
    if len(text) <= LOG_HEAD + LOG_TAIL:
        return text
    cut = len(text) - LOG_HEAD - LOG_TAIL
    return f"{text[:LOG_HEAD]}\n[... {cut:,} characters left out ...]\n{text[-LOG_TAIL:]}"


def worker_command(args: list[str]) -> list[str]:
    """This script run as the worker `args`."""
    return [sys.executable, str(Path(__file__).resolve()), "--worker", *args]


def run_job(name: str, command: list[str], limit: float, work: Path, log: Path) -> dict:
    """`command --result FILE` in a fresh process, killed after `limit` seconds; the JSON it wrote to FILE (before a
    time-out, too) with the wall time, the limit and the GPU samples; its output, cut to size, into `log`."""
    stem = name.replace("/", "-")
    result_file, output_file = work / f"{stem}.json", work / f"{stem}.out"
    command = [*command, "--result", str(result_file)]
    start = time.perf_counter()
    with output_file.open("w", encoding="utf-8") as out, GpuSampler() as sampler:
        try:
            process = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=limit,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", "ANSI_COLORS_DISABLED": "1",
                                          "TQDM_DISABLE": "1"})
            status = "ok" if process.returncode == 0 else f"failed (exit {process.returncode})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {limit:.0f} s"
    seconds = time.perf_counter() - start
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n===== {name}: {' '.join(command[1:])} (limit {limit:.0f} s): {status}, {seconds:.1f} s\n")
        out.write(kept_output(output_file.read_text(encoding="utf-8", errors="replace")))
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    if status == "ok" and not result.pop("finished", False):
        status = "failed (no result)"
    if status == "ok" and result.get("failures", 0) + result.get("errors", 0):  # the tests job's
        status = f"failed ({result['failures'] + result['errors']} of the tests)"
    result.pop("finished", None)
    return {"job": name, "status": status, "wall_seconds": round(seconds, 1), "limit_seconds": limit,
            "limit_ratio": round(limit / seconds, 2), "gpu": sampler.summary(), **result}


def select_jobs(selected: list[str]) -> dict[str, list[tuple[str, list[str], float, float]]]:
    """The jobs of the phases named in `selected`, and the single jobs it names."""
    chosen = {}
    for phase, phase_jobs in JOBS.items():
        jobs = [job for job in [*phase_jobs, *EXTRA_JOBS.get(phase, [])]
                if job[0] in selected or (phase in selected and job in phase_jobs)]
        if jobs:
            chosen[phase] = jobs
    return chosen


def headline(phase: str, result: dict) -> str:
    """The figures of a job that the summary table shows."""
    if "error" in result:
        return result["error"]
    gpu = result.get("gpu")
    busy = result.get("profile", {}).get("device_busy_share")
    utilisation = (f"; GPU busy {gpu['utilisation_mean']} % (NVML)" if gpu else "") + (
        f", {100 * busy:.0f} % of the profiled steps" if busy is not None else "")
    if phase == "tests":
        return (f"{result.get('passed')} passed, {result.get('failures', 0) + result.get('errors', 0)} failed, "
                f"{result.get('skipped')} skipped" if "passed" in result else "")
    if phase == "parity":
        return "; ".join(f"{name} max abs {max(result[name]['max_abs_per_layer']):.2g}, min cosine "
                         f"{result[name]['min_row_cosine']:.5f}" for name in ("float32", "bf16", "fp16")
                         if name in result)
    if phase == "inference":
        rates = ", ".join(f"{key} {value:,}" for key, value in result.get("words_per_second", {}).items())
        latency = ", ".join(f"{key} {value} ms" for key, value in result.get("latency_ms_24_words", {}).items())
        return f"words/s: {rates}; one 24-word sentence: {latency}{utilisation}"
    if phase == "embed":
        rates = ", ".join(f"{key} {value['words_per_second']:,}" for key, value in result.get("commands", {}).items())
        return (f"words/s (loading included): {rates}; --bf16 ran in {result.get('bf16_runs_as')}, max abs "
                f"{result.get('bf16_max_abs', float('nan')):.2g}")
    if phase == "spacy":
        if "steps_per_second" not in result:
            return ""
        score = next((f"{key[4:]} {value}" for key, value in result.items() if key.startswith("dev_")), "")
        stages = "".join(
            f"; {kind} steps {result[key]['step']} ms, ELMo {result[key]['elmo'] + result[key]['elmo mixes']:.1f} "
            f"ms of it" for kind, key in (("biLM-reading", "ms_per_step_reading"), ("cached", "ms_per_step_cached"))
            if key in result)
        return (f"{result['steps_per_second']} steps/s, {result['training_words_per_second']:,} words/s, dev {score}, "
                f"pipeline {result.get('pipeline_words_per_second_dev', 0):,} words/s{stages}{utilisation}")
    if "tokens_per_second" not in result:
        return ""
    return (f"{result['tokens_per_second']:,} tokens/s ({result['mixed_precision']} autocast, batches of "
            f"{result['batch_tokens']:,}, {result['num_workers']} workers, {result['recurrence']}), host "
            f"{result['host_ms_per_step']} ms in a step and {result['host_ms_between_steps']} between, resume "
            f"{'ok' if result.get('resume_ok') else 'FAILED'}{utilisation}")


def targets(report: dict) -> list[dict]:
    """The project's GPU targets against the figures (on a GPU only)."""
    jobs = {r["job"]: r for results in report["phases"].values() for r in results}
    rates = jobs.get("inference", {}).get("words_per_second", {})
    latency = jobs.get("inference", {}).get("latency_ms_24_words", {})
    pretrain = jobs.get("pretrain/english_default_gpu", {})
    ner = {name: jobs.get(f"spacy/ner-{name}", {}).get("steps_per_second") for name in ("elmo", "none")}
    checks = [("default model >= 1,000,000 words/s at batch 256 (float32)", rates.get("float32, batch 256"),
               lambda v: v >= 1e6)]
    for size in (32, 256):
        for name in ("bf16", "fp16"):
            checks.append((f"{name} at least as fast as float32 at batch {size}",
                           rates.get(f"{name}, batch {size}") and rates.get(f"float32, batch {size}") and round(
                               rates[f"{name}, batch {size}"] / rates[f"float32, batch {size}"], 2),
                           lambda v: v >= 1.0))
    checks += [
        ("one 24-word sentence <= 3 ms (float32)", latency.get("float32"), lambda v: v <= 3.0),
        ("pretraining the default architecture >= 500,000 tokens/s", pretrain.get("tokens_per_second"),
         lambda v: v >= 5e5),
        ("pretraining: the device busy >= 60 % of a step (profile)",
         pretrain.get("profile", {}).get("device_busy_share"), lambda v: v >= 0.6),
        ("spaCy NER with ELMo within 20 % of the time per step without ELMo",
         ner["elmo"] and ner["none"] and round(ner["none"] / ner["elmo"], 2), lambda v: v <= 1.2),
    ]
    return [{"target": name, "value": value, "met": None if not value else bool(test(value))}
            for name, value, test in checks]


def write_report(report: dict, out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    lines = [f"# gpu_check: {report['device']}", "", f"{report['started']}, {report['sizes']} sizes, "
             f"{report['wall_seconds']:.0f} s in all; {report['versions']}", "",
             "| job | status | s (limit) | figures |", "|---|---|---|---|"]
    for phase, results in report["phases"].items():
        lines += [f"| {r['job']} | {r['status']} | {r['wall_seconds']} ({r['limit_seconds']}) | {headline(phase, r)} |"
                  for r in results]
    if report.get("targets"):
        lines += ["", "| target | value | met |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['value']} | {'-' if t['met'] is None else 'yes' if t['met'] else 'NO'} |"
                  for t in report["targets"]]
    lines.append("")
    for phase, results in report["phases"].items():
        lines += [f"## {phase}", ""]
        for result in results:
            lines.append(f"- **{result['job']}**: {result['status']}, {result['wall_seconds']} s of a "
                         f"{result['limit_seconds']} s limit")
            lines += [f"  - {key}: {json.dumps(value)}" for key, value in result.items()
                      if key not in ("job", "status", "wall_seconds", "limit_seconds", "profile")]
            if "profile" in result:
                lines += profile_lines(result["profile"])
        lines.append("")
    (out / "gpu_check.md").write_text("\n".join(lines), encoding="utf-8")


def profile_lines(profiles: dict) -> list[str]:
    """A job's profiles (one, or several by name) as Markdown lines."""
    named = profiles if "ms_per_step" not in profiles else {"": profiles}
    lines = []
    for name, profile in named.items():
        figures = ", ".join(f"{key} {profile[key]}" for key in ("ms_per_step", "kernels_per_step", "launches_per_step",
                                                                 "device_busy_share", "aten_ops_per_step")
                            if key in profile)
        lines.append(f"  - profile{' ' + name if name else ''} ({profile['steps']} steps): {figures}")
        for kind in ("top_device", "top_host"):
            ops = "; ".join(f"{op['op']} {op['ms_per_step']} ms ({op['calls_per_step']}/step)"
                            for op in profile.get(kind, []))
            if ops:
                lines.append(f"    - {kind.replace('_', ' ')}: {ops}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="about half the sizes (steps, sentences)")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_check"))
    parser.add_argument("--phases", default=",".join(JOBS),
                        help="phases, or single jobs by name (e.g. spacy/ner-elmo,pretrain/english_small)")
    parser.add_argument("--limit-scale", type=float, default=1.0,
                        help="multiply every job's time limit (e.g. 2 on a slower card than an H100, or a CPU "
                        "slower than a 2-core AMD EPYC Zen 3)")
    parser.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)
    import torch

    from hf_elmo.runtime import cpu_name

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    sizes = CPU_TOY if device == "cpu" else GPU_QUICK if args.quick else GPU
    args.out.mkdir(parents=True, exist_ok=True)
    # The jobs' data, pipelines, outputs (GBs on a GPU) and full logs stay out of --out, which holds the report alone.
    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    log = args.out / "gpu_check.log"
    log.write_text("", encoding="utf-8")
    cpu = f"CPU ({cpu_name()}, {os.cpu_count()} cores)"
    name = torch.cuda.get_device_name(0) if device == "cuda" else cpu
    report = {"device": name, "sizes": "toy (CPU)" if sizes.toy else "quick" if args.quick else "full",
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "versions": versions(), "phases": {}}
    common = ["--device", device, "--sizes", json.dumps(sizes.__dict__), "--work", str(work)]
    start = time.perf_counter()
    try:
        for phase, phase_jobs in select_jobs(args.phases.split(",")).items():
            report["phases"][phase] = []
            for job_name, job_args, gpu_limit, cpu_limit in phase_jobs:
                limit = round((cpu_limit if device == "cpu" else gpu_limit) * args.limit_scale)
                result = run_job(job_name, worker_command([*job_args, *common]), limit, work, log)
                report["phases"][phase].append(result)
                print(f"{job_name}: {result['status']} ({result['wall_seconds']} s of {limit})", flush=True)
                report["wall_seconds"] = time.perf_counter() - start
                write_report(report, args.out)  # as it goes: a killed run leaves what it measured
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["wall_seconds"] = time.perf_counter() - start
    report["targets"] = targets(report) if device == "cuda" else []
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


class Result(dict):
    """A worker's figures, written to its result file at every `update`: a job killed at its time limit keeps what
    it measured."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def update(self, *args, **figures) -> None:
        super().update(*args, **figures)
        self.path.write_text(json.dumps(self), encoding="utf-8")


@contextlib.contextmanager
def counted_warnings(stage: Callable[[], str] = lambda: "") -> Iterator[Counter]:
    """Every warning raised inside (each occurrence, none shown), counted by `stage()`, origin (the project's code or
    a third party's, by the file the warning names), category, message and place."""
    counts: Counter = Counter()
    with warnings.catch_warnings():
        warnings.simplefilter("always")

        def count(message, category, filename, lineno, file=None, line=None) -> None:
            origin = "project" if str(filename).startswith(PROJECT) else "third-party"
            counts[f"{stage()}{origin} | {category.__name__}: {str(message)[:160]} ({Path(filename).name}:"
                   f"{lineno})"] += 1

        shown = warnings.showwarning
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


def worker_tests(device: str, sizes: Sizes, work: Path, result: Result) -> None:
    # Only the files that mark a test `cuda` are collected (the whole suite's collection takes longer than they run).
    files = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").glob("test_*.py")
                   if "@pytest.mark.cuda" in path.read_text(encoding="utf-8"))
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "--durations=10",
               "--junitxml", str(work / "cuda-tests.xml"), *files]
    process = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    print(process.stdout[-12000:], process.stderr[-4000:])
    import xml.etree.ElementTree as ElementTree

    suite = ElementTree.parse(work / "cuda-tests.xml").getroot().find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    slowest = sorted(((float(case.get("time", 0)), case.get("name")) for case in suite.iter("testcase")),
                     reverse=True)[:5]
    result.update(**counts, passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
                  failed_tests=failed, slowest_seconds={name: round(t, 1) for t, name in slowest},
                  exit_code=process.returncode)


def worker_parity(device: str, sizes: Sizes, work: Path, result: Result) -> None:
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
        result.update(sentences=len(sentences),
                      compared_with="the CPU in float32 (on a CPU: the same computation, so float32 gives 0)")
        for name, dtype in (("float32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
            with counted_warnings() as caught, torch.autocast(device, dtype=dtype or torch.float32,
                                                              enabled=dtype is not None):
                layers = [layer.float().cpu() for layer in model(**on_device, inference_cache=cache).hidden_states]
            rows = [(a[mask], b[mask]) for a, b in zip(layers, reference)]
            result.update({name: {
                "max_abs_per_layer": [float((a - b).abs().max()) for a, b in rows],
                "min_row_cosine": min(float(F.cosine_similarity(a, b, dim=-1).min()) for a, b in rows),
                "warnings": dict(caught)}})


def run_batches(model, batches: list, device: str, autocast, cache) -> None:
    """The biLM over `batches` (each copied to the device as it goes), waiting for the device to finish."""
    import torch

    with autocast:
        for batch in batches:
            model(**batch.to(device, non_blocking=True), inference_cache=cache)
    if device == "cuda":
        torch.cuda.synchronize()


def worker_inference(device: str, sizes: Sizes, work: Path, result: Result) -> None:
    import torch
    from profiling import StepProfiler

    from hf_elmo import DEFAULT_MODEL_NAME, ElmoInferenceCache, ElmoModel, load_model, load_tokenizer

    in_order = conll_sentences("valid", sizes.inference_sentences)
    sentences = sorted(in_order, key=len)
    # Batch 1 on every k-th sentence in the file's order: a representative sample of lengths.
    sample = in_order[:: max(1, len(in_order) // sizes.latency_sentences)][: sizes.latency_sentences]
    tokenizer = load_tokenizer(DEFAULT_MODEL_NAME)
    model = load_model(DEFAULT_MODEL_NAME, ElmoModel).eval().to(device)
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    single = next((s for s in sentences if len(s) >= 24), sentences[-1])[:24]
    dtypes = [("float32", None), ("bf16", torch.bfloat16)] + ([("fp16", torch.float16)] if device == "cuda" else [])
    result.update(sentences=len(sentences), words=sum(map(len, sentences)), batch_1_sample_sentences=len(sample),
                  batch_1_sample_mean_words=round(statistics.mean(map(len, sample)), 1), words_per_second={},
                  latency_ms_24_words={}, profile={})

    def prepared(groups: list[list[list[str]]]) -> list:
        return [tokenizer.batch(group).pin_memory() if device == "cuda" else tokenizer.batch(group)
                for group in groups]

    with counted_warnings() as caught, torch.inference_mode():
        for name, dtype in dtypes:
            autocast = torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None)
            cache = ElmoInferenceCache(token_cache_size=0)  # every word through the char CNN: text never seen
            for batch_size in sizes.batch_sizes:
                if batch_size == 1:
                    batches = prepared([[sentence] for sentence in sample])
                else:
                    batches = prepared([sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)])
                run_batches(model, batches, device, autocast, cache)  # warm-up: the cache's weights, cuDNN's plans
                start = time.perf_counter()
                run_batches(model, batches, device, autocast, cache)
                seconds = time.perf_counter() - start
                counted = sum(sum(batch.word_counts) for batch in batches)
                result["words_per_second"][f"{name}, batch {batch_size}"] = round(counted / seconds)
                if batch_size == max(sizes.batch_sizes):
                    profiler = StepProfiler(device)
                    profiler.start()
                    run_batches(model, batches[: sizes.profile_steps], device, autocast, cache)
                    result["profile"][f"{name}, batch {batch_size}"] = profiler.stop(sizes.profile_steps)
                result.update()
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
            result.update()
    result.update(warnings=dict(caught), **peak_memory(device))


def worker_embed(device: str, sizes: Sizes, work: Path, result: Result) -> None:
    """`elmo embed` (the CLI, in this process) of CoNLL-2003 dev sentences, one per line, into .npy and .hdf5, in
    float32 and with `--bf16`: seconds per command (the model's loading included), words/s, warnings, and the
    bf16 output's distance from float32's."""
    import numpy as np
    import torch

    from elmo_cli import app
    from hf_elmo.kernel_plan import reduced_precision

    sentences = conll_sentences("valid", sizes.inference_sentences)
    source = work / "conll-dev.txt"
    source.write_text("".join(" ".join(words) + "\n" for words in sentences), encoding="utf-8")
    words = sum(map(len, sentences))
    # What `--bf16` runs in here: float32 on a CPU without native bf16 (the CLI says so in one line).
    result.update(sentences=len(sentences), words=words, commands={},
                  bf16_runs_as=str(reduced_precision(device) or torch.float32).removeprefix("torch."))
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
                result.update()
    exact, low = np.load(work / "embed-float32.npy"), np.load(work / "embed-bf16.npy")
    rows = exact.reshape(-1, exact.shape[-1]), low.reshape(-1, low.shape[-1])
    cosine = (rows[0] * rows[1]).sum(-1) / (np.linalg.norm(rows[0], axis=-1) * np.linalg.norm(rows[1], axis=-1))
    result.update(shape=list(exact.shape), finite=bool(np.isfinite(exact).all() and np.isfinite(low).all()),
                  bf16_max_abs=float(np.abs(exact - low).max()), bf16_min_row_cosine=float(cosine.min()),
                  warnings=dict(caught), warnings_total=sum(caught.values()), **peak_memory(device))


def worker_spacy(task: str, elmo: str, device: str, sizes: Sizes, work: Path, result: Result) -> None:
    import spacy
    from bench_spacy_train import MAIN_SCORES, StageTimer, train_and_time
    from spacy.tokens import DocBin
    from thinc.api import require_gpu

    steps = sizes.spacy_steps if task == "ner" else max(2 * sizes.spacy_steps // 3, 4)
    # The profiled window: a few steps before the last, which evaluates.
    timer = StageTimer(profile=(steps - sizes.profile_steps - 1, sizes.profile_steps), device=device)
    with counted_warnings(lambda: "steps | " if timer.steps else "set-up | ") as caught:
        pipeline, dev_path = train_and_time(
            task, elmo != "none", work, timer, steps=steps, gpu_id=0 if device == "cuda" else -1,
            mixed_precision=elmo == "elmo-mixed", batch_words=sizes.spacy_batch_words,
            train_docs=sizes.spacy_train_docs, dev_docs=sizes.spacy_dev_docs)
    in_steps = sum(n for key, n in caught.items() if key.startswith("steps"))
    last = timer.evaluations[-1]
    result.update(steps=last["step"], **timer.summary(warm_up=1 if sizes.toy else max(2, steps // 10)),
                  **{f"dev_{MAIN_SCORES[task]}": round(100 * last["other_scores"].get(MAIN_SCORES[task], 0.0), 2)},
                  warnings_in_steps=in_steps, warnings_per_step=round(in_steps / max(last["step"], 1), 3),
                  warnings=dict(caught), profile=timer.profile_summary)
    if device == "cuda":
        require_gpu(0)
    nlp = spacy.load(pipeline)
    texts = [doc.text for doc in DocBin().from_disk(dev_path).get_docs(nlp.vocab)]
    list(nlp.pipe(texts[:32]))  # warm-up
    start = time.perf_counter()
    n_words = sum(len(doc) for doc in nlp.pipe(texts, batch_size=128))
    result.update(pipeline_words_per_second_dev=round(n_words / (time.perf_counter() - start)), **peak_memory(device))


def worker_pretrain(recipe: str, device: str, sizes: Sizes, work: Path, result: Result) -> None:
    import yaml
    from profiling import StepProfiler

    from hf_elmo import ElmoConfig
    from hf_elmo.training import pretrain as pretraining

    settings = yaml.safe_load((REPO / "recipes" / f"{recipe}.yaml").read_text(encoding="utf-8"))
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
        common = ["--cpu", *common[:-1], "--mixed_precision", "no", common[-1]]  # "no" autocast; threads: its default
    else:
        common = [*common[:-1], "--mixed_precision", settings.get("mixed_precision", "bf16"), common[-1]]
    result.update(architecture=architecture, batch_tokens=int(common[common.index("--batch_tokens") + 1]),
                  num_workers=int(common[common.index("--num_workers") + 1]),
                  mixed_precision=common[common.index("--mixed_precision") + 1])
    # Each step's host time and the time between steps (the loader's), and a profile of a few steps after warm-up.
    in_step, between, profiler, step = [], [], StepProfiler(device), pretraining.Pretraining._step
    first = max(2, sizes.pretrain_steps // 2)

    def timed_step(self, batch: dict) -> None:
        start = time.perf_counter()
        if in_step:
            between.append(start - timed_step.last)
        if len(in_step) == first:
            profiler.start()
        step(self, batch)
        if len(in_step) == first + sizes.profile_steps - 1:
            result.update(profile=profiler.stop(sizes.profile_steps))
        timed_step.last = time.perf_counter()
        in_step.append(timed_step.last - start)

    pretraining.Pretraining._step = timed_step
    log = output / "training_log.jsonl"
    with counted_warnings() as caught:
        pretraining.main([*common, str(sizes.pretrain_steps)])
        first_run = [json.loads(line) for line in log.read_text().splitlines()]
        speeds = [r["tokens_per_second"] for r in first_run if "tokens_per_second" in r]
        config = ElmoConfig.from_pretrained(output)
        clipped = config.cell_clip is not None or config.proj_clip is not None
        result.update(
            tokens_per_second_per_window=[round(speed) for speed in speeds],
            tokens_per_second=round(statistics.mean(speeds[1:] or speeds)) if speeds else None,
            host_ms_per_step=round(1e3 * statistics.median(in_step[1:] or in_step), 1),
            host_ms_between_steps=round(1e3 * statistics.median(between[1:] or between or [0.0]), 1),
            recurrence="step loop (cells or projections clipped: cuDNN's LSTM does not clip)" if clipped and
            device == "cuda" else "cuDNN's LSTM" if device == "cuda" else "the CPU's step loop")
        pretraining.main([*common, str(sizes.pretrain_steps + sizes.pretrain_resume_steps), "--resume"])
    records = [json.loads(line) for line in log.read_text().splitlines()]
    resumed = [r for r in records[len(first_run):] if "tokens_per_second" in r]
    result.update(
        resumed_from_step=sizes.pretrain_steps, steps_after_resume=[r["step"] for r in resumed],
        resume_ok=bool(resumed) and resumed[-1]["step"] == sizes.pretrain_steps + sizes.pretrain_resume_steps
        and all(r["step"] > sizes.pretrain_steps for r in resumed),
        warnings=dict(caught), warnings_total=sum(caught.values()), **peak_memory(device))


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
    result = Result(args.result)
    phases[args.phase](*args.names, device=args.device, sizes=sizes, work=args.work, result=result)
    result.update(finished=True)


if __name__ == "__main__":
    main()
