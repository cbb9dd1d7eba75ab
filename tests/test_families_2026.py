"""The dense and MoE families of 2025/26 that are variations of families orkpack has (issue 24), end to end against
llama.cpp's converter and transformers 5.

For each family a tiny random transformers model (seeded; orkpack.synth.TINY's config with the tokenizer's 320
tokens) is saved and converted by llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` (tests/test_lfm2.py's
helpers). Then orkpack's readers of the folder and of the converter's GGUF must give the converter's tensors (names,
shapes, values; the q/k rows of a family whose converter permutes them as llama's does, ``Forward.gguf_permuted_qk``,
compared through that permutation), the model record the converter's ``{arch}.*`` keys, the same facts, transformers'
logits within 1e-4, and packs that build, verify and evaluate alike from both; the published config of each family
(tests/fixtures/configs) plans with its parameter count.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np
import pytest

from orkpack import archs, synth
from orkpack.sources import model_facts, open_source
from orkpack.tiers.manifest import manifest_from_config

from test_lfm2 import (FIXTURES, _converter, _read_all, build_verify_eval, logits_match, record_matches_converter,
                       tiny_model)


@dataclass(frozen=True)
class Spec:
    fam: str  # the HF model_type (synth.TINY key)
    model_cls: str
    config_cls: str
    garch: str  # the converter's GGUF architecture
    record: tuple[str, ...]  # keys (after "{garch}.") the converter must have written
    over: dict = field(default_factory=dict)  # changes to TINY's config
    n_tensors: int = 0  # the converter's tensor count
    convert_args: tuple[str, ...] = ()  # more converter options
    name: str = ""  # the test id when a family has variants (default: fam)
    text: str = ""  # a release's text family (synth.TINY key) when fam is the release
    release: dict | None = None  # a release's config beside its text_config (its towers' configs)

    @property
    def id(self) -> str:
        return self.name or self.fam


SPECS = [
    Spec("ernie4_5", "Ernie4_5ForCausalLM", "Ernie4_5Config", "ernie4_5",
         ("context_length", "embedding_length", "feed_forward_length", "block_count", "attention.head_count",
          "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon", "attention.key_length"),
         n_tensors=1 + 1 + 2 * 9),  # tied: no output.weight
    Spec("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeConfig", "ernie4_5-moe",
         ("expert_count", "expert_used_count", "interleave_moe_layer_step", "leading_dense_block_count",
          "expert_feed_forward_length", "expert_shared_count", "expert_shared_feed_forward_length"),
         n_tensors=3 + 9 + 2 * 14),  # layer 0 dense; layers 1, 2: router, 3 stacked experts, bias, 3 shared
    Spec("olmo2", "Olmo2ForCausalLM", "Olmo2Config", "olmo2",
         ("embedding_length", "feed_forward_length", "attention.head_count_kv", "attention.layer_norm_rms_epsilon"),
         n_tensors=3 + 2 * 11),  # per layer: 2 post norms, q k v o, q/k norms (all heads), gate up down
    Spec("olmo3", "Olmo3ForCausalLM", "Olmo3Config", "olmo2",
         ("attention.sliding_window", "attention.sliding_window_pattern", "attention.layer_norm_rms_epsilon"),
         n_tensors=3 + 2 * 11),
    # YaRN on the full layer only (transformers 5 nests the parameters by layer type): the sliding layer's RoPE
    # unscaled, as llama.cpp's olmo2 runs it
    Spec("olmo3", "Olmo3ForCausalLM", "Olmo3Config", "olmo2",
         ("rope.scaling.type", "rope.scaling.factor", "rope.freq_base_swa", "attention.sliding_window_pattern"),
         over={"rope_parameters": {
             "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
             "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0}}},
         n_tensors=3 + 2 * 11, name="olmo3_yarn"),
    Spec("exaone4", "Exaone4ForCausalLM", "Exaone4Config", "exaone4",
         ("attention.sliding_window", "attention.sliding_window_pattern", "vocab_size", "attention.key_length"),
         n_tensors=2 + 2 * 11),  # tied
    Spec("ministral3", "Ministral3ForCausalLM", "Ministral3Config", "mistral3",
         ("rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
          "rope.scaling.yarn_log_multiplier", "attention.temperature_scale"),
         n_tensors=3 + 2 * 9),
    # a Ministral 3 release: the same text model under model.language_model. beside a Pixtral vision tower and its
    # projector, which the converter leaves to its mmproj GGUF (the text GGUF has the text model's 21 tensors)
    Spec("mistral3", "Mistral3ForConditionalGeneration", "Mistral3Config", "mistral3",
         ("rope.scaling.type", "rope.scaling.yarn_log_multiplier", "attention.temperature_scale"),
         n_tensors=3 + 2 * 9, text="ministral3",
         release={"vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                    "num_attention_heads": 2, "head_dim": 16, "image_size": 32, "patch_size": 8},
                  "spatial_merge_size": 2, "tie_word_embeddings": False}),
    Spec("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", "HunYuanDenseV1Config", "hunyuan-dense",
         ("rope.freq_base", "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length",
          "context_length"),
         n_tensors=3 + 2 * 11),
    Spec("glm4_moe", "Glm4MoeForCausalLM", "Glm4MoeConfig", "glm4moe",
         ("expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count",
          "leading_dense_block_count", "expert_gating_func", "expert_weights_scale", "expert_weights_norm",
          "rope.dimension_count"),
         # per layer 2 norms, q k v o, 3 biases, 2 q/k norms; dense 3 or MoE 8. transformers saves
         # num_nextn_predict_layers 1 but no MTP layer; the converter (without --no-mtp) counts its block all the
         # same (block_count 3 + 1, no tensors in it), as orkpack's record does (archs _NEXTN_BLOCKS)
         n_tensors=3 + 14 + 2 * 19),
]
IDS = [s.id for s in SPECS]
BY_FAM = {s.id: s for s in SPECS}


def _text_config(spec: Spec) -> dict:
    cfg = {k: v for k, v in synth.TINY[spec.text or spec.fam].items()
           if k not in ("architectures", "model_type", "torch_dtype")}
    return dict(cfg, vocab_size=320, **spec.over)  # the tokenizer's 3 + 256 + 61 tokens


def _config(spec: Spec) -> dict:
    """The tiny model's config: the text model's, or a release's with the text model's as its text_config."""
    if spec.release is None:
        return _text_config(spec)
    return dict(spec.release, text_config=dict(_text_config(spec), model_type=synth.TINY[spec.text]["model_type"]))


def _redraw(m, g, torch) -> None:
    """Every parameter redrawn: norm gains away from 1, unit-gain matrices, routing biases spread (they choose the
    experts, not their weights)."""
    for name, p in m.named_parameters():
        if "norm" in name and p.dim() == 1:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        elif name.endswith("e_score_correction_bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)


_MODELS: dict[str, tuple] = {}


@pytest.fixture
def model(request, tmp_path_factory):
    """(HF folder, the converter's GGUF, tokens, transformers' logits) of one family, made once per session."""
    spec = BY_FAM[request.param]
    if spec.id not in _MODELS:
        _MODELS[spec.id] = tiny_model(tmp_path_factory.mktemp(spec.id), spec.model_cls, spec.config_cls,
                                      _config(spec), _redraw, convert_args=spec.convert_args)
    return (spec, *_MODELS[spec.id])


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: q/k rows from halves to pairs within each head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("model", IDS, indirect=True)
def test_tensors_equal_the_converters(model):
    spec, hf, gg, _, _ = model
    conv, _ = _converter(gg)
    fam = archs.FAMILIES[spec.fam]
    cfg = _text_config(spec)
    for what, ours in (("HF folder", _read_all(hf)), ("converter GGUF", _read_all(gg))):
        assert sorted(ours) == sorted(conv), (what, sorted(set(ours) ^ set(conv)))
        for name, (ggml_shape, data) in conv.items():
            shape, a = ours[name]
            assert shape == data.shape == ggml_shape[::-1], (what, name, shape, data.shape, ggml_shape)
            if what == "HF folder" and fam.forward.gguf_permuted_qk and name.endswith(("attn_q.weight",
                                                                                          "attn_k.weight")):
                a = _permute(a, cfg["num_attention_heads"] if "attn_q" in name else cfg["num_key_value_heads"])
            assert np.array_equal(a, data), (what, name)
    assert len(conv) == spec.n_tensors, len(conv)


@pytest.mark.parametrize("model", IDS, indirect=True)
def test_model_record_has_the_converters_keys(model):
    spec, hf, gg, _, _ = model
    record_matches_converter(hf, gg, spec.garch, spec.record)


@pytest.mark.parametrize("model", IDS, indirect=True)
def test_facts_from_the_folder_and_the_converters_gguf_agree(model):
    spec, hf, gg, _, _ = model
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a["arch"] == spec.fam
    # a GGUF does not record every HF model_type: olmo3 is olmo2 (its window and pattern in the record)
    assert b.pop("arch") == archs.family_for_gguf(spec.garch, a["n_experts"] > 0).name
    a.pop("arch")
    assert a == b


@pytest.mark.parametrize("model", IDS, indirect=True)
def test_logits_match_transformers_from_folder_and_converter_gguf(model):
    spec, hf, gg, ids, ref = model
    logits_match(hf, gg, ids, ref, spec.fam)


@pytest.mark.parametrize("model", IDS, indirect=True)
def test_build_verify_eval(model, tmp_path):
    spec, hf, gg, _, _ = model
    build_verify_eval(hf, gg, tmp_path / "t.orkpack")


# ------------------------------------------------------------------------------------------------------- planning

def _published(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_plan_of_the_published_ernie_configs():
    m = manifest_from_config(_published("ernie4_5"))
    f = m.facts
    assert (f["n_layers"], f["hidden"], f["heads"], f["kv_heads"], f["head_dim"], f["tie_word_embeddings"]) == (
        18, 1024, 16, 2, 128, True)
    assert m.kv_bytes(4096) == 18 * 4096 * 2 * 2 * 128 * 2  # layers x ctx x (K + V) x 2 KV heads x 128 x f16
    m = manifest_from_config(_published("ernie4_5_moe"))
    f = m.facts
    assert (f["n_experts"], f["n_experts_used"], f["moe_intermediate"]) == (64, 6, 1536)
    names = {t.name: t.shape for t in m.tensors}
    # layer 0 dense; 1..27 MoE with 2 shared experts as one MLP of 3072 and the routing bias
    assert names["blk.0.ffn_gate.weight"] == (12288, 2560) and "blk.0.ffn_gate_inp.weight" not in names
    assert names["blk.27.ffn_gate_exps.weight"] == (64, 1536, 2560)
    assert names["blk.1.ffn_up_shexp.weight"] == (3072, 2560) and names["blk.1.exp_probs_b.bias"] == (1, 64)
    experts = [i for i in m.items if i.role == "expert"]
    assert len({i.tensor.split(".")[1] for i in experts}) == 27
    # the routing bias and the router stay float
    assert {"blk.1.exp_probs_b.bias", "blk.1.ffn_gate_inp.weight"} <= {t.name for t in m.floats}


def test_ernie_moe_layer_range_and_mtp_layers_left_out():
    cfg = dict(synth.TINY["ernie4_5_moe"], num_hidden_layers=4, moe_layer_start_index=1, moe_layer_end_index=2,
               moe_layer_interval=1)
    names = {t.name for t in manifest_from_config(cfg).tensors}
    assert [i for i in range(4) if f"blk.{i}.ffn_gate_exps.weight" in names] == [1, 2]
    cfg["moe_layer_end_index"], cfg["moe_layer_interval"] = -1, 2  # -1: to the last layer; every 2nd from 1
    names = {t.name for t in manifest_from_config(cfg).tensors}
    assert [i for i in range(4) if f"blk.{i}.ffn_gate_exps.weight" in names] == [1, 3]
    # the release's MTP layers are left out by name, as the converter's filter_tensors leaves them out
    skip = [rx for rx, _ in archs.FAMILIES["ernie4_5_moe"].skip]
    for name in ("model.mtp_block.0.mlp.gate.weight", "model.mtp_emb_norm.0.weight", "model.mtp_hidden_norm.0.weight",
                 "model.mtp_linear_proj.0.weight"):
        assert any(re.match(rx, name) for rx in skip), name
    assert not any(re.match(rx, "model.layers.1.mlp.gate.weight") for rx in skip)


def test_plan_of_the_published_olmo_configs():
    m = manifest_from_config(_published("olmo2"))
    f = m.facts
    assert f["swa_layers"] == [] and f["kv_heads"] == 16 and f["head_dim"] == 128
    names = {t.name for t in m.tensors}
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight", "blk.0.attn_q_norm.weight"} <= names
    assert "blk.0.attn_norm.weight" not in names and "blk.0.ffn_norm.weight" not in names
    m = manifest_from_config(_published("olmo3"))
    f = m.facts
    full = [3, 7, 11, 15, 19, 23, 27, 31]
    assert f["swa_window"] == 4096 and f["swa_layers"] == [i for i in range(32) if i not in full]
    kv = 2 * 32 * 128 * 2  # K + V, 32 KV heads x 128, f16, per layer and position
    # the 8 full layers hold every position, the 24 sliding ones the window's
    assert m.kv_bytes(32768) == 8 * 32768 * kv + 24 * 4096 * kv
    assert m.kv_bytes(2048) == 32 * 2048 * kv


def test_olmo3_default_layer_pattern_and_record():
    from orkpack.sources.modelkv import _hparams

    cfg = {k: v for k, v in synth.TINY["olmo3"].items() if k != "layer_types"} | {"num_hidden_layers": 8}
    assert manifest_from_config(cfg).facts["swa_layers"] == [0, 1, 2, 4, 5, 6]  # Olmo3Config: every 4th full
    kv: list = []
    _hparams(cfg, "olmo3", "olmo2", kv, lambda s: None)
    rec = {e[0]: e[2] for e in kv}
    # the converter's default pattern when layer_types is absent: (i + 1) % 4 != 0
    assert rec["olmo2.attention.sliding_window_pattern"] == [(i + 1) % 4 != 0 for i in range(8)]
    assert rec["olmo2.attention.sliding_window"] == 16
    # OLMo 2 has no window: no pattern written
    kv = []
    _hparams(synth.TINY["olmo2"], "olmo2", "olmo2", kv, lambda s: None)
    assert not any("sliding_window" in e[0] for e in kv)


def test_plan_of_the_published_exaone4_config():
    m = manifest_from_config(_published("exaone4"))
    f = m.facts
    full = list(range(3, 64, 4))
    assert f["swa_window"] == 4096 and f["swa_layers"] == [i for i in range(64) if i not in full]
    kv = 2 * 8 * 128 * 2
    assert m.kv_bytes(32768) == 16 * 32768 * kv + 48 * 4096 * kv
    names = {t.name for t in m.tensors}
    assert {"blk.0.post_attention_norm.weight", "blk.0.post_ffw_norm.weight", "blk.0.attn_q_norm.weight"} <= names
    assert "blk.0.attn_norm.weight" not in names


@pytest.mark.parametrize("pattern, layer_types, sliding", [
    ("LLLG", None, [0, 1, 2, 4, 5, 6]), (4, None, [0, 1, 2, 4, 5, 6]), ("LG", None, [0, 2, 4, 6]),
    (4, ["full_attention"] * 8, []),
])
def test_exaone4_layer_pattern_spellings_and_nope_full_layers(pattern, layer_types, sliding):
    from orkpack.model.hparams import from_config as hparams_from_config

    cfg = dict(synth.TINY["exaone4"], num_hidden_layers=8, sliding_window_pattern=pattern)
    cfg.pop("layer_types")
    if layer_types:
        cfg["layer_types"] = layer_types
    assert manifest_from_config(cfg).facts["swa_layers"] == sliding
    hp = hparams_from_config(cfg)
    # RoPE on the sliding layers only; with none of them, on every layer
    assert hp.rope_layers == (set(sliding) or set(range(8)))


def test_plan_of_the_published_glm4_moe_config():
    cfg = _published("glm4_moe")
    m = manifest_from_config(cfg)
    f = m.facts
    assert (f["n_layers"], f["n_experts"], f["n_experts_used"], f["moe_intermediate"], f["kv_heads"]) == (
        46, 128, 8, 1408, 8)
    names = {t.name: t.shape for t in m.tensors}
    assert names["blk.0.ffn_gate.weight"] == (10944, 4096) and "blk.0.ffn_gate_inp.weight" not in names
    assert names["blk.1.attn_q.bias"] == (96 * 128,) and "blk.1.attn_q_norm.weight" not in names
    assert names["blk.45.exp_probs_b.bias"] == (128,) and names["blk.45.ffn_up_shexp.weight"] == (1408, 4096)
    # the release's MTP layer: a MoE decoder layer plus the nextn tensors, after the 46 decoder layers
    assert names["blk.46.nextn.eh_proj.weight"] == (4096, 8192) and "blk.46.ffn_gate_exps.weight" in names
    assert archs.param_count({**cfg, "num_nextn_predict_layers": 0}) == 106_852_251_264  # INTELLECT-3's figure
    assert m.kv_bytes(4096) == 46 * 4096 * 2 * 8 * 128 * 2  # the MTP layer holds no KV in the plan


def test_ministral3_attention_temperature_and_its_gguf_keys():
    from orkpack.model.hparams import from_config as hparams_from_config
    from orkpack.model.hparams import to_gguf

    hp = hparams_from_config(_published("ministral3"))
    assert hp.attn_temp == (0.1, 16384) and hp.rope.params["rope_type"] == "yarn"
    assert hp.rope.attn_factor == pytest.approx(1.0)  # mscale = mscale_all_dim: transformers' factor is 1
    kv = to_gguf(hp)  # a test GGUF carries it (synth.write_gguf_from_hf), and reads back the same numbers
    assert kv["attention.temperature_scale"] == pytest.approx(0.1)
    assert archs.param_count(_published("ministral3")) == 8_489_553_920


def test_the_ministral3_release_fixture_counts_its_text_model():
    """The release's count is its text model's, the towers left out: transformers' Mistral3ForConditionalGeneration
    on the meta device, less its vision tower and projector, has the state dict archs lists."""
    torch = pytest.importorskip("torch", reason="transformers' count needs torch (test extra)")
    transformers = pytest.importorskip("transformers", reason="transformers' count needs transformers (test extra)")
    cfg = _published("mistral3")
    assert archs.param_count(cfg) == archs.param_count(_published("ministral3")) == 8_489_553_920
    c = transformers.Mistral3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    with torch.device("meta"):
        m = transformers.Mistral3ForConditionalGeneration(c)
    text = {k: v for k, v in m.state_dict().items() if not k.startswith(("model.vision_tower.",
                                                                         "model.multi_modal_projector."))}
    assert sum(v.numel() for v in text.values()) == 8_489_553_920
    assert set(text) == {n for n, _, _ in archs.hf_tensors(cfg)[1]}
    m = manifest_from_config(cfg)
    assert m.facts["arch"] == "mistral3" and m.facts["n_layers"] == 34


def test_hunyuan_ntk_alpha_rope_and_record():
    from orkpack.model.hparams import from_config as hparams_from_config
    from orkpack.sources.modelkv import _hparams

    cfg = _published("hunyuan_v1_dense")
    hp = hparams_from_config(cfg)
    base = 10000 * 1000 ** (128 / 126)
    assert hp.rope.params["rope_type"] == "ntk_alpha" and hp.rope.params["rope_theta"] == pytest.approx(base)
    assert hp.fwd.qk_norm_after_rope
    kv: list = []
    _hparams(cfg, "hunyuan_v1_dense", "hunyuan-dense", kv, lambda s: None)
    rec = {e[0]: e[2] for e in kv}
    assert rec["hunyuan-dense.rope.freq_base"] == pytest.approx(base) and rec["hunyuan-dense.rope.scaling.type"] == "none"
    assert rec["hunyuan-dense.context_length"] == 256 * 1024
    names = {t.name for t in manifest_from_config(cfg).tensors}
    assert {"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"} <= names and "output.weight" not in names
