"""Regression tests for the places where the planner disagreed with docs/TIERMAP.md (issue 14).

Each test states the doc's rule and checks the planner's own output against it.
"""
from __future__ import annotations

from dataclasses import replace

import json

import pytest

from orkpack.errors import OrkError
from orkpack.tiers import cost
from orkpack.tiers.board import load_board
from orkpack.tiers.manifest import manifest_from_config
from orkpack.tiers.profile import load_profile
from orkpack.tiers.solver import Goal, _model, _rows, match_pins, solve

BOARD = load_board("rk3588-32g")
FIX = "tests/fixtures/configs"


def _cfg(name: str, **over) -> dict:
    with open(f"{FIX}/{name}.json") as f:
        cfg = json.load(f)
    cfg.update(over)
    return cfg


def llama_3_2_3b() -> dict:
    return _cfg("llama", hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                intermediate_size=8192, head_dim=128)


def granite_3_0_2b() -> dict:
    return _cfg("granite", hidden_size=2048, num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=49155)


# ------------------------------------------------------------------ a. min_m under a hotness profile

def test_min_m_of_npu_slices_is_their_host_paths_under_a_profile():
    """docs/TIERMAP.md section 2: min_m against the host path the item keeps: NF4 for NPU + host copy,
    int8 (from the tiles) for NPU only, with or without a profile."""
    man = manifest_from_config(json.load(open("tiermaps/configs/qwen3-30b-a3b/config.json")))
    prof = load_profile("tiermaps/profiles/qwen3-30b-a3b.routing-example.json", man, BOARD, 512)
    tm = solve(man, BOARD, prof, ctx=8192)
    npu_only = differ = 0
    for d in tm.decisions:
        if d.tier != "npu":
            continue
        n, k = d.shape
        want = cost.min_m(n, k, BOARD, "nf4" if d.host_copy == "nf4" else "tiles")
        assert d.min_m == want, d
        if d.host_copy is None:
            npu_only += 1
            differ += want != cost.min_m(n, k, BOARD, "nf4")
    assert npu_only > 20 and differ > 20  # the plan has NPU-only slices where the two paths differ


# ------------------------------------------------------------------ b. NPU-only items between the two min_m

@pytest.mark.parametrize("cfg,ms", [(lambda: _cfg("gemma3_text"), (2, 3, 8, 16)), (llama_3_2_3b, (2, 3, 4, 6))])
def test_npu_only_item_is_priced_at_the_npu_once_m_reaches_its_min_m(cfg, ms):
    """An NPU-only item with min_m(tiles) <= M runs on the NPU (the router reads min_m(tiles)): its prefill
    cost is t_npu(M), also when M is below the NF4 path's min_m (where the analytic benefit is 0)."""
    man = manifest_from_config(cfg())
    rows = _rows(man, BOARD, {})
    between = 0
    for m in ms:
        prof = load_profile(None, man, BOARD, m)
        md = _model(man, BOARD, prof, rows, 512, "f16")
        for i, it in enumerate(man.items):
            if "npu" not in md.allowed[i] or prof.m_eff[i] < 2:
                continue
            mi = prof.m_eff[i]
            pre = md.pre[i][md.allowed[i].index("npu")]
            if mi >= cost.min_m(it.n, it.k, BOARD, "tiles"):
                assert pre == pytest.approx(cost.t_npu(it.n, it.k, mi, BOARD), rel=1e-12), (m, it.name)
                between += mi < cost.min_m(it.n, it.k, BOARD, "nf4")
            else:
                assert pre == pytest.approx(cost.t_cpu(it.n, it.k, mi, BOARD, "tiles"), rel=1e-12), (m, it.name)
    assert between > 0


def test_gemma_quality_plan_at_m16_keeps_attention_projections_on_the_npu():
    # a runtime path with a cheap submit (rkllm's NPU constants, 152 us; ggml-ork's 365 us loses at M = 16),
    # decoding on the CPU as ggml-ork does
    rk = load_board("rk3588-32g", "rkllm")
    board = replace(BOARD, submit_overhead_s=rk.submit_overhead_s, npu_efficiency=rk.npu_efficiency)
    man = manifest_from_config(_cfg("gemma3_text"))
    prof = load_profile(None, man, board, 16)
    tm = solve(man, board, prof, ctx=8192, goal=Goal("quality"))
    q_o = [d for d in tm.decisions if d.tensor.endswith((".attn_q.weight", ".attn_output.weight"))]
    assert len(q_o) == 52
    for d in q_o:  # int8 either way (same quality, same decode bytes): the NPU wins prefill at M = 16
        assert d.tier == "npu" and d.host_copy is None and d.min_m <= 16, d
    # and the prediction charges what runs: the same plan with them host int8 is slower
    assert tm.prediction["prefill_s_per_chunk"] < 0.08


# ------------------------------------------------------------------ c. float-kept items at their source bytes

def test_float_kept_item_is_priced_at_its_source_bytes_in_prefill():
    man = manifest_from_config(_cfg("olmoe", torch_dtype="float32"))
    pinmap, _ = match_pins(man, {"keep": ["output.weight"]})
    prof = load_profile(None, man, BOARD, 512)
    md = _model(man, BOARD, prof, _rows(man, BOARD, pinmap), 512, "f16")
    i = next(j for j, it in enumerate(man.items) if it.tensor == "output.weight")
    it = man.items[i]
    assert md.allowed[i] == ("float",) and it.float_bytes == 4 * it.n * it.k
    want = max(2.0 * 1 * it.n * it.k / BOARD.cpu_float_ops_per_s, 4 * it.n * it.k / BOARD.decode_bandwidth)
    assert md.pre[i][0] == pytest.approx(want, rel=1e-12)


# ------------------------------------------------------------------ d. the smaller ones

def test_quality_stage_counts_int8_where_the_cpu_decodes_only():
    """Float-kept routers are not int8: the quality stage value is the sum of the sensitivities of the host
    int8 and NPU-only (int8 tiles) slices, nothing else."""
    man = manifest_from_config(_cfg("olmoe"))
    prof = load_profile(None, man, BOARD, 512)
    for goal in ("quality", "balanced"):
        tm = solve(man, BOARD, prof, ctx=4096, goal=Goal(goal))
        q = next(s["value"] for s in tm.objective["stages"] if s["metric"] == "quality")
        sens = {it.key: s for it, s in zip(man.items, prof.sensitivity)}
        want = sum(sens[(d.tensor, d.expert)] for d in tm.decisions
                   if d.encoding == "int8" and (d.tier == "host" or d.host_copy is None))
        assert q == pytest.approx(want, rel=1e-6, abs=1e-9), goal
        routers = [d for d in tm.decisions if ".ffn_gate_inp." in d.tensor]
        assert routers and all(d.encoding not in ("int8", "nf4") and d.tier == "host" for d in routers)


def test_tied_head_is_priced_at_the_embeddings_encoding():
    """A tied head multiplies the last row by the embedding as stored: its prefill time follows the
    embedding's encoding (int8 is slower than NF4 on this CPU at M = 1: more bytes)."""
    man = manifest_from_config(granite_3_0_2b())
    prof = load_profile(None, man, BOARD, 512)
    md = _model(man, BOARD, prof, _rows(man, BOARD, {}), 512, "f16")
    i = next(j for j, it in enumerate(man.items) if it.role == "embedding")
    it = man.items[i]
    for c in ("nf4", "int8"):
        head = cost.t_cpu(it.n, it.k, 1, BOARD, c)
        assert md.pre[i][md.allowed[i].index(c)] == pytest.approx(head, rel=1e-12), c
    # the prediction pays for the embedding's encoding: two assignments that differ in it alone
    from orkpack.tiers.solver import evaluate

    base = ["nf4"] * len(man.items)
    with8 = ["int8" if j == i else "nf4" for j in range(len(man.items))]
    got = (evaluate(man, BOARD, prof, with8)["prefill_s_per_chunk"] - evaluate(man, BOARD, prof, base)["prefill_s_per_chunk"])
    diff = cost.t_cpu(it.n, it.k, 1, BOARD, "int8") - cost.t_cpu(it.n, it.k, 1, BOARD, "nf4")
    assert diff > 1e-4 and got == pytest.approx(diff, rel=1e-5)


def test_max_ram_refusal_names_max_ram():
    man = manifest_from_config(granite_3_0_2b())
    prof = load_profile(None, man, BOARD, 512)
    with pytest.raises(OrkError) as e:
        solve(man, BOARD, prof, ctx=8192, goal=Goal(max_ram=3 << 30))
    assert "--max-ram" in str(e.value)


def test_stage_give_back_is_a_millionth_of_the_item_dependent_part():
    """docs/TIERMAP.md section 4: OLMoE-1B-7B --goal decode keeps token_embd NF4 (dq32): int8 would read 4.2e-8
    s/token more, beyond 1e-6 of the decode stage's item-dependent part (2.7e-8), within 1e-6 of the whole value."""
    man = manifest_from_config(_cfg("olmoe"))
    prof = load_profile(None, man, BOARD, 512)
    tm = solve(man, BOARD, prof, ctx=8192, goal=Goal("decode"))
    assert tm.get("token_embd.weight").encoding == "nf4"
    md = _model(man, BOARD, prof, _rows(man, BOARD, {}), 512, "f16")
    i = next(j for j, it in enumerate(man.items) if it.role == "embedding")
    extra = md.dec[i][md.allowed[i].index("int8")] - md.dec[i][md.allowed[i].index("nf4")]
    value = tm.objective["stages"][0]["value"]
    assert tm.objective["stages"][0]["metric"] == "decode"
    assert 1e-6 * (value - md.dec_const) < extra < 1e-6 * value
    assert extra == pytest.approx(4.2e-8, rel=0.02) and 1e-6 * (value - md.dec_const) == pytest.approx(2.7e-8, rel=0.02)


def test_a_profiles_own_prefill_m_is_informative_and_a_difference_is_said(tmp_path):
    man = manifest_from_config(_cfg("olmoe"))
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"schema": "orkpack.hotness", "version": 1, "prefill_m": 64,
                             "tensors": {"blk.0.attn_q.weight": {"benefit_us": 100.0}}}))
    a = load_profile(p, man, BOARD, 512)
    assert a.prefill_m == 512 and any("prefill_m 64" in w and "--prefill-m 512" in w for w in a.warnings)
    assert not load_profile(p, man, BOARD, 64).warnings


# ------------------------------------------------------------------ e. the host copy of an NPU slice stored 4-bit

def _b64(n: int, k: int) -> int:
    """docs/FORMAT.md 3: the nf4 encoding (b64) of an N x K slice."""
    return -(-n * k // 2) + 4 * -(-n * k // 64)


def test_the_copy_of_an_nf4_pinned_npu_slice_is_counted_at_b64():
    """docs/TIERMAP.md section 2, "The NF4 format F": an NPU slice stored 4-bit (an --nf4 pin) is nf4 (b64) and
    its own host copy, whatever the build's F, so the plan counts the copy at b64 (the build writes
    14,155,776 bytes for a 3072 x 8192 ffn_down: at dq32 the plan said 13,381,636): in the slice's
    host_copy_bytes, in budget.ram.host_copy_nf4, and in decode (the bytes the CPU reads)."""
    man = manifest_from_config(llama_3_2_3b())
    board = load_board("rk3588-16g")  # dq32
    assert board.nf4_format == "dq32"
    prof = load_profile(None, man, board, 512)
    tm = solve(man, board, prof, ctx=8192, pins={"nf4": ["blk.*.ffn_*"]})
    stored4 = [d for d in tm.decisions if d.tier == "npu" and d.encoding == "nf4" and d.host_copy]
    assert len(stored4) > 20
    down = next(d for d in stored4 if d.tensor.endswith("ffn_down.weight"))
    assert tuple(down.shape) == (3072, 8192) and down.host_copy_bytes == 14_155_776 == _b64(3072, 8192)
    for d in tm.decisions:
        if d.host_copy:  # the others' copies are in the build's format (dq32)
            want = _b64(*d.shape) if d.encoding == "nf4" else cost.host_nf4_bytes(*d.shape, "dq32")
            assert d.host_copy_bytes == want, d
    assert tm.budget["ram"]["host_copy_nf4"] == sum(d.host_copy_bytes for d in tm.decisions if d.tier == "npu")
    # the same choices with the copies counted at dq32 would decode faster than the plan says it does
    rows = _rows(man, board, match_pins(man, {"nf4": ["blk.*.ffn_*"]})[0])
    md = _model(man, board, prof, rows, 512, "f16")
    i = next(j for j, it in enumerate(man.items) if it.name == down.name)
    c = md.allowed[i].index("npu+nf4")
    assert md.dec[i][c] == pytest.approx(_b64(3072, 8192) / board.decode_bandwidth, rel=1e-12)
    assert md.ram[i][c] == cost.npu_bytes(3072, 8192, board) + _b64(3072, 8192)


@pytest.mark.parametrize("how", ["--nf4 pins", "--nf4 pins, b64", "--npu-storage nf4", "int8 storage",
                                 "--npu-storage nf4, planned by the build"])
def test_a_plans_host_copies_are_the_bytes_the_build_writes(tmp_path, how):
    """What the map counts of every slice (NPU tiles aside: the NPU's int8 image) is what the pack stores: host
    slices' bytes, each host copy's host_copy_bytes, and budget.ram's host_nf4 / host_int8 / host_copy_nf4."""
    from orkpack import synth
    from orkpack.build import BuildOptions, build
    from orkpack.pack.reader import Pack
    from orkpack.tiers.command import plan
    from orkpack.tiers.tiermap import dumps

    model = synth.write_hf_model(tmp_path / "m")
    pins = {"npu": ["blk.*.ffn_*"]} if how == "int8 storage" else {"nf4": ["blk.*.ffn_*", "blk.0.attn_q.weight"]}
    storage = "nf4" if how == "--npu-storage nf4" else "int8"
    fmt = "b64" if how.endswith("b64") else None
    goal = Goal("decode") if how == "int8 storage" else None  # decode-first: the --npu items keep a copy
    tm, _, _ = plan(model, pins=pins, nf4_format=fmt, goal=goal, **({} if storage == "int8" else {"npu_storage": storage}))
    f = tmp_path / "map.json"
    f.write_text(dumps(tm))
    opts = BuildOptions(threads=1, tiermap=f, npu_storage=storage)
    if how == "--nf4 pins":  # the build's own plan (build --nf4 ...: pins, no map)
        opts = BuildOptions(threads=1, **pins)
    if how == "--npu-storage nf4, planned by the build":  # build --npu ... --npu-storage nf4 --goal decode: no map
        opts = BuildOptions(threads=1, npu_storage="nf4", goal="decode", npu=["blk.*.ffn_*"])
    out = build(model, tmp_path / "m.orkpack", opts).path
    stored = {"host_nf4": 0, "host_int8": 0, "host_copy_nf4": 0}
    copies = 0
    with Pack.open(out) as pack:
        m = pack.header["tiermap"]
        by = {(t["name"], s["expert"]): s for t in m["tensors"] for s in t["slices"]}
        for t, s in pack.slices():
            d = by[(t["name"], s["expert"])]
            size = sum(p["size"] for p in s["parts"].values())
            if s["tier"] == "host" and d["encoding"] in ("nf4", "int8"):
                assert size == d["bytes"], (t["name"], s["encoding"])
                stored["host_" + d["encoding"]] += size
            hc = s.get("host_copy")
            if hc is not None:
                copy = sum(p["size"] for p in hc["parts"].values())
                assert copy == d["host_copy_bytes"], (t["name"], s["encoding"], hc["encoding"])
                stored["host_copy_nf4"] += copy
                copies += 1
        for k, v in stored.items():
            assert m["budget"]["ram"][k] == v, k
    assert copies > 0  # the case has dual-resident slices
