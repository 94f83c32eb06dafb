"""`elmo demo`: the embedded English model (`hf_elmo.DEFAULT_MODEL`) at work, offline, in a few seconds on a CPU.

It embeds sentences in which "bank" and "play" take different senses, prints the cosine similarities of their
vectors in the context-independent token layer (equal everywhere) and in the top biLSTM layer (which depends on
the sentence), then runs the spaCy `elmo` component when spaCy is installed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import AutoModel, AutoTokenizer

from . import DEFAULT_MODEL
from .modeling_elmo import ElmoModel


@dataclass(frozen=True)
class Usage:
    """One occurrence of `word` in `sentence` (words separated by spaces) with the sense it takes there."""

    word: str
    sense: str
    sentence: str


USAGES = [
    Usage("bank", "money", "She paid the cheque into her account at the bank on Monday ."),
    Usage("bank", "money", "The bank raised its interest rates again ."),
    Usage("bank", "money", "He borrowed money from the bank to buy a house ."),
    Usage("bank", "money", "The central bank cut interest rates ."),
    Usage("bank", "river", "We had a picnic on the grassy bank of the river ."),
    Usage("bank", "river", "The boat drifted slowly toward the muddy bank ."),
    Usage("bank", "river", "The river overflowed its bank after the storm ."),
    Usage("bank", "river", "Fishermen stood on the bank of the stream ."),
    Usage("play", "theatre", "We saw a play by Shakespeare at the theatre ."),
    Usage("play", "theatre", "The actors rehearsed the new play all week ."),
    Usage("play", "theatre", "The play opened on Broadway last night ."),
    Usage("play", "games", "The children play football in the park after school ."),
    Usage("play", "games", "They play tennis every Sunday morning ."),
    Usage("play", "games", "The kids like to play outside ."),
]
SPACY_TEXT = "I sat on the bank of the river. Then I went to the bank to withdraw some money."


@dataclass
class SenseReport:
    """Similarities between the vectors of the occurrences of one word."""

    word: str
    senses: list[str]
    token_layer: torch.Tensor  # (occurrences, occurrences) cosine similarities, layer 0
    top_layer: torch.Tensor  # (occurrences, occurrences) cosine similarities, last biLSTM layer

    def mean_similarity(self, same_sense: bool) -> float:
        pairs = [
            self.top_layer[i, j].item()
            for i in range(len(self.senses))
            for j in range(i + 1, len(self.senses))
            if (self.senses[i] == self.senses[j]) == same_sense
        ]
        return sum(pairs) / len(pairs)


def word_vectors(model: ElmoModel, tokenizer, usages: list[Usage]) -> torch.Tensor:
    """The layers of each usage's word in its sentence: (usages, layers, width), all sentences in one batch."""
    sentences = [usage.sentence.split() for usage in usages]
    batch = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        layers = torch.stack(model(**batch).hidden_states, dim=1)  # (sentences, layers, words + 2, width)
    positions = [words.index(usage.word) + 1 for words, usage in zip(sentences, usages)]  # +1: <S>
    return torch.stack([layers[row, :, position] for row, position in enumerate(positions)])


def sense_reports(model: ElmoModel, tokenizer, usages: list[Usage] = USAGES) -> list[SenseReport]:
    """For each word of `usages`, the cosine similarities of its occurrences in the token and top layers."""
    vectors = word_vectors(model, tokenizer, usages)
    reports = []
    for word in dict.fromkeys(usage.word for usage in usages):
        rows = [index for index, usage in enumerate(usages) if usage.word == word]
        normalized = torch.nn.functional.normalize(vectors[rows], dim=-1)  # (occurrences, layers, width)
        token_layer, top_layer = normalized[:, 0], normalized[:, -1]
        reports.append(
            SenseReport(word, [usages[i].sense for i in rows], token_layer @ token_layer.T, top_layer @ top_layer.T)
        )
    return reports


def _print_report(report: SenseReport, usages: list[Usage], echo: Callable[[str], None]) -> None:
    occurrences = [usage for usage in usages if usage.word == report.word]
    echo(f'\n"{report.word}": cosine similarity of its top-layer vectors (token layer: all '
         f"{report.token_layer.min().item():.2f}, the same vector everywhere)")
    width = max(len(usage.sense) for usage in occurrences) + 2
    columns = " ".join(f"{j + 1:>5}" for j in range(len(occurrences)))
    echo(f"  {'':3}{'sense':>{width}} {columns}   sentence (columns: cosine with the use in that row)")
    for index, usage in enumerate(occurrences):
        cells = " ".join(f"{report.top_layer[index, j].item():5.2f}" for j in range(len(occurrences)))
        echo(f"  {index + 1}. {'[' + usage.sense + ']':>{width}} {cells}   {usage.sentence}")
    same, different = report.mean_similarity(True), report.mean_similarity(False)
    verdict = "closer" if same > different else "NOT closer"
    echo(f"  mean over pairs: same sense {same:.3f}, different senses {different:.3f}: same-sense uses are {verdict}")


def run_spacy(echo: Callable[[str], None]) -> None:
    """The spaCy `elmo` component with its default biLM (this model)."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.add_pipe("elmo")
    doc = nlp(SPACY_TEXT)
    banks = [token for token in doc if token.text == "bank"]
    echo(f'\nspaCy: nlp = spacy.blank("en"); nlp.add_pipe("sentencizer"); nlp.add_pipe("elmo")\n  {SPACY_TEXT}')
    echo(f"  doc._.elmo_layers: {doc._.elmo_layers.shape} (layers, tokens, width); "
         f"{len(list(doc.sents))} sentences, each read by the biLM from the zero state")
    echo(f'  doc[{banks[0].i}].similarity(doc[{banks[1].i}]) ("bank" / "bank"): {banks[0].similarity(banks[1]):.3f}; '
         f'Token.vector is the average of the layers, width {banks[0].vector.shape[0]}')


def main(echo: Callable[[str], None] = print) -> None:
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    model = AutoModel.from_pretrained(DEFAULT_MODEL).eval()
    config = model.config
    echo(f"ELMo default English model: {DEFAULT_MODEL}")
    echo(f"  {sum(p.numel() for p in model.parameters()):,} parameters; {config.num_output_layers} layers of width "
         f"{config.output_dim}; words split like {config.word_tokenizer}")
    batch = tokenizer(["The bank raised rates.", "We sat on the river bank."], padding=True, return_tensors="pt")
    with torch.no_grad():
        layers = model(**batch).hidden_states
    echo(f"  2 raw sentences -> input_ids {tuple(batch['input_ids'].shape)} -> {len(layers)} x "
         f"{tuple(layers[0].shape)} (sentences, words with <S> and </S>, width)")
    for report in sense_reports(model, tokenizer):
        _print_report(report, USAGES, echo)
    run_spacy(echo)
    echo(f"\ndone in {time.perf_counter() - started:.1f} s")
