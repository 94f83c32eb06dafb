"""What a GPU step costs the host, checked on the CPU in every run: the project's code on fake CUDA tensors
(`fake_cuda.py`) waits for the device nowhere, and launches no more operations per step than its budget.

On an H100 (2026-11-27, `../shared/gpu/reports/2026-11-27-h100/`) torch's sync debug mode counted 1 / 3 / 3 host waits
in the forward of a batch (float32 / bf16 / fp16) and 3 in a pretraining step. These checks find the same ones in the
code before the fix (an index made on the host for the rows' order, `modeling_elmo.py`, and the gate order of the
fused LSTM's weights as a list index, `kernels.py`, once per layer), and none after it.

Launch budgets are the counts measured when the budget was set: a change that adds launches fails here; one that saves
some should lower the budget.
"""

import contextlib
import json
import sys
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from elmo_fixtures import SENTENCES, TOY, TOY_MODEL, require, tiny_config, toy_batch
from fake_cuda import AVAILABLE as FAKE_CUDA_AVAILABLE
from fake_cuda import DEVICE, DeviceWatch, FakeCuda, autocast, fake_cuda, real
from spacy_fixtures import REPO

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoForBidirectionalLM, ElmoInferenceCache, ElmoModel
from hf_elmo.training import BidirectionalLMLoss, WordVocabulary

sys.path.insert(0, str(REPO / "benchmarks"))

# Operations (about one kernel launch each) per step, exactly as measured (a change that adds or removes launches
# changes them here, knowingly); see the module docstring.
FORWARD_LAUNCHES = {None: 62, torch.bfloat16: 63, torch.float16: 63}
PRETRAINING_LAUNCHES = {None: 377, torch.bfloat16: 425}

pytestmark = pytest.mark.filterwarnings(
    # Artifacts of the fake device: torch asks cuDNN (absent from a CPU build) to flatten the LSTM weights.
    "ignore:PyTorch was compiled without cuDNN/MIOpen support:UserWarning"
)
# The checks on fake CUDA tensors run where there is no GPU (CI); where there is one, their CUDA twins below check
# the device itself.
on_fake_cuda = pytest.mark.skipif(not FAKE_CUDA_AVAILABLE, reason="a real GPU is here: the CUDA tests check it")


@pytest.fixture(scope="module")
def tokenizer():
    return ElmoCharTokenizer()


# -- the check itself ------------------------------------------------------------------------------------------------


@on_fake_cuda
def test_the_fake_device_sees_every_kind_of_host_wait():
    """The check would catch each way of making the host wait for a GPU, and lets through what does not."""
    with DeviceWatch() as watch:
        x = fake_cuda(torch.arange(6.0))
        assert x.is_cuda and x.device == DEVICE and isinstance(x + 1, FakeCuda)
        cases = {
            "item": lambda: x.sum().item(),
            "bool": lambda: bool((x > 2).any()),
            "boolean mask": lambda: x[x > 2],
            "nonzero": lambda: torch.nonzero(x),
            "list index": lambda: x[[0, 2]],
            "host tensor from data": lambda: torch.tensor([1, 2], device=DEVICE),
            "blocking copy to the device": lambda: torch.ones(3).to(DEVICE),
            "copy to the host": lambda: x.cpu(),
            "tolist": lambda: x.tolist(),
            "unique": lambda: torch.unique(x),
            "repr": lambda: repr(x),
            "str": lambda: str(x),
            "f-string": lambda: f"{x}",
            "logging": lambda: log_to_string(x),
            "allclose": lambda: torch.allclose(x, x),
            "equal": lambda: torch.equal(x, x),
            "synchronize": lambda: torch.cuda.synchronize(),
        }
        for name, case in cases.items():
            with watch.recording():
                case()
            assert len(watch.syncs) == 1, (name, watch.syncs)
        with watch.recording():
            y = torch.ones(3).to(DEVICE, non_blocking=True)
            torch.zeros(2, device=DEVICE).add_(1)
            x[1:3].mul_(2)
        assert watch.syncs == [] and len(watch.transfers) == 1 and isinstance(y, FakeCuda)
        assert real(x).tolist() == [0.0, 2.0, 4.0, 3.0, 4.0, 5.0]  # in place, through a view
        with pytest.raises(RuntimeError, match="same device"):
            x[:3] + torch.ones(3)  # a GPU refuses a CPU operand too
        with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
            x.numpy()


def log_to_string(value: object) -> str:
    """`value` logged (formatted by a handler, as a configured logger does)."""
    import io
    import logging

    stream = io.StringIO()
    logger = logging.getLogger("fake_cuda_check")
    logger.propagate = False  # formatted once: by this handler alone
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        logger.warning("%s", value)
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


@on_fake_cuda
def test_the_fake_device_runs_the_gpu_only_branches_and_sees_host_reads_of_cupy_arrays():
    """Inside the watch `torch.cuda.is_available()` is True: `host_index` takes its pinned path (a transfer, no
    wait). Under the fake thinc, thinc's arrays are CuPy's: a host read of one is a wait, arithmetic on it is not."""
    from fake_cuda import DeviceArray, fake_thinc
    from thinc.api import NumpyOps

    from hf_elmo.runtime import host_index

    assert not torch.cuda.is_available()
    ops = NumpyOps()
    with DeviceWatch() as watch, fake_thinc(watch, ops):
        assert torch.cuda.is_available()
        with watch.recording():
            index = host_index([2, 0], DEVICE)
        assert isinstance(index, FakeCuda) and watch.syncs == [] and len(watch.transfers) == 1
        array = ops.alloc2f(2, 3) + ops.xp.arange(3, dtype="f")
        reads = {
            "int of max": lambda: int(array.max()),
            "float of sum": lambda: float(array.sum()),
            "python sum": lambda: float(sum((row**2).sum() for row in array)),
            "element": lambda: float(array[1, 2]),
            "bool": lambda: bool(array.any()),
            "item": lambda: array.max().item(),
            "tolist": lambda: array.tolist(),
            "repr": lambda: repr(array),
            "range": lambda: range(array.argmax()),
        }
        for name, read in reads.items():
            with watch.recording():
                read()
            assert len(watch.syncs) == 1, (name, [str(e) for e in watch.syncs])
        with watch.recording():
            total = ops.alloc1f(1)
            total[:] += (array**2).sum()
            concatenated = ops.xp.concatenate([array, array])
        assert watch.syncs == [] and isinstance(total, DeviceArray) and isinstance(concatenated, DeviceArray)
        with watch.recording():
            host = ops.to_numpy(total)
        assert len(watch.syncs) == 1 and type(host) is np.ndarray and host[0] == pytest.approx(10.0)


def test_the_fake_device_names_the_torch_it_runs_on_in_one_line(monkeypatch):
    import fake_cuda

    assert fake_cuda.torch_problem("2.13.0+cpu") is None
    problem = fake_cuda.torch_problem("2.15.1")
    assert problem == ("tests/fake_cuda.py runs on torch >=2.13,<2.14 (it uses torch's private APIs), not 2.15.1: "
                       "check it against this torch and widen TORCH_RANGE")
    monkeypatch.setattr(fake_cuda, "torch_problem", lambda: problem)
    with pytest.raises(pytest.fail.Exception, match=r"not 2\.15\.1"):
        DeviceWatch().__enter__()


# -- the biLM ------------------------------------------------------------------------------------------------------


@on_fake_cuda
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16], ids=["float32", "bf16", "fp16"])
def test_a_gpu_forward_of_a_batch_waits_for_nothing(tokenizer, dtype):
    """The forward of an `ElmoBatch` (rows in any order) on a GPU, float32 or under autocast: no host wait, including
    the first call under autocast (it fills the cache's weights in that dtype, as the H100's test did); the CPU's
    values within the dtype's rounding; at most the budget of launches once the cache is warm."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).eval()
    batch = tokenizer.batch(SENTENCES)
    assert list(batch.lengths) != sorted(batch.lengths, reverse=True)  # rows not longest first
    with torch.no_grad():
        reference = model(**batch).hidden_states
    with DeviceWatch() as watch, torch.no_grad():
        fake_cuda(model)
        cache, on_device = ElmoInferenceCache(), batch.to(DEVICE)
        model(**on_device, inference_cache=cache)  # the cache's first fill in float32
        for call in ("first", "warm"):
            with watch.recording(), autocast(dtype):
                output = model(**on_device, inference_cache=cache).hidden_states
            assert watch.syncs == [] and watch.transfers == [], (call, [str(e) for e in watch.syncs])
    assert watch.launch_count == FORWARD_LAUNCHES[dtype], (watch.launch_count, watch.launches)
    assert watch.launches["cudnn_rnn"] == 2 * len(model.bilstm.layers)  # one per direction and layer
    tolerance = 1e-5 if dtype is None else 0.05
    for layer, expected in zip(real(output), reference):
        assert (layer.float() - expected).abs().max() <= tolerance * max(1.0, float(expected.abs().max()))


@on_fake_cuda
def test_a_gpu_forward_of_a_model_with_a_word_embedding_waits_for_nothing(tokenizer):
    """ELMoForManyLangs' architecture (a word embedding beside the char CNN, no forget bias): its batch's word ids
    travel with the characters, and the forward waits for nothing."""
    import dataclasses

    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None, word_vocab_size=9, word_embedding_dim=3,
                                  forget_bias=0.0)).eval()
    batch = tokenizer.batch(SENTENCES)
    words = torch.randint(1, 9, batch.attention_mask.shape) * batch.attention_mask
    batch = dataclasses.replace(batch, word_input_ids=words)
    reference, output, watch = forward_on_fake_cuda(model, batch, inference_cache=ElmoInferenceCache())
    assert watch.syncs == [] and watch.transfers == [], [str(e) for e in watch.syncs]
    for layer, expected in zip(output, reference):
        assert (layer - expected).abs().max() <= 1e-5


def forward_on_fake_cuda(model, batch, **kwargs) -> tuple[tuple, list, DeviceWatch]:
    """The model's layers for `batch` on the CPU, then (the model moved) on fake CUDA under a recording watch: the
    CPU's layers, the device's (as CPU tensors) and the watch."""
    with torch.no_grad():
        reference = model(**batch).hidden_states
    with DeviceWatch() as watch, torch.no_grad():
        fake_cuda(model)
        on_device = batch.to(DEVICE)
        with watch.recording():
            output = model(**on_device, **kwargs).hidden_states
    return reference, list(real(output)), watch


@on_fake_cuda
def test_the_embedders_bf16_on_a_gpu_runs_under_autocast_and_reads_back_once_per_batch():
    """`ElmoEmbedder(bf16=True)` on a GPU: autocast in `kernel_plan.reduced_precision` (bf16 where the GPU has it), the
    batch's ids copied without waiting, one read-back per batch (the vectors to the host), bf16's drift. (A batch's
    work, `_embed_batch`, under `no_grad`: the fake device's tensors cannot be inference tensors, which
    `embed_batch`'s `inference_mode` makes; on a GPU it changes no copy or wait.)"""
    from hf_elmo import ElmoEmbedder

    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).eval()
    expected = ElmoEmbedder(model).embed_batch(SENTENCES)
    with DeviceWatch() as watch, torch.no_grad():
        fake_cuda(model)
        embedder = ElmoEmbedder(model, bf16=True)
        embedder._embed_batch(SENTENCES)  # the cache's copies in bf16
        with watch.recording():
            got = embedder._embed_batch(SENTENCES)
    assert [e.where.split(" ")[-1] for e in watch.syncs if e.project] == ["(_embed_batch)"], [str(e) for e in
                                                                                           watch.syncs]
    assert [e.where.split(":")[0] for e in watch.transfers] == ["hf_elmo/text.py"] * 2  # ElmoBatch.to: ids, mask
    drift = max(float(np.abs(a - b).max()) for a, b in zip(got, expected))
    assert 0 < drift <= 0.05 * max(float(np.abs(e).max()) for e in expected)  # bf16, not float32


@on_fake_cuda
def test_a_clipped_model_on_a_gpu_sorts_its_rows_once_per_call_without_waiting(tokenizer):
    """A clipped biLM takes the exact step loop on a GPU, which needs rows longest first: rows given in another order
    are sorted by an index copied once per call (and one that puts them back), for every layer, without a wait."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()  # clips: the step loop
    reference, output, watch = forward_on_fake_cuda(model, tokenizer.batch(SENTENCES))
    assert watch.syncs == [] and watch.launches["cudnn_rnn"] == 0
    assert [e.where.split(" ")[-1] for e in watch.transfers] == ["(host_index)"] * 2  # the order, and back
    for layer, expected in zip(output, reference):
        assert (layer - expected).abs().max() <= 1e-5


@on_fake_cuda
def test_the_transformers_path_reads_back_once_and_a_batch_never(tokenizer):
    """`model(**tokenizer(...))` checks its inputs' values: one read-back per call (the ids' range, the padding and
    the row lengths together); an `ElmoBatch` (or `lengths=`) brings the lengths from the host: none."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).eval()
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    lengths = encoded["attention_mask"].sum(dim=1).tolist()
    with DeviceWatch() as watch, torch.no_grad():
        fake_cuda(model)
        on_device = {key: fake_cuda(value) for key, value in encoded.items()}
        with watch.recording():
            model(**on_device)
        assert [e.where.split(" ")[-1] for e in watch.syncs] == ["(_validate)"]
        with watch.recording():
            model(**on_device, lengths=lengths)
        assert watch.syncs == []
        bad = {**on_device, "input_ids": on_device["input_ids"] * 0 + 999}
        with watch.recording(), pytest.raises(ValueError, match=r"character ids must lie in \[0, 262\), found"):
            model(**bad)
        assert len(watch.syncs) == 1


# -- pretraining -----------------------------------------------------------------------------------------------


@on_fake_cuda
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["float32", "bf16"])
def test_a_gpu_pretraining_step_waits_for_nothing(dtype):
    """A sampled-softmax step of a batch made by `encode_batch` (forward and backward under autocast, clipping,
    Adam): no host wait; one transfer, the candidates drawn on the host (non-blocking); at most the budget of
    launches; the loss the CPU computes."""
    vocabulary = WordVocabulary.load(require(TOY / "vocab.txt"))
    torch.manual_seed(0)
    config = ElmoConfig(**json.loads(TOY_MODEL), vocab_size=len(vocabulary), cell_clip=None, proj_clip=None,
                        dropout=0.0)
    objective = BidirectionalLMLoss(ElmoForBidirectionalLM(config), num_sampled=16).train()
    batch = toy_batch(vocabulary)
    torch.manual_seed(1)
    expected = float(objective(**batch).loss.detach())
    with DeviceWatch() as watch:
        fake_cuda(objective)
        optimizer = torch.optim.Adam(objective.parameters(), lr=1e-3)
        on_device = {key: value.to(DEVICE, non_blocking=True) if isinstance(value, torch.Tensor) else value
                     for key, value in batch.items()}
        for step in range(2):  # the first step makes the optimizer's state
            torch.manual_seed(1)
            with watch.recording():
                with autocast(dtype):
                    output = objective(**on_device)
                output.loss.backward()
                torch.nn.utils.clip_grad_norm_(objective.parameters(), 5.0)
                optimizer.step()
                optimizer.zero_grad()
            assert watch.syncs == [], [str(e) for e in watch.syncs]
            assert [e.where.split(" ")[-1] for e in watch.transfers] == ["(host_index)"]  # the candidates
            if step == 0:
                assert abs(float(real(output.loss)) - expected) <= (1e-5 if dtype is None else 0.05) * abs(expected)
    assert watch.launch_count == PRETRAINING_LAUNCHES[dtype], (watch.launch_count, watch.launches)


# -- the same on a GPU (`pytest -m cuda`; benchmarks/gpu_check.py runs them) -----------------------------------------


@contextlib.contextmanager
def synchronisations() -> Iterator[list[str]]:
    """torch's sync debug mode on a real GPU: the message of every warning raised inside, but the mode's own notice
    that it is a prototype (raised once per process, whatever the code does)."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode("default")
    found.extend(str(w.message) for w in caught if not str(w.message).startswith("Synchronization debug mode is a"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16], ids=["float32", "bf16", "fp16"])
def test_on_a_gpu_the_forward_of_a_batch_waits_for_nothing_and_warns_nothing(tokenizer, dtype):
    """As `test_a_gpu_forward_of_a_batch_waits_for_nothing`, on the device: torch's sync debug mode reports no
    synchronising call and nothing else warns (the fused LSTMs' weights are kept flat, in the autocast dtype)."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).eval().cuda()
    cache = ElmoInferenceCache()
    batch = tokenizer.batch(SENTENCES).to("cuda")
    with torch.no_grad():
        reference = model(**batch).hidden_states
        model(**batch, inference_cache=cache)  # the cache's first fill in float32
        with synchronisations() as found, torch.autocast("cuda", dtype=dtype or torch.float32,
                                                         enabled=dtype is not None):
            output = model(**batch, inference_cache=cache).hidden_states
    assert found == []
    tolerance = 1e-5 if dtype is None else 0.05
    for layer, expected in zip(output, reference):
        assert (layer.float() - expected).abs().max() <= tolerance * max(1.0, float(expected.abs().max()))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["float32", "bf16"])
def test_on_a_gpu_a_pretraining_step_waits_for_nothing(dtype):
    """As `test_a_gpu_pretraining_step_waits_for_nothing`, on the device, under torch's sync debug mode."""
    vocabulary = WordVocabulary.load(require(TOY / "vocab.txt"))
    torch.manual_seed(0)
    config = ElmoConfig(**json.loads(TOY_MODEL), vocab_size=len(vocabulary), cell_clip=None, proj_clip=None)
    objective = BidirectionalLMLoss(ElmoForBidirectionalLM(config), num_sampled=16).cuda().train()
    optimizer = torch.optim.Adam(objective.parameters(), lr=1e-3)
    batch = {key: value.cuda() if isinstance(value, torch.Tensor) else value
             for key, value in toy_batch(vocabulary).items()}
    sums = []
    for step in range(3):  # the first step sets up the optimizer state and cuDNN: not watched
        with synchronisations() if step else contextlib.nullcontext([]) as found:
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                output = objective(**batch)
            output.loss.backward()
            torch.nn.utils.clip_grad_norm_(objective.parameters(), 5.0)
            optimizer.step()
            optimizer.zero_grad()
        assert found == []
        sums.append(output.forward_loss_sum)
    assert all(torch.isfinite(torch.stack(sums)))


# -- spaCy ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ner_pipeline():
    """The shipped NER config at toy widths (an unclipped random biLM, as the default model), initialized on a few
    CoNLL-style sentences; its torch modules and thinc's ops, to put on the fake device."""
    return toy_ner_pipeline(freeze=True)


def toy_ner_pipeline(freeze: bool) -> tuple:
    import spacy
    from bench_spacy_train import shrink_to_toy
    from spacy.training import Example

    from spacy_elmo.cli import make_config

    config = make_config("ner")
    shrink_to_toy(config, "ner")
    config["components"]["elmo"]["freeze"] = freeze
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    texts = ["Peter Blackburn visited Berlin on Monday .", "EU rejects German call to boycott British lamb .", "Hi",
             "The European Commission said on Thursday it disagreed with German advice to consumers ."]
    entities = {"Peter": "B-PER", "Blackburn": "L-PER", "Berlin": "U-LOC", "EU": "U-ORG", "German": "U-MISC"}
    examples = [Example.from_dict(doc, {"entities": [entities.get(token.text, "O") for token in doc]})
                for doc in map(nlp.make_doc, texts)]
    nlp.initialize(lambda: examples)
    modules = [shim._model for _, pipe in nlp.pipeline for node in pipe.model.walk() for shim in node.shims]
    return nlp, texts, examples, modules


SPACY_LAUNCHES = {"pipe": 55, "update reading": 83, "update cached": 40}



@on_fake_cuda
def test_the_spacy_component_and_its_listeners_on_a_gpu_wait_once_per_batch_and_update_without_waiting(
        ner_pipeline):
    """`nlp.pipe` on a GPU: the biLM's layers come to the host once per batch (to be stored on the Docs), the batch's
    ids go to the device without waiting; `nlp.update` of the shipped NER config (the frozen biLM reading the Docs,
    then served by its cache; the listeners' mixes and the task biLSTM, forward and backward): the project's code
    waits for the device nowhere. Launches of the torch parts within their budgets. Not seen: thinc's and spaCy's own
    CuPy kernels and copies (thinc's `with_padded` reads the lengths back twice per call, spaCy's parser its scores
    at every transition), which take NumPy's place here."""
    from fake_cuda import fake_thinc
    from thinc.api import get_current_ops

    from spacy_elmo.layers import elmo_shim

    nlp, texts, examples, modules = ner_pipeline
    optimizer = nlp.create_optimizer()
    with DeviceWatch() as watch, fake_thinc(watch, get_current_ops()):
        for module in modules:
            fake_cuda(module)
        elmo_shim(nlp.get_pipe("elmo").model).inference_cache.clear()
        list(nlp.pipe(texts))  # fills the inference cache
        with watch.recording():
            docs = list(nlp.pipe(texts))
        assert [(e.where.split(":")[0], e.where.split(" ")[-1]) for e in watch.syncs if e.project] == [
            ("spacy_elmo/pipeline_component.py", "(_host_arrays)")]
        assert [e.where.split(":")[0] for e in watch.transfers] == ["hf_elmo/text.py"] * 2  # ElmoBatch.to: ids, mask
        assert watch.launch_count <= SPACY_LAUNCHES["pipe"], watch.launches
        assert all(type(doc._.elmo_layers) is np.ndarray and doc._.elmo_layers.shape[1] == len(doc) for doc in docs)
        # `mixed_precision` predictions: autocast in `kernel_plan.reduced_precision` (bf16 on this GPU), no more waits.
        shim = elmo_shim(nlp.get_pipe("elmo").model)
        shim._mixed_precision = True
        shim._decide_precision()  # as when the biLM is set or moved
        try:
            list(nlp.pipe(texts))  # the cache's copies in bf16
            with watch.recording():
                mixed = list(nlp.pipe(texts))
        finally:
            shim._mixed_precision = False
            shim._decide_precision()
        assert [e.where.split(" ")[-1] for e in watch.syncs if e.project] == ["(_host_arrays)"]
        assert [e.where.split(":")[0] for e in watch.transfers] == ["hf_elmo/text.py"] * 2
        drift = max(float(np.abs(a._.elmo_layers - b._.elmo_layers).max()) for a, b in zip(mixed, docs))
        assert 0 < drift <= 0.05 * max(float(np.abs(d._.elmo_layers).max()) for d in docs)  # bf16, not float32
        for kind in ("update reading", "update cached"):
            with watch.recording():
                losses = nlp.update(examples, sgd=optimizer)
            assert [e for e in watch.syncs if e.project] == [], (kind, [str(e) for e in watch.syncs])
            assert watch.launch_count <= SPACY_LAUNCHES[kind], (kind, watch.launches)
            assert np.isfinite(losses["ner"]) and losses["ner"] > 0


@on_fake_cuda
def test_fine_tuning_the_biLM_in_spacy_on_a_gpu_reads_the_loss_once_per_update():
    """`nlp.update` with the biLM fine-tuned (`freeze = false`): the listeners' gradients summed on the device and
    backpropagated into the biLM; the project's code reads back one number per update (the component's loss), where
    each listener's squared gradient was read before."""
    from fake_cuda import fake_thinc
    from thinc.api import get_current_ops

    nlp, _, examples, modules = toy_ner_pipeline(freeze=False)
    optimizer = nlp.create_optimizer()
    with DeviceWatch() as watch, fake_thinc(watch, get_current_ops()):
        for module in modules:
            fake_cuda(module)
        for _ in range(2):
            with watch.recording():
                losses = nlp.update(examples, sgd=optimizer)
            assert [(e.op, e.where.split(" ")[-1]) for e in watch.syncs if e.project] == [
                ("ops.to_numpy (device->host copy)", "(backprop)")], [str(e) for e in watch.syncs]
            assert losses["elmo"] > 0 and np.isfinite(losses["ner"])


def test_on_cupy_the_pipelines_ops_scatter_with_add_at_not_the_deprecated_cupyx_call(monkeypatch):
    """thinc's `CupyOps.scatter_add` calls `cupyx.scatter_add` (deprecated since CuPy 12: a warning at every call);
    the shipped configs' `before_creation` swaps in `AddAtCupyOps`, whose scatter is `add.at` (repeated indices
    summed), on the same device, and leaves any other ops alone."""
    import spacy
    from spacy.language import Language
    from thinc.api import CupyOps, NumpyOps, get_current_ops, set_current_ops

    from spacy_elmo.cli import make_config
    from spacy_elmo.cupy_ops import AddAtCupyOps

    deprecated = []
    monkeypatch.setattr(CupyOps, "_xp2", type("cupyx", (), {"scatter_add": lambda *a: deprecated.append(a)}))
    table, indices, values = np.zeros((4, 2), "f"), np.array([0, 2, 0, 3]), np.arange(1, 5, dtype="f")[:, None]
    for ops_class in (CupyOps, AddAtCupyOps):
        ops = ops_class()
        monkeypatch.setattr(ops, "xp", np)  # NumPy computes what CuPy would
        ops.scatter_add(table, indices, values.repeat(2, axis=1))
    assert len(deprecated) == 1  # thinc's, not ours
    np.testing.assert_array_equal(table[:, 0], [4, 0, 2, 4])

    for task in ("ner", "textcat"):
        assert make_config(task)["nlp"]["before_creation"] == {"@callbacks": "spacy-elmo.CupyAddAt.v1"}
    use_add_at = spacy.util.registry.callbacks.get("spacy-elmo.CupyAddAt.v1")()
    previous = get_current_ops()
    try:
        set_current_ops(CupyOps(device_id=1))
        assert use_add_at(Language) is Language
        assert type(get_current_ops()) is AddAtCupyOps and get_current_ops().device_id == 1
        set_current_ops(NumpyOps())
        use_add_at(Language)
        assert type(get_current_ops()) is NumpyOps
    finally:
        set_current_ops(previous)
