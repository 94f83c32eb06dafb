"""The listener: a downstream model's window onto the shared `elmo` component.

In training the `elmo` component runs the biLM once per batch and sends the layers (and a backprop callback) to
every listener; in prediction, and in training when `elmo` only annotates, the listener reads
`doc._.elmo_layers`. The listener outputs per Doc (n_layers, n_tokens, width); the task's own ScalarMix follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from spacy.attrs import ORTH
from spacy.tokens import Doc
from thinc.api import Model
from thinc.types import Floats3d

from .standalone import standalone_bilm
from .types import empty_backprop


class ElmoListener(Model):
    """A layer fed by the upstream `elmo` component (found through `upstream_name`, `"*"` = any)."""

    name = "elmo_listener"

    def __init__(self, upstream_name: str, width: int, n_layers: int, grad_factor: float = 1.0) -> None:
        Model.__init__(
            self, name=self.name, forward=listener_forward, dims={"nO": width, "nL": n_layers},
            attrs={"grad_factor": grad_factor},
        )
        self.upstream_name = upstream_name
        self._batch_id: int | None = None
        self._outputs: list[Floats3d] | None = None
        self._backprop: Callable | None = None

    @classmethod
    def get_batch_id(cls, inputs: Iterable[Doc]) -> int:
        """A content hash of a batch (its words' ids summed, modulo 2**64), to check the listener is fed the batch it
        was sent."""
        sums = [doc.to_array(ORTH).sum(dtype=np.uint64) for doc in inputs]
        return int(np.sum(sums, dtype=np.uint64))  # an array's sum wraps silently (a scalar's would warn)

    def receive(self, batch_id: int, outputs: list[Floats3d], backprop: Callable) -> None:
        """Store the upstream component's outputs for a training batch and its backprop callback."""
        self._batch_id = batch_id
        self._outputs = outputs
        self._backprop = backprop

    def verify_inputs(self, inputs: Sequence[Doc]) -> None:
        batch_id = self.get_batch_id(inputs)
        if batch_id != self._batch_id:
            raise ValueError(
                f"ELMo listener got a batch ({batch_id}) other than the one the 'elmo' component sent "
                f"({self._batch_id}): every component listening to it must train on the same batches."
            )

    # The received batch (arrays and a backprop closure) is training-time state: it is never pickled.
    def __getstate__(self) -> tuple[dict[str, Any], str]:
        return {slot: getattr(self, slot) for slot in Model.__slots__ if hasattr(self, slot)}, self.upstream_name

    def __setstate__(self, state: tuple[dict[str, Any], str]) -> None:
        slots, self.upstream_name = state
        for slot, value in slots.items():
            setattr(self, slot, value)
        self._batch_id, self._outputs, self._backprop = None, None, None


def listener_forward(model: ElmoListener, docs: Sequence[Doc], is_train: bool) -> tuple[list[Floats3d], Callable]:
    if is_train and model._batch_id is not None:
        model.verify_inputs(docs)
        upstream_backprop = model._backprop
        grad_factor = model.attrs["grad_factor"]

        def backprop(d_layers: list[Floats3d]) -> Any:
            return upstream_backprop([d * grad_factor for d in d_layers])

        return model._outputs, backprop
    # Prediction (components may batch differently, so read the Doc), or training with an annotating `elmo`: the
    # Docs' host arrays cross to the device in one copy.
    layers = [_doc_layers(model, doc, required=is_train) for doc in docs]
    if not layers or model.ops.xp is np:
        return [model.ops.asarray3f(doc_layers) for doc_layers in layers], empty_backprop
    starts = np.cumsum([doc_layers.shape[1] for doc_layers in layers])[:-1].tolist()
    return model.ops.xp.split(model.ops.asarray3f(np.concatenate(layers, axis=1)), starts, axis=1), empty_backprop


def _doc_layers(model: ElmoListener, doc: Doc, required: bool) -> np.ndarray:
    n_layers, width = model.get_dim("nL"), model.get_dim("nO")
    layers = doc._.elmo_layers
    if layers is None:
        if required:
            raise ValueError(
                "An ELMo listener found no `doc._.elmo_layers` in training: put 'elmo' before this component "
                "in the pipeline, and do not freeze it with [training] frozen_components unless it is also in "
                "annotating_components (set `freeze = true` on the component instead)."
            )
        # Not annotated (e.g. while initializing): zeros of the right shape keep the output valid.
        return np.zeros((n_layers, len(doc), width), dtype="float32")
    if tuple(layers.shape) != (n_layers, len(doc), width):
        raise ValueError(
            f"doc._.elmo_layers has shape {tuple(layers.shape)} but this ELMo listener expects "
            f"({n_layers}, {len(doc)}, {width}): set the listener's width to 2 * projection_dim and its mix's "
            "n_layers to n_layers + 1 of the biLM."
        )
    return layers


def replace_listener(model: Model, listener: ElmoListener, elmo: Any) -> Model:
    """`Language.replace_listeners`: swap a listener for its own copy (`model`) of the component's biLM."""
    return standalone_bilm(model, freeze=elmo.freeze, grad_factor=listener.attrs["grad_factor"])


def replace_listener_cfg(bilm_config: dict[str, Any], model_config: dict[str, Any], freeze: bool = True) -> dict:
    """`Language.replace_listeners`: the config of the standalone model replacing the listener in `model_config`
    (spaCy passes the `tok2vec` config; the listener may be nested in it, e.g. as the `embed` of Tok2Vec.v2)."""
    listener_config = _find_listener_config(model_config)
    if listener_config is None:
        raise ValueError("replace_listeners: no spacy-elmo.ElmoListener.v1 in the component's tok2vec config")
    settings = {key: value for key, value in listener_config.items() if key not in ("@architectures", "upstream")}
    return {"@architectures": "spacy-elmo.Tok2VecElmo.v1", "bilm": bilm_config, "freeze": freeze, **settings}


def _find_listener_config(config: Any) -> dict | None:
    if not isinstance(config, dict):
        return None
    if config.get("@architectures") == "spacy-elmo.ElmoListener.v1":
        return config
    for value in config.values():
        found = _find_listener_config(value)
        if found is not None:
            return found
    return None
