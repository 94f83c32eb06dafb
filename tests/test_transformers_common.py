"""transformers' own common model and config tests (`ModelTesterMixin`, `ConfigTester`, from the transformers sdist:
see transformers_tests.py) on the biLM, the pretraining head and the task models, as every model in transformers
runs them."""

from __future__ import annotations

import os
import sys
import unittest

import pytest
import torch
from elmo_fixtures import tiny_config
from transformers_tests import KEPT, PACKAGE, ROOT

from hf_elmo import (
    ElmoCharTokenizer,
    ElmoConfig,
    ElmoForBidirectionalLM,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoModel,
)

if not all((PACKAGE / name).is_file() for name in KEPT):
    message = f"transformers' common tests are not in {PACKAGE}: run `python tests/transformers_tests.py` (make does)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError(message)
    pytest.skip(message, allow_module_level=True)
sys.path.insert(0, str(ROOT))
from transformers_common.test_configuration_common import ConfigTester  # noqa: E402
from transformers_common.test_modeling_common import ModelTesterMixin  # noqa: E402

SENTENCES = [["The", "bank", "raised", "rates", "."], ["A", "river"], ["x"]]
NUM_LABELS = 3


class ElmoModelTester:
    """What transformers' common tests read: a tiny config (every feature on) and a batch of three sentences."""

    def __init__(self, parent: unittest.TestCase):
        self.parent = parent
        self.batch_size = len(SENTENCES)
        self.seq_length = max(map(len, SENTENCES)) + 2  # the <S> and </S> positions are hidden states too
        self.num_hidden_layers = 2  # biLSTM layers; hidden_states hold one more, the token layer
        self.hidden_size = 16  # config.hidden_size: the output width 2 * projection_dim
        self.vocab_size = 11
        self.is_training = True

    def get_config(self) -> ElmoConfig:
        return tiny_config(vocab_size=self.vocab_size, num_labels=NUM_LABELS)

    def prepare_config_and_inputs_for_common(self) -> tuple[ElmoConfig, dict[str, torch.Tensor]]:
        batch = ElmoCharTokenizer()(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
        return self.get_config(), {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


class ElmoCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (ElmoModel, ElmoForBidirectionalLM, ElmoForTokenClassification, ElmoForSequenceClassification)
    has_attentions = False  # an LSTM
    test_resize_embeddings = False  # characters, not a token vocabulary: resize_token_embeddings raises (test_model)
    test_torch_exportable = False  # torch.export is tested by test_model.py (the masked kernels)

    def setUp(self) -> None:
        self.model_tester = ElmoModelTester(self)
        self.config_tester = ConfigTester(self, config_class=ElmoConfig, has_text_modality=False,
                                          common_properties=["hidden_size", "num_hidden_layers"],
                                          **tiny_config().to_diff_dict())

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        """transformers adds labels for the classes of its own auto mappings; these are the heads' labels."""
        inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels)
        if return_labels:
            batch, positions = inputs["input_ids"].shape[:2]
            generator = torch.Generator().manual_seed(0)
            if model_class is ElmoForBidirectionalLM:
                inputs["labels"] = torch.randint(self.model_tester.vocab_size, (batch, positions), generator=generator)
            elif model_class is ElmoForTokenClassification:
                inputs["labels"] = torch.randint(NUM_LABELS, (batch, positions), generator=generator)
            elif model_class is ElmoForSequenceClassification:
                inputs["labels"] = torch.randint(NUM_LABELS, (batch,), generator=generator)
        return inputs

    def test_config(self) -> None:
        self.config_tester.run_common_tests()

    def test_training(self) -> None:
        """The heads train (transformers leaves base models out by its own auto mapping, which lists only its
        models)."""
        classes = self.all_model_classes
        try:
            self.all_model_classes = classes[1:]
            super().test_training()
        finally:
            self.all_model_classes = classes

    def test_model_outputs_equivalence(self) -> None:
        """As transformers' (`return_dict=False` gives `to_tuple()` of the output), comparing exactly: its own copy
        computes `a - b` of every tensor for its message, which bool tensors (`ElmoModelOutput.attention_mask`)
        refuse."""
        config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()

        def flat(value) -> list:
            if isinstance(value, (list, tuple)):
                return [item for element in value for item in flat(element)]
            return [] if value is None else [value]

        for model_class in self.all_model_classes:
            model = model_class(config).eval()
            for return_labels in (False, True):
                inputs = self._prepare_for_class(inputs_dict, model_class, return_labels)
                with torch.no_grad():
                    as_tuple = flat(model(**inputs, return_dict=False))
                    as_dict = flat(model(**inputs, return_dict=True).to_tuple())
                assert len(as_tuple) == len(as_dict) > 0, model_class
                for a, b in zip(as_tuple, as_dict, strict=True):
                    assert a.dtype == b.dtype and torch.equal(a, b), model_class
