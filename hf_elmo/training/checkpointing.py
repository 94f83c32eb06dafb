"""Atomic training checkpoints that load without unpickling anything.

A checkpoint holds the state of the run's objects (model, optimizer, schedule, gradient scaler: whatever has
`state_dict`/`load_state_dict`, saved by the main process), every process's random states (Python, NumPy, torch
CPU and CUDA generators) and every process's own JSON state (step, data position, log window). Each state is one
safetensors file: its tensors, and the rest of its structure as JSON in the file's metadata. Nothing is a pickle,
so a checkpoint, like any model download, can never run code when it is loaded.

It is written into `.partial-checkpoint-<step>`, flushed to disk, and renamed to `checkpoint-<step>` in one atomic
step, so a run killed at any moment (even by SIGKILL) leaves only complete checkpoints under their final names; old
ones are renamed away before being deleted. Processes must share the checkpoint directory (one filesystem).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from accelerate import Accelerator
from safetensors import safe_open
from safetensors.torch import save_file

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
# What checkpoints of earlier versions (Accelerate's `save_state`) held in pickles: never loaded.
PICKLED_STATES = ("random_states_{rank}.pkl", "optimizer.bin", "scheduler.bin", "scaler.pt")


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


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


def _random_state_file(rank: int) -> str:
    return f"random_state_{rank}.safetensors"


# -- states as safetensors files ----------------------------------------------------------------------------------


def _encode(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    """`value` as JSON, its tensors moved into `tensors` under their path (keys and item indices joined by "/")."""
    if isinstance(value, torch.Tensor):
        if path in tensors:
            raise ValueError(f"two tensors of a checkpoint state would be stored as {path!r}")
        tensors[path] = value.detach()
        return {"tensor": path}
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return {"value": value.item()}
    if isinstance(value, Mapping):
        return {"dict": [[_encode(key, tensors, path), _encode(item, tensors, f"{path}/{key}".lstrip("/"))]
                         for key, item in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_encode(item, tensors, f"{path}/{index}".lstrip("/")) for index, item in enumerate(value)]
        return {"tuple" if isinstance(value, tuple) else "list": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"a checkpoint cannot store a {type(value).__name__} (at {path!r})")


def _decode(encoded: Any, tensors: safe_open) -> Any:
    (kind, content), *rest = encoded.items()
    if kind == "tensor":
        return tensors.get_tensor(content)
    if kind == "ndarray":
        return np.array(content, dtype=rest[0][1])
    if kind == "dict":
        return {_decode(key, tensors): _decode(item, tensors) for key, item in content}
    if kind in ("list", "tuple"):
        items = [_decode(item, tensors) for item in content]
        return tuple(items) if kind == "tuple" else items
    if kind == "value":
        return content
    raise ValueError(f"unknown entry {kind!r}")


def save_state(state: Any, path: Path) -> None:
    """Write `state` (nested dicts, lists and tuples of tensors, NumPy arrays and JSON values) as one safetensors
    file: its tensors, and the structure as JSON in the metadata."""
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(state, tensors, "")
    stored, seen = {}, set()
    for name, tensor in tensors.items():
        tensor = tensor.cpu().contiguous()
        if tensor.numel() and tensor.untyped_storage().data_ptr() in seen:  # safetensors refuses shared memory
            tensor = tensor.clone()
        seen.add(tensor.untyped_storage().data_ptr())
        stored[name] = tensor
    save_file(stored, path, metadata={"structure": json.dumps(structure)})


def load_state(path: Path) -> Any:
    """What `save_state` wrote to `path` (tensors on the CPU); a `ValueError` naming the file if it cannot be read."""
    try:
        with safe_open(path, framework="pt") as tensors:
            return _decode(json.loads((tensors.metadata() or {})["structure"]), tensors)
    except Exception as error:  # safetensors, JSON, a missing entry: the file is damaged
        raise ValueError(f"{path} cannot be read ({str(error).splitlines()[0] if str(error) else type(error).__name__}"
                         "): the checkpoint is damaged; resume from an earlier one (delete this one) or start again") \
            from None


def random_states() -> dict[str, Any]:
    """The states of every random generator a training step draws from (Python, NumPy, torch CPU and CUDA)."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        if not torch.cuda.is_available() or torch.cuda.device_count() != len(states["cuda"]):
            raise ValueError(f"the checkpoint was written with {len(states['cuda'])} CUDA devices visible; resume "
                             "with as many, or it would not continue the run exactly")
        torch.cuda.set_rng_state_all(states["cuda"])


# -- checkpoints --------------------------------------------------------------------------------------------------


def save_checkpoint(
    accelerator: Accelerator,
    directory: str | os.PathLike,
    step: int,
    state: dict[str, Any],
    objects: Mapping[str, Stateful] | None = None,
    keep: int | None = None,
) -> Path:
    """Atomically write `checkpoint-<step>` into `directory` (every process calls this; `state` is this process's
    JSON state; `objects`, e.g. `{"model": ..., "optimizer": ...}`, are saved by the main process as
    `<name>.safetensors`). Keeps the newest `keep` checkpoints (all if None). Returns the checkpoint's path."""
    directory = Path(directory)
    final = directory / f"checkpoint-{step}"
    partial = directory / f".partial-checkpoint-{step}"
    if accelerator.is_main_process:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        for name, stateful in (objects or {}).items():
            save_state(stateful.state_dict(), partial / f"{name}.safetensors")
    rank = accelerator.process_index
    save_state(random_states(), partial / _random_state_file(rank))
    (partial / _state_file(rank)).write_text(json.dumps(state), encoding="utf-8")
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


def load_checkpoint(
    accelerator: Accelerator, checkpoint: str | os.PathLike, objects: Mapping[str, Stateful] | None = None
) -> dict[str, Any]:
    """Restore what `save_checkpoint` saved into `objects` and the random generators; returns this process's
    `state`. Fails with a `ValueError` naming the file on a damaged checkpoint, one of another number of processes,
    and one of an earlier version, whose pickled states are never loaded."""
    checkpoint, rank = Path(checkpoint), accelerator.process_index
    random_file = checkpoint / _random_state_file(rank)
    pickled = [name.format(rank=rank) for name in PICKLED_STATES if (checkpoint / name.format(rank=rank)).exists()]
    if pickled and not random_file.exists():
        raise ValueError(
            f"{checkpoint} was written by an earlier version of elmo pretrain and keeps its state in pickles "
            f"({', '.join(pickled)}), which are never loaded: unpickling can run code. Start the run again without "
            "--resume (or in a new --output_dir)"
        )
    state_file = checkpoint / _state_file(rank)
    if not state_file.is_file():
        raise ValueError(
            f"{checkpoint} has no state for process {rank}: resume with the number of processes that wrote it"
        )
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{state_file} cannot be read ({error}): the checkpoint is damaged; resume from an earlier "
                         "one (delete this one) or start again") from None
    for name, stateful in (objects or {}).items():
        saved = load_state(checkpoint / f"{name}.safetensors")
        try:
            stateful.load_state_dict(saved)
        except (RuntimeError, ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{checkpoint / f'{name}.safetensors'} does not fit this run "
                             f"({str(error).splitlines()[0]}): resume with the arguments that wrote it") from None
    try:
        set_random_states(load_state(random_file))
    except (TypeError, KeyError, IndexError, RuntimeError) as error:  # readable, but not random states
        raise ValueError(f"{random_file} holds no valid random states ({error}): the checkpoint is damaged; resume "
                         "from an earlier one (delete this one) or start again") from None
    return state
