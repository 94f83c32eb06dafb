"""`embed_file`: every line (or row) of its inputs as one sentence, embedded in bounded memory and written in order,
with a progress bar of the bytes read."""

from __future__ import annotations

import os
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Protocol

import numpy as np
from tqdm import tqdm

from ..text import GZIP_MAGIC, split_into_words
from .outputs import check_not_input
from .reading import InputError, InputFile, Sentence, check_input, input_files, read_texts
from .settings import VectorLayout
from .windows import Window
from .writers import EmbeddingWriter, check_output, open_writer, output_files


class WindowEmbedder(Protocol):
    """What the file drivers ask of an embedder (an `ElmoEmbedder`)."""

    layout: VectorLayout
    tokenizer: object

    def embedded_windows(self, sentences: Iterable[list[str]]) -> Iterator[tuple[Window, np.ndarray]]: ...

    def sentence_parts(self, windows: Iterable[tuple[Window, np.ndarray]]
                       ) -> Iterator[tuple[Window, Iterator[np.ndarray]]]: ...


def embed_file(
    embedder: WindowEmbedder,
    input_file: str | Path | IO | Sequence[str | Path],
    output_file: str | Path,
    tokenized: bool = False,
    progress: bool = True,
    sentence_index: bool = True,
    sentence_keys: bool = False,
    encoding: str = "utf-8",
    text_column: str = "text",
    metadata: dict | None = None,
) -> int:
    """Embed every line of `input_file` as one sentence into `output_file` (`.npy`, `.parquet`, else HDF5:
    `writers.check_output`); returns the sentence count.

    `input_file`: a path (a text file, gzip read compressed; a `.jsonl` or `.parquet` file with the text in
    `text_column`), `"-"` for stdin, an open binary or text file, or a list of paths, globs and directories (all
    their sentences, in order, into a Parquet output). Text is decoded as `hf_elmo.text.read_lines` says (`encoding`:
    the input's; a UTF-16/32 byte-order mark or a NUL byte in UTF-8 is `NotTextError`, and nothing is written).
    `sentence_index`, `sentence_keys`: see `Hdf5Writer`; `metadata`: what a Parquet output records (the model).

    Line i is sentence i: an empty or whitespace-only line is a sentence without words. Lines are whitespace-
    separated words with `tokenized=True` (`str.split`), else raw text split by the embedder's tokenizer's word
    tokenizer (the model's `config.word_tokenizer`; `split_words` when it records none). The output appears only
    once complete (written to a hidden `.partial` file next to it first, under a lock that refuses a second run to
    the same output); an output that is one of the inputs is refused before anything is written. The progress bar
    counts the bytes of the lines written, within a long line as its windows are written.
    """
    several = isinstance(input_file, (list, tuple))
    output_file = Path(output_file)
    file_format = check_output(output_file, sentence_keys)
    if several and file_format != "parquet":
        raise InputError(f"several inputs go into one Parquet output (a row per sentence, naming its file), not "
                         f"{output_file.name}: name it .parquet, or embed each input on its own")
    with ExitStack() as stack:
        if hasattr(input_file, "read"):
            sources, stream = [InputFile(str(getattr(input_file, "name", "-")), "text")], input_file
        elif str(input_file) == "-":
            sources, stream = [InputFile("-", "text")], sys.stdin.buffer
        else:
            sources, stream = input_files(input_file if several else [input_file]), None
        check_not_input(output_files(output_file, embedder.layout), [stream] if stream is not None else
                        [source.path for source in sources])
        for source in sources:
            check_input(source, text_column)
        bar = stack.enter_context(tqdm(
            total=None if stream is not None else _total_size(sources), unit="B", unit_scale=True,
            unit_divisor=1024, desc="embedding", file=sys.stderr, disable=not progress,
        ))
        writer = stack.enter_context(open_writer(output_file, embedder.layout, sentence_index, sentence_keys,
                                                 metadata=metadata))
        progress_bar = _LineProgress(bar)
        for source in sources:
            texts = read_texts(source, text_column, encoding, stream=stream, on_bytes=progress_bar.sizes.append)
            embed_lines(embedder, texts, writer, tokenized, source.path if stream is None else "-", 0,
                        progress_bar.part, progress_bar.line)
        return writer.count


def _total_size(sources: Sequence[InputFile]) -> int | None:
    """The bytes the bar counts: the sizes of text and JSON Lines files read as they are (not gzip, for which the
    decompressed size is unknown, nor Parquet, whose rows are not counted in bytes)."""
    total = 0
    for source in sources:
        info = os.stat(source.path)
        if source.kind == "parquet" or not stat.S_ISREG(info.st_mode):
            return None
        with open(source.path, "rb") as file:
            if file.read(2) == GZIP_MAGIC:
                return None
        total += info.st_size
    return total


class _LineProgress:
    """Advances a bar of bytes by each line's bytes as its windows are written, in whole bytes."""

    def __init__(self, bar: tqdm):
        self.bar = bar
        self.sizes: deque[int] = deque()  # the bytes of each line read and not yet written
        self.words = 0  # of the line being written, in the windows written so far
        self.counted = 0  # bytes of that line already on the bar

    def part(self, words: int, sentence_words: int) -> None:
        """`words` more words of a line of `sentence_words` words are written."""
        if not self.sizes:  # rows not read as lines (Parquet)
            return
        self.words += words
        target = self.sizes[0] * self.words // sentence_words if sentence_words else self.sizes[0]
        self.bar.update(target - self.counted)
        self.counted = target

    def line(self) -> None:
        if not self.sizes:
            self.bar.update(0)
            return
        self.bar.update(self.sizes.popleft() - self.counted)
        self.words = self.counted = 0


def embed_lines(
    embedder: WindowEmbedder,
    lines: Iterable[str],
    writer: EmbeddingWriter,
    tokenized: bool,
    source: str = "-",
    first_line: int = 0,
    on_part: Callable[[int, int], object] | None = None,
    on_line: Callable[[], object] | None = None,
) -> None:
    """Embed each line as a sentence (see `embed_file`) and write it with its text, in order, as sentence
    `first_line`, `first_line + 1`, ... of `source`; `on_part(words, sentence_words)` is called after each part of a
    sentence is written (the progress bar advances within a long line), `on_line` after each line."""
    pending: deque[Sentence] = deque()  # read but not yet written: bounded by the embedder's buffer
    split = str.split if tokenized else None

    def sentences() -> Iterator[list[str]]:
        for index, line in enumerate(lines, first_line):
            words = split(line) if split else split_into_words(line, embedder.tokenizer.word_tokenizer)
            pending.append(Sentence(source, index, line, words))
            yield words

    def parts(first: Window, vectors: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        for part in vectors:
            yield part
            if on_part is not None:
                on_part(first.sentence_words if embedder.layout.pooled else part.shape[-2], first.sentence_words)

    # Each sentence's windows go to the writer as they come: a long line is never held whole.
    for first, vectors in embedder.sentence_parts(embedder.embedded_windows(sentences())):
        writer.add_parts(pending.popleft(), parts(first, vectors))
        if on_line is not None:
            on_line()
