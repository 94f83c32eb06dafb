"""`elmo embed --ray`: on a Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`, started once for the
module, this process its driver) its output equals one process's, a killed worker or driver loses nothing, a rerun
resumes, a stalled worker ends the job in one line, bad input fails its shard alone, and an input that changes
during or after a job never gives a row of other lines; without an address, a local cluster of the job's own that
listens on loopback only and is gone with the job, however the job ends; and `ElmoBatchEmbedder` under Ray Data.

No test depends on the machine's speed: a job that must not finish before the test has stopped or changed something
is held at a gate (`ray_gate`: the driver hands out no shard past it), and every process a test starts is ended
with it (`processes`)."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from elmo_fixtures import in_a_small_tmpfs, require_tmpfs
from processes import session_processes
from ray_clusters import RAY_ENV, ray_environment, two_nodes
from ray_gate import gated, held_at, open_to
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo.embed import ray_job, read_vectors

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray"), pytest.mark.usefixtures("one_torch_thread")]
runner = CliRunner(env={"COLUMNS": "1000"})
ENV = {**os.environ, **RAY_ENV, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
GATE_SCRIPT = Path(__file__).with_name("ray_gate.py")
PTB = Path(__file__).resolve().parents[2] / "shared" / "data" / "ptb" / "ptb.valid.txt"


@pytest.fixture(scope="module", autouse=True)
def ray_env():
    with ray_environment():
        yield


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes of one CPU each, this process connected to them as a driver; their address."""
    with two_nodes() as address:
        yield address


def test_make_test_runs_this_modules_tests_in_one_worker(request):
    """`make test` (`--dist loadgroup`) sends this module's tests, and test_serve.py's Ray tests, to one pytest-xdist
    worker: one cluster at a time on the machine. A pytest with which pytest-xdist cannot group them fails here."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@ray"), (
            f"pytest-xdist did not group {request.node.nodeid} (pytest {pytest.__version__}): install the pytest "
            "that setup.cfg's dev extra names")


@pytest.fixture
def gate(tmp_path, monkeypatch) -> Path:
    """A gate for the jobs this process drives (`ray_gate`), open until a test closes it."""
    path = tmp_path / "gate"
    monkeypatch.setattr(ray_job._Pool, "_give", gated(ray_job._Pool._give, path))
    return path


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


def lines_of(count: int, seed: int = 0) -> str:
    return "".join(f"line {i} of the {(i + seed) % 17} words w{i % 13} and x{i % 29} again\n" for i in range(count))


@pytest.fixture(scope="module")
def long_input(tmp_path_factory, tiny_model_dir):
    """2,000 lines, and one process's output of them (the tiny model)."""
    directory = tmp_path_factory.mktemp("long")
    source = directory / "long.txt"
    source.write_text(lines_of(2000), encoding="utf-8")
    return source, one_process(tiny_model_dir, [source], directory / "one.parquet")


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


def wait_for(condition, timeout: float = 240.0, process=None):
    """`condition()`'s first true value, waiting for it (failing with `process`'s output if it ends first)."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if process is not None and process.poll() is not None:
            pytest.fail(f"the driver ended first ({process.returncode}): {process.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return found


def finished(process, timeout: float = 300) -> tuple[int, str]:
    """The exit code and stderr of a driver; one that has not ended in `timeout` seconds fails the test with every
    thread's stack (a gated driver writes them on SIGUSR1)."""
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGUSR1)
        try:
            _, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired as error:
            stderr = (error.stderr or b"").decode(errors="replace")
        pytest.fail(f"the driver had not ended after {timeout:.0f} s; its threads:\n{stderr[-8000:]}")
    return process.returncode, stderr


def gone(leader: int, timeout: float = 60.0) -> bool:
    """Whether every process of the session `leader` started has ended (waiting for them up to `timeout`)."""
    deadline = time.monotonic() + timeout
    while session_processes(leader):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def in_process(*args: object):
    """`elmo ARGS` as this process's Ray driver (no interpreter to start: the job's workers are what it waits for)."""
    return runner.invoke(app, [str(arg) for arg in args])


def meanwhile(action) -> threading.Thread:
    """`action()` in a thread of its own, while this one runs a job."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def complete_shards(partial: Path) -> list[Path]:
    return sorted(partial.glob("part-*.parquet"))


def shard_metadata(path: Path) -> dict:
    return json.loads(pq.read_schema(path).metadata[b"elmo"])


def workers_alive() -> list[dict]:
    """The job workers alive on the module's cluster (Ray's own record of its actors)."""
    from ray._private import state

    return [actor for actor in state.actors().values()
            if actor["ActorClassName"] == "_ShardWorker" and actor["State"] == "ALIVE"]


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


# -- a local cluster of the job's own ---------------------------------------------------------------------------


def test_a_local_job_listens_on_loopback_only_and_is_gone_with_its_processes(long_input, tiny_model_dir, tmp_path,
                                                                              processes):
    """Without --ray-address: every socket its GCS, raylet, agents and workers listen on is a loopback one (Ray
    accepts drivers without authentication), the default plan gives every worker several shards, and when the job
    ends no process of it is left; the output equals one process's."""
    source, expected = long_input
    gate, output = tmp_path / "gate", tmp_path / "out"
    open_to(gate, 1)
    driver = processes.start([sys.executable, GATE_SCRIPT, gate, "embed", "--ray", tiny_model_dir, source, output,
                              "--workers", 1], env=ENV)
    wait_for(lambda: held_at(gate) == 1, process=driver)
    listening = {(member.name(), connection.laddr.ip) for member in session_processes(driver.pid)
                 for connection in member.net_connections(kind="inet") if connection.status == psutil.CONN_LISTEN}
    names = {name for name, _ in listening}
    assert {"gcs_server", "raylet"} <= names and any(name.startswith("ray::") for name in names), listening
    assert all(loopback(ip) for _, ip in listening), sorted(listening)
    open_to(gate, float("inf"))
    code, stderr = finished(driver)
    assert code == 0, stderr
    assert stderr.splitlines()[-1].startswith(f"2000 sentences written to {output} (2 shards; 2 embedded in ")
    assert_same_rows(pq.read_table(output), expected)
    assert gone(driver.pid)


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C twice", "SIGKILL"])
def test_a_stopped_local_job_says_so_in_one_line_and_leaves_no_process(long_input, tiny_model_dir, tmp_path,
                                                                         processes, stop):
    """SIGTERM, Ctrl-C twice: one line, exit 130. SIGKILL (no handler runs): nothing to say, but nothing left either,
    Ray's agents included (they outlive their raylet otherwise, waiting a minute or more on their dead GCS)."""
    source, _ = long_input
    gate, output = tmp_path / "gate", tmp_path / "out"
    open_to(gate, 1)
    driver = processes.start([sys.executable, GATE_SCRIPT, gate, "embed", "--ray", tiny_model_dir, source, output,
                              "--workers", 1, "--shard-size", 500], env=ENV)
    wait_for(lambda: held_at(gate) == 1, process=driver)
    if stop == "Ctrl-C twice":
        driver.send_signal(signal.SIGINT)
        time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
    else:
        driver.send_signal(getattr(signal, stop))
    code, stderr = finished(driver)
    if stop == "SIGKILL":
        assert code == -signal.SIGKILL
    else:
        assert code == 130, stderr
        assert "SIGTERM received" not in stderr and "Traceback" not in stderr, stderr
        assert stderr.splitlines()[-1] == (
            f"Interrupted: 1 of 4 shards are complete in {tmp_path / '.out.partial'} "
            f"({stderr.splitlines()[-1].split('(')[1].split(',')[0]}, kept): rerun the same command to resume, or "
            "delete it")
    assert gone(driver.pid, timeout=30), [p.name() for p in session_processes(driver.pid)]
    assert not output.exists() and len(complete_shards(tmp_path / ".out.partial")) == 1


def test_a_full_disk_under_ray_is_the_workers_own_line_naming_the_file(long_input, tiny_model_dir, tmp_path):
    """OUTPUT on a tmpfs too small for it (the job and its local cluster in a mount namespace of the test's own)."""
    require_tmpfs(tmp_path)
    source, _ = long_input
    disk = tmp_path / "disk"
    disk.mkdir()
    result = in_a_small_tmpfs(disk, "256k", [sys.executable, "-m", "elmo_cli", "embed", "--ray", str(tiny_model_dir),
                                             str(source), str(disk / "out"), "--workers", "1", "-q"], ENV,
                              timeout=300)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"Error: no space left on the disk holding {disk / '.out.partial'}/part-0000"), (
        result.stderr)
    assert "the partial output is removed: free space, or write elsewhere (complete shards are kept in " in (
        result.stderr)


# -- on the module's two nodes -----------------------------------------------------------------------------------


def test_the_shipped_model_on_two_nodes_equals_one_process_and_a_killed_worker_loses_nothing(cluster, corpus,
                                                                                             tmp_path, gate):
    """Every input kind and PTB sentences, in shards over both nodes, one worker killed mid-job (held at a shard,
    then released): every sentence once, its vectors those of one process to float32's batch rounding."""
    source = tmp_path / "ptb.txt"
    source.write_text("".join(PTB.read_text(encoding="utf-8").splitlines(keepends=True)[:150]), encoding="utf-8")
    inputs = [corpus / "a.txt", corpus / "b.jsonl.gz", corpus / "c.parquet", source]
    expected = pa.concat_tables([one_process("default", [path], tmp_path / f"{path.name}.parquet") for path in inputs])
    output = tmp_path / "out"
    command = ["embed", "--ray", "--ray-address", cluster, "default", *inputs, output, "--shard-size", 15,
               "--workers", 2]
    open_to(gate, 4)
    killed, nodes = [], set()

    def kill_a_worker() -> None:
        wait_for(lambda: held_at(gate) == 4)
        wait_for(lambda: len(workers_alive()) == 2)
        workers = workers_alive()
        nodes.update(worker["Address"]["NodeID"] for worker in workers)
        killed.append(workers[0]["Pid"])
        os.kill(killed[0], signal.SIGKILL)
        open_to(gate, float("inf"))

    meanwhile(kill_a_worker)
    result = in_process(*command)
    assert result.exit_code == 0, result.output
    assert killed and len(nodes) == 2  # a worker on each node, one of them killed
    assert result.stderr.splitlines()[-1].startswith(f"166 sentences written to {output} (13 shards; 13 embedded in ")
    assert sorted(p.name for p in output.iterdir()) == ["_elmo_embed.json"] + [f"part-{i:05d}.parquet"
                                                                               for i in range(13)]
    assert not (tmp_path / ".out.partial").exists() and not (tmp_path / ".out.lock").exists()
    got = pq.read_table(output)
    assert_same_rows(got, expected)
    manifest = json.loads((output / "_elmo_embed.json").read_text())
    assert manifest["complete"] and [s["path"] for s in manifest["shards"]].count(str(source)) == 10
    assert all(shard_metadata(output / f"part-{i:05d}.parquet")["written_by"]["pid"] != killed[0]
               for i in range(4, 13))  # the shards after the kill: written by the other worker or the restarted one
    assert not workers_alive()  # the job's workers end with it, on a cluster that goes on
    # A rerun of the complete job does nothing; another job's output is never mixed in.
    result = in_process(*command)
    assert result.exit_code == 0 and "is complete already (13 shards of this job): nothing to do" in result.stderr
    result = in_process(*command, "--layers", "top")
    assert result.exit_code == 1 and "holds the output of another job" in result.stderr, result.output


def test_a_stopped_driver_keeps_its_complete_shards_and_the_same_command_resumes(cluster, long_input, tiny_model_dir,
                                                                                tmp_path, processes):
    """Interrupted (SIGINT) when 3 shards are complete, then killed (SIGKILL) at 5, then run to its end: every
    sentence once, as one process writes it; a damaged shard is redone, never kept; no worker of a stopped driver
    goes on."""
    source, expected = long_input
    gate, output, partial = tmp_path / "gate", tmp_path / "out", tmp_path / ".out.partial"
    command = ["embed", "--ray", "--ray-address", cluster, tiny_model_dir, source, output, "--shard-size", 50,
               "--workers", 1]
    for stop, at in ((signal.SIGINT, 3), (signal.SIGKILL, 5)):
        open_to(gate, at)
        driver = processes.start([sys.executable, GATE_SCRIPT, gate, *map(str, command)], env=ENV)
        wait_for(lambda: held_at(gate) == at, process=driver)  # noqa: B023 (this round's)
        driver.send_signal(stop)
        code, stderr = finished(driver)
        if stop == signal.SIGINT:
            assert code == 130, stderr
            lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
            assert all(line.startswith("embedding on Ray") for line in lines[:-1]), stderr  # no logs of Ray's
            assert lines[-1].startswith(f"Interrupted: 3 of 40 shards are complete in {partial} ("), lines[-1]
            assert lines[-1].endswith("kept): rerun the same command to resume, or delete it")
        else:
            assert code == -signal.SIGKILL
        assert not output.exists()
        assert len(complete_shards(partial)) == at
        assert wait_for(lambda: not workers_alive(), timeout=60)
    kept = complete_shards(partial)
    kept[0].write_bytes(kept[0].read_bytes()[:-100])  # a damaged shard: redone, never kept
    result = in_process(*command)
    assert result.exit_code == 0, result.output
    summary = result.stderr.splitlines()[-1]
    assert summary.startswith(f"2000 sentences written to {output} (40 shards; 36 embedded in ")
    assert summary.endswith(", 4 kept from an earlier run)"), summary
    assert_same_rows(pq.read_table(output), expected)
    assert not partial.exists()


def test_a_stalled_worker_ends_the_job_in_one_line_naming_it(cluster, long_input, tiny_model_dir, tmp_path, gate):
    """The worker is stopped (SIGSTOP) once it has started, then given its first shard: no progress, named within
    --stall-timeout. No shard runs before it, so no worker slowed by a busy machine can stall first."""
    source, _ = long_input
    output, partial = tmp_path / "out", tmp_path / ".out.partial"
    open_to(gate, 0)
    stopped: list[tuple[int, float]] = []

    def stop_the_worker() -> None:
        wait_for(lambda: held_at(gate) == 0)  # the worker has started (the driver gives shards to started ones)
        pid = wait_for(lambda: len(alive := workers_alive()) == 1 and alive[0]["Pid"])
        os.kill(pid, signal.SIGSTOP)
        stopped.append((pid, time.monotonic()))
        open_to(gate, float("inf"))

    meanwhile(stop_the_worker)
    try:
        result = in_process("embed", "--ray", "--ray-address", cluster, tiny_model_dir, source, output,
                            "--shard-size", 200, "--workers", 1, "--stall-timeout", 4, "-q")
    finally:
        for pid, _ in stopped:
            os.kill(pid, signal.SIGKILL)
    pid, when = stopped[0]
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr == (f"Error: worker pid {pid} on {os.uname().nodename} made no progress on shard 0 "
                             f"({source} lines 1-200, 0 of 200 sentences) for 4 s (--stall-timeout); the job "
                             f"stopped; complete shards are kept in {partial}: rerun the same command to resume\n")
    assert time.monotonic() - when < 60
    assert not output.exists() and partial.is_dir()


def test_bad_input_fails_its_shard_in_one_line_and_the_other_shards_are_kept(cluster, tiny_model_dir, tmp_path):
    good, bad, nul = tmp_path / "good.jsonl", tmp_path / "bad.jsonl", tmp_path / "nul.txt"
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
    assert [shard_metadata(p)["shard"]["index"] for p in complete] == [0, 1, 2, 3, 4]
    assert not (tmp_path / "out").exists()
    # Bytes that are no text (a NUL): the worker's own line names the file and the line, whatever Ray wraps it in.
    nul.write_bytes(b"fine\nfine too\nbad \x00 line\n")
    result = in_process("embed", "--ray", "--ray-address", cluster, tiny_model_dir, nul, tmp_path / "nul",
                        "--workers", 1, "-q")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"Error: {nul}: line 3 holds a NUL byte, which text never does"), result.stderr


def test_an_empty_input_reads_back_as_zero_rows_with_the_schema(cluster, tiny_model_dir, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    output = tmp_path / "out"
    command = ["embed", "--ray", "--ray-address", cluster, tiny_model_dir, tmp_path / "empty.txt", output,
               "--layers", "top"]
    result = in_process(*command)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-1].startswith(f"0 sentences written to {output} (0 shards; ")
    table = pq.read_table(output)
    assert table.num_rows == 0 and table.schema.field("vectors").type == pa.list_(pa.list_(pa.float32(), 16))
    assert read_vectors(output) == []
    assert "is complete already (0 shards of this job): nothing to do" in in_process(*command).stderr


def test_an_input_edited_during_or_after_a_job_never_gives_rows_of_other_lines(cluster, tiny_model_dir, tmp_path,
                                                                               gate):
    """A line lengthened while the job runs fails the shards after it (exit 1, one line) and the rerun redoes them;
    a line changed after a complete job (same line count) is redone by the rerun, the rest kept; a same-size edit of
    an interrupted job's written shard, its mtime put back, is redone on resume. Every output equals one process on
    the input as it is."""
    source, output = tmp_path / "in.txt", tmp_path / "out"
    source.write_text(lines_of(2000), encoding="utf-8")
    command = ["embed", "--ray", "--ray-address", cluster, tiny_model_dir, source, output, "--shard-size", 200,
               "--workers", 1, "-q"]

    def edit(line: int, text: str, keep_time: bool = False) -> None:
        before = os.stat(source)
        lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
        lines[line] = text + "\n"
        source.write_text("".join(lines), encoding="utf-8")
        if keep_time:
            os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))

    def expected() -> pa.Table:
        return one_process(tiny_model_dir, [source], tmp_path / f"one-{time.monotonic_ns()}.parquet")

    open_to(gate, 1)

    def lengthen_a_line() -> None:
        wait_for(lambda: held_at(gate) == 1)
        edit(100, "line 100 now longer by twenty-four bytes")
        open_to(gate, float("inf"))

    meanwhile(lengthen_a_line)
    result = in_process(*command)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"Error: {source} changed while the job ran: its lines 201-400 are no longer what "
                                    "they were when the job was planned (nothing of them is kept): rerun the command "
                                    "to plan it again (and 8 more shards); the other shards are complete in ")
    open_to(gate, float("inf"))
    result = in_process(*command[:-1])
    assert result.exit_code == 0, result.output
    assert "(10 shards; 10 embedded in " in result.stderr  # shard 0 too: its line 101 is another now
    assert_same_rows(pq.read_table(output), expected())
    edit(1000, "line 1000 edited after the job")  # of another length: the shards from line 1001 on start elsewhere
    result = in_process(*command[:-1])
    assert result.exit_code == 0, result.output
    assert "(10 shards; 5 embedded in " in result.stderr and result.stderr.endswith(", 5 kept from an earlier run)\n")
    assert_same_rows(pq.read_table(output), expected())
    # Interrupted at shard 3, then a same-size edit in shard 0 with the old mtime put back: redone on resume.
    second = tmp_path / "second"
    open_to(gate, "interrupt 3")
    result = in_process(*command[:6], second, *command[7:])
    assert result.exit_code == 130 and "Interrupted: 3 of 10 shards are complete in " in result.stderr
    edit(50, "LINE 50" + source.read_text(encoding="utf-8").splitlines()[50][7:], keep_time=True)
    open_to(gate, float("inf"))
    result = in_process(*command[:6], second, *command[7:-1])
    assert result.exit_code == 0, result.output
    assert "(10 shards; 8 embedded in " in result.stderr and result.stderr.endswith(", 2 kept from an earlier run)\n")
    assert_same_rows(pq.read_table(second), expected())
    # Lines added while a job runs: no shard holds them, and the job says so instead of ending complete without them.
    open_to(gate, 1)

    def add_lines() -> None:
        wait_for(lambda: held_at(gate) == 1)
        with open(source, "a", encoding="utf-8") as handle:
            handle.write("an added line\nand another\n")
        open_to(gate, float("inf"))

    meanwhile(add_lines)
    result = in_process(*command[:6], tmp_path / "third", *command[7:])
    assert result.exit_code == 1 and result.stderr == (
        f"Error: {source} changed while the job ran (2000 lines planned, 2002 now): rerun the same command to embed it "
        "as it is now (the complete shards are kept)\n")
    result = in_process(*command[:6], tmp_path / "third", *command[7:-1])
    assert result.exit_code == 0 and "(11 shards; 1 embedded in " in result.stderr, result.output  # the new lines
    assert_same_rows(pq.read_table(tmp_path / "third"), expected())


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


def test_a_worker_asked_while_ray_restarts_it_is_asked_again_not_taken_for_failed():
    """After a worker dies, the question whether it has started again can meet it restarting (Ray answers
    `ActorUnavailableError`): the driver asks again; only an error of its set-up (`ActorDiedError`) ends the job."""
    from ray import exceptions

    class Actor:
        def __init__(self):
            self.asked = 0
            self.describe = self

        def remote(self):
            self.asked += 1
            return f"describe-{self.asked}"

    answers = {"describe-1": exceptions.ActorUnavailableError("restarting", b"x" * 16),
               "describe-2": {"pid": 7, "host": "h", "node": "n"},
               "describe-3": exceptions.ActorDiedError()}

    class FakeRay:
        def get(self, ref):
            if isinstance(answer := answers[ref], Exception):
                raise answer
            return answer

    FakeRay.exceptions = exceptions
    pool = ray_job._Pool.__new__(ray_job._Pool)
    pool.ray, actor = FakeRay(), Actor()
    worker = ray_job._Worker(actor, actor.describe.remote())
    pool.workers, pool.poll = [worker], None
    assert pool._answered("describe-1", None) == 0 and worker.who is None and worker.started == "describe-2"
    assert pool._answered("describe-2", None) == 0 and worker.who == {"pid": 7, "host": "h", "node": "n"}
    worker.started, worker.who = actor.describe.remote(), None
    with pytest.raises(ray_job.JobError, match="^a worker could not start: "):
        pool._answered("describe-3", None)


def test_the_guard_reads_again_a_process_it_found_without_the_mark(monkeypatch):
    """Between fork and exec a process shows its parent's environment: the GCS, started by the driver (unmarked),
    reads unmarked at first and marked once it runs; the guard must then take it (and what it started)."""
    from hf_elmo import ray_guard

    processes = {100: (1, 5000), 200: (100, 5100), 300: (1, 5200)}  # pid: (parent, start time)
    marked_now: set[int] = set()
    monkeypatch.setattr(ray_guard, "_processes", lambda: processes)
    monkeypatch.setattr(ray_guard, "_marked", lambda pid, entry: pid in marked_now)
    assert ray_guard.cluster("m", {}) == {}
    marked_now.add(100)  # its exec done: the same pid and start time, now with the mark
    assert ray_guard.cluster("m", {}) == {100: 5000, 200: 5100}
    processes[100] = (1, 6000)  # the GCS gone, its pid reused by another process: not the cluster's
    marked_now.clear()
    assert ray_guard.cluster("m", {100: 5000, 200: 5100}) == {200: 5100}  # what it started still is
