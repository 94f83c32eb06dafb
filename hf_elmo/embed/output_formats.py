"""The output formats of `hf_elmo.embed`, in one registry (`OUTPUT_FORMATS`) that every writer is found by: the
one-process writer (`writers.open_writer`), `--ray`'s shards and the `elmo` command ask it. A new format is a module
with its writer and one line here.

This module imports nothing but the standard library when it is loaded: `elmo` reads it without importing the
package, for its usage errors and help. Keep it so.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class OutputFormat:
    """One output format: its `name` and `title`, the file names it is chosen by (`suffixes`, lower case), its
    writer (`writer`, a `writers.EmbeddingWriter` as `module:Class`, imported when a file is written), the library
    it needs (`needs`; `extras.EXTRAS` says which extra installs it), the writer's own options (`options`: of
    `sentence_index`, `sentence_keys`, `metadata`), and what it holds: per-word and pooled vectors alike, a `source`
    per row (`several_inputs`), and whether `--ray` writes its shards in it (`shards`)."""

    name: str
    title: str
    suffixes: tuple[str, ...]
    writer: str
    needs: str | None = None
    options: tuple[str, ...] = ()
    several_inputs: bool = False
    shards: bool = False

    def writer_class(self) -> Any:
        module, name = self.writer.split(":")
        return getattr(importlib.import_module(module), name)


OUTPUT_FORMATS = {
    "hdf5": OutputFormat("hdf5", "HDF5", (".hdf5", ".h5"), "hf_elmo.embed.hdf5:Hdf5Writer", "h5py",
                         ("sentence_index", "sentence_keys")),
    "npy": OutputFormat("npy", ".npy", (".npy",), "hf_elmo.embed.npy:NpyWriter"),
    "parquet": OutputFormat("parquet", "Parquet", (".parquet", ".pq"), "hf_elmo.embed.parquet:ParquetWriter",
                            "pyarrow", ("metadata",), several_inputs=True, shards=True),
}
# The format of any other name: AllenNLP's `elmo` layout, which `allennlp elmo` writes whatever the file is called.
DEFAULT_FORMAT = "hdf5"


class FormatError(ValueError):
    """An output format that does not exist (`setting`: what named it)."""


def output_format(path: str | Path, name: str | None = None) -> OutputFormat:
    """The format of output `path`: the one named `name`, else the one its suffix chooses, else `DEFAULT_FORMAT`."""
    if name is not None:
        if name not in OUTPUT_FORMATS:
            raise FormatError(f"must be one of {', '.join(OUTPUT_FORMATS)}, got {name!r}")
        return OUTPUT_FORMATS[name]
    suffix = Path(path).suffix.lower()
    return next((f for f in OUTPUT_FORMATS.values() if suffix in f.suffixes), OUTPUT_FORMATS[DEFAULT_FORMAT])


def output_suffixes() -> tuple[str, ...]:
    """Every suffix that names an output format."""
    return tuple(suffix for f in OUTPUT_FORMATS.values() for suffix in f.suffixes)
