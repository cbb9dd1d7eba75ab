"""Readers: safetensors (file, HF folder) and GGUF, one tensor model."""
from .base import FLOAT_DTYPES, Source, TensorInfo, as_float32
from .config import FACT_KEYS
from .gguf import LossyDequantWarning
from .names import canonical_name, normalize_name, split_expert
from .open import model_facts, open_source

__all__ = [
    "FLOAT_DTYPES", "Source", "TensorInfo", "as_float32", "FACT_KEYS", "model_facts", "LossyDequantWarning",
    "canonical_name", "normalize_name", "split_expert", "open_source",
]
