"""Model cards of ELMo `save_pretrained` directories and Hub repos: the architecture, the source of the weights,
usage, intended use, limitations and bias, written by `elmo convert`, `elmo pretrain`, `export_encoder` and
`push_to_hub` (`hf_elmo.hub`); a trained model's source section (`training_source`: its corpus, word tokenizer,
vocabulary, softmax, steps and held-out perplexity) is written here too."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData

from .configuration_elmo import ElmoConfig


@dataclass
class CardMetadata:
    """Hub metadata of a card: the language of the training text, the Hub ids of its datasets, and the Hub model
    the weights were fine-tuned from."""

    language: str | None = None
    datasets: list[str] = field(default_factory=list)
    base_model: str | None = None


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
| word embedding | {word_embedding} |
| highway layers | {n_highway} |
| token representation | {projection_dim} |
| biLSTM | {n_layers} layers per direction, cell {lstm_dim}, projection {projection_dim} |
| clipping | cell {cell_clip}, projection {proj_clip} |
| residual connections | {use_skip_connections} |
| output layers | {num_output_layers} of width {output_dim}: the token layer duplicated, then each biLSTM layer |
| word softmax | {softmax} |
| parameters | {n_parameters:,} |

Input: {input_text} Every sentence starts from the zero LSTM state, so its vectors do not depend on the rest of its
batch.

## Usage with transformers

```python
import torch
from transformers import AutoModel, AutoTokenizer
{import_package}
tokenizer = AutoTokenizer.from_pretrained("{repo_id}"{remote_code})
model = AutoModel.from_pretrained("{repo_id}"{remote_code}).eval()
batch = tokenizer([["The", "bank", "of", "the", "river", "."]], is_split_into_words=True,
                  padding=True, return_tensors="pt")
with torch.no_grad():
    layers = model(**batch).hidden_states  # {num_output_layers} x (batch, words + 2, {output_dim})
```
{lm_usage}
{loading_note}

## Usage with spaCy

With the `spacy-elmo` package installed:

```python
import spacy

nlp = spacy.blank("{spacy_lang}")
nlp.add_pipe("elmo", config={{"model": {{"name": "{repo_id}"}}}})
doc = nlp("The bank of the river.")
doc._.elmo_layers  # ({num_output_layers}, n_tokens, {output_dim})
```

## Intended use

Contextual word vectors as features for other models (tagging, named entities, parsing, classification, question
answering): a task model learns a scalar mix of the {num_output_layers} layers, the biLM frozen or fine-tuned, as in
the paper. It is not a text generator.

## Limitations

- The vectors are best for text like the training text (see the source of the weights), split into words the same
  way{word_tokenizer_note}; other languages, domains and registers (code, social media, transcripts) get weaker
  ones.
- Words are cut to their first {max_word_length}. Every sentence is read alone, from the zero state: no
  context crosses a sentence boundary, and a very long sentence costs time linear in its length.
- Inference is float32; bf16 or fp16 autocast is faster and changes the vectors slightly.

## Bias

A language model learns the associations of its training text, social biases and stereotypes included (ELMo's
vectors encode gender bias: Zhao et al. 2019, "Gender Bias in Contextualized Word Embeddings"). Systems built on
these vectors can reproduce or amplify them: evaluate them on the people and the use they serve before deploying
them.
"""

_LM_USAGE = """
The biLM's word softmax is included: `AutoModelForPreTraining.from_pretrained("{repo_id}"{remote_code})`
gives `ElmoForBidirectionalLM`, whose `forward_logits` / `backward_logits` score the next / previous word.
"""
# What makes the snippets load: the modeling code in the directory (`trust_remote_code`), or the package.
_REMOTE_CODE_NOTE = ("With the `spacy-elmo` package installed, `import hf_elmo` registers the classes and "
                     "`trust_remote_code` is not needed.")
_PACKAGE_NOTE = ("This directory holds no modeling code: it loads where the `spacy-elmo` package is installed, whose "
                 "`import hf_elmo` registers the ELMo classes with the Auto classes.")

_SOURCE_SECTION = re.compile(r"^## Source of the weights[ \t]*\n(.*?)(?=^## |\Z)", re.DOTALL | re.MULTILINE)
RANDOM_WEIGHTS_SOURCE = "Randomly initialised weights: this model has not been trained."


def build_model_card(
    config: ElmoConfig,
    source: str,
    repo_id: str = "path/to/model",
    n_parameters: int = 0,
    tags: list[str] | None = None,
    metadata: CardMetadata | None = None,
    remote_code: bool = True,
) -> ModelCard:
    """A model card describing the architecture, its size, where the weights come from and how to use them.

    `repo_id` is the id the usage snippets load; `tags` are added to the card's own; `metadata` fills the card's
    `language` (by default the language of a `spacy:<lang>` word tokenizer), `datasets` and `base_model`.
    `remote_code`: the directory holds the modeling code (the snippets pass `trust_remote_code=True`); else they
    `import hf_elmo`.
    """
    own_tags = ["elmo", "bilm", "feature-extraction", *(["custom_code"] if remote_code else [])]
    metadata = metadata or CardMetadata()
    word_tokenizer = getattr(config, "word_tokenizer", None) or ""
    tokenizer_language = word_tokenizer.partition(":")[2] if word_tokenizer.startswith("spacy:") else None
    card_data = ModelCardData(
        language=metadata.language or tokenizer_language,
        library_name="transformers",
        license="apache-2.0",
        tags=[*own_tags, *(tag for tag in tags or [] if tag not in own_tags)],
        datasets=metadata.datasets or None,
        base_model=metadata.base_model,
        pipeline_tag="feature-extraction",
    )
    has_softmax = bool(config.vocab_size)
    trust = ", trust_remote_code=True" if remote_code else ""
    text = _CARD_TEMPLATE.format(
        card_data=card_data.to_yaml(),
        title_suffix=f" {config.lstm_dim}x{config.projection_dim}",
        source=source.strip(),
        repo_id=repo_id,
        n_parameters=n_parameters,
        max_word_length=f"{config.max_characters_per_token - 2} " + (
            "UTF-8 bytes" if config.character_vocabulary == "bytes" else "characters"),
        input_text=_input_text(config),
        word_embedding=(f"{config.word_vocab_size - 1:,} words x {config.word_embedding_dim}, beside the char CNN"
                        if config.word_embedding_dim else "none"),
        spacy_lang=tokenizer_language or "en",
        n_filters=config.n_filters,
        output_dim=config.output_dim,
        num_output_layers=config.num_output_layers,
        softmax=f"{config.vocab_size:,} words, shared by both directions" if has_softmax else "none (encoder only)",
        lm_usage=_LM_USAGE.format(repo_id=repo_id, remote_code=trust) if has_softmax else "",
        remote_code=trust,
        import_package="" if remote_code else "\nimport hf_elmo  # the spacy-elmo package: the ELMo Auto classes\n",
        loading_note=_REMOTE_CODE_NOTE if remote_code else _PACKAGE_NOTE,
        word_tokenizer_note=f" (`{word_tokenizer}`, which the tokenizer applies to raw text)" if word_tokenizer else "",
        **{key: getattr(config, key) for key in (
            "filters", "activation", "char_embedding_dim", "n_highway", "projection_dim", "n_layers", "lstm_dim",
            "cell_clip", "proj_clip", "use_skip_connections", "max_characters_per_token",
        )},
    )
    return ModelCard(text)


def _input_text(config: ElmoConfig) -> str:
    """How a sentence becomes the biLM's input, for the card."""
    slots = config.max_characters_per_token
    if config.character_vocabulary == "bytes":
        return (f"every word is its UTF-8 bytes (at most {slots - 2}) between begin/end-of-word markers, {slots} "
                "character ids per word; `<S>` and `</S>` rows frame every sentence.")
    words = " and the word itself is looked up in the word lexicon" if config.word_embedding_dim else ""
    return (f"every word is its characters (at most {slots - 2}) looked up in the model's character lexicon (`<oov>` "
            f"for others) between `<bow>` and `<eow>`, {slots} character ids per word{words} (ELMoForManyLangs' "
            "conventions; the tokenizer holds the lexicons); `<bos>` and `<eos>` rows frame every sentence.")


def model_card(
    model: torch.nn.Module,
    repo_id: str,
    source: str | None = None,
    tags: list[str] | None = None,
    metadata: CardMetadata | None = None,
    remote_code: bool = True,
) -> ModelCard:
    """The card of `model` (an `ElmoModel` or `ElmoForBidirectionalLM`); `source` defaults to `weights_source`."""
    n_parameters = sum(p.numel() for p in model.parameters())
    return build_model_card(model.config, source or weights_source(model), repo_id, n_parameters, tags, metadata,
                            remote_code)


def write_model_card(
    output_dir: str | Path,
    model: torch.nn.Module,
    source: str,
    repo_id: str = "path/to/model",
    metadata: CardMetadata | None = None,
    remote_code: bool = True,
) -> Path:
    """Write `README.md` (the model card of `model`) into a `save_pretrained` directory (with the modeling code
    unless `remote_code` is False)."""
    path = Path(output_dir) / "README.md"
    model_card(model, repo_id, source, metadata=metadata, remote_code=remote_code).save(path)
    return path


def card_metadata(card_text: str) -> CardMetadata:
    """The `language`, `datasets` and `base_model` of a card."""
    data = ModelCard(card_text).data
    language = data.language[0] if isinstance(data.language, list) and len(data.language) == 1 else data.language
    return CardMetadata(language=language, datasets=list(data.datasets or []), base_model=data.base_model)


def card_source(card_text: str) -> str | None:
    """The "Source of the weights" section of a card made by `build_model_card`, or None."""
    match = _SOURCE_SECTION.search(card_text)
    return (match.group(1).strip() or None) if match else None


def weights_source(model: torch.nn.Module) -> str:
    """Where `model`'s weights come from, for its card.

    A model loaded from a directory with a card of ours (e.g. made by `convert`) keeps that card's source; one
    loaded from a Hub repo names the repo; a freshly built model says its weights are random. Local paths are
    never written into a card.
    """
    origin = str(getattr(model, "name_or_path", "") or "")
    if not origin:
        return RANDOM_WEIGHTS_SOURCE
    if os.path.isdir(origin):
        readme = Path(origin) / "README.md"
        source = card_source(readme.read_text(encoding="utf-8")) if readme.is_file() else None
        return source or "Not recorded: the weights were loaded from a local directory without a model card."
    return f"The weights of the Hub model `{origin}` (see its model card)."


# -- a trained model's source section ----------------------------------------------------------------------------


TOKENIZER_DESCRIPTIONS = {
    "whitespace": "pre-tokenized text, words separated by whitespace",
    "elmo": "`hf_elmo.split_words`, the raw-text mode of `ElmoCharTokenizer` (Moses-style)",
}


def describe_word_tokenizer(name: str) -> str:
    if name.startswith("spacy:"):
        return f'the tokenizer of `spacy.blank("{name[len("spacy:"):]}")` (whitespace tokens dropped)'
    return TOKENIZER_DESCRIPTIONS.get(name, name)


def describe_files(paths: list[str], shown: int = 4) -> str:
    """File names (never their local directories) for a card: the first `shown`, then how many more."""
    names = ", ".join(Path(path).name for path in paths[:shown])
    return names + (f" and {len(paths) - shown} more files" if len(paths) > shown else "")


def _format_perplexities(metrics: dict[str, float]) -> str:
    return (
        f"forward {metrics['forward_perplexity']:.2f}, backward {metrics['backward_perplexity']:.2f}, "
        f"average {metrics['average_perplexity']:.2f} ({metrics['tokens']:,} tokens)"
    )


def training_source(
    *,
    started_from: str,
    corpus: str,
    word_tokenizer: str,
    vocab_size: int,
    num_sampled: int,
    steps: int,
    tokens: int,
    batch: str,
    optimizer: str,
    validation: dict[str, float] | None = None,
    validation_corpus: str | None = None,
) -> str:
    """The "Source of the weights" section of a trained model's card (see `hf_elmo.cards.build_model_card`)."""
    softmax = f"sampled, {num_sampled:,} log-uniform candidates per batch" if num_sampled else "full"
    rows = [
        ("corpus", corpus),
        ("word tokenizer", f"`{word_tokenizer}`: {describe_word_tokenizer(word_tokenizer)}; apply the same at "
                           "inference"),
        ("vocabulary", f"{vocab_size:,} words in `vocab.txt` (`<S>`, `</S>`, `<UNK>`, then by decreasing frequency)"),
        ("softmax in training", softmax),
        ("training", f"{steps:,} optimizer steps, {tokens:,} tokens per direction; {batch}; {optimizer}"),
        ("sequences", "one line (sentence or paragraph) per sequence, every one from the zero LSTM state"),
    ]
    if validation is not None:
        rows.append((f"held-out perplexity, full softmax ({validation_corpus})", _format_perplexities(validation)))
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return (
        f"Trained with `elmo pretrain` (the `spacy-elmo` package: PyTorch + Hugging Face Accelerate), starting from "
        f"{started_from}.\n\n| | |\n|---|---|\n{table}\n\nPerplexities count the words plus one `</S>` (forward) "
        "or `<S>` (backward) per line; the average is exp(mean of the two cross-entropies)."
    )
