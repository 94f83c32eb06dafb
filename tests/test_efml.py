"""ELMoForManyLangs' models: read from their own format (a directory or the .zip the NLPL repository serves),
converted exactly (held against `elmoformanylangs`' own `Embedder` on a random model made by its own classes), its
`Embedder` API, and its tokenizer conventions."""

from __future__ import annotations

import copy
import logging
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from efml_fixtures import CONFIG, SENTENCES, efml_archive, make_efml_model, their_embedder
from elmo_fixtures import message_words
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo import ElmoCharTokenizer, ElmoModel
from hf_elmo.efml_format import is_efml_model, load_efml, read_dic
from hf_elmo.elmoformanylangs import Embedder

TOLERANCE = 1e-5
OUTPUT_LAYERS = (-1, 0, 1, 2, -2)
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", autouse=True)
def quiet_elmoformanylangs():
    """Its package logs every model's structure at INFO."""
    logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def efml_dir(tmp_path_factory) -> Path:
    return make_efml_model(tmp_path_factory.mktemp("efml") / "xx.model")


@pytest.fixture(scope="module")
def theirs(efml_dir):
    return their_embedder(efml_dir)


def assert_same(ours: list[np.ndarray], expected: list[np.ndarray]) -> float:
    assert len(ours) == len(expected)
    worst = 0.0
    for a, b in zip(ours, expected, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype == np.float32
        worst = max(worst, float(np.abs(a - b).max(initial=0.0)))
    assert worst <= TOLERANCE
    return worst


@pytest.mark.parametrize("output_layer", OUTPUT_LAYERS)
def test_its_embedder_and_ours_give_the_same_vectors_from_its_directory(efml_dir, theirs, output_layer):
    """Every `output_layer`, on sentences of several scripts (Latin, Cyrillic, CJK, Arabic) with characters and words
    outside the lexicons, words longer than the character slots, `<bos>`/`<eos>` given as words and one-word
    sentences; batches of 3 (its batching, shuffled; every sentence from the zero state)."""
    sentences = [s for s in SENTENCES if s] if output_layer == -1 else SENTENCES  # its -1 fails on empty ones
    expected = theirs.sents2elmo(sentences, output_layer=output_layer)
    assert max(float(np.abs(x).max(initial=0.0)) for x in expected) > 1.0  # weights that matter
    assert_same(Embedder(efml_dir, batch_size=3).sents2elmo(sentences, output_layer=output_layer), expected)


def test_a_model_whose_token_width_is_its_lstm_input_width_is_exact_too(tmp_path):
    """Its token embedder projects the word embedding and the highway output even when they have the LSTM input
    width already (26 here): the converted model keeps that projection (`token_projection`). The same function:
    every output layer of both, computed in float64, within the float32 rounding of the outputs (in float32 the
    wider LSTM's rounding grows to ~7e-5 on this random model's saturated gates)."""
    config = copy.deepcopy(CONFIG)
    config["encoder"].update(projection_dim=6 + 20, dim=32)  # word_dim 6 + filters 4 + 8 + 8
    model_dir = make_efml_model(tmp_path / "equal.model", seed=1, config=config)
    theirs = their_embedder(model_dir)
    ours = Embedder(model_dir, batch_size=3)
    assert ours._embedder.model.config.token_projection is True
    assert ours._embedder.model.char_cnn.projection.weight.shape == (26, 26)
    sentences = [s for s in SENTENCES if s]
    theirs.model.double()
    ours._embedder.model.double()
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # its embedder makes its inputs in the default dtype
    try:
        for output_layer in OUTPUT_LAYERS:
            expected = theirs.sents2elmo(sentences, output_layer=output_layer)
            got = ours.sents2elmo(sentences, output_layer=output_layer)
            assert max(float(np.abs(a - b).max()) for a, b in zip(got, expected, strict=True)) <= 1e-6
    finally:
        torch.set_default_dtype(default_dtype)
    result = CliRunner().invoke(app, ["convert", str(model_dir), str(tmp_path / "converted")])
    assert result.exit_code == 0, result.output
    assert ElmoModel.from_pretrained(tmp_path / "converted").config.projects_tokens


def test_the_converted_directory_the_zip_and_the_reference_blocks_give_the_same_vectors(efml_dir, theirs, tmp_path):
    """`elmo convert DIR OUT` and `elmo convert ZIP OUT` (the model in a folder of the archive, as NLPL's are) write
    a save_pretrained directory that gives its vectors, through the kernels and through the reference blocks."""
    archive = tmp_path / "179.zip"
    archive.write_bytes(efml_archive(efml_dir, "zh.model"))
    assert is_efml_model(efml_dir) and is_efml_model(archive) and not is_efml_model(tmp_path)
    expected = theirs.sents2elmo(SENTENCES, output_layer=-2)
    runner = CliRunner()
    for source in (efml_dir, archive):
        out = tmp_path / f"converted-{source.name}"
        result = runner.invoke(app, ["convert", str(source), str(out)])
        assert result.exit_code == 0, result.output
        assert {"config.json", "model.safetensors", "char_lexicon.json", "word_lexicon.json"} <= {
            p.name for p in out.iterdir()}
        assert_same(Embedder(out).sents2elmo(SENTENCES, output_layer=-2), expected)
    model = ElmoModel.from_pretrained(out, implementation="reference").eval()
    tokenizer = ElmoCharTokenizer.from_pretrained(out)
    assert tokenizer.model_input_names == ["input_ids", "attention_mask", "word_input_ids"]
    batch = tokenizer.batch(SENTENCES)
    with torch.no_grad():
        layers = torch.stack(model(**batch).hidden_states)  # (layers, sentences, positions, width)
    reference = [layers[:, i, 1 : len(words) + 1].numpy() for i, words in enumerate(SENTENCES)]
    assert_same(reference, expected)
    # transformers' own path: the tokenizer's encodings, padded, give the word ids too.
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        through_call = torch.stack(model(**encoded).hidden_states)
    torch.testing.assert_close(through_call, layers, rtol=0, atol=1e-6)


def test_elmo_info_and_the_card_describe_a_lexicon_model(efml_dir, tmp_path):
    out = tmp_path / "converted"
    assert CliRunner().invoke(app, ["convert", str(efml_dir), str(out)]).exit_code == 0
    info = CliRunner().invoke(app, ["info", str(out)])
    assert info.exit_code == 0 and "word embedding" in info.output, info.output
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "| word embedding | 16 words x 6, beside the char CNN |" in card and "`<bow>` and `<eow>`" in card
    assert "UTF-8 bytes" not in card


def test_a_language_spacy_tokenizes_only_with_another_package_is_one_line_naming_it(monkeypatch):
    import spacy

    from hf_elmo.text import spacy_tokenizer

    def blank(lang):
        raise ImportError("Japanese support requires SudachiPy and SudachiDict-core (https://github.com/...).\n"
                          "Install with `pip install sudachipy sudachidict_core`")

    monkeypatch.setattr(spacy, "blank", blank)
    with pytest.raises(ImportError) as error:
        spacy_tokenizer("ja-test")
    message = str(error.value)
    assert "\n" not in message and "spaCy's 'ja-test' tokenizer needs a package" in message and "SudachiPy" in message


def test_its_lexicons_are_read_as_its_reader_does(efml_dir):
    chars = read_dic(efml_dir / "char.dic")
    assert chars["\u3000"] == len(chars) - 1  # the line holding a space and an id
    assert chars["<pad>"] == 1 and read_dic(efml_dir / "word.dic")["bank"] == 5


def test_the_tokenizer_gives_its_character_and_word_ids(efml_dir, theirs):
    """Its batcher's ids (its `<bow>`/`<eow>` ids swapped as its reader swaps them, words cut to the slots, `<oov>`),
    +1, for the same words; and the same ids whatever the batch."""
    from elmoformanylangs.elmo import read_list
    from elmoformanylangs.frontend import create_one_batch

    _, tokenizer = load_efml(efml_dir)
    sentences = [s for s in SENTENCES if s]
    data, _ = read_list(sentences, 10)
    for sentence, words in zip(data, sentences, strict=True):
        word_ids, char_ids, _, _ = create_one_batch([sentence], theirs.word_lexicon, theirs.char_lexicon,
                                                    theirs.config, sort=False)
        ours = tokenizer.batch([words])
        np.testing.assert_array_equal(ours.input_ids[0].numpy(), char_ids[0].numpy() + 1)
        np.testing.assert_array_equal(ours.word_input_ids[0].numpy(), word_ids[0].numpy() + 1)
    alone = tokenizer.batch([sentences[4]])
    together = tokenizer.batch(sentences)
    np.testing.assert_array_equal(together.input_ids[4, : alone.lengths[0]], alone.input_ids[0])
    assert tokenizer.decode(alone.input_ids[0]) == "<bos> supercal xxxxxxxx ab <eos>"


def test_a_pickle_that_needs_more_than_tensors_is_refused_and_never_run(efml_dir, tmp_path):
    """The .pkl files are read with torch's weights-only loader: anything else is one line, and nothing runs."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    broken = tmp_path / "broken.model"
    shutil.copytree(efml_dir, broken)
    with open(broken / "encoder.pkl", "wb") as file:
        pickle.dump({"weights": Payload()}, file, protocol=2)  # torch.save's protocol
    result = CliRunner().invoke(app, ["convert", str(broken), str(tmp_path / "out")])
    assert result.exit_code == 1 and "encoder.pkl holds more than tensors and is not loaded" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not marker.exists()


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "char.dic").unlink(), "is not a model of a format this package reads; expected OPTIONS_JSON "
     "WEIGHTS_HDF5 (bilm-tf / AllenNLP); or MODEL_DIR_OR_ZIP (ELMoForManyLangs)"),
    (lambda d: (d / "config.json").write_text("{}"), "config.json is not an ELMoForManyLangs model's"),
    (lambda d: (d / "cnn_test.json").unlink(), "its configuration cnn_test.json is neither in the model's directory"),
    (lambda d: (d / "word.dic").write_text("no tab here\n"), "word.dic:1: expected an entry and its id"),
    (lambda d: (d / "token_embedder.pkl").write_bytes(b"junk"), "token_embedder.pkl"),
])
def test_a_broken_model_fails_in_one_line(efml_dir, tmp_path, damage, message):
    broken = tmp_path / "broken.model"
    shutil.copytree(efml_dir, broken)
    damage(broken)
    # A narrow terminal: rich's panel breaks the message across lines on every machine, whatever the temporary path.
    result = CliRunner(env={"COLUMNS": "60"}).invoke(app, ["convert", str(broken), str(tmp_path / "out")])
    assert result.exit_code in (1, 2) and message in message_words(result.output), result.output
    assert "Traceback" not in result.output


def test_output_layer_is_checked(efml_dir):
    with pytest.raises(ValueError, match="output_layer must be -1 .* or a layer 0..2, got 3"):
        Embedder(efml_dir).sents2elmo([["a"]], output_layer=3)
    assert Embedder(efml_dir).sents2elmo([[]], output_layer=-1)[0].shape == (0, 16)  # its own fails here


def test_elmo_embed_runs_a_converted_model_as_its_embedder(efml_dir, theirs, tmp_path):
    """Its command line's average output, `elmo embed` of the converted directory: one line per sentence."""
    out = tmp_path / "converted"
    assert CliRunner().invoke(app, ["convert", str(efml_dir), str(out)]).exit_code == 0
    sentences = [s for s in SENTENCES if s and "\u3000" not in s]  # whitespace-split lines
    (tmp_path / "in.txt").write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
    result = CliRunner().invoke(app, ["embed", str(out), str(tmp_path / "in.txt"), str(tmp_path / "out.npy"),
                                      "--tokenized", "--layers", "average", "-q"])
    assert result.exit_code == 0, result.output
    vectors, offsets = np.load(tmp_path / "out.npy"), np.load(tmp_path / "out.offsets.npy")
    embedded = [vectors[start:end] for start, end in zip(offsets[:-1], offsets[1:])]
    assert_same(embedded, theirs.sents2elmo(sentences, output_layer=-1))


# -- by name, and in spaCy ------------------------------------------------------------------------------------------


@pytest.fixture
def nlpl(efml_dir, tmp_path, monkeypatch):
    """The random model as the NLPL repository's German archive (142.zip, the model in a folder), an empty Hugging
    Face cache, the Hub online."""
    from file_server import FileServer
    from huggingface_hub import constants

    files = FileServer({"142.zip": efml_archive(efml_dir, "de.model")})
    monkeypatch.setenv("ELMO_EFML_ENDPOINT", files.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield files
    files.close()


def test_a_model_by_name_downloads_once_converts_and_serves_every_entry_point_offline(nlpl, theirs, tmp_path,
                                                                                      monkeypatch):
    """`efml-de`: downloaded and converted on first use (no archive kept), then offline through the Python API,
    AutoModel (`model_location`), `elmo embed` and spaCy; raw text split by spaCy's German tokenizer."""
    import spacy
    from huggingface_hub import constants
    from transformers import AutoModel

    from hf_elmo import ElmoEmbedder, load_tokenizer, model_location
    from hf_elmo.published import cache_directory, published_model

    directory = Path(published_model("efml-de", progress=False))
    assert directory == cache_directory("efml-de") / "converted"
    assert not list((cache_directory("efml-de") / "download").iterdir())
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    expected = theirs.sents2elmo(SENTENCES, output_layer=-2)
    assert_same(Embedder("efml-de").sents2elmo(SENTENCES, output_layer=-2), expected)
    assert_same(ElmoEmbedder("efml-de").embed_batch(SENTENCES), expected)
    assert load_tokenizer("efml-de").word_tokenizer == "spacy:de"
    model = AutoModel.from_pretrained(model_location("efml-de")).eval()
    assert model.config.word_embedding_dim == 6 and model.config.forget_bias == 0.0
    (tmp_path / "in.txt").write_text("Der Bankier ging zur Bank.\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["embed", "efml-de", str(tmp_path / "in.txt"), str(tmp_path / "out.npy"), "-q"])
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "out.npy").shape == (6, 3, 16)  # spaCy's German words: Der Bankier ging zur Bank .
    nlp = spacy.blank("de")
    nlp.add_pipe("elmo", config={"model": {"name": "efml-de"}})
    doc = nlp("Der Bankier ging zur Bank.")
    np.testing.assert_allclose(doc._.elmo_layers, Embedder("efml-de").sents2elmo([[t.text for t in doc]], -2)[0],
                               atol=TOLERANCE, rtol=0)
    assert len(nlpl.gets("142.zip")) == 1


def test_an_unreachable_repository_is_one_line_naming_the_mirror_and_elmo_convert(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from hf_elmo import ModelLoadError, load_model

    monkeypatch.setenv("ELMO_EFML_ENDPOINT", "http://127.0.0.1:9/repository/11")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ModelLoadError) as error:
        load_model("efml-zh")
    message = str(error.value)
    assert "\n" not in message and "127.0.0.1:9 cannot be reached" in message
    assert all(way in message for way in ("ELMO_EFML_ENDPOINT=URL", "elmo convert MODEL_DIR_OR_ZIP DIR",
                                          "download http://127.0.0.1:9/repository/11/179.zip"))
    assert "HF_HUB_OFFLINE" not in message  # nothing of it is in the cache: offline would not help


def test_every_language_has_a_name_and_an_archive():
    from hf_elmo.published import EFML_MODELS, NLPL_ENDPOINT

    assert len(EFML_MODELS) == 44 and len({m.repository_id for m in EFML_MODELS.values()}) == 44
    assert EFML_MODELS["efml-de"].url(EFML_MODELS["efml-de"].files[0].path) == f"{NLPL_ENDPOINT}/142.zip"
    assert EFML_MODELS["efml-zh"].repository_id == 179 and EFML_MODELS["efml-nb"].repository_id == 165


GERMAN_NER = [
    ("Angela Merkel besuchte gestern Berlin .", [(0, 13, "PER"), (31, 37, "LOC")]),
    ("Die Deutsche Bank hat ihren Sitz in Frankfurt .", [(4, 17, "ORG"), (36, 45, "LOC")]),
    ("Thomas Müller spielt für München .", [(0, 13, "PER"), (25, 32, "LOC")]),
    ("In Hamburg regnet es oft .", [(3, 10, "LOC")]),
]


def test_a_german_ner_pipeline_is_configured_for_its_language_and_trains(nlpl, efml_dir, tmp_path):
    """`spacy init elmo-config ner config.cfg --lang de --model efml-de` (and without `--lang`: the model's language)
    writes `lang = "de"` and the biLM's sizes; `spacy train` runs a few steps on a sample made here; a language spaCy
    cannot tokenize is one line."""
    import spacy
    from spacy.cli._util import app as spacy_app
    from spacy.tokens import DocBin
    from spacy.util import registry
    from thinc.api import Config

    nlp = spacy.blank("de")
    docs = []
    for text, entities in GERMAN_NER * 3:
        doc = nlp(text)
        doc.ents = [doc.char_span(start, end, label=label) for start, end, label in entities]
        docs.append(doc)
    DocBin(docs=docs).to_disk(tmp_path / "train.spacy")
    registry.cli.get_all()
    runner = CliRunner()
    for lang in (["--lang", "de"], []):
        result = runner.invoke(spacy_app, ["init", "elmo-config", "ner", str(tmp_path / "config.cfg"), *lang,
                                           "--model", "efml-de"])
        assert result.exit_code == 0, result.output
        config = Config().from_disk(tmp_path / "config.cfg", interpolate=False)
        assert config["nlp"]["lang"] == "de" and config["elmo"] == {"width": 16, "n_layers": 3}
        assert config["paths"]["elmo_model"] == "efml-de"
    result = runner.invoke(spacy_app, [
        "train", str(tmp_path / "config.cfg"), "--output", str(tmp_path / "out"), "--paths.train",
        str(tmp_path / "train.spacy"), "--paths.dev", str(tmp_path / "train.spacy"), "--training.max_steps", "6",
        "--training.eval_frequency", "3", "--components.ner.model.tok2vec.elmo.project_to", "16",
        "--components.ner.model.tok2vec.embed.width", "16", "--components.ner.model.tok2vec.width", "16"])
    assert result.exit_code == 0, result.output
    trained = spacy.load(tmp_path / "out" / "model-last")
    assert trained.lang == "de" and trained("Angela Merkel wohnt in Berlin .")._.elmo_layers.shape == (3, 6, 16)
    refused = runner.invoke(spacy_app, ["init", "elmo-config", "ner", str(tmp_path / "cu.cfg"), "--model",
                                        "efml-de", "--lang", "cu"])
    assert refused.exit_code == 2 and "spaCy has no language 'cu'" in message_words(refused.output)


def test_elmo_pretrain_refuses_a_lexicon_model_in_one_line(efml_dir, tmp_path):
    """`elmo pretrain` trains byte-vocabulary biLMs: --init_model of an ELMoForManyLangs model says so, nothing runs."""
    converted = tmp_path / "converted"
    assert CliRunner().invoke(app, ["convert", str(efml_dir), str(converted)]).exit_code == 0
    (tmp_path / "domain.txt").write_text("Ein Satz .\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["pretrain", "--train_files", str(tmp_path / "domain.txt"), "--init_model",
                                      str(converted), "--output_dir", str(tmp_path / "tuned"), "--max_steps", "1",
                                      "--cpu"])
    assert result.exit_code == 1, result.output
    assert "reads characters through lexicons (an ELMoForManyLangs model)" in message_words(result.output)
    assert "Traceback" not in result.output and not (tmp_path / "tuned" / "model.safetensors").exists()
