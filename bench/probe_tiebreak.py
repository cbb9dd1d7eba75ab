"""Issue 26 probe (not a benchmark of shipped code): would a tie-break stage make the plan independent of HiGHS's
presolve, and what would it cost? Runs `orkpack plan ... --json` in this process with the MILP driver patched:

    python bench/probe_tiebreak.py PRESOLVE TIEBREAK CONFIG [plan options] > plan.json

PRESOLVE: "on" (presolve on every stage), "as-shipped" (milp.PRESOLVE_MIN_GROUPS unchanged). TIEBREAK: "1" appends
the stages (prefill, min) then (decode, min) after every quality stage (each fixed as milp.lexicographic fixes a
stage), "0" leaves the stages as they are; the printed stages are the shipped ones only. Prints to stderr the CPU
seconds of all milp.lexicographic calls. bench/README.md "Third pass" has the figures."""
from __future__ import annotations

import atexit
import sys
import time

import orkpack.tiers.milp as milp

if len(sys.argv) < 4 or sys.argv[1] not in ("on", "as-shipped") or sys.argv[2] not in ("0", "1"):
    raise SystemExit(__doc__)
if sys.argv[1] == "on":
    milp.PRESOLVE_MIN_GROUPS = -1
tiebreak = sys.argv[2] == "1"
shipped, spent = milp.lexicographic, [0.0]


def lexicographic(p, order, caps, **kw):
    t = time.process_time()
    extra = [(k, "min") for k in ("pre", "dec") if k in p.cost] if tiebreak and order[-1][0] == "q" else []
    out, stages = shipped(p, list(order) + extra, caps, **kw)
    spent[0] += time.process_time() - t
    return out, stages[:len(order)]


milp.lexicographic = lexicographic  # solver.py calls it as milp.lexicographic
atexit.register(lambda: print(f"milp_cpu {spent[0]:.3f}", file=sys.stderr))

from orkpack.cli import main  # noqa: E402

sys.argv = ["orkpack", "plan", sys.argv[3], "--json", *sys.argv[4:]]
main()
