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
`name`. `spacy-elmo.ElmoBiLM.v1` is in `bilm_v1.py`.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from typing import Any

import numpy as np
import torch
from spacy.tokens import Doc
from thinc.api import ArgsKwargs, Model, PyTorchGradScaler, get_torch_default_device
from thinc.layers.chain import forward as chain_forward
from thinc.layers.pytorchwrapper import forward as pytorch_forward
from thinc.types import Floats3d, Floats4d

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoInferenceCache, ElmoModel
from hf_elmo.configuration_elmo import integer_problem
from hf_elmo.kernel_plan import Precision
from hf_elmo.runtime import OutOfDeviceMemoryError, halve_on_out_of_memory
from hf_elmo.text import length_batches

from ..span_getters import SpanGetter
from ..weights import Weights, load_pretrained
from .pytorch import TorchShim, to_torch, to_xp

# Where a lexicon model's lexicons are kept in the shim's saved config.
LEXICONS_KEY = "tokenizer_lexicons"
NO_WEIGHTS_ERROR = (
    "The ELMo biLM has no weights: its `name` is empty. Give its source: `\"default\"` (the English model shipped "
    "with the package), a directory or a Hub id, e.g. "
    "`nlp.add_pipe(\"elmo\", config={{\"model\": {{\"name\": \"<directory or Hub id>\"}}}})`, or in a training "
    "config `[components.{component}.model] name` or `[initialize.components.{component}.weights]` "
    "(e.g. `@misc = \"spacy-elmo.PretrainedWeights.v1\"`, `\"spacy-elmo.AllenNLPWeights.v1\"`; "
    "`\"spacy-elmo.RandomWeights.v1\"` for an untrained biLM in tests)."
)
# Threads that use a pipeline before its weights are read wait for the first to read them.
_READING_WEIGHTS = threading.Lock()


class ElmoShim(TorchShim):
    """A `TorchShim` whose `ElmoModel` is set after construction (at initialize, from `name`, or by a weights
    loader). Serialised as `TorchShim` does, its config being the biLM's `ElmoConfig` (msgpack, no pickle), so a
    pipeline directory holds everything needed to rebuild the biLM without its original source.

    `name`: where the weights come from when nothing else gives them (`default`, a published model, a directory or a
    Hub id; from the config at every load, never saved). `mixed_precision`: predictions under autocast in
    `hf_elmo.kernel_plan.reduced_precision` (on a CPU with AMX / AVX512-BF16 the biLM's opt-in bf16 mode; float32
    with a warning on other CPUs); fine-tuning under Thinc's CUDA autocast. `int8`: predictions in the int8 mode
    where it runs. What runs of both is the shim's `precision` (`hf_elmo.kernel_plan.Precision`), decided when the
    biLM is set, loaded or moved.
    """

    def __init__(self, name: str = "", mixed_precision: bool = False, grad_scaler: PyTorchGradScaler | None = None,
                 int8: bool = False):
        super().__init__(None, mixed_precision=mixed_precision, grad_scaler=grad_scaler)
        self.name = name
        self.int8 = int8
        self.precision = Precision()  # what `mixed_precision` and `int8` give on the biLM's device
        # The pipeline component whose config gives `name` (set by the component), for the error without one.
        self.component = "elmo"
        # The biLM's own tokenizer where it reads characters through lexicons (saved with the shim); else None, and
        # the byte tokenizer of its character slots.
        self.tokenizer: ElmoCharTokenizer | None = None
        # Token representations and packed LSTM weights kept between the predictions of this biLM.
        self.inference_cache = ElmoInferenceCache()

    @property
    def elmo(self) -> ElmoModel | None:
        return self._model

    @property
    def device(self) -> torch.device:
        return get_torch_default_device() if self._model is None else super().device

    def set_elmo(self, weights: Weights) -> None:
        """Use the biLM of `weights` (an `ElmoModel`, or one with its `ElmoCharTokenizer`; moved to the current Thinc
        device)."""
        elmo, tokenizer = weights if isinstance(weights, tuple) and len(weights) == 2 else (weights, None)
        if not isinstance(elmo, ElmoModel):
            raise TypeError(f"ELMo weights loaders must return an hf_elmo.ElmoModel (or one with its tokenizer), got "
                            f"{type(weights).__name__}")
        if elmo.config.character_vocabulary != "bytes" and getattr(tokenizer, "char_lexicon", None) is None:
            raise ValueError("this biLM reads characters through lexicons (ELMoForManyLangs'): its weights loader must "
                             "give its tokenizer too, as spacy-elmo.PretrainedWeights.v1 does")
        self._model = elmo.to(get_torch_default_device())
        self.tokenizer = tokenizer if elmo.config.character_vocabulary != "bytes" else None
        self.inference_cache.clear()
        self._decide_precision()

    def _decide_precision(self) -> None:
        """`precision`: what `mixed_precision` and `int8` give on the biLM's device, decided when the biLM is set,
        loaded or moved."""
        self.precision = Precision.of(self.device, self._mixed_precision, "int8" if self.int8 else None)

    def begin_update(self, inputs: ArgsKwargs) -> tuple[Any, Callable]:
        """Thinc's: the module in training mode (dropout on: the biLM is fine-tuned), under CUDA autocast with
        mixed precision (on a CPU, where torch declines CUDA autocast with a warning at every call, float32)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="User provided device_type of 'cuda', but CUDA is not available")
            return super().begin_update(inputs)

    def predict(self, inputs: ArgsKwargs) -> Any:
        """The biLM's outputs without gradient, in eval mode (no dropout). Unlike Thinc's `predict`, the module is
        never switched back to training mode afterwards: threads share it, and one thread's switch would turn
        dropout on inside another's forward. Fine-tuning (`begin_update`) switches it to training mode itself."""
        if self._model.training:
            self._model.eval()
        with torch.no_grad(), self.precision.autocast():
            return self._model(*inputs.args, **inputs.kwargs, inference_cache=self.inference_cache,
                               quantize=self.precision.quantize)

    def finish_update(self, optimizer) -> None:
        if self._model is None:
            return
        updated = any(parameter.grad is not None for parameter in self._model.parameters())
        super().finish_update(optimizer)
        if updated:
            # Thinc's optimizer may update the weights through NumPy views, unseen by the cache's checks.
            self.inference_cache.clear()

    def to_device(self, device_type: str, device_id: int) -> None:
        if self._model is not None:
            super().to_device(device_type, device_id)
            self._decide_precision()

    def _config_to_save(self) -> dict | None:
        """The biLM's config, and a lexicon model's lexicons (`tokenizer_lexicons`)."""
        if self._model is None:
            return None
        config = self._model.config.to_dict()
        if self.tokenizer is not None:
            config[LEXICONS_KEY] = {"char": self.tokenizer.char_lexicon.entries, "word": None if (
                self.tokenizer.word_lexicon is None) else self.tokenizer.word_lexicon.entries}
        return config

    def _restore_config(self, config: dict | None) -> None:
        """The biLM of a saved config, built on the meta device (no time spent on a random initialisation that the
        saved tensors overwrite), with its lexicons' tokenizer; or none."""
        self.inference_cache.clear()
        self.tokenizer = None
        if config is None:
            self._model = None
            return
        config = dict(config)
        lexicons = config.pop(LEXICONS_KEY, None)
        with torch.device("meta"):
            elmo = ElmoModel(ElmoConfig.from_dict(config))
        self._model = elmo.to_empty(device=get_torch_default_device()).eval()
        self._decide_precision()
        if lexicons is not None:
            self.tokenizer = ElmoCharTokenizer.with_lexicons(
                lexicons["char"], lexicons["word"], max_characters_per_token=elmo.config.max_characters_per_token)


# -- what flows between the layers --------------------------------------------------------------------------------


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


# -- the layers ---------------------------------------------------------------------------------------------------


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


def elmo_torch(
    name: str, mixed_precision: bool = False, grad_scaler: PyTorchGradScaler | None = None, int8: bool = False
) -> Model[list[Sentence], Floats4d]:
    """One batch of sentences → its biLM layers (n_layers + 1, rows, positions, width), float32: Thinc's PyTorch
    wrapper around the `ElmoModel` of an `ElmoShim` (its weights from `name` unless set or loaded otherwise)."""
    return Model(
        "elmo_torch",
        pytorch_forward,
        init=bilm_init,
        attrs={"convert_inputs": batch_to_torch, "convert_outputs": layers_from_torch},
        shims=[ElmoShim(name, mixed_precision=mixed_precision, grad_scaler=grad_scaler, int8=int8)],
    )


def batch_to_torch(model: Model, sentences: list[Sentence], is_train: bool) -> tuple[ArgsKwargs, Callable]:
    """The `ElmoBatch` of the sentences' words, on the biLM's device, as the model's keyword arguments."""
    shim: ElmoShim = model.shims[0]
    tokenizer = shim.tokenizer or char_tokenizer(shim.elmo.config.max_characters_per_token)
    # made on the host; the copy to a GPU does not wait for the device to finish what it is doing
    batch = tokenizer.batch([sentence.words for sentence in sentences]).to(model.shims[0].device, non_blocking=True)
    return ArgsKwargs(args=(), kwargs=dict(batch)), empty_backprop


def layers_from_torch(model: Model, inputs_outputs: tuple[Any, Any], is_train: bool) -> tuple[Floats4d, Callable]:
    _, output = inputs_outputs
    hidden = torch.stack(output.hidden_states).float()

    def get_d_hidden(d_layers: Floats4d) -> ArgsKwargs:
        return ArgsKwargs(args=((hidden,),), kwargs={"grad_tensors": (to_torch(d_layers),)})

    return to_xp(hidden, model.ops), get_d_hidden


def each_batch(layer: Model[list[Sentence], Floats4d]) -> Model[SentenceBatches, SentenceBatches]:
    """`layer` run on every batch of sentences, its outputs kept in order as the batches' `layers`. A prediction
    that runs out of device memory runs again in halves of the batch (`halve_on_out_of_memory`): the same layers."""
    return Model("elmo_each_batch", each_batch_forward, layers=[layer])


def each_batch_forward(model: Model, rows: SentenceBatches, is_train: bool) -> tuple[SentenceBatches, Callable]:
    layer = model.layers[0]
    if is_train:
        outputs = [_fine_tuning_pass(layer, batch) for batch in rows.batches]
    else:
        join = partial(_join_rows, model.ops)
        outputs = [(halve_on_out_of_memory(batch, layer.predict, join, _describe), empty_backprop)
                   for batch in rows.batches]

    def backprop(d_rows: SentenceBatches) -> SentenceBatches:
        for (_, backprop_batch), d_layers in zip(outputs, d_rows.layers):
            backprop_batch(d_layers)
        return replace(d_rows, layers=[])

    return replace(rows, layers=[layers for layers, _ in outputs]), backprop


def _fine_tuning_pass(layer: Model[list[Sentence], Floats4d], batch: list[Sentence]) -> tuple[Floats4d, Callable]:
    """`layer`'s forward in training; no memory for the batch is one clear error (its backward needs it whole)."""
    try:
        return layer(batch, True)
    except torch.cuda.OutOfMemoryError:
        positions = len(batch) * (max(len(sentence.words) for sentence in batch) + 2)
        raise OutOfDeviceMemoryError(
            f"fine-tuning the biLM on a batch of {len(batch)} sentences ({positions} padded positions) ran out of "
            "device memory: lower [components.elmo.model] max_batch_tokens, or freeze the biLM"
        ) from None


def _join_rows(ops: Any, parts: list[Floats4d]) -> Floats4d:
    """The layers (n_layers + 1, rows, positions, width) of consecutive parts of a batch as the batch's: rows one after
    the other, each part padded to the longest part's positions."""
    n_layers, _, _, width = parts[0].shape
    joined = ops.alloc((n_layers, sum(p.shape[1] for p in parts), max(p.shape[2] for p in parts), width),
                       dtype=parts[0].dtype)
    start = 0
    for part in parts:
        joined[:, start : start + part.shape[1], : part.shape[2]] = part
        start += part.shape[1]
    return joined


def _describe(sentence: Sentence) -> str:
    return f"a sentence of {len(sentence.words)} words"


def strip_boundaries() -> Model[SentenceBatches, SentenceBatches]:
    """Each batch's layers without the `<S>` and `</S>` positions: (…, positions, width) → (…, positions - 2,
    width); position j of a row is then its word j."""
    return Model("elmo_strip_boundaries", strip_boundaries_forward)


def strip_boundaries_forward(model: Model, rows: SentenceBatches, is_train: bool) -> tuple[SentenceBatches, Callable]:
    # Past a row's </S> there is padding: its positions stay, as any other padding; the first one is where </S> was.
    shapes = [layers.shape for layers in rows.layers]

    def backprop(d_rows: SentenceBatches) -> SentenceBatches:
        d_layers = []
        for shape, d_words in zip(shapes, d_rows.layers):
            d_full = model.ops.alloc(shape, dtype="f")
            d_full[:, :, 1:-1] = d_words
            d_layers.append(d_full)
        return replace(d_rows, layers=d_layers)

    return replace(rows, layers=[layers[:, :, 1:-1] for layers in rows.layers]), backprop


def to_docs() -> Model[SentenceBatches, list[Floats3d]]:
    """Every row's word vectors put at its tokens' places in its Doc's array (nL, n_tokens, nO); whitespace tokens
    keep zero rows."""
    return Model("elmo_to_docs", to_docs_forward, dims={"nO": None, "nL": None})


def to_docs_forward(model: Model, rows: SentenceBatches, is_train: bool) -> tuple[list[Floats3d], Callable]:
    ops = model.ops
    if not rows.doc_lengths:
        return [], lambda d_outputs: rows  # no Doc: no layers, no gradient
    # the widths of the biLM's arrays; the layer's own dimensions only where no Doc had a sentence for it
    n_layers, _, _, width = rows.layers[0].shape if rows.layers else (model.get_dim("nL"), 0, 0, model.get_dim("nO"))
    doc_starts = np.cumsum([0, *rows.doc_lengths])
    places = [_token_places(batch, doc_starts, ops) for batch in rows.batches]
    # One array of every Doc's tokens, filled by one gather per batch (a GPU gets a few kernels, never one per row).
    tokens = ops.alloc3f(n_layers, int(doc_starts[-1]), width)
    for (row, position, token), layers in zip(places, rows.layers):
        tokens[:, token] = layers[:, row, position]

    def backprop(d_outputs: list[Floats3d]) -> SentenceBatches:
        d_tokens = ops.xp.concatenate(d_outputs, axis=1) if d_outputs else tokens
        d_layers = []
        for (row, position, token), layers in zip(places, rows.layers):
            d_batch = ops.alloc(layers.shape, dtype="f")
            d_batch[:, row, position] = d_tokens[:, token]
            d_layers.append(d_batch)
        return replace(rows, layers=d_layers)

    return ops.xp.split(tokens, doc_starts[1:-1].tolist(), axis=1), backprop


def _token_places(batch: list[Sentence], doc_starts: np.ndarray, ops: Any) -> tuple[Any, Any, Any]:
    """Where each word of a batch is: its row and position in the batch's layers, and its token's place in the
    concatenation of the Docs (index arrays on `ops`' device, made on the host)."""
    lengths = [len(sentence.words) for sentence in batch]
    row = np.repeat(np.arange(len(batch), dtype="int32"), lengths)
    position = np.concatenate([np.arange(n, dtype="int32") for n in lengths])
    token = np.concatenate([s.tokens + doc_starts[s.doc] for s in batch]).astype("int32")
    return ops.asarray_i(row), ops.asarray_i(position), ops.asarray_i(token)


def empty_backprop(d_outputs: Any) -> list:
    """The backward of a step without gradient to pass on (its inputs are Docs or settings)."""
    return []


@lru_cache(maxsize=4)
def char_tokenizer(max_characters_per_token: int) -> ElmoCharTokenizer:
    return ElmoCharTokenizer(max_characters_per_token=max_characters_per_token)




# -- the biLM layer -----------------------------------------------------------------------------------------------


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


def bilm_init(model: Model, X: Any = None, Y: Any = None) -> None:
    """The weights from the shim's `name` unless set or loaded before, and the dimensions they give."""
    shim = elmo_shim(model)
    with _READING_WEIGHTS:
        if shim.elmo is None:
            if not shim.name:
                raise ValueError(NO_WEIGHTS_ERROR.format(component=shim.component))
            shim.set_elmo(load_pretrained(shim.name))
    set_dims(model, shim.elmo.config)


def set_dims(model: Model, config: ElmoConfig) -> None:
    """A biLM layer's dimensions, on each of its nodes that declares them."""
    for node in model.walk():
        if node.has_dim("nO") is not False and node.has_dim("nL") is not False:
            node.set_dim("nO", config.output_dim, force=True)
            node.set_dim("nL", config.num_output_layers, force=True)


def elmo_shim(model: Model) -> ElmoShim:
    """The `ElmoShim` (the `ElmoModel` in `.elmo`, and the inference cache) of a biLM layer or a model holding one."""
    for node in model.walk():
        for shim in node.shims:
            if isinstance(shim, ElmoShim):
                return shim
    raise ValueError(f"the model '{model.name}' holds no ELMo biLM")


def standalone_bilm(bilm: Model, freeze: bool = True, grad_factor: float = 1.0) -> Model[list[Doc], list[Floats3d]]:
    """A biLM owned by a downstream model (no `elmo` component): frozen, or fine-tuned with `grad_factor`."""
    return Model(
        "elmo_standalone_bilm",
        standalone_forward,
        init=standalone_init,
        layers=[bilm],
        dims={"nO": bilm.maybe_get_dim("nO"), "nL": bilm.maybe_get_dim("nL")},
        attrs={"freeze": freeze, "grad_factor": grad_factor},
    )


def standalone_init(model: Model, X: Any = None, Y: Any = None) -> None:
    bilm = model.layers[0]
    bilm.initialize(X=X)
    model.set_dim("nO", bilm.get_dim("nO"), force=True)
    model.set_dim("nL", bilm.get_dim("nL"), force=True)


def standalone_forward(model: Model, docs: Sequence[Doc], is_train: bool) -> tuple[list[Floats3d], Callable]:
    bilm = model.layers[0]
    if model.attrs["freeze"] or not is_train:
        return bilm.predict(docs), empty_backprop
    outputs, backprop_bilm = bilm(docs, is_train)
    grad_factor = model.attrs["grad_factor"]

    def backprop(d_outputs: list[Floats3d]) -> list:
        return backprop_bilm([d * grad_factor for d in d_outputs])

    return outputs, backprop
