"""int5dq / int6dq / int8dq (format 1.7): b-bit integer codes in blocks of 32, the block step double-quantized as
nf4dq's absmax.

* the code packing (b-bit two's complement fields, LSB first) round-trips and int8dq's codes are int8 bytes;
* the C kernel (kernels/intdq.c; every weighting, column weights or not, f32/f16/bf16, non-finite values, odd
  sizes, n < 32, several groups of 256 blocks and a partial last one, all-zero / constant / denormal / huge blocks,
  heavy tails with outliers) gives the bytes of the numpy reference (reference.intdq_encode);
* the C decode (runtime.c ork_rt_intdq_decode, any range) equals reference.intdq_decode; the SQNR reported is that
  of the decoded values; threads 1, 2, 3 give the same bytes and SQNR;
* quality: the weighted search lowers the weighted error; each width's error is below the narrower one's and the
  symmetric grid's (the choice FORMAT.md 3 states), and int8dq beats per-row int8 on heavy-tailed weights;
* the same sources give the same bytes on aarch64 (qemu) and with the x86 SIMD compiled out.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from orkpack import codecs
from orkpack.codecs import reference as R
from orkpack.pack import spec

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
PARTS = ("codes", "absmax_q", "absmax_scale", "absmax_offset")
ENCS = {"int5dq": 5, "int6dq": 6, "int8dq": 8}
SHAPES = [(32,), (1, 1), (3,), (31,), (33,), (7, 1000), (9, 130), (257 * 32 + 5,), (3, 8203), (512, 32)]


def _heavy(shape, seed):
    from test_nf4opt import _heavy as heavy

    return heavy(shape, seed, block=32)


def _enc(enc, x, **kw):
    return codecs.get_codec(enc).encode(x, **kw)


def _same(e, ref, what=""):
    for name, r in zip(PARTS, ref):
        assert e.parts[name].dtype == r.dtype and e.parts[name].shape == r.shape, (what, name)
        assert e.parts[name].tobytes() == r.tobytes(), f"{what}: {name} differs from the numpy reference"


def test_registered_with_the_nf4dq_parts():
    for enc, bits in ENCS.items():
        assert enc in spec.ENCODINGS and spec.INTDQ_BITS[enc] == bits and spec.PARTS[enc] == PARTS
        assert isinstance(codecs.get_codec(enc), codecs.IntDQCodec) and codecs.get_codec(enc).bits == bits


@pytest.mark.parametrize("bits", [5, 6, 8])
def test_packing_round_trips(bits):
    rng = np.random.default_rng(bits)
    lo, hi = R.intdq_levels(bits)
    assert (lo, hi) == (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    for n in (1, 7, 32, 33, 1001):
        q = rng.integers(lo, hi + 1, n)
        c = R.intdq_pack(q, bits)
        assert c.size == R.intdq_codes_size(n, bits) == -(-n * bits // 8)
        assert (R.intdq_unpack(c, n, bits) == q).all()
        if n * bits % 8:  # the bits after the last field are 0
            assert c[-1] >> (n * bits % 8) == 0
    # element 0 is the low bits of byte 0: -1 at 5 bits is 0b11111, then 1 -> bits 5..9
    assert R.intdq_pack(np.array([-1, 1]), 5).tolist() == [0b00111111, 0b00000000]
    if bits == 8:
        q = rng.integers(-128, 128, 77)
        assert (R.intdq_pack(q, 8).view(np.int8) == q).all()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("enc", list(ENCS))
def test_c_equals_numpy(shape, enc):
    x = _heavy(shape, shape[-1])
    cw = np.random.default_rng(1).random(shape[-1]).astype(np.float32) ** 4
    cw[0] = 0.0
    for weighting in R.NF4OPT_WEIGHTINGS:
        for w in (None, cw):
            e = _enc(enc, x, col_weights=w, weighting=weighting)
            _same(e, R.intdq_encode(x, ENCS[enc], w, weighting), f"{enc} {shape} {weighting} cw={w is not None}")


def _edge_cases():
    rng = np.random.default_rng(1)
    huge = np.clip(rng.standard_normal(4000) * 1e38, -3.3e38, 3.3e38).astype(np.float32)
    huge[::7], huge[::11] = 3.3e38, -3.3e38
    zero_group = rng.standard_normal(300 * 32).astype(np.float32)
    zero_group[: 256 * 32] = 0.0
    outliers = (rng.standard_t(2, 5000) * 0.02).astype(np.float32)
    outliers[::97] = 40.0
    outliers[5::131] = -60.0
    return {
        "huge": huge,
        "constant": np.full((40, 64), 0.25, np.float32),
        "negative_constant": np.full((3, 100), -1.5, np.float32),
        "subnormal": (rng.standard_normal(500) * 1e-42).astype(np.float32),
        "tiny": (rng.standard_normal(3000) * 1e-39).astype(np.float32),
        "zero_group": zero_group,
        "const_group": np.concatenate([np.ones(256 * 32, np.float32), rng.standard_normal(100).astype(np.float32)]),
        "wide_range": np.concatenate([rng.standard_normal(3200) * 1e-30, rng.standard_normal(3200) * 1e30]
                                     ).astype(np.float32),
        "all_zero": np.zeros(100, np.float32),
        "outliers": outliers,
    }


@pytest.mark.parametrize("case", list(_edge_cases()))
def test_c_equals_numpy_edge_cases(case):
    x = _edge_cases()[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for enc, bits in ENCS.items():
            for w in R.NF4OPT_WEIGHTINGS:
                e = _enc(enc, x, weighting=w)
                _same(e, R.intdq_encode(x, bits, None, w), f"{case} {enc} {w}")
                dec = codecs.get_codec(enc).decode(e.parts, x.shape)
                ref = R.intdq_decode(*(e.parts[p] for p in PARTS), x.shape, bits)
                # x2 weights of |x| ~ 1e30 overflow float32 (as nf4dq's): NaN steps, whose sign numpy and C differ on
                fin = np.isfinite(ref)
                assert dec[fin].tobytes() == ref[fin].tobytes() and not np.isfinite(dec[~fin]).any()


def test_degenerate_blocks_decode_as_expected():
    for enc in ENCS:
        z = codecs.get_codec(enc).decode(_enc(enc, np.zeros((4, 96), np.float32)).parts, (4, 96))
        assert not z.any()
        c = np.full((2, 64), 0.25, np.float32)  # representable exactly: q * a with a = 0.25 / q
        assert np.array_equal(codecs.get_codec(enc).decode(_enc(enc, c).parts, c.shape), c)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_c_equals_numpy_16bit_and_nonfinite(dtype):
    from test_nf4opt import _nonfinite_16bit

    src = _nonfinite_16bit(dtype, block=32)
    for enc, bits in ENCS.items():
        e = _enc(enc, src, weighting="sigma")
        assert e.nonfinite == 3
        _same(e, R.intdq_encode(src, bits, None, "sigma"), f"{dtype} {enc}")


@pytest.mark.parametrize("shape", [(1, 1), (31,), (9, 130), (3, 8203)])
def test_decode_is_the_reference_and_the_sqnr_is_of_the_decode(shape):
    x = _heavy(shape, 5)
    for enc, bits in ENCS.items():
        e = _enc(enc, x)
        ours = codecs.get_codec(enc).decode(e.parts, shape)
        ref = R.intdq_decode(*(e.parts[p] for p in PARTS), shape, bits)
        assert ours.dtype == np.float32 and ours.shape == shape
        assert ours.tobytes() == ref.tobytes()
        assert e.sqnr_db == pytest.approx(R.sqnr_db(x, ours), abs=1e-9)


def test_decode_refuses_parts_of_another_shape():
    for enc in ENCS:
        e = _enc(enc, _heavy((9, 130), 5))
        with pytest.raises(ValueError, match="do not fit"):
            codecs.get_codec(enc).decode(e.parts, (9, 131))


@pytest.mark.parametrize("e0,e1", [(0, 5000), (5, 77), (31, 33), (32, 64), (100, 4999), (4990, 5000), (7, 7)])
def test_runtime_decode_of_any_range(e0, e1):
    from orkpack._kernels import ffi, lib

    x = (np.random.default_rng(3).standard_t(2, 5000) * 0.02).astype(np.float32)

    def p(a, t):
        return ffi.cast(t, ffi.from_buffer(a))

    for bits in (5, 6, 8):
        c, q, s, o = R.intdq_encode(x, bits)
        want = R.intdq_decode(c, q, s, o, (x.size,), bits)[e0:e1]
        out = np.empty(max(1, e1 - e0), np.float32)
        rc = lib.ork_rt_intdq_decode(bits, p(c, "uint8_t *"), c.size, p(q, "uint8_t *"), q.size, p(s, "float *"),
                                     s.size, float(o[0]), e0, e1, p(out, "float *"))
        assert rc == 0 and out[: e1 - e0].tobytes() == want.tobytes()
        # parts too small for the range, a bad width: refused, nothing read past them
        assert lib.ork_rt_intdq_decode(bits, p(c, "uint8_t *"), -(-e1 * bits // 8) - 1, p(q, "uint8_t *"), q.size,
                                       p(s, "float *"), s.size, 0.0, e0, e1, p(out, "float *")) == (-1 if e1 else 0)
        assert lib.ork_rt_intdq_decode(7, p(c, "uint8_t *"), c.size, p(q, "uint8_t *"), q.size, p(s, "float *"),
                                       s.size, 0.0, e0, e1, p(out, "float *")) == -1


def test_threads_do_not_change_the_bytes():
    x = _heavy((300, 4096), 9)  # > two chunks of NF4_CHUNK_BLOCKS blocks
    assert x.size > 2 * codecs.NF4_CHUNK_BLOCKS * 32
    cw = np.random.default_rng(2).random(4096).astype(np.float32)
    for enc in ENCS:
        one = _enc(enc, x, col_weights=cw, threads=1)
        for t in (2, 3):
            e = _enc(enc, x, col_weights=cw, threads=t)
            for p in PARTS:
                assert e.parts[p].tobytes() == one.parts[p].tobytes()
            assert e.sqnr_db == one.sqnr_db
        assert codecs.get_codec(enc).decode(one.parts, x.shape, threads=2).tobytes() == \
            codecs.get_codec(enc).decode(one.parts, x.shape).tobytes()


def test_bad_column_weights_and_options_refused():
    x = np.ones((2, 64), np.float32)
    for enc in ENCS:
        for bad in (np.ones(63, np.float32), -np.ones(64, np.float32), np.full(64, np.nan, np.float32)):
            with pytest.raises(ValueError, match="column weights"):
                _enc(enc, x, col_weights=bad)
        with pytest.raises(ValueError, match="weighting"):
            _enc(enc, x, weighting="nope")
        with pytest.raises(ValueError, match="host"):
            _enc(enc, x, npu=True)
    with pytest.raises(ValueError, match="bits"):
        R.intdq_levels(7)


def test_empty_slice():
    for enc in ENCS:
        e = _enc(enc, np.zeros((0, 64), np.float32))
        assert [e.parts[p].size for p in PARTS] == [0, 0, 0, 1]
        assert codecs.get_codec(enc).decode(e.parts, (0, 64)).shape == (0, 64)


def test_weighted_search_uses_the_weights():
    rng = np.random.default_rng(5)
    x = rng.standard_t(3, (64, 256)).astype(np.float32)
    cw = np.where(np.arange(256) % 32 < 4, 100.0, 0.01).astype(np.float32)  # 4 columns of every block matter
    wel = np.tile(cw, 64).astype(np.float64)
    x64 = x.ravel().astype(np.float64)
    for enc in ENCS:
        def werr(e):
            d = codecs.get_codec(enc).decode(e.parts, x.shape).ravel().astype(np.float64)
            return float(np.sum(wel * (x64 - d) ** 2))

        assert werr(_enc(enc, x, col_weights=cw)) < 0.9 * werr(_enc(enc, x)), enc


def _realistic(seed):
    """Matrices like a transformer's: heavy tails (t, 4 dof) and a few outlier input channels."""
    rng = np.random.default_rng(seed)
    out = []
    for n, k in [(384, 384), (1536, 384), (256, 1000)]:
        w = rng.standard_t(4, size=(n, k)) * 0.03
        w[:, rng.choice(k, 4, replace=False)] *= 8.0
        out.append(w.astype(np.float32))
    out.append(rng.standard_normal((256, 512)).astype(np.float32))
    return out


def test_quality_order_and_the_level_choice():
    """Every matrix: nf4dq < int5dq < int6dq < int8dq in SQNR (each extra bit ~6 dB: at least 4.5 dB apart from
    5 to 6); int8dq above per-row int8; the asymmetric grid (the format's) not worse than the symmetric one."""
    for w in _realistic(7):
        s = {e: _enc(e, w).sqnr_db for e in ("nf4dq", *ENCS)}
        assert s["nf4dq"] < s["int5dq"] < s["int6dq"] - 4.5 < s["int8dq"] - 9.0, s
        assert s["int8dq"] > codecs.get_codec("int8").encode(w).sqnr_db, s
        for bits in (5, 6):  # 8 bits: the two grids are within noise (FORMAT.md 3)
            sym = R.intdq_decode(*R.intdq_encode(w, bits, symmetric=True), w.shape, bits)
            assert R.sqnr_db(w, sym) <= s[f"int{bits}dq"] + 1e-6, (bits, R.sqnr_db(w, sym), s)


# ------------------------------------------------------------------ other ISAs

def _flags():
    m = re.search(r"extra_compile_args=(\[[^\]]*\])", (KERNELS / "build.py").read_text())
    return ast.literal_eval(m.group(1))


@pytest.mark.parametrize("target", ["aarch64", "x86-portable"])
def test_other_builds_give_the_same_bytes(target, tmp_path):
    """tests/aarch64/intdq_driver.c with kernels/{intdq,nf4opt,codecs,runtime}.c: aarch64 (static, qemu) and the
    host compiler with the x86 SIMD compiled out; every output equals the numpy reference."""
    cc = shutil.which("aarch64-linux-gnu-gcc") if target == "aarch64" else shutil.which("cc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if cc is None or (target == "aarch64" and qemu is None):
        pytest.skip(f"no compiler or emulator for {target} (apt-get install gcc-aarch64-linux-gnu qemu-user-static)")
    exe = tmp_path / "driver"
    extra = ["-static"] if target == "aarch64" else ["-DORK_NO_X86_SIMD"]
    cmd = [cc, *_flags(), *extra, "-Werror", f"-I{KERNELS}", str(ROOT / "tests" / "aarch64" / "intdq_driver.c"),
           *(str(KERNELS / f) for f in ("intdq.c", "nf4opt.c", "codecs.c", "runtime.c")), "-o", str(exe),
           "-lpthread", "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    run = [qemu, str(exe)] if target == "aarch64" else [str(exe)]
    cases = [((9, 130), 0, False), ((3, 8203), 2, True), ((257 * 32 + 5,), 1, False), ((31,), 0, True)]
    for (shape, wcode, has_cw) in cases:
        x = _heavy(shape, 3)
        x.reshape(-1)[:3200] *= np.float32(1e-40)  # denormal blocks
        k = shape[-1]
        cw = np.random.default_rng(4).random(k).astype(np.float32) ** 3
        d = tmp_path / "io"
        d.mkdir(exist_ok=True)
        x.astype(np.float32).tofile(d / "x.f32")
        cw.tofile(d / "cw.f32")
        for bits in (5, 6, 8):
            r = subprocess.run([*run, str(d), str(x.size), str(k), str(bits), str(wcode), str(int(has_cw))],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stderr
            ref = R.intdq_encode(x, bits, cw if has_cw else None, R.NF4OPT_WEIGHTINGS[wcode])
            for name, want in zip(("codes", "q", "scale", "offset"), ref):
                assert (d / name).read_bytes() == want.tobytes(), (target, shape, bits, name)
            dec = R.intdq_decode(*ref, (x.size,), bits)
            assert (d / "dec.f32").read_bytes() == dec.tobytes(), (target, shape, bits)
