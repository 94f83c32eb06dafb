"""The biLM as a stream (`hf_elmo.stream.ElmoStream`, `hf_elmo.embed.streaming.EmbedderStream`): rows that join
between advances of any number of steps, beside rows of any length at any step, get the model's layers for them
alone (float32: within rounding; int8 and bf16: within their modes' error), and sentences the embedder's vectors,
windows and layer choices included."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from elmo_fixtures import ALLENNLP, sentences, tiny_config

from hf_elmo import ElmoCharTokenizer, ElmoEmbedder, ElmoInferenceCache, ElmoModel, runtime
from hf_elmo.embed.streaming import EmbedderStream
from hf_elmo.kernel_plan import BF16_EMULATED
from hf_elmo.runtime import HostWarning
from hf_elmo.stream import ElmoStream

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def real_model(allennlp_model_dir) -> ElmoModel:
    """AllenNLP's test biLM: trained weights that clip the cell and the projection."""
    return ElmoModel.from_pretrained(allennlp_model_dir).eval()


def fixture_sentences() -> list[list[str]]:
    """AllenNLP's 30 test sentences (1 to 30 words), and an empty one."""
    return [line.split() for group in sentences(ALLENNLP / "sentences.json") for line in group] + [[]]


def streamed(stream: ElmoStream, rows: list[list[str]], seed: int) -> dict[int, tuple[torch.Tensor, ...]]:
    """Each row's layers through `stream`: 0-3 rows join before each advance of 1-9 steps (seeded)."""
    chance, tokenizer, layers, next_row = random.Random(seed), ElmoCharTokenizer(), {}, 0
    while next_row < len(rows) or len(stream):
        joining = rows[next_row : next_row + chance.randint(0, 3)]
        if joining:
            stream.add(tokenizer.batch(joining), list(range(next_row, next_row + len(joining))))
            next_row += len(joining)
        layers.update(stream.advance(chance.randint(1, 9)))
    return layers


def alone(model: ElmoModel, words: list[str], **kwargs) -> tuple[torch.Tensor, ...]:
    return tuple(layer[0] for layer in model(**ElmoCharTokenizer().batch([words]), **kwargs).hidden_states)


@torch.inference_mode()
@pytest.mark.parametrize("seed", [0, 1])
def test_rows_joining_between_advances_get_the_models_layers_for_them_alone(real_model, seed):
    rows = fixture_sentences()
    stream = ElmoStream(real_model, ElmoInferenceCache())
    layers = streamed(stream, rows, seed)
    assert sorted(layers) == list(range(len(rows))) and len(stream) == 0
    for index, words in enumerate(rows):
        reference = alone(real_model, words)
        assert [layer.shape for layer in layers[index]] == [layer.shape for layer in reference]
        for got, expected in zip(layers[index], reference, strict=True):
            torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)


@torch.inference_mode()
@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_the_int8_and_bf16_modes_stream_within_their_error(real_model, mode):
    """As test_int8.py bounds a batch of them: per layer, row cosine to float32 above 0.99 and the largest difference
    under 5 % of the layer's largest value (bf16 under CPU autocast: native where the CPU has it, emulated elsewhere,
    the same bound either way)."""
    if mode == "int8" and not runtime.int8_matmuls():
        pytest.skip("this CPU has no int8 kernels (x86 with AVX2)")
    rows = fixture_sentences()[:12]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "bf16")
    with autocast, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = ElmoStream(real_model, ElmoInferenceCache(), "int8" if mode == "int8" else None)
        layers = streamed(stream, rows, 0)
    emulated = mode == "bf16" and not runtime.native_bf16_cpu()  # where the kernels warn
    assert {(w.category, str(w.message)) for w in caught} == ({(HostWarning, BF16_EMULATED)} if emulated else set())
    for index, words in enumerate(rows):
        for got, exact in zip(layers[index], alone(real_model, words), strict=True):
            got = got.float()
            assert float(F.cosine_similarity(got, exact).min()) > 0.99
            assert float((got - exact).abs().max()) < 0.05 * float(exact.abs().max())


@pytest.mark.parametrize("onednn", [True, False])
def test_a_streams_advances_read_the_lstm_input_weights_packed_and_a_whole_forward_does_not(onednn):
    """`KernelPlan.few_steps`: an advance reads each LSTM input weight once for a few rows, where oneDNN would reorder
    an unpacked weight at every call; a whole forward reads it once a window, unpacked. Same layers either way. With
    oneDNN off (a torch without it, or the kernel option), the advances read the weights as they are."""
    if onednn and not runtime.onednn_available():
        pytest.skip("this torch build has no oneDNN")
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(kernel_options={"onednn": onednn})).eval()
    rows = fixture_sentences()[:6]
    forward_cache, stream_cache = ElmoInferenceCache(), ElmoInferenceCache()
    with torch.inference_mode():
        model(**ElmoCharTokenizer().batch(rows), inference_cache=forward_cache)
        layers = streamed(ElmoStream(model, stream_cache), rows, 0)
        references = [alone(model, words) for words in rows]
    inputs = {id(layer.input_weight) for layer in model.bilstm.layers}
    assert not inputs & {key for key, _ in forward_cache._forms}
    assert (inputs <= {key for key, _ in stream_cache._forms}) if onednn else not inputs & {
        key for key, _ in stream_cache._forms}
    for index, reference in enumerate(references):
        for got, expected in zip(layers[index], reference, strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("layers", ["all", "top", "average", "mix"])
def test_sentences_get_the_embedders_vectors_windows_included(allennlp_model_dir, layers):
    """Sentences of 0-30 words, with windows of 7 words (a long sentence joins as several rows and leaves with its
    last): the word vectors and the mean vector of `embed_sentences` with the same settings."""
    mix = {"scalar_parameters": [0.5, -1.0, 2.0], "gamma": 1.5} if layers == "mix" else {}
    embedder = ElmoEmbedder(allennlp_model_dir, layers=layers, max_sentence_words=7, pool="mean", **mix)
    texts = fixture_sentences()
    expected_words = list(embedder.with_settings(pool=None).embed_sentences(texts))
    expected = list(embedder.embed_sentences(texts))
    stream, chance, results, joined = EmbedderStream(embedder), random.Random(2), {}, 0
    while joined < len(texts) or len(stream):
        count = chance.randint(0, 3)
        stream.add(texts[joined : joined + count], [f"s{i}" for i in range(joined, joined + count)])
        joined += min(count, len(texts) - joined)
        results.update(stream.advance())
    assert sorted(results) == sorted(f"s{i}" for i in range(len(texts)))
    for index in range(len(texts)):
        words, vector = results[f"s{index}"]
        assert words.dtype == np.float32 and words.shape == expected_words[index].shape
        np.testing.assert_allclose(words, expected_words[index], atol=2e-5, rtol=0)
        np.testing.assert_allclose(vector, expected[index], atol=2e-5, rtol=0)


def test_after_a_failed_advance_drop_empties_the_stream_and_the_next_sentences_run(allennlp_model_dir):
    embedder = ElmoEmbedder(allennlp_model_dir, layers="average", pool="mean")
    stream = EmbedderStream(embedder)
    stream.add([["a", "b"], ["c"]], ["x", "y"])
    assert len(stream) == 2 and stream.positions == 7
    assert sorted(stream.drop()) == ["x", "y"] and len(stream) == 0 and stream.positions == 0
    stream.add([["The", "bank"]], ["z"])
    (key, (words, vector)), = stream.advance()
    assert key == "z"
    np.testing.assert_allclose(vector, embedder.embed_sentence(["The", "bank"]), atol=2e-5, rtol=0)
