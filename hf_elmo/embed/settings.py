"""How `ElmoEmbedder`, `elmo embed` and `elmo serve` embed: every setting checked once, in `EmbedSettings`, naming
the one at fault (`EmbedSettingError.setting`; the command line names its flag); `VectorLayout`, what they give per
sentence; `Reading`, how inputs are read; `RayOptions`, a job on Ray.

This module imports nothing but the standard library when it is loaded (what checks need torch or the package is
imported where it is used): the `elmo` command reads it without importing the package (torch, transformers:
seconds), for its choices, defaults and help, so that they have this one home. Keep it so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LAYER_MODES = ("all", "top", "average", "mix")
# One vector per sentence over its words (`formulas.pool_words`), after the layer choice; None: a vector per word.
POOLS = ("mean", "max")
# What the vectors are stored in: float32 (the biLM's), or float16 (half the size; float32 rounded to nearest).
DTYPES = ("float32", "float16")




@dataclass(frozen=True)
class VectorLayout:
    """What an embedder gives and a writer stores per sentence: a vector of `token_shape` ((layers, width) or
    (width,)) per word, or with `pooled` one of that shape per sentence, in `dtype` ("float32" or "float16")."""

    token_shape: tuple[int, ...]
    pooled: bool = False
    dtype: str = "float32"

    def shape(self, words: int) -> tuple[int, ...]:
        """The shape of a sentence of `words` words: (layers, words, width), (words, width), or `token_shape`."""
        return self.token_shape if self.pooled else (*self.token_shape[:-1], words, self.token_shape[-1])


class EmbedSettingError(ValueError):
    """A bad setting of `ElmoEmbedder` / `elmo embed`; `setting` names it (the CLI names the flag that set it)."""

    def __init__(self, setting: str, message: str):
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = message


# Marks the fields of `EmbedSettings` that decide the vectors themselves (not how they are batched or where they run):
# what makes two `elmo embed --ray` runs the same job (`vector_settings`).
_SHAPES = {"shapes_vectors": True}


@dataclass(frozen=True)
class EmbedSettings:
    """How `ElmoEmbedder` embeds, checked once when made, each field in one canonical form (see `ElmoEmbedder` for
    each): `scalar_parameters` any sequence of numbers (kept as a tuple), `device` a name or `torch.device` (None:
    where the model is). `to_dict` / `from_dict` carry it to other processes (JSON)."""

    layers: str = field(default="all", metadata=_SHAPES)
    scalar_parameters: tuple[float, ...] | None = field(default=None, metadata=_SHAPES)
    gamma: float = field(default=1.0, metadata=_SHAPES)
    batch_tokens: int = 4096
    buffer_tokens: int | None = None
    batch_size: int | None = None
    max_sentence_words: int = field(default=1000, metadata=_SHAPES)
    device: torch.device | None = None
    bf16: bool = field(default=False, metadata=_SHAPES)
    quantize: str | None = field(default=None, metadata=_SHAPES)
    pool: str | None = field(default=None, metadata=_SHAPES)
    dtype: str = field(default="float32", metadata=_SHAPES)

    def __post_init__(self) -> None:
        from ..configuration_elmo import integer_problem
        from ..kernel_plan import mode_problem

        if self.scalar_parameters is not None and not isinstance(self.scalar_parameters, tuple):
            object.__setattr__(self, "scalar_parameters", tuple(self.scalar_parameters))
        if self.device is not None and type(self.device).__name__ != "device":  # not a torch.device yet
            object.__setattr__(self, "device", self.device_of(self.device))
        if self.layers not in LAYER_MODES:
            raise EmbedSettingError("layers", f"must be one of {', '.join(LAYER_MODES)}, got {self.layers!r}")
        if self.layers != "mix" and (self.scalar_parameters is not None or self.gamma != 1.0):
            raise EmbedSettingError("scalar_parameters" if self.scalar_parameters is not None else "gamma",
                                    "applies to layers='mix' only")
        if problem := mode_problem(self.bf16, self.quantize):
            raise EmbedSettingError("quantize", problem.removeprefix("quantize "))
        if self.pool not in (None, *POOLS):
            raise EmbedSettingError("pool", f'must be None, "mean" or "max", got {self.pool!r}')
        if self.dtype not in DTYPES:
            raise EmbedSettingError("dtype", f'must be "float32" or "float16", got {self.dtype!r}')
        for name in ("batch_tokens", "buffer_tokens", "batch_size", "max_sentence_words"):
            value = getattr(self, name)
            if value is not None and (problem := integer_problem(value, 1)):
                raise EmbedSettingError(name, problem)

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON holds it (`device` by its name); `from_dict` makes the same settings of it."""
        record = {item.name: getattr(self, item.name) for item in fields(self)}
        record["scalar_parameters"] = list(self.scalar_parameters) if self.scalar_parameters is not None else None
        record["device"] = str(self.device) if self.device is not None else None
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> EmbedSettings:
        """The settings `to_dict` gave `record` of (checked again)."""
        return cls(**record)

    def vector_settings(self) -> dict[str, Any]:
        """The fields that decide the vectors themselves (not their batching or device), as `to_dict` gives them."""
        record = self.to_dict()
        return {item.name: record[item.name] for item in fields(self) if item.metadata.get("shapes_vectors")}

    def layout(self, config: Any) -> VectorLayout:
        """What these settings give per sentence with the biLM of `config` (an `ElmoConfig`)."""
        width = config.output_dim
        token_shape = (config.num_output_layers, width) if self.layers == "all" else (width,)
        return VectorLayout(token_shape, self.pool is not None, self.dtype)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default (what `elmo` shows)."""
        return {item.name: item.default for item in fields(cls)}

    @staticmethod
    def device_of(device: str | torch.device | None) -> torch.device | None:
        """The device `device` names (`"cpu"`, `"cuda:1"`, ...), checked to exist here; None for None."""
        import torch

        if device is None:
            return None
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise EmbedSettingError("device", str(error)) from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EmbedSettingError("device", f"{device} was asked for, but this torch sees no CUDA device: run on the "
                                    "CPU (the default), or install a CUDA build of torch on a machine with a GPU")
        return device

    def check_model(self, config: Any) -> None:
        """Fail when the settings do not fit the biLM of `config` (an `ElmoConfig`)."""
        layers = config.num_output_layers
        if self.scalar_parameters is not None and len(self.scalar_parameters) != layers:
            raise EmbedSettingError("scalar_parameters", f"{len(self.scalar_parameters)} values given; the model has "
                                    f"{layers} layers (the token layer + {layers - 1} biLSTM layers)")


@dataclass(frozen=True)
class Reading:
    """How inputs are read: raw text split by the model's word tokenizer, or `tokenized` (words separated by
    whitespace); in `encoding`; the text of a JSON Lines or Parquet input under `text_column`."""

    tokenized: bool = False
    encoding: str = "utf-8"
    text_column: str = "text"


@dataclass(frozen=True)
class RayOptions:
    """A job on Ray (`ray_job.embed_on_ray`): the cluster at `address` (None: a local one of the job's own); `workers`
    model replicas (None: as many as the cluster's CPUs, or GPUs, hold), each with `cpus_per_worker` CPUs and
    `gpus_per_worker` GPUs; `shard_size` lines per shard (None: `shards.default_shard_size`); a worker that makes
    no progress for `stall_timeout` seconds ends the job."""

    address: str | None = None
    workers: int | None = None
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    shard_size: int | None = None
    stall_timeout: float = 600.0
