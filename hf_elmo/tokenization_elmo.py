"""Character tokenizer of ELMo: words → (words, max_characters_per_token) character ids.

Two character vocabularies (`ElmoConfig.character_vocabulary`):

- bytes: exactly the ids of AllenNLP's `ELMoCharacterMapper` and bilm-tf's `Batcher`: a word is its UTF-8 bytes
  between begin-of-word and end-of-word markers, filled with a padding character;
- lexicon (ELMoForManyLangs' models): a word is its characters looked up in the model's character table (`<oov>`
  for one it lacks), cut to `max_characters_per_token - 2` characters, between its `<bow>` and `<eow>` entries,
  filled with `<pad>`; the sentence boundaries are the words `<bos>` and `<eos>`, each one table entry; and the
  word itself is looked up in the model's word table (`word_input_ids`).

Every id is shifted by +1 so that an all-zero row (word id 0) means "no token here" (a padding position).
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from transformers import BatchEncoding, PreTrainedTokenizer
from transformers.utils import PaddingStrategy, TensorType

from .text import MAX_CHARACTERS_PER_TOKEN, ElmoBatch, check_word_tokenizer, split_into_words

# Raw character ids (training id space); the encoded ids are these + 1.
BEGIN_OF_SENTENCE_CHAR = 256
END_OF_SENTENCE_CHAR = 257
BEGIN_OF_WORD_CHAR = 258
END_OF_WORD_CHAR = 259
PADDING_CHAR = 260

# Shared int objects for the ids (CPython caches only ints up to 256), so cached rows stay small.
_ID_OBJECTS = tuple(range(PADDING_CHAR + 2))


def _word_char_ids(word: str, bos: str, eos: str, max_characters_per_token: int) -> tuple[int, ...]:
    """The ids of one word (+1 scheme); the words `bos` and `eos` give the sentence-boundary rows."""
    if word == bos:
        return _char_ids((BEGIN_OF_SENTENCE_CHAR,), max_characters_per_token)
    if word == eos:
        return _char_ids((END_OF_SENTENCE_CHAR,), max_characters_per_token)
    # "surrogatepass" keeps lone surrogates (UTF-16 debris) as bytes instead of dropping them.
    return _char_ids(word.encode("utf-8", "surrogatepass")[: max_characters_per_token - 2], max_characters_per_token)


@lru_cache(maxsize=1 << 16)
def _char_ids(chars: bytes | tuple[int, ...], max_characters_per_token: int) -> tuple[int, ...]:
    """The +1-shifted ids of one word's raw characters (at most `max_characters_per_token - 2` of them)."""
    ids = [BEGIN_OF_WORD_CHAR, *chars, END_OF_WORD_CHAR]
    ids += [PADDING_CHAR] * (max_characters_per_token - len(ids))
    return tuple(_ID_OBJECTS[i + 1] for i in ids)


class Lexicon:
    """ELMoForManyLangs' tables of a model (`char.dic` / `word.dic` as its reader builds them: entry → id), looked
    up a whole batch at a time: characters through a dense table indexed by code point, words through the dict's
    lookup mapped over the batch in C; the ids shifted by +1 (0: a padding position)."""

    MARKERS = ("<bow>", "<eow>", "<oov>", "<pad>", "<bos>", "<eos>")

    def __init__(self, entries: Mapping[str, int], characters: bool):
        self.entries = {str(key): int(value) for key, value in entries.items()}
        needed = self.MARKERS if characters else ("<oov>", "<pad>")
        missing = [marker for marker in needed if marker not in self.entries]
        if missing:
            kind = "character" if characters else "word"
            raise ValueError(f"the {kind} lexicon lacks {', '.join(missing)}: not an ELMoForManyLangs lexicon")
        self.oov = self.entries["<oov>"] + 1
        self.size = max(self.entries.values()) + 2  # the table's rows, the padding row 0 included
        self._entry_by_id: dict[int, str] | None = None
        if characters:
            singles = {ord(key): value + 1 for key, value in self.entries.items() if len(key) == 1}
            self._by_code_point = np.full(max(singles, default=0) + 2, self.oov, dtype=np.int64)
            self._by_code_point[list(singles)] = list(singles.values())

    def characters(self, code_points: np.ndarray) -> np.ndarray:
        """(n,) code points → (n,) ids."""
        table = self._by_code_point
        return table[np.minimum(code_points, len(table) - 1)]

    def words(self, words: Sequence[str]) -> np.ndarray:
        """(n,) words → (n,) ids."""
        ids = np.fromiter(map(self.entries.get, words, itertools.repeat(self.oov - 1)), dtype=np.int64,
                          count=len(words))
        return ids + 1

    def __getitem__(self, entry: str) -> int:
        return self.entries[entry] + 1

    def text(self, entry_id: int) -> str | None:
        """The entry of an id (+1 scheme), None for 0."""
        if self._entry_by_id is None:
            self._entry_by_id = {value + 1: key for key, value in self.entries.items()}
        return self._entry_by_id.get(entry_id)


def _read_lexicon(path: str | os.PathLike) -> dict[str, int]:
    """A lexicon file as `save_vocabulary` writes it: a JSON object of entry → id."""
    try:
        with open(path, encoding="utf-8") as file:
            entries = json.load(file)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable lexicon ({error})") from None
    if not isinstance(entries, dict) or not all(isinstance(i, int) and i >= 0 for i in entries.values()):
        raise ValueError(f"{path}: a lexicon is a JSON object of entry -> id (an integer >= 0)")
    return entries


def _lexicon_rows(words: Sequence[str], chars: Lexicon, max_characters_per_token: int) -> tuple[np.ndarray, list]:
    """ELMoForManyLangs' character rows of `words` (n, max_characters_per_token), and the words as its reader looks
    them up (cut to `max_characters_per_token - 2` characters). Its reader gives the first slot `<eow>`'s id and the
    end-of-word slot `<bow>`'s (it unpacks them swapped): so do these. The words `<bos>` and `<eos>` are their
    one-entry rows."""
    width = max_characters_per_token - 2
    n = len(words)
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=n)
    cut = [int(i) for i in np.flatnonzero(lengths > width)]
    words = list(words)
    for i in cut:  # only the words longer than the slots
        words[i] = words[i][:width]
    kept = np.minimum(lengths, width)
    code_points = np.frombuffer("".join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    starts = np.cumsum(kept) - kept
    word = np.repeat(np.arange(n), kept)
    position = np.arange(len(code_points)) - np.repeat(starts, kept)
    rows = np.full((n, max_characters_per_token), chars["<pad>"], dtype=np.int64)
    rows[:, 0] = chars["<eow>"]
    rows[word, position + 1] = chars.characters(code_points.astype(np.int64))
    rows[np.arange(n), kept + 1] = chars["<bow>"]
    for marker in ("<bos>", "<eos>"):
        found = np.flatnonzero(np.fromiter(map(marker.__eq__, words), dtype=bool, count=n))
        rows[found, 1:] = chars["<pad>"]
        rows[found, 1], rows[found, 2] = chars[marker], chars["<bow>"]
    return rows, words


class ElmoCharTokenizer(PreTrainedTokenizer):
    r"""
    ELMo character tokenizer. Returns `input_ids` of shape `(batch, words, max_characters_per_token)` and an
    `attention_mask` of shape `(batch, words)`; with `add_special_tokens=True` (default) every sentence gets a
    `<S>` row before its first word and a `</S>` row after its last word, as the biLM expects.

    Input is raw text, split into words by the model's word tokenizer (`word_tokenizer`; by default `split_words`:
    Moses-style, clitics and punctuation split off), or pre-tokenized words with `is_split_into_words=True`. Words
    are cut to their first `max_characters_per_token - 2` UTF-8 bytes (possibly inside a multi-byte character, as
    the original). An empty word is a valid token with no characters; lone surrogates are kept as their UTF-8-style
    bytes; empty or whitespace-only text is a sentence with no words (`<S> </S>` only). Padding is always on the
    right; padded positions are rows of zeros.

    Args:
        max_characters_per_token (`int`, 50): character slots per word, markers included.
        word_tokenizer (`str`, optional): how raw text is split into words, the one the model was trained with:
            `"elmo"` (`split_words`, the default), `"whitespace"`, or `"spacy:<lang>"` (spaCy's tokenizer, e.g.
            `"spacy:en"` for the English model shipped with the package; needs spaCy).
        bos_token (`str`, `"<S>"`), eos_token (`str`, `"</S>"`): the sentence boundary pseudo-words; the same
            strings inside the input are encoded as boundaries too (AllenNLP's behaviour).
        pad_token (`str`, `"<pad>"`), unk_token (`str`, `"<UNK>"`): pseudo tokens for HF tooling; characters
            never go out of vocabulary.
        char_lexicon_file, word_lexicon_file (`str`, optional): a lexicon model's tables (JSON, entry → id as
            ELMoForManyLangs' `char.dic` / `word.dic` give them, saved with the tokenizer); the boundaries are then
            `<bos>`/`<eos>`, and `word_input_ids` come beside `input_ids` when there is a word table.
    """

    vocab_files_names = {"char_lexicon_file": "char_lexicon.json", "word_lexicon_file": "word_lexicon.json"}
    model_input_names = ["input_ids", "attention_mask"]
    padding_side = "right"

    def __init__(
        self,
        max_characters_per_token: int = 50,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str = "<pad>",
        unk_token: str | None = None,
        word_tokenizer: str | None = None,
        char_lexicon_file: str | os.PathLike | None = None,
        word_lexicon_file: str | os.PathLike | None = None,
        **kwargs,
    ):
        if not 3 <= max_characters_per_token <= MAX_CHARACTERS_PER_TOKEN:
            raise ValueError(f"max_characters_per_token must be >= 3 (room for the begin/end-of-word markers) and <= "
                             f"{MAX_CHARACTERS_PER_TOKEN}, got {max_characters_per_token!r}")
        if kwargs.get("padding_side", "right") != "right":
            raise ValueError("ElmoCharTokenizer pads on the right only")
        if word_lexicon_file is not None and char_lexicon_file is None:
            raise ValueError("a word lexicon goes with a character lexicon (ELMoForManyLangs' models have both)")
        self.max_characters_per_token = max_characters_per_token
        check_word_tokenizer(word_tokenizer)
        self.word_tokenizer = word_tokenizer
        self.char_lexicon = None if char_lexicon_file is None else Lexicon(_read_lexicon(char_lexicon_file), True)
        self.word_lexicon = None if word_lexicon_file is None else Lexicon(_read_lexicon(word_lexicon_file), False)
        lexicon = self.char_lexicon is not None
        bos_token = bos_token or ("<bos>" if lexicon else "<S>")
        eos_token = eos_token or ("<eos>" if lexicon else "</S>")
        unk_token = unk_token or ("<oov>" if lexicon else "<UNK>")
        if self.word_lexicon is not None:
            self.model_input_names = [*self.model_input_names, "word_input_ids"]
        super().__init__(
            max_characters_per_token=max_characters_per_token,
            word_tokenizer=word_tokenizer,
            bos_token=bos_token,
            eos_token=eos_token,
            pad_token=pad_token,
            unk_token=unk_token,
            **kwargs,
        )

    @classmethod
    def with_lexicons(
        cls, char_lexicon: Mapping[str, int], word_lexicon: Mapping[str, int] | None = None, **kwargs
    ) -> ElmoCharTokenizer:
        """A lexicon model's tokenizer from its tables (entry -> id, as ELMoForManyLangs' `char.dic` / `word.dic`
        give them); `kwargs` as the constructor's."""
        with tempfile.TemporaryDirectory() as folder:
            files = {}
            for key, lexicon in (("char_lexicon_file", char_lexicon), ("word_lexicon_file", word_lexicon)):
                if lexicon is not None:
                    files[key] = os.path.join(folder, cls.vocab_files_names[key])
                    with open(files[key], "w", encoding="utf-8") as file:
                        json.dump(dict(lexicon), file, ensure_ascii=False)
            return cls(**files, **kwargs)

    @classmethod
    def for_model(cls, config) -> ElmoCharTokenizer:
        """The tokenizer matching an `ElmoConfig`: its `max_characters_per_token` and recorded `word_tokenizer`
        (a lexicon model's tokenizer holds its tables: load it from the model's directory)."""
        if getattr(config, "character_vocabulary", "bytes") != "bytes":
            raise ValueError("this biLM reads characters through a lexicon saved with its tokenizer: load the "
                             "tokenizer from the model's directory or Hub id (ElmoCharTokenizer.from_pretrained)")
        return cls(
            max_characters_per_token=config.max_characters_per_token,
            word_tokenizer=getattr(config, "word_tokenizer", None),
        )

    # -- vocabulary: characters need none; the special pseudo tokens live in added_tokens ----------------
    @property
    def vocab_size(self) -> int:
        return 0

    def get_vocab(self) -> dict[str, int]:
        return dict(self.added_tokens_encoder)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        """A lexicon model's tables (`char_lexicon.json`, `word_lexicon.json`); none for the byte vocabulary."""
        saved = []
        for key, lexicon in (("char_lexicon_file", self.char_lexicon), ("word_lexicon_file", self.word_lexicon)):
            if lexicon is not None:
                name = (f"{filename_prefix}-" if filename_prefix else "") + self.vocab_files_names[key]
                path = os.path.join(save_directory, name)
                with open(path, "w", encoding="utf-8") as file:
                    json.dump(lexicon.entries, file, ensure_ascii=False, indent=0)
                saved.append(path)
        return tuple(saved)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return split_into_words(text, self.word_tokenizer)

    # -- encoding -----------------------------------------------------------------------------------------
    def word_to_char_ids(self, word: str) -> tuple[int, ...]:
        """The `max_characters_per_token` ids (+1 scheme) of one word; the boundary words give the boundary rows."""
        return tuple(self.encode_words([word])[0][0].tolist())

    def encode_words(self, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray | None]:
        """(n,) words → their character rows int64 (n, max_characters_per_token), and their word ids (n,) where the
        model has a word table (else None). Each distinct word's byte row is made once; a lexicon's rows are made in
        one NumPy pass."""
        if self.char_lexicon is not None:
            rows, looked_up = _lexicon_rows(words, self.char_lexicon, self.max_characters_per_token)
            return rows, None if self.word_lexicon is None else self.word_lexicon.words(looked_up)
        bos, eos, chars = str(self.bos_token), str(self.eos_token), self.max_characters_per_token
        distinct: dict[str, int] = {}  # a word's index into the rows
        positions = [distinct.setdefault(word, len(distinct)) for word in words]
        rows = np.array([_word_char_ids(word, bos, eos, chars) for word in distinct], dtype=np.int64)
        return rows.reshape(-1, chars)[positions], None

    def batch_ids(self, sentences: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray | None]:
        """The ids of a batch of word lists as the biLM reads them, boundary rows added: character ids int64
        (sentences, longest + 2, max_characters_per_token), zeros after each sentence's end, and for a model with a
        word table its word ids (sentences, longest + 2), zeros there too (else None). The batch is gathered from
        the rows of `encode_words` in one NumPy operation (a per-word assignment made this 10x slower, the larger
        part of a training batch's preparation)."""
        bos, eos, chars = str(self.bos_token), str(self.eos_token), self.max_characters_per_token
        rows, word_ids = self.encode_words([word for words in sentences for word in (bos, *words, eos)])
        lengths = np.array([len(words) + 2 for words in sentences], dtype=np.int64)
        width = int(lengths.max(initial=2))
        real = np.arange(width) < lengths[:, None]
        ids = np.zeros((len(sentences), width, chars), dtype=np.int64)
        ids[real] = rows  # row-major: the order of the words
        if word_ids is None:
            return ids, None
        words = np.zeros((len(sentences), width), dtype=np.int64)
        words[real] = word_ids
        return ids, words

    def batch(self, sentences: Sequence[Sequence[str]], rows: Sequence[Any] = ()) -> ElmoBatch:
        """The `ElmoBatch` of a batch of word lists (`rows`: what each sentence is to the caller)."""
        for words in sentences:
            if isinstance(words, str) or not all(isinstance(word, str) for word in words):
                raise TypeError(f"each sentence must be a list of str (its words), got {words!r:.60}")
        ids, word_ids = self.batch_ids(sentences)
        return ElmoBatch.from_char_ids(ids, [len(words) + 2 for words in sentences], rows, word_ids)

    def _sentence_words(self, text: Any, is_split_into_words: bool) -> list[str]:
        if is_split_into_words:
            if not isinstance(text, (list, tuple)) or not all(isinstance(w, str) for w in text):
                raise TypeError("with is_split_into_words=True each sentence must be a list of str")
            return list(text)
        if not isinstance(text, str):
            raise TypeError(f"expected a str (or is_split_into_words=True for word lists), got {type(text).__name__}")
        return split_into_words(text, self.word_tokenizer)

    def _encode_plus(
        self,
        text: Any,
        text_pair: Any = None,
        add_special_tokens: bool = True,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        truncation_strategy: Any = None,
        max_length: int | None = None,
        is_split_into_words: bool = False,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_tensors: str | TensorType | None = None,
        return_attention_mask: bool | None = None,
        return_token_type_ids: bool | None = None,
        return_overflowing_tokens: bool = False,
        return_special_tokens_mask: bool = False,
        return_offsets_mapping: bool = False,
        return_length: bool = False,
        **kwargs,
    ) -> BatchEncoding:
        """What `__call__` / `encode_plus` run. transformers' own (`PreTrainedTokenizer._encode_plus`) cannot serve:
        it maps a token to one integer id (here a word is a row of character ids, and a lexicon model's word has a
        word id beside them), re-splits pre-split words through `tokenize`, and gives neither offsets nor
        `word_ids()` (slow tokenizers have none). Padding and tensors are transformers' (`pad`)."""
        if text_pair is not None:
            raise ValueError("ElmoCharTokenizer encodes single sentences; text pairs are not supported")
        if return_overflowing_tokens:
            raise ValueError("ElmoCharTokenizer does not return overflowing tokens")
        batched = isinstance(text, (list, tuple)) and (
            not is_split_into_words or (len(text) > 0 and isinstance(text[0], (list, tuple)))
        )
        texts = text if batched else [text]
        sentences = [self._sentence_words(t, is_split_into_words) for t in texts]
        # Character spans of the words: in the raw text, or within each given word (as fast tokenizers do).
        spans = [[(0, len(w)) for w in words] if is_split_into_words else word_spans(t, words)
                 for t, words in zip(texts, sentences)] if return_offsets_mapping else None
        kept = self._kept_words(sentences, truncation_strategy, max_length, add_special_tokens)
        sentences = [[words[i] for i in keep] for words, keep in zip(sentences, kept)]
        spans = [[sentence_spans[i] for i in keep] for sentence_spans, keep in zip(spans, kept)] if spans else None
        features = self._features(sentences, add_special_tokens, return_special_tokens_mask)
        word_ids = [[None, *keep, None] if add_special_tokens else list(keep) for keep in kept]
        if spans is not None:
            features["offset_mapping"] = [[(0, 0), *s, (0, 0)] if add_special_tokens else s for s in spans]
        if return_token_type_ids:  # one segment: all zeros, as tokenizers of single-sentence models give
            features["token_type_ids"] = [[0] * len(rows) for rows in features["input_ids"]]
        if return_length:
            features["length"] = [len(rows) for rows in features["input_ids"]]
        if not batched and padding_strategy == PaddingStrategy.DO_NOT_PAD:
            single = {key: value[0] for key, value in features.items()}
            if return_attention_mask is False:
                single.pop("attention_mask")
            return ElmoBatchEncoding(single, word_ids, tensor_type=return_tensors,
                                     prepend_batch_axis=return_tensors is not None)
        offsets = features.pop("offset_mapping", None)
        encoded = self.pad(
            features,
            padding=padding_strategy,
            max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
            padding_side=padding_side,
            return_attention_mask=return_attention_mask,
            return_tensors=None if not batched else return_tensors,
        )
        if offsets is not None:  # (0, 0) for padded positions, as fast tokenizers give
            encoded["offset_mapping"] = [[*o, *[(0, 0)] * (len(rows) - len(o))]
                                         for o, rows in zip(offsets, encoded["input_ids"])]
            encoded.convert_to_tensors(return_tensors if batched else None)
        word_ids = [w + [None] * (len(rows) - len(w)) for w, rows in zip(word_ids, encoded["input_ids"])]
        if batched:
            return ElmoBatchEncoding(dict(encoded), word_ids, tensor_type=return_tensors)
        return ElmoBatchEncoding({k: v[0] for k, v in encoded.items()}, word_ids, tensor_type=return_tensors,
                                 prepend_batch_axis=True)

    def _kept_words(self, sentences: list[list[str]], truncation_strategy: Any, max_length: int | None,
                    add_special_tokens: bool) -> list[range]:
        """The words of each sentence kept: all, or with truncation the first (`truncation_side` "left": the last)
        that fit in `max_length` beside the boundary rows."""
        truncate = truncation_strategy is not None and str(getattr(truncation_strategy, "value", truncation_strategy))
        if truncate in (None, False, "do_not_truncate") or max_length is None:
            return [range(len(words)) for words in sentences]
        budget = max_length - (2 if add_special_tokens else 0)
        if budget < 0:
            raise ValueError(f"max_length={max_length} leaves no room for the <S> and </S> rows")
        return [range(max(len(words) - budget, 0), len(words)) if self.truncation_side == "left"
                else range(min(budget, len(words))) for words in sentences]

    def _features(self, sentences: list[list[str]], add_special_tokens: bool, special_tokens_mask: bool
                  ) -> dict[str, list]:
        """Per sentence: its character rows (`input_ids`), `attention_mask`, a lexicon model's `word_input_ids`, and
        with `special_tokens_mask` 1 at the boundary rows."""
        features: dict[str, list] = {"input_ids": [], "attention_mask": []}
        if special_tokens_mask:
            features["special_tokens_mask"] = []
        if self.word_lexicon is not None:
            features["word_input_ids"] = []
        for words in sentences:
            special = [0] * len(words)
            if add_special_tokens:
                words = [str(self.bos_token), *words, str(self.eos_token)]
                special = [1, *special, 1]
            rows, word_input_ids = self.encode_words(words)
            features["input_ids"].append(rows.tolist())
            features["attention_mask"].append([1] * len(rows))
            if word_input_ids is not None:
                features["word_input_ids"].append(word_input_ids.tolist())
            if special_tokens_mask:
                features["special_tokens_mask"].append(special)
        return features

    def pad(
        self,
        encoded_inputs: Any,
        padding: bool | str | PaddingStrategy = True,
        max_length: int | None = None,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
        return_tensors: str | TensorType | None = None,
        verbose: bool = True,
    ) -> BatchEncoding:
        """transformers' `pad` (a list of feature dicts, or a dict of lists; its strategies, its tensors), each
        sentence padded on the right by `_pad`. What this adds: the ids are checked to be character ids ((words,
        max_characters_per_token) per sentence; one sentence's are a batch of one), and the errors of a padding that
        cannot be done (`max_length` padding without a length, tensors of unpadded sentences) say so in one line."""
        if (padding_side or self.padding_side) != "right":
            raise ValueError("ElmoCharTokenizer pads on the right only: the backward LM starts at each sentence's end")
        if isinstance(encoded_inputs, (list, tuple)):
            if not encoded_inputs:
                raise ValueError("cannot pad an empty list of examples")
            encoded_inputs = {key: [example[key] for example in encoded_inputs] for key in encoded_inputs[0]}
        batch = dict(encoded_inputs)
        if "input_ids" not in batch:
            raise ValueError(f"pad needs 'input_ids' in the inputs, got keys {sorted(batch)}")
        if _is_token_ids(batch["input_ids"]):
            raise ValueError(f"pad: input_ids must be character ids, (words, {self.max_characters_per_token}) per "
                             "sentence as ElmoCharTokenizer makes them, not a flat list of token ids")
        if _is_single_sentence(batch["input_ids"]):
            batch = {key: [value] for key, value in batch.items()}
        batch["input_ids"] = [self._character_rows(row, ids) for row, ids in enumerate(batch["input_ids"])]
        lengths = {len(ids) for ids in batch["input_ids"]}
        strategy = _padding_strategy(padding)
        if strategy == PaddingStrategy.MAX_LENGTH and max_length is None:
            raise ValueError("padding='max_length' needs max_length")
        if strategy == PaddingStrategy.DO_NOT_PAD and return_tensors is not None and len(lengths) > 1:
            raise ValueError("sentences differ in length: pass padding=True to return tensors")
        return super().pad(batch, strategy, max_length, pad_to_multiple_of, padding_side, return_attention_mask,
                           return_tensors, verbose)

    def _character_rows(self, row: int, ids: Any) -> list[list[int]]:
        """Sentence `row`'s input_ids as lists, checked to be (words, max_characters_per_token) character ids."""
        ids = np.asarray(ids.tolist() if _is_tensor(ids) else ids, dtype=np.int64)
        if ids.size and (ids.ndim != 2 or ids.shape[1] != self.max_characters_per_token):
            raise ValueError(f"pad: sentence {row} has input_ids of shape {ids.shape}; expected (words, "
                             f"{self.max_characters_per_token}) character ids")
        return ids.reshape(-1, self.max_characters_per_token).tolist()

    def _pad(
        self,
        encoded_inputs: dict[str, Any],
        max_length: int | None = None,
        padding_strategy: PaddingStrategy = PaddingStrategy.DO_NOT_PAD,
        pad_to_multiple_of: int | None = None,
        padding_side: str | None = None,
        return_attention_mask: bool | None = None,
    ) -> dict:
        """transformers' step of `pad` for one sentence, on the right: `input_ids` get all-zero rows (a word of no
        characters), `attention_mask` 0, `labels` -100, `special_tokens_mask` 1, other per-position lists 0;
        per-sentence values (a class `label`) pass through."""
        words = len(encoded_inputs["input_ids"])
        if return_attention_mask is False:
            encoded_inputs.pop("attention_mask", None)
        elif "attention_mask" not in encoded_inputs:
            encoded_inputs["attention_mask"] = [1] * words
        if padding_strategy == PaddingStrategy.LONGEST:
            max_length = words
        if max_length is not None and pad_to_multiple_of and max_length % pad_to_multiple_of:
            max_length += pad_to_multiple_of - max_length % pad_to_multiple_of
        if padding_strategy == PaddingStrategy.DO_NOT_PAD or max_length is None:
            return encoded_inputs
        padded = {}
        for key, value in encoded_inputs.items():
            if key == "input_ids":
                value = list(value) + [[0] * self.max_characters_per_token] * (max_length - words)
            elif isinstance(value, (list, tuple, np.ndarray)) or _is_tensor(value):
                value = np.asarray(value, dtype=np.int64).reshape(-1).tolist()
                value += [{"labels": -100, "special_tokens_mask": 1}.get(key, 0)] * (max_length - len(value))
            padded[key] = value
        return padded

    # -- decoding -----------------------------------------------------------------------------------------
    def char_ids_to_word(self, char_ids: Any) -> str | None:
        """The word of one row of character ids; `None` for a padding position."""
        if self.char_lexicon is not None:
            lexicon, ids = self.char_lexicon, [int(i) for i in char_ids if int(i) > 0]
            markers = {lexicon[m] for m in ("<bow>", "<eow>", "<pad>")}
            entries = [lexicon.text(i) or "" for i in ids if i not in markers]
            return None if not ids else "".join(entries)
        raw = [int(i) - 1 for i in char_ids if int(i) > 0]
        if not raw:
            return None
        chars = [c for c in raw if c not in (BEGIN_OF_WORD_CHAR, END_OF_WORD_CHAR, PADDING_CHAR)]
        if chars == [BEGIN_OF_SENTENCE_CHAR]:
            return str(self.bos_token)
        if chars == [END_OF_SENTENCE_CHAR]:
            return str(self.eos_token)
        data = bytes(c for c in chars if c < 256)
        try:
            return data.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError:  # a multi-byte character cut by the 48-byte limit
            return data.decode("utf-8", "replace")

    def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kwargs) -> str | list[str]:
        """Words of `(words, chars)` ids joined by spaces, or a list of strings for `(batch, words, chars)`."""
        array = np.asarray(token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids, dtype=np.int64)
        if array.ndim == 3:
            return [self.decode(sentence, skip_special_tokens) for sentence in array]
        if array.ndim != 2 and array.size:
            raise ValueError(f"expected ids of shape (words, chars) or (batch, words, chars), got {array.shape}")
        specials = {str(self.bos_token), str(self.eos_token)}
        words = [self.char_ids_to_word(row) for row in array.reshape(-1, self.max_characters_per_token)]
        return " ".join(w for w in words if w is not None and not (skip_special_tokens and w in specials))

    def batch_decode(self, sequences: Any, skip_special_tokens: bool = False, **kwargs) -> list[str]:
        decoded = self.decode(sequences, skip_special_tokens)
        return [decoded] if isinstance(decoded, str) else decoded


class ElmoBatchEncoding(BatchEncoding):
    """A `BatchEncoding` that knows the word of every position (`word_ids`), as fast tokenizers' encodings do."""

    def __init__(self, data: dict, word_ids: list[list[int | None]], **kwargs):
        super().__init__(data, **kwargs)
        self._word_ids = word_ids

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        """Per position of sentence `batch_index`: the index of its word in the input, None for `<S>`, `</S>` and
        padding."""
        return list(self._word_ids[batch_index])


def word_spans(text: str, words: Sequence[str]) -> list[tuple[int, int]]:
    """(start, end) of each word in `text`, searched left to right (every word tokenizer here keeps the words as
    they appear in the text)."""
    spans, position = [], 0
    for word in words:
        start = text.find(word, position)
        if start < 0:
            raise ValueError(f"word {word!r} is not a substring of the text: no offsets")
        spans.append((start, start + len(word)))
        position = start + len(word)
    return spans


def _is_token_ids(ids: Any) -> bool:
    """True for a flat sequence of ints (token ids of a word-piece tokenizer), which this tokenizer never makes."""
    if _is_tensor(ids) or isinstance(ids, np.ndarray):
        return np.ndim(ids) == 1
    return len(ids) > 0 and isinstance(ids[0], (int, np.integer))


def _is_single_sentence(ids: Any) -> bool:
    """True for (words, chars) ids, False for a batch (batch, words, chars)."""
    if _is_tensor(ids) or isinstance(ids, np.ndarray):
        return np.ndim(ids) == 2
    return len(ids) > 0 and len(ids[0]) > 0 and isinstance(ids[0][0], (int, np.integer))


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "tolist") and not isinstance(value, np.ndarray)


def _padding_strategy(padding: bool | str | PaddingStrategy) -> PaddingStrategy:
    if padding is True:
        return PaddingStrategy.LONGEST
    if padding is False or padding is None:
        return PaddingStrategy.DO_NOT_PAD
    return PaddingStrategy(padding)


ElmoCharTokenizer.register_for_auto_class()

__all__ = ["ElmoCharTokenizer"]
