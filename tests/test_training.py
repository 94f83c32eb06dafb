"""Tests of `hf_elmo.training`: vocabulary, streamed sharded batches, the biLM objective (full and sampled softmax),
atomic checkpoints, and `elmo pretrain` / `elmo evaluate` / `elmo build-vocab` end to end on tiny models."""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from elmo_fixtures import TOY, TOY_MODEL, require, toy_batch, toy_lines
from fake_hub import FakeHub
from huggingface_hub import ModelCard, list_repo_files
from safetensors.torch import load_file
from spacy_fixtures import run_card_snippets
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoForBidirectionalLM, ElmoModel
from hf_elmo.text import get_word_tokenizer, read_lines
from hf_elmo.training import (
    BidirectionalLMLoss,
    DataPosition,
    LMBatches,
    Segment,
    WordVocabulary,
    build_vocabulary,
    checkpointing,
    encode_batch,
    evaluate_model,
    group_by_length,
    latest_checkpoint,
    load_checkpoint,
    log_uniform_candidates,
    parse_arguments,
    sampled_softmax_loss,
    save_checkpoint,
    split_line,
    train,
)
from hf_elmo.training import losses as losses_module
from hf_elmo.training.checkpointing import list_checkpoints, remove_partial_checkpoints
from hf_elmo.training.growth import widen_lstm_cells
from hf_elmo.training.losses import log_uniform_probability

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner(env={"COLUMNS": "1000"})


def reset_accelerate() -> None:
    """Forget the process-wide Accelerate state, so that the next `Accelerator` is configured afresh."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    reset_accelerate()


def write_corpus(path: Path, lines: list[str]) -> Path:
    data = "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def numbered_lines(n: int, words: int = 4) -> list[str]:
    """`n` distinct lines of `words` words: line i is "w<i> x y z"."""
    return [" ".join([f"w{i}", *["x", "y", "z", "u", "v"][: words - 1]]) for i in range(n)]


def toy_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--train_files", str(require(TOY / "data.txt")), "--vocab_file", str(TOY / "vocab.txt"),
        "--word_tokenizer", "whitespace", "--model_config", TOY_MODEL, "--output_dir", str(tmp_path / "out"),
        "--threads", "1", "--logging_steps", "10", *extra,
    ]


# -- vocabulary and word tokenizers ------------------------------------------------------------------------------

def test_vocabulary_puts_the_specials_first_then_words_by_decreasing_frequency(tmp_path):
    counts = Counter({"b": 3, "a": 3, "c": 5, "rare": 1, "<UNK>": 7})
    vocabulary = WordVocabulary.from_counts(counts)
    assert vocabulary.words == ["<S>", "</S>", "<UNK>", "c", "a", "b", "rare"]
    assert WordVocabulary.from_counts(counts, min_count=2).words[3:] == ["c", "a", "b"]
    assert WordVocabulary.from_counts(counts, max_size=5).words == ["<S>", "</S>", "<UNK>", "c", "a"]
    assert vocabulary.encode(["a", "unseen"]) == [0, 4, 2, 1]
    assert WordVocabulary.load(vocabulary.save(tmp_path / "v.txt")).words == vocabulary.words
    with pytest.raises(ValueError, match="starts with"):
        WordVocabulary(["a", "<S>", "</S>", "<UNK>"])
    with pytest.raises(ValueError, match="twice"):
        WordVocabulary(["<S>", "</S>", "<UNK>", "a", "a"])


def test_vocabulary_is_built_from_streamed_plain_and_gzip_files(tmp_path):
    plain = write_corpus(tmp_path / "a.txt", ["the cat", "the dog"])
    packed = write_corpus(tmp_path / "b.txt.gz", ["the end", "", "cat"])
    vocabulary = build_vocabulary([str(plain), str(packed)], get_word_tokenizer("whitespace"))
    assert vocabulary.words == ["<S>", "</S>", "<UNK>", "the", "cat", "dog", "end"]


def test_a_line_gives_the_same_char_ids_in_training_and_in_elmo_embed(tmp_path):
    """Training reads corpus lines as `elmo embed` does (`hf_elmo.text.read_lines`): the BOM and `\r` dropped,
    undecodable bytes kept as lone surrogates (whose words stay out of the softmax vocabulary, stored as UTF-8)."""
    data = b"\xef\xbb\xbffirst line\r\nbad \xff\xfe byte\n\nend"
    path = tmp_path / "corpus.txt.gz"
    with gzip.open(path, "wb") as file:
        file.write(data)
    (tmp_path / "corpus.txt").write_bytes(data)
    words = [line.split() for line in read_lines(io.BytesIO(data)) if line.split()]  # as `elmo embed` splits them
    assert words == [["first", "line"], ["bad", "\udcff\udcfe", "byte"], ["end"]]
    vocabulary = build_vocabulary([str(path), str(tmp_path / "corpus.txt")], get_word_tokenizer("whitespace"))
    assert vocabulary.words[3:] == ["bad", "byte", "end", "first", "line"]  # each twice; no "\udcff\udcfe"
    assert WordVocabulary.load(vocabulary.save(tmp_path / "vocab.txt")).words == vocabulary.words
    tokenizer = ElmoCharTokenizer()
    [batch] = LMBatches([str(path)], get_word_tokenizer("whitespace"), vocabulary, tokenizer, batch_tokens=100,
                        shuffle=False)
    embedded = tokenizer([words[i] for i in (1, 0, 2)], is_split_into_words=True, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], embedded["input_ids"])  # longest first
    assert torch.equal(batch["attention_mask"], embedded["attention_mask"])
    assert batch["labels"].tolist() == [[0, 3, 2, 4, 1], [0, 6, 7, 1, -100], [0, 5, 1, -100, -100]]
    for bad in ("\udcff", "a\nb", "a\rb", " a"):
        with pytest.raises(ValueError, match="undecodable"):
            WordVocabulary(["<S>", "</S>", "<UNK>", bad])
    assert WordVocabulary(["<S>", "</S>", "<UNK>", "a\xa0b"]).words[3] == "a\xa0b"  # bilm-tf files load as before


# -- batches -----------------------------------------------------------------------------------------------------

def test_long_lines_are_cut_into_pieces_whose_inner_boundaries_are_no_targets():
    pieces = split_line("a b c d e".split(), max_words=2)
    assert [(p.words, p.starts_line, p.ends_line) for p in pieces] == [
        (("a", "b"), True, False), (("c", "d"), False, False), (("e",), False, True)
    ]
    assert split_line([], 2) == [] and len(split_line(["a"] * 5, None)) == 1
    vocabulary = WordVocabulary.from_counts(Counter("abcde"))
    batch = encode_batch(pieces, ElmoCharTokenizer(), vocabulary)
    assert batch["input_ids"].shape == (3, 4, 50)
    a, b, c, d, e = (vocabulary.word_id(w) for w in "abcde")
    assert batch["labels"].tolist() == [[0, a, b, -100], [-100, c, d, -100], [-100, e, 1, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]


def test_batches_are_sorted_by_length_within_the_token_budget():
    segments = [Segment(tuple("x" * n)) for n in (5, 1, 3, 1, 8, 2)]
    batches = group_by_length(segments, batch_tokens=14)
    assert [[len(s.words) for s in batch] for batch in batches] == [[8], [5, 3], [2, 1, 1]]
    assert all(len(b) * (len(b[0].words) + 2) <= 14 for b in batches)


def lines_of(dataset: LMBatches, epoch: int = 0) -> list[str]:
    """The first words of every sequence of one epoch (the numbered lines)."""
    dataset.set_position(DataPosition.start(epoch))
    tokenizer = ElmoCharTokenizer()
    return [tokenizer.char_ids_to_word(row[1]) for batch in dataset for row in batch["input_ids"]]


@pytest.mark.parametrize("n_files", [1, 4])
def test_each_process_reads_its_own_part_and_together_all_of_the_data(tmp_path, n_files):
    lines = numbered_lines(40)
    files = [str(write_corpus(tmp_path / f"shard-{i}.txt.gz", lines[i::n_files])) for i in range(n_files)]
    vocabulary = WordVocabulary.from_counts(Counter(w for line in lines for w in line.split()))

    def dataset(rank: int, world_size: int, seed: int = 0) -> LMBatches:
        return LMBatches(files, get_word_tokenizer("whitespace"), vocabulary, ElmoCharTokenizer(), batch_tokens=30,
                         block_lines=7, seed=seed, rank=rank, world_size=world_size)

    parts = [lines_of(dataset(rank, 2)) for rank in range(2)]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(f"w{i}" for i in range(40))
    if n_files == 4:  # whole files per process, in an order that changes with the epoch
        assert len(parts[0]) == len(parts[1]) == 20
        assert dataset(0, 2).epoch_files(0) != dataset(0, 2).epoch_files(1)
    single = dataset(0, 1)
    assert lines_of(single, 0) == lines_of(dataset(0, 1), 0)  # deterministic for a seed
    assert lines_of(single, 0) != lines_of(single, 1) != lines_of(dataset(0, 1, seed=1), 1)


def loader_batches(dataset: LMBatches, position: DataPosition, workers: int) -> list[dict]:
    """The batches of a DataLoader with `workers` worker processes from `position`, in the order it gives them."""
    from torch.utils.data import DataLoader

    dataset.set_position(position)
    return list(DataLoader(dataset, batch_size=None, num_workers=workers))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_data_position_resumes_the_exact_remaining_batches(tmp_path, workers):
    """Every run gives the same batches in the same order, whatever the loader's worker processes (block k is made by
    worker k mod W, the loader takes one batch of each in turn); from the position after any batch, the rest."""
    lines = numbered_lines(60, words=3) + numbered_lines(20, words=5) + numbered_lines(30, words=2)
    path = write_corpus(tmp_path / "corpus.txt", lines)
    vocabulary = WordVocabulary.from_counts(Counter(w for line in lines for w in line.split()))
    dataset = LMBatches([str(path)], get_word_tokenizer("whitespace"), vocabulary, ElmoCharTokenizer(),
                        batch_tokens=40, block_lines=25, seed=3)
    batches = loader_batches(dataset, DataPosition.start(2, workers), workers)
    assert batches == [] or {batch["origin"][1] for batch in batches} == set(range(max(workers, 1)))
    first_words = sorted(ElmoCharTokenizer().char_ids_to_word(row[1]) for b in batches for row in b["input_ids"])
    assert first_words == sorted(line.split()[0] for line in lines)  # every line once
    again = loader_batches(dataset, DataPosition.start(2, workers), workers)
    assert [b["origin"] for b in again] == [b["origin"] for b in batches]
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(again, batches))
    position = DataPosition.start(2, workers)
    for index, batch in enumerate(batches):
        position = position.after(batch["origin"])
        if index in (0, 4, 5, len(batches) - 1):
            rest = loader_batches(dataset, DataPosition.from_json(position.to_json()), workers)
            assert [b["origin"] for b in rest] == [b["origin"] for b in batches[index + 1 :]]
            for expected, actual in zip(batches[index + 1 :], rest):
                assert torch.equal(expected["input_ids"], actual["input_ids"])
    with pytest.raises(ValueError, match="resume with the same --num_workers"):
        loader_batches(dataset, DataPosition.start(2, 2), 0)


# -- the objective -----------------------------------------------------------------------------------------------

def test_the_objective_counts_every_real_target_once_whatever_the_padding():
    vocabulary = WordVocabulary.load(require(TOY / "vocab.txt"))
    torch.manual_seed(0)
    lm = ElmoForBidirectionalLM(ElmoConfig(**json.loads(TOY_MODEL), vocab_size=len(vocabulary))).eval()
    objective = BidirectionalLMLoss(lm, num_sampled=16).eval()  # evaluation: always the full softmax
    batch = toy_batch(vocabulary)
    output = objective(**batch)
    n_targets = int(batch["attention_mask"].sum()) - len(batch["labels"])  # words + one </S> per line
    assert int(output.n_targets) == n_targets == len(batch["forward_index"]) == len(batch["backward_index"])
    unindexed = {key: value for key, value in batch.items() if not key.endswith("_index")}
    found = objective(**unindexed)  # the index the batch brings from the host is the one the labels give
    torch.testing.assert_close(found.loss, output.loss, rtol=0, atol=0)
    torch.testing.assert_close(0.5 * (output.forward_loss_sum + output.backward_loss_sum) / n_targets, output.loss)
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    rows = [{**{key: batch[key][i : i + 1, :length] for key in ("input_ids", "attention_mask", "labels")},
             "lengths": (length,)} for i, length in enumerate(lengths)]
    alone = [objective(**row) for row in rows]
    torch.testing.assert_close(output.forward_loss_sum, sum(row.forward_loss_sum for row in alone))
    torch.testing.assert_close(output.backward_loss_sum, sum(row.backward_loss_sum for row in alone))
    torch.testing.assert_close(alone[0].loss, lm(**rows[0]).loss)  # the model's own loss, without padding
    torch.testing.assert_close(output.loss, lm(**unindexed).loss)  # and with it: one objective


def test_log_uniform_candidates_are_distinct_and_zipfian():
    torch.manual_seed(0)
    candidates, tries = log_uniform_candidates(50, 1000)
    assert len(set(candidates.tolist())) == 50 and tries >= 50
    assert 0 <= int(candidates.min()) and int(candidates.max()) < 1000
    draws = torch.cat([log_uniform_candidates(1, 1000)[0] for _ in range(4000)])
    expected = log_uniform_probability(torch.arange(3), 1000)
    observed = torch.stack([(draws == k).double().mean() for k in range(3)])
    torch.testing.assert_close(observed, expected, atol=0.015, rtol=0)
    with pytest.raises(ValueError, match="num_sampled"):
        log_uniform_candidates(1000, 1000)


def test_sampled_softmax_removes_a_candidate_equal_to_the_target(monkeypatch):
    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(2, 4), torch.randn(10, 4), torch.randn(10)
    targets = torch.tensor([3, 7])

    def loss_with(candidates: list[int]) -> torch.Tensor:
        monkeypatch.setattr(losses_module, "log_uniform_candidates", lambda n, v: (torch.tensor(candidates), 20))
        return sampled_softmax_loss(hidden, targets, weight, bias, len(candidates))

    with_hit, without = loss_with([3, 5, 8]), loss_with([5, 8])
    torch.testing.assert_close(with_hit[0], without[0])  # row 0's target 3 is an accidental hit
    assert with_hit[1] > without[1]  # for row 1, candidate 3 is a real negative
    assert torch.isfinite(with_hit).all()


def test_sampled_softmax_loss_and_gradients_equal_the_plain_autograd_formula(monkeypatch):
    """The fused loss against the formula written with autograd: logsumexp over [true; candidates] of the logits
    corrected by log expected counts, accidental hits removed."""
    torch.manual_seed(0)
    rows, dim, vocab = 40, 8, 60
    hidden = torch.randn(rows, dim, requires_grad=True)
    weight = torch.randn(vocab, dim, requires_grad=True)
    bias = torch.randn(vocab, requires_grad=True)
    targets = torch.randint(0, 20, (rows,))
    candidates, tries = torch.tensor([4, 0, 17, 33, 2, 59, 11, 8]), 30  # several targets are accidental hits
    monkeypatch.setattr(losses_module, "log_uniform_candidates", lambda n, v: (candidates, tries))
    weights = torch.rand(rows)  # an uneven upstream gradient
    (sampled_softmax_loss(hidden, targets, weight, bias, len(candidates)) * weights).sum().backward()
    fused = [hidden.grad, weight.grad, bias.grad]

    def log_count(ids: torch.Tensor) -> torch.Tensor:
        return torch.log(-torch.expm1(tries * torch.log1p(-log_uniform_probability(ids, vocab)))).float()

    hidden.grad = weight.grad = bias.grad = None
    true = (hidden * weight[targets]).sum(-1) + bias[targets] - log_count(targets)
    sampled = hidden @ weight[candidates].T + bias[candidates] - log_count(candidates)
    sampled = sampled.masked_fill(candidates[None, :] == targets[:, None], float("-inf"))
    logits = torch.cat([true[:, None], sampled], dim=1)
    reference = torch.logsumexp(logits, dim=1) - logits[:, 0]
    (reference * weights).sum().backward()
    assert (candidates[None, :] == targets[:, None]).any(dim=1).sum() >= 3
    monkeypatch.setattr(losses_module, "log_uniform_candidates", lambda n, v: (candidates, tries))
    torch.testing.assert_close(sampled_softmax_loss(hidden, targets, weight, bias, 8), reference.detach())
    for got, expected in zip(fused, [hidden.grad, weight.grad, bias.grad]):
        torch.testing.assert_close(got, expected)


# -- checkpoints -------------------------------------------------------------------------------------------------

def test_checkpoints_are_atomic_and_pruned(tmp_path, monkeypatch):
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.8, 0.9))
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    objects = {"model": model, "optimizer": optimizer}
    for step in (1, 2, 3):
        save_checkpoint(accelerator, tmp_path, step, {"step": step}, objects, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]

    def crash(state, path: Path) -> None:  # killed half-way through writing
        path.write_bytes(b"garbage")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpointing, "save_state", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(accelerator, tmp_path, 4, {"step": 4}, objects, keep=2)
    assert latest_checkpoint(tmp_path).name == "checkpoint-3"
    monkeypatch.undo()
    expected_weight, expected_optimizer = model.weight.detach().clone(), optimizer.state_dict()
    with torch.no_grad():
        model.weight.zero_()
    fresh = torch.optim.Adam(model.parameters())
    assert load_checkpoint(accelerator, latest_checkpoint(tmp_path), {"model": model, "optimizer": fresh}) == {
        "step": 3}
    assert torch.equal(model.weight, expected_weight)
    restored = fresh.state_dict()
    assert restored["param_groups"] == expected_optimizer["param_groups"]  # betas stay a tuple
    for index, state in expected_optimizer["state"].items():
        assert all(torch.equal(state[key], restored["state"][index][key]) for key in state)
    remove_partial_checkpoints(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-3"]


def test_checkpoint_states_round_trip_without_pickles_and_restore_every_random_generator(tmp_path):
    import random

    import numpy as np

    state = {"a": torch.arange(3.0), 1: (torch.ones(2, dtype=torch.uint8), None, 2.5, float("inf")),
             "n": np.arange(4, dtype=np.uint32), "nested": [{"x": "y"}, True]}
    checkpointing.save_state(state, tmp_path / "state.safetensors")
    assert b"pickle" not in (tmp_path / "state.safetensors").read_bytes()
    loaded = checkpointing.load_state(tmp_path / "state.safetensors")
    assert loaded.keys() == state.keys() and torch.equal(loaded["a"], state["a"])
    assert isinstance(loaded[1], tuple) and torch.equal(loaded[1][0], state[1][0]) and loaded[1][1:] == (None, 2.5,
                                                                                                          math.inf)
    assert loaded["n"].dtype == np.uint32 and loaded["n"].tolist() == [0, 1, 2, 3]
    assert loaded["nested"] == [{"x": "y"}, True]
    checkpointing.save_state(checkpointing.random_states(), tmp_path / "random.safetensors")
    expected = (random.random(), np.random.rand(), torch.rand(1))
    checkpointing.set_random_states(checkpointing.load_state(tmp_path / "random.safetensors"))
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


# -- training end to end -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy_lm(tmp_path_factory) -> Path:
    """bilm-tf's training test: the toy corpus, its vocabulary, a sampled softmax of 16, 50 epochs, batches of
    2 sentences; trained through `elmo pretrain` with its validation on the training text."""
    tmp_path = tmp_path_factory.mktemp("toy")
    threads = torch.get_num_threads()
    result = runner.invoke(app, ["pretrain", *toy_args(
        tmp_path, "--num_sampled", "16", "--num_train_epochs", "50", "--batch_tokens", "60",
        "--max_grad_norm", "1.0", "--validation_files", str(TOY / "data.txt"), "--corpus_name", "bilm-tf toy corpus",
        "--dataset_ids", "org/toy-corpus",
    )])
    torch.set_num_threads(threads)
    reset_accelerate()
    assert result.exit_code == 0, result.output
    return tmp_path / "out"


@pytest.mark.slow
def test_the_toy_corpus_is_learned_to_perplexity_below_20_as_in_bilm_tf(toy_lm, one_torch_thread):
    result = runner.invoke(app, ["evaluate", str(toy_lm), str(TOY / "data.txt"), "--threads", "1"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert set(metrics) == {"forward_perplexity", "backward_perplexity", "average_perplexity", "tokens"}
    assert "evaluating: " in result.stderr  # progress, on stderr
    assert metrics["tokens"] == 134 + 5  # words + one </S> per line
    assert metrics["average_perplexity"] < 20
    average = math.exp(0.5 * (math.log(metrics["forward_perplexity"]) + math.log(metrics["backward_perplexity"])))
    assert metrics["average_perplexity"] == pytest.approx(average)
    state = json.loads((toy_lm / "trainer_state.json").read_text())
    assert state["validation"] == pytest.approx(metrics)


@pytest.mark.slow
def test_the_trained_directory_records_tokenizer_vocabulary_and_training_in_config_and_card(toy_lm):
    lm = ElmoForBidirectionalLM.from_pretrained(toy_lm)
    assert lm.config.word_tokenizer == "whitespace" and lm.config.word_vocab_file == "vocab.txt"
    assert WordVocabulary.from_pretrained(toy_lm).words == WordVocabulary.load(TOY / "vocab.txt").words
    assert lm.config.vocab_size == 32
    assert ElmoCharTokenizer.from_pretrained(toy_lm).max_characters_per_token == 10
    card = (toy_lm / "README.md").read_text()
    state = json.loads((toy_lm / "trainer_state.json").read_text())
    for text in ("bilm-tf toy corpus", "`whitespace`", "32 words", "16 log-uniform candidates",
                 f"{state['step']:,} optimizer steps", f"average {state['validation']['average_perplexity']:.2f}"):
        assert text in card
    assert state["step"] == 150  # 50 epochs of 3 batches
    metadata = ModelCard(card).data  # whitespace-split text: no language; trained from scratch: no base model
    assert metadata.datasets == ["org/toy-corpus"] and metadata.language is None and metadata.base_model is None
    assert [p.name for p in list_checkpoints(toy_lm / "checkpoints")] == ["checkpoint-150"]


@pytest.mark.parametrize("remote_code", [True, False])
@pytest.mark.slow
def test_export_encoder_drops_the_softmax_and_keeps_the_representations_and_the_training_record(
    toy_lm, tmp_path, remote_code
):
    out = tmp_path / "encoder"
    flag = "--remote-code" if remote_code else "--no-remote-code"
    result = runner.invoke(app, ["export-encoder", str(toy_lm), str(out), "--note", "Trained on a toy CPU.", flag])
    assert result.exit_code == 0, result.output
    assert not any(name.startswith("softmax.") for name in load_file(out / "model.safetensors"))
    encoder = ElmoModel.from_pretrained(out).eval()
    assert encoder.config.vocab_size is None and encoder.config.word_tokenizer == "whitespace"
    assert not hasattr(encoder.config, "word_vocab_file")
    lm = ElmoForBidirectionalLM.from_pretrained(toy_lm).eval()
    tokenizer = ElmoCharTokenizer.from_pretrained(out)
    assert tokenizer.max_characters_per_token == 10 and tokenizer.word_tokenizer == "whitespace"
    batch = tokenizer([["the", "toy", "corpus"], ["one"]], is_split_into_words=True, padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        for exported, trained in zip(encoder(**batch).hidden_states, lm.elmo(**batch).hidden_states):
            assert torch.equal(exported, trained)
    card = (out / "README.md").read_text()
    state = json.loads((toy_lm / "trainer_state.json").read_text())
    for text in ("bilm-tf toy corpus", f"average {state['validation']['average_perplexity']:.2f}",
                 "word softmax (32 words) was dropped", "Trained on a toy CPU.", "none (encoder only)"):
        assert text in card
    assert ModelCard(card).data.datasets == ["org/toy-corpus"]
    config = json.loads((out / "config.json").read_text())
    assert ("auto_map" in config) == remote_code
    assert bool(list(out.glob("*.py"))) == remote_code
    # The card's snippets run as written on this directory: with its code, or with the package (no code here).
    assert ("trust_remote_code=True" in card) == remote_code and ("\nimport hf_elmo  #" in card) != remote_code
    assert run_card_snippets(out) == ["3 (1, 8, 16)", "(3, 6, 16)"]


@pytest.mark.slow
def test_export_encoder_refuses_a_model_without_softmax(toy_lm, tmp_path):
    encoder = tmp_path / "encoder"
    assert runner.invoke(app, ["export-encoder", str(toy_lm), str(encoder)]).exit_code == 0
    result = runner.invoke(app, ["export-encoder", str(encoder), str(tmp_path / "again")])
    assert result.exit_code == 1 and "holds no word softmax" in result.output


@pytest.mark.slow
def test_fine_tuning_a_bilm_keeps_its_vocabulary_and_tokenizer(toy_lm, tmp_path, one_torch_thread):
    domain = write_corpus(tmp_path / "domain.txt", ["neural networks make language models .", "a new word ."])
    output = train(parse_arguments([
        "--train_files", str(domain), "--init_model", str(toy_lm), "--output_dir", str(tmp_path / "tuned"),
        "--max_steps", "4", "--threads", "1",
    ]))
    assert WordVocabulary.from_pretrained(output).words == WordVocabulary.from_pretrained(toy_lm).words
    tuned = ElmoForBidirectionalLM.from_pretrained(output)
    assert tuned.config.word_tokenizer == "whitespace"
    before = ElmoForBidirectionalLM.from_pretrained(toy_lm)
    assert not torch.equal(tuned.elmo.char_cnn.char_embedding.weight, before.elmo.char_cnn.char_embedding.weight)
    card = (output / "README.md").read_text()
    assert f"the biLM `{toy_lm.name}` (a local directory) (fine-tuned)" in card and str(toy_lm) not in card


def test_widened_lstm_cells_compute_the_same_function_and_the_new_cells_learn():
    vocabulary = WordVocabulary.load(require(TOY / "vocab.txt"))
    torch.manual_seed(0)
    lm = ElmoForBidirectionalLM(ElmoConfig(**json.loads(TOY_MODEL), vocab_size=len(vocabulary)))
    wide = widen_lstm_cells(lm, 40)
    assert (wide.config.lstm_dim, lm.config.lstm_dim) == (40, 16)
    batch = toy_batch(vocabulary)
    narrow_output, wide_output = lm.eval()(**batch), wide.eval()(**batch)
    for narrow_layer, wide_layer in zip(narrow_output.hidden_states, wide_output.hidden_states, strict=True):
        torch.testing.assert_close(wide_layer, narrow_layer, rtol=0, atol=1e-6)
    torch.testing.assert_close(wide_output.loss, narrow_output.loss, rtol=0, atol=1e-6)
    wide_output.loss.backward()
    bound = math.sqrt(6.0 / (8 + 8 + 4 * 40))  # bilm-tf's glorot on [x; h] at the new width
    for narrow_layer, wide_layer in zip(lm.elmo.bilstm.layers, wide.elmo.bilstm.layers, strict=True):
        gates = wide_layer.input_weight.view(2, 4, 40, -1)
        assert torch.equal(gates[:, :, :16], narrow_layer.input_weight.view(2, 4, 16, -1))
        assert 0.5 * bound < gates[:, :, 16:].abs().max() <= bound  # new cells read their inputs from the start
        assert torch.equal(wide_layer.bias.view(2, 4, 40)[:, :, :16], narrow_layer.bias.view(2, 4, 16))
        assert torch.equal(wide_layer.projection_weight[..., :16], narrow_layer.projection_weight)
        assert not wide_layer.projection_weight[..., 16:].any()  # and feed nothing until trained
        assert wide_layer.projection_weight.grad[..., 16:].abs().sum() > 0  # the gradient reaches them
    with pytest.raises(ValueError, match="narrower"):
        widen_lstm_cells(lm, 8)
    with pytest.raises(ValueError, match="lstm_dim must be an integer"):
        widen_lstm_cells(lm, "40")
    unprojected = ElmoModel(ElmoConfig(**{**json.loads(TOY_MODEL), "projection_dim": 16}))
    with pytest.raises(ValueError, match="no projection"):
        widen_lstm_cells(unprojected, 32)


@pytest.mark.slow
def test_pretrain_grows_a_trained_bilm_and_refuses_other_architecture_changes(toy_lm, tmp_path, one_torch_thread):
    domain = write_corpus(tmp_path / "domain.txt", toy_lines())
    model_config = {**json.loads(TOY_MODEL), "lstm_dim": 24}  # the recipe's fields, one of them grown
    output = train(parse_arguments([
        "--train_files", str(domain), "--init_model", str(toy_lm), "--output_dir", str(tmp_path / "grown"),
        "--model_config", json.dumps(model_config), "--max_steps", "2", "--threads", "1",
    ]))
    grown = ElmoForBidirectionalLM.from_pretrained(output)
    assert grown.config.lstm_dim == 24 and grown.elmo.bilstm.layers[0].input_weight.shape == (2, 96, 8)
    assert "its LSTM cells widened from 16 to 24" in (output / "README.md").read_text()
    reset_accelerate()
    with pytest.raises(ValueError, match="differs from --init_model's config in n_highway, projection_dim"):
        train(parse_arguments([
            "--train_files", str(domain), "--init_model", str(toy_lm), "--output_dir", str(tmp_path / "other"),
            "--model_config", json.dumps({**model_config, "n_highway": 2, "projection_dim": 4}), "--max_steps", "2",
        ]))


@pytest.mark.slow
def test_dropout_of_a_continued_bilm_comes_from_the_recipe_and_then_from_dropout(toy_lm, tmp_path, one_torch_thread):
    """Dropout is a training setting: a recipe's `model_config` may set it for --init_model (a run continued with
    the recipe once failed because the trained model's dropout differed from the recipe's), --dropout overrides it."""
    domain = write_corpus(tmp_path / "domain.txt", toy_lines())
    assert ElmoForBidirectionalLM.from_pretrained(toy_lm).config.dropout == 0.1
    args = ["--train_files", str(domain), "--init_model", str(toy_lm), "--max_steps", "1", "--threads", "1",
            "--model_config", json.dumps({**json.loads(TOY_MODEL), "dropout": 0.0})]
    from_recipe = train(parse_arguments([*args, "--output_dir", str(tmp_path / "recipe")]))
    assert ElmoForBidirectionalLM.from_pretrained(from_recipe).config.dropout == 0.0
    reset_accelerate()
    from_flag = train(parse_arguments([*args, "--output_dir", str(tmp_path / "flag"), "--dropout", "0.25"]))
    assert ElmoForBidirectionalLM.from_pretrained(from_flag).config.dropout == 0.25


def test_an_encoder_without_softmax_gets_a_new_softmax_trained_first(tmp_path, one_torch_thread):
    torch.manual_seed(0)
    encoder = ElmoModel(ElmoConfig(**json.loads(TOY_MODEL)))
    encoder.save_pretrained(tmp_path / "encoder")
    args = ["--train_files", str(require(TOY / "data.txt")), "--init_model", str(tmp_path / "encoder"),
            "--word_tokenizer", "whitespace", "--min_count", "2", "--threads", "1", "--learning_rate", "0.1"]
    frozen = train(parse_arguments([*args, "--output_dir", str(tmp_path / "a"), "--max_steps", "3",
                                    "--softmax_only_steps", "3"]))
    lm = ElmoForBidirectionalLM.from_pretrained(frozen)
    for name, weight in encoder.state_dict().items():
        assert torch.equal(lm.elmo.state_dict()[name], weight), name  # only the softmax was trained
    counts = Counter(" ".join(toy_lines()).split())
    assert lm.config.vocab_size == 3 + sum(1 for c in counts.values() if c >= 2)
    assert lm.softmax.weight.std() < 1  # bilm-tf's N(0, 1/sqrt(P)) initialisation, then trained
    reset_accelerate()
    then_all = train(parse_arguments([*args, "--output_dir", str(tmp_path / "b"), "--max_steps", "4",
                                      "--softmax_only_steps", "2"]))
    lm = ElmoForBidirectionalLM.from_pretrained(then_all)
    assert not torch.equal(lm.elmo.char_cnn.char_embedding.weight, encoder.char_cnn.char_embedding.weight)
    assert "with a new softmax" in (then_all / "README.md").read_text()


def test_gradient_accumulation_and_bf16_autocast_on_cpu(tmp_path, one_torch_thread):
    output = train(parse_arguments(toy_args(
        tmp_path, "--cpu", "--mixed_precision", "bf16", "--gradient_accumulation_steps", "2", "--max_steps", "3",
        "--batch_tokens", "60", "--num_sampled", "8",
    )))
    state = json.loads((output / "trainer_state.json").read_text())
    assert state["step"] == 3
    assert state["processes"][0]["sequences"] >= 6  # two batches of at least one sentence per step
    assert torch.isfinite(ElmoForBidirectionalLM.from_pretrained(output).softmax.weight).all()


def run_pretrain(args: list[str], log: Path) -> subprocess.Popen:
    """`elmo pretrain ARGS` in a new process, its output in `log`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "hf_elmo.training", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_resume_after_sigkill_continues_exactly(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", toy_lines() * 20)
    args = ["--train_files", str(corpus), "--vocab_file", str(require(TOY / "vocab.txt")), "--word_tokenizer",
            "whitespace", "--model_config", TOY_MODEL, "--threads", "1", "--batch_tokens", "120", "--num_sampled",
            "8", "--num_train_epochs", "4", "--save_steps", "5", "--save_total_limit", "2", "--num_workers", "2",
            "--logging_steps", "3"]
    reference = run_pretrain([*args, "--output_dir", str(tmp_path / "reference")], tmp_path / "reference.log")

    killed_dir = tmp_path / "killed"
    killed = run_pretrain([*args, "--output_dir", str(killed_dir)], tmp_path / "killed.log")
    deadline = time.monotonic() + 120
    while latest_checkpoint(killed_dir / "checkpoints") is None or latest_checkpoint(
        killed_dir / "checkpoints"
    ).name == "checkpoint-5":
        assert killed.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert not (killed_dir / "config.json").exists()  # killed mid-training
    steps = [int(p.name.split("-")[1]) for p in list_checkpoints(killed_dir / "checkpoints")]
    assert steps and steps[-1] >= 10

    resumed = run_pretrain([*args, "--output_dir", str(killed_dir), "--resume"], tmp_path / "resumed.log")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    assert reference.wait(timeout=300) == 0, (tmp_path / "reference.log").read_text()[-3000:]
    assert "Resuming from" in (tmp_path / "resumed.log").read_text()
    expected, actual = (load_file(d / "model.safetensors") for d in (tmp_path / "reference", killed_dir))
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    states = [json.loads((d / "trainer_state.json").read_text()) for d in (tmp_path / "reference", killed_dir)]
    assert states[0]["step"] == states[1]["step"] and states[0]["tokens"] == states[1]["tokens"]
    assert not [p for p in (killed_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    # The log holds every record once, as the uninterrupted run's: those written after the checkpoint the run
    # resumed from are dropped, then written again by the resumed run.
    logs = [[json.loads(line) for line in (d / "training_log.jsonl").read_text().splitlines()]
            for d in (tmp_path / "reference", killed_dir)]
    assert [r["step"] for r in logs[1]] == [r["step"] for r in logs[0]] and len(logs[0]) >= 3
    # Losses are means since the previous record: the log window is saved with the checkpoint, so the records of
    # the resumed run (the first one included, whose window began before the checkpoint) equal the reference's.
    after = [[r["loss"] for r in log if r["step"] > steps[-1]] for log in logs]
    assert after[0] and after[1] == after[0]


def test_resume_refuses_damaged_and_pickled_checkpoints_in_one_line(tmp_path, one_torch_thread):
    """A damaged file of a checkpoint is named; the pickled states of an earlier version are never unpickled."""
    import pickle

    args = toy_args(tmp_path, "--num_sampled", "8", "--batch_tokens", "60", "--save_steps", "2", "--max_steps", "4")
    assert runner.invoke(app, ["pretrain", *args]).exit_code == 0
    reset_accelerate()
    checkpoint = latest_checkpoint(tmp_path / "out" / "checkpoints")
    resume = ["pretrain", *args[:-2], "--max_steps", "6", "--resume"]
    for name in ("random_state_0.safetensors", "model.safetensors", "optimizer.safetensors"):
        original = (checkpoint / name).read_bytes()
        (checkpoint / name).write_bytes(original[: len(original) // 2])  # truncated
        result = runner.invoke(app, resume)
        reset_accelerate()
        assert result.exit_code == 1, result.output
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
        assert f"{checkpoint / name} cannot be read" in result.stderr and "damaged" in result.stderr
        (checkpoint / name).write_bytes(original)

    class RunsCode:  # what a malicious checkpoint could hold: unpickling it would run `touch`
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'pwned'}",)

    (checkpoint / "random_state_0.safetensors").unlink()
    (checkpoint / "random_states_0.pkl").write_bytes(pickle.dumps(RunsCode()))
    result = runner.invoke(app, resume)
    reset_accelerate()
    assert result.exit_code == 1 and not (tmp_path / "pwned").exists()
    assert "random_states_0.pkl" in result.stderr and "never loaded" in result.stderr


@pytest.mark.slow
def test_two_processes_read_their_own_part_and_keep_their_weights_in_sync(tmp_path):
    lines = numbered_lines(40)
    files = [write_corpus(tmp_path / f"part-{i}.txt", lines[i::2]) for i in range(2)]
    valid = write_corpus(tmp_path / "valid.txt", numbered_lines(7, words=3))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "hf_elmo.training", "--cpu", "--train_files", *map(str, files), "--validation_files", str(valid),
        "--word_tokenizer", "whitespace", "--model_config", TOY_MODEL, "--batch_tokens", "30", "--num_train_epochs",
        "2", "--output_dir", str(tmp_path / "out"), "--threads", "1", "--logging_steps", "2", "--num_sampled", "4",
    ]
    # A session of its own, so that a hang never leaves a worker process behind.
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, stderr[-3000:]
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    processes = state["processes"]
    assert len(processes) == 2
    assert processes[0]["parameter_sum"] == processes[1]["parameter_sum"]  # gradients were averaged
    assert [p["sequences"] for p in processes] == [40, 40]  # 20 lines (one file) per process per epoch
    assert state["step"] == 2 * 4  # 20 lines of 6 positions, 5 per batch
    local = evaluate_model(str(tmp_path / "out"), [str(valid)])  # one process, the same sums
    assert state["validation"] == pytest.approx(local)


# -- command line and Hub ----------------------------------------------------------------------------------------

def test_build_vocab_writes_the_vocabulary_and_reports_its_coverage(tmp_path):
    corpus = write_corpus(tmp_path / "c.txt.gz", ["a b b c c c", "c d"])
    result = runner.invoke(app, ["build-vocab", str(corpus), "-o", str(tmp_path / "v.txt"), "--word-tokenizer",
                                 "whitespace", "--min-count", "2"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "v.txt").read_text().split() == ["<S>", "</S>", "<UNK>", "c", "b"]
    assert "5 entries covering 75.00% of 8 words" in result.stdout
    assert "counting c.txt.gz: " in result.stderr and "2 lines" in result.stderr  # progress, on stderr
    missing = runner.invoke(app, ["build-vocab", str(tmp_path / "none*.txt"), "-o", str(tmp_path / "x.txt")])
    assert missing.exit_code == 1 and "no file matches" in missing.stderr


def test_evaluate_fails_cleanly_on_a_model_without_softmax(tmp_path):
    ElmoModel(ElmoConfig(**json.loads(TOY_MODEL))).save_pretrained(tmp_path / "encoder")
    result = runner.invoke(app, ["evaluate", str(tmp_path / "encoder"), str(require(TOY / "data.txt"))])
    assert result.exit_code == 1 and "has no word softmax" in result.stderr
    assert "Traceback" not in result.output


def test_pretrain_rejects_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        parse_arguments(["--output_dir", str(tmp_path)])  # no training files
    with pytest.raises(SystemExit):
        parse_arguments(["--train_files", "x", "--output_dir", "y", "--lr_scheduler", "linear"])  # needs max_steps
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("train_files: [a.txt]\noutput_dir: out\nmodel_config: {lstm_dim: 32}\nmax_steps: 5\n")
    args = parse_arguments([str(recipe), "--max_steps", "7"])
    assert (args.train_files, args.max_steps, json.loads(args.model_config)) == (["a.txt"], 7, {"lstm_dim": 32})
    recipe.write_text("train_files: [a.txt]\nlearning_rte: 1\n")
    with pytest.raises(SystemExit):
        parse_arguments([str(recipe)])


def test_a_vocabulary_that_is_not_utf8_is_named_in_one_line(tmp_path, one_torch_thread):
    (tmp_path / "vocab.txt").write_bytes(b"<S>\n</S>\n<UNK>\nbank\n\xffrates\n")
    args = toy_args(tmp_path, "--max_steps", "1")
    args[args.index("--vocab_file") + 1] = str(tmp_path / "vocab.txt")
    result = runner.invoke(app, ["pretrain", *args])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr == (f"Error: {tmp_path / 'vocab.txt'} is not UTF-8 text (invalid start byte at byte 20): a "
                             "vocabulary is one UTF-8 word per line\n")


@pytest.mark.slow
def test_the_trained_directory_is_pushed_with_its_vocabulary_and_evaluated_from_the_hub(
    toy_lm, fake_hub: FakeHub, tmp_path, one_torch_thread
):
    from hf_elmo.hub import push_directory
    from hf_elmo.training.pretrain import NOT_UPLOADED

    push_directory(toy_lm, "org/toy-bilm", ignore_patterns=NOT_UPLOADED)
    files = set(list_repo_files("org/toy-bilm"))
    assert {"config.json", "model.safetensors", "vocab.txt", "README.md", "tokenizer_config.json"} <= files
    assert not any(name.startswith("checkpoints/") for name in files)
    corpus = [str(TOY / "data.txt")]
    assert evaluate_model("org/toy-bilm", corpus) == evaluate_model(str(toy_lm), corpus)


@pytest.mark.parametrize("text", ["", "\n   \n\t\n"])
def test_an_empty_or_blank_corpus_is_an_error_not_a_random_model(tmp_path, text):
    corpus = tmp_path / "empty.txt"
    corpus.write_text(text)
    args = toy_args(tmp_path, "--max_steps", "5")
    args[args.index("--train_files") + 1] = str(corpus)
    result = runner.invoke(app, ["pretrain", *args])
    reset_accelerate()
    assert result.exit_code == 1
    assert "no training batch: the training files (empty.txt) hold no words" in result.output
    assert not (tmp_path / "out" / "model.safetensors").exists() and not (tmp_path / "out" / "README.md").exists()


@pytest.mark.slow
def test_empty_held_out_text_has_no_perplexity(tmp_path, toy_lm):
    (tmp_path / "blank.txt").write_text("\n \n")
    result = runner.invoke(app, ["evaluate", str(toy_lm), str(tmp_path / "blank.txt")])
    assert result.exit_code == 1 and "held-out text holds no words" in result.output


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
def test_every_shipped_recipe_parses_and_sizes_gpu_runs_for_gpus(recipe):
    args = parse_arguments([str(REPO / "recipes" / recipe)])
    assert args.train_files and args.output_dir and args.batch_tokens > 0
    if "gpu" in recipe or "small" in recipe:  # the GPU recipes: bf16, loader workers, batches a GPU fills
        assert args.mixed_precision == "bf16" and args.num_workers >= 2 and args.batch_tokens >= 1024
