"""The numbers a forward pass needs, from an HF config.json or a GGUF's metadata, resolved once.

The family's :class:`orkpack.archs.Forward` says which behaviours apply; this module reads the
values they need (epsilon, RoPE base and scaling, softcaps, multipliers, MoE routing options)
from either source kind, under one name each (:class:`Hparams`), and turns the weight layout
of the source into the forward pass's terms:

* HF folders hold the Hugging Face layout.
* GGUF files hold llama.cpp's converter layout: for families whose converter permutes the q/k
  rows (``Forward.gguf_permuted_qk``) RoPE rotates pairs (2i, 2i+1) instead of halves (the same
  attention scores: the permutation is the same for q and k); gemma's norm gains are stored as
  ``1 + w`` (``Forward.norm_offset`` is then 0).

GGUF keys are llama.cpp's (``{arch}.rope.freq_base``, ``.attention.layer_norm_rms_epsilon``, ...),
named (with their types and the defaults a reader takes) in the table :mod:`orkpack.ggufkeys`;
the scalar multipliers are stored as the value the graph applies: ``embedding_scale`` multiplies
the embeddings, ``residual_scale`` each block's output, ``attention.scale`` is the score scale,
``logit_scale`` divides the logits.

Anything this reference does not implement raises :class:`NotEvaluable`: one line naming it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .. import archs
from .. import ggufkeys as G
from ..errors import SourceError, escape_name


class NotEvaluable(SourceError):
    """The reference forward pass does not implement something this model needs (one line naming it)."""


# the config keys of the norm epsilon (one value, whichever norm the family has)
_EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "layer_norm_epsilon", "layernorm_epsilon", "norm_eps")
# Forward.embed_scale / residual_scale / attn_scale / logit_scale -> the llama.cpp key holding the applied value
_GGUF_SCALE = {"embed": G.EMBEDDING_SCALE, "residual": G.RESIDUAL_SCALE, "attn": G.ATTENTION_SCALE,
               "logit": G.LOGIT_SCALE}
_TABLE = object()  # from_gguf's get: the table's default


@dataclass
class Rope:
    """One RoPE: inverse frequencies (float32, one per rotated pair), cos/sin factor, rotated dims, style."""
    inv_freq: np.ndarray
    attn_factor: float
    dim: int
    style: str  # neox | interleaved
    params: dict = field(default_factory=dict)  # transformers-style: rope_type, rope_theta, factor, ...


@dataclass
class Hparams:
    arch: str
    fwd: archs.Forward
    layout: str  # hf | gguf
    n_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # q/k head (MLA: nope + rope)
    v_head_dim: int
    vocab: int
    eps: float
    norm_offset: float
    act: str
    rope: Rope | None  # None: no RoPE at all
    rope_swa: Rope | None  # gemma3's sliding layers
    rope_layers: set[int]  # layers that apply RoPE
    swa_window: int
    swa_layers: set[int]
    attn_scale: float
    attn_softcap: float
    final_softcap: float
    embed_scale: float
    residual_scale: float
    logit_scale: float  # logits are divided by it
    max_pos: int = 0  # the trained context (max_position_embeddings / context_length)
    swiglu: tuple[float, float] = (1.702, 7.0)  # swiglu_oai's (alpha, limit)
    n_experts: int = 0
    top_k: int = 0
    router: str = "softmax"  # softmax | sigmoid (the gate's scores)
    router_groups: str = ""  # "" | max | top2sum (archs.Forward.router_groups), active when n_group > 1
    router_norm: bool = False
    routed_scale: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    mla: dict = field(default_factory=dict)  # q_lora_rank, kv_lora_rank, nope, rope, v_head_dim
    blocks: tuple[str, ...] = ()  # a hybrid's block type per layer (archs.Blocks: "attn", "shortconv"); (): all attn
    ssm: dict = field(default_factory=dict)  # a hybrid's recurrent dims (archs Blocks.gguf_dims: ck, ds, ng, di ...)
    attn_temp: tuple[float, int] = (0.0, 0)  # Forward.attn_temp's (beta, length); beta 0: none
    head_dim_swa: int = 0  # gemma4: the sliding layers' own head size and KV heads (0: as the other layers')
    kv_heads_swa: int = 0
    kv_from: dict = field(default_factory=dict)  # gemma4: a KV-sharing layer -> the earlier layer whose K/V it reads
    per_layer: int = 0  # gemma4: the per-layer embedding width (0: none)
    per_layer_vocab: int = 0  # its rows where fewer than the vocabulary's (a token beyond reads row 0); 0: as many
    altup: tuple[int, int, bool] = (0, 0, False)  # gemma3n (Forward.altup): streams, the active one, whether the
    # corrected active stream is scaled (altup_correct_scale) before the per-layer input gate; 0 streams: no AltUp
    sparsity: dict = field(default_factory=dict)  # gemma3n (Forward.act_sparsity): layer -> its MLP gate's std
    # multiplier (the layers with a finite one)


def _num(v: Any, what: str, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SourceError(f"{where}: '{escape_name(what)}' = {escape_name(repr(v), 40)} is not a number; fix it")
    return float(v)


def _act(name: Any, where: str) -> str:
    table = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
             "gelu_fast": "gelu_tanh", "gelu_tanh": "gelu_tanh", "gelu": "gelu", "relu2": "relu2"}
    if name not in table:
        raise NotEvaluable(f"{where}: activation {escape_name(repr(name), 40)} is not evaluable yet "
                           f"(known: {', '.join(sorted(table))})")
    return table[name]


def _inv_freq(base: float, dim: int) -> np.ndarray:
    # as transformers computes it: float32 throughout
    return (np.float32(1.0) / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32)
                                                    / np.float32(dim)))).astype(np.float32)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _rope_from(params: Mapping[str, Any], dim: int, max_pos: int, style: str, where: str) -> Rope:
    """A RoPE from transformers-style parameters (rope_type, rope_theta, factor, ...)."""
    base = _num(params.get("rope_theta", 10000.0), "rope_theta", where)
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    inv = _inv_freq(base, dim)
    factor = params.get("factor")
    p = dict(params, rope_type=kind, rope_theta=base)
    if kind == "default":
        return Rope(inv, 1.0, dim, style, p)
    if kind == "proportional":  # gemma4's full layers: the first partial_rotary_factor of the pairs turn, at the
        # head's own frequencies; the others keep frequency 0 (transformers' _compute_proportional_rope_parameters)
        n = int(_num(params.get("partial_rotary_factor", 1.0), "partial_rotary_factor", where) * dim // 2)
        inv = np.concatenate([inv[:n], np.zeros(dim // 2 - n, np.float32)]).astype(np.float32)
        inv = (inv / np.float32(_num(factor or 1.0, "rope factor", where))).astype(np.float32)
        return Rope(inv, 1.0, dim, style, p)
    if kind == "linear":
        return Rope((inv / np.float32(_num(factor, "rope factor", where))).astype(np.float32), 1.0, dim, style, p)
    if kind == "dynamic" and params.get("alpha"):  # HunYuan's NTK-alpha: a static base (transformers' ntk_alpha)
        base = base * _num(params["alpha"], "rope alpha", where) ** (dim / (dim - 2))
        return Rope(_inv_freq(base, dim), 1.0, dim, style, dict(p, rope_type="ntk_alpha", rope_theta=base))
    if kind == "dynamic":  # NTK-aware: equals the default within max_position_embeddings (checked per run)
        return Rope(inv, 1.0, dim, style, p)
    if kind == "llama3":
        factor = _num(factor, "rope factor", where)
        lo, hi = _num(params["low_freq_factor"], "low_freq_factor", where), _num(params["high_freq_factor"],
                                                                                 "high_freq_factor", where)
        old = _num(params.get("original_max_position_embeddings", max_pos), "original_max_position_embeddings", where)
        wavelen = np.float32(2 * math.pi) / inv
        out = np.where(wavelen > old / lo, inv / np.float32(factor), inv).astype(np.float32)
        smooth = ((old / wavelen - lo) / (hi - lo)).astype(np.float32)
        smoothed = (1 - smooth) * out / np.float32(factor) + smooth * out
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return Rope(np.where(medium, smoothed, out).astype(np.float32), 1.0, dim, style, p)
    if kind == "yarn":
        factor = _num(factor, "rope factor", where)
        orig = _num(params.get("original_max_position_embeddings") or max_pos, "original_max_position_embeddings",
                    where)
        att = params.get("attention_factor")
        ms, msa = params.get("mscale"), params.get("mscale_all_dim")
        if att is None:
            att = _yarn_mscale(factor, ms) / _yarn_mscale(factor, msa) if ms and msa else _yarn_mscale(factor)
        beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

        def corr(rot: float) -> float:
            return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

        lo, hi = corr(beta_fast), corr(beta_slow)
        if params.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1).astype(np.float32)
        pos = np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))
        extra, inter = np.float32(1.0) / pos, np.float32(1.0) / (np.float32(factor) * pos)
        keep = np.float32(1) - ramp
        return Rope((inter * (1 - keep) + extra * keep).astype(np.float32), float(att), dim, style,
                    dict(p, original_max_position_embeddings=orig))
    raise NotEvaluable(f"{where}: RoPE scaling {escape_name(repr(kind), 40)} is not evaluable yet "
                       "(default, linear, dynamic, llama3 and yarn are)")


def _hf_rope_params(tc: Mapping[str, Any], which: str | None) -> dict:
    """transformers 5 ``rope_parameters`` (flat, or nested by layer type) or 4.x ``rope_theta`` + ``rope_scaling``."""
    rp = tc.get("rope_parameters")
    if isinstance(rp, Mapping) and rp:
        if "full_attention" in rp or "sliding_attention" in rp:
            sub = rp.get(which or "full_attention") or {}
            return dict(sub)
        return dict(rp)
    out: dict[str, Any] = {}
    if which == "sliding_attention":
        out["rope_theta"] = tc.get("rope_local_base_freq")
        return out if out["rope_theta"] is not None else {}
    if tc.get("rope_theta") is not None:
        out["rope_theta"] = tc["rope_theta"]
    rs = tc.get("rope_scaling")
    if isinstance(rs, Mapping):
        out.update(rs)
    return out


def _refuse(fam: archs.Family, tc: Mapping[str, Any], where: str) -> None:
    if fam.forward is None:
        raise NotEvaluable(f"{where}: architecture {fam.name} is not evaluable yet: the reference forward pass has "
                           "no declaration for it (orkpack/archs.py Forward)")
    for key, what in fam.forward.refuse:
        if tc.get(key):
            raise NotEvaluable(f"{where}: {what} is not evaluable yet ('{key}' is set)")


def from_config(cfg: Mapping[str, Any], where: str = "config.json") -> Hparams:
    """Hparams of an HF checkpoint (its parsed config.json)."""
    if isinstance(cfg, Mapping) and archs.config_family(cfg) is None:
        # (facts_from_config's line advises plan-from-weights, which is the planner's way out, not the eval's)
        raise NotEvaluable(f"{where}: model_type {escape_name(repr(cfg.get('model_type')), 60)} is not a known "
                           "architecture, and the reference forward pass (orkpack eval, orkpack imatrix) runs only the "
                           f"known ones ({len(archs.SUPPORTED)} families: orkpack/archs.py); it cannot run this "
                           "model. orkpack verify checks the pack without it")
    facts = archs.facts_from_config(cfg, where)
    fam = archs.FAMILIES[facts["arch"]]
    tc = archs._text_config(cfg, fam, where)
    _refuse(fam, tc, where)
    f = fam.forward
    d = archs.dims(cfg, where)

    def get(key: str, default: Any = None) -> Any:  # the config, else the family's defaults (archs)
        v = tc.get(key)
        if v is None:
            v = fam.defaults.get(key)
        return default if v is None else v

    eps = next((tc[k] for k in _EPS_KEYS if tc.get(k) is not None), 1e-6)
    act = _act(get(f.act_key, f.act), where) if f.act_key and tc.get(f.act_key) is not None else f.act
    H, L = d["H"], d["L"]
    mla = facts["attention"] == "mla"
    hd = d["hd"]
    max_pos = int(get("max_position_embeddings", 4096))
    style = "neox" if tc.get("rope_interleave") is False else f.rope
    params = _hf_rope_params(tc, "full_attention")
    params.setdefault("rope_theta", get("rope_theta", 10000.0))  # a family default (gemma3: 1e6) when unstated
    if f.rope_ratio:
        params["rope_theta"] = 10000.0 * _num(get("rope_ratio", 1.0), "rope_ratio", where)
    prf = params.get("partial_rotary_factor") or get("partial_rotary_factor", 1.0)
    rot = d["rope"] if mla else int(hd * _num(prf, "partial_rotary_factor", where))
    if params.get("rope_type") == "proportional":  # the whole head, unturned pairs at frequency 0
        rot = hd
    rope = _rope_from(params, rot, max_pos, style, where)
    rope_swa = None
    if f.swa_rope_base or f.swa_rope_unscaled:
        p2 = _hf_rope_params(tc, "sliding_attention")
        p2.setdefault("rope_theta", f.swa_rope_base or params["rope_theta"])
        rot2 = int(d["hs"] * _num(p2.get("partial_rotary_factor", 1.0), "partial_rotary_factor", where)) \
            if "hs" in d else rot  # gemma4: the sliding layers' own head size
        rope_swa = _rope_from(p2, rot2, max_pos, style, where)
    rope_layers = set(range(L))
    if f.rope_layers == "no_rope_layers":  # 1 = RoPE; transformers' default: every no_rope_layer_interval-th has none
        nrl = tc.get("no_rope_layers")
        every = int(get("no_rope_layer_interval", 4))
        rope_layers = {i for i, u in enumerate(nrl) if u} if isinstance(nrl, list) else \
            {i for i in range(L) if (i + 1) % every != 0}
    if f.rope_switch and tc.get(f.rope_switch) != "rope":  # granitemoehybrid: RoPE only when "rope"
        rope_layers = set()
    if f.rope_layers == "none":  # NoPE (Nemotron-H)
        rope_layers = set()
    window = int(get("sliding_window", 0) or 0)
    if f.window == "config":
        swa_window, swa_layers = window, set(range(L)) if window else set()
    else:
        swa_window, swa_layers = facts["swa_window"], set(facts["swa_layers"])
    if f.rope_layers == "swa" and swa_layers:  # exaone4: the full layers are NoPE when there are sliding ones
        rope_layers = set(swa_layers)

    def scale(spec: str, default: float) -> float:
        if not spec:
            return default
        v = tc.get(spec)
        return default if v is None else _num(v, spec, where)

    attn_scale = hd ** -0.5 if hd else 1.0  # hd 0: no attention (rwkv7)
    if f.attn_scale == "unit":
        attn_scale = 1.0
    elif f.attn_scale == "qpas":
        attn_scale = _num(get("query_pre_attn_scalar", hd), "query_pre_attn_scalar", where) ** -0.5
    elif f.attn_scale:
        attn_scale = scale(f.attn_scale, attn_scale)
    if mla and params.get("rope_type", params.get("type")) == "yarn" and params.get("mscale_all_dim"):
        m = _yarn_mscale(_num(params["factor"], "rope factor", where), params["mscale_all_dim"])
        attn_scale *= m * m
    embed = math.sqrt(H) if f.embed_scale == "sqrt_hidden" else scale(f.embed_scale, 1.0)
    if f.residual_scale == "depth":
        residual = _num(get("scale_depth", 1.0), "scale_depth", where) / math.sqrt(L)
    else:
        residual = scale(f.residual_scale, 1.0)
    if f.logit_scale == "dim_base":
        logit = H / _num(get("dim_model_base", H), "dim_model_base", where)
    else:
        logit = scale(f.logit_scale, 1.0)
    groups = f.router_groups and (f.router_groups != "max" or tc.get("topk_method") == "group_limited_greedy")
    return Hparams(
        arch=fam.name, fwd=f, layout="hf", n_layers=L, hidden=H, heads=d["nh"], kv_heads=d.get("nkf", d["nkv"]),
        head_dim=hd,
        v_head_dim=d["vhd"] if mla else hd, vocab=d["V"], eps=_num(eps, "rms_norm_eps", where),
        norm_offset=f.norm_offset, act=act, rope=rope, rope_swa=rope_swa, rope_layers=rope_layers,
        swa_window=swa_window, swa_layers=swa_layers, attn_scale=float(attn_scale),
        attn_softcap=_num(get("attn_logit_softcapping", 0.0), "attn_logit_softcapping", where),
        final_softcap=_num(get("final_logit_softcapping", 0.0), "final_logit_softcapping", where),
        embed_scale=float(embed), residual_scale=float(residual), logit_scale=float(logit), max_pos=max_pos,
        swiglu=(_num(get("swiglu_alpha", 1.702), "swiglu_alpha", where),
                _num(get("swiglu_limit", 7.0), "swiglu_limit", where)),
        n_experts=d["E"], top_k=d["top_k"], router=f.router, router_groups=f.router_groups if groups else "",
        router_norm=f.router_norm == "always" or bool(get("norm_topk_prob", False)),
        routed_scale=_num(get("routed_scaling_factor", 1.0), "routed_scaling_factor", where) if f.router_scale else 1.0,
        n_group=int(get("n_group", 1)) if groups else 1, topk_group=int(get("topk_group", 1)) if groups else 1,
        mla={"q_lora_rank": d["qlr"], "kv_lora_rank": d["kvlr"], "nope": d["nope"], "rope": d["rope"],
             "v_head_dim": d["vhd"]} if mla else {},
        blocks=tuple(archs.layer_blocks(cfg, where)) if fam.blocks is not None else (),
        ssm={dim: int(d[dim]) for dim, _ in fam.blocks.gguf_dims} if fam.blocks is not None else {},
        attn_temp=_attn_temp(f, params.get("llama_4_scaling_beta"), params.get("original_max_position_embeddings"),
                             where),
        head_dim_swa=int(d.get("hs", 0)), kv_heads_swa=int(d.get("nks", 0)),
        kv_from=_kv_from(L, facts), per_layer=int(d.get("hpl", 0)) if f.per_layer_input else 0,
        per_layer_vocab=int(d["Vpl"]) if f.per_layer_input and 0 < int(d.get("Vpl", 0)) < int(d["V"]) else 0,
        altup=(int(d["na"]), int(d["active"]), tc.get("altup_correct_scale", True) is not False) if f.altup
        else (0, 0, False),
        sparsity=_sparsity([archs.activation_sparsity_scale(x) for x in d["sparsity"]]) if f.act_sparsity else {},
    )


def _attn_temp(f: archs.Forward, beta: Any, length: Any, where: str) -> tuple[float, int]:
    """Forward.attn_temp's (beta, length), (0.0, 0) without one."""
    if not f.attn_temp or not beta:
        return 0.0, 0
    n = int(_num(length, "original_max_position_embeddings", where)) if length else 0
    if n <= 0:
        raise SourceError(f"{where}: the attention temperature needs a positive original_max_position_embeddings; "
                          "fix the config")
    return float(_num(beta, "llama_4_scaling_beta", where)), n


def _of_type(typ: str, v: Any) -> bool:
    """Whether a metadata value is of the GGUF type a key is read as (ggufkeys.Key.type); ints pass as floats."""
    if typ.startswith("array["):
        return isinstance(v, list) and all(_of_type(typ[6:-1], x) for x in v)
    if typ == "bool":
        return isinstance(v, bool)
    if typ == "string":
        return isinstance(v, str)
    if typ.startswith("float"):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, int) and not isinstance(v, bool)


def from_gguf(kv: Mapping[str, Any], facts: Mapping[str, Any], rope_freqs: np.ndarray | None, where: str,
              layout: str = "llama.cpp") -> Hparams:
    """Hparams of a GGUF: its metadata, the facts orkpack read from it and its ``rope_freqs.weight``
    (llama3-style RoPE: each frequency divided by its factor), if any.

    ``layout``: how the weights the pass will read are laid out: ``llama.cpp`` (a GGUF, or a pack built
    from one) or ``hf`` (GGUF-style metadata beside weights in the Hugging Face layout, e.g. a pack built
    from an HF folder: q/k rows not permuted, gemma gains as stored in HF).
    """
    if layout not in ("llama.cpp", "hf"):
        raise ValueError(f"layout must be llama.cpp or hf, not {layout!r}")
    fam = archs.FAMILIES[facts["arch"]]
    _refuse(fam, {}, where)
    f = fam.forward
    garch = kv.get("general.architecture")

    def get(key: G.Key, default: Any = _TABLE) -> Any:  # the GGUF's value, else the default (the table's)
        v = kv.get(key.at(garch))
        if v is None:
            return key.default if default is _TABLE else default
        if not _of_type(key.type, v):  # a value of another type than the key's (a hand-edited or hostile record)
            raise SourceError(f"{where}: {escape_name(key.at(garch), 80)} = {escape_name(repr(v), 40)} is not a "
                              f"{key.type}; rebuild the pack from its source")
        return v

    L, H, nh = facts["n_layers"], facts["hidden"], facts["heads"]
    mla = facts["attention"] == "mla"
    if get(G.CLAMP_KQV):
        raise NotEvaluable(f"{where}: clamped q/k/v ({G.CLAMP_KQV.name}) is not evaluable yet")
    if mla and get(G.KEY_LENGTH_MLA) is not None:
        raise NotEvaluable(f"{where}: MLA with split attn_k_b / attn_v_b (llama.cpp's absorbed layout) is not "
                           "evaluable yet")
    hd = facts["head_dim"]
    # the value head: its key, else the key length; MLA's (q/k heads nope + rope wide), llama.cpp's own default
    # n_embd / n_head (MiniCPM3Model writes no value_length: its value heads are hidden / heads wide)
    vhd = int(get(G.VALUE_LENGTH, H // nh if mla and nh else hd))
    eps = get(G.RMS_EPS, get(G.LAYER_NORM_EPS))
    style = "interleaved" if f.gguf_permuted_qk and layout == "llama.cpp" else f.rope
    rot = int(get(G.ROPE_DIMENSION_COUNT, hd))
    max_pos = int(get(G.CONTEXT_LENGTH))
    params: dict[str, Any] = {"rope_theta": get(G.ROPE_FREQ_BASE)}
    kind = get(G.ROPE_SCALING_TYPE)
    if kind == "linear":
        params.update(rope_type="linear", factor=get(G.ROPE_SCALING_FACTOR))
    elif kind == "yarn":
        log_mul = get(G.ROPE_SCALING_YARN_LOG_MUL)
        if log_mul is not None and not f.yarn_log_mul:
            raise NotEvaluable(f"{where}: YaRN with yarn_log_multiplier (llama.cpp's DeepSeek form) is not evaluable "
                               "yet")
        params.update(rope_type="yarn", factor=get(G.ROPE_SCALING_FACTOR),
                      original_max_position_embeddings=get(G.ROPE_SCALING_ORIG_CTX_LEN, max_pos))
        if log_mul is not None:  # llama.cpp (llama_context): mscale 1 over mscale_all_dim = the log multiplier
            factor = float(params["factor"])
            params["attention_factor"] = _yarn_mscale(factor) / _yarn_mscale(factor, float(log_mul))
        if get(G.ROPE_SCALING_ATTN_FACTOR) is not None:
            params["attention_factor"] = float(get(G.ROPE_SCALING_ATTN_FACTOR))
        if get(G.ROPE_SCALING_YARN_TRUNCATE) is not None:  # not a llama.cpp key (ggml always truncates)
            params["truncate"] = bool(get(G.ROPE_SCALING_YARN_TRUNCATE))
    elif kind not in ("none", None):
        raise NotEvaluable(f"{where}: RoPE scaling {escape_name(repr(kind), 40)} is not evaluable yet")
    rope = _rope_from(params, rot, max_pos, style, where)
    if rope_freqs is not None:
        fr = np.asarray(rope_freqs, dtype=np.float32).reshape(-1)
        if fr.size != rope.inv_freq.size or not np.all(np.isfinite(fr)) or np.any(fr <= 0):
            raise SourceError(f"{where}: rope_freqs.weight holds {fr.size} factors, not {rope.inv_freq.size} positive "
                              "ones; the file is damaged")
        rope.inv_freq = (rope.inv_freq / fr).astype(np.float32)
    rope_swa = None
    if f.swa_rope_base or f.swa_rope_unscaled:
        rope_swa = _rope_from({"rope_theta": get(G.ROPE_FREQ_BASE_SWA, f.swa_rope_base or params["rope_theta"])},
                              int(get(G.ROPE_DIMENSION_COUNT_SWA, rot)), max_pos, style, where)
    rope_layers = set(range(L))
    if f.rope_layers == "no_rope_layers":
        nrl = get(G.NO_ROPE_LAYERS)  # not a llama.cpp key: llama.cpp's smollm3 skips RoPE on every 4th layer
        rope_layers = {i for i, u in enumerate(nrl) if u} if isinstance(nrl, list) else \
            {i for i in range(L) if (i + 1) % 4 != 0}
    if f.rope_switch and get(G.ROPE_SCALING_FINETUNED) is False:  # llama.cpp's granite-hybrid: no RoPE
        rope_layers = set()
    if f.rope_layers == "none":
        rope_layers = set()
    window = int(get(G.SLIDING_WINDOW) or 0)
    if f.window == "config":
        swa_window, swa_layers = window, set(range(L)) if window else set()
    else:
        swa_window, swa_layers = facts["swa_window"], set(facts["swa_layers"])
    if f.rope_layers == "swa" and swa_layers:  # exaone4: the full layers are NoPE when there are sliding ones
        rope_layers = set(swa_layers)

    # the config numbers llama.cpp's graph takes as constants where the converter writes no key (minicpm3.cpp)
    fixed = dict(f.gguf_fixed)
    derived = {"embed": fixed.get(f.embed_scale), "residual": fixed["scale_depth"] / math.sqrt(L)
               if f.residual_scale == "depth" and "scale_depth" in fixed else None,
               "logit": H / fixed["dim_model_base"] if f.logit_scale == "dim_base" and "dim_model_base" in fixed
               else None}

    def scale(spec: str, which: str, default: float) -> float:
        if not spec:
            return default
        d = derived.get(which)
        return float(get(_GGUF_SCALE[which], default if d is None else d))

    attn_scale = float(get(G.ATTENTION_SCALE, 1.0 if f.attn_scale == "unit" or not hd else hd ** -0.5))  # gemma4: llama.cpp's 1
    embed = math.sqrt(H) if f.embed_scale == "sqrt_hidden" else scale(f.embed_scale, "embed", 1.0)
    E = facts["n_experts"]
    # llama.cpp's expert_gating_func (1 softmax, 2 sigmoid) tells DeepSeek-V3 from V2 (one GGUF architecture)
    router = {1: "softmax", 2: "sigmoid"}.get(get(G.EXPERT_GATING_FUNC), f.router)
    n_group = int(get(G.EXPERT_GROUP_COUNT)) if f.router_groups else 1
    groups = ("top2sum" if router == "sigmoid" else "max") if n_group > 1 else ""
    return Hparams(
        arch=fam.name, fwd=f, layout="gguf" if layout == "llama.cpp" else "hf", n_layers=L, hidden=H, heads=nh,
        kv_heads=(_kv_heads(kv.get(G.HEAD_COUNT_KV.at(garch)), facts, False) if get(G.KEY_LENGTH_SWA) else 0)
        or facts["kv_heads"], head_dim=hd, v_head_dim=vhd,
        vocab=facts["vocab"], eps=_num(eps, "layer_norm_rms_epsilon", where),
        norm_offset=0.0 if layout == "llama.cpp" else f.norm_offset, act=f.act, rope=rope, rope_swa=rope_swa,
        rope_layers=rope_layers, swa_window=swa_window, swa_layers=swa_layers, attn_scale=attn_scale,
        attn_softcap=float(get(G.ATTN_SOFTCAP)),
        final_softcap=float(get(G.FINAL_SOFTCAP)),
        embed_scale=float(embed), residual_scale=scale(f.residual_scale, "residual", 1.0),
        logit_scale=scale(f.logit_scale, "logit", 1.0), max_pos=max_pos, n_experts=E, top_k=facts["n_experts_used"],
        router=router, router_groups=groups,
        router_norm=f.router_norm == "always" or f.router_norm_gguf == "always" or bool(get(G.EXPERT_WEIGHTS_NORM)),
        routed_scale=float(get(G.EXPERT_WEIGHTS_SCALE)) if f.router_scale else 1.0,
        n_group=n_group, topk_group=int(get(G.EXPERT_GROUP_USED_COUNT)) if n_group > 1 else 1,
        mla={"q_lora_rank": int(get(G.Q_LORA_RANK)), "kv_lora_rank": int(get(G.KV_LORA_RANK)),
             "nope": hd - rot, "rope": rot, "v_head_dim": vhd} if mla else {},
        blocks=_gguf_blocks(fam, facts),
        ssm={dim: int(kv[f"{garch}.{key}"]) for dim, key in fam.blocks.gguf_dims if kv.get(f"{garch}.{key}") is not None}
        if fam.blocks is not None else {},
        attn_temp=_attn_temp(f, get(G.ATTN_TEMPERATURE_SCALE), get(G.ROPE_SCALING_ORIG_CTX_LEN), where),
        head_dim_swa=int(get(G.KEY_LENGTH_SWA, 0) or 0),
        kv_heads_swa=_kv_heads(kv.get(G.HEAD_COUNT_KV.at(garch)), facts, True) if get(G.KEY_LENGTH_SWA) else 0,
        kv_from=_kv_from(L, facts), per_layer=int(get(G.EMBEDDING_LENGTH_PER_LAYER) or 0) if f.per_layer_input else 0,
        # llama.cpp's gemma3n always scales the corrected stream (altup_correct_scale is no GGUF key)
        altup=(int(get(G.ALTUP_NUM_INPUTS)), int(get(G.ALTUP_ACTIVE_IDX)), True) if f.altup else (0, 0, False),
        sparsity=_sparsity(kv.get(G.ACTIVATION_SPARSITY_SCALE.at(garch)) or ()) if f.act_sparsity else {},
    )


def _sparsity(scales) -> dict:
    """{layer: std multiplier} of the layers whose activation-sparsity multiplier is finite (-inf: none)."""
    return {i: float(v) for i, v in enumerate(scales) if isinstance(v, (int, float)) and math.isfinite(v)}


def _kv_from(L: int, facts: Mapping[str, Any]) -> dict:
    """Each KV-sharing layer (facts kv_shared_layers) -> the last earlier layer of its type (sliding or not), whose K/V
    it reads (transformers' Gemma4 kv_sharing_modes; llama.cpp's n_layer_kv_from_start)."""
    shared = set(facts.get("kv_shared_layers") or ())
    if not shared:
        return {}
    swa, first = set(facts.get("swa_layers") or ()), min(shared)
    own = lambda i: i in swa  # noqa: E731
    return {i: max(j for j in range(first) if own(j) == own(i)) for i in sorted(shared)
            if any(own(j) == own(i) for j in range(first))}


def _kv_heads(per: Any, facts: Mapping[str, Any], swa: bool) -> int:
    """The sliding layers' KV heads from a per-layer head_count_kv (0: none given apart)."""
    if not isinstance(per, (list, tuple)) or len(per) != facts["n_layers"]:
        return 0
    sl = set(facts.get("swa_layers") or ())
    got = [int(per[i]) for i in range(len(per)) if (i in sl) == swa]
    return max(got) if got else 0


def _gguf_blocks(fam: archs.Family, facts: Mapping[str, Any]) -> tuple[str, ...]:
    """A hybrid GGUF's block type per layer: its recurrent layers (no KV heads) run the family's recurrent block, its
    FFN-only layers (no KV heads, an FFN length: Nemotron-H) the family's FFN block."""
    if fam.blocks is None:
        return ()
    rec, ffn = set(facts.get("recurrent_layers") or ()), set(facts.get("ffn_layers") or ())
    return tuple(archs.recurrent_block(fam) if i in rec else archs.ffn_block(fam) if i in ffn else archs.ATTN
                 for i in range(facts["n_layers"]))


def to_gguf(hp: Hparams) -> dict[str, Any]:
    """The llama.cpp keys (without the ``{arch}.`` prefix) :func:`from_gguf` reads back as ``hp``'s numbers.

    For writers of test GGUFs (orkpack.synth): with the facts orkpack already writes, a GGUF then
    describes the same forward pass as the HF folder it came from.
    """
    out: dict[str, Any] = {}

    def put(key: G.Key, v: Any) -> None:
        out[key.name] = v

    put(G.RMS_EPS, hp.eps)
    put(G.ROPE_DIMENSION_COUNT, hp.rope.dim)
    put(G.ATTENTION_SCALE, hp.attn_scale)
    put(G.ROPE_FREQ_BASE, hp.rope.params["rope_theta"])
    f = hp.fwd
    kind = hp.rope.params["rope_type"]
    if kind in ("linear", "yarn"):
        put(G.ROPE_SCALING_TYPE, kind)
        put(G.ROPE_SCALING_FACTOR, float(hp.rope.params["factor"]))
        if kind == "yarn":
            put(G.ROPE_SCALING_ORIG_CTX_LEN, int(hp.rope.params["original_max_position_embeddings"]))
            put(G.ROPE_SCALING_ATTN_FACTOR, float(hp.rope.attn_factor))
            if not hp.rope.params.get("truncate", True):
                put(G.ROPE_SCALING_YARN_TRUNCATE, False)
    elif kind not in ("default", "dynamic", "llama3", "ntk_alpha", "proportional"):  # llama3, proportional: the
        # rope_freqs.weight tensor (rope_factors); ntk_alpha: its scaled base is the freq_base above
        raise NotEvaluable(f"RoPE scaling {kind} has no GGUF form here")
    if f.norm == "layer":
        put(G.LAYER_NORM_EPS, hp.eps)
    if hp.rope_swa is not None:
        put(G.ROPE_FREQ_BASE_SWA, hp.rope_swa.params["rope_theta"])
        if hp.rope is not None and hp.rope_swa.dim != hp.rope.dim:  # gemma4: the sliding layers' own rotated dims
            put(G.ROPE_DIMENSION_COUNT_SWA, hp.rope_swa.dim)
    if hp.attn_temp[0]:  # its length is the YaRN original context (written with the scaling above)
        put(G.ATTN_TEMPERATURE_SCALE, hp.attn_temp[0])
    if hp.attn_softcap:
        put(G.ATTN_SOFTCAP, hp.attn_softcap)
    if hp.final_softcap:
        put(G.FINAL_SOFTCAP, hp.final_softcap)
    if f.embed_scale and f.embed_scale != "sqrt_hidden":
        put(G.EMBEDDING_SCALE, hp.embed_scale)
    if f.residual_scale:
        put(G.RESIDUAL_SCALE, hp.residual_scale)
    if f.logit_scale:
        put(G.LOGIT_SCALE, hp.logit_scale)
    if hp.n_experts:
        put(G.EXPERT_WEIGHTS_NORM, hp.router_norm)
        put(G.EXPERT_GATING_FUNC, 2 if hp.router == "sigmoid" else 1)
        if f.router_scale:
            put(G.EXPERT_WEIGHTS_SCALE, hp.routed_scale)
        if hp.router_groups:
            put(G.EXPERT_GROUP_COUNT, hp.n_group)
            put(G.EXPERT_GROUP_USED_COUNT, hp.topk_group)
    if f.rope_layers == "no_rope_layers":
        put(G.NO_ROPE_LAYERS, [int(i in hp.rope_layers) for i in range(hp.n_layers)])
    if f.window == "config" and hp.swa_window:
        put(G.SLIDING_WINDOW, hp.swa_window)
    if f.rope_switch:
        put(G.ROPE_SCALING_FINETUNED, bool(hp.rope_layers))
    return out



def rope_factors(hp: Hparams) -> np.ndarray | None:
    """llama.cpp's ``rope_freqs.weight`` for a llama3-style RoPE (each default frequency's divisor), else None."""
    if hp.rope is not None and hp.rope.params.get("rope_type") == "proportional":  # Gemma4Model's: 1 turns, 1e30 not
        return np.where(hp.rope.inv_freq == 0, np.float32(1e30), np.float32(1)).astype(np.float32)
    if hp.rope is None or hp.rope.params.get("rope_type") != "llama3":
        return None
    return (_inv_freq(hp.rope.params["rope_theta"], hp.rope.dim) / hp.rope.inv_freq).astype(np.float32)
