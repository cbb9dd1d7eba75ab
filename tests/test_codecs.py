"""Every C codec kernel against its numpy reference, byte for byte, at every SIMD level."""
from __future__ import annotations

import math

import numpy as np
import pytest

from orkpack import codecs, layout
from orkpack.codecs import reference as R
from orkpack.codecs import ffi, lib

LEVELS = ["portable", "avx2", "avx512"]


def available_levels():
    out = []
    for lvl in LEVELS:
        if codecs.set_isa(lvl) == lvl:
            out.append(lvl)
    codecs.set_isa(None)
    return out


@pytest.fixture(params=available_levels())
def isa(request):
    assert codecs.set_isa(request.param) == request.param
    yield request.param
    codecs.set_isa(None)


def heavy(shape, seed=0, f16_safe=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_t(2, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size:
        idx = rng.choice(flat.size, size=max(1, flat.size // 500), replace=False)
        flat[idx] = rng.choice([-1e4, 1e4], size=idx.size).astype(np.float32)
    if f16_safe:
        np.clip(x, -6e4, 6e4, out=x)
    return x


def as_dtype(x32, dt):
    if dt == "f32":
        return x32
    if dt == "f16":
        return x32.astype(np.float16)
    return (x32.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits (truncation: any bits will do)


DTYPES = ["f32", "f16", "bf16"]
SHAPES = [(1, 1), (1, 31), (31, 33), (33, 65), (65, 1), (3, 8193), (2, 8192 * 2 + 5), (7, 64 * 5 + 1)]


def _bytes_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- widening

@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_widen_exhaustive(isa, dt):
    bits = np.arange(1 << 16, dtype=np.uint16)
    src = bits.view(np.float16) if dt == "f16" else bits
    out = np.empty(bits.size, dtype=np.float32)
    nf = lib.ork_widen(ffi.from_buffer(src), 1 if dt == "f16" else 2, bits.size,
                     ffi.cast("float *", ffi.from_buffer(out)))
    want = R.widen(src)
    ok = np.isfinite(want)
    assert _bytes_equal(out[ok], want[ok])
    assert np.array_equal(np.isnan(out), np.isnan(want)) and np.array_equal(np.isinf(out), np.isinf(want))
    assert nf == int((~ok).sum())


# ---------------------------------------------------------------- NF4

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_nf4_c_matches_reference(isa, dt, shape):
    x = as_dtype(heavy(shape, seed=sum(shape), f16_safe=True), dt)
    enc = codecs.get_codec("nf4").encode(x)
    codes, absmax = R.nf4_encode(x)
    assert _bytes_equal(enc.parts["codes"], codes)
    assert _bytes_equal(enc.parts["absmax"], absmax)
    assert list(enc.parts) == ["codes", "absmax"] and enc.layout == {"kind": "row_major"}
    assert enc.nonfinite == 0
    ref_deq = R.nf4_decode(codes, absmax, x.shape)
    assert enc.sqnr_db == pytest.approx(R.sqnr_db(x, ref_deq), rel=1e-9, abs=1e-9)
    dec = codecs.get_codec("nf4").decode(enc.parts, x.shape, enc.layout)
    assert _bytes_equal(dec, ref_deq)


def test_nf4_degenerate(isa):
    tiny = np.float32(1e-39)  # subnormal
    parts = [
        np.zeros(64, np.float32),                                 # all-zero block
        np.full(64, 3.25, np.float32),                            # constant block
        np.where(np.arange(64) % 2, -0.0, 0.0).astype(np.float32),  # +0 / -0
        (np.arange(64, dtype=np.float32) - 32) * tiny,            # denormals
        np.float32(1e-42) * np.ones(64, np.float32),              # absmax below bitsandbytes' 1e-38 clamp
        R.MIDPOINTS.repeat(4)[:64] * np.float32(1.0),             # exactly on midpoints (absmax 1)
        np.concatenate([[1], R.MIDPOINTS, -R.MIDPOINTS, R.CODEBOOK, np.zeros(17)]).astype(np.float32),
        np.zeros(7, np.float32),                                  # all-zero tail (odd count)
    ]
    x = np.concatenate(parts)
    for arr in (x, x[:-1], x[:64 * 3 + 1], x[:1], x[-7:]):
        enc = codecs.get_codec("nf4").encode(arr)
        codes, absmax = R.nf4_encode(arr)
        assert _bytes_equal(enc.parts["codes"], codes)
        assert _bytes_equal(enc.parts["absmax"], absmax)
    codes, absmax = R.nf4_encode(x)
    assert absmax[0] == 0 and np.all(codes[:32] == 0x77)          # zero block: absmax 0, code 7
    assert absmax[-1] == np.float32(1e-38)                          # zero tail: clamped absmax stored
    assert codes[-1] & 15 == 7                                      # odd count: padding nibble is code 7
    enc = codecs.get_codec("nf4").encode(np.zeros(0, np.float32))
    assert enc.parts["codes"].size == 0 and enc.parts["absmax"].size == 0 and enc.sqnr_db == R.SQNR_CAP


def test_nf4_midpoint_ties_go_low():
    # values exactly on a midpoint (after x * (1/absmax) with absmax 1) take the lower code
    x = np.concatenate([[np.float32(1.0)], R.MIDPOINTS]).astype(np.float32)
    x = np.concatenate([x, np.zeros(64 - x.size, np.float32)])
    c = R.nf4_unpack(R.nf4_encode(x)[0], 64)
    assert list(c[1:16]) == list(range(15))


@pytest.mark.parametrize("dt", DTYPES)
def test_nf4_threads_and_chunks(monkeypatch, dt):
    monkeypatch.setattr(codecs, "NF4_CHUNK_BLOCKS", 7)
    x = as_dtype(heavy((37, 999), seed=5, f16_safe=True), dt)
    one = codecs.get_codec("nf4").encode(x, threads=1)
    three = codecs.get_codec("nf4").encode(x, threads=3)
    codes, absmax = R.nf4_encode(x)
    for e in (one, three):
        assert _bytes_equal(e.parts["codes"], codes) and _bytes_equal(e.parts["absmax"], absmax)
    assert one.sqnr_db == three.sqnr_db  # exactly: fixed chunks, fixed order
    assert _bytes_equal(codecs.get_codec("nf4").decode(one.parts, x.shape, threads=3),
                        R.nf4_decode(codes, absmax, x.shape))


def test_nf4_nonfinite_counted_and_encoded_as_zero(isa):
    x = heavy((5, 70), seed=9)
    x[0, 3], x[2, 5], x[4, 69] = np.nan, np.inf, -np.inf
    enc = codecs.get_codec("nf4").encode(x)
    assert enc.nonfinite == 3
    clean = np.where(np.isfinite(x), x, 0).astype(np.float32)
    codes, absmax = R.nf4_encode(clean)
    assert _bytes_equal(enc.parts["codes"], codes) and _bytes_equal(enc.parts["absmax"], absmax)
    assert math.isfinite(enc.sqnr_db)


# ---------------------------------------------------------------- int8

@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(31,), (65,)])
def test_int8_c_matches_reference(isa, dt, shape):
    x = as_dtype(heavy(shape, seed=7 + sum(shape), f16_safe=True), dt)
    codec = codecs.get_codec("int8")
    enc = codec.encode(x)
    q, scale = R.int8_encode(x)
    rows = 1 if len(shape) == 1 else shape[0]
    assert _bytes_equal(enc.parts["q"], q.reshape(rows, -1))
    assert _bytes_equal(enc.parts["scale"], scale)
    assert list(enc.parts) == ["q", "scale"] and enc.layout == {"kind": "row_major"}
    ref_deq = R.int8_decode(q, scale)
    assert enc.sqnr_db == pytest.approx(R.sqnr_db(x, ref_deq), rel=1e-9, abs=1e-9)
    assert _bytes_equal(codec.decode(enc.parts, shape, enc.layout), ref_deq.reshape(shape))
    # straight into the NPU tiles: the same codes, tiled
    npu = codec.encode(x, npu=True)
    n_rows, k = q.reshape(rows, -1).shape
    assert npu.layout == layout.npu_layout(n_rows, k)
    assert _bytes_equal(npu.parts["q"], layout.tile_int8(q.reshape(rows, -1)))
    assert _bytes_equal(npu.parts["scale"], scale)
    assert npu.sqnr_db == enc.sqnr_db
    assert _bytes_equal(codec.decode(npu.parts, shape, npu.layout), ref_deq.reshape(shape))


def test_int8_degenerate_rows(isa):
    x = np.zeros((6, 40), np.float32)
    x[1] = 2.5                                                   # constant row
    x[2] = (np.arange(40) - 20) * np.float32(1e-40)              # subnormal row: 127/amax overflows
    x[3] = np.where(np.arange(40) % 2, -0.0, 0.0)                # +-0
    x[4] = np.arange(40, dtype=np.float32) - np.float32(19.5)    # many exact .5 ties after scaling
    x[5, 0] = np.float32(np.finfo(np.float32).max)               # huge
    x[5, 1] = -np.float32(np.finfo(np.float32).max) / 3
    enc = codecs.get_codec("int8").encode(x)
    q, scale = R.int8_encode(x)
    assert _bytes_equal(enc.parts["q"], q) and _bytes_equal(enc.parts["scale"], scale)
    assert scale[0] == 0 and not q[0].any() and not q[3].any()
    # inv is capped at FLT_MAX (127/amax overflows): defined codes, not NaN casts
    assert q[2].min() == -1 and q[2].max() == 1 and scale[2] > 0
    ties = np.array([-127, 127], np.float32)
    assert np.array_equal(np.rint(ties), ties)
    npu = codecs.get_codec("int8").encode(x, npu=True)
    assert _bytes_equal(npu.parts["q"], layout.tile_int8(q))


def test_int8_half_to_even():
    # row amax 127 makes inv exactly 1, so x * inv = x: .5 ties must round to even
    x = np.array([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]], np.float32)
    q, scale = R.int8_encode(x)
    assert list(q[0]) == [127, 0, 2, 2, 0, -2, -2, 126] and scale[0] == np.float32(1.0)
    enc = codecs.get_codec("int8").encode(x)
    assert _bytes_equal(enc.parts["q"], q)


@pytest.mark.parametrize("npu", [False, True])
def test_int8_threads_and_chunks(monkeypatch, npu):
    monkeypatch.setattr(codecs, "INT8_CHUNK_ELEMS", 3000)
    x = as_dtype(heavy((101, 130), seed=11), "bf16")
    codec = codecs.get_codec("int8")
    one = codec.encode(x, npu=npu, threads=1)
    three = codec.encode(x, npu=npu, threads=3)
    assert _bytes_equal(one.parts["q"], three.parts["q"]) and _bytes_equal(one.parts["scale"], three.parts["scale"])
    assert one.sqnr_db == three.sqnr_db
    q, scale = R.int8_encode(x)
    assert _bytes_equal(one.parts["q"], layout.tile_int8(q) if npu else q)
    dec = codec.decode(one.parts, x.shape, one.layout, threads=3)
    assert _bytes_equal(dec, R.int8_decode(q, scale))


def test_int8_nonfinite(isa):
    x = heavy((4, 50), seed=2)
    x[1, 1], x[3, 49] = np.nan, -np.inf
    enc = codecs.get_codec("int8").encode(x, npu=True)
    assert enc.nonfinite == 2
    q, _ = R.int8_encode(np.where(np.isfinite(x), x, 0).astype(np.float32))
    assert _bytes_equal(enc.parts["q"], layout.tile_int8(q))


def test_int8_rejects_3d():
    with pytest.raises(ValueError):
        codecs.get_codec("int8").encode(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(TypeError):
        codecs.get_codec("int8").encode(np.zeros((2, 3), np.float64))


# ---------------------------------------------------------------- float codecs, registry

@pytest.mark.parametrize("enc_name,dt", [("f32", "f32"), ("f16", "f16"), ("bf16", "bf16")])
def test_float_codecs_keep_bytes(enc_name, dt):
    x = as_dtype(heavy((9, 33), seed=4, f16_safe=True), dt)
    x.reshape(-1)[5] = np.array(np.inf, np.float32).astype(x.dtype) if dt != "bf16" else 0x7F80
    assert codecs.float_encoding_for(x.dtype) == enc_name
    codec = codecs.get_codec(enc_name)
    enc = codec.encode(x, threads=3)
    assert list(enc.parts) == ["data"] and enc.parts["data"].tobytes() == x.tobytes()
    assert enc.sqnr_db is None and enc.nonfinite == 1 and enc.layout == {"kind": "row_major"}
    dec = codec.decode(enc.parts, x.shape, enc.layout)
    assert dec.dtype == np.float32 and _bytes_equal(dec, R.widen(x))
    with pytest.raises(TypeError):
        codec.encode(np.zeros(3, np.float64 if dt != "f64" else np.float32))
    with pytest.raises(ValueError):
        codec.encode(x, npu=True)


def test_registry():
    from orkpack.pack import spec

    for name in spec.ENCODINGS:
        c = codecs.get_codec(name)
        assert c.encoding == name and c.parts == spec.PARTS[name]
    with pytest.raises(ValueError):
        codecs.get_codec("q4_0")
    with pytest.raises(ValueError):
        codecs.get_codec("nf4").encode(np.zeros((2, 64), np.float32), npu=True)
