"""The `elmo` command line: `convert`, `export-hdf5`, `info`, `embed`, `demo`, and for training `build-vocab`,
`pretrain`, `evaluate` and `export-encoder`.

Thin wrappers around `hf_elmo.original_format`, `hf_elmo.embed` and `hf_elmo.training`; expected failures (missing
files, bad options) end with a one-line `Error: ...` on stderr and exit code 1 (2 for usage errors), never a traceback.

A package of its own, apart from `hf_elmo`, so that `--help`, `--version` and usage errors answer at once: importing
`hf_elmo` loads torch and transformers (seconds), which each command imports only when it runs
(`benchmarks/bench_cli_start.py` measures it).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from enum import Enum
from functools import partial
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:
    from hf_elmo import ElmoConfig, ElmoEmbedder, ElmoForBidirectionalLM, ElmoModel


class ElmoCommand(TyperCommand):
    """A command whose help shows no type beside a flag or a list of arguments (`--quiet`, not `--quiet <bool>`;
    `FILES...`, not `FILES... <list[str]>`) and whose usage line shows each argument as its metavar says
    (`[MODEL] INPUT OUTPUT`, not `{[MODEL] INPUT OUTPUT}...`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
            elif param.param_type_name == "argument" and param.nargs == -1:  # its metavar and help say what it is
                param.display_type_rich = lambda ctx: None

    def get_help_option(self, ctx: typer.Context) -> Any:
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option

    def invoke(self, ctx: typer.Context) -> Any:
        """The command, its `HostWarning`s (e.g. float32 for `--bf16` on a CPU without native bf16) shown as one line
        `Warning: ...` on stderr, without a source line."""
        with warnings.catch_warnings():
            warnings.showwarning = partial(_show_warning, warnings.showwarning)
            return super().invoke(ctx)

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        arguments = [param.metavar or str(param.name).upper() for param in self.params
                     if param.param_type_name == "argument"]
        return [self.options_metavar, *arguments]


def _show_warning(show: Callable, message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """`HostWarning`s as one line; others as `show` shows them."""
    from hf_elmo.runtime import HostWarning  # loaded: only its code warns about the host

    if issubclass(category, HostWarning):
        typer.echo(f"Warning: {message}", err=True)
    else:
        show(message, category, *args, **kwargs)


app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_show_locals=False,
)


MODEL_HELP = ("`default` (the English model shipped with the package), a published ELMo model (`original`, "
              "`original-5.5b`, `medium`, `small`, `pubmed`: downloaded and converted on first use), a save_pretrained "
              "directory or a Hub model id.")


# `--layers`: the embedder's layer modes (`hf_elmo.embed.LAYER_MODES`; a test keeps them in step), and the model a
# command takes when none is named (`hf_elmo.DEFAULT_MODEL_NAME`).
LAYER_MODES = ("all", "top", "average", "mix")
LayerMode = Enum("LayerMode", {mode: mode for mode in LAYER_MODES}, type=str)
DEFAULT_MODEL_NAME = "default"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"elmo {installed_version('spacy-elmo')} (spacy-elmo), torch {installed_version('torch')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """ELMo biLMs for Hugging Face transformers: convert original weights, inspect models, embed text, train."""


def _hf_elmo() -> None:
    """Import `hf_elmo` (torch, transformers: seconds) for a command that runs, quieting transformers' loading bars,
    which would clutter the output."""
    from transformers.utils import logging

    import hf_elmo  # noqa: F401

    logging.disable_progress_bar()


def _names_a_model(argument: str) -> bool:
    """Whether a command-line argument is a model's name or directory (for arguments given in the wrong place). A
    name with an output's suffix is not one, and takes no import to tell."""
    if (Path(argument) / "config.json").is_file():
        return True
    if Path(argument).suffix.lower() in (".npy", ".hdf5", ".h5"):
        return False
    from hf_elmo import MODEL_NAMES

    return argument in MODEL_NAMES


def _fail(message: str) -> NoReturn:
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(1)


def _model_location(name: str) -> str:
    """What to load for a model name (`loading.resolve_model`); fail in one line otherwise."""
    from hf_elmo import loading

    try:
        return loading.resolve_model(name)
    except loading.ModelLoadError as error:
        _fail(str(error))


def _load_config(name: str) -> ElmoConfig:
    from hf_elmo import loading

    _hf_elmo()
    try:
        return loading.load_config(name)
    except loading.ModelLoadError as error:
        _fail(str(error))


def _load_model(name: str, config: ElmoConfig) -> ElmoModel | ElmoForBidirectionalLM:
    """The biLM, with its softmax if the checkpoint has one (`config.vocab_size`)."""
    from hf_elmo import ElmoForBidirectionalLM, ElmoModel, loading

    try:
        return loading.load_model(name, ElmoForBidirectionalLM if config.vocab_size else ElmoModel, config=config)
    except loading.ModelLoadError as error:
        _fail(str(error))


@app.command(cls=ElmoCommand)
def convert(
    arguments: Annotated[list[Path], typer.Argument(
        metavar="SOURCE... OUT_DIR",
        help="SOURCE: the original options.json and weights .hdf5 (bilm-tf / AllenNLP), or an ELMoForManyLangs "
        "model (its directory, or the .zip the NLPL repository serves). OUT_DIR: where to write the save_pretrained "
        "directory.",
    )],
    push_to_hub: Annotated[str | None, typer.Option(
        "--push-to-hub", metavar="ORG/NAME", help="Also upload the directory to this Hub repo (created if needed; "
        "log in first with `hf auth login` or set HF_TOKEN), with the modeling code: others load it with "
        "AutoModel.from_pretrained(ORG/NAME, trust_remote_code=True).")] = None,
    private: Annotated[bool, typer.Option("--private", help="Make a new Hub repo private.")] = False,
) -> None:
    """Convert original ELMo weights (bilm-tf / AllenNLP options.json + .hdf5, or an ELMoForManyLangs model) into a
    save_pretrained directory (config, model.safetensors, tokenizer, modeling code, model card). Prints the
    directory, and the commit's URL with --push-to-hub."""
    if len(arguments) not in (2, 3):
        raise typer.BadParameter("expected OPTIONS_JSON WEIGHTS_HDF5 OUT_DIR, or MODEL_DIR_OR_ZIP OUT_DIR",
                                 param_hint="SOURCE... OUT_DIR")
    *sources, out_dir = arguments
    _hf_elmo()
    from hf_elmo import hub
    from hf_elmo.formats import FormatError
    from hf_elmo.loading import format_of

    try:
        weight_format = format_of(sources)
    except FormatError as error:
        raise typer.BadParameter(str(error), param_hint="SOURCE") from None
    try:
        output = weight_format.convert(sources, out_dir, repo_id=push_to_hub, progress=True)
    except (OSError, ValueError, ImportError) as error:
        _fail(str(error))
    typer.echo(output)
    if push_to_hub:
        try:
            commit = hub.push_directory(output, push_to_hub, private=private or None,
                                        commit_message=f"Upload ELMo biLM converted from {sources[-1].name}")
        except (OSError, ValueError) as error:  # the Hub's errors (HfHubHTTPError is an OSError), one line
            _fail(f"{output} was written but not uploaded to {push_to_hub}: " + " ".join(str(error).split())[:300])
        typer.echo(commit.commit_url)


@app.command("export-hdf5", cls=ElmoCommand)
def export_hdf5(
    model_dir: Annotated[str, typer.Argument(metavar="MODEL_DIR", help=MODEL_HELP)],
    out_prefix: Annotated[str, typer.Argument(metavar="OUT_PREFIX", help="Prefix of the two files, e.g. `out/elmo_`.")],
) -> None:
    """Write `<OUT_PREFIX>options.json` and `<OUT_PREFIX>weights.hdf5` in the original layout (readable by
    bilm-tf and AllenNLP). Prints both paths."""
    from hf_elmo import ElmoForBidirectionalLM, original_format

    model = _load_model(model_dir, _load_config(model_dir))
    try:
        encoder = model.elmo if isinstance(model, ElmoForBidirectionalLM) else model
        paths = original_format.export_hdf5(encoder, out_prefix)
    except (OSError, ValueError, ImportError) as error:
        _fail(str(error))
    for path in paths:
        typer.echo(path)


@app.command("export-encoder", cls=ElmoCommand)
def export_encoder(
    trained_dir: Annotated[Path, typer.Argument(help="A directory written by `elmo pretrain` (with a softmax).")],
    out_dir: Annotated[Path, typer.Argument(help="Where to write the encoder's save_pretrained directory.")],
    note: Annotated[
        str | None, typer.Option(help="A paragraph added to the card's source section, e.g. hardware and time.")
    ] = None,
    remote_code: Annotated[
        bool, typer.Option(help="Include the modeling code for `trust_remote_code` loading (for the Hub).")
    ] = True,
) -> None:
    """Save the biLM of TRAINED_DIR without its word softmax (model, tokenizer, card keeping the training record
    and perplexities), e.g. to ship or publish a smaller model for embedding. Prints the directory."""
    if not trained_dir.is_dir():
        _fail(f"model directory {trained_dir} does not exist")
    _hf_elmo()
    from hf_elmo import hub

    try:
        typer.echo(hub.export_encoder(trained_dir, out_dir, note, remote_code))
    except (OSError, ValueError) as error:
        _fail(str(error))


@app.command(cls=ElmoCommand)
def info(
    model: Annotated[str, typer.Argument(metavar="[MODEL]", help=MODEL_HELP + " [default: default]",
                                         show_default=False)] = DEFAULT_MODEL_NAME,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
) -> None:
    """Print the config (every field) and the parameter count of each part of the biLM."""
    config = _load_config(model)
    counts = _load_model(model, config).parameter_counts()
    fields = config.to_dict()
    if as_json:
        typer.echo(json.dumps({"config": fields, "parameters": counts}, indent=2))
        return
    typer.echo(f"model: {model}")
    typer.echo(f"output: {config.num_output_layers} layers of width {config.output_dim}")
    typer.echo("config:")
    width = max(map(len, fields))
    for key, value in fields.items():
        typer.echo(f"  {key:<{width}}  {value if isinstance(value, str) else json.dumps(value)}")
    typer.echo("parameters:")
    width = max(map(len, counts))
    for part, count in counts.items():
        typer.echo(f"  {part:<{width}}  {count:>15,}")


def _parse_weights(weights: str) -> tuple[float, ...]:
    try:
        return tuple(float(value) for value in weights.split(","))
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated numbers, got {weights!r}", param_hint="--weights") from None


# The flags of `elmo embed` that set each of `EmbedSettings`' fields, and of its output.
EMBED_FLAGS = {
    "layers": "--layers", "scalar_parameters": "--weights", "gamma": "--gamma", "batch_tokens": "--batch-tokens",
    "buffer_tokens": "--buffer-tokens", "batch_size": "--batch-size", "max_sentence_words": "--max-sentence-words",
    "device": "--device", "cuda_device": "--cuda-device", "bf16": "--bf16", "quantize": "--int8", "output": "OUTPUT",
    "sentence_keys": "--use-sentence-keys",
}


@contextmanager
def _setting_errors() -> Iterator[None]:
    """A bad setting as a usage error naming its flag; a missing h5py in one line."""
    from hf_elmo.embed import EmbedSettingError

    try:
        yield
    except EmbedSettingError as error:
        raise typer.BadParameter(error.message, param_hint=EMBED_FLAGS[error.setting]) from None
    except ImportError as error:
        _fail(str(error))


@app.command(cls=ElmoCommand)
def embed(
    arguments: Annotated[list[str], typer.Argument(
        metavar="[MODEL] INPUT OUTPUT",
        help=f"MODEL: {MODEL_HELP} [default: `default`, or the original weights of --options-file/--weight-file]. "
        "INPUT: text file, one sentence per line; `-`: stdin. OUTPUT: a `.npy` file, or any other name for HDF5 "
        "(`.hdf5`, `.h5`, ...: AllenNLP's `elmo` layout, which `allennlp elmo` writes whatever the name).",
    )],
    tokenized: Annotated[
        bool | None,
        typer.Option("--tokenized/--raw", help="Lines are words separated by whitespace / raw text [default: raw, "
                     "except with --options-file: whitespace, as `allennlp elmo`]."),
    ] = None,
    layers: Annotated[
        LayerMode | None,
        typer.Option(help="`all` (layers, words, width) per sentence; `top`, `average` or `mix`: (words, width) "
                     "[default: all]."),
    ] = None,
    all_layers: Annotated[bool, typer.Option("--all", help="`allennlp elmo`'s spelling of --layers all.")] = False,
    top_layer: Annotated[bool, typer.Option("--top", help="`allennlp elmo`'s spelling of --layers top.")] = False,
    average_layers: Annotated[
        bool, typer.Option("--average", help="`allennlp elmo`'s spelling of --layers average.")
    ] = False,
    options_file: Annotated[
        Path | None, typer.Option(help="The original options.json (with --weight-file), instead of MODEL.")
    ] = None,
    weight_file: Annotated[
        Path | None, typer.Option(help="The original .hdf5 weights (with --options-file), instead of MODEL.")
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option(help="With `--layers mix`: comma-separated scalar parameters s, one per layer (softmaxed)."),
    ] = None,
    gamma: Annotated[float, typer.Option(help="With `--layers mix`: the scale gamma.")] = 1.0,
    batch_tokens: Annotated[
        int, typer.Option(min=1, help="Padded positions per forward pass (sentence boundaries included).")
    ] = 4096,
    buffer_tokens: Annotated[
        int | None, typer.Option(min=1, help="Positions read ahead and sorted by length [default: 4 x batch-tokens].")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="Sentences per forward pass at most, on top of --batch-tokens.")
    ] = None,
    max_sentence_words: Annotated[
        int, typer.Option(min=1, help="Longer lines run as windows of this many words, each from the zero state "
                          "(bounded memory; AllenNLP runs them whole).")
    ] = 1000,
    forget_sentences: Annotated[
        bool, typer.Option("--forget-sentences", help="hdf5: leave out `sentence_to_index` (flat memory).")
    ] = False,
    use_sentence_keys: Annotated[
        bool, typer.Option("--use-sentence-keys", help="hdf5: name each dataset by its line instead of its index.")
    ] = False,
    device: Annotated[str | None, typer.Option(help="`cpu`, `cuda`, `cuda:1`, ... [default: cpu]")] = None,
    cuda_device: Annotated[
        int | None, typer.Option(help="`allennlp elmo`'s device: -1 for the CPU, n for cuda:n.")
    ] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch [default: "
                                                "OMP_NUM_THREADS, else the cores this process may use that no other "
                                                "process is busy on].")] = None,
    bf16: Annotated[
        bool, typer.Option("--bf16", help="Run the biLM under bf16 autocast (float32 output, not exact): for CPUs with "
                           "native bf16 (AVX512-BF16, AMX) and GPUs (float16 before Ampere); elsewhere float32, "
                           "with a warning.")
    ] = False,
    int8: Annotated[
        bool, typer.Option("--int8", help="Run the biLM's large matmuls in int8 on the CPU (float32 output, not "
                           "exact; on the original model 1.6-1.9x the throughput, a third to a quarter of the "
                           "latency of one sentence): for x86 CPUs with AVX2; elsewhere float32, with a warning.")
    ] = False,
    encoding: Annotated[str, typer.Option(help="INPUT's encoding, e.g. `utf-16` (with its byte-order mark), "
                                          "`latin-1`, `cp1252` (Python's codec names).")] = "utf-8",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")] = False,
) -> None:
    """Embed every line of INPUT as one sentence and write the word vectors (`<S>`/`</S>` removed) to OUTPUT.

    `allennlp elmo INPUT OUTPUT --top --options-file O --weight-file W --batch-size 64 --cuda-device 0` works
    with the same flags here: `elmo embed` followed by them (the output HDF5 whatever its name, as there). Unlike
    AllenNLP, a blank line is a sentence without words, so that line i is always sentence i.

    **Input.** Line i (0-based, split on `\\n` only; `\\r\\n` and a leading BOM are accepted) is always
    sentence i. Raw text is split into words by the word tokenizer the model was trained with
    (`config.word_tokenizer`: spaCy's English tokenizer for `default`), else by `split_words` (punctuation,
    clitics, CJK characters and emoji become words); `--tokenized` splits on whitespace only (`str.split`).
    An empty or whitespace-only line is a sentence with no words. Words longer than 48 UTF-8 bytes are cut
    by the tokenizer; control characters, emoji and CJK are ordinary characters; `<S>`/`</S>` given
    as words are encoded as sentence boundaries (AllenNLP's behaviour). The input is decoded as UTF-8 with
    `surrogateescape`: invalid bytes never fail, each becomes a lone surrogate U+DC80..U+DCFF, encoded by the
    tokenizer as 3 bytes (`elmo`'s word splitter makes it a word of its own; spaCy's, as for `default`, keeps it
    inside its word, e.g. `ab\\udcffcd`). An input that is not UTF-8 text at all (a UTF-16 or UTF-32 byte-order
    mark, a NUL byte) fails in one line and writes nothing; `--encoding` reads another encoding (strictly).

    **Output.** HDF5 for any name but `.npy` (`.hdf5`, `.h5`, or `.txt` as `allennlp elmo` scripts name it):
    AllenNLP's `elmo` layout, one float32 dataset per sentence named by its line
    index, shape (layers, words, width) with `--layers all` else (words, width), plus `sentence_to_index`
    (a JSON string {stripped line: "index"}; a repeated line maps to its last index); with
    `--use-sentence-keys` each dataset is named by its stripped line (written once per distinct line) and there
    is no `sentence_to_index`. `.npy`: the vectors of all
    words in input order, (total words, layers, width) or (total words, width), and `<stem>.offsets.npy`
    (int64, sentences + 1): sentence i is rows offsets[i]:offsets[i+1] (an empty sentence repeats an offset).
    The output appears only when complete.

    **Layers.** `mix` computes gamma * sum_j softmax(s)_j * layer_j as `ElmoScalarMix`, s from `--weights`
    (default zeros: the average); e.g. `--weights=-9e10,1,-9e10` selects the first biLSTM layer.

    **Batching.** Sentences are read in chunks of `--buffer-tokens` positions, sorted by length, run in batches
    of at most `--batch-tokens` positions and written in input order, so memory does not grow with the input
    (except `sentence_to_index`; see `--forget-sentences`; oneDNN's kernel caches are capped at 64 shapes unless
    ONEDNN_PRIMITIVE_CACHE_CAPACITY / LRU_CACHE_CAPACITY are set). A sentence's vectors do not depend on its batch.
    A line longer than `--max-sentence-words` (1000) runs as consecutive windows of that many words, each from the
    zero state, its vectors concatenated: a huge line needs the memory of a window plus its output.

    **Threads.** torch uses the cores this process may use that no other process is busy on when it starts
    (OMP_NUM_THREADS or `--threads N` say otherwise): more threads than free cores make every step wait for a
    descheduled thread, many times slower. On a machine that gets busy later, give `--threads 1` (or the cores
    left free).

    **Several processes or nodes.** Under a launcher (`torchrun --nproc-per-node 4 -m elmo_cli embed ...`,
    or `accelerate launch`), each process embeds a contiguous share of the lines into hidden part files next to
    OUTPUT (a filesystem all processes see), and process 0 joins them into OUTPUT: the same file, keys and order
    as one process gives. INPUT must be a file. `--device cuda` uses each process's local GPU.
    """
    original_weights = options_file is not None or weight_file is not None
    if len(arguments) not in (2, 3) or (original_weights and len(arguments) == 3):
        raise typer.BadParameter(
            "expected [MODEL] INPUT OUTPUT (INPUT OUTPUT with --options-file/--weight-file)",
            param_hint="[MODEL] INPUT OUTPUT",
        )
    model = arguments[0] if len(arguments) == 3 else DEFAULT_MODEL_NAME
    # A str, not a Path with allow_dash: typer 0.29 compares Path("-") with "-" and rejects stdin.
    input_file, output_file = arguments[-2], Path(arguments[-1])
    if (len(arguments) == 2 or not Path(input_file).exists()) and _names_a_model(arguments[-1]):
        usage = f"elmo embed {arguments[-1]} {' '.join(arguments[:-1])}" + (" OUTPUT" if len(arguments) == 2 else "")
        raise typer.BadParameter(f"{arguments[-1]} is a model, which comes first: {usage}",
                                 param_hint="[MODEL] INPUT OUTPUT")
    if input_file != "-" and not Path(input_file).exists():
        raise typer.BadParameter(f"{input_file} does not exist", param_hint="INPUT")
    if Path(input_file).is_dir():
        raise typer.BadParameter(f"{input_file} is a directory", param_hint="INPUT")
    if not output_file.parent.is_dir():
        _fail(f"output directory {output_file.parent} does not exist")
    if output_file.is_dir():
        _fail(f"{output_file} is a directory")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise typer.BadParameter(f"unknown encoding {encoding!r} (Python's codec names: utf-16, latin-1, cp1252, ...)",
                                 param_hint="--encoding") from None
    chosen = {mode for mode, flag in (("all", all_layers), ("top", top_layer), ("average", average_layers))
              if flag} | ({layers.value} if layers else set())
    if len(chosen) > 1:
        raise typer.BadParameter("choose one of them", param_hint="--layers/--all/--top/--average")
    if (options_file is None) != (weight_file is None):
        raise typer.BadParameter("give both (the original ELMo weights: options.json and the .hdf5 weights), or "
                                 "neither", param_hint="--options-file/--weight-file")
    if device is not None and cuda_device is not None:
        raise typer.BadParameter("give one of them, not both", param_hint="--device/--cuda-device")
    _hf_elmo()
    import torch

    from hf_elmo import original_format
    from hf_elmo.allennlp import cuda_device_to_device
    from hf_elmo.embed import ElmoEmbedder, EmbedSettingError, EmbedSettings, check_output, embed_file
    from hf_elmo.loading import load_original
    from hf_elmo.runtime import OutOfDeviceMemoryError, bound_onednn_caches, set_threads

    with _setting_errors():
        check_output(output_file, use_sentence_keys)
        if original_weights:
            original_format.require_h5py("--options-file/--weight-file")
        # AllenNLP's flags in this package's terms (`hf_elmo.allennlp`): the layers above, the device here.
        chosen_device = cuda_device_to_device(cuda_device) if cuda_device is not None else EmbedSettings.device_of(
            device)
        settings = EmbedSettings(
            layers=chosen.pop() if chosen else "all",
            scalar_parameters=_parse_weights(weights) if weights is not None else None,
            gamma=gamma,
            batch_tokens=batch_tokens,
            buffer_tokens=buffer_tokens,
            batch_size=batch_size,
            max_sentence_words=max_sentence_words,
            device=chosen_device or torch.device("cpu"),
            bf16=bf16,
            quantize="int8" if int8 else None,
        )
        # Started by torchrun / accelerate launch: this process embeds its share (see embed_file_in_parts).
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        if world_size > 1 and settings.device.type == "cuda" and settings.device.index is None:
            local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            settings = dataclasses.replace(settings, device=local)
        if not original_weights:
            settings.check_model(_load_config(model))
    set_threads(threads)
    bound_onednn_caches()
    try:
        if original_weights:
            model = load_original(options_file, weight_file)
            settings.check_model(model.config)
        embedder = ElmoEmbedder(model, settings=settings)
    except EmbedSettingError as error:
        raise typer.BadParameter(error.message, param_hint=EMBED_FLAGS[error.setting]) from None
    except (ValueError, ImportError) as error:  # ModelLoadError, OriginalFormatError, h5py missing
        _fail(str(error))
    output = dict(tokenized=original_weights if tokenized is None else tokenized, progress=not quiet and rank == 0,
                  sentence_index=not forget_sentences, sentence_keys=use_sentence_keys, encoding=encoding)
    try:
        if world_size > 1:
            count = _embed_in_parts(embedder, input_file, output_file, rank, world_size, output)
        else:
            count = embed_file(embedder, input_file, output_file, **output)
    except (OSError, ImportError, ValueError, OutOfDeviceMemoryError) as error:
        _fail(str(error))
    if not quiet and rank == 0:
        typer.echo(f"{count} sentences written to {output_file}", err=True)


def _embed_in_parts(
    embedder: ElmoEmbedder, input_file: str, output_file: Path, rank: int, world_size: int, settings: dict
) -> int:
    """`embed_file_in_parts` in a process group of the launcher's processes (gloo: CPU or GPU, any node)."""
    import torch.distributed as dist

    from hf_elmo.embed import embed_file_in_parts

    # The barrier waits for the slowest share: allow a long run.
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(days=7))
    try:
        return embed_file_in_parts(embedder, input_file, output_file, rank, world_size, dist.barrier, **settings)
    finally:
        dist.destroy_process_group()


@app.command(cls=ElmoCommand)
def demo() -> None:
    """Show the English model shipped with the package at work (offline): the same word gets different vectors
    in different contexts ("bank", "play"), then the spaCy component."""
    started = time.perf_counter()
    _hf_elmo()
    from hf_elmo.demo import main as run_demo

    run_demo(typer.echo)
    typer.echo(f"{time.perf_counter() - started:.1f} s in all, loading torch, transformers and the model included")


def _training():
    """`hf_elmo.training`, which needs the `train` extra (Accelerate)."""
    _hf_elmo()
    from hf_elmo.extras import install_command

    try:
        from hf_elmo import training
    except ImportError as error:
        _fail(f"training needs {error.name or error}: {install_command('train')}")
    return training


@app.command("build-vocab", cls=ElmoCommand)
def build_vocab(
    files: Annotated[list[str], typer.Argument(metavar="FILES...", help="Corpus files or glob patterns (.gz ok).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The vocabulary file to write.")] = Path("vocab.txt"),
    word_tokenizer: Annotated[
        str, typer.Option(help="`whitespace` (pre-tokenized), `spacy:en` or `elmo` (`split_words`).")
    ] = "spacy:en",
    max_size: Annotated[
        int | None, typer.Option(min=3, help="Entries at most, `<S>`, `</S>`, `<UNK>` included.")
    ] = None,
    min_count: Annotated[int, typer.Option(min=1, help="Keep words seen at least this often.")] = 1,
) -> None:
    """Count the words of FILES (one sentence or paragraph per line, streamed) and write the softmax vocabulary:
    `<S>`, `</S>`, `<UNK>`, then the words by decreasing frequency (ties alphabetical), one per line. Prints the
    size and the share of the corpus' words it covers."""
    training = _training()
    from hf_elmo.text import expand_files, get_word_tokenizer

    try:
        counts = training.count_corpus_words(expand_files(files), get_word_tokenizer(word_tokenizer), progress=True)
    except (OSError, ValueError, ImportError) as error:
        _fail(str(error))
    vocabulary = training.WordVocabulary.from_counts(counts, max_size=max_size, min_count=min_count)
    vocabulary.save(output)
    total = sum(counts.values())
    covered = sum(counts[word] for word in vocabulary.words)
    typer.echo(f"{output}: {len(vocabulary):,} entries covering {covered / max(total, 1):.2%} of {total:,} words")


@app.command(
    cls=ElmoCommand, context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def pretrain(ctx: typer.Context) -> None:
    """Train a biLM from scratch or continue training one (also on several GPUs or nodes with `accelerate launch`
    / `torchrun -m hf_elmo.training`). Every option: `elmo pretrain --help`."""
    training = _training()
    try:
        training.pretrain.main(ctx.args)
    except (OSError, ValueError, ImportError) as error:
        _fail(str(error))


@app.command(cls=ElmoCommand)
def evaluate(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="An ElmoForBidirectionalLM directory or Hub id.")],
    files: Annotated[list[str], typer.Argument(metavar="FILES...", help="Held-out text, one line per sequence.")],
    word_tokenizer: Annotated[
        str | None, typer.Option(help="How lines are split into words [default: the one the model records].")
    ] = None,
    batch_tokens: Annotated[int, typer.Option(min=1, help="Padded positions per forward pass (more on a GPU).")] = 1024,
    max_words: Annotated[
        int | None, typer.Option(min=1, help="Cut longer lines into pieces of this many words [default: whole lines].")
    ] = None,
    device: Annotated[str, typer.Option(help="`cpu`, `cuda`, ...")] = "cpu",
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch [default: "
                                                "OMP_NUM_THREADS, else the cores this process may use that no other "
                                                "process is busy on].")] = None,
) -> None:
    """Print the forward, backward and average perplexity of MODEL on FILES (full softmax) as one JSON line.

    Every line is one sequence from the zero state; each direction predicts the words plus one `</S>` (forward)
    or `<S>` (backward) per line, counted in `tokens`. The average is exp(mean of the two cross-entropies).
    Empty lines are skipped; targets outside the model's `vocab.txt` are `<UNK>`."""
    training = _training()
    from hf_elmo.runtime import set_threads

    set_threads(threads)
    try:
        metrics = training.evaluate_model(
            _model_location(model), files, word_tokenizer=word_tokenizer, batch_tokens=batch_tokens,
            max_words=max_words, device=device, progress=True,
        )
    except (OSError, ValueError, ImportError) as error:
        _fail(str(error))
    typer.echo(json.dumps(metrics))


# The spaCy plugin's commands (`python -m spacy_elmo COMMAND`, spacy_elmo/cli.py), run by `elmo COMMAND` too, with
# their first help line (a test keeps both in step): one command line for the project.
SPACY_COMMANDS = {
    "init-config": "Write a training config for an ELMo NER or text classification pipeline.",
    "convert-conll2003": "Convert CoNLL-2003 NER data to a .spacy file.",
    "convert-sst5": "Convert SST-5 sentences (or, from the trees, phrases) to a .spacy file with exclusive `cats`.",
    "convert-sst2": "Convert SST-2 sentences (or, from SST-5's trees, non-neutral phrases) to a .spacy file with "
                    "exclusive `cats`",
    "mix-weights": "Print the learned ELMo layer weights softmax(s) and gamma of every task mix of a trained pipeline.",
}


def _spacy_command(name: str, summary: str) -> None:
    """`elmo NAME ARGS`: the spaCy plugin's command NAME with ARGS (its own --help included)."""

    def command(ctx: typer.Context) -> None:
        from spacy_elmo.cli import app as spacy_app

        spacy_app([name, *ctx.args], prog_name="elmo")

    command.__doc__ = f"{summary} (also `python -m spacy_elmo {name}`)"
    app.command(name, cls=ElmoCommand, add_help_option=False, rich_help_panel="spaCy",
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(command)


for _name, _summary in SPACY_COMMANDS.items():
    _spacy_command(_name, _summary)

