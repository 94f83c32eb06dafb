"""`.npy` outputs, streamed, with their offsets (`NpyWriter`): the `npy` entry of `output_formats.OUTPUT_FORMATS`."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from .outputs import partial_path, write_error
from .reading import Sentence
from .settings import VectorLayout
from .writers import EmbeddingWriter, close_and_remove


class _GrowingNpy:
    """A `.npy` file grown along its first axis; the header is rewritten with the final length on `close`.

    numpy pads every header so that the first dimension can grow to 21 digits in place.
    """

    def __init__(self, path: Path, dtype: np.dtype | type | str, row_shape: tuple[int, ...]):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        self.rows = 0
        self._file = open(partial_path(path), "wb", buffering=0)  # unbuffered: every failed write is seen at once
        self._write_header()
        self._data_start = self._file.tell()

    def _write_header(self) -> None:
        shape = (self.rows, *self.row_shape)
        header = {"descr": npy_format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        self._write(lambda: npy_format.write_array_header_1_0(self._file, header), 128)

    def _write(self, write, size: int) -> None:
        try:
            write()
        except OSError as error:
            raise write_error(error, self.path, self._file.tell(), size) from None

    def append(self, rows: np.ndarray) -> None:
        """Append `rows` of shape (n, *row_shape)."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"expected rows of shape (n, {', '.join(map(str, self.row_shape))}), got {rows.shape}")
        if rows.size:
            data = memoryview(rows.reshape(-1)).cast("B")
            self._write(lambda: _write_all(self._file, data), len(data))
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


def _write_all(file: Any, data: memoryview) -> None:
    """Write all of `data` to an unbuffered file (which may write less than asked)."""
    while data:
        written = file.write(data)
        data = data[written:]


class NpyWriter(EmbeddingWriter):
    """All word vectors concatenated in input order, `(total_words, *token_shape)` (words first: an `"all"`
    embedding `(layers, words, width)` is stored as `(words, layers, width)`), and `<stem>.offsets.npy`, int64 of
    shape `(sentences + 1,)`: sentence i is rows `offsets[i]:offsets[i + 1]`. Pooled: one row per sentence,
    `(sentences, *token_shape)`, and no offsets. Both are written streaming, in the layout's dtype.
    """

    def __init__(self, path: str | Path, layout: VectorLayout):
        path = Path(path)
        self.offsets_path = None if layout.pooled else path.with_suffix(".offsets.npy")
        super().__init__(path, self.files(path, layout))
        self.layout = layout
        self._vectors = self._offsets = None
        try:
            self._vectors = _GrowingNpy(self.path, layout.dtype, tuple(layout.token_shape))
            if self.offsets_path is not None:
                self._offsets = _GrowingNpy(self.offsets_path, np.int64, ())
                self._offsets.append(np.zeros(1, dtype=np.int64))
        except BaseException:
            self.discard()
            raise

    @classmethod
    def files(cls, path: Path, layout: VectorLayout | None = None) -> list[Path]:
        """The vectors and, unless pooled, their offsets (`<stem>.offsets.npy`)."""
        return [path] if layout is not None and layout.pooled else [path, path.with_suffix(".offsets.npy")]

    def add_parts(self, sentence: Sentence, parts: Iterable[np.ndarray]) -> None:
        for part in parts:
            self._vectors.append(part[None] if self.layout.pooled else np.moveaxis(part, -2, 0))
        if self._offsets is not None:
            self._offsets.append(np.array([self._vectors.rows], dtype=np.int64))
        self.count += 1

    def _close(self) -> None:
        self._vectors.finish()
        if self._offsets is None:
            self._vectors.commit()
            return
        self._offsets.finish()
        # Never a new .npy beside an old index: the old index goes first, and the new one comes last (a run killed
        # in between leaves a .npy without its .offsets.npy: an incomplete output, never a mismatched pair).
        self.offsets_path.unlink(missing_ok=True)
        self._vectors.commit()
        self._offsets.commit()

    def _discard(self) -> None:
        for part in (self._vectors, self._offsets):
            if part is not None:
                part.discard()
