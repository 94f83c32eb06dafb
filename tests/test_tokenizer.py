"""ElmoCharTokenizer: the original character ids, raw-text splitting, padding, odd input, save/load."""

import pickle

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, DataCollatorWithPadding

from hf_elmo import ElmoCharTokenizer, ElmoConfig, split_words

PAD = [261] * 50


def ids(tokenizer, word):
    return list(tokenizer.word_to_char_ids(word))


@pytest.fixture(scope="module")
def tokenizer():
    return ElmoCharTokenizer()


def test_allennlp_character_ids(tokenizer):
    """The expectations of AllenNLP's elmo_indexer_test (ids include the +1 offset)."""
    assert ids(tokenizer, "<S>") == [259, 257, 260] + [261] * 47
    assert ids(tokenizer, "</S>") == [259, 258, 260] + [261] * 47
    assert ids(tokenizer, chr(256) + "t") == [259, 197, 129, 117, 260] + [261] * 45
    assert ids(tokenizer, "Second") == [259, 84, 102, 100, 112, 111, 101, 260] + [261] * 42
    assert ids(tokenizer, ".") == [259, 47, 260] + [261] * 47
    batch = tokenizer([["a"], []], is_split_into_words=True, add_special_tokens=False, padding=True)
    assert batch["input_ids"][1] == [[0] * 50]  # a padding position is 50 zeros


def test_the_batch_form_is_the_padded_tokenizer_output(tokenizer):
    """The batch form training, the embedder and the spaCy layer use (`batch_ids`, `batch`) equals the tokenizer's
    padded `input_ids`."""
    sentences = [["The", "bank"], [], ["a", "<S>", "\udcff", "x" * 80]]
    ids, _ = tokenizer.batch_ids(sentences)
    assert ids.dtype == np.int64 and ids.shape == (3, 6, 50)
    expected = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="np")["input_ids"]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(tokenizer.batch(sentences).input_ids.numpy(), expected)
    assert tokenizer.batch_ids([])[0].shape == (0, 2, 50)
    assert not hasattr(tokenizer, "batch_char_ids")  # one batch form: `batch_ids` (and `batch` on it)


def test_bilm_tf_character_ids():
    """bilm-tf's test_data.py expectations (raw ids = ours - 1, max_word_length 5)."""
    tokenizer = ElmoCharTokenizer(max_characters_per_token=5)

    def raw(word):
        return [i - 1 for i in tokenizer.word_to_char_ids(word)]

    assert raw("th") == [258, 116, 104, 259, 260]
    assert raw("thhhhh") == [258, 116, 104, 104, 259]
    assert raw(chr(256) + "t") == [258, 196, 128, 116, 259]
    assert raw("<S>") == [258, 256, 259, 260, 260]
    assert raw("</S>") == [258, 257, 259, 260, 260]


def test_bilm_tf_batcher_shape(tokenizer):
    batch = tokenizer([["The", "first", "sentence"], ["Second", "."]], is_split_into_words=True, padding=True,
                      return_tensors="np")
    assert batch["input_ids"].shape == (2, 5, 50)
    assert batch["input_ids"][1, 4].sum() == 0 and batch["input_ids"][1, 3].tolist() == ids(tokenizer, "</S>")
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]


def test_raw_text_and_pre_tokenized_agree(tokenizer):
    raw = tokenizer("Don't stop!", return_tensors="pt")
    words = tokenizer(["Don", "'t", "stop", "!"], is_split_into_words=True, return_tensors="pt")
    assert torch.equal(raw["input_ids"], words["input_ids"])
    assert raw["input_ids"].shape == (1, 6, 50) and raw["attention_mask"].shape == (1, 6)


def test_single_and_batched_shapes(tokenizer):
    single = tokenizer("The cat")
    assert len(single["input_ids"]) == 4 and single["attention_mask"] == [1, 1, 1, 1]
    batch = tokenizer(["The cat", "A dog barked"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 5, 50) and batch["attention_mask"].shape == (2, 5)
    assert tokenizer(["a b"], return_tensors="pt")["input_ids"].shape == (1, 4, 50)
    with pytest.raises(ValueError, match="padding=True"):
        tokenizer(["a", "b c"], return_tensors="pt")


def test_padding_and_truncation(tokenizer):
    batch = tokenizer(["a b c", ""], padding="max_length", max_length=8, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 8, 50)
    assert batch["attention_mask"].sum(1).tolist() == [5, 2]
    batch = tokenizer(["a b c"], padding=True, pad_to_multiple_of=4, return_tensors="pt")
    assert batch["input_ids"].shape == (1, 8, 50)
    truncated = tokenizer("a b c d e f", truncation=True, max_length=4)
    assert tokenizer.decode(truncated["input_ids"]) == "<S> a b </S>"
    with pytest.raises(ValueError, match="no room"):
        tokenizer("a b", truncation=True, max_length=1)
    without = tokenizer("a b", add_special_tokens=False)
    assert tokenizer.decode(without["input_ids"]) == "a b"
    masked = tokenizer(["a b", "c"], padding=True, return_special_tokens_mask=True, return_length=True)
    assert masked["special_tokens_mask"] == [[1, 0, 0, 1], [1, 0, 1, 1]]
    assert masked["length"] == [4, 3]


def test_only_right_padding(tokenizer):
    with pytest.raises(ValueError, match="right"):
        tokenizer(["a", "b c"], padding=True, padding_side="left")
    with pytest.raises(ValueError, match="right"):
        ElmoCharTokenizer(padding_side="left")


def test_unsupported_arguments_raise(tokenizer):
    with pytest.raises(ValueError, match="pairs"):
        tokenizer("a", "b")
    with pytest.raises(ValueError, match="overflowing"):
        tokenizer("a", return_overflowing_tokens=True)
    with pytest.raises(TypeError, match="list of str"):
        tokenizer([["a", 3]], is_split_into_words=True)


def test_data_collator_pads_3d_ids_and_keeps_labels(tokenizer):
    features = [dict(tokenizer("a b"), label=1), dict(tokenizer("a b c d"), label=0)]
    batch = DataCollatorWithPadding(tokenizer)(features)
    assert batch["input_ids"].shape == (2, 6, 50)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    assert batch["labels"].tolist() == [1, 0]
    word_labels = tokenizer.pad([{"input_ids": [[1] * 50], "labels": [5]}, {"input_ids": [[1] * 50] * 3,
                                 "labels": [1, 2, 3]}], return_tensors="pt")
    assert word_labels["labels"].tolist() == [[5, -100, -100], [1, 2, 3]]


def test_decode_round_trip(tokenizer):
    sentences = [["Héllo", "wörld", "中文", "👍", "naïve"], ["x"]]
    batch = tokenizer(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    assert tokenizer.decode(batch["input_ids"], skip_special_tokens=True) == ["Héllo wörld 中文 👍 naïve", "x"]
    assert tokenizer.batch_decode(batch["input_ids"])[1] == "<S> x </S>"


@pytest.mark.parametrize("word,expected_bytes", [
    ("", b""),  # an empty word is a real position with no characters
    ("\x00", b"\x00"),  # NUL is byte 0 → id 1, never confused with padding (0)
    ("\x07\x1b", b"\x07\x1b"),
    ("😀", "😀".encode()),
    ("中", "中".encode()),
    ("a\ud800b", b"a\xed\xa0\x80b"),  # lone surrogate kept as its 3 bytes instead of dropped
    ("x" * 10_000, b"x" * 48),  # cut to 48 bytes
    ("é" * 30, "é".encode() * 24),
    ("a" + "é" * 30, b"a" + "é".encode() * 23 + b"\xc3"),  # cut inside a character, as the original
])
def test_odd_words(tokenizer, word, expected_bytes):
    row = ids(tokenizer, word)
    assert len(row) == 50 and min(row) >= 1
    assert row[0] == 259 and row[len(expected_bytes) + 1] == 260
    assert bytes(i - 1 for i in row[1 : len(expected_bytes) + 1]) == expected_bytes


def test_odd_words_decode(tokenizer):
    batch = tokenizer([["a\ud800b", "x" * 10_000, "a" + "é" * 30]], is_split_into_words=True)
    words = tokenizer.decode(batch["input_ids"], skip_special_tokens=True)[0].split(" ")
    assert words[0] == "a\ud800b" and words[1] == "x" * 48
    assert words[2] == "a" + "é" * 23 + "\ufffd"  # the cut character shows as U+FFFD


def test_empty_and_whitespace_text_are_sentences_without_words(tokenizer):
    batch = tokenizer(["", "   ", "\n\t"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (3, 2, 50)
    assert batch["attention_mask"].tolist() == [[1, 1]] * 3


def test_save_load_and_auto_tokenizer(tmp_path):
    tokenizer = ElmoCharTokenizer(max_characters_per_token=20)
    tokenizer.save_pretrained(tmp_path)
    ElmoConfig(max_characters_per_token=20).save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(loaded, ElmoCharTokenizer) and loaded.max_characters_per_token == 20
    text = "A sentence, with punctuation!"
    np.testing.assert_array_equal(loaded(text, return_tensors="np")["input_ids"],
                                  tokenizer(text, return_tensors="np")["input_ids"])


def test_raw_text_is_split_by_the_word_tokenizer_the_model_was_trained_with(tmp_path):
    text = "I don't know.  Really?"
    spacy_tokenizer = ElmoCharTokenizer(word_tokenizer="spacy:en")
    assert spacy_tokenizer.tokenize(text) == ["I", "do", "n't", "know", ".", "Really", "?"]
    assert ElmoCharTokenizer().tokenize(text) == split_words(text) == ["I", "don", "'t", "know", ".", "Really", "?"]
    assert ElmoCharTokenizer(word_tokenizer="whitespace").tokenize(text) == ["I", "don't", "know.", "Really?"]
    batch = spacy_tokenizer([text], return_tensors="pt")
    assert spacy_tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True) == "I do n't know . Really ?"
    spacy_tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.word_tokenizer == "spacy:en" and reloaded.tokenize(text) == spacy_tokenizer.tokenize(text)
    assert pickle.loads(pickle.dumps(spacy_tokenizer)).tokenize(text) == spacy_tokenizer.tokenize(text)
    config = ElmoConfig(lstm_dim=8, projection_dim=4, filters=[[1, 4]], word_tokenizer="whitespace")
    assert ElmoCharTokenizer.for_model(config).word_tokenizer == "whitespace"
    with pytest.raises(ValueError, match="unknown word tokenizer 'moses'"):
        ElmoCharTokenizer(word_tokenizer="moses")


def test_truncation_side_left_keeps_the_last_words():
    words = ["a", "b", "c", "d", "e"]
    right = ElmoCharTokenizer()
    left = ElmoCharTokenizer(truncation_side="left")
    for tokenizer, kept in ((right, ["a", "b", "c"]), (left, ["c", "d", "e"])):
        encoded = tokenizer([words, ["x"]], is_split_into_words=True, truncation=True, max_length=5)
        assert tokenizer.decode(encoded["input_ids"][0]) == " ".join(["<S>", *kept, "</S>"])
        assert tokenizer.decode(encoded["input_ids"][1]) == "<S> x </S>"


def test_rows_are_lists_with_and_without_padding():
    tokenizer = ElmoCharTokenizer()
    for encoded in (tokenizer("a b"), tokenizer(["a b", "c"]), tokenizer(["a b", "c"], padding=True)):
        sentences = encoded["input_ids"] if isinstance(encoded["input_ids"][0][0], list) else [encoded["input_ids"]]
        assert all(type(row) is list and type(row[0]) is int for rows in sentences for row in rows)


def test_return_token_type_ids_gives_zeros_per_position():
    tokenizer = ElmoCharTokenizer()
    encoded = tokenizer(["a b", "c"], padding=True, return_token_type_ids=True, return_tensors="pt")
    assert encoded["token_type_ids"].shape == encoded["attention_mask"].shape == (2, 4)
    assert not encoded["token_type_ids"].any()
    assert tokenizer("a", return_token_type_ids=True)["token_type_ids"] == [0, 0, 0]
    assert "token_type_ids" not in tokenizer("a")


@pytest.mark.parametrize(
    ("input_ids", "message"),
    [([1, 2, 3], "not a flat list of token ids"), (torch.tensor([1, 2]), "not a flat list of token ids"),
     ([[[1, 2, 3]]], r"sentence 0 has input_ids of shape \(1, 3\)")],
)
def test_pad_rejects_ids_that_are_not_character_ids(input_ids, message):
    with pytest.raises(ValueError, match=message):
        ElmoCharTokenizer().pad({"input_ids": input_ids})
