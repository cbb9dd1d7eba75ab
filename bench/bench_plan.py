"""Tier-map solver figures: the whole `orkpack plan` process of the 18,674-item MoE
(interpreter start and imports included: what a user waits for), solve times on the
shipped real architectures, the predicted decode / prefill / TTFT of the default plan
against the all-NF4 and all-int8 CPU baselines, and the NPU benefit of the plan's NPU
set against a greedy fill in model order (what llama.cpp -ngl / accelerate do) and
against top-k by hotness alone (both filling the NPU with no regard to RAM or decode).

    python bench/bench_plan.py [--reps 5] [--json]
    python bench/bench_plan.py --against /work/main [--reps 7] [--json]   # issue 26: this tree vs another

--against TREE: the whole `orkpack plan --json` process of the MoE (analytic and skewed) of this tree and of
TREE (e.g. main's checkout), interleaved round by round (the order rotating), medians of wall and CPU time, their
ratio, and the share of each process that is imports (a separate `-X importtime` run of each, the top-level
imports' cumulative time over that run's wall time); nothing else. Children run with their bytecode cached
under a temporary PYTHONPYCACHEPREFIX when PYTHONDONTWRITEBYTECODE is set (as an installed package has it).
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


PROCESS_TARGET_S = 0.5  # issue 26 (issue 14 asked 1 s): the whole process under 0.5 s, analytic and skewed alike


def _env(tree: Path | None = None) -> dict:
    """The children's environment: ``tree`` first on PYTHONPATH (and as their working folder: ``python -m`` puts
    it first on sys.path); bytecode cached as after an install, outside the trees when writing it is off."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if env.pop("PYTHONDONTWRITEBYTECODE", None) and not env.get("PYTHONPYCACHEPREFIX"):
        import tempfile

        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "orkpack-bench-pyc")
    return env


def _child(argv: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, float]:
    """(wall seconds, user+sys CPU seconds) of one child process, its output discarded."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
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
    env = _env()
    for _, argv in cases:
        _child(argv, env)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in cases}
    for _ in range(reps):
        for name, argv in cases:
            got[name].append(_child(argv, env))
    rows = []
    for name, _ in cases:
        walls, cpus = [w for w, _ in got[name]], [c for _, c in got[name]]
        rows.append({"case": name, "wall_median_s": round(statistics.median(walls), 3), "wall_min_s": round(min(walls), 3),
                     "wall_max_s": round(max(walls), 3), "cpu_median_s": round(statistics.median(cpus), 3),
                     "target_s": None if "pass" in name else PROCESS_TARGET_S,
                     "met": None if "pass" in name else statistics.median(walls) < PROCESS_TARGET_S})
    return rows


def _import_share(argv: list[str], env: dict, cwd: Path) -> float:
    """The share of one `-X importtime` run of ``argv`` that is imports: the top-level imports' cumulative
    microseconds over the run's wall time."""
    t0 = time.perf_counter()
    r = subprocess.run(argv[:1] + ["-X", "importtime"] + argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    us = 0
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            _, cum, name = line.split("|")
            if not name.startswith("  ") and cum.strip().isdigit():  # a top-level import (not nested in another)
                us += int(cum)
    return us * 1e-6 / wall


def against(reps: int, other: Path) -> list[dict]:
    """This tree and ``other`` interleaved: every round runs each (tree, profile) once, the order rotating."""
    here = Path(__file__).resolve().parents[1]
    cfg = str(ROOT / "configs" / "qwen3-30b-a3b" / "config.json")
    profiles = {"analytic": [], "skewed": ["--profile", str(ROOT / CASES[3][1])]}
    trees = {"this tree": here, str(other): other.resolve()}
    cases = [(t, p) for t in trees for p in profiles]
    argv = {(t, p): [sys.executable, "-m", "orkpack", "plan", cfg, "--json", *profiles[p]] for t, p in cases}
    envs = {t: _env(trees[t]) for t in trees}
    for c in cases:  # warm-up (bytecode, page cache)
        _child(argv[c], envs[c[0]], trees[c[0]])
    got: dict[tuple, list[tuple[float, float]]] = {c: [] for c in cases}
    shares: dict[tuple, list[float]] = {c: [] for c in cases}
    for r in range(reps):
        for c in cases[r % len(cases):] + cases[: r % len(cases)]:
            got[c].append(_child(argv[c], envs[c[0]], trees[c[0]]))
        if r < 3:
            for c in cases:
                shares[c].append(_import_share(argv[c], envs[c[0]], trees[c[0]]))
    rows = []
    for t, p in cases:
        walls, cpus = [w for w, _ in got[(t, p)]], [u for _, u in got[(t, p)]]
        rows.append({"tree": t, "profile": p, "wall_median_s": round(statistics.median(walls), 3),
                     "wall_min_s": round(min(walls), 3), "wall_max_s": round(max(walls), 3),
                     "cpu_median_s": round(statistics.median(cpus), 3),
                     "import_share": round(statistics.median(shares[(t, p)]), 3)})
    for r in rows:
        base = next(x for x in rows if x["tree"] != "this tree" and x["profile"] == r["profile"])
        r["wall_vs_other"] = round(r["wall_median_s"] / base["wall_median_s"], 3)
        r["cpu_vs_other"] = round(r["cpu_median_s"] / base["cpu_median_s"], 3)
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
    ap.add_argument("--against", type=Path, metavar="TREE", help="compare with the orkpack tree at TREE (e.g. main)")
    a = ap.parse_args()
    load_before = os.getloadavg()
    if a.against is not None:
        rows = against(a.reps, a.against)
        load_after = os.getloadavg()
        if a.json:
            print(json.dumps({"load_before": load_before, "load_after": load_after, "against": rows}, indent=1))
            return
        t = Table(title=f"whole process `orkpack plan qwen3-30b-a3b --json`, {a.reps} interleaved rounds (load average "
                        f"before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} cores)")
        for c in ("tree", "profile", "wall median", "min-max", "CPU median", "wall / other", "CPU / other",
                  "imports share"):
            t.add_column(c)
        for r in rows:
            t.add_row(r["tree"], r["profile"], f"{r['wall_median_s']:.3f} s", f"{r['wall_min_s']:.3f}-{r['wall_max_s']:.3f} s",
                      f"{r['cpu_median_s']:.3f} s", f"{r['wall_vs_other']:.3f}", f"{r['cpu_vs_other']:.3f}",
                      f"{100 * r['import_share']:.0f} %")
        Console(width=220).print(t)
        return
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
                  f"{r['cpu_median_s']:.3f} s", "" if r["target_s"] is None else f"< {r['target_s']:g} s",
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
