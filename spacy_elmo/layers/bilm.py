"""The biLM as Thinc layers: Docs → per Doc an array (n_layers + 1, n_tokens, width) of ELMo layers.

`build_bilm` (`spacy-elmo.ElmoBiLM.v2`) chains five small layers, one step of the data flow each:

1. `doc_sentences`: the span getter's sentences (or windows) of every Doc, each as its non-whitespace tokens (the
   biLM never saw whitespace in training; those tokens get zero rows);
2. `sentence_batches`: the sentences grouped into length-sorted batches of at most `max_batch_tokens` padded
   positions (`hf_elmo.text.length_batches`);
3. `each_batch(elmo_torch)`: per batch, the `ElmoBatch` of its words (character ids with `<S>`/`</S>` rows) through
   the `ElmoModel` in an `ElmoShim` (Thinc's PyTorch wrapper), giving its layers (n_layers + 1, rows, positions,
   width);
4. `strip_boundaries`: the `<S>`/`</S>` positions dropped;
5. `to_docs`: each row's vectors put back at its tokens' places in its Doc's array.

The weights are read in the layer's `init` (`nlp.initialize()`), which sets its dimensions, or, for a layer used
before (`nlp.add_pipe("elmo")` then `nlp(text)`), by its forward on first use: the one place they are read from
`name`. `spacy-elmo.ElmoBiLM.v1` is in `bilm_v1.py`; the
shim in `shim.py`; what flows between the layers in `types.py`; a biLM owned by a downstream model in
`standalone.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spacy.tokens import Doc
from thinc.api import Model, PyTorchGradScaler
from thinc.layers.chain import forward as chain_forward
from thinc.types import Floats3d

from ..span_getters import SpanGetter
from .doc_sentences import doc_sentences
from .each_batch import each_batch
from .elmo_torch import elmo_torch
from .sentence_batches import sentence_batches
from .shim import bilm_init, elmo_shim
from .strip_boundaries import strip_boundaries
from .to_docs import to_docs


def build_bilm(
    name: str,
    get_spans: SpanGetter,
    max_batch_tokens: int = 4096,
    mixed_precision: bool = False,
    grad_scaler_config: dict | None = None,
    int8: bool = False,
) -> Model[list[Doc], list[Floats3d]]:
    """The biLM layer (`spacy-elmo.ElmoBiLM.v2`); its weights are read from `name` (directory or Hub id) when it is
    initialized, unless set or loaded before."""
    grad_scaler = PyTorchGradScaler(**{"enabled": mixed_precision, **(grad_scaler_config or {})})
    bilm = elmo_torch(name, mixed_precision, grad_scaler, int8)
    layers = [doc_sentences(get_spans), sentence_batches(max_batch_tokens), each_batch(bilm), strip_boundaries(),
              to_docs()]
    return Model("elmo_bilm", bilm_forward, init=bilm_init, layers=layers, dims={"nO": None, "nL": None},
                 refs={"elmo_torch": bilm})


def bilm_forward(model: Model, docs: Sequence[Doc], is_train: bool) -> tuple[list[Floats3d], Callable]:
    """The five layers in turn; a layer used before its init (no weights, or no dimensions: a saved v1 node's layers)
    is initialized first."""
    if elmo_shim(model).elmo is None or model.has_dim("nO") is not True:
        bilm_init(model)
    return chain_forward(model, docs, is_train)
