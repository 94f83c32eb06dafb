"""The biLM as a stream: rows join and leave between runs of a few steps (continuous batching, for a server).

`ElmoModel.forward` runs a batch from its first step to its last: rows that end early leave the steps (the active
rows shrink), and a row that comes while it runs waits for the next batch. `ElmoStream` keeps the biLSTM going:
`add` puts rows in (their char CNN now), and each `advance` runs every row in flight a few more steps, from the
state it left them in, and hands back the rows that ended. Its steps then hold as many rows as are in flight,
whenever they came and whatever their lengths, not a batch's dwindling rest (docs/serving.md, "Batching").

An advance is the model's own `ElmoBiLstm.forward` through the kernels' recurrence (`ElmoKernels.lstm`) over each
row's next positions: the forward LM's from the row's start, the backward LM's from its end, each layer over all
the steps before the next (its input projections in one matmul, one layer's weights at a time in the caches), with
the final state of each row carried to the next advance. A row's layers are the model's for it alone, but for
float32 rounding (the matmuls' shapes differ).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .inference_cache import ElmoInferenceCache
from .kernels import ElmoKernels
from .modeling_elmo import ElmoModel
from .text import ElmoBatch


@dataclass(eq=False)
class _Row:
    """A row in flight: its token representations (positions, P), its layers so far (n_layers, positions, 2P), the
    steps done."""

    key: Hashable
    tokens: torch.Tensor
    layers: torch.Tensor
    done: int = 0

    @property
    def left(self) -> int:
        return len(self.tokens) - self.done


class ElmoStream:
    """`model`'s biLM over rows that join (`add`) and leave (`advance`) between advances, in inference (no gradient),
    in the `quantize` mode, reading and filling `cache`. Used under one autocast (the bf16 mode) and
    `torch.inference_mode()`, by one thread at a time."""

    def __init__(self, model: ElmoModel, cache: ElmoInferenceCache | None = None, quantize: str | None = None):
        self.model, self.cache, self.quantize = model, cache, quantize
        self.options = model.config.kernels()
        self.parameters = list(model.parameters())
        self.rows: list[_Row] = []
        self.state = model.bilstm.zero_state(0, self.parameters[0])  # (h, c), each (n_layers, 2, rows, ·)

    def __len__(self) -> int:
        """The rows in flight."""
        return len(self.rows)

    @property
    def positions(self) -> int:
        """The positions the rows in flight have left."""
        return sum(row.left for row in self.rows)

    def add(self, batch: ElmoBatch, keys: Sequence[Hashable]) -> None:
        """The rows of `batch` (on the model's device) join, keyed by `keys`, from the zero state: their token
        representations computed now, their steps from the next `advance` on."""
        if len(keys) != len(batch.lengths):
            raise ValueError(f"{len(keys)} keys for {len(batch.lengths)} rows")
        if not keys:
            return
        kernels = ElmoKernels(self.options, batch.input_ids, batch.lengths, self.cache, self.parameters,
                              self.quantize)
        tokens = kernels.token_representations(self.model.char_cnn.weights(), batch.input_ids,
                                               batch.attention_mask, batch.word_input_ids)
        n_layers, width = len(self.model.bilstm.layers), 2 * tokens.shape[-1]
        for key, row_tokens, length in zip(keys, tokens, batch.lengths):
            self.rows.append(_Row(key, row_tokens[:length], row_tokens.new_zeros(n_layers, length, width)))
        zeros = self.model.bilstm.zero_state(len(keys), tokens)
        self.state = tuple(torch.cat([old, new], dim=2) for old, new in zip(self.state, zeros))

    def advance(self, steps: int) -> list[tuple[Hashable, tuple[torch.Tensor, ...]]]:
        """Every row at most `steps` steps further (in both directions, through every layer); the rows that ended
        leave, each as (key, its layers): n_layers + 1 tensors (positions, 2P), layer 0 `[token; token]`,
        boundaries included, as `ElmoModel`'s `hidden_states` of that row."""
        if not self.rows:
            return []
        counts = [min(row.left, steps) for row in self.rows]
        longest = max(counts)
        # Row r's next positions for each LM: the forward LM's from its start on, the backward LM's from its end
        # back; `ElmoBiLstm` reads the backward half of a row reversed within its count.
        halves = []
        for row, count in zip(self.rows, counts):
            end = len(row.tokens) - row.done
            halves.append(F.pad(torch.cat([row.tokens[row.done : row.done + count], row.tokens[end - count : end]],
                                          dim=-1), (0, 0, 0, longest - count)))
        token_layer = torch.stack(halves)  # (rows, longest, 2P)
        mask = torch.arange(longest, device=token_layer.device) < torch.tensor(counts, device=token_layer.device)[:,
                                                                                                                 None]
        kernels = ElmoKernels(self.options, token_layer, counts, self.cache, self.parameters, self.quantize,
                              few_steps=True)
        layers, self.state = self.model.bilstm(token_layer, mask, self.state, True, kernels.lstm)
        width = token_layer.shape[-1] // 2
        for index, (row, count) in enumerate(zip(self.rows, counts)):
            end = len(row.tokens) - row.done
            for layer, output in enumerate(layers):
                row.layers[layer, row.done : row.done + count, :width] = output[index, :count, :width]
                row.layers[layer, end - count : end, width:] = output[index, :count, width:]
            row.done += count
        ended = [index for index, row in enumerate(self.rows) if row.left == 0]
        if not ended:
            return []
        finished = [(row.key, (torch.cat([row.tokens, row.tokens], dim=-1), *row.layers))
                    for row in (self.rows[index] for index in ended)]
        keep = [index for index, row in enumerate(self.rows) if row.left]
        self.rows = [self.rows[index] for index in keep]
        keep_index = torch.tensor(keep, dtype=torch.long, device=token_layer.device)
        self.state = tuple(part[:, :, keep_index] for part in self.state)
        return finished
