"""The fast forms of the biLM's arithmetic on each device (`ElmoConfig.implementation = "kernels"`, the default).

`modeling_elmo.py` says what the biLM computes, with the formulas of `formulas.py` and `F.linear`. When the config
asks for the kernels, `ElmoModel.forward` makes one `ElmoKernels` per call: its `KernelPlan` decides once what the
call's matmuls and recurrences do (the device, autocast's dtype, whether the weights are read in packed, transposed or
cast forms, oneDNN or MKL, cuDNN or the step loop), and every step runs the same formulas through the plan's matmuls.
The kernels read each block's weights as a record (`CharCnnWeights`, `LstmWeights`) and never reach into a module.

- `ElmoKernels.token_representations`: the char CNN over each distinct word of the batch once (or from the cache),
  the words grouped by length so that short words do not pay for long ones.
- `ElmoKernels.lstm`: one biLSTM layer through the plan's recurrence: the step loop over the rows still active (both
  directions per step, its weights packed for oneDNN or transposed), or `nn.LSTM` (cuDNN on a GPU, its weights kept
  in cuDNN's flat layout by the cache). Each sorts the rows as it needs them.
- `linear`: a matmul as the plan says: int8 (`Int8Weight`, the opt-in int8 mode), oneDNN (a packed weight, or
  float32 without gradient where this torch build has it), else `F.linear`.

What inference keeps between calls is the caller's `ElmoInferenceCache` (`inference_cache.py`). None of this changes
the function computed beyond float32 rounding, except the fused LSTM on a model that clips (opt-in:
`fused_lstm="always"`), the bf16 mode (opt-in: the caller's `torch.autocast`) and the int8 mode (opt-in:
`model(..., quantize="int8")`). Why each default: docs/performance.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .configuration_elmo import ElmoKernelOptions
from .formulas import (
    CharCnnWeights,
    LayerState,
    LstmWeights,
    convolve_pool_activate,
    highway,
    lstm_cell,
    project_tokens,
)
from .inference_cache import ElmoInferenceCache
from .runtime import (
    INT8_AS_FLOAT32,
    INT8_ON_GPU,
    bf16_weight_packing,
    host_index,
    int8_matmuls,
    intel_cpu,
    native_bf16_cpu,
    onednn_available,
    warn,
)

QUANTIZE_MODES = (None, "int8")


def uses_onednn(options: ElmoKernelOptions) -> bool:
    """Whether CPU float32 inference matmuls go through oneDNN (where this torch build has it)."""
    return not intel_cpu() if options.onednn == "auto" else options.onednn


def recurrence_for(options: ElmoKernelOptions, device: torch.device, weights: LstmWeights) -> str:
    """The LSTM loop of a layer on `device`: `"fused"` (`nn.LSTM`, cuDNN on a GPU) or `"steps"` (the step loop over
    the active rows). By default fused on a GPU where it computes the layer exactly (`LstmWeights.fused_exact`)."""
    if options.fused_lstm == "auto":
        return "fused" if device.type == "cuda" and weights.fused_exact else "steps"
    return "fused" if options.fused_lstm == "always" else "steps"


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
        and the LSTMs' matmuls read their weights as `Int8Weight`s.
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

    @classmethod
    def make(cls, options: ElmoKernelOptions, input_ids: torch.Tensor, tensors: Sequence[torch.Tensor],
             quantize: str | None = None) -> KernelPlan:
        """The plan of a forward of `input_ids` whose weights and given state are `tensors`, in the `quantize` mode
        (None or "int8"; see `int8_plan`)."""
        device = input_ids.device
        inference = not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
        autocast = torch.is_autocast_enabled(device.type)
        compute_dtype = None
        if inference and autocast and device.type == "cuda":
            compute_dtype = torch.get_autocast_dtype("cuda")
        elif inference and autocast and device.type == "cpu" and torch.get_autocast_dtype("cpu") == torch.bfloat16:
            compute_dtype = torch.bfloat16
        cpu_float32 = (inference and not autocast and device.type == "cpu"
                       and all(t.dtype == torch.float32 for t in tensors if t.is_floating_point()))
        return cls(
            options=options, device=device, inference=inference, compute_dtype=compute_dtype,
            onednn=cpu_float32 and onednn_available() and uses_onednn(options),
            bf16_packs=device.type == "cpu" and compute_dtype == torch.bfloat16 and bf16_weight_packing(),
            cpu_float32=cpu_float32,
            every_position=device.type == "cuda" if options.distinct_words == "auto" else not options.distinct_words,
            int8=quantize == "int8" and int8_plan(device, inference, autocast, cpu_float32),
        )

    def recurrence(self, weights: LstmWeights) -> str:
        """The LSTM loop of a layer (`recurrence_for`)."""
        return recurrence_for(self.options, self.device, weights)

    def batched_step(self, rows: int, weight: torch.Tensor) -> bool:
        """Whether an LSTM step of `rows` rows with this (2, N, K) weight takes one batched MKL matmul for both
        directions rather than oneDNN: a single row and at most `single_row_bmm_max_weight` elements per direction
        (oneDNN's fixed cost per call would dominate)."""
        return rows == 1 and weight.shape[1] * weight.shape[2] <= self.options.single_row_bmm_max_weight


def int8_plan(device: torch.device, inference: bool, autocast: bool, cpu_float32: bool) -> bool:
    """Whether a forward that asks for int8 runs it: inference on a CPU with the kernels (`runtime.int8_matmuls`).
    With gradient, under autocast or with weights not in float32 it is an error (one line); on a GPU, or a CPU without
    the kernels, one `HostWarning` says that it runs without int8."""
    if not inference:
        raise ValueError('quantize="int8" is for inference: call the biLM under torch.no_grad() or '
                         "torch.inference_mode() (int8 weights have no gradient)")
    if device.type != "cpu":
        warn(INT8_ON_GPU)
        return False
    if autocast:
        raise ValueError('quantize="int8" and CPU autocast (the bf16 mode) were both asked for: choose one')
    if not cpu_float32:
        raise ValueError('quantize="int8" quantizes float32 weights: load the biLM in float32 (torch_dtype=float32)')
    if not int8_matmuls():
        warn(INT8_AS_FLOAT32)
        return False
    return True


class Int8Weight:
    """An (N, K) weight in int8 for the int8 mode: quantized once, per output row (symmetric: scale = max |w| / 127),
    packed for torch's dynamically quantized linear (`quantized::linear_dynamic`: FBGEMM's AVX2 / AVX-512 kernels).
    `weight(x)`: x (..., K) float32 → x @ weightᵀ (..., N) float32, x quantized at each call to 7 bits with one scale
    for the whole call (`reduce_range`: AVX2's 16-bit sums of two products cannot saturate).

    Why these ops: on an AVX2 EPYC, torchao's int8 configs in eager mode and oneDNN's int8 linear are slower than
    float32 (docs/performance.md); FBGEMM's are 2 to 8 times faster. They are torch's own C++ ops; what torch
    deprecates is creating the quantized tensor they pack from (`torch.quantize_per_channel`, done here once per
    weight, its warning silenced), and `runtime.int8_matmuls` asks torch whether they work, so a torch without them
    runs float32 with one line."""

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
    plan: KernelPlan,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (..., K) @ weight (N, K)ᵀ + bias (N) + add (..., N) → (..., N). `weight` may be an `Int8Weight` or a packed
    one (`pack_weight`; then the result has its dtype); a dense weight goes through oneDNN where the plan says so,
    else `F.linear`."""
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
    if weight.is_mkldnn or plan.onednn:
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
    plan: KernelPlan,
    add: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """x (2, n, K) @ weight (2, N, K)ᵀ per direction, + add (one (n, N) per direction) → (2, n, N).

    `form` is the plan's form of `weight` (`StepForms`): in int8 where the directions are `Int8Weight`s; through
    oneDNN where they are packed for it (in their dtype; float32 one-row steps excepted, `KernelPlan.batched_step`);
    else one batched matmul (MKL), reading `form` where it is the (2, K, N) transposed or cast copy."""
    if isinstance(form, list) and (isinstance(form[0], Int8Weight) or form[0].dtype != torch.float32
                                   or not plan.batched_step(x.shape[1], weight)):
        return torch.stack([linear(x[d], form[d], None, plan, add=None if add is None else add[d]) for d in range(2)])
    weight_t = form if isinstance(form, torch.Tensor) else weight.transpose(1, 2)
    if add is None:
        return torch.bmm(x, weight_t)
    return torch.baddbmm(torch.stack(add), x, weight_t)


def _meta_lstm(weights: LstmWeights) -> nn.LSTM:
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
                lstm = _meta_lstm(weights).to_empty(device=weights.input_weight.device).to(dtype)
                lstm.requires_grad_(False).load_state_dict(state)
                lstm.flatten_parameters()
                lstms.append(lstm)
        return lstms

    return cache.derived(weights.parameters(), ("fused", dtype), make)


def _used_positions(char_ids: torch.Tensor, widest_filter: int, padding_id: int) -> torch.Tensor:
    """(words, chars) ids → (words,): how many leading character positions of each word the max-pool needs.

    Beyond a word's last non-padding character every window is all padding, and all such windows of a width give the
    same value; keeping `widest_filter` padding positions keeps one of them, so the pooled maximum (and its gradient)
    is the one over all positions.
    """
    chars = char_ids.shape[1]
    used = char_ids != padding_id
    last = torch.where(used.any(dim=1), chars - 1 - used.flip(1).int().argmax(dim=1), -1)
    return (last + 1 + widest_filter).clamp(max=chars)


def unique_rows(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, k) integer ids → (distinct rows (m, k), inverse (n,)) with rows[inverse] equal to ids, as
    `torch.unique(ids, dim=0, return_inverse=True)`; on CPU through NumPy, which compares whole rows as bytes (4x
    faster than torch's row-by-row comparisons), so the distinct rows come in another order."""
    if ids.device.type != "cpu" or not ids.numel():
        return torch.unique(ids, dim=0, return_inverse=True)
    rows = np.ascontiguousarray(ids.numpy())
    as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).reshape(-1)
    _, first, inverse = np.unique(as_bytes, return_index=True, return_inverse=True)
    return ids[torch.from_numpy(first)], torch.from_numpy(inverse.reshape(-1))


class ElmoKernels:
    """How one forward pass of a biLM runs: its `KernelPlan` (decided when it starts), the rows' lengths on the host
    and the caller's `inference_cache`, which it reads and fills. `ElmoModel.forward` makes it (never while a
    compiler traces: then the blocks' own `forward` runs)."""

    def __init__(
        self,
        options: ElmoKernelOptions,
        input_ids: torch.Tensor,
        lengths: Sequence[int],
        inference_cache: ElmoInferenceCache | None,
        tensors: Sequence[torch.Tensor],
        quantize: str | None = None,
    ):
        """`tensors`: the model's parameters and the state given to the call (whether gradient flows to them);
        `quantize`: None or "int8" (`int8_plan`)."""
        self.plan = KernelPlan.make(options, input_ids, tensors, quantize)
        self.cache = inference_cache if self.plan.inference else None
        self.lengths = list(lengths)
        self._per_call: dict[object, object] = {}  # what a call makes once for all its layers
        if (input_ids.device.type == "cpu" and torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == torch.bfloat16 and not native_bf16_cpu()):
            warn("the biLM runs in bf16 (CPU bf16 autocast), but this CPU has no native bf16 (AVX512-BF16 or AMX): "
                 "it is emulated, several times slower than float32")

    # -- matmuls and the forms of weights they read ----------------------------------------------------------------
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) @ weight (N, K)ᵀ + bias (N) → (..., N), `weight` one of the model's parameters: read in int8 in
        the int8 mode, packed in bf16 in the bf16 mode, cast under GPU autocast (each kept by the cache), else as it
        is."""
        plan = self.plan
        if plan.int8:
            weight = quantized(self.cache, weight)[0]
        elif self.cache is not None and plan.compute_dtype is not None and plan.device.type == "cuda":
            weight = cast(self.cache, weight, plan.compute_dtype)
        elif self.cache is not None and plan.bf16_packs:
            weight = packed(self.cache, weight, torch.bfloat16)[0]
        return linear(x, weight, None if bias is None else self.weight(bias), plan)

    def weight(self, parameter: torch.Tensor) -> torch.Tensor:
        """A parameter as this call's arithmetic reads it: in the plan's compute dtype where there is one (activations
        computed from a float32 parameter would come out in float32, to be cast again), cast once by the cache if
        there is one; else itself."""
        dtype = self.plan.compute_dtype
        return parameter if dtype is None else cast(self.cache, parameter, dtype)

    def in_compute_dtype(self, x: torch.Tensor) -> torch.Tensor:
        """Activations `x` in the plan's compute dtype, where there is one."""
        dtype = self.plan.compute_dtype
        return x if dtype is None else x.to(dtype)

    def _matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The formulas' matmul for a weight made in this call (the char CNN's flattened filters): no cached form."""
        return linear(x, weight, bias, self.plan)

    # -- the char CNN --------------------------------------------------------------------------------------------
    def token_representations(
        self,
        weights: CharCnnWeights,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        word_input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The char CNN on (batch, positions, chars) ids and their (batch, positions) mask (with a word embedding, and
        (batch, positions) word ids) → (batch, positions, output_dim), zeros at padding.

        Each distinct word of the batch goes through the CNN once (or comes from the cache in inference); with the
        plan's `every_position` every position goes through it, all its character slots: the same values, without
        shapes that depend on the data (nothing for the host to wait for). A word embedding joins each position's
        char-CNN output before the projection.
        """
        if self.plan.every_position:
            embedded = self._after_pooling(weights, self._convolve(weights, input_ids.flatten(0, 1)))
            if weights.word_embedding is not None:
                embedded = self._with_words(weights, embedded, word_input_ids.flatten())
            return embedded.view(*input_ids.shape[:2], -1) * mask[..., None]
        words, inverse = unique_rows(input_ids[mask])
        if self.cache is not None:
            embedded = self.cache.token_representations(
                words, weights.parameters(), lambda ids: self.embed_words(weights, ids), int8=self.plan.int8
            )
        else:
            embedded = self.embed_words(weights, words)
        embedded = embedded[inverse]
        if weights.word_embedding is not None:
            embedded = self._with_words(weights, embedded, word_input_ids[mask])
        output = embedded.new_zeros(*input_ids.shape[:2], weights.output_dim)
        return output.index_put((mask,), embedded)

    def embed_words(self, weights: CharCnnWeights, char_ids: torch.Tensor) -> torch.Tensor:
        """(words, chars) ids → (words, D), in chunks of `options.char_cnn_chunk` words: the token representations,
        or with a word embedding the highway's output (`_after_pooling`).

        Words are taken shortest first, and the convolutions of a chunk run per group of words of similar length,
        each cut after the character positions its longest word uses: short words do not pay for the long ones. A
        group closes where the length grows once it holds a 32nd of a chunk (fewer, larger matmuls).
        """
        if not len(char_ids):
            width = weights.output_dim if weights.word_embedding is None else weights.n_filters
            return weights.char_embedding.new_zeros(0, width)
        chunk = self.plan.options.char_cnn_chunk
        used = _used_positions(char_ids, weights.widest_filter, weights.padding_char_id)
        group = chunk // 32  # the words a group holds before it may close
        if len(char_ids) <= group:  # one group (e.g. one sentence): nothing to sort
            return self._after_pooling(weights, self._convolve(weights, char_ids[:, : int(used.max())]))
        used, order = used.sort(stable=True)
        char_ids, representations = char_ids[order], []
        for chunk_start in range(0, len(used), chunk):
            # Runs of words of one length, in increasing length (a few dozen at most, whatever the chunk size).
            widths, counts = torch.unique_consecutive(used[chunk_start : chunk_start + chunk], return_counts=True)
            start, end, pooled = chunk_start, chunk_start, []
            for run, (width, count) in enumerate(zip(widths.tolist(), counts.tolist())):
                end += count
                if end - start >= group or run == len(widths) - 1:
                    pooled.append(self._convolve(weights, char_ids[start:end, :width]))
                    start = end
            representations.append(self._after_pooling(weights, torch.cat(pooled)))
        return torch.cat(representations)[order.argsort()]

    def _convolve(self, weights: CharCnnWeights, char_ids: torch.Tensor) -> torch.Tensor:
        """(words, chars) ids → (words, n_filters): `convolve_pool_activate` (one matmul per filter bank over every
        window, faster than Conv1d on a CPU). Under autocast the embeddings are cast once, not each bank's windows."""
        chars = self.in_compute_dtype(F.embedding(char_ids, weights.char_embedding, weights.padding_idx))
        filters = [(self.weight(weight), self.weight(bias)) for weight, bias in weights.filters]
        return convolve_pool_activate(chars, filters, weights.activation, self._matmul)

    def _after_pooling(self, weights: CharCnnWeights, pooled: torch.Tensor) -> torch.Tensor:
        """(words, n_filters) → the highway layers, then the projection (words, output_dim); with a word embedding
        the highway's output (words, n_filters), projected by `_with_words`."""
        x = highway(pooled, weights.highway, self.linear)
        if weights.word_embedding is not None:
            return x
        return project_tokens(x, None, weights.projection, self.linear)

    def _with_words(self, weights: CharCnnWeights, highway_output: torch.Tensor, word_ids: torch.Tensor
                    ) -> torch.Tensor:
        """(tokens, n_filters) highway outputs and their (tokens,) word ids → (tokens, output_dim)."""
        words = self.in_compute_dtype(F.embedding(word_ids, weights.word_embedding, 0))
        return project_tokens(highway_output.to(words.dtype), words, weights.projection, self.linear)

    # -- the biLSTM ----------------------------------------------------------------------------------------------
    def lstm(
        self,
        weights: LstmWeights,
        inputs: torch.Tensor,
        mask: torch.Tensor,
        state: LayerState,
        return_state: bool = True,
    ) -> tuple[torch.Tensor, LayerState | None]:
        """Both directions of one LSTM layer over `inputs` (2, batch, steps, input_dim) in processing order (`mask`
        (batch, steps), its row lengths `self.lengths`). `state` = (h (2, batch, P), c (2, batch, D)). Returns the
        outputs (2, batch, steps, P), zeros where padded, and with `return_state` each row's state after its last
        step: what `ElmoLstmLayer.forward` computes.

        The fused recurrence reads the padded rows as they are, unless the final states of rows of different
        lengths are asked for; then it, like the step loop, needs the rows longest first (packed sequences, the
        active rows of a step a prefix): rows given in another order are sorted here and put back after."""
        lengths = self.lengths
        fused = self.plan.recurrence(weights) == "fused"
        if fused and not (return_state and len(set(lengths)) > 1):
            return self._padded_fused_recurrence(weights, inputs, mask, state, return_state)
        recurrence = self._fused_recurrence if fused else self._step_recurrence
        order = self._longest_first(inputs.device)
        if order is None:
            return recurrence(weights, inputs, lengths, state)
        rows, sorted_lengths, restore = order
        output, (h, c) = recurrence(weights, inputs[:, rows], sorted_lengths, (state[0][:, rows], state[1][:, rows]))
        return output[:, restore], (h[:, restore], c[:, restore])

    def _longest_first(self, device: torch.device) -> tuple[torch.Tensor, list[int], torch.Tensor] | None:
        """None for rows already longest first, else the index that sorts them, the sorted lengths and the index
        that puts them back; made once per call for every layer."""
        if "order" not in self._per_call:
            lengths = self.lengths
            order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
            self._per_call["order"] = None if order == list(range(len(lengths))) else (
                host_index(order, device), [lengths[i] for i in order], host_index(np.argsort(order), device))
        return self._per_call["order"]

    def step_forms(self, weights: LstmWeights, rows: int) -> StepForms:
        """The forms the step loop of `rows` rows reads the layer's (input, recurrent, projection) weights in, as the
        plan says (None: the weight itself):

        - under GPU autocast, with a cache: the input weight cast to the autocast dtype, the step weights cast and
          transposed to (2, K, N), made once;
        - float32 on a CPU, a one-row call whose step weights all take the batched-MKL step (`batched_step`): those
          two transposed to contiguous (2, K, N), only from the cache (a copy per call costs about what it saves);
        - oneDNN float32: the step weights packed per direction, never the input weight (one matmul per window,
          where a pack gains little);
        - the bf16 mode where oneDNN packs bf16 weights: all three packed per direction in bf16, which autocast
          would otherwise cast again at every call and step;
        - the int8 mode: all three per direction as `Int8Weight`s, the input weight's with the layer's bias; the
          step weights of a one-row call that takes the batched-MKL step stay float32, as above (faster there).
        """
        plan, cache = self.plan, self.cache
        weights_in_order = (weights.input_weight, weights.recurrent_weight, weights.projection_weight)
        step_weights = [w for w in weights_in_order[1:] if w is not None]
        batched_steps = all(plan.batched_step(rows, w) for w in step_weights)
        if plan.int8:
            input_form = quantized(cache, weights.input_weight, with_bias=weights)
            if batched_steps:  # one matmul for both directions beats two int8 ones on weights this small
                return [input_form, *(None if w is None or cache is None else transposed(cache, w)
                                      for w in weights_in_order[1:])]
            return [input_form, *(None if w is None else quantized(cache, w) for w in weights_in_order[1:])]
        if plan.device.type == "cuda" and plan.compute_dtype is not None:
            if cache is None:
                return [None, None, None]
            return [cast(cache, weights.input_weight, plan.compute_dtype),
                    *(None if w is None else cast(cache, w, plan.compute_dtype, transpose=True)
                      for w in weights_in_order[1:])]
        if plan.cpu_float32 and batched_steps:
            return [None, *(None if w is None or cache is None else transposed(cache, w)
                            for w in weights_in_order[1:])]
        if plan.onednn:
            return [None, *(None if w is None else packed(cache, w, torch.float32) for w in weights_in_order[1:])]
        if plan.bf16_packs:
            return [None if w is None else packed(cache, w, torch.bfloat16) for w in weights_in_order]
        return [None, None, None]

    def _step_recurrence(
        self, weights: LstmWeights, inputs: torch.Tensor, lengths: Sequence[int], state: LayerState
    ) -> tuple[torch.Tensor, LayerState]:
        """The step loop over rows longest first: at step t only the `batch_sizes[t]` rows still active are computed."""
        plan = self.plan
        _, batch, steps, _ = inputs.shape
        batch_sizes = [sum(1 for n in lengths if n > t) for t in range(steps)]
        started = batch_sizes[0] if steps else 0  # rows with at least one position
        h, c = state[0][:, :started], state[1][:, :started]
        input_form, recurrent_form, projection_form = self.step_forms(weights, inputs.shape[1])
        bias = weights.bias_with_forget_bias()

        def project(h: torch.Tensor) -> torch.Tensor:
            return both_directions(h, weights.projection_weight, projection_form, plan)

        outputs, finished_h, finished_c = [], [], []
        for start in range(0, steps, plan.options.lstm_time_chunk):
            active = batch_sizes[start]
            if active == 0:
                break
            window = inputs[:, :active, start : start + plan.options.lstm_time_chunk]
            # Input projections of every step of the window in one matmul per direction, then per step: (active, 4D).
            input_weight = weights.input_weight if input_form is None else input_form
            step_bias = None if plan.int8 else bias  # the int8 input weights add it themselves (`step_forms`)
            projected = [linear(window[d], input_weight[d], None if step_bias is None else step_bias[d], plan
                                ).unbind(1) for d in range(2)]
            for offset in range(window.shape[2]):
                n = batch_sizes[start + offset]
                if n == 0:
                    break
                if n < h.shape[1]:  # rows n.. ended at the previous step: keep their final state
                    finished_h.append(h[:, n:])
                    finished_c.append(c[:, n:])
                    h, c = h[:, :n], c[:, :n]
                step_input = [projected[d][offset][:n] for d in range(2)]
                # Gate pre-activations (2, n, 4D).
                gates = both_directions(h, weights.recurrent_weight, recurrent_form, plan, add=step_input)
                h, c = lstm_cell(weights, gates, c, project)
                outputs.append(h if n == batch else F.pad(h, (0, 0, 0, batch - n)))
        if not outputs:
            return inputs.new_zeros(2, batch, steps, state[0].shape[-1]), state
        # Rows are sorted by length: those still active come first, then those that ended latest.
        final_h = torch.cat([h, *reversed(finished_h), state[0][:, started:]], dim=1)
        final_c = torch.cat([c, *reversed(finished_c), state[1][:, started:]], dim=1)
        output = torch.stack(outputs, dim=2)
        if output.shape[2] < steps:
            output = F.pad(output, (0, 0, 0, steps - output.shape[2]))
        return output, (final_h, final_c)


    def _padded_fused_recurrence(
        self, weights: LstmWeights, inputs: torch.Tensor, mask: torch.Tensor, state: LayerState, return_state: bool
    ) -> tuple[torch.Tensor, LayerState | None]:
        """`nn.LSTM` (cuDNN on a GPU) over the padded rows in their order: in processing order every padded position
        comes after its row's real ones, so it changes no real output (its own outputs are zeroed). No sorting and no
        packing: nothing is copied from the host, and no kernels per distinct length. The final state is the LSTM's,
        right when every row has the same length (`lstm` asks for it only then)."""
        _, batch, steps, _ = inputs.shape
        longest = max(self.lengths, default=0)
        if longest == 0:
            zeros = inputs.new_zeros(2, batch, steps, weights.recurrent_weight.shape[2])
            return zeros, state if return_state else None
        lstm = self._fused_lstm(weights, inputs)
        outputs, final_h, final_c = [], [], []
        for d in range(2):
            initial = (state[0][d : d + 1].contiguous(), state[1][d : d + 1].contiguous())
            output, (h, c) = lstm(d, inputs[d, :, :longest], initial)
            outputs.append(output)
            final_h.append(h[0])
            final_c.append(c[0])
        output = torch.stack(outputs) * self._padding_mask(mask, longest, outputs[0].dtype)
        if longest < steps:
            output = F.pad(output, (0, 0, 0, steps - longest))
        return output, (torch.stack(final_h), torch.stack(final_c)) if return_state else None

    def _padding_mask(self, mask: torch.Tensor, longest: int, dtype: torch.dtype) -> torch.Tensor:
        """(batch, longest, 1): 1 at real positions, 0 at padding, in `dtype`; made once per call for every layer."""
        key = ("mask", longest, dtype)
        if key not in self._per_call:
            self._per_call[key] = mask[:, :longest, None].to(dtype)
        return self._per_call[key]

    def _fused_recurrence(
        self, weights: LstmWeights, inputs: torch.Tensor, lengths: Sequence[int], state: LayerState
    ) -> tuple[torch.Tensor, LayerState]:
        """`nn.LSTM` per direction over packed sequences (rows longest first), for the final state of each row after
        its own last step."""
        _, batch, steps, _ = inputs.shape
        started = sum(1 for n in lengths if n > 0)  # nn.LSTM takes no empty rows: they keep zeros and their state
        if started == 0:
            return inputs.new_zeros(2, batch, steps, weights.recurrent_weight.shape[2]), state
        lstm = self._fused_lstm(weights, inputs)
        row_lengths = torch.tensor(lengths[:started])  # on the host, where packing reads them
        outputs, final_h, final_c = [], [], []
        for d in range(2):
            packed = nn.utils.rnn.pack_padded_sequence(inputs[d, :started], row_lengths, batch_first=True)
            initial = (state[0][d : d + 1, :started].contiguous(), state[1][d : d + 1, :started].contiguous())
            output, (h, c) = lstm(d, packed, initial)
            output, _ = nn.utils.rnn.pad_packed_sequence(output, batch_first=True, total_length=steps)
            outputs.append(F.pad(output, (0, 0, 0, 0, 0, batch - started)))
            final_h.append(torch.cat([h[0], state[0][d, started:]]))
            final_c.append(torch.cat([c[0], state[1][d, started:]]))
        return torch.stack(outputs), (torch.stack(final_h), torch.stack(final_c))

    def _fused_lstm(self, weights: LstmWeights, inputs: torch.Tensor) -> Callable:
        """`run(direction, inputs, (h0, c0))`: the `nn.LSTM(proj_size=P)` of one direction of the layer without its
        clipping. In inference with a cache, the cache keeps each direction's `nn.LSTM` with its weights flat in
        cuDNN's layout (in the autocast dtype under GPU autocast); else the weights are gathered into its layout at
        every call."""
        if self.cache is not None:
            dtype = self.plan.compute_dtype if self.plan.device.type == "cuda" else None
            lstms = fused_lstms(self.cache, weights, dtype)
            return lambda d, x, initial: lstms[d](x, initial)
        gathered = fused_lstm_weights(weights)

        def run(d: int, x: torch.Tensor | nn.utils.rnn.PackedSequence, initial: tuple) -> tuple:
            with warnings.catch_warnings():  # gathered at each call (gate order): they cannot be flat
                warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")
                return torch.func.functional_call(_meta_lstm(weights), gathered[d], (x, initial))

        return run
