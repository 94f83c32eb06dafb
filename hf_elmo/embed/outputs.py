"""What an embedding run leaves on disk: its output, complete, or nothing of its own. Never an input overwritten, never
two runs' bytes in one output, never hidden files nobody mentions.

- `OutputLock`: one run per output. A lock file beside the output (`.NAME.lock`, `fcntl.flock`: the kernel releases
  it when the process ends, SIGKILL included) is held from before the first byte until the output is in place; a
  second run to the same output is refused at once (`OutputBusyError`, naming the first run).
- `partial_path`: where a file of an output is written until it is complete (hidden, beside it), then renamed.
- Leftovers: what killed runs left (their partial files; a resumable job's partial directory). The next run to the
  same output removes (or resumes) its own and says so; those of other outputs in its directory are named
  (`LeftoverWarning`), so that none fills a disk unnoticed.
- `check_not_input`: an output that is one of the inputs (the same file by any path or link, stdin included) is
  refused before anything is written.
- `write_error`: a failed write (a full disk, a quota, a file-size limit) as one line naming the file, what was
  written and what did not fit.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import resource
import shutil
import socket
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO


class OutputError(OSError):
    """An output that cannot be written, in one line: which file, what is wrong, what to do."""

    def __str__(self) -> str:
        return str(self.args[0])


class OutputBusyError(OutputError):
    """Another run is writing the same output."""


class EmbedInterrupted(Exception):
    """A run stopped by SIGINT (or SIGTERM as `elmo embed` takes it), in one line: what it left, what to do."""


class LeftoverWarning(UserWarning):
    """Files that interrupted runs left beside an output: named once, when a run starts there."""


def partial_path(path: Path) -> Path:
    """Where a file (or a directory of shards) is written until it is complete, then renamed to `path`."""
    return path.with_name(f".{path.name}.partial")


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


def size_text(size: float) -> str:
    """Bytes as people read them: `312.4 MB`."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(size) < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def disk_size(path: Path) -> int:
    """The bytes of a file, or of every file under a directory."""
    if path.is_dir():
        return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())
    return path.stat().st_size if path.exists() else 0


class OutputLock:
    """One run per output: `acquire` takes `.NAME.lock` beside `output` or raises `OutputBusyError` at once (it never
    waits); `release` removes it. The lock file records the run (pid, host, start) and the partial files it writes,
    so that other runs tell its files from leftovers."""

    def __init__(self, output: str | os.PathLike, partials: Sequence[Path] = ()):
        self.output = Path(output)
        self.path = lock_path(self.output)
        self.partials = [path.name for path in partials]
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as error:
                raise OutputError(f"cannot write in {self.output.parent} ({error.strerror}): choose a directory you "
                                  "can write to") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise OutputBusyError(
                    f"{self.output} is being written by another run ({holder}): wait for it to end, or write to "
                    "another output") from None
            # The previous holder removes the file before releasing it: a lock taken on a removed file is no lock.
            try:
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "partials": self.partials}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _holder(fd: int) -> str:
    """Who holds a lock file, as its record says."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {record['pid']} on {record['host']}, started {record['started']}"
    except (ValueError, KeyError, OSError):
        return "its lock file is being written"


def remove_leftovers(partials: Iterable[Path]) -> None:
    """Remove an output's own partial files left by a killed run (the caller holds its lock), saying what went."""
    found = [(path, disk_size(path)) for path in partials if path.exists()]
    for path, _ in found:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    if found:
        total = sum(size for _, size in found)
        names = ", ".join(path.name for path, _ in found)
        warnings.warn(f"removed {names} ({size_text(total)}) in {found[0][0].parent}, left by an interrupted run",
                      LeftoverWarning, stacklevel=3)


def note_other_leftovers(output: Path, own: Sequence[Path]) -> None:
    """Name (once) the partial files in `output`'s directory that belong to no running run and not to `output`: what
    killed runs to other outputs left."""
    directory = output.parent
    live = {path.name for path in own}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return
    for lock in entries:
        if lock.name.startswith(".") and lock.name.endswith(".lock"):
            live.update(_live_partials(lock))
    stale = [path for path in entries if path.name.startswith(".") and path.name.endswith(".partial")
             and path.name not in live]
    if stale:
        total = sum(disk_size(path) for path in stale)
        warnings.warn(
            f"{len(stale)} file{'s' if len(stale) > 1 else ''} left by interrupted runs in {directory} "
            f"({size_text(total)}): {', '.join(sorted(path.name for path in stale))}; the next run to the same output "
            "removes (or resumes) them, or delete them", LeftoverWarning, stacklevel=3)


def _live_partials(lock: Path) -> list[str]:
    """The partial files a lock file's run writes, if that run may be running (on this host: its process exists)."""
    try:
        record = json.loads(lock.read_bytes() or b"{}")
        pid, host, partials = int(record["pid"]), record["host"], list(record["partials"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass  # another user's process
    return partials


def check_not_input(outputs: Sequence[Path], inputs: Sequence[str | os.PathLike | IO]) -> None:
    """Fail before anything is written when a file of the output is one of the inputs: the same file by any path, a
    link to it, or what stdin reads."""
    identities = {}
    for source in inputs:
        try:
            if hasattr(source, "fileno") or str(source) == "-":
                info = os.fstat(source.fileno() if hasattr(source, "fileno") else 0)
            else:
                info = os.stat(source)
        except (OSError, ValueError):  # in-memory streams, a stdin that is closed
            continue
        identities[(info.st_dev, info.st_ino)] = "stdin" if not hasattr(source, "read") and str(source) == "-" else (
            str(getattr(source, "name", source)))
    for output in outputs:
        try:
            info = os.stat(output)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in identities:
            source = identities[(info.st_dev, info.st_ino)]
            same = "" if str(output) == source else f" ({source} and {output} are the same file)"
            raise OutputError(f"the output {output} is the input{same}: writing it would destroy the input; choose "
                              "another output")


def write_error(error: OSError, path: Path, written: int, wanted: int | None = None) -> OSError:
    """A failed write to `path` (of which `written` bytes were written, the next `wanted` not) as one line; errors
    other than a full disk, a quota or a file-size limit keep their reason and gain the file's name."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(path.parent).free
        did_not_fit = f", the next {size_text(wanted)} did not fit" if wanted else ""
        reason = "no space left" if error.errno == errno.ENOSPC else "the disk quota is used up"
        return OutputError(f"{reason} on the disk holding {path}: {size_text(written)} written{did_not_fit} "
                           f"({size_text(free)} free); the partial output is removed: free space, or write elsewhere")
    if error.errno == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        limit_text = "" if limit == resource.RLIM_INFINITY else f" ({size_text(limit)}, ulimit -f)"
        return OutputError(f"{path} reached the file size limit{limit_text} after {size_text(written)}; the partial "
                           "output is removed: raise the limit, or write less (--layers top, --dtype float16, --pool)")
    return OutputError(f"cannot write {path}: {error.strerror or error}")
