"""`hf_elmo.loading`: one check of a model name for the CLI, the Python API and spaCy; every bad name, directory or
file fails with the same one-line message (what is wrong, which file, what to do), before any download."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import spacy
import torch
from elmo_fixtures import TINY_CONFIG
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoModel, ModelLoadError, load_model
from hf_elmo import loading as loading_module
from hf_elmo.embed import ElmoEmbedder

runner = CliRunner(env={"COLUMNS": "1000"})


def bad_model(kind: str, tiny_model_dir: Path, tmp_path: Path) -> tuple[str, str]:
    """A model name of `kind` and what its error must say."""
    if kind == "missing directory":
        return str(tmp_path / "nonexistent"), f"model directory {tmp_path / 'nonexistent'} does not exist"
    if kind == "misspelt name":
        return "orignal", ("unknown model 'orignal': not a directory, nor default, original, original-5.5b, medium, "
                           "small, pubmed, efml-<language> (ELMoForManyLangs' 44, e.g. efml-de, efml-zh) (did you "
                           "mean 'original'?)")
    if kind == "a file":
        (tmp_path / "model.txt").write_text("x")
        return str(tmp_path / "model.txt"), f"{tmp_path / 'model.txt'} is a file; expected a save_pretrained directory"
    if kind == "uncached Hub id offline":
        return "org/never-downloaded", "org/never-downloaded is not in the Hugging Face cache and the Hub is offline"
    directory = tmp_path / "model"
    shutil.copytree(tiny_model_dir, directory)
    if kind == "no config.json":
        (directory / "config.json").unlink()
        return str(directory), f"{directory} has no config.json: it is not a save_pretrained directory of a biLM"
    if kind == "non-UTF-8 tokenizer_config.json":
        (directory / "tokenizer_config.json").write_bytes(b'{"a": "\xff"}')
        return str(directory), f"{directory / 'tokenizer_config.json'} is not UTF-8 text (invalid start byte at byte 7)"
    if kind == "not JSON":
        (directory / "config.json").write_text("{")
        return str(directory), f"{directory / 'config.json'} is not valid JSON"
    if kind == "another model type":
        config = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**config, "model_type": "bert"}))
        return str(directory), f"{directory} holds a bert model (config.json model_type 'bert'), not an ELMo biLM"
    if kind == "pickled weights":
        (directory / "model.safetensors").unlink()
        (directory / "pytorch_model.bin").write_bytes(pickle.dumps({"weights": 1}))
        return str(directory), f"{directory} holds its weights as pytorch_model.bin, a pickle, which is never loaded"
    if kind == "no weights":
        (directory / "model.safetensors").unlink()
        return str(directory), f"{directory} has no model.safetensors: the weights are missing"
    raise AssertionError(kind)


KINDS = ["missing directory", "misspelt name", "a file", "uncached Hub id offline", "no config.json",
         "non-UTF-8 tokenizer_config.json", "not JSON", "another model type", "pickled weights", "no weights"]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setattr(loading_module, "is_offline_mode", lambda: True)


@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_model_fails_in_one_line_from_the_cli_the_python_api_and_spacy(kind, tiny_model_dir, tmp_path, offline):
    name, message = bad_model(kind, tiny_model_dir, tmp_path)
    (tmp_path / "in.txt").write_text("a b\n")
    for command in (["info", name], ["embed", name, str(tmp_path / "in.txt"), str(tmp_path / "out.npy"), "-q"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        assert result.stderr.startswith(f"Error: {message}") and result.stderr.count("\n") == 1, result.stderr
    for load in (load_model, ElmoEmbedder):
        with pytest.raises(ModelLoadError) as error:
            load(name)
        assert str(error.value).startswith(message) and "\n" not in str(error.value)
    nlp = spacy.blank("en")
    with pytest.raises(ModelLoadError) as error:
        nlp.add_pipe("elmo", config={"model": {"name": name}})  # a name that can never load: here
        nlp("a b")  # else at the first Doc
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert "[components.<elmo>.model] name" in str(error.value)  # which setting gave the name


def test_a_cached_hub_id_loads_offline_and_default_names_the_shipped_model(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(loading_module, "try_to_load_from_cache",
                        lambda repo, name, revision=None: str(tiny_model_dir / name))
    monkeypatch.setattr(loading_module, "is_offline_mode", lambda: True)
    assert loading_module.resolve_model("org/tiny") == "org/tiny"
    assert loading_module.resolve_model("default") == loading_module.DEFAULT_MODEL
    assert load_model("default").config.output_dim == 512


def test_weights_that_do_not_fit_the_config_name_the_directory(tiny_model_dir, tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(tiny_model_dir, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "lstm_dim": config["lstm_dim"] * 2}))
    with pytest.raises(ModelLoadError, match=f"cannot load the weights of {directory}: .*ignore_mismatched") as error:
        load_model(directory)
    assert "\n" not in str(error.value)


def test_a_model_loads_quietly_in_eval_mode_with_its_tokenizer(tiny_model_dir, capfd):
    model = load_model(tiny_model_dir)
    assert isinstance(model, ElmoModel) and not model.training
    assert loading_module.load_tokenizer(tiny_model_dir).max_characters_per_token == 50
    ElmoEmbedder(tiny_model_dir)
    ElmoEmbedder("default")
    assert capfd.readouterr().err == ""


def test_max_characters_per_token_is_bounded():
    """A huge character count would make every batch allocate gigabytes (29.8 GiB in the spaCy layer for 1e9)."""
    with pytest.raises(ValueError, match="max_characters_per_token must be an integer >= 3 and <= 1024"):
        ElmoConfig(**{**TINY_CONFIG, "max_characters_per_token": 10**9})
    with pytest.raises(ValueError, match="max_characters_per_token"):
        ElmoCharTokenizer(max_characters_per_token=10**9)
    assert ElmoConfig(**{**TINY_CONFIG, "max_characters_per_token": 1024}).max_characters_per_token == 1024


def test_the_loaded_model_is_the_saved_one(tiny_model_dir):
    saved = ElmoModel.from_pretrained(tiny_model_dir)
    loaded = load_model(tiny_model_dir)
    for (name, tensor), other in zip(saved.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(tensor, other), name
