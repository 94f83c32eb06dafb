"""The benchmark scripts stay runnable (their figures are printed, not asserted): the smallest form of each."""

from __future__ import annotations

import json
import re
import sys

import pytest
from elmo_fixtures import server_port
from spacy_fixtures import REPO, run_python

from hf_elmo.runtime import native_bf16_cpu

pytestmark = pytest.mark.slow  # subprocesses and long runs: left out of the fast subset

TINY = '{"lstm_dim": 32, "projection_dim": 16, "filters": [[1, 8], [2, 8]], "char_embedding_dim": 4}'


@pytest.mark.parametrize("bf16", [False, True])
def test_bench_training_prints_tokens_per_second_and_the_fraction_of_peak_of_its_dtype(bf16):
    output = run_python(REPO / "benchmarks" / "bench_training.py", "--model-config", TINY, "--vocab-size", 200,
                        "--batch-tokens", 256, "--num-sampled", 64, "--steps", 2, "--warmup", 1, "--threads", 1,
                        "--peak-size", 128, *(["--bf16"] if bf16 else []))
    figures = json.loads(output.strip().splitlines()[-1])
    assert figures["dtype"] == ("bf16 autocast" if bf16 else "float32")
    assert figures["tokens_per_second"] > 0 and figures["step_gflops_per_second"] > 0
    peaks = figures["matmul_peak_gflops_per_second"]
    peak = peaks["bf16"] if bf16 else max(peaks["mkl"], peaks["onednn"])
    # Each figure is printed rounded (GFLOP/s to 0.1, the fraction to 0.001): the fraction lies within what the
    # printed figures allow, on a fast machine or a slow one.
    step = figures["step_gflops_per_second"]
    assert (step - 0.05) / (peak + 0.05) - 5e-4 <= figures["fraction_of_matmul_peak"] <= (
        (step + 0.05) / (peak - 0.05) + 5e-4)


@pytest.mark.parametrize("mode", ["bf16", "int8"])
def test_bench_inference_modes_print_their_speed_and_distance_beside_float32(mode):
    output = run_python(REPO / "benchmarks" / "bench_inference.py", "--presets", "small", "--sentences", 2,
                        "--length", 3, "--batch-size", 2, "--repeats", 1, "--latency-calls", 2, "--threads", 1,
                        "--embedder-sentences", 8, "--peak-size", 256, f"--{mode}")
    lines = output.strip().splitlines()
    header = next(line for line in lines if line.startswith("preset")).split()
    row = next(line for line in lines if line.startswith("small ")).split()
    assert header[6:] == [mode, "tok/s", "ratio", mode, "ms", "ratio", "|diff|", "f32", "min", "cos"]
    name, tokens, latency, cached, mode_tokens, ratio, mode_latency, latency_ratio, difference, cosine = row
    assert name == "small" and min(map(float, (tokens, latency, cached, mode_tokens, mode_latency))) > 0
    assert float(ratio) == pytest.approx(float(mode_tokens) / float(tokens), rel=0.01, abs=0.01)
    assert float(latency_ratio) == pytest.approx(float(latency) / float(mode_latency), rel=0.02, abs=0.01)
    assert 0 < float(difference) < 0.1 and 0.999 < float(cosine) <= 1.0
    # The float32 forward against the faster matmul ceiling, and the bound the recurrence's shape puts on it: each
    # fraction from the printed rates, within their rounding.
    [matmul] = [line for line in lines if line.startswith("float32 matmul ceiling, small (")]
    mkl, onednn = map(float, re.search(r": MKL (\d+), oneDNN (\d+) GFLOP/s", matmul).groups())
    reached = re.findall(r"(batch 2|ElmoEmbedder) (\d+) GFLOP/s = (\d+)% \(the recurrence's shape allows at most "
                         r"(\d+) = (\d+)%\)", matmul)
    assert [label for label, *_ in reached] == ["batch 2", "ElmoEmbedder"]
    for _, *figures in reached:
        rate, fraction, bound, bound_fraction = map(float, figures)
        assert 0 < rate and 0 < bound
        assert fraction / 100 == pytest.approx(rate / max(mkl, onednn), abs=0.01 + 0.5 / max(mkl, onednn))
        assert bound_fraction / 100 == pytest.approx(bound / max(mkl, onednn), abs=0.01 + 0.5 / max(mkl, onednn))
    ceilings = [line for line in lines if line.startswith("memory-bound ceiling")]
    if mode == "int8":
        # small: 2 layers x 2 directions x (recurrent 4096 x 128 + projection 128 x 1024) weights
        [ceiling] = ceilings
        assert "small: 10 MB float32 / 3 MB int8 of step weights per position, 22 positions" in ceiling  # 20 words
    else:
        assert ceilings == []


def test_bench_lstm_step_prints_the_weights_read_per_step_and_the_ceiling_they_imply():
    output = run_python(REPO / "benchmarks" / "bench_lstm_step.py", "--presets", "small", "--rows", "1,4",
                        "--repeats", 1, "--threads", 1, "--read-mib", 8, "--peak-size", 128)
    rows = [line.split() for line in output.strip().splitlines()[-4:]]
    # small: 2 directions x (recurrent 4096 x 128 + projection 128 x 1024) weights
    elements = 2 * (4 * 1024 * 128 + 128 * 1024)
    assert [(r[0], r[1], int(r[2])) for r in rows] == [("small", d, n) for d in ("float32", "bf16") for n in (1, 4)]
    # Each figure from the printed ones, within their rounding (half a printed unit, plus 1 % for the inputs').
    for _, dtype, n, step, matmuls, megabytes, read, gflops, ceiling in rows:
        assert float(megabytes) == pytest.approx(elements * (4 if dtype == "float32" else 2) / 1e6, abs=0.006)
        assert float(read) == pytest.approx(float(megabytes) / 1e3 / (float(matmuls) * 1e-6), rel=0.01, abs=0.06)
        assert float(gflops) == pytest.approx(2 * int(n) * elements / (float(matmuls) * 1e-6) / 1e9, rel=0.01,
                                              abs=0.06)
        assert float(ceiling) == pytest.approx(int(n) / (2 * float(step) * 1e-6), rel=0.01, abs=0.6)


def test_bench_latency_bound_prints_the_latency_with_and_without_the_gate_math():
    output = run_python(REPO / "benchmarks" / "bench_latency_bound.py", "--presets", "small", "--calls", 2,
                        "--threads", 1)
    header, row = output.strip().splitlines()[-2:]
    assert header.split() == ["preset", "as", "is", "no", "gate", "math"]
    name, as_is, as_is_25, bound, bound_25 = row.replace("(", " ").replace(")", " ").split()
    assert name == "small" and all(float(ms) > 0 for ms in (as_is, as_is_25, bound, bound_25))


def test_bench_cli_start_prints_each_answers_seconds_beside_the_import():
    output = run_python(REPO / "benchmarks" / "bench_cli_start.py", "--runs", 1)
    rows = output.strip().splitlines()[1:]
    assert rows[0].startswith("python -c 'import hf_elmo'") and len(rows) == 7
    assert all(float(row.split(" s")[0].split()[-1]) > 0 for row in rows)
    assert all("x faster than the import" in row for row in rows[1:])


def test_bench_tokenizer_prints_both_vocabularies_and_their_ratio():
    output = run_python(REPO / "benchmarks" / "bench_tokenizer.py", "--sentences", 20, "--length", 5, "--repeats", 1)
    lines = output.splitlines()
    assert lines[1].startswith("bytes") and lines[2].startswith("lexicon") and "words/s" in lines[2]
    assert float(lines[3].rpartition(" ")[2]) > 0


def test_bench_data_prints_the_tokens_per_second_of_each_worker_count():
    output = run_python(REPO / "benchmarks" / "bench_data.py", "--files", REPO.parent / "shared/data/ptb/ptb.valid.txt",
                        "--word-tokenizer", "whitespace", "--batch-tokens", 512, "--block-lines", 200, "--workers",
                        "0,1", "--batches", 3, "--vocab-size", 1000)
    figures = json.loads(output.strip().splitlines()[-1])
    assert [r["workers"] for r in figures["results"]] == [0, 1]
    assert all(r["tokens_per_second"] > 0 and r["per_worker"] == r["tokens_per_second"] for r in figures["results"])


def test_bench_serve_prints_each_figure_beside_its_reference(tiny_model_dir):
    output = run_python(REPO / "benchmarks" / "bench_serve.py", "--model", tiny_model_dir, "--sentences", 40,
                        "--clients", 4, "--calls", 3, "--rate-seconds", 1, "--memory-requests", 40, "--threads", 1,
                        "--port", server_port())
    lines = output.strip().splitlines()
    assert lines[0].startswith("machine: ") and lines[1].startswith("elmo embed: ")
    # At toy sizes elmo embed's time may not stand out of its start-up's noise: its rate then reads n/a.
    served = re.search(r"elmo serve, 4 clients: [\d,]+ words/s .* x([\d.]+|n/a) elmo embed's .* max abs diff "
                       r"([\d.e+-]+)", lines[2])
    assert served and float(served[2]) < 1e-5, lines[2]
    ceiling = re.search(r"; ([\d.]+) sentences an advance\. The library's stream of 4 .*: ([\d,]+) words/s .* the "
                        r"server reaches x([\d.]+) of it$", lines[2])
    assert ceiling and 1 <= float(ceiling[1]) <= 4 and float(ceiling[3]) > 0, lines[2]
    assert re.search(r"one 20-word request: elmo serve [\d.]+ ms, the library's embed_sentence [\d.]+ ms", lines[3])
    assert lines[4].startswith("memory: RSS ") and "40 requests" in lines[4]
    assert [line.split(" the sustainable rate")[0] for line in lines[5:]] == ["x0.5", "x2.0"]
    assert all(re.search(r"p50 [\d.]+ ms, p99 [\d.]+ ms over [\d,]+ answered; [\d,]+ refused", line)
               for line in lines[5:])


def test_bench_spacy_train_times_the_stages_of_each_step_with_and_without_elmo(tmp_path):
    """Six short CoNLL documents in batches of 400 words: the first epoch's steps read Docs with the biLM, the later
    ones take its cache; without ELMo there is no biLM stage and the same batches."""
    output = run_python(REPO / "benchmarks" / "bench_spacy_train.py", "--steps", 12, "--train-docs", 6,
                        "--batch-words", 400, "--warm-up", 1, "--work", tmp_path)
    figures = json.loads(output.strip().splitlines()[-1])
    elmo, none = figures["elmo"], figures["none"]
    reading, cached = elmo["ms_per_step_reading"], elmo["ms_per_step_cached"]
    assert reading["steps"] + cached["steps"] == elmo["timed_steps"] == 11 and reading["steps"] >= 2
    assert reading["elmo"] > 10 * cached["elmo"] and reading["elmo mixes"] > 0 and cached["elmo mixes"] > 0
    parts = {key: ms for key, ms in reading.items() if key.startswith("elmo: ")}  # where the biLM ran, its parts
    assert set(parts) == {"elmo: doc_sentences", "elmo: sentence_batches", "elmo: each_batch", "elmo: char ids",
                          "elmo: strip_boundaries", "elmo: to_docs"} and not any(k.startswith("elmo: ") for k in cached)
    assert 0 < parts["elmo: char ids"] < parts["elmo: each_batch"] < reading["elmo"]  # nested, step by step
    assert "ms_per_step_reading" not in none and none["ms_per_step_cached"]["steps"] == 11
    assert none["ms_per_step_cached"]["elmo"] == none["ms_per_step_cached"]["elmo mixes"] == 0
    for stages in (reading, cached, none["ms_per_step_cached"]):
        assert stages["task features"] > 0 and stages["rest"] > 0  # rest: the step less the stages in it
    assert elmo["words_per_step"] == none["words_per_step"] > 0  # the same batches both ways
    assert figures["step_ratio_cached"] > 0 and figures["step_ratio_reading"] > figures["step_ratio_cached"]


def test_gpu_check_runs_every_phase_in_its_cpu_form_and_writes_its_reports(tmp_path):
    """`benchmarks/gpu_check.py` without CUDA: the same jobs at toy sizes, each in its own process, all ok, with the
    figures the GPU report gives, profiles included (one job of each kind: the spaCy jobs differ only in their
    configs, which test_spacy_configs.py builds for every placement and test_spacy_train_command.py trains; the
    pretraining jobs only in their recipes, which test_training.py parses)."""
    phases = "tests,parity,inference,embed,spacy/ner-elmo-mixed,spacy/textcat-elmo,pretrain/english_default_gpu"
    # Limits 3 times the CPU form's own: this checks that every job works, on any machine (speed is not asserted).
    output = run_python(REPO / "benchmarks" / "gpu_check.py", "--device", "cpu", "--out", tmp_path, "--phases",
                        phases, "--limit-scale", 3, timeout=900)
    assert "all jobs ok" in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    assert (tmp_path / "gpu_check.log").stat().st_size < 2**20
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    jobs = {result["job"]: result for results in report["phases"].values() for result in results}
    assert list(report["phases"]) == ["tests", "parity", "inference", "embed", "spacy", "pretrain"]
    assert all(job["status"] == "ok" for job in jobs.values())
    assert jobs["tests"]["failures"] == jobs["tests"]["errors"] == 0 and jobs["tests"]["skipped"] >= 9
    parity = jobs["parity"]
    assert max(parity["float32"]["max_abs_per_layer"]) == 0.0  # the CPU against itself
    assert 0 < max(parity["bf16"]["max_abs_per_layer"]) < 0.2 and parity["bf16"]["min_row_cosine"] > 0.999
    inference = jobs["inference"]
    rates = inference["words_per_second"]
    assert set(rates) == {"float32, batch 1", "float32, batch 8", "bf16, batch 1", "bf16, batch 8"}
    assert all(rate > 0 for rate in rates.values()) and set(inference["latency_ms_24_words"]) == {"float32", "bf16"}
    assert inference["batch_1_sample_sentences"] == 4 and inference["batch_1_sample_mean_words"] > 1
    for profile in inference["profile"].values():  # batches of 8, in each precision
        assert profile["steps"] == 2 and profile["aten_ops_per_step"] > 100 and len(profile["top_host"]) == 10
    assert sorted(jobs) == sorted(["tests", "parity", "inference", "embed", "spacy/ner-elmo-mixed",
                                   "spacy/textcat-elmo", "pretrain/english_default_gpu"])
    embed = jobs["embed"]  # `elmo embed` of the 16 sentences, 440 words: (words, layers, width), no warning (the
    assert embed["shape"] == [embed["words"], 3, 512] and embed["finite"]  # CLI's own line is not a Python warning)
    assert embed["warnings_total"] == 0
    assert sorted(embed["commands"]) == ["bf16 .hdf5", "bf16 .npy", "float32 .hdf5", "float32 .npy"]
    assert all(command["words_per_second"] > 0 and command["bytes"] > 4 * 3 * 512 * embed["words"]
               for command in embed["commands"].values())
    # --bf16 runs bf16 where this CPU has it natively, else float32 (then the same vectors).
    assert embed["bf16_runs_as"] == ("bfloat16" if native_bf16_cpu() else "float32")
    if native_bf16_cpu():
        assert 0 < embed["bf16_max_abs"] < 0.2 and embed["bf16_min_row_cosine"] > 0.999
    else:
        assert embed["bf16_max_abs"] == 0
    for name, steps in (("ner-elmo-mixed", 6), ("textcat-elmo", 4)):
        run = jobs[f"spacy/{name}"]
        assert run["steps"] == steps and run["steps_per_second"] > 0
        # mixed_precision on a CPU without native bf16: float32, and one warning that says so when the biLM is set
        # (decided once, not at each prediction); no warning in the steps.
        assert not [key for key in run["warnings"] if key.startswith("steps")]
        bf16 = {key: n for key, n in run["warnings"].items() if "HostWarning: bf16 was asked for" in key}
        assert list(bf16.values()) == ([] if native_bf16_cpu() or name != "ner-elmo-mixed" else [1])
        assert all(key.startswith("set-up | project | ") for key in bf16)
        assert run["pipeline_words_per_second_dev"] > 0 and any(key.startswith("dev_") for key in run)
        timed = [run[key] for key in ("ms_per_step_reading", "ms_per_step_cached") if key in run]
        assert sum(stages["steps"] for stages in timed) == run["timed_steps"] >= 2
        assert run["ms_per_step_reading"]["elmo"] > 0
        assert all(stages["elmo mixes"] > 0 and stages["rest"] > 0 for stages in timed)
        assert run["profile"]["steps"] == 2 and run["profile"]["ms_per_step"] > 0
    run = jobs["pretrain/english_default_gpu"]
    assert run["resume_ok"] and run["steps_after_resume"] == [6] and run["tokens_per_second"] > 0
    assert run["warnings_total"] == 0 and run["host_ms_per_step"] > 0 and run["host_ms_between_steps"] >= 0
    assert run["recurrence"] == "the CPU's step loop" and run["profile"]["steps"] == 2
    summary = (tmp_path / "gpu_check.md").read_text()
    assert "| spacy/ner-elmo-mixed | ok |" in summary and "resume ok" in summary and "- profile (2 steps)" in summary


def test_gpu_check_keeps_what_a_job_measured_before_its_time_limit(tmp_path):
    """A job killed at its limit: reported as timed out, with the figures it wrote before, and its output (cut to the
    log's size per job) in the log."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    script = ("import json, sys, time\nprint('x' * 400_000, flush=True)\n"
              "open(sys.argv[2], 'w').write(json.dumps({'words_per_second': {'float32, batch 1': 5}}))\n"
              "time.sleep(60)")
    log = tmp_path / "gpu_check.log"
    result = gpu_check.run_job("inference", [sys.executable, "-c", script], 3, tmp_path, log)
    assert result["status"] == "timed out after 3 s" and result["words_per_second"] == {"float32, batch 1": 5}
    assert 3 <= result["wall_seconds"] < 10 and "characters left out" in log.read_text()
    assert log.stat().st_size < gpu_check.LOG_HEAD + gpu_check.LOG_TAIL + 1000
