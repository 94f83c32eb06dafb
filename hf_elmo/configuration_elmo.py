"""ELMo biLM configuration."""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass

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

# How `ElmoModel` computes its layers: "kernels" (`hf_elmo.kernels`, the fast forms for the device) or "reference"
# (each block's own `forward`, the paper's computation written plainly; also what compilers trace).
IMPLEMENTATIONS = ("kernels", "reference")
# How characters become ids: "bytes" (UTF-8 bytes and markers: AllenNLP's and bilm-tf's models) or "lexicon" (a table
# of the characters seen in training, saved with the tokenizer: ELMoForManyLangs' `char.dic`).
CHARACTER_VOCABULARIES = ("bytes", "lexicon")
# The byte vocabulary: 261 ids (256 bytes, the sentence and word markers, padding) shifted by one, 0 being padding.
BYTE_CHARACTERS, BYTE_PADDING_CHAR_ID = 262, 261
FUSED_LSTM_MODES = ("auto", "always", "never")

AUTO_MAP = {
    "AutoConfig": "configuration_elmo.ElmoConfig",
    "AutoModel": "modeling_elmo.ElmoModel",
    "AutoModelForPreTraining": "modeling_elmo.ElmoForBidirectionalLM",
    "AutoModelForTokenClassification": "modeling_elmo.ElmoForTokenClassification",
    "AutoModelForSequenceClassification": "modeling_elmo.ElmoForSequenceClassification",
}


@dataclass(frozen=True)
class ElmoKernelOptions:
    """The kernels' choices (`ElmoConfig.kernel_options`, `implementation="kernels"`): how the arithmetic runs, never
    what it computes beyond float32 rounding (but `fused_lstm="always"` on a clipped model). Measurements behind the
    defaults: docs/performance.md.

    Args:
        onednn: CPU float32 inference matmuls through oneDNN (True) or `F.linear`, i.e. MKL (False): the same IEEE
            float32 arithmetic summed in another order (outputs differ by ~1e-6). `"auto"`: MKL on Intel CPUs, where
            it runs its own fastest code, oneDNN elsewhere, where MKL takes its AVX2 path. Training (autograd) always
            uses `F.linear`; the bf16 mode packs for oneDNN wherever it packs bf16 weights (`runtime`).
        fused_lstm: `"auto"` runs the biLSTM through `nn.LSTM` (cuDNN) on a GPU for models without cell or
            projection clipping, where it computes the same function, else the step loop; `"always"` also for
            clipped models (an approximation: the original ELMo weights clip at 3); `"never"` the step loop.
        char_cnn_chunk: distinct words per char-CNN call (bounds the memory of the convolution outputs).
        lstm_time_chunk: time steps whose input projections are computed in one matmul (bounds memory on long
            sentences).
        single_row_bmm_max_weight: largest per-direction weight (elements) for which a one-row LSTM step uses one
            batched MKL matmul for both directions rather than two oneDNN calls (each with a fixed cost).
        distinct_words: the char CNN runs on each distinct word of a batch once, grouped by length and cut after the
            characters the longest word of a group uses (True), or on every position of the batch, all character
            slots (False): the same values. `"auto"`: distinct words on a CPU; every position on a GPU, where finding
            the distinct words and their lengths makes the host wait for the device.
    """

    onednn: bool | str = "auto"
    fused_lstm: str = "auto"
    char_cnn_chunk: int = 1024
    lstm_time_chunk: int = 128
    single_row_bmm_max_weight: int = 1 << 20
    distinct_words: bool | str = "auto"

    def __post_init__(self) -> None:
        if self.fused_lstm not in FUSED_LSTM_MODES:
            raise ValueError(f"fused_lstm must be 'auto', 'always' or 'never', got {self.fused_lstm!r}")
        for name in ("onednn", "distinct_words"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or value == "auto"):
                raise ValueError(f"{name} must be True, False or 'auto', got {value!r}")
        for name, minimum in (("char_cnn_chunk", 1), ("lstm_time_chunk", 1), ("single_row_bmm_max_weight", 0)):
            if problem := integer_problem(getattr(self, name), minimum):
                raise ValueError(f"{name} {problem}")


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
        n_characters (`int`, 262): rows of the character embedding, row 0 a padding position's: 261 byte/marker ids
            + 1 with `character_vocabulary="bytes"`, the lexicon's size + 1 with `"lexicon"`.
        character_vocabulary (`str`, `"bytes"`): how the tokenizer gives character ids: `"bytes"` (UTF-8 bytes and
            markers, AllenNLP's and bilm-tf's models) or `"lexicon"` (a character table saved with the tokenizer,
            ELMoForManyLangs' `char.dic`).
        padding_char_id (`int`, 261): the id that fills a word's slots after its end-of-word character.
        word_vocab_size (`int`, 0), word_embedding_dim (`int`, 0): a word embedding beside the char CNN (both > 0, or
            both 0 for none: every model but ELMoForManyLangs'): `word_vocab_size` rows (row 0 a padding position's),
            each of `word_embedding_dim`, put before the highway output and projected with it.
        token_projection (`bool` or `None`, `None`): whether a linear projection maps the word embedding and the
            highway output to the LSTM input width (`projection_dim`): `None` where the widths differ (bilm-tf's
            rule: the published models), `True` always (ELMoForManyLangs' models; original weights with a
            `CNN_proj` of equal widths), `False` never (the widths must be equal).
        max_characters_per_token (`int`, 50): character slots per token, begin/end-of-word markers included.
        lstm_dim (`int`, 4096): LSTM memory cell size (`lstm.dim`).
        projection_dim (`int`, 512): projected hidden state size per direction (`lstm.projection_dim`); also the
            size of the token representation. Every output layer has width `2 * projection_dim`.
        n_layers (`int`, 2): LSTM layers per direction (`lstm.n_layers`).
        forget_bias (`float`, 1.0): added to the forget gate's pre-activation at run time (TensorFlow's LSTMCell does;
            0 for LSTMs trained without it, as ELMoForManyLangs').
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
        implementation (`str`, `"kernels"`): how `ElmoModel` computes its layers, as `attn_implementation` in
            transformers: `"kernels"` (`hf_elmo.kernels`: oneDNN or cuDNN, the char CNN once per distinct word, the
            LSTM step loop over the rows still active, caches) or `"reference"` (each block's `forward`, the paper's
            computation written plainly; what compilers and `torch.export` trace either way). The same function to
            float32 rounding.
        kernel_options (`dict`, optional): the fields of `ElmoKernelOptions` to change, e.g.
            `{"fused_lstm": "always"}`.

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
        n_characters: int = BYTE_CHARACTERS,
        max_characters_per_token: int = 50,
        character_vocabulary: str = "bytes",
        padding_char_id: int = BYTE_PADDING_CHAR_ID,
        word_vocab_size: int = 0,
        word_embedding_dim: int = 0,
        token_projection: bool | None = None,
        lstm_dim: int = 4096,
        projection_dim: int = 512,
        n_layers: int = 2,
        cell_clip: float | None = 3.0,
        proj_clip: float | None = 3.0,
        forget_bias: float = 1.0,
        use_skip_connections: bool = True,
        dropout: float = 0.1,
        vocab_size: int | None = None,
        initializer_range: float = 0.02,
        freeze_elmo: bool = True,
        task_hidden_size: int = 128,
        classifier_dropout: float = 0.5,
        scalar_mix_l2: float = 0.001,
        implementation: str = "kernels",
        kernel_options: dict | ElmoKernelOptions | None = None,
        **kwargs,
    ):
        filters = filters if filters is not None else PUBLISHED_FILTERS
        for name, value, minimum, maximum in (
            ("char_embedding_dim", char_embedding_dim, 1, None), ("n_highway", n_highway, 0, None),
            ("lstm_dim", lstm_dim, 1, None), ("projection_dim", projection_dim, 1, None),
            ("n_layers", n_layers, 1, None), ("task_hidden_size", task_hidden_size, 1, None),
            ("max_characters_per_token", max_characters_per_token, 3, MAX_CHARACTERS_PER_TOKEN),
            ("vocab_size", 1 if vocab_size is None else vocab_size, 1, None),
            ("n_characters", n_characters, 2, None), ("word_vocab_size", word_vocab_size, 0, None),
            ("word_embedding_dim", word_embedding_dim, 0, None),
        ):
            if problem := integer_problem(value, minimum, maximum):
                raise ValueError(f"ElmoConfig.{name} {problem}")
        if not isinstance(filters, (list, tuple)) or not filters or any(
            not isinstance(f, (list, tuple)) or len(f) != 2 or any(integer_problem(x, 1) for x in f) for f in filters
        ):
            raise ValueError(f"ElmoConfig.filters must be a non-empty list of [width >= 1, n_filters >= 1] integer "
                             f"pairs, got {filters!r}")
        filters = [[int(width), int(count)] for width, count in filters]
        if activation not in ("relu", "tanh"):
            raise ValueError(f"ElmoConfig.activation must be 'relu' or 'tanh', got {activation!r}")
        if character_vocabulary not in CHARACTER_VOCABULARIES:
            raise ValueError(f"ElmoConfig.character_vocabulary must be one of {', '.join(CHARACTER_VOCABULARIES)}, got "
                             f"{character_vocabulary!r}")
        if character_vocabulary == "bytes" and n_characters != BYTE_CHARACTERS:
            raise ValueError(
                f"ElmoConfig.n_characters must be {BYTE_CHARACTERS} (261 character ids + the padding id 0) with "
                f"character_vocabulary='bytes', got {n_characters!r}; a training options.json says 261, which "
                "`elmo convert` accepts."
            )
        if character_vocabulary == "bytes" and padding_char_id != BYTE_PADDING_CHAR_ID:
            raise ValueError(f"ElmoConfig.padding_char_id must be {BYTE_PADDING_CHAR_ID} with "
                             f"character_vocabulary='bytes', got {padding_char_id!r}")
        if problem := integer_problem(padding_char_id, 1, n_characters - 1):
            raise ValueError(f"ElmoConfig.padding_char_id {problem} (a row of the character embedding, not 0)")
        if token_projection not in (None, True, False):
            raise ValueError(f"ElmoConfig.token_projection must be true, false or null, got {token_projection!r}")
        if token_projection is False and word_embedding_dim + sum(n for _, n in filters) != projection_dim:
            raise ValueError(f"ElmoConfig.token_projection is false, but the token width (the word embedding and the "
                             f"filters: {word_embedding_dim + sum(n for _, n in filters)}) differs from "
                             f"projection_dim ({projection_dim}): only a projection maps one onto the other")
        if (word_vocab_size > 0) != (word_embedding_dim > 0):
            raise ValueError(f"ElmoConfig.word_vocab_size ({word_vocab_size}) and word_embedding_dim "
                             f"({word_embedding_dim}) are both > 0 (a word embedding) or both 0 (none)")
        if max(w for w, _ in filters) > max_characters_per_token:
            raise ValueError("ElmoConfig.filters: a filter is wider than max_characters_per_token")
        if projection_dim > lstm_dim:
            raise ValueError(f"ElmoConfig.projection_dim ({projection_dim}) cannot exceed lstm_dim ({lstm_dim})")
        hidden_size = kwargs.pop("hidden_size", None)  # transformers' name for the output width: it follows
        if hidden_size is not None and hidden_size != 2 * projection_dim:
            raise ValueError(f"ElmoConfig.hidden_size is the output width 2 * projection_dim ({2 * projection_dim}), "
                             f"got {hidden_size!r}: set projection_dim instead")
        if isinstance(forget_bias, bool) or not isinstance(forget_bias, (int, float)):
            raise ValueError(f"ElmoConfig.forget_bias must be a number, got {forget_bias!r}")
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
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"ElmoConfig.implementation must be one of {', '.join(IMPLEMENTATIONS)}, got "
                             f"{implementation!r}")
        if isinstance(kernel_options, ElmoKernelOptions):
            kernel_options = asdict(kernel_options)
        if kernel_options is not None and not isinstance(kernel_options, dict):
            raise ValueError(f"ElmoConfig.kernel_options must be a dict of ElmoKernelOptions fields, got "
                             f"{kernel_options!r}")
        try:
            ElmoKernelOptions(**(kernel_options or {}))
        except (TypeError, ValueError) as error:
            raise ValueError(f"ElmoConfig.kernel_options: {error}") from None
        self.char_embedding_dim = char_embedding_dim
        self.filters = filters
        self.activation = activation
        self.n_highway = n_highway
        self.n_characters = n_characters
        self.max_characters_per_token = max_characters_per_token
        self.character_vocabulary = character_vocabulary
        self.padding_char_id = padding_char_id
        self.word_vocab_size = word_vocab_size
        self.word_embedding_dim = word_embedding_dim
        self.token_projection = token_projection
        self.lstm_dim = lstm_dim
        self.projection_dim = projection_dim
        self.n_layers = n_layers
        # 0 means "no clipping" in options.json, as in TensorFlow's LSTMCell.
        self.cell_clip = float(cell_clip) if cell_clip else None
        self.proj_clip = float(proj_clip) if proj_clip else None
        self.forget_bias = float(forget_bias)
        self.use_skip_connections = use_skip_connections
        self.dropout = dropout
        self.vocab_size = vocab_size
        self.initializer_range = initializer_range
        self.freeze_elmo = freeze_elmo
        self.task_hidden_size = task_hidden_size
        self.classifier_dropout = classifier_dropout
        self.scalar_mix_l2 = scalar_mix_l2
        self.implementation = implementation
        self.kernel_options = kernel_options or None
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__init__(**kwargs)

    @property
    def n_filters(self) -> int:
        """Total number of CNN filters, the width of the highway layers."""
        return sum(n for _, n in self.filters)

    @property
    def token_input_dim(self) -> int:
        """Width of what the projection to the LSTM input reads: the word embedding, then the highway output."""
        return self.word_embedding_dim + self.n_filters

    @property
    def projects_tokens(self) -> bool:
        """Whether the token representation is projected to `projection_dim` (`token_projection`)."""
        if self.token_projection is None:
            return self.token_input_dim != self.projection_dim
        return self.token_projection

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

    def kernels(self) -> ElmoKernelOptions:
        """`kernel_options` as `ElmoKernelOptions` (the defaults where unset)."""
        return ElmoKernelOptions(**(self.kernel_options or {}))

    @classmethod
    def from_preset(cls, name: str, **overrides) -> ElmoConfig:
        """One of the published architectures: `"original"`, `"medium"` or `"small"`."""
        if name not in PRESETS:
            raise ValueError(f"unknown ELMo preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


def integer_problem(value: object, minimum: int, maximum: int | None = None) -> str | None:
    """What is wrong with `value` as an integer in [minimum, maximum] ("must be an integer >= 1, got 0"), or None:
    the project's one check of an integer setting (True and 3.0 are not integers)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum and (
            maximum is None or value <= maximum):
        return None
    bounds = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    return f"must be an integer {bounds}, got {value!r}"


ElmoConfig.register_for_auto_class()

__all__ = ["ElmoConfig", "ElmoKernelOptions", "PRESETS", "integer_problem"]
