"""Every upload to the Hub, and the encoder of a trained biLM (`export_encoder`); the cards are `hf_elmo.cards`.

Uploads go through `push_directory` (create the repo, upload a directory in one commit): `push_to_hub` (a model,
its tokenizer and card) and `elmo pretrain --push_to_hub` (a trained directory, without its checkpoints) use it.
transformers' own `model.push_to_hub(repo_id)` works as for any model, with transformers' template card.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch
from huggingface_hub import CommitInfo, HfApi

from .cards import card_metadata, card_source, model_card, write_model_card
from .loading import load_config, load_model
from .tokenization_elmo import ElmoCharTokenizer

# The package's files that `save_pretrained` copies beside a model as its Hub remote code (transformers follows the
# relative imports of the config's, the model's and the tokenizer's files), so that `trust_remote_code=True` runs
# them without this package: flat, importing the standard library, `REMOTE_CODE_LIBRARIES` and each other alone, and
# `REMOTE_CODE_OPTIONAL` inside a function that needs it (tests/test_hub.py holds every file to it).
REMOTE_CODE = ("configuration_elmo.py", "formulas.py", "inference_cache.py", "kernel_plan.py", "kernels.py",
               "modeling_elmo.py", "runtime.py", "text.py", "tokenization_elmo.py", "weight_forms.py")
REMOTE_CODE_LIBRARIES = ("numpy", "regex", "torch", "transformers")
REMOTE_CODE_OPTIONAL = ("spacy",)  # the `spacy:<lang>` word tokenizers (one ImportError line without it)


def export_encoder(
    trained_dir: str | os.PathLike, output_dir: str | os.PathLike, note: str | None = None, remote_code: bool = True
) -> Path:
    """Save the biLM of an `ElmoForBidirectionalLM` directory without its word softmax (what downstream users need).

    Writes model, tokenizer and a card into `output_dir`. The card keeps the trained card's "Source of the weights"
    (corpus, tokenizer, steps, perplexities measured with the softmax), adds that the softmax was dropped and then
    `note` (e.g. the hardware and training time). `config.word_tokenizer` is kept; `vocab_size` and
    `word_vocab_file` are removed. With `remote_code=False` the directory holds no copy of the modeling code and no
    `auto_map` (it then loads only where `hf_elmo` is imported, e.g. the model shipped inside the package).
    Returns `output_dir`.
    """
    trained_dir, output_dir = Path(trained_dir), Path(output_dir)
    config = load_config(trained_dir)
    if not config.vocab_size:
        raise ValueError(f"{trained_dir} holds no word softmax (config.vocab_size is {config.vocab_size})")
    model = load_model(trained_dir)
    model.config.vocab_size = None
    if hasattr(model.config, "word_vocab_file"):
        del model.config.word_vocab_file
    readme = trained_dir / "README.md"
    card_text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    source = card_source(card_text) or "Not recorded: the trained directory has no model card."
    source += (
        f"\n\nThe word softmax ({config.vocab_size:,} words) was dropped after training with `elmo export-encoder`: "
        "the perplexities above were measured with it; this model gives the representations only."
    )
    if note:
        source += f"\n\n{note.strip()}"
    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    word_tokenizer = getattr(model.config, "word_tokenizer", None)  # raw text split as in training
    ElmoCharTokenizer.from_pretrained(trained_dir, word_tokenizer=word_tokenizer).save_pretrained(output_dir)
    write_model_card(output_dir, model, source, metadata=card_metadata(card_text) if card_text else None,
                     remote_code=remote_code)
    if not remote_code:
        for code_file in output_dir.glob("*.py"):
            code_file.unlink()
        for name in ("config.json", "tokenizer_config.json"):
            settings = json.loads((output_dir / name).read_text(encoding="utf-8"))
            settings.pop("auto_map", None)
            (output_dir / name).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return output_dir


def push_to_hub(
    model: torch.nn.Module,
    tokenizer: ElmoCharTokenizer | None,
    repo_id: str,
    source: str | None = None,
    *,
    tags: list[str] | None = None,
    private: bool | None = None,
    token: str | bool | None = None,
    commit_message: str = "Upload ELMo model, tokenizer and model card",
) -> CommitInfo:
    """Upload `model`, its tokenizer and its card (with `source`, default `weights_source`, and `tags` added to the
    card's own) in one commit.

    Creates the repo if needed. The card replaces any README.md already in the repo. Without `tokenizer`, the
    `ElmoCharTokenizer` matching the model's config is uploaded.
    """
    repo_id = HfApi().create_repo(repo_id, private=private, token=token, exist_ok=True).repo_id
    if tokenizer is None:
        tokenizer = ElmoCharTokenizer.for_model(model.config)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        model_card(model, repo_id, source, tags).save(Path(folder) / "README.md")
        return push_directory(folder, repo_id, commit_message=commit_message, token=token)


def push_directory(
    directory: str | os.PathLike,
    repo_id: str,
    *,
    ignore_patterns: list[str] | None = None,
    commit_message: str = "Upload ELMo model",
    private: bool | None = None,
    token: str | bool | None = None,
) -> CommitInfo:
    """Upload the files of `directory` (but those matching `ignore_patterns`) to `repo_id` in one commit, creating
    the repo if needed."""
    api = HfApi()
    repo_id = api.create_repo(repo_id, private=private, token=token, exist_ok=True).repo_id
    return api.upload_folder(repo_id=repo_id, folder_path=str(Path(directory)), ignore_patterns=ignore_patterns,
                             commit_message=commit_message, token=token)
