"""Tensor names: Hugging Face <-> GGUF, one canonical form.

Canonical names are GGUF-style (``blk.0.attn_q.weight``) because the runtime,
a llama.cpp backend, looks tensors up by GGUF name. The mapping itself is
each family's entry in :mod:`orkpack.archs`: its renames (fused tensors,
prefixes), then gguf-py's ``TensorNameMap`` for its GGUF architecture
(mistral and mixtral are ``llama`` in GGUF).

Experts. A GGUF MoE layer stores each projection as one stacked 3-D tensor
``blk.N.ffn_{gate,up,down}_exps.weight`` of numpy shape ``(E, N_out, K_in)``.
Hugging Face stores one 2-D tensor per expert
(``model.layers.N.mlp.experts.E.gate_proj.weight``, mixtral's
``model.layers.N.block_sparse_moe.experts.E.w1.weight``). Such a per-expert name
maps to the *expert-slice name* ``blk.N.ffn_gate.E.weight``: the GGUF base name
without ``_exps`` and with the expert index before ``.weight``. No real GGUF
tensor has that form, so it cannot collide; :func:`split_expert` turns it into
``("blk.N.ffn_gate_exps.weight", E)`` and :func:`expert_slice_name` goes back.
Readers list the stacked name (HF experts are stacked on read), so HF and GGUF
sources of one model list the same names and shapes.

Names the map does not know keep their source name unchanged.
"""
from __future__ import annotations

import re
from functools import lru_cache

from .. import archs as _archs
from ..archs import gguf  # gguf-py's name tables (loaded without the rest of gguf where it is not imported)

# HF model_types with an entry in orkpack.archs
SUPPORTED_ARCHS = _archs.SUPPORTED

_PROJ = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}
_HF_EXPERT = re.compile(
    r"^(?:model\.(?:language_model\.)?|backbone\.)?layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward|mixer)\.experts\.(\d+)\."
    r"(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$"
)
_SLICE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)\.(\d+)\.weight$")
_STACKED = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.weight$")


def expert_slice_name(layer: int, proj: str, expert: int) -> str:
    """``blk.{layer}.ffn_{proj}.{expert}.weight`` (proj: gate, up, down or gate_up)."""
    return f"blk.{layer}.ffn_{proj}.{expert}.weight"


def split_expert(name: str) -> tuple[str, int] | None:
    """An expert-slice name -> (stacked GGUF name, expert index); None otherwise."""
    m = _SLICE.match(name)
    if m is None:
        return None
    return f"blk.{m.group(1)}.ffn_{m.group(2)}_exps.weight", int(m.group(3))


def is_stacked_experts(name: str) -> bool:
    """True for ``blk.N.ffn_{gate,up,down,gate_up}_exps.weight``."""
    return _STACKED.match(name) is not None


def hf_expert(hf_name: str) -> tuple[int, int, str] | None:
    """A per-expert HF name -> (layer, expert, proj in gate/up/down); None otherwise."""
    m = _HF_EXPERT.match(hf_name)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), _PROJ[m.group(3)]


def canonical_name(hf_name: str, arch: str | None, n_layers: int) -> str:
    """The GGUF-style name of an HF tensor; names no rule knows (or unknown archs) come back unchanged."""
    e = hf_expert(hf_name)
    if e is not None:
        return expert_slice_name(e[0], e[2], e[1])
    got = _archs.canonical_name(hf_name, arch, int(n_layers))
    return hf_name if got is None else got


def _is_gguf_name(name: str, arch: str | None, n_layers: int) -> bool:
    fam = _archs.FAMILIES.get(arch) if arch else None
    if fam is None:
        return name.startswith("blk.") or name in ("token_embd.weight", "output.weight", "output_norm.weight")
    return name in _gguf_names(fam.gguf, int(n_layers)) or name.startswith("blk.")


@lru_cache(maxsize=64)
def _gguf_names(gguf_arch: str, n_layers: int) -> frozenset[str]:
    out = set()
    a = getattr(gguf.MODEL_ARCH, gguf_arch)
    for t in gguf.MODEL_TENSORS.get(a, ()):
        fmt = gguf.TENSOR_NAMES[t]
        for bid in range(n_layers) if "{bid}" in fmt else (None,):
            base = fmt.format(bid=bid) if bid is not None else fmt
            out.update((base, base + ".weight", base + ".bias"))
    return frozenset(out)


def normalize_name(any_name: str, arch: str | None, n_layers: int) -> str:
    """Canonical form of either an HF name or a GGUF name (GGUF and expert-slice names pass through)."""
    if _SLICE.match(any_name) or _is_gguf_name(any_name, arch, n_layers):
        return any_name
    return canonical_name(any_name, arch, n_layers)


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders embedded numbers numerically (blk.2 < blk.10)."""
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _DIGITS.split(name) if p != "")
    return parts, name
