"""A corpus in shards: how `elmo embed --ray` cuts its inputs, writes each piece and knows, on a rerun, which pieces
are complete. Nothing here knows Ray (`ray_job.py` runs the shards on it).

- `plan_shards`: every input cut into `Shard`s of at most `shard_size` consecutive lines (rows), numbered in input
  order, each with a digest of what it holds (`reading.split_rows`: the input read once); a text or JSON Lines file's
  shards start at byte offsets found then, so no shard reads the lines before it. `default_shard_size`: how many
  lines a shard holds when the user does not say.
- `JobIdentity`: what makes two runs the same job (the model's files, the settings that shape the vectors, how text
  is read); recorded in every shard with the shard's place and digest, so that a rerun keeps a shard only when all
  of it matches what the input holds now and the file is complete (`shard_complete`: its footer read, its rows
  counted). Sizes and times of inputs decide nothing.
- `write_shard`: one shard through the embedder into `part-NNNNN.parquet` (`parquet.ParquetWriter`: a hidden partial
  file renamed when complete), its lines checked against its digest before it is renamed (`reading.read_span`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .files import WindowEmbedder, embed_lines
from .outputs import write_error
from .parquet import SCHEMA_VERSION, ParquetWriter, metadata_of
from .reading import InputFile, Span, read_span, split_rows
from .settings import EmbedSettings, Reading, VectorLayout

MANIFEST = "_elmo_embed.json"  # beside the shards; Parquet readers skip names starting with `_`


# The shards `default_shard_size` gives each worker at least, and the lines of a shard at most and at least.
SHARDS_PER_WORKER = 4
MAX_SHARD_SIZE = 10_000
MIN_SHARD_SIZE = 1000
EMPTY_FILE = "part-00000.parquet"  # the one file of a job whose inputs hold no lines


@dataclass(frozen=True)
class Shard:
    """Lines `start` to `stop` (excluded) of input `path` (of `kind`), the `index`-th shard of its job, and what they
    held when planned (`reading.Span`: `offset` to `end`, their bytes where the file is read as it is; `digest`)."""

    index: int
    path: str
    kind: str
    start: int
    stop: int
    offset: int | None
    end: int | None
    digest: str

    def file_name(self, shards: int) -> str:
        """`part-00003.parquet`: numbered in input order, as wide as the job's last number needs (at least 5)."""
        return f"part-{self.index:0{max(5, len(str(shards - 1)))}d}.parquet"

    @property
    def rows(self) -> int:
        return self.stop - self.start

    @property
    def span(self) -> Span:
        return Span(self.start, self.stop, self.offset, self.end, self.digest)

    def describe(self) -> str:
        return f"{self.path} lines {self.start + 1}-{self.stop}" if self.kind != "parquet" else (
            f"{self.path} rows {self.start}-{self.stop - 1}")

    def record(self) -> dict[str, Any]:
        return asdict(self)


def plan_shards(inputs: Sequence[InputFile], shard_size: int, reading: Reading = Reading()) -> list[Shard]:
    """The shards of `inputs` (read as `reading` says) in order: each input's lines (rows) in runs of `shard_size`
    (an empty input has none)."""
    shards: list[Shard] = []
    for source in inputs:
        for span in split_rows(source, shard_size, reading.text_column, reading.encoding):
            shards.append(Shard(len(shards), source.path, source.kind, span.start, span.stop, span.offset, span.end,
                                span.digest))
    return shards


def default_shard_size(rows: int, workers: int) -> int:
    """Lines per shard for `rows` lines on `workers` workers: `SHARDS_PER_WORKER` shards per worker or more (the
    shards left when one worker runs out of them are small against the job, so none waits long at the end), at most
    `MAX_SHARD_SIZE` lines each (what a rerun redoes of an interrupted shard), at least `MIN_SHARD_SIZE` (a shard's
    own costs, a file and a call, stay small)."""
    shards = max(math.ceil(rows / MAX_SHARD_SIZE), SHARDS_PER_WORKER * workers)
    return min(MAX_SHARD_SIZE, max(MIN_SHARD_SIZE, math.ceil(rows / shards)))


@dataclass(frozen=True)
class JobIdentity:
    """What makes a run the same job as an earlier one: the model (`model` as named, `model_files` its files'
    digest), the settings that shape the vectors (`EmbedSettings.vector_settings`), and how the text is read."""

    model: str
    model_files: str
    settings: dict[str, Any]
    reading: dict[str, Any]

    @classmethod
    def of(cls, model: str, location: str, settings: EmbedSettings, reading: Reading) -> JobIdentity:
        return cls(model, model_digest(location), settings.vector_settings(), asdict(reading))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def shard_metadata(self, shard: Shard | None) -> dict[str, Any]:
        """What shard `shard` records in its file: the job, the settings, and its place (None: the one file of a job
        without lines). Not the job's shard count: lines added to an input make more shards, the others stay."""
        return {"job": self.digest, "model": self.model, **self.settings,
                "shard": shard.record() if shard is not None else None}


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
    shard's of this job (the same lines of the same input, holding what they hold now: its digest) and which holds as
    many rows as lines."""
    import pyarrow.parquet as pq

    recorded = metadata_of(path) if path.is_file() else None
    if recorded is None:
        return False
    expected = {"schema": SCHEMA_VERSION, **job.shard_metadata(shard)}
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
    rows. `written_by`: who writes it (recorded beside the shard's metadata). An input whose lines are no longer
    what the shard was planned from is an `InputError`, and nothing of the shard is kept."""
    source = InputFile(shard.path, shard.kind)
    reading = job.reading
    texts = read_span(source, shard.span, reading["text_column"], reading["encoding"])
    metadata = {**job.shard_metadata(shard), "written_by": written_by or {}}
    with ParquetWriter(directory / shard.file_name(shards), embedder.layout, metadata) as writer:
        embed_lines(embedder, texts, writer, reading["tokenized"], shard.path, shard.start, on_line=on_line)
    return writer.count


def write_empty(directory: Path, job: JobIdentity, layout: VectorLayout) -> None:
    """The one file of a job whose inputs hold no lines: no rows, the schema of `layout`'s vectors, so that the
    output reads back as zero rows as a one-process output does."""
    with ParquetWriter(directory / EMPTY_FILE, layout, job.shard_metadata(None)):
        pass


def write_manifest(directory: Path, job: JobIdentity, shards: Sequence[Shard], shard_size: int, complete: bool
                   ) -> None:
    """`_elmo_embed.json`: the job, its shard size, its shards (file, input, lines, digest) and whether all are
    complete."""
    manifest = {"schema": SCHEMA_VERSION, "job": job.digest, **job.record(), "shard_size": shard_size,
                "complete": complete, "shards": [{"file": s.file_name(len(shards)), **s.record()} for s in shards]}
    partial = directory / f".{MANIFEST}.partial"
    text = json.dumps(manifest, indent=1)
    try:
        partial.write_text(text, encoding="utf-8")
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise write_error(error, directory / MANIFEST, 0, len(text)) from None
    os.replace(partial, directory / MANIFEST)


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a job's directory, None where there is none (or it cannot be read)."""
    try:
        return json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
