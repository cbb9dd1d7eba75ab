"""The one rule for what always stays float: the tensors no placement quantizes or sends to the NPU.

Used by every path that places tensors: the planner never makes them items (orkpack/tiers/manifest.py),
``--no-plan`` keeps them float (orkpack/build/placement.py ``RulePlacement``), and a ``--tiermap`` that quantizes
one is overruled with a warning (``TierMapPlacement``). They are written in their source float type on
the host. Pins do not change them (``--int8``/``--nf4``/``--npu`` on them alone is a warning), the way
llama.cpp's quantizer keeps these tensors whatever its per-tensor type overrides say.

What is a matrix, a stack of expert matrices, or neither is this rule's too (:func:`is_expert_stack`): a
2-D tensor is a matrix; a 3-D tensor is a stack of expert matrices (one slice per expert, each placed on
its own) only when its canonical name is one, ``blk.N.ffn_{gate,up,down,gate_up}_exps.weight``: the name
the readers give the experts an architecture declares (orkpack/archs.py: per-expert HF tensors stacked on
read, gpt-oss's and granitemoe's stacked tensors renamed; tests/test_archs.py checks every entry), and the
name a GGUF stores them under, so also the only sign of experts in an architecture orkpack has no entry
for. Every other tensor stays float, whatever its rank: a 3-D tensor is not taken for experts for its
rank alone (Qwen3.5's ``linear_attn.conv1d.weight`` [channels, 1, kernel] is a convolution kernel).
The build, the planner, the tier-map check and the statistics ask these functions, never the rank.

Non-float tensors (integers, bool, f64, c64) are a different matter: they are carried raw
(``orkpack.build.placement.raw_decision``), before this rule is asked.
"""
from __future__ import annotations

from . import globs
from .archs import FAMILIES
from .errors import escape_name
from .sources.names import is_stacked_experts

# convolution kernels, of any rank (llama.cpp's converter keeps them F32 and its quantizer never quantizes
# them): Mamba's, Jamba's, Qwen3-Next's and Qwen3.5's ssm_conv1d (Kimi-Linear's ssm_conv1d_{q,k,v}), LFM2's
# shortconv.conv, 2-D in a GGUF (the converter drops the 1-wide axis); under the Hugging Face names of an
# architecture orkpack has no entry for (3-D [channels, 1, kernel]): mixer.conv1d / linear_attn.conv1d
# (q_conv1d, ...) and LFM2's conv.conv. Weights only: a convolution's bias is a bias
# and the kernels the architecture entries declare (orkpack/archs.py ``Family.conv_kernels``: LFM2's
# blk.N.shortconv.conv.weight, 2-D once squeezed as the converter lays it out, 3-D (H, 1, Lc) in the checkpoint)
CONV_KERNELS: tuple[str, ...] = tuple(dict.fromkeys(g for f in FAMILIES.values() for g in f.conv_kernels))
CONV_GLOBS: tuple[str, ...] = tuple(dict.fromkeys(("*conv1d.weight", "*ssm_conv1d_?.weight", "*shortconv.conv.weight",
                                                  "*.conv.conv.weight") + CONV_KERNELS))
CONV = "a convolution kernel"
# Mamba2's per-head A (blk.N.ssm_a, the converter's -exp(A_log)) and D (ssm_d), (H, 1) in a GGUF, and its grouped
# gated norm (ssm_norm.weight, (G, D / G)): 2-D as the converter lays them out, but gains and per-head scalars, not
# matrices; llama.cpp's quantizer never quantizes them either (only names ending in "weight", never "_norm.weight")
SSM = "a state-space parameter (A, D, the gated norm)"
SSM_GLOBS: tuple[str, ...] = ("*.ssm_a", "*.ssm_d", "*.ssm_norm.weight")
# RWKV's time-mix LoRA factors (decay w1/w2, in-context rate a1/a2, value residual v1/v2, gate g1/g2): 2-D, but
# llama.cpp's quantizer never quantizes them (src/llama-quant.cpp names each); small beside the projections
LORA = "an RWKV time-mix LoRA factor"
LORA_GLOBS: tuple[str, ...] = tuple(f"*.time_mix_{c}{j}.weight" for c in "wavg" for j in (1, 2))
ROUTER = "an MoE router"  # the planner still prices a router's matmul at prefill (tiers/solver.py)

# (what it is, canonical-name globs; None: by rank). A tensor stays float when any row matches; the first
# row that does says why.
ALWAYS_FLOAT: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    (CONV, CONV_GLOBS),
    # norms, 1-D biases, gpt-oss's attention sinks (blk.N.attn_sinks), scalars, 4-D convolution kernels
    # (SigLIP's patch embedding), 3-D tensors not named as experts: not a matrix (2-D) or a stack of expert
    # matrices (is_expert_stack)
    ("not a matrix or a stack of expert matrices", None),
    # added, not multiplied, whatever the rank: gpt-oss's stacked expert biases [E, N]
    # (blk.N.ffn_gate_up_exps.bias, blk.N.ffn_down_exps.bias), DeepSeek-V3's exp_probs_b.bias
    ("a bias", ("*.bias", "*_bias")),
    # MoE routers (and Qwen2-MoE's shared-expert gate): tiny, and a quantized router can pick other
    # experts; llama.cpp never quantizes ffn_gate_inp either
    (ROUTER, ("*.ffn_gate_inp.*", "*.ffn_gate_inp_*")),
    (SSM, SSM_GLOBS),
    (LORA, LORA_GLOBS),
)

# the globs recorded in every tier map's options ("default_keep"); tensors that are not a matrix or a stack
# of expert matrices besides. The convolution kernels' globs are recorded by the maps of models that have
# one (:func:`recorded_globs`), so that the map of any other model reads as it did before they were a row
FLOAT_GLOBS: tuple[str, ...] = tuple(g for what, gl in ALWAYS_FLOAT if gl and what not in (CONV, SSM, LORA) for g in gl)


def is_expert_stack(name: str, shape) -> bool:
    """Whether the float tensor ``name`` (canonical) of ``shape`` is a stack of expert matrices [E, N, K],
    placed and written as E slices of [N, K]: a 3-D tensor under an expert name (module docstring).
    Any other 3-D tensor is not; it stays float (:func:`why_float`) and is written as one slice."""
    return len(shape) == 3 and is_stacked_experts(name)


def why_float(name: str, shape) -> str | None:
    """Why the float tensor ``name`` of ``shape`` always stays float (a row of ALWAYS_FLOAT), or None."""
    for what, gl in ALWAYS_FLOAT:
        if gl is None:
            if len(shape) != 2 and not is_expert_stack(name, shape):
                return what
        elif globs.matches_any(name, gl):
            return what
    return None


def recorded_globs(names, shapes=None) -> tuple[str, ...]:
    """The globs a tier map of the model with these tensor ``names`` records as its options' "default_keep":
    FLOAT_GLOBS, the convolution kernels' when a tensor is one, the state-space parameters' when one of them
    is 2-D, RWKV's LoRA factors' when the model has one (``shapes``: the tensors' shapes in the same order; a 1-D one stays float by its rank alone)."""
    names = list(names)
    conv = any(globs.matches_any(n, CONV_GLOBS) for n in names)
    ssm = shapes is not None and any(len(s) == 2 and globs.matches_any(n, SSM_GLOBS) for n, s in zip(names, shapes))
    lora = any(globs.matches_any(n, LORA_GLOBS) for n in names)
    return FLOAT_GLOBS + (CONV_GLOBS if conv else ()) + (SSM_GLOBS if ssm else ()) + (LORA_GLOBS if lora else ())


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
