"""`embed_corpus`: what `elmo embed` runs, one function for every way a corpus is embedded: in this process into any
output format, or in shards on a Ray cluster (`ray_job`)."""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..loading import load_model_and_tokenizer, load_original
from ..runtime import bound_onednn_caches, set_threads
from .embedder import ElmoEmbedder
from .files import embed_file
from .outputs import EmbedInterrupted, OutputLock, check_not_input
from .settings import EmbedSettings, RayOptions, Reading
from .writers import check_output, output_files


def embed_corpus(
    model: str | os.PathLike,
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    settings: EmbedSettings,
    reading: Reading = Reading(),
    *,
    ray: RayOptions | None = None,
    sentence_index: bool = True,
    sentence_keys: bool = False,
    threads: int | None = None,
    original: tuple[str | os.PathLike, str | os.PathLike] | None = None,
    progress: bool = True,
) -> str:
    """Embed every line (row) of `inputs` (files, globs, directories, `-` for stdin) into `output` with `settings`;
    returns the summary line.

    In this process (`embed_file`; `threads` torch threads, `set_threads`), the output's format by its name
    (`output_formats.OUTPUT_FORMATS`; `sentence_index`, `sentence_keys`: an HDF5 file's); the model a name,
    directory or Hub id, or `original` (options.json, weights .hdf5) for the original weights. With `ray`, on a Ray
    cluster into a directory of Parquet shards (`ray_job.embed_on_ray`). Fails in one line (`InputError`, `OutputError`,
    `ModelLoadError`, `EmbedSettingError` naming the setting, `JobError`); `EmbedInterrupted` on SIGINT, saying
    what is left."""
    inputs, output = [str(name) for name in inputs], Path(output)
    if ray is not None:
        from .ray_job import embed_on_ray

        return embed_on_ray(model, inputs, output, settings, reading, ray, progress)
    check_output(output, sentence_keys)
    # Before the model loads, at once: an output that is an input, or that another run is writing, is refused (the
    # writer checks both again, holding the lock from its first byte to its last).
    check_not_input(output_files(output), [name for name in inputs if name != "-"] or [sys.stdin])
    OutputLock(output).acquire().release()
    set_threads(threads)
    bound_onednn_caches()
    embedder = _embedder(model, settings, original)
    several = len(inputs) > 1 or any(Path(name).is_dir() or glob.has_magic(name) for name in inputs)
    metadata = {"model": str(original[1] if original else model), "layers": settings.layers, "pool": settings.pool}
    try:
        count = embed_file(embedder, inputs if several else inputs[0], output, progress=progress,
                           sentence_index=sentence_index, sentence_keys=sentence_keys, metadata=metadata,
                           **dataclasses.asdict(reading))
    except KeyboardInterrupt:
        raise EmbedInterrupted(f"nothing was written to {output} (its partial file is removed)") from None
    return f"{count} sentences written to {output}"


def _embedder(model: str | os.PathLike, settings: EmbedSettings, original: tuple | None) -> ElmoEmbedder:
    """The embedder of `model` (its name resolved once), or of the original weights."""
    if original is not None:
        from ..original_format import require_h5py

        require_h5py("--options-file/--weight-file")
        loaded, tokenizer = load_original(*original), None
    else:
        loaded, tokenizer = load_model_and_tokenizer(model)
    settings.check_model(loaded.config)
    return ElmoEmbedder(loaded, tokenizer, settings=settings)
