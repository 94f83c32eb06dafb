"""Thinc layers of the ELMo plugin: the biLM, the listener, the scalar mix and pooling help."""

from .bilm import ElmoShim, build_bilm, set_bilm_weights, standalone_bilm
from .listener import ElmoListener, replace_listener, replace_listener_cfg
from .pooling import at_least_one_row
from .scalar_mix import scalar_mix

__all__ = [
    "ElmoListener",
    "ElmoShim",
    "at_least_one_row",
    "build_bilm",
    "replace_listener",
    "replace_listener_cfg",
    "scalar_mix",
    "set_bilm_weights",
    "standalone_bilm",
]
