"""The `elmo` pipeline component: runs the biLM, stores the layers on each Doc, feeds the listeners."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from itertools import islice
from typing import Any

import numpy as np
from spacy.attrs import ORTH, SENT_START
from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy.tokens import Doc
from spacy.training import Example, validate_examples, validate_get_examples
from spacy.vocab import Vocab
from thinc.api import Config, Model, Optimizer
from thinc.types import Floats3d

from hf_elmo import DEFAULT_MODEL_NAME
from hf_elmo.runtime import set_threads

from .layers import ElmoListener, elmo_shim, replace_listener, replace_listener_cfg
from .layers.types import empty_backprop
from .vectors import mixed_layers, register_extensions, restore_hooks

DEFAULT_CONFIG_STR = f"""
[model]
@architectures = "spacy-elmo.ElmoBiLM.v2"
name = "{DEFAULT_MODEL_NAME}"
max_batch_tokens = 4096
mixed_precision = false
grad_scaler_config = {{}}
int8 = false

[model.get_spans]
@misc = "spacy-elmo.sent_spans.v2"
max_length = 200
punct_chars = null
"""
DEFAULT_CONFIG = Config().from_str(DEFAULT_CONFIG_STR)
STORE_DTYPES = ("float32", "float16")

register_extensions()


@Language.factory(
    "elmo",
    assigns=["doc._.elmo_layers", "doc._.elmo_mix"],
    default_config={
        "model": DEFAULT_CONFIG["model"],
        "freeze": True,
        "store_dtype": "float32",
        "default_mix": [],
        "vector_hooks": True,
        "set_doc_tensor": False,
        "frozen_cache_mb": 2048,
    },
)
def make_elmo(
    nlp: Language,
    name: str,
    model: Model[list[Doc], list[Floats3d]],
    freeze: bool,
    store_dtype: str,
    default_mix: list[float],
    vector_hooks: bool,
    set_doc_tensor: bool,
    frozen_cache_mb: int,
) -> Elmo:
    """ELMo layers for every Doc (`doc._.elmo_layers`), shared with downstream components through listeners.

    model (Model): the biLM, `spacy-elmo.ElmoBiLM.v2`.
    freeze (bool): keep the biLM fixed in training (no autograd graph, no update); false fine-tunes it.
    store_dtype (str): "float32" or "float16" (half the memory) for `doc._.elmo_layers`.
    default_mix (list of float): layer weights of `token._.elmo_vector` and the vector hooks, used as given
        (e.g. [0, 0, 1] = top layer); [] = the uniform average. Task components learn their own mixes.
    vector_hooks (bool): make `.vector` and `.similarity` of Docs, spans and tokens use ELMo.
    set_doc_tensor (bool): also set `doc.tensor` to the default mix. Off by default: a later component that
        listens to a `tok2vec` reads `doc.tensor` and would get ELMo vectors of the wrong width.
    frozen_cache_mb (int): in training with a frozen biLM, keep the layers of the Docs seen, up to this many MB, and
        reuse them in later epochs instead of running the biLM again (a frozen biLM gives a Doc the same layers every
        time); 0 turns it off.
    """
    if not isinstance(nlp.__dict__.get("pipe"), partial):
        nlp.pipe = partial(pipe_with_vector_hooks, nlp)
    return Elmo(
        nlp.vocab, model, name, freeze=freeze, store_dtype=store_dtype, default_mix=default_mix,
        vector_hooks=vector_hooks, set_doc_tensor=set_doc_tensor, frozen_cache_mb=frozen_cache_mb,
    )


def pipe_with_vector_hooks(nlp: Language, texts: Iterable[Any], **options: Any) -> Iterator[Any]:
    """`nlp.pipe` of a pipeline with an `elmo` component: `Language.pipe`, and the Docs that come back from worker
    processes (`n_process` other than 1) get their ELMo vector hooks again. spaCy rebuilds those Docs from bytes,
    which keep `doc._.elmo_layers` but no hooks (explosion/spaCy#6402): without them `.vector` would be empty and
    `.similarity` 0."""
    outputs = type(nlp).pipe(nlp, texts, **options)
    hooks = options.get("n_process", 1) != 1 and any(
        isinstance(component, Elmo) and component.vector_hooks for _, component in nlp.pipeline)
    if not hooks:
        yield from outputs
        return
    for output in outputs:
        restore_hooks(output[0] if options.get("as_tuples") else output)
        yield output


class Elmo(TrainablePipe):
    """Runs the biLM on sentence spans (or windows) in length-sorted, token-bounded batches.

    Pretrained weights enter at `initialize` (`weights` loader, else the model's `name`) or, outside training,
    from `name` on first use; afterwards they are part of the pipeline and saved with it.
    """

    def __init__(
        self,
        vocab: Vocab,
        model: Model[list[Doc], list[Floats3d]],
        name: str = "elmo",
        *,
        freeze: bool = True,
        store_dtype: str = "float32",
        default_mix: Sequence[float] = (),
        vector_hooks: bool = True,
        set_doc_tensor: bool = False,
        frozen_cache_mb: int = 2048,
    ) -> None:
        if store_dtype not in STORE_DTYPES:
            raise ValueError(f"store_dtype must be one of {STORE_DTYPES}, got {store_dtype!r}")
        if frozen_cache_mb < 0:
            raise ValueError(f"frozen_cache_mb must be >= 0, got {frozen_cache_mb}")
        self.vocab = vocab
        self.model = model
        self.name = name
        self.freeze = freeze
        self.store_dtype = store_dtype
        self.default_mix = list(default_mix)
        self.vector_hooks = vector_hooks
        self.set_doc_tensor = set_doc_tensor
        self.frozen_cache = FrozenLayersCache(frozen_cache_mb * 2**20)
        self.listener_map: dict[str, list[ElmoListener]] = {}
        self.cfg: dict[str, Any] = {}
        self._process = os.getpid()
        # How Language.replace_listeners turns a listener into a standalone copy of this biLM (and its config).
        model.attrs["replace_listener"] = replace_listener
        model.attrs["replace_listener_cfg"] = partial(replace_listener_cfg, freeze=freeze)
        elmo_shim(model).component = name

    @property
    def is_trainable(self) -> bool:
        """Frozen, the biLM learns nothing: spaCy then neither calls `finish_update` nor logs a loss column for it
        (the listeners still get the layers: `update` runs for every component with an `update` method)."""
        return not self.freeze

    # -- listeners (spaCy's ListenedToComponent protocol) --------------------------------------------------
    @property
    def listeners(self) -> list[ElmoListener]:
        return [listener for name in self.listening_components for listener in self.listener_map[name]]

    @property
    def listening_components(self) -> list[str]:
        return list(self.listener_map)

    def add_listener(self, listener: ElmoListener, component_name: str) -> None:
        listeners = self.listener_map.setdefault(component_name, [])
        if listener not in listeners:
            listeners.append(listener)

    def remove_listener(self, listener: ElmoListener, component_name: str) -> bool:
        listeners = self.listener_map.get(component_name, [])
        if listener not in listeners:
            return False
        listeners.remove(listener)
        if not listeners:
            del self.listener_map[component_name]
        return True

    def find_listeners(self, component: Any) -> None:
        """Register the ELMo listeners in `component`'s model whose upstream is "*" or this component."""
        if isinstance(getattr(component, "model", None), Model):
            for node in component.model.walk():
                if isinstance(node, ElmoListener) and node.upstream_name in ("*", self.name):
                    self.add_listener(node, component.name)

    # -- prediction ---------------------------------------------------------------------------------------
    def predict(self, docs: Iterable[Doc]) -> list[Floats3d]:
        """Per Doc its layers (n_layers + 1, n_tokens, width)."""
        if os.getpid() != self._process:
            # In a worker process (`nlp.pipe(n_process=...)`): a forked child inheriting torch's OpenMP thread pool
            # can hang in its first torch op, and the workers share the cores; torch runs single-threaded there.
            set_threads(1)
            self._process = os.getpid()
        return self.model.predict(list(docs))

    def set_annotations(self, docs: Sequence[Doc], layers: list[Floats3d]) -> None:
        """Store each Doc's layers on the host, the default mix, and (as configured) hooks and `doc.tensor`."""
        for doc, array in zip(docs, self._host_arrays(layers)):
            mix = self.default_mix_weights(len(array))
            doc._.elmo_layers = array
            doc._.elmo_mix = mix
            if self.vector_hooks:
                restore_hooks(doc)
            if self.set_doc_tensor:
                doc.tensor = mixed_layers(array, mix)

    def _host_arrays(self, layers: list[Floats3d]) -> list[np.ndarray]:
        """The Docs' layers as host arrays of `store_dtype`; from a GPU in one copy (cast there first), each Doc then
        getting its own array."""
        ops = self.model.ops
        if ops.xp is np or not layers:
            return [array.astype(self.store_dtype, copy=False) for array in layers]
        starts = np.cumsum([array.shape[1] for array in layers])[:-1].tolist()
        host = ops.to_numpy(ops.xp.concatenate(layers, axis=1).astype(self.store_dtype, copy=False))
        return [array.copy() for array in np.split(host, starts, axis=1)]

    def default_mix_weights(self, n_layers: int) -> np.ndarray:
        """The fixed weights of `token._.elmo_vector`: `default_mix`, or the uniform average."""
        if not self.default_mix:
            return np.full(n_layers, 1.0 / n_layers, dtype="float32")
        if len(self.default_mix) != n_layers:
            raise ValueError(f"default_mix has {len(self.default_mix)} weights but the biLM has {n_layers} layers")
        return np.asarray(self.default_mix, dtype="float32")

    # -- training -----------------------------------------------------------------------------------------
    def update(
        self,
        examples: Iterable[Example],
        *,
        drop: float = 0.0,
        sgd: Optimizer | None = None,
        losses: dict[str, float] | None = None,
    ) -> dict[str, float]:
        """Run the biLM once on the batch and send the layers to every listener. Frozen: no autograd graph and
        no update; else the listeners' gradients are summed and backpropagated into the biLM."""
        losses = {} if losses is None else losses
        validate_examples(examples, "Elmo.update")
        losses.setdefault(self.name, 0.0)
        if not self.listeners:
            return losses
        docs = [eg.predicted for eg in examples]
        batch_id = ElmoListener.get_batch_id(docs)
        if self.freeze:
            outputs = self.frozen_cache.layers(docs, self.model.predict)
            for listener in self.listeners:
                listener.receive(batch_id, outputs, empty_backprop)
            return losses
        outputs, backprop_bilm = self.model.begin_update(docs)
        d_outputs = [self.model.ops.alloc3f(*output.shape) for output in outputs]
        squared = self.model.ops.alloc1f(1)  # the listeners' squared gradients, summed where they are (a GPU)

        def accumulate_gradient(one_d_outputs: list[Floats3d]) -> list:
            """Sum a listener's gradient in (all listeners but the last)."""
            for total, d in zip(d_outputs, one_d_outputs):
                total += d
                squared[:] += (d**2).sum()
            return []

        def backprop(one_d_outputs: list[Floats3d]) -> list:
            """The last listener's gradient: backpropagate the sum into the biLM; the loss read once per update."""
            accumulate_gradient(one_d_outputs)
            losses[self.name] += float(self.model.ops.to_numpy(squared)[0])
            backprop_bilm(d_outputs)
            if sgd is not None:
                self.finish_update(sgd)
            return []

        for listener in self.listeners[:-1]:
            listener.receive(batch_id, outputs, accumulate_gradient)
        self.listeners[-1].receive(batch_id, outputs, backprop)
        return losses

    def finish_update(self, sgd: Optimizer) -> None:
        if not self.freeze:
            self.model.finish_update(sgd)

    def get_loss(self, examples: Iterable[Example], scores: Any) -> None:
        """The component has no loss of its own: its gradients come from the listeners."""

    def add_label(self, label: str) -> int:
        raise NotImplementedError("the elmo component has no labels")

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Example]],
        *,
        nlp: Language | None = None,
        weights: Callable[[], Any] | None = None,
    ) -> None:
        """Load the pretrained biLM: from `weights` (`[initialize.components.elmo.weights]`, e.g.
        `spacy-elmo.PretrainedWeights.v1`), else from the model's `name`; raise if neither is given and the
        pipeline has no biLM yet. Then check that every listener matches the biLM's layers."""
        validate_get_examples(get_examples, "Elmo.initialize")
        self.frozen_cache.clear()
        if weights is not None:
            elmo_shim(self.model).set_elmo(weights())
        self.model.initialize(X=[eg.predicted for eg in islice(get_examples(), 10)])
        n_layers, width = self.model.get_dim("nL"), self.model.get_dim("nO")
        for component, listeners in self.listener_map.items():
            for listener in listeners:
                if (listener.get_dim("nL"), listener.get_dim("nO")) != (n_layers, width):
                    raise ValueError(
                        f"The ELMo listener of '{component}' expects {listener.get_dim('nL')} layers of width "
                        f"{listener.get_dim('nO')} but the biLM of '{self.name}' gives {n_layers} of width {width}: "
                        f"set the listener's `width = {width}` and its mix's `n_layers = {n_layers}`."
                    )


CACHE_KEY_ATTRS = [ORTH, SENT_START]


class FrozenLayersCache:
    """The layers of the Docs a frozen biLM has read in training, by the Doc's words and sentence starts, up to
    `max_bytes`; training-time state, never saved or pickled with the component."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._layers: dict[tuple, Floats3d] = {}

    def layers(self, docs: Sequence[Doc], predict: Callable[[list[Doc]], list[Floats3d]]) -> list[Floats3d]:
        """Per Doc its layers: cached, else from `predict` (one call for all the missing Docs)."""
        if not self.max_bytes:
            return predict(list(docs))
        keys = [doc.to_array(CACHE_KEY_ATTRS).tobytes() for doc in docs]  # the words and sentence starts
        missing = [i for i, key in enumerate(keys) if key not in self._layers]
        computed = dict(zip(missing, predict([docs[i] for i in missing]) if missing else []))
        for i, layers in computed.items():
            if self.bytes + layers.nbytes <= self.max_bytes and keys[i] not in self._layers:
                self._layers[keys[i]] = layers
                self.bytes += layers.nbytes
        return [computed[i] if i in computed else self._layers[key] for i, key in enumerate(keys)]

    def clear(self) -> None:
        self._layers.clear()
        self.bytes = 0

    def __getstate__(self) -> dict:
        return {"max_bytes": self.max_bytes, "bytes": 0, "_layers": {}}
