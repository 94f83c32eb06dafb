"""ElmoModel behaviour: determinism, padding, explicit state, validation, gradients, presets, save/load."""

import json
from unittest.mock import patch

import numpy as np
import pytest
import torch
from elmo_fixtures import SENTENCES, run, tiny_config
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, AutoTokenizer

from hf_elmo import (
    PRESETS,
    ElmoCharTokenizer,
    ElmoConfig,
    ElmoForBidirectionalLM,
    ElmoInferenceCache,
    ElmoModel,
    ElmoWithScalarMixes,
)
from hf_elmo.kernels import ElmoKernels


def test_output_shapes(model, tokenizer):
    encoded, output = run(model, tokenizer, SENTENCES)
    batch, positions = encoded["attention_mask"].shape
    assert len(output.hidden_states) == 3
    assert all(h.shape == (batch, positions, 16) for h in output.hidden_states)
    assert output.last_hidden_state is output.hidden_states[-1]
    h, c = output.final_state
    assert h.shape == (2, 2, batch, 8) and c.shape == (2, 2, batch, 24)
    # Layer 0 is the token representation duplicated.
    torch.testing.assert_close(output.hidden_states[0][..., :8], output.hidden_states[0][..., 8:])


def test_output_hidden_states_false_is_honoured(model, tokenizer):
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        full = model(**encoded)
        top_only = model(**encoded, output_hidden_states=False)
        as_tuple = model(**encoded, output_hidden_states=False, return_dict=False)
    assert len(full.hidden_states) == 3 and model(**encoded, output_hidden_states=True).hidden_states is not None
    assert top_only.hidden_states is None and torch.equal(top_only.last_hidden_state, full.last_hidden_state)
    # The tuple: the top layer, then the mask the layers were computed for.
    assert len(as_tuple) == 2 and torch.equal(as_tuple[0], full.last_hidden_state)
    assert torch.equal(as_tuple[1], encoded["attention_mask"].bool()) and torch.equal(full.attention_mask, as_tuple[1])
    lm = ElmoForBidirectionalLM(ElmoConfig(**{**tiny_config().to_dict(), "vocab_size": 7})).eval()
    with torch.no_grad():
        assert lm(**encoded, output_hidden_states=False).hidden_states is None
        assert len(lm(**encoded).hidden_states) == 3


@pytest.mark.parametrize("make", [lambda: ElmoModel(tiny_config()),
                                  lambda: ElmoForBidirectionalLM(ElmoConfig(**{**tiny_config().to_dict(),
                                                                                "vocab_size": 7}))])
def test_resize_token_embeddings_explains_that_elmo_reads_characters(make):
    model = make()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(NotImplementedError, match="ELMo reads characters"):
        model.resize_token_embeddings(100)
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]])
def test_sentence_vectors_do_not_depend_on_the_batch(model, tokenizer, order):
    _, batch_output = run(model, tokenizer, [SENTENCES[i] for i in order])
    for row, index in enumerate(order):
        _, alone = run(model, tokenizer, [SENTENCES[index]])
        n = alone.hidden_states[0].shape[1]
        for layer_batch, layer_alone in zip(batch_output.hidden_states, alone.hidden_states):
            assert (layer_batch[row, :n] - layer_alone[0]).abs().max() <= 1e-5
        for state_batch, state_alone in zip(batch_output.final_state, alone.final_state):
            assert (state_batch[:, :, row] - state_alone[:, :, 0]).abs().max() <= 1e-5


def test_extra_padding_changes_nothing(model, tokenizer):
    _, tight = run(model, tokenizer, SENTENCES)
    encoded_long = tokenizer(SENTENCES, is_split_into_words=True, padding="max_length", max_length=40,
                             return_tensors="pt")
    with torch.no_grad():
        long = model(**encoded_long)
    n = tight.hidden_states[0].shape[1]
    for a, b in zip(tight.hidden_states, long.hidden_states):
        assert (a - b[:, :n]).abs().max() <= 1e-5
        assert b[:, n:].abs().max() == 0


def test_padded_positions_are_exactly_zero(model, tokenizer):
    encoded, output = run(model, tokenizer, SENTENCES)
    padding = ~encoded["attention_mask"].bool()
    assert padding.any()
    for layer in output.hidden_states:
        assert layer[padding].abs().max() == 0


def test_same_sentence_twice_gives_identical_vectors(model, tokenizer):
    _, first = run(model, tokenizer, SENTENCES)
    _, second = run(model, tokenizer, SENTENCES)
    for a, b in zip(first.hidden_states, second.hidden_states):
        assert torch.equal(a, b)


def test_empty_rows_and_empty_batches(model, tokenizer):
    # A row with no position at all (no words, no boundaries) is all zeros and passes its state through.
    encoded = tokenizer([["a", "b"], []], is_split_into_words=True, add_special_tokens=False, padding=True,
                        return_tensors="pt")
    state = tuple(torch.randn_like(s) for s in model.bilstm.zero_state(2, torch.zeros(1)))
    with torch.no_grad():
        output = model(**encoded, initial_state=state, return_state=True)
    assert all(layer[1].abs().max() == 0 for layer in output.hidden_states)
    assert torch.equal(output.final_state[0][:, :, 1], state[0][:, :, 1])
    assert torch.equal(output.final_state[1][:, :, 1], state[1][:, :, 1])
    assert not torch.equal(output.final_state[0][:, :, 0], state[0][:, :, 0])
    # Empty sentence with boundaries: <S> </S> only.
    _, output = run(model, tokenizer, [[]])
    assert output.last_hidden_state.shape == (1, 2, 16)
    # Zero sentences and zero positions.
    for shape in [(0, 4, 50), (3, 0, 50)]:
        with torch.no_grad():
            output = model(torch.zeros(shape, dtype=torch.long), return_state=True)
        assert all(layer.shape == (*shape[:2], 16) for layer in output.hidden_states)
        assert output.final_state[0].shape == (2, 2, shape[0], 8)


def test_state_continues_the_stream_exactly(model, tokenizer):
    """Feeding a sentence in two calls with the state carried equals one call (forward direction)."""
    words = SENTENCES[3]
    whole = tokenizer([words], is_split_into_words=True, add_special_tokens=False, return_tensors="pt")
    first = tokenizer([words[:6]], is_split_into_words=True, add_special_tokens=False, return_tensors="pt")
    second = tokenizer([words[6:]], is_split_into_words=True, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        full = model(**whole).last_hidden_state[..., :8]
        part1 = model(**first, return_state=True)
        # Only the forward state carries meaning here; the backward LM would need the future.
        part2 = model(**second, initial_state=part1.final_state).last_hidden_state[..., :8]
    torch.testing.assert_close(torch.cat([part1.last_hidden_state[..., :8], part2], 1), full, atol=1e-6, rtol=0)


def test_bad_inputs_raise_clear_errors(model):
    good = torch.ones(2, 3, 50, dtype=torch.long)
    with pytest.raises(ValueError, match=r"shape \(batch, positions, 50\)"):
        model(torch.ones(2, 3, 49, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(batch, positions, 50\)"):
        model(torch.ones(3, 50, dtype=torch.long))
    with pytest.raises(ValueError, match="integer character ids"):
        model(good.float())
    with pytest.raises(ValueError, match=r"\[0, 262\)"):
        model(good * 300)
    with pytest.raises(ValueError, match="padded on the right"):
        model(good, attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        model(good, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="initial_state must be"):
        model(good, initial_state=(torch.zeros(2, 2, 3, 8), torch.zeros(2, 2, 3, 24)))


@pytest.mark.parametrize("requires_grad", [True, False])
def test_requires_grad(tokenizer, requires_grad):
    torch.manual_seed(0)
    embedder = ElmoWithScalarMixes(ElmoModel(tiny_config()), num_output_representations=2,
                                   requires_grad=requires_grad, dropout=0.0)
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    output = embedder(**encoded)
    sum(r.sum() for r in output.representations).backward()
    for name, parameter in embedder.elmo.named_parameters():
        if requires_grad:
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
        else:
            assert parameter.grad is None, name
    for mix in embedder.scalar_mixes:
        assert mix.scalar_parameters.grad is not None and mix.gamma.grad is not None


def test_dropout_only_in_training(tokenizer):
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(dropout=0.5))
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    model.train()
    assert not torch.equal(model(**encoded).last_hidden_state, model(**encoded).last_hidden_state)
    model.eval()
    assert torch.equal(model(**encoded).last_hidden_state, model(**encoded).last_hidden_state)


@pytest.mark.parametrize("overrides", [
    {"cell_clip": None, "proj_clip": None},
    {"use_skip_connections": False},
    {"projection_dim": 24},  # no LSTM projection (P == D)
    {"filters": [[1, 4], [2, 4]], "projection_dim": 8, "n_highway": 0},  # no CNN projection (F == P)
    {"activation": "tanh", "n_layers": 3},
])
def test_architecture_variants_run_and_are_batch_invariant(tokenizer, overrides):
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(**overrides)).eval()
    _, batch_output = run(model, tokenizer, SENTENCES)
    _, alone = run(model, tokenizer, SENTENCES[2:3])
    n = alone.last_hidden_state.shape[1]
    assert len(batch_output.hidden_states) == model.config.n_layers + 1
    assert (batch_output.last_hidden_state[2, :n] - alone.last_hidden_state[0]).abs().max() <= 1e-5


def test_presets_have_the_published_parameter_counts():
    expected = {"small": 13_593_296, "medium": 28_027_728, "original": 93_600_848}
    assert set(PRESETS) == set(expected)
    for name, count in expected.items():
        with torch.device("meta"):
            model = ElmoModel(ElmoConfig.from_preset(name))
        # The published counts are of the hdf5 layout, whose char embedding lacks our zero padding row.
        padding_row = model.config.char_embedding_dim
        assert sum(p.numel() for p in model.parameters()) - padding_row == count, name
    with pytest.raises(ValueError, match="unknown ELMo preset"):
        ElmoConfig.from_preset("huge")


def test_config_validation():
    with pytest.raises(ValueError, match="activation"):
        ElmoConfig(activation="gelu")
    with pytest.raises(ValueError, match="n_characters must be 262"):
        ElmoConfig(n_characters=261)
    with pytest.raises(ValueError, match="filters"):
        ElmoConfig(filters=[])
    with pytest.raises(ValueError, match=r"padding_char_id must be an integer >= 1 and <= 9"):
        ElmoConfig(character_vocabulary="lexicon", n_characters=10, padding_char_id=10)
    with pytest.raises(ValueError, match=r"word_vocab_size \(5\) and word_embedding_dim \(0\) are both > 0"):
        ElmoConfig(word_vocab_size=5)
    assert ElmoConfig(cell_clip=0, proj_clip=None).cell_clip is None  # 0 = no clipping, as in options.json


@pytest.mark.parametrize("field, value", [
    ("n_highway", -1), ("n_highway", "1"), ("lstm_dim", 0), ("lstm_dim", 512.5), ("lstm_dim", "512"),
    ("projection_dim", -8), ("projection_dim", True), ("n_layers", 0), ("char_embedding_dim", 0),
    ("max_characters_per_token", 2), ("vocab_size", 0), ("filters", [[1, "32"]]), ("filters", [[0, 32]]),
    ("filters", "[[1, 32]]"), ("filters", [[1, 32, 3]]), ("cell_clip", -1.0), ("proj_clip", "3"),
    ("use_skip_connections", "yes"), ("dropout", 1.0), ("dropout", -0.1), ("character_vocabulary", "utf8"),
    ("n_characters", 1), ("word_vocab_size", -1), ("word_embedding_dim", 2.0), ("forget_bias", "1"),
    ("padding_char_id", 0),
])
def test_every_config_field_is_validated_with_a_message_naming_it(tmp_path, field, value):
    with pytest.raises(ValueError, match=rf"ElmoConfig\.{field} "):
        ElmoConfig(**{field: value})
    # The same through a config.json, as a saved model would be loaded.
    ElmoConfig(lstm_dim=64, projection_dim=32).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, field: value}))
    with pytest.raises(ValueError, match=rf"ElmoConfig\.{field} "):
        AutoConfig.from_pretrained(tmp_path)


def test_projection_wider_than_the_cell_is_refused_by_the_config():
    with pytest.raises(ValueError, match=r"projection_dim \(512\) cannot exceed lstm_dim \(256\)"):
        ElmoConfig(lstm_dim=256, projection_dim=512)


def test_save_and_load_round_trip(tmp_path, model, tokenizer):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, ElmoConfig) and config.to_dict()["filters"] == model.config.filters
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(loaded, ElmoModel) and isinstance(loaded_tokenizer, ElmoCharTokenizer)
    _, expected = run(model, tokenizer, SENTENCES)
    _, actual = run(loaded, loaded_tokenizer, SENTENCES)
    for a, b in zip(expected.hidden_states, actual.hidden_states):
        assert torch.equal(a, b)
    # The implementation is chosen when loading, as transformers' attn_implementation: the same vectors.
    reference = AutoModel.from_pretrained(tmp_path, implementation="reference").eval()
    assert reference.config.implementation == "reference" and loaded.config.implementation == "kernels"
    _, through_blocks = run(reference, loaded_tokenizer, SENTENCES)
    for a, b in zip(expected.hidden_states, through_blocks.hidden_states):
        assert (a - b).abs().max() <= 1e-5


def test_bidirectional_lm_loss_and_loading(tmp_path, tokenizer):
    torch.manual_seed(0)
    lm = ElmoForBidirectionalLM(tiny_config(vocab_size=11, dropout=0.0)).eval()
    encoded = tokenizer(SENTENCES[:2], is_split_into_words=True, padding=True, return_tensors="pt")
    labels = torch.randint(0, 11, encoded["attention_mask"].shape).masked_fill(encoded["attention_mask"] == 0, -100)
    output = lm(**encoded, labels=labels)
    assert output.forward_logits.shape == (*labels.shape, 11)
    # The forward LM predicts the next word, the backward LM the previous one, between real positions.
    both_real = encoded["attention_mask"][:, :-1].bool() & encoded["attention_mask"][:, 1:].bool()
    forward = torch.nn.functional.cross_entropy(output.forward_logits[:, :-1][both_real], labels[:, 1:][both_real])
    backward = torch.nn.functional.cross_entropy(output.backward_logits[:, 1:][both_real], labels[:, :-1][both_real])
    torch.testing.assert_close(output.loss, 0.5 * (forward + backward))
    output.loss.backward()
    assert lm.softmax.weight.grad.abs().sum() > 0
    assert lm.elmo.char_cnn.char_embedding.weight.grad.abs().sum() > 0
    assert lm.elmo.char_cnn.char_embedding.weight.grad[0].abs().sum() == 0  # padding row stays zero

    lm.save_pretrained(tmp_path)
    reloaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, ElmoForBidirectionalLM)
    torch.testing.assert_close(reloaded(**encoded, labels=labels).loss, output.loss, rtol=0, atol=0)
    # The encoder alone loads from the LM checkpoint, with the same layers.
    encoder = AutoModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        np.testing.assert_array_equal(encoder(**encoded).last_hidden_state.numpy(),
                                      lm.elmo(**encoded).last_hidden_state.detach().numpy())
    with pytest.raises(ValueError, match="vocab_size"):
        ElmoForBidirectionalLM(tiny_config())


def test_bidirectional_lm_loss_ignores_targets_predicted_from_padding(tmp_path, tokenizer):
    """Labels on real positions only: a padded batch gives each row's own loss (backward LM at padding too)."""
    torch.manual_seed(0)
    lm = ElmoForBidirectionalLM(tiny_config(vocab_size=11, dropout=0.0)).eval()
    encoded = tokenizer([["a", "b", "c", "d"], ["e"]], is_split_into_words=True, padding=True, return_tensors="pt")
    labels = torch.randint(0, 11, encoded["attention_mask"].shape)  # garbage labels on padding too
    short = lm(**{k: v[1:, :3] for k, v in encoded.items()}, labels=labels[1:, :3]).loss
    padded_row = lm(**{k: v[1:] for k, v in encoded.items()}, labels=labels[1:]).loss
    torch.testing.assert_close(padded_row, short)
    # An LM built from an encoder checkpoint gets a properly initialised softmax.
    ElmoModel(tiny_config()).save_pretrained(tmp_path)
    softmax = ElmoForBidirectionalLM.from_pretrained(tmp_path, vocab_size=7).softmax
    assert softmax.weight.abs().max() < 10 and softmax.bias.abs().max() == 0
    assert 0.1 < softmax.weight.std() < 1.0  # N(0, 1/sqrt(projection_dim = 8)) ≈ 0.35


def test_modules_hold_no_inference_state(tokenizer):
    """Nothing but weights lives in the modules: calls leave no trace in them, so copies, pickles and concurrent
    callers see the same model."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    before = {name: dict(vars(module)) for name, module in model.named_modules()}
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        model(**encoded, inference_cache=ElmoInferenceCache())
    model(**encoded).last_hidden_state.sum().backward()
    after = {name: dict(vars(module)) for name, module in model.named_modules()}
    for name, attributes in after.items():
        changed = {key for key in attributes if key not in ("_parameters", "_buffers", "_modules")
                   and (key not in before[name] or attributes[key] is not before[name][key])}
        assert not changed, (name, changed)


class _OpsCalled(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ATen / extension ops run under it."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


@pytest.mark.slow
def test_torch_export_with_a_dynamic_batch_gives_the_eager_vectors_and_eager_keeps_its_fast_path(tokenizer):
    from hf_elmo.runtime import onednn_available

    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    model.config.kernel_options = {"onednn": True}  # the path eager calls must keep (MKL on Intel by default)
    first = tokenizer([SENTENCES[0], ["Hi"], ["a", "b"]], is_split_into_words=True, padding=True, return_tensors="pt")
    other = tokenizer([["x"] * 5, SENTENCES[1][:3]], is_split_into_words=True, padding=True, return_tensors="pt")
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (first["input_ids"], first["attention_mask"]),
                                  dynamic_shapes=({0: batch}, {0: batch}))
    graph_ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any("mkldnn" in op for op in graph_ops), graph_ops  # portable ATen ops only
    exported = program.module()
    for encoded in (first, other):  # 3 rows, then 2: the batch is dynamic
        with torch.no_grad():
            expected = model(**encoded).hidden_states
            got = exported(encoded["input_ids"], encoded["attention_mask"]).hidden_states
        for layer, reference in zip(got, expected, strict=True):
            assert layer.shape == reference.shape and (layer - reference).abs().max() <= 1e-5
    # Eager calls still take the oneDNN linear path (and the char CNN's distinct-word path) after the export.
    words = []  # rows of character ids through the char CNN
    embed_words = ElmoKernels.embed_words

    def counted(self, weights, ids):
        words.append(len(ids))
        return embed_words(self, weights, ids)

    with _OpsCalled() as called, torch.no_grad(), patch.object(ElmoKernels, "embed_words", counted):
        model(**first)
    distinct = {tuple(word) for word in first["input_ids"][first["attention_mask"].bool()].tolist()}
    assert sum(words) == len(distinct) < first["attention_mask"].numel()
    if onednn_available():
        assert "mkldnn._linear_pointwise" in called.ops, called.ops


@pytest.mark.slow
def test_torch_compile_with_inductor_gives_the_eager_vectors(tokenizer):
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    encoded = tokenizer([["The", "bank"], ["Hi"]], is_split_into_words=True, padding=True, return_tensors="pt")
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: no graph break anywhere
    with torch.no_grad():
        expected, got = model(**encoded).hidden_states, compiled(**encoded).hidden_states
    for layer, reference in zip(got, expected, strict=True):
        assert layer.shape == reference.shape and (layer - reference).abs().max() <= 1e-5
