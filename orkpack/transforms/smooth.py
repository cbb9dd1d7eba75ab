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

from .. import stats as act_stats
from ..codecs import reference as ref
from ..errors import OrkError, escape_name
from ..sources.base import as_float32

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
    """The statistics file (``orkpack imatrix``, orkpack/stats/); OrkError with one line if unusable."""
    return act_stats.load(Path(path))


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
    from ..model import forward  # here: the forward pass (and scipy) only for a build that smooths
    from ..model.hparams import NotEvaluable

    where = f"statistics {escape_name(str(stats_path))}"
    try:
        hp = forward.model_hparams(src)
    except NotEvaluable as e:
        raise OrkError(f"--imatrix: cannot smooth this model: {e}") from None
    stats = stats if stats is not None else load_stats(stats_path)
    names_shapes = {i.name: tuple(i.shape) for i in infos}
    gs = groups(names_shapes, hp.fwd, hp.n_layers)
    if getattr(getattr(src, "plan", None), "r4", None):  # R4 online between ffn_up's rows and ffn_down's columns
        gs = [g for g in gs if not any(".ffn_down" in m for m in g.matrices)]
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
        # recorded in every smoothed pack: word for word (the module's old path), so that packs stay byte-identical
        "score": "expected w8a8 output error from the statistics (orkpack/smooth.py)",
        "error_ratio": round(tot / tot_base, 4) if tot_base > 0 else None,
    } | ({} if head is None else {"head": head})
    return p, warnings
