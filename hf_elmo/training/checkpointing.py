"""Atomic training checkpoints.

A checkpoint is Accelerate's full training state (model, optimizer, scheduler, gradient scaler, every process's
RNG states: `Accelerator.save_state`) plus each process's own JSON state (step, data position). It is written
into `.partial-checkpoint-<step>`, flushed to disk, and renamed to `checkpoint-<step>` in one atomic step, so a
run killed at any moment (even by SIGKILL) leaves only complete checkpoints under their final names; old ones
are renamed away before being deleted. Processes must share the checkpoint directory (one filesystem).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils.constants import RNG_STATE_NAME

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The complete checkpoints in `directory`, oldest (lowest step) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), path) for path in directory.iterdir() if (m := CHECKPOINT_NAME.match(path.name))]
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in `directory`, or None."""
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def remove_partial_checkpoints(directory: str | os.PathLike) -> None:
    """Delete what an interrupted save or deletion left behind (main process only)."""
    directory = Path(directory)
    if directory.is_dir():
        for path in directory.iterdir():
            if path.name.startswith((".partial-", ".deleted-")):
                shutil.rmtree(path, ignore_errors=True)


def _sync_tree(directory: Path) -> None:
    """fsync every file of `directory` and the directory itself."""
    for path in [*directory.rglob("*"), directory]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _state_file(rank: int) -> str:
    return f"training_state_{rank}.json"


def save_checkpoint(
    accelerator: Accelerator, directory: str | os.PathLike, step: int, state: dict[str, Any], keep: int | None = None
) -> Path:
    """Atomically write `checkpoint-<step>` into `directory` (every process calls this; `state` is this process's).

    Keeps the newest `keep` checkpoints (all if None). Returns the checkpoint's path.
    """
    directory = Path(directory)
    final = directory / f"checkpoint-{step}"
    partial = directory / f".partial-checkpoint-{step}"
    if accelerator.is_main_process:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    (partial / _state_file(accelerator.process_index)).write_text(json.dumps(state), encoding="utf-8")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _sync_tree(partial)
        if final.exists():  # the same step saved again (e.g. at the end of training): replace it
            final.rename(directory / f".deleted-{final.name}")
        partial.rename(final)
        _sync_tree(directory)
        stale = list_checkpoints(directory)[: -keep if keep else 0]
        for old in stale:
            old.rename(directory / f".deleted-{old.name}")
        remove_partial_checkpoints(directory)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, checkpoint: str | os.PathLike) -> dict[str, Any]:
    """Restore the training state saved by `save_checkpoint`; returns this process's `state`."""
    checkpoint = Path(checkpoint)
    state_file = checkpoint / _state_file(accelerator.process_index)
    if not state_file.is_file():
        raise ValueError(
            f"{checkpoint} has no state for process {accelerator.process_index}: resume with the number of "
            "processes that wrote it"
        )
    rng_file = checkpoint / f"{RNG_STATE_NAME}_{accelerator.process_index}.pkl"
    try:  # Accelerate logs and ignores an RNG state it cannot load, which would resume inexactly
        saved_rng = torch.load(rng_file, weights_only=False)["torch_manual_seed"]
    except Exception as error:
        raise ValueError(f"{checkpoint}: the random state of process {accelerator.process_index} cannot be read "
                         f"({error}); resuming from it would not continue the run exactly") from None
    accelerator.load_state(str(checkpoint))
    if not torch.equal(torch.get_rng_state(), saved_rng):
        raise ValueError(f"{checkpoint}: the random state of process {accelerator.process_index} was not restored; "
                         "resuming from it would not continue the run exactly")
    return json.loads(state_file.read_text(encoding="utf-8"))
