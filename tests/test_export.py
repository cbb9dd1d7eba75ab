"""orkpack export: a pack's path as a GGUF that llama.cpp runs, checked by llama.cpp itself.

What must hold: a float pack's export is llama.cpp's converter's GGUF of the same HF folder, tensor for tensor and
bit for bit, with its hyperparameter keys; a quantized pack's export holds, per tensor, the weights the path's
matmuls read (decode: the CPU copies; prefill: the NPU's int8 images); llama-perplexity of the export gives the
perplexity orkpack eval reports for that path with float activations (the real SmolLM2 and tiny models of the
families, from an HF folder and from the converter's GGUF); the same pack gives the same bytes; bad input is one
line with nothing written.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from llama_cpp import need, perplexity
from orkpack import synth
from orkpack.build import BuildOptions, build
from orkpack.cli import app
from orkpack.eval.export import export
from orkpack.eval.run import Options, evaluate
from orkpack.eval.weights import PackWeights
from orkpack.pack.reader import Pack

LLAMA_CPP = Path(os.environ.get("ORKPACK_LLAMA_CPP", Path(__file__).resolve().parents[1] / ".cache" / "llama.cpp"))
CTX = 64
WORDS = ("the of and to in is was that for on with as by at from his her it an be this are which or had not but "
         "have were one all their they been has would when who will more if no out so said what up its about into "
         "than them can only other new some could time these two may then do first any my now such like our over "
         "man me even most made after also did many before must through back years where much your way well down "
         "should because each just those people how too little state good very make world still own see men work "
         "long get here between both life being under never day same another know while last might us great old "
         "year off come since against go came right used take three").split()


def _gguf():
    import gguf

    return gguf


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def text(tmp) -> Path:
    """Lowercase words and single spaces: the GPT-2 pre-tokenizer (transformers') and llama.cpp's "default" one
    (the record's tokenizer.ggml.pre for an HF folder) split it alike, so both tokenize it to the same ids."""
    p = tmp / "words.txt"
    p.write_text(" ".join(np.random.default_rng(0).choice(WORDS, 1200)) + "\n")
    return p


# Where synth.TINY's shape is one llama.cpp 0c1e570 cannot run at all (its own converter's GGUF of that folder fails to
# load or aborts just the same), this test's copy takes the shape of the real releases, which llama.cpp assumes:
LLAMA_CPP_SHAPE = {
    # qwen35.cpp / qwen3next.cpp: head_v_dim = ssm_d_state, the key head size (Qwen3.5 / Qwen3-Next: both 128)
    "linear_value_head_dim": lambda c: c["linear_key_head_dim"],
    # gemma4.cpp: per_layer_token_embd has n_vocab rows (Gemma 4: vocab_size_per_layer_input = vocab_size)
    "vocab_size_per_layer_input": lambda c: c["vocab_size"],
}
_G3N_SHAPE = lambda c: {"hidden_size_per_layer_input": 256, "laurel_rank": 64,  # noqa: E731
                        "intermediate_size": [c["intermediate_size"][0]] * len(c["intermediate_size"])}
LLAMA_CPP_FAMILY_SHAPE = {
    # minicpm3.cpp caches the decompressed K/V of n_head_kv heads: MiniCPM3 has num_key_value_heads = heads
    "minicpm3": lambda c: {"num_key_value_heads": c["num_attention_heads"]},
    # ChatGLM's vocabulary is padded_vocab_size (the fixture's 128 would not hold the fixture tokenizer's ids)
    "chatglm": lambda c: {"padded_vocab_size": 512},
    # qwen2moe.cpp (and the converter's tensor map) want experts in every layer: no mlp_only_layers (Qwen1.5-MoE has
    # none)
    "qwen2_moe": lambda c: {"mlp_only_layers": []},
    # deepseek2.cpp reads attention.q_lora_rank unless n_layer is a "lite" count (26, 27, 48): a q LoRA (DeepSeek-V2)
    # (and caches n_head_kv heads of the decompressed K/V as minicpm3's: DeepSeek-V2 has num_key_value_heads = heads)
    "deepseek_v2": lambda c: {"q_lora_rank": 48, "num_key_value_heads": c["num_attention_heads"]},
    # DeepSeek-V3's releases state their routing; the fixture leaves it to the defaults, which transformers' (norm,
    # scale 2.5, 8 groups), the converter's (transformers') and orkpack's (no norm, scale 1, one group) differ on
    "deepseek_v3": lambda c: {"num_key_value_heads": c["num_attention_heads"], "scoring_func": "sigmoid",
                              "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1},
    # gemma3.cpp scales attention by 1/sqrt(head_dim) and reads no query_pre_attn_scalar (the releases have it equal,
    # but 27B's); the multimodal fixture's text_config leaves it at transformers' 256
    "gemma3": lambda c: {"query_pre_attn_scalar": c["head_dim"]},
    # gemma3n.cpp: the per-layer embeddings n_embd_altup = 256 wide and LAuReL of rank 64, constants of
    # llama-hparams.h that no key sets, and one FFN width, layer 0's, for every layer (Gemma 3n: 256, 64, one width)
    "gemma3n_text": lambda c: _G3N_SHAPE(c),
    "gemma3n": lambda c: _G3N_SHAPE(c),
    # starcoder2.cpp: GELU whatever hidden_act says (StarCoder2: gelu_pytorch_tanh); and the fixture's leftover
    # rms_norm_eps (synth's base) is what the converter and orkpack's HF reader take before norm_epsilon (5 drops it)
    "starcoder2": lambda c: {"hidden_act": "gelu_pytorch_tanh", "rms_norm_eps": None},
    # smollm3.cpp: no RoPE on every 4th layer (n_no_rope_layer_step = 4, set in code; the converter writes no
    # no_rope_layers); SmolLM3-3B's no_rope_layers say the same, the fixture's [1, 0] does not
    "smollm3": lambda c: {"no_rope_layers": [int((i + 1) % 4 != 0) for i in range(c["num_hidden_layers"])]},
    # ernie4-5.cpp:10 reads the shared expert's width from expert_shared_feed_forward_length, which the converter
    # (conversion/ernie.py:94-97) writes as intermediate_size // num_key_value_heads, not transformers'
    # moe_intermediate_size x moe_num_shared_experts; the two agree on the release (ERNIE-4.5-21B-A3B: 12288 // 4 =
    # 1536 x 2), not on the fixture (96 // 2 = 48 against 32 x 1): its dense width made the release's relation
    "ernie4_5_moe": lambda c: {"intermediate_size": c["moe_intermediate_size"] * c["moe_num_shared_experts"]
                               * c["num_key_value_heads"]},
    # llama-model.cpp:2784-2785: a KV-sharing layer reuses layer n_layer_kv_from_start - 2 if sliding, else - 1 (the
    # last own-KV layers sliding then full, as in the releases: E2B's 15th of 35 and E4B's 24th of 42 full); the
    # fixture's own layers end full, sliding (transformers: each reuses the last own layer of its type), so llama.cpp
    # aborts (llama-kv-cache.cpp:268); 3 shared layers of the 6 end them sliding, full as the releases
    "gemma4": lambda c: {"num_kv_shared_layers": 3},
    "gemma4_text": lambda c: {"num_kv_shared_layers": 3},
    # exaone4.cpp: sliding layers only for a 64-layer model (32B; window 4096 set in code), every other layer count
    # full attention with RoPE everywhere (EXAONE-4.0-1.2B: no sliding layers)
    "exaone4": lambda c: {"sliding_window": None, "sliding_window_pattern": None,
                          "layer_types": ["full_attention"] * c["num_hidden_layers"]},
}


def _tiny(tmp: Path, family: str) -> Path:
    cfg = copy.deepcopy(synth.TINY[family])
    c = cfg.get("text_config") or cfg
    c["vocab_size"] = 512  # room for the fixture tokenizer's 459 tokens
    for k, f in LLAMA_CPP_SHAPE.items():
        if k in c:
            c[k] = f(c)
    for k, v in LLAMA_CPP_FAMILY_SHAPE.get(family, lambda c: {})(c).items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    folder = synth.write_hf_model(tmp / f"{family}-hf", config=cfg, seed=1)
    synth.write_tokenizer(folder, n_merges=200)
    return folder


# the families whose converter class exports multi-token-prediction layers and, for a checkpoint without them (ours:
# no mtp_num_hidden_layers), must be told so (_Qwen35MtpMixin asserts otherwise)
NO_MTP = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")


def _convert(hf: Path, out: Path) -> Path:
    """llama.cpp's own converter of ``hf`` (F32), its tokenizer pre-name forced (tests/test_lfm2.py)."""
    from test_lfm2 import _RUN_CONVERTER

    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {LLAMA_CPP} (scripts/test.sh unpacks it; or set ORKPACK_LLAMA_CPP)")
    env = dict(os.environ, PYTHONPATH=str(LLAMA_CPP / "gguf-py"))
    import json

    mt = json.loads((hf / "config.json").read_text()).get("model_type")
    r = subprocess.run([sys.executable, "-c", _RUN_CONVERTER, str(LLAMA_CPP), str(hf), "--outtype", "f32",
                        "--outfile", str(out), *(["--no-mtp"] if mt in NO_MTP else [])], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _read(path: Path):
    gguf = _gguf()
    r = gguf.GGUFReader(str(path))
    tensors = {t.name: (tuple(int(x) for x in t.shape), gguf.quants.dequantize(t.data, t.tensor_type), t.tensor_type)
               for t in r.tensors}
    return tensors, {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def _eval_ppl(pack: Path, text: Path, ctx: int, chunks: int, act: str = "token") -> dict:
    r = evaluate(None, pack, Options(text=text, ctx=ctx, chunks=chunks, act=act))
    return {p["path"]: p["ppl"] for p in r["paths"]}


# ------------------------------------------------------------------------------------------ layout and record

LAYOUT_FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "qwen3_moe", "granite", "mixtral", "olmo2"]


@pytest.mark.parametrize("family", LAYOUT_FAMILIES)
def test_float_export_is_the_converters_gguf(tmp, family):
    """Every matrix kept float: the export from the HF folder's pack is the converter's GGUF, the same tensor names,
    ggml shapes and values bit for bit (q/k permuted, norm offsets, fused tensors split as the converter does), and
    every hyperparameter key the converter writes with its value."""
    hf = _tiny(tmp, family)
    conv = _convert(hf, tmp / f"{family}-conv.gguf")
    pack = tmp / f"{family}-float.orkpack"
    build(hf, pack, BuildOptions(threads=1, plan=False, keep=["*"]))
    r = export(pack, tmp / f"{family}-float.gguf")
    assert r.layout == "hf"
    mine, fields = _read(r.path)
    theirs, cfields = _read(conv)
    assert sorted(mine) == sorted(theirs)
    for name, (shape, a, _) in mine.items():
        assert shape == theirs[name][0], name
        np.testing.assert_array_equal(a, theirs[name][1], err_msg=name)
    arch = cfields["general.architecture"]
    assert fields["general.architecture"] == arch
    for k, v in cfields.items():
        if k.startswith(f"{arch}."):
            assert k in fields, k
            assert fields[k] == pytest.approx(v, rel=1e-6), k
    assert fields["general.file_type"] == 0 and fields["orkpack.export.path"] == "decode"


def test_export_holds_each_paths_weights(tmp):
    """A quantized pack: decode's export holds the CPU's weights (host copies of dual-resident slices, int8 images
    of NPU slices without one, NF4 host slices), prefill's the NPU's int8 images; a tied head on the NPU with a host
    copy is written twice on prefill (token_embd the rows the lookup reads, output.weight the NPU's image)."""
    hf = synth.write_hf_model(tmp / "mixed-hf", layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512,
                              seed=3, tied=True)
    synth.write_tokenizer(hf, n_merges=200)
    import json

    m = 4096  # above every min_m of this model: prefill runs every NPU slice on the NPU
    tm = tmp / "mixed-map.json"
    res = CliRunner().invoke(app, ["plan", str(hf), "--npu", "blk.0.*", "--nf4", "blk.1.*", "--host-low", "nf4",
                                   "-o", str(tm)])  # NF4 host slices and copies (not the levels this model would take)
    assert res.exit_code == 0, res.output
    d = json.loads(tm.read_text())
    for t in d["tensors"]:  # the tied head to the NPU with a host copy (the planner keeps it on the host)
        if t["name"] == "token_embd.weight":
            t["slices"][0].update(tier="npu", host_copy="nf4", host_copy_bytes=512 * 128 // 2 + 512 * 128 // 64 * 4)
    tm.write_text(json.dumps(d))
    pack = tmp / "mixed.orkpack"
    build(hf, pack, BuildOptions(threads=1, tiermap=tm))
    dec, pre = export(pack, tmp / "mixed-dec.gguf"), export(pack, tmp / "mixed-pre.gguf", path="prefill", m=m)
    d, _ = _read(dec.path)
    p, pf = _read(pre.path)
    assert not dec.head_untied and pre.head_untied and "output.weight" in p and "output.weight" not in d
    assert pf["orkpack.export.path"] == "prefill" and pf["orkpack.export.prefill_m"] == m
    from orkpack.sources import converter, model_facts  # the export's q/k rows: the converter's permutation of the pack's
    from orkpack import archs

    with Pack.open(pack) as pk:
        facts = model_facts(pk.header["config"])
        fix = converter.rules(archs.FAMILIES[facts["arch"]], facts).fix
        kinds = set()
        for path, got in (("decode", d), ("prefill", p)):
            pw = PackWeights(pk, path, m=m)
            for t, s in pk.slices():
                if len(s["shape"]) != 2:
                    continue
                name = t["name"]
                op = pw._operand(name, None)
                want = fix(name, op.rows(0, op.n))
                kinds.add((path, op.engine, s["encoding"], "host_copy" in s))
                gname = "output.weight" if path == "prefill" and name == "token_embd.weight" else name
                np.testing.assert_array_equal(got[gname][1], want, err_msg=f"{path} {name}")
            emb = PackWeights(pk, path, m=m).embed(np.arange(512))
            np.testing.assert_array_equal(got["token_embd.weight"][1], emb)
    assert ("prefill", "npu", "int8", True) in kinds and ("decode", "cpu", "int8", True) in kinds
    assert ("decode", "cpu", "nf4dq", False) in kinds
    # the decode weights of a dual-resident slice are its host NF4 copy, not the tiles: the two exports differ there
    assert not np.array_equal(d["blk.0.ffn_up.weight"][1], p["blk.0.ffn_up.weight"][1])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_export_types(tmp, dtype):
    gguf = _gguf()
    hf = synth.write_hf_model(tmp / "types-hf", layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512,
                              seed=4)
    synth.write_tokenizer(hf, n_merges=200)
    pack = tmp / "types.orkpack"
    if not pack.exists():
        build(hf, pack, BuildOptions(threads=1, plan=False, nf4=["*"]))
    f32, _ = _read(export(pack, tmp / "types-f32.gguf").path)
    got, fields = _read(export(pack, tmp / f"types-{dtype}.gguf", dtype=dtype).path)
    want_t = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}[dtype]
    assert fields["general.file_type"] == {"f16": 1, "bf16": 32}[dtype]
    for name, (shape, a, typ) in got.items():
        if name.endswith("norm.weight"):
            assert typ == gguf.GGMLQuantizationType.F32  # kept float: as the pass reads it
            np.testing.assert_array_equal(a, f32[name][1])
        else:
            assert typ == want_t, name
            x = f32[name][1]
            ref = x.astype(np.float16).astype(np.float32) if dtype == "f16" else \
                gguf.quants.dequantize(gguf.quants.quantize(x, want_t), want_t)
            np.testing.assert_array_equal(a, ref, err_msg=name)


def test_same_bytes_and_bad_input(tmp):
    runner = CliRunner()
    hf = synth.write_hf_model(tmp / "bad-hf", layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512,
                              seed=5)
    synth.write_tokenizer(hf, n_merges=200)
    pack = tmp / "bad.orkpack"
    build(hf, pack, BuildOptions(threads=1, plan=False))
    a, b = export(pack, tmp / "a.gguf"), export(pack, tmp / "b.gguf")
    assert a.path.read_bytes() == b.path.read_bytes()
    before = pack.read_bytes()
    keep = tmp / "keep.gguf"
    keep.write_bytes(b"previous")
    for args, words in (([pack, "-o", pack], "one of the inputs"),
                        ([pack, "-o", tmp / "nowhere" / "x.gguf"], "does not exist"),
                        ([hf / "config.json", "-o", keep], "not"),
                        ([pack, "-o", keep, "--path", "train"], "--path"),
                        ([pack, "-o", keep, "--type", "q4"], "--type"),
                        ([tmp / "missing.orkpack", "-o", keep], "no such"),
                        ([tmp, "-o", keep], "cluster.json")):
        res = runner.invoke(app, ["export", *map(str, args)])
        assert res.exit_code == 2, (args, res.output)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (args, res.output)
        assert "Traceback" not in res.output
    assert pack.read_bytes() == before and keep.read_bytes() == b"previous"
    assert not [p for p in tmp.iterdir() if p.name.endswith(".export-partial")]


# ------------------------------------------------------------------------------------------ llama.cpp runs it

# (family, source): every family whose export llama.cpp's perplexity matches (measured: 1e-8 to 2.9e-5 relative, gemma4
# the largest), from the HF folder and from the converter's GGUF; from the folder only: phi3, internlm2 and glm4 (the
# converter needs their own tokenizer classes or fails on the fixture), rwkv7 (the converter needs RWKV's own
# tokenizer), nemotron_h (the converter with transformers 5 takes it for nemotron_h_moe: a file llama.cpp refuses too),
# deepseek_v2 / v3 (the converter's absorbed MLA layout, which orkpack's reader refuses in one line), gemma3 /
# gemma3_text (the converter trims token_embd to the tokenizer's 462 tokens: llama.cpp refuses its file), chatglm (the
# converter needs ChatGLM's own tokenizer class), gemma4 / gemma4_text (the converter fails on the fixture's
# tokenizer: "Cannot find Llama BPE tokenizer"); the families where the two still disagree are listed in
# docs/EVAL.md ("orkpack export")
BOTH = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text",
        "qwen3_5_moe", "qwen3_5_moe_text", "gemma", "gemma2", "granite", "granitemoe", "granitemoehybrid", "olmo2",
        "olmo3", "olmoe", "lfm2", "lfm2_moe", "falcon_h1", "ministral3", "mistral3", "ernie4_5", "exaone4", "smollm3",
        "starcoder2", "minicpm", "minicpm3", "glm4_moe", "gpt_oss", "hunyuan_v1_dense", "nemotron_h_moe", "qwen2_moe",
        "ernie4_5_moe")
HF_ONLY = ("phi3", "internlm2", "glm4", "rwkv7", "nemotron_h", "deepseek_v2", "deepseek_v3", "gemma3", "gemma3_text",
           "chatglm", "gemma4", "gemma4_text")
PPL_CASES = [(f, s) for f in BOTH for s in ("hf", "converter")] + [(f, "hf") for f in HF_ONLY]


@pytest.mark.parametrize("family,source", PPL_CASES)
def test_llama_perplexity_of_the_export_is_evals(tmp, text, family, source):
    """A default (rules) pack, NF4 and int8, of a tiny model from its HF folder and from the converter's GGUF:
    llama-perplexity of the decode export equals orkpack eval's decode perplexity (within 1e-4 relative)."""
    exe = need("llama-perplexity")
    hf = tmp / f"{family}-hf" if (tmp / f"{family}-hf").is_dir() else _tiny(tmp, family)
    src = hf if source == "hf" else (tmp / f"{family}-conv.gguf" if (tmp / f"{family}-conv.gguf").exists()
                                     else _convert(hf, tmp / f"{family}-conv.gguf"))
    pack = tmp / f"{family}-{source}-rules.orkpack"
    build(src, pack, BuildOptions(threads=1, plan=False))
    out = export(pack, tmp / f"{family}-{source}-rules.gguf")
    assert out.layout == ("hf" if source == "hf" else "gguf")
    ours = _eval_ppl(pack, text, CTX, 4)["decode"]
    theirs, _ = perplexity(out.path, text, CTX, 4, binary_path=exe)
    assert theirs == pytest.approx(ours, rel=1e-4), (theirs, ours)


@pytest.fixture(scope="module")
def smol_pack(tmp) -> Path:
    """The real SmolLM2-135M-Instruct's default pack (the default plan: NPU int8 tiles, dual-resident NF4 copies)."""
    import warnings

    from test_eval_tokenizer import real_smollm2

    pack = tmp / "smol.orkpack"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the source is quantized: re-quantizing it is the point
        build(real_smollm2(), pack, BuildOptions(threads=1))
    return pack


def test_real_smollm2_llama_perplexity_is_evals(tmp, smol_pack):
    """The real SmolLM2-135M, default plan (NPU int8 tiles, dual-resident host NF4 copies): llama-perplexity of each
    path's export on the built-in prose (2 chunks of 512) is orkpack eval's perplexity of that path with float
    activations, within 1e-3 relative (measured: 2e-5)."""
    from orkpack.eval.text import PROSE

    exe = need("llama-perplexity")
    pack = smol_pack
    ours = _eval_ppl(pack, PROSE, 512, 2, act="float")
    for path in ("decode", "prefill"):
        out = export(pack, tmp / f"smol-{path}.gguf", path=path)
        theirs, _ = perplexity(out.path, PROSE, 512, 2, binary_path=exe)
        assert theirs == pytest.approx(ours[path], rel=1e-3), (path, theirs, ours[path])
        out.path.unlink()
    assert abs(ours["decode"] - ours["prefill"]) > 0.1  # the two paths' weights differ: the test tells them apart


CHAT = "What is the capital of France?"


def _greedy(pack: Path, ids: list[int], n: int, stop: set[int]) -> list[int]:
    """orkpack's own forward pass (orkpack/model/forward.py run(), float numerics) on the pack's decode weights,
    greedy: each next token the argmax of the last position's logits, the full sequence run again per token."""
    from orkpack.eval.run import pack_hparams
    from orkpack.model.forward import run

    out: list[int] = []
    with Pack.open(pack) as pk:
        hp, w = pack_hparams(pk), PackWeights(pk, "decode")
        for _ in range(n):
            nxt = int(np.argmax(run(None, ids + out, weights=w, hp=hp)[-1]))
            out.append(nxt)
            if nxt in stop:
                break
    return out


def test_llama_completion_answers_with_the_packs_chat_template(tmp, smol_pack):
    """llama.cpp's own llama-completion, in its conversation mode for one turn (-cnv -st) with --jinja (the GGUF's
    chat template, the pack's record, rendered by llama.cpp's minja), greedy (--temp 0, -n 16, seed 1), on the real
    SmolLM2 default pack's decode export, answers with the tokens orkpack's own forward pass picks greedily on the
    same weights for the same templated prompt: the prompt ids llama.cpp lists (--verbose-prompt) are orkpack's
    tokenizer's ids of the template rendered by jinja2, and the answer llama.cpp prints is orkpack's greedy tokens'
    text up to the end-of-turn token (llama.cpp stops at an end-of-generation token without printing it)."""
    import re

    import jinja2

    from orkpack.model.tokenizer import from_model
    from orkpack.pack.model import value

    exe = need("llama-completion")
    out = export(smol_pack, tmp / "smol-chat.gguf")
    with Pack.open(smol_pack) as pk:
        model = pk.header["model"]
    kv = {e[0]: value(e) for e in model["kv"]}
    template = kv["tokenizer.chat_template"]
    prompt = jinja2.Environment().from_string(template).render(
        messages=[{"role": "user", "content": CHAT}], add_generation_prompt=True)
    tok = from_model(model)
    ids = tok.encode(prompt)
    r = subprocess.run([str(exe), "-m", str(out.path), "-p", CHAT, "-cnv", "-st", "--jinja", "--temp", "0", "-n", "16",
                        "--seed", "1", "-t", "1", "--no-warmup", "--verbose-prompt"], capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    theirs_ids = [int(x) for x in re.findall(r"^\S+ I +(\d+) -> '", r.stderr, re.M)]
    n_prompt = int(re.search(r"number of tokens in prompt = (\d+)", r.stderr).group(1))
    assert len(theirs_ids) == n_prompt, r.stderr[-3000:]
    assert theirs_ids == ids, (theirs_ids, ids)  # the same templated prompt, token for token
    eog = {int(kv["tokenizer.ggml.eos_token_id"])} | {i for i, t in enumerate(kv["tokenizer.ggml.tokens"])
                                                      if t in ("<|im_end|>", "<|endoftext|>")}
    mine = _greedy(smol_pack, ids, 16, eog)
    # stdout: the rendered conversation (special tokens not printed), then the answer, then " [end of text]" when
    # generation stopped at an end-of-generation token
    shown = r.stdout
    assert shown.count(CHAT) == 1, shown
    answer = shown.split(CHAT, 1)[1].split("assistant\n", 1)[1]
    stopped = answer.rstrip().endswith("[end of text]")
    answer = answer.rstrip()[: -len("[end of text]")] if stopped else answer
    want = tok.decode([t for t in mine if t not in eog])
    assert stopped == (mine[-1] in eog), (shown, mine)
    assert answer.strip() == want.strip() and want.strip(), (answer, want, mine)
