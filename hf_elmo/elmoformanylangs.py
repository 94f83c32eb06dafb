"""ELMoForManyLangs' `Embedder`, here: `from hf_elmo.elmoformanylangs import Embedder` in place of `from
elmoformanylangs import Embedder`, the same calls and outputs (every sentence from the zero state, which its own
gives after `model.encoder.reset_states()`), as `hf_elmo.allennlp` holds AllenNLP's names. Its models:
`hf_elmo.efml_format` (reading and converting them) and the names `efml-<language>` (`hf_elmo.published`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .efml_format import is_efml_model, load_efml
from .embed import ElmoEmbedder


class Embedder:
    """ELMoForManyLangs' `Embedder`: `Embedder(model_dir, batch_size=64).sents2elmo(sents, output_layer=-1)` gives
    what its `sents2elmo` gives (every sentence from the zero state), from an ELMoForManyLangs model directory or
    .zip (converted in memory), a converted `save_pretrained` directory, or a model name.

    Args:
        model_dir: where the model is.
        batch_size: sentences per forward pass at most.
    """

    def __init__(self, model_dir: str | os.PathLike, batch_size: int = 64):
        if is_efml_model(model_dir):
            model, tokenizer = load_efml(model_dir)
            self._embedder = ElmoEmbedder(model, tokenizer, batch_size=batch_size)
        else:
            self._embedder = ElmoEmbedder(str(model_dir), batch_size=batch_size)
        self.model_dir = model_dir
        self.batch_size = batch_size

    def sents2elmo(self, sents: Sequence[Sequence[str]], output_layer: int = -1) -> list[np.ndarray]:
        """Per sentence (a list of words) a float32 array: `output_layer` -1 the average of the layers (words,
        width), -2 all of them (layers, words, width), 0 the token layer, 1, 2, ... a biLSTM layer (words, width)."""
        count = self._embedder.model.config.num_output_layers
        if isinstance(output_layer, bool) or output_layer not in (-1, -2, *range(count)):
            raise ValueError(f"output_layer must be -1 (the average), -2 (all layers) or a layer 0..{count - 1}, got "
                             f"{output_layer!r}")
        embedded = list(self._embedder.embed_sentences([list(words) for words in sents]))
        if output_layer == -2:
            return embedded
        if output_layer == -1:
            return [array.mean(axis=0) for array in embedded]  # np.average, which fails on an empty sentence
        return [array[output_layer] for array in embedded]
