"""Exact multi-constraint 0/1 knapsack over groups of items with identical weights.

Items with identical weight vectors are interchangeable in every constraint, so an
optimal solution takes a *prefix* of each group when the group is sorted by value
(descending; ties by the caller's order, i.e. by name). The problem becomes: choose
counts k_g in [0, n_g] maximizing sum_g F_g(k_g) (F_g = prefix sums, concave) subject
to sum_g k_g * w_g[j] <= cap[j] for every constraint j.

Method: depth-first branch and bound over the groups (largest weight first). The
bound of a node is the minimum over constraints of the LP relaxation of the
remaining groups under that constraint alone (the fractional greedy by value/weight,
exact for a single constraint), which is a valid upper bound. Children are tried in
order of decreasing bound; a child is cut when its bound cannot beat the incumbent
by at least 1 (values are integers). The incumbent starts from the integral greedy.
When the search finishes the result is optimal; if it stops at ``node_limit`` the
result carries the proven gap (best bound - value).

Values and weights are Python ints (exact); bounds use float64 with a relative
safety margin, so a cut never discards a strictly better integer solution.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class KnapResult:
    counts: list[int]
    value: int
    bound: int  # proven upper bound (== value when optimal)
    nodes: int
    optimal: bool


class _LP:
    """Fractional-greedy bound over a set of groups for one constraint."""

    def __init__(self, groups: list[int], weights: list[tuple[int, ...]], values: list[np.ndarray], j: int):
        ws, vs = [], []
        free = 0.0
        for g in groups:
            w = weights[g][j]
            v = values[g].astype(np.float64)
            if w == 0:
                free += float(v.sum())
                continue
            ws.append(np.full(len(v), float(w)))
            vs.append(v)
        self.free = free
        if ws:
            w = np.concatenate(ws)
            v = np.concatenate(vs)
            order = np.argsort(-(v / w), kind="stable")
            self.w, self.v = w[order], v[order]
            self.cw = np.cumsum(self.w)
            self.cv = np.cumsum(self.v)
        else:
            self.w = self.v = self.cw = self.cv = np.zeros(0)

    def bound(self, cap: np.ndarray) -> np.ndarray:
        """LP value for each capacity in ``cap`` (float array)."""
        n = len(self.cw)
        if n == 0:
            return np.full(cap.shape, self.free)
        p = np.searchsorted(self.cw, cap, side="right")  # items fully taken
        taken = np.where(p > 0, self.cv[np.maximum(p - 1, 0)], 0.0)
        used = np.where(p > 0, self.cw[np.maximum(p - 1, 0)], 0.0)
        pi = np.minimum(p, n - 1)
        frac = np.where(p < n, (cap - used) * self.v[pi] / self.w[pi], 0.0)
        return self.free + taken + frac


def _greedy(weights, values, caps) -> list[int]:
    """Integral greedy by value per unit of the first binding constraint; deterministic."""
    G = len(values)
    counts = [0] * G
    rem = list(caps)
    cand = []
    for g in range(G):
        w0 = max(weights[g][0], 1)
        for idx, v in enumerate(values[g]):
            cand.append((-(int(v) / w0), g, idx))
    cand.sort()
    for _, g, idx in cand:
        if idx != counts[g]:
            continue  # prefixes only
        w = weights[g]
        if all(w[j] <= rem[j] for j in range(len(rem))):
            counts[g] += 1
            for j in range(len(rem)):
                rem[j] -= w[j]
    return counts


def solve(weights: list[tuple[int, ...]], values: list[np.ndarray], caps: tuple[int, ...],
          node_limit: int = 200_000) -> KnapResult:
    """Maximize sum of prefix values; ``values[g]`` must be sorted descending and positive (int64)."""
    G = len(values)
    D = len(caps)
    if G == 0:
        return KnapResult([], 0, 0, 0, True)
    prefix = [np.concatenate([[0], np.cumsum(v.astype(object))]) for v in values]  # exact ints
    prefix_f = [np.concatenate([[0.0], np.cumsum(v.astype(np.float64))]) for v in values]
    # order groups: largest first-constraint weight first (fewest choices, most impact)
    order = sorted(range(G), key=lambda g: (-weights[g][0], g))
    lps = [[_LP(order[i:], weights, values, j) for j in range(D)] for i in range(G + 1)]

    def kmax(g: int, cap: list[int]) -> int:
        k = len(values[g])
        for j in range(D):
            w = weights[g][j]
            if w > 0:
                k = min(k, cap[j] // w)
        return max(k, 0)

    best_counts = _greedy(weights, values, list(caps))
    best = int(sum(prefix[g][best_counts[g]] for g in range(G)))
    root_bound = min(lps[0][j].bound(np.array([float(caps[j])]))[0] for j in range(D))
    total = int(sum(prefix[g][-1] for g in range(G)))
    root_bound = min(root_bound, float(total))
    nodes = 0
    stopped = False
    counts = [0] * G
    open_bounds: list[float] = []  # bounds of nodes left unexplored when stopping

    def cutoff(b: float) -> bool:
        return b * (1 + 1e-12) + 1e-6 < best + 1

    def dfs(level: int, cap: list[int], value: int) -> None:
        nonlocal best, best_counts, nodes, stopped
        g = order[level]
        km = kmax(g, cap)
        if level == G - 1:
            counts[g] = km
            v = value + int(prefix[g][km])
            if v > best:
                best, best_counts = v, list(counts)
            return
        ks = np.arange(km + 1)
        b = np.full(km + 1, np.inf)
        for j in range(D):
            rem = cap[j] - ks.astype(np.float64) * weights[g][j]
            b = np.minimum(b, lps[level + 1][j].bound(rem))
        b = value + prefix_f[g][ks] + b
        for k in np.lexsort((-ks, -b)):
            if cutoff(b[k]):
                break
            if stopped or nodes >= node_limit:
                stopped = True
                open_bounds.append(float(b[k]))
                break
            nodes += 1
            k = int(k)
            counts[g] = k
            dfs(level + 1, [cap[j] - k * weights[g][j] for j in range(D)], value + int(prefix[g][k]))
        counts[g] = 0

    if not cutoff(root_bound):
        dfs(0, list(caps), 0)
    if stopped:
        bound = max([best] + [int(np.floor(x * (1 + 1e-12) + 1e-6)) for x in open_bounds])
        return KnapResult(best_counts, best, bound, nodes, bound <= best)
    return KnapResult(best_counts, best, best, nodes, True)
