"""How the biLM's arithmetic runs on each device, apart from what it computes (`modeling_elmo.py`).

- `ElmoKernelOptions`: the kernel choices of one model (`ElmoModel.kernel_options`), one frozen object.
- `linear`: float32 matmuls on CPU through oneDNN where this torch build has its linear ops, else `F.linear`; bf16
  ones with weights packed by `pack_weight` (the opt-in bf16 mode: inference under CPU bf16 autocast).
- `both_directions`: one LSTM step's matmul for the forward and backward LM at once.
- `fused_lstm`: an LSTM layer through `nn.LSTM(proj_size)` (cuDNN on a GPU).
- `unique_rows`: the distinct words of a batch (rows of character ids).
- `ElmoInferenceCache`: what inference may keep between calls (token representations of frequent words, LSTM
  weights packed for oneDNN), explicit and thread-safe; the modules themselves hold no state but their weights.

None of these changes the function computed beyond float32 rounding, except `fused_lstm` on a model that clips
(opt-in: `fused_lstm="always"`) and the bf16 mode (opt-in: the caller's `torch.autocast`).
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

FUSED_LSTM_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class ElmoKernelOptions:
    """Kernel choices of a biLM; set as `model.kernel_options = ElmoKernelOptions(...)` (or `dataclasses.replace`).

    Args:
        onednn: CPU float32 inference matmuls through oneDNN (True) or `F.linear`, i.e. MKL (False): the same IEEE
            float32 arithmetic summed in another order (outputs differ by ~1e-6). `"auto"` (the default): MKL on
            Intel CPUs, where it runs its own fastest code, and oneDNN elsewhere, where MKL only takes its AVX2 path
            (AMD EPYC: oneDNN 2-3x faster; 2-core Xeon with AMX: MKL 5-10 % faster, see the README's
            "Performance"). Training (autograd) always uses `F.linear`; the bf16 mode always packs for oneDNN.
        fused_lstm: `"auto"` runs the biLSTM through `nn.LSTM` (cuDNN) on a GPU for models without cell or
            projection clipping, where it computes the same function, else the step loop; `"always"` also for
            clipped models (an approximation: the original ELMo weights clip at 3); `"never"` the step loop.
        char_cnn_chunk: distinct words per char-CNN call (bounds the memory of the convolution outputs).
        lstm_time_chunk: time steps whose input projections are computed in one matmul (bounds memory on long
            sentences).
        single_row_bmm_max_weight: largest per-direction weight (elements) for which a one-row LSTM step uses one
            batched MKL matmul for both directions rather than two oneDNN calls (~15 µs fixed cost each). Measured
            on an AMD EPYC (one 20-word sentence): small model 12.4 -> 10.1 ms with its 0.5M-element weights; with
            2M-element weights both are on par (medium) or oneDNN is faster (original).
    """

    onednn: bool | str = "auto"
    fused_lstm: str = "auto"
    char_cnn_chunk: int = 1024
    lstm_time_chunk: int = 128
    single_row_bmm_max_weight: int = 1 << 20

    def __post_init__(self) -> None:
        if self.fused_lstm not in FUSED_LSTM_MODES:
            raise ValueError(f"fused_lstm must be 'auto', 'always' or 'never', got {self.fused_lstm!r}")
        if not (isinstance(self.onednn, bool) or self.onednn == "auto"):
            raise ValueError(f"onednn must be True, False or 'auto', got {self.onednn!r}")
        for name in ("char_cnn_chunk", "lstm_time_chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        value = self.single_row_bmm_max_weight
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"single_row_bmm_max_weight must be an integer >= 0, got {value!r}")

    def uses_onednn(self) -> bool:
        """Whether CPU float32 inference matmuls go through oneDNN (where this torch build has it)."""
        return not intel_cpu() if self.onednn == "auto" else self.onednn

    def uses_fused_lstm(self, reference: torch.Tensor, clipped: bool) -> bool:
        """Whether a biLSTM (`clipped`: with cell or projection clipping) runs through `fused_lstm` for tensors
        like `reference`."""
        if self.fused_lstm == "auto":
            return reference.is_cuda and not clipped
        return self.fused_lstm == "always"

    def uses_batched_step(self, rows: int, weight: torch.Tensor) -> bool:
        """Whether an LSTM step of `rows` rows with this (2, N, K) weight takes one batched MKL matmul for both
        directions rather than oneDNN: a single row and at most `single_row_bmm_max_weight` elements per direction."""
        return rows == 1 and weight.shape[1] * weight.shape[2] <= self.single_row_bmm_max_weight  # no tensor op


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


def _cpuinfo_field(name: str) -> str:
    """The first value of `name` in /proc/cpuinfo ("" where it cannot be read, e.g. not on Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo if line.split(":")[0].strip() == name), "")
    except OSError:
        return ""


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


def onednn_usable(x: torch.Tensor, weight: torch.Tensor, options: ElmoKernelOptions) -> bool:
    """Whether `linear(x, weight)` runs through oneDNN: eager CPU float32 without gradient or autocast (compilers
    and `torch.export` get `F.linear`)."""
    return (
        _eager_cpu_inference(x, weight)  # first: compilers cannot trace the CPU check of `uses_onednn`
        and options.uses_onednn()
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


def _eager_cpu_inference(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Eager (not compiling), this torch build has oneDNN's linear ops, CPU, no gradient needed."""
    return (
        not torch.compiler.is_compiling()
        and onednn_available()
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
    per-call reordering (1.5-2.5x faster for matmuls of few rows, as in the LSTM recurrence)."""
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
      (`options.uses_batched_step`): those two transposed to contiguous (2, K, N), only from `inference_cache` (the
      transposed view is read ~25 µs slower per step of the small preset, in the model; a copy per call costs about
      what it saves).
    - float32 (`onednn_usable`): the step weights packed per direction, never the input weight (one matmul per
      window: a packed copy of the largest weight measured only ~2 % faster).
    - bf16 autocast (`bf16_autocast_inference`): all three packed per direction in bf16, which autocast would
      otherwise cast again at every call and step.
    """
    _, *step_weights = weights
    present = [w for w in step_weights if w is not None]
    if not present:
        return None
    if (
        _eager_cpu_inference(x, present[0])
        and not torch.is_autocast_enabled("cpu")
        and x.dtype == present[0].dtype == torch.float32
        and all(options.uses_batched_step(x.shape[1], w) for w in present)
    ):
        return None if inference_cache is None else [None, *inference_cache.transposed_weights(step_weights)]
    if onednn_usable(x, present[0], options):
        weights, dtype = [None, *step_weights], torch.float32
    elif bf16_autocast_inference(x, present[0]):
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
    packed once in bf16 by `inference_cache`, which autocast would otherwise cast again at every call (the char CNN's
    highway: one 20-word sentence of the small preset 10.5 -> 8.8 ms, the original 42.6 -> 39.8 ms), else `weight`
    itself (in float32 a packed copy gained 0-1 % of one-sentence latency)."""
    if inference_cache is None or not bf16_autocast_inference(x, weight):
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
    packed form, and for float32 where `options.uses_batched_step` (a single row and a small weight: oneDNN's fixed
    cost per call would dominate).
    """
    if isinstance(packed, list) and (
        packed[0].dtype != torch.float32 or not options.uses_batched_step(x.shape[1], weight)
    ):
        return torch.stack([linear(x[d], packed[d], None, options, add=None if add is None else add[d])
                            for d in range(2)])
    transposed = packed if isinstance(packed, torch.Tensor) else weight.transpose(1, 2)
    if add is None:
        return torch.bmm(x, transposed)
    return torch.baddbmm(torch.stack(add), x, transposed)


def fused_lstm(
    inputs: torch.Tensor,
    lengths: list[int],
    state: tuple[torch.Tensor, torch.Tensor],
    input_weight: torch.Tensor,
    recurrent_weight: torch.Tensor,
    bias: torch.Tensor,
    projection_weight: torch.Tensor | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One biLM LSTM layer (`ElmoLstmLayer.forward`'s arguments and results) through `nn.LSTM(proj_size=P)`, one
    call per direction over packed sequences; `lengths` (batch,) in decreasing order; weights as the layer stores
    them (gates i, j, f, o), `bias` (2, 4D) with the forget bias added. No cell or projection clipping."""
    _, batch, steps, input_dim = inputs.shape
    cell, hidden = recurrent_weight.shape[1] // 4, recurrent_weight.shape[2]
    started = sum(1 for n in lengths if n > 0)  # nn.LSTM takes no empty rows: they keep zeros and their state
    if started == 0:
        return inputs.new_zeros(2, batch, steps, hidden), state
    # TensorFlow's gate order (i, j, f, o) → PyTorch's (i, f, g, o).
    gates = torch.arange(4 * cell, device=inputs.device).view(4, cell)[[0, 2, 1, 3]].flatten()
    lstm = nn.LSTM(input_dim, cell, proj_size=hidden if projection_weight is not None else 0,
                   batch_first=True, device="meta")
    outputs, final_h, final_c = [], [], []
    for d in range(2):
        weights = {
            "weight_ih_l0": input_weight[d][gates],
            "weight_hh_l0": recurrent_weight[d][gates],
            "bias_ih_l0": bias[d][gates],
            "bias_hh_l0": torch.zeros_like(bias[d]),
        }
        if projection_weight is not None:
            weights["weight_hr_l0"] = projection_weight[d]
        packed = nn.utils.rnn.pack_padded_sequence(inputs[d, :started], torch.tensor(lengths[:started]),
                                                   batch_first=True)
        initial = (state[0][d : d + 1, :started].contiguous(), state[1][d : d + 1, :started].contiguous())
        with warnings.catch_warnings():  # weights gathered per call (gate order): cuDNN cannot keep them flat
            warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")
            output, (h, c) = torch.func.functional_call(lstm, weights, (packed, initial))
        output, _ = nn.utils.rnn.pad_packed_sequence(output, batch_first=True, total_length=steps)
        outputs.append(F.pad(output, (0, 0, 0, 0, 0, batch - started)))
        final_h.append(torch.cat([h[0], state[0][d, started:]]))
        final_c.append(torch.cat([c[0], state[1][d, started:]]))
    return torch.stack(outputs), (torch.stack(final_h), torch.stack(final_c))


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
        if isinstance(token_cache_size, bool) or not isinstance(token_cache_size, int) or token_cache_size < 0:
            raise ValueError(f"token_cache_size must be an integer >= 0, got {token_cache_size!r}")
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
                weight, dtype, lambda w: [pack_weight(m, dtype) for m in (w.unbind() if w.dim() == 3 else [w])]
            )
            for weight in weights
        ]

    def transposed_weights(self, weights: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Each (2, N, K) weight as a contiguous (2, K, N) copy, for `both_directions`' batched matmul."""
        return [
            None if weight is None else self._derived(weight, "transposed", lambda w: w.detach().mT.contiguous())
            for weight in weights
        ]

    def _derived(self, weight: torch.Tensor, form: object, make: Callable[[torch.Tensor], object]) -> object:
        """`make(weight)`, made once per weight and `form` and again when the weight changes."""
        state = _weights_state([weight])
        key = (id(weight), form)
        with self._lock:
            entry = self._packed.get(key)
        if entry is None or entry[0]() is not weight or entry[1] != state:
            entry = (weakref.ref(weight), state, make(weight))
            with self._lock:
                self._packed[key] = entry
        return entry[2]
