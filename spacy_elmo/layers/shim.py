"""The biLM's weights in a Thinc model: `ElmoShim` (the `ElmoModel`, its precision, its serialisation), the layer
`init` that reads the weights (`bilm_init`) and sets the dimensions they give, and `elmo_shim`, the shim of a model
that holds one."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
from thinc.api import ArgsKwargs, Model, PyTorchGradScaler, get_torch_default_device

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoInferenceCache, ElmoModel
from hf_elmo.kernel_plan import Precision

from ..weights import Weights, load_pretrained
from .pytorch import TorchShim

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


@lru_cache(maxsize=4)
def char_tokenizer(max_characters_per_token: int) -> ElmoCharTokenizer:
    return ElmoCharTokenizer(max_characters_per_token=max_characters_per_token)


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
