"""Gathering activation statistics while a model runs: a weight provider that records every matmul's input
columns (the statistics themselves: orkpack/stats/)."""
from __future__ import annotations

import numpy as np

from ..model.weights import Wrapped
from ..stats import ActStats, Entry


class Collector(Wrapped):
    """Wraps a weight provider; every ``matmul`` adds its input's column statistics to ``acc``.

    ``acc[(name, expert)]`` is ``[sum2 float64 [K], absmax float32 [K], rows, output energy]``; the
    output energy ``sum |y|^2`` is gathered only when ``output_energy`` (the sensitivity estimate uses it)."""

    def __init__(self, inner, acc: dict, *, output_energy: bool = False):
        super().__init__(inner)
        self.acc, self.output_energy = acc, output_energy

    def matmul(self, name, x, expert=None):
        y = self.inner.matmul(name, x, expert)
        x = self.online_input(name, x)  # what the matrix reads (an online R4 before ffn_down)
        a = self.acc.get((name, expert))
        if a is None:
            a = self.acc[(name, expert)] = [np.zeros(x.shape[1]), np.zeros(x.shape[1], dtype=np.float32), 0, 0.0]
        x64 = x.astype(np.float64)
        a[0] += (x64 * x64).sum(axis=0)
        if x.shape[0]:
            np.maximum(a[1], np.abs(x).max(axis=0), out=a[1])
        a[2] += x.shape[0]
        if self.output_energy:
            a[3] += float((y.astype(np.float64) ** 2).sum())
        return y


def from_acc(acc: dict, experts: dict[str, int], **meta) -> ActStats:
    """The gathered ``acc`` of a :class:`Collector` as ActStats; ``experts[name]``: a stacked tensor's
    expert count (its rows; an expert no token reached keeps count 0 and zero sums)."""
    entries: dict[str, Entry] = {}
    names = sorted({n for n, _ in acc})
    for n in names:
        keys = [e for m, e in acc if m == n]
        k = acc[(n, keys[0])][0].shape[0]
        nmat = experts.get(n, 1) if any(e is not None for e in keys) else 1
        s2, am, cnt = np.zeros((nmat, k)), np.zeros((nmat, k), dtype=np.float32), np.zeros(nmat)
        for e in keys:
            a = acc[(n, e)]
            r = 0 if e is None else e
            s2[r], am[r], cnt[r] = a[0], a[1], a[2]
        entries[n] = Entry(s2, cnt, am)
    return ActStats(entries, **meta)
