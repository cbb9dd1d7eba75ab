"""Tier-map solver figures: solve times on the shipped real architectures, the
predicted decode / prefill / TTFT of the default plan against the all-NF4 and
all-int8 CPU baselines, and the NPU benefit of the plan's NPU set against a
greedy fill in model order (what llama.cpp -ngl / accelerate do) and against
top-k by hotness alone (both filling the NPU with no regard to RAM or decode).

    python bench/bench_plan.py [--reps 5] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from orkpack.tiers.board import load_board
from orkpack.tiers.manifest import manifest_from_path
from orkpack.tiers.profile import load_profile
from orkpack.tiers.solver import greedy_benefit, solve

ROOT = Path(__file__).resolve().parents[1] / "tiermaps"
CASES = [
    ("qwen2.5-7b", None),
    ("qwen2.5-32b", None),
    ("qwen3-30b-a3b", None),
    ("qwen3-30b-a3b", "profiles/qwen3-30b-a3b.routing-example.json"),
]


def run(reps: int) -> list[dict]:
    board = load_board("rk3588-32g")
    rows = []
    for model, prof in CASES:
        t0 = time.perf_counter()
        man = manifest_from_path(ROOT / "configs" / model / "config.json")
        p = load_profile(None if prof is None else ROOT / prof, man, board, 512)
        prep = time.perf_counter() - t0
        times = []
        for _ in range(reps):
            s = time.perf_counter()
            tm = solve(man, board, p, ctx=8192)
            times.append(time.perf_counter() - s)
        ours = sum(p.benefit[i] for i, it in enumerate(man.items) if tm.get(it.tensor, it.expert).tier == "npu") * 1e3
        g_model = greedy_benefit(man, board, p, "model") * 1e3
        g_hot = greedy_benefit(man, board, p, "hotness") * 1e3
        bu = tm.budget
        rows.append({
            "model": model, "profile": "routing-example" if prof else "analytic", "items": len(man.items),
            "prepare_ms": round(prep * 1e3, 1), "solve_median_ms": round(statistics.median(times) * 1e3, 1),
            "solve_max_ms": round(max(times) * 1e3, 1), "status": tm.objective["status"], "groups": tm.objective["groups"],
            "benefit_ms": round(ours, 2), "greedy_model_order_ms": round(g_model, 2), "topk_hotness_ms": round(g_hot, 2),
            "npu_used_gib": round(bu["npu"]["used"] / 2**30, 3), "npu_cap_gib": round(bu["npu"]["cap"] / 2**30, 3),
            "ram_used_gib": round(bu["ram"]["used"] / 2**30, 2), "ram_cap_gib": round(bu["ram"]["cap"] / 2**30, 2),
            "decode_tok_s": tm.prediction["decode_tok_s"], "prefill_tok_s": tm.prediction["prefill_tok_s"],
            "ttft_s": tm.prediction["ttft_s"],
            "nf4_decode_tok_s": tm.prediction["baselines"]["cpu_nf4"]["decode_tok_s"],
            "nf4_prefill_tok_s": tm.prediction["baselines"]["cpu_nf4"]["prefill_tok_s"],
            "int8_decode_tok_s": tm.prediction["baselines"]["cpu_int8"]["decode_tok_s"],
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = run(a.reps)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    t = Table(title="tier-map solver, rk3588-32g, ctx 8192, prefill M 512")
    for c in ("model", "profile", "items", "solve median", "status", "NPU benefit", "greedy model order", "top-k hotness",
              "NPU used/cap", "RAM used/cap", "decode tok/s (NF4 / int8 CPU)", "prefill tok/s (NF4 CPU)", "TTFT 512"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["model"], r["profile"], str(r["items"]), f"{r['solve_median_ms']} ms (max {r['solve_max_ms']})", r["status"],
                  f"{r['benefit_ms']} ms", f"{r['greedy_model_order_ms']} ms ({100 * r['greedy_model_order_ms'] / r['benefit_ms']:.1f}%)",
                  f"{r['topk_hotness_ms']} ms ({100 * r['topk_hotness_ms'] / r['benefit_ms']:.2f}%)",
                  f"{r['npu_used_gib']}/{r['npu_cap_gib']} GiB", f"{r['ram_used_gib']}/{r['ram_cap_gib']} GiB",
                  f"{r['decode_tok_s']} ({r['nf4_decode_tok_s']} / {r['int8_decode_tok_s']})",
                  f"{r['prefill_tok_s']} ({r['nf4_prefill_tok_s']})", f"{r['ttft_s']} s")
    Console(width=220).print(t)


if __name__ == "__main__":
    main()
