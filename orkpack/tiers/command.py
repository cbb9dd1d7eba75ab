"""``orkpack plan``: solve a tier map and show it (rich tables) or print it (--json); -o writes it atomically."""
from __future__ import annotations

import gc
import heapq
import os
import tempfile
import sys
import time
from pathlib import Path

from ..errors import OrkError, escape_name
from ..files import option_file, refuse_over_inputs
from ..gcpause import without_gc as _without_gc
from ..pack.hostlevels import level_names
from .board import load_board, with_host_formats
from .manifest import manifest_from_path
from .profile import load_profile
from .solver import GiB, Goal, least_weight_bytes, solve, solve_default_levels
from .tiermap import TierMap, dumps


def _b(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB // 8 else f"{n / (1 << 20):.1f} MiB"


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the target folder, fsync, rename: never a partial file at ``path``."""
    path = Path(path)
    if not path.parent.is_dir():
        raise OrkError(f"{escape_name(str(path))}: folder {escape_name(str(path.parent))} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_FROZEN_AT_EXIT = []


def _no_collection_at_exit() -> None:
    """Spare the process's exit a pass of the cyclic collector (issue 26): Python's finalization runs one over every
    object still alive (modules, caches such as gguf's name map: some 10^5 after a plan of the MoE), ~35 ms of the
    whole `orkpack plan` on the loaded 2-core test machine. An exit handler (registered once) calls
    ``gc.freeze()``, which moves them out of the collector's sight before finalization; the exit is otherwise as
    ever: stdout and stderr are flushed, the other exit handlers run, objects without reference cycles are freed
    (a cycle's finalizer may then not run at exit, which Python never promises anyway; the plan leaves no open
    file: write_atomic closes what it writes)."""
    if not _FROZEN_AT_EXIT:
        import atexit

        atexit.register(gc.freeze)
        _FROZEN_AT_EXIT.append(True)


@_without_gc
def plan(model, *, board: str = "rk3588-32g", profile: Path | None = None, ctx: int = 8192,
         kv_type: str = "f16", prefill_m: int = 512, pins: dict[str, list[str]] | None = None,
         ignore_unknown: bool = False, goal: Goal | None = None, prompt: int = 512,
         runtime: str | None = None, nf4_format: str | None = None,
         npu_storage: str = "int8", host_low: str | None = None,
         host_high: str | None = None) -> tuple[TierMap, float, list]:
    """(tier map, solve seconds, [manifest, board, profile]) for the build and for ``plan_command``; ``model``: a
    path, or a hub model located by orkpack/sources/hub.py (its tier map records its hub origin);
    ``runtime``: the runtime path the plan is for (default ggml-ork); ``nf4_format``: the NF4 format the
    build writes host NF4 in, whose bytes the plan counts (dq32 or b64; default dq32); ``npu_storage``: how
    the build stores NPU slices (build --npu-storage: int8, or nf4, which makes a host copy nf4 b64); ``host_low``
    / ``host_high``: the host levels' formats (board.HOST_LOW, HOST_HIGH; one None: nf4, int8; both None: the
    balanced goal chooses them, solver.solve_default_levels)."""
    b = with_host_formats(load_board(board, runtime, nf4_format), host_low, host_high, "--host-low / --host-high")
    man = manifest_from_path(model)
    prof = load_profile(profile, man, b, prefill_m, ignore_unknown=ignore_unknown)
    t0 = time.perf_counter()
    kw = dict(ctx=ctx, kv_type=kv_type, pins=pins, goal=goal, prompt=prompt, npu_storage=npu_storage)
    if host_low is None and host_high is None:  # no levels given: the plan chooses them, each pair its own profile
        boards = {(b.host_low, b.host_high): (b, prof)}

        def profile_of(bb):
            boards[bb.host_low, bb.host_high] = (bb, load_profile(profile, man, bb, prefill_m,
                                                                  ignore_unknown=ignore_unknown))
            return boards[bb.host_low, bb.host_high][1]

        tm = solve_default_levels(man, b, prof, **kw, profile_of=profile_of)
        b, prof = boards[tm.board.get("host_low", b.host_low), tm.board.get("host_high", b.host_high)]
    else:
        tm = solve(man, b, prof, **kw)
    return tm, time.perf_counter() - t0, [man, b, prof]


# the frontier's decode floors: the fraction of the best decode tok/s each point must keep
FRONTIER_FLOORS = (1.0, 0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.0)


def predict_followed(tm: TierMap, model: Path, map_path: Path) -> tuple[dict, list[str]]:
    """The prediction of the placement a given tier map makes, for this source (``build --tiermap``).

    A map edited by hand, or planned for another source, carries a prediction of other choices; the
    pack records this one instead: the map's own board, options and choices through the cost model
    (docs/TIERMAP.md section 2). The map's profile is looked for beside the map (it records the file
    name only); without it the analytic profile is used, said in the warnings. The baselines are the
    map's (they do not depend on its choices).
    """
    from .board import board_from_json
    from .solver import evaluate

    label = escape_name(str(map_path))
    man = manifest_from_path(model)
    board = board_from_json(tm.board, f"tier map {label}")
    o, warnings = tm.options, []
    prof_name = o.get("profile")
    prof_path = None
    if isinstance(prof_name, str) and prof_name != "analytic":
        cand = Path(map_path).parent / Path(prof_name).name
        if cand.is_file():
            prof_path = cand
        else:
            warnings.append(f"tier map {label} was planned with profile {escape_name(prof_name)}, which is not "
                            "beside it: the pack's prediction uses the analytic profile")
    prof = load_profile(prof_path, man, board, int(o.get("prefill_m", 512)), ignore_unknown=True)
    choices, npu_nf4 = [], []
    for it in man.items:
        d = tm.get(it.tensor, it.expert)
        c = ("npu+nf4" if d.host_copy else "npu") if d.tier == "npu" else d.encoding
        choices.append(c if c in ("nf4", "int8", "npu", "npu+nf4") else "float")
        npu_nf4.append(d.tier == "npu" and d.encoding == "nf4")  # stored 4-bit: its own copy, nf4 (b64)
    now = evaluate(man, board, prof, choices, prompt=int(o.get("prompt", 512)), kv_type=str(o.get("kv_type", "f16")),
                   npu_nf4=npu_nf4)
    pred = dict(tm.prediction or {})
    old = {k: pred.get(k) for k in now}
    pred.update(now)
    if any(old[k] is not None and old[k] != now[k] for k in now):
        warnings.append(f"tier map {label} predicted decode {old['decode_tok_s']} tok/s, prefill {old['prefill_tok_s']} "
                        f"tok/s for other choices than it makes; the pack records decode {now['decode_tok_s']}, "
                        f"prefill {now['prefill_tok_s']} tok/s")
    return pred, warnings


def frontier(man, b, prof, *, ctx: int, kv_type: str, pins, goal: Goal, prompt: int) -> list[TierMap]:
    """Pareto-optimal tier maps over (decode tok/s, prefill tok/s, predicted KLD).

    Each point is exact for its decode floor (epsilon-constraint): the most prefill with decode
    >= floor x the best, then the best quality; plus the quality-first plan. Dominated and
    repeated points are dropped; the rest are sorted by decode, fastest first.
    """
    pts: list[TierMap] = []
    for f in FRONTIER_FLOORS:
        g = Goal("balanced", goal.min_decode_tok_s, goal.min_prefill_tok_s, goal.max_ram, decode_floor=f,
                 max_kld=goal.max_kld)
        try:
            pts.append(solve(man, b, prof, ctx=ctx, kv_type=kv_type, pins=pins, goal=g, prompt=prompt))
        except OrkError:
            continue
    try:
        pts.append(solve(man, b, prof, ctx=ctx, kv_type=kv_type, pins=pins,
                         goal=Goal("quality", goal.min_decode_tok_s, goal.min_prefill_tok_s, goal.max_ram,
                                   max_kld=goal.max_kld), prompt=prompt))
    except OrkError:
        pass

    def key(tm: TierMap) -> tuple[float, float, float]:  # each the larger the better: the KLD negated
        p = tm.prediction
        return (p["decode_tok_s"], p["prefill_tok_s"], -round(p["kld"], 6))

    keys = [key(t) for t in pts]
    keep: list[TierMap] = []
    seen = set()
    for i, (tm, k) in enumerate(zip(pts, keys)):
        dominated = any(all(o[j] >= k[j] for j in range(3)) and o != k for o in keys)
        if dominated or k in seen:
            continue
        seen.add(k)
        keep.append(tm)
    keep.sort(key=lambda t: (-key(t)[0], -key(t)[1], -key(t)[2]))
    for j, tm in enumerate(keep):
        tm.objective["frontier_point"] = j
    return keep


def _pred_table(console, rows: list[tuple[str, dict]], prompt: int) -> None:
    from rich.table import Table

    t = Table(title=f"Predicted speed (prompt {prompt} tokens; decode at that position)")
    for c in ("plan", "decode tok/s", "prefill tok/s", f"TTFT ({prompt})", "KLD (predicted)"):
        t.add_column(c, justify="left" if c == "plan" else "right")
    for name, p in rows:
        t.add_row(name, f"{p['decode_tok_s']:.2f}", f"{p['prefill_tok_s']:.1f}", f"{p['ttft_s']:.2f} s",
                  f"{p.get('kld', 0.0):.4f}")
    console.print(t)
    console.print("KLD (predicted): the sum of the sensitivities of the items decode reads as NF4 (an additive model; "
                  "int8 weights' own error and the NPU's int8 activations are not in it: docs/TIERMAP.md section 4)")


def _runtime_name(board: dict) -> str:
    """The runtime path a tier map's board block records ("board-v2": a map planned before runtime paths)."""
    rt = board.get("runtime")
    return escape_name(str(rt.get("name"))) if isinstance(rt, dict) else "board-v2"


def _levels_said(board: dict) -> str:
    """The plan's host formats for its first line: "host NF4 F" as ever, or the levels' formats when not nf4 / int8."""
    nf4 = f"NF4 {escape_name(str(board.get('nf4_format', 'b64')))}"
    low, high = board.get("host_low", "nf4"), board.get("host_high", "int8")
    if (low, high) == ("nf4", "int8"):
        return f"host {nf4}"
    return f"host levels {nf4 if low == 'nf4' else escape_name(str(low))} / {escape_name(str(high))}"


def render(tm: TierMap, console, solve_s: float, top: int = 12) -> None:
    from rich.table import Table

    d = tm._head()  # to_json() but its tensors, which the tables read from the decisions
    ob, bu, pr = d["objective"], d["budget"], d["prediction"]
    m = d["model"]
    console.print(f"[bold]{escape_name(m['source'])}[/]: {m['arch']}, {m['n_layers']} layers, "
                  f"{m['items']} items; board [bold]{d['board']['name']}[/], runtime [bold]{_runtime_name(d['board'])}[/], "
                  f"{_levels_said(d['board'])}, ctx {d['options']['ctx']} "
                  f"({d['options']['kv_type']} KV), profile {escape_name(str(d['options']['profile']))}, "
                  f"goal {ob['goal']['goal']}")
    rt = d["board"].get("runtime")
    if isinstance(rt, dict):
        dec = ("NPU items on the NPU" if rt.get("decode_engine") == "npu" else "on the CPU")
        npu = (f"NPU submit {rt['submit_overhead_s'] * 1e6:.0f} us, efficiency {rt['npu_efficiency']:.3g}; "
               if "npu" in rt.get("engines", []) else "no NPU; ")
        console.print(f"runtime path {escape_name(str(rt['name']))}: {npu}decode {dec}, "
                      f"{rt['decode_fraction']:.3g} x the board's stream + {rt['decode_token_s'] * 1e3:.3g} ms/token"
                      + (f", {rt['request_s'] * 1e3:.3g} ms/request" if rt.get("request_s") else ""))
    t = Table(title="Budget per engine")
    for c in ("engine", "used", "cap", "headroom", "what"):
        t.add_column(c, justify="left" if c in ("engine", "what") else "right")
    n, r = bu["npu"], bu["ram"]
    dual = sum(1 for x in tm.decisions if x.host_copy)
    lv, ln = level_names(d["board"], title=True), level_names(d["board"])  # the levels' formats, as labels / as is
    t.add_row("NPU (IOVA)", _b(n["used"]), _b(n["cap"]), _b(n["headroom"]),
              f"{n['items']} int8 items ({dual} with a host {lv['nf4']} copy for decode)")
    t.add_row("RAM (UMA)", _b(r["used"]), _b(r["cap"]), _b(r["headroom"]),
              f"NPU {_b(r['npu_weights'])}, host copies {_b(r['host_copy_nf4'])}, {lv['int8']} {_b(r['host_int8'])}, "
              f"{lv['nf4']} {_b(r['host_nf4'])}, float {_b(r['host_float'])}, KV {_b(r['kv_cache'])}, reserve {_b(r['reserve'])}")
    console.print(t)
    if "recurrent_state" in r:  # a hybrid: the KV of its attention layers, its fixed state, the saving
        from .. import archs

        rec, par = len(m.get("recurrent_layers") or ()), len(m.get("parallel_layers") or ())
        if par:  # attention beside the recurrence (Falcon-H1): the state comes on top of the KV
            console.print(f"KV cache {_b(r['kv_cache'])} at ctx {d['options']['ctx']}: {len(archs.kv_layers(m))} "
                          f"attention layers' KV + {rec} recurrent layers' state {_b(r['recurrent_state'])} (per "
                          f"sequence, any ctx); {par} layers run attention and the recurrence in parallel, so hold both: "
                          f"{_b(r['kv_cache'] - r['kv_all_attention'])} more than all {m['n_layers']} layers attention "
                          f"alone ({_b(r['kv_all_attention'])})")
        else:
            ffn = len(m.get("ffn_layers") or ())  # FFN-only layers (Nemotron-H) hold neither KV nor state
            mixers = m["n_layers"] - ffn
            console.print(f"KV cache {_b(r['kv_cache'])} at ctx {d['options']['ctx']}: {mixers - rec} attention "
                          f"layers' KV + {rec} recurrent layers' state {_b(r['recurrent_state'])} (per sequence, any "
                          f"ctx); all {mixers} {'mixer ' if ffn else ''}layers attention would need "
                          f"{_b(r['kv_all_attention'])} (saves {_b(r['kv_all_attention'] - r['kv_cache'])})")
    if "kv_unshared" in r:  # gemma4: the layers that reuse earlier layers' K/V store none
        sh = len(m.get("kv_shared_layers") or ())
        console.print(f"KV cache {_b(r['kv_cache'])} at ctx {d['options']['ctx']}: {sh} of {m['n_layers']} layers "
                      f"reuse earlier layers' K/V and store none (each layer its own would need {_b(r['kv_unshared'])})")
    w = bu.get("weights")
    if w:  # the weight bytes: what the pack holds, what a decode token reads; the size bound when one was asked
        g = tm.objective.get("goal") or {}
        bound = "" if w.get("cap") is None else (
            f"; bound {'--bpw ' + format(g['bpw'], 'g') if g.get('bpw') is not None else '--max-bytes'} = "
            f"{_b(w['cap'])} of {'the pack' if w['of'] == 'file' else 'what a decode token reads'}")
        console.print(f"weights: {_b(w['file'])} in the pack ({w['bpw']:.3f} bits per weight of {w['params']:,}), "
                      f"decode reads {_b(w['decode'])} a token{bound}")
    for lk in bu.get("lookups") or ():  # every embedding table: a row lookup on the host, never an NPU item
        per = lk["decode_bytes_per_token"]
        per = f"{per / 1024:.1f} KiB" if per < 1 << 20 else _b(per)
        reads = f"one row a token and all of it as the tied output head ({per})" if lk.get("tied_head") \
            else f"one row a token ({per})"
        enc = level_names(d["board"]).get(lk["encoding"], lk["encoding"])  # the level's format ("float" as is)
        console.print(f"lookup {escape_name(lk['tensor'], 60)}: {lk['rows']} rows x {lk['row']}, host "
                      f"{escape_name(str(enc))} {_b(lk['bytes'])}; decode reads {reads}, never the NPU")
    ben = getattr(tm, "benefits", {})  # the profile's benefit of every item, NPU or not
    named = [(x.name, x) for x in tm.decisions]
    # the top ones of sorted(...) (heapq.nsmallest is sorted(...)[:top]; names are unique, so no ties)
    gains = [(-b, n, x) for n, x, b in ((n, x, ben.get(n, x.benefit_us)) for n, x in named) if b > 0]
    hot = [x for _, _, x in heapq.nsmallest(top, gains, key=lambda t: t[:2])]
    if not hot and isinstance(rt, dict) and "npu" not in rt.get("engines", []):
        console.print("This runtime path does not use the NPU: every item stays on the host.")
    elif not hot:
        console.print(f"No item gains from the NPU at M = {pr['prefill_m']} on this board with this runtime path (every min_m is larger).")
    else:
        t = Table(title=f"Hottest {len(hot)} items (NPU benefit per prefill chunk of {pr['prefill_m']} tokens)")
        for c in ("item", "benefit", "encoding", "tier", "min_m"):
            t.add_column(c, justify="left" if c == "item" else "right")
        for x in hot:  # a host item's encoding, and a copy's, as its level's format (an NPU item's is its tiles')
            copy = x.host_copy if x.encoding == "nf4" else ln.get(x.host_copy, x.host_copy)  # stored 4-bit: b64 NF4
            tier = x.tier + (f"+host {copy}" if x.host_copy else "")
            enc = ln.get(x.encoding, x.encoding) if x.tier == "host" else x.encoding
            t.add_row(escape_name(x.name, 60), f"{ben.get(x.name, x.benefit_us) / 1e3:.3f} ms", enc, tier,
                      str(x.min_m) if x.min_m < (1 << 30) else "never")
        console.print(t)
    fell = [(-ben[n], n, x) for n, x in named if x.tier == "host" and ben.get(n, 0) > 0]
    if fell:
        t = Table(title=f"Fell off the NPU ({len(fell)} items with a benefit; top {min(top, len(fell))})")
        for c in ("item", "benefit", "why"):
            t.add_column(c)
        for x in [x for _, _, x in heapq.nsmallest(top, fell, key=lambda t: t[:2])]:
            need = getattr(tm, "npu_bytes", {}).get(x.name, 0)
            why = (f"pinned {x.pin}" if x.pin else
                   f"NPU full: {_b(n['headroom'])} free, needs {_b(need)}; the resident set saves more in total"
                   if need > n["headroom"] else
                   f"not for room ({_b(n['headroom'])} free, needs {_b(need)}): host {ln.get(x.encoding, x.encoding)} ranks better in "
                   f"the goal's later stages (quality within the prefill slack, or decode)")
            t.add_row(escape_name(x.name, 60), f"{ben[x.name] / 1e3:.3f} ms", why)
        console.print(t)
    lv = level_names(d["board"], title=True)  # the baselines are every item at one host level, in that level's format
    hi = f"CPU only, all {lv['int8']}" + (" (like llama.cpp Q8_0)" if lv["int8"] == "int8" else "")
    _pred_table(console, [("this plan", pr), (f"CPU only, all {lv['nf4']}", pr["baselines"]["cpu_nf4"]),
                          (hi, pr["baselines"]["cpu_int8"])], pr["prompt"])
    proof = "optimal" if ob["status"] == "optimal" else "within the proven gaps: " + ", ".join(
        f"{x['metric']} {abs(x['value'] - x['bound']):.3g} {x['unit']}" for x in ob["stages"] if x["status"] != "optimal")
    console.print(f"Objective: {' then '.join(ob['order'])}; {proof}; {ob['items']} items in {ob['groups']} groups "
                  f"({ob['variables']} variables); solved in {solve_s * 1e3:.0f} ms")
    best_dec = next((x["value"] for x in ob["stages"] if x["metric"] == "decode"), None)
    if ob.get("decode_slack") and best_dec:
        where = ("NPU items decode on the NPU (this runtime path)" if isinstance(rt, dict) and rt.get("decode_engine") == "npu"
                 else "decode (M = 1) always runs on the CPU")
        got = pr["decode_tok_s"]
        slow = got < (1 - ob["decode_slack"]) / best_dec * (1 - 1e-4)  # host levels slower than that (TIERMAP.md 5)
        console.print(f"Decode is kept within {ob['decode_slack']:.0%} of the best this board allows "
                      f"({1 / best_dec:.2f} tok/s" + (", host NF4)" if d["board"].get("host_low", "nf4") != "nf4" else ")") + (f"; these host levels allow at most {got:.2f} tok/s, "
                      "and the plan decodes that fast" if slow else "") + f"; {where}")
    if ob.get("prefill_slack"):
        console.print(f"Prefill is kept within {ob['prefill_slack']:.0%} of the most that decode allows, for quality")
    tried = d["options"].get("host_levels")
    if tried:  # no --host-low / --host-high: the levels the plan chose, and why (docs/TIERMAP.md 5)
        won = next(r for r in tried if r["outcome"] == "chosen")
        rest = "; ".join(f"{' / '.join(r['levels'])} " + (f"predicted KLD {r['kld']:.4f}, " if "kld" in r else "")
                         + r["outcome"] for r in tried if r is not won)
        if (ob.get("goal") or {}).get("goal") == "quality":  # a size bound's every pair: how many, the rest in --json
            rest = (f"the least of {sum('kld' in r for r in tried)} pairs planned under the bound "
                    f"({sum('kld' not in r for r in tried)} did not fit; each in --json options.host_levels)")
        console.print(f"Host levels {' / '.join(won['levels'])} (predicted KLD {won['kld']:.4f}), chosen as no level was given; "
                      f"{rest} (--host-low / --host-high choose)")
    for w in getattr(tm, "warnings", []):
        console.print(f"[yellow]warning:[/] {w}")


SIZE_POINTS = 11  # the size frontier's budgets: evenly from the smallest pack to the best-quality one


def size_frontier(man, b, prof, *, ctx: int, kv_type: str, pins, goal: Goal, prompt: int) -> list[TierMap]:
    """The least predicted KLD at each size: ``SIZE_POINTS`` byte budgets (``goal.bytes_of``) evenly from the
    smallest plan (every item its smallest choice) to the best-quality plan's bytes, each solved exactly with the goal
    quality (then decode, then prefill) under the other constraints; repeated and dominated points dropped, the
    rest sorted by size, smallest first."""
    of = goal.bytes_of
    keep = dict(min_decode_tok_s=goal.min_decode_tok_s, min_prefill_tok_s=goal.min_prefill_tok_s,
                max_ram=goal.max_ram, max_kld=goal.max_kld, bytes_of=of)
    top = solve(man, b, prof, ctx=ctx, kv_type=kv_type, pins=pins, goal=Goal("quality", **keep), prompt=prompt)
    hi = top.budget["weights"][of]
    lo = least_weight_bytes(man, b, prof, pins, of)
    pts = [top]
    for j in range(SIZE_POINTS - 1):
        cap = int(lo + (hi - lo) * j / (SIZE_POINTS - 1))
        try:
            pts.append(solve(man, b, prof, ctx=ctx, kv_type=kv_type, pins=pins, prompt=prompt,
                             goal=Goal("quality", max_bytes=max(cap, 1), **keep)))
        except OrkError:
            continue
    key = {id(t): (t.budget["weights"][of], round(t.prediction["kld"], 6)) for t in pts}
    out, seen = [], set()
    for t in sorted(pts, key=lambda t: key[id(t)]):
        k = key[id(t)]
        if k in seen or any(o[0] <= k[0] and o[1] < k[1] for o in key.values()):
            continue
        seen.add(k)
        out.append(t)
    for j, tm in enumerate(out):
        tm.objective["frontier_point"] = j
    return out


def render_size_frontier(points: list[TierMap], console, solve_s: float) -> None:
    from rich.table import Table

    of = points[0].budget["weights"].get("of") or "file"
    t = Table(title=f"Size frontier: {len(points)} optimal plans (the least predicted KLD at each size of "
                    f"{'the pack' if of == 'file' else 'what a decode token reads'})")
    for c in ("#", "weights", "bits per weight", "KLD (predicted)", "decode tok/s", "prefill tok/s", "NPU items"):
        t.add_column(c, justify="right")
    for j, tm in enumerate(points):
        p, w = tm.prediction, tm.budget["weights"]
        t.add_row(str(j), _b(w[of]), f"{8 * w[of] / max(w['params'], 1):.3f}", f"{p['kld']:.4f}",
                  f"{p['decode_tok_s']:.2f}", f"{p['prefill_tok_s']:.1f}", str(tm.budget["npu"]["items"]))
    console.print(t)
    console.print(f"solved in {solve_s:.2f} s; build one with: orkpack plan ... --frontier-size -o DIR, then "
                  "orkpack build SOURCE --tiermap DIR/frontier-K.json, or orkpack build SOURCE --max-bytes BYTES")


def render_frontier(points: list[TierMap], console, solve_s: float) -> None:
    from rich.table import Table

    t = Table(title=f"Pareto frontier: {len(points)} optimal plans (decode, prefill, predicted KLD)")
    for c in ("#", "decode tok/s", "prefill tok/s", "TTFT", "KLD (predicted)", "NPU items", "host copies", "host int8"):
        t.add_column(c, justify="right")
    for j, tm in enumerate(points):
        p, bu = tm.prediction, tm.budget
        t.add_row(str(j), f"{p['decode_tok_s']:.2f}", f"{p['prefill_tok_s']:.1f}", f"{p['ttft_s']:.2f} s", f"{p['kld']:.4f}",
                  str(bu["npu"]["items"]), _b(bu["ram"]["host_copy_nf4"]), _b(bu["ram"]["host_int8"]))
    console.print(t)
    console.print(f"solved in {solve_s:.2f} s; build one with: orkpack plan ... --frontier -o DIR, then "
                  "orkpack build SOURCE --tiermap DIR/frontier-K.json")


def plan_inputs(model, *, board=None, runtime=None, profile=None, boards=None, network=None) -> list:
    """The files a plan reads, as ``(path, what)`` pairs for :func:`orkpack.files.refuse_over_inputs`: the model
    (a config.json, a weight file, or every file of its folder), the board, runtime, profile and network files
    and a cluster's board files."""
    import tomllib

    out: list = []
    m = Path(model)
    if m.is_dir():
        out += [(f, "a file of the model folder") for f in sorted(m.iterdir()) if f.is_file()]
    else:
        out.append((m, "the model"))
    for v, what in ((board, "the --board file"), (runtime, "the --runtime file"), (profile, "the --profile file"),
                    (network, "the --network file")):
        out.append((option_file(v), what))
    for name in (str(boards).split(",") if boards else []):
        f = option_file(name.strip())
        out.append((f, "a --boards file"))
        if f is not None and f.suffix == ".toml":
            try:
                names = tomllib.loads(f.read_text(encoding="utf-8")).get("boards")
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
                names = None
            for b in names if isinstance(names, list) else []:
                out.append((option_file(b) if isinstance(b, str) else None, "a board file of the cluster"))
    return out


@_without_gc
def plan_command(model, *, board: str = "rk3588-32g", profile: Path | None = None, ctx: int = 8192,
                 kv_type: str = "f16", prefill_m: int = 512, pins: dict[str, list[str]] | None = None,
                 ignore_unknown: bool = False, json_out: bool = False, output: Path | None = None, console=None,
                 goal: Goal | None = None, prompt: int = 512, frontier_out: bool | str = False,
                 runtime: str | None = None, nf4_format: str | None = None, revision: str | None = None,
                 host_low: str | None = None, host_high: str | None = None) -> int:
    """The whole ``orkpack plan``: returns the exit code; raises OrkError for bad input. ``model``: a path or a hub
    name (``revision``: its branch, tag or commit), located once the options are checked (orkpack/sources/hub.py)."""
    from ..sources.hub import locate

    _no_collection_at_exit()
    if console is None and not json_out:  # --json prints no table: rich is not even imported
        from rich.console import Console

        console = Console()
    goal = goal or Goal()
    if output is not None and not frontier_out:
        refuse_over_inputs(Path(output), plan_inputs(model, board=board, runtime=runtime, profile=profile),
                           "the tier map")
    if frontier_out:
        if output is not None and not Path(output).is_dir():
            raise OrkError(f"{escape_name(str(output))}: with --frontier, -o names a folder (one tier map per point); "
                           "create it first")
        b = with_host_formats(load_board(board, runtime, nf4_format), host_low, host_high, "--host-low / --host-high")
        man = manifest_from_path(locate(model, revision=revision))
        prof = load_profile(profile, man, b, prefill_m, ignore_unknown=ignore_unknown)
        t0 = time.perf_counter()
        make = size_frontier if frontier_out == "size" else frontier  # --frontier-size, else --frontier
        pts = make(man, b, prof, ctx=ctx, kv_type=kv_type, pins=pins, goal=goal, prompt=prompt)
        dt = time.perf_counter() - t0
        if not pts:
            raise OrkError("no plan meets the constraints on this board; relax --min-*-tok-s / --max-ram")
        if output is not None:
            for j, tm in enumerate(pts):
                write_atomic(Path(output) / f"frontier-{j}.json", dumps(tm))
        if json_out:
            import json

            text = json.dumps({"frontier": [tm.to_json() for tm in pts]}, separators=(",", ":")) + "\n"
            console.file.write(text) if hasattr(console, "file") else print(text, end="")
        else:
            (render_size_frontier if frontier_out == "size" else render_frontier)(pts, console, dt)
            if output is not None:
                console.print(f"{len(pts)} tier maps written to {escape_name(str(output))}/frontier-K.json")
        return 0
    if output is not None and not Path(output).parent.is_dir():
        raise OrkError(f"{escape_name(str(output))}: folder {escape_name(str(Path(output).parent))} does not exist; create it first")
    tm, solve_s, (man, b, prof) = plan(locate(model, revision=revision), board=board, profile=profile, ctx=ctx, kv_type=kv_type,
                                       prefill_m=prefill_m, pins=pins, ignore_unknown=ignore_unknown, goal=goal,
                                       prompt=prompt, runtime=runtime, nf4_format=nf4_format, host_low=host_low,
                                       host_high=host_high)
    text = dumps(tm) if output is not None or json_out else None  # the tables alone need no map text
    if output is not None:
        write_atomic(Path(output), text)
    if json_out:
        console.file.write(text) if hasattr(console, "file") else print(text, end="")
        for w in getattr(tm, "warnings", []):  # stdout stays JSON; people still hear about the source
            print(f"warning: {w}", file=sys.stderr)
    else:
        from . import cost

        names = [it.name for it in man.items]
        tm.benefits = {n: x * 1e6 for n, x in zip(names, prof.benefit)}  # what the tables show
        # the NPU bytes of what fell off the NPU (host items with a benefit: those of a positive one)
        shapes = {(it.n, it.k) for it in man.items}
        per_shape = {(n, k): cost.npu_bytes(n, k, b) for n, k in shapes}
        tm.npu_bytes = {n: per_shape[(it.n, it.k)] for n, it, x in zip(names, man.items, prof.benefit) if x > 0}
        render(tm, console, solve_s)
        if output is not None:
            console.print(f"tier map written to {escape_name(str(output))}")
    return 0
