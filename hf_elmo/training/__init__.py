"""Training ELMo biLMs: vocabulary, streamed sharded data, the bidirectional LM objective (full or sampled
softmax), atomic checkpoints, evaluation and the `elmo pretrain` loop (Hugging Face Accelerate).

Needs the `train` extra (`pip install ".[train]"`: Accelerate); never imported by the model files, which stay Hub
remote code.
"""

from .checkpointing import latest_checkpoint, load_checkpoint, save_checkpoint
from .data import DataPosition, LMBatches, Segment, encode_batch, group_by_length, split_line
from .evaluation import evaluate, evaluate_model, perplexities
from .losses import BidirectionalLMLoss, full_softmax_loss, log_uniform_candidates, sampled_softmax_loss
from .pretrain import PretrainArguments, parse_arguments, train
from .vocabulary import VOCAB_FILE, WordVocabulary, build_vocabulary, count_corpus_words

__all__ = [
    "VOCAB_FILE",
    "BidirectionalLMLoss",
    "DataPosition",
    "LMBatches",
    "PretrainArguments",
    "Segment",
    "WordVocabulary",
    "build_vocabulary",
    "count_corpus_words",
    "encode_batch",
    "evaluate",
    "evaluate_model",
    "full_softmax_loss",
    "group_by_length",
    "latest_checkpoint",
    "load_checkpoint",
    "log_uniform_candidates",
    "parse_arguments",
    "perplexities",
    "sampled_softmax_loss",
    "save_checkpoint",
    "split_line",
    "train",
]
