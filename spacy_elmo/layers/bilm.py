"""The biLM as a Thinc layer: Docs → per Doc an array (n_layers + 1, n_tokens, width) of ELMo layers.

Data flow: span getter (sentences or windows) → each span's non-whitespace tokens as words → spans sorted by
length and grouped into batches of at most `max_batch_tokens` padded positions → character ids (with `<S>`,
`</S>`) → `ElmoModel` in an `ElmoShim` → boundaries and padding dropped → rows scattered back to their Doc.
Whitespace tokens are not fed to the biLM (it never saw them in training); their rows are zeros.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import srsly
import torch
from spacy.tokens import Doc
from thinc.api import ArgsKwargs, Model, PyTorchGradScaler, PyTorchShim, get_torch_default_device, torch2xp, xp2torch
from thinc.types import Floats3d

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoInferenceCache, ElmoModel
from hf_elmo.kernels import native_bf16_cpu
from hf_elmo.text import length_batches

from ..span_getters import SpanGetter
from ..weights import load_pretrained

NO_WEIGHTS_ERROR = (
    "The ELMo biLM has no weights: its `name` is empty. Give its source: `\"default\"` (the English model shipped "
    "with the package), a directory or a Hub id, e.g. "
    "`nlp.add_pipe(\"elmo\", config={{\"model\": {{\"name\": \"<directory or Hub id>\"}}}})`, or in a training "
    "config `[components.{component}.model] name` or `[initialize.components.{component}.weights]` "
    "(e.g. `@misc = \"spacy-elmo.PretrainedWeights.v1\"`, `\"spacy-elmo.AllenNLPWeights.v1\"`; "
    "`\"spacy-elmo.RandomWeights.v1\"` for an untrained biLM in tests)."
)


class ElmoShim(PyTorchShim):
    """A `PyTorchShim` whose `ElmoModel` can be set after construction (at initialize or first use).

    Serialised as the biLM's `ElmoConfig` plus its tensors (msgpack, no pickle), so a pipeline directory holds
    everything needed to rebuild the biLM without its original source.

    `mixed_precision`: Thinc's CUDA autocast (float16) on a GPU; on a CPU, predictions under bf16 autocast (the
    biLM's opt-in bf16 mode, for CPUs with AMX / AVX512-BF16; a warning elsewhere), fine-tuning in float32.
    """

    def __init__(self, mixed_precision: bool = False, grad_scaler: PyTorchGradScaler | None = None):
        super().__init__(None, mixed_precision=mixed_precision, grad_scaler=grad_scaler)
        # Token representations and packed LSTM weights kept between the predictions of this biLM.
        self.inference_cache = ElmoInferenceCache()

    @property
    def elmo(self) -> ElmoModel | None:
        return self._model

    @property
    def device(self) -> torch.device:
        return get_torch_default_device() if self._model is None else super().device

    def set_elmo(self, elmo: ElmoModel) -> None:
        """Use `elmo` (moved to the current Thinc device)."""
        self._model = elmo.to(get_torch_default_device())
        self.inference_cache.clear()
        if self._cpu_bf16 and not native_bf16_cpu():
            warnings.warn("mixed_precision on a CPU runs the biLM in bf16, but this CPU has no native bf16 "
                          "(AVX512-BF16 or AMX): it is emulated, and slower than float32", stacklevel=2)

    @property
    def _cpu_bf16(self) -> bool:
        return self._mixed_precision and self.device.type == "cpu"

    def predict(self, inputs: ArgsKwargs) -> Any:
        """The biLM's outputs without gradient, in eval mode (no dropout). Unlike Thinc's `predict`, the module is
        never switched back to training mode afterwards: threads share it, and one thread's switch would turn
        dropout on inside another's forward. Fine-tuning (`begin_update`) switches it to training mode itself."""
        if self._model.training:
            self._model.eval()
        device = self.device.type
        dtype = torch.bfloat16 if device == "cpu" else torch.float16
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=self._mixed_precision):
            return self._model(*inputs.args, **inputs.kwargs)

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

    def to_bytes(self) -> bytes:
        if self._model is None:
            return srsly.msgpack_dumps({"config": None, "state": None})
        state = {name: tensor.detach().cpu().numpy() for name, tensor in self._model.state_dict().items()}
        return srsly.msgpack_dumps({"config": self._model.config.to_dict(), "state": state})

    def from_bytes(self, bytes_data: bytes) -> ElmoShim:
        msg = srsly.msgpack_loads(bytes_data)
        if msg["config"] is None:
            self._model = None
            return self
        # Built on the meta device: no time spent on a random initialisation that is overwritten at once.
        with torch.device("meta"):
            elmo = ElmoModel(ElmoConfig.from_dict(msg["config"]))
        elmo.to_empty(device=get_torch_default_device())
        elmo.load_state_dict({name: torch.from_numpy(np.array(array)) for name, array in msg["state"].items()})
        self.set_elmo(elmo.eval())
        self._grad_scaler.to_(self.device)
        return self


@dataclass(frozen=True)
class BiLMSettings:
    """Run-time settings of the biLM layer. Kept in one object that msgpack cannot serialise, on purpose:
    Thinc restores serialisable attrs from disk, and these must come from the (possibly edited) config."""

    name: str
    get_spans: SpanGetter
    max_batch_tokens: int


@dataclass
class _Segment:
    """One biLM row: the Doc it belongs to, its tokens' indices in that Doc and their texts."""

    doc: int
    tokens: np.ndarray
    words: list[str]

    def index(self, model: Model) -> slice | Any:
        """The row's positions in its Doc's arrays: a slice, or indices on the model's device when whitespace
        tokens were left out."""
        first, last = int(self.tokens[0]), int(self.tokens[-1])
        if last - first + 1 == len(self.tokens):
            return slice(first, last + 1)
        return model.ops.asarray_i(self.tokens)


def build_bilm(
    name: str,
    get_spans: SpanGetter,
    max_batch_tokens: int = 4096,
    mixed_precision: bool = False,
    grad_scaler_config: dict | None = None,
) -> Model[list[Doc], list[Floats3d]]:
    """The biLM layer; `name` (directory or Hub id) is read only if no weights were set or loaded before use."""
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    grad_scaler = PyTorchGradScaler(**{"enabled": mixed_precision, **(grad_scaler_config or {})})
    return Model(
        "elmo_bilm",
        bilm_forward,
        init=bilm_init,
        dims={"nO": None, "nL": None},
        attrs={"settings": BiLMSettings(name, get_spans, max_batch_tokens)},
        shims=[ElmoShim(mixed_precision=mixed_precision, grad_scaler=grad_scaler)],
    )


def set_bilm_weights(model: Model, elmo: ElmoModel) -> None:
    """Put `elmo` into the biLM layer `model` and set its dimensions."""
    if not isinstance(elmo, ElmoModel):
        raise TypeError(f"ELMo weights loaders must return an hf_elmo.ElmoModel, got {type(elmo).__name__}")
    model.shims[0].set_elmo(elmo)
    model.set_dim("nO", elmo.config.output_dim, force=True)
    model.set_dim("nL", elmo.config.num_output_layers, force=True)


def bilm_weights(model: Model, component: str = "elmo") -> ElmoModel:
    """The biLM of the layer `model`, loaded from its `name` on first use if it has none yet."""
    shim: ElmoShim = model.shims[0]
    if shim.elmo is None:
        name = model.attrs["settings"].name
        if not name:
            raise ValueError(NO_WEIGHTS_ERROR.format(component=component))
        set_bilm_weights(model, load_pretrained(name))
    return shim.elmo


def bilm_init(model: Model, X: Any = None, Y: Any = None) -> None:
    bilm_weights(model)


def bilm_forward(model: Model, docs: Sequence[Doc], is_train: bool) -> tuple[list[Floats3d], Callable]:
    elmo = bilm_weights(model)
    settings: BiLMSettings = model.attrs["settings"]
    config = elmo.config
    outputs = [model.ops.alloc3f(config.num_output_layers, len(doc), config.output_dim) for doc in docs]
    segments = list(_segments(docs, settings.get_spans))
    tokenizer = char_tokenizer(config.max_characters_per_token)
    callbacks = []
    for indices in length_batches([len(segment.words) for segment in segments], settings.max_batch_tokens):
        batch = [segments[i] for i in indices]
        ids = tokenizer.batch_char_ids([segment.words for segment in batch])
        hidden, backprop_batch = _run_batch(model.shims[0], ids, is_train)
        hidden = torch2xp(hidden, ops=model.ops)  # (layers, rows, positions, width)
        for row, segment in enumerate(batch):
            outputs[segment.doc][:, segment.index(model)] = hidden[:, row, 1 : 1 + len(segment.tokens)]
        callbacks.append((batch, hidden.shape, backprop_batch))

    def backprop(d_outputs: list[Floats3d]) -> list:
        for batch, shape, backprop_batch in callbacks:
            d_hidden = model.ops.alloc(shape, dtype="f")
            for row, segment in enumerate(batch):
                d_hidden[:, row, 1 : 1 + len(segment.tokens)] = d_outputs[segment.doc][:, segment.index(model)]
            backprop_batch(d_hidden)
        return []

    return outputs, backprop


@lru_cache(maxsize=4)
def char_tokenizer(max_characters_per_token: int) -> ElmoCharTokenizer:
    return ElmoCharTokenizer(max_characters_per_token=max_characters_per_token)


def _segments(docs: Sequence[Doc], get_spans: SpanGetter) -> Iterator[_Segment]:
    for doc_index, spans in enumerate(get_spans(list(docs))):
        for span in spans:
            tokens = [token for token in span if not token.is_space]
            if tokens:
                indices = np.fromiter((token.i for token in tokens), dtype="int32", count=len(tokens))
                yield _Segment(doc_index, indices, [token.text for token in tokens])


def _run_batch(shim: ElmoShim, ids: np.ndarray, is_train: bool) -> tuple[torch.Tensor, Callable]:
    """The stacked biLM layers (layers, rows, positions, width) as float32, and their backprop."""
    input_ids = torch.as_tensor(ids, device=shim.device)
    if not is_train:
        inputs = ArgsKwargs(args=(input_ids,), kwargs={"inference_cache": shim.inference_cache})
        return torch.stack(shim.predict(inputs).hidden_states).float(), _no_backprop
    output, backprop_torch = shim.begin_update(ArgsKwargs(args=(input_ids,), kwargs={}))
    hidden = torch.stack(output.hidden_states).float()

    def backprop(d_hidden) -> None:
        grads = xp2torch(d_hidden, device=hidden.device)
        backprop_torch(ArgsKwargs(args=((hidden,),), kwargs={"grad_tensors": (grads,)}))

    return hidden, backprop


def _no_backprop(d_hidden) -> None:
    return None


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
        return bilm.predict(docs), _no_backprop
    outputs, backprop_bilm = bilm(docs, is_train)
    grad_factor = model.attrs["grad_factor"]

    def backprop(d_outputs: list[Floats3d]) -> list:
        return backprop_bilm([d * grad_factor for d in d_outputs])

    return outputs, backprop
