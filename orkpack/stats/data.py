"""Activation statistics in memory: per matrix (and expert) and input column, the sum of squares, the largest |x|
and the token count (the file formats: :mod:`orkpack.stats.formats`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import OrkError


class StatsError(OrkError):
    """A statistics file that cannot be used: one line naming the file and what to do."""


@dataclass
class Entry:
    """One matrix's statistics: ``sum2`` and ``absmax`` are [matrices, K], ``counts`` [matrices]."""

    sum2: np.ndarray
    counts: np.ndarray
    absmax: np.ndarray | None = None

    def row(self, a: np.ndarray, expert: int | None, k: int | None) -> np.ndarray | None:
        if a.shape[0] == 1 and expert is not None and k is not None and a.shape[1] % k == 0 and a.shape[1] > k:
            a = a.reshape(-1, k)  # a legacy file's flat per-expert sums
        e = 0 if expert is None else expert
        if e >= a.shape[0] or (k is not None and a.shape[1] != k):
            return None
        return a[e]


class ActStats:
    """Statistics per matrix name (see the module docstring)."""

    def __init__(self, entries: dict[str, Entry] | None = None, *, datasets: list[str] | None = None,
                 chunk_count: int = 0, chunk_size: int = 0, legacy: bool = False):
        self.entries = entries if entries is not None else {}
        self.datasets = datasets or []
        self.chunk_count, self.chunk_size, self.legacy = chunk_count, chunk_size, legacy

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def mean_sq(self, name: str, expert: int | None = None, k: int | None = None) -> np.ndarray | None:
        """The importance ``sum2 / count`` of each input column (float32), or None when the matrix (or the
        expert) saw no token or the file does not hold it; ``k``, when given, must match its width."""
        e = self.entries.get(name)
        if e is None:
            return None
        s = e.row(e.sum2, expert, k)
        if s is None:
            return None
        c = e.counts[0] if e.counts.shape[0] == 1 else (e.counts[expert or 0] if (expert or 0) < e.counts.shape[0]
                                                          else 0)
        if c <= 0:
            return None
        return (s / np.float64(c)).astype(np.float32)

    def absmax(self, name: str, expert: int | None = None, k: int | None = None) -> np.ndarray | None:
        """The largest ``|x|`` of each input column (float32), or None (no maxima in the file, or no token)."""
        e = self.entries.get(name)
        if e is None or e.absmax is None:
            return None
        c = e.counts[expert or 0] if (expert or 0) < e.counts.shape[0] else 0
        if c <= 0:
            return None
        return e.row(e.absmax, expert, k)
