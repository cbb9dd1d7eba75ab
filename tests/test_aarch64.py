"""The C kernels on other ISAs: bit-identical on aarch64 and with the x86 SIMD compiled out.

kernels/codecs.c and kernels/runtime.c are compiled with tests/aarch64/driver.c (which reads
inputs from files, runs every kernel, writes the outputs) with the flags of kernels/build.py:

  * ``aarch64``: ``aarch64-linux-gnu-gcc ... -static``, run under ``qemu-aarch64(-static)``. This is
    the build the packer and the runtime get on the RK3588 board (NEON inflate, DC CVAC clean);
    the portable C inflate is run there too (``ork_rt_force_portable``).
  * ``x86-portable``: the host compiler with ``-DORK_NO_X86_SIMD``, run natively: the portable C
    fallback on its own, which is what every non-x86, non-NEON build runs.

Every output must equal, byte for byte, the numpy references (orkpack/codecs/reference.py,
orkpack/layout.py, orkpack/runtime/inflate.py) and the SQNR sums of the x86-64 kernels in this
process (same chunks, so the same fold). The aarch64 target is skipped, with the reason, when the
cross compiler or qemu is missing; on Debian/Ubuntu they come from
``apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static``.

This file also checks that every x86 SIMD level of the inflate (AVX-512 VBMI, SSSE3, portable;
``ork_rt_set_isa``) gives the same bytes, including the streaming-store path of large images.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from orkpack._kernels import ffi, lib
from orkpack.codecs import reference as R
from orkpack.layout import tile_int8
from orkpack.runtime.inflate import inflate, inflate_into, inflate_reference, tiled_size

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
DRIVER = Path(__file__).resolve().parent / "aarch64" / "driver.c"
DT = {"f32": 0, "f16": 1, "bf16": 2}

# shapes: K not a multiple of 32 or 64, K > 8192 (two segments), odd element counts, N not a multiple of 32
ENC_SHAPES = [(37, 200), (3, 8203), (1, 999), (64, 256)]
INFLATE_SHAPES = [(37, 200, 8192), (64, 1024, 8192), (40, 8256, 8192), (33, 8200, 8192), (9, 640, 96),
                  (20, 16384, 8192)]


def _build_flags() -> list[str]:
    """extra_compile_args of kernels/build.py (the same flags as the cffi build), read from its text."""
    m = re.search(r"extra_compile_args=(\[[^\]]*\])", (KERNELS / "build.py").read_text())
    assert m, "kernels/build.py no longer has extra_compile_args=[...]"
    flags = ast.literal_eval(m.group(1))
    assert "-ffp-contract=off" in flags
    return flags


def _compile(cc: str, out: Path, extra: list[str]) -> None:
    cmd = [cc, *_build_flags(), *extra, f"-I{KERNELS}", str(DRIVER), str(KERNELS / "codecs.c"),
           str(KERNELS / "nf4opt.c"), str(KERNELS / "runtime.c"), "-o", str(out), "-lpthread", "-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stderr}"


def _weights(rng, shape, dtype):
    """Heavy-tailed values with a zero row, NaN/Inf (counted, encoded as 0), subnormals and exact ties."""
    x = (rng.standard_t(1.5, size=shape) * 0.02).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] = np.float32(2.0) ** -140
    flat[rng.integers(0, flat.size, 2)] = np.float32(0.5)
    if shape[0] > 2:
        x[1] = 0
    if dtype == "f16":
        x = np.clip(x, -6e4, 6e4).astype(np.float16)
        x.reshape(-1)[rng.integers(0, x.size, 2)] = np.inf
        return x
    x.reshape(-1)[rng.integers(0, x.size, 2)] = np.nan
    x.reshape(-1)[rng.integers(0, x.size, 1)] = -np.inf
    if dtype == "bf16":
        return (x.view(np.uint32) >> 16).astype(np.uint16)
    return x


def _ptr(a, ctype):
    return ffi.cast(ctype, ffi.from_buffer(a))


def _x86_nf4_stats(x, chunk):
    """(sum_x2, sum_err2, nonfinite) of the x86-64 kernels, folded in chunk order like NF4Codec."""
    flat = np.ascontiguousarray(x).reshape(-1)
    n, nb = flat.size, -(-flat.size // 64)
    codes, absmax = np.empty((n + 1) // 2, np.uint8), np.empty(nb, np.float32)
    st, sx, se, nf = ffi.new("ork_codec_stats *"), 0.0, 0.0, 0
    for b in range(0, nb, chunk):
        lib.ork_nf4_encode(_ptr(flat, "void *"), DT[_dtname(x)], n, b, min(nb, b + chunk),
                           _ptr(codes, "uint8_t *"), _ptr(absmax, "float *"), st)
        sx, se, nf = sx + st.sum_x2, se + st.sum_err2, nf + st.nonfinite
    return np.array([sx, se], np.float64).tobytes() + np.array([nf], np.int64).tobytes()


def _x86_int8_stats(x, kseg, chunk):
    n, k = x.shape
    rows = -(-n // 32) * 32 if kseg else n
    q = np.empty(tiled_size(n, k, kseg) if kseg else n * k, np.int8)
    scale = np.empty(n, np.float32)
    st, sx, se, nf = ffi.new("ork_codec_stats *"), 0.0, 0.0, 0
    for r in range(0, rows, chunk):
        lib.ork_int8_encode(_ptr(x, "void *"), DT[_dtname(x)], n, k, r, min(rows, r + chunk), kseg,
                            _ptr(q, "int8_t *"), _ptr(scale, "float *"), st)
        sx, se, nf = sx + st.sum_x2, se + st.sum_err2, nf + st.nonfinite
    return np.array([sx, se], np.float64).tobytes() + np.array([nf], np.int64).tobytes()


def _x86_opt_stats(x, k, cw, wcode, block, tries, chunk):
    """The SQNR sums of the x86-64 opt encoder (kernels/nf4opt.c), chunk by chunk as the driver runs it."""
    flat = np.ascontiguousarray(x).reshape(-1)
    n, nb = flat.size, -(-flat.size // block)
    codes, absmax = np.empty((n + 1) // 2, np.uint8), np.empty(nb, np.float32)
    cwp = _ptr(cw, "float *") if cw is not None else ffi.NULL
    st, sx, se, nf = ffi.new("ork_codec_stats *"), 0.0, 0.0, 0
    for b in range(0, nb, chunk):
        lib.ork_nf4opt_encode(_ptr(flat, "void *"), DT[_dtname(x)], n, k, cwp, wcode, block, tries, b,
                              min(nb, b + chunk), _ptr(codes, "uint8_t *"), _ptr(absmax, "float *"), st)
        sx, se, nf = sx + st.sum_x2, se + st.sum_err2, nf + st.nonfinite
    return np.array([sx, se], np.float64).tobytes() + np.array([nf], np.int64).tobytes()


def _x86_dq_stats(x, k, cw, wcode, chunk):
    """The SQNR sums of the x86-64 nf4dq encoder, its three steps chunk by chunk as the driver runs them."""
    flat = np.ascontiguousarray(x).reshape(-1)
    n = flat.size
    nb = -(-n // R.NF4DQ_BLOCK)
    src, cwp = _ptr(flat, "void *"), (_ptr(cw, "float *") if cw is not None else ffi.NULL)
    d, scale = np.empty(nb, np.float32), np.empty(-(-nb // R.NF4DQ_GROUP), np.float32)
    codes, q, off = np.empty((n + 1) // 2, np.uint8), np.empty(nb, np.uint8), ffi.new("float *")
    for b in range(0, nb, chunk):
        lib.ork_nf4opt_encode(src, DT[_dtname(x)], n, k, cwp, wcode, R.NF4DQ_BLOCK, R.NF4DQ_TRIES, b,
                              min(nb, b + chunk), ffi.NULL, _ptr(d, "float *"), ffi.NULL)
    lib.ork_nf4dq_scales(_ptr(d, "float *"), nb, _ptr(scale, "float *"), off)
    st, sx, se, nf = ffi.new("ork_codec_stats *"), 0.0, 0.0, 0
    for b in range(0, nb, chunk):
        lib.ork_nf4dq_encode(src, DT[_dtname(x)], n, k, cwp, wcode, _ptr(d, "float *"), _ptr(scale, "float *"),
                             off[0], b, min(nb, b + chunk), _ptr(codes, "uint8_t *"), _ptr(q, "uint8_t *"), st)
        sx, se, nf = sx + st.sum_x2, se + st.sum_err2, nf + st.nonfinite
    return np.array([sx, se], np.float64).tobytes() + np.array([nf], np.int64).tobytes()


WCODE = {w: i for i, w in enumerate(R.NF4OPT_WEIGHTINGS)}  # ORK_NF4W_* of kernels/nf4opt.h


def _dtname(x):
    return {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.uint16): "bf16"}[x.dtype]


class Cases:
    """Inputs written to `d`, the driver's command lines, and the expected bytes of every output."""

    def __init__(self, d: Path):
        self.d = d
        self.cmds: list[str] = []
        self.want: dict[str, bytes] = {}
        rng = np.random.default_rng(20240611)
        for si, (n, k) in enumerate(ENC_SHAPES):
            for dt in DT:
                x = np.ascontiguousarray(_weights(rng, (n, k), dt))
                tag = f"s{si}_{dt}"
                self._put(f"{tag}_x", x)
                # NF4: small chunks so the fold over several chunks is covered
                codes, absmax = R.nf4_encode(x)
                self._cmd(f"nf4_encode {DT[dt]} {x.size} 7 {tag}_x {tag}_nc {tag}_na {tag}_ns",
                          {f"{tag}_nc": codes, f"{tag}_na": absmax, f"{tag}_ns": _x86_nf4_stats(x, 7)})
                if dt == "f32":
                    self._cmd(f"nf4_decode {x.size} {tag}_nc {tag}_na {tag}_nd",
                              {f"{tag}_nd": R.nf4_decode(codes, absmax, (x.size,))})
                    self._cmd(f"rt_decode {x.size} {tag}_nc {tag}_na {tag}_rd",
                              {f"{tag}_rd": R.nf4_decode(codes, absmax, (x.size,))})
                q, scale = R.int8_encode(x)
                for kseg in (0, 8192, 64):
                    t = f"{tag}_k{kseg}"
                    qq = q if kseg == 0 else tile_int8(q, kseg)
                    self._cmd(f"int8_encode {DT[dt]} {n} {k} {kseg} 5 {tag}_x {t}_q {t}_s {t}_st",
                              {f"{t}_q": qq, f"{t}_s": scale, f"{t}_st": _x86_int8_stats(x, kseg, 5)})
                    if dt == "f32":
                        self._cmd(f"int8_decode {n} {k} {kseg} {t}_q {t}_s {t}_dq",
                                  {f"{t}_dq": R.int8_decode(q, scale)})
                if dt == "f32":
                    self._put(f"{tag}_q8", q)
                    for kseg in (8192, 96):
                        self._cmd(f"int8_tile {n} {k} {kseg} {tag}_q8 {tag}_t{kseg}",
                                  {f"{tag}_t{kseg}": tile_int8(q, kseg)})
                # the opt and nf4dq searches (the NEON body on aarch64): plain weights for every dtype, column
                # weights with the x2 / sigma weightings on float32 (one value block with an outlier column)
                cw = np.abs(rng.standard_t(2, k)).astype(np.float32) + np.float32(0.01)
                self._put(f"{tag}_cw", cw)
                for wname, colw in (("plain", None),) + ((("sigma", cw), ("x2", cw)) if dt == "f32" else ()):
                    t, cwf, wc = f"{tag}_{wname}", ("-" if colw is None else f"{tag}_cw"), WCODE[wname]
                    oc, oa = R.nf4opt_encode(x, colw, wname)
                    self._cmd(f"nf4opt_encode {DT[dt]} {x.size} {k} {wc} 64 {R.NF4OPT_TRIES} 5 {tag}_x {cwf} "
                              f"{t}_oc {t}_oa {t}_os",
                              {f"{t}_oc": oc, f"{t}_oa": oa,
                               f"{t}_os": _x86_opt_stats(x, k, colw, wc, 64, R.NF4OPT_TRIES, 5)})
                    dparts = R.nf4dq_encode(x, colw, wname)
                    names = [f"{t}_d{p}" for p in ("c", "q", "s", "o")]
                    self._cmd(f"nf4dq_encode {DT[dt]} {x.size} {k} {wc} 9 {tag}_x {cwf} {' '.join(names)} {t}_dst",
                              dict(zip(names, dparts)) | {f"{t}_dst": _x86_dq_stats(x, k, colw, wc, 9)})
                    if wname == "plain":  # chunks of 48 blocks: the unit-weight bodies (16 full blocks at a time)
                        names48 = [f"{t}_e{p}" for p in ("c", "q", "s", "o")]
                        self._cmd(f"nf4dq_encode {DT[dt]} {x.size} {k} {wc} 48 {tag}_x {cwf} {' '.join(names48)} "
                                  f"{t}_est", dict(zip(names48, dparts)) | {f"{t}_est": _x86_dq_stats(x, k, colw, wc, 48)})
                        for name, part in zip(names, dparts):
                            self._put(name + "_in", part)
                        self._cmd(f"nf4dq_decode {x.size} {' '.join(n_ + '_in' for n_ in names)} {t}_dd",
                                  {f"{t}_dd": R.nf4dq_decode(*dparts, (x.size,))})
                wide = R.widen(x)
                count = int((~np.isfinite(wide)).sum())
                self._cmd(f"widen {DT[dt]} {x.size} {tag}_x {tag}_w {tag}_wc",
                          {f"{tag}_w": wide, f"{tag}_wc": np.array([count, count], np.int64)})
        for nbytes, off in ((1, 0), (4095, 3), (70001, 64), (1 << 20, 17)):
            src = rng.integers(0, 256, nbytes, dtype=np.uint8)
            self._put(f"f{nbytes}_src", src)
            want = np.zeros(nbytes + off + 64, np.uint8)
            want[off:off + nbytes] = src
            self._cmd(f"fill {nbytes} {off} f{nbytes}_src f{nbytes}_dst", {f"f{nbytes}_dst": want})
        for si, (n, k, kseg) in enumerate(INFLATE_SHAPES):
            nel = n * k
            if si % 2:  # codes no encoder writes; negative, subnormal and non-finite absmax
                codes = rng.integers(0, 256, (nel + 1) // 2, dtype=np.uint8)
                nb = -(-nel // 64)
                absmax = (rng.standard_normal(nb) * 10.0 ** rng.integers(-40, 30, nb)).astype(np.float32)
                absmax[::7], absmax[1::11], absmax[2::13], absmax[3::17] = 1e-38, np.inf, np.nan, -0.0
            else:
                codes, absmax = R.nf4_encode(_weights(rng, (n, k), "f32"))
            tag = f"i{si}"
            self._put(f"{tag}_c", codes)
            self._put(f"{tag}_a", absmax)
            rq, rs, _ = inflate_reference(codes, absmax, (n, k), kseg)
            for method in ("direct", "two_step"):
                for portable in (0, 1):
                    t = f"{tag}_{method}_{portable}"
                    self._cmd(f"inflate {method} {portable} {n} {k} {kseg} 1 {tag}_c {tag}_a {t}_q {t}_s",
                              {f"{t}_q": rq, f"{t}_s": rs})

    def _put(self, name, arr):
        (self.d / name).write_bytes(np.ascontiguousarray(arr).tobytes())

    def _cmd(self, line, outputs):
        self.cmds.append(line)
        for name, v in outputs.items():
            self.want[name] = v if isinstance(v, bytes) else np.ascontiguousarray(v).tobytes()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return Cases(tmp_path_factory.mktemp("kernels_io"))


def _run(cases: Cases, argv: list[str], outdir: Path) -> dict[str, bytes]:
    """Run the driver in a copy of the inputs; {output name: bytes} (missing outputs absent)."""
    shutil.copytree(cases.d, outdir)
    res = subprocess.run(argv, input="\n".join(["isa", *cases.cmds]) + "\n", capture_output=True, text=True,
                         cwd=outdir, timeout=300)
    assert res.returncode == 0 and "FAIL" not in res.stdout, f"driver failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return {name: (outdir / name).read_bytes() for name in cases.want if (outdir / name).exists()} | {
        "_isa": res.stdout.splitlines()[0].encode()}


@pytest.fixture(scope="module")
def aarch64_outputs(cases, tmp_path_factory):
    cc = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if not cc or not qemu:
        pytest.skip("aarch64 cross build not checked: needs aarch64-linux-gnu-gcc and qemu-aarch64 "
                    "(apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross "
                    "qemu-user-static)")
    d = tmp_path_factory.mktemp("aarch64")
    _compile(cc, d / "driver", ["-static"])
    return _run(cases, [qemu, str(d / "driver")], d / "run")


@pytest.fixture(scope="module")
def portable_outputs(cases, tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no host C compiler (cc) to build the -DORK_NO_X86_SIMD driver")
    d = tmp_path_factory.mktemp("x86_portable")
    _compile(cc, d / "driver", ["-DORK_NO_X86_SIMD"])
    return _run(cases, [str(d / "driver")], d / "run")


def _compare(cases: Cases, got: dict[str, bytes]) -> None:
    missing = sorted(set(cases.want) - set(got))
    assert not missing, f"outputs not written: {missing[:10]}"
    bad = [name for name, want in cases.want.items() if got[name] != want]
    assert not bad, f"{len(bad)} of {len(cases.want)} outputs differ: {bad[:12]}"


def test_aarch64_kernels_match_x86_and_numpy(cases, aarch64_outputs):
    # the aarch64 build: portable codecs (level 0) and the NEON inflate (level 2)
    # the NEON opt / nf4dq search (nf4opt level 3)
    assert aarch64_outputs["_isa"] == b"codecs 0 runtime 2 nf4opt 3"
    _compare(cases, aarch64_outputs)


def test_portable_build_matches_x86_and_numpy(cases, portable_outputs):
    # -DORK_NO_X86_SIMD: no x86 path is compiled in, so both report the portable level
    assert portable_outputs["_isa"] == b"codecs 0 runtime 0 nf4opt 0"
    _compare(cases, portable_outputs)


def test_driver_detects_a_wrong_output(cases, portable_outputs):
    """The comparison can fail: one flipped bit in one output is reported."""
    name = next(n for n in cases.want if n.endswith("_direct_0_q"))
    bad = dict(portable_outputs)
    b = bytearray(bad[name])
    b[len(b) // 2] ^= 1
    bad[name] = bytes(b)
    with pytest.raises(AssertionError, match="differ"):
        _compare(cases, bad)


@pytest.fixture
def isa_level():
    yield
    lib.ork_rt_set_isa(-1)
    lib.ork_rt_force_portable(0)


@pytest.mark.parametrize("n,k,kseg", [(1024, 4096, 8192), (70, 8256, 8192), (33, 4160, 128), (32, 64, 64)])
def test_x86_inflate_levels_agree(n, k, kseg, isa_level):
    """Every SIMD level this CPU has gives the numpy bytes; (1024, 4096) is a 4 MiB image, which the
    AVX-512 path writes with streaming stores."""
    rng = np.random.default_rng(n * k)
    codes, absmax = R.nf4_encode((rng.standard_t(2, size=(n, k)) * 0.02).astype(np.float32))
    absmax[5::97] = np.inf  # non-finite absmax act as 0
    rq, rs, _ = inflate_reference(codes, absmax, (n, k), kseg)
    levels = sorted({lib.ork_rt_set_isa(lv) for lv in (3, 1, 0)})
    lib.ork_rt_set_isa(-1)
    assert 0 in levels
    for lv in levels:
        assert lib.ork_rt_set_isa(lv) == lv
        q, s = inflate(codes, absmax, (n, k), method="direct", k_segment=kseg)
        assert np.array_equal(q, rq) and np.array_equal(s.view(np.uint32), rs.view(np.uint32)), lv


@pytest.mark.parametrize("misalign", [0, 1, 16, 40])
@pytest.mark.parametrize("n,k", [(512, 8192), (257, 16448)])
def test_x86_inflate_streaming_any_alignment(n, k, misalign, isa_level):
    """Images of >= 4 MiB (streaming stores on AVX-512; three K segments, a last row tile of one row)
    into a destination at every kind of offset from a cache line: the same bytes as numpy, and not
    one byte written outside the image."""
    rng = np.random.default_rng(misalign)
    codes, absmax = R.nf4_encode((rng.standard_t(2, size=(n, k)) * 0.02).astype(np.float32))
    rq, rs, _ = inflate_reference(codes, absmax, (n, k))
    raw = np.full(rq.size + 256, 0x5A, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + misalign
    q = raw[start:start + rq.size]
    scale = np.empty(n, np.float32)
    inflate_into(codes, absmax.view(np.uint8), n, k, q, scale)
    assert np.array_equal(q.view(np.int8), rq) and np.array_equal(scale.view(np.uint32), rs.view(np.uint32))
    assert (raw[:start] == 0x5A).all() and (raw[start + rq.size:] == 0x5A).all()
