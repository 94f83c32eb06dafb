"""Thinc layers of the ELMo plugin: the biLM, the listener, the scalar mix, pooling help and the BCN encoder."""

from .biattention import BiattentiveEncoder, biattentive_encoder
from .bilm import build_bilm
from .bilm_v1 import build_bilm_v1
from .listener import ElmoListener, replace_listener, replace_listener_cfg
from .pooling import at_least_one_row
from .scalar_mix import scalar_mix
from .shim import ElmoShim, elmo_shim
from .standalone import standalone_bilm

__all__ = [
    "BiattentiveEncoder",
    "ElmoListener",
    "ElmoShim",
    "at_least_one_row",
    "biattentive_encoder",
    "build_bilm",
    "build_bilm_v1",
    "elmo_shim",
    "replace_listener",
    "replace_listener_cfg",
    "scalar_mix",
    "standalone_bilm",
]
