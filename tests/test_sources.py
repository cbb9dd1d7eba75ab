"""Readers, name normalization, config facts, bad input, bounded memory."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import gguf
import numpy as np
import pytest

from orkpack.errors import SourceError
from orkpack.sources import as_float32, canonical_name, model_facts, normalize_name, open_source, split_expert
from orkpack.sources.gguf import DEQUANT_TYPES, LossyDequantWarning
from orkpack.sources.names import natural_key
from orkpack.synth import _values, write_gguf_model, write_hf_model

# ---------------------------------------------------------------- names

# (arch, HF name, GGUF name): real names from the models' safetensors indexes
NAME_CASES = [
    ("llama", "model.embed_tokens.weight", "token_embd.weight"),
    ("llama", "lm_head.weight", "output.weight"),
    ("llama", "model.norm.weight", "output_norm.weight"),
    ("llama", "model.layers.31.self_attn.q_proj.weight", "blk.31.attn_q.weight"),
    ("llama", "model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight"),
    ("llama", "model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight"),
    ("llama", "model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"),
    ("llama", "model.layers.7.mlp.gate_proj.weight", "blk.7.ffn_gate.weight"),
    ("llama", "model.layers.7.mlp.up_proj.weight", "blk.7.ffn_up.weight"),
    ("llama", "model.layers.7.mlp.down_proj.weight", "blk.7.ffn_down.weight"),
    ("llama", "model.layers.7.input_layernorm.weight", "blk.7.attn_norm.weight"),
    ("llama", "model.layers.7.post_attention_layernorm.weight", "blk.7.ffn_norm.weight"),
    ("mistral", "model.layers.12.self_attn.q_proj.weight", "blk.12.attn_q.weight"),
    ("mistral", "model.layers.12.mlp.down_proj.weight", "blk.12.ffn_down.weight"),
    ("qwen2", "model.layers.27.self_attn.q_proj.bias", "blk.27.attn_q.bias"),
    ("qwen2", "model.layers.27.self_attn.v_proj.bias", "blk.27.attn_v.bias"),
    ("qwen2", "model.embed_tokens.weight", "token_embd.weight"),
    ("qwen3", "model.layers.35.self_attn.q_norm.weight", "blk.35.attn_q_norm.weight"),
    ("qwen3", "model.layers.35.self_attn.k_norm.weight", "blk.35.attn_k_norm.weight"),
    ("qwen3", "model.layers.35.mlp.up_proj.weight", "blk.35.ffn_up.weight"),
    ("qwen3_moe", "model.layers.47.mlp.gate.weight", "blk.47.ffn_gate_inp.weight"),
    ("qwen3_moe", "model.layers.47.mlp.experts.127.gate_proj.weight", "blk.47.ffn_gate.127.weight"),
    ("qwen3_moe", "model.layers.3.mlp.experts.0.up_proj.weight", "blk.3.ffn_up.0.weight"),
    ("qwen3_moe", "model.layers.3.mlp.experts.5.down_proj.weight", "blk.3.ffn_down.5.weight"),
    ("qwen3_moe", "model.layers.3.self_attn.k_norm.weight", "blk.3.attn_k_norm.weight"),
    ("mixtral", "model.layers.31.block_sparse_moe.gate.weight", "blk.31.ffn_gate_inp.weight"),
    ("mixtral", "model.layers.31.block_sparse_moe.experts.7.w1.weight", "blk.31.ffn_gate.7.weight"),
    ("mixtral", "model.layers.31.block_sparse_moe.experts.7.w2.weight", "blk.31.ffn_down.7.weight"),
    ("mixtral", "model.layers.31.block_sparse_moe.experts.7.w3.weight", "blk.31.ffn_up.7.weight"),
    ("mixtral", "model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight"),
]


@pytest.mark.parametrize("arch,hf,gg", NAME_CASES)
def test_names_both_directions(arch, hf, gg):
    n = 128 if arch == "qwen3_moe" else 64
    assert canonical_name(hf, arch, n) == gg
    assert normalize_name(hf, arch, n) == gg
    assert normalize_name(gg, arch, n) == gg  # GGUF form passes through


def test_stacked_and_unknown_names():
    assert split_expert("blk.3.ffn_down.5.weight") == ("blk.3.ffn_down_exps.weight", 5)
    assert split_expert("blk.3.ffn_down.weight") is None
    assert normalize_name("blk.3.ffn_gate_exps.weight", "qwen3_moe", 4) == "blk.3.ffn_gate_exps.weight"
    assert canonical_name("model.layers.0.weird_thing.weight", "llama", 4) == "model.layers.0.weird_thing.weight"
    assert canonical_name("model.layers.0.self_attn.q_proj.weight", "nosuch", 4) == "model.layers.0.self_attn.q_proj.weight"
    # q_norm is not a llama tensor: kept
    assert canonical_name("model.layers.0.self_attn.q_norm.weight", "qwen2", 4) == "model.layers.0.self_attn.q_norm.weight"


def test_natural_order():
    names = ["blk.10.attn_q.weight", "blk.2.attn_q.weight", "blk.1.attn_q.weight", "output.weight"]
    assert sorted(names, key=natural_key) == ["blk.1.attn_q.weight", "blk.2.attn_q.weight",
                                              "blk.10.attn_q.weight", "output.weight"]


# ---------------------------------------------------------------- reading

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    write_hf_model(d / "hf", layers=12, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=96, shards=3)
    write_gguf_model(d / "m.gguf", layers=12, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=96,
                     tensor_type="BF16")
    return d


def test_hf_folder_listing_and_order(models):
    src = open_source(models / "hf")
    infos = src.tensors()
    names = [t.name for t in infos]
    assert names == sorted(names, key=natural_key)
    assert names.index("blk.2.attn_q.weight") < names.index("blk.10.attn_q.weight")
    assert len(src.files) == 3 and src.kind == "safetensors" and src.arch == "llama"
    q = next(t for t in infos if t.name == "blk.10.attn_q.weight")
    assert q.source_name == "model.layers.10.self_attn.q_proj.weight"
    assert q.shape == (64, 64) and q.dtype == "BF16" and q.nbytes == 64 * 64 * 2
    assert q.file.startswith("model-0000")
    src.close()


def test_bf16_exact_and_owned(models):
    src = open_source(models / "hf")
    a = src.read("blk.3.ffn_down.weight")
    assert a.dtype == np.uint16 and a.shape == (64, 128)
    assert np.array_equal(a, _values(0, "blk.3.ffn_down.weight", (64, 128), "w"))
    assert a.flags.writeable and a.flags.c_contiguous
    a[:] = 0  # the caller owns it: a second read is unaffected
    assert np.array_equal(src.read("blk.3.ffn_down.weight"), _values(0, "blk.3.ffn_down.weight", (64, 128), "w"))
    src.close()


def test_bf16_matches_torch(models):
    pytest.importorskip("torch", reason="torch is the independent BF16 oracle")
    from safetensors import safe_open

    src = open_source(models / "hf")
    t = next(t for t in src.tensors() if t.name == "token_embd.weight")
    with safe_open(str(models / "hf" / t.file), framework="pt") as f:
        ref = f.get_tensor(t.source_name).float().numpy()
    assert np.array_equal(as_float32(src.read(t.name)), ref)


def test_single_file_and_unindexed_folder(tmp_path, models):
    write_hf_model(tmp_path / "one", shards=1)
    assert sorted(os.listdir(tmp_path / "one")) == ["config.json", "model.safetensors"]
    full = open_source(tmp_path / "one")
    single = open_source(tmp_path / "one" / "model.safetensors")
    assert [t.name for t in full.tensors()] == [t.name for t in single.tensors()]
    # no index, no config: every *.safetensors, names still canonical (guessed for naming only:
    # the source claims no architecture, so provenance records none)
    bare = tmp_path / "bare"
    bare.mkdir()
    for p in (models / "hf").glob("*.safetensors"):
        (bare / p.name).write_bytes(p.read_bytes())
    a, b = open_source(bare), open_source(models / "hf")
    assert a.config is None and a.arch is None
    assert [(t.name, t.shape) for t in a.tensors()] == [(t.name, t.shape) for t in b.tensors()]


def test_gguf_numpy_order_and_values(models):
    src = open_source(models / "m.gguf")
    hf = open_source(models / "hf")
    r = gguf.GGUFReader(models / "m.gguf")
    ggml = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}
    for t in src.tensors():
        assert t.shape == tuple(reversed(ggml[t.name]))
    assert [(t.name, t.shape) for t in src.tensors()] == [(t.name, t.shape) for t in hf.tensors()]
    for t in src.tensors():
        assert np.array_equal(as_float32(src.read(t.name)), as_float32(hf.read(t.name))), t.name
    assert src.read("blk.0.attn_norm.weight").dtype == np.float32  # 1-D stays F32 in GGUF
    assert src.read("blk.0.attn_q.weight").dtype == np.uint16  # BF16 bits


def test_stacked_experts_keep_axis(tmp_path):
    kw = dict(arch="qwen3_moe", layers=2, hidden=64, intermediate=32, heads=2, kv_heads=1, vocab=64,
              experts=4, experts_used=2)
    write_hf_model(tmp_path / "hf", shards=3, **kw)
    write_gguf_model(tmp_path / "m.gguf", tensor_type="F32", **kw)
    a, b = open_source(tmp_path / "hf"), open_source(tmp_path / "m.gguf")
    info = {t.name: t for t in a.tensors()}
    g = info["blk.1.ffn_gate_exps.weight"]
    assert g.shape == (4, 32, 64) and g.source_name == "model.layers.1.mlp.experts.*.gate_proj.weight"
    assert info["blk.1.ffn_down_exps.weight"].shape == (4, 64, 32)
    assert info["blk.1.ffn_gate_inp.weight"].shape == (4, 64)
    x = a.read("blk.1.ffn_up_exps.weight")
    assert np.array_equal(x[2], _values(0, "blk.1.ffn_up_exps.weight#2", (32, 64), "w"))
    assert np.array_equal(as_float32(x), b.read("blk.1.ffn_up_exps.weight"))


def test_quantized_gguf_warns_once(tmp_path):
    write_gguf_model(tmp_path / "q.gguf", layers=1, hidden=64, intermediate=64, vocab=64, tensor_type="Q8_0")
    assert "Q8_0" in DEQUANT_TYPES and "Q4_K" in DEQUANT_TYPES
    msgs: list[str] = []
    src = open_source(tmp_path / "q.gguf", on_warning=msgs.append)
    infos = src.tensors()
    assert any(t.dtype == "Q8_0" for t in infos)
    for t in infos:
        a = src.read(t.name)
        assert a.shape == t.shape and a.dtype in (np.float32, np.float16)
    assert len(msgs) == 1 and "loses accuracy" in msgs[0]
    src2 = open_source(tmp_path / "q.gguf")
    with pytest.warns(LossyDequantWarning) as rec:
        for t in infos:
            src2.read(t.name)
    assert len(rec) == 1


# ---------------------------------------------------------------- config facts

REAL_CONFIGS = {
    "Qwen2.5-7B": ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                    "tie_word_embeddings": False},
                   dict(arch="qwen2", n_layers=28, head_dim=128, kv_heads=4, n_experts=0, tie_word_embeddings=False)),
    "Qwen3-30B-A3B": ({"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                       "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                       "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                       "vocab_size": 151936, "tie_word_embeddings": False},
                      dict(arch="qwen3_moe", head_dim=128, n_experts=128, n_experts_used=8, moe_intermediate=768,
                           intermediate=6144)),
    "Mixtral-8x7B": ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                      "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                      "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000},
                     dict(arch="mixtral", n_experts=8, n_experts_used=2, moe_intermediate=14336, head_dim=128,
                          tie_word_embeddings=False)),
    "Llama-3.2-1B": ({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
                      "tie_word_embeddings": True},
                     dict(arch="llama", head_dim=64, vocab=128256, tie_word_embeddings=True, moe_intermediate=0)),
    "Mistral-7B": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "vocab_size": 32768},
                   dict(arch="mistral", head_dim=128, kv_heads=8)),
    "Qwen3-8B": ({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
                 dict(arch="qwen3", n_layers=36, heads=32, hidden=4096)),
}


@pytest.mark.parametrize("model", sorted(REAL_CONFIGS))
def test_facts_from_hf_config(model):
    cfg, want = REAL_CONFIGS[model]
    f = model_facts(cfg)
    for k, v in want.items():
        assert f[k] == v, k


@pytest.mark.parametrize("kw", [
    dict(arch="llama"), dict(arch="qwen2", tied=True), dict(arch="qwen3"),
    dict(arch="qwen3_moe", experts=4, experts_used=2), dict(arch="mixtral", experts=4, experts_used=2),
])
def test_facts_hf_equal_gguf(tmp_path, kw):
    base = dict(layers=2, hidden=64, intermediate=96, heads=4, kv_heads=2, vocab=80)
    write_hf_model(tmp_path / "hf", **base, **kw)
    write_gguf_model(tmp_path / "m.gguf", **base, **kw)
    fa, fb = model_facts(tmp_path / "hf"), model_facts(tmp_path / "m.gguf")
    assert fa == fb
    assert fa["n_layers"] == 2 and fa["head_dim"] == 16 and fa["tie_word_embeddings"] == kw.get("tied", False)
    assert fa["n_experts"] == kw.get("experts", 0)


def test_facts_bad_config():
    with pytest.raises(SourceError, match="model_type"):
        model_facts({"model_type": "gpt2"})
    with pytest.raises(SourceError, match="hidden_size"):
        model_facts({"model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2})


# ---------------------------------------------------------------- bad input

def _err(path, match=None) -> str:
    with pytest.raises(SourceError) as ei:
        src = open_source(path)
        for t in src.tensors():
            src.read(t.name)
    msg = str(ei.value)
    assert "\n" not in msg and msg
    if match:
        assert match in msg, msg
    return msg


def _st_file(path: Path, header: dict, data: bytes, raw_len: int | None = None) -> Path:
    hb = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(hb) if raw_len is None else raw_len) + hb + data)
    return path


def test_bad_missing_path(tmp_path):
    msg = _err(tmp_path / "nope", "no such file")
    assert "nope" in msg


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads files whatever their mode")
def test_bad_unreadable(tmp_path):
    p = _st_file(tmp_path / "x.safetensors", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    p.chmod(0)
    _err(p, "x.safetensors")


def test_bad_unreadable_simulated(tmp_path, monkeypatch):
    # root can read anything: simulate EACCES on the weight file itself
    write_hf_model(tmp_path, shards=1)
    real_open = os.open

    def deny(path, *a, **k):
        if str(path).endswith(".safetensors"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", deny)
    msg = _err(tmp_path, "Permission denied")
    assert "model.safetensors" in msg


def test_bad_directory_named_like_file(tmp_path):
    d = tmp_path / "weird.safetensors"
    d.mkdir()  # a folder with no weights, named like a file
    _err(d, "no safetensors weights")


def test_bad_folder_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    _err(tmp_path, "holds no safetensors weights")
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    assert "model.gguf" in _err(tmp_path)


def test_bad_index_missing_shard(tmp_path):
    write_hf_model(tmp_path, shards=2)
    os.remove(tmp_path / "model-00002-of-00002.safetensors")
    msg = _err(tmp_path, "model-00002-of-00002.safetensors")
    assert "missing" in msg


def test_bad_index_wrong_shard(tmp_path):
    write_hf_model(tmp_path, shards=2)
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    k = next(iter(idx["weight_map"]))
    idx["weight_map"][k] = "model-00002-of-00002.safetensors" if idx["weight_map"][k].startswith("model-00001") \
        else "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    _err(tmp_path, k)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    _err(tmp_path, "index")


def test_bad_truncated_safetensors(tmp_path):
    write_hf_model(tmp_path / "m", shards=1)
    blob = (tmp_path / "m" / "model.safetensors").read_bytes()
    for cut in (0, 5, 8, 20, len(blob) // 2, len(blob) - 1):
        p = tmp_path / f"cut{cut}.safetensors"
        p.write_bytes(blob[:cut])
        _err(p, p.name)


def test_bad_garbage_safetensors(tmp_path):
    rng = np.random.default_rng(1)
    p = tmp_path / "g.safetensors"
    p.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _err(p, "g.safetensors")
    _st_file(p, {}, b"", raw_len=10**12)  # header length beyond the file and the cap
    _err(p, "header length")
    p.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    _err(p, "JSON")
    _st_file(p, [1, 2], b"")
    _err(p, "not a JSON object")


@pytest.mark.parametrize("entry,match", [
    ({"dtype": "F32", "shape": [4], "data_offsets": [0, 64]}, "outside the data section"),
    ({"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}, "outside the data section"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}, "do not hold"),
    ({"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 16]}, "do not hold"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 16]}, "bad shape"),
    ({"dtype": "F32", "shape": [4], "data_offsets": "x"}, "data_offsets"),
    ({"shape": [4], "data_offsets": [0, 16]}, "no dtype"),
    ({"dtype": "I64", "shape": [3], "data_offsets": [0, 16]}, "do not hold I64 (3,)"),  # raw types: sizes checked too
    ({"dtype": "X64", "shape": [2], "data_offsets": [0, 16]}, "X64 is not supported; supported: F32, F16, BF16, BOOL"),
    ({"dtype": "F8_E4M3", "shape": [16], "data_offsets": [0, 16]}, "F8_E4M3 weight with no scale tensor"),  # quantized.py
])
def test_bad_safetensors_entries(tmp_path, entry, match):
    p = _st_file(tmp_path / "e.safetensors", {"w": entry}, b"\0" * 16)
    msg = _err(p, match)
    assert "tensor w" in msg


def test_bad_duplicate_and_missing_expert(tmp_path):
    a = {"model.norm.weight": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    _st_file(tmp_path / "a.safetensors", a, b"\0" * 16)
    _st_file(tmp_path / "b.safetensors", a, b"\0" * 16)
    _err(tmp_path, "more than one shard")
    d = tmp_path / "moe"
    write_hf_model(d, arch="qwen3_moe", experts=3, experts_used=1, layers=1, hidden=32, intermediate=32, vocab=32,
                   shards=1)
    # drop expert 1 from the header by renaming it to expert 5
    p = d / "model.safetensors"
    blob = bytearray(p.read_bytes())
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = blob[8:8 + n].replace(b"experts.1.gate_proj", b"experts.5.gate_proj")
    p.write_bytes(bytes(blob[:8]) + hdr + bytes(blob[8 + n:]))
    _err(d, "expert 1 is missing")


def test_bad_config_json(tmp_path):
    write_hf_model(tmp_path, shards=1)
    (tmp_path / "config.json").write_text("{oops")
    _err(tmp_path, "config.json")


def test_bad_gguf_truncated(tmp_path):
    write_gguf_model(tmp_path / "m.gguf", layers=1, hidden=64, intermediate=64, vocab=64)
    blob = (tmp_path / "m.gguf").read_bytes()
    for cut in (0, 3, 4, 16, 24, 40, 200, 600, len(blob) // 2, len(blob) - 1):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(blob[:cut])
        _err(p, p.name)


def test_bad_gguf_garbage(tmp_path):
    rng = np.random.default_rng(2)
    p = tmp_path / "g.gguf"
    p.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    _err(p, "not a GGUF")
    for s in range(8):  # valid magic and version, then garbage
        r = np.random.default_rng(100 + s)
        p.write_bytes(b"GGUF" + struct.pack("<I", 3) + r.integers(0, 256, 2000, dtype=np.uint8).tobytes())
        _err(p, "g.gguf")
    # a valid header whose tensor table points past the end
    write_gguf_model(tmp_path / "m.gguf", layers=1, hidden=64, intermediate=64, vocab=64)
    blob = bytearray((tmp_path / "m.gguf").read_bytes())
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    f = r.tensors[-1].field
    off_pos = f.offset + sum(int(np.asarray(part).nbytes) for part in f.parts[:-1])
    blob[off_pos: off_pos + 8] = struct.pack("<Q", 1 << 40)
    del r
    (tmp_path / "m2.gguf").write_bytes(bytes(blob))
    _err(tmp_path / "m2.gguf", "m2.gguf")


def test_bad_gguf_unsupported_type(tmp_path):
    # I8..I64 and F64 are carried raw now (tests/test_raw_and_skipped.py); Q8_1 has no dequantizer
    p = tmp_path / "i.gguf"
    w = gguf.GGUFWriter(p, "llama")
    w.add_tensor("blk.0.idx.weight", np.zeros((2, 40), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    msg = _err(p, "Q8_1 is not supported; supported: F32, F16, BF16, I8")
    assert "blk.0.idx.weight" in msg and "Q4_K" in msg


def test_read_unknown_name(models):
    src = open_source(models / "hf")
    with pytest.raises(SourceError, match="no tensor"):
        src.read("blk.99.attn_q.weight")
    g = open_source(models / "m.gguf")
    with pytest.raises(SourceError, match="no tensor"):
        g.read("nope")


# ---------------------------------------------------------------- bounded memory

_RSS_CHILD = textwrap.dedent("""
    import json, sys, resource
    from orkpack.sources import open_source

    def kb(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return None

    src = open_source(sys.argv[1])
    infos = src.tensors()
    largest = max(t.numel * (4 if t.dtype not in ("F16", "BF16") else 2) for t in infos)
    base = kb("VmRSS")
    total = 0
    for _ in range(3):
        for t in infos:
            a = src.read(t.name)
            total += a.nbytes
            del a
    peak = kb("VmHWM")
    if base is None or peak is None:  # no /proc: ru_maxrss (kB on Linux) against the start
        base, peak = 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"growth": (peak - base) * 1024, "largest": largest, "total": total}))
""")


@pytest.mark.parametrize("kind", ["hf", "gguf"])
def test_peak_rss_bounded(tmp_path, kind):
    kw = dict(layers=10, hidden=1024, intermediate=2048, heads=8, kv_heads=8, vocab=2048)
    path = write_hf_model(tmp_path / "hf", shards=4, **kw) if kind == "hf" else \
        write_gguf_model(tmp_path / "m.gguf", tensor_type="F16", **kw)
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(path)], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    bound = 3 * r["largest"] + 64 * 2**20
    assert r["total"] > 2 * bound  # the model really is larger than the bound: loading it all would fail
    assert r["growth"] < bound, r


def _big_endian_gguf(p: Path) -> None:
    w = gguf.GGUFWriter(p, "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    w.add_float64("x.f64", 1.25)
    w.add_tensor("blk.0.attn_q.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_header_reader_is_gguf_pys(tmp_path, models):
    """GGUFSource's header parse (sources/gguf.py _HeaderReader: gguf-py's GGUFReader on a plain view of its map)
    gives gguf-py's own fields and tensor table, part by part and byte by byte: a synthetic GGUF, a big-endian one,
    and the real SmolLM2 (49k tokens, merges) when installed."""
    from orkpack.sources.gguf import GGUFSource, _HeaderReader

    from test_eval_tokenizer import real_smollm2

    _big_endian_gguf(tmp_path / "be.gguf")
    paths = [models / "m.gguf", tmp_path / "be.gguf"]
    try:
        paths.append(real_smollm2())
    except BaseException:  # not installed (pytest.skip): the synthetic files alone
        pass
    for p in paths:
        ours, theirs = _HeaderReader(p), gguf.GGUFReader(p)
        assert ours.byte_order == theirs.byte_order and ours.data_offset == theirs.data_offset
        assert list(ours.fields) == list(theirs.fields)
        for key, f in theirs.fields.items():
            g = ours.fields[key]
            assert (g.offset, g.name, g.types, g.data) == (f.offset, f.name, f.types, f.data), key
            assert len(g.parts) == len(f.parts), key
            for a, b in zip(g.parts, f.parts):
                assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), key
            assert repr(g.contents()) == repr(f.contents()), key
        assert [(t.name, t.tensor_type, t.shape.tolist(), t.n_elements, t.n_bytes, t.data_offset)
                for t in ours.tensors] == [(t.name, t.tensor_type, t.shape.tolist(), t.n_elements, t.n_bytes,
                                            t.data_offset) for t in theirs.tensors]
        del ours, theirs
    src = GGUFSource(tmp_path / "be.gguf")
    assert src.metadata["tokenizer.ggml.tokens"] == ["a", "bb", "ccc"] and src.metadata["x.f64"] == 1.25
    assert [(t.name, t.shape) for t in src.tensors()] == [("blk.0.attn_q.weight", (2, 4))]
    src.close()
