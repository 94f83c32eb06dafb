"""Fine-tune an ELMo tagger on CoNLL-2003 NER with the transformers Trainer, and report entity F1 on dev.

    python recipes/ner_trainer.py --model default --output_dir runs/ner-trainer        # the embedded biLM
    python recipes/ner_trainer.py --model runs/elmo --num_train_epochs 3 --per_device_train_batch_size 32

`ElmoForTokenClassification` (frozen biLM, learned scalar mix, biLSTM task encoder) on the IOB2 files of
`../shared/data/conll2003/iob2`; word labels go to the words' positions through the tokenizer's `word_ids`
(-100 for `<S>`, `</S>` and padding). The score is conlleval's: entity precision, recall and F1, an entity counting
only when its type and both boundaries are right. The output directory holds the tagger, its tokenizer and its
pipeline: `pipeline("token-classification", model=output_dir, trust_remote_code=True, aggregation_strategy="simple")`
tags raw text. Needs the `train` extra (`pip install ".[train]"`: Accelerate for the
Trainer). Every other argument is a `TrainingArguments` field.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import DataCollatorWithPadding, HfArgumentParser, Trainer, TrainingArguments, pipeline

from hf_elmo import ElmoCharTokenizer, ElmoForTokenClassification, model_location
from hf_elmo.pipeline_elmo import ElmoTokenClassificationPipeline
from spacy_elmo.corpora import conll_sentences

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "conll2003" / "iob2"


@dataclass
class RecipeArguments:
    model: str = field(default="default", metadata={"help": "The biLM: `default`, a directory or a Hub id."})
    train_file: str = field(default=str(DATA / "train.txt"), metadata={"help": "CoNLL-2003 IOB2 training file."})
    dev_file: str = field(default=str(DATA / "valid.txt"), metadata={"help": "CoNLL-2003 IOB2 dev file."})
    limit: int | None = field(default=None, metadata={"help": "Use only the first N sentences of each file."})
    task_hidden_size: int = field(default=128, metadata={"help": "Task biLSTM size per direction."})


def read_sentences(path: str, limit: int | None = None) -> list[tuple[list[str], list[str]]]:
    """(words, IOB2 tags) per sentence of a CoNLL file (the last column is the tag)."""
    sentences = [([row[0] for row in rows], [row[-1] for row in rows]) for rows in conll_sentences(path) if rows]
    return sentences[:limit]


def entity_spans(tags: list[str]) -> set[tuple[str, int, int]]:
    """conlleval's entities of one IOB2 sequence: (type, start, end); an I- tag without a matching open entity
    starts one."""
    spans, start, kind = set(), None, None
    for index, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        if kind is not None and (prefix != "I" or label != kind):
            spans.add((kind, start, index))
            kind = None
        if prefix in ("B", "I") and kind is None:
            start, kind = index, label
    return spans


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity precision, recall and F1 (in %) over sentences."""
    true = found = correct = 0
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        gold_spans, predicted_spans = entity_spans(gold_tags), entity_spans(predicted_tags)
        true, found, correct = true + len(gold_spans), found + len(predicted_spans), correct + len(
            gold_spans & predicted_spans)
    precision = 100 * correct / found if found else 0.0
    recall = 100 * correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def encode(tokenizer: ElmoCharTokenizer, sentences, label_ids: dict[str, int]) -> list[dict]:
    """One feature dict per sentence: character ids and position labels (-100 off the words)."""
    features = []
    for words, tags in sentences:
        encoded = tokenizer(words, is_split_into_words=True)
        features.append({
            "input_ids": encoded["input_ids"],
            "labels": [-100 if word is None else label_ids[tags[word]] for word in encoded.word_ids()],
        })
    return features


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = HfArgumentParser((RecipeArguments, TrainingArguments))
    recipe, training = parser.parse_args_into_dataclasses(argv)
    train, dev = read_sentences(recipe.train_file, recipe.limit), read_sentences(recipe.dev_file, recipe.limit)
    labels = sorted({tag for _, tags in train + dev for tag in tags})
    label_ids = {label: i for i, label in enumerate(labels)}
    location = model_location(recipe.model)
    tokenizer = ElmoCharTokenizer.from_pretrained(location)
    model = ElmoForTokenClassification.from_pretrained(
        location, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_ids,
        task_hidden_size=recipe.task_hidden_size,
    )

    def compute_metrics(prediction) -> dict[str, float]:
        predicted_ids = np.argmax(prediction.predictions, axis=-1)
        gold, predicted = [], []
        for row_labels, row_predicted in zip(prediction.label_ids, predicted_ids):
            keep = row_labels != -100
            gold.append([labels[i] for i in row_labels[keep]])
            predicted.append([labels[i] for i in row_predicted[keep]])
        return entity_scores(gold, predicted)

    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=encode(tokenizer, train, label_ids),
        eval_dataset=encode(tokenizer, dev, label_ids),
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=compute_metrics,
    )
    trainer.train()
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():  # the model and tokenizer with the pipeline that reads them
        tagger = pipeline("token-classification", model=trainer.model, tokenizer=tokenizer,
                          pipeline_class=ElmoTokenClassificationPipeline)
        tagger.save_pretrained(training.output_dir)
    Path(training.output_dir, "dev_metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    print(json.dumps(metrics))
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
