"""`embed_file_in_parts`: one output embedded by several processes (torchrun, accelerate launch), each a share of the
lines, joined by process 0 into exactly what one process writes."""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..text import read_lines
from .files import WindowEmbedder, embed_lines
from .writers import NpyWriter, close_and_remove, open_writer, partial_path


@dataclass(frozen=True)
class _Part:
    """One process's part of a shared output: vectors and offsets as `NpyWriter` writes them to `path`, and the
    text of every sentence (one JSON string per line, lone surrogates included), so that the parts can be joined
    into any output format."""

    path: Path

    @property
    def lines_path(self) -> Path:
        return self.path.with_suffix(".lines.jsonl")

    def read(self) -> Iterator[tuple[np.ndarray, str]]:
        """The part, sentence by sentence: `(embedding, text)` as they were written (memory-mapped)."""
        vectors = np.load(self.path, mmap_mode="r")
        offsets = np.load(self.path.with_suffix(".offsets.npy"))
        with open(self.lines_path, encoding="ascii") as texts:
            for start, end, text in zip(offsets[:-1], offsets[1:], texts):
                yield np.moveaxis(np.asarray(vectors[start:end]), 0, -2), json.loads(text)

    def remove(self) -> None:
        for path in (self.path, self.path.with_suffix(".offsets.npy"), self.lines_path):
            path.unlink(missing_ok=True)


class _PartWriter(NpyWriter):
    """Writes a `_Part`: an `NpyWriter` that also keeps the text of every sentence."""

    def __init__(self, part: _Part, token_shape: tuple[int, ...]):
        super().__init__(part.path, token_shape)
        self.lines_path = part.lines_path
        self._lines = open(partial_path(self.lines_path), "w", encoding="ascii")  # json.dumps escapes non-ASCII

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        super().add_parts(words, parts, sentence)
        self._lines.write(json.dumps(sentence) + "\n")

    def close(self) -> None:
        self._lines.close()
        os.replace(partial_path(self.lines_path), self.lines_path)
        super().close()

    def discard(self) -> None:
        super().discard()
        close_and_remove(self._lines, partial_path(self.lines_path))


def embed_file_in_parts(
    embedder: WindowEmbedder,
    input_file: str | Path,
    output_file: str | Path,
    rank: int,
    world_size: int,
    barrier: Callable[[], object],
    tokenized: bool = False,
    progress: bool = True,
    sentence_index: bool = True,
    sentence_keys: bool = False,
    encoding: str = "utf-8",
) -> int:
    """`embed_file` shared by `world_size` processes (e.g. started by `torchrun` or `accelerate launch`); this is
    process `rank`. Returns the line count of `input_file`.

    Each process embeds its contiguous share of the lines (shares differ by at most one line) into hidden part
    files next to `output_file`. Once `barrier()` returns in every process (all parts written), rank 0 joins the
    parts in order through the writer of `output_file`'s format, so the output has exactly the layout, keys and
    order of a one-process `embed_file` (each sentence's vectors equal, as they never depend on the batch), and
    deletes them. Every process reads `input_file` (a path, not stdin) to count its lines; the parts must be on a
    filesystem all processes see. The parts take as much disk again as the output, until the join ends.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size}")
    if hasattr(input_file, "read") or str(input_file) == "-":
        raise ValueError("embedding in several processes reads a file (each process reads it), not stdin")
    if rank == 0:  # a bad output name or format fails before any work
        open_writer(output_file, embedder.token_shape, sentence_index, sentence_keys).discard()
    total = sum(1 for _ in read_lines(input_file, encoding=encoding))  # a file that is not text fails here
    share = range(total * rank // world_size, total * (rank + 1) // world_size)
    output_file = Path(output_file)
    parts = [_Part(output_file.with_name(f".{output_file.name}.part-{r}-of-{world_size}.npy"))
             for r in range(world_size)]
    with open(input_file, "rb") as stream, _PartWriter(parts[rank], embedder.token_shape) as writer:
        lines = itertools.islice(read_lines(stream, encoding=encoding), share.start, share.stop)
        bar = tqdm(lines, total=len(share), unit="line", desc=f"embedding, process {rank}/{world_size}",
                   file=sys.stderr, disable=not progress)
        embed_lines(embedder, bar, writer, tokenized)
    barrier()
    if rank == 0:
        with open_writer(output_file, embedder.token_shape, sentence_index, sentence_keys) as joined:
            for part in parts:
                for embedding, text in part.read():
                    joined.add(embedding, text)
        for part in parts:
            part.remove()
    return total
