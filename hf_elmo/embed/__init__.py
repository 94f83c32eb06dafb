"""Embed many sentences with an ELMo biLM: length-sorted batches, streaming input, output in input order.

- `settings`: `EmbedSettings`, every setting of `ElmoEmbedder` / `elmo embed` / `elmo serve` checked once, carried
  to other processes by its own `to_dict` / `from_dict`; `VectorLayout`, what they give per sentence; `Reading`,
  how inputs are read; `RayOptions`, a job on Ray. Read by `elmo` without importing the package.
- `output_formats`: the registry of output formats (`OUTPUT_FORMATS`); read by `elmo` without importing the package.
- `corpus`: `embed_corpus`, what `elmo embed` runs: in this process, or in shards on Ray.
- `embedder`: `ElmoEmbedder`, sentences (lists of words) to per-word vectors (AllenNLP's own: `hf_elmo.allennlp`),
  or one vector per sentence (`pool`).
- `windows`: long sentences as windows, the input read ahead in bounded chunks.
- `reading`: the one reader of inputs: text (gzip too), JSON Lines, Parquet, stdin.
- `outputs`: what a run leaves on disk: one run per output, never an input overwritten, leftovers named.
- `writers`: the writers' base and the writer a name asks for (the registry); `hdf5` (AllenNLP's `elmo` command
  layout), `npy` (streamed, with offsets), `parquet` (its layout, `ParquetWriter`, `read_vectors`): each file
  appearing once complete.
- `files`: `embed_file`, the lines of inputs through an embedder into a writer.
- `batches`: `ElmoBatchEmbedder`, the callable that data engines (Ray Data, HF datasets) map over batches.
- `shards`, `ray_job`: `elmo embed --ray`, a corpus in shards on a Ray cluster, resumed where it stopped.

Memory stays flat on any input size: at most `buffer_tokens` positions of input are buffered (plus one sentence of
read-ahead), and the writers stream to disk; `runtime.bound_onednn_caches` keeps oneDNN's per-shape kernel caches
from growing with the input.
"""

from .corpus import embed_corpus
from .embedder import ElmoEmbedder
from .files import embed_file
from .hdf5 import Hdf5Writer
from .npy import NpyWriter
from .output_formats import OUTPUT_FORMATS, OutputFormat
from .outputs import LeftoverWarning, OutputBusyError, OutputError
from .parquet import ParquetWriter, read_vectors
from .reading import InputError, Sentence
from .settings import DTYPES, LAYER_MODES, POOLS, EmbedSettingError, EmbedSettings, RayOptions, Reading, VectorLayout
from .writers import FILE_FORMATS, EmbeddingWriter, check_output, open_writer

__all__ = [
    "DTYPES",
    "FILE_FORMATS",
    "LAYER_MODES",
    "POOLS",
    "ElmoEmbedder",
    "EmbedSettingError",
    "EmbedSettings",
    "EmbeddingWriter",
    "Hdf5Writer",
    "InputError",
    "LeftoverWarning",
    "NpyWriter",
    "OUTPUT_FORMATS",
    "OutputFormat",
    "OutputBusyError",
    "OutputError",
    "ParquetWriter",
    "RayOptions",
    "Reading",
    "Sentence",
    "VectorLayout",
    "check_output",
    "embed_corpus",
    "embed_file",
    "open_writer",
    "read_vectors",
]
