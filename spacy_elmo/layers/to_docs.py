"""Every row's word vectors put back at its tokens' places in its Doc's array: the last step of the biLM layer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from thinc.api import Model
from thinc.types import Floats3d

from .types import Sentence, SentenceBatches


def to_docs() -> Model[SentenceBatches, list[Floats3d]]:
    """Every row's word vectors put at its tokens' places in its Doc's array (nL, n_tokens, nO); whitespace tokens
    keep zero rows."""
    return Model("elmo_to_docs", to_docs_forward, dims={"nO": None, "nL": None})


def to_docs_forward(model: Model, rows: SentenceBatches, is_train: bool) -> tuple[list[Floats3d], Callable]:
    ops = model.ops
    if not rows.doc_lengths:
        return [], lambda d_outputs: rows  # no Doc: no layers, no gradient
    # the widths of the biLM's arrays; the layer's own dimensions only where no Doc had a sentence for it
    n_layers, _, _, width = rows.layers[0].shape if rows.layers else (model.get_dim("nL"), 0, 0, model.get_dim("nO"))
    doc_starts = np.cumsum([0, *rows.doc_lengths])
    places = [_token_places(batch, doc_starts, ops) for batch in rows.batches]
    # One array of every Doc's tokens, filled by one gather per batch (a GPU gets a few kernels, never one per row).
    tokens = ops.alloc3f(n_layers, int(doc_starts[-1]), width)
    for (row, position, token), layers in zip(places, rows.layers):
        tokens[:, token] = layers[:, row, position]

    def backprop(d_outputs: list[Floats3d]) -> SentenceBatches:
        d_tokens = ops.xp.concatenate(d_outputs, axis=1) if d_outputs else tokens
        d_layers = []
        for (row, position, token), layers in zip(places, rows.layers):
            d_batch = ops.alloc(layers.shape, dtype="f")
            d_batch[:, row, position] = d_tokens[:, token]
            d_layers.append(d_batch)
        return replace(rows, layers=d_layers)

    return ops.xp.split(tokens, doc_starts[1:-1].tolist(), axis=1), backprop


def _token_places(batch: list[Sentence], doc_starts: np.ndarray, ops: Any) -> tuple[Any, Any, Any]:
    """Where each word of a batch is: its row and position in the batch's layers, and its token's place in the
    concatenation of the Docs (index arrays on `ops`' device, made on the host)."""
    lengths = [len(sentence.words) for sentence in batch]
    row = np.repeat(np.arange(len(batch), dtype="int32"), lengths)
    position = np.concatenate([np.arange(n, dtype="int32") for n in lengths])
    token = np.concatenate([s.tokens + doc_starts[s.doc] for s in batch]).astype("int32")
    return ops.asarray_i(row), ops.asarray_i(position), ops.asarray_i(token)
