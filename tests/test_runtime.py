"""`hf_elmo.runtime`: the host facts and the policy the CLI, the embedder, spaCy and training share (threads, CPU
features, precision)."""

import os
import platform

import pytest
import torch

from hf_elmo import runtime


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


def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch):
    for flags, native in (("fpu avx2 avx512f", False), ("avx512f avx512_bf16", True), ("amx_bf16 amx_tile", True),
                          ("", False)):
        monkeypatch.setattr(runtime, "_cpuinfo_field", lambda name, f=flags: f if name == "flags" else "")
        runtime.native_bf16_cpu.cache_clear()
        assert runtime.native_bf16_cpu() is native
    runtime.native_bf16_cpu.cache_clear()


@pytest.mark.parametrize("bf16_gpu", [True, False])
def test_reduced_precision_is_bf16_on_cpus_and_gpus_that_compute_it_else_float16(monkeypatch, bf16_gpu):
    """One choice for every caller: `elmo embed --bf16`, `ElmoEmbedder(bf16=True)` and the spaCy component's
    `mixed_precision` predictions."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16_gpu)
    assert runtime.reduced_precision("cpu") == torch.bfloat16
    assert runtime.reduced_precision(torch.device("cuda", 1)) == (torch.bfloat16 if bf16_gpu else torch.float16)
    with runtime.mixed_precision("cpu"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    with runtime.mixed_precision("cpu", enabled=False):
        assert not torch.is_autocast_enabled("cpu")


def test_bound_onednn_caches_keeps_what_the_environment_says(monkeypatch):
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    runtime.bound_onednn_caches()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
    assert os.environ["LRU_CACHE_CAPACITY"] == str(runtime.ONEDNN_CACHE_CAPACITY) == "64"
