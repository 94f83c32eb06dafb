"""Where the sentences of `embed_file`, `elmo embed` and `elmo embed --ray` come from: one reader for text files
(gzip read compressed, whatever the name), JSON Lines and Parquet files with a text column, and stdin.

- `InputFile`, `input_files`: what INPUT names (files, glob patterns, directories of them), each with its kind.
- `read_texts`: the text of each line (or row) of an input in order, from any line on, in bounded memory.
- `count_rows`: the lines (rows) of an input and where every n-th starts (for shards).
- `Sentence`: one sentence on its way to an output: its source, line, text and words.
- `InputError`: bad input in one line: the file, the line or row, what is wrong and what to do.

Line i (0-based) of a text file is sentence i (`hf_elmo.text.read_lines`: split on `\\n` only, undecodable bytes
kept as lone surrogates in UTF-8). Line i of a JSON Lines file is an object whose text column holds sentence i; row
i of a Parquet file, its text column's value.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
    from .parquet import _pa

    pa = _pa()
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
    """The texts of a Parquet file's rows from `start` on, a row group at a time (its row groups before skipped)."""
    file = _parquet_file(path, text_column)
    first = 0
    for group in range(file.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if first + rows <= start:
            first += rows
            continue
        values = file.read_row_group(group, columns=[text_column]).column(0).to_pylist()
        for index, value in enumerate(values[max(start - first, 0):], max(start, first)):
            yield _text_value(value, f"{path}: row {index}", text_column)
        first += rows


def check_input(source: InputFile, text_column: str = "text") -> None:
    """Fail in one line, before any work, on an input that cannot be read as its kind (a Parquet file without the text
    column or not Parquet at all)."""
    if source.kind == "parquet":
        _parquet_file(source.path, text_column)


def count_rows(source: InputFile, every: int, text_column: str = "text", encoding: str = "utf-8"
               ) -> tuple[int, list[int] | None]:
    """The lines (rows) of `source`, and the byte offset where lines 0, `every`, 2 `every`, ... start in a text or
    JSON Lines file whose lines end in a `\n` byte (not gzip, nor UTF-16 or -32); None otherwise: such a file is read
    from its start."""
    if source.kind == "parquet":
        return _parquet_file(source.path, text_column).metadata.num_rows, None
    with open(source.path, "rb") as file:
        if file.read(2) == GZIP_MAGIC or "\n".encode(encoding) != b"\n":
            return sum(1 for _ in read_lines(source.path, encoding=encoding)), None
        file.seek(0)
        offsets, position, lines = [], 0, 0
        for raw in file:  # the lines as `read_lines` splits them
            if lines % every == 0:
                offsets.append(position)
            position += len(raw)
            lines += 1
        return lines, offsets


__all__ = ["InputError", "InputFile", "NotTextError", "Sentence", "check_input", "count_rows", "input_files",
           "read_texts"]
