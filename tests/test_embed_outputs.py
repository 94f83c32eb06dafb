"""Nothing the user has is lost by `elmo embed` (`hf_elmo.embed.outputs`): an output that is the input, two runs at one
output, killed and stopped runs, gzip input, full disks. Real processes and real files throughout."""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from elmo_fixtures import in_a_small_tmpfs, message_words, require_tmpfs
from processes import interruptible
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo.embed import ElmoEmbedder, OutputError, embed_file
from hf_elmo.embed.outputs import OutputBusyError, OutputLock, check_not_input

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner(env={"COLUMNS": "1000"})
LINES = "the bank of the river\nhe sat on the bank\n\nrates rose again today\n"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def elmo(*args: object, **options) -> subprocess.Popen:
    """`elmo ARGS` in a process of its own, SIGINT at its default (`interruptible`)."""
    return subprocess.Popen([sys.executable, "-m", "elmo_cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, preexec_fn=interruptible, **options)


def finished(process: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    if process.stdin is not None and process.stdin.closed:
        process.stdin = None
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


def wait_for(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def listing(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


# -- 1. an output that is the input --------------------------------------------------------------------------------


@pytest.mark.parametrize("alias", ["same", "relative", "symlink", "hardlink", "offsets", "stdin"])
def test_an_output_that_is_the_input_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, alias,
                                                                              monkeypatch):
    source = tmp_path / "same.txt"
    source.write_text(LINES, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    output, stdin = {"same": (source, None), "relative": (Path("same.txt"), None),
                     "symlink": (tmp_path / "link.txt", None), "hardlink": (tmp_path / "hard.txt", None),
                     "offsets": (tmp_path / "same.npy", None), "stdin": (tmp_path / "same.txt", source)}[alias]
    if alias == "symlink":
        output.symlink_to(source)
    if alias == "hardlink":
        os.link(source, output)
    if alias == "offsets":  # the .npy output's index file is the input
        source = source.rename(tmp_path / "same.offsets.npy")
    before = listing(tmp_path)
    arguments = ["embed", tiny_model_dir, "-" if stdin else source.name if alias == "relative" else source, output]
    if stdin:
        with open(stdin, "rb") as handle:
            process = subprocess.run([sys.executable, "-m", "elmo_cli", *map(str, arguments)], stdin=handle,
                                     capture_output=True, text=True, env=ENV, timeout=120)
        code, stderr = process.returncode, process.stderr
    else:
        result = runner.invoke(app, [str(a) for a in arguments])
        code, stderr = result.exit_code, result.stderr
    assert code == 1, stderr
    assert stderr.startswith("Error: the output ") and stderr.count("\n") == 1, stderr
    assert "is the input" in stderr and "choose another output" in stderr
    assert source.read_text(encoding="utf-8") == LINES
    assert listing(tmp_path) == before


def test_embed_file_and_the_allennlp_drop_in_refuse_an_output_that_is_the_input(tiny_model, tmp_path):
    from elmo_fixtures import ALLENNLP, require

    from hf_elmo.allennlp import ElmoEmbedder as AllenNlpEmbedder

    source = tmp_path / "in.txt"
    source.write_text(LINES, encoding="utf-8")
    with pytest.raises(OutputError, match="is the input"):
        embed_file(ElmoEmbedder(tiny_model), source, source, progress=False)
    embedder = AllenNlpEmbedder(require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5"))
    with open(source, encoding="utf-8") as handle, pytest.raises(OutputError, match="is the input"):
        embedder.embed_file(handle, source)
    assert source.read_text(encoding="utf-8") == LINES
    check_not_input([tmp_path / "other.npy"], [source])  # another file: fine


# -- 2. two runs at one output --------------------------------------------------------------------------------------


def test_a_second_run_to_an_output_being_written_is_refused_and_the_first_completes(tiny_model_dir, tmp_path):
    """The first run reads stdin from a pipe the test holds open, so it is certainly writing (its lock taken, its
    partial file open) when the second starts. The lock is the writers' base class's: one format shows it."""
    output, reference = tmp_path / "out.npy", tmp_path / "ref.npy"
    first = elmo("embed", tiny_model_dir, "-", output, stdin=subprocess.PIPE)
    first.stdin.write(LINES)
    first.stdin.flush()
    wait_for((tmp_path / ".out.npy.partial").exists)
    second = elmo("embed", tiny_model_dir, "-", output, stdin=subprocess.PIPE)
    second.stdin.write(LINES * 3)
    second.stdin.close()
    code, stderr = finished(second)
    assert code == 1 and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"Error: {output} is being written by another run (pid {first.pid} on "), stderr
    assert not output.exists()  # the second wrote nothing
    first.stdin.close()
    code, stderr = finished(first)
    assert code == 0 and stderr.endswith(f"4 sentences written to {output}\n"), stderr
    # The first run's complete output, as a run alone writes it.
    result = runner.invoke(app, ["embed", str(tiny_model_dir), "-", str(reference), "-q"], input=LINES)
    assert result.exit_code == 0, result.output
    assert output.read_bytes() == reference.read_bytes()
    assert output.with_suffix(".offsets.npy").read_bytes() == reference.with_suffix(".offsets.npy").read_bytes()
    assert [name for name in listing(tmp_path) if name.startswith(".")] == []


def test_runs_started_together_leave_one_complete_output(tiny_model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text(LINES * 200, encoding="utf-8")
    reference = tmp_path / "ref.hdf5"
    result = runner.invoke(app, ["embed", str(tiny_model_dir), str(source), str(reference), "-q"])
    assert result.exit_code == 0, result.output
    output = tmp_path / "out.hdf5"
    results = [finished(process) for process in [elmo("embed", tiny_model_dir, source, output, "-q")
                                                 for _ in range(2)]]
    assert any(code == 0 for code, _ in results), results
    for code, stderr in results:
        assert code == 0 or (code == 1 and "is being written by another run" in stderr), stderr
    with h5py.File(output) as one, h5py.File(reference) as two:
        assert sorted(one) == sorted(two) and len(one) == 801
        assert all(np.array_equal(one[key][()], two[key][()]) for key in one)
    assert [name for name in listing(tmp_path) if name.startswith(".")] == []


def test_the_lock_is_refused_while_held_and_free_once_its_process_is_gone(tmp_path):
    output = tmp_path / "out.npy"
    held = OutputLock(output).acquire()
    with pytest.raises(OutputBusyError, match=f"pid {os.getpid()}"):
        OutputLock(output).acquire()
    held.release()
    assert not (tmp_path / ".out.npy.lock").exists()
    # A process killed while holding it: the kernel releases the lock, the next run takes it.
    code = f"from hf_elmo.embed.outputs import OutputLock; OutputLock({str(output)!r}).acquire(); import os; " \
           "os.kill(os.getpid(), 9)"
    subprocess.run([sys.executable, "-c", code], timeout=60)
    assert (tmp_path / ".out.npy.lock").exists()  # left behind, and free
    OutputLock(output).acquire().release()


# -- 3. killed and interrupted runs -------------------------------------------------------------------------------


def test_a_killed_runs_partial_files_are_removed_by_the_next_run_which_says_so(tiny_model_dir, tmp_path):
    output = tmp_path / "out.npy"
    killed = elmo("embed", tiny_model_dir, "-", output, stdin=subprocess.PIPE)
    killed.stdin.write(LINES * 50)
    killed.stdin.flush()
    wait_for(lambda: (tmp_path / ".out.npy.partial").exists())
    time.sleep(1.0)
    killed.kill()
    killed.wait()
    assert {".out.npy.partial", ".out.offsets.npy.partial"} <= set(listing(tmp_path))
    # A run to another output in the directory names what the killed run left (the warnings shown as the command
    # shows them, not raised as this suite's filters raise the project's).
    source = tmp_path / "in.txt"
    source.write_text(LINES, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        other = runner.invoke(app, ["embed", str(tiny_model_dir), str(source), str(tmp_path / "other.npy"), "-q"])
        again = runner.invoke(app, ["embed", str(tiny_model_dir), str(source), str(output)])
    assert other.exit_code == 0, other.output
    assert other.stderr.startswith("Warning: 2 files left by interrupted runs in "), other.stderr
    assert ".out.npy.partial, .out.offsets.npy.partial; the next run to the same output removes" in other.stderr
    # The next run to the same output removes them, and says so.
    assert again.exit_code == 0, again.output
    assert "Warning: removed .out.npy.partial, .out.offsets.npy.partial (" in again.stderr, again.stderr
    assert ", left by an interrupted run" in again.stderr and f"4 sentences written to {output}" in again.stderr
    assert [name for name in listing(tmp_path) if name.startswith(".")] == []


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_run_removes_its_partial_files_and_says_so(tiny_model_dir, tmp_path, stop):
    output = tmp_path / "out.hdf5"
    process = elmo("embed", tiny_model_dir, "-", output, stdin=subprocess.PIPE)
    process.stdin.write(LINES)
    process.stdin.flush()
    wait_for(lambda: (tmp_path / ".out.hdf5.partial").exists())
    process.send_signal(stop)
    code, stderr = finished(process)
    assert code == 130, stderr
    assert stderr.splitlines()[-1] == f"Interrupted: nothing was written to {output} (its partial file is removed)"
    assert "Traceback" not in stderr
    assert listing(tmp_path) == []


# -- 6. gzip input ---------------------------------------------------------------------------------------------------


def test_gzip_input_is_read_as_text_from_a_file_or_stdin_and_damaged_gzip_is_one_line(tiny_model_dir, tmp_path):
    plain = tmp_path / "in.txt"
    plain.write_text(LINES, encoding="utf-8")
    (tmp_path / "in.txt.gz").write_bytes(gzip.compress(LINES.encode()))
    shutil.copy(tmp_path / "in.txt.gz", tmp_path / "no-suffix")
    outputs = {}
    for name in ("in.txt", "in.txt.gz", "no-suffix"):
        outputs[name] = tmp_path / f"{name}.npy"
        result = runner.invoke(app, ["embed", str(tiny_model_dir), str(tmp_path / name), str(outputs[name]), "-q"])
        assert result.exit_code == 0, result.output
    with open(tmp_path / "in.txt.gz", "rb") as handle:
        piped = subprocess.run([sys.executable, "-m", "elmo_cli", "embed", str(tiny_model_dir), "-",
                                str(tmp_path / "piped.npy"), "-q"], stdin=handle, env=ENV, timeout=120)
    assert piped.returncode == 0
    outputs["stdin"] = tmp_path / "piped.npy"
    for output in outputs.values():
        assert output.read_bytes() == outputs["in.txt"].read_bytes()
    (tmp_path / "bad.gz").write_bytes(gzip.compress(LINES.encode())[:-12])
    result = runner.invoke(app, ["embed", str(tiny_model_dir), str(tmp_path / "bad.gz"), str(tmp_path / "b.npy"),
                                 "-q"])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "bad.gz is damaged gzip" in message_words(result.stderr)
    assert not (tmp_path / "b.npy").exists()


# -- 7. full disks ---------------------------------------------------------------------------------------------------


FULL_DISK = """
import sys
from typer.testing import CliRunner
from elmo_cli import app
model, source, disk = sys.argv[1:]
for name in ("out.npy", "out.hdf5", "out.parquet"):
    result = CliRunner().invoke(app, ["embed", model, source, f"{disk}/{name}", "-q"])
    print(f"{name} {result.exit_code} {result.stderr.strip()}", file=sys.stderr)
"""


@pytest.mark.slow
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing(tiny_model_dir, tmp_path):
    """Each writer onto a tmpfs too small for its output (in a mount namespace of the test's own)."""
    require_tmpfs(tmp_path)
    source = tmp_path / "in.txt"
    source.write_text("".join(f"line {i} of the {i * 7} words w{i % 13} x{i % 31}\n" for i in range(600)),
                      encoding="utf-8")
    disk = tmp_path / "disk"
    disk.mkdir()
    result = in_a_small_tmpfs(disk, "256k", [sys.executable, "-c", FULL_DISK, str(tiny_model_dir), str(source),
                                             str(disk)], ENV)
    assert result.returncode == 0, result.stderr
    reports = dict(line.split(" ", 1) for line in result.stderr.splitlines())
    assert sorted(reports) == ["out.hdf5", "out.npy", "out.parquet"], result.stderr
    for name, report in reports.items():
        code, error = report.split(" ", 1)
        assert code == "1" and "\n" not in error, report
        assert error.startswith(f"Error: no space left on the disk holding {disk / name}: "), error
        assert " written, the next " in error and " did not fit (" in error, error
        assert "free); the partial output is removed: free space, or write elsewhere" in error
    assert result.stdout.strip() == "", result.stdout  # the tmpfs holds nothing: no output, partial or lock file
