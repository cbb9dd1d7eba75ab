"""The board's numerics of orkpack eval against independent references.

* llama.cpp's Q8_0 activations: gguf-py's ``quants.quantize(x, Q8_0)`` + ``dequantize`` (its port of
  ``quantize_row_q8_0_ref``, bit-exact with ggml), bit for bit;
* the NPU's per-token int8 activations: the int8 weight codec (C kernel, FORMAT.md 3), bit for bit,
  since both use the same rule;
* int32 accumulation: numpy int64 products;
* de-tiling: orkpack's own tiling (layout.tile_int8, the C codec's npu image) round-trips.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from orkpack.codecs import get_codec
from orkpack.eval import numerics
from orkpack.layout import tile_int8, untile_int8


def _acts(seed: int, t: int = 7, k: int = 256) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((t, k)) * rng.lognormal(0, 2, (t, 1))).astype(np.float32)
    x[0, :32] = 0  # an all-zero block
    x[1, :32] = np.arange(32) - 15.5  # amax 15.5: x * (127 / 15.5) lands near half-integers
    x[2, :32] = (np.arange(32) - 16) * np.float32(0.5)  # exact halves when d = 1 (amax 127 below)
    x[2, 0] = 127
    x[3, 5] = 1e6  # one large value in a block
    x[4] = np.float32(1e-30) * (x[4] != 0)  # subnormal-range block scales
    return x


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q8_0_is_gguf_py_bit_for_bit(seed):
    x = _acts(seed)
    ref = quants.dequantize(quants.quantize(x, Q.Q8_0), Q.Q8_0).reshape(x.shape)
    ours = numerics.q8_0(x)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


def test_q8_0_rounds_half_away_from_zero():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 127  # d = 1 exactly
    x[0, 1:5] = [0.5, -0.5, 2.5, -2.5]
    v = numerics.q8_0(x)[0]
    assert v[1:5].tolist() == [1.0, -1.0, 3.0, -3.0]


def test_roundf_just_below_a_half_is_c_roundf():
    # the float just below 0.5: |x| + 0.5 in float32 rounds to 1.0; C's roundf (and gguf-py's np_roundf) give 0
    below = np.nextafter(np.float32(0.5), np.float32(0))
    x = np.array([below, -below, np.nextafter(np.float32(1.5), np.float32(0)), 0.5, 126.5, 2.0**23 + 1], np.float32)
    assert numerics.roundf(x).tolist() == [0.0, -0.0, 1.0, 1.0, 127.0, 2.0**23 + 1]
    q = np.zeros((1, 32), np.float32)
    q[0, 0], q[0, 1] = 127, below  # d = 1: the Q8_0 value of `below` is 0, as gguf-py's
    ref = quants.dequantize(quants.quantize(q, Q.Q8_0), Q.Q8_0).reshape(q.shape)
    assert numerics.q8_0(q)[0, 1] == ref[0, 1] == 0.0


@pytest.mark.parametrize("seed", [0, 3])
def test_int8_activations_per_token_are_the_int8_codec(seed):
    x = _acts(seed, t=9, k=96)
    q, s = numerics.int8_act(x, "token")
    enc = get_codec("int8").encode(x)
    np.testing.assert_array_equal(q, enc.parts["q"].reshape(x.shape))
    np.testing.assert_array_equal(s.view(np.uint32), enc.parts["scale"].view(np.uint32))


def test_int8_activations_per_tensor_use_one_scale():
    x = _acts(4, t=5, k=64)
    q, s = numerics.int8_act(x, "tensor")
    enc = get_codec("int8").encode(x.reshape(1, -1))
    np.testing.assert_array_equal(q.reshape(-1), enc.parts["q"].reshape(-1))
    assert np.all(s == enc.parts["scale"][0])


def test_int8_activation_rounding_is_half_to_even():
    x = np.array([[127, 0.5, 1.5, 2.5, -0.5, -2.5]], np.float32)  # scale 1: x * 1 rounds
    q, s = numerics.int8_act(x)
    assert s[0] == 1 and q[0].tolist() == [127, 0, 2, 2, 0, -2]


@pytest.mark.parametrize("k", [64, 9000])
def test_int8_matmul_is_the_exact_integer_product(k):
    rng = np.random.default_rng(k)
    qx = rng.integers(-127, 128, (5, k)).astype(np.int8)
    qw = rng.integers(-127, 128, (70, k)).astype(np.int8)
    qx[0], qw[0] = 127, -127  # the largest magnitude an accumulator can reach
    sx = rng.random(5).astype(np.float32)
    sw = rng.random(70).astype(np.float32)
    acc = qx.astype(np.int64) @ qw.astype(np.int64).T
    assert np.abs(acc).max() < 2**31  # an int32 accumulator holds it
    want = acc.astype(np.float32) * sx[:, None] * sw[None, :]
    np.testing.assert_array_equal(numerics.int8_matmul(qx, sx, qw, sw), want)


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 17, 5), (5, 33, 67), (4, 32, 64), (9, 50, 577), (130, 40, 1536),
                                   (2, 3, 0), (0, 4, 8), (3, 0, 8)])
def test_int8_matmul_kernel_is_its_numpy_reference(isa, m, n, k):
    """kernels/i8gemm.c on each SIMD path it has (ORKPACK_ISA's levels; VNNI where the CPU has it) against the
    float64 reference and against int64 sums, bit for bit: shapes off every block size (4 rows, 16 / 32 columns,
    4 k), the int8 extremes -128 and 127 in every row."""
    from orkpack.codecs import set_isa
    from orkpack._kernels import lib

    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    qx = rng.integers(-128, 128, (m, k)).astype(np.int8)
    qw = rng.integers(-128, 128, (n, k)).astype(np.int8)
    if m and n and k:
        qx[0], qw[0] = -128, -128
        qx[-1, ::2], qw[-1, 1::2] = 127, -128
    sx = (rng.random(m) * 3e-2).astype(np.float32)
    sw = (rng.random(n) * 3e-3).astype(np.float32)
    acc = qx.astype(np.int64) @ qw.astype(np.int64).T
    want = acc.astype(np.float32) * sx[:, None] * sw[None, :]
    try:
        got_isa = set_isa(isa)
        if isa == "avx512" and got_isa == "avx512":
            assert lib.ork_i8_matmul_isa() in (1, 2)  # VNNI when the CPU has it, else AVX2
        got = numerics.int8_matmul(qx, sx, qw, sw)
    finally:
        set_isa(None)
    assert got.dtype == np.float32 and got.shape == (m, n)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(numerics.int8_matmul_f64(qx, sx, qw, sw).view(np.uint32), want.view(np.uint32))


def test_int8_matmul_longest_k_and_beyond():
    """The kernel's largest K (ORK_I8GEMM_MAX_K: K x 128 x 128 < 2^31) at the accumulator's extreme (every product
    +16384), and one K more (the float64 reference takes it), both exact."""
    for k in (numerics._I8_MAX_K, numerics._I8_MAX_K + 1):
        qx = np.full((2, k), -128, dtype=np.int8)
        qw = np.full((3, k), -128, dtype=np.int8)
        qw[1] = 127
        sx, sw = np.ones(2, np.float32), np.array([1, 1, 0.5], np.float32)
        acc = qx.astype(np.int64) @ qw.astype(np.int64).T
        want = acc.astype(np.float32) * sx[:, None] * sw[None, :]
        np.testing.assert_array_equal(numerics.int8_matmul(qx, sx, qw, sw), want)


@pytest.mark.parametrize("shape,kseg", [((70, 100), 8192), ((33, 200), 64)])
def test_untile_inverts_the_c_codecs_npu_image(shape, kseg):
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    codec = get_codec("int8")
    tiled = codec.encode(w, npu=True, k_segment=kseg)
    rows = codec.encode(w)
    q = untile_int8(tiled.parts["q"], *shape, tiled.layout)
    np.testing.assert_array_equal(q, rows.parts["q"].reshape(shape))
    np.testing.assert_array_equal(tile_int8(q, kseg), tiled.parts["q"])
    # and the C decoder of the tiled image gives the same weights as q * scale
    np.testing.assert_array_equal(codec.decode(tiled.parts, shape, tiled.layout),
                                  q.astype(np.float32) * tiled.parts["scale"][:, None])


def test_q8_k_values():
    x = _acts(5, t=5, k=512)
    v = numerics.q8_k(x)
    for r in range(5):
        for b in range(2):
            blk = x[r, b * 256:(b + 1) * 256]
            i = int(np.abs(blk).argmax())
            if blk[i] == 0:
                assert np.all(v[r, b * 256:(b + 1) * 256] == 0)
                continue
            d = np.float32(1) / (np.float32(-127) / blk[i])
            q = v[r, b * 256:(b + 1) * 256] / d
            np.testing.assert_allclose(q, np.round(q), atol=1e-3)  # integers times d
            assert np.all(np.abs(v[r, b * 256:(b + 1) * 256] - blk) <= np.abs(d) * 0.5001 + 1e-30)


def test_f16_and_bf16_activations():
    x = np.array([[1.0, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 1 + 2**-8, 1 + 3 * 2**-8]], np.float32)
    assert numerics.f16_act(x)[0, :4].tolist() == [1.0, 1.0, 1 + 2 * 2**-10, 65504.0]
    assert numerics.bf16_act(x)[0, 4:].tolist() == [1.0, 1 + 2 * 2**-7]


def test_llama_cpp_activation_by_weight_type():
    assert numerics.llama_cpp_act("Q4_0") is numerics.q8_0
    assert numerics.llama_cpp_act("Q8_0") is numerics.q8_0
    assert numerics.llama_cpp_act("Q4_K") is numerics.q8_k
    assert numerics.llama_cpp_act("F16") is numerics.f16_act
    assert numerics.llama_cpp_act("F32") is None
