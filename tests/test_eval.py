"""orkpack eval end to end on tiny seeded models (and one run on the real SmolLM2 GGUF).

What must hold: a pack that keeps every matrix float scores KLD ~0 against its source; int8
everywhere scores a small KLD and NF4 a larger one; the NPU path's matmuls are the int8 x int8
product of the pack's own tiles; the decode path reads the host copies; an HF folder and a GGUF of
the same weights give the same eval; a llama.cpp Q8_0 GGUF runs in its CPU numerics; bad input is
one line.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from orkpack import synth
from orkpack.build import BuildOptions, build
from orkpack.cli import app
from orkpack.codecs import get_codec
from orkpack.eval import numerics
from orkpack.eval.llamaquant import write as write_llama_quant
from orkpack.eval.run import Options, evaluate
from orkpack.eval.weights import GGUFWeights, PackWeights
from orkpack.pack.reader import Pack
from orkpack.sources import open_source
from orkpack.sources.base import as_float32

runner = CliRunner()
CTX = 64


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from test_model_record import write_tokenizer

    folder = synth.write_hf_model(tmp_path_factory.mktemp("m") / "hf", layers=2, hidden=128, intermediate=256,
                                  heads=4, kv_heads=2, vocab=512, seed=3)
    write_tokenizer(folder, n_merges=200)
    return folder


_PACKS: dict = {}


def _pack(model: Path, tmp: Path, name: str, **kw) -> Path:
    key = (model, name)
    if key not in _PACKS:
        out = tmp / f"{name}.orkpack"
        build(model, out, BuildOptions(threads=1, **kw))
        _PACKS[key] = out
    return _PACKS[key]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("packs")


def _paths(r: dict) -> dict:
    return {p["path"]: p for p in r["paths"]}


def test_float_pack_has_zero_kld(model, tmp):
    r = evaluate(model, _pack(model, tmp, "float", plan=False, keep=["*"]), Options(ctx=CTX, chunks=3))
    p = _paths(r)
    assert r["reference"] == "reference" and r["chunks"] == 3 and r["scored"] == r["chunks"] * (CTX // 2 - 1)
    for path in ("prefill", "decode"):
        assert p[path]["kld"]["max"] < 1e-6
        assert p[path]["top1"] == 1.0
        assert p[path]["ppl"] == pytest.approx(p["reference"]["ppl"], rel=1e-5)


def test_int8_small_nf4_larger(model, tmp):
    i8 = _paths(evaluate(model, _pack(model, tmp, "int8", plan=False, int8=["*"]), Options(ctx=CTX, chunks=2)))
    n4 = _paths(evaluate(model, _pack(model, tmp, "nf4", plan=False, nf4=["*"]), Options(ctx=CTX, chunks=2)))
    k8, k4 = i8["decode"]["kld"]["mean"], n4["decode"]["kld"]["mean"]
    assert 0 < k8 < k4 / 4
    # host items run the same on both paths (float activations)
    assert i8["prefill"]["kld"]["mean"] == pytest.approx(k8, rel=1e-6)


@pytest.mark.parametrize("storage", ["int8", "nf4"])
def test_npu_matmul_is_int8_by_int8_of_the_tiles(model, tmp, storage):
    pack_path = _pack(model, tmp, f"npu_{storage}", plan=False, npu=["blk.*"], npu_storage=storage)
    name = "blk.1.ffn_down.weight"
    with Pack.open(pack_path) as pack, open_source(model) as src:
        down = next(s for t, s in pack.slices() if t["name"] == name)
        assert down["tier"] == "npu" and down["encoding"] == "int8"  # the down projections stay int8 (issue 25)
        if storage == "nf4":
            name = "blk.1.ffn_gate.weight"
        s = next(s for t, s in pack.slices() if t["name"] == name)
        assert s["tier"] == "npu" and s["encoding"] == storage
        x = np.random.default_rng(0).standard_normal((CTX, s["shape"][1])).astype(np.float32)
        w = as_float32(src.read(name))
        # an NPU slice stored nf4 has bitsandbytes' block scale (FORMAT.md 5), whatever the build's NF4 mode
        enc = get_codec("int8").encode(get_codec("nf4").decode(get_codec("nf4").encode(w, mode="bnb").parts, w.shape)
                                       if storage == "nf4" else w)
        q, sw = enc.parts["q"].reshape(w.shape), enc.parts["scale"]  # independent of the pack's bytes
        pre = PackWeights(pack, "prefill", m=CTX)
        assert pre.engine(name) == "npu" and PackWeights(pack, "prefill", m=s["min_m"] - 1).engine(name) == "cpu"
        qx, sx = numerics.int8_act(x)
        acc = qx.astype(np.int64) @ q.astype(np.int64).T
        want = acc.astype(np.float32) * sx[:, None] * sw[None, :]
        np.testing.assert_array_equal(pre.matmul(name, x), want)
        # decode: the CPU reads the same image, activations float (or llama.cpp's Q8_0 blocks)
        dec = PackWeights(pack, "decode")
        deq = q.astype(np.float32) * sw[:, None]
        assert dec.engine(name) == "cpu"
        np.testing.assert_allclose(dec.matmul(name, x), x @ deq.T, rtol=1e-5, atol=1e-5)
        q8 = PackWeights(pack, "decode", cpu_act="q8")
        np.testing.assert_allclose(q8.matmul(name, x), numerics.q8_0(x) @ deq.T, rtol=1e-5, atol=1e-5)


def test_pack_alone_compares_its_paths(model, tmp):
    r = evaluate(None, _pack(model, tmp, "npu_int8", plan=False, npu=["blk.*"]), Options(ctx=CTX, chunks=2))
    p = _paths(r)
    assert r["reference"] == "prefill" and "no SOURCE" in r["note"]
    assert "kld" not in p["prefill"] and p["decode"]["kld"]["mean"] > 0 and p["prefill"]["ppl"] > 1


def test_per_tensor_ranks_items(model, tmp):
    pack = _pack(model, tmp, "nf4_but_q", plan=False, nf4=["*"], keep=["blk.0.attn_q.weight"])
    r = evaluate(model, pack, Options(ctx=CTX, chunks=1, per_tensor=True, per_tensor_tokens=32))
    rows = r["per_tensor"]["decode"]
    items = {it["item"]: it for it in rows}
    assert len(items) == 2 * 7 + 2  # 7 matrices a layer, the output head and the (untied) embedding
    kept = items["blk.0.attn_q.weight"]
    assert kept["rel_error"] == 0 and kept["snr_db"] is None and kept["kld_alone"] == 0
    assert items["token_embd.weight"]["rel_error"] is None  # a row lookup, never multiplied by
    assert all(v["kld_alone"] > 0 for k, v in items.items() if k != "blk.0.attn_q.weight")
    assert all(v["rel_error"] > 0 for k, v in items.items() if k not in ("blk.0.attn_q.weight", "token_embd.weight"))
    assert [it["kld_alone"] for it in rows] == sorted((it["kld_alone"] for it in rows), reverse=True)
    assert sum(v["share"] for v in items.values()) == pytest.approx(1.0)
    # the single-item KLD is the decode KLD of a pack holding that item alone in NF4, every other matrix float
    top = rows[0]["item"]
    with Pack.open(pack) as pk:
        others = [t["name"] for t in pk.tensors if t["name"] != top]
    alone = _pack(model, tmp, "only_top", plan=False, keep=others, nf4=[top])
    one = _paths(evaluate(model, alone, Options(ctx=32, chunks=1)))
    assert one["decode"]["kld"]["mean"] == pytest.approx(rows[0]["kld_alone"], rel=1e-6)


def test_hf_folder_and_gguf_give_the_same_eval(model, tmp):
    gguf_path = synth.write_gguf_from_hf(model, tmp / "same.gguf", llama_cpp=True)
    ids = tmp / "ids.txt"
    ids.write_text(" ".join(str(i) for i in np.random.default_rng(5).integers(0, 512, 2 * CTX)))
    opts = Options(tokens=ids, ctx=CTX)
    hf = _paths(evaluate(model, _pack(model, tmp, "int8", plan=False, int8=["*"]), opts))
    gg_pack = _pack(gguf_path, tmp, "int8_gguf", plan=False, int8=["*"])
    gg = _paths(evaluate(gguf_path, gg_pack, opts))
    alone = _paths(evaluate(None, gg_pack, opts))  # hparams from the pack's own model record
    for path in ("reference", "prefill", "decode"):
        assert gg[path]["ppl"] == pytest.approx(hf[path]["ppl"], rel=1e-4)
    for path in ("prefill", "decode"):
        assert gg[path]["kld"]["mean"] == pytest.approx(hf[path]["kld"]["mean"], rel=1e-3, abs=1e-7)
    assert alone["decode"]["ppl"] == pytest.approx(gg["decode"]["ppl"], rel=1e-6)


def test_llama_cpp_q8_0_gguf_runs_in_its_cpu_numerics(model, tmp):
    q8 = write_llama_quant(model, tmp / "q8.gguf", "Q8_0")
    r = evaluate(model, q8, Options(ctx=CTX, chunks=2))
    p = _paths(r)
    assert r["kind"] == "gguf" and list(p) == ["reference", "llama.cpp CPU"]
    assert 0 < p["llama.cpp CPU"]["kld"]["mean"] < 0.01
    name = "blk.0.attn_q.weight"
    x = np.random.default_rng(1).standard_normal((5, 128)).astype(np.float32)
    with open_source(q8, on_warning=lambda m: None) as g:
        assert {t.name: t.dtype for t in g.tensors()}[name] == "Q8_0"
        w = GGUFWeights(g)
        np.testing.assert_allclose(w.matmul(name, x), numerics.q8_0(x) @ g.read(name).T, rtol=1e-6, atol=1e-6)


def test_cli_json_and_table(model, tmp):
    pack = _pack(model, tmp, "int8", plan=False, int8=["*"])
    res = _cli("eval", model, pack, "--ctx", CTX, "--chunks", 1, "--json")
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert [p["path"] for p in r["paths"]] == ["reference", "prefill", "decode"]
    res = _cli("eval", model, pack, "--ctx", CTX, "--chunks", 1, "--cpu-act", "q8")
    assert res.exit_code == 0 and "decode" in res.stdout and "top-1" in res.stdout


def test_bad_input_is_one_line(model, tmp):
    pack = _pack(model, tmp, "int8", plan=False, int8=["*"])
    other = synth.write_hf_model(tmp / "other", layers=2, hidden=64, intermediate=128, vocab=512)
    text = tmp / "short.txt"
    text.write_text("A few words only.")
    junk = tmp / "junk.orkpack"
    junk.write_bytes(b"not a pack at all" * 100)
    cases = [
        ((junk,), "not an orkpack file"),
        ((tmp / "missing.orkpack",), "no such file"),
        ((other, pack), "other"),
        ((model, pack, "--text", text), "fewer than one chunk"),
        ((pack, "--per-tensor"), "give the source"),
        ((model, pack, "--act", "channel"), "--act"),
        ((model, pack, "--ctx", 7), "--ctx"),
        ((model, tmp / "a", tmp / "b"), "give PACK"),
    ]
    for args, want in cases:
        res = _cli("eval", *args)
        assert res.exit_code == 2, (args, res.output)
        assert want in res.stderr and "Traceback" not in res.output + res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.filterwarnings("ignore::UserWarning")  # the source is quantized: re-quantizing it is the point
def test_real_smollm2(tmp):
    """The real SmolLM2-135M-Instruct (Q4_1 GGUF): the default pack's paths on 2 chunks of 64 tokens."""
    from test_eval_tokenizer import real_smollm2

    src = real_smollm2()
    pack = tmp / "smol.orkpack"
    build(src, pack, BuildOptions(threads=1))
    with Pack.open(pack) as pk:
        dual = [t["name"] for t, s in pk.slices() if "host_copy" in s]
        assert dual, "the default plan of this model has dual-resident slices"
        s = next(s for t, s in pk.slices() if t["name"] == dual[0])
        op = PackWeights(pk, "decode")._cpu_operand(s)
        hc = pk.host_copy_parts(s)
        enc = s["host_copy"]["encoding"]
        assert enc == "int5dq"  # the low level the default plan chooses for this model (nf4dq, dq32, on a 7B)
        np.testing.assert_array_equal(op.rows(0, op.n), get_codec(enc).decode(hc, s["shape"]))
    r = evaluate(src, pack, Options(ctx=CTX, chunks=2))
    p = _paths(r)
    assert r["scored"] == 2 * (CTX // 2 - 1)
    assert 5 < p["reference"]["ppl"] < 200
    for path in ("prefill", "decode"):
        assert 0.001 < p[path]["kld"]["mean"] < 1.0 and p[path]["top1"] > 0.4


def test_act_float_leaves_npu_activations_unquantized(model, tmp):
    pack_path = _pack(model, tmp, "npu_int8", plan=False, npu=["blk.*"])
    name = "blk.0.attn_q.weight"
    x = np.random.default_rng(2).standard_normal((CTX, 128)).astype(np.float32)
    with Pack.open(pack_path) as pack:
        f = PackWeights(pack, "prefill", m=CTX, act="float")
        assert f.engine(name) == "npu"
        np.testing.assert_allclose(f.matmul(name, x), PackWeights(pack, "decode").matmul(name, x), rtol=1e-6, atol=1e-6)
        assert not np.allclose(PackWeights(pack, "prefill", m=CTX).matmul(name, x), f.matmul(name, x), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("family", ["qwen3_moe", "gemma2", "deepseek_v3", "lfm2"])
def test_families_hf_gguf_and_alone_agree(tmp, family):
    """Stacked experts (one slice each), gemma's stored norm offset, MLA: the same eval from an HF folder, from
    a llama.cpp-layout GGUF of the same weights, and from the pack alone."""
    m = synth.write_hf_model(tmp / f"fam_{family}", config=synth.TINY[family], seed=1)
    g = synth.write_gguf_from_hf(m, tmp / f"fam_{family}.gguf", llama_cpp=True)
    ids = tmp / f"ids_{family}.txt"
    ids.write_text(" ".join(map(str, np.random.default_rng(0).integers(0, 100, 64))))
    opts = Options(tokens=ids, ctx=32)
    hf_pack, gg_pack = _pack(m, tmp, f"fam_{family}", plan=False, int8=["*"]), _pack(g, tmp, f"famg_{family}",
                                                                                   plan=False, int8=["*"])
    hf, gg = _paths(evaluate(m, hf_pack, opts)), _paths(evaluate(g, gg_pack, opts))
    alone = _paths(evaluate(None, hf_pack, opts))
    for path in ("reference", "prefill", "decode"):
        assert gg[path]["ppl"] == pytest.approx(hf[path]["ppl"], rel=1e-4)
    assert 0 < hf["decode"]["kld"]["mean"] < 1e-3
    assert gg["decode"]["kld"]["mean"] == pytest.approx(hf["decode"]["kld"]["mean"], rel=1e-2, abs=1e-7)
    assert alone["decode"]["ppl"] == pytest.approx(hf["decode"]["ppl"], rel=1e-6)


def test_pack_without_model_record(model, tmp, monkeypatch):
    """A pack from before format 1.3 (no model record) of a GGUF: alone it is refused in one line; with its
    source the source's numbers run it."""
    import orkpack.eval.run as run_mod
    from orkpack.eval.weights import EvalError

    g = synth.write_gguf_from_hf(model, tmp / "old.gguf", llama_cpp=True)
    pack = _pack(g, tmp, "old_int8", plan=False, int8=["*"])
    ids = tmp / "old_ids.txt"
    ids.write_text(" ".join(map(str, np.random.default_rng(4).integers(0, 512, CTX))))
    want = _paths(evaluate(g, pack, Options(tokens=ids, ctx=CTX)))

    class OldPack:
        @staticmethod
        def open(path):
            p = Pack.open(path)
            p.header["model"] = None
            return p

    monkeypatch.setattr(run_mod, "Pack", OldPack)
    with pytest.raises(EvalError, match="model record is missing"):
        evaluate(None, pack, Options(tokens=ids, ctx=CTX))
    got = _paths(evaluate(g, pack, Options(tokens=ids, ctx=CTX)))
    assert got["decode"]["kld"]["mean"] == want["decode"]["kld"]["mean"]


def test_sensitivity_profile_estimates_and_checks(model, tmp):
    """--sensitivity: every item gets a KLD estimate from the reference pass's activation statistics; a
    sample's true single-item NF4-vs-int8 KLDs check it (Spearman, leave-one-out); -o writes a profile that
    orkpack plan reads."""
    from scipy.stats import spearmanr

    from orkpack.tiers.board import load_board
    from orkpack.tiers.manifest import manifest_from_path
    from orkpack.tiers.profile import load_profile

    pack = _pack(model, tmp, "int8_all", plan=False, int8=["*"])
    r = evaluate(model, pack, Options(ctx=CTX, chunks=1, sensitivity=True, per_tensor_tokens=32))
    sv = r["sensitivity"]
    assert sv["items"] == 2 * 7 + 2
    sample = sv["sample"]
    kinds = {s["item"].split(".", 2)[-1] if s["item"].startswith("blk.") else s["item"] for s in sample}
    assert len(kinds) == 7 + 2 and len(sample) == 7 * 2 + 2  # 2 layers: both of each kind, the head, the embedding
    assert all(s["kld"] >= 0 for s in sample) and any(s["kld"] > 0 for s in sample)
    want = spearmanr([s["estimate"] for s in sample], [s["kld"] for s in sample]).statistic
    assert sv["spearman"] == pytest.approx(want)
    # the true value: a pack with that item alone NF4 minus one with it alone int8 (every other matrix float)
    top = max(sample, key=lambda s: s["kld"])
    with Pack.open(pack) as pk:
        others = [t["name"] for t in pk.tensors if t["name"] != top["item"]]
    got = []
    for enc in ("nf4", "int8"):
        alone = _pack(model, tmp, f"alone_{enc}_{top['item']}", plan=False, keep=others, **{enc: [top["item"]]})
        got.append(_paths(evaluate(model, alone, Options(ctx=32, chunks=1)))["decode"]["kld"]["mean"])
    assert top["kld"] == pytest.approx(got[0] - got[1], rel=1e-5, abs=1e-9)
    # the profile through the CLI, and plan reads it
    out = tmp / "sens.json"
    res = _cli("eval", model, pack, "--ctx", CTX, "--chunks", 1, "--sensitivity", "--per-tensor-tokens", 32,
               "-o", out, "--json")
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    assert prof["schema"] == "orkpack.hotness" and len(prof["tensors"]) == 16
    assert "_profile" not in json.loads(res.output)
    man = manifest_from_path(model)
    pr = load_profile(out, man, load_board("rk3588-32g"), 512)
    byname = {it.name: v for it, v in zip(man.items, pr.sensitivity)}
    assert byname[top["item"]] == pytest.approx(top["kld"])
    assert _cli("eval", model, pack, "-o", out).exit_code != 0  # -o without --sensitivity: one line


def test_llama_quant_of_an_hf_folder_is_llama_cpp_laid_out(model, tmp):
    """From an HF folder, llamaquant lays the tensors out as llama.cpp's converter does (q/k rows permuted),
    so its Q8_0 scores exactly as the Q8_0 of a llama.cpp GGUF of the same weights."""
    gg = synth.write_gguf_from_hf(model, tmp / "laid.gguf", llama_cpp=True)
    ids = tmp / "ids.txt"
    ids.write_text(" ".join(str(i) for i in np.random.default_rng(5).integers(0, 512, 2 * CTX)))
    opts = Options(tokens=ids, ctx=CTX, chunks=2)
    a = evaluate(model, write_llama_quant(model, tmp / "a.gguf", "Q8_0"), opts)
    b = evaluate(model, write_llama_quant(gg, tmp / "b.gguf", "Q8_0"), opts)
    ka, kb = (_paths(r)["llama.cpp CPU"]["kld"]["mean"] for r in (a, b))
    assert ka == pytest.approx(kb, rel=1e-6, abs=1e-9)
    assert not any(p.name.endswith(".f32.gguf") for p in tmp.iterdir())  # the float intermediate is gone


def test_unknown_architecture_gets_the_eval_s_own_advice(model, tmp):
    """A pack of a model_type orkpack has no family for (built from its weights, generically): eval, imatrix and
    export refuse it in one line with their own way out, not plan's "Plan from the weights instead"."""
    import json
    import shutil

    unk = tmp / "unknown"
    shutil.copytree(model, unk)
    cfg = json.loads((unk / "config.json").read_text())
    cfg.update(model_type="mystery", architectures=["MysteryForCausalLM"])
    (unk / "config.json").write_text(json.dumps(cfg))
    pack = tmp / "unknown.orkpack"
    build(unk, pack, BuildOptions(threads=1))
    cases = [(("eval", pack), "orkpack verify"), (("eval", unk, pack), "orkpack verify"),
             (("imatrix", unk, "-o", tmp / "u.gguf"), "orkpack verify"),
             (("export", pack, "-o", tmp / "u.gguf"), "cannot be exported")]
    for args, want in cases:
        res = _cli(*args)
        assert res.exit_code == 2, (args, res.output)
        line = res.stderr.strip()
        assert len(line.splitlines()) == 1 and "'mystery' is not a known architecture" in line, (args, line)
        assert want in line and "Plan from the weights" not in line, (args, line)
    assert not (tmp / "u.gguf").exists()
    assert _cli("verify", pack).exit_code == 0
