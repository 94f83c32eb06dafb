"""Thinc layers of the ELMo plugin: the biLM, the listener and the scalar mix."""

from .bilm import ElmoShim, build_bilm, set_bilm_weights, standalone_bilm
from .listener import ElmoListener, replace_listener, replace_listener_cfg
from .scalar_mix import scalar_mix

__all__ = [
    "ElmoListener",
    "ElmoShim",
    "build_bilm",
    "replace_listener",
    "replace_listener_cfg",
    "scalar_mix",
    "set_bilm_weights",
    "standalone_bilm",
]
