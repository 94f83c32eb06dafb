"""What the `elmo` component stores on a Doc, and the vectors derived from it.

* `doc._.elmo_layers`: numpy (n_layers + 1, n_tokens, width), sentence boundaries removed; whitespace tokens
  are zero rows. A plain array in `doc.user_data`, so it survives `DocBin(store_user_data=True)`,
  `Doc.to_bytes` and `nlp.pipe(n_process=...)`.
* `doc._.elmo_mix`: numpy (n_layers + 1,), the fixed weights of the component's default mix.
* `token._.elmo_vector`, `span._.elmo_vector`, `doc._.elmo_vector`: the default mix of a token; the mean over
  the non-whitespace tokens of a span or Doc (`hf_elmo.formulas.pool_words`, as `elmo embed --pool mean`; zeros
  when there are none). None without `elmo_layers`.
* User hooks make `.vector`, `.has_vector`, `.vector_norm` and `.similarity` (cosine) of tokens, spans and Docs
  use these. spaCy does not keep hooks through `DocBin`, `Doc.from_bytes` or multiprocessing: the pipeline's
  `nlp.pipe` restores them on Docs from worker processes (`pipeline_component.pipe_with_vector_hooks`); after the
  others call `restore_hooks(doc)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from spacy.tokens import Doc, Span, Token

from hf_elmo.formulas import pool_words, scalar_mix


def register_extensions() -> None:
    """Register the `._.elmo_*` attributes (idempotent; done when `spacy_elmo` is imported)."""
    for name in ("elmo_layers", "elmo_mix"):
        if not Doc.has_extension(name):
            Doc.set_extension(name, default=None)
    for cls, getter in ((Doc, doc_vector), (Span, span_vector), (Token, token_vector)):
        if not cls.has_extension("elmo_vector"):
            cls.set_extension("elmo_vector", getter=getter)


def token_vector(token: Token) -> np.ndarray | None:
    layers, mix = token.doc._.elmo_layers, token.doc._.elmo_mix
    if layers is None:
        return None
    return mixed_layers(layers[:, token.i], mix)


def span_vector(span: Span) -> np.ndarray | None:
    return _mean_vector(span.doc, span.start, span.end)


def doc_vector(doc: Doc) -> np.ndarray | None:
    return _mean_vector(doc, 0, len(doc))


def _mean_vector(doc: Doc, start: int, end: int) -> np.ndarray | None:
    layers, mix = doc._.elmo_layers, doc._.elmo_mix
    if layers is None:
        return None
    rows = [i for i in range(start, end) if not doc[i].is_space]
    mean = pool_words([torch.from_numpy(np.ascontiguousarray(layers[:, rows], dtype="float32"))], "mean")
    return mixed_layers(mean.numpy(), mix)


def mixed_layers(layers: np.ndarray, mix: np.ndarray) -> np.ndarray:
    """(n_layers, ...) and (n_layers,) weights, used as given → (...) float32: the paper's mix
    (`hf_elmo.formulas.scalar_mix`) with fixed weights and gamma 1."""
    # torch wants writable arrays (a read-only one, e.g. from a DocBin, is copied).
    tensors = [torch.from_numpy(np.require(array, "float32", "W")) for array in (layers, mix)]
    return scalar_mix(*tensors).numpy()


def restore_hooks(doc: Doc) -> Doc:
    """Make `.vector` / `.similarity` of the Doc, its spans and tokens use ELMo again (after `DocBin`,
    `Doc.from_bytes` or `nlp.pipe(n_process=...)`, which drop user hooks). A Doc without layers is unchanged."""
    if doc._.elmo_layers is None:
        return doc
    doc.user_hooks.update(vector=_vector, has_vector=_has_vector, vector_norm=_vector_norm, similarity=_similarity)
    doc.user_span_hooks.update(
        vector=_vector, has_vector=_has_vector, vector_norm=_vector_norm, similarity=_similarity
    )
    doc.user_token_hooks.update(
        vector=_vector, has_vector=_has_vector, vector_norm=_vector_norm, similarity=_similarity
    )
    return doc


def _vector(obj: Any) -> np.ndarray:
    return obj._.elmo_vector


def _has_vector(obj: Any) -> bool:
    return bool(_vector_norm(obj))


def _vector_norm(obj: Any) -> float:
    return float(np.linalg.norm(obj._.elmo_vector))


def _similarity(obj: Any, other: Any) -> float:
    """Cosine similarity of the ELMo vectors (0.0 if either is zero)."""
    vector, other_vector = obj.vector, other.vector
    norm = float(np.linalg.norm(vector) * np.linalg.norm(other_vector))
    return float(np.dot(vector, other_vector) / norm) if norm else 0.0
