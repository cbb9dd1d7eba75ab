"""The board's numerics, one function per rule (docs/EVAL.md says where each comes from).

* :func:`int8_act`: the NPU path's activations: symmetric int8 per token (one scale per row of A,
  as the public llama.cpp RK3588 NPU backend quantizes them) or per tensor, with the int8 weight
  codec's own rule (docs/FORMAT.md 3): ``scale = amax / 127``, ``q = clamp(rint(x * (127 / amax)),
  -127, 127)``, round half to even.
* :func:`int8_matmul`: int8 x int8 products accumulated exactly (as the NPU's int32 accumulators),
  then rescaled by both scales in float32: ``float32(acc) * sx[m] * sw[n]``.
* :func:`q8_0`, :func:`q8_k`, :func:`f16_act`, :func:`bf16_act`: llama.cpp's CPU kernels quantize
  (or convert) the activations to the weight type's ``vec_dot_type`` before every dot product; these
  give the values they stand for (``q * d``), so that a float matmul of them with the dequantized
  weights is the CPU's product up to float32 summation order.

Every function takes and returns float32 (T, K) activations; none keeps state.
"""
from __future__ import annotations

import numpy as np

FLT_MAX = np.float32(np.finfo(np.float32).max)
_ACC_BLOCK = 1 << 21  # weight elements per exact-integer product block


def _inv127(amax: np.ndarray) -> np.ndarray:
    """``127 / amax`` in float32; 0 where amax is 0, FLT_MAX where the division overflows (FORMAT.md 3)."""
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.float32(127) / amax
    inv = np.where(amax == 0, np.float32(0), inv)
    return np.where(np.isinf(inv), FLT_MAX, inv).astype(np.float32)


def int8_act(x: np.ndarray, per: str = "token") -> tuple[np.ndarray, np.ndarray]:
    """(q int8 (T, K), scale float32 (T,)) of activations x, per token (row) or per tensor."""
    x = np.asarray(x, dtype=np.float32)
    if per == "token":
        amax = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    elif per == "tensor":
        amax = np.full(x.shape[0], np.abs(x).max() if x.size else 0, dtype=np.float32)
    else:
        raise ValueError(f"activation scheme {per!r}: per token or per tensor")
    amax = amax.astype(np.float32)
    scale = (amax / np.float32(127)).astype(np.float32)
    q = np.clip(np.rint(x * _inv127(amax)[:, None]), -127, 127).astype(np.int8)
    return q, scale


def int8_matmul(qx: np.ndarray, sx: np.ndarray, qw: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """``(qx @ qw.T)`` accumulated exactly, rescaled: float32 (T, N) = float32(acc) * sx[:, None] * sw[None, :].

    The integer sums are exact whatever the order, so the result is the NPU's int32 accumulator: here the C
    kernel's int32 sums (kernels/i8gemm.c: AVX-512 VNNI, AVX2 or portable C; K up to 131,071), else
    :func:`int8_matmul_f64`, its numpy reference (tests/test_eval_numerics.py holds the two bit-equal).
    """
    T, K = qx.shape
    N = qw.shape[0]
    from .._kernels import ffi, lib

    if K > _I8_MAX_K:
        return int8_matmul_f64(qx, sx, qw, sw)
    qx, qw = np.ascontiguousarray(qx, dtype=np.int8), np.ascontiguousarray(qw, dtype=np.int8)
    sx, sw = np.ascontiguousarray(sx, dtype=np.float32), np.ascontiguousarray(sw, dtype=np.float32)
    out = np.empty((T, N), dtype=np.float32)
    if lib.ork_i8_matmul(ffi.from_buffer("int8_t[]", qx), ffi.from_buffer("float[]", sx), T,
                         ffi.from_buffer("int8_t[]", qw), ffi.from_buffer("float[]", sw), N, K,
                         ffi.from_buffer("float[]", out, require_writable=True)) != 0:
        raise MemoryError("int8_matmul: out of memory")
    return out


_I8_MAX_K = 131071  # kernels/i8gemm.h ORK_I8GEMM_MAX_K: K x 128 x 128 < 2**31


def int8_matmul_f64(qx: np.ndarray, sx: np.ndarray, qw: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """:func:`int8_matmul`'s numpy reference: the integer products summed in float64, which is exact (every
    partial sum is an integer below K * 127 * 127 < 2**53), then rescaled in float32."""
    T, K = qx.shape
    N = qw.shape[0]
    a = qx.astype(np.float64)
    out = np.empty((T, N), dtype=np.float32)
    step = max(1, _ACC_BLOCK // max(K, 1))
    sx = np.asarray(sx, dtype=np.float32)[:, None]
    for r in range(0, N, step):
        acc = a @ qw[r: r + step].astype(np.float64).T
        out[:, r: r + step] = acc.astype(np.float32) * sx * np.asarray(sw[r: r + step], dtype=np.float32)[None, :]
    return out


def roundf(x: np.ndarray) -> np.ndarray:
    """C's ``roundf``: to nearest, half away from zero (float32 in, float32 out). The sum ``|x| + 0.5`` is taken in
    float64, where it is exact for every float32: in float32 it rounds 0.49999997 (the float just below a half) up to
    1.0, where roundf gives 0."""
    x = np.asarray(x, dtype=np.float32)
    return (np.sign(x) * np.floor(np.abs(x).astype(np.float64) + 0.5)).astype(np.float32)


def _blocks(x: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """x (T, K) as (T, ceil(K/size), size), zero-padded; and K."""
    x = np.asarray(x, dtype=np.float32)
    T, K = x.shape
    pad = -K % size
    if pad:
        x = np.concatenate([x, np.zeros((T, pad), np.float32)], axis=1)
    return x.reshape(T, -1, size), K


def q8_0(x: np.ndarray) -> np.ndarray:
    """llama.cpp's ``quantize_row_q8_0_ref`` (ggml-quants.c) and back: blocks of 32 along K,
    ``d = amax / 127`` (float32), ``id = 1 / d`` (0 when d is 0), ``q = roundf(x * id)``, stored
    ``fp16(d)``; the value is ``q * fp16(d)``. (The CPU's NEON/AVX kernels round q half to even;
    a tie needs x * id to land exactly on .5.) A last partial block is taken as zero-padded."""
    b, K = _blocks(x, 32)
    d = (np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    q = roundf(b * inv).astype(np.int8).astype(np.float32)  # stored int8 (so -0 is 0)
    out = q * d.astype(np.float16).astype(np.float32)
    return out.reshape(b.shape[0], -1)[:, :K]


def q8_k(x: np.ndarray) -> np.ndarray:
    """llama.cpp's ``quantize_row_q8_K_ref`` and back (the K-quants' activations): blocks of 256,
    ``iscale = -127 / max`` where max is the value of largest magnitude (the first such), ``q =
    min(127, nearest_int(iscale * x))`` (half to even), ``d = 1 / iscale`` kept float32; value ``q * d``."""
    b, K = _blocks(x, 256)
    idx = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, idx, axis=-1)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx == 0, np.float32(0), np.float32(-127) / mx).astype(np.float32)
        d = np.where(iscale == 0, np.float32(0), np.float32(1) / iscale).astype(np.float32)
    q = np.minimum(np.rint(iscale * b), 127).astype(np.float32)
    return (q * d).reshape(b.shape[0], -1)[:, :K]


def f16_act(x: np.ndarray) -> np.ndarray:
    """Activations rounded to fp16 (the vec_dot_type of F16 weights)."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def bf16_act(x: np.ndarray) -> np.ndarray:
    """Activations rounded to bf16, nearest even (ggml's ``GGML_FP32_TO_BF16``; the vec_dot_type of BF16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16) << 16
    r = np.where(np.isnan(x), (u & np.uint32(0xFFFF0000)) | np.uint32(0x00400000), r).astype(np.uint32)
    return r.view(np.float32)


# the activation rule llama.cpp's CPU backend applies before a dot product with weights of this GGML
# type (ggml-cpu.c type_traits_cpu[...].vec_dot_type); None: float32 activations
_Q8_0_TYPES = ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "MXFP4", "Q4_1", "Q5_1")
_Q8_K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
               "IQ1_M", "IQ4_XS", "TQ1_0", "TQ2_0")


def llama_cpp_act(ggml_type: str):
    """The activation function for weights of ``ggml_type`` on llama.cpp's CPU backend.

    Q8_1 (the vec_dot_type of Q4_1 / Q5_1) holds the same ``q * fp16(d)`` values as Q8_0 plus a block
    sum ``s = fp16(d * sum q)`` that multiplies the weight block's minimum; it is taken here as
    ``sum(q * fp16(d))`` (docs/EVAL.md)."""
    if ggml_type in _Q8_0_TYPES:
        return q8_0
    if ggml_type in _Q8_K_TYPES:
        return q8_k
    if ggml_type == "F16":
        return f16_act
    if ggml_type == "BF16":
        return bf16_act
    return None
