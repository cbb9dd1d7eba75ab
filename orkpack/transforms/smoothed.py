"""What a pack says its smoothing was (docs/FORMAT.md section 10), read back: the operations each tensor took, the
untied copies, the checks that the records hold together and that an untied copy's values are what they say, the
provenance as shown, and the smoothed float model a pack's weights quantize (for item-by-item comparisons). The
choice and the application at build time: :mod:`orkpack.transforms.smooth`."""
from __future__ import annotations

import numpy as np

from ..codecs import rows
from ..errors import escape_name
from .smooth import _LOG2_CAP, transform




def ops_of(pack) -> dict[str, list[tuple]]:
    """Per tensor of a pack, the smoothing operations its records say it took (:func:`transform`); {} without."""
    scales: dict[str, tuple[np.ndarray, int]] = {}
    for t in pack.tensors:
        r = t.get("smoothing")
        for role in ("gain", "rows"):
            if isinstance(r, dict) and isinstance(r.get(role), dict):
                rr = r[role]
                scales[t["name"]] = (np.ldexp(np.float32(1), np.asarray(rr["log2_scale"], np.int32)).astype(np.float32),
                                     int(rr.get("first", 0)))
    out: dict[str, list[tuple]] = {}
    for t in pack.tensors:  # in the order a build applies them: columns, then the carrier's own
        r = t.get("smoothing")
        if not isinstance(r, dict):
            continue
        if isinstance(r.get("columns"), dict):
            out.setdefault(t["name"], []).append(("columns", scales[r["columns"]["from"]][0]))
        if isinstance(r.get("gain"), dict):
            out.setdefault(t["name"], []).append(("gain", scales[t["name"]][0]))
        if isinstance(r.get("rows"), dict):
            out.setdefault(t["name"], []).append(("div", *scales[t["name"]]))
        if isinstance(r.get("bias"), dict):
            out.setdefault(t["name"], []).append(("div", *scales[r["bias"]["from"]]))
    return out


def untied_of(pack) -> dict[str, str]:
    """Per tensor a pack holds as a smoothed copy of another (the untied head), the tensor it copies; {} without."""
    return {t["name"]: t["smoothing"]["untied"]["from"] for t in pack.tensors
            if isinstance(t.get("smoothing"), dict) and isinstance(t["smoothing"].get("untied"), dict)}


def check_pack(pack) -> str | None:
    """Why a pack's smoothing records do not hold together, or None: each carrier's scales are integers in range,
    one per input column of each matrix it names; each of those matrices names it back; a bias names a carrier; an
    untied copy (the head) is a smoothed matrix of its original's shape, and the original is not smoothed."""
    recs = {t["name"]: t for t in pack.tensors if t.get("smoothing") is not None}
    shapes = {t["name"]: t["shape"] for t in pack.tensors}
    for name, t in recs.items():
        r, label = t["smoothing"], escape_name(name)
        if not isinstance(r, dict) or not r or set(r) - {"columns", "gain", "rows", "bias", "untied"} \
                or not all(isinstance(v, dict) for v in r.values()):
            return f"{label}: malformed smoothing record"
        if "untied" in r:
            src = r["untied"].get("from")
            if "columns" not in r or not isinstance(src, str) or src == name:
                return f"{label}: an untied copy must name its original and take smoothed columns"
            if src not in shapes or shapes[src] != t["shape"]:
                return f"{label}: untied from {escape_name(str(src))}, which the pack does not hold in its shape"
            if src in recs:
                return f"{label}: its original {escape_name(src)} is smoothed too; it must hold the source's values"
        for role in ("gain", "rows"):
            if role not in r:
                continue
            rr, shape = r[role], t["shape"]
            sc, first = rr.get("log2_scale"), rr.get("first", 0)
            want = (len(shape) == 1) if role == "gain" else (len(shape) == 2)
            if not (want and isinstance(sc, list) and sc and isinstance(first, int) and first >= 0
                    and first + len(sc) == shape[0]
                    and all(isinstance(v, int) and not isinstance(v, bool) and abs(v) <= _LOG2_CAP for v in sc)):
                return f"{label}: smoothing scales do not fit the tensor (powers of two in range, one per carried entry, to its end)"
            mats = rr.get("matrices")
            if not isinstance(mats, list) or not mats:
                return f"{label}: smoothing record names no matrices"
            for m in mats:
                mt = recs.get(m) if isinstance(m, str) else None
                c = mt["smoothing"].get("columns") if mt is not None and isinstance(mt["smoothing"], dict) else None
                if not isinstance(c, dict) or c.get("from") != name:
                    return f"{label}: smoothed matrix {escape_name(str(m))} does not name this carrier back"
                if len(mt["shape"]) != 2 or mt["shape"][1] != len(sc):
                    return f"{escape_name(m)}: {mt['shape']} does not take {len(sc)} smoothing scales"
        for role in ("columns", "bias"):
            if role not in r:
                continue
            n = r[role].get("from")
            nt = recs.get(n) if isinstance(n, str) else None
            car = nt["smoothing"] if nt is not None and isinstance(nt["smoothing"], dict) else {}
            ok = any(isinstance(car.get(x), dict) and (role == "bias" or name in car[x].get("matrices", []))
                     for x in ("gain", "rows"))
            if not ok:
                return f"{label}: its smoothing carrier {escape_name(str(n))} does not carry its scales"
    return None


def check_untied_values(pack) -> str | None:
    """Why an untied copy's values are not its original's columns times the recorded scales, or None. Both are
    decoded as the CPU reads them; per column k the least-squares factor r_k of copy on original must round to
    the recorded power of two (|log2 r_k - e_k| < 1/2): int8 or NF4 rounding moves it by far less, and int8
    clipping (each row to at least 0.8 of its max, orkpack/transforms/clip.py) by at most log2(1/0.8) = 0.32, so a forged
    scale or a copy of another tensor is caught."""
    ops = ops_of(pack)
    by_name = {t["name"]: s for t, s in pack.slices() if s["expert"] is None}
    for name, src in untied_of(pack).items():
        col = next((op[1] for op in ops.get(name, []) if op[0] == "columns"), None)
        if col is None:
            return f"{escape_name(name)}: untied copy without smoothing scales"
        if name not in by_name or src not in by_name or len(by_name[name]["shape"]) != 2:
            return f"{escape_name(name)}: untied copy or its original {escape_name(src)} is not a matrix of the pack"
        (a, _), (b, _) = rows.cpu_rows(pack, by_name[name]), rows.cpu_rows(pack, by_name[src])
        if a is None or b is None:
            return f"{escape_name(name)}: untied copy or its original {escape_name(src)} holds no weights"
        n, k = by_name[name]["shape"]
        num = np.zeros(k, np.float64)
        den = np.zeros(k, np.float64)
        for r in range(0, n, 4096):
            x, y = a(r, min(n, r + 4096)).astype(np.float64), b(r, min(n, r + 4096)).astype(np.float64)
            num += (x * y).sum(axis=0)
            den += (y * y).sum(axis=0)
        ok = den > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            r_k = np.where(ok, num / np.where(ok, den, 1.0), 1.0)
        bad = ok & ~(np.abs(np.log2(np.maximum(r_k, 1e-30)) - np.log2(col.astype(np.float64))) < 0.5)
        if bad.any():
            k = int(np.nonzero(bad)[0][0])
            return (f"{escape_name(name)}: column {k} is {r_k[k]:.4g} x {escape_name(src)}'s, not the recorded "
                    f"2^{int(np.log2(col[k]))} ({int(bad.sum())} columns differ)")
    return None


class Smoothed:
    """A weight provider over the source's float weights, smoothed as a pack was (``ops``: :func:`ops_of`): the
    float model the pack's weights quantize, for comparisons item by item (eval --per-tensor, --sensitivity)."""

    def __init__(self, inner, ops: dict[str, list[tuple]], norm_offset: float = 0.0, untied: dict | None = None):
        self.inner, self.ops, self.off = inner, ops, norm_offset
        self.untied = untied or {}  # a pack's untied copy (output.weight) -> the source tensor it copies

    def has(self, name):
        return name in self.untied or self.inner.has(name)

    def tensor(self, name):
        v = self.inner.tensor(self.untied.get(name, name))
        return transform(v, self.ops[name], self.off) if name in self.ops else v

    def matmul(self, name, x, expert=None):
        ops = self.ops.get(name)
        name = self.untied.get(name, name)
        if not ops:
            return self.inner.matmul(name, x, expert)
        for op in ops:
            if op[0] == "columns":
                x = (x * op[1][None, :]).astype(np.float32)
        y = self.inner.matmul(name, x, expert)
        for op in ops:
            if op[0] == "div":
                y[:, op[2]: op[2] + op[1].size] /= op[1][None, :]
        return y

    def embed(self, ids, name="token_embd.weight"):
        return self.inner.embed(ids, name)

    def release(self):
        self.inner.release()


def shown(prov: dict | None) -> dict | None:
    """provenance.smoothing (format 1.4) as shown: well-typed fields only; None when the build did not smooth."""
    sm = (prov or {}).get("smoothing")
    if not isinstance(sm, dict):
        return None
    st = sm.get("stats") if isinstance(sm.get("stats"), dict) else {}
    hd = sm.get("head") if isinstance(sm.get("head"), dict) else {}
    head = {"untied_from": hd["untied_from"], "alpha": hd.get("alpha") if isinstance(hd.get("alpha"), (int, float)) else None} \
        if isinstance(hd.get("untied_from"), str) else None
    return {
        "method": sm.get("method") if isinstance(sm.get("method"), str) else None,
        "alpha": sm.get("alpha") if isinstance(sm.get("alpha"), (str, int, float)) else None,
        "alphas": [a for a in sm.get("alphas", []) if isinstance(a, (int, float))] if isinstance(sm.get("alphas"), list) else [],
        "groups": sm.get("groups") if isinstance(sm.get("groups"), int) else None,
        "smoothed": sm.get("smoothed") if isinstance(sm.get("smoothed"), int) else None,
        "stats_file": st.get("file") if isinstance(st.get("file"), str) else None,
        "stats_xxh3": st.get("xxh3") if isinstance(st.get("xxh3"), str) else None,
        "datasets": [d for d in st.get("datasets", []) if isinstance(d, str)] if isinstance(st.get("datasets"), list) else [],
        "head": head,  # the tied head, untied and smoothed (orkpack/transforms/smooth.py), or None
    }
