"""The fast forms of the biLM's arithmetic on each device (`ElmoConfig.implementation = "kernels"`, the default).

`modeling_elmo.py` says what the biLM computes: each block's `forward` is the paper's computation written plainly.
When the config asks for the kernels, `ElmoModel.forward` makes one `ElmoKernels` per call from the config's
`ElmoKernelOptions`, the inputs and the caller's `ElmoInferenceCache`, and hands it each block's weights as a record
(`CharCnnWeights`, `LstmWeights`): the kernels never reach into a module, and nothing here imports the model.

- `ElmoKernels.token_representations`: the char CNN over each distinct word of the batch once (or from the cache),
  the words grouped by length so that short words do not pay for long ones; its matmuls through `linear`.
- `ElmoKernels.lstm`: one biLSTM layer through one of two recurrences, chosen once per call: the step loop over the
  rows still active (`both_directions` per step, its weights packed for oneDNN or transposed), or `nn.LSTM` (cuDNN
  on a GPU, its weights kept in cuDNN's flat layout by the cache). Each sorts the rows as it needs them.
- `linear`: float32 matmuls on CPU through oneDNN where this torch build has its linear ops, else `F.linear`; in the
  opt-in bf16 mode (inference under CPU bf16 autocast) with weights packed in bf16 once.

`ElmoInferenceCache` holds what inference may keep between calls (token representations of frequent words, packed,
transposed and flat copies of the weights), explicit and thread-safe. None of this changes the function computed
beyond float32 rounding, except the fused LSTM on a model that clips (opt-in: `fused_lstm="always"`) and the bf16
mode (opt-in: the caller's `torch.autocast`). Why each default: docs/performance.md.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .configuration_elmo import ElmoKernelOptions, integer_problem
from .runtime import bf16_weight_packing, intel_cpu, native_bf16_cpu, onednn_available, warn

# (h, c) of one layer: h (2, batch, P), c (2, batch, D); direction 0 is the forward LM, 1 the backward LM.
LayerState = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class CharCnnWeights:
    """What the kernels read of the char CNN (`ElmoCharCNN.weights()`): the parameters themselves, never copies.

    char_embedding (n_characters, char_dim), its row `padding_idx` all zeros; word_embedding (word_vocab_size,
    word_dim) or None (no word embedding); filters: per bank the Conv1d weight (n_filters, char_dim, width) and bias
    (n_filters,); highway: per layer the (2F, F) weight (transform, then gate) and (2F,) bias; projection: (P,
    word_dim + F) weight and (P,) bias, None without a projection (`ElmoConfig.projects_tokens`); `padding_char_id`
    fills a word's row after its end-of-word character.
    """

    char_embedding: torch.Tensor
    padding_idx: int
    word_embedding: torch.Tensor | None
    filters: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    activation: str
    highway: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    projection: tuple[torch.Tensor, torch.Tensor] | None
    padding_char_id: int

    @property
    def n_filters(self) -> int:
        return sum(weight.shape[0] for weight, _ in self.filters)

    @property
    def output_dim(self) -> int:
        """Width of a token representation: the projection's, else the word embedding's and the filters'."""
        if self.projection is not None:
            return self.projection[0].shape[0]
        return self.n_filters + (0 if self.word_embedding is None else self.word_embedding.shape[1])

    @property
    def widest_filter(self) -> int:
        return max(weight.shape[2] for weight, _ in self.filters)

    def parameters(self) -> list[torch.Tensor]:
        """Every tensor the token representations depend on."""
        pairs = [*self.filters, *self.highway, *([self.projection] if self.projection is not None else [])]
        words = [] if self.word_embedding is None else [self.word_embedding]
        return [self.char_embedding, *words, *(tensor for pair in pairs for tensor in pair)]


@dataclass(frozen=True)
class LstmWeights:
    """What the kernels read of one biLSTM layer (`ElmoLstmLayer.weights()`), both directions stacked on a leading
    axis, gate blocks in TensorFlow's order (input, candidate, forget, output): input_weight (2, 4D, K),
    recurrent_weight (2, 4D, P), bias (2, 4D) as stored (`forget_bias` is added to the forget gate at run time),
    projection_weight (2, P, D) or None (no projection when P == D); the clips, None where the layer does not clip."""

    input_weight: torch.Tensor
    recurrent_weight: torch.Tensor
    bias: torch.Tensor
    projection_weight: torch.Tensor | None
    cell_clip: float | None
    proj_clip: float | None
    forget_bias: float

    @property
    def clipped(self) -> bool:
        return self.cell_clip is not None or self.proj_clip is not None

    def parameters(self) -> list[torch.Tensor]:
        """Every weight of the layer."""
        return [w for w in (self.input_weight, self.recurrent_weight, self.bias, self.projection_weight)
                if w is not None]

    def bias_with_forget_bias(self) -> torch.Tensor:
        """(2, 4D) bias with `forget_bias` added to the forget gate (gates i, j, f, o)."""
        cell = self.bias.shape[1] // 4
        return torch.cat([self.bias[:, : 2 * cell], self.bias[:, 2 * cell : 3 * cell] + self.forget_bias,
                          self.bias[:, 3 * cell :]], dim=1)


def uses_onednn(options: ElmoKernelOptions) -> bool:
    """Whether CPU float32 inference matmuls go through oneDNN (where this torch build has it)."""
    return not intel_cpu() if options.onednn == "auto" else options.onednn


def recurrence_for(options: ElmoKernelOptions, device: torch.device, clipped: bool) -> str:
    """The LSTM loop the kernels take on `device` for a biLSTM that clips (`clipped`) or not: `"fused"` (`nn.LSTM`,
    cuDNN on a GPU) or `"steps"` (the step loop over the active rows)."""
    if options.fused_lstm == "auto":
        return "fused" if device.type == "cuda" and not clipped else "steps"
    return "fused" if options.fused_lstm == "always" else "steps"


def uses_distinct_words(options: ElmoKernelOptions, device: torch.device) -> bool:
    """Whether the char CNN runs on each distinct word once on `device` (else on every position)."""
    return device.type != "cuda" if options.distinct_words == "auto" else options.distinct_words


def uses_batched_step(options: ElmoKernelOptions, rows: int, weight: torch.Tensor) -> bool:
    """Whether an LSTM step of `rows` rows with this (2, N, K) weight takes one batched MKL matmul for both directions
    rather than oneDNN: a single row and at most `single_row_bmm_max_weight` elements per direction."""
    return rows == 1 and weight.shape[1] * weight.shape[2] <= options.single_row_bmm_max_weight  # no tensor op


def onednn_usable(x: torch.Tensor, weight: torch.Tensor, options: ElmoKernelOptions) -> bool:
    """Whether `linear(x, weight)` runs through oneDNN: eager CPU float32 without gradient or autocast."""
    return (
        _eager_cpu_inference(x, weight)
        and uses_onednn(options)
        and x.dtype == weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


def bf16_autocast_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x @ weight` belongs to the opt-in CPU bf16 mode: eager CPU inference without gradient under
    `torch.autocast("cpu", dtype=torch.bfloat16)`. There the LSTM step weights are packed for oneDNN in bf16 once
    (`packed_lstm_weights`) rather than cast by autocast at every step."""
    return (
        _eager_cpu_inference(x, weight)
        and torch.is_autocast_enabled("cpu")
        and torch.get_autocast_dtype("cpu") == torch.bfloat16
    )


def cuda_autocast_inference(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype when `x @ weight` runs on a GPU under autocast without gradient (the weights are then cast
    once and kept by the cache, rather than cast by autocast at every call and step), else None."""
    if (x.device.type != "cuda" or not torch.is_autocast_enabled("cuda")
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        return None
    return torch.get_autocast_dtype("cuda")


def _inference_autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The dtype autocast computes `x`'s matmuls in, for inference under a GPU's autocast or the CPU's bf16 mode;
    None otherwise."""
    cast = cuda_autocast_inference(x, x)
    return torch.bfloat16 if cast is None and bf16_autocast_inference(x, x) else cast


def _eager_cpu_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """This torch build has oneDNN's linear ops, CPU, no gradient needed."""
    return (
        onednn_available()
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    options: ElmoKernelOptions,
    add: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (..., K) @ weight (N, K)ᵀ + bias (N) + add (..., N) → (..., N). `weight` may be `pack_weight`'s (then the
    result has its dtype)."""
    if weight.is_mkldnn and weight.dtype != torch.float32:  # a bf16 pack (the bf16 mode): operands to its dtype
        x = x.to(weight.dtype)
        bias = None if bias is None else bias.to(weight.dtype)
        add = None if add is None else add.to(weight.dtype)
    if weight.is_mkldnn or onednn_usable(x, weight, options):
        if add is not None:
            return torch.ops.mkldnn._linear_pointwise.binary(x, add, weight, bias, "add")
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    output = F.linear(x, weight, bias)
    return output if add is None else output + add


def pack_weight(weight: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(N, K) weight → a copy in `dtype` in oneDNN's blocked layout for `linear`: the same results, and without the
    per-call reordering (faster for matmuls of few rows, as in the LSTM recurrence: docs/performance.md)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype))


# Per weight, its packed (N, K) matrices (one per direction of a (2, N, K) weight, one for an (N, K) weight), or a
# (2, N, K) weight transposed to a contiguous (2, K, N) for the batched matmul; None where a weight is absent.
PackedWeights = list[list[torch.Tensor] | torch.Tensor | None]


def packed_lstm_weights(
    weights: Sequence[torch.Tensor | None],
    x: torch.Tensor,
    options: ElmoKernelOptions,
    inference_cache: ElmoInferenceCache | None,
) -> PackedWeights | None:
    """An LSTM layer's (2, N, K) weights (input, recurrent, projection) in the form its matmuls for `x` (2, rows,
    steps, K) read fastest, else None: from `inference_cache` when given, else made for this call (one copy serves
    every step).

    - float32, a one-row call whose step weights (recurrent, projection) all take the batched-MKL step
      (`uses_batched_step`): those two transposed to contiguous (2, K, N), only from `inference_cache` (a copy per
      call costs about what it saves over the transposed view).
    - float32 (`onednn_usable`): the step weights packed per direction, never the input weight (one matmul per
      window, where a pack gains little).
    - bf16 autocast (`bf16_autocast_inference`) where oneDNN packs bf16 (`runtime.bf16_weight_packing`): all three
      packed per direction in bf16, which autocast would otherwise cast again at every call and step.
    - a GPU under autocast (`cuda_autocast_inference`), with `inference_cache`: the input weight cast to the autocast
      dtype and the step weights cast and transposed to (2, K, N), made once.
    """
    _, *step_weights = weights
    present = [w for w in step_weights if w is not None]
    if not present:
        return None
    cast = cuda_autocast_inference(x, present[0])
    if cast is not None:
        if inference_cache is None:
            return None
        return [inference_cache.cast_weight(weights[0], cast),
                *(None if w is None else inference_cache.cast_weight(w, cast, transposed=True) for w in step_weights)]
    if (
        _eager_cpu_inference(x, present[0])
        and not torch.is_autocast_enabled("cpu")
        and x.dtype == present[0].dtype == torch.float32
        and all(uses_batched_step(options, x.shape[1], w) for w in present)
    ):
        return None if inference_cache is None else [None, *inference_cache.transposed_weights(step_weights)]
    if onednn_usable(x, present[0], options):
        weights, dtype = [None, *step_weights], torch.float32
    elif bf16_autocast_inference(x, present[0]) and bf16_weight_packing():
        dtype = torch.bfloat16
    else:
        return None
    if inference_cache is not None:
        return inference_cache.packed_weights(weights, dtype)
    return [[pack_weight(d, dtype) for d in w.unbind()] if w is not None else None for w in weights]


def packed_linear_weight(
    weight: torch.Tensor, x: torch.Tensor, inference_cache: ElmoInferenceCache | None
) -> torch.Tensor:
    """A linear layer's (N, K) weight as `linear(x, ...)` reads it: in the bf16 mode (`bf16_autocast_inference`)
    where oneDNN packs bf16, packed once in bf16 by `inference_cache`, which autocast would otherwise cast again at
    every call, else `weight` itself (in float32 a packed copy gains nothing measurable: docs/performance.md)."""
    if inference_cache is None:
        return weight
    cast = cuda_autocast_inference(x, weight)
    if cast is not None:  # on a GPU under autocast: cast once (autocast casts again at every call)
        return inference_cache.cast_weight(weight, cast)
    if not (bf16_autocast_inference(x, weight) and bf16_weight_packing()):
        return weight
    return inference_cache.packed_weights([weight], torch.bfloat16)[0][0]


def both_directions(
    x: torch.Tensor,
    weight: torch.Tensor,
    packed: list[torch.Tensor] | torch.Tensor | None,
    options: ElmoKernelOptions,
    add: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """x (2, n, K) @ weight (2, N, K)ᵀ per direction, + add (one (n, N) per direction) → (2, n, N).

    `packed` is `packed_lstm_weights`' form of `weight`. Through oneDNN with directions packed for it (in their
    dtype); else one batched matmul (MKL), reading `packed` where it is the (2, K, N) transposed copy: without a
    packed form, and for float32 where `uses_batched_step` (a single row and a small weight: oneDNN's fixed
    cost per call would dominate).
    """
    if isinstance(packed, list) and (
        packed[0].dtype != torch.float32 or not uses_batched_step(options, x.shape[1], weight)
    ):
        return torch.stack([linear(x[d], packed[d], None, options, add=None if add is None else add[d])
                            for d in range(2)])
    transposed = packed if isinstance(packed, torch.Tensor) else weight.transpose(1, 2)
    if add is None:
        return torch.bmm(x, transposed)
    return torch.baddbmm(torch.stack(add), x, transposed)


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


def _cell(
    weights: LstmWeights, gates: torch.Tensor, c: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor]
) -> LayerState:
    """One step of both directions from the gate pre-activations (2, n, 4D), forget bias included, and the cell
    c (2, n, D): the new (h (2, n, P), c), clipped where the layer clips; `project` maps h (2, n, D) → (2, n, P)."""
    cell = c.shape[-1]
    candidate = torch.tanh(gates[..., cell : 2 * cell])
    input_gate, _, forget_gate, output_gate = torch.sigmoid(gates).chunk(4, dim=-1)
    c = torch.addcmul(forget_gate * c, input_gate, candidate)
    if weights.cell_clip is not None:
        c = c.clamp(-weights.cell_clip, weights.cell_clip)
    h = output_gate * torch.tanh(c)
    if weights.projection_weight is not None:
        h = project(h)
    if weights.proj_clip is not None:
        h = h.clamp(-weights.proj_clip, weights.proj_clip)
    return h, c


class ElmoKernels:
    """How one forward pass of a biLM runs, decided when it starts from the config's `options`, its inputs (their
    device, the autocast in force), the rows' lengths on the host and the caller's `inference_cache`, which it reads
    and fills. `ElmoModel.forward` makes it (never while a compiler traces: then the blocks' own `forward` runs).

    `every_position`: the char CNN runs on every position, all its character slots (on a GPU by default), rather than
    on each distinct word once.
    """

    def __init__(
        self,
        options: ElmoKernelOptions,
        input_ids: torch.Tensor,
        lengths: Sequence[int],
        inference_cache: ElmoInferenceCache | None = None,
    ):
        self.options = options
        self.cache = inference_cache
        self.lengths = list(lengths)
        self.device = input_ids.device
        self.every_position = not uses_distinct_words(options, input_ids.device)
        self._per_call: dict[object, object] = {}  # what a call makes once for all its layers
        if (input_ids.device.type == "cpu" and torch.is_autocast_enabled("cpu")
                and torch.get_autocast_dtype("cpu") == torch.bfloat16 and not native_bf16_cpu()):
            warn("the biLM runs in bf16 (CPU bf16 autocast), but this CPU has no native bf16 (AVX512-BF16 or AMX): "
                 "it is emulated, several times slower than float32")

    # -- linear layers -------------------------------------------------------------------------------------------
    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: bool = True
    ) -> torch.Tensor:
        """x (..., K) @ weight (N, K)ᵀ + bias (N) → (..., N). In the bf16 mode a `packed` weight (one of the
        model's parameters, not a view made per call) is read from a bf16 copy the cache packs once; under GPU
        autocast the cache's cast copies of weight and bias are read."""
        weight = packed_linear_weight(weight, x, self.cache) if packed else weight
        return linear(x, weight, None if bias is None else self.weight(bias), self.options)

    def weight(self, parameter: torch.Tensor) -> torch.Tensor:
        """A parameter as this call's arithmetic reads it: under autocast (a GPU's, or the CPU's bf16 mode) without
        gradient, its copy in the autocast dtype (activations computed from a float32 parameter would come out in
        float32, to be cast again), cast once by the cache if there is one; else itself."""
        cast = _inference_autocast_dtype(parameter)
        if cast is None:
            return parameter
        return parameter.to(cast) if self.cache is None else self.cache.cast_weight(parameter, cast)

    def in_compute_dtype(self, x: torch.Tensor) -> torch.Tensor:
        """Activations `x` in the dtype the matmuls under autocast (a GPU's, or the CPU's bf16 mode) read, without
        gradient; else `x` itself."""
        cast = _inference_autocast_dtype(x)
        return x if cast is None else x.to(cast)

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

        Each distinct word of the batch goes through the CNN once (or comes from the cache when no gradient is
        needed); with `every_position` every position goes through it, all its character slots: the same values,
        without shapes that depend on the data (nothing for the host to wait for). A word embedding joins each
        position's char-CNN output before the projection.
        """
        if self.every_position:
            embedded = self._after_pooling(weights, self._convolve(weights, input_ids.flatten(0, 1)))
            if weights.word_embedding is not None:
                embedded = self._with_words(weights, embedded, word_input_ids.flatten())
            return embedded.view(*input_ids.shape[:2], -1) * mask[..., None]
        words, inverse = unique_rows(input_ids[mask])
        needs_grad = torch.is_grad_enabled() and any(p.requires_grad for p in weights.parameters())
        if self.cache is not None and not needs_grad:
            embedded = self.cache.token_representations(
                words, weights.parameters(), lambda ids: self.embed_words(weights, ids)
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
        chunk = self.options.char_cnn_chunk
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
        """(words, chars) ids → (words, n_filters): every filter bank as one matmul of every window (words, windows,
        char_dim * width) with the filters (n_filters, char_dim * width), the layout of Conv1d's weight (faster
        than Conv1d on a CPU); max-pooled, then the bias (the same maximum as adding it to every window first, as
        rounding is monotonic) and the activation. Under autocast the embeddings are cast once, not each bank's
        windows."""
        chars = self.in_compute_dtype(F.embedding(char_ids, weights.char_embedding, weights.padding_idx))
        activation = torch.tanh if weights.activation == "tanh" else F.relu
        pooled = []
        for weight, bias in weights.filters:
            windows = chars.unfold(1, weight.shape[2], 1).flatten(2)
            scores = self.linear(windows, self.weight(weight).flatten(1), packed=False)
            pooled.append(activation(scores.amax(dim=1) + self.weight(bias)))
        return torch.cat(pooled, dim=-1)

    def _after_pooling(self, weights: CharCnnWeights, pooled: torch.Tensor) -> torch.Tensor:
        """(words, n_filters) → the highway layers, then the projection (words, output_dim); with a word embedding
        the highway's output (words, n_filters), projected by `_with_words`."""
        x = pooled
        for weight, bias in weights.highway:
            transform, carry = self.linear(x, weight, bias).chunk(2, dim=-1)
            gate = torch.sigmoid(carry)
            x = gate * F.relu(transform) + (1 - gate) * x
        if weights.word_embedding is not None or weights.projection is None:
            return x
        return self.linear(x, *weights.projection)

    def _with_words(self, weights: CharCnnWeights, highway: torch.Tensor, word_ids: torch.Tensor) -> torch.Tensor:
        """(tokens, n_filters) highway outputs and their (tokens,) word ids → (tokens, output_dim): each word's vector
        before its highway output, projected."""
        words = self.in_compute_dtype(F.embedding(word_ids, weights.word_embedding, 0))
        x = torch.cat([words, highway.to(words.dtype)], dim=-1)
        return x if weights.projection is None else self.linear(x, *weights.projection)

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
        fused = recurrence_for(self.options, self.device, weights.clipped) == "fused"
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

    def _step_recurrence(
        self, weights: LstmWeights, inputs: torch.Tensor, lengths: Sequence[int], state: LayerState
    ) -> tuple[torch.Tensor, LayerState]:
        """The step loop over rows longest first: at step t only the `batch_sizes[t]` rows still active are computed."""
        options = self.options
        _, batch, steps, _ = inputs.shape
        batch_sizes = [sum(1 for n in lengths if n > t) for t in range(steps)]
        started = batch_sizes[0] if steps else 0  # rows with at least one position
        h, c = state[0][:, :started], state[1][:, :started]
        packed_input, packed_recurrent, packed_projection = packed_lstm_weights(
            (weights.input_weight, weights.recurrent_weight, weights.projection_weight), inputs, options, self.cache
        ) or (None, None, None)
        bias = weights.bias_with_forget_bias()

        def project(h: torch.Tensor) -> torch.Tensor:
            return both_directions(h, weights.projection_weight, packed_projection, options)

        outputs, finished_h, finished_c = [], [], []
        for start in range(0, steps, options.lstm_time_chunk):
            active = batch_sizes[start]
            if active == 0:
                break
            window = inputs[:, :active, start : start + options.lstm_time_chunk]
            # Input projections of every step of the window in one matmul per direction, then per step: (active, 4D).
            input_weight = weights.input_weight if packed_input is None else packed_input
            projected = [linear(window[d], input_weight[d], bias[d], options).unbind(1) for d in range(2)]
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
                gates = both_directions(h, weights.recurrent_weight, packed_recurrent, options, add=step_input)
                h, c = _cell(weights, gates, c, project)
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
        clipping. Without gradients for the weights, the cache keeps each direction's `nn.LSTM` with its weights
        flat in cuDNN's layout (in the autocast dtype under GPU autocast); with them, the weights are gathered into
        its layout at every call."""
        weights_need_grad = torch.is_grad_enabled() and any(p.requires_grad for p in weights.parameters())
        if self.cache is not None and not weights_need_grad:
            lstms = self.cache.fused_lstms(weights, cuda_autocast_inference(inputs, weights.input_weight))
            return lambda d, x, initial: lstms[d](x, initial)
        gathered = fused_lstm_weights(weights)

        def run(d: int, x: torch.Tensor | nn.utils.rnn.PackedSequence, initial: tuple) -> tuple:
            with warnings.catch_warnings():  # gathered at each call (gate order): they cannot be flat
                warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")
                return torch.func.functional_call(_meta_lstm(weights), gathered[d], (x, initial))

        return run


def host_index(values: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Integers made on the host (a sequence, or a CPU tensor) as an index on `device`. To a GPU from page-locked
    memory without waiting: a plain `torch.tensor(values, device=...)` is a copy the host waits for."""
    index = torch.as_tensor(values, dtype=torch.long)
    if device.type == "cpu":
        return index
    return (index.pin_memory() if device.type == "cuda" and torch.cuda.is_available() else index).to(
        device, non_blocking=True)


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


def _weights_state(parameters: Sequence[torch.Tensor]) -> tuple:
    """What identifies the values of `parameters` without reading them: in-place updates bump `_version`,
    optimizers that assign `.data` (e.g. Thinc's) change the address."""
    return tuple((p.data_ptr(), p._version, p.dtype, p.device, p.shape) for p in parameters)


class ElmoInferenceCache:
    """What inference may keep between calls of a biLM; pass it as `model(..., inference_cache=cache)`.

    - token representations (char CNN, highway, projection) of the `token_cache_size` most recently seen distinct
      words (0: none), so frequent words skip the char CNN. Used only for calls without gradient through the char
      CNN; emptied whenever a char-CNN weight, the device, the dtype or the autocast setting changes.
    - the LSTM step weights packed for oneDNN (`pack_weight`), or transposed for the batched matmul of one-row
      steps; in the bf16 mode every LSTM weight and the char CNN's highway and projection packed in bf16. Made again
      whenever a weight changes.

    Changes the weights' version counters and addresses show are followed; after changes made outside torch (e.g.
    through a NumPy view of their memory) call `clear()`. Thread-safe: callers in several threads may share one
    cache (lookups and updates under a lock, the computation outside it). One cache per model keeps it small;
    copies and pickles of a cache are empty.
    """

    def __init__(self, token_cache_size: int = 20_000):
        if problem := integer_problem(token_cache_size, 0):
            raise ValueError(f"token_cache_size {problem}")
        self.token_cache_size = token_cache_size
        self._lock = threading.Lock()
        self._tokens: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._tokens_state: tuple = ()
        # (id(weight), form: the dtype of a pack or "transposed") → (a weak reference to the weight, its state when
        # the form was made, the form: packed matrices or the transposed copy)
        self._packed: dict[tuple[int, object], tuple[weakref.ref, tuple, object]] = {}

    def __len__(self) -> int:
        """Words whose token representation is cached."""
        return len(self._tokens)

    def __getstate__(self) -> dict:
        return {"token_cache_size": self.token_cache_size}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["token_cache_size"])

    def clear(self) -> None:
        """Forget every cached token representation and packed weight (also frees their memory)."""
        with self._lock:
            self._tokens.clear()
            self._packed.clear()

    def token_representations(
        self, char_ids: torch.Tensor, parameters: Sequence[torch.Tensor], embed: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """(words, chars) distinct words' ids → `embed(ids)` (words, width), reading and filling the cache;
        `parameters` are those `embed` depends on."""
        if self.token_cache_size == 0 or not len(char_ids):
            return embed(char_ids)
        device = char_ids.device.type
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        state = (autocast, _weights_state(parameters))
        keys = [row.tobytes() for row in char_ids.cpu().numpy()]
        with self._lock:
            if state != self._tokens_state:
                self._tokens.clear()
                self._tokens_state = state
            found = {key: self._tokens[key] for key in keys if key in self._tokens}
        missing = [i for i, key in enumerate(keys) if key not in found]
        if missing:
            found.update((keys[i], vector.clone()) for i, vector in zip(missing, embed(char_ids[missing])))
        with self._lock:
            if state == self._tokens_state:  # not if the weights changed meanwhile
                for key in keys:  # most recently used last (other threads may have evicted some meanwhile)
                    self._tokens[key] = found[key]
                    self._tokens.move_to_end(key)
                while len(self._tokens) > self.token_cache_size:
                    self._tokens.popitem(last=False)
        return torch.stack([found[key] for key in keys])

    def packed_weights(self, weights: Sequence[torch.Tensor | None], dtype: torch.dtype) -> PackedWeights:
        """Each (2, N, K) weight as its directions' (N, K) matrices, each (N, K) weight as one matrix, packed in
        `dtype` (`pack_weight`); None where a weight is absent."""
        return [
            None if weight is None else self._derived(
                [weight], dtype, lambda w: [pack_weight(m, dtype) for m in (w.unbind() if w.dim() == 3 else [w])]
            )
            for weight in weights
        ]

    def transposed_weights(self, weights: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Each (2, N, K) weight as a contiguous (2, K, N) copy, for `both_directions`' batched matmul."""
        return [
            None if weight is None else self._derived([weight], "transposed", lambda w: w.detach().mT.contiguous())
            for weight in weights
        ]

    def cast_weight(self, weight: torch.Tensor, dtype: torch.dtype, transposed: bool = False) -> torch.Tensor:
        """A copy of `weight` in `dtype` (a (2, N, K) weight as a contiguous (2, K, N) with `transposed`, for
        `both_directions`), for matmuls under GPU autocast."""
        return self._derived([weight], ("cast", dtype, transposed),
                             lambda w: (w.detach().mT if transposed else w.detach()).to(dtype).contiguous())

    def fused_lstms(self, weights: LstmWeights, dtype: torch.dtype | None = None) -> list[nn.LSTM]:
        """The `nn.LSTM` of each direction of an LSTM layer (`fused_lstm_weights`), in `dtype` (default: the layer's;
        under GPU autocast its dtype, which autocast would otherwise cast the weights to at every call), its weights in
        one contiguous block in cuDNN's layout (`flatten_parameters`): made once, remade when a weight changes."""
        dtype = dtype or weights.input_weight.dtype

        def make(_) -> list[nn.LSTM]:
            lstms = []
            with torch.no_grad():
                for state in fused_lstm_weights(weights):
                    lstm = _meta_lstm(weights).to_empty(device=weights.input_weight.device).to(dtype)
                    lstm.requires_grad_(False).load_state_dict(state)
                    lstm.flatten_parameters()
                    lstms.append(lstm)
            return lstms

        return self._derived(weights.parameters(), ("fused", dtype), make)

    def _derived(self, weights: Sequence[torch.Tensor], form: object, make: Callable[[torch.Tensor], object]) -> object:
        """`make(weights[0])`, made once per weight and `form` and again when any of `weights` changes."""
        state = _weights_state(weights)
        key = (id(weights[0]), form)
        with self._lock:
            entry = self._packed.get(key)
        if entry is None or entry[0]() is not weights[0] or entry[1] != state:
            entry = (weakref.ref(weights[0]), state, make(weights[0]))
            with self._lock:
                self._packed[key] = entry
        return entry[2]
