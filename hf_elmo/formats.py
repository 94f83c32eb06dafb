"""The formats original biLMs come in, side by side: each a `WeightFormat` that recognises its files (`detect`), reads
them into a model and its tokenizer exactly (`load`) and writes a `save_pretrained` directory (`convert`, shared);
`FormatError` is what any of them raises for files that are not a model of its format, in one line.

The formats: `original_format.FORMAT` (bilm-tf's and AllenNLP's `options.json` + weights `.hdf5`) and
`efml_format.FORMAT` (ELMoForManyLangs' model directories and .zip archives). `loading.FORMATS` lists them, and
`elmo convert`, the loaders and the published models go through them; a third format is one more such file.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

from .cards import write_model_card
from .modeling_elmo import ElmoModel
from .tokenization_elmo import ElmoCharTokenizer

# What a format reads: its files or directories, in the order its `usage` names them.
Sources = Sequence[str | os.PathLike]


class FormatError(ValueError):
    """Files that are not a model of the format they were read as (missing, unreadable, inconsistent); the message is
    one line naming the file and what is wrong."""


class WeightFormat(ABC):
    """A format of original biLMs. `name` names it in messages; `usage` says its sources as `elmo convert` takes them
    (e.g. `OPTIONS_JSON WEIGHTS_HDF5`)."""

    name: str
    usage: str

    @abstractmethod
    def detect(self, sources: Sources) -> bool:
        """Whether `sources` are a model of this format, by their number, names and a look inside (no weights
        read)."""

    @abstractmethod
    def load(
        self, sources: Sources, word_tokenizer: str | None = None, progress: bool = False
    ) -> tuple[ElmoModel, ElmoCharTokenizer]:
        """The biLM (eval mode) and its tokenizer, converted in memory, exactly; raw text split by `word_tokenizer`
        (default: the format's own convention); `progress`: a bar of the arrays read, on stderr. `FormatError` for
        sources that are not such a model."""

    def check_installed(self, purpose: str) -> None:  # noqa: B027 (most formats need no library of their own)
        """Fail in one line (`ImportError`: the extra to install) where a library that reads this format is missing;
        `purpose` says what needs it ("the published model 'x' is converted from its files, which")."""

    def describe(self, sources: Sources) -> str:
        """The card's "source of the weights" for a model converted from `sources`."""
        return f"Converted from the {self.name} model `{' + '.join(Path(s).name for s in sources)}`."

    def convert(
        self,
        sources: Sources,
        output_dir: str | os.PathLike,
        source: str | None = None,
        repo_id: str | None = None,
        word_tokenizer: str | None = None,
        progress: bool = False,
    ) -> Path:
        """Write the `save_pretrained` directory of the model of `sources`: config, weights, tokenizer, modeling code
        and a model card (its source: `source`, else `describe`; its snippets load `repo_id`, the Hub repo it will be
        pushed to, if given). Returns the directory."""
        model, tokenizer = self.load(sources, word_tokenizer, progress)
        output_dir = Path(output_dir)
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        write_model_card(output_dir, model, source=source or self.describe(sources),
                         **({"repo_id": repo_id} if repo_id else {}))
        return output_dir
