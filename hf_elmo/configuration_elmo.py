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
        lstm_time_chunk: time steps whose input projections are computed in one matmul at most (bounds memory on
            long sentences).
        lstm_input_block: bytes one matmul of input projections (rows x steps x 4 x cell) writes at most: a
            window's steps are cut to stay under it, so that its output stays in the CPU's caches until its steps
            read it (uncut, a forward ran 1.04 to 1.36 times slower, by mode and batch; docs/performance.md).
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
    lstm_input_block: int = 8 << 20
    single_row_bmm_max_weight: int = 1 << 20
    distinct_words: bool | str = "auto"

    def __post_init__(self) -> None:
        if self.fused_lstm not in FUSED_LSTM_MODES:
            raise ValueError(f"fused_lstm must be 'auto', 'always' or 'never', got {self.fused_lstm!r}")
        for name in ("onednn", "distinct_words"):
            value = getattr(self, name)
            if not (isinstance(value, bool) or value == "auto"):
                raise ValueError(f"{name} must be True, False or 'auto', got {value!r}")
        for name, minimum in (("char_cnn_chunk", 1), ("lstm_time_chunk", 1), ("lstm_input_block", 1),
                              ("single_row_bmm_max_weight", 0)):
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
        self.char_embedding_dim = char_embedding_dim  # size of each character's embedding
        self.filters = PUBLISHED_FILTERS if filters is None else filters  # [width, n_filters] per convolution bank
        self.activation = activation  # after max-pooling each bank: relu or tanh
        self.n_highway = n_highway  # highway layers after the char CNN
        self.n_characters = n_characters  # rows of the character embedding, row 0 padding
        self.max_characters_per_token = max_characters_per_token  # character slots per word, markers included
        self.character_vocabulary = character_vocabulary  # character ids from UTF-8 bytes, or a lexicon
        self.padding_char_id = padding_char_id  # fills a word's slots after its end-of-word character
        self.word_vocab_size = word_vocab_size  # rows of a word embedding beside the char CNN (0: none)
        self.word_embedding_dim = word_embedding_dim  # its width (0: none)
        self.token_projection = token_projection  # project the token representation to projection_dim
        self.lstm_dim = lstm_dim  # LSTM memory cell size
        self.projection_dim = projection_dim  # projected hidden state per direction; outputs are twice as wide
        self.n_layers = n_layers  # LSTM layers per direction
        self.cell_clip = cell_clip  # clip of the memory cell (None or 0: none)
        self.proj_clip = proj_clip  # clip of the projected hidden state (None or 0: none)
        self.forget_bias = forget_bias  # added to the forget gate at run time
        self.use_skip_connections = use_skip_connections  # residual around every LSTM layer but the first
        self.dropout = dropout  # on every LSTM layer's input and before the softmax, in training
        self.vocab_size = vocab_size  # rows of the word softmax of ElmoForBidirectionalLM (None: encoder only)
        self.initializer_range = initializer_range  # for transformers' tools; ELMo's own init ignores it
        self.freeze_elmo = freeze_elmo  # the task models keep the biLM fixed
        self.task_hidden_size = task_hidden_size  # hidden size per direction of the task models' biLSTM
        self.classifier_dropout = classifier_dropout  # on the task models' mix and encoder output, in training
        self.scalar_mix_l2 = scalar_mix_l2  # the task models' L2 on their layer scores
        self.implementation = implementation  # "kernels" (the fast forms) or "reference" (the blocks' forward)
        self.kernel_options = kernel_options  # ElmoKernelOptions fields to change
        hidden_size = kwargs.pop("hidden_size", None)  # transformers' name for the output width: it follows
        kwargs.setdefault("auto_map", dict(AUTO_MAP))
        super().__init__(**kwargs)
        self.validate(hidden_size)

    def validate(self, hidden_size: int | None = None) -> None:
        """Check every field (a `ValueError` of one line naming the field at fault) and keep each in its canonical
        form: integer filter pairs, `None` for a clip of 0 (`options.json`'s "no clipping", as TensorFlow's
        LSTMCell), float biases, `kernel_options` as a dict. `__init__` (so `from_dict` and `from_pretrained`) and
        `save_pretrained` call it; `hidden_size`, given to `__init__`, must be the output width."""
        super().validate()  # transformers' own checks
        for name, minimum, maximum in (
            ("char_embedding_dim", 1, None), ("n_highway", 0, None), ("lstm_dim", 1, None),
            ("projection_dim", 1, None), ("n_layers", 1, None), ("task_hidden_size", 1, None),
            ("max_characters_per_token", 3, MAX_CHARACTERS_PER_TOKEN), ("n_characters", 2, None),
            ("word_vocab_size", 0, None), ("word_embedding_dim", 0, None),
        ):
            if problem := integer_problem(getattr(self, name), minimum, maximum):
                raise ValueError(f"ElmoConfig.{name} {problem}")
        if self.vocab_size is not None and (problem := integer_problem(self.vocab_size, 1)):
            raise ValueError(f"ElmoConfig.vocab_size {problem}")
        filters = self.filters
        if not isinstance(filters, (list, tuple)) or not filters or any(
            not isinstance(f, (list, tuple)) or len(f) != 2 or any(integer_problem(x, 1) for x in f) for f in filters
        ):
            raise ValueError(f"ElmoConfig.filters must be a non-empty list of [width >= 1, n_filters >= 1] integer "
                             f"pairs, got {filters!r}")
        self.filters = [[int(width), int(count)] for width, count in filters]
        if self.activation not in ("relu", "tanh"):
            raise ValueError(f"ElmoConfig.activation must be 'relu' or 'tanh', got {self.activation!r}")
        self._validate_characters()
        self._validate_token_width(hidden_size)
        if isinstance(self.forget_bias, bool) or not isinstance(self.forget_bias, (int, float)):
            raise ValueError(f"ElmoConfig.forget_bias must be a number, got {self.forget_bias!r}")
        self.forget_bias = float(self.forget_bias)
        for name in ("cell_clip", "proj_clip"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"ElmoConfig.{name} must be a number >= 0 (0 or null: no clipping), got {value!r}")
            setattr(self, name, float(value) if value else None)
        for name in ("use_skip_connections", "freeze_elmo"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ElmoConfig.{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("dropout", "classifier_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"ElmoConfig.{name} must be a number in [0, 1), got {value!r}")
        if isinstance(self.scalar_mix_l2, bool) or not isinstance(self.scalar_mix_l2, (int, float)) or (
                self.scalar_mix_l2 < 0):
            raise ValueError(f"ElmoConfig.scalar_mix_l2 must be a number >= 0, got {self.scalar_mix_l2!r}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"ElmoConfig.implementation must be one of {', '.join(IMPLEMENTATIONS)}, got "
                             f"{self.implementation!r}")
        self._validate_kernel_options()

    def _validate_characters(self) -> None:
        if self.character_vocabulary not in CHARACTER_VOCABULARIES:
            raise ValueError(f"ElmoConfig.character_vocabulary must be one of {', '.join(CHARACTER_VOCABULARIES)}, "
                             f"got {self.character_vocabulary!r}")
        if self.character_vocabulary == "bytes" and self.n_characters != BYTE_CHARACTERS:
            raise ValueError(
                f"ElmoConfig.n_characters must be {BYTE_CHARACTERS} (261 character ids + the padding id 0) with "
                f"character_vocabulary='bytes', got {self.n_characters!r}; a training options.json says 261, which "
                "`elmo convert` accepts."
            )
        if self.character_vocabulary == "bytes" and self.padding_char_id != BYTE_PADDING_CHAR_ID:
            raise ValueError(f"ElmoConfig.padding_char_id must be {BYTE_PADDING_CHAR_ID} with "
                             f"character_vocabulary='bytes', got {self.padding_char_id!r}")
        if problem := integer_problem(self.padding_char_id, 1, self.n_characters - 1):
            raise ValueError(f"ElmoConfig.padding_char_id {problem} (a row of the character embedding, not 0)")
        if max(width for width, _ in self.filters) > self.max_characters_per_token:
            raise ValueError("ElmoConfig.filters: a filter is wider than max_characters_per_token")

    def _validate_token_width(self, hidden_size: int | None) -> None:
        if self.token_projection not in (None, True, False):
            raise ValueError(f"ElmoConfig.token_projection must be true, false or null, got "
                             f"{self.token_projection!r}")
        if self.token_projection is False and self.token_input_dim != self.projection_dim:
            raise ValueError(f"ElmoConfig.token_projection is false, but the token width (the word embedding and the "
                             f"filters: {self.token_input_dim}) differs from projection_dim ({self.projection_dim}): "
                             "only a projection maps one onto the other")
        if (self.word_vocab_size > 0) != (self.word_embedding_dim > 0):
            raise ValueError(f"ElmoConfig.word_vocab_size ({self.word_vocab_size}) and word_embedding_dim "
                             f"({self.word_embedding_dim}) are both > 0 (a word embedding) or both 0 (none)")
        if self.projection_dim > self.lstm_dim:
            raise ValueError(f"ElmoConfig.projection_dim ({self.projection_dim}) cannot exceed lstm_dim "
                             f"({self.lstm_dim})")
        if hidden_size is not None and hidden_size != self.output_dim:
            raise ValueError(f"ElmoConfig.hidden_size is the output width 2 * projection_dim ({self.output_dim}), "
                             f"got {hidden_size!r}: set projection_dim instead")

    def _validate_kernel_options(self) -> None:
        options = self.kernel_options
        if isinstance(options, ElmoKernelOptions):
            options = asdict(options)
        if options is not None and not isinstance(options, dict):
            raise ValueError(f"ElmoConfig.kernel_options must be a dict of ElmoKernelOptions fields, got {options!r}")
        try:
            ElmoKernelOptions(**(options or {}))
        except (TypeError, ValueError) as error:
            raise ValueError(f"ElmoConfig.kernel_options: {error}") from None
        self.kernel_options = options or None

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
