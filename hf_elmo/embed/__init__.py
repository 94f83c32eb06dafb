"""Embed many sentences with an ELMo biLM: length-sorted batches, streaming input, output in input order.

- `settings`: `EmbedSettings`, every setting of `ElmoEmbedder` / `elmo embed` checked once; `VectorLayout`, what
  they give per sentence.
- `embedder`: `ElmoEmbedder`, sentences (lists of words) to per-word vectors (AllenNLP's own: `hf_elmo.allennlp`),
  or one vector per sentence (`pool`).
- `windows`: long sentences as windows, the input read ahead in bounded chunks.
- `reading`: the one reader of inputs: text (gzip too), JSON Lines, Parquet, stdin.
- `outputs`: what a run leaves on disk: one run per output, never an input overwritten, leftovers named.
- `writers`: HDF5 (AllenNLP's `elmo` command layout), streamed `.npy`, or Parquet (`parquet`: its layout and
  `read_vectors`), each file appearing once complete.
- `files`: `embed_file`, the lines of inputs through an embedder into a writer.
- `batches`: `ElmoBatchEmbedder`, the callable that data engines (Ray Data, HF datasets) map over batches.
- `shards`, `ray_job`: `elmo embed --ray`, a corpus in shards on a Ray cluster, resumed where it stopped.

Memory stays flat on any input size: at most `buffer_tokens` positions of input are buffered (plus one sentence of
read-ahead), and the writers stream to disk; `runtime.bound_onednn_caches` keeps oneDNN's per-shape kernel caches
from growing with the input.
"""

from .embedder import ElmoEmbedder
from .files import embed_file
from .outputs import LeftoverWarning, OutputBusyError, OutputError
from .parquet import read_vectors
from .reading import InputError, Sentence
from .settings import DTYPES, LAYER_MODES, POOLS, EmbedSettingError, EmbedSettings, VectorLayout
from .writers import (
    FILE_FORMATS,
    EmbeddingWriter,
    Hdf5Writer,
    NpyWriter,
    ParquetWriter,
    check_output,
    open_writer,
)

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
    "OutputBusyError",
    "OutputError",
    "ParquetWriter",
    "Sentence",
    "VectorLayout",
    "check_output",
    "embed_file",
    "open_writer",
    "read_vectors",
]
