"""Shared pieces of the spaCy plugin tests: the tiny AllenNLP fixture biLM (converted in the test) and data slices
read in place from ../shared/data."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import spacy
from elmo_fixtures import ALLENNLP, require

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
# The fixture biLM: 2 LSTM layers (3 ELMo layers) of width 2 x 16.
WIDTH, N_LAYERS = 32, 3


def convert_fixture(directory: Path) -> Path:
    """The AllenNLP fixture biLM as an `elmo convert` directory."""
    from hf_elmo.original_format import FORMAT

    return FORMAT.convert([require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5")], directory)


def elmo_pipeline(model_dir: Path, *, sentencizer: bool = False, **settings) -> spacy.Language:
    """A blank English pipeline with the `elmo` component reading `model_dir`; `settings` go into its config
    (a `model` dict is merged into the model's config)."""
    nlp = spacy.blank("en")
    if sentencizer:
        nlp.add_pipe("sentencizer")
    model = {"name": str(model_dir), **settings.pop("model", {})}
    nlp.add_pipe("elmo", config={"model": model, **settings})
    return nlp


def run_python(script: str | Path, *args: object, timeout: float = 300) -> str:
    """Run `script` (code, or a file) in a fresh interpreter (cwd = repo root); fail with its output if it fails."""
    command = [script] if isinstance(script, Path) else ["-c", script]
    result = subprocess.run(
        [sys.executable, *command, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks(path: Path, language: str) -> list[str]:
    """The code of every fenced block of `language` in the Markdown file `path`."""
    return [code for lang, code in FENCE.findall(path.read_text(encoding="utf-8")) if lang == language]


def run_card_snippets(directory: Path) -> list[str]:
    """Each Python block of `directory`'s model card as written, `path/to/model` read as `directory`, in a fresh
    interpreter (nothing of the package imported before it), printing what it made: the transformers block
    `len(layers) (batch, positions, width)`, the spaCy block `doc._.elmo_layers.shape`."""
    outputs = []
    for code in blocks(directory / "README.md", "python"):
        probe = ("print(len(layers), tuple(layers[0].shape))" if "layers = " in code
                 else "print(doc._.elmo_layers.shape)")
        outputs.append(run_python(code.replace("path/to/model", str(directory)) + probe).strip().splitlines()[-1])
    return outputs
