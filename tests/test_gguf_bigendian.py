"""A big-endian GGUF (gguf-py's GGUFWriter(endianess=BIG)) reads with the values it was written with; a
quantized tensor in one is refused with one line (its block scales' byte order is not recorded)."""
import gguf
import numpy as np
import pytest

from orkpack.errors import OrkError
from orkpack.sources.gguf import GGUFSource


def _write(path, tensors, endian):
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_float_types_read_their_values(tmp_path, endian):
    rng = np.random.default_rng(3)
    f32 = rng.standard_normal((4, 32)).astype(np.float32)
    f16 = rng.standard_normal((4, 32)).astype(np.float16)
    bf16 = (rng.standard_normal((4, 32)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    i32 = rng.integers(-1 << 30, 1 << 30, (4, 8)).astype(np.int32)
    p = tmp_path / "m.gguf"
    _write(p, {"a.weight": (f32, None), "b.weight": (f16, None),
               "c.weight": (bf16, gguf.GGMLQuantizationType.BF16), "d.weight": (i32, None)}, endian)
    src = GGUFSource(p)
    try:
        np.testing.assert_array_equal(src.read("a.weight"), f32)
        np.testing.assert_array_equal(src.read("b.weight"), f16)
        assert src.read("b.weight").dtype == np.float16
        np.testing.assert_array_equal(src.read("c.weight"), bf16)
        np.testing.assert_array_equal(src.read("d.weight"), i32)
        out = np.empty((4, 32), np.float32)
        assert src.read("a.weight", out=out) is not None
        np.testing.assert_array_equal(out, f32)
        if endian == gguf.GGUFEndian.BIG:
            assert src.mapped("a.weight") is None  # a view of the file's bytes would be in the wrong order
        else:
            np.testing.assert_array_equal(src.mapped("a.weight"), f32)
    finally:
        src.close()


def test_quantized_tensor_in_big_endian_file_is_refused(tmp_path):
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)
    p = tmp_path / "q.gguf"
    _write(p, {"q.weight": (q, gguf.GGMLQuantizationType.Q8_0)}, gguf.GGUFEndian.BIG)
    with pytest.raises(OrkError) as e:
        GGUFSource(p)
    msg = str(e.value)
    assert "\n" not in msg and "Q8_0" in msg and "big-endian" in msg
    # the same bytes little-endian read as gguf-py dequantizes them
    p2 = tmp_path / "q_le.gguf"
    _write(p2, {"q.weight": (q, gguf.GGMLQuantizationType.Q8_0)}, gguf.GGUFEndian.LITTLE)
    src = GGUFSource(p2, on_warning=lambda m: None)
    try:
        np.testing.assert_array_equal(src.read("q.weight"), gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0))
    finally:
        src.close()
