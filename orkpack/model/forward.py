"""The reference forward pass: float32 logits of a token sequence, full causal attention, layer by layer.

Every family's behaviour is its :class:`orkpack.archs.Forward` declaration and the numbers of
:mod:`orkpack.model.hparams`; this code reads them and has no per-family branches. Tensors are
read by canonical (GGUF-style) names, through a weight provider (:mod:`orkpack.model.weights`):
the hidden states of every token are kept, the weights of one layer at a time.

Shapes: ``x`` is (T, hidden); q/k/v are (T, heads, head_dim). Attention runs per KV head and
block of queries, so its scores take (group x 256 x T) floats at most.

Several sequences at once (:class:`Batch`, what ``orkpack eval`` runs its chunks as): layer by layer over all of
them, each layer's weights read once; every sequence's numbers are those it gets alone.

Incremental: given a :class:`orkpack.model.state.State`, ``run`` takes the tokens as the continuation of the
sequence the state holds (positions from ``state.pos``: RoPE, attention temperature and sliding windows at absolute
positions), attends over the cached K/V plus the new, carries every recurrent block's state, and leaves the state
advanced past them: prefill, then one token at a time, gives the full sequence's logits.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import numpy as np
from scipy.special import erf, expit  # exact GELU; a sigmoid that does not overflow

from .. import archs
from ..archs import mixers
from ..errors import SourceError, escape_name
from ..sources import open_source
from . import hparams as _hp
from .hparams import Hparams, NotEvaluable, Rope
from .deltanet import deltanet
from .mamba2 import mamba2
from .rwkv7 import channel_mix, time_mix
from .shortconv import shortconv
from .state import State
from .weights import SourceWeights, Weights

_Q_BLOCK = 256  # queries per attention block
_LOGIT_CHUNK = 256  # tokens per output-head call


def model_hparams(source) -> Hparams:
    """The hyperparameters of an opened source (NotEvaluable / SourceError: one line)."""
    where = escape_name(str(source.root))
    hp = _source_hparams(source, where)
    for t in source.tensors():  # stacked experts must be (E, out, in), as every reader but one release form gives
        if re.match(r"^blk\.\d+\.ffn_(gate|up|gate_up)_exps\.weight$", t.name) and t.shape[-1] != hp.hidden:
            raise NotEvaluable(f"{where}: {escape_name(t.source_name)} {t.shape} is not (experts, out, {hp.hidden}): "
                               "expert matrices stored (in, out) (transformers' float gpt-oss) are not evaluable yet")
    return hp


def _source_hparams(source, where: str) -> Hparams:
    if source.kind == "gguf":
        if source.config is None:
            raise NotEvaluable(f"{where}: GGUF architecture {escape_name(repr(source.arch), 40)} is not evaluable "
                               "yet: orkpack has no entry for it")
        names = {t.name for t in source.tensors()}
        freqs = source.read("rope_freqs.weight") if "rope_freqs.weight" in names else None
        return _hp.from_gguf(source.metadata, source.config, freqs, where)
    if source.config is None:
        raise SourceError(f"{where}: no config.json beside the weights; the forward pass needs the model's config")
    return _hp.from_config(source.config, where + "/config.json" if Path(source.root).is_dir() else where)


# --------------------------------------------------------------------------------------------- pieces

def _act(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "silu":
        return x * expit(x)
    if kind == "relu2":  # squared ReLU (Nemotron-H's MLPs and experts)
        r = np.maximum(x, np.float32(0))
        return r * r
    if kind == "gelu_tanh":
        c = np.float32(np.sqrt(2.0 / np.pi))
        return np.float32(0.5) * x * (np.float32(1) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))
    return (np.float32(0.5) * x * (np.float32(1) + erf(x / np.float32(np.sqrt(2.0))))).astype(np.float32)


def _norm(x: np.ndarray, w: Weights, name: str, hp: Hparams) -> np.ndarray:
    # the gain is NAME.weight, or NAME itself where the converter names it so (Falcon-H1's blk.N.ffn_norm)
    g = w.tensor(name + ".weight" if w.has(name + ".weight") or not w.has(name) else name)
    if hp.norm_offset:
        g = g + np.float32(hp.norm_offset)
    if hp.fwd.norm == "layer":
        mu = x.mean(-1, keepdims=True, dtype=np.float32)
        xc = x - mu
        y = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + np.float32(hp.eps))
        y = y * g
        return y + w.tensor(name + ".bias") if w.has(name + ".bias") else y
    y = x / np.sqrt((x * x).mean(-1, keepdims=True, dtype=np.float32) + np.float32(hp.eps))
    return y * g


def _lin(w: Weights, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray:
    y = w.matmul(name + ".weight", x, expert)
    if w.has(name + ".bias"):
        b = w.tensor(name + ".bias")
        y = y + (b if expert is None else b[expert])
    return y


def _glu(gate: np.ndarray, up: np.ndarray, hp: Hparams) -> np.ndarray:
    if hp.act == "swiglu_oai":  # gpt-oss
        alpha, limit = (np.float32(v) for v in hp.swiglu)
        gate = np.minimum(gate, limit)
        up = np.clip(up, -limit, limit)
        return gate * expit(alpha * gate) * (up + np.float32(1))
    return _act(gate, hp.act) * up


def _rope(x: np.ndarray, rope: Rope, pos: np.ndarray) -> np.ndarray:
    """Rotate the first ``rope.dim`` dims of each head of x (T, heads, d)."""
    ang = np.outer(pos.astype(np.float32), rope.inv_freq).astype(np.float32)  # (T, dim/2)
    cos = (np.cos(ang) * np.float32(rope.attn_factor))[:, None, :]
    sin = (np.sin(ang) * np.float32(rope.attn_factor))[:, None, :]
    d = rope.dim
    out = x.copy()
    if rope.style == "neox":
        a, b = x[..., : d // 2], x[..., d // 2: d]
        out[..., : d // 2] = a * cos - b * sin
        out[..., d // 2: d] = b * cos + a * sin
    else:
        a, b = x[..., 0:d:2], x[..., 1:d:2]
        out[..., 0:d:2] = a * cos - b * sin
        out[..., 1:d:2] = b * cos + a * sin
    return out


def _softmax(s: np.ndarray) -> np.ndarray:
    s = s - s.max(-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(-1, keepdims=True)
    return s


_BLAS = None  # threadpoolctl's controller of the loaded BLAS libraries (made at the first attention)


def _one_blas_thread():
    """A context in which BLAS runs on one thread: attention's many small products (a few tens of MFLOP each) ran
    3-4x faster on one thread than on two on this shared 2-core machine, with the same bits (OpenBLAS splits the
    rows and columns of a product between threads, never its sums); the weight products keep the caller's threads
    (orkpack eval --threads)."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    return _BLAS.limit(limits=1, user_api="blas")


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, hp: Hparams, window: int,
            sinks: np.ndarray | None = None, q0: int = 0, k0: int = 0) -> np.ndarray:
    """Causal attention: q (T, nh, d), k (S, nkv, d), v (S, nkv, dv) -> (T, nh * dv).

    ``q0``, ``k0``: the absolute positions of q[0] and k[0] (the keys run to the last query's position; a cache
    holds the earlier ones). ``sinks`` (nh,): a per-head logit in every softmax's denominator that attends to
    nothing (gpt-oss). Its products on one BLAS thread (:func:`_one_blas_thread`).
    """
    with _one_blas_thread():
        return _attend_blocks(q, k, v, hp, window, sinks, q0, k0)


def _attend_blocks(q, k, v, hp: Hparams, window: int, sinks, q0: int, k0: int) -> np.ndarray:
    T, nh, _ = q.shape
    nkv, dv = k.shape[1], v.shape[2]
    g = nh // nkv
    out = np.empty((T, nh, dv), dtype=np.float32)
    j = k0 + np.arange(k.shape[0])
    scale = np.float32(hp.attn_scale)
    cap = np.float32(hp.attn_softcap)
    for h in range(nkv):  # contiguous 2-D operands: one BLAS call each (numpy's batched matmul is slow here)
        kh, vh = np.ascontiguousarray(k[:, h, :]), np.ascontiguousarray(v[:, h, :])
        qh = np.ascontiguousarray(q[:, h * g:(h + 1) * g, :].transpose(1, 0, 2))  # (g, T, d)
        for t0 in range(0, T, _Q_BLOCK):
            t1 = min(T, t0 + _Q_BLOCK)
            n = q0 + t1 - k0  # the keys up to the block's last query
            i = (q0 + np.arange(t0, t1))[:, None]
            allowed = j[None, :n] <= i
            if window:
                allowed &= i - j[None, :n] < window
            s = (qh[:, t0:t1].reshape(-1, qh.shape[2]) @ kh[:n].T).reshape(g, t1 - t0, n)
            s *= scale
            if cap:
                s = np.tanh(s / cap) * cap
            np.copyto(s, np.float32(-np.inf), where=~allowed)  # (boolean indexing: ~4x slower)
            if sinks is None:
                p = _softmax(s)
            else:
                sk = sinks[h * g:(h + 1) * g][:, None, None]
                m = np.maximum(s.max(-1, keepdims=True), sk)
                p = np.exp(s - m)
                p /= p.sum(-1, keepdims=True) + np.exp(sk - m)
            out[t0:t1, h * g:(h + 1) * g, :] = (p.reshape(-1, n) @ vh[:n]).reshape(g, t1 - t0, dv).transpose(1, 0, 2)
    return out.reshape(T, nh * dv)


def _rope_for(i: int, hp: Hparams) -> Rope | None:
    if i not in hp.rope_layers:
        return None
    if hp.rope_swa is not None and i in hp.swa_layers:
        return hp.rope_swa
    return hp.rope


def _qk_norm(x: np.ndarray, w: Weights, name: str, hp: Hparams) -> np.ndarray:
    if hp.fwd.qk_norm == "full":  # over every head at once (olmoe): x is (T, heads * d)
        return _norm(x, w, name, hp)
    T = x.shape[0]
    d = w.tensor(name + ".weight").shape[0]
    return _norm(x.reshape(T, -1, d), w, name, hp).reshape(T, -1)


def _kv_keep(i: int, hp: Hparams) -> int:
    """Positions layer i's K/V cache keeps after a run: the last window - 1 of a sliding layer (all the next query can
    see) when every layer reading it slides too; 0: all."""
    readers = [i] + [j for j, src in hp.kv_from.items() if src == i]
    if hp.swa_window and all(j in hp.swa_layers for j in readers):
        return max(hp.swa_window - 1, 1)
    return 0


def _cached(i: int, k: np.ndarray, v: np.ndarray, pos0: int, hp: Hparams, slot: dict | None):
    """(k, v, k0): the new K/V after the ones ``slot`` holds, with the absolute position of the first; the slot
    left holding what the next tokens need (orkpack/model/state.py)."""
    if slot is None:
        return k, v, pos0
    if "k" in slot:
        k, v, k0 = np.concatenate([slot["k"], k]), np.concatenate([slot["v"], v]), slot["k0"]
    else:
        k, v, k0 = np.ascontiguousarray(k), np.ascontiguousarray(v), pos0
    keep = _kv_keep(i, hp)
    cut = max(0, k.shape[0] - keep) if keep else 0
    slot["k"], slot["v"], slot["k0"] = k[cut:], v[cut:], k0 + cut
    return k, v, k0


def _attention(i: int, x: np.ndarray, hp: Hparams, w: Weights, kv: dict | None = None, pos0: int = 0,
               slot: dict | None = None) -> np.ndarray:
    """One attention layer; ``kv`` holds the (k, v, k0) of the layers a later KV-sharing layer reads
    (Hparams.kv_from); ``pos0``: the position of x[0]; ``slot``: this layer's K/V cache (orkpack/model/state.py)."""
    p = f"blk.{i}."
    T = x.shape[0]
    pos = pos0 + np.arange(T)
    rope = _rope_for(i, hp)
    window = hp.swa_window if i in hp.swa_layers else 0
    if hp.mla:
        m = hp.mla
        nope, rd, dv = m["nope"], m["rope"], m["v_head_dim"]
        if w.has(p + "attn_q_a.weight"):
            q = _lin(w, p + "attn_q_b", _norm(_lin(w, p + "attn_q_a", x), w, p + "attn_q_a_norm", hp))
        else:
            q = _lin(w, p + "attn_q", x)
        q = q.reshape(T, hp.heads, nope + rd)
        kv_a = _lin(w, p + "attn_kv_a_mqa", x)
        c, k_pe = kv_a[:, : m["kv_lora_rank"]], kv_a[:, m["kv_lora_rank"]:].reshape(T, 1, rd)
        kv = _lin(w, p + "attn_kv_b", _norm(c, w, p + "attn_kv_a_norm", hp)).reshape(T, hp.heads, nope + dv)
        q_pe, k_pe = q[..., nope:], k_pe
        if rope is not None:
            q_pe, k_pe = _rope(q_pe, rope, pos), _rope(k_pe, rope, pos)
        q = np.concatenate([q[..., :nope], q_pe], -1)
        k = np.concatenate([kv[..., :nope], np.broadcast_to(k_pe, (T, hp.heads, rd))], -1)
        v = np.ascontiguousarray(kv[..., nope:])
        k, v, k0 = _cached(i, k, v, pos0, hp, slot)
    else:
        nh, nkv, d = hp.heads, hp.kv_heads, hp.head_dim
        if hp.head_dim_swa and i in hp.swa_layers:  # gemma4: the sliding layers' own head size and KV heads
            nkv, d = hp.kv_heads_swa or nkv, hp.head_dim_swa
        if i in hp.kv_from:  # a KV-sharing layer: its q alone; K/V as the earlier layer left them (normed, turned)
            q = _lin(w, p + "attn_q", x)
            if hp.fwd.qk_norm:
                q = _qk_norm(q, w, p + "attn_q_norm", hp)
            q = q.reshape(T, nh, d)
            if rope is not None:
                q = _rope(q, rope, pos)
            k, v, k0 = kv[hp.kv_from[i]]
        elif w.has(p + "attn_qkv.weight"):
            qkv = _lin(w, p + "attn_qkv", x)
            if hp.fwd.qkv == "grouped":  # per KV head: its nh / nkv q heads, then k, then v
                g = qkv.reshape(T, nkv, nh // nkv + 2, d)
                q, k, v = g[:, :, :-2].reshape(T, nh * d), g[:, :, -2].reshape(T, nkv * d), g[:, :, -1].reshape(T, -1)
            else:
                q, k, v = qkv[:, : nh * d], qkv[:, nh * d: (nh + nkv) * d], qkv[:, (nh + nkv) * d:]
        else:  # no attn_v (gemma4's attention_k_eq_v full layers): the keys' projection is the values too
            q, k = _lin(w, p + "attn_q", x), _lin(w, p + "attn_k", x)
            v = _lin(w, p + "attn_v", x) if w.has(p + "attn_v.weight") else k
        if i not in hp.kv_from:
            if hp.fwd.attn_gate:  # attn_q holds per head [q | gate]
                qg = q.reshape(T, nh, 2 * d)
                q, gate = np.ascontiguousarray(qg[..., :d]).reshape(T, nh * d), qg[..., d:].reshape(T, nh * d)
            qk_norm = hp.fwd.qk_norm and w.has(p + "attn_q_norm.weight")  # (glm4_moe: only with use_qk_norm)
            if qk_norm and not hp.fwd.qk_norm_after_rope:
                q, k = _qk_norm(q, w, p + "attn_q_norm", hp), _qk_norm(k, w, p + "attn_k_norm", hp)
            q, k, v = q.reshape(T, nh, d), k.reshape(T, nkv, d), v.reshape(T, nkv, -1)
            if hp.fwd.v_norm:  # per head, without a gain
                v = _rms(v, hp)
            if rope is not None:
                q, k = _rope(q, rope, pos), _rope(k, rope, pos)
            if qk_norm and hp.fwd.qk_norm_after_rope:  # hunyuan_v1_dense
                q = _qk_norm(q.reshape(T, -1), w, p + "attn_q_norm", hp).reshape(T, nh, d)
                k = _qk_norm(k.reshape(T, -1), w, p + "attn_k_norm", hp).reshape(T, nkv, d)
            k, v, k0 = _cached(i, k, v, pos0, hp, slot)
            if kv is not None and i in set(hp.kv_from.values()):
                kv[i] = (k, v, k0)
        if hp.attn_temp[0]:  # Llama 4's attention temperature (ministral3)
            beta, n = hp.attn_temp
            q = q * (1 + np.float32(beta) * np.log1p(np.floor(pos / n))).astype(np.float32)[:, None, None]
    sink = next((n for n in (p + "attn_sinks", p + "attn_sinks.weight") if w.has(n)), None)
    sinks = w.tensor(sink) if sink else None
    o = _attend(q, k, v, hp, window, sinks, pos0, k0)
    if hp.fwd.attn_gate and not hp.mla:
        o = o * expit(gate)
    return _lin(w, p + "attn_output", o)


def _mlp(x: np.ndarray, w: Weights, p: str, sfx: str, hp: Hparams, expert: int | None = None,
         cut: float | None = None) -> np.ndarray:
    """One (expert's) MLP over the ``{p}ffn_{gate,up,down}{sfx}`` tensors; ``cut``: the gate's activation-sparsity
    std multiplier (Forward.act_sparsity: relu(gate - mean - std x cut) per token before the activation)."""
    kind, up = hp.fwd.mlp, f"{p}ffn_up{sfx}"
    if w.has(f"{p}ffn_gate{sfx}.weight"):  # gate and up apart (llama.cpp splits gpt-oss's and granitemoe's)
        kind = "gated"
    elif w.has(f"{p}ffn_gate_up{sfx}.weight"):  # one stacked gate_up (granitemoe: halves, gpt-oss: interleaved)
        kind, up = ("interleaved" if kind == "interleaved" else "fused"), f"{p}ffn_gate_up{sfx}"
    if kind == "plain":
        h = _act(_lin(w, up, x, expert), hp.act)
    elif kind == "fused":
        gu = _lin(w, up, x, expert)
        n = gu.shape[1] // 2
        h = _glu(gu[:, :n], gu[:, n:], hp)
    elif kind == "interleaved":
        gu = _lin(w, up, x, expert)
        h = _glu(gu[:, 0::2], gu[:, 1::2], hp)
    else:
        gate = _lin(w, f"{p}ffn_gate{sfx}", x, expert)
        if cut is not None:  # gemma3n's gaussian top-k
            gate = np.maximum(gate - (gate.mean(-1, keepdims=True) + gate.std(-1, keepdims=True) * np.float32(cut)),
                              np.float32(0))
        h = _glu(gate, _lin(w, up, x, expert), hp)
    return _lin(w, f"{p}ffn_down{sfx}", h, expert)


def _route(logits: np.ndarray, p: str, hp: Hparams, w: Weights) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids, weights), each (T, top_k), as the family's router picks them."""
    if hp.router == "sigmoid":
        scores = expit(logits)
    else:
        scores = _softmax(logits.copy())
    choice = scores + w.tensor(p + "exp_probs_b.bias") if w.has(p + "exp_probs_b.bias") else scores.copy()
    T, E = scores.shape
    if hp.n_group > 1:
        grouped = choice.reshape(T, hp.n_group, E // hp.n_group)
        if hp.router_groups == "top2sum":
            gs = np.sort(grouped, -1)[..., -2:].sum(-1)
        else:
            gs = grouped.max(-1)
        keep = np.argsort(-gs, -1, kind="stable")[:, : hp.topk_group]
        mask = np.zeros((T, hp.n_group), dtype=bool)
        np.put_along_axis(mask, keep, True, -1)
        fill = np.float32(-np.inf) if hp.router_groups == "top2sum" else np.float32(0)
        choice = np.where(np.repeat(mask, E // hp.n_group, -1), choice, fill)
    idx = np.argsort(-choice, -1, kind="stable")[:, : hp.top_k]
    wts = np.take_along_axis(scores, idx, -1)
    if hp.router_norm:
        wts = wts / (wts.sum(-1, keepdims=True) + (np.float32(hp.fwd.router_eps) if hp.router == "sigmoid" else 0))
    return idx, (wts * np.float32(hp.routed_scale)).astype(np.float32)


def _ffn(i: int, x: np.ndarray, hp: Hparams, w: Weights) -> np.ndarray:
    p = f"blk.{i}."
    if not w.has(p + "ffn_gate_inp.weight"):
        return _mlp(x, w, p, "", hp, cut=hp.sparsity.get(i))
    idx, wts = _route(_lin(w, p + "ffn_gate_inp", x), p, hp, w)
    out = np.zeros_like(x)
    stacked = "_exps"
    for e in np.unique(idx):
        rows, slot = np.nonzero(idx == e)
        y = _mlp(x[rows], w, p, stacked, hp, expert=int(e))
        np.add.at(out, rows, y * wts[rows, slot][:, None])
    if w.has(p + "ffn_up_shexp.weight"):
        s = _mlp(x, w, p, "_shexp", hp)
        if hp.fwd.shared_gate:
            gate = w.matmul(p + "ffn_gate_inp_shexp.weight", x)
            s = s * expit(gate)
        out = out + s
    return out


def _rms(x: np.ndarray, hp: Hparams) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True, dtype=np.float32) + np.float32(hp.eps))


def _mlp_and_experts(i: int, x: np.ndarray, hp: Hparams, w: Weights) -> np.ndarray:
    """Forward.moe_beside_mlp (gemma4's enable_moe_block): the dense MLP and the routed experts on the same input,
    each between its own norms, summed (transformers' Gemma4TextDecoderLayer, Gemma4TextRouter)."""
    p = f"blk.{i}."
    dense = _norm(_mlp(_norm(x, w, p + hp.fwd.ffn_norm, hp), w, p, "", hp), w, p + "post_ffw_norm_1", hp)
    r = _rms(x, hp) * w.tensor(p + "ffn_gate_inp.scale") * np.float32(hp.hidden ** -0.5)
    idx, wts = _route(_lin(w, p + "ffn_gate_inp", r), p, hp, w)
    if w.has(p + "ffn_down_exps.scale"):  # each expert's own output scale
        wts = wts * w.tensor(p + "ffn_down_exps.scale")[idx]
    xe = _norm(x, w, p + "pre_ffw_norm_2", hp)
    out = np.zeros_like(x)
    for e in np.unique(idx):
        rows, slot = np.nonzero(idx == e)
        np.add.at(out, rows, _mlp(xe[rows], w, p, "_exps", hp, expert=int(e)) * wts[rows, slot][:, None])
    return dense + _norm(out, w, p + "post_ffw_norm_2", hp)


# each family's layers that are one block alone (archs Blocks.parts): block type -> "mixer" | "ffn"
_PARTS = {name: dict(f.blocks.parts) for name, f in archs.FAMILIES.items() if f.blocks is not None and f.blocks.parts}
# the mixer of each block type (orkpack/archs.py Blocks; Hparams.blocks): attention, or a hybrid's recurrent block;
# a block type naming several ("attn+mamba2": archs.mixers) runs them in parallel on the same normed input, summed
_MIXERS: dict[str, Callable[..., np.ndarray]] = {
    "attn": _attention,  # (i, x, hp, w[, kv]): kv the K/V later KV-sharing layers read (gemma4)
    "shortconv": shortconv,
    "deltanet": deltanet,
    "mamba2": mamba2,
    "rwkv7": time_mix,  # (i, x, hp, w, store): store keeps layer 0's values for the later layers' value residual
}
_STORE = {"rwkv7"}  # the mixers that read or leave values for later layers in the run's store (besides attention's K/V)


def _mix(m: str, i: int, h: np.ndarray, hp: Hparams, w: Weights, kv: dict, pos0: int,
         state: State | None) -> np.ndarray:
    """Mixer ``m`` of layer i on the normed input h: attention with the K/V store later KV-sharing layers read
    (gemma4's kv_from), its position and its cache; a recurrent mixer with its state slot (and the run's store)."""
    slot = state.slot(i, m) if state is not None else None
    fn, args = _MIXERS[m], (i, h, hp, w)
    if m == "attn":  # (i, x, hp, w[, kv, pos0, slot])
        return fn(*args, kv, pos0, slot) if hp.kv_from or slot is not None else fn(*args)
    if m in _STORE:
        args += (kv,)
    return fn(*args, state=slot) if slot is not None else fn(*args)


# the FFN block of a layer (archs Forward.ffn): the MLP (or experts), or rwkv7's channel mix
_FFNS: dict[str, Callable[..., np.ndarray]] = {"mlp": _ffn, "channel_mix": channel_mix}
_FFN_STATE = {"channel_mix"}  # the FFN blocks that carry a state from token to token (rwkv7's token shift)


def _layer(i: int, x: np.ndarray, hp: Hparams, w: Weights, kv: dict | None = None,
           pli: np.ndarray | None = None, pos0: int = 0, state: State | None = None) -> np.ndarray:
    """One decoder layer. ``kv``: the K/V later KV-sharing layers read; ``pli``: the per-layer inputs (T, L, width);
    ``pos0``: the position of x[0]; ``state``: the sequence's caches and recurrent states (orkpack/model/state.py)."""
    p = f"blk.{i}."
    after = hp.fwd.block in ("sandwich", "post")  # the block's output normed
    before = hp.fwd.block != "post"  # its input normed
    blk = hp.blocks[i] if hp.blocks else "attn"
    part = _PARTS.get(hp.arch, {}).get(blk)  # "mixer" | "ffn": the layer is that one block (archs Blocks.parts)
    if part != "ffn":
        h = _norm(x, w, p + "attn_norm", hp) if before else x
        a = sum(_mix(m, i, h, hp, w, kv, pos0, state) for m in mixers(blk))
        if after:
            a = _norm(a, w, p + "post_attention_norm", hp)
        x = x + a * np.float32(hp.residual_scale)
        if hp.fwd.laurel:  # gemma3n's LAuReL on the normed input, beside the attention
            lr = h + _norm(_lin(w, p + "laurel_r", _lin(w, p + "laurel_l", h)), w, p + "laurel_post_norm", hp)
            x = (x + lr) * np.float32(2.0 ** -0.5)
    if part != "mixer":  # an FFN alone is normed by the layer's one norm (GGUF attn_norm)
        if hp.fwd.moe_beside_mlp and w.has(p + "ffn_gate_inp.weight"):
            m = _mlp_and_experts(i, x, hp, w)
        else:
            xf = _norm(x, w, p + (hp.fwd.ffn_norm if part is None else "attn_norm"), hp) if before else x
            if hp.fwd.ffn in _FFN_STATE and state is not None:
                m = _FFNS[hp.fwd.ffn](i, xf, hp, w, state=state.slot(i, hp.fwd.ffn))
            else:
                m = _FFNS[hp.fwd.ffn](i, xf, hp, w)
        if after:
            m = _norm(m, w, p + "post_ffw_norm", hp)
        x = x + m * np.float32(hp.residual_scale)
    if pli is not None:  # gemma4: the layer's per-layer input gates a projection back into the stream
        x = x + _per_layer_gate(i, x, hp, w, pli)
    if w.has(p + "layer_output_scale.weight"):
        x = x * w.tensor(p + "layer_output_scale.weight").reshape(-1)[0]
    return x


def _per_layer_gate(i: int, x: np.ndarray, hp: Hparams, w: Weights, pli: np.ndarray) -> np.ndarray:
    """What layer i's per-layer input adds: post_norm(proj(act(inp_gate(x)) * pli_i))."""
    p = f"blk.{i}."
    g = _act(_lin(w, p + "inp_gate", x), hp.act) * pli[:, i, :]
    return _norm(_lin(w, p + "proj", g), w, p + "post_norm", hp)


def _rescaled(y: np.ndarray, target: np.ndarray) -> np.ndarray:
    """y at the RMS ``target`` (per token; y's own RMS at least 1e-5^1/2, as transformers clamps it)."""
    return y * target / np.sqrt(np.maximum((y * y).mean(-1, keepdims=True, dtype=np.float32), np.float32(1e-5)))


def _altup_streams(x: np.ndarray, hp: Hparams, w: Weights) -> np.ndarray:
    """Forward.altup: the embeddings as altup_num_inputs streams (n, T, hidden): stream 0 the embeddings, stream k
    altup_proj[k - 1] of them at their RMS (transformers' Gemma3nTextModel.forward)."""
    proj = w.tensor("altup_proj.weight")
    target = np.sqrt((x * x).mean(-1, keepdims=True, dtype=np.float32))
    return np.stack([x] + [_rescaled(x @ proj[k].T, target) for k in range(hp.altup[0] - 1)]).astype(np.float32)


def _altup_merged(xs: np.ndarray, hp: Hparams, w: Weights) -> np.ndarray:
    """The streams' mean, each but stream 0 through altup_unembd_proj at stream 0's RMS."""
    un = w.tensor("altup_unembd_proj.weight")
    target = np.sqrt((xs[0] * xs[0]).mean(-1, keepdims=True, dtype=np.float32))
    ys = [xs[0]] + [_rescaled(xs[k] @ un[k - 1].T, target) for k in range(1, xs.shape[0])]
    return np.mean(np.stack(ys), axis=0, dtype=np.float32)


def _altup_layer(i: int, xs: np.ndarray, hp: Hparams, w: Weights, kv: dict, pli: np.ndarray | None,
                 pos0: int = 0, state: State | None = None) -> np.ndarray:
    """Forward.altup: layer i on the streams xs (n, T, hidden): every stream predicted from all (coefficients from the
    router on the active stream), the layer run on the active prediction, every stream corrected by the layer's
    innovation; the corrected active stream (times altup_correct_scale) through the per-layer input gate added to
    streams 1.. (transformers' Gemma3nTextAltUp, Gemma3nTextDecoderLayer)."""
    p = f"blk.{i}."
    n, a, scaled = hp.altup
    T = xs.shape[1]

    def modalities(x: np.ndarray) -> np.ndarray:  # (T, n)
        r = _norm(x, w, p + "altup_router_norm", hp) * np.float32(1.0 / hp.hidden)
        return np.tanh(_lin(w, p + "altup_router", r))

    coef = _lin(w, p + "altup_predict_coef", modalities(xs[a])).reshape(T, n, n)  # [t, to, from]
    pred = (xs + np.einsum("tij,jth->ith", coef, xs)).astype(np.float32)
    out = _layer(i, pred[a], hp, w, kv, None, pos0, state)
    corr = _lin(w, p + "altup_correct_coef", modalities(out)) + np.float32(1)  # (T, n)
    xs = (pred + (out - pred[a])[None] * corr.T[:, :, None]).astype(np.float32)
    if pli is not None:
        first = xs[a] * w.tensor(p + "altup_correct_scale.weight") if scaled else xs[a]
        xs[1:] += _per_layer_gate(i, first, hp, w, pli)
    return xs


def _per_layer_inputs(ids: np.ndarray, x: np.ndarray, hp: Hparams, w: Weights) -> np.ndarray:
    """gemma4's per-layer inputs (T, L, width): the rows of per_layer_token_embd (times sqrt(width)) plus the
    embeddings' projection per_layer_model_proj (times hidden^-1/2, RMS-normed per layer by per_layer_proj_norm),
    times 2^-1/2 (transformers' get_per_layer_inputs / project_per_layer_inputs)."""
    T, L, n = ids.size, hp.n_layers, hp.per_layer
    ids = np.where(ids < hp.per_layer_vocab, ids, 0) if hp.per_layer_vocab else ids  # beyond the table: row 0
    tab = w.embed(ids, "per_layer_token_embd.weight").reshape(T, L, n) * np.float32(np.sqrt(n))
    proj = (w.matmul("per_layer_model_proj.weight", x) * np.float32(hp.hidden ** -0.5)).reshape(T, L, n)
    proj = _norm(proj, w, "per_layer_proj_norm", hp)
    return ((proj + tab) * np.float32(2.0 ** -0.5)).astype(np.float32)


# ----------------------------------------------------------------------------------------------- entry

def _checked_ids(tokens, hp: Hparams, where: str, pos0: int = 0) -> np.ndarray:
    """The token ids of one sequence as int64, refused in one line when empty, outside the vocabulary, or past what
    dynamic RoPE scaling evaluates."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise SourceError(f"{where}: no tokens to evaluate")
    if ids.min() < 0 or ids.max() >= hp.vocab:
        raise SourceError(f"{where}: token id {int(ids.max() if ids.max() >= hp.vocab else ids.min())} is outside "
                          f"the vocabulary (0..{hp.vocab - 1}); tokenize with this model's tokenizer")
    if hp.rope is not None and hp.rope.params.get("rope_type") == "dynamic" and hp.max_pos and \
            pos0 + ids.size > hp.max_pos:
        raise NotEvaluable(f"{where}: dynamic RoPE scaling beyond max_position_embeddings ({hp.max_pos} tokens) is "
                           "not evaluable yet; use fewer tokens")
    return ids


class _Seq:
    """One sequence's running values between layers: the hidden states (or gemma3n's AltUp streams), the per-layer
    inputs, the K/V later KV-sharing layers read."""

    def __init__(self, ids: np.ndarray, x: np.ndarray, hp: Hparams, w: Weights):
        if hp.fwd.embed_norm:  # rwkv7: layer 0's pre-norm on the embeddings
            x = _norm(x, w, hp.fwd.embed_norm, hp)
        self.ids = ids
        self.pli = _per_layer_inputs(ids, x, hp, w) if hp.per_layer and w.has("per_layer_token_embd.weight") else None
        self.kv: dict = {}
        self.xs = _altup_streams(x, hp, w) if hp.altup[0] else None  # gemma3n's AltUp streams
        self.x = None if self.xs is not None else x

    def layer(self, i: int, hp: Hparams, w: Weights, pos0: int = 0, state: State | None = None) -> None:
        if self.xs is not None:
            self.xs = _altup_layer(i, self.xs, hp, w, self.kv, self.pli, pos0, state)
        else:
            self.x = _layer(i, self.x, hp, w, self.kv, self.pli, pos0, state)

    def head(self, hp: Hparams, w: Weights, first: int, chunk: int, start: int,
             emit: Callable[[int, np.ndarray], None], step: Callable[[], None] | None = None) -> None:
        """The logits of tokens ``first..`` in blocks of ``chunk`` (block t0 covers first + t0 ..), from the block
        holding token ``start`` on: ``emit(first + t0, block)``; ``step()`` after each."""
        x = _altup_merged(self.xs, hp, w) if self.xs is not None else self.x
        x = _norm(x[first:], w, hp.fwd.output_norm, hp)
        head = "output.weight" if w.has("output.weight") else "token_embd.weight"
        for t0 in range(max(0, start - first) // chunk * chunk, x.shape[0], chunk):
            lg = w.matmul(head, x[t0: t0 + chunk])
            if hp.logit_scale != 1.0:
                lg = lg / np.float32(hp.logit_scale)
            if hp.final_softcap:
                cap = np.float32(hp.final_softcap)
                lg = np.tanh(lg / cap) * cap
            emit(first + t0, lg)
            if step:
                step()


def head_blocks(T: int, chunk: int, start: int = 0) -> int:
    """Blocks of ``chunk`` logits a sequence of T tokens computes from token ``start`` on (:meth:`Batch.logits`)."""
    return max(0, -(-T // chunk) - start // chunk)


def run(source, tokens, *, weights: Weights | None = None, hp: Hparams | None = None,
        on_logits: Callable[[int, np.ndarray], None] | None = None,
        progress: Callable[[int, int], None] | None = None, chunk: int = _LOGIT_CHUNK,
        state: State | None = None, last: bool = False) -> np.ndarray | None:
    """Logits (T, vocab) float32 of ``tokens`` under the model in ``source`` (an opened Source).

    ``hp``: the hyperparameters (default: :func:`model_hparams` of the source).
    ``weights``: the provider (default: :class:`SourceWeights`, float32 of the source).
    ``source`` may be None when both are given (a pack's weights and the metadata it carries).
    ``on_logits(t0, block)``: receives the logits in blocks of ``chunk`` tokens instead of one
    (T, vocab) array (then None is returned): a long text's logits need not fit in memory.
    ``progress(done, total)``: after each layer and each block of logits.
    ``state``: a :class:`orkpack.model.state.State`; the tokens continue the sequence it holds (positions from
    ``state.pos``), and it is left advanced past them (the KV cache and recurrent states; module docstring).
    ``last``: only the last token's logits, (1, vocab) (what a generation step needs).
    Several sequences at once, each layer's weights read once for all: :class:`Batch`.
    """
    if source is None and (hp is None or weights is None):
        raise ValueError("run() without a source needs both hp and weights")
    hp = hp or model_hparams(source)
    w = weights if weights is not None else SourceWeights(source)
    where = escape_name(str(source.root)) if source is not None else "model"
    pos0 = state.pos if state is not None else 0
    ids = _checked_ids(tokens, hp, where, pos0)
    T = ids.size
    total = hp.n_layers + (1 if last else -(-T // chunk))
    seq = _Seq(ids, w.embed(ids) * np.float32(hp.embed_scale), hp, w)
    for i in range(hp.n_layers):
        seq.layer(i, hp, w, pos0, state)
        w.release()
        if progress:
            progress(i + 1, total)
    if state is not None:
        state.pos += T
    first = T - 1 if last else 0  # the first token whose logits are computed
    out = None if on_logits else np.empty((T - first, hp.vocab), dtype=np.float32)
    done = [hp.n_layers]

    def emit(t0, lg):
        if on_logits:
            on_logits(t0, lg)
        else:
            out[t0 - first: t0 - first + lg.shape[0]] = lg

    def step():
        done[0] += 1
        if progress:
            progress(done[0], total)

    seq.head(hp, w, first, chunk, first, emit, step)
    w.release()
    return out


class Batch:
    """Several independent sequences through one weight provider, layer by layer: ``layer(i)`` runs layer i on each
    sequence in turn, then releases the provider, so every layer's weights are read (decoded) once for all of them;
    ``logits(k, ...)`` then gives sequence k's, the output head kept between sequences until :meth:`release`. Each
    sequence's numbers are :func:`run`'s, operation for operation (the same products of the same shapes); only the
    embedding rows of all are looked up in one call. Memory: every sequence's hidden states, one layer's weights."""

    def __init__(self, source, seqs, *, weights: Weights, hp: Hparams):
        where = escape_name(str(source.root)) if source is not None else "model"
        ids = [_checked_ids(s, hp, where) for s in seqs]
        self.hp, self.w = hp, weights
        x = weights.embed(np.concatenate(ids)) * np.float32(hp.embed_scale)
        cut = np.cumsum([a.size for a in ids])[:-1]
        self.seqs = [_Seq(a, xa, hp, weights) for a, xa in zip(ids, np.split(x, cut))]

    def layer(self, i: int) -> None:
        for s in self.seqs:
            s.layer(i, self.hp, self.w)
        self.w.release()

    def logits(self, k: int, on_logits: Callable[[int, np.ndarray], None], *, chunk: int = _LOGIT_CHUNK,
               start: int = 0, step: Callable[[], None] | None = None) -> None:
        """Sequence k's logits in blocks of ``chunk`` tokens (``on_logits(t0, block)``, as :func:`run` gives them),
        from the block holding token ``start`` on (the blocks before it are not computed); ``step()`` after each."""
        self.seqs[k].head(self.hp, self.w, 0, chunk, start, on_logits, step)

    def release(self) -> None:
        self.w.release()


def logits(path, tokens, **kw) -> np.ndarray | None:
    """:func:`run` on the checkpoint at ``path`` (HF folder, .safetensors or .gguf)."""
    src = open_source(path)
    try:
        return run(src, tokens, **kw)
    finally:
        src.close()
