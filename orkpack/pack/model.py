"""The pack's ``model`` record (format 1.3, docs/FORMAT.md 9): GGUF key-value pairs, typed, as JSON.

One entry is ``[key, type, value]``; ``type`` is a GGUF value type spelled as
in :data:`TYPES`, or ``"array[T]"`` for an array of T. Values are JSON:
integers; float32/float64 values as the shortest decimal that reads back to the
same float (``"nan"``, ``"inf"``, ``"-inf"`` as strings: the header has no NaN);
bools; strings (UTF-8; a byte that is not valid UTF-8 is kept as the lone
surrogate U+DC80 + byte, Python's ``surrogateescape``). What fills it:
orkpack.sources.modelkv.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from ..errors import escape_name

# GGUF value types (gguf-py's GGUFValueType) by their name in a pack
TYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "uint64", "int64",
         "float64")
_INT_RANGE = {
    "uint8": (0, 2**8 - 1), "int8": (-2**7, 2**7 - 1), "uint16": (0, 2**16 - 1), "int16": (-2**15, 2**15 - 1),
    "uint32": (0, 2**32 - 1), "int32": (-2**31, 2**31 - 1), "uint64": (0, 2**64 - 1), "int64": (-2**63, 2**63 - 1),
}
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


# ------------------------------------------------------------------------------------------ values

def json_value(typ: str, v: Any) -> Any:
    """A Python value (from gguf-py or a converter) as the JSON the header holds."""
    if typ.startswith("array["):
        inner = typ[6:-1]
        return [json_value(inner, x) for x in v]
    if typ in ("float32", "float64"):
        f = float(v)
        if math.isnan(f):
            return "nan"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f
    if typ == "bool":
        return bool(v)
    if typ == "string":
        if isinstance(v, (bytes, bytearray, memoryview)):
            return bytes(v).decode("utf-8", "surrogateescape")
        return str(v)
    return int(v)


def value(entry: list) -> Any:
    """The Python value of a ``[key, type, value]`` entry (floats as float, non-finite ones restored)."""
    _, typ, v = entry
    return _py(typ, v)


def _py(typ: str, v: Any) -> Any:
    if typ.startswith("array["):
        return [_py(typ[6:-1], x) for x in v]
    if typ in ("float32", "float64"):
        return _NONFINITE[v] if isinstance(v, str) else float(v)
    return v


def _finite(v) -> bool:
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def valid_type(typ: Any, depth: int = 0) -> bool:
    """Whether ``typ`` spells a GGUF value type: one of TYPES, or ``array[T]`` of one (nested up to 8 deep)."""
    if not isinstance(typ, str):
        return False
    if typ.startswith("array[") and typ.endswith("]") and depth < 8:
        return valid_type(typ[6:-1], depth + 1)
    return typ in TYPES


def check_type(typ: Any, v: Any, depth: int = 0) -> str | None:
    """Why ``v`` is not a valid JSON value of GGUF type ``typ`` (None when it is)."""
    if not isinstance(typ, str):
        return "type is not a string"
    if typ.startswith("array[") and typ.endswith("]") and depth < 8:
        inner = typ[6:-1]
        if not valid_type(inner):  # array[] or array[x]: the element type is checked even for an empty list
            return f"unknown type {escape_name(typ, 40)!s}"
        if not isinstance(v, list):
            return f"{typ} value is not a list"
        for x in v:
            why = check_type(inner, x, depth + 1)
            if why:
                return why
        return None
    if typ not in TYPES:
        return f"unknown type {escape_name(typ, 40)!s}"
    if typ in _INT_RANGE:
        lo, hi = _INT_RANGE[typ]
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            return f"{typ} value {escape_name(repr(v), 40)} out of range"
    elif typ in ("float32", "float64"):
        if not (isinstance(v, (int, float)) and not isinstance(v, bool)) and not (isinstance(v, str) and v in _NONFINITE):
            return f"{typ} value {escape_name(repr(v), 40)} is not a number"
        if not isinstance(v, str) and not _finite(v):  # 1e400 or a 400-digit integer: beyond a double (nan/inf are strings)
            return f"{typ} value {escape_name(repr(v), 40)} out of range"
    elif typ == "bool":
        if not isinstance(v, bool):
            return "bool value is not true/false"
    elif not isinstance(v, str):
        return "string value is not a string"
    return None


def check_model(model: Any) -> str | None:
    """Why a header's ``model`` record is malformed (None when it is well formed): docs/FORMAT.md 9."""
    if model is None:
        return None
    if not isinstance(model, dict) or set(model) != {"source", "kv"}:
        return "model: not an object with keys source and kv"
    if model["source"] not in ("gguf", "hf"):
        return "model.source: not 'gguf' or 'hf'"
    if not isinstance(model["kv"], list):
        return "model.kv: not a list"
    seen: set[str] = set()
    for i, e in enumerate(model["kv"]):
        if not (isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and e[0]):
            return f"model.kv[{i}]: not a [key, type, value] entry"
        if e[0] in seen:
            return f"model.kv: key {escape_name(e[0], 80)} appears twice"
        seen.add(e[0])
        why = check_type(e[1], e[2])
        if why:
            return f"model.kv {escape_name(e[0], 80)}: {why}"
    return None


def get(model: Mapping | None, key: str, default: Any = None) -> Any:
    """The value of ``key`` in a pack's ``model`` record (Python value), or ``default``."""
    if not model:
        return default
    for e in model.get("kv", ()):
        if e[0] == key:
            return value(e)
    return default


def summary(model: Any) -> dict | None:
    """What ``inspect`` shows of a model record: the facts a runtime starts from, and every key with its type."""
    if model is None:
        return None
    why = check_model(model)
    if why:
        return {"problem": why}
    arch = get(model, "general.architecture")
    def a(k):
        return get(model, f"{arch}.{k}") if isinstance(arch, str) else None
    tokens = get(model, "tokenizer.ggml.tokens")
    merges = get(model, "tokenizer.ggml.merges")
    keys = []
    for k, typ, v in model["kv"]:
        if typ.startswith("array["):
            shown = f"[{len(v)} items]"
        elif typ == "string" and len(v) > 60:
            shown = f"({len(v)} characters)"
        else:
            shown = v
        keys.append({"key": k, "type": typ, "value": shown})
    return {
        "source": model["source"],
        "architecture": arch,
        "context_length": a("context_length"),
        "embedding_length": a("embedding_length"),
        "block_count": a("block_count"),
        "head_count": a("attention.head_count"),
        "head_count_kv": a("attention.head_count_kv"),
        "rope_freq_base": a("rope.freq_base"),
        "rms_epsilon": a("attention.layer_norm_rms_epsilon"),
        "tokenizer": get(model, "tokenizer.ggml.model"),
        "vocab": len(tokens) if isinstance(tokens, list) else None,
        "merges": len(merges) if isinstance(merges, list) else None,
        "hf_tokenizer_json": get(model, "tokenizer.huggingface.json") is not None,
        "chat_template": get(model, "tokenizer.chat_template") is not None,
        "keys": keys,
    }
