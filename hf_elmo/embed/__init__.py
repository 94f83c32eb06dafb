"""Embed many sentences with an ELMo biLM: length-sorted batches, streaming input, output in input order.

- `settings`: `EmbedSettings`, every setting of `ElmoEmbedder` / `elmo embed` checked once.
- `embedder`: `ElmoEmbedder`, sentences (lists of words) to per-word vectors (AllenNLP's own: `hf_elmo.allennlp`).
- `windows`: long sentences as windows, the input read ahead in bounded chunks.
- `writers`: HDF5 (AllenNLP's `elmo` command layout; any name but `.npy`) or streamed `.npy`, each file appearing
  once complete.
- `files`: `embed_file`, a text file (one sentence per line) through an embedder into a writer.
- `processes`: `embed_file_in_parts`, one output shared by several processes.

Memory stays flat on any input size: at most `buffer_tokens` positions of input are buffered (plus one sentence of
read-ahead), and the `.npy` writer streams to disk; `runtime.bound_onednn_caches` keeps oneDNN's per-shape kernel
caches from growing with the input.
"""

from .embedder import ElmoEmbedder
from .files import embed_file
from .processes import embed_file_in_parts
from .settings import LAYER_MODES, EmbedSettingError, EmbedSettings
from .writers import FILE_FORMATS, EmbeddingWriter, Hdf5Writer, NpyWriter, check_output, open_writer

__all__ = [
    "LAYER_MODES",
    "FILE_FORMATS",
    "ElmoEmbedder",
    "EmbedSettingError",
    "EmbedSettings",
    "EmbeddingWriter",
    "Hdf5Writer",
    "NpyWriter",
    "check_output",
    "embed_file",
    "embed_file_in_parts",
    "open_writer",
]
