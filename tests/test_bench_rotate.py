"""The tools behind docs/EVAL.md's rotation measurements (issue 25): bench/folded_gguf.py writes the folded (and
rotated) model as a float GGUF that computes the source's logits (with ``--down-hadamard`` only once each ffn_down
input is rotated online, bench/online_hadamard.py's provider); bench/rotate_nf4.py's variants are the models they
name (folding unit gains changes nothing, and its predicted cost is then 0 dB)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest

from orkpack import synth
from orkpack.model import forward
from orkpack.model.weights import SourceWeights
from orkpack.sources import open_source

BENCH = Path(__file__).resolve().parents[1] / "bench"
IDS = np.random.default_rng(11).integers(0, 500, 48)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _logits(path: Path, wrap=None) -> np.ndarray:
    src = open_source(path, on_warning=lambda m: None)
    try:
        w = SourceWeights(src)
        return forward.run(src, IDS, weights=wrap(w) if wrap else w)
    finally:
        src.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return synth.write_gguf_model(tmp_path_factory.mktemp("m") / "m.gguf", tensor_type="F32", seed=3)


def _rel(a, b) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_folded_and_rotated_ggufs_are_the_model(tiny, tmp_path):
    fg, oh = _load("folded_gguf"), _load("online_hadamard")
    want = _logits(tiny)
    fold, rot, down = tmp_path / "f.gguf", tmp_path / "r.gguf", tmp_path / "rd.gguf"
    fg.folded(tiny, fold, rotate=False)
    fg.folded(tiny, rot, rotate=True)
    fg.folded(tiny, down, rotate=True, down=True)
    r = gguf.GGUFReader(str(fold))
    t = {x.name: np.asarray(x.data) for x in r.tensors}
    assert "output.weight" in t  # the tied head untied (the final norm folded into it alone)
    assert all(np.all(v == 1) for n, v in t.items() if n.endswith("norm.weight"))
    src = gguf.GGUFReader(str(tiny))
    s = {x.name: np.asarray(x.data) for x in src.tensors}
    assert np.array_equal(t["token_embd.weight"], s["token_embd.weight"])  # no rotation in the fold-only copy
    assert not np.allclose(t["blk.0.attn_q.weight"], s["blk.0.attn_q.weight"])  # the gain is in it
    for p in (fold, rot):
        assert _rel(_logits(p), want) < 1e-4
    assert _rel(_logits(down, oh.online), want) < 1e-4  # right with h -> h R4 online
    assert _rel(_logits(down), want) > 1e-2  # and wrong without it


def test_rotate_nf4_variants(tiny, tmp_path):
    fg, rn = _load("folded_gguf"), _load("rotate_nf4")
    unit = tmp_path / "f.gguf"
    fg.folded(tiny, unit, rotate=False)  # every gain 1: folding it again changes nothing
    src = open_source(unit)
    hp = forward.model_hparams(src)
    src.close()
    ids = IDS[:32]
    plain, ms = rn.measure(unit, "plain", ids, hp)
    fold, _ = rn.measure(unit, "fold", ids, hp)
    rot, _ = rn.measure(unit, "rot", ids, hp)
    assert plain == fold
    assert set(rot) == set(plain)
    assert rot != plain and all(10 < v["wsqnr"] < 40 and 5 < v["osqnr"] < 40 for v in rot.values())
    costs = rn.fold_costs(unit, ms)
    assert costs and all(abs(c["predicted_db"]) < 1e-9 for c in costs.values())
    # on the model's own gains the prediction is the formula: mean(g^2) mean(m) / mean(g^2 m)
    src = open_source(tiny)
    hp0 = forward.model_hparams(src)
    src.close()
    _, ms0 = rn.measure(tiny, "plain", ids, hp0)
    c = rn.fold_costs(tiny, ms0)["blk.1.ffn_norm.weight"]
    g = next(np.asarray(x.data, np.float64) for x in gguf.GGUFReader(str(tiny)).tensors
             if x.name == "blk.1.ffn_norm.weight")
    s2 = ms0["blk.1.ffn_gate.weight"]
    m = s2 / g ** 2
    assert c["predicted_db"] == pytest.approx(10 * np.log10((g ** 2).mean() * m.mean() / s2.mean()), abs=1e-9)


def test_smooth_down_gguf_is_the_model(tiny, tmp_path):
    """bench/smooth_down_gguf.py: ffn_up's rows / s and ffn_down's columns * s on the rotated model, s powers of two
    from the rotated model's statistics: the source's logits, and with R4 folded on top (folded_gguf's
    --down-hadamard of it) the source's logits once each ffn_down input is rotated online."""
    from orkpack import stats as act_stats
    from orkpack.eval import imatrix

    sd, fg, oh = _load("smooth_down_gguf"), _load("folded_gguf"), _load("online_hadamard")
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(int(i)) for i in np.random.default_rng(2).integers(0, 500, 96)))
    st = tmp_path / "st.gguf"
    act_stats.save(imatrix.collect(tiny, tokens=ids, ctx=48, rotate=(0, True)), st)
    out, rot = tmp_path / "sd.gguf", tmp_path / "r.gguf"
    s = sd.smoothed_down(tiny, st, out, alpha=0.5)
    assert s and all(np.all(np.log2(v) == np.rint(np.log2(v))) for v in s.values())
    assert any(np.any(v != 1) for v in s.values())  # else the test proves nothing
    fg.folded(tiny, rot, rotate=True)
    t = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(str(out)).tensors}
    u = {x.name: np.asarray(x.data) for x in gguf.GGUFReader(str(rot)).tensors}
    for n, v in s.items():  # exactly the rotated model's values, scaled by powers of two
        d = n.replace(".ffn_up.", ".ffn_down.")
        assert np.array_equal(t[n], (u[n] / v[:, None]).astype(np.float32))
        assert np.array_equal(t[d], (u[d] * v[None, :]).astype(np.float32))
    assert all(np.array_equal(t[n], u[n]) for n in u if ".ffn_up." not in n and ".ffn_down." not in n)
    want = _logits(tiny)
    assert _rel(_logits(out), want) < 1e-4
    both = tmp_path / "sdr4.gguf"
    fg.folded(out, both, rotate=False, down=True)  # its gains are 1 already: the fold changes nothing; R4 on ffn_down
    assert _rel(_logits(both, oh.online), want) < 1e-4
