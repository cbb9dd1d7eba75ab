"""Are two runs' packs byte-identical? For a change that must not change behaviour (a refactor): run the suite (or a
bench) once before and once after with pytest's ``--basetemp``, then compare every ``.orkpack`` file of the two trees
by its path relative to the tree (pytest names tmp folders after the test, so the same test writes the same path).

    python -m pytest --basetemp=/tmp/before ...   # on the old commit
    python -m pytest --basetemp=/tmp/after ...    # on the new one
    python bench/same_packs.py /tmp/before /tmp/after [--json]

Prints the count of packs compared, those that differ and those only one tree has; exit 0 when all packs both trees
hold are identical, 1 otherwise. A test whose packs are all timestamped or seeded from the clock would show up here;
none of ours are (builds are byte-reproducible, docs/GUARANTEES.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import xxhash


def digests(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*.orkpack")):
        if p.is_file() and not p.is_symlink():
            h = xxhash.xxh3_64()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    h.update(block)
            out[str(p.relative_to(root))] = h.hexdigest()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    b, c = digests(a.before), digests(a.after)
    both = sorted(set(b) & set(c))
    rep = {"compared": len(both), "differ": [p for p in both if b[p] != c[p]],
           "only_before": sorted(set(b) - set(c)), "only_after": sorted(set(c) - set(b))}
    if a.json:
        print(json.dumps(rep, indent=1))
    else:
        print(f"{rep['compared']} packs in both trees, {len(rep['differ'])} differ; "
              f"{len(rep['only_before'])} only before, {len(rep['only_after'])} only after")
        for k in ("differ", "only_before", "only_after"):
            for p in rep[k]:
                print(f"  {k}: {p}")
    return 1 if rep["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
