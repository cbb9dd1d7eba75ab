"""Readers: safetensors (file, HF folder) and GGUF, one tensor model.

The names below are imported on first use (PEP 562), so a command that needs only
``orkpack.sources.names`` or ``.config`` (``orkpack plan`` of a config.json) does not
load the safetensors and GGUF readers.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "FLOAT_DTYPES": "base", "Source": "base", "TensorInfo": "base", "as_float32": "base",
    "FACT_KEYS": "config", "LossyDequantWarning": "gguf",
    "canonical_name": "names", "normalize_name": "names", "split_expert": "names",
    "model_facts": "open", "open_source": "open",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{where}", __name__), name)
    globals()[name] = value
    return value
