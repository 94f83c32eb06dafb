"""The paper's experiments (benchmarks/paper/run.py) stay runnable: the quick form of every experiment, one task."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from elmo_fixtures import require, worker_threads
from spacy_fixtures import DATA, REPO, run_python

pytestmark = pytest.mark.slow  # subprocesses and long runs: left out of the fast subset


def test_quick_form_of_every_experiment_writes_its_tables_and_figures(tmp_path):
    require(DATA / "sst5" / "trees" / "train.txt")
    run = REPO / "benchmarks" / "paper" / "run.py"
    run_python(run, "--quick", "--tasks", "sst2", "--threads", worker_threads(), "--out", tmp_path, timeout=1200)
    experiments = ["results", "layers", "placement", "efficiency", "weights", "probe", "neighbours"]
    for name in experiments:
        assert (tmp_path / f"{name}.md").read_text().startswith(f"# {name}\n")
    results = json.loads((tmp_path / "results.json").read_text())["data"]["sst2"]
    assert all(0.0 <= score <= 1.0 for score in results["with"] + results["without"])
    layers = json.loads((tmp_path / "layers.json").read_text())["data"]["sst2"]
    assert list(layers) == ["top layer only", "average (fixed)", "learned, lambda = 1", "learned, lambda = 0.001",
                            "learned from the top layer"]
    assert layers["learned, lambda = 0.001"] == results["with"]  # the same run, trained once
    weights = json.loads((tmp_path / "weights.json").read_text())["data"]
    assert [w["position"] for w in weights] == ["input", "output"]
    assert all(abs(sum(w["weights"]) - 1) < 1e-5 for w in weights)
    probe = json.loads((tmp_path / "probe.json").read_text())["data"]["layers"]
    assert [row["layer"] for row in probe] == ["0", "1", "2", "average"]
    assert all(0.3 < row["pos_accuracy"] <= 1.0 for row in probe)
    neighbours = json.loads((tmp_path / "neighbours.json").read_text())["data"]
    token_layer = [n for n in neighbours if n["layer"] == "token layer"]
    assert all(abs(score - 1.0) < 1e-5 for n in token_layer for score, _ in n["neighbours"])  # no context there
    for figure in ("efficiency.png", "weights.png"):
        assert (tmp_path / figure).read_bytes()[:4] == b"\x89PNG"

    # Runs are recorded as they finish and not trained again with the same settings (here: from another --out);
    # another budget trains them again, and another frozen-biLM cache (--frozen-cache-mb) the runs with ELMo.
    runs = json.loads((tmp_path / "runs.json").read_text())
    keys = ("sst2/without/seed0/1", "sst2/with/seed0/1")
    learnt_from = "sst5/trees/train.txt phrases=True"
    assert all(runs[key]["settings"]["train_data"] == learnt_from for key in keys)
    again = run_python(run, "--quick", "--only", "results", "--tasks", "sst2", "--threads", "1",
                       "--out", tmp_path / "again", "--reuse", tmp_path, timeout=600)
    assert all(f"{key}: {100 * runs[key]['score']:.2f} from {runs[key]['path']}" in again for key in keys)
    assert json.loads((tmp_path / "again" / "runs.json").read_text()) == {key: runs[key] for key in keys}
    run_python(run, "--quick", "--only", "results", "--tasks", "sst2", "--threads", "1", "--max-steps", "7",
               "--frozen-cache-mb", "64", "--out", tmp_path / "longer", "--reuse", tmp_path, timeout=600)
    longer = json.loads((tmp_path / "longer" / "runs.json").read_text())
    assert set(longer) == set(keys) and all(longer[key]["settings"]["max_steps"] == 7 for key in keys)
    assert all(longer[key]["path"].startswith(str(tmp_path / "longer")) for key in keys)
    trained = (Path(longer["sst2/with/seed0/1"]["path"]) / "model-last" / "config.cfg").read_text()
    assert "\nfrozen_cache_mb = 64\n" in trained and longer["sst2/with/seed0/1"]["settings"]["frozen_cache_mb"] == 64
    assert "frozen_cache_mb" not in longer["sst2/without/seed0/1"]["settings"]
    run_python(run, "--quick", "--only", "results", "--tasks", "sst2", "--threads", "1", "--max-steps", "7",
               "--out", tmp_path / "cache", "--reuse", tmp_path / "longer", timeout=600)
    cache = json.loads((tmp_path / "cache" / "runs.json").read_text())
    assert cache["sst2/without/seed0/1"] == longer["sst2/without/seed0/1"]
    assert cache["sst2/with/seed0/1"]["path"].startswith(str(tmp_path / "cache"))
    # A run is reused only with the same config: a shipped config that changes trains its runs again.
    with_config = tmp_path / "runs" / "sst2-with-seed0-1" / "config.cfg"
    with_config.write_text(with_config.read_text().replace("l2 = 0.001", "l2 = 0.002"))
    run_python(run, "--quick", "--only", "results", "--tasks", "sst2", "--threads", "1",
               "--out", tmp_path / "changed", "--reuse", tmp_path, timeout=600)
    changed = json.loads((tmp_path / "changed" / "runs.json").read_text())
    assert changed["sst2/without/seed0/1"] == runs["sst2/without/seed0/1"]
    assert changed["sst2/with/seed0/1"]["path"].startswith(str(tmp_path / "changed"))


def test_each_task_trains_for_its_own_budget_unless_max_steps_sets_one():
    spec = importlib.util.spec_from_file_location("paper_run", REPO / "benchmarks" / "paper" / "run.py")
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    full = run.parse_args([])
    assert {task: run.max_steps(full, task) for task in run.TASKS} == {"ner": 1500, "sst5": 4400, "sst5-bcn": 4400,
                                                                        "sst2": 4000, "sst2-sentences": 2000}
    assert full.tasks == ["ner", "sst5", "sst2"]
    fixed = run.parse_args(["--max-steps", "7"])
    assert {run.max_steps(fixed, task) for task in run.TASKS} == {7}
    assert {run.max_steps(run.parse_args(["--quick"]), task) for task in run.TASKS} == {6}
