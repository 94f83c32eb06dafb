"""The int8 mode (`model(..., quantize="int8")`): close to float32 on a real biLM, deterministic, thread-safe, its
weights quantized once and kept by the cache, float32 with one line where it cannot run, one-line errors where it
makes no sense, and the same mode from every entry point (the embedder, `elmo embed --int8`, spaCy's `int8`)."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from elmo_fixtures import ALLENNLP, sentences

from hf_elmo import ElmoCharTokenizer, ElmoEmbedder, ElmoInferenceCache, ElmoModel, kernel_plan, runtime, weight_forms
from hf_elmo.kernel_plan import INT8_AS_FLOAT32, INT8_ON_GPU, Precision
from hf_elmo.runtime import HostWarning

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(not runtime.int8_matmuls(), reason="this CPU has no int8 kernels (x86 with AVX2)")]


@pytest.fixture(scope="module")
def real_model(allennlp_model_dir) -> ElmoModel:
    """AllenNLP's test biLM: trained weights (random ones quantize differently)."""
    return ElmoModel.from_pretrained(allennlp_model_dir).eval()


def fixture_sentences() -> list[list[str]]:
    """AllenNLP's 30 test sentences, words split on whitespace."""
    return [line.split() for group in sentences(ALLENNLP / "sentences.json") for line in group]


@pytest.fixture(scope="module")
def batch():
    return ElmoCharTokenizer().batch(fixture_sentences()[:8])


def layers(model: ElmoModel, batch, **kwargs) -> list[torch.Tensor]:
    with torch.no_grad():
        return [layer[batch["attention_mask"].bool()] for layer in model(**batch, **kwargs).hidden_states]


def test_int8_is_close_to_float32_on_every_layer_and_deterministic(real_model, batch):
    """Per layer over the real positions: row cosine to float32 at least 0.99 and the largest difference under 5 %
    of the layer's largest value; not float32 itself; the same bytes from a second call (and from a fresh cache)."""
    exact = layers(real_model, batch)
    cache = ElmoInferenceCache()
    int8 = layers(real_model, batch, quantize="int8", inference_cache=cache)
    for a, b in zip(exact, int8, strict=True):
        assert not torch.equal(a, b)
        assert float(F.cosine_similarity(a, b).min()) > 0.99
        assert float((a - b).abs().max()) < 0.05 * float(a.abs().max())
    for again in (layers(real_model, batch, quantize="int8", inference_cache=cache),
                  layers(real_model, batch, quantize="int8", inference_cache=ElmoInferenceCache())):
        assert all(torch.equal(a, b) for a, b in zip(int8, again, strict=True))


def test_int8_weights_are_quantized_once_kept_by_the_cache_and_the_token_cache_keeps_modes_apart(
        real_model, batch, monkeypatch):
    made = []
    make = weight_forms.Int8Weight.__init__

    def counted(self, *args, **kwargs) -> None:
        made.append(1)
        make(self, *args, **kwargs)

    monkeypatch.setattr(weight_forms.Int8Weight, "__init__", counted)
    cache = ElmoInferenceCache()
    exact = layers(real_model, batch, inference_cache=cache)  # fills the token cache in float32
    layers(real_model, batch, quantize="int8", inference_cache=cache)
    first = len(made)
    # per layer: input (with its bias), recurrent and projection weights per direction; the highway and projection
    assert first == 2 * 3 * len(real_model.bilstm.layers) + len(real_model.char_cnn.weights().highway) + 1
    layers(real_model, batch, quantize="int8", inference_cache=cache)
    assert len(made) == first
    # float32 again from the same cache: exactly float32 (no int8 token representation served)
    assert all(torch.equal(a, b) for a, b in zip(exact, layers(real_model, batch, inference_cache=cache), strict=True))


def test_int8_is_thread_safe_with_a_shared_cache(real_model, batch):
    expected = layers(real_model, batch, quantize="int8", inference_cache=ElmoInferenceCache())
    cache, outputs, errors = ElmoInferenceCache(), [None] * 4, []

    def work(i: int) -> None:
        try:
            outputs[i] = layers(real_model, batch, quantize="int8", inference_cache=cache)
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for output in outputs:
        assert all(torch.equal(a, b) for a, b in zip(expected, output, strict=True))


def test_a_sentence_in_int8_depends_on_its_batch_within_the_quantization_error(real_model, batch):
    """Activations are quantized with one scale per matmul call: a sentence's vectors move a little with its batch
    (float32's do not, beyond rounding); as docs/performance.md says."""
    alone = ElmoCharTokenizer().batch(fixture_sentences()[:1])
    with torch.no_grad():
        together = real_model(**batch, quantize="int8", inference_cache=ElmoInferenceCache()).hidden_states
        single = real_model(**alone, quantize="int8", inference_cache=ElmoInferenceCache()).hidden_states
        exact = real_model(**alone).hidden_states
    positions = alone["input_ids"].shape[1]
    for joint, one, reference in zip(together, single, exact, strict=True):
        drift = float((joint[0, :positions] - one[0]).abs().max())
        error = float((one[0] - reference[0]).abs().max())
        assert drift <= 2 * error + 1e-6


def test_where_int8_cannot_run_it_is_float32_with_one_line(real_model, batch, pretend_cpu):
    pretend_cpu("avx")  # before AVX2: no int8 kernels
    assert not runtime.int8_matmuls()
    with pytest.warns(HostWarning) as caught:
        got = layers(real_model, batch, quantize="int8", inference_cache=ElmoInferenceCache())
    assert [str(w.message) for w in caught] == [INT8_AS_FLOAT32]
    assert all(torch.equal(a, b) for a, b in zip(layers(real_model, batch), got, strict=True))
    with pytest.warns(HostWarning, match="int8 was asked for"):
        assert Precision.of("cpu", quantize="int8").quantize is None
    with pytest.warns(HostWarning) as caught:
        assert Precision.of("cuda", quantize="int8").quantize is None
        assert not kernel_plan.int8_runs(torch.device("cuda"))
    assert [str(w.message) for w in caught] == [INT8_ON_GPU] * 2


def test_a_torch_without_quantized_tensor_creation_runs_int8_as_float32_with_one_line(real_model, batch, monkeypatch):
    """torch 2.13 deprecates `torch.quantize_per_channel` (what `Int8Weight` packs FBGEMM's weights from); the day a
    torch removes it, `runtime.int8_matmuls` says so and the int8 mode runs float32 (exact) with one line, never a
    traceback from inside a forward."""
    from host_cpus import forget_capabilities

    monkeypatch.delattr(torch, "quantize_per_channel")
    forget_capabilities()
    try:
        assert not runtime.int8_matmuls()
        made = []
        monkeypatch.setattr(weight_forms.Int8Weight, "__init__", lambda *args, **kwargs: made.append(args))
        with pytest.warns(HostWarning) as caught:
            got = layers(real_model, batch, quantize="int8", inference_cache=ElmoInferenceCache())
        assert [str(w.message) for w in caught] == [INT8_AS_FLOAT32] and made == []
        assert all(torch.equal(a, b) for a, b in zip(layers(real_model, batch), got, strict=True))
    finally:
        monkeypatch.undo()
        forget_capabilities()
    assert runtime.int8_matmuls() is ("avx2" in runtime.cpu_flags())


def test_int8_capability_is_asked_of_the_cpu(pretend_cpu):
    for cpu, expected in (("avx", False), ("amx", True), ("avx2", True)):
        pretend_cpu(cpu)
        assert runtime.int8_matmuls() is expected, cpu
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where it runs
        assert Precision.of("cpu", quantize="int8").quantize == "int8" and Precision.of("cpu").quantize is None


def test_int8_where_it_makes_no_sense_is_one_line(real_model, batch):
    cache = ElmoInferenceCache()
    with pytest.raises(ValueError, match=r"is for inference: call the biLM under torch.no_grad\(\)"):
        real_model(**batch, quantize="int8", inference_cache=cache)  # gradient would flow to the weights
    with torch.no_grad():
        with pytest.raises(ValueError, match='quantize must be None or "int8", got \'int4\''):
            real_model(**batch, quantize="int4")
        # Without a cache the weights would be quantized at every call: slower than float32 (6x for one sentence).
        with pytest.raises(ValueError, match=r"keeps them in an inference cache: pass one, .*inference_cache=Elmo"):
            real_model(**batch, quantize="int8")
        with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="choose one"):
            real_model(**batch, quantize="int8", inference_cache=cache)
        real_model.config.implementation = "reference"
        try:
            with pytest.raises(ValueError, match='implementation="kernels"'):
                real_model(**batch, quantize="int8", inference_cache=cache)
        finally:
            real_model.config.implementation = "kernels"


def test_the_embedder_and_elmo_embed_run_int8(allennlp_model_dir, tmp_path):
    from typer.testing import CliRunner

    from elmo_cli.app import app
    from hf_elmo.embed import EmbedSettingError

    words = "The bank raised its rates on Thursday .".split()
    exact = ElmoEmbedder(str(allennlp_model_dir)).embed_sentence(words)
    embedder = ElmoEmbedder(str(allennlp_model_dir), quantize="int8")
    assert embedder.quantize == "int8"
    int8 = embedder.embed_sentence(words)
    assert int8.dtype == np.float32 and 0 < np.abs(int8 - exact).max() < 0.05 * np.abs(exact).max()
    assert embedder.with_settings(quantize=None).quantize is None
    with pytest.raises(EmbedSettingError, match="quantize: bf16 and int8 .* choose one"):
        ElmoEmbedder(str(allennlp_model_dir), quantize="int8", bf16=True)
    with pytest.raises(EmbedSettingError, match='quantize: must be None or "int8", got \'int4\''):
        ElmoEmbedder(str(allennlp_model_dir), quantize="int4")
    source = tmp_path / "input.txt"
    source.write_text(" ".join(words) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["embed", str(allennlp_model_dir), str(source), str(tmp_path / "out.npy"), "-q",
                                      "--int8"])
    assert result.exit_code == 0, result.output
    # the .npy output: (words, layers, width) rows of every sentence one after the other
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy", allow_pickle=False), int8.transpose(1, 0, 2))
    both = CliRunner().invoke(app, ["embed", str(allennlp_model_dir), str(source), str(tmp_path / "x.npy"), "--int8",
                                    "--bf16"])
    assert both.exit_code == 2 and "--int8" in both.stderr


def test_spacy_int8_setting(elmo_dir):
    import spacy

    text = "The bank raised its rates on Thursday ."
    exact, int8 = spacy.blank("en"), spacy.blank("en")
    exact.add_pipe("elmo", config={"model": {"name": str(elmo_dir)}})
    int8.add_pipe("elmo", config={"model": {"name": str(elmo_dir), "int8": True}})
    a, b = exact(text)._.elmo_layers, int8(text)._.elmo_layers
    assert 0 < np.abs(a - b).max() < 0.05 * np.abs(a).max()
    reloaded = spacy.blank("en")
    reloaded.add_pipe("elmo", config={"model": {"name": "", "int8": True}})
    reloaded.from_bytes(int8.to_bytes())
    np.testing.assert_array_equal(reloaded(text)._.elmo_layers, b)
    with pytest.raises(ValueError, match="mixed_precision and int8"):
        spacy.blank("en").add_pipe("elmo", config={"model": {"int8": True, "mixed_precision": True}})
