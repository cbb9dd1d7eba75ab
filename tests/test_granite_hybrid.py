"""IBM Granite-4.0-H (granitemoehybrid: Mamba2 + NoPE attention layers, an MoE FFN plus a shared MLP, or the shared
MLP alone) against llama.cpp's converter and transformers.

Tiny random ``GraniteMoeHybridForCausalLM`` models (seeded; hidden 64, 4 layers: mamba, attention, mamba, attention;
Mamba2 with 8 heads in 2 groups) are saved by transformers and converted by llama.cpp's own
``convert_hf_to_gguf.py --outtype f32`` as tests/test_lfm2.py does. transformers 5 saves the layer types as
"linear_attention" / "full_attention", which the converter does not read (it looks for "attention"), so the saved
config.json is given the published configs' "mamba" / "attention" before converting (transformers reads both).
Then orkpack's readers of the folder and of the converter's GGUF must give the converter's names, shapes and values
(the fused input_linear split, A = -exp(A_log), A and D (H, 1), the grouped norm (G, D / G), the squeezed conv);
the model record the converter's granitehybrid.* keys; the forward pass transformers' logits; the planner the
published Granite-4.0-H-Micro / Tiny / Small facts and parameter counts.
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

from test_lfm2 import (FIXTURES, TOL, _converter, build_verify_eval, logits_match, record_matches_converter,
                       tensors_match_converter, tiny_model)

ARCH = "granitemoehybrid"
_LEGACY = {"linear_attention": "mamba", "full_attention": "attention"}


def _config(**over) -> dict:
    cfg = {k: v for k, v in synth.TINY[ARCH].items() if k not in ("architectures", "model_type", "torch_dtype")}
    return dict(cfg, vocab_size=320, **over)  # the tokenizer's 3 + 256 + 61 tokens


def _published_names(cfg: dict) -> dict:
    return dict(cfg, layer_types=[_LEGACY.get(x, x) for x in cfg["layer_types"]])


def _redraw(m, g, torch) -> None:
    """Every parameter redrawn: norm gains away from 1, unit-gain matrices, A_log, D and dt_bias spread so that the
    heads decay at different rates."""
    for name, p in m.named_parameters():
        if "norm" in name and p.dim() == 1:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        elif name.endswith(("A_log", "dt_bias")):
            p.copy_(0.7 * torch.randn(p.shape, generator=g))
        elif name.endswith(".D"):
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)


def _tiny(tmp_path_factory, name: str, **over):
    return tiny_model(tmp_path_factory.mktemp(name), "GraniteMoeHybridForCausalLM", "GraniteMoeHybridConfig",
                      _config(**over), _redraw, edit=_published_names)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """The MoE variant (Tiny / Small): (HF folder, the converter's GGUF, tokens, transformers' logits)."""
    return _tiny(tmp_path_factory, "ghmoe")


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """The dense variant (H-Micro: num_local_experts 0, the shared MLP alone)."""
    return _tiny(tmp_path_factory, "ghdense", num_local_experts=0, num_experts_per_tok=0)


# ----------------------------------------------------------------------------------------- the Mamba2 mixer alone

def test_mamba2_mixer_matches_transformers_mamba_layer():
    """orkpack.model.mamba2 on the converter's layout of one GraniteMoeHybridMambaLayer (torch path) with 2 groups."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMambaLayer

    from orkpack.model.mamba2 import mamba2

    cfg = transformers.GraniteMoeHybridConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                              mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_head=16,
                                              mamba_d_conv=4, mamba_expand=2, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    m = GraniteMoeHybridMambaLayer(cfg, 0).float().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        _redraw(m, g, torch)
        x = torch.randn(1, 50, 64, generator=g)
        ref = m(x)[0].numpy()
    G, D = 2, 128
    w = {"ssm_in.weight": m.in_proj.weight, "ssm_conv1d.weight": m.conv1d.weight.squeeze(1),
         "ssm_conv1d.bias": m.conv1d.bias, "ssm_dt.bias": m.dt_bias, "ssm_a": -torch.exp(m.A_log).reshape(-1, 1),
         "ssm_d": m.D.reshape(-1, 1), "ssm_norm.weight": m.norm.weight.reshape(G, D // G),
         "ssm_out.weight": m.out_proj.weight}
    w = {"blk.0." + k: v.detach().numpy().astype(np.float32) for k, v in w.items()}

    class W:
        has = staticmethod(lambda n: n in w)
        tensor = staticmethod(lambda n: w[n])
        matmul = staticmethod(lambda n, a, e=None: a @ w[n].T)

    ours = mamba2(0, x[0].numpy(), SimpleNamespace(eps=1e-5), W())
    err = float(np.abs(ours - ref).max())
    assert err <= TOL * float(np.abs(ref).max()), err
    # the groups matter: B and C of group 0 for every head gives another output
    w2 = dict(w)
    w2["blk.0.ssm_norm.weight"] = w["blk.0.ssm_norm.weight"].reshape(1, -1)  # one group: another norm, another y
    assert np.abs(mamba2(0, x[0].numpy(), SimpleNamespace(eps=1e-5), type("W2", (), {
        "has": staticmethod(lambda n: n in w2), "tensor": staticmethod(lambda n: w2[n]),
        "matmul": staticmethod(lambda n, a, e=None: a @ w2[n].T)})()) - ref).max() > 100 * err


# ------------------------------------------------------------------------------------------- against the converter

def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (undo_permute: q/k rows from halves to pairs within each head)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_tensors_equal_the_converters(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    conv, _ = _converter(gg)
    mamba = ["ssm_in.weight", "ssm_conv1d.weight", "ssm_conv1d.bias", "ssm_dt.bias", "ssm_a", "ssm_d",
             "ssm_norm.weight", "ssm_out.weight"]
    attn = ["attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"]
    ffn = (["ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
            "ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"] if variant == "moe" else
           ["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"])
    want = {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{n}" for i in range(4) for n in ["attn_norm.weight", "ffn_norm.weight"] + ffn + (
            mamba if i % 2 == 0 else attn)}
    assert set(conv) == want
    # orkpack keeps the checkpoint's q/k row order (as for every llama-style family; a NoPE attention does not even
    # see it); the converter's is its permutation
    tensors_match_converter(hf, gg, conv, lambda name, a: _permute(a, 4 if "attn_q" in name else 2)
                            if name.endswith(("attn_q.weight", "attn_k.weight")) else a)
    c = {n: s for n, (s, _) in conv.items()}
    assert c["blk.0.ssm_a"] == c["blk.0.ssm_d"] == (1, 8) and c["blk.0.ssm_norm.weight"] == (64, 2)
    assert c["blk.0.ssm_conv1d.weight"] == (4, 192) and c["blk.0.ssm_in.weight"] == (64, 2 * 128 + 2 * 2 * 16 + 8)
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}
        assert info["blk.0.ssm_a"].source_name == "model.layers.0.mamba.A_log"
        up = "blk.1.ffn_up_exps.weight" if variant == "moe" else "blk.1.ffn_up.weight"
        assert info[up].source_name.endswith(("block_sparse_moe.input_linear.weight", "shared_mlp.input_linear.weight"))
    finally:
        src.close()


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_model_record_has_the_converters_keys(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    theirs = record_matches_converter(hf, gg, "granitehybrid", (
        "ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.inner_size", "ssm.time_step_rank",
        "attention.head_count_kv", "embedding_scale", "residual_scale", "attention.scale", "logit_scale",
        "expert_count", "expert_shared_feed_forward_length", "rope.scaling.finetuned"))
    assert theirs["granitehybrid.attention.head_count_kv"][2] == [0, 2, 0, 2]
    assert theirs["granitehybrid.ssm.inner_size"][2] == 128 and theirs["granitehybrid.ssm.group_count"][2] == 2
    assert theirs["granitehybrid.context_length"][2] == 2 ** 20  # NoPE
    assert theirs["granitehybrid.expert_count"][2] == (4 if variant == "moe" else 0)


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_facts_from_the_folder_and_the_converters_gguf_agree(variant, request):
    hf, gg, _, _ = request.getfixturevalue(variant)
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    # per Mamba2 layer: the conv state (4 - 1) x (128 + 2 x 2 x 16) and the SSM state 16 x 128 (float32)
    assert a["recurrent_layers"] == [0, 2] and a["state"] == 3 * 192 + 16 * 128
    assert a["n_experts"] == (4 if variant == "moe" else 0)


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_logits_match_transformers_from_folder_and_converter_gguf(variant, request):
    hf, gg, ids, ref = request.getfixturevalue(variant)
    logits_match(hf, gg, ids, ref)


def test_rope_variant_logits_match_transformers(tmp_path_factory):
    """position_embedding_type "rope": transformers rotates q and k (the record says rope.scaling.finetuned true:
    llama.cpp's granite-hybrid switch; the converter writes false for any model with Mamba layers, so its GGUF of
    such a model is run without RoPE: compared from the folder only)."""
    from orkpack.model import logits

    hf, _, ids, ref = _tiny(tmp_path_factory, "ghrope", position_embedding_type="rope")
    ours = logits(hf, ids)
    err = float(np.abs(ours - ref).max())
    assert err <= TOL * float(np.abs(ref).max()), err
    kv = {e[0]: e[2] for e in from_hf(hf, json.loads((hf / "config.json").read_text()))["kv"]}
    assert kv["granitehybrid.rope.scaling.finetuned"] is True and kv["granitehybrid.context_length"] == 4096


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_build_verify_eval(variant, request, tmp_path):
    hf, gg, _, _ = request.getfixturevalue(variant)
    build_verify_eval(hf, gg, tmp_path / "t.orkpack")


# ------------------------------------------------------------------------------------------------------- planning

def test_plan_tiny():
    m = manifest_from_config(synth.TINY[ARCH])
    items = {i.tensor for i in m.items}
    assert {"blk.0.ssm_in.weight", "blk.0.ssm_out.weight", "blk.1.attn_q.weight", "blk.0.ffn_gate_exps.weight",
            "blk.0.ffn_up_shexp.weight", "token_embd.weight"} <= items
    floats = {t.name: t.shape for t in m.floats}
    for n in ("blk.0.ssm_a", "blk.0.ssm_d", "blk.0.ssm_norm.weight", "blk.0.ssm_conv1d.weight",
              "blk.0.ssm_conv1d.bias", "blk.0.ssm_dt.bias", "blk.0.ffn_gate_inp.weight"):
        assert n in floats and n not in items, n
    assert floats["blk.0.ssm_a"] == (8, 1) and floats["blk.0.ssm_norm.weight"] == (2, 64)
    assert keepfloat.why_float("blk.0.ssm_a", (8, 1)) == keepfloat.SSM
    assert keepfloat.why_float("blk.0.ssm_norm.weight", (2, 64)) == keepfloat.SSM
    assert keepfloat.why_float("blk.0.ssm_conv1d.weight", (192, 4)) == keepfloat.CONV
    # KV for the 2 attention layers only (2 KV heads x 16, K and V, f16), the state of the 2 Mamba2 layers (f32)
    state = 3 * (128 + 2 * 2 * 16) + 16 * 128
    for ctx in (100, 4096):
        assert m.kv_bytes(ctx) == 2 * ctx * 2 * 32 * 2 + 2 * state * 4


# the published configs (tests/fixtures/configs, PARAMS.md): (fixture, params, attention layers, experts, d_inner,
# heads, state size)
_PUBLISHED = [
    ("granitemoehybrid_micro", 3_191_396_096, 0, 4096, 64, 128),
    ("granitemoehybrid", 6_939_037_248, 64, 3072, 48, 128),
    ("granitemoehybrid_small", 32_207_337_984, 72, 8192, 128, 128),
]


@pytest.mark.parametrize("fixture,params,experts,di,nm,ds", _PUBLISHED, ids=[p[0] for p in _PUBLISHED])
def test_plan_of_the_published_configs(fixture, params, experts, di, nm, ds):
    cfg = json.loads((FIXTURES / f"{fixture}.json").read_text())
    assert archs.param_count(cfg) == params
    m = manifest_from_config(cfg)
    f = m.facts
    attn = [5, 15, 25, 35]
    assert f["recurrent_layers"] == [i for i in range(40) if i not in attn] and f["n_experts"] == experts
    state = (4 - 1) * (di + 2 * 1 * ds) + ds * di  # n_embd_r + n_embd_s, float32
    assert f["state"] == state
    kv = 2 * f["kv_heads"] * f["head_dim"] * 2  # K and V, f16, per attention layer and position
    for ctx in (4096, 32768):
        assert m.kv_bytes(ctx) == 4 * ctx * kv + 36 * state * 4
    # the saving against all-attention at 32k: 36 of the 40 layers' KV
    assert m.kv_bytes(32768) < 40 * 32768 * kv / 5
    names = {t.name for t in m.tensors}
    assert ("blk.0.ffn_gate_exps.weight" in names) == bool(experts)
    assert ("blk.0.ffn_gate.weight" in names) == (not experts)
    assert "blk.5.attn_q.weight" in names and "blk.5.ssm_in.weight" not in names


def test_plan_command_prints_kv_for_the_attention_layers_and_the_state():
    from typer.testing import CliRunner

    from orkpack.cli import app

    from orkpack.tiers.command import _b

    r = CliRunner().invoke(app, ["plan", str(FIXTURES / "granitemoehybrid.json"), "--ctx", "32768"],
                           terminal_width=400)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    kv_layer = 32768 * 2 * 4 * 128 * 2  # positions x (K + V) x 4 KV heads x 128 x f16
    state = 4 * ((4 - 1) * (3072 + 2 * 128) + 128 * 3072)  # float32, per Mamba2 layer
    total = 4 * kv_layer + 36 * state
    want = (f"KV cache {_b(total)} at ctx 32768: 4 attention layers' KV + 36 recurrent layers' state "
            f"{_b(36 * state)} (per sequence, any ctx); all 40 layers attention would need {_b(40 * kv_layer)} "
            f"(saves {_b(40 * kv_layer - total)})")
    assert want in out, out[:3000]


# ------------------------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("over, key", [
    ({"layer_types": ["mamba", "attention", "mamba"]}, "'layer_types' lists 3 layers but 'num_hidden_layers' is 4"),
    ({"layer_types": ["mamba", "attention", "mamba", "conv"]}, "'layer_types'[3] = 'conv'"),
    ({"layer_types": None, "attn_layer_indices": [1, 9]}, "'attn_layer_indices' names layer 9"),
    ({"mamba_n_heads": 7}, "'mamba_n_heads' = 7 does not divide"),
    ({"mamba_d_head": 32}, "'mamba_d_head' = 32 x 'mamba_n_heads' = 8"),
    ({"mamba_n_groups": 3}, "'mamba_n_groups' = 3 does not divide 'mamba_n_heads' = 8"),
    ({"mamba_d_state": 0}, "'mamba_d_state' is 0"),
    ({"mamba_d_conv": 1}, "'mamba_d_conv' = 1"),
    ({"mamba_conv_bias": "yes"}, "'mamba_conv_bias' = 'yes'"),
    ({"num_experts_per_tok": 9}, "'num_experts_per_tok' = 9"),
    ({"num_local_experts": 0, "shared_intermediate_size": 0}, "'shared_intermediate_size' is 0"),
])
def test_a_contradictory_config_is_one_line(over, key):
    cfg = {**synth.TINY[ARCH], **over}
    with pytest.raises(SourceError) as e:
        manifest_from_config(cfg)
    msg = str(e.value)
    assert key in msg and "\n" not in msg and msg.endswith("fix the config"), msg


def test_layer_pattern_spellings():
    base = {**synth.TINY[ARCH]}
    assert archs.layer_blocks(base) == ["mamba2", "attn", "mamba2", "attn"]
    t5 = {**base, "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"]}
    assert archs.layer_blocks(t5) == ["mamba2", "attn", "mamba2", "attn"]
    assert archs.layer_blocks({**base, "layer_types": None, "attn_layer_indices": [3]}) == ["mamba2"] * 3 + ["attn"]
    assert archs.layer_blocks({**base, "layer_types": None}) == ["mamba2"] * 4  # GraniteMoeHybridConfig's default
