"""recipes/ner_trainer.py: conlleval's entity scores, and a short Trainer run end to end."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
from elmo_fixtures import require, tiny_config
from spacy_fixtures import DATA, REPO, run_python
from transformers import pipeline

from hf_elmo import ElmoCharTokenizer, ElmoForTokenClassification, ElmoModel

pytestmark = pytest.mark.slow  # subprocesses and long runs: left out of the fast subset

spec = importlib.util.spec_from_file_location("ner_trainer", REPO / "recipes" / "ner_trainer.py")
ner_trainer = sys.modules["ner_trainer"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(ner_trainer)


@pytest.mark.parametrize(
    ("tags", "spans"),
    [
        (["B-PER", "I-PER", "O", "B-LOC"], {("PER", 0, 2), ("LOC", 3, 4)}),
        (["I-ORG", "I-ORG", "B-ORG", "O"], {("ORG", 0, 2), ("ORG", 2, 3)}),  # I- opening an entity, as conlleval
        (["B-PER", "I-LOC", "O"], {("PER", 0, 1), ("LOC", 1, 2)}),
        (["O", "O"], set()),
    ],
)
def test_entity_spans_follow_conlleval(tags, spans):
    assert ner_trainer.entity_spans(tags) == spans


def test_entity_scores_count_only_exact_entities():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "O", "O", "B-LOC"], ["B-ORG", "B-MISC"]]  # 2 of 4 predicted right, 2 of 3 gold found
    scores = ner_trainer.entity_scores(gold, predicted)
    assert scores["precision"] == pytest.approx(50.0) and scores["recall"] == pytest.approx(200 / 3)
    assert scores["f1"] == pytest.approx(2 * 50 * (200 / 3) / (50 + 200 / 3))


def test_the_recipe_trains_and_reports_dev_entity_f1(tmp_path):
    train = require(DATA / "conll2003" / "iob2" / "train.txt")
    torch.manual_seed(0)
    ElmoModel(tiny_config()).save_pretrained(tmp_path / "bilm")
    ElmoCharTokenizer().save_pretrained(tmp_path / "bilm")
    out = tmp_path / "out"
    output = run_python(
        REPO / "recipes" / "ner_trainer.py", "--model", tmp_path / "bilm", "--train_file", train, "--dev_file", train,
        "--limit", 64, "--output_dir", out, "--max_steps", 4, "--per_device_train_batch_size", 16,
        "--learning_rate", "0.01", "--report_to", "none", "--save_strategy", "no", "--use_cpu", "true",
        "--disable_tqdm", "true",
    )
    metrics = json.loads((out / "dev_metrics.json").read_text())
    assert json.loads(output.strip().splitlines()[-1]) == metrics
    assert {"eval_precision", "eval_recall", "eval_f1", "eval_loss"} <= set(metrics)
    assert 0 <= metrics["eval_f1"] <= 100
    tagger = ElmoForTokenClassification.from_pretrained(out)
    assert tagger.config.id2label[0] == "B-LOC" and tagger.num_labels == 9
    # Saved with its pipeline: transformers builds ElmoTokenClassificationPipeline from the directory.
    ner = pipeline("token-classification", model=str(out), trust_remote_code=True)
    assert type(ner).__name__ == "ElmoTokenClassificationPipeline" and ner.model.num_labels == 9
    words = ner(text := "Peter Blackburn lives in Brussels.", ignore_labels=[])  # every word, with its label
    assert [(e["word"], text[e["start"]:e["end"]]) for e in words] == [
        (w, w) for w in ["Peter", "Blackburn", "lives", "in", "Brussels", "."]]
