"""`hf_elmo.kernels`: how the biLM runs (oneDNN and MKL matmuls, bf16 packs, the char CNN over distinct words in
length groups, the step loop, the fused `nn.LSTM` with its cached flat weights, chunking) never changes what it
computes beyond float32 rounding, and `ElmoInferenceCache` follows the weights and is shared safely by threads."""

import copy
import pickle
import re
import sys
import warnings
from dataclasses import asdict

import pytest
import torch
from elmo_fixtures import SENTENCES, run, tiny_config

from hf_elmo import ElmoCharTokenizer, ElmoConfig, ElmoInferenceCache, ElmoKernelOptions, ElmoModel
from hf_elmo.kernel_plan import KernelPlan, recurrence_for, uses_onednn
from hf_elmo.kernels import ElmoKernels
from hf_elmo.weight_forms import cast, fused_lstms


def test_chunked_computation_equals_unchunked(model, tokenizer):
    """Long sentences cross the time windows of the input projections and the char-CNN chunks unchanged."""
    model = copy.deepcopy(model)  # the fixture is shared: its options stay the defaults
    long_sentence = [f"w{i % 97}" for i in range(300)]
    sentences = [long_sentence, SENTENCES[0]]
    _, chunked = run(model, tokenizer, sentences)
    model.config.kernel_options = dict(lstm_time_chunk=10_000, lstm_input_block=1 << 40, char_cnn_chunk=10_000)
    _, whole = run(model, tokenizer, sentences)
    model.config.kernel_options = dict(lstm_time_chunk=7, char_cnn_chunk=3)
    _, small = run(model, tokenizer, sentences)
    # Windows cut by the bytes their input projections take: one step each here (two rows, then one).
    width = model.bilstm.layers[0].weights().input_weight.shape[1]
    model.config.kernel_options = dict(lstm_input_block=4 * 2 * width)
    with torch.no_grad():
        assert KernelPlan.make(model.config.kernels(), torch.zeros(1), []).window_steps(2, width) == 1
    _, stepwise = run(model, tokenizer, sentences)
    for a, b, c, d in zip(chunked.hidden_states, whole.hidden_states, small.hidden_states, stepwise.hidden_states):
        assert (a - b).abs().max() <= 1e-5 and (a - c).abs().max() <= 1e-5 and (a - d).abs().max() <= 1e-5
    assert chunked.hidden_states[-1][0, 301].abs().sum() > 0  # the last word (</S>) was computed


def test_float32_matmuls_choose_mkl_on_intel_cpus_and_onednn_elsewhere(monkeypatch):
    """`onednn="auto"` (the default): MKL runs its own fastest code only on Intel CPUs (measured faster than oneDNN
    there), its AVX2 path elsewhere (oneDNN 2-3x faster on AMD EPYC); True / False force either."""
    from hf_elmo import runtime

    for vendor, expected in (("GenuineIntel", False), ("AuthenticAMD", True), ("", True)):
        monkeypatch.setattr(runtime, "_cpuinfo_field", lambda name, v=vendor: v if name == "vendor_id" else "")
        runtime.intel_cpu.cache_clear()
        assert uses_onednn(ElmoKernelOptions()) is expected
        assert uses_onednn(ElmoKernelOptions(onednn=True)) and not uses_onednn(ElmoKernelOptions(onednn=False))
    runtime.intel_cpu.cache_clear()


def test_kernel_options_are_validated():
    for field, value, message in [("fused_lstm", "cudnn", "'auto', 'always' or 'never'"),
                                  ("char_cnn_chunk", 0, "char_cnn_chunk must be an integer >= 1"),
                                  ("lstm_time_chunk", 2.5, "lstm_time_chunk must be an integer >= 1"),
                                  ("lstm_input_block", 0, "lstm_input_block must be an integer >= 1"),
                                  ("single_row_bmm_max_weight", -1, "single_row_bmm_max_weight must be"),
                                  ("onednn", "yes", "onednn must be True, False or 'auto'")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            ElmoKernelOptions(**{field: value})
    with pytest.raises(ValueError, match="token_cache_size must be an integer >= 0"):
        ElmoInferenceCache(token_cache_size=-1)
    # As a config field: checked when the config is made, named.
    with pytest.raises(ValueError, match=re.escape("ElmoConfig.kernel_options: lstm_time_chunk must be an integer")):
        tiny_config(kernel_options={"lstm_time_chunk": 0})
    with pytest.raises(ValueError, match="ElmoConfig.kernel_options: .*unexpected keyword argument 'onednnn'"):
        tiny_config(kernel_options={"onednnn": True})
    with pytest.raises(ValueError, match="ElmoConfig.implementation must be one of kernels, reference, got 'fast'"):
        tiny_config(implementation="fast")
    config = tiny_config(kernel_options=ElmoKernelOptions(fused_lstm="always"))
    assert config.kernels() == ElmoKernelOptions(fused_lstm="always")
    assert ElmoConfig.from_dict(config.to_dict()).kernels() == config.kernels()  # saved with the model
    assert tiny_config().to_dict()["kernel_options"] is None  # unset: the defaults, whatever they become


def test_token_cache_gives_the_computed_vectors_and_follows_the_weights(tokenizer):
    torch.manual_seed(0)
    cached, uncached = ElmoModel(tiny_config()).eval(), ElmoModel(tiny_config()).eval()
    uncached.load_state_dict(cached.state_dict())
    cache = ElmoInferenceCache()
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    distinct = len({w for s in SENTENCES for w in s}) + 2  # + <S>, </S>

    def both():
        return cached(**encoded, inference_cache=cache).last_hidden_state, uncached(**encoded).last_hidden_state

    with torch.no_grad():
        expected = uncached(**encoded).hidden_states
        for _ in range(2):  # filled by the first call, read by the second
            for a, b in zip(cached(**encoded, inference_cache=cache).hidden_states, expected):
                assert (a - b).abs().max() <= 1e-6
    assert len(cache) == distinct
    # Smaller than one batch's vocabulary: still correct, and bounded.
    small = ElmoInferenceCache(token_cache_size=5)
    with torch.no_grad():
        assert (cached(**encoded, inference_cache=small).last_hidden_state - expected[-1]).abs().max() <= 1e-6
    assert len(small) == 5
    assert len(ElmoInferenceCache(token_cache_size=0)) == 0
    # A weight changed in place empties the cache.
    with torch.no_grad():
        for model in (cached, uncached):
            model.char_cnn.highway.layers[0].bias.add_(0.5)
        torch.testing.assert_close(*both())
    # So does a weight replaced through `.data`, as some optimizers do.
    with torch.no_grad():
        for model in (cached, uncached):
            model.char_cnn.projection.weight.data = model.char_cnn.projection.weight.data * 1.5
        torch.testing.assert_close(*both())
    # Vectors cached under autocast (bfloat16) are not served to a float32 call, nor the other way round.
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = cached(**encoded, inference_cache=cache).last_hidden_state
            assert low.dtype == torch.bfloat16
        full, reference = both()
        assert full.dtype == torch.float32
        torch.testing.assert_close(full, reference)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            torch.testing.assert_close(cached(**encoded, inference_cache=cache).last_hidden_state, low)
    assert len(pickle.loads(pickle.dumps(cache))) == 0 and len(copy.deepcopy(cache)) == 0  # copies are empty
    # Training never reads or fills it.
    cache.clear()
    cached(**encoded, inference_cache=cache).last_hidden_state.sum().backward()
    assert len(cache) == 0 and cached.char_cnn.convs[0].weight.grad is not None


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_the_kernels_char_cnn_is_the_blocks_convolution_max_pool_and_activation(activation):
    """The kernels' char CNN (distinct words grouped by length, each cut after the positions it uses) against the
    block's own `forward` (every character slot of every position): the same values and gradients, the bias's
    included."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(activation=activation)).train()
    cnn = model.char_cnn
    for conv in cnn.convs:
        torch.nn.init.normal_(conv.bias)  # bilm-tf initialises it to zero: make it matter
    char_ids = ElmoCharTokenizer()([["a", "bank", "x" * 60, "Übung"]], is_split_into_words=True,
                                   add_special_tokens=False, return_tensors="pt")["input_ids"]
    mask = torch.ones(char_ids.shape[:2], dtype=torch.bool)
    reference = cnn(char_ids, mask)
    kernels = ElmoKernels(ElmoKernelOptions(), char_ids, [4], None, list(cnn.parameters()))
    output = kernels.token_representations(cnn.weights(), char_ids, mask)
    torch.testing.assert_close(output, reference, rtol=0, atol=1e-6)
    weights = list(cnn.parameters())
    for got, expected in zip(torch.autograd.grad(output.square().sum(), weights),
                             torch.autograd.grad(reference.square().sum(), weights), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("architecture", ["clipped", "unclipped", "words"])
def test_the_kernels_compute_the_blocks_reference_forward(tokenizer, architecture):
    """`implementation="kernels"` (the default) and `"reference"` (each block's own `forward`) give the same layers,
    final states and gradients: rows out of order, an empty row, a carried state, clipped or not, and with
    ELMoForManyLangs' word embedding (no forget bias)."""
    torch.manual_seed(0)
    settings = {"clipped": {}, "unclipped": {"cell_clip": None, "proj_clip": None},
                "words": {"word_vocab_size": 9, "word_embedding_dim": 3, "forget_bias": 0.0}}[architecture]
    model = ElmoModel(tiny_config(**settings)).eval()  # no dropout; gradients still flow
    input_ids, attention_mask = _with_empty_row(
        tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt"))
    words = torch.randint(1, 9, attention_mask.shape) * attention_mask if architecture == "words" else None
    h0, c0 = model.bilstm.zero_state(len(input_ids), attention_mask.float())
    initial_state = (torch.randn_like(h0), torch.randn_like(c0))
    results = {}
    for implementation in ("kernels", "reference"):
        model.config.implementation = implementation
        model.zero_grad()
        output = model(input_ids, attention_mask, initial_state=initial_state, return_state=True,
                       word_input_ids=words)
        sum(layer.square().sum() for layer in output.hidden_states).backward()
        results[implementation] = output, [p.grad.clone() for p in model.parameters()]
    (kernels, kernels_grads), (reference, reference_grads) = results["kernels"], results["reference"]
    for a, b in zip((*kernels.hidden_states, *kernels.final_state), (*reference.hidden_states, *reference.final_state),
                    strict=True):
        assert (a - b).abs().max() <= 1e-5
    for a, b in zip(kernels_grads, reference_grads, strict=True):
        assert (a - b).abs().max() <= 1e-5 * max(1.0, b.abs().max())
    assert reference.hidden_states[-1][-1].abs().max() == 0  # the empty row
    assert kernels.hidden_states[-1][:-1].abs().sum() > 0


def test_unique_rows_gives_each_distinct_word_once_and_where_each_row_went():
    from hf_elmo.kernels import unique_rows

    ids = torch.tensor([[3, 1, 261], [2, 7, 261], [3, 1, 261], [3, 1, 262], [2, 7, 261], [-1, 300, 0]])
    rows, inverse = unique_rows(ids)
    assert torch.equal(rows[inverse], ids)
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, torch.unique(ids, dim=0).tolist()))
    assert inverse.dtype == torch.int64 and inverse.shape == (6,)
    rows, inverse = unique_rows(ids[:0])
    assert rows.shape == (0, 3) and inverse.shape == (0,)


@pytest.mark.parametrize("chunk", [1024, 4])
def test_char_cnn_reads_words_in_groups_of_similar_length_without_changing_values_or_gradients(chunk):
    """Positions after a word's last character are all padding: the max-pool reads one of them, not all 50; and
    words run in groups of similar length, so a short word is not padded to the longest word of the batch."""
    from hf_elmo.kernels import _used_positions

    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).train()
    cnn, weights = model.char_cnn, model.char_cnn.weights()
    words = ["x" * 60, "a", "bank", "of", "rivers", "bank", "y" * 9, "b", "the", "z" * 30]  # "x" * 60 fills all 50
    char_ids = ElmoCharTokenizer()([words], is_split_into_words=True, add_special_tokens=False,
                                   return_tensors="pt")["input_ids"][0]
    used = [min(50, len(word) + 2 + weights.widest_filter) for word in words]  # the word, its markers, one window
    assert _used_positions(char_ids, weights.widest_filter, weights.padding_char_id).tolist() == used
    kernels = ElmoKernels(ElmoKernelOptions(char_cnn_chunk=chunk), char_ids, [len(char_ids)], None,
                          list(model.parameters()))
    calls = []
    convolve = kernels._convolve
    kernels._convolve = lambda weights, ids: calls.append(ids) or convolve(weights, ids)
    trimmed = kernels.embed_words(weights, char_ids)
    # Each call reads up to its longest word; with chunks of 4, groups close at every longer word (chunk // 32 = 0).
    assert all(call.shape[1] == int(_used_positions(call, weights.widest_filter, weights.padding_char_id).max())
               for call in calls)
    if chunk == 4:
        assert [call.shape for call in calls] == [(2, used[1]), (1, used[3]), (1, used[8]),  # a, b | of | the
                                                  (2, used[2]), (1, used[4]), (1, used[6]),  # bank x2 | rivers | y*9
                                                  (1, used[9]), (1, 50)]  # z*30 | x*60
    else:
        assert [call.shape for call in calls] == [(len(words), 50)]
    (trimmed_grad,) = torch.autograd.grad(trimmed.square().sum(), cnn.char_embedding.weight)
    full = cnn(char_ids[None], torch.ones(1, len(words), dtype=torch.bool))[0]  # the block's own forward
    (full_grad,) = torch.autograd.grad(full.square().sum(), cnn.char_embedding.weight)
    assert (trimmed - full).abs().max() <= 1e-6
    assert (trimmed_grad - full_grad).abs().max() <= 1e-6


def test_onednn_path_matches_plain_float32_and_repacks_after_weight_changes(tokenizer):
    import platform

    from hf_elmo.runtime import onednn_available

    if platform.machine() in ("x86_64", "AMD64"):
        assert onednn_available()  # the CPU build of torch has it
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    cache = ElmoInferenceCache(token_cache_size=0)
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")

    def both_paths():
        with torch.no_grad():
            model.config.kernel_options = dict(onednn=True)
            fast = model(**encoded).hidden_states
            packed_once = model(**encoded, inference_cache=cache).hidden_states
            model.config.kernel_options = dict(onednn=False)
            plain = model(**encoded).hidden_states
        for a, b, c in zip(fast, plain, packed_once):
            assert (a - b).abs().max() <= 1e-5 and torch.equal(a, c)
        return fast

    before = both_paths()
    layer, highway = model.bilstm.layers[0], model.char_cnn.highway.layers[0]
    packed = [w for lstm in model.bilstm.layers for w in (lstm.recurrent_weight, lstm.projection_weight)]
    assert {key for key, _ in cache._forms} == ({id(w) for w in packed} if onednn_available() else set())
    with torch.no_grad():
        layer.recurrent_weight.mul_(1.5)  # in place: the packed copy must follow
        highway.weight.mul_(1.5)
    after = both_paths()
    assert (after[0] - before[0]).abs().max() > 1e-3 and (after[1] - before[1]).abs().max() > 1e-3
    with torch.no_grad():
        layer.projection_weight.data = layer.projection_weight.data * 0.5  # replaced, as some optimizers do
    both_paths()
    cache.clear()  # after changes torch cannot see (NumPy views): repacked on the next call
    assert cache._forms == {}
    both_paths()


@pytest.mark.parametrize("cpu", ["avx2", "avx512", "avx512_bf16", "amx"])
def test_bf16_autocast_packs_the_weights_where_onednn_can_and_stays_close_to_float32_on_every_cpu(
    tokenizer, pretend_cpu, cpu
):
    """Inference under `torch.autocast("cpu", dtype=torch.bfloat16)` (the bf16 mode, or a user's own autocast): where
    oneDNN packs bf16 weights (`runtime.bf16_weight_packing`), the LSTM input, recurrent and projection weights and
    the char CNN's highway and projection weights are packed once in bf16 (autocast would cast them again at every
    call and step), whatever the float32 matmul choice; where it cannot (AVX2), autocast casts them, and nothing
    fails. The vectors stay within bf16 rounding of float32 either way. Without native bf16 the model warns once
    that bf16 is emulated, naming the line that called it."""
    from hf_elmo.runtime import HostWarning, onednn_available

    pretended = pretend_cpu(cpu)
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    cache = ElmoInferenceCache(token_cache_size=0)
    with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        float32 = model(**encoded, inference_cache=cache).hidden_states
        assert {dtype for _, dtype in cache._forms} <= {torch.float32} and not caught
        with torch.autocast("cpu", dtype=torch.bfloat16):
            packed = model(**encoded, inference_cache=cache).hidden_states
            line = sys._getframe().f_lineno - 1
            again = model(**encoded, inference_cache=cache).hidden_states
            packed_by_the_cache = len(pretended.bf16_packs)
            model.config.kernel_options = dict(onednn=not uses_onednn(model.config.kernels()))
            other_float32_choice = model(**encoded).hidden_states
    emulated = [(w.filename, w.lineno) for w in caught if w.category is HostWarning and "emulated" in str(w.message)]
    assert emulated[:1] == ([] if cpu in ("avx512_bf16", "amx") else [(__file__, line)])
    bf16_entries = [entry for (_, dtype), entry in cache._forms.items() if dtype == torch.bfloat16]
    # 3 weights of 2 LSTM layers, the 2 highway layers and the projection, packed once (each LSTM weight per direction).
    packs = pretended.cpu.bf16_packing and onednn_available()
    assert len(bf16_entries) == (9 if packs else 0) and packed_by_the_cache == (15 if packs else 0)
    assert all(matrix.dtype == torch.bfloat16 for entry in bf16_entries for matrix in entry[2])
    mask = encoded["attention_mask"].bool()
    for a, b, c, reference in zip(packed, again, other_float32_choice, float32):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b) and torch.equal(a, c)
        a, reference = a.float()[mask], reference[mask]
        assert (a - reference).abs().max() <= 0.02 * reference.abs().max()
        assert torch.cosine_similarity(a, reference, dim=-1).min() > 0.999


def test_single_row_steps_give_the_same_vectors_through_either_matmul(tokenizer):
    """A one-sentence batch takes the batched-MKL step for small weights; forcing oneDNN changes nothing."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    _, small_weights = run(model, tokenizer, SENTENCES[:1])
    model.config.kernel_options = dict(onednn=True, single_row_bmm_max_weight=0)
    _, forced_onednn = run(model, tokenizer, SENTENCES[:1])
    for a, b in zip(small_weights.hidden_states, forced_onednn.hidden_states):
        assert (a - b).abs().max() <= 1e-6
    assert small_weights.hidden_states[-1].abs().sum() > 0
    # With a cache such a call reads the step weights transposed to contiguous (2, K, N) copies, which the cache
    # keeps and remakes after changes; a batch of several rows packs them for oneDNN.
    from hf_elmo.runtime import onednn_available

    model.config.kernel_options = dict(onednn=True)
    cache = ElmoInferenceCache()
    one = tokenizer(SENTENCES[:1], is_split_into_words=True, return_tensors="pt")
    step_weights = [w for lstm in model.bilstm.layers for w in (lstm.recurrent_weight, lstm.projection_weight)]
    with torch.no_grad():
        without_cache = model(**one).hidden_states
        with_cache = model(**one, inference_cache=cache).hidden_states
        transposed = {key[0]: entry[2] for key, entry in cache._forms.items() if key[1] == "transposed"}
        assert transposed.keys() == {id(w) for w in step_weights}
        assert all(torch.equal(transposed[id(w)], w.mT) and transposed[id(w)].is_contiguous() for w in step_weights)
        assert len(cache._forms) == 4
        model.bilstm.layers[0].recurrent_weight.mul_(1.5)  # in place: the copy must follow
        changed = model(**one).hidden_states
        changed_with_cache = model(**one, inference_cache=cache).hidden_states
        two = tokenizer(SENTENCES[:2], is_split_into_words=True, padding=True, return_tensors="pt")
        model(**two, inference_cache=cache)
    for a, b in [*zip(without_cache, with_cache), *zip(changed, changed_with_cache)]:
        assert (a - b).abs().max() <= 1e-6
    assert (changed[1] - without_cache[1]).abs().max() > 1e-3
    assert len(cache._forms) == 4 + (4 if onednn_available() else 0)


def _with_empty_row(encoded):
    """The batch plus one all-padding row."""
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    return torch.cat([ids, torch.zeros_like(ids[:1])]), torch.cat([mask, torch.zeros_like(mask[:1])])


def test_fused_lstm_computes_the_step_loop_for_unclipped_models(tokenizer):
    """`nn.LSTM(proj_size)` (cuDNN on a GPU) is the same function as the step loop when nothing is clipped:
    outputs, carried state, empty rows and gradients."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).eval()  # no dropout; gradients still flow
    input_ids, attention_mask = _with_empty_row(
        tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    )
    h0, c0 = model.bilstm.zero_state(len(input_ids), attention_mask.float())
    initial_state = (torch.randn_like(h0), torch.randn_like(c0))
    results = {}
    for mode in ("never", "always"):
        model.config.kernel_options = dict(fused_lstm=mode)
        model.zero_grad()
        output = model(input_ids, attention_mask, initial_state=initial_state, return_state=True)
        output.last_hidden_state.square().sum().backward()
        results[mode] = output, model.bilstm.layers[0].recurrent_weight.grad.clone()
    (loop, loop_grad), (fused, fused_grad) = results["never"], results["always"]
    for a, b in zip((*loop.hidden_states, *loop.final_state), (*fused.hidden_states, *fused.final_state)):
        assert (a - b).abs().max() <= 1e-5
    assert (loop_grad - fused_grad).abs().max() <= 1e-5 * loop_grad.abs().max()
    assert fused.hidden_states[-1][-1].abs().max() == 0  # the empty row
    torch.testing.assert_close(fused.final_state[0][:, :, -1], initial_state[0][:, :, -1])


def layers_and_gradient(model, encoded, options, weight) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The model's layers for `encoded` under kernel `options`, and the gradient of `weight(model)` for the sum of
    their squares."""
    model.config.kernel_options = asdict(options)
    model.zero_grad()
    layers = model(**encoded).hidden_states
    sum(layer.square().sum() for layer in layers).backward()
    return layers, weight(model).grad.clone()


def test_the_fused_lstm_reads_unsorted_padded_rows_as_the_step_loop(tokenizer):
    """Without final states the fused recurrence runs on the padded rows as they come (no sorting, no packing):
    the step loop's outputs and gradients, an empty row and rows out of order included."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).eval()
    input_ids, attention_mask = _with_empty_row(
        tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt"))
    encoded = {"input_ids": input_ids, "attention_mask": attention_mask}
    (loop, loop_grad), (fused, fused_grad) = (
        layers_and_gradient(model, encoded, ElmoKernelOptions(fused_lstm=mode),
                            lambda m: m.bilstm.layers[1].recurrent_weight) for mode in ("never", "always"))
    for a, b in zip(loop, fused):
        assert (a - b).abs().max() <= 1e-5
    assert fused[-1][-1].abs().max() == 0  # the empty row
    assert (loop_grad - fused_grad).abs().max() <= 1e-5 * loop_grad.abs().max()


def test_fused_lstm_mode_defaults_to_exactness():
    """Whether cuDNN's LSTM computes a layer exactly is its weights' property (no clipping)."""
    torch.manual_seed(0)
    clipped = ElmoModel(tiny_config()).bilstm.layers[0].weights()
    unclipped = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).bilstm.layers[0].weights()
    assert not clipped.fused_exact and unclipped.fused_exact
    cpu, cuda, options = torch.device("cpu"), torch.device("cuda"), ElmoKernelOptions()
    assert recurrence_for(options, cpu, unclipped) == recurrence_for(options, cpu, clipped) == "steps"
    assert recurrence_for(options, torch.device("meta"), unclipped) == "steps"  # auto: CUDA only
    assert recurrence_for(options, cuda, unclipped) == "fused" and recurrence_for(options, cuda, clipped) == "steps"
    assert recurrence_for(ElmoKernelOptions(fused_lstm="always"), cpu, clipped) == "fused"
    assert recurrence_for(ElmoKernelOptions(fused_lstm="never"), cuda, unclipped) == "steps"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cudnn_lstm_on_gpu_matches_the_cpu_step_loop(monkeypatch, tokenizer):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    model = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).eval()
    _, cpu = run(model, tokenizer, SENTENCES)
    model.cuda()
    assert recurrence_for(model.config.kernels(), torch.device("cuda"), model.bilstm.layers[0].weights()) == "fused"
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt").to("cuda")
    with torch.no_grad():
        gpu = model(**encoded)
    for a, b in zip(cpu.hidden_states, gpu.hidden_states):
        assert (a - b.cpu()).abs().max() <= 1e-5


def test_concurrent_calls_from_threads_give_the_single_thread_vectors(tokenizer):
    """The token cache is shared by every caller: threads evicting each other's words must not break it, nor the
    weight forms it keeps (oneDNN packs for batches, transposed copies for one-sentence calls)."""
    from concurrent.futures import ThreadPoolExecutor

    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()
    cache = ElmoInferenceCache(token_cache_size=8)  # far fewer words than the calls use: constant eviction
    vocabulary = [f"w{i}" for i in range(40)]
    batches = [[[vocabulary[(7 * call + 3 * row + k) % 40] for k in range(3 + row)] for row in range(3)]
               for call in range(60)]
    batches = [rows[:1] if call % 3 == 0 else rows for call, rows in enumerate(batches)]  # one-row calls too
    encoded = [tokenizer(batch, is_split_into_words=True, padding=True, return_tensors="pt") for batch in batches]

    def top_layer(inputs, inference_cache=cache):
        with torch.no_grad():
            return model(**inputs, inference_cache=inference_cache).hidden_states[-1]

    expected = [top_layer(inputs, None) for inputs in encoded]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(top_layer, encoded * 3))
    for output, reference in zip(got, expected * 3):
        assert (output - reference).abs().max() <= 1e-6


def test_the_char_cnn_on_every_position_gives_the_distinct_words_values_and_gradients(tokenizer):
    """`distinct_words=False` (a GPU's default: no host waits for the distinct words and their lengths) computes
    every position with all its character slots: the same vectors and gradients as each distinct word once."""
    torch.manual_seed(0)
    model = ElmoModel(tiny_config()).eval()  # no dropout; gradients still flow
    encoded = tokenizer(SENTENCES, is_split_into_words=True, padding=True, return_tensors="pt")
    options = {distinct: ElmoKernelOptions(distinct_words=distinct) for distinct in (True, False)}
    for distinct, chosen in options.items():
        assert ElmoKernels(chosen, encoded["input_ids"], [1] * 4, None, []).plan.every_position is not distinct
    (layers, grad), (every_layers, every_grad) = (
        layers_and_gradient(model, encoded, options[distinct], lambda m: m.char_cnn.convs[2].weight)
        for distinct in (True, False))
    for a, b in zip(layers, every_layers):
        assert (a - b).abs().max() <= 1e-6
    assert (grad - every_grad).abs().max() <= 1e-5 * grad.abs().max()
    ids = encoded["input_ids"]
    assert not KernelPlan.make(ElmoKernelOptions(), ids, []).every_position  # auto: distinct words on a CPU
    assert KernelPlan.make(ElmoKernelOptions(distinct_words=False), ids, []).every_position
    with pytest.raises(ValueError, match="distinct_words must be True, False or 'auto'"):
        ElmoKernelOptions(distinct_words="gpu")


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")  # bf16 on a CPU, here
def test_the_cache_keeps_weights_cast_for_gpu_autocast_and_fused_lstms_in_that_dtype():
    """Under GPU autocast the weights are cast once and kept (autocast casts them again at every call and LSTM step);
    the fused `nn.LSTM`s are kept in the autocast dtype, flat. The copies follow changes of the weights."""
    torch.manual_seed(0)
    layer = ElmoModel(tiny_config(cell_clip=None, proj_clip=None)).bilstm.layers[0]
    cache = ElmoInferenceCache()
    copy = cast(cache, layer.recurrent_weight, torch.bfloat16, transpose=True)
    assert copy.dtype == torch.bfloat16 and copy.shape == layer.recurrent_weight.mT.shape and copy.is_contiguous()
    assert cast(cache, layer.recurrent_weight, torch.bfloat16, transpose=True) is copy  # made once
    assert torch.equal(copy, layer.recurrent_weight.detach().mT.to(torch.bfloat16))
    weights = layer.weights()  # a record made per call: the cache follows the parameters, not the record
    lstms = fused_lstms(cache, weights, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for lstm in lstms for p in lstm.parameters())
    assert fused_lstms(cache, layer.weights(), torch.bfloat16) is lstms and fused_lstms(cache, weights) is not lstms
    with torch.no_grad():
        layer.recurrent_weight.mul_(2.0)
    assert not torch.equal(cast(cache, layer.recurrent_weight, torch.bfloat16, transpose=True), copy)
    assert fused_lstms(cache, layer.weights(), torch.bfloat16) is not lstms
    inputs = torch.randn(5, 3, layer.input_weight.shape[-1])
    for got, expected in zip(fused_lstms(cache, layer.weights(), torch.bfloat16), fused_lstms(cache, layer.weights())):
        reference, _ = expected(inputs)
        output, _ = got(inputs.to(torch.bfloat16))
        assert (output.float() - reference).abs().max() <= 0.05 * reference.abs().max()
