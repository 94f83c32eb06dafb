"""`EmbedderStream`: an `ElmoEmbedder`'s vectors of sentences that join and leave the biLM between advances
(`hf_elmo.stream.ElmoStream`), for a server that batches across requests continuously (`hf_elmo.serve`)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch

from ..stream import ElmoStream
from .embedder import ElmoEmbedder
from .windows import sentence_windows

# Steps each advance runs: fewer leave rows that ended waiting less for the next to join, more cost less per step
# (measured at 32 rows in flight on two cores: docs/serving.md).
ADVANCE_STEPS = 8


class EmbedderStream:
    """Sentences join (`add`, keyed) and leave (`advance`) with what `embedder` gives for each: its float32 word
    vectors (its `layers`, as `embed_sentences` without `pool`) and its vector (`embedder.pooled`), equal to the
    library's but for float32 rounding. A sentence longer than `max_sentence_words` joins as its windows (each from
    the zero state, as `embed_sentences` runs it) and leaves when the last has ended. One thread at a time."""

    def __init__(self, embedder: ElmoEmbedder, steps: int = ADVANCE_STEPS):
        self.embedder, self.steps = embedder, steps
        self.words = embedder.with_settings(pool=None, dtype="float32")
        self.sentences: dict[Hashable, list[np.ndarray | None]] = {}  # each sentence's windows' vectors so far
        self.stream = self._new_stream()

    def _new_stream(self) -> ElmoStream:
        with torch.inference_mode():
            return ElmoStream(self.embedder.model, self.embedder.inference_cache, self.embedder.precision.quantize)

    def __len__(self) -> int:
        """The sentences in flight."""
        return len(self.sentences)

    @property
    def positions(self) -> int:
        """The positions the sentences in flight have left."""
        return self.stream.positions

    def add(self, sentences: Sequence[Sequence[str]], keys: Sequence[Hashable]) -> None:
        """`sentences` (words each) join, each keyed by its key in `keys`."""
        windows = list(sentence_windows(sentences, self.embedder.max_sentence_words))
        batch = self.embedder.tokenizer.batch([window.words for window in windows]).to(self.embedder.device)
        counts = np.bincount([window.sentence for window in windows], minlength=len(sentences))
        rows = [(keys[window.sentence], part) for window, part in
                zip(windows, (p for count in counts for p in range(count)), strict=True)]
        with torch.inference_mode(), self.embedder.precision.autocast():
            self.stream.add(batch, rows)
        for key, count in zip(keys, counts):
            self.sentences[key] = [None] * int(count)

    def advance(self, to_the_end: bool = False) -> list[tuple[Hashable, tuple[np.ndarray, np.ndarray]]]:
        """The sentences in flight `steps` steps further (`to_the_end`: until every one has ended); those that ended,
        each as (key, (word vectors, vector))."""
        with torch.inference_mode(), self.embedder.precision.autocast():
            ended = self.stream.advance(self.stream.positions if to_the_end else self.steps)
            done = []
            for (key, part), layers in ended:
                vectors = self.words.selected([layer[None] for layer in layers], lambda layer: layer[:, 1:-1])
                parts = self.sentences[key]
                parts[part] = vectors[..., 0, :, :].float().cpu().numpy()
                if all(p is not None for p in parts):
                    del self.sentences[key]
                    words = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-2)
                    done.append((key, (words, self.embedder.pooled(words))))
        return done

    def drop(self) -> list[Hashable]:
        """Every sentence in flight leaves unfinished (after an advance failed); their keys."""
        keys = list(self.sentences)
        self.sentences.clear()
        self.stream = self._new_stream()
        return keys
