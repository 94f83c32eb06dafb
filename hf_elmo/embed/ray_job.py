"""`embed_on_ray`: `elmo embed --ray`, a corpus embedded on a Ray cluster.

The driver (this process) plans the shards (`shards.plan_shards`: each with a digest of its lines), keeps those an
earlier run of the same job completed (checked against what the inputs hold now), and hands the others, one at a
time, to a pool of `_ShardWorker` actors, each loading the model once on the CPUs and GPU Ray gave it and writing each
shard it is given to a hidden partial file renamed when complete (its lines checked against the digest first). Ray
restarts a worker that dies and the driver gives its shard out again, so every shard is written once, whole. The
shards sit in `.OUTPUT.partial/` beside OUTPUT until all are complete; then the directory is renamed to OUTPUT in one
step.

The driver asks each busy worker for its progress (sentences written), shows it, and ends the job in one line naming
the worker when one makes no progress for `stall_timeout` seconds. Bad input in a shard (a null text, bytes that are
not UTF-8, lines edited since the job was planned) fails that shard alone, in one line; the others are written, and a
rerun redoes only what failed. A fault of the job (a full disk, a worker's error) ends it in the worker's own line.

Without an address the cluster is the job's own: started for it, every process of it listening on the loopback
interface only (Ray accepts drivers without authentication: nothing off this machine may reach it), stopped with it.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..extras import require
from ..loading import load_config, resolve_model
from ..ray_cluster import ray_cluster, shielded
from .outputs import EmbedInterrupted, OutputLock, check_not_input, disk_size, partial_path, size_text
from .reading import InputError, InputFile, NotTextError, check_input, count_rows, input_files
from .settings import EmbedSettings, RayOptions, Reading
from .shards import (
    EMPTY_FILE,
    MANIFEST,
    JobIdentity,
    Shard,
    default_shard_size,
    plan_shards,
    read_manifest,
    shard_complete,
    write_empty,
    write_manifest,
    write_shard,
)

# How often the driver asks for the workers' progress, how many times a shard may lose its worker, and how long
# the job waits for a first worker to start (or --stall-timeout, if longer).
POLL_SECONDS = 0.5
ATTEMPTS = 3
START_SECONDS = 600.0


class JobError(RuntimeError):
    """A job that could not finish, in one line: what went wrong, what was kept, what to do."""


class JobInterrupted(JobError, EmbedInterrupted):
    """The driver was interrupted (SIGINT, SIGTERM); what was kept."""


def embed_on_ray(
    model: str | os.PathLike,
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    settings: EmbedSettings,
    reading: Reading = Reading(),
    options: RayOptions = RayOptions(),
    progress: bool = True,
) -> str:
    """Embed every line (row) of `inputs` (files, globs, directories: text, gzip, JSON Lines, Parquet; read as
    `reading` says) into the directory `output`, Parquet shards in input order (`parquet.py`'s layout), on the Ray
    cluster `options` names (`settings.RayOptions`; without an address, a local one of the job's own, on loopback
    only, stopped after it). Returns the summary line.

    A shard holds `options.shard_size` lines (default: enough shards that no worker idles long at the end,
    `shards.default_shard_size`; a rerun keeps the first run's). A rerun of the same job resumes: complete shards
    whose lines the inputs still hold are kept, the rest redone; a complete OUTPUT is left as it is when the inputs
    still hold what it was made from, else its changed shards are redone. Fails in one line (`JobError`,
    `InputError`, `ModelLoadError`), keeping every complete shard; `JobInterrupted` on SIGINT (and SIGTERM where its
    handler raises `KeyboardInterrupt`, as `elmo embed`'s does)."""
    ray = require("ray", "--ray needs")
    require("pyarrow", "--ray needs")
    output = Path(output)
    partial = partial_path(output)
    with OutputLock(output, [partial]):
        sources = input_files(inputs)
        for source in sources:
            check_input(source, reading.text_column)
        check_not_input([output, partial], [source.path for source in sources])
        location = resolve_model(model)  # the model, found (downloaded or converted) and checked once
        job = JobIdentity.of(str(model), location, settings, reading)
        earlier = _earlier_run(output, partial, job)
        shard_size = options.shard_size
        if earlier is not None and (output.exists() or not shard_size):
            shard_size = earlier.get("shard_size")  # the earlier run's plan (a complete OUTPUT's, always)
        rows = None if shard_size else sum(count_rows(source, reading.text_column, reading.encoding)
                                           for source in sources)
        if rows == 0:
            shard_size = default_shard_size(0, 1)
        shards = plan_shards(sources, shard_size, reading) if shard_size else None
        if shards is not None and output.exists():
            if _holds(output, job, shards):
                return f"{output} is complete already ({len(shards)} shards of this job): nothing to do"
            os.replace(output, partial)  # what the inputs hold now differs in places: those shards are redone
        partial.mkdir(exist_ok=True)
        done = _kept(partial, job, shards, shard_size) if shards is not None else []
        started = time.time()
        if shards is None or len(done) < len(shards):
            shards, shard_size, done = _run(ray, sources, job, location, settings, options, partial,
                                            (shards, shard_size, rows, done), progress)
            _check_unchanged(sources, shards, job)
        return _finish(output, partial, job, shards, shard_size, location, settings, done, started)


def _run(ray: Any, sources: list[InputFile], job: JobIdentity, location: str, settings: EmbedSettings,
         options: RayOptions, partial: Path, plan: tuple, progress: bool) -> tuple[list[Shard], int, list[Shard]]:
    """The shards not done written on the cluster, planned first when `plan` has none (its shard size from the
    workers the cluster holds); the plan, its shard size and the shards kept from before."""
    shards, shard_size, rows, done = plan
    reading = Reading(**job.reading)
    with ray_cluster(ray, options.address) as resources:
        count = options.workers or _fitting_workers(resources, options.cpus_per_worker, options.gpus_per_worker)
        shard_size = shard_size or default_shard_size(rows, count)
        pending = len(shards) - len(done) if shards is not None else math.ceil(rows / shard_size)
        # No more workers than shards; they load the model while the plan is made.
        pool = _Pool(ray, min(count, pending), location, settings, partial, job, options)
        try:
            if shards is None:
                shards = plan_shards(sources, shard_size, reading)
                done = _kept(partial, job, shards, shard_size)
            pool.run([s for s in shards if s not in set(done)], len(shards), options.stall_timeout,
                     _bar(shards, done, progress))
        except KeyboardInterrupt:
            with shielded():
                pool.stop()
                raise JobInterrupted(f"{len(done) + pool.completed} of {len(shards)} shards are complete in "
                                     f"{partial} ({size_text(disk_size(partial))}, kept): rerun the same command to "
                                     "resume, or delete it") from None
        finally:
            pool.stop()
    return shards, shard_size, done


def _earlier_run(output: Path, partial: Path, job: JobIdentity) -> dict[str, Any] | None:
    """The manifest of this job's earlier run: its complete OUTPUT, else its partial directory (None: none). Another
    job's, or an OUTPUT that is no job's, is refused (its files would be lost)."""
    if output.exists():
        manifest = read_manifest(output) if output.is_dir() else None
        if manifest is None:
            raise JobError(f"{output} exists and is not the output of an `elmo embed --ray` job: delete it, or choose "
                           "another OUTPUT")
        if manifest.get("job") != job.digest:
            raise JobError(f"{output} holds the output of another job (another model, settings or reading options): "
                           "delete it, or choose another OUTPUT")
        if partial.exists():
            raise JobError(f"{output} is complete and {partial} holds an interrupted run of the same job: delete one "
                           "of them")
        return manifest
    if not partial.exists():
        return None
    manifest = read_manifest(partial)
    if manifest is not None and manifest.get("job") != job.digest:
        raise JobError(f"{partial} holds an interrupted job with another model, settings or reading options "
                       f"({size_text(disk_size(partial))}): rerun its command to resume it, or delete it to start this "
                       "one")
    return manifest


def _holds(directory: Path, job: JobIdentity, shards: list[Shard]) -> bool:
    """Whether `directory` holds this plan's shards, each complete and of the lines the inputs hold now, and nothing
    else (but the manifest)."""
    names = {s.file_name(len(shards)) for s in shards} or {EMPTY_FILE}
    present = {entry.name for entry in directory.iterdir() if entry.name != MANIFEST}
    return present == names and all(shard_complete(directory / s.file_name(len(shards)), job, s, len(shards))
                                    for s in shards)


def _kept(partial: Path, job: JobIdentity, shards: list[Shard], shard_size: int) -> list[Shard]:
    """The shards complete in `partial` (kept), everything else there removed (killed workers' partial files, shards
    of lines that changed, of another plan); the manifest written, not complete."""
    done = [s for s in shards if shard_complete(partial / s.file_name(len(shards)), job, s, len(shards))]
    keep = {s.file_name(len(shards)) for s in done} | {MANIFEST}
    for entry in partial.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    write_manifest(partial, job, shards, shard_size, complete=False)
    return done


def _check_unchanged(sources: list[InputFile], shards: list[Shard], job: JobIdentity) -> None:
    """Fail when an input holds another number of lines than it did when the job was planned (lines added while
    the job ran, which no shard holds; a shard whose own lines changed fails on its own, `reading.read_span`)."""
    for source in sources:
        planned = sum(s.rows for s in shards if s.path == source.path)
        now = count_rows(source, job.reading["text_column"], job.reading["encoding"])
        if now != planned:
            raise JobError(f"{source.path} changed while the job ran ({planned} lines planned, {now} now): rerun the "
                           "same command to embed it as it is now (the complete shards are kept)")


def _finish(output: Path, partial: Path, job: JobIdentity, shards: list[Shard], shard_size: int, location: str,
            settings: EmbedSettings, done: list[Shard], started: float) -> str:
    """Every shard checked complete, the manifest marked so, the directory renamed to OUTPUT; the summary line."""
    if not shards and not (partial / EMPTY_FILE).exists():
        write_empty(partial, job, settings.layout(load_config(location)))
    missing = [s for s in shards if not shard_complete(partial / s.file_name(len(shards)), job, s, len(shards))]
    if missing:
        raise JobError(f"{len(missing)} shards are not complete ({missing[0].describe()}, ...): rerun the same "
                       "command to redo them")
    write_manifest(partial, job, shards, shard_size, complete=True)
    os.replace(partial, output)
    sentences = sum(s.rows for s in shards)
    return (f"{sentences} sentences written to {output} ({len(shards)} shards; {len(shards) - len(done)} embedded in "
            f"{time.time() - started:.1f} s, {len(done)} kept from an earlier run)")


def _fitting_workers(resources: dict[str, float], cpus_per_worker: float, gpus_per_worker: float) -> int:
    """As many workers as the cluster's GPUs (with `gpus_per_worker`), else its CPUs, hold; at least one."""
    held = (resources.get("GPU", 0) / gpus_per_worker if gpus_per_worker
            else resources.get("CPU", 1) / cpus_per_worker)
    return max(1, int(held))


def _bar(shards: list[Shard], done: list[Shard], progress: bool) -> tqdm:
    kept = sum(s.rows for s in done)
    return tqdm(total=sum(s.rows for s in shards), initial=kept, unit=" sentences", desc="embedding on Ray",
                file=sys.stderr, disable=not progress)


@dataclass
class _Worker:
    """One worker as the driver sees it: its actor, who it is (once started), the shard it writes and its progress."""

    actor: Any
    started: Any  # the call that answers once the worker has loaded the model
    who: dict[str, Any] | None = None
    shard: Shard | None = None
    call: Any = None
    rows: int = 0
    moved: float = 0.0  # when it was given its shard, or its rows last moved


class _Pool:
    """The job's workers (`_ShardWorker` actors, restarted by Ray when they die), each given one shard at a time."""

    def __init__(self, ray: Any, count: int, location: str, settings: EmbedSettings, directory: Path,
                 job: JobIdentity, options: RayOptions):
        self.ray = ray
        self.tracker = ray.remote(num_cpus=0)(_progress_class()).remote()
        actor = ray.remote(_ShardWorker).options(num_cpus=options.cpus_per_worker, num_gpus=options.gpus_per_worker,
                                                 max_restarts=-1, max_task_retries=0)
        arguments = (location, settings.to_dict(), str(directory), job.record())
        self.workers = [self._started(actor.remote(*arguments)) for _ in range(count)]
        self.directory, self.completed, self.errors = directory, 0, []
        self.poll, self.polled = None, 0.0  # the question to the tracker in flight, and when it was asked
        self.lost: dict[int, int] = {}  # shard -> the times its worker died while writing it
        self.since = time.monotonic()

    def _started(self, actor: Any) -> _Worker:
        return _Worker(actor, actor.describe.remote())

    def run(self, pending: list[Shard], shards: int, stall_timeout: float, bar: tqdm) -> None:
        """Every pending shard written (or failed in one line on bad input); `JobError` on a fault of the job."""
        queue, rows_done, self.since = deque(pending), bar.n, time.monotonic()
        try:
            while queue or any(worker.shard is not None for worker in self.workers):
                for worker in self.workers:
                    if queue and worker.who is not None and worker.shard is None:
                        self._give(worker, queue.popleft(), shards)
                for ref in self._ready():
                    rows_done += self._answered(ref, queue)
                self._poll()
                self._check_stalls(stall_timeout, bool(queue))
                bar.n = rows_done + sum(worker.rows for worker in self.workers if worker.shard is not None)
                bar.refresh()
        finally:
            bar.close()
        if self.errors:
            more = f" (and {len(self.errors) - 1} more shards)" if len(self.errors) > 1 else ""
            raise JobError(f"{self.errors[0]}{more}; the other shards are complete in {self.directory}: fix the input "
                           "and rerun the same command, which redoes only what is missing")

    def _give(self, worker: _Worker, shard: Shard, shards: int) -> None:
        worker.shard, worker.rows, worker.moved = shard, 0, time.monotonic()
        worker.call = worker.actor.write.remote(shard.record(), shards, self.tracker)

    def _ready(self) -> list[Any]:
        """The calls answered now: waited for up to `POLL_SECONDS`, then all that are done."""
        refs = [ref for worker in self.workers for ref in (worker.started, worker.call) if ref is not None]
        refs += [self.poll] if self.poll is not None else []
        if not refs:
            time.sleep(POLL_SECONDS)
            return []
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=POLL_SECONDS)
        return self.ray.wait(refs, num_returns=len(refs), timeout=0)[0] if ready else []

    def _answered(self, ref: Any, queue: deque[Shard]) -> int:
        """Take one answer (a worker started, a shard's result, a progress report); the sentences it completed."""
        if ref == self.poll:
            self.poll = None
            reports = self.ray.get(ref)
            for worker in self.workers:
                report = reports.get(worker.shard.index) if worker.shard is not None else None
                if report is not None and report[1] == worker.who["pid"] and report[0] != worker.rows:
                    worker.rows, worker.moved = report[0], time.monotonic()
            return 0
        worker = next(w for w in self.workers if ref in (w.started, w.call))
        if ref == worker.started:
            worker.started = None
            try:
                worker.who = self.ray.get(ref)
            except self.ray.exceptions.ActorUnavailableError:  # asked while Ray restarts it: ask again
                time.sleep(POLL_SECONDS / 5)
                worker.started = worker.actor.describe.remote()
            except self.ray.exceptions.RayError as error:  # the worker could not start (its set-up failed)
                raise JobError(f"a worker could not start: {_one_line(error)}") from None
            return 0
        shard, worker.call, worker.shard = worker.shard, None, None
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayActorError:  # the worker died: Ray restarts it; its shard is given out again
            self.lost[shard.index] = self.lost.get(shard.index, 0) + 1
            if self.lost[shard.index] >= ATTEMPTS:
                raise JobError(f"{shard.describe()}: its worker died {ATTEMPTS} times writing it (last pid "
                               f"{worker.who['pid']} on {worker.who['host']}); complete shards are kept in "
                               f"{self.directory}: rerun the same command to resume") from None
            queue.appendleft(shard)
            worker.who, worker.started = None, worker.actor.describe.remote()
            return 0
        except self.ray.exceptions.RayTaskError as error:  # an error of the worker's own code
            raise JobError(f"{_one_line(error)} (pid {worker.who['pid']} on {worker.who['host']}; complete shards "
                           f"are kept in {self.directory}: rerun the same command to resume)") from None
        if result["fatal"]:
            raise JobError(f"{result['error']} (complete shards are kept in {self.directory}: rerun the same command "
                           "to resume)")
        if result["error"]:
            self.errors.append(result["error"])
            return 0
        self.completed += 1
        return result["rows"]

    def _poll(self) -> None:
        """Ask the tracker for the workers' progress, every `POLL_SECONDS` once it has answered."""
        now = time.monotonic()
        if self.poll is None and now - self.polled >= POLL_SECONDS:
            self.poll, self.polled = self.tracker.snapshot.remote(), now

    def _check_stalls(self, timeout: float, waiting: bool) -> None:
        """End the job when a worker made no progress on its shard for `timeout` seconds, or when no worker started
        in `START_SECONDS` (or `timeout`, if longer) while shards wait."""
        now = time.monotonic()
        for worker in self.workers:
            if worker.shard is not None and now - worker.moved > timeout:
                shard = worker.shard
                raise JobError(f"worker pid {worker.who['pid']} on {worker.who['host']} made no progress on shard "
                               f"{shard.index} ({shard.describe()}, {worker.rows} of {shard.rows} sentences) for "
                               f"{timeout:.0f} s (--stall-timeout); the job stopped; complete shards are kept in "
                               f"{self.directory}: rerun the same command to resume")
        start_timeout = max(timeout, START_SECONDS)  # a worker's imports and model load, on a busy machine
        if waiting and all(w.who is None for w in self.workers) and now - self.since > start_timeout:
            resources = self.ray.cluster_resources()
            raise JobError(f"no worker started in {start_timeout:.0f} s: the cluster has "
                           f"{resources.get('CPU', 0):g} CPUs and {resources.get('GPU', 0):g} GPUs free of other work "
                           "for them; ask for fewer or smaller workers (--workers, --cpus-per-worker, "
                           "--gpus-per-worker)")

    def stop(self) -> None:
        """Stop every worker (on a cluster of others', none is left running)."""
        while self.workers:
            self.ray.kill(self.workers.pop().actor, no_restart=True)
        if self.tracker is not None:
            self.ray.kill(self.tracker)
            self.tracker = None


def _one_line(error: BaseException) -> str:
    """Ray's report of an error raised in a worker as one line: the error itself (its last line), without Ray's
    traceback."""
    cause = error
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(cause).__name__


def _progress_class() -> type:
    """The class of the actor workers report their progress to (sentences written of the shard they write, at most
    twice a second): shard -> (rows, pid). Made in a function so that Ray sends it by value, not by its module: the
    actor's process imports neither torch nor this package (seconds of a core at the start of every job)."""

    class Progress:
        def __init__(self) -> None:
            self.reports: dict[int, tuple[int, int]] = {}

        def report(self, index: int, rows: int, pid: int) -> None:
            self.reports[index] = (rows, pid)

        def snapshot(self) -> dict[int, tuple[int, int]]:
            return self.reports

    return Progress


class _ShardWorker:
    """A worker of the job (a Ray actor): the model loaded once, on the CPUs and GPU Ray gave this process
    (`batches.worker_embedder`); each shard written in the actor's one thread (torch's threads are set in it)."""

    def __init__(self, model: str, settings: dict[str, Any], directory: str, job: dict[str, Any]):
        import ray

        from ..runtime import bound_onednn_caches
        from .batches import worker_embedder

        bound_onednn_caches()
        self.embedder = worker_embedder(model, EmbedSettings.from_dict(settings))
        self.directory, self.job = Path(directory), JobIdentity(**job)
        self.who = {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                    "pid": os.getpid()}

    def describe(self) -> dict[str, Any]:
        """Who this worker is (answered once it has started)."""
        return self.who

    def write(self, record: dict[str, Any], shards: int, tracker: Any) -> dict[str, Any]:
        """Write the shard of `record` (one of `shards`), reporting its progress to `tracker`: its rows, or the one
        line of bad input that failed it alone, or of a fault that ends the job (`fatal`: a full disk, the device)."""
        from ..runtime import OutOfDeviceMemoryError

        shard = Shard(**record)
        try:
            rows = write_shard(self.embedder, shard, shards, self.directory, self.job, _Reporter(tracker, shard),
                               self.who)
            return {"rows": rows, "error": "", "fatal": False}
        except (InputError, NotTextError) as bad_input:
            return {"rows": 0, "error": str(bad_input), "fatal": False}
        except (OSError, OutOfDeviceMemoryError) as fault:
            return {"rows": 0, "error": str(fault), "fatal": True}


class _Reporter:
    """Called after each sentence a worker writes: reports the shard's rows to the tracker, at most twice a second."""

    def __init__(self, tracker: Any, shard: Shard):
        self.tracker, self.index, self.pid = tracker, shard.index, os.getpid()
        self.rows, self.reported = 0, time.monotonic()

    def __call__(self) -> None:
        self.rows += 1
        if time.monotonic() - self.reported >= POLL_SECONDS:
            self.reported = time.monotonic()
            self.tracker.report.remote(self.index, self.rows, self.pid)
