"""A fresh biLM starts from bilm-tf's initialisation, and a checkpoint's missing keys are initialised the same way."""

import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_elmo import ElmoConfig, ElmoForBidirectionalLM, ElmoModel

CONFIG = dict(filters=[[1, 32], [2, 64], [3, 128], [4, 256]], lstm_dim=512, projection_dim=128, n_highway=2)


def small_lm(**overrides) -> ElmoForBidirectionalLM:
    torch.manual_seed(0)
    return ElmoForBidirectionalLM(ElmoConfig.from_preset("small", vocab_size=1000, **{**CONFIG, **overrides}))


def assert_uniform(tensor: torch.Tensor, bound: float) -> None:
    """Values fill [-bound, bound] like U(-bound, bound): range and standard deviation bound / sqrt(3)."""
    assert tensor.abs().max() <= bound
    assert tensor.abs().max() >= 0.98 * bound
    assert tensor.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)


def assert_normal(tensor: torch.Tensor, std: float) -> None:
    assert tensor.mean().abs() < 0.05 * std
    assert tensor.std().item() == pytest.approx(std, rel=0.05)


def assert_bilm_tf_init(lm: ElmoForBidirectionalLM) -> None:
    config = lm.config
    cnn = lm.elmo.char_cnn
    embedding = cnn.char_embedding.weight
    assert torch.equal(embedding[0], torch.zeros_like(embedding[0]))  # padding character
    assert_uniform(embedding[1:], 1.0)
    for conv in cnn.convs:
        assert_uniform(conv.weight, 0.05)
        assert torch.equal(conv.bias, torch.zeros_like(conv.bias))
    for layer in cnn.highway.layers:
        dim = layer.in_features
        assert_normal(layer.weight, math.sqrt(1.0 / dim))
        assert torch.equal(layer.bias[:dim], torch.zeros(dim))  # transform
        assert torch.equal(layer.bias[dim:], torch.full((dim,), -2.0))  # gate: mostly copy the input
    assert_normal(cnn.projection.weight, math.sqrt(1.0 / config.n_filters))
    assert torch.equal(cnn.projection.bias, torch.zeros(config.projection_dim))
    cell, hidden = config.lstm_dim, config.projection_dim
    for layer in lm.elmo.bilstm.layers:
        glorot = math.sqrt(6.0 / (hidden + hidden + 4 * cell))
        assert_uniform(layer.input_weight, glorot)
        assert_uniform(layer.recurrent_weight, glorot)
        assert torch.equal(layer.bias, torch.zeros_like(layer.bias))
        assert_uniform(layer.projection_weight, math.sqrt(6.0 / (cell + hidden)))
    assert_normal(lm.softmax.weight, math.sqrt(1.0 / hidden))
    assert torch.equal(lm.softmax.bias, torch.zeros_like(lm.softmax.bias))


def test_a_fresh_bilm_has_bilm_tf_initialisation():
    assert_bilm_tf_init(small_lm())


def test_tanh_char_cnn_filters_are_normal_with_the_window_fan_in():
    lm = small_lm(activation="tanh")
    for (width, _), conv in zip(lm.config.filters, lm.elmo.char_cnn.convs):
        assert_normal(conv.weight, math.sqrt(1.0 / (width * lm.config.char_embedding_dim)))


def test_a_fresh_encoder_has_the_same_initialisation():
    torch.manual_seed(0)
    model = ElmoModel(ElmoConfig.from_preset("small", **CONFIG))
    layer = model.char_cnn.highway.layers[0]
    assert torch.equal(layer.bias[layer.in_features :], torch.full((layer.in_features,), -2.0))
    assert model.char_cnn.char_embedding.weight.abs().max() <= 1.0


@pytest.mark.parametrize("dropped", ["elmo.char_cnn.", "elmo.bilstm.", "softmax."])
def test_missing_checkpoint_keys_get_the_initialisation_not_leftover_memory(tmp_path, dropped):
    trained = small_lm()
    with torch.no_grad():  # stand-in for trained weights: far from any initialisation
        for parameter in trained.parameters():
            parameter.fill_(7.0)
    trained.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    kept = {key: value for key, value in weights.items() if not key.startswith(dropped)}
    assert len(kept) < len(weights)
    save_file(kept, tmp_path / "model.safetensors", metadata={"format": "pt"})

    loaded = ElmoForBidirectionalLM.from_pretrained(tmp_path)
    for name, parameter in loaded.named_parameters():
        assert torch.isfinite(parameter).all(), name
        if name.startswith(dropped):
            assert not (parameter == 7.0).any(), name
        else:
            assert (parameter == 7.0).all(), f"{name} was loaded, yet re-initialised"
    reference = small_lm()
    fresh = dict(reference.named_parameters())
    for name, parameter in loaded.named_parameters():
        if name.startswith(dropped):  # the same distributions as a fresh model's (statistics, not values)
            assert parameter.abs().max() <= 1.5 * fresh[name].abs().max() + 1e-6, name
            assert parameter.std().item() == pytest.approx(fresh[name].std().item(), rel=0.1, abs=1e-6), name
    if dropped == "elmo.char_cnn.":
        highway = loaded.elmo.char_cnn.highway.layers[0]
        assert torch.equal(highway.bias[highway.in_features :], torch.full((highway.in_features,), -2.0))
        assert torch.equal(loaded.elmo.char_cnn.char_embedding.weight[0], torch.zeros(16))
