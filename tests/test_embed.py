"""Tests of `hf_elmo.embed`: settings, the embedder, input decoding, writers, `embed_file` and several processes
(the fixtures `tiny_model_dir`, `tiny_model` and `allennlp_model_dir` are conftest's)."""

from __future__ import annotations

import io
import json
import os
import sys
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from elmo_fixtures import ALLENNLP, TINY_CONFIG, direct_layers, inject_out_of_memory, require

from hf_elmo import ElmoConfig, ElmoModel, split_words
from hf_elmo.embed import ElmoEmbedder, Sentence, VectorLayout, embed_file, open_writer
from hf_elmo.text import length_batches, read_lines

FIXTURES = ALLENNLP
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# Sentences covering the defined edge cases: empty, a 10k-character word, control characters, emoji, CJK,
# lone surrogates, `<S>` given as a word, and lengths that force several batches.
EDGE_SENTENCES = [
    ["The", "bank", "of", "the", "river", "."],
    [],
    ["x" * 10_000, "short"],
    ["nul\x00byte", "\x01\x02\x1b", "tab\tinside"],
    ["😀", "中文", "日本語", "e\u0301"],
    ["\ud800", "lone\udcffsurrogate"],
    ["<S>", "boundary", "</S>"],
    [f"w{i}" for i in range(40)],
    ["a"],
]


def test_embedding_equals_the_model_called_directly_on_the_allennlp_model(allennlp_model_dir):
    model = ElmoModel.from_pretrained(allennlp_model_dir).eval()
    groups = json.loads((FIXTURES / "sentences.json").read_text(encoding="utf-8"))
    sentences = [sentence.split() for group in groups for sentence in group]
    embedder = ElmoEmbedder(model, batch_tokens=200, buffer_tokens=600)
    embeddings = list(embedder.embed_sentences(sentences))
    assert len(embeddings) == len(sentences)
    for words, embedding in zip(sentences, embeddings):
        assert embedding.shape == (3, len(words), 32)
        np.testing.assert_allclose(embedding, direct_layers(model, words), atol=1e-5, rtol=0)


def test_vectors_do_not_depend_on_the_batch_or_its_order(tiny_model):
    # A small budget mixes the sentences into several length-sorted batches.
    embedder = ElmoEmbedder(tiny_model, batch_tokens=30, buffer_tokens=60)
    batched = list(embedder.embed_sentences(EDGE_SENTENCES))
    for words, embedding in zip(EDGE_SENTENCES, batched):
        assert embedding.shape == (3, len(words), 16)
        np.testing.assert_allclose(embedding, embedder.embed_batch([words])[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(embedding, direct_layers(tiny_model, words), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_on_the_shipped_model_a_sentences_vectors_move_with_its_batch_by_float32_rounding_only():
    """What docs/performance.md states: other batchings (smaller batches, the input reversed, each sentence alone)
    give vectors within 1e-5 of the default batching's; the same batching, the same bytes."""
    lines = require(ALLENNLP.parents[1] / "ptb" / "ptb.valid.txt").read_text(encoding="utf-8").splitlines()
    lines = lines[:150]
    sentences = [line.split() for line in lines]
    embedder = ElmoEmbedder("default", layers="all")
    default = list(embedder.embed_sentences(sentences))
    others = {
        "batches of 700 positions": list(embedder.with_settings(batch_tokens=700).embed_sentences(sentences)),
        "reversed": list(embedder.embed_sentences(sentences[::-1]))[::-1],
        "alone": [embedder.embed_batch([words])[0] for words in sentences[:30]],
    }
    for name, vectors in others.items():
        worst = max(float(np.abs(a - b).max(initial=0)) for a, b in zip(default, vectors))
        assert worst <= 1e-5, (name, worst)
    again = list(ElmoEmbedder("default", layers="all").embed_sentences(sentences))
    assert all(np.array_equal(a, b) for a, b in zip(default, again, strict=True))


def test_layer_modes_select_and_mix_the_layers(tiny_model):
    sentences = [["a", "few", "words"], [], ["one"]]
    layers = [ElmoEmbedder(tiny_model).embed_batch([words])[0] for words in sentences]
    s, gamma = [0.5, -1.0, 2.0], 1.7
    weights = np.exp(s) / np.exp(s).sum()
    expected = {
        "top": [e[-1] for e in layers],
        "average": [e.mean(axis=0) for e in layers],
        "mix": [gamma * np.tensordot(weights, e, axes=1) for e in layers],
    }
    for mode, wanted in expected.items():
        options = {"scalar_parameters": s, "gamma": gamma} if mode == "mix" else {}
        embedder = ElmoEmbedder(tiny_model, layers=mode, **options)
        assert embedder.token_shape == (16,)
        for embedding, target in zip(embedder.embed_sentences(sentences), wanted):
            assert embedding.shape == target.shape
            np.testing.assert_allclose(embedding, target, atol=1e-6, rtol=0)
    assert ElmoEmbedder(tiny_model).token_shape == (3, 16)


@pytest.mark.parametrize(
    "options",
    [{"layers": "first"}, {"layers": "top", "gamma": 2.0}, {"layers": "mix", "scalar_parameters": [1.0, 2.0]},
     {"batch_tokens": 0}],
)
def test_invalid_embedder_options_raise(tiny_model, options):
    with pytest.raises(ValueError):
        ElmoEmbedder(tiny_model, **options)


def test_a_10k_character_word_is_cut_to_48_bytes(tiny_model):
    embedder = ElmoEmbedder(tiny_model)
    long, cut = embedder.embed_batch([["y" * 10_000, "z"], ["y" * 48, "z"]])
    np.testing.assert_array_equal(long, cut)


@pytest.mark.slow
def test_a_20k_word_sentence_is_embedded(tiny_model):
    words = [f"w{i % 97}" for i in range(20_000)]
    embedding = ElmoEmbedder(tiny_model, layers="top", batch_tokens=512).embed_batch([words])[0]
    assert embedding.shape == (20_000, 16)
    assert np.isfinite(embedding).all()
    # The start is unaffected by the rest of the sentence in the forward direction.
    head = ElmoEmbedder(tiny_model, layers="top").embed_batch([words[:10]])[0]
    np.testing.assert_allclose(embedding[:10, :8], head[:, :8], atol=1e-5, rtol=0)


def test_read_lines_splits_on_newline_only_and_never_fails_on_bad_utf8():
    # BOM, CRLF, an empty line, other line breaks (VT, FS, NEL, U+2028), invalid UTF-8, no final newline.
    data = b"\xef\xbb\xbffirst\r\n\nsecond\x0bstill\x1cthe\xc2\x85same \xe2\x80\xa8line\n\xff\xfe bad \xed\xa0\x80\nend"
    sizes: list[int] = []
    lines = list(read_lines(io.BytesIO(data), sizes.append))
    assert lines == [
        "first", "", "second\x0bstill\x1cthe\x85same \u2028line", "\udcff\udcfe bad \udced\udca0\udc80", "end"
    ]
    assert sum(sizes) == len(data)
    assert lines[3].encode("utf-8", "surrogateescape") == b"\xff\xfe bad \xed\xa0\x80"
    assert list(read_lines(io.BytesIO(b""))) == []
    assert list(read_lines(io.BytesIO(b"\n"))) == [""]


def sentence(words: list[str], line: int = 0) -> Sentence:
    return Sentence("in.txt", line, " ".join(words), words)


def write_lines(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_embed_file_to_npy_keeps_one_sentence_per_line(tiny_model, tmp_path):
    emoji_cjk_and_a_bad_byte = b"esc\x1b \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87 \xff"
    lines = [b"Hello, world!", b"", b"   \t ", emoji_cjk_and_a_bad_byte, b"x" * 10_000, b"last one"]
    data = b"\n".join(lines)
    source = write_lines(tmp_path / "input.txt", data)
    embedder = ElmoEmbedder(tiny_model, layers="all", batch_tokens=16, buffer_tokens=20)
    assert embed_file(embedder, source, tmp_path / "out.npy", progress=False) == 6

    vectors, offsets = np.load(tmp_path / "out.npy"), np.load(tmp_path / "out.offsets.npy")
    sentences = [split_words(line.decode("utf-8", "surrogateescape")) for line in lines]
    assert sentences[3] == ["esc", "\x1b", "😀", "中", "文", "\udcff"]
    assert offsets.dtype == np.int64
    assert offsets.tolist() == np.cumsum([0] + [len(words) for words in sentences]).tolist()  # empty lines repeat
    assert vectors.shape == (offsets[-1], 3, 16) and vectors.dtype == np.float32
    for i, words in enumerate(sentences):
        alone = embedder.embed_batch([words])[0]  # (layers, words, width); the file stores words first
        np.testing.assert_allclose(vectors[offsets[i] : offsets[i + 1]], alone.transpose(1, 0, 2), atol=1e-5, rtol=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.txt", "out.npy", "out.offsets.npy"]


def test_embed_file_to_hdf5_uses_allennlps_layout(tiny_model, tmp_path):
    source = write_lines(tmp_path / "input.txt", b"the  cat sat\n\n  \nthe  cat sat\n<S> x </S>\n")
    embedder = ElmoEmbedder(tiny_model, layers="top")
    assert embed_file(embedder, source, tmp_path / "out.hdf5", tokenized=True, progress=False) == 5
    with h5py.File(tmp_path / "out.hdf5") as output:
        assert sorted(output) == ["0", "1", "2", "3", "4", "sentence_to_index"]
        assert json.loads(output["sentence_to_index"][0]) == {"the  cat sat": "3", "": "2", "<S> x </S>": "4"}
        assert output["1"].shape == output["2"].shape == (0, 16)
        np.testing.assert_array_equal(output["0"][()], output["3"][()])
        np.testing.assert_allclose(output["0"][()], embedder.embed_batch([["the", "cat", "sat"]])[0], atol=1e-6)
        assert output["4"].shape == (3, 16)
    embed_file(ElmoEmbedder(tiny_model), source, tmp_path / "all.h5", progress=False, sentence_index=False)
    with h5py.File(tmp_path / "all.h5") as output:
        assert "sentence_to_index" not in output
        assert output["0"].shape == (3, 3, 16) and output["1"].shape == (3, 0, 16)


def test_empty_input_gives_empty_outputs(tiny_model, tmp_path):
    source = write_lines(tmp_path / "empty.txt", b"")
    assert embed_file(ElmoEmbedder(tiny_model, layers="mix"), source, tmp_path / "out.npy", progress=False) == 0
    assert np.load(tmp_path / "out.npy").shape == (0, 16)
    assert np.load(tmp_path / "out.offsets.npy").tolist() == [0]


def test_a_failure_leaves_no_output_behind(tiny_model, tmp_path):
    def sentences():
        yield ["fine"]
        raise RuntimeError("input broke")

    for name in ("out.npy", "out.hdf5"):
        with pytest.raises(RuntimeError, match="input broke"):
            with open_writer(tmp_path / name, VectorLayout((3, 16))) as writer:
                for embedding in ElmoEmbedder(tiny_model).embed_sentences(sentences()):
                    writer.add(embedding, sentence(["fine"]))
    assert list(tmp_path.iterdir()) == []
    # A .npy name is NumPy's, any other HDF5 (as `allennlp elmo` writes whatever the name), or the format given.
    for name, file_format, writer in (("out.txt", None, "Hdf5Writer"), ("out", None, "Hdf5Writer"),
                                      ("out.NPY", None, "NpyWriter"), ("out.npy", "hdf5", "Hdf5Writer"),
                                      ("out.parquet", None, "ParquetWriter"), ("out.PQ", None, "ParquetWriter")):
        opened = open_writer(tmp_path / name, VectorLayout((16,)), file_format=file_format)
        assert type(opened).__name__ == writer
        opened.discard()
    with pytest.raises(ValueError, match="file_format: must be one of hdf5, npy, parquet, got 'csv'"):
        open_writer(tmp_path / "out.csv", VectorLayout((16,)), file_format="csv")
    assert list(tmp_path.iterdir()) == []


def test_at_most_a_bounded_number_of_sentences_is_buffered(tiny_model):
    read = 0

    def sentences():
        nonlocal read
        for i in range(3_000):
            read += 1
            yield ["tok", str(i)]  # 4 positions each, boundaries included

    embedder = ElmoEmbedder(tiny_model, layers="top", batch_tokens=200, buffer_tokens=400)
    ahead = [read - written for written, _ in enumerate(embedder.embed_sentences(sentences()), start=1)]
    assert len(ahead) == 3_000
    # 400 / 4 = 100 sentences per chunk, plus the one read to find the chunk's end.
    assert max(ahead) <= 100


@pytest.mark.slow
def test_memory_does_not_grow_with_the_input(tiny_model, tmp_path):
    embedder = ElmoEmbedder(tiny_model, layers="top")

    def peak_traced_memory(n_lines: int) -> int:
        # A bounded vocabulary: the tokenizer's word cache (up to 65536 words) must not count as growth here.
        text = b"".join(b"line %d of it .\n" % (i % 500) for i in range(n_lines))
        source = write_lines(tmp_path / f"{n_lines}.txt", text)
        tracemalloc.start()
        try:
            assert embed_file(embedder, source, tmp_path / f"{n_lines}.npy", progress=False) == n_lines
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak_traced_memory(5_000), peak_traced_memory(20_000)
    # The output of 20k lines alone is 20k * 5 words * 64 bytes = 6.4 MB; what is held stays that of one chunk.
    assert large < 1.3 * small + 1_000_000, (small, large)


@pytest.mark.slow
@pytest.mark.parametrize("output", ["out.npy", "out.hdf5"])
def test_a_long_line_streams_to_the_output_in_the_memory_of_its_windows(tmp_path, output):
    """One line of many windows: each window's vectors go to the writer as they come, so the memory held grows with
    the line only by its words (it grew at twice the output: every window's vectors, then their concatenation)."""
    torch.manual_seed(0)
    model = ElmoModel(ElmoConfig(**{**TINY_CONFIG, "projection_dim": 64, "lstm_dim": 64})).eval()  # 1.5 KB a word
    embedder = ElmoEmbedder(model, layers="all", max_sentence_words=100, buffer_tokens=400)
    lines = {n: " ".join(f"w{i % 300}" for i in range(n)) for n in (2_000, 20_000)}

    def peak_traced_memory(words: int) -> int:
        source = write_lines(tmp_path / f"{words}.txt", (lines[words] + "\n").encode())
        tracemalloc.start()
        try:
            assert embed_file(embedder, source, tmp_path / f"{words}-{output}", progress=False) == 1
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak_traced_memory(2_000), peak_traced_memory(20_000)
    output_bytes = 20_000 * 3 * 128 * 4  # 30.7 MB; a chunk of windows' vectors is 0.6 MB, the line's words ~1.3 MB
    assert large - small < 0.1 * output_bytes, (small, large)
    words = lines[20_000].split()
    expected = np.concatenate([direct_layers(model, words[start : start + 100]) for start in range(0, 20_000, 100)],
                              axis=1)
    if output.endswith(".npy"):
        vectors = np.load(tmp_path / "20000-out.npy")  # (words, layers, width)
        np.testing.assert_allclose(np.moveaxis(vectors, 0, -2), expected, atol=1e-5)
    else:
        with h5py.File(tmp_path / "20000-out.hdf5") as written:
            np.testing.assert_allclose(written["0"][...], expected, atol=1e-5)
    # The Python API gives the same array, joined from the windows in place.
    np.testing.assert_allclose(next(embedder.embed_sentences([words])), expected, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_embedding_on_cuda_matches_cpu(tiny_model_dir):
    options = {"layers": "mix", "scalar_parameters": [0.5, -1.0, 2.0], "gamma": 1.5, "batch_tokens": 30}
    cpu = ElmoEmbedder(ElmoModel.from_pretrained(tiny_model_dir), **options)
    cuda = ElmoEmbedder(ElmoModel.from_pretrained(tiny_model_dir), device="cuda", **options)
    for on_cpu, on_cuda in zip(cpu.embed_sentences(EDGE_SENTENCES), cuda.embed_sentences(EDGE_SENTENCES), strict=True):
        # cuDNN may run the char CNN convolutions in TF32.
        np.testing.assert_allclose(on_cuda, on_cpu, atol=2e-3, rtol=0)


# -- AllenNLP's ElmoEmbedder calls ---------------------------------------------------------------------------


def test_embedder_loads_by_name_like_allennlps_default(tiny_model_dir, tiny_model):
    from hf_elmo import DEFAULT_MODEL

    default = ElmoEmbedder()  # the English model shipped with the package
    assert default.model.name_or_path == DEFAULT_MODEL and default.tokenizer.word_tokenizer == "spacy:en"
    assert default.embed_sentence(["The", "bank", "."]).shape == (3, 3, 512)
    by_path = ElmoEmbedder(str(tiny_model_dir))
    np.testing.assert_allclose(by_path.embed_sentence(["a", "b"]), direct_layers(tiny_model, ["a", "b"]), atol=1e-5)
    with pytest.raises(TypeError, match="must be an ElmoModel, a directory or a Hub id"):
        ElmoEmbedder(42)


def test_batch_to_embeddings_gives_allennlps_padded_tensors_and_mask(tiny_model):
    embedder = ElmoEmbedder(tiny_model)
    batch = [["a", "b", "c"], [], ["d"]]
    activations, mask = embedder.batch_to_embeddings(batch)
    assert activations.shape == (3, 3, 3, 16) and mask.tolist() == [[1, 1, 1], [0, 0, 0], [1, 0, 0]]
    for row, (words, embedding) in enumerate(zip(batch, embedder.embed_batch(batch))):
        assert embedding.shape == (3, len(words), 16)
        np.testing.assert_allclose(activations[row, :, : len(words)].numpy(), embedding, atol=1e-6)
        assert not activations[row, :, len(words):].any()


def test_batch_size_caps_the_sentences_per_batch_without_changing_vectors(tiny_model):
    batches = length_batches([3, 3, 3, 3, 3], batch_tokens=1000, batch_size=2)
    assert [len(batch) for batch in batches] == [2, 2, 1]
    embedder = ElmoEmbedder(tiny_model)
    calls = []
    word_vectors = embedder._word_vectors
    embedder._word_vectors = lambda sentences: calls.append(len(sentences)) or word_vectors(sentences)
    capped = list(embedder.embed_sentences(EDGE_SENTENCES, batch_size=3))
    assert max(calls) <= 3 and sum(calls) == len(EDGE_SENTENCES)
    for words, embedding in zip(EDGE_SENTENCES, capped):
        np.testing.assert_allclose(embedding, direct_layers(tiny_model, words), atol=1e-5, rtol=0)


# -- faults --------------------------------------------------------------------------------------------------


class FullDisk:
    """A file whose flush fails as on a full disk (the real file is closed underneath)."""

    def __init__(self, handle):
        self.handle = handle

    def close(self):
        self.handle.close()
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("suffix", [".npy", ".hdf5"])
def test_a_full_disk_leaves_no_partial_files(tmp_path, suffix):
    writer = open_writer(tmp_path / f"out{suffix}", VectorLayout((4,)))
    writer.add(np.ones((2, 4), dtype=np.float32), sentence(["a", "b"]))
    if suffix == ".npy":
        writer._vectors._file = FullDisk(writer._vectors._file)
    else:
        writer._file = FullDisk(writer._file)
    with pytest.raises(OSError, match="No space left"), writer:
        raise OSError(28, "No space left on device")  # the write that failed
    assert list(tmp_path.iterdir()) == []


def test_a_new_npy_never_sits_beside_an_old_offsets_file(tmp_path, monkeypatch):
    for name in ("out.npy", "out.offsets.npy"):
        (tmp_path / name).write_bytes(b"old")
    writer = open_writer(tmp_path / "out.npy", VectorLayout((4,)))
    writer.add(np.ones((2, 4), dtype=np.float32), sentence(["a", "b"]))
    replace = os.replace
    calls = []

    def killed_after_the_first_rename(source, target):
        calls.append(target)
        if len(calls) > 1:
            raise KeyboardInterrupt  # the process dies between the two renames
        replace(source, target)

    monkeypatch.setattr(os, "replace", killed_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        writer.close()
    assert np.load(tmp_path / "out.npy").shape == (2, 4)
    assert not (tmp_path / "out.offsets.npy").exists()  # not the old index of other vectors


def test_long_sentences_run_as_windows_from_the_zero_state(tiny_model):
    words = [f"w{i % 7}" for i in range(12)]
    embedder = ElmoEmbedder(tiny_model, max_sentence_words=5, batch_tokens=30, buffer_tokens=40)
    short, long_, empty = list(embedder.embed_sentences([words[:5], words, []]))
    windows = [direct_layers(tiny_model, words[start : start + 5]) for start in (0, 5, 10)]
    assert long_.shape == (3, 12, 16) and empty.shape == (3, 0, 16)
    np.testing.assert_allclose(long_, np.concatenate(windows, axis=1), atol=1e-5, rtol=0)
    np.testing.assert_allclose(short, direct_layers(tiny_model, words[:5]), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="max_sentence_words: must be an integer >= 1, got 0"):
        ElmoEmbedder(tiny_model, max_sentence_words=0)


@pytest.mark.parametrize("cpu", ["avx2", "avx512", "avx512_bf16", "amx"])
def test_bf16_is_opt_in_runs_where_the_cpu_has_native_bf16_else_float32_with_one_warning(tiny_model, pretend_cpu, cpu):
    """bf16 autocast runs only when asked for and changes the vectors by bf16 rounding only (not exact: the default
    stays float32). On a CPU without native bf16, where it would be several times slower, the embedder runs float32
    (exact) and says so once, naming the line that made it."""
    import warnings

    from hf_elmo.kernel_plan import BF16_AS_FLOAT32
    from hf_elmo.runtime import HostWarning

    pretend_cpu(cpu)
    native = cpu in ("avx512_bf16", "amx")
    sentences = [["The", "bank", "of", "the", "river", "."], ["Hi"], [f"w{i}" for i in range(40)]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exact, low = ElmoEmbedder(tiny_model), ElmoEmbedder(tiny_model, bf16=True)
        line = sys._getframe().f_lineno - 1
        low_vectors = low.embed_batch(sentences)
    assert low.bf16 is native and not exact.bf16
    assert [(w.category, str(w.message), w.filename, w.lineno) for w in caught] == (
        [] if native else [(HostWarning, BF16_AS_FLOAT32, __file__, line)])
    for a, b in zip(exact.embed_batch(sentences), low_vectors, strict=True):
        assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
        if not native:
            np.testing.assert_array_equal(a, b)
            continue
        assert 0 < np.abs(a - b).max() < 0.05 * np.abs(a).max()  # bf16 really ran, and only rounded
        cosine = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cosine.min() > 0.999
    np.testing.assert_array_equal(exact.embed_batch(sentences)[0], ElmoEmbedder(tiny_model).embed_batch(sentences)[0])


def test_embed_settings_are_checked_once_and_name_the_setting_at_fault(tiny_model, monkeypatch):
    """`ElmoEmbedder`'s arguments and `elmo embed`'s flags make the same `EmbedSettings`; an error names the setting
    (the CLI names the flag: see test_cli)."""
    from hf_elmo.embed import EmbedSettingError, EmbedSettings

    for settings, setting in [(dict(layers="middle"), "layers"), (dict(layers="top", gamma=2.0), "gamma"),
                              (dict(scalar_parameters=(1.0, 2.0, 3.0)), "scalar_parameters"),
                              (dict(batch_tokens=0), "batch_tokens"), (dict(batch_size=True), "batch_size")]:
        with pytest.raises(EmbedSettingError) as error:
            EmbedSettings(**settings)
        assert error.value.setting == setting
    with pytest.raises(EmbedSettingError, match="2 values given; the model has 3 layers") as error:
        ElmoEmbedder(tiny_model, layers="mix", scalar_parameters=[1.0, 2.0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EmbedSettingError, match="cuda:0 was asked for, but this torch sees no CUDA device") as error:
        ElmoEmbedder(tiny_model, device="cuda:0")
    assert error.value.setting == "device"
    assert EmbedSettings.device_of("cpu") == torch.device("cpu") and EmbedSettings.device_of(None) is None
    settings = EmbedSettings(layers="mix", scalar_parameters=(0.0, 1.0, 0.0), gamma=2.0, batch_tokens=64)
    embedder = ElmoEmbedder(tiny_model, settings=settings)
    assert embedder.settings is settings and embedder.batch_tokens == 64 and embedder.layers == "mix"


def test_the_progress_bar_advances_within_a_long_line_and_ends_at_the_file_size(tiny_model_dir, tmp_path, monkeypatch):
    import hf_elmo.embed.files as embed_module

    updates: list[int] = []

    class Bar:
        def __init__(self, *args, total=None, **kwargs):
            self.total = total

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def update(self, n: int) -> None:
            updates.append(n)

    monkeypatch.setattr(embed_module, "tqdm", Bar)
    text = " ".join(["word"] * 50) + "\n\nshort line\n"
    (tmp_path / "in.txt").write_text(text)
    embedder = ElmoEmbedder(tiny_model_dir, max_sentence_words=10, batch_tokens=12)
    embed_file(embedder, tmp_path / "in.txt", tmp_path / "out.npy", tokenized=True)
    line = len(" ".join(["word"] * 50)) + 1
    assert all(isinstance(n, int) and n >= 0 for n in updates) and sum(updates) == len(text.encode())
    assert [sum(updates[: i + 1]) for i in range(5)] == [line * k // 5 for k in range(1, 6)]  # window by window


def test_a_batch_out_of_device_memory_runs_in_halves_with_the_same_vectors(tiny_model, monkeypatch):
    """A batch the device has no memory for runs again in halves (and quarters...), each sentence's vectors those of
    the run that had the memory (to float32 rounding: matmuls of fewer rows sum in another order); one sentence that
    does not fit alone is one clear error."""
    embedder = ElmoEmbedder(tiny_model, batch_tokens=10_000)
    expected = list(embedder.embed_sentences(EDGE_SENTENCES))
    calls = inject_out_of_memory(monkeypatch, lambda ids: ids.shape[0] > 2)  # at most 2 rows fit
    got = list(embedder.embed_sentences(EDGE_SENTENCES))
    assert calls[0][0] == len(EDGE_SENTENCES) and sum(rows for rows, _ in calls if rows <= 2) == len(EDGE_SENTENCES)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    inject_out_of_memory(monkeypatch, lambda ids: ids.shape[1] > 30)  # no sentence of more than 28 words fits
    with pytest.raises(torch.cuda.OutOfMemoryError, match=r"^a sentence of 40 words does not fit in the device's "
                                                          r"memory even alone \(CUDA out of memory\): embed long"):
        list(embedder.embed_sentences(EDGE_SENTENCES))


def test_the_public_names_are_at_the_packages_top():
    """`hf_elmo.ElmoEmbedder` and the rest of the public API, as the README uses them (not only from submodules)."""
    import hf_elmo
    from hf_elmo import embed, runtime, text

    for name, home in (("ElmoEmbedder", embed), ("EmbedSettings", embed), ("embed_file", embed),
                       ("ElmoBatch", text), ("OutOfDeviceMemoryError", runtime)):
        assert name in hf_elmo.__all__ and getattr(hf_elmo, name) is getattr(home, name)
    assert all(hasattr(hf_elmo, name) for name in hf_elmo.__all__)
