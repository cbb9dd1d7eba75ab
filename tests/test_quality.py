"""Issue 15, "Quality, measured": the planner's quality weights are KLDs, and the head weighs as the head.

docs/TIERMAP.md section 3 ("Default sensitivity") and section 4 (the balanced goal's prefill slack).
"""
from __future__ import annotations

import json

import pytest

from orkpack.tiers.board import load_board
from orkpack.tiers.manifest import manifest_from_config
from orkpack.tiers.profile import BODY_KLD, HEAD_KLD, SIZE_EXP, SIZE_REF, active_params, load_profile, size_factor
from orkpack.tiers.solver import solve

BOARD = load_board("rk3588-32g")
FIX = "tests/fixtures/configs"

# SmolLM2-135M-Instruct's architecture (the real model of docs/EVAL.md): tied embedding / head
SMOLLM2 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
           "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": True,
           "rope_theta": 100000.0, "torch_dtype": "bfloat16", "max_position_embeddings": 8192}


def _cfg(name: str, **over) -> dict:
    with open(f"{FIX}/{name}.json") as f:
        cfg = json.load(f)
    cfg.update(over)
    return cfg


def _sens(man):
    prof = load_profile(None, man, BOARD, 512)
    return prof, {it.key: s for it, s in zip(man.items, prof.sensitivity)}


def test_tied_embedding_is_the_head_and_weighs_as_the_head():
    man = manifest_from_config(SMOLLM2)
    assert not any(it.role == "output" for it in man.items)
    prof, s = _sens(man)
    assert active_params(man) == SIZE_REF and size_factor(man) == 1.0  # the model the constants were measured on
    assert s[("token_embd.weight", None)] == pytest.approx(HEAD_KLD)
    body = [v for k, v in s.items() if k[0] != "token_embd.weight"]
    assert sum(body) == pytest.approx(BODY_KLD)
    # the head (28 M elements) outweighs 32 FFN matrices of the same total element count
    ffn = s[("blk.0.ffn_up.weight", None)]
    assert 32 * 1536 * 576 == 49152 * 576 and s[("token_embd.weight", None)] > 32 * ffn
    # the body shares by element count times the kind's factor (GQA ratio 9 / 3 = 3 for K, 5 x 3 for V, 2 for down)
    q = s[("blk.3.attn_q.weight", None)]
    assert s[("blk.3.ffn_up.weight", None)] / q == pytest.approx(1536 / 576)
    assert s[("blk.3.ffn_down.weight", None)] / q == pytest.approx(2 * 1536 / 576)
    assert s[("blk.3.attn_k.weight", None)] / q == pytest.approx(3 * 192 / 576)
    assert s[("blk.3.attn_v.weight", None)] / q == pytest.approx(15 * 192 / 576)


def test_untied_head_is_output_weight_and_the_embedding_is_body():
    man = manifest_from_config(_cfg("qwen3_moe"))
    prof, s = _sens(man)
    size = size_factor(man)
    assert s[("output.weight", None)] == pytest.approx(size * HEAD_KLD)
    emb = next(i for i in man.items if i.role == "embedding")
    q = next(i for i in man.items if i.tensor == "blk.0.attn_q.weight")
    assert s[emb.key] / s[q.key] == pytest.approx(emb.k * emb.k / q.numel)  # a lookup: as a K x K matrix
    down = next(i for i in man.items if i.tensor.endswith("ffn_down_exps.weight"))
    up = next(i for i in man.items if i.tensor == down.tensor.replace("down", "up") and i.expert == down.expert)
    assert s[down.key] / s[up.key] == pytest.approx(2.0)
    assert sum(v for k, v in s.items() if k[0] != "output.weight") == pytest.approx(size * BODY_KLD)
    # an expert weighs by the tokens it sees (uniform routing: top_k / n_experts of a dense matrix's share)
    it = next(i for i in man.items if i.role == "expert" and "ffn_up" in i.tensor)
    dense = next(i for i in man.items if i.tensor == "blk.0.attn_q.weight")
    r = it.n_experts_used / it.n_experts
    assert s[it.key] / s[dense.key] == pytest.approx(r * it.numel / dense.numel)


def test_a_larger_model_loses_less_by_the_size_law():
    """docs/TIERMAP.md section 3: both constants scale by (N / SIZE_REF) ** -SIZE_EXP, N the parameters a token
    reads (an expert's elements times used / total experts), so an MoE scales by its active parameters."""
    moe = manifest_from_config(_cfg("qwen3_moe"))
    n = sum(it.numel * (it.n_experts_used / it.n_experts if it.role == "expert" else 1) for it in moe.items)
    assert active_params(moe) == pytest.approx(n) and n < 0.2 * sum(it.numel for it in moe.items)
    assert size_factor(moe) == pytest.approx((n / SIZE_REF) ** -SIZE_EXP)
    big, small = manifest_from_config(_cfg("llama31_70b")), manifest_from_config(SMOLLM2)
    t_big, t_small = (sum(load_profile(None, m, BOARD, 512).sensitivity) for m in (big, small))
    assert t_small == pytest.approx(HEAD_KLD + BODY_KLD)
    # 70B reads 525x the parameters: it loses (1 / 525) ** 0.21 = 0.27 of what SmolLM2 loses
    assert t_big / t_small == pytest.approx((active_params(big) / SIZE_REF) ** -SIZE_EXP)
    assert 0.2 < t_big / t_small < 0.35


def test_routing_profile_moves_expert_sensitivity(tmp_path):
    man = manifest_from_config(_cfg("olmoe"))
    it = next(i for i in man.items if i.role == "expert")
    E = it.n_experts
    routing = [0.0] * E
    routing[0] = float(it.n_experts_used)  # every token to expert 0 (top_k of it)
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"schema": "orkpack.hotness", "version": 1, "tensors": {it.tensor: {"routing": routing}}}))
    prof = load_profile(p, man, BOARD, 512)
    s = {i.key: v for i, v in zip(man.items, prof.sensitivity)}
    assert s[(it.tensor, 1)] == 0.0 and s[(it.tensor, 0)] > 0.0


def test_default_plan_of_a_tied_smollm2_keeps_the_head_int8_within_the_slacks():
    """Issue 15: the tied head in NF4 was 82-84 % of the default pack's KLD; the planner put it there
    because it weighed as its element count (a tie with 32 FFN matrices) and cost prefill time."""
    man = manifest_from_config(SMOLLM2)
    prof = load_profile(None, man, BOARD, 512)
    tm = solve(man, BOARD, prof, ctx=8192)
    enc, tier, _ = tm.decision("token_embd.weight")
    assert (enc, tier) == ("int8", "host")
    p = tm.prediction
    assert p["decode_tok_s"] >= 0.95 * p["baselines"]["cpu_nf4"]["decode_tok_s"] * (1 - 1e-6)
    st = {s["metric"]: s for s in tm.objective["stages"]}
    assert [s["metric"] for s in tm.objective["stages"]] == ["decode", "prefill", "quality"]
    assert p["prefill_s_per_chunk"] <= st["prefill"]["value"] / 0.99 * (1 + 1e-9)
    assert st["quality"]["value"] >= HEAD_KLD
    assert tm.objective["prefill_slack"] == 0.01


def _pred_kld(tm, man, prof) -> float:
    """The additive model from the decisions alone: the sensitivity of every item decode reads as NF4."""
    sens = {it.key: s for it, s in zip(man.items, prof.sensitivity)}
    return sum(sens[(d.tensor, d.expert)] for d in tm.decisions if (d.tensor, d.expert) in sens
               and (d.encoding == "nf4" or d.host_copy == "nf4"))


def test_plan_predicts_kld_and_max_kld_is_a_hard_constraint():
    man = manifest_from_config(SMOLLM2)
    prof = load_profile(None, man, BOARD, 512)
    from orkpack.errors import OrkError
    from orkpack.tiers.solver import Goal

    tm = solve(man, BOARD, prof, ctx=8192)
    p = tm.prediction
    assert p["kld"] == pytest.approx(_pred_kld(tm, man, prof), abs=1e-6) and p["kld"] > 0
    assert p["baselines"]["cpu_nf4"]["kld"] == pytest.approx(HEAD_KLD + BODY_KLD, abs=1e-6)
    assert p["baselines"]["cpu_int8"]["kld"] == 0
    cap = p["kld"] / 3
    tight = solve(man, BOARD, prof, ctx=8192, goal=Goal(max_kld=cap))
    assert tight.prediction["kld"] <= cap + 1e-9
    assert tight.prediction["kld"] == pytest.approx(_pred_kld(tight, man, prof), abs=1e-6)
    assert tight.objective["goal"]["max_kld"] == cap
    # what it costs: some speed (the default plan was optimal without the cap)
    assert (tight.prediction["decode_tok_s"] < p["decode_tok_s"] or tight.prediction["prefill_tok_s"] < p["prefill_tok_s"])
    with pytest.raises(OrkError, match="--max-kld 0"):  # all-NF4 speed and no NF4 at all: unreachable
        solve(man, BOARD, prof, ctx=8192, goal=Goal(max_kld=0.0, min_decode_tok_s=p["baselines"]["cpu_nf4"]["decode_tok_s"]))
    with pytest.raises(OrkError, match="--max-kld"):
        Goal(max_kld=-1.0)


def test_cli_max_kld_plan_build_and_frontier(tmp_path):
    from typer.testing import CliRunner

    from orkpack.cli import app

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(SMOLLM2))
    run = CliRunner()
    r = run.invoke(app, ["plan", str(cfg), "--max-kld", "0.05", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["prediction"]["kld"] <= 0.05
    r = run.invoke(app, ["plan", str(cfg)])
    assert r.exit_code == 0 and "KLD (predicted)" in r.stdout
    r = run.invoke(app, ["plan", str(cfg), "--frontier", "--json"])
    pts = json.loads(r.stdout)["frontier"]
    keys = [(p["prediction"]["decode_tok_s"], p["prediction"]["prefill_tok_s"], -p["prediction"]["kld"]) for p in pts]
    for a in keys:  # no point dominates another in (decode, prefill, predicted KLD)
        assert not any(all(y >= x for x, y in zip(a, b)) and a != b for b in keys)
    tm = tmp_path / "tm.json"
    assert run.invoke(app, ["plan", str(cfg), "-o", str(tm)]).exit_code == 0
    r = run.invoke(app, ["build", str(cfg), "-o", str(tmp_path / "x.orkpack"), "--tiermap", str(tm), "--max-kld", "0.1"])
    assert r.exit_code != 0 and "--max-kld" in r.output


def test_build_follows_max_kld(tmp_path):
    from orkpack import synth
    from orkpack.build import BuildOptions, build
    from orkpack.pack.reader import Pack

    folder = synth.write_hf_model(tmp_path / "hf", layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2,
                                  vocab=512, seed=5)
    out = tmp_path / "p.orkpack"
    build(folder, out, BuildOptions(threads=1, max_kld=0.0))
    with Pack.open(out) as pk:
        tm = pk.header["tiermap"]
        assert tm["objective"]["goal"]["max_kld"] == 0.0 and tm["prediction"]["kld"] == 0
        encs = {(t["name"], s["encoding"], s.get("host_copy")) for t, s in pk.slices() if len(s["shape"]) == 2}
    assert encs and all(e != "nf4" and c is None for _, e, c in encs)
