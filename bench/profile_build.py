"""Where `orkpack build` spends its time: read, encode, checksum, write, plan,
Python overhead. Runs one build under cProfile and sums the functions' own
time per stage (threads other than the main one are not profiled: with
--threads 1 the encode runs on the main thread, the source hashing and the
read-ahead run on side threads and show up as waiting in `read`).

    python bench/profile_build.py MODEL [--threads 1] [--plan]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from orkpack.build import BuildOptions, build

STAGES = [
    ("read", ("preadv", "readinto", "pread", "mmap", "map_array", "result", "wait", "acquire")),
    ("encode", ("ork_nf4", "ork_int8", "ork_widen", "ork_count")),
    ("checksum", ("xxh3",)),
    ("write", ("write", "pwrite", "fsync", "ftruncate", "replace", "flock")),
    ("plan", ("solver.py", "milp.py", "manifest.py", "profile.py", "cost.py")),
]


def stage_of(func: tuple) -> str:
    filename, _line, name = func
    key = f"{filename}:{name}"
    for stage, needles in STAGES:
        if any(n in key for n in needles):
            return stage
    return "python"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plan", action="store_true", help="solve the tier map (default: --no-plan rules)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=".") as d:
        out = Path(d) / "p.orkpack"
        build(a.model, out, BuildOptions(threads=a.threads, plan=a.plan))  # warm the page cache
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        r = build(a.model, out, BuildOptions(threads=a.threads, plan=a.plan))
        prof.disable()
        wall = time.perf_counter() - t0
    st = pstats.Stats(prof)
    totals: dict[str, float] = {}
    for func, (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        totals[stage_of(func)] = totals.get(stage_of(func), 0.0) + tt
    print(f"{r.source_bytes / 1e9:.3f} GB source in {wall:.3f} s ({r.source_bytes / wall / 1e9:.2f} GB/s), threads {a.threads}")
    for stage, t in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {stage:9s} {t:7.3f} s  {100 * t / wall:5.1f}%")


if __name__ == "__main__":
    main()
