"""The documents' code runs as written: every Python block of the README and docs/migrating.md in a namespace of its
own, in a fresh interpreter, and every line of the shell blocks of the README and the docs in order at toy sizes, or,
where it cannot run here (a GPU, several processes, hours), checked against its `--help` with the reason written
down; published models come from a local server with the AllenNLP fixture weights, the Hub is a local fake: no
network."""

from __future__ import annotations

import gzip
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from elmo_fixtures import ALLENNLP, require
from file_server import FileServer, published_files
from spacy_fixtures import REPO, blocks

pytestmark = pytest.mark.slow  # a fresh interpreter per block

DOCUMENTS = [REPO / "README.md", REPO / "docs" / "migrating.md"]
SERVER = "127.0.0.1:3000"  # the address of `elmo serve` in the documents' calls to it
def python_blocks() -> list[tuple[str, str]]:
    """Every Python block but those that call a running `elmo serve` (test_serve.py runs them against one)."""
    return [(f"{path.name}:{index}", code) for path in DOCUMENTS for index, code in enumerate(blocks(path, "python"))
            if SERVER not in code]


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


def test_every_python_block_runs_as_written(services, tmp_path):
    """Each block in a namespace of its own (one interpreter for all of them: their imports load once)."""
    import json

    named = python_blocks()
    result = subprocess.run([sys.executable, "-c", RUN_BLOCKS], input=json.dumps(named), cwd=tmp_path,
                            env=services, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    output, _, failures = result.stdout.rpartition("FAILURES ")
    assert json.loads(failures) == {}, failures
    printed = output.split("--- ")[1:]
    assert [part.split("\n", 1)[0] for part in printed] == [name for name, _ in named]
    assert all(part.split("\n", 1)[1].strip() for part in printed), "a block prints nothing"


# The documents whose shell blocks the tests run (each in a directory of its own).
SHELL_DOCUMENTS = ["README.md", "spacy_elmo/README.md", "recipes/README.md", "docs/performance.md",
                   "benchmarks/README.md", "benchmarks/paper/README.md"]
# Lines not run here, and why: set-up that installs or copies (not checked)...
NOT_RUN = {
    "git clone ": "the tests run in a checkout",
    "pip install ": "an install: test_core_install.py installs the package alone into a fresh virtualenv",
    "make ": "`make test` is what CI runs; `make demo` runs `elmo demo`, which runs here",
    "python3 -m venv ": "AllenNLP's virtualenv for the comparisons (benchmarks/README.md): an install",
    "/tmp/allennlp-venv/bin/pip ": "AllenNLP's virtualenv: an install",
    "source .gpu/setup.sh": "the lent GPU machine's set-up",
    "cp ": "copies a trained model into the package",
    f"curl -s {SERVER}": "a call to a running `elmo serve`: test_serve.py makes each against one",
}
# ... and commands checked against their `--help` (the command and every option it is given exist) but not run.
CHECKED_ONLY = {
    "elmo pretrain recipes/english_default_gpu.yaml": "a GPU recipe on pretrain-en: gpu_check.py runs it on a GPU",
    "elmo pretrain recipes/ptb_gpu.yaml": "a GPU recipe: its CPU twin ptb_cpu.yaml runs here",
    "elmo pretrain recipes/english_default.yaml": "hours on pretrain-en (the record of how the shipped model was "
    "trained, each run continuing the one before); ptb_cpu.yaml runs here",
    "elmo build-vocab '../shared/data/pretrain-en": "minutes over pretrain-en: test_training builds vocabularies",
    'elmo build-vocab "../shared/data/pretrain-en': "minutes over pretrain-en: test_training builds vocabularies",
    "elmo evaluate runs/english-default": "the record of the shipped model's runs (their models are not here)",
    "elmo export-encoder runs/english-default": "writes into the package's shipped model",
    "elmo export-encoder runs/default-": "the record of the shipped model's runs",
    "elmo pretrain --init_model": "placeholders for your model and domain text (runs/english-small, domain/*.txt)",
    "elmo convert elmo_2x4096": "the original ELMo's 374 MB files (published models run from a local server here)",
    "accelerate launch --multi_gpu": "several GPUs",
    "torchrun --nnodes": "several nodes",
    "torchrun --standalone": "two processes: test_training.py runs them",
    "python recipes/ner_trainer.py": "test_ner_recipe.py runs it on a slice of CoNLL-2003",
    "python benchmarks/": "a benchmark: test_benchmarks.py and test_paper.py run each at toy sizes",
    ".venv/bin/python benchmarks/": "a benchmark: test_benchmarks.py runs each at toy sizes",
    "python3 benchmarks/gpu_check.py": "gpu_check on the lent GPU machine: test_benchmarks.py runs its CPU form",
    "python -m spacy_elmo mix-weights PIPELINE": "PIPELINE stands for a trained pipeline (run above on one)",
    "elmo embed --ray --ray-address auto": "a running Ray cluster: test_ray.py runs jobs on one of two nodes",
    "elmo embed --ray corpus/": "a local Ray cluster for the job: test_ray.py runs one (and the same job's output)",
    "elmo serve": "a server, until stopped: test_serve.py runs it, and the documents' calls to it against it",
}
# What a command gets on top of what is written, to run at toy sizes.
TOY = {
    "python -m spacy_elmo convert-conll2003 ": "--limit 3",
    "python -m spacy train ": "--training.max_steps 3 --training.eval_frequency 3",
    "elmo pretrain ": "--train_files toy.txt --validation_files toy.txt --max_steps 2 --logging_steps 1 --eval_steps 0 "
                      "--save_steps 2 --threads 1 --model_config "
                      "'{\"char_embedding_dim\": 4, \"filters\": [[1, 8], [2, 8]], \"n_highway\": 1, "
                      "\"lstm_dim\": 16, \"projection_dim\": 16}'",
}


def shell_lines(document: str) -> list[str]:
    """The command lines of a document's shell blocks, in order: continuations joined, comment lines left out, and
    each block's `NAME=value` assignments put in place of `$NAME` in its later lines."""
    lines = []
    for code in blocks(REPO / document, "bash"):
        variables = {}
        for line in code.replace("\\\n", " ").splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            assignment = re.fullmatch(r"([A-Z]\w*)=(\S+)", line.strip())
            if assignment:
                variables[assignment[1]] = assignment[2]
                continue
            for name, value in variables.items():
                line = line.replace(f"${name}", value)
            lines.append(" ".join(line.split()))
    return lines


def classify(line: str) -> str:
    """"not run", "checked" or "run"."""
    if any(line.startswith(prefix) for prefix in NOT_RUN):
        return "not run"
    return "checked" if any(line.startswith(prefix) for prefix in CHECKED_ONLY) else "run"


def at_toy_size(line: str) -> str:
    """`line` as a shell runs it here: its toy arguments before its comment and its redirection; on a GPU with CuPy,
    `spacy train` with `--gpu-id 0`."""
    command = line.split(" #")[0].rstrip()
    command, redirect, source = command.partition(" < ")
    for prefix, extra in TOY.items():
        if command.startswith(prefix) and extra:
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
from contextlib import redirect_stdout
from importlib.metadata import entry_points
from io import StringIO
console = {script.name: script for script in entry_points(group="console_scripts")}


def run(words):
    if words[0].endswith(("python", "python3")):
        if words[1] == "-m":  # python -m MODULE ARGS
            sys.argv = [words[2], *words[3:]]
            runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        elif words[1] == "-c":  # python -c CODE
            exec(compile(words[2], "<-c>", "exec"), {"__name__": "__main__"})
        else:  # python SCRIPT ARGS: its directory first on the path, as the interpreter puts it
            sys.argv = words[1:]
            sys.path.insert(0, os.path.dirname(os.path.abspath(words[1])))
            runpy.run_path(words[1], run_name="__main__")
    else:  # a console script of the package: elmo ARGS
        sys.argv = words
        console[words[0]].load()()


results = []
for command, help_only in json.loads(sys.stdin.read()):
    line, _, source = command.partition(" < ")
    words = shlex.split(line)
    start, stdin, output = time.perf_counter(), sys.stdin, StringIO()
    sys.stdin = open(source.strip()) if source else open(os.devnull)
    try:
        with redirect_stdout(output) if help_only else redirect_stdout(sys.stdout):
            run(words)
        code, error = 0, ""
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        error = "" if code == 0 else str(exit.code)
    except BaseException:
        code, error = 1, traceback.format_exc(limit=-4)
    finally:
        sys.stdin.close()
        sys.stdin = stdin
    results.append({"command": command, "code": code, "seconds": round(time.perf_counter() - start, 1),
                    "error": error, "help": output.getvalue() if help_only else ""})
    if code and not help_only:
        break
print("RESULTS " + json.dumps(results))
"""


def run_commands(commands: list[tuple[str, bool]], cwd: Path, env: dict[str, str]) -> list[dict]:
    """`(command, help_only)` pairs run in order in one fresh interpreter (`RUN_COMMANDS`), through the entry points a
    shell uses; a help's output is returned, a failing command stops the run."""
    import json

    result = subprocess.run([sys.executable, "-c", RUN_COMMANDS], input=json.dumps(commands), cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=600)
    assert "RESULTS " in result.stdout, result.stderr[-3000:]
    results = json.loads(result.stdout.rpartition("RESULTS ")[2])
    failed = [r for r in results if r["code"]]
    assert not failed, f"{failed[0]['command']}\n{failed[0]['error']}\n{result.stderr[-3000:]}"
    return results


@pytest.fixture(scope="module")
def services(tmp_path_factory) -> dict[str, str]:
    """The environment of the documents' commands: published models from a local server (AllenNLP's the fixture
    weights, ELMoForManyLangs' a random model in its format), a fake Hub, no bars, and `ray.init()` starting a cluster
    of its own (RAY_ADDRESS=local: without it, it joins the last cluster started on the machine, which another test
    worker's Ray tests may be running)."""
    from efml_fixtures import efml_archive, efml_files, make_efml_model
    from fake_hub import FakeHub, hub_env

    archive = efml_archive(make_efml_model(tmp_path_factory.mktemp("efml") / "xx.model"))
    server = FileServer({**published_files(require(ALLENNLP / "options.json").read_bytes(),
                                           require(ALLENNLP / "lm_weights.hdf5").read_bytes()),
                         **efml_files(archive)})
    with FakeHub() as hub:
        yield {**hub_env(hub.url, tmp_path_factory.mktemp("hf_home")), "ELMO_PUBLISHED_ENDPOINT": server.url,
               "ELMO_EFML_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0", "TQDM_DISABLE": "1", "RAY_ADDRESS": "local"}
    server.close()


def work_directory(root: Path) -> Path:
    """A directory to run a document's commands in, as from the repository's root: the recipes and the package
    beside it, `../shared/data`, and the input files the commands name."""
    work = root / "work"
    work.mkdir()
    (root / "shared").symlink_to(REPO.parent / "shared")
    for name in ("recipes", "hf_elmo", "benchmarks"):
        (work / name).symlink_to(REPO / name)
    (work / "in.txt").write_text("The bank raised its rates .\nWe sat on the river bank .\n")
    (work / "in.txt.gz").write_bytes(gzip.compress((work / "in.txt").read_bytes()))
    (work / "corpus").mkdir()
    for name, text in (("a.txt", "The bank raised its rates .\n"), ("b.txt", "We sat on the river bank .\n")):
        (work / "corpus" / name).write_text(text)
    ptb = (REPO.parent / "shared" / "data" / "ptb" / "ptb.valid.txt").read_text(encoding="utf-8")
    (work / "toy.txt").write_text("".join(ptb.splitlines(keepends=True)[:200]), encoding="utf-8")  # pretraining text
    (work / "options.json").write_bytes(require(ALLENNLP / "options.json").read_bytes())
    (work / "weights.hdf5").write_bytes(require(ALLENNLP / "lm_weights.hdf5").read_bytes())
    return work


@pytest.mark.parametrize("document", SHELL_DOCUMENTS)
def test_every_line_of_the_documents_shell_blocks_runs_as_written_at_toy_sizes(document, services, tmp_path):
    """Each command of a document's shell blocks, in order, in one directory (a later command reads what an earlier
    one wrote), as written with toy sizes appended (`TOY`), through the same entry points as from a shell (the
    package's console scripts, `python -m`, `python SCRIPT`), in one interpreter (their imports load once). A
    command that cannot run here (a GPU, several processes, hours, files not shipped) is listed in `CHECKED_ONLY`
    with its reason and checked against its `--help` (it and every option it is given exist); set-up lines in
    `NOT_RUN`. A line that fails either way fails the test: a stale command fails CI."""
    lines = shell_lines(document)
    kinds = {line: classify(line) for line in lines}
    commands = [(at_toy_size(line), False) for line in lines if kinds[line] == "run"]
    checked = [line for line in lines if kinds[line] == "checked"]
    results = run_commands([*commands, *((help_command(line), True) for line in checked)],
                           work_directory(tmp_path), services)
    assert [r["command"] for r in results] == [command for command, _ in commands] + [help_command(line)
                                                                                      for line in checked]
    for line, result in zip(checked, results[len(commands):]):
        missing = [option for option in options_of(line) if option not in result["help"]]
        assert not missing, f"{document}: {line}: {missing} not in the help of {help_command(line)}"
    assert len(lines) >= {"README.md": 25, "recipes/README.md": 40}.get(document, 1)


def help_command(line: str) -> str:
    """The `--help` command that documents `line`'s command (the pretraining CLI for `accelerate launch` /
    `torchrun ... -m hf_elmo.training`)."""
    words = shlex.split(line.split(" #")[0])
    if "-m" in words and words[words.index("-m") + 1] == "hf_elmo.training" or words[:2] == ["elmo", "pretrain"]:
        return "python -m hf_elmo.training --help"
    if words[0] == "elmo" or words[1] == "-m":
        return " ".join([*words[: 2 if words[0] == "elmo" else 4], "--help"])
    return f"python {words[1]} --help"


def options_of(line: str) -> list[str]:
    """The options `line` gives its command (after `-m hf_elmo.training` for a launcher), without values or the
    brackets of optional ones."""
    words = shlex.split(line.split(" #")[0].replace("[", " ").replace("]", " "))
    if "hf_elmo.training" in words:
        words = words[words.index("hf_elmo.training") + 1 :]
    return [word.split("=")[0] for word in words if word.startswith("--")]


def test_the_documents_commands_are_each_run_checked_or_set_up():
    """Every line of the documents' shell blocks is run, or checked with a reason, or set-up (nothing unclassified
    passes silently), and the README's run, but for its set-up and the GPU recipe."""
    for document in SHELL_DOCUMENTS:
        assert shell_lines(document), document
    readme = {line: classify(line) for line in shell_lines("README.md")}
    assert sum(kind == "run" for kind in readme.values()) >= 17
    assert [line for line, kind in readme.items() if kind == "checked"] == [
        "elmo embed --ray corpus/ vectors/ --workers 2 --cpus-per-worker 1 # a local Ray cluster for the job",
        "elmo embed --ray --ray-address auto corpus/ /shared/vectors/ --gpus-per-worker 1 # an existing Ray cluster",
        "elmo serve # the embedded model on http://127.0.0.1:3000 until Ctrl-C or SIGTERM",
        'elmo serve original --port 8080 --api-key "$API_KEY" --layers top --max-concurrent-requests 64',
        "elmo serve --ray --replicas 2 # the same app on Ray Serve: a local cluster, two replicas",
        "elmo pretrain recipes/english_default_gpu.yaml # the default architecture on one GPU (or accelerate launch)"]
