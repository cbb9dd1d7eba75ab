"""NF4 bit for bit against bitsandbytes itself (the oracle): codes, nibble order, absmax.

Both the numpy reference and the C kernel (at every SIMD level) are compared
with ``bitsandbytes.functional.quantize_4bit(t, blocksize=64, quant_type="nf4")``
on CPU tensors. Skipped when torch or bitsandbytes is not installed
(``pip install -e '.[oracle]'``).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[oracle]')")
bnbf = pytest.importorskip("bitsandbytes.functional",
                           reason="bitsandbytes is not installed (pip install -e '.[oracle]')")

from orkpack import codecs  # noqa: E402
from orkpack.codecs import reference as R  # noqa: E402

LEVELS = [lvl for lvl in ("portable", "avx2", "avx512") if codecs.set_isa(lvl) == lvl]
codecs.set_isa(None)


def bnb_nf4(x: np.ndarray, torch_dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(x))
    if torch_dtype is not None:
        t = t.view(torch_dtype)
    packed, state = bnbf.quantize_4bit(t, blocksize=64, quant_type="nf4")
    return packed.numpy().reshape(-1), state.absmax.numpy().reshape(-1)


def check(x: np.ndarray, torch_dtype=None):
    want_codes, want_absmax = bnb_nf4(x, torch_dtype)
    assert want_codes.dtype == np.uint8 and want_absmax.dtype == np.float32
    codes, absmax = R.nf4_encode(x)
    assert codes.tobytes() == want_codes.tobytes(), "numpy reference codes differ from bitsandbytes"
    assert absmax.tobytes() == want_absmax.tobytes(), "numpy reference absmax differs from bitsandbytes"
    try:
        for lvl in LEVELS:
            codecs.set_isa(lvl)
            enc = codecs.get_codec("nf4").encode(x)
            assert enc.parts["codes"].tobytes() == want_codes.tobytes(), f"C ({lvl}) codes differ from bitsandbytes"
            assert enc.parts["absmax"].tobytes() == want_absmax.tobytes(), f"C ({lvl}) absmax differs"
    finally:
        codecs.set_isa(None)


SHAPES = [(64,), (1, 1), (3,), (63,), (65,), (127,), (31, 33), (33, 65), (4096,), (7, 1000), (2, 3, 129)]


@pytest.mark.parametrize("shape", SHAPES)
def test_gaussian(shape):
    x = np.random.default_rng(len(shape) * 100 + shape[-1]).standard_normal(shape).astype(np.float32)
    check(x)


@pytest.mark.parametrize("shape", SHAPES)
def test_heavy_tailed_with_outliers(shape):
    rng = np.random.default_rng(shape[-1])
    x = rng.standard_t(2, size=shape).astype(np.float32)
    flat = x.reshape(-1)
    idx = rng.choice(flat.size, size=max(1, flat.size // 300), replace=False)
    flat[idx] = rng.choice([-1e4, 1e4], size=idx.size)
    check(x)


def test_degenerate_blocks():
    mids = R.MIDPOINTS
    blocks = [
        np.zeros(64),                                           # all-zero block (absmax 0, codes 7)
        np.full(64, -7.5),                                      # constant row
        np.where(np.arange(64) % 2, -0.0, 0.0),                 # +0 / -0 mix
        (np.arange(64) - 31) * 1e-40,                           # denormals (absmax below 1e-38)
        np.full(64, 1e-45),                                     # the smallest subnormal
        np.concatenate([[1.0], mids, -mids, R.CODEBOOK, np.zeros(17)]),  # exactly on midpoints (absmax 1)
        np.concatenate([[3.0], mids * 3, -mids * 3, R.CODEBOOK * 3, np.zeros(17)]),  # midpoints, absmax 3
        np.concatenate([[-2.0], np.nextafter(mids, 1) * 2, np.nextafter(mids, -1) * 2, np.zeros(33)]),
    ]
    x = np.concatenate(blocks).astype(np.float32)
    assert x.size == 64 * len(blocks)
    check(x)
    for n in (x.size - 1, x.size - 63, x.size - 57, 64 * 5 + 1, 64 * 3 + 5):  # tails shorter than 64, n odd
        check(np.ascontiguousarray(x[:n]))
    check(np.zeros(7, np.float32))                              # an all-zero tail alone
    check(np.concatenate([np.zeros(64), np.zeros(9)]).astype(np.float32))
    check(np.concatenate([x[320:384], x[320:347]]).astype(np.float32))  # midpoints in the tail (division path)


def test_tail_division_path():
    # values whose x / absmax and x * (1 / absmax) differ in the last bit, right at a midpoint
    rng = np.random.default_rng(1)
    am = np.float32(7.3)
    cand = (R.MIDPOINTS[None, :] * am * (1 + rng.uniform(-3e-7, 3e-7, size=(400, 15)))).astype(np.float32).ravel()
    div = cand / am
    mul = cand * (np.float32(1) / am)
    hit = cand[(div != mul) & ((div == np.repeat(R.MIDPOINTS[None], 400, 0).ravel())
                               | (mul == np.repeat(R.MIDPOINTS[None], 400, 0).ravel()))]
    assert hit.size > 0
    tail = np.concatenate([[am], hit[:40]]).astype(np.float32)
    check(tail)  # as a tail block (division)
    block = np.concatenate([[am], hit[:63], np.zeros(max(0, 63 - hit[:63].size))]).astype(np.float32)
    check(block)  # as a full block (reciprocal multiply)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_16bit_inputs(dt):
    rng = np.random.default_rng(3)
    x32 = rng.standard_t(3, size=(5, 77)).astype(np.float32)
    if dt == "f16":
        check(x32.astype(np.float16))
    else:
        bits = (x32.view(np.uint32) >> 16).astype(np.uint16)
        want_codes, want_absmax = bnb_nf4(bits, torch.bfloat16)
        codes, absmax = R.nf4_encode(bits)
        assert codes.tobytes() == want_codes.tobytes() and absmax.tobytes() == want_absmax.tobytes()
        enc = codecs.get_codec("nf4").encode(bits)
        assert enc.parts["codes"].tobytes() == want_codes.tobytes()
        assert enc.parts["absmax"].tobytes() == want_absmax.tobytes()


def test_bitsandbytes_dequantize_agrees_with_decode():
    # once, on one shape: bitsandbytes' dequantize_4bit is torch.compile'd per shape (slow to warm up)
    rng = np.random.default_rng(4)
    x = rng.standard_t(2, size=(3, 70)).astype(np.float32)
    want_codes, want_absmax = bnb_nf4(x)
    t_codes = torch.from_numpy(want_codes.copy()).reshape(-1, 1)
    state = bnbf.QuantState(absmax=torch.from_numpy(want_absmax.copy()), shape=torch.Size(x.shape),
                            dtype=torch.float32, blocksize=64, code=bnbf.get_4bit_type("nf4", device="cpu"),
                            quant_type="nf4")
    deq = bnbf.dequantize_4bit(t_codes, state).numpy()
    assert deq.tobytes() == R.nf4_decode(want_codes, want_absmax, x.shape).tobytes()
    assert deq.tobytes() == codecs.get_codec("nf4").decode(
        {"codes": want_codes, "absmax": want_absmax}, x.shape).tobytes()
