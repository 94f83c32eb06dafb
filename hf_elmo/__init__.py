"""ELMo biLM as a Hugging Face model: config, character tokenizer, models, and Auto* registration."""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForPreTraining,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from .configuration_elmo import PRESETS, ElmoConfig, ElmoKernelOptions
from .embed import ElmoEmbedder, EmbedSettings, embed_file
from .inference_cache import ElmoInferenceCache
from .loading import (
    DEFAULT_MODEL,
    DEFAULT_MODEL_NAME,
    MODEL_NAMES,
    ModelLoadError,
    load_model,
    load_tokenizer,
    model_location,
)
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
from .published import PUBLISHED_MODELS, published_model
from .runtime import OutOfDeviceMemoryError
from .text import ElmoBatch, split_words
from .tokenization_elmo import ElmoCharTokenizer

AutoConfig.register(ElmoConfig.model_type, ElmoConfig, exist_ok=True)
AutoModel.register(ElmoConfig, ElmoModel, exist_ok=True)
AutoModelForPreTraining.register(ElmoConfig, ElmoForBidirectionalLM, exist_ok=True)
AutoModelForTokenClassification.register(ElmoConfig, ElmoForTokenClassification, exist_ok=True)
AutoModelForSequenceClassification.register(ElmoConfig, ElmoForSequenceClassification, exist_ok=True)
AutoTokenizer.register(ElmoConfig, tokenizer_class=ElmoCharTokenizer, exist_ok=True)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_MODEL_NAME",
    "MODEL_NAMES",
    "PRESETS",
    "PUBLISHED_MODELS",
    "ElmoBatch",
    "ElmoBidirectionalLMOutput",
    "ElmoCharTokenizer",
    "ElmoConfig",
    "ElmoEmbedder",
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
    "EmbedSettings",
    "ModelLoadError",
    "OutOfDeviceMemoryError",
    "embed_file",
    "load_model",
    "load_tokenizer",
    "model_location",
    "published_model",
    "remove_sentence_boundaries",
    "split_words",
]
