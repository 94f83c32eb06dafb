"""ELMo for spaCy: the `elmo` component, listeners with per-task scalar mixes, and ready-to-train configs."""

import os

import torch

from . import architectures, span_getters, weights  # noqa: F401 (registers the config functions)
from .pipeline_component import Elmo, make_elmo
from .vectors import register_extensions, restore_hooks


def _single_threaded_torch() -> None:
    # A forked child inheriting torch's OpenMP thread pool can hang in its first torch op, e.g. in
    # nlp.pipe(n_process=2): children run torch single-threaded instead.
    torch.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_single_threaded_torch)

__all__ = ["Elmo", "make_elmo", "register_extensions", "restore_hooks"]
