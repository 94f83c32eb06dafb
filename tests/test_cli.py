"""Tests of the `elmo` command line (in-process with typer's CliRunner, and real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from elmo_fixtures import ALLENNLP as FIXTURES
from elmo_fixtures import TINY_CONFIG, direct_layers, message_words
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo import ElmoConfig, ElmoForBidirectionalLM, ElmoModel, split_words
from hf_elmo.extras import install_command

# Wide enough that rich never wraps an error message (a temporary path) inside its panel.
runner = CliRunner(env={"COLUMNS": "1000"})
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(*args: object):
    """`elmo ARGS` in this process (`one_torch_thread` restores what `--threads` changes)."""
    return runner.invoke(app, [str(arg) for arg in args])


def assert_clean_failure(result, message: str, exit_code: int | None = None) -> None:
    """Failed with `message` on stderr and no traceback."""
    assert result.exit_code != 0 if exit_code is None else result.exit_code == exit_code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert message in message_words(result.stderr), result.stderr


def test_version():
    import torch

    from hf_elmo import __version__

    result = run("--version")
    assert result.exit_code == 0 and result.stdout == f"elmo {__version__} (spacy-elmo), torch {torch.__version__}\n"


@pytest.mark.parametrize("arguments,exit_code", [
    (["--help"], 0), (["--version"], 0), (["embed", "--help"], 0), (["embed"], 2),
    (["embed", "--layers", "middle", "a", "b"], 2), (["embed", "missing.txt", "out.npy"], 2), (["info", "-x"], 2),
])
def test_help_version_and_usage_errors_answer_without_loading_torch_or_transformers(arguments, exit_code):
    """They answer at once (benchmarks/bench_cli_start.py: ~0.3 s against ~5 s for importing hf_elmo): nothing
    heavy is imported until a command runs."""
    script = ("import sys\nfrom elmo_cli import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit as exit:\n"
              "    print(exit.code, sorted({'torch', 'transformers', 'hf_elmo', 'spacy'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", script, *arguments], capture_output=True, text=True, timeout=120)
    code, loaded = result.stdout.strip().splitlines()[-1].split(" ", 1)
    assert (int(code), loaded) == (exit_code, "[]"), result.stderr


def test_the_command_line_knows_the_packages_names_and_the_spacy_plugins_commands():
    """What `elmo` knows of the package it reads from the package's own files (no copy), without importing it; the
    spaCy plugin's commands it holds itself, kept in step with them."""
    import typer.main

    import hf_elmo.embed.output_formats
    import hf_elmo.embed.settings
    from elmo_cli import app as elmo
    from elmo_cli.app import (
        DEFAULT,
        DEFAULT_MODEL_NAME,
        SPACY_COMMANDS,
        Dtype,
        LayerMode,
        Pool,
        package_formats,
        package_settings,
    )
    from hf_elmo import DEFAULT_MODEL_NAME as default_model
    from hf_elmo.embed import DTYPES, LAYER_MODES, OUTPUT_FORMATS, POOLS, EmbedSettings
    from spacy_elmo.cli import app as spacy_app

    assert package_settings.__file__ == hf_elmo.embed.settings.__file__
    assert package_formats.__file__ == hf_elmo.embed.output_formats.__file__
    assert DEFAULT_MODEL_NAME == default_model and DEFAULT == EmbedSettings.defaults()
    assert [m.value for m in LayerMode] == list(LAYER_MODES) and [m.value for m in Pool] == list(POOLS)
    assert [m.value for m in Dtype] == list(DTYPES) and list(package_formats.OUTPUT_FORMATS) == list(OUTPUT_FORMATS)
    spacy_commands = typer.main.get_command(spacy_app).commands
    assert set(SPACY_COMMANDS) == set(spacy_commands)
    for name, summary in SPACY_COMMANDS.items():
        assert spacy_commands[name].help.startswith(summary)
    assert set(SPACY_COMMANDS) < set(typer.main.get_command(elmo).commands)


@pytest.mark.parametrize("command,usage", [
    ("embed", "embed [OPTIONS] [MODEL] INPUT... OUTPUT"), ("info", "info [OPTIONS] [MODEL]"),
    ("build-vocab", "build-vocab [OPTIONS] FILES..."),
    ("convert", "convert [OPTIONS] SOURCE... OUT_DIR"),
])
def test_help_shows_usage_as_typed_and_no_types_for_flags_or_argument_lists(command, usage):
    result = run(command, "--help")
    assert result.exit_code == 0 and usage in result.stdout, result.stdout
    for noise in ("<bool>", "<list[str]>", "{["):
        assert noise not in result.stdout


def test_pretrain_help_keeps_its_examples_one_per_line(capsys):
    from hf_elmo.training.pretrain import parse_arguments

    with pytest.raises(SystemExit):
        parse_arguments(["--help"])
    lines = capsys.readouterr().out.splitlines()
    assert "    elmo pretrain recipes/ptb_cpu.yaml --max_steps 100          # a recipe, with overrides" in lines


def test_convert_writes_a_loadable_directory(tmp_path):
    result = run("convert", FIXTURES / "options.json", FIXTURES / "lm_weights.hdf5", tmp_path / "model")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "model")
    assert "reading weights: " in result.stderr  # progress, on stderr
    model = ElmoModel.from_pretrained(tmp_path / "model")
    with h5py.File(FIXTURES / "lm_weights.hdf5") as weights:
        np.testing.assert_array_equal(model.char_cnn.char_embedding.weight[1:].detach().numpy(), weights["char_embed"])


@pytest.mark.parametrize(
    ("options", "weights", "message"),
    [
        ("options.json", "sentences.json", "not a readable HDF5 weight file"),
        ("missing.json", "lm_weights.hdf5", "missing.json: no such file"),
        ("vocab_test.txt", "lm_weights.hdf5", "not valid JSON"),
    ],
)
def test_convert_reports_original_format_errors_without_traceback(tmp_path, options, weights, message):
    result = run("convert", FIXTURES / options, FIXTURES / weights, tmp_path / "model")
    assert_clean_failure(result, message, exit_code=1)
    assert result.stderr.startswith("Error: ")
    assert not (tmp_path / "model").exists()


def test_export_hdf5_gives_back_the_original_weights(allennlp_model_dir, tmp_path):
    result = run("export-hdf5", allennlp_model_dir, tmp_path / "out" / "elmo_")
    assert result.exit_code == 0, result.output
    options_path, weights_path = (Path(line) for line in result.stdout.splitlines())
    assert options_path == tmp_path / "out" / "elmo_options.json"
    assert weights_path == tmp_path / "out" / "elmo_weights.hdf5"
    assert json.loads(options_path.read_text())["lstm"]["projection_dim"] == 16
    with h5py.File(weights_path) as exported, h5py.File(FIXTURES / "lm_weights.hdf5") as original:
        names = []
        original.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
        for name in names:
            np.testing.assert_array_equal(exported[name][()], original[name][()])


def test_info_prints_every_config_field_and_the_parameter_counts(tiny_model_dir):
    result = run("info", tiny_model_dir)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    config = ElmoConfig.from_pretrained(tiny_model_dir)
    for key in config.to_dict():
        assert any(line.split()[:1] == [key] for line in lines), key
    assert "  filters                   [[1, 4], [2, 8], [3, 16]]" in lines
    assert "output: 3 layers of width 16" in lines
    # char embedding 262*4 + convs (4*4+4) + (8*4*2+8) + (16*4*3+16); highway 28 -> 2*28; projection 28 -> 8;
    # per biLSTM layer: 2 directions * (input 128*8 + recurrent 128*8 + bias 128 + projection 8*32).
    expected = {"char embedding + CNN": 1_348, "highway": 1_624, "projection": 232, "biLSTM layer 1": 4_864,
                "biLSTM layer 2": 4_864, "total": 12_932}
    parts = dict(line.strip().rsplit(None, 1) for line in lines[lines.index("parameters:") + 1 :])
    assert {part: int(count.replace(",", "")) for part, count in parts.items()} == expected
    assert "softmax" not in result.stdout

    as_json = json.loads(run("info", tiny_model_dir, "--json").stdout)
    assert as_json["parameters"] == expected
    assert as_json["config"]["lstm_dim"] == 32


def test_info_counts_the_softmax_of_a_language_model(tmp_path):
    model = ElmoForBidirectionalLM(ElmoConfig(**TINY_CONFIG, vocab_size=50))
    model.save_pretrained(tmp_path)
    result = run("info", tmp_path, "--json")
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)["parameters"]
    assert counts["softmax"] == 8 * 50 + 50
    assert counts["total"] == 12_932 + 450 == sum(p.numel() for p in model.parameters())
    assert counts == model.parameter_counts()


def read_npy_output(path: Path) -> list[np.ndarray]:
    vectors, offsets = np.load(path), np.load(path.with_suffix(".offsets.npy"))
    return [vectors[start:end] for start, end in zip(offsets[:-1], offsets[1:])]


def test_embed_matches_the_allennlp_model_called_directly(allennlp_model_dir, tmp_path):
    groups = json.loads((FIXTURES / "sentences.json").read_text(encoding="utf-8"))
    lines = [sentence for group in groups for sentence in group]
    source = tmp_path / "sentences.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = ElmoModel.from_pretrained(allennlp_model_dir).eval()

    result = run("embed", allennlp_model_dir, source, tmp_path / "out.hdf5", "--tokenized", "--batch-tokens", 300, "-q")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    with h5py.File(tmp_path / "out.hdf5") as output:
        assert len(output) == len(lines) + 1
        assert json.loads(output["sentence_to_index"][0]) == {line: str(i) for i, line in enumerate(lines)}
        for i, line in enumerate(lines):
            np.testing.assert_allclose(output[str(i)][()], direct_layers(model, line.split()), atol=1e-5, rtol=0)

    result = run("embed", allennlp_model_dir, source, tmp_path / "top.npy", "--tokenized", "--layers", "top", "-q")
    assert result.exit_code == 0, result.output
    for line, vectors in zip(lines, read_npy_output(tmp_path / "top.npy"), strict=True):
        np.testing.assert_allclose(vectors, direct_layers(model, line.split())[-1], atol=1e-5, rtol=0)


def damaged_copy(model_dir: Path, target: Path, damage: str) -> Path:
    """A copy of `model_dir` with corrupt safetensors or a config.json whose sizes the weights do not fit."""
    import shutil

    shutil.copytree(model_dir, target)
    if damage == "corrupt":
        (target / "model.safetensors").write_bytes(b"not a safetensors file")
    else:
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, "lstm_dim": config["lstm_dim"] * 2}))
    return target


@pytest.mark.parametrize(
    ("damage", "message"), [("corrupt", "Error while deserializing header"), ("shapes", "ignore_mismatched")]
)
def test_info_and_embed_report_damaged_weights_in_one_line(tiny_model_dir, tmp_path, damage, message):
    model = damaged_copy(tiny_model_dir, tmp_path / "model", damage)
    (tmp_path / "in.txt").write_text("a b\n", encoding="utf-8")
    assert_clean_failure(run("info", model), f"cannot load the weights of {model}: ", exit_code=1)
    result = run("embed", model, tmp_path / "in.txt", tmp_path / "out.npy", "-q")
    assert_clean_failure(result, f"cannot load the weights of {model}: ", exit_code=1)
    assert message in message_words(result.stderr)


def test_convert_reports_bad_option_types_in_one_line(tmp_path):
    options = json.loads((FIXTURES / "options.json").read_text())
    options["char_cnn"]["embedding"]["dim"] = "16"
    (tmp_path / "options.json").write_text(json.dumps(options))
    result = run("convert", tmp_path / "options.json", FIXTURES / "lm_weights.hdf5", tmp_path / "out")
    assert_clean_failure(result, "ElmoConfig.char_embedding_dim must be an integer >= 1, got '16'", exit_code=1)


def test_embed_takes_allennlp_elmos_arguments(allennlp_model_dir, tmp_path):
    """`allennlp elmo INPUT OUTPUT --top --options-file O --weight-file W ...` with `elmo embed` in front: the
    original weights, whitespace-split lines, AllenNLP's layer flags, batch size, device and sentence keys."""
    source = tmp_path / "in.txt"
    source.write_text("The bank , here .\nHe sat .\n", encoding="utf-8")
    model = ElmoModel.from_pretrained(allennlp_model_dir).eval()
    original = ("--options-file", FIXTURES / "options.json", "--weight-file", FIXTURES / "lm_weights.hdf5")
    result = run("embed", source, tmp_path / "top.hdf5", "--top", *original, "--batch-size", 1, "--cuda-device", -1,
                 "--use-sentence-keys", "-q")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "top.hdf5") as output:
        assert sorted(output) == ["He sat .", "The bank , here ."]
        for line in ("He sat .", "The bank , here ."):
            np.testing.assert_allclose(output[line][()], direct_layers(model, line.split())[-1], atol=1e-5, rtol=0)
    result = run("embed", source, tmp_path / "average.npy", "--average", *original, "-q")
    assert result.exit_code == 0, result.output
    assert [len(vectors) for vectors in read_npy_output(tmp_path / "average.npy")] == [5, 3]
    # Its scripts name the output as they like (`output.txt`, AllenNLP's own tests): HDF5 all the same, as there. A
    # blank line stays a sentence without words (AllenNLP refuses the file), so line i is dataset i.
    source.write_text("The bank , here .\n\nHe sat .\n", encoding="utf-8")
    result = run("embed", source, tmp_path / "output.txt", "--all", *original, "-q")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "output.txt") as output:
        assert sorted(output) == ["0", "1", "2", "sentence_to_index"] and output["1"].shape == (3, 0, 32)
    result = run("embed", source, tmp_path / "forgot.txt", "--all", *original, "--forget-sentences", "-q")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "forgot.txt") as output:  # no sentence_to_index
        assert sorted(output) == ["0", "1", "2"]
        np.testing.assert_allclose(output["2"][()], direct_layers(model, ["He", "sat", "."]), atol=1e-5, rtol=0)


def test_embed_without_a_model_uses_the_default_one(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("The bank raised rates.\n", encoding="utf-8")
    result = run("embed", source, tmp_path / "out.npy", "-q")
    assert result.exit_code == 0, result.output
    assert np.load(tmp_path / "out.npy").shape == (5, 3, 512)  # spaCy's English words: The bank raised rates .


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--all", "--top"), "choose one of them"),
        (("--layers", "top", "--average"), "choose one of them"),
        (("--options-file", "x.json"), "--options-file/--weight-file: give both"),
        (("--device", "cpu", "--cuda-device", "-1"), "--device/--cuda-device: give one of them, not both"),
        (("--use-sentence-keys",), "sentence keys name the datasets of an HDF5 file"),
    ],
)
def test_embed_rejects_conflicting_allennlp_flags(tmp_path, args, message):
    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    assert_clean_failure(run("embed", source, tmp_path / "out.npy", *args), message, exit_code=2)


def test_embed_mix_applies_softmaxed_weights_and_gamma(tiny_model, tiny_model_dir, tmp_path):
    source = tmp_path / "input.txt"
    source.write_text("One sentence here.\n\nAnd don't forget U.S. 1,000.5!\n", encoding="utf-8")
    args = ("embed", tiny_model_dir, source, tmp_path / "mix.npy", "--layers", "mix", "--weights=-1,0.5,2", "-q")
    result = run(*args, "--gamma", 0.5)
    assert result.exit_code == 0, result.output
    weights = torch.softmax(torch.tensor([-1.0, 0.5, 2.0]), dim=0).numpy()
    embedded = read_npy_output(tmp_path / "mix.npy")
    assert [len(vectors) for vectors in embedded] == [4, 0, 7]  # And don 't forget U.S. 1,000.5 !
    for line, vectors in zip(source.read_text().splitlines(), embedded, strict=True):
        expected = 0.5 * np.tensordot(weights, direct_layers(tiny_model, split_words(line)), axes=1)
        np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("cpu", ["avx2", "amx"])
def test_embed_bf16_flag_runs_bf16_autocast_where_native_else_float32_with_one_warning_line(
    tiny_model_dir, tmp_path, pretend_cpu, cpu
):
    from hf_elmo.kernel_plan import BF16_AS_FLOAT32

    pretend_cpu(cpu)
    source = tmp_path / "input.txt"
    source.write_text("One sentence here.\nAnd a second, longer one for the biLM.\n", encoding="utf-8")
    outputs = {}
    for name, flags in (("exact", ()), ("bf16", ("--bf16",))):
        result = run("embed", tiny_model_dir, source, tmp_path / f"{name}.npy", "-q", *flags)
        assert result.exit_code == 0, result.output
        outputs[name] = read_npy_output(tmp_path / f"{name}.npy")
    # One line (no source line of the code that warned), the first thing on stderr.
    assert result.stderr == ("" if cpu == "amx" else f"Warning: {BF16_AS_FLOAT32}\n")
    for a, b in zip(outputs["exact"], outputs["bf16"], strict=True):
        assert b.dtype == np.float32
        assert 0 < np.abs(a - b).max() < 0.05 * np.abs(a).max() if cpu == "amx" else np.array_equal(a, b)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "cp1252"])
def test_embed_refuses_text_in_another_encoding_in_one_line_and_reads_it_when_told(tiny_model_dir, tmp_path, encoding):
    """A UTF-16 file read as UTF-8 would be garbage (its BOM and NULs as characters): one line naming the file and
    what to do, nothing written; `--encoding` reads it, giving the vectors of the same text in UTF-8. (cp1252: valid
    bytes are never refused, undecodable ones kept, as --help says; named, they decode right.)"""
    text = "The café by the bank.\nA second line, here.\n"
    (tmp_path / "utf8.txt").write_text(text, encoding="utf-8")
    (tmp_path / "other.txt").write_bytes(text.encode(encoding))
    run("embed", tiny_model_dir, tmp_path / "utf8.txt", tmp_path / "expected.npy", "-q")
    refused = run("embed", tiny_model_dir, tmp_path / "other.txt", tmp_path / "out.npy", "-q")
    if encoding != "cp1252":
        assert_clean_failure(refused, f"Error: {tmp_path / 'other.txt'}" + (
            " starts with a UTF-16 byte-order mark: it is UTF-16 text, not UTF-8." if encoding == "utf-16" else
            ": line 1 holds a NUL byte"), exit_code=1)
        assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "out.npy").exists()
    result = run("embed", tiny_model_dir, tmp_path / "other.txt", tmp_path / "out.npy", "-q", "--encoding", encoding)
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), np.load(tmp_path / "expected.npy"))
    assert_clean_failure(run("embed", tiny_model_dir, tmp_path / "other.txt", tmp_path / "out.npy", "--encoding",
                             "klingon"), "Invalid value for --encoding: unknown encoding 'klingon'", exit_code=2)


def test_embed_shows_progress_and_a_summary_unless_quiet(tiny_model_dir, tmp_path):
    source = tmp_path / "input.txt"
    source.write_text("a b\nc\n", encoding="utf-8")
    result = run("embed", tiny_model_dir, source, tmp_path / "out.h5", "--threads", 1)
    assert result.exit_code == 0, result.output
    assert "embedding: 100%" in result.stderr and "6.00/6.00" in result.stderr  # bytes, total = the file size
    assert result.stderr.rstrip().endswith(f"2 sentences written to {tmp_path / 'out.h5'}")
    assert result.stdout == ""


@pytest.mark.slow
def test_embed_reads_stdin_with_invalid_utf8_in_a_subprocess(tiny_model, tiny_model_dir, tmp_path):
    data = b"caf\xe9 au lait\n\xf0\x9f\x98\x80\x1b\n\n" + b"w " * 300
    process = subprocess.run(
        [sys.executable, "-m", "elmo_cli", "embed", str(tiny_model_dir), "-", str(tmp_path / "out.npy"),
         "--tokenized", "--layers", "top", "--threads", "1"],
        input=data, capture_output=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert process.returncode == 0, process.stderr.decode(errors="replace")
    assert b"4 sentences written to" in process.stderr and b"Traceback" not in process.stderr
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    embedded = read_npy_output(tmp_path / "out.npy")
    assert [len(vectors) for vectors in embedded] == [3, 1, 0, 300]
    for line, vectors in zip(lines, embedded, strict=True):
        np.testing.assert_allclose(vectors, direct_layers(tiny_model, line.split())[-1], atol=1e-5, rtol=0)


def test_a_launchers_rank_and_world_size_inherited_from_a_parent_job_change_nothing(tiny_model_dir, tmp_path,
                                                                                   monkeypatch):
    """Several processes are asked for (`--ray`), never switched on by the environment: under a launcher's variables
    `elmo embed` writes the whole input, as alone."""
    source = tmp_path / "in.txt"
    source.write_text("a b c\nthe same line\n\nx\n", encoding="utf-8")
    alone = run("embed", tiny_model_dir, source, tmp_path / "alone.npy", "-q")
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    launched = run("embed", tiny_model_dir, source, tmp_path / "launched.npy", "-q")
    assert alone.exit_code == launched.exit_code == 0, launched.output
    assert (tmp_path / "launched.npy").read_bytes() == (tmp_path / "alone.npy").read_bytes()
    assert read_npy_output(tmp_path / "launched.npy")[1].shape == (3, 3, 16)


@pytest.mark.slow
@pytest.mark.parametrize("preset", [{}, {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"}])
def test_embed_caps_onednn_kernel_caches_unless_the_user_set_them(tiny_model_dir, tmp_path, preset):
    source = tmp_path / "input.txt"
    source.write_text("a few words\n", encoding="utf-8")
    script = ("import os, sys; from elmo_cli import app; app(sys.argv[1:], standalone_mode=False); "
              "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], os.environ['LRU_CACHE_CAPACITY'])")
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    process = subprocess.run(
        [sys.executable, "-c", script, "embed", str(tiny_model_dir), str(source), str(tmp_path / "out.npy"), "-q"],
        capture_output=True, text=True, timeout=120, env={**env, **preset, "HF_HUB_OFFLINE": "1"},
    )
    assert process.returncode == 0, process.stderr
    assert process.stdout.split() == [preset.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64"), "64"]
    assert len(read_npy_output(tmp_path / "out.npy")[0]) == 3


@pytest.mark.parametrize(
    ("args", "message", "exit_code"),
    [
        (("embed", "{missing}", "{input}", "{out}.npy"), "model directory {missing} does not exist", 1),
        (("info", "{missing}"), "model directory {missing} does not exist", 1),
        (("export-hdf5", "{missing}", "{out}_"), "model directory {missing} does not exist", 1),
        (("info", "{input}"), "is a file; expected a save_pretrained directory", 1),
        (("embed", "{model}", "{input}", "{out}.npy", "--use-sentence-keys"),
         "sentence keys name the datasets of an HDF5 file", 2),
        (("embed", "{model}", "{input}", "{out}.npy", "--layers", "mix", "--weights", "1,2"),
         "--weights: 2 values given; the model has 3 layers", 2),
        (("embed", "{model}", "{input}", "{out}.npy", "--layers", "mix", "--weights", "1,x,2"),
         "expected comma-separated numbers", 2),
        (("embed", "{model}", "{input}", "{out}.npy", "--weights", "1,2,3"), "--weights: applies to layers='mix'",
         2),
        (("embed", "{model}", "{missing}", "{out}.npy"), "{missing} does not exist", 2),
        (("embed", "{model}", "{input}", "{missing}/out.npy"), "output directory {missing} does not exist", 1),
        (("embed", "{model}", "{input}", "{out}.npy", "--batch-tokens", "0"), "--batch-tokens", 2),
    ],
)
def test_bad_arguments_fail_cleanly(tiny_model_dir, tmp_path, args, message, exit_code):
    places = {"missing": tmp_path / "missing", "model": tiny_model_dir, "input": tmp_path / "in.txt"}
    places["out"] = tmp_path / "out"
    places["input"].write_text("a sentence\n", encoding="utf-8")
    result = run(*(arg.format(**places) for arg in args))
    assert_clean_failure(result, message.format(**places), exit_code)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt"]


def test_a_cuda_device_on_a_machine_without_cuda_names_that_flag(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "in.txt").write_text("a b\n")
    for flags, hint in ((["--cuda-device", "0"], "--cuda-device"), (["--device", "cuda"], "--device")):
        result = run("embed", tiny_model_dir, tmp_path / "in.txt", tmp_path / "out.npy", *flags)
        assert_clean_failure(result, f"Invalid value for {hint}: cuda", exit_code=2)
        assert "this torch sees no CUDA device" in message_words(result.stderr)


@pytest.mark.slow
def test_a_failing_command_prints_no_traceback_in_a_subprocess(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "elmo_cli", "embed", str(tmp_path / "missing"), "-", str(tmp_path / "out.npy")],
        input=b"", capture_output=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert process.returncode == 1
    assert process.stderr.decode() == f"Error: model directory {tmp_path / 'missing'} does not exist\n"
    assert process.stdout == b""


@pytest.mark.parametrize(
    "command",
    [
        ["convert", "{options}", "{weights}", "{out}"],
        ["export-hdf5", "{model}", "{out}_"],
        ["embed", "{input}", "{out}.npy", "--options-file", "{options}", "--weight-file", "{weights}"],
        ["embed", "{model}", "{input}", "{out}.hdf5"],
    ],
)
def test_a_missing_h5py_is_one_line_naming_the_extra(tiny_model_dir, tmp_path, monkeypatch, command):
    places = {"options": FIXTURES / "options.json", "weights": FIXTURES / "lm_weights.hdf5", "out": tmp_path / "out",
              "model": tiny_model_dir, "input": tmp_path / "in.txt"}
    places["input"].write_text("a b\n")
    monkeypatch.setitem(sys.modules, "h5py", None)  # `import h5py` raises ImportError
    result = run(*(str(arg).format(**places) for arg in command))
    assert_clean_failure(result, f"need h5py: {install_command('hdf5')}", exit_code=1)
    assert result.stderr.count("\n") == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.slow
def test_an_output_over_the_file_size_limit_fails_in_one_line_and_leaves_nothing(tiny_model_dir, tmp_path):
    """`ulimit -f`: the write fails with EFBIG; the partial output is removed whatever closing it raises."""
    import resource

    source = tmp_path / "in.txt"
    source.write_text("the bank raised rates again today\n" * 400)
    for output in ("out.hdf5", "out.npy"):
        process = subprocess.run(
            [sys.executable, "-m", "elmo_cli", "embed", str(tiny_model_dir), str(source), str(tmp_path / output),
             "-q"],
            capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024)),
        )
        assert process.returncode == 1, process.stderr
        assert process.stderr.startswith("Error: ") and process.stderr.count("\n") == 1, process.stderr
        assert f"{tmp_path / output} reached the file size limit (65.5 KB, ulimit -f) after " in process.stderr
        assert "; the partial output is removed: raise the limit, or write less" in process.stderr
        assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt"]


def test_embed_sets_the_default_threads_unless_told(tiny_model_dir, tmp_path, monkeypatch):
    from hf_elmo import runtime

    monkeypatch.setattr(runtime, "default_threads", lambda: 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (tmp_path / "in.txt").write_text("a b\n")
    torch.set_num_threads(2)
    assert run("embed", tiny_model_dir, tmp_path / "in.txt", tmp_path / "out.npy", "-q").exit_code == 0
    assert torch.get_num_threads() == 1
    assert run("embed", tiny_model_dir, tmp_path / "in.txt", tmp_path / "out.npy", "-q", "--threads", 2).exit_code == 0
    assert torch.get_num_threads() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's setting stands
    assert run("embed", tiny_model_dir, tmp_path / "in.txt", tmp_path / "out.npy", "-q").exit_code == 0
    assert torch.get_num_threads() == 2


def test_embed_out_of_device_memory_for_one_sentence_is_one_line(tiny_model_dir, tmp_path, monkeypatch):
    from elmo_fixtures import inject_out_of_memory

    inject_out_of_memory(monkeypatch, lambda ids: ids.shape[1] > 12)  # sentences of up to 10 words fit
    source = tmp_path / "in.txt"
    source.write_text("a short one\n" + " ".join(["word"] * 20) + "\n")
    result = run("embed", tiny_model_dir, source, tmp_path / "out.npy", "--quiet")
    assert result.exit_code == 1 and not (tmp_path / "out.npy").exists()
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: a sentence of 20 words does not fit in the device's memory")
    assert "--max-sentence-words" in lines[0]


@pytest.mark.parametrize("arguments,usage", [
    (["IN", "out.hdf5", "original"], "original is a model, which comes first: elmo embed original IN out.hdf5"),
    (["IN", "default"], "default is a model, which comes first: elmo embed default IN OUTPUT"),
])
def test_embed_with_the_model_in_the_wrong_place_says_where_it_goes(tmp_path, arguments, usage):
    source = tmp_path / "in.txt"
    source.write_text("a b\n")
    result = run("embed", *[str(source) if a == "IN" else str(tmp_path / a) if a.endswith(".hdf5") else a
                            for a in arguments])
    expected = usage.replace("IN", str(source)).replace("out.hdf5", str(tmp_path / "out.hdf5"))
    assert result.exit_code == 2 and expected in message_words(result.output)


def test_info_without_a_model_describes_the_default_model():
    result = run("info")
    assert result.exit_code == 0 and result.stdout.startswith("model: default\noutput: 3 layers of width 512\n")


@pytest.mark.parametrize("command", [["build-vocab", "x.txt", "-o", "vocab.txt"], ["pretrain", "--help"]])
def test_a_missing_accelerate_is_one_line_naming_the_train_extra(tmp_path, command):
    (tmp_path / "x.txt").write_text("a b\n")
    script = f"import sys\nsys.modules['accelerate'] = None\nfrom elmo_cli import app\napp({command!r})"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == "" and result.stderr == (
        f"Error: training needs accelerate: {install_command('train')}\n")


@pytest.mark.parametrize("record,command", [
    ({"url": "file:///src/spacy-elmo", "dir_info": {"editable": True}}, 'pip install -e "/src/spacy-elmo[plots]"'),
    ({"url": "file:///src/spacy-elmo", "dir_info": {}}, 'pip install "/src/spacy-elmo[plots]"'),
    ({"url": "https://example.org/spacy-elmo.git", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
     'pip install "spacy-elmo[plots] @ git+https://example.org/spacy-elmo.git"'),
    (None, 'pip install "spacy-elmo[plots]"'),
])
def test_a_missing_extra_is_installed_from_where_the_package_came(monkeypatch, record, command):
    """What pip recorded of this install (PEP 610's direct_url.json): a checkout (editable or not), a git URL, else
    the name; never a placeholder."""
    import json

    from hf_elmo import extras

    class Distribution:
        def read_text(self, name):
            return json.dumps(record) if record is not None and name == "direct_url.json" else None

    monkeypatch.setattr(extras, "distributions", lambda name: [Distribution(), Distribution()])
    assert extras.install_command("plots") == command
