"""The README's code runs as written: every Python block in a namespace of its own, in a fresh interpreter (the
published models served by a local server with the AllenNLP fixture weights, no network), and every command of its
shell blocks exists."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from elmo_fixtures import ALLENNLP, require
from file_server import FileServer, published_files
from spacy_fixtures import REPO
from typer.testing import CliRunner

pytestmark = pytest.mark.slow  # a fresh interpreter per block

DOCUMENTS = [REPO / "README.md", REPO / "docs" / "migrating.md"]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks(path: Path, language: str) -> list[str]:
    return [code for lang, code in FENCE.findall(path.read_text(encoding="utf-8")) if lang == language]


def python_blocks() -> list[tuple[str, str]]:
    return [(f"{path.name}:{index}", code) for path in DOCUMENTS for index, code in enumerate(blocks(path, "python"))]


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict[str, str]:
    """The environment of a process that downloads every published model from a local server."""
    server = FileServer(published_files(require(ALLENNLP / "options.json").read_bytes(),
                                        require(ALLENNLP / "lm_weights.hdf5").read_bytes()))
    yield {**os.environ, "ELMO_PUBLISHED_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0",
           "HF_HUB_CACHE": str(tmp_path_factory.mktemp("hub"))}
    server.server.shutdown()


def test_the_documents_have_python_and_shell_blocks():
    assert len(blocks(REPO / "README.md", "python")) >= 4 and len(blocks(REPO / "README.md", "bash")) >= 4


RUN_BLOCKS = """
import json, sys, traceback
failures = {}
for name, code in json.loads(sys.stdin.read()):
    print(f"--- {name}", flush=True)
    try:
        exec(compile(code, name, "exec"), {"__name__": "__main__"})  # a fresh namespace: a missing import fails
    except BaseException:
        failures[name] = traceback.format_exc(limit=-3)
print("FAILURES " + json.dumps(failures))
"""


def test_every_python_block_runs_as_written(published, tmp_path):
    """Each block in a namespace of its own (one interpreter for all of them: their imports load once)."""
    import json

    named = python_blocks()
    result = subprocess.run([sys.executable, "-c", RUN_BLOCKS], input=json.dumps(named), cwd=tmp_path,
                            env=published, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    output, _, failures = result.stdout.rpartition("FAILURES ")
    assert json.loads(failures) == {}, failures
    printed = output.split("--- ")[1:]
    assert [part.split("\n", 1)[0] for part in printed] == [name for name, _ in named]
    assert all(part.split("\n", 1)[1].strip() for part in printed), "a block prints nothing"


def shell_commands() -> list[list[str]]:
    """The `elmo`, `python -m spacy_elmo` and `python -m spacy init|train` commands of the README's shell blocks."""
    commands = []
    for code in blocks(REPO / "README.md", "bash"):
        for line in code.splitlines():
            words = shlex.split(line.split(" #")[0].split(" <")[0], posix=True)
            if words[:1] == ["elmo"] or words[:3] in (["python", "-m", "spacy_elmo"], ["python", "-m", "spacy"]):
                commands.append(words)
    return commands


def test_every_command_of_the_shell_blocks_exists_with_its_options():
    from hf_elmo.cli import app as elmo
    from spacy_elmo.cli import app as spacy_elmo

    commands = shell_commands()
    assert len(commands) >= 15
    runner = CliRunner()
    for words in commands:
        if words[0] == "elmo":
            subcommand, options = words[1], [word for word in words[2:] if word.startswith("--")]
            result = runner.invoke(elmo, [subcommand, "--help"])
            help_text = result.stdout if subcommand != "pretrain" else _pretrain_help()
        elif words[2] == "spacy_elmo":
            subcommand, options = words[3], [word for word in words[4:] if word.startswith("--")]
            result = runner.invoke(spacy_elmo, [subcommand, "--help"])
            help_text = result.stdout
        else:  # python -m spacy init elmo-config / train: spaCy's own CLI
            subcommand = " ".join(words[3:5] if words[3] == "init" else words[3:4])
            result = subprocess.run([sys.executable, "-m", "spacy", *subcommand.split(), "--help"],
                                    capture_output=True, text=True, timeout=120)
            options, help_text = [], result.stdout
            result.exit_code = result.returncode
        assert result.exit_code == 0, f"{' '.join(words)}: {help_text[-500:]}"
        for option in options:
            assert option.split("=")[0] in help_text or option.startswith("--paths."), f"{' '.join(words)}: {option}"


def _pretrain_help() -> str:
    from contextlib import redirect_stdout
    from io import StringIO

    from hf_elmo.training.pretrain import parse_arguments

    text = StringIO()
    with redirect_stdout(text), pytest.raises(SystemExit):
        parse_arguments(["--help"])
    return text.getvalue()
