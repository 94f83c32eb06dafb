"""Embeddings as Parquet, one row per sentence, in plain Arrow types that Parquet readers read without this package
or Ray (tested: pyarrow, pandas, polars, DuckDB, and Spark but for float16, Parquet's FLOAT16 having no Spark type):
what `elmo embed ... out.parquet` writes (`ParquetWriter`: the `parquet` entry of `output_formats.OUTPUT_FORMATS`), and
each shard of `elmo embed --ray`.

Columns:
- `source` (string): the input file, as named or as found in a directory or glob (`-`: stdin);
- `line` (int64): the sentence's 0-based line (a text or JSONL file) or row (a Parquet file) in it;
- `text` (string): the line, or the value of the text column;
- `words` (list<string>): its words, as the biLM read them;
- `vectors`: its vectors as nested lists, in the shape `ElmoEmbedder` gives, the last axis (and with `--layers all`
  the first) of fixed size: (layers, words, width) `fixed_size_list<list<fixed_size_list<float, width>>, layers>`;
  (words, width) `list<fixed_size_list<float, width>>`; with `--pool`, (layers, width) or (width,) fixed-size lists.
  float32 (`float`), or `halffloat` with `--dtype float16`.

The file's key-value metadata `elmo` holds JSON: `schema` (`SCHEMA_VERSION`), the settings that shape the vectors
(`layers`, `pool`, `dtype`, `width`, `num_layers`), the model, and for a shard of a job its place in the job.
`read_vectors` gives the vectors back as NumPy arrays (a view of Arrow's buffers per row, no loop over values).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..extras import require
from .outputs import partial_path, write_error
from .reading import InputError, Sentence
from .settings import VectorLayout
from .writers import EmbeddingWriter, close_and_remove

SCHEMA_VERSION = 1
METADATA_KEY = b"elmo"


def _pa():
    return require("pyarrow", "Parquet outputs and inputs need")


def vectors_type(layout: VectorLayout) -> Any:
    """The Arrow type of a sentence's `vectors` (see the module docstring)."""
    pa = _pa()
    value = pa.float16() if layout.dtype == "float16" else pa.float32()
    vector = pa.list_(value, layout.token_shape[-1])  # (width,)
    per_layer = vector if layout.pooled else pa.list_(vector)  # (width,) or (words, width)
    return pa.list_(per_layer, layout.token_shape[0]) if len(layout.token_shape) == 2 else per_layer


def schema(layout: VectorLayout, metadata: dict[str, Any]) -> Any:
    """The schema of a file of `layout`'s vectors, `metadata` under the `elmo` key."""
    pa = _pa()
    fields = [("source", pa.string()), ("line", pa.int64()), ("text", pa.string()), ("words", pa.list_(pa.string())),
              ("vectors", vectors_type(layout))]
    return pa.schema(fields, metadata={METADATA_KEY: json.dumps({"schema": SCHEMA_VERSION, **metadata})})


def vectors_array(arrays: Sequence[np.ndarray], layout: VectorLayout) -> Any:
    """Sentences' vectors (each in `layout`'s shape: (layers, words, width), ..., (width,)) as one Arrow array of
    `vectors_type(layout)`: their values concatenated once, the list offsets computed from their shapes."""
    pa = _pa()
    value_type = pa.float16() if layout.dtype == "float16" else pa.float32()
    width = layout.token_shape[-1]
    dtype = np.dtype(layout.dtype)
    flat = np.concatenate([np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays]) if arrays else (
        np.zeros(0, dtype))
    array = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=value_type), width)
    if not layout.pooled:  # the words: one list per sentence (per sentence and layer with all layers)
        layers = layout.token_shape[0] if len(layout.token_shape) == 2 else 1
        counts = np.repeat([a.shape[-2] for a in arrays], layers)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        array = pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), array)
    if len(layout.token_shape) == 2:
        array = pa.FixedSizeListArray.from_arrays(array, layout.token_shape[0])
    return array


def read_vectors(source: str | os.PathLike | Any, row: int | None = None) -> list[np.ndarray] | np.ndarray:
    """The vectors of a Parquet output (a file, or a directory of shards read in order) or of an Arrow table read from
    one: a NumPy array per row, of shape (layers, words, width), (words, width), (layers, width) or (width,) as
    written (read-only views of Arrow's buffers where no copy is needed); `row` given: that row's array alone."""
    pa = _pa()
    if not isinstance(source, (pa.Table, pa.RecordBatch)):
        import pyarrow.parquet as pq

        source = pq.read_table(source, columns=["vectors"])
    column = source.column("vectors")
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if row is not None:
        if not 0 <= row < len(column):
            raise IndexError(f"row {row} of {len(column)}")
        for chunk in chunks:
            if row < len(chunk):
                return _rows(chunk.slice(row, 1))[0]
            row -= len(chunk)
    return [array for chunk in chunks for array in _rows(chunk)]


def _rows(array: Any) -> list[np.ndarray]:
    """One Arrow array of `vectors` → a NumPy array per row."""
    pa = _pa()
    layers = array.type.list_size if pa.types.is_fixed_size_list(array.type) and _nested(array.type.value_type) else 0
    per_layer = array.flatten() if layers else array  # (rows * layers) lists of words, or fixed (width,) vectors
    words = pa.types.is_list(per_layer.type)
    vectors = per_layer.flatten() if words else per_layer  # fixed-size (width,) vectors
    width = vectors.type.list_size
    values = vectors.flatten().to_numpy(zero_copy_only=False).reshape(-1, width)
    rows = len(array)
    if not words:  # pooled: (rows, [layers,] width)
        shape = (rows, layers, width) if layers else (rows, width)
        return list(values.reshape(shape))
    offsets = per_layer.offsets.to_numpy()
    offsets = offsets - offsets[0]
    group = max(layers, 1)
    result = []
    for r in range(rows):
        start, end = offsets[r * group], offsets[(r + 1) * group]
        block = values[start:end]
        result.append(block.reshape(layers, (end - start) // layers, width) if layers else block)
    return result


def _nested(value_type: Any) -> bool:
    """Whether a fixed-size list's value type is itself a list (the layers axis) rather than float values."""
    pa = _pa()
    return pa.types.is_list(value_type) or pa.types.is_fixed_size_list(value_type)


def metadata_of(path: str | os.PathLike) -> dict[str, Any] | None:
    """The `elmo` metadata of a Parquet file, None where it has none or is no readable Parquet file."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.read_schema(Path(path)).metadata or {}
    except (OSError, ValueError):
        return None
    try:
        return json.loads(metadata[METADATA_KEY]) if METADATA_KEY in metadata else None
    except ValueError:
        return None


class ParquetWriter(EmbeddingWriter):
    """A row per sentence in the layout of `parquet.py` (its source, line, text, words and vectors), streamed in row
    groups of at most `row_group_bytes` of vectors (and `row_group_rows` rows). `metadata`: what the file's `elmo`
    metadata records besides the layout (the model, a shard's place in its job). A sentence whose text is not valid
    UTF-8 (undecodable input bytes), which Parquet cannot hold as text, is an `InputError` naming it."""

    def __init__(self, path: str | Path, layout: VectorLayout, metadata: dict[str, Any] | None = None,
                 row_group_bytes: int = 64 << 20, row_group_rows: int = 4096):
        pa = _pa()
        import pyarrow.parquet as pq

        super().__init__(path, [Path(path)])
        self.layout = layout
        self.row_group_bytes, self.row_group_rows = row_group_bytes, row_group_rows
        self._pa, self._vectors_array = pa, vectors_array
        layout_metadata = {"num_layers": layout.token_shape[0] if len(layout.token_shape) == 2 else None,
                           "width": layout.token_shape[-1], "pooled": layout.pooled, "dtype": layout.dtype}
        self.schema = schema(layout, {**layout_metadata, **(metadata or {})})
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
