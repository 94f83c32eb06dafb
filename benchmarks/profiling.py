"""A few steps of a job under torch.profiler, summarised: where a step's host and device time go.

`StepProfiler(device).start()` ... `.stop(steps)` gives, per step: its wall ms; the 10 operations that take the most
host time and (on a GPU) the most device time; the kernels the device ran and the launches the host made; and the
share of the step the device was busy (the union of its kernels' and copies' time over the wall time), so that a
step the host holds up shows as a device mostly idle. On a CPU: the host figures and the aten operations per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# The host calls that start work on a GPU, as CUPTI names them.
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
            "cudaMemcpyAsync", "cudaMemsetAsync")


class StepProfiler:
    """torch.profiler around the steps between `start()` and `stop(steps)`."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._profile: profile | None = None
        self._start = 0.0

    def start(self) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        self._profile = profile(activities=activities)
        self._profile.__enter__()
        self._start = time.perf_counter()

    def stop(self, steps: int) -> dict[str, Any]:
        if self.device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self._start
        self._profile.__exit__(None, None, None)
        return summarise(self._profile, max(steps, 1), seconds, self.device)


def _top(averages: list, attribute: str, steps: int) -> list[dict[str, Any]]:
    ranked = sorted(averages, key=lambda event: getattr(event, attribute), reverse=True)[:10]
    return [{"op": event.key, "ms_per_step": round(getattr(event, attribute) / 1e3 / steps, 3),
             "calls_per_step": round(event.count / steps, 1)} for event in ranked if getattr(event, attribute) > 0]


def summarise(result: profile, steps: int, seconds: float, device: str) -> dict[str, Any]:
    """The figures of the module docstring for `steps` steps that took `seconds`."""
    averages = list(result.key_averages())
    summary: dict[str, Any] = {"steps": steps, "ms_per_step": round(1e3 * seconds / steps, 2),
                               "top_host": _top(averages, "self_cpu_time_total", steps)}
    if device != "cuda":
        summary["aten_ops_per_step"] = round(sum(a.count for a in averages if a.key.startswith("aten::")) / steps, 1)
        return summary
    on_device = sorted((e.time_range.start, e.time_range.end) for e in result.events()
                       if e.device_type == DeviceType.CUDA)
    busy, end = 0.0, float("-inf")
    for first, last in on_device:  # the union of the intervals, in µs
        if last > end:
            busy += last - max(first, end)
            end = last
    summary.update({
        "top_device": _top(averages, "self_device_time_total", steps),
        "kernels_per_step": round(len(on_device) / steps, 1),
        "launches_per_step": round(sum(a.count for a in averages if a.key in LAUNCHES) / steps, 1),
        "device_busy_share": round(busy / 1e6 / seconds, 3),
    })
    return summary


# Where a CPU forward of the biLM spends its time, by the operations torch.profiler records (their own time): the
# token layer (everything called from the char CNN's kernels: its filters, highway and projection), then in the
# biLSTM the matmuls, the gate and cell arithmetic, and copies.
MATMULS = frozenset({"mkldnn::_linear_pointwise", "quantized::linear_dynamic", "aten::addmm", "aten::mm", "aten::bmm",
                     "aten::baddbmm"})
ARITHMETIC = frozenset({"aten::tanh", "aten::sigmoid", "aten::mul", "aten::addcmul", "aten::clamp", "aten::add",
                        "aten::add_", "aten::sub"})
COPIES = frozenset({"aten::cat", "aten::copy_", "aten::clone", "aten::constant_pad_nd", "aten::index",
                    "aten::index_put_", "aten::stack"})
SHARES = ("token layer", "LSTM matmuls", "LSTM gate arithmetic", "copies", "other")


def _called_from(event: Any, function: str) -> bool:
    """Whether `event` ran inside a call of the Python function named `function` (its parent events, with stacks)."""
    parent = event.cpu_parent
    while parent is not None:
        if f": {function}" in parent.name:
            return True
        parent = parent.cpu_parent
    return False


def forward_shares(forward: Callable[[], object]) -> dict[str, float]:
    """`forward()` once under torch.profiler (with Python stacks): the share of its operations' own time in each of
    `SHARES`, and "ms", that time in all."""
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as result:
        forward()
    times = dict.fromkeys(SHARES, 0.0)
    for event in result.events():
        if "::" not in event.name or event.name.startswith("aten::empty"):
            continue
        if _called_from(event, "token_representations"):
            share = "token layer"
        elif event.name in MATMULS:
            share = "LSTM matmuls"
        elif event.name in ARITHMETIC:
            share = "LSTM gate arithmetic"
        elif event.name in COPIES:
            share = "copies"
        else:
            share = "other"
        times[share] += event.self_cpu_time_total
    total = sum(times.values())
    return {"ms": total / 1e3, **{name: value / total for name, value in times.items()}}
