"""The best pack of a given size: ``plan/build --max-bytes`` / ``--bpw`` / ``--bytes-of`` (issue 25).

The plan's size bound is one more linear constraint of the exact MILP: the weight bytes the pack holds (each item's
stored bytes under its choice: NPU tiles, host copies, host tensors; plus the floats no choice changes), or the
weight bytes a decode token reads. The optimum is checked against an independent exact solver (a dynamic program
over bytes, a multiple-choice knapsack) on a tiny model whose every item chooses NF4 or int8 on the host; the bound
against the bytes the built pack holds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orkpack import synth
from orkpack.errors import OrkError
from orkpack.tiers import solver
from orkpack.tiers.board import load_board
from orkpack.tiers.manifest import manifest_from_config, manifest_from_path
from orkpack.tiers.profile import load_profile
from orkpack.tiers.solver import Goal, solve

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "orkpack", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _host_only():
    """A tiny llama on the CPU-only runtime path: every item NF4 or int8 on the host."""
    man = manifest_from_config(synth.TINY["llama"])
    board = load_board("rk3588-32g", "llama.cpp-cpu")
    return man, board, load_profile(None, man, board)


def _knapsack(man, board, prof, cap: int) -> float:
    """The most quality (the sum of the sensitivities of the items stored int8) within ``cap`` weight bytes: an exact
    dynamic program over bytes, independent of the MILP (it shares the cost model, not the optimizer)."""
    rows = solver._rows(man, board, {})
    md = solver._model(man, board, prof, rows, 512, "f16")
    room = cap - sum(t.float_bytes for t in man.floats)
    best = {0: 0.0}  # bytes used -> the most quality
    for al, ram, q in zip(md.allowed, md.ram, md.qual):
        nxt: dict[int, float] = {}
        for used, val in best.items():
            for b, qq in zip(ram, q):
                u = used + int(b)
                if u <= room and nxt.get(u, -1.0) < val + qq:
                    nxt[u] = val + qq
        best = nxt
    return max(best.values())


@pytest.mark.parametrize("frac", [0.0, 0.2, 0.5, 0.8, 1.0])
def test_the_size_bounded_plan_is_the_exact_optimum(frac):
    man, board, prof = _host_only()
    lo = solve(man, board, prof, goal=Goal("quality", max_bytes=10 ** 12, bytes_of="file"))
    small = solver.weight_bytes(man, *_md_pick(man, board, prof, "nf4"))["file"]
    large = solver.weight_bytes(man, *_md_pick(man, board, prof, "int8"))["file"]
    cap = int(small + frac * (large - small))
    tm = solve(man, board, prof, goal=Goal("quality", max_bytes=cap))
    w = tm.budget["weights"]
    assert w["file"] <= cap == w["cap"] and w["of"] == "file"
    q = next(s["value"] for s in tm.objective["stages"] if s["metric"] == "quality")
    assert q == pytest.approx(_knapsack(man, board, prof, cap), rel=0, abs=2e-9)  # the stage value: 9 digits
    assert lo.budget["weights"]["file"] == large  # unbounded quality: every item int8


def _md_pick(man, board, prof, enc):
    rows = solver._rows(man, board, {})
    md = solver._model(man, board, prof, rows, 512, "f16")
    return md, [a.index(enc) for a in md.allowed]


def test_bpw_is_bytes_per_weight_parameter_and_the_decode_bound():
    man, board, prof = _host_only()
    params = solver.weight_params(man)
    assert params == sum(i.n * i.k for i in man.items) + sum(t.numel for t in man.floats)
    tm = solve(man, board, prof, goal=Goal("quality", bpw=6.0))
    assert tm.budget["weights"]["cap"] == int(6.0 * params // 8) >= tm.budget["weights"]["file"]
    tm = solve(man, board, prof, goal=Goal("quality", bpw=6.0, bytes_of="decode"))
    w = tm.budget["weights"]
    assert w["of"] == "decode" and w["decode"] <= w["cap"]


def test_a_budget_below_the_smallest_pack_is_one_line():
    man, board, prof = _host_only()
    with pytest.raises(OrkError, match="below the least the pack's weights can be"):
        solve(man, board, prof, goal=Goal("quality", max_bytes=1000))
    with pytest.raises(OrkError, match="give one"):
        Goal("quality", max_bytes=1000, bpw=4.0)
    with pytest.raises(OrkError, match="--bytes-of"):
        Goal("quality", max_bytes=1000, bytes_of="disk")


def test_build_holds_what_the_plan_bounds(tmp_path):
    """build --bpw: the pack's tensors hold exactly the weight bytes the plan counted (the file adds its header and
    each tensor's alignment padding), within the bound; without --goal the goal is quality."""
    src = tmp_path / "m"
    synth.write_hf_model(src, config=synth.TINY["llama"])
    r = _run("plan", str(src), "--bpw", "6", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    p = json.loads(r.stdout)
    assert p["objective"]["order"][0] == "quality (max)" and p["objective"]["goal"]["bpw"] == 6
    r = _run("build", str(src), "-o", str(tmp_path / "a.orkpack"), "--bpw", "6", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    b = json.loads(r.stdout)
    stored, w = sum(k["bytes"] for k in b["by_kind"]), p["budget"]["weights"]
    assert stored <= w["file"] <= w["cap"]  # NPU tiles count at the bytes the NPU maps (aligned), the rest exactly
    if not any(k["tier"] == "npu" for k in b["by_kind"]):
        assert stored == w["file"]
    r = _run("build", str(src), "-o", str(tmp_path / "b.orkpack"), "--max-bytes", "1000", "--json")  # no progress bar
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "allow more" in r.stderr and not (tmp_path / "b.orkpack").exists()


def test_plan_prints_the_weight_bytes():
    r = _run("plan", str(ROOT / "tests" / "fixtures" / "configs" / "llama.json"), "--bpw", "4.8")
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    assert "bits per weight" in out and "--bpw 4.8" in out


def test_the_size_frontier_is_the_least_kld_at_each_size():
    """plan --frontier-size: from the smallest plan (every item its smallest choice) to the best-quality one, the
    sizes grow and the predicted KLD falls point by point; each point is the exact optimum at its bytes."""
    from orkpack.tiers.command import size_frontier

    man, board, prof = _host_only()
    pts = size_frontier(man, board, prof, ctx=8192, kv_type="f16", pins=None, goal=Goal(), prompt=512)
    sizes = [t.budget["weights"]["file"] for t in pts]
    klds = [t.prediction["kld"] for t in pts]
    assert len(pts) >= 3 and sizes == sorted(sizes) and klds == sorted(klds, reverse=True)
    assert sizes[0] == solver.least_weight_bytes(man, board, prof, None)
    for t in pts[:-1]:
        q = next(s["value"] for s in t.objective["stages"] if s["metric"] == "quality")
        assert q == pytest.approx(_knapsack(man, board, prof, t.budget["weights"]["cap"]), rel=0, abs=2e-9)
    r = _run("plan", str(ROOT / "tests" / "fixtures" / "configs" / "llama.json"), "--frontier-size", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout)["frontier"]
    assert [p["budget"]["weights"]["file"] for p in got] == sorted(p["budget"]["weights"]["file"] for p in got)
    r = _run("plan", str(ROOT / "tests" / "fixtures" / "configs" / "llama.json"), "--frontier-size", "--frontier")
    assert r.returncode != 0 and "give one" in r.stderr
