"""The Mamba2 mixer (transformers' ``GraniteMoeHybridMambaLayer`` / ``Mamba2Mixer`` torch path; llama.cpp's
``build_mamba2_layer``), the mixer of a hybrid's ``mamba2`` layers (orkpack/archs.py ``Blocks``) in the reference
forward pass.

    z, xBC, dt = split(ssm_in(h), [D, D + 2*G*N, H])     # (T, .) each, in that order
    xBC = silu(causal_depthwise_conv(xBC, kernel) + bias)  # kernel (D + 2GN, K), as shortconv's taps
    x, B, C = split(xBC, [D, G*N, G*N])                   # x: H heads of P = D / H; B, C: G groups of N
    dt = softplus(dt + dt_bias)                           # (T, H)
    S_h = exp(dt_h * A_h) * S_h + dt_h * x_h B_g^T          # per head h of group g = h // (H / G): S_h (P, N)
    y_h = S_h C_g + D_h * x_h
    y = grouped_rms_norm(y * silu(z)) * norm_weight       # RMS over each group's D / G channels (without an
                                                          # ssm_norm.weight: y * silu(z), Falcon-H1's default)
    out = ssm_out(y)

The tensors are read by their canonical GGUF names as llama.cpp's converter lays them out (numpy order):
``ssm_in.weight`` (2D + 2GN + H, E), ``ssm_conv1d.weight`` (D + 2GN, K) with ``ssm_conv1d.bias``,
``ssm_dt.bias`` (H,), ``ssm_a`` (H, 1) = -exp(A_log), ``ssm_d`` (H, 1), ``ssm_norm.weight`` (G, D / G) and
``ssm_out.weight`` (E, D); every size (D, G, N, H, K) is read off those shapes. The scan runs token by token
from a zero state (a fresh sequence: llama.cpp's states start at zero; with a ``state`` slot, from the conv tail
and SSM state the sequence so far left, orkpack/model/state.py), in float64, all heads at once; the
recurrence runs in float on the CPU whatever the pack's numerics (only ssm_in and ssm_out are matrices).
"""
from __future__ import annotations

import numpy as np

from .conv import causal_conv, lin
from .hparams import Hparams
from .weights import Weights


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def mamba2(i: int, x: np.ndarray, hp: Hparams, w: Weights, state: dict | None = None) -> np.ndarray:
    """The Mamba2 block of layer ``i`` on the normed hidden states ``x`` (T, E) -> (T, E); ``state``: its slot of
    the sequence x continues, advanced past x."""
    p = f"blk.{i}."
    T = x.shape[0]
    a = np.asarray(w.tensor(p + "ssm_a"), dtype=np.float64).reshape(-1)  # (H,)
    d_skip = np.asarray(w.tensor(p + "ssm_d"), dtype=np.float64).reshape(-1)
    if w.has(p + "ssm_norm.weight"):
        gain = np.asarray(w.tensor(p + "ssm_norm.weight"), dtype=np.float32)
        G = gain.shape[0] if gain.ndim == 2 else 1
        gain = gain.reshape(-1)
        D = gain.size
    else:  # no gated norm (Falcon-H1's mamba_rms_norm false): y * silu(z); the sizes from the record
        gain, G, D = None, int(hp.ssm["ng"]), int(hp.ssm["di"])
    H = a.size
    k = np.asarray(w.tensor(p + "ssm_conv1d.weight"), dtype=np.float64)
    k = k.reshape(k.shape[0], -1)  # (C, K)
    C_dim, K = k.shape
    N = (C_dim - D) // (2 * G)
    P = D // H

    zxbcdt = lin(w, p + "ssm_in", x).astype(np.float64)
    z, xbc, dt = zxbcdt[:, :D], zxbcdt[:, D: D + C_dim], zxbcdt[:, D + C_dim: D + C_dim + H]

    conv = causal_conv(xbc, k, state)
    if w.has(p + "ssm_conv1d.bias"):
        conv += w.tensor(p + "ssm_conv1d.bias")
    xbc = _silu(conv)
    xs = xbc[:, :D].reshape(T, H, P)
    group = np.arange(H) // (H // G)  # each head's group
    B = xbc[:, D: D + G * N].reshape(T, G, N)[:, group]  # (T, H, N)
    C = xbc[:, D + G * N: D + 2 * G * N].reshape(T, G, N)[:, group]

    dt = np.logaddexp(0.0, dt + np.asarray(w.tensor(p + "ssm_dt.bias"), dtype=np.float64))  # softplus, (T, H)
    decay = np.exp(dt * a)  # (T, H)
    S = state.get("ssm") if state is not None else None
    S = np.zeros((H, P, N)) if S is None else S.copy()
    y = np.empty((T, H, P))
    for t in range(T):
        S *= decay[t][:, None, None]
        S += (dt[t][:, None] * xs[t])[:, :, None] * B[t][:, None, :]
        y[t] = np.einsum("hpn,hn->hp", S, C[t])
    if state is not None:
        state["ssm"] = S
    y += xs * d_skip[:, None]

    g = y.reshape(T, D) * _silu(z)
    if gain is None:
        return lin(w, p + "ssm_out", g.astype(np.float32))
    g = g.reshape(T, G, D // G)
    g = g / np.sqrt((g * g).mean(-1, keepdims=True) + hp.eps)
    out = (g.reshape(T, D).astype(np.float32) * gain)
    return lin(w, p + "ssm_out", out)
