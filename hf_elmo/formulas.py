"""The biLM's arithmetic, written once for both of its implementations: the weight records they read and the formulas
of each step, every one taking the matmul it runs through.

`modeling_elmo.py`'s blocks compute the paper's biLM with these formulas and `F.linear` (the reference
implementation); `kernels.py` computes the same with its fast matmuls (oneDNN with packed weights, batched MKL, bf16
packs, weights cast once under GPU autocast). Neither writes a formula of its own, so they cannot drift.

- The records: `CharCnnWeights` (`ElmoCharCNN.weights()`), `LstmWeights` (`ElmoLstmLayer.weights()`): the parameters
  themselves, never copies; `LayerState`.
- The char CNN: `convolve_pool_activate` (every filter bank over every window of characters, max-pooled, biased,
  activated), `highway`, `project_tokens` (the word embedding beside the highway output, projected).
- The LSTM: `lstm_cell` (one step of both directions from the gate pre-activations, clipped where the layer clips).
- After the biLM: `scalar_mix` (the paper's mix of the layers; `scalar_mix_weights`, softmax with layer dropout) and
  `pool_words` (one vector per sentence), which the torch module, the spaCy layers and the embedder share.

One of the Hub remote code's files (`hub.REMOTE_CODE`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# (h, c) of one layer: h (2, batch, P), c (2, batch, D); direction 0 is the forward LM, 1 the backward LM.
LayerState = tuple[torch.Tensor, torch.Tensor]
# x (..., K), weight (N, K), bias (N,) or None → x @ weightᵀ + bias (..., N): `F.linear`, or a kernel's.
Matmul = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class CharCnnWeights:
    """The char CNN's parameters (`ElmoCharCNN.weights()`), never copies.

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
    """One biLSTM layer's parameters (`ElmoLstmLayer.weights()`), both directions stacked on a leading axis, gate
    blocks in TensorFlow's order (input, candidate, forget, output): input_weight (2, 4D, K), recurrent_weight
    (2, 4D, P), bias (2, 4D) as stored (`forget_bias` is added to the forget gate at run time), projection_weight
    (2, P, D) or None (no projection when P == D); the clips, None where the layer does not clip."""

    input_weight: torch.Tensor
    recurrent_weight: torch.Tensor
    bias: torch.Tensor
    projection_weight: torch.Tensor | None
    cell_clip: float | None
    proj_clip: float | None
    forget_bias: float

    @property
    def fused_exact(self) -> bool:
        """Whether `nn.LSTM(proj_size=P)` (cuDNN's LSTM on a GPU) computes this layer exactly: it clips nothing."""
        return self.cell_clip is None and self.proj_clip is None

    def parameters(self) -> list[torch.Tensor]:
        """Every weight of the layer."""
        return [w for w in (self.input_weight, self.recurrent_weight, self.bias, self.projection_weight)
                if w is not None]

    def bias_with_forget_bias(self) -> torch.Tensor:
        """(2, 4D) bias with `forget_bias` added to the forget gate (gates i, j, f, o)."""
        cell = self.bias.shape[1] // 4
        return torch.cat([self.bias[:, : 2 * cell], self.bias[:, 2 * cell : 3 * cell] + self.forget_bias,
                          self.bias[:, 3 * cell :]], dim=1)


def convolve_pool_activate(
    chars: torch.Tensor, filters: Sequence[tuple[torch.Tensor, torch.Tensor]], activation: str, matmul: Matmul
) -> torch.Tensor:
    """(words, chars, char_dim) embedded characters → (words, n_filters): every bank (Conv1d's weight (n, char_dim,
    width) and bias (n,)) as one matmul of every window of `width` characters with the flattened filters, max-pooled
    over the windows, then the bias (the same maximum as adding it to every window first: rounding is monotonic)
    and the activation (`"relu"` or `"tanh"`)."""
    act = torch.tanh if activation == "tanh" else F.relu
    pooled = []
    for weight, bias in filters:
        windows = chars.unfold(1, weight.shape[2], 1).flatten(2)  # (words, windows, char_dim * width)
        pooled.append(act(matmul(windows, weight.flatten(1), None).amax(dim=1) + bias))
    return torch.cat(pooled, dim=-1)


def highway(x: torch.Tensor, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], matmul: Matmul) -> torch.Tensor:
    """(words, F) → (words, F): per layer y = t * relu(W_transform x) + (1 - t) * x with gate t = sigmoid(W_carry x),
    the (2F, F) weight's first half the transform, second half the gate (bilm-tf's "carry")."""
    for weight, bias in layers:
        transform, carry = matmul(x, weight, bias).chunk(2, dim=-1)
        gate = torch.sigmoid(carry)
        x = gate * F.relu(transform) + (1 - gate) * x
    return x


def project_tokens(
    highway_output: torch.Tensor,
    word_vectors: torch.Tensor | None,
    projection: tuple[torch.Tensor, torch.Tensor] | None,
    matmul: Matmul,
) -> torch.Tensor:
    """(tokens, F) highway outputs, with a word embedding each token's (tokens, word_dim) vector before them, through
    the projection where there is one → (tokens, output_dim)."""
    x = highway_output if word_vectors is None else torch.cat([word_vectors, highway_output], dim=-1)
    return x if projection is None else matmul(x, *projection)


def lstm_cell(
    weights: LstmWeights, gates: torch.Tensor, c: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor]
) -> LayerState:
    """One step of both directions: the gate pre-activations (2, n, 4D) (input, recurrent and bias, forget bias
    included) and the cell c (2, n, D) → the new (h (2, n, P), c), clipped where the layer clips; `project` maps h
    (2, n, D) → (2, n, P) where the layer projects."""
    cell = c.shape[-1]
    # Gates in TensorFlow's order (i, j, f, o): the sigmoid only where it is used (not over j).
    input_gate = torch.sigmoid(gates[..., :cell])
    candidate = torch.tanh(gates[..., cell : 2 * cell])
    forget_gate, output_gate = torch.sigmoid(gates[..., 2 * cell :]).chunk(2, dim=-1)
    c = torch.addcmul(forget_gate * c, input_gate, candidate)
    if weights.cell_clip is not None:
        c = c.clamp(-weights.cell_clip, weights.cell_clip)
    h = output_gate * torch.tanh(c)
    if weights.projection_weight is not None:
        h = project(h)
    if weights.proj_clip is not None:
        h = h.clamp(-weights.proj_clip, weights.proj_clip)
    return h, c


# -- after the biLM: the scalar mix and the sentence vector -------------------------------------------------------


def scalar_mix_weights(
    scalar_parameters: torch.Tensor, layer_dropout: float = 0.0, training: bool = False
) -> torch.Tensor:
    """softmax(s), shape (num_layers,). In training each layer is dropped with probability `layer_dropout`: its
    weight is 0 and the others are renormalised (all dropped: the uniform average, as AllenNLP's)."""
    if training and layer_dropout > 0:
        dropped = torch.rand_like(scalar_parameters) < layer_dropout
        scalar_parameters = scalar_parameters.masked_fill(dropped, -1e20)
    return torch.softmax(scalar_parameters, dim=0)


def scalar_mix(
    layers: Sequence[torch.Tensor] | torch.Tensor,
    weights: torch.Tensor,
    gamma: torch.Tensor | float = 1.0,
    mask: torch.Tensor | None = None,
    layer_norm: bool = False,
    layer_norm_eps: float = 1e-12,
) -> torch.Tensor:
    """The paper's mix, `gamma * sum_j weights_j * h_j`: `num_layers` layers (batch, positions, width) (or one
    tensor of them all) and their weights (num_layers,) → (batch, positions, width). With `layer_norm` each layer is
    first normalised with the mean and variance of all values of one sequence's real positions (a row of the batch,
    `mask` (batch, positions)): a row's output never depends on the other rows. The one definition of the mix:
    `ElmoScalarMix` (a row: one sentence, as the biLM read it), the spaCy mix (a row: one Doc, all its sentences),
    the embedder's `"mix"` layers and the Doc vectors all compute it here."""
    dtype = layers[0].dtype
    weights = weights.to(dtype)
    if isinstance(layers, torch.Tensor) and not layer_norm:  # stacked: one matmul over the layer axis
        mixed = torch.tensordot(weights, layers, dims=1)
    else:
        mixed = sum(weight * (_normalise(layer, mask, layer_norm_eps) if layer_norm else layer)
                    for weight, layer in zip(weights, layers))
    return gamma.to(dtype) * mixed if isinstance(gamma, torch.Tensor) else gamma * mixed


def _normalise(layer: torch.Tensor, mask: torch.Tensor | None, eps: float) -> torch.Tensor:
    """(batch, positions, width) → the same normalised to mean 0, variance 1 over each row's real values."""
    if mask is None:
        mask = torch.ones(layer.shape[:2], dtype=torch.bool, device=layer.device)
    weights = mask.to(layer.dtype)[..., None]  # (batch, positions, 1)
    count = (weights.sum(dim=(1, 2)) * layer.shape[-1]).clamp(min=1)[:, None, None]
    mean = (layer * weights).sum(dim=(1, 2), keepdim=True) / count
    variance = (((layer - mean) * weights) ** 2).sum(dim=(1, 2), keepdim=True) / count
    return (layer - mean) / torch.sqrt(variance + eps) * weights


def pool_words(parts: Iterable[torch.Tensor], pool: str) -> torch.Tensor:
    """One sentence's word vectors in consecutive parts (..., n_i, width) along its words (its windows, or the whole
    sentence as one part; read once, never held together) → (..., width): the mean over all its words (their sum /
    their count) or the max; zeros for a sentence without words. The one definition of a sentence's vector:
    `ElmoEmbedder(pool=...)` / `elmo embed --pool` and the spaCy component's `Doc.vector` (the mean of a Doc's
    tokens, mixed) compute it here."""
    if pool not in ("mean", "max"):
        raise ValueError(f'pool must be "mean" or "max", got {pool!r}')
    pooled, words, first = None, 0, None
    for part in parts:
        first = part if first is None else first
        if not part.shape[-2]:
            continue
        reduced = part.sum(dim=-2) if pool == "mean" else part.amax(dim=-2)
        pooled = reduced if pooled is None else (pooled + reduced if pool == "mean" else torch.maximum(pooled, reduced))
        words += part.shape[-2]
    if pooled is None:
        return first.new_zeros((*first.shape[:-2], first.shape[-1]))
    return pooled / words if pool == "mean" else pooled
