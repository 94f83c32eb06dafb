"""ELMo biLM as a Hugging Face model: config, character tokenizer, models, and Auto* registration."""

from pathlib import Path

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from .configuration_elmo import PRESETS, ElmoConfig
from .kernels import ElmoInferenceCache, ElmoKernelOptions
from .modeling_elmo import (
    ElmoBidirectionalLMOutput,
    ElmoForBidirectionalLM,
    ElmoForSequenceClassification,
    ElmoForTokenClassification,
    ElmoModel,
    ElmoModelOutput,
    ElmoPreTrainedModel,
    ElmoRepresentations,
    ElmoScalarMix,
    ElmoState,
    ElmoWithScalarMixes,
    remove_sentence_boundaries,
)
from .text import split_words
from .tokenization_elmo import ElmoCharTokenizer

AutoConfig.register(ElmoConfig.model_type, ElmoConfig, exist_ok=True)
AutoModel.register(ElmoConfig, ElmoModel, exist_ok=True)
AutoModelForPreTraining.register(ElmoConfig, ElmoForBidirectionalLM, exist_ok=True)
AutoModelForTokenClassification.register(ElmoConfig, ElmoForTokenClassification, exist_ok=True)
AutoModelForSequenceClassification.register(ElmoConfig, ElmoForSequenceClassification, exist_ok=True)
AutoTokenizer.register(ElmoConfig, tokenizer_class=ElmoCharTokenizer, exist_ok=True)

__version__ = "0.1.0"

# The English biLM shipped inside the package (see its README.md): a save_pretrained directory for
# `AutoModel.from_pretrained(DEFAULT_MODEL)` / `AutoTokenizer.from_pretrained(DEFAULT_MODEL)`, offline.
DEFAULT_MODEL = str(Path(__file__).parent / "default_model")
DEFAULT_MODEL_NAME = "default"


def model_location(name: str | Path) -> str:
    """What `from_pretrained` should load for a model name: `DEFAULT_MODEL` for `"default"` (the name the CLI and
    the spaCy component accept for the shipped model), else `name` (a directory or Hub id) unchanged."""
    return DEFAULT_MODEL if str(name) == DEFAULT_MODEL_NAME else str(name)

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_NAME",
    "PRESETS",
    "ElmoBidirectionalLMOutput",
    "ElmoCharTokenizer",
    "ElmoConfig",
    "ElmoForBidirectionalLM",
    "ElmoForSequenceClassification",
    "ElmoForTokenClassification",
    "ElmoInferenceCache",
    "ElmoKernelOptions",
    "ElmoModel",
    "ElmoModelOutput",
    "ElmoPreTrainedModel",
    "ElmoRepresentations",
    "ElmoScalarMix",
    "ElmoState",
    "ElmoWithScalarMixes",
    "remove_sentence_boundaries",
    "model_location",
    "split_words",
]
