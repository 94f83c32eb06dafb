"""`elmo embed --ray` on a Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`, started once for the
module, this process its driver): its output equals one process's, a killed worker or driver loses nothing, a rerun
resumes, a stalled worker ends the job in one line, bad input fails its shard alone; without an address, a local
cluster of its own; and `ElmoBatchEmbedder` under Ray Data. Jobs run in this process where they can (no interpreter
to start for each); a driver that is interrupted or killed is a process of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo.embed import read_vectors

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("one_torch_thread")]
runner = CliRunner(env={"COLUMNS": "1000"})
# Clusters of this machine's own, reached from here only: without Ray's token authentication, whose token file a
# cluster started in this process and one started by another would each write.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
ENV = {**os.environ, **RAY_ENV, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module", autouse=True)
def ray_environment():
    saved = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)
    yield
    for name, value in saved.items():
        os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
PTB = Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb" / "ptb.valid.txt"


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each, this process connected to them as a driver; their address."""
    from ray.cluster_utils import Cluster

    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    ray.init(address=nodes.address, log_to_driver=False)
    yield nodes.address
    ray.shutdown()
    nodes.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Inputs of the three kinds: text (with an empty line, a repeated one and non-ASCII), gzipped JSON Lines, and
    Parquet with two row groups."""
    import gzip

    directory = tmp_path_factory.mktemp("corpus")
    (directory / "a.txt").write_text("the bank of the river\n\nhe sat on the bank\ncafé au lait\nthe bank of the river"
                                     "\nrates rose\nlast line here\n", encoding="utf-8")
    with gzip.open(directory / "b.jsonl.gz", "wt", encoding="utf-8") as handle:
        for text in ["json one", "json two words", "", "json four"]:
            handle.write(json.dumps({"text": text, "id": 1}) + "\n")
    pq.write_table(pa.table({"text": ["parquet one", "parquet two", "three", "four five six", "seven"]}),
                   directory / "c.parquet", row_group_size=3)
    return directory


def elmo(*args: object, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "elmo_cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, **options)


def finished(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


def one_process(model: object, inputs: list[Path], output: Path, *options: object) -> pa.Table:
    """What one `elmo embed` process writes for the inputs, as a table."""
    result = runner.invoke(app, ["embed", str(model), *map(str, inputs), str(output), "-q", *map(str, options)])
    assert result.exit_code == 0, result.output
    return pq.read_table(output)


def assert_same_rows(got: pa.Table, expected: pa.Table, atol: float = 1e-5) -> None:
    """The same sentences in the same order, each exactly once, with vectors equal within float32's batch rounding."""
    for column in ("source", "line", "text", "words"):
        assert got.column(column).to_pylist() == expected.column(column).to_pylist(), column
    for a, b in zip(read_vectors(got), read_vectors(expected), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=atol, rtol=0)


def wait_for(condition, timeout: float = 240.0, process: subprocess.Popen | None = None):
    """`condition()`'s first true value, waiting for it (failing with `process`'s output if it ends first)."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if process is not None and process.poll() is not None:
            pytest.fail(f"the driver ended first ({process.returncode}): {process.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def shard_pid(partial: Path) -> int | None:
    """The pid of a worker writing a shard now (its shard's lock file records it), if any."""
    writing = shard_being_written(partial)
    return writing and writing[0]


def shard_being_written(partial: Path) -> tuple[int, str] | None:
    """A worker writing a shard now, and the shard's file name (its lock file records the worker), if any."""
    for lock in partial.glob(".part-*.lock"):
        try:
            return int(json.loads(lock.read_text())["pid"]), lock.name[1 : -len(".lock")]
        except (OSError, ValueError, KeyError):
            continue
    return None


def complete_shards(partial: Path) -> list[Path]:
    return sorted(partial.glob("part-*.parquet"))


def settled_shards(partial: Path, quiet: float = 5.0, timeout: float = 60.0) -> list[Path]:
    """The complete shards once none has been added for `quiet` seconds: a killed driver's workers may still finish
    the shard they hold before Ray stops them."""
    shards, since, deadline = complete_shards(partial), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, f"shards still being added to {partial} after {timeout:.0f} s"
        time.sleep(0.2)
        if (now := complete_shards(partial)) != shards:
            shards, since = now, time.monotonic()
    return shards


def in_process(*args: object):
    """`elmo ARGS` as this process's Ray driver (no interpreter to start: the job's workers are what it waits for)."""
    return runner.invoke(app, [str(arg) for arg in args])


def meanwhile(action) -> threading.Thread:
    """`action()` in a thread of its own, while this one runs a job."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def long_input(tmp_path_factory, tiny_model_dir):
    """2,000 lines, and one process's output of them (the tiny model)."""
    directory = tmp_path_factory.mktemp("long")
    source = directory / "long.txt"
    source.write_text("".join(f"line {i} of the {i % 17} words w{i % 13} and x{i % 29} again\n" for i in range(2000)),
                      encoding="utf-8")
    return source, one_process(tiny_model_dir, [source], directory / "one.parquet")


def test_without_an_address_a_local_cluster_is_started_for_the_job_and_stopped(long_input, tiny_model_dir, tmp_path):
    """First in the module: before this process connects to the two nodes."""
    source, expected = long_input
    assert not ray.is_initialized()
    result = in_process("embed", "--ray", tiny_model_dir, source, tmp_path / "out", "--shard-size", 1000,
                        "--workers", 1)
    assert result.exit_code == 0, result.output
    assert not ray.is_initialized()  # its cluster stopped with it
    assert_same_rows(pq.read_table(tmp_path / "out"), expected)
    assert result.stderr.splitlines()[-1].startswith("2000 sentences written to ")


def test_the_shipped_model_on_two_nodes_equals_one_process_and_a_killed_worker_loses_nothing(cluster, corpus,
                                                                                             tmp_path):
    """Every input kind and PTB sentences, in shards over both nodes, one worker killed mid-job: every sentence once,
    its vectors those of one process to float32's batch rounding."""
    source = tmp_path / "ptb.txt"
    source.write_text("".join(PTB.read_text(encoding="utf-8").splitlines(keepends=True)[:150]), encoding="utf-8")
    inputs = [corpus / "a.txt", corpus / "b.jsonl.gz", corpus / "c.parquet", source]
    expected = pa.concat_tables([one_process("default", [path], tmp_path / f"{path.name}.parquet") for path in inputs])
    output, partial = tmp_path / "out", tmp_path / ".out.partial"
    command = ["embed", "--ray", "--ray-address", cluster, "default", *inputs, output, "--shard-size", 15,
               "--workers", 2]
    killed = []

    def kill_a_worker() -> None:
        pid, shard = wait_for(lambda: len(complete_shards(partial)) >= 2 and shard_being_written(partial))
        os.kill(pid, signal.SIGKILL)
        killed.append((pid, shard))

    meanwhile(kill_a_worker)
    result = in_process(*command)
    assert result.exit_code == 0, result.output
    assert killed, "no worker was killed"
    assert result.stderr.splitlines()[-1].startswith(f"166 sentences written to {output} (13 shards; 13 embedded in ")
    assert sorted(p.name for p in output.iterdir()) == ["_elmo_embed.json"] + [f"part-{i:05d}.parquet"
                                                                               for i in range(13)]
    assert not partial.exists() and not (tmp_path / ".out.lock").exists()
    got = pq.read_table(output)
    assert_same_rows(got, expected)
    worst = max(float(np.abs(a - b).max(initial=0)) for a, b in zip(read_vectors(got), read_vectors(expected)))
    assert worst <= 1e-5, worst
    manifest = json.loads((output / "_elmo_embed.json").read_text())
    assert manifest["complete"] and [s["path"] for s in manifest["shards"]].count(str(source)) == 10
    # Both nodes worked (each worker records where it ran), and another worker wrote the killed one's shard.
    written_by = {path.name: json.loads(pq.read_schema(path).metadata[b"elmo"])["written_by"]
                  for path in output.glob("part-*.parquet")}
    assert len({w["node"] for w in written_by.values()}) == 2
    pid, shard = killed[0]
    assert written_by[shard]["pid"] != pid
    # A rerun of the complete job does nothing; another job's output is never mixed in.
    result = in_process(*command)
    assert result.exit_code == 0 and "is complete already (13 shards of this job): nothing to do" in result.stderr
    result = in_process(*command, "--layers", "top")
    assert result.exit_code == 1 and "holds the output of another job" in result.stderr, result.output


def test_a_stopped_driver_keeps_its_complete_shards_and_the_same_command_resumes(cluster, long_input, tiny_model_dir,
                                                                                tmp_path):
    """Interrupted (SIGINT), then killed (SIGKILL), then run to its end: every sentence once, as one process writes
    it; a damaged shard is redone, never kept."""
    source, expected = long_input
    output, partial = tmp_path / "out", tmp_path / ".out.partial"
    # Small shards (40), and the second round stopped at its first new one: the resumed driver must not finish the
    # job before it is stopped (shards go on completing while the first stop is handled).
    command = ["embed", "--ray", "--ray-address", cluster, tiny_model_dir, source, output, "--shard-size", 50,
               "--workers", 1]
    seen = 0
    for stop in (signal.SIGINT, signal.SIGKILL):
        driver = elmo(*command)
        wanted = 3 if seen == 0 else seen + 1
        wait_for(lambda: len(complete_shards(partial)) >= wanted, process=driver)  # noqa: B023 (this round's)
        driver.send_signal(stop)
        code, stderr = finished(driver)
        if stop == signal.SIGINT:
            assert code == 130, stderr
            lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
            assert all(line.startswith("embedding on Ray") for line in lines[:-1]), stderr  # no logs of Ray's
            last = stderr.splitlines()[-1]
            assert last.startswith("Interrupted: ") and f"of 40 shards are complete in {partial} (" in last, last
            assert last.endswith("kept): rerun the same command to resume, or delete it")
        else:
            assert code == -signal.SIGKILL
        assert not output.exists()
        seen = len(complete_shards(partial))
        assert seen >= 3
    kept = settled_shards(partial)
    kept[0].write_bytes(kept[0].read_bytes()[:-100])  # a damaged shard: redone, never kept
    result = in_process(*command)
    assert result.exit_code == 0, result.output
    summary = result.stderr.splitlines()[-1]
    assert summary.endswith(f", {len(kept) - 1} kept from an earlier run)"), summary
    assert_same_rows(pq.read_table(output), expected)
    assert not partial.exists()


def test_a_stalled_worker_ends_the_job_in_one_line_naming_it(cluster, long_input, tiny_model_dir, tmp_path):
    source, _ = long_input
    output, partial = tmp_path / "out", tmp_path / ".out.partial"
    stopped: list[tuple[int, float]] = []

    def stop_the_worker() -> None:
        pid = wait_for(lambda: shard_pid(partial))
        os.kill(pid, signal.SIGSTOP)
        stopped.append((pid, time.monotonic()))

    meanwhile(stop_the_worker)
    try:
        result = in_process("embed", "--ray", "--ray-address", cluster, tiny_model_dir, source, output,
                            "--shard-size", 200, "--workers", 1, "--stall-timeout", 4, "-q")
    finally:
        for pid, _ in stopped:
            os.kill(pid, signal.SIGKILL)
    pid, when = stopped[0]
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"Error: worker pid {pid} on ") and " made no progress on shard " in result.stderr
    assert "for 4 s (--stall-timeout); the job stopped; complete shards are kept in " in result.stderr
    assert time.monotonic() - when < 60
    assert not output.exists() and partial.is_dir()


def test_bad_input_fails_its_shard_in_one_line_and_the_other_shards_are_kept(cluster, tiny_model_dir, tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text("".join(json.dumps({"text": f"good {i}"}) + "\n" for i in range(6)), encoding="utf-8")
    rows = [{"text": f"bad {i}"} for i in range(6)]
    rows[4]["text"] = None
    bad.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    result = in_process("embed", "--ray", "--ray-address", cluster, tiny_model_dir, good, bad, tmp_path / "out",
                        "--shard-size", 2, "--workers", 1, "-q")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"Error: {bad}: line 5: 'text' is null, not text: fix the row, drop it, or name ")
    assert "; the other shards are complete in " in result.stderr
    complete = complete_shards(tmp_path / ".out.partial")
    assert len(complete) == 5  # 3 of good.jsonl, 2 of bad.jsonl: all but its lines 5-6
    assert [json.loads(pq.read_schema(p).metadata[b"elmo"])["shard"]["index"] for p in complete] == [0, 1, 2, 3, 4]
    assert not (tmp_path / "out").exists()


def test_plan_time_errors_are_one_line_and_leave_nothing(cluster, tiny_model_dir, tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "no-text.parquet")
    (tmp_path / "empty.parquet").write_bytes(b"")
    for name, message in (("no-text.parquet", "has no column 'text' (its columns: body)"),
                          ("empty.parquet", "empty.parquet is not a Parquet file (it is empty)")):
        result = in_process("embed", "--ray", "--ray-address", cluster, tiny_model_dir, tmp_path / name,
                            tmp_path / "out")
        assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
        assert message in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.parquet", "no-text.parquet"]
    result = in_process("embed", "--ray", tiny_model_dir, tmp_path / "empty.parquet", tmp_path / "x", "--device",
                        "cpu")
    assert result.exit_code == 2 and "with --ray, workers run where --gpus-per-worker" in result.output
    result = in_process("embed", tiny_model_dir, tmp_path / "empty.parquet", tmp_path / "x", "--workers", 2)
    assert result.exit_code == 2 and "applies to --ray only" in result.output


def test_the_batch_callable_under_ray_data_writes_parquet_that_pyarrow_reads(cluster, tiny_model_dir, tmp_path):
    from hf_elmo.embed import ElmoEmbedder
    from hf_elmo.embed.batches import ElmoBatchEmbedder

    texts = [f"sentence {i} with {'more ' * (i % 5)}words" for i in range(40)]
    from ray import data

    data.DataContext.get_current().enable_progress_bars = False
    dataset = data.from_items([{"text": text} for text in texts])
    dataset = dataset.map_batches(ElmoBatchEmbedder, fn_constructor_kwargs={"model": str(tiny_model_dir),
                                                                            "layers": "top"},
                                  batch_format="pyarrow", batch_size=8, compute=data.ActorPoolStrategy(size=2),
                                  num_cpus=1)
    dataset.write_parquet(str(tmp_path / "vectors"))
    table = pq.read_table(tmp_path / "vectors")
    assert table.schema.field("vectors").type == pa.list_(pa.list_(pa.float32(), 16))  # plain lists, no Ray types
    embedder = ElmoEmbedder(tiny_model_dir, layers="top")
    by_text = dict(zip(table.column("text").to_pylist(), read_vectors(table)))
    assert sorted(by_text) == sorted(texts)
    for text, vectors in by_text.items():
        np.testing.assert_allclose(vectors, embedder.embed_sentence(text.split()), atol=1e-5, rtol=0)
