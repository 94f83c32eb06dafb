"""A corpus in shards: how `elmo embed --ray` cuts its inputs, writes each piece and knows, on a rerun, which pieces
are complete. Nothing here knows Ray (`ray_job.py` runs the shards on it).

- `plan_shards`: every input cut into `Shard`s of at most `shard_size` consecutive lines (rows), numbered in input
  order; a text or JSON Lines file's shards start at byte offsets found once, so no shard reads the lines before it.
- `JobIdentity`: what makes two runs the same job (the model's files, the settings that shape the vectors, how text
  is read); recorded in every shard with the shard's place (its input's size and time, its lines), so that a rerun
  keeps a shard only when all of it matches and the file is complete (`shard_complete`: its footer read, its rows
  counted).
- `write_shard`: one shard through the embedder into `part-NNNNN.parquet` (`writers.ParquetWriter`: a hidden partial
  file renamed when complete).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .files import WindowEmbedder, embed_lines
from .parquet import SCHEMA_VERSION, metadata_of
from .reading import InputError, InputFile, count_rows, read_texts
from .settings import EmbedSettings
from .writers import ParquetWriter

MANIFEST = "_elmo_embed.json"  # beside the shards; Parquet readers skip names starting with `_`


@dataclass(frozen=True)
class Shard:
    """Lines `start` to `stop` (excluded) of input `path` (of `kind`), the `index`-th shard of its job; `offset`: the
    byte where line `start` begins (None: read from the file's start); `size` and `mtime_ns`: the input's, when
    planned."""

    index: int
    path: str
    kind: str
    start: int
    stop: int
    offset: int | None
    size: int
    mtime_ns: int

    def file_name(self, shards: int) -> str:
        """`part-00003.parquet`: numbered in input order, as wide as the job's last number needs (at least 5)."""
        return f"part-{self.index:0{max(5, len(str(shards - 1)))}d}.parquet"

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def describe(self) -> str:
        return f"{self.path} lines {self.start + 1}-{self.stop}" if self.kind != "parquet" else (
            f"{self.path} rows {self.start}-{self.stop - 1}")

    def record(self) -> dict[str, Any]:
        return asdict(self)


def plan_shards(inputs: Sequence[InputFile], shard_size: int, text_column: str = "text", encoding: str = "utf-8"
                ) -> list[Shard]:
    """The shards of `inputs` in order: each input's lines (rows) in runs of `shard_size` (an empty input has
    none)."""
    shards: list[Shard] = []
    for source in inputs:
        info = os.stat(source.path)
        rows, offsets = count_rows(source, shard_size, text_column, encoding)
        for number, start in enumerate(range(0, rows, shard_size)):
            offset = offsets[number] if offsets is not None else None
            shards.append(Shard(len(shards), source.path, source.kind, start, min(start + shard_size, rows), offset,
                                info.st_size, info.st_mtime_ns))
    return shards


@dataclass(frozen=True)
class JobIdentity:
    """What makes a run the same job as an earlier one: the model (`model` as named, `model_files` its files'
    digest), the settings that shape the vectors, and how the text is read."""

    model: str
    model_files: str
    settings: dict[str, Any]
    reading: dict[str, Any]

    @classmethod
    def of(cls, model: str, location: str, settings: EmbedSettings, tokenized: bool, encoding: str,
           text_column: str) -> JobIdentity:
        shaping = {name: getattr(settings, name) for name in (
            "layers", "scalar_parameters", "gamma", "max_sentence_words", "bf16", "quantize", "pool", "dtype")}
        shaping["scalar_parameters"] = list(shaping["scalar_parameters"] or []) or None
        return cls(model, model_digest(location), shaping,
                   {"tokenized": tokenized, "encoding": encoding, "text_column": text_column})

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def shard_metadata(self, shard: Shard, shards: int) -> dict[str, Any]:
        """What shard `shard` of `shards` records in its file: the job, the settings, and its place."""
        return {"job": self.digest, "model": self.model, **self.settings, "shard": shard.record(), "shards": shards}


def model_digest(location: str) -> str:
    """A digest of a model directory's config and weights (a Hub id not downloaded here: the id itself)."""
    directory = Path(location)
    if not directory.is_dir():
        return f"hub:{location}"
    digest = hashlib.sha256()
    for name in sorted(p.name for p in directory.iterdir() if p.suffix in (".json", ".safetensors")):
        digest.update(name.encode())
        with open(directory / name, "rb") as file:
            for block in iter(lambda: file.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def shard_complete(path: Path, job: JobIdentity, shard: Shard, shards: int) -> bool:
    """Whether `path` is shard `shard` of this job, complete: a Parquet file whose footer reads, whose metadata is this
    shard's of this job (the same input, unchanged since, the same lines) and which holds as many rows as lines."""
    import pyarrow.parquet as pq

    if not path.is_file() or metadata_of(path) is None:
        return False
    expected = {"schema": SCHEMA_VERSION, **job.shard_metadata(shard, shards)}
    recorded = metadata_of(path)
    if any(recorded.get(key) != value for key, value in expected.items()):
        return False
    try:
        return pq.ParquetFile(path).metadata.num_rows == shard.rows
    except (OSError, ValueError):
        return False


def write_shard(
    embedder: WindowEmbedder,
    shard: Shard,
    shards: int,
    directory: Path,
    job: JobIdentity,
    on_line: Callable[[], object] | None = None,
    written_by: dict[str, Any] | None = None,
) -> int:
    """Embed `shard` into `directory / shard.file_name(shards)` (a partial file renamed when complete); returns its
    rows. `written_by`: who writes it (recorded beside the shard's metadata). An input that changed since the job
    was planned (other lines) is an `InputError`."""
    source = InputFile(shard.path, shard.kind)
    reading = job.reading
    texts = itertools.islice(read_texts(source, reading["text_column"], reading["encoding"], shard.start,
                                        shard.offset), shard.rows)
    metadata = {**job.shard_metadata(shard, shards), "written_by": written_by or {}}
    with ParquetWriter(directory / shard.file_name(shards), embedder.layout, metadata) as writer:
        embed_lines(embedder, texts, writer, reading["tokenized"], shard.path, shard.start, on_line=on_line)
        if writer.count != shard.rows:
            raise InputError(f"{shard.path} changed while the job ran ({shard.describe()} were planned, "
                             f"{writer.count} read): rerun the command to plan it again")
    return writer.count


def write_manifest(directory: Path, job: JobIdentity, shards: Sequence[Shard], complete: bool) -> None:
    """`_elmo_embed.json`: the job, its shards (file, input, lines) and whether all are complete."""
    manifest = {"schema": SCHEMA_VERSION, "job": job.digest, **asdict(job), "complete": complete,
                "shards": [{"file": s.file_name(len(shards)), **s.record()} for s in shards]}
    partial = directory / f".{MANIFEST}.partial"
    partial.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(partial, directory / MANIFEST)


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a job's directory, None where there is none (or it cannot be read)."""
    try:
        return json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
