"""Hotness profiles: how much prefill time each item saves on the NPU, and how much int8 matters for it.

One documented, versioned JSON schema (docs/TIERMAP.md "Hotness profile") and importers:

* analytic (the default, ``path=None``): benefit = t_cpu(m) - t_npu(m) at the item's
  rows per prefill chunk m (cost.py), 0 when m < min_m (the router would keep it on
  the CPU). m = ``prefill_m`` for dense matmuls; ``prefill_m * routing[e]`` for expert e
  (routing = the fraction of tokens routed to it, uniform ``top_k / n_experts`` unless
  a profile says otherwise); 1 for the output head (prefill needs the last row's
  logits only); 0 for the embedding (a lookup, not a matmul). Sensitivity: the
  KLD the item adds as NF4 rather than int8, by the rule of ``default_sensitivity``
  (docs/TIERMAP.md section 3).
* JSON (``.json``): per tensor ``benefit_us``, ``routing``, ``sensitivity``.
* llama.cpp imatrix, GGUF (``general.type = imatrix``: ``<t>.in_sum2``, ``<t>.counts``)
  or legacy ``.dat``: per-expert counts give routing (GGUF only), activation energy
  gives sensitivity.
* measured timing table (``.csv``: tensor, calls, total_us).

Names may be canonical, HF, expert-slice (``blk.N.ffn_gate.E.weight``) or item
names (``name[e]``). Names the model lacks raise OrkError listing them unless
``ignore_unknown``; items a profile lacks keep the analytic value.
"""
from __future__ import annotations

import csv
import functools
import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import OrkError, escape_name
from ..files import is_file
from ..sources import names as _names
from . import cost
from .board import Board
from .manifest import Item, Manifest

PROFILE_SCHEMA = "orkpack.hotness"
PROFILE_VERSION = 1
_ITEM = re.compile(r"^(.*)\[(\d+)\]$")


@dataclass
class Profile:
    """Per item (manifest order): benefit in seconds per prefill chunk, sensitivity, m, min_m."""

    kind: str  # analytic | json | imatrix | csv
    source: str  # file name or "analytic"
    prefill_m: int
    benefit: list[float]
    sensitivity: list[float]
    m_eff: list[float]
    min_m: list[int]
    t_cpu: list[float]  # seconds per chunk of the host NF4 path at m_eff rows (measured, for a timing CSV)
    t_npu: list[float]  # seconds per chunk on the NPU at m_eff rows (t_cpu - benefit_us, if a profile gives it)
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- name resolution

class _Resolver:
    def __init__(self, manifest: Manifest):
        self.m = manifest
        self.stacked: dict[str, list[int]] = {}
        for i, it in enumerate(manifest.items):
            if it.expert is not None:
                self.stacked.setdefault(it.tensor, []).append(i)
        self.floats = {t.name for t in manifest.floats}
        self.L = manifest.facts["n_layers"]

    @functools.cached_property
    def index(self) -> dict[tuple[str, int | None], int]:
        """Each item's index by its (tensor, expert): made when a name is not a whole stack's (a profile of stacked
        tensors alone, as a routing profile is, never needs it; it is 18,626 keys for Qwen3-30B-A3B)."""
        return {it.key: i for i, it in enumerate(self.m.items)}

    def resolve(self, name: str) -> tuple[str, list[int]] | None:
        """(kind, item indices): kind 'item', 'stacked' or 'float'; None if unknown."""
        expert = None
        m = _ITEM.match(name)
        if m:
            name, expert = m.group(1), int(m.group(2))
        canon = _names.normalize_name(name, self.m.arch, self.L)
        sp = _names.split_expert(canon)
        if sp is not None:
            canon, expert = sp
        if expert is not None:
            i = self.index.get((canon, expert))
            return None if i is None else ("item", [i])
        if canon in self.stacked:
            return ("stacked", self.stacked[canon])
        i = self.index.get((canon, None))
        if i is not None:
            return ("item", [i])
        if canon in self.floats:
            return ("float", [])
        return None


def _unknown(unknown: list[str], where: str, ignore: bool, warnings: list[str]) -> None:
    if not unknown:
        return
    shown = ", ".join(escape_name(u, 80) for u in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
    msg = f"{where}: {len(unknown)} name(s) are not in the model: {shown}"
    if not ignore:
        raise OrkError(msg + "; check that the profile belongs to this model, or pass --ignore-unknown")
    warnings.append(msg + " (ignored)")


# --------------------------------------------------------------------------------------------- analytic

def _analytic_m(it: Item, prefill_m: int, routing: float | None) -> float:
    if it.role in ("embedding", "lookup", "vision"):  # a row lookup; an image encoder that text prefill never runs
        return 0.0
    if it.role == "output":
        return 1.0
    if it.role == "expert":
        r = routing if routing is not None else (it.n_experts_used / it.n_experts if it.n_experts else 0.0)
        return prefill_m * r
    return float(prefill_m)


def _benefit(it: Item, m: float, mm: int, board: Board) -> float:
    if m < mm or m <= 0:
        return 0.0
    return max(0.0, cost.t_cpu(it.n, it.k, m, board) - cost.t_npu(it.n, it.k, m, board))


def _at_rows(it: Item, m: float, mm: int, board: Board, memo: dict) -> tuple[float, float, float]:
    """(benefit, t_cpu NF4, t_npu) of an item's shape at m rows; items of one shape and m share one computation."""
    key = (it.n, it.k, m, mm)
    v = memo.get(key)
    if v is None:
        v = memo[key] = (_benefit(it, m, mm, board), cost.t_cpu(it.n, it.k, m, board), cost.t_npu(it.n, it.k, m, board))
    return v


# The analytic quality weights (docs/TIERMAP.md section 3, "Default sensitivity"), in KLD: what putting
# an item in NF4 rather than int8 adds to the mean KL divergence of the next-token distribution.
# Fitted to one measurement on the default NF4 format, nf4dq (docs/EVAL.md, "The default sensitivity"):
# `orkpack eval --per-tensor` of SmolLM2-135M-Instruct with every matrix NF4, each item's single-item KLD
# on 128 tokens: the tied head 0.076; the other 210 items 0.171 together. Per element, against the plain
# matrices (q, output, gate, up: 1.0e-9 each): attn_k 3.8x, attn_v 15.8x, ffn_down 2.0x. The rule keeps
# what the field knows and llama.cpp's quantization mixes act on (more bits for output, attn_v, ffn_down),
# with K and V weighted by how many query heads read each (GQA: heads / kv_heads, 3 there). Held out on
# eight other SmolLM2 packs it predicts 9 to 19 % above their measured decode KLD.
HEAD_KLD = 0.076
BODY_KLD = 0.171
V_FACTOR = 5.0  # attn_v per element, times the GQA ratio
DOWN_FACTOR = 2.0  # ffn_down (dense, shared expert and routed experts) per element
# A larger model loses less to the same quantization: both constants scale by (N / SIZE_REF) ** -SIZE_EXP,
# N the parameters a token reads (an expert's elements times its layer's used / total experts). SIZE_REF is
# SmolLM2-135M's count by that rule; SIZE_EXP is fitted to llama.cpp's own types at both sizes (docs/EVAL.md,
# "The default sensitivity across sizes": our SmolLM2 KLDs against llama.cpp's published LLaMA 3 8B ones;
# seven pairs, each giving 0.08 to 0.41, and families of one size differ by as much as 2.5x).
SIZE_REF = 134_479_872
SIZE_EXP = 0.21
_KIND = re.compile(r"^blk\.\d+\.(attn_k|attn_v|ffn_down|ffn_down_exps|ffn_down_shexp)\.weight$")


def _kind_factor(it: Item, gqa: float) -> float:
    m = _KIND.match(it.tensor)
    if m is None:
        return 1.0
    return {"attn_k": gqa, "attn_v": V_FACTOR * gqa}.get(m.group(1), DOWN_FACTOR)


def default_sensitivity(manifest: Manifest, m_eff: list[float], prefill_m: int) -> list[float]:
    """Per item, the KLD it adds as NF4 rather than int8 (the analytic rule).

    The output head (``output.weight``, or the embedding when it is tied: it is the head) gets
    HEAD_KLD: its error goes straight into the logits, whatever its size. Every other item shares
    BODY_KLD in proportion to its weight: the elements a token reads through it (element count x its
    routing share for an expert, the element count otherwise; an untied embedding as a K x K matrix:
    a token reads one row of it) times its kind's factor (attn_k: the GQA ratio g = heads / kv_heads;
    attn_v: 5 g; ffn_down: 2; others 1); the vision encoder's items share it too. Both constants scale
    by :func:`size_factor`.
    """
    f = manifest.facts
    gqa = f["heads"] / f["kv_heads"] if f.get("heads") and f.get("kv_heads") else 1.0
    size = size_factor(manifest)
    tied = not any(it.role == "output" for it in reversed(manifest.items))  # output.weight sorts last but one
    heads = [i for i, it in enumerate(manifest.items) if it.role == "output" or (tied and it.role == "embedding")]
    w: list[float] = []
    kind: dict[str, float] = {}  # the kind's factor, per tensor (every expert of a stack has its tensor's)
    for i, it in enumerate(manifest.items):
        role = it.role
        factor = kind.get(it.tensor)
        if factor is None:
            factor = kind[it.tensor] = _kind_factor(it, gqa)
        # an untied embedding is a lookup: a token reads one row, whose error perturbs the hidden state as
        # much as the output error of one hidden x hidden product does; it weighs as that (K x K)
        # another embedding table (gemma4's per-layer one, a row of n_layers x width): its row gates every layer's
        # output through a width x hidden product; it weighs as that row times hidden
        if role == "embedding":
            w.append(float(it.k * it.k))
        elif role == "lookup":
            w.append(float(it.k * f["hidden"]))
        else:  # its elements (it.numel) times its share, times its kind's factor
            share = (m_eff[i] / prefill_m if prefill_m else 0.0) if role == "expert" else 1.0
            w.append(float(it.n * it.k) * share * factor)
    for i in heads:
        w[i] = 0.0
    body = sum(w)
    out = [size * BODY_KLD * x / body if body > 0 else 0.0 for x in w]
    for i in heads:
        out[i] = size * HEAD_KLD / len(heads)
    return out


def active_params(manifest: Manifest) -> float:
    """The parameters a token reads: every item's elements, an expert's times its layer's used / total experts."""
    return float(sum(it.n * it.k * (it.n_experts_used / it.n_experts if it.role == "expert" and it.n_experts else 1.0)
                     for it in manifest.items))  # it.n * it.k: it.numel


def size_factor(manifest: Manifest) -> float:
    """(N / SIZE_REF) ** -SIZE_EXP: how much less than SmolLM2-135M this model loses to the same quantization."""
    n = active_params(manifest)
    return (n / SIZE_REF) ** -SIZE_EXP if n > 0 else 1.0


def analytic(manifest: Manifest, board: Board, prefill_m: int, routing: dict[int, float] | None = None, *,
             sensitivity: bool = True) -> Profile:
    """The analytic profile; ``sensitivity`` False leaves the sensitivities empty, for a caller that computes them
    again (a JSON profile's routing makes its own)."""
    routing = routing or {}
    shape_mm: dict[tuple[int, int], int] = {}
    memo: dict[tuple, tuple[float, float, float]] = {}
    ben, sens, ms, mms, tc, tn = [], [], [], [], [], []
    alike: dict[tuple, tuple] = {}  # (shape, role, experts) -> the row; items with their own routing aside
    p = None  # the previous item if it had no routing of its own: an alike next one has its very key
    for i, it in enumerate(manifest.items):
        if p is not None and it.n == p.n and it.k == p.k and it.role == p.role and it.n_experts_used == p.n_experts_used \
                and it.n_experts == p.n_experts and i not in routing:
            ms.append(m)
            mms.append(mm)
            ben.append(b)
            tc.append(c)
            tn.append(n)
            continue
        key = None if i in routing else (it.n, it.k, it.role, it.n_experts_used, it.n_experts)
        p = None if key is None else it
        got = None if key is None else alike.get(key)
        if got is None:
            mm = shape_mm.get((it.n, it.k))
            if mm is None:
                mm = shape_mm[(it.n, it.k)] = cost.min_m(it.n, it.k, board)
            m = _analytic_m(it, prefill_m, routing.get(i))
            got = (mm, m) + _at_rows(it, m, mm, board, memo)
            if key is not None:
                alike[key] = got
        mm, m, b, c, n = got
        ms.append(m)
        mms.append(mm)
        ben.append(b)
        tc.append(c)
        tn.append(n)
    sens = default_sensitivity(manifest, ms, prefill_m) if sensitivity else []
    return Profile("analytic", "analytic", prefill_m, ben, sens, ms, mms, tc, tn)


# --------------------------------------------------------------------------------------------- importers

def _as_list(v, n: int, what: str, where: str) -> list[float]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        vals = [float(v)] * n
    elif isinstance(v, list) and len(v) == n and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        vals = [float(x) for x in v]
    else:
        raise OrkError(f"{where}: '{what}' must be a number or a list of {n} numbers")
    if not all(math.isfinite(x) and x >= 0 for x in vals):
        raise OrkError(f"{where}: '{what}' must hold finite non-negative numbers")
    return vals


def _apply_routing(prof: Profile, manifest: Manifest, board: Board, routing: dict[int, float]) -> None:
    memo: dict[tuple, tuple[float, float, float]] = {}
    for i, r in routing.items():
        it = manifest.items[i]
        m = prof.prefill_m * r
        prof.m_eff[i] = m
        prof.benefit[i], prof.t_cpu[i], prof.t_npu[i] = _at_rows(it, m, prof.min_m[i], board, memo)
    if routing:  # an expert's default sensitivity follows its routing share
        prof.sensitivity = default_sensitivity(manifest, prof.m_eff, prof.prefill_m)


def _spread_routing(manifest: Manifest, routing: dict[int, float]) -> dict[int, float]:
    """Routing given for one expert tensor of a layer applies to the layer's other expert tensors."""
    per_layer: dict[tuple[int | None, int], float] = {}
    for i, r in routing.items():
        it = manifest.items[i]
        per_layer.setdefault((it.layer, it.expert), r)
    out = dict(routing)
    for i, it in enumerate(manifest.items):
        if it.role == "expert" and i not in out:
            r = per_layer.get((it.layer, it.expert))
            if r is not None:
                out[i] = r
    return out


def _load_json_profile(p: Path, manifest: Manifest, board: Board, prefill_m: int, ignore: bool) -> Profile:
    where = escape_name(p.name)
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise OrkError(f"{where}: cannot read the profile as JSON ({e.__class__.__name__})") from None
    if not isinstance(d, dict) or d.get("schema") != PROFILE_SCHEMA:
        raise OrkError(f"{where}: not an orkpack hotness profile (schema must be {PROFILE_SCHEMA!r}); see docs/TIERMAP.md")
    if d.get("version") != PROFILE_VERSION:
        raise OrkError(f"{where}: hotness profile version {d.get('version')!r} is not supported (this orkpack reads {PROFILE_VERSION})")
    tensors = d.get("tensors")
    if not isinstance(tensors, dict):
        raise OrkError(f"{where}: 'tensors' must be an object of name -> entry")
    res = _Resolver(manifest)
    unknown, routing, benefit, sens = [], {}, {}, {}
    for name, ent in tensors.items():
        r = res.resolve(name)
        if r is None:
            unknown.append(name)
            continue
        kind, idx = r
        if not idx:
            continue
        if not isinstance(ent, dict) or not set(ent) <= {"benefit_us", "routing", "sensitivity"}:
            raise OrkError(f"{where}: entry {escape_name(name)!r} may only hold benefit_us, routing, sensitivity")
        w = f"{where}: {escape_name(name)}"
        if "routing" in ent:
            if kind == "item" and manifest.items[idx[0]].expert is None:
                raise OrkError(f"{w}: 'routing' applies to expert tensors only")
            routing.update(zip(idx, _as_list(ent["routing"], len(idx), "routing", w)))
        if "benefit_us" in ent:
            benefit.update(zip(idx, _as_list(ent["benefit_us"], len(idx), "benefit_us", w)))
        if "sensitivity" in ent:
            sens.update(zip(idx, _as_list(ent["sensitivity"], len(idx), "sensitivity", w)))
    spread = _spread_routing(manifest, routing)
    prof = analytic(manifest, board, prefill_m, sensitivity=not spread)  # routing makes the sensitivities again
    _unknown(unknown, where, ignore, prof.warnings)
    own = d.get("prefill_m")
    if isinstance(own, int) and not isinstance(own, bool) and own != prefill_m:  # informative only
        prof.warnings.append(f"{where}: written for prefill_m {own}; planning at --prefill-m {prefill_m} "
                             "(its benefit_us are taken as given)")
    _apply_routing(prof, manifest, board, spread)
    for i, b in benefit.items():  # the NPU saves benefit_us against the host NF4 path
        prof.benefit[i] = b * 1e-6
        prof.t_npu[i] = max(0.0, prof.t_cpu[i] - b * 1e-6)
    for i, s in sens.items():
        prof.sensitivity[i] = s
    prof.kind, prof.source = "json", p.name
    return prof


def _finish_imatrix(entries: dict[str, tuple[np.ndarray, np.ndarray]], where: str, manifest: Manifest,
                    board: Board, prefill_m: int, ignore: bool, kind: str, src: str) -> Profile:
    """entries: name -> (sum of squared activations per expert row (E, K), counts per expert (E,) or None)."""
    res = _Resolver(manifest)
    prof = analytic(manifest, board, prefill_m)
    unknown, routing, energy = [], {}, {}
    for name, (sq, counts) in entries.items():
        r = res.resolve(name)
        if r is None:
            unknown.append(name)
            continue
        kind_, idx = r
        if not idx:
            continue
        sq = np.asarray(sq, dtype=np.float64)
        if not np.isfinite(sq).all() or (sq < 0).any() or (counts is not None and (
                not np.isfinite(np.asarray(counts, dtype=np.float64)).all() or (np.asarray(counts) < 0).any())):
            raise OrkError(f"{where}: {escape_name(name)} holds negative or non-finite statistics; the file is damaged "
                           "(regenerate it with llama-imatrix or orkpack imatrix)")
        n_rows = sq.shape[0] if sq.ndim else 0
        if sq.ndim != 2 or n_rows == 0 or (counts is not None and np.asarray(counts).size < n_rows):
            raise OrkError(f"{where}: {escape_name(name)}: its sums ({'x'.join(map(str, sq.shape)) or 'scalar'}) and "
                           f"counts ({'none' if counts is None else np.asarray(counts).size}) do not match; the file is "
                           "damaged (regenerate it with llama-imatrix or orkpack imatrix)")
        if n_rows not in (1, len(idx)):
            raise OrkError(f"{where}: {escape_name(name)} has {n_rows} expert rows, the model has {len(idx)}")
        c = np.ones(n_rows) if counts is None else np.asarray(counts, dtype=np.float64).reshape(-1)[:n_rows]
        mean = np.where(c[:, None] > 0, sq / np.maximum(c[:, None], 1e-30), 0.0).sum(axis=1)
        if kind_ == "stacked" and counts is not None and n_rows == len(idx) and c.sum() > 0:
            it0 = manifest.items[idx[0]]
            top_k = it0.n_experts_used or 1
            freq = c * top_k / c.sum()
            routing.update(zip(idx, (float(f) for f in freq)))
        for j, i in enumerate(idx):
            energy[i] = float(mean[j if n_rows > 1 else 0])
    _unknown(unknown, where, ignore, prof.warnings)
    _apply_routing(prof, manifest, board, _spread_routing(manifest, routing))
    # sensitivity = mean activation energy x rows x routing share, scaled so that the
    # covered items keep the analytic total (items a profile lacks stay comparable).
    raw = {}
    for i, e in energy.items():
        it = manifest.items[i]
        share = prof.m_eff[i] / prefill_m if it.role == "expert" and prefill_m else 1.0
        raw[i] = e * it.n * share
    tot_raw = sum(raw.values())
    tot_an = sum(prof.sensitivity[i] for i in raw)
    if tot_raw > 0:
        for i, v in raw.items():
            prof.sensitivity[i] = v * tot_an / tot_raw
    prof.kind, prof.source = kind, src
    return prof


def _load_imatrix_gguf(p: Path, manifest, board, prefill_m, ignore) -> Profile:
    import gguf

    where = escape_name(p.name)
    try:
        r = gguf.GGUFReader(str(p), "r")
    except Exception as e:  # gguf-py raises bare ValueErrors / struct errors on damaged files
        raise OrkError(f"{where}: cannot read it as a GGUF imatrix ({e.__class__.__name__}); regenerate it with llama-imatrix") from None
    f = r.fields.get("general.type")
    gtype = None
    if f is not None:
        try:
            gtype = bytes(f.parts[f.data[0]]).decode("utf-8")
        except Exception:
            gtype = None
    if gtype != "imatrix":
        raise OrkError(f"{where}: a GGUF without general.type = imatrix; give an imatrix file or a model to plan")
    sums, counts = {}, {}
    for t in r.tensors:
        a = np.asarray(t.data, dtype=np.float64)
        if t.name.endswith(".in_sum2"):
            sums[t.name[: -len(".in_sum2")]] = (np.zeros((0, 0)) if a.size == 0 else
                                                 a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1))
        elif t.name.endswith(".counts"):
            counts[t.name[: -len(".counts")]] = a.reshape(-1)
    entries = {n: (s, counts.get(n)) for n, s in sums.items()}
    return _finish_imatrix(entries, where, manifest, board, prefill_m, ignore, "imatrix", p.name)


def _load_imatrix_dat(p: Path, manifest, board, prefill_m, ignore) -> Profile:
    """Legacy llama.cpp .dat: i32 n; per entry i32 len, name, i32 ncall, i32 nval, f32[nval] (mean x ncall)."""
    where = escape_name(p.name)
    try:
        buf = p.read_bytes()
    except OSError as e:
        raise OrkError(f"{where}: cannot read the imatrix ({e.__class__.__name__})") from None
    entries = {}
    resolver = _Resolver(manifest)
    try:
        (n,) = struct.unpack_from("<i", buf, 0)
        off = 4
        if n < 0 or n > 1_000_000:
            raise ValueError
        for _ in range(n):
            (ln,) = struct.unpack_from("<i", buf, off)
            if ln <= 0 or ln > 4096:
                raise ValueError
            name = buf[off + 4: off + 4 + ln].decode("utf-8")
            off += 4 + ln
            ncall, nval = struct.unpack_from("<ii", buf, off)
            off += 8
            if nval <= 0 or off + 4 * nval > len(buf):
                raise ValueError
            vals = np.frombuffer(buf, dtype="<f4", count=nval, offset=off).astype(np.float64)
            off += 4 * nval
            res = resolver.resolve(name)
            rows = len(res[1]) if res and res[0] == "stacked" and nval % len(res[1]) == 0 else 1
            # values are mean x ncall: the energy per call is values / ncall (counts = ncall)
            entries[name] = (vals.reshape(rows, -1), np.full(rows, float(max(ncall, 1))))
    except (struct.error, ValueError, UnicodeDecodeError):
        raise OrkError(f"{where}: truncated or not a llama.cpp imatrix .dat; regenerate it with llama-imatrix") from None
    prof = _finish_imatrix(entries, where, manifest, board, prefill_m, ignore, "imatrix", p.name)
    prof.warnings.append(f"{where}: legacy imatrix has no per-expert counts; routing stays uniform")
    return prof


def _load_csv(p: Path, manifest, board, prefill_m, ignore) -> Profile:
    """Measured CPU timing table: tensor, calls, total_us (one row per tensor or expert item).

    Per chunk, an item's measured time is total_us / max_calls (max_calls: the most calls
    of any row = the number of prefill chunks profiled); the NPU would spend
    calls x t_npu(m) over the same run, m the item's analytic rows: t_cpu = total_us / max_calls,
    t_npu = calls x t_npu(m) / max_calls per chunk, benefit_us = max(0, t_cpu - t_npu), 0 when m < min_m.
    """
    where = escape_name(p.name)
    try:
        rows = list(csv.reader(p.read_text(encoding="utf-8").splitlines()))
    except (OSError, UnicodeDecodeError) as e:
        raise OrkError(f"{where}: cannot read the timing table ({e.__class__.__name__})") from None
    if not rows or [c.strip().lower() for c in rows[0][:3]] not in (["tensor", "calls", "total_us"], ["tensor", "calls", "total_µs"]):
        raise OrkError(f"{where}: a timing table needs the header 'tensor,calls,total_us'")
    res = _Resolver(manifest)
    prof = analytic(manifest, board, prefill_m)
    unknown, data = [], []
    for ln, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            name, calls, tot = row[0].strip(), int(row[1]), float(row[2])
            if calls < 0 or not math.isfinite(tot) or tot < 0:
                raise ValueError
        except (ValueError, IndexError):
            raise OrkError(f"{where}: line {ln}: expected tensor,calls,total_us with calls >= 0 and total_us >= 0") from None
        r = res.resolve(name)
        if r is None:
            unknown.append(name)
            continue
        for i in r[1]:
            n_share = len(r[1])
            data.append((i, calls, tot / n_share))
    _unknown(unknown, where, ignore, prof.warnings)
    max_calls = max((c for _, c, _ in data), default=0)
    for i, calls, tot in data:
        it = manifest.items[i]
        m = prof.m_eff[i]
        if max_calls == 0 or m <= 0:
            prof.benefit[i] = 0.0
            continue
        # per chunk: the host NF4 time measured, the NPU's time over the same calls from the cost model
        prof.t_cpu[i] = tot / max_calls * 1e-6
        prof.t_npu[i] = calls * cost.t_npu(it.n, it.k, m, board) / max_calls
        prof.benefit[i] = max(0.0, prof.t_cpu[i] - prof.t_npu[i]) if m >= prof.min_m[i] else 0.0
    prof.kind, prof.source = "csv", p.name
    return prof


def load_profile(path: str | Path | None, manifest: Manifest, board: Board, prefill_m: int = 512,
                 *, ignore_unknown: bool = False) -> Profile:
    """The hotness profile for ``manifest`` on ``board`` (analytic when ``path`` is None)."""
    if not isinstance(prefill_m, int) or prefill_m < 2:
        raise OrkError(f"--prefill-m must be an integer >= 2 (got {prefill_m!r}); M = 1 is decode and never uses the NPU")
    if path is None:
        return analytic(manifest, board, prefill_m)
    p = Path(path)
    if not is_file(p):
        raise OrkError(f"{escape_name(str(p))}: profile not found; give a .json, .gguf (imatrix), .dat or .csv file")
    suf = p.suffix.lower()
    if suf == ".json":
        return _load_json_profile(p, manifest, board, prefill_m, ignore_unknown)
    if suf == ".gguf":
        return _load_imatrix_gguf(p, manifest, board, prefill_m, ignore_unknown)
    if suf == ".dat":
        return _load_imatrix_dat(p, manifest, board, prefill_m, ignore_unknown)
    if suf == ".csv":
        return _load_csv(p, manifest, board, prefill_m, ignore_unknown)
    raise OrkError(f"{escape_name(p.name)}: unknown profile type {suf!r}; give .json, .gguf (imatrix), .dat or .csv")
