"""`embed_on_ray`: `elmo embed --ray`, a corpus embedded on a Ray cluster through Ray Data.

The driver (this process) plans the shards (`shards.plan_shards`), keeps those an earlier run of the same job
completed (checked, not assumed), and hands the others to Ray Data: `map_batches` over the shards with an actor pool
of `_ShardWorker`s, each loading the model once (`ElmoBatchEmbedder`'s set-up: the CPUs and GPU Ray gave it) and
writing each shard it is given to a hidden partial file renamed when complete. Ray replaces a worker that dies and
gives its shard to another, so every shard is written once, whole. The shards sit in `.OUTPUT.partial/` beside
OUTPUT until all are complete; then the directory is renamed to OUTPUT in one step.

Workers report their progress to a `_Progress` actor; the driver shows it, and ends the job (in one line naming the
worker) when a worker makes no progress for `stall_timeout` seconds. Bad input in a shard (a null text, bytes that
are not UTF-8) fails that shard alone, in one line; the others are written, and a rerun redoes only what failed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..extras import require
from ..loading import resolve_model
from .outputs import OutputLock, check_not_input, disk_size, partial_path, size_text
from .reading import InputError, check_input, input_files
from .settings import EmbedSettings
from .shards import JobIdentity, Shard, plan_shards, read_manifest, shard_complete, write_manifest, write_shard


class JobError(RuntimeError):
    """A job that could not finish, in one line: what went wrong, what was kept, what to do."""


class JobInterrupted(JobError):
    """The driver was interrupted (SIGINT, SIGTERM); what was kept."""


def embed_on_ray(
    model: str | os.PathLike,
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    settings: EmbedSettings,
    *,
    tokenized: bool = False,
    encoding: str = "utf-8",
    text_column: str = "text",
    address: str | None = None,
    workers: int | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    shard_size: int = 10_000,
    stall_timeout: float = 600.0,
    progress: bool = True,
) -> str:
    """Embed every line (row) of `inputs` (files, globs, directories: text, gzip, JSON Lines, Parquet) into the
    directory `output`, a Parquet shard per `shard_size` lines in input order (`parquet.py`'s layout), on the Ray
    cluster at `address` (None: a local one started for the job and stopped after it). Returns the summary line.

    A rerun of the same job resumes: shards complete in `.OUTPUT.partial/` are kept, the rest redone; a complete
    OUTPUT of the same job is left as it is. `workers` model replicas run (default: as many as the cluster's CPUs or
    GPUs hold), each with `cpus_per_worker` CPUs (its torch threads) and `gpus_per_worker` GPUs. Fails in one line
    (`JobError`, `InputError`, `ModelLoadError`), keeping every complete shard; `JobInterrupted` on SIGINT."""
    ray = require("ray", "--ray needs")
    require("pyarrow", "--ray needs")
    output = Path(output)
    partial = partial_path(output)
    with OutputLock(output, [partial]):
        sources = input_files(inputs)
        for source in sources:
            check_input(source, text_column)
        check_not_input([output, partial], [source.path for source in sources])
        location = resolve_model(model)  # the model, found (downloaded or converted) and checked once
        job = JobIdentity.of(str(model), location, settings, tokenized, encoding, text_column)
        shards = plan_shards(sources, shard_size, text_column, encoding)
        if output.exists():
            return _finished_before(output, job, len(shards))
        _take_partial_directory(partial, job)
        done = [s for s in shards if shard_complete(partial / s.file_name(len(shards)), job, s, len(shards))]
        _remove_stale(partial, {s.file_name(len(shards)) for s in done})
        write_manifest(partial, job, shards, complete=False)
        pending = [s for s in shards if s not in set(done)]
        started = time.perf_counter()
        if pending:
            _run(ray, pending, len(shards), partial, job, location, settings, address, workers, cpus_per_worker,
                 gpus_per_worker, stall_timeout, progress, done_rows=sum(s.rows for s in done))
        missing = [s for s in shards if not shard_complete(partial / s.file_name(len(shards)), job, s, len(shards))]
        if missing:
            raise JobError(f"{len(missing)} shards are not complete ({missing[0].describe()}, ...): rerun the same "
                           "command to redo them")
        write_manifest(partial, job, shards, complete=True)
        os.replace(partial, output)
        sentences = sum(s.rows for s in shards)
        return (f"{sentences} sentences written to {output} ({len(shards)} shards; {len(pending)} embedded in "
                f"{time.perf_counter() - started:.1f} s, {len(done)} kept from an earlier run)")


def _finished_before(output: Path, job: JobIdentity, shards: int) -> str:
    """A complete output already there: this job's (nothing to do), or another's (refused)."""
    manifest = read_manifest(output)
    if manifest is None or not output.is_dir():
        raise JobError(f"{output} exists and is not the output of an `elmo embed --ray` job: delete it, or choose "
                       "another OUTPUT")
    if manifest.get("job") != job.digest or len(manifest.get("shards", [])) != shards or not manifest.get("complete"):
        raise JobError(f"{output} holds the output of another job (another model, settings or input): delete it, or "
                       "choose another OUTPUT")
    return f"{output} is complete already ({shards} shards of this job): nothing to do"


def _take_partial_directory(partial: Path, job: JobIdentity) -> None:
    """The job's partial directory, made, or an interrupted run's of the same job (resumed); one of another job is
    refused (its shards would be lost)."""
    if not partial.exists():
        partial.mkdir()
        return
    manifest = read_manifest(partial)
    if manifest is not None and manifest.get("job") != job.digest:
        raise JobError(f"{partial} holds an interrupted job with another model, settings or reading options "
                       f"({size_text(disk_size(partial))}): rerun its command to resume it, or delete it to start this "
                       "one")


def _remove_stale(partial: Path, keep: set[str]) -> None:
    """Remove from the partial directory what is not a complete shard kept: killed workers' partial files, shards
    of an input that changed, of a plan with other shard sizes."""
    for entry in partial.iterdir():
        if entry.name not in keep and entry.name != "_elmo_embed.json":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def _run(ray: Any, pending: list[Shard], shards: int, directory: Path, job: JobIdentity, location: str,
         settings: EmbedSettings, address: str | None, workers: int | None, cpus_per_worker: float,
         gpus_per_worker: float, stall_timeout: float, progress: bool, done_rows: int) -> None:
    """The pending shards through Ray Data (`_execute`, a task of its own that the driver waits on), with the progress
    shown and stalls caught."""
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
    try:
        resources = ray.cluster_resources()
        if workers is None:
            held = resources.get("GPU", 0) / gpus_per_worker if gpus_per_worker else (
                resources.get("CPU", 1) / cpus_per_worker)
            workers = max(1, int(held))
        tracker = ray.remote(num_cpus=0)(_Progress).remote()
        arguments = {"model": location, "settings": _settings_record(settings), "directory": str(directory),
                     "job": _job_record(job), "shards": shards, "progress": tracker}
        execution = ray.remote(num_cpus=0, max_retries=0)(_execute).remote(
            [s.record() for s in pending], arguments, min(workers, len(pending)), cpus_per_worker, gpus_per_worker,
            max(stall_timeout, 600))
        try:
            _watch(ray, execution, tracker, pending, directory, shards, stall_timeout, progress, done_rows)
        except BaseException:
            ray.cancel(execution, force=True)  # its workers go with it
            raise
    finally:
        if started_here:
            ray.shutdown()


def _execute(records: list[dict[str, Any]], arguments: dict[str, Any], workers: int, cpus_per_worker: float,
             gpus_per_worker: float, wait_for_workers: float) -> list[dict[str, Any]]:
    """The Ray Data pipeline of a job (run as a task): `map_batches` over the pending shards with an actor pool of
    `_ShardWorker`s; returns each shard's result (its rows, or the line of bad input that stopped it)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the driver shows the job's
    context.print_on_execution_start = False
    context.wait_for_min_actors_s = wait_for_workers  # workers load the model before their first shard
    dataset = ray.data.from_items([{"shard": json.dumps(record)} for record in records],
                                  override_num_blocks=len(records))
    dataset = dataset.map_batches(
        # A shard is a long task: one in flight per worker, so that none queues shards while another idles.
        _ShardWorker, batch_size=1, compute=ray.data.ActorPoolStrategy(size=workers, max_tasks_in_flight_per_actor=1),
        num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, fn_constructor_kwargs=arguments,
    )
    return list(dataset.iter_rows())


def _settings_record(settings: EmbedSettings) -> dict[str, Any]:
    record = {name: getattr(settings, name) for name in settings.__dataclass_fields__ if name != "device"}
    record["scalar_parameters"] = list(record["scalar_parameters"]) if record["scalar_parameters"] else None
    return record


def _job_record(job: JobIdentity) -> dict[str, Any]:
    return {"model": job.model, "model_files": job.model_files, "settings": job.settings, "reading": job.reading}


def _watch(ray: Any, execution: Any, tracker: Any, pending: list[Shard], directory: Path, shards: int,
           stall_timeout: float, progress: bool, done_rows: int) -> None:
    """Wait for the job's `execution` while showing its progress (the workers' reports to `tracker`) and watching for
    a stalled worker."""
    by_index = {s.index: s for s in pending}
    stalls = _Stalls(stall_timeout)
    bar = tqdm(total=done_rows + sum(s.rows for s in pending), initial=done_rows, unit=" sentences",
               desc="embedding on Ray", file=sys.stderr, disable=not progress)
    try:
        while True:
            ready, _ = ray.wait([execution], timeout=1.0)
            reports = ray.get(tracker.snapshot.remote())
            stalls.saw(reports)
            bar.n = done_rows + sum(report["rows"] for report in reports.values())
            bar.refresh()
            if ready:
                try:
                    results = ray.get(execution)
                except Exception as error:  # the job failed: Ray's report of the error raised in it
                    raise JobError(_ray_error(error, directory)) from None
                break
            if (stalled := stalls.stalled()) is not None:
                raise JobError(_stall_message(stalled, reports, by_index, directory, stall_timeout))
    except KeyboardInterrupt:
        complete = shards - len(pending) + sum(1 for r in ray.get(tracker.snapshot.remote()).values() if r["done"]
                                                 and not r["error"])
        raise JobInterrupted(f"{complete} of {shards} shards are complete in {directory} "
                             f"({size_text(disk_size(directory))}, kept): rerun the same command to resume, or delete "
                             "it") from None
    finally:
        bar.close()
    errors = [str(result["error"]) for result in results if result["error"]]
    if errors:
        more = f" (and {len(errors) - 1} more shards)" if len(errors) > 1 else ""
        raise JobError(f"{errors[0]}{more}; the other shards are complete in {directory}: fix the input and rerun the "
                       "same command, which redoes only what is missing")


class _Stalls:
    """When a job stops making progress: a shard being written whose rows have not moved for `timeout` seconds (its
    worker is named), or, once a worker has started, `timeout` seconds without a report from any. How long workers
    take to start is Ray Data's to bound (`DataContext.wait_for_min_actors_s`)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.moved: dict[int, tuple[tuple[int, bool], float]] = {}  # shard -> ((rows, done), when they last moved)
        self.last: float | None = None  # the latest report that moved; None before the first

    def saw(self, reports: dict[int, dict[str, Any]]) -> None:
        now = time.monotonic()
        for index, report in reports.items():
            state = (report["rows"], report["done"])
            if self.moved.get(index, ((-1, False), 0.0))[0] != state:
                self.moved[index] = (state, now)
                self.last = now

    def stalled(self) -> int | str | None:
        """The stalled shard, `"all"` when no worker moved at all, None while progress is made."""
        now = time.monotonic()
        stalled = [(when, index) for index, ((_, done), when) in self.moved.items()
                   if not done and now - when > self.timeout]
        if stalled:
            return min(stalled)[1]
        return "all" if self.last is not None and now - self.last > self.timeout else None


def _stall_message(stalled: int | str, reports: dict, by_index: dict[int, Shard], directory: Path,
                   timeout: float) -> str:
    kept = f"the job stopped; complete shards are kept in {directory}: rerun the same command to resume"
    if stalled == "all":
        return f"no worker made progress for {timeout:.0f} s (--stall-timeout): {kept}"
    report, shard = reports[stalled], by_index[stalled]
    return (f"worker pid {report['pid']} on {report['node']} made no progress on shard {stalled} ({shard.describe()}, "
            f"{report['rows']} of {shard.rows} sentences) for {timeout:.0f} s (--stall-timeout); {kept}")


def _ray_error(error: BaseException, directory: Path) -> str:
    """Ray's report of a failed job as one line: the error raised in the worker (its last line), without Ray's
    traceback."""
    cause = error
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    text = lines[-1].strip() if lines else type(cause).__name__
    return f"{text} (complete shards are kept in {directory}: rerun the same command to resume)"


class _Progress:
    """The actor workers report each shard's progress to: rows written, by which pid on which node."""

    def __init__(self) -> None:
        self.reports: dict[int, dict[str, Any]] = {}

    def report(self, index: int, rows: int, pid: int, node: str, done: bool = False, error: str = "") -> None:
        self.reports[index] = {"rows": rows, "pid": pid, "node": node, "done": done, "error": error}

    def snapshot(self) -> dict[int, dict[str, Any]]:
        return self.reports


class _ShardWorker:
    """A Ray Data worker: the model loaded once (as `ElmoBatchEmbedder` loads it, on the CPUs and GPU Ray gave this
    process), then each batch of shards embedded and written; returns per shard its rows, or the one line of bad
    input that stopped it (the other shards go on)."""

    def __init__(self, model: str, settings: dict[str, Any], directory: str, job: dict[str, Any], shards: int,
                 progress: Any):
        from .batches import ElmoBatchEmbedder

        self.embedder = ElmoBatchEmbedder(model, **settings).embedder
        self.directory, self.shards, self.progress = Path(directory), shards, progress
        self.job = JobIdentity(**job)
        self.node = socket.gethostname()
        import ray

        self.written_by = {"node": ray.get_runtime_context().get_node_id(), "host": self.node, "pid": os.getpid()}

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        results: dict[str, list] = {"shard": [], "rows": [], "error": []}
        for record in batch["shard"]:
            shard = Shard(**json.loads(str(record)))
            rows, error = 0, ""
            try:
                rows = write_shard(self.embedder, shard, self.shards, self.directory, self.job,
                                   _Reporter(self.progress, shard.index, self.node), self.written_by)
            except InputError as bad_input:
                error = str(bad_input)
            self.progress.report.remote(shard.index, rows, os.getpid(), self.node, True, error)
            results["shard"].append(shard.index)
            results["rows"].append(rows)
            results["error"].append(error)
        return results


class _Reporter:
    """Called after each sentence a worker writes: reports the shard's rows to the progress actor (at its start,
    then at most twice a second)."""

    def __init__(self, progress: Any, index: int, node: str):
        self.progress, self.index, self.node = progress, index, node
        import ray

        self.rows, self.reported = 0, time.monotonic()
        # Delivered before the shard's lock file is written: a worker stopped from then on is seen stalled.
        ray.get(self.progress.report.remote(index, 0, os.getpid(), node))

    def __call__(self) -> None:
        self.rows += 1
        if time.monotonic() - self.reported > 0.5:
            self.reported = time.monotonic()
            self.progress.report.remote(self.index, self.rows, os.getpid(), self.node)
