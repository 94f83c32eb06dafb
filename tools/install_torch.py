"""Install torch into a virtualenv before the package: the CPU build unless another is asked for, and say which build
it got.

    python tools/install_torch.py --pip .venv/bin/pip --python .venv/bin/python [--build cpu|cu126|cu128|...]
                                  [--version 2.13.0]

The build comes from PyTorch's own wheel index for it (https://download.pytorch.org/whl/<build>), which holds the CPU
build (`cpu`) and each CUDA build (`cu126`, ...). Where that index cannot be reached (a machine that sees only a
package index or a mirror), pip's own index gives `torch==<version>`: on Linux x86-64 that is a CUDA build (several GB
of nvidia-* packages; it runs on a CPU too), elsewhere the CPU build; a wheel of that version in pip's find-links is
taken first. `make demo` / `make test` run it when the virtualenv has no torch (`make test TORCH=cu126`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import urllib.error
import urllib.request

PYTORCH_INDEX = "https://download.pytorch.org/whl"


def reachable(url: str, timeout: float = 5.0) -> bool:
    """Whether `url` answers (a wheel index's page for torch)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


def install_command(pip: str, build: str, version: str, index: str) -> list[str]:
    """The pip command: from PyTorch's index for `build` where it answers, else from pip's own index."""
    build_index = f"{index}/{build}"
    if reachable(f"{build_index}/torch/"):
        return [pip, "install", f"torch=={version}", "--index-url", build_index]
    print(f"install_torch: {build_index} cannot be reached; torch=={version} from pip's own index instead "
          "(on Linux x86-64 a CUDA build: several GB)", file=sys.stderr)
    return [pip, "install", f"torch=={version}"]


def installed_build(python: str) -> str:
    """What the virtualenv's torch is: its version, and `CPU build` or the CUDA version it was built for."""
    script = "import torch; print(torch.__version__, torch.version.cuda or '')"
    version, _, cuda = subprocess.run([python, "-c", script], capture_output=True, text=True,
                                      check=True).stdout.strip().partition(" ")
    return f"torch {version}, " + (f"a CUDA {cuda} build (runs on a CPU too)" if cuda else "the CPU build")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pip", required=True, help="the virtualenv's pip")
    parser.add_argument("--python", required=True, help="the virtualenv's python (to report the build installed)")
    parser.add_argument("--build", default="cpu", help="cpu, or a CUDA build of PyTorch's index (cu126, cu128, ...)")
    parser.add_argument("--version", default="2.13.0")
    parser.add_argument("--index", default=PYTORCH_INDEX, help=argparse.SUPPRESS)  # a local server in the tests
    args = parser.parse_args()
    command = install_command(args.pip, args.build, args.version, args.index)
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    print(f"install_torch: {installed_build(args.python)}")


if __name__ == "__main__":
    main()
