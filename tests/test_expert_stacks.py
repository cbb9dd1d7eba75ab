"""What is a stack of expert matrices, and what stays float (orkpack/keepfloat.py: ``is_expert_stack``,
``why_float``): a 3-D tensor is a stack of experts only under an expert name, never for its rank alone, and
convolution kernels of any rank stay float, one slice in their source type (as llama.cpp's converter keeps
``ssm_conv1d`` and ``shortconv.conv`` in F32).

Sources: tiny Qwen3.5 and LFM2 checkpoints that transformers builds from their config classes (random init,
fixed seed; orkpack has no entry for either, so they are read as unknown architectures under their HF
names), a GGUF holding llama.cpp's 2-D kernels, every family's declaration (orkpack/archs.py) and the MoE
fixtures; and the two pack readers (Python and C) on a tensor of three dimensions written as one slice.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orkpack import archs, globs
from orkpack.build import BuildOptions, build
from orkpack.keepfloat import CONV, CONV_GLOBS, FLOAT_GLOBS, is_expert_stack, why_float
from orkpack.pack.reader import Pack, PackDamaged
from orkpack.pack.writer import PackWriter
from orkpack.runtime.verify import verify_pack
from orkpack.sources import open_source
from orkpack.synth import TINY, write_gguf_from_hf, write_hf_model
from orkpack.tiers.manifest import manifest_from_config, manifest_from_path


# ------------------------------------------------------------------------------------------------ the rule

@pytest.mark.parametrize("name,shape,expert,why", [
    ("blk.0.ffn_gate_exps.weight", (4, 8, 16), True, None),
    ("blk.3.ffn_gate_up_exps.weight", (4, 16, 16), True, None),
    ("blk.0.ffn_down_exps.weight", (4, 16, 8), True, None),
    ("blk.0.ffn_gate_up_exps.bias", (4, 16), False, "a bias"),  # gpt-oss's stacked expert biases
    ("blk.0.ffn_gate_inp.weight", (4, 16), False, "an MoE router"),
    ("blk.0.attn_q.weight", (16, 16), False, None),
    ("blk.0.attn_norm.weight", (16,), False, "not a matrix or a stack of expert matrices"),
    # 3-D, but not under an expert name: not experts, whatever the rank says
    ("blk.0.ffn_gate.weight", (4, 8, 16), False, "not a matrix or a stack of expert matrices"),
    ("model.layers.0.mlp.something.weight", (4, 8, 16), False, "not a matrix or a stack of expert matrices"),
    # convolution kernels, HF (3-D) and GGUF (2-D: llama.cpp's converter drops the 1-wide axis) names
    ("model.layers.0.linear_attn.conv1d.weight", (128, 1, 4), False, CONV),  # Qwen3.5, Qwen3-Next
    ("model.layers.0.mixer.conv1d.weight", (128, 1, 4), False, CONV),  # Mamba, Falcon-H1, NemotronH
    ("model.layers.0.conv.conv.weight", (128, 1, 3), False, CONV),  # LFM2
    ("model.layers.0.self_attn.q_conv1d.weight", (128, 1, 4), False, CONV),  # Kimi-Linear
    ("blk.0.ssm_conv1d.weight", (128, 4), False, CONV),
    ("blk.0.ssm_conv1d_q.weight", (128, 4), False, CONV),
    ("blk.0.shortconv.conv.weight", (128, 3), False, CONV),
    ("blk.0.ssm_conv1d.bias", (128,), False, "not a matrix or a stack of expert matrices"),  # a bias stays one
    ("blk.0.shortconv.in_proj.weight", (384, 128), False, None),  # the convolution's projections are matrices
])
def test_the_one_rule(name, shape, expert, why):
    assert is_expert_stack(name, shape) is expert
    assert why_float(name, shape) == why


def test_tier_maps_of_models_without_a_convolution_record_what_they_did():
    # the conv globs are recorded only by maps of models that have one: every other map reads as before
    assert not set(CONV_GLOBS) & set(FLOAT_GLOBS)
    assert FLOAT_GLOBS == ("*.bias", "*_bias", "*.ffn_gate_inp.*", "*.ffn_gate_inp_*")


@pytest.mark.parametrize("fam", sorted(TINY))
def test_every_declared_3d_tensor_is_an_expert_stack(fam):
    """The declarations (orkpack/archs.py) and the rule agree: each family's 3-D tensors (per-expert HF
    tensors stacked on read, gpt-oss's and granitemoe's own stacks) are expert stacks by their canonical
    names, and they are exactly the tensors whose items are experts."""
    m = manifest_from_config(TINY[fam])
    three = {t.name: t.shape for t in m.tensors if len(t.shape) == 3}
    # the converter's own stacks of other tensors (gemma3n's AltUp projections: archs Family.stack, indexed) stay float
    own = {st.glob for st in archs.FAMILIES[fam].stack if st.hf}
    assert all(why_float(n, three[n]) for n in own & set(three)) and not any(i.tensor in own for i in m.items)
    three = {n: s for n, s in three.items() if n not in own}
    assert all(is_expert_stack(n, s) for n, s in three.items()), three
    experts = {}
    for it in m.items:
        if it.role == "expert":
            experts.setdefault(it.tensor, []).append(it.expert)
    assert experts == {n: list(range(s[0])) for n, s in three.items()}
    assert all(why_float(t.name, t.shape) for t in m.tensors if len(t.shape) > 3)  # SigLIP's patch embedding


# ---------------------------------------------------------------------- tiny Qwen3.5 and LFM2 from transformers

TINY_HF = {  # model_type -> (config class, model class, config keys)
    "qwen3_5_text": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", dict(
        vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4, tie_word_embeddings=True)),
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", dict(
        vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4, full_attn_idxs=[2],
        num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3)),
}
CONV_LAYERS = {"qwen3_5_text": [0, 1, 2], "lfm2": [0, 1, 3]}  # Qwen3.5: 3 linear-attention layers, then full
# both declared (orkpack/archs.py): their canonical names, the kernel squeezed to the converter's [C, K] (Qwen3.5's
# value channels also tiled as the converter tiles them: a permutation of the stored bf16 rows)
CONV_NAME = {"qwen3_5_text": "blk.{}.ssm_conv1d.weight", "lfm2": "blk.{}.shortconv.conv.weight"}


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = {}
    for mt, (cfg_cls, model_cls, kw) in TINY_HF.items():
        if not hasattr(transformers, cfg_cls):
            pytest.skip(f"transformers {transformers.__version__} has no {cfg_cls}")
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**kw)).to(torch.bfloat16)
        folder = tmp_path_factory.mktemp(mt) / "model"
        model.save_pretrained(folder)  # safetensors, bf16
        assert json.loads((folder / "config.json").read_text())["model_type"] == mt
        out[mt] = folder
    return out


@pytest.fixture(scope="module")
def hf_packs(hf_tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("packs")
    return {(mt, plan): build(folder, d / f"{mt}-{plan}.orkpack", BuildOptions(threads=1, plan=plan == "plan"))
            for mt, folder in hf_tiny.items() for plan in ("plan", "no-plan")}


@pytest.mark.parametrize("plan", ["plan", "no-plan"])
@pytest.mark.parametrize("mt", sorted(TINY_HF))
def test_conv_kernels_are_one_float_slice_in_their_source_type(hf_tiny, hf_packs, mt, plan):
    res = hf_packs[(mt, plan)]
    src = open_source(hf_tiny[mt])
    try:
        infos = {i.name: i for i in src.tensors()}
        conv = [CONV_NAME[mt].format(i) for i in CONV_LAYERS[mt]]
        assert set(conv) == {n for n in infos if any(globs.matches(n, g) for g in CONV_GLOBS)}
        with Pack.open(res.path) as p:
            by = {t["name"]: t for t in p.tensors}
            for n in conv:
                t, info = by[n], infos[n]
                assert (info.shape[1] == 1 if len(info.shape) == 3 else len(info.shape) == 2) and info.dtype == "BF16"
                assert t["shape"] == list(info.shape) and len(t["slices"]) == 1, n
                s = t["slices"][0]
                assert (s["expert"], s["encoding"], s["tier"], s["shape"]) == (None, "bf16", "host", list(info.shape))
                # kept as stored: the source's bf16 bits
                assert p.part(s["parts"]["data"]).tobytes() == np.ascontiguousarray(src.read(n)).tobytes(), n
            # these models have no experts: no slice is one
            assert all(s["expert"] is None and len(t["slices"]) == 1 for t in p.tensors for s in t["slices"])
            if plan == "plan":  # the embedded tier map: one float decision per kernel, and the rule recorded
                tm = p.header["tiermap"]
                dec = {t["name"]: t["slices"] for t in tm["tensors"]}
                for n in conv:
                    assert [(s["expert"], s["encoding"], s["shape"]) for s in dec[n]] == [
                        (None, "bf16", list(infos[n].shape))], n
                assert tm["options"]["default_keep"] == list(FLOAT_GLOBS + CONV_GLOBS)
    finally:
        src.close()
    # the matrices are still quantized, and the pack is smaller than its source (it was 3-6x larger: every
    # kernel channel a 4 KiB-aligned "expert" slice, most of them NF4)
    low = sum(res.by_kind.get((e, "host"), {}).get("slices", 0) for e in ("nf4dq", "int5dq"))  # the low level: the
    assert low >= 8  # plan's int5dq on these tiny models, nf4dq without a plan
    assert res.pack_bytes <= (hf_tiny[mt] / "model.safetensors").stat().st_size
    assert res.worst_sqnr is None or not any(n in res.worst_sqnr[0] for n in ("conv1d", "conv.conv"))
    assert verify_pack(res.path).exit_code == 0


def test_conv_kernels_in_the_c_reader(check, hf_packs):
    from test_c_reader import c_codes

    paths = [r.path for r in hf_packs.values()]
    assert c_codes(check, paths) == [0] * len(paths)


@pytest.mark.parametrize("mt", sorted(TINY_HF))
def test_a_followed_tier_map_keeps_them_float_and_an_older_one_is_refused(hf_tiny, mt, tmp_path):
    from orkpack.errors import OrkError
    from orkpack.tiers.command import plan

    tm, _, _ = plan(hf_tiny[mt])
    mp = tmp_path / "map.json"
    d = tm.to_json()
    mp.write_text(json.dumps(d))
    res = build(hf_tiny[mt], tmp_path / "m.orkpack", BuildOptions(threads=1, tiermap=mp))
    with Pack.open(res.path) as p:
        t = next(t for t in p.tensors if t["name"] == CONV_NAME[mt].format(0))
        assert [(s["expert"], s["encoding"]) for s in t["slices"]] == [(None, "bf16")]
    # a map planned when the kernel was taken for experts (one NF4 item per channel) no longer fits
    t = next(x for x in d["tensors"] if x["name"] == CONV_NAME[mt].format(0))
    one = t["slices"][0]
    C, K = one["shape"][0], one["shape"][-1]  # [C, 1, K] undeclared, [C, K] as LFM2's entry lays it out
    t["slices"] = [dict(one, expert=e, shape=[1, K] if len(one["shape"]) == 3 else [K], encoding="nf4")
                   for e in range(C)]
    mp.write_text(json.dumps(d))
    with pytest.raises(OrkError, match=r"does not cover 1 item .*plan this source again"):
        build(hf_tiny[mt], tmp_path / "old.orkpack", BuildOptions(threads=1, tiermap=mp))


def test_a_pin_on_a_conv_kernel_says_it_stays_float(hf_tiny, tmp_path):
    res = build(hf_tiny["lfm2"], tmp_path / "m.orkpack", BuildOptions(threads=1, plan=False, nf4=["*.shortconv.conv.weight"]))
    assert any("always stay float" in w and CONV in w for w in res.warnings), res.warnings


# ------------------------------------------------------------------------- a GGUF with llama.cpp's 2-D kernels

def test_gguf_2d_conv_kernels_stay_float(tmp_path):
    """llama.cpp's converter stores ssm_conv1d and shortconv.conv 2-D ([channels, kernel]) in F32; they are
    matrices by rank but kernels by name, and stay F32 (planned and by rules)."""
    import gguf

    rng = np.random.default_rng(5)
    p = tmp_path / "lfm2.gguf"
    w = gguf.GGUFWriter(p, "lfm2")  # no entry in orkpack: read generically
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    shapes = {"token_embd.weight": (256, 64), "blk.0.attn_norm.weight": (64,),
              "blk.0.shortconv.conv.weight": (64, 3), "blk.0.shortconv.in_proj.weight": (192, 64),
              "blk.0.shortconv.out_proj.weight": (64, 64), "blk.1.ssm_conv1d.weight": (64, 4),
              "blk.1.ssm_conv1d.bias": (64,), "blk.1.ssm_in.weight": (128, 64)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    m = manifest_from_path(p)
    assert {i.tensor for i in m.items} == {"token_embd.weight", "blk.0.shortconv.in_proj.weight",
                                           "blk.0.shortconv.out_proj.weight", "blk.1.ssm_in.weight"}
    for plan in (True, False):
        res = build(p, tmp_path / f"{plan}.orkpack", BuildOptions(threads=1, plan=plan))
        with Pack.open(res.path) as pk:
            enc = {t["name"]: [s["encoding"] for s in t["slices"]] for t in pk.tensors}
        assert enc["blk.0.shortconv.conv.weight"] == enc["blk.1.ssm_conv1d.weight"] == ["f32"], enc
        assert enc["blk.1.ssm_in.weight"] != ["f32"]


# ------------------------------------------------------------------------------- real experts, as before

@pytest.mark.parametrize("fam", ["mixtral", "qwen3_moe", "gpt_oss", "granitemoe"])
def test_moe_experts_are_still_one_slice_per_expert(fam, tmp_path):
    folder = write_hf_model(tmp_path / fam, config=TINY[fam], shards=1, seed=11)
    E = TINY[fam].get("num_experts") or TINY[fam]["num_local_experts"]
    for name, src in (("hf", folder), ("gguf", write_gguf_from_hf(folder, tmp_path / f"{fam}.gguf"))):
        for plan in (True, False):
            res = build(src, tmp_path / f"{name}-{plan}.orkpack", BuildOptions(threads=1, plan=plan))
            with Pack.open(res.path) as p:
                stacks = [t for t in p.tensors if len(t["shape"]) == 3]
                assert stacks and all(t["name"].endswith("_exps.weight") for t in stacks), [t["name"] for t in stacks]
                for t in stacks:
                    assert t["shape"][0] == E
                    assert [s["expert"] for s in t["slices"]] == list(range(E)), t["name"]
                    assert all(s["shape"] == t["shape"][1:] for s in t["slices"])
                    assert all(s["encoding"] not in ("f32", "f16", "bf16") for s in t["slices"]), t["name"]


# ------------------------------------------------------------------------------------------------ the readers

def _write_whole_3d(path: Path) -> None:
    """A pack with a 3-D float tensor as one slice (a convolution kernel) beside a stack of experts."""
    r = np.random.default_rng(2)
    with PackWriter(path, provenance={"source_format": "test", "sources": [], "arch": None, "options": {}},
                    config=None, tiermap=None) as w:
        k = r.standard_normal((8, 1, 4)).astype(np.float32)
        w.add_tensor("model.layers.0.conv.conv.weight", "c", [8, 1, 4], "F32",
                     [dict(expert=None, shape=[8, 1, 4], encoding="f32", tier="host", layout={"kind": "row_major"},
                           parts={"data": k}, sqnr_db=None)])
        q, sc = r.integers(-127, 128, size=(3, 40), dtype=np.int8), r.random(3, dtype=np.float32)
        w.add_tensor("blk.0.ffn_down_exps.weight", "d", [2, 3, 40], "F16",
                     [dict(expert=e, shape=[3, 40], encoding="int8", tier="host", layout={"kind": "row_major"},
                           parts={"q": q + e, "scale": sc}, sqnr_db=30.0) for e in range(2)])
        w.finish()


def test_a_3d_tensor_of_one_slice_reads(tmp_path):
    p = tmp_path / "a.orkpack"
    _write_whole_3d(p)
    with Pack.open(p) as pk:
        t = pk.tensors[0]
        assert [s["expert"] for s in t["slices"]] == [None] and t["slices"][0]["shape"] == [8, 1, 4]
        assert [s["expert"] for s in pk.tensors[1]["slices"]] == [0, 1]
    assert verify_pack(p, reference=True).exit_code == 0


WHOLE_3D_BAD = [  # (mutation of the one-slice 3-D tensor's record, what the reader says)
    (lambda t: t["slices"].append(dict(t["slices"][0])), "must have one slice"),
    (lambda t: t["slices"][0].update(shape=[1, 4]), "shape or expert index"),
    (lambda t: t["slices"][0].update(expert=0), "slices for 8 experts"),
]


@pytest.mark.parametrize("mutate,why", WHOLE_3D_BAD)
def test_a_3d_tensor_of_one_slice_must_cover_it(tmp_path, mutate, why):
    from test_pack import _rewrite_header

    p = tmp_path / "a.orkpack"
    _write_whole_3d(p)
    _rewrite_header(p, lambda h: mutate(h["tensors"][0]))
    with pytest.raises(PackDamaged, match=why):
        Pack.open(p)


def test_the_c_reader_agrees_on_3d_tensors_of_one_slice(check, tmp_path):
    from test_c_reader import agree, c_codes
    from test_pack import _rewrite_header

    good = tmp_path / "good.orkpack"
    _write_whole_3d(good)
    bad = []
    for k, (mutate, _) in enumerate(WHOLE_3D_BAD):
        q = tmp_path / f"bad{k}.orkpack"
        _write_whole_3d(q)
        _rewrite_header(q, lambda h, m=mutate: m(h["tensors"][0]))
        bad.append(q)
    assert c_codes(check, [good] + bad) == [0] + [1] * len(bad)
    agree(check, [good] + bad)
