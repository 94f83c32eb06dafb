"""Each batch's layers without the `<S>` and `</S>` positions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from thinc.api import Model

from .types import SentenceBatches


def strip_boundaries() -> Model[SentenceBatches, SentenceBatches]:
    """Each batch's layers without the `<S>` and `</S>` positions: (…, positions, width) → (…, positions - 2,
    width); position j of a row is then its word j."""
    return Model("elmo_strip_boundaries", strip_boundaries_forward)


def strip_boundaries_forward(model: Model, rows: SentenceBatches, is_train: bool) -> tuple[SentenceBatches, Callable]:
    # Past a row's </S> there is padding: its positions stay, as any other padding; the first one is where </S> was.
    shapes = [layers.shape for layers in rows.layers]

    def backprop(d_rows: SentenceBatches) -> SentenceBatches:
        d_layers = []
        for shape, d_words in zip(shapes, d_rows.layers):
            d_full = model.ops.alloc(shape, dtype="f")
            d_full[:, :, 1:-1] = d_words
            d_layers.append(d_full)
        return replace(d_rows, layers=d_layers)

    return replace(rows, layers=[layers[:, :, 1:-1] for layers in rows.layers]), backprop
