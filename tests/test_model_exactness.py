"""The converted original fixture models reproduce the original tests' expected outputs."""

import h5py
import numpy as np
import pytest
import torch
from elmo_fixtures import ALLENNLP, FIXTURE_MODELS, require, sentences

from hf_elmo import ElmoCharTokenizer
from hf_elmo.original_format import model_from_original

TOLERANCE = 1e-5


@pytest.fixture(params=["onednn", "mkl", "reference"])
def implementation(request):
    """The config settings of each way the biLM computes on a CPU: the kernels with either matmul path, oneDNN (the
    default where torch has it and the CPU is not Intel's) and `F.linear`, and the blocks' reference `forward`."""
    from hf_elmo.runtime import onednn_available

    if request.param == "reference":
        return {"implementation": "reference"}
    if request.param == "onednn":
        assert onednn_available(), "this torch build has no oneDNN linear ops"
    return {"kernel_options": {"onednn": request.param == "onednn"}}


@pytest.mark.parametrize("name,model_dir,sentences_file", FIXTURE_MODELS, ids=[m[0] for m in FIXTURE_MODELS])
def test_stateful_top_layer_matches_original(name, model_dir, sentences_file, implementation):
    """10 batches of 3 sentences, state carried row by row through final_state → initial_state (744 vectors)."""
    model = model_from_original(require(model_dir / "options.json"), require(model_dir / "lm_weights.hdf5"))
    model.config.update(implementation)
    tokenizer = ElmoCharTokenizer()
    batches = sentences(sentences_file)
    expected_files = [h5py.File(require(model_dir / f"lm_embeddings_{k}.hdf5"), "r") for k in range(3)]
    state, worst, compared = None, 0.0, 0
    for i in range(10):
        words = [batches[k][i].split() for k in range(3)]
        encoded = tokenizer(words, is_split_into_words=True, padding=True, return_tensors="pt")
        with torch.no_grad():
            output = model(**encoded, initial_state=state, return_state=True)
        state = output.final_state
        assert encoded["attention_mask"].sum(1).tolist() == [len(w) + 2 for w in words]
        for k in range(3):
            expected = expected_files[k][str(i)][...]  # (2, T, P): forward, backward
            expected = np.concatenate([expected[0], expected[1]], axis=-1)
            actual = output.last_hidden_state[k, 1 : len(words[k]) + 1].numpy()
            assert actual.shape == expected.shape
            worst = max(worst, float(np.abs(actual - expected).max()))
            compared += len(words[k])
    assert compared == 744
    assert worst <= TOLERANCE, f"{name}: max abs diff {worst:.3g}"


@pytest.mark.parametrize("name,model_dir,sentences_file", FIXTURE_MODELS, ids=[m[0] for m in FIXTURE_MODELS])
def test_zero_state_differs_after_first_batch(name, model_dir, sentences_file):
    """Without the carried state only batch 0 matches: the fixtures really test the state API."""
    model = model_from_original(model_dir / "options.json", require(model_dir / "lm_weights.hdf5"))
    words = [sentences(sentences_file)[k][1].split() for k in range(3)]
    encoded = ElmoCharTokenizer()(words, is_split_into_words=True, padding=True, return_tensors="pt")
    expected = h5py.File(model_dir / "lm_embeddings_0.hdf5", "r")["1"][...]
    with torch.no_grad():
        actual = model(**encoded).last_hidden_state[0, 1 : len(words[0]) + 1].numpy()
    assert np.abs(actual - np.concatenate(expected, axis=-1)).max() > 1e-2


def test_token_representation_matches_original(implementation):
    """The char CNN of every line of vocab_test.txt equals elmo_token_embeddings.hdf5 (458 x 16)."""
    model = model_from_original(require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5"))
    model.config.update(implementation)
    tokenizer = ElmoCharTokenizer()
    vocab = require(ALLENNLP / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    expected = h5py.File(require(ALLENNLP / "elmo_token_embeddings.hdf5"), "r")["embedding"][...]
    assert len(vocab) == expected.shape[0] == 458
    # Rows of 50 tokens (the last one padded), as in the original test.
    rows = [vocab[i : i + 50] for i in range(0, len(vocab), 50)]
    encoded = tokenizer(rows, is_split_into_words=True, add_special_tokens=False, padding=True, return_tensors="pt")
    mask = encoded["attention_mask"].bool()
    with torch.no_grad():
        actual = model(**encoded).hidden_states[0].chunk(2, dim=-1)[0][mask].numpy()
    assert np.abs(actual - expected).max() <= TOLERANCE


def test_boundary_tokens_equal_the_encoded_strings():
    """Encoding the words '<S>' / '</S>' gives the vectors of the boundaries the tokenizer adds."""
    model = model_from_original(require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5"))
    tokenizer = ElmoCharTokenizer()
    with_boundaries = tokenizer(["<S>", "</S>"], is_split_into_words=True, return_tensors="pt")
    assert torch.equal(with_boundaries["input_ids"][0, 0], with_boundaries["input_ids"][0, 1])
    assert torch.equal(with_boundaries["input_ids"][0, 2], with_boundaries["input_ids"][0, 3])
    with torch.no_grad():
        layer0 = model(**with_boundaries).hidden_states[0][0]
    torch.testing.assert_close(layer0[0], layer0[1], rtol=0, atol=0)
    torch.testing.assert_close(layer0[2], layer0[3], rtol=0, atol=0)
