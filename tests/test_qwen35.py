"""Qwen3.5 (Gated DeltaNet + gated attention), dense, MoE and the releases' multimodal form, end to end, against
llama.cpp's converter and transformers (the method of tests/test_lfm2.py, whose helpers this reuses).

The tiny models have 2 value heads per key head, so the converter's value-head reorder
(``_LinearAttentionVReorderBase``) moves rows, columns and channels: orkpack's HF reader must make the same moves
(orkpack/sources/convlayout.py) for the folder to read as the converter's GGUF, and the forward pass reads the
tiled order. The converter is run with ``--no-mtp``: transformers' classes build no multi-token-prediction layers.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orkpack import archs, keepfloat, synth
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.tiers.manifest import manifest_from_config

from test_lfm2 import (FIXTURES, _converter, build_verify_eval, logits_match, record_matches_converter,
                       tensors_match_converter, tiny_model)

_TEXT = {k: v for k, v in synth.TINY["qwen3_5_text"].items() if k not in ("architectures", "model_type", "torch_dtype")}
_TEXT["vocab_size"] = 320  # the tokenizer's 3 + 256 + 61 tokens
_MOE = {**_TEXT, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"]}
_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
           "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 16}
_NO_MTP = ("--no-mtp",)


def _redraw(m, g, torch) -> None:
    """Every parameter redrawn: (1 + w) norms' w and the gated norm's gain away from their start, matrices at unit
    gain, A_log and dt_bias as a release holds them (A in 1..16, dt_bias about 1)."""
    for name, p in m.named_parameters():
        if name.endswith("A_log"):
            p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
        elif name.endswith("dt_bias"):
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        elif "norm" in name and p.dim() == 1:
            p.copy_((1.0 if name.endswith("linear_attn.norm.weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("q35"), "Qwen3_5ForCausalLM", "Qwen3_5TextConfig", _TEXT,
                      redraw=_redraw, convert_args=_NO_MTP)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("q35moe"), "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", _MOE,
                      redraw=_redraw, convert_args=_NO_MTP)


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory):
    cfg = {"text_config": _TEXT, "vision_config": _VISION, "tie_word_embeddings": False}
    return tiny_model(tmp_path_factory.mktemp("q35mm"), "Qwen3_5ForConditionalGeneration", "Qwen3_5Config", cfg,
                      redraw=_redraw, convert_args=_NO_MTP)


def _same_as_converter(hf: Path, gg: Path, n: int, norm_offset: float = 1.0) -> dict:
    """Orkpack's readers of the folder and of the converter's GGUF give the converter's names, shapes and values.

    Two declared differences: the (1 + w) norms, which the converter stores as w + 1 and the folder holds as w
    (``Forward.norm_offset``, as for gemma), and ``ssm_a`` = -exp(A_log), which the converter computes with torch's
    float32 exp and orkpack correctly rounded (within 1 ulp of each other)."""
    conv, _ = _converter(gg)
    assert len(conv) == n
    offset = {k for k in conv if k.endswith("norm.weight") and not k.endswith("ssm_norm.weight")}
    tensors_match_converter(hf, gg, conv, lambda name, a: a + np.float32(norm_offset) if name in offset else a)
    return conv


def test_dense_tensors_equal_the_converters(dense):
    hf, gg, _, _ = dense
    # 3 top + 4 x 5 (norms, FFN) + 2 DeltaNet layers x 9 + 2 attention layers x 6
    conv = _same_as_converter(hf, gg, 53)
    assert conv["blk.0.ssm_conv1d.weight"][0] == (4, 80)  # ggml {ck, q + k + v channels}: squeezed from (80, 1, 4)
    assert conv["blk.1.attn_q.weight"][0] == (64, 128)  # q and its gate, per head
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}
        assert info["blk.0.ssm_a"].source_name == "model.layers.0.linear_attn.A_log"
        assert info["blk.0.ssm_dt.bias"].source_name == "model.layers.0.linear_attn.dt_bias"
        assert info["blk.0.ssm_a"].dtype == "F32"
    finally:
        src.close()


def test_the_value_heads_move_as_the_converter_moves_them(dense):
    """The reorder is not the identity here: the folder's raw rows differ from the converter's, ours do not."""
    hf, gg, _, _ = dense
    from safetensors.numpy import load_file

    raw = load_file(str(hf / "model.safetensors"))
    conv, _ = _converter(gg)
    qkv = raw["model.layers.0.linear_attn.in_proj_qkv.weight"]
    assert not np.array_equal(qkv, conv["blk.0.attn_qkv.weight"][1])
    assert np.array_equal(qkv[:32], conv["blk.0.attn_qkv.weight"][1][:32])  # q and k rows stay
    # value heads of 12: grouped (k0: v0 v1, k1: v2 v3) -> tiled (v0 v2 v1 v3)
    v = qkv[32:].reshape(4, 12, 64)
    assert np.array_equal(conv["blk.0.attn_qkv.weight"][1][32:].reshape(4, 12, 64), v[[0, 2, 1, 3]])


def test_moe_tensors_equal_the_converters(moe):
    hf, gg, _, _ = moe
    # 3 top + 4 x (2 norms + router + 3 expert stacks + 3 shared + shared gate) + 3 DeltaNet x 9 + 1 attention x 6
    conv = _same_as_converter(hf, gg, 3 + 4 * 10 + 27 + 6)
    assert conv["blk.0.ffn_gate_exps.weight"][0] == (64, 32, 4)
    assert conv["blk.0.ffn_gate_inp_shexp.weight"][0] == (64, 1)  # the shared expert's gate: one row


def test_multimodal_release_packs_its_text_model_and_names_the_vision_tower(multimodal):
    hf, gg, _, _ = multimodal
    _same_as_converter(hf, gg, 53)
    src = open_source(hf)
    try:
        skipped = src.skipped()
        names = {t.name for t in src.tensors()}
    finally:
        src.close()
    assert skipped and all(s.name.startswith("model.visual.") for s in skipped)
    assert any(s.name == "model.visual.patch_embed.proj.weight" and len(s.shape) == 5 for s in skipped)
    assert all("mmproj" in s.reason for s in skipped)
    assert not any(n.startswith("model.visual") or "visual" in n for n in names)


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_model_record_has_the_converters_keys(which, request):
    hf, gg, _, _ = request.getfixturevalue(which)
    garch = "qwen35" if which == "dense" else "qwen35moe"
    theirs = record_matches_converter(hf, gg, garch, (
        "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
        "attention.recurrent_layers", "full_attention_interval", "rope.dimension_count", "rope.dimension_sections"))
    assert theirs[f"{garch}.ssm.inner_size"][2] == 48 and theirs[f"{garch}.rope.dimension_count"][2] == 4


@pytest.mark.parametrize("which", ["dense", "moe", "multimodal"])
def test_facts_and_logits_from_folder_and_converter_gguf(which, request):
    hf, gg, ids, ref = request.getfixturevalue(which)
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    if which == "multimodal":  # the converter's GGUF holds the text model: it reads as the text family
        assert (a["arch"], b["arch"]) == ("qwen3_5", "qwen3_5_text")
        b["arch"] = a["arch"]
    assert a == b
    lt = (_MOE if which == "moe" else _TEXT)["layer_types"]
    assert a["recurrent_layers"] == [i for i, x in enumerate(lt) if x == "linear_attention"]
    assert a["state"] == 3 * (48 + 2 * 2 * 8) + 8 * 48  # (ck - 1)(di + 2 ng ds) + ds di
    logits_match(hf, gg, ids, ref, which)


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_build_verify_eval(which, request, tmp_path):
    """An all-float pack gives the reference exactly (the pack path is exact); the default pack's NF4 error is
    spread over every matrix of these random models (3 DeltaNet layers of unit-gain matrices: ~0.2-0.4 nats; keeping
    any one group float lowers it, none alone removes it), so it is held under 0.6 nats here, not LFM2's 0.2."""
    hf, gg, _, _ = request.getfixturevalue(which)
    build_verify_eval(hf, gg, tmp_path / "f.orkpack", build_args=("--keep", "*"), max_kld=1e-6)
    build_verify_eval(hf, gg, tmp_path / "t.orkpack", max_kld=0.6)


def test_plan_of_the_tiny_model():
    m = manifest_from_config(synth.TINY["qwen3_5_text"])
    names = {i.tensor for i in m.items}
    for n in ("blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_beta.weight", "blk.0.ssm_alpha.weight",
              "blk.0.ssm_out.weight", "blk.1.attn_q.weight", "blk.1.attn_output.weight"):
        assert n in names, n
    floats = {t.name: t for t in m.floats}
    assert keepfloat.why_float("blk.0.ssm_conv1d.weight", floats["blk.0.ssm_conv1d.weight"].shape) == \
        "a convolution kernel"
    for n in ("blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight"):
        assert n in floats, n
    # KV: the 2 attention layers (2 KV heads x 16, K and V, f16); the state: 624 f32 per DeltaNet layer
    for ctx in (512, 8192):
        assert m.kv_bytes(ctx) == 2 * ctx * 2 * 32 * 2 + 2 * 624 * 4


# the Qwen3_5TextConfig / Qwen3_5MoeTextConfig defaults, which transformers says mirror Qwen3.5-9B and
# Qwen3.5-35B-A3B: their parameter counts as transformers instantiates them (meta device), text model only
_FIXTURES = {"qwen3_5_text.json": 8_953_803_264, "qwen3_5_moe_text.json": 34_660_610_688}


@pytest.mark.parametrize("name", sorted(_FIXTURES))
def test_fixture_parameter_counts_and_plan(name):
    cfg = json.loads((FIXTURES / name).read_text())
    assert archs.param_count(cfg) == _FIXTURES[name]
    from orkpack.tiers.command import plan

    tm, _, (man, _, _) = plan(FIXTURES / name, ctx=32768)
    f = man.facts
    assert len(f["recurrent_layers"]) == 3 * f["n_layers"] // 4
    # the KV cache of an all-attention model of the same shape is 4x the attention part; the state is fixed
    attn = f["n_layers"] // 4 * 32768 * 2 * f["kv_heads"] * f["head_dim"] * 2
    state = len(f["recurrent_layers"]) * f["state"] * 4
    assert tm.budget["ram"]["kv_cache"] == man.kv_bytes(32768) == attn + state
    assert 4 * attn > 3 * (attn + state)  # the hybrid's saving at 32k
    assert tm.budget["ram"]["recurrent_state"] == state
    assert tm.budget["ram"]["kv_all_attention"] == man.kv_bytes_all_attention(32768) == 4 * attn
    if name == "qwen3_5_text":  # docs/TIERMAP.md's worked figure
        assert f["state"] == 548_864 and attn + state == 8 * 32768 * 4096 + 24 * 548_864 * 4
        assert f["recurrent_flops"] == 2 * 4 * (4096 + 2 * 16 * 128) + 7 * 128 * 4096


def test_fixture_counts_are_what_transformers_builds():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name, cls, ccls in (("qwen3_5_text.json", "Qwen3_5ForCausalLM", "Qwen3_5TextConfig"),
                            ("qwen3_5_moe_text.json", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig")):
        cfg = {k: v for k, v in json.loads((FIXTURES / name).read_text()).items() if not k.startswith("_")}
        with torch.device("meta"):
            m = getattr(transformers, cls)(getattr(transformers, ccls)(**cfg))
        assert sum(p.numel() for p in m.parameters()) == _FIXTURES[name], name


@pytest.mark.parametrize("over, key", [
    ({"layer_types": ["linear_attention", "full_attention"]}, "'layer_types' lists 2 layers but 'num_hidden_layers' is 4"),
    ({"layer_types": ["linear_attention", "full_attention", "mamba", "full_attention"]}, "'layer_types'[2] = 'mamba'"),
    ({"full_attention_interval": 3}, "'layer_types'[1] = 'full_attention' contradicts 'full_attention_interval' = 3"),
    ({"layer_types": None, "full_attention_interval": 0}, "'full_attention_interval' is 0"),
    ({"linear_num_value_heads": 3}, "'linear_num_value_heads' = 3 is not a multiple of 'linear_num_key_heads' = 2"),
    ({"linear_conv_kernel_dim": 1}, "'linear_conv_kernel_dim' = 1"),
    ({"linear_key_head_dim": 0}, "'linear_key_head_dim' is 0"),
])
def test_a_contradictory_config_is_one_line(over, key):
    cfg = {**synth.TINY["qwen3_5_text"], **over}
    with pytest.raises(SourceError) as e:
        manifest_from_config(cfg)
    msg = str(e.value)
    assert key in msg and "\n" not in msg and msg.endswith("fix the config"), msg


def test_the_interval_alone_gives_the_pattern():
    cfg = {**synth.TINY["qwen3_5_text"], "layer_types": None, "full_attention_interval": 2}
    assert archs.layer_blocks(cfg) == ["deltanet", "attn", "deltanet", "attn"]
    cfg = {**synth.TINY["qwen3_5_text"], "layer_types": None}  # Qwen3_5TextConfig's default interval, 4
    assert archs.layer_blocks(cfg) == ["deltanet", "deltanet", "deltanet", "attn"]


def test_weights_that_contradict_the_configs_heads_are_one_line(tmp_path):
    folder = synth.write_hf_model(tmp_path / "m", config=synth.TINY["qwen3_5_text"], seed=1)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "linear_value_head_dim": 10}))  # the weights hold 12
    with pytest.raises(SourceError) as e:
        open_source(folder)
    msg = str(e.value)
    assert "does not hold the value heads config.json describes" in msg and "\n" not in msg, msg
    assert "blk.0." in msg and "disagree" in msg


def test_the_releases_mtp_layer_is_left_out_by_name(tmp_path):
    """A release's mtp.* tensors (the speculative-decoding draft; the converter's --no-mtp leaves them out)."""
    from safetensors.numpy import load_file, save_file

    folder = synth.write_hf_model(tmp_path / "m", config=synth.TINY["qwen3_5_text"], seed=1, dtype="f32", shards=1)
    f = next(folder.glob("*.safetensors"))
    t = load_file(str(f))
    t["mtp.fc.weight"] = np.zeros((64, 128), np.float32)
    t["mtp.layers.0.mlp.up_proj.weight"] = np.zeros((96, 64), np.float32)
    save_file(t, str(f))
    src = open_source(folder)
    try:
        assert sorted(s.name for s in src.skipped()) == ["mtp.fc.weight", "mtp.layers.0.mlp.up_proj.weight"]
        assert not any("mtp" in i.name for i in src.tensors())
    finally:
        src.close()


def test_an_fp8_release_reads_in_the_converters_layout_too(tmp_path):
    """Qwen3.5's FP8 releases: the value heads move after dequantization (the same float32 the converter sees)."""
    from orkpack.sources import convlayout

    cfg = {**synth.TINY["qwen3_5_text"], "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                                                 "weight_block_size": [16, 16]}}
    folder = synth.write_hf_model(tmp_path / "m", config=cfg, seed=1, shards=1)
    src, plain = open_source(folder), open_source(folder)
    try:
        plain._changes = {}  # the reader without the converter's changes: the release's own order
        info = {t.name: t for t in src.tensors()}
        assert info["blk.0.attn_qkv.weight"].dtype == "F8_E4M3"
        for name in ("blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_out.weight"):
            want = convlayout.apply(plain.read(name), src._changes[name][0])
            assert not np.array_equal(want, plain.read(name))
            assert np.array_equal(src.read(name), want), name
    finally:
        src.close()
        plain.close()


def test_a_hybrid_plans_across_two_boards():
    """The cluster's decode per layer counts the recurrent state written back, as the one-board plan does (it
    stopped with 'internal: the cluster decode_s_per_token ... differs' when only one of them did)."""
    from typer.testing import CliRunner

    from orkpack.cli import app

    r = CliRunner().invoke(app, ["plan", str(FIXTURES / "qwen3_5_moe_text.json"), "--boards", "rk3588-32g,rk3588-32g",
                                 "--json"])
    assert r.exit_code == 0, r.output[-2000:]
    assert "internal" not in r.output


def test_a_gguf_with_the_converters_mtp_blocks_is_one_line(dense, tmp_path):
    """The converter's default (no --no-mtp) appends the MTP layer as blocks after the decoder: refused in one line,
    rather than read as one more decoder layer."""
    import gguf

    _, gg, _, _ = dense
    r = gguf.GGUFReader(str(gg))
    w = gguf.GGUFWriter(str(tmp_path / "mtp.gguf"), "qwen35")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        w.add_key_value(key, f.contents(), f.types[0], f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    w.add_uint32("qwen35.nextn_predict_layers", 1)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(SourceError) as e:
        model_facts(open_source(tmp_path / "mtp.gguf"))
    msg = str(e.value)
    assert "multi-token-prediction" in msg and "--no-mtp" in msg and "\n" not in msg, msg
