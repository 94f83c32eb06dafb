"""End to end: the shipped configs trained with `spacy train` on CoNLL-2003 and SST-5 slices, then reloaded in a
fresh process without the biLM's source; spaCy's debug / benchmark / package commands; sourcing and
replace_listeners on the trained pipeline."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import spacy
import srsly
import torch
from spacy.cli import app as spacy_app
from spacy.util import registry
from spacy_fixtures import (
    DATA,
    WIDTH,
    convert_fixture,
    run_python,
)
from thinc.api import Config
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo import ElmoModel
from hf_elmo.extras import install_command
from spacy_elmo.cli import app as elmo_app
from spacy_elmo.layers import elmo_shim

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]  # slow: subprocesses and long runs

TEXTS = [
    "The European Commission said on Thursday it disagreed with German advice to consumers.",
    "Peter Blackburn flew from BRUSSELS to London .",
    "",
    "A gorgeous , witty , seductive movie .",
]
# Small task layers, so that a few CPU steps train something.
OVERRIDES = {
    "ner": {
        "components.ner.model.tok2vec.elmo.project_to": 32,
        "components.ner.model.tok2vec.embed.width": 16,
        "components.ner.model.tok2vec.width": 32,
        "training.batcher.size": 300,
        "training.optimizer.learn_rate": 0.005,
    },
    "textcat": {
        "components.textcat.model.tok2vec.elmo.project_to": 32,
        "components.textcat.model.tok2vec.elmo_output.project_to": 32,
        "components.textcat.model.tok2vec.embed.width": 16,
        "components.textcat.model.tok2vec.width": 32,
        "components.textcat.model.maxout_width": 16,
        "training.batcher.size.start": 5000,  # the whole slice in every batch
        "training.batcher.size.stop": 5000,
        "training.optimizer.learn_rate": 0.02,
    },
}
# (converter, input file, options) for the train and dev slices.
CORPORA = {
    "ner": [("convert-conll2003", "conll2003/iob2/train.txt", ["-n", "4", "--limit", "12"]),
            ("convert-conll2003", "conll2003/iob2/valid.txt", ["-n", "4", "--limit", "4"])],
    "textcat": [("convert-sst5", "sst5/train.tsv", ["--limit", "30"]),
                ("convert-sst5", "sst5/dev.tsv", ["--limit", "20"])],
}


def invoke(app, *args: object) -> str:
    result = CliRunner().invoke(app, [str(arg) for arg in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def train(task: str, work: Path, source: Path) -> Path:
    """Corpora, config (`spacy init elmo-config`) and `spacy train`; returns the output directory."""
    paths = []
    for split, (command, input_file, options) in zip(("train", "dev"), CORPORA[task]):
        paths.append(work / f"{task}-{split}.spacy")
        invoke(elmo_app, command, DATA / input_file, paths[-1], *options)
    registry.cli.get_all()  # what the `spacy` command does first: load the `spacy_cli` entry points
    config_path = work / f"{task}.cfg"
    invoke(spacy_app, "init", "elmo-config", task, config_path, "--model", source)
    config = Config().from_disk(config_path, interpolate=False)
    assert config["elmo"] == {"width": WIDTH, "n_layers": 3} and config["system"]["gpu_allocator"] == "pytorch"
    config["training"]["logger"] = {
        "@loggers": "spacy.ConsoleLogger.v3", "progress_bar": None, "console_output": False,
        "output_file": str(work / f"{task}-log.jsonl"),
    }
    config.to_disk(config_path)
    overrides = {**OVERRIDES[task], "training.max_steps": 40, "training.eval_frequency": 10}
    options = [f"--{key}={value}" for key, value in overrides.items()]
    output = work / task
    invoke(spacy_app, "train", config_path, "--output", output, "--paths.train", paths[0], "--paths.dev", paths[1],
           *options)
    invoke(spacy_app, "debug", "config", config_path, "--paths.train", paths[0], "--paths.dev", paths[1])
    return output


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Both tasks trained from a copy of the fixture biLM; the copy is deleted afterwards."""
    work = tmp_path_factory.mktemp("train")
    source = convert_fixture(work / "elmo-source")
    outputs = {task: train(task, work, source) for task in ("ner", "textcat")}
    pretrained = ElmoModel.from_pretrained(source).state_dict()
    shutil.rmtree(source)
    return work, outputs, pretrained


def scalar_mixes(nlp, component) -> list[tuple[np.ndarray, np.ndarray]]:
    """(s, gamma) of each ELMo mix of the component: one at the input (ner), one more at the output (textcat)."""
    nodes = [node for node in nlp.get_pipe(component).model.walk(order="dfs_pre") if node.name == "elmo_scalar_mix"]
    return [(node.get_param("s"), node.get_param("gamma")) for node in nodes]


@pytest.mark.parametrize("task", ["ner", "textcat"])
def test_losses_fall_and_the_task_mix_trains(trained, task):
    work, _, _ = trained
    log = [json.loads(line) for line in (work / f"{task}-log.jsonl").read_text().splitlines()]
    losses = [entry["losses"][task] for entry in log if entry["step"] > 0]  # sums over 10 steps each
    assert len(losses) == 4 and losses == sorted(losses, reverse=True) and losses[-1] < 0.9 * losses[0], losses


@pytest.mark.parametrize("task", ["ner", "textcat"])
def test_mix_trained_and_frozen_biLM_bit_identical(trained, task):
    _, outputs, pretrained = trained
    nlp = spacy.load(outputs[task] / "model-last")
    mixes = scalar_mixes(nlp, task)
    assert len(mixes) == {"ner": 1, "textcat": 2}[task]
    for s, gamma in mixes:
        assert np.abs(s).max() > 1e-3 and abs(float(gamma[0]) - 1.0) > 1e-3
    state = elmo_shim(nlp.get_pipe("elmo").model).elmo.state_dict()
    assert state.keys() == pretrained.keys()
    assert all(torch.equal(state[name], pretrained[name]) for name in state)


RELOAD_SCRIPT = """
import json, sys
import numpy as np, spacy

texts, output, WIDTH = json.loads(sys.argv[1]), sys.argv[2], 32
arrays, annotations = {}, []
assert "spacy_elmo" not in sys.modules
spacy.blank("en").add_pipe("elmo")  # the factory comes from the `spacy_factories` entry point
assert "spacy_elmo" in sys.modules
for name, path in json.loads(sys.argv[3]).items():
    nlp = spacy.load(path)
    docs = list(nlp.pipe(texts))
    features = nlp.get_pipe(name).model.get_ref("tok2vec").predict(docs)  # the task's mix and layers above
    arrays[f"{name}-features"] = np.concatenate(features) if isinstance(features, list) else features
    for i, doc in enumerate(docs):
        arrays[f"{name}-layers-{i}"] = doc._.elmo_layers
        arrays[f"{name}-vectors-{i}"] = np.array([token.vector for token in doc]).reshape(len(doc), WIDTH)
        annotations.append([[(e.start, e.end, e.label_) for e in doc.ents], doc.cats])
np.savez(output + ".npz", **arrays)
json.dump(annotations, open(output + ".json", "w"))
"""


def predictions(pipelines: dict[str, Path], texts: list[str]):
    arrays, annotations = {}, []
    for name, path in pipelines.items():
        nlp = spacy.load(path)
        docs = list(nlp.pipe(texts))
        features = nlp.get_pipe(name).model.get_ref("tok2vec").predict(docs)
        arrays[f"{name}-features"] = np.concatenate(features) if isinstance(features, list) else features
        for i, doc in enumerate(docs):
            arrays[f"{name}-layers-{i}"] = doc._.elmo_layers
            arrays[f"{name}-vectors-{i}"] = np.array([token.vector for token in doc]).reshape(len(doc), WIDTH)
            annotations.append([[[e.start, e.end, e.label_] for e in doc.ents], doc.cats])
    return arrays, annotations


def test_saved_pipelines_reload_in_a_fresh_process_without_the_biLM_source(trained, tmp_path):
    work, outputs, _ = trained
    assert not (work / "elmo-source").exists()
    pipelines = {task: str(output / "model-last") for task, output in outputs.items()}
    run_python(RELOAD_SCRIPT, json.dumps(TEXTS), tmp_path / "fresh", json.dumps(pipelines))
    arrays, annotations = predictions(pipelines, TEXTS)
    fresh = np.load(tmp_path / "fresh.npz")
    assert sorted(fresh.files) == sorted(arrays)
    for name, array in arrays.items():  # float32 rounding may differ with memory layout (see test_spacy_component)
        np.testing.assert_allclose(fresh[name], array, atol=1e-5, rtol=1e-5, err_msg=name)
    fresh_annotations = json.loads((tmp_path / "fresh.json").read_text())
    assert [ents for ents, _ in fresh_annotations] == [ents for ents, _ in annotations]
    for (_, fresh_cats), (_, cats) in zip(fresh_annotations, annotations):
        assert fresh_cats == pytest.approx(cats, abs=1e-6)
    assert any(cats for _, cats in annotations)


def test_spacy_benchmark_and_package_work_on_the_trained_pipeline(trained, tmp_path):
    work, outputs, _ = trained
    model = outputs["ner"] / "model-best"
    accuracy = invoke(spacy_app, "benchmark", "accuracy", model, work / "ner-dev.spacy", "--output",
                      tmp_path / "scores.json")
    assert "NER P" in accuracy and "ents_f" in srsly.read_json(tmp_path / "scores.json")
    speed = invoke(spacy_app, "benchmark", "speed", model, work / "ner-dev.spacy", "--batches", 30, "--warmup", 1,
                   "--batch-size", 1)
    assert "words/s" in speed
    # The sdist through `python -m build` (the dev extra has it; without it spaCy falls back to setup.py, deprecated).
    packaged = invoke(spacy_app, "package", model, tmp_path, "--name", "elmo_ner", "--version", "0.0.1", "--build",
                      "sdist")
    assert "Falling back" not in packaged and (tmp_path / "en_elmo_ner-0.0.1/dist/en_elmo_ner-0.0.1.tar.gz").is_file()
    meta = srsly.read_json(tmp_path / "en_elmo_ner-0.0.1" / "meta.json")
    # The distribution providing the factory is `spacy-elmo` (`elmo` on PyPI is another project).
    assert any(requirement.startswith("spacy-elmo>=") for requirement in meta["requirements"]), meta["requirements"]


def tok2vec_outputs(nlp, texts):
    """The NER model's token features (ELMo mix, biLSTM, projection) of all `texts`' tokens."""
    return nlp.get_pipe("ner").model.get_ref("tok2vec").predict(list(nlp.pipe(texts)))


def test_sourced_and_replaced_listeners_reload(trained, tmp_path):
    _, outputs, _ = trained
    trained_path = str(outputs["ner"] / "model-last")
    expected = tok2vec_outputs(spacy.load(trained_path), TEXTS)
    config = Config().from_str(f"""
        [nlp]
        lang = "en"
        pipeline = ["elmo", "ner"]

        [components]

        [components.elmo]
        source = "{trained_path}"

        [components.ner]
        source = "{trained_path}"
        """)
    sourced = spacy.util.load_model_from_config(config, auto_fill=True)
    assert sourced.get_pipe("elmo").listening_components == ["ner"]
    np.testing.assert_allclose(tok2vec_outputs(sourced, TEXTS), expected, atol=1e-5)

    config["components"]["ner"]["replace_listeners"] = ["model.tok2vec.elmo"]  # nested in Tok2VecWithElmo.v1
    standalone = spacy.util.load_model_from_config(config, auto_fill=True)
    assert standalone.get_pipe("elmo").listening_components == []
    elmo = standalone.config["components"]["ner"]["model"]["tok2vec"]["elmo"]
    assert elmo["@architectures"] == "spacy-elmo.Tok2VecElmo.v1" and elmo["freeze"] is True
    standalone.remove_pipe("elmo")
    standalone.to_disk(tmp_path / "standalone")
    reloaded = spacy.load(tmp_path / "standalone")
    np.testing.assert_allclose(tok2vec_outputs(reloaded, TEXTS), expected, atol=1e-5)


def test_mix_weights_cli_reads_every_task_mix_beside_its_start(trained, tmp_path, monkeypatch):
    """Each task mix's learned softmax(s) and gamma, with their values at the start of training (the config's
    initial_scalars, gamma 1) in brackets, by layer name; the plot; without matplotlib, one line naming the extra."""
    _, outputs, _ = trained
    path = outputs["textcat"] / "model-last"
    output = invoke(elmo_app, "mix-weights", path, "--plot", tmp_path / "weights.png")
    lines = output.splitlines()
    assert lines[0].split() == ["component", "position", "token", "biLSTM", "1", "biLSTM", "2", "gamma"]
    assert [line.split()[:2] for line in lines[1:3]] == [["textcat", "input"], ["textcat", "output"]]
    assert lines[3].startswith("learned softmax(s) per layer and gamma; in brackets, their values at the start")
    nlp = spacy.load(path)
    tok2vec = nlp.config["components"]["textcat"]["model"]["tok2vec"]
    for line, (s, gamma), slot in zip(lines[1:3], scalar_mixes(nlp, "textcat"), ("elmo", "elmo_output")):
        weights = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        start = np.asarray(tok2vec[slot]["mix"]["initial_scalars"] or [0.0, 0.0, 0.0])
        start = np.exp(start - start.max()) / np.exp(start - start.max()).sum()
        cells = [float(value.strip("()")) for value in line.split()[2:]]
        assert cells[0::2] == pytest.approx([*weights, gamma[0]], abs=1e-3)
        assert cells[1::2] == pytest.approx([*start, 1.0], abs=1e-3)
    assert (tmp_path / "weights.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert invoke(app, "mix-weights", path) == invoke(elmo_app, "mix-weights", path)  # `elmo mix-weights` too
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    result = CliRunner().invoke(elmo_app, ["mix-weights", str(path), "--plot", str(tmp_path / "again.png")])
    assert result.exit_code == 1 and not (tmp_path / "again.png").exists()
    assert result.stderr.strip().splitlines()[-1] == f"Error: --plot needs matplotlib: {install_command('plots')}"


GPU_TRAINING_SCRIPT = """
import sys, warnings
import numpy as np, spacy
from spacy.training import Example
from thinc.api import Adam, fix_random_seed
from spacy_elmo.cli import make_config

SENTENCES = [("Peter Blackburn flew from Brussels to London .", [(0, 15, "PER"), (26, 34, "LOC"), (38, 44, "LOC")]),
             ("The European Commission said on Thursday it disagreed .", [(4, 23, "ORG")]),
             ("Germany 's representative to the EU , Werner Zwingmann , said", [(0, 7, "LOC"), (33, 35, "ORG"),
                                                                             (38, 54, "PER")])]
figures = {}
for device in sys.argv[2].split(","):
    if device == "gpu":
        spacy.require_gpu(0)
    fix_random_seed(0)
    config = make_config(sys.argv[3])  # the default biLM: no clipping, so cuDNN's LSTM on a GPU
    tok2vec = config["components"]["ner"]["model"]["tok2vec"]
    tok2vec["width"], tok2vec["embed"]["width"], tok2vec["elmo"]["project_to"] = 32, 16, 32
    nlp = spacy.util.load_model_from_config(config, auto_fill=True)
    examples = [Example.from_dict(nlp.make_doc(text), {"entities": ents}) for text, ents in SENTENCES]
    nlp.initialize(lambda: examples)
    optimizer, losses = Adam(0.01), []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning at any step, from this project or its dependencies
        for _ in range(6):
            step = {}
            nlp.update(examples, sgd=optimizer, losses=step)
            losses.append(step["ner"])
    mix = next(node for node in nlp.get_pipe("ner").model.walk() if node.name == "elmo_scalar_mix")
    figures[f"{device}-losses"] = np.array(losses)
    figures[f"{device}-mix"] = np.concatenate([mix.ops.to_numpy(mix.get_param(name)) for name in ("s", "gamma")])
np.savez(sys.argv[1], **figures)
"""


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_steps_on_a_gpu_match_the_cpus_and_warn_nothing(tmp_path):
    """`nlp.update` of the shipped NER config (the default biLM, frozen, through cuDNN) under `spacy.require_gpu()`:
    the losses and the trained mix of six steps are the CPU's to float rounding, and no step warns."""
    run_python(GPU_TRAINING_SCRIPT, tmp_path / "figures.npz", "cpu,gpu", "ner")
    figures = np.load(tmp_path / "figures.npz")
    for device in ("cpu", "gpu"):
        assert figures[f"{device}-losses"][-1] < 0.5 * figures[f"{device}-losses"][0]  # it trains
    np.testing.assert_allclose(figures["gpu-losses"], figures["cpu-losses"], rtol=2e-3, atol=1e-3)
    np.testing.assert_allclose(figures["gpu-mix"], figures["cpu-mix"], rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("n_mixes", [1, 2, 5])
def test_the_mix_weights_plot_shows_its_title_and_labels_whole(tmp_path, monkeypatch, n_mixes):
    """Every text of the figure inside it, however few mixes (one mix made a figure of 432 px, its title cut)."""
    import matplotlib.pyplot as plt

    from spacy_elmo.mix_weights import MixWeights, plot_mix_weights

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", figures.append)
    mixes = [MixWeights(f"component{i}", "input" if i % 2 else "", np.array([0.2, 0.3, 0.5]), 1.25,
                        np.full(3, 1 / 3)) for i in range(n_mixes)]
    assert plot_mix_weights(mixes, tmp_path / "weights.png").read_bytes()[:4] == b"\x89PNG"
    [figure] = figures
    renderer = figure.canvas.get_renderer()
    axis = figure.axes[0]
    texts = [axis.title, *axis.get_xticklabels(), axis.yaxis.label, axis.get_legend()]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1, text
        assert figure.bbox.y0 <= box.y0 and box.y1 <= figure.bbox.y1, text
    close(figure)
