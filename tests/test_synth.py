"""The synthetic-model writers: determinism, realism, HF <-> GGUF agreement."""
from __future__ import annotations

import hashlib
import json

import gguf
import numpy as np
import pytest

from orkpack.sources import as_float32, model_facts, open_source
from orkpack.synth import write_gguf_model, write_hf_model

SMALL = dict(layers=2, hidden=64, intermediate=96, heads=4, kv_heads=2, vocab=80)
ARCHS = [
    dict(arch="llama"), dict(arch="mistral"), dict(arch="qwen2"), dict(arch="qwen3", tied=True),
    dict(arch="qwen3_moe", experts=4, experts_used=2), dict(arch="mixtral", experts=3, experts_used=2),
]


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_deterministic_bytes(tmp_path):
    for name in ("a", "b"):
        write_hf_model(tmp_path / name, seed=7)
        write_gguf_model(tmp_path / f"{name}.gguf", seed=7, tensor_type="Q8_0")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    write_hf_model(tmp_path / "c", seed=8)
    assert _digest(tmp_path / "c")["config.json"] == _digest(tmp_path / "a")["config.json"]
    assert _digest(tmp_path / "c") != _digest(tmp_path / "a")


@pytest.mark.parametrize("kw", ARCHS, ids=[k["arch"] for k in ARCHS])
@pytest.mark.parametrize("hf_dtype,gguf_type", [("bf16", "BF16"), ("bf16", "F32"), ("f32", "BF16")])
def test_hf_and_gguf_identical(tmp_path, kw, hf_dtype, gguf_type):
    write_hf_model(tmp_path / "hf", dtype=hf_dtype, shards=3, seed=3, **SMALL, **kw)
    write_gguf_model(tmp_path / "m.gguf", tensor_type=gguf_type, seed=3, **SMALL, **kw)
    a, b = open_source(tmp_path / "hf"), open_source(tmp_path / "m.gguf")
    ta, tb = a.tensors(), b.tensors()
    assert [(t.name, t.shape) for t in ta] == [(t.name, t.shape) for t in tb]
    assert not any(t.name.startswith("model.") for t in ta)  # every HF name was mapped
    for t in ta:
        assert np.array_equal(as_float32(a.read(t.name)), as_float32(b.read(t.name))), t.name


def test_f16_and_quantized_close(tmp_path):
    write_hf_model(tmp_path / "hf", **SMALL)
    ref = open_source(tmp_path / "hf")
    for tt, tol in (("F16", 1e-3), ("Q8_0", 1e-2), ("Q4_0", 0.2)):
        write_gguf_model(tmp_path / f"{tt}.gguf", tensor_type=tt, **SMALL)
        src = open_source(tmp_path / f"{tt}.gguf", on_warning=lambda m: None)
        for t in ref.tensors():
            x, r = as_float32(src.read(t.name)), as_float32(ref.read(t.name))
            err = np.abs(x - r).max() / max(np.abs(r).max(), 1e-30)
            assert err <= tol, (tt, t.name, err)
            if tt == "F16":  # F16 is the bf16 value rounded once more
                assert np.array_equal(src.read(t.name), r.astype(np.float16))


def test_hf_layout_and_names(tmp_path):
    write_hf_model(tmp_path, arch="qwen3_moe", experts=4, experts_used=2, shards=3, **SMALL)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["config.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                     "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    wm = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    for n in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
              "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.q_norm.weight",
              "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
              "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.3.down_proj.weight"):
        assert n in wm, n
    # the safetensors library reads every shard we wrote
    from safetensors import safe_open

    seen = set()
    for f in sorted(set(wm.values())):
        with safe_open(str(tmp_path / f), framework="np") as st:
            seen |= set(st.keys())
    assert seen == set(wm)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_moe" and cfg["num_experts"] == 4 and cfg["torch_dtype"] == "bfloat16"
    f = model_facts(tmp_path)
    assert (f["n_experts"], f["n_experts_used"], f["moe_intermediate"], f["hidden"]) == (4, 2, 96, 64)


def test_f16_safetensors_matches_library(tmp_path):
    from safetensors import safe_open

    write_hf_model(tmp_path, dtype="f16", shards=1, **SMALL)
    src = open_source(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as st:
        for t in src.tensors():
            assert np.array_equal(src.read(t.name), st.get_tensor(t.source_name))


def test_gguf_layout(tmp_path):
    write_gguf_model(tmp_path / "m.gguf", arch="mixtral", experts=3, experts_used=2, tensor_type="F16", **SMALL)
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    ts = {t.name: t for t in r.tensors}
    Q = gguf.GGMLQuantizationType
    assert ts["blk.0.ffn_gate_exps.weight"].tensor_type == Q.F16
    assert tuple(int(d) for d in ts["blk.0.ffn_gate_exps.weight"].shape) == (64, 96, 3)  # ggml order
    assert ts["blk.0.attn_norm.weight"].tensor_type == Q.F32
    assert ts["blk.0.ffn_gate_inp.weight"].tensor_type == Q.F32
    assert r.fields["general.architecture"].contents() == "llama"
    assert int(r.fields["llama.expert_count"].contents()) == 3


def test_weights_heavy_tailed(tmp_path):
    write_hf_model(tmp_path, layers=1, hidden=256, intermediate=512, shards=1)
    src = open_source(tmp_path)
    x = as_float32(src.read("blk.0.ffn_up.weight")).astype(np.float64).ravel()
    z = (x - x.mean()) / x.std()
    assert (z ** 4).mean() > 6  # a Gaussian gives 3
    assert 0.01 < x.std() < 0.04 and np.abs(x).max() >= 0.2
    n = as_float32(src.read("blk.0.attn_norm.weight"))
    assert abs(float(n.mean()) - 1) < 0.05


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        write_hf_model(tmp_path, arch="gpt2")
    with pytest.raises(ValueError):
        write_hf_model(tmp_path, arch="qwen3_moe")  # needs experts
    with pytest.raises(ValueError):
        write_hf_model(tmp_path, dtype="f8")
    with pytest.raises(ValueError):
        write_gguf_model(tmp_path / "x.gguf", tensor_type="Q2_K")
    # experts on the default arch: qwen3_moe-style
    write_hf_model(tmp_path / "moe", experts=2, experts_used=1, **SMALL)
    assert model_facts(tmp_path / "moe")["arch"] == "qwen3_moe"
