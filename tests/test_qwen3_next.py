"""Qwen3-Next (Gated DeltaNet + gated attention, every FFN an MoE with a gated shared expert), end to end, against
llama.cpp's converter and transformers (the method of tests/test_lfm2.py and tests/test_qwen35.py, whose helpers
this reuses).

What differs from Qwen3.5: the linear attention's q, k, v and gate z come from one fused ``in_proj_qkvz`` and beta and
alpha from one ``in_proj_ba``, both laid out per key head. llama.cpp's converter (``Qwen3NextModel.modify_tensors``)
splits ``in_proj_qkvz`` into ``attn_qkv`` (every q, then every k, then every v) and ``attn_gate`` (z), keeps
``in_proj_ba`` fused as ``ssm_ba``, and, not being a ``_LinearAttentionVReorderBase``, moves no value head: they stay
grouped by key head, which llama.cpp's graph (src/models/qwen3next.cpp) reads by repeating each key head in place.
orkpack's HF reader makes the same split (archs ``Split``: byte ranges of the stored tensor) and the forward pass
reads that layout (``Forward.vheads = "grouped"``, ``beta_alpha = "fused"``). The tiny models have 2 value heads per
key head and key and value heads of different widths (8, 12), so a misplaced row shows. The converter is run with
``--no-mtp``: transformers builds no multi-token-prediction layer.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from orkpack import archs, keepfloat, synth
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.sources.modelkv import from_hf
from orkpack.tiers.manifest import manifest_from_config

from test_lfm2 import (FIXTURES, T, TOL, _converter, _read_all, build_verify_eval, logits_match, record_matches_converter,
                       tiny_model)
from test_qwen35 import _redraw

_CFG = {k: v for k, v in synth.TINY["qwen3_next"].items() if k not in ("architectures", "model_type", "torch_dtype")}
_CFG["vocab_size"] = 320  # the tokenizer's 3 + 256 + 61 tokens
_NO_MTP = ("--no-mtp",)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("q3next"), "Qwen3NextForCausalLM", "Qwen3NextConfig", _CFG,
                      redraw=_redraw, convert_args=_NO_MTP)


def _same_as_converter(hf, gg, n: int) -> dict:
    """Orkpack's readers of the folder and of the converter's GGUF give the converter's names, shapes and values;
    one declared difference: the (1 + w) norms, which the converter stores as w + 1 and the folder holds as w
    (``Forward.norm_offset``); ``ssm_a`` = -exp(A_log) within 1 ulp (torch's float32 exp against orkpack's correctly
    rounded one)."""
    conv, _ = _converter(gg)
    assert len(conv) == n
    offset = {k for k in conv if k.endswith("norm.weight") and not k.endswith("ssm_norm.weight")}
    for what, path in (("HF folder", hf), ("converter GGUF", gg)):
        ours = _read_all(path)
        assert sorted(ours) == sorted(conv), what
        for name, (ggml_shape, data) in conv.items():
            shape, a = ours[name]
            assert shape == data.shape == ggml_shape[::-1], (what, name, shape, data.shape, ggml_shape)
            if what == "HF folder" and name in offset:
                a = a + np.float32(1.0)
            if name.endswith("ssm_a"):
                np.testing.assert_array_max_ulp(a, data, 1)
            else:
                assert np.array_equal(a, data), (what, name)
    return conv


def test_tensors_equal_the_converters(model):
    hf, gg, _, _ = model
    # 3 top + 4 x (2 norms + router + 3 expert stacks + 3 shared + shared gate) + 3 DeltaNet x 8 + 1 attention x 6
    conv = _same_as_converter(hf, gg, 3 + 4 * 10 + 3 * 8 + 6)
    assert conv["blk.0.attn_qkv.weight"][0] == (64, 80)  # q + k + v rows: 2 x 2 x 8 + 4 x 12
    assert conv["blk.0.attn_gate.weight"][0] == (64, 48)  # z: 4 value heads of 12
    assert conv["blk.0.ssm_ba.weight"][0] == (64, 8)  # beta and alpha, kept fused
    assert conv["blk.0.ssm_conv1d.weight"][0] == (4, 80)
    assert "blk.0.ssm_in.weight" not in conv and "blk.0.ssm_beta.weight" not in conv
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}
        for n in ("blk.0.attn_qkv.weight", "blk.0.attn_gate.weight"):  # one HF tensor, two canonical ones
            assert info[n].source_name == "model.layers.0.linear_attn.in_proj_qkvz.weight"
        assert info["blk.0.attn_qkv.weight"].nbytes + info["blk.0.attn_gate.weight"].nbytes == 128 * 64 * 4
        assert src.mapped("blk.0.attn_qkv.weight") is None  # gathered rows: read, not mapped
        assert info["blk.0.ssm_a"].dtype == "F32"
    finally:
        src.close()


def test_the_split_is_the_converters_row_gather(model):
    """attn_qkv is every key head's q, then every k, then every v (value heads grouped, not tiled); attn_gate is z."""
    hf, gg, _, _ = model
    from safetensors.numpy import load_file

    qkvz = load_file(str(hf / "model.safetensors"))["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    conv, _ = _converter(gg)
    g = qkvz.reshape(2, 8 + 8 + 24 + 24, 64)  # per key head [q 8, k 8, v 2 x 12, z 2 x 12]
    want = np.concatenate([g[:, :8].reshape(-1, 64), g[:, 8:16].reshape(-1, 64), g[:, 16:40].reshape(-1, 64)])
    assert np.array_equal(conv["blk.0.attn_qkv.weight"][1], want)
    assert np.array_equal(conv["blk.0.attn_gate.weight"][1], g[:, 40:].reshape(-1, 64))
    ba = load_file(str(hf / "model.safetensors"))["model.layers.0.linear_attn.in_proj_ba.weight"]
    assert np.array_equal(conv["blk.0.ssm_ba.weight"][1], ba)


def test_model_record_has_the_converters_keys(model):
    hf, gg, _, _ = model
    theirs = record_matches_converter(hf, gg, "qwen3next", (
        "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
        "attention.recurrent_layers", "full_attention_interval", "rope.dimension_count", "expert_feed_forward_length",
        "expert_shared_feed_forward_length"))
    ours = {e[0]: e for e in from_hf(hf, json.loads((hf / "config.json").read_text()))["kv"]}
    assert "qwen3next.rope.dimension_sections" not in ours  # Qwen3.5's MRoPE mixin only
    assert theirs["qwen3next.attention.recurrent_layers"][2] == [True, True, False, True]


def test_facts_and_logits_from_folder_and_converter_gguf(model):
    hf, gg, ids, ref = model
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    assert a["arch"] == "qwen3_next" and a["recurrent_layers"] == [0, 1, 3]
    assert a["state"] == 3 * (48 + 2 * 2 * 8) + 8 * 48  # (ck - 1)(di + 2 ng ds) + ds di
    logits_match(hf, gg, ids, ref)


def test_a_dense_mlp_layer_matches_transformers(tmp_path):
    """mlp_only_layers makes layer 1 a SwiGLU MLP (transformers' Qwen3NextMLP at intermediate_size). llama.cpp's
    converter cannot write it ("Can not map tensor 'model.layers.1.mlp.down_proj.weight'": qwen3next's tensor
    table has no dense FFN, and its loader wants a router in every layer), so this is against transformers only,
    from the folder."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from orkpack.model import logits

    cfg = {**_CFG, "mlp_only_layers": [1]}
    torch.manual_seed(0)
    m = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**cfg)).float().eval()
    with torch.no_grad():
        _redraw(m, torch.Generator().manual_seed(1), torch)
    m.save_pretrained(tmp_path / "hf")
    ids = np.random.default_rng(2).integers(0, 320, T)
    with torch.no_grad():
        ref = m(torch.tensor(ids)[None]).logits[0].float().numpy()
    names = {t.name for t in open_source(tmp_path / "hf").tensors()}
    assert {"blk.1.ffn_gate.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.weight"} <= names
    assert "blk.1.ffn_gate_inp.weight" not in names and "blk.0.ffn_gate_inp.weight" in names
    cfg_json = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert archs.param_count(cfg_json) == sum(p.numel() for p in m.parameters())
    err = float(np.abs(logits(tmp_path / "hf", ids) - ref).max())
    assert err <= TOL * float(np.abs(ref).max()), err


def test_build_verify_eval(model, tmp_path):
    """An all-float pack gives the reference exactly; the default pack's NF4 error is spread over every matrix of
    this random model (3 DeltaNet layers of unit-gain matrices and 4 MoE layers, as test_qwen35's MoE model), held
    under the same 0.6 nats."""
    hf, gg, _, _ = model
    build_verify_eval(hf, gg, tmp_path / "f.orkpack", build_args=("--keep", "*"), max_kld=1e-6)
    build_verify_eval(hf, gg, tmp_path / "t.orkpack", max_kld=0.6)


def test_plan_of_the_tiny_model():
    m = manifest_from_config(synth.TINY["qwen3_next"])
    names = {i.tensor for i in m.items}
    for n in ("blk.0.attn_qkv.weight", "blk.0.attn_gate.weight", "blk.0.ssm_ba.weight", "blk.0.ssm_out.weight",
              "blk.2.attn_q.weight", "blk.2.attn_output.weight", "blk.0.ffn_gate_exps.weight",
              "blk.0.ffn_up_shexp.weight"):
        assert n in names, n
    assert "blk.0.ssm_in.weight" not in names
    floats = {t.name: t for t in m.floats}
    assert keepfloat.why_float("blk.0.ssm_conv1d.weight", floats["blk.0.ssm_conv1d.weight"].shape) == \
        "a convolution kernel"
    for n in ("blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight", "blk.0.ffn_gate_inp_shexp.weight"):
        assert n in floats, n  # the shared expert's one-row gate stays float as a router does
    # KV: the one attention layer (2 KV heads x 16, K and V, f16); the state: 624 f32 per DeltaNet layer (3)
    for ctx in (512, 8192):
        assert m.kv_bytes(ctx) == ctx * 2 * 32 * 2 + 3 * 624 * 4


# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json; its parameter count as transformers 5.24 instantiates it (meta
# device, no MTP layer: transformers builds none; the release's mtp.* tensors are extra)
_PUBLISHED = 79_674_391_296


def test_published_config_parameter_count_and_kv():
    cfg = json.loads((FIXTURES / "qwen3_next.json").read_text())
    assert archs.param_count(cfg) == _PUBLISHED
    man = manifest_from_config(cfg)
    f = man.facts
    assert f["n_layers"] == 48 and f["recurrent_layers"] == [i for i in range(48) if (i + 1) % 4]
    assert f["n_experts"] == 512 and f["n_experts_used"] == 10
    # the KV of the 12 attention layers (2 KV heads x 256, K and V, f16) plus the fixed state of the 36 DeltaNet
    # layers: conv (ck - 1)(di + 2 ng ds) and delta-rule ds x di float32 each
    assert f["state"] == 3 * (4096 + 2 * 16 * 128) + 128 * 4096
    attn, state = 12 * 32768 * 2 * 2 * 256 * 2, 36 * f["state"] * 4
    assert man.kv_bytes(32768) == attn + state
    assert 4 * attn > 3 * (attn + state)  # the hybrid's saving at 32k against 48 attention layers
    assert man.kv_bytes_all_attention(32768) == 4 * attn
    assert f["recurrent_flops"] == 2 * 4 * (4096 + 2 * 16 * 128) + 7 * 128 * 4096  # as Qwen3.5's (same mixer)
    names = {i.tensor for i in man.items}
    assert "blk.0.attn_qkv.weight" in names and "blk.3.attn_q.weight" in names and "blk.3.attn_qkv.weight" not in names


def test_plan_of_the_published_config_counts_the_attention_kv_and_the_state():
    """80B at NF4 (~42 GB) does not fit one 32 GB board: planned over two (llama.cpp RPC); each board's KV is its
    attention layers' cache plus its DeltaNet layers' state, and the two add up to the model's."""
    from typer.testing import CliRunner

    from orkpack.cli import app

    path = str(FIXTURES / "qwen3_next.json")
    r = CliRunner().invoke(app, ["plan", path, "--boards", "rk3588-32g,rk3588-32g", "--ctx", "32768", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    man = manifest_from_config(json.loads((FIXTURES / "qwen3_next.json").read_text()))
    state = man.facts["state"] * 4
    kv = [n["budget"]["ram"]["kv_cache"] for n in d["nodes"]]
    assert sum(kv) == man.kv_bytes(32768)
    for (a, b), got in zip((n["layers"] for n in d["nodes"]), kv):
        n_attn = sum(1 for i in range(a, b) if (i + 1) % 4 == 0)
        assert got == n_attn * 32768 * 2048 + (b - a - n_attn) * state


def test_plan_prints_the_attention_kv_the_state_and_the_all_attention_figure(tmp_path):
    from typer.testing import CliRunner

    from orkpack.cli import app

    (tmp_path / "config.json").write_text(json.dumps(synth.TINY["qwen3_next"]))
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "config.json"), "--ctx", "32768"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "KV cache 4.0 MiB at ctx 32768: 1 attention layers' KV + 3 recurrent layers' state" in text, text
    assert "all 4 layers attention would need 16.0 MiB" in text, text


def test_the_published_config_does_not_fit_one_board_in_one_line():
    from typer.testing import CliRunner

    from orkpack.cli import app

    r = CliRunner().invoke(app, ["plan", str(FIXTURES / "qwen3_next.json"), "--ctx", "32768"])
    assert r.exit_code != 0 and "does not fit on rk3588-32g" in r.output and "Traceback" not in r.output


def test_published_config_count_is_what_transformers_builds():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in json.loads((FIXTURES / "qwen3_next.json").read_text()).items() if not k.startswith("_")}
    with torch.device("meta"):
        m = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**cfg))
    assert sum(p.numel() for p in m.parameters()) == _PUBLISHED


@pytest.mark.parametrize("over, key", [
    ({"layer_types": ["linear_attention", "full_attention"]}, "'layer_types' lists 2 layers but 'num_hidden_layers' is 4"),
    ({"layer_types": ["linear_attention", "linear_attention", "mamba", "full_attention"]}, "'layer_types'[2] = 'mamba'"),
    ({"full_attention_interval": 2}, "'layer_types'[1] = 'linear_attention' contradicts 'full_attention_interval' = 2"),
    ({"layer_types": None, "full_attention_interval": 0}, "'full_attention_interval' is 0"),
    ({"linear_num_value_heads": 3}, "'linear_num_value_heads' = 3 is not a multiple of 'linear_num_key_heads' = 2"),
    ({"linear_num_key_heads": 0}, "'linear_num_key_heads' is 0"),
    ({"linear_conv_kernel_dim": 1}, "'linear_conv_kernel_dim' = 1"),
    ({"num_experts_per_tok": 5}, "'num_experts_per_tok' = 5 must be in 1..4"),
    ({"mlp_only_layers": "all"}, "'mlp_only_layers' must be a list of layer numbers"),
])
def test_a_contradictory_config_is_one_line(over, key):
    cfg = {**synth.TINY["qwen3_next"], **over}
    with pytest.raises(SourceError) as e:
        manifest_from_config(cfg)
    msg = str(e.value)
    assert key in msg and "\n" not in msg and msg.endswith("fix the config"), msg


def test_a_checkpoint_its_config_does_not_describe_is_one_line(tmp_path):
    """A fused in_proj_qkvz whose rows are not the config's key heads x [q, k, v, z]: named, not mis-split."""
    folder = synth.write_hf_model(tmp_path / "m", config=synth.TINY["qwen3_next"], shards=1, seed=3)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "linear_value_head_dim": 8}))
    with pytest.raises(SourceError) as e:
        open_source(folder)
    msg = str(e.value)
    assert "blk.0.ssm_in.weight (128, 64) is not 2 groups of 48" in msg and "\n" not in msg, msg
    assert msg.endswith("the checkpoint does not match its config"), msg


def test_the_interval_alone_gives_the_pattern():
    cfg = {**synth.TINY["qwen3_next"], "layer_types": None, "full_attention_interval": 2}
    assert archs.layer_blocks(cfg) == ["deltanet", "attn", "deltanet", "attn"]
    cfg = {**synth.TINY["qwen3_next"], "layer_types": None}  # Qwen3NextConfig's default interval, 4
    assert archs.layer_blocks(cfg) == ["deltanet", "deltanet", "deltanet", "attn"]
