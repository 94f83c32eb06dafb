"""Docs → their sentences (`Sentence`s, in one batch): the first step of the biLM layer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from spacy.tokens import Doc
from thinc.api import Model

from ..span_getters import SpanGetter
from .types import Sentence, SentenceBatches, Setting, empty_backprop


def doc_sentences(get_spans: SpanGetter) -> Model[list[Doc], SentenceBatches]:
    """Docs → their sentences (the span getter's spans) as one list of `Sentence`s."""
    return Model("elmo_doc_sentences", doc_sentences_forward, attrs={"get_spans": Setting(get_spans)})


def doc_sentences_forward(model: Model, docs: Sequence[Doc], is_train: bool) -> tuple[SentenceBatches, Callable]:
    sentences = []
    for doc_index, spans in enumerate(model.attrs["get_spans"].value(list(docs))):
        for span in spans:
            tokens = [token for token in span if not token.is_space]
            if tokens:
                indices = np.fromiter((token.i for token in tokens), dtype="int32", count=len(tokens))
                sentences.append(Sentence(doc_index, indices, [token.text for token in tokens]))
    return SentenceBatches([len(doc) for doc in docs], [sentences]), empty_backprop
