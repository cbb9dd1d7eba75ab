"""Activation smoothing (SmoothQuant folded into the weights, orkpack/transforms/smooth.py; build --imatrix).

* the smoothed float model is the model: a pack of every tensor kept float, smoothed, gives the source's logits
  (several families: plain, tied with q/k/v biases, Gemma's gain offset, fused qkv and gate_up, LayerNorm with
  biases and a plain MLP, MoE whose router must see unchanged inputs, MLA, the GGUF layout);
* the NPU tiles, host int8 and host NF4 (and a plan's host copies) encode the same smoothed weights;
* the pack records it (provenance, per tensor) and inspect / eval show it; verify --reference proves the records
  and fails on tampered ones; builds are deterministic;
* bad statistics (another model's, missing tensors, no max |x|, no file): one line, exit 2, nothing written.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xxhash
from typer.testing import CliRunner

from orkpack import archs, stats as act_stats, synth
from orkpack.pack import spec
from orkpack.build import BuildOptions, build
from orkpack.cli import app
from orkpack.codecs import reference as ref
from orkpack.eval import imatrix
from orkpack.transforms import smooth, smoothed
from orkpack.eval.weights import PackWeights
from orkpack.layout import untile_int8
from orkpack.model import forward
from orkpack.pack.reader import Pack
from orkpack.runtime.verify import verify_pack
from orkpack.sources import open_source
from orkpack.sources.base import as_float32

FAMILIES = ["llama", "qwen2", "gemma", "phi3", "starcoder2", "qwen2_moe", "deepseek_v2", "chatglm", "lfm2"]


def _model(tmp: Path, family: str, **kw) -> Path:
    cfg = json.loads(json.dumps(synth.TINY[family]))
    return synth.write_hf_model(tmp / family, config=cfg, shards=1, seed=5, **kw)


def _ids(tmp: Path, vocab: int, n: int = 96, seed: int = 1) -> Path:
    p = tmp / f"ids{seed}.txt"
    p.write_text(" ".join(str(int(i)) for i in np.random.default_rng(seed).integers(0, vocab, n)))
    return p


def _stats(model: Path, tmp: Path, name: str = "st.gguf") -> Path:
    """Statistics gathered on the model (orkpack imatrix's collector) from token ids, saved as its file."""
    src = open_source(model)
    try:
        vocab = forward.model_hparams(src).vocab
    finally:
        src.close()
    st = imatrix.collect(model, tokens=_ids(tmp, vocab), ctx=48)
    out = tmp / name
    act_stats.save(st, out)
    return out


def _logits(pack_path: Path, model: Path, ids) -> np.ndarray:
    src = open_source(model)
    try:
        hp = forward.model_hparams(src)
        with Pack.open(pack_path) as p:
            return forward.run(src, ids, weights=PackWeights(p, "decode"), hp=hp)
    finally:
        src.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_smoothed_float_model_is_the_model(tmp_path, family):
    model = _model(tmp_path, family, dtype="bf16")
    st = _stats(model, tmp_path)
    out = tmp_path / "f.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, keep=["*"], imatrix=st, smooth_alpha=0.5))
    ids = np.random.default_rng(7).integers(0, 100, 40)  # within every fixture's vocabulary
    want = forward.logits(model, ids)
    got = _logits(out, model, ids)
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want)), family
    with Pack.open(out) as p:
        recs = {t["name"]: t.get("smoothing") for t in p.tensors}
        scales = smoothed.ops_of(p)
        assert smoothed.check_pack(p) is None
    carriers = [n for n, r in recs.items() if r and ("gain" in r or "rows" in r)]
    assert carriers, family
    # the scales are not all 1 (else the test proves nothing)
    assert any(np.any(op[1] != 1) for ops in scales.values() for op in ops), family
    # what the family's graph allows, and only that
    assert recs["blk.0.attn_norm.weight"] and "gain" in recs["blk.0.attn_norm.weight"]
    if family == "qwen2_moe":  # every FFN norm feeds a router: left alone, router and experts too
        assert not recs["blk.0.ffn_norm.weight"] and not recs["blk.0.ffn_down_shexp.weight"]
        assert not any(r for n, r in recs.items() if "ffn_gate_inp" in n or "_exps" in n or "shexp" in n)
        assert recs["blk.1.ffn_norm.weight"] and recs["blk.1.ffn_down.weight"]  # mlp_only_layers: a dense FFN
    if family == "starcoder2":  # LayerNorm: its bias carries the scales too; down(act(up)) has no carrier
        assert recs["blk.0.attn_norm.bias"] == {"bias": {"from": "blk.0.attn_norm.weight", "first": 0}}
        assert not recs["blk.0.ffn_down.weight"]
    if family in ("phi3", "chatglm"):  # a fused gate_up: its up half carries down's scales
        r = recs["blk.0.ffn_up.weight"]["rows"]
        assert r["first"] == len(r["log2_scale"]) and r["matrices"] == ["blk.0.ffn_down.weight"]
    if family == "llama":
        assert recs["blk.0.ffn_up.weight"]["rows"]["matrices"] == ["blk.0.ffn_down.weight"]
        assert set(recs["blk.0.ffn_up.weight"]) == {"columns", "rows"}


def test_gguf_layout_smooths_the_same(tmp_path):
    model = synth.write_gguf_model(tmp_path / "m.gguf", arch="llama", layers=2, hidden=64, intermediate=96, heads=4,
                                   kv_heads=2, vocab=128)
    st = _stats(model, tmp_path)
    out = tmp_path / "g.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, keep=["*"], imatrix=st, smooth_alpha=0.5))
    ids = np.arange(30) % 128
    want = forward.logits(model, ids)
    assert np.max(np.abs(_logits(out, model, ids) - want)) <= 1e-4 * np.max(np.abs(want))


def test_groups_follow_the_declaration():
    """archs declares where scales may fold; groups() finds exactly those places (no router, no plain MLP)."""
    fwd = archs.FAMILIES["llama"].forward
    shapes = {"blk.0.attn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (4, 8),
              "blk.0.attn_v.weight": (4, 8), "blk.0.ffn_norm.weight": (8,), "blk.0.ffn_gate.weight": (16, 8),
              "blk.0.ffn_up.weight": (16, 8), "blk.0.ffn_down.weight": (8, 16)}
    gs = smooth.groups(shapes, fwd, 1)
    assert [(g.carrier, g.kind, g.matrices) for g in gs] == [
        ("blk.0.attn_norm.weight", "gain", ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"]),
        ("blk.0.ffn_norm.weight", "gain", ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
        ("blk.0.ffn_up.weight", "rows", ["blk.0.ffn_down.weight"])]
    moe = dict(shapes, **{"blk.0.ffn_gate_inp.weight": (4, 8)})
    assert [g.carrier for g in smooth.groups(moe, fwd, 1)] == ["blk.0.attn_norm.weight"]
    plain = {k: v for k, v in shapes.items() if "gate" not in k}  # no gate: up's output is not linear in down's input
    assert [g.carrier for g in smooth.groups(plain, fwd, 1)] == ["blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"]


def test_choice_never_scores_worse_than_none():
    """The search keeps no smoothing unless a candidate scores better on the statistics; an outlier channel gets
    smoothed, and the chosen scales are powers of two."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    m = np.ones(32)
    a = np.full(32, 3.0)
    s, al, e, base = smooth.choose([w], m, a)
    assert e <= base
    m2, a2 = m.copy(), a.copy()
    m2[5], a2[5] = 400.0, 60.0  # one outlier channel
    s, al, e, base = smooth.choose([w], m2, a2)
    assert al is not None and e < 0.5 * base and s[5] == s.max() > 1  # x / s: the outlier channel shrinks most
    assert np.all(np.log2(s) == np.rint(np.log2(s)))


def test_npu_and_host_encode_the_same_smoothed_weights(tmp_path):
    model = _model(tmp_path, "llama")
    st = _stats(model, tmp_path)
    packs = {}
    for name, kw in (("npu", {"npu": ["*"]}), ("int8", {"int8": ["*"]}), ("nf4", {"nf4": ["*"]})):
        packs[name] = tmp_path / f"{name}.orkpack"
        build(model, packs[name], BuildOptions(threads=1, plan=False, imatrix=st, clip=False, nf4_mode="bnb", **kw))
    src = open_source(model)
    with Pack.open(packs["npu"]) as a, Pack.open(packs["int8"]) as b, Pack.open(packs["nf4"]) as c:
        ops = smoothed.ops_of(a)
        same = lambda x, y: set(x) == set(y) and all(  # noqa: E731
            [(o[0], o[1].tolist(), o[2:]) for o in x[k]] == [(o[0], o[1].tolist(), o[2:]) for o in y[k]] for k in x)
        assert ops and same(ops, smoothed.ops_of(b)) and same(ops, smoothed.ops_of(c))  # one choice, whatever the placement
        sa, sb, sc = ({(t["name"]): s for t, s in p.slices()} for p in (a, b, c))
        for name in ("blk.0.attn_q.weight", "blk.1.ffn_up.weight", "blk.0.ffn_down.weight"):
            n, k = sa[name]["shape"]
            qa = untile_int8(a.typed_part(sa[name], "q"), n, k, sa[name]["layout"]).reshape(n, k)
            qb = b.typed_part(sb[name], "q").reshape(n, k)
            assert np.array_equal(qa, qb) and np.array_equal(a.typed_part(sa[name], "scale"), b.typed_part(sb[name], "scale"))
            want = smooth.transform(as_float32(src.read(name)), ops[name])
            assert np.array_equal(qb, ref.int8_encode(want)[0].reshape(n, k))
            codes, absmax = ref.nf4_encode(want)
            assert np.array_equal(c.typed_part(sc[name], "codes"), codes)
    src.close()
    for p in packs.values():
        assert verify_pack(p, reference=True).ok


def test_planned_pack_with_host_copies_verifies(tmp_path):
    """The default plan with smoothing: NPU tiles and their host NF4 copies are of the same smoothed slice, so
    verify --reference (which checks each copy against its tiles) passes."""
    model = synth.write_hf_model(tmp_path / "m", config=json.loads(json.dumps(synth.TINY["llama"])), shards=1, seed=2)
    st = _stats(model, tmp_path)
    out = tmp_path / "p.orkpack"
    build(model, out, BuildOptions(threads=1, imatrix=st))
    r = verify_pack(out, reference=True)
    assert r.ok, r.failures
    assert r.checks["reference"]["passed"] > 0


def test_records_inspect_eval_and_determinism(tmp_path):
    model = _model(tmp_path, "qwen2")
    st = _stats(model, tmp_path)
    a, b = tmp_path / "a.orkpack", tmp_path / "b.orkpack"
    build(model, a, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st))
    build(model, b, BuildOptions(threads=2, plan=False, npu=["*"], imatrix=st))
    assert a.read_bytes() == b.read_bytes()
    with Pack.open(a) as p:
        prov = p.header["provenance"]["smoothing"]
        assert p.header["version"] == [1, spec.VERSION_MINOR]  # smoothing records came with 1.4
    assert prov["method"] == "smoothquant" and prov["alpha"] == "searched"
    assert prov["stats"]["file"] == "st.gguf" and prov["stats"]["xxh3"] == xxhash.xxh3_64_hexdigest(st.read_bytes())
    assert p.header["provenance"]["options"]["imatrix"] == "st.gguf"
    res = CliRunner().invoke(app, ["inspect", str(a), "--json", "--all"])
    f = json.loads(res.stdout)
    assert f["smoothing"]["stats_file"] == "st.gguf" and f["smoothing"]["groups"] == prov["groups"]
    rows = {r["name"]: r["smoothed"] for r in f["tensors"]}
    if prov["smoothed"]:
        assert any(v and v.startswith("gain / s") for v in rows.values())
        assert any(v and v.startswith("columns x s from blk.") for v in rows.values())
    assert rows["token_embd.weight"] is None
    res = CliRunner().invoke(app, ["inspect", str(a), "--all"])
    assert res.exit_code == 0 and "smoothquant:" in res.stdout and "st.gguf" in res.stdout
    assert f["clipping"]["stats"] == "st.gguf" and f["clipping"]["rows"] == p.header["provenance"]["clipping"]["rows"]
    from orkpack.eval.run import Options, evaluate

    ids = _ids(tmp_path, 128, 64, seed=3)
    r = evaluate(model, a, Options(tokens=ids, ctx=32))
    assert r["smoothing"]["method"] == "smoothquant" and r["smoothing"]["stats_xxh3"] == prov["stats"]["xxh3"]
    # a different statistics file gives different bytes, and so does --no-smooth
    c = tmp_path / "c.orkpack"
    build(model, c, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st, smooth=False))
    with Pack.open(c) as p:
        assert "smoothing" not in p.header["provenance"] and not smoothed.ops_of(p)


def _rewrite_header(p: Path, mutate) -> None:
    from test_pack import _rewrite_header as rewrite

    rewrite(p, mutate)


def _tensor(h: dict, name: str) -> dict:
    return next(t for t in h["tensors"] if t["name"] == name)


@pytest.mark.parametrize("mutate,why", [
    (lambda h: _tensor(h, "blk.0.attn_q.weight").pop("smoothing"), "does not name this carrier back"),
    (lambda h: _tensor(h, "blk.0.attn_norm.weight")["smoothing"]["gain"]["log2_scale"].pop(), "do not fit"),
    (lambda h: _tensor(h, "blk.0.attn_k.weight")["smoothing"]["columns"].update({"from": "blk.1.attn_norm.weight"}),
     "carrier"),
    (lambda h: _tensor(h, "blk.0.ffn_norm.weight")["smoothing"]["gain"].update({"log2_scale": "x"}), "do not fit"),
])
def test_verify_reference_fails_on_tampered_records(tmp_path, mutate, why):
    model = _model(tmp_path, "llama")
    st = _stats(model, tmp_path)
    out = tmp_path / "t.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st, smooth_alpha=0.5))
    assert verify_pack(out, reference=True).ok
    _rewrite_header(out, mutate)
    r = verify_pack(out, reference=True)
    assert not r.ok and r.exit_code == 1
    assert any(f.startswith("smoothing: ") and why in f for f in r.failures), r.failures
    assert verify_pack(out).ok  # without --reference the bytes themselves are intact


def test_tampered_smoothed_norm_bytes_fail(tmp_path):
    model = _model(tmp_path, "llama")
    out = tmp_path / "t.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=_stats(model, tmp_path), smooth_alpha=0.5))
    with Pack.open(out) as p:
        off = next(s for t, s in p.slices() if t["name"] == "blk.0.attn_norm.weight")["parts"]["data"]["offset"]
    raw = bytearray(out.read_bytes())
    raw[off + 3] ^= 0x10
    out.write_bytes(bytes(raw))
    r = verify_pack(out, reference=True, keep_going=True)
    assert not r.ok and any("blk.0.attn_norm.weight" in f for f in r.failures)


def _cli_build(model, out, st, *extra):
    return CliRunner().invoke(app, ["build", str(model), "-o", str(out), "--no-plan", "--npu", "*", "--threads", "1",
                                    "--imatrix", str(st), "--json", *extra])


def test_bad_statistics_one_line(tmp_path):
    model = _model(tmp_path, "llama")
    out = tmp_path / "x.orkpack"
    # another model's statistics (a wider hidden size)
    other = synth.write_hf_model(tmp_path / "other", config=dict(json.loads(json.dumps(synth.TINY["llama"])),
                                                                  hidden_size=96), shards=1, seed=1)
    wrong = _stats(other, tmp_path, "other.gguf")
    good = _stats(model, tmp_path)
    # statistics that lack the tensors of a layer
    st = act_stats.load(good)
    for n in [n for n in st.entries if n.startswith("blk.1.")]:
        del st.entries[n]
    missing = tmp_path / "missing.gguf"
    act_stats.save(st, missing)
    # statistics without max |x| (what llama.cpp's imatrix holds)
    st = act_stats.load(good)
    for e in st.entries.values():
        e.absmax = None
    noabs = tmp_path / "noabs.gguf"
    act_stats.save(st, noabs)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not statistics")
    for path, words in ((wrong, "columns"), (missing, "has no statistics for blk.1."),
                        (tmp_path / "nope.gguf", "no such file"), (junk, "junk.gguf")):
        r = _cli_build(model, out, path)
        assert r.exit_code == 2, (path, r.output)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (path, r.output)
        assert "Traceback" not in r.output and not out.exists()
        assert not list(tmp_path.glob(".x.orkpack*"))
    # no maxima (a llama.cpp imatrix): not smoothed, said in one warning; clipping still uses the mean squares
    r = _cli_build(model, out, noabs)
    said = [ln for ln in r.stderr.splitlines() if "max |x|" in ln]
    assert r.exit_code == 0 and len(said) == 1 and said[0].startswith("warning: ") and "not smoothed" in said[0]
    with Pack.open(out) as p:
        assert "smoothing" not in p.header["provenance"] and p.header["provenance"]["clipping"]["rows"] > 0
    out.unlink()
    r = _cli_build(model, out, good, "--smooth-alpha", "1.5")
    assert r.exit_code == 2 and "--smooth-alpha 1.5" in r.output and not out.exists()
    r = _cli_build(model, out, good, "--smooth-alpha", "0.5")
    assert r.exit_code == 0, r.output
    with Pack.open(out) as p:
        assert p.header["provenance"]["smoothing"]["alpha"] == 0.5


def test_clipping_is_the_weighted_least_error_and_consistent(tmp_path):
    """With statistics, int8 rows are clamped to the ratio with the least statistics-weighted error (orkpack/transforms/clip.py):
    the NPU tiles and host int8 hold the same codes, which are the int8 codes of the clamped smoothed rows; the
    weighted error is never above the unclipped one; provenance counts it; --no-clip turns it off."""
    from orkpack.transforms import clip

    model = _model(tmp_path, "llama")
    st = _stats(model, tmp_path)
    a, b, c = tmp_path / "npu.orkpack", tmp_path / "int8.orkpack", tmp_path / "noclip.orkpack"
    build(model, a, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st))
    build(model, b, BuildOptions(threads=1, plan=False, int8=["*"], imatrix=st))
    build(model, c, BuildOptions(threads=1, plan=False, int8=["*"], imatrix=st, clip=False))
    stats = act_stats.load(st)
    src = open_source(model)
    with Pack.open(a) as pa, Pack.open(b) as pb, Pack.open(c) as pc:
        prov = pb.header["provenance"]["clipping"]
        assert prov["stats"] == "st.gguf" and prov["rows"] > 0 and "clipping" not in pc.header["provenance"]
        ops = smoothed.ops_of(pb)
        sa, sb, sc = ({t["name"]: s for t, s in p.slices()} for p in (pa, pb, pc))
        for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.1.attn_output.weight"):
            n, k = sb[name]["shape"]
            qa = untile_int8(pa.typed_part(sa[name], "q"), n, k, sa[name]["layout"]).reshape(n, k)
            qb, scb = pb.typed_part(sb[name], "q").reshape(n, k), pb.typed_part(sb[name], "scale")
            assert np.array_equal(qa, qb) and np.array_equal(pa.typed_part(sa[name], "scale"), scb)
            w = smooth.transform(as_float32(src.read(name)), ops.get(name, []))
            m = stats.mean_sq(name, k=k).astype(np.float64)
            for op in ops.get(name, []):
                if op[0] == "columns":
                    m = m / op[1].astype(np.float64) ** 2
            want, _ = clip.clamp(w, m)
            assert np.array_equal(qb, ref.int8_encode(want)[0].reshape(n, k))
            err = lambda q, s: float(((((q * s[:, None]).astype(np.float64) - w) ** 2) @ m).sum())  # noqa: E731
            qc, scc = pc.typed_part(sc[name], "q").reshape(n, k), pc.typed_part(sc[name], "scale")
            assert err(qb, scb) <= err(qc, scc) * (1 + 1e-9)
            # the recorded SQNR is against the rows as read (smoothed), the clipping's error included (FORMAT.md 2)
            for ss, q, scale in ((sb[name], qb, scb), (sa[name], qa, pa.typed_part(sa[name], "scale"))):
                assert abs(ss["sqnr_db"] - ref.sqnr_db(w, q * scale[:, None])) <= 5e-4 + 1e-9, name  # 3 decimals
            if not np.array_equal(want, w):  # a clipped slice: the clipped rows' own SQNR is higher
                assert ref.sqnr_db(want, qb * scb[:, None]) > sb[name]["sqnr_db"]
    src.close()
    assert verify_pack(a, reference=True).ok


def test_a_rotated_clipped_pack_passes_verify_against_its_source(tmp_path):
    """verify --reference --source compares each rotated slice with the source under the recorded transforms, against
    its recorded SQNR: with heavy smoothing and clipping (alpha 1.0) that SQNR must count the clipping (it did not:
    blk.1.ffn_down 36.0 dB measured against 37.1 recorded, over the 1 dB slack)."""
    model = _model(tmp_path, "qwen2")
    ids = _ids(tmp_path, 100)
    st = tmp_path / "st.gguf"
    act_stats.save(imatrix.collect(model, tokens=ids, ctx=48, rotate=(0, True)), st)
    out = tmp_path / "r.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st, smooth_alpha=1.0, rotate=True))
    with Pack.open(out) as p:
        assert p.header["provenance"]["clipping"]["rows"] > 0
    r = verify_pack(out, reference=True, source=model, keep_going=True)
    assert r.ok, r.failures


def test_per_tensor_compares_with_the_smoothed_float_weights(tmp_path):
    """eval --per-tensor compares each matmul with the source's float weights smoothed as the pack was: a smoothed
    int8 item's output error is int8-sized, not the smoothing itself; --sensitivity refuses a smoothed pack."""
    from orkpack.eval.run import Options, evaluate
    from orkpack.eval.weights import EvalError

    model = _model(tmp_path, "llama")
    out = tmp_path / "s.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, int8=["*"], imatrix=_stats(model, tmp_path), smooth_alpha=0.5))
    ids = _ids(tmp_path, 128, 64, seed=4)
    r = evaluate(model, out, Options(tokens=ids, ctx=32, per_tensor=True, per_tensor_tokens=16))
    rows = {x["item"]: x for x in r["per_tensor"]["decode"]}
    assert rows["blk.0.attn_q.weight"]["rel_error"] < 1e-3 and rows["blk.1.ffn_down.weight"]["rel_error"] < 1e-3
    with pytest.raises(EvalError, match="smoothed"):
        evaluate(model, out, Options(tokens=ids, ctx=32, sensitivity=True, per_tensor_tokens=16))


# ------------------------------------------------------------------ the tied head, untied and smoothed (issue 16)

def _untied_pack(tmp_path, family="qwen2", **kw):
    model = _model(tmp_path, family)
    st = _stats(model, tmp_path)
    out = tmp_path / "u.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st, **({"smooth_alpha": 0.5} | kw)))
    return model, st, out


@pytest.mark.parametrize("family", ["qwen2", "gemma"])  # gemma: a gain stored without its 1 +
def test_untied_head_float_model_is_the_model(tmp_path, family):
    """A tied head on the NPU is stored as output.weight = token_embd's columns x s, with output_norm's gain / s
    and token_embd.weight unsmoothed: the float model the pack holds gives the source's logits."""
    model, _, out = _untied_pack(tmp_path, family)
    src = open_source(model)
    try:
        assert "output.weight" not in {i.name for i in src.tensors()}  # a tied source
        hp = forward.model_hparams(src)
        emb = as_float32(src.read("token_embd.weight"))
        gain = as_float32(src.read("output_norm.weight"))
    finally:
        src.close()
    with Pack.open(out) as p:
        ops, untied = smoothed.ops_of(p), smoothed.untied_of(p)
        assert untied == {"output.weight": "token_embd.weight"}
        s = next(op[1] for op in ops["output.weight"] if op[0] == "columns")
        assert np.any(s != 1)  # else the test proves nothing
        w = PackWeights(p, "decode")
        # the pack's f32 gain is the source's divided by s, bit for bit (barring Gemma's offset: one rounding)
        want = smooth.transform(gain, ops["output_norm.weight"], hp.norm_offset)
        assert np.array_equal(w.tensor("output_norm.weight"), want)
        if not hp.norm_offset:
            assert np.array_equal(want, gain / s)
        # the embedding's rows are the source's (int8, unsmoothed); the head copy's the columns times s (int8)
        e = w._cpu_operand(w._slice("token_embd.weight", None)).rows(0, emb.shape[0])
        h = w._cpu_operand(w._slice("output.weight", None)).rows(0, emb.shape[0])
        q, sc = ref.int8_encode(emb)  # (rows may be clipped, as the tied head's were: each to >= 0.8 of its max)
        assert np.all(np.abs(e - emb) <= 0.21 * 127 * sc[:, None] + 1e-6)
        assert np.mean(e == ref.int8_decode(q, sc)) > 0.95
        scale = np.abs(emb * s).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(h - emb * s) <= 0.21 * 127 * scale + 1e-6)  # int8 step, or clipped to >= 0.8 of the max
        assert np.mean(np.abs(h - emb * s) <= 0.5 * scale + 1e-6) > 0.95
    ids = np.random.default_rng(7).integers(0, 100, 40)
    want = forward.logits(model, ids)
    src = open_source(model)
    try:
        from orkpack.model.weights import SourceWeights

        got = forward.run(src, ids, weights=smoothed.Smoothed(SourceWeights(src), ops, hp.norm_offset, untied), hp=hp)
    finally:
        src.close()
    assert np.max(np.abs(got - want)) <= (0 if not hp.norm_offset else 1e-4) * np.max(np.abs(want))


def test_untied_head_records_placement_inspect_eval(tmp_path):
    model, st, out = _untied_pack(tmp_path)
    with Pack.open(out) as p:
        prov = p.header["provenance"]["smoothing"]
        t = {x["name"]: x for x in p.tensors}
        names = [x["name"] for x in p.tensors]
    head = prov["head"]
    assert head["untied_from"] == "token_embd.weight" and head["alpha"] == 0.5 and head["error_ratio"] > 0
    assert t["output.weight"]["smoothing"] == {"untied": {"from": "token_embd.weight"},
                                               "columns": {"from": "output_norm.weight", "alpha": head["alpha"]}}
    assert t["output_norm.weight"]["smoothing"]["gain"]["matrices"] == ["output.weight"]
    assert "smoothing" not in t["token_embd.weight"]
    assert t["output.weight"]["source_name"] == t["token_embd.weight"]["source_name"]
    assert names.index("output.weight") == names.index("token_embd.weight") + 1
    # the copy takes the head's place (NPU int8 tiles); the embedding the host int8 of its row lookups
    assert [(s["encoding"], s["tier"]) for s in t["output.weight"]["slices"]] == [("int8", "npu")]
    assert [(s["encoding"], s["tier"]) for s in t["token_embd.weight"]["slices"]] == [("int8", "host")]
    r = verify_pack(out, reference=True)
    assert r.ok, r.failures
    res = CliRunner().invoke(app, ["inspect", str(out), "--json", "--all"])
    f = json.loads(res.stdout)
    rows = {x["name"]: x["smoothed"] for x in f["tensors"]}
    assert rows["output.weight"].startswith("untied copy of token_embd.weight, columns x s from output_norm.weight")
    assert f["smoothing"]["head"] == {"untied_from": "token_embd.weight", "alpha": head["alpha"]}
    res = CliRunner().invoke(app, ["inspect", str(out)])
    assert res.exit_code == 0 and "head untied from token_embd.weight" in res.stdout
    # eval runs the copy as the head on both paths, against the tied source
    from orkpack.eval.run import Options, evaluate

    seen = []
    orig = PackWeights.matmul

    def spy(self, name, x, expert=None):
        seen.append(name)
        return orig(self, name, x, expert)

    PackWeights.matmul = spy
    try:
        res = evaluate(model, out, Options(tokens=_ids(tmp_path, 128, 64, seed=3), ctx=32))
    finally:
        PackWeights.matmul = orig
    assert "output.weight" in seen and "token_embd.weight" not in seen
    assert res["smoothing"]["head"]["untied_from"] == "token_embd.weight"
    assert all(x["kld"]["mean"] < 0.1 for x in res["paths"] if "kld" in x)
    # --per-tensor compares the copy with the source's embedding smoothed as recorded: an int8-sized error
    res = evaluate(model, out, Options(tokens=_ids(tmp_path, 128, 64, seed=4), ctx=32, per_tensor=True,
                                       per_tensor_tokens=16))
    rows = {x["item"]: x for x in res["per_tensor"]["decode"]}
    assert rows["output.weight"]["rel_error"] < 1e-3
    # against the same build kept tied: only the head's copy and the final norm differ; the embedding's int8 rows
    # (what the lookups read) are the tied head's, untiled
    tied = tmp_path / "tied.orkpack"
    build(model, tied, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st, smooth_alpha=0.5, untie_head=False))
    with Pack.open(out) as pu, Pack.open(tied) as pt:
        tu = {x["name"]: x for x in pu.tensors}
        tt = {x["name"]: x for x in pt.tensors}
        assert set(tu) - set(tt) == {"output.weight"} and set(tt) <= set(tu)
        for n in tt:
            same = [s["parts"] == r["parts"] for s, r in zip(tu[n]["slices"], tt[n]["slices"])] == [True] * len(tt[n]["slices"])
            ok = {k: v for k, v in tu[n].items() if k != "slices"} == {k: v for k, v in tt[n].items() if k != "slices"}
            assert (same and ok) == (n not in ("output_norm.weight", "token_embd.weight")), n
        wu, wt = PackWeights(pu, "decode"), PackWeights(pt, "decode")
        e = tu["token_embd.weight"]["shape"][0]
        assert np.array_equal(wu._cpu_operand(wu._slice("token_embd.weight", None)).rows(0, e),
                              wt._cpu_operand(wt._slice("token_embd.weight", None)).rows(0, e))
    # reproducible
    again = tmp_path / "again.orkpack"
    build(model, again, BuildOptions(threads=2, plan=False, npu=["*"], imatrix=st, smooth_alpha=0.5))
    assert again.read_bytes() == out.read_bytes()


def test_head_stays_tied_unless_smoothed_on_the_npu(tmp_path):
    """No copy: with --no-untie-head, --no-smooth, a head kept on the host (the rules' int8), or an untied source."""
    model = _model(tmp_path, "qwen2")
    st = _stats(model, tmp_path)
    cases = {"no_untie": dict(npu=["*"], untie_head=False), "no_smooth": dict(npu=["*"], smooth=False),
             "host_head": dict(npu=["blk.*"])}
    for tag, kw in cases.items():
        out = tmp_path / f"{tag}.orkpack"
        build(model, out, BuildOptions(threads=1, plan=False, imatrix=st, **kw))
        with Pack.open(out) as p:
            assert "output.weight" not in {x["name"] for x in p.tensors}, tag
            assert not smoothed.untied_of(p), tag
            assert "head" not in (p.header["provenance"].get("smoothing") or {}), tag
    with Pack.open(tmp_path / "no_untie.orkpack") as p:
        assert p.header["provenance"]["options"]["untie_head"] is False
    # a model with its own output.weight: smoothed as any model, nothing copied
    untied = _model(tmp_path, "llama")
    out = tmp_path / "llama.orkpack"
    build(untied, out, BuildOptions(threads=1, plan=False, npu=["*"], imatrix=_stats(untied, tmp_path, "l.gguf")))
    with Pack.open(out) as p:
        assert not smoothed.untied_of(p) and "head" not in p.header["provenance"]["smoothing"]
    # the CLI flag; without it the build says it untied the head
    r = _cli_build(model, tmp_path / "cli.orkpack", st, "--no-untie-head", "--smooth-alpha", "0.5")
    assert r.exit_code == 0, r.output
    assert "untied the head" not in r.output
    r = _cli_build(model, tmp_path / "cli2.orkpack", st, "--smooth-alpha", "0.5")
    assert r.exit_code == 0 and "untied the head to smooth it: output.weight" in r.output, r.output
    with Pack.open(tmp_path / "cli.orkpack") as p:
        assert not smoothed.untied_of(p)


def _bump_head_scale(h):
    sc = _tensor(h, "output_norm.weight")["smoothing"]["gain"]["log2_scale"]
    sc[0] += 1


@pytest.mark.parametrize("mutate,why", [
    (_bump_head_scale, "column 0 is"),  # the records agree with each other; the values do not
    (lambda h: _tensor(h, "output.weight")["smoothing"]["untied"].update({"from": "blk.0.attn_q.weight"}),
     "does not hold in its shape"),
    (lambda h: _tensor(h, "output.weight")["smoothing"].pop("columns"), "output.weight"),
    (lambda h: _tensor(h, "token_embd.weight").update(
        {"smoothing": {"columns": {"from": "output_norm.weight", "alpha": 0.5}}}), "carrier"),
])
def test_verify_reference_fails_on_a_forged_head_record(tmp_path, mutate, why):
    _, _, out = _untied_pack(tmp_path)
    assert verify_pack(out, reference=True).ok
    _rewrite_header(out, mutate)
    r = verify_pack(out, reference=True)
    assert not r.ok and r.exit_code == 1
    assert any(f.startswith("smoothing: ") and why in f for f in r.failures), r.failures


def test_head_statistics_missing_one_line(tmp_path):
    """Statistics without the head's input (neither output.weight nor token_embd.weight): one line, nothing written;
    llama.cpp's name for the head's input (output.weight) is read as the tied head's."""
    model = _model(tmp_path, "qwen2")
    good = _stats(model, tmp_path)
    st = act_stats.load(good)
    st.entries["output.weight"] = st.entries.pop("token_embd.weight")
    renamed = tmp_path / "renamed.gguf"
    act_stats.save(st, renamed)
    del st.entries["output.weight"]
    missing = tmp_path / "missing.gguf"
    act_stats.save(st, missing)
    out = tmp_path / "x.orkpack"
    r = _cli_build(model, out, missing, "--smooth-alpha", "0.5")
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "has no statistics for output.weight" in lines[0], r.output
    assert "Traceback" not in r.output and not out.exists()
    a, b = tmp_path / "a.orkpack", tmp_path / "b.orkpack"
    assert _cli_build(model, a, good, "--smooth-alpha", "0.5").exit_code == 0
    assert _cli_build(model, b, renamed, "--smooth-alpha", "0.5").exit_code == 0
    with Pack.open(a) as pa, Pack.open(b) as pb:
        ta = {t["name"]: t for t in pa.tensors}
        tb = {t["name"]: t for t in pb.tensors}
        assert ta["output_norm.weight"]["smoothing"] == tb["output_norm.weight"]["smoothing"]
        assert ta["output.weight"]["slices"][0]["parts"]["q"]["xxh3"] == \
            tb["output.weight"]["slices"][0]["parts"]["q"]["xxh3"]


def test_planned_build_keeps_the_tied_head_tied(tmp_path):
    """The planner never puts the embedding (a tied head's role) on the NPU: a planned build copies nothing, so the
    planner's byte counts stay those of the pack."""
    model = _model(tmp_path, "qwen2")
    plain = tmp_path / "plain.orkpack"
    build(model, plain, BuildOptions(threads=1, imatrix=_stats(model, tmp_path), smooth_alpha=0.5))
    with Pack.open(plain) as p:
        t = {x["name"]: x for x in p.tensors}
        assert "output.weight" not in t and t["token_embd.weight"]["slices"][0]["tier"] == "host"
        assert p.header["provenance"]["smoothing"]["smoothed"] > 0
