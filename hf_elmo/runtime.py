"""The host the biLM runs on, and the policy its callers (the CLI, the embedder, spaCy, training) share about it.

- CPU facts: `cpu_name`, `intel_cpu`, `native_bf16_cpu`, `onednn_available` (read once, from /proc/cpuinfo and
  torch's build).
- Threads: `default_threads` (the cores this process may use that nobody else is using) and `set_threads`.
- oneDNN's kernel caches: `bound_onednn_caches`, so long runs over ever new batch shapes keep flat memory.
- Precision: `reduced_precision` / `mixed_precision`, the one autocast dtype of inference on each device.
- Memory: `halve_on_out_of_memory` reruns a batch the GPU has no memory for in halves (the biLM's rows never depend
  on each other); one sentence that does not fit alone is `OutOfDeviceMemoryError`, one line that says what to do.

Part of the Hub remote code (the kernels ask it for the CPU's facts): it imports nothing but torch.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TypeVar

import torch

# Where Linux tells how many tasks run now, and the cgroup's CPU quota (v2, then v1).
PROC_LOADAVG = Path("/proc/loadavg")
CGROUP = Path("/sys/fs/cgroup")

# oneDNN compiles and keeps a kernel per matmul shape (1024 by default); batches of ever new lengths add shapes
# for hours, hundreds of MB in all. 64 keeps the memory of a long run flat at no measured speed cost.
ONEDNN_CACHE_CAPACITY = 64

Item = TypeVar("Item")
Result = TypeVar("Result")


# -- the CPU -----------------------------------------------------------------------------------------------------


def _cpuinfo_field(name: str) -> str:
    """The first value of `name` in /proc/cpuinfo ("" where it cannot be read, e.g. not on Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.split(":")[0].strip() == name), "")
    except OSError:
        return ""


def cpu_name() -> str:
    """The CPU's model name as `lscpu` shows it (/proc/cpuinfo), else the platform's processor or machine."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


@cache
def native_bf16_cpu() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX, from the Linux CPU flags; False where
    they cannot be read). Elsewhere bf16 autocast is emulated: slower than float32, or barely faster."""
    flags = _cpuinfo_field("flags").split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


@cache
def intel_cpu() -> bool:
    """Whether this is an Intel CPU (vendor GenuineIntel in /proc/cpuinfo), where MKL runs its own fastest code."""
    return _cpuinfo_field("vendor_id") == "GenuineIntel"


@cache
def onednn_available() -> bool:
    """Whether this torch build computes float32 linears through oneDNN (checked on first use, not at import, so
    that oneDNN's settings from the environment can still be made before)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.ops.mkldnn._reorder_linear_weight(torch.ones(3, 2))
        output = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), weight, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return torch.equal(output, torch.full((1, 3), 2.0))


def bound_onednn_caches(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Cap oneDNN's kernel caches (its primitive cache and PyTorch's oneDNN LRU) at `capacity` shapes for this
    process, unless `ONEDNN_PRIMITIVE_CACHE_CAPACITY` / `LRU_CACHE_CAPACITY` are set already. Both are read
    once, at the first oneDNN call of the process: call this before any."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(capacity))


# -- threads -----------------------------------------------------------------------------------------------------


def default_threads() -> int:
    """CPU threads for torch: the cores this process may use (its CPU affinity, its cgroup's CPU quota, at most
    torch's own default) that no other process is running on now, at least 1. More threads than free cores make
    torch's OpenMP threads spin waiting for each other (docs/performance.md measures it)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    usable = min(usable, torch.get_num_threads())
    quota = _cgroup_cpu_quota()
    if quota is not None:
        usable = min(usable, max(1, math.ceil(quota)))
    try:  # the fourth field: tasks running now / all tasks; this process is one of them
        running = int(PROC_LOADAVG.read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        running = 1
    return max(1, usable - max(0, running - 1))


def _cgroup_cpu_quota() -> float | None:
    """The CPUs this process's cgroup may use (v2 `cpu.max`, v1 `cpu.cfs_quota_us`); None without a quota."""
    try:
        quota, period = (CGROUP / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (CGROUP / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (CGROUP / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def set_threads(threads: int | None = None) -> None:
    """torch's CPU threads: `threads` when given, else OMP_NUM_THREADS's when set (torch read it), else
    `default_threads()`."""
    if threads is not None:
        torch.set_num_threads(threads)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(default_threads())


# -- precision ---------------------------------------------------------------------------------------------------


def reduced_precision(device: torch.device | str) -> torch.dtype:
    """The dtype of the biLM's opt-in reduced-precision inference on `device`: bf16 on a CPU (native with
    AVX512-BF16 or AMX, emulated elsewhere, which `ElmoKernels` warns about) and on GPUs that compute it (Ampere
    on), float16 on older GPUs."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16
    return torch.bfloat16


def mixed_precision(device: torch.device | str, enabled: bool = True) -> contextlib.AbstractContextManager:
    """`torch.autocast` on `device` in `reduced_precision(device)` when `enabled`, else nothing."""
    if not enabled:
        return contextlib.nullcontext()
    device = torch.device(device)
    return torch.autocast(device.type, dtype=reduced_precision(device))


# -- device memory -----------------------------------------------------------------------------------------------


class OutOfDeviceMemoryError(torch.cuda.OutOfMemoryError):
    """One sentence needs more memory than the device has, even alone."""


def halve_on_out_of_memory(
    items: Sequence[Item],
    run: Callable[[Sequence[Item]], Result],
    join: Callable[[list[Result]], Result],
    describe: Callable[[Item], str],
) -> Result:
    """`run(items)`; when the device runs out of memory, `join([run(first half), run(second half)])`, each half halved
    again as needed. `run` must give each item what it would give it in any batch (as the biLM does: every sentence
    starts from the zero state). One item that does not fit alone raises `OutOfDeviceMemoryError`, its message
    starting with `describe(item)`."""
    try:
        return run(items)
    except torch.cuda.OutOfMemoryError as error:
        if len(items) == 1:
            reason = str(error).split("\n", 1)[0].split(". ", 1)[0]
            raise OutOfDeviceMemoryError(
                f"{describe(items[0])} does not fit in the device's memory even alone ({reason}): embed long "
                "sentences as windows of fewer words (--max-sentence-words / max_sentence_words, or the spaCy span "
                "getter's max_length), run on a device with more memory, or on the CPU"
            ) from None
    # Here, out of the `except` block, the failed attempt's tensors are freed with its traceback.
    half = len(items) // 2
    return join([halve_on_out_of_memory(part, run, join, describe) for part in (items[:half], items[half:])])
