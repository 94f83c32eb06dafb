"""Corpus files and the word tokenizers that split raw training text into words.

A training corpus is one or more plain-text files (optionally gzip-compressed), one sentence or paragraph per
line. The word tokenizer must be the one users' pipelines apply at inference, so its name is recorded in the
trained model's config (`config.word_tokenizer`) and card:

* `"whitespace"`: the text is already tokenized (e.g. PTB); words are separated by whitespace (`str.split`).
* `"spacy:<lang>"`, e.g. `"spacy:en"`: the tokenizer of `spacy.blank(lang)`, as the spaCy component sees
  words (whitespace tokens dropped). spaCy is a dependency of the package.
* `"elmo"`: `hf_elmo.split_words`, the raw-text mode of `ElmoCharTokenizer` (Moses-style).
"""

from __future__ import annotations

import glob
import gzip
import io
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from ..tokenization_elmo import check_word_tokenizer, spacy_split, spacy_tokenizer, split_words

# A word tokenizer splits a list of lines into a list of word lists (batched: spaCy tokenizes in batches).
WordTokenizer = Callable[[Sequence[str]], list[list[str]]]


def _whitespace(lines: Sequence[str]) -> list[list[str]]:
    return [line.split() for line in lines]


def _elmo(lines: Sequence[str]) -> list[list[str]]:
    return [split_words(line) for line in lines]


class SpacyWordTokenizer:
    """The tokenizer of `spacy.blank(lang)`; whitespace tokens are dropped, as in the spaCy ELMo component."""

    def __init__(self, lang: str):
        self.lang = lang
        spacy_tokenizer(lang)  # fails now if spaCy is missing

    def __call__(self, lines: Sequence[str]) -> list[list[str]]:
        return spacy_split(self.lang, lines)

    def __reduce__(self):  # pickled by name for DataLoader worker processes
        return SpacyWordTokenizer, (self.lang,)


def get_word_tokenizer(name: str) -> WordTokenizer:
    """The word tokenizer called `name`: `"whitespace"`, `"elmo"` or `"spacy:<lang>"` (see the module docstring)."""
    check_word_tokenizer(name)
    if name == "whitespace":
        return _whitespace
    if name == "elmo":
        return _elmo
    return SpacyWordTokenizer(name[len("spacy:") :])


def expand_files(patterns: Sequence[str]) -> list[str]:
    """Files matching the given paths or glob patterns, sorted within each pattern; fails on a pattern with none."""
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(str(Path(pattern).expanduser())))
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern}")
        files.extend(match for match in matches if Path(match).is_file())
    return files


def open_text(path: str) -> TextIO:
    """A text file (gzip-compressed if it ends with `.gz`) as UTF-8; invalid bytes become U+FFFD, never fail."""
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace", newline="\n")
    return open(path, encoding="utf-8", errors="replace", newline="\n")


def read_lines(path: str) -> Iterator[str]:
    """The lines of a corpus file without line ends (streamed)."""
    with open_text(path) as file:
        for line in file:
            yield line.rstrip("\r\n")
