"""LFM2's gated short convolution (transformers' ``Lfm2ShortConv``; llama.cpp's ``build_shortconv_block``), the
mixer of a hybrid's ``shortconv`` layers (orkpack/archs.py ``Blocks``) in the reference forward pass.

    B, C, x = split(in_proj(h), 3)           # (T, H) each, in that order
    y = causal_depthwise_conv(B * x, kernel)  # kernel (H, Lc): y[t] = sum_j kernel[:, j] * (B * x)[t - Lc + 1 + j]
    out = out_proj(C * y)

The kernel is ``blk.N.shortconv.conv.weight`` as the converter lays it out, (H, Lc) in numpy order (the
checkpoint's (H, 1, Lc) squeezed by the reader); positions before the first token are zeros (a fresh
sequence: llama.cpp's conv state starts at zero). Biases (``conv_bias``) are added where the weights hold them.
"""
from __future__ import annotations

import numpy as np

from .hparams import Hparams
from .weights import Weights


def _lin(w: Weights, name: str, x: np.ndarray) -> np.ndarray:
    y = w.matmul(name + ".weight", x)
    return y + w.tensor(name + ".bias") if w.has(name + ".bias") else y


def shortconv(i: int, x: np.ndarray, hp: Hparams, w: Weights) -> np.ndarray:
    """The short-convolution block of layer ``i`` on the normed hidden states ``x`` (T, H) -> (T, H)."""
    p = f"blk.{i}.shortconv."
    T, H = x.shape
    bcx = _lin(w, p + "in_proj", x)
    b, c, v = bcx[:, :H], bcx[:, H: 2 * H], bcx[:, 2 * H: 3 * H]
    bx = b * v
    k = np.asarray(w.tensor(p + "conv.weight"), dtype=np.float32).reshape(H, -1)  # (H, Lc)
    lc = k.shape[1]
    y = np.zeros((T, H), dtype=np.float32)
    for j in range(lc):  # tap j reads the input lc - 1 - j positions back
        back = lc - 1 - j
        if back < T:
            y[back:] += bx[: T - back] * k[:, j]
    if w.has(p + "conv.bias"):
        y += w.tensor(p + "conv.bias")
    return _lin(w, p + "out_proj", c * y)
