"""The forms the kernels read a biLM's weights in, and the matmuls that read them (`kernels.py` runs the loops;
`kernel_plan.py` decides which form each matmul of a call reads).

- `Int8Weight`: an (N, K) weight in int8 for FBGEMM's dynamically quantized linear (the opt-in int8 mode).
- `pack_weight` / `packed`: weights in oneDNN's blocked layout (float32, or bf16 in the bf16 mode).
- `transposed` / `cast`: (2, K, N) copies for the batched matmul of both directions, or copies in autocast's dtype.
- `fused_lstms`: an LSTM layer's weights as `nn.LSTM`s (cuDNN's flat layout on a GPU).
- `linear` / `both_directions`: a matmul of one weight in any of these forms, of both directions of a step.

Every derived form is made once and kept by the caller's `ElmoInferenceCache` (remade when a weight changes), or
made for the call without one.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .formulas import LstmWeights
from .inference_cache import ElmoInferenceCache


class Int8Weight:
    """An (N, K) weight in int8 for the int8 mode: quantized once, per output row (symmetric: scale = max |w| / 127),
    packed for torch's dynamically quantized linear (`quantized::linear_dynamic`: FBGEMM's AVX2 / AVX-512 kernels).
    `weight(x)`: x (..., K) float32 → x @ weightᵀ (..., N) float32, x quantized at each call to 7 bits with one scale
    for the whole call (`reduce_range`: AVX2's 16-bit sums of two products cannot saturate).

    Why these ops: on an AVX2 EPYC, torchao's int8 configs in eager mode and oneDNN's int8 linear are slower than
    float32 (docs/performance.md); FBGEMM's are 2 to 8 times faster. They are torch's own C++ ops; what torch
    deprecates is creating the quantized tensor they pack from (`torch.quantize_per_channel`, done here once per
    weight, its warning silenced), and `runtime.int8_matmuls` asks torch whether they work, so a torch without them
    runs float32 with one line (tested). oneDNN's `qlinear_pointwise` from a plain int8 weight matches FBGEMM's speed
    on CPUs with VNNI (docs/performance.md): the form to add then, beside this one."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        """`bias` (N,), optional: added by the kernel itself (no pass of its own over the output)."""
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "quantized tensor creation functions ... are deprecated"
            quantized = torch.quantize_per_channel(weight, scales.double(), torch.zeros_like(scales, dtype=torch.long),
                                                   0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(quantized, None if bias is None else bias.detach().float())
        self.shape = tuple(weight.shape)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    onednn: bool = False,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (..., K) @ weight (N, K)ᵀ + bias (N) + add (..., N) → (..., N). `weight` may be an `Int8Weight` or a packed
    one (`pack_weight`; then the result has its dtype); a dense weight goes through oneDNN with `onednn` (the plan's
    `KernelPlan.onednn`), else `F.linear`."""
    if isinstance(weight, Int8Weight):
        output = weight(x)  # a new tensor: the sums go into it
        for term in (bias, add):
            if term is not None:
                output.add_(term)
        return output
    if weight.is_mkldnn and weight.dtype != torch.float32:  # a bf16 pack (the bf16 mode): operands to its dtype
        x = x.to(weight.dtype)
        bias = None if bias is None else bias.to(weight.dtype)
        add = None if add is None else add.to(weight.dtype)
    if weight.is_mkldnn or onednn:
        if add is not None:
            return torch.ops.mkldnn._linear_pointwise.binary(x, add, weight, bias, "add")
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    output = F.linear(x, weight, bias)
    return output if add is None else output + add


def pack_weight(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) weight → a copy in `dtype` in oneDNN's blocked layout for `linear`: the same results, and without the
    per-call reordering (faster for matmuls of few rows, as in the LSTM recurrence: docs/performance.md)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype))


# Per LSTM weight (input, recurrent, projection): its packed or int8 (N, K) matrices (one per direction), or a
# (2, N, K) weight transposed or cast for the batched matmul, or None where the weight is read as it is (or absent).
StepForms = list[list[torch.Tensor] | list[Int8Weight] | torch.Tensor | None]


def packed(cache: ElmoInferenceCache | None, weight: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
    """A (2, N, K) weight as its directions' (N, K) matrices, an (N, K) weight as one matrix, packed in `dtype`
    (`pack_weight`): kept by `cache`, else made for this call."""
    def make() -> list[torch.Tensor]:
        return [pack_weight(m, dtype) for m in (weight.unbind() if weight.dim() == 3 else [weight])]

    return make() if cache is None else cache.derived([weight], dtype, make)


def quantized(cache: ElmoInferenceCache | None, weight: torch.Tensor, with_bias: LstmWeights | None = None
              ) -> list[Int8Weight]:
    """A (2, N, K) weight as its directions' `Int8Weight`s, an (N, K) weight as one: kept by `cache`, else made for
    this call. `with_bias`: the layer whose input weight this is, its bias (forget bias included) then added by
    the kernel."""
    def make() -> list[Int8Weight]:
        matrices = weight.unbind() if weight.dim() == 3 else [weight]
        biases = [None] * len(matrices) if with_bias is None else with_bias.bias_with_forget_bias().unbind()
        return [Int8Weight(m, b) for m, b in zip(matrices, biases)]

    if cache is None:
        return make()
    sources = [weight] if with_bias is None else [weight, with_bias.bias]
    return cache.derived(sources, ("int8", with_bias is not None), make)


def transposed(cache: ElmoInferenceCache, weight: torch.Tensor) -> torch.Tensor:
    """A (2, N, K) weight as a contiguous (2, K, N) copy, for `both_directions`' batched matmul, kept by `cache`."""
    return cache.derived([weight], "transposed", lambda: weight.detach().mT.contiguous())


def cast(cache: ElmoInferenceCache | None, weight: torch.Tensor, dtype: torch.dtype, transpose: bool = False
         ) -> torch.Tensor:
    """A copy of `weight` in `dtype` (a (2, N, K) weight as a contiguous (2, K, N) with `transpose`, for
    `both_directions`), for matmuls under autocast: kept by `cache`, else made for this call."""
    def make() -> torch.Tensor:
        return (weight.detach().mT if transpose else weight.detach()).to(dtype).contiguous()

    return make() if cache is None else cache.derived([weight], ("cast", dtype, transpose), make)


def both_directions(
    x: torch.Tensor,
    weight: torch.Tensor,
    form: list[torch.Tensor] | torch.Tensor | None,
    onednn: bool = False,
    batched: bool = False,
    add: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """x (2, n, K) @ weight (2, N, K)ᵀ per direction, + add (one (n, N) per direction) → (2, n, N).

    `form` is the plan's form of `weight` (`StepForms`): in int8 where the directions are `Int8Weight`s; through
    oneDNN where they are packed for it (in their dtype), unless float32 and `batched` (the plan's
    `KernelPlan.batched_step` for this step); else one batched matmul (MKL), reading `form` where it is the (2, K, N)
    transposed or cast copy."""
    if isinstance(form, list) and (isinstance(form[0], Int8Weight) or form[0].dtype != torch.float32
                                   or not batched):
        return torch.stack([linear(x[d], form[d], None, onednn, None if add is None else add[d]) for d in range(2)])
    weight_t = form if isinstance(form, torch.Tensor) else weight.transpose(1, 2)
    if add is None:
        return torch.bmm(x, weight_t)
    return torch.baddbmm(torch.stack(add), x, weight_t)


def meta_lstm(weights: LstmWeights) -> nn.LSTM:
    """An `nn.LSTM` (one direction, batch first) of the sizes of an LSTM layer, on the meta device."""
    cell, hidden = weights.recurrent_weight.shape[1] // 4, weights.recurrent_weight.shape[2]
    return nn.LSTM(weights.input_weight.shape[-1], cell, batch_first=True, device="meta",
                   proj_size=hidden if weights.projection_weight is not None else 0)


def fused_lstm_weights(weights: LstmWeights) -> list[dict[str, torch.Tensor]]:
    """Per direction, the parameters of the `nn.LSTM(proj_size=P)` that computes an LSTM layer without its clipping:
    its gates reordered from TensorFlow's (i, j, f, o) to PyTorch's (i, f, g, o), the forget bias added;
    differentiable functions of the layer's weights."""
    def reordered(weight: torch.Tensor) -> torch.Tensor:  # slices, not an index made on the host (a copy to a GPU)
        i, j, f, o = weight.chunk(4, dim=0)
        return torch.cat([i, f, j, o])

    bias = weights.bias_with_forget_bias()
    states = []
    for d in range(2):
        state = {"weight_ih_l0": reordered(weights.input_weight[d]),
                 "weight_hh_l0": reordered(weights.recurrent_weight[d]),
                 "bias_ih_l0": reordered(bias[d]), "bias_hh_l0": torch.zeros_like(bias[d])}
        if weights.projection_weight is not None:
            state["weight_hr_l0"] = weights.projection_weight[d]
        states.append(state)
    return states


def fused_lstms(cache: ElmoInferenceCache, weights: LstmWeights, dtype: torch.dtype | None = None) -> list[nn.LSTM]:
    """The `nn.LSTM` of each direction of an LSTM layer (`fused_lstm_weights`), in `dtype` (default: the layer's;
    under GPU autocast its dtype, which autocast would otherwise cast the weights to at every call), its weights in
    one contiguous block in cuDNN's layout (`flatten_parameters`): made once by `cache`, remade when a weight
    changes."""
    dtype = dtype or weights.input_weight.dtype

    def make() -> list[nn.LSTM]:
        lstms = []
        with torch.no_grad():
            for state in fused_lstm_weights(weights):
                lstm = meta_lstm(weights).to_empty(device=weights.input_weight.device).to(dtype)
                lstm.requires_grad_(False).load_state_dict(state)
                lstm.flatten_parameters()
                lstms.append(lstm)
        return lstms

    return cache.derived(weights.parameters(), ("fused", dtype), make)
