"""The published ELMo models by name, end to end against a local HTTP server serving the AllenNLP fixture weights
as the published `small` model: download, resume, refusal of damaged downloads, offline reuse, the same vectors as
`elmo convert`, and every entry point (the Python API, AutoModel through `model_location`, `elmo embed`, spaCy)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from elmo_fixtures import ALLENNLP, require
from file_server import FileServer
from huggingface_hub import constants
from safetensors.torch import load_file
from transformers import AutoModel

import hf_elmo.published as published
from hf_elmo import ModelLoadError, load_model, model_location
from hf_elmo.allennlp import ElmoEmbedder as AllenNlpElmoEmbedder
from hf_elmo.embed import ElmoEmbedder
from hf_elmo.original_format import FORMAT

NAME = "small"
MODEL = published.PUBLISHED_MODELS[NAME]
SENTENCES = [["The", "bank", "raised", "rates", "."], ["A", "river", "bank", "."]]


@pytest.fixture
def fixture_files() -> dict[str, bytes]:
    return {MODEL.options_path: require(ALLENNLP / "options.json").read_bytes(),
            MODEL.weights_path: require(ALLENNLP / "lm_weights.hdf5").read_bytes()}


@pytest.fixture
def server(fixture_files, tmp_path, monkeypatch) -> Iterator[FileServer]:
    """The fixture weights as the published `small` model, an empty Hugging Face cache, the Hub online."""
    files = FileServer(fixture_files)
    monkeypatch.setenv("ELMO_PUBLISHED_ENDPOINT", files.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield files
    files.close()


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """`elmo convert` of the fixture weights."""
    return FORMAT.convert([require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5")],
                          tmp_path_factory.mktemp("converted"))


def test_first_use_downloads_converts_and_keeps_no_hdf5_then_second_use_is_offline(server, converted, monkeypatch):
    directory = Path(published.published_model(NAME, progress=False))
    assert directory == published.cache_directory(NAME) / "converted"
    assert server.gets(MODEL.options_path) == [None] and server.gets(MODEL.weights_path) == [None]
    assert not list(published.cache_directory(NAME).rglob("*.hdf5")), "the weights are kept once, converted"
    expected, actual = load_file(converted / "model.safetensors"), load_file(directory / "model.safetensors")
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=0, atol=0, msg=key)
    card = (directory / "README.md").read_text()
    assert f"published ELMo model `{NAME}`" in card and MODEL.url(MODEL.weights_path) in card

    server.close()  # no network, and the Hub offline: the cache serves it
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with torch.no_grad():
        vectors = ElmoEmbedder(NAME).embed_sentences(SENTENCES)
        reference = ElmoEmbedder(str(converted)).embed_sentences(SENTENCES)
        for ours, theirs in zip(vectors, reference, strict=True):
            np.testing.assert_array_equal(ours, theirs)
    assert len(server.requests) == 4  # a HEAD and a GET per file, on first use only


def test_an_interrupted_download_resumes_where_it_stopped(server, fixture_files):
    weights = fixture_files[MODEL.weights_path]
    partial = published.cache_directory(NAME) / "download" / "weights.hdf5.incomplete"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(weights[:100_000])  # what a killed process left
    load_model(NAME)
    assert server.gets(MODEL.weights_path) == ["bytes=100000-"]


def test_a_download_of_the_wrong_size_or_damaged_is_removed_and_the_next_use_downloads_it_afresh(
    server, fixture_files, converted
):
    weights = fixture_files[MODEL.weights_path]
    server.body[MODEL.weights_path] = weights[:-1000]  # shorter than announced
    with pytest.raises(ModelLoadError, match="another size than the server announced") as error:
        load_model(NAME)
    assert "\n" not in str(error.value)
    server.body[MODEL.weights_path] = bytes(len(weights))  # the announced size, but no HDF5 file
    with pytest.raises(ModelLoadError, match=f"the download of the published model '{NAME}' is damaged"):
        load_model(NAME)
    assert not any(path.is_file() for path in published.cache_directory(NAME).rglob("*") if path.name != ".lock")
    del server.body[MODEL.weights_path]
    model = load_model(NAME)
    torch.testing.assert_close(model.state_dict(), load_model(str(converted)).state_dict(), rtol=0, atol=0)


def test_threads_asking_at_once_download_and_convert_once(server):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        directories = list(pool.map(lambda _: published.published_model(NAME, progress=False), range(4)))
    assert len(set(directories)) == 1 and Path(directories[0], "model.safetensors").is_file()
    assert len(server.gets(MODEL.weights_path)) == 1


def test_a_third_family_of_published_models_is_one_class_implementing_the_protocol(fixture_files, converted,
                                                                                   tmp_path, monkeypatch):
    """A family the package does not know (a bilm-tf model zoo, say: its own endpoint, mirror variable and file names)
    downloads, converts and describes itself through `published.PublishedModel` alone: nothing of it is written in
    the download or the conversion."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class ZooModel(published.PublishedModel):
        name: str = "zoo-tiny"
        description: str = "a bilm-tf zoo's tiny biLM"
        format: object = FORMAT
        endpoint: str = "http://127.0.0.1:9/never"
        mirror_variable: str = "ELMO_ZOO_ENDPOINT"
        word_tokenizer: str = "whitespace"

        @property
        def files(self) -> tuple[published.PublishedFile, ...]:
            return (published.PublishedFile("zoo/options.json", "options.json"),
                    published.PublishedFile("zoo/weights.hdf5", "weights.hdf5"))

    files = FileServer({"zoo/options.json": fixture_files[MODEL.options_path],
                        "zoo/weights.hdf5": fixture_files[MODEL.weights_path]})
    monkeypatch.setenv("ELMO_ZOO_ENDPOINT", files.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setitem(published.PUBLISHED_MODELS, "zoo-tiny", ZooModel())
    try:
        directory = Path(model_location("zoo-tiny"))
    finally:
        files.close()
    assert load_file(directory / "model.safetensors").keys() == load_file(converted / "model.safetensors").keys()
    card = (directory / "README.md").read_text(encoding="utf-8")
    assert f"a bilm-tf zoo's tiny biLM), converted from `{files.url}/zoo/options.json`" in card
    assert json.loads((directory / "tokenizer_config.json").read_text())["word_tokenizer"] == "whitespace"


def test_a_wrong_checksum_is_refused(server, fixture_files, monkeypatch):
    model = published.AllenNlpModel(NAME, MODEL.options_path, MODEL.weights_path, "test", weights_sha256="0" * 64)
    monkeypatch.setitem(published.PUBLISHED_MODELS, NAME, model)
    with pytest.raises(ModelLoadError, match="wrong SHA-256"):
        load_model(NAME)
    assert not (published.cache_directory(NAME) / "download" / "weights.hdf5.incomplete").exists()
    monkeypatch.setitem(published.PUBLISHED_MODELS, NAME, published.AllenNlpModel(
        NAME, MODEL.options_path, MODEL.weights_path, "test",
        weights_sha256=hashlib.sha256((ALLENNLP / "lm_weights.hdf5").read_bytes()).hexdigest(),
    ))
    assert load_model(NAME).config.lstm_dim == 64


def test_offline_or_unreachable_and_not_cached_is_one_line_naming_the_urls_and_elmo_convert(server, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError) as offline:
        ElmoEmbedder(NAME)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    server.files.clear()  # the server answers 404
    with pytest.raises(ModelLoadError) as missing:
        load_model(NAME)
    for error in (offline, missing):
        message = str(error.value)
        assert "\n" not in message and f"{MODEL.url(MODEL.options_path)} and {MODEL.url(MODEL.weights_path)}" in message
        assert "elmo convert" in message and "give" in message and "as the model" in message
    assert "HF_HUB_OFFLINE=1" in str(offline.value) and "404" in str(missing.value)


def test_an_unreachable_server_fails_at_once_in_one_short_line_that_says_what_to_do(server, monkeypatch):
    """A host whose name does not resolve, or that refuses the connection, is not tried again (five retries took 27 s
    offline); the line names the three ways out, and "resume" only where a part of the file was downloaded."""
    server.close()
    server.server.server_close()  # nothing listens: the connection is refused
    for endpoint in (server.url, "http://elmo-mirror.invalid/elmo"):  # .invalid never resolves
        monkeypatch.setenv("ELMO_PUBLISHED_ENDPOINT", endpoint)
        start = time.perf_counter()
        with pytest.raises(ModelLoadError) as error:
            load_model(NAME)
        assert time.perf_counter() - start < 5
        message = str(error.value)
        assert message.startswith(f"cannot download the published model '{NAME}': ") and "cannot be reached" in message
        assert "\n" not in message and len(message) < 500 and "resume" not in message
        # Nothing of it is in the cache (offline would not help): a mirror, or both files by hand, as offline says.
        assert all(way in message for way in ("ELMO_PUBLISHED_ENDPOINT=URL",
                                              "elmo convert OPTIONS_JSON WEIGHTS_HDF5 DIR",
                                              f"download {MODEL.url(MODEL.options_path)} and "
                                              f"{MODEL.url(MODEL.weights_path)}"))
        assert "HF_HUB_OFFLINE" not in message


def test_a_server_error_says_resume_only_when_part_of_the_file_is_kept(server, fixture_files):
    weights = server.files.pop(MODEL.weights_path)  # 404 for the weights
    for kept in (False, True):
        partial = published.cache_directory(NAME) / "download" / "weights.hdf5.incomplete"
        if kept:
            partial.write_bytes(weights[:1000])
        with pytest.raises(ModelLoadError, match="404") as error:
            load_model(NAME)
        assert ("run the command again to resume" in str(error.value)) is kept


def test_allennlps_elmo_embedder_defaults_to_the_published_original_and_the_projects_to_the_default(server,
                                                                                                     fixture_files):
    """`hf_elmo.allennlp.ElmoEmbedder()`, as AllenNLP's: the published `original` (here the fixture biLM served as
    it); `hf_elmo.ElmoEmbedder()`: the English model shipped with the package."""
    import hf_elmo
    from hf_elmo import allennlp

    original = published.PUBLISHED_MODELS["original"]
    server.files.update({original.options_path: fixture_files[MODEL.options_path],
                         original.weights_path: fixture_files[MODEL.weights_path]})
    theirs, ours = allennlp.ElmoEmbedder(), hf_elmo.ElmoEmbedder()
    assert theirs.model.config.lstm_dim == 64 and theirs.device == torch.device("cpu")  # the fixture, as `original`
    assert server.gets(original.weights_path) == [None] and ours.model.config.output_dim == 512
    assert theirs.embed_sentence(SENTENCES[0]).shape == (3, 5, 32)


def test_auto_model_through_model_location_and_allennlp_urls_and_cuda_device_give_the_same_model(
    server, converted
):
    auto = AutoModel.from_pretrained(model_location(NAME)).eval()
    torch.testing.assert_close(auto.state_dict(), load_model(str(converted)).state_dict(), rtol=0, atol=0)
    # AllenNLP's ElmoEmbedder(options_file, weight_file, cuda_device) with the published URLs
    embedder = AllenNlpElmoEmbedder(MODEL.url(MODEL.options_path), MODEL.url(MODEL.weights_path), -1)
    assert embedder.device == torch.device("cpu") and embedder.model.config.lstm_dim == 64
    with pytest.raises(ModelLoadError, match="not a published model's URLs"):
        AllenNlpElmoEmbedder(f"{server.url}/other_options.json", f"{server.url}/other_weights.hdf5")


def test_spacy_configs_and_the_component_read_a_published_model_by_name(server, converted):
    import spacy

    from spacy_elmo.cli import make_config

    config = make_config("ner", NAME)
    assert config["paths"]["elmo_model"] == NAME
    assert (config["elmo"]["width"], config["elmo"]["n_layers"]) == (32, 3)  # read from the downloaded model
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": {"name": NAME}})
    doc = nlp("The bank raised rates.")
    reference = ElmoEmbedder(str(converted)).embed_sentence([token.text for token in doc])
    np.testing.assert_allclose(doc._.elmo_layers, reference, atol=1e-5)


@pytest.mark.slow
def test_elmo_embed_downloads_a_published_model_once_then_runs_offline(fixture_files, converted, tmp_path):
    files = FileServer(fixture_files)
    (tmp_path / "in.txt").write_text("The bank raised rates .\n")
    env = {**os.environ, "ELMO_PUBLISHED_ENDPOINT": files.url, "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "0"}
    command = [sys.executable, "-m", "elmo_cli", "embed", NAME, str(tmp_path / "in.txt"), "--tokenized"]
    first = subprocess.run([*command, str(tmp_path / "first.npy")], env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    files.close()
    second = subprocess.run([*command, str(tmp_path / "second.npy")], env={**env, "HF_HUB_OFFLINE": "1"},
                            capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    assert "weights.hdf5" in first.stderr and "weights.hdf5" not in second.stderr  # a progress bar on first use
    with torch.no_grad():
        expected = ElmoEmbedder(str(converted)).embed_sentence("The bank raised rates .".split())
    for name in ("first.npy", "second.npy"):  # (words, layers, width)
        np.testing.assert_allclose(np.load(tmp_path / name), expected.transpose(1, 0, 2), atol=1e-5)
