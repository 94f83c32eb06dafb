"""The original format of ELMo models, bilm-tf's and AllenNLP's (`options.json` + weights `.hdf5`): read into an
`ElmoModel` (`model_from_original`; `FORMAT`, this format's `formats.WeightFormat`, converts it into a
`save_pretrained` directory) and written back (`export_hdf5`).

The mapping is a pure re-arrangement (transposes, concatenation, the zero padding row of the character
embedding), so a conversion followed by `export_hdf5` gives back bit-identical arrays.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .configuration_elmo import ElmoConfig
from .extras import require
from .formats import FormatError, Sources, WeightFormat
from .modeling_elmo import ElmoModel
from .tokenization_elmo import ElmoCharTokenizer


def require_h5py(purpose: str = "the original .hdf5 weights"):
    """The h5py module, which only the original format needs (the `hdf5` extra); an `ImportError` in one line
    without it."""
    return require("h5py", f"{purpose} need")


def _require(options: dict, section: str, key: str, path: str | Path) -> Any:
    try:
        return options[section][key]
    except (KeyError, TypeError):
        raise FormatError(f"{path}: missing required key '{section}.{key}'") from None


def config_from_options(options: dict, path: str | Path = "options.json") -> ElmoConfig:
    """An `ElmoConfig` from the parsed original `options.json` (training or inference variant)."""
    if "char_cnn" not in options:
        raise FormatError(f"{path}: no 'char_cnn' section; word-input biLMs are not supported")
    n_characters = options["char_cnn"].get("n_characters", 262)
    if n_characters not in (261, 262):
        raise FormatError(f"{path}: char_cnn.n_characters must be 261 (training) or 262, got {n_characters}")
    return ElmoConfig(
        char_embedding_dim=_require(options["char_cnn"], "embedding", "dim", path),
        filters=_require(options, "char_cnn", "filters", path),
        activation=options["char_cnn"].get("activation", "relu"),
        n_highway=options["char_cnn"].get("n_highway") or 0,
        max_characters_per_token=_require(options, "char_cnn", "max_characters_per_token", path),
        lstm_dim=_require(options, "lstm", "dim", path),
        projection_dim=_require(options, "lstm", "projection_dim", path),
        n_layers=_require(options, "lstm", "n_layers", path),
        cell_clip=options["lstm"].get("cell_clip"),
        proj_clip=options["lstm"].get("proj_clip"),
        use_skip_connections=bool(options["lstm"].get("use_skip_connections", False)),
        dropout=options.get("dropout", 0.1),
    )


def options_from_config(config: ElmoConfig) -> dict:
    """The inference `options.json` content of a config."""
    lstm = {
        "dim": config.lstm_dim,
        "projection_dim": config.projection_dim,
        "n_layers": config.n_layers,
        "use_skip_connections": config.use_skip_connections,
        # Always written (null: no clipping): AllenNLP's `_ElmoBiLm` reads both keys, bilm-tf takes null as none.
        "cell_clip": config.cell_clip,
        "proj_clip": config.proj_clip,
    }
    char_cnn = {
        "activation": config.activation,
        "embedding": {"dim": config.char_embedding_dim},
        "filters": config.filters,
        "max_characters_per_token": config.max_characters_per_token,
        "n_characters": config.n_characters,
        "n_highway": config.n_highway,
    }
    return {"lstm": lstm, "char_cnn": char_cnn, "dropout": config.dropout}


def _lstm_prefix(direction: int, layer: int) -> str:
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def original_layout(config: ElmoConfig) -> dict[str, tuple[int, ...]]:
    """Dataset name → shape of the original weight file for this config."""
    filters, P, D = config.n_filters, config.projection_dim, config.lstm_dim
    layout = {"char_embed": (config.n_characters - 1, config.char_embedding_dim)}
    for i, (width, n) in enumerate(config.filters):
        layout[f"CNN/W_cnn_{i}"] = (1, width, config.char_embedding_dim, n)
        layout[f"CNN/b_cnn_{i}"] = (n,)
    for k in range(config.n_highway):
        for name in ("carry", "transform"):
            layout[f"CNN_high_{k}/W_{name}"] = (filters, filters)
            layout[f"CNN_high_{k}/b_{name}"] = (filters,)
    if config.projects_tokens:
        layout["CNN_proj/W_proj"] = (filters, P)
        layout["CNN_proj/b_proj"] = (P,)
    for direction in range(2):
        for layer in range(config.n_layers):
            prefix = _lstm_prefix(direction, layer)
            layout[f"{prefix}/W_0"] = (P + P, 4 * D)
            layout[f"{prefix}/B"] = (4 * D,)
            if P < D:
                layout[f"{prefix}/W_P_0"] = (D, P)
    return layout


def _read_hdf5(weights_file: str | Path, config: ElmoConfig, progress: bool = False) -> dict[str, np.ndarray]:
    """The datasets of `original_layout(config)`; a `CNN_proj` between equal widths (which AllenNLP reads, and bilm-tf
    never writes) sets `config.token_projection`."""
    h5py = require_h5py()
    try:
        handle = h5py.File(weights_file, "r")
    except FileNotFoundError:
        raise FormatError(f"{weights_file}: no such file") from None
    except OSError as error:
        raise FormatError(f"{weights_file}: not a readable HDF5 weight file ({error})") from None
    arrays: dict[str, np.ndarray] = {}
    with handle:
        found: list[str] = []
        handle.visititems(lambda name, item: found.append(name) if isinstance(item, h5py.Dataset) else None)
        if "embedding" in found and "char_embed" not in found:
            raise FormatError(f"{weights_file}: a word-input biLM ('embedding' dataset); not supported")
        if not config.projects_tokens and "CNN_proj/W_proj" in found:
            config.token_projection = True
        layout = original_layout(config)
        items = tqdm(layout.items(), desc="reading weights", unit=" arrays", disable=not progress, leave=False)
        for name, shape in items:
            if name not in handle:
                raise FormatError(f"{weights_file}: dataset '{name}' is missing (expected shape {shape})")
            try:
                array = np.asarray(handle[name][...], dtype=np.float32)
            except Exception as error:  # h5py raises OSError/KeyError/RuntimeError on damaged data
                raise FormatError(f"{weights_file}: dataset '{name}' cannot be read ({error})") from None
            if array.shape != shape:
                raise FormatError(
                    f"{weights_file}: dataset '{name}' has shape {array.shape}, options.json implies {shape}"
                )
            arrays[name] = array
        unexpected = sorted(set(found) - set(layout))
        if unexpected:
            raise FormatError(
                f"{weights_file}: unexpected dataset(s) {unexpected} for these options "
                f"(n_highway={config.n_highway}, n_layers={config.n_layers}, filters={len(config.filters)} banks)"
            )
    return arrays


def state_dict_from_original(arrays: dict[str, np.ndarray], config: ElmoConfig) -> dict[str, torch.Tensor]:
    """`ElmoModel` state dict from the original datasets (see `original_layout`)."""
    P = config.projection_dim
    state = {
        "char_cnn.char_embedding.weight": np.concatenate(
            [np.zeros((1, config.char_embedding_dim), np.float32), arrays["char_embed"]]
        ),
    }
    for i in range(len(config.filters)):
        state[f"char_cnn.convs.{i}.weight"] = arrays[f"CNN/W_cnn_{i}"][0].transpose(2, 1, 0)
        state[f"char_cnn.convs.{i}.bias"] = arrays[f"CNN/b_cnn_{i}"]
    for k in range(config.n_highway):
        state[f"char_cnn.highway.layers.{k}.weight"] = np.concatenate(
            [arrays[f"CNN_high_{k}/W_transform"].T, arrays[f"CNN_high_{k}/W_carry"].T]
        )
        state[f"char_cnn.highway.layers.{k}.bias"] = np.concatenate(
            [arrays[f"CNN_high_{k}/b_transform"], arrays[f"CNN_high_{k}/b_carry"]]
        )
    if "CNN_proj/W_proj" in arrays:
        state["char_cnn.projection.weight"] = arrays["CNN_proj/W_proj"].T
        state["char_cnn.projection.bias"] = arrays["CNN_proj/b_proj"]
    for layer in range(config.n_layers):
        directions = [_lstm_prefix(d, layer) for d in range(2)]
        key = f"bilstm.layers.{layer}"
        # W_0 multiplies [x; h]: its first P rows read the input, the last P the recurrent state.
        state[f"{key}.input_weight"] = np.stack([arrays[f"{p}/W_0"][:P].T for p in directions])
        state[f"{key}.recurrent_weight"] = np.stack([arrays[f"{p}/W_0"][P:].T for p in directions])
        state[f"{key}.bias"] = np.stack([arrays[f"{p}/B"] for p in directions])
        if f"{directions[0]}/W_P_0" in arrays:
            state[f"{key}.projection_weight"] = np.stack([arrays[f"{p}/W_P_0"].T for p in directions])
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in state.items()}


def original_from_state_dict(state: dict[str, torch.Tensor], config: ElmoConfig) -> dict[str, np.ndarray]:
    """The inverse of `state_dict_from_original`."""
    s = {name: value.detach().cpu().float().numpy() for name, value in state.items()}
    arrays = {"char_embed": s["char_cnn.char_embedding.weight"][1:]}
    for i in range(len(config.filters)):
        arrays[f"CNN/W_cnn_{i}"] = s[f"char_cnn.convs.{i}.weight"].transpose(2, 1, 0)[None]
        arrays[f"CNN/b_cnn_{i}"] = s[f"char_cnn.convs.{i}.bias"]
    F_ = config.n_filters
    for k in range(config.n_highway):
        weight, bias = s[f"char_cnn.highway.layers.{k}.weight"], s[f"char_cnn.highway.layers.{k}.bias"]
        arrays[f"CNN_high_{k}/W_transform"], arrays[f"CNN_high_{k}/W_carry"] = weight[:F_].T, weight[F_:].T
        arrays[f"CNN_high_{k}/b_transform"], arrays[f"CNN_high_{k}/b_carry"] = bias[:F_], bias[F_:]
    if "char_cnn.projection.weight" in s:
        arrays["CNN_proj/W_proj"] = s["char_cnn.projection.weight"].T
        arrays["CNN_proj/b_proj"] = s["char_cnn.projection.bias"]
    for layer in range(config.n_layers):
        key = f"bilstm.layers.{layer}"
        for direction in range(2):
            prefix = _lstm_prefix(direction, layer)
            arrays[f"{prefix}/W_0"] = np.concatenate(
                [s[f"{key}.input_weight"][direction].T, s[f"{key}.recurrent_weight"][direction].T]
            )
            arrays[f"{prefix}/B"] = s[f"{key}.bias"][direction]
            if f"{key}.projection_weight" in s:
                arrays[f"{prefix}/W_P_0"] = s[f"{key}.projection_weight"][direction].T
    return {name: np.ascontiguousarray(value) for name, value in arrays.items()}


def read_options(options_file: str | Path) -> dict:
    try:
        return json.loads(Path(options_file).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{options_file}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise FormatError(f"{options_file}: not valid JSON ({error})") from None


def model_from_original(options_file: str | Path, weights_file: str | Path, progress: bool = False) -> ElmoModel:
    """An `ElmoModel` (eval mode) with the weights of an original options/hdf5 pair (`progress`: a bar of the
    arrays read, on stderr)."""
    config = config_from_options(read_options(options_file), options_file)
    state = state_dict_from_original(_read_hdf5(weights_file, config, progress), config)
    model = ElmoModel(config)
    model.load_state_dict(state, strict=True)
    return model.eval()


class OriginalFormat(WeightFormat):
    """bilm-tf's and AllenNLP's format: two files, `options.json` and the weights `.hdf5`."""

    name = "bilm-tf / AllenNLP"
    usage = "OPTIONS_JSON WEIGHTS_HDF5"

    def detect(self, sources: Sources) -> bool:
        return len(sources) == 2

    def check_installed(self, purpose: str) -> None:
        require_h5py(purpose.replace("its files", "its .hdf5 weights"))

    def load(
        self, sources: Sources, word_tokenizer: str | None = None, progress: bool = False
    ) -> tuple[ElmoModel, ElmoCharTokenizer]:
        if len(sources) != 2:
            raise FormatError(f"the original weights are two files, {self.usage}; got {len(sources)}")
        model = model_from_original(*sources, progress=progress)
        tokenizer = ElmoCharTokenizer(max_characters_per_token=model.config.max_characters_per_token,
                                      word_tokenizer=word_tokenizer)
        return model, tokenizer

    def describe(self, sources: Sources) -> str:
        return f"Converted from the original weights {' + '.join(f'`{os.path.basename(s)}`' for s in sources)}."


FORMAT = OriginalFormat()


def export_hdf5(model: ElmoModel, output_prefix: str | Path) -> tuple[Path, Path]:
    """Write `model` (e.g. `load_model(name)`) as `<prefix>options.json` and `<prefix>weights.hdf5` in the original
    layout; returns both paths."""
    h5py = require_h5py()
    arrays = original_from_state_dict(model.state_dict(), model.config)
    prefix = str(output_prefix)
    options_path, weights_path = Path(prefix + "options.json"), Path(prefix + "weights.hdf5")
    options_path.parent.mkdir(parents=True, exist_ok=True)
    options_path.write_text(json.dumps(options_from_config(model.config), indent=2) + "\n", encoding="utf-8")
    with h5py.File(weights_path, "w") as handle:
        for name, array in arrays.items():
            handle.create_dataset(name, data=array)
    return options_path, weights_path


__all__ = [
    "FORMAT",
    "OriginalFormat",
    "config_from_options",
    "export_hdf5",
    "original_from_state_dict",
    "original_layout",
    "model_from_original",
    "options_from_config",
    "require_h5py",
    "state_dict_from_original",
]
