"""What flows between the biLM's layers (`Sentence`, `SentenceBatches`), a layer setting that is never saved
(`Setting`), and the backward of a step with no gradient to pass on (`empty_backprop`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from thinc.types import Floats4d


@dataclass(frozen=True)
class Sentence:
    """One biLM row: the Doc it belongs to, its tokens' indices in that Doc (whitespace tokens left out) and their
    texts."""

    doc: int
    tokens: np.ndarray
    words: list[str]



@dataclass(frozen=True)
class SentenceBatches:
    """The sentences of a batch of Docs as the biLM reads them: `doc_lengths` (tokens per Doc), the sentences in
    `batches`, and once the biLM ran, each batch's `layers` (n_layers + 1, rows, positions, width)."""

    doc_lengths: list[int]
    batches: list[list[Sentence]]
    layers: list[Floats4d] = field(default_factory=list)


@dataclass(frozen=True)
class Setting:
    """A setting of a layer that comes from the config at every load: msgpack cannot serialise it, so Thinc never
    restores it from a saved pipeline (a config edited since keeps its new value)."""

    value: Any


def empty_backprop(d_outputs: Any) -> list:
    """The backward of a step without gradient to pass on (its inputs are Docs or settings)."""
    return []
