"""Tier-map solver: exact optimality (brute force, MILP/LP bounds), budgets, pins, min_m, no-fit errors."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from orkpack.errors import OrkError
from orkpack.tiers import cost
from orkpack.tiers.board import load_board
from orkpack.tiers.manifest import Manifest, TensorEntry, manifest_from_config
from orkpack.tiers.profile import Profile, load_profile
from orkpack.tiers.solver import solve
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
                   [cost.min_m(it.n, it.k, BOARD) for it in man.items], [1.0] * n, [max(0.0, 1.0 - b) for b in benefit])


BOARD = load_board("rk3588-32g")


def check_budgets(tm: TierMap, man: Manifest, board, ctx=1, kv_type="f16") -> None:
    """Recompute every budget from the decisions alone: no budget is ever exceeded."""
    npu = sum(d.bytes for d in tm.decisions if d.tier == "npu")
    ram = sum(d.bytes + d.host_copy_bytes for d in tm.decisions) + man.kv_bytes(ctx, kv_type) + board.reserve_bytes
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
    # 3 x 65 = 195 values: 98 code bytes; b64: 4 float32 absmax; dq32: 7 absmax codes, 1 scale, the offset
    assert cost.host_nf4_bytes(3, 65, "b64") == 98 + 4 * 4
    assert cost.host_nf4_bytes(3, 65, "dq32") == 98 + 7 + 4 + 4
    # 64 x 257 = 16448 values: 514 absmax codes, 3 scales
    assert cost.host_nf4_bytes(64, 257, "dq32") == 8224 + 514 + 3 * 4 + 4
    with pytest.raises(ValueError):
        cost.host_nf4_bytes(3, 65, "nf4")


def test_host_nf4_bytes_are_the_pack_parts_of_the_format():
    """The planner's bytes of each NF4 format are the parts a pack stores for its encoding (the reader's
    sizes, docs/FORMAT.md 3); the format names and their encodings are the build's (codecs.nf4opt)."""
    from orkpack.transforms.nf4 import NF4_FORMATS, NF4Choice
    from orkpack.pack.reader import expected_part_sizes
    from orkpack.tiers.board import NF4_FORMATS as PLANNED

    assert PLANNED == NF4_FORMATS
    rng = np.random.default_rng(5)
    shapes = [(1, 1), (1, 31), (1, 33), (32, 256), (33, 257), (4096, 4096)] + \
        [(int(rng.integers(1, 3000)), int(rng.integers(1, 3000))) for _ in range(50)]
    for fmt in NF4_FORMATS:
        enc = NF4Choice(format=fmt).encoding
        for n, k in shapes:
            assert cost.host_nf4_bytes(n, k, fmt) == sum(expected_part_sizes([n, k], enc, {"kind": "row_major"}).values()), (fmt, n, k)


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


# ------------------------------------------------------------------------------------------ solver vs brute force

def _brute(md, cap_ram, cap_npu, goal: str, slack: float = 0.05):
    """The lexicographic optimum over every assignment of the coefficient table, by enumeration.

    Returns every optimum as (decode s/token, prefill s/chunk, quality) (the balanced goal leaves decode
    free within its slack, so optima may differ in decode), or None when nothing fits.
    """
    combos = []
    for pick in itertools.product(*[range(len(a)) for a in md.allowed]):
        ram = sum(md.ram[i][c] for i, c in enumerate(pick))
        npu = sum(md.npu[i][c] for i, c in enumerate(pick))
        if ram > cap_ram or npu > cap_npu:
            continue
        combos.append((md.dec_const + sum(md.dec[i][c] for i, c in enumerate(pick)),
                       md.pre_const + sum(md.pre[i][c] for i, c in enumerate(pick)),
                       sum(md.qual[i][c] for i, c in enumerate(pick))))
    if not combos:
        return None
    tol = 1e-9

    def best(cs, k, sense):
        v = (min if sense == "min" else max)(c[k] for c in cs)
        return v, [c for c in cs if (c[k] <= v + tol * abs(v) if sense == "min" else c[k] >= v - tol * abs(v))]

    if goal == "balanced":
        d, _ = best(combos, 0, "min")
        cs = [c for c in combos if c[0] <= d / (1 - slack) * (1 + tol)]
        p, _ = best(cs, 1, "min")
        cs = [c for c in cs if c[1] <= p / (1 - 0.01) * (1 + tol)]  # prefill within 1 %, for quality
        _, cs = best(cs, 2, "max")
    else:
        order = {"decode": [(0, "min"), (1, "min"), (2, "max")], "prefill": [(1, "min"), (0, "min"), (2, "max")],
                 "quality": [(2, "max"), (0, "min"), (1, "min")]}[goal]
        cs = combos
        for k, sense in order:
            _, cs = best(cs, k, sense)
    return cs


@pytest.mark.parametrize("goal", ["balanced", "decode", "prefill", "quality"])
def test_solver_matches_brute_force_with_alignment_and_pins(goal):
    from orkpack.tiers.solver import Goal, _model, _rows, match_pins

    rng = np.random.default_rng({"balanced": 11, "decode": 12, "prefill": 13, "quality": 14}[goal])
    kinds = [None] * 6 + ["npu", "cpu", "int8", "nf4", "keep"]
    checked = raised = 0
    for trial in range(40):
        n = int(rng.integers(2, 6))
        shapes = [(f"blk.0.w{j}.weight", (int(rng.integers(1, 120)) * 32, int(rng.integers(1, 300)) * 32)) for j in range(n)]
        shapes.append(("blk.0.norm.weight", (64,)))
        man = small_manifest(shapes)
        npu_sizes = [cost.npu_bytes(it.n, it.k, BOARD) for it in man.items]
        host = sum(cost.host_nf4_bytes(it.n, it.k, BOARD.nf4_format) for it in man.items)
        board = replace(BOARD, iova_usable_bytes=int(rng.integers(0, sum(npu_sizes) + 1)) // 4096 * 4096,
                        reserve_bytes=1000,
                        total_bytes=1000 + 128 + 128 + host + int(rng.integers(0, 2 * sum(npu_sizes) + 1)))
        prof = load_profile(None, man, board, 512)
        pins_by_item = {i: k for i in range(n) if (k := kinds[int(rng.integers(0, len(kinds)))])}
        pins = {}
        for i, k in pins_by_item.items():
            pins.setdefault(k, []).append(man.items[i].tensor)
        pinmap, _ = match_pins(man, pins)
        md = _model(man, board, prof, _rows(man, board, pinmap), 1, "f16")
        fixed = board.reserve_bytes + man.kv_bytes(1) + sum(t.float_bytes for t in man.floats)
        want = _brute(md, board.total_bytes - fixed, board.iova_usable_bytes, goal)
        try:
            tm = solve(man, board, prof, ctx=1, pins=pins, goal=Goal(goal), prompt=1)
        except OrkError:
            assert want is None, (trial, want)
            raised += 1
            continue
        assert want is not None, trial
        check_budgets(tm, man, board)
        p = tm.prediction
        q = next(x["value"] for x in tm.objective["stages"] if x["metric"] == "quality")
        got = (p["decode_s_per_token"], p["prefill_s_per_chunk"], q)
        assert any(got[0] == pytest.approx(w[0], rel=1e-6, abs=1e-9) and got[1] == pytest.approx(w[1], rel=1e-6, abs=1e-9)
                   and got[2] == pytest.approx(w[2], rel=1e-6, abs=1e-6) for w in want), (trial, got, want[:3])
        for i, k in pins_by_item.items():
            d = tm.get(man.items[i].tensor)
            assert {"npu": d.tier == "npu", "cpu": d.tier == "host", "keep": d.encoding == "bf16" and d.tier == "host",
                    "int8": d.encoding == "int8" and d.host_copy is None,
                    "nf4": d.encoding == "nf4" or d.host_copy == "nf4"}[k], (trial, k, d)
        assert tm.objective["status"] == "optimal"
        checked += 1
    assert checked > 20 and raised > 0


def test_ties_are_broken_by_name_and_output_is_deterministic():
    shapes = [("blk.0.ffn_gate_exps.weight", (4, 512, 2048))]
    man = small_manifest(shapes)
    prof = load_profile(None, man, BOARD, 512)
    per = cost.npu_bytes(512, 2048, BOARD)
    board = replace(BOARD, iova_usable_bytes=2 * per)
    tm = solve(man, board, prof, ctx=1)
    assert [tm.decision("blk.0.ffn_gate_exps.weight", e)[1] for e in range(4)] == ["npu", "npu", "host", "host"]
    assert tm.decision("blk.0.ffn_gate.1.weight")[1] == "npu"  # expert-slice name
    assert dumps(tm) == dumps(solve(man, board, prof, ctx=1))


def test_dual_residency_keeps_decode_and_gains_prefill():
    """A host NF4 copy beside the NPU tiles: the CPU decodes from NF4 (no decode loss), the NPU prefills."""
    man = manifest_from_config(json.loads(open("tiermaps/configs/qwen2.5-7b/config.json").read()))
    prof = load_profile(None, man, BOARD, 512)
    tm = solve(man, BOARD, prof, ctx=8192)
    p = tm.prediction
    nf4 = p["baselines"]["cpu_nf4"]
    assert p["decode_tok_s"] >= 0.95 * nf4["decode_tok_s"] * (1 - 1e-4)  # the default rule, issue 10
    assert p["prefill_tok_s"] > 1.5 * nf4["prefill_tok_s"]
    assert p["decode_tok_s"] > 1.5 * p["baselines"]["cpu_int8"]["decode_tok_s"]
    dual = [d for d in tm.decisions if d.host_copy == "nf4"]
    assert dual and all(d.tier == "npu" and d.host_copy_bytes == cost.host_nf4_bytes(*d.shape, BOARD.nf4_format) for d in dual)
    # decode-first gives exactly the all-NF4 decode; quality-first trades it away
    from orkpack.tiers.solver import Goal

    assert solve(man, BOARD, prof, ctx=8192, goal=Goal("decode")).prediction["decode_tok_s"] == \
        pytest.approx(nf4["decode_tok_s"], rel=1e-6)
    q = solve(man, BOARD, prof, ctx=8192, goal=Goal("quality")).prediction
    assert q["decode_tok_s"] < p["decode_tok_s"]


def test_constraints_hold_or_one_line_says_what_is_reachable():
    from orkpack.tiers.solver import Goal

    man = manifest_from_config(json.loads(open("tiermaps/configs/qwen2.5-7b/config.json").read()))
    prof = load_profile(None, man, BOARD, 512)
    tm = solve(man, BOARD, prof, ctx=8192, goal=Goal("quality", min_decode_tok_s=4.5))
    assert tm.prediction["decode_tok_s"] >= 4.5
    tm = solve(man, BOARD, prof, ctx=8192, goal=Goal("decode", min_prefill_tok_s=25))
    assert tm.prediction["prefill_tok_s"] >= 25
    tm = solve(man, BOARD, prof, ctx=8192, goal=Goal("quality", max_ram=12 << 30))
    assert tm.budget["ram"]["used"] <= 12 << 30
    with pytest.raises(OrkError, match="decode can reach at most"):
        solve(man, BOARD, prof, ctx=8192, goal=Goal(min_decode_tok_s=500))
    with pytest.raises(OrkError, match="--goal"):
        Goal("fastest")


# ------------------------------------------------------------------------------------------ large instances

def _moe():
    man = manifest_from_config(MOE_CFG)
    return man


def test_moe_18k_items_optimal_and_grouping_is_exact():
    from orkpack.tiers import milp
    from orkpack.tiers.solver import _model, _rows

    man = _moe()
    # a skewed per-expert routing profile (tiermaps/profiles): experts differ, groups stay per routing value
    prof = load_profile("tiermaps/profiles/qwen3-30b-a3b.routing-example.json", man, BOARD, 512)
    tm = solve(man, BOARD, prof, ctx=8192)
    check_budgets(tm, man, BOARD, ctx=8192)
    assert tm.objective["status"] == "optimal" and tm.objective["items"] > 18000
    assert tm.objective["groups"] > 100
    rng = np.random.default_rng(5)
    for i, it in enumerate(man.items):  # every expert distinct, for the grouping check below
        if it.role == "expert":
            prof.t_npu[i] *= float(rng.uniform(0.2, 3.0))
    # grouping identical items is exact: the same problem with every item its own group gives the same optimum
    sub = list(range(0, len(man.items), max(1, len(man.items) // 300)))
    md = _model(man, BOARD, prof, _rows(man, BOARD, {}), 8192, "f16")
    pick = lambda lst: [lst[i] for i in sub]  # noqa: E731
    cost_ = {"ram": pick(md.ram), "npu": pick(md.npu), "dec": pick(md.dec), "pre": pick(md.pre), "q": pick(md.qual)}
    caps = {"npu": sum(max(x) for x in cost_["npu"]) / 3, "ram": sum(min(x) for x in cost_["ram"]) * 1.2}
    order = [("dec", "min"), ("pre", "min"), ("q", "max")]
    grouped = milp.Problem(("ram", "npu", "dec", "pre", "q"), pick(md.allowed), dict(cost_), [man.items[i].name for i in sub])
    _, st_g = milp.lexicographic(grouped, order, caps)
    single = milp.Problem(("ram", "npu", "dec", "pre", "q"), pick(md.allowed), dict(cost_), [man.items[i].name for i in sub])
    single.groups = [[j] for j in range(len(sub))]
    single.cols = [(g, c) for g in range(len(sub)) for c in range(len(single.choices[g]))]
    _, st_s = milp.lexicographic(single, order, caps)
    assert len(grouped.groups) < len(single.groups)
    for a, b in zip(st_g, st_s):
        assert a.status == b.status == "optimal" and a.value == pytest.approx(b.value, rel=1e-7, abs=1e-12)


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
