"""Where the sentences of `embed_file`, `elmo embed` and `elmo embed --ray` come from: one reader for text files
(gzip read compressed, whatever the name), JSON Lines and Parquet files with a text column, and stdin.

- `InputFile`, `input_files`: what INPUT names (files, glob patterns, directories of them), each with its kind.
- `read_texts`: the text of each line (or row) of an input in order, from any line on, in bounded memory.
- `count_rows`, `split_rows`, `read_span`: an input's rows counted, cut into `Span`s each known by a digest of what
  it holds, and one span read back, checked against its digest (the shards of `elmo embed --ray`).
- `Sentence`: one sentence on its way to an output: its source, line, text and words.
- `InputError`: bad input in one line: the file, the line or row, what is wrong and what to do.

Line i (0-based) of a text file is sentence i (`hf_elmo.text.read_lines`: split on `\\n` only, undecodable bytes
kept as lone surrogates in UTF-8). Line i of a JSON Lines file is an object whose text column holds sentence i; row
i of a Parquet file, its text column's value.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..extras import require
from ..text import GZIP_MAGIC, NotTextError, read_lines

# The kinds of input, by name: Parquet (`.parquet`, `.pq`), JSON Lines (`.jsonl`, `.ndjson`, also gzipped), else text.
PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
KINDS = ("text", "jsonl", "parquet")


class InputError(ValueError):
    """An input that gives no sentences as it should, in one line: the file, the line or row, what to do."""


@dataclass(frozen=True)
class Sentence:
    """One sentence on its way to an output: `source` (its input as named; `-`: stdin), its 0-based `line` (or row)
    there, its `text` and the `words` the biLM reads."""

    source: str
    line: int
    text: str
    words: Sequence[str]


@dataclass(frozen=True)
class InputFile:
    """One input: `path` as named or found (`-`: stdin) and its `kind` (`KINDS`)."""

    path: str
    kind: str

    @classmethod
    def named(cls, path: str | os.PathLike) -> InputFile:
        """The input `path`, its kind by its name; a `.json` file is refused (JSON Lines are `.jsonl`)."""
        name = Path(str(path)).name.lower().removesuffix(".gz")
        if name.endswith(PARQUET_SUFFIXES):
            return cls(str(path), "parquet")
        if name.endswith(JSONL_SUFFIXES):
            return cls(str(path), "jsonl")
        if name.endswith(".json"):
            raise InputError(f"{path}: a .json file is one JSON document, not a sentence per line: give JSON Lines "
                             "(one object per line) a .jsonl name, with the text under --text-column")
        return cls(str(path), "text")


def input_files(patterns: Sequence[str | os.PathLike]) -> list[InputFile]:
    """The inputs named by files, glob patterns and directories (every file below one, hidden ones and those whose
    name starts with `_` left out), sorted within each; fails in one line on a name that gives none."""
    import glob

    files: list[InputFile] = []
    for pattern in patterns:
        text = str(pattern)
        if text == "-":
            files.append(InputFile("-", "text"))
            continue
        path = Path(text).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and not any(
                part.startswith((".", "_")) for part in p.relative_to(path).parts))
            if not found:
                raise InputError(f"{text} is a directory without files to read")
            files.extend(InputFile.named(p) for p in found)
        elif path.is_file():
            files.append(InputFile.named(path))
        elif glob.has_magic(text):
            matches = sorted(p for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not matches:
                raise InputError(f"no file matches {text}")
            files.extend(InputFile.named(p) for p in matches)
        else:
            raise InputError(f"{text} does not exist")
    return files


def read_texts(
    source: InputFile,
    text_column: str = "text",
    encoding: str = "utf-8",
    start: int = 0,
    offset: int | None = None,
    stream: IO | None = None,
    on_bytes: Callable[[int], object] | None = None,
) -> Iterator[str]:
    """The text of every line (row) of `source` from line `start` on, in order. `offset`: the byte where line `start`
    begins in a text or JSON Lines file (`count_rows`), read from there; `stream`: the open input (stdin) to read
    instead of the file; `on_bytes` as `read_lines`'."""
    if source.kind == "parquet":
        yield from _parquet_texts(source.path, text_column, start)
        return
    if stream is not None:
        lines = read_lines(stream, on_bytes, encoding)
        lines = itertools.islice(lines, start, None)
    elif offset is not None:
        with open(source.path, "rb") as file:
            file.seek(offset)
            yield from _texts(source, read_lines(file, on_bytes, encoding, first_line=start), text_column, start)
        return
    else:
        lines = itertools.islice(read_lines(source.path, on_bytes, encoding), start, None)
    yield from _texts(source, lines, text_column, start)


def _texts(source: InputFile, lines: Iterator[str], text_column: str, start: int) -> Iterator[str]:
    if source.kind == "text":
        yield from lines
        return
    for index, line in enumerate(lines, start):
        yield _jsonl_text(source.path, index, line, text_column)


def _jsonl_text(path: str, index: int, line: str, column: str) -> str:
    """The text of line `index` (0-based) of a JSON Lines file."""
    where = f"{path}: line {index + 1}"
    if not line.strip():
        raise InputError(f"{where} is blank: a JSON Lines file holds one object per line; remove it, or give "
                         f'{{"{column}": ""}} for a sentence without words')
    try:
        row = json.loads(line)
    except ValueError as error:
        raise InputError(f"{where} is not JSON ({error}): fix or remove it") from None
    if not isinstance(row, dict) or column not in row:
        fields = ", ".join(map(str, row)) if isinstance(row, dict) else type(row).__name__
        raise InputError(f"{where} has no field {column!r} ({fields}): name the field that holds the text with "
                         "--text-column")
    return _text_value(row[column], where, column)


def _text_value(value: Any, where: str, column: str) -> str:
    if isinstance(value, str):
        return value
    what = "null" if value is None else f"a {type(value).__name__}"
    raise InputError(f"{where}: {column!r} is {what}, not text: fix the row, drop it, or name another --text-column")


def _parquet_file(path: str, text_column: str) -> Any:
    """A Parquet input, opened and checked to hold text in `text_column`."""
    pa = require("pyarrow", "Parquet outputs and inputs need")
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as error:
        size = Path(path).stat().st_size if Path(path).exists() else 0
        reason = "it is empty" if size == 0 else " ".join(str(error).split())
        raise InputError(f"{path} is not a Parquet file ({reason}): give a Parquet file, or a text file under another "
                         "name") from None
    schema = file.schema_arrow
    if text_column not in schema.names:
        raise InputError(f"{path} has no column {text_column!r} (its columns: {', '.join(schema.names)}): name the "
                         "column that holds the text with --text-column")
    kind = schema.field(text_column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{path}: column {text_column!r} holds {kind}, not text: name the column that holds the "
                         "text with --text-column")
    return file


def _parquet_texts(path: str, text_column: str, start: int) -> Iterator[str]:
    """The texts of a Parquet file's rows from `start` on."""
    for index, value in _parquet_values(path, text_column, start):
        yield _text_value(value, f"{path}: row {index}", text_column)


def _parquet_values(path: str, text_column: str, start: int) -> Iterator[tuple[int, Any]]:
    """Each row's index and value of the text column from row `start` on, a row group at a time (its row groups
    before skipped)."""
    file = _parquet_file(path, text_column)
    first = 0
    for group in range(file.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if first + rows <= start:
            first += rows
            continue
        values = file.read_row_group(group, columns=[text_column]).column(0).to_pylist()
        yield from enumerate(values[max(start - first, 0):], max(start, first))
        first += rows


def check_input(source: InputFile, text_column: str = "text") -> None:
    """Fail in one line, before any work, on an input that cannot be read as its kind (a Parquet file without the text
    column or not Parquet at all)."""
    if source.kind == "parquet":
        _parquet_file(source.path, text_column)


# -- spans: an input's rows in runs, each known by its bytes ---------------------------------------------------------

_BLOCK = 1 << 20  # bytes read at a time when an input is scanned


@dataclass(frozen=True)
class Span:
    """Rows `start` to `stop` (excluded) of an input, and what they held when the input was split: `offset` to `end`,
    their bytes in a text or JSON Lines file read as it is (None: an input read from its start, gzip, UTF-16 or
    UTF-32 text, Parquet), and `digest`, of those bytes (else of the rows' lines or texts, `_item_digest`)."""

    start: int
    stop: int
    offset: int | None
    end: int | None
    digest: str

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _bytes_are_lines(source: InputFile, encoding: str) -> bool:
    """Whether `source`'s lines are runs of its bytes ending in the byte `\\n`: a text or JSON Lines file, not gzip,
    in UTF-8 or another encoding whose line end is that byte (not UTF-16 or UTF-32)."""
    if source.kind == "parquet" or "\n".encode(encoding) != b"\n":
        return False
    with open(source.path, "rb") as file:
        return file.read(2) != GZIP_MAGIC


def count_rows(source: InputFile, text_column: str = "text", encoding: str = "utf-8") -> int:
    """The lines (rows) of `source`, counted as `read_texts` reads them (a last line without `\\n` counts)."""
    if source.kind == "parquet":
        return _parquet_file(source.path, text_column).metadata.num_rows
    if not _bytes_are_lines(source, encoding):
        return sum(1 for _ in read_lines(source.path, encoding=encoding))
    count, last = 0, b"\n"
    with open(source.path, "rb") as file:
        for block in iter(lambda: file.read(_BLOCK), b""):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def split_rows(source: InputFile, every: int, text_column: str = "text", encoding: str = "utf-8") -> list[Span]:
    """`source`'s rows in `Span`s of `every` rows (the last of what is left), each with the digest of what it holds;
    the input is read once, in bounded memory."""
    if _bytes_are_lines(source, encoding):
        return _split_bytes(source.path, every)
    spans: list[Span] = []
    digest, start, rows = hashlib.sha256(), 0, 0
    for item in _items(source, text_column, encoding):
        if rows - start == every:
            spans.append(Span(start, rows, None, None, digest.hexdigest()))
            digest, start = hashlib.sha256(), rows
        _item_digest(digest, item)
        rows += 1
    if rows > start:
        spans.append(Span(start, rows, None, None, digest.hexdigest()))
    return spans


def _split_bytes(path: str, every: int) -> list[Span]:
    """`split_rows` of a file whose lines are its bytes: each span's bytes hashed as they are read."""
    spans: list[Span] = []
    digest, start, offset, line, position, last = hashlib.sha256(), 0, 0, 0, 0, b"\n"
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(_BLOCK), b""):
            newlines = np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n"))
            hashed, ending = 0, start + every - line - 1  # the newline of this block that ends the span
            while ending < len(newlines):
                cut = int(newlines[ending]) + 1
                digest.update(block[hashed:cut])
                spans.append(Span(start, start + every, offset, position + cut, digest.hexdigest()))
                digest, start, offset, hashed = hashlib.sha256(), start + every, position + cut, cut
                ending += every
            digest.update(block[hashed:])
            line, position, last = line + len(newlines), position + len(block), block[-1:]
    rows = line + (last != b"\n")
    if rows > start:
        spans.append(Span(start, rows, offset, position, digest.hexdigest()))
    return spans


def _items(source: InputFile, text_column: str, encoding: str, start: int = 0) -> Iterator[str | None]:
    """What a span's digest covers when its bytes are not its lines: each line as decoded (gzip, UTF-16, UTF-32),
    or each row's value of the text column (Parquet: None for a null), from row `start` on."""
    if source.kind == "parquet":
        yield from (value for _, value in _parquet_values(source.path, text_column, start))
    else:
        yield from itertools.islice(read_lines(source.path, encoding=encoding), start, None)


def _item_digest(digest: Any, item: Any) -> None:
    """Add one line or value to a span's digest (its length first, so that no two sequences of items hash alike)."""
    if not isinstance(item, str):  # a null (or any value that is not text) in a Parquet column
        digest.update(b"\xff" * 8 + repr(item).encode())
        return
    data = item.encode("utf-8", "surrogatepass")
    digest.update(len(data).to_bytes(8, "little") + data)


def read_span(source: InputFile, span: Span, text_column: str = "text", encoding: str = "utf-8") -> Iterator[str]:
    """The text of each row of `span`, as `read_texts` gives it, checked against the span's digest: an input that
    no longer holds what it held when split (an edited line, lines added or removed before it) is an `InputError`
    once the span is read, never other rows taken for its own."""
    if span.offset is None:
        yield from _read_items(source, span, text_column, encoding)
        return
    with open(source.path, "rb") as file:
        file.seek(span.offset)
        reader = _HashedBytes(file, span.end - span.offset)
        lines = read_lines(io.BufferedReader(reader), encoding=encoding, first_line=span.start)
        count = 0
        try:
            for text in _texts(source, lines, text_column, span.start):
                count += 1
                yield text
        except (InputError, NotTextError):
            reader.drain()
            if reader.digest.hexdigest() != span.digest:  # what failed was not what was planned
                raise _changed(source, span) from None
            raise
    if count != span.rows or reader.left or reader.digest.hexdigest() != span.digest:
        raise _changed(source, span)


def _read_items(source: InputFile, span: Span, text_column: str, encoding: str) -> Iterator[str]:
    """`read_span` of a span whose digest covers its items (`_items`)."""
    digest, count = hashlib.sha256(), 0
    items = itertools.islice(_items(source, text_column, encoding, span.start), span.rows)
    checked = _hashed(items, digest)
    if source.kind == "parquet":
        texts = (_text_value(value, f"{source.path}: row {index}", text_column)
                 for index, value in enumerate(checked, span.start))
    else:
        texts = _texts(source, checked, text_column, span.start)
    for text in texts:
        count += 1
        yield text
    if count != span.rows or digest.hexdigest() != span.digest:
        raise _changed(source, span)


def _hashed(items: Iterator[Any], digest: Any) -> Iterator[Any]:
    for item in items:
        _item_digest(digest, item)
        yield item


def _changed(source: InputFile, span: Span) -> InputError:
    where = f"rows {span.start}-{span.stop - 1}" if source.kind == "parquet" else f"lines {span.start + 1}-{span.stop}"
    return InputError(f"{source.path} changed while the job ran: its {where} are no longer what they were when the "
                      "job was planned (nothing of them is kept): rerun the command to plan it again")


class _HashedBytes(io.RawIOBase):
    """The next `size` bytes of a binary file, hashed as they are read (`digest`); `left`: those not read yet. Named
    as the file (for the errors of what reads it)."""

    def __init__(self, file: IO[bytes], size: int):
        self.file, self.left, self.digest, self.name = file, size, hashlib.sha256(), file.name

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.file.read(min(len(buffer), self.left))
        buffer[: len(data)] = data
        self.left -= len(data)
        self.digest.update(data)
        return len(data)

    def drain(self) -> None:
        """Read (and hash) what is left."""
        while self.left and self.readinto(bytearray(min(self.left, _BLOCK))):
            pass


__all__ = ["InputError", "InputFile", "NotTextError", "Sentence", "Span", "check_input", "count_rows",
           "input_files", "read_span", "read_texts", "split_rows"]
