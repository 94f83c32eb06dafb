"""AllenNLP's ELMo names, with AllenNLP's signatures and outputs, for code written against `allennlp.modules.elmo`
and `allennlp.commands.elmo`:

    from hf_elmo.allennlp import Elmo, ElmoEmbedder, batch_to_ids

    elmo = Elmo(options_file, weight_file, num_output_representations=2, dropout=0)
    output = elmo(batch_to_ids([["First", "sentence", "."], ["Another", "."]]))
    output["elmo_representations"]  # 2 x (2, 3, 1024); output["mask"]: (2, 3)

`options_file` and `weight_file` are the original files, or a published model's URLs (AllenNLP's
`DEFAULT_OPTIONS_FILE` / `DEFAULT_WEIGHT_FILE` give the published `original`, downloaded and converted once), and
AllenNLP's defaults are kept: `ElmoEmbedder()` here is the published `original`, where the project's own
`hf_elmo.ElmoEmbedder()` is the English model shipped with the package.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from . import embed
from .loading import load_original
from .modeling_elmo import ElmoModel, ElmoWithScalarMixes
from .published import ALLENNLP_ENDPOINTS, PUBLISHED_MODELS
from .tokenization_elmo import ElmoCharTokenizer

_ORIGINAL = PUBLISHED_MODELS["original"]
# AllenNLP 2's defaults (`allennlp.commands.elmo`): the published `original` biLM.
DEFAULT_OPTIONS_FILE = f"{ALLENNLP_ENDPOINTS[1]}/{_ORIGINAL.options_path}"
DEFAULT_WEIGHT_FILE = f"{ALLENNLP_ENDPOINTS[1]}/{_ORIGINAL.weights_path}"
# AllenNLP's character ids: 50 per word.
ALLENNLP_CHARACTERS_PER_TOKEN = 50


def batch_to_ids(batch: Sequence[Sequence[str]]) -> torch.Tensor:
    """AllenNLP's `batch_to_ids`: the character ids of a batch of word lists, (batch, longest, 50) int64, without
    the sentence-boundary rows (`Elmo` adds them), rows of zeros after each sentence's last word."""
    tokenizer = ElmoCharTokenizer(max_characters_per_token=ALLENNLP_CHARACTERS_PER_TOKEN)
    ids = tokenizer.batch(batch).input_ids[:, 1:-1].clone()  # each row's </S> and what follows: zeros
    words = torch.arange(ids.shape[1])
    ids[words >= torch.tensor([len(sentence) for sentence in batch]).view(-1, 1)] = 0
    return ids


class ElmoEmbedder(embed.ElmoEmbedder):
    """AllenNLP's `ElmoEmbedder(options_file, weight_file, cuda_device)` with AllenNLP's defaults: with no arguments,
    the published `original` biLM (width 1024; by name: downloaded and converted once). The other arguments, and
    every method, are `hf_elmo.ElmoEmbedder`'s, whose own default is the English model shipped with this package.

    Args (AllenNLP's):
        options_file, weight_file: the original `options.json` and `.hdf5` weights, or a published model's URLs.
        cuda_device: -1 (the default) for the CPU, n for `cuda:n`.
    """

    def __init__(
        self,
        options_file: str | os.PathLike = DEFAULT_OPTIONS_FILE,
        weight_file: str | os.PathLike = DEFAULT_WEIGHT_FILE,
        cuda_device: int = -1,
        **kwargs,
    ):
        super().__init__(options_file=options_file, weight_file=weight_file, cuda_device=cuda_device, **kwargs)


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

    def forward(self, inputs: torch.Tensor, word_inputs: torch.Tensor | None = None) -> dict:
        """(batch, words, chars) character ids of `batch_to_ids`, without boundary rows → AllenNLP's dict:
        `elmo_representations`, a list of (batch, words, output_dim) (zeros at padding), and `mask` (batch, words)
        bool (with `keep_sentence_boundaries`, words + 2 positions)."""
        if word_inputs is not None:
            raise ValueError("word_inputs need vocab_to_cache, which is not supported: give character ids only")
        chars = self.elmo.config.max_characters_per_token
        if inputs.dim() != 3 or inputs.shape[-1] != chars:
            raise ValueError(f"inputs must be (batch, words, {chars}) character ids (batch_to_ids), got shape "
                             f"{tuple(inputs.shape)}")
        words_mask = (inputs > 0).any(-1)
        lengths = words_mask.sum(1)
        positions = torch.arange(inputs.shape[1] + 2, device=inputs.device)
        attention_mask = positions < (lengths + 2).unsqueeze(1)
        input_ids = torch.zeros((inputs.shape[0], inputs.shape[1] + 2, chars), dtype=torch.long, device=inputs.device)
        input_ids[:, 1:-1] = inputs
        input_ids[:, 0] = self.boundary_ids[0]
        input_ids[torch.arange(inputs.shape[0], device=inputs.device), lengths + 1] = self.boundary_ids[1]
        output = super().forward(input_ids, attention_mask)
        return {"elmo_representations": list(output.representations), "mask": output.mask}


__all__ = ["DEFAULT_OPTIONS_FILE", "DEFAULT_WEIGHT_FILE", "Elmo", "ElmoEmbedder", "batch_to_ids"]
