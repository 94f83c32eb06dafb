"""ELMo biLM (Peters et al. 2018) in PyTorch, weight-compatible with AllenNLP and bilm-tf.

Data flow: character ids (batch, positions, chars) → `ElmoCharCNN` (char embedding, convolutions with
max-pooling, highway layers, projection) → token representation (batch, positions, P) → `ElmoBiLstm`
(separate forward and backward stacks of clipped LSTMs with projection, residual from layer 2 on) →
`n_layers + 1` layers of (batch, positions, 2P): the token representation duplicated, then each biLSTM layer
as [forward; backward]. `ElmoScalarMix` combines them into one task-specific representation.

Every sentence starts from the zero state unless `initial_state` is given, so a sentence's vectors do not
depend on the other rows of its batch. `final_state` + `initial_state` reproduce the original stateful biLM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput
from transformers.utils import ModelOutput, can_return_tuple

from .configuration_elmo import ElmoConfig
from .kernels import (
    ElmoInferenceCache,
    ElmoKernelOptions,
    both_directions,
    fused_lstm,
    linear,
    packed_linear_weight,
    packed_lstm_weights,
    unique_rows,
)

# TensorFlow's LSTMCell adds this to the forget gate at run time; it is not part of the stored bias.
FORGET_BIAS = 1.0
# Character id that fills a word's row after its end-of-word character (bilm-tf's 260, shifted by one).
PADDING_CHAR_ID = 261

# (h, c): h of shape (n_layers, 2, batch, projection_dim), c of shape (n_layers, 2, batch, lstm_dim);
# direction 0 is the forward LM, 1 the backward LM.
ElmoState = tuple[torch.Tensor, torch.Tensor]


@dataclass
class ElmoModelOutput(ModelOutput):
    """
    Args:
        last_hidden_state (`torch.FloatTensor` of shape `(batch, positions, 2 * projection_dim)`): top biLSTM layer.
        hidden_states (`tuple(torch.FloatTensor)`): `n_layers + 1` tensors of shape `(batch, positions,
            2 * projection_dim)`: the token representation duplicated, then each biLSTM layer [forward; backward].
            Padded positions are zeros.
        final_state (`ElmoState`, returned with `return_state=True`): per row, the forward state after its last
            position and the backward state after its first position; pass it as `initial_state` to continue.
    """

    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    final_state: ElmoState | None = None


@dataclass
class ElmoBidirectionalLMOutput(ModelOutput):
    """
    Args:
        loss (`torch.FloatTensor`, with `labels`): mean of the forward and backward LM cross-entropies.
        forward_logits (`torch.FloatTensor` of shape `(batch, positions, vocab_size)`): scores of the next word.
        backward_logits (`torch.FloatTensor` of shape `(batch, positions, vocab_size)`): scores of the previous word.
        hidden_states, final_state: as in `ElmoModelOutput`.
    """

    loss: torch.FloatTensor | None = None
    forward_logits: torch.FloatTensor | None = None
    backward_logits: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    final_state: ElmoState | None = None


class ElmoLinear(nn.Linear):
    """`nn.Linear` computed by `kernels.linear`; in the bf16 mode its weight packed once by `inference_cache`."""

    def forward(
        self, x: torch.Tensor, options: ElmoKernelOptions, inference_cache: ElmoInferenceCache | None = None
    ) -> torch.Tensor:
        return linear(x, packed_linear_weight(self.weight, x, inference_cache), self.bias, options)


class ElmoHighwayLayer(ElmoLinear):
    """One highway layer's Linear(F, 2F): the transform, then the gate (its own class for its initialisation)."""


class ElmoHighway(nn.Module):
    """Highway layers: y = t * relu(W_transform x) + (1 - t) * x with gate t = sigmoid(W_carry x).

    Each layer is one Linear(F, 2F) whose first half is the transform, second half the gate (bilm-tf's
    "carry", which despite its name gates the transform branch).
    """

    def __init__(self, dim: int, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(ElmoHighwayLayer(dim, 2 * dim) for _ in range(n_layers))

    def forward(
        self, x: torch.Tensor, options: ElmoKernelOptions, inference_cache: ElmoInferenceCache | None = None
    ) -> torch.Tensor:
        """(words, F) → (words, F)"""
        for layer in self.layers:
            transform, carry = layer(x, options, inference_cache).chunk(2, dim=-1)
            gate = torch.sigmoid(carry)
            x = gate * F.relu(transform) + (1 - gate) * x
        return x


class ElmoCharCNN(nn.Module):
    """Context-independent token representation from character ids."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.char_embedding = nn.Embedding(config.n_characters, config.char_embedding_dim, padding_idx=0)
        self.convs = nn.ModuleList(
            nn.Conv1d(config.char_embedding_dim, n_filters, kernel_size=width) for width, n_filters in config.filters
        )
        self.widest_filter = max(width for width, _ in config.filters)
        self.activation = torch.tanh if config.activation == "tanh" else F.relu
        self.highway = ElmoHighway(config.n_filters, config.n_highway)
        # bilm-tf projects only when the CNN width differs from the LSTM input width.
        self.projection = (
            ElmoLinear(config.n_filters, config.projection_dim) if config.n_filters != config.projection_dim else None
        )
        self.output_dim = config.projection_dim

    def _pooled(self, char_ids: torch.Tensor, options: ElmoKernelOptions) -> torch.Tensor:
        """(words, chars) character ids → (words, n_filters): every filter bank convolved, max-pooled, activated."""
        chars = self.char_embedding(char_ids)  # (words, chars, char_dim)
        pooled = []
        for conv in self.convs:
            # The convolution as one matmul of every window (words, windows, char_dim * width) with the filters
            # (n_filters, char_dim * width), the layout of Conv1d's weight; 2-3x faster than Conv1d on CPU.
            windows = chars.unfold(1, conv.kernel_size[0], 1).flatten(2)
            # Max-pool over positions, then the bias and the activation (the original adds the bias before the
            # pool: the same maximum, as rounding is monotonic, without a bias copy per window).
            pooled.append(self.activation(linear(windows, conv.weight.flatten(1), None, options).amax(dim=1)
                                          + conv.bias))
        return torch.cat(pooled, dim=-1)

    def token_representation(
        self, char_ids: torch.Tensor, options: ElmoKernelOptions, inference_cache: ElmoInferenceCache | None = None
    ) -> torch.Tensor:
        """(words, chars) character ids → (words, projection_dim): the paper's char CNN, highway and projection."""
        return self._highway_projection(self._pooled(char_ids, options), options, inference_cache)

    def _highway_projection(
        self, pooled: torch.Tensor, options: ElmoKernelOptions, inference_cache: ElmoInferenceCache | None
    ) -> torch.Tensor:
        """(words, n_filters) pooled filters → (words, projection_dim)."""
        highway = self.highway(pooled, options, inference_cache)
        return highway if self.projection is None else self.projection(highway, options, inference_cache)

    def embed_words(
        self, char_ids: torch.Tensor, options: ElmoKernelOptions, inference_cache: ElmoInferenceCache | None = None
    ) -> torch.Tensor:
        """(words, chars) character ids → (words, projection_dim), in chunks of `options.char_cnn_chunk` words.

        Words are taken shortest first, and the convolutions of a chunk run per group of words of similar length,
        each cut after the character positions its longest word uses: short words do not pay for the long ones.
        A group closes where the length grows once it holds a 32nd of a chunk (fewer, larger matmuls).
        In the bf16 mode `inference_cache` keeps the highway and projection weights packed in bf16 between calls.
        """
        if not len(char_ids):
            return self.char_embedding.weight.new_zeros(0, self.output_dim)
        chunk, used = options.char_cnn_chunk, self._used_positions(char_ids)
        group = chunk // 32  # the words a group holds before it may close
        if len(char_ids) <= group:  # one group (e.g. one sentence): nothing to sort
            return self.token_representation(char_ids[:, : int(used.max())], options, inference_cache)
        used, order = used.sort(stable=True)
        char_ids, representations = char_ids[order], []
        for chunk_start in range(0, len(used), chunk):
            # Runs of words of one length, in increasing length (a few dozen at most, whatever the chunk size).
            widths, counts = torch.unique_consecutive(used[chunk_start : chunk_start + chunk], return_counts=True)
            start, end, pooled = chunk_start, chunk_start, []
            for run, (width, count) in enumerate(zip(widths.tolist(), counts.tolist())):
                end += count
                if end - start >= group or run == len(widths) - 1:
                    pooled.append(self._pooled(char_ids[start:end, :width], options))
                    start = end
            representations.append(self._highway_projection(torch.cat(pooled), options, inference_cache))
        return torch.cat(representations)[order.argsort()]

    def _used_positions(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(words, chars) ids → (words,): how many leading character positions of each word the max-pool needs.

        Beyond a word's last non-padding character every window is all padding, and all such windows of a width
        give the same value; keeping `widest filter` padding positions keeps one of them, so the pooled maximum
        (and its gradient) is the one over all positions.
        """
        chars = char_ids.shape[1]
        used = char_ids != PADDING_CHAR_ID
        last = torch.where(used.any(dim=1), chars - 1 - used.flip(1).int().argmax(dim=1), -1)
        return (last + 1 + self.widest_filter).clamp(max=chars)

    def forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        options: ElmoKernelOptions,
        inference_cache: ElmoInferenceCache | None = None,
    ) -> torch.Tensor:
        """(batch, positions, chars) ids and (batch, positions) bool mask → (batch, positions, projection_dim).

        Each distinct word of the batch goes through the CNN once (or comes from `inference_cache` when no gradient
        is needed); padded positions are zeros. Traced (`torch.compile`, `torch.export`), every position goes
        through the CNN: the same values, without shapes that depend on the data.
        """
        if torch.compiler.is_compiling():
            embedded = self.token_representation(input_ids.flatten(0, 1), options).view(*input_ids.shape[:2], -1)
            return embedded * mask[..., None]
        words, inverse = unique_rows(input_ids[mask])
        needs_grad = torch.is_grad_enabled() and self.char_embedding.weight.requires_grad
        if inference_cache is not None and not needs_grad:
            embedded = inference_cache.token_representations(
                words, list(self.parameters()), lambda ids: self.embed_words(ids, options, inference_cache)
            )
        else:
            embedded = self.embed_words(words, options)
        output = embedded.new_zeros(*input_ids.shape[:2], self.output_dim)
        return output.index_put((mask,), embedded[inverse])


class ElmoLstmLayer(nn.Module):
    """One LSTM layer with projection for both directions, weights stacked on a leading direction axis.

    Gate blocks are in TensorFlow's order (input, candidate, forget, output), as in the original weights;
    the forget gate gets `FORGET_BIAS` added to its bias at run time.
    """

    def __init__(self, input_dim: int, config: ElmoConfig):
        super().__init__()
        cell, hidden = config.lstm_dim, config.projection_dim
        if hidden > cell:
            raise ValueError(f"projection_dim ({hidden}) cannot exceed lstm_dim ({cell})")
        self.input_weight = nn.Parameter(torch.empty(2, 4 * cell, input_dim))
        self.recurrent_weight = nn.Parameter(torch.empty(2, 4 * cell, hidden))
        self.bias = nn.Parameter(torch.empty(2, 4 * cell))
        # TensorFlow's LSTMCell only projects (and clips the projection) when num_proj < num_units.
        self.projection_weight = nn.Parameter(torch.empty(2, hidden, cell)) if hidden < cell else None
        self.cell_clip = config.cell_clip
        self.proj_clip = config.proj_clip if hidden < cell else None

    def _bias_with_forget_bias(self) -> torch.Tensor:
        """(2, 4D) bias with `FORGET_BIAS` added to the forget gate, as TensorFlow's cell does (gates i, j, f, o)."""
        cell = self.bias.shape[1] // 4
        return torch.cat([self.bias[:, : 2 * cell], self.bias[:, 2 * cell : 3 * cell] + FORGET_BIAS,
                          self.bias[:, 3 * cell :]], dim=1)

    def _cell(
        self,
        gates: torch.Tensor,
        c: torch.Tensor,
        options: ElmoKernelOptions,
        packed_projection: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of both directions from the gate pre-activations (2, n, 4D) and the cell c (2, n, D): the new
        (h (2, n, P), c), clipped where the model clips."""
        cell = c.shape[-1]
        candidate = torch.tanh(gates[..., cell : 2 * cell])
        input_gate, _, forget_gate, output_gate = torch.sigmoid(gates).chunk(4, dim=-1)
        c = torch.addcmul(forget_gate * c, input_gate, candidate)
        if self.cell_clip is not None:
            c = c.clamp(-self.cell_clip, self.cell_clip)
        h = output_gate * torch.tanh(c)
        if self.projection_weight is not None:
            h = both_directions(h, self.projection_weight, packed_projection, options)
        if self.proj_clip is not None:
            h = h.clamp(-self.proj_clip, self.proj_clip)
        return h, c

    def forward_masked(
        self,
        inputs: torch.Tensor,
        mask: torch.Tensor,
        state: tuple[torch.Tensor, torch.Tensor],
        options: ElmoKernelOptions,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """`forward` with every row computed at every step and its state kept where `mask` (batch, steps) is False:
        no shapes or branches that depend on the data, for `torch.compile` and `torch.export` (the recurrence is
        unrolled over the steps)."""
        bias = self._bias_with_forget_bias()
        projected = torch.matmul(inputs, self.input_weight.transpose(1, 2)[:, None]) + bias[:, None, None]
        h, c = state
        outputs = []
        for step in range(inputs.shape[2]):
            new_h, new_c = self._cell(torch.baddbmm(projected[:, :, step], h, self.recurrent_weight.transpose(1, 2)),
                                      c, options)
            active = mask[:, step, None]  # (batch, 1)
            h, c = torch.where(active, new_h, h), torch.where(active, new_c, c)
            outputs.append(new_h * active)
        return torch.stack(outputs, dim=2), (h, c)

    def forward_fused(
        self, inputs: torch.Tensor, lengths: list[int], state: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """`forward` through `nn.LSTM(proj_size=P)` (cuDNN on a GPU, `kernels.fused_lstm`); `lengths` (batch,) in
        decreasing order. Without cell or projection clipping: the same function for models trained without
        clipping, an approximation for clipped ones."""
        return fused_lstm(inputs, lengths, state, self.input_weight, self.recurrent_weight,
                          self._bias_with_forget_bias(), self.projection_weight)

    def forward(
        self,
        inputs: torch.Tensor,
        batch_sizes: list[int],
        state: tuple[torch.Tensor, torch.Tensor],
        options: ElmoKernelOptions,
        inference_cache: ElmoInferenceCache | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Run both directions over `inputs` (2, batch, steps, input_dim), in processing order.

        Rows are sorted by decreasing length and `batch_sizes[t]` rows are active at step t, so padded steps
        are never computed. `state` = (h (2, batch, P), c (2, batch, D)). Returns outputs (2, batch, steps, P)
        (zeros where padded) and each row's state after its last step.
        """
        _, batch, steps, input_dim = inputs.shape
        started = batch_sizes[0] if steps else 0  # rows with at least one position
        h, c = state[0][:, :started], state[1][:, :started]
        packed_input, packed_recurrent, packed_projection = packed_lstm_weights(
            (self.input_weight, self.recurrent_weight, self.projection_weight), inputs, options, inference_cache
        ) or (None, None, None)
        bias = self._bias_with_forget_bias()
        outputs, finished_h, finished_c = [], [], []
        for start in range(0, steps, options.lstm_time_chunk):
            active = batch_sizes[start]
            if active == 0:
                break
            window = inputs[:, :active, start : start + options.lstm_time_chunk]
            # Input projections of every step of the window in one matmul per direction, then per step: (active, 4D).
            input_weight = packed_input or self.input_weight
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
                gates = both_directions(h, self.recurrent_weight, packed_recurrent, options, add=step_input)
                h, c = self._cell(gates, c, options, packed_projection)
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


class ElmoBiLstm(nn.Module):
    """Forward and backward stacks of LSTM layers; layer l of a direction reads layer l-1 of that direction."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.layers = nn.ModuleList(ElmoLstmLayer(config.projection_dim, config) for _ in range(config.n_layers))
        self.use_skip_connections = config.use_skip_connections
        self.dropout = nn.Dropout(config.dropout)
        self.projection_dim = config.projection_dim
        self.lstm_dim = config.lstm_dim
        self.clipped = any(layer.cell_clip is not None or layer.proj_clip is not None for layer in self.layers)

    def zero_state(self, batch: int, reference: torch.Tensor) -> ElmoState:
        """The state every sentence starts from by default."""
        n_layers = len(self.layers)
        return (
            reference.new_zeros(n_layers, 2, batch, self.projection_dim),
            reference.new_zeros(n_layers, 2, batch, self.lstm_dim),
        )

    def forward(
        self,
        token_repr: torch.Tensor,
        lengths: torch.Tensor,
        options: ElmoKernelOptions,
        initial_state: ElmoState | None = None,
        inference_cache: ElmoInferenceCache | None = None,
    ) -> tuple[list[torch.Tensor], ElmoState]:
        """token_repr (batch, positions, P), lengths (batch,) → n_layers tensors (batch, positions, 2P), final state."""
        batch, steps, _ = token_repr.shape
        h0, c0 = initial_state if initial_state is not None else self.zero_state(batch, token_repr)
        # Sort rows by decreasing length so the active rows of every step are a prefix.
        lengths, order = torch.sort(lengths, descending=True, stable=True)
        unsort = torch.argsort(order)
        # The backward LM reads each sentence reversed within its own length.
        position = torch.arange(steps, device=token_repr.device)
        reverse_index = torch.where(position < lengths[:, None], lengths[:, None] - 1 - position, position)
        reverse_index = reverse_index[:, :, None].expand(-1, -1, token_repr.shape[-1])
        sorted_repr = token_repr[order]
        layer_input = torch.stack([sorted_repr, sorted_repr.gather(1, reverse_index)])  # (2, batch, steps, P)

        traced = torch.compiler.is_compiling()  # no data-dependent shapes: every step of every row, masked
        if not traced:
            counts = lengths.tolist()
            batch_sizes = [sum(1 for n in counts if n > t) for t in range(steps)]
        fused = options.uses_fused_lstm(token_repr, self.clipped)
        outputs, final_h, final_c = [], [], []
        for index, layer in enumerate(self.layers):
            layer_input = self.dropout(layer_input)
            state = (h0[index][:, order], c0[index][:, order])
            if traced:
                layer_output, (h, c) = layer.forward_masked(layer_input, position < lengths[:, None], state, options)
            elif fused:
                layer_output, (h, c) = layer.forward_fused(layer_input, counts, state)
            else:
                layer_output, (h, c) = layer(layer_input, batch_sizes, state, options, inference_cache)
            if self.use_skip_connections and index > 0:
                layer_output = layer_output + layer_input
            outputs.append(layer_output)
            final_h.append(h[:, unsort])
            final_c.append(c[:, unsort])
            layer_input = layer_output

        layers = []
        for output in outputs:
            forward_out, backward_out = output[0], output[1].gather(1, reverse_index)
            layers.append(torch.cat([forward_out, backward_out], dim=-1)[unsort])
        return layers, (torch.stack(final_h), torch.stack(final_c))


class ElmoPreTrainedModel(PreTrainedModel):
    config_class = ElmoConfig
    config: ElmoConfig
    base_model_prefix = "elmo"
    main_input_name = "input_ids"
    _no_split_modules = ["ElmoCharCNN", "ElmoLstmLayer"]
    supports_gradient_checkpointing = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """bilm-tf's initialisation (training.py), applied to each module that owns parameters.

        transformers calls this per module, children first, and skips modules without parameters of their own in
        custom code, so the rules live on the parameter-owning modules (never on `ElmoCharCNN` or `ElmoHighway`).
        `init.*` leave parameters loaded from a checkpoint alone; slices of a parameter are guarded by hand.
        """
        config = self.config
        if module is getattr(self, "softmax", None):  # the word softmax of ElmoForBidirectionalLM
            init.normal_(module.weight, std=math.sqrt(1.0 / module.in_features))
            init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):  # characters, with an all-zero padding row
            if not getattr(module.weight, "_is_hf_initialized", False):
                init.uniform_(module.weight, -1.0, 1.0)
                if module.padding_idx is not None:
                    init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.Conv1d):  # one filter bank of the char CNN
            if config.activation == "relu":
                init.uniform_(module.weight, -0.05, 0.05)
            else:
                init.normal_(module.weight, std=math.sqrt(1.0 / (module.kernel_size[0] * module.in_channels)))
            init.zeros_(module.bias)
        elif isinstance(module, ElmoHighwayLayer):
            init.normal_(module.weight, std=math.sqrt(1.0 / module.in_features))
            if not getattr(module.bias, "_is_hf_initialized", False):
                init.zeros_(module.bias[: module.in_features])
                init.constant_(module.bias[module.in_features :], -2.0)  # gate mostly closed: copy the input
        elif isinstance(module, nn.Linear):  # the char CNN's projection to the LSTM input width
            init.normal_(module.weight, std=math.sqrt(1.0 / module.in_features))
            init.zeros_(module.bias)
        elif isinstance(module, ElmoScalarMix):  # a task model's mix: the average of the layers
            init.zeros_(module.scalar_parameters)
            init.ones_(module.gamma)
        elif isinstance(module, nn.LSTM):  # a task model's encoder: PyTorch's own initialisation
            bound = 1.0 / math.sqrt(module.hidden_size)
            for parameter in module.parameters():
                init.uniform_(parameter, -bound, bound)
        elif isinstance(module, ElmoLstmLayer):
            cell, hidden = config.lstm_dim, config.projection_dim
            bound = math.sqrt(6.0 / (module.input_weight.shape[-1] + hidden + 4 * cell))  # glorot on [x; h]
            init.uniform_(module.input_weight, -bound, bound)
            init.uniform_(module.recurrent_weight, -bound, bound)
            init.zeros_(module.bias)
            if module.projection_weight is not None:
                bound = math.sqrt(6.0 / (cell + hidden))
                init.uniform_(module.projection_weight, -bound, bound)

    def resize_token_embeddings(self, *args, **kwargs) -> NoReturn:
        """ELMo has no token vocabulary to resize: its input is characters (UTF-8 bytes, a fixed table of
        `n_characters` rows), so every word, new or not, already has a representation."""
        raise NotImplementedError(
            "ELMo reads characters (a fixed table of the 256 byte values and markers, config.n_characters = "
            f"{self.config.n_characters}), not a token vocabulary: new words need no new rows, and there is nothing "
            "to resize. To train the word softmax of ElmoForBidirectionalLM on another vocabulary, run elmo pretrain "
            "--init_model with a new --vocab_file."
        )

    def push_to_hub(self, repo_id: str, **kwargs) -> str:
        """`PreTrainedModel.push_to_hub`; with the `hf_elmo` package installed, the repo then gets the ELMo model
        card (`hf_elmo.hub`) in place of the template card transformers writes into a repo without one."""
        commit = super().push_to_hub(repo_id, **kwargs)
        try:  # absent where this file runs as Hub remote code (transformers' import check skips `try` blocks)
            from hf_elmo.hub import replace_generic_model_card
        except ImportError:
            return commit
        replace_generic_model_card(self, commit, revision=kwargs.get("revision"), token=kwargs.get("token"))
        return commit


class ElmoModel(ElmoPreTrainedModel):
    """The ELMo biLM: character ids in, `n_layers + 1` contextual layers out."""

    # The encoder loads from an `ElmoForBidirectionalLM` checkpoint; its word softmax is not needed here.
    _keys_to_ignore_on_load_unexpected = [r"^softmax\."]

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.char_cnn = ElmoCharCNN(config)
        self.bilstm = ElmoBiLstm(config)
        # How the arithmetic runs (oneDNN, cuDNN, chunk sizes), not what it computes; replace it to change them.
        self.kernel_options = ElmoKernelOptions()
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.char_cnn.char_embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.char_cnn.char_embedding = value

    def _validate(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, initial_state: ElmoState | None
    ) -> torch.Tensor:
        """Check the inputs; return the (batch, positions) bool mask."""
        chars = self.config.max_characters_per_token
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 3 or input_ids.shape[-1] != chars:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a tensor of shape (batch, positions, {chars}), got {shape}")
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer character ids, got dtype {input_ids.dtype}")
        traced = torch.compiler.is_compiling()  # the checks of values below would make shapes depend on the data
        if not traced and input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= self.config.n_characters):
            raise ValueError(
                f"character ids must lie in [0, {self.config.n_characters}), found "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]: were they made by ElmoCharTokenizer?"
            )
        if attention_mask is None:
            mask = (input_ids > 0).any(dim=-1)
        else:
            if tuple(attention_mask.shape) != tuple(input_ids.shape[:2]):
                raise ValueError(
                    f"attention_mask must have shape {tuple(input_ids.shape[:2])}, got {tuple(attention_mask.shape)}"
                )
            mask = attention_mask.bool()
        if not traced and (mask[:, 1:] & ~mask[:, :-1]).any():
            raise ValueError("every row must be padded on the right: a padding position precedes a real one")
        if initial_state is not None:
            expected_h, expected_c = (s.shape for s in self.bilstm.zero_state(input_ids.shape[0], mask))
            if len(initial_state) != 2 or initial_state[0].shape != expected_h or initial_state[1].shape != expected_c:
                found = [tuple(s.shape) for s in initial_state]
                raise ValueError(
                    f"initial_state must be (h, c) of shapes {tuple(expected_h)} and {tuple(expected_c)}, got {found}"
                )
        return mask

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        initial_state: ElmoState | None = None,
        return_state: bool = False,
        output_hidden_states: bool | None = None,
        inference_cache: ElmoInferenceCache | None = None,
        **kwargs,
    ) -> ElmoModelOutput:
        """
        Args:
            input_ids (`torch.LongTensor` of shape `(batch, positions, max_characters_per_token)`): from
                `ElmoCharTokenizer`; an all-zero row is a padding position.
            attention_mask (`torch.Tensor` of shape `(batch, positions)`, optional): 1 for real positions; padding
                must be on the right. Defaults to the non-zero rows of `input_ids`.
            initial_state (`ElmoState`, optional): state to start each row from instead of zeros, e.g. the
                `final_state` of the previous call (the original stateful biLM).
            return_state (`bool`): also return `final_state`.
            output_hidden_states (`bool`, optional): return `hidden_states`, the ELMo layers. Unlike most models
                (and whatever `config.output_hidden_states` says) they are returned unless this is `False`: they
                are what ELMo is used for.
            inference_cache (`ElmoInferenceCache`, optional): token representations and packed weights kept between
                calls without gradient (e.g. one per embedding job); nothing is kept without it.
        """
        mask = self._validate(input_ids, attention_mask, initial_state)
        options = self.kernel_options
        token_repr = self.char_cnn(input_ids, mask, options, inference_cache)
        layers, final_state = self.bilstm(token_repr, mask.sum(dim=1), options, initial_state, inference_cache)
        hidden_states = (torch.cat([token_repr, token_repr], dim=-1), *layers)
        return ElmoModelOutput(
            last_hidden_state=hidden_states[-1],
            hidden_states=None if output_hidden_states is False else hidden_states,
            final_state=final_state if return_state else None,
        )


def lm_target_masks(attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which predictions the biLM objective counts, (batch, positions - 1) bool each: the forward LM at position t
    predicts `labels[:, t + 1]`, the backward LM at position t + 1 predicts `labels[:, t]`; a pair of neighbours
    counts when both are real positions (never padding, whatever its labels) and the label is not -100."""
    real = attention_mask.bool()
    both_real = real[:, :-1] & real[:, 1:]
    return both_real & (labels[:, 1:] != -100), both_real & (labels[:, :-1] != -100)


def lm_loss(forward_losses: torch.Tensor, backward_losses: torch.Tensor) -> torch.Tensor:
    """The biLM objective from the per-target cross-entropies of each direction: the mean of the forward and the
    backward LM's mean (a direction without targets counts 0)."""
    forward_mean = forward_losses.sum() / max(len(forward_losses), 1)
    return 0.5 * (forward_mean + backward_losses.sum() / max(len(backward_losses), 1))


class ElmoForBidirectionalLM(ElmoPreTrainedModel):
    """The biLM with one softmax shared by the forward and the backward LM (the paper's training set-up).

    `labels` (batch, positions) hold word ids of the softmax vocabulary aligned with `input_ids` (-100 =
    ignore): the forward LM at position t predicts `labels[t + 1]`, the backward LM predicts `labels[t - 1]`
    (`lm_target_masks`; the loss is `lm_loss`). Training with a sampled softmax (`hf_elmo.training`) estimates
    the same objective from `lm_states`.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        if not config.vocab_size:
            raise ValueError("ElmoForBidirectionalLM needs config.vocab_size (the size of the word softmax)")
        self.elmo = ElmoModel(config)
        self.dropout = nn.Dropout(config.dropout)
        self.softmax = nn.Linear(config.projection_dim, config.vocab_size)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.elmo.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Linear:
        return self.softmax

    def lm_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> tuple[ElmoModelOutput, torch.Tensor, torch.Tensor]:
        """The biLM's outputs (`ElmoModel.forward`'s arguments in `kwargs`) and what the softmax reads: the top
        layer after the LM dropout, split into the forward and the backward LM's states, (batch, positions, P) each."""
        outputs = self.elmo(input_ids, attention_mask, **kwargs)
        forward_states, backward_states = self.dropout(outputs.last_hidden_state).chunk(2, dim=-1)
        return outputs, forward_states, backward_states

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        initial_state: ElmoState | None = None,
        return_state: bool = False,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> ElmoBidirectionalLMOutput:
        """`labels` as in the class docstring; the other arguments as in `ElmoModel.forward`."""
        outputs, forward_states, backward_states = self.lm_states(
            input_ids, attention_mask, initial_state=initial_state, return_state=return_state,
            output_hidden_states=output_hidden_states,
        )
        forward_logits = self.softmax(forward_states)
        backward_logits = self.softmax(backward_states)
        loss = None
        if labels is not None:
            mask = attention_mask if attention_mask is not None else (input_ids > 0).any(dim=-1)
            forward_mask, backward_mask = lm_target_masks(mask, labels)
            loss = lm_loss(
                F.cross_entropy(forward_logits[:, :-1][forward_mask], labels[:, 1:][forward_mask], reduction="none"),
                F.cross_entropy(backward_logits[:, 1:][backward_mask], labels[:, :-1][backward_mask],
                                reduction="none"),
            )
        return ElmoBidirectionalLMOutput(
            loss=loss,
            forward_logits=forward_logits,
            backward_logits=backward_logits,
            hidden_states=outputs.hidden_states,
            final_state=outputs.final_state,
        )


class ElmoScalarMix(nn.Module):
    """Task-specific combination of the biLM layers: `gamma * sum_j softmax(s)_j * h_j`.

    Args:
        num_layers: number of layers mixed (`config.n_layers + 1`).
        do_layer_norm: normalise each layer first with the mean and variance of each sentence's real
            positions (all of its values). The original normalised over the whole batch, which makes a
            sentence's output depend on its batch; per sentence keeps the output batch-independent.
        initial_scalar_parameters: initial `s` (default zeros = uniform average).
        trainable: learn `s` and `gamma` (False fixes them, e.g. `[-9e10, 1, -9e10]` selects layer 1).
        layer_dropout: in training, drop each layer from the mix with this probability.
        dropout: dropout on the mixed output, in training.
    """

    def __init__(
        self,
        num_layers: int,
        do_layer_norm: bool = False,
        initial_scalar_parameters: Sequence[float] | None = None,
        trainable: bool = True,
        layer_dropout: float = 0.0,
        dropout: float = 0.0,
        layer_norm_eps: float = 1e-12,
    ):
        super().__init__()
        initial = list(initial_scalar_parameters) if initial_scalar_parameters is not None else [0.0] * num_layers
        if len(initial) != num_layers:
            raise ValueError(f"{len(initial)} initial scalar parameters for {num_layers} layers")
        self.num_layers = num_layers
        self.scalar_parameters = nn.Parameter(torch.tensor(initial, dtype=torch.float32), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.ones(1), requires_grad=trainable)
        self.do_layer_norm = do_layer_norm
        self.layer_dropout = layer_dropout
        self.dropout = nn.Dropout(dropout)
        self.layer_norm_eps = layer_norm_eps

    def layer_weights(self) -> torch.Tensor:
        """softmax(s), shape (num_layers,)."""
        scores = self.scalar_parameters
        if self.training and self.layer_dropout > 0:
            dropped = torch.rand_like(scores) < self.layer_dropout
            scores = scores.masked_fill(dropped, -1e20)
        return torch.softmax(scores, dim=0)

    def l2_penalty(self) -> torch.Tensor:
        """sum(s^2), the paper's regulariser (multiply by lambda, e.g. 0.001)."""
        return (self.scalar_parameters**2).sum()

    def forward(self, layers: Sequence[torch.Tensor] | torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`num_layers` tensors (batch, positions, width) and a mask (batch, positions) → (batch, positions, width)"""
        if len(layers) != self.num_layers:
            raise ValueError(f"ElmoScalarMix expects {self.num_layers} layers, got {len(layers)}")
        weights = self.layer_weights().to(layers[0].dtype)
        mixed = 0
        for weight, layer in zip(weights, layers):
            if self.do_layer_norm:
                layer = self._normalise(layer, mask)
            mixed = mixed + weight * layer
        return self.dropout(self.gamma.to(layers[0].dtype) * mixed)

    def _normalise(self, layer: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            mask = torch.ones(layer.shape[:2], dtype=torch.bool, device=layer.device)
        weights = mask.to(layer.dtype)[..., None]  # (batch, positions, 1)
        count = (weights.sum(dim=(1, 2)) * layer.shape[-1]).clamp(min=1)[:, None, None]
        mean = (layer * weights).sum(dim=(1, 2), keepdim=True) / count
        variance = (((layer - mean) * weights) ** 2).sum(dim=(1, 2), keepdim=True) / count
        return (layer - mean) / torch.sqrt(variance + self.layer_norm_eps) * weights


@dataclass
class ElmoRepresentations(ModelOutput):
    """
    Args:
        representations (`tuple(torch.FloatTensor)`): one mix per requested representation, each
            (batch, words, 2 * projection_dim), sentence boundaries removed unless kept.
        mask (`torch.BoolTensor` of shape `(batch, words)`): real positions.
        hidden_states: the biLM layers the mixes were computed from (same positions as `mask`).
    """

    representations: tuple[torch.FloatTensor, ...] | None = None
    mask: torch.BoolTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None


def remove_sentence_boundaries(tensor: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop each row's first (`<S>`) and last real (`</S>`) position.

    (batch, positions, ...) and (batch, positions) right-padded mask → (batch, positions - 2, ...), mask.
    """
    words_mask = mask[:, 2:].bool()
    shape = (*words_mask.shape, *([1] * (tensor.dim() - 2)))
    return tensor[:, 1:-1] * words_mask.view(shape).to(tensor.dtype), words_mask


class ElmoWithScalarMixes(nn.Module):
    """A biLM run once with `num_output_representations` independent scalar mixes (AllenNLP's `Elmo`).

    Args:
        elmo: the biLM.
        num_output_representations: how many task mixes to learn (e.g. one for the input and one for the
            output of a task model).
        requires_grad: fine-tune the biLM (default frozen: no autograd graph through it).
        keep_sentence_boundaries: keep the `<S>`/`</S>` positions (inputs must contain them to remove them).
        dropout: on every mixed output in training (AllenNLP's default 0.5).
        do_layer_norm, scalar_mix_parameters, layer_dropout: passed to every `ElmoScalarMix`
            (`scalar_mix_parameters` given = fixed, untrained weights).
    """

    def __init__(
        self,
        elmo: ElmoModel,
        num_output_representations: int = 1,
        requires_grad: bool = False,
        keep_sentence_boundaries: bool = False,
        dropout: float = 0.5,
        do_layer_norm: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        layer_dropout: float = 0.0,
    ):
        super().__init__()
        self.elmo = elmo
        self.elmo.requires_grad_(requires_grad)
        self.requires_grad = requires_grad
        self.keep_sentence_boundaries = keep_sentence_boundaries
        self.scalar_mixes = nn.ModuleList(
            ElmoScalarMix(
                elmo.config.num_output_layers,
                do_layer_norm=do_layer_norm,
                initial_scalar_parameters=scalar_mix_parameters,
                trainable=scalar_mix_parameters is None,
                layer_dropout=layer_dropout,
                dropout=dropout,
            )
            for _ in range(num_output_representations)
        )

    def train(self, mode: bool = True) -> ElmoWithScalarMixes:
        super().train(mode)
        if not self.requires_grad:  # a frozen biLM gives the same layers in training as at inference: no dropout
            self.elmo.eval()
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> ElmoRepresentations:
        """(batch, positions, chars) ids with `<S>`/`</S>` rows → `ElmoRepresentations`."""
        with torch.set_grad_enabled(self.requires_grad and torch.is_grad_enabled()):
            layers = self.elmo(input_ids, attention_mask).hidden_states
        mask = attention_mask.bool() if attention_mask is not None else (input_ids > 0).any(dim=-1)
        if not self.keep_sentence_boundaries:
            stripped = [remove_sentence_boundaries(layer, mask)[0] for layer in layers]
            layers, mask = tuple(stripped), mask[:, 2:]
        representations = tuple(mix(layers, mask) for mix in self.scalar_mixes)
        return ElmoRepresentations(representations=representations, mask=mask, hidden_states=layers)


class _ElmoTaskModel(ElmoPreTrainedModel):
    """The paper's way into a task model: the biLM (frozen unless `config.freeze_elmo` is False), a learned scalar
    mix of its layers with dropout, and a biLSTM task encoder (`config.task_hidden_size` per direction)."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.elmo = ElmoModel(config)
        self.scalar_mix = ElmoScalarMix(config.num_output_layers)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.encoder = nn.LSTM(config.output_dim, config.task_hidden_size, batch_first=True, bidirectional=True)
        self.elmo.requires_grad_(not config.freeze_elmo)

    @classmethod
    def from_pretrained(cls, *args, **kwargs) -> _ElmoTaskModel:
        """`PreTrainedModel.from_pretrained`; the loaded biLM is frozen again (loading makes new parameters)."""
        model = super().from_pretrained(*args, **kwargs)
        model.elmo.requires_grad_(not model.config.freeze_elmo)
        return model

    def train(self, mode: bool = True) -> _ElmoTaskModel:
        super().train(mode)
        if self.config.freeze_elmo:  # a fixed biLM gives the same vectors in training as at inference
            self.elmo.eval()
        return self

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """(batch, positions, chars) → the task encoder's states (batch, positions, 2 * task_hidden_size), the
        mask (batch, positions) and the biLM layers."""
        with torch.set_grad_enabled(not self.config.freeze_elmo and torch.is_grad_enabled()):
            layers = self.elmo(input_ids, attention_mask).hidden_states
        mask = attention_mask.bool() if attention_mask is not None else (input_ids > 0).any(dim=-1)
        mixed = self.dropout(self.scalar_mix(layers, mask))
        lengths = mask.sum(dim=1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(mixed, lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.encoder(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=mixed.shape[1])
        return self.dropout(states), mask, layers

    def regularisation(self) -> torch.Tensor:
        """The paper's `lambda * ||s||^2` on the layer scores."""
        return self.config.scalar_mix_l2 * self.scalar_mix.l2_penalty()


class ElmoForTokenClassification(_ElmoTaskModel):
    """A tagger (NER, POS, chunking): `_ElmoTaskModel` and a linear layer per position.

    `labels` (batch, positions) are aligned with the rows of `input_ids`: -100 for `<S>`, `</S>` and padding
    (`tokenizer(...).word_ids(i)` gives the word of every position). The loss is the mean cross-entropy of the
    labelled positions plus the mix regulariser.
    """

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.classifier = nn.Linear(2 * config.task_hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        states, _, layers = self.encode(input_ids, attention_mask)
        logits = self.classifier(states)  # (batch, positions, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
            loss = loss + self.regularisation()
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=layers if output_hidden_states else None)


class ElmoForSequenceClassification(_ElmoTaskModel):
    """A sentence classifier: `_ElmoTaskModel`, max- and mean-pooling of the task encoder over the real positions,
    and a linear layer. `labels` (batch,) as in transformers: class ids (cross-entropy), floats with
    `num_labels == 1` (regression) or multi-hot rows (`problem_type="multi_label_classification"`)."""

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.classifier = nn.Linear(4 * config.task_hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        states, mask, layers = self.encode(input_ids, attention_mask)
        real = mask[..., None]
        maximum = states.masked_fill(~real, torch.finfo(states.dtype).min).amax(dim=1)
        mean = (states * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)
        logits = self.classifier(torch.cat([maximum, mean], dim=-1))  # (batch, num_labels)
        loss = None
        if labels is not None:
            problem = self.config.problem_type or (
                "regression" if self.num_labels == 1
                else "single_label_classification" if labels.dtype in (torch.long, torch.int) else
                "multi_label_classification"
            )
            if problem == "regression":
                loss = F.mse_loss(logits.squeeze(-1), labels.float().reshape(-1))
            elif problem == "single_label_classification":
                loss = F.cross_entropy(logits, labels.reshape(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits, labels.float())
            loss = loss + self.regularisation()
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=layers if output_hidden_states else None
        )


ElmoModel.register_for_auto_class("AutoModel")
ElmoForBidirectionalLM.register_for_auto_class("AutoModelForPreTraining")
ElmoForTokenClassification.register_for_auto_class("AutoModelForTokenClassification")
ElmoForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = [
    "ElmoBidirectionalLMOutput",
    "ElmoForBidirectionalLM",
    "ElmoForSequenceClassification",
    "ElmoForTokenClassification",
    "ElmoModel",
    "ElmoModelOutput",
    "ElmoPreTrainedModel",
    "ElmoRepresentations",
    "ElmoScalarMix",
    "ElmoState",
    "ElmoWithScalarMixes",
    "remove_sentence_boundaries",
]
