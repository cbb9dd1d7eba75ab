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


def _lanesum(a: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Sum over the last axis (float64, or float32 for a float32 ``a``) as the kernel does: in element order, from 0."""
    s = np.zeros(a.shape[:-1], dtype=dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(a.shape[-1]):
            s += a[..., i]
    return s


def _codes_of(s: np.ndarray) -> np.ndarray:
    return np.searchsorted(MIDPOINTS, s, side="left").astype(np.uint8)


def _nf4opt_weights(xb: np.ndarray, cw: np.ndarray, weighting: str, block: int = NF4_BLOCK) -> np.ndarray:
    x64 = xb.astype(np.float64)
    if weighting == "plain":
        f = np.ones_like(x64)
    elif weighting == "x2":
        f = x64 * x64
    elif weighting == "sigma":
        sigma2 = 2.0 * _lanesum(x64 * x64) / block
        f = np.sqrt(sigma2[:, None] + x64 * x64)
    else:
        raise ValueError(f"unknown nf4 weighting {weighting!r}; known: {', '.join(NF4OPT_WEIGHTINGS)}")
    return cw * f


def _blocks(x: np.ndarray, col_weights, k: int | None, block: int) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(n, blocks, x as float32 [blocks, block] zero-padded, each element's column weight as float64 [blocks * block],
    0 on the padding) of the row-major flatten of x; column k of an element is its index mod ``k`` (x's last axis)."""
    x32, _ = sanitize(widen(x).ravel())
    n = x32.size
    nb = -(-n // block)
    kk = int(k if k is not None else (np.asarray(x).shape[-1] if np.asarray(x).ndim else 1))
    xb = np.zeros(nb * block, dtype=np.float32)
    xb[:n] = x32
    xb = xb.reshape(nb, block)
    if col_weights is None:
        cw = np.ones(nb * block, dtype=np.float64)
    else:
        cw = np.asarray(col_weights, dtype=np.float64).ravel()[np.arange(nb * block, dtype=np.int64) % kk]
    cw[n:] = 0.0  # the padding of a tail block weighs nothing
    return n, nb, xb, cw


def nf4opt_encode(x: np.ndarray, col_weights: np.ndarray | None = None, weighting: str = "plain",
                  k: int | None = None, block: int = NF4_BLOCK,
                  tries: int = NF4OPT_TRIES) -> tuple[np.ndarray, np.ndarray]:
    """Error-minimizing NF4 of the row-major flatten of x (see above): (codes, absmax) as nf4_encode.

    ``col_weights``: float32/float64 [K] per input column (the last axis of x, or ``k``), >= 0, or None.
    ``block``: the block length (64: the nf4 encoding; 32: the first step of nf4dq, :func:`nf4dq_encode`).
    ``tries``: the scan's j runs over -tries .. tries (NF4OPT_TRIES for nf4, NF4DQ_TRIES for nf4dq)."""
    NF4_BLOCK = block  # noqa: N806 (the same algorithm at either block length)
    n, nb, xb, cw = _blocks(x, col_weights, k, NF4_BLOCK)
    w = _nf4opt_weights(xb, cw.reshape(nb, NF4_BLOCK), weighting, NF4_BLOCK)
    tail = np.zeros(nb, dtype=bool)
    if n % NF4_BLOCK:
        tail[-1] = True
    x64 = xb.astype(np.float64)

    def codes_under(d):  # bitsandbytes' rule against d (per block)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = np.float32(1) / d
            s = np.where(tail[:, None], xb / d[:, None], xb * inv[:, None])
        return _codes_of(s.astype(np.float32))

    with np.errstate(over="ignore", invalid="ignore"):
        wf = w.astype(np.float32)
        wx = wf * xb
    f32 = NF4_BLOCK == NF4DQ_BLOCK  # nf4dq's first step: the sums of steps 0 and 2 in float32 (see above)

    def exact_err(c, d):
        deq = CODEBOOK[c] * d[:, None]
        if f32:
            with np.errstate(over="ignore", invalid="ignore"):
                e = xb - deq
                return _lanesum(wf * e * e, np.float32)
        e = x64 - deq.astype(np.float64)
        return _lanesum(w * e * e)

    def refit(c):
        if f32:
            q = CODEBOOK[c]
            with np.errstate(over="ignore", invalid="ignore"):
                return _lanesum(wx * q, np.float32), _lanesum(wf * q * q, np.float32)
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
    best_score = np.full(nb, -1.0)
    dscan = np.zeros(nb, dtype=np.float64)
    for sgn, j in [(g, j) for g in (1, -1) for j in range(-tries, tries + 1)]:
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
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            d = (sxq / np.where(sqq > 0, sqq, sqq.dtype.type(1))).astype(np.float32)
    flat = best_c.ravel()[:n]
    if n & 1:
        flat = np.concatenate([flat, [np.uint8(7)]])
    codes = (flat[0::2] << 4) | flat[1::2]
    return codes.astype(np.uint8), best_d.astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# nf4dq: bitsandbytes' NF4 at blocksize=32 with compress_statistics=True (its "double quantization").
#
# A slice of n elements has nb = ceil(n / 32) blocks and ng = ceil(nb / 256) groups of blocks. Parts:
#   codes          uint8[ceil(n / 2)]   the NF4 codes, two per byte, element 2i in the high nibble (as nf4)
#   absmax_q       uint8[nb]            each block's absmax as an index into DQ_CODE
#   absmax_scale   float32[ng]          each group's scale (bitsandbytes' state2.absmax)
#   absmax_offset  float32[1]           the slice's offset (bitsandbytes' quant_state.offset)
# Decode, all float32 (bitsandbytes' dequantize_4bit of a nested QuantState, bit for bit):
#   absmax[b] = (DQ_CODE[absmax_q[b]] * absmax_scale[b // 256]) + absmax_offset
#   value[e]  = CODEBOOK[code[e]] * absmax[e // 32]
# 4 + 8/32 + 32/8192 = 4.254 bits per weight (nf4: 4.5).
#
# The encoder (the bytes, :func:`nf4dq_encode`; kernels/nf4opt.c gives the same):
#   1. each block's error-minimizing absmax d[b]: nf4opt_encode at block 32 with a scan of j = -1 .. 1
#      (NF4DQ_TRIES; its codes are dropped); at block 32 the error and refit sums of its candidates 0 and 2
#      are float32 (w as float32, (w e) e and (w x) q, (w q) q in element order), not float64;
#   2. offset = float32(sum of d[b] in block order, in float64, / nb);
#      per group: r = float32(d - offset), scale = max |r| (float32); q0 = the number of DQ_MID strictly
#      below float32(r / scale) (0 when scale is 0: DQ_CODE[127] = 0);
#   3. per block, candidates q0, q0-1, q0+1 (NF4DQ_CANDIDATES, those in 0..255): a = its decoded absmax,
#      codes = nearest NF4 codes of float32(x * float32(1 / a)) (all code 7 when a is 0 or 1 / a is not
#      finite), error = the weighted squared error sum((w e) e), all float32 in element order (w as float32,
#      e = x - code value * a); the first candidate with the least error is kept.
# The scan of step 1 (6 scales instead of nf4's 10) and the 3 candidates of step 3 (not 5) cost 0.03 dB of
# median SQNR on the MiniLM checkpoint (22.24 against 22.27 dB; bitsandbytes' nf4 at 64: 20.61); the float32
# sums cost nothing measurable there (22.24). Together they make the encode (the default build's NF4 encoding)
# ~2x faster on one core than with nf4's float64 sums, 10 scales and 5 candidates.
# ---------------------------------------------------------------------------------------------------------
NF4DQ_BLOCK = 32
NF4DQ_GROUP = 256
NF4DQ_TRIES = 1
NF4DQ_CANDIDATES = (0, -1, 1)
# bitsandbytes' create_dynamic_map(signed=True) (its 8-bit blockwise code), as float32 bits
DQ_CODE = np.array([
    0xbf7e3333, 0xbf7a999a, 0xbf770000, 0xbf736666, 0xbf6fcccd, 0xbf6c3333, 0xbf68999a, 0xbf650000,
    0xbf616666, 0xbf5dcccd, 0xbf5a3333, 0xbf56999a, 0xbf530000, 0xbf4f6666, 0xbf4bcccd, 0xbf483333,
    0xbf44999a, 0xbf410000, 0xbf3d6666, 0xbf39cccd, 0xbf363334, 0xbf32999a, 0xbf2f0000, 0xbf2b6666,
    0xbf27cccd, 0xbf243334, 0xbf20999a, 0xbf1d0000, 0xbf196666, 0xbf15cccd, 0xbf123334, 0xbf0e999a,
    0xbf0b0000, 0xbf076666, 0xbf03cccc, 0xbf003333, 0xbef93332, 0xbef20000, 0xbeeacccc, 0xbee3999a,
    0xbedc6666, 0xbed53333, 0xbece0000, 0xbec6cccc, 0xbebf999a, 0xbeb86666, 0xbeb13333, 0xbeaa0000,
    0xbea2cccc, 0xbe9b999a, 0xbe946666, 0xbe8d3334, 0xbe860000, 0xbe7d9999, 0xbe6f3333, 0xbe60cccd,
    0xbe526666, 0xbe440000, 0xbe35999a, 0xbe273333, 0xbe18cccd, 0xbe0a6666, 0xbdf80000, 0xbddb3334,
    0xbdc9eb85, 0xbdc428f7, 0xbdbe6667, 0xbdb8a3d7, 0xbdb2e148, 0xbdad1eb8, 0xbda75c2a, 0xbda1999a,
    0xbd9bd70a, 0xbd96147b, 0xbd9051eb, 0xbd8a8f5d, 0xbd84cccd, 0xbd7e147b, 0xbd728f5d, 0xbd670a3d,
    0xbd5b851f, 0xbd500000, 0xbd447ae1, 0xbd38f5c3, 0xbd2d70a3, 0xbd21eb85, 0xbd166667, 0xbd0ae148,
    0xbcfeb852, 0xbce7ae15, 0xbcd0a3d7, 0xbcb9999a, 0xbca28f5d, 0xbc8b851f, 0xbc68f5c3, 0xbc3ae148,
    0xbc1f3b64, 0xbc160418, 0xbc0ccccd, 0xbc039581, 0xbbf4bc6a, 0xbbe24dd3, 0xbbcfdf3b, 0xbbbd70a4,
    0xbbab020d, 0xbb989374, 0xbb8624dd, 0xbb676c8a, 0xbb428f5c, 0xbb1db22d, 0xbaf1a9fc, 0xbaa7ef9d,
    0xba7765ff, 0xba59e83e, 0xba3c6a80, 0xba1eecc1, 0xba016f01, 0xb9c7e283, 0xb98ce705, 0xb923d70b,
    0xb8ba1f4b, 0xb88aefb3, 0xb8378034, 0xb7b24206, 0xb70205ff, 0xb65a1a94, 0xb513a3b7, 0x00000000,
    0x3513a3b7, 0x365a1a94, 0x370205ff, 0x37b24206, 0x38378034, 0x388aefb3, 0x38ba1f4b, 0x3923d70b,
    0x398ce705, 0x39c7e283, 0x3a016f01, 0x3a1eecc1, 0x3a3c6a80, 0x3a59e83e, 0x3a7765ff, 0x3aa7ef9d,
    0x3af1a9fc, 0x3b1db22d, 0x3b428f5c, 0x3b676c8a, 0x3b8624dd, 0x3b989374, 0x3bab020d, 0x3bbd70a4,
    0x3bcfdf3b, 0x3be24dd3, 0x3bf4bc6a, 0x3c039581, 0x3c0ccccd, 0x3c160418, 0x3c1f3b64, 0x3c3ae148,
    0x3c68f5c3, 0x3c8b851f, 0x3ca28f5d, 0x3cb9999a, 0x3cd0a3d7, 0x3ce7ae15, 0x3cfeb852, 0x3d0ae148,
    0x3d166667, 0x3d21eb85, 0x3d2d70a3, 0x3d38f5c3, 0x3d447ae1, 0x3d500000, 0x3d5b851f, 0x3d670a3d,
    0x3d728f5d, 0x3d7e147b, 0x3d84cccd, 0x3d8a8f5d, 0x3d9051eb, 0x3d96147b, 0x3d9bd70a, 0x3da1999a,
    0x3da75c2a, 0x3dad1eb8, 0x3db2e148, 0x3db8a3d7, 0x3dbe6667, 0x3dc428f7, 0x3dc9eb85, 0x3ddb3334,
    0x3df80000, 0x3e0a6666, 0x3e18cccd, 0x3e273333, 0x3e35999a, 0x3e440000, 0x3e526666, 0x3e60cccd,
    0x3e6f3333, 0x3e7d9999, 0x3e860000, 0x3e8d3334, 0x3e946666, 0x3e9b999a, 0x3ea2cccc, 0x3eaa0000,
    0x3eb13333, 0x3eb86666, 0x3ebf999a, 0x3ec6cccc, 0x3ece0000, 0x3ed53333, 0x3edc6666, 0x3ee3999a,
    0x3eeacccc, 0x3ef20000, 0x3ef93332, 0x3f003333, 0x3f03cccc, 0x3f076666, 0x3f0b0000, 0x3f0e999a,
    0x3f123334, 0x3f15cccd, 0x3f196666, 0x3f1d0000, 0x3f20999a, 0x3f243334, 0x3f27cccd, 0x3f2b6666,
    0x3f2f0000, 0x3f32999a, 0x3f363334, 0x3f39cccd, 0x3f3d6666, 0x3f410000, 0x3f44999a, 0x3f483333,
    0x3f4bcccd, 0x3f4f6666, 0x3f530000, 0x3f56999a, 0x3f5a3333, 0x3f5dcccd, 0x3f616666, 0x3f650000,
    0x3f68999a, 0x3f6c3333, 0x3f6fcccd, 0x3f736666, 0x3f770000, 0x3f7a999a, 0x3f7e3333, 0x3f800000,
], dtype=np.uint32).view(np.float32)
DQ_MID = (DQ_CODE[:-1] + DQ_CODE[1:]) / np.float32(2)


def nf4dq_absmax(absmax_q: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Each block's float32 absmax (bitsandbytes' dequantize_blockwise of the nested state, plus the offset)."""
    q = np.asarray(absmax_q, dtype=np.uint8)
    s = np.repeat(np.asarray(scale, dtype=np.float32), NF4DQ_GROUP)[: q.size]
    return (DQ_CODE[q] * s) + np.asarray(offset, dtype=np.float32).reshape(-1)[0]


def nf4dq_decode(codes: np.ndarray, absmax_q: np.ndarray, scale: np.ndarray, offset: np.ndarray, shape) -> np.ndarray:
    n = int(np.prod(shape)) if len(shape) else 1
    a = np.repeat(nf4dq_absmax(absmax_q, scale, offset), NF4DQ_BLOCK)[:n]
    return (CODEBOOK[nf4_unpack(codes, n)] * a).reshape(shape)


def _nf4_codes_at(xb: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Nearest NF4 codes of float32(x * float32(1 / a)) per block row; code 7 where 1 / a is not finite."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.float32(1) / a
        ok = (a != 0) & np.isfinite(inv)
        s = xb * np.where(ok, inv, np.float32(0))[:, None]
    return _codes_of(s.astype(np.float32))


def nf4dq_encode(x: np.ndarray, col_weights: np.ndarray | None = None, weighting: str = "plain",
                 k: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """nf4dq of the row-major flatten of x (the definition above): (codes, absmax_q, absmax_scale, absmax_offset)."""
    B = NF4DQ_BLOCK
    _, d = nf4opt_encode(x, col_weights, weighting, k, block=B, tries=NF4DQ_TRIES)
    n, nb, xb, cw = _blocks(x, col_weights, k, B)
    w = _nf4opt_weights(xb, cw.reshape(nb, B), weighting, B)

    offset, scale, q0 = nf4dq_scales(d)
    sb = np.repeat(scale, NF4DQ_GROUP)[:nb]

    wf = w.astype(np.float32)
    best_q = q0.copy()
    best_e = np.full(nb, np.inf, dtype=np.float32)
    best_c = np.zeros((nb, B), dtype=np.uint8)
    for j in NF4DQ_CANDIDATES:
        q = q0 + j
        valid = (q >= 0) & (q <= 255)
        qc = np.clip(q, 0, 255)
        a = ((DQ_CODE[qc] * sb) + offset).astype(np.float32)
        c = _nf4_codes_at(xb, a)
        with np.errstate(over="ignore", invalid="ignore"):
            e = xb - CODEBOOK[c] * a[:, None]
            err = _lanesum(wf * e * e, np.float32)
        take = valid & (err < best_e)
        best_q = np.where(take, qc, best_q)
        best_e = np.where(take, err, best_e)
        best_c = np.where(take[:, None], c, best_c)
    flat = best_c.ravel()[:n]
    if n & 1:
        flat = np.concatenate([flat, [np.uint8(7)]])
    codes = (flat[0::2] << 4) | flat[1::2]
    return (codes.astype(np.uint8), best_q.astype(np.uint8), scale, np.array([offset], dtype=np.float32))


# ---------------------------------------------------------------------------------------------------------
# int5dq, int6dq, int8dq (1.7): b-bit integer codes in blocks of 32, each block's scale double-quantized as
# nf4dq's absmax (the same DQ_CODE, group scale per 256 blocks, one offset). b = 5, 6 or 8 (INTDQ_BITS).
#
# A slice of n elements (row-major flatten) has nb = ceil(n / 32) blocks and ng = ceil(nb / 256) groups. Parts:
#   codes          uint8[ceil(n * b / 8)]  code e is the b-bit two's complement field at bits [b e, b e + b) of
#                                          the little-endian bit stream (bit t is bit t % 8 of byte t // 8);
#                                          the bits after the last field are 0. int8dq: one int8 a byte.
#   absmax_q       uint8[nb]               each block's scale as an index into DQ_CODE (the part names are
#   absmax_scale   float32[ng]             nf4dq's: the same double quantization, of the step here)
#   absmax_offset  float32[1]
# Decode, all float32:
#   a[b]     = (DQ_CODE[absmax_q[b]] * absmax_scale[b // 256]) + absmax_offset       (nf4dq_absmax)
#   value[e] = float(q[e]) * a[e // 32],   q in LO .. HI = -2^(b-1) .. 2^(b-1) - 1
# Bits a weight: b + 8/32 + 32/8192 (5.254, 6.254, 8.254).
#
# Levels: the asymmetric -2^(b-1) .. 2^(b-1) - 1 (K-quants' q - 2^(b-1)). Measured (relative MSE, 64 x 1024,
# this encoder; docs/FORMAT.md 3, intdq): against the symmetric -(2^(b-1)-1) .. 2^(b-1)-1 the asymmetric grid
# is lower at every b on Gaussian and Student-t(3) weights (Gaussian 5/6/8 bits: 1.657e-3 / 4.162e-4 / 2.580e-5
# against 1.832e-3 / 4.324e-4 / 2.630e-5). At 5 bits the scan tries both signs of the scale (the extra level
# on either side: 1.657e-3 against 1.723e-3 positive only); at 6 and 8 bits only positive scales, because
# scales of both signs in a group double the range the 8-bit scale code spans (Gaussian 8 bits: 2.837e-5 with
# both signs, 2.580e-5 positive only).
# The encoder (the bytes; kernels/intdq.c gives the same), per block x[32] with weights w (nf4dq's: column
# weight times the weighting, as float32 wf; the tail block's padding weighs 0):
#   1. m = max |x|. For each (s, L) of INTDQ_SCAN[b] in order, j = -INTDQ_TRIES .. INTDQ_TRIES: the inverse
#      scale iscale = float32(s * (L + j * INTDQ_STEP)) / m (float32), skipped when not finite (m = 0 or tiny m); codes q = rint(clip(x * iscale, LO, HI)) (float32
#      multiply, round half to even); float32 sums in element order sxq = sum (wf x) q, sqq = sum (wf q) q;
#      score = sxq^2 / sqq in float64 (only when sqq > 0); the first candidate with the largest score gives
#      d[b] = float32(sxq / sqq) (0 when no candidate has sqq > 0);
#   2. offset and group scales from d exactly as nf4dq's step 2 (nf4dq_scales);
#   3. per block, candidates q0, q0-1, q0+1 of the 8-bit code (those in 0 .. 255): a = the decoded scale,
#      codes = rint(clip(x * float32(1 / a), LO, HI)) (all 0 when a is 0 or 1 / a is not finite), error =
#      sum (wf e) e, e = x - q * a, float32 in element order; the first candidate with the least error is kept.
# ---------------------------------------------------------------------------------------------------------
INTDQ_BITS = (5, 6, 8)
INTDQ_TRIES = 4
INTDQ_STEP = np.float32(0.25)
# (s, L) of the scan per b: L = HI (the largest |x| on the top level) or -LO (on the bottom one, -2^(b-1))
INTDQ_SCAN = {5: ((1, "hi"), (-1, "lo")), 6: ((1, "hi"), (1, "lo")), 8: ((1, "hi"), (1, "lo"))}


def intdq_levels(bits: int, symmetric: bool = False) -> tuple[int, int]:
    """(LO, HI) of a b-bit intdq code (symmetric=True: the alternative that was measured, not a format)."""
    if bits not in INTDQ_BITS and not symmetric:
        raise ValueError(f"intdq bits must be one of {INTDQ_BITS}, not {bits}")
    h = 1 << (bits - 1)
    return (-(h - 1) if symmetric else -h), h - 1


def intdq_codes_size(n: int, bits: int) -> int:
    """Bytes of an intdq slice's codes part: ceil(n * b / 8)."""
    return -(-n * bits // 8)


def intdq_pack(q: np.ndarray, bits: int) -> np.ndarray:
    """The codes part of the flat int codes q (LO .. HI): b-bit two's complement fields, LSB first."""
    q = np.asarray(q, dtype=np.int64).ravel()
    n = q.size
    u = (q & ((1 << bits) - 1)).astype(np.uint64)
    nbits = n * bits
    stream = np.zeros(-(-nbits // 8) * 8, dtype=np.uint8)
    for t in range(bits):
        stream[np.arange(n, dtype=np.int64) * bits + t] = ((u >> np.uint64(t)) & np.uint64(1)).astype(np.uint8)
    return np.packbits(stream.reshape(-1, 8), axis=1, bitorder="little").ravel()


def intdq_unpack(codes: np.ndarray, n: int, bits: int) -> np.ndarray:
    """The n int codes (int32, sign-extended) of an intdq codes part."""
    bitsarr = np.unpackbits(np.asarray(codes, dtype=np.uint8).ravel(), bitorder="little")
    u = np.zeros(n, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64) * bits
    for t in range(bits):
        u |= bitsarr[idx + t].astype(np.int64) << t
    h = 1 << (bits - 1)
    return np.where(u >= h, u - (1 << bits), u).astype(np.int32)


def intdq_decode(codes, absmax_q, scale, offset, shape, bits: int) -> np.ndarray:
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape)) if len(shape) else 1
    a = np.repeat(nf4dq_absmax(absmax_q, scale, offset), NF4DQ_BLOCK)[:n]
    return (intdq_unpack(codes, n, bits).astype(np.float32) * a).reshape(shape)


def nf4dq_scales(d: np.ndarray) -> tuple[np.float32, np.ndarray, np.ndarray]:
    """nf4dq's step 2 (and intdq's): (offset, group scales float32[ng], each block's nearest code q0 int64[nb])."""
    nb = d.size
    ng = -(-nb // NF4DQ_GROUP)
    offset = np.float32(np.cumsum(d.astype(np.float64))[-1] / nb)
    r = (d - offset).astype(np.float32)
    rg = np.zeros(ng * NF4DQ_GROUP, dtype=np.float32)
    rg[:nb] = r
    scale = np.abs(rg.reshape(ng, NF4DQ_GROUP)).max(axis=1).astype(np.float32)
    sb = np.repeat(scale, NF4DQ_GROUP)[:nb]
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(sb > 0, r / np.where(sb > 0, sb, np.float32(1)), np.float32(0)).astype(np.float32)
    return offset, scale, np.searchsorted(DQ_MID, v, side="left").astype(np.int64)


def _int_codes(xb: np.ndarray, iscale: np.ndarray, lo: int, hi: int) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        v = (xb * iscale[:, None]).astype(np.float32)
    return np.rint(np.clip(v, np.float32(lo), np.float32(hi))).astype(np.float32)


def intdq_block_scales(xb: np.ndarray, wf: np.ndarray, lo: int, hi: int, scan, tries: int = INTDQ_TRIES,
                       step=INTDQ_STEP) -> np.ndarray:
    """Step 1 of the intdq encoder: each block's least-squares scale d (float32[nb]) of the best-scoring codes."""
    nb = xb.shape[0]
    m = np.abs(xb).max(axis=1)
    wx = wf * xb
    best = np.full(nb, -1.0)
    d = np.zeros(nb, dtype=np.float32)
    for s, which in scan:
        L = hi if which == "hi" else -lo
        for j in range(-tries, tries + 1):
            num = np.float32(s * (np.float32(L) + np.float32(j) * np.float32(step)))
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                iscale = (num / m).astype(np.float32)
            ok = np.isfinite(iscale)
            q = _int_codes(xb, np.where(ok, iscale, np.float32(0)), lo, hi)
            sxq, sqq = np.zeros(nb, np.float32), np.zeros(nb, np.float32)
            with np.errstate(over="ignore", invalid="ignore"):
                for i in range(xb.shape[1]):
                    sxq += wx[:, i] * q[:, i]
                    sqq += (wf[:, i] * q[:, i]) * q[:, i]
            s64, q64 = sxq.astype(np.float64), sqq.astype(np.float64)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                good = ok & (sqq > 0)
                score = np.where(good, s64 * s64 / np.where(good, q64, 1.0), -1.0)
                take = good & (score > best)
                best = np.where(take, score, best)
                d = np.where(take, (sxq / np.where(good, sqq, np.float32(1))).astype(np.float32), d)
    return d.astype(np.float32)


def intdq_encode(x: np.ndarray, bits: int, col_weights: np.ndarray | None = None, weighting: str = "plain",
                 k: int | None = None, *, symmetric: bool = False,
                 tries: int = INTDQ_TRIES) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """intdq of the row-major flatten of x (the definition above): (codes, absmax_q, absmax_scale, absmax_offset).
    ``symmetric`` and ``tries`` are for measurements only (the format's bytes are the defaults)."""
    lo, hi = intdq_levels(bits, symmetric)
    B = NF4DQ_BLOCK
    n, nb, xb, cw = _blocks(x, col_weights, k, B)
    if n == 0:
        return (np.zeros(0, np.uint8), np.zeros(0, np.uint8), np.zeros(0, np.float32), np.zeros(1, np.float32))
    w = _nf4opt_weights(xb, cw.reshape(nb, B), weighting, B)
    wf = w.astype(np.float32)
    d = intdq_block_scales(xb, wf, lo, hi, ((1, "hi"),) if symmetric else INTDQ_SCAN[bits], tries)
    offset, scale, q0 = nf4dq_scales(d)
    sb = np.repeat(scale, NF4DQ_GROUP)[:nb]
    best_q = q0.copy()
    best_e = np.full(nb, np.inf, dtype=np.float32)
    best_c = np.zeros((nb, B), dtype=np.float32)
    for j in NF4DQ_CANDIDATES:
        q = q0 + j
        valid = (q >= 0) & (q <= 255)
        qc = np.clip(q, 0, 255)
        a = ((DQ_CODE[qc] * sb) + offset).astype(np.float32)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = (np.float32(1) / a).astype(np.float32)
        okv = (a != 0) & np.isfinite(inv)
        c = _int_codes(xb, np.where(okv, inv, np.float32(0)), lo, hi)
        with np.errstate(over="ignore", invalid="ignore"):
            e = xb - c * a[:, None]
            err = _lanesum((wf * e) * e, np.float32)
        take = valid & (err < best_e)
        best_q = np.where(take, qc, best_q)
        best_e = np.where(take, err, best_e)
        best_c = np.where(take[:, None], c, best_c)
    codes = intdq_pack(best_c.ravel()[:n].astype(np.int64), bits)
    return codes, best_q.astype(np.uint8), scale, np.array([offset], dtype=np.float32)
