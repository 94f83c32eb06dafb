"""`spacy-elmo.ElmoBiLM.v1`: the biLM layer of `bilm.build_bilm` behind one Thinc node that holds its shim, the
structure of the pipelines saved with v1 (Thinc restores a saved model node by node, so the layers behind it are
not its children: they come from the config at every load)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats3d

from .shim import elmo_shim
from .types import Setting


def build_bilm_v1(layers: Model[list[Doc], list[Floats3d]]) -> Model[list[Doc], list[Floats3d]]:
    """`layers` (a `build_bilm` biLM layer) behind one node holding its `ElmoShim`."""
    return Model("elmo_bilm", bilm_v1_forward, init=bilm_v1_init, dims={"nO": None, "nL": None},
                 attrs={"layers": Setting(layers)}, shims=[elmo_shim(layers)])


def bilm_v1_forward(model: Model, docs: Sequence[Doc], is_train: bool) -> tuple[list[Floats3d], Callable]:
    return model.attrs["layers"].value(docs, is_train)


def bilm_v1_init(model: Model, X: Any = None, Y: Any = None) -> None:
    """The layers behind initialized (their weights read unless set or loaded before), their dimensions taken."""
    layers = model.attrs["layers"].value
    layers.initialize(X=X)
    model.set_dim("nO", layers.get_dim("nO"), force=True)
    model.set_dim("nL", layers.get_dim("nL"), force=True)
