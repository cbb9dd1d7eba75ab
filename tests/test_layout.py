"""The NPU int8 tiling (orkpack/layout.py and the C kernels) against the vendor's formula."""
from __future__ import annotations

import numpy as np
import pytest

from orkpack import codecs, layout


def vendor_tiles(w: np.ndarray, k_segment: int = 8192) -> np.ndarray:
    """Direct transcription of rknn matmul_utils' int8 B conversion, per K segment:
    dst[((i*Kt + j)*32 + n)*32 + k] = B[(j*32+k)*N + (i*32+n)], B = W.T (K x N row-major), 0 outside."""
    n_out, k_in = w.shape
    out = []
    for k0 in range(0, k_in, k_segment):
        k1 = min(k_in, k0 + k_segment)
        b = np.ascontiguousarray(w[:, k0:k1].T).ravel()  # B: (k1-k0) x N, row-major
        kk = k1 - k0
        kt = -(-kk // 32)
        nt = -(-n_out // 32)
        dst = np.zeros(nt * kt * 32 * 32, dtype=np.int8)
        for i in range(nt):
            for j in range(kt):
                for n in range(32):
                    for k in range(32):
                        row, col = j * 32 + k, i * 32 + n
                        if row < kk and col < n_out:
                            dst[((i * kt + j) * 32 + n) * 32 + k] = b[row * n_out + col]
        out.append(dst)
    return np.concatenate(out)


def rand_q(n, k, seed=0):
    return np.random.default_rng(seed).integers(-127, 128, size=(n, k), dtype=np.int8)


@pytest.mark.parametrize("n,k,kseg", [(1, 1, 8192), (31, 33, 8192), (33, 65, 8192), (64, 96, 8192),
                                      (5, 100, 64), (40, 8193, 8192)])
def test_tile_matches_vendor_formula(n, k, kseg):
    w = rand_q(n, k, seed=n * 1000 + k)
    want = vendor_tiles(w, kseg)
    got = layout.tile_int8(w, kseg)
    assert got.dtype == np.int8 and np.array_equal(got, want)
    assert got.size == layout.npu_tiled_size(n, k, kseg)
    c_bytes, lay = codecs.tile_int8(w, kseg)
    assert np.array_equal(c_bytes, want)
    assert lay == layout.npu_layout(n, k, kseg)
    assert np.array_equal(layout.untile_int8(got, n, k, lay), w)


def test_layout_record_and_segments():
    lay = layout.npu_layout(33, 8192 * 2 + 5)
    assert lay == {"kind": "npu_int8", "tile_n": 32, "tile_k": 32, "n_pad": 64, "k_segment": 8192,
                   "segments": [[0, 8192, 8192], [8192, 16384, 8192], [16384, 16389, 32]]}
    assert layout.npu_tiled_size(33, 8192 * 2 + 5) == 64 * (8192 * 2 + 32)
    assert layout.npu_layout(1, 8192)["segments"] == [[0, 8192, 8192]]
    with pytest.raises(ValueError):
        layout.npu_layout(4, 64, k_segment=48)
    with pytest.raises(ValueError):
        layout.npu_layout(0, 64)


def test_untile_rejects_wrong_layout_or_size():
    w = rand_q(33, 40)
    buf = layout.tile_int8(w)
    with pytest.raises(ValueError):
        layout.untile_int8(buf, 33, 41, layout.npu_layout(33, 40))
    with pytest.raises(ValueError):
        layout.untile_int8(buf[:-1], 33, 40, layout.npu_layout(33, 40))


def test_segmented_tiles_with_threads():
    w = rand_q(70, 8192 + 300, seed=3)
    want = layout.tile_int8(w)
    for threads in (1, 3):
        got, _ = codecs.tile_int8(w, threads=threads)
        assert np.array_equal(got, want)
    # the padding really is zero
    lay = layout.npu_layout(70, 8192 + 300)
    assert np.array_equal(layout.untile_int8(want, 70, 8192 + 300, lay), w)
    assert np.count_nonzero(want) == np.count_nonzero(w)
