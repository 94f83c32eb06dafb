"""Growing a trained biLM: wider LSTM cells that compute the same function until training moves them.

A model trained to saturation at one width goes on learning at a larger one without starting again: the new
cells get bilm-tf's initialisation (their gates read the inputs and the recurrent state from the start) and zero
projection columns, so nothing downstream sees them until the gradient gives them a use (Net2Net, Chen et al.
2016, with zero outgoing weights).
"""

from __future__ import annotations

import torch

from ..configuration_elmo import ElmoConfig
from ..modeling_elmo import ElmoLstmLayer, ElmoPreTrainedModel


@torch.no_grad()
def widen_lstm_cells(model: ElmoPreTrainedModel, lstm_dim: int) -> ElmoPreTrainedModel:
    """A copy of `model` (an `ElmoModel` or `ElmoForBidirectionalLM`) with `lstm_dim` cells in every LSTM layer.

    Each layer keeps its cells first in every gate block; its new cells follow, with bilm-tf's initialisation
    and all-zero columns in the projection (2, P, lstm_dim), so the copy's outputs are the model's.
    """
    config = model.config
    wide_config = ElmoConfig.from_dict({**config.to_dict(), "lstm_dim": lstm_dim})  # validates lstm_dim
    if lstm_dim < config.lstm_dim:
        raise ValueError(f"lstm_dim {lstm_dim} is narrower than the model's {config.lstm_dim}: cells can only be added")
    if config.projection_dim >= config.lstm_dim:
        raise ValueError(f"the model has no projection (projection_dim {config.projection_dim} = lstm_dim): "
                         "wider cells would widen its outputs")
    wide = type(model)(wide_config)  # bilm-tf's initialisation, then the model's weights
    wide.to(model.dtype)
    fresh, state, cells = wide.state_dict(), model.state_dict(), config.lstm_dim
    for prefix, layer in model.named_modules():
        if not isinstance(layer, ElmoLstmLayer):
            continue
        for name in ("input_weight", "recurrent_weight", "bias"):  # (2, 4 D, ...): gate blocks of D cells
            key = f"{prefix}.{name}"
            grown = fresh[key].clone()
            grown.view(2, 4, lstm_dim, -1)[:, :, :cells] = state[key].view(2, 4, cells, -1)
            state[key] = grown
        key = f"{prefix}.projection_weight"
        state[key] = torch.cat([state[key], state[key].new_zeros(*state[key].shape[:-1], lstm_dim - cells)], dim=-1)
    wide.load_state_dict(state)
    return wide
