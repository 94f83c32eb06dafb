"""The task-specific scalar mix of the paper as a Thinc layer: `gamma * sum_j softmax(s)_j * h_j`.

Input: per Doc the biLM layers (n_layers, n_tokens, width); output: per Doc (n_tokens, width). Parameters `s`
(n_layers,) and `gamma` (1,) live in the downstream component's model, so every task learns its own. The mix itself
is `hf_elmo.formulas.scalar_mix` (with `scalar_mix_weights` for layer dropout), the one definition the torch
`ElmoScalarMix` also computes: this layer runs it on the Docs as one padded batch and takes the gradients from torch.
The paper's regulariser `l2 * ||s||^2` adds `2 * l2 * s` to the gradient of `s` at every update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from thinc.api import Model
from thinc.types import Floats2d, Floats3d

from hf_elmo.configuration_elmo import integer_problem
from hf_elmo.formulas import scalar_mix as mix_layers
from hf_elmo.formulas import scalar_mix_weights

from .pytorch import to_torch, to_xp

LAYER_NORM_EPS = 1e-12


def scalar_mix(
    n_layers: int,
    trainable: bool = True,
    layer_dropout: float = 0.0,
    layer_norm: bool = False,
    initial_scalars: Sequence[float] | None = None,
    l2: float = 0.0,
) -> Model[list[Floats3d], list[Floats2d]]:
    if problem := integer_problem(n_layers, 1):
        raise ValueError(f"n_layers {problem}")
    if initial_scalars is not None and len(initial_scalars) != n_layers:
        raise ValueError(f"{len(initial_scalars)} initial_scalars for n_layers = {n_layers}")
    if not 0.0 <= layer_dropout < 1.0:
        raise ValueError(f"layer_dropout must be in [0, 1), got {layer_dropout}")
    if l2 < 0:
        raise ValueError(f"l2 must be >= 0, got {l2}")
    return Model(
        "elmo_scalar_mix",
        mix_forward,
        init=mix_init,
        dims={"nL": n_layers, "nI": None, "nO": None},
        params={"s": None, "gamma": None},
        attrs={
            "trainable": trainable,
            # Not named "dropout_rate": spaCy's set_dropout_rate would overwrite it with [training] dropout.
            "layer_dropout": layer_dropout,
            "layer_norm": layer_norm,
            "initial_scalars": list(initial_scalars) if initial_scalars is not None else [0.0] * n_layers,
            "l2": l2,
        },
    )


def mix_init(model: Model, X: Any = None, Y: Any = None) -> None:
    model.set_param("s", model.ops.asarray1f(model.attrs["initial_scalars"]))
    model.set_param("gamma", model.ops.asarray1f([1.0]))
    if X:
        width = X[0].shape[-1]
        for dim in ("nI", "nO"):
            if not model.has_dim(dim):
                model.set_dim(dim, width)


def mix_forward(model: Model, Xs: list[Floats3d], is_train: bool) -> tuple[list[Floats2d], Callable]:
    n_layers = model.get_dim("nL")
    for X in Xs:
        if X.ndim != 3 or X.shape[0] != n_layers:
            raise ValueError(
                f"ScalarMix of {n_layers} layers got an input of shape {tuple(X.shape)}; expected "
                f"({n_layers}, n_tokens, width): does n_layers match the biLM (its n_layers + 1)?"
            )
    if not Xs:
        return [], lambda dYs: []
    trainable = is_train and model.attrs["trainable"]
    s = to_torch(model.get_param("s"), requires_grad=trainable)
    gamma = to_torch(model.get_param("gamma"), requires_grad=trainable)
    layers = to_torch(model.ops.xp.concatenate(Xs, axis=1), requires_grad=is_train)  # (n_layers, tokens, width)
    lengths = [X.shape[1] for X in Xs]
    with torch.set_grad_enabled(is_train):
        weights = scalar_mix_weights(s, model.attrs["layer_dropout"], training=is_train)
        if model.attrs["layer_norm"]:  # each Doc a row of one padded batch: its own statistics
            docs = torch.repeat_interleave(torch.arange(len(Xs)), torch.tensor(lengths)).to(layers.device)
            positions = torch.cat([torch.arange(n) for n in lengths]).to(layers.device)
            padded = layers.new_zeros(len(Xs), max(lengths), *layers.shape[::2])
            padded = padded.index_put((docs, positions), layers.transpose(0, 1)).permute(2, 0, 1, 3)
            mask = torch.zeros(padded.shape[1:3], dtype=torch.bool, device=layers.device).index_put_(
                (docs, positions), torch.tensor(True, device=layers.device))
            tokens = mix_layers(padded, weights, gamma, mask, True, LAYER_NORM_EPS)[docs, positions]
        else:  # every token of every Doc at once: (n_layers, 1, tokens, width)
            tokens = mix_layers(layers[:, None], weights, gamma)[0]

    def backprop(dYs: list[Floats2d]) -> list[Floats3d]:
        inputs = [layers, s, gamma] if trainable else [layers]
        grads = torch.autograd.grad(tokens, inputs, to_torch(model.ops.xp.concatenate(dYs)))
        dXs = model.ops.xp.split(to_xp(grads[0], model.ops), _offsets(lengths), axis=1)
        if trainable:
            model.inc_grad("s", to_xp(grads[1], model.ops) + 2 * model.attrs["l2"] * model.get_param("s"))
            model.inc_grad("gamma", to_xp(grads[2], model.ops))
        return list(dXs)

    return model.ops.xp.split(to_xp(tokens, model.ops), _offsets(lengths)), backprop


def _offsets(lengths: list[int]) -> list[int]:
    """Where each Doc after the first starts in their concatenation."""
    return [sum(lengths[: i + 1]) for i in range(len(lengths) - 1)]
