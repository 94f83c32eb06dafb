"""Sentences → length-sorted batches of at most `max_batch_tokens` padded positions (`hf_elmo.text.length_batches`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from thinc.api import Model

from hf_elmo.configuration_elmo import integer_problem
from hf_elmo.text import length_batches

from .types import SentenceBatches, Setting, empty_backprop


def sentence_batches(max_batch_tokens: int) -> Model[SentenceBatches, SentenceBatches]:
    """Sentences → batches, longest first, of at most `max_batch_tokens` padded positions each."""
    if problem := integer_problem(max_batch_tokens, 1):
        raise ValueError(f"max_batch_tokens {problem}")
    return Model("elmo_sentence_batches", sentence_batches_forward,
                 attrs={"max_batch_tokens": Setting(max_batch_tokens)})


def sentence_batches_forward(model: Model, rows: SentenceBatches, is_train: bool) -> tuple[SentenceBatches, Callable]:
    sentences = [sentence for batch in rows.batches for sentence in batch]
    batches = length_batches([len(s.words) for s in sentences], model.attrs["max_batch_tokens"].value)
    return replace(rows, batches=[[sentences[i] for i in batch] for batch in batches]), empty_backprop
