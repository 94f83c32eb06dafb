"""Registered weight loaders for `[initialize.components.elmo] weights`: the only way pretrained weights enter a
pipeline at training time. Each returns a callable that builds the biLM when `initialize` runs, so resolving a
config (`spacy debug config`, `spacy.load`) never reads the weights.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from confection import ConfigValidationError
from spacy.util import SimpleFrozenDict, registry

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoModel, ModelLoadError, load_model, load_tokenizer
from hf_elmo.loading import check_model_name, load_original

# What a weights loader gives: the biLM, with its tokenizer where the biLM reads characters through lexicons
# (ELMoForManyLangs' models: the tokenizer holds them).
Weights = ElmoModel | tuple[ElmoModel, ElmoCharTokenizer]
WeightsLoader = Callable[[], Weights]
# Where a pipeline's config names its biLM, for the errors about that name.
CONFIG_SETTINGS = (" (the biLM's `name` in the pipeline config: [components.<elmo>.model] name, or "
                   "[initialize.components.<elmo>.weights] name; `paths.elmo_model` in the shipped configs)")
NO_SETTINGS = SimpleFrozenDict()


class BiLMNameError(ConfigValidationError, ModelLoadError):
    """A biLM named in a pipeline config that gives no model: a `ModelLoadError` (one line, from the Python API), and a
    `ConfigValidationError`, which spaCy's commands (`spacy train`, `spacy debug config`, ...) print as one line and
    exit 1, where any other error would be a traceback."""

    @classmethod
    def naming_the_settings(cls, error: ModelLoadError) -> BiLMNameError:
        """`error`'s message, with the config settings that give the name."""
        return cls(title=f"{error}{CONFIG_SETTINGS}", show_config=False)

    def __str__(self) -> str:
        return self.title  # the one line (a ConfigValidationError's text starts with blank lines)


def load_pretrained(name: str | Path | None, revision: str | None = None) -> Weights:
    """A biLM from a local `save_pretrained` directory (e.g. written by `elmo convert`), a Hub id, or `"default"`:
    the English model shipped inside the package (`hf_elmo.DEFAULT_MODEL`); a biLM that reads characters through
    lexicons (ELMoForManyLangs') with its tokenizer. A bad name fails with a one-line `BiLMNameError` that names the
    config settings that give it."""
    if not name:
        raise ValueError(
            "spacy-elmo.PretrainedWeights.v1 has no `name`: give the biLM's directory or Hub id (or \"default\"), "
            "e.g. `--paths.elmo_model path/to/converted-elmo` with the shipped configs."
        )
    try:
        model = load_model(name, revision=revision)
        if model.config.character_vocabulary == "bytes":
            return model
        return model, load_tokenizer(name, revision=revision)
    except ModelLoadError as error:
        raise BiLMNameError.naming_the_settings(error) from None


def check_pretrained_name(name: str | Path) -> None:
    """Fail when the pipeline is made, not at its first Doc, on a biLM name that can never give a model
    (`hf_elmo.loading.check_model_name`: nothing is read or downloaded)."""
    try:
        check_model_name(name)
    except ModelLoadError as error:
        raise BiLMNameError.naming_the_settings(error) from None


def random_bilm(preset: str | None = "small", config: dict[str, Any] | None = None, seed: int = 0) -> ElmoModel:
    """A randomly initialised biLM: a preset's architecture with `config` overrides, or `config` alone."""
    settings = dict(config or {})
    elmo_config = ElmoConfig.from_preset(preset, **settings) if preset else ElmoConfig(**settings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ElmoModel(elmo_config).eval()


@registry.misc("spacy-elmo.PretrainedWeights.v1")
def configure_pretrained_weights(name: str | None, revision: str | None = None) -> WeightsLoader:
    """Weights of a converted biLM.

    name (str): a local directory written by `elmo convert` / `save_pretrained`, or a Hugging Face Hub id.
    revision (str or None): a Hub branch, tag or commit.
    """
    if name:
        check_pretrained_name(name)
    return partial(load_pretrained, name, revision)


@registry.misc("spacy-elmo.AllenNLPWeights.v1")
def configure_allennlp_weights(options_file: str, weight_file: str) -> WeightsLoader:
    """Weights of an original AllenNLP / bilm-tf biLM, converted when `initialize` runs (needs h5py).

    options_file (str): the `options.json` (or a published model's URL, e.g. AllenNLP's defaults).
    weight_file (str): the `weights.hdf5` (or a published model's URL).
    """
    return partial(load_original, options_file, weight_file)


@registry.misc("spacy-elmo.RandomWeights.v1")
def configure_random_weights(
    preset: str | None = "small", config: dict[str, Any] = NO_SETTINGS, seed: int = 0
) -> WeightsLoader:
    """A randomly initialised biLM: for tests and benchmarks, never for real use.

    preset (str or None): "original", "medium" or "small", or null to give the whole architecture in `config`.
    config (dict): `ElmoConfig` fields overriding the preset.
    seed (int): the random seed of the initialisation.
    """
    return partial(random_bilm, preset, dict(config), seed)
