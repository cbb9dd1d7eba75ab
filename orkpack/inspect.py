"""`orkpack inspect`: the facts of a pack as one JSON-able dict (stable keys).

The CLI renders it as tables for people or prints it as JSON for machines.

A damaged pack is still shown as far as it can be, never trusted:

* a checksum or consistency failure (``PackDamaged``): the preamble, and the
  header too when it still parses and hangs together, with ``untrusted`` set to
  the reason and ``exit_code`` 1;
* a truncated pack: the preamble's facts (declared sizes, version), no tensors,
  ``untrusted`` set and ``exit_code`` 2;
* not a pack at all, a newer major version, a missing file: the error is raised
  (nothing to show).

Raw tensors (non-float, carried verbatim) show ``encoding`` ``raw`` and their
element type in ``dtype``; ``skipped`` lists the derivable buffers the build
left out (``provenance.skipped``: name, dtype, shape, reason).

Dual residency (format 1.2): an NPU slice with a host copy keeps ``tier``
``npu`` and shows the copy in ``host_copy`` (encoding, layout, stored bytes,
SQNR, part checksums); its tensor row's ``tier`` reads ``npu+host nf4``. The
NPU bytes count on the NPU (``residency.npu``), the copy's bytes on the host
(``residency.host``, whose ``host_copies`` counts them), and ``encodings``
counts the copies under their encoding (``host_copies``). A tensor row's
bytes include its host copies.

Every key is always present; ``untrusted`` is None and ``exit_code`` 0 for a
pack whose preamble and header checksums hold. The ``checksums`` entry says
which checks held (``ok``), failed (``MISMATCH``) or could not run.
"""
from __future__ import annotations

import fnmatch
import os
import struct
from pathlib import Path

import xxhash

from orkpack.errors import PackError, escape_name
from orkpack.pack import spec
from orkpack.pack.model import summary as model_summary
from orkpack.pack.reader import Pack, PackDamaged, Preamble, parse_header_json, validate_header
from orkpack.transforms.smoothed import shown as smoothing_shown
from orkpack.transforms.rotate import shown as rotation_shown

UNTRUSTED = "UNTRUSTED"


def slice_resident_bytes(s: dict) -> int:
    """Bytes a slice occupies where it lives: NPU slices as int8 tiles (an nf4
    NPU slice is inflated to int8 at load), host slices as stored."""
    stored = sum(p["size"] for p in s["parts"].values())
    if s["tier"] == spec.TIER_NPU and s["encoding"] == spec.ENC_NF4:
        rows = s["shape"][0] if len(s["shape"]) == 2 else 1
        return s["inflate"]["q_size"] + 4 * rows
    return stored


def tier_label(s: dict) -> str:
    """Where a slice lives: its tier, or ``npu+host nf4`` for an NPU slice with an nf4 host copy."""
    hc = s.get("host_copy")
    return s["tier"] if not isinstance(hc, dict) else f"{s['tier']}+host {hc.get('encoding')}"


def pack_facts(path: Path, tensor_glob: str | None = None) -> dict:
    """Facts of the pack at ``path`` (see the module docstring for damaged packs)."""
    path = Path(path)
    try:
        with Pack.open(path) as pack:
            checks = {"preamble": "ok", "header": "ok", "data": "not checked (orkpack verify)"}
            return _facts(path, pack.preamble, pack.header, tensor_glob, checks, None, 0)
    except PackDamaged as e:
        err, code = e, 1
    except PackError as e:
        if "truncated" not in str(e):
            raise
        err, code = e, 2
    salvaged = _salvage(path, tensor_glob, str(err), code)
    if salvaged is None:  # not even a readable preamble: nothing to show
        raise err
    return salvaged


def untrusted_line(facts: dict) -> str | None:
    """The warning line the CLI prints for a damaged pack (None for a sound one)."""
    if not facts.get("untrusted"):
        return None
    return f"{UNTRUSTED}: {facts['untrusted']}; these facts come from a damaged pack (run `orkpack verify`)"


def _clean_provenance(prov) -> dict | None:
    """Provenance as shown: only well-typed source entries (the header is data, not code)."""
    if not isinstance(prov, dict):
        return None
    out = dict(prov)
    srcs = prov.get("sources")
    out["sources"] = [s for s in srcs if isinstance(s, dict) and isinstance(s.get("file"), str)] if isinstance(srcs, list) else []
    h = prov.get("hub")  # a hub model's origin (orkpack/sources/hub.py): shown only when every field is a string
    if "hub" in out and not (isinstance(h, dict) and all(isinstance(h.get(k), str) for k in ("repo", "revision", "commit"))
                             and isinstance(h.get("file", ""), str)):
        out.pop("hub")
    return out


def _skipped(prov: dict | None) -> list[dict]:
    """provenance.skipped (derivable buffers the build left out) as shown: well-typed fields only."""
    items = (prov or {}).get("skipped")
    out = []
    for it in items if isinstance(items, list) else []:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str):
            continue
        shape = it.get("shape")
        ok_shape = isinstance(shape, list) and len(shape) <= 64 and all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        out.append({
            "name": it["name"],
            "dtype": it["dtype"] if isinstance(it.get("dtype"), str) else None,
            "shape": shape if ok_shape else None,
            "reason": it["reason"] if isinstance(it.get("reason"), str) else None,
        })
    return out


def smoothing_label(r) -> str | None:
    """One tensor's activation smoothing (format 1.4), as shown: ``gain / s`` (a norm carrying the scales),
    ``rows / s`` (a projection carrying them), ``columns x s from NAME`` (a matrix that took them), ``bias / s``."""
    if not isinstance(r, dict) or not r:
        return None
    bits = []
    if isinstance(r.get("untied"), dict):
        bits.append(f"untied copy of {escape_name(str(r['untied'].get('from')), 80)}")
    for role, what in (("gain", "gain / s"), ("rows", "rows / s"), ("bias", "bias / s")):
        if isinstance(r.get(role), dict):
            rr = r[role]
            sc = rr.get("log2_scale")
            span = (f" (s 2^{min(sc)}..2^{max(sc)}, alpha {rr.get('alpha')})"
                    if isinstance(sc, list) and sc and all(isinstance(v, int) for v in sc) else "")
            bits.append(what + span)
    if isinstance(r.get("columns"), dict):
        bits.append(f"columns x s from {escape_name(str(r['columns'].get('from')), 80)}")
    return (", " if "untied" in r else "; ").join(bits) or "malformed"


def flag_names(flags: int) -> list[str]:
    """The preamble's flags as shown: ``online_r4`` (bit 0: the runtime rotates every ffn_down input), any other
    set bit as ``0x..`` (a reader refuses those; a salvaged preamble may still show one)."""
    out = ["online_r4"] if flags & spec.FLAG_ONLINE_R4 else []
    rest = flags & ~spec.FLAG_ONLINE_R4
    return out + ([f"0x{rest:x}"] if rest else [])


def rotation_label(r) -> str | None:
    """One tensor's rotation (format 1.6), as shown: ``gain folded`` (a norm, now 1), ``x diag(g) from NORM``,
    ``r1 on axis 1``, ``r2 per head on rows 128..192``, ``untied copy of NAME``."""
    if not isinstance(r, dict) or not r:
        return None
    if "unit" in r:
        return "gain folded into its matrices"
    bits = []
    if isinstance(r.get("untied"), dict):
        bits.append(f"untied copy of {escape_name(str(r['untied'].get('from')), 80)}")
    if "fold" in r:
        bits.append(f"x gain of {escape_name(str(r['fold']), 80)}")
    for e in r.get("rotate") or []:
        if isinstance(e, list) and len(e) == 4:
            w, ax, first, count = e
            bits.append(f"{escape_name(str(w), 4)} on axis {ax}" + (f" [{first}:{first + count}]" if first or w == "r2" else "")
                        + (" (its input rotated online)" if w == "r4" else ""))
    return ", ".join(bits) or "malformed"


def _clipping(prov: dict | None) -> dict | None:
    """provenance.clipping (orkpack/transforms/clip.py) as shown; None when the build did not clip."""
    c = (prov or {}).get("clipping")
    if not isinstance(c, dict):
        return None
    return {k: c.get(k) if isinstance(c.get(k), (int, str)) and not isinstance(c.get(k), bool) else None
            for k in ("slices", "rows", "stats")}


def smoothing_line(sm: dict | None) -> str | None:
    """One line of a pack's smoothing provenance, for people."""
    if not sm:
        return None
    al = sm.get("alpha")
    if al == "searched" and sm.get("alphas"):
        al = f"searched per group ({min(sm['alphas'])}..{max(sm['alphas'])})"
    ds = f", text {', '.join(escape_name(d, 60) for d in sm['datasets'])}" if sm.get("datasets") else ""
    hd = sm.get("head")
    hd = (f"; head untied from {escape_name(hd['untied_from'], 40)} and smoothed (alpha {hd['alpha']})"
          if isinstance(hd, dict) else "")
    return (f"{escape_name(str(sm.get('method')), 20)}: {sm.get('smoothed')} of {sm.get('groups')} groups, alpha {al}{hd}; "
            f"statistics {escape_name(str(sm.get('stats_file')), 80)} (xxh3 {escape_name(str(sm.get('stats_xxh3')), 20)}{ds})")


def _facts(path: Path, p: Preamble, h: dict | None, tensor_glob, checks: dict, untrusted: str | None, code: int) -> dict:
    residency = {t: {"slices": 0, "host_copies": 0, "resident_bytes": 0, "stored_bytes": 0} for t in spec.TIERS}
    encodings: dict[str, dict] = {}
    rows = []
    tensors = h["tensors"] if h else []
    for t in tensors:
        tsum = {"stored_bytes": 0, "resident_bytes": 0}
        slices = []
        for s in t["slices"]:
            stored = sum(pp["size"] for pp in s["parts"].values())
            res = slice_resident_bytes(s)
            r = residency[s["tier"]]
            r["slices"] += 1
            r["resident_bytes"] += res
            r["stored_bytes"] += stored
            e = encodings.setdefault(s["encoding"], {"slices": 0, "host_copies": 0, "stored_bytes": 0})
            e["slices"] += 1
            e["stored_bytes"] += stored
            tsum["stored_bytes"] += stored
            tsum["resident_bytes"] += res
            hc, copy = s.get("host_copy"), None
            if isinstance(hc, dict):  # dual residency: the copy is host memory, stored as is
                hb = sum(pp["size"] for pp in hc["parts"].values())
                host = residency[spec.TIER_HOST]
                host["host_copies"] += 1
                host["resident_bytes"] += hb
                host["stored_bytes"] += hb
                e = encodings.setdefault(hc["encoding"], {"slices": 0, "host_copies": 0, "stored_bytes": 0})
                e["host_copies"] += 1
                e["stored_bytes"] += hb
                tsum["stored_bytes"] += hb
                tsum["resident_bytes"] += hb
                copy = {
                    "encoding": hc["encoding"],
                    "layout": hc["layout"]["kind"],
                    "stored_bytes": hb,
                    "resident_bytes": hb,
                    "sqnr_db": hc.get("sqnr_db"),
                    "xxh3": {k: v["xxh3"] for k, v in hc["parts"].items()},
                }
            slices.append(
                {
                    "expert": s.get("expert"),
                    "encoding": s["encoding"],
                    "dtype": s.get("dtype") if s["encoding"] == spec.ENC_RAW else None,
                    "tier": s["tier"],
                    "placement": tier_label(s),  # tier, or "npu+host nf4" with a host copy
                    "layout": s["layout"]["kind"],
                    "stored_bytes": stored,
                    "resident_bytes": res,
                    "sqnr_db": s.get("sqnr_db"),
                    "min_m": s.get("min_m"),
                    "xxh3": {k: v["xxh3"] for k, v in s["parts"].items()},
                    "host_copy": copy,
                }
            )
        if tensor_glob and not fnmatch.fnmatchcase(t["name"], tensor_glob):
            continue
        encs = sorted({s["encoding"] for s in slices})
        dts = sorted({s["dtype"] for s in slices if s["dtype"] is not None})
        tiers = sorted({s["placement"] for s in slices})
        sq = [s["sqnr_db"] for s in slices if s["sqnr_db"] is not None]
        # what decode reads: a dual-resident slice's host NF4 copy, else the slice itself
        dsq = [(s["host_copy"] or s)["sqnr_db"] for s in slices if (s["host_copy"] or s)["sqnr_db"] is not None]
        rows.append(
            {
                "name": t["name"],
                "source_name": t["source_name"],
                "shape": t["shape"],
                "source_dtype": t["source_dtype"],
                "encoding": encs[0] if len(encs) == 1 else ("mixed" if encs else "none"),
                "dtype": dts[0] if len(dts) == 1 else None,  # raw tensors: the element type (i64, bool, ...)
                "tier": tiers[0] if len(tiers) == 1 else ("mixed" if tiers else "none"),
                "stored_bytes": tsum["stored_bytes"],
                "resident_bytes": tsum["resident_bytes"],
                "sqnr_db": min(sq) if sq else None,
                "decode_sqnr_db": min(dsq) if dsq else None,
                "smoothed": smoothing_label(t.get("smoothing")),
                "rotated": rotation_label(t.get("rotation")),
                "slices": slices,
            }
        )
    h = h or {}
    prov = _clean_provenance(h.get("provenance"))
    tm = h.get("tiermap")
    return {
        "file": path.name,
        "file_size": p.file_size,
        "format_version": f"{p.version_major}.{p.version_minor}",
        "flags": flag_names(p.flags),
        "tool": h.get("tool"),
        "checksums": checks,
        "data_size": p.data_size,
        "header_size": p.header_size,
        "provenance": prov,
        "arch": (prov or {}).get("arch"),
        "tiermap": None if tm is None else {k: v for k, v in tm.items() if k != "items"},
        "model": model_summary(h.get("model")),
        "tensor_count": len(tensors),
        "residency": residency,
        "encodings": encodings,
        "tensors": rows,
        "skipped": _skipped(prov),
        "smoothing": smoothing_shown(prov),
        "rotation": rotation_shown(prov),
        "clipping": _clipping(prov),
        "untrusted": untrusted,
        "exit_code": code,
    }


def _salvage(path: Path, tensor_glob, reason: str, code: int) -> dict | None:
    """What can still be read from a damaged or truncated pack, marked untrusted; None if nothing."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, spec.PREAMBLE_BLOCK, 0)
        if len(head) < spec.PREAMBLE_SIZE or head[:8] != spec.MAGIC:
            return None
        p = Preamble(*struct.unpack_from(spec.PREAMBLE_FMT, head))
        block = bytearray(head.ljust(spec.PREAMBLE_BLOCK, b"\0"))
        block[spec.PREAMBLE_XXH3_OFFSET: spec.PREAMBLE_XXH3_OFFSET + 8] = bytes(8)
        pre_ok = len(head) == spec.PREAMBLE_BLOCK and xxhash.xxh3_64_intdigest(bytes(block)) == p.preamble_xxh3
        checks = {
            "preamble": "ok" if pre_ok else "MISMATCH",
            "header": "missing (truncated)",
            "data": "not checked",
            "status": f"{UNTRUSTED} ({size} bytes on disk)",
        }
        header = None
        hoff, hsize = p.header_offset, p.header_size
        if 0 < hsize <= spec.MAX_HEADER_SIZE and spec.PREAMBLE_BLOCK <= hoff and hoff + hsize <= size:
            hb = os.pread(fd, hsize, hoff)
            checks["header"] = "ok" if xxhash.xxh3_64_intdigest(hb) == p.header_xxh3 else "MISMATCH"
            try:
                h = parse_header_json(hb, "")
            except PackError:
                h = None
                checks["header"] += ", not valid JSON"
            if h is not None:
                # bound everything by what is really on disk, not by the damaged preamble
                safe = p._replace(data_offset=spec.PREAMBLE_BLOCK, header_offset=min(hoff, size))
                why = validate_header(h, safe)
                if why is None:
                    header = h
                else:
                    checks["header"] += f", inconsistent ({why})"
        return _facts(path, p, header, tensor_glob, checks, reason, code)
    finally:
        os.close(fd)
