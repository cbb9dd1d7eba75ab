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
stack of expert matrices (a 3-D tensor under an expert name, ``keepfloat.is_expert_stack``).
Its key is ``(tensor name, expert index or None)``; its display name is ``name`` or
``name[e]``. What always stays float on the host (tensors that are neither, biases of
any rank, MoE routers, convolution kernels: orkpack/keepfloat.py) is never an item.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OrkError, escape_name
from ..sources import names as _names
import numpy as np

from .. import archs
from ..keepfloat import is_expert_stack, stays_float
from ..pack import spec
from ..sources.base import RAW_DTYPES, is_raw
from ..sources.config import load_hf_config

FLOAT_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


def _itemsize(dtype: str) -> int:
    """Bytes an element of a tensor kept as it is: float types as stored (quantized types widen to f32),
    raw types (integers, bool, f64, c64) as their own element."""
    if is_raw(dtype):
        return np.dtype(spec.RAW_DTYPES[RAW_DTYPES[dtype]]).itemsize
    return FLOAT_ITEMSIZE.get(dtype, 4)
_TORCH_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
KV_TYPES = ("f16", "q8_0")
VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.")
# integer and bool tensors (carried raw, never planned)
NON_FLOAT_DTYPES = frozenset(RAW_DTYPES)  # carried raw, never planned


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
        return self.numel * _itemsize(self.dtype)


@dataclass(frozen=True)
class Item:
    tensor: str  # canonical tensor name (the stacked name for experts)
    expert: int | None
    n: int  # rows = output channels
    k: int  # columns = input features
    dtype: str
    role: str  # "matmul", "expert", "embedding", "lookup" (another embedding table), "output", "vision" (an image
    # encoder)
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
        return self.numel * _itemsize(self.dtype)


def cache_bytes(facts: dict, ctx: int, kv_type: str = "f16") -> dict:
    """The runtime's per-sequence cache of a model with these facts (:meth:`Manifest.kv_bytes`): ``kv``, the KV cache
    of its attention layers for ``ctx`` positions (a parallel hybrid's recurrent layers with attention beside, facts
    ``parallel_layers``, included: archs.kv_layers); ``state``, the fixed-size state of a hybrid's recurrent layers
    (float32); ``all_attention``, the KV cache the same shape would need with every layer attention."""
    if kv_type not in KV_TYPES:
        raise OrkError(f"--kv-type {escape_name(str(kv_type))!r} is not supported; use one of {', '.join(KV_TYPES)}")
    if ctx <= 0:
        raise OrkError(f"--ctx must be a positive number of tokens (got {ctx})")

    def row(n: int) -> int:
        return 2 * n if kv_type == "f16" else 34 * (-(-n // 32))

    full = row(facts["kv_k"]) + row(facts["kv_v"])
    swa = set(facts.get("swa_layers") or ())
    # the sliding layers' own K/V widths where they differ (gemma4: 0 = the same as the other layers')
    slide = row(facts.get("swa_kv_k") or facts["kv_k"]) + row(facts.get("swa_kv_v") or facts["kv_v"])
    win = facts.get("swa_window") or 0
    kv, ffn = set(archs.kv_layers(facts)), set(facts.get("ffn_layers") or ())  # the layers with a KV cache
    shared = set(facts.get("kv_shared_layers") or ())  # they read an earlier layer's K/V and store none (gemma4)
    L = facts["n_layers"]
    per = [slide if i in swa else full for i in range(L)]
    span = [min(ctx, win) if (i in swa and win) else ctx for i in range(L)]
    # an FFN-only layer (Nemotron-H's MLP / MoE blocks) holds neither KV nor state, and would not with attention
    return {"kv": sum(per[i] * span[i] for i in range(L) if i in kv and i not in shared),
            "state": state_bytes(facts),
            "all_attention": sum(per[i] * span[i] for i in range(L) if i not in ffn and i not in shared),
            "kv_unshared": sum(per[i] * span[i] for i in range(L) if i in kv)}


@dataclass
class Manifest:
    facts: dict
    tensors: list[TensorEntry]
    origin: str  # "config" or the source kind ("safetensors", "gguf")
    source: str  # file name shown to people (no directories)
    items: list[Item] = field(default_factory=list)
    floats: list[TensorEntry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what a generic plan assumed
    source_warnings: list[str] = field(default_factory=list)  # about the source itself (a quantized GGUF)
    hub: dict | None = None  # where a hub model came from (orkpack/sources/hub.py Origin.recorded()), else None

    def __post_init__(self) -> None:
        self.tensors = sorted(self.tensors, key=lambda t: _names.natural_key(t.name))
        self.items, self.floats = _items(self.tensors, self.facts)

    @property
    def arch(self) -> str:
        return self.facts["arch"]

    def kv_bytes(self, ctx: int, kv_type: str = "f16") -> int:
        """KV cache bytes for ``ctx`` positions, laid out as the runtime (llama.cpp) allocates it.

        Per layer and position: ``kv_k`` + ``kv_v`` elements (GQA/MQA: kv_heads x head_dim
        each; MLA: the compressed latent kv_lora_rank + qk_rope_head_dim, no separate V).
        Sliding-window layers (``swa_layers``) hold at most ``swa_window`` positions, of ``swa_kv_k`` +
        ``swa_kv_v`` elements where the family gives them their own sizes (gemma4); layers that reuse an earlier
        layer's K/V (``kv_shared_layers``: gemma4's num_kv_shared_layers) hold none. A hybrid's recurrent
        layers (``recurrent_layers``: LFM2's short convolutions) hold no KV cache but a state of ``state``
        float32 elements for the sequence, whatever ``ctx`` (llama.cpp keeps recurrent state in f32); those that
        run attention beside the recurrence (``parallel_layers``: Falcon-H1's) hold both; its FFN-only layers
        (``ffn_layers``: Nemotron-H's MLP and MoE blocks) hold neither.
        f16: 2 bytes an element; q8_0: blocks of 32 elements in 34 bytes (fp16 scale + 32 int8),
        each of K and V padded to whole blocks.
        """
        c = cache_bytes(self.facts, ctx, kv_type)
        return c["kv"] + c["state"]

    def state_bytes(self) -> int:
        return state_bytes(self.facts)

    def kv_bytes_all_attention(self, ctx: int, kv_type: str = "f16") -> int:
        """What :meth:`kv_bytes` would be if every layer were an attention layer (a hybrid's saving is the
        difference)."""
        return cache_bytes(self.facts, ctx, kv_type)["all_attention"]

    def recorded_facts(self) -> dict:
        """The facts as a tier map records them: a hybrid's (``recurrent_layers``, ``state``) only for a hybrid,
        so the maps of every other model read as before hybrids were known."""
        f = dict(self.facts)
        if not f.get("recurrent_layers") and not f.get("state"):
            f.pop("recurrent_layers", None)
            f.pop("state", None)
            f.pop("recurrent_flops", None)
        if not f.get("parallel_layers"):
            f.pop("parallel_layers", None)
        if not f.get("ffn_layers"):
            f.pop("ffn_layers", None)
        for k in ("swa_kv_k", "swa_kv_v", "kv_shared_layers"):  # gemma4's; absent from every other model's map
            if not f.get(k):
                f.pop(k, None)
        return f

    def summary(self) -> dict:
        return {"source": self.source, "origin": self.origin, **self.facts,
                "tensors": len(self.tensors), "items": len(self.items)}


def _role(name: str, shape: tuple[int, ...], facts: dict) -> str:
    if name == "token_embd.weight":
        return "embedding"
    fam = archs.FAMILIES.get(facts.get("arch") or "")
    if fam is not None and name in fam.lookups:
        return "lookup"  # another embedding table (gemma4's per-layer embeddings): a row lookup, never a matmul
    if name == "output.weight":
        return "output"
    if name.startswith(VISION_PREFIXES):
        return "vision"  # runs once per image, not per prompt token
    if is_expert_stack(name, shape):
        return "expert"
    return "matmul"


def _layer(name: str) -> int | None:
    if name.startswith("blk."):
        try:
            return int(name.split(".")[1])
        except ValueError:
            return None
    return None


def _experts(first: Item, count: int):
    """The items of a stack's ``count`` experts: ``first`` but for the expert index, 0 .. count-1, equal to what
    ``Item(...)`` makes (the same fields, in the same order), made without the frozen dataclass's one
    ``object.__setattr__`` per field (a 30B MoE has 18,432 of them)."""
    fields, new, put, cls = first.__dict__, object.__new__, object.__setattr__, type(first)

    def one(e: int) -> Item:
        it = new(cls)
        put(it, "__dict__", {**fields, "expert": e})
        return it

    return map(one, range(count))


def _items(tensors: list[TensorEntry], facts: dict) -> tuple[list[Item], list[TensorEntry]]:
    items: list[Item] = []
    floats: list[TensorEntry] = []
    for t in tensors:
        if t.dtype in NON_FLOAT_DTYPES or stays_float(t.name, t.shape):
            floats.append(t)  # integer buffers (raw); what the one float rule keeps (orkpack/keepfloat.py)
        elif len(t.shape) == 2:
            items.append(Item(t.name, None, t.shape[0], t.shape[1], t.dtype, _role(t.name, t.shape, facts),
                              _layer(t.name)))
        elif is_expert_stack(t.name, t.shape):
            e_count, n, k = t.shape
            role, layer = _role(t.name, t.shape, facts), _layer(t.name)
            n_exp, n_used = int(facts.get("n_experts") or e_count), int(facts.get("n_experts_used") or 0)
            items.extend(_experts(Item(t.name, 0, n, k, t.dtype, role, layer, n_exp, n_used), e_count))
        else:
            floats.append(t)
    return items, floats


# ---------------------------------------------------------------------------------------------- config -> tensors

def hf_tensor_list(cfg: dict, where: str = "config.json") -> tuple[dict, list[tuple[str, tuple[int, ...]]]]:
    """(facts, [(HF name, shape)]) an HF checkpoint with this config holds (``orkpack.archs``), per expert."""
    facts, tensors = archs.hf_tensors(cfg, where)
    return facts, [(name, shape) for name, shape, _ in tensors]


def state_bytes(facts: dict) -> int:
    """A hybrid's recurrent state for one sequence: ``state`` float32 elements per recurrent layer (0 for every
    other model); part of :meth:`Manifest.kv_bytes`, whatever the context."""
    return 4 * int(facts.get("state") or 0) * len(facts.get("recurrent_layers") or ())


def manifest_from_config(cfg: dict, source: str = "config.json") -> Manifest:
    """The manifest an HF checkpoint with this config.json would give, from the config alone."""
    runs: dict[int, tuple[int, str]] = {}
    facts, hf = archs.hf_tensors(cfg, source, expert_runs=runs)
    dtype = _TORCH_DTYPE.get(str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))), "BF16")
    L = archs.layers_in_config(cfg) or facts["n_layers"]
    stacked: dict[str, dict[int, tuple[int, ...]]] = {}
    tensors: list[TensorEntry] = []
    per_expert: dict[tuple[str, str], str | None] = {}  # (before, after the expert index) -> stacked name

    def stacked_of(head: str, rest: str, hf_name: str) -> str | None:
        if (head, rest) not in per_expert:
            e = _names.hf_expert(hf_name)
            per_expert[(head, rest)] = None if e is None else f"blk.{e[0]}.ffn_{e[2]}_exps.weight"
        return per_expert[(head, rest)]

    j = 0
    while j < len(hf):
        run = runs.get(j)
        if run is not None:  # a stack's experts in one run: parsed as one, as the loop below parses each
            count, pattern = run
            before, _, after = pattern.partition("{e}")
            if before.endswith(".experts.") and before.count(".experts.") == 1 and after.startswith(".") \
                    and "{e}" not in after:
                run_name = stacked_of(before[: -len(".experts.")], after[1:], hf[j][0])
                if run_name is not None:
                    stacked.setdefault(run_name, {}).update(
                        (e, (shape, hf_name)) for e, (hf_name, shape, _) in enumerate(hf[j: j + count]))
                    j += count
                    continue
        hf_name, shape, _ = hf[j]
        j += 1
        # a per-expert HF name (``...experts.E.gate_proj.weight``): its stacked tensor and index, exactly as
        # canonical_name + split_expert give them, parsed once per projection rather than once per expert
        head, _, tail = hf_name.partition(".experts.")
        idx, _, rest = tail.partition(".")
        stacked_name = stacked_of(head, rest, hf_name) if idx.isascii() and idx.isdigit() else None
        if stacked_name is not None:
            sp = (stacked_name, int(idx))
        elif (sp := archs.stacked_slice(hf_name, facts["arch"])) is not None:  # the converter's stacks (gemma3n)
            pass
        else:
            sp = _names.split_expert(name := _names.canonical_name(hf_name, facts["arch"], L))
        if sp is not None:
            stacked.setdefault(sp[0], {})[sp[1]] = (shape, hf_name)
        else:
            # as the converter lays it out: squeezed, reshaped, cut or renamed (archs.converter_layout), its value
            # changes' dtype (archs.converted_dtype)
            tensors.extend(TensorEntry(pc.name, pc.shape,
                                       archs.converted_dtype(facts["arch"], pc.name, archs.stored_dtype(cfg, hf_name, dtype)))
                           for pc in archs.converter_layout(cfg, name, tuple(shape), source))
    # what the converter stacks into one tensor and writes twice (archs converter_stacks / converter_copies)
    for sname, parts in archs.converter_stacks(cfg, [t.name for t in tensors]):
        got = [next(t for t in tensors if t.name == p) for p in parts]
        at = tensors.index(got[0])
        tensors = [t for t in tensors if t.name not in parts]
        tensors.insert(at, TensorEntry(sname, (len(got),) + tuple(got[0].shape), got[0].dtype))
    for new, old in archs.converter_copies(cfg, [t.name for t in tensors]):
        src = next(t for t in tensors if t.name == old)
        tensors.append(TensorEntry(new, tuple(src.shape), src.dtype))
    for name, per in stacked.items():
        shape, hf_name = per[0]
        tensors.append(TensorEntry(name, (len(per),) + tuple(shape), archs.stored_dtype(cfg, hf_name, dtype)))
    # what the converter computes from the config (gemma4's rope_freqs), as the reader lists it
    tensors.extend(TensorEntry(n, tuple(a.shape), "F32") for n, a in archs.generated_tensors(cfg, source).items())
    return Manifest(facts, tensors, "config", source)


def manifest_from_path(path) -> Manifest:
    """A manifest from config.json, an HF folder, a .safetensors file or a .gguf (headers only); or a hub name
    (``ORG/NAME``, ``ORG/NAME:FILE.gguf``) or a located one (orkpack/sources/hub.py), shown by its hub name.

    A folder with weights is read through its headers; a folder holding only
    config.json (or the config.json path itself) is planned from the config.
    """
    from ..sources.hub import locate

    loc = locate(path)
    man = _manifest_of(loc.path)
    if loc.origin is not None:
        man.source, man.hub = loc.origin.label, loc.origin.recorded()
    return man


def _manifest_of(p: Path) -> Manifest:
    if not p.exists():
        raise OrkError(f"{escape_name(str(p))}: no such file or folder; give config.json, a model folder, "
                       "a .safetensors or a .gguf file")
    if p.is_file() and p.suffix == ".json":
        return manifest_from_config(_load_json(p), _shown(p))
    if p.is_dir() and (p / "config.json").is_file() and not any(p.glob("*.safetensors")):
        return manifest_from_config(_load_json(p / "config.json"), _shown(p / "config.json"))
    from ..sources.open import model_facts, open_source

    src = open_source(p)
    try:
        infos = src.tensors()
        tensors = [TensorEntry(t.name, tuple(int(d) for d in t.shape), t.dtype) for t in infos]
        known = src.config is not None and (src.kind == "gguf" or archs.config_family(src.config))
        if known:
            facts, warnings = model_facts(src), []
        else:  # no entry for this architecture (or no config.json): the generic plan, said out loud
            cfg = src.config if src.kind != "gguf" else archs.gguf_generic_config(getattr(src, "metadata", {}))
            facts, warnings = archs.generic_facts(cfg, [t.source_name for t in infos], escape_name(p.name))
        quantized = getattr(src, "quantized_warning", lambda: None)()
        return Manifest(facts, tensors, src.kind, p.name, warnings=warnings,
                        source_warnings=[quantized] if quantized else [])
    finally:
        src.close()


def _shown(p: Path) -> str:
    """A config's name for people: its folder and file name (never the whole path)."""
    p = p.resolve()
    return f"{p.parent.name}/{p.name}" if p.parent.name else p.name


def _load_json(p: Path) -> dict:
    return load_hf_config(p)
