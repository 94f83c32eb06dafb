"""The shipped configs follow the paper (task features + ELMo, where `init-config --elmo` puts it) and train on
every document of the full CoNLL-2003 and SST-5 training sets: spaCy's NER oracle
finds a move sequence for each CoNLL-2003 document as `spacy train` builds its examples (re-tokenized from the text,
`gold_preproc = false`), while the biLM still reads sentences; every SST-5 sentence is one non-empty Doc with one
label."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import spacy
from elmo_fixtures import message_words, require
from spacy.pipeline import Sentencizer
from spacy.training import Example
from spacy.util import registry
from spacy_fixtures import DATA
from thinc.api import Config
from typer.testing import CliRunner

import spacy_elmo
from spacy_elmo.cli import app, make_config
from spacy_elmo.corpora import read_conll2003, read_sst5
from spacy_elmo.layers import ElmoListener


@pytest.fixture(scope="module")
def conll_examples() -> list[Example]:
    """Every training document of CoNLL-2003 as `spacy.Corpus` gives it to `spacy train` with the shipped config
    (10 sentences per Doc, as `convert-conll2003` writes them; predicted Docs re-tokenized from the text)."""
    nlp = spacy.blank("en")
    references = list(read_conll2003(require(DATA / "conll2003" / "iob2" / "train.txt"), nlp.vocab))
    return [Example(nlp.make_doc(reference.text), reference) for reference in references]


def ner_with_labels(examples: list[Example]):
    """spaCy's NER with the moves of the corpus's labels (as `spacy train` initializes it)."""
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("ner")
    nlp.initialize(lambda: examples)
    return ner


def oracle_failures(ner, examples: list[Example]) -> list[int]:
    failures = []
    for index, example in enumerate(examples):
        try:
            ner.moves.get_oracle_sequence(example)
        except ValueError as error:  # E024: "Could not find an optimal move to supervise the parser"
            assert "E024" in str(error), error
            failures.append(index)
    return failures


@pytest.mark.slow
def test_every_conll2003_training_document_has_an_ner_oracle_and_the_biLM_reads_sentences(conll_examples):
    assert len(conll_examples) == 1793
    ner = ner_with_labels(conll_examples)
    assert oracle_failures(ner, conll_examples) == []
    # The shipped pipeline sets no sentence boundaries on the Docs; its span getter finds them for the biLM alone.
    config = make_config("ner")
    assert config["nlp"]["pipeline"] == ["elmo", "ner"] and config["training"]["annotating_components"] == []
    get_spans = spacy.util.registry.resolve(Config({"x": config["components"]["elmo"]["model"]["get_spans"]}))["x"]
    docs = [eg.predicted for eg in conll_examples[:200]]
    spans = get_spans(docs)
    assert not any(doc.has_annotation("SENT_START") for doc in docs)
    # Sentences, not whole Docs: (CoNLL's sentences without final punctuation, e.g. datelines, join the next one).
    gold_sentences = sum(len(list(eg.reference.sents)) for eg in conll_examples[:200])
    assert 4 * len(docs) < sum(map(len, spans)) <= gold_sentences


@pytest.mark.slow
def test_an_annotating_sentencizer_breaks_the_ner_oracle(conll_examples):
    """Why the shipped config has no sentencizer component: its boundaries inside gold entities (E024)."""
    sentencizer = Sentencizer()
    annotated = []
    for example in conll_examples:
        predicted = example.predicted.copy()
        sentencizer(predicted)
        annotated.append(Example(predicted, example.reference))
    assert len(oracle_failures(ner_with_labels(conll_examples), annotated)) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("source, phrases, n_docs", [("train.tsv", False, 8544), ("trees/train.txt", True, 159274)])
def test_every_sst5_training_sentence_or_phrase_is_one_labelled_doc(source, phrases, n_docs):
    nlp = spacy.blank("en")
    docs = list(read_sst5(require(DATA / "sst5" / source), nlp.vocab, phrases=phrases))
    assert len(docs) == n_docs
    assert all(len(doc) > 0 and sorted(doc.cats.values()) == [0, 0, 0, 0, 1] for doc in docs)
    get_spans = spacy.util.registry.resolve(
        Config({"x": make_config("textcat")["components"]["elmo"]["model"]["get_spans"]})
    )["x"]
    predicted = [nlp.make_doc(doc.text) for doc in docs]
    assert all(len(spans) >= 1 for spans in get_spans(predicted))


@pytest.mark.parametrize("task, encoder", [("ner", None), ("textcat", None), ("textcat", "bcn")])
@pytest.mark.parametrize("placement, n_listeners", [("input", 1), ("input+output", 2), ("none", 0)])
def test_init_config_places_elmo_where_asked(elmo_dir, task, encoder, placement, n_listeners):
    config = make_config(task, str(elmo_dir), elmo=placement, encoder=encoder)
    config["components"][task]["model"]["tok2vec"]["embed"]["width"] = 8
    config["components"][task]["model"]["tok2vec"]["width"] = 16
    if encoder == "bcn":
        assert config["components"][task]["model"]["tok2vec"]["@architectures"] == "spacy-elmo.BiattentiveEncoder.v1"
        config["components"][task]["model"]["tok2vec"]["feedforward_width"] = 8
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    assert ("elmo" in nlp.pipe_names) == (placement != "none")
    model = nlp.get_pipe(task).model
    listeners = [node for node in model.walk() if isinstance(node, ElmoListener)]
    mixes = [node for node in model.walk() if node.name == "elmo_scalar_mix"]
    assert len(listeners) == len(mixes) == n_listeners
    assert all(mix.attrs["l2"] == 0.001 for mix in mixes)
    task_encoder = spacy.util.registry.resolve(
        Config({"x": config.interpolate()["components"][task]["model"]["tok2vec"]})
    )["x"]
    assert task_encoder.get_dim("nO") == 16 + (256 if placement == "input+output" else 0)  # [h_k; ELMo_k]
    if placement != "none":
        assert nlp.get_pipe("elmo").listening_components == [task]
        assert not nlp.get_pipe("elmo").is_trainable  # frozen: no loss column, no update in `spacy train`
    reference = nlp.make_doc("Peter Blackburn flew to London .")
    if task == "ner":
        reference.ents = [reference.char_span(0, 15, "PER"), reference.char_span(24, 30, "LOC")]
    else:
        reference.cats = {"positive": 1.0, "negative": 0.0}
    examples = [Example(nlp.make_doc(reference.text), reference)]
    nlp.initialize(lambda: examples)
    docs = list(nlp.pipe(["Peter Blackburn flew to London .", "A second text ."]))
    features = model.get_ref("tok2vec").predict(docs)  # ner: one array of all tokens; textcat: one per Doc
    assert (len(features) if task == "ner" else sum(len(x) for x in features)) == 10
    settings = config.interpolate()
    losses = nlp.update(examples, drop=settings["training"]["dropout"])  # the rate `spacy train` passes
    assert losses[task] > 0 and ("elmo" not in losses or losses["elmo"] == 0.0)
    # spaCy sets every Dropout layer to [training] dropout: the ELMo dropout a config states is the one it trains with
    encoder = settings["components"][task]["model"]["tok2vec"]
    stated = {encoder[name]["dropout"] for name in ("elmo", "elmo_output") if name in encoder}
    rates = {node.attrs["dropout_rate"] for node in model.walk() if node.name == "dropout"}
    assert rates == {settings["training"]["dropout"]} and stated <= rates and len(stated) == (placement != "none")


def test_a_bcn_pipeline_saves_and_reloads_with_the_same_predictions(elmo_dir, tmp_path):
    config = make_config("textcat", str(elmo_dir), encoder="bcn")
    for name, width in (("width", 16), ("feedforward_width", 8)):
        config["components"]["textcat"]["model"]["tok2vec"][name] = width
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    texts = ["A gorgeous , witty , seductive movie .", "Dull .", ""]
    examples = []
    for text, label in zip(texts, ("positive", "negative", "negative")):
        reference = nlp.make_doc(text)
        reference.cats = {"positive": float(label == "positive"), "negative": float(label == "negative")}
        examples.append(Example(nlp.make_doc(text), reference))
    nlp.initialize(lambda: examples)
    for _ in range(3):
        nlp.update(examples, drop=0.1)
    cats = [doc.cats for doc in nlp.pipe(texts)]
    assert len({round(doc_cats["positive"], 6) for doc_cats in cats}) == 3
    nlp.to_disk(tmp_path / "bcn")
    reloaded = spacy.load(tmp_path / "bcn")
    for doc, expected in zip(reloaded.pipe(texts), cats, strict=True):
        assert doc.cats == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_init_config_writes_the_bcn_encoder_and_names_what_is_wrong(tmp_path):
    result = CliRunner().invoke(app, ["init-config", "textcat", str(tmp_path / "bcn.cfg"), "--encoder", "bcn"])
    assert result.exit_code == 0, result.output
    written = Config().from_disk(tmp_path / "bcn.cfg", interpolate=False)
    assert written["components"]["textcat"]["model"]["tok2vec"] == make_config("textcat", encoder="bcn")[
        "components"]["textcat"]["model"]["tok2vec"]
    for task, encoder, message in (("ner", "bcn", "the bcn encoder is for text classification (textcat), not ner"),
                                   ("textcat", "cnn", "unknown encoder 'cnn'; choose one of bilstm, bcn")):
        result = CliRunner().invoke(app, ["init-config", task, str(tmp_path / "x.cfg"), "--encoder", encoder])
        assert result.exit_code == 2 and message in message_words(result.output), result.output
        assert "Traceback" not in result.output and not (tmp_path / "x.cfg").exists()


def test_the_bcn_encoder_is_for_text_classification_and_unknown_encoders_are_named():
    with pytest.raises(ValueError, match="the bcn encoder is for text classification"):
        make_config("ner", encoder="bcn")
    with pytest.raises(ValueError, match="unknown encoder 'transformer'; choose one of bilstm, bcn"):
        make_config("textcat", encoder="transformer")
    assert make_config("textcat", encoder="bilstm") == make_config("textcat")


def test_the_ner_mix_starts_at_the_top_layer_for_any_layer_count(tmp_path):
    """The shipped NER mix starts weighted to the top layer (softmax([-2, 0, 2])); for a biLM with another number
    of layers init-config spreads the scores evenly over its layers, never a count that fails to build."""
    from hf_elmo import ElmoConfig

    assert make_config("ner")["components"]["ner"]["model"]["tok2vec"]["elmo"]["mix"]["initial_scalars"] == [
        -2.0, 0.0, 2.0]
    ElmoConfig.from_preset("small", n_layers=3).save_pretrained(tmp_path)
    config = make_config("ner", str(tmp_path), elmo="input+output")
    assert config["elmo"]["n_layers"] == 4
    for listener in ("elmo", "elmo_output"):
        scalars = config["components"]["ner"]["model"]["tok2vec"][listener]["mix"]["initial_scalars"]
        assert scalars == pytest.approx([-2.0, -2.0 / 3, 2.0 / 3, 2.0])
    mix = spacy.util.registry.resolve(Config({"x": config.interpolate()["components"]["ner"]["model"]["tok2vec"]
                                                    ["elmo"]["mix"]}))["x"]
    mix.initialize()
    assert mix.get_param("s").tolist() == pytest.approx([-2.0, -2.0 / 3, 2.0 / 3, 2.0])


def test_every_registered_function_is_declared_as_an_entry_point():
    """spaCy finds a plugin's functions through its entry points: a name without one fails (E893) in a config that
    names nothing else of the package (`spacy-elmo.TextCatReduce.v1` on a spaCy tok2vec did), unless something has
    imported the module that registers it. Every `@registry.<kind>("spacy-elmo. ...")` is declared, and its entry
    point loads the registered function."""
    source = "\n".join(path.read_text(encoding="utf-8") for path in Path(spacy_elmo.__file__).parent.rglob("*.py"))
    registered = sorted(set(re.findall(r'@registry\.(\w+)\("(spacy-elmo\.[^"]+)"\)', source)))
    assert ("architectures", "spacy-elmo.TextCatReduce.v1") in registered and len(registered) >= 12
    groups = {f"spacy_{kind}" for kind, _ in registered}
    declared = {(group, point.name): point for group in groups for point in entry_points(group=group)}
    for kind, name in registered:
        assert (f"spacy_{kind}", name) in declared, f"{name} has no spacy_{kind} entry point (setup.cfg)"
        assert declared[f"spacy_{kind}", name].load() is registry.get(kind, name)


@pytest.mark.parametrize("command", [["train"], ["debug", "config"]])
def test_spacy_commands_say_a_misspelt_bilm_name_in_one_line(tmp_path, command):
    """`spacy train config.cfg --paths.elmo_model orignal`: spaCy's own one-line config error (exit 1), the close name
    suggested, instead of a traceback from inside spaCy (the error is also a ConfigValidationError)."""
    from spacy.cli import app as spacy_app
    from spacy.tokens import DocBin

    make_config("ner").to_disk(tmp_path / "config.cfg")
    DocBin(docs=[spacy.blank("en")("A sentence .")]).to_disk(tmp_path / "docs.spacy")
    registry.cli.get_all()  # what the `spacy` command does first: load the `spacy_cli` entry points
    corpus = str(tmp_path / "docs.spacy")
    result = CliRunner().invoke(spacy_app, [*command, str(tmp_path / "config.cfg"), "--paths.train", corpus,
                                            "--paths.dev", corpus, "--paths.elmo_model", "orignal"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    words = message_words(result.output)
    assert "✘ unknown model 'orignal': not a directory" in words and "(did you mean 'original'?)" in words
    assert words.endswith("`paths.elmo_model` in the shipped configs)")
