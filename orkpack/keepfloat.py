"""The one rule for what always stays float: the tensors no placement quantizes or sends to the NPU.

Used by every path that places tensors: the planner never makes them items (orkpack/tiers/manifest.py),
``--no-plan`` keeps them float (orkpack/build/placement.py ``RulePlacement``), and a ``--tiermap`` that quantizes
one is overruled with a warning (``TierMapPlacement``). They are written in their source float type on
the host. Pins do not change them (``--int8``/``--nf4``/``--npu`` on them alone is a warning), the way
llama.cpp's quantizer keeps these tensors whatever its per-tensor type overrides say.

Non-float tensors (integers, bool, f64, c64) are a different matter: they are carried raw
(``orkpack.build.placement.raw_decision``), before this rule is asked.
"""
from __future__ import annotations

from . import globs
from .archs import FAMILIES
from .errors import escape_name

# convolution kernels the architecture entries declare (orkpack/archs.py ``Family.conv_kernels``: LFM2's
# blk.N.shortconv.conv.weight, 2-D once squeezed as the converter lays it out, 3-D (H, 1, Lc) in the checkpoint)
CONV_KERNELS: tuple[str, ...] = tuple(dict.fromkeys(g for f in FAMILIES.values() for g in f.conv_kernels))

# (what it is, canonical-name globs; None: by rank). A tensor stays float when any row matches.
ALWAYS_FLOAT: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    # norms, 1-D biases, gpt-oss's attention sinks (blk.N.attn_sinks), scalars, 4-D convolution kernels
    # (SigLIP's patch embedding): not a matrix (2-D) or a stack of expert matrices (3-D)
    ("not a matrix", None),
    # added, not multiplied, whatever the rank: gpt-oss's stacked expert biases [E, N]
    # (blk.N.ffn_gate_up_exps.bias, blk.N.ffn_down_exps.bias), DeepSeek-V3's exp_probs_b.bias
    ("a bias", ("*.bias", "*_bias")),
    # MoE routers (and Qwen2-MoE's shared-expert gate): tiny, and a quantized router can pick other
    # experts; llama.cpp never quantizes ffn_gate_inp either
    ("an MoE router", ("*.ffn_gate_inp.*", "*.ffn_gate_inp_*")),
    # a convolution's taps, declared by its family whatever its rank (never an expert stack): slid along time
    # per channel, not a matmul; tiny, and llama.cpp's quantizer keeps shortconv.conv / ssm_conv1d float too
    ("a convolution kernel", CONV_KERNELS),
)
ROUTER = ALWAYS_FLOAT[2][0]  # the planner still prices a router's matmul at prefill (tiers/solver.py)

# the globs recorded in a tier map's options ("default_keep"); tensors of rank other than 2 and 3 besides
FLOAT_GLOBS: tuple[str, ...] = tuple(g for _, gl in ALWAYS_FLOAT if gl for g in gl)


def why_float(name: str, shape) -> str | None:
    """Why the float tensor ``name`` of ``shape`` always stays float (a row of ALWAYS_FLOAT), or None."""
    for what, gl in ALWAYS_FLOAT:
        if gl is None:
            if len(shape) not in (2, 3):
                return what
        elif any(globs.matches(name, g) for g in gl):
            return what
    return None


def stays_float(name: str, shape) -> bool:
    return why_float(name, shape) is not None


def pin_warnings(pins: dict[str, list[str]], tensors) -> list[str]:
    """One warning per --int8/--nf4/--npu glob that matches only always-float tensors (``tensors``:
    (name, shape) pairs of the float tensors): the pin changes nothing, say so."""
    out = []
    for kind in ("int8", "nf4", "npu"):
        for g in pins.get(kind) or ():
            hit = [(n, s) for n, s in tensors if globs.matches(n, g) or globs.matches(f"{n}[0]", g)]
            if hit and all(stays_float(n, s) for n, s in hit):
                n, s = hit[0]
                out.append(f"--{kind} {escape_name(g)!r} matches only tensors that always stay float (e.g. "
                           f"{escape_name(n)}: {why_float(n, s)}); the pin does not apply to them")
    return out
