"""`orkpack inspect`: the facts of a pack as one JSON-able dict (stable keys).

The CLI renders it as tables for people or prints it as JSON for machines.
"""
from __future__ import annotations

import fnmatch
from pathlib import Path

from orkpack.pack import spec
from orkpack.pack.reader import Pack


def slice_resident_bytes(s: dict) -> int:
    """Bytes a slice occupies where it lives: NPU slices as int8 tiles (an nf4
    NPU slice is inflated to int8 at load), host slices as stored."""
    stored = sum(p["size"] for p in s["parts"].values())
    if s["tier"] == spec.TIER_NPU and s["encoding"] == spec.ENC_NF4:
        rows = s["shape"][0] if len(s["shape"]) == 2 else 1
        return s["inflate"]["q_size"] + 4 * rows
    return stored


def pack_facts(path: Path, tensor_glob: str | None = None) -> dict:
    with Pack.open(path) as pack:
        p, h = pack.preamble, pack.header
        residency = {t: {"slices": 0, "resident_bytes": 0, "stored_bytes": 0} for t in spec.TIERS}
        encodings: dict[str, dict] = {}
        rows = []
        for t in pack.tensors:
            tsum = {"stored_bytes": 0, "resident_bytes": 0}
            slices = []
            for s in t["slices"]:
                stored = sum(pp["size"] for pp in s["parts"].values())
                res = slice_resident_bytes(s)
                r = residency[s["tier"]]
                r["slices"] += 1
                r["resident_bytes"] += res
                r["stored_bytes"] += stored
                e = encodings.setdefault(s["encoding"], {"slices": 0, "stored_bytes": 0})
                e["slices"] += 1
                e["stored_bytes"] += stored
                tsum["stored_bytes"] += stored
                tsum["resident_bytes"] += res
                slices.append(
                    {
                        "expert": s["expert"],
                        "encoding": s["encoding"],
                        "tier": s["tier"],
                        "layout": s["layout"]["kind"],
                        "stored_bytes": stored,
                        "resident_bytes": res,
                        "sqnr_db": s["sqnr_db"],
                        "min_m": s.get("min_m"),
                        "xxh3": {k: v["xxh3"] for k, v in s["parts"].items()},
                    }
                )
            if tensor_glob and not fnmatch.fnmatchcase(t["name"], tensor_glob):
                continue
            encs = sorted({s["encoding"] for s in slices})
            tiers = sorted({s["tier"] for s in slices})
            sq = [s["sqnr_db"] for s in slices if s["sqnr_db"] is not None]
            rows.append(
                {
                    "name": t["name"],
                    "source_name": t["source_name"],
                    "shape": t["shape"],
                    "source_dtype": t["source_dtype"],
                    "encoding": encs[0] if len(encs) == 1 else "mixed",
                    "tier": tiers[0] if len(tiers) == 1 else "mixed",
                    "stored_bytes": tsum["stored_bytes"],
                    "resident_bytes": tsum["resident_bytes"],
                    "sqnr_db": min(sq) if sq else None,
                    "slices": slices,
                }
            )
        return {
            "file": path.name,
            "file_size": p.file_size,
            "format_version": f"{p.version_major}.{p.version_minor}",
            "tool": h.get("tool"),
            "checksums": {"preamble": "ok", "header": "ok", "data": "not checked (orkpack verify)"},
            "data_size": p.data_size,
            "header_size": p.header_size,
            "provenance": h.get("provenance"),
            "arch": (h.get("provenance") or {}).get("arch"),
            "tiermap": None if h.get("tiermap") is None else {k: v for k, v in h["tiermap"].items() if k != "items"},
            "tensor_count": len(pack.tensors),
            "residency": residency,
            "encodings": encodings,
            "tensors": rows,
        }
