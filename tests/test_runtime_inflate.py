"""The load-path kernels (kernels/runtime.c): direct inflate, two-step inflate and the numpy
reference agree bit for bit; the fill copies exactly; the portable C fallback matches SIMD."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from orkpack._kernels import lib
from orkpack.codecs.reference import int8_encode, nf4_decode, nf4_encode
from orkpack.layout import npu_layout, npu_tiled_size, tile_int8
from orkpack.runtime.inflate import fill, inflate, inflate_into, inflate_reference, nf4_decode_c, nf4dq_decode_c, tiled_size

ROOT = Path(__file__).resolve().parents[1]

SHAPES = [
    (1, 1, 8192), (2, 1, 8192), (1, 63, 32), (7, 65, 32), (33, 100, 8192), (64, 128, 8192),
    (31, 96, 64), (96, 192, 96), (40, 8256, 8192), (5, 8200, 8192), (3, 16416, 8192),
    (65, 130, 8192), (32, 8192, 8192), (17, 999, 256),
]


@pytest.fixture(params=[False, True], ids=["simd", "portable"])
def portable(request):
    lib.ork_rt_force_portable(1 if request.param else 0)
    yield request.param
    lib.ork_rt_force_portable(0)


def _weights(rng, n, k, kind):
    if kind == "t":
        w = rng.standard_t(1.5, size=(n, k)).astype(np.float32)  # heavy tails
    elif kind == "normal":
        w = rng.standard_normal((n, k)).astype(np.float32)
    else:  # tiny and huge magnitudes, exact ties
        w = (rng.integers(-8, 9, size=(n, k)) * np.float32(2.0) ** rng.integers(-140, 120, size=(n, 1))).astype(np.float32)
    w[rng.integers(0, n)] = 0  # an all-zero row
    return w


def _same(a, b):
    return np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


@pytest.mark.parametrize("n,k,ks", SHAPES)
@pytest.mark.parametrize("kind", ["t", "normal", "scaled"])
def test_direct_two_step_and_numpy_agree(n, k, ks, kind, portable):
    rng = np.random.default_rng(hash((n, k, ks, kind)) & 0xFFFF)
    w = _weights(rng, n, k, kind)
    codes, absmax = nf4_encode(w)
    rq, rs, lay = inflate_reference(codes, absmax, (n, k), ks)
    assert lay == npu_layout(n, k, ks)
    assert rq.size == npu_tiled_size(n, k, ks) == tiled_size(n, k, ks)
    for method in ("direct", "two-step"):
        q, s = inflate(codes, absmax, (n, k), method=method, k_segment=ks)
        assert _same(q, rq), (method, n, k)
        assert _same(s, rs), (method, n, k)


def test_reference_is_the_format_definition():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((45, 200)).astype(np.float32)
    codes, absmax = nf4_encode(w)
    q, s = int8_encode(nf4_decode(codes, absmax, (45, 200)))
    rq, rs, _ = inflate_reference(codes, absmax, (45, 200))
    assert _same(rq, tile_int8(q)) and _same(rs, s)


def test_arbitrary_codes_and_absmax(portable):
    """Codes no encoder would write, negative / subnormal / non-finite absmax: still bit-identical."""
    rng = np.random.default_rng(11)
    for n, k in [(9, 64), (40, 100), (33, 8200), (20, 16384)]:
        nel = n * k
        codes = rng.integers(0, 256, size=(nel + 1) // 2, dtype=np.uint8)
        absmax = (rng.standard_normal(-(-nel // 64)) * 10.0 ** rng.integers(-40, 30, -(-nel // 64))).astype(np.float32)
        absmax[::7] = np.float32(1e-38)
        absmax[1::11] = np.inf
        absmax[2::13] = np.nan
        absmax[3::17] = -0.0
        absmax[4::19] = np.float32(3.4e38)
        # a row with only codes of small |CB| (never 0 or 15): amax from the min/max code scan
        codes[: k // 2] = 0x78
        rq, rs, _ = inflate_reference(codes, absmax, (n, k))
        for method in ("direct", "two-step"):
            q, s = inflate(codes, absmax, (n, k), method=method)
            assert _same(q, rq) and _same(s, rs), (method, n, k)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_do_not_change_bytes(threads, monkeypatch):
    import orkpack.runtime.inflate as inf

    monkeypatch.setattr(inf, "INFLATE_CHUNK", 4096)  # many chunks
    rng = np.random.default_rng(2)
    n, k = 200, 300
    codes, absmax = nf4_encode(rng.standard_t(2, size=(n, k)).astype(np.float32))
    rq, rs, _ = inflate_reference(codes, absmax, (n, k))
    with ThreadPoolExecutor(threads) as pool:
        for method in ("direct", "two-step"):
            q, s = inflate(codes, absmax, (n, k), method=method, pool=pool)
            assert _same(q, rq) and _same(s, rs)


def test_inflate_writes_every_byte():
    """Garbage in the destination is fully overwritten (padding included)."""
    rng = np.random.default_rng(3)
    n, k = 37, 8230
    codes, absmax = nf4_encode(rng.standard_normal((n, k)).astype(np.float32))
    rq, rs, _ = inflate_reference(codes, absmax, (n, k))
    for method in ("direct", "two-step"):
        q = np.full(rq.size, 0x5A, dtype=np.uint8)
        s = np.full(n, np.nan, dtype=np.float32)
        inflate_into(codes, absmax.view(np.uint8), n, k, q, s, method=method)
        assert _same(q, rq) and _same(s, rs)


def test_inflate_rejects_short_parts():
    codes, absmax = nf4_encode(np.ones((32, 64), np.float32))
    q = np.empty(tiled_size(32, 64), np.int8)
    s = np.empty(32, np.float32)
    with pytest.raises(ValueError):
        inflate_into(codes[:-1], absmax.view(np.uint8), 32, 64, q, s)
    with pytest.raises(ValueError):
        inflate_into(codes, absmax.view(np.uint8)[:-4], 32, 64, q, s)
    with pytest.raises(ValueError):
        inflate_into(codes, absmax.view(np.uint8), 32, 64, q[:-1], s)
    with pytest.raises(ValueError):
        tiled_size(0, 64)


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4096, (4 << 20) + 17, (9 << 20) + 4096])
def test_fill_copies_exactly(nbytes):
    rng = np.random.default_rng(nbytes)
    src = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    with ThreadPoolExecutor(2) as pool:
        for p in (None, pool):
            for clean in (True, False):
                dst = np.zeros(nbytes + 64, dtype=np.uint8)
                assert fill(dst, src, clean=clean, pool=p) == nbytes
                assert np.array_equal(dst[:nbytes], src) and not dst[nbytes:].any()


def test_nf4_decode_c_matches_numpy():
    rng = np.random.default_rng(4)
    for nel in (1, 63, 64, 65, 1001):
        codes = rng.integers(0, 256, size=(nel + 1) // 2, dtype=np.uint8)
        absmax = rng.standard_normal(-(-nel // 64)).astype(np.float32)
        want = nf4_decode(codes, absmax, (nel,))
        assert _same(nf4_decode_c(codes, absmax.view(np.uint8), nel), want)


def test_nf4dq_decode_c_matches_numpy():
    """kernels/runtime.c ork_rt_nf4dq_decode is reference.nf4dq_decode bit for bit: encoded slices (block and
    group tails), arbitrary bytes (every 8-bit code, negative, zero and huge scales and offsets), sub-ranges."""
    from orkpack.codecs import get_codec
    from orkpack.codecs.reference import nf4dq_decode

    rng = np.random.default_rng(5)
    for nel in (1, 31, 32, 33, 8191, 8192, 8193, 20001):
        x = rng.standard_t(3, size=nel).astype(np.float32)
        p = get_codec("nf4dq").encode(x).parts
        args = (p["codes"], p["absmax_q"], p["absmax_scale"], p["absmax_offset"])
        assert _same(nf4dq_decode_c(*args, nel), nf4dq_decode(*args, (nel,)))
    for nel in (1, 65, 8192 * 3 + 7):
        nb = -(-nel // 32)
        codes = rng.integers(0, 256, size=(nel + 1) // 2, dtype=np.uint8)
        q = rng.integers(0, 256, size=nb, dtype=np.uint8)
        q[: min(nb, 256)] = np.arange(min(nb, 256))  # every code of DQ_CODE
        scale = (rng.standard_normal(-(-nb // 256)) * np.float32(2.0) ** rng.integers(-60, 60, -(-nb // 256))).astype(np.float32)
        scale[0] = 0
        for off in (np.float32(0), np.float32(-0.37), np.float32(3e38)):
            offset = np.array([off], np.float32)
            with np.errstate(over="ignore", invalid="ignore"):
                want = nf4dq_decode(codes, q, scale, offset, (nel,))
            got = nf4dq_decode_c(codes, q, scale, offset, nel)
            assert _same(got, want), (nel, off)
    # a sub-range [e0, e1) starts mid-block, as the decode of a chunk does
    out = np.empty(100, np.float32)
    codes, q, scale, offset = (np.arange(2000, dtype=np.uint8), np.arange(125, dtype=np.uint8),
                               np.array([0.5], np.float32), np.array([0.25], np.float32))
    from orkpack.runtime.inflate import _ptr

    assert lib.ork_rt_nf4dq_decode(_ptr("const uint8_t *", codes), codes.size, _ptr("const uint8_t *", q), q.size,
                                   _ptr("const float *", scale), 1, 0.25, 1000, 1100, _ptr("float *", out)) == 0
    assert _same(out, nf4dq_decode(codes, q, scale, offset, (4000,))[1000:1100])
    # parts too short for the range are refused (no read past them)
    with pytest.raises(ValueError, match="too small"):
        nf4dq_decode_c(codes[:10], q, scale, offset, 21)
    with pytest.raises(ValueError, match="too small"):
        nf4dq_decode_c(codes, q[:1], scale, offset, 33)
    with pytest.raises(ValueError, match="too small"):
        nf4dq_decode_c(codes, q, scale[:0], offset, 1)


def test_simd_level_and_fallback_switch():
    level = lib.ork_rt_simd_level()
    assert level in (0, 1, 2)
    lib.ork_rt_force_portable(1)
    try:
        assert lib.ork_rt_simd_level() == 0
    finally:
        lib.ork_rt_force_portable(0)


HOSTILE_K_SEGMENTS = [2**63 - 32, 2**62, 2**40 + 32, 2**63 - 1, 0, -32, 16, 48]


def test_runtime_guards_a_hostile_k_segment_itself():
    """geom_init (kernels/runtime.c) refuses a k_segment no pack can hold, whatever its caller checked:
    tiled_size is 0 and both inflates return ORK_RT_EARGS (-1) without writing. Before the guard,
    2**63 - 32 overflowed k + k_segment - 1 (UBSan in C, a heap overflow under Python). The calls run in
    a child process, so a crash fails this test instead of killing the run."""
    code = textwrap.dedent(f"""
        import numpy as np
        from orkpack._kernels import ffi, lib
        from orkpack.codecs.reference import nf4_encode
        codes, absmax = nf4_encode(np.ones((32, 64), np.float32))
        for ks in {HOSTILE_K_SEGMENTS!r}:
            q = np.full(2048 + 64, 0x5A, np.uint8)
            s = np.full(32, 7.0, np.float32)
            out = [lib.ork_rt_tiled_size(32, 64, ks)]
            for fn in (lib.ork_rt_inflate_direct, lib.ork_rt_inflate_two_step):
                out.append(fn(ffi.from_buffer(codes), codes.nbytes, ffi.cast("float *", ffi.from_buffer(absmax)),
                              absmax.size, 32, 64, ks, 0, 1, ffi.cast("int8_t *", ffi.from_buffer(q)), 2048,
                              ffi.cast("float *", ffi.from_buffer(s))))
            untouched = bool((q == 0x5A).all() and (s == 7.0).all())
            print(ks, *out, untouched, flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines()]
    assert [int(x[0]) for x in rows] == HOSTILE_K_SEGMENTS
    for ks, size, direct, two_step, untouched in rows:
        assert (size, direct, two_step, untouched) == ("0", "-1", "-1", "True"), ks
    # through the Python binding: one clear line naming the rule
    codes, absmax = nf4_encode(np.ones((32, 64), np.float32))
    with pytest.raises(ValueError, match="multiple of 32 from 32 to 2\\*\\*40"):
        inflate(codes, absmax, (32, 64), k_segment=2**63 - 32)


def test_runtime_takes_any_sane_single_segment_width():
    """A k_segment of at least K is one segment: the widest the runtime takes (2**40) tiles as K does."""
    rng = np.random.default_rng(9)
    codes, absmax = nf4_encode(rng.standard_normal((40, 96)).astype(np.float32))
    want = inflate(codes, absmax, (40, 96), k_segment=128)
    for ks in (96, 2**20, 2**40):
        got = inflate(codes, absmax, (40, 96), k_segment=ks)
        assert _same(got[0], want[0]) and _same(got[1], want[1])
