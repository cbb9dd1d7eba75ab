"""What the recurrent mixers share (orkpack/model/shortconv.py, deltanet.py, mamba2.py): a linear layer with its
optional bias, and the depthwise causal convolution of a fresh sequence.

    y[t] = sum_j kernel[:, j] * x[t - K + 1 + j]      kernel (C, K), x (T, C); positions before 0 are zeros

(llama.cpp's conv states start at zero; tap j reads the input K - 1 - j positions back). Given a ``state`` slot
(orkpack/model/state.py), x continues the sequence whose last K - 1 inputs the slot holds under ``conv`` (zeros for
a fresh one), and the slot is left holding the last K - 1 inputs of the sequence with x.
"""
from __future__ import annotations

import numpy as np

from .weights import Weights


def lin(w: Weights, name: str, x: np.ndarray) -> np.ndarray:
    """``name``.weight times x, plus ``name``.bias where the weights hold one."""
    y = w.matmul(name + ".weight", x)
    return y + w.tensor(name + ".bias") if w.has(name + ".bias") else y


def causal_conv(x: np.ndarray, kernel: np.ndarray, state: dict | None = None) -> np.ndarray:
    """The depthwise causal convolution of x (T, C) with kernel (C, K), in x's dtype; ``state``: the slot of the
    sequence x continues (see the module docstring)."""
    if state is None:
        return _conv(x, kernel)
    K = kernel.shape[1]
    tail = state.get("conv")
    if tail is None:
        tail = np.zeros((K - 1, x.shape[1]), dtype=x.dtype)
    ext = np.concatenate([tail, x])
    state["conv"] = ext[ext.shape[0] - (K - 1):].copy()
    return _conv(ext, kernel)[K - 1:]


def _conv(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    T, K = x.shape[0], kernel.shape[1]
    y = np.zeros_like(x)
    for j in range(K):
        back = K - 1 - j
        if back < T:
            y[back:] += x[: T - back] * kernel[:, j]
    return y
