"""The task-specific scalar mix of the paper, as a Thinc layer: `gamma * sum_j softmax(s)_j * h_j`.

Input: per Doc the biLM layers (n_layers, n_tokens, width); output: per Doc (n_tokens, width). Parameters `s`
(n_layers,) and `gamma` (1,) live in the downstream component's model, so every task learns its own. The paper's
regulariser `l2 * ||s||^2` adds `2 * l2 * s` to the gradient of `s` at every update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from thinc.api import Model
from thinc.types import Floats1d, Floats2d, Floats3d

LAYER_NORM_EPS = 1e-12


def scalar_mix(
    n_layers: int,
    trainable: bool = True,
    layer_dropout: float = 0.0,
    layer_norm: bool = False,
    initial_scalars: Sequence[float] | None = None,
    l2: float = 0.0,
) -> Model[list[Floats3d], list[Floats2d]]:
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
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


def layer_weights(model: Model, is_train: bool) -> Floats1d:
    """softmax(s); in training with layer dropout, dropped layers get weight 0 and the rest are renormalised."""
    xp = model.ops.xp
    s = model.get_param("s")
    keep = xp.ones(s.shape, dtype=bool)
    if is_train and model.attrs["layer_dropout"] > 0:
        keep = xp.random.uniform(0.0, 1.0, s.shape) >= model.attrs["layer_dropout"]
        if not keep.any():
            keep[:] = True
    scores = xp.where(keep, s - s[keep].max(), -xp.inf)
    weights = xp.exp(scores)
    return (weights / weights.sum()).astype("float32")


def mix_forward(model: Model, Xs: list[Floats3d], is_train: bool) -> tuple[list[Floats2d], Callable]:
    n_layers = model.get_dim("nL")
    for X in Xs:
        if X.ndim != 3 or X.shape[0] != n_layers:
            raise ValueError(
                f"ScalarMix of {n_layers} layers got an input of shape {tuple(X.shape)}; expected "
                f"({n_layers}, n_tokens, width): does n_layers match the biLM (its n_layers + 1)?"
            )
    weights = layer_weights(model, is_train)
    gamma = model.get_param("gamma")[0]
    normalised = [_layer_norm(model, X) for X in Xs] if model.attrs["layer_norm"] else [(X, None) for X in Xs]
    mixes = [model.ops.xp.tensordot(weights, X, axes=1) for X, _ in normalised]  # (n_tokens, width) each
    Ys = [gamma * M for M in mixes]

    def backprop(dYs: list[Floats2d]) -> list[Floats3d]:
        d_weights = model.ops.alloc1f(n_layers)
        d_gamma = 0.0
        dXs = []
        for dY, M, (X, norm_backprop) in zip(dYs, mixes, normalised):
            d_gamma += float((dY * M).sum())
            d_weights += gamma * model.ops.xp.tensordot(X, dY, axes=([1, 2], [0, 1]))
            dX = (gamma * weights)[:, None, None] * dY[None]
            dXs.append(norm_backprop(dX) if norm_backprop is not None else dX)
        if model.attrs["trainable"]:
            s = model.get_param("s")
            model.inc_grad("s", weights * (d_weights - (weights * d_weights).sum()) + 2 * model.attrs["l2"] * s)
            model.inc_grad("gamma", model.ops.asarray1f([d_gamma]))
        return dXs

    return Ys, backprop


def _layer_norm(model: Model, X: Floats3d) -> tuple[Floats3d, Callable | None]:
    """Normalise each layer over all values of the Doc (its tokens x width), independent of the batch."""
    if X.shape[1] == 0:
        return X, None
    mean = X.mean(axis=(1, 2), keepdims=True)
    inv_std = 1.0 / model.ops.xp.sqrt(X.var(axis=(1, 2), keepdims=True) + LAYER_NORM_EPS)
    normalised = (X - mean) * inv_std

    def backprop(d_normalised: Floats3d) -> Floats3d:
        return inv_std * (
            d_normalised
            - d_normalised.mean(axis=(1, 2), keepdims=True)
            - normalised * (d_normalised * normalised).mean(axis=(1, 2), keepdims=True)
        )

    return normalised, backprop
