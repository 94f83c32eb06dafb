"""The format of ELMoForManyLangs' models (HIT-SCIR; 44 languages, each trained on 20 million words of the CoNLL 2018
shared task's raw text): a model directory (or the .zip the NLPL repository serves) read into an `ElmoModel` and its
tokenizer, exactly (`load_efml`; `FORMAT`, this format's `formats.WeightFormat`, converts it into a
`save_pretrained` directory). Its `Embedder` API is `hf_elmo.elmoformanylangs`.

A model directory holds `config.json` (naming a configuration, `cnn_50_100_512_4096_sample.json` for every published
model, which is often missing from the directory: its values are known here), `char.dic` and `word.dic` (the
character and word lexicons), `token_embedder.pkl` and `encoder.pkl` (PyTorch state dicts, read with
`torch.load(weights_only=True)`: tensors and nothing else, no code run). What differs from AllenNLP's models, and how
it maps:

- characters and words go through the lexicons (the tokenizer's `char_lexicon.json` / `word_lexicon.json`);
- a word embedding (`word_dim` 100) is put before the highway output and projected with it;
- the highway gates the carried input (AllenNLP's layer: `g x + (1 - g) f(A x)`), where this model gates the
  transform (bilm-tf's): the gate's weight and bias change sign, `sigmoid(-z) = 1 - sigmoid(z)`;
- the LSTM gates come in AllenNLP's order (input, forget, memory, output), reordered to TensorFlow's, with no forget
  bias added at run time (`ElmoConfig.forget_bias = 0`).

Its encoder is stateful (each batch starts from the states the previous batch left, in a shuffled order); this
project starts every sentence from the zero state, as its own `Embedder` gives after `model.encoder.reset_states()`.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .configuration_elmo import ElmoConfig
from .formats import FormatError, Sources, WeightFormat
from .modeling_elmo import ElmoModel
from .tokenization_elmo import ElmoCharTokenizer

# The configurations shipped in the `elmoformanylangs` package (MIT licence), which the published models name in their
# config.json; both hold these values.
KNOWN_CONFIGS = {
    name: {
        "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
        "token_embedder": {"name": "cnn", "activation": "relu", "n_highway": 2, "word_dim": 100, "char_dim": 50,
                           "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
                           "max_characters_per_token": 50},
        "classifier": {"name": "sampled_softmax", "n_samples": 8192},
        "dropout": 0.1,
    }
    for name in ("cnn_50_100_512_4096_sample.json", "cnn_0_100_512_4096_sample.json")
}
MODEL_FILES = ("config.json", "char.dic", "token_embedder.pkl", "encoder.pkl")


def is_efml_model(path: str | os.PathLike) -> bool:
    """Whether `path` is an ELMoForManyLangs model: a directory with its files, or a .zip holding one."""
    path = Path(path)
    if path.is_dir():
        return all((path / name).is_file() for name in MODEL_FILES)
    if path.suffix.lower() == ".zip" and zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return _model_folder(archive.namelist()) is not None
    return False


def _model_folder(names: Sequence[str]) -> str | None:
    """The folder inside an archive that holds a model's files ("" for the top), or None."""
    for name in names:
        if name.endswith("encoder.pkl"):
            folder = name[: -len("encoder.pkl")]
            if all(folder + file in names for file in MODEL_FILES):
                return folder
    return None


@dataclass(frozen=True)
class EfmlModel:
    """An ELMoForManyLangs model as read from its files."""

    config: dict
    char_lexicon: dict[str, int]
    word_lexicon: dict[str, int] | None
    token_embedder: dict[str, torch.Tensor]
    encoder: dict[str, torch.Tensor]


def read_efml(path: str | os.PathLike) -> EfmlModel:
    """The files of an ELMoForManyLangs model directory, or of the .zip holding one (read in place: the archive's
    members, not extracted)."""
    path = Path(path)
    if not path.exists():
        raise FormatError(f"{path}: no such file or directory")
    if path.is_dir():
        return _read_model(lambda name: path / name, path)
    if not zipfile.is_zipfile(path):
        raise FormatError(f"{path}: neither a model directory nor a .zip of one")
    with zipfile.ZipFile(path) as archive, tempfile.TemporaryDirectory() as folder:
        inside = _model_folder(archive.namelist())
        if inside is None:
            raise FormatError(f"{path}: the archive holds no ELMoForManyLangs model ({', '.join(MODEL_FILES)})")
        for member in archive.namelist():  # the model folder's own files (a name, never a path out of the folder)
            name = member[len(inside):]
            if member.startswith(inside) and name and "/" not in name and name not in (".", ".."):
                with archive.open(member) as packed, open(Path(folder) / name, "wb") as copy:
                    shutil.copyfileobj(packed, copy)
        return _read_model(lambda name: Path(folder) / name, path)


def _read_model(file: Any, source: Path) -> EfmlModel:
    for name in MODEL_FILES:
        if not file(name).is_file():
            raise FormatError(f"{source}: {name} is missing; an ELMoForManyLangs model has "
                                      f"{', '.join(MODEL_FILES)} and word.dic")
    config = _config(file, source)
    embedder = config.get("token_embedder", {})
    if (embedder.get("name", "").lower(), config.get("encoder", {}).get("name", "").lower()) != ("cnn", "elmo"):
        raise FormatError(f"{source}: only ELMoForManyLangs' char-CNN ELMo models convert (token_embedder "
                                  f"'cnn', encoder 'elmo'), not {embedder.get('name')!r} / "
                                  f"{config.get('encoder', {}).get('name')!r}")
    if not embedder.get("char_dim"):
        raise FormatError(f"{source}: the model has no characters (char_dim 0): only word embeddings")
    words = embedder.get("word_dim", 0) > 0
    if words and not file("word.dic").is_file():
        raise FormatError(f"{source}: word.dic is missing (the model has a word embedding)")
    return EfmlModel(
        config=config,
        char_lexicon=read_dic(file("char.dic")),
        word_lexicon=read_dic(file("word.dic")) if words else None,
        token_embedder=_load_state(file("token_embedder.pkl"), source),
        encoder=_load_state(file("encoder.pkl"), source),
    )


def _config(file: Any, source: Path) -> dict:
    """The model's configuration, as ELMoForManyLangs finds it: `config_path` of its config.json, in the model's
    directory, else its file name there, else one of the configurations of its package."""
    try:
        settings = json.loads(file("config.json").read_text(encoding="utf-8"))
        config_path = str(settings["config_path"])
    except (ValueError, KeyError, TypeError) as error:
        raise FormatError(f"{source}: config.json is not an ELMoForManyLangs model's ({error})") from None
    name = Path(config_path).name
    if file(name).is_file():
        try:
            return json.loads(file(name).read_text(encoding="utf-8"))
        except ValueError as error:
            raise FormatError(f"{source}: {name} is not valid JSON ({error})") from None
    if name in KNOWN_CONFIGS:
        return KNOWN_CONFIGS[name]
    raise FormatError(f"{source}: its configuration {config_path} is neither in the model's directory nor one "
                              f"of ELMoForManyLangs' ({', '.join(KNOWN_CONFIGS)}): put it beside config.json")


def read_dic(path: Path) -> dict[str, int]:
    """A lexicon (`char.dic`, `word.dic`) exactly as ELMoForManyLangs reads it: per line `entry<TAB>id`, stripped of
    surrounding whitespace, a line left with the id alone being the entry U+3000 (a whitespace character)."""
    entries = {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            fields = line.strip().split("\t")
            if len(fields) == 1:
                fields.insert(0, "\u3000")
            try:
                entry, entry_id = fields
                entries[entry] = int(entry_id)
            except ValueError:
                raise FormatError(f"{path}:{number}: expected an entry and its id separated by a tab, got "
                                          f"{line.strip()!r:.60}") from None
    return entries


def _load_state(path: Path, source: Path) -> dict[str, torch.Tensor]:
    """A state dict saved with `torch.save`, read with torch's weights-only loader: a file that needs more than
    tensors is refused, never unpickled."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = str(error).split("\n", 1)[0]
        raise FormatError(f"{source}: {path.name} holds more than tensors and is not loaded (nothing in it is "
                                  f"run): {reason}") from None
    except Exception as error:  # torch's loader fails in many ways (struct, zip, EOF...): each is one line here
        raise FormatError(f"{source}: {path.name} is not a readable PyTorch file "
                                  f"({type(error).__name__}: {error})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise FormatError(f"{source}: {path.name} is not a state dict of tensors")
    return state


def elmo_config(model: EfmlModel) -> ElmoConfig:
    """The `ElmoConfig` of an ELMoForManyLangs model: its sizes, the lexicons' tables (+1 rows: the padding row 0),
    no forget bias."""
    encoder, embedder = model.config["encoder"], model.config["token_embedder"]
    char_rows = model.token_embedder["char_emb_layer.embedding.weight"].shape[0]
    word_rows = model.token_embedder["word_emb_layer.embedding.weight"].shape[0] if model.word_lexicon else 0
    return ElmoConfig(
        char_embedding_dim=embedder["char_dim"],
        filters=embedder["filters"],
        activation=embedder["activation"],
        n_highway=embedder["n_highway"],
        n_characters=char_rows + 1,
        max_characters_per_token=embedder["max_characters_per_token"],
        character_vocabulary="lexicon",
        padding_char_id=model.char_lexicon["<pad>"] + 1,
        word_vocab_size=word_rows + 1 if word_rows else 0,
        word_embedding_dim=embedder["word_dim"] if word_rows else 0,
        token_projection=True,  # its token embedder always projects, equal widths too
        lstm_dim=encoder["dim"],
        projection_dim=encoder["projection_dim"],
        n_layers=encoder["n_layers"],
        cell_clip=encoder.get("cell_clip"),
        proj_clip=encoder.get("proj_clip"),
        forget_bias=0.0,
        use_skip_connections=True,
        dropout=model.config.get("dropout", 0.1),
    )


def state_dict(model: EfmlModel, config: ElmoConfig) -> dict[str, torch.Tensor]:
    """The `ElmoModel` state of an ELMoForManyLangs model (see the module for each mapping)."""
    tokens, encoder = model.token_embedder, model.encoder
    state: dict[str, torch.Tensor] = {}

    def padded(table: torch.Tensor) -> torch.Tensor:  # the padding row 0 before the table's rows
        return torch.cat([table.new_zeros(1, table.shape[1]), table])

    state["char_cnn.char_embedding.weight"] = padded(tokens["char_emb_layer.embedding.weight"])
    if config.word_embedding_dim:
        state["char_cnn.word_embedding.weight"] = padded(tokens["word_emb_layer.embedding.weight"])
    for i in range(len(config.filters)):
        for kind in ("weight", "bias"):
            state[f"char_cnn.convs.{i}.{kind}"] = tokens[f"convolutions.{i}.{kind}"]
    n_filters = config.n_filters
    for k in range(config.n_highway):
        for kind in ("weight", "bias"):
            transform, gate = tokens[f"highways._layers.{k}.{kind}"].split(n_filters)
            state[f"char_cnn.highway.layers.{k}.{kind}"] = torch.cat([transform, -gate])
    for kind in ("weight", "bias"):
        state[f"char_cnn.projection.{kind}"] = tokens[f"projection.{kind}"]

    def gates(weight: torch.Tensor) -> torch.Tensor:  # AllenNLP's (i, f, g, o) → TensorFlow's (i, g, f, o)
        i, f, g, o = weight.chunk(4, dim=0)
        return torch.cat([i, g, f, o])

    def both_directions(layer: int, key: str, reorder: bool = True) -> torch.Tensor:  # (2, ...): forward, backward
        weights = [encoder[f"{direction}_layer_{layer}.{key}"] for direction in ("forward", "backward")]
        return torch.stack([gates(w) if reorder else w for w in weights])

    for layer in range(config.n_layers):
        state[f"bilstm.layers.{layer}.input_weight"] = both_directions(layer, "input_linearity.weight")
        state[f"bilstm.layers.{layer}.recurrent_weight"] = both_directions(layer, "state_linearity.weight")
        state[f"bilstm.layers.{layer}.bias"] = both_directions(layer, "state_linearity.bias")
        if config.projection_dim < config.lstm_dim:
            state[f"bilstm.layers.{layer}.projection_weight"] = both_directions(
                layer, "state_projection.weight", reorder=False)
    return state


def load_efml(
    path: str | os.PathLike, word_tokenizer: str | None = None
) -> tuple[ElmoModel, ElmoCharTokenizer]:
    """The `ElmoModel` (eval mode) and tokenizer of an ELMoForManyLangs model directory or .zip, converted in
    memory; raw text is split by `word_tokenizer` (default: on whitespace, as its models read pre-tokenized text)."""
    model_files = read_efml(path)
    config = elmo_config(model_files)
    with torch.device("meta"):
        model = ElmoModel(config)
    model.to_empty(device="cpu")
    try:
        model.load_state_dict(state_dict(model_files, config), strict=True)
    except (KeyError, RuntimeError) as error:
        reason = str(error).split("\n")[:3]
        raise FormatError(f"{path}: the weights do not match the configuration: {' '.join(reason)}") from None
    tokenizer = ElmoCharTokenizer.with_lexicons(
        model_files.char_lexicon, model_files.word_lexicon, max_characters_per_token=config.max_characters_per_token,
        word_tokenizer=word_tokenizer or "whitespace")
    model.config.word_tokenizer = tokenizer.word_tokenizer
    return model.eval(), tokenizer


class EfmlFormat(WeightFormat):
    """ELMoForManyLangs' format: one model directory, or the .zip the NLPL repository serves."""

    name = "ELMoForManyLangs"
    usage = "MODEL_DIR_OR_ZIP"

    def detect(self, sources: Sources) -> bool:
        return len(sources) == 1 and is_efml_model(sources[0])

    def load(
        self, sources: Sources, word_tokenizer: str | None = None, progress: bool = False
    ) -> tuple[ElmoModel, ElmoCharTokenizer]:
        if len(sources) != 1:
            raise FormatError(f"an ELMoForManyLangs model is one directory or .zip ({', '.join(MODEL_FILES)}); got "
                              f"{len(sources)} paths")
        return load_efml(sources[0], word_tokenizer)

    def describe(self, sources: Sources) -> str:
        return f"Converted from the ELMoForManyLangs model `{Path(sources[0]).name}`."


FORMAT = EfmlFormat()
