"""Where a biLM comes from, for every entry point: the `elmo` CLI, `ElmoEmbedder` and the spaCy component and
weights loaders all name a model the same way, load it through `load_model`, and fail with the same one-line
`ModelLoadError` (what is wrong, which file or name, what to do).

A model name is one of:
- `"default"`: the English biLM shipped inside the package (`DEFAULT_MODEL`), offline;
- a published ELMo model (`PUBLISHED_MODELS`: `original`, `original-5.5b`, `medium`, `small`, `pubmed`, and
  ELMoForManyLangs' `efml-<language>`, e.g. `efml-de`): downloaded from AllenNLP's URLs or the NLPL repository and
  converted on first use, then read from the Hugging Face cache (also offline);
- a `save_pretrained` directory (written by `elmo convert`, `elmo pretrain` or `save_pretrained`);
- a Hugging Face Hub id `org/name`: downloaded once, then read from the Hugging Face cache (also offline).

Weights are read from safetensors only: a directory holding only a pickled `pytorch_model.bin` is refused, as
unpickling can run code.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from huggingface_hub import try_to_load_from_cache
from huggingface_hub.constants import is_offline_mode
from safetensors import SafetensorError
from transformers import PreTrainedModel
from transformers.utils import logging as transformers_logging

from . import efml_format, original_format
from .configuration_elmo import ElmoConfig
from .formats import FormatError, Sources, WeightFormat
from .modeling_elmo import ElmoModel
from .names import DEFAULT_MODEL_NAME
from .published import (
    ALLENNLP_MODELS,
    PUBLISHED_MODELS,
    PublishedModelError,
    names_text,
    published_model,
    published_name,
)
from .tokenization_elmo import ElmoCharTokenizer

# The English biLM shipped inside the package (see its README.md), a save_pretrained directory; its name is in
# `names.py`.
DEFAULT_MODEL = str(Path(__file__).parent / "default_model")
MODEL_NAMES = (DEFAULT_MODEL_NAME, *PUBLISHED_MODELS)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# The text files of a model directory, read as UTF-8 (JSON for .json) before transformers reads them.
TEXT_FILES = ("config.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt")
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")

Model = TypeVar("Model", bound=PreTrainedModel)
# The formats original biLMs come in (`formats.WeightFormat`), in the order `format_of` tries them.
FORMATS: tuple[WeightFormat, ...] = (original_format.FORMAT, efml_format.FORMAT)


def format_of(sources: Sources) -> WeightFormat:
    """The format whose model `sources` are (`FORMATS`, first match); `FormatError` in one line saying what each
    format takes."""
    for weight_format in FORMATS:
        if weight_format.detect(sources):
            return weight_format
    missing = [str(source) for source in sources if not Path(source).exists()]
    found = f"{', '.join(missing)} does not exist" if missing else "is not a model of a format this package reads"
    expected = "; or ".join(f"{f.usage} ({f.name})" for f in FORMATS)
    raise FormatError(f"{' '.join(map(str, sources))}: {found}; expected {expected}, where an ELMoForManyLangs model "
                      f"holds {', '.join(efml_format.MODEL_FILES)}")


class ModelLoadError(ValueError):
    """A model name, directory or file that gives no biLM; the message is one line saying what to do."""


def model_location(name: str | os.PathLike, progress: bool = True) -> str:
    """What `from_pretrained` loads for a model name: `DEFAULT_MODEL` for `"default"`, the converted directory of a
    published model (downloaded and converted on first use; `progress`: bars on stderr), else `name` unchanged (a
    directory or Hub id; `resolve_model` also checks it). E.g. `AutoModel.from_pretrained(model_location("original"))`.
    """
    if str(name) == DEFAULT_MODEL_NAME:
        return DEFAULT_MODEL
    if str(name) in PUBLISHED_MODELS:
        try:
            return published_model(str(name), progress)
        except PublishedModelError as error:
            raise ModelLoadError(str(error)) from None
    return str(name)


def resolve_model(name: str | os.PathLike, revision: str | None = None, weights: bool = True) -> str:
    """The directory or Hub id to load for `name`, checked before anything is read: a directory must be a readable
    `save_pretrained` directory of an ELMo biLM (with its weights, unless `weights=False`); a Hub id must be cached
    when the Hub is offline."""
    if not str(name).strip():
        raise ModelLoadError("no model given: name `default` (the English model shipped with the package), a "
                             f"published model ({names_text()}), a save_pretrained directory or a "
                             "Hub id (org/name)")
    location = Path(model_location(name)).expanduser()
    if location.is_dir():
        check_model_directory(location, weights)
        return str(location)
    if location.exists():
        raise ModelLoadError(f"{name} is a file; expected a save_pretrained directory (config.json, "
                             "model.safetensors, ...), `default` or a Hub id (org/name)")
    text = str(name)
    check_model_name(text)
    if not HUB_ID.fullmatch(text) or location.is_absolute() or text.startswith((".", "~")):
        raise ModelLoadError(f"model directory {name} does not exist")
    cached = try_to_load_from_cache(text, "config.json", revision=revision)
    if is_offline_mode() and not isinstance(cached, str):
        raise ModelLoadError(f"{text} is not in the Hugging Face cache and the Hub is offline (HF_HUB_OFFLINE=1): "
                             "download it once online, or give a local directory")
    return text


def check_model_name(name: str | os.PathLike) -> None:
    """Fail at once on a name that can never give a model: not `default`, a published model, a path (a directory,
    maybe made later) nor a Hub id (org/name). Reads and downloads nothing; `resolve_model` checks the rest."""
    text = str(name)
    if text in MODEL_NAMES or "/" in text or os.sep in text or text.startswith((".", "~")) or Path(text).exists():
        return
    close = difflib.get_close_matches(text, MODEL_NAMES, n=1)
    raise ModelLoadError(
        f"unknown model {text!r}: not a directory, nor {DEFAULT_MODEL_NAME}, {names_text()}"
        + (f" (did you mean {close[0]!r}?)" if close else "") + "; a Hub model is named org/name"
    )


def check_model_directory(directory: Path, weights: bool = True) -> None:
    """Fail on a directory that is not a readable `save_pretrained` directory of an ELMo biLM with safetensors
    weights (unless `weights=False`: the config alone), naming the file at fault."""
    if not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"{directory} has no config.json: it is not a save_pretrained directory of a biLM (original options.json "
            "+ weights.hdf5: convert them with `elmo convert`)"
        )
    for name in TEXT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        try:
            text = path.read_bytes().decode("utf-8")
            if path.suffix == ".json":
                json.loads(text)
        except UnicodeDecodeError as error:
            raise ModelLoadError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}): the model "
                                 "directory is damaged; save or download it again") from None
        except json.JSONDecodeError as error:
            raise ModelLoadError(f"{path} is not valid JSON ({error}): the model directory is damaged; save or "
                                 "download it again") from None
        except OSError as error:
            raise ModelLoadError(f"{path} cannot be read: {error.strerror or error}") from None
    model_type = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type")
    if model_type != ElmoConfig.model_type:
        raise ModelLoadError(f"{directory} holds a {model_type or 'untyped'} model (config.json model_type "
                             f"{model_type!r}), not an ELMo biLM")
    if weights and not any((directory / name).is_file() for name in WEIGHTS_FILES):
        pickled = [name for name in PICKLED_WEIGHTS if (directory / name).is_file()]
        if pickled:
            raise ModelLoadError(
                f"{directory} holds its weights as {pickled[0]}, a pickle, which is never loaded (unpickling can run "
                "code): save the model with save_pretrained (model.safetensors), from a program you trust"
            )
        raise ModelLoadError(f"{directory} has no model.safetensors: the weights are missing")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Keep transformers' "Loading weights" progress bars out of the output while loading."""
    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def _loading_error(name: str | os.PathLike, what: str, error: Exception) -> ModelLoadError:
    message = " ".join(str(error).split()) or type(error).__name__
    if len(message) > 300:  # transformers' multi-line reports: their first sentence says what failed
        message = message[:300].rsplit(" ", 1)[0] + " ..."
    return ModelLoadError(f"cannot load the {what} of {name}: {message}")


# What a model directory or download that passed `resolve_model` can still raise: missing or unreadable files,
# a config whose values are invalid, weights that do not fit config.json, a damaged safetensors file.
LOAD_ERRORS = (OSError, ValueError, RuntimeError, SafetensorError, KeyError)


def load_config(name: str | os.PathLike, revision: str | None = None) -> ElmoConfig:
    """The `ElmoConfig` of a model name (see the module docstring); the weights need not be there."""
    return _config_at(resolve_model(name, revision, weights=False), name, revision)


def _config_at(location: str, name: str | os.PathLike, revision: str | None) -> ElmoConfig:
    """The config of `name`, resolved to `location` (`resolve_model`)."""
    try:
        settings, _ = ElmoConfig.get_config_dict(location, revision=revision)
        if settings.get("model_type") != ElmoConfig.model_type:
            raise ModelLoadError(f"{name} holds a {settings.get('model_type') or 'untyped'} model, not an ELMo biLM")
        return ElmoConfig.from_dict(settings)
    except ModelLoadError:
        raise
    except LOAD_ERRORS as error:
        raise _loading_error(name, "config", error) from None


def load_model(
    name: str | os.PathLike, model_class: type[Model] | None = None, revision: str | None = None, **kwargs
) -> Model:
    """`model_class.from_pretrained` (default `ElmoModel`, which also reads the encoder of a biLM trained with a
    softmax) of a model name, from safetensors weights only, quietly, in eval mode. As with `from_pretrained`,
    `kwargs` naming config fields (e.g. `dropout=0.2`) override the saved config."""
    return _model_at(resolve_model(name, revision), name, model_class, revision, **kwargs)


def _model_at(
    location: str, name: str | os.PathLike, model_class: type[Model] | None, revision: str | None, **kwargs
) -> Model:
    """`load_model` of `name`, resolved to `location`."""
    config = kwargs.pop("config", None) or _config_at(location, name, revision)
    overrides = {key: kwargs.pop(key) for key in list(kwargs) if hasattr(config, key)}  # as from_pretrained does
    if overrides:
        config = ElmoConfig.from_dict({**config.to_dict(), **overrides})
    kwargs["config"] = config
    try:
        with quiet_transformers():
            return (model_class or ElmoModel).from_pretrained(
                location, revision=revision, use_safetensors=True, **kwargs
            ).eval()
    except LOAD_ERRORS as error:
        raise _loading_error(name, "weights", error) from None


def load_model_and_tokenizer(
    name: str | os.PathLike, model_class: type[Model] | None = None, revision: str | None = None
) -> tuple[Model, ElmoCharTokenizer]:
    """`load_model` and `load_tokenizer` of a model name, resolved (found, downloaded or converted, and checked)
    once."""
    location = resolve_model(name, revision)
    return _model_at(location, name, model_class, revision), _tokenizer_at(location, name, revision)


def load_original(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> ElmoModel:
    """The `ElmoModel` (eval mode) of an original `options.json` + `weights.hdf5` pair (AllenNLP's and bilm-tf's
    format, converted in memory; needs h5py), or of a published model's URLs (its converted copy in the cache)."""
    published = published_name(options_file, weight_file)
    if published is not None:
        return load_model(published)
    if any(str(path).startswith(("http://", "https://")) for path in (options_file, weight_file)):
        raise ModelLoadError(f"{options_file} and {weight_file} are not a published model's URLs "
                             f"({', '.join(ALLENNLP_MODELS)}): download them and give the files")
    return original_format.FORMAT.load([options_file, weight_file])[0]


def load_tokenizer(name: str | os.PathLike, revision: str | None = None) -> ElmoCharTokenizer:
    """The `ElmoCharTokenizer` saved with a model (its word tokenizer and character slots)."""
    return _tokenizer_at(resolve_model(name, revision), name, revision)


def _tokenizer_at(location: str, name: str | os.PathLike, revision: str | None) -> ElmoCharTokenizer:
    try:
        return ElmoCharTokenizer.from_pretrained(location, revision=revision)
    except LOAD_ERRORS as error:
        raise _loading_error(name, "tokenizer", error) from None


__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_NAME",
    "FORMATS",
    "MODEL_NAMES",
    "ModelLoadError",
    "check_model_directory",
    "format_of",
    "load_config",
    "load_model",
    "load_model_and_tokenizer",
    "load_original",
    "load_tokenizer",
    "model_location",
    "quiet_transformers",
    "resolve_model",
]
