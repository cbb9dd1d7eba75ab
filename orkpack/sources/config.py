"""Architecture facts from an HF config.json or from GGUF metadata.

``model_facts`` returns one small dict with the same keys whatever the source:

  arch                 llama, mistral, mixtral, qwen2, qwen3, qwen3_moe (HF model_type
                       spelling; a GGUF ``llama`` with experts is reported as mixtral)
  n_layers, hidden, intermediate, heads, kv_heads, head_dim, vocab
  n_experts, n_experts_used, moe_intermediate   (0 for dense models)
  tie_word_embeddings  (GGUF: no ``output.weight`` tensor)

``intermediate`` is the dense FFN width; ``moe_intermediate`` is the width of one
expert (mixtral: ``intermediate_size``; qwen3_moe: ``moe_intermediate_size``).
For the same model an HF config and its GGUF give equal facts (mistral's GGUF
says llama: GGUF does not record the difference, and the tensors are the same).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import SourceError, escape_name
from .names import GGUF_ARCH_TO_ARCH, SUPPORTED_ARCHS

FACT_KEYS = (
    "arch", "n_layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab",
    "n_experts", "n_experts_used", "moe_intermediate", "tie_word_embeddings",
)


# Sanity caps on architecture numbers (a hostile config must not make a plan
# enumerate billions of items): far above any real model.
FACT_CAPS = {"num_hidden_layers": 4096, "block_count": 4096, "num_experts": 65536, "num_local_experts": 65536, "n": 65536}
FACT_CAP_DEFAULT = 1 << 24
MAX_EXPERT_SLICES = 1 << 20  # layers x experts (a 48-layer, 128-expert MoE has 6144)


def _need(cfg: Mapping[str, Any], key: str, where: str) -> int:
    v = cfg.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SourceError(f"{where}: '{key}' is missing or not a non-negative integer; fix the config")
    cap = FACT_CAPS.get(key, FACT_CAP_DEFAULT)
    if v > cap:
        raise SourceError(f"{where}: '{key}' = {v} is beyond any real model (cap {cap}); fix the config")
    return v


def facts_from_hf_config(cfg: Mapping[str, Any], where: str = "config.json") -> dict:
    """Facts from a parsed HF config.json (llama, mistral, mixtral, qwen2, qwen3, qwen3_moe)."""
    arch = cfg.get("model_type")
    if arch not in SUPPORTED_ARCHS:
        raise SourceError(
            f"{where}: model_type {escape_name(str(arch))!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHS)}"
        )
    hidden = _need(cfg, "hidden_size", where)
    heads = _need(cfg, "num_attention_heads", where)
    kv = cfg.get("num_key_value_heads")
    kv_heads = heads if kv is None else _need(cfg, "num_key_value_heads", where)
    hd = cfg.get("head_dim")
    head_dim = (hidden // heads if heads else 0) if hd is None else _need(cfg, "head_dim", where)
    intermediate = _need(cfg, "intermediate_size", where)
    n_exp = cfg.get("num_experts", cfg.get("num_local_experts")) or 0
    if arch in ("qwen3_moe", "mixtral"):
        n_exp = _need({"n": n_exp}, "n", where + " (num_experts/num_local_experts)")
        used = _need(cfg, "num_experts_per_tok", where)
        moe = _need(cfg, "moe_intermediate_size", where) if arch == "qwen3_moe" else intermediate
    else:
        n_exp, used, moe = 0, 0, 0
    n_layers = _need(cfg, "num_hidden_layers", where)
    if n_layers * max(1, n_exp) > MAX_EXPERT_SLICES:
        raise SourceError(f"{where}: {n_layers} layers x {n_exp} experts is beyond any real model; fix the config")
    return {
        "arch": arch,
        "n_layers": n_layers,
        "hidden": hidden,
        "intermediate": intermediate,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab": _need(cfg, "vocab_size", where),
        "n_experts": int(n_exp),
        "n_experts_used": int(used),
        "moe_intermediate": int(moe),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }


def facts_from_gguf_kv(kv: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]], where: str) -> dict:
    """Facts from GGUF metadata (``kv``: key -> scalar or list) and tensor shapes (numpy order)."""
    garch = kv.get("general.architecture")
    arch = GGUF_ARCH_TO_ARCH.get(garch) if isinstance(garch, str) else None
    if arch is None:
        raise SourceError(
            f"{where}: GGUF architecture {escape_name(str(garch))!r} is not supported; "
            f"supported: {', '.join(sorted(GGUF_ARCH_TO_ARCH))}"
        )

    def get(key: str, default: Any = None) -> Any:
        return kv.get(f"{garch}.{key}", default)

    def need(key: str) -> int:
        return _need({key: get(key)}, key, f"{where}: {garch}")

    hidden = need("embedding_length")
    heads = need("attention.head_count")
    kv_heads = get("attention.head_count_kv", heads)
    head_dim = get("attention.key_length") or (hidden // heads if heads else 0)
    n_exp = int(get("expert_count", 0) or 0)
    used = int(get("expert_used_count", 0) or 0)
    ff = int(get("feed_forward_length", 0) or 0)
    moe = int(get("expert_feed_forward_length", 0) or 0) or (ff if n_exp else 0)
    if "token_embd.weight" in tensor_shapes:
        vocab = int(tensor_shapes["token_embd.weight"][0])
    elif get("vocab_size") is not None:
        vocab = int(get("vocab_size"))
    else:
        vocab = len(kv.get("tokenizer.ggml.tokens") or ())
    if arch == "llama" and n_exp:
        arch = "mixtral"
    return {
        "arch": arch,
        "n_layers": need("block_count"),
        "hidden": hidden,
        "intermediate": ff,
        "heads": heads,
        "kv_heads": int(kv_heads),
        "head_dim": int(head_dim),
        "vocab": vocab,
        "n_experts": n_exp if n_exp else 0,
        "n_experts_used": used if n_exp else 0,
        "moe_intermediate": moe,
        "tie_word_embeddings": "output.weight" not in tensor_shapes,
    }


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


def model_facts(source_or_config: Any) -> dict:
    """Facts from a Source, an HF config dict, a config.json path, a model folder or a .gguf path."""
    obj = source_or_config
    if isinstance(obj, (str, Path)):
        p = Path(obj)
        if p.is_dir() or p.name == "config.json":
            cfg_path = p / "config.json" if p.is_dir() else p
            return facts_from_hf_config(load_hf_config(cfg_path), escape_name(str(cfg_path)))
        from .open import open_source

        src = open_source(p)
        try:
            return model_facts(src)
        finally:
            src.close()
    if isinstance(obj, Mapping):
        if set(FACT_KEYS) <= set(obj):
            return {k: obj[k] for k in FACT_KEYS}
        return facts_from_hf_config(obj)
    cfg = getattr(obj, "config", None)
    if cfg is None:
        root = escape_name(str(getattr(obj, "root", "source")))
        raise SourceError(f"{root}: no config.json next to the weights; put the model's config.json beside them (orkpack build --no-plan places by rules without one)")
    if getattr(obj, "kind", None) == "gguf":
        return {k: cfg[k] for k in FACT_KEYS}
    return facts_from_hf_config(cfg, escape_name(str(getattr(obj, "root", "config.json"))))
