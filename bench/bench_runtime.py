"""Runtime load-path benchmark: one command, one run, the same buffers.

    python bench/bench_runtime.py [--n 4096] [--k 4096] [--reps 7] [--threads 1] [--isa best]

Measures (medians and min-max over --reps, after a warm-up):
  * fill (kernels/runtime.c ork_rt_fill, cached stores + clean) vs memcpy (numpy.copyto)
    of the same int8 tile image into the same destination;
  * direct int4 -> int8 tiled inflate vs the two-step C path (decode to float32, requantize,
    tile) on the same NF4 slice into the same destination;
  * direct inflate's output bytes/s vs memcpy bytes/s.
Goals (issue 4): fill/memcpy >= 0.9, direct/two-step >= 5x, direct output B/s / memcpy B/s >= 0.5.
The outputs of both inflates are compared byte for byte before timing. --isa caps the SIMD level of
the inflate (ork_rt_set_isa: avx512 = x86 AVX-512 VBMI, ssse3, neon, portable C) to compare the paths.
"""
from __future__ import annotations

import argparse
import os
import platform
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from common import Case, interleave, rates
from orkpack._kernels import lib
from orkpack.codecs.reference import nf4_encode
from orkpack.runtime.inflate import fill, inflate_into, tiled_size

ISA_LEVELS = {"best": -1, "portable": 0, "ssse3": 1, "neon": 2, "avx512": 3}
ISA_NAMES = {0: "portable C", 1: "x86 SSSE3", 2: "NEON", 3: "x86 AVX-512 VBMI"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--isa", choices=sorted(ISA_LEVELS), default="best", help="cap the inflate's SIMD level")
    a = ap.parse_args(argv)
    lib.ork_rt_set_isa(ISA_LEVELS[a.isa])
    rng = np.random.default_rng(a.seed)
    n, k = a.n, a.k
    w = rng.standard_t(3, size=(n, k)).astype(np.float32)  # heavy-tailed, seeded
    codes, absmax = nf4_encode(w)
    ab = absmax.view(np.uint8)
    size = tiled_size(n, k)
    src = rng.integers(-127, 128, size=size, dtype=np.int8).view(np.uint8)  # an int8 tile image
    dst = np.zeros(size, dtype=np.uint8)
    scale = np.zeros(n, dtype=np.float32)
    pool = ThreadPoolExecutor(a.threads) if a.threads > 1 else None

    q1 = np.zeros(size, np.uint8)
    q2 = np.zeros(size, np.uint8)
    s2 = np.zeros(n, np.float32)
    inflate_into(codes, ab, n, k, q1, scale, method="direct", pool=pool)
    inflate_into(codes, ab, n, k, q2, s2, method="two-step", pool=pool)
    assert np.array_equal(q1, q2) and np.array_equal(scale.view(np.uint32), s2.view(np.uint32)), "paths disagree"

    rows = {}
    # interleave the measurements so that drift hits all of them alike
    fns = {
        "memcpy": lambda: np.copyto(dst, src),
        "fill": lambda: fill(dst, src, clean=True, pool=pool),
        "direct": lambda: inflate_into(codes, ab, n, k, dst, scale, method="direct", pool=pool),
        "two-step": lambda: inflate_into(codes, ab, n, k, dst, scale, method="two-step", pool=pool),
    }
    # one warm-up round (page faults, caches), then --reps interleaved rounds
    runs = interleave([Case(name, f) for name, f in fns.items()], a.reps, warmup=True)
    for name, ts in runs.items():
        rows[name] = rates(size, ts)

    simd = ISA_NAMES[lib.ork_rt_isa()]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.machine()} {platform.processor() or ''} cpus={os.cpu_count()}, threads={a.threads}, "
          f"inflate simd={simd}, load average at the end={load:.2f}")
    print(f"slice [{n}, {k}] -> {size} bytes of int8 tiles; reps={a.reps}; GB/s of output bytes")
    print(f"{'path':<10} {'median GB/s':>12} {'min-max GB/s':>18}")
    for name, (med, lo, hi) in rows.items():
        print(f"{name:<10} {med:>12.2f} {lo:>8.2f}-{hi:<8.2f}")
    r1 = rows["fill"][0] / rows["memcpy"][0]
    r2 = rows["direct"][0] / rows["two-step"][0]
    r3 = rows["direct"][0] / rows["memcpy"][0]
    print(f"fill / memcpy            = {r1:.2f}  (goal >= 0.9)")
    print(f"direct / two-step        = {r2:.2f}x (goal >= 5x)")
    print(f"direct out B/s / memcpy  = {r3:.2f}  (goal >= 0.5)")
    if pool:
        pool.shutdown()
    lib.ork_rt_set_isa(-1)


if __name__ == "__main__":
    main()
