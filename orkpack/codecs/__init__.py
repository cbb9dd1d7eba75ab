"""The codecs: one class per encoding of docs/FORMAT.md section 3, and a registry.

``get_codec(encoding).encode(x)`` turns one 2-D slice (or a 1-D tensor) into the
parts that go into the file, in the order ``spec.PARTS[encoding]`` lists them;
``decode`` turns parts back into float32 (``raw``: bytes verbatim both ways,
decoded to the element type). Like gguf-py's ``quants.py``, every
codec has a pure numpy reference (:mod:`orkpack.codecs.reference`,
:mod:`orkpack.layout`) that defines its bytes; the fast path is the C kernels of
kernels/codecs.c, which are bit-identical to it (tests/test_codecs.py).

Inputs: float32, float16, or uint16 holding BF16 bits (the source's own dtype;
the kernels widen exactly). Non-finite values are counted in
``Encoded.nonfinite`` (the caller refuses the tensor, naming it, unless the
user allowed it) and are encoded as 0.

Output memory: ``encode(..., alloc=f)`` takes each part's array from
``f(shape, dtype)`` instead of ``np.empty`` (a build passes the pack writer's
pool of reused, page-aligned buffers: no fresh pages per tensor, no copy on
the way to the file).

Threads: the work is cut into fixed chunks (a function of the shape only) that
run on a thread pool (cffi releases the GIL); the bytes and the SQNR are the
same for every ``threads`` value.
"""
from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..layout import K_SEGMENT, check_layout, npu_layout, npu_tiled_size
from ..pack import spec
from . import reference
from .reference import SQNR_CAP

try:
    from .._kernels import ffi, lib
except ImportError as exc:  # pragma: no cover - a broken install
    raise ImportError("orkpack's C kernels are not built: run `pip install -e .` in the source tree") from exc

__all__ = ["Encoded", "Codec", "get_codec", "CODECS", "float_encoding_for", "SQNR_CAP",
           "NF4_CHUNK_BLOCKS", "INT8_CHUNK_ELEMS", "NF4_MODES", "NF4_WEIGHTINGS", "set_isa", "isa"]

DT_CODE = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.uint16): 2}
FLOAT_ENCODING = {np.dtype(np.float32): spec.ENC_F32, np.dtype(np.float16): spec.ENC_F16,
                  np.dtype(np.uint16): spec.ENC_BF16}
NF4_CHUNK_BLOCKS = 16384  # 1 Mi elements per NF4 chunk
INT8_CHUNK_ELEMS = 1 << 20  # about this many elements per int8 chunk (whole rows)
ISA_NAMES = {0: "portable", 1: "avx2", 2: "avx512"}


def isa() -> str:
    """The SIMD level the kernels use (portable, avx2, avx512)."""
    return ISA_NAMES[lib.ork_codecs_isa()]


def set_isa(level: str | None) -> str:
    """Force a SIMD level (None: best available); returns the level in use. For tests and benches."""
    want = -1 if level is None else {v: k for k, v in ISA_NAMES.items()}[level]
    return ISA_NAMES[lib.ork_codecs_set_isa(want)]


def _isa_cap() -> None:
    """ORKPACK_ISA=portable|avx2|avx512 caps the kernels' SIMD level (the bytes never depend on it: for benches and
    for people checking a slower CPU's speed); unset or empty: the best the CPU has."""
    cap = os.environ.get("ORKPACK_ISA", "").strip().lower()
    if not cap:
        isa()
        return
    ranks = {v: k for k, v in ISA_NAMES.items()}
    if cap not in ranks:
        sys.stderr.write(f"warning: ORKPACK_ISA={cap!r} ignored: give one of {', '.join(ISA_NAMES.values())}\n")
        isa()
        return
    best = lib.ork_codecs_set_isa(-1)
    lib.ork_codecs_set_isa(min(best, ranks[cap]))


_isa_cap()  # pick the level once, at import, on one thread


@dataclass
class Encoded:
    """One encoded slice: its parts (bytes as they go to the file), layout record, SQNR."""

    parts: dict[str, np.ndarray]
    layout: dict = field(default_factory=lambda: {"kind": spec.LAYOUT_ROW_MAJOR})
    sqnr_db: float | None = None  # None for float encodings; SQNR_CAP (999.0) when exact
    nonfinite: int = 0
    dtype: str | None = None  # raw only: the element type (spec.RAW_DTYPES), the slice record's "dtype"


_POOLS: dict[int, ThreadPoolExecutor] = {}


def _run(fn, chunks: list, threads: int) -> list:
    """fn(*chunk) for every chunk, results in chunk order."""
    if threads <= 1 or len(chunks) <= 1:
        return [fn(*c) for c in chunks]
    threads = min(threads, len(chunks))
    pool = _POOLS.get(threads)
    if pool is None:
        pool = _POOLS[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="orkpack-codec")
    return list(pool.map(lambda c: fn(*c), chunks))


def _source(x: np.ndarray) -> tuple[np.ndarray, int]:
    x = np.asarray(x)
    code = DT_CODE.get(x.dtype)
    if code is None:
        raise TypeError(f"codec input must be float32, float16 or uint16 (bf16 bits), not {x.dtype}")
    return np.ascontiguousarray(x), code


def _ptr(a: np.ndarray, ctype: str):
    return ffi.cast(ctype, ffi.from_buffer(a, require_writable=False)) if a.size else ffi.NULL


def _sqnr(stats: list) -> tuple[float, int]:
    sx = se = 0.0
    nf = 0
    for st in stats:  # fixed chunk order: thread-independent
        sx += st.sum_x2
        se += st.sum_err2
        nf += st.nonfinite
    return reference.sqnr_from_sums(sx, se), nf


def _empty(shape, dtype) -> np.ndarray:
    return np.empty(shape, dtype=dtype)


def _copy_into(alloc, flat: np.ndarray) -> np.ndarray:
    out = alloc(flat.shape, flat.dtype)
    np.copyto(out, flat)
    return out


def _rows(x: np.ndarray) -> np.ndarray:
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim != 2:
        raise ValueError(f"the int8 codec takes one 1-D or 2-D slice, not shape {x.shape}")
    return x


class Codec:
    """Base: ``encoding`` names it; ``parts`` lists spec.PARTS[encoding]."""

    encoding: str = ""

    @property
    def parts(self) -> tuple[str, ...]:
        return spec.PARTS[self.encoding]

    def encode(self, x: np.ndarray, *, npu: bool = False, threads: int = 1, alloc=_empty) -> Encoded:
        """``alloc(shape, dtype)`` gives the arrays the parts are written into (default ``np.empty``)."""
        raise NotImplementedError

    def decode(self, enc_parts: dict, shape, layout: dict | None = None) -> np.ndarray:
        raise NotImplementedError


class FloatCodec(Codec):
    """f32 / f16 / bf16: the source bytes unchanged, row-major."""

    def __init__(self, encoding: str, dtype):
        self.encoding = encoding
        self.dtype = np.dtype(dtype)

    def encode(self, x, *, npu=False, threads=1, alloc=None):
        """The part is ``x`` itself (no copy), or its copy in ``alloc(...)`` when ``alloc`` is given."""
        if npu:
            raise ValueError(f"{self.encoding} cannot be laid out for the NPU (only int8 can)")
        x, code = _source(x)
        if x.dtype != self.dtype:
            raise TypeError(f"{self.encoding} keeps the source bytes: give {self.dtype}, not {x.dtype}")
        flat = x.reshape(-1)
        if alloc is not None:
            flat = _copy_into(alloc, flat)
        chunks = [(i, min(flat.size, i + INT8_CHUNK_ELEMS)) for i in range(0, flat.size, INT8_CHUNK_ELEMS)]
        counts = _run(lambda a, b: lib.ork_count_nonfinite(_ptr(flat[a:b], "void *"), code, b - a), chunks, threads)
        return Encoded({"data": flat}, {"kind": spec.LAYOUT_ROW_MAJOR}, None, int(sum(counts)))

    def decode(self, enc_parts, shape, layout=None):
        data = np.asarray(enc_parts["data"]).view(self.dtype).reshape(tuple(shape))
        return np.ascontiguousarray(reference.widen(data), dtype=np.float32)


NF4_MODES = ("bnb", "opt")  # bitsandbytes' quantize_4bit bytes; error-minimizing absmax (reference.nf4opt_encode)
NF4_WEIGHTINGS = reference.NF4OPT_WEIGHTINGS
_NF4W_CODE = {w: i for i, w in enumerate(NF4_WEIGHTINGS)}  # ORK_NF4W_* of kernels/nf4opt.h


def _nf4_weights(col_weights, weighting: str, k: int) -> np.ndarray | None:
    """The opt search's checked inputs: ``weighting`` known, ``col_weights`` None or k finite values >= 0 (float32)."""
    if weighting not in _NF4W_CODE:
        raise ValueError(f"unknown nf4 weighting {weighting!r}; known: {', '.join(NF4_WEIGHTINGS)}")
    if col_weights is None:
        return None
    cw = np.ascontiguousarray(col_weights, dtype=np.float32).reshape(-1)
    if cw.size != k or not np.all(np.isfinite(cw)) or np.any(cw < 0):
        raise ValueError(f"nf4 column weights: {cw.size} finite values >= 0 needed, one per column of {k}")
    return cw


def _block_chunks(nblocks: int) -> list[tuple[int, int]]:
    """Block ranges [b0, b1) of NF4_CHUNK_BLOCKS each: the units the NF4 kernels run on the thread pool."""
    return [(b, min(nblocks, b + NF4_CHUNK_BLOCKS)) for b in range(0, nblocks, NF4_CHUNK_BLOCKS)]


class NF4Codec(Codec):
    """bitsandbytes NF4, blocks of 64 over the row-major flatten (parts: codes, absmax).

    ``mode="bnb"``: the bytes of bitsandbytes' ``quantize_4bit``. ``mode="opt"``: the same format, each
    block's absmax chosen to minimize the squared error (``reference.nf4opt_encode``), weighted per input
    column by ``col_weights`` (float [K], e.g. imatrix mean squares; None: 1) times ``weighting`` of the
    value (plain, x2, sigma). Both decode with bitsandbytes' ``dequantize_4bit``."""

    encoding = spec.ENC_NF4

    def encode(self, x, *, npu=False, threads=1, alloc=_empty, mode: str = "bnb", col_weights=None,
               weighting: str = "plain"):
        if npu:
            raise ValueError("nf4 slices are inflated to int8 tiles at load; encode int8 with npu=True for the image")
        if mode not in NF4_MODES:
            raise ValueError(f"unknown nf4 mode {mode!r}; known: {', '.join(NF4_MODES)}")
        x, code = _source(x)
        k = int(x.shape[-1]) if x.ndim else 1
        cw = _nf4_weights(col_weights if mode == "opt" else None, weighting, k)  # bnb's bytes take no weights
        flat = x.reshape(-1)
        n = flat.size
        nblocks = -(-n // spec.NF4_BLOCK)
        codes = alloc(((n + 1) // 2,), np.uint8)
        absmax = alloc((nblocks,), np.float32)
        src = _ptr(flat, "void *")
        cp, ap = _ptr(codes, "uint8_t *"), _ptr(absmax, "float *")
        if mode == "opt":
            cwp, wcode = (_ptr(cw, "float *") if cw is not None else ffi.NULL), _NF4W_CODE[weighting]

            def one(b0, b1):
                st = ffi.new("ork_codec_stats *")
                lib.ork_nf4opt_encode(src, code, n, k, cwp, wcode, spec.NF4_BLOCK, reference.NF4OPT_TRIES, b0, b1, cp,
                                      ap, st)
                return st
        else:
            def one(b0, b1):
                st = ffi.new("ork_codec_stats *")
                lib.ork_nf4_encode(src, code, n, b0, b1, cp, ap, st)
                return st

        chunks = _block_chunks(nblocks)
        sq, nf = _sqnr(_run(one, chunks, threads))
        return Encoded({"codes": codes, "absmax": absmax}, {"kind": spec.LAYOUT_ROW_MAJOR}, sq, nf)

    def decode(self, enc_parts, shape, layout=None, threads: int = 1):
        shape = tuple(int(d) for d in shape)
        n = math.prod(shape)
        nblocks = -(-n // spec.NF4_BLOCK)
        codes = np.ascontiguousarray(enc_parts["codes"], dtype=np.uint8).reshape(-1)
        absmax = np.ascontiguousarray(enc_parts["absmax"], dtype=np.float32).reshape(-1)
        if codes.size != (n + 1) // 2 or absmax.size != nblocks:
            raise ValueError(f"nf4 parts do not fit shape {shape}: {codes.size} code bytes, {absmax.size} absmax")
        out = np.empty(n, dtype=np.float32)
        cp, ap, op = _ptr(codes, "uint8_t *"), _ptr(absmax, "float *"), _ptr(out, "float *")
        chunks = _block_chunks(nblocks)
        _run(lambda b0, b1: lib.ork_nf4_decode(cp, ap, n, b0, b1, op), chunks, threads)
        return out.reshape(shape)


def _dq_parts(enc_parts) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A double-quantized encoding's parts (codes, absmax_q, absmax_scale, absmax_offset), flat and contiguous."""
    return (np.ascontiguousarray(enc_parts["codes"], dtype=np.uint8).reshape(-1),
            np.ascontiguousarray(enc_parts["absmax_q"], dtype=np.uint8).reshape(-1),
            np.ascontiguousarray(enc_parts["absmax_scale"], dtype=np.float32).reshape(-1),
            np.ascontiguousarray(enc_parts["absmax_offset"], dtype=np.float32).reshape(-1))


def _dq_decode(encoding, enc_parts, shape, threads, codes_len, decode_fn) -> np.ndarray:
    """A double-quantized encoding's float32 values in ``shape``, by its runtime decoder (kernels/runtime.c)
    ``decode_fn(codes, ncodes, q, nq, scale, nscale, offset, e0, e1, out)`` on chunks of blocks; parts that do not
    fit the shape (``codes_len(n)`` the codes part's bytes): ValueError."""
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    nb = -(-n // spec.NF4DQ_BLOCK)
    codes, q, sc, off = _dq_parts(enc_parts)
    if codes.size != codes_len(n) or q.size != nb or sc.size != -(-nb // spec.NF4DQ_GROUP) or off.size != 1:
        raise ValueError(f"{encoding} parts do not fit shape {shape}")
    out = np.empty(n, dtype=np.float32)
    cp, qp, sp = _ptr(codes, "uint8_t *"), _ptr(q, "uint8_t *"), _ptr(sc, "float *")
    offv = float(off[0])
    B = spec.NF4DQ_BLOCK

    def one(b0, b1):  # elements [32 b0, 32 b1)
        e0, e1 = b0 * B, min(n, b1 * B)
        rc = decode_fn(cp, codes.size, qp, q.size, sp, sc.size, offv, e0, e1,
                       ffi.cast("float *", ffi.from_buffer(out[e0:e1])))
        if rc != 0:
            raise ValueError(f"{encoding} parts do not fit shape {shape}")

    _run(one, _block_chunks(nb), threads)
    return out.reshape(shape)


def _dq_encode(encoding, x, threads, alloc, col_weights, weighting, codes_len, step1, step3, scratch=False):
    """The three steps of an encoding whose block scale is double-quantized as nf4dq's (nf4dq, int5dq, int6dq,
    int8dq; parts codes, absmax_q, absmax_scale, absmax_offset): ``step1(src, code, n, k, cwp, wcode, b0, b1, d)``
    each block's float scale (chunks on the thread pool), then the offset and group scales (ork_nf4dq_scales, one
    pass), then ``step3(src, code, n, k, cwp, wcode, d, scale, offset, b0, b1, codes, absmax_q, stats)`` each
    block's 8-bit scale code and its codes (chunks again). ``codes_len(n)``: the codes part's bytes. ``scratch``:
    step 1's scales from ``alloc`` (a build's pool) rather than fresh memory."""
    x, code = _source(x)
    k = int(x.shape[-1]) if x.ndim else 1
    cw = _nf4_weights(col_weights, weighting, k)
    flat = x.reshape(-1)
    n = flat.size
    nb = -(-n // spec.NF4DQ_BLOCK)
    ng = -(-nb // spec.NF4DQ_GROUP)
    codes = alloc((codes_len(n),), np.uint8)
    q = alloc((nb,), np.uint8)
    scale = alloc((ng,), np.float32)
    offset = alloc((1,), np.float32)
    parts = dict(zip(spec.PARTS[encoding], (codes, q, scale, offset)))
    if n == 0:
        offset[0] = 0.0
        return Encoded(parts, {"kind": spec.LAYOUT_ROW_MAJOR}, SQNR_CAP, 0)
    d = alloc((nb,), np.float32) if scratch else np.empty(nb, dtype=np.float32)
    src, dp = _ptr(flat, "void *"), _ptr(d, "float *")
    cwp, wcode = (_ptr(cw, "float *") if cw is not None else ffi.NULL), _NF4W_CODE[weighting]
    chunks = _block_chunks(nb)
    _run(lambda b0, b1: step1(src, code, n, k, cwp, wcode, b0, b1, dp), chunks, threads)
    op = ffi.new("float *")
    sp = _ptr(scale, "float *")
    lib.ork_nf4dq_scales(dp, nb, sp, op)
    offset[0] = op[0]
    cp, qp = _ptr(codes, "uint8_t *"), _ptr(q, "uint8_t *")

    def one(b0, b1):
        st = ffi.new("ork_codec_stats *")
        step3(src, code, n, k, cwp, wcode, dp, sp, op[0], b0, b1, cp, qp, st)
        return st

    sq, nf = _sqnr(_run(one, chunks, threads))
    return Encoded(parts, {"kind": spec.LAYOUT_ROW_MAJOR}, sq, nf)


class NF4DQCodec(Codec):
    """bitsandbytes NF4 at blocksize 32 with double-quantized absmax (docs/FORMAT.md 3, nf4dq; parts: codes,
    absmax_q, absmax_scale, absmax_offset). The encoder is the error-minimizing one (``reference.nf4dq_encode``),
    weighted like NF4Codec's ``opt`` mode; bitsandbytes' ``dequantize_4bit`` of a nested QuantState decodes it.

    The C kernels (kernels/nf4opt.c) give the reference's bytes in three steps: each block's error-minimizing
    absmax (chunks on the thread pool), the offset and group scales (one pass over the absmaxes), then each
    block's 8-bit absmax code and NF4 codes (chunks again)."""

    encoding = spec.ENC_NF4DQ

    def encode(self, x, *, npu=False, threads=1, alloc=_empty, col_weights=None, weighting: str = "plain"):
        if npu:
            raise ValueError("nf4dq slices live on the host; encode int8 with npu=True for the NPU")
        tries = reference.NF4DQ_TRIES
        return _dq_encode(
            self.encoding, x, threads, alloc, col_weights, weighting, lambda n: (n + 1) // 2,
            lambda src, code, n, k, cwp, wcode, b0, b1, dp: lib.ork_nf4opt_encode(
                src, code, n, k, cwp, wcode, spec.NF4DQ_BLOCK, tries, b0, b1, ffi.NULL, dp, ffi.NULL),
            lib.ork_nf4dq_encode, scratch=True)

    def decode(self, enc_parts, shape, layout=None, threads: int = 1):
        return _dq_decode(self.encoding, enc_parts, shape, threads, lambda n: (n + 1) // 2, lib.ork_rt_nf4dq_decode)


class IntDQCodec(Codec):
    """int5dq / int6dq / int8dq (docs/FORMAT.md 3, intdq; parts: codes, absmax_q, absmax_scale, absmax_offset):
    b-bit integer codes in blocks of 32, each block's step double-quantized as nf4dq's absmax. One class, the
    bit width its parameter. The encoder is the error-minimizing one of ``reference.intdq_encode`` (weighted
    like nf4dq's: ``col_weights`` per input column times ``weighting`` of the value).

    The C kernels (kernels/intdq.c) give the reference's bytes in three steps: each block's least-squares step
    (chunks on the thread pool), the offset and group scales (nf4dq's ork_nf4dq_scales, one pass), then each
    block's 8-bit step code and integer codes (chunks again). Decode: kernels/runtime.c ork_rt_intdq_decode."""

    def __init__(self, encoding: str):
        self.encoding = encoding
        self.bits = spec.INTDQ_BITS[encoding]

    def encode(self, x, *, npu=False, threads=1, alloc=_empty, col_weights=None, weighting: str = "plain"):
        if npu:
            raise ValueError(f"{self.encoding} slices live on the host; encode int8 with npu=True for the NPU")
        bits = self.bits
        return _dq_encode(
            self.encoding, x, threads, alloc, col_weights, weighting, lambda n: reference.intdq_codes_size(n, bits),
            lambda src, code, n, k, cwp, wcode, b0, b1, dp: lib.ork_intdq_steps(src, code, n, k, cwp, wcode, bits,
                                                                                b0, b1, dp),
            lambda src, code, n, k, cwp, wcode, *rest: lib.ork_intdq_encode(src, code, n, k, cwp, wcode, bits, *rest))

    def decode_range(self, enc_parts, e0: int, e1: int) -> np.ndarray:
        """Elements [e0, e1) of the flat slice (float32), the runtime's C decode; parts too small: ValueError."""
        codes, q, sc, off = _dq_parts(enc_parts)
        out = np.empty(max(0, int(e1) - int(e0)), dtype=np.float32)
        rc = -1 if off.size != 1 else lib.ork_rt_intdq_decode(
            self.bits, _ptr(codes, "uint8_t *"), codes.size, _ptr(q, "uint8_t *"), q.size, _ptr(sc, "float *"),
            sc.size, float(off[0]), int(e0), int(e1), ffi.cast("float *", ffi.from_buffer(out)) if out.size else ffi.NULL)
        if rc != 0:
            raise ValueError(f"{self.encoding} parts are too small for elements [{e0}, {e1})")
        return out

    def decode(self, enc_parts, shape, layout=None, threads: int = 1):
        bits = self.bits
        return _dq_decode(self.encoding, enc_parts, shape, threads, lambda n: reference.intdq_codes_size(n, bits),
                          lambda *args: lib.ork_rt_intdq_decode(bits, *args))


class Int8Codec(Codec):
    """int8 per output channel, symmetric, half-to-even (parts: q, scale); npu=True tiles q."""

    encoding = spec.ENC_INT8

    @staticmethod
    def _row_chunks(rows: int, k: int) -> list[tuple[int, int]]:
        step = max(1, INT8_CHUNK_ELEMS // max(1, k))
        return [(r, min(rows, r + step)) for r in range(0, rows, step)]

    def encode(self, x, *, npu=False, threads=1, k_segment: int = K_SEGMENT, alloc=_empty):
        x, code = _source(x)
        x = _rows(x)
        n_rows, k = x.shape
        if npu:
            layout = npu_layout(n_rows, k, k_segment)
            q = alloc((npu_tiled_size(n_rows, k, k_segment),), np.int8)
            rows_total, kseg = layout["n_pad"], layout["k_segment"]
        else:
            layout = {"kind": spec.LAYOUT_ROW_MAJOR}
            q = alloc((n_rows, k), np.int8)
            rows_total, kseg = n_rows, 0
        scale = alloc((n_rows,), np.float32)
        src = _ptr(x, "void *")
        qp, sp = _ptr(q, "int8_t *"), _ptr(scale, "float *")

        def one(r0, r1):
            st = ffi.new("ork_codec_stats *")
            lib.ork_int8_encode(src, code, n_rows, k, r0, r1, kseg, qp, sp, st)
            return st

        sq, nf = _sqnr(_run(one, self._row_chunks(rows_total, k), threads))
        return Encoded({"q": q, "scale": scale}, layout, sq, nf)

    def decode(self, enc_parts, shape, layout=None, threads: int = 1):
        shape = tuple(int(d) for d in shape)
        n_rows, k = (1, shape[0]) if len(shape) == 1 else shape
        q = np.ascontiguousarray(enc_parts["q"], dtype=np.int8).reshape(-1)
        scale = np.ascontiguousarray(enc_parts["scale"], dtype=np.float32).reshape(-1)
        kind = (layout or {}).get("kind", spec.LAYOUT_ROW_MAJOR)
        if kind == spec.LAYOUT_NPU_INT8:
            check_layout(layout, n_rows, k)
            kseg, want = layout["k_segment"], npu_tiled_size(n_rows, k, layout["k_segment"])
        elif kind == spec.LAYOUT_ROW_MAJOR:
            kseg, want = 0, n_rows * k
        else:
            raise ValueError(f"int8 cannot be decoded from layout {kind!r}")
        if q.size != want or scale.size != n_rows:
            raise ValueError(f"int8 parts do not fit shape {shape}: {q.size} q bytes, {scale.size} scales")
        out = np.empty((n_rows, k), dtype=np.float32)
        qp, sp, op = _ptr(q, "int8_t *"), _ptr(scale, "float *"), _ptr(out, "float *")
        _run(lambda r0, r1: lib.ork_int8_decode(qp, sp, n_rows, k, r0, r1, kseg, op),
             self._row_chunks(n_rows, k), threads)
        return out.reshape(shape)


# numpy dtype -> raw element type; uint16 is ambiguous (BF16 bits in the float path), so U16 sources
# name their type explicitly (RawCodec.encode(x, dtype="u16")), as the build does
_RAW_BY_NP = {np.dtype(v): k for k, v in spec.RAW_DTYPES.items()}


class RawCodec(Codec):
    """Non-float tensors (bool, integers, f64, c64): the source bytes verbatim, row-major, host only.

    Nothing is quantized or converted; ``Encoded.dtype`` names the element type
    (the slice record's ``dtype`` key) and ``decode`` gives back an array of it.
    """

    encoding = spec.ENC_RAW

    def encode(self, x, *, npu=False, threads=1, dtype: str | None = None, alloc=_empty):
        if npu:
            raise ValueError("raw slices live on the host; the NPU takes int8 tiles only")
        x = np.asarray(x)
        if dtype is None:
            dtype = _RAW_BY_NP.get(x.dtype.newbyteorder("<") if x.dtype.byteorder == ">" else x.dtype)
            if dtype is None:
                raise TypeError(f"no raw element type for {x.dtype}; known: {', '.join(spec.RAW_DTYPES)}")
        if dtype not in spec.RAW_DTYPES:
            raise ValueError(f"unknown raw element type {dtype!r}; known: {', '.join(spec.RAW_DTYPES)}")
        want = np.dtype(spec.RAW_DTYPES[dtype])
        if x.dtype.itemsize != want.itemsize or x.dtype.kind not in "biufc":
            raise TypeError(f"raw {dtype} keeps the source bytes: give {want.itemsize}-byte elements, not {x.dtype}")
        if x.dtype.byteorder == ">":  # the format is little-endian
            x = x.astype(x.dtype.newbyteorder("<"))
        # a copy: callers' arrays live in reused read buffers or mapped source pages
        data = _copy_into(alloc, np.ascontiguousarray(x).reshape(-1).view(np.uint8))
        return Encoded({"data": data}, {"kind": spec.LAYOUT_ROW_MAJOR}, None, 0, dtype)

    def decode(self, enc_parts, shape, layout=None, *, dtype: str = "u8"):
        """The tensor as its own element type (not float32: raw values are not weights)."""
        dt = np.dtype(spec.RAW_DTYPES[dtype])
        data = np.ascontiguousarray(enc_parts["data"]).reshape(-1).view(np.uint8)
        shape = tuple(int(d) for d in shape)
        if data.size != math.prod(shape) * dt.itemsize:
            raise ValueError(f"raw {dtype} part of {data.size} bytes does not fit shape {shape}")
        return data.view(dt).reshape(shape).copy()


CODECS: dict[str, Codec] = {
    spec.ENC_F32: FloatCodec(spec.ENC_F32, np.float32),
    spec.ENC_F16: FloatCodec(spec.ENC_F16, np.float16),
    spec.ENC_BF16: FloatCodec(spec.ENC_BF16, np.uint16),
    spec.ENC_INT8: Int8Codec(),
    spec.ENC_NF4: NF4Codec(),
    spec.ENC_NF4DQ: NF4DQCodec(),
    spec.ENC_RAW: RawCodec(),
    **{e: IntDQCodec(e) for e in spec.INTDQ_ENCODINGS},
}


def get_codec(encoding: str) -> Codec:
    """The codec for an encoding name of spec.ENCODINGS."""
    try:
        return CODECS[encoding]
    except KeyError:
        raise ValueError(f"unknown encoding {encoding!r}; known: {', '.join(spec.ENCODINGS)}") from None


def float_encoding_for(dtype) -> str:
    """f32, f16 or bf16 for a source array dtype (uint16 means BF16 bits)."""
    try:
        return FLOAT_ENCODING[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no float encoding keeps dtype {np.dtype(dtype)}") from None


def tile_int8(q2d: np.ndarray, k_segment: int = K_SEGMENT, threads: int = 1) -> tuple[np.ndarray, dict]:
    """C tiling of a row-major int8 [N, K] into the npu_int8 image: (bytes, layout record)."""
    q2d = np.ascontiguousarray(_rows(np.asarray(q2d, dtype=np.int8)))
    n_rows, k = q2d.shape
    layout = npu_layout(n_rows, k, k_segment)
    dst = np.empty(npu_tiled_size(n_rows, k, k_segment), dtype=np.int8)
    qp, dp = _ptr(q2d, "int8_t *"), _ptr(dst, "int8_t *")
    _run(lambda r0, r1: lib.ork_int8_tile(qp, n_rows, k, r0, r1, layout["k_segment"], dp),
         Int8Codec._row_chunks(layout["n_pad"], k), threads)
    return dst, layout
