"""The fast NF4 encode paths (kernels/codecs.c: AVX-512 bin tables, AVX2 binary search) on their edges.

Every SIMD level must give the bytes of the numpy reference (codes, absmax) and the exact
SQNR sums of the lane order that codecs.h defines (16 lanes by element position in the
chunk, each lane summed in element order, folded lane 0..15). The sums are checked with
``==`` against a numpy emulation of that order, not approximately: they go in the pack header.

Edges: values exactly on the midpoints, 1 and 2 ulps either side, the bin edges of the
AVX-512 tables, -0.0, subnormals, absmax under bitsandbytes' 1e-38 clamp, all-equal blocks,
tail blocks, odd counts, and non-finite values between fast blocks (the hand-over of the
vector accumulators to the generic block code and back).
"""
from __future__ import annotations

import numpy as np
import pytest

from orkpack import codecs
from orkpack.codecs import ffi, lib
from orkpack.codecs import reference as R
from orkpack import layout

LEVELS = [lvl for lvl in ("portable", "avx2", "avx512") if codecs.set_isa(lvl) == lvl]
codecs.set_isa(None)
DT = {"f32": 0, "f16": 1, "bf16": 2}


@pytest.fixture(params=LEVELS)
def isa(request):
    assert codecs.set_isa(request.param) == request.param
    yield request.param
    codecs.set_isa(None)


def to_dtype(x32: np.ndarray, dt: str) -> np.ndarray:
    if dt == "f32":
        return x32
    if dt == "f16":
        return x32.astype(np.float16)
    return (x32.view(np.uint32) >> 16).astype(np.uint16)  # bf16 by truncation: any bits will do


def c_encode(x: np.ndarray, chunk_blocks: int):
    """(codes, absmax, sum_x2, sum_err2, nonfinite) from ork_nf4_encode over fixed chunks, folded in order."""
    flat = np.ascontiguousarray(x).reshape(-1)
    dt = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint16): 2}[flat.dtype]
    n = flat.size
    nb = -(-n // 64)
    codes = np.full((n + 1) // 2, 0xAB, np.uint8)
    absmax = np.full(nb, np.nan, np.float32)
    cp = ffi.cast("uint8_t *", ffi.from_buffer(codes))
    ap = ffi.cast("float *", ffi.from_buffer(absmax))
    sx = se = 0.0
    nf = 0
    for b in range(0, nb, chunk_blocks):
        st = ffi.new("ork_codec_stats *")
        lib.ork_nf4_encode(ffi.from_buffer(flat), dt, n, b, min(nb, b + chunk_blocks), cp, ap, st)
        sx += st.sum_x2
        se += st.sum_err2
        nf += st.nonfinite
    return codes, absmax, sx, se, nf


def lane_sums(v: np.ndarray) -> float:
    """sum of v^2 (float64) in the kernels' order: 16 lanes, each in element order, folded 0..15."""
    v = np.concatenate([v.astype(np.float64), np.zeros(-v.size % 64)])
    acc = np.cumsum((v * v).reshape(-1, 16), axis=0)[-1] if v.size else np.zeros(16)
    s = 0.0
    for a in acc:
        s += float(a)
    return s


def ref_sums(x: np.ndarray, chunk_blocks: int):
    """The reference sums of c_encode: per chunk lane_sums of x and of x - dequant, chunks added in order."""
    x32, _ = R.sanitize(R.widen(x).ravel())
    codes, absmax = R.nf4_encode(x32)
    deq = R.nf4_decode(codes, absmax, (x32.size,))
    err = (x32 - deq).astype(np.float32)
    sx = se = 0.0
    step = 64 * chunk_blocks
    for i in range(0, x32.size, step):
        sx += lane_sums(x32[i:i + step])
        se += lane_sums(err[i:i + step])
    return sx, se


def check(x: np.ndarray, chunk_blocks: int = 1 << 14, nonfinite: int = 0):
    codes, absmax, sx, se, nf = c_encode(x, chunk_blocks)
    clean, _ = R.sanitize(R.widen(x).ravel())
    want_codes, want_absmax = R.nf4_encode(clean)
    bad = np.flatnonzero(codes != want_codes)
    assert bad.size == 0, f"code byte {bad[0]}: got {codes[bad[0]]:#04x}, want {want_codes[bad[0]]:#04x}"
    assert absmax.tobytes() == want_absmax.tobytes()
    assert nf == nonfinite
    rx, re_ = ref_sums(x, chunk_blocks)
    assert (sx, se) == (rx, re_), "SQNR sums differ from the lane-order reference"


def with_unit_absmax(vals: np.ndarray) -> np.ndarray:
    """Blocks of 63 values after a 1.0 (absmax 1: s == x exactly), plus a tail block."""
    vals = np.asarray(vals, np.float32)
    pad = -vals.size % 63
    body = np.concatenate([vals, np.zeros(pad, np.float32)]).reshape(-1, 63)
    blocks = np.concatenate([np.ones((body.shape[0], 1), np.float32), body], axis=1).ravel()
    return np.concatenate([blocks, np.float32([1.0, -0.5, 0.25]), vals[:20]])


def ulps_around(centres: np.ndarray, k: int) -> np.ndarray:
    """every float32 within k ulps of each centre (centres included)"""
    c = np.asarray(centres, np.float32)
    out = [c]
    up, down = c.copy(), c.copy()
    for _ in range(k):
        up = np.nextafter(up, np.float32(np.inf))
        down = np.nextafter(down, np.float32(-np.inf))
        out += [up, down]
    return np.concatenate(out)


# ---------------------------------------------------------------- values on and around the midpoints

def test_midpoints_and_neighbours(isa):
    x = with_unit_absmax(ulps_around(R.MIDPOINTS, 2))
    check(x)
    # every one of them with absmax 1 is s == x: each code is the count of midpoints strictly below
    codes, _, _, _, _ = c_encode(x, 1 << 14)
    c = R.nf4_unpack(codes, x.size)
    want = np.searchsorted(R.MIDPOINTS, x, side="left")
    assert np.array_equal(c, want)


def test_bin_edges(isa):
    # the AVX-512 bins are cut where s * 15.5 + 16 crosses an integer: every edge, +-40 ulps
    edges = (np.arange(-16, 17, dtype=np.float32)) / np.float32(15.5)
    x = ulps_around(edges[np.abs(edges) <= 1], 40)
    check(with_unit_absmax(np.clip(x, -1, 1)))


def test_dense_near_midpoints_f32(isa):
    # 600 ulps either side of each midpoint, absmax 1
    check(with_unit_absmax(ulps_around(R.MIDPOINTS, 600)))


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_every_16bit_value(isa, dt):
    # every finite f16 / bf16 bit pattern, in blocks whose absmax is the largest magnitude of each
    # block (not 1): s = x * (1 / absmax) for all of them, including subnormals and -0
    bits = np.arange(1 << 16, dtype=np.uint16)
    x = bits.view(np.float16) if dt == "f16" else bits
    w = R.widen(x)
    x = x[np.isfinite(w)]
    check(x)
    # and with absmax 1 in every block (s == x): values in [-1, 1] only
    w = R.widen(x)
    small = x[np.abs(w) <= 1]
    one = np.float16(1.0) if dt == "f16" else np.uint16(0x3F80)
    pad = -small.size % 63
    fill = np.zeros(pad, small.dtype)
    body = np.concatenate([small, fill]).reshape(-1, 63)
    blocks = np.concatenate([np.full((body.shape[0], 1), one, small.dtype), body], axis=1).ravel()
    check(blocks)


# ---------------------------------------------------------------- degenerate blocks

@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_zeros_subnormals_constant_blocks(isa, dt):
    tiny = np.float32(2.0) ** -140  # f32 subnormal (0 in f16; a bf16 subnormal)
    parts = [
        np.zeros(64, np.float32),
        np.where(np.arange(64) % 3 == 0, -0.0, 0.0).astype(np.float32),
        np.full(64, -0.0, np.float32),
        np.full(64, 3.25, np.float32),
        np.full(64, -7.0, np.float32),
        (np.arange(64, dtype=np.float32) - 31) * tiny,
        np.float32(1e-42) * (np.arange(64, dtype=np.float32) % 5 - 2),  # absmax below the 1e-38 clamp
        np.concatenate([[1e-39], np.zeros(63)]).astype(np.float32),
        np.float32(6e4) * (R.CODEBOOK.repeat(4)),
        np.float32(0.5) * np.concatenate([R.MIDPOINTS, -R.MIDPOINTS, R.CODEBOOK, R.CODEBOOK[:-1] * -1,
                                          np.float32([1.0, -1.0])]),
    ]
    x = to_dtype(np.concatenate(parts).astype(np.float32), dt)
    for m in (x, x[:-1], x[:64 * 3 + 1], x[: 64 * 5 - 7], x[:1], x[-9:], x[:0]):
        check(m)


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("n", [63, 64, 65, 127, 128, 129, 64 * 9 + 33])
def test_tails_and_chunks(isa, dt, n):
    rng = np.random.default_rng(n)
    x = to_dtype((rng.standard_t(2, size=n) * 0.05).astype(np.float32), dt)
    for chunk in (1, 2, 7, 1 << 14):
        check(x, chunk)


# ---------------------------------------------------------------- non-finite values between fast blocks

@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_nonfinite_blocks_between_fast_ones(isa, dt):
    rng = np.random.default_rng(3)
    x32 = (rng.standard_t(2, size=64 * 23 + 5) * 0.1).astype(np.float32)
    x32[64 * 2 + 5] = np.nan
    x32[64 * 2 + 6] = np.inf        # two in one block
    x32[64 * 9 + 63] = -np.inf      # the last element of a block
    x32[64 * 10] = np.nan           # the first element of the next
    x32[64 * 23 + 2] = np.inf       # in the tail block
    x = to_dtype(x32, dt)
    for chunk in (1, 3, 1 << 14):
        check(x, chunk, nonfinite=5)


def test_levels_agree_on_sums():
    # the same bytes AND the same float64 sums at every level, for every dtype, on a large input
    rng = np.random.default_rng(11)
    x32 = (rng.standard_t(2, size=64 * 997 + 13) * 0.02).astype(np.float32)
    x32[rng.integers(0, x32.size, 20)] = np.float32(1e4)
    try:
        for dt in ("f32", "f16", "bf16"):
            x = to_dtype(x32, dt)
            got = []
            for lvl in LEVELS:
                codecs.set_isa(lvl)
                codes, absmax, sx, se, nf = c_encode(x, 100)
                got.append((codes.tobytes(), absmax.tobytes(), sx, se, nf))
            assert all(g == got[0] for g in got[1:]), f"{dt}: SIMD levels disagree"
            assert got[0][2:4] == ref_sums(x, 100)
    finally:
        codecs.set_isa(None)


# ---------------------------------------------------------------- int8 encode (kernels/codecs.c int8_encode_fast*)

def c_int8(x: np.ndarray, kseg: int, r0: int, r1: int):
    """(q, scale, sum_x2, sum_err2, nonfinite) of one ork_int8_encode call over rows [r0, r1) (kseg 0: row-major)."""
    x = np.ascontiguousarray(x)
    n, k = x.shape
    dt = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint16): 2}[x.dtype]
    size = layout.npu_tiled_size(n, k, kseg) if kseg else n * k
    q = np.full(size, 0x55, np.int8)
    scale = np.full(n, np.nan, np.float32)
    st = ffi.new("ork_codec_stats *")
    lib.ork_int8_encode(ffi.from_buffer(x), dt, n, k, r0, r1, kseg, ffi.cast("int8_t *", ffi.from_buffer(q)),
                        ffi.cast("float *", ffi.from_buffer(scale)), st)
    return q, scale, st.sum_x2, st.sum_err2, st.nonfinite


def int8_lane_sums(x32: np.ndarray, kseg: int) -> tuple[float, float]:
    """The generic kernel's sums: lane l = column l of each 32-column run (runs restart at every k segment, the
    last one zero-padded), each lane in row then run order, folded lanes 0..31; x the sanitized float32 rows."""
    q, scale = R.int8_encode(x32)
    err = (x32 - q.astype(np.float32) * scale[:, None]).astype(np.float32)
    n, k = x32.shape
    seg = kseg or k
    sums = []
    for v in (x32, err):
        runs = []
        for k0 in range(0, k, seg):
            s = v[:, k0:k0 + seg]
            s = np.concatenate([s, np.zeros((n, -s.shape[1] % 32), np.float32)], axis=1)
            runs.append(s.reshape(n, -1, 32))
        r = np.concatenate(runs, axis=1).reshape(-1, 32).astype(np.float64)
        acc = np.zeros(32)
        for row in r:  # element order within each lane
            acc += row * row
        total = 0.0
        for a in acc:
            total += float(a)
        sums.append(total)
    return sums[0], sums[1]


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_int8_levels_agree_on_bytes_and_sums(dt):
    # every level: the reference's codes and scales, and the generic kernel's float64 sums to the bit, on rows
    # whose width is no multiple of 32, 16 or 8, two k segments, NPU padding rows, and non-finite, -0, subnormal
    # and constant rows
    rng = np.random.default_rng(5)
    kseg = 64
    x32 = (rng.standard_t(2, size=(37, 2 * kseg + 45)) * 0.03).astype(np.float32)
    x32[3] = 0.0
    x32[4] = -0.0
    x32[5] = 1e-40
    x32[6] = 2.5
    x32[7, 5], x32[9, -1], x32[11, 40] = np.nan, np.inf, -np.inf
    x = to_dtype(x32, dt)
    clean, _ = R.sanitize(R.widen(x))
    q_ref, s_ref = R.int8_encode(clean.astype(np.float32))
    try:
        for ks in (0, kseg):
            rows_total = 37 if ks == 0 else -(-37 // 32) * 32
            got = []
            for lvl in LEVELS:
                codecs.set_isa(lvl)
                q, scale, sx, se, nf = c_int8(x, ks, 0, rows_total)
                assert q.tobytes() == (layout.tile_int8(q_ref, ks) if ks else q_ref).tobytes(), f"{lvl} kseg {ks}: codes"
                assert scale.tobytes() == s_ref.tobytes() and nf == 3
                got.append((sx, se))
            assert all(g == got[0] for g in got), f"kseg {ks}: SIMD levels' sums differ: {got}"
            assert got[0] == int8_lane_sums(clean.astype(np.float32), ks)
    finally:
        codecs.set_isa(None)
