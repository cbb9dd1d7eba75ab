"""config.json and the architecture facts a plan needs.

The facts themselves are defined by the family entries of :mod:`orkpack.archs`
(``archs.FACT_KEYS``): one small dict with the same keys whatever the source,
an HF config.json (:func:`facts_from_hf_config`) or GGUF metadata
(:func:`facts_from_gguf_kv`). For the same model both give equal facts (a
mistral GGUF says llama: GGUF does not record the difference, and the tensors
are the same). :func:`orkpack.sources.open.model_facts` picks the right one for
a path or an opened source.

This module imports no reader, so the readers can use it (no import cycle).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from .. import archs
from ..errors import SourceError, escape_name

FACT_KEYS = archs.FACT_KEYS
MAX_EXPERT_SLICES = archs.MAX_EXPERT_SLICES


def facts_from_hf_config(cfg: Mapping[str, Any], where: str = "config.json") -> dict:
    """Facts from a parsed HF config.json of a known family (one clear SourceError line otherwise)."""
    return archs.facts_from_config(cfg, where)


def facts_from_gguf_kv(kv: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]], where: str) -> dict:
    """Facts from GGUF metadata (``kv``: key -> scalar or list) and tensor shapes (numpy order)."""
    return archs.facts_from_gguf(kv, tensor_shapes, where)


def load_hf_config(path: Path) -> dict:
    """Parse a config.json; SourceError with the file name if it is unreadable."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SourceError(f"{escape_name(str(path))}: cannot read config.json ({e.__class__.__name__}); "
                          "restore it from the model's original files") from None
    if not isinstance(cfg, dict):
        raise SourceError(f"{escape_name(str(path))}: config.json is not a JSON object; restore the original")
    return cfg
