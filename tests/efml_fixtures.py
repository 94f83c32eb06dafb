"""A random ELMoForManyLangs model made by its own package (`elmoformanylangs`, installed for the tests) and saved
in its format, and that package's `Embedder` with the states reset before each batch."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Characters of several scripts (Latin, Cyrillic, CJK, Arabic); others are out of the lexicon.
CHARACTERS = list(dict.fromkeys("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?-'"
                                "абвгдежзийклмнопрстуфхцчшщъыьэюя中文日本語天氣真好مرحبابالعالم"))
WORDS = ["the", "bank", "of", "river", ".", "Привет", "мир", "中文", "天氣", "مرحبا", "Hello", ","]
SENTENCES = [
    ["The", "bank", "of", "the", "river", "."],
    ["Привет", ",", "мир", "!"],
    ["今", "天", "天氣", "真", "好"],
    ["مرحبا", "بالعالم"],
    ["supercalifragilistic", "x" * 30, "ab"],  # longer than the 8 character slots: cut
    ["ок"],
    [],
    ["Hello", "😀", "Ωmega", "ß", "\u3000"],  # characters and words outside the lexicons
    ["<bos>", "<eos>", "bank"],
]
# The model's configuration (its package's format): every part present, small.
CONFIG = {
    "encoder": {"name": "elmo", "projection_dim": 8, "cell_clip": 3, "proj_clip": 3, "dim": 16, "n_layers": 2},
    "token_embedder": {"name": "cnn", "activation": "relu", "filters": [[1, 4], [2, 8], [3, 8]], "n_highway": 2,
                       "word_dim": 6, "char_dim": 5, "max_characters_per_token": 10},
    "classifier": {"name": "sampled_softmax", "n_samples": 10},
    "dropout": 0.1,
}


def make_efml_model(directory: Path, seed: int = 0, config: dict | None = None) -> Path:
    """An ELMoForManyLangs model with random weights, written by its own classes as its published models are:
    config.json naming the configuration, char.dic (one entry, a space, that its reader turns into U+3000), word.dic,
    token_embedder.pkl and encoder.pkl (state dicts; the encoder in PyTorch's pre-zip format). `config`: another
    configuration than `CONFIG` (the same word and character dimensions)."""
    config = config or CONFIG
    from elmoformanylangs.frontend import Model
    from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

    directory.mkdir(parents=True, exist_ok=True)
    markers = ["<oov>", "<pad>", "<bos>", "<eos>", "<bow>", "<eow>"]
    chars = {entry: i for i, entry in enumerate([*markers, *CHARACTERS])}
    words = {entry: i for i, entry in enumerate(["<oov>", "<pad>", "<bos>", "<eos>", *WORDS])}
    lines = [f"{entry}\t{i}" for entry, i in chars.items()] + [f" \t{len(chars)}"]  # read back as "\u3000"
    (directory / "char.dic").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (directory / "word.dic").write_text("".join(f"{w}\t{i}\n" for w, i in words.items()), encoding="utf-8")
    chars["\u3000"] = len(chars)
    (directory / "cnn_test.json").write_text(json.dumps(config), encoding="utf-8")
    (directory / "config.json").write_text(json.dumps({"seed": 1, "config_path": "cnn_test.json"}), encoding="utf-8")
    torch.manual_seed(seed)
    model = Model(config, EmbeddingLayer(6, words, fix_emb=False), EmbeddingLayer(5, chars, fix_emb=False), False)
    with torch.no_grad():  # weights large enough for the clipping and the gates to matter
        for name, parameter in model.named_parameters():
            if "embedding" not in name:
                parameter.normal_(0.0, 0.5)
    torch.save(model.token_embedder.state_dict(), directory / "token_embedder.pkl")
    # The published models were saved by PyTorch 0.4, before its zip format: the encoder in that format.
    torch.save(model.encoder.state_dict(), directory / "encoder.pkl", _use_new_zipfile_serialization=False)
    return directory


def efml_archive(model_dir: Path, folder: str = "xx.model") -> bytes:
    """The model as the NLPL repository serves one: a .zip holding its folder."""
    import io
    import zipfile

    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        for file in sorted(model_dir.iterdir()):
            archive.write(file, f"{folder}/{file.name}")
    return data.getvalue()


def efml_files(archive: bytes) -> dict[str, bytes]:
    """The same archive under every ELMoForManyLangs model's path (`ELMO_EFML_ENDPOINT` = the server's url)."""
    from hf_elmo.published import EFML_MODELS

    return {model.files[0].path: archive for model in EFML_MODELS.values()}


def their_embedder(model_dir: Path, batch_size: int = 3):
    """ELMoForManyLangs' own `Embedder` of `model_dir`, its stateful encoder reset before every batch (each sentence
    from the zero state, as this project computes)."""
    from elmoformanylangs import Embedder

    embedder = Embedder(str(model_dir), batch_size=batch_size)
    encoder = embedder.model.encoder
    forward = encoder.forward

    def from_the_zero_state(*args, **kwargs):
        encoder.reset_states()
        return forward(*args, **kwargs)

    encoder.forward = from_the_zero_state
    return embedder
