"""The fit-by-partition solver: every item to NPU int8, host int8 or host NF4.

Constraints (docs/TIERMAP.md "Solver"):
  NPU    sum of NPU bytes (int8 tiles with padding + scales, each part aligned) <= iova_usable
  RAM    reserve + KV cache + float tensors + every item's resident bytes <= total
         (an NPU item counts its NPU bytes once: UMA)
  pins   --npu (force NPU), --cpu (force host), --int8, --nf4 (force the encoding),
         --keep (float on the host); fnmatch globs against the tensor name, the item
         name ``name[e]`` and the expert-slice name ``blk.N.ffn_gate.E.weight``.
         An exact name always matches itself (so ``name[3]`` needs no escaping).
         The MoE router (``*.ffn_gate_inp.weight``) stays float unless a pin says otherwise.

Objective, lexicographic:
  1. maximize the NPU benefit (prefill seconds saved per chunk, integer picoseconds),
     subject to NPU and RAM (host items counted at their smallest allowed encoding);
  2. with that NPU set, maximize the int8 sensitivity of host items (NF4 -> int8
     promotions) within the RAM left.
Both stages are exact knapsacks over groups of identical-weight items (knapsack.py):
the result is optimal, or carries the proven gap. Ties: items sorted by (-value,
name) inside a group, so equal items are chosen by name; everything is deterministic.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import numpy as np

from ..errors import OrkError, escape_name
from .. import globs
from ..sources import names as _names
from . import cost, knapsack
from .board import Board
from .manifest import NON_FLOAT_DTYPES, Item, Manifest
from .profile import Profile
from .tiermap import Decision, TierMap

PIN_KINDS = ("npu", "cpu", "int8", "nf4", "keep")
DEFAULT_KEEP = ("*.ffn_gate_inp.weight",)  # MoE routers stay float (llama.cpp does the same)
_FLOAT_ENC = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
GiB = 1 << 30


def _item_names(it: Item) -> list[str]:
    out = [it.tensor, it.name]
    if it.expert is not None:
        m = it.tensor.split(".")
        if len(m) == 4 and m[2].endswith("_exps"):
            out.append(_names.expert_slice_name(int(m[1]), m[2][4:-5], it.expert))
    return out


def match_pins(manifest: Manifest, pins: dict[str, list[str]] | None) -> tuple[dict[int, set[str]], list[str]]:
    """item index -> pin kinds; warnings for globs that match nothing."""
    pins = pins or {}
    for k in pins:
        if k not in PIN_KINDS:
            raise OrkError(f"unknown pin kind {escape_name(str(k))!r}; use {', '.join(PIN_KINDS)}")
    out: dict[int, set[str]] = {}
    warnings = []
    names = [_item_names(it) for it in manifest.items]
    float_names = {t.name for t in manifest.floats}
    for kind in PIN_KINDS:
        for glob in pins.get(kind) or ():
            hit = False
            for i, ns in enumerate(names):
                if any(globs.matches(n, glob) for n in ns):  # "name[3]" is literal too
                    out.setdefault(i, set()).add(kind)
                    hit = True
            if not hit and not any(fnmatch.fnmatchcase(n, glob) for n in float_names):
                warnings.append(globs.no_match_warning(kind, glob, sorted({ns[0] for ns in names} | float_names)))
    for i, ks in out.items():
        it = manifest.items[i]
        for a, b in (("npu", "cpu"), ("npu", "keep"), ("int8", "nf4"), ("int8", "keep"), ("nf4", "keep")):
            if a in ks and b in ks:
                raise OrkError(f"{escape_name(it.name)}: pinned both --{a} and --{b}; make the globs disjoint")
        if "npu" in ks and it.role == "embedding":
            raise OrkError(f"{escape_name(it.name)}: the token embedding is a lookup, not a matmul; it cannot be pinned --npu")
    return out, warnings


@dataclass
class _Row:
    npu: int
    i8: int
    n4: int
    fl: int
    eligible: bool
    forced_tier: str | None
    forced_enc: str | None  # int8 | nf4 | float
    pin: str | None


def _rows(manifest: Manifest, board: Board, pins: dict[int, set[str]]) -> list[_Row]:
    rows = []
    has_npu = "npu" in board.engines and board.iova_usable_bytes > 0
    for i, it in enumerate(manifest.items):
        ks = pins.get(i, set())
        default_keep = it.role == "router" and not (ks & {"npu", "int8", "nf4"})
        keep = "keep" in ks or default_keep
        forced_tier = "npu" if "npu" in ks else ("host" if ("cpu" in ks or keep) else None)
        forced_enc = "float" if keep else ("int8" if "int8" in ks else ("nf4" if "nf4" in ks else None))
        eligible = has_npu and it.role != "embedding" and forced_tier != "host"
        pin = ",".join(f"--{k}" for k in PIN_KINDS if k in ks) or ("default-keep" if default_keep else None)
        if forced_tier == "npu" and not has_npu:
            raise OrkError(f"{escape_name(it.name)}: pinned --npu but board {board.name} has no NPU")
        rows.append(_Row(cost.npu_bytes(it.n, it.k, board), cost.host_int8_bytes(it.n, it.k),
                         cost.host_nf4_bytes(it.n, it.k), it.float_bytes, eligible, forced_tier, forced_enc, pin))
    return rows


def _host_min(r: _Row) -> int:
    return {"float": r.fl, "int8": r.i8, "nf4": r.n4, None: r.n4}[r.forced_enc]


def _fmt(b: int) -> str:
    return f"{b / GiB:.2f} GiB" if abs(b) >= GiB // 4 else f"{b / (1 << 20):.1f} MiB"


def _no_fit(manifest: Manifest, board: Board, rows: list[_Row], need: int, cap: int, kv: int, ctx: int,
            kv_type: str, fixed_no_kv: int) -> OrkError:
    short = need - cap
    hints = []
    room = cap - fixed_no_kv
    if room > 0 and kv > 0:
        max_ctx = int(room // (kv / ctx))
        if max_ctx >= 256:
            hints.append(f"--ctx {max_ctx // 256 * 256} or shorter")
    if kv_type == "f16":
        kv8 = manifest.kv_bytes(ctx, "q8_0")
        if kv - kv8 >= short:
            hints.append("--kv-type q8_0")
    save = sum(_host_min(r) - r.n4 for r in rows if r.forced_tier != "npu" and r.forced_enc in ("int8", "float"))
    save += sum(r.npu - r.n4 for r in rows if r.forced_tier == "npu")
    if save >= short:
        hints.append("fewer --int8/--keep/--npu pins (more NF4)")
    if board.reserve_bytes >= short:
        hints.append(f"a smaller reserve (reserve_bytes <= {board.reserve_bytes - short} in a --board file)")
    what = "; it would fit with " + " or ".join(hints) if hints else "; no option fits it on this board: use a larger board"
    return OrkError(f"{escape_name(manifest.source)} does not fit on {board.name}: short by {short} bytes "
                    f"({_fmt(short)}) at ctx {ctx} with {kv_type} KV{what}")


def _groups(idx: list[int], weights: list[tuple[int, ...]], values: list[int], names: list[str]):
    """Group items with identical weight vectors; members sorted by (-value, name)."""
    by: dict[tuple[int, ...], list[int]] = {}
    for i, w, v in zip(idx, weights, values):
        by.setdefault(w, []).append(i)
    keys = sorted(by)
    members, ws, vs = [], [], []
    vmap = dict(zip(idx, values))
    for w in keys:
        m = sorted(by[w], key=lambda i: (-vmap[i], names[i]))
        members.append(m)
        ws.append(w)
        vs.append(np.array([vmap[i] for i in m], dtype=np.int64))
    return members, ws, vs


def _knap(idx, weights, values, names, caps, node_limit):
    members, ws, vs = _groups(idx, weights, values, names)
    res = knapsack.solve(ws, vs, caps, node_limit=node_limit)
    chosen = set()
    for g, k in enumerate(res.counts):
        chosen.update(members[g][:k])
    return chosen, res, len(members)


def _status(res: knapsack.KnapResult, groups: int, n: int, scale: float, unit: str) -> dict:
    return {"status": "optimal" if res.optimal else "gap", "value": round(res.value * scale, 3),
            "bound": round(res.bound * scale, 3), "gap": round((res.bound - res.value) * scale, 3), "unit": unit,
            "items": n, "groups": groups, "nodes": res.nodes,
            "method": "branch and bound over identical-weight groups, LP (fractional greedy) bounds"}


def solve(manifest: Manifest, board: Board, profile: Profile, *, ctx: int = 8192, kv_type: str = "f16",
          pins: dict[str, list[str]] | None = None, node_limit: int = 200_000) -> TierMap:
    """The optimal tier map for ``manifest`` on ``board`` (see the module docstring)."""
    pinmap, pin_warn = match_pins(manifest, pins)
    items = manifest.items
    rows = _rows(manifest, board, pinmap)
    names = [it.name for it in items]
    kv = manifest.kv_bytes(ctx, kv_type)
    float_1d = sum(t.float_bytes for t in manifest.floats)
    g = board.alloc_granularity

    pinned_npu = [i for i, r in enumerate(rows) if r.forced_tier == "npu"]
    npu_pinned_bytes = sum(rows[i].npu for i in pinned_npu)
    base_items = sum(rows[i].npu if rows[i].forced_tier == "npu" else _host_min(rows[i]) for i in range(len(items)))
    fixed_no_kv = board.reserve_bytes + float_1d + base_items
    need = fixed_no_kv + kv
    if need > board.total_bytes:
        raise _no_fit(manifest, board, rows, need, board.total_bytes, kv, ctx, kv_type, fixed_no_kv)
    if npu_pinned_bytes > board.iova_usable_bytes:
        raise OrkError(f"--npu pins need {npu_pinned_bytes} bytes ({_fmt(npu_pinned_bytes)}) of NPU memory; "
                       f"{board.name} allows {board.iova_usable_bytes} ({_fmt(board.iova_usable_bytes)}); pin fewer tensors")
    ram_free = board.total_bytes - need

    # ---- stage 1: NPU set
    ben_ps = [int(round(b * 1e12)) for b in profile.benefit]
    cand = [i for i, r in enumerate(rows) if r.eligible and r.forced_tier is None and ben_ps[i] > 0]
    deltas = {i: rows[i].npu - _host_min(rows[i]) for i in cand}
    iova_units = (board.iova_usable_bytes - npu_pinned_bytes) // g
    ram_binding = sum(deltas.values()) > ram_free
    wts = [((rows[i].npu // g, deltas[i]) if ram_binding else (rows[i].npu // g,)) for i in cand]
    caps = (iova_units, ram_free) if ram_binding else (iova_units,)
    npu_set, res1, ng1 = _knap(cand, wts, [ben_ps[i] for i in cand], names, caps, node_limit)
    npu_set |= set(pinned_npu)
    ram_free -= sum(deltas[i] for i in npu_set if i in deltas)

    # ---- stage 2: int8 on the host where RAM allows
    host_free = [i for i, r in enumerate(rows) if i not in npu_set and r.forced_enc is None]
    smax = max((profile.sensitivity[i] for i in host_free), default=0.0)
    sens = {i: (int(round(profile.sensitivity[i] / smax * 1e12)) if smax > 0 else 0) for i in host_free}
    cand2 = [i for i in host_free if sens[i] > 0]
    w2 = [(rows[i].i8 - rows[i].n4,) for i in cand2]
    int8_set, res2, ng2 = _knap(cand2, w2, [sens[i] for i in cand2], names, (ram_free,), node_limit)
    ram_free -= sum(rows[i].i8 - rows[i].n4 for i in int8_set)

    # ---- decisions
    decisions, npu_used, host_w = [], 0, {"int8": 0, "nf4": 0, "float": 0}
    for i, it in enumerate(items):
        r = rows[i]
        shape = (it.n, it.k)
        if i in npu_set:
            enc = "nf4" if r.forced_enc == "nf4" else "int8"
            decisions.append(Decision(it.tensor, it.expert, shape, enc, "npu", profile.min_m[i], r.npu,
                                      profile.benefit[i] * 1e6, r.pin))
            npu_used += r.npu
            continue
        if r.forced_enc == "float":
            enc, nb = _FLOAT_ENC.get(it.dtype, "f32"), r.fl
            host_w["float"] += nb
        elif r.forced_enc == "int8" or i in int8_set:
            enc, nb = "int8", r.i8
            host_w["int8"] += nb
        else:
            enc, nb = "nf4", r.n4
            host_w["nf4"] += nb
        decisions.append(Decision(it.tensor, it.expert, shape, enc, "host", profile.min_m[i], nb, 0.0, r.pin))
    for t in manifest.floats:
        enc = "raw" if t.dtype in NON_FLOAT_DTYPES else _FLOAT_ENC.get(t.dtype, "f32")
        decisions.append(Decision(t.name, None, t.shape, enc, "host", cost.MIN_M_NEVER,
                                  t.float_bytes, 0.0, None))
        host_w["float"] += t.float_bytes
    order = {n: j for j, n in enumerate(sorted({d.tensor for d in decisions}, key=_names.natural_key))}
    decisions.sort(key=lambda d: (order[d.tensor], -1 if d.expert is None else d.expert))

    ram_used = board.reserve_bytes + kv + npu_used + sum(host_w.values())
    assert npu_used <= board.iova_usable_bytes and ram_used <= board.total_bytes  # the knapsack guarantees both
    captured = sum(profile.benefit[i] for i in npu_set)
    cpu_only = sum(profile.t_cpu)
    planned = max(cpu_only - captured, 1e-12)
    m = profile.prefill_m
    objective = {
        "order": ["npu_benefit_us (max)", "host_int8_sensitivity (max, given the NPU set)"],
        "npu_benefit_us": round(captured * 1e6, 3),
        "npu_benefit_us_pinned": round(sum(profile.benefit[i] for i in pinned_npu) * 1e6, 3),
        "stage1": _status(res1, ng1, len(cand), 1e-6, "us"),
        "stage2": {**_status(res2, ng2, len(cand2), smax / 1e12 if smax > 0 else 0.0, "sensitivity")},
        "ties": "items of equal weight are taken by (-value, name)",
    }
    budget = {
        "npu": {"used": npu_used, "cap": board.iova_usable_bytes, "headroom": board.iova_usable_bytes - npu_used,
                "items": len(npu_set)},
        "ram": {"used": ram_used, "cap": board.total_bytes, "headroom": board.total_bytes - ram_used,
                "npu_weights": npu_used, "host_int8": host_w["int8"], "host_nf4": host_w["nf4"],
                "host_float": host_w["float"], "kv_cache": kv, "reserve": board.reserve_bytes},
    }
    prediction = {
        "prefill_m": m, "cpu_only_s_per_chunk": round(cpu_only, 6), "planned_s_per_chunk": round(planned, 6),
        "cpu_only_tok_s": round(m / cpu_only, 2) if cpu_only > 0 else None,
        "planned_tok_s": round(m / planned, 2), "speedup": round(cpu_only / planned, 3) if cpu_only > 0 else 1.0,
        "model": "analytic cost model of the board (docs/TIERMAP.md); matmuls only",
    }
    options = {"ctx": ctx, "kv_type": kv_type, "prefill_m": m, "profile": profile.source,
               "pins": {k: list((pins or {}).get(k) or []) for k in PIN_KINDS},
               "default_keep": list(DEFAULT_KEEP)}
    model = {"source": manifest.source, "origin": manifest.origin, **manifest.facts,
             "tensors": len(manifest.tensors), "items": len(items), "assumptions": list(manifest.warnings)}
    tm = TierMap(decisions, model=model, board=board.to_json(), options=options, objective=objective,
                 budget=budget, prediction=prediction)
    tm.warnings = list(manifest.warnings) + pin_warn + list(profile.warnings)
    return tm


# ---------------------------------------------------------------------------------- baselines for the report

def greedy_benefit(manifest: Manifest, board: Board, profile: Profile, order: str) -> float:
    """NPU benefit (s per chunk) of a greedy fill: ``order`` 'model' (layer order, what llama.cpp
    -ngl / accelerate do) or 'hotness' (top-k by benefit alone); items that do not fit are skipped."""
    rows = _rows(manifest, board, {})
    idx = [i for i, r in enumerate(rows) if r.eligible and r.forced_tier is None]
    if order == "hotness":
        idx.sort(key=lambda i: (-profile.benefit[i], manifest.items[i].name))
    cap, got = board.iova_usable_bytes, 0.0
    for i in idx:
        if rows[i].npu <= cap:
            cap -= rows[i].npu
            got += profile.benefit[i]
    return got
