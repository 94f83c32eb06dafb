"""Held-out perplexity of a biLM with the full softmax (`elmo evaluate`).

Each line is one sequence from the zero state (as at inference and in training). The forward LM predicts the
words and `</S>` of every line, the backward LM the words and `<S>`: both count words + one per line, the
convention of the PTB literature (Mikolov; Kim et al. 2016 count one `<eos>` per sentence), so the forward
perplexity is directly comparable with a left-to-right LM. The average perplexity is bilm-tf's:
exp(mean of the forward and backward cross-entropies), the geometric mean of the two perplexities.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from ..loading import load_config, load_model
from ..modeling_elmo import ElmoForBidirectionalLM
from ..text import expand_files, get_word_tokenizer
from ..tokenization_elmo import ElmoCharTokenizer
from .data import LMBatches
from .losses import BidirectionalLMLoss
from .vocabulary import WordVocabulary


def perplexities(forward_loss_sum: float, backward_loss_sum: float, n_targets: int) -> dict[str, float]:
    """Forward, backward and average (geometric mean) perplexity from summed cross-entropies."""
    n = max(int(n_targets), 1)
    return {
        "forward_perplexity": math.exp(forward_loss_sum / n),
        "backward_perplexity": math.exp(backward_loss_sum / n),
        "average_perplexity": math.exp(0.5 * (forward_loss_sum + backward_loss_sum) / n),
        "tokens": int(n_targets),
    }


@torch.no_grad()
def evaluate(
    objective: BidirectionalLMLoss,
    batches: Iterable[dict],
    device: torch.device | str = "cpu",
    accelerator: Accelerator | None = None,
    progress: bool = False,
) -> dict[str, float]:
    """Full-softmax perplexities of `objective.lm` over `batches` (this process's part when `accelerator` is
    given: the sums of all processes are combined); `progress` shows a bar of batches on stderr."""
    was_training = objective.training
    objective.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for batch in tqdm(batches, desc="evaluating", unit=" batches", disable=not progress, leave=False):
        inputs = {key: batch[key].to(device, non_blocking=True)
                  for key in ("input_ids", "attention_mask", "labels", "forward_index", "backward_index")}
        output = objective(**inputs, lengths=batch["lengths"])
        sums += torch.stack([output.forward_loss_sum.double(), output.backward_loss_sum.double(),
                             output.n_targets.double()])
    if accelerator is not None:
        sums = accelerator.reduce(sums, reduction="sum")
    objective.train(was_training)
    forward_sum, backward_sum, n_targets = sums.tolist()
    if not n_targets:
        raise ValueError("the held-out text holds no words: no perplexity to measure")
    return perplexities(forward_sum, backward_sum, int(n_targets))


def evaluate_model(
    model: str,
    files: Sequence[str],
    word_tokenizer: str | None = None,
    batch_tokens: int = 1024,
    max_words: int | None = None,
    device: str = "cpu",
    progress: bool = False,
) -> dict[str, float]:
    """Perplexities of the `ElmoForBidirectionalLM` in `model` (directory or Hub id, with its `vocab.txt`) on
    `files`, words split by `word_tokenizer` (default: the one recorded in its config); `progress` as in
    `evaluate`."""
    config = load_config(model)
    if not config.vocab_size:
        raise ValueError(f"{model} has no word softmax (config.vocab_size): it cannot compute perplexities")
    word_tokenizer = word_tokenizer or getattr(config, "word_tokenizer", None)
    if word_tokenizer is None:
        raise ValueError(f"{model} does not record its word tokenizer; choose one (whitespace, elmo, spacy:en)")
    vocabulary = WordVocabulary.from_pretrained(model)
    if len(vocabulary) != config.vocab_size:
        raise ValueError(f"{model}: vocab.txt has {len(vocabulary)} words, the softmax {config.vocab_size}")
    lm = load_model(model, ElmoForBidirectionalLM, config=config).to(device)
    batches = LMBatches(
        expand_files(files),
        get_word_tokenizer(word_tokenizer),
        vocabulary,
        ElmoCharTokenizer.for_model(config),
        batch_tokens=batch_tokens,
        max_words=max_words,
        shuffle=False,
    )
    return evaluate(BidirectionalLMLoss(lm), batches, device=device, progress=progress)
