"""Train or continue training an ELMo biLM on plain-text corpora with Hugging Face Accelerate (`elmo pretrain`).

The same command runs on one CPU or GPU, or on several GPUs and nodes when launched by Accelerate or torchrun:

    elmo pretrain --train_files 'corpus/*.txt.gz' --validation_files valid.txt --output_dir out
    elmo pretrain recipes/ptb_cpu.yaml --max_steps 100          # a recipe, with overrides
    accelerate launch --multi_gpu --num_processes 8 --mixed_precision bf16 -m hf_elmo.training ARGS
    torchrun --nnodes 2 --nproc_per_node 8 ... -m hf_elmo.training ARGS
    elmo pretrain ... --resume                                   # continue from the newest checkpoint

Reads top to bottom: arguments → vocabulary and data → model → `Pretraining` (`accelerator.prepare`, then the
loop: step, log, evaluate, checkpoint) → save. The output directory is a `save_pretrained` directory (model, tokenizer,
`vocab.txt`, model card) ready for the Hub (`--push_to_hub`), plus `checkpoints/` and `training_log.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate import Accelerator, DistributedDataParallelKwargs
from accelerate.logging import get_logger
from accelerate.utils import gather_object, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import HfArgumentParser, get_scheduler

from .. import loading
from ..cards import CardMetadata, describe_files, training_source, write_model_card
from ..configuration_elmo import ElmoConfig
from ..hub import push_directory
from ..kernel_plan import recurrence_for
from ..modeling_elmo import ElmoForBidirectionalLM
from ..runtime import set_threads
from ..text import expand_files, get_word_tokenizer
from ..tokenization_elmo import ElmoCharTokenizer
from .checkpointing import latest_checkpoint, load_checkpoint, remove_partial_checkpoints, save_checkpoint
from .data import DataPosition, LMBatches
from .evaluation import evaluate, perplexities
from .growth import widen_lstm_cells
from .losses import BidirectionalLMLoss
from .vocabulary import VOCAB_FILE, WordVocabulary, build_vocabulary

logger = get_logger(__name__)

# Steps that train the softmax alone, by default, when the starting biLM has none (at most a tenth of max_steps).
DEFAULT_SOFTMAX_ONLY_STEPS = 1000
# What the trained directory holds besides the model (left out of `--push_to_hub` uploads).
NOT_UPLOADED = ["checkpoints/*", "training_log.jsonl"]


@dataclass
class PretrainArguments:
    """Arguments of `elmo pretrain` (each is also a key of a YAML/JSON recipe)."""

    # Data
    train_files: list[str] = field(default_factory=list, metadata={"help": "Training files or glob patterns: plain "
                                   "text (.gz read compressed), one sentence or paragraph per line."})
    validation_files: list[str] = field(default_factory=list, metadata={"help": "Held-out files for perplexity."})
    word_tokenizer: str | None = field(default=None, metadata={"help": "How lines are split into words: whitespace "
                                       "(pre-tokenized), spacy:en (spaCy's English tokenizer) or elmo (hf_elmo."
                                       "split_words). Default: the starting model's, else spacy:en."})
    corpus_name: str | None = field(default=None, metadata={"help": "The corpus, for the model card "
                                    "(default: the training file names)."})
    dataset_ids: list[str] = field(default_factory=list, metadata={"help": "Hub dataset ids of the corpus, for "
                                   "the model card's `datasets`."})
    max_words: int | None = field(default=100, metadata={"help": "Lines longer than this many words are cut into "
                                  "pieces trained as separate sequences."})
    block_lines: int = field(default=10_000, metadata={"help": "Lines read, shuffled and batched together."})
    num_workers: int = field(default=0, metadata={"help": "DataLoader worker processes making the batches (0: "
                             "the training process); each makes whole blocks, the same batches in the same order on "
                             "every run. A GPU needs several (spaCy's tokenizer makes ~170k tokens/s per core)."})
    # Vocabulary
    vocab_file: str | None = field(default=None, metadata={"help": "The softmax vocabulary (one word per line, "
                                   "<S> </S> <UNK> first, by frequency). Default: built from --train_files."})
    max_vocab_size: int | None = field(default=None, metadata={"help": "Building: keep this many entries at most."})
    min_count: int = field(default=1, metadata={"help": "Building: keep words seen at least this often."})
    # Model
    init_model: str | None = field(default=None, metadata={"help": "Start from this ElmoForBidirectionalLM "
                                   "(continue with its vocabulary) or ElmoModel (a new softmax is trained first); "
                                   "a directory or Hub id. Default: a new model."})
    preset: str = field(default="small", metadata={"help": "Architecture of a new model: small, medium, original."})
    model_config: str | None = field(default=None, metadata={"help": "JSON object of ElmoConfig fields that "
                                     "override the preset, e.g. '{\"lstm_dim\": 512}'. With --init_model, fields "
                                     "equal to its config's, and a larger lstm_dim to grow it: the new cells start "
                                     "with zero projection columns, so it computes the same function until trained."})
    dropout: float | None = field(default=None, metadata={"help": "Override the model's dropout."})
    num_sampled: int = field(default=0, metadata={"help": "Sampled softmax with this many log-uniform candidates "
                             "(bilm-tf: 8192); 0 = full softmax. Evaluation always uses the full softmax."})
    softmax_only_steps: int | None = field(default=None, metadata={"help": "Train only the softmax for this many "
                                           "steps first. Default: 1000 (at most max_steps / 10) when the starting "
                                           "model has no softmax, else 0."})
    # Optimisation
    optimizer: str = field(default="adagrad", metadata={"help": "adagrad (bilm-tf: lr 0.2, accumulator 1.0) or adam."})
    learning_rate: float = field(default=0.2, metadata={"help": "Peak learning rate."})
    lr_scheduler: str = field(default="constant", metadata={"help": "A transformers schedule: constant, "
                              "constant_with_warmup, linear, cosine, ... (all but the constant ones need max_steps)."})
    warmup_steps: int = field(default=0, metadata={"help": "Warm-up steps of the schedule."})
    batch_tokens: int = field(default=4096, metadata={"help": "Padded positions per batch per process."})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Batches per optimizer step."})
    max_grad_norm: float = field(default=10.0, metadata={"help": "Clip the global gradient norm (0: no clipping)."})
    num_train_epochs: int = field(default=10, metadata={"help": "Passes over the training files."})
    max_steps: int | None = field(default=None, metadata={"help": "Stop after this many optimizer steps."})
    seed: int = field(default=42, metadata={"help": "Seed of initialisation, dropout, sampling and shuffling."})
    mixed_precision: str | None = field(default=None, metadata={"help": "no, fp16 (GPU) or bf16 (GPU, "
                                        "or with --cpu on CPUs with AMX / AVX512-BF16); default: Accelerate's config "
                                        "or launch flag."})
    cpu: bool = field(default=False, metadata={"help": "Train on the CPU even if a GPU is available."})
    threads: int | None = field(default=None, metadata={"help": "CPU threads per process [default: OMP_NUM_THREADS, "
                                                         "else the cores this process may use that no other "
                                                         "process is busy on]."})
    # Output
    output_dir: str | None = field(default=None, metadata={"help": "Where the model, checkpoints and logs go."})
    logging_steps: int = field(default=100, metadata={"help": "Log training loss, perplexity and tokens/s."})
    eval_steps: int | None = field(default=None, metadata={"help": "Evaluate on --validation_files this often "
                                   "(always at the end)."})
    save_steps: int = field(default=1000, metadata={"help": "Write a checkpoint this often (and at the end)."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept."})
    resume: bool = field(default=False, metadata={"help": "Continue from the newest checkpoint in output_dir "
                         "(with the same arguments and number of processes), if there is one."})
    report_to: str | None = field(default=None, metadata={"help": "An Accelerate tracker: tensorboard, wandb, ..."})
    push_to_hub: str | None = field(default=None, metadata={"help": "Upload the result to this Hub repo."})


def parse_arguments(argv: Sequence[str] | None = None) -> PretrainArguments:
    """Command-line arguments, on top of a YAML/JSON recipe when the first argument is one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = HfArgumentParser(PretrainArguments, prog="elmo pretrain", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    if argv and not argv[0].startswith("-") and argv[0].endswith((".yaml", ".yml", ".json")):
        recipe = yaml.safe_load(Path(argv.pop(0)).read_text(encoding="utf-8")) or {}
        unknown = set(recipe) - {f.name for f in fields(PretrainArguments)}
        if unknown:
            parser.error(f"unknown recipe keys: {', '.join(sorted(unknown))}")
        if isinstance(recipe.get("model_config"), dict):
            recipe["model_config"] = json.dumps(recipe["model_config"])
        parser.set_defaults(**recipe)
    (args,) = parser.parse_args_into_dataclasses(argv)
    if not args.train_files or not args.output_dir:
        parser.error("--train_files and --output_dir are required")
    if args.lr_scheduler not in ("constant", "constant_with_warmup") and not args.max_steps:
        parser.error(f"--lr_scheduler {args.lr_scheduler} needs --max_steps")
    if args.optimizer not in ("adagrad", "adam"):
        parser.error("--optimizer must be adagrad or adam")
    if args.num_workers < 0:
        parser.error("--num_workers must be >= 0")
    return args


def describe_model(name: str) -> str:
    """How a card names a starting model: a Hub id as it is, a local directory by its name only (a card never
    holds a local path)."""
    return f"`{Path(name).name}` (a local directory)" if Path(name).exists() else f"`{name}`"


def load_vocabulary(args: PretrainArguments, accelerator: Accelerator, word_tokenizer_name: str) -> WordVocabulary:
    """The vocabulary of a new softmax: the run's own (when resuming), --vocab_file, or built by the main process
    from the training files. Written to output_dir/vocab.txt."""
    saved = Path(args.output_dir) / VOCAB_FILE
    if args.resume and saved.is_file():
        return WordVocabulary.load(saved)
    if args.vocab_file:
        vocabulary = WordVocabulary.load(args.vocab_file)
    elif accelerator.is_main_process:
        logger.info("Building the vocabulary from the training files")
        vocabulary = build_vocabulary(
            expand_files(args.train_files), get_word_tokenizer(word_tokenizer_name), args.max_vocab_size,
            args.min_count, progress=True,
        )
    if accelerator.is_main_process:
        vocabulary.save(saved)
    accelerator.wait_for_everyone()
    return WordVocabulary.load(saved)


def load_model(
    args: PretrainArguments, init_config: ElmoConfig | None, accelerator: Accelerator, word_tokenizer_name: str
) -> tuple[ElmoForBidirectionalLM, WordVocabulary, str]:
    """The biLM to train, its vocabulary, and where its weights come from (for the card)."""
    model_config = json.loads(args.model_config) if args.model_config else {}
    # Dropout is a training setting, not part of the trained function: --model_config and --dropout set it for
    # --init_model too, --dropout taking precedence.
    overrides = {"dropout": model_config.pop("dropout")} if "dropout" in model_config else {}
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    if init_config is not None:
        if init_config.character_vocabulary != "bytes":
            raise ValueError(f"--init_model {args.init_model} reads characters through lexicons (an ELMoForManyLangs "
                             "model): `elmo pretrain` trains biLMs of the byte vocabulary only; use the model as it is")
        changed = sorted(name for name, value in model_config.items()
                         if json.loads(json.dumps(getattr(init_config, name, None))) != value)
        fixed = [name for name in changed if name != "lstm_dim"]
        if fixed:
            raise ValueError(f"--model_config differs from --init_model's config in {', '.join(fixed)}: a trained "
                             "model can only grow its LSTM cells (lstm_dim)")
        lm, vocabulary, source = load_initial_model(args, init_config, overrides, accelerator, word_tokenizer_name)
        if changed:
            logger.info(f"Growing the LSTM cells of {args.init_model} from {init_config.lstm_dim} to "
                        f"{model_config['lstm_dim']} (--model_config)", main_process_only=True)
            lm = widen_lstm_cells(lm, model_config["lstm_dim"])
            source += f", its LSTM cells widened from {init_config.lstm_dim} to {model_config['lstm_dim']}"
        return lm, vocabulary, source
    vocabulary = load_vocabulary(args, accelerator, word_tokenizer_name)
    config = ElmoConfig.from_preset(args.preset, **{**model_config, **overrides, "vocab_size": len(vocabulary)})
    return ElmoForBidirectionalLM(config), vocabulary, "random initialisation"


def load_initial_model(
    args: PretrainArguments,
    init_config: ElmoConfig,
    overrides: dict,
    accelerator: Accelerator,
    word_tokenizer_name: str,
) -> tuple[ElmoForBidirectionalLM, WordVocabulary, str]:
    """--init_model as a biLM with a softmax, its vocabulary, and where its weights come from (for the card)."""
    if init_config.vocab_size:  # continue an LM with its own softmax and vocabulary
        if args.vocab_file:
            raise ValueError("--init_model has a softmax, trained further with its own vocabulary: drop --vocab_file")
        try:
            vocabulary = WordVocabulary.from_pretrained(args.init_model)
        except OSError:
            raise ValueError(f"{args.init_model} has a softmax but no {VOCAB_FILE} naming its rows") from None
        if len(vocabulary) != init_config.vocab_size:
            raise ValueError(f"{args.init_model}: {VOCAB_FILE} has {len(vocabulary)} words, the softmax "
                             f"{init_config.vocab_size}")
        lm = loading.load_model(args.init_model, ElmoForBidirectionalLM, **overrides)
        if accelerator.is_main_process:
            vocabulary.save(Path(args.output_dir) / VOCAB_FILE)
        return lm, vocabulary, f"the biLM {describe_model(args.init_model)} (fine-tuned)"
    # An encoder without softmax (e.g. converted original weights): add a new one.
    vocabulary = load_vocabulary(args, accelerator, word_tokenizer_name)
    config = ElmoConfig.from_dict({**init_config.to_dict(), **overrides, "vocab_size": len(vocabulary)})
    # A new model, then the encoder's weights: its softmax gets bilm-tf's initialisation this way (loading the
    # encoder with `ElmoForBidirectionalLM.from_pretrained(..., vocab_size=...)` leaves it uninitialised).
    lm = ElmoForBidirectionalLM(config)
    lm.elmo.load_state_dict(loading.load_model(args.init_model).state_dict())
    return lm, vocabulary, f"the biLM {describe_model(args.init_model)} with a new softmax"


def make_optimizer(args: PretrainArguments, parameters) -> torch.optim.Optimizer:
    if args.optimizer == "adagrad":  # bilm-tf's optimizer
        return torch.optim.Adagrad(parameters, lr=args.learning_rate, initial_accumulator_value=1.0)
    return torch.optim.Adam(parameters, lr=args.learning_rate)


def _softmax_only_steps(args: PretrainArguments, init_config: ElmoConfig | None) -> int:
    """The steps that train the softmax alone first: given, else (a new softmax on a trained encoder) a tenth of the
    run, at most `DEFAULT_SOFTMAX_ONLY_STEPS`; none otherwise."""
    if args.softmax_only_steps is not None:
        return args.softmax_only_steps
    new_softmax_on_trained_encoder = init_config is not None and not init_config.vocab_size
    limit = args.max_steps // 10 if args.max_steps else DEFAULT_SOFTMAX_ONLY_STEPS
    return min(DEFAULT_SOFTMAX_ONLY_STEPS, limit) if new_softmax_on_trained_encoder else 0


class Pretraining:
    """One `elmo pretrain` run, read top to bottom: `__init__` sets it up (accelerator, model, vocabulary, data,
    objective, optimizer, schedule, checkpoint to resume), `run` trains (`_step` per batch, `_log`, `_validate`,
    `_save`) and `_write_output` writes the `save_pretrained` directory."""

    def __init__(self, args: PretrainArguments):
        self.args = args
        init_config = loading.load_config(args.init_model) if args.init_model else None
        self.word_tokenizer_name = args.word_tokenizer or getattr(init_config, "word_tokenizer", None) or "spacy:en"
        self.softmax_only_steps = _softmax_only_steps(args, init_config)
        self.accelerator = self._accelerator()
        checkpoint = self._output_directory()
        lm = self._model_and_data(init_config)
        self._objective_and_optimizer(lm)
        self._restore(checkpoint)
        self._announce(lm)
        self.progress: tqdm | None = None

    def _accelerator(self) -> Accelerator:
        """Accelerate's (device, processes, mixed precision, trackers); torch's threads and the seed set."""
        args = self.args
        # The biLM is frozen in the softmax-only steps: DDP must accept parameters without gradients then.
        accelerator = Accelerator(
            cpu=args.cpu,
            mixed_precision=args.mixed_precision,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            log_with=args.report_to,
            project_dir=args.output_dir,
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=self.softmax_only_steps > 0)],
        )
        set_threads(args.threads)
        set_seed(args.seed)
        return accelerator

    def _output_directory(self) -> Path | None:
        """The output directory made (partial checkpoints of a killed run removed); the checkpoint to resume."""
        self.output_dir = Path(self.args.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        if self.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            remove_partial_checkpoints(self.checkpoint_dir)
        self.accelerator.wait_for_everyone()
        return latest_checkpoint(self.checkpoint_dir) if self.args.resume else None

    def _model_and_data(self, init_config: ElmoConfig | None) -> ElmoForBidirectionalLM:
        """The biLM with its softmax, the vocabulary, the tokenizers and the training data; the biLM."""
        args, accelerator = self.args, self.accelerator
        lm, self.vocabulary, self.started_from = load_model(args, init_config, accelerator, self.word_tokenizer_name)
        lm.config.word_tokenizer = self.word_tokenizer_name
        lm.config.word_vocab_file = VOCAB_FILE
        self.char_tokenizer = ElmoCharTokenizer.for_model(lm.config)
        self.word_tokenizer = get_word_tokenizer(self.word_tokenizer_name)
        self.train_files = expand_files(args.train_files)
        self.validation_files = expand_files(args.validation_files) if args.validation_files else []
        self.train_data = self._batches(self.train_files, shuffle=True)
        # Each process reads its own part, so the loader is not prepared (sharded) by Accelerate; its own generator
        # keeps it from drawing on the global RNG, whose state the checkpoints restore.
        self.train_loader = DataLoader(
            self.train_data, batch_size=None, num_workers=args.num_workers, generator=torch.Generator(),
            pin_memory=accelerator.device.type == "cuda",
        )
        return lm

    def _objective_and_optimizer(self, lm: ElmoForBidirectionalLM) -> None:
        """Objective, optimizer and schedule, prepared by Accelerate (device, DDP, mixed precision)."""
        args, accelerator = self.args, self.accelerator
        objective = BidirectionalLMLoss(lm, num_sampled=args.num_sampled)
        optimizer = make_optimizer(args, objective.parameters())
        scheduler = get_scheduler(
            args.lr_scheduler, optimizer,
            num_warmup_steps=args.warmup_steps * accelerator.num_processes,
            num_training_steps=(args.max_steps or 0) * accelerator.num_processes,
        )
        self.objective, self.optimizer, self.scheduler = accelerator.prepare(objective, optimizer, scheduler)

    def _restore(self, checkpoint: Path | None) -> None:
        """Progress: optimizer steps, the data position, and this process's counts of sequences and targets (words
        + one </S> per line); since the last log, forward CE, backward CE and targets, and the training seconds they
        took (the log window, saved with the checkpoints, so that a resumed run logs the records an uninterrupted
        one would). From `checkpoint`, else from the start; the log file cut back to the checkpoint's step."""
        args, accelerator = self.args, self.accelerator
        state = {"step": 0, "position": DataPosition.start(0, args.num_workers).to_json(), "tokens": 0, "sequences": 0,
                 "world_size": accelerator.num_processes, "window": [0.0, 0.0, 0.0], "window_seconds": 0.0}
        if checkpoint is not None:
            state = {**state, **load_checkpoint(accelerator, checkpoint, self._checkpointed())}
            if state["world_size"] != accelerator.num_processes:
                raise ValueError(f"{checkpoint} was written by {state['world_size']} processes; resume with as many")
            logger.info(f"Resuming from {checkpoint} (step {state['step']})", main_process_only=True)
        self.step, self.last_saved = state["step"], state["step"]
        self.position = DataPosition.from_json(state["position"])
        if len(self.position.done) != max(args.num_workers, 1):
            raise ValueError(f"{checkpoint} was written with {len(self.position.done)} data workers; resume with "
                             f"--num_workers {len(self.position.done)}")
        self.sequences, self.tokens = state["sequences"], state["tokens"]
        self.window = torch.tensor(state["window"], dtype=torch.float64, device=accelerator.device)
        self.window_seconds = state["window_seconds"]
        self.log_file = self.output_dir / "training_log.jsonl"
        if accelerator.is_main_process and self.log_file.is_file():  # records after the checkpoint are written again
            keep = [line for line in self.log_file.read_text(encoding="utf-8").splitlines(keepends=True)
                    if checkpoint is not None and json.loads(line)["step"] <= self.step]
            self.log_file.write_text("".join(keep), encoding="utf-8")

    def _announce(self, lm: ElmoForBidirectionalLM) -> None:
        """The trackers started; one log line of what runs where."""
        accelerator = self.accelerator
        settings = {k: v for k, v in asdict(self.args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers("elmo-pretrain", config=settings)
        elmo = lm.elmo
        fused = recurrence_for(elmo.config.kernels(), accelerator.device, elmo.bilstm.layers[0].weights()) == "fused"
        recurrence = "cuDNN's LSTM" if fused else "the step loop" + (
            " (cells or projections clipped: cuDNN's LSTM does not clip)" if accelerator.device.type == "cuda" else "")
        logger.info(f"{sum(p.numel() for p in lm.parameters()):,} parameters, vocabulary {len(self.vocabulary):,}, "
                    f"{len(self.train_files)} training files, processes: {accelerator.num_processes} on "
                    f"{accelerator.device}, biLSTM through {recurrence}")

    def _checkpointed(self) -> dict[str, Any]:
        """What a checkpoint saves besides the random and per-process states."""
        objects = {"model": self.accelerator.unwrap_model(self.objective), "optimizer": self.optimizer,
                   "scheduler": self.scheduler}
        if self.accelerator.scaler is not None:
            objects["scaler"] = self.accelerator.scaler
        return objects

    def _batches(self, files: list[str], shuffle: bool) -> LMBatches:
        args = self.args
        return LMBatches(
            files, self.word_tokenizer, self.vocabulary, self.char_tokenizer, batch_tokens=args.batch_tokens,
            max_words=args.max_words, block_lines=args.block_lines, shuffle=shuffle, seed=args.seed,
            rank=self.accelerator.process_index, world_size=self.accelerator.num_processes,
        )

    @property
    def finished(self) -> bool:
        return self.args.max_steps is not None and self.step >= self.args.max_steps

    def run(self) -> Path:
        """Train, evaluate and write the output directory; returns it."""
        args, accelerator = self.args, self.accelerator
        self.progress = tqdm(total=args.max_steps, initial=self.step, disable=not accelerator.is_local_main_process,
                             desc="elmo pretrain", unit="step")
        self.window_start = time.perf_counter() - self.window_seconds
        self.objective.train()
        for epoch in range(self.position.epoch, args.num_train_epochs):
            if self.finished:
                break
            start = DataPosition.start(epoch, args.num_workers)
            self.train_data.set_position(self.position if epoch == self.position.epoch else start)
            loader = iter(self.train_loader)
            while not self.finished and self._all_processes_have(batch := next(loader, None)):
                self._step(batch)
            if not self.finished:
                self.position = DataPosition.start(epoch + 1, args.num_workers)
        if self.step == 0:
            raise ValueError(f"no training batch: the training files ({describe_files(self.train_files)}) hold no "
                             f"words once split by the {self.word_tokenizer_name!r} word tokenizer")
        if self.step != self.last_saved:
            self._save()
        self.progress.close()

        validation = self._validate()
        if validation is not None:
            self._log({f"validation_{key}": value for key, value in validation.items()})
        self._write_output(validation)
        # Every process releases the DDP model (which holds the process group), then the group, at the same time: a
        # group still referenced when a process exits can block that process forever.
        accelerator.wait_for_everyone()
        self.objective, self.optimizer, self.scheduler = accelerator.free_memory(
            self.objective, self.optimizer, self.scheduler
        )
        accelerator.end_training()
        return self.output_dir

    def _step(self, batch: dict) -> None:
        """One batch: forward, backward and (at the end of an accumulation) an optimizer step, log, evaluation and
        checkpoint as the arguments say."""
        args, accelerator, objective = self.args, self.accelerator, self.objective
        position = self.position.after(batch.pop("origin"))
        batch = {key: value.to(accelerator.device, non_blocking=True) if isinstance(value, torch.Tensor) else value
                 for key, value in batch.items()}
        accelerator.unwrap_model(objective).encoder_frozen = self.step < self.softmax_only_steps
        with accelerator.accumulate(objective):
            output = objective(**batch)
            accelerator.backward(output.loss)
            if accelerator.sync_gradients and args.max_grad_norm:
                accelerator.clip_grad_norm_(objective.parameters(), args.max_grad_norm)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
        self.position = position
        self.sequences += len(batch["labels"])
        self.tokens += len(batch["forward_index"])  # a shape: no wait for the device
        self.window += torch.stack([output.forward_loss_sum.double(), output.backward_loss_sum.double(),
                                    output.n_targets.double()])
        if not accelerator.sync_gradients:
            return
        self.step += 1
        self.progress.update(1)
        if self.step % args.logging_steps == 0 or self.finished:
            self._log_training()
        pause = time.perf_counter()  # tokens/s measures training: evaluation and checkpoints are left out
        if args.eval_steps and self.step % args.eval_steps == 0 and not self.finished:
            self._log({f"validation_{key}": value for key, value in self._validate().items()})
        if self.step % args.save_steps == 0 or self.finished:
            self._save()
        self.window_start += time.perf_counter() - pause

    def _log_training(self) -> None:
        """Log the training perplexities and speed since the last log (all processes)."""
        forward_sum, backward_sum, n_targets = self.accelerator.reduce(self.window, reduction="sum").tolist()
        train = perplexities(forward_sum, backward_sum, int(n_targets))
        speed = n_targets / (time.perf_counter() - self.window_start)
        self._log({
            "loss": 0.5 * (forward_sum + backward_sum) / max(n_targets, 1),
            "forward_perplexity": train["forward_perplexity"],
            "backward_perplexity": train["backward_perplexity"],
            "sampled_softmax": bool(self.args.num_sampled),
            "learning_rate": self.scheduler.get_last_lr()[0],
            "tokens_per_second": speed,
            "tokens": self._total_tokens(),
        })
        self.progress.set_postfix(ppl=f"{train['average_perplexity']:.1f}", tok_s=f"{speed:.0f}")
        self.window.zero_()
        self.window_start = time.perf_counter()

    def _log(self, record: dict) -> None:
        record = {"step": self.step, "epoch": self.position.epoch, **record}
        if self.accelerator.is_main_process:
            with self.log_file.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
            self.progress.write(json.dumps(record))
        self.accelerator.log(record, step=self.step)

    def _validate(self) -> dict[str, float] | None:
        if not self.validation_files:
            return None
        model = self.accelerator.unwrap_model(self.objective)  # no DDP hooks: processes may differ in batch counts
        return evaluate(model, self._batches(self.validation_files, shuffle=False), self.accelerator.device,
                        self.accelerator, progress=self.accelerator.is_main_process)

    def _total_tokens(self) -> int:
        return int(self.accelerator.reduce(torch.tensor(self.tokens, device=self.accelerator.device), reduction="sum"))

    def _save(self) -> None:
        position = self.position
        state = {"step": self.step, "position": position.to_json(),
                 "tokens": self.tokens, "sequences": self.sequences, "world_size": self.accelerator.num_processes,
                 "window": self.window.tolist(), "window_seconds": time.perf_counter() - self.window_start}
        save_checkpoint(self.accelerator, self.checkpoint_dir, self.step, state, self._checkpointed(),
                        keep=self.args.save_total_limit)
        self.last_saved = self.step

    def _all_processes_have(self, batch: dict | None) -> bool:
        """An epoch ends for every process when one runs out of data (they must take the same steps)."""
        accelerator = self.accelerator
        if accelerator.num_processes == 1:
            return batch is not None
        return bool(accelerator.gather(torch.tensor([int(batch is not None)], device=accelerator.device)).all())

    def _write_output(self, validation: dict[str, float] | None) -> None:
        """The `save_pretrained` directory: model, tokenizer, vocabulary, card and `trainer_state.json`."""
        args, accelerator = self.args, self.accelerator
        # Per process: the data it read, and a checksum of its weights (equal everywhere when gradients are in sync).
        processes = gather_object(
            [{"sequences": self.sequences, "tokens": self.tokens,
              "parameter_sum": sum(p.double().sum().item() for p in self.objective.parameters())}]
        )
        tokens = self._total_tokens()
        if not accelerator.is_main_process:
            return
        lm = accelerator.unwrap_model(self.objective).lm
        lm.save_pretrained(self.output_dir)
        self.char_tokenizer.save_pretrained(self.output_dir)
        self.vocabulary.save_pretrained(self.output_dir)
        batch_description = (
            f"batches of {args.batch_tokens:,} padded positions, processes: {accelerator.num_processes}, "
            f"gradient accumulation: {args.gradient_accumulation_steps}"
        )
        source = training_source(
            started_from=self.started_from,
            corpus=args.corpus_name or describe_files(self.train_files),
            word_tokenizer=self.word_tokenizer_name,
            vocab_size=len(self.vocabulary),
            num_sampled=args.num_sampled,
            steps=self.step,
            tokens=tokens,
            batch=batch_description,
            optimizer=f"{args.optimizer}, learning rate {args.learning_rate} ({args.lr_scheduler})",
            validation=validation,
            validation_corpus=describe_files(self.validation_files),
        )
        base_model = args.init_model if args.init_model and not Path(args.init_model).exists() else None
        write_model_card(self.output_dir, lm, source,
                         metadata=CardMetadata(datasets=args.dataset_ids, base_model=base_model))
        trainer_state = {"step": self.step, "epoch": self.position.epoch, "tokens": tokens, "validation": validation,
                         "processes": processes}
        (self.output_dir / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2), encoding="utf-8")
        if args.push_to_hub:
            push_directory(self.output_dir, args.push_to_hub, ignore_patterns=NOT_UPLOADED,
                           commit_message="Upload ELMo biLM trained with elmo pretrain")


def train(args: PretrainArguments) -> Path:
    """Train as `args` say; returns the output directory."""
    return Pretraining(args).run()


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # one line per saved file otherwise
    train(parse_arguments(argv))


if __name__ == "__main__":
    main()
