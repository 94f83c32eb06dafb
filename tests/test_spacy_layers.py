"""Thinc layers and registered functions of the plugin: ScalarMix, listener, biLM layer, span getters, loaders."""

from __future__ import annotations

import numpy as np
import pytest
import spacy
import torch
from elmo_fixtures import ALLENNLP, require
from spacy.tokens import Doc
from spacy.util import registry
from spacy_fixtures import N_LAYERS, WIDTH
from thinc.api import Config, with_padded

from spacy_elmo.architectures import elmo_bilm_v2, elmo_listener_v1, scalar_mix_v1, scalar_mix_v2, tok2vec_elmo_v1
from spacy_elmo.layers import BiattentiveEncoder, ElmoListener, biattentive_encoder, elmo_shim
from spacy_elmo.span_getters import configure_doc_spans, configure_sent_spans, configure_sentence_spans
from spacy_elmo.weights import load_pretrained, random_bilm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def random_layers(seed: int = 0, lengths=(4, 0, 7)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(3, n, 5)).astype("float32") for n in lengths]


def make_mix(s=(0.1, 0.3, 0.5), gamma=1.1, l2=0.0, **settings):
    mix = scalar_mix_v2(3, l2=l2, **settings)
    mix.initialize()
    mix.set_param("s", np.asarray(s, dtype="float32"))
    mix.set_param("gamma", np.asarray([gamma], dtype="float32"))
    return mix


def test_scalar_mix_is_gamma_times_softmax_weighted_sum():
    Xs = random_layers()
    mix = make_mix()
    weights = np.exp([0.1, 0.3, 0.5]) / np.exp([0.1, 0.3, 0.5]).sum()
    for X, Y in zip(Xs, mix.predict(Xs)):
        np.testing.assert_allclose(Y, 1.1 * np.tensordot(weights, X, axes=1), rtol=1e-5, atol=1e-6)
    default = scalar_mix_v1(3)
    default.initialize()
    np.testing.assert_allclose(default.predict(Xs)[0], Xs[0].mean(axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer_norm", [False, True])
def test_scalar_mix_agrees_with_elmo_scalar_mix(layer_norm):
    """The Thinc mix and `hf_elmo.ElmoScalarMix` compute the same function and gradients of s, gamma and the
    layers, with the paper's regulariser. With layer norm both normalise over one sequence's values (`scalar_mix`):
    a row of the batch in torch, a Doc in spaCy (one sentence each here; see the next test for several)."""
    from hf_elmo import ElmoScalarMix

    Xs = random_layers(3, lengths=(4, 7, 1))
    rng = np.random.default_rng(4)
    dYs = [rng.normal(size=X.shape[1:]).astype("float32") for X in Xs]
    mix = make_mix(layer_norm=layer_norm, l2=0.01)
    Ys, backprop = mix.begin_update(Xs)
    dXs = backprop(dYs)
    reference = ElmoScalarMix(3, do_layer_norm=layer_norm, initial_scalar_parameters=[0.1, 0.3, 0.5])
    with torch.no_grad():
        reference.gamma.fill_(1.1)
    for X, Y, dY, dX in zip(Xs, Ys, dYs, dXs):
        layers = torch.tensor(X[:, None], requires_grad=True)  # (layers, 1 sentence, words, width)
        output = reference(layers, torch.ones(1, X.shape[1], dtype=torch.bool))[0]
        np.testing.assert_allclose(Y, output.detach().numpy(), rtol=1e-5, atol=1e-5)
        (output * torch.from_numpy(dY)).sum().backward()
        np.testing.assert_allclose(dX, layers.grad[:, 0].numpy(), rtol=1e-4, atol=1e-5)
    (0.01 * reference.l2_penalty()).backward()
    np.testing.assert_allclose(mix.get_grad("s"), reference.scalar_parameters.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mix.get_grad("gamma"), reference.gamma.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_layer_norm_of_the_mix_is_over_one_sequence_a_doc_in_spacy_a_row_in_torch():
    """One definition (`hf_elmo.modeling_elmo.scalar_mix`): each layer normalised with the mean and variance of all
    values of one sequence's real positions. spaCy's mix reads one array per Doc, so a Doc of two sentences is
    normalised as a whole: what `ElmoScalarMix` gives for the Doc as one row of a batch (padding beside it changes
    nothing), not for its sentences as two rows."""
    from hf_elmo import ElmoScalarMix

    [doc] = random_layers(1, lengths=(9,))  # (layers, 9 tokens, width): sentences of 4 and 5 tokens
    mix = make_mix(layer_norm=True)
    [spacy_output] = mix.predict([doc])
    reference = ElmoScalarMix(3, do_layer_norm=True, initial_scalar_parameters=[0.1, 0.3, 0.5])
    with torch.no_grad():
        reference.gamma.fill_(1.1)
        padded = torch.zeros(3, 2, 12, doc.shape[-1])  # the Doc as row 0 of a batch, beside another row
        padded[:, 0, :9] = torch.from_numpy(doc)
        padded[:, 1] = torch.randn(3, 12, doc.shape[-1])
        mask = torch.zeros(2, 12, dtype=torch.bool)
        mask[0, :9] = mask[1] = True
        as_one_row = reference(padded, mask)[0, :9].numpy()
        sentences = torch.zeros(3, 2, 5, doc.shape[-1])
        sentences[:, 0, :4], sentences[:, 1] = torch.from_numpy(doc[:, :4]), torch.from_numpy(doc[:, 4:])
        as_two_rows = reference(sentences, torch.tensor([[True] * 4 + [False], [True] * 5]))
    np.testing.assert_allclose(spacy_output, as_one_row, rtol=1e-5, atol=1e-5)
    per_sentence = np.concatenate([as_two_rows[0, :4].numpy(), as_two_rows[1].numpy()])
    assert np.abs(spacy_output - per_sentence).max() > 1e-3


@pytest.mark.parametrize("layer_norm, l2", [(False, 0.0), (True, 0.0), (False, 1.0), (True, 0.001)])
def test_scalar_mix_gradients_match_finite_differences(layer_norm, l2):
    """The gradient of sum(Y * dY) + l2 * ||s||^2 (the paper's regulariser)."""
    Xs = random_layers(1, lengths=(3, 2))
    mix = make_mix(layer_norm=layer_norm, l2=l2)
    rng = np.random.default_rng(2)
    dYs = [rng.normal(size=(len(X[0]), 5)).astype("float32") for X in Xs]

    def loss() -> float:
        task = sum((Y.astype("float64") * dY).sum() for Y, dY in zip(mix.predict(Xs), dYs))
        return float(task + l2 * (mix.get_param("s").astype("float64") ** 2).sum())

    def numeric_gradient(array: np.ndarray, index, eps: float = 1e-3) -> float:
        """Central difference of `loss` in `array[index]` (restored afterwards)."""
        array[index] += eps
        up = loss()
        array[index] -= 2 * eps
        down = loss()
        array[index] += eps
        return (up - down) / (2 * eps)

    _, backprop = mix.begin_update(Xs)
    dXs = backprop(dYs)
    for name in ("s", "gamma"):
        param, grad = mix.get_param(name), mix.get_grad(name)
        for i in range(len(param)):
            assert grad[i] == pytest.approx(numeric_gradient(param, i), rel=1e-2, abs=1e-3)
    for X, dX in zip(Xs, dXs):
        for index in [(0, 0, 0), (1, 1, 3), (2, 0, 4)]:
            if index[1] < X.shape[1]:
                assert dX[index] == pytest.approx(numeric_gradient(X, index), rel=1e-2, abs=1e-3)


def test_layer_dropout_drops_whole_layers_in_training_only():
    X = random_layers(lengths=(6,))
    mix = make_mix(s=(0, 0, 0), gamma=1.0, layer_dropout=0.5)
    np.testing.assert_allclose(mix.predict(X)[0], X[0].mean(axis=0), atol=1e-6)
    candidates = [X[0][list(kept)].mean(axis=0) for kept in ([0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2])]
    for _ in range(10):
        Y = mix.begin_update(X)[0][0]
        assert any(np.allclose(Y, candidate, atol=1e-6) for candidate in candidates)


def test_untrainable_mix_gets_no_gradient():
    mix = make_mix(trainable=False)
    _, backprop = mix.begin_update(random_layers())
    backprop([np.ones((n, 5), dtype="float32") for n in (4, 0, 7)])
    assert not mix.has_grad("s") and not mix.has_grad("gamma")


def test_the_mix_regulariser_pulls_the_layer_scores_towards_uniform():
    mix = make_mix(s=(2.0, -1.0, 0.5), l2=1.0)
    _, backprop = mix.begin_update(random_layers())
    backprop([np.zeros((n, 5), dtype="float32") for n in (4, 0, 7)])  # no task gradient: the penalty alone
    np.testing.assert_allclose(mix.get_grad("s"), [4.0, -2.0, 1.0], rtol=1e-6)
    assert scalar_mix_v1(3).attrs["l2"] == 0.0  # v1 keeps its meaning


def test_scalar_mix_rejects_layers_that_do_not_match():
    with pytest.raises(ValueError, match="l2"):
        scalar_mix_v2(3, l2=-1.0)
    with pytest.raises(ValueError, match="initial_scalars"):
        scalar_mix_v1(3, initial_scalars=[0.0, 1.0])
    with pytest.raises(ValueError, match="n_layers"):
        make_mix().predict([np.zeros((2, 4, 5), dtype="float32")])


def test_listener_reads_doc_layers_in_prediction_and_checks_them():
    vocab = spacy.blank("en").vocab
    listener = elmo_listener_v1(5, scalar_mix_v1(3), project_to=4)
    assert listener.get_dim("nO") == 4
    docs = [Doc(vocab, words=["a", "b"]), Doc(vocab, words=["c"])]
    listener.initialize(X=docs)
    assert [y.shape for y in listener.predict(docs)] == [(2, 4), (1, 4)]  # not annotated: zeros, valid shapes
    layers = random_layers(lengths=(2, 1))
    for doc, doc_layers in zip(docs, layers):
        doc._.elmo_layers = doc_layers
    node = next(n for n in listener.walk() if isinstance(n, ElmoListener))
    np.testing.assert_array_equal(node.predict(docs)[0], layers[0])
    docs[1]._.elmo_layers = np.zeros((3, 1, 7), dtype="float32")
    with pytest.raises(ValueError, match="width to 2 \\* projection_dim"):
        node.predict(docs)
    with pytest.raises(ValueError, match="found no `doc._.elmo_layers` in training"):
        node.begin_update([Doc(vocab, words=["x"])])


def test_listener_uses_the_batch_it_was_sent_and_scales_the_gradient():
    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words=["a", "b"])]
    node = ElmoListener("*", 5, 3, grad_factor=0.5)
    received = []
    outputs = random_layers(lengths=(2,))
    node.receive(ElmoListener.get_batch_id(docs), outputs, received.append)
    Y, backprop = node.begin_update(docs)
    assert Y is outputs
    backprop([np.ones((3, 2, 5), dtype="float32")])
    np.testing.assert_array_equal(received[0][0], np.full((3, 2, 5), 0.5, dtype="float32"))
    with pytest.raises(ValueError, match="other than the one"):
        node.begin_update([Doc(vocab, words=["other"])])


TINY_TOK2VEC = {"@architectures": "spacy.HashEmbedCNN.v2", "width": 8, "depth": 1, "embed_size": 100, "window_size": 1,
                "maxout_pieces": 2, "subword_features": False, "pretrained_vectors": None}


def test_textcat_reduce_pools_an_empty_text_by_max_first_and_last_where_spacys_raises():
    nlp = spacy.blank("en")
    docs = [nlp("a gorgeous , witty movie"), nlp(""), nlp("dull")]
    models = []
    for name in ("spacy.TextCatReduce.v1", "spacy-elmo.TextCatReduce.v1"):
        config = {"@architectures": name, "tok2vec": TINY_TOK2VEC, "exclusive_classes": True, "nO": 3,
                  "use_reduce_first": True, "use_reduce_last": True, "use_reduce_max": True, "use_reduce_mean": True}
        models.append(registry.resolve(Config({"model": config}))["model"])
        models[-1].initialize(X=docs[:1])
    spacy_model, ours = models
    output = spacy_model.get_ref("output_layer")  # zero-initialised: no gradient would reach the token vectors
    output.set_param("W", np.random.default_rng(0).normal(size=output.get_param("W").shape).astype("float32"))
    ours_nodes = [node for node in ours.walk(order="dfs_pre") if node.name != "at_least_one_row"]
    for spacy_node, ours_node in zip(spacy_model.walk(order="dfs_pre"), ours_nodes, strict=True):
        for name in spacy_node.param_names:
            ours_node.set_param(name, spacy_node.get_param(name))
    with pytest.raises(ValueError, match="lengths must be > 0"):
        spacy_model.predict(docs)
    scores, backprop = ours.begin_update(docs)
    np.testing.assert_allclose(scores[[0, 2]], spacy_model.predict([docs[0], docs[2]]), rtol=1e-6)
    bias = spacy_model.get_ref("output_layer").get_param("b")
    np.testing.assert_allclose(scores[1], np.exp(bias) / np.exp(bias).sum(), rtol=1e-6)  # a zero pooled vector
    assert [len(vectors) for vectors in ours.get_ref("tok2vec").predict(docs)] == [5, 0, 1]
    # The empty text's zero row sends no gradient into the token vectors: theirs are spaCy's on the other two texts.
    backprop(np.ones_like(scores))
    spacy_scores, spacy_backprop = spacy_model.begin_update([docs[0], docs[2]])
    spacy_backprop(np.ones_like(spacy_scores))
    tok2vec_grads = [[(name, node.get_grad(name)) for node in model.get_ref("tok2vec").walk(order="dfs_pre")
                      for name in node.grad_names] for model in (spacy_model, ours)]
    assert len(tok2vec_grads[0]) == len(tok2vec_grads[1]) and any(np.abs(g).max() > 0 for _, g in tok2vec_grads[0])
    for (name, expected), (_, grad) in zip(*tok2vec_grads):
        np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7, err_msg=name)


def textcat_model(name="spacy-elmo.TextCatReduce.v2", exclusive_classes=True, **settings):
    """A textcat model on a tiny hash-embedding tok2vec: 3 labels, max and mean pooling, `settings` on top."""
    config = {"@architectures": name, "tok2vec": TINY_TOK2VEC, "nO": 3, "exclusive_classes": exclusive_classes,
              "use_reduce_first": False, "use_reduce_last": False, "use_reduce_max": True, "use_reduce_mean": True,
              **settings}
    return registry.resolve(Config({"model": config}))["model"]


def test_textcat_reduce_v2_without_attention_or_maxout_is_v1():
    nlp = spacy.blank("en")
    docs = [nlp("a gorgeous , witty movie"), nlp(""), nlp("dull")]
    v1 = textcat_model("spacy-elmo.TextCatReduce.v1", use_reduce_first=True)
    ours = textcat_model(use_reduce_first=True, use_reduce_attention=False, maxout_width=None)
    for model in (v1, ours):
        model.initialize(X=docs[:1])
    output = v1.get_ref("output_layer")  # zero-initialised: set so that the scores depend on the pooling
    output.set_param("W", np.random.default_rng(0).normal(size=output.get_param("W").shape).astype("float32"))
    with_params = [[node for node in model.walk(order="dfs_pre") if node.param_names] for model in (v1, ours)]
    for v1_node, node in zip(*with_params, strict=True):
        assert v1_node.name == node.name
        for name in v1_node.param_names:
            node.set_param(name, v1_node.get_param(name))
    scores = ours.predict(docs)
    np.testing.assert_allclose(scores, v1.predict(docs), rtol=1e-6)
    assert len(set(map(tuple, scores.round(6)))) == 3


@pytest.mark.parametrize("exclusive_classes", [True, False])
def test_textcat_reduce_v2_pools_max_mean_and_attention_into_a_maxout_layer(exclusive_classes):
    nlp = spacy.blank("en")
    docs = [nlp("a gorgeous , witty movie"), nlp(""), nlp("dull")]
    model = textcat_model(exclusive_classes=exclusive_classes, use_reduce_attention=True, maxout_width=16)
    model.initialize(X=docs[:1])
    attention = next(node for node in model.walk() if node.name == "para-attn")
    attention.set_param("Q", np.zeros_like(attention.get_param("Q")))  # equal weights: attention pools the mean
    output = model.get_ref("output_layer")
    output.set_param("W", np.random.default_rng(0).normal(size=output.get_param("W").shape).astype("float32"))
    scores = model.predict(docs)
    vectors = model.get_ref("tok2vec").predict(docs)
    pooled = np.stack([np.concatenate([v.max(0), v.mean(0), v.mean(0)]) if len(v) else np.zeros(24, "float32")
                       for v in vectors])
    tail = model.layers[3:]  # maxout, layer norm, dropout, the output layer (and the logistic)
    assert [layer.name for layer in tail][:3] == ["maxout", "layernorm", "dropout"]
    expected = pooled
    for layer in tail:
        expected = layer.predict(expected)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-7)
    assert scores.shape == (3, 3) and np.isfinite(scores).all() and len(set(map(tuple, scores.round(6)))) == 3
    if exclusive_classes:
        np.testing.assert_allclose(scores.sum(1), 1, rtol=1e-5)
    # A label added after training starts with zero weights: never chosen (softmax: bias -5000), or 0.5 (logistic).
    new_scores = model.attrs["resize_output"](model, 4).predict(docs)
    np.testing.assert_allclose(new_scores[:, :3], scores, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(new_scores[:, 3], 0.0 if exclusive_classes else 0.5, atol=1e-6)


def test_span_getters_cut_long_spans_into_windows():
    nlp = spacy.blank("en")
    doc = nlp("one two three four five . six seven .")
    assert [len(s) for s in configure_sent_spans(4)([doc])[0]] == [4, 4, 1]
    doc[6].is_sent_start = True
    for token in doc[1:6]:
        token.is_sent_start = False
    assert [s.text for s in configure_sent_spans(4)([doc])[0]] == ["one two three four", "five .", "six seven ."]
    assert [len(s) for s in configure_doc_spans(5)([doc])[0]] == [5, 4]
    assert configure_doc_spans(5)([nlp("")]) == [[]]
    with pytest.raises(ValueError, match="max_length"):
        configure_sent_spans(0)


def test_sentence_spans_find_sentences_for_the_biLM_without_annotating_the_doc():
    nlp = spacy.blank("en")
    doc = nlp("One two three . Four five six seven eight ! Nine")
    get_spans = configure_sentence_spans(4)
    assert [s.text for s in get_spans([doc])[0]] == ["One two three .", "Four five six seven", "eight !", "Nine"]
    assert not doc.has_annotation("SENT_START")  # found for the biLM only
    doc[2].is_sent_start = True  # the Doc's own boundaries (a parser's, a senter's) come first
    for token in doc[1:]:
        if token.i != 2:
            token.is_sent_start = False
    assert [s.text for s in get_spans([doc])[0]] == ["One two", "three . Four five", "six seven eight !", "Nine"]
    assert [s.text for s in configure_sentence_spans(10, punct_chars=["!"])([nlp("a . b ! c")])[0]] == ["a . b !", "c"]
    assert get_spans([nlp("")]) == [[]]
    with pytest.raises(ValueError, match="max_length"):
        configure_sentence_spans(0)


def test_bilm_layer_reads_its_weights_at_initialize_or_on_first_use_and_backpropagates_into_the_biLM(elmo_dir):
    """The weights are read, and the dimensions set, in the layer's init; a layer used before reads them itself, once
    (its forward is the one guard: the component, a standalone biLM and a v1 node rely on it)."""
    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words="The bank raised rates .".split()), Doc(vocab, words=[]), Doc(vocab, words=["Hi"])]
    initialized = elmo_bilm_v2(configure_sent_spans(200), name=str(elmo_dir), max_batch_tokens=8)
    assert elmo_shim(initialized).elmo is None and initialized.has_dim("nO") is None
    initialized.initialize()
    assert (initialized.get_dim("nO"), initialized.get_dim("nL")) == (WIDTH, N_LAYERS)
    used = elmo_bilm_v2(configure_sent_spans(200), name=str(elmo_dir), max_batch_tokens=8)
    first = used.predict(docs)
    elmo = elmo_shim(used).elmo
    assert elmo is not None and (used.get_dim("nO"), used.get_dim("nL")) == (WIDTH, N_LAYERS)
    for a, b in zip(first, initialized.predict(docs), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    used.predict(docs)
    assert elmo_shim(used).elmo is elmo  # read once
    with pytest.raises(ValueError, match="its `name` is empty"):
        elmo_bilm_v2(configure_sent_spans(200), name="").predict(docs)
    bilm = initialized
    Ys, backprop = bilm.begin_update(docs)
    assert [Y.shape for Y in Ys] == [(N_LAYERS, 5, WIDTH), (N_LAYERS, 0, WIDTH), (N_LAYERS, 1, WIDTH)]
    elmo = elmo_shim(bilm).elmo
    assert all(p.grad is None for p in elmo.parameters())
    backprop([np.ones_like(Y) for Y in Ys])
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in elmo.bilstm.parameters())
    assert bilm.predict([]) == []
    assert [Y.shape for Y in bilm.predict([Doc(vocab, words=[" "])])] == [(N_LAYERS, 1, WIDTH)]  # no sentence at all


def test_threads_using_a_biLM_before_its_weights_are_read_read_them_once(elmo_dir, monkeypatch):
    import threading
    import time

    from spacy_elmo.layers import shim as bilm_module

    reads = []

    def slow_load(name):
        reads.append(name)
        time.sleep(0.2)  # both threads are inside the guard by now
        return load_pretrained(name)

    monkeypatch.setattr(bilm_module, "load_pretrained", slow_load)
    vocab = spacy.blank("en").vocab
    bilm = elmo_bilm_v2(configure_sent_spans(200), name=str(elmo_dir))
    outputs = [None, None]

    def predict(i: int) -> None:
        outputs[i] = bilm.predict([Doc(vocab, words="The bank raised rates .".split())])[0]

    threads = [threading.Thread(target=predict, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert reads == [str(elmo_dir)]
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_standalone_tok2vec_elmo_is_frozen_unless_asked(elmo_dir):
    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words="The bank raised rates .".split())]
    for freeze in (True, False):
        model = tok2vec_elmo_v1(
            elmo_bilm_v2(configure_sent_spans(200), name=str(elmo_dir)), scalar_mix_v1(3), WIDTH, freeze=freeze
        )
        model.initialize(X=docs)
        Ys, backprop = model.begin_update(docs)
        assert Ys[0].shape == (5, WIDTH)
        backprop([np.ones_like(Y) for Y in Ys])
        elmo = elmo_shim(model).elmo
        assert all(p.grad is None for p in elmo.parameters()) == freeze


def test_weight_loaders_give_the_same_biLM(elmo_dir):
    config = Config().from_str(f"""
        [allennlp]
        @misc = "spacy-elmo.AllenNLPWeights.v1"
        options_file = "{require(ALLENNLP / 'options.json')}"
        weight_file = "{require(ALLENNLP / 'lm_weights.hdf5')}"

        [pretrained]
        @misc = "spacy-elmo.PretrainedWeights.v1"
        name = "{elmo_dir}"

        [random]
        @misc = "spacy-elmo.RandomWeights.v1"
        preset = null
        config = {{"lstm_dim": 8, "projection_dim": 4, "filters": [[1, 4]], "char_embedding_dim": 2}}
        """)
    loaders = registry.resolve(config)
    allennlp, pretrained = loaders["allennlp"](), loaders["pretrained"]()
    for (name, a), (_, b) in zip(allennlp.state_dict().items(), pretrained.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaders["random"]().config.output_dim == 8
    torch.testing.assert_close(random_bilm("small", {"lstm_dim": 16, "projection_dim": 8}).state_dict(),
                               random_bilm("small", {"lstm_dim": 16, "projection_dim": 8}).state_dict())
    with pytest.raises(ValueError, match="paths.elmo_model"):
        load_pretrained(None)
    bilm = elmo_bilm_v2(configure_sent_spans(200))
    with pytest.raises(TypeError, match="ElmoModel"):
        elmo_shim(bilm).set_elmo("not a model")


def bcn_reference(encoder: BiattentiveEncoder, text: torch.Tensor) -> torch.Tensor:
    """The BCN encoder written out for one text (n_tokens, n_in), without padding or masks: (n_tokens, width)."""
    states = encoder.encoder(encoder.feedforward(text[:, None]))[0][:, 0]
    context = torch.softmax(states @ states.T, dim=-1) @ states
    return encoder.integrator(torch.cat([states, states - context, states * context], dim=-1)[:, None])[0][:, 0]


def test_biattentive_encoder_reads_each_text_alone_and_backpropagates_exactly():
    torch.manual_seed(0)
    layer = with_padded(biattentive_encoder(5, 8, 6, dropout=0.0))
    encoder = layer.layers[0].shims[0]._model
    rng = np.random.default_rng(0)
    texts = [rng.normal(size=(n, 5)).astype("float32") for n in (4, 0, 7, 1, 7)]
    outputs, backprop = layer.begin_update(texts)
    assert [output.shape for output in outputs] == [(n, 8) for n in (4, 0, 7, 1, 7)]
    d_outputs = [rng.normal(size=output.shape).astype("float32") for output in outputs]
    d_texts = backprop(d_outputs)
    for text, output, d_output, d_text in zip(texts, outputs, d_outputs, d_texts, strict=True):
        np.testing.assert_allclose(layer.predict([text])[0], output, rtol=1e-5, atol=1e-6)  # alone = in the batch
        if not len(text):
            assert d_text.shape == (0, 5)
            continue
        inputs = torch.tensor(text, requires_grad=True)
        expected = bcn_reference(encoder, inputs)
        np.testing.assert_allclose(output, expected.detach().numpy(), rtol=1e-5, atol=1e-6)
        (expected * torch.tensor(d_output)).sum().backward()
        np.testing.assert_allclose(d_text, inputs.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert len({tuple(output[0].round(5)) for output in outputs if len(output)}) == 4  # the texts differ


def test_biattentive_encoder_takes_empty_batches_and_texts():
    layer = with_padded(biattentive_encoder(5, 8, 6, dropout=0.25))
    for texts in ([], [np.zeros((0, 5), "float32")] * 2):
        outputs, backprop = layer.begin_update(texts)
        assert [output.shape for output in outputs] == [(0, 8)] * len(texts)
        assert [d.shape for d in backprop(outputs)] == [(0, 5)] * len(texts)
    with pytest.raises(ValueError, match="width must be even"):
        biattentive_encoder(5, 7, 6, dropout=0.0)


# -- the layers of the biLM layer ----------------------------------------------------------------------------------


def test_doc_sentences_leave_whitespace_tokens_out_and_sentence_batches_keep_the_budget():
    from spacy_elmo.layers.doc_sentences import doc_sentences
    from spacy_elmo.layers.sentence_batches import sentence_batches

    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words=["A", " ", "b", "c", "d"]), Doc(vocab, words=[]), Doc(vocab, words=["x", "y"])]
    rows, _ = doc_sentences(configure_doc_spans(2))(docs, is_train=False)
    assert rows.doc_lengths == [5, 0, 2]
    [sentences] = rows.batches
    assert [(s.doc, s.tokens.tolist(), s.words) for s in sentences] == [  # windows of 2 tokens, spaces left out
        (0, [0], ["A"]), (0, [2, 3], ["b", "c"]), (0, [4], ["d"]), (2, [0, 1], ["x", "y"])]
    batched, _ = sentence_batches(8)(rows, is_train=False)  # longest first, 8 padded positions at most
    assert [[s.words for s in batch] for batch in batched.batches] == [[["b", "c"], ["x", "y"]], [["A"], ["d"]]]
    with pytest.raises(ValueError, match="max_batch_tokens"):
        sentence_batches(0)


def test_elmo_torch_strip_boundaries_and_to_docs_are_the_model_on_each_row_and_backpropagate(elmo_dir):
    from hf_elmo import ElmoCharTokenizer, ElmoModel
    from spacy_elmo.layers.elmo_torch import elmo_torch
    from spacy_elmo.layers.strip_boundaries import strip_boundaries
    from spacy_elmo.layers.to_docs import to_docs
    from spacy_elmo.layers.types import Sentence, SentenceBatches

    torch_layer = elmo_torch(str(elmo_dir)).initialize()  # reads the weights from `name`
    sentences = [Sentence(0, np.array([0, 2]), ["The", "bank"]), Sentence(1, np.array([0]), ["Hi"])]
    model = ElmoModel.from_pretrained(elmo_dir).eval()
    encoded = ElmoCharTokenizer()([["The", "bank"], ["Hi"]], is_split_into_words=True, padding=True,
                                  return_tensors="pt")
    with torch.no_grad():
        expected = torch.stack(model(**encoded).hidden_states).numpy()
    np.testing.assert_allclose(torch_layer.predict(sentences), expected, atol=1e-5)
    layers, backprop = torch_layer(sentences, is_train=True)  # fine-tuning: the biLM's dropout is on
    assert layers.shape == (N_LAYERS, 2, 4, WIDTH)
    rows = SentenceBatches([3, 1], [sentences], [layers])
    stripped, strip_backprop = strip_boundaries()(rows, is_train=True)
    assert stripped.layers[0].shape == (N_LAYERS, 2, 2, WIDTH)
    docs_layer = to_docs()  # its widths from the arrays
    outputs, docs_backprop = docs_layer(stripped, is_train=True)
    assert [o.shape for o in outputs] == [(N_LAYERS, 3, WIDTH), (N_LAYERS, 1, WIDTH)]
    np.testing.assert_array_equal(outputs[0][:, [0, 2]], layers[:, 0, 1:3])
    assert not outputs[0][:, 1].any()  # a token the sentence left out (whitespace) keeps a zero row
    assert docs_layer(SentenceBatches([], []), is_train=False)[0] == []
    empty, _ = docs_layer(SentenceBatches([0, 1], [[Sentence(1, np.array([0]), ["Hi"])]], [layers[:, 1:, 1:2]]), False)
    assert [o.shape for o in empty] == [(N_LAYERS, 0, WIDTH), (N_LAYERS, 1, WIDTH)]
    np.testing.assert_array_equal(empty[1][:, 0], layers[:, 1, 1])
    d_outputs = [np.ones_like(o) for o in outputs]
    d_rows = strip_backprop(docs_backprop(d_outputs))
    [d_layers] = d_rows.layers
    assert d_layers[:, 0, 1:3].all() and not d_layers[:, 0, [0, 3]].any()  # the words, not the boundaries
    assert d_layers[:, 1, 1].all() and not d_layers[:, 1, [0, 2, 3]].any()
    backprop(d_layers)
    assert all(p.grad is not None for p in elmo_shim(torch_layer).elmo.bilstm.parameters())


def test_bilm_v1_is_the_v2_layers_behind_the_one_node_saved_pipelines_have(elmo_dir):
    from spacy_elmo.architectures import elmo_bilm_v1

    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words="The bank raised rates .".split()), Doc(vocab, words=[" ", "Hi"])]
    v1, v2 = (make(configure_sent_spans(200), name=str(elmo_dir)) for make in (elmo_bilm_v1, elmo_bilm_v2))
    assert len(list(v1.walk())) == 1 and len(v1.shims) == 1  # as saved by ElmoBiLM.v1
    assert [layer.name for layer in v2.layers] == [
        "elmo_doc_sentences", "elmo_sentence_batches", "elmo_each_batch", "elmo_strip_boundaries", "elmo_to_docs"]
    assert v2.layers[2].layers[0].name == "elmo_torch"
    v1.initialize()
    v2.initialize()
    for a, b in zip(v1.predict(docs), v2.predict(docs), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert (v1.get_dim("nO"), v1.get_dim("nL")) == (v2.get_dim("nO"), v2.get_dim("nL")) == (WIDTH, N_LAYERS)
    restored = elmo_bilm_v1(configure_sent_spans(200), name="").from_bytes(v1.to_bytes())
    np.testing.assert_allclose(restored.predict(docs)[0], v1.predict(docs)[0], atol=1e-6)


# -- torch modules inside Thinc ------------------------------------------------------------------------------------


def test_the_task_bilstm_is_thincs_pytorch_lstm_and_steps_its_weights_in_place():
    """`task_bilstm` computes what Thinc's `PyTorchLSTM` computes; an optimizer step writes into the parameters'
    own memory (on a GPU their one flat cuDNN block: Thinc's step replaced each tensor, and torch then warned and
    compacted the weights at every call)."""
    from thinc.api import Adam, PyTorchLSTM, with_padded

    from spacy_elmo.layers.pytorch import task_bilstm

    ours, thincs = with_padded(task_bilstm(6, 4)), PyTorchLSTM(6, 4, bi=True)  # Thinc's: with_padded already
    ours.layers[0].shims[0]._model.load_state_dict(thincs.layers[0].shims[0]._model.state_dict())
    rng = np.random.default_rng(0)
    Xs = [rng.normal(size=(n, 4)).astype("float32") for n in (3, 1, 5)]
    (Ys, backprop), (expected, _) = ours.begin_update(Xs), thincs.begin_update(Xs)
    for Y, reference in zip(Ys, expected, strict=True):
        np.testing.assert_allclose(Y, reference, atol=1e-6)
    lstm = ours.layers[0].shims[0]._model
    before = {name: (p.data_ptr(), p.detach().clone()) for name, p in lstm.named_parameters()}
    backprop([np.ones_like(Y) for Y in Ys])
    ours.finish_update(Adam(0.1))
    for name, parameter in lstm.named_parameters():
        assert parameter.data_ptr() == before[name][0], name  # the same memory
        assert not torch.equal(parameter.detach(), before[name][1]), name  # a step was taken
        assert not parameter.grad.any(), name


def test_torch_module_state_is_saved_without_pickle_and_pipelines_saved_with_thincs_shim_load():
    from thinc.api import PyTorchLSTM

    from spacy_elmo.layers.pytorch import TORCH_SAVE_MAGIC, task_bilstm

    saved = task_bilstm(6, 4)
    data = saved.to_bytes()
    assert TORCH_SAVE_MAGIC not in data and b"torch._utils" not in data
    loaded = task_bilstm(6, 4).from_bytes(data)
    for (name, a), b in zip(saved.shims[0]._model.state_dict().items(), loaded.shims[0]._model.state_dict().values()):
        assert torch.equal(a, b), name
    # A pipeline saved before: Thinc's shim wrote torch.save bytes, read back by torch's weights-only loader.
    old = PyTorchLSTM(6, 4, bi=True).layers[0]
    assert TORCH_SAVE_MAGIC in old.to_bytes()
    from_old = task_bilstm(6, 4).from_bytes(old.to_bytes())
    for (name, a), b in zip(old.shims[0]._model.state_dict().items(), from_old.shims[0]._model.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_bilm_shim_is_saved_as_every_torch_shim_with_its_config_and_reads_its_first_format(elmo_dir):
    """One serialisation (`TorchShim.to_bytes`): the biLM's `ElmoConfig` as the shim's config and its tensors as
    msgpack arrays; a shim without a biLM saves none; the format of the first pipelines (the arrays' dict inline,
    tests/data/pipeline-05bb94e) still loads."""
    import srsly

    from hf_elmo import ElmoModel
    from spacy_elmo.layers import ElmoShim

    elmo = ElmoModel.from_pretrained(elmo_dir).eval()
    shim = ElmoShim("unused")
    shim.set_elmo(elmo)
    msg = srsly.msgpack_loads(shim.to_bytes())
    assert msg["config"] == elmo.config.to_dict() and isinstance(msg["state"], bytes)
    first_format = srsly.msgpack_dumps({"config": msg["config"], "state": {
        name: tensor.numpy() for name, tensor in elmo.state_dict().items()}})
    for data in (shim.to_bytes(), first_format):
        loaded = ElmoShim().from_bytes(data).elmo
        assert not loaded.training and loaded.config.to_dict() == elmo.config.to_dict()
        for (name, a), b in zip(elmo.state_dict().items(), loaded.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
    assert srsly.msgpack_loads(ElmoShim().to_bytes()) == {"config": None, "state": None}
    assert ElmoShim().from_bytes(ElmoShim().to_bytes()).elmo is None
