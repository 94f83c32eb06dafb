"""Embed many sentences with an ELMo biLM: length-sorted batches, streaming input, output in input order.

`ElmoEmbedder` turns sentences (lists of words) into per-word vectors; `embed_file` runs it over a text file
(one sentence per line) and writes `.hdf5` (AllenNLP's `elmo` command layout) or `.npy` through the writers
below. Memory stays flat on any input size: at most `buffer_tokens` positions of input are buffered (plus
one sentence of read-ahead), and the `.npy` writer streams to disk; `bound_onednn_caches` keeps oneDNN's
per-shape kernel caches from growing with the input.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np
import torch
from numpy.lib import format as npy_format
from tqdm import tqdm

from .convert import require_h5py
from .kernels import ElmoInferenceCache
from .loading import DEFAULT_MODEL_NAME, load_model, load_original, load_tokenizer
from .modeling_elmo import ElmoModel, ElmoScalarMix
from .runtime import halve_on_out_of_memory
from .text import ElmoBatch, length_batches, read_lines, split_into_words, windows
from .tokenization_elmo import ElmoCharTokenizer

LAYER_MODES = ("all", "top", "average", "mix")
OUTPUT_SUFFIXES = (".hdf5", ".h5", ".npy")

# oneDNN compiles and keeps a kernel per matmul shape (1024 by default); batches of ever new lengths add shapes
# for hours, hundreds of MB in all. 64 keeps the memory of a long run flat at no measured speed cost.
ONEDNN_CACHE_CAPACITY = 64


def bound_onednn_caches(capacity: int = ONEDNN_CACHE_CAPACITY) -> None:
    """Cap oneDNN's kernel caches (its primitive cache and PyTorch's oneDNN LRU) at `capacity` shapes for this
    process, unless `ONEDNN_PRIMITIVE_CACHE_CAPACITY` / `LRU_CACHE_CAPACITY` are set already. Both are read
    once, at the first oneDNN call of the process: call this before any."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(capacity))


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

    def __post_init__(self) -> None:
        if self.layers not in LAYER_MODES:
            raise EmbedSettingError("layers", f"must be one of {', '.join(LAYER_MODES)}, got {self.layers!r}")
        if self.layers != "mix" and (self.scalar_parameters is not None or self.gamma != 1.0):
            raise EmbedSettingError("scalar_parameters" if self.scalar_parameters is not None else "gamma",
                                    "applies to layers='mix' only")
        for name in ("batch_tokens", "buffer_tokens", "batch_size", "max_sentence_words"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise EmbedSettingError(name, f"must be an integer >= 1, got {value!r}")

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


def _sentence_index(item: tuple[_Window, np.ndarray]) -> int:
    return item[0].sentence


@dataclass(frozen=True)
class _Window:
    """Consecutive words of one sentence that the biLM reads as one row (a whole sentence, unless it is longer than
    `max_sentence_words`)."""

    sentence: int  # the sentence's index in the input
    words: list[str]
    sentence_words: int  # the words of the whole sentence


def _sentence_windows(sentences: Iterable[Sequence[str]], window: int) -> Iterator[_Window]:
    """The windows of every sentence, in order (an empty sentence is one empty window), read lazily."""
    for index, words in enumerate(sentences):
        words = list(words)
        for piece in windows(len(words), window):
            yield _Window(index, words[piece], len(words))


def _chunks(windows: Iterable[_Window], buffer_tokens: int) -> Iterator[list[_Window]]:
    """Consecutive runs of windows of at most `buffer_tokens` positions (or one longer window)."""
    chunk: list[_Window] = []
    positions = 0
    for window in windows:
        if chunk and positions + len(window.words) + 2 > buffer_tokens:
            yield chunk
            chunk, positions = [], 0
        chunk.append(window)
        positions += len(window.words) + 2
    if chunk:
        yield chunk


class ElmoEmbedder:
    r"""
    Per-word ELMo vectors for many sentences, `<S>`/`</S>` removed. Every sentence starts from the zero LSTM state,
    so its vectors do not depend on the other sentences of its batch.

    AllenNLP's `ElmoEmbedder` calls work unchanged: `ElmoEmbedder()` (here the English model shipped with the
    package; AllenNLP's default is `ElmoEmbedder("original")`), `ElmoEmbedder(options_file, weight_file,
    cuda_device)` (the original weights, converted in memory, or a published model's URLs),
    `embed_sentence`, `embed_batch`, `embed_sentences(sentences, batch_size)`, `batch_to_embeddings` and
    `embed_file(input_file, output_file_path, output_format, batch_size, forget_sentences, use_sentence_keys)`,
    with AllenNLP's shapes (`layers="all"`: `(n_layers + 1, words, width)` per sentence).

    Args:
        model (`ElmoModel` or `str`, `"default"`): the biLM, or where to load it: `"default"` (the English model
            shipped with the package), a published model (`"original"`, ...: see `hf_elmo.published`), a
            `save_pretrained` directory (a trained biLM with a softmax gives its
            encoder) or a Hub id. It is put in eval mode (and moved to `device` if given).
        tokenizer (`ElmoCharTokenizer`, optional): defaults to the loaded model's, or one matching `model.config`.
        layers (`str`, `"all"`): `"all"` gives `(n_layers + 1, words, width)` per sentence; `"top"` the last biLSTM
            layer, `"average"` the mean of all layers and `"mix"` `gamma * sum_j softmax(s)_j * layer_j`, each
            `(words, width)`.
        scalar_parameters (`Sequence[float]`, optional): the unnormalised `s` of `"mix"`, one per layer (default
            zeros, i.e. the average); as `ElmoScalarMix`, e.g. `[-9e10, 1, -9e10]` selects the first biLSTM layer.
        gamma (`float`, 1.0): the scale of `"mix"`.
        batch_tokens (`int`, 4096): padded positions per forward pass, boundaries included.
        buffer_tokens (`int`, optional): positions read ahead and sorted by length before batching (default
            `4 * batch_tokens`); bounds the memory held by `embed_sentences`.
        batch_size (`int`, optional): sentences per forward pass at most (AllenNLP's `batch_size`), on top of
            `batch_tokens`.
        max_sentence_words (`int`, 1000): `embed_sentences` runs longer sentences as windows of this many words
            (each from the zero state; AllenNLP runs them whole) so that memory stays bounded.
        device (`str` or `torch.device`, optional): where to run the model; default: where it is.
        options_file, weight_file (`str`, optional): the original `options.json` and `.hdf5` weights, instead of
            `model` (as AllenNLP; also accepted as the first two positional arguments).
        cuda_device (`int`, optional): AllenNLP's device argument: -1 for the CPU, n for `cuda:n`.
        bf16 (`bool`, False): run the biLM under bf16 autocast (outputs still float32): several times faster on CPUs
            with native bf16 (AVX512-BF16, AMX) and on GPUs, not exact (measured on the default model: see
            docs/performance.md). Never chosen on its own; a warning says when the CPU has no native bf16.
        settings (`EmbedSettings`, optional): all of `layers` to `bf16` (but `cuda_device`) at once, as `elmo embed`
            gives them; the arguments are checked by making one (an `EmbedSettingError` names the one at fault).
    """

    def __init__(
        self,
        model: ElmoModel | str | os.PathLike = DEFAULT_MODEL_NAME,
        tokenizer: ElmoCharTokenizer | str | os.PathLike | None = None,
        layers: str = "all",
        scalar_parameters: Sequence[float] | None = None,
        gamma: float = 1.0,
        batch_tokens: int = 4096,
        buffer_tokens: int | None = None,
        device: str | torch.device | None = None,
        batch_size: int | None = None,
        max_sentence_words: int = 1000,
        *,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        cuda_device: int | None = None,
        bf16: bool = False,
        settings: EmbedSettings | None = None,
    ):
        if isinstance(model, (str, os.PathLike)) and str(model).endswith(".json") and isinstance(
            tokenizer, (str, os.PathLike)
        ):  # AllenNLP's positional ElmoEmbedder(options_file, weight_file[, cuda_device])
            model, tokenizer, options_file, weight_file = DEFAULT_MODEL_NAME, None, model, tokenizer
            if isinstance(layers, int) and not isinstance(layers, bool):
                layers, cuda_device = "all", layers
        if settings is None:
            settings = EmbedSettings(
                layers, None if scalar_parameters is None else tuple(scalar_parameters), gamma, batch_tokens,
                buffer_tokens, batch_size, max_sentence_words, EmbedSettings.device_of(device, cuda_device), bf16,
            )
        model, tokenizer = _load_model(model, tokenizer, options_file, weight_file)
        settings.check_model(model.config)
        self.settings = settings
        self.model = model.eval() if settings.device is None else model.to(settings.device).eval()
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer or ElmoCharTokenizer.for_model(model.config)
        self.batch_tokens = settings.batch_tokens
        self.buffer_tokens = settings.buffer_tokens or 4 * settings.batch_tokens
        self.batch_size = settings.batch_size
        self.max_sentence_words = settings.max_sentence_words
        # Token representations of the 20,000 most recently seen words and the packed LSTM weights, across calls.
        self.inference_cache = ElmoInferenceCache()
        self.bf16 = settings.bf16
        self._set_layers(settings.layers, settings.scalar_parameters, settings.gamma)

    def _set_layers(self, layers: str, scalar_parameters: Sequence[float] | None = None, gamma: float = 1.0) -> None:
        self.layers = layers
        self.mix = None
        num_layers = self.model.config.num_output_layers
        if layers in ("average", "mix"):
            self.mix = ElmoScalarMix(num_layers, initial_scalar_parameters=scalar_parameters, trainable=False)
            self.mix.gamma.fill_(gamma)  # trainable=False: a plain in-place update
            self.mix.to(self.device)
        # The shape of one word's output.
        width = self.model.config.output_dim
        self.token_shape: tuple[int, ...] = (num_layers, width) if layers == "all" else (width,)

    def _variant(self, layers: str | None = None, batch_size: int | None = None) -> ElmoEmbedder:
        """This embedder (same model) with other `layers` ("all", "top", "average") or `batch_size`."""
        if (layers is None or layers == self.layers) and (batch_size is None or batch_size == self.batch_size):
            return self
        if layers is not None and layers not in ("all", "top", "average"):
            raise ValueError(f"output_format must be all, top or average, got {layers!r}")
        variant = copy.copy(self)
        if layers is not None:
            variant._set_layers(layers)
        if batch_size is not None:
            if batch_size < 1:
                raise ValueError(f"batch_size must be >= 1, got {batch_size}")
            variant.batch_size = batch_size
        return variant

    def _layers(self, sentences: Sequence[Sequence[str]]) -> tuple[tuple[torch.Tensor, ...], ElmoBatch]:
        """One forward pass: the biLM layers, each (batch, positions, width) with the `<S>`/`</S>` rows, and the
        batch they were computed from, on the model's device."""
        batch = self.tokenizer.batch([list(words) for words in sentences]).to(self.device, non_blocking=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            layers = self.model(**batch, inference_cache=self.inference_cache).hidden_states
        return tuple(layer.float() for layer in layers), batch

    @torch.inference_mode()
    def batch_to_embeddings(self, batch: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """AllenNLP's `batch_to_embeddings`: all layers `(batch, n_layers + 1, words, width)` and the word mask
        `(batch, words)`, sentence boundaries removed, on the model's device."""
        hidden_states, elmo_batch = self._layers(batch)
        return torch.stack([elmo_batch.strip(layer) for layer in hidden_states], dim=1), elmo_batch.words_mask

    def embed_sentence(self, sentence: Sequence[str]) -> np.ndarray:
        """One sentence: `(layers, words, width)` with `layers="all"`, else `(words, width)`."""
        return self.embed_batch([sentence])[0]

    @torch.inference_mode()
    def embed_batch(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One forward pass (on a GPU without the memory for it, several: the batch halved until each part fits, the
        same vectors). Returns per sentence a float32 array `(layers, words, width)` or `(words, width)`."""
        return halve_on_out_of_memory(
            list(sentences), self._embed_batch, lambda parts: [array for part in parts for array in part],
            lambda words: f"a sentence of {len(words)} words",
        )

    def _embed_batch(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        hidden_states, batch = self._layers(sentences)
        if self.layers == "all":
            output = torch.stack([batch.strip(layer) for layer in hidden_states])  # (layers, batch, words, width)
        elif self.layers == "top":
            output = batch.strip(hidden_states[-1])  # (batch, words, width)
        else:
            output = batch.strip(self.mix(hidden_states))
        output = output.float().cpu().numpy()
        # Copies, so that no sentence keeps the whole batch alive.
        return [output[..., row, :words, :].copy() for row, words in enumerate(batch.word_counts)]

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int | None = None
    ) -> Iterator[np.ndarray]:
        """Embed lazily, yielding one array per sentence (see `embed_batch`) in input order.

        The input is consumed in chunks of about `buffer_tokens` positions; each chunk is sorted by length and
        cut into batches of at most `batch_tokens` positions (and `batch_size` sentences, default the embedder's),
        so padding is small and memory bounded. A sentence longer than `max_sentence_words` is run as consecutive
        windows of that many words, each from the zero state, and their vectors are concatenated, so a huge line
        needs the memory of a window (plus its output), not of the whole line.
        """
        for _, embedded in itertools.groupby(self._embedded_windows(sentences, batch_size), key=_sentence_index):
            first, embedding = next(embedded)
            if len(first.words) == first.sentence_words:  # one window
                yield embedding
                continue
            # The windows' vectors copied into the sentence's array as they come: one copy of a long line.
            joined = np.empty((*embedding.shape[:-2], first.sentence_words, embedding.shape[-1]), dtype=np.float32)
            joined[..., : len(first.words), :] = embedding
            start = len(first.words)
            for window, part in embedded:  # noqa: B031 (the rest of the group, after next())
                joined[..., start : start + len(window.words), :] = part
                start += len(window.words)
            yield joined

    def _embedded_windows(
        self, sentences: Iterable[Sequence[str]], batch_size: int | None = None
    ) -> Iterator[tuple[_Window, np.ndarray]]:
        """Every window of every sentence (see `embed_sentences`) with its vectors, in input order; at most
        `buffer_tokens` positions of windows are read ahead, sorted by length and embedded in batches."""
        batch_size = batch_size or self.batch_size
        for chunk in _chunks(_sentence_windows(sentences, self.max_sentence_words), self.buffer_tokens):
            embeddings: dict[int, np.ndarray] = {}
            for batch in length_batches([len(window.words) for window in chunk], self.batch_tokens, batch_size):
                embeddings.update(zip(batch, self.embed_batch([chunk[j].words for j in batch])))
            for j, window in enumerate(chunk):
                yield window, embeddings.pop(j)

    def embed_file(
        self,
        input_file: str | Path | IO,
        output_file_path: str | Path,
        output_format: str | None = None,
        batch_size: int | None = None,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
        tokenized: bool = True,
        progress: bool = True,
    ) -> int:
        """AllenNLP's `embed_file`: every line of `input_file` (a path, `"-"` or an open file) is a sentence of
        whitespace-separated words (`tokenized=False`: raw text, split by the model's word tokenizer), written to
        `output_file_path` (see `embed_file` of this module) with `output_format` "all", "top" or "average"
        (default: the embedder's `layers`). Returns the number of sentences."""
        return embed_file(
            self._variant(output_format, batch_size), input_file, output_file_path, tokenized=tokenized,
            progress=progress, sentence_index=not forget_sentences, sentence_keys=use_sentence_keys,
        )


def _load_model(
    model: ElmoModel | str | os.PathLike,
    tokenizer: ElmoCharTokenizer | None,
    options_file: str | os.PathLike | None,
    weight_file: str | os.PathLike | None,
) -> tuple[ElmoModel, ElmoCharTokenizer | None]:
    """The biLM of `ElmoEmbedder`'s arguments, and the tokenizer of a loaded directory or Hub id."""
    if options_file is not None or weight_file is not None:
        if options_file is None or weight_file is None:
            raise ValueError("options_file and weight_file go together (the original ELMo weights)")
        if not (isinstance(model, str) and model == DEFAULT_MODEL_NAME):
            raise ValueError("give either a model or options_file and weight_file, not both")
        return load_original(options_file, weight_file), tokenizer
    if isinstance(model, (str, os.PathLike)):
        return load_model(model), tokenizer or load_tokenizer(model)
    if not isinstance(model, ElmoModel):
        raise TypeError(f"model must be an ElmoModel, a directory or a Hub id, got {type(model).__name__}")
    return model, tokenizer


# -- input --------------------------------------------------------------------------------------------------


def _regular_file_size(stream: BinaryIO) -> int | None:
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):  # in-memory streams have no file descriptor
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


# -- output -------------------------------------------------------------------------------------------------


def _partial_path(path: Path) -> Path:
    """Where a file is written until it is complete, then renamed to `path`."""
    return path.with_name(f".{path.name}.partial")


class EmbeddingWriter:
    """Base of the writers: a context manager that keeps the output only if the block completes."""

    count: int

    def add(self, embedding: np.ndarray, sentence: str) -> None:
        """Write the next sentence: `embedding` (layers, words, width) or (words, width), and its text."""
        self.add_parts(embedding.shape[-2], [embedding], sentence)

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        """Write the next sentence of `words` words from consecutive parts of its vectors along the words axis
        (e.g. the windows of a long line), each written as it comes, and its text."""
        raise NotImplementedError

    def close(self) -> None:
        """Finish the output file(s)."""
        raise NotImplementedError

    def discard(self) -> None:
        """Delete what was written."""
        raise NotImplementedError

    def __enter__(self) -> EmbeddingWriter:
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if exc_type is not None:
            self.discard()
            return
        try:
            self.close()
        except BaseException:
            self.discard()
            raise


class Hdf5Writer(EmbeddingWriter):
    """AllenNLP's `elmo` command layout: one float32 dataset per sentence named by its 0-based index, and
    `sentence_to_index`, a one-element string dataset holding JSON `{stripped line: "index"}` (a repeated line maps
    to its last index). `sentence_index=False` leaves it out and keeps memory flat on huge inputs.

    `sentence_keys=True` (AllenNLP's `--use-sentence-keys`): each dataset is named by its stripped line instead,
    without `sentence_to_index`; a repeated line is written once (its vectors are the same every time). A line
    that cannot name an HDF5 dataset (empty, `.`, or containing `/`) is an error.
    """

    def __init__(self, path: str | Path, sentence_index: bool = True, sentence_keys: bool = False):
        h5py = require_h5py(".hdf5 outputs")
        self.path = Path(path)
        self.count = 0
        self.sentence_keys = sentence_keys
        self.sentence_to_index: dict[str, str] | None = {} if sentence_index and not sentence_keys else None
        self._string_dtype = h5py.string_dtype()
        self._output = _WriteOnce(_partial_path(self.path))
        self._file = h5py.File(self._output, "w")

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        key = sentence.strip() if self.sentence_keys else str(self.count)
        if self.sentence_keys and (key in ("", ".") or "/" in key):
            raise ValueError(f"line {self.count}: {key!r} cannot name an HDF5 dataset (empty, '.' or with '/'); "
                             "embed without sentence keys")
        if self.sentence_keys and key in self._file:  # a repeated line: the same vectors, written once
            for _ in parts:
                pass
        else:
            dataset, start = None, 0
            for part in parts:
                if dataset is None and part.shape[-2] == words:  # the whole sentence at once (most sentences)
                    self._file.create_dataset(key, data=np.asarray(part, dtype=np.float32))
                    break
                if dataset is None:
                    dataset = self._file.create_dataset(key, (*part.shape[:-2], words, part.shape[-1]), np.float32)
                dataset[..., start : start + part.shape[-2], :] = part
                start += part.shape[-2]
        self._output.check(self.path)
        if self.sentence_to_index is not None:
            self.sentence_to_index[sentence.strip()] = key
        self.count += 1

    def close(self) -> None:
        if self.sentence_to_index is not None:
            # ensure_ascii (the default) writes undecodable input bytes as \udcXX escapes.
            index = self._file.create_dataset("sentence_to_index", (1,), dtype=self._string_dtype)
            index[0] = json.dumps(self.sentence_to_index)
        self._file.close()
        self._output.close()
        self._output.check(self.path)
        os.replace(_partial_path(self.path), self.path)

    def discard(self) -> None:
        _close_and_remove(self._file, _partial_path(self.path))
        self._output.close()


class _WriteOnce:
    """The file object HDF5 writes through (h5py's `fileobj` driver). HDF5 reports a failed write (a full disk, a
    file-size limit) only when it later closes an object, through h5py to stderr, and then cannot close its file; so
    a write never fails here: the first error is kept (and later writes skipped) until `check` raises it."""

    def __init__(self, path: Path):
        self._file = open(path, "w+b", buffering=0)  # unbuffered: every failed write is seen at once
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        if self.error is None:
            try:
                return self._file.write(data)
            except OSError as error:
                self.error = error
        return len(data)

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._file.truncate(size)
            except OSError as error:
                self.error = error
        return size if size is not None else self._file.tell()

    def flush(self) -> None:
        """Nothing to flush: writes are unbuffered."""

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size)

    def readinto(self, buffer) -> int:
        return self._file.readinto(buffer)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()

    def check(self, path: Path) -> None:
        """Raise the first failed write's `OSError`, naming `path`."""
        if self.error is not None:
            raise OSError(self.error.errno, self.error.strerror, str(path))


def _close_and_remove(handle: Any, path: Path) -> None:
    """Close `handle` and delete `path`, also when closing fails (e.g. flushing onto a full disk)."""
    try:
        handle.close()
    except Exception:  # any failure: the file is being thrown away, what it lacks does not matter
        pass
    finally:
        path.unlink(missing_ok=True)


class _GrowingNpy:
    """A `.npy` file grown along its first axis; the header is rewritten with the final length on `close`.

    numpy pads every header so that the first dimension can grow to 21 digits in place.
    """

    def __init__(self, path: Path, dtype: np.dtype | type, row_shape: tuple[int, ...]):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        self.rows = 0
        self._file = open(_partial_path(path), "wb")
        self._write_header()
        self._data_start = self._file.tell()

    def _write_header(self) -> None:
        shape = (self.rows, *self.row_shape)
        header = {"descr": npy_format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
        npy_format.write_array_header_1_0(self._file, header)

    def append(self, rows: np.ndarray) -> None:
        """Append `rows` of shape (n, *row_shape)."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.shape[1:] != self.row_shape:
            raise ValueError(f"expected rows of shape (n, {', '.join(map(str, self.row_shape))}), got {rows.shape}")
        self._file.write(rows.data)
        self.rows += len(rows)

    def finish(self) -> None:
        """Write the final header and close the partial file (`commit` then moves it into place)."""
        self._file.seek(0)
        self._write_header()
        if self._file.tell() != self._data_start:
            raise RuntimeError(f"{self.path}: the final .npy header does not fit where the first one was written")
        self._file.close()

    def commit(self) -> None:
        os.replace(_partial_path(self.path), self.path)

    def discard(self) -> None:
        _close_and_remove(self._file, _partial_path(self.path))


class NpyWriter(EmbeddingWriter):
    """All word vectors concatenated in input order, `(total_words, *token_shape)` float32 (words first: an `"all"`
    embedding `(layers, words, width)` is stored as `(words, layers, width)`), and `<stem>.offsets.npy`, int64 of
    shape `(sentences + 1,)`: sentence i is rows `offsets[i]:offsets[i + 1]`. Both are written streaming.
    """

    def __init__(self, path: str | Path, token_shape: tuple[int, ...]):
        self.path = Path(path)
        self.offsets_path = self.path.with_suffix(".offsets.npy")
        self.count = 0
        self._vectors = _GrowingNpy(self.path, np.float32, tuple(token_shape))
        self._offsets = _GrowingNpy(self.offsets_path, np.int64, ())
        self._offsets.append(np.zeros(1, dtype=np.int64))

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        try:
            for part in parts:
                self._vectors.append(np.moveaxis(part, -2, 0))
            self._offsets.append(np.array([self._vectors.rows], dtype=np.int64))
        except OSError as error:  # a write's error names no file
            raise OSError(error.errno, error.strerror, str(self.path)) from None
        self.count += 1

    def close(self) -> None:
        self._vectors.finish()
        self._offsets.finish()
        # Never a new .npy beside an old index: the old index goes first, and the new one comes last (a run killed
        # in between leaves a .npy without its .offsets.npy: an incomplete output, never a mismatched pair).
        self.offsets_path.unlink(missing_ok=True)
        self._vectors.commit()
        self._offsets.commit()

    def discard(self) -> None:
        self._vectors.discard()
        self._offsets.discard()


def check_output(path: str | Path, sentence_keys: bool = False) -> str:
    """The format of an output file, `.npy` or `.hdf5` (`.h5`, as AllenNLP writes it), checked before any work: its
    suffix, sentence keys only in HDF5, and h5py for HDF5 (an `EmbedSettingError` naming the setting)."""
    suffix = Path(path).suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise EmbedSettingError("output", f"unknown format {suffix or '(no suffix)'!r} of {path}; use .hdf5, .h5 or "
                                ".npy")
    if suffix == ".npy":
        if sentence_keys:
            raise EmbedSettingError("sentence_keys", f"sentence keys name the datasets of an .hdf5 file; {path} is "
                                    ".npy")
        return ".npy"
    require_h5py(".hdf5 outputs")
    return ".hdf5"


def open_writer(
    path: str | Path, token_shape: tuple[int, ...], sentence_index: bool = True, sentence_keys: bool = False
) -> EmbeddingWriter:
    """The writer for `path`'s suffix: `.hdf5`/`.h5` (`Hdf5Writer`) or `.npy` (`NpyWriter`, no sentence keys)."""
    if check_output(path, sentence_keys) == ".npy":
        return NpyWriter(path, token_shape)
    return Hdf5Writer(path, sentence_index, sentence_keys)


def embed_file(
    embedder: ElmoEmbedder,
    input_file: str | Path | IO,
    output_file: str | Path,
    tokenized: bool = False,
    progress: bool = True,
    sentence_index: bool = True,
    sentence_keys: bool = False,
) -> int:
    """Embed every line of `input_file` (a path, `"-"` for stdin, or an open binary or text file) as one sentence
    into `output_file`; returns the line count. `sentence_index`, `sentence_keys`: see `Hdf5Writer`.

    Line i is sentence i: an empty or whitespace-only line is a sentence without words. Lines are whitespace-
    separated words with `tokenized=True` (`str.split`), else raw text split by the embedder's tokenizer's word
    tokenizer (the model's `config.word_tokenizer`; `split_words` when it records none). The output appears
    only once complete (it is written to a hidden `.partial` file next to it first). The progress bar counts the
    bytes of the lines written, within a long line as its windows are written.
    """
    with ExitStack() as stack:
        if hasattr(input_file, "read"):
            stream = input_file
        else:
            stream = sys.stdin.buffer if str(input_file) == "-" else stack.enter_context(open(input_file, "rb"))
        bar = stack.enter_context(tqdm(
            total=_regular_file_size(stream), unit="B", unit_scale=True, unit_divisor=1024, desc="embedding",
            file=sys.stderr, disable=not progress,
        ))
        writer = stack.enter_context(open_writer(output_file, embedder.token_shape, sentence_index, sentence_keys))
        progress_bar = _LineProgress(bar)
        _embed_lines(embedder, read_lines(stream, progress_bar.sizes.append), writer, tokenized,
                     progress_bar.window, progress_bar.line)
        return writer.count


class _LineProgress:
    """Advances a bar of bytes by each line's bytes as its windows are written, in whole bytes."""

    def __init__(self, bar: tqdm):
        self.bar = bar
        self.sizes: deque[int] = deque()  # the bytes of each line read and not yet written
        self.words = 0  # of the line being written, in the windows written so far
        self.counted = 0  # bytes of that line already on the bar

    def window(self, window: _Window) -> None:
        self.words += len(window.words)
        target = self.sizes[0] * self.words // window.sentence_words if window.sentence_words else self.sizes[0]
        self.bar.update(target - self.counted)
        self.counted = target

    def line(self) -> None:
        self.bar.update(self.sizes.popleft() - self.counted)
        self.words = self.counted = 0


def _embed_lines(
    embedder: ElmoEmbedder,
    lines: Iterable[str],
    writer: EmbeddingWriter,
    tokenized: bool,
    on_window: Callable[[_Window], object] | None = None,
    on_line: Callable[[], object] | None = None,
) -> None:
    """Embed each line as a sentence (see `embed_file`) and write it with its text, in order; `on_window` is
    called after each window is written (the progress bar advances within a long line), `on_line` after each
    line."""
    pending: deque[str] = deque()  # read but not yet written: bounded by the embedder's buffer

    def sentences() -> Iterator[list[str]]:
        for line in lines:
            pending.append(line)
            yield line.split() if tokenized else split_into_words(line, embedder.tokenizer.word_tokenizer)

    def parts(windows: Iterable[tuple[_Window, np.ndarray]]) -> Iterator[np.ndarray]:
        for window, part in windows:
            yield part
            if on_window is not None:
                on_window(window)

    # Each sentence's windows go to the writer as they come: a long line is never held whole.
    for _, embedded in itertools.groupby(embedder._embedded_windows(sentences()), key=_sentence_index):
        first = next(embedded)
        rest = itertools.chain([first], embedded)  # noqa: B031 (the rest, after next())
        writer.add_parts(first[0].sentence_words, parts(rest), pending.popleft())
        if on_line is not None:
            on_line()


# -- several processes ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Part:
    """One process's part of a shared output: vectors and offsets as `NpyWriter` writes them to `path`, and the
    text of every sentence (one JSON string per line, lone surrogates included), so that the parts can be joined
    into any output format."""

    path: Path

    @property
    def lines_path(self) -> Path:
        return self.path.with_suffix(".lines.jsonl")

    def read(self) -> Iterator[tuple[np.ndarray, str]]:
        """The part, sentence by sentence: `(embedding, text)` as they were written (memory-mapped)."""
        vectors = np.load(self.path, mmap_mode="r")
        offsets = np.load(self.path.with_suffix(".offsets.npy"))
        with open(self.lines_path, encoding="ascii") as texts:
            for start, end, text in zip(offsets[:-1], offsets[1:], texts):
                yield np.moveaxis(np.asarray(vectors[start:end]), 0, -2), json.loads(text)

    def remove(self) -> None:
        for path in (self.path, self.path.with_suffix(".offsets.npy"), self.lines_path):
            path.unlink(missing_ok=True)


class _PartWriter(NpyWriter):
    """Writes a `_Part`: an `NpyWriter` that also keeps the text of every sentence."""

    def __init__(self, part: _Part, token_shape: tuple[int, ...]):
        super().__init__(part.path, token_shape)
        self.lines_path = part.lines_path
        self._lines = open(_partial_path(self.lines_path), "w", encoding="ascii")  # json.dumps escapes non-ASCII

    def add_parts(self, words: int, parts: Iterable[np.ndarray], sentence: str) -> None:
        super().add_parts(words, parts, sentence)
        self._lines.write(json.dumps(sentence) + "\n")

    def close(self) -> None:
        self._lines.close()
        os.replace(_partial_path(self.lines_path), self.lines_path)
        super().close()

    def discard(self) -> None:
        super().discard()
        _close_and_remove(self._lines, _partial_path(self.lines_path))


def embed_file_in_parts(
    embedder: ElmoEmbedder,
    input_file: str | Path,
    output_file: str | Path,
    rank: int,
    world_size: int,
    barrier: Callable[[], object],
    tokenized: bool = False,
    progress: bool = True,
    sentence_index: bool = True,
    sentence_keys: bool = False,
) -> int:
    """`embed_file` shared by `world_size` processes (e.g. started by `torchrun` or `accelerate launch`); this is
    process `rank`. Returns the line count of `input_file`.

    Each process embeds its contiguous share of the lines (shares differ by at most one line) into hidden part
    files next to `output_file`. Once `barrier()` returns in every process (all parts written), rank 0 joins the
    parts in order through the writer of `output_file`'s format, so the output has exactly the layout, keys and
    order of a one-process `embed_file` (each sentence's vectors equal, as they never depend on the batch), and
    deletes them. Every process reads `input_file` (a path, not stdin) to count its lines; the parts must be on a
    filesystem all processes see. The parts take as much disk again as the output, until the join ends.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world size {world_size}")
    if hasattr(input_file, "read") or str(input_file) == "-":
        raise ValueError("embedding in several processes reads a file (each process reads it), not stdin")
    if rank == 0:  # a bad output name or format fails before any work
        open_writer(output_file, embedder.token_shape, sentence_index, sentence_keys).discard()
    with open(input_file, "rb") as stream:
        total = sum(1 for _ in stream)
    share = range(total * rank // world_size, total * (rank + 1) // world_size)
    output_file = Path(output_file)
    parts = [_Part(output_file.with_name(f".{output_file.name}.part-{r}-of-{world_size}.npy"))
             for r in range(world_size)]
    with open(input_file, "rb") as stream, _PartWriter(parts[rank], embedder.token_shape) as writer:
        lines = itertools.islice(read_lines(stream), share.start, share.stop)
        bar = tqdm(lines, total=len(share), unit="line", desc=f"embedding, process {rank}/{world_size}",
                   file=sys.stderr, disable=not progress)
        _embed_lines(embedder, bar, writer, tokenized)
    barrier()
    if rank == 0:
        with open_writer(output_file, embedder.token_shape, sentence_index, sentence_keys) as joined:
            for part in parts:
                for embedding, text in part.read():
                    joined.add(embedding, text)
        for part in parts:
            part.remove()
    return total


__all__ = [
    "LAYER_MODES",
    "OUTPUT_SUFFIXES",
    "ElmoEmbedder",
    "EmbedSettingError",
    "EmbedSettings",
    "EmbeddingWriter",
    "Hdf5Writer",
    "NpyWriter",
    "check_output",
    "embed_file",
    "embed_file_in_parts",
    "open_writer",
]
