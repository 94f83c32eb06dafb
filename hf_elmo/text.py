"""Raw text → words → length batches: the one home of how text reaches the biLM.

Every user of the biLM goes through these steps, in this order: the tokenizer (`ElmoCharTokenizer`),
`elmo embed` / `ElmoEmbedder`, the spaCy component's biLM layer and `elmo pretrain` / `elmo evaluate`.

1. **Lines** (`read_lines`): files or streams (gzip read compressed, known by its first bytes), UTF-8, split on
   `\\n` only, a `\\r` before it and a leading BOM dropped. Bytes that are not valid UTF-8 never fail: each
   becomes a lone surrogate U+DC80..U+DCFF (`surrogateescape`), so one line gives the same words in every command.
   What is not UTF-8 text at all (a UTF-16 or UTF-32 byte-order mark, a NUL byte) is `NotTextError`, one line
   naming the file; another encoding is read when named (`encoding=`, `elmo embed --encoding`).
2. **Words** (`split_into_words`, `get_word_tokenizer`): the word tokenizer a model was trained with, recorded in
   its `config.word_tokenizer`:
   * `"elmo"` (`split_words`): Moses-style, clitics and punctuation split off;
   * `"whitespace"`: pre-tokenized text (`str.split`);
   * `"spacy:<lang>"`, e.g. `"spacy:en"`: the tokens of `spacy.blank(lang)`'s tokenizer but whitespace ones, as
     the spaCy component feeds the biLM (spaCy is a dependency of the package, imported on first use).
3. **Windows** (`windows`): a sentence longer than the longest row a caller allows is read as consecutive windows
   of words, each from the zero state (`elmo embed`, the spaCy span getters, training).
4. **Length batches** (`length_batches`): sentences sorted longest first and grouped so that every padded batch
   (`<S>` and `</S>` rows included) stays within a budget of positions.
5. **The batch** (`ElmoBatch`, made by `ElmoCharTokenizer.batch` from the character ids of `tokenization_elmo.py`):
   character ids with a `<S>` and a `</S>` row per sentence, the mask, the lengths on the host, and what each row is
   to its caller. The biLM takes it as it is (`model(**batch)`); `batch.strip` removes the boundary rows from its
   outputs.

One of the Hub remote code's files (`hub.REMOTE_CODE`): the tokenizer imports it.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import io
import os
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any, BinaryIO

import regex
import torch

# Raw text is split Moses-style, as the released models' training text was: clitics split off
# ("don't" -> "don 't"), each punctuation mark and each CJK character alone, while dotted abbreviations
# ("U.S."), numbers with separators ("1,000.5"), hyphenated and apostrophe-free words stay whole.
_LONE_SURROGATE = regex.compile(r"[\ud800-\udfff]")
_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}"
_WORD_SPLIT_PATTERN = regex.compile(
    rf"""(?:[^\W\d_{_CJK}]\.){{2,}}          # U.S., e.g.
    |\d+(?:[.,:/]\d+)+                        # 1,000.5  12:30  1/2
    |[^\W_{_CJK}]+(?:-[^\W_{_CJK}]+)*         # words, hyphenated words, numbers
    |(?<=[^\W_])'[^\W_{_CJK}]+                # clitics after a letter: 's 't 're 'll
    |[{_CJK}]                                 # one CJK character per token
    |\X                                       # any other grapheme (punctuation, emoji, symbols)
    """,
    regex.VERBOSE,
)

# Character slots per word at most (begin/end-of-word markers included): every published model has 50; far more
# would make each batch's character ids and convolutions take gigabytes.
MAX_CHARACTERS_PER_TOKEN = 1024

# A word tokenizer splits a list of lines into a list of word lists (batched: spaCy tokenizes in batches).
WordTokenizer = Callable[[Sequence[str]], list[list[str]]]


# -- 1. lines ---------------------------------------------------------------------------------------------------


# Byte-order marks of the encodings a text file read as UTF-8 by mistake is most often in (UTF-32's first: UTF-32 LE
# starts as UTF-16 LE does).
FOREIGN_BYTE_ORDER_MARKS = {
    codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32", codecs.BOM_UTF16_LE: "UTF-16",
    codecs.BOM_UTF16_BE: "UTF-16",
}


class NotTextError(ValueError):
    """An input that is not text in the encoding it is read in (one line: the file, what is wrong, what to do)."""


def read_lines(
    source: str | os.PathLike | BinaryIO | IO[str],
    on_bytes: Callable[[int], object] | None = None,
    encoding: str = "utf-8",
    first_line: int = 0,
) -> Iterator[str]:
    """The lines of a file or of a byte or text stream, without line ends (streamed); gzip is read compressed
    (`decompressed`), a damaged one raising `NotTextError`.

    Lines end at `\\n` only (a `\\r` before it and a BOM at the start are dropped; other Unicode line breaks stay
    inside the line). In UTF-8 (the default), bytes that are not valid UTF-8 never fail: they decode to lone
    surrogates U+DC80..U+DCFF, from which `.encode("utf-8", "surrogateescape")` gives back the original bytes; a
    UTF-16 or UTF-32 byte-order mark or a NUL byte (never in UTF-8 text) raises `NotTextError`. Another `encoding`
    (a Python codec name: "utf-16", "latin-1", "cp1252", ...) is decoded strictly, a byte it cannot decode or a NUL
    character raising `NotTextError`. `on_bytes` is called with the size of every raw line (in another encoding,
    with the bytes read since the previous line: e.g. a progress bar's `update`). `first_line`: the 0-based number
    of the first line read, for a stream read from inside a file (its messages count from there; no BOM there).
    """
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as stream:
            yield from _lines(decompressed(stream), on_bytes, encoding, str(source), first_line)
        return
    name = str(getattr(source, "name", "the input")).replace("<stdin>", "stdin")
    stream = source if isinstance(source, io.TextIOBase) or first_line else decompressed(source)
    yield from _lines(stream, on_bytes, encoding, name, first_line)


GZIP_MAGIC = b"\x1f\x8b"


def decompressed(stream: BinaryIO) -> BinaryIO:
    """`stream` as text bytes: decompressed where it is gzip (its first two bytes say so, whatever its name: a
    `.gz` file, or gzip piped to stdin), else itself (buffered where it cannot peek at its start)."""
    if not hasattr(stream, "peek"):
        stream = io.BufferedReader(_Reading(stream))
    if stream.peek(2)[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=stream, mode="rb")
    return stream


def _lines(stream: BinaryIO | IO[str], on_bytes: Callable[[int], object] | None, encoding: str, name: str,
           first_line: int = 0) -> Iterator[str]:
    """`read_lines` of an open stream named `name` (for the errors)."""
    counted = None  # the bytes under a stream decoded here
    if codecs.lookup(encoding).name != "utf-8" and not isinstance(stream, io.TextIOBase):
        counted = _CountingReader(stream)
        stream = io.TextIOWrapper(io.BufferedReader(counted), encoding=encoding, errors="strict", newline="\n")
    for index, raw in enumerate(_decoding_errors(stream, encoding, name), first_line):
        if isinstance(raw, bytes):
            if index == 0 and (bom := next((b for b in FOREIGN_BYTE_ORDER_MARKS if raw.startswith(b)), None)):
                found = FOREIGN_BYTE_ORDER_MARKS[bom]
                raise NotTextError(f"{name} starts with a {found} byte-order mark: it is {found} text, not UTF-8. "
                                   f"Convert it (iconv -f {found} -t UTF-8), or name its encoding (elmo embed "
                                   f"--encoding {found.lower()})")
            line = raw.decode("utf-8", "surrogateescape")
        else:
            line = raw
        if "\x00" in line:
            raise NotTextError(
                f"{name}: line {index + 1} holds a NUL byte, which text never does (UTF-16 or UTF-32 without a "
                "byte-order mark, or not text at all?). Convert it to UTF-8, or name its encoding (elmo embed "
                "--encoding utf-16)")
        if on_bytes is not None:
            on_bytes(len(raw) if counted is None else counted.taken())
        line = line.removesuffix("\n").removesuffix("\r")
        yield line.removeprefix("\ufeff") if index == 0 else line


def _decoding_errors(stream: Iterator, encoding: str, name: str) -> Iterator:
    """The stream's lines, a byte it cannot decode as `NotTextError` naming the file and the encoding."""
    try:
        yield from stream
    except UnicodeDecodeError as error:
        raise NotTextError(f"{name} is not {encoding} text ({error.reason}): name its encoding (elmo embed "
                           "--encoding)") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise NotTextError(f"{name} is damaged gzip ({error or 'it ends too soon'}): download or compress it "
                           "again") from None


class _Reading(io.RawIOBase):
    """A binary stream read through (for a buffer to peek at its start), never closing it."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.name = getattr(stream, "name", "the input")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _CountingReader(io.RawIOBase):
    """A binary stream read through, counting its bytes (the progress of a decoded stream)."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.read_bytes, self.reported = stream, 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.stream.read(len(buffer))
        buffer[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)

    def taken(self) -> int:
        """The bytes read since the previous call."""
        taken, self.reported = self.read_bytes - self.reported, self.read_bytes
        return taken


def expand_files(patterns: Sequence[str]) -> list[str]:
    """Files matching the given paths or glob patterns, sorted within each pattern; fails on a pattern with none."""
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(str(Path(pattern).expanduser())))
        if not matches:
            raise FileNotFoundError(f"no file matches {pattern}")
        files.extend(match for match in matches if Path(match).is_file())
    return files


# -- 2. words ---------------------------------------------------------------------------------------------------


def split_words(text: str) -> list[str]:
    """Split raw text into words: whitespace first, then punctuation and clitics (see the pattern's comment)."""
    return [word for chunk in text.split() for word in _WORD_SPLIT_PATTERN.findall(chunk) if not word.isspace()]


@cache
def spacy_tokenizer(lang: str):
    """The tokenizer of `spacy.blank(lang)` (created once per language); needs spaCy, and for some languages a
    package of their own (Japanese: SudachiPy, Korean: mecab-ko, Vietnamese: pyvi): an `ImportError` of one line
    otherwise, naming it."""
    try:
        import spacy
    except ImportError:
        raise ImportError(
            f"the word tokenizer 'spacy:{lang}' needs spaCy: pip install spacy-elmo (or pass pre-tokenized words "
            "with is_split_into_words=True)"
        ) from None
    try:
        return spacy.blank(lang).tokenizer
    except ImportError as error:
        reason = " ".join(str(error).split())
        if "[E048]" in reason:  # no such language in spaCy
            raise ImportError(f"spaCy has no language {lang!r} to split text with: use its multi-language tokenizer "
                              "'xx', or pass pre-tokenized words") from None
        raise ImportError(f"spaCy's {lang!r} tokenizer needs a package that is not installed: {reason[:240]} (or pass "
                          "pre-tokenized words)") from None


def spacy_split(lang: str, texts: Sequence[str]) -> list[list[str]]:
    """Split raw texts into words with `spacy.blank(lang)`'s tokenizer: its tokens but whitespace ones (as the spaCy
    component feeds the biLM). Lone surrogates (undecodable bytes read by `read_lines`, UTF-16 debris), which spaCy
    cannot hash, are split as if they were a letter (most often they are bytes of a mangled character inside a
    word) and kept in the words: one code point each, so the offsets agree."""
    safe = [_LONE_SURROGATE.sub("\u00e6", text) for text in texts]
    return [
        [text[token.idx : token.idx + len(token)] for token in doc if not token.is_space]
        for text, doc in zip(texts, spacy_tokenizer(lang).pipe(safe))
    ]


def check_word_tokenizer(name: str | None) -> None:
    """Fail on a word tokenizer name other than `None`, `"elmo"`, `"whitespace"` or `"spacy:<lang>"`."""
    if name not in (None, "elmo", "whitespace") and not (
        isinstance(name, str) and name.startswith("spacy:") and len(name) > len("spacy:")
    ):
        raise ValueError(
            f"unknown word tokenizer {name!r}; use 'whitespace', 'elmo' or 'spacy:<lang>' (e.g. 'spacy:en')"
        )


def split_into_words(text: str, word_tokenizer: str | None) -> list[str]:
    """Split one raw text into words with the word tokenizer called `word_tokenizer` (`None` means `"elmo"`)."""
    return get_word_tokenizer(word_tokenizer)([text])[0]


def _whitespace(lines: Sequence[str]) -> list[list[str]]:
    return [line.split() for line in lines]


def _elmo(lines: Sequence[str]) -> list[list[str]]:
    return [split_words(line) for line in lines]


class SpacyWordTokenizer:
    """The tokenizer of `spacy.blank(lang)` on lists of lines (`spacy_split`); picklable by name (DataLoader
    worker processes)."""

    def __init__(self, lang: str):
        self.lang = lang
        spacy_tokenizer(lang)  # fails now if spaCy is missing

    def __call__(self, lines: Sequence[str]) -> list[list[str]]:
        return spacy_split(self.lang, lines)

    def __reduce__(self):
        return SpacyWordTokenizer, (self.lang,)


def get_word_tokenizer(name: str | None) -> WordTokenizer:
    """The word tokenizer called `name` (`None` means `"elmo"`), splitting a list of lines into word lists."""
    check_word_tokenizer(name)
    if name is None or name == "elmo":
        return _elmo
    if name == "whitespace":
        return _whitespace
    return SpacyWordTokenizer(name[len("spacy:") :])


# -- 3. windows ------------------------------------------------------------------------------------------------


def windows(n_words: int, max_words: int | None) -> list[slice]:
    """The windows of a sentence of `n_words` words: consecutive slices of at most `max_words` (`None`: one
    window); an empty sentence is one empty window."""
    step = max_words or max(n_words, 1)
    return [slice(start, min(start + step, n_words)) for start in range(0, max(n_words, 1), step)]


# -- 4. length batches ------------------------------------------------------------------------------------------


def length_batches(lengths: Sequence[int], batch_tokens: int, batch_size: int | None = None) -> list[list[int]]:
    """Group sentence indices, longest first, so that every padded batch has at most `batch_tokens` positions
    (and at most `batch_size` sentences, when given).

    A sentence of n words takes n + 2 positions (`<S>`, `</S>`); one longer than the budget is a batch of its own.
    """
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        # The first sentence of a batch is its longest, so it sets the padded width.
        if (
            batches
            and (batch_size is None or len(batches[-1]) < batch_size)
            and (len(batches[-1]) + 1) * (lengths[batches[-1][0]] + 2) <= batch_tokens
        ):
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


# -- 5. the batch -----------------------------------------------------------------------------------------------


def remove_sentence_boundaries(tensor: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop each row's first (`<S>`) and last real (`</S>`) position.

    (batch, positions, ...) and (batch, positions) right-padded mask → (batch, positions - 2, ...) with zeros at
    padding, and the words' mask (batch, positions - 2).
    """
    words_mask = mask[:, 2:].bool()
    shape = (*words_mask.shape, *([1] * (tensor.dim() - 2)))
    return tensor[:, 1:-1] * words_mask.view(shape).to(tensor.dtype), words_mask


@dataclass(frozen=True)
class ElmoBatch(Mapping):
    """Sentences as the biLM reads them: row i is `<S> w1 ... wn </S>`, padded on the right.

    A mapping of the model's inputs, so `model(**batch)` runs it: `input_ids` (batch, positions, chars) character
    ids, `attention_mask` (batch, positions) bool, and `lengths`, the positions of each row on the host (the model
    then never reads the mask back from the device, and skips sorting rows that come longest first); for a model
    with a word embedding, `word_input_ids` (batch, positions). `rows` is what each row is to its caller (a
    sentence's index and first word, a Doc's tokens, a training line's ends), kept in order and never read here.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    lengths: tuple[int, ...]
    rows: tuple[Any, ...] = ()
    word_input_ids: torch.Tensor | None = None

    @classmethod
    def from_char_ids(
        cls, input_ids: Any, lengths: Sequence[int], rows: Sequence[Any] = (), word_input_ids: Any = None
    ) -> ElmoBatch:
        """The batch of `input_ids` (batch, positions, chars) (a NumPy array or a tensor) whose row i has
        `lengths[i]` real positions (boundaries included), and its `word_input_ids` (batch, positions), if any."""
        input_ids = torch.as_tensor(input_ids)
        positions = torch.arange(input_ids.shape[1])
        attention_mask = positions < torch.tensor(list(lengths), dtype=torch.long).view(-1, 1)
        words = None if word_input_ids is None else torch.as_tensor(word_input_ids)
        return cls(input_ids, attention_mask, tuple(int(n) for n in lengths), tuple(rows), words)

    # -- the model's inputs -------------------------------------------------------------------------------------
    def keys(self) -> tuple[str, ...]:
        inputs = ("input_ids", "attention_mask", "lengths")
        return inputs if self.word_input_ids is None else (*inputs, "word_input_ids")

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    # -- what the caller reads ----------------------------------------------------------------------------------
    @property
    def word_counts(self) -> tuple[int, ...]:
        """Words per row (`<S>` and `</S>` not counted)."""
        return tuple(n - 2 for n in self.lengths)

    @property
    def words_mask(self) -> torch.Tensor:
        """(batch, positions - 2) bool: the words of each row, as `strip` leaves them."""
        return self.attention_mask[:, 2:]

    def strip(self, tensor: torch.Tensor) -> torch.Tensor:
        """An output of the biLM without the boundary rows: (batch, positions, ...) → (batch, positions - 2, ...),
        zeros at padding; position j of row i is word j of that row."""
        return remove_sentence_boundaries(tensor, self.attention_mask.to(tensor.device))[0]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ElmoBatch:
        words = self.word_input_ids
        return ElmoBatch(self.input_ids.to(device, non_blocking=non_blocking),
                         self.attention_mask.to(device, non_blocking=non_blocking), self.lengths, self.rows,
                         None if words is None else words.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> ElmoBatch:
        """The batch in page-locked memory (DataLoader's `pin_memory=True`), so `to(cuda, non_blocking=True)` is
        asynchronous."""
        words = self.word_input_ids
        return ElmoBatch(self.input_ids.pin_memory(), self.attention_mask.pin_memory(), self.lengths, self.rows,
                         None if words is None else words.pin_memory())
