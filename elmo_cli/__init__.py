"""The `elmo` command line (`elmo --help`; `python -m elmo_cli` runs it too, e.g. under `torchrun`)."""

from .app import app

__all__ = ["app"]
