"""Registered architectures (`@architectures = "spacy-elmo.<Name>.v1"` in config.cfg). Versioned names never
change meaning: a new behaviour is a new version."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from spacy.errors import Errors
from spacy.ml.models.textcat import NEG_VALUE, build_reduce_text_classifier, resize_and_set_ref
from spacy.tokens import Doc
from spacy.util import SimpleFrozenDict, registry
from thinc.api import (
    Dropout,
    LayerNorm,
    Linear,
    Logistic,
    Maxout,
    Model,
    ParametricAttention,
    Softmax,
    chain,
    concatenate,
    list2ragged,
    reduce_first,
    reduce_last,
    reduce_max,
    reduce_mean,
    reduce_sum,
    resizable,
    with_array,
    with_padded,
)
from thinc.layers.resizable import resize_linear_weighted
from thinc.types import Floats2d, Floats3d

from hf_elmo import DEFAULT_MODEL_NAME
from hf_elmo.kernel_plan import mode_problem

from .layers import (
    ElmoListener,
    at_least_one_row,
    biattentive_encoder,
    build_bilm,
    build_bilm_v1,
    scalar_mix,
    standalone_bilm,
)
from .layers.pytorch import task_bilstm
from .weights import check_pretrained_name

NO_SETTINGS = SimpleFrozenDict()


@registry.architectures("spacy-elmo.ElmoBiLM.v2")
def elmo_bilm_v2(
    get_spans: Callable,
    name: str = DEFAULT_MODEL_NAME,
    max_batch_tokens: int = 4096,
    mixed_precision: bool = False,
    grad_scaler_config: dict = NO_SETTINGS,
    int8: bool = False,
) -> Model[list[Doc], list[Floats3d]]:
    """The ELMo biLM: per Doc its layers (n_layers + 1, n_tokens, 2 * projection_dim), boundaries removed; a chain
    of small layers (sentences → length batches → the biLM → boundaries stripped → per-Doc arrays).

    get_spans (Callable): the span getter, e.g. `spacy-elmo.sent_spans.v1` (one biLM row per span).
    name (str): `default`, a published model (`original`, ...), a directory or a Hub id; read only when the biLM is
        first needed and has no weights yet (never when a saved pipeline is loaded: its weights are in the pipeline
        directory).
        Training configs give the weights in `[initialize.components.elmo.weights]` instead.
    max_batch_tokens (int): padded positions (rows x longest row) per biLM call; bounds memory on any input.
    mixed_precision (bool): run the biLM under autocast (`hf_elmo.kernel_plan.reduced_precision`): on a GPU, bf16
        (Ampere on) or float16; on a CPU with AMX or AVX512-BF16, bf16 for predictions (not exact: see
        docs/performance.md), float32 for fine-tuning; on other CPUs, where bf16 is several times slower, float32
        with a warning.
    grad_scaler_config (dict): `PyTorchGradScaler` settings for fine-tuning with mixed precision.
    int8 (bool): predictions in the biLM's int8 mode on a CPU (`hf_elmo.kernel_plan.Precision`: not exact, 1.6-1.9
        times as fast on the original model; docs/performance.md); fine-tuning stays float32; on a GPU or a CPU
        without the kernels, float32 with a warning. Not with `mixed_precision`.
    """
    if name:
        check_pretrained_name(name)
    if problem := mode_problem(mixed_precision, "int8" if int8 else None):
        raise ValueError(f"[components.elmo.model] mixed_precision and int8: {problem} (set one of them to false)")
    return build_bilm(name, get_spans, max_batch_tokens, mixed_precision, dict(grad_scaler_config), int8)


@registry.architectures("spacy-elmo.ElmoBiLM.v1")
def elmo_bilm_v1(
    get_spans: Callable,
    name: str = DEFAULT_MODEL_NAME,
    max_batch_tokens: int = 4096,
    mixed_precision: bool = False,
    grad_scaler_config: dict = NO_SETTINGS,
    int8: bool = False,
) -> Model[list[Doc], list[Floats3d]]:
    """`spacy-elmo.ElmoBiLM.v2` as one Thinc node holding the biLM, the structure pipelines saved with v1 have
    (they load, and compute what v2 computes). New configs use v2.

    get_spans, name, max_batch_tokens, mixed_precision, grad_scaler_config, int8: as in `spacy-elmo.ElmoBiLM.v2`.
    """
    return build_bilm_v1(elmo_bilm_v2(get_spans, name, max_batch_tokens, mixed_precision, grad_scaler_config, int8))


@registry.architectures("spacy-elmo.ScalarMix.v1")
def scalar_mix_v1(
    n_layers: int = 3,
    trainable: bool = True,
    layer_dropout: float = 0.0,
    layer_norm: bool = False,
    initial_scalars: list[float] | None = None,
) -> Model[list[Floats3d], list[Floats2d]]:
    """A task's mix of the biLM layers, `gamma * sum_j softmax(s)_j * h_j` (Peters et al. 2018, eq. 1).

    n_layers (int): layers mixed, the biLM's n_layers + 1 (3 for every published model).
    trainable (bool): learn `s` and `gamma`; false keeps them at their initial values.
    layer_dropout (float): in training, drop each layer from the mix with this probability.
    layer_norm (bool): normalise each layer before mixing, with the mean and variance of all values of the Doc (all its
        sentences; `hf_elmo.formulas.scalar_mix`, whose torch callers normalise each row, one sentence).
    initial_scalars (list of float or None): initial `s`; null = zeros (a uniform average). `gamma` starts at 1.
    """
    return scalar_mix(n_layers, trainable, layer_dropout, layer_norm, initial_scalars)


@registry.architectures("spacy-elmo.ScalarMix.v2")
def scalar_mix_v2(
    n_layers: int = 3,
    trainable: bool = True,
    layer_dropout: float = 0.0,
    layer_norm: bool = False,
    initial_scalars: list[float] | None = None,
    l2: float = 0.001,
) -> Model[list[Floats3d], list[Floats2d]]:
    """`spacy-elmo.ScalarMix.v1` with the paper's regulariser `l2 * ||s||^2` on the layer scores.

    l2 (float): lambda; 1 keeps the mix close to the average of the layers, 0.001 (the paper's default) lets the
        weights vary, 0 turns it off. It adds `2 * l2 * s` to the gradient of `s` at every update, on the scale of
        the task's loss gradient.
    n_layers, trainable, layer_dropout, layer_norm, initial_scalars: as in `spacy-elmo.ScalarMix.v1`.
    """
    return scalar_mix(n_layers, trainable, layer_dropout, layer_norm, initial_scalars, l2)


@registry.architectures("spacy-elmo.ElmoListener.v1")
def elmo_listener_v1(
    width: int,
    mix: Model[list[Floats3d], list[Floats2d]],
    upstream: str = "*",
    grad_factor: float = 1.0,
    dropout: float = 0.0,
    project_to: int | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """Token vectors from the shared `elmo` component, mixed by this component's own ScalarMix: fits any
    `tok2vec` slot, or the `embed` of `spacy.Tok2Vec.v2` (ELMo into a task biLSTM, as in the paper).

    width (int): the biLM's layer width, 2 * projection_dim (1024 for the original ELMo).
    mix (Model): the task's mix, e.g. `spacy-elmo.ScalarMix.v1`.
    upstream (str): name of the `elmo` component to listen to; "*" = any.
    grad_factor (float): scales the gradient sent to the biLM when it is fine-tuned (`freeze = false`).
    dropout (float): dropout on the mixed vectors (0 = none); `spacy train` sets it to [training] dropout.
    project_to (int or None): add a linear projection to this width.
    """
    listener = ElmoListener(upstream, width, mix.get_dim("nL"), grad_factor)
    return _mixed(listener, mix, width, dropout, project_to)


@registry.architectures("spacy-elmo.Tok2VecElmo.v1")
def tok2vec_elmo_v1(
    bilm: Model[list[Doc], list[Floats3d]],
    mix: Model[list[Floats3d], list[Floats2d]],
    width: int,
    freeze: bool = True,
    grad_factor: float = 1.0,
    dropout: float = 0.0,
    project_to: int | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """A standalone ELMo embedding: the component owns its copy of the biLM (no `elmo` component). This is what
    `replace_listeners` turns an `ElmoListener.v1` into.

    bilm (Model): `spacy-elmo.ElmoBiLM.v2`; its weights come from its `name` at initialize.
    mix, width, grad_factor, dropout, project_to: as in `spacy-elmo.ElmoListener.v1`.
    freeze (bool): keep the biLM fixed (no autograd graph); false fine-tunes it with this component.
    """
    return _mixed(standalone_bilm(bilm, freeze, grad_factor), mix, width, dropout, project_to)


@registry.architectures("spacy-elmo.Tok2VecWithElmo.v1")
def tok2vec_with_elmo_v1(
    embed: Model[list[Doc], list[Floats2d]],
    width: int,
    depth: int = 1,
    dropout: float = 0.0,
    elmo: Model[list[Doc], list[Floats2d]] | None = None,
    elmo_output: Model[list[Doc], list[Floats2d]] | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """The paper's task encoder: the task's own token features `x_k` concatenated with a task mix of ELMo,
    `[x_k; ELMo_k]`, into a task biLSTM; with `elmo_output`, a second mix (its own `s`, `gamma`) concatenated to
    the biLSTM's output, `[h_k; ELMo_k]` (Peters et al. 2018, section 3.3). Without `elmo` it is the same task
    model without ELMo (the baseline of a with/without comparison).

    embed (Model): the task's own context-independent features, e.g. `spacy.MultiHashEmbed.v2` (with static
        vectors when the pipeline has them).
    width (int): the biLSTM's output width (both directions); its input width is embed's plus ELMo's.
    depth (int): biLSTM layers.
    dropout (float): dropout between the biLSTM layers.
    elmo (Model or None): an ELMo listener (`spacy-elmo.ElmoListener.v1`, with dropout) at the input.
    elmo_output (Model or None): an ELMo listener at the output.
    """

    def bilstm(input_width: int) -> Model[list[Floats2d], list[Floats2d]]:
        return with_padded(task_bilstm(width, input_width, depth, dropout))

    return _encoder_with_elmo(embed, bilstm, width, elmo, elmo_output)


@registry.architectures("spacy-elmo.BiattentiveEncoder.v1")
def biattentive_encoder_v1(
    embed: Model[list[Doc], list[Floats2d]],
    width: int,
    feedforward_width: int,
    dropout: float = 0.0,
    elmo: Model[list[Doc], list[Floats2d]] | None = None,
    elmo_output: Model[list[Doc], list[Floats2d]] | None = None,
) -> Model[list[Doc], list[Floats2d]]:
    """The encoder of the paper's SST-5 model, the biattentive classification network (McCann et al. 2017):
    `[x_k; ELMo_k]` -> ReLU feedforward -> biLSTM -> each text attending to itself -> integrating biLSTM ->
    `[h_k; ELMo_k]` with `elmo_output` (ELMo at the integrator's output, as in the paper's BCN). The same slots as
    `spacy-elmo.Tok2VecWithElmo.v1`, for `spacy-elmo.TextCatReduce.v2`'s pooling and maxout layer.

    embed (Model): the task's own context-independent features, e.g. `spacy.MultiHashEmbed.v2`.
    width (int): the output width of both biLSTMs (both directions; even).
    feedforward_width (int): the ReLU feedforward's width.
    dropout (float): dropout after the feedforward (a fixed rate, not `[training] dropout`).
    elmo (Model or None): an ELMo listener (`spacy-elmo.ElmoListener.v1`) at the input.
    elmo_output (Model or None): an ELMo listener at the integrator's output.
    """

    def encoder(input_width: int) -> Model[list[Floats2d], list[Floats2d]]:
        return with_padded(biattentive_encoder(input_width, width, feedforward_width, dropout))

    return _encoder_with_elmo(embed, encoder, width, elmo, elmo_output)


@registry.architectures("spacy-elmo.TextCatReduce.v1")
def textcat_reduce_v1(
    tok2vec: Model[list[Doc], list[Floats2d]],
    exclusive_classes: bool,
    use_reduce_first: bool,
    use_reduce_last: bool,
    use_reduce_max: bool,
    use_reduce_mean: bool,
    nO: int | None = None,
) -> Model[list[Doc], Floats2d]:
    """spaCy's `spacy.TextCatReduce.v1` (a linear classifier on the pooled token vectors) that also accepts empty
    texts with max, first or last pooling: a Doc without tokens pools one zero row (spaCy's own raises in Thinc's
    reduce_max / reduce_first / reduce_last). The paper's SST-5 model pools by max and mean (among others).

    tok2vec, exclusive_classes, use_reduce_*, nO: as in `spacy.TextCatReduce.v1`.
    """
    model = build_reduce_text_classifier(
        at_least_one_row(tok2vec), exclusive_classes, use_reduce_first, use_reduce_last, use_reduce_max,
        use_reduce_mean, nO,
    )
    model.set_ref("tok2vec", tok2vec)  # the token vectors themselves, as in spaCy's
    return model


@registry.architectures("spacy-elmo.TextCatReduce.v2")
def textcat_reduce_v2(
    tok2vec: Model[list[Doc], list[Floats2d]],
    exclusive_classes: bool,
    use_reduce_first: bool,
    use_reduce_last: bool,
    use_reduce_max: bool,
    use_reduce_mean: bool,
    use_reduce_attention: bool = False,
    maxout_width: int | None = None,
    nO: int | None = None,
) -> Model[list[Doc], Floats2d]:
    """`spacy-elmo.TextCatReduce.v1` with the rest of the pooling and output network of the paper's SST-5 model
    (the biattentive classification network): self-attentive pooling, and a maxout layer between the pooled
    vector and the output layer. A Doc without tokens pools one zero row, as in v1.

    use_reduce_attention (bool): also pool by attention, the tokens' vectors weighted by the softmax of their dot
        products with a learned query (Thinc's `ParametricAttention`).
    maxout_width (int or None): a maxout layer of this width (3 pieces), layer-normalised, with dropout (at
        `[training] dropout`, which spaCy gives every Dropout layer); null goes straight to the output layer (v1).
    tok2vec, exclusive_classes, use_reduce_first, use_reduce_last, use_reduce_max, use_reduce_mean, nO: as in
        `spacy.TextCatReduce.v1`.
    """
    uses = {reduce_first: use_reduce_first, reduce_last: use_reduce_last, reduce_max: use_reduce_max,
            reduce_mean: use_reduce_mean}
    reductions = [reduction() for reduction, use in uses.items() if use]
    if use_reduce_attention:
        reductions.append(chain(ParametricAttention(), reduce_sum()))
    if not reductions:
        raise ValueError(Errors.E1057)
    layers = [at_least_one_row(tok2vec), list2ragged(), concatenate(*reductions)]
    if maxout_width:
        layers += [Maxout(nO=maxout_width, nP=3), LayerNorm(nI=maxout_width), Dropout(0.0)]
    output_layer = Softmax(nO=nO) if exclusive_classes else Linear(nO=nO)
    fill_defaults = {"b": NEG_VALUE if exclusive_classes else 0, "W": 0}  # a new label starts out never chosen
    resizable_layer = resizable(output_layer, resize_layer=partial(resize_linear_weighted, fill_defaults=fill_defaults))
    model = chain(*layers, resizable_layer, *([] if exclusive_classes else [Logistic()]))
    model.set_ref("output_layer", output_layer)
    model.set_ref("tok2vec", tok2vec)
    model.attrs["resize_output"] = partial(resize_and_set_ref, resizable_layer=resizable_layer)
    model.attrs["multi_label"] = not exclusive_classes
    if nO is not None:
        model.set_dim("nO", nO)
    return model


def output_width(model: Model) -> int:
    """The output width of a layer: its `nO`, else that of the last of its sublayers that has one (a `chain` such
    as `spacy.MultiHashEmbed.v2` leaves its own unset)."""
    if model.has_dim("nO") is True:
        return model.get_dim("nO")
    for layer in reversed(model.layers):
        try:
            return output_width(layer)
        except ValueError:
            continue
    raise ValueError(f"cannot tell the output width of the layer '{model.name}': set its nO")


def _mixed(
    layers: Model[list[Doc], list[Floats3d]], mix: Model, width: int, dropout: float, project_to: int | None
) -> Model[list[Doc], list[Floats2d]]:
    """layers >> mix [>> dropout] [>> projection]; the same structure for listeners and standalone models, so
    `replace_listeners` gives a model that a config (and its saved weights) can rebuild."""
    for dim in ("nI", "nO"):
        if not mix.has_dim(dim):
            mix.set_dim(dim, width)
    steps: list[Model] = [layers, mix]
    if dropout:
        steps.append(Dropout(dropout))
    if project_to:
        steps.append(with_array(Linear(project_to, width)))
    model = chain(*steps)
    model.set_dim("nO", project_to or width, force=True)
    return model


def _encoder_with_elmo(
    embed: Model[list[Doc], list[Floats2d]],
    encoder: Callable[[int], Model[list[Floats2d], list[Floats2d]]],
    width: int,
    elmo: Model[list[Doc], list[Floats2d]] | None,
    elmo_output: Model[list[Doc], list[Floats2d]] | None,
) -> Model[list[Doc], list[Floats2d]]:
    """`[x_k; ELMo_k]` -> encoder(its input width), of output width `width` -> `[h_k; ELMo_k]`, each ELMo optional;
    marks each mix with its position (read by `spacy_elmo.mix_weights`)."""
    for listener, position in ((elmo, "input"), (elmo_output, "output")):
        for node in listener.walk() if listener is not None else ():
            if node.name == "elmo_scalar_mix":
                node.attrs["position"] = position
    inputs = embed if elmo is None else concatenate(embed, elmo)
    input_width = sum(output_width(layer) for layer in (embed, elmo) if layer is not None)
    model = chain(inputs, encoder(input_width))
    if elmo_output is not None:
        model = concatenate(model, elmo_output)
    model.set_dim("nO", width + (output_width(elmo_output) if elmo_output is not None else 0), force=True)
    return model
