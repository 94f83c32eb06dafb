"""The optional parts of the install: which extra brings which library, and the one line a missing one gives.

The package is installed from a checkout or from its git URL (it is not on PyPI yet): the line says how to add the
extra to this install from where it came, as pip recorded it.
"""

from __future__ import annotations

import importlib
import json
from importlib.metadata import distributions
from types import ModuleType
from urllib.parse import urlparse
from urllib.request import url2pathname

# The library -> the extra that brings it (setup.cfg's extras_require).
EXTRAS = {"h5py": "hdf5", "accelerate": "train", "matplotlib": "plots", "cupy": "cuda12x", "pyarrow": "parquet",
          "ray": "ray", "ray.serve": "ray", "fastapi": "serve", "uvicorn": "serve", "prometheus_client": "serve",
          "orjson": "serve"}


def install_command(extra: str) -> str:
    """How to add `extra` to this install: from the checkout or the git URL it was installed from (pip's record of
    it, `direct_url.json`: PEP 610), else by name."""
    # Every copy of the metadata on the path (a checkout's own `*.egg-info` may come first): the one pip installed.
    records = (record.read_text("direct_url.json") for record in distributions(name="spacy-elmo"))
    try:
        origin = json.loads(next((record for record in records if record), "{}"))
    except ValueError:
        origin = {}
    url = origin.get("url", "")
    if "vcs_info" in origin:
        return f'pip install "spacy-elmo[{extra}] @ {origin["vcs_info"]["vcs"]}+{url}"'
    if url.startswith("file:"):
        editable = "-e " if origin.get("dir_info", {}).get("editable") else ""
        return f'pip install {editable}"{url2pathname(urlparse(url).path)}[{extra}]"'
    return f'pip install "spacy-elmo[{extra}]"'


def require(module: str, needs: str) -> ModuleType:
    """`module` imported, or an `ImportError` of one line: `needs` (what needs it, e.g. "--plot needs") and the
    command that installs its extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{needs} {module}: {install_command(EXTRAS[module])}") from None
