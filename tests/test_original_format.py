"""Original options.json + hdf5 ↔ save_pretrained: exact round trip, loading, and clear errors."""

import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from elmo_fixtures import ALLENNLP, FIXTURE_MODELS, require, sentences, tiny_config
from transformers import AutoModel, AutoTokenizer

from hf_elmo import ElmoModel, load_model
from hf_elmo.formats import FormatError
from hf_elmo.original_format import FORMAT, export_hdf5, model_from_original, original_layout


def read_all(path):
    with h5py.File(path, "r") as handle:
        found = {}
        handle.visititems(lambda name, item: found.__setitem__(name, item[...]) if isinstance(item, h5py.Dataset)
                          else None)
    return found


@pytest.mark.parametrize("name,model_dir,sentences_file", FIXTURE_MODELS, ids=[m[0] for m in FIXTURE_MODELS])
def test_round_trip_is_bit_exact(tmp_path, name, model_dir, sentences_file):
    options, weights = require(model_dir / "options.json"), require(model_dir / "lm_weights.hdf5")
    FORMAT.convert([options, weights], tmp_path / "model")
    options_out, weights_out = export_hdf5(load_model(tmp_path / "model"), tmp_path / "export" / "elmo_")
    original, exported = read_all(weights), read_all(weights_out)
    assert sorted(original) == sorted(exported)
    for dataset, array in original.items():
        assert exported[dataset].dtype == np.float32
        np.testing.assert_array_equal(exported[dataset], array, err_msg=dataset)
    original_options, exported_options = json.loads(options.read_text()), json.loads(options_out.read_text())
    assert exported_options["lstm"] == original_options["lstm"]
    assert {k: exported_options["char_cnn"][k] for k in original_options["char_cnn"]} == original_options["char_cnn"]


def test_converted_directory_loads_with_auto_classes(tmp_path):
    out = FORMAT.convert([require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5")], tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "README.md"} <= {p.name for p in out.iterdir()}
    model, tokenizer = AutoModel.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out)
    assert model.config.use_skip_connections and model.config.n_highway == 2
    # Batch 0 of the original test starts from the zero state, so the loaded model reproduces it directly.
    words = [sentences(ALLENNLP / "sentences.json")[k][0].split() for k in range(3)]
    encoded = tokenizer(words, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        top = model(**encoded).last_hidden_state
    for k in range(3):
        expected = h5py.File(ALLENNLP / f"lm_embeddings_{k}.hdf5", "r")["0"][...]
        actual = top[k, 1 : len(words[k]) + 1].numpy()
        assert np.abs(actual - np.concatenate(expected, axis=-1)).max() <= 1e-5
    card = (out / "README.md").read_text()
    assert "lm_weights.hdf5" in card and "trust_remote_code=True" in card and "elmo_layers" in card


@pytest.mark.parametrize("overrides", [
    {"filters": [[1, 4], [2, 4]], "projection_dim": 8, "n_highway": 0},  # F == P: no CNN_proj datasets
    {"projection_dim": 24, "cell_clip": None, "proj_clip": None},  # P == D: no W_P_0 datasets
    {"use_skip_connections": False, "activation": "tanh", "n_layers": 3},
    # F == P with a projection all the same (AllenNLP reads a CNN_proj whatever the widths; bilm-tf never writes one)
    {"filters": [[1, 4], [2, 4]], "projection_dim": 8, "n_highway": 0, "token_projection": True},
])
def test_layout_variants_round_trip(tmp_path, overrides):
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(**overrides))
    model.save_pretrained(tmp_path / "model")
    options, weights = export_hdf5(load_model(tmp_path / "model"), tmp_path / "original_")
    assert sorted(read_all(weights)) == sorted(original_layout(model.config))
    reloaded = model_from_original(options, weights)
    for key, value in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key
    assert reloaded.config.projects_tokens == model.config.projects_tokens
    assert ("CNN_proj/W_proj" in read_all(weights)) == model.config.projects_tokens
    lstm = json.loads(options.read_text())["lstm"]  # AllenNLP reads both clips (null: none), bilm-tf takes them too
    assert (lstm["cell_clip"], lstm["proj_clip"]) == (model.config.cell_clip, model.config.proj_clip)


def test_a_projection_between_equal_widths_is_a_linear_map_of_the_token_representation(tokenizer):
    """`token_projection=True` at F == P: the highway output goes through the projection (not the identity), in the
    kernels as in the reference blocks; `False` refuses different widths in one line."""
    torch.manual_seed(0)
    config = tiny_config(filters=[[1, 4], [2, 4]], projection_dim=8, n_highway=1, token_projection=True)
    model = ElmoModel(config).eval()
    batch = tokenizer.batch([["The", "bank", "."], ["Hi"]])
    with torch.no_grad():
        kernels = model(**batch).hidden_states
        model.config.implementation = "reference"
        blocks = model(**batch).hidden_states
        highway = model.char_cnn.highway(torch.randn(3, 8))
        assert not torch.allclose(model.char_cnn.projection(highway), highway)
    for a, b in zip(kernels, blocks, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="token_projection is false, but the token width .* differs from "
                                         "projection_dim"):
        tiny_config(token_projection=False)


@pytest.fixture
def original_copy(tmp_path):
    """A writable copy of the allennlp fixture pair in tmp_path."""
    options = shutil.copy(require(ALLENNLP / "options.json"), tmp_path / "options.json")
    weights = shutil.copy(require(ALLENNLP / "lm_weights.hdf5"), tmp_path / "weights.hdf5")
    return tmp_path / "options.json", tmp_path / "weights.hdf5", options, weights


def edit_options(path, update):
    options = json.loads(path.read_text())
    update(options)
    path.write_text(json.dumps(options))


def test_training_options_with_261_characters_are_accepted(original_copy):
    options, weights, *_ = original_copy
    edit_options(options, lambda o: o["char_cnn"].update(n_characters=261))
    assert model_from_original(options, weights).config.n_characters == 262


def test_missing_dataset_names_it(original_copy):
    options, weights, *_ = original_copy
    with h5py.File(weights, "a") as handle:
        del handle["CNN_high_1/W_carry"]
    with pytest.raises(FormatError, match=r"'CNN_high_1/W_carry' is missing \(expected shape \(124, 124\)\)"):
        model_from_original(options, weights)


def test_wrong_shape_names_dataset_and_shapes(original_copy):
    options, weights, *_ = original_copy
    with h5py.File(weights, "a") as handle:
        del handle["CNN_proj/b_proj"]
        handle["CNN_proj/b_proj"] = np.zeros(17, np.float32)
    with pytest.raises(FormatError, match=r"'CNN_proj/b_proj' has shape \(17,\), options.json implies \(16,\)"):
        model_from_original(options, weights)


def test_options_that_do_not_match_the_weights(original_copy):
    options, weights, *_ = original_copy
    edit_options(options, lambda o: o["char_cnn"].update(n_highway=3))
    with pytest.raises(FormatError, match="'CNN_high_2/W_carry' is missing"):
        model_from_original(options, weights)
    edit_options(options, lambda o: o["char_cnn"].update(n_highway=1))
    with pytest.raises(FormatError, match="unexpected dataset.*CNN_high_1/W_carry"):
        model_from_original(options, weights)
    edit_options(options, lambda o: (o["char_cnn"].update(n_highway=2), o["lstm"].update(dim=32)))
    with pytest.raises(FormatError, match=r"W_0' has shape \(32, 256\), options.json implies \(32, 128\)"):
        model_from_original(options, weights)


def test_corrupt_and_missing_files(original_copy, tmp_path):
    options, weights, *_ = original_copy
    weights.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 10)
    with pytest.raises(FormatError, match="not a readable HDF5 weight file"):
        model_from_original(options, weights)
    with pytest.raises(FormatError, match="no such file"):
        model_from_original(options, tmp_path / "nope.hdf5")
    options.write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        model_from_original(options, weights)
    options.write_text(json.dumps({"lstm": {"dim": 4}}))
    with pytest.raises(FormatError, match="word-input"):
        model_from_original(options, weights)
    options.write_text(json.dumps({"char_cnn": {"embedding": {"dim": 4}, "filters": [[1, 4]]}, "lstm": {}}))
    with pytest.raises(FormatError, match="missing required key 'char_cnn.max_characters_per_token'"):
        model_from_original(options, weights)


def test_truncated_file_gives_a_clear_error(original_copy):
    options, weights, *_ = original_copy
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match="weights.hdf5"):
        model_from_original(options, weights)
