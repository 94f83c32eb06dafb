"""HDF5 outputs in AllenNLP's `elmo` command layout (`Hdf5Writer`): the `hdf5` entry of
`output_formats.OUTPUT_FORMATS`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..extras import require
from .outputs import partial_path, write_error
from .reading import Sentence
from .settings import VectorLayout
from .writers import EmbeddingWriter, close_and_remove


class Hdf5Writer(EmbeddingWriter):
    """AllenNLP's `elmo` command layout: one dataset per sentence named by its 0-based index, and
    `sentence_to_index`, a one-element string dataset holding JSON `{stripped line: "index"}` (a repeated line maps
    to its last index). `sentence_index=False` leaves it out and keeps memory flat on huge inputs.

    `sentence_keys=True` (AllenNLP's `--use-sentence-keys`): each dataset is named by its stripped line instead,
    without `sentence_to_index`; a repeated line is written once (its vectors are the same every time). A line
    that cannot name an HDF5 dataset (empty, `.`, or containing `/`) is an error.
    """

    def __init__(self, path: str | Path, layout: VectorLayout, sentence_index: bool = True,
                 sentence_keys: bool = False):
        h5py = require("h5py", ".hdf5 outputs need")
        super().__init__(path, [Path(path)])
        self.layout = layout
        self.sentence_keys = sentence_keys
        self.sentence_to_index: dict[str, str] | None = {} if sentence_index and not sentence_keys else None
        self._string_dtype = h5py.string_dtype()
        try:
            self._output = _WriteOnce(partial_path(self.path))
            self._file = h5py.File(self._output, "w")
        except BaseException:
            self.discard()
            raise

    def add_parts(self, sentence: Sentence, parts: Iterable[np.ndarray]) -> None:
        key = sentence.text.strip() if self.sentence_keys else str(self.count)
        if self.sentence_keys and (key in ("", ".") or "/" in key):
            raise ValueError(f"line {self.count}: {key!r} cannot name an HDF5 dataset (empty, '.' or with '/'); "
                             "embed without sentence keys")
        try:
            self._write(key, self.layout.shape(len(sentence.words)), parts)
        except Exception as error:  # HDF5's own report of a failed write hides the write's error
            self._output.check(self.path, error)
            raise
        self._output.check(self.path)
        if self.sentence_to_index is not None:
            self.sentence_to_index[sentence.text.strip()] = key
        self.count += 1

    def _write(self, key: str, shape: tuple[int, ...], parts: Iterable[np.ndarray]) -> None:
        dtype = np.dtype(self.layout.dtype)
        if self.sentence_keys and key in self._file:  # a repeated line: the same vectors, written once
            for _ in parts:
                pass
            return
        dataset, start = None, 0
        for part in parts:
            if dataset is None and part.shape == shape:  # the whole sentence at once (most sentences)
                self._file.create_dataset(key, data=np.asarray(part, dtype=dtype))
                return
            if dataset is None:
                dataset = self._file.create_dataset(key, shape, dtype)
            dataset[..., start : start + part.shape[-2], :] = part
            start += part.shape[-2]

    def _close(self) -> None:
        try:
            if self.sentence_to_index is not None:
                # ensure_ascii (the default) writes undecodable input bytes as \udcXX escapes.
                index = self._file.create_dataset("sentence_to_index", (1,), dtype=self._string_dtype)
                index[0] = json.dumps(self.sentence_to_index)
            self._file.close()
        except Exception as error:
            self._output.check(self.path, error)
            raise
        self._output.close()
        self._output.check(self.path)
        os.replace(partial_path(self.path), self.path)

    def _discard(self) -> None:
        close_and_remove(getattr(self, "_file", None), partial_path(self.path))
        if hasattr(self, "_output"):
            self._output.close()


class _WriteOnce:
    """The file object HDF5 writes through (h5py's `fileobj` driver). HDF5 reports a failed write (a full disk, a
    file-size limit) only when it later closes an object, through h5py to stderr, and then cannot close its file; so
    a write never fails here: the first error is kept (and later writes skipped) until `check` raises it."""

    def __init__(self, path: Path):
        self._file = open(path, "w+b", buffering=0)  # unbuffered: every failed write is seen at once
        self.error: OSError | None = None
        self.failed_write = 0  # the size of the write that failed
        self.end = 0  # the bytes in the file

    def write(self, data: bytes) -> int:
        if self.error is None:
            try:
                written = self._file.write(data)
                self.end = max(self.end, self._file.tell())
                return written
            except OSError as error:
                self.error, self.failed_write = error, len(data)
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

    def check(self, path: Path, cause: Exception | None = None) -> None:
        """Raise the first failed write's error (`outputs.write_error`, naming `path`), from `cause` (what HDF5 made
        of it) if given."""
        if self.error is not None:
            raise write_error(self.error, path, self.end, self.failed_write) from cause
