"""build --online-hadamard: SpinQuant's R4 folded into every ffn_down, its input rotated online by the runtime
(orkpack/transforms/rotate.py; docs/FORMAT.md section 11, docs/RUNTIME.md "Online Hadamard").

What must hold:

* the float model is the model: with ``h -> h R4`` applied before every ffn_down, the logits of the folded model
  are the source's within 1e-4 relative, on the tiny model of every family it applies to (alone and with --rotate
  where that applies) and on the real SmolLM2; without the online rotation they are not (the flag matters);
* the pack says so: preamble flag bit 0, format 1.9 (only such a pack), ``provenance.rotation.r4`` and each
  ffn_down's ``rotate`` entry; a pack without the option is written as before (1.7, flags 0);
* every reader knows it: the Python reader and the C reader accept bit 0 (with its record), refuse any other bit,
  bit 0 in a 1.7 pack, and the bit without the record; ``inspect`` shows it; ``verify --reference`` catches a
  tampered ffn_down; eval's numerics (decode, prefill) rotate exactly as bench/online_hadamard.py does; ``export``
  writes each ffn_down unfolded, computing what the pack's path computes; imatrix gathers ffn_down's statistics
  on the rotated input.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orkpack import stats as act_stats, synth  # noqa: E402
from orkpack.build import BuildOptions, build  # noqa: E402
from orkpack.cli import app  # noqa: E402
from orkpack.errors import OrkError  # noqa: E402
from orkpack.eval import imatrix  # noqa: E402
from orkpack.eval.weights import PackWeights  # noqa: E402
from orkpack.inspect import pack_facts as inspect_pack  # noqa: E402
from orkpack.model import forward  # noqa: E402
from orkpack.model.weights import SourceWeights  # noqa: E402
from orkpack.pack import spec  # noqa: E402
from orkpack.pack.reader import Pack, PackDamaged  # noqa: E402
from orkpack.runtime.verify import verify_pack  # noqa: E402
from orkpack.sources import open_source  # noqa: E402
from orkpack.transforms import rotate  # noqa: E402

from test_rotate import IDS, REFUSED, _model, _rewrite_header, _tensor  # noqa: E402

NO_DOWN = {"rwkv7": "no ffn_down"}  # families without an ffn_down (rwkv7's channel mix is key/value)
ONLINE = [f for f in synth.TINY if f not in NO_DOWN]
BOTH = [f for f in ONLINE if f not in REFUSED]


def _logits(model: Path, *, rotate_too: bool, online: bool = True, seed: int = 3):
    src = open_source(model)
    try:
        hp = forward.model_hparams(src)
        want = forward.run(src, IDS, hp=hp)
        rs = rotate.rotated(src, seed, rotate=rotate_too, online=online)
        got = forward.run(rs, IDS, hp=hp)  # SourceWeights(rs): R4 before each ffn_down (rs.online_input)
        return want, got, rs
    finally:
        src.close()


def _close(got, want, tol=1e-4) -> bool:
    return float(np.max(np.abs(got - want))) <= tol * float(np.max(np.abs(want)))


# ------------------------------------------------------------------------------------------- the float model

@pytest.mark.parametrize("family", ONLINE)
def test_online_r4_alone_is_the_model(tmp_path, family):
    want, got, rs = _logits(_model(tmp_path, family), rotate_too=False)
    assert _close(got, want), family
    p = rs.plan
    assert p.r1 is None and p.r2 is None and p.r4
    shapes = {i.name: tuple(i.shape) for i in rs.tensors()}
    downs = [n for n in shapes if ".ffn_down" in n and n.endswith(".weight")]
    assert downs and set(p.ops) == set(downs), family  # every ffn_down, nothing else
    for n in downs:
        assert p.ops[n] == [("rot", "r4", len(shapes[n]) - 1, 0, shapes[n][-1])], n
    for w, r in p.r4.items():
        assert r.size == rotate.online_block(w) and r.kind == "hadamard"


@pytest.mark.parametrize("family", BOTH)
def test_online_r4_with_rotate_is_the_model(tmp_path, family):
    want, got, rs = _logits(_model(tmp_path, family), rotate_too=True)
    assert _close(got, want), family
    assert rs.plan.r1 is not None and rs.plan.r4


def test_without_the_online_rotation_the_model_is_broken(tmp_path):
    """The folded model needs the runtime's rotation: run without it (a reader that ignored the flag), the logits
    are far from the source's."""
    src = open_source(_model(tmp_path, "llama"))
    try:
        hp = forward.model_hparams(src)
        want = forward.run(src, IDS, hp=hp)
        rs = rotate.rotated(src, 3, rotate=False, online=True)

        class Ignorant(SourceWeights):
            def online_input(self, name, x):
                return x
        got = forward.run(rs, IDS, hp=hp, weights=Ignorant(rs))
        assert not _close(got, want, 1e-2)
    finally:
        src.close()


def test_block_sizes():
    assert rotate.online_block(1536) == 1536  # SmolLM2: 12 x 2^7, the whole width
    assert rotate.hadamard_factor(1536) == 12
    assert rotate.online_block(96) == 96 and rotate.online_block(48) == 48
    for w in (14336, 8960, 11008, 3072, 2816, 1000):
        b = rotate.online_block(w)
        assert w % b == 0 and rotate.hadamard_factor(b) is not None and b >= 8, (w, b)
        assert all(w % c or rotate.hadamard_factor(c) is None for c in range(b + 1, w + 1)), (w, b)


def test_family_without_ffn_down_refused_one_line(tmp_path):
    model = _model(tmp_path, "rwkv7")
    out = tmp_path / "r.orkpack"
    res = CliRunner().invoke(app, ["build", str(model), "-o", str(out), "--online-hadamard", "--no-plan", "--json"])
    assert res.exit_code == 2 and "no ffn_down" in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not out.exists() and not list(tmp_path.glob("*.orkpack-partial"))


def test_real_smollm2_online_is_the_model():
    from test_eval_tokenizer import real_smollm2

    src = open_source(real_smollm2())
    try:
        hp = forward.model_hparams(src)
        ids = np.random.default_rng(3).integers(0, hp.vocab, 48)
        want = forward.run(src, ids, hp=hp)
        for both in (False, True):
            rs = rotate.rotated(src, 0, rotate=both, online=True)
            assert {w: r.record() for w, r in rs.plan.r4.items()} == {
                1536: {"kind": "hadamard", "size": 1536, "seed": 0, "hadamard": [12, 128]}}
            got = forward.run(rs, ids, hp=hp)
            assert _close(got, want), both
    finally:
        src.close()


# ------------------------------------------------------------------------------------------- the pack

@pytest.mark.parametrize("family,both", [("llama", False), ("qwen2_moe", True), ("qwen2_moe", False),
                                         ("gpt_oss", True), ("gemma3_text", False), ("deepseek_v2", False)])
def test_float_pack_round_trip(tmp_path, family, both):
    model = _model(tmp_path, family, dtype="bf16")
    out = tmp_path / "f.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, keep=["*"], rotate=both, online_hadamard=True,
                                   rotate_seed=4))
    src = open_source(model)
    try:
        hp = forward.model_hparams(src)
        want = forward.run(src, IDS, hp=hp)
        with Pack.open(out) as p:
            assert p.preamble.flags == spec.FLAG_ONLINE_R4 and p.preamble.version_minor == spec.VERSION_MINOR_ONLINE
            assert p.header["version"] == [1, spec.VERSION_MINOR_ONLINE]
            rec = p.header["provenance"]["rotation"]
            assert rec["online"] == "ffn_down" and all(r["seed"] == 4 for r in rec["r4"])
            assert (rec["r1"] is not None) == both
            assert p.header["provenance"]["options"]["online_hadamard"] is True
            for t in p.tensors:
                if ".ffn_down" in t["name"] and t["name"].endswith(".weight"):
                    assert ["r4", len(t["shape"]) - 1, 0, t["shape"][-1]] in t["rotation"]["rotate"]
            assert rotate.check_pack(p) is None
            got = forward.run(src, IDS, weights=PackWeights(p, "decode"), hp=hp)
            info = inspect_pack(out)
            assert info["flags"] == ["online_r4"] and info["rotation"]["online"] == "ffn_down"
    finally:
        src.close()
    assert _close(got, want), family
    r = verify_pack(out, reference=True, source=model)
    assert r.ok, r.failures


def test_pack_without_the_option_is_as_before(tmp_path):
    model = _model(tmp_path, "llama")
    a, b = tmp_path / "a.orkpack", tmp_path / "b.orkpack"
    build(model, a, BuildOptions(threads=1, plan=False, npu=["*"]))
    build(model, b, BuildOptions(threads=1, plan=False, npu=["*"], online_hadamard=False, rotate_seed=0))
    assert a.read_bytes() == b.read_bytes()
    with Pack.open(a) as p:
        assert p.preamble.flags == 0 and p.preamble.version_minor == spec.VERSION_MINOR and p.header["version"] == [1, spec.VERSION_MINOR]
        assert "online_hadamard" not in p.header["provenance"]["options"]
        assert inspect_pack(a)["flags"] == []
    r = tmp_path / "r.orkpack"
    build(model, r, BuildOptions(threads=1, plan=False, npu=["*"], rotate=True))
    with Pack.open(r) as p:  # --rotate alone: no online step, no flag, still the unflagged minor
        assert p.preamble.flags == 0 and p.preamble.version_minor == spec.VERSION_MINOR
        assert p.header["provenance"]["rotation"].get("r4") is None


def _set_preamble(path: Path, *, flags: int | None = None, minor: int | None = None) -> Path:
    """Rewrite the preamble's flags / minor version, its checksum recomputed."""
    raw = bytearray(path.read_bytes())
    if flags is not None:
        struct.pack_into("<I", raw, 76, flags)
    if minor is not None:
        struct.pack_into("<H", raw, 10, minor)
    raw[120:128] = bytes(8)
    struct.pack_into("<Q", raw, 120, xxhash.xxh3_64_intdigest(bytes(raw[:4096])))
    path.write_bytes(bytes(raw))
    return path


def test_flag_bits_python_and_c_readers(tmp_path, check):
    assert struct.calcsize("<8sHHIQQQQQQQI") == 76  # the flags field's offset
    model = _model(tmp_path, "llama")
    good = tmp_path / "good.orkpack"
    build(model, good, BuildOptions(threads=1, plan=False, npu=["*"], online_hadamard=True))
    plain = tmp_path / "plain.orkpack"
    build(model, plain, BuildOptions(threads=1, plan=False, npu=["*"]))
    cases = {  # name -> (pack, what the Python reader says, or None: opens)
        "good": (good, None),
        "bit1": (_set_preamble(tmp_path.joinpath("bit1.orkpack").write_bytes(good.read_bytes()) and
                               tmp_path / "bit1.orkpack", flags=3), "unknown flags 0x2"),
        "high": (_set_preamble(tmp_path.joinpath("high.orkpack").write_bytes(good.read_bytes()) and
                               tmp_path / "high.orkpack", flags=1 | (1 << 31)), "unknown flags 0x80000000"),
        "old": (_set_preamble(tmp_path.joinpath("old.orkpack").write_bytes(good.read_bytes()) and
                              tmp_path / "old.orkpack", minor=7), "in a format 1.7 pack"),
        "norec": (_set_preamble(tmp_path.joinpath("norec.orkpack").write_bytes(plain.read_bytes()) and
                                tmp_path / "norec.orkpack", flags=1, minor=spec.VERSION_MINOR_ONLINE), "disagree"),
    }
    for name, (p, why) in cases.items():
        if why is None:
            Pack.open(p).close()
            assert verify_pack(p).ok
        else:
            with pytest.raises(PackDamaged, match=why):
                Pack.open(p)
            assert verify_pack(p).exit_code == 1
        res = subprocess.run([str(check), str(p)], capture_output=True, text=True, timeout=120)
        line = res.stdout.strip()
        if why is None:
            assert res.returncode == 0 and line.startswith("ok ") and "flag 0x1" in line, line
        else:
            assert res.returncode == 1 and line.startswith("FAIL ") and why in line, (name, line)
    res = subprocess.run([str(check), str(plain)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "flag 0x" not in res.stdout


def test_verify_reference_catches_a_tampered_ffn_down(tmp_path):
    model = _model(tmp_path, "llama")
    out = tmp_path / "t.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], online_hadamard=True, rotate_seed=2))
    assert verify_pack(out, reference=True, source=model).ok
    # another seed recorded: the records hold together, the stored ffn_down is not the source's under it
    _rewrite_header(out, lambda h: [r.update({"seed": 5}) for r in h["provenance"]["rotation"]["r4"]])
    _set_preamble(out, flags=1, minor=spec.VERSION_MINOR_ONLINE)  # (the rewrite writes a flagless preamble)
    assert verify_pack(out, reference=True).ok
    r = verify_pack(out, reference=True, source=model, keep_going=True)
    assert not r.ok and any("ffn_down" in f for f in r.failures), r.failures
    assert not any("attn" in f for f in r.failures), r.failures  # only the matrices R4 touches


@pytest.mark.parametrize("mutate,why", [
    (lambda h: _tensor(h, "blk.0.ffn_down.weight").pop("rotation"), "an ffn_down without R4"),
    (lambda h: h["provenance"]["rotation"]["r4"][0].update({"size": 32}), "the rule gives"),
    (lambda h: h["provenance"]["rotation"].pop("online"), "without online"),
    (lambda h: _tensor(h, "blk.0.attn_q.weight").update({"rotation": {"rotate": [["r4", 1, 0, 64]]}}),
     "not R4 over an ffn_down"),
])
def test_verify_reference_catches_tampered_records(tmp_path, mutate, why):
    model = _model(tmp_path, "llama")
    out = tmp_path / "t.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], online_hadamard=True))
    _rewrite_header(out, mutate)
    _set_preamble(out, flags=1, minor=spec.VERSION_MINOR_ONLINE)  # (the rewrite writes a flagless preamble)
    r = verify_pack(out, reference=True)
    assert not r.ok and any(why in f for f in r.failures), r.failures


def test_eval_numerics_are_the_benchs(tmp_path):
    """PackWeights of a flagged pack, prefill path (int8 weights x int8 activations per token) and decode path:
    the logits bench/online_hadamard.py's ``online`` gives over the same pack read without the flag's rotation, bit
    for bit; and the activations quantized are the rotated ones (R4 before quantizing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from online_hadamard import online

    model = _model(tmp_path, "llama")
    out = tmp_path / "n.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], online_hadamard=True, rotate_seed=0))
    src = open_source(model)
    try:
        hp = forward.model_hparams(src)
        with Pack.open(out) as p:
            for path in ("prefill", "decode"):
                w = PackWeights(p, path, m=8)
                got = forward.run(src, IDS, weights=w, hp=hp)
                bare = PackWeights(p, path, m=8)
                bare.r4 = None
                ref = forward.run(src, IDS, weights=online(bare, 0), hp=hp)
                np.testing.assert_array_equal(got, ref, err_msg=path)
                assert not np.allclose(forward.run(src, IDS, weights=bare, hp=hp), got, rtol=1e-2)
            want = forward.run(src, IDS, hp=hp)
            assert float(np.max(np.abs(got - want))) < 0.2 * float(np.max(np.abs(want)))  # int8: near the model
    finally:
        src.close()


def test_export_unfolds_r4(tmp_path):
    """llama.cpp cannot rotate online: the export writes each ffn_down as (W R4) R4^T of the path's values; read
    back, the GGUF computes what the pack's path computes (float activations)."""
    pytest.importorskip("gguf")
    from orkpack.eval.export import export

    hf = synth.write_hf_model(tmp_path / "hf", layers=2, hidden=64, intermediate=96, heads=4, kv_heads=2, vocab=512,
                              seed=3, tied=True)
    synth.write_tokenizer(hf, n_merges=200)
    out = tmp_path / "h.orkpack"
    build(hf, out, BuildOptions(threads=1, plan=False, npu=["*"], online_hadamard=True))
    g = export(out, tmp_path / "h.gguf").path
    src, gs = open_source(hf), open_source(g)
    try:
        hp = forward.model_hparams(src)
        with Pack.open(out) as p:
            path_logits = forward.run(src, IDS, weights=PackWeights(p, "decode"), hp=hp)
            w = PackWeights(p, "decode")
            stored = w._operand("blk.0.ffn_down.weight", None)
            stored = stored.rows(0, stored.n)
        got = forward.run(gs, IDS, hp=forward.model_hparams(gs))
        assert _close(got, path_logits, 1e-4)
        # the exported ffn_down is in the source's basis (near W), the pack's stored one is not
        from orkpack.sources.base import as_float32

        wsrc = as_float32(src.read("blk.0.ffn_down.weight")).astype(np.float64)
        wexp = as_float32(gs.read("blk.0.ffn_down.weight")).astype(np.float64)

        def db(a):
            return 10 * np.log10((wsrc ** 2).sum() / ((a - wsrc) ** 2).sum())
        assert db(wexp) > 30 and db(np.asarray(stored, np.float64)) < 3
    finally:
        src.close()
        gs.close()


def test_statistics_gathered_on_the_rotated_input(tmp_path):
    from test_rotate import _ids

    model = _model(tmp_path, "llama")
    ids = _ids(tmp_path)
    plain, rot = tmp_path / "p.gguf", tmp_path / "h.gguf"
    act_stats.save(imatrix.collect(model, tokens=ids, ctx=48), plain)
    act_stats.save(imatrix.collect(model, tokens=ids, ctx=48, online=True), rot)
    sp, sr = act_stats.load(plain), act_stats.load(rot)
    assert any(d.startswith(rotate.TAG) and "r4=" in d for d in sr.datasets)
    for n in ("blk.0.ffn_down.weight", "blk.1.ffn_down.weight"):
        a, b = sp.mean_sq(n), sr.mean_sq(n)
        assert not np.allclose(a, b)  # the rotated input's columns
        assert np.isclose(a.sum(), b.sum(), rtol=1e-5)  # an orthogonal R4: each token's energy kept
    np.testing.assert_allclose(sp.mean_sq("blk.0.attn_q.weight"), sr.mean_sq("blk.0.attn_q.weight"), rtol=1e-6)
    out = tmp_path / "h.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False, npu=["*"], online_hadamard=True, imatrix=rot))
    assert verify_pack(out, reference=True, source=model).ok
    for stats_file, extra, what in ((plain, ["--online-hadamard"], "without rotation"), (rot, [], "rotated model")):
        bad = tmp_path / "bad.orkpack"
        res = CliRunner().invoke(app, ["build", str(model), "-o", str(bad), "--no-plan", "--threads", "1",
                                       "--imatrix", str(stats_file), "--json", *extra])
        assert res.exit_code == 2 and what in res.output and len(res.output.strip().splitlines()) == 1, res.output
        assert not bad.exists()
    res = CliRunner().invoke(app, ["imatrix", str(model), "--tokens", str(ids), "--ctx", "48", "--online-hadamard",
                                   "--rotate-seed", "2", "-o", str(tmp_path / "c.gguf"), "--json"])
    assert res.exit_code == 0, res.output
    assert any("r4=hadamard:96:2" in d for d in json.loads(res.output)["datasets"])


def test_cli_flag(tmp_path):
    model = _model(tmp_path, "llama")
    out = tmp_path / "c.orkpack"
    res = CliRunner().invoke(app, ["build", str(model), "-o", str(out), "--online-hadamard", "--rotate-seed", "7",
                                   "--no-plan", "--json"])
    assert res.exit_code == 0, res.output
    with Pack.open(out) as p:
        assert p.preamble.flags == 1 and p.header["provenance"]["rotation"]["r4"][0]["seed"] == 7
    res = CliRunner().invoke(app, ["inspect", str(out)])
    assert res.exit_code == 0 and "flags online_r4" in res.output and "online before every ffn_down" in res.output
    with pytest.raises(OrkError, match="disagree"):
        p = Pack.open(out)
        p.preamble = p.preamble._replace(flags=0)
        try:
            rotate.online_of(p)
        finally:
            p.close()
