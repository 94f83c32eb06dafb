"""Which path the biLM's arithmetic takes: every such decision, made once.

- `Precision`: the opt-in modes a caller asks for (`bf16`, `quantize="int8"`), decided once per caller (an
  `ElmoEmbedder`, the spaCy component's biLM) for its device: what runs, and one `HostWarning` where the host runs
  float32 instead. `mode_problem` is the one check of the modes' values (bf16 or int8, one of them).
- `KernelPlan`: what one forward decides when it starts (the device, autocast's dtype, oneDNN or MKL, packing, int8
  or bf16, cuDNN or the step loop) and the form each of its matmuls reads a weight in (`weight_forms.py`), which
  `kernels.py`'s loops read and never decide again.

A new CPU path (AMX int8, say) is one `KernelPlan` field decided in `KernelPlan.make`, one form in `weight_forms.py`
and one branch in the loop that needs it. Why each default: docs/performance.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .configuration_elmo import ElmoKernelOptions
from .formulas import LstmWeights
from .inference_cache import ElmoInferenceCache
from .runtime import (
    bf16_weight_packing,
    gpu_computes_bf16,
    int8_matmuls,
    intel_cpu,
    native_bf16_cpu,
    onednn_available,
    warn,
)
from .weight_forms import Int8Weight, StepForms, cast, packed, quantized, transposed

QUANTIZE_MODES = (None, "int8")

# What a caller is told, once, where the host runs otherwise than asked (`runtime.HostWarning`).
# Measured on an AMD EPYC Zen 3 (AVX2): the original biLM runs ~6x slower in emulated bf16 than in float32.
BF16_AS_FLOAT32 = ("bf16 was asked for, but this CPU has no native bf16 (AVX512-BF16 or AMX), where it runs several "
                   "times slower than float32: running float32 instead (exact)")
BF16_EMULATED = ("the biLM runs in bf16 (CPU bf16 autocast), but this CPU has no native bf16 (AVX512-BF16 or AMX): it "
                 "is emulated, several times slower than float32")
INT8_AS_FLOAT32 = ("int8 was asked for, but this CPU or torch build has no fast int8 linear kernels (FBGEMM's need an "
                   "x86 CPU with AVX2): running float32 instead (exact)")
INT8_ON_GPU = ("int8 is a CPU mode: on a GPU ask for bf16/fp16 instead (`--bf16`, `mixed_precision`): running the "
               "GPU's float32")
BOTH_MODES = "bf16 and int8 are two ways to trade exactness for speed: choose one"


def mode_problem(bf16: bool, quantize: object) -> str | None:
    """What is wrong with asking for `bf16` and `quantize` (None or "int8") together, or None."""
    if quantize not in QUANTIZE_MODES:
        return f'quantize must be None or "int8", got {quantize!r}'
    return BOTH_MODES if bf16 and quantize else None


def reduced_precision(device: torch.device | str) -> torch.dtype | None:
    """The dtype of the biLM's opt-in reduced-precision inference on `device`: bf16 on a CPU with native bf16
    (AVX512-BF16 or AMX) and on GPUs that compute it (Ampere on), float16 on older GPUs; None (float32) on a CPU
    without native bf16, where emulated bf16 is several times slower than float32 (docs/performance.md)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if gpu_computes_bf16() else torch.float16
    return torch.bfloat16 if native_bf16_cpu() else None


def int8_runs(device: torch.device) -> bool:
    """Whether int8 asked for on `device` runs: on a CPU with the kernels (`runtime.int8_matmuls`); else False, and
    one `HostWarning` saying why."""
    if device.type != "cpu":
        warn(INT8_ON_GPU)
        return False
    if not int8_matmuls():
        warn(INT8_AS_FLOAT32)
        return False
    return True


@dataclass(frozen=True)
class Precision:
    """What a caller's inference runs in, decided once for its device (`of`): under autocast in `autocast_dtype`
    (None: float32), in the int8 mode where `quantize` is "int8"."""

    device_type: str = "cpu"
    autocast_dtype: torch.dtype | None = None
    quantize: str | None = None

    @classmethod
    def of(cls, device: torch.device | str, bf16: bool = False, quantize: str | None = None) -> Precision:
        """The precision on `device` when `bf16` or `quantize` is asked for: bf16 where `reduced_precision` has it,
        int8 where `int8_runs`; else float32 and one `HostWarning` saying why. Both asked for is a `ValueError`."""
        if problem := mode_problem(bf16, quantize):
            raise ValueError(problem)
        device = torch.device(device)
        dtype = reduced_precision(device) if bf16 else None
        if bf16 and dtype is None:
            warn(BF16_AS_FLOAT32)
        return cls(device.type, dtype, "int8" if quantize and int8_runs(device) else None)

    def autocast(self) -> contextlib.AbstractContextManager:
        """`torch.autocast` in `autocast_dtype`, or nothing (float32)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)


def uses_onednn(options: ElmoKernelOptions) -> bool:
    """Whether CPU float32 inference matmuls go through oneDNN (where this torch build has it)."""
    return not intel_cpu() if options.onednn == "auto" else options.onednn


def recurrence_for(options: ElmoKernelOptions, device: torch.device, weights: LstmWeights) -> str:
    """The LSTM loop of a layer on `device`: `"fused"` (`nn.LSTM`, cuDNN on a GPU) or `"steps"` (the step loop over
    the active rows). By default fused on a GPU where it computes the layer exactly (`LstmWeights.fused_exact`)."""
    if options.fused_lstm == "auto":
        return "fused" if device.type == "cuda" and weights.fused_exact else "steps"
    return "fused" if options.fused_lstm == "always" else "steps"


def _int8(device: torch.device, inference: bool, autocast: bool, cpu_float32: bool) -> bool:
    """Whether a forward that asks for int8 runs it (`int8_runs`). With gradient, under CPU autocast or with weights
    not in float32 it is an error (one line)."""
    if not inference:
        raise ValueError('quantize="int8" is for inference: call the biLM under torch.no_grad() or '
                         "torch.inference_mode() (int8 weights have no gradient)")
    if device.type == "cpu" and autocast:
        raise ValueError(f'quantize="int8" under CPU autocast (the bf16 mode): {BOTH_MODES}')
    if device.type == "cpu" and not cpu_float32:
        raise ValueError('quantize="int8" quantizes float32 weights: load the biLM in float32 (torch_dtype=float32)')
    return int8_runs(device)


@dataclass(frozen=True)
class KernelPlan:
    """What one forward decides once, from the config's `options`, its inputs, the gradient and the autocast in force;
    every matmul and recurrence of the call reads it.

    inference: no gradient flows to the weights (nor to a given state): the cache may be read and filled, and the
        weights read in packed, transposed or cast forms. compute_dtype: the dtype inference matmuls compute in under
        autocast (a GPU's, or the CPU's bf16 mode); None: the weights'. onednn: CPU float32 inference matmuls through
        oneDNN. bf16_packs: CPU bf16 inference with weights packed in bf16 for oneDNN once (where it can pack them).
        cpu_float32: CPU float32 inference (where one-row steps may take the batched MKL matmul). every_position: the
        char CNN on every position, all its character slots (a GPU's shapes), rather than on each distinct word once.
        int8: the int8 mode (`quantize="int8"` on a CPU that has the kernels): the highway's, the token projection's
        and the LSTMs' matmuls read their weights as `Int8Weight`s. few_steps: a call of a few steps (an
        `ElmoStream`'s advance), whose LSTM input weights are read once for few rows: packed too. cache: the caller's
        inference cache, in inference only (where the forms are kept).
    """

    options: ElmoKernelOptions
    device: torch.device
    inference: bool
    compute_dtype: torch.dtype | None
    onednn: bool
    bf16_packs: bool
    cpu_float32: bool
    every_position: bool
    int8: bool = False
    few_steps: bool = False
    cache: ElmoInferenceCache | None = field(default=None, compare=False)

    @classmethod
    def make(cls, options: ElmoKernelOptions, input_ids: torch.Tensor, tensors: Sequence[torch.Tensor],
             quantize: str | None = None, cache: ElmoInferenceCache | None = None,
             few_steps: bool = False) -> KernelPlan:
        """The plan of a forward of `input_ids` whose weights and given state are `tensors`, in the `quantize` mode
        (None or "int8"), reading and filling `cache` in inference, of a few steps (`few_steps`) or all. CPU bf16
        autocast on a CPU without native bf16 runs as asked, with one `HostWarning`."""
        device = input_ids.device
        inference = not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        autocast = torch.is_autocast_enabled(device.type)
        compute_dtype = None
        if inference and autocast and device.type == "cuda":
            compute_dtype = torch.get_autocast_dtype("cuda")
        elif inference and autocast and device.type == "cpu" and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            compute_dtype = torch.bfloat16
        if (device.type == "cpu" and autocast and torch.get_autocast_dtype("cpu") == torch.bfloat16
                and not native_bf16_cpu()):
            warn(BF16_EMULATED)
        cpu_float32 = (inference and not autocast and device.type == "cpu"
                       and all(t.dtype == torch.float32 for t in tensors if t.is_floating_point()))
        return cls(
            options=options, device=device, inference=inference, compute_dtype=compute_dtype,
            onednn=cpu_float32 and onednn_available() and uses_onednn(options),
            bf16_packs=device.type == "cpu" and compute_dtype == torch.bfloat16 and bf16_weight_packing(),
            cpu_float32=cpu_float32,
            every_position=device.type == "cuda" if options.distinct_words == "auto" else not options.distinct_words,
            int8=quantize == "int8" and _int8(device, inference, autocast, cpu_float32),
            few_steps=few_steps, cache=cache if inference else None,
        )

    def recurrence(self, weights: LstmWeights) -> str:
        """The LSTM loop of a layer (`recurrence_for`)."""
        return recurrence_for(self.options, self.device, weights)

    def batched_step(self, rows: int, weight: torch.Tensor) -> bool:
        """Whether an LSTM step of `rows` rows with this (2, N, K) weight takes one batched MKL matmul for both
        directions rather than oneDNN: a single row and at most `single_row_bmm_max_weight` elements per direction
        (oneDNN's fixed cost per call would dominate)."""
        return rows == 1 and weight.shape[1] * weight.shape[2] <= self.options.single_row_bmm_max_weight

    def window_steps(self, rows: int, width: int) -> int:
        """The steps of a window of `rows` active rows whose input projections ((rows, steps, width) gate
        pre-activations) one matmul computes: at most `lstm_time_chunk`, and few enough that what the matmul writes
        stays within `lstm_input_block` bytes (in cache until the steps read it: 4 bytes an element in float32, 2 in
        bf16 or float16, 8 in int8, whose kernel sums in int32 before it writes float32); at least one."""
        options = self.options
        element = 8 if self.int8 else 4 if self.compute_dtype is None else 2
        return max(1, min(options.lstm_time_chunk, options.lstm_input_block // (element * rows * width)))

    def weight(self, parameter: torch.Tensor) -> torch.Tensor:
        """A parameter as this call's arithmetic reads it: in the compute dtype where there is one (activations
        computed from a float32 parameter would come out in float32, to be cast again), cast once by the cache if
        there is one; else itself."""
        return parameter if self.compute_dtype is None else cast(self.cache, parameter, self.compute_dtype)

    def in_compute_dtype(self, x: torch.Tensor) -> torch.Tensor:
        """Activations `x` in the compute dtype, where there is one."""
        return x if self.compute_dtype is None else x.to(self.compute_dtype)

    def linear_form(self, weight: torch.Tensor) -> torch.Tensor | Int8Weight:
        """The form an (N, K) parameter is read in by `weight_forms.linear`: in int8 in the int8 mode, packed in bf16
        in the bf16 mode, cast under GPU autocast (each kept by the cache), else as it is."""
        if self.int8:
            return quantized(self.cache, weight)[0]
        if self.cache is not None and self.compute_dtype is not None and self.device.type == "cuda":
            return cast(self.cache, weight, self.compute_dtype)
        if self.cache is not None and self.bf16_packs:
            return packed(self.cache, weight, torch.bfloat16)[0]
        return weight

    def fused_dtype(self) -> torch.dtype | None:
        """The dtype the cache keeps a layer's `nn.LSTM`s in: under GPU autocast its dtype; else the weights'."""
        return self.compute_dtype if self.device.type == "cuda" else None

    def step_forms(self, weights: LstmWeights, rows: int) -> StepForms:
        """The forms the step loop of `rows` rows reads the layer's (input, recurrent, projection) weights in (None:
        the weight itself):

        - under GPU autocast, with a cache: the input weight cast to the autocast dtype, the step weights cast and
          transposed to (2, K, N), made once;
        - float32 on a CPU, a one-row call whose step weights all take the batched-MKL step (`batched_step`): those
          two transposed to contiguous (2, K, N), only from the cache (a copy per call costs about what it saves),
          the input weight as below;
        - oneDNN float32: the step weights packed per direction, the input weight only in a call of `few_steps` (else
          one matmul per window, where a pack gains little; in a call of a few steps, oneDNN would reorder it at each);
        - the bf16 mode where oneDNN packs bf16 weights: all three packed per direction in bf16, which autocast
          would otherwise cast again at every call and step;
        - the int8 mode: all three per direction as `Int8Weight`s, the input weight's with the layer's bias; the
          step weights of a one-row call that takes the batched-MKL step stay float32, as above (faster there).
        """
        cache = self.cache
        weights_in_order = (weights.input_weight, weights.recurrent_weight, weights.projection_weight)
        step_weights = [w for w in weights_in_order[1:] if w is not None]
        batched_steps = all(self.batched_step(rows, w) for w in step_weights)
        if self.int8:
            input_form = quantized(cache, weights.input_weight, with_bias=weights)
            if batched_steps:  # one matmul for both directions beats two int8 ones on weights this small
                return [input_form, *(None if w is None or cache is None else transposed(cache, w)
                                      for w in weights_in_order[1:])]
            return [input_form, *(None if w is None else quantized(cache, w) for w in weights_in_order[1:])]
        if self.device.type == "cuda" and self.compute_dtype is not None:
            if cache is None:
                return [None, None, None]
            return [cast(cache, weights.input_weight, self.compute_dtype),
                    *(None if w is None else cast(cache, w, self.compute_dtype, transpose=True)
                      for w in weights_in_order[1:])]
        input_form = (packed(cache, weights.input_weight, torch.float32)
                      if self.onednn and self.few_steps and cache is not None else None)
        if self.cpu_float32 and batched_steps:
            return [input_form, *(None if w is None or cache is None else transposed(cache, w)
                                  for w in weights_in_order[1:])]
        if self.onednn:
            return [input_form, *(None if w is None else packed(cache, w, torch.float32) for w in weights_in_order[1:])]
        if self.bf16_packs:
            return [None if w is None else packed(cache, w, torch.bfloat16) for w in weights_in_order]
        return [None, None, None]
