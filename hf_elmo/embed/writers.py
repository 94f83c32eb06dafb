"""Where embeddings go: HDF5 in AllenNLP's `elmo` layout (`Hdf5Writer`), a streamed `.npy` with offsets
(`NpyWriter`), or Parquet, a row per sentence (`ParquetWriter`, the layout of `parquet.py`).

Every writer holds its output's lock (`outputs.OutputLock`) from before its first byte, writes hidden partial files
beside the output, and moves them into place only once complete (`close`); on any failure (`discard`, or leaving its
`with` block with an exception) nothing of its own is left. A write that fails (a full disk, a file-size limit) is one
line naming the file (`outputs.write_error`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from ..extras import require
from .outputs import OutputLock, note_other_leftovers, partial_path, remove_leftovers, write_error
from .reading import InputError, Sentence
from .settings import EmbedSettingError, VectorLayout

# The output formats: a `.npy` name is NumPy's, `.parquet` / `.pq` Parquet's, any other HDF5 (`check_output`).
FILE_FORMATS = ("hdf5", "npy", "parquet")


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


def close_and_remove(handle: Any, path: Path) -> None:
    """Close `handle` (if any) and delete `path`, also when closing fails (e.g. flushing onto a full disk)."""
    try:
        if handle is not None:
            handle.close()
    except Exception:  # any failure: the file is being thrown away, what it lacks does not matter
        pass
    finally:
        path.unlink(missing_ok=True)


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
        super().__init__(path, [path] if self.offsets_path is None else [path, self.offsets_path])
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


class ParquetWriter(EmbeddingWriter):
    """A row per sentence in the layout of `parquet.py` (its source, line, text, words and vectors), streamed in row
    groups of at most `row_group_bytes` of vectors (and `row_group_rows` rows). `metadata`: what the file's `elmo`
    metadata records besides the layout (the model, a shard's place in its job). A sentence whose text is not valid
    UTF-8 (undecodable input bytes), which Parquet cannot hold as text, is an `InputError` naming it."""

    def __init__(self, path: str | Path, layout: VectorLayout, metadata: dict[str, Any] | None = None,
                 row_group_bytes: int = 64 << 20, row_group_rows: int = 4096):
        from . import parquet

        pa = parquet._pa()
        import pyarrow.parquet as pq

        super().__init__(path, [Path(path)])
        self.layout = layout
        self.row_group_bytes, self.row_group_rows = row_group_bytes, row_group_rows
        self._pa, self._vectors_array = pa, parquet.vectors_array
        layout_metadata = {"num_layers": layout.token_shape[0] if len(layout.token_shape) == 2 else None,
                           "width": layout.token_shape[-1], "pooled": layout.pooled, "dtype": layout.dtype}
        self.schema = parquet.schema(layout, {**layout_metadata, **(metadata or {})})
        self._rows: list[tuple[Sentence, np.ndarray]] = []
        self._buffered = 0
        self._writer = None
        try:
            self._writer = pq.ParquetWriter(partial_path(self.path), self.schema, compression="zstd")
        except BaseException:
            self.discard()
            raise

    def add_parts(self, sentence: Sentence, parts: Iterable[np.ndarray]) -> None:
        parts = list(parts)
        vectors = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-2)
        for what in (sentence.text, *sentence.words):
            try:
                what.encode("utf-8")
            except UnicodeEncodeError as error:
                raise InputError(
                    f"{sentence.source}: line {sentence.line + 1} holds bytes that are not UTF-8 (byte "
                    f"{what[error.start].encode('utf-8', 'surrogateescape')[0]:#04x}), which a Parquet output cannot "
                    "hold as text: convert the input to UTF-8, name its encoding (--encoding), or write HDF5 or .npy"
                ) from None
        self._rows.append((sentence, vectors))
        self._buffered += vectors.nbytes
        self.count += 1
        if self._buffered >= self.row_group_bytes or len(self._rows) >= self.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        pa = self._pa
        sentences = [sentence for sentence, _ in self._rows]
        columns = {
            "source": pa.array([s.source for s in sentences], pa.string()),
            "line": pa.array([s.line for s in sentences], pa.int64()),
            "text": pa.array([s.text for s in sentences], pa.string()),
            "words": pa.array([list(s.words) for s in sentences], pa.list_(pa.string())),
            "vectors": self._vectors_array([vectors for _, vectors in self._rows], self.layout),
        }
        batch = pa.RecordBatch.from_pydict(columns, schema=self.schema)
        try:
            self._writer.write_batch(batch)
        except OSError as error:
            partial = partial_path(self.path)
            raise write_error(error, self.path, partial.stat().st_size if partial.exists() else 0,
                              self._buffered) from None
        self._rows, self._buffered = [], 0

    def _close(self) -> None:
        self._flush()
        try:
            self._writer.close()
        except OSError as error:
            raise write_error(error, self.path, partial_path(self.path).stat().st_size) from None
        os.replace(partial_path(self.path), self.path)

    def _discard(self) -> None:
        close_and_remove(self._writer, partial_path(self.path))


def output_format(path: str | Path, file_format: str | None = None) -> str:
    """The format of an output file: `file_format` if given, else by its name (`FILE_FORMATS`)."""
    if file_format not in (None, *FILE_FORMATS):
        raise EmbedSettingError("file_format", f"must be one of {', '.join(FILE_FORMATS)}, got {file_format!r}")
    suffix = Path(path).suffix.lower()
    return file_format or ("npy" if suffix == ".npy" else "parquet" if suffix in (".parquet", ".pq") else "hdf5")


def output_files(path: str | Path, layout: VectorLayout | None = None, file_format: str | None = None) -> list[Path]:
    """The files an output of this name writes (the `.npy` vectors' offsets beside them, unless pooled)."""
    path = Path(path)
    if output_format(path, file_format) == "npy" and not (layout is not None and layout.pooled):
        return [path, path.with_suffix(".offsets.npy")]
    return [path]


def check_output(path: str | Path, sentence_keys: bool = False, file_format: str | None = None) -> str:
    """The format of an output file, checked before any work (`output_format`: `"npy"`, `"parquet"` or `"hdf5"`,
    AllenNLP's `elmo` layout, which `allennlp elmo` writes whatever the file is called); sentence keys only in HDF5,
    and h5py for HDF5, pyarrow for Parquet (an `EmbedSettingError` naming the setting, an `ImportError` of one
    line)."""
    file_format = output_format(path, file_format)
    if file_format != "hdf5":
        if sentence_keys:
            raise EmbedSettingError("sentence_keys", f"sentence keys name the datasets of an HDF5 file; {path} is "
                                    f".{'npy' if file_format == 'npy' else 'parquet'}")
        if file_format == "parquet":
            require("pyarrow", "Parquet outputs need")
        return file_format
    require("h5py", "HDF5 outputs need")
    return "hdf5"


def open_writer(
    path: str | Path,
    layout: VectorLayout,
    sentence_index: bool = True,
    sentence_keys: bool = False,
    file_format: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> EmbeddingWriter:
    """The writer of `check_output`'s format for `layout`'s vectors; `metadata`: what a Parquet file records."""
    chosen = check_output(path, sentence_keys, file_format)
    if chosen == "npy":
        return NpyWriter(path, layout)
    if chosen == "parquet":
        return ParquetWriter(path, layout, metadata)
    return Hdf5Writer(path, layout, sentence_index, sentence_keys)
