"""ELMo biLM configuration."""

from __future__ import annotations

import numbers

from transformers import PreTrainedConfig

from .text import MAX_CHARACTERS_PER_TOKEN

# The character CNN shared by every published ELMo model (width, number of filters).
PUBLISHED_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]

# Published architectures (allennlp.org/elmo); all share the char CNN above and 2 LSTM layers.
PRESETS: dict[str, dict] = {
    "original": {"lstm_dim": 4096, "projection_dim": 512, "n_highway": 2},  # 2x4096_512_2048cnn_2xhighway
    "medium": {"lstm_dim": 2048, "projection_dim": 256, "n_highway": 1},  # 2x2048_256_2048cnn_1xhighway
    "small": {"lstm_dim": 1024, "projection_dim": 128, "n_highway": 1},  # 2x1024_128_2048cnn_1xhighway
}

AUTO_MAP = {
    "AutoConfig": "configuration_elmo.ElmoConfig",
    "AutoModel": "modeling_elmo.ElmoModel",
    "AutoModelForPreTraining": "modeling_elmo.ElmoForBidirectionalLM",
    "AutoModelForTokenClassification": "modeling_elmo.ElmoForTokenClassification",
    "AutoModelForSequenceClassification": "modeling_elmo.ElmoForSequenceClassification",
}


class ElmoConfig(PreTrainedConfig):
    r"""
    Configuration of an ELMo biLM: a character CNN with highway layers and a projection gives a
    context-independent token representation, read by a forward and a backward stack of LSTMs with
    projection. Field names follow the original `options.json` (`char_cnn.*`, `lstm.*`).

    Args:
        char_embedding_dim (`int`, 16): size of the character embeddings (`char_cnn.embedding.dim`).
        filters (`list[list[int]]`): `[width, n_filters]` per convolution bank (`char_cnn.filters`).
        activation (`str`, `"relu"`): `"relu"` or `"tanh"`, applied after max-pooling each bank.
        n_highway (`int`, 2): number of highway layers after the CNN (`char_cnn.n_highway`).
        n_characters (`int`, 262): rows of the character embedding; 261 byte/marker ids + 1 for padding.
        max_characters_per_token (`int`, 50): character slots per token, begin/end-of-word markers included.
        lstm_dim (`int`, 4096): LSTM memory cell size (`lstm.dim`).
        projection_dim (`int`, 512): projected hidden state size per direction (`lstm.projection_dim`); also the
            size of the token representation. Every output layer has width `2 * projection_dim`.
        n_layers (`int`, 2): LSTM layers per direction (`lstm.n_layers`).
        cell_clip (`float` or `None`, 3.0): clip the memory cell to `[-cell_clip, cell_clip]`; `None` = no clip.
        proj_clip (`float` or `None`, 3.0): clip the projected hidden state; `None` = no clip.
        use_skip_connections (`bool`, `True`): residual connection around every LSTM layer but the first.
        dropout (`float`, 0.1): dropout on every LSTM layer input and before the softmax, in training only.
        vocab_size (`int` or `None`): size of the word softmax of `ElmoForBidirectionalLM`; `None` for an
            encoder-only model (e.g. converted original weights, which ship no softmax).
        initializer_range (`float`, 0.02): unused by ELMo's own init (see `_init_weights`), kept for HF tools.
        freeze_elmo (`bool`, `True`): the task models (`ElmoForTokenClassification`,
            `ElmoForSequenceClassification`) keep the biLM fixed, as the paper does, and learn the rest.
        task_hidden_size (`int`, 128): hidden size per direction of the task models' biLSTM encoder.
        classifier_dropout (`float`, 0.5): dropout on the ELMo mix and on the task encoder's output, in training.
        scalar_mix_l2 (`float`, 0.001): the paper's regulariser `lambda * ||s||^2` on the task models' layer
            scores, added to their loss.

    A model trained with `elmo pretrain` also records `word_tokenizer` (how raw text was split into words for
    training: `spacy:en`, `elmo` or `whitespace`; apply the same at inference) and `word_vocab_file` (the file
    naming the softmax rows, `vocab.txt`; absent once the softmax is dropped with `elmo export-encoder`).
    """

    model_type = "elmo"
    # transformers' names of the configuration's sizes, read by its utilities and tests (hidden_size: a property)
    attribute_map = {"num_hidden_layers": "n_layers"}

    def __init__(
        self,
        char_embedding_dim: int = 16,
        filters: list[list[int]] | None = None,
        activation: str = "relu",
        n_highway: int = 2,
        n_characters: int = 262,
        max_characters_per_token: int = 50,
        lstm_dim: int = 4096,
        projection_dim: int = 512,
        n_layers: int = 2,
        cell_clip: float | None = 3.0,
        proj_clip: float | None = 3.0,
        use_skip_connections: bool = True,
        dropout: float = 0.1,
        vocab_size: int | None = None,
        initializer_range: float = 0.02,
        freeze_elmo: bool = True,
        task_hidden_size: int = 128,
        classifier_dropout: float = 0.5,
        scalar_mix_l2: float = 0.001,
        **kwargs,
    ):
        filters = filters if filters is not None else PUBLISHED_FILTERS
        for name, value, minimum in (
            ("char_embedding_dim", char_embedding_dim, 1), ("n_highway", n_highway, 0),
            ("lstm_dim", lstm_dim, 1),
            ("projection_dim", projection_dim, 1), ("n_layers", n_layers, 1), ("task_hidden_size", task_hidden_size, 1),
        ):
            _check_integer(name, value, minimum)
        _check_integer("max_characters_per_token", max_characters_per_token, 3, MAX_CHARACTERS_PER_TOKEN)
        if vocab_size is not None:
            _check_integer("vocab_size", vocab_size, 1)
        if not isinstance(filters, (list, tuple)) or not filters or any(
            not isinstance(f, (list, tuple)) or len(f) != 2 or not all(_is_integer(x) and x >= 1 for x in f)
            for f in filters
        ):
            raise ValueError(f"ElmoConfig.filters must be a non-empty list of [width >= 1, n_filters >= 1] integer "
                             f"pairs, got {filters!r}")
        filters = [[int(width), int(count)] for width, count in filters]
        if activation not in ("relu", "tanh"):
            raise ValueError(f"ElmoConfig.activation must be 'relu' or 'tanh', got {activation!r}")
        if n_characters != 262:
            raise ValueError(
                f"ElmoConfig.n_characters must be 262 (261 character ids + the padding id 0), got {n_characters!r}; "
                "a training options.json says 261, which `elmo convert` accepts."
            )
        if max(w for w, _ in filters) > max_characters_per_token:
            raise ValueError("ElmoConfig.filters: a filter is wider than max_characters_per_token")
        if projection_dim > lstm_dim:
            raise ValueError(f"ElmoConfig.projection_dim ({projection_dim}) cannot exceed lstm_dim ({lstm_dim})")
        hidden_size = kwargs.pop("hidden_size", None)  # transformers' name for the output width: it follows
        if hidden_size is not None and hidden_size != 2 * projection_dim:
            raise ValueError(f"ElmoConfig.hidden_size is the output width 2 * projection_dim ({2 * projection_dim}), "
                             f"got {hidden_size!r}: set projection_dim instead")
        for name, value in (("cell_clip", cell_clip), ("proj_clip", proj_clip)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"ElmoConfig.{name} must be a number >= 0 (0 or null: no clipping), got {value!r}")
        if not isinstance(use_skip_connections, bool):
            raise ValueError(f"ElmoConfig.use_skip_connections must be true or false, got {use_skip_connections!r}")
        for name, value in (("dropout", dropout), ("classifier_dropout", classifier_dropout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"ElmoConfig.{name} must be a number in [0, 1), got {value!r}")
        if not isinstance(freeze_elmo, bool):
            raise ValueError(f"ElmoConfig.freeze_elmo must be true or false, got {freeze_elmo!r}")
        if isinstance(scalar_mix_l2, bool) or not isinstance(scalar_mix_l2, (int, float)) or scalar_mix_l2 < 0:
            raise ValueError(f"ElmoConfig.scalar_mix_l2 must be a number >= 0, got {scalar_mix_l2!r}")
        self.char_embedding_dim = char_embedding_dim
        self.filters = filters
        self.activation = activation
        self.n_highway = n_highway
        self.n_characters = n_characters
        self.max_characters_per_token = max_characters_per_token
        self.lstm_dim = lstm_dim
        self.projection_dim = projection_dim
        self.n_layers = n_layers
        # 0 means "no clipping" in options.json, as in TensorFlow's LSTMCell.
        self.cell_clip = float(cell_clip) if cell_clip else None
        self.proj_clip = float(proj_clip) if proj_clip else None
        self.use_skip_connections = use_skip_connections
        self.dropout = dropout
        self.vocab_size = vocab_size
        self.initializer_range = initializer_range
        self.freeze_elmo = freeze_elmo
        self.task_hidden_size = task_hidden_size
        self.classifier_dropout = classifier_dropout
        self.scalar_mix_l2 = scalar_mix_l2
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__init__(**kwargs)

    @property
    def n_filters(self) -> int:
        """Total number of CNN filters, the width of the highway layers."""
        return sum(n for _, n in self.filters)

    @property
    def output_dim(self) -> int:
        """Width of every output layer: `[forward; backward]`."""
        return 2 * self.projection_dim

    @property
    def hidden_size(self) -> int:
        """transformers' name for the width of the hidden states (read by its pipelines and utilities): `output_dim`.
        """
        return self.output_dim

    @property
    def num_output_layers(self) -> int:
        """Token layer plus one per LSTM layer."""
        return self.n_layers + 1

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ElmoConfig:
        """One of the published architectures: `"original"`, `"medium"` or `"small"`."""
        if name not in PRESETS:
            raise ValueError(f"unknown ELMo preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_integer(name: str, value, minimum: int, maximum: int | None = None) -> None:
    if not _is_integer(value) or value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise ValueError(f"ElmoConfig.{name} must be an integer {bounds}, got {value!r}")


ElmoConfig.register_for_auto_class()

__all__ = ["ElmoConfig", "PRESETS"]
