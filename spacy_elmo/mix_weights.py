"""The learned layer weights of a trained pipeline (the paper's Figure 2): `softmax(s)` and `gamma` of every task
mix, per component and position (`python -m spacy_elmo mix-weights PIPELINE [--plot out.png]`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from spacy.language import Language

from hf_elmo.modeling_elmo import scalar_mix_weights

from .layers.pytorch import to_torch


@dataclass
class MixWeights:
    """One task mix: `component`, `position` ("input", "output", or "" outside `Tok2VecWithElmo.v1`), its layer
    weights softmax(s) (n_layers,) and gamma."""

    component: str
    position: str
    weights: np.ndarray
    gamma: float


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
                found.append(MixWeights(name, node.attrs.get("position", ""), weights, gamma))
    return found


def format_mix_weights(mixes: list[MixWeights]) -> str:
    """A text table: component, position, the weight of each layer (0 = token layer), gamma."""
    if not mixes:
        return "no ELMo mixes in this pipeline"
    n_layers = max(len(mix.weights) for mix in mixes)
    header = ["component", "position", *(f"layer {j}" for j in range(n_layers)), "gamma"]
    rows = [[mix.component, mix.position or "-", *(f"{w:.3f}" for w in mix.weights), f"{mix.gamma:.3f}"]
            for mix in mixes]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in [header, *rows])


def plot_mix_weights(mixes: list[MixWeights], output: Path) -> Path:
    """Bars of softmax(s) per layer, one group per mix (needs matplotlib: the `plots` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_layers = max(len(mix.weights) for mix in mixes)
    figure, axis = plt.subplots(figsize=(1.6 + 1.4 * len(mixes), 3.2))
    width = 0.8 / n_layers
    for j in range(n_layers):
        values = [mix.weights[j] if j < len(mix.weights) else 0.0 for mix in mixes]
        axis.bar(np.arange(len(mixes)) + (j - (n_layers - 1) / 2) * width, values, width, label=f"layer {j}")
    axis.set_xticks(np.arange(len(mixes)))
    axis.set_xticklabels([f"{mix.component}\n{mix.position}" if mix.position else mix.component for mix in mixes])
    axis.set_ylabel("softmax(s)")
    axis.set_ylim(0, 1)
    axis.legend(fontsize="small")
    axis.set_title("Learned ELMo layer weights")
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output
