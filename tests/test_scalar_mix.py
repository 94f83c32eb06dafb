"""ElmoScalarMix and the k-representation wrapper."""

import pytest
import torch
from elmo_fixtures import ALLENNLP, require, tiny_config

from hf_elmo import ElmoCharTokenizer, ElmoModel, ElmoScalarMix, ElmoWithScalarMixes, remove_sentence_boundaries
from hf_elmo.formulas import scalar_mix
from hf_elmo.original_format import model_from_original


def layers_and_mask():
    torch.manual_seed(0)
    layers = [torch.randn(3, 5, 4) for _ in range(3)]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    return layers, mask


@pytest.mark.parametrize("weights,gamma", [([0.1, 0.3, 0.5], 1.1), ([0.2, 0.4, 0.6], 0.88)])
def test_mix_is_gamma_times_softmax_weighted_sum(weights, gamma):
    layers, _ = layers_and_mask()
    mix = ElmoScalarMix(3, initial_scalar_parameters=weights)
    with torch.no_grad():
        mix.gamma.fill_(gamma)
    expected = gamma * sum(w * layer for w, layer in zip(torch.softmax(torch.tensor(weights), 0), layers))
    torch.testing.assert_close(mix(layers), expected)
    torch.testing.assert_close(mix(torch.stack(layers)), expected)


def test_default_is_the_uniform_average_and_parameters_train():
    layers, _ = layers_and_mask()
    mix = ElmoScalarMix(3)
    torch.testing.assert_close(mix(layers), sum(layers) / 3)
    mix(layers).sum().backward()
    assert mix.scalar_parameters.grad is not None and mix.gamma.grad is not None
    fixed = ElmoScalarMix(3, initial_scalar_parameters=[-9e10, 1, -9e10], trainable=False)
    torch.testing.assert_close(fixed(layers), layers[1])
    assert not any(p.requires_grad for p in fixed.parameters())
    torch.testing.assert_close(ElmoScalarMix(3, initial_scalar_parameters=[1.0, 2.0, 0.0]).l2_penalty(),
                               torch.tensor(5.0))


def test_layer_norm_uses_each_sentences_real_positions():
    layers, mask = layers_and_mask()
    mix = ElmoScalarMix(3, do_layer_norm=True)
    mixed = mix(layers, mask)
    # Row 1 alone gives the same result: the statistics are per sentence, not per batch.
    alone = mix([layer[1:2, :2] for layer in layers], mask[1:2, :2])
    torch.testing.assert_close(mixed[1:2, :2], alone)
    assert mixed[~mask].abs().max() == 0
    # Each normalised layer has mean 0 and variance 1 over a sentence's real values.
    normalised = scalar_mix([layers[0]], torch.ones(1), 1.0, mask, layer_norm=True)[0]
    torch.testing.assert_close(normalised.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(normalised.var(unbiased=False), torch.tensor(1.0), atol=1e-5, rtol=0)


def test_layer_dropout_and_dropout_only_in_training():
    layers, _ = layers_and_mask()
    mix = ElmoScalarMix(3, layer_dropout=0.5, dropout=0.5)
    mix.eval()
    torch.testing.assert_close(mix(layers), sum(layers) / 3)
    mix.train()
    torch.manual_seed(1)
    assert not torch.allclose(mix(layers), sum(layers) / 3)


def test_wrong_number_of_layers():
    with pytest.raises(ValueError, match="expects 3 layers, got 2"):
        ElmoScalarMix(3)([torch.zeros(1, 1, 1)] * 2)
    with pytest.raises(ValueError, match="2 initial scalar parameters for 3 layers"):
        ElmoScalarMix(3, initial_scalar_parameters=[0, 0])


def test_remove_sentence_boundaries():
    tensor = torch.arange(1, 6, dtype=torch.float).view(1, 5, 1).repeat(2, 1, 1)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    words, words_mask = remove_sentence_boundaries(tensor, mask)
    assert words.squeeze(-1).tolist() == [[2, 3, 4], [2, 0, 0]]
    assert words_mask.tolist() == [[True, True, True], [True, False, False]]


def test_representations_shapes_like_allennlp():
    """AllenNLP's Elmo shape test: 2 representations (2, 7, 32) and mask (2, 7); (2, 9, ...) with boundaries."""
    model = model_from_original(require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5"))
    sentences = [["The", "sentence", "."], ["ELMo", "helps", "disambiguate", "ELMo", "from", "Elmo", "."]]
    encoded = ElmoCharTokenizer()(sentences, is_split_into_words=True, padding=True, return_tensors="pt")
    output = ElmoWithScalarMixes(model, num_output_representations=2, dropout=0.0)(**encoded)
    assert [tuple(r.shape) for r in output.representations] == [(2, 7, 32)] * 2
    assert output.mask.tolist() == [[True] * 3 + [False] * 4, [True] * 7]
    kept = ElmoWithScalarMixes(model, 2, keep_sentence_boundaries=True, dropout=0.0)(**encoded)
    assert kept.representations[0].shape == (2, 9, 32) and kept.mask.shape == (2, 9)
    # Without boundaries, a word's vector is the mix of its own biLM position.
    torch.testing.assert_close(output.representations[0][1, 0], kept.representations[0][1, 1])


def test_frozen_wrapper_keeps_the_bilm_unchanged_under_training():
    torch.manual_seed(0)
    elmo = ElmoModel(tiny_config())
    wrapper = ElmoWithScalarMixes(elmo, dropout=0.0)
    before = {k: v.clone() for k, v in elmo.state_dict().items()}
    optimizer = torch.optim.SGD([p for p in wrapper.parameters() if p.requires_grad], lr=0.5)
    encoded = ElmoCharTokenizer()(["a b c", "d e"], padding=True, return_tensors="pt")
    for _ in range(3):
        optimizer.zero_grad()
        wrapper(**encoded).representations[0].pow(2).sum().backward()
        optimizer.step()
    assert all(torch.equal(before[k], v) for k, v in elmo.state_dict().items())
    assert not torch.equal(wrapper.scalar_mixes[0].scalar_parameters, torch.zeros(3))


def test_a_frozen_bilm_runs_without_dropout_while_its_wrapper_trains():
    """A fixed biLM gives the same layers in training as at inference (AllenNLP's frozen Elmo has no biLM dropout);
    fine-tuned (`requires_grad=True`), its dropout is on in training."""
    torch.manual_seed(0)
    encoded = ElmoCharTokenizer()(["a b c", "d e"], padding=True, return_tensors="pt")
    frozen = ElmoWithScalarMixes(ElmoModel(tiny_config(dropout=0.5)), dropout=0.0).train()
    assert not frozen.elmo.training
    with torch.no_grad():
        first, second = (frozen(**encoded).hidden_states for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    tuned = ElmoWithScalarMixes(ElmoModel(tiny_config(dropout=0.5)), requires_grad=True, dropout=0.0).train()
    assert tuned.elmo.training
    assert not tuned.eval().elmo.training
