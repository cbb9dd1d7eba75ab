"""Gemma 4 (``gemma4_text`` and the text model of a ``gemma4`` release) end to end, against llama.cpp's converter and
transformers.

A tiny random ``Gemma4ForCausalLM`` (seeded; hidden 64, 6 layers: sliding, sliding, full, sliding, sliding, full) with
every mechanism the family has: each layer type its own head size and KV heads (sliding 2 x 16, full 1 x 32 with
``attention_k_eq_v``: no v_proj, the keys are the values), the proportional RoPE of the full layers
(``partial_rotary_factor`` 0.25), the last 2 layers reusing the K/V of the last earlier layer of their type
(``num_kv_shared_layers``) with the double-wide MLP, per-layer embeddings of 8 per layer, ``layer_scalar`` and the
final softcap. It is saved by transformers and converted by llama.cpp's own ``convert_hf_to_gguf.py --outtype f32``
(test_lfm2's helpers). Gemma4Model.set_vocab reads a Llama-style (byte-fallback) BPE tokenizer only; our tiny
tokenizer.json is a GPT-2-style one, so the converter is run with set_vocab as the gpt2 reader (its
``_set_vocab_gpt2``): no tensor and no gemma4.* key depends on the vocabulary's reader. The release form
(``Gemma4ForConditionalGeneration``: the text model under ``model.language_model.``, vision and audio towers beside
it) packs the same text model, its towers left out by name.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orkpack import archs, synth
from orkpack.sources import model_facts, open_source
from orkpack.tiers.manifest import manifest_from_config

import test_lfm2
from test_lfm2 import TOL, _converter, _read_all, build_verify_eval, logits_match, record_matches_converter, tiny_model

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
_TEXT = {k: v for k, v in synth.TINY["gemma4_text"].items() if k not in ("architectures", "model_type", "torch_dtype")}
_TEXT = dict(_TEXT, vocab_size=320, vocab_size_per_layer_input=320)  # the tokenizer's 320 tokens
_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
           "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4, "position_embedding_size": 64,
           "pooling_kernel_size": 2}
_AUDIO = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "subsampling_conv_channels": [8, 4],
          "output_proj_dims": 32}
# the converter's gemma4 vocabulary reader wants a byte-fallback BPE tokenizer; ours is GPT-2 style (module docstring)
_RUN_CONVERTER = test_lfm2._RUN_CONVERTER.replace(
    "sys.argv = [", "import conversion.gemma as gm\ngm.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()\n"
                    "sys.argv = [")


def _redraw(m, g, torch) -> None:
    """Every parameter redrawn: gains away from 1, matrices at unit gain; layer_scalar (a buffer) away from 1."""
    test_lfm2.redraw(m, g, torch)
    for name, b in m.named_buffers():
        if name.endswith("layer_scalar"):
            b.copy_(0.5 + torch.rand(b.shape, generator=g))


@pytest.fixture(scope="module")
def conv_runner():
    mp = pytest.MonkeyPatch()
    mp.setattr(test_lfm2, "_RUN_CONVERTER", _RUN_CONVERTER)
    yield
    mp.undo()


@pytest.fixture(scope="module")
def text(tmp_path_factory, conv_runner):
    return tiny_model(tmp_path_factory.mktemp("g4"), "Gemma4ForCausalLM", "Gemma4TextConfig", _TEXT, redraw=_redraw)


# enable_moe_block (26B-A4B style): 4 experts, top 2, beside the dense MLP; no PLE and no KV sharing, as the
# 26B-A4B and 31B releases have neither
_MOE = dict(_TEXT, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
            hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False)


@pytest.fixture(scope="module")
def moe(tmp_path_factory, conv_runner):
    return tiny_model(tmp_path_factory.mktemp("g4moe"), "Gemma4ForCausalLM", "Gemma4TextConfig", _MOE, redraw=_redraw)


@pytest.fixture(scope="module")
def release(tmp_path_factory, conv_runner):
    cfg = {"text_config": _TEXT, "vision_config": _VISION, "audio_config": _AUDIO, "tie_word_embeddings": True}
    return tiny_model(tmp_path_factory.mktemp("g4mm"), "Gemma4ForConditionalGeneration", "Gemma4Config", cfg,
                      redraw=_redraw)


def _same_as_converter(hf: Path, gg: Path, n: int | None = None) -> dict:
    """Orkpack's readers of the folder and of the converter's GGUF give the converter's names, shapes and values,
    rope_freqs.weight included (the converter computes it from the config; so does the reader: archs
    Family.generated). Gemma4RMSNorm has no 1 + w: the gains are as stored."""
    conv, _ = _converter(gg)
    # 5 top (the embedding, the per-layer table, its projection and norm, the output norm) + rope_freqs + 6 x 14
    # (4 norms, q, o, q_norm, 3 FFN, PLE gate / projection / norm, layer_scalar) + k, k_norm in the 4 own-KV layers
    # + v in their 3 sliding ones
    assert len(conv) == (6 + 6 * 14 + 4 * 2 + 3 if n is None else n)
    for what, path in (("HF folder", hf), ("converter GGUF", gg)):
        ours = _read_all(path)
        assert sorted(ours) == sorted(conv), what
        for name, (ggml_shape, data) in conv.items():
            shape, a = ours[name]
            assert shape == data.shape == ggml_shape[::-1], (what, name, shape, data.shape, ggml_shape)
            assert np.array_equal(a, data), (what, name)
    return conv


def test_tensors_equal_the_converters(text):
    hf, gg, _, _ = text
    conv = _same_as_converter(hf, gg)
    assert conv["per_layer_token_embd.weight"][0] == (6 * 8, 320)  # ggml {layers x 8, vocab}: the lookup table
    assert conv["per_layer_model_proj.weight"][0] == (64, 48)
    assert conv["blk.2.attn_q.weight"][0] == (64, 4 * 32) and conv["blk.0.attn_q.weight"][0] == (64, 4 * 16)
    assert "blk.2.attn_v.weight" not in conv and "blk.0.attn_v.weight" in conv  # attention_k_eq_v: full layers
    assert not any(k.startswith(("blk.4.attn_k", "blk.5.attn_k", "blk.4.attn_v")) for k in conv)  # KV-sharing
    assert conv["blk.4.ffn_up.weight"][0] == (64, 192) and conv["blk.3.ffn_up.weight"][0] == (64, 96)  # double-wide
    assert list(conv["rope_freqs.weight"][1]) == [1.0] * 4 + [1e30] * 12  # 0.25 of the full head's 16 pairs turn


def test_moe_tensors_equal_the_converters(moe):
    hf, gg, _, _ = moe
    # 3 top (embedding, output norm, rope_freqs) + 6 x 21 (4 norms, q, o, q_norm, 3 FFN, layer_scalar, k, k_norm,
    # and the MoE block's router, its scale, the per-expert scale, gate_up and down experts, 3 norms) + v in the 4
    # sliding layers
    conv = _same_as_converter(hf, gg, 3 + 6 * 21 + 4)
    assert conv["blk.0.ffn_gate_up_exps.weight"][0] == (64, 64, 4)  # ggml {hidden, 2 x 32, experts}: gate then up
    assert conv["blk.0.ffn_down_exps.weight"][0] == (32, 64, 4)
    assert conv["blk.0.ffn_gate_inp.scale"][0] == (64,) and conv["blk.0.ffn_down_exps.scale"][0] == (4,)
    src = open_source(hf)
    try:
        names = {t.name: t for t in src.tensors()}
    finally:
        src.close()
    assert names["blk.0.ffn_gate_inp.scale"].source_name == "model.layers.0.router.scale"
    assert names["blk.0.ffn_down_exps.scale"].source_name == "model.layers.0.router.per_expert_scale"


def test_model_record_has_the_converters_keys(text):
    hf, gg, _, _ = text
    theirs = record_matches_converter(hf, gg, "gemma4", (
        "attention.shared_kv_layers", "embedding_length_per_layer_input", "attention.sliding_window_pattern",
        "attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count_swa",
        "rope.freq_base_swa", "attention.head_count_kv", "feed_forward_length", "final_logit_softcapping"))
    assert theirs["gemma4.attention.head_count_kv"][2] == [2, 2, 1, 2, 2, 1]
    assert theirs["gemma4.feed_forward_length"][2] == [96, 96, 96, 96, 192, 192]
    assert theirs["gemma4.rope.dimension_count"][2] == 32 and theirs["gemma4.rope.dimension_count_swa"][2] == 16


def test_moe_model_record_has_the_converters_keys(moe):
    hf, gg, _, _ = moe
    theirs = record_matches_converter(hf, gg, "gemma4", ("expert_count", "expert_used_count",
                                                        "expert_feed_forward_length", "attention.shared_kv_layers"))
    assert theirs["gemma4.expert_feed_forward_length"][2] == 32 and theirs["gemma4.feed_forward_length"][2] == 96
    assert theirs["gemma4.embedding_length_per_layer_input"][2] == 0


@pytest.mark.parametrize("which", ["text", "moe"])
def test_facts_and_logits_from_folder_and_converter_gguf(which, request):
    hf, gg, ids, ref = request.getfixturevalue(which)
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    if which == "text":
        assert a["swa_layers"] == [0, 1, 3, 4] and a["kv_shared_layers"] == [4, 5] and a["intermediate"] == 192
    else:
        assert (a["n_experts"], a["n_experts_used"], a["moe_intermediate"], a["kv_shared_layers"]) == (4, 2, 32, [])
    assert (a["kv_k"], a["kv_v"], a["head_dim"]) == (32, 32, 32)  # the full layers': 1 KV head of 32
    logits_match(hf, gg, ids, ref)


def test_release_packs_its_text_model_and_names_the_towers(release):
    from orkpack.model import logits

    hf, gg, ids, ref = release
    _same_as_converter(hf, gg)
    src = open_source(hf)
    try:
        skipped = src.skipped()
        names = {t.name for t in src.tensors()}
    finally:
        src.close()
    prefixes = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
    assert skipped and all(s.name.startswith(prefixes) for s in skipped)
    assert {p for p in prefixes if any(s.name.startswith(p) for s in skipped)} == set(prefixes)
    assert all("mmproj" in s.reason for s in skipped)
    assert not any("vision" in n or "audio" in n for n in names)
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert (a["arch"], b["arch"]) == ("gemma4", "gemma4_text")  # the converter's GGUF holds the text model
    b["arch"] = a["arch"]
    assert a == b
    for path in (hf, gg):
        err = float(np.abs(logits(path, ids) - ref).max())
        assert err <= TOL * float(np.abs(ref).max()), (path.name, err)


@pytest.mark.parametrize("which", ["text", "moe"])
def test_build_verify_eval(which, request, tmp_path):
    """An all-float pack gives the reference (the pack path is exact: measured mean KLD 1e-8); the default pack's
    error is spread over every matrix of these random models (unit-gain matrices): measured mean KLD 0.16 for the
    text model, 0.54 for the MoE one, 0.52 with its experts kept float (so not the routing: the NF4 of its dense
    matrices, two FFNs a layer) and 0.19 with every matrix int8; held under 0.3 and 0.7 nats here."""
    hf, gg, _, _ = request.getfixturevalue(which)
    build_verify_eval(hf, gg, tmp_path / "f.orkpack", build_args=("--keep", "*"), max_kld=1e-6)
    build_verify_eval(hf, gg, tmp_path / "t.orkpack", max_kld=0.3 if which == "text" else 0.7)


def test_kv_sharing_layers_store_no_kv_and_the_table_is_a_lookup():
    from orkpack.tiers.manifest import cache_bytes

    m = manifest_from_config(synth.TINY["gemma4_text"])
    f = m.facts
    assert f["kv_shared_layers"] == [4, 5] and f["swa_kv_k"] == 0  # 2 x 16 sliding = 1 x 32 full
    c = cache_bytes(f, 1024)
    # layers 0, 1, 3 sliding (8 positions), 2 full (1024); 4, 5 reuse: nothing; f16 K + V of 32 each
    assert c["kv"] == 128 * (3 * 8 + 1024) and c["kv_unshared"] == 128 * (4 * 8 + 2 * 1024)
    lk = [i for i in m.items if i.tensor == "per_layer_token_embd.weight"]
    assert len(lk) == 1 and lk[0].role == "lookup" and (lk[0].n, lk[0].k) == (128, 48)
    from orkpack.tiers.board import load_board
    from orkpack.tiers.profile import load_profile
    from orkpack.tiers.solver import solve

    board = load_board("rk3588-32g")
    tm = solve(m, board, load_profile(None, m, board), ctx=1024, pins={"npu": ["blk.*", "per_layer_model_proj.*"]})
    d = {x.name: x for x in tm.decisions}
    assert d["per_layer_token_embd.weight"].tier == "host" and d["blk.0.attn_q.weight"].tier == "npu"
    assert tm.budget["lookups"][0]["tensor"] == "per_layer_token_embd.weight"
    with pytest.raises(Exception, match="lookup, not a matmul"):
        solve(m, board, load_profile(None, m, board), ctx=1024, pins={"npu": ["per_layer_token_embd.weight"]})


def test_published_e2b_config_counts_and_plans():
    cfg = json.loads((FIXTURES / "gemma4_text.json").read_text())
    # what transformers 5.24 instantiates (Gemma4ForCausalLM on the meta device: 4,628,569,344 parameters) plus the
    # 35 layer_scalar buffers its checkpoint stores
    assert archs.param_count(cfg) == 4_628_569_344 + 35
    m = manifest_from_config(cfg)
    f = m.facts
    assert f["kv_shared_layers"] == list(range(15, 35)) and (f["kv_k"], f["swa_kv_k"]) == (512, 256)
    assert f["swa_layers"] == [i for i in range(35) if i % 5 != 4] and f["intermediate"] == 12288
    # 32k context, f16: layers 0..14 own their K/V (3 full x 32768 x 2 x 512 x 2 B + 12 sliding x 512 x 2 x 256 x 2 B)
    assert m.kv_bytes(32768) == 3 * 32768 * 2048 + 12 * 512 * 1024
    lk = next(i for i in m.items if i.tensor == "per_layer_token_embd.weight")
    assert (lk.role, lk.n, lk.k) == ("lookup", 262144, 35 * 256)


def test_published_26b_a4b_config_plans_its_experts():
    cfg = json.loads((FIXTURES / "gemma4_text_26b_a4b.json").read_text())
    assert archs.param_count(cfg) == 25_233_141_760 + 30
    m = manifest_from_config(cfg)
    f = m.facts
    assert (f["n_experts"], f["n_experts_used"], f["moe_intermediate"], f["kv_shared_layers"]) == (128, 8, 704, [])
    assert (f["kv_k"], f["swa_kv_k"]) == (2 * 512, 8 * 256)  # full layers: 2 KV heads of 512; sliding: 8 of 256
    # 32k, f16: 5 full layers x 32768 x 4096 B + 25 sliding x 1024 x 8192 B = 840 MiB
    assert m.kv_bytes(32768) == 5 * 32768 * 4096 + 25 * 1024 * 8192
    experts = [i for i in m.items if i.role == "expert"]
    assert len(experts) == 30 * 128 * 2 and not any(i.role == "lookup" for i in m.items)
    assert sum(t.name.endswith(("ffn_gate_inp.scale", "ffn_down_exps.scale")) for t in m.floats) == 60


def test_plan_shows_the_lookup_and_the_shared_kv():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "orkpack", "plan", str(FIXTURES / "gemma4_text.json"), "--ctx", "32768"],
                       capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "PYTHONPATH": str(Path(archs.__file__).parent.parent),
                            "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    assert "lookup per_layer_token_embd.weight: 262144 rows x 8960" in out and "never the NPU" in out
    # every embedding table has its line: Gemma's embedding is the tied head, read whole for every token
    assert "lookup token_embd.weight: 262144 rows x 1536" in out and "all of it as the tied output head" in out
    # items with a benefit that stay on the host with the NPU half empty: not said to be for want of room
    assert "NPU full" not in out and "not for room" in out
    assert "20 of 35 layers reuse earlier layers' K/V and store none" in out


@pytest.mark.parametrize("over,key", [({"num_kv_shared_layers": 40}, "num_kv_shared_layers"),
                                      ({"layer_types": ["sliding_attention"] * 5}, "layer_types")])
def test_a_contradictory_config_is_one_line(over, key):
    from orkpack.errors import SourceError

    with pytest.raises(SourceError, match=key):
        archs.facts_from_config(dict(synth.TINY["gemma4_text"], **over))


@pytest.mark.parametrize("name,params", [("gemma4_text", 4_628_569_344), ("gemma4_text_26b_a4b", 25_233_141_760),
                                         ("gemma4_text_e4b", 7_463_013_376), ("gemma4_text_31b", 30_697_345_280)])
def test_fixture_count_is_what_transformers_builds(name, params):
    """The fixtures' counts: transformers' Gemma4ForCausalLM on the meta device, its parameters plus the
    layer_scalar buffers its state dict (the checkpoint) holds; the same tensor names as archs lists."""
    torch = pytest.importorskip("torch", reason="transformers' count needs torch (test extra)")
    transformers = pytest.importorskip("transformers", reason="transformers' count needs transformers (test extra)")
    cfg = json.loads((FIXTURES / f"{name}.json").read_text())
    c = transformers.Gemma4TextConfig(**{k: v for k, v in cfg.items()
                                         if k not in ("architectures", "model_type", "torch_dtype")})
    with torch.device("meta"):
        m = transformers.Gemma4ForCausalLM(c)
    sd = {k: v for k, v in m.state_dict().items() if k != "lm_head.weight"}  # tied
    assert sum(p.numel() for p in m.parameters()) == params
    assert sum(v.numel() for v in sd.values()) == archs.param_count(cfg)
    assert set(sd) == {n for n, _, _ in archs.hf_tensors(cfg)[1]}


def test_the_converters_gguf_builds_verifies_and_evaluates(text, tmp_path):
    """A pack built from the converter's GGUF (its rope_freqs, the converter's layout) verifies and, all float, is
    the GGUF's model."""
    import os
    import subprocess
    import sys

    _, gg, _, _ = text
    env = dict(os.environ, PYTHONPATH=str(Path(archs.__file__).parent.parent))
    run = lambda *a: subprocess.run([sys.executable, "-m", "orkpack", *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=600, env=env)
    pack = tmp_path / "g.orkpack"
    r = run("build", str(gg), "-o", str(pack), "--keep", "*")
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("verify", str(pack))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = run("eval", str(gg), str(pack), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    for p in json.loads(r.stdout)["paths"]:
        if p["path"] in ("prefill", "decode"):
            assert 0 <= p["kld"]["mean"] < 1e-6, p


def test_the_lookup_tables_precision_is_what_its_error_costs(text, tmp_path):
    """The per-layer table's error measured by eval, every other tensor kept float: NF4 mean KLD 3.7e-3, int8 4.4e-5
    (about 1 % of NF4's), float 1e-8 (the pack path's own rounding) on this model; the table's rows come from the
    pack as stored (a row lookup), so each encoding shows. The planner puts it int8 where RAM allows and NF4 where
    a --max-ram budget does not; --keep keeps it float."""
    import os
    import subprocess
    import sys

    hf = text[0]
    env = dict(os.environ, PYTHONPATH=str(Path(archs.__file__).parent.parent))
    run = lambda *a: subprocess.run([sys.executable, "-m", "orkpack", *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=600, env=env)
    kld = {}
    for enc in ("nf4", "int8", "keep"):
        pack = tmp_path / f"{enc}.orkpack"
        r = run("build", str(hf), "-o", str(pack), "--keep", "blk.*", "--keep", "token_embd.weight", "--keep",
                "per_layer_model_proj.weight", f"--{enc}", "per_layer_token_embd.weight")
        assert r.returncode == 0, r.stderr[-2000:]
        r = run("eval", str(hf), str(pack), "--json")
        assert r.returncode == 0, r.stderr[-2000:]
        kld[enc] = {p["path"]: p for p in json.loads(r.stdout)["paths"]}["decode"]["kld"]["mean"]
    assert kld["keep"] < 1e-6 < kld["int8"] < 0.05 * kld["nf4"], kld
    from orkpack.tiers.board import load_board
    from orkpack.tiers.profile import load_profile
    from orkpack.tiers.solver import Goal, solve

    m = manifest_from_config(json.loads((FIXTURES / "gemma4_text.json").read_text()))
    board = load_board("rk3588-32g")
    enc = {}
    for ram in (None, 6 << 30):
        tm = solve(m, board, load_profile(None, m, board), ctx=8192, goal=Goal(max_ram=ram))
        enc[ram] = {lk["tensor"]: (lk["encoding"], lk["tied_head"]) for lk in tm.budget["lookups"]}
    assert enc[None]["per_layer_token_embd.weight"] == ("int8", False)
    assert enc[6 << 30]["per_layer_token_embd.weight"] == ("nf4", False)
    assert enc[None]["token_embd.weight"][1] is True


def test_published_e4b_and_31b_configs_plan():
    """E4B: 42 layers, the last 18 reusing earlier K/V, a per-layer table of 42 x 256; 31B, the largest dense Gemma 4:
    60 layers, no PLE and no sharing, its full layers 4 KV heads of 512 with the keys as the values."""
    e4b = json.loads((FIXTURES / "gemma4_text_e4b.json").read_text())
    m = manifest_from_config(e4b)
    f = m.facts
    assert f["kv_shared_layers"] == list(range(24, 42)) and f["swa_layers"] == [i for i in range(42) if i % 6 != 5]
    lk = next(i for i in m.items if i.tensor == "per_layer_token_embd.weight")
    assert (lk.role, lk.n, lk.k) == ("lookup", 262144, 42 * 256)
    assert archs.param_count(e4b) - lk.n * lk.k == 4_644_441_088 + 42  # the card's "4.5B effective"
    # 32k, f16: layers 0..23 own their K/V: 4 full x 32768 x 2 x (2 x 512) x 2 B + 20 sliding x 512 x 2 x (2 x 256) x 2 B
    assert m.kv_bytes(32768) == 4 * 32768 * 4096 + 20 * 512 * 2048
    b31 = json.loads((FIXTURES / "gemma4_text_31b.json").read_text())
    m = manifest_from_config(b31)
    f = m.facts
    assert (f["n_layers"], f["kv_shared_layers"], f["kv_k"], f["swa_kv_k"]) == (60, [], 4 * 512, 16 * 256)
    assert not any(i.role == "lookup" for i in m.items) and not any(t.name.endswith("attn_v.weight") and
                                                                    t.name.startswith("blk.5.") for t in m.tensors)
    # 32k, f16: 10 full layers x 32768 x 2 x 2048 x 2 B (the cache holds V though it is K, as for 26B-A4B) + 50 sliding
    # x 1024 x 2 x 4096 x 2 B
    assert m.kv_bytes(32768) == 10 * 32768 * 8192 + 50 * 1024 * 16384


def test_the_release_fixture_counts_its_text_model():
    """The E2B release (towers' configs: their config classes' defaults) counts its text model; transformers builds
    5,506,951,203 parameters with the towers, the card's 5.1B."""
    torch = pytest.importorskip("torch", reason="transformers' count needs torch (test extra)")
    transformers = pytest.importorskip("transformers", reason="transformers' count needs transformers (test extra)")
    cfg = json.loads((FIXTURES / "gemma4.json").read_text())
    assert archs.param_count(cfg) == archs.param_count(json.loads((FIXTURES / "gemma4_text.json").read_text()))
    with torch.device("meta"):
        m = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(
            **{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}))
    sd = m.state_dict()
    towers = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.")
    text = {k: v for k, v in sd.items() if not k.startswith(towers) and k != "lm_head.weight"}
    assert sum(v.numel() for v in sd.values()) == 5_506_951_203
    assert sum(v.numel() for v in text.values()) == archs.param_count(cfg)
    assert set(text) == {n for n, _, _ in archs.hf_tensors(cfg)[1]}
    assert manifest_from_config(cfg).facts["arch"] == "gemma4"
