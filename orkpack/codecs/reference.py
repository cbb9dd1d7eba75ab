"""Pure numpy references of the codecs (docs/FORMAT.md section 3).

These functions *define* the bytes of an encoded slice. The C kernels in
kernels/codecs.c must produce exactly the same bytes (tests/test_codecs.py
compares them with ``np.array_equal``), and the NF4 encoder must produce
exactly the bytes of bitsandbytes 0.50.2 ``quantize_4bit(t, blocksize=64,
quant_type="nf4")`` on CPU (tests/test_nf4_bitsandbytes.py). They favour
clarity over speed and hold the whole array in memory.

Input arrays may be float32, float16, or uint16 holding BF16 bits. They are
widened to float32 exactly (f16 by IEEE conversion, bf16 by a 16-bit shift).
Non-finite inputs are counted by the callers and, for a build that allows
them, encoded as if they were 0 (:func:`sanitize`).

NF4, bit for bit as bitsandbytes' CPU path (``backends/default/ops.py``):

* the flattened (row-major) array is cut into blocks of 64; ``absmax`` is the
  block's max ``|x|`` in float32;
* a *full* block is scaled by ``x * (1 / max(absmax, 1e-38f))`` (float32
  reciprocal, then float32 multiply) and its stored absmax is the unclamped
  max (0 for an all-zero block);
* the *tail* block (n % 64 elements) is scaled by ``x / max(absmax, 1e-38f)``
  (a true float32 division), and its stored absmax is the *clamped* value, so an
  all-zero tail block stores 1e-38f (9.99999935e-39);
* the code is the number of float32 midpoints ``(CB[i] + CB[i+1]) / 2`` that
  are strictly below the scaled value (``torch.bucketize``, right=False): a
  value exactly on a midpoint takes the lower code; 0 and -0 take code 7;
  values beyond +-1 take 0 or 15 (bitsandbytes' clamp to [-1, 1] changes no code);
* two codes per byte, element 2i in the high nibble; an odd element count is
  padded with one scaled 0, i.e. the last low nibble is 7.

int8, per output channel, symmetric, round half to even, all float32::

    amax  = max_k |W[r, k]|
    scale = amax / 127                                    -> stored
    inv   = 0 if amax == 0 else min(127 / amax, FLT_MAX)  (127/amax overflows for amax < ~3.7e-37)
    q     = clamp(rint(W[r, k] * inv), -127, 127)
"""
from __future__ import annotations

import math

import numpy as np

NF4_BLOCK = 64

CODEBOOK = np.array(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ],
    dtype=np.float32,
)
# float32 sum, then an exact halving: what torch computes in _get_4bit_quantize_bounds
MIDPOINTS = (CODEBOOK[:-1] + CODEBOOK[1:]) / np.float32(2)
NF4_TINY = np.float32(1e-38)  # bitsandbytes' absmax.clamp(min=1e-38), as float32 (subnormal)
FLT_MAX = np.float32(np.finfo(np.float32).max)
SQNR_CAP = 999.0  # the SQNR reported for an exact encoding (no error at all)


def widen(x: np.ndarray) -> np.ndarray:
    """float32 view/copy of ``x``: float32 as is, float16 exactly, uint16 as BF16 bits."""
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x
    if x.dtype == np.float16:
        return x.astype(np.float32)
    if x.dtype == np.uint16:
        return (x.astype(np.uint32) << 16).view(np.float32)
    raise TypeError(f"codec input must be float32, float16 or uint16 (bf16 bits), not {x.dtype}")


def sanitize(x32: np.ndarray) -> tuple[np.ndarray, int]:
    """(x with every non-finite value replaced by 0, number of non-finite values)."""
    bad = ~np.isfinite(x32)
    n = int(bad.sum())
    if n:
        x32 = np.where(bad, np.float32(0), x32)
    return x32, n


# ---------------------------------------------------------------- NF4

def nf4_scaled(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scaled values of the flattened x, padded to an even count with a 0; absmax[ceil(n/64)])."""
    x, _ = sanitize(widen(x).ravel())
    n = x.size
    full = n // NF4_BLOCK
    rem = n - full * NF4_BLOCK
    absmax = np.empty(full + (rem > 0), dtype=np.float32)
    s = np.zeros(n + (n & 1), dtype=np.float32)
    if full:
        a = x[: full * NF4_BLOCK].reshape(full, NF4_BLOCK)
        am = np.abs(a).max(axis=1)
        absmax[:full] = am
        inv = np.float32(1) / np.maximum(am, NF4_TINY)
        s[: full * NF4_BLOCK] = (a * inv[:, None]).ravel()
    if rem:
        t = x[full * NF4_BLOCK:]
        am = np.maximum(np.abs(t).max(), NF4_TINY)
        absmax[full] = am
        s[full * NF4_BLOCK: n] = t / am
    return s, absmax


def nf4_encode(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NF4 of the row-major flatten of x: (codes uint8[ceil(n/2)], absmax float32[ceil(n/64)])."""
    s, absmax = nf4_scaled(x)
    c = np.searchsorted(MIDPOINTS, s, side="left").astype(np.uint8)
    codes = (c[0::2] << 4) | c[1::2]
    return codes, absmax


def nf4_unpack(codes: np.ndarray, n: int) -> np.ndarray:
    """The n 4-bit codes (uint8) of a packed NF4 byte array."""
    codes = np.asarray(codes, dtype=np.uint8).ravel()
    c = np.empty(codes.size * 2, dtype=np.uint8)
    c[0::2] = codes >> 4
    c[1::2] = codes & 15
    return c[:n]


def nf4_decode(codes: np.ndarray, absmax: np.ndarray, shape) -> np.ndarray:
    """float32 array of ``shape``: CODEBOOK[code] * absmax[block] (one float32 multiply)."""
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape, dtype=np.int64))
    c = nf4_unpack(codes, n)
    blk = np.repeat(np.asarray(absmax, dtype=np.float32), NF4_BLOCK)[:n]
    return (CODEBOOK[c] * blk).reshape(shape)


def nf4_dequant_flat(x: np.ndarray) -> np.ndarray:
    """Encode then decode (flat float32): the values the SQNR compares against."""
    codes, absmax = nf4_encode(x)
    n = np.asarray(x).size
    return nf4_decode(codes, absmax, (n,))


# ---------------------------------------------------------------- int8

def _as_rows(x: np.ndarray) -> np.ndarray:
    x = widen(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"int8 codec takes a 1-D or 2-D slice, not shape {x.shape}")
    return x


def int8_scale_inv(amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, inv) per row from the row amax (float32), as FORMAT.md section 3 defines them."""
    amax = np.asarray(amax, dtype=np.float32)
    scale = amax / np.float32(127)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(127) / amax
    inv = np.where(amax == 0, np.float32(0), np.minimum(inv, FLT_MAX)).astype(np.float32)
    return scale, inv


def int8_encode(x2d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q int8[N, K] row-major, scale float32[N]); a 1-D input is one row."""
    x, _ = sanitize(_as_rows(x2d))
    n_rows, k = x.shape
    amax = np.abs(x).max(axis=1) if k else np.zeros(n_rows, np.float32)
    scale, inv = int8_scale_inv(amax)
    v = x * inv[:, None]
    q = np.clip(np.rint(v), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


def int8_decode(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32 q * scale[row] (q int8[N, K] row-major)."""
    q = np.asarray(q, dtype=np.int8)
    if q.ndim == 1:
        q = q[None, :]
    return q.astype(np.float32) * np.asarray(scale, dtype=np.float32)[:, None]


# ---------------------------------------------------------------- SQNR

def sqnr_db(x: np.ndarray, deq: np.ndarray) -> float:
    """10*log10(sum x^2 / sum (x - deq)^2) in float64, within +-SQNR_CAP (+SQNR_CAP when exact)."""
    x, _ = sanitize(widen(x).ravel())
    x = x.astype(np.float64)
    e = x - np.asarray(deq, dtype=np.float32).ravel().astype(np.float64)
    return sqnr_from_sums(float(np.dot(x, x)), float(np.dot(e, e)))


def sqnr_from_sums(sum_x2: float, sum_err2: float) -> float:
    if sum_err2 <= 0.0:
        return SQNR_CAP
    ratio = sum_x2 / sum_err2
    if not ratio > 0.0:  # no signal, or a dequantized value overflowed float32 (inputs near FLT_MAX)
        return -SQNR_CAP
    return float(min(SQNR_CAP, max(-SQNR_CAP, 10.0 * math.log10(ratio))))


def nf4_to_npu_int8(codes: np.ndarray, absmax: np.ndarray, shape, k_segment: int = 8192) -> tuple[np.ndarray, np.ndarray, dict]:
    """The int8 image an NPU slice stored as nf4 inflates to (docs/FORMAT.md 5):
    decode to float32, quantize to int8 per output channel, tile natively.

    Returns (q_tiled int8 1-D, scale float32[N], npu_int8 layout record). The
    runtime's C direct and two-step inflates must give these bytes exactly.
    """
    from orkpack.layout import npu_layout, tile_int8

    n, k = (int(d) for d in shape)
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite absmax: int8_encode takes those values as 0
        v = nf4_decode(np.asarray(codes, dtype=np.uint8), np.asarray(absmax, dtype=np.float32), (n, k))
    q, scale = int8_encode(v)
    return tile_int8(q, k_segment), scale, npu_layout(n, k, k_segment)


# ---------------------------------------------------------------- NF4, error-minimizing ("opt")
#
# Same format, same decoder: codes + one float32 per 64-block, value = CODEBOOK[code] * absmax[block].
# Only the choice of the stored absmax differs: per block, the d that minimizes the weighted squared
# error  sum_i w_i (x_i - CODEBOOK[c_i(d)] * d)^2,  where c_i(d) is bitsandbytes' code of x_i against d
# (the count of float32 midpoints strictly below x_i * (1/d), a tail block x_i / d: quantize_4bit's own
# rule with d in place of max|x|). The stored absmax may be below max|x| (the largest values then take
# code 0 or 15: clipping) or above it. The candidates (llama.cpp's IQ4_NL / make_qx_quants idea):
#
#   0. bitsandbytes' own choice (d = max|x|): the search never does worse than quantize_4bit, and an
#      all-zero block (max|x| < 1e-38) is exactly quantize_4bit's;
#   1. a scan (its sums in float32: w as float32, sum(w x * q) and sum(w q * q) in element order) over
#      inverse scales s * (1 + j * NF4OPT_STEP) / max|x|, s = +1 then -1, j = -NF4OPT_TRIES ..
#      NF4OPT_TRIES: codes of x * inv, then the least-squares scale of those codes sum(w x q) / sum(w q^2);
#      the scan keeps the one with the largest sum(w x q)^2 / sum(w q^2) (the first on a tie). A negative
#      scale flips the codebook (NF4 has 8 levels above 0 and 7 below): the stored "absmax" is then
#      negative, which bitsandbytes' dequantize_4bit (code value x absmax) reads like any other;
#   2. NF4OPT_ROUNDS refinements from that scale: codes against d, their exact error, then the
#      least-squares refit of d for those codes.
#
# Every candidate (0, and each d of 2) is scored by its exact error (float32 decode, float64 sums); the
# smallest wins, the earlier on a tie. Weights w_i (float64): the column weight cw[k] of element i
# (k = flat index mod K: imatrix mean squares, or 1) times f(x_i): 1 ("plain"), x^2 ("x2"), or
# sqrt(sigma2 + x^2) with sigma2 = 2 * sum(x^2) / 64 over the block ("sigma"). Every float64 sum over a
# block runs in element order from 0: what the C kernel (kernels/nf4opt.c, one block per SIMD lane)
# does, so both give the same bytes.
NF4OPT_TRIES = 2
NF4OPT_STEP = np.float32(3.0 / 32.0)
NF4OPT_ROUNDS = 2
NF4OPT_WEIGHTINGS = ("plain", "x2", "sigma")


def _lanesum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis (64 float64) as the kernel does: in element order, from 0."""
    s = np.zeros(a.shape[:-1], dtype=np.float64)
    for i in range(a.shape[-1]):
        s += a[..., i]
    return s


def _codes_of(s: np.ndarray) -> np.ndarray:
    return np.searchsorted(MIDPOINTS, s, side="left").astype(np.uint8)


def _nf4opt_weights(xb: np.ndarray, cw: np.ndarray, weighting: str) -> np.ndarray:
    x64 = xb.astype(np.float64)
    if weighting == "plain":
        f = np.ones_like(x64)
    elif weighting == "x2":
        f = x64 * x64
    elif weighting == "sigma":
        sigma2 = 2.0 * _lanesum(x64 * x64) / NF4_BLOCK
        f = np.sqrt(sigma2[:, None] + x64 * x64)
    else:
        raise ValueError(f"unknown nf4 weighting {weighting!r}; known: {', '.join(NF4OPT_WEIGHTINGS)}")
    return cw * f


def nf4opt_encode(x: np.ndarray, col_weights: np.ndarray | None = None, weighting: str = "plain",
                  k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Error-minimizing NF4 of the row-major flatten of x (see above): (codes, absmax) as nf4_encode.

    ``col_weights``: float32/float64 [K] per input column (the last axis of x, or ``k``), >= 0, or None."""
    x32, _ = sanitize(widen(x).ravel())
    n = x32.size
    nb = -(-n // NF4_BLOCK)
    kk = int(k if k is not None else (np.asarray(x).shape[-1] if np.asarray(x).ndim else 1))
    xb = np.zeros(nb * NF4_BLOCK, dtype=np.float32)
    xb[:n] = x32
    xb = xb.reshape(nb, NF4_BLOCK)
    idx = np.arange(nb * NF4_BLOCK, dtype=np.int64)
    if col_weights is None:
        cw = np.ones(nb * NF4_BLOCK, dtype=np.float64)
    else:
        cw = np.asarray(col_weights, dtype=np.float64).ravel()[idx % kk]
    cw[n:] = 0.0  # the padding of a tail block weighs nothing
    w = _nf4opt_weights(xb, cw.reshape(nb, NF4_BLOCK), weighting)
    tail = np.zeros(nb, dtype=bool)
    if n % NF4_BLOCK:
        tail[-1] = True
    x64 = xb.astype(np.float64)

    def codes_under(d):  # bitsandbytes' rule against d (per block)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = np.float32(1) / d
            s = np.where(tail[:, None], xb / d[:, None], xb * inv[:, None])
        return _codes_of(s.astype(np.float32))

    def exact_err(c, d):
        deq = CODEBOOK[c] * d[:, None]
        e = x64 - deq.astype(np.float64)
        return _lanesum(w * e * e)

    def refit(c):
        q = CODEBOOK[c].astype(np.float64)
        return _lanesum(w * x64 * q), _lanesum(w * q * q)

    amax = np.abs(xb).max(axis=1)
    live = amax >= NF4_TINY
    d0 = np.where(tail, np.maximum(amax, NF4_TINY), amax).astype(np.float32)
    # bitsandbytes' codes: full blocks x * (1 / max(amax, tiny)), the tail x / max(amax, tiny)
    best_c = codes_under(np.maximum(amax, NF4_TINY).astype(np.float32))
    best_d = d0.copy()
    best_e = exact_err(best_c, best_d)

    safe = np.where(live, amax, np.float32(1)).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        wf = w.astype(np.float32)
        wx = wf * xb
    best_score = np.full(nb, -1.0)
    dscan = np.zeros(nb, dtype=np.float64)
    for sgn, j in [(g, j) for g in (1, -1) for j in range(-NF4OPT_TRIES, NF4OPT_TRIES + 1)]:
        inv = np.float32(sgn) * (np.float32(1) + np.float32(j) * NF4OPT_STEP) / safe
        q = CODEBOOK[_codes_of((xb * inv[:, None]).astype(np.float32))]
        fx, fq = np.zeros(nb, np.float32), np.zeros(nb, np.float32)
        for i in range(NF4_BLOCK):  # float32 sums in element order
            fx += wx[:, i] * q[:, i]
            fq += wf[:, i] * q[:, i] * q[:, i]
        sxq, sqq = fx.astype(np.float64), fq.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            score = np.where(sqq > 0, sxq * sxq / np.where(sqq > 0, sqq, 1.0), -1.0)
            better = (sqq > 0) & (score > best_score)
            best_score = np.where(better, score, best_score)
            dscan = np.where(better, sxq / np.where(sqq > 0, sqq, 1.0), dscan)
    d = dscan.astype(np.float32)
    going = live.copy()
    for _ in range(NF4OPT_ROUNDS):
        with np.errstate(divide="ignore", over="ignore"):
            going &= (d != 0) & np.isfinite(d) & np.isfinite(np.float32(1) / np.where(d != 0, d, np.float32(1)))
        dd = np.where(going, d, np.float32(1)).astype(np.float32)
        c = codes_under(dd)
        e = exact_err(c, dd)
        take = going & (e < best_e)
        best_c = np.where(take[:, None], c, best_c)
        best_d = np.where(take, dd, best_d).astype(np.float32)
        best_e = np.where(take, e, best_e)
        sxq, sqq = refit(c)
        going &= sqq > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            d = (sxq / np.where(sqq > 0, sqq, 1.0)).astype(np.float32)
    flat = best_c.ravel()[:n]
    if n & 1:
        flat = np.concatenate([flat, [np.uint8(7)]])
    codes = (flat[0::2] << 4) | flat[1::2]
    return codes.astype(np.uint8), best_d.astype(np.float32)
