"""Converters from the benchmark files in ../shared/data to spaCy Docs."""

from __future__ import annotations

from itertools import islice

import pytest
from elmo_fixtures import require
from spacy.tokens import DocBin
from spacy.vocab import Vocab
from spacy_fixtures import DATA
from typer.testing import CliRunner

from spacy_elmo.cli import app
from spacy_elmo.corpora import SST2_LABELS, SST5_LABELS, read_conll2003, read_sst2, read_sst5, write_docbin


def test_conll2003_iob1_and_iob2_files_give_the_same_docs():
    vocab = Vocab()
    iob1 = list(islice(read_conll2003(require(DATA / "conll2003" / "eng.train"), vocab, n_sents=3), 40))
    iob2 = list(islice(read_conll2003(require(DATA / "conll2003" / "iob2" / "train.txt"), vocab, n_sents=3), 40))
    assert [d.text for d in iob1] == [d.text for d in iob2]
    assert [[(e.start, e.end, e.label_) for e in d.ents] for d in iob1] == [
        [(e.start, e.end, e.label_) for e in d.ents] for d in iob2
    ]
    first = iob2[0]
    assert [t.text for t in first[:4]] == ["EU", "rejects", "German", "call"]
    assert [(e.text, e.label_) for e in first.ents][:3] == [("EU", "ORG"), ("German", "MISC"), ("British", "MISC")]
    assert len(list(first.sents)) == 3 and first[0].tag_ == "NNP"


def test_conll2003_docs_never_cross_docstart(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\nA NN O B-PER\n\nB NN O O\n\n-DOCSTART- -X- -X- O\n\nC NN O I-LOC\n")
    docs = list(read_conll2003(path, Vocab(), n_sents=10))
    assert [d.text for d in docs] == ["A B", "C"]
    assert [[(e.text, e.label_) for e in d.ents] for d in docs] == [[("A", "PER")], [("C", "LOC")]]
    path.write_text("A\n")
    with pytest.raises(ValueError, match="tiny.txt:1"):
        list(read_conll2003(path, Vocab()))


def test_sst5_gives_one_exclusive_label_per_sentence(tmp_path):
    docs = list(islice(read_sst5(require(DATA / "sst5" / "train.tsv"), Vocab()), 3))
    assert [max(d.cats, key=d.cats.get) for d in docs] == ["positive", "very_positive", "positive"]
    assert all(sorted(d.cats) == sorted(SST5_LABELS) and sum(d.cats.values()) == 1.0 for d in docs)
    assert docs[0][:3].text == "The Rock is"
    assert write_docbin(iter(docs), tmp_path / "out.spacy", limit=2) == 2
    assert len(DocBin().from_disk(tmp_path / "out.spacy")) == 2


def test_sst2_gives_one_exclusive_label_per_sentence(tmp_path):
    docs = list(read_sst2(require(DATA / "sst2" / "stsa.binary.train"), Vocab()))
    assert len(docs) == 6920
    assert [max(d.cats, key=d.cats.get) for d in docs[:2]] == ["positive", "negative"]
    assert all(sorted(d.cats) == sorted(SST2_LABELS) and sum(d.cats.values()) == 1.0 for d in docs)
    assert docs[0][:3].text == "a stirring ,"
    bad = tmp_path / "bad.txt"
    bad.write_text("1 fine\n7 not a label\n")
    with pytest.raises(ValueError, match="bad.txt:2"):
        list(read_sst2(bad, Vocab()))


@pytest.mark.slow
def test_sst5_trees_give_the_tsv_sentences_or_every_distinct_phrase(tmp_path):
    trees, tsv = require(DATA / "sst5" / "trees" / "train.txt"), require(DATA / "sst5" / "train.tsv")
    label = lambda doc: max(doc.cats, key=doc.cats.get)  # noqa: E731
    sentences = [(doc.text, label(doc)) for doc in read_sst5(trees, Vocab())]
    assert sentences == [(doc.text, label(doc)) for doc in read_sst5(tsv, Vocab())]
    phrases = list(read_sst5(trees, Vocab(), phrases=True))
    assert len(phrases) == 159274 and len({doc.text for doc in phrases}) == len(phrases)
    assert {doc.text for doc in phrases} >= {text for text, _ in sentences[:100]}
    assert sum(label(doc) == "neutral" for doc in phrases) == 81658
    assert all(sorted(doc.cats.values()) == [0, 0, 0, 0, 1] for doc in phrases)

    small = tmp_path / "trees.txt"
    small.write_text("(3 (2 The) (4 (3 good) (2 film)))\n\n(1 (2 The) (1 (1 bad) (2 film)))\n")
    assert [(d.text, label(d)) for d in read_sst5(small, Vocab(), phrases=True)] == [
        ("The", "neutral"), ("good", "positive"), ("film", "neutral"), ("good film", "very_positive"),
        ("The good film", "positive"), ("bad", "negative"), ("bad film", "negative"), ("The bad film", "negative")]
    assert [d.text for d in read_sst5(small, Vocab())] == ["The good film", "The bad film"]
    for bad, message in [("(3 (2 a) (7 b))", "label 7"), ("(3 (2 a) (2 b)", "complete"), ("(3 (2 a)))", "'\\)'"),
                         ("(3 (2 a) (2 b)) x", "after"), ("(3 (2 a) (2))", "without words"),
                         ("(3 (a) (2 b))", "label after")]:
        small.write_text(f"(2 (2 fine) (2 line))\n{bad}\n")
        with pytest.raises(ValueError, match=f"trees.txt:2: .*{message}"):
            list(read_sst5(small, Vocab(), phrases=True))
    with pytest.raises(ValueError, match="phrases need the trees file"):
        read_sst5(tsv, Vocab(), phrases=True)


def test_sst2_from_sst5_trees_is_the_stsa_binary_data_cased_or_its_non_neutral_phrases(tmp_path):
    trees, stsa = require(DATA / "sst5" / "trees" / "dev.txt"), require(DATA / "sst2" / "stsa.binary.dev")
    label = lambda doc: max(doc.cats, key=doc.cats.get)  # noqa: E731
    # The same 872 dev sentences and labels as stsa.binary.dev, which is lowercased.
    cased = {doc.text: label(doc) for doc in read_sst2(trees, Vocab())}
    assert {text.lower(): value for text, value in cased.items()} == {
        doc.text: label(doc) for doc in read_sst2(stsa, Vocab())}
    assert len(cased) == 872 and any(text != text.lower() for text in cased)

    small = tmp_path / "trees.txt"
    small.write_text("(3 (2 The) (4 (3 good) (2 film)))\n(2 (2 A) (2 film))\n(0 (2 The) (1 (1 bad) (2 film)))\n")
    assert [(d.text, label(d)) for d in read_sst2(small, Vocab())] == [
        ("The good film", "positive"), ("The bad film", "negative")]  # the neutral sentence left out
    assert [(d.text, label(d)) for d in read_sst2(small, Vocab(), phrases=True)] == [
        ("good", "positive"), ("good film", "positive"), ("The good film", "positive"), ("bad", "negative"),
        ("bad film", "negative"), ("The bad film", "negative")]
    assert all(sorted(d.cats) == sorted(SST2_LABELS) for d in read_sst2(small, Vocab(), phrases=True))
    with pytest.raises(ValueError, match="phrases need the trees file"):
        read_sst2(stsa, Vocab(), phrases=True)
    result = CliRunner().invoke(app, ["convert-sst2", str(small), str(tmp_path / "out.spacy"), "--phrases"])
    assert result.exit_code == 0 and "wrote 6 docs" in result.output


def test_convert_sst5_writes_phrases_and_reports_a_bad_file_in_one_line(tmp_path):
    trees = tmp_path / "trees.txt"
    trees.write_text("(3 (2 The) (4 (3 good) (2 film)))\n")
    result = CliRunner().invoke(app, ["convert-sst5", str(trees), str(tmp_path / "out.spacy"), "--phrases"])
    assert result.exit_code == 0 and "wrote 5 docs" in result.output
    assert len(DocBin().from_disk(tmp_path / "out.spacy")) == 5
    trees.write_text("(3 (2 The) (9 film))\n")
    result = CliRunner().invoke(app, ["convert-sst5", str(trees), str(tmp_path / "bad.spacy")])
    assert result.exit_code == 1 and result.output.strip() == f"Error: {trees}:1: label 9 is not one of 0-4"
    assert not (tmp_path / "bad.spacy").exists()
