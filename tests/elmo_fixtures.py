"""Paths to the original AllenNLP / bilm-tf test files in ../shared (never copied into the project)."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "data" / "elmo-fixtures"
ALLENNLP = FIXTURES / "allennlp"
BILM_TF = FIXTURES / "bilm-tf" / "model"
# (name, model directory, sentences file); the allennlp model has skip connections, the bilm-tf one has none.
FIXTURE_MODELS = [
    ("allennlp", ALLENNLP, ALLENNLP / "sentences.json"),
    ("bilm-tf", BILM_TF, BILM_TF / "lm_embeddings_sentences.json"),
]


def require(path: Path) -> Path:
    """The fixture path; a missing fixture fails under CI (CI=true) and skips elsewhere."""
    if not path.exists():
        message = f"fixture {path} is missing"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def message_words(output: str) -> str:
    """A command's output as its words, one space apart: what a message says, whatever the terminal made of it (line
    breaks, the borders of rich's error panel, colour codes)."""
    return " ".join(re.sub("[\u2500-\u257f]|\x1b\\[[0-9;]*m", " ", output).split())


def sentences(path: Path) -> list[list[str]]:
    """3 lists of 10 whitespace-tokenized sentences; batch i of the original test = [s[0][i], s[1][i], s[2][i]]."""
    return json.loads(require(path).read_text())


# bilm-tf's training test: its toy corpus and vocabulary, and its architecture with 10-character words.
TOY = FIXTURES / "bilm-tf" / "train"
TOY_MODEL = json.dumps({
    "char_embedding_dim": 4, "filters": [[1, 8], [2, 8], [3, 16], [4, 32], [5, 64]], "activation": "tanh",
    "n_highway": 1, "lstm_dim": 16, "projection_dim": 8, "max_characters_per_token": 10,
})

# The saved small biLM of `tiny_model_dir` (conftest.py).
TINY_CONFIG = dict(char_embedding_dim=4, filters=[[1, 4], [2, 8], [3, 16]], n_highway=1, lstm_dim=32, projection_dim=8)

# Sentences of several lengths for the model tests.
SENTENCES = [
    ["The", "bank", "raised", "rates", "."],
    ["We", "sat", "on", "the", "river", "bank"],
    ["Hi"],
    "A much longer sentence that goes on and on with many words in it , doesn't it ?".split(),
]


def run(model, tokenizer, sentences, **kwargs):
    """The tokenizer's padded batch of `sentences` and the model's outputs for it (with the final state)."""
    import torch

    encoded = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt", **kwargs)
    with torch.no_grad():
        return encoded, model(**encoded, return_state=True)


def direct_layers(model, words: list[str]):
    """(layers, words, width): the model called on one sentence, `<S>`/`</S>` cut off."""
    import torch

    from hf_elmo import ElmoCharTokenizer

    encoded = ElmoCharTokenizer()([words], is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        hidden_states = model(**encoded).hidden_states
    return torch.stack(hidden_states)[:, 0, 1:-1].numpy()


def tiny_config(**overrides):
    """A small random-weight architecture with every feature on (projection, clipping, residual)."""
    from hf_elmo import ElmoConfig

    settings = dict(
        char_embedding_dim=4, filters=[[1, 4], [2, 8], [3, 16]], n_highway=2, lstm_dim=24, projection_dim=8,
        n_layers=2, cell_clip=3.0, proj_clip=3.0, use_skip_connections=True,
    )
    return ElmoConfig(**{**settings, **overrides})


def worker_threads() -> int:
    """The CPUs one test process may use: those of this process over pytest-xdist's workers (each runs tests at the
    same time), at least 1. More threads than that make OpenMP's threads wait for each other on a busy machine (the
    paper's quick form: 40 s on one thread against 63 s on two, the other core busy)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cpus // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def server_port() -> int:
    """A free port of 127.0.0.1 for a server a test starts, never one the kernel hands out: between Ray's worker ports
    (10002-19999) and the kernel's ephemeral range (`ip_local_port_range`), where Ray's processes and every client
    socket get theirs; each pytest-xdist worker draws from its own part. A port from `bind(0)` could be taken between
    its choice and the server's bind (a CI run's `elmo serve --ray` found its own cluster's metrics exporter there)."""
    try:
        high = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768  # Linux's default; the ranges of macOS and Windows start at 49152
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    span = (high - 20000) // workers
    ports = range(20000 + worker * span, 20000 + (worker + 1) * span)
    for port in random.sample(ports, len(ports)):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port between 20000 and the ephemeral range (from {high}) for worker {worker}")


def run_without_hf_elmo(code: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run `code` in a fresh interpreter that cannot import `hf_elmo`; its stdout (fails the test on an error).

    Started with `python -I -S`: no PYTHONPATH, no cwd, no site module, so no .pth file (the editable install's
    finder) runs. `code` first adds the site-packages directories themselves, given as JSON in `sys.argv[1]`:
    `sys.path.extend(json.loads(sys.argv[1]))`; `args` follow in `sys.argv[2:]`.
    """
    import site
    import subprocess
    import sys

    user_site = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    site_dirs = [path for path in [*site.getsitepackages(), *user_site] if Path(path).is_dir()]
    command = [sys.executable, "-I", "-S", "-c", code, json.dumps(site_dirs), *args]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def inject_out_of_memory(monkeypatch, too_big) -> list[tuple[int, int]]:
    """`ElmoModel.forward` raises CUDA's out-of-memory error for the batches `too_big(input_ids)` says (the device's
    memory, simulated); returns the (rows, positions) of every call."""
    import torch

    from hf_elmo import ElmoModel

    forward, calls = ElmoModel.forward, []

    def forward_or_out_of_memory(self, input_ids, *args, **kwargs):
        calls.append(tuple(input_ids.shape[:2]))
        if too_big(input_ids):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                              "capacity of 79.19 GiB of which 1.06 GiB is free.\nOf the memory ...")
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(ElmoModel, "forward", forward_or_out_of_memory)
    return calls


def toy_lines() -> list[str]:
    """The lines of bilm-tf's toy training corpus."""
    return require(TOY / "data.txt").read_text().splitlines()


def toy_batch(vocabulary) -> dict:
    """The first three lines of the toy corpus as one pretraining batch of `vocabulary`'s word ids."""
    from hf_elmo import ElmoCharTokenizer
    from hf_elmo.training import encode_batch, split_line

    segments = [s for line in toy_lines()[:3] for s in split_line(line.split(), None)]
    return encode_batch(segments, ElmoCharTokenizer(max_characters_per_token=10), vocabulary)


def in_a_small_tmpfs(directory: Path, size: str, command: list[str], env: dict[str, str],
                     timeout: float = 180) -> subprocess.CompletedProcess:
    """`command` in a private mount namespace where `directory` is a fresh tmpfs of `size`, then a listing of it
    (every name, hidden ones too), which the process's stdout ends with."""
    script = f'mount -t tmpfs -o size={size} tmpfs "$1" && shift && "$@"; code=$?; ls -A "$DIR"; exit $code'
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh",
                           str(directory), *command], capture_output=True, text=True, timeout=timeout,
                          env={**env, "DIR": str(directory)})


def require_tmpfs(tmp_path: Path) -> None:
    """Skip (fail with CI=true) where no small tmpfs can be mounted in a user namespace of the test's own."""
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        available = in_a_small_tmpfs(probe, "64k", ["true"], dict(os.environ)).returncode == 0
    except FileNotFoundError:
        available = False
    probe.rmdir()
    if not available:
        if os.environ.get("CI"):
            pytest.fail("a tmpfs in a user namespace (unshare --user --mount) is needed for the full-disk tests")
        pytest.skip("no user namespaces here to mount a small tmpfs in")
