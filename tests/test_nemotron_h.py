"""NVIDIA Nemotron-H (nemotron_h: every layer ONE block, Mamba2 'M', NoPE attention '*' or a squared-ReLU MLP '-';
its MoE form with 'E' blocks, llama.cpp's nemotron_h_moe) against llama.cpp's converter and transformers.

Tiny random ``NemotronHForCausalLM`` models (seeded; hidden 64, 6 layers "M*-M-*" and "M*EME*"; Mamba2 with 8 heads
of 16 in 2 groups) are saved by transformers 5.24 and converted by llama.cpp's own ``convert_hf_to_gguf.py
--outtype f32`` as tests/test_lfm2.py does. transformers saves the pattern as ``layers_block_type`` and always the MoE
keys of NemotronHConfig; the released configs write ``hybrid_override_pattern`` (and no MoE keys when they have no
MoE), with ``time_step_limit`` [0.0, Infinity]: the saved config.json is given those spellings before converting.
The converter is run on that config.json as released: its own fallback when transformers' AutoConfig fails is
forced (AutoConfig raises), because through transformers 5.24's NemotronHConfig.to_dict() the vendored converter
(a) always picks nemotron_h_moe (num_experts_per_tok is always there) and (b) reads the list form, where it counts
only "moe" as FFN layers: the MLP layers get feed_forward_length 0, head_count_kv 0, which llama.cpp reads as Mamba2
layers. Then orkpack's readers of the folder and of the converter's GGUF must give the converter's names, shapes and
values; the model record its nemotron_h(_moe).* keys; the forward pass transformers' logits; the planner the
reconstructed NVIDIA-Nemotron-Nano-9B-v2's facts.
"""
from __future__ import annotations

import json
import math

import pytest

import test_lfm2
from orkpack import archs, keepfloat, synth
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.sources.modelkv import from_hf
from orkpack.tiers.manifest import manifest_from_config
from test_granite_hybrid import _permute, _redraw
from test_lfm2 import (FIXTURES, _converter, build_verify_eval, logits_match, record_matches_converter,
                       tensors_match_converter, tiny_model)

_LETTER = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}
_MOE_KEYS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
             "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "n_shared_experts", "moe_latent_size",
             "moe_shared_expert_overlap", "output_router_logits", "mtp_layers_block_type", "num_nextn_predict_layers")
# the converter on config.json as released (its fallback when AutoConfig fails; see the module docstring)
_AS_RELEASED = '''class _NoAutoConfig:
    @staticmethod
    def from_pretrained(*a, **k):
        raise ValueError("read config.json as released")
base.AutoConfig = _NoAutoConfig
sys.argv = ['''


def _config(arch: str, **over) -> dict:
    cfg = {k: v for k, v in synth.TINY[arch].items() if k not in ("architectures", "model_type", "torch_dtype")}
    return dict(cfg, vocab_size=320, **over)  # the tokenizer's 3 + 256 + 61 tokens


def _as_released(moe: bool):
    def edit(c: dict) -> dict:
        c = dict(c)
        lt = c.pop("layers_block_type")
        c.update(hybrid_override_pattern="".join(_LETTER[x] for x in lt), num_hidden_layers=len(lt),
                 time_step_limit=[0.0, math.inf])
        if not moe:
            for k in _MOE_KEYS:
                c.pop(k, None)
        return c
    return edit


def _tiny(tmp_path_factory, arch: str, **over):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(test_lfm2, "_RUN_CONVERTER", test_lfm2._RUN_CONVERTER.replace("sys.argv = [", _AS_RELEASED))
        return tiny_model(tmp_path_factory.mktemp(arch), "NemotronHForCausalLM", "NemotronHConfig",
                          _config(arch, **over), _redraw, edit=_as_released(arch == "nemotron_h_moe"))


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """M * - M - * (Nemotron-H-8B / Nano-9B-v2 style): (HF folder, the converter's GGUF, tokens, transformers' logits)."""
    return _tiny(tmp_path_factory, "nemotron_h")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """M * E M E * (Nemotron-3-Nano-30B-A3B style)."""
    return _tiny(tmp_path_factory, "nemotron_h_moe")


_MAMBA = ["ssm_in.weight", "ssm_conv1d.weight", "ssm_conv1d.bias", "ssm_dt.bias", "ssm_a", "ssm_d", "ssm_norm.weight",
          "ssm_out.weight"]
_ATTN = ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"]
_MLP = ["ffn_up.weight", "ffn_down.weight"]
_MOE = ["ffn_gate_inp.weight", "exp_probs_b.bias", "ffn_up_exps.weight", "ffn_down_exps.weight", "ffn_up_shexp.weight",
        "ffn_down_shexp.weight"]


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_tensors_equal_the_converters(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    conv, fields = _converter(gg)
    ffn = _MOE if variant == "moe" else _MLP
    per = {"M": _MAMBA, "*": _ATTN, "-": _MLP, "E": _MOE}
    pattern = "M*EME*" if variant == "moe" else "M*-M-*"
    want = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}" for i, c in enumerate(pattern) for n in ["attn_norm.weight"] + per[c]}
    assert set(conv) == want and ffn
    # the converter permutes q/k rows (GraniteHybridModel's undo_permute); orkpack keeps the checkpoint's order, as
    # for every llama-style family (this NoPE attention does not even see it)
    tensors_match_converter(hf, gg, conv, lambda name, a: _permute(a, 4 if "attn_q" in name else 2)
                            if name.endswith(("attn_q.weight", "attn_k.weight")) else a)
    c = {n: s for n, (s, _) in conv.items()}
    assert c["blk.0.ssm_a"] == c["blk.0.ssm_d"] == (1, 8) and c["blk.0.ssm_norm.weight"] == (64, 2)
    assert c["blk.0.ssm_conv1d.weight"] == (4, 192) and c["blk.0.ssm_in.weight"] == (64, 2 * 128 + 2 * 2 * 16 + 8)
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}
        assert info["blk.0.ssm_a"].source_name == "backbone.layers.0.mixer.A_log"
        assert info["blk.2.attn_norm.weight"].source_name == "backbone.layers.2.norm.weight"
        if variant == "moe":
            assert info["blk.2.ffn_up_exps.weight"].shape == (4, 32, 64)
            assert info["blk.2.exp_probs_b.bias"].source_name == "backbone.layers.2.mixer.gate.e_score_correction_bias"
    finally:
        src.close()
    assert fields["general.architecture"].contents() == ("nemotron_h_moe" if variant == "moe" else "nemotron_h")


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_model_record_has_the_converters_keys(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    garch = "nemotron_h_moe" if variant == "moe" else "nemotron_h"
    rec = from_hf(hf, json.loads((hf / "config.json").read_text()))
    ours = {e[0]: e for e in rec["kv"]}
    assert ours["general.architecture"][2] == garch
    need = {"ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.inner_size", "ssm.time_step_rank",
            "attention.head_count_kv", "feed_forward_length", "attention.layer_norm_epsilon", "context_length",
            "rope.scaling.finetuned", "attention.key_length"}
    if variant == "moe":
        need |= {"expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_feed_forward_length",
                 "expert_shared_count", "expert_weights_norm", "expert_weights_scale", "expert_group_count"}
    theirs = record_matches_converter(hf, gg, garch, need)
    assert theirs[f"{garch}.attention.head_count_kv"][2] == [0, 2, 0, 0, 0, 2]
    ff = 32 if variant == "moe" else 96
    assert theirs[f"{garch}.feed_forward_length"][2] == [0, 0, ff, 0, ff, 0]
    assert theirs[f"{garch}.ssm.inner_size"][2] == 128 and theirs[f"{garch}.context_length"][2] == 2 ** 20  # NoPE


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_facts_from_the_folder_and_the_converters_gguf_agree(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    # Mamba2 layers 0 and 3 keep a state: conv (4 - 1) x (128 + 2 x 2 x 16), SSM 16 x 128; layers 2 and 4 are an FFN
    assert a["recurrent_layers"] == [0, 3] and a["ffn_layers"] == [2, 4] and a["state"] == 3 * 192 + 16 * 128
    assert a["recurrent_flops"] == 2 * 4 * 192 + 5 * 16 * 128
    assert a["arch"] == ("nemotron_h_moe" if variant == "moe" else "nemotron_h")
    assert a["n_experts"] == (4 if variant == "moe" else 0)


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_logits_match_transformers_from_folder_and_converter_gguf(variant, request):
    hf, gg, ids, ref = request.getfixturevalue(variant)
    logits_match(hf, gg, ids, ref)


@pytest.mark.parametrize("variant", ["dense", "moe"])
def test_build_verify_eval(variant, request, tmp_path):
    hf, gg, _, _ = request.getfixturevalue(variant)
    # every tensor float: the pack is the source model; its eval is the reference's
    build_verify_eval(hf, gg, tmp_path / "f.orkpack", ("--keep", "*"), max_kld=1e-6)
    # the default mixed int8 / NF4 pack: these unit-gain random models measure a mean KLD of 0.049 (dense) and 0.070
    # (MoE) nats on both paths (the float pack: 1.0e-8); LFM2's bound of 0.2 holds them with room, and a mishandled
    # block (a wrong norm, an FFN run as a mixer, a dropped residual) costs whole nats
    build_verify_eval(hf, gg, tmp_path / "t.orkpack", max_kld=0.2)


# ------------------------------------------------------------------------------------------------------- planning

def test_plan_tiny():
    for arch in ("nemotron_h", "nemotron_h_moe"):
        m = manifest_from_config(synth.TINY[arch])
        items = {i.tensor for i in m.items}
        assert {"blk.0.ssm_in.weight", "blk.0.ssm_out.weight", "blk.1.attn_q.weight", "token_embd.weight"} <= items
        assert ("blk.2.ffn_up_exps.weight" in items) == (arch == "nemotron_h_moe")
        assert ("blk.2.ffn_up.weight" in items) == (arch == "nemotron_h")
        floats = {t.name: t.shape for t in m.floats}
        for n in ("blk.0.ssm_a", "blk.0.ssm_d", "blk.0.ssm_norm.weight", "blk.0.ssm_conv1d.weight",
                  "blk.0.ssm_conv1d.bias", "blk.0.ssm_dt.bias", "blk.2.attn_norm.weight"):
            assert n in floats and n not in items, n
        assert keepfloat.why_float("blk.0.ssm_a", (8, 1)) == keepfloat.SSM
        # KV for the 2 attention layers only (2 KV heads x 16, K and V, f16); the 2 Mamba2 layers' state (f32); the
        # FFN layers neither
        state = 3 * (128 + 2 * 2 * 16) + 16 * 128
        for ctx in (100, 4096):
            assert m.kv_bytes(ctx) == 2 * ctx * 2 * 32 * 2 + 2 * state * 4
            assert m.kv_bytes_all_attention(ctx) == 4 * ctx * 2 * 32 * 2  # the 4 mixer layers


_NANO9B = "nemotron_h"  # tests/fixtures/configs/nemotron_h.json: NVIDIA-Nemotron-Nano-9B-v2 (reconstructed)


def test_plan_of_the_published_config():
    cfg = json.loads((FIXTURES / f"{_NANO9B}.json").read_text())
    assert math.isinf(cfg["time_step_limit"][1])  # as released
    assert archs.param_count(cfg) == json.loads((FIXTURES / "params.json").read_text())[_NANO9B]["params"]
    m = manifest_from_config(cfg)
    f = m.facts
    pat = cfg["hybrid_override_pattern"]
    assert f["recurrent_layers"] == [i for i, c in enumerate(pat) if c == "M"]
    assert f["ffn_layers"] == [i for i, c in enumerate(pat) if c == "-"]
    attn = [i for i, c in enumerate(pat) if c == "*"]
    assert len(attn) == 4 and len(f["recurrent_layers"]) == 27 and len(f["ffn_layers"]) == 25
    di, ds = 128 * 80, 128
    state = 3 * (di + 2 * 8 * ds) + ds * di
    assert f["state"] == state and f["recurrent_flops"] == 2 * 4 * (di + 2 * 8 * ds) + 5 * ds * di
    kv = 2 * 8 * 128 * 2  # K and V, 8 KV heads x 128, f16, per attention layer and position
    for ctx in (4096, 32768):
        assert m.kv_bytes(ctx) == 4 * ctx * kv + 27 * state * 4
    names = {t.name for t in m.tensors}
    assert "blk.1.ffn_up.weight" in names and "blk.1.ffn_gate.weight" not in names


def test_plan_command_prints_kv_for_the_attention_layers_and_the_state():
    from typer.testing import CliRunner

    from orkpack.cli import app
    from orkpack.tiers.command import _b

    r = CliRunner().invoke(app, ["plan", str(FIXTURES / f"{_NANO9B}.json"), "--ctx", "32768"], terminal_width=400)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    kv_layer = 32768 * 2 * 8 * 128 * 2
    di, ds = 128 * 80, 128
    state = 4 * (3 * (di + 2 * 8 * ds) + ds * di)
    total = 4 * kv_layer + 27 * state
    want = (f"KV cache {_b(total)} at ctx 32768: 4 attention layers' KV + 27 recurrent layers' state "
            f"{_b(27 * state)} (per sequence, any ctx); all 31 mixer layers attention would need {_b(31 * kv_layer)} "
            f"(saves {_b(31 * kv_layer - total)})")
    assert want in out, out[:3000]


# ------------------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("arch, over, key", [
    ("nemotron_h", {"hybrid_override_pattern": "M*-M-"}, "'hybrid_override_pattern' lists 5 layers but "
                                                         "'num_hidden_layers' is 6"),
    ("nemotron_h", {"hybrid_override_pattern": "M*-MX*"}, "'hybrid_override_pattern'[4] = 'X'"),
    ("nemotron_h", {"hybrid_override_pattern": 5}, "'hybrid_override_pattern' must be a string"),
    ("nemotron_h", {"layers_block_type": ["linear_attention"] * 6}, "contradicts 'layers_block_type'"),
    ("nemotron_h", {"hybrid_override_pattern": None}, "neither 'hybrid_override_pattern' nor 'layers_block_type'"),
    ("nemotron_h", {"mamba_num_heads": 7}, "'n_groups' = 2 does not divide 'mamba_num_heads' = 7"),
    ("nemotron_h", {"conv_kernel": 1}, "'conv_kernel' = 1"),
    ("nemotron_h", {"ssm_state_size": 0}, "'ssm_state_size' is 0"),
    ("nemotron_h_moe", {"hybrid_override_pattern": "M*EM-*"}, "mixes MLP ('-', mlp) and MoE ('E', moe)"),
    ("nemotron_h_moe", {"n_routed_experts": 0}, "MoE blocks ('E') need 'n_routed_experts'"),
    ("nemotron_h_moe", {"moe_latent_size": 16}, "'moe_latent_size' is set"),
])
def test_a_contradictory_config_is_one_line(arch, over, key):
    cfg = {**synth.TINY[arch], **over}
    with pytest.raises(SourceError) as e:
        manifest_from_config(cfg)
    msg = str(e.value)
    assert key in msg and "\n" not in msg, msg


def test_layer_pattern_spellings():
    base = dict(synth.TINY["nemotron_h"])
    want = ["mamba2", "attn", "mlp", "mamba2", "mlp", "attn"]
    assert archs.layer_blocks(base) == want
    t5 = {**base, "hybrid_override_pattern": None, "num_hidden_layers": None,  # as transformers 5 saves it
          "layers_block_type": ["linear_attention", "full_attention", "mlp", "linear_attention", "mlp",
                                "full_attention"]}
    assert archs.layer_blocks(t5) == want and manifest_from_config(t5).facts["n_layers"] == 6
    assert archs.config_family(base).name == "nemotron_h"
    assert archs.config_family(synth.TINY["nemotron_h_moe"]).name == "nemotron_h_moe"
    assert archs.config_family({**t5, "layers_block_type": ["moe"] * 6}).name == "nemotron_h_moe"
