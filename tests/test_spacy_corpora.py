"""Converters from the benchmark files in ../shared/data to spaCy Docs."""

from __future__ import annotations

from itertools import islice

import pytest
from elmo_fixtures import require
from spacy.tokens import DocBin
from spacy.vocab import Vocab
from spacy_fixtures import DATA

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
