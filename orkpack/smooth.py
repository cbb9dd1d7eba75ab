"""Activation smoothing (SmoothQuant, arXiv 2211.10438), folded into the weights at build time.

The NPU multiplies int8 weights by int8 activations quantized per token (one scale per row of A):
a few outlier input channels set every token's scale and the other channels lose their bits. Where
the graph allows (declared per family, :class:`orkpack.archs.Smooth`), a per-channel scale ``s``
moves that range into the weights without changing the model: a *carrier* (a norm's gain and bias:
the attention norm -> q/k/v, the FFN norm -> gate/up; or the output rows of a gated FFN's up
projection -> down, since down(act(gate) * up) is linear in up) is divided by ``s`` and each matrix
it feeds takes ``W[:, k] * s[k]``, so ``(x / s) @ (W * s).T == x @ W.T``. The runtime is not told:
the pack holds the smoothed weights, and every path (NPU tiles, host copies, host items) encodes
the same smoothed weights. Records: docs/FORMAT.md section 10.

A tied output head (``token_embd.weight`` doubles as the head) is fed by the final norm, but its matrix is also
the embedding, whose row lookups must stay unsmoothed. When the head runs int8 on the NPU (``plan(...,
untie_head=True)``), the build stores a smoothed copy ``output.weight`` (token_embd's columns times ``s``) beside
the unsmoothed embedding and divides ``output_norm.weight`` by ``s``: the pack then holds an untied model, which
every runtime runs as such (llama.cpp uses ``output.weight`` when a model has one). Its weights' error is counted
once (:data:`HEAD_WEIGHT_FACTOR`), not 3x: docs/EVAL.md.

Every ``s[k]`` is a power of two, so the smoothing is exact in float32 as well (a product of a
float and a power of two is exact, barring underflow): a row's int8 codes under row scaling are
unchanged, and the smoothed float model gives the source's logits. Gemma's HF gains (stored without
their ``1 +``) are exact up to one rounding.

Choice of ``s`` per group (one carrier and the matrices it feeds), from the statistics of
``orkpack imatrix`` (per input column: the mean square ``m[k]`` and the max ``a[k]`` of |x|):
SmoothQuant's ``s = a^alpha / w^(1 - alpha)`` (``w[k]``: the largest |W[:, k]| over the group's
matrices), normalized to geometric mean 1 and rounded to powers of two. With ``--smooth-alpha`` one
alpha for every group; otherwise searched per group (0, 0.1, ..., 1, then the best's neighbours at
0.05, and no smoothing at all), keeping the least expected w8a8 output error (:func:`w8a8_error`),
scored on the statistics (not on a calibration run): the weights' part exactly (each matrix
quantized int8 per channel as the pack stores it, its squared error per column weighted by the
column's mean square) plus the activations' part (uniform rounding noise of a per-token int8 step,
the step from the expected largest |x| of a token: :func:`token_range_sq`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .codecs import reference as ref
from .errors import OrkError, escape_name

ALPHAS = tuple(round(0.05 * i, 2) for i in range(21))
METHOD = "smoothquant"
_LOG2_CAP = 24  # |log2 s| at most this: far beyond any useful smoothing, far from float32's limits


@dataclass
class Group:
    """One carrier and the matrices of its layer it feeds (canonical names)."""
    layer: int
    carrier: str  # a norm gain (blk.3.attn_norm.weight) or a matrix whose rows carry 1/s (blk.3.ffn_up.weight)
    kind: str  # gain | rows
    bias: str | None  # the carrier's bias (a LayerNorm's, a projection's), when it has one
    matrices: list[str]
    offset: int = 0  # rows: the first row that carries (a fused gate_up: its up half)
    untied: str | None = None  # the head: its one matrix (output.weight) is a copy of this tensor (token_embd.weight)


@dataclass
class Plan:
    """What a build applies: per tensor name, its operations (the same as a pack's records say, :func:`ops_of`)."""
    ops: dict[str, list[tuple]] = field(default_factory=dict)
    records: dict[str, dict] = field(default_factory=dict)  # tensor name -> its header record
    provenance: dict | None = None
    norm_offset: float = 0.0
    untied: dict[str, str] = field(default_factory=dict)  # a new tensor -> the source tensor it copies (output.weight)

    def apply(self, name: str, arr: np.ndarray) -> np.ndarray:
        """The tensor ``name`` (as read from the source, any float dtype) as the pack stores it: smoothed, float32;
        unchanged (the same array) when it is in no group."""
        ops = self.ops.get(name)
        if not ops:
            return arr
        from .sources.base import as_float32

        return transform(as_float32(arr), ops, self.norm_offset)


def smoothed_mean_sq(m: np.ndarray, ops: list[tuple]) -> np.ndarray:
    """The mean squares of a matrix's input columns once smoothed: its columns took ``W[:, k] * s[k]`` (its
    ``("columns", s)`` operations), so the input it meets is ``x / s``: ``m / s^2`` (float64)."""
    m = np.asarray(m, np.float64)
    for op in ops:
        if op[0] == "columns":
            m = m / (op[1].astype(np.float64) ** 2)
    return m


def transform(v: np.ndarray, ops: list[tuple], norm_offset: float = 0.0) -> np.ndarray:
    """A tensor's values (float32) under its smoothing operations:
    ``("columns", s)``: W[:, k] * s[k]; ``("gain", s)``: a norm gain g / s (Gemma's HF gain, stored without its
    offset: (off + g) / s - off); ``("div", s, r0)``: entries (rows of a matrix, or a 1-D bias) r0 .. r0 + len(s)
    divided by s."""
    out = np.array(v, dtype=np.float32, copy=True)
    for op in ops:
        s = op[1]
        if op[0] == "columns":
            out *= s[None, :]
        elif op[0] == "gain":
            out = (out / s) if not norm_offset else ((out + np.float32(norm_offset)) / s - np.float32(norm_offset))
        else:
            r0 = op[2]
            seg = out[r0: r0 + s.size]
            seg /= (s[:, None] if out.ndim == 2 else s)
    return out.astype(np.float32, copy=False)


def groups(names_shapes: dict[str, tuple], fwd, n_layers: int) -> list[Group]:
    """The groups a model's tensors allow under its family's declaration (``Forward.smooth``): the carrier there
    (a 1-D norm, or a 2-D matrix with as many carrying rows as the matrices' K), its needs there, no blockers,
    at least one of the matrices there, all of them 2-D with that K."""
    out = []
    for i in range(n_layers):
        p = f"blk.{i}."
        present = {n[len(p):].rsplit(".", 1)[0] for n in names_shapes if n.startswith(p)}
        for g in fwd.smooth:
            if any(b in present for b in g.blockers) or not all(n in present for n in g.needs):
                continue
            carrier = p + (g.norm or g.rows) + ".weight"
            shape = names_shapes.get(carrier)
            if shape is None:
                continue
            if g.norm:
                if len(shape) != 1:
                    continue
                k, kind, off = shape[0], "gain", 0
            else:
                if len(shape) != 2 or (g.half and shape[0] % 2):
                    continue
                k, kind, off = (shape[0] // 2, "rows", shape[0] // 2) if g.half else (shape[0], "rows", 0)
            mats = [p + m + ".weight" for m in g.matrices if p + m + ".weight" in names_shapes]
            if not mats or any(len(names_shapes[m]) != 2 or names_shapes[m][1] != k for m in mats):
                continue
            bias = p + (g.norm or g.rows) + ".bias"
            out.append(Group(i, carrier, kind, bias if bias in names_shapes else None, mats, off))
    return out


HEAD = "output.weight"
EMBED = "token_embd.weight"
HEAD_NORM = "output_norm.weight"


def head_group(names_shapes: dict[str, tuple]) -> Group | None:
    """The tied head's group, or None: a model with no output.weight whose token_embd.weight [V, K] is fed, as
    the head, by a 1-D output_norm.weight of K (every family's forward pass: the final norm, then the head)."""
    e, g = names_shapes.get(EMBED), names_shapes.get(HEAD_NORM)
    if HEAD in names_shapes or e is None or g is None or len(e) != 2 or tuple(g) != (e[1],):
        return None
    bias = "output_norm.bias"
    return Group(-1, HEAD_NORM, "gain", bias if bias in names_shapes else None, [HEAD], untied=EMBED)


def _int8_sq_err_cols(w: np.ndarray) -> np.ndarray:
    """Per input column, the summed squared error of ``w``'s int8 per-channel encoding (as the pack stores it)."""
    q, scale = ref.int8_encode(w)
    d = ref.int8_decode(q, scale).astype(np.float64) - w
    return (d * d).sum(axis=0)


WEIGHT_FACTOR = 3.0  # the weights' error counts 3x: it reaches decode too (NF4 host copies), and is systematic (chosen from 1, 3, 10 on SmolLM2: docs/EVAL.md)
HEAD_WEIGHT_FACTOR = 1.0  # the head's weights' error counts once: counted 3x, the search picks an alpha that raises
# the head's true w8a8 KLD (SmolLM2: docs/EVAL.md, bench/head_w8a8.py)
RANGE = "rms"  # how a token's largest |x| is estimated: rms (from the mean squares) | absmax (the columns' max)


def token_range_sq(ms: np.ndarray, a: np.ndarray) -> float:
    """The expected square of one token's largest |x| over its columns, from the columns' mean squares ``ms``
    (and max |x| ``a``): the largest mean square (an outlier channel, which most tokens share), or the expected
    maximum of K similar columns (2 ln K times their mean square), whichever is larger."""
    if RANGE == "absmax":
        return float(a.max()) ** 2
    return max(float(ms.max()), 2.0 * math.log(max(ms.size, 2)) * float(ms.mean()))


def w8a8_error(mats: list[np.ndarray], m: np.ndarray, a: np.ndarray, s: np.ndarray,
               weight_factor: float = WEIGHT_FACTOR) -> float:
    """Expected squared output error per token of the group's matrices in w8a8 under smoothing ``s``
    (see the module docstring): the int8 weights' part plus the int8-per-token activations' part."""
    s64 = s.astype(np.float64)
    ms = m / (s64 * s64)
    step = math.sqrt(token_range_sq(ms, a / s64)) / 127.0
    e = 0.0
    for w in mats:
        ws = w * s[None, :]
        e += weight_factor * float(_int8_sq_err_cols(ws) @ ms)
        e += step * step / 12.0 * float((ws.astype(np.float64) ** 2).sum())
    return e


def pow2_scales(a: np.ndarray, wmax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's ``a^alpha / w^(1-alpha)``, normalized to geometric mean 1, rounded to powers of two
    (float32); 1 where a column has no activation or no weight."""
    ok = (a > 0) & (wmax > 0)
    lg = np.zeros(a.shape, np.float64)
    lg[ok] = alpha * np.log2(a[ok]) - (1 - alpha) * np.log2(wmax[ok])
    if ok.any():
        lg[ok] -= lg[ok].mean()
    e = np.clip(np.rint(lg), -_LOG2_CAP, _LOG2_CAP)
    return np.ldexp(np.float32(1), e.astype(np.int32)).astype(np.float32)


def choose(mats: list[np.ndarray], m: np.ndarray, a: np.ndarray, alpha: float | None = None,
           weight_factor: float = WEIGHT_FACTOR) -> tuple[np.ndarray, float | None, float, float]:
    """(s, alpha chosen (None: no smoothing), its error, the error without smoothing) for one group."""
    w8a8 = lambda s: w8a8_error(mats, m, a, s, weight_factor)  # noqa: E731
    wmax = np.max([np.abs(w).max(axis=0) for w in mats], axis=0).astype(np.float64)
    one = np.ones(m.shape, np.float32)
    base = w8a8(one)
    if alpha is not None:
        s = pow2_scales(a, wmax, alpha)
        return s, alpha, w8a8(s), base
    best = (one, None, base)
    tried: dict = {}

    def consider(al: float) -> None:
        nonlocal best
        if al in tried or al not in ALPHAS:
            return
        s = pow2_scales(a, wmax, al)
        e = tried[al] = w8a8(s)
        if e < best[2]:
            best = (s, al, e)

    for al in ALPHAS[::2]:  # 0, 0.1, ..., 1; then the neighbours of the best (the error is smooth in alpha)
        consider(al)
    if best[1] is not None:
        i = ALPHAS.index(best[1])
        for j in (i - 1, i + 1):
            if 0 <= j < len(ALPHAS):
                consider(ALPHAS[j])
    return best[0], best[1], best[2], base


def load_stats(path: Path):
    """The statistics file (``orkpack imatrix``), through orkpack.eval.imatrix; OrkError with one line if unusable."""
    from .eval import imatrix

    return imatrix.load(Path(path))


class _NoMaxima(Exception):
    pass


def _stats_for(stats, g: Group, k: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(mean square, max |x|) of the group's input columns: the statistics of its first matrix (every matrix of
    a group reads the same input); the head's under output.weight (llama.cpp's name) or, gathered from the tied
    model, token_embd.weight."""
    have = [n for n in g.matrices + ([g.untied] if g.untied else []) if n in stats]
    if not have:
        raise OrkError(f"{where}: has no statistics for {escape_name(g.matrices[0])}: gathered from another model? "
                       "Gather them from this source: orkpack imatrix SOURCE -o FILE")
    name = have[0]
    e = stats.entries[name]
    if np.shape(e.sum2)[-1] != k:
        raise OrkError(f"{where}: statistics of {escape_name(name)} have {np.shape(e.sum2)[-1]} columns, the matrix has "
                       f"{k}: gathered from another model; gather them from this source: orkpack imatrix SOURCE -o FILE")
    m, a = stats.mean_sq(name, k=k), stats.absmax(name, k=k)
    if m is None:
        raise OrkError(f"{where}: no token reached {escape_name(name)}; gather the statistics on a longer text")
    if a is None:
        raise _NoMaxima(f"{where} has no per-column max |x| for {escape_name(name)} (a llama.cpp imatrix holds only "
                        "mean squares): not smoothed; orkpack imatrix SOURCE -o FILE gathers them")
    m, a = np.asarray(m, np.float64).reshape(-1), np.asarray(a, np.float64).reshape(-1)
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(a)) and np.all(m >= 0) and np.all(a >= 0)):
        raise OrkError(f"{where}: statistics of {escape_name(name)} hold negative or non-finite values; gather "
                       "them again: orkpack imatrix SOURCE -o FILE")
    return m, a


def plan(src, infos, stats_path: Path, stats=None, *, alpha: float | None = None,
         stats_hash: str | None = None, untie_head: bool = False) -> tuple[Plan, list[str]]:
    """The smoothing of every group the source allows, chosen from the statistics at ``stats_path``; with
    ``untie_head`` also the tied head's, as an untied smoothed copy (module docstring) when its search smooths.
    Returns (plan, warning lines). OrkError (one line) for a model the forward pass cannot describe or
    statistics that do not fit it."""
    from .model import forward
    from .model.hparams import NotEvaluable
    from .sources.base import as_float32

    where = f"statistics {escape_name(str(stats_path))}"
    try:
        hp = forward.model_hparams(src)
    except NotEvaluable as e:
        raise OrkError(f"--imatrix: cannot smooth this model: {e}") from None
    stats = stats if stats is not None else load_stats(stats_path)
    names_shapes = {i.name: tuple(i.shape) for i in infos}
    gs = groups(names_shapes, hp.fwd, hp.n_layers)
    hg = head_group(names_shapes) if untie_head else None
    warnings = []
    if not gs and hg is None:
        warnings.append("--imatrix: this model has no norm-fed matrices to smooth; nothing smoothed")
    p = Plan(norm_offset=float(hp.norm_offset))
    chosen: list[float | None] = []
    gain = []
    head = None
    for g in gs + ([hg] if hg is not None else []):
        k = names_shapes[g.untied or g.matrices[0]][1]
        try:
            m, a = _stats_for(stats, g, k, where)
        except _NoMaxima as e:  # a llama.cpp imatrix: usable for clipping, not for smoothing
            return Plan(), warnings + [str(e)]
        mats = [np.ascontiguousarray(as_float32(src.read(g.untied or n)), dtype=np.float32) for n in g.matrices]
        s, al, err, base = choose(mats, m, a, alpha, HEAD_WEIGHT_FACTOR if g.untied else WEIGHT_FACTOR)
        del mats
        if g.untied:
            if al is None:  # nothing to gain: the head stays tied, and nothing is recorded
                continue
            head = {"untied_from": g.untied, "alpha": al, "error_ratio": round(err / base, 4) if base > 0 else None}
            p.untied[g.matrices[0]] = g.untied
            p.records.setdefault(g.matrices[0], {})["untied"] = {"from": g.untied}
        else:
            chosen.append(al)
            gain.append((base, err))
        if al is None:
            continue
        for n in g.matrices:
            p.ops.setdefault(n, []).append(("columns", s))
            p.records.setdefault(n, {})["columns"] = {"from": g.carrier, "alpha": al}
        log2 = [int(v) for v in np.rint(np.log2(s.astype(np.float64)))]
        rec = {"matrices": list(g.matrices), "alpha": al, "log2_scale": log2}
        if g.kind == "gain":
            p.ops.setdefault(g.carrier, []).append(("gain", s))
            p.records.setdefault(g.carrier, {})["gain"] = rec
        else:
            p.ops.setdefault(g.carrier, []).append(("div", s, g.offset))
            p.records.setdefault(g.carrier, {})["rows"] = rec | {"first": g.offset}
        if g.bias:
            p.ops.setdefault(g.bias, []).append(("div", s, g.offset))
            p.records.setdefault(g.bias, {})["bias"] = {"from": g.carrier, "first": g.offset}
    n_s = sum(a is not None for a in chosen)
    tot_base = sum(b for b, _ in gain)
    tot = sum(e for _, e in gain)
    p.provenance = {
        "method": METHOD,
        "alpha": "searched" if alpha is None else alpha,
        "alphas": sorted({a for a in chosen if a is not None}),
        "stats": {"file": Path(stats_path).name, "xxh3": stats_hash,
                  "datasets": list(getattr(stats, "datasets", []) or []),
                  "chunks": getattr(stats, "chunk_count", None), "chunk_size": getattr(stats, "chunk_size", None)},
        "groups": len(gs),
        "smoothed": n_s,
        "score": "expected w8a8 output error from the statistics (orkpack/smooth.py)",
        "error_ratio": round(tot / tot_base, 4) if tot_base > 0 else None,
    } | ({} if head is None else {"head": head})
    return p, warnings


# -------------------------------------------------------------------------------------- reading a pack



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
    clipping (each row to at least 0.8 of its max, orkpack/clip.py) by at most log2(1/0.8) = 0.32, so a forged
    scale or a copy of another tensor is caught."""
    from .eval.weights import PackWeights

    ops = ops_of(pack)
    w = PackWeights(pack, "decode")
    for name, src in untied_of(pack).items():
        col = next((op[1] for op in ops.get(name, []) if op[0] == "columns"), None)
        if col is None:
            return f"{escape_name(name)}: untied copy without smoothing scales"
        a, b = w._cpu_operand(w._slice(name, None)), w._cpu_operand(w._slice(src, None))
        num = np.zeros(a.k, np.float64)
        den = np.zeros(a.k, np.float64)
        for r in range(0, a.n, 4096):
            x, y = a.rows(r, min(a.n, r + 4096)).astype(np.float64), b.rows(r, min(a.n, r + 4096)).astype(np.float64)
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

    def embed(self, ids):
        return self.inner.embed(ids)

    def release(self):
        self.inner.release()
