"""`hf_elmo.text`, the one home of how text reaches the biLM: lines, words, windows, length batches and the batch
the model takes (`ElmoBatch`)."""

import io

import pytest
import torch
from elmo_fixtures import tiny_config

from hf_elmo import ElmoCharTokenizer, ElmoModel, split_words
from hf_elmo.text import (
    ElmoBatch,
    NotTextError,
    get_word_tokenizer,
    length_batches,
    read_lines,
    remove_sentence_boundaries,
    windows,
)

# -- lines and words ---------------------------------------------------------------------------------------------


def test_lines_split_on_newlines_only_drop_a_bom_and_cr_and_never_fail_on_bytes():
    data = b"\xef\xbb\xbfone\r\ntwo" + "\u2028".encode() + b"still two\xff\n\nlast"
    assert list(read_lines(io.BytesIO(data))) == ["one", "two\u2028still two\udcff", "", "last"]
    sizes = []
    list(read_lines(io.BytesIO(b"ab\ncd"), sizes.append))
    assert sizes == [3, 2]


@pytest.mark.parametrize("encoding,bom", [("utf-16", "UTF-16"), ("utf-16-be", None), ("utf-32", "UTF-32"),
                                          ("utf-32-le", None)])
def test_text_in_another_encoding_fails_in_one_line_naming_the_file_unless_its_encoding_is_given(
    tmp_path, encoding, bom
):
    """UTF-16 / UTF-32 read as UTF-8 would be words of garbage: their byte-order mark, or without one the NUL bytes
    UTF-8 text never holds, say what it is. Named, the encoding reads it (the byte-order mark dropped), and the
    progress counts every byte."""
    text = "The bank\nof the river 😀\r\n\nlast"
    path = tmp_path / "in.txt"
    path.write_bytes(text.encode(encoding))
    with pytest.raises(NotTextError) as error:
        list(read_lines(path))
    message = str(error.value)
    assert message.startswith(f"{path} starts with a {bom} byte-order mark" if bom else f"{path}: line 1 holds a NUL")
    assert "--encoding" in message and "\n" not in message
    sizes = []
    assert list(read_lines(path, sizes.append, encoding=encoding)) == ["The bank", "of the river 😀", "", "last"]
    assert sum(sizes) == path.stat().st_size


def test_a_nul_byte_fails_on_its_line_and_a_byte_another_encoding_cannot_decode_fails_too():
    with pytest.raises(NotTextError, match="the input: line 3 holds a NUL byte"):
        list(read_lines(io.BytesIO(b"one\ntwo\nthr\x00ee\n")))
    assert list(read_lines(io.BytesIO("café\n".encode("latin-1")), encoding="latin-1")) == ["café"]
    with pytest.raises(NotTextError, match="the input is not utf-16 text"):
        list(read_lines(io.BytesIO(b"\xff\xfeab\x00"), encoding="utf-16"))
    with pytest.raises(NotTextError, match="NUL"):  # a NUL character decoded from another encoding is no text either
        list(read_lines(io.BytesIO("a\x00b".encode("utf-16")), encoding="utf-16"))


@pytest.mark.parametrize("text,words", [
    ("Don't stop!", ["Don", "'t", "stop", "!"]),
    ("It's the U.S. economy, isn't it?", ["It", "'s", "the", "U.S.", "economy", ",", "isn", "'t", "it", "?"]),
    ("Costs $1,000.50 (2020-01-01).", ["Costs", "$", "1,000.50", "(", "2020-01-01", ")", "."]),
    ("a well-known 'quote'", ["a", "well-known", "'", "quote", "'"]),
    ("  spaced\tout\n", ["spaced", "out"]),
    ("中文字", ["中", "文", "字"]),
    ("ok 👍🏽!", ["ok", "👍🏽", "!"]),
    ("café naïve", ["café", "naïve"]),
    ("", []),
    (" \t\n ", []),
])
def test_raw_text_splitting(text, words):
    assert split_words(text) == words


def test_word_tokenizers_by_name():
    assert get_word_tokenizer("whitespace")(["a  b\tc"]) == [["a", "b", "c"]]
    assert get_word_tokenizer("elmo")(["Don't stop."]) == [["Don", "'t", "stop", "."]]
    pytest.importorskip("spacy")
    assert get_word_tokenizer("spacy:en")(["Don't  stop, U.S. friends."]) == [
        ["Do", "n't", "stop", ",", "U.S.", "friends", "."]
    ]
    with pytest.raises(ValueError, match="unknown word tokenizer"):
        get_word_tokenizer("moses")



# -- windows and length batches ----------------------------------------------------------------------------------


def test_windows_cut_a_sentence_into_consecutive_slices():
    assert windows(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert windows(4, 2) == [slice(0, 2), slice(2, 4)]
    assert windows(3, None) == [slice(0, 3)]
    assert windows(0, 2) == [slice(0, 0)]  # an empty sentence is one empty window


def test_length_batches_cover_every_sentence_once_within_the_budget():
    lengths = [5, 0, 17, 3, 3, 9, 40, 1, 2, 8]
    batches = length_batches(lengths, batch_tokens=24)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        width = max(lengths[i] for i in batch) + 2
        assert len(batch) == 1 or len(batch) * width <= 24
    # Longest first, so the padding inside a batch is small.
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(lengths, reverse=True)
    assert [6] in batches  # the 40-word sentence exceeds the budget: a batch of its own


def test_length_batches_go_longest_first_within_the_budget():
    lengths = [3, 10, 1, 7, 0, 7]
    batches = length_batches(lengths, batch_tokens=20)
    assert sorted(i for batch in batches for i in batch) == list(range(6))
    order = [i for batch in batches for i in batch]
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    assert all(len(batch) * (lengths[batch[0]] + 2) <= 20 or len(batch) == 1 for batch in batches)
    assert length_batches(lengths, 1000, batch_size=2) == [[1, 3], [5, 0], [2, 4]]


# -- the batch ---------------------------------------------------------------------------------------------------


def test_a_batch_holds_the_ids_the_mask_and_host_lengths_and_runs_the_model_as_it_is():
    tokenizer = ElmoCharTokenizer()
    sentences = [["The", "bank", "."], ["Hi"], []]
    batch = tokenizer.batch(sentences, rows=["a", "b", "c"])
    encoded = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    assert torch.equal(batch.input_ids, encoded["input_ids"])
    assert torch.equal(batch.attention_mask, encoded["attention_mask"].bool())
    assert batch.lengths == (5, 3, 2) and batch.word_counts == (3, 1, 0) and batch.rows == ("a", "b", "c")
    assert dict(batch).keys() == {"input_ids", "attention_mask", "lengths"}
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    with torch.no_grad():
        from_batch, from_encoding = model(**batch), model(**encoded)
    for a, b in zip(from_batch.hidden_states, from_encoding.hidden_states):
        assert torch.equal(a, b)
    stripped = batch.strip(from_batch.last_hidden_state)
    assert stripped.shape == (3, 3, 16) and torch.equal(stripped[0], from_batch.last_hidden_state[0, 1:4])
    assert stripped[1, 1:].abs().sum() == 0 and stripped[2].abs().sum() == 0
    assert torch.equal(batch.words_mask, torch.tensor([[True] * 3, [True, False, False], [False] * 3]))
    assert torch.equal(stripped, remove_sentence_boundaries(from_batch.last_hidden_state, batch.attention_mask)[0])
    moved = batch.to("meta")
    assert moved.input_ids.is_meta and moved.lengths == batch.lengths and moved.rows == batch.rows


def test_a_batch_from_char_ids_derives_its_mask_from_the_lengths():
    ids = torch.ones(2, 4, 50, dtype=torch.long)
    batch = ElmoBatch.from_char_ids(ids, [4, 2])
    assert batch.attention_mask.tolist() == [[True] * 4, [True, True, False, False]]
    with pytest.raises(KeyError):
        batch["rows"]
