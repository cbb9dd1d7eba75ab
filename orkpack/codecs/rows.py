"""A matrix slice of a pack as the CPU reads it: float32 rows decoded block by block from its stored parts, and
an NPU slice's int8 image (its tiles de-tiled, or its nf4 inflated as docs/FORMAT.md 5 defines it).

``pack`` is anything with ``typed_part(s, name)``, ``typed_parts(s)`` and ``part(ref)`` (orkpack.pack.reader.Pack).
Used by the eval's weight providers and by verify's check of an untied copy's values."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..layout import untile_int8
from ..pack import spec
from ..pack.reader import host_copy_slice
from ..sources.base import as_float32
from . import get_codec, reference as ref

Rows = Callable[[int, int], np.ndarray]


def int8_rows(q: np.ndarray, scale: np.ndarray) -> Rows:
    return lambda r0, r1: q[r0:r1].astype(np.float32) * scale[r0:r1, None]


def nf4_rows(codes: np.ndarray, absmax: np.ndarray, n: int, k: int) -> Rows:
    """Rows r0..r1 of an nf4 [n, k] slice, decoding only the 64-element blocks that hold them."""
    codec, B, total = get_codec(spec.ENC_NF4), spec.NF4_BLOCK, n * k

    def rows(r0: int, r1: int) -> np.ndarray:
        e0, e1 = r0 * k, r1 * k
        b0, b1 = e0 // B, -(-e1 // B)
        m = min(b1 * B, total) - b0 * B
        v = codec.decode({"codes": codes[b0 * B // 2: b0 * B // 2 + (m + 1) // 2], "absmax": absmax[b0:b1]}, (m,))
        return v[e0 - b0 * B: e1 - b0 * B].reshape(r1 - r0, k)

    return rows


def nf4dq_rows(p: dict, n: int, k: int) -> Rows:
    """Rows r0..r1 of an nf4dq [n, k] slice, decoding only the 32-element blocks that hold them."""
    B, total = spec.NF4DQ_BLOCK, n * k
    codes = p["codes"]
    absmax = ref.nf4dq_absmax(p["absmax_q"], p["absmax_scale"], p["absmax_offset"])  # one float a block, once

    def rows(r0: int, r1: int) -> np.ndarray:
        e0, e1 = r0 * k, r1 * k
        b0, b1 = e0 // B, -(-e1 // B)
        m = min(b1 * B, total) - b0 * B
        v = ref.CODEBOOK[ref.nf4_unpack(codes[b0 * B // 2: b0 * B // 2 + (m + 1) // 2], m)] * \
            np.repeat(absmax[b0:b1], B)[:m]
        return v[e0 - b0 * B: e1 - b0 * B].reshape(r1 - r0, k)

    return rows


def intdq_rows(p: dict, n: int, k: int, bits: int) -> Rows:
    """Rows r0..r1 of an int5dq / int6dq / int8dq [n, k] slice: the runtime's C decode of just their elements."""
    codec = get_codec({b: e for e, b in spec.INTDQ_BITS.items()}[bits])
    parts = {name: np.ascontiguousarray(p[name]) for name in spec.PARTS[codec.encoding]}
    return lambda r0, r1: codec.decode_range(parts, r0 * k, r1 * k).reshape(r1 - r0, k)


def float_rows(data: np.ndarray) -> Rows:
    return lambda r0, r1: as_float32(data[r0:r1])


def int8_image(pack, s: dict) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [N, K] row-major, scale float32[N]) of an NPU slice: its tiles de-tiled, or its nf4 inflated."""
    n, k = s["shape"]
    if s["encoding"] == spec.ENC_INT8:
        q = pack.typed_part(s, "q")
        if s["layout"]["kind"] == spec.LAYOUT_NPU_INT8:
            q = untile_int8(q, n, k, s["layout"])
        return np.asarray(q).reshape(n, k), pack.typed_part(s, "scale")
    # nf4 stored for the NPU: the image it inflates to (FORMAT.md 5) is int8 of its decoded values
    v = get_codec(spec.ENC_NF4).decode(pack.typed_parts(s), (n, k))
    enc = get_codec(spec.ENC_INT8).encode(v)
    return enc.parts["q"].reshape(n, k), enc.parts["scale"]


def cpu_rows(pack, s: dict) -> tuple[Rows | None, bool]:
    """(the rows the CPU reads of the [N, K] slice ``s``, whether they are quantized (the CPU may quantize their
    activations)); (None, False) for an encoding that holds no matrix (raw). A dual-resident slice reads its host copy;
    an NPU slice without one, its int8 image."""
    n, k = s["shape"]
    hc = host_copy_slice(s)
    if hc is not None:
        s = hc  # dual residency: the CPU reads the host copy
    enc = s["encoding"]
    if s["tier"] == spec.TIER_NPU and enc == spec.ENC_NF4:  # no copy: the CPU reads the inflated tiles
        return int8_rows(*int8_image(pack, s)), True
    if enc == spec.ENC_INT8:
        q, scale = int8_image(pack, s) if s["layout"]["kind"] == spec.LAYOUT_NPU_INT8 else \
            (pack.typed_part(s, "q").reshape(n, k), pack.typed_part(s, "scale"))
        return int8_rows(q, scale), True
    if enc == spec.ENC_NF4:
        p = pack.typed_parts(s)
        return nf4_rows(p["codes"], p["absmax"], n, k), True
    if enc == spec.ENC_NF4DQ:
        return nf4dq_rows(pack.typed_parts(s), n, k), True
    if enc in spec.INTDQ_BITS:
        return intdq_rows(pack.typed_parts(s), n, k, spec.INTDQ_BITS[enc]), True
    if enc in spec.FLOAT_ENCODINGS:
        dt = np.dtype(spec.PART_DTYPES[(enc, "data")])
        return float_rows(pack.part(s["parts"]["data"]).view(dt).reshape(n, k)), False
    return None, False
