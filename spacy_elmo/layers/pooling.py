"""Pooling help for spaCy's text classifiers: Thinc's max / first / last reductions need a row per text."""

from __future__ import annotations

from collections.abc import Callable

from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats2d


def at_least_one_row(tok2vec: Model[list[Doc], list[Floats2d]]) -> Model[list[Doc], list[Floats2d]]:
    """`tok2vec`'s vectors per Doc, with one zero row (and no gradient) for a Doc without tokens."""
    return Model("at_least_one_row", _at_least_one_row_forward, init=_at_least_one_row_init, layers=[tok2vec],
                 dims={"nO": tok2vec.maybe_get_dim("nO")})


def _at_least_one_row_init(model: Model, X: list[Doc] | None = None, Y: None = None) -> None:
    tok2vec = model.layers[0]
    tok2vec.initialize(X=X)
    if model.has_dim("nO") is not True and tok2vec.maybe_get_dim("nO") is not None:
        model.set_dim("nO", tok2vec.get_dim("nO"))


def _at_least_one_row_forward(
    model: Model, docs: list[Doc], is_train: bool
) -> tuple[list[Floats2d], Callable[[list[Floats2d]], list[Doc]]]:
    rows, backprop = model.layers[0](docs, is_train)
    padded = [vectors if len(vectors) else model.ops.alloc2f(1, vectors.shape[1]) for vectors in rows]

    def backprop_padded(d_padded: list[Floats2d]) -> list[Doc]:
        return backprop([d_vectors[: len(vectors)] for vectors, d_vectors in zip(rows, d_padded)])

    return padded, backprop_padded
