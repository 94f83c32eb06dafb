"""Registered span getters: which stretches of a Doc the biLM reads as one sequence.

A span getter maps a batch of Docs to one list of Spans per Doc. Spans longer than `max_length` tokens are cut
into consecutive windows, so no biLM row is longer than `max_length` (bounded memory on any document).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from spacy.pipeline import Sentencizer
from spacy.tokens import Doc, Span
from spacy.util import registry

from hf_elmo.configuration_elmo import integer_problem
from hf_elmo.text import windows

SpanGetter = Callable[[list[Doc]], list[list[Span]]]


def _windows(doc: Doc, start: int, end: int, max_length: int) -> Iterable[Span]:
    """The span of tokens `start:end` in windows of at most `max_length` tokens (`hf_elmo.text.windows`); none for
    an empty span."""
    if end > start:
        for piece in windows(end - start, max_length):
            yield doc[start + piece.start : start + piece.stop]


def sent_spans(docs: Iterable[Doc], max_length: int = 200) -> list[list[Span]]:
    """Sentences when the Doc has sentence boundaries, else windows of `max_length` tokens."""
    result = []
    for doc in docs:
        if doc.has_annotation("SENT_START"):
            bounds = [(sent.start, sent.end) for sent in doc.sents]
        else:
            bounds = [(0, len(doc))]
        result.append([window for start, end in bounds for window in _windows(doc, start, end, max_length)])
    return result


def sentence_spans(docs: Iterable[Doc], sentencizer: Sentencizer, max_length: int = 200) -> list[list[Span]]:
    """The Doc's own sentences when it has boundaries, else `sentencizer`'s, computed for the biLM only."""
    result = []
    for doc in docs:
        if doc.has_annotation("SENT_START"):
            starts = [sent.start for sent in doc.sents]
        else:
            starts = [i for i, is_start in enumerate(sentencizer.predict([doc])[0]) if is_start]
        bounds = zip(starts, [*starts[1:], len(doc)])
        result.append([window for start, end in bounds for window in _windows(doc, start, end, max_length)])
    return result


def doc_spans(docs: Iterable[Doc], max_length: int = 512) -> list[list[Span]]:
    """The whole Doc as one sequence (e.g. a short review), cut into windows of `max_length` tokens."""
    return [list(_windows(doc, 0, len(doc), max_length)) for doc in docs]


def _check_max_length(max_length: int) -> None:
    if problem := integer_problem(max_length, 1):
        raise ValueError(f"max_length {problem}")


@registry.misc("spacy-elmo.sent_spans.v1")
def configure_sent_spans(max_length: int = 200) -> SpanGetter:
    """Sentences (from a parser, senter or sentencizer earlier in the pipeline), or windows of `max_length`
    tokens when the Doc has no sentence boundaries; a sentence longer than `max_length` is cut into windows.

    max_length (int): the longest sequence the biLM reads.
    """
    _check_max_length(max_length)
    return partial(sent_spans, max_length=max_length)


@registry.misc("spacy-elmo.sent_spans.v2")
def configure_sentence_spans(max_length: int = 200, punct_chars: list[str] | None = None) -> SpanGetter:
    """Sentences, always: the Doc's own (from a parser or senter earlier in the pipeline), else those of spaCy's
    rule-based sentencizer, found for the biLM only and never written to the Doc, so no task is constrained by
    them (a sentencizer component's boundary inside a gold entity stops NER training with spaCy's E024). A
    sentence longer than `max_length` is cut into windows.

    max_length (int): the longest sequence the biLM reads.
    punct_chars (list of str or None): the sentencizer's sentence-final characters; null = spaCy's default.
    """
    _check_max_length(max_length)
    return partial(sentence_spans, sentencizer=Sentencizer(punct_chars=punct_chars), max_length=max_length)


@registry.misc("spacy-elmo.doc_spans.v1")
def configure_doc_spans(max_length: int = 512) -> SpanGetter:
    """The whole Doc as one sequence, ignoring sentence boundaries; longer Docs are cut into windows.

    max_length (int): the longest sequence the biLM reads.
    """
    _check_max_length(max_length)
    return partial(doc_spans, max_length=max_length)
