"""The two load paths (docs/RUNTIME.md): cacheable fill and NF4 -> int8 tiled inflate.

Bit-exactness contract (docs/FORMAT.md section 5): the image an NPU slice stored
as nf4 inflates to is, by definition,

    q, scale = int8_encode(nf4_decode(codes, absmax, (N, K)));  q_tiled = tile_int8(q)

with the numpy references of orkpack/codecs/reference.py and orkpack/layout.py
(:func:`inflate_reference`). The C direct inflate and the C two-step inflate
(kernels/runtime.c) write exactly those bytes; tests/test_runtime_inflate.py
compares all three with ``np.array_equal`` on random and adversarial shapes.

Threads: work is cut into FIXED chunks (row-tile ranges for the inflate, byte
ranges for the fill) whose outputs are disjoint, so the bytes never depend on
the number of threads. cffi calls release the GIL.
"""
from __future__ import annotations

from concurrent.futures import Executor

import numpy as np

from orkpack._kernels import ffi, lib
from orkpack.codecs.reference import nf4_to_npu_int8
from orkpack.layout import K_SEGMENT

FILL_CHUNK = 4 << 20  # bytes per fill work item
INFLATE_CHUNK = 1 << 20  # approximate output bytes per inflate work item (whole 32-row tiles)
METHODS = ("direct", "two-step")


# the definition lives with the codecs (the packer records its checksums); the runtime checks against it
inflate_reference = nf4_to_npu_int8


def tiled_size(n: int, k: int, k_segment: int = K_SEGMENT) -> int:
    size = lib.ork_rt_tiled_size(int(n), int(k), int(k_segment))
    if size == 0:
        raise ValueError(f"no npu_int8 tiling for a [{n}, {k}] slice with k_segment {k_segment}: the runtime takes "
                         "a k_segment that is a multiple of 32 from 32 to 2**40 (one of at least K is one segment) "
                         "and N, K from 1 to 2**40 (kernels/runtime.c geom_init)")
    return int(size)


def _ptr(ctype: str, arr: np.ndarray):
    return ffi.cast(ctype, ffi.from_buffer(arr))


def _run(pool: Executor | None, fn, items) -> list:
    if pool is None:
        return [fn(it) for it in items]
    return list(pool.map(fn, items))


def inflate_into(
    codes: np.ndarray,
    absmax_bytes: np.ndarray,
    n: int,
    k: int,
    q_out: np.ndarray,
    scale_out: np.ndarray,
    *,
    method: str = "direct",
    k_segment: int = K_SEGMENT,
    pool: Executor | None = None,
) -> int:
    """Inflate an nf4 ``[n, k]`` slice into ``q_out`` (uint8/int8 buffer of at least the tiled size)
    and ``scale_out`` (float32[n]) with the C ``method`` ("direct" or "two-step"). Returns bytes written.

    ``codes`` and ``absmax_bytes`` are the stored parts as uint8 arrays (read-only views are fine).
    """
    if method not in METHODS:
        raise ValueError(f"inflate method must be one of {METHODS}, not {method!r}")
    n, k = int(n), int(k)
    size = tiled_size(n, k, k_segment)
    if q_out.nbytes < size or scale_out.dtype != np.float32 or scale_out.size < n or not scale_out.flags.c_contiguous:
        raise ValueError("inflate output buffers are too small or of the wrong type")
    fn = lib.ork_rt_inflate_direct if method == "direct" else lib.ork_rt_inflate_two_step
    cp = _ptr("const uint8_t *", codes)
    ap = _ptr("const float *", absmax_bytes)
    qp = _ptr("int8_t *", q_out)
    sp = _ptr("float *", scale_out)
    n_abs = absmax_bytes.nbytes // 4
    tiles = -(-n // 32)
    row_bytes = 32 * (size // (tiles * 32))  # one row tile, all segments
    step = max(1, INFLATE_CHUNK // row_bytes)
    ranges = [(t, min(tiles, t + step)) for t in range(0, tiles, step)]

    def work(r):
        return fn(cp, codes.nbytes, ap, n_abs, n, k, k_segment, r[0], r[1], qp, q_out.nbytes, sp)

    for rc in _run(pool, work, ranges):
        if rc != 0:
            raise ValueError(f"inflate of a [{n}, {k}] slice failed (code {rc}): parts do not match the shape")
    return size


def inflate(codes, absmax, shape, *, method: str = "direct", k_segment: int = K_SEGMENT, pool=None):
    """Convenience: (q_tiled int8 1-D, scale float32[N]) through the C ``method``."""
    n, k = (int(d) for d in shape)
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    ab = np.ascontiguousarray(absmax, dtype=np.float32).view(np.uint8)
    q = np.empty(tiled_size(n, k, k_segment), dtype=np.int8)
    scale = np.empty(n, dtype=np.float32)
    inflate_into(codes, ab, n, k, q, scale, method=method, k_segment=k_segment, pool=pool)
    return q, scale


def fill(dst: np.ndarray, src: np.ndarray, *, clean: bool = True, pool: Executor | None = None) -> int:
    """Cacheable fill: copy ``src`` into ``dst`` (same byte count) with ordinary cached writes in
    fixed chunks, each cleaned from the data cache afterwards when ``clean`` (C: DC CVAC + DSB on
    aarch64; a no-op on x86). A backend whose clean is a driver call (rknpu MEM_SYNC) passes
    clean=False and syncs the written range itself. Returns bytes written."""
    n = src.nbytes
    if dst.nbytes < n:
        raise ValueError("fill destination is smaller than the source")
    dp = _ptr("uint8_t *", dst)
    sp = _ptr("const uint8_t *", src)
    c = 1 if clean else 0

    def work(off):
        lib.ork_rt_fill(dp + off, sp + off, min(FILL_CHUNK, n - off), c)

    _run(pool, work, range(0, n, FILL_CHUNK))
    return n


def nf4dq_decode_c(codes, absmax_q, scale, offset, n: int) -> np.ndarray:
    """C nf4dq decode of the first n elements (float32), as reference.nf4dq_decode."""
    out = np.empty(int(n), dtype=np.float32)
    codes, absmax_q = np.ascontiguousarray(codes, dtype=np.uint8), np.ascontiguousarray(absmax_q, dtype=np.uint8)
    scale = np.ascontiguousarray(scale, dtype=np.float32)
    off = np.asarray(offset, dtype=np.float32).reshape(-1)
    rc = lib.ork_rt_nf4dq_decode(
        _ptr("const uint8_t *", codes), codes.nbytes, _ptr("const uint8_t *", absmax_q), absmax_q.size,
        _ptr("const float *", scale), scale.size, float(off[0]) if off.size else 0.0, 0, int(n), _ptr("float *", out),
    )
    if rc != 0 or off.size != 1:
        raise ValueError("nf4dq parts are too small for the slice shape")
    return out


def nf4_decode_c(codes, absmax_bytes, n: int) -> np.ndarray:
    """C NF4 decode of the first n elements (float32): CODEBOOK[code] * absmax, as nf4_decode."""
    out = np.empty(int(n), dtype=np.float32)
    codes = np.asarray(codes)
    rc = lib.ork_rt_nf4_decode(
        _ptr("const uint8_t *", codes), codes.nbytes, _ptr("const float *", absmax_bytes),
        absmax_bytes.nbytes // 4, 0, int(n), _ptr("float *", out),
    )
    if rc != 0:
        raise ValueError("nf4 parts are too small for the slice shape")
    return out
