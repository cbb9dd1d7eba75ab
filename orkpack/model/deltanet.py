"""Qwen3.5 / Qwen3-Next's Gated DeltaNet (transformers' ``Qwen3_5GatedDeltaNet``; llama.cpp's
``build_layer_attn_linear``), the mixer of a hybrid's ``deltanet`` layers in the reference forward pass.

On the normed hidden states x (T, H), with key heads ``ng`` of ``ds`` dims and value heads ``nv`` of ``dv``:

    qkv = silu(causal_depthwise_conv(attn_qkv(x), ssm_conv1d))     # (T, 2 ng ds + nv dv)
    q, k, v = split(qkv); q, k = l2norm(q), l2norm(k) (eps 1e-6); q /= sqrt(ds)
    beta = sigmoid(ssm_beta(x)); g = ssm_a * softplus(ssm_alpha(x) + ssm_dt.bias)   # (T, nv); ssm_a = -exp(A_log)
    per value head h, with its key head kh(h), a state S (ds, dv) from zeros:
        S = exp(g_t) S;  S += k_t (beta_t (v_t - k_t S));  o_t = q_t S
    out = ssm_out(rmsnorm(o) * ssm_norm * silu(attn_gate(x)))      # the gated RMSNorm per value head

The weights are read in llama.cpp's converter layout (orkpack/sources/convlayout.py and the archs ``Split`` make an
HF folder read so), which the family declares (archs ``Forward``): ``vheads`` tiled (Qwen3.5: value head h uses key
head ``h % ng``) or grouped (Qwen3-Next, transformers' own order: ``h // (nv / ng)``); ``beta_alpha`` split
(``ssm_beta``, ``ssm_alpha``) or fused (Qwen3-Next's ``ssm_ba``: per key head its value heads' beta, then their
alpha).
With a ``state`` slot (orkpack/model/state.py) the conv tail and S start where the sequence so far left them.
The recurrence runs token by token in float32 on the CPU (as the board runs it): only its matrices see the NPU's
numerics.
"""
from __future__ import annotations

import numpy as np
from scipy.special import expit

from .conv import causal_conv, lin
from .hparams import Hparams
from .weights import Weights


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(1e-6))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)  # torch's threshold 20


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
               S: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule over T tokens: q, k (T, nv, ds), v (T, nv, dv), g and beta (T, nv) -> ((T, nv, dv),
    the state after them); ``S``: the state before them (zeros: a fresh sequence)."""
    T, nv, ds = k.shape
    S = np.zeros((nv, ds, v.shape[2]), dtype=np.float32) if S is None else S.copy()
    out = np.empty_like(v)
    decay = np.exp(g).astype(np.float32)
    for t in range(T):
        S *= decay[t][:, None, None]
        mem = np.einsum("hk,hkv->hv", k[t], S)
        delta = (v[t] - mem) * beta[t][:, None]
        S += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q[t], S)
    return out, S


def deltanet(i: int, x: np.ndarray, hp: Hparams, w: Weights, state: dict | None = None) -> np.ndarray:
    """The Gated DeltaNet block of layer ``i`` on the normed hidden states ``x`` (T, H) -> (T, H); ``state``: its
    slot of the sequence x continues, advanced past x."""
    p = f"blk.{i}."
    T = x.shape[0]
    ng, ds, di = hp.ssm["ng"], hp.ssm["ds"], hp.ssm["di"]
    a = np.asarray(w.tensor(p + "ssm_a"), dtype=np.float32)
    nv = a.shape[0]
    dv = di // nv
    kernel = np.asarray(w.tensor(p + "ssm_conv1d.weight"), dtype=np.float32).reshape(2 * ng * ds + di, -1)
    qkv = causal_conv(lin(w, p + "attn_qkv", x), kernel, state)
    if w.has(p + "ssm_conv1d.bias"):
        qkv = qkv + w.tensor(p + "ssm_conv1d.bias")
    qkv = qkv * expit(qkv)
    q = qkv[:, : ng * ds].reshape(T, ng, ds)
    k = qkv[:, ng * ds: 2 * ng * ds].reshape(T, ng, ds)
    v = qkv[:, 2 * ng * ds:].reshape(T, nv, dv)
    q, k = _l2norm(q) / np.float32(np.sqrt(ds)), _l2norm(k)
    rep = nv // ng
    if hp.fwd.vheads == "grouped":  # head h reads key head h // rep
        q, k = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)
    else:  # tiled: head h reads key head h % ng
        q, k = np.tile(q, (1, rep, 1)), np.tile(k, (1, rep, 1))
    if hp.fwd.beta_alpha == "fused":  # per key head [beta of its rep value heads | their alpha]
        ba = lin(w, p + "ssm_ba", x).reshape(T, ng, 2 * rep)
        b, al = ba[..., :rep].reshape(T, nv), ba[..., rep:].reshape(T, nv)
    else:
        b, al = lin(w, p + "ssm_beta", x), lin(w, p + "ssm_alpha", x)
    beta = expit(b)
    g = a * _softplus(al + w.tensor(p + "ssm_dt.bias"))
    o, S = delta_rule(q, k, v, g.astype(np.float32), beta.astype(np.float32),
                      state.get("S") if state is not None else None)
    if state is not None:
        state["S"] = S
    z = lin(w, p + "attn_gate", x).reshape(T, nv, dv)
    o = o / np.sqrt((o * o).mean(-1, keepdims=True) + np.float32(hp.eps))
    o = o * w.tensor(p + "ssm_norm.weight") * (z * expit(z))
    return lin(w, p + "ssm_out", o.reshape(T, di).astype(np.float32))
