"""The planner's MILP stops on a node count, not on the clock: a plan does not depend on the machine's load.

A strongly correlated 0-1 knapsack (values = weights + a little) needs many branch-and-bound nodes.
Solved to the end it is optimal; cut at one node it ends with a gap, the same plan every time, and
however slow the machine is (the clock is made to run out of nothing: a huge time limit changes
nothing, and the result equals a run under a busy loop in another thread)."""
from __future__ import annotations

import threading

import numpy as np

from orkpack.tiers import milp


def _knapsack(n=60, seed=1):
    rng = np.random.default_rng(seed)
    w = rng.integers(100_000, 1_000_000, n).astype(float)
    v = w + rng.integers(1, 10_000, n)
    p = milp.Problem(("ram", "q"), [("in", "out")] * n, {"ram": [(x, 0.0) for x in w], "q": [(x, 0.0) for x in v]},
                     [f"i{j:03d}" for j in range(n)])
    return p, {"ram": float(w.sum()) / 2}


def _solve(**kw):
    p, caps = _knapsack()
    return milp.lexicographic(p, [("q", "max")], caps, **kw)


def test_cut_at_the_node_limit_the_plan_is_the_same_every_time(monkeypatch):
    full, st_full = _solve()
    assert st_full[0].status == "optimal" and st_full[0].nodes > 1
    monkeypatch.setattr(milp, "NODE_LIMIT", 1)
    a, st_a = _solve()
    assert st_a[0].status == "gap" and st_a[0].nodes <= 1
    assert st_a[0].value < st_full[0].value  # really cut short
    b, st_b = _solve(time_limit=1e6)
    stop = threading.Event()

    def busy():
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=busy)
    t.start()
    try:
        c, st_c = _solve()
    finally:
        stop.set()
        t.join()
    assert a == b == c and st_a[0].value == st_b[0].value == st_c[0].value


def test_the_node_limit_reaches_highs():
    p, caps = _knapsack()
    p.group()
    m = milp._model(p, -p.vector("q"), caps, None, None)
    h = milp.run_highs(m.lp, 10.0)
    assert h.getOptions().mip_max_nodes == milp.NODE_LIMIT
