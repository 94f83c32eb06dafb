"""Streamed, sharded, sentence-level batches for biLM training and evaluation.

Every line (sentence or paragraph) becomes one sequence `<S> w1 ... wn </S>` that starts from the zero LSTM
state, as at inference; a line longer than `max_words` words is cut into consecutive pieces of at most
`max_words` words, and a piece boundary inside a line is no prediction target (its label is -100).

Per epoch the files are shuffled (seeded by `seed` and the epoch), then each process takes its own part: whole
files (`files[rank::world_size]`) when there are at least as many files as processes, otherwise every
`world_size`-th line. A process reads its part in blocks of `block_lines` lines; each block is shuffled, sorted
by length into batches of at most `batch_tokens` padded positions, and the batches are shuffled. Nothing is
loaded whole.

With a DataLoader of W worker processes, block k is made by worker k mod W, and the loader takes one batch from each
worker in turn: the same batches in the same order on every run. Every batch says where it came from (its epoch,
worker, block and index), and the `DataPosition` of the batches taken so far (each worker's last block and batch,
and whose turn is next) lets a run resume exactly where it stopped.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from ..modeling_elmo import lm_target_index
from ..text import WordTokenizer, length_batches, read_lines, windows
from ..tokenization_elmo import ElmoCharTokenizer
from .vocabulary import WordVocabulary

IGNORE_INDEX = -100


@dataclass(frozen=True)
class DataPosition:
    """A place in a process's data stream in `epoch`: worker w (of `len(done)`) has made the batches of its blocks up
    to block `done[w][0]` and the first `done[w][1]` batches of that one; worker `turn` makes the next batch."""

    epoch: int = 0
    done: tuple[tuple[int, int], ...] = ((0, 0),)
    turn: int = 0

    @classmethod
    def start(cls, epoch: int = 0, workers: int = 1) -> DataPosition:
        """The start of `epoch` for `workers` workers (0: batches made in the training process, as one)."""
        return cls(epoch, tuple((w, 0) for w in range(max(workers, 1))), 0)

    def after(self, origin: Sequence[int]) -> DataPosition:
        """The position after a batch of `origin` (epoch, worker, block, index) was taken."""
        _, worker, block, index = origin
        done = tuple((block, index + 1) if w == worker else d for w, d in enumerate(self.done))
        return DataPosition(self.epoch, done, (worker + 1) % len(done))

    def to_json(self) -> list:
        return [self.epoch, [list(d) for d in self.done], self.turn]

    @classmethod
    def from_json(cls, value: list) -> DataPosition:
        epoch, done, turn = value
        return cls(epoch, tuple(tuple(d) for d in done), turn)


@dataclass(frozen=True)
class Segment:
    """Words given to the biLM as one sequence; `starts_line`/`ends_line` say whether `<S>`/`</S>` are real."""

    words: tuple[str, ...]
    starts_line: bool = True
    ends_line: bool = True


def split_line(words: Sequence[str], max_words: int | None) -> list[Segment]:
    """The segments of one line: none for an empty line, pieces of at most `max_words` words for a long one."""
    if not words:
        return []
    return [Segment(tuple(words[piece]), piece.start == 0, piece.stop == len(words))
            for piece in windows(len(words), max_words)]


def group_by_length(segments: Sequence[Segment], batch_tokens: int) -> list[list[Segment]]:
    """Batches of segments, longest first, each with at most `batch_tokens` padded positions (`<S>`/`</S>`
    included); a segment longer than that is a batch alone (`hf_elmo.text.length_batches`)."""
    return [[segments[i] for i in batch] for batch in length_batches([len(s.words) for s in segments], batch_tokens)]


def encode_batch(
    segments: Sequence[Segment], char_tokenizer: ElmoCharTokenizer, vocabulary: WordVocabulary
) -> dict[str, Any]:
    """Model inputs of a batch: the `ElmoBatch` (`input_ids` (batch, positions, chars), `attention_mask` (batch,
    positions), `lengths` on the host) and `labels` (batch, positions) = softmax ids of `<S>`, the words and `</S>`,
    -100 at padding and at the ends of pieces that are not the ends of a line, with the `lm_target_index` of the
    predictions (`forward_index`, `backward_index`) made here, on the host."""
    batch = char_tokenizer.batch([segment.words for segment in segments])
    labels = np.full(batch.attention_mask.shape, IGNORE_INDEX, dtype=np.int64)
    for row, (segment, length) in enumerate(zip(segments, batch.lengths)):
        labels[row, :length] = vocabulary.encode(segment.words)
        if not segment.starts_line:
            labels[row, 0] = IGNORE_INDEX
        if not segment.ends_line:
            labels[row, length - 1] = IGNORE_INDEX
    labels = torch.from_numpy(labels)
    forward_index, backward_index = lm_target_index(batch.attention_mask, labels)
    return {**batch, "labels": labels, "forward_index": forward_index, "backward_index": backward_index}


class LMBatches(IterableDataset):
    """One epoch of batches (dicts of `encode_batch`'s plus `origin`: the epoch, loader worker, block and index of
    the batch) for one process, from `set_position` (default: the start of epoch 0, made in the process) to the end
    of that epoch. In a DataLoader of W workers, worker w makes the blocks k with k mod W = w (see the module).

    Args:
        files: corpus files, one sentence or paragraph per line (`.gz` read compressed).
        word_tokenizer: splits lines into words (see `hf_elmo.text`).
        vocabulary: softmax ids of the target words.
        char_tokenizer: character ids of the input words.
        batch_tokens: padded positions per batch.
        max_words: longest piece of a line given as one sequence (`None`: whole lines).
        block_lines: lines read, shuffled and batched together.
        shuffle: shuffle files, lines within blocks, and batches (training); `False` keeps the order (evaluation).
        seed: the shuffling seed (with the epoch and block index).
        rank, world_size: this process and the number of processes sharing the data.
    """

    def __init__(
        self,
        files: Sequence[str],
        word_tokenizer: WordTokenizer,
        vocabulary: WordVocabulary,
        char_tokenizer: ElmoCharTokenizer,
        batch_tokens: int = 4096,
        max_words: int | None = 100,
        block_lines: int = 10_000,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        if not files:
            raise ValueError("no corpus files given")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside [0, {world_size})")
        self.files = list(files)
        self.word_tokenizer = word_tokenizer
        self.vocabulary = vocabulary
        self.char_tokenizer = char_tokenizer
        self.batch_tokens = batch_tokens
        self.max_words = max_words
        self.block_lines = block_lines
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.position = DataPosition()

    def set_position(self, position: DataPosition) -> None:
        """Start the next iteration at `position` (a new epoch: `DataPosition.start(epoch, workers)`)."""
        self.position = position

    def epoch_files(self, epoch: int) -> list[str]:
        """The files in the order of `epoch`."""
        files = list(self.files)
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(files)
        return files

    def process_lines(self, epoch: int) -> Iterator[str]:
        """This process's lines of `epoch`: its whole files, or every `world_size`-th line if files are too few."""
        files = self.epoch_files(epoch)
        if len(files) >= self.world_size:
            return itertools.chain.from_iterable(map(read_lines, files[self.rank :: self.world_size]))
        lines = itertools.chain.from_iterable(map(read_lines, files))
        return itertools.islice(lines, self.rank, None, self.world_size)

    def block_batches(self, lines: list[str], epoch: int, block: int) -> list[list[Segment]]:
        """The batches of one block of lines, in training order."""
        rng = random.Random(f"{self.seed}/{epoch}/{block}")
        if self.shuffle:
            lines = rng.sample(lines, len(lines))
        segments = [s for words in self.word_tokenizer(lines) for s in split_line(words, self.max_words)]
        batches = group_by_length(segments, self.batch_tokens)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[dict]:
        """This worker's batches from the position set (each with its `origin`: epoch, worker, block, index)."""
        position = self.position
        info = get_worker_info()
        loader_id, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers != len(position.done):
            raise ValueError(f"the data position is one of {len(position.done)} loader workers; this loader has "
                             f"{workers}: resume with the same --num_workers")
        worker = (loader_id + position.turn) % workers  # the loader asks worker 0 first: the one whose turn it is
        start_block, start_batch = position.done[worker]
        lines = self.process_lines(position.epoch)
        for block in itertools.count():
            block_lines = list(itertools.islice(lines, self.block_lines))
            if not block_lines:
                return
            if block % workers != worker or block < start_block:
                continue  # another worker's block, or one done: read, not tokenized (cheap)
            batches = self.block_batches(block_lines, position.epoch, block)
            for index in range(start_batch if block == start_block else 0, len(batches)):
                yield {
                    **encode_batch(batches[index], self.char_tokenizer, self.vocabulary),
                    "origin": (position.epoch, worker, block, index),
                }
