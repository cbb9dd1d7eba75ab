"""RWKV7's time mix and channel mix (fla-hub's ``RWKV7Attention`` / ``RWKV7FeedForward``; llama.cpp's
``build_rwkv7_time_mix`` / ``build_rwkv7_channel_mix``), the mixer and the FFN of an ``rwkv7`` layer in the reference
forward pass.

On the normed hidden states x (T, H), with x_prev the same shifted one token (zeros before the first; with a
``state`` slot, orkpack/model/state.py, the last x of the sequence so far, and S where it left it):

    xr, xw, xk, xv, xa, xg = x + (x_prev - x) * time_mix_lerp_fused          # six token-shift lerps
    r = receptance(xr); k = key(xk); v = value(xv)
    w = exp(-e^-1/2 * sigmoid(w0 + w2 tanh(w1 xw)))                           # the decay, in (e^-0.61, 1)
    v = v + (v_first - v) * sigmoid(v0 + v2 v1 xv)   (layers > 0; v_first: layer 0's v)
    a = sigmoid(a0 + a2 a1 xa); g = g2 sigmoid(g1 xg)
    kk = l2norm(k * k_k) per head (eps 1e-12); k = k * (1 + (a - 1) * k_a)
    per head, a state S (hs x hs, value i x key j) from zeros, token by token (ggml's rwkv_wkv7):
        sa = S (-kk);  S = S * w + v k^T + sa (kk * a)^T;  o = S r
    o = LayerNorm(o) per head (eps hs x norm_eps; llama.cpp's graph: 64e-5, the same for head size 64 and 1e-5)
        * ln_x.weight + ln_x.bias + (sum over the head of r * k * r_k) * v
    out = output(o * g)

The channel mix: k = relu(channel_mix_key(x + (x_prev - x) * lerp_k))^2; out = channel_mix_value(k).

The weights are read in llama.cpp's converter layout (the archs ``Stack``, ``copies`` and ``reshape`` make an HF
folder read so). The recurrence runs token by token in float32 on the CPU (as the board runs it): only the matrices
see the NPU's numerics.
"""
from __future__ import annotations

import numpy as np
from scipy.special import expit

from .conv import lin
from .hparams import Hparams
from .weights import Weights

_DECAY = np.float32(np.exp(-0.5))  # fla's 0.6065306597126334 (llama.cpp's graph: 0.606531)


def _shifted(x: np.ndarray, state: dict | None = None) -> np.ndarray:
    """x one token later: row t holds x[t - 1], row 0 zeros (the token shift of a fresh sequence) or, with a
    ``state`` slot, the last x it holds (then the slot keeps x's last row)."""
    out = np.zeros_like(x)
    out[1:] = x[:-1]
    if state is not None:
        if "shift" in state:
            out[0] = state["shift"]
        state["shift"] = x[-1].copy()
    return out


def wkv7(r: np.ndarray, w: np.ndarray, k: np.ndarray, v: np.ndarray, a: np.ndarray, b: np.ndarray,
         S: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """ggml's rwkv_wkv7 over T tokens: every argument (T, heads, hs) -> (the outputs (T, heads, hs), the state after
    them); ``S``: the state before them (zeros: a fresh sequence)."""
    T, nh, hs = r.shape
    if S is None:
        S = np.zeros((nh, hs, hs), dtype=np.float32)  # (head, value i, key j)
    out = np.empty_like(v)
    for t in range(T):
        sa = np.einsum("hij,hj->hi", S, a[t])
        S = S * w[t][:, None, :] + v[t][:, :, None] * k[t][:, None, :] + sa[:, :, None] * b[t][:, None, :]
        out[t] = np.einsum("hij,hj->hi", S, r[t])
    return out, S


def time_mix(i: int, x: np.ndarray, hp: Hparams, w: Weights, store: dict, state: dict | None = None) -> np.ndarray:
    """The time mix of layer ``i`` on the normed hidden states ``x`` (T, H) -> (T, H); ``store`` keeps layer 0's
    values (of the same tokens) for the later layers' value residual; ``state``: its slot of the sequence x
    continues, advanced past x."""
    p = f"blk.{i}."
    T, H = x.shape
    hs = hp.ssm["hs"]
    nh = H // hs
    mix = w.tensor(p + "time_mix_lerp_fused.weight").reshape(-1, H)
    sx = _shifted(x, state) - x
    xr, xw, xk, xv, xa, xg = (x + sx * mix[j] for j in range(6))
    r = lin(w, p + "time_mix_receptance", xr)
    k = lin(w, p + "time_mix_key", xk)
    v = lin(w, p + "time_mix_value", xv)
    dec = w.tensor(p + "time_mix_w0.weight") + lin(w, p + "time_mix_w2", np.tanh(lin(w, p + "time_mix_w1", xw)))
    decay = np.exp(-_DECAY * expit(dec)).astype(np.float32)
    if "rwkv7_v_first" not in store:
        store["rwkv7_v_first"] = v
    else:
        mixv = expit(w.tensor(p + "time_mix_v0.weight") + lin(w, p + "time_mix_v2", lin(w, p + "time_mix_v1", xv)))
        v = v + (store["rwkv7_v_first"] - v) * mixv
    g = lin(w, p + "time_mix_g2", expit(lin(w, p + "time_mix_g1", xg)))
    a = expit(w.tensor(p + "time_mix_a0.weight") + lin(w, p + "time_mix_a2", lin(w, p + "time_mix_a1", xa)))
    kk = (k * w.tensor(p + "time_mix_k_k.weight")).reshape(T, nh, hs)
    kk = kk / np.maximum(np.sqrt((kk * kk).sum(-1, keepdims=True)), np.float32(1e-12))
    k = k * (np.float32(1) + (a - np.float32(1)) * w.tensor(p + "time_mix_k_a.weight"))
    heads = lambda z: z.reshape(T, nh, hs).astype(np.float32)  # noqa: E731
    r3, k3, v3, a3 = heads(r), heads(k), heads(v), heads(a)
    o, S = wkv7(r3, heads(decay), k3, v3, -kk, kk * a3, state.get("wkv") if state is not None else None)
    if state is not None:
        state["wkv"] = S
    mu = o.mean(-1, keepdims=True)
    oc = o - mu
    o = oc / np.sqrt((oc * oc).mean(-1, keepdims=True) + np.float32(hs * hp.eps))
    o = o.reshape(T, H) * w.tensor(p + "time_mix_ln.weight") + w.tensor(p + "time_mix_ln.bias")
    rk = (r3 * k3 * w.tensor(p + "time_mix_r_k.weight").reshape(nh, hs)).sum(-1, keepdims=True)
    o = o + (rk * v3).reshape(T, H)
    return lin(w, p + "time_mix_output", (o * g).astype(np.float32))


def channel_mix(i: int, x: np.ndarray, hp: Hparams, w: Weights, state: dict | None = None) -> np.ndarray:
    """The channel mix of layer ``i`` on the normed hidden states ``x`` (T, H) -> (T, H); ``state``: its slot of
    the sequence x continues, advanced past x."""
    p = f"blk.{i}."
    xk = x + (_shifted(x, state) - x) * w.tensor(p + "channel_mix_lerp_k.weight").reshape(-1)
    h = np.maximum(lin(w, p + "channel_mix_key", xk), np.float32(0))
    return lin(w, p + "channel_mix_value", (h * h).astype(np.float32))
