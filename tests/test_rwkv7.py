"""RWKV7 (fla-hub's RWKV7ForCausalLM) end to end, against llama.cpp's converter and llama.cpp's own forward pass.

transformers has no RWKV7 class, so the tiny checkpoint is written directly: seeded numpy arrays under fla-hub's
tensor names (model.layers.N.attn.x_r, w_lora.lora.0.weight, ...; layer 0 without a value LoRA) in a safetensors
file, fla-hub's config.json keys, and a tiny world vocabulary (rwkv_vocab_v20230424.txt: one line per token, its
Python literal and its byte length, as Rwkv7Model.set_vocab reads it). llama.cpp's own ``convert_hf_to_gguf.py
--outtype f32`` (the copy vendored in llama-cpp-python 0.3.36) converts it. Then, tensor for tensor, orkpack's readers
of the folder and of the converter's GGUF give the converter's names, shapes and values; the model record its
rwkv7.* keys; the build, verify and eval run from both sources.

THE EVAL ORACLE IS LLAMA.CPP'S FORWARD PASS, not transformers': the logits of the converter's GGUF computed by
llama.cpp's CPU backend (libllama built from the vendored source by scripts/build_llama_cpp.sh, called through
tests/oracle/logits.c, compiled here). Without that build (or a C compiler) the oracle test skips and says why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orkpack import archs, keepfloat
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.tiers.manifest import manifest_from_config

from test_lfm2 import (FIXTURES, LLAMA_CPP, _RUN_CONVERTER, _converter, build_verify_eval, record_matches_converter,
                       tensors_match_converter)

T = 40
VOCAB = 320  # <s>, the 256 byte tokens of the vocabulary file, 63 [PAD] (the converter pads to vocab_size)
CONFIG = {"architectures": ["RWKV7ForCausalLM"], "model_type": "rwkv7", "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 3, "head_dim": 64, "decay_low_rank_dim": 32, "a_low_rank_dim": 32,
          "v_low_rank_dim": 16, "gate_low_rank_dim": 32, "norm_eps": 1e-5, "norm_first": True, "norm_bias": True,
          "hidden_act": "sqrelu", "hidden_ratio": 2.0, "vocab_size": VOCAB, "max_position_embeddings": 2048,
          "tie_word_embeddings": False, "torch_dtype": "float32"}
BUILD = LLAMA_CPP / "build"


def _tensors(cfg: dict, rng: np.random.Generator) -> dict:
    """fla-hub's tensors of a checkpoint of ``cfg``, seeded: matrices at unit gain, norm gains and k_k / k_a near 1,
    token-shift lerps in [0, 1], LoRA biases and r_k of a few tenths."""
    H, I, V, hs = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    r = {"w": cfg["decay_low_rank_dim"], "a": cfg["a_low_rank_dim"], "v": cfg["v_low_rank_dim"],
         "g": cfg["gate_low_rank_dim"]}
    mat = lambda n, k: (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)  # noqa: E731
    gain = lambda *s: (1 + 0.2 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    small = lambda *s: (0.3 * rng.standard_normal(s)).astype(np.float32)  # noqa: E731
    out = {"model.embeddings.weight": rng.standard_normal((V, H)).astype(np.float32),
           "model.layers.0.pre_norm.weight": gain(H), "model.layers.0.pre_norm.bias": small(H),
           "model.norm.weight": gain(H), "model.norm.bias": small(H), "lm_head.weight": mat(V, H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n in ("attn_norm", "ffn_norm", "attn.g_norm"):
            out[p + n + ".weight"], out[p + n + ".bias"] = gain(H), small(H)
        for c in "rwkvag":
            out[p + f"attn.x_{c}"] = rng.uniform(0, 1, (1, 1, H)).astype(np.float32)
        out[p + "attn.k_k"], out[p + "attn.k_a"] = gain(1, 1, H), gain(1, 1, H)
        out[p + "attn.r_k"] = small(H // hs, hs)
        for c in "rkvo":
            out[p + f"attn.{c}_proj.weight"] = mat(H, H)
        for c in "wavg":
            if c == "v" and i == 0:
                continue  # fla-hub: layer 0's values are the residual, it has no value LoRA
            out[p + f"attn.{c}_lora.lora.0.weight"] = mat(r[c], H)
            out[p + f"attn.{c}_lora.lora.2.weight"] = mat(H, r[c])
            if c != "g":
                out[p + f"attn.{c}_lora.lora.2.bias"] = small(H)
        out[p + "ffn.x_k"] = rng.uniform(0, 1, (H,)).astype(np.float32)
        out[p + "ffn.key.weight"], out[p + "ffn.value.weight"] = mat(I, H), mat(H, I)
    return out


def write_rwkv7(folder: Path, cfg: dict = CONFIG, seed: int = 0) -> Path:
    """A seeded tiny RWKV7 checkpoint in fla-hub's format (safetensors, config.json, world vocabulary)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(_tensors(cfg, np.random.default_rng(seed)), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    # ids 1..256: every byte, as the released file writes bytes that are not UTF-8 (a bytes literal)
    (folder / "rwkv_vocab_v20230424.txt").write_text(
        "".join(f"{i + 1} {bytes([i])!r} 1\n" for i in range(256)), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(HF folder, the converter's GGUF, token ids)."""
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {LLAMA_CPP} (scripts/test.sh unpacks it; or set ORKPACK_LLAMA_CPP)")
    pytest.importorskip("torch", reason="llama.cpp's converter needs torch (test extra)")
    root = tmp_path_factory.mktemp("rwkv7")
    hf, gg = write_rwkv7(root / "hf"), root / "conv.gguf"
    env = dict(os.environ, PYTHONPATH=str(LLAMA_CPP / "gguf-py"))
    r = subprocess.run([sys.executable, "-c", _RUN_CONVERTER, str(LLAMA_CPP), str(hf), "--outtype", "f32",
                        "--outfile", str(gg)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return hf, gg, np.random.default_rng(2).integers(0, VOCAB, T)


def test_tensors_equal_the_converters(model):
    hf, gg, _ = model
    conv, _ = _converter(gg)
    # 6 top + 28 a layer (layer 0's v0/v1/v2: its a0/a1/a2 written again, it has no value LoRA of its own)
    assert len(conv) == 6 + 3 * 28
    tensors_match_converter(hf, gg, conv)
    assert conv["blk.1.time_mix_lerp_fused.weight"][0] == (128, 1, 1, 6)  # ggml order: r w k v a g along the last
    assert conv["blk.0.time_mix_w1.weight"][0] == (128, 32) and conv["blk.0.time_mix_r_k.weight"][0] == (128,)
    assert np.array_equal(conv["blk.0.time_mix_v1.weight"][1], conv["blk.0.time_mix_a1.weight"][1])
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}
        assert info["blk.0.time_mix_v2.weight"].source_name == "model.layers.0.attn.a_lora.lora.2.weight"
        assert info["blk.2.time_mix_lerp_fused.weight"].source_name.split("+")[0] == "model.layers.2.attn.x_r"
    finally:
        src.close()


def test_model_record_has_the_converters_keys(model):
    hf, gg, _ = model
    theirs = record_matches_converter(hf, gg, "rwkv7", (
        "wkv.head_size", "attention.decay_lora_rank", "attention.iclr_lora_rank",
        "attention.value_residual_mix_lora_rank", "attention.gate_lora_rank", "feed_forward_length",
        "attention.layer_norm_epsilon", "context_length"))
    assert theirs["rwkv7.context_length"][2] == 1048576 and theirs["rwkv7.attention.head_count"][2] == 0


def test_facts_from_the_folder_and_the_converters_gguf_agree(model):
    hf, gg, _ = model
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    # every layer recurrent: two token shifts (2 x 128) and the wkv state (128 x 64) per layer, no KV cache
    assert a["recurrent_layers"] == [0, 1, 2] and a["state"] == 2 * 128 + 128 * 64 and a["kv_k"] == 0


def _oracle(gg: Path, ids, tmp: Path) -> np.ndarray:
    """llama.cpp's CPU logits (T, vocab) of the GGUF ``gg`` on ``ids`` (tests/oracle/logits.c against libllama)."""
    if not (BUILD / "orkpack-build.ok").is_file() or not (BUILD / "bin").is_dir():
        pytest.skip(f"llama.cpp's runtime is not built in {BUILD} (scripts/test.sh builds it with "
                    "scripts/build_llama_cpp.sh; it needs cmake)")
    cc = next((c for c in ("cc", "gcc", "clang") if subprocess.run(["sh", "-c", f"command -v {c}"],
                                                                    capture_output=True).returncode == 0), None)
    if cc is None:
        pytest.skip("no C compiler for tests/oracle/logits.c")
    exe, lib = tmp / "logits", BUILD / "bin"
    src = Path(__file__).parent / "oracle" / "logits.c"
    r = subprocess.run([cc, "-O2", "-o", str(exe), str(src), f"-I{LLAMA_CPP / 'include'}",
                        f"-I{LLAMA_CPP / 'ggml' / 'include'}", f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                        f"-Wl,-rpath,{lib}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp / "logits.f32"
    r = subprocess.run([str(exe), str(gg), str(out), *map(str, ids)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


# llama.cpp's f32 CPU numerics against this float32 numpy reference, measured on this model (see the test)
ORACLE_TOL = 1e-4


def test_logits_match_llama_cpps_forward_from_folder_and_converter_gguf(model, tmp_path):
    """The reference forward pass (orkpack.model) from the folder and from the converter's GGUF against llama.cpp's
    CPU forward of that GGUF: within ORACLE_TOL of the largest logit."""
    from orkpack.model import logits

    hf, gg, ids = model
    ref = _oracle(gg, ids, tmp_path)
    assert ref.shape == (T, VOCAB) and np.isfinite(ref).all()
    scale = float(np.abs(ref).max())
    for path in (hf, gg):
        err = float(np.abs(logits(path, ids) - ref).max())
        assert err <= ORACLE_TOL * scale, (path.name, err, scale)


def test_build_verify_eval(model, tmp_path):
    hf, gg, _ = model
    tokens = tmp_path / "ids.json"
    tokens.write_text(json.dumps([int(x) for x in np.random.default_rng(3).integers(1, 257, 256)]))
    build_verify_eval(hf, gg, tmp_path / "t.orkpack", eval_args=("--tokens", str(tokens), "--ctx", "128"))


def test_plan_published_configs():
    """fla-hub's RWKV7 1.5B and 2.9B world models: the published parameter counts exactly; every layer a recurrent
    state of 2 H + H x 64 float32 and no KV cache, whatever the context; the LoRA factors kept float."""
    for name, params, L, H in (("rwkv7", 1_527_404_544, 24, 2048), ("rwkv7_2_9b", 2_947_735_040, 32, 2560)):
        cfg = json.loads((FIXTURES / f"{name}.json").read_text())
        assert archs.param_count(cfg) == params, name
        m = manifest_from_config(cfg)
        assert m.facts["recurrent_layers"] == list(range(L)) and m.facts["state"] == 2 * H + H * 64
        for ctx in (512, 8192):
            assert m.kv_bytes(ctx) == L * (2 * H + H * 64) * 4
        # per layer: receptance, key, value, output, channel key, channel value; the two heads
        assert len(m.items) == 6 * L + 2
        loras = [t for t in m.floats if keepfloat.why_float(t.name, t.shape) == keepfloat.LORA]
        assert len(loras) == 8 * L  # w1 w2 a1 a2 v1 v2 g1 g2 (layer 0's v1/v2: the converter's copies of a1/a2)


def test_plan_command_runs_on_the_published_config():
    from orkpack.tiers.command import plan

    tm, _, (man, _, _) = plan(FIXTURES / "rwkv7.json", ctx=4096)
    assert tm.budget["ram"]["kv_cache"] == man.kv_bytes(4096) == 24 * (2 * 2048 + 2048 * 64) * 4
    fused = [d for d in tm.decisions if d.tensor.endswith("time_mix_lerp_fused.weight")]
    assert len(fused) == 24 and all(d.tier == "host" and d.shape == (6, 1, 1, 2048) for d in fused)


@pytest.mark.parametrize("over, key", [
    ({"head_dim": 48}, "does not divide 'hidden_size'"),
    ({"wkv_has_gate": False}, "'wkv_has_gate'"),
    ({"norm_first": False}, "'norm_first'"),
    ({"decay_low_rank_dim": -1}, "'decay_low_rank_dim'"),
])
def test_a_config_llama_cpp_cannot_run_is_one_line(over, key):
    with pytest.raises(SourceError) as e:
        manifest_from_config({**CONFIG, **over})
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg


def test_null_ranks_take_the_converters_defaults():
    """Rwkv7Model.calc_lora_rank: null ranks and width are derived from the hidden size as the converter derives them."""
    d = archs.dims({**CONFIG, "hidden_size": 2048, "decay_low_rank_dim": None, "a_low_rank_dim": None,
                    "v_low_rank_dim": None, "gate_low_rank_dim": None, "intermediate_size": None})
    assert (d["rw"], d["ra"], d["rv"], d["rg"], d["I"]) == (96, 96, 64, 256, 8192)
