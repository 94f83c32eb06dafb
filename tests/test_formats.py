"""`hf_elmo.formats`: the formats original biLMs come in, side by side behind one protocol, which `elmo convert` and
the loaders go through (a third format is one more `WeightFormat`)."""

from __future__ import annotations

import pytest
from efml_fixtures import make_efml_model
from elmo_fixtures import ALLENNLP, require, tiny_config
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo import ElmoCharTokenizer, ElmoModel, efml_format, loading, original_format
from hf_elmo.formats import FormatError, WeightFormat


def test_each_format_recognises_its_own_files_and_no_other(tmp_path):
    original = [require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5")]
    efml = [make_efml_model(tmp_path / "xx.model")]
    assert loading.FORMATS == (original_format.FORMAT, efml_format.FORMAT)
    assert loading.format_of(original) is original_format.FORMAT and loading.format_of(efml) is efml_format.FORMAT
    for weight_format, sources in ((original_format.FORMAT, efml), (efml_format.FORMAT, original)):
        assert not weight_format.detect(sources)
        with pytest.raises(FormatError):
            weight_format.load(sources)
    with pytest.raises(FormatError, match=r"missing.json does not exist; expected OPTIONS_JSON WEIGHTS_HDF5 "
                                          r"\(bilm-tf / AllenNLP\); or MODEL_DIR_OR_ZIP \(ELMoForManyLangs\)"):
        loading.format_of([tmp_path / "missing.json"])


class ToyFormat(WeightFormat):
    """A third format: a `save_pretrained` directory named `*.toy`."""

    name, usage = "toy", "TOY_DIR"

    def detect(self, sources) -> bool:
        return len(sources) == 1 and str(sources[0]).endswith(".toy")

    def load(self, sources, word_tokenizer=None, progress=False):
        return ElmoModel.from_pretrained(sources[0]).eval(), ElmoCharTokenizer(word_tokenizer=word_tokenizer)


def test_a_third_format_is_one_more_weight_format_that_elmo_convert_goes_through(tmp_path, monkeypatch):
    ElmoModel(tiny_config()).save_pretrained(tmp_path / "model.toy")
    monkeypatch.setattr(loading, "FORMATS", (*loading.FORMATS, ToyFormat()))
    result = CliRunner().invoke(app, ["convert", str(tmp_path / "model.toy"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    card = (tmp_path / "out" / "README.md").read_text()
    assert "Converted from the toy model `model.toy`." in card  # the shared conversion, with its card
    assert ElmoModel.from_pretrained(tmp_path / "out").config.lstm_dim == tiny_config().lstm_dim
