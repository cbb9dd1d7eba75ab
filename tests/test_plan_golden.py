"""`orkpack plan` prints what it printed before its speed work (issue 26), byte for byte.

The goldens (tests/fixtures/plan_golden/, gzipped) were written by main before the work, by
tests/fixtures/plan_golden/regen.py: the --json text and the tables (their one timing, "solved in N ms",
masked) of the 18,626-item MoE with the analytic and the skewed routing profile (balanced and --goal decode:
the presolve and bound-tightening path), with pins, and of a dense, an OLMoE, a tied-embedding and a hybrid
model with other goals, boards, KV types and a size bound. Each case runs as a whole process, as a user runs it;
one also writes its map with -o, which must be the --json text. (Regenerated once since, for the default host
levels' record: regen.py says what changed.)
"""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/fixtures/plan_golden"))
import regen  # noqa: E402

GOLDEN = ROOT / "tests/fixtures/plan_golden"


def _plan(args: list[str], *extra: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "orkpack", "plan", *regen.argv(args), *extra], capture_output=True,
                       text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _golden(name: str, ext: str) -> str:
    with gzip.open(GOLDEN / f"{name}.{ext}.gz", "rb") as f:
        return f.read().decode("utf-8")


def _first_difference(got: str, want: str) -> str:
    for n, (a, b) in enumerate(zip(got.splitlines(), want.splitlines()), start=1):
        if a != b:
            return f"line {n}:\n got  {a[:300]}\n want {b[:300]}"
    return f"lengths {len(got)} != {len(want)}"


@pytest.mark.parametrize("name", list(regen.CASES))
def test_plan_json_is_the_golden(name):
    got, want = _plan(regen.CASES[name], "--json"), _golden(name, "json")
    assert got == want, _first_difference(got, want)


@pytest.mark.parametrize("name", list(regen.CASES))
def test_plan_tables_are_the_golden(name):
    got, want = regen.SOLVED.sub("solved in N ms", _plan(regen.CASES[name])), _golden(name, "txt")
    assert got == want, _first_difference(got, want)


def test_written_map_is_the_golden(tmp_path):
    out = tmp_path / "map.json"
    _plan(regen.CASES["qwen3moe-skewed"], "--json", "-o", str(out))
    assert out.read_text(encoding="utf-8") == _golden("qwen3moe-skewed", "json")
