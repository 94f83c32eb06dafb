"""How `ElmoEmbedder` and `elmo embed` embed: every setting checked once, in `EmbedSettings`, naming the one at fault
(`EmbedSettingError.setting`; the CLI names its flag)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..configuration_elmo import integer_problem
from ..kernel_plan import mode_problem

LAYER_MODES = ("all", "top", "average", "mix")
# One vector per sentence over its words (`formulas.pool_words`), after the layer choice; None: a vector per word.
POOLS = (None, "mean", "max")
# What the vectors are stored in: float32 (the biLM's), or float16 (half the size; float32 rounded to nearest).
DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class VectorLayout:
    """What an embedder gives and a writer stores per sentence: a vector of `token_shape` ((layers, width) or
    (width,)) per word, or with `pooled` one of that shape per sentence, in `dtype` ("float32" or "float16")."""

    token_shape: tuple[int, ...]
    pooled: bool = False
    dtype: str = "float32"

    def shape(self, words: int) -> tuple[int, ...]:
        """The shape of a sentence of `words` words: (layers, words, width), (words, width), or `token_shape`."""
        return self.token_shape if self.pooled else (*self.token_shape[:-1], words, self.token_shape[-1])


class EmbedSettingError(ValueError):
    """A bad setting of `ElmoEmbedder` / `elmo embed`; `setting` names it (the CLI names the flag that set it)."""

    def __init__(self, setting: str, message: str):
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = message


@dataclass(frozen=True)
class EmbedSettings:
    """How `ElmoEmbedder` embeds, checked once when made (see `ElmoEmbedder` for each field). `device` None: where
    the model is."""

    layers: str = "all"
    scalar_parameters: tuple[float, ...] | None = None
    gamma: float = 1.0
    batch_tokens: int = 4096
    buffer_tokens: int | None = None
    batch_size: int | None = None
    max_sentence_words: int = 1000
    device: torch.device | None = None
    bf16: bool = False
    quantize: str | None = None
    pool: str | None = None
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.layers not in LAYER_MODES:
            raise EmbedSettingError("layers", f"must be one of {', '.join(LAYER_MODES)}, got {self.layers!r}")
        if self.layers != "mix" and (self.scalar_parameters is not None or self.gamma != 1.0):
            raise EmbedSettingError("scalar_parameters" if self.scalar_parameters is not None else "gamma",
                                    "applies to layers='mix' only")
        if problem := mode_problem(self.bf16, self.quantize):
            raise EmbedSettingError("quantize", problem.removeprefix("quantize "))
        if self.pool not in POOLS:
            raise EmbedSettingError("pool", f'must be None, "mean" or "max", got {self.pool!r}')
        if self.dtype not in DTYPES:
            raise EmbedSettingError("dtype", f'must be "float32" or "float16", got {self.dtype!r}')
        for name in ("batch_tokens", "buffer_tokens", "batch_size", "max_sentence_words"):
            value = getattr(self, name)
            if value is not None and (problem := integer_problem(value, 1)):
                raise EmbedSettingError(name, problem)

    @staticmethod
    def device_of(device: str | torch.device | None) -> torch.device | None:
        """The device `device` names (`"cpu"`, `"cuda:1"`, ...), checked to exist here; None for None."""
        if device is None:
            return None
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise EmbedSettingError("device", str(error)) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EmbedSettingError("device", f"{device} was asked for, but this torch sees no CUDA device: run on the "
                                    "CPU (the default), or install a CUDA build of torch on a machine with a GPU")
        return device

    def check_model(self, config: Any) -> None:
        """Fail when the settings do not fit the biLM of `config` (an `ElmoConfig`)."""
        layers = config.num_output_layers
        if self.scalar_parameters is not None and len(self.scalar_parameters) != layers:
            raise EmbedSettingError("scalar_parameters", f"{len(self.scalar_parameters)} values given; the model has "
                                    f"{layers} layers (the token layer + {layers - 1} biLSTM layers)")
