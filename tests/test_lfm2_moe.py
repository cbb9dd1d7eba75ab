"""LFM2-MoE (LFM2's hybrid with a sparse MoE FFN after the first dense layers) against llama.cpp's converter and
transformers.

A tiny random ``Lfm2MoeForCausalLM`` (seeded; hidden 64, 4 layers: conv, attention, conv, attention; layer 0 a
dense FFN, layers 1-3 four experts, top 2, a sigmoid router with an expert bias) is saved by transformers (which
writes one ``feed_forward.experts.E.w1/w2/w3`` tensor per expert) and converted by llama.cpp's own
``convert_hf_to_gguf.py --outtype f32`` exactly as tests/test_lfm2.py does (its pre-tokenizer lookup answered).
Then orkpack's readers of the folder and of the converter's GGUF must give the converter's names, shapes and
values (experts stacked); the model record the converter's lfm2moe.* keys.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from orkpack import archs, synth
from orkpack.sources import model_facts, open_source

from test_lfm2 import _converter, _read_all, build_verify_eval, logits_match, record_matches_converter, tiny_model

ARCH = "lfm2_moe"


def _config() -> dict:
    cfg = {k: v for k, v in synth.TINY[ARCH].items() if k not in ("architectures", "model_type", "torch_dtype")}
    return dict(cfg, vocab_size=320)  # the tokenizer's 3 + 256 + 61 tokens


def _redraw(m, g, torch) -> None:
    """Every parameter and the expert bias redrawn: norm gains away from 1, unit-gain matrices, an expert bias large
    enough to change which experts are chosen."""
    for name, p in list(m.named_parameters()) + [(n, b) for n, b in m.named_buffers() if "expert_bias" in n]:
        if "norm" in name and p.dim() == 1:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        elif "expert_bias" in name:
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(HF folder, the converter's GGUF, tokens, transformers' logits)."""
    return tiny_model(tmp_path_factory.mktemp("lfm2moe"), "Lfm2MoeForCausalLM", "Lfm2MoeConfig", _config(), _redraw)


def test_the_checkpoint_is_what_the_registry_lists(model):
    hf, _, _, _ = model
    from safetensors import safe_open

    with safe_open(str(hf / "model.safetensors"), "np") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    _, listed = archs.hf_tensors(json.loads((hf / "config.json").read_text()))
    assert saved == {n: s for n, s, _ in listed}
    assert "model.layers.1.feed_forward.experts.3.w2.weight" in saved and "model.layers.0.feed_forward.gate.weight" not in saved


def test_tensors_equal_the_converters(model):
    hf, gg, _, _ = model
    conv, _ = _converter(gg)
    # 2 top + 4 x 2 norms + layer 0's dense FFN (3) + 3 MoE layers x 5 (router, bias, 3 stacks)
    # + 2 conv layers x 3 + 2 attention layers x 6
    assert len(conv) == 2 + 8 + 3 + 15 + 6 + 12
    for what, ours in (("HF folder", _read_all(hf)), ("converter GGUF", _read_all(gg))):
        assert sorted(ours) == sorted(conv), what
        for name, (ggml_shape, data) in conv.items():
            shape, a = ours[name]
            assert shape == data.shape == ggml_shape[::-1], (what, name, shape, data.shape, ggml_shape)
            assert np.array_equal(a, data), (what, name)
    assert conv["blk.1.ffn_gate_exps.weight"][0] == (64, 32, 4)  # ggml order: numpy (E, Im, H)
    assert conv["blk.1.ffn_down_exps.weight"][0] == (32, 64, 4)
    assert conv["blk.1.ffn_gate_inp.weight"][0] == (64, 4)
    assert conv["blk.1.exp_probs_b.bias"][0] == (4,)
    assert conv["blk.0.ffn_gate.weight"][0] == (64, 96)  # the dense layer: intermediate_size, not adjusted
    assert "blk.0.ffn_gate_inp.weight" not in conv and "blk.1.ffn_gate.weight" not in conv
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}
        assert info["blk.2.exp_probs_b.bias"].source_name == "model.layers.2.feed_forward.expert_bias"
    finally:
        src.close()


def test_model_record_has_the_converters_keys(model):
    hf, gg, _, _ = model
    theirs = record_matches_converter(hf, gg, "lfm2moe", (
        "expert_count", "expert_used_count", "expert_feed_forward_length", "leading_dense_block_count",
        "expert_gating_func", "shortconv.l_cache", "attention.head_count_kv", "feed_forward_length"))
    assert theirs["lfm2moe.attention.head_count_kv"][2] == [0, 2, 0, 2]
    assert theirs["lfm2moe.leading_dense_block_count"][2] == 1 and theirs["lfm2moe.expert_gating_func"][2] == 2
    assert theirs["lfm2moe.feed_forward_length"][2] == 96 and theirs["lfm2moe.expert_feed_forward_length"][2] == 32


def test_facts_from_the_folder_and_the_converters_gguf_agree(model):
    hf, gg, _, _ = model
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    assert a["arch"] == ARCH and a["recurrent_layers"] == [0, 2] and a["state"] == 64 * 2
    assert (a["n_experts"], a["n_experts_used"], a["moe_intermediate"], a["intermediate"]) == (4, 2, 32, 96)


def test_logits_match_transformers_from_folder_and_converter_gguf(model):
    hf, gg, ids, ref = model
    logits_match(hf, gg, ids, ref)


def test_routing_is_transformers_sigmoid_with_expert_bias():
    """The router as Lfm2MoeTopKRouter computes it: chosen on sigmoid + bias, weighted by the sigmoid alone,
    normalised with 1e-6 in the sum; a bias that flips the choice changes the answer (so the test can fail)."""
    from orkpack.model.forward import _route
    from orkpack.model.hparams import from_config

    hp = from_config(synth.TINY[ARCH])

    class W:
        def __init__(self, b):
            self.b = b

        def has(self, n):
            return n.endswith("exp_probs_b.bias") and self.b is not None

        def tensor(self, n):
            return self.b

    logits = np.array([[2.0, 1.0, 0.0, -1.0]], np.float32)
    s = 1 / (1 + np.exp(-logits[0].astype(np.float64)))
    idx, wts = _route(logits, "blk.1.", hp, W(None))
    assert list(idx[0]) == [0, 1]
    np.testing.assert_allclose(wts[0], s[[0, 1]] / (s[0] + s[1] + 1e-6), rtol=1e-6)
    idx, wts = _route(logits, "blk.1.", hp, W(np.array([0, 0, 0, 5], np.float32)))
    assert list(idx[0]) == [3, 0]
    np.testing.assert_allclose(wts[0], s[[3, 0]] / (s[3] + s[0] + 1e-6), rtol=1e-6)


def test_build_verify_eval(model, tmp_path):
    hf, gg, _, _ = model
    build_verify_eval(hf, gg, tmp_path / "t.orkpack")


def test_plan_tiny_config():
    from orkpack import keepfloat
    from orkpack.tiers.manifest import manifest_from_config

    m = manifest_from_config(synth.TINY[ARCH])
    experts = [i for i in m.items if i.role == "expert"]
    # 3 MoE layers x 3 projections x 4 experts, one item each; layer 0's dense FFN plain matrices
    assert sorted((i.layer, i.tensor.split(".")[2], i.expert) for i in experts) == sorted(
        (l, p, e) for l in (1, 2, 3) for p in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") for e in range(4))
    assert all((i.n_experts, i.n_experts_used) == (4, 2) for i in experts)
    assert {(i.n, i.k) for i in experts if "down" in i.tensor} == {(64, 32)}
    names = {i.tensor for i in m.items}
    assert {"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"} <= names
    assert not any(".ffn_gate_inp." in n or "exp_probs_b" in n for n in names)
    floats = {t.name: t for t in m.floats}
    for l in (1, 2, 3):  # the routers and their biases stay float
        router = floats[f"blk.{l}.ffn_gate_inp.weight"]
        assert router.shape == (4, 64) and keepfloat.why_float(router.name, router.shape) == "an MoE router"
        assert f"blk.{l}.exp_probs_b.bias" in floats
    assert "blk.0.ffn_gate_inp.weight" not in floats
    assert m.facts["recurrent_layers"] == [0, 2] and m.facts["n_experts"] == 4


def test_a_config_without_the_router_keys_takes_lfm2moeconfigs_defaults():
    from orkpack.model.hparams import from_config

    cfg = {k: v for k, v in synth.TINY[ARCH].items() if k not in ("norm_topk_prob", "routed_scaling_factor")}
    hp = from_config(cfg)
    assert (hp.router, hp.router_norm, hp.routed_scale) == ("sigmoid", True, 1.0)
    assert from_config({**cfg, "norm_topk_prob": False}).router_norm is False
    assert from_config({**cfg, "routed_scaling_factor": 2.5}).routed_scale == 2.5
