"""A biLM owned by a downstream model (no `elmo` component): frozen, or fine-tuned with a factor on its gradient."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats3d

from .types import empty_backprop


def standalone_bilm(bilm: Model, freeze: bool = True, grad_factor: float = 1.0) -> Model[list[Doc], list[Floats3d]]:
    """A biLM owned by a downstream model (no `elmo` component): frozen, or fine-tuned with `grad_factor`."""
    return Model(
        "elmo_standalone_bilm",
        standalone_forward,
        init=standalone_init,
        layers=[bilm],
        dims={"nO": bilm.maybe_get_dim("nO"), "nL": bilm.maybe_get_dim("nL")},
        attrs={"freeze": freeze, "grad_factor": grad_factor},
    )


def standalone_init(model: Model, X: Any = None, Y: Any = None) -> None:
    bilm = model.layers[0]
    bilm.initialize(X=X)
    model.set_dim("nO", bilm.get_dim("nO"), force=True)
    model.set_dim("nL", bilm.get_dim("nL"), force=True)


def standalone_forward(model: Model, docs: Sequence[Doc], is_train: bool) -> tuple[list[Floats3d], Callable]:
    bilm = model.layers[0]
    if model.attrs["freeze"] or not is_train:
        return bilm.predict(docs), empty_backprop
    outputs, backprop_bilm = bilm(docs, is_train)
    grad_factor = model.attrs["grad_factor"]

    def backprop(d_outputs: list[Floats3d]) -> list:
        return backprop_bilm([d * grad_factor for d in d_outputs])

    return outputs, backprop
