"""Converters from the benchmark files to spaCy Docs (`.spacy` files for `spacy train`).

* CoNLL-2003 (`eng.train` IOB1 or `iob2/train.txt` IOB2; columns `token POS chunk NER`): one Doc per
  `n_sents` sentences, never across a `-DOCSTART-` line; gold tokens, sentence starts, POS tags and entities.
* SST-5 (`train.tsv`: `label<TAB>tokenized sentence`, labels 0-4) and SST-2 (`stsa.binary.train`: `label
  tokenized sentence`, labels 0-1): one Doc per sentence with exclusive `cats`. SST-5's trees file
  (`trees/train.txt`, `(3 (2 The) (2 Rock) ...)` per line) also gives one Doc per distinct labelled phrase.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from spacy.tokens import Doc, DocBin
from spacy.training.iob_utils import biluo_tags_to_spans, iob_to_biluo
from spacy.vocab import Vocab

SST5_LABELS = ("very_negative", "negative", "neutral", "positive", "very_positive")
SST2_LABELS = ("negative", "positive")
# SST-5 label -> SST-2 label; neutral (2) has none.
SST5_TO_SST2 = {0: 0, 1: 0, 3: 1, 4: 1}


def read_conll2003(path: str | Path, vocab: Vocab, n_sents: int = 10) -> Iterator[Doc]:
    """Docs of up to `n_sents` sentences from a CoNLL-2003 NER file (IOB1 or IOB2 tags)."""
    if n_sents < 1:  # not `integer_problem`: spaCy's CLI imports this module at every command, never hf_elmo
        raise ValueError(f"n_sents must be >= 1, got {n_sents}")
    group: list[list[list[str]]] = []
    for sentence in conll_sentences(path):
        if sentence is None or len(group) == n_sents:
            if group:
                yield _conll_doc(vocab, group)
            group = []
        if sentence is not None:
            group.append(sentence)
    if group:
        yield _conll_doc(vocab, group)


def conll_sentences(path: str | Path) -> Iterator[list[list[str]] | None]:
    """Sentences as lists of rows (columns); None at every `-DOCSTART-` (a document boundary)."""
    sentence: list[list[str]] = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            columns = line.split()
            if columns and columns[0] == "-DOCSTART-":
                if sentence:
                    yield sentence
                sentence = []
                yield None
            elif not columns:
                if sentence:
                    yield sentence
                sentence = []
            elif len(columns) < 2:
                raise ValueError(f"{path}:{number}: expected 'token ... NER' columns, got {line!r}")
            else:
                sentence.append(columns)
    if sentence:
        yield sentence


def _conll_doc(vocab: Vocab, sentences: list[list[list[str]]]) -> Doc:
    rows = [row for sentence in sentences for row in sentence]
    sent_starts = [i == 0 for sentence in sentences for i in range(len(sentence))]
    tags = [row[1] if len(row) > 2 else "" for row in rows]
    words = [row[0] for row in rows]
    doc = Doc(vocab, words=words, spaces=_spaces(words), sent_starts=sent_starts, tags=tags if all(tags) else None)
    # Per sentence: IOB1 "I-X" after "O" starts an entity; iob_to_biluo reads IOB1 and IOB2 alike.
    biluo = [tag for sentence in sentences for tag in iob_to_biluo([row[-1] for row in sentence])]
    doc.ents = biluo_tags_to_spans(doc, biluo)
    return doc


def read_sst5(path: str | Path, vocab: Vocab, phrases: bool = False) -> Iterator[Doc]:
    """One Doc per sentence of an SST-5 file, gold tokens, one-hot `cats`; with `phrases`, one per distinct phrase.

    The file is a TSV (`label<TAB>sentence`) or a trees file (`(label child child)` per line, told apart by its
    first character). A phrase is the words under any node of a tree (the sentence, its constituents, each word)
    with that node's label: what the paper's SST-5 models train on. A phrase met again is skipped, so every word
    sequence is one Doc. Words are split as in the TSV files, so a tree's root gives the Doc of its TSV line.
    """
    if not _is_trees(path, phrases):
        return _labelled_sentences(path, vocab, SST5_LABELS, "\t")
    return _tree_docs(path, vocab, phrases, SST5_LABELS, {i: i for i in range(len(SST5_LABELS))})


def _is_trees(path: str | Path, phrases: bool) -> bool:
    """Whether `path` is a trees file (its first character is '('); phrases are only in trees."""
    with open(path, encoding="utf-8") as file:
        trees = file.read(1).startswith("(")
    if phrases and not trees:
        raise ValueError(f"{path}: phrases need the trees file (sst5/trees/train.txt), not a label-sentence file")
    return trees


def _tree_docs(path: str | Path, vocab: Vocab, phrases: bool, labels: tuple[str, ...],
               relabel: dict[int, int]) -> Iterator[Doc]:
    """Docs of the roots (or, with `phrases`, of every distinct phrase) of a trees file whose SST-5 label is a key of
    `relabel`, each labelled `labels[relabel[label]]`."""
    seen: set[tuple[str, ...]] = set()
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                nodes = _tree_nodes(line)
            except ValueError as error:
                raise ValueError(f"{path}:{number}: {error}") from None
            for label, words in nodes if phrases else nodes[-1:]:
                if label in relabel and (not phrases or words not in seen):  # sentences kept as they come, repeats too
                    seen.add(words)
                    yield _labelled_doc(vocab, list(words), labels, relabel[label])


def _tree_nodes(line: str) -> list[tuple[int, tuple[str, ...]]]:
    """(label, words) of every node of one `(label child child)` tree, children before parents (root last)."""
    nodes: list[tuple[int, tuple[str, ...]]] = []
    stack: list[tuple[int, list[str]]] = []
    for match in re.finditer(r"\((\d*) ?|\)|[^()]+", line.strip()):
        piece = match.group()
        if piece.startswith("("):
            if not match.group(1):
                raise ValueError(f"expected a label after '(', got {line.strip()[match.start():][:20]!r}")
            label = int(match.group(1))
            if not 0 <= label < len(SST5_LABELS):
                raise ValueError(f"label {label} is not one of 0-{len(SST5_LABELS) - 1}")
            stack.append((label, []))
        elif piece == ")":
            if not stack:
                raise ValueError("unbalanced ')'")
            label, words = stack.pop()
            if not words:
                raise ValueError("a node without words")
            nodes.append((label, tuple(words)))
            if stack:
                stack[-1][1].extend(words)
            elif match.end() != len(line.strip()):
                raise ValueError("text after the tree's closing ')'")
        elif stack:
            stack[-1][1].extend(piece.split())
        elif piece.strip():
            raise ValueError(f"expected '(label ...)', got {piece.strip()[:20]!r}")
    if stack or not nodes:
        raise ValueError("expected one complete '(label ...)' tree")
    return nodes


def read_sst2(path: str | Path, vocab: Vocab, phrases: bool = False) -> Iterator[Doc]:
    """One Doc per line of an SST-2 file (`label sentence`, e.g. `stsa.binary.train`, lowercased), gold tokens,
    one-hot `cats`; or SST-2 from SST-5's trees (cased), as GLUE builds it: very negative and negative become
    negative, positive and very positive positive, neutral sentences (with `phrases`, neutral phrases) are left out.
    `phrases` needs the trees: one Doc per distinct non-neutral phrase, the usual SST-2 training set."""
    if not _is_trees(path, phrases):
        return _labelled_sentences(path, vocab, SST2_LABELS, " ")
    return _tree_docs(path, vocab, phrases, SST2_LABELS, SST5_TO_SST2)


def _labelled_sentences(path: str | Path, vocab: Vocab, labels: tuple[str, ...], separator: str) -> Iterator[Doc]:
    """One Doc per line `label<separator>tokenized sentence` (label = the index into `labels`)."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            label, _, text = line.rstrip("\n").partition(separator)
            if label not in {str(i) for i in range(len(labels))} or not text.strip():
                raise ValueError(f"{path}:{number}: expected 'label{separator!r}sentence' with a label 0-"
                                 f"{len(labels) - 1}, got {line!r}")
            yield _labelled_doc(vocab, text.split(), labels, int(label))


def _labelled_doc(vocab: Vocab, words: list[str], labels: tuple[str, ...], label: int) -> Doc:
    """A Doc of `words` joined by single spaces whose `cats` are one-hot at `labels[label]`."""
    doc = Doc(vocab, words=words, spaces=_spaces(words))
    doc.cats = {name: float(i == label) for i, name in enumerate(labels)}
    return doc


def _spaces(words: list[str]) -> list[bool]:
    """A space after every word but the last (the text is the words joined by single spaces)."""
    return [True] * (len(words) - 1) + [False] if words else []


def write_docbin(docs: Iterable[Doc], output: str | Path, limit: int | None = None) -> int:
    """Write (the first `limit` of) `docs` to a `.spacy` file; returns the number written."""
    docbin = DocBin(store_user_data=False)
    for doc in islice(docs, limit):
        docbin.add(doc)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    docbin.to_disk(output)
    return len(docbin)
