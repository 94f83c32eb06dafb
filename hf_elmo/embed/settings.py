"""How `ElmoEmbedder` and `elmo embed` embed: every setting checked once, in `EmbedSettings`, naming the one at fault
(`EmbedSettingError.setting`; the CLI names its flag)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from ..configuration_elmo import integer_problem

LAYER_MODES = ("all", "top", "average", "mix")


class EmbedSettingError(ValueError):
    """A bad setting of `ElmoEmbedder` / `elmo embed`; `setting` names it (the CLI names the flag that set it)."""

    def __init__(self, setting: str, message: str):
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = message


@dataclass(frozen=True)
class EmbedSettings:
    """How `ElmoEmbedder` embeds, checked once when made (see `ElmoEmbedder` for each field). `device` None: where
    the model is; `options_file` and `weight_file` (together): the original weights, instead of a model."""

    layers: str = "all"
    scalar_parameters: tuple[float, ...] | None = None
    gamma: float = 1.0
    batch_tokens: int = 4096
    buffer_tokens: int | None = None
    batch_size: int | None = None
    max_sentence_words: int = 1000
    device: torch.device | None = None
    bf16: bool = False
    options_file: str | os.PathLike | None = None
    weight_file: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if self.layers not in LAYER_MODES:
            raise EmbedSettingError("layers", f"must be one of {', '.join(LAYER_MODES)}, got {self.layers!r}")
        if self.layers != "mix" and (self.scalar_parameters is not None or self.gamma != 1.0):
            raise EmbedSettingError("scalar_parameters" if self.scalar_parameters is not None else "gamma",
                                    "applies to layers='mix' only")
        for name in ("batch_tokens", "buffer_tokens", "batch_size", "max_sentence_words"):
            value = getattr(self, name)
            if value is not None and (problem := integer_problem(value, 1)):
                raise EmbedSettingError(name, problem)
        if (self.options_file is None) != (self.weight_file is None):
            raise EmbedSettingError("options_file/weight_file", "give both (the original ELMo weights: options.json "
                                    "and the .hdf5 weights), or neither")

    @property
    def original_weights(self) -> tuple[str | os.PathLike, str | os.PathLike] | None:
        """(options.json, .hdf5 weights) as given (paths, or a published model's URLs) when the original weights are
        to be embedded with, else None."""
        return None if self.options_file is None else (self.options_file, self.weight_file)

    @staticmethod
    def device_of(device: str | torch.device | None, cuda_device: int | None = None) -> torch.device | None:
        """The device of `device` (`"cpu"`, `"cuda:1"`, ...) or AllenNLP's `cuda_device` (-1: the CPU, n: `cuda:n`),
        checked to exist here."""
        if device is not None and cuda_device is not None:
            raise EmbedSettingError("device/cuda_device", "give one of them, not both")
        if cuda_device is not None:
            device, setting = ("cpu" if cuda_device < 0 else f"cuda:{cuda_device}"), "cuda_device"
        else:
            setting = "device"
        if device is None:
            return None
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise EmbedSettingError(setting, str(error)) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EmbedSettingError(setting, f"{device} was asked for, but this torch sees no CUDA device: run on the "
                                    "CPU (the default), or install a CUDA build of torch on a machine with a GPU")
        return device

    def check_model(self, config: Any) -> None:
        """Fail when the settings do not fit the biLM of `config` (an `ElmoConfig`)."""
        layers = config.num_output_layers
        if self.scalar_parameters is not None and len(self.scalar_parameters) != layers:
            raise EmbedSettingError("scalar_parameters", f"{len(self.scalar_parameters)} values given; the model has "
                                    f"{layers} layers (the token layer + {layers - 1} biLSTM layers)")
