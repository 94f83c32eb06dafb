"""The optional parts of the install: which extra brings which library, and the one line a missing one gives.

The package is installed from a checkout or from its git URL (it is not on PyPI yet): the line gives both forms.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# The library -> the extra that brings it (setup.cfg's extras_require).
EXTRAS = {"h5py": "hdf5", "accelerate": "train", "matplotlib": "plots", "cupy": "cuda12x"}


def install_command(extra: str) -> str:
    """How to add `extra` to this install, as it can be done today."""
    return f'pip install ".[{extra}]" in a checkout, or pip install "spacy-elmo[{extra}] @ git+<repository URL>"'


def require(module: str, needs: str) -> ModuleType:
    """`module` imported, or an `ImportError` of one line: `needs` (what needs it, e.g. "--plot needs") and the
    command that installs its extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{needs} {module}: {install_command(EXTRAS[module])}") from None
