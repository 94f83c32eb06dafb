"""Shared fixtures: an offline fake Hugging Face Hub, and the small biLMs most test modules run (saved once per
session). Helpers that are not fixtures live in `elmo_fixtures.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import torch
from elmo_fixtures import ALLENNLP, TINY_CONFIG, require, tiny_config
from fake_hub import FakeHub, patch_hub_client
from host_cpus import Pretended, forget_capabilities, pretend
from processes import Processes


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    """A running :class:`FakeHub` that huggingface_hub and transformers use instead of huggingface.co.

    For the test module, HF_ENDPOINT/HF_TOKEN point at the fake Hub and HF_HOME (``os.environ["HF_HOME"]``)
    is a fresh temp dir, in this process and in child processes; everything is restored afterwards.
    """
    with FakeHub() as hub, patch_hub_client(hub.url, tmp_path_factory.mktemp("hf_home")):
        yield hub


@pytest.fixture
def processes() -> Iterator[Processes]:
    """`processes.start(command, env)`: a process of its own session, ended with everything it started when the test
    ends, passed or failed (`processes.Processes`)."""
    started = Processes()
    yield started
    started.end()


@pytest.fixture
def pretend_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Pretended]]:
    """`pretend_cpu(name)`: `hf_elmo.runtime` answers as CPU `name` of `host_cpus.CPUS` ("avx2", "avx512",
    "avx512_bf16", "amx") for the rest of the test; afterwards it reads the real CPU again."""
    yield partial(pretend, monkeypatch)
    forget_capabilities()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """The tiny models run much faster on one thread (per-step overhead dominates); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    """`tiny_config()`'s biLM, random weights (seed 0), in eval mode."""
    from hf_elmo import ElmoModel

    torch.manual_seed(0)
    return ElmoModel(tiny_config()).eval()


@pytest.fixture(scope="module")
def tokenizer():
    from hf_elmo import ElmoCharTokenizer

    return ElmoCharTokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A small random biLM (3 output layers of width 16) with its tokenizer, saved with save_pretrained."""
    from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoModel

    path = tmp_path_factory.mktemp("tiny-elmo")
    torch.manual_seed(0)
    ElmoModel(ElmoConfig(**TINY_CONFIG)).save_pretrained(path)
    ElmoCharTokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from hf_elmo import ElmoModel

    return ElmoModel.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="session")
def allennlp_model_dir(tmp_path_factory) -> Path:
    """The tiny real model of AllenNLP's test fixtures, converted."""
    from hf_elmo.original_format import FORMAT

    options, weights = require(ALLENNLP / "options.json"), require(ALLENNLP / "lm_weights.hdf5")
    return FORMAT.convert([options, weights], tmp_path_factory.mktemp("allennlp-elmo"))


@pytest.fixture(scope="session")
def elmo_dir(tmp_path_factory) -> Path:
    """AllenNLP's test biLM converted, with the tokenizer the spaCy tests read it with."""
    from spacy_fixtures import convert_fixture

    return convert_fixture(tmp_path_factory.mktemp("elmo") / "fixture")
