"""The CPUs users run on, pretended on whatever CPU runs the tests: every capability question `hf_elmo.runtime`
answers is forced from its source (the CPU flags and vendor in /proc/cpuinfo, torch's own answer about oneDNN's bf16
weight packing), so the code under test asks exactly as it would on that CPU.

Where the pretended CPU packs bf16 weights and the real one cannot, the packing is a plain bf16 copy (the same
values, read by `F.linear`): the decision and everything after it run, only oneDNN's blocked layout does not. Where
the pretended CPU cannot pack them, packing fails as it does there (torch's own message), so that code which packs
without asking `runtime` fails the tests on any CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from hf_elmo import runtime


@dataclass(frozen=True)
class Cpu:
    flags: str
    vendor: str
    bf16_packing: bool  # torch.ops.mkldnn._is_mkldnn_bf16_supported()


# The kinds of CPU this project has met (docs/performance.md): the capability each branch of the code depends on.
CPUS = {
    "avx": Cpu("fpu sse4_2 avx", "GenuineIntel", bf16_packing=False),  # before AVX2 (Sandy Bridge): no int8 kernels
    "avx2": Cpu("fpu sse4_2 avx avx2 fma f16c", "AuthenticAMD", bf16_packing=False),  # AMD EPYC Zen 3
    "avx512": Cpu("fpu avx avx2 fma avx512f avx512bw avx512vl avx512dq", "GenuineIntel", bf16_packing=True),  # Skylake
    "avx512_bf16": Cpu("fpu avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16", "AuthenticAMD",
                       bf16_packing=True),  # AMD EPYC Zen 4/5
    "amx": Cpu("fpu avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_bf16 amx_tile amx_int8", "GenuineIntel",
               bf16_packing=True),  # Intel Xeon, Sapphire Rapids on
}

CAPABILITIES = (runtime.cpu_flags, runtime.native_bf16_cpu, runtime.intel_cpu, runtime.onednn_available,
                runtime.bf16_weight_packing, runtime.int8_matmuls)

# torch's message where oneDNN cannot pack bf16 weights (torch 2.13 on an AVX2 CPU).
NO_BF16_PACKING = ("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl "
                   "and avx512dq")


def real_bf16_packing() -> bool:
    """Whether the CPU running the tests packs bf16 weights (asked before anything is pretended)."""
    forget_capabilities()
    return runtime.bf16_weight_packing()


def forget_capabilities() -> None:
    """Let `runtime` read every capability again at its next question."""
    for capability in CAPABILITIES:
        capability.cache_clear()


@dataclass
class Pretended:
    cpu: Cpu
    bf16_packs: list  # the shape of each weight packed in bf16


def pretend(monkeypatch: pytest.MonkeyPatch, name: str) -> Pretended:
    """Make `runtime` (and torch's oneDNN weight packing) answer as CPU `name` of `CPUS` until `monkeypatch` is
    undone (the `pretend_cpu` fixture forgets the pretended answers then)."""
    cpu = CPUS[name]
    really_packs = real_bf16_packing()
    pretended = Pretended(cpu, [])
    fields = {"flags": cpu.flags, "vendor_id": cpu.vendor, "model name": f"pretended {name}"}
    monkeypatch.setattr(runtime, "_cpuinfo_field", lambda field: fields.get(field, ""))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: cpu.bf16_packing)
    reorder = torch.ops.mkldnn._reorder_linear_weight

    def reorder_linear_weight(weight: torch.Tensor, *args):
        if weight.dtype != torch.bfloat16:
            return reorder(weight, *args)
        if not cpu.bf16_packing:
            raise RuntimeError(NO_BF16_PACKING)
        pretended.bf16_packs.append(tuple(weight.shape))
        return reorder(weight, *args) if really_packs else weight.clone()

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", reorder_linear_weight)
    forget_capabilities()
    return pretended
