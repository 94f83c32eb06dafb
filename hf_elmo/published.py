"""The published ELMo biLMs by name, downloaded on first use, converted once, then read offline from the Hugging Face
cache: AllenNLP's `options.json` + `weights.hdf5` pairs (`original`, ...), and ELMoForManyLangs' 44 languages
(`efml-de`, `efml-zh`, ...: one .zip each from the NLPL vectors repository, `ELMO_EFML_ENDPOINT` replacing its base
URL).

`published_model("original")` (and every entry point that takes a model name: `elmo embed original ...`,
`ElmoEmbedder("original")`, `load_model("original")`, the spaCy config's `elmo_model = "original"`) gives the
converted `save_pretrained` directory `<HF_HUB_CACHE>/elmo-published/<name>/converted`. On first use the two files
are downloaded with a progress bar into `<name>/download/` (resumed from a partial `.incomplete` file; the size is
checked against the server's, and the SHA-256 where this table knows it), converted, and the weights file removed
(the converted directory holds the same numbers). Processes share the cache under a file lock. Offline
(`HF_HUB_OFFLINE=1`) a converted model is used as is; one that is not there yet is a one-line `ModelLoadError` naming
the URLs and `elmo convert`. `ELMO_PUBLISHED_ENDPOINT` replaces AllenNLP's base URL (a mirror).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from filelock import FileLock
from huggingface_hub import constants
from huggingface_hub.constants import is_offline_mode
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import hf_raise_for_status, http_backoff
from huggingface_hub.utils.sha import sha_fileobj
from tqdm.auto import tqdm

from . import efml_format, original_format
from .formats import WeightFormat

ENDPOINT = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo"
# The same files as AllenNLP 1.x/2.x name them (the bucket's virtual-hosted address).
ALLENNLP_ENDPOINTS = (ENDPOINT, "https://allennlp.s3.amazonaws.com/models/elmo")

# The 44 published models (the NLPL vectors repository, as `elmoformanylangs`' README lists them): language code (ISO
# 639-1, else 639-3) -> (the repository's model id, the language). This project names each `efml-<code>`.
NLPL_ENDPOINT = "http://vectors.nlpl.eu/repository/11"
LANGUAGES = {
    "ar": (136, "Arabic"), "bg": (137, "Bulgarian"), "ca": (138, "Catalan"), "cs": (139, "Czech"),
    "cu": (140, "Old Church Slavonic"), "da": (141, "Danish"), "de": (142, "German"), "el": (143, "Greek"),
    "en": (144, "English"), "es": (145, "Spanish"), "et": (146, "Estonian"), "eu": (147, "Basque"),
    "fa": (148, "Persian"), "fi": (149, "Finnish"), "fr": (150, "French"), "ga": (151, "Irish"),
    "gl": (152, "Galician"), "grc": (153, "Ancient Greek"), "he": (154, "Hebrew"), "hi": (155, "Hindi"),
    "hr": (156, "Croatian"), "hu": (157, "Hungarian"), "id": (158, "Indonesian"), "it": (159, "Italian"),
    "ja": (160, "Japanese"), "ko": (161, "Korean"), "la": (162, "Latin"), "lv": (163, "Latvian"),
    "nl": (164, "Dutch"), "nb": (165, "Norwegian Bokmål"), "nn": (166, "Norwegian Nynorsk"), "pl": (167, "Polish"),
    "pt": (168, "Portuguese"), "ro": (169, "Romanian"), "ru": (170, "Russian"), "sk": (171, "Slovak"),
    "sl": (172, "Slovene"), "sv": (173, "Swedish"), "tr": (174, "Turkish"), "ug": (175, "Uyghur"),
    "uk": (176, "Ukrainian"), "ur": (177, "Urdu"), "vi": (178, "Vietnamese"), "zh": (179, "Chinese"),
}
# spaCy's language for each, where it is not the code itself: spaCy has no Old Church Slavonic, Galician or Uyghur
# (its multi-language tokenizer then).
SPACY_LANGUAGES = {"cu": "xx", "gl": "xx", "ug": "xx"}


def spacy_language(code: str) -> str:
    """The spaCy language whose tokenizer splits the raw text of the model of `code`."""
    return SPACY_LANGUAGES.get(code, code)


class PublishedModelError(ValueError):
    """A published model that cannot be downloaded or converted; the message is one line saying what to do."""


@dataclass(frozen=True)
class PublishedFile:
    """One file of a published model: its `path` under its family's endpoint, its `name` in the download folder, and
    its SHA-256, checked when known."""

    path: str
    name: str
    sha256: str | None = None


class PublishedModel(ABC):
    """A biLM published under a name, which `published_model` downloads and converts once. A family of them is one
    subclass beside the others: where its files are (`files`, under `endpoint` or the mirror that `mirror_variable`
    names), how they convert (`format`, and the `word_tokenizer` recorded for raw text) and what its card says
    (`describe_source`). Nothing else of a family is known to the download and the conversion."""

    name: str
    description: str
    format: WeightFormat
    endpoint: str
    mirror_variable: str
    word_tokenizer: str | None = None  # None: the format's own (`WeightFormat.load`)

    @property
    @abstractmethod
    def files(self) -> tuple[PublishedFile, ...]:
        """Its files, in the order its format reads them (`WeightFormat.usage`); the last holds the weights."""

    def url(self, path: str) -> str:
        return f"{os.environ.get(self.mirror_variable, self.endpoint).rstrip('/')}/{path}"

    def describe_source(self) -> str:
        """The converted model card's source of the weights."""
        urls = " and ".join(f"`{self.url(file.path)}`" for file in self.files)
        return f"The published ELMo model `{self.name}` ({self.description}), converted from {urls}."


@dataclass(frozen=True)
class AllenNlpModel(PublishedModel):
    """One of AllenNLP's published biLMs: an `options.json` + `weights.hdf5` pair (the original format)."""

    name: str
    options_path: str
    weights_path: str
    description: str
    weights_sha256: str | None = None
    format: WeightFormat = original_format.FORMAT
    endpoint: str = ENDPOINT
    mirror_variable: str = "ELMO_PUBLISHED_ENDPOINT"

    @property
    def files(self) -> tuple[PublishedFile, ...]:
        return (PublishedFile(self.options_path, "options.json"),
                PublishedFile(self.weights_path, "weights.hdf5", self.weights_sha256))


@dataclass(frozen=True)
class EfmlModel(PublishedModel):
    """One of ELMoForManyLangs' models: the language (its code and name) and the archive's id in the NLPL
    repository; its raw text is split by spaCy's tokenizer of the language."""

    name: str
    language: str
    language_name: str
    repository_id: int
    format: WeightFormat = efml_format.FORMAT
    endpoint: str = NLPL_ENDPOINT
    mirror_variable: str = "ELMO_EFML_ENDPOINT"

    @property
    def description(self) -> str:
        return (f"ELMoForManyLangs' {self.language_name} biLM (HIT-SCIR; 20 M words of the CoNLL 2018 shared task's "
                "raw text; output width 1024)")

    @property
    def word_tokenizer(self) -> str:
        return f"spacy:{spacy_language(self.language)}"

    @property
    def files(self) -> tuple[PublishedFile, ...]:
        return (PublishedFile(f"{self.repository_id}.zip", "model.zip"),)


def _allennlp(name: str, architecture: str, description: str) -> AllenNlpModel:
    prefix = f"{architecture}/elmo_{architecture}"
    return AllenNlpModel(name, f"{prefix}_options.json", f"{prefix}_weights.hdf5", description)


ALLENNLP_MODELS = {model.name: model for model in (
    _allennlp("original", "2x4096_512_2048cnn_2xhighway",
              "the paper's English biLM (93.6 M parameters, 1 Billion Word Benchmark; output width 1024)"),
    _allennlp("original-5.5b", "2x4096_512_2048cnn_2xhighway_5.5B",
              "the original architecture trained on 5.5 B tokens (Wikipedia and news crawl); output width 1024"),
    _allennlp("medium", "2x2048_256_2048cnn_1xhighway", "English, 28.0 M parameters; output width 512"),
    _allennlp("small", "2x1024_128_2048cnn_1xhighway", "English, 13.6 M parameters; output width 256"),
    AllenNlpModel("pubmed", "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_options.json",
                  "contributed/pubmed/elmo_2x4096_512_2048cnn_2xhighway_weights_PubMed_only.hdf5",
                  "the original architecture trained on PubMed abstracts (contributed to AllenNLP); width 1024"),
)}
EFML_MODELS = {f"efml-{code}": EfmlModel(f"efml-{code}", code, language, repository_id)
               for code, (repository_id, language) in LANGUAGES.items()}
PUBLISHED_MODELS: dict[str, PublishedModel] = {**ALLENNLP_MODELS, **EFML_MODELS}


def names_text() -> str:
    """The published names in a few words (ELMoForManyLangs' 44 as one entry)."""
    return ", ".join(ALLENNLP_MODELS) + ", efml-<language> (ELMoForManyLangs' 44, e.g. efml-de, efml-zh)"


def cache_directory(name: str) -> Path:
    """Where the published model `name` is kept: `<HF_HUB_CACHE>/elmo-published/<name>`."""
    return Path(constants.HF_HUB_CACHE) / "elmo-published" / name


def published_name(options_file: str | os.PathLike, weight_file: str | os.PathLike) -> str | None:
    """The published model whose URLs (AllenNLP's, e.g. `allennlp.modules.elmo`'s defaults) are `options_file` and
    `weight_file`, or None."""
    for model in ALLENNLP_MODELS.values():
        if (str(options_file), str(weight_file)) in (
            (model.url(model.options_path), model.url(model.weights_path)),
            *((f"{base}/{model.options_path}", f"{base}/{model.weights_path}") for base in ALLENNLP_ENDPOINTS),
        ):
            return model.name
    return None


def published_model(name: str, progress: bool = True) -> str:
    """The converted `save_pretrained` directory of the published model `name`: downloaded and converted on first
    use (`progress`: bars on stderr), then read from the cache (also offline)."""
    model = PUBLISHED_MODELS[name]
    directory = cache_directory(name)
    converted = directory / "converted"
    if (converted / "model.safetensors").is_file():
        return str(converted)
    if is_offline_mode():
        raise PublishedModelError(f"the published model {name!r} is not in the cache ({converted}) and the Hub is "
                                  f"offline (HF_HUB_OFFLINE=1): use it once online, or {_by_hand(model)}")
    try:
        model.format.check_installed(f"the published model {name!r} is converted from its files, which")
    except ImportError as error:
        raise PublishedModelError(str(error)) from None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with FileLock(str(directory / ".lock")):
            if (converted / "model.safetensors").is_file():  # another process converted it meanwhile
                return str(converted)
            download = directory / "download"
            if progress:
                tqdm.write(f"The published ELMo model {name!r} is downloaded and converted once, into {directory}",
                           file=sys.stderr)
            files = tuple(_download(model, file, download / file.name, progress) for file in model.files)
            _convert(name, model, files, converted, progress)
            files[-1].unlink()  # the weights: the converted directory holds the same numbers
    except OSError as error:  # the cache directory itself: permissions, a full disk
        raise PublishedModelError(f"cannot write the published model {name!r} into {directory}: "
                                  f"{error.strerror or error} (HF_HUB_CACHE sets where the cache is)") from None
    return str(converted)


def _by_hand(model: PublishedModel) -> str:
    """How to get `model` without this package's download: its files, converted by `elmo convert`."""
    urls = " and ".join(model.url(file.path) for file in model.files)
    return f"download {urls}, run `elmo convert {model.format.usage} DIR` and give DIR as the model"


def _download(model: PublishedModel, file: PublishedFile, path: Path, progress: bool) -> Path:
    """The `file` of `model` at `path` (kept once complete), resumed from `path.incomplete`; the size must be the
    server's and the SHA-256 the file's when known. A server that cannot be reached fails at once; timeouts, a broken
    transfer and the server's own errors (5xx) are tried again."""
    if path.is_file():
        return path
    url = model.url(file.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    incomplete = path.with_name(path.name + ".incomplete")
    try:
        size = _remote_size(url)
        if incomplete.is_file() and size is not None and incomplete.stat().st_size > size:
            incomplete.unlink()  # not a prefix of this file
        with incomplete.open("ab") as out:
            http_get(url, out, resume_size=out.tell(), expected_size=size,
                     displayed_filename=f"{model.name} {file.path}", tqdm_class=partial(tqdm, disable=not progress))
    except Exception as error:  # the network's and the server's errors, as one line
        reason = " ".join(str(error).split())[:160] or type(error).__name__
        if "Consistency check failed" in reason:
            incomplete.unlink(missing_ok=True)  # a wrong size: start again next time
            raise PublishedModelError(f"{url} downloaded with another size than the server announced: the file was "
                                      "removed; run the command again") from None
        # Nothing of this model is in the cache yet (it is being downloaded): a mirror, or by hand.
        what_to_do = f"use a mirror ({model.mirror_variable}=URL), or {_by_hand(model)}"
        if _unreachable(error):
            raise PublishedModelError(f"cannot download the published model {model.name!r}: "
                                      f"{urlsplit(url).netloc} cannot be reached ({reason}); {what_to_do}") from None
        kept = incomplete.is_file() and incomplete.stat().st_size > 0
        raise PublishedModelError(f"cannot download {url}: {reason}; " + (
            "the part downloaded is kept: run the command again to resume, or " if kept else "") + what_to_do
        ) from None
    if file.sha256 is not None:
        with incomplete.open("rb") as stream:
            actual = sha_fileobj(stream).hex()
        if actual != file.sha256:
            incomplete.unlink()
            raise PublishedModelError(f"{url} downloaded with the wrong SHA-256 ({actual}, expected {file.sha256}): "
                                      "the file was removed; run the command again")
    incomplete.replace(path)
    return path


def _unreachable(error: Exception) -> bool:
    """Whether `error` says the server cannot be reached at all (its name does not resolve, or it refuses the
    connection), which trying again soon will not change."""
    return any(cls.__name__ == "ConnectError" for cls in type(error).__mro__)


def _remote_size(url: str) -> int | None:
    """The size the server gives for `url` (HEAD), None when it does not say. Tried again on timeouts, a broken
    connection and the server's errors; a server that cannot be reached fails at once."""
    # The HTTP client huggingface_hub raises from: httpx2 (huggingface_hub 2), httpx (1).
    hub_http = importlib.import_module(http_backoff.__module__)
    http = getattr(hub_http, "httpx2", None) or hub_http.httpx
    response = http_backoff("HEAD", url, follow_redirects=True, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                            retry_on_exceptions=(http.TimeoutException, http.ReadError, http.WriteError,
                                                 http.RemoteProtocolError))
    hf_raise_for_status(response)
    length = response.headers.get("Content-Length")
    return int(length) if length is not None and response.headers.get("Content-Encoding") in (None, "identity") \
        else None


def _convert(name: str, model: PublishedModel, files: tuple[Path, ...], converted: Path, progress: bool) -> None:
    """`elmo convert` into a temporary directory renamed to `converted` once complete; an unreadable download is
    removed (the next use downloads it again)."""
    staging = converted.with_name(converted.name + ".incomplete")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        model.format.convert(files, staging, source=model.describe_source(), word_tokenizer=model.word_tokenizer,
                             progress=progress)
    except (OSError, ValueError) as error:
        shutil.rmtree(staging, ignore_errors=True)
        for file in files:
            file.unlink(missing_ok=True)
        message = " ".join(str(error).split())[:300]
        raise PublishedModelError(f"the download of the published model {name!r} is damaged ({message}): it was "
                                  "removed; run the command again to download it afresh") from None
    shutil.rmtree(converted, ignore_errors=True)  # a directory left by an older, interrupted version
    staging.replace(converted)
