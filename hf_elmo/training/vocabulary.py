"""The word vocabulary of the biLM's softmax (`vocab.txt`, saved beside the model).

Inputs are characters, so the vocabulary only names the softmax rows: the targets the LM predicts. As in
bilm-tf, the file has one word per line: `<S>`, `</S>`, `<UNK>` first, then the corpus words by decreasing
frequency (the sampled softmax's log-uniform sampler assumes that order). A target outside it is `<UNK>`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from tqdm.auto import tqdm
from transformers.utils import cached_file

from ..text import WordTokenizer, read_lines

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
SPECIAL_WORDS = (BOS, EOS, UNK)
VOCAB_FILE = "vocab.txt"


def _storable(word: str) -> bool:
    """Whether `word` reads back as one line of `vocab.txt`: not empty, no whitespace at its ends, no line break,
    and valid UTF-8 (no lone surrogates: the undecodable bytes `hf_elmo.text.read_lines` keeps)."""
    return bool(word) and word == word.strip() and not any(
        char in "\n\r" or "\ud800" <= char <= "\udfff" for char in word
    )


class WordVocabulary:
    """Softmax ids of words: `<S>` = 0, `</S>` = 1, `<UNK>` = 2, then the corpus words by decreasing frequency."""

    bos_id, eos_id, unk_id = 0, 1, 2

    def __init__(self, words: Sequence[str]):
        words = list(words)
        if tuple(words[:3]) != SPECIAL_WORDS:
            raise ValueError(f"a vocabulary starts with {', '.join(SPECIAL_WORDS)}; got {words[:3]}")
        if len(set(words)) != len(words):
            duplicate = next(word for word, count in Counter(words).items() if count > 1)
            raise ValueError(f"the word {duplicate!r} appears twice in the vocabulary")
        bad = next((word for word in words if not _storable(word)), None)
        if bad is not None:
            raise ValueError(
                "vocabulary words cannot be empty, have whitespace at their ends, line breaks or undecodable "
                f"bytes: {bad!r}"
            )
        self.words = words
        self._ids = {word: index for index, word in enumerate(words)}

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._ids

    def word_id(self, word: str) -> int:
        """The id of `word`; `<UNK>`'s for an unknown word."""
        return self._ids.get(word, self.unk_id)

    def encode(self, words: Sequence[str]) -> list[int]:
        """Label ids of one sentence as the biLM sees it: `<S>`, the words, `</S>` → (len(words) + 2,)."""
        return [self.bos_id, *(self._ids.get(word, self.unk_id) for word in words), self.eos_id]

    @classmethod
    def from_counts(cls, counts: Counter[str], max_size: int | None = None, min_count: int = 1) -> WordVocabulary:
        """The specials, then words seen at least `min_count` times by decreasing count (ties alphabetical),
        cut to `max_size` entries in all (specials included)."""
        if max_size is not None and max_size < len(SPECIAL_WORDS):
            raise ValueError(f"max_size must leave room for {', '.join(SPECIAL_WORDS)} (>= 3), got {max_size}")
        # A word that cannot be stored as a UTF-8 line stays out (predicted as <UNK>).
        ranked = sorted(
            (word for word, count in counts.items() if count >= min_count and word not in SPECIAL_WORDS
             and _storable(word)),
            key=lambda word: (-counts[word], word),
        )
        words = [*SPECIAL_WORDS, *ranked]
        return cls(words[:max_size] if max_size is not None else words)

    def save(self, path: str | os.PathLike) -> Path:
        """Write one word per line (UTF-8)."""
        path = Path(path)
        path.write_text("".join(f"{word}\n" for word in self.words), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> WordVocabulary:
        """Read a file of one word per line (bilm-tf's format); blank lines are ignored."""
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}): a vocabulary is one "
                             "UTF-8 word per line") from None
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as text files read lines
        return cls([line.strip() for line in lines if line.strip()])

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write `vocab.txt` into a model directory."""
        return self.save(Path(directory) / VOCAB_FILE)

    @classmethod
    def from_pretrained(cls, model: str | os.PathLike, **kwargs) -> WordVocabulary:
        """The `vocab.txt` of a model directory or Hub repo (downloaded and cached like the model files)."""
        return cls.load(cached_file(str(model), VOCAB_FILE, **kwargs))


def count_words(lines: Iterable[str], word_tokenizer: WordTokenizer, batch_lines: int = 1024) -> Counter[str]:
    """Word frequencies of streamed lines, tokenized in batches of `batch_lines`."""
    counts: Counter[str] = Counter()
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == batch_lines:
            counts.update(word for words in word_tokenizer(batch) for word in words)
            batch = []
    counts.update(word for words in word_tokenizer(batch) for word in words)
    return counts


def count_corpus_words(files: Sequence[str], word_tokenizer: WordTokenizer, progress: bool = False) -> Counter[str]:
    """Word frequencies of every line of `files` (streamed); `progress` shows a bar of lines per file on stderr."""
    counts: Counter[str] = Counter()
    for path in files:
        lines = tqdm(read_lines(path), desc=f"counting {Path(path).name}", unit=" lines", disable=not progress)
        counts.update(count_words(lines, word_tokenizer))
    return counts


def build_vocabulary(
    files: Sequence[str],
    word_tokenizer: WordTokenizer,
    max_size: int | None = None,
    min_count: int = 1,
    progress: bool = False,
) -> WordVocabulary:
    """The vocabulary of the words of `files` (see `WordVocabulary.from_counts`; `progress` as in
    `count_corpus_words`)."""
    counts = count_corpus_words(files, word_tokenizer, progress)
    return WordVocabulary.from_counts(counts, max_size=max_size, min_count=min_count)
