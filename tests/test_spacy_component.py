"""The `elmo` component: per-Doc layers, vectors and hooks, batching, odd inputs, serialization, multiprocessing."""

from __future__ import annotations

import pickle
import shutil
import warnings

import numpy as np
import pytest
import spacy
import torch
from spacy.tokens import Doc, DocBin
from spacy_fixtures import N_LAYERS, WIDTH, elmo_pipeline, run_python

from hf_elmo import ElmoCharTokenizer, ElmoModel, remove_sentence_boundaries
from spacy_elmo import restore_hooks
from spacy_elmo.layers import elmo_shim

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXT = "The bank raised rates. We sat on the river bank."


@pytest.fixture(scope="module")
def nlp(elmo_dir):
    return elmo_pipeline(elmo_dir)


def reference_layers(elmo_dir, words: list[str]) -> np.ndarray:
    """The biLM run directly on one sentence: (layers, words, width), boundaries removed."""
    model = ElmoModel.from_pretrained(elmo_dir).eval()
    batch = ElmoCharTokenizer.from_pretrained(elmo_dir)([words], is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).hidden_states
    return np.stack([remove_sentence_boundaries(h, batch["attention_mask"])[0][0].numpy() for h in hidden])


def test_doc_layers_are_the_bilm_layers_without_boundaries(nlp, elmo_dir):
    words = "The bank raised rates .".split()
    doc = nlp(Doc(nlp.vocab, words=words))
    assert isinstance(doc._.elmo_layers, np.ndarray) and doc._.elmo_layers.dtype == np.float32
    assert doc._.elmo_layers.shape == (N_LAYERS, len(words), WIDTH)
    np.testing.assert_allclose(doc._.elmo_layers, reference_layers(elmo_dir, words), atol=1e-6)


def test_add_pipe_with_an_empty_model_name_says_which_config_key_to_set():
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": {"name": ""}})
    with pytest.raises(ValueError, match=r'"model": \{"name"'):
        nlp("No weights yet.")
    with pytest.raises(ValueError, match=r"initialize\.components\.elmo\.weights"):
        nlp.initialize()


def test_works_straight_after_add_pipe_and_after_initialize(elmo_dir):
    nlp = elmo_pipeline(elmo_dir)
    before = nlp(TEXT)._.elmo_layers
    nlp.initialize()
    np.testing.assert_array_equal(nlp(TEXT)._.elmo_layers, before)


def test_whitespace_tokens_get_zero_rows_and_leave_the_context_alone(nlp):
    spaced = nlp("The  bank\n\nraised rates .")
    plain = nlp("The bank raised rates .")
    spaces = [token.i for token in spaced if token.is_space]
    assert spaces == [1, 3]
    assert not spaced._.elmo_layers[:, spaces].any()
    words = [token.i for token in spaced if not token.is_space]
    np.testing.assert_allclose(spaced._.elmo_layers[:, words], plain._.elmo_layers, atol=1e-6)
    assert not spaced[1].has_vector and spaced[0].has_vector


@pytest.mark.parametrize("text", ["", " ", "\n\n\t  "])
def test_empty_and_whitespace_only_docs(nlp, text):
    doc = nlp(text)
    assert doc._.elmo_layers.shape == (N_LAYERS, len(doc), WIDTH)
    assert not doc._.elmo_layers.any()
    assert doc.vector.shape == (WIDTH,) and not doc.vector.any() and not doc.has_vector


def test_odd_unicode_and_huge_tokens(nlp):
    # (spaCy itself cannot hold lone surrogates, so they never reach the component.)
    words = ["😀👍🏽", "日本語", "e\u0301", "\x00", "<S>", "</S>", "x" * 10_000, "naïve", "\u200b", "\u202e"]
    doc = nlp(Doc(nlp.vocab, words=words))
    assert doc._.elmo_layers.shape == (N_LAYERS, len(words), WIDTH)
    assert np.isfinite(doc._.elmo_layers).all()
    assert all(token.has_vector for token in doc)
    text = nlp("Ünïcödé 😀 mixed\u00a0with 日本語 and \x00 controls\r\n.")
    assert text._.elmo_layers.shape == (N_LAYERS, len(text), WIDTH)


def test_a_sentence_does_not_depend_on_its_batch(nlp):
    alone = nlp(TEXT)._.elmo_layers
    others = ["Short.", " ".join(["word"] * 150), "", TEXT + " " + TEXT, "Another one here ."]
    docs = list(nlp.pipe([*others[:2], TEXT, *others[2:]], batch_size=6))
    np.testing.assert_allclose(docs[2]._.elmo_layers, alone, atol=1e-5)


def test_sentences_are_separate_biLM_rows_when_set(elmo_dir):
    nlp = elmo_pipeline(elmo_dir, sentencizer=True)
    doc = nlp(TEXT)
    first, second = list(doc.sents)
    for sent in (first, second):
        np.testing.assert_allclose(
            doc._.elmo_layers[:, sent.start : sent.end], reference_layers(elmo_dir, [t.text for t in sent]),
            atol=1e-5,
        )


def test_long_document_runs_in_token_bounded_batches(elmo_dir, monkeypatch):
    nlp = elmo_pipeline(elmo_dir, model={"max_batch_tokens": 20_000, "get_spans": {"max_length": 200}})
    shapes = []
    forward = ElmoModel.forward

    def recording_forward(self, input_ids, *args, **kwargs):
        shapes.append(tuple(input_ids.shape[:2]))
        return forward(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(ElmoModel, "forward", recording_forward)
    words = ("the cat sat on a mat and then it ran off to see the king of the hill ;".split() * 5_300)[:100_000]
    doc = nlp(Doc(nlp.vocab, words=words))
    assert doc._.elmo_layers.shape == (N_LAYERS, 100_000, WIDTH)
    assert sum(rows for rows, _ in shapes) == 500
    assert all(rows * positions <= 20_000 and positions <= 202 for rows, positions in shapes)
    assert np.abs(doc._.elmo_layers).sum(axis=(0, 2)).min() > 0  # every token got a vector


def test_default_mix_vectors_and_similarity_hooks(elmo_dir):
    doc = elmo_pipeline(elmo_dir)(TEXT)
    layers = doc._.elmo_layers
    np.testing.assert_allclose(doc[1]._.elmo_vector, layers[:, 1].mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(doc[1].vector, doc[1]._.elmo_vector)
    np.testing.assert_allclose(doc[0:3].vector, layers[:, 0:3].mean(axis=(0, 1)), atol=1e-6)
    np.testing.assert_allclose(doc.vector, layers.mean(axis=(0, 1)), atol=1e-6)
    a, b = doc[1].vector, doc[10].vector
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no W007/W008 "no vectors" warnings
        assert doc[1].similarity(doc[10]) == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), abs=1e-6)
        assert doc[0:4].similarity(doc[4:]) < 1.0 and doc.similarity(doc) == pytest.approx(1.0, abs=1e-6)
    assert doc[1].vector_norm == pytest.approx(float(np.linalg.norm(a)), rel=1e-6)

    top = elmo_pipeline(elmo_dir, default_mix=[0.0, 0.0, 1.0])(TEXT)
    np.testing.assert_allclose(top[1]._.elmo_vector, layers[2, 1], atol=1e-6)
    assert top.tensor.size == 0  # doc.tensor only on request
    tensor = elmo_pipeline(elmo_dir, set_doc_tensor=True)(TEXT).tensor
    np.testing.assert_allclose(tensor, layers.mean(axis=0), atol=1e-6)


def test_float16_storage_halves_the_memory(elmo_dir):
    doc = elmo_pipeline(elmo_dir, store_dtype="float16")(TEXT)
    assert doc._.elmo_layers.dtype == np.float16
    assert doc[1].vector.dtype == np.float32
    with pytest.raises(ValueError, match="store_dtype"):
        elmo_pipeline(elmo_dir, store_dtype="int8")


@pytest.mark.parametrize("cpu", ["avx2", "avx512", "amx"])
def test_mixed_precision_on_a_cpu_predicts_in_bf16_where_native_else_float32_with_one_warning(
    elmo_dir, pretend_cpu, cpu
):
    """Thinc autocasts only on CUDA; on a CPU with native bf16 `mixed_precision` runs predictions in the biLM's bf16
    mode (LSTM weights packed in bf16 in the component's cache, the char CNN's filters and biases cast there once).
    Without native bf16, where it would be several times slower, predictions are float32 (exact), and one warning
    says so when the biLM is set (decided once: not again at each call)."""
    from hf_elmo.kernel_plan import BF16_AS_FLOAT32
    from hf_elmo.runtime import HostWarning, onednn_available

    pretend_cpu(cpu)
    native = cpu == "amx"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bf16_nlp = elmo_pipeline(elmo_dir, model={"mixed_precision": True})
        bf16 = bf16_nlp(TEXT)._.elmo_layers
        bf16_nlp(TEXT)
    assert [(w.category, str(w.message)) for w in caught] == (
        [] if native else [(HostWarning, BF16_AS_FLOAT32)])  # nor Thinc's CUDA autocast request
    exact = elmo_pipeline(elmo_dir)(TEXT)._.elmo_layers
    assert bf16.dtype == np.float32 and bf16.shape == exact.shape
    cache = elmo_shim(bf16_nlp.get_pipe("elmo").model).inference_cache
    if not native:
        np.testing.assert_array_equal(bf16, exact)
        assert {form for _, form in cache._forms} <= {torch.float32}
        return
    assert not np.array_equal(bf16, exact)
    assert np.abs(bf16 - exact).max() <= 0.02 * np.abs(exact).max()
    flat_bf16, flat_exact = bf16.reshape(-1, bf16.shape[-1]), exact.reshape(-1, exact.shape[-1])
    cosine = (flat_bf16 * flat_exact).sum(1) / np.linalg.norm(flat_bf16, axis=1) / np.linalg.norm(flat_exact, axis=1)
    assert cosine.min() > 0.999
    forms = {torch.bfloat16, ("cast", torch.bfloat16, False)}
    assert {form for _, form in cache._forms} == (forms if onednn_available() else set())


def test_docbin_round_trip_keeps_layers_and_restore_hooks_brings_vectors_back(nlp):
    doc = nlp(TEXT)
    docbin = DocBin(store_user_data=True, docs=[doc])
    [loaded] = DocBin().from_bytes(docbin.to_bytes()).get_docs(nlp.vocab)
    np.testing.assert_array_equal(loaded._.elmo_layers, doc._.elmo_layers)
    np.testing.assert_array_equal(loaded[3]._.elmo_vector, doc[3].vector)
    assert "vector" not in loaded.user_token_hooks  # spaCy drops hooks
    restore_hooks(loaded)
    np.testing.assert_array_equal(loaded[3].vector, doc[3].vector)
    assert loaded.similarity(doc) == pytest.approx(1.0, abs=1e-6)
    with pytest.warns(UserWarning, match="W109"):  # spaCy: hooks are not serialized
        copy = Doc(nlp.vocab).from_bytes(doc.to_bytes())
    np.testing.assert_array_equal(copy._.elmo_layers, doc._.elmo_layers)


# A copy of the biLM at other memory addresses may round differently (~1e-7: CPU matmul kernels depend on
# alignment), so copies are compared to 1e-6; the weights themselves are compared bit for bit.
def test_pipeline_saves_the_biLM_and_loads_without_its_source(elmo_dir, tmp_path):
    source = shutil.copytree(elmo_dir, tmp_path / "source")
    nlp = elmo_pipeline(source)
    expected = nlp(TEXT)._.elmo_layers
    nlp.to_disk(tmp_path / "pipeline")
    shutil.rmtree(source)
    loaded = spacy.load(tmp_path / "pipeline")
    np.testing.assert_allclose(loaded(TEXT)._.elmo_layers, expected, atol=1e-6)
    pretrained = ElmoModel.from_pretrained(elmo_dir).state_dict()
    for name, tensor in elmo_shim(loaded.get_pipe("elmo").model).elmo.state_dict().items():
        assert torch.equal(tensor, pretrained[name]), name
    from_bytes = spacy.blank("en")
    from_bytes.add_pipe("elmo", config={"model": {"name": str(tmp_path / "gone")}})
    from_bytes.from_bytes(nlp.to_bytes())
    np.testing.assert_allclose(from_bytes(TEXT)._.elmo_layers, expected, atol=1e-6)
    # Settings of the biLM layer come from the (edited) config, not from the saved model.
    edited = spacy.load(tmp_path / "pipeline", config={"components": {"elmo": {"model": {"max_batch_tokens": 7}}}})
    batches = next(node for node in edited.get_pipe("elmo").model.walk() if node.name == "elmo_sentence_batches")
    assert batches.attrs["max_batch_tokens"].value == 7


def test_pipeline_pickles(nlp):
    expected = nlp(TEXT)._.elmo_layers
    np.testing.assert_allclose(pickle.loads(pickle.dumps(nlp))(TEXT)._.elmo_layers, expected, atol=1e-6)


MULTIPROCESSING_SCRIPT = """
import multiprocessing, sys, warnings
import numpy as np, spacy, torch

def main(method, model_dir):
    multiprocessing.set_start_method(method, force=True)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": {"name": model_dir}})
    torch.set_num_threads(2)
    texts = ["The bank raised rates .", "", "  ", "A " * 300, "Odd 😀 \\u00e9 日本語 ."] * 3
    single = list(nlp.pipe(texts))  # the parent uses torch threads first (the fork hang trigger)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # W109 in the workers: spaCy sends no hooks back (the pipeline restores them)
        multi = list(nlp.pipe(texts, n_process=2, batch_size=2))
        tuples = list(nlp.pipe([(text, i) for i, text in enumerate(texts)], n_process=2, as_tuples=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # spaCy's W007/W008 (no vector) would fail here
        for one, other, (doc, context), i in zip(single, multi, tuples, range(len(texts)), strict=True):
            np.testing.assert_allclose(other._.elmo_layers, one._.elmo_layers, atol=1e-5)
            assert context == i and other.has_vector == doc.has_vector == one.has_vector
            for got in (other, doc):
                np.testing.assert_allclose(got.vector, one.vector, atol=1e-5)
                assert got.vector.shape == one.vector.shape == (one._.elmo_layers.shape[-1],)
                np.testing.assert_allclose([t.vector for t in got], [t.vector for t in one], atol=1e-5)
                if len(one) > 2:
                    assert abs(got[0].similarity(got[2]) - one[0].similarity(one[2])) < 1e-5
                    assert abs(got[:2].similarity(got) - one[:2].similarity(one)) < 1e-5
                    assert 0 < abs(got[0].similarity(got[2])) < 1
    print("ok", method)

if __name__ == "__main__":
    main(*sys.argv[1:])
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pipe_with_two_processes_never_hangs(elmo_dir, tmp_path, method):
    script = tmp_path / "multiprocessing_pipe.py"
    script.write_text(MULTIPROCESSING_SCRIPT)
    assert f"ok {method}" in run_python(script, method, elmo_dir, timeout=240)


def test_threads_sharing_one_pipeline_get_the_single_thread_vectors(elmo_dir):
    """The biLM's dropout (0.1 in the fixture) must never be on at prediction: a shared module switched back to
    training mode by one thread would turn it on inside another thread's forward."""
    from concurrent.futures import ThreadPoolExecutor

    nlp = elmo_pipeline(elmo_dir)
    texts = [f"Sentence {i} has the bank of the river {i % 7} and {'more words ' * (i % 5)}." for i in range(40)]
    expected = [nlp(text)._.elmo_layers for text in texts]
    elmo = elmo_shim(nlp.get_pipe("elmo").model).elmo
    assert elmo is not None and elmo.config.dropout > 0
    modes = []  # whether the biLM's dropout was on, at each of its calls
    hook = elmo.bilstm.dropout.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda text: nlp(text)._.elmo_layers, texts * 5))
    hook.remove()
    assert modes and not any(modes)
    assert not elmo.training
    for layers, reference in zip(got, expected * 5):
        np.testing.assert_array_equal(layers, reference)


def test_a_pipeline_saved_before_the_redesign_loads_and_gives_the_same_outputs():
    """tests/data/pipeline-05bb94e: elmo (a tiny random biLM) with an NER and a textcat listening through
    ScalarMix.v1 and .v2, trained 5 steps and saved by commit 05bb94e, before the scalar mix, the spaCy biLM layer and
    the model's kernels were rewritten; its outputs then are in the .expected.json beside it."""
    import json
    from pathlib import Path

    data = Path(__file__).parent / "data"
    nlp = spacy.load(data / "pipeline-05bb94e")
    expected = json.loads((data / "pipeline-05bb94e.expected.json").read_text())
    docs = nlp.pipe(expected["texts"])  # one batch, as they were made (spaCy scores a batch of empty Docs 0)
    for doc, cats, ents in zip(docs, expected["cats"], expected["ents"], strict=True):
        assert doc.cats.keys() == cats.keys()
        assert all(abs(doc.cats[label] - score) <= 1e-6 for label, score in cats.items()), (doc.cats, cats)
        assert [[e.start, e.end, e.label_] for e in doc.ents] == ents


@pytest.mark.slow
def test_importing_the_plugin_leaves_the_threads_of_other_forked_children_alone():
    """Only the component's own worker processes run torch single-threaded; importing the plugin changes nothing for
    any other child of the process (it used to register an at-fork hook at import)."""
    script = """
import os, torch, spacy_elmo
torch.set_num_threads(2)
pid = os.fork()
if pid == 0:
    os._exit(0 if torch.get_num_threads() == 2 else 1)
print("threads kept" if os.waitpid(pid, 0)[1] == 0 else "threads changed")
"""
    assert run_python(script).strip() == "threads kept"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_component_and_its_listeners_give_the_cpu_layers(elmo_dir, tmp_path):
    """`spacy.require_gpu()`: the layers stored on the Docs (one copy to the host per batch, float16 cast on the
    device) and what a listener reads back from them (one copy to the device) are the CPU's, whitespace and all;
    nothing warns."""
    script = """
import sys, warnings
import numpy as np, spacy
sys.path.insert(0, "tests")
from spacy_fixtures import elmo_pipeline
from spacy_elmo.layers.listener import ElmoListener

texts = ["The  bank raised rates. We sat\\n\\non the bank.", "Hi", "", "A much longer sentence of words here ."] * 8
warnings.simplefilter("error")
arrays = {}
for device in ("cpu", "gpu"):
    if device == "gpu":
        spacy.require_gpu(0)
    for store in ("float32", "float16"):
        nlp = elmo_pipeline(sys.argv[1], sentencizer=True, store_dtype=store)
        docs = list(nlp.pipe(texts, batch_size=16))
        for i, doc in enumerate(docs):
            assert type(doc._.elmo_layers) is np.ndarray and doc._.elmo_layers.dtype == store
            arrays[f"{device}-{store}-{i}"] = doc._.elmo_layers
        listener = ElmoListener("elmo", nlp.get_pipe("elmo").model.get_dim("nO"),
                                nlp.get_pipe("elmo").model.get_dim("nL"))
        for i, layers in enumerate(listener.predict(docs)):
            arrays[f"{device}-{store}-listener-{i}"] = listener.ops.to_numpy(layers)
np.savez(sys.argv[2], **arrays)
"""
    run_python(script, elmo_dir, tmp_path / "layers.npz")
    arrays = np.load(tmp_path / "layers.npz")
    for key in [k for k in arrays.files if k.startswith("cpu-")]:
        cpu, gpu = arrays[key].astype("f"), arrays["gpu-" + key[4:]].astype("f")
        tolerance = 1e-5 if "float32" in key else 2e-3
        # the empty text's arrays have no token: max(initial=0)
        assert cpu.shape == gpu.shape, key
        assert np.abs(cpu - gpu).max(initial=0) <= tolerance * max(1.0, np.abs(cpu).max(initial=0)), key


def test_a_batch_out_of_device_memory_runs_in_halves_with_the_same_layers(elmo_dir, monkeypatch):
    """The component's biLM batch that the device has no memory for runs in halves (padded back to the batch's
    positions), each Doc's layers those of the run that had the memory; a sentence that does not fit alone is one
    clear error."""
    from elmo_fixtures import inject_out_of_memory

    texts = ["The bank raised rates. We sat on the river bank.", "Hi", "", "A much longer sentence of words here ."]
    nlp = elmo_pipeline(elmo_dir, sentencizer=True)
    expected = [doc._.elmo_layers for doc in nlp.pipe(texts)]
    calls = inject_out_of_memory(monkeypatch, lambda ids: ids.shape[0] > 1)  # one sentence at a time fits
    got = [doc._.elmo_layers for doc in nlp.pipe(texts)]
    assert calls[0][0] == 4 and sum(rows for rows, _ in calls if rows == 1) == 4
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    inject_out_of_memory(monkeypatch, lambda ids: ids.shape[1] > 8)  # at most 6 words
    with pytest.raises(torch.cuda.OutOfMemoryError, match="^a sentence of 8 words does not fit in the device's memory"):
        nlp("A much longer sentence of words here .")
    # Fine-tuning needs the batch whole for its backward pass: one clear error that names the setting.
    docs = [nlp.make_doc(text) for text in texts]
    for doc in docs:
        nlp.get_pipe("sentencizer")(doc)
    with pytest.raises(torch.cuda.OutOfMemoryError, match=r"^fine-tuning the biLM on a batch of 4 sentences \(40 "
                                                           r"padded positions\) ran out of device memory: lower"):
        nlp.get_pipe("elmo").model.begin_update(docs)


def test_a_model_name_that_can_never_load_fails_when_the_component_is_made():
    """`add_pipe` with an unknown bare name fails at once (not at the first Doc), suggesting the close name and the
    config setting; paths and Hub ids are left for the first use (a saved pipeline's weights are in its directory)."""
    from hf_elmo import ModelLoadError

    nlp = spacy.blank("en")
    with pytest.raises(ModelLoadError, match=r"unknown model 'orignal': .*did you mean 'original'.*"
                                             r"\[components.<elmo>.model\] name"):
        nlp.add_pipe("elmo", config={"model": {"name": "orignal"}})
    with pytest.raises(ModelLoadError, match="unknown model 'nope'"):
        spacy.util.registry.misc.get("spacy-elmo.PretrainedWeights.v1")("nope")
    for name in ("some/hub-model", "./not/yet/there", "default", ""):
        spacy.blank("en").add_pipe("elmo", config={"model": {"name": name}})
