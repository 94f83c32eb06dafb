"""Push to a Hub-compatible server on 127.0.0.1 (tests/fake_hub.py, the real client), then load back: the repo
files and model card, remote code in a fresh process where `hf_elmo` cannot be imported, offline loading
from that process's cache, and the package classes in-process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import numpy as np
import pytest
import torch
from elmo_fixtures import ALLENNLP, require, run_without_hf_elmo, tiny_config
from fake_hub import FakeHub, hub_env, patch_hub_client
from huggingface_hub import ModelCard, create_repo, hf_hub_download, list_repo_files, upload_file
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, AutoTokenizer

import hf_elmo
from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoForBidirectionalLM, ElmoModel
from hf_elmo.cards import (
    RANDOM_WEIGHTS_SOURCE,
    CardMetadata,
    build_model_card,
    card_metadata,
    card_source,
    weights_source,
)
from hf_elmo.hub import REMOTE_CODE, REMOTE_CODE_LIBRARIES, REMOTE_CODE_OPTIONAL, push_to_hub
from hf_elmo.original_format import FORMAT

pytestmark = pytest.mark.slow  # subprocesses and long runs: left out of the fast subset

LM_REPO, CONVERTED_REPO = "org/tiny-elmo-lm", "org/elmo-allennlp"
TINY_SOURCE = "Random weights for the tests of the `elmo` project (`torch.manual_seed(0)`)."
CONVERTED_SOURCE = "Converted from the original weights `options.json` + `lm_weights.hdf5`."
SENTENCES = [["The", "bank", "raised", "rates", "."], ["Élan", "naïve", "café", "日本", "—", "x" * 60], ["Hi"]]
REPO_FILES = {
    ".gitattributes", "README.md", "added_tokens.json", "config.json", "model.safetensors", "tokenizer_config.json",
    *REMOTE_CODE,
}


@pytest.fixture(scope="module")
def tiny_lm() -> tuple[ElmoForBidirectionalLM, ElmoCharTokenizer]:
    torch.manual_seed(0)
    return ElmoForBidirectionalLM(tiny_config(vocab_size=13)).eval(), ElmoCharTokenizer()


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[ElmoModel, ElmoCharTokenizer]:
    """The AllenNLP test biLM, converted into a directory (with its card) and loaded from there."""
    options, weights = require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5")
    directory = FORMAT.convert([options, weights], tmp_path_factory.mktemp("converted"))
    return ElmoModel.from_pretrained(directory).eval(), ElmoCharTokenizer.from_pretrained(directory)


def push_both(tiny_lm, converted) -> None:
    """The LM with `hf_elmo.hub.push_to_hub` and the card's source given; the converted model with it too, its
    source read from the card `convert` wrote."""
    push_to_hub(*tiny_lm, LM_REPO, source=TINY_SOURCE)
    push_to_hub(*converted, CONVERTED_REPO)


@pytest.fixture(scope="module")
def pushed(fake_hub: FakeHub, tiny_lm, converted) -> FakeHub:
    push_both(tiny_lm, converted)
    return fake_hub


def expected_outputs(tokenizer, model: ElmoModel, lm: ElmoForBidirectionalLM | None = None) -> dict[str, np.ndarray]:
    """What the child process computes (CHILD_CODE), from the objects of this process."""
    batch = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    arrays = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        arrays |= {f"hidden_{i}": layer for i, layer in enumerate(model(**batch).hidden_states)}
        if lm is not None:
            output = lm(**batch)
            arrays |= {"forward_logits": output.forward_logits, "backward_logits": output.backward_logits}
    return {name: value.numpy() for name, value in arrays.items()}


def assert_same_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(actual) == sorted(expected)
    for name, array in expected.items():
        assert actual[name].shape == array.shape, name
        if array.dtype.kind == "f":  # bit-identical in practice; a thread-count change may move the last bits
            np.testing.assert_allclose(actual[name], array, rtol=0, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(actual[name], array, err_msg=name)


# -- repo contents and model card ---------------------------------------------------------------------------


def test_the_remote_code_files_import_the_libraries_they_may_and_each_other_alone():
    """`hub.REMOTE_CODE` is what the Hub's remote code is: every file there imports the standard library, its
    libraries and files of the list alone (an optional library only inside a function), and the list holds every
    file they import."""
    import ast

    package = Path(hf_elmo.__file__).parent
    allowed = set(sys.stdlib_module_names) | set(REMOTE_CODE_LIBRARIES)
    for name in REMOTE_CODE:
        tree = ast.parse((package / name).read_text(encoding="utf-8"))
        top_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:  # a file of the package
                imported = [node.module] if node.module else [alias.name for alias in node.names]
                assert all(f"{module.split('.')[0]}.py" in REMOTE_CODE for module in imported), (name, imported)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                roots = {alias.name.split(".")[0] for alias in node.names} if isinstance(node, ast.Import) else {
                    node.module.split(".")[0]}
                permitted = allowed if id(node) in top_level else allowed | set(REMOTE_CODE_OPTIONAL)
                assert roots <= permitted, (name, roots - permitted)


@pytest.mark.parametrize("repo_id", [LM_REPO, CONVERTED_REPO])
def test_pushed_repo_has_weights_tokenizer_card_remote_code_and_auto_maps(pushed, repo_id, tiny_lm, converted):
    assert set(list_repo_files(repo_id)) == REPO_FILES
    config = json.loads(Path(hf_hub_download(repo_id, "config.json")).read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_elmo.ElmoConfig",
        "AutoModel": "modeling_elmo.ElmoModel",
        "AutoModelForPreTraining": "modeling_elmo.ElmoForBidirectionalLM",
        "AutoModelForTokenClassification": "modeling_elmo.ElmoForTokenClassification",
        "AutoModelForSequenceClassification": "modeling_elmo.ElmoForSequenceClassification",
    }
    assert config["model_type"] == "elmo"
    tokenizer_config = json.loads(Path(hf_hub_download(repo_id, "tokenizer_config.json")).read_text())
    assert tokenizer_config["auto_map"] == {"AutoTokenizer": ["tokenization_elmo.ElmoCharTokenizer", None]}
    package = Path(hf_elmo.__file__).parent
    for name in REMOTE_CODE:  # the package's own modules, byte for byte
        assert Path(hf_hub_download(repo_id, name)).read_bytes() == (package / name).read_bytes(), name
    model = tiny_lm[0] if repo_id == LM_REPO else converted[0]
    weights = load_file(hf_hub_download(repo_id, "model.safetensors"))
    state = model.state_dict()
    assert sorted(weights) == sorted(state)
    for name, tensor in state.items():
        assert torch.equal(weights[name], tensor), name


def test_card_of_the_push_helper_describes_model_source_and_usage(pushed, tiny_lm):
    card = ModelCard.load(LM_REPO)
    assert card.data.library_name == "transformers" and card.data.license == "apache-2.0"
    assert card.data.pipeline_tag == "feature-extraction"
    assert {"elmo", "bilm", "custom_code"} <= set(card.data.tags)
    assert card_source(card.text) == TINY_SOURCE
    n_parameters = sum(p.numel() for p in tiny_lm[0].parameters())
    for line in (
        "| character CNN | 28 filters [[1, 4], [2, 8], [3, 16]], relu, char embedding 4 |",
        "| highway layers | 2 |",
        "| biLSTM | 2 layers per direction, cell 24, projection 8 |",
        "| clipping | cell 3.0, projection 3.0 |",
        "| output layers | 3 of width 16: the token layer duplicated, then each biLSTM layer |",
        "| word softmax | 13 words, shared by both directions |",
        f"| parameters | {n_parameters:,} |",
        f'tokenizer = AutoTokenizer.from_pretrained("{LM_REPO}", trust_remote_code=True)',
        f'model = AutoModel.from_pretrained("{LM_REPO}", trust_remote_code=True).eval()',
        f'`AutoModelForPreTraining.from_pretrained("{LM_REPO}", trust_remote_code=True)`',
        f'nlp.add_pipe("elmo", config={{"model": {{"name": "{LM_REPO}"}}}})',
        "doc._.elmo_layers  # (3, n_tokens, 16)",
    ):
        assert line in card.text, line
    assert "path/to/model" not in card.text


def test_push_to_hub_writes_the_card_and_keeps_the_converted_source(pushed, converted):
    card = ModelCard.load(CONVERTED_REPO)
    # The source written by `convert` survives from_pretrained + push_to_hub.
    assert card_source(card.text) == CONVERTED_SOURCE
    options = json.loads((ALLENNLP / "options.json").read_text())
    lstm = options["lstm"]
    projection = f"projection {lstm['projection_dim']}"
    assert f"| biLSTM | {lstm['n_layers']} layers per direction, cell {lstm['dim']}, {projection} |" in card.text
    assert f"| highway layers | {options['char_cnn']['n_highway']} |" in card.text
    assert f"| parameters | {sum(p.numel() for p in converted[0].parameters()):,} |" in card.text
    assert "| word softmax | none (encoder only) |" in card.text
    assert f'AutoModel.from_pretrained("{CONVERTED_REPO}", trust_remote_code=True)' in card.text
    assert "AutoModelForPreTraining" not in card.text  # no softmax to load
    assert {"elmo", "custom_code"} <= set(card.data.tags)


def test_push_to_hub_on_a_new_repo_writes_the_card_with_its_tags(fake_hub):
    torch.manual_seed(1)
    push_to_hub(ElmoModel(tiny_config()), None, "org/fresh", tags=["my-tag"])
    card = ModelCard.load("org/fresh")
    assert card_source(card.text) == RANDOM_WEIGHTS_SOURCE
    assert card.data.tags[-1] == "my-tag" and "elmo" in card.data.tags
    assert '"org/fresh"' in card.text and "# ELMo biLM" in card.text


def test_transformers_push_to_hub_works_as_for_any_model_and_keeps_a_card_written_by_hand(fake_hub):
    readme = "---\nlicense: mit\n---\n\n# My ELMo\n\nNotes by hand.\n"
    create_repo("org/hand-card")
    upload_file(path_or_fileobj=readme.encode(), path_in_repo="README.md", repo_id="org/hand-card")
    torch.manual_seed(1)
    model = ElmoModel(tiny_config())
    model.push_to_hub("org/hand-card")
    card = ModelCard.load("org/hand-card")
    assert card.data.license == "mit" and "Notes by hand." in card.text and card_source(card.text) is None
    assert torch.equal(ElmoModel.from_pretrained("org/hand-card").bilstm.layers[0].bias, model.bilstm.layers[0].bias)


def test_weights_source_names_no_local_path(tmp_path):
    model = ElmoModel(tiny_config())
    assert weights_source(model) == RANDOM_WEIGHTS_SOURCE
    model.save_pretrained(tmp_path)  # no card: the source is unknown, and the directory is not named
    reloaded = ElmoModel.from_pretrained(tmp_path)
    assert weights_source(reloaded).startswith("Not recorded") and str(tmp_path) not in weights_source(reloaded)
    reloaded.name_or_path = "org/some-elmo"
    assert weights_source(reloaded) == "The weights of the Hub model `org/some-elmo` (see its model card)."


def test_card_metadata_language_from_the_word_tokenizer_datasets_and_base_model():
    config = tiny_config()
    assert ModelCard(str(build_model_card(config, "x"))).data.language is None
    config.word_tokenizer = "spacy:en"
    card = build_model_card(config, "x", metadata=CardMetadata(datasets=["org/corpus"], base_model="org/elmo"))
    assert card_metadata(str(card)) == CardMetadata(language="en", datasets=["org/corpus"], base_model="org/elmo")


def card_snippet(repo_id: str, first_line: str) -> str:
    """The ```python block of the repo's card that starts with `first_line`."""
    blocks = re.findall(r"^```python\n(.*?)^```", ModelCard.load(repo_id).text, re.DOTALL | re.MULTILINE)
    [block] = [block for block in blocks if block.startswith(first_line)]
    return block


def converted_layers(converted, words: list[str]) -> tuple[torch.Tensor, ...]:
    model, tokenizer = converted
    with torch.no_grad():
        return model(**tokenizer([words], is_split_into_words=True, return_tensors="pt")).hidden_states


def test_card_transformers_snippet_runs_against_the_pushed_repo(pushed, converted):
    namespace: dict = {}
    exec(card_snippet(CONVERTED_REPO, "import torch\nfrom transformers import"), namespace)
    expected = converted_layers(converted, ["The", "bank", "of", "the", "river", "."])
    assert len(namespace["layers"]) == len(expected) == 3
    for actual, layer in zip(namespace["layers"], expected):
        assert actual.shape == (1, 8, 32)
        torch.testing.assert_close(actual, layer, rtol=0, atol=1e-6)


def test_card_spacy_snippet_runs_against_the_pushed_repo(pushed, converted):
    # spaCy and spacy_elmo are test dependencies (the dev extra): a failing import must fail the test.
    namespace: dict = {}
    exec(card_snippet(CONVERTED_REPO, "import spacy"), namespace)
    doc = namespace["doc"]
    assert [token.text for token in doc] == ["The", "bank", "of", "the", "river", "."]
    expected = torch.stack(converted_layers(converted, [token.text for token in doc]))[:, 0, 1:-1]  # no <S>, </S>
    assert doc._.elmo_layers.shape == (3, 6, 32)
    np.testing.assert_allclose(np.asarray(doc._.elmo_layers), expected.numpy(), rtol=0, atol=1e-5)


# -- loading in this process: the installed package's classes -------------------------------------------------


def test_from_pretrained_of_pushed_repo_gives_the_package_classes(pushed, tiny_lm):
    lm, tokenizer = tiny_lm
    config = AutoConfig.from_pretrained(LM_REPO)
    loaded_tokenizer = AutoTokenizer.from_pretrained(LM_REPO)
    model = AutoModel.from_pretrained(LM_REPO).eval()
    loaded_lm = AutoModelForPreTraining.from_pretrained(LM_REPO).eval()
    assert type(config) is ElmoConfig and config.name_or_path == LM_REPO
    assert {**config.to_dict(), "_name_or_path": ""} == lm.config.to_dict()
    assert type(loaded_tokenizer) is ElmoCharTokenizer
    assert type(model) is ElmoModel and type(loaded_lm) is ElmoForBidirectionalLM
    assert_same_outputs(expected_outputs(loaded_tokenizer, model, loaded_lm), expected_outputs(tokenizer, lm.elmo, lm))
    assert type(ElmoModel.from_pretrained(CONVERTED_REPO)) is ElmoModel
    # With trust_remote_code=True the model still comes from the package (transformers prefers registered
    # classes); the tokenizer may come from the repo's copy of tokenization_elmo.py, with the same ids.
    remote_tokenizer = AutoTokenizer.from_pretrained(LM_REPO, trust_remote_code=True)
    remote_flag_lm = AutoModelForPreTraining.from_pretrained(LM_REPO, trust_remote_code=True).eval()
    assert type(remote_flag_lm) is ElmoForBidirectionalLM
    assert_same_outputs(expected_outputs(remote_tokenizer, remote_flag_lm.elmo, remote_flag_lm),
                        expected_outputs(tokenizer, lm.elmo, lm))


# -- loading in a fresh process without the package, online then offline -------------------------------------

CHILD_CODE = r"""
import importlib.util, json, sys

sys.path.extend(json.loads(sys.argv[1]))  # see run_without_hf_elmo
spec_file, out_dir = sys.argv[2], sys.argv[3]
assert importlib.util.find_spec("hf_elmo") is None, importlib.util.find_spec("hf_elmo")

import numpy as np
import torch
from transformers import (AutoConfig, AutoModel, AutoModelForPreTraining, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, AutoTokenizer)

spec = json.load(open(spec_file))
report = {"classes": {}, "sys_path": sys.path}
for repo_id, has_lm in spec["repos"].items():
    config = AutoConfig.from_pretrained(repo_id, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
    model = AutoModel.from_pretrained(repo_id, trust_remote_code=True).eval()
    loaded = {"config": config, "tokenizer": tokenizer, "model": model}
    # The task models over the repo's biLM (new task layers): they load, and run.
    for name, auto_class in (("tagger", AutoModelForTokenClassification),
                             ("classifier", AutoModelForSequenceClassification)):
        loaded[name] = auto_class.from_pretrained(repo_id, trust_remote_code=True, num_labels=3).eval()
    batch = tokenizer(spec["sentences"], is_split_into_words=True, padding=True, return_tensors="pt")
    arrays = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        arrays |= {f"hidden_{i}": layer for i, layer in enumerate(model(**batch).hidden_states)}
        assert loaded["tagger"](**batch).logits.shape == (*batch["attention_mask"].shape, 3)
        assert loaded["classifier"](**batch).logits.shape == (len(spec["sentences"]), 3)
        if has_lm:
            lm = loaded["lm"] = AutoModelForPreTraining.from_pretrained(repo_id, trust_remote_code=True).eval()
            output = lm(**batch)
            arrays |= {"forward_logits": output.forward_logits, "backward_logits": output.backward_logits}
    np.savez(f"{out_dir}/{repo_id.replace('/', '--')}.npz", **{k: v.numpy() for k, v in arrays.items()})
    report["classes"][repo_id] = {k: [type(v).__module__, type(v).__name__] for k, v in loaded.items()}
report["hf_elmo_modules"] = sorted(name for name in sys.modules if name.split(".")[0] == "hf_elmo")
json.dump(report, open(f"{out_dir}/report.json", "w"))
"""


def run_child(env: dict[str, str], workdir: Path, out_dir: Path) -> dict:
    """Run CHILD_CODE in a fresh interpreter without access to `hf_elmo`; its report and arrays."""
    out_dir.mkdir()
    spec_file = workdir / "spec.json"
    spec_file.write_text(json.dumps({"repos": {LM_REPO: True, CONVERTED_REPO: False}, "sentences": SENTENCES}))
    run_without_hf_elmo(CHILD_CODE, str(spec_file), str(out_dir), cwd=workdir, env=env)
    report = json.loads((out_dir / "report.json").read_text())
    for repo_id in (LM_REPO, CONVERTED_REPO):
        with np.load(out_dir / f"{repo_id.replace('/', '--')}.npz") as arrays:
            report[repo_id] = dict(arrays)
    return report


@pytest.fixture(scope="module")
def fresh_process_loads(tmp_path_factory, tiny_lm, converted) -> dict[str, dict]:
    """Push both repos to a server of their own; load them in a child process; stop the server; load again
    in another child with HF_HUB_OFFLINE=1 and the same (child-only) HF_HOME."""
    workdir = tmp_path_factory.mktemp("fresh_process")
    hub = FakeHub().start()
    try:
        with patch_hub_client(hub.url, workdir / "parent_hf_home"):
            push_both(tiny_lm, converted)
        env = hub_env(hub.url, workdir / "child_hf_home")
        online = run_child(env, workdir, workdir / "online")
    finally:
        hub.stop()
    with pytest.raises(URLError):  # from here on, nothing can come from the server
        urlopen(hub.url, timeout=5)
    offline = run_child({**env, "HF_HUB_OFFLINE": "1"}, workdir, workdir / "offline")
    return {"online": online, "offline": offline}


def test_only_skipping_site_hides_the_installed_package(tmp_path):
    """The control for `run_child`: `python -I` still sees the (editable) install; `-I -S` does not."""
    code = "import importlib.util; print(importlib.util.find_spec('hf_elmo') is not None)"

    def visible(*flags: str) -> bool:
        args = [sys.executable, *flags, "-c", code]
        result = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip() == "True"

    assert not visible("-I", "-S")
    if not visible("-I"):
        pytest.skip("hf_elmo is not installed in site-packages (tests run from the source tree): nothing to hide")


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_fresh_process_without_the_package_loads_the_remote_code(fresh_process_loads, mode):
    report = fresh_process_loads[mode]
    assert report["hf_elmo_modules"] == []
    repo_root = Path(hf_elmo.__file__).resolve().parents[1]
    assert not [p for p in report["sys_path"] if p and Path(p).resolve() in (repo_root, repo_root / "tests")]
    base = {"config": "ElmoConfig", "tokenizer": "ElmoCharTokenizer", "model": "ElmoModel",
            "tagger": "ElmoForTokenClassification", "classifier": "ElmoForSequenceClassification"}
    for repo_id, expected in ((LM_REPO, {**base, "lm": "ElmoForBidirectionalLM"}), (CONVERTED_REPO, base)):
        classes = report["classes"][repo_id]
        assert {key: name for key, (_, name) in classes.items()} == expected
        # Hub code is imported as transformers_modules.<org>.<repo>.<commit>.<file>
        assert all(module.startswith("transformers_modules.") for module, _ in classes.values()), classes


@pytest.mark.parametrize("mode", ["online", "offline"])
def test_fresh_process_outputs_equal_those_of_the_pushed_objects(fresh_process_loads, mode, tiny_lm, converted):
    lm, lm_tokenizer = tiny_lm
    assert_same_outputs(fresh_process_loads[mode][LM_REPO], expected_outputs(lm_tokenizer, lm.elmo, lm))
    model, tokenizer = converted
    assert_same_outputs(fresh_process_loads[mode][CONVERTED_REPO], expected_outputs(tokenizer, model))


def test_elmo_convert_push_to_hub_publishes_a_model_others_load_by_its_id(fake_hub, converted, tmp_path):
    from typer.testing import CliRunner

    from elmo_cli import app

    repo = "org/elmo-converted-by-cli"
    options, weights = require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5")
    result = CliRunner().invoke(app, ["convert", str(options), str(weights), str(tmp_path / "out"),
                                      "--push-to-hub", repo])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith(f"{fake_hub.url}/{repo}/commit/")
    assert REPO_FILES <= set(list_repo_files(repo))
    card = ModelCard.load(repo)
    assert f'AutoModel.from_pretrained("{repo}", trust_remote_code=True)' in card.text
    loaded = AutoModel.from_pretrained(repo, trust_remote_code=True).eval()
    torch.testing.assert_close(loaded.state_dict(), converted[0].state_dict(), rtol=0, atol=0)
    failed = CliRunner().invoke(app, ["convert", str(options), str(weights), str(tmp_path / "again"),
                                      "--push-to-hub", "not a repo id"])
    assert failed.exit_code == 1 and "was written but not uploaded to not a repo id" in failed.output
    assert "Traceback" not in failed.output
