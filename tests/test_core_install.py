"""`pip install spacy-elmo` without extras runs the README: its transformers and spaCy blocks, `elmo embed default`
and `elmo demo`; `elmo serve` says in one line which extra it needs. The test reads the core dependency closure from
the installed metadata and runs the commands in a fresh interpreter in which every other installed distribution (the
extras, pytest, ...) cannot be imported."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from spacy_fixtures import REPO, blocks, run_python

pytestmark = pytest.mark.slow  # subprocesses and long runs: left out of the fast subset


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_closure(name: str = "spacy-elmo") -> set[str]:
    """The distributions `pip install NAME` (no extras) installs: its requirements without extra markers, and
    theirs, recursively, as installed here."""
    seen, todo = set(), [name]
    while todo:
        current = normalise(todo.pop())
        if current in seen:
            continue
        try:
            requirements = distribution(current).requires or []
        except PackageNotFoundError:
            continue
        seen.add(current)
        for line in requirements:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({**default_environment(), "extra": ""}):
                todo.append(requirement.name)
    return seen


CORE_ONLY = """
import importlib.metadata, re, sys
core = set(sys.argv[1].split(","))
normalise = lambda name: re.sub(r"[-_.]+", "-", name).lower()
for module, dists in importlib.metadata.packages_distributions().items():
    if not core & {normalise(d) for d in dists} and module not in sys.modules:
        sys.modules[module] = None  # `import module` raises ModuleNotFoundError, find_spec says absent
sys.argv = sys.argv[:1]
"""

CLI = """
import pathlib, tempfile, numpy
from typer.testing import CliRunner
from elmo_cli import app

folder = pathlib.Path(tempfile.mkdtemp())
(folder / "in.txt").write_text("The bank raised rates.\\nWe sat on the river bank.\\n", encoding="utf-8")
for args in (["embed", "default", str(folder / "in.txt"), str(folder / "out.npy")], ["demo"]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (args, result.output, result.exception)
    print(result.output)
assert numpy.load(folder / "out.npy").shape[-1] == 512
served = CliRunner().invoke(app, ["serve", "--port", "0"])
line = served.output.strip()
assert served.exit_code == 1 and line.startswith("Error: elmo serve needs fastapi: pip install "), line
assert len(line.splitlines()) == 1 and "[serve]" in line, line
"""


def test_the_core_install_is_lean_and_has_spacy():
    closure = core_closure()
    assert {"spacy-elmo", "torch", "transformers", "spacy", "safetensors"} <= closure
    assert not {"h5py", "accelerate", "matplotlib", "pytest", "cupy-cuda12x", "fastapi", "uvicorn", "orjson",
                "ray"} & closure


def test_readme_embed_and_demo_run_with_the_core_install_alone():
    core = ",".join(sorted(core_closure()))
    absent = "import importlib.util\nprint([importlib.util.find_spec(m) for m in ('h5py', 'accelerate', 'pytest')])"
    assert run_python(CORE_ONLY + absent, core).strip() == "[None, None, None]"
    transformers_block, spacy_block = blocks(REPO / "README.md", "python")[:2]  # as the README has them
    assert run_python(CORE_ONLY + transformers_block, core).split() == [
        "torch.Size([2,", "9,", "50])", "3", "torch.Size([2,", "9,", "512])"]
    assert run_python(CORE_ONLY + spacy_block, core).startswith("(3, 5, 512)\n")
    output = run_python(CORE_ONLY + CLI, core)
    assert "2 sentences written" in output and "same-sense uses are" in output and "spaCy:" in output


def test_spacy_commands_do_not_import_transformers():
    """Every `python -m spacy` command imports `spacy init elmo-config` (the `spacy_cli` entry point): that must not
    load transformers or the biLM (seconds per command); the component's names still come on first use."""
    loaded = "import sys, spacy_elmo.cli\nprint(sorted(m for m in ('transformers', 'hf_elmo') if m in sys.modules))"
    assert run_python(loaded).strip() == "[]"
    assert run_python("import spacy_elmo\nprint(spacy_elmo.Elmo.__name__, spacy_elmo.restore_hooks.__name__)").split() \
        == ["Elmo", "restore_hooks"]
