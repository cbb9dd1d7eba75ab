"""Grouped multiple-choice integer programs, solved exactly with HiGHS (scipy.optimize.milp).

Every item takes exactly one of its allowed choices; each (item, choice) has a
vector of linear costs (RAM bytes, NPU bytes, decode seconds, prefill seconds,
quality). Items whose allowed choices and cost vectors are identical are
interchangeable, so they form one *group* with one integer variable per choice:
how many of the group's members take it (``n_gc`` in ``[0, size_g]``,
``sum_c n_gc = size_g``). An 18,000-expert MoE with a uniform routing profile
collapses to a few dozen variables; a measured per-expert profile keeps one group
per distinct expert. Members of a group are handed their choices in name order,
last-listed choice first, so equal items are chosen by name.

:func:`lexicographic` minimizes a list of objectives in order: after each stage
the objective is fixed (as a constraint: a later stage may give back at most
1e-6 of an earlier optimum, which keeps the later stages from being needle-in-a-
haystack equality problems) and the next is optimized. A later stage that runs
out of time keeps the previous stage's plan (feasible for it) and records its gap. HiGHS reports each stage's proven
dual bound: a stage is ``optimal`` when its relative gap is within HiGHS's
``mip_rel_gap`` (1e-6 here: HiGHS proved no assignment is better by more than
that fraction), else the gap is recorded.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import LinearConstraint, milp
from scipy.sparse import csr_matrix

from ..errors import OrkError

REL_GAP = 1e-6
STAGE_TOL = 1e-6


@dataclass
class Problem:
    """``cost[k][i][c]``: metric k of item i taking its c-th allowed choice (``choices[i]``)."""

    metrics: tuple[str, ...]
    choices: list[tuple[str, ...]]
    cost: dict[str, list[tuple[float, ...]]]
    names: list[str]
    groups: list[list[int]] = field(default_factory=list)  # filled by group()
    cols: list[tuple[int, int]] = field(default_factory=list)  # (group, choice index) per variable

    def prune(self, better: dict[str, str]) -> None:
        """Drop every choice another choice of the same item dominates: no worse in every metric
        (``better[m]``: "min" or "max"), strictly better in one. Replacing a dominated choice keeps
        every constraint and no objective gets worse, so the optimum is unchanged."""
        keep_all = []
        for i, ch in enumerate(self.choices):
            vec = [tuple(self.cost[m][i][c] * (1 if better[m] == "min" else -1) for m in self.metrics)
                   for c in range(len(ch))]
            keep = [c for c in range(len(ch))
                    if not any(all(a <= b for a, b in zip(vec[d], vec[c])) and vec[d] != vec[c]
                               for d in range(len(ch)) if d != c)]
            keep_all.append(keep)
        for i, keep in enumerate(keep_all):
            if len(keep) < len(self.choices[i]):
                self.choices[i] = tuple(self.choices[i][c] for c in keep)
                for m in self.metrics:
                    self.cost[m][i] = tuple(self.cost[m][i][c] for c in keep)

    def group(self) -> None:
        by: dict[tuple, list[int]] = {}
        for i in range(len(self.names)):
            key = (self.choices[i],) + tuple(self.cost[m][i] for m in self.metrics)
            by.setdefault(key, []).append(i)
        self.groups = [sorted(v, key=lambda i: self.names[i]) for _, v in sorted(by.items(), key=lambda kv: min(kv[1]))]
        self.cols = [(g, c) for g, members in enumerate(self.groups) for c in range(len(self.choices[members[0]]))]

    def vector(self, metric: str) -> np.ndarray:
        return np.array([self.cost[metric][self.groups[g][0]][c] for g, c in self.cols], dtype=np.float64)


@dataclass
class Stage:
    metric: str
    sense: str  # "min" | "max"
    value: float
    bound: float
    status: str  # optimal | gap
    nodes: int


@contextmanager
def _quiet_stdout():
    """HiGHS writes some messages straight to file descriptor 1 (ERGO-Code/HiGHS#2783), which would
    corrupt `orkpack plan --json`: point fd 1 at /dev/null while it runs."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's captured stream): nothing to guard
        yield
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
        finally:
            os.close(devnull)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _solve(p: Problem, c: np.ndarray, caps: dict[str, float], time_limit: float):
    n = len(p.cols)
    # one equality per group (its members are all placed), then one row per capped metric
    r_idx = [g for g, _ in p.cols]
    c_idx = list(range(n))
    vals = [1.0] * n
    sizes = np.array([len(m) for m in p.groups], dtype=np.float64)
    lo, hi = [sizes], [sizes]
    for k, (metric, cap) in enumerate(caps.items()):
        v = p.vector(metric)
        scale = float(np.abs(v).max(initial=0.0)) or 1.0  # rows of O(1): HiGHS's tolerances are absolute
        nz = np.nonzero(v)[0]
        r_idx += [len(p.groups) + k] * len(nz)
        c_idx += nz.tolist()
        vals += (v[nz] / scale).tolist()
        lo.append(np.array([-np.inf]))
        hi.append(np.array([cap / scale]))
    A = csr_matrix((vals, (r_idx, c_idx)), shape=(len(p.groups) + len(caps), n))
    cons = LinearConstraint(A, np.concatenate(lo), np.concatenate(hi))
    ub = np.array([len(p.groups[g]) for g, _ in p.cols], dtype=np.float64)
    scale = max(1e-300, float(np.abs(c).max(initial=0.0)))
    with _quiet_stdout():
        res = milp(c / scale, integrality=np.ones(n), bounds=(np.zeros(n), ub), constraints=cons,
                   options={"mip_rel_gap": REL_GAP, "time_limit": time_limit,
                            # presolve costs 10x the whole solve on these models (18k groups: 19 s vs 2.3 s)
                            "presolve": False})
    return res, scale


def lexicographic(p: Problem, order: list[tuple[str, str]], caps: dict[str, float], *,
                  time_limit: float = 30.0) -> tuple[dict[int, str], list[Stage]]:
    """Optimize ``order`` = [(metric, "min"|"max"), ...] in turn under ``caps`` (metric -> upper bound).

    Returns (item index -> choice, stages). Raises OrkError("infeasible") when no assignment meets the caps.
    """
    if not p.groups:
        p.group()
    if not p.cols:  # nothing to place (every tensor stays float or raw): each stage is 0, and that is optimal
        return {}, [Stage(metric, sense, 0.0, 0.0, "optimal", 0) for metric, sense in order]
    caps = dict(caps)
    stages: list[Stage] = []
    x = None
    for metric, sense in order:
        v = p.vector(metric)
        c = v if sense == "min" else -v
        res, scale = _solve(p, c, caps, time_limit)
        if res.x is None:
            if res.status == 2 or "infeasible" in str(res.message).lower():
                raise OrkError("infeasible")
            if x is None:
                raise OrkError(f"the MILP solver stopped without a solution ({res.message}); "
                               "give it more time or fewer distinct items")
            # out of time in a later stage: the previous stage's plan is feasible here; keep it, with its gap
            val = float(v @ x)
            bound = res.mip_dual_bound * scale if res.mip_dual_bound is not None else (-np.inf if sense == "min" else np.inf)
            bound = bound if sense == "min" else -bound
            stages.append(Stage(metric, sense, val, bound, "gap", int(getattr(res, "mip_node_count", 0) or 0)))
            continue
        x = np.round(res.x).astype(np.int64)
        val = float(v @ x)
        bound = res.mip_dual_bound * scale if res.mip_dual_bound is not None else val
        bound = bound if sense == "min" else -bound
        gap = abs(val - bound)
        optimal = res.status == 0 and gap <= max(REL_GAP * abs(val), 1e-12) * 10
        stages.append(Stage(metric, sense, val, bound, "optimal" if optimal else "gap",
                            int(getattr(res, "mip_node_count", 0) or 0)))
        # fix this stage's optimum for the next ones (a hair of slack for float round-off)
        tol = STAGE_TOL * max(abs(val), 1e-30)
        if sense == "min":
            caps[metric] = min(caps.get(metric, np.inf), val + tol)
        else:
            caps["-" + metric] = -val + tol
            p.cost["-" + metric] = [tuple(-y for y in t) for t in p.cost[metric]]
    out: dict[int, str] = {}
    pos = [0] * len(p.groups)
    # within a group, the last-listed choices (the NPU ones, by the callers' convention) go to the first names
    for j in sorted(range(len(p.cols)), key=lambda j: (p.cols[j][0], -p.cols[j][1])):
        g, ci = p.cols[j]
        k = int(x[j])
        for i in p.groups[g][pos[g]: pos[g] + k]:
            out[i] = p.choices[i][ci]
        pos[g] += k
    return out, stages
