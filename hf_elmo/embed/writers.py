"""Where embeddings go: HDF5 in AllenNLP's `elmo` layout (`Hdf5Writer`: any name but `.npy`) or a streamed `.npy`
with offsets (`NpyWriter`); a file appears only once complete."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from ..extras import require
from .settings import EmbedSettingError

# The output formats: a `.npy` name is NumPy's, any other HDF5 (`check_output`).
FILE_FORMATS = ("hdf5", "npy")


def partial_path(path: Path) -> Path:
    """Where a file is written until it is complete, then renamed to `path`."""
    return path.with_name(f".{path.name}.partial")


class EmbeddingWriter:
    """Base of the writers: a context manager that keeps the output only if the block completes."""

    count: int

    def add(self, embedding: np.ndarray, sentence: str) -> None:
        """Write the next sentence: `embedding` (layers, words, width) or (words, width), and its text."""
        self.add_parts(embedding.shape[-2], [embedding], sentence)

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        """Write the next sentence of `words` words from consecutive parts of its vectors along the words axis
        (e.g. the windows of a long line), each written as it comes, and its text."""
        raise NotImplementedError

    def close(self) -> None:
        """Finish the output file(s)."""
        raise NotImplementedError

    def discard(self) -> None:
        """Delete what was written."""
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


class Hdf5Writer(EmbeddingWriter):
    """AllenNLP's `elmo` command layout: one float32 dataset per sentence named by its 0-based index, and
    `sentence_to_index`, a one-element string dataset holding JSON `{stripped line: "index"}` (a repeated line maps
    to its last index). `sentence_index=False` leaves it out and keeps memory flat on huge inputs.

    `sentence_keys=True` (AllenNLP's `--use-sentence-keys`): each dataset is named by its stripped line instead,
    without `sentence_to_index`; a repeated line is written once (its vectors are the same every time). A line
    that cannot name an HDF5 dataset (empty, `.`, or containing `/`) is an error.
    """

    def __init__(self, path: str | Path, sentence_index: bool = True, sentence_keys: bool = False):
        h5py = require("h5py", ".hdf5 outputs need")
        self.path = Path(path)
        self.count = 0
        self.sentence_keys = sentence_keys
        self.sentence_to_index: dict[str, str] | None = {} if sentence_index and not sentence_keys else None
        self._string_dtype = h5py.string_dtype()
        self._output = _WriteOnce(partial_path(self.path))
        self._file = h5py.File(self._output, "w")

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        key = sentence.strip() if self.sentence_keys else str(self.count)
        if self.sentence_keys and (key in ("", ".") or "/" in key):
            raise ValueError(f"line {self.count}: {key!r} cannot name an HDF5 dataset (empty, '.' or with '/'); "
                             "embed without sentence keys")
        if self.sentence_keys and key in self._file:  # a repeated line: the same vectors, written once
            for _ in parts:
                pass
        else:
            dataset, start = None, 0
            for part in parts:
                if dataset is None and part.shape[-2] == words:  # the whole sentence at once (most sentences)
                    self._file.create_dataset(key, data=np.asarray(part, dtype=np.float32))
                    break
                if dataset is None:
                    dataset = self._file.create_dataset(key, (*part.shape[:-2], words, part.shape[-1]), np.float32)
                dataset[..., start : start + part.shape[-2], :] = part
                start += part.shape[-2]
        self._output.check(self.path)
        if self.sentence_to_index is not None:
            self.sentence_to_index[sentence.strip()] = key
        self.count += 1

    def close(self) -> None:
        if self.sentence_to_index is not None:
            # ensure_ascii (the default) writes undecodable input bytes as \udcXX escapes.
            index = self._file.create_dataset("sentence_to_index", (1,), dtype=self._string_dtype)
            index[0] = json.dumps(self.sentence_to_index)
        self._file.close()
        self._output.close()
        self._output.check(self.path)
        os.replace(partial_path(self.path), self.path)

    def discard(self) -> None:
        close_and_remove(self._file, partial_path(self.path))
        self._output.close()


class _WriteOnce:
    """The file object HDF5 writes through (h5py's `fileobj` driver). HDF5 reports a failed write (a full disk, a
    file-size limit) only when it later closes an object, through h5py to stderr, and then cannot close its file; so
    a write never fails here: the first error is kept (and later writes skipped) until `check` raises it."""

    def __init__(self, path: Path):
        self._file = open(path, "w+b", buffering=0)  # unbuffered: every failed write is seen at once
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        if self.error is None:
            try:
                return self._file.write(data)
            except OSError as error:
                self.error = error
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._file.truncate(size)
            except OSError as error:
                self.error = error
        return size if size is not None else self._file.tell()

    def flush(self) -> None:
        """Nothing to flush: writes are unbuffered."""

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size)

    def readinto(self, buffer) -> int:
        return self._file.readinto(buffer)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()

    def check(self, path: Path) -> None:
        """Raise the first failed write's `OSError`, naming `path`."""
        if self.error is not None:
            raise OSError(self.error.errno, self.error.strerror, str(path))


def close_and_remove(handle: Any, path: Path) -> None:
    """Close `handle` and delete `path`, also when closing fails (e.g. flushing onto a full disk)."""
    try:
        handle.close()
    except Exception:  # any failure: the file is being thrown away, what it lacks does not matter
        pass
    finally:
        path.unlink(missing_ok=True)


class _GrowingNpy:
    """A `.npy` file grown along its first axis; the header is rewritten with the final length on `close`.

    numpy pads every header so that the first dimension can grow to 21 digits in place.
    """

    def __init__(self, path: Path, dtype: np.dtype | type, row_shape: tuple[int, ...]):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        self.rows = 0
        self._file = open(partial_path(path), "wb")
        self._write_header()
        self._data_start = self._file.tell()

    def _write_header(self) -> None:
        shape = (self.rows, *self.row_shape)
        header = {"descr": npy_format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        npy_format.write_array_header_1_0(self._file, header)

    def append(self, rows: np.ndarray) -> None:
        """Append `rows` of shape (n, *row_shape)."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"expected rows of shape (n, {', '.join(map(str, self.row_shape))}), got {rows.shape}")
        self._file.write(rows.data)
        self.rows += len(rows)

    def finish(self) -> None:
        """Write the final header and close the partial file (`commit` then moves it into place)."""
        self._file.seek(0)
        self._write_header()
        if self._file.tell() != self._data_start:
            raise RuntimeError(f"{self.path}: the final .npy header does not fit where the first one was written")
        self._file.close()

    def commit(self) -> None:
        os.replace(partial_path(self.path), self.path)

    def discard(self) -> None:
        close_and_remove(self._file, partial_path(self.path))


class NpyWriter(EmbeddingWriter):
    """All word vectors concatenated in input order, `(total_words, *token_shape)` float32 (words first: an `"all"`
    embedding `(layers, words, width)` is stored as `(words, layers, width)`), and `<stem>.offsets.npy`, int64 of
    shape `(sentences + 1,)`: sentence i is rows `offsets[i]:offsets[i + 1]`. Both are written streaming.
    """

    def __init__(self, path: str | Path, token_shape: tuple[int, ...]):
        self.path = Path(path)
        self.offsets_path = self.path.with_suffix(".offsets.npy")
        self.count = 0
        self._vectors = _GrowingNpy(self.path, np.float32, tuple(token_shape))
        self._offsets = _GrowingNpy(self.offsets_path, np.int64, ())
        self._offsets.append(np.zeros(1, dtype=np.int64))

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        try:
            for part in parts:
                self._vectors.append(np.moveaxis(part, -2, 0))
            self._offsets.append(np.array([self._vectors.rows], dtype=np.int64))
        except OSError as error:  # a write's error names no file
            raise OSError(error.errno, error.strerror, str(self.path)) from None
        self.count += 1

    def close(self) -> None:
        self._vectors.finish()
        self._offsets.finish()
        # Never a new .npy beside an old index: the old index goes first, and the new one comes last (a run killed
        # in between leaves a .npy without its .offsets.npy: an incomplete output, never a mismatched pair).
        self.offsets_path.unlink(missing_ok=True)
        self._vectors.commit()
        self._offsets.commit()

    def discard(self) -> None:
        self._vectors.discard()
        self._offsets.discard()


def check_output(path: str | Path, sentence_keys: bool = False, file_format: str | None = None) -> str:
    """The format of an output file, checked before any work: `"npy"` for a `.npy` name, else `"hdf5"` (AllenNLP's
    `elmo` layout, which `allennlp elmo` writes whatever the file is called), or the `file_format` given; sentence keys
    only in HDF5, and h5py for HDF5 (an `EmbedSettingError` naming the setting)."""
    if file_format not in (None, *FILE_FORMATS):
        raise EmbedSettingError("file_format", f"must be one of {', '.join(FILE_FORMATS)}, got {file_format!r}")
    file_format = file_format or ("npy" if Path(path).suffix.lower() == ".npy" else "hdf5")
    if file_format == "npy":
        if sentence_keys:
            raise EmbedSettingError("sentence_keys", f"sentence keys name the datasets of an HDF5 file; {path} is "
                                    ".npy")
        return "npy"
    require("h5py", "HDF5 outputs need")
    return "hdf5"


def open_writer(
    path: str | Path,
    token_shape: tuple[int, ...],
    sentence_index: bool = True,
    sentence_keys: bool = False,
    file_format: str | None = None,
) -> EmbeddingWriter:
    """The writer of `check_output`'s format: `NpyWriter` (no sentence keys) or `Hdf5Writer`."""
    if check_output(path, sentence_keys, file_format) == "npy":
        return NpyWriter(path, token_shape)
    return Hdf5Writer(path, sentence_index, sentence_keys)
