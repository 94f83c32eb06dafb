"""Command line: `python -m spacy_elmo init-config|convert-conll2003|convert-sst5|convert-sst2|mix-weights`, and
`spacy init elmo-config` (registered through the `spacy_cli` entry point).

    python -m spacy_elmo init-config ner config.cfg                 # the default English biLM
    python -m spacy_elmo init-config ner config.cfg --model original  # the published biLM, or a directory or Hub id
    python -m spacy_elmo init-config ner config.cfg --model efml-de   # German (ELMoForManyLangs): lang = "de"
    python -m spacy_elmo convert-conll2003 ../shared/data/conll2003/iob2/train.txt corpus/train.spacy
    python -m spacy train config.cfg --output out --paths.train corpus/train.spacy --paths.dev corpus/dev.spacy
"""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from spacy.cli._util import init_cli
from spacy.vocab import Vocab
from thinc.api import Config

from .corpora import read_conll2003, read_sst2, read_sst5, write_docbin

CONFIGS_DIR = Path(__file__).parent / "configs"
TASKS = tuple(sorted(path.stem for path in CONFIGS_DIR.glob("*.cfg")))  # a task is its base config: ner, textcat
# Where the task model takes ELMo (the paper's Table 3): at its input, at the input and the output of its biLSTM,
# or nowhere (the same task model without ELMo, for with/without comparisons).
ELMO_PLACEMENTS = ("input", "input+output", "none")
# The task encoder (the `tok2vec` of the task model): the shipped configs' biLSTM, or the paper's SST-5 encoder, the
# biattentive classification network (BCN: biLSTM, self-attention, integrating biLSTM; text classification only).
ENCODERS = {
    "bilstm": None,
    "bcn": {"@architectures": "spacy-elmo.BiattentiveEncoder.v1", "width": 256, "feedforward_width": 256,
            "dropout": 0.25},
}

app = typer.Typer(
    name="spacy_elmo", help="ELMo for spaCy: training configs and corpus converters.", no_args_is_help=True
)
Task = Annotated[str, typer.Argument(help="ner or textcat")]
ConfigOutput = Annotated[Path, typer.Argument(help="config file to write", dir_okay=False)]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="the biLM to train with: default (shipped), a published model (original, "
                 "original-5.5b, medium, small, pubmed, or ELMoForManyLangs' efml-<language>, e.g. efml-de: "
                 "downloaded once), a save_pretrained directory or a Hub id"),
]
LangOption = Annotated[
    str | None,
    typer.Option("--lang", help="the pipeline's language (spaCy's code, e.g. de; its tokenizer splits the text) "
                 "[default: the biLM's, as its word tokenizer records it (efml-de: de), else en]"),
]
EncoderOption = Annotated[
    str | None,
    typer.Option("--encoder", help="the task encoder: bilstm (the shipped configs') or bcn (textcat only: the "
                 "paper's SST-5 model, a biattentive classification network)"),
]
ElmoOption = Annotated[
    str | None,
    typer.Option("--elmo", help="where the task model takes ELMo: input, input+output or none (default: the "
                 "shipped config's: input for ner, input+output for textcat)"),
]
DocBinOutput = Annotated[Path, typer.Argument(help=".spacy file to write", dir_okay=False)]
Limit = Annotated[int | None, typer.Option("--limit", help="write only the first N Docs")]


def base_config_path(task: str) -> Path:
    """The shipped config of `task` ("ner" or "textcat")."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    return CONFIGS_DIR / f"{task}.cfg"


def make_config(
    task: str, model: str | None = None, elmo: str | None = None, encoder: str | None = None, lang: str | None = None
) -> Config:
    """The shipped config of `task` (for the `"default"` biLM); with `model` (a model name, see `hf_elmo.loading`),
    its name and the layer width and count of that biLM (read from its config.json only; a mix's `initial_scalars`
    spread evenly from their first to their last value over that count) and its language; with `elmo`, ELMo where
    it says (see `ELMO_PLACEMENTS`); with `encoder`, that task encoder (see `ENCODERS`); with `lang`, that language
    (checked: spaCy must have its tokenizer)."""
    config = Config().from_disk(base_config_path(task), interpolate=False)
    if encoder is not None:
        set_encoder(config, task, encoder)
    if model:
        from hf_elmo.loading import load_config

        elmo_config = load_config(model)
        recorded = getattr(elmo_config, "word_tokenizer", None) or ""
        if lang is None and recorded.startswith("spacy:"):
            lang = recorded.removeprefix("spacy:")
        config["paths"]["elmo_model"] = str(model)
        config["elmo"]["width"] = elmo_config.output_dim
        config["elmo"]["n_layers"] = elmo_config.num_output_layers
        for mix in elmo_mixes(config, task):
            scalars = mix.get("initial_scalars")
            if scalars and len(scalars) != elmo_config.num_output_layers:
                mix["initial_scalars"] = np.linspace(scalars[0], scalars[-1], elmo_config.num_output_layers).tolist()
    if elmo is not None:
        place_elmo(config, task, elmo)
    if lang is not None:
        check_language(lang)
        config["nlp"]["lang"] = lang
    return config


def check_language(lang: str) -> None:
    """Fail in one line where spaCy cannot tokenize `lang`: no such language, or its tokenizer needs a package that
    is not installed (Japanese, Korean, Vietnamese...)."""
    from hf_elmo.text import spacy_tokenizer

    try:
        spacy_tokenizer(lang)
    except ImportError as error:
        raise ValueError(str(error)) from None


def elmo_mixes(config: Config, task: str) -> list[dict]:
    """The settings of every ELMo mix of the task's model (its input listener's, and its output listener's)."""
    tok2vec = config["components"][task]["model"]["tok2vec"]
    return [tok2vec[listener]["mix"] for listener in ("elmo", "elmo_output") if listener in tok2vec]


def set_encoder(config: Config, task: str, encoder: str) -> None:
    """Make the task model's encoder `encoder` (one of `ENCODERS`), keeping its features and ELMo listeners."""
    if encoder not in ENCODERS:
        raise ValueError(f"unknown encoder {encoder!r}; choose one of {', '.join(ENCODERS)}")
    if ENCODERS[encoder] is None:
        return
    if task != "textcat":
        raise ValueError(f"the {encoder} encoder is for text classification (textcat), not {task}")
    tok2vec = config["components"][task]["model"]["tok2vec"]
    slots = {name: tok2vec[name] for name in ("embed", "elmo", "elmo_output") if name in tok2vec}
    config["components"][task]["model"]["tok2vec"] = {**ENCODERS[encoder], **slots}


def place_elmo(config: Config, task: str, placement: str) -> None:
    """Make the task's encoder take ELMo at `placement` (one of `ELMO_PLACEMENTS`); "none"
    also removes the `elmo` component, its weights and its settings."""
    if placement not in ELMO_PLACEMENTS:
        raise ValueError(f"unknown ELMo placement {placement!r}; choose one of {', '.join(ELMO_PLACEMENTS)}")
    tok2vec = config["components"][task]["model"]["tok2vec"]
    if placement == "input+output":
        tok2vec.setdefault("elmo_output", copy.deepcopy(tok2vec["elmo"]))
    else:
        tok2vec.pop("elmo_output", None)
    if placement == "none":
        del tok2vec["elmo"]
        del config["components"]["elmo"]
        del config["initialize"]["components"]["elmo"]
        del config["elmo"]
        del config["paths"]["elmo_model"]
        config["nlp"]["pipeline"] = [name for name in config["nlp"]["pipeline"] if name != "elmo"]


def write_config(
    task: str,
    output: Path,
    model: str | None = None,
    elmo: str | None = None,
    encoder: str | None = None,
    lang: str | None = None,
) -> Path:
    """Write the config of `task` (see `make_config`) to `output`."""
    config = make_config(task, model, elmo, encoder, lang)
    header = f"# Written by `python -m spacy_elmo init-config {task}`; commented original: {base_config_path(task)}\n"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(header + config.to_str(), encoding="utf-8")
    return output


@app.command("init-config")
def init_config_command(
    task: Task, output: ConfigOutput, model: ModelOption = None, elmo: ElmoOption = None,
    encoder: EncoderOption = None, lang: LangOption = None,
) -> None:
    """Write a training config for an ELMo NER or text classification pipeline."""
    if task not in TASKS:
        raise typer.BadParameter(f"choose one of {', '.join(TASKS)}", param_hint="TASK")
    if elmo is not None and elmo not in ELMO_PLACEMENTS:
        raise typer.BadParameter(f"choose one of {', '.join(ELMO_PLACEMENTS)}", param_hint="--elmo")
    try:
        written = write_config(task, output, model, elmo, encoder, lang)
    except ValueError as error:  # e.g. an unknown encoder, or one for another task (`set_encoder` says which)
        raise typer.BadParameter(str(error)) from None
    typer.echo(f"wrote {written}")


@init_cli.command("elmo-config")
def spacy_init_elmo_config(
    task: Task, output: ConfigOutput, model: ModelOption = None, elmo: ElmoOption = None,
    encoder: EncoderOption = None, lang: LangOption = None,
) -> None:
    """Write a training config for an ELMo NER or text classification pipeline (spacy-elmo)."""
    init_config_command(task, output, model, elmo, encoder, lang)


@app.command("convert-conll2003")
def convert_conll2003_command(
    input_path: Annotated[Path, typer.Argument(help="CoNLL-2003 file (eng.train, iob2/train.txt)", exists=True)],
    output: DocBinOutput,
    n_sents: Annotated[int, typer.Option("--n-sents", "-n", help="sentences per Doc")] = 10,
    limit: Limit = None,
) -> None:
    """Convert CoNLL-2003 NER data to a .spacy file."""
    _convert(partial(read_conll2003, n_sents=n_sents), input_path, output, limit)


@app.command("convert-sst5")
def convert_sst5_command(
    input_path: Annotated[Path, typer.Argument(
        help="SST-5 TSV file (label<TAB>sentence) or trees file (trees/train.txt)", exists=True)],
    output: DocBinOutput,
    phrases: Annotated[bool, typer.Option(
        "--phrases", help="one Doc per distinct labelled phrase of the trees (the paper's SST-5 training data)"
    )] = False,
    limit: Limit = None,
) -> None:
    """Convert SST-5 sentences (or, from the trees, phrases) to a .spacy file with exclusive `cats`."""
    _convert(partial(read_sst5, phrases=phrases), input_path, output, limit)


@app.command("convert-sst2")
def convert_sst2_command(
    input_path: Annotated[Path, typer.Argument(
        help="SST-2 file (label sentence: stsa.binary.train) or SST-5 trees file (sst5/trees/train.txt)", exists=True)],
    output: DocBinOutput,
    phrases: Annotated[bool, typer.Option(
        "--phrases", help="one Doc per distinct non-neutral phrase of the SST-5 trees (the usual SST-2 training data)"
    )] = False,
    limit: Limit = None,
) -> None:
    """Convert SST-2 sentences (or, from SST-5's trees, non-neutral phrases) to a .spacy file with exclusive `cats`
    (negative, positive)."""
    _convert(partial(read_sst2, phrases=phrases), input_path, output, limit)


def _convert(reader, input_path: Path, output: Path, limit: int | None) -> None:
    """Write the reader's Docs; a malformed input file is a one-line error (its path, line and what was wrong)."""
    try:
        written = write_docbin(reader(input_path, Vocab()), output, limit)
    except ValueError as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {written} docs to {output}")


@app.command("mix-weights")
def mix_weights_command(
    pipeline: Annotated[Path, typer.Argument(help="a trained pipeline directory", exists=True, file_okay=False)],
    plot: Annotated[Path | None, typer.Option("--plot", help="also draw them into this PNG (needs matplotlib)")] = None,
) -> None:
    """Print the learned ELMo layer weights softmax(s) and gamma of every task mix of a trained pipeline."""
    import spacy

    from .mix_weights import format_mix_weights, mix_weights, plot_mix_weights

    mixes = mix_weights(spacy.load(pipeline))
    typer.echo(format_mix_weights(mixes))
    if plot is not None and mixes:
        try:
            typer.echo(f"wrote {plot_mix_weights(mixes, plot)}")
        except ImportError as error:  # matplotlib missing: one line naming the extra
            typer.echo(f"Error: {error}", err=True)
            raise typer.Exit(1) from None
