"""`embed_file`: every line of a text file as one sentence, embedded in bounded memory and written in order, with a
progress bar of the bytes written."""

from __future__ import annotations

import itertools
import os
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, BinaryIO, Protocol

import numpy as np
from tqdm import tqdm

from ..text import read_lines, split_into_words
from .windows import Window, sentence_index
from .writers import EmbeddingWriter, open_writer


class WindowEmbedder(Protocol):
    """What the file drivers ask of an embedder (an `ElmoEmbedder`)."""

    token_shape: tuple[int, ...]
    tokenizer: object

    def embedded_windows(self, sentences: Iterable[list[str]]) -> Iterator[tuple[Window, np.ndarray]]: ...


def embed_file(
    embedder: WindowEmbedder,
    input_file: str | Path | IO,
    output_file: str | Path,
    tokenized: bool = False,
    progress: bool = True,
    sentence_index: bool = True,
    sentence_keys: bool = False,
    encoding: str = "utf-8",
    file_format: str | None = None,
) -> int:
    """Embed every line of `input_file` (a path, `"-"` for stdin, or an open binary or text file) as one sentence
    into `output_file`, NumPy's `.npy` for such a name, else HDF5 (or `file_format`: `check_output`); returns the
    line count. `sentence_index`, `sentence_keys`: see `Hdf5Writer`; `encoding`: the
    input's (`hf_elmo.text.read_lines`: in UTF-8 undecodable bytes are kept, a UTF-16/32 byte-order mark or a NUL
    byte is `NotTextError`, and nothing is written).

    Line i is sentence i: an empty or whitespace-only line is a sentence without words. Lines are whitespace-
    separated words with `tokenized=True` (`str.split`), else raw text split by the embedder's tokenizer's word
    tokenizer (the model's `config.word_tokenizer`; `split_words` when it records none). The output appears
    only once complete (it is written to a hidden `.partial` file next to it first). The progress bar counts the
    bytes of the lines written, within a long line as its windows are written.
    """
    with ExitStack() as stack:
        if hasattr(input_file, "read"):
            stream = input_file
        else:
            stream = sys.stdin.buffer if str(input_file) == "-" else stack.enter_context(open(input_file, "rb"))
        bar = stack.enter_context(tqdm(
            total=_regular_file_size(stream), unit="B", unit_scale=True, unit_divisor=1024, desc="embedding",
            file=sys.stderr, disable=not progress,
        ))
        writer = stack.enter_context(open_writer(output_file, embedder.token_shape, sentence_index, sentence_keys,
                                                 file_format))
        progress_bar = _LineProgress(bar)
        embed_lines(embedder, read_lines(stream, progress_bar.sizes.append, encoding), writer, tokenized,
                     progress_bar.window, progress_bar.line)
        return writer.count


class _LineProgress:
    """Advances a bar of bytes by each line's bytes as its windows are written, in whole bytes."""

    def __init__(self, bar: tqdm):
        self.bar = bar
        self.sizes: deque[int] = deque()  # the bytes of each line read and not yet written
        self.words = 0  # of the line being written, in the windows written so far
        self.counted = 0  # bytes of that line already on the bar

    def window(self, window: Window) -> None:
        self.words += len(window.words)
        target = self.sizes[0] * self.words // window.sentence_words if window.sentence_words else self.sizes[0]
        self.bar.update(target - self.counted)
        self.counted = target

    def line(self) -> None:
        self.bar.update(self.sizes.popleft() - self.counted)
        self.words = self.counted = 0


def embed_lines(
    embedder: WindowEmbedder,
    lines: Iterable[str],
    writer: EmbeddingWriter,
    tokenized: bool,
    on_window: Callable[[Window], object] | None = None,
    on_line: Callable[[], object] | None = None,
) -> None:
    """Embed each line as a sentence (see `embed_file`) and write it with its text, in order; `on_window` is
    called after each window is written (the progress bar advances within a long line), `on_line` after each
    line."""
    pending: deque[str] = deque()  # read but not yet written: bounded by the embedder's buffer

    def sentences() -> Iterator[list[str]]:
        for line in lines:
            pending.append(line)
            yield line.split() if tokenized else split_into_words(line, embedder.tokenizer.word_tokenizer)

    def parts(windows: Iterable[tuple[Window, np.ndarray]]) -> Iterator[np.ndarray]:
        for window, part in windows:
            yield part
            if on_window is not None:
                on_window(window)

    # Each sentence's windows go to the writer as they come: a long line is never held whole.
    for _, embedded in itertools.groupby(embedder.embedded_windows(sentences()), key=sentence_index):
        first = next(embedded)
        rest = itertools.chain([first], embedded)  # noqa: B031 (the rest, after next())
        writer.add_parts(first[0].sentence_words, parts(rest), pending.popleft())
        if on_line is not None:
            on_line()


def _regular_file_size(stream: BinaryIO) -> int | None:
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):  # in-memory streams have no file descriptor
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
