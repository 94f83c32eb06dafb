"""ELMo for spaCy: the `elmo` component, listeners with per-task scalar mixes, and ready-to-train configs.

The factory and the config functions reach spaCy through entry points, so importing this package loads nothing
heavy: `python -m spacy ...` (which imports the `spacy init elmo-config` command) does not import torch. The names
below are imported on first use.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Elmo": "pipeline_component",
    "make_elmo": "pipeline_component",
    "register_extensions": "vectors",
    "restore_hooks": "vectors",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
