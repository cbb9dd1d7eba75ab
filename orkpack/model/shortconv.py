"""LFM2's gated short convolution (transformers' ``Lfm2ShortConv``; llama.cpp's ``build_shortconv_block``), the
mixer of a hybrid's ``shortconv`` layers (orkpack/archs.py ``Blocks``) in the reference forward pass.

    B, C, x = split(in_proj(h), 3)           # (T, H) each, in that order
    y = causal_depthwise_conv(B * x, kernel)  # kernel (H, Lc): y[t] = sum_j kernel[:, j] * (B * x)[t - Lc + 1 + j]
    out = out_proj(C * y)

The kernel is ``blk.N.shortconv.conv.weight`` as the converter lays it out, (H, Lc) in numpy order (the
checkpoint's (H, 1, Lc) squeezed by the reader); positions before the first token are zeros (a fresh
sequence: llama.cpp's conv state starts at zero; with a ``state`` slot, the tail the sequence so far left,
orkpack/model/state.py). Biases (``conv_bias``) are added where the weights hold them.
"""
from __future__ import annotations

import numpy as np

from .conv import causal_conv, lin
from .hparams import Hparams
from .weights import Weights


def shortconv(i: int, x: np.ndarray, hp: Hparams, w: Weights, state: dict | None = None) -> np.ndarray:
    """The short-convolution block of layer ``i`` on the normed hidden states ``x`` (T, H) -> (T, H); ``state``:
    its slot of the sequence x continues (orkpack/model/state.py), advanced past x."""
    p = f"blk.{i}.shortconv."
    T, H = x.shape
    bcx = lin(w, p + "in_proj", x)
    b, c, v = bcx[:, :H], bcx[:, H: 2 * H], bcx[:, 2 * H: 3 * H]
    k = np.asarray(w.tensor(p + "conv.weight"), dtype=np.float32).reshape(H, -1)  # (H, Lc)
    y = causal_conv((b * v).astype(np.float32), k, state)
    if w.has(p + "conv.bias"):
        y += w.tensor(p + "conv.bias")
    return lin(w, p + "out_proj", c * y)
