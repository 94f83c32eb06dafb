"""transformers' token-classification pipeline for ELMo models, whose tokens are whole words of character ids.

The stock `TokenClassificationPipeline` reads one token id per position (`convert_ids_to_tokens`) and guesses
sub-words from offsets, which only fast tokenizers give it. Here every position is a word: its text and character
span come from the tokenizer's offsets, nothing is a sub-word, and pre-split input (`is_split_into_words=True`)
works. Entity grouping (`aggregation_strategy`) and everything else is transformers' own.

In-process: `pipeline("token-classification", model=model, tokenizer=tokenizer,
pipeline_class=ElmoTokenClassificationPipeline)`. `save_pretrained` of such a pipeline writes this file and
`custom_pipelines` into the directory, so `pipeline("token-classification", model=directory_or_hub_id,
trust_remote_code=True)` builds it again, with no `hf_elmo` installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from transformers import AutoModelForTokenClassification, TokenClassificationPipeline


class ElmoTokenClassificationPipeline(TokenClassificationPipeline):
    """`TokenClassificationPipeline` where each position of an `ElmoCharTokenizer` encoding is one word."""

    def preprocess(self, sentence: str | list[str], offset_mapping: Any = None, **preprocess_params) -> Iterator[dict]:
        """One sentence (raw text, or a list of words with `is_split_into_words=True`) as one model input."""
        tokenizer_params = preprocess_params.pop("tokenizer_params", {})
        split = preprocess_params["is_split_into_words"]
        word_to_chars_map = None
        if split:
            if not isinstance(sentence, list):
                raise ValueError("When `is_split_into_words=True`, `sentence` must be a list of words.")
            text = preprocess_params["delimiter"].join(sentence)
            word_to_chars_map, start = [], 0
            for word in sentence:  # the words' spans in `text`
                word_to_chars_map.append((start, start + len(word)))
                start += len(word) + len(preprocess_params["delimiter"])
        elif isinstance(sentence, str):
            text = sentence
        else:
            raise ValueError("When `is_split_into_words=False`, `sentence` must be an untokenized string.")
        inputs = self.tokenizer(
            sentence, is_split_into_words=split, return_tensors="pt", return_special_tokens_mask=True,
            return_offsets_mapping=offset_mapping is None, **tokenizer_params,
        )
        model_inputs = dict(inputs)
        if offset_mapping is not None:
            model_inputs["offset_mapping"] = offset_mapping
        model_inputs.update(sentence=text, is_last=True)
        if split:
            model_inputs.update(word_ids=inputs.word_ids(0), word_to_chars_map=word_to_chars_map)
        yield model_inputs

    def gather_pre_entities(
        self,
        sentence: str,
        input_ids: np.ndarray,
        scores: np.ndarray,
        offset_mapping: list[tuple[int, int]] | None,
        special_tokens_mask: np.ndarray,
        aggregation_strategy: Any,
        word_ids: list[int | None] | None = None,
        word_to_chars_map: list[tuple[int, int]] | None = None,
    ) -> list[dict]:
        """One entry per word (`<S>`, `</S>` skipped): its text, label scores (labels,) and character span."""
        entities = []
        for index, word_scores in enumerate(scores):
            if special_tokens_mask[index]:
                continue
            start, end = (int(value) for value in offset_mapping[index])
            if word_to_chars_map is not None:  # offsets within each given word: make them offsets in `sentence`
                start, end = (offset + word_to_chars_map[word_ids[index]][0] for offset in (start, end))
            entities.append({"word": sentence[start:end], "scores": word_scores, "start": start, "end": end,
                             "index": index, "is_subword": False})
        return entities


# What `save_pretrained` records in `config.custom_pipelines` (transformers' `PIPELINE_REGISTRY` entry format),
# without replacing the token-classification pipeline of other models in this process.
ElmoTokenClassificationPipeline._registered_impl = {
    "token-classification": {
        "impl": ElmoTokenClassificationPipeline, "pt": (AutoModelForTokenClassification,), "type": "text",
    }
}
