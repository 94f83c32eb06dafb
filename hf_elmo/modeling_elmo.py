"""ELMo biLM (Peters et al. 2018) in PyTorch, weight-compatible with AllenNLP and bilm-tf.

Data flow: character ids (batch, positions, chars) → `ElmoCharCNN` (char embedding, convolutions with
max-pooling, highway layers, projection) → token representation (batch, positions, P) → `ElmoBiLstm`
(separate forward and backward stacks of clipped LSTMs with projection, residual from layer 2 on) →
`n_layers + 1` layers of (batch, positions, 2P): the token representation duplicated, then each biLSTM layer
as [forward; backward]. `ElmoScalarMix` combines them into one task-specific representation.

Each block's `forward` is the paper's computation written plainly, with the formulas of `formulas.py` and `F.linear`
(`config.implementation = "reference"`, and what compilers trace). By default (`"kernels"`) `ElmoModel.forward` hands
each block's weights, as a record, to `kernels.ElmoKernels` made for the call: the same formulas through fast
matmuls (oneDNN or cuDNN, the char CNN once per distinct word, the LSTM step loop over the rows still active, caches),
as transformers picks an attention implementation from the config.

Every sentence starts from the zero state unless `initial_state` is given, so a sentence's vectors do not
depend on the other rows of its batch. `final_state` + `initial_state` reproduce the original stateful biLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
from .formulas import (
    CharCnnWeights,
    LayerState,
    LstmWeights,
    convolve_pool_activate,
    highway,
    lstm_cell,
    project_tokens,
    scalar_mix,
    scalar_mix_weights,
)
from .inference_cache import ElmoInferenceCache
from .kernel_plan import mode_problem
from .kernels import ElmoKernels
from .text import remove_sentence_boundaries

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
        attention_mask (`torch.BoolTensor` of shape `(batch, positions)`): the real positions the layers were
            computed for (the heads read it rather than deriving it again).
    """

    last_hidden_state: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    final_state: ElmoState | None = None
    attention_mask: torch.BoolTensor | None = None


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


# -- the char CNN ------------------------------------------------------------------------------------------------


class ElmoHighwayLayer(nn.Linear):
    """One highway layer's Linear(F, 2F): the transform, then the gate (its own class for its initialisation)."""


class ElmoHighway(nn.Module):
    """Highway layers: y = t * relu(W_transform x) + (1 - t) * x with gate t = sigmoid(W_carry x).

    Each layer is one Linear(F, 2F) whose first half is the transform, second half the gate (bilm-tf's
    "carry", which despite its name gates the transform branch).
    """

    def __init__(self, dim: int, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(ElmoHighwayLayer(dim, 2 * dim) for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(words, F) → (words, F)"""
        return highway(x, [(layer.weight, layer.bias) for layer in self.layers], F.linear)


class ElmoCharCNN(nn.Module):
    """The context-independent token representation: each word's characters embedded, convolved by filter banks of
    several widths, max-pooled over positions and activated, then highway layers and a projection to the LSTM input
    width. A model with a word embedding (`config.word_embedding_dim`, ELMoForManyLangs') puts the word's vector
    before the highway output, and projects both."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.char_embedding = nn.Embedding(config.n_characters, config.char_embedding_dim, padding_idx=0)
        self.word_embedding = (nn.Embedding(config.word_vocab_size, config.word_embedding_dim, padding_idx=0)
                               if config.word_embedding_dim else None)
        self.padding_char_id = config.padding_char_id
        self.convs = nn.ModuleList(
            nn.Conv1d(config.char_embedding_dim, n_filters, kernel_size=width) for width, n_filters in config.filters
        )
        self.activation = config.activation
        self.highway = ElmoHighway(config.n_filters, config.n_highway)
        # bilm-tf projects only when the CNN width differs from the LSTM input width; ELMoForManyLangs always.
        self.projection = nn.Linear(config.token_input_dim, config.projection_dim) if config.projects_tokens else None

    def forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, word_input_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(batch, positions, chars) ids, (batch, positions) bool mask and, with a word embedding, (batch, positions)
        word ids → (batch, positions, projection_dim), zeros at padding."""
        chars = self.char_embedding(input_ids.flatten(0, 1))  # (words, chars, char_dim)
        filters = [(conv.weight, conv.bias) for conv in self.convs]
        pooled = convolve_pool_activate(chars, filters, self.activation, F.linear)  # (words, F)
        words = None if self.word_embedding is None else self.word_embedding(word_input_ids.flatten())
        projection = None if self.projection is None else (self.projection.weight, self.projection.bias)
        token = project_tokens(self.highway(pooled), words, projection, F.linear)
        return token.view(*input_ids.shape[:2], -1) * mask[..., None]

    def weights(self) -> CharCnnWeights:
        """The parameters, as the kernels read them."""
        return CharCnnWeights(
            char_embedding=self.char_embedding.weight,
            padding_idx=self.char_embedding.padding_idx,
            word_embedding=None if self.word_embedding is None else self.word_embedding.weight,
            filters=tuple((conv.weight, conv.bias) for conv in self.convs),
            activation=self.activation,
            highway=tuple((layer.weight, layer.bias) for layer in self.highway.layers),
            projection=None if self.projection is None else (self.projection.weight, self.projection.bias),
            padding_char_id=self.padding_char_id,
        )


# -- the biLSTM --------------------------------------------------------------------------------------------------


class ElmoLstmLayer(nn.Module):
    """One LSTM layer with projection for both directions, weights stacked on a leading direction axis.

    Gate blocks are in TensorFlow's order (input, candidate, forget, output), as in the original weights;
    the forget gate gets `config.forget_bias` added to its bias at run time (TensorFlow's LSTMCell adds 1; it is not
    part of the stored bias).
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
        self.forget_bias = config.forget_bias

    def forward(
        self, inputs: torch.Tensor, mask: torch.Tensor, state: LayerState
    ) -> tuple[torch.Tensor, LayerState]:
        """Both directions over `inputs` (2, batch, steps, input_dim) in processing order, `mask` (batch, steps),
        from `state` = (h (2, batch, P), c (2, batch, D)): every row at every step, a row's state kept where it is
        padded. Returns the outputs (2, batch, steps, P), zeros where padded, and each row's state after its last
        step."""
        h, c = state
        weights = self.weights()
        bias = weights.bias_with_forget_bias()
        projected = torch.matmul(inputs, self.input_weight.transpose(1, 2)[:, None]) + bias[:, None, None]
        outputs = []
        for step in range(inputs.shape[2]):
            gates = projected[:, :, step] + torch.bmm(h, self.recurrent_weight.transpose(1, 2))  # (2, batch, 4D)
            new_h, new_c = lstm_cell(weights, gates, c, lambda h: torch.bmm(h, self.projection_weight.transpose(1, 2)))
            active = mask[:, step, None]  # (batch, 1)
            h, c = torch.where(active, new_h, h), torch.where(active, new_c, c)
            outputs.append(new_h * active)
        if not outputs:
            return inputs.new_zeros(*inputs.shape[:3], h.shape[-1]), (h, c)
        return torch.stack(outputs, dim=2), (h, c)

    def weights(self) -> LstmWeights:
        """The parameters, as the kernels read them."""
        return LstmWeights(self.input_weight, self.recurrent_weight, self.bias, self.projection_weight,
                           self.cell_clip, self.proj_clip, self.forget_bias)


# `ElmoKernels.lstm`'s form: (layer's weights, inputs, mask, state, return_state) → (outputs, final state or None).
Recurrence = Callable[[LstmWeights, torch.Tensor, torch.Tensor, LayerState, bool], tuple]


class ElmoBiLstm(nn.Module):
    """Forward and backward stacks of LSTM layers; layer l of a direction reads layer l-1 of that direction."""

    def __init__(self, config: ElmoConfig):
        super().__init__()
        self.layers = nn.ModuleList(ElmoLstmLayer(config.projection_dim, config) for _ in range(config.n_layers))
        self.use_skip_connections = config.use_skip_connections
        self.dropout = nn.Dropout(config.dropout)
        self.projection_dim = config.projection_dim
        self.lstm_dim = config.lstm_dim

    def zero_state(self, batch: int, reference: torch.Tensor) -> ElmoState:
        """The state every sentence starts from by default."""
        n_layers = len(self.layers)
        return (
            reference.new_zeros(n_layers, 2, batch, self.projection_dim),
            reference.new_zeros(n_layers, 2, batch, self.lstm_dim),
        )

    def forward(
        self,
        token_layer: torch.Tensor,
        mask: torch.Tensor,
        initial_state: ElmoState | None = None,
        return_state: bool = True,
        recurrence: Recurrence | None = None,
    ) -> tuple[list[torch.Tensor], ElmoState | None]:
        """token_layer (batch, positions, 2P), layer 0 `[token; token]`, whose forward half the forward LM reads and
        whose backward half the backward LM reads, and the (batch, positions) mask → n_layers tensors (batch,
        positions, 2P), and with `return_state` the final state. Each layer runs its own `forward`, or
        `recurrence` with its weights (`ElmoKernels.lstm`)."""
        forward_input, backward_input = token_layer.chunk(2, dim=-1)
        batch, steps, width = forward_input.shape
        h0, c0 = initial_state if initial_state is not None else self.zero_state(batch, token_layer)
        # The backward LM reads each sentence reversed within its own length.
        row_lengths = mask.sum(dim=1)[:, None]
        position = torch.arange(steps, device=token_layer.device)
        reverse_index = torch.where(position < row_lengths, row_lengths - 1 - position, position)
        reverse_index = reverse_index[:, :, None].expand(-1, -1, width)
        layer_input = torch.stack([forward_input, backward_input.gather(1, reverse_index)])  # (2, batch, steps, P)

        layers, final_h, final_c = [], [], []
        for index, layer in enumerate(self.layers):
            layer_input = self.dropout(layer_input)
            state = (h0[index], c0[index])
            if recurrence is None:
                layer_output, state = layer(layer_input, mask, state)
            else:
                layer_output, state = recurrence(layer.weights(), layer_input, mask, state, return_state)
            if self.use_skip_connections and index > 0:
                layer_output = layer_output + layer_input
            layers.append(torch.cat([layer_output[0], layer_output[1].gather(1, reverse_index)], dim=-1))
            if return_state:
                final_h.append(state[0])
                final_c.append(state[1])
            layer_input = layer_output
        return layers, (torch.stack(final_h), torch.stack(final_c)) if return_state else None


# -- the scalar mix ----------------------------------------------------------------------------------------------


class ElmoScalarMix(nn.Module):
    """Task-specific combination of the biLM layers: `gamma * sum_j softmax(s)_j * h_j` (`formulas.scalar_mix`).

    Args:
        num_layers: number of layers mixed (`config.n_layers + 1`).
        do_layer_norm: normalise each layer first with the mean and variance of each row's real positions (all
            of its values; `scalar_mix`). The original normalised over the whole batch, which makes a sentence's
            output depend on its batch; per row keeps the output batch-independent.
        initial_scalar_parameters: initial `s` (default zeros = uniform average).
        trainable: learn `s` and `gamma` (False fixes them, e.g. `[-9e10, 1, -9e10]` selects layer 1).
        layer_dropout: in training, drop each layer from the mix with this probability (`scalar_mix_weights`).
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
        """softmax(s), shape (num_layers,), with layer dropout in training."""
        return scalar_mix_weights(self.scalar_parameters, self.layer_dropout, self.training)

    def l2_penalty(self) -> torch.Tensor:
        """sum(s^2), the paper's regulariser (multiply by lambda, e.g. 0.001)."""
        return (self.scalar_parameters**2).sum()

    def forward(self, layers: Sequence[torch.Tensor] | torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`num_layers` tensors (batch, positions, width) and a mask (batch, positions) → (batch, positions, width)"""
        if len(layers) != self.num_layers:
            raise ValueError(f"ElmoScalarMix expects {self.num_layers} layers, got {len(layers)}")
        mixed = scalar_mix(layers, self.layer_weights(), self.gamma, mask, self.do_layer_norm, self.layer_norm_eps)
        return self.dropout(mixed)


# -- the models --------------------------------------------------------------------------------------------------


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

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part of the biLM (`elmo info`): char embedding + CNN, the word embedding (ELMoForManyLangs'
        models), highway, projection, each biLSTM layer, the softmax (`ElmoForBidirectionalLM`), and the total
        (a task model's head included)."""
        elmo, cnn = self.base_model, self.base_model.char_cnn

        def size(*modules: nn.Module) -> int:
            return sum(parameter.numel() for module in modules for parameter in module.parameters())

        counts = {
            "char embedding + CNN": size(cnn.char_embedding, cnn.convs),
            **({"word embedding": size(cnn.word_embedding)} if cnn.word_embedding is not None else {}),
            "highway": size(cnn.highway),
            "projection": size(cnn.projection),
            **{f"biLSTM layer {index + 1}": size(layer) for index, layer in enumerate(elmo.bilstm.layers)},
            **({"softmax": size(self.softmax)} if getattr(self, "softmax", None) is not None else {}),
        }
        counts["total"] = size(self)
        return counts

    def resize_token_embeddings(self, *args, **kwargs) -> NoReturn:
        """ELMo has no token vocabulary to resize: its input is characters (UTF-8 bytes, a fixed table of
        `n_characters` rows), so every word, new or not, already has a representation."""
        raise NotImplementedError(
            "ELMo reads characters (a fixed table of the 256 byte values and markers, config.n_characters = "
            f"{self.config.n_characters}), not a token vocabulary: new words need no new rows, and there is nothing "
            "to resize. To train the word softmax of ElmoForBidirectionalLM on another vocabulary, run elmo pretrain "
            "--init_model with a new --vocab_file."
        )


class ElmoModel(ElmoPreTrainedModel):
    """The ELMo biLM: character ids in, `n_layers + 1` contextual layers out."""

    # The encoder loads from an `ElmoForBidirectionalLM` checkpoint; its word softmax is not needed here.
    _keys_to_ignore_on_load_unexpected = [r"^softmax\."]

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.char_cnn = ElmoCharCNN(config)
        self.bilstm = ElmoBiLstm(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.char_cnn.char_embedding

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.char_cnn.char_embedding = value

    def _validate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        lengths: Sequence[int] | None,
        initial_state: ElmoState | None,
        word_input_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[int] | None]:
        """Check the inputs; return the (batch, positions) bool mask and its row lengths on the host (None when
        traced). `lengths` given (an `ElmoBatch`'s) are trusted: the values are not read back from the device."""
        chars = self.config.max_characters_per_token
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 3 or input_ids.shape[-1] != chars:
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a tensor of shape (batch, positions, {chars}), got {shape}")
        if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer character ids, got dtype {input_ids.dtype}")
        if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape[:2]):
            raise ValueError(
                f"attention_mask must have shape {tuple(input_ids.shape[:2])}, got {tuple(attention_mask.shape)}"
            )
        if lengths is not None and len(lengths) != input_ids.shape[0]:
            raise ValueError(f"lengths must give one length per row ({input_ids.shape[0]}), got {len(lengths)}")
        if self.config.word_embedding_dim and (
                word_input_ids is None or tuple(word_input_ids.shape) != tuple(input_ids.shape[:2])):
            found = None if word_input_ids is None else tuple(word_input_ids.shape)
            raise ValueError(f"this biLM reads word ids beside the characters: word_input_ids of shape "
                             f"{tuple(input_ids.shape[:2])} (its tokenizer gives them), got {found}")
        mask = (input_ids > 0).any(dim=-1) if attention_mask is None else attention_mask.bool()
        if initial_state is not None:
            expected_h, expected_c = (s.shape for s in self.bilstm.zero_state(input_ids.shape[0], mask))
            if len(initial_state) != 2 or initial_state[0].shape != expected_h or initial_state[1].shape != expected_c:
                found = [tuple(s.shape) for s in initial_state]
                raise ValueError(
                    f"initial_state must be (h, c) of shapes {tuple(expected_h)} and {tuple(expected_c)}, got {found}"
                )
        if torch.compiler.is_compiling():  # the checks of values below would make shapes depend on the data
            return mask, None
        if lengths is not None:
            return mask, list(lengths)
        # The ids' range, whether a padding position precedes a real one, and the row lengths, read back at once: on
        # a GPU the host waits for the device once per call (an `ElmoBatch` brings its lengths: no wait at all).
        ids = input_ids.flatten() if input_ids.numel() else input_ids.new_zeros(1)
        words = ids.new_zeros(1) if word_input_ids is None or not word_input_ids.numel() else word_input_ids.flatten()
        misplaced_padding = (mask[:, 1:] & ~mask[:, :-1]).any()
        low, high, word_low, word_high, misplaced, *found_lengths = torch.cat(
            [ids.amin().view(1).long(), ids.amax().view(1).long(), words.amin().view(1).long(),
             words.amax().view(1).long(), misplaced_padding.view(1).long(), mask.sum(dim=1)]).tolist()
        if low < 0 or high >= self.config.n_characters:
            raise ValueError(f"character ids must lie in [0, {self.config.n_characters}), found [{low}, {high}]: were "
                             "they made by ElmoCharTokenizer?")
        if word_input_ids is not None and (word_low < 0 or word_high >= max(self.config.word_vocab_size, 1)):
            raise ValueError(f"word ids must lie in [0, {self.config.word_vocab_size}), found [{word_low}, "
                             f"{word_high}]: were they made by this model's ElmoCharTokenizer?")
        if misplaced:
            raise ValueError("every row must be padded on the right: a padding position precedes a real one")
        return mask, found_lengths

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        initial_state: ElmoState | None = None,
        return_state: bool = False,
        output_hidden_states: bool | None = None,
        inference_cache: ElmoInferenceCache | None = None,
        lengths: Sequence[int] | None = None,
        word_input_ids: torch.Tensor | None = None,
        quantize: str | None = None,
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
            lengths (`Sequence[int]`, optional): the real positions of each row, on the host (an `ElmoBatch` gives
                them: `model(**batch)`). The mask is then never read back from the device, and rows that come
                longest first are not sorted again.
            word_input_ids (`torch.LongTensor` of shape `(batch, positions)`): the word ids of a model with a word
                embedding (`config.word_embedding_dim`, ELMoForManyLangs'); its tokenizer gives them.
            quantize (`str`, optional): `"int8"`: the opt-in int8 mode on a CPU (inference only, under
                `torch.no_grad()`, with an `inference_cache`: the highway's, the token projection's and the LSTMs'
                weights in int8, quantized once and kept by it: docs/performance.md). None (the default): float32,
                exact.
        """
        if problem := mode_problem(False, quantize):
            raise ValueError(problem)
        mask, lengths = self._validate(input_ids, attention_mask, lengths, initial_state, word_input_ids)
        if quantize is not None and self.config.implementation == "reference":
            raise ValueError('quantize="int8" runs in the kernels: load the biLM with implementation="kernels" (the '
                             "default), not \"reference\"")
        if quantize is not None and inference_cache is None:
            # Quantizing the weights costs more than a forward: made at every call, int8 would be slower than float32.
            raise ValueError('quantize="int8" quantizes the weights once and keeps them in an inference cache: pass '
                             "one, model(..., quantize=\"int8\", inference_cache=ElmoInferenceCache()), and reuse it")
        if self.config.implementation == "reference" or torch.compiler.is_compiling():
            token_repr = self.char_cnn(input_ids, mask, word_input_ids)
            recurrence = None
        else:
            given_state = () if initial_state is None else initial_state
            kernels = ElmoKernels(self.config.kernels(), input_ids, lengths, inference_cache,
                                  [*self.parameters(), *given_state], quantize)
            token_repr = kernels.token_representations(self.char_cnn.weights(), input_ids, mask, word_input_ids)
            recurrence = kernels.lstm
        token_layer = torch.cat([token_repr, token_repr], dim=-1)  # layer 0, as wide as the biLSTM layers
        layers, final_state = self.bilstm(token_layer, mask, initial_state, return_state, recurrence)
        hidden_states = (token_layer, *layers)
        return ElmoModelOutput(
            last_hidden_state=hidden_states[-1],
            hidden_states=None if output_hidden_states is False else hidden_states,
            final_state=final_state if return_state else None,
            attention_mask=mask,
        )


def lm_target_index(attention_mask: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The predictions the biLM objective counts, as flat indices i into (batch × positions) (1-D each): the
    forward LM's state at i predicts `labels.flatten()[i + 1]`, the backward LM's state at i + 1 predicts
    `labels.flatten()[i]`; a pair of neighbours counts when both are real positions (never padding, whatever its
    labels) and the label is not -100. Made on the host with the batch (`encode_batch`), they cost the device no
    synchronisation."""
    real = attention_mask.bool()
    both_real = real[:, :-1] & real[:, 1:]
    masks = both_real & (labels[:, 1:] != -100), both_real & (labels[:, :-1] != -100)
    return tuple(F.pad(mask, (0, 1)).flatten().nonzero().squeeze(1) for mask in masks)


def lm_loss(forward_losses: torch.Tensor, backward_losses: torch.Tensor) -> torch.Tensor:
    """The biLM objective from the per-target cross-entropies of each direction: the mean of the forward and the
    backward LM's mean (a direction without targets counts 0)."""
    forward_mean = forward_losses.sum() / max(len(forward_losses), 1)
    return 0.5 * (forward_mean + backward_losses.sum() / max(len(backward_losses), 1))


class ElmoForBidirectionalLM(ElmoPreTrainedModel):
    """The biLM with one softmax shared by the forward and the backward LM (the paper's training set-up).

    `labels` (batch, positions) hold word ids of the softmax vocabulary aligned with `input_ids` (-100 =
    ignore): the forward LM at position t predicts `labels[t + 1]`, the backward LM predicts `labels[t - 1]`
    (`lm_target_index`; the loss is `lm_loss`). Training with a sampled softmax (`hf_elmo.training`) estimates
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
        lengths: Sequence[int] | None = None,
        word_input_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> ElmoBidirectionalLMOutput:
        """`labels` as in the class docstring; the other arguments as in `ElmoModel.forward`."""
        outputs, forward_states, backward_states = self.lm_states(
            input_ids, attention_mask, initial_state=initial_state, return_state=return_state,
            output_hidden_states=output_hidden_states, lengths=lengths, word_input_ids=word_input_ids,
        )
        forward_logits = self.softmax(forward_states)
        backward_logits = self.softmax(backward_states)
        loss = None
        if labels is not None:
            forward_index, backward_index = lm_target_index(outputs.attention_mask, labels)
            targets = labels.flatten()
            loss = lm_loss(
                F.cross_entropy(forward_logits.flatten(0, 1)[forward_index], targets[forward_index + 1],
                                reduction="none"),
                F.cross_entropy(backward_logits.flatten(0, 1)[backward_index + 1], targets[backward_index],
                                reduction="none"),
            )
        return ElmoBidirectionalLMOutput(
            loss=loss,
            forward_logits=forward_logits,
            backward_logits=backward_logits,
            hidden_states=outputs.hidden_states,
            final_state=outputs.final_state,
        )


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

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        lengths: Sequence[int] | None = None,
        word_input_ids: torch.Tensor | None = None,
    ) -> ElmoRepresentations:
        """(batch, positions, chars) ids with `<S>`/`</S>` rows (and `ElmoModel.forward`'s `attention_mask`,
        `lengths` and `word_input_ids`, e.g. `wrapper(**batch)` for an `ElmoBatch`) → `ElmoRepresentations`."""
        with torch.set_grad_enabled(self.requires_grad and torch.is_grad_enabled()):
            outputs = self.elmo(input_ids, attention_mask, lengths=lengths, word_input_ids=word_input_ids)
        layers, mask = outputs.hidden_states, outputs.attention_mask
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
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, loading info) with output_loading_info
        model.elmo.requires_grad_(not model.config.freeze_elmo)
        return loaded

    def train(self, mode: bool = True) -> _ElmoTaskModel:
        super().train(mode)
        if self.config.freeze_elmo:  # a fixed biLM gives the same vectors in training as at inference
            self.elmo.eval()
        return self

    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, word_input_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, ...]:
        """(batch, positions, chars) (and the word ids of a model with a word embedding) → the task encoder's states
        (batch, positions, 2 * task_hidden_size), the mask (batch, positions) and the biLM layers."""
        with torch.set_grad_enabled(not self.config.freeze_elmo and torch.is_grad_enabled()):
            outputs = self.elmo(input_ids, attention_mask, word_input_ids=word_input_ids)
        layers, mask = outputs.hidden_states, outputs.attention_mask
        mixed = self.dropout(self.scalar_mix(layers, mask))
        lengths = mask.sum(dim=1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(mixed, lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.encoder(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=mixed.shape[1])
        return self.dropout(states), mask, layers

    def _hidden_states(self, layers: tuple[torch.Tensor, ...], output_hidden_states: bool | None) -> tuple | None:
        """The biLM layers when asked for (the argument, else `config.output_hidden_states`, as in transformers)."""
        asked = output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        return layers if asked else None

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
        word_input_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> TokenClassifierOutput:
        states, _, layers = self.encode(input_ids, attention_mask, word_input_ids)
        logits = self.classifier(states)  # (batch, positions, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels), labels.reshape(-1), ignore_index=-100)
            loss = loss + self.regularisation()
        hidden_states = self._hidden_states(layers, output_hidden_states)
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=hidden_states)


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
        word_input_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        states, mask, layers = self.encode(input_ids, attention_mask, word_input_ids)
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
            loss=loss, logits=logits, hidden_states=self._hidden_states(layers, output_hidden_states)
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
    "scalar_mix",
    "scalar_mix_weights",
]
