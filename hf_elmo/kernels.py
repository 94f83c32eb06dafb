"""The loops of the biLM's fast arithmetic on each device (`ElmoConfig.implementation = "kernels"`, the default).

`modeling_elmo.py` says what the biLM computes, with the formulas of `formulas.py` and `F.linear`. When the config
asks for the kernels, `ElmoModel.forward` makes one `ElmoKernels` per call: its `KernelPlan` (`kernel_plan.py`)
decides once what the call's matmuls and recurrences do and which form each weight is read in (`weight_forms.py`),
and the loops here run the same formulas through them. The kernels read each block's weights as a record
(`CharCnnWeights`, `LstmWeights`) and never reach into a module.

- `ElmoKernels.token_representations`: the char CNN over each distinct word of the batch once (or from the cache),
  the words grouped by length so that short words do not pay for long ones.
- `ElmoKernels.lstm`: one biLSTM layer through the plan's recurrence: the step loop over the rows still active (both
  directions per step), or `nn.LSTM` (cuDNN on a GPU, its weights kept in cuDNN's flat layout by the cache). Each
  sorts the rows as it needs them.

What inference keeps between calls is the caller's `ElmoInferenceCache` (`inference_cache.py`). None of this changes
the function computed beyond float32 rounding, except the fused LSTM on a model that clips (opt-in:
`fused_lstm="always"`), the bf16 mode (opt-in: the caller's `torch.autocast`) and the int8 mode (opt-in:
`model(..., quantize="int8")`). Why each default: docs/performance.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

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
from .kernel_plan import KernelPlan
from .runtime import host_index
from .weight_forms import both_directions, fused_lstm_weights, fused_lstms, linear, meta_lstm


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
        few_steps: bool = False,
    ):
        """`tensors`: the model's parameters and the state given to the call (whether gradient flows to them);
        `quantize`: None or "int8"; `few_steps`: an `ElmoStream`'s advance (`KernelPlan.make`)."""
        self.plan = KernelPlan.make(options, input_ids, tensors, quantize, inference_cache, few_steps)
        self.cache = self.plan.cache
        self.lengths = list(lengths)
        self._per_call: dict[object, object] = {}  # what a call makes once for all its layers

    # -- matmuls ---------------------------------------------------------------------------------------------------
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x (..., K) @ weight (N, K)ᵀ + bias (N) → (..., N), `weight` one of the model's parameters, read in the
        plan's form (`KernelPlan.linear_form`)."""
        plan = self.plan
        return linear(x, plan.linear_form(weight), None if bias is None else plan.weight(bias), plan.onednn)

    def _matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The formulas' matmul for a weight made in this call (the char CNN's flattened filters): no cached form."""
        return linear(x, weight, bias, self.plan.onednn)

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
        chars = self.plan.in_compute_dtype(F.embedding(char_ids, weights.char_embedding, weights.padding_idx))
        filters = [(self.plan.weight(weight), self.plan.weight(bias)) for weight, bias in weights.filters]
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
        words = self.plan.in_compute_dtype(F.embedding(word_ids, weights.word_embedding, 0))
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

    def _step_recurrence(
        self, weights: LstmWeights, inputs: torch.Tensor, lengths: Sequence[int], state: LayerState
    ) -> tuple[torch.Tensor, LayerState]:
        """The step loop over rows longest first: at step t only the `batch_sizes[t]` rows still active are computed."""
        plan = self.plan
        _, batch, steps, _ = inputs.shape
        batch_sizes = [sum(1 for n in lengths if n > t) for t in range(steps)]
        started = batch_sizes[0] if steps else 0  # rows with at least one position
        h, c = state[0][:, :started], state[1][:, :started]
        input_form, recurrent_form, projection_form = plan.step_forms(weights, inputs.shape[1])
        bias = weights.bias_with_forget_bias()

        def project(h: torch.Tensor) -> torch.Tensor:
            return both_directions(h, weights.projection_weight, projection_form, plan.onednn,
                                   plan.batched_step(h.shape[1], weights.projection_weight))

        outputs, finished_h, finished_c = [], [], []
        start = 0
        while start < steps and batch_sizes[start]:
            active = batch_sizes[start]
            window_steps = plan.window_steps(active, weights.input_weight.shape[1])
            # The window's input steps-major (steps, active, K): input projections of all its steps in one matmul
            # per direction, each step's then a contiguous (active, 4D) block (the rows still active a prefix).
            window = inputs[:, :active, start : start + window_steps].transpose(1, 2).contiguous()
            input_weight = weights.input_weight if input_form is None else input_form
            step_bias = None if plan.int8 else bias  # the int8 input weights add it themselves (`step_forms`)
            projected = [linear(window[d], input_weight[d], None if step_bias is None else step_bias[d], plan.onednn
                                ) for d in range(2)]
            for offset, n in enumerate(batch_sizes[start : start + window.shape[1]]):
                if n == 0:
                    break
                if n < h.shape[1]:  # rows n.. ended at the previous step: keep their final state
                    finished_h.append(h[:, n:])
                    finished_c.append(c[:, n:])
                    h, c = h[:, :n], c[:, :n]
                step_input = [projected[d][offset][:n] for d in range(2)]
                # Gate pre-activations (2, n, 4D).
                gates = both_directions(h, weights.recurrent_weight, recurrent_form, plan.onednn,
                                        plan.batched_step(n, weights.recurrent_weight), step_input)
                h, c = lstm_cell(weights, gates, c, project)
                outputs.append(h if n == batch else F.pad(h, (0, 0, 0, batch - n)))
            start += window.shape[1]
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
            lstms = fused_lstms(self.cache, weights, self.plan.fused_dtype())
            return lambda d, x, initial: lstms[d](x, initial)
        gathered = fused_lstm_weights(weights)

        def run(d: int, x: torch.Tensor | nn.utils.rnn.PackedSequence, initial: tuple) -> tuple:
            with warnings.catch_warnings():  # gathered at each call (gate order): they cannot be flat
                warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")
                return torch.func.functional_call(meta_lstm(weights), gathered[d], (x, initial))

        return run
