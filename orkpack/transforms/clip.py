"""Error-minimizing clipping of int8 weights, per output channel, weighted by activation statistics.

The int8 codec (docs/FORMAT.md 3) spends its 127 steps on ``[-max|w_row|, max|w_row|]``. A row whose
largest weights are rare outliers loses resolution on the rest; clipping the row to ``c * max``
(c < 1) trades a larger error on the few outliers for a finer step everywhere else. Per row, ``c``
is chosen from :data:`RATIOS` to minimize the expected squared output error
``sum_k m[k] (Q(w)[k] - w[k])^2``, ``m[k]`` the mean square of input column k from the statistics of
``orkpack imatrix`` (llama.cpp's imatrix idea), so a weight on a busy input column counts more.

It is applied as a clamp of the row to ``[-c max, c max]`` before encoding, so the codec, the format
and every reader are unchanged: the int8 scale is then ``c max / 127`` and the codes those of the
clipping quantizer; a dual-resident slice's host NF4 copy encodes the same clamped row (the two
copies stay consistent, ``verify --reference``). Only int8 slices (host int8, NPU int8 tiles) are
clipped; NF4-only slices keep their values.

Measured on SmolLM2-135M (docs/EVAL.md): without statistics (every column weighted alike) clipping cuts
the int8 weights' squared error by under 1 % and is not done; with them, by ~8 %, and the all-int8
weights-only KLD by ~16 %.
"""
from __future__ import annotations

import numpy as np

from ..codecs import reference as ref
from ..sources.base import as_float32
from .smooth import smoothed_mean_sq

RATIOS = (1.0, 0.98, 0.96, 0.94, 0.92, 0.9, 0.88, 0.85, 0.82, 0.8)


def ratios(w: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Per row of ``w`` (float32 [N, K]), the ratio of RATIOS whose int8 encoding of the clamped row has the least
    error weighted by ``m`` (float64 [K]); ties go to the larger ratio (1: no clipping)."""
    amax = np.abs(w).max(axis=1, keepdims=True)
    best = np.full(w.shape[0], np.inf)
    out = np.ones(w.shape[0], np.float32)
    for c in RATIOS:
        lim = (amax * np.float32(c)).astype(np.float32)
        wc = np.clip(w, -lim, lim)
        q, scale = ref.int8_encode(wc)
        d = ref.int8_decode(q, scale).astype(np.float64) - w
        e = (d * d) @ m
        take = e < best
        best = np.where(take, e, best)
        out[take] = c
    return out


def clamp(w: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, int]:
    """(``w`` with each row clamped to its chosen ratio of its max |w| (float32), rows clipped)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    c = ratios(w, np.asarray(m, np.float64))
    if np.all(c == 1):
        return w, 0
    lim = (np.abs(w).max(axis=1) * c).astype(np.float32)[:, None]
    return np.clip(w, -lim, lim).astype(np.float32), int(np.count_nonzero(c < 1))


def clip_slice(x: np.ndarray, name: str, expert: int | None, stats, smoothing=None) -> tuple[np.ndarray, int]:
    """(an int8 slice clamped row by row with the statistics of its input columns, rows clipped); the mean squares
    are divided by the smoothing scales its columns took (the input it meets is x / s); ``x`` unchanged (0 rows)
    without statistics for it. An untied copy (the head) takes its original's statistics, gathered from the tied
    model; its original is clipped as when it was tied (the lookups read the same int8 rows)."""
    k = x.shape[1]
    if name not in stats and smoothing is not None and name in smoothing.untied:
        name_st = smoothing.untied[name]
    else:
        name_st = name
    m = stats.mean_sq(name_st, expert, k=k) if name_st in stats else None
    if m is None:
        return x, 0
    m = smoothed_mean_sq(m, smoothing.ops.get(name, []) if smoothing is not None else [])
    return clamp(as_float32(x), m)


def record(stats_file: str, counts: dict) -> dict:
    """The pack's ``provenance.clipping`` (docs/FORMAT.md section 10). Its ``method`` text is recorded in every
    clipped pack: kept word for word (it names this module's old path) so that packs stay byte-identical."""
    return {"method": "int8 rows clamped to the ratio of their max |w| with the least "
                      "squared error weighted by the statistics' mean squares (orkpack/clip.py)",
            "ratios": list(RATIOS), "stats": stats_file} | counts
