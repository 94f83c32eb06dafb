"""The "Source of the weights" of a trained biLM's model card (the card itself: `hf_elmo.hub`)."""

from __future__ import annotations

from pathlib import Path

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
