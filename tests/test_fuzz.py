"""Property-based tests: generated strings through every path text takes to the biLM (the tokenizer's word
tokenizers and the model, pre-split words, the spaCy component, and `elmo embed`'s file-to-file path) never crash,
never give a wrong vector, and never lose a sentence.

- crash: any exception;
- wrong vector: a vector other than the biLM's on that sentence alone (batch and padding must not leak into it), or
  a NaN;
- data lost: a line or token without its vectors, or vectors in the wrong place.

Strings come from all of Unicode (lone surrogates, controls, NUL, format characters and unassigned code points
included) and from a small alphabet of troublemakers, so that whitespace runs, BOMs, zero-width characters,
quotes and emoji meet often; `elmo embed` also reads invalid UTF-8, `\\r\\n` and BOMs. Examples are derandomized: CI
sees the same strings every run. `ELMO_FUZZ_EXAMPLES` sets the examples per path, of 10 strings each (`make test`:
250, so 2,500 strings per path; `make fuzz`: 4000, so 40,000; a quarter of that through `elmo embed`, which writes and
reads a file per example).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import spacy
import torch
from elmo_fixtures import tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_elmo import ElmoCharTokenizer, ElmoModel
from hf_elmo.embed import ElmoEmbedder, embed_file
from hf_elmo.text import FOREIGN_BYTE_ORDER_MARKS, NotTextError, read_lines, split_into_words

# Slow (subprocesses and long runs: left out of the fast subset); one torch thread (the tiny models' per-step overhead
# dominates, and a second thread waits on a busy core).
pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]

TROUBLE = (" \t\n\r\x00\x0b\x1b\u00a0\u2028\ufeff\u200b\u200d\udc80\udcff\ud800'\".,-–—“”!?()[]<>/\\:;"
           "😀👩\u200d👩\u200d👧中文e\u0301")
TEXT = st.one_of(st.text(st.characters(exclude_categories=[]), max_size=40), st.text(TROUBLE, max_size=40))
EXAMPLES, PER_EXAMPLE = int(os.environ.get("ELMO_FUZZ_EXAMPLES", "250")), 10
EMBED_EXAMPLES = max(1, EXAMPLES // 4)  # a file written and read back per example: the slowest path
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Vectors of one sentence computed in different batches differ by float32 rounding only.
ATOL = 1e-5


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return ElmoModel(tiny_config()).eval()


def layers_of(model: ElmoModel, batch) -> torch.Tensor:
    """(layers, batch, positions, width), finite."""
    with torch.no_grad():
        layers = torch.stack(model(**batch).hidden_states)
    assert torch.isfinite(layers).all()
    return layers


def alone(model: ElmoModel, tokenizer: ElmoCharTokenizer, words: list[str]) -> np.ndarray:
    """(layers, words, width): the biLM on one sentence alone, `<S>`/`</S>` removed."""
    batch = tokenizer([words], is_split_into_words=True, return_tensors="pt")
    return layers_of(model, batch)[:, 0, 1:-1].numpy()


@pytest.mark.parametrize("word_tokenizer", ["spacy:en", "elmo", "whitespace"])
def test_raw_text_never_breaks_a_word_tokenizer_or_the_model(model, word_tokenizer):
    tokenizer = ElmoCharTokenizer(word_tokenizer=word_tokenizer)
    seen = []

    @SETTINGS
    @given(st.lists(TEXT, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE), st.integers(0, PER_EXAMPLE - 1))
    def run(texts, checked):
        seen.extend(texts)
        batch = tokenizer(texts, padding=True, return_tensors="pt", return_offsets_mapping=True)
        words = [split_into_words(text, word_tokenizer) for text in texts]
        assert int(batch["input_ids"].max()) < 262 and int(batch["input_ids"].min()) >= 0
        assert batch["attention_mask"].sum(dim=1).tolist() == [len(w) + 2 for w in words]
        for row, text in enumerate(texts):  # every word is a span of the text
            assert [w for w in batch.word_ids(row) if w is not None] == list(range(len(words[row])))
            for start, end in batch["offset_mapping"][row][1 : len(words[row]) + 1].tolist():
                assert 0 <= start <= end <= len(text)
        batch.pop("offset_mapping")
        layers = layers_of(model, batch)
        n = len(words[checked])  # one sentence (drawn) against its vectors alone
        np.testing.assert_allclose(layers[:, checked, 1 : n + 1].numpy(), alone(model, tokenizer, words[checked]),
                                   atol=ATOL)

    run()
    assert len(seen) >= EXAMPLES * PER_EXAMPLE


def test_pre_split_words_never_break_the_tokenizer_or_the_model(model):
    tokenizer = ElmoCharTokenizer()
    seen = []

    @SETTINGS
    @given(st.lists(st.lists(TEXT, max_size=6), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def run(sentences):
        seen.extend(word for words in sentences for word in words)
        batch = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
        assert batch["attention_mask"].sum(dim=1).tolist() == [len(words) + 2 for words in sentences]
        layers = layers_of(model, batch)
        # The batch again in reverse order: every sentence's vectors are its own, wherever it sits.
        reversed_batch = tokenizer(sentences[::-1], is_split_into_words=True, padding=True, return_tensors="pt")
        reversed_layers = layers_of(model, reversed_batch)
        for row, words in enumerate(sentences):
            other = len(sentences) - 1 - row
            np.testing.assert_allclose(layers[:, row, : len(words) + 2].numpy(),
                                       reversed_layers[:, other, : len(words) + 2].numpy(), atol=ATOL)

    run()
    assert len(seen) >= EXAMPLES * PER_EXAMPLE  # sentences of 0 to 6 words: about 3 words each


# spaCy cannot hold lone surrogates at all (its StringStore encodes every string as UTF-8: `spacy.blank("en")
# ("\ud800")` raises before any component runs), so the component's texts are all of Unicode but surrogates.
SPACY_TEXT = st.one_of(st.text(max_size=40), st.text(TROUBLE.replace("\udc80", "").replace("\udcff", "").replace(
    "\ud800", ""), max_size=40))


def test_the_spacy_component_takes_any_text_and_gives_each_sentence_its_own_vectors(elmo_dir):
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.add_pipe("elmo", config={"model": {"name": str(elmo_dir)}})
    model, tokenizer = ElmoModel.from_pretrained(elmo_dir).eval(), ElmoCharTokenizer.from_pretrained(elmo_dir)
    seen = []

    @SETTINGS
    @given(st.lists(SPACY_TEXT, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
    def run(texts):
        seen.extend(texts)
        docs = list(nlp.pipe(texts))
        sentences = [[token for token in sentence if not token.is_space] for doc in docs for sentence in doc.sents]
        sentences = [tokens for tokens in sentences if tokens]
        if sentences:  # the biLM on every sentence at once, the reference of the component's batches
            batch = tokenizer([[t.text for t in tokens] for tokens in sentences], is_split_into_words=True,
                              padding=True, return_tensors="pt")
            expected = layers_of(model, batch).numpy()
        for doc in docs:
            layers = doc._.elmo_layers
            assert layers.shape == (3, len(doc), 32) and np.isfinite(layers).all()
            assert not layers[:, [token.i for token in doc if token.is_space]].any()  # whitespace: zero rows
        for row, tokens in enumerate(sentences):
            layers = tokens[0].doc._.elmo_layers
            np.testing.assert_allclose(layers[:, [t.i for t in tokens]], expected[:, row, 1 : len(tokens) + 1],
                                       atol=ATOL)

    run()
    assert len(seen) >= EXAMPLES * PER_EXAMPLE


# Bytes of a line: anything, UTF-8 (surrogates too), and runs of valid and broken UTF-8 pieces.
BYTE_TROUBLE = [b" ", b"\t", b"\r", b"\x00", b"\xef\xbb\xbf", b"\xff", b"\xc3", b"\xc3\xa9", b"\xe2\x82",
                b"\xed\xa0\x80", b"\xf0\x9f\x98\x80", b"\xf0\x9f", b"bank", b".", b"'s", "中文".encode()]
LINE = st.one_of(st.binary(max_size=60), TEXT.map(lambda text: text.encode("utf-8", "surrogatepass")),
                 st.lists(st.sampled_from(BYTE_TROUBLE), max_size=20).map(b"".join))


@pytest.mark.parametrize("output", ["out.npy", "out.hdf5"])
def test_elmo_embed_writes_every_line_with_its_own_vectors(model, tmp_path, output):
    """Raw bytes as a file through `embed_file` (what `elmo embed` runs): one sentence per line, in order, each with
    the biLM's vectors of its words alone; or, for bytes that are not UTF-8 text at all (a NUL byte, a UTF-16 or
    UTF-32 byte-order mark at the start), `NotTextError` and nothing written."""
    import h5py

    tokenizer = ElmoCharTokenizer()
    embedder = ElmoEmbedder(model, tokenizer, layers="all", batch_tokens=64, buffer_tokens=128, max_sentence_words=8)
    seen = []

    @settings(SETTINGS, max_examples=EMBED_EXAMPLES)
    @given(st.lists(LINE, min_size=PER_EXAMPLE, max_size=PER_EXAMPLE), st.sampled_from([b"\n", b"\r\n"]),
           st.booleans())
    def run(lines, newline, bom):
        data = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line.replace(b"\n", b" ") + newline for line in lines)
        source, target = tmp_path / "in.txt", tmp_path / output
        source.write_bytes(data)
        seen.extend(lines)
        target.unlink(missing_ok=True)
        if b"\x00" in data or data.startswith(tuple(FOREIGN_BYTE_ORDER_MARKS)):
            with pytest.raises(NotTextError):
                embed_file(embedder, source, target, progress=False)
            assert not target.exists()
            return
        assert embed_file(embedder, source, target, progress=False) == len(lines)
        texts = list(read_lines(source))
        assert len(texts) == len(lines)
        if output.endswith(".npy"):
            vectors, offsets = np.load(target), np.load(target.with_suffix(".offsets.npy"))
            written = [np.moveaxis(vectors[a:b], 0, -2) for a, b in zip(offsets[:-1], offsets[1:])]
        else:
            with h5py.File(target) as file:
                written = [file[str(i)][...] for i in range(len(lines))]
                assert len(file) == len(lines) + 1  # and sentence_to_index
        assert len(written) == len(lines)
        for text, vectors in zip(texts, written):
            words = split_into_words(text, None)
            assert vectors.shape == (3, len(words), 16) and np.isfinite(vectors).all()
            expected = np.concatenate([alone(model, tokenizer, words[s : s + 8]) for s in range(0, len(words), 8)]
                                      or [np.zeros((3, 0, 16), np.float32)], axis=1)
            np.testing.assert_allclose(vectors, expected, atol=ATOL)

    run()
    assert len(seen) >= EMBED_EXAMPLES * PER_EXAMPLE
