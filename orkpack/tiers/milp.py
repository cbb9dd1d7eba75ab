"""Grouped multiple-choice integer programs, solved exactly with HiGHS (the binding scipy ships).

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
haystack equality problems) and the next is optimized. A stage stops after ``NODE_LIMIT``
branch-and-bound nodes (a count, not a time: the same plan on any machine); a later stage that stops
without a solution keeps the previous stage's plan (feasible for it) and records its gap. HiGHS reports each stage's proven
dual bound: a stage is ``optimal`` when its relative gap is within HiGHS's
``mip_rel_gap`` (1e-6 here: HiGHS proved no assignment is better by more than
that fraction), else the gap is recorded.

Speed (issue 14): HiGHS is driven through the binding scipy ships, loaded without
``scipy.optimize`` (:func:`_highs`), with the model scipy.optimize.milp would build,
so small models are solved exactly as before. A model of more than
``PRESOLVE_MIN_GROUPS`` groups also gets HiGHS presolve and, after each stage, an exact
Lagrangian bound tightening for the later stages (:func:`_tighten`).
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..errors import OrkError

REL_GAP = 1e-6
ABS_GAP = 1e-6  # HiGHS's mip_abs_gap (its default), on the objective scaled to max |c| = 1
STAGE_TOL = 1e-6
PRESOLVE_MIN_GROUPS = 64  # HiGHS presolve only above this many groups (see _solve)
# Each stage stops after NODE_LIMIT branch-and-bound nodes (HiGHS's mip_max_nodes): a count, so a plan is
# the same on a loaded machine as on an idle one. The time limit is only a safety net, far above what
# NODE_LIMIT nodes take on the models planned here (the shipped configs solve at the root node).
NODE_LIMIT = 10_000
TIME_LIMIT = 300.0


@dataclass
class Problem:
    """``cost[k][i][c]``: metric k of item i taking its c-th allowed choice (``choices[i]``).

    ``klass`` (optional): a class number per item; items of one class are known to have the same
    choices and costs (the caller computed them once), so pruning and grouping examine one item
    per class. Classes with equal choices and costs still merge into one group."""

    metrics: tuple[str, ...]
    choices: list[tuple[str, ...]]
    cost: dict[str, list[tuple[float, ...]]]
    names: list[str]
    groups: list[list[int]] = field(default_factory=list)  # filled by group()
    cols: list[tuple[int, int]] = field(default_factory=list)  # (group, choice index) per variable
    klass: list[int] | None = None

    def _key(self, i: int) -> tuple:
        return (self.choices[i],) + tuple(self.cost[m][i] for m in self.metrics)

    def _classes(self) -> list[list[int]]:
        """The items of each class, in item order, classes in order of their first item."""
        if self.klass is None:
            return [[i] for i in range(len(self.choices))]
        if getattr(self, "_by_class", None) is None:
            by: dict[int, list[int]] = {}
            for i, k in enumerate(self.klass):
                by.setdefault(k, []).append(i)
            self._by_class = list(by.values())
        return self._by_class

    def prune(self, better: dict[str, str]) -> None:
        """Drop every choice another choice of the same item dominates: no worse in every metric
        (``better[m]``: "min" or "max"), strictly better in one. Replacing a dominated choice keeps
        every constraint and no objective gets worse, so the optimum is unchanged. Items with the
        same choices and costs are pruned alike, so each distinct item is examined once."""
        sign = [1 if better[m] == "min" else -1 for m in self.metrics]
        memo: dict[tuple, tuple | None] = {}
        for members in self._classes():
            key = self._key(members[0])
            if key in memo:
                keep = memo[key]
            else:
                ch = key[0]
                vec = [tuple(key[1 + k][c] * s for k, s in enumerate(sign)) for c in range(len(ch))]
                kept = tuple(c for c in range(len(ch))
                             if not any(all(a <= b for a, b in zip(vec[d], vec[c])) and vec[d] != vec[c]
                                        for d in range(len(ch)) if d != c))
                keep = memo[key] = None if len(kept) == len(ch) else (
                    tuple(ch[c] for c in kept), [tuple(key[1 + k][c] for c in kept) for k in range(len(self.metrics))])
            if keep is not None:
                for lst, value in zip([self.choices] + [self.cost[m] for m in self.metrics], (keep[0], *keep[1])):
                    for i in members:
                        lst[i] = value

    def group(self) -> None:
        by: dict[tuple, list[int]] = {}
        for members in self._classes():
            by.setdefault(self._key(members[0]), []).extend(members)
        # groups in order of their smallest member (classes come in order of their first item, so the
        # first class of a group holds its smallest member); members in name order
        names = self.names
        self.groups = [v if len(v) == 1 else sorted(v, key=names.__getitem__) for v in by.values()]
        self.cols = [(g, c) for g, members in enumerate(self.groups) for c in range(len(self.choices[members[0]]))]

    def vector(self, metric: str) -> np.ndarray:
        """The metric per variable; ``-metric`` is its negation (a maximized stage fixed as a cap)."""
        sign = 1.0
        if metric not in self.cost and metric.startswith("-"):
            metric, sign = metric[1:], -1.0
        cost, groups = self.cost[metric], self.groups
        return np.array([sign * cost[groups[g][0]][c] for g, c in self.cols], dtype=np.float64)


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


def _highs():
    """HiGHS's Python binding as scipy ships it (``scipy.optimize._highspy._core``, what
    scipy.optimize.milp drives), loaded without running ``scipy.optimize/__init__``: that package
    imports linalg, sparse, fft, ... (~0.3 s, a third of an ``orkpack plan``) and the planner needs
    none of it. The module is registered under its own name, so a later ``import scipy.optimize``
    shares it. Any surprise (another scipy layout) falls back to the ordinary import."""
    name = "scipy.optimize._highspy._core"
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    try:
        import importlib.machinery
        import importlib.util

        top = importlib.util.find_spec("scipy")
        folder = os.path.join(os.path.dirname(top.origin), "optimize", "_highspy")
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_core" + suffix)
            if os.path.isfile(path):
                spec = importlib.util.spec_from_file_location(
                    name, path, loader=importlib.machinery.ExtensionFileLoader(name, path))
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                try:
                    spec.loader.exec_module(mod)
                    mod._Highs, mod.HighsLp, mod.HighsOptions  # noqa: B018 (the API used below)
                except BaseException:
                    del sys.modules[name]
                    raise
                return mod
    except Exception:
        pass
    try:
        from scipy.optimize._highspy import _core
    except ImportError:
        raise OrkError("the tier-map solver needs scipy >= 1.15 (its HiGHS binding, scipy.optimize._highspy); "
                       "upgrade it: pip install -U 'scipy>=1.15'") from None
    return _core


@dataclass
class _Result:
    x: np.ndarray | None
    optimal: bool  # HiGHS: model status optimal
    infeasible: bool
    bound: float | None  # HiGHS's proven dual bound of the (scaled) objective
    nodes: int
    message: str


@dataclass
class _Model:
    """One stage as handed to HiGHS, and what the bound tightening reads back from it."""
    lp: object
    rows: np.ndarray  # (variables, 1 + caps): the row of each matrix entry (group row, then the capped metrics)
    vals: np.ndarray  # its coefficient (rows scaled to O(1))
    keep: np.ndarray  # whether the entry exists
    row_hi: np.ndarray  # each row's right-hand side (group sizes, then the scaled caps)
    n_groups: int
    cost: np.ndarray  # the scaled objective
    scale: float  # objective scale: c / scale was handed over


def _model(p: Problem, c: np.ndarray, caps: dict[str, float], lower: np.ndarray | None = None,
           upper: np.ndarray | None = None, integer: bool = True) -> _Model:
    """The model exactly as scipy.optimize.milp would hand it to HiGHS (column-wise matrix: each column's
    group row, then its capped-metric rows; rows of O(1) because HiGHS's tolerances are absolute; the
    objective scaled to max |c| = 1); ``lower``/``upper``: tightened bounds of the counts."""
    h = _highs()
    n, n_groups = len(p.cols), len(p.groups)
    sizes = np.array([len(m) for m in p.groups], dtype=np.float64)
    rows = np.empty((n, 1 + len(caps)), dtype=np.int32)
    vals = np.empty((n, 1 + len(caps)), dtype=np.float64)
    keep = np.ones((n, 1 + len(caps)), dtype=bool)
    rows[:, 0] = [g for g, _ in p.cols]
    vals[:, 0] = 1.0
    lo, hi = [sizes], [sizes]
    for k, (metric, cap) in enumerate(caps.items()):
        v = p.vector(metric)
        scale = float(np.abs(v).max(initial=0.0)) or 1.0
        rows[:, 1 + k] = n_groups + k
        vals[:, 1 + k] = v / scale
        keep[:, 1 + k] = v != 0
        lo.append(np.array([-np.inf]))
        hi.append(np.array([cap / scale]))
    lp = h.HighsLp()
    lp.num_col_ = lp.a_matrix_.num_col_ = n
    lp.num_row_ = lp.a_matrix_.num_row_ = n_groups + len(caps)
    lp.a_matrix_.format_ = h.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(keep.sum(axis=1))]).astype(np.int32)
    lp.a_matrix_.index_ = rows[keep]
    lp.a_matrix_.value_ = vals[keep]
    scale = max(1e-300, float(np.abs(c).max(initial=0.0)))
    cost = np.asarray(c, dtype=np.float64) / scale
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n) if lower is None else lower
    lp.col_upper_ = np.array([len(p.groups[g]) for g, _ in p.cols], dtype=np.float64) if upper is None else upper
    lp.row_lower_ = np.concatenate(lo)
    lp.row_upper_ = row_hi = np.concatenate(hi)
    if integer:
        lp.integrality_ = [h.HighsVarType.kInteger] * n
    return _Model(lp, rows, vals, keep, row_hi, n_groups, cost, scale)


def run_highs(lp, time_limit: float, presolve: bool | None = None):
    """HiGHS on the model ``lp`` (a HighsLp), quietly, under this module's options: the relative gap, the node
    limit and the time limit (a safety net); ``presolve`` None leaves HiGHS's default. The solved Highs."""
    h = _highs()
    opts = h.HighsOptions()
    opts.log_to_console = False
    opts.mip_rel_gap = REL_GAP
    opts.time_limit = float(time_limit)
    opts.mip_max_nodes = NODE_LIMIT
    if presolve is not None:
        opts.presolve = "on" if presolve else "off"
    highs = h._Highs()
    with _quiet_stdout():
        highs.passOptions(opts)
        highs.passModel(lp)
        highs.run()
    return highs


def _run(m: _Model, time_limit: float, presolve: bool):
    return run_highs(m.lp, time_limit, presolve)


def _solve(p: Problem, c: np.ndarray, caps: dict[str, float], time_limit: float,
           lower: np.ndarray | None = None, upper: np.ndarray | None = None) -> tuple[_Result, float]:
    """One stage: min c.x over the group counts, every group placed, every capped metric within its cap."""
    h = _highs()
    m = _model(p, c, caps, lower, upper)
    # presolve costs more than the whole solve on small models (a few dozen groups: solved at the
    # root either way); on many groups it is what proves the near-tied later stages fast. (Not always: the
    # analytic Qwen3-30B-A3B's quality stage, 26 variables, takes 2,289 nodes without it and 1 with it, ~0.2 s,
    # but returns another of that stage's equally good assignments, so the plan would change: kept as it was,
    # bench/README.md "planspeed2".)
    highs = _run(m, time_limit, len(p.groups) > PRESOLVE_MIN_GROUPS)
    st = highs.getModelStatus()
    info = highs.getInfo()
    S = h.HighsModelStatus
    has_x = st == S.kOptimal or (st in (S.kTimeLimit, S.kIterationLimit, S.kSolutionLimit)
                                 and info.objective_function_value != h.kHighsInf)
    x = np.array(highs.getSolution().col_value) if has_x else None
    res = _Result(x, st == S.kOptimal, st in (S.kInfeasible, S.kUnboundedOrInfeasible),
                  info.mip_dual_bound if has_x else None, int(info.mip_node_count or 0),
                  highs.modelStatusToString(st))
    return res, m.scale


def _tighten(p: Problem, c: np.ndarray, caps: dict[str, float], cap: float, lower: np.ndarray,
             upper: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Bounds on the counts that every assignment with c.x <= ``cap`` (and within ``caps``) obeys.

    Lagrangian (reduced-cost) bound tightening, exact by weak duality: for ANY row multipliers y
    (those of a cap row taken <= 0), c.x = y.Ax + d.x with d = c - A^T y, so over the feasible counts
    c.x >= L = y_groups.sizes + y_caps.caps + sum_j min(d_j lower_j, d_j upper_j), and a count can move
    from its cheaper bound by at most (cap - L) / |d_j|. The multipliers come from the stage's LP
    relaxation (good ones fix most counts of a near-tied later stage); their quality only affects how
    much is tightened, never whether it is valid. Margins cover HiGHS's row feasibility tolerance and
    float round-off. None when nothing can be said (LP not solved, or a check fails)."""
    h = _highs()
    m = _model(p, c, caps, lower, upper, integer=False)
    highs = _run(m, 10.0, False)
    if highs.getModelStatus() != h.HighsModelStatus.kOptimal:
        return None
    y = np.array(highs.getSolution().row_dual, dtype=np.float64)
    if y.shape != m.row_hi.shape or not np.all(np.isfinite(y)):
        return None
    y[m.n_groups:] = np.minimum(y[m.n_groups:], 0.0)  # a <= row's multiplier must be <= 0 (min problem)
    d = m.cost - (m.vals * m.keep * y[m.rows]).sum(axis=1)
    lo_term = np.minimum(d * lower, d * upper)
    rows_part = y * m.row_hi
    bound = float(rows_part.sum() + lo_term.sum())
    # HiGHS accepts rows violated by up to its primal feasibility tolerance (1e-7 on these O(1) rows)
    feas = 1e-7 * (1.0 + float(np.abs(y[m.n_groups:]).sum()))
    roundoff = 1e-12 * (float(np.abs(rows_part).sum() + np.abs(lo_term).sum()) + abs(cap / m.scale) + 1.0)
    slack = cap / m.scale + 1e-7 - bound + feas + roundoff
    if not slack >= 0:
        return None
    room = np.floor(slack / np.maximum(np.abs(d), 1e-300))
    new_lo = np.where(d < 0, np.maximum(lower, upper - room), lower)
    new_up = np.where(d > 0, np.minimum(upper, lower + room), upper)
    if np.any(x < new_lo) or np.any(x > new_up):  # the stage's own optimum obeys every valid bound
        return None
    return new_lo, new_up


def lexicographic(p: Problem, order: list[tuple[str, str]], caps: dict[str, float], *,
                  time_limit: float = TIME_LIMIT, assign: bool = True) -> tuple[dict[int, str], list[Stage]]:
    """Optimize ``order`` = [(metric, "min"|"max"), ...] in turn under ``caps`` (metric -> upper bound).

    Returns (item index -> choice, stages); ``assign`` False: ({}, stages), for a caller that reads the stages
    alone (a choice per item is 18,626 entries for Qwen3-30B-A3B). Raises OrkError("infeasible") when no
    assignment meets the caps.
    """
    if not p.groups:
        p.group()
    if not p.cols:  # nothing to place (every tensor stays float or raw): each stage is 0, and that is optimal
        return {}, [Stage(metric, sense, 0.0, 0.0, "optimal", 0) for metric, sense in order]
    caps = dict(caps)
    stages: list[Stage] = []
    x = None
    # many groups: after each stage, bounds every later stage obeys (_tighten); few: the model as it always was
    tighten = len(p.groups) > PRESOLVE_MIN_GROUPS
    lower = np.zeros(len(p.cols)) if tighten else None
    upper = np.array([len(p.groups[g]) for g, _ in p.cols], dtype=np.float64) if tighten else None
    for step, (metric, sense) in enumerate(order):
        v = p.vector(metric)
        c = v if sense == "min" else -v
        res, scale = _solve(p, c, caps, time_limit, lower, upper)
        if res.x is None:
            if res.infeasible:
                raise OrkError("infeasible")
            if x is None:
                raise OrkError(f"the MILP solver stopped without a solution ({res.message}); "
                               "give it fewer distinct items (a coarser profile)")
            # out of time in a later stage: the previous stage's plan is feasible here; keep it, with its gap
            val = float(v @ x)
            bound = res.bound * scale if res.bound is not None else (-np.inf if sense == "min" else np.inf)
            bound = bound if sense == "min" else -bound
            stages.append(Stage(metric, sense, val, bound, "gap", res.nodes))
            continue
        x = np.round(res.x).astype(np.int64)
        val = float(v @ x)
        bound = res.bound * scale if res.bound is not None else val
        bound = bound if sense == "min" else -bound
        gap = abs(val - bound)
        # HiGHS stops at a relative gap of REL_GAP, or an absolute one of ABS_GAP on the scaled objective
        # (what decides a stage whose optimum is 0)
        optimal = res.optimal and gap <= max(REL_GAP * abs(val), ABS_GAP * scale, 1e-12) * 10
        stages.append(Stage(metric, sense, val, bound, "optimal" if optimal else "gap", res.nodes))
        # fix this stage's optimum for the next ones (a hair of slack for float round-off)
        tol = STAGE_TOL * max(abs(val), 1e-30)
        if tighten and step + 1 < len(order):
            got = _tighten(p, c, caps, (val if sense == "min" else -val) + tol, lower, upper, x)
            if got is not None:
                lower, upper = got
        if sense == "min":
            caps[metric] = min(caps.get(metric, np.inf), val + tol)
        else:
            caps["-" + metric] = -val + tol  # Problem.vector("-q") is the negated metric
    out: dict[int, str] = {}
    if not assign:
        return out, stages
    pos = [0] * len(p.groups)
    # within a group, the last-listed choices (the NPU ones, by the callers' convention) go to the first names
    for j in sorted(range(len(p.cols)), key=lambda j: (p.cols[j][0], -p.cols[j][1])):
        g, ci = p.cols[j]
        k = int(x[j])
        for i in p.groups[g][pos[g]: pos[g] + k]:
            out[i] = p.choices[i][ci]
        pos[g] += k
    return out, stages
