"""Every family of orkpack.archs: tensor lists from the config alone equal the checkpoint's, KV layouts,
builds from each family's fixture, and the generic plan for architectures without an entry."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orkpack import archs
from orkpack.cli import app
from orkpack.sources import open_source
from orkpack.synth import TINY, write_gguf_model, write_hf_model
from orkpack.tiers.manifest import manifest_from_config, manifest_from_path

FAMILIES = sorted(TINY)
runner = CliRunner()


def test_every_family_has_a_fixture_and_the_list_is_complete():
    want = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
            "gemma3_text", "phi3", "internlm2", "minicpm", "minicpm3", "chatglm", "glm4", "deepseek_v2",
            "deepseek_v3", "gpt_oss", "olmoe", "granite", "granitemoe", "smollm3", "starcoder2"}
    assert want <= set(archs.SUPPORTED)
    assert set(TINY) == set(archs.FAMILIES)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: write_hf_model(root / f, config=TINY[f], shards=2, seed=11) for f in FAMILIES}


@pytest.mark.parametrize("fam", FAMILIES)
def test_config_lists_exactly_the_checkpoint_tensors(fixtures, fam):
    folder = fixtures[fam]
    cfg = json.loads((folder / "config.json").read_text())
    from_cfg = manifest_from_config(cfg)
    from_hdr = manifest_from_path(folder)
    assert [(t.name, t.shape) for t in from_cfg.tensors] == [(t.name, t.shape) for t in from_hdr.tensors]
    assert [t.dtype for t in from_cfg.tensors] == [t.dtype for t in from_hdr.tensors]
    assert from_cfg.facts == from_hdr.facts
    assert [i.key for i in from_cfg.items] == [i.key for i in from_hdr.items]
    # every decoder tensor got a GGUF-style name (only a vision tower keeps its HF names)
    left = [t.name for t in from_hdr.tensors if not (t.name.startswith("blk.") or t.name in
            ("token_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias", "output.weight", "output_norm.weight",
                 "output_norm.bias", "rope_freqs.weight", "per_layer_token_embd.weight",  # gemma4's per-layer
                 "per_layer_model_proj.weight", "per_layer_proj_norm.weight",  # embeddings, its RoPE factors
                 "altup_proj.weight", "altup_unembd_proj.weight"))]  # gemma3n's AltUp stream projections
    assert all(n.startswith(("vision_tower.", "multi_modal_projector.")) for n in left), left
    # parameters: the logical (dequantized) elements of every tensor
    # (but what the converter computes from the config: gemma4's rope_freqs, archs.generated_tensors)
    # and what it writes a second time: rwkv7's layer-0 v0/v1/v2, archs Family.copies)
    gen = sum(a.size for a in archs.generated_tensors(cfg).values())
    shapes = {t.name: t.numel for t in from_hdr.tensors}
    gen += sum(shapes[new] for new, _ in archs.FAMILIES[from_cfg.facts["arch"]].copies if new in shapes)
    assert sum(t.numel for t in from_hdr.tensors) - gen == archs.param_count(cfg)


@pytest.mark.parametrize("fam", FAMILIES)
def test_family_builds_inspects_and_verifies(fixtures, fam, tmp_path):
    out = tmp_path / f"{fam}.orkpack"
    r = runner.invoke(app, ["build", str(fixtures[fam]), "-o", str(out), "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    facts = json.loads(r.output)
    assert facts["provenance"]["arch"] == fam
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output


def test_moe_families_place_experts_one_by_one(fixtures):
    for fam in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "olmoe", "granitemoe"):
        m = manifest_from_path(fixtures[fam])
        experts = [i for i in m.items if i.role == "expert"]
        assert experts and all(i.expert is not None and i.n_experts == m.facts["n_experts"] for i in experts), fam
        # shared experts are dense, always-active items
        shared = [i for i in m.items if "shexp" in i.tensor]
        assert all(i.role == "matmul" and i.expert is None for i in shared)
        if fam in ("qwen2_moe", "deepseek_v2", "deepseek_v3"):
            assert shared, fam


def test_fused_expert_tensors_are_stacked_gate_up(fixtures):
    for fam in ("gpt_oss", "granitemoe"):
        m = manifest_from_path(fixtures[fam])
        names = {t.name: t.shape for t in m.tensors}
        E, Im, H = TINY[fam]["num_local_experts"], TINY[fam]["intermediate_size"], TINY[fam]["hidden_size"]
        assert names["blk.0.ffn_gate_up_exps.weight"] == (E, 2 * Im, H)
        assert names["blk.0.ffn_down_exps.weight"] == (E, H, Im)


# ------------------------------------------------------------------------------------------------ KV cache

def _kv(cfg, ctx, kv_type="f16"):
    return manifest_from_config(cfg).kv_bytes(ctx, kv_type)


def test_kv_gqa_and_chatglm_multi_query_groups():
    cfg = dict(TINY["llama"])
    assert _kv(cfg, 100) == 2 * 2 * 100 * (2 * 16) * 2  # layers * (K+V) * ctx * kv_heads*hd * 2 bytes
    g = dict(TINY["chatglm"])  # multi_query_group_num = 2 KV groups of kv_channels 16
    assert _kv(g, 100) == 2 * 2 * 100 * (2 * 16) * 2
    g["multi_query_attention"] = False  # then every head has its own K and V
    assert _kv(g, 100) == 2 * 2 * 100 * (4 * 16) * 2


def test_kv_sliding_window_layers_are_capped():
    g2 = TINY["gemma2"]  # window 32 on even layers (0), full on odd (1)
    assert manifest_from_config(g2).facts["swa_layers"] == [0]
    assert _kv(g2, 1000) == (32 + 1000) * 2 * (2 * 16) * 2
    assert _kv(g2, 10) == (10 + 10) * 2 * (2 * 16) * 2
    g3 = TINY["gemma3_text"]  # pattern 3: layers 0, 1 sliding, 2 global
    assert manifest_from_config(g3).facts["swa_layers"] == [0, 1]
    oss = TINY["gpt_oss"]  # layer_types: sliding, full
    assert manifest_from_config(oss).facts["swa_layers"] == [0]
    assert _kv(oss, 1000) == (32 + 1000) * 2 * (2 * 16) * 2


def test_kv_mla_is_the_compressed_latent():
    for fam in ("deepseek_v2", "deepseek_v3", "minicpm3"):
        c = TINY[fam]
        f = manifest_from_config(c).facts
        assert f["attention"] == "mla" and f["kv_k"] == c["kv_lora_rank"] + c["qk_rope_head_dim"] and f["kv_v"] == 0
        assert _kv(c, 64) == c["num_hidden_layers"] * 64 * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2
        assert _kv(c, 64, "q8_0") == c["num_hidden_layers"] * 64 * 34 * math.ceil(
            (c["kv_lora_rank"] + c["qk_rope_head_dim"]) / 32)


# ------------------------------------------------------------------------------------------- GGUF headers

@pytest.mark.parametrize("fam", ["llama", "qwen2", "qwen3_moe", "gemma2", "mixtral"])
def test_gguf_headers_give_the_same_plan(fixtures, fam, tmp_path):
    g = write_gguf_model(tmp_path / "m.gguf", config=TINY[fam], seed=11, tensor_type="BF16")
    a, b = manifest_from_path(g), manifest_from_path(fixtures[fam])
    assert [(t.name, t.shape) for t in a.tensors] == [(t.name, t.shape) for t in b.tensors]
    assert a.facts == b.facts
    assert a.kv_bytes(4096) == b.kv_bytes(4096)


# ------------------------------------------------------------------------------------------ generic plans

def test_unknown_architecture_gets_a_generic_plan_with_a_warning(tmp_path):
    cfg = dict(TINY["llama"], model_type="brand_new_lm", architectures=["BrandNewLMForCausalLM"])
    folder = write_hf_model(tmp_path / "m", config=TINY["llama"], seed=1)
    (folder / "config.json").write_text(json.dumps(cfg))
    r = runner.invoke(app, ["plan", str(folder), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)  # stdout is the tier map; the warning goes to stderr
    assert any("generic plan" in w for w in d["model"]["assumptions"]) and "generic plan" in r.stderr
    assert d["model"]["arch"] == "brand_new_lm" and d["model"]["kv_k"] == 32
    out = tmp_path / "m.orkpack"
    r = runner.invoke(app, ["build", str(folder), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "generic plan" in r.output
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
    # from config.json alone an unknown family cannot be enumerated: one line saying what to do
    r = runner.invoke(app, ["plan", str(folder / "config.json")])
    assert r.exit_code == 2 and "generic plan" in r.output and "Traceback" not in r.output


def test_no_config_records_no_invented_arch(tmp_path):
    folder = write_hf_model(tmp_path / "m", config=TINY["qwen2"], seed=1, shards=1)
    (folder / "config.json").unlink()
    out = tmp_path / "m.orkpack"
    r = runner.invoke(app, ["build", str(folder / "model.safetensors"), "-o", str(out), "--no-plan"])
    assert r.exit_code == 0, r.output
    facts = json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).output)
    assert facts["provenance"]["arch"] is None


# ------------------------------------------------------------------------------------ real configs, counts

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def _published():
    p = CONFIGS / "params.json"
    if not p.is_file():
        return []
    return sorted((k, v) for k, v in json.loads(p.read_text()).items() if v.get("params"))


@pytest.mark.parametrize("fam,rec", _published(), ids=[k for k, _ in _published()])
def test_real_config_gives_the_published_parameter_count(fam, rec):
    cfg = json.loads((CONFIGS / f"{fam}.json").read_text())
    assert archs.param_count(cfg) == rec["params"], rec["source"]


@pytest.mark.parametrize("fam", FAMILIES)
def test_family_gguf_plans_and_builds_like_its_hf_checkpoint(fixtures, fam, tmp_path):
    from orkpack.sources import as_float32
    from orkpack.synth import write_gguf_from_hf

    g = write_gguf_from_hf(fixtures[fam], tmp_path / "m.gguf")
    a, b = manifest_from_path(g), manifest_from_path(fixtures[fam])
    assert [(t.name, t.shape) for t in a.tensors] == [(t.name, t.shape) for t in b.tensors]
    fa, fb = dict(a.facts), dict(b.facts)
    # GGUF does not record every HF model_type: mistral is llama, deepseek_v3 deepseek2, gemma3 text-only
    assert fa.pop("arch") == archs.family_for_gguf(archs.gguf_arch_name(fam), fb["n_experts"] > 0).name
    fb.pop("arch")
    assert fa == fb
    assert a.kv_bytes(4096) == b.kv_bytes(4096)
    hs, gs = open_source(fixtures[fam]), open_source(g)
    for t in hs.tensors():  # identical tensor data
        assert (as_float32(hs.read(t.name)) == as_float32(gs.read(t.name))).all(), t.name
    out = tmp_path / "g.orkpack"
    r = runner.invoke(app, ["build", str(g), "-o", str(out), "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0


def test_chatglm_checkpoint_with_its_stored_inv_freq_builds(tmp_path):
    """chatglm3-6b stores transformer.rotary_pos_emb.inv_freq (fp16 [32]): dropped as derivable."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    folder = write_hf_model(tmp_path / "glm", config=TINY["chatglm"], shards=1, seed=2, dtype="f32")
    t = load_file(str(folder / "model.safetensors"))
    t["transformer.rotary_pos_emb.inv_freq"] = np.ones(8, np.float16)
    save_file(t, str(folder / "model.safetensors"))
    src = open_source(folder)
    assert [s.name for s in src.skipped()] == ["transformer.rotary_pos_emb.inv_freq"]
    m = manifest_from_path(folder)
    assert [x.name for x in m.tensors] == [x.name for x in manifest_from_config(TINY["chatglm"]).tensors]
    r = runner.invoke(app, ["build", str(folder), "-o", str(tmp_path / "g.orkpack")])
    assert r.exit_code == 0 and "inv_freq" in r.output, r.output


def test_config_without_model_type_is_known_by_its_class():
    cfg = {k: v for k, v in TINY["minicpm"].items() if k != "model_type"}
    assert archs.facts_from_config(cfg)["arch"] == "minicpm"


def test_unknown_gguf_architecture_plans_generically_from_its_metadata(tmp_path):
    import gguf
    import numpy as np

    p = tmp_path / "f.gguf"
    w = gguf.GGUFWriter(p, "falcon")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    for name, shape in (("token_embd.weight", (100, 64)), ("blk.0.attn_qkv.weight", (96, 64)),
                        ("blk.1.attn_qkv.weight", (96, 64)), ("blk.0.attn_norm.weight", (64,)), ("output.weight", (100, 64))):
        w.add_tensor(name, np.ones(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = manifest_from_path(p)
    assert m.facts["arch"] == "falcon" and m.facts["kv_k"] == 16 and m.kv_bytes(10) == 2 * 10 * 2 * 16 * 2
    assert any("'falcon' has no entry" in x for x in m.warnings)
    out = tmp_path / "f.orkpack"
    assert runner.invoke(app, ["build", str(p), "-o", str(out)]).exit_code == 0
    assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
