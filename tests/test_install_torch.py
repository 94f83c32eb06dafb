"""`tools/install_torch.py` and the Makefile's set-up: torch's CPU build on a CPU machine from PyTorch's own index
(pip's own index gives a CUDA build of GBs on Linux x86-64), a CUDA build when asked, pip's index where PyTorch's
cannot be reached, and a line saying which build was installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from elmo_fixtures import server_port
from file_server import FileServer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_pip(tmp_path) -> tuple[Path, Path]:
    """A `pip` that records its arguments, one per line, and installs nothing."""
    record = tmp_path / "pip-arguments"
    pip = tmp_path / "pip"
    pip.write_text(f"#!{sys.executable}\nimport sys\nopen({str(record)!r}, 'w').write('\\n'.join(sys.argv[1:]))\n")
    pip.chmod(0o755)
    return pip, record


def install(pip: Path, index: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "tools" / "install_torch.py"), "--pip", str(pip), "--python",
                           sys.executable, "--index", index, *options], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("build", ["cpu", "cu126"])
def test_the_build_asked_for_comes_from_pytorchs_own_index(fake_pip, build):
    pip, record = fake_pip
    server = FileServer({f"{build}/torch/": b"<html>torch</html>"})
    try:
        result = install(pip, server.url, *(["--build", build] if build != "cpu" else []))
    finally:
        server.close()
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == ["install", "torch==2.13.0", "--index-url", f"{server.url}/{build}"]
    import torch

    cuda = torch.version.cuda
    assert result.stdout.splitlines()[-1] == f"install_torch: torch {torch.__version__}, " + (
        f"a CUDA {cuda} build (runs on a CPU too)" if cuda else "the CPU build")


def test_where_pytorchs_index_cannot_be_reached_pips_own_index_gives_the_pinned_version(fake_pip):
    pip, record = fake_pip
    result = install(pip, f"http://127.0.0.1:{server_port()}", "--version", "2.13.0")
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == ["install", "torch==2.13.0"]
    assert "cannot be reached; torch==2.13.0 from pip's own index instead (on Linux x86-64 a CUDA build" in (
        result.stderr)


@pytest.mark.parametrize("torch, build", [(None, "cpu"), ("cu126", "cu126")])
def test_make_installs_torch_through_it_before_the_package_when_the_virtualenv_has_none(tmp_path, torch, build):
    """`make -n` (nothing run) in a checkout without a virtualenv: the demo's set-up installs torch, then the package
    without the dev extra; the tests' set-up adds the dev extra."""
    settings = [f"VENV={tmp_path / 'venv'}", *([f"TORCH={torch}"] if torch else [])]
    demo = subprocess.run(["make", "-n", "demo", *settings], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "MAKEFLAGS": ""}).stdout
    assert f"tools/install_torch.py --pip {tmp_path}/venv/bin/pip" in demo and f"--build {build}" in demo
    assert demo.index("install_torch.py") < demo.index("pip install --quiet -e .") and "[dev]" not in demo
    test = subprocess.run(["make", "-n", "test", *settings], cwd=REPO, capture_output=True, text=True).stdout
    assert 'pip install --quiet -e ".[dev]"' in test
