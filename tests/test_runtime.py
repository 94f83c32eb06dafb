"""`hf_elmo.runtime`: the host facts and the policy the CLI, the embedder, spaCy and training share (threads, CPU
features, precision)."""

import os
import platform
import re
import warnings
from pathlib import Path

import pytest
import torch
from host_cpus import forget_capabilities, real_bf16_packing

from hf_elmo import kernel_plan, runtime


def test_default_threads_are_the_free_cores_this_process_may_use(tmp_path, monkeypatch):
    """More torch threads than free cores collapse under load (OpenMP threads spin waiting for a descheduled one)."""
    from hf_elmo import runtime

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    loadavg = tmp_path / "loadavg"
    monkeypatch.setattr(runtime, "PROC_LOADAVG", loadavg)
    monkeypatch.setattr(runtime, "CGROUP", tmp_path / "cgroup")
    for running, expected in (("1/300", 8), ("3/300", 6), ("12/300", 1)):  # this process is one of the running
        loadavg.write_text(f"0.5 0.4 0.3 {running} 4242\n")
        assert runtime.default_threads() == expected
    loadavg.write_text("0.5 0.4 0.3 1/300 4242\n")
    (tmp_path / "cgroup").mkdir()
    (tmp_path / "cgroup" / "cpu.max").write_text("250000 100000\n")  # a quota of 2.5 CPUs
    assert runtime.default_threads() == 3
    (tmp_path / "cgroup" / "cpu.max").write_text("max 100000\n")
    assert runtime.default_threads() == 8
    monkeypatch.setattr(runtime, "PROC_LOADAVG", tmp_path / "missing")  # not Linux: the usable cores
    assert runtime.default_threads() == 8


def test_set_threads_takes_the_argument_else_omp_num_threads_else_the_free_cores(monkeypatch):
    monkeypatch.setattr(runtime, "default_threads", lambda: 1)
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        runtime.set_threads()
        assert torch.get_num_threads() == 1
        runtime.set_threads(2)
        assert torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torch read it at start: left alone
        runtime.set_threads()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_cpu_name_is_lscpus_model_name_else_the_platforms(monkeypatch):
    """What the benchmarks print as the machine: /proc/cpuinfo's model name (platform.processor() is empty on
    Linux), else the platform's."""
    monkeypatch.setattr(runtime, "_cpuinfo_field", lambda name: "AMD EPYC 9R45" if name == "model name" else "")
    assert runtime.cpu_name() == "AMD EPYC 9R45"
    monkeypatch.setattr(runtime, "_cpuinfo_field", lambda name: "")
    assert runtime.cpu_name() == (platform.processor() or platform.machine()) != ""


def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch, pretend_cpu):
    for flags, native in (("fpu avx2 avx512f", False), ("avx512f avx512_bf16", True), ("amx_bf16 amx_tile", True),
                          ("", False)):
        monkeypatch.setattr(runtime, "_cpuinfo_field", lambda name, f=flags: f if name == "flags" else "")
        forget_capabilities()
        assert runtime.native_bf16_cpu() is native
    for cpu, native in (("avx2", False), ("avx512", False), ("avx512_bf16", True), ("amx", True)):
        pretend_cpu(cpu)
        assert runtime.native_bf16_cpu() is native


def test_bf16_weight_packing_is_asked_of_torch_not_assumed_from_the_flags(monkeypatch, pretend_cpu):
    """oneDNN packs bf16 weights where torch says so (AVX-512 BW/VL/DQ or AVX-NE-CONVERT), which is neither native
    bf16 (AVX-512 without AVX512-BF16 packs it) nor implied by the flags; without oneDNN's linear ops, never."""
    for cpu, packs in (("avx2", False), ("avx512", True), ("avx512_bf16", True), ("amx", True)):
        pretend_cpu(cpu)
        assert runtime.bf16_weight_packing() is packs
    pretend_cpu("avx512")
    assert runtime.bf16_weight_packing() and not runtime.native_bf16_cpu()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    forget_capabilities()
    assert not runtime.onednn_available() and not runtime.bf16_weight_packing()
    monkeypatch.delattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported")  # a torch without the question
    monkeypatch.undo()
    forget_capabilities()
    assert runtime.bf16_weight_packing() is real_bf16_packing()


@pytest.mark.parametrize("bf16_gpu", [True, False])
@pytest.mark.parametrize("cpu", ["avx2", "avx512", "avx512_bf16", "amx"])
def test_reduced_precision_is_bf16_where_it_is_native_float16_on_older_gpus_else_float32(
    monkeypatch, pretend_cpu, cpu, bf16_gpu
):
    """One choice for every caller: `elmo embed --bf16`, `ElmoEmbedder(bf16=True)` and the spaCy component's
    `mixed_precision` predictions. On a CPU without native bf16 (emulated bf16 is several times slower than float32
    there: docs/performance.md) float32, with one `HostWarning` naming the caller's line."""
    pretend_cpu(cpu)
    native = cpu in ("avx512_bf16", "amx")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16_gpu)
    assert kernel_plan.reduced_precision("cpu") == (torch.bfloat16 if native else None)
    assert kernel_plan.reduced_precision(torch.device("cuda", 1)) == (torch.bfloat16 if bf16_gpu else torch.float16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        precision = kernel_plan.Precision.of("cpu", bf16=True)
        assert precision.autocast_dtype == (torch.bfloat16 if native else None)
        for _ in range(2):  # decided once: using it warns no more
            with precision.autocast():
                assert torch.is_autocast_enabled("cpu") is native
                assert not native or torch.get_autocast_dtype("cpu") == torch.bfloat16
        with kernel_plan.Precision.of("cpu").autocast():
            assert not torch.is_autocast_enabled("cpu")
    assert [(w.category, w.filename) for w in caught] == ([] if native else [(runtime.HostWarning, __file__)])
    assert native or str(caught[0].message) == kernel_plan.BF16_AS_FLOAT32
    with pytest.raises(ValueError, match="bf16 and int8 are two ways"):
        kernel_plan.Precision.of("cpu", bf16=True, quantize="int8")
    assert kernel_plan.mode_problem(False, "int4") == 'quantize must be None or "int8", got \'int4\''
    assert kernel_plan.mode_problem(True, None) is None and kernel_plan.mode_problem(False, "int8") is None


def test_bound_onednn_caches_keeps_what_the_environment_says(monkeypatch):
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    runtime.bound_onednn_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
    assert os.environ["LRU_CACHE_CAPACITY"] == str(runtime.ONEDNN_CACHE_CAPACITY) == "64"


# What asks the host what it can do: its CPU flags or vendor, torch's answers about its CPU kernels, a GPU's bf16.
CAPABILITY_QUESTION = re.compile(r"/proc/cpuinfo|\bcpuinfo\b|\bavx\w*|\bamx_\w+|_is_mkldnn\w*|get_cpu_capability|"
                                 r"backends\.(?:mkldnn|mkl|cpu)\.|is_bf16_supported|platform\.processor|lscpu")


def test_every_capability_question_is_asked_in_runtime_alone():
    """So that the tests can force every answer (tests/host_cpus.py): a question asked elsewhere would follow the CPU
    running the tests, not the one they pretend."""
    repo = Path(__file__).resolve().parents[1]
    sources = [path for package in ("hf_elmo", "spacy_elmo", "recipes", "benchmarks")
               for path in (repo / package).rglob("*.py") if path != repo / "hf_elmo" / "runtime.py"]
    found = [f"{path.relative_to(repo)}:{number}: {line.strip()}" for path in sources
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if CAPABILITY_QUESTION.search(line)]
    assert found == []
    assert CAPABILITY_QUESTION.search("flags = open('/proc/cpuinfo').read()")
    assert CAPABILITY_QUESTION.search("torch.ops.mkldnn._is_mkldnn_bf16_supported()")
    assert CAPABILITY_QUESTION.search('"avx512_vnni" in flags') and not CAPABILITY_QUESTION.search("AVX512-BF16 or AMX")
