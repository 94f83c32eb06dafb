"""AllenNLP's names with AllenNLP's signatures and outputs (`hf_elmo.allennlp`), checked against the AllenNLP
fixtures' expected outputs."""

from __future__ import annotations

import io
import json

import h5py
import numpy as np
import pytest
import torch
from elmo_fixtures import ALLENNLP, require, sentences

from hf_elmo import ElmoCharTokenizer
from hf_elmo.allennlp import DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE, Elmo, ElmoEmbedder, batch_to_ids
from hf_elmo.embed import EmbedSettingError
from hf_elmo.published import published_name

TOP = [-9e10, -9e10, 1.0]  # scalar_mix_parameters that select the top biLSTM layer


@pytest.fixture(scope="module")
def files() -> tuple[str, str]:
    return str(require(ALLENNLP / "options.json")), str(require(ALLENNLP / "lm_weights.hdf5"))


@pytest.fixture(scope="module")
def batch0() -> list[list[str]]:
    """Batch 0 of the original test (it starts from the zero state, as every batch does here)."""
    return [sentences(ALLENNLP / "sentences.json")[k][0].split() for k in range(3)]


def test_batch_to_ids_gives_allennlp_character_ids_without_boundaries(batch0):
    ids = batch_to_ids(batch0)
    lengths = [len(words) for words in batch0]
    assert ids.dtype == torch.int64 and ids.shape == (3, max(lengths), 50)
    tokenizer = ElmoCharTokenizer()
    for row, words in zip(ids, batch0, strict=True):
        assert row[: len(words)].tolist() == [list(tokenizer.word_to_char_ids(word)) for word in words]
        assert not row[len(words):].any()  # padding: zeros
    # AllenNLP's ids of "a": begin-of-word 259, the byte 97 + 1, end-of-word 260, padding 261
    assert batch_to_ids([["a"]])[0, 0, :5].tolist() == [259, 98, 260, 261, 261]


def test_batch_to_ids_drops_a_lone_surrogate_as_allennlp_does_and_the_tokenizer_keeps_its_bytes():
    """AllenNLP's `ELMoCharacterMapper` encodes each word with `encode("utf-8", "ignore")`: here the same ids (a word
    of surrogates alone is an empty word); the package's own tokenizer keeps the bytes of undecodable input."""
    words = ["a\udc80b", "\udcff", "caf\udce9 au"]
    dropped = [word.encode("utf-8", "ignore").decode("utf-8") for word in words]
    assert dropped == ["ab", "", "caf au"]
    assert torch.equal(batch_to_ids([words]), batch_to_ids([dropped]))
    # "": AllenNLP's begin-of-word 259 and end-of-word 260, then padding 261
    assert batch_to_ids([words])[0, 1, :3].tolist() == [259, 260, 261]
    kept = ElmoCharTokenizer().word_to_char_ids("a\udc80b")
    assert list(kept[:6]) == [259, 98, 0xED + 1, 0xB2 + 1, 0x80 + 1, 99]  # the surrogate's three bytes


def test_elmo_top_layer_mix_reproduces_the_allennlp_fixture(files, batch0):
    elmo = Elmo(*files, num_output_representations=2, dropout=0.0, scalar_mix_parameters=TOP).eval()
    with torch.no_grad():
        output = elmo(batch_to_ids(batch0))
    assert sorted(output) == ["elmo_representations", "mask"]
    assert len(output["elmo_representations"]) == 2 and elmo.get_output_dim() == 32
    assert output["mask"].tolist() == [[j < len(words) for j in range(max(map(len, batch0)))] for words in batch0]
    for k, words in enumerate(batch0):
        expected = h5py.File(ALLENNLP / f"lm_embeddings_{k}.hdf5", "r")["0"][...]  # (2, words, 16)
        for representation in output["elmo_representations"]:
            actual = representation[k].numpy()
            assert np.abs(actual[: len(words)] - np.concatenate(expected, axis=-1)).max() <= 1e-5
            assert not actual[len(words):].any()


def test_elmo_keeps_boundaries_when_asked_and_equals_the_embedder(files, batch0):
    kept = Elmo(*files, 1, dropout=0.0, keep_sentence_boundaries=True).eval()
    with torch.no_grad():
        output = kept(batch_to_ids(batch0))
    assert output["mask"].sum(1).tolist() == [len(words) + 2 for words in batch0]
    average = ElmoEmbedder(*files).with_settings(layers="average")
    for k, words in enumerate(batch0):
        np.testing.assert_allclose(output["elmo_representations"][0][k, 1 : len(words) + 1].numpy(),
                                   average.embed_sentence(words), atol=2e-6)


def test_elmo_learns_its_mixes_and_leaves_the_bilm_frozen(files, batch0):
    elmo = Elmo(*files, num_output_representations=2, dropout=0.0)
    trained = {name for name, parameter in elmo.named_parameters() if parameter.requires_grad}
    assert trained == {f"scalar_mixes.{i}.{name}" for i in range(2) for name in ("scalar_parameters", "gamma")}
    loss = sum(r.sum() for r in elmo(batch_to_ids(batch0))["elmo_representations"])
    loss.backward()
    assert all(elmo.scalar_mixes[i].gamma.grad is not None for i in range(2))
    assert Elmo(*files, requires_grad=True).elmo.char_cnn.char_embedding.weight.requires_grad


def test_elmo_embedder_takes_allennlp_positional_cuda_device(files, batch0, monkeypatch):
    positional = ElmoEmbedder(*files, -1)
    named = ElmoEmbedder(options_file=files[0], weight_file=files[1], cuda_device=-1)
    assert positional.device == torch.device("cpu") and positional.layers == "all"
    np.testing.assert_array_equal(positional.embed_sentence(batch0[0]), named.embed_sentence(batch0[0]))
    assert positional.embed_sentence(batch0[0]).shape == (3, len(batch0[0]), 32)  # AllenNLP's (layers, words, dim)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EmbedSettingError, match="cuda_device: cuda:0 was asked for, but this torch sees no CUDA"):
        ElmoEmbedder(*files, 0)


def test_elmo_takes_any_leading_dimensions_and_restores_them_on_every_output(files):
    """AllenNLP's (batch, sentences, words, 50) input (its `test_elmo_4D_input`): each sentence as its own row, the
    outputs and the mask shaped back; the same vectors as the sentences in a 3-D batch."""
    elmo = Elmo(*files, 2, dropout=0.0).eval()
    groups = [[["The", "sentence", "."], ["ELMo", "helps", "disambiguate", "ELMo", "from", "Elmo", "."]],
              [["1", "2"], ["1", "2", "3", "4", "5", "6", "7"]], [["1", "2", "3", "4", "50", "60", "70"], ["The"]]]
    ids = torch.stack([batch_to_ids(group) for group in groups], dim=1)  # (2, 3, 7, 50)
    kept = Elmo(*files, 1, dropout=0.0, keep_sentence_boundaries=True).eval()
    with torch.no_grad():
        four_d, with_boundaries = elmo(ids), kept(ids)
        for k, group in enumerate(groups):
            three_d = elmo(batch_to_ids(group))
            for got, expected in zip(four_d["elmo_representations"], three_d["elmo_representations"], strict=True):
                assert got.shape == (2, 3, 7, 32)
                torch.testing.assert_close(got[:, k], expected, rtol=0, atol=1e-6)
            assert torch.equal(four_d["mask"][:, k], three_d["mask"])
        elmo._elmo_lstm._elmo_lstm.reset_states()  # AllenNLP code resetting the carried states runs: none carried
        torch.testing.assert_close(elmo(ids)["elmo_representations"][1], four_d["elmo_representations"][1])
    assert four_d["mask"].shape == (2, 3, 7) and four_d["mask"].dtype == torch.bool
    assert four_d["mask"][1, 2].sum() == 1 and with_boundaries["mask"].shape == (2, 3, 9)
    assert with_boundaries["elmo_representations"][0].shape == (2, 3, 9, 32)


def test_embed_file_writes_hdf5_whatever_the_name_and_refuses_blank_lines_as_allennlp_does(files, tmp_path):
    """AllenNLP's `embed_file(input_file, output_file_path, output_format, batch_size, forget_sentences,
    use_sentence_keys)`: HDF5 in its `elmo` layout whatever the file is called (scripts name it `.txt`, `.emb`),
    whitespace-split lines, the open file closed after; a blank line refused (nothing written), as AllenNLP does."""
    embedder = ElmoEmbedder(*files)
    lines = "the cat sat\na dog\nthe cat sat\n"
    reference = ElmoEmbedder(*files)
    for name in ("out.txt", "out.npy", "out"):
        handle = io.StringIO(lines)
        assert embedder.embed_file(handle, tmp_path / name, output_format="average", batch_size=1) is None
        assert handle.closed
        with h5py.File(tmp_path / name) as output:
            assert sorted(output) == ["0", "1", "2", "sentence_to_index"]
            assert json.loads(output["sentence_to_index"][0]) == {"the cat sat": "2", "a dog": "1"}
            np.testing.assert_allclose(output["1"][()], reference.embed_sentence(["a", "dog"]).mean(0), atol=1e-6)
    assert embedder.layers == "all"  # the call's output_format left the embedder as it was
    source = tmp_path / "in.txt"
    source.write_text(lines)
    embedder.embed_file(str(source), tmp_path / "keys.emb", output_format="top", use_sentence_keys=True)
    with h5py.File(tmp_path / "keys.emb") as output:
        assert sorted(output) == ["a dog", "the cat sat"]  # a repeated line once, no sentence_to_index
        np.testing.assert_allclose(output["a dog"][()], reference.embed_sentence(["a", "dog"])[-1], atol=1e-6)
    embedder.embed_file(open(source), tmp_path / "forgot.hdf5", forget_sentences=True)
    with h5py.File(tmp_path / "forgot.hdf5") as output:
        assert sorted(output) == ["0", "1", "2"] and output["0"].shape == (3, 3, 32)
    with pytest.raises(ValueError, match="blank.txt: line 2 is blank: AllenNLP's embed_file takes one sentence per "
                                         "line, none empty"):
        (tmp_path / "blank.txt").write_text("A\n  \nB\n")
        embedder.embed_file(open(tmp_path / "blank.txt"), tmp_path / "blank.hdf5")
    assert not (tmp_path / "blank.hdf5").exists()
    with pytest.raises(EmbedSettingError, match="output_format: must be one of all, top, average, got 'mix'"):
        embedder.embed_file(io.StringIO("x\n"), tmp_path / "x.hdf5", output_format="mix")
    with pytest.raises(EmbedSettingError, match="batch_size: must be an integer >= 1, got 0"):
        embedder.embed_file(io.StringIO("x\n"), tmp_path / "x.hdf5", batch_size=0)
    with pytest.raises(ValueError, match="cannot name an HDF5 dataset"):
        embedder.embed_file(io.StringIO("and/or\n"), tmp_path / "bad.hdf5", use_sentence_keys=True)
    assert not (tmp_path / "bad.hdf5").exists() and not (tmp_path / "x.hdf5").exists()


def test_allennlp_default_files_name_the_published_original():
    assert published_name(DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE) == "original"
    old = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/2x4096_512_2048cnn_2xhighway/" \
          "elmo_2x4096_512_2048cnn_2xhighway_"
    assert published_name(old + "options.json", old + "weights.hdf5") == "original"


def test_what_elmo_does_not_support_is_one_clear_error(files, batch0):
    with pytest.raises(ValueError, match="vocab_to_cache is not supported"):
        Elmo(*files, vocab_to_cache=["a"])
    with pytest.raises(ValueError, match="give options_file and weight_file"):
        Elmo(num_output_representations=1)
    elmo = Elmo(*files)
    with pytest.raises(ValueError, match=r"inputs must be \(\.\.\., words, 50\) character ids"):
        elmo(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="word_inputs need vocab_to_cache"):
        elmo(batch_to_ids(batch0), torch.zeros(3, 2, dtype=torch.long))
