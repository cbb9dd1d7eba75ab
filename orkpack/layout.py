"""The RK3588 NPU native int8 weight layout (docs/FORMAT.md section 4).

A slice ``W[N, K]`` (output channels x input features; the NPU's ``B[K, N]``
transposed) is cut along K into segments ``[k0, k1)`` of at most ``k_segment``
columns; each segment, K padded to ``kp`` (a multiple of 32) and N to ``Np``,
is stored as ``(Np/32, kp/32, 32, 32)`` tiles, one segment after another::

    dst[seg_off + ((i*Kt + j)*32 + n)*32 + k] = W[i*32 + n, k0 + j*32 + k]   (0 outside W)

This module is the numpy reference of that layout; the C kernel
``ork_int8_encode`` (kernels/codecs.c) writes the same bytes directly.
"""
from __future__ import annotations

import numpy as np

TILE_N = 32
TILE_K = 32
K_SEGMENT = 8192


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def npu_layout(n: int, k: int, k_segment: int = K_SEGMENT) -> dict:
    """The layout record of FORMAT.md section 4 for a slice ``[n, k]``."""
    n, k, k_segment = int(n), int(k), int(k_segment)
    if n < 1 or k < 1:
        raise ValueError(f"npu_int8 needs a non-empty 2-D slice, not [{n}, {k}]")
    if k_segment < TILE_K or k_segment % TILE_K:
        raise ValueError(f"k_segment must be a positive multiple of {TILE_K}, not {k_segment}")
    segments = []
    for k0 in range(0, k, k_segment):
        k1 = min(k, k0 + k_segment)
        segments.append([k0, k1, _round_up(k1 - k0, TILE_K)])
    return {
        "kind": "npu_int8",
        "tile_n": TILE_N,
        "tile_k": TILE_K,
        "n_pad": _round_up(n, TILE_N),
        "k_segment": k_segment,
        "segments": segments,
    }


def npu_tiled_size(n: int, k: int, k_segment: int = K_SEGMENT) -> int:
    """Bytes of the tiled int8 image of a ``[n, k]`` slice."""
    lay = npu_layout(n, k, k_segment)
    return lay["n_pad"] * sum(kp for _, _, kp in lay["segments"])


def check_layout(layout: dict, n: int, k: int) -> None:
    """Raise ValueError unless ``layout`` is exactly the npu_int8 record for ``[n, k]``."""
    want = npu_layout(n, k, int(layout.get("k_segment", K_SEGMENT)))
    got = {key: layout.get(key) for key in want}
    got["segments"] = [list(s) for s in (got["segments"] or [])]
    if got != want:
        raise ValueError(f"npu_int8 layout {layout!r} does not match a [{n}, {k}] slice")


def tile_int8(q2d: np.ndarray, k_segment: int = K_SEGMENT) -> np.ndarray:
    """Tile a row-major int8 ``[N, K]`` matrix into the NPU layout (1-D int8)."""
    q2d = np.asarray(q2d, dtype=np.int8)
    n, k = q2d.shape
    lay = npu_layout(n, k, k_segment)
    np_ = lay["n_pad"]
    out = []
    for k0, k1, kp in lay["segments"]:
        seg = np.zeros((np_, kp), dtype=np.int8)
        seg[:n, : k1 - k0] = q2d[:, k0:k1]
        # [Np, kp] -> [Np/32, 32, kp/32, 32] -> [Np/32, kp/32, 32(n), 32(k)]
        out.append(seg.reshape(np_ // TILE_N, TILE_N, kp // TILE_K, TILE_K).transpose(0, 2, 1, 3).ravel())
    return np.concatenate(out)


def untile_int8(buf: np.ndarray, n: int, k: int, layout: dict) -> np.ndarray:
    """Inverse of :func:`tile_int8`: the row-major int8 ``[n, k]`` matrix."""
    check_layout(layout, n, k)
    buf = np.asarray(buf, dtype=np.int8).ravel()
    np_ = layout["n_pad"]
    if buf.size != np_ * sum(kp for _, _, kp in layout["segments"]):
        raise ValueError(f"tiled buffer holds {buf.size} bytes, layout needs {npu_tiled_size(n, k, layout['k_segment'])}")
    q = np.empty((n, k), dtype=np.int8)
    off = 0
    for k0, k1, kp in layout["segments"]:
        size = np_ * kp
        seg = buf[off: off + size].reshape(np_ // TILE_N, kp // TILE_K, TILE_N, TILE_K).transpose(0, 2, 1, 3)
        q[:, k0:k1] = seg.reshape(np_, kp)[:n, : k1 - k0]
        off += size
    return q
