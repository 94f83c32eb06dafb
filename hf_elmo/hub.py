"""Model cards for ELMo `save_pretrained` directories and Hub repos."""

from __future__ import annotations

from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData

from .configuration_elmo import ElmoConfig

_CARD_TEMPLATE = """---
{card_data}
---

# ELMo biLM{title_suffix}

A bidirectional language model with character inputs (ELMo, Peters et al. 2018, "Deep contextualized word
representations"), packaged for Hugging Face `transformers` with the `elmo` project.

## Source of the weights

{source}

## Architecture

| | |
|---|---|
| character CNN | {n_filters} filters {filters}, {activation}, char embedding {char_embedding_dim} |
| highway layers | {n_highway} |
| token representation | {projection_dim} |
| biLSTM | {n_layers} layers per direction, cell {lstm_dim}, projection {projection_dim} |
| clipping | cell {cell_clip}, projection {proj_clip} |
| residual connections | {use_skip_connections} |
| output layers | {num_output_layers} of width {output_dim}: the token layer duplicated, then each biLSTM layer |
| parameters | {n_parameters:,} |

Input: every word is its UTF-8 bytes (at most {max_word_bytes}) between begin/end-of-word markers,
{max_characters_per_token} character ids per word; `<S>` and `</S>` rows frame every sentence. Every sentence
starts from the zero LSTM state, so its vectors do not depend on the rest of its batch.

## Usage with transformers

```python
import torch
from transformers import AutoModel, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{repo_id}", trust_remote_code=True)
model = AutoModel.from_pretrained("{repo_id}", trust_remote_code=True).eval()
batch = tokenizer([["The", "bank", "of", "the", "river", "."]], is_split_into_words=True,
                  padding=True, return_tensors="pt")
with torch.no_grad():
    layers = model(**batch).hidden_states  # {num_output_layers} x (batch, words + 2, {output_dim})
```

With the `elmo` package installed (`pip install elmo`), `trust_remote_code` is not needed.

## Usage with spaCy

```python
import spacy

nlp = spacy.blank("en")
nlp.add_pipe("elmo", config={{"model": {{"name": "{repo_id}"}}}})
doc = nlp("The bank of the river.")
doc._.elmo_layers  # ({num_output_layers}, n_tokens, {output_dim})
```
"""


def build_model_card(
    config: ElmoConfig, source: str, repo_id: str = "path/to/model", n_parameters: int = 0
) -> ModelCard:
    """A model card describing the architecture, its size, where the weights come from and how to use them."""
    card_data = ModelCardData(
        library_name="transformers",
        license="apache-2.0",
        tags=["elmo", "bilm", "feature-extraction", "custom_code"],
        pipeline_tag="feature-extraction",
    )
    text = _CARD_TEMPLATE.format(
        card_data=card_data.to_yaml(),
        title_suffix=f" {config.lstm_dim}x{config.projection_dim}",
        source=source,
        repo_id=repo_id,
        n_parameters=n_parameters,
        max_word_bytes=config.max_characters_per_token - 2,
        n_filters=config.n_filters,
        output_dim=config.output_dim,
        num_output_layers=config.num_output_layers,
        **{key: getattr(config, key) for key in (
            "filters", "activation", "char_embedding_dim", "n_highway", "projection_dim", "n_layers", "lstm_dim",
            "cell_clip", "proj_clip", "use_skip_connections", "max_characters_per_token",
        )},
    )
    return ModelCard(text)


def write_model_card(
    output_dir: str | Path, model: torch.nn.Module, source: str, repo_id: str = "path/to/model"
) -> Path:
    """Write `README.md` (the model card of `model`) into a `save_pretrained` directory."""
    n_parameters = sum(p.numel() for p in model.parameters())
    path = Path(output_dir) / "README.md"
    build_model_card(model.config, source, repo_id, n_parameters).save(path)
    return path
