"""Tier-map solver: exact optimality (brute force, MILP/LP bounds), budgets, pins, min_m, no-fit errors."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from orkpack.errors import OrkError
from orkpack.tiers import cost, knapsack
from orkpack.tiers.board import load_board
from orkpack.tiers.manifest import Manifest, TensorEntry, manifest_from_config
from orkpack.tiers.profile import Profile, load_profile
from orkpack.tiers.solver import greedy_benefit, solve
from orkpack.tiers.tiermap import Decision, TierMap, dumps

FACTS = dict(arch="llama", n_layers=1, hidden=64, intermediate=64, heads=1, kv_heads=1, head_dim=32, vocab=32,
             n_experts=4, n_experts_used=2, moe_intermediate=64, tie_word_embeddings=True,
             attention="gqa", kv_k=32, kv_v=32, swa_window=0, swa_layers=[])
MOE_CFG = dict(model_type="qwen3_moe", hidden_size=2048, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
               intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
               num_hidden_layers=48, vocab_size=151936, tie_word_embeddings=False)


def small_manifest(shapes) -> Manifest:
    return Manifest(dict(FACTS), [TensorEntry(n, tuple(s), "BF16") for n, s in shapes], "test", "test")


def fake_profile(man: Manifest, benefit, sens) -> Profile:
    n = len(man.items)
    return Profile("test", "test", 512, [float(b) for b in benefit], [float(s) for s in sens], [512.0] * n,
                   [cost.min_m(it.n, it.k, BOARD) for it in man.items], [1.0] * n)


BOARD = load_board("rk3588-32g")


def check_budgets(tm: TierMap, man: Manifest, board, ctx=1, kv_type="f16") -> None:
    """Recompute every budget from the decisions alone: no budget is ever exceeded."""
    npu = sum(d.bytes for d in tm.decisions if d.tier == "npu")
    ram = sum(d.bytes for d in tm.decisions) + man.kv_bytes(ctx, kv_type) + board.reserve_bytes
    assert npu <= board.iova_usable_bytes
    assert ram <= board.total_bytes
    assert tm.budget["npu"]["used"] == npu and tm.budget["ram"]["used"] == ram
    by_key = {it.key: it for it in man.items}
    for d in tm.decisions:
        assert d.min_m >= 2
        if d.tier == "npu":
            assert d.encoding in ("int8", "nf4")
            it = by_key[(d.tensor, d.expert)]
            assert d.bytes == cost.npu_bytes(it.n, it.k, board) and d.bytes % board.alloc_granularity == 0


# ------------------------------------------------------------------------------------------ byte sizes, min_m

def test_npu_bytes_padding_segments_alignment():
    b = BOARD
    # 100 x 9000: N -> 128, K -> segments 8192 + 808 (-> 832); tiles 128*(8192+832), scales 400 -> 4096
    assert cost.k_segments(9000, b) == [(0, 8192, 8192), (8192, 9000, 832)]
    assert cost.npu_bytes(100, 9000, b) == -(-128 * (8192 + 832) // 4096) * 4096 + 4096
    assert cost.npu_bytes(32, 32, b) == 4096 + 4096
    assert cost.host_int8_bytes(3, 5) == 15 + 12
    assert cost.host_nf4_bytes(3, 65) == 98 + 4 * 4


@pytest.mark.parametrize("n,k", [(32, 32), (512, 3584), (3584, 3584), (768, 2048), (5120, 27648), (7, 70000)])
def test_min_m_is_smallest_winning_m_and_never_below_2(n, k):
    m = cost.min_m(n, k, BOARD)
    assert m >= 2
    if m < cost.MIN_M_NEVER:
        assert cost.t_npu(n, k, m, BOARD) < cost.t_cpu(n, k, m, BOARD)
        for mm in range(2, min(m, 2000)):
            assert not cost.t_npu(n, k, mm, BOARD) < cost.t_cpu(n, k, mm, BOARD)
    # M = 1 always loses on the NPU under the cost model as well
    assert cost.t_npu(n, k, 1, BOARD) >= 0


def test_min_m_below_2_is_rejected_by_constructor_and_from_json():
    d = Decision("blk.0.attn_q.weight", None, (32, 32), "int8", "npu", 1, 8192, 1.0, None)
    with pytest.raises(OrkError, match="min_m"):
        TierMap([d], model={}, board={}, options={}, objective={}, budget={}, prediction={})
    ok = TierMap([replace(d, min_m=2)], model={}, board={}, options={}, objective={}, budget={}, prediction={})
    js = json.loads(dumps(ok))
    assert TierMap.from_json(js).decision("blk.0.attn_q.weight") == ("int8", "npu", 2)
    for bad in (1, 0, -5, 1.5, True, None, "2"):
        js["tensors"][0]["slices"][0]["min_m"] = bad
        with pytest.raises(OrkError):
            TierMap.from_json(js)
    with pytest.raises(OrkError, match="not an orkpack tier map"):
        TierMap.from_json({"schema": "x"})


# ------------------------------------------------------------------------------------------ knapsack core

def _brute_knap(ws, vs, caps):
    best = 0
    for ks in itertools.product(*[range(len(v) + 1) for v in vs]):
        if all(sum(k * w[j] for k, w in zip(ks, ws)) <= caps[j] for j in range(len(caps))):
            best = max(best, sum(int(v[:k].sum()) for k, v in zip(ks, vs)))
    return best


def test_knapsack_matches_brute_force():
    rng = np.random.default_rng(7)
    for _ in range(300):
        G, D = int(rng.integers(1, 5)), int(rng.integers(1, 3))
        ws = [tuple(int(x) for x in rng.integers(0 if D == 2 else 1, 20, D)) for _ in range(G)]
        ws = [w if w[0] > 0 else (1,) + w[1:] for w in ws]
        vs = [np.sort(rng.integers(1, 50, int(rng.integers(1, 5))))[::-1].astype(np.int64) for _ in range(G)]
        caps = tuple(int(x) for x in rng.integers(0, 60, D))
        r = knapsack.solve(ws, vs, caps)
        assert r.optimal and r.value == r.bound == _brute_knap(ws, vs, caps)


def test_knapsack_node_limit_reports_a_valid_gap():
    rng = np.random.default_rng(3)
    ws = [(int(w),) for w in rng.integers(50, 400, 12)]
    vs = [np.sort(rng.integers(1, 10**6, 30))[::-1].astype(np.int64) for _ in ws]
    full = knapsack.solve(ws, vs, (5000,))
    cut = knapsack.solve(ws, vs, (5000,), node_limit=3)
    assert full.optimal
    assert cut.value <= full.value <= cut.bound


# ------------------------------------------------------------------------------------------ solver vs brute force

def _brute_solver(man, board, prof, pins_by_item, ctx=1):
    """Enumerate every assignment; return (max benefit_ps, {npu set: max sensitivity}) over feasible ones."""
    items = man.items
    opts = []
    for i, it in enumerate(items):
        p = pins_by_item.get(i)
        o = []
        if p not in ("cpu", "keep"):
            o.append(("npu", "nf4" if p == "nf4" else "int8"))
        if p == "keep":
            o = [("host", "float")]
        elif p != "npu":
            if p != "nf4":
                o.append(("host", "int8"))
            if p != "int8":
                o.append(("host", "nf4"))
        opts.append(o)
    fixed = board.reserve_bytes + man.kv_bytes(ctx) + sum(t.float_bytes for t in man.floats)
    best_b, by_set = None, {}
    for combo in itertools.product(*opts):
        npu = ram = 0
        b = 0
        s = 0.0
        for i, (tier, enc) in enumerate(combo):
            it = items[i]
            if tier == "npu":
                nb = cost.npu_bytes(it.n, it.k, board)
                npu += nb
                ram += nb
                b += int(round(prof.benefit[i] * 1e12))
            else:
                ram += {"int8": cost.host_int8_bytes(it.n, it.k), "nf4": cost.host_nf4_bytes(it.n, it.k),
                        "float": it.float_bytes}[enc]
                if enc == "int8" and pins_by_item.get(i) != "int8":
                    s += prof.sensitivity[i]
        if npu > board.iova_usable_bytes or ram + fixed > board.total_bytes:
            continue
        key = frozenset(i for i, (t, _) in enumerate(combo) if t == "npu")
        best_b = b if best_b is None else max(best_b, b)
        by_set[key] = max(by_set.get(key, -1.0), s)
    return best_b, by_set


def test_solver_matches_brute_force_with_alignment_and_pins():
    rng = np.random.default_rng(11)
    kinds = [None] * 6 + ["npu", "cpu", "int8", "nf4", "keep"]
    checked = raised = 0
    for trial in range(120):
        n = int(rng.integers(2, 7))
        shapes = [(f"blk.0.w{j}.weight", (int(rng.integers(1, 120)), int(rng.integers(1, 9000)))) for j in range(n)]
        shapes.append(("blk.0.norm.weight", (64,)))
        man = small_manifest(shapes)
        npu_sizes = [cost.npu_bytes(it.n, it.k, BOARD) for it in man.items]
        host = sum(cost.host_nf4_bytes(it.n, it.k) for it in man.items)
        board = replace(BOARD, iova_usable_bytes=int(rng.integers(0, sum(npu_sizes) + 1)) // 4096 * 4096,
                        reserve_bytes=1000,
                        total_bytes=1000 + 128 + 128 + host + int(rng.integers(0, sum(npu_sizes) + 1)))
        benefit = rng.integers(0, 50, n) * 1e-6  # some zero
        sens = rng.integers(1, 100, n)
        prof = fake_profile(man, benefit, sens)
        pins_by_item = {i: k for i in range(n) if (k := kinds[int(rng.integers(0, len(kinds)))])}
        pins = {}
        for i, k in pins_by_item.items():
            pins.setdefault(k, []).append(man.items[i].tensor)
        best_b, by_set = _brute_solver(man, board, prof, pins_by_item)
        try:
            tm = solve(man, board, prof, ctx=1, pins=pins)
        except OrkError:
            assert best_b is None, (trial, best_b)
            raised += 1
            continue
        assert best_b is not None
        check_budgets(tm, man, board)
        got_set = frozenset(i for i, it in enumerate(man.items) if tm.decision(it.tensor)[1] == "npu")
        got_b = sum(int(round(prof.benefit[i] * 1e12)) for i in got_set)
        assert got_b == best_b, trial
        got_s = sum(prof.sensitivity[i] for i, it in enumerate(man.items)
                    if tm.decision(it.tensor)[:2] == ("int8", "host") and pins_by_item.get(i) != "int8")
        assert got_s == pytest.approx(by_set[got_set], rel=1e-9), trial
        for i, k in pins_by_item.items():
            enc, tier, _ = tm.decision(man.items[i].tensor)
            assert {"npu": tier == "npu", "cpu": tier == "host", "keep": enc == "bf16" and tier == "host",
                    "int8": enc == "int8", "nf4": enc == "nf4"}[k]
        assert tm.objective["stage1"]["status"] == "optimal"
        checked += 1
    assert checked > 60 and raised > 0


def test_ties_are_broken_by_name_and_output_is_deterministic():
    shapes = [("blk.0.ffn_gate_exps.weight", (4, 64, 64))]
    man = small_manifest(shapes)
    prof = fake_profile(man, [1e-3] * 4, [1] * 4)
    per = cost.npu_bytes(64, 64, BOARD)
    board = replace(BOARD, iova_usable_bytes=2 * per)
    tm = solve(man, board, prof, ctx=1)
    assert [tm.decision("blk.0.ffn_gate_exps.weight", e)[1] for e in range(4)] == ["npu", "npu", "host", "host"]
    assert tm.decision("blk.0.ffn_gate.1.weight")[1] == "npu"  # expert-slice name
    assert dumps(tm) == dumps(solve(man, board, prof, ctx=1))


# ------------------------------------------------------------------------------------------ large instances

def _moe():
    man = manifest_from_config(MOE_CFG)
    return man


def test_moe_18k_items_optimal_against_lp_and_milp_bounds():
    scipy_opt = pytest.importorskip("scipy.optimize")
    sparse = pytest.importorskip("scipy.sparse")
    man = _moe()
    rng = np.random.default_rng(5)
    prof = load_profile(None, man, BOARD, 512)
    # skewed routing: benefits differ per expert, so the groups hold distinct values
    for i, it in enumerate(man.items):
        if it.role == "expert":
            prof.benefit[i] *= float(rng.uniform(0.2, 3.0))
    tm = solve(man, BOARD, prof, ctx=8192)
    check_budgets(tm, man, BOARD, ctx=8192)
    st = tm.objective["stage1"]
    assert st["status"] == "optimal" and st["items"] > 18000
    # LP relaxation of stage 1 (HiGHS): a valid upper bound that our exact value must not exceed
    cand = [i for i, it in enumerate(man.items) if it.role not in ("embedding", "router") and prof.benefit[i] > 0]
    v = np.array([round(prof.benefit[i] * 1e12) for i in cand], dtype=np.float64)
    w = np.array([cost.npu_bytes(man.items[i].n, man.items[i].k, BOARD) // 4096 for i in cand], dtype=np.float64)
    lp = scipy_opt.linprog(-v, A_ub=sparse.csr_matrix(w[None, :]), b_ub=[BOARD.iova_usable_bytes // 4096], bounds=(0, 1),
                           method="highs-ds")
    ours = sum(round(prof.benefit[i] * 1e12) for i in cand if tm.decision(*man.items[i].key)[1] == "npu")
    assert ours <= -lp.fun * (1 + 1e-9) + 1
    assert ours >= -lp.fun - v.max()  # within one item of the LP bound
    # exact MILP (HiGHS) on a ~250-item slice of the same instance: equal optimum
    sub = cand[:: max(1, len(cand) // 250)]
    man_sub_items = [man.items[i] for i in sub]
    cap = sum(cost.npu_bytes(it.n, it.k, BOARD) for it in man_sub_items) // 3 // 4096
    vs = np.array([round(prof.benefit[i] * 1e12) for i in sub], dtype=np.float64)
    ws = np.array([cost.npu_bytes(it.n, it.k, BOARD) // 4096 for it in man_sub_items], dtype=np.float64)
    milp = scipy_opt.milp(-vs, constraints=scipy_opt.LinearConstraint(ws[None, :], 0, cap),
                          integrality=np.ones(len(sub)), bounds=scipy_opt.Bounds(0, 1))
    groups = {}
    for j, it in enumerate(man_sub_items):
        groups.setdefault((int(ws[j]),), []).append(int(vs[j]))
    keys = sorted(groups)
    r = knapsack.solve(keys, [np.array(sorted(groups[k], reverse=True), dtype=np.int64) for k in keys], (cap,))
    assert r.optimal and r.value == round(-milp.fun)


def test_moe_plan_beats_greedy_baselines():
    man = _moe()
    prof = load_profile(None, man, BOARD, 512)
    tm = solve(man, BOARD, prof, ctx=8192)
    ours = tm.objective["npu_benefit_us"] * 1e-6
    assert ours >= greedy_benefit(man, BOARD, prof, "hotness") - 1e-9
    assert ours > 2 * greedy_benefit(man, BOARD, prof, "model")


# ------------------------------------------------------------------------------------------ no fit

def test_nothing_fits_says_by_how_much_and_what_would():
    cfg = json.loads(open("tiermaps/configs/qwen2.5-32b/config.json").read())
    man = manifest_from_config(cfg)
    b8 = load_board("rk3588-8g")
    with pytest.raises(OrkError, match=r"short by \d+ bytes") as e:
        solve(man, b8, load_profile(None, man, b8, 512), ctx=8192)
    assert "larger board" in str(e.value)  # 32B cannot fit in 8 GiB at any setting
    cfg7 = json.loads(open("tiermaps/configs/qwen2.5-7b/config.json").read())
    man7 = manifest_from_config(cfg7)
    with pytest.raises(OrkError) as e:
        solve(man7, b8, load_profile(None, man7, b8, 512), ctx=131072)
    msg = str(e.value)
    assert "short by" in msg and "--ctx" in msg
    ctx_hint = int(msg.split("--ctx ")[1].split()[0])
    solve(man7, b8, load_profile(None, man7, b8, 512), ctx=ctx_hint)  # the hint really fits
    with pytest.raises(OrkError, match="pins need"):
        solve(man7, BOARD, load_profile(None, man7, BOARD, 512), ctx=8192, pins={"npu": ["blk.*"]})
    with pytest.raises(OrkError, match="both --npu and --cpu"):
        solve(man7, BOARD, load_profile(None, man7, BOARD, 512), ctx=8192,
              pins={"npu": ["blk.0.attn_q.weight"], "cpu": ["blk.0.*"]})


def test_q8_kv_hint_when_it_helps():
    cfg7 = json.loads(open("tiermaps/configs/qwen2.5-7b/config.json").read())
    man7 = manifest_from_config(cfg7)
    b8 = load_board("rk3588-8g")
    prof = load_profile(None, man7, b8, 512)
    # find a context that fails with f16 KV by less than the q8_0 saving
    ctx = 65536
    while True:
        try:
            solve(man7, b8, prof, ctx=ctx)
            ctx += 4096
        except OrkError as e:
            if "q8_0" in str(e):
                solve(man7, b8, prof, ctx=ctx, kv_type="q8_0")
                return
            ctx += 4096
        assert ctx < 400000
