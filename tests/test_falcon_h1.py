"""TII Falcon-H1 (falcon_h1: attention and a Mamba2 mixer in parallel in every layer, then a SwiGLU MLP, muP multipliers
folded into the weights) against llama.cpp's converter and transformers.

A tiny random ``FalconH1ForCausalLM`` (seeded; hidden 64, 3 layers, d_inner 96 = mamba_d_ssm, not 2 x hidden; 6 Mamba2
heads of 16 in 2 groups; every multiplier away from 1) is saved by transformers and converted by llama.cpp's own
``convert_hf_to_gguf.py --outtype f32`` as tests/test_lfm2.py does. The converter (FalconH1Model) folds the
multipliers into the weights: embedding_multiplier into token_embd, lm_head_multiplier into output, key_multiplier x
attention_in_multiplier into attn_k (two float32 products, in that order), attention_in_multiplier into attn_q and
attn_v, attention_out_multiplier into attn_output, ssm_in_multiplier and then ssm_multipliers[0..4] (per z / x / B / C /
dt segment of the rows) into ssm_in, ssm_out_multiplier into ssm_out, mlp_multipliers into ffn_gate and ffn_down.
orkpack's reader of the folder must make the same folds (archs Convert "scale"), so that, tensor for tensor, the
folder reads as the converter's GGUF; the model record must hold the converter's falcon-h1.* keys; the forward pass
(attention + Mamba2 summed, no multiplier left to apply) transformers' logits, from the folder and from the GGUF.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from orkpack import archs, keepfloat, synth
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.tiers.manifest import manifest_from_config

from test_granite_hybrid import _redraw
from test_lfm2 import (FIXTURES, TOL, _converter, _read_all, build_verify_eval, logits_match, record_matches_converter,
                       tiny_model)

ARCH = "falcon_h1"


def _config(**over) -> dict:
    cfg = {k: v for k, v in synth.TINY[ARCH].items() if k not in ("architectures", "model_type", "torch_dtype")}
    return dict(cfg, vocab_size=320, **over)  # the tokenizer's 3 + 256 + 61 tokens


def _tiny(tmp_path_factory, name: str, **over):
    return tiny_model(tmp_path_factory.mktemp(name), "FalconH1ForCausalLM", "FalconH1Config", _config(**over), _redraw)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(HF folder, the converter's GGUF, tokens, transformers' logits)."""
    return _tiny(tmp_path_factory, "falconh1")


@pytest.fixture(scope="module")
def normed(tmp_path_factory):
    """The gated-norm variant (mamba_rms_norm, the gate before the norm as llama.cpp's graph has it)."""
    return _tiny(tmp_path_factory, "falconh1n", mamba_rms_norm=True, mamba_norm_before_gate=False)


# ------------------------------------------------------------------------------------------- against the converter

@pytest.mark.parametrize("variant", ["model", "normed"])
def test_tensors_equal_the_converters(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    conv, _ = _converter(gg)
    per = ["attn_norm.weight", "ffn_norm", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
           "ssm_in.weight", "ssm_conv1d.weight", "ssm_conv1d.bias", "ssm_dt.bias", "ssm_a", "ssm_d", "ssm_out.weight",
           "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"] + (["ssm_norm.weight"] if variant == "normed" else [])
    # every layer holds attention and Mamba2; the FFN norm is named without ".weight", as the converter names it
    assert set(conv) == {"token_embd.weight", "output.weight", "output_norm.weight"} | {
        f"blk.{i}.{n}" for i in range(3) for n in per}
    for what, ours in (("HF folder", _read_all(hf)), ("converter GGUF", _read_all(gg))):
        assert sorted(ours) == sorted(conv), what
        for name, (ggml_shape, data) in conv.items():
            shape, a = ours[name]
            assert shape == data.shape == ggml_shape[::-1], (what, name, shape, data.shape, ggml_shape)
            assert np.array_equal(a, data), (what, name)  # the folds too: bit for bit
    c = {n: s for n, (s, _) in conv.items()}
    assert c["blk.0.ssm_in.weight"] == (64, 2 * 96 + 2 * 2 * 16 + 6) and c["blk.0.ssm_conv1d.weight"] == (4, 160)
    assert c["blk.0.ssm_a"] == c["blk.0.ssm_d"] == (1, 6)
    if variant == "normed":
        assert c["blk.0.ssm_norm.weight"] == (48, 2)


def test_the_folds_are_the_multipliers(model):
    """What the reader folded, against the checkpoint's own values (safetensors) and the config's multipliers."""
    from safetensors.numpy import load_file

    hf, _, _, _ = model
    raw = load_file(str(hf / "model.safetensors"))
    ours = _read_all(hf)
    cfg = json.loads((hf / "config.json").read_text())
    f32 = np.float32
    L = "model.layers.1."
    k = raw[L + "self_attn.k_proj.weight"] * f32(cfg["key_multiplier"]) * f32(cfg["attention_in_multiplier"])
    assert np.array_equal(ours["blk.1.attn_k.weight"][1], k)
    assert np.array_equal(ours["token_embd.weight"][1], raw["model.embed_tokens.weight"] * f32(2.5))
    assert np.array_equal(ours["output.weight"][1], raw["lm_head.weight"] * f32(0.37))
    assert np.array_equal(ours["blk.1.ffn_up.weight"][1], raw[L + "feed_forward.up_proj.weight"])  # no multiplier
    w = raw[L + "mamba.in_proj.weight"] * f32(1.2)
    for (a, b), m in zip(((0, 96), (96, 192), (192, 224), (224, 256), (256, 262)), cfg["ssm_multipliers"]):
        w[a:b] *= f32(m)
    assert np.array_equal(ours["blk.1.ssm_in.weight"][1], w)
    # a BF16 checkpoint's folds are stored in BF16, rounded to nearest even (gguf-py's BF16)
    from orkpack.sources import convlayout
    from orkpack.synth import _bf16_bits

    bits = _bf16_bits(raw[L + "self_attn.q_proj.weight"])
    got = convlayout.apply(bits, [convlayout.Change("scale", factors=(1.3,))])
    assert got.dtype == np.uint16
    assert np.array_equal(got, _bf16_bits((bits.astype(np.uint32) << 16).view(np.float32) * f32(1.3)))


@pytest.mark.parametrize("variant", ["model", "normed"])
def test_model_record_has_the_converters_keys(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    theirs = record_matches_converter(hf, gg, "falcon-h1", (
        "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.inner_size", "ssm.time_step_rank",
        "attention.head_count_kv", "context_length", "feed_forward_length", "rope.freq_base"))
    assert theirs["falcon-h1.ssm.inner_size"][2] == 96 and theirs["falcon-h1.ssm.time_step_rank"][2] == 6
    assert theirs["falcon-h1.attention.head_count_kv"][2] == 2  # one count: every layer has attention
    # the graph applies no multiplier: the converter writes none (they are in the weights)
    assert not any("multiplier" in k or k.endswith(("_scale", ".scale")) for k in theirs)


@pytest.mark.parametrize("variant", ["model", "normed"])
def test_facts_from_the_folder_and_the_converters_gguf_agree(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    # every layer is recurrent (the Mamba2 state (4 - 1) x (96 + 2 x 2 x 16) + 16 x 96, float32) and holds KV
    assert a["recurrent_layers"] == a["parallel_layers"] == [0, 1, 2] and a["state"] == 3 * 160 + 16 * 96
    assert archs.kv_layers(a) == [0, 1, 2]


@pytest.mark.parametrize("variant", ["model", "normed"])
def test_logits_match_transformers_from_folder_and_converter_gguf(variant, request):
    hf, gg, ids, ref = request.getfixturevalue(variant)
    logits_match(hf, gg, ids, ref)


def test_both_mixers_matter(model):
    """The layer is attention + Mamba2: either alone gives other logits."""
    from orkpack.model import forward, logits

    hf, _, ids, ref = model
    for alone in ("attn", "mamba2"):
        mix = dict(forward._MIXERS)
        other = next(m for m in ("attn", "mamba2") if m != alone)
        mix[other] = lambda i, x, hp, w: np.zeros_like(x)
        saved, forward._MIXERS = forward._MIXERS, mix
        try:
            err = float(np.abs(logits(hf, ids) - ref).max())
        finally:
            forward._MIXERS = saved
        assert err > 100 * TOL * float(np.abs(ref).max()), (alone, err)


def test_build_verify_eval_all_float(model, tmp_path):
    """Every tensor kept float: the pack is the folder's model (the folds made once, on read)."""
    hf, gg, _, _ = model
    build_verify_eval(hf, gg, tmp_path / "f.orkpack", build_args=("--keep", "*"), max_kld=1e-6)


def test_build_verify_eval(model, tmp_path):
    """The default plan (NF4 / int8 matrices): measured ~0.011 nats mean KLD on this random model (unit-gain
    matrices, the multipliers folded); the LFM2 / Granite bound of 0.2 keeps a mishandled block (whole nats) out."""
    hf, gg, _, _ = model
    build_verify_eval(hf, gg, tmp_path / "t.orkpack", max_kld=0.05)


# ------------------------------------------------------------------------------------------------------- planning

def test_plan_tiny():
    m = manifest_from_config(synth.TINY[ARCH])
    items = {i.tensor for i in m.items}
    assert {"blk.0.ssm_in.weight", "blk.0.ssm_out.weight", "blk.0.attn_q.weight", "blk.0.attn_output.weight",
            "blk.0.ffn_gate.weight", "token_embd.weight", "output.weight"} <= items
    floats = {t.name: t.shape for t in m.floats}
    for n in ("blk.0.ssm_a", "blk.0.ssm_d", "blk.0.ssm_conv1d.weight", "blk.0.ssm_conv1d.bias", "blk.0.ssm_dt.bias",
              "blk.0.ffn_norm", "blk.0.attn_norm.weight"):
        assert n in floats and n not in items, n
    assert floats["blk.0.ssm_a"] == (6, 1) and keepfloat.why_float("blk.0.ssm_a", (6, 1)) == keepfloat.SSM
    # every layer: its KV (2 KV heads x 16, K and V, f16) and its Mamba2 state (f32)
    state = 3 * (96 + 2 * 2 * 16) + 16 * 96
    for ctx in (100, 4096):
        assert m.kv_bytes(ctx) == 3 * ctx * 2 * 32 * 2 + 3 * state * 4
        assert m.kv_bytes_all_attention(ctx) == 3 * ctx * 2 * 32 * 2


# the published configs (tests/fixtures/configs, PARAMS.md): (fixture, params, layers, d_inner, d_state, kv x head_dim)
_PUBLISHED = [
    ("falcon_h1", 1_554_789_760, 24, 3072, 256, 2 * 128),
    ("falcon_h1_0_5b", 521_411_104, 36, 1536, 128, 2 * 64),
]


@pytest.mark.parametrize("fixture,params,L,di,ds,kvd", _PUBLISHED, ids=[p[0] for p in _PUBLISHED])
def test_plan_of_the_published_configs(fixture, params, L, di, ds, kvd):
    cfg = json.loads((FIXTURES / f"{fixture}.json").read_text())
    assert archs.param_count(cfg) == params
    m = manifest_from_config(cfg)
    f = m.facts
    assert f["recurrent_layers"] == f["parallel_layers"] == list(range(L))
    state = (4 - 1) * (di + 2 * 1 * ds) + ds * di  # n_embd_r + n_embd_s, float32
    assert f["state"] == state
    for ctx in (4096, 32768):
        assert m.kv_bytes(ctx) == L * ctx * 2 * kvd * 2 + L * state * 4
    names = {t.name for t in m.tensors}
    assert {"blk.0.attn_q.weight", "blk.0.ssm_in.weight", "blk.0.ffn_norm", "output.weight"} <= names


def test_published_count_as_transformers_builds_it():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for fixture, params, *_ in _PUBLISHED:
        cfg = json.loads((FIXTURES / f"{fixture}.json").read_text())
        c = transformers.FalconH1Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type",
                                                                                     "torch_dtype")})
        with torch.device("meta"):
            m = transformers.FalconH1ForCausalLM(c)
        assert sum(p.numel() for p in m.parameters()) == params, fixture


def test_plan_command_prints_kv_and_state_of_every_layer():
    from typer.testing import CliRunner

    from orkpack.cli import app
    from orkpack.tiers.command import _b

    r = CliRunner().invoke(app, ["plan", str(FIXTURES / "falcon_h1.json"), "--ctx", "32768"], terminal_width=400)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    kv = 24 * 32768 * 2 * 2 * 128 * 2  # layers x positions x (K + V) x 2 KV heads x 128 x f16
    state = 24 * 4 * ((4 - 1) * (3072 + 2 * 256) + 256 * 3072)
    want = (f"KV cache {_b(kv + state)} at ctx 32768: 24 attention layers' KV + 24 recurrent layers' state "
            f"{_b(state)} (per sequence, any ctx); 24 layers run attention and the recurrence in parallel, so hold "
            f"both: {_b(state)} more than all 24 layers attention alone ({_b(kv)})")
    assert want in out, out[:3000]


# ------------------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("over, key", [
    ({"mamba_n_heads": 7}, "'mamba_n_heads' = 7 does not divide 'mamba_d_ssm' = 96"),
    ({"mamba_d_head": 32}, "'mamba_d_head' = 32 x 'mamba_n_heads' = 6"),
    ({"mamba_n_groups": 4}, "'mamba_n_groups' = 4 does not divide 'mamba_n_heads' = 6"),
    ({"mamba_d_ssm": None, "mamba_n_heads": 5}, "'mamba_n_heads' = 5 does not divide 'mamba_d_ssm' = 128"),
    ({"mamba_d_state": 0}, "'mamba_d_state' is 0"),
    ({"mamba_d_conv": 1}, "'mamba_d_conv' = 1"),
    ({"mamba_rms_norm": "yes"}, "'mamba_rms_norm' = 'yes'"),
    ({"ssm_multipliers": [1.0, 1.0]}, "'ssm_multipliers' = [1.0, 1.0] is not a list of 5 numbers"),
    ({"mlp_multipliers": 2.0}, "'mlp_multipliers' = 2.0 is not a list of 2 numbers"),
    ({"key_multiplier": "x"}, "'key_multiplier' = 'x' is not a number"),
    ({"tie_word_embeddings": True}, "'tie_word_embeddings' with 'embedding_multiplier' != 'lm_head_multiplier'"),
    ({"attention_bias": True}, "'attention_bias' with 'attention_in_multiplier' / 'key_multiplier' not 1"),
    ({"mamba_proj_bias": True}, "'mamba_proj_bias' with 'ssm_in_multiplier' not 1"),
    ({"mamba_rms_norm": True, "mamba_norm_before_gate": True}, "'mamba_rms_norm' with 'mamba_norm_before_gate' true"),
])
def test_a_contradictory_config_is_one_line(over, key):
    cfg = {**synth.TINY[ARCH], **over}
    with pytest.raises(SourceError) as e:
        manifest_from_config(cfg)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg


def test_defaults_and_spellings():
    base = {**synth.TINY[ARCH]}
    assert archs.layer_blocks(base) == ["attn+mamba2"] * 3 and archs.mixers("attn+mamba2") == ("attn", "mamba2")
    d = archs.dims({**base, "mamba_d_ssm": None, "mamba_n_heads": 8})  # null: mamba_expand x hidden (FalconH1Mixer)
    assert d["di"] == 128
    cfg = {k: v for k, v in base.items() if k != "mamba_d_ssm"}
    cfg.update(mamba_n_heads=8, mamba_d_head="auto")
    assert archs.dims(cfg)["di"] == 1024 and archs.dims(cfg)["pd"] == 128  # FalconH1Config's mamba_d_ssm
    # tied with equal multipliers is the one tied form both agree on
    tied = {**base, "tie_word_embeddings": True, "lm_head_multiplier": 2.5}
    assert "lm_head.weight" not in {n for n, _, _ in archs.hf_tensors(tied)[1]}
