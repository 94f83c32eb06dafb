"""`ElmoEmbedder`: per-word ELMo vectors of many sentences (AllenNLP's names and defaults: `hf_elmo.allennlp`)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..formulas import pool_words
from ..kernel_plan import Precision
from ..kernels import ElmoInferenceCache
from ..loading import DEFAULT_MODEL_NAME, load_model_and_tokenizer
from ..modeling_elmo import ElmoModel, ElmoScalarMix
from ..runtime import halve_on_out_of_memory
from ..text import ElmoBatch, length_batches
from ..tokenization_elmo import ElmoCharTokenizer
from .settings import EmbedSettings
from .windows import Window, chunks, sentence_index, sentence_windows


class ElmoEmbedder:
    r"""
    Per-word ELMo vectors for many sentences, `<S>`/`</S>` removed. Every sentence starts from the zero LSTM state,
    so its vectors do not depend on the other sentences of its batch.

    `embed_sentence`, `embed_batch`, `embed_sentences` and `batch_to_embeddings` have the names and shapes of
    AllenNLP's `ElmoEmbedder` (`layers="all"`: `(n_layers + 1, words, width)` per sentence); `embed_file(embedder,
    ...)` of this package writes a file. AllenNLP's constructor (`options_file`, `weight_file`, `cuda_device`) and
    `embed_file(input_file, output_file_path, output_format, ...)` are `hf_elmo.allennlp.ElmoEmbedder`'s.

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
        bf16 (`bool`, False): run the biLM under bf16 autocast (outputs still float32; float16 on GPUs older than
            Ampere: `kernel_plan.reduced_precision`): several times faster on CPUs with native bf16 (AVX512-BF16, AMX)
            and on GPUs, not exact (measured on the default model: see docs/performance.md). Never chosen on its
            own. On a CPU without native bf16, where it is several times slower, float32 (`self.bf16` False), with a
            `runtime.HostWarning`.
        quantize (`str`, optional): `"int8"`: the int8 mode on a CPU (as `model(..., quantize="int8")`: the
            highway's, the token projection's and the LSTMs' weights in int8, quantized once; outputs float32): on
            the original model 1.6-1.9 times float32's throughput and a third to a quarter of its one-sentence
            latency (AVX2), not exact (measured on the default model: docs/performance.md). Never chosen on its own.
            On a GPU or a CPU without the kernels (x86 with AVX2), float32 (`self.quantize` None), with a
            `runtime.HostWarning`.
        pool (`str`, optional): `"mean"` or `"max"`: one vector per sentence over its words, after the layer choice
            (`(layers, width)` with `"all"`, else `(width,)`; zeros for a sentence without words):
            `formulas.pool_words`, as the spaCy component's `Doc.vector` (a mean). Default: a vector per word.
        dtype (`str`, `"float32"`): `"float16"` gives every vector rounded to float16 (half the memory and disk).
        settings (`EmbedSettings`, optional): all of `layers` to `dtype` at once, as `elmo embed` gives them; the
            arguments are checked by making one (an `EmbedSettingError` names the one at fault).

    A sentence's float32 vectors depend on its batch in float32 rounding only (the matmuls' sums group differently
    for other batch shapes): on the shipped model at most 6.4e-6 from the same sentence in another batch
    (docs/performance.md); the same batches give the same bytes.
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
        bf16: bool = False,
        quantize: str | None = None,
        pool: str | None = None,
        dtype: str = "float32",
        settings: EmbedSettings | None = None,
    ):
        if settings is None:
            settings = EmbedSettings(
                layers=layers, scalar_parameters=scalar_parameters, gamma=gamma, batch_tokens=batch_tokens,
                buffer_tokens=buffer_tokens, batch_size=batch_size, max_sentence_words=max_sentence_words,
                device=device, bf16=bf16, quantize=quantize, pool=pool, dtype=dtype,
            )
        model, tokenizer = _model_and_tokenizer(model, tokenizer)
        settings.check_model(model.config)
        self.model = model.eval() if settings.device is None else model.to(settings.device).eval()
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer or ElmoCharTokenizer.for_model(model.config)
        # Token representations of the 20,000 most recently seen words and the packed LSTM weights, across calls.
        self.inference_cache = ElmoInferenceCache()
        self._apply(settings)

    def _apply(self, settings: EmbedSettings) -> None:
        """Take `settings` (checked when made) for the next calls."""
        self.settings = settings
        self.batch_tokens = settings.batch_tokens
        self.buffer_tokens = settings.buffer_tokens or 4 * settings.batch_tokens
        self.batch_size = settings.batch_size
        self.max_sentence_words = settings.max_sentence_words
        # What runs of bf16 / int8 on this device, decided once (float32 where they would not run or be slower).
        self.precision = Precision.of(self.device, settings.bf16, settings.quantize)
        self.layers = settings.layers
        self.mix = None
        num_layers = self.model.config.num_output_layers
        if self.layers in ("average", "mix"):
            self.mix = ElmoScalarMix(num_layers, initial_scalar_parameters=settings.scalar_parameters, trainable=False)
            self.mix.gamma.fill_(settings.gamma)  # trainable=False: a plain in-place update
            self.mix.to(self.device)
        self.pool = settings.pool
        self.dtype = np.dtype(settings.dtype)
        self.layout = settings.layout(self.model.config)
        self.token_shape = self.layout.token_shape  # of one word's output (with `pool`, of one sentence's)

    @property
    def bf16(self) -> bool:
        """Whether the biLM runs under bf16 (or float16) autocast here (`precision`)."""
        return self.precision.autocast_dtype is not None

    @property
    def quantize(self) -> str | None:
        """`"int8"` where the int8 mode runs here (`precision`), else None."""
        return self.precision.quantize

    def with_settings(self, **changes: object) -> ElmoEmbedder:
        """This embedder (the same model and cache) with some of its `EmbedSettings` changed (checked as any); itself
        when nothing changes. Another `layers` drops a mix's `scalar_parameters` and `gamma` unless given."""
        if "layers" in changes and changes["layers"] != "mix":
            changes = {"scalar_parameters": None, "gamma": 1.0, **changes}
        settings = dataclasses.replace(self.settings, **changes)
        if settings == self.settings:
            return self
        variant = copy.copy(self)
        variant._apply(settings)
        return variant

    def _layers(self, sentences: Sequence[Sequence[str]]) -> tuple[tuple[torch.Tensor, ...], ElmoBatch]:
        """One forward pass: the biLM layers, each (batch, positions, width) with the `<S>`/`</S>` rows, and the
        batch they were computed from, on the model's device."""
        batch = self.tokenizer.batch([list(words) for words in sentences]).to(self.device, non_blocking=True)
        with self.precision.autocast():
            layers = self.model(**batch, inference_cache=self.inference_cache,
                                quantize=self.precision.quantize).hidden_states
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

    def embed_batch(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One forward pass (on a GPU without the memory for it, several: the batch halved until each part fits, the
        same vectors). Returns per sentence an array `(layers, words, width)` or `(words, width)` (with `pool`:
        `(layers, width)` or `(width,)`), in `dtype`."""
        return [self._finished([vectors]) for vectors in self._word_vectors(sentences)]

    @torch.inference_mode()
    def _word_vectors(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """`embed_batch` before pooling and `dtype`: float32 vectors per word."""
        return halve_on_out_of_memory(
            list(sentences), self._embed_batch, lambda parts: [array for part in parts for array in part],
            lambda words: f"a sentence of {len(words)} words",
        )

    def _embed_batch(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        hidden_states, batch = self._layers(sentences)
        output = self.selected(hidden_states, batch.strip).float().cpu().numpy()
        # Copies, so that no sentence keeps the whole batch alive.
        return [output[..., row, :words, :].copy() for row, words in enumerate(batch.word_counts)]

    def selected(self, hidden_states: Sequence[torch.Tensor],
                 strip: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The biLM's layers (batch, positions, width) each → the `layers` this embedder gives, `strip` taking the
        boundary positions off: (layers, batch, words, width) with "all", else (batch, words, width)."""
        if self.layers == "all":
            return torch.stack([strip(layer) for layer in hidden_states])
        if self.layers == "top":
            return strip(hidden_states[-1])
        return strip(self.mix(hidden_states))

    def pooled(self, vectors: np.ndarray) -> np.ndarray:
        """One sentence's float32 word vectors ((layers, words, width) or (words, width)) → what this embedder gives
        for it: with `pool` its vector, in `dtype`."""
        return self._finished([vectors])

    def _finished(self, parts: Iterable[np.ndarray]) -> np.ndarray:
        """A sentence's float32 word vectors, in consecutive parts along its words → what the embedder gives for
        it: pooled (`pool`) and in `dtype`. Without `pool`, one part."""
        if self.pool is not None:
            return pool_words(map(torch.from_numpy, parts), self.pool).numpy().astype(self.dtype, copy=False)
        (vectors,) = parts
        return vectors.astype(self.dtype, copy=False)

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int | None = None
    ) -> Iterator[np.ndarray]:
        """Embed lazily, yielding one array per sentence (see `embed_batch`) in input order.

        The input is consumed in chunks of about `buffer_tokens` positions; each chunk is sorted by length and
        cut into batches of at most `batch_tokens` positions (and `batch_size` sentences, default the embedder's),
        so padding is small and memory bounded. A sentence longer than `max_sentence_words` is run as consecutive
        windows of that many words, each from the zero state, and their vectors are concatenated (or pooled), so a
        huge line needs the memory of a window (plus its output), not of the whole line.
        """
        for first, parts in self.sentence_parts(self.embedded_windows(sentences, batch_size)):
            if self.pool is not None or len(first.words) == first.sentence_words:  # one part
                yield next(parts)
                continue
            # The windows' vectors copied into the sentence's array as they come: one copy of a long line.
            embedding = next(parts)
            joined = np.empty((*embedding.shape[:-2], first.sentence_words, embedding.shape[-1]), dtype=self.dtype)
            start = 0
            for part in itertools.chain([embedding], parts):
                joined[..., start : start + part.shape[-2], :] = part
                start += part.shape[-2]
            yield joined

    def sentence_parts(
        self, windows: Iterable[tuple[Window, np.ndarray]]
    ) -> Iterator[tuple[Window, Iterator[np.ndarray]]]:
        """`embedded_windows` grouped by sentence: each sentence's first window and its output in parts along its
        words, to be read before the next sentence: its windows' vectors in `dtype`, or with `pool` one part, the
        sentence's vector (its windows read as they come, never held together)."""
        for _, group in itertools.groupby(windows, key=sentence_index):
            first, vectors = next(group)
            parts = (part for _, part in itertools.chain([(first, vectors)], group))
            if self.pool is not None:
                yield first, iter([self._finished(parts)])
            else:
                yield first, (part.astype(self.dtype, copy=False) for part in parts)

    def embedded_windows(
        self, sentences: Iterable[Sequence[str]], batch_size: int | None = None
    ) -> Iterator[tuple[Window, np.ndarray]]:
        """Every window of every sentence (see `embed_sentences`) with its float32 vectors per word, in input order;
        at most `buffer_tokens` positions of windows are read ahead, sorted by length and embedded in batches."""
        batch_size = batch_size or self.batch_size
        for chunk in chunks(sentence_windows(sentences, self.max_sentence_words), self.buffer_tokens):
            embeddings: dict[int, np.ndarray] = {}
            for batch in length_batches([len(window.words) for window in chunk], self.batch_tokens, batch_size):
                embeddings.update(zip(batch, self._word_vectors([chunk[j].words for j in batch])))
            for j, window in enumerate(chunk):
                yield window, embeddings.pop(j)


def _model_and_tokenizer(
    model: ElmoModel | str | os.PathLike, tokenizer: ElmoCharTokenizer | None
) -> tuple[ElmoModel, ElmoCharTokenizer | None]:
    """The biLM of `ElmoEmbedder`'s arguments (a model, or where to load one), and the tokenizer of a loaded directory
    or Hub id."""
    if isinstance(model, (str, os.PathLike)):
        model, saved = load_model_and_tokenizer(model)
        return model, tokenizer or saved
    if not isinstance(model, ElmoModel):
        raise TypeError(f"model must be an ElmoModel, a directory or a Hub id, got {type(model).__name__}")
    return model, tokenizer
