"""`ElmoBatchEmbedder`: the callable that data engines map over a corpus in batches (Ray Data's `map_batches`, Hugging
Face datasets' `map(batched=True)`), one model load per worker process.

    import ray
    from hf_elmo.embed import ElmoBatchEmbedder

    ds = ray.data.read_parquet("corpus/")  # a "text" column
    ds = ds.map_batches(ElmoBatchEmbedder, fn_constructor_kwargs={"model": "default", "pool": "mean"},
                        batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=4), num_cpus=2)
    ds.write_parquet("vectors/")

    from datasets import load_dataset
    ds = load_dataset("text", data_files="corpus.txt")["train"]
    ds = ds.map(ElmoBatchEmbedder("default", pool="mean"), batched=True, batch_size=256)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..runtime import assigned_resources, set_threads
from ..text import split_into_words
from .embedder import ElmoEmbedder
from .settings import EmbedSettings


class ElmoBatchEmbedder:
    """A batch of sentences → the same batch with their words and vectors added, for data engines.

    The batch is a pyarrow Table (or RecordBatch), a pandas DataFrame or a dict of columns (NumPy arrays or lists,
    as Ray's `"numpy"` batches and datasets' batches are) with the text in `text_column`; the result has the same
    type and rows, with `words_column` (each row's words) and `vectors_column` (its vectors, in the shape
    `ElmoEmbedder` gives: (layers, words, width), ..., with `pool` (width,)) added. A pyarrow batch gets the vectors
    as plain nested lists (the Parquet layout of `parquet.py`, which `write_parquet` writes as it is); a dict, NumPy
    arrays (stacked where they share a shape, as pooled vectors do); a DataFrame, one array per row.

    Args:
        model: what `ElmoEmbedder` takes: `"default"`, a published model, a directory or a Hub id; loaded once, when
            the callable is made (in each worker: Ray makes it there from `fn_constructor_kwargs`; pickled, it
            travels as these arguments and loads again where it lands).
        text_column: the column holding each row's text.
        tokenized: the text is words separated by whitespace (`str.split`), or the column holds lists of words;
            else raw text split by the model's word tokenizer, as `elmo embed` splits a line.
        words_column, vectors_column: the names of the columns added.
        threads: torch's CPU threads; default: the CPUs the engine gave the worker (Ray's `num_cpus`), else as
            `elmo embed` (`runtime.set_threads`).
        device: default: the GPU the engine gave the worker (Ray's `num_gpus`), else the CPU.
        **settings: the other `EmbedSettings` (`layers`, `pool`, `dtype`, `batch_tokens`, `bf16`, `quantize`, ...).

    Every row's vectors are what `elmo embed` writes for its line with the same settings: equal within float32's
    batch rounding (docs/performance.md; the same bytes for the same batches), whatever the batch, worker or
    node it lands on.
    """

    def __init__(
        self,
        model: str | os.PathLike = "default",
        text_column: str = "text",
        tokenized: bool = False,
        words_column: str = "words",
        vectors_column: str = "vectors",
        threads: int | None = None,
        device: str | None = None,
        **settings: Any,
    ):
        self._arguments = dict(model=model, text_column=text_column, tokenized=tokenized, words_column=words_column,
                               vectors_column=vectors_column, threads=threads, device=device, **settings)
        self.embedder = worker_embedder(model, EmbedSettings(device=device, **settings), threads)
        self.settings = self.embedder.settings
        self.text_column, self.tokenized = text_column, tokenized
        self.words_column, self.vectors_column = words_column, vectors_column

    def __reduce__(self) -> tuple:
        """Pickled as its arguments: the model loads again where it is unpickled (a datasets worker process)."""
        return _rebuilt, (self._arguments,)

    def __call__(self, batch: Any) -> Any:
        texts = _column(batch, self.text_column)
        words = [self._words(text) for text in texts]
        vectors = list(self.embedder.embed_sentences(words))
        return _with_columns(batch, {self.words_column: words, self.vectors_column: vectors}, self.embedder)

    def _words(self, text: Any) -> list[str]:
        if not isinstance(text, str):
            if self.tokenized and isinstance(text, (list, tuple, np.ndarray)):
                return [str(word) for word in text]
            raise TypeError(f"{self.text_column!r} holds {type(text).__name__}, not text")
        return text.split() if self.tokenized else split_into_words(text, self.embedder.tokenizer.word_tokenizer)


def worker_embedder(model: str | os.PathLike, settings: EmbedSettings, threads: int | None = None) -> ElmoEmbedder:
    """An `ElmoEmbedder` of `model` on what a data engine gave this worker process: torch's threads its CPUs (Ray's
    `num_cpus`; `threads` given: those; else as `elmo embed`), the GPU it gave (Ray's `num_gpus`) unless
    `settings.device` names a device, else the CPU."""
    cpus, gpus = assigned_resources()
    set_threads(threads if threads is not None else max(1, round(cpus)) if cpus else None)
    if settings.device is None:
        settings = dataclasses.replace(settings, device="cuda" if gpus else "cpu")
    return ElmoEmbedder(model, settings=settings)


def _rebuilt(arguments: dict[str, Any]) -> ElmoBatchEmbedder:
    return ElmoBatchEmbedder(**arguments)


def _column(batch: Any, name: str) -> list[Any]:
    """A column of a batch of any of the three kinds, as a list."""
    if isinstance(batch, Mapping):
        if name not in batch:
            raise KeyError(f"the batch has no column {name!r} ({', '.join(map(str, batch))}): name the text column "
                           "with text_column=")
        values = batch[name]
        return values.tolist() if isinstance(values, np.ndarray) else list(values)
    names = list(batch.column_names) if hasattr(batch, "column_names") else list(batch.columns)
    if name not in names:
        raise KeyError(f"the batch has no column {name!r} ({', '.join(map(str, names))}): name the text column with "
                       "text_column=")
    if hasattr(batch, "column_names"):  # pyarrow
        return batch.column(name).to_pylist()
    return batch[name].tolist()


def _with_columns(batch: Any, columns: dict[str, list], embedder: ElmoEmbedder) -> Any:
    """The batch with the words and vectors columns added, in the batch's own kind."""
    words_name, vectors_name = columns
    words, vectors = columns.values()
    if isinstance(batch, Mapping):
        array_batch = any(isinstance(values, np.ndarray) for values in batch.values())
        result = dict(batch)
        result[words_name] = _objects(words) if array_batch else words
        same_shape = vectors and all(v.shape == vectors[0].shape for v in vectors)
        result[vectors_name] = (np.stack(vectors) if same_shape else _objects(vectors)) if array_batch else vectors
        return result
    if hasattr(batch, "column_names"):  # a pyarrow Table or RecordBatch
        from .parquet import _pa, vectors_array

        pa = _pa()
        arrays = {words_name: pa.array(words, pa.list_(pa.string())),
                  vectors_name: vectors_array(vectors, embedder.layout)}
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        for name, array in arrays.items():
            table = table.append_column(name, array)
        return table if isinstance(batch, pa.Table) else table.to_batches()[0] if len(table) else (
            pa.RecordBatch.from_pylist([], schema=table.schema))
    result = batch.copy()  # pandas
    result[words_name] = words
    result[vectors_name] = vectors
    return result


def _objects(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of `values` (NumPy would try to stack them)."""
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array
