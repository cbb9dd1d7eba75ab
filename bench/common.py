"""Shared timing helpers for the bench scripts (bench_build, bench_codecs, bench_runtime).

Every figure is measured interleaved: one *round* runs every case once, in a
fixed order, and ``reps`` rounds are run, so slow drift (thermal, other load,
page-cache writeback) hits every case alike. Figures are medians over the
rounds with their min-max; ratios between two cases are taken per round
(paired) and then their median, which cancels drift shared by the pair.
Nothing here asserts on time: these are measurements, not tests.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Case:
    """One timed thing. ``run`` is timed around the call, or, with ``self_timed``, returns its own
    seconds (e.g. a subprocess timed around the child alone); ``after`` runs untimed after every call."""

    name: str
    run: Callable[[], object]
    after: Callable[[], None] | None = None
    self_timed: bool = False


def interleave(cases: list[Case], reps: int, *, warmup: bool = True) -> dict[str, list[float]]:
    """Seconds per case over ``reps`` interleaved rounds (A B C A B C ...), after one untimed warm-up round."""
    if warmup:
        for c in cases:
            c.run()
            if c.after:
                c.after()
    times: dict[str, list[float]] = {c.name: [] for c in cases}
    for _ in range(reps):
        for c in cases:
            t0 = time.perf_counter()
            r = c.run()
            dt = time.perf_counter() - t0
            times[c.name].append(float(r) if c.self_timed else dt)
            if c.after:
                c.after()
    return times


def median_minmax(xs: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(xs), min(xs), max(xs)


def rates(nbytes: float, seconds: list[float], scale: float = 1e9) -> tuple[float, float, float]:
    """(median, min, max) of nbytes/s / scale (GB/s by default); min comes from the slowest run."""
    med = nbytes / statistics.median(seconds) / scale
    return med, nbytes / max(seconds) / scale, nbytes / min(seconds) / scale


def paired(num: list[float], den: list[float]) -> tuple[float, float, float]:
    """Per-round ratios num[i] / den[i] -> (median, min, max)."""
    return median_minmax([a / b for a, b in zip(num, den)])


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def loadavg() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    try:
        a = os.getloadavg()
        return f"{a[0]:.2f}, {a[1]:.2f}, {a[2]:.2f}"
    except OSError:
        return "n/a"


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def machine_lines(res: dict, extra: str = "") -> list[str]:
    """The header lines every bench report starts with: the machine, and the load before and after."""
    m = res["machine"]
    return [f"machine: {m['cpu']} ({m['arch']}), {m['cores']} cores, python {m['python']}, numpy {m['numpy']}{extra}",
            f"load average (1, 5, 15 min): before {res['load_before']}; after {res['load_after']}"]


def emit(result: dict, as_json: bool, table: Callable[[dict], None]) -> int:
    """Print a bench's result as JSON or as its table; the exit code (0)."""
    import json

    if as_json:
        print(json.dumps(result, indent=1))
    else:
        table(result)
    return 0


def heavy_tailed(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Seeded heavy-tailed float32 weights: Student-t (3 dof) scaled to std 0.02, plus ~1e-5 outliers of 0.2-0.6."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_t(3, size=(rows, cols)) * (0.02 / np.sqrt(3.0))).astype(np.float32)
    flat = x.reshape(-1)
    k = 1 + flat.size // 100_000
    idx = rng.integers(0, flat.size, k)
    flat[idx] = (rng.uniform(0.2, 0.6, k) * rng.choice([-1.0, 1.0], k)).astype(np.float32)
    return x
