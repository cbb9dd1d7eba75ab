"""bench/dithered_smollm2.py: each Q4_1 / Q8_0 weight moves by at most half its block's step, F32 tensors and
metadata stay, and the output is deterministic."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize, quantize


def _load():
    p = Path(__file__).resolve().parents[1] / "bench" / "dithered_smollm2.py"
    spec = importlib.util.spec_from_file_location("dithered_smollm2", p)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _write(path: Path, rng) -> dict:
    T = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.add_uint32("general.file_type", 3)
    x4 = (rng.standard_t(4, size=(8, 96)) * 0.02).astype(np.float32)
    x4[3, 5] = 0.9  # an outlier
    x8 = (rng.standard_normal((6, 64)) * 0.05).astype(np.float32)
    norm = rng.random(96).astype(np.float32)
    w.add_tensor("blk.0.ffn_up.weight", quantize(x4, T.Q4_1), raw_dtype=T.Q4_1)
    w.add_tensor("token_embd.weight", quantize(x8, T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("blk.0.ffn_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"x4": x4, "x8": x8, "norm": norm}


def test_grid_smeared_within_half_a_step(tmp_path):
    m = _load()
    src = tmp_path / "q.gguf"
    _write(src, np.random.default_rng(0))
    m.dither(src, tmp_path / "out.gguf")
    a = gguf.GGUFReader(str(src))
    b = gguf.GGUFReader(str(tmp_path / "out.gguf"))
    ta = {t.name: t for t in a.tensors}
    tb = {t.name: t for t in b.tensors}
    for name, block, nb in (("blk.0.ffn_up.weight", 20, 32), ("token_embd.weight", 34, 32)):
        t = ta[name]
        assert tb[name].tensor_type == gguf.GGMLQuantizationType.F16
        grid = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float64)
        got = np.asarray(tb[name].data, dtype=np.float64).reshape(-1)
        d = np.repeat(np.asarray(t.data).view(np.uint8).reshape(-1, block)[:, :2].copy().view(np.float16)
                      .astype(np.float64).reshape(-1), nb)
        err = np.abs(got - grid)
        assert (err <= d / 2 + 1e-3 * np.abs(grid) + 1e-6).all(), name  # half a step, plus F16 rounding
        assert err.mean() > d.mean() / 8  # and really smeared (uniform noise: mean |noise| = step / 4)
        assert [int(x) for x in tb[name].shape] == [int(x) for x in t.shape]
    np.testing.assert_array_equal(np.asarray(tb["blk.0.ffn_norm.weight"].data), np.asarray(ta["blk.0.ffn_norm.weight"].data))
    fa = {f.name: f.contents() for f in a.fields.values() if not f.name.startswith("GGUF.")}
    fb = {f.name: f.contents() for f in b.fields.values() if not f.name.startswith("GGUF.")}
    assert fb.pop("general.file_type") == int(gguf.LlamaFileType.MOSTLY_F16)
    fa.pop("general.file_type")
    assert fa == fb
    m.dither(src, tmp_path / "again.gguf")
    assert (tmp_path / "again.gguf").read_bytes() == (tmp_path / "out.gguf").read_bytes()
