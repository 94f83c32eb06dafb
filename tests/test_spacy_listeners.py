"""Training with listeners (in process): one biLM pass per batch, per-task mixes, freeze vs fine-tune, initialize
rules, replace_listeners, [x; ELMo] concatenation."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import spacy
import torch
from spacy.training import Example
from spacy_fixtures import DATA, N_LAYERS, WIDTH
from thinc.api import Adam, Config, fix_random_seed

from hf_elmo import ElmoModel
from spacy_elmo.corpora import read_conll2003
from spacy_elmo.layers import elmo_shim
from spacy_elmo.pipeline_component import FrozenLayersCache

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PIPELINE_CONFIG = """
[nlp]
lang = "en"
pipeline = ["elmo", "ner", "textcat"]

[components]

[components.elmo]
factory = "elmo"
freeze = {freeze}

[components.elmo.model]
@architectures = "spacy-elmo.ElmoBiLM.v2"
name = ""

[components.elmo.model.get_spans]
@misc = "spacy-elmo.sent_spans.v1"

[components.ner]
factory = "ner"

[components.ner.model]
@architectures = "spacy.TransitionBasedParser.v2"
state_type = "ner"
hidden_width = 16
use_upper = false

[components.ner.model.tok2vec]
{ner_tok2vec}

[components.textcat]
factory = "textcat"

[components.textcat.model]
@architectures = "spacy.TextCatReduce.v1"
exclusive_classes = true
use_reduce_first = false
use_reduce_last = false
use_reduce_max = false
use_reduce_mean = true

[components.textcat.model.tok2vec]
@architectures = "spacy-elmo.ElmoListener.v1"
width = {width}
project_to = 16

[components.textcat.model.tok2vec.mix]
@architectures = "spacy-elmo.ScalarMix.v1"
n_layers = 3

[initialize]

[initialize.components]

[initialize.components.elmo]

[initialize.components.elmo.weights]
{weights}
"""
LISTENER = """@architectures = "spacy-elmo.ElmoListener.v1"
width = {width}
upstream = "elmo"
dropout = 0.1
project_to = 16

[components.ner.model.tok2vec.mix]
@architectures = "spacy-elmo.ScalarMix.v1"
n_layers = 3
layer_dropout = 0.1
"""
# [x; ELMo]: spaCy's hash embeddings concatenated with the listener, into a CNN encoder.
CONCATENATED = """@architectures = "spacy.Tok2Vec.v2"

[components.ner.model.tok2vec.embed]
@layers = "concatenate.v1"

[components.ner.model.tok2vec.embed.*.hash]
@architectures = "spacy.MultiHashEmbed.v2"
width = 16
attrs = ["NORM", "SHAPE"]
rows = [500, 50]
include_static_vectors = false

[components.ner.model.tok2vec.embed.*.elmo]
@architectures = "spacy-elmo.ElmoListener.v1"
width = {width}
project_to = 16

[components.ner.model.tok2vec.embed.*.elmo.mix]
@architectures = "spacy-elmo.ScalarMix.v1"
n_layers = 3

[components.ner.model.tok2vec.encode]
@architectures = "spacy.MaxoutWindowEncoder.v2"
width = 32
depth = 1
window_size = 1
maxout_pieces = 2
"""


@pytest.fixture(scope="module")
def examples():
    """12 CoNLL-2003 docs of 2 sentences (tags, entities, the entities as spans too) and a made-up label: does
    the doc mention an organisation?"""
    nlp = spacy.blank("en")
    result = []
    for doc in read_conll2003(DATA / "conll2003" / "iob2" / "train.txt", nlp.vocab, n_sents=2):
        has_org = any(ent.label_ == "ORG" for ent in doc.ents)
        doc.cats = {"ORG": float(has_org), "OTHER": float(not has_org)}
        doc.spans["sc"] = list(doc.ents)
        result.append(Example(nlp.make_doc(doc.text), doc))
        if len(result) == 12:
            return result
    pytest.fail("CoNLL-2003 slice too short")


def make_nlp(elmo_dir, freeze=True, ner_tok2vec=LISTENER, width=WIDTH, weights=None):
    weights = weights or f'@misc = "spacy-elmo.PretrainedWeights.v1"\nname = "{elmo_dir}"'
    config = PIPELINE_CONFIG.format(
        freeze=str(freeze).lower(), ner_tok2vec=ner_tok2vec.format(width=width), width=width, weights=weights
    )
    return spacy.util.load_model_from_config(Config().from_str(config), auto_fill=True, validate=True)


def mixes(nlp, component):
    return [
        (node.get_param("s").copy(), node.get_param("gamma").copy())
        for node in nlp.get_pipe(component).model.walk()
        if node.name == "elmo_scalar_mix"
    ]


def bilm_state(nlp):
    return {name: tensor.clone() for name, tensor in elmo_shim(nlp.get_pipe("elmo").model).elmo.state_dict().items()}


def train(nlp, examples, steps):
    """`steps` updates on the whole (12 docs) batch; returns the losses of every step."""
    fix_random_seed(0)
    nlp.initialize(lambda: examples)
    optimizer = Adam(0.01)
    return [nlp.update(examples, sgd=optimizer, losses={}) for _ in range(steps)]


@pytest.fixture(scope="module")
def trained(elmo_dir, examples):
    """elmo (frozen) + ner + textcat trained together, and what happened to the biLM while training."""
    nlp = make_nlp(elmo_dir)
    calls = []
    forward = ElmoModel.forward

    def counting_forward(self, *args, **kwargs):
        calls.append(self.training)  # whether the biLM's dropout is on
        return forward(self, *args, **kwargs)

    ElmoModel.forward = counting_forward
    try:
        history = train(nlp, examples, 12)
    finally:
        ElmoModel.forward = forward
    assert not any(calls)  # a frozen biLM never runs with dropout on
    return nlp, history, len(calls)


def test_one_biLM_pass_per_batch_is_shared_by_all_listeners_and_seen_docs_come_from_the_cache(trained):
    nlp, history, bilm_calls = trained
    assert nlp.get_pipe("elmo").listening_components == ["ner", "textcat"]
    assert len(history) == 12 and bilm_calls == 1  # 12 short docs = one biLM batch for both tasks, then cached


def test_the_frozen_layers_cache_changes_no_number_and_stays_bounded(elmo_dir, examples, monkeypatch):
    histories, calls = [], []
    forward = ElmoModel.forward
    monkeypatch.setattr(ElmoModel, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    for cache_mb in (0, 64):
        nlp = make_nlp(elmo_dir)
        nlp.get_pipe("elmo").frozen_cache.max_bytes = cache_mb * 2**20
        histories.append(train(nlp, examples, 3))
    assert histories[0] == histories[1]  # the same losses, bit for bit
    assert len(calls) == 3 + 1  # off: every update runs the biLM; on: the first only
    cache = FrozenLayersCache(max_bytes=3 * 4 * 5 * 4)  # room for 5 tokens of 3 layers x 4 floats
    docs = [spacy.blank("en")(text) for text in ("a b c", "d e", "a b c", "f g h i")]

    def layers(batch):
        return [np.full((3, len(doc), 4), len(doc[0].text + doc.text), dtype="float32") for doc in batch]

    first = cache.layers(docs[:2], layers)
    assert cache.bytes == 5 * 3 * 4 * 4 and cache.layers(docs[2:], layers)[0] is first[0]
    assert cache.bytes <= cache.max_bytes  # "f g h i" did not fit: computed, not kept
    assert [len(x[0]) for x in cache.layers(docs, layers)] == [3, 2, 3, 4]
    assert pickle.loads(pickle.dumps(cache)).bytes == 0
    split = spacy.blank("en")("a b c")
    split[1].is_sent_start = True  # the same words as sentences of their own: other layers
    assert cache.layers([split], lambda batch: [np.zeros((3, 3, 4), "float32")])[0].max() == 0


def test_losses_fall_and_each_task_learns_its_own_mix(trained):
    nlp, history, _ = trained
    for task in ("ner", "textcat"):
        losses = [step[task] for step in history]
        assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), (task, losses)
    [(ner_s, ner_gamma)], [(textcat_s, textcat_gamma)] = mixes(nlp, "ner"), mixes(nlp, "textcat")
    for s, gamma in ((ner_s, ner_gamma), (textcat_s, textcat_gamma)):
        assert np.abs(s).max() > 1e-3 and abs(gamma[0] - 1.0) > 1e-3
    assert not np.allclose(ner_s, textcat_s)
    assert [step["elmo"] for step in history] == [0.0] * len(history)


def test_frozen_biLM_stays_bit_identical(trained, elmo_dir):
    nlp, _, _ = trained
    pretrained = ElmoModel.from_pretrained(elmo_dir).state_dict()
    for name, tensor in bilm_state(nlp).items():
        assert torch.equal(tensor, pretrained[name]), name


def test_fine_tuning_updates_the_biLM_and_the_pipeline_still_pickles(elmo_dir, examples):
    nlp = make_nlp(elmo_dir, freeze=False)
    text = examples[0].reference.text
    history = train(nlp, examples, 1)
    nlp(text)  # an evaluation between updates fills the biLM's inference token cache
    history.append(nlp.update(examples, sgd=Adam(0.01), losses={}))
    assert history[-1]["elmo"] > 0
    before = ElmoModel.from_pretrained(elmo_dir).state_dict()
    changed = [name for name, tensor in bilm_state(nlp).items() if not torch.equal(tensor, before[name])]
    assert any(name.startswith("bilstm.") for name in changed) and any(name.startswith("char_cnn.") for name in changed)
    # Predictions use the updated char CNN, not token representations cached before the update.
    fresh = spacy.util.load_model_from_config(nlp.config).from_bytes(nlp.to_bytes())
    np.testing.assert_allclose(nlp(text)._.elmo_layers, fresh(text)._.elmo_layers, atol=1e-5)
    assert pickle.loads(pickle.dumps(nlp))(text).cats == pytest.approx(nlp(text).cats, abs=1e-6)


def test_initialize_without_weights_raises_unless_random_weights_are_asked_for(elmo_dir, examples):
    nlp = make_nlp(elmo_dir, weights="@misc = \"spacy-elmo.PretrainedWeights.v1\"\nname = null")
    with pytest.raises(ValueError, match="paths.elmo_model"):
        nlp.initialize(lambda: examples)
    config = make_nlp(elmo_dir).config
    del config["initialize"]["components"]["elmo"]
    with pytest.raises(ValueError, match="its `name` is empty"):
        spacy.util.load_model_from_config(config).initialize(lambda: examples)
    random_weights = (
        '@misc = "spacy-elmo.RandomWeights.v1"\npreset = "small"\nconfig = {"lstm_dim": 32, "projection_dim": 16}'
    )
    nlp = make_nlp(elmo_dir, weights=random_weights)
    nlp.initialize(lambda: examples)
    assert nlp("A random biLM.")._.elmo_layers.shape == (3, 4, WIDTH)


def test_initialize_with_a_weights_loader_initializes_the_biLM_once(elmo_dir, examples, monkeypatch):
    from thinc.api import Model

    from spacy_elmo.layers import shim as bilm_module

    initialized, reads = [], []
    initialize = Model.initialize
    monkeypatch.setattr(Model, "initialize", lambda self, X=None, Y=None: (
        initialized.append(self.name), initialize(self, X=X, Y=Y))[1])
    monkeypatch.setattr(bilm_module, "load_pretrained", lambda name: reads.append(name))  # `name` is never read
    nlp = make_nlp(elmo_dir)
    nlp.initialize(lambda: examples)
    assert initialized.count("elmo_bilm") == 1 and reads == []
    assert nlp("Rates rose .")._.elmo_layers.shape == (N_LAYERS, 3, WIDTH)


def test_listener_that_does_not_match_the_biLM_fails_at_initialize(elmo_dir, examples):
    nlp = make_nlp(elmo_dir, width=64)
    with pytest.raises(ValueError, match="set the listener's `width = 32`"):
        nlp.initialize(lambda: examples)


def test_excluding_elmo_from_updates_gives_a_clear_error(elmo_dir, examples):
    nlp = make_nlp(elmo_dir)
    nlp.initialize(lambda: examples)
    with pytest.raises(ValueError, match="frozen_components"):
        nlp.update(examples[:2], exclude=["elmo"])


def test_replace_listeners_gives_a_standalone_model_that_reloads(trained, examples, tmp_path):
    nlp, _, _ = trained
    nlp = pickle.loads(pickle.dumps(nlp))  # leave the shared fixture alone
    texts = [eg.reference.text for eg in examples[:4]]
    expected = [doc.cats for doc in nlp.pipe(texts)]
    nlp.replace_listeners("elmo", "textcat", ["model.tok2vec"])
    assert nlp.get_pipe("elmo").listening_components == ["ner"]
    tok2vec_config = nlp.config["components"]["textcat"]["model"]["tok2vec"]
    assert tok2vec_config["@architectures"] == "spacy-elmo.Tok2VecElmo.v1" and tok2vec_config["project_to"] == 16
    for doc, cats in zip(nlp.pipe(texts), expected):
        assert doc.cats == pytest.approx(cats, abs=1e-6)
    nlp.remove_pipe("ner")
    nlp.remove_pipe("elmo")
    nlp.to_disk(tmp_path / "standalone")
    reloaded = spacy.load(tmp_path / "standalone")
    assert reloaded.pipe_names == ["textcat"]
    for doc, cats in zip(reloaded.pipe(texts), expected):
        assert doc.cats == pytest.approx(cats, abs=1e-6)


def test_hash_embeddings_concatenated_with_elmo(elmo_dir, examples):
    nlp = make_nlp(elmo_dir, ner_tok2vec=CONCATENATED)
    history = train(nlp, examples, 3)
    assert nlp.get_pipe("elmo").listening_components == ["ner", "textcat"]
    assert all(np.isfinite(step["ner"]) for step in history)
    tok2vec = nlp.get_pipe("ner").model.get_ref("tok2vec").layers[0]  # spacy.Tok2Vec.v2
    doc = nlp(examples[0].reference.text)
    assert tok2vec.predict([doc])[0].shape == (len(doc), 32)


TAGGER_AND_SPANCAT = """
[nlp]
lang = "en"
pipeline = ["elmo", "tagger", "spancat"]

[components]

[components.elmo]
factory = "elmo"

[components.elmo.model]
@architectures = "spacy-elmo.ElmoBiLM.v2"
name = "{elmo_dir}"

[components.elmo.model.get_spans]
@misc = "spacy-elmo.sent_spans.v1"

[components.tagger]
factory = "tagger"

[components.tagger.model]
@architectures = "spacy.Tagger.v2"

[components.tagger.model.tok2vec]
@architectures = "spacy-elmo.ElmoListener.v1"
width = {width}

[components.tagger.model.tok2vec.mix]
@architectures = "spacy-elmo.ScalarMix.v1"

[components.spancat]
factory = "spancat"

[components.spancat.model]
@architectures = "spacy.SpanCategorizer.v1"

[components.spancat.model.reducer]
@layers = "spacy.mean_max_reducer.v1"
hidden_size = 16

[components.spancat.model.scorer]
@layers = "spacy.LinearLogistic.v1"

[components.spancat.model.tok2vec]
@architectures = "spacy-elmo.ElmoListener.v1"
width = {width}
project_to = 16

[components.spancat.model.tok2vec.mix]
@architectures = "spacy-elmo.ScalarMix.v1"
"""


def test_tagger_and_spancat_listen_too(elmo_dir, examples):
    config = Config().from_str(TAGGER_AND_SPANCAT.format(elmo_dir=elmo_dir, width=WIDTH))
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    history = train(nlp, examples, 3)  # the biLM comes from the model's `name`
    assert nlp.get_pipe("elmo").listening_components == ["tagger", "spancat"]
    assert history[-1]["tagger"] < history[0]["tagger"] and history[-1]["spancat"] < history[0]["spancat"]
    doc = nlp(examples[0].reference.text)
    assert all(token.tag_ for token in doc) and "sc" in doc.spans
