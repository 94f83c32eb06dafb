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
import glob
import importlib.util
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from functools import partial
from importlib.metadata import version as installed_version
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

if TYPE_CHECKING:
    from hf_elmo import ElmoConfig, ElmoForBidirectionalLM, ElmoModel


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
    """`HostWarning`s and `LeftoverWarning`s as one line; others as `show` shows them."""
    from hf_elmo.embed.outputs import LeftoverWarning
    from hf_elmo.runtime import HostWarning  # loaded: only its code warns about the host

    if issubclass(category, (HostWarning, LeftoverWarning)):
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


def _light(relative: str) -> ModuleType:
    """A module of `hf_elmo` that imports nothing but the standard library (`hf_elmo/embed/settings.py`, ...), read
    without importing the package (torch and transformers: seconds), under a name of this command's own."""
    package = importlib.util.find_spec("hf_elmo")  # found, not imported
    name = "_elmo_cli_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, Path(package.submodule_search_locations[0]) / relative)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The settings (their choices and defaults, how inputs are read, a job on Ray), the output formats and the model
# taken when none is named: the package's own (`hf_elmo/embed/settings.py`, `output_formats.py`, `hf_elmo/names.py`).
package_settings = _light("embed/settings.py")
package_formats = _light("embed/output_formats.py")
package_serving = _light("serve/options.py")
DEFAULT_MODEL_NAME = _light("names.py").DEFAULT_MODEL_NAME
LayerMode = Enum("LayerMode", {mode: mode for mode in package_settings.LAYER_MODES}, type=str)
Pool = Enum("Pool", {pool: pool for pool in package_settings.POOLS}, type=str)
Dtype = Enum("Dtype", {dtype: dtype for dtype in package_settings.DTYPES}, type=str)
DEFAULT = package_settings.EmbedSettings.defaults()
DEFAULT_DTYPE = Dtype(DEFAULT["dtype"])
RAY_DEFAULTS = package_settings.RayOptions()
READING_DEFAULTS = package_settings.Reading()
SERVING = package_serving.ServeOptions()
SERVE_LAYERS = LayerMode(package_serving.SERVE_SETTINGS["layers"])
SERVE_POOL = Pool(package_serving.SERVE_SETTINGS["pool"])


# The embedding settings' flags, one declaration each, shared by `embed` and `serve` (a flag named as its setting
# reaches `EmbedSettings` by that name: `_settings`).
WeightsFlag = Annotated[str | None, typer.Option(
    "--weights", help="With `--layers mix`: comma-separated scalar parameters s, one per layer (softmaxed).")]
GammaFlag = Annotated[float, typer.Option(help="With `--layers mix`: the scale gamma.")]
BatchTokensFlag = Annotated[int, typer.Option(
    min=1, help="Padded positions per forward pass (sentence boundaries included).")]
MaxSentenceWordsFlag = Annotated[int, typer.Option(
    min=1, help="Longer sentences run as windows of this many words, each from the zero state (bounded memory; "
    "AllenNLP runs them whole).")]
DeviceFlag = Annotated[str | None, typer.Option(help="`cpu`, `cuda`, `cuda:1`, ... [default: cpu]")]
ThreadsFlag = Annotated[int | None, typer.Option(
    min=1, help="CPU threads for torch [default: OMP_NUM_THREADS, else the cores this process may use that no other "
    "process is busy on].")]
Bf16Flag = Annotated[bool, typer.Option(
    "--bf16", help="Run the biLM under bf16 autocast (float32 output, not exact): for CPUs with native bf16 "
    "(AVX512-BF16, AMX) and GPUs (float16 before Ampere); elsewhere float32, with a warning.")]
Int8Flag = Annotated[bool, typer.Option(
    "--int8", help="Run the biLM's large matmuls in int8 on the CPU (float32 output, not exact; on the original "
    "model 1.6-1.9x the throughput, a third to a quarter of the latency of one sentence): for x86 CPUs with AVX2; "
    "elsewhere float32, with a warning.")]


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
    if Path(argument).suffix.lower() in package_formats.output_suffixes():
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


# The flags whose names are not their setting's (`EmbedSettingError.setting`); any other setting's flag is its name.
FLAG_OF = {"scalar_parameters": "--weights", "quantize": "--int8", "output": "OUTPUT", "inputs": "INPUT",
           "sentence_keys": "--use-sentence-keys", "address": "--ray-address"}


def _flag(setting: str) -> str:
    return FLAG_OF.get(setting, "--" + setting.replace("_", "-"))


@contextmanager
def _setting_errors() -> Iterator[None]:
    """A bad setting as a usage error naming its flag; a missing extra in one line."""
    from hf_elmo.embed import EmbedSettingError

    try:
        yield
    except EmbedSettingError as error:
        raise typer.BadParameter(error.message, param_hint=_flag(error.setting)) from None
    except ImportError as error:
        _fail(str(error))


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM as SIGINT: `KeyboardInterrupt`, so that what a run writes is cleaned up as on Ctrl-C."""
    import signal

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _split_embed_arguments(arguments: list[str], original_weights: bool, ray: bool) -> tuple[str, list[str], Path]:
    """`[MODEL] INPUT... OUTPUT` → the model, the inputs and the output. With three arguments the first is the model
    (as before several inputs were read); with more, the first is the model when it names one, or is no file,
    directory or pattern (a Hub id)."""
    if len(arguments) < 2 or (original_weights and len(arguments) > 2 and not ray):
        raise typer.BadParameter(
            "expected [MODEL] INPUT... OUTPUT (INPUT OUTPUT with --options-file/--weight-file)",
            param_hint="[MODEL] INPUT... OUTPUT",
        )
    *rest, output = arguments
    first = rest[0]
    names_model = not original_weights and len(rest) > 1 and (
        len(rest) == 2 or _names_a_model(first)
        or not (Path(first).exists() or first == "-" or glob.has_magic(first)))
    model = first if names_model else DEFAULT_MODEL_NAME
    return model, rest[1:] if names_model else rest, Path(output)


@app.command(cls=ElmoCommand)
def embed(
    ctx: typer.Context,
    arguments: Annotated[list[str], typer.Argument(
        metavar="[MODEL] INPUT... OUTPUT",
        help=f"MODEL: {MODEL_HELP} [default: `default`, or the original weights of --options-file/--weight-file]. "
        "INPUT: a text file (gzip read compressed), one sentence per line, `-` for stdin; a `.jsonl` or `.parquet` "
        "file with the text in --text-column; several, glob patterns or directories with a Parquet OUTPUT or --ray. "
        "OUTPUT: a `.npy` file, a `.parquet` file, any other name for HDF5 (AllenNLP's `elmo` layout, which "
        "`allennlp elmo` writes whatever the name); with --ray, a directory of Parquet shards.",
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
    weights: WeightsFlag = None,
    gamma: GammaFlag = DEFAULT["gamma"],
    pool: Annotated[
        Pool | None,
        typer.Option(help="One vector per sentence, the `mean` or `max` over its words of the --layers chosen (as "
                     "the spaCy component's Doc.vector, a mean) [default: a vector per word]."),
    ] = None,
    dtype: Annotated[Dtype, typer.Option(help="The vectors' type in OUTPUT: float16 halves its size.")] = (
        DEFAULT_DTYPE),
    batch_tokens: BatchTokensFlag = DEFAULT["batch_tokens"],
    buffer_tokens: Annotated[
        int | None, typer.Option(min=1, help="Positions read ahead and sorted by length [default: 4 x batch-tokens].")
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(min=1, help="Sentences per forward pass at most, on top of --batch-tokens.")
    ] = None,
    max_sentence_words: MaxSentenceWordsFlag = DEFAULT["max_sentence_words"],
    forget_sentences: Annotated[
        bool, typer.Option("--forget-sentences", help="hdf5: leave out `sentence_to_index` (flat memory).")
    ] = False,
    use_sentence_keys: Annotated[
        bool, typer.Option("--use-sentence-keys", help="hdf5: name each dataset by its line instead of its index.")
    ] = False,
    text_column: Annotated[
        str, typer.Option(help="The field (JSON Lines) or column (Parquet) of INPUT that holds the text.")
    ] = READING_DEFAULTS.text_column,
    device: DeviceFlag = None,
    cuda_device: Annotated[
        int | None, typer.Option(help="`allennlp elmo`'s device: -1 for the CPU, n for cuda:n.")
    ] = None,
    threads: ThreadsFlag = None,
    bf16: Bf16Flag = False,
    int8: Int8Flag = False,
    encoding: Annotated[str, typer.Option(help="INPUT's encoding, e.g. `utf-16` (with its byte-order mark), "
                                          "`latin-1`, `cp1252` (Python's codec names).")] = READING_DEFAULTS.encoding,
    ray: Annotated[bool, typer.Option("--ray", help="Run on a Ray cluster: a local one started for the job (on "
                                      "loopback only), or --ray-address's. OUTPUT is a directory of Parquet shards; "
                                      "a rerun of the same command resumes.")] = False,
    ray_address: Annotated[
        str | None, typer.Option(help="With --ray: an existing cluster (`auto`, `ray://host:10001`, `host:6379`) "
                                 "[default: a local cluster for the job, on loopback only].")
    ] = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="With --ray: model replicas, each on its own process [default: as "
                                 "many as the cluster's CPUs (GPUs) hold].")
    ] = None,
    cpus_per_worker: Annotated[
        float, typer.Option(min=0.01, help="With --ray: CPUs (torch threads) per worker.")
    ] = RAY_DEFAULTS.cpus_per_worker,
    gpus_per_worker: Annotated[
        float, typer.Option(min=0, help="With --ray: GPUs per worker (1: each worker runs on a GPU).")
    ] = RAY_DEFAULTS.gpus_per_worker,
    shard_size: Annotated[
        int | None, typer.Option(min=1, help="With --ray: sentences per shard, the unit of work, retry and resume "
                                 "[default: 4 shards per worker or more, at most 10,000 sentences each; a rerun "
                                 "keeps the first run's].")
    ] = None,
    stall_timeout: Annotated[
        float, typer.Option(min=1, help="With --ray: seconds without progress after which a worker is taken as "
                            "stalled and the job ends (naming it; its complete shards kept).")
    ] = RAY_DEFAULTS.stall_timeout,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")] = False,
) -> None:
    """Embed every line of INPUT as one sentence and write the word vectors (`<S>`/`</S>` removed) to OUTPUT.

    `allennlp elmo INPUT OUTPUT --top --options-file O --weight-file W --batch-size 64 --cuda-device 0` works
    with the same flags here: `elmo embed` followed by them (the output HDF5 whatever its name, as there). Unlike
    AllenNLP, a blank line is a sentence without words, so that line i is always sentence i.

    **Input.** Line i (0-based, split on `\\n` only; `\\r\\n` and a leading BOM are accepted) is always
    sentence i; gzip is read compressed (known by its first bytes), from a file or stdin. Raw text is split into
    words by the word tokenizer the model was trained with (`config.word_tokenizer`: spaCy's English tokenizer for
    `default`), else by `split_words` (punctuation, clitics, CJK characters and emoji become words); `--tokenized`
    splits on whitespace only (`str.split`). An empty or whitespace-only line is a sentence with no words. Words
    longer than 48 UTF-8 bytes are cut by the tokenizer; control characters, emoji and CJK are ordinary characters;
    `<S>`/`</S>` given as words are encoded as sentence boundaries (AllenNLP's behaviour). The input is decoded as
    UTF-8 with `surrogateescape`: invalid bytes never fail, each becomes a lone surrogate U+DC80..U+DCFF, encoded
    by the tokenizer as 3 bytes (`elmo`'s word splitter makes it a word of its own; spaCy's, as for `default`,
    keeps it inside its word, e.g. `ab\\udcffcd`); a Parquet output, which holds text as UTF-8, refuses such a line
    in one line. An input that is not UTF-8 text at all (a UTF-16 or UTF-32 byte-order mark, a NUL byte) fails in
    one line and writes nothing; `--encoding` reads another encoding (strictly). A `.jsonl` input holds an object
    per line, a `.parquet` input a row per sentence, the text under `--text-column`.

    **Output.** HDF5 for any name but `.npy` and `.parquet` (`.hdf5`, `.h5`, or `.txt` as `allennlp elmo`
    scripts name it): AllenNLP's `elmo` layout, one dataset per sentence named by its line index, shape (layers,
    words, width) with `--layers all` else (words, width), plus `sentence_to_index` (a JSON string {stripped line:
    "index"}; a repeated line maps to its last index); with `--use-sentence-keys` each dataset is named by its
    stripped line (written once per distinct line) and there is no `sentence_to_index`. `.npy`: the vectors of all
    words in input order, (total words, layers, width) or (total words, width), and `<stem>.offsets.npy` (int64,
    sentences + 1): sentence i is rows offsets[i]:offsets[i+1] (an empty sentence repeats an offset). `.parquet`:
    a row per sentence with its source file, line, text, words and vectors as plain nested lists (read by pyarrow,
    pandas, polars, DuckDB; `hf_elmo.embed.read_vectors` gives NumPy arrays). `--pool mean|max`: one vector per
    sentence ((layers, width) or (width,); `.npy` without offsets); `--dtype float16`: half the size.

    **Nothing lost.** OUTPUT appears only when complete (written to a hidden `.partial` file beside it); a run
    stopped by Ctrl-C or SIGTERM removes it, and a killed run's is removed by the next run to OUTPUT, which says so
    (leftovers of other outputs in the directory are named). A second run to the same OUTPUT is refused while the
    first runs, and an OUTPUT that is an INPUT (by any path or link) before anything is written. A full disk or a
    file-size limit is one line naming the file.

    **Layers.** `mix` computes gamma * sum_j softmax(s)_j * layer_j as `ElmoScalarMix`, s from `--weights`
    (default zeros: the average); e.g. `--weights=-9e10,1,-9e10` selects the first biLSTM layer.

    **Batching.** Sentences are read in chunks of `--buffer-tokens` positions, sorted by length, run in batches
    of at most `--batch-tokens` positions and written in input order, so memory does not grow with the input
    (except `sentence_to_index`; see `--forget-sentences`; oneDNN's kernel caches are capped at 64 shapes unless
    ONEDNN_PRIMITIVE_CACHE_CAPACITY / LRU_CACHE_CAPACITY are set). A sentence's vectors depend on its batch by
    float32 rounding only (at most 6.4e-6 on the default model; the same batches, the same bytes). A line longer than
    `--max-sentence-words` (1000) runs as consecutive windows of that many words, each from the zero state, its
    vectors concatenated: a huge line needs the memory of a window plus its output (in Parquet, of its row).

    **Threads.** torch uses the cores this process may use that no other process is busy on when it starts
    (OMP_NUM_THREADS or `--threads N` say otherwise): more threads than free cores make every step wait for a
    descheduled thread, many times slower. On a machine that gets busy later, give `--threads 1` (or the cores
    left free).

    **A Ray cluster (`--ray`).** The inputs are cut into shards of `--shard-size` sentences, which the driver hands
    to `--workers` model replicas one at a time (`--cpus-per-worker` threads, `--gpus-per-worker` GPUs each; a worker
    that dies is replaced and its shard redone). OUTPUT is a directory of Parquet shards `part-NNNNN.parquet`, in
    input order, that appears when every shard is complete; until then the shards sit in a hidden `.OUTPUT.partial`
    directory beside it, and the same command rerun keeps the complete ones and redoes the rest. A shard is kept
    only while the input holds the lines it was made from (a digest of them, not sizes or times): lines edited while
    a job runs fail their shards in one line, and a rerun after an edit redoes the shards it changed. A worker that
    makes no progress for `--stall-timeout` seconds ends the job in one line naming it. Without --ray-address a
    local cluster is started for the job, listening on loopback only; a cluster of your own accepts drivers without
    authentication unless you turn on Ray's (`RAY_AUTH_MODE=token`). OUTPUT (and MODEL, if a directory) must be on a
    filesystem every node sees.
    """
    original = (options_file, weight_file) if options_file is not None or weight_file is not None else None
    model, inputs, output_file = _split_embed_arguments(arguments, original is not None, ray)
    _check_embed_arguments(arguments, inputs, output_file, ray, encoding)
    layer_mode = _check_embed_flags(ctx.params)
    if ray:  # this process is the job's driver: no Ray call may start a cluster once the job's has stopped
        os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    _hf_elmo()
    from hf_elmo.allennlp import cuda_device_to_device
    from hf_elmo.embed import embed_corpus

    with _embed_errors():
        settings = _settings(ctx.params, layer_mode, cuda_device_to_device(cuda_device) if cuda_device is not None
                             else device)
        reading = package_settings.Reading(original is not None if tokenized is None else tokenized, encoding,
                                           text_column)
        ray_options = package_settings.RayOptions(ray_address, workers, cpus_per_worker, gpus_per_worker,
                                                  shard_size, stall_timeout) if ray else None
        summary = embed_corpus(model, inputs, output_file, settings, reading, ray=ray_options, threads=threads,
                               sentence_index=not forget_sentences, sentence_keys=use_sentence_keys,
                               original=original, progress=not quiet)
    if not quiet:
        typer.echo(summary, err=True)


def _settings(flags: dict[str, Any], layers: str, device: Any) -> Any:
    """The `EmbedSettings` of a command's flags, in one call: every setting whose flag has its name, and those whose
    flags say them otherwise (`--layers` and AllenNLP's spellings, `--weights`, `--int8`, the device)."""
    from hf_elmo.embed import EmbedSettings

    named = {name: getattr(value, "value", value) for name, value in flags.items()
             if name in EmbedSettings.__dataclass_fields__ and name not in ("layers", "device")}
    weights = flags.get("weights")
    return EmbedSettings(**named, layers=layers, quantize="int8" if flags.get("int8") else None, device=device,
                         scalar_parameters=_parse_weights(weights) if weights is not None else None)


def _check_embed_arguments(arguments: list[str], inputs: list[str], output: Path, ray: bool, encoding: str) -> None:
    """The usage errors of INPUT, OUTPUT and --encoding, before anything heavy is imported."""
    missing = any(name != "-" and not glob.has_magic(name) and not Path(name).exists() for name in inputs)
    if (len(arguments) == 2 or missing) and _names_a_model(arguments[-1]):
        usage = f"elmo embed {arguments[-1]} {' '.join(arguments[:-1])}" + (" OUTPUT" if len(arguments) == 2 else "")
        raise typer.BadParameter(f"{arguments[-1]} is a model, which comes first: {usage}",
                                 param_hint="[MODEL] INPUT... OUTPUT")
    for name in inputs:
        if name != "-" and not glob.has_magic(name) and not Path(name).exists():
            raise typer.BadParameter(f"{name} does not exist", param_hint="INPUT")
        if Path(name).is_dir() and not ray and not package_formats.output_format(output).several_inputs:
            raise typer.BadParameter(f"{name} is a directory: its files go into a Parquet OUTPUT (`.parquet`) or "
                                     "--ray", param_hint="INPUT")
    if "-" in inputs and (ray or len(inputs) > 1):
        raise typer.BadParameter("stdin (`-`) is read alone, in one process: give files", param_hint="INPUT")
    if not output.parent.is_dir():
        _fail(f"output directory {output.parent} does not exist")
    if output.is_dir() and not ray:
        _fail(f"{output} is a directory")
    if ray and output.exists() and not output.is_dir():
        _fail(f"{output} is a file: --ray writes a directory of Parquet shards; name a directory")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise typer.BadParameter(f"unknown encoding {encoding!r} (Python's codec names: utf-16, latin-1, cp1252, ...)",
                                 param_hint="--encoding") from None


def _check_embed_flags(flags: dict[str, Any]) -> str:
    """The usage errors of flags given together that do not go together; the layer mode they choose."""
    chosen = {mode for mode, flag in (("all", "all_layers"), ("top", "top_layer"), ("average", "average_layers"))
              if flags[flag]} | ({flags["layers"].value} if flags["layers"] else set())
    if len(chosen) > 1:
        raise typer.BadParameter("choose one of them", param_hint="--layers/--all/--top/--average")
    original = flags["options_file"] is not None or flags["weight_file"] is not None
    if (flags["options_file"] is None) != (flags["weight_file"] is None):
        raise typer.BadParameter("give both (the original ELMo weights: options.json and the .hdf5 weights), or "
                                 "neither", param_hint="--options-file/--weight-file")
    if flags["device"] is not None and flags["cuda_device"] is not None:
        raise typer.BadParameter("give one of them, not both", param_hint="--device/--cuda-device")
    if flags["ray"] and (flags["device"] is not None or flags["cuda_device"] is not None or original
                         or flags["threads"] is not None):
        raise typer.BadParameter("with --ray, workers run where --gpus-per-worker and --cpus-per-worker say, on a "
                                 "MODEL (convert original weights with `elmo convert`)",
                                 param_hint="--device/--cuda-device/--threads/--options-file")
    ray_only = ("address", "workers", "cpus_per_worker", "gpus_per_worker", "shard_size", "stall_timeout")
    if not flags["ray"]:
        given = [name for name in ray_only
                 if flags["ray_" + name if name == "address" else name] != getattr(RAY_DEFAULTS, name)]
        if given:
            raise typer.BadParameter("applies to --ray only", param_hint=_flag(given[0]))
    return chosen.pop() if chosen else "all"


@contextmanager
def _embed_errors() -> Iterator[None]:
    """`elmo embed`'s failures in one line: a bad setting as a usage error naming its flag (exit 2), others
    `Error: ...` (exit 1), SIGINT and SIGTERM `Interrupted: ...` (what is left; exit 130)."""
    from hf_elmo.embed import EmbedSettingError
    from hf_elmo.embed.outputs import EmbedInterrupted
    from hf_elmo.embed.ray_job import JobError
    from hf_elmo.runtime import OutOfDeviceMemoryError

    try:
        with _terminate_as_interrupt():
            yield
    except EmbedSettingError as error:
        raise typer.BadParameter(error.message, param_hint=_flag(error.setting)) from None
    except EmbedInterrupted as interrupted:
        typer.echo(f"Interrupted: {interrupted}", err=True)
        raise typer.Exit(130) from None
    except (JobError, OSError, ImportError, ValueError, OutOfDeviceMemoryError) as error:
        _fail(str(error))


@app.command(cls=ElmoCommand)
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="[MODEL]", help=MODEL_HELP + " [default: default]",
                                         show_default=False)] = DEFAULT_MODEL_NAME,
    hostname: Annotated[str, typer.Option(help="The address to listen on (`0.0.0.0`: every interface).")] = (
        SERVING.hostname),
    port: Annotated[int, typer.Option(min=0, max=65535, help="The port to listen on.")] = SERVING.port,
    api_key: Annotated[str | None, typer.Option(envvar="API_KEY", help="Requests must send `Authorization: Bearer "
                                                "KEY` (/health and /ping stay open).")] = None,
    max_batch_tokens: Annotated[int, typer.Option(min=1, help="Words in the biLM at once across requests, and the "
                                                  "most of one input (longer: 413, or cut with truncate).")] = (
        SERVING.max_batch_tokens),
    max_client_batch_size: Annotated[int, typer.Option(min=1, help="Inputs per request at most (more: 413).")] = (
        SERVING.max_client_batch_size),
    max_concurrent_requests: Annotated[int, typer.Option(min=1, help="Requests served at once at most (more: 429 "
                                                         "at once).")] = SERVING.max_concurrent_requests,
    payload_limit: Annotated[int, typer.Option(min=1, help="Bytes of a request body at most (more: 413).")] = (
        SERVING.payload_limit),
    auto_truncate: Annotated[bool, typer.Option("--auto-truncate", help="Cut inputs longer than --max-batch-tokens "
                                                "words unless a request says otherwise.")] = SERVING.auto_truncate,
    layers: Annotated[LayerMode, typer.Option(help="The biLM layers of the vectors: `average`, `top`, `mix`, or "
                                              "`all` (each layer's).")] = SERVE_LAYERS,
    pool: Annotated[Pool, typer.Option(help="/embed's vector of an input: the `mean` or `max` of its words' "
                                       "vectors.")] = SERVE_POOL,
    weights: WeightsFlag = None,
    gamma: GammaFlag = DEFAULT["gamma"],
    dtype: Annotated[Dtype, typer.Option(help="The vectors' type before they are sent (float16: rounded).")] = (
        DEFAULT_DTYPE),
    batch_tokens: BatchTokensFlag = DEFAULT["batch_tokens"],
    max_sentence_words: MaxSentenceWordsFlag = DEFAULT["max_sentence_words"],
    device: DeviceFlag = None,
    threads: ThreadsFlag = None,
    bf16: Bf16Flag = False,
    int8: Int8Flag = False,
    ray: Annotated[bool, typer.Option("--ray", help="Serve on Ray Serve: a local cluster (on loopback but for the "
                                      "serving port), or --ray-address's.")] = False,
    ray_address: Annotated[str | None, typer.Option(help="With --ray: an existing cluster.")] = None,
    replicas: Annotated[int | None, typer.Option(min=1, help="With --ray: model replicas [default: as many as the "
                                                 "cluster's CPUs hold, one CPU each].")] = None,
    max_replicas: Annotated[int | None, typer.Option(min=1, help="With --ray: autoscale between --replicas and "
                                                     "this many, by requests waiting.")] = None,
) -> None:
    """Serve MODEL's vectors over HTTP with the APIs embedding clients speak: Text Embeddings Inference's (`POST
    /embed`, `/embed_all`, `/tokenize`, `/`, `/invocations`; `GET /health`, `/info`, `/metrics`) and OpenAI's
    (`POST /v1/embeddings`), so that `huggingface_hub.InferenceClient(base_url=...)`, the `openai` client, LangChain
    and LlamaIndex call it unchanged; `/docs` describes them.

    Concurrent requests are batched continuously: their sentences join the biLM's steps as they come and leave as
    they end (at most --max-batch-tokens words at once), off the event loop, in a lane a thread of --threads (a lone
    request on all); each input's vector is what `elmo embed` / `ElmoEmbedder` gives for its text with the same
    settings. Over --max-concurrent-requests a
    request gets 429 at once; errors are one JSON line (TEI's, OpenAI's on its routes). SIGTERM or Ctrl-C: no new
    requests, those held are answered, then the server exits.
    """
    if not ray and (ray_address is not None or replicas is not None or max_replicas is not None):
        raise typer.BadParameter("applies to --ray only", param_hint="--ray-address/--replicas/--max-replicas")
    if ray:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", package_serving.PROXY_READY_SECONDS)
    _hf_elmo()
    from hf_elmo.extras import require

    options = package_serving.ServeOptions(hostname, port, api_key, max_batch_tokens, max_client_batch_size,
                                           max_concurrent_requests, payload_limit, auto_truncate, model)
    with _embed_errors():
        for module in ("fastapi", "uvicorn", "prometheus_client", "orjson"):
            require(module, "elmo serve needs")
        if ray:
            require("ray.serve", "elmo serve --ray needs")
        settings = _settings(ctx.params, layers.value, device)
        from hf_elmo.serve.options import ServeError

        try:
            if ray:
                from hf_elmo.serve.ray_serve import serve_on_ray

                serve_on_ray(model, settings, options, ray_address, replicas, max_replicas, threads,
                             announce=lambda line: typer.echo(line, err=True))
            else:
                from hf_elmo.serve import serve as run

                run(model, settings, options, threads, announce=lambda line: typer.echo(line, err=True))
        except ServeError as error:
            _fail(str(error))


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

