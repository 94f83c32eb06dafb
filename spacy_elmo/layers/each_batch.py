"""A layer of one batch (`elmo_torch`) run on every batch of sentences; out of device memory, in halves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch
from thinc.api import Model
from thinc.types import Floats4d

from hf_elmo.runtime import OutOfDeviceMemoryError, halve_on_out_of_memory

from .types import Sentence, SentenceBatches, empty_backprop


def each_batch(layer: Model[list[Sentence], Floats4d]) -> Model[SentenceBatches, SentenceBatches]:
    """`layer` run on every batch of sentences, its outputs kept in order as the batches' `layers`. A prediction
    that runs out of device memory runs again in halves of the batch (`halve_on_out_of_memory`): the same layers."""
    return Model("elmo_each_batch", each_batch_forward, layers=[layer])


def each_batch_forward(model: Model, rows: SentenceBatches, is_train: bool) -> tuple[SentenceBatches, Callable]:
    layer = model.layers[0]
    if is_train:
        outputs = [_fine_tuning_pass(layer, batch) for batch in rows.batches]
    else:
        join = partial(_join_rows, model.ops)
        outputs = [(halve_on_out_of_memory(batch, layer.predict, join, _describe), empty_backprop)
                   for batch in rows.batches]

    def backprop(d_rows: SentenceBatches) -> SentenceBatches:
        for (_, backprop_batch), d_layers in zip(outputs, d_rows.layers):
            backprop_batch(d_layers)
        return replace(d_rows, layers=[])

    return replace(rows, layers=[layers for layers, _ in outputs]), backprop


def _fine_tuning_pass(layer: Model[list[Sentence], Floats4d], batch: list[Sentence]) -> tuple[Floats4d, Callable]:
    """`layer`'s forward in training; no memory for the batch is one clear error (its backward needs it whole)."""
    try:
        return layer(batch, True)
    except torch.cuda.OutOfMemoryError:
        positions = len(batch) * (max(len(sentence.words) for sentence in batch) + 2)
        raise OutOfDeviceMemoryError(
            f"fine-tuning the biLM on a batch of {len(batch)} sentences ({positions} padded positions) ran out of "
            "device memory: lower [components.elmo.model] max_batch_tokens, or freeze the biLM"
        ) from None


def _join_rows(ops: Any, parts: list[Floats4d]) -> Floats4d:
    """The layers (n_layers + 1, rows, positions, width) of consecutive parts of a batch as the batch's: rows one after
    the other, each part padded to the longest part's positions."""
    n_layers, _, _, width = parts[0].shape
    joined = ops.alloc((n_layers, sum(p.shape[1] for p in parts), max(p.shape[2] for p in parts), width),
                       dtype=parts[0].dtype)
    start = 0
    for part in parts:
        joined[:, start : start + part.shape[1], : part.shape[2]] = part
        start += part.shape[1]
    return joined


def _describe(sentence: Sentence) -> str:
    return f"a sentence of {len(sentence.words)} words"
