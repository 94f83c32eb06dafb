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


# Lines of the README's shell blocks that are not run here, and why (any other line runs: a new one must be either).
NOT_RUN = {
    "git clone ": "the tests run in a checkout",
    "pip install ": "an install: test_core_install.py installs the package alone into a fresh virtualenv",
    "make ": "`make test` is what CI runs; `make demo` runs `elmo demo`, which runs here",
    "elmo pretrain training/english_default_gpu.yaml": "a GPU recipe on pretrain-en after english_default.yaml's "
    "build-vocab: benchmarks/gpu_check.py runs it on a GPU (on PTB)",
}
# What a command gets on top of what is written, to run at toy sizes.
TOY = {
    "python -m spacy train ": "--training.max_steps 3 --training.eval_frequency 3 --corpora.train.limit 24 "
                              "--corpora.dev.limit 8",
    "elmo pretrain ": "--max_steps 2 --logging_steps 1 --eval_steps 0 --save_steps 2 --threads 1 --model_config "
                      "'{\"char_embedding_dim\": 4, \"filters\": [[1, 8], [2, 8]], \"n_highway\": 1, "
                      "\"lstm_dim\": 16, \"projection_dim\": 16}'",
}


def readme_lines() -> list[str]:
    """The command lines of the README's shell blocks, in order (continuations joined, comments kept)."""
    return [line for code in blocks(REPO / "README.md", "bash") for line in code.replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def at_toy_size(line: str) -> str:
    """`line` as a shell runs it here: its toy arguments before its comment and its redirection; on a GPU with CuPy,
    `spacy train` with `--gpu-id 0`."""
    command = line.split(" #")[0].rstrip()
    command, redirect, source = command.partition(" < ")
    for prefix, extra in TOY.items():
        if command.startswith(prefix):
            command = f"{command} {extra}"
    if command.startswith("python -m spacy train ") and gpu_with_cupy():
        command += " --gpu-id 0"
    return command + (f" < {source}" if redirect else "")


def gpu_with_cupy() -> bool:
    import importlib.util

    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("cupy") is not None


RUN_COMMANDS = """
import json, os, runpy, shlex, sys, time, traceback
from importlib.metadata import entry_points
console = {script.name: script for script in entry_points(group="console_scripts")}
results = []
for command in json.loads(sys.stdin.read()):
    line, _, source = command.partition(" < ")
    words = shlex.split(line)
    start, stdin = time.perf_counter(), sys.stdin
    sys.stdin = open(source.strip()) if source else open(os.devnull)
    try:
        if words[:2] == ["python", "-m"]:  # python -m MODULE ARGS
            sys.argv = [words[2], *words[3:]]
            runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        else:  # a console script of the package: elmo ARGS
            sys.argv = words
            console[words[0]].load()()
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        error = "" if code == 0 else str(exit.code)
    except BaseException:
        code, error = 1, traceback.format_exc(limit=-4)
    finally:
        sys.stdin.close()
        sys.stdin = stdin
    results.append({"command": command, "code": code, "seconds": round(time.perf_counter() - start, 1),
                    "error": "" if code == 0 else error})
    if code:
        break
print("RESULTS " + json.dumps(results))
"""


def test_every_line_of_the_readmes_shell_blocks_runs_as_written_at_toy_sizes(tmp_path):
    """Each command of the README's shell blocks, in order, in one directory (a later command reads what an earlier
    one wrote), as written with toy sizes appended (`TOY`), through the same entry points as from a shell (the
    package's console scripts, `python -m`), in one interpreter (their imports load once): published models from a
    local server, the Hub a local fake, the shared data and the recipes where the README says. A line that fails,
    or is neither run nor listed in `NOT_RUN` with its reason, fails the test: a stale command fails CI."""
    import json

    from fake_hub import FakeHub, hub_env

    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "shared").symlink_to(REPO.parent / "shared")  # ../shared/data, as from a checkout
    for name in ("training", "hf_elmo"):
        (work / name).symlink_to(REPO / name)
    (work / "in.txt").write_text("The bank raised its rates .\nWe sat on the river bank .\n")
    (work / "options.json").write_bytes(require(ALLENNLP / "options.json").read_bytes())
    (work / "weights.hdf5").write_bytes(require(ALLENNLP / "lm_weights.hdf5").read_bytes())
    server = FileServer(published_files(require(ALLENNLP / "options.json").read_bytes(),
                                        require(ALLENNLP / "lm_weights.hdf5").read_bytes()))
    lines = readme_lines()
    skipped = [line for line in lines if any(line.startswith(prefix) for prefix in NOT_RUN)]
    commands = [at_toy_size(line) for line in lines if line not in skipped]
    with FakeHub() as hub:
        env = {**hub_env(hub.url, tmp_path / "hf_home"), "ELMO_PUBLISHED_ENDPOINT": server.url,
               "HF_HUB_OFFLINE": "0", "TQDM_DISABLE": "1"}
        result = subprocess.run([sys.executable, "-c", RUN_COMMANDS], input=json.dumps(commands), cwd=work, env=env,
                                capture_output=True, text=True, timeout=600)
    server.server.shutdown()
    assert "RESULTS " in result.stdout, result.stderr[-3000:]
    results = json.loads(result.stdout.rpartition("RESULTS ")[2])
    failed = [r for r in results if r["code"]]
    assert not failed, f"{failed[0]['command']}\n{failed[0]['error']}\n{result.stderr[-3000:]}"
    assert [r["command"] for r in results] == commands and len(commands) >= 15 and len(skipped) == 8
    assert (work / "out" / "model-best").is_dir() and (work / "weights.png").read_bytes()[:4] == b"\x89PNG"
    assert (work / "runs" / "ptb-encoder" / "model.safetensors").is_file() and list(work.glob("back/elmo_*"))
    assert (work / "out.npy").is_file() and (work / "out.hdf5").is_file()
