"""Sentences as the biLM reads them when embedding: windows of at most `max_sentence_words` words (a longer sentence
runs in parts, each from the zero state), read ahead in chunks of a bounded number of positions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..text import windows


def sentence_index(item: tuple[Window, np.ndarray]) -> int:
    return item[0].sentence


@dataclass(frozen=True)
class Window:
    """Consecutive words of one sentence that the biLM reads as one row (a whole sentence, unless it is longer than
    `max_sentence_words`)."""

    sentence: int  # the sentence's index in the input
    words: list[str]
    sentence_words: int  # the words of the whole sentence


def sentence_windows(sentences: Iterable[Sequence[str]], window: int) -> Iterator[Window]:
    """The windows of every sentence, in order (an empty sentence is one empty window), read lazily."""
    for index, words in enumerate(sentences):
        words = list(words)
        for piece in windows(len(words), window):
            yield Window(index, words[piece], len(words))


def chunks(windows: Iterable[Window], buffer_tokens: int) -> Iterator[list[Window]]:
    """Consecutive runs of windows of at most `buffer_tokens` positions (or one longer window)."""
    chunk: list[Window] = []
    positions = 0
    for window in windows:
        if chunk and positions + len(window.words) + 2 > buffer_tokens:
            yield chunk
            chunk, positions = [], 0
        chunk.append(window)
        positions += len(window.words) + 2
    if chunk:
        yield chunk
