"""Where embeddings go: the writers' base (`EmbeddingWriter`) and the output a name or a format asks for, found in
the registry (`output_formats.OUTPUT_FORMATS`: HDF5 in AllenNLP's `elmo` layout, `hdf5.py`; a streamed `.npy` with
offsets, `npy.py`; Parquet, a row per sentence, `parquet.py`). A new format is a module with its writer and one
line of the registry.

Every writer holds its output's lock (`outputs.OutputLock`) from before its first byte, writes hidden partial files
beside the output, and moves them into place only once complete (`close`); on any failure (`discard`, or leaving its
`with` block with an exception) nothing of its own is left. A write that fails (a full disk, a file-size limit) is one
line naming the file (`outputs.write_error`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..extras import require
from .output_formats import OUTPUT_FORMATS, FormatError, OutputFormat, output_format
from .outputs import OutputLock, note_other_leftovers, partial_path, remove_leftovers
from .reading import Sentence
from .settings import EmbedSettingError, VectorLayout

FILE_FORMATS = tuple(OUTPUT_FORMATS)


class EmbeddingWriter:
    """Base of the writers: a context manager that keeps the output only if the block completes. `files`: the files
    of the output, each written to its `partial_path` until `close`."""

    count: int

    def __init__(self, path: str | Path, files: Sequence[Path]):
        self.path = Path(path)
        self.files = list(files)
        self.count = 0
        partials = [partial_path(file) for file in self.files]
        self._lock = OutputLock(self.path, partials).acquire()
        try:
            remove_leftovers(partials)
            note_other_leftovers(self.path, partials)
        except BaseException:
            self._lock.release()
            raise

    @classmethod
    def files(cls, path: Path, layout: VectorLayout | None = None) -> list[Path]:
        """The files an output at `path` of `layout`'s vectors is made of."""
        return [path]

    def add(self, embedding: np.ndarray, sentence: Sentence) -> None:
        """Write the next sentence: `embedding` in the layout's shape, and where it came from."""
        self.add_parts(sentence, [embedding])

    def add_parts(self, sentence: Sentence, parts: Iterable[np.ndarray]) -> None:
        """Write the next sentence from consecutive parts of its vectors along its words (e.g. the windows of a long
        line), each written as it comes (pooled: one part, its vector)."""
        raise NotImplementedError

    def close(self) -> None:
        """Finish the output file(s) and move them into place."""
        try:
            self._close()
        finally:
            self._lock.release()

    def discard(self) -> None:
        """Delete what was written."""
        try:
            self._discard()
        finally:
            self._lock.release()

    def _close(self) -> None:
        raise NotImplementedError

    def _discard(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> EmbeddingWriter:
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if exc_type is not None:
            self.discard()
            return
        try:
            self.close()
        except BaseException:
            self.discard()
            raise


def close_and_remove(handle: Any, path: Path) -> None:
    """Close `handle` (if any) and delete `path`, also when closing fails (e.g. flushing onto a full disk)."""
    try:
        if handle is not None:
            handle.close()
    except Exception:  # any failure: the file is being thrown away, what it lacks does not matter
        pass
    finally:
        path.unlink(missing_ok=True)


def output_files(path: str | Path, layout: VectorLayout | None = None, file_format: str | None = None) -> list[Path]:
    """The files an output of this name writes (`EmbeddingWriter.files`: the `.npy` vectors' offsets beside them,
    unless pooled)."""
    return _format(path, file_format).writer_class().files(Path(path), layout)


def check_output(path: str | Path, sentence_keys: bool = False, file_format: str | None = None) -> str:
    """The format of an output file (`output_formats.output_format`: by `file_format`, else by its name), checked
    before any work: its options (sentence keys only in HDF5) and the library it needs (an `EmbedSettingError`
    naming the setting, an `ImportError` of one line)."""
    chosen = _format(path, file_format)
    if sentence_keys and "sentence_keys" not in chosen.options:
        raise EmbedSettingError("sentence_keys", f"sentence keys name the datasets of an HDF5 file; {path} is "
                                f"{chosen.title}")
    if chosen.needs:
        require(chosen.needs, f"{chosen.title} outputs need")
    return chosen.name


def open_writer(
    path: str | Path,
    layout: VectorLayout,
    sentence_index: bool = True,
    sentence_keys: bool = False,
    file_format: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> EmbeddingWriter:
    """The writer of `check_output`'s format for `layout`'s vectors, given the options it takes (`metadata`: what a
    Parquet file records; `sentence_index`, `sentence_keys`: an HDF5 file's)."""
    chosen = OUTPUT_FORMATS[check_output(path, sentence_keys, file_format)]
    offered = {"sentence_index": sentence_index, "sentence_keys": sentence_keys, "metadata": metadata}
    return chosen.writer_class()(path, layout, **{name: offered[name] for name in chosen.options})


def _format(path: str | Path, file_format: str | None) -> OutputFormat:
    try:
        return output_format(path, file_format)
    except FormatError as error:
        raise EmbedSettingError("file_format", str(error)) from None
