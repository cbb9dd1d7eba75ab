"""Tier-map solver figures: the whole `orkpack plan` process of the 18,674-item MoE
(interpreter start and imports included: what a user waits for), solve times on the
shipped real architectures, the predicted decode / prefill / TTFT of the default plan
against the all-NF4 and all-int8 CPU baselines, and the NPU benefit of the plan's NPU
set against a greedy fill in model order (what llama.cpp -ngl / accelerate do) and
against top-k by hotness alone (both filling the NPU with no regard to RAM or decode).

    python bench/bench_plan.py [--reps 5] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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


PROCESS_TARGET_S = 1.0  # issue 14: the whole process under 1 s, analytic and skewed profiles alike


def _child(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, user+sys CPU seconds) of one child process, its output discarded."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {err[-500:]}")
    return wall, ru.ru_utime + ru.ru_stime


def process(reps: int) -> list[dict]:
    """Whole-process `orkpack plan --json` of Qwen3-30B-A3B, analytic and skewed routing profile, interleaved
    with a bare interpreter start (`python -c pass`) as the anchor; medians over ``reps`` rounds after a warm-up."""
    cfg = str(ROOT / "configs" / "qwen3-30b-a3b" / "config.json")
    cases = [
        ("python -c pass (interpreter start)", [sys.executable, "-c", "pass"]),
        ("orkpack plan qwen3-30b-a3b --json (analytic)", [sys.executable, "-m", "orkpack", "plan", cfg, "--json"]),
        ("orkpack plan qwen3-30b-a3b --json --profile routing-example (skewed)",
         [sys.executable, "-m", "orkpack", "plan", cfg, "--json", "--profile", str(ROOT / CASES[3][1])]),
    ]
    for _, argv in cases:
        _child(argv)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in cases}
    for _ in range(reps):
        for name, argv in cases:
            got[name].append(_child(argv))
    rows = []
    for name, _ in cases:
        walls, cpus = [w for w, _ in got[name]], [c for _, c in got[name]]
        rows.append({"case": name, "wall_median_s": round(statistics.median(walls), 3), "wall_min_s": round(min(walls), 3),
                     "wall_max_s": round(max(walls), 3), "cpu_median_s": round(statistics.median(cpus), 3),
                     "target_s": None if "pass" in name else PROCESS_TARGET_S,
                     "met": None if "pass" in name else statistics.median(walls) < PROCESS_TARGET_S})
    return rows


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
    load_before = os.getloadavg()
    proc_rows = process(a.reps)
    rows = run(a.reps)
    load_after = os.getloadavg()
    if a.json:
        print(json.dumps({"load_before": load_before, "load_after": load_after, "process": proc_rows, "solve": rows},
                         indent=1))
        return
    t = Table(title=f"whole process, {a.reps} interleaved rounds (load average before {load_before[0]:.2f}, "
                    f"after {load_after[0]:.2f}; {os.cpu_count()} cores)")
    for c in ("command", "wall median", "min-max", "CPU (user+sys) median", "target", "met"):
        t.add_column(c)
    for r in proc_rows:
        t.add_row(r["case"], f"{r['wall_median_s']:.3f} s", f"{r['wall_min_s']:.3f}-{r['wall_max_s']:.3f} s",
                  f"{r['cpu_median_s']:.3f} s", "" if r["target_s"] is None else f"< {r['target_s']:.0f} s",
                  "" if r["met"] is None else ("yes" if r["met"] else "NO"))
    Console(width=220).print(t)
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
