"""One batch of sentences → its biLM layers (n_layers + 1, rows, positions, width): the `ElmoModel` of an `ElmoShim`
in Thinc's PyTorch wrapper."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from thinc.api import ArgsKwargs, Model, PyTorchGradScaler
from thinc.layers.pytorchwrapper import forward as pytorch_forward
from thinc.types import Floats4d

from .pytorch import to_torch, to_xp
from .shim import ElmoShim, bilm_init, char_tokenizer
from .types import Sentence, empty_backprop


def elmo_torch(
    name: str, mixed_precision: bool = False, grad_scaler: PyTorchGradScaler | None = None, int8: bool = False
) -> Model[list[Sentence], Floats4d]:
    """One batch of sentences → its biLM layers (n_layers + 1, rows, positions, width), float32: Thinc's PyTorch
    wrapper around the `ElmoModel` of an `ElmoShim` (its weights from `name` unless set or loaded otherwise)."""
    return Model(
        "elmo_torch",
        pytorch_forward,
        init=bilm_init,
        attrs={"convert_inputs": batch_to_torch, "convert_outputs": layers_from_torch},
        shims=[ElmoShim(name, mixed_precision=mixed_precision, grad_scaler=grad_scaler, int8=int8)],
    )


def batch_to_torch(model: Model, sentences: list[Sentence], is_train: bool) -> tuple[ArgsKwargs, Callable]:
    """The `ElmoBatch` of the sentences' words, on the biLM's device, as the model's keyword arguments."""
    shim: ElmoShim = model.shims[0]
    tokenizer = shim.tokenizer or char_tokenizer(shim.elmo.config.max_characters_per_token)
    # made on the host; the copy to a GPU does not wait for the device to finish what it is doing
    batch = tokenizer.batch([sentence.words for sentence in sentences]).to(model.shims[0].device, non_blocking=True)
    return ArgsKwargs(args=(), kwargs=dict(batch)), empty_backprop


def layers_from_torch(model: Model, inputs_outputs: tuple[Any, Any], is_train: bool) -> tuple[Floats4d, Callable]:
    _, output = inputs_outputs
    hidden = torch.stack(output.hidden_states).float()

    def get_d_hidden(d_layers: Floats4d) -> ArgsKwargs:
        return ArgsKwargs(args=((hidden,),), kwargs={"grad_tensors": (to_torch(d_layers),)})

    return to_xp(hidden, model.ops), get_d_hidden
