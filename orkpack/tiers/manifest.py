"""Model manifests without weights: tensor names, shapes and dtypes, and the items the solver places.

A :class:`Manifest` comes from an HF ``config.json`` alone (the tensor list is
computed from the architecture facts, exactly as the safetensors reader would
list it: HF names canonicalized by ``orkpack.sources.names``, per-expert HF
tensors stacked to ``blk.N.ffn_{gate,up,down}_exps.weight`` of shape
``(E, N, K)``), or from the headers of real weights (an HF folder, one
``.safetensors`` file, a ``.gguf``) through ``orkpack.sources.open_source``.
No tensor data is read. Tensors are listed in natural name order, so the same
model gives the same manifest from either path.

An *item* is what the solver places: a 2-D tensor, or one expert slice of a
stacked 3-D tensor. Its key is ``(tensor name, expert index or None)``; its
display name is ``name`` or ``name[e]``. Tensors of other ranks (norms, biases)
are always float on the host.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OrkError, escape_name
from ..sources import names as _names
from ..sources.config import facts_from_hf_config, load_hf_config

FLOAT_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}
_TORCH_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
KV_TYPES = ("f16", "q8_0")


@dataclass(frozen=True)
class TensorEntry:
    name: str  # canonical
    shape: tuple[int, ...]  # numpy order
    dtype: str  # source dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def float_bytes(self) -> int:
        """Bytes of this tensor kept float (source float dtype; quantized GGUF types widen to f32)."""
        return self.numel * FLOAT_ITEMSIZE.get(self.dtype, 4)


@dataclass(frozen=True)
class Item:
    tensor: str  # canonical tensor name (the stacked name for experts)
    expert: int | None
    n: int  # rows = output channels
    k: int  # columns = input features
    dtype: str
    role: str  # "matmul", "expert", "router", "embedding", "output"
    layer: int | None
    n_experts: int = 0  # experts in this item's layer (role "expert")
    n_experts_used: int = 0

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.tensor, self.expert)

    @property
    def name(self) -> str:
        return self.tensor if self.expert is None else f"{self.tensor}[{self.expert}]"

    @property
    def numel(self) -> int:
        return self.n * self.k

    @property
    def float_bytes(self) -> int:
        return self.numel * FLOAT_ITEMSIZE.get(self.dtype, 4)


@dataclass
class Manifest:
    facts: dict
    tensors: list[TensorEntry]
    origin: str  # "config" or the source kind ("safetensors", "gguf")
    source: str  # file name shown to people (no directories)
    items: list[Item] = field(default_factory=list)
    floats: list[TensorEntry] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tensors = sorted(self.tensors, key=lambda t: _names.natural_key(t.name))
        self.items, self.floats = _items(self.tensors, self.facts)

    @property
    def arch(self) -> str:
        return self.facts["arch"]

    def kv_bytes(self, ctx: int, kv_type: str = "f16") -> int:
        """KV cache bytes for ``ctx`` positions: K and V, every layer, kv_heads x head_dim per position.

        f16: 2 bytes an element; q8_0: blocks of 32 elements in 34 bytes (fp16 scale + 32 int8).
        """
        if kv_type not in KV_TYPES:
            raise OrkError(f"--kv-type {escape_name(str(kv_type))!r} is not supported; use one of {', '.join(KV_TYPES)}")
        if ctx <= 0:
            raise OrkError(f"--ctx must be a positive number of tokens (got {ctx})")
        f = self.facts
        row = f["kv_heads"] * f["head_dim"]
        per = 2 * row if kv_type == "f16" else 34 * (-(-row // 32))
        return 2 * f["n_layers"] * ctx * per

    def summary(self) -> dict:
        return {"source": self.source, "origin": self.origin, **self.facts,
                "tensors": len(self.tensors), "items": len(self.items)}


def _role(name: str, ndim: int, facts: dict) -> str:
    if name == "token_embd.weight":
        return "embedding"
    if name == "output.weight":
        return "output"
    if ".ffn_gate_inp." in name:
        return "router"
    if ndim == 3 and _names.is_stacked_experts(name):
        return "expert"
    return "matmul"


def _layer(name: str) -> int | None:
    if name.startswith("blk."):
        try:
            return int(name.split(".")[1])
        except ValueError:
            return None
    return None


def _items(tensors: list[TensorEntry], facts: dict) -> tuple[list[Item], list[TensorEntry]]:
    items: list[Item] = []
    floats: list[TensorEntry] = []
    for t in tensors:
        if len(t.shape) == 2:
            items.append(Item(t.name, None, t.shape[0], t.shape[1], t.dtype, _role(t.name, 2, facts), _layer(t.name)))
        elif len(t.shape) == 3:
            e_count, n, k = t.shape
            role = _role(t.name, 3, facts)
            for e in range(e_count):
                items.append(Item(t.name, e, n, k, t.dtype, role, _layer(t.name),
                                  int(facts.get("n_experts") or e_count), int(facts.get("n_experts_used") or 0)))
        else:
            floats.append(t)
    return items, floats


# ---------------------------------------------------------------------------------------------- config -> tensors

def hf_tensor_list(cfg: dict, where: str = "config.json") -> tuple[dict, list[tuple[str, tuple[int, ...]]]]:
    """(facts, [(HF name, shape)]) an HF checkpoint with this config holds, in no particular order."""
    f = facts_from_hf_config(cfg, where)
    arch, H, L, V = f["arch"], f["hidden"], f["n_layers"], f["vocab"]
    hd, nh, nkv = f["head_dim"], f["heads"], f["kv_heads"]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (V, H)), ("model.norm.weight", (H,))]
    if not f["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, H)))
    sparse_step = int(cfg.get("decoder_sparse_step", 1) or 1)
    mlp_only = set(cfg.get("mlp_only_layers") or ())
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (H,)), (p + "post_attention_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (nh * hd, H)), (p + "self_attn.k_proj.weight", (nkv * hd, H)),
                (p + "self_attn.v_proj.weight", (nkv * hd, H)), (p + "self_attn.o_proj.weight", (H, nh * hd))]
        if arch == "qwen2" or cfg.get("attention_bias"):
            out += [(p + "self_attn.q_proj.bias", (nh * hd,)), (p + "self_attn.k_proj.bias", (nkv * hd,)),
                    (p + "self_attn.v_proj.bias", (nkv * hd,))]
        if arch in ("qwen3", "qwen3_moe"):
            out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
        E, I, Im = f["n_experts"], f["intermediate"], f["moe_intermediate"]
        moe_layer = E > 0 and i not in mlp_only and (i + 1) % sparse_step == 0
        if arch == "mixtral":
            q = p + "block_sparse_moe."
            out.append((q + "gate.weight", (E, H)))
            for e in range(E):
                out += [(q + f"experts.{e}.w1.weight", (Im, H)), (q + f"experts.{e}.w3.weight", (Im, H)),
                        (q + f"experts.{e}.w2.weight", (H, Im))]
        elif moe_layer:
            q = p + "mlp."
            out.append((q + "gate.weight", (E, H)))
            for e in range(E):
                out += [(q + f"experts.{e}.gate_proj.weight", (Im, H)), (q + f"experts.{e}.up_proj.weight", (Im, H)),
                        (q + f"experts.{e}.down_proj.weight", (H, Im))]
        else:
            q = p + "mlp."
            out += [(q + "gate_proj.weight", (I, H)), (q + "up_proj.weight", (I, H)), (q + "down_proj.weight", (H, I))]
    return f, out


def manifest_from_config(cfg: dict, source: str = "config.json") -> Manifest:
    """The manifest an HF checkpoint with this config.json would give, from the config alone."""
    facts, hf = hf_tensor_list(cfg, source)
    dtype = _TORCH_DTYPE.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))), "BF16")
    L = facts["n_layers"]
    stacked: dict[str, dict[int, tuple[int, ...]]] = {}
    tensors: list[TensorEntry] = []
    for hf_name, shape in hf:
        name = _names.canonical_name(hf_name, facts["arch"], L)
        sp = _names.split_expert(name)
        if sp is not None:
            stacked.setdefault(sp[0], {})[sp[1]] = shape
        else:
            tensors.append(TensorEntry(name, tuple(shape), dtype))
    for name, per in stacked.items():
        shape = per[0]
        tensors.append(TensorEntry(name, (len(per),) + tuple(shape), dtype))
    return Manifest(facts, tensors, "config", source)


def manifest_from_path(path: str | Path) -> Manifest:
    """A manifest from config.json, an HF folder, a .safetensors file or a .gguf (headers only).

    A folder with weights is read through its headers; a folder holding only
    config.json (or the config.json path itself) is planned from the config.
    """
    p = Path(path)
    if not p.exists():
        raise OrkError(f"{escape_name(str(p))}: no such file or folder; give config.json, a model folder, "
                       "a .safetensors or a .gguf file")
    if p.is_file() and p.suffix == ".json":
        return manifest_from_config(_load_json(p), _shown(p))
    if p.is_dir() and (p / "config.json").is_file() and not any(p.glob("*.safetensors")):
        return manifest_from_config(_load_json(p / "config.json"), _shown(p / "config.json"))
    from ..sources.config import model_facts
    from ..sources.open import open_source

    src = open_source(p)
    try:
        infos = src.tensors()
        facts = model_facts(src)
        tensors = [TensorEntry(t.name, tuple(int(d) for d in t.shape), t.dtype) for t in infos]
        return Manifest(facts, tensors, src.kind, p.name)
    finally:
        src.close()


def _shown(p: Path) -> str:
    """A config's name for people: its folder and file name (never the whole path)."""
    p = p.resolve()
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def _load_json(p: Path) -> dict:
    return load_hf_config(p)
