"""AllenNLP's ELMo names, with AllenNLP's signatures, defaults and outputs, for code written against
`allennlp.modules.elmo` and `allennlp.commands.elmo`; the one place where AllenNLP's conventions are translated into
this package's terms (the `elmo embed` flags `--options-file`, `--cuda-device`, `--all/--top/--average` included):

    from hf_elmo.allennlp import Elmo, ElmoEmbedder, batch_to_ids

    elmo = Elmo(options_file, weight_file, num_output_representations=2, dropout=0)
    output = elmo(batch_to_ids([["First", "sentence", "."], ["Another", "."]]))
    output["elmo_representations"]  # 2 x (2, 3, 1024); output["mask"]: (2, 3)

`options_file` and `weight_file` are the original files, or a published model's URLs (AllenNLP's
`DEFAULT_OPTIONS_FILE` / `DEFAULT_WEIGHT_FILE` give the published `original`, downloaded and converted once), and
AllenNLP's defaults are kept: `ElmoEmbedder()` here is the published `original`, where the project's own
`hf_elmo.ElmoEmbedder()` is the English model shipped with the package. The differences from AllenNLP that stay, on
purpose, are in docs/migrating.md: every sentence from the zero LSTM state; an empty sentence's width is the model's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import torch

from . import embed
from .embed.files import embed_lines
from .embed.outputs import check_not_input
from .embed.settings import EmbedSettingError, EmbedSettings
from .embed.writers import open_writer, output_files
from .loading import load_original
from .modeling_elmo import ElmoModel, ElmoWithScalarMixes
from .published import ALLENNLP_ENDPOINTS, PUBLISHED_MODELS
from .text import read_lines
from .tokenization_elmo import ElmoCharTokenizer

_ORIGINAL = PUBLISHED_MODELS["original"]
# AllenNLP 2's defaults (`allennlp.commands.elmo`): the published `original` biLM.
DEFAULT_OPTIONS_FILE = f"{ALLENNLP_ENDPOINTS[1]}/{_ORIGINAL.options_path}"
DEFAULT_WEIGHT_FILE = f"{ALLENNLP_ENDPOINTS[1]}/{_ORIGINAL.weights_path}"
DEFAULT_BATCH_SIZE = 64  # sentences per batch of `ElmoEmbedder.embed_sentences` / `embed_file`
# AllenNLP's character ids: 50 per word.
ALLENNLP_CHARACTERS_PER_TOKEN = 50
# `output_format` of `ElmoEmbedder.embed_file` (AllenNLP's `--all/--top/--average`): the embedder's `layers`.
OUTPUT_FORMATS = ("all", "top", "average")


def cuda_device_to_device(cuda_device: int) -> torch.device:
    """AllenNLP's `cuda_device` (-1: the CPU, n: `cuda:n`) as a device that exists here (an `EmbedSettingError`
    naming `cuda_device` otherwise)."""
    try:
        return EmbedSettings.device_of("cpu" if cuda_device < 0 else f"cuda:{cuda_device}")
    except EmbedSettingError as error:
        raise EmbedSettingError("cuda_device", error.message) from None


def batch_to_ids(batch: Sequence[Sequence[str]]) -> torch.Tensor:
    """AllenNLP's `batch_to_ids`: the character ids of a batch of word lists, (batch, longest, 50) int64, without
    the sentence-boundary rows (`Elmo` adds them), rows of zeros after each sentence's last word. As AllenNLP's
    `ELMoCharacterMapper` (`word.encode("utf-8", "ignore")`), a lone surrogate is dropped from its word; the package's
    tokenizer keeps its three bytes (undecodable input bytes: `hf_elmo.text.read_lines`)."""
    tokenizer = ElmoCharTokenizer(max_characters_per_token=ALLENNLP_CHARACTERS_PER_TOKEN)
    batch = [[word.encode("utf-8", "ignore").decode("utf-8") for word in sentence] for sentence in batch]
    ids = tokenizer.batch(batch).input_ids[:, 1:-1].clone()  # each row's </S> and what follows: zeros
    words = torch.arange(ids.shape[1])
    ids[words >= torch.tensor([len(sentence) for sentence in batch]).view(-1, 1)] = 0
    return ids


class ElmoEmbedder(embed.ElmoEmbedder):
    """AllenNLP's `ElmoEmbedder(options_file, weight_file, cuda_device)` with AllenNLP's defaults: with no arguments,
    the published `original` biLM (width 1024; by name: downloaded and converted once). `embed_sentence`,
    `embed_batch`, `embed_sentences`, `batch_to_embeddings` are `hf_elmo.embed.ElmoEmbedder`'s; `embed_file` is
    AllenNLP's.

    Args (AllenNLP's):
        options_file, weight_file: the original `options.json` and `.hdf5` weights, or a published model's URLs.
        cuda_device: -1 (the default) for the CPU, n for `cuda:n`.
    """

    def __init__(
        self,
        options_file: str | os.PathLike = DEFAULT_OPTIONS_FILE,
        weight_file: str | os.PathLike = DEFAULT_WEIGHT_FILE,
        cuda_device: int = -1,
    ):
        super().__init__(load_original(options_file, weight_file), device=cuda_device_to_device(cuda_device),
                         batch_size=DEFAULT_BATCH_SIZE)

    def embed_file(
        self,
        input_file: IO | str | os.PathLike,
        output_file_path: str | os.PathLike,
        output_format: str = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
    ) -> None:
        """AllenNLP's `embed_file`: every line of `input_file` (an open file, as AllenNLP takes it, or a path) is a
        sentence of whitespace-separated words; the layers of `output_format` ("all", "top" or "average") of each go
        to `output_file_path` as HDF5 in AllenNLP's `elmo` layout, whatever the file is called (`sentence_to_index`
        unless `forget_sentences`; each dataset named by its line with `use_sentence_keys`). A blank line is refused,
        as AllenNLP does (nothing written): `hf_elmo.embed.embed_file` keeps it, a sentence without words. An open
        `input_file` is closed, as AllenNLP does."""
        if output_format not in OUTPUT_FORMATS:
            raise EmbedSettingError("output_format", f"must be one of {', '.join(OUTPUT_FORMATS)}, got "
                                    f"{output_format!r}")
        embedder = self.with_settings(layers=output_format, batch_size=batch_size)
        name = getattr(input_file, "name", input_file)

        def sentences():
            for index, line in enumerate(read_lines(input_file)):
                if not line.strip():
                    raise ValueError(f"{name}: line {index + 1} is blank: AllenNLP's embed_file takes one sentence per "
                                     "line, none empty (remove it, or keep it as a sentence without words with "
                                     "hf_elmo.embed.embed_file or elmo embed)")
                yield line

        try:
            check_not_input(output_files(output_file_path, file_format="hdf5"), [input_file])
            with open_writer(Path(output_file_path), embedder.layout, not forget_sentences, use_sentence_keys,
                             file_format="hdf5") as writer:
                embed_lines(embedder, sentences(), writer, tokenized=True, source=str(name))
        finally:
            if hasattr(input_file, "close"):
                input_file.close()


class _ZeroState:
    """AllenNLP's `_ElmoBiLm` and `ElmoLstm`, as far as code resetting their states reaches: there are none to reset."""

    @property
    def _elmo_lstm(self) -> _ZeroState:
        return self

    def reset_states(self, mask: torch.Tensor | None = None) -> None:
        """Nothing to do: no state is carried from one batch to the next."""


class Elmo(ElmoWithScalarMixes):
    """AllenNLP's `Elmo`: the biLM run once, `num_output_representations` learned scalar mixes of its layers.

    One difference, on purpose: AllenNLP's `Elmo` carries the LSTM states from one batch to the next (row by row),
    so a sentence's vectors depend on the batches before it; here every sentence starts from the zero state, so
    they do not (AllenNLP's vectors for its first batch).

    Args (AllenNLP's):
        options_file, weight_file: the original `options.json` and `weights.hdf5`, or a published model's URLs;
            ignored when `module` is given.
        num_output_representations: how many mixes (e.g. one for a task model's input, one for its output).
        requires_grad: fine-tune the biLM (default frozen).
        do_layer_norm: layer-normalise each layer before mixing.
        dropout: on every mixed output in training (AllenNLP's default 0.5).
        vocab_to_cache: not supported (the character CNN's outputs are cached per word by `ElmoInferenceCache`
            at inference); must be None.
        keep_sentence_boundaries: keep the `<S>`/`</S>` positions in the outputs and the mask.
        scalar_mix_parameters: fixed, untrained mix weights (before the softmax), one per layer.
        module: an `ElmoModel` to use instead of loading `options_file`/`weight_file` (e.g.
            `load_model("original")`).
    """

    def __init__(
        self,
        options_file: str | os.PathLike | None = None,
        weight_file: str | os.PathLike | None = None,
        num_output_representations: int = 1,
        requires_grad: bool = False,
        do_layer_norm: bool = False,
        dropout: float = 0.5,
        vocab_to_cache: list[str] | None = None,
        keep_sentence_boundaries: bool = False,
        scalar_mix_parameters: Sequence[float] | None = None,
        module: ElmoModel | None = None,
    ):
        if vocab_to_cache is not None:
            raise ValueError("vocab_to_cache is not supported: give character ids (batch_to_ids); the token "
                             "representations of seen words are cached at inference without it")
        if module is None:
            if options_file is None or weight_file is None:
                raise ValueError("give options_file and weight_file (the original ELMo weights), or module")
            module = load_original(options_file, weight_file)
        super().__init__(module, num_output_representations, requires_grad, keep_sentence_boundaries, dropout,
                         do_layer_norm, scalar_mix_parameters)
        tokenizer = ElmoCharTokenizer.for_model(module.config)
        boundaries = [tokenizer.word_to_char_ids(str(token)) for token in (tokenizer.bos_token, tokenizer.eos_token)]
        self.register_buffer("boundary_ids", torch.tensor(boundaries), persistent=False)  # (2, chars): <S>, </S>

    def get_output_dim(self) -> int:
        return self.elmo.config.output_dim

    @property
    def _elmo_lstm(self) -> _ZeroState:
        """What AllenNLP code reaches for to reset the carried LSTM states (`elmo._elmo_lstm._elmo_lstm.reset_states()`,
        before every batch for vectors that do not depend on the batches before): here every sentence starts from the
        zero state anyway, so that call runs and changes nothing."""
        return _ZeroState()

    def forward(self, inputs: torch.Tensor, word_inputs: torch.Tensor | None = None) -> dict:
        """(..., words, chars) character ids of `batch_to_ids` (any leading dimensions, e.g. (batch, sentences,
        words, chars): each row a sentence), without boundary rows → AllenNLP's dict: `elmo_representations`, a list
        of (..., words, output_dim) (zeros at padding), and `mask` (..., words) bool (with `keep_sentence_boundaries`,
        words + 2 positions)."""
        if word_inputs is not None:
            raise ValueError("word_inputs need vocab_to_cache, which is not supported: give character ids only")
        chars = self.elmo.config.max_characters_per_token
        if inputs.dim() < 3 or inputs.shape[-1] != chars:
            raise ValueError(f"inputs must be (..., words, {chars}) character ids (batch_to_ids), got shape "
                             f"{tuple(inputs.shape)}")
        leading = inputs.shape[:-2]
        output = self._rows(inputs.reshape(-1, *inputs.shape[-2:]))
        return {"elmo_representations": [representation.reshape(*leading, *representation.shape[1:])
                                         for representation in output["elmo_representations"]],
                "mask": output["mask"].reshape(*leading, output["mask"].shape[-1])}

    def _rows(self, inputs: torch.Tensor) -> dict:
        """`forward` of (rows, words, chars) ids."""
        words_mask = (inputs > 0).any(-1)
        lengths = words_mask.sum(1)
        positions = torch.arange(inputs.shape[1] + 2, device=inputs.device)
        attention_mask = positions < (lengths + 2).unsqueeze(1)
        input_ids = inputs.new_zeros((inputs.shape[0], inputs.shape[1] + 2, inputs.shape[2]), dtype=torch.long)
        input_ids[:, 1:-1] = inputs
        input_ids[:, 0] = self.boundary_ids[0]
        input_ids[torch.arange(inputs.shape[0], device=inputs.device), lengths + 1] = self.boundary_ids[1]
        output = super().forward(input_ids, attention_mask)
        return {"elmo_representations": list(output.representations), "mask": output.mask}


__all__ = ["DEFAULT_OPTIONS_FILE", "DEFAULT_WEIGHT_FILE", "Elmo", "ElmoEmbedder", "batch_to_ids",
           "cuda_device_to_device"]
