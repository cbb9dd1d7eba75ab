"""Quantized releases as they ship (issue 9, part 2): FP8 + scales and MXFP4 safetensors, MXFP4 GGUF.

Oracles, independent of orkpack/sources/quantized.py:
* FP8: ml_dtypes (test extra) and torch (oracle extra) decode the bytes; the
  scale product is numpy's float32 multiply.
* MXFP4: gguf-py's MXFP4 dequantizer, fed the same values repacked into ggml
  blocks; and the OCP MX v1.0 definitions written out here (E2M1 from its bit
  fields, E8M0 as 2**(e-127), NaN at 0xFF), cross-checked with ml_dtypes.
"""
from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import gguf
from gguf import GGMLQuantizationType

from orkpack.cli import app
from orkpack.pack.reader import Pack
from orkpack.sources import open_source
from orkpack.sources import quantized as Q
from orkpack.sources.names import canonical_name

ml_dtypes = pytest.importorskip("ml_dtypes")

runner = CliRunner()
ML = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
      "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz}
TORCH = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
         "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}


# -- helpers -------------------------------------------------------------------

def write_st(path: Path, tensors: dict) -> Path:
    """A safetensors file from ``{name: (dtype, shape, array or bytes)}``, written by hand (any dtype string)."""
    header, blobs, off = {}, [], 0
    for name, (dt, shape, data) in tensors.items():
        b = np.ascontiguousarray(data).tobytes() if isinstance(data, (np.ndarray, np.generic)) else bytes(data)
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return path


def f32(a) -> tuple:
    a = np.asarray(a, np.float32)
    return ("F32", a.shape, a)


def bf16(a) -> tuple:
    a = np.asarray(a, np.float32)
    bits = ((a.view(np.uint32) + 0x8000) >> 16).astype(np.uint16)  # round half up is fine for test data
    return ("BF16", a.shape, bits)


def bf16_value(t: tuple) -> np.ndarray:
    return (t[2].astype(np.uint32) << 16).view(np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """Equal shapes, NaN at the same places, every other value bit for bit (so -0 != +0)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    na, nb = np.isnan(a), np.isnan(b)
    assert np.array_equal(na, nb)
    assert np.array_equal(a.view(np.uint32)[~na], b.view(np.uint32)[~nb])


def fp8_bytes(rng, n: int, k: int) -> np.ndarray:
    """n x k bytes holding every byte value (several times when there is room)."""
    u = rng.integers(0, 256, n * k, dtype=np.uint8)
    u[: min(256, n * k)] = np.arange(min(256, n * k), dtype=np.uint8)
    return rng.permutation(u).reshape(n, k)


def scales(rng, shape) -> np.ndarray:
    """float32 scales with full mantissas, so the products round."""
    return (rng.uniform(0.5, 2.0, shape) * 2.0 ** rng.integers(-12, 4, shape)).astype(np.float32)


def oracle_fp8(u8: np.ndarray, fmt: str, scale: np.ndarray, bn: int, bk: int) -> np.ndarray:
    w = u8.view(ML[fmt]).astype(np.float32)
    n, k = w.shape
    s = np.repeat(np.repeat(scale.reshape(-(-n // bn), -(-k // bk)), bn, 0)[:n], bk, 1)[:, :k]
    return w * s


def read_all(path) -> tuple[dict, dict]:
    with open_source(path) as src:
        infos = {i.source_name: i for i in src.tensors()}
        return infos, {n: np.array(src.read(i.name)) for n, i in infos.items()}


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def refused(args, out: Path, needle: str) -> str:
    r = cli(*args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]  # (a progress bar may precede it)
    assert len(lines) == 1 and len(r.output.strip().splitlines()) <= 2, r.output
    assert needle in r.output, r.output
    assert "Traceback" not in r.output
    assert not out.exists() and not list(out.parent.glob("*.orkpack-partial"))
    return lines[0]


# -- FP8 decode tables -----------------------------------------------------------

@pytest.mark.parametrize("fmt", Q.FP8_DTYPES)
def test_fp8_table_equals_ml_dtypes_on_all_256_bytes(fmt):
    """Bit for bit, NaNs included (the quiet NaN with the byte's sign, as ml_dtypes gives)."""
    b = np.arange(256, dtype=np.uint8)
    ours = Q.FP8_TABLES[fmt]
    ref = b.view(ML[fmt]).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("fmt", Q.FP8_DTYPES)
def test_fp8_table_equals_torch_on_all_256_bytes(fmt):
    """torch's NaN payloads differ from ml_dtypes' (and among formats): NaN places agree, all else bit for bit."""
    torch = pytest.importorskip("torch")
    b = np.arange(256, dtype=np.uint8)
    ref = torch.from_numpy(b.copy()).view(getattr(torch, TORCH[fmt])).to(torch.float32).numpy()
    same_bits(Q.FP8_TABLES[fmt], ref)


def test_fp8_special_values():
    t = Q.FP8_TABLES
    e4 = t["F8_E4M3"]
    assert list(np.nonzero(np.isnan(e4))[0]) == [0x7F, 0xFF] and not np.isinf(e4).any()
    assert e4[0x7E] == 448 and e4[0x01] == 2.0 ** -9 and e4[0x80] == 0 and np.signbit(e4[0x80])
    e5 = t["F8_E5M2"]
    assert list(np.nonzero(np.isinf(e5))[0]) == [0x7C, 0xFC] and e5[0xFC] < 0
    assert list(np.nonzero(np.isnan(e5))[0]) == [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
    assert e5[0x7B] == 57344 and e5[0x01] == 2.0 ** -16
    for fmt, mx in (("F8_E4M3FNUZ", 240), ("F8_E5M2FNUZ", 57344)):
        v = t[fmt]
        assert list(np.nonzero(np.isnan(v))[0]) == [0x80] and not np.isinf(v).any() and v[0x7F] == mx


# -- FP8 safetensors ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", Q.FP8_DTYPES)
@pytest.mark.parametrize("chunk", [None, 1000, 100])
def test_fp8_block_scales_ragged_edges(tmp_path, fmt, chunk, monkeypatch):
    """N, K not multiples of 128: the edge blocks are ragged; small chunks cut rows and columns."""
    if chunk:
        monkeypatch.setattr(Q, "CHUNK", chunk)
    rng = np.random.default_rng(1)
    n, k = 300, 200
    u8 = fp8_bytes(rng, n, k)
    s = scales(rng, (3, 2))
    p = write_st(tmp_path / "m.safetensors", {
        "model.layers.0.mlp.down_proj.weight": (fmt, (n, k), u8),
        "model.layers.0.mlp.down_proj.weight_scale_inv": f32(s),
        "model.norm.weight": bf16(np.ones(k)),
    })
    infos, got = read_all(p)
    assert set(infos) == {"model.layers.0.mlp.down_proj.weight", "model.norm.weight"}  # the scale is consumed
    info = infos["model.layers.0.mlp.down_proj.weight"]
    assert info.dtype == fmt and info.shape == (n, k) and info.nbytes == n * k + s.nbytes
    same_bits(got["model.layers.0.mlp.down_proj.weight"], oracle_fp8(u8, fmt, s, 128, 128))


def test_fp8_block_size_from_config(tmp_path):
    rng = np.random.default_rng(2)
    n, k = 100, 70
    u8 = fp8_bytes(rng, n, k)
    s = scales(rng, (2, 3))  # blocks of 64 x 32
    write_st(tmp_path / "m" / "model.safetensors", {"lm.weight": ("F8_E4M3", (n, k), u8), "lm.weight_scale_inv": f32(s)})
    (tmp_path / "m" / "config.json").write_text(json.dumps(
        {"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 32]}}))
    _, got = read_all(tmp_path / "m")
    same_bits(got["lm.weight"], oracle_fp8(u8, "F8_E4M3", s, 64, 32))


@pytest.mark.parametrize("sshape", [(), (1,), "N", "N1"])
@pytest.mark.parametrize("sdtype", ["F32", "BF16", "F16"])
def test_fp8_weight_scale_per_tensor_and_per_channel(tmp_path, sshape, sdtype):
    """compressed-tensors style ``weight_scale``: per tensor [] / [1], per channel [N] / [N, 1]; F32, BF16 or F16."""
    rng = np.random.default_rng(3)
    n, k = 40, 96
    u8 = fp8_bytes(rng, n, k)
    shape = {"N": (n,), "N1": (n, 1)}.get(sshape, sshape)
    s = scales(rng, shape)
    if sdtype == "BF16":
        st = bf16(s)
        s = bf16_value(st)
    elif sdtype == "F16":
        s = s.astype(np.float16)
        st = ("F16", s.shape, s)
        s = s.astype(np.float32)
    else:
        st = f32(s)
    p = write_st(tmp_path / "m.safetensors", {
        "model.layers.0.self_attn.q_proj.weight": ("F8_E5M2", (n, k), u8),
        "model.layers.0.self_attn.q_proj.weight_scale": st,
        "model.layers.0.self_attn.q_proj.input_scale": f32(np.float32(0.02)),
    })
    with open_source(p) as src:
        (info,) = src.tensors()
        got = src.read(info.name)
        assert [s.name for s in src.skipped()] == ["model.layers.0.self_attn.q_proj.input_scale"]
    ref = u8.view(ml_dtypes.float8_e5m2).astype(np.float32) * s.reshape(-1, 1)
    same_bits(got, ref)


def test_fp8_compressed_tensors_block_strategy(tmp_path):
    """compressed-tensors ``strategy: block``: a 2-D ``weight_scale``, the block from ``block_structure``."""
    rng = np.random.default_rng(11)
    n, k = 70, 90
    u8 = fp8_bytes(rng, n, k)
    s = scales(rng, (3, 2))  # blocks of 32 x 64
    write_st(tmp_path / "m" / "model.safetensors", {"a.weight": ("F8_E4M3", (n, k), u8), "a.weight_scale": bf16(s)})
    (tmp_path / "m" / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
            "num_bits": 8, "type": "float", "strategy": "block", "block_structure": [32, 64]}}}}}))
    _, got = read_all(tmp_path / "m")
    same_bits(got["a.weight"], oracle_fp8(u8, "F8_E4M3", bf16_value(bf16(s)), 32, 64))


def test_fp8_stacked_experts_each_with_its_scale(tmp_path):
    """DeepSeek-style per-expert FP8 tensors: stacked into one (E, N, K) tensor, each expert with its own scales."""
    rng = np.random.default_rng(4)
    E, n, k = 3, 130, 140
    t, ref = {}, []
    for e in range(E):
        u8 = fp8_bytes(rng, n, k)
        s = scales(rng, (2, 2))
        t[f"model.layers.0.mlp.experts.{e}.up_proj.weight"] = ("F8_E4M3", (n, k), u8)
        t[f"model.layers.0.mlp.experts.{e}.up_proj.weight_scale_inv"] = f32(s)
        ref.append(oracle_fp8(u8, "F8_E4M3", s, 128, 128))
    p = write_st(tmp_path / "m.safetensors", t)
    with open_source(p) as src:
        (info,) = src.tensors()
        assert info.name == "blk.0.ffn_up_exps.weight" and info.shape == (E, n, k) and info.dtype == "F8_E4M3"
        got = src.read(info.name, out=np.empty(info.numel * 4 + 64, np.uint8))  # into a reused buffer too
    same_bits(got, np.stack(ref))


def test_fp8_nan_weights_stop_the_build_with_one_line(tmp_path):
    u8 = np.full((64, 64), 0x38, np.uint8)  # 1.0
    u8[5, 7] = 0x7F  # NaN in E4M3FN
    p = write_st(tmp_path / "m.safetensors", {"model.layers.0.mlp.up_proj.weight": ("F8_E4M3", (64, 64), u8),
                                               "model.layers.0.mlp.up_proj.weight_scale_inv": f32([[0.5]])})
    out = tmp_path / "o.orkpack"
    line = refused(["build", p, "-o", out, "--no-plan"], out, "NaN")
    assert "1 NaN/Inf values" in line and "--allow-nonfinite" in line
    r = cli("build", p, "-o", out, "--no-plan", "--allow-nonfinite")
    assert r.exit_code == 0, r.output


# -- MXFP4 -------------------------------------------------------------------------

def ocp_e2m1(code: int) -> float:
    """OCP MX v1.0 FP4 E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no inf/NaN."""
    s, e, m = code >> 3, (code >> 1) & 3, code & 1
    v = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -v if s else v


def ocp_e8m0(e: int) -> float:
    """OCP MX v1.0 E8M0 scale: 2**(e-127), NaN at 0xFF."""
    return math.nan if e == 255 else math.ldexp(1.0, e - 127)


def test_mxfp4_tables_follow_the_ocp_spec():
    ours = [float(v) for v in Q.E2M1]
    assert ours == [ocp_e2m1(c) for c in range(16)] == [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]
    assert all(math.copysign(1, a) == math.copysign(1, ocp_e2m1(c)) for c, a in enumerate(ours))  # -0 at 8
    same_bits(Q.E2M1, np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32))
    ref = np.array([ocp_e8m0(e) for e in range(256)], np.float32)
    same_bits(Q.E8M0, ref)
    same_bits(Q.E8M0, np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32))


def hf_to_ggml_mxfp4(blocks: np.ndarray, scales_u8: np.ndarray) -> np.ndarray:
    """HF gpt-oss blocks (.., G, 16) + scales (.., G) -> ggml MXFP4 rows (.., G * 17).

    HF: byte j of a group holds value 2j (low nibble) and 2j+1 (high nibble).
    ggml (gguf-py MXFP4.dequantize_blocks): the scale byte, then byte j holds value j (low) and j+16 (high).
    """
    codes = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    ggml = np.concatenate([scales_u8[..., None], qs.astype(np.uint8)], axis=-1)
    return ggml.reshape(*blocks.shape[:-2], -1)


def ocp_mxfp4(blocks: np.ndarray, sc: np.ndarray) -> np.ndarray:
    """The OCP definitions above applied to gpt-oss's layout (low nibble = even value)."""
    codes = np.stack([blocks & 15, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32)
    table = np.array([ocp_e2m1(c) for c in range(16)], np.float32)
    scale = np.array([ocp_e8m0(e) for e in range(256)], np.float32)
    with np.errstate(over="ignore"):  # e = 254 with |v| >= 2 overflows to inf, as it should
        return (table[codes] * scale[sc][..., None]).reshape(*blocks.shape[:-2], -1)


def ggml_to_hf_mxfp4(rows: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray]:
    b = rows.reshape(*rows.shape[:-1], groups, 17)
    qs = b[..., 1:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=-1)  # values 0..31 of the group
    hf = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return hf.astype(np.uint8), b[..., 0].copy()


def mxfp4_data(rng, lead: tuple, k: int, emin=0, emax=254):
    g = k // 32
    blocks = rng.integers(0, 256, (*lead, g, 16), dtype=np.uint8)
    blocks.reshape(-1)[:256] = np.arange(256, dtype=np.uint8)  # every nibble pair
    sc = rng.integers(emin, emax + 1, (*lead, g), dtype=np.uint8)
    return blocks, sc


def test_mxfp4_nibble_order_by_hand(tmp_path):
    """Byte j of a group: value 2j in its low nibble, 2j+1 in its high nibble (OpenAI gpt_oss/torch/weights.py)."""
    blocks = np.zeros((1, 1, 16), np.uint8)
    blocks[0, 0, 0] = 0x21  # values 0, 1: codes 1 (0.5), 2 (1.0)
    blocks[0, 0, 15] = 0xF7  # values 30, 31: codes 7 (6.0), 15 (-6.0)
    sc = np.array([[128]], np.uint8)  # x2
    p = write_st(tmp_path / "m.safetensors", {"x.w_blocks": ("U8", blocks.shape, blocks), "x.w_scales": ("U8", sc.shape, sc)})
    infos, got = read_all(p)
    assert infos["x.w"].dtype == "MXFP4" and infos["x.w"].shape == (1, 32) and infos["x.w"].nbytes == 17
    v = got["x.w"][0]
    assert list(v[:2]) == [1.0, 2.0] and list(v[30:]) == [12.0, -12.0] and not v[2:30].any()


@pytest.mark.parametrize("chunk", [None, 200])
def test_mxfp4_equals_gguf_py_dequantizer(tmp_path, chunk, monkeypatch):
    """gpt-oss shapes: blocks (E, 2I, H/32, 16) -> (E, 2I, H); every byte and every exponent 0..254."""
    if chunk:
        monkeypatch.setattr(Q, "CHUNK", chunk)
    rng = np.random.default_rng(5)
    E, I2, H = 4, 24, 96
    blocks, sc = mxfp4_data(rng, (E, I2), H)
    sc.reshape(-1)[:255] = np.arange(255, dtype=np.uint8)
    p = write_st(tmp_path / "m.safetensors", {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", blocks.shape, blocks),
        "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", sc.shape, sc),
        "model.layers.0.mlp.experts.gate_up_proj_bias": bf16(rng.standard_normal((E, I2))),
    })
    infos, got = read_all(p)
    info = infos["model.layers.0.mlp.experts.gate_up_proj"]
    assert info.shape == (E, I2, H) and info.dtype == "MXFP4" and info.nbytes == blocks.nbytes + sc.nbytes
    assert info.name == canonical_name("model.layers.0.mlp.experts.gate_up_proj", None, 1) or info.name.startswith("blk.0.")
    assert set(infos) == {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.gate_up_proj_bias"}
    with np.errstate(over="ignore"):
        ref = gguf.quants.dequantize(hf_to_ggml_mxfp4(blocks, sc), GGMLQuantizationType.MXFP4)
    codes = np.stack([blocks & 15, blocks >> 4], -1).reshape(E, I2, H // 32, 32)
    # gguf-py's integer table gives code 8 (-0 in OCP E2M1) as +0: bit for bit everywhere else
    minus0 = codes.reshape(E, I2, H) == 8
    assert (ref[minus0] == 0).all() and not np.signbit(ref[minus0]).any()
    same_bits(got["model.layers.0.mlp.experts.gate_up_proj"], np.where(minus0, np.float32(-0.0), ref))
    # and the hand-written OCP definition, value by value
    same_bits(got["model.layers.0.mlp.experts.gate_up_proj"], ocp_mxfp4(blocks, sc))


def test_mxfp4_scale_255_is_nan(tmp_path):
    """E8M0 0xFF is NaN (OCP); gguf-py computes 2**128 there. A build then stops on the NaN."""
    blocks = np.full((2, 1, 16), 0x22, np.uint8)
    sc = np.array([[127], [255]], np.uint8)
    p = write_st(tmp_path / "m.safetensors", {"x.w_blocks": ("U8", blocks.shape, blocks),
                                               "x.w_scales": ("F8_E8M0", sc.shape, sc)})  # E8M0 scales accepted too
    _, got = read_all(p)
    assert (got["x.w"][0] == 1.0).all() and np.isnan(got["x.w"][1]).all()


# -- GGUF MXFP4 --------------------------------------------------------------------

def test_gguf_reader_dequantizes_mxfp4_like_gguf_py(tmp_path):
    from orkpack.sources.gguf import DEQUANT_TYPES

    assert "MXFP4" in DEQUANT_TYPES
    rng = np.random.default_rng(6)
    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    data = {"blk.0.ffn_up.weight": rng.standard_normal((8, 64)).astype(np.float32),
            "blk.0.ffn_gate_exps.weight": rng.standard_normal((4, 8, 96)).astype(np.float32)}
    q = {n: gguf.quants.quantize(a, GGMLQuantizationType.MXFP4) for n, a in data.items()}
    for n, a in q.items():
        w.add_tensor(n, a, raw_dtype=GGMLQuantizationType.MXFP4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    notes = []
    with open_source(tmp_path / "m.gguf", on_warning=notes.append) as src:
        infos = {i.name: i for i in src.tensors()}
        got = {n: src.read(n) for n in infos}
    assert notes and all(infos[n].dtype == "MXFP4" and infos[n].shape == data[n].shape for n in data)
    for n in data:
        same_bits(got[n], gguf.quants.dequantize(q[n], GGMLQuantizationType.MXFP4))
    # the same blocks in gpt-oss's safetensors layout read the same: the two nibble orders agree
    a = q["blk.0.ffn_gate_exps.weight"]
    hb, hs = ggml_to_hf_mxfp4(a, 3)
    p = write_st(tmp_path / "hf.safetensors", {"e_blocks": ("U8", hb.shape, hb), "e_scales": ("U8", hs.shape, hs)})
    _, hf = read_all(p)
    g = got["blk.0.ffn_gate_exps.weight"]
    assert np.array_equal(hf["e"], g)  # equal values (gguf-py's +0 for code 8 is -0 here)
    zero = g == 0
    assert np.array_equal(hf["e"].view(np.uint32)[~zero], g.view(np.uint32)[~zero])


# -- end to end: build and verify ------------------------------------------------

def _pack_tensors(path: Path) -> dict:
    out = {}
    with Pack.open(path) as p:
        for t, s in p.slices():
            out[(t["name"], s["expert"])] = (t["shape"], s["encoding"], s["tier"], s["layout"],
                                             {k: p.part(v).tobytes() for k, v in s["parts"].items()})
    return out


def _source_dtypes(path: Path) -> dict:
    with Pack.open(path) as p:
        return {t["name"]: t["source_dtype"] for t, s in p.slices()}


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 300,
         "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16"}


def fp8_llama(folder: Path, seed=7) -> tuple[Path, Path]:
    """A tiny llama in FP8 (DeepSeek-style block scales, static input scales) and its dequantized F32 twin."""
    rng = np.random.default_rng(seed)
    H, I, V, L, hd = 256, 300, 512, 2, 64
    q, ref = {}, {}

    def plain(name, a):  # not quantized: the same BF16 tensor in both
        q[name] = ref[name] = bf16(a)

    plain("model.embed_tokens.weight", rng.standard_normal((V, H)) * 0.02)
    plain("lm_head.weight", rng.standard_normal((V, H)) * 0.02)
    plain("model.norm.weight", 1 + 0.1 * rng.standard_normal(H))
    shapes = {"self_attn.q_proj": (4 * hd, H), "self_attn.k_proj": (2 * hd, H), "self_attn.v_proj": (2 * hd, H),
              "self_attn.o_proj": (H, 4 * hd), "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}
    for i in range(L):
        plain(f"model.layers.{i}.input_layernorm.weight", 1 + 0.1 * rng.standard_normal(H))
        plain(f"model.layers.{i}.post_attention_layernorm.weight", 1 + 0.1 * rng.standard_normal(H))
        for m, (n, k) in shapes.items():
            w = rng.standard_normal((n, k)) * 40  # within E4M3's range, most bytes used
            u8 = np.clip(w, -448, 448).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            s = scales(rng, (-(-n // 128), -(-k // 128))) * np.float32(1e-3)
            name = f"model.layers.{i}.{m}.weight"
            q[name] = ("F8_E4M3", (n, k), u8)
            q[name + "_scale_inv"] = f32(s)
            q[f"model.layers.{i}.{m}.input_scale"] = f32(np.float32(0.01))
            ref[name] = f32(oracle_fp8(u8, "F8_E4M3", s, 128, 128))
    fq, fr = folder / "fp8", folder / "ref"
    write_st(fq / "model.safetensors", q)
    write_st(fr / "model.safetensors", ref)
    (fq / "config.json").write_text(json.dumps({**LLAMA, "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "static", "weight_block_size": [128, 128]}}))
    (fr / "config.json").write_text(json.dumps({**LLAMA, "torch_dtype": "float32"}))
    return fq, fr


@pytest.mark.parametrize("plan", [False, True])
def test_fp8_checkpoint_builds_verifies_and_equals_its_dequantized_twin(tmp_path, plan):
    from orkpack.runtime.verify import verify_pack

    fq, fr = fp8_llama(tmp_path)
    opts = [] if plan else ["--no-plan"]
    for src, out in ((fq, tmp_path / "q.orkpack"), (fr, tmp_path / "r.orkpack")):
        r = cli("build", src, "-o", out, *opts, "--threads", "1")
        assert r.exit_code == 0, r.output
        assert verify_pack(out).exit_code == 0
    a, b = _pack_tensors(tmp_path / "q.orkpack"), _pack_tensors(tmp_path / "r.orkpack")
    assert a == b  # the same names, shapes, encodings, tiers and bytes
    dt = _source_dtypes(tmp_path / "q.orkpack")
    assert dt["blk.0.attn_q.weight"] == "F8_E4M3" and dt["token_embd.weight"] == "BF16"
    assert not any("scale" in n for n in dt)


GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64,
           "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "num_hidden_layers": 1, "num_local_experts": 4, "num_experts_per_tok": 2, "experts_per_token": 2,
           "vocab_size": 256, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 150000,
           "sliding_window": 128, "layer_types": ["sliding_attention"], "swiglu_limit": 7.0,
           "tie_word_embeddings": False, "attention_bias": True, "torch_dtype": "bfloat16"}


def mxfp4_gpt_oss(folder: Path, seed=8) -> tuple[Path, Path]:
    rng = np.random.default_rng(seed)
    H, I, E, V, hd = 64, 64, 4, 256, 16
    q, ref = {}, {}

    def plain(name, a):  # not quantized: the same BF16 tensor in both
        q[name] = ref[name] = bf16(a)

    plain("model.embed_tokens.weight", rng.standard_normal((V, H)) * 0.02)
    plain("lm_head.weight", rng.standard_normal((V, H)) * 0.02)
    plain("model.norm.weight", np.ones(H))
    p = "model.layers.0."
    plain(p + "input_layernorm.weight", np.ones(H))
    plain(p + "post_attention_layernorm.weight", np.ones(H))
    for m, n in (("q_proj", 4 * hd), ("k_proj", 2 * hd), ("v_proj", 2 * hd)):
        plain(p + f"self_attn.{m}.weight", rng.standard_normal((n, H)) * 0.05)
        plain(p + f"self_attn.{m}.bias", rng.standard_normal(n) * 0.01)
    plain(p + "self_attn.o_proj.weight", rng.standard_normal((H, 4 * hd)) * 0.05)
    plain(p + "self_attn.o_proj.bias", rng.standard_normal(H) * 0.01)
    plain(p + "self_attn.sinks", rng.standard_normal(4))
    plain(p + "mlp.router.weight", rng.standard_normal((E, H)) * 0.05)
    plain(p + "mlp.router.bias", rng.standard_normal(E) * 0.01)
    for proj, rows, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
        blocks, sc = mxfp4_data(rng, (E, rows), k, emin=118, emax=124)
        name = p + f"mlp.experts.{proj}"
        q[name + "_blocks"] = ("U8", blocks.shape, blocks)
        q[name + "_scales"] = ("U8", sc.shape, sc)
        ref[name] = f32(ocp_mxfp4(blocks, sc))
        plain(name + "_bias", rng.standard_normal((E, rows)) * 0.01)
    fq, fr = folder / "mx", folder / "ref"
    write_st(fq / "model.safetensors", q)
    write_st(fr / "model.safetensors", ref)
    (fq / "config.json").write_text(json.dumps({**GPT_OSS, "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}}))
    (fr / "config.json").write_text(json.dumps({**GPT_OSS, "torch_dtype": "float32"}))
    return fq, fr


@pytest.mark.parametrize("plan", [False, True])
def test_mxfp4_gpt_oss_checkpoint_builds_verifies_and_equals_its_dequantized_twin(tmp_path, plan):
    from orkpack.runtime.verify import verify_pack

    fq, fr = mxfp4_gpt_oss(tmp_path)
    with open_source(fq) as src:
        infos = {i.source_name: i for i in src.tensors()}
        arch, n = src.arch, 1
    gu = infos["model.layers.0.mlp.experts.gate_up_proj"]
    assert gu.dtype == "MXFP4" and gu.shape == (4, 128, 64)
    assert gu.name == canonical_name("model.layers.0.mlp.experts.gate_up_proj", arch, n)
    assert not any(s.endswith(("_blocks", "_scales")) for s in infos)
    for src, out in ((fq, tmp_path / "q.orkpack"), (fr, tmp_path / "r.orkpack")):
        r = cli("build", src, "-o", out, *([] if plan else ["--no-plan"]), "--threads", "1")
        assert r.exit_code == 0, r.output
        assert verify_pack(out).exit_code == 0
    a, b = _pack_tensors(tmp_path / "q.orkpack"), _pack_tensors(tmp_path / "r.orkpack")
    assert a == b
    assert sum(1 for (name, e) in a if name == gu.name) == 4  # one slice per expert
    assert _source_dtypes(tmp_path / "q.orkpack")[gu.name] == "MXFP4"


# -- memory ----------------------------------------------------------------------

# Peak RSS of the measured step alone: VmHWM after resetting it (clear_refs 5). ru_maxrss would not
# do in a child: Linux carries the parent's peak across fork + exec.
MEASURE = """
import sys

def _status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def begin():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")

def peak():
    return _status("VmHWM")
"""

def test_reading_a_large_fp8_tensor_stays_bounded(tmp_path):
    """A 4096 x 8192 FP8 tensor (128 MiB as float32): a read holds the output and small chunks only."""
    n, k = 4096, 8192
    rng = np.random.default_rng(9)
    u8 = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)  # finite E4M3 values
    p = write_st(tmp_path / "big.safetensors", {"w.weight": ("F8_E4M3", (n, k), u8),
                                                 "w.weight_scale_inv": f32(scales(rng, (n // 128, k // 128)))})
    del u8
    code = MEASURE + """
import numpy as np
from orkpack.sources import open_source
src = open_source(sys.argv[1])
(info,) = src.tensors()
base = begin()
a = src.read(info.name)
top = peak()
assert a.dtype == np.float32 and np.isfinite(a).all()
print(base, top)
"""
    res = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, check=True)
    base, top = map(int, res.stdout.split())
    out_bytes = 4 * n * k
    assert out_bytes // 2 < top - base < out_bytes + 24 * 2**20, (top - base, out_bytes)


def test_fp8_build_memory_bounded_by_the_largest_tensor(tmp_path):
    """A build of an FP8 model stays within the build's bound: 2x the largest tensor as float32 + overhead."""
    rng = np.random.default_rng(10)
    t = {}
    n, k = 2048, 4096
    for i in range(6):
        u8 = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
        t[f"model.layers.{i}.mlp.up_proj.weight"] = ("F8_E4M3", (n, k), u8)
        t[f"model.layers.{i}.mlp.up_proj.weight_scale_inv"] = f32(scales(rng, (n // 128, k // 128)))
    p = write_st(tmp_path / "m.safetensors", t)
    largest_f32 = 4 * n * k
    code = MEASURE + """
from orkpack.build import BuildOptions, build
import numpy, orkpack.codecs, orkpack.sources, orkpack.pack.writer
base = begin()
build(sys.argv[1], sys.argv[2], BuildOptions(threads=2, plan=False))
print(base, peak())
"""
    res = subprocess.run([sys.executable, "-c", code, str(p), str(tmp_path / "o.orkpack")],
                         capture_output=True, text=True, check=True)
    base, top = map(int, res.stdout.split())
    assert largest_f32 // 2 < top - base < 2 * largest_f32 + 48 * 2**20, (top - base, largest_f32)


# -- refusals: one line, exit 2, nothing at the output path --------------------------

def _one(tmp_path, tensors: dict, config: dict | None = None) -> Path:
    d = tmp_path / "m"
    write_st(d / "model.safetensors", tensors)
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d


W8 = ("F8_E4M3", (4, 32), np.full((4, 32), 0x38, np.uint8))
U8 = lambda *shape: ("U8", shape, np.zeros(shape, np.uint8))  # noqa: E731
I32 = lambda *shape: ("I32", shape, np.zeros(shape, np.int32))  # noqa: E731


@pytest.mark.parametrize("case,tensors,config,needles", [
    ("e8m0 alone", {"a.weight": ("F8_E8M0", (4, 4), np.zeros((4, 4), np.uint8))}, None,
     ["a.weight", "F8_E8M0", "not the _scales of MXFP4", "dequantize it first"]),
    ("f4", {"a.weight": ("F4", (4, 4), bytes(8))}, None, ["a.weight", "F4", "dequantize it first"]),
    ("f6", {"a.weight": ("F6_E3M2", (4, 4), bytes(12))}, None, ["a.weight", "F6_E3M2", "dequantize it first"]),
    ("fp8 no scale", {"a.weight": W8}, None, ["a.weight", "no scale tensor", "a.weight_scale_inv", "dequantize it first"]),
    ("fp8 scale of bad shape", {"a.weight": W8, "a.weight_scale_inv": f32(np.ones((2, 3)))}, None,
     ["a.weight_scale_inv", "does not fit"]),
    ("fp8 scale of bad dtype", {"a.weight": W8, "a.weight_scale": ("I32", (), np.zeros((), np.int32))}, None,
     ["a.weight_scale", "I32"]),
    ("gptq names", {"l.qweight": I32(4, 8), "l.qzeros": I32(1, 8), "l.scales": ("F16", (1, 64), np.zeros((1, 64), np.float16)),
                    "l.g_idx": I32(32)}, None, ["GPTQ/AWQ", "dequantize it first", "save_pretrained in bf16"]),
    ("gptq config", {"a.weight": f32(np.ones((4, 4)))}, {"quantization_config": {"quant_method": "gptq", "bits": 4}},
     ["GPTQ", "dequantize it first"]),
    ("awq config", {"a.weight": f32(np.ones((4, 4)))}, {"quantization_config": {"quant_method": "awq"}},
     ["AWQ", "dequantize it first"]),
    ("bnb 4-bit", {"l.weight": U8(8, 1), "l.weight.absmax": f32(np.ones(1)), "l.weight.quant_map": f32(np.ones(16)),
                   "l.weight.quant_state.bitsandbytes__nf4": U8(64)}, None, ["bitsandbytes 4-bit", "dequantize it first"]),
    ("bnb 8-bit", {"l.weight": ("I8", (4, 4), np.zeros((4, 4), np.int8)), "l.SCB": f32(np.ones(4))}, None,
     ["bitsandbytes 8-bit", "dequantize it first"]),
    ("bnb config", {"a.weight": f32(np.ones((4, 4)))},
     {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}, ["bitsandbytes", "dequantize it first"]),
    ("int8 weight scale", {"a.weight": ("I8", (4, 4), np.zeros((4, 4), np.int8)), "a.weight_scale": f32(np.ones((4, 1)))},
     None, ["a.weight_scale", "not FP8", "dequantize it first"]),
    ("nvfp4", {"a.weight": U8(4, 16), "a.weight_scale": ("F8_E4M3", (4, 2), np.zeros((4, 2), np.uint8)),
               "a.weight_scale_2": f32(np.ones(()))}, None, ["NVFP4", "dequantize it first"]),
    ("fp8 scale tensor", {"a.weight": U8(4, 16), "a.weight_scale": ("F8_E4M3", (4, 2), np.zeros((4, 2), np.uint8))},
     None, ["a.weight_scale", "F8_E4M3 scale tensor", "dequantize it first"]),
    ("ct packed int4", {"a.weight_packed": I32(4, 4), "a.weight_scale": f32(np.ones((4, 1))), "a.weight_shape": I32(2)}, None,
     ["compressed-tensors packed-integer", "dequantize it first"]),
    ("fp8 bad block size", {"a.weight": W8, "a.weight_scale_inv": f32(np.ones((1, 1)))},
     {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 0]}}, ["weight_block_size", "fix the config"]),
    ("mxfp4 shapes", {"x_blocks": U8(2, 3, 16), "x_scales": U8(2, 4)}, None, ["x_blocks", "do not fit"]),
    ("mxfp4 no scales", {"x_blocks": U8(2, 3, 16)}, {"quantization_config": {"quant_method": "mxfp4"}},
     ["x_blocks", "without x_scales"]),
])
def test_refusals_are_one_clear_line(tmp_path, case, tensors, config, needles):
    d = _one(tmp_path, tensors, config)
    out = tmp_path / "o.orkpack"
    line = refused(["build", d, "-o", out, "--no-plan"], out, needles[0])
    for nd in needles:
        assert nd in line, (case, line)
    assert "model.safetensors" in line or "config.json" in line, line


def test_activation_scales_are_dropped_and_recorded(tmp_path):
    fq, _ = fp8_llama(tmp_path)
    with open_source(fq) as src:
        names = {i.source_name for i in src.tensors()}
        skipped = [s.name for s in src.skipped()]
    assert not any(n.endswith(("input_scale", "_scale_inv")) for n in names)
    assert len(skipped) == 14 and all(s.endswith(".input_scale") for s in skipped)
    r = cli("build", fq, "-o", tmp_path / "q.orkpack", "--no-plan")
    assert r.exit_code == 0, r.output
    with Pack.open(tmp_path / "q.orkpack") as p:
        rec = json.dumps(p.header.get("provenance", {}))
    assert "model.layers.0.self_attn.q_proj.input_scale" in rec


# -- hostile headers: SourceError or a clean read, nothing else ------------------------

def test_hostile_quantized_headers_never_crash(tmp_path_factory):
    """Random mixes of FP8 weights, scales of any shape and dtype, MXFP4 blocks/scales and E8M0 tensors."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from orkpack.errors import SourceError

    dims = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)
    names = st.sampled_from(["a.weight", "a.weight_scale_inv", "a.weight_scale", "a.input_scale", "a_blocks",
                             "a_scales", "b.weight", "b.weight_scale", "c_blocks", "c_scales"])
    dtypes = st.sampled_from(["F8_E4M3", "F8_E5M2FNUZ", "F8_E8M0", "U8", "F32", "BF16", "F16", "I32"])
    size = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4}
    tensors = st.dictionaries(names, st.tuples(dtypes, dims, st.binary(min_size=0, max_size=1)), max_size=6)
    cfg = st.sampled_from([None, {"quantization_config": {"quant_method": "mxfp4"}},
                           {"quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 3]}}])
    folder = tmp_path_factory.mktemp("hostile")

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(tensors, cfg)
    def run(ts, config):
        d = folder / "m"
        t = {}
        for name, (dt, shape, seed) in ts.items():
            n = math.prod(shape) * size.get(dt, 1)
            t[name] = (dt, shape, bytes((seed[0] if seed else 0x38) for _ in range(n)))
        write_st(d / "model.safetensors", t)
        (d / "config.json").unlink(missing_ok=True)
        if config is not None:
            (d / "config.json").write_text(json.dumps(config))
        try:
            with open_source(d) as src:
                for info in src.tensors():
                    a = src.read(info.name)
                    assert a.shape == info.shape
        except SourceError as e:
            assert "\n" not in str(e)

    run()
