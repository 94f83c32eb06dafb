"""The learned layer weights of a trained pipeline (the paper's Figure 2): `softmax(s)` and `gamma` of every task
mix, per component and position, beside their values at the start of training, so that a short run that changed
little shows as such (`python -m spacy_elmo mix-weights PIPELINE [--plot out.png]`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from spacy.language import Language

from hf_elmo.extras import require
from hf_elmo.formulas import scalar_mix_weights

from .layers.pytorch import to_torch


@dataclass
class MixWeights:
    """One task mix: `component`, `position` ("input", "output", or "" outside `Tok2VecWithElmo.v1`), its layer
    weights softmax(s) (n_layers,) and gamma, learned and at the start of training (softmax of the config's
    `initial_scalars`, gamma 1)."""

    component: str
    position: str
    weights: np.ndarray
    gamma: float
    start_weights: np.ndarray
    start_gamma: float = 1.0


def layer_names(n_layers: int) -> list[str]:
    """The biLM's layers as a mix sees them: the token layer (char CNN), then each biLSTM layer."""
    return ["token", *(f"biLSTM {j}" for j in range(1, n_layers))]


def mix_weights(nlp: Language) -> list[MixWeights]:
    """Every ELMo mix of `nlp`'s components, in pipeline order (input before output)."""
    found = []
    for name, component in nlp.pipeline:
        model = getattr(component, "model", None)
        if model is None or not hasattr(model, "walk"):
            continue
        for node in model.walk(order="dfs_pre"):
            if node.name == "elmo_scalar_mix" and node.has_param("s") and node.get_param("s") is not None:
                weights = scalar_mix_weights(to_torch(node.get_param("s"))).cpu().numpy()
                gamma = float(model.ops.to_numpy(node.get_param("gamma"))[0])
                start = scalar_mix_weights(torch.tensor(node.attrs["initial_scalars"], dtype=torch.float32)).numpy()
                found.append(MixWeights(name, node.attrs.get("position", ""), weights, gamma, start))
    return found


def format_mix_weights(mixes: list[MixWeights]) -> str:
    """A text table: component, position, each layer's weight and gamma, learned (at the start in brackets)."""
    if not mixes:
        return "no ELMo mixes in this pipeline"
    n_layers = max(len(mix.weights) for mix in mixes)
    header = ["component", "position", *layer_names(n_layers), "gamma"]
    rows = [[mix.component, mix.position or "-",
             *(f"{w:.3f} ({w0:.3f})" for w, w0 in zip(mix.weights, mix.start_weights)),
             f"{mix.gamma:.3f} ({mix.start_gamma:.3f})"] for mix in mixes]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    note = "learned softmax(s) per layer and gamma; in brackets, their values at the start of training"
    return "\n".join([*lines, note])


def plot_mix_weights(mixes: list[MixWeights], output: Path) -> Path:
    """Bars of softmax(s) per layer, one group per mix, each with a marker at its start value and gamma (learned and
    at the start) under the group (needs matplotlib: the `plots` extra)."""
    matplotlib = require("matplotlib", "--plot needs")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers = max(len(mix.weights) for mix in mixes)
    # At least 5.2 inches: the title's width (one mix alone made a figure narrower than its title).
    figure, axis = plt.subplots(figsize=(max(5.2, 2.0 + 1.6 * len(mixes)), 3.6))
    width = 0.8 / n_layers
    for j, layer in enumerate(layer_names(n_layers)):
        x = np.arange(len(mixes)) + (j - (n_layers - 1) / 2) * width
        learned = [mix.weights[j] if j < len(mix.weights) else 0.0 for mix in mixes]
        start = [mix.start_weights[j] if j < len(mix.start_weights) else 0.0 for mix in mixes]
        axis.bar(x, learned, width, label=f"{layer} layer")
        axis.scatter(x, start, marker="_", s=260, color="black", zorder=3,
                     label="at the start of training" if j == 0 else None)
    axis.set_xticks(np.arange(len(mixes)))
    axis.set_xticklabels([f"{mix.component}{' ' + mix.position if mix.position else ''}\n"
                          f"γ {mix.gamma:.2f} (start {mix.start_gamma:.2f})" for mix in mixes])
    axis.set_ylabel("softmax(s)")
    axis.set_ylim(0, 1)
    axis.legend(fontsize="small")
    axis.set_title("ELMo layer weights of each task mix, learned", fontsize="medium")
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output
