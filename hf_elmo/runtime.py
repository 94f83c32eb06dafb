"""The host the biLM runs on, and the policy its callers (the CLI, the embedder, spaCy, training) share about it.

- CPU facts, every capability question the code asks of the host, each a small function that tests force either way:
  `cpu_name`, `cpu_flags`, `intel_cpu` (MKL's own fastest code), `native_bf16_cpu` (bf16 matmuls in hardware),
  `onednn_available` (oneDNN's float32 linear ops in this torch build), `bf16_weight_packing` (oneDNN packs bf16
  weights on this CPU: asked of torch, never assumed from another fact), `int8_matmuls` (torch's int8 linear kernels,
  FBGEMM's, run fast on this CPU), `gpu_computes_bf16` (a GPU's bf16 in hardware, Ampere on). Read once, from
  /proc/cpuinfo and torch. What the biLM runs given them is decided in `kernel_plan.py`.
- Threads: `default_threads` (the cores this process may use that nobody else is using) and `set_threads`.
- oneDNN's kernel caches: `bound_onednn_caches`, so long runs over ever new batch shapes keep flat memory.
- Warnings about the host (`warn`, `HostWarning`), attributed to the user's line, not to a library's.
- Transfers: `host_index`, integers made on the host as a device index without a wait.
- Memory: `halve_on_out_of_memory` reruns a batch the GPU has no memory for in halves (the biLM's rows never depend
  on each other); one sentence that does not fit alone is `OutOfDeviceMemoryError`, one line that says what to do.

One of the Hub remote code's files (`hub.REMOTE_CODE`): the kernel plan asks it for the host's facts.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import warnings
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
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (/proc/cpuinfo: "avx2", "avx512f", "avx512_bf16", "amx_tile", …);
    empty where they cannot be read."""
    return frozenset(_cpuinfo_field("flags").split())


@cache
def native_bf16_cpu() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AVX512-BF16 or AMX, from the CPU flags; False where they
    cannot be read). Elsewhere bf16 is emulated: several times slower than float32 (docs/performance.md)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


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


@cache
def bf16_weight_packing() -> bool:
    """Whether oneDNN can pack bf16 weights on this CPU (its bf16 linear ops need AVX-512 BW/VL/DQ or AVX-NE-CONVERT;
    torch says so itself). A CPU may pack bf16 without computing it natively (AVX-512 without AVX512-BF16)."""
    try:
        return onednn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@cache
def int8_matmuls() -> bool:
    """Whether torch's dynamically quantized int8 linear (`quantized::linear_dynamic`, FBGEMM's kernels) runs fast
    here: an x86 CPU with AVX2 (FBGEMM needs it; without it the op falls back to reference code, slower than float32)
    and a torch build that has the ops and the x86/fbgemm quantized engine (asked of torch by one tiny call). The
    int8 mode runs float32 elsewhere."""
    if "avx2" not in cpu_flags() or not {"x86", "fbgemm"} & set(torch.backends.quantized.supported_engines):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a quantized tensor's creation is deprecated (see weight_forms.Int8Weight)
            weight = torch.quantize_per_channel(torch.ones(3, 2), torch.ones(3, dtype=torch.double),
                                                torch.zeros(3, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(weight, None)
        output = torch.ops.quantized.linear_dynamic(torch.ones(1, 2), packed, True)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return torch.allclose(output, torch.full((1, 3), 2.0), atol=0.05)


def gpu_computes_bf16() -> bool:
    """Whether the current GPU computes bf16 in hardware (Ampere on), not emulated."""
    return torch.cuda.is_bf16_supported(including_emulation=False)


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


def assigned_resources() -> tuple[float | None, int]:
    """The CPUs and GPUs a data engine gave this worker process: a Ray worker's assigned resources (its CPUs, and
    the GPUs Ray made visible to it); (None, 0) outside one."""
    ray = sys.modules.get("ray")  # only where Ray runs this process: it is imported there already
    if ray is None or not ray.is_initialized():
        return None, 0
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:  # the driver: nothing was assigned to it
        return None, 0
    resources = context.get_assigned_resources()
    return resources.get("CPU"), len(ray.get_gpu_ids())


def set_threads(threads: int | None = None) -> None:
    """torch's CPU threads: `threads` when given, else OMP_NUM_THREADS's when set (torch read it), else
    `default_threads()`."""
    if threads is not None:
        torch.set_num_threads(threads)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(default_threads())


# -- warnings ----------------------------------------------------------------------------------------------------


class HostWarning(UserWarning):
    """The host makes the biLM run otherwise than asked (float32 for bf16), or slower than it could."""


# Modules between a user's line and a warning about the host: this project (and its Hub remote code), and the
# libraries its entry points run inside.
_LIBRARY_MODULES = frozenset({"hf_elmo", "spacy_elmo", "transformers_modules", "transformers", "torch", "spacy",
                              "thinc", "contextlib", "typer", "click"})


def warn(message: str) -> None:
    """`warnings.warn(message, HostWarning)`, attributed to the innermost caller outside this project and the
    libraries it runs inside (e.g. the user's `embedder.embed_sentence(...)` line, not a transformers file)."""
    frame, stacklevel = sys._getframe(1), 2  # stacklevel 1 is this function
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in _LIBRARY_MODULES:
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(message, HostWarning, stacklevel=stacklevel)


# -- transfers ---------------------------------------------------------------------------------------------------


def host_index(values: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Integers made on the host (a sequence, or a CPU tensor) as an index on `device`. To a GPU from page-locked
    memory without waiting: a plain `torch.tensor(values, device=...)` is a copy the host waits for."""
    index = torch.as_tensor(values, dtype=torch.long)
    if device.type == "cpu":
        return index
    return (index.pin_memory() if device.type == "cuda" and torch.cuda.is_available() else index).to(
        device, non_blocking=True)


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
