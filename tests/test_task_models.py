"""The task models (`ElmoForTokenClassification`, `ElmoForSequenceClassification`) and the tokenizer's word ids and
offsets they are used with."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from elmo_fixtures import run_without_hf_elmo, tiny_config
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, pipeline

from hf_elmo import ElmoCharTokenizer, ElmoForSequenceClassification, ElmoForTokenClassification, ElmoModel
from hf_elmo.pipeline_elmo import ElmoTokenClassificationPipeline

TAGGED = [  # tag 1 for capitalised words
    ("The bank of England", [1, 0, 0, 1]),
    ("we met Anna in Paris", [0, 0, 1, 0, 1]),
    ("Rates rose", [1, 0]),
    ("nothing here at all", [0, 0, 0, 0]),
]
CLASSIFIED = [("a good film", 1), ("good good", 1), ("a bad film", 0), ("bad , really", 0), ("so good", 1), ("meh", 0)]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("encoder")
    ElmoModel(tiny_config()).save_pretrained(path)
    ElmoCharTokenizer(word_tokenizer="whitespace").save_pretrained(path)
    return path


def token_labels(encoding, tags: list[list[int]]) -> torch.Tensor:
    """Word tags to position labels through `word_ids`: -100 for `<S>`, `</S>` and padding."""
    return torch.tensor([[-100 if w is None else sentence[w] for w in encoding.word_ids(i)]
                         for i, sentence in enumerate(tags)])


def train(model, batch, labels, steps: int = 150) -> list[float]:
    torch.manual_seed(0)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.02)
    model.train()
    losses = []
    for _ in range(steps):
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_auto_classes_load_a_frozen_biLM_with_initialised_task_layers(encoder_dir):
    model = AutoModelForTokenClassification.from_pretrained(encoder_dir, num_labels=3)
    assert isinstance(model, ElmoForTokenClassification) and model.num_labels == 3
    encoder = ElmoModel.from_pretrained(encoder_dir)
    for name, tensor in encoder.state_dict().items():
        assert torch.equal(model.elmo.state_dict()[name], tensor), name
    assert not any(p.requires_grad for p in model.elmo.parameters())
    assert model.scalar_mix.scalar_parameters.tolist() == [0.0, 0.0, 0.0] and model.scalar_mix.gamma.item() == 1.0
    bound = 1 / model.config.task_hidden_size**0.5
    assert all(p.abs().max() <= bound for p in model.encoder.parameters())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    model.train()
    assert not model.elmo.training and model.encoder.training  # a frozen biLM runs as at inference
    unfrozen = AutoModelForSequenceClassification.from_pretrained(encoder_dir, num_labels=2, freeze_elmo=False)
    assert isinstance(unfrozen, ElmoForSequenceClassification)
    assert all(p.requires_grad for p in unfrozen.elmo.parameters())


def test_token_classification_learns_a_toy_tagging_task_and_leaves_the_biLM_alone(encoder_dir):
    tokenizer = ElmoCharTokenizer.from_pretrained(encoder_dir)
    model = ElmoForTokenClassification.from_pretrained(encoder_dir, num_labels=2, classifier_dropout=0.0)
    before = {name: tensor.clone() for name, tensor in model.elmo.state_dict().items()}
    batch = tokenizer([text for text, _ in TAGGED], padding=True, return_tensors="pt")
    labels = token_labels(batch, [tags for _, tags in TAGGED])
    losses = train(model, batch, labels)
    assert losses[-1] < 0.1 * losses[0]
    model.eval()
    with torch.no_grad():
        predicted = model(**batch).logits.argmax(-1)
    assert torch.equal(predicted[labels != -100], labels[labels != -100])
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.elmo.state_dict().items())
    assert model.scalar_mix.scalar_parameters.grad is not None


PIPELINE_CHILD = r"""
import json, sys
sys.path.extend(json.loads(sys.argv[1]))  # see run_without_hf_elmo
from transformers import pipeline

tagger = pipeline("token-classification", model=sys.argv[2], trust_remote_code=True, aggregation_strategy="simple")
entities = tagger(json.loads(sys.argv[3]))
print(json.dumps({"entities": [[{**e, "score": float(e["score"])} for e in row] for row in entities],
                  "class": [type(tagger).__module__.split(".")[0], type(tagger).__name__]}))
"""


@pytest.mark.slow
def test_token_classification_pipeline_groups_words_in_process_and_as_remote_code(encoder_dir, tmp_path):
    tokenizer = ElmoCharTokenizer.from_pretrained(encoder_dir)
    model = ElmoForTokenClassification.from_pretrained(
        encoder_dir, num_labels=3, classifier_dropout=0.0, id2label={0: "O", 1: "B-CAP", 2: "I-CAP"})
    batch = tokenizer([text for text, _ in TAGGED], padding=True, return_tensors="pt")
    train(model, batch, token_labels(batch, [tags for _, tags in TAGGED]))
    tagger = pipeline("token-classification", model=model.eval(), tokenizer=tokenizer, aggregation_strategy="simple",
                      pipeline_class=ElmoTokenClassificationPipeline)
    texts = ["we met  Anna in Paris", "The bank of England"]
    entities = [[(e["entity_group"], e["word"], e["start"], e["end"]) for e in row] for row in tagger(texts)]
    assert entities == [[("CAP", "Anna", 8, 12), ("CAP", "Paris", 16, 21)],
                        [("CAP", "The", 0, 3), ("CAP", "England", 12, 19)]]
    # Pre-split words: spans in the words joined by spaces, as transformers' pipeline gives them.
    split = tagger(["we", "met", "Anna", "in", "Paris"], is_split_into_words=True)
    assert [(e["word"], e["start"], e["end"]) for e in split[0]] == [("Anna", 7, 11), ("Paris", 15, 20)]
    # Saved as a pipeline, the directory builds it again with no hf_elmo: custom_pipelines and its remote code.
    tagger.save_pretrained(tmp_path / "tagger")
    assert json.loads((tmp_path / "tagger" / "config.json").read_text())["custom_pipelines"] == {
        "token-classification": {"impl": "pipeline_elmo.ElmoTokenClassificationPipeline",
                                 "pt": ["AutoModelForTokenClassification"], "type": "text"}}
    output = run_without_hf_elmo(PIPELINE_CHILD, str(tmp_path / "tagger"), json.dumps(texts), cwd=tmp_path)
    remote = json.loads(output.splitlines()[-1])
    assert remote["class"] == ["transformers_modules", "ElmoTokenClassificationPipeline"]
    assert remote["entities"] == [[{**e, "score": pytest.approx(float(e["score"]), abs=1e-5)} for e in row]
                      for row in tagger(texts)]


def test_sequence_classification_learns_a_toy_task_and_round_trips(encoder_dir, tmp_path):
    tokenizer = ElmoCharTokenizer.from_pretrained(encoder_dir)
    model = ElmoForSequenceClassification.from_pretrained(encoder_dir, num_labels=2, classifier_dropout=0.0)
    batch = tokenizer([text for text, _ in CLASSIFIED], padding=True, return_tensors="pt")
    labels = torch.tensor([label for _, label in CLASSIFIED])
    losses = train(model, batch, labels)
    assert losses[-1] < 0.1 * losses[0]
    model.eval()
    with torch.no_grad():
        logits = model(**batch).logits
    assert torch.equal(logits.argmax(-1), labels)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, logits)
    # A sentence's prediction does not depend on its batch (padding included).
    with torch.no_grad():
        alone = reloaded(**tokenizer([CLASSIFIED[2][0]], return_tensors="pt")).logits
    torch.testing.assert_close(alone[0], logits[2], atol=1e-5, rtol=0)
    # transformers' own text-classification pipeline runs it end to end.
    reloaded.config.id2label = {0: "negative", 1: "positive"}
    classify = pipeline("text-classification", model=reloaded, tokenizer=tokenizer)
    assert [result["label"] for result in classify([text for text, _ in CLASSIFIED])] == [
        "positive" if label else "negative" for _, label in CLASSIFIED]


def test_the_loss_adds_the_papers_mix_regulariser(encoder_dir):
    tokenizer = ElmoCharTokenizer.from_pretrained(encoder_dir)
    model = ElmoForSequenceClassification.from_pretrained(encoder_dir, num_labels=3, scalar_mix_l2=0.5).eval()
    with torch.no_grad():
        model.scalar_mix.scalar_parameters.copy_(torch.tensor([1.0, -2.0, 0.5]))
        batch = tokenizer(["a b", "c"], padding=True, return_tensors="pt")
        labels = torch.tensor([2, 0])
        output = model(**batch, labels=labels)
        torch.testing.assert_close(output.loss, F.cross_entropy(output.logits, labels) + 0.5 * (1 + 4 + 0.25))
        regression = ElmoForSequenceClassification.from_pretrained(encoder_dir, num_labels=1).eval()
        values = torch.tensor([0.5, -1.0])
        result = regression(**batch, labels=values)
        torch.testing.assert_close(result.loss, F.mse_loss(result.logits.squeeze(-1), values))


def test_word_ids_and_offsets_of_raw_and_split_text():
    tokenizer = ElmoCharTokenizer(word_tokenizer="elmo")
    text = "Hi, New  York!"
    batch = tokenizer([text, "ok"], padding=True, return_offsets_mapping=True)
    assert batch.word_ids(0) == [None, 0, 1, 2, 3, 4, None] and batch.word_ids(1) == [None, 0, None, *[None] * 4]
    spans = batch["offset_mapping"][0]
    assert [text[start:end] for start, end in spans[1:-1]] == ["Hi", ",", "New", "York", "!"]
    assert spans[0] == spans[-1] == (0, 0) and batch["offset_mapping"][1][2:] == [(0, 0)] * 5
    split = tokenizer([["New", "York"]], is_split_into_words=True, return_offsets_mapping=True, return_tensors="pt")
    assert split["offset_mapping"].tolist() == [[[0, 0], [0, 3], [0, 4], [0, 0]]] and split.word_ids() == [
        None, 0, 1, None]
    left = ElmoCharTokenizer(truncation_side="left")(["a b c d"], truncation=True, max_length=4,
                                                     return_offsets_mapping=True)
    assert left.word_ids(0) == [None, 2, 3, None] and left["offset_mapping"][0][1:3] == [(4, 5), (6, 7)]
