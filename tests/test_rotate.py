"""A rotation of the residual stream folded into the weights (orkpack/transforms/rotate.py; build --rotate).

* the rotations: Paley and Sylvester Hadamard matrices are Hadamard, the fast transform is the matrix, a width with
  no Hadamard takes a seeded orthogonal matrix, the seed decides the signs;
* the rotated float model is the model: every family whose graph allows it (tiny models of orkpack.synth.TINY, R1
  and R2, tied heads untied) within 1e-4, a width with no Hadamard, and the real SmolLM2; the others are refused
  saying why; a pack of every tensor kept float gives the source's logits;
* the pack records it (provenance, per tensor; format 1.6), inspect / eval show it, verify --reference checks the
  records and, with --source, every rotated tensor against its source; tampered records and a wrong seed fail;
  builds are deterministic and the seed changes the bytes;
* bad input (a family that cannot be rotated, statistics of the unrotated model): one line, exit 2, nothing written.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from orkpack import stats as act_stats, synth
from orkpack.build import BuildOptions, build
from orkpack.cli import app
from orkpack.errors import OrkError
from orkpack.eval import imatrix
from orkpack.pack import spec
from orkpack.eval.weights import PackWeights
from orkpack.model import forward
from orkpack.model.weights import SourceWeights
from orkpack.pack.reader import Pack
from orkpack.runtime.verify import verify_pack
from orkpack.sources import open_source
from orkpack.transforms import rotate

REFUSED = {  # family -> what the refusal says
    "gemma2": "sandwich", "gemma3_text": "sandwich", "gemma3": "sandwich", "glm4": "sandwich",
    "gemma4_text": "sandwich", "gemma4": "sandwich", "olmo2": "post-normed", "olmo3": "post-normed",
    "exaone4": "post-normed", "starcoder2": "LayerNorm", "deepseek_v3": "multi-token-prediction",
    "gemma3n_text": "sandwich", "gemma3n": "sandwich", "rwkv7": "LayerNorm",
}
ROTATED = [f for f in synth.TINY if f not in REFUSED]
NO_R2 = {"minicpm3", "deepseek_v2", "internlm2", "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "qwen3_5",
         "qwen3_5_moe"}  # MLA, a grouped qkv, a gated attention output


def _model(tmp: Path, family: str, cfg: dict | None = None, **kw) -> Path:
    cfg = cfg or json.loads(json.dumps(synth.TINY[family]))
    return synth.write_hf_model(tmp / family, config=cfg, shards=1, seed=5, **kw)


IDS = np.random.default_rng(7).integers(0, 100, 40)  # within every fixture's vocabulary


def _rotated_logits(model: Path, seed: int = 3, heads: bool = True):
    src = open_source(model)
    try:
        hp = forward.model_hparams(src)
        want = forward.run(src, IDS, hp=hp)
        rs = rotate.rotated(src, seed, heads)
        got = forward.run(rs, IDS, hp=hp, weights=SourceWeights(rs))
        return want, got, rs.plan
    finally:
        src.close()


# ------------------------------------------------------------------------------------------- the rotations

@pytest.mark.parametrize("m", [1, 2, 4, 12, 20, 24, 28, 36, 44, 48, 60, 68])
def test_paley_orders_are_hadamard(m):
    h = rotate.paley(m)
    assert h is not None and set(np.unique(h)) <= {-1.0, 1.0}
    assert np.array_equal(h @ h.T, m * np.eye(m))


def test_hadamard_factors_and_the_fast_transform():
    import scipy.linalg

    assert rotate.hadamard_factor(64) == 1 and rotate.hadamard_factor(576) == 36  # SmolLM2: 36 x 2^4
    assert rotate.hadamard_factor(896) == 28 and rotate.hadamard_factor(3584) == 28 and rotate.hadamard_factor(960) == 60
    assert rotate.hadamard_factor(92) is None and rotate.hadamard_factor(46) is None
    r = rotate.Rotation("r1", 64, 5)
    q = r.matrix()
    signs = np.sign(q[:, 0])  # first column of H is all ones: Q's first column is the signs / 8
    assert np.allclose(q, signs[:, None] * scipy.linalg.hadamard(64) / 8.0)
    for n, kind in ((576, "hadamard"), (92, "random"), (24, "hadamard")):
        r = rotate.Rotation("r1", n, 11)
        q = r.matrix()
        assert r.kind == kind and np.allclose(q @ q.T, np.eye(n), atol=1e-12)
        x = np.random.default_rng(0).standard_normal((3, 5, n))
        assert np.allclose(r.apply(x), x @ q) and np.allclose(r.apply(x.swapaxes(1, 2), 1), (x @ q).swapaxes(1, 2))
    a, b = rotate.Rotation("r1", 576, 0).matrix(), rotate.Rotation("r1", 576, 0).matrix()
    assert np.array_equal(a, b) and not np.allclose(a, rotate.Rotation("r1", 576, 1).matrix())
    assert not np.allclose(rotate.Rotation("r2", 64, 0).matrix(), rotate.Rotation("r1", 64, 0).matrix())


# ------------------------------------------------------------------------------------------- the float model

@pytest.mark.parametrize("family", ROTATED)
def test_rotated_float_model_is_the_model(tmp_path, family):
    want, got, plan = _rotated_logits(_model(tmp_path, family))
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want)), family
    # every matrix that reads or writes the stream was rotated, every norm folded away
    rots = {n for n, ops in plan.ops.items() if any(op[0] == "rot" and op[1] == "r1" for op in ops)}
    assert "token_embd.weight" in rots and "output.weight" in rots
    assert all(ops == [("unit",)] for n, ops in plan.ops.items() if "norm" in n and not any(
        op[0] == "rot" for op in ops)), family
    assert (plan.r2 is None) == (family in NO_R2), family
    if plan.r2 is not None:
        outs = [n for n in plan.ops if n.endswith("attn_output.weight")]
        assert outs and all(any(op[1] == "r2" for op in plan.ops[n] if op[0] == "rot") for n in outs), family


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_families_that_cannot_be_rotated_say_why(tmp_path, family):
    src = open_source(_model(tmp_path, family))
    try:
        with pytest.raises(OrkError, match=REFUSED[family]):
            rotate.rotated(src)
    finally:
        src.close()


def test_width_without_hadamard_takes_a_seeded_orthogonal(tmp_path):
    cfg = dict(synth.TINY["llama"], hidden_size=92, head_dim=46, num_attention_heads=2, num_key_value_heads=1,
               tie_word_embeddings=True)
    want, got, plan = _rotated_logits(_model(tmp_path, "llama", cfg))
    assert plan.r1.kind == "random" and plan.r2.kind == "random" and plan.untied == {"output.weight": "token_embd.weight"}
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


def test_r1_alone(tmp_path):
    want, got, plan = _rotated_logits(_model(tmp_path, "qwen2"), heads=False)
    assert plan.r2 is None and np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


def test_real_smollm2_rotated_is_the_model():
    from test_eval_tokenizer import real_smollm2

    src = open_source(real_smollm2())
    try:
        hp = forward.model_hparams(src)
        ids = np.random.default_rng(3).integers(0, hp.vocab, 48)
        want = forward.run(src, ids, hp=hp)
        rs = rotate.rotated(src, 0)
        got = forward.run(rs, ids, hp=hp, weights=SourceWeights(rs))
        assert rs.plan.r1.record() == {"kind": "hadamard", "size": 576, "seed": 0, "hadamard": [36, 16]}
        assert rs.plan.untied == {"output.weight": "token_embd.weight"}
        assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))
        # the rotation spreads the stream's outlier channels: the embedding's columns are far more alike
        e, er = src.read("token_embd.weight"), rs.read("token_embd.weight")
        from orkpack.sources.base import as_float32

        def spread(a):
            c = np.abs(as_float32(a)).max(axis=0)
            return c.max() / np.median(c)
        assert spread(er) < spread(e)
    finally:
        src.close()


# ------------------------------------------------------------------------------------------- the pack

@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "phi3", "lfm2", "qwen2_moe", "gpt_oss", "falcon_h1"])
def test_rotated_float_pack_is_the_model(tmp_path, family):
    model = _model(tmp_path, family, dtype="bf16")
    out = tmp_path / "f.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, keep=["*"], rotate=True, rotate_seed=4))
    src = open_source(model)
    try:
        hp = forward.model_hparams(src)
        want = forward.run(src, IDS, hp=hp)
        with Pack.open(out) as p:
            got = forward.run(src, IDS, weights=PackWeights(p, "decode"), hp=hp)
            assert rotate.check_pack(p) is None
            assert p.header["provenance"]["rotation"]["r1"]["seed"] == 4
    finally:
        src.close()
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want)), family
    r = verify_pack(out, reference=True, source=model)
    assert r.ok, r.failures


def _tensor(h: dict, name: str) -> dict:
    return next(t for t in h["tensors"] if t["name"] == name)


def test_records_inspect_eval_verify_and_determinism(tmp_path):
    model = _model(tmp_path, "qwen2")  # tied, q/k/v biases
    a, b, c = tmp_path / "a.orkpack", tmp_path / "b.orkpack", tmp_path / "c.orkpack"
    for out, seed in ((a, 0), (b, 0), (c, 1)):
        res = CliRunner().invoke(app, ["build", str(model), "-o", str(out), "--no-plan", "--npu", "*", "--threads", "1",
                                       "--rotate", "--rotate-seed", str(seed), "--json"])
        assert res.exit_code == 0, res.output
    assert a.read_bytes() == b.read_bytes() and a.read_bytes() != c.read_bytes()
    with Pack.open(a) as p:
        assert p.header["version"] == [1, spec.VERSION_MINOR] and spec.VERSION_MINOR >= 6  # rotation came with 1.6
        prov = p.header["provenance"]["rotation"]
        assert prov["r1"] == {"kind": "hadamard", "size": 64, "seed": 0, "hadamard": [1, 64]}
        assert prov["untied_head"] == {"output.weight": "token_embd.weight"}
        assert _tensor(p.header, "blk.0.attn_v.weight")["rotation"] == {
            "fold": "blk.0.attn_norm.weight", "rotate": [["r1", 1, 0, 64], ["r2", 0, 0, 32]]}
        assert _tensor(p.header, "blk.0.attn_v.bias")["rotation"] == {"rotate": [["r2", 0, 0, 32]]}
        assert _tensor(p.header, "blk.0.attn_q.bias").get("rotation") is None
        assert _tensor(p.header, "blk.0.ffn_down.weight")["rotation"] == {"rotate": [["r1", 0, 0, 64]]}
        assert _tensor(p.header, "output_norm.weight")["rotation"] == {"unit": 1.0}
        assert _tensor(p.header, "output.weight")["rotation"]["untied"] == {"from": "token_embd.weight"}
    res = CliRunner().invoke(app, ["inspect", str(a)])
    assert res.exit_code == 0 and "rotation" in res.output and "Hadamard 1x2^6 of 64, seed 0" in res.output
    res = CliRunner().invoke(app, ["inspect", str(a), "--json"])
    assert json.loads(res.output)["rotation"]["r2"]["size"] == 16
    res = CliRunner().invoke(app, ["eval", str(model), str(a), "--json", "--ctx", "32", "--chunks", "1",
                                   "--tokens", str(_ids(tmp_path))])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["rotation"]["r1"]["seed"] == 0 and rep["paths"][1]["kld"]["mean"] < 0.05
    res = CliRunner().invoke(app, ["eval", str(model), str(a), "--ctx", "32", "--chunks", "1", "--per-tensor",
                                   "--per-tensor-tokens", "8", "--tokens", str(_ids(tmp_path)), "--json"])
    assert res.exit_code == 0, res.output  # each matmul against the rotated float weights
    assert verify_pack(a, reference=True).ok
    assert verify_pack(a, reference=True, source=model).ok
    # another model as "the source": its tensors do not match under the recorded rotation
    other = synth.write_hf_model(tmp_path / "other", config=json.loads(json.dumps(synth.TINY["qwen2"])), shards=1,
                                 seed=6)
    r = verify_pack(a, reference=True, source=other, keep_going=True)
    assert not r.ok and any("against the source under the recorded rotation" in f for f in r.failures)


def _ids(tmp: Path) -> Path:
    p = tmp / "ids.txt"
    p.write_text(" ".join(str(int(i)) for i in np.random.default_rng(1).integers(0, 128, 96)))
    return p


def _rewrite_header(p: Path, mutate) -> None:
    from test_pack import _rewrite_header as rewrite

    rewrite(p, mutate)


@pytest.mark.parametrize("mutate,why", [
    (lambda h: h["provenance"]["rotation"]["r1"].update({"hadamard": [4, 16]}), "regenerated"),
    (lambda h: _tensor(h, "blk.0.attn_q.weight")["rotation"].update({"fold": "blk.1.attn_q.weight"}), "folded norm"),
    (lambda h: _tensor(h, "blk.0.attn_output.weight")["rotation"]["rotate"].append(["r3", 0, 0, 64]), "recorded rotation"),
    (lambda h: _tensor(h, "blk.0.ffn_down.weight")["rotation"]["rotate"][0].__setitem__(3, 128), "does not fit"),
    (lambda h: h["provenance"].pop("rotation"), "provenance.rotation is missing"),
])
def test_verify_reference_fails_on_tampered_records(tmp_path, mutate, why):
    model = _model(tmp_path, "llama")
    out = tmp_path / "t.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], rotate=True))
    assert verify_pack(out, reference=True, source=model).ok
    _rewrite_header(out, mutate)
    r = verify_pack(out, reference=True)
    assert not r.ok and r.exit_code == 1
    assert any(f.startswith("rotation: ") and why in f for f in r.failures), r.failures
    assert verify_pack(out).ok  # without --reference the bytes themselves are intact


def test_a_wrong_seed_fails_against_the_source(tmp_path):
    model = _model(tmp_path, "llama")
    out = tmp_path / "t.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], rotate=True, rotate_seed=2))
    _rewrite_header(out, lambda h: h["provenance"]["rotation"]["r1"].update({"seed": 3}))
    assert verify_pack(out, reference=True).ok  # the records still hold together
    r = verify_pack(out, reference=True, source=model, keep_going=True)
    assert not r.ok and any("blk.0.attn_q.weight" in f for f in r.failures), r.failures


def test_statistics_of_the_rotated_model(tmp_path):
    model = _model(tmp_path, "llama")
    ids = _ids(tmp_path)
    plain, rot = tmp_path / "p.gguf", tmp_path / "r.gguf"
    act_stats.save(imatrix.collect(model, tokens=ids, ctx=48), plain)
    act_stats.save(imatrix.collect(model, tokens=ids, ctx=48, rotate=(0, True)), rot)
    st = act_stats.load(rot)
    assert any(d.startswith(rotate.TAG) for d in st.datasets)
    # gathered on the rotated model: the attention's input columns are the rotated stream's
    assert not np.allclose(st.mean_sq("blk.0.attn_q.weight"), act_stats.load(plain).mean_sq("blk.0.attn_q.weight"))
    out = tmp_path / "r.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], rotate=True, imatrix=rot))
    assert verify_pack(out, reference=True, source=model).ok
    for stats_file, extra, what in ((plain, ["--rotate"], "without rotation"), (rot, [], "rotated model"),
                                    (rot, ["--rotate", "--rotate-seed", "1"], "under r1")):
        bad = tmp_path / "bad.orkpack"
        res = CliRunner().invoke(app, ["build", str(model), "-o", str(bad), "--no-plan", "--threads", "1",
                                       "--imatrix", str(stats_file), "--json", *extra])
        assert res.exit_code == 2 and what in res.output and len(res.output.strip().splitlines()) == 1, res.output
        assert not bad.exists()


def test_refused_family_one_line_nothing_written(tmp_path):
    model = _model(tmp_path, "gemma2")
    out = tmp_path / "g.orkpack"
    res = CliRunner().invoke(app, ["build", str(model), "-o", str(out), "--rotate", "--no-plan", "--json"])
    assert res.exit_code == 2 and "sandwich" in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not out.exists() and not list(tmp_path.glob("*.orkpack-partial"))
    res = CliRunner().invoke(app, ["build", str(model), "-o", str(out), "--rotate-seed", "3", "--no-plan"])
    assert res.exit_code == 2 and "without --rotate" in res.output
