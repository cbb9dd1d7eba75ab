"""Tier maps across boards over llama.cpp RPC (docs/CLUSTER.md).

A cluster is an ordered list of boards: node 0 is the client (it runs ``llama-cli`` /
``llama-server`` and holds the model's own part: the token embedding, the output head and the
tensors outside the layers), every node holds one contiguous range of layers (what llama.cpp's
layer split runs), in list order: node 0 the first range, node 1 the next, ... A node may hold no
layer (it is then left out of the command lines): a model that fits one board never gets a worse
plan on two.

The layer split and every item's choice on its board are decided together by one mixed-integer
program per objective stage (exact: HiGHS proves each stage optimal, as the single-board solver):

  u[l, j] in {0, 1}  (j < B-1)   layer l sits on a node <= j; u[l, j] >= u[l+1, j] (contiguous ranges in
                                 list order) and u[l, j] <= u[l, j+1]
  N[k, j]                        layers of class k on node j = sum over l in k of u[l, j] - u[l, j-1]
                                 (u[l, -1] = 0, u[l, B-1] = 1): linear in u
  n[k, g, j, c] integer >= 0     how many items of group g of the layers of class k on node j take choice c;
                                 sum over c = (items of g in one such layer) x N[k, j]
  w[j] in {0, 1}  (j >= 1)       node j holds a layer: w[j] <= sum over k of N[k, j] <= n_layers x w[j]

When every layer is alike (one class) the split is the layer counts themselves: integers c[j] = layers on
nodes <= j, 0 <= c[0] <= ... <= n_layers, N[j] = c[j] - c[j-1] (every count vector is one contiguous split).

A *layer class* is a set of layers alike in every cost (their items' cost classes on every board type,
their KV bytes, their float tensors, attention and router times): items of one class on one node are
interchangeable, so counting them is exact (the same argument as the single-board grouping, per node).

Per node j (board b): NPU bytes <= b's iova_usable_bytes; reserve + KV(ctx) of its layers + their float
tensors + its items' resident bytes <= b's total_bytes (or --max-ram): each board keeps its own budgets.

Times (each node's part is exactly the single-board cost model, docs/TIERMAP.md section 2, of the
tensors it holds; the network model is below):

  decode (s/token)   = sum over used nodes of [token_fixed_s + (its floats + KV(P) of its layers
                       + sum share x decode bytes of its items) / its bandwidth]
                       + sum over used remote nodes of net(1)
  prefill (s/chunk)  = sum over used nodes of [token_fixed_s + attention + routers of its layers
                       + its items' prefill times] + sum over used remote nodes of net(prefill_m)
  net(rows)          = round_trips_per_eval x latency_s + 2 x rows x hidden x 4 / bandwidth (network.py)
  TTFT               = sum over the prompt's chunks of the same, at each chunk's rows and positions

llama.cpp runs the devices one after the other for one sequence, so the times add.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..errors import OrkError, escape_name
from ..files import is_file
from ..keepfloat import recorded_globs
from . import cost, milp, solver
from ..pack.hostlevels import level_names
from .board import Board, load_board, with_host_formats
from .llamacpp import commands, memory_proportional
from .network import Network, _network_from, load_network
from .tomlfile import read_toml
from .manifest import Manifest, _layer, state_bytes
from .profile import Profile, load_profile

STAGE_TOL = 1e-6
REL_GAP = milp.REL_GAP  # one gap for every MILP of the planner


@dataclass
class ClusterSpec:
    boards: list[Board]
    hosts: list[str]
    network: Network
    ports: list[int] | None = None  # per node; default llamacpp.RPC_PORT on every node
    cpus: str = "4-7"  # the CPUs every llama.cpp process is pinned to (taskset -c): RK3588's four A76 cores
    bind: str | None = None  # "0.0.0.0" only when the cluster file asks for it by name; else each node's own host


def parse_cluster(boards: str, network: str | None = None, runtime: str | None = None,
                  nf4_format: str | None = None, host_low: str | None = None,
                  host_high: str | None = None) -> ClusterSpec:
    """``--boards``: a comma-separated list of board names or TOML files, or a cluster TOML file
    (``boards = [...]``, optional ``hosts = [...]``, optional ``[network]``). ``--network`` wins over a
    file's [network]; a board file's own [network] (the client's) is used when neither is given. ``runtime``:
    the runtime path every board runs (--runtime; default ggml-ork); ``nf4_format``: the NF4 format the build writes
    every node's host NF4 in (--nf4-format; default dq32); ``host_low`` / ``host_high``: the formats of every
    node's two host levels (--host-low / --host-high; one build writes every node's pack in them)."""
    text = (boards or "").strip()
    hosts: list[str] | None = None
    net = None
    spec_extra: dict = {}
    if text.endswith(".toml") and is_file(text) \
            and "boards" in (data := read_toml(Path(text), escape_name(text), "cluster or board")):
        where = escape_name(text)
        names = data["boards"]
        if not isinstance(names, list) or not all(isinstance(x, str) and x for x in names):
            raise OrkError(f"{where}: 'boards' must be a list of board names or files")
        if "hosts" in data:
            hosts = data["hosts"]
            if not isinstance(hosts, list) or len(hosts) != len(names) \
                    or not all(isinstance(h, str) and re.fullmatch(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]", h) for h in hosts):
                raise OrkError(f"{where}: 'hosts' must list one host name or address per board (letters, digits, "
                               "'.', '-', '_', or [IPv6])")
        if "network" in data:
            net = _network_from(data["network"], where)
        ports = data.get("ports")
        if ports is not None and (not isinstance(ports, list) or len(ports) != len(names) or not all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65535 for x in ports)):
            raise OrkError(f"{where}: 'ports' must list one TCP port (1-65535) per board")
        cpus = data.get("cpus", "4-7")
        if not isinstance(cpus, str) or not re.fullmatch(r"\d{1,4}(-\d{1,4})?(,\d{1,4}(-\d{1,4})?)*", cpus):
            raise OrkError(f"{where}: 'cpus' must be a CPU list as taskset -c takes it (e.g. \"4-7\", the A76 cores)")
        bind = data.get("bind")
        if bind is not None and bind != "0.0.0.0":
            raise OrkError(f"{where}: 'bind' may only be \"0.0.0.0\" (every interface; each rpc-server binds to its "
                           "own host otherwise)")
        spec_extra = {"ports": ports, "cpus": cpus, "bind": bind, "where": where}
    else:
        names = [x.strip() for x in text.split(",")]
        if not text or any(not x for x in names):
            raise OrkError("--boards: give a comma-separated list of boards (e.g. rk3588-32g,rk3588-32g) or a "
                           "cluster .toml file; an empty name is not a board")
    bs = []
    for i, n in enumerate(names):
        try:
            bs.append(with_host_formats(load_board(n, runtime, nf4_format), host_low, host_high,
                                        "--host-low / --host-high"))
        except OrkError as e:
            if "where" in spec_extra:  # a board the cluster file names: say which file and entry
                raise OrkError(f"{spec_extra['where']}: boards[{i}]: {e}") from None
            raise
    if network is not None:
        net = load_network(network)
    elif net is None:
        p = Path(names[0])
        client = read_toml(p, escape_name(names[0]), "board") if (names[0].endswith(".toml") and is_file(p)) else {}
        net = _network_from(client["network"], escape_name(names[0])) if "network" in client else load_network(None)
    hosts = hosts or [f"node{j}" for j in range(len(bs))]
    if spec_extra.get("ports") is not None:
        pairs = list(zip(hosts, spec_extra["ports"]))
        if len(set(pairs)) != len(pairs):
            raise OrkError(f"{escape_name(text)}: two nodes share a host and port; give each rpc-server its own port")
    spec_extra.pop("where", None)
    return ClusterSpec(bs, hosts, net, **spec_extra)


# ------------------------------------------------------------------------------------------------ the model parts

def _shim_facts(facts: dict, layers: list[int]) -> dict:
    """The model facts of a model made of ``layers`` only (sliding-window and recurrent layers renumbered)."""
    swa, rec = set(facts.get("swa_layers") or ()), set(facts.get("recurrent_layers") or ())
    par, ffn = set(facts.get("parallel_layers") or ()), set(facts.get("ffn_layers") or ())
    out = {**facts, "n_layers": len(layers), "swa_layers": [j for j, l in enumerate(layers) if l in swa],
           "recurrent_layers": [j for j, l in enumerate(layers) if l in rec],
           "parallel_layers": [j for j, l in enumerate(layers) if l in par]}
    if "ffn_layers" in facts:
        out["ffn_layers"] = [j for j, l in enumerate(layers) if l in ffn]
    return out


def sub_manifest(man: Manifest, layers: list[int], client: bool) -> tuple[Manifest, list[int]]:
    """(the manifest of what a node holds: ``layers`` and, on the client, the tensors outside the layers;
    each of its items' index in ``man``)."""
    keep = set(layers)
    tensors = [t for t in man.tensors if (_layer(t.name) in keep) or (client and _layer(t.name) is None)]
    sub = Manifest(_shim_facts(man.facts, layers), tensors, man.origin, man.source, hub=man.hub)
    index = {it.key: i for i, it in enumerate(man.items)}
    return sub, [index[it.key] for it in sub.items]


def sub_profile(prof: Profile, idx: list[int]) -> Profile:
    pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
    return Profile(prof.kind, prof.source, prof.prefill_m, pick(prof.benefit), pick(prof.sensitivity), pick(prof.m_eff),
                   pick(prof.min_m), pick(prof.t_cpu), pick(prof.t_npu), list(prof.warnings))


def node_phase(man: Manifest, board: Board, prof: Profile, choices: list[str], *, prompt: int, ctx: int,
               kv_type: str, rows: list | None = None) -> dict:
    """One node's part through the single-board cost model (solver._model / ttft_s): decode s/token at the
    prompt's position, prefill s/chunk, TTFT s of its layers (what ``orkpack plan`` computes for a board).
    ``rows``: its items' solver rows (their pins: which NPU slices are stored 4-bit); default unpinned."""
    rows = solver._rows(man, board, {}) if rows is None else rows
    md = solver._model(man, board, prof, rows, min(prompt, ctx), kv_type, allowed=[(c,) for c in choices])
    ttft = solver.ttft_s(man, board, prof, choices, prompt, md.klass, rows)
    return solver._phase(md, [0] * len(choices), prof.prefill_m, ttft, prompt)


# ------------------------------------------------------------------------------------------------ the program

class _Lin:
    """Sparse linear expressions over the program's variables: {column: coefficient} plus a constant."""

    def __init__(self) -> None:
        self.c: dict[int, float] = {}
        self.k = 0.0

    def add(self, col: int, v: float) -> None:
        if v:
            self.c[col] = self.c.get(col, 0.0) + v

    def add_expr(self, e: "_Lin", f: float) -> None:
        for col, v in e.c.items():
            self.add(col, f * v)
        self.k += f * e.k


@dataclass
class ClusterPlan:
    boards: list[Board]
    hosts: list[str]
    network: Network
    ranges: list[tuple[int, int]]  # per node: [first layer, end)
    choices: list[list[str]]  # per node: the choice of each of its items (sub-manifest order)
    subs: list[tuple[Manifest, list[int]]]
    profiles: list[Profile]  # per node, of its sub-manifest
    nodes: list[dict]  # per node: phase, budget
    prediction: dict
    stages: list[dict]
    split: str  # "optimal" | "memory-proportional" | "fixed"
    solve_s: float
    warnings: list = None
    full: tuple = None  # (manifest, per-node board-type index, per-type profiles, per-type rows)
    goal: object = None
    options: dict = None
    program: dict = None
    launch: dict = None  # how the processes start: {"cpus": taskset list, "bind": None or "0.0.0.0"}


def solve_cluster(man: Manifest, spec: ClusterSpec, *, profile: Path | None = None, prefill_m: int = 512,
                  ctx: int = 8192, kv_type: str = "f16", pins: dict | None = None, goal: solver.Goal | None = None,
                  prompt: int = 512, ignore_unknown: bool = False, fixed: list[tuple[int, int]] | None = None,
                  time_limit: float = milp.TIME_LIMIT, contiguity: str = "auto") -> ClusterPlan:
    """The optimal joint layer split and tier maps of ``man`` over ``spec.boards`` (module docstring);
    ``fixed``: solve the choices only, for this split (the memory-proportional comparison). ``contiguity``:
    "auto" (layer counts when every layer is alike, else per-layer binaries) or "binary" (always per-layer
    binaries; the tests check both give the same optimum)."""
    t0 = time.perf_counter()
    goal = goal or solver.Goal()
    boards, net = spec.boards, spec.network
    if not boards:
        raise OrkError("--boards: give at least one board")
    B = len(boards)
    f = man.facts
    L = int(f.get("n_layers") or 0)
    hidden = int(f.get("hidden") or 0)
    if L < 1:
        raise OrkError(f"{escape_name(man.source)}: no layers to split across boards")
    kv_bytes = man.kv_bytes(ctx, kv_type)  # checks --kv-type and --ctx
    if not isinstance(prompt, int) or prompt < 1:
        raise OrkError(f"--prompt must be a positive number of tokens (got {prompt!r})")
    P = min(prompt, ctx)
    m = prefill_m
    types: list[Board] = []
    for b in boards:
        if b not in types:
            types.append(b)
    tj = [types.index(b) for b in boards]
    pinmap, pin_warn = solver.match_pins(man, pins)
    profs = [load_profile(profile, man, b, prefill_m, ignore_unknown=ignore_unknown) for b in types]
    rows = [solver._rows(man, b, pinmap) for b in types]
    mds = [solver._model(man, b, pr, r, P, kv_type) for b, pr, r in zip(types, profs, rows)]
    items = man.items
    # ---- layer classes
    by_layer: dict[int | None, list[int]] = {}
    for i, it in enumerate(items):
        if it.layer is not None and not 0 <= it.layer < L:
            raise OrkError(f"{escape_name(it.name)}: layer {it.layer} outside the model's {L} layers")
        by_layer.setdefault(it.layer, []).append(i)
    fl_by_layer: dict[int | None, list] = {}
    for t in man.floats:
        fl_by_layer.setdefault(_layer(t.name), []).append(t)
    fl_bytes = {l: sum(t.float_bytes for t in ts) for l, ts in fl_by_layer.items()}

    def one(l: int):
        sh = SimpleNamespace(facts=_shim_facts(f, [l]), floats=fl_by_layer.get(l, []))
        kvc = Manifest.kv_bytes(sh, ctx, kv_type)
        kvp = Manifest.kv_bytes(sh, P, kv_type) + state_bytes(sh.facts)  # decode reads KV(P), writes the state back
        per_t = tuple((solver._attention_s(sh, m, m / 2.0, b) + solver._float_matmuls_s(sh, m, b)) for b in types)
        return kvc, kvp, per_t

    lay_const = {l: one(l) for l in range(L)}

    def gkey(i: int) -> tuple:
        return tuple(md.klass[i] for md in mds)

    classes: dict[tuple, list[int]] = {}  # signature -> layers
    lay_groups: dict[int, dict[tuple, list[int]]] = {}
    for l in range(L):
        groups: dict[tuple, list[int]] = {}
        for i in by_layer.get(l, []):
            groups.setdefault(gkey(i), []).append(i)
        lay_groups[l] = groups
        sig = (tuple(sorted((k, len(v)) for k, v in groups.items())), fl_bytes.get(l, 0), lay_const[l])
        classes.setdefault(sig, []).append(l)
    cls = list(classes.items())
    client_groups: dict[tuple, list[int]] = {}
    for i in by_layer.get(None, []):
        client_groups.setdefault(gkey(i), []).append(i)

    # ---- variables
    ncol = 0
    lo, hi, integ = [], [], []

    def var(lb: float, ub: float) -> int:
        nonlocal ncol
        lo.append(lb), hi.append(ub), integ.append(1)
        ncol += 1
        return ncol - 1

    # every layer alike (one class): any layer counts per node are a contiguous split, so the counts themselves
    # are the split: c[j] = layers on nodes <= j, integers; else one binary u[l, j] per layer and node
    single = len(cls) == 1 and contiguity == "auto"
    if single:
        c_ = [var(0, L) for _ in range(B - 1)]
        if fixed is not None:
            for j in range(B - 1):
                lo[c_[j]] = hi[c_[j]] = float(fixed[j][1])
        u = None
    else:
        u = [[var(0, 1) for _ in range(B - 1)] for _ in range(L)]
        if fixed is not None:
            for l in range(L):
                node = next(j for j, (a, b_) in enumerate(fixed) if a <= l < b_)
                for j in range(B - 1):
                    lo[u[l][j]] = hi[u[l][j]] = 1.0 if node <= j else 0.0
    w = [None] + [var(0, 1) for _ in range(1, B)]

    def N(layers: list[int], j: int) -> _Lin:
        """Layers of ``layers`` on node j (``layers``: a whole class, or one layer when not ``single``)."""
        e = _Lin()
        if single:
            if j <= B - 2:
                e.add(c_[j], 1.0)
            else:
                e.k += float(L)
            if j >= 1:
                e.add(c_[j - 1], -1.0)
            return e
        for l in layers:
            if j <= B - 2:
                e.add(u[l][j], 1.0)
            else:
                e.k += 1.0
            if j >= 1:
                e.add(u[l][j - 1], -1.0)
        return e

    eq_rows: list[tuple[_Lin, float, float]] = []  # (expr, lo, hi) on expr.c (constant moved to the bounds)
    metric = {k: [_Lin() for _ in range(B)] for k in ("ram", "npu", "dec", "pre", "q", "kld")}
    # per node (group col lists) for the read-back
    gcols: list[list[tuple]] = [[] for _ in range(B)]  # (members, [(col, choice)])

    def place(members: list[int], count: _Lin, j: int) -> None:
        t = tj[j]
        md = mds[t]
        i0 = members[0]
        al = md.allowed[i0]
        cols = []
        ub = len(members)
        e = _Lin()
        for ci, c in enumerate(al):
            col = var(0, ub)
            cols.append((col, c))
            e.add(col, 1.0)
            for key, src in (("ram", md.ram), ("npu", md.npu), ("dec", md.dec), ("pre", md.pre), ("q", md.qual),
                             ("kld", md.kld)):
                metric[key][j].add(col, src[i0][ci])
        e.add_expr(count, -1.0)
        eq_rows.append((e, 0.0, 0.0))
        gcols[j].append((members, cols))

    for sig, layers in cls:
        groups = lay_groups[layers[0]]
        kvc, kvp, per_t = lay_const[layers[0]]
        fb = fl_bytes.get(layers[0], 0)
        for j in range(B):
            cnt = N(layers, j)
            b = boards[j]
            metric["ram"][j].add_expr(cnt, float(kvc + fb))
            metric["dec"][j].add_expr(cnt, (kvp + fb) / b.decode_bandwidth)
            metric["pre"][j].add_expr(cnt, per_t[tj[j]])
            for _gk, mem in groups.items():
                size = len(mem)
                members = sorted((i for l in layers for i in lay_groups[l][_gk]), key=lambda i: items[i].name)
                e = _Lin()
                e.add_expr(cnt, float(size))
                place(members, e, j)
    one_ = _Lin()
    one_.k = 1.0
    for _gk, mem in client_groups.items():
        e = _Lin()
        e.add_expr(one_, float(len(mem)))
        place(sorted(mem, key=lambda i: items[i].name), e, 0)
    cf = fl_bytes.get(None, 0)
    metric["ram"][0].k += cf
    metric["dec"][0].k += boards[0].decode_token_s + cf / boards[0].decode_bandwidth
    metric["pre"][0].k += boards[0].decode_token_s
    for j in range(1, B):
        b = boards[j]
        metric["dec"][j].add(w[j], b.decode_token_s + net.eval_s(1, hidden))
        metric["pre"][j].add(w[j], b.decode_token_s + net.eval_s(m, hidden))
        e = _Lin()
        e.add(w[j], float(L))
        e.add_expr(N(list(range(L)), j), -1.0)
        eq_rows.append((e, 0.0, float(L) - 1.0))  # w_j = 1 exactly when node j holds a layer: 1 <= layers <= L
    for l in range(0 if single else L - 1):
        for j in range(B - 1):
            e = _Lin()
            e.add(u[l][j], 1.0)
            e.add(u[l + 1][j], -1.0)
            eq_rows.append((e, 0.0, np.inf))
    for l in range(1 if single else L):
        for j in range(B - 2):
            e = _Lin()
            if single:
                e.add(c_[j + 1], 1.0)
                e.add(c_[j], -1.0)
            else:
                e.add(u[l][j + 1], 1.0)
                e.add(u[l][j], -1.0)
            eq_rows.append((e, 0.0, np.inf))
    cap_rows = []
    for j, b in enumerate(boards):
        cap = b.total_bytes if goal.max_ram is None else min(b.total_bytes, goal.max_ram)
        cap_rows.append((metric["ram"][j], -np.inf, float(cap - b.reserve_bytes)))
        cap_rows.append((metric["npu"][j], -np.inf, float(b.iova_usable_bytes)))

    def total(key: str) -> _Lin:
        e = _Lin()
        for x in metric[key]:
            e.add_expr(x, 1.0)
        return e

    tot = {k: total(k) for k in ("dec", "pre", "q", "kld")}
    caps = []
    if goal.max_kld is not None:
        caps.append((tot["kld"], -np.inf, float(goal.max_kld)))
    if goal.min_decode_tok_s:
        caps.append((tot["dec"], -np.inf, 1.0 / goal.min_decode_tok_s))
    if goal.min_prefill_tok_s:
        caps.append((tot["pre"], -np.inf, m / goal.min_prefill_tok_s))

    def vec(e: _Lin) -> np.ndarray:
        v = np.zeros(ncol)
        for col, x in e.c.items():
            v[col] += x
        return v

    def rows_of(rowlist):
        """(row, col, value) triplets and row bounds, each row scaled to max |coefficient| = 1 (HiGHS's
        tolerances are absolute), the expression's constant moved into the bounds."""
        r, c_, v, lbs, ubs = [], [], [], [], []
        for k, (e, a, b) in enumerate(rowlist):
            s = max((abs(x) for x in e.c.values()), default=1.0) or 1.0
            for col, x in e.c.items():
                r.append(k), c_.append(col), v.append(x / s)
            lbs.append((a - e.k) / s if np.isfinite(a) else -np.inf)
            ubs.append((b - e.k) / s if np.isfinite(b) else np.inf)
        return np.array(r, dtype=np.int64), np.array(c_, dtype=np.int64), np.array(v), np.array(lbs), np.array(ubs)

    bounds_lo, bounds_hi = np.array(lo, float), np.array(hi, float)

    def run(obj: _Lin, sense: str, extra: list):
        """One stage handed to HiGHS through the binding scipy ships (milp._highs, as the single-board solver:
        no scipy.optimize import). Returns (x or None, infeasible, optimal, dual bound of the scaled objective
        or None, scale)."""
        h = milp._highs()
        c = vec(obj) * (1.0 if sense == "min" else -1.0)
        scale = float(np.abs(c).max(initial=0.0)) or 1.0
        r, cc, v, lbs, ubs = rows_of(eq_rows + cap_rows + caps + extra)
        order_ = np.lexsort((r, cc))
        r, cc, v = r[order_], cc[order_], v[order_]
        lp = h.HighsLp()
        lp.num_col_ = lp.a_matrix_.num_col_ = ncol
        lp.num_row_ = lp.a_matrix_.num_row_ = len(lbs)
        lp.a_matrix_.format_ = h.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.concatenate([[0], np.cumsum(np.bincount(cc, minlength=ncol))]).astype(np.int32)
        lp.a_matrix_.index_ = r.astype(np.int32)
        lp.a_matrix_.value_ = v
        lp.col_cost_ = c / scale
        lp.col_lower_, lp.col_upper_ = bounds_lo, bounds_hi
        lp.row_lower_, lp.row_upper_ = lbs, ubs
        lp.integrality_ = [h.HighsVarType.kInteger] * ncol
        highs = milp.run_highs(lp, time_limit)
        st, info, S = highs.getModelStatus(), highs.getInfo(), h.HighsModelStatus
        has_x = st == S.kOptimal or (st in (S.kTimeLimit, S.kIterationLimit, S.kSolutionLimit)
                                     and info.objective_function_value != h.kHighsInf)
        x_ = np.array(highs.getSolution().col_value) if has_x else None
        bound = float(info.mip_dual_bound) if has_x else None
        return x_, st in (S.kInfeasible, S.kUnboundedOrInfeasible), st == S.kOptimal, bound, scale

    if goal.name == "balanced" or goal.decode_floor is not None:
        order = [("dec", "min", solver.DECODE_SLACK), ("pre", "min", solver.PREFILL_SLACK), ("q", "max", None)]
    else:
        order = {"decode": [("dec", "min", None), ("pre", "min", None), ("q", "max", None)],
                 "prefill": [("pre", "min", None), ("dec", "min", None), ("q", "max", None)],
                 "quality": [("q", "max", None), ("dec", "min", None), ("pre", "min", None)]}[goal.name]
    extra: list = []
    stages = []
    x = None
    for key, sense, slack in order:
        xs, infeasible, optimal, bound, scale = run(tot[key], sense, extra)
        if xs is None:
            if infeasible or x is None:
                raise _infeasible(man, spec, ctx, kv_type, kv_bytes, goal, bool(extra))
            stages.append({"metric": key, "sense": sense, "value": None, "bound": None, "status": "gap"})
            continue
        x = np.round(xs)
        val = float(vec(tot[key]) @ x + tot[key].k)
        bnd = val if bound is None or not np.isfinite(bound) else (bound * scale if sense == "min" else -bound * scale) + tot[key].k
        ok = optimal and abs(val - bnd) <= max(REL_GAP * abs(val), 1e-12) * 10
        stages.append({"metric": {"dec": "decode", "pre": "prefill", "q": "quality"}[key], "sense": sense,
                       "value": round(val, 9), "bound": round(bnd, 9), "status": "optimal" if ok else "gap",
                       "unit": {"dec": "s/token", "pre": "s/chunk", "q": "sensitivity"}[key]})
        if sense == "min":
            lim = val / (1.0 - slack) if slack else val + STAGE_TOL * abs(val)
            extra.append((tot[key], -np.inf, lim))
        else:
            extra.append((tot[key], val - STAGE_TOL * abs(val), np.inf))
    # ---- read back: the split, then each node's choices (members in name order, last-listed choice first)
    counts = []
    for j in range(B):
        e = N(list(range(L)), j)
        counts.append(int(round(e.k + sum(v * x[c] for c, v in e.c.items()))))
    ranges, a = [], 0
    for j in range(B):
        ranges.append((a, a + counts[j]))
        a += counts[j]
    pick: dict[tuple[int, int], str] = {}  # (node, item) -> choice
    for j in range(B):
        lo_l, hi_l = ranges[j]
        for members, cols in gcols[j]:
            mine = [i for i in members if items[i].layer is None or lo_l <= items[i].layer < hi_l]
            pos = 0
            for col, c in reversed(cols):
                k = int(x[col])
                for i in mine[pos: pos + k]:
                    pick[(j, i)] = c
                pos += k
            if pos != len(mine):
                raise OrkError("internal: the cluster plan's counts do not add up; please report")
    plan = _assemble(man, spec, ranges, pick, profs, tj, rows, ctx=ctx, kv_type=kv_type, prompt=prompt,
                     prefill_m=m, goal=goal)
    plan.stages = stages
    plan.split = "fixed" if fixed is not None else "optimal"
    plan.options["pins"] = {k: list((pins or {}).get(k) or []) for k in solver.PIN_KINDS}
    plan.warnings = list(man.source_warnings) + list(man.warnings) + pin_warn + [w_ for p in profs for w_ in p.warnings]
    # the program's totals and the nodes' own cost model, summed node by node, agree
    for key, name in (("dec", "decode_s_per_token"), ("pre", "prefill_s_per_chunk")):
        want, got = float(vec(tot[key]) @ x + tot[key].k), plan.prediction[name]
        if abs(got - want) > 1e-6 * abs(want) + 1e-9:
            raise OrkError(f"internal: the cluster {name} {got} differs from the program's {want}; please report")
    plan.program = {"variables": ncol, "binaries": (0 if single else L * (B - 1)) + B - 1, "layer_classes": len(cls),
                    "split_variables": "layer counts" if single else "one binary per layer and node",
                    "constraints": len(eq_rows) + len(cap_rows) + len(caps)}
    plan.solve_s = time.perf_counter() - t0
    return plan


def _ram_caps(spec: ClusterSpec, max_ram: int | None) -> list[int]:
    """Each board's RAM cap: its total, or --max-ram where that is less."""
    return [b.total_bytes if max_ram is None else min(b.total_bytes, max_ram) for b in spec.boards]


def _low(spec: ClusterSpec) -> str:
    """The host low level's format as the refusals name it (NF4 by default)."""
    return level_names(spec.boards[0].to_json(), title=True)["nf4"]


def _least_need(man: Manifest, spec: ClusterSpec, kv: int) -> int:
    """Bytes the model needs at the least, on any split: every item at the host low level, the float tensors, the KV
    cache."""
    b = spec.boards[0]  # one build writes every node's pack: one NF4 format, one pair of host levels
    return sum(min(cost.low_bytes(it.n, it.k, b), it.float_bytes) for it in man.items) \
        + sum(t.float_bytes for t in man.floats) + kv


def _no_fit(man: Manifest, spec: ClusterSpec, ctx: int, kv_type: str, kv: int,
            max_ram: int | None = None) -> OrkError:
    need = _least_need(man, spec, kv)
    caps = _ram_caps(spec, max_ram)
    room = sum(max(0, c - b.reserve_bytes) for c, b in zip(caps, spec.boards))
    names = ",".join(b.name for b in spec.boards)
    binds = max_ram is not None and any(c < b.total_bytes for c, b in zip(caps, spec.boards))
    also = "--kv-type q8_0 or a shorter --ctx" if kv_type == "f16" else "a shorter --ctx"  # (q8_0 is the least KV)
    if binds:
        full = sum(b.total_bytes - b.reserve_bytes for b in spec.boards)
        # the least --max-ram whose room (each board's cap less its reserve) adds up to the need: necessary, not
        # always enough (the layers split whole)
        # and the client's own share: the tensors outside the layers (embedding, head, final norm) are its
        home = sum(min(cost.low_bytes(it.n, it.k, spec.boards[0]), it.float_bytes) for it in man.items
                   if it.layer is None) \
            + sum(t.float_bytes for t in man.floats if _layer(t.name) is None)
        lo = max(max_ram, spec.boards[0].reserve_bytes + home)
        hi = max(lo, max(b.total_bytes for b in spec.boards))
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(max(0, min(b.total_bytes, mid) - b.reserve_bytes) for b in spec.boards) >= need:
                hi = mid
            else:
                lo = mid + 1
        advice = (f"raise --max-ram to at least {lo} (it caps each board, whose reserve counts against it; "
                  f"without --max-ram the boards offer {_b(full)})" if need <= full else
                  f"even without --max-ram the boards offer only {_b(full)}; add a board")
        return OrkError(f"{escape_name(man.source)} does not fit on {names} within --max-ram {max_ram}: it needs at "
                        f"least {_b(need)} (every item {_low(spec)}, {kv_type} KV at ctx {ctx}) and a contiguous layer split "
                        f"within each board's budgets; --max-ram {max_ram} less each board's reserve leaves "
                        f"{_b(room)} in all; {advice}, or try {also}")
    return OrkError(f"{escape_name(man.source)} does not fit on {names}: it needs at least {_b(need)} "
                    f"(every item {_low(spec)}, {kv_type} KV at ctx {ctx}) and a contiguous layer split within each board's "
                    f"budgets; the boards offer {_b(room)} in all; add a board, or try {also}")


def _infeasible(man: Manifest, spec: ClusterSpec, ctx: int, kv_type: str, kv: int, goal: solver.Goal,
                staged: bool) -> OrkError:
    """Why no plan was found: the model does not fit (whatever the constraints), or the constraints given (named:
    only those the user gave) cannot all hold."""
    asked = []
    if goal.min_decode_tok_s:
        asked.append(f"--min-decode-tok-s {goal.min_decode_tok_s:g}")
    if goal.min_prefill_tok_s:
        asked.append(f"--min-prefill-tok-s {goal.min_prefill_tok_s:g}")
    if goal.max_kld is not None:
        asked.append(f"--max-kld {goal.max_kld:g}")
    if goal.max_ram is not None and any(c < b.total_bytes for c, b in zip(_ram_caps(spec, goal.max_ram), spec.boards)):
        asked.append(f"--max-ram {goal.max_ram}")
    if staged:
        return OrkError("internal: a stage of the cluster plan found no solution where the stage before it did; "
                        "please report")
    room = sum(max(0, c - b.reserve_bytes) for c, b in zip(_ram_caps(spec, goal.max_ram), spec.boards))
    if _least_need(man, spec, kv) > room or not [a for a in asked if not a.startswith("--max-ram")]:
        return _no_fit(man, spec, ctx, kv_type, kv, goal.max_ram)
    if len(asked) == 1:
        return OrkError(f"no plan across these boards meets {asked[0]}; relax it")
    return OrkError(f"no plan across these boards meets {' and '.join(asked)} together; relax one of them")


def _assemble(man, spec, ranges, pick, profs, tj, rows, *, ctx, kv_type, prompt, prefill_m, goal) -> ClusterPlan:
    boards, net = spec.boards, spec.network
    hidden = int(man.facts.get("hidden") or 0)
    subs, sprofs, choices, nodes = [], [], [], []
    for j, (a, b) in enumerate(ranges):
        sub, idx = sub_manifest(man, list(range(a, b)), client=(j == 0))
        sp = sub_profile(profs[tj[j]], idx)
        ch = [pick[(j, i)] for i in idx]
        used = j == 0 or b > a
        ph = node_phase(sub, boards[j], sp, ch, prompt=prompt, ctx=ctx, kv_type=kv_type,
                        rows=[rows[tj[j]][i] for i in idx]) if used else None
        subs.append((sub, idx))
        sprofs.append(sp)
        choices.append(ch)
        nodes.append({"node": j, "board": boards[j].name, "host": spec.hosts[j], "layers": [a, b], "used": used,
                      "phase": ph, "port": spec.ports[j] if spec.ports else None})
    remote = [j for j in range(1, len(boards)) if nodes[j]["used"]]
    dec = sum(n["phase"]["decode_s_per_token"] for n in nodes if n["used"]) + len(remote) * net.eval_s(1, hidden)
    pre = sum(n["phase"]["prefill_s_per_chunk"] for n in nodes if n["used"]) + len(remote) * net.eval_s(prefill_m, hidden)
    net_ttft, done = 0.0, 0
    while done < prompt:
        r = min(prefill_m, prompt - done)
        net_ttft += len(remote) * net.eval_s(r, hidden)
        done += r
    # each node's TTFT holds its runtime's fixed cost per request; a request is the client's: once
    ttft = sum(n["phase"]["ttft_s"] for n in nodes if n["used"]) + net_ttft \
        - sum(getattr(boards[j], "request_s", 0.0) for j in remote)
    kld = sum(n["phase"]["kld"] for n in nodes if n["used"])
    pred = {"decode_tok_s": round(1.0 / dec, 3), "prefill_tok_s": round(prefill_m / pre, 3), "ttft_s": round(ttft, 4),
            "decode_s_per_token": round(dec, 9), "prefill_s_per_chunk": round(pre, 9), "kld": round(kld, 6),
            "network": {"decode_s_per_token": round(len(remote) * net.eval_s(1, hidden), 9),
                        "prefill_s_per_chunk": round(len(remote) * net.eval_s(prefill_m, hidden), 9),
                        "ttft_s": round(net_ttft, 4), "remote_nodes": len(remote)},
            "prefill_m": prefill_m, "prompt": prompt}
    return ClusterPlan(list(boards), list(spec.hosts), net, ranges, choices, subs, sprofs, nodes, pred, [], "",
                       0.0, None, (man, tj, profs, rows), goal,
                       {"ctx": ctx, "kv_type": kv_type, "prefill_m": prefill_m, "prompt": prompt},
                       launch={"cpus": spec.cpus, "bind": spec.bind})


# ------------------------------------------------------------------------------------------------ per-node tier maps

def node_tiermap(plan: ClusterPlan, j: int):
    """Node ``j``'s tier map: the decisions of the tensors it holds (single-board fields, solver._decision_fields),
    its own budget and prediction, and an ``options.cluster`` block saying where it sits in the cluster."""
    from .tiermap import Decision, TierMap
    from ..sources import names as _names

    man, tj, profs, rows = plan.full
    board = plan.boards[j]
    t = tj[j]
    sub, idx = plan.subs[j]
    o = plan.options
    decisions, npu_used, n_npu = [], 0, 0
    host_w = {"int8": 0, "nf4": 0, "float": 0, "host_copy_nf4": 0}
    for i, c in zip(idx, plan.choices[j]):
        it = man.items[i]
        fields = solver._decision_fields(it, rows[t][i], c, profs[t], i, board)
        decisions.append(Decision(it.tensor, it.expert, *fields))
        _, enc, tier, _, nb, _, _, _, copy_bytes = fields
        if tier == "npu":
            npu_used += nb
            n_npu += 1
            host_w["host_copy_nf4"] += copy_bytes
        else:
            host_w[enc if enc in ("int8", "nf4") else "float"] += nb
    for te in sub.floats:
        enc = "raw" if te.dtype in solver.NON_FLOAT_DTYPES else solver._FLOAT_ENC.get(te.dtype, "f32")
        decisions.append(Decision(te.name, None, te.shape, enc, "host", cost.MIN_M_NEVER, te.float_bytes, 0.0, None))
        host_w["float"] += te.float_bytes
    order = {n: k for k, n in enumerate(sorted({d.tensor for d in decisions}, key=_names.natural_key))}
    decisions.sort(key=lambda d: (order[d.tensor], -1 if d.expert is None else d.expert))
    kv = sub.kv_bytes(o["ctx"], o["kv_type"]) if sub.facts["n_layers"] else 0
    cap = board.total_bytes if plan.goal.max_ram is None else min(board.total_bytes, plan.goal.max_ram)
    ram = board.reserve_bytes + kv + npu_used + sum(host_w.values())
    if npu_used > board.iova_usable_bytes or ram > cap:
        raise OrkError(f"internal: node {j} exceeds a budget (NPU {npu_used}, RAM {ram}); please report")
    budget = {"npu": {"used": npu_used, "cap": board.iova_usable_bytes, "headroom": board.iova_usable_bytes - npu_used,
                      "items": n_npu},
              "ram": {"used": ram, "cap": cap, "headroom": cap - ram, "npu_weights": npu_used,
                      "host_int8": host_w["int8"], "host_nf4": host_w["nf4"], "host_copy_nf4": host_w["host_copy_nf4"],
                      "host_float": host_w["float"], "kv_cache": kv, "reserve": board.reserve_bytes}}
    a, b = plan.ranges[j]
    ph = plan.nodes[j]["phase"] or {}
    prediction = {**ph, "prefill_m": o["prefill_m"], "prompt": o["prompt"], "baselines": {},
                  "model": "this node's part by the board's cost model (docs/TIERMAP.md); the cluster's totals, "
                           "network included: options.cluster.prediction (docs/CLUSTER.md)"}
    keep = recorded_globs([x.name for x in sub.tensors], [x.shape for x in sub.tensors])
    options = {**o, "profile": profs[t].source, "default_keep": list(keep),
               "cluster": cluster_block(plan) | {"node": j, "layers": [a, b]}}
    objective = {"goal": plan.goal.to_json(), "order": [f"{s['metric']} ({s['sense']})" for s in plan.stages],
                 "stages": plan.stages, "status": "optimal" if all(s["status"] == "optimal" for s in plan.stages) else "gap",
                 "method": "joint layer split and tier maps across boards: one MILP per stage (HiGHS; docs/CLUSTER.md)",
                 "items": len(idx), "decode_slack": None, "prefill_slack": None}
    model = {"source": man.source, "origin": man.origin, **man.recorded_facts(), "tensors": len(sub.tensors), "items": len(idx),
             "assumptions": list(man.warnings)} | ({"hub": man.hub} if man.hub else {})
    return TierMap(decisions, model=model, board=board.to_json(), options=options, objective=objective, budget=budget,
                   prediction=prediction)


def cluster_block(plan: ClusterPlan) -> dict:
    """What every node's tier map and cluster.json record of the whole cluster."""
    return {"nodes": [{"node": n["node"], "board": n["board"], "host": n["host"], "layers": n["layers"],
                       "used": n["used"]} for n in plan.nodes],
            "split": plan.split, "network": plan.network.to_json(), "prediction": plan.prediction}



def _port(n: dict) -> int:
    from .llamacpp import RPC_PORT

    return n.get("port") or RPC_PORT


def to_json(plan: ClusterPlan, baseline: ClusterPlan | None = None, packs: list[str | None] | None = None) -> dict:
    nodes = []
    for j, n in enumerate(plan.nodes):
        d = {"node": j, "board": n["board"], "runtime": getattr(plan.boards[j], "runtime", None),
             "nf4_format": plan.boards[j].nf4_format, "host": n["host"], "port": _port(n),
             "layers": n["layers"], "used": n["used"],
             "n_layers": n["layers"][1] - n["layers"][0], "client": j == 0}
        if n["used"]:
            tm = node_tiermap(plan, j)
            d["budget"] = tm.budget
            d["prediction"] = {k: n["phase"][k] for k in ("decode_s_per_token", "prefill_s_per_chunk", "ttft_s", "kld")}
        if packs is not None:
            d["pack"] = packs[j]
        nodes.append(d)
    out = {"schema": "orkpack.cluster", "version": 1,
           "model": {"source": plan.full[0].source, "arch": plan.full[0].facts.get("arch"),
                     "n_layers": plan.full[0].facts.get("n_layers")}
           | ({"hub": plan.full[0].hub} if plan.full[0].hub else {}),
           "options": plan.options, "goal": plan.goal.to_json(), "network": plan.network.to_json(),
           "split": plan.split, "nodes": nodes, "prediction": plan.prediction,
           "objective": {"stages": plan.stages, "program": plan.program,
                         "status": "optimal" if all(s["status"] == "optimal" for s in plan.stages) else "gap"},
           "commands": commands(plan)}
    if baseline is not None:
        out["memory_proportional"] = {"layers": [list(r) for r in baseline.ranges], "prediction": baseline.prediction,
                                      "stages": baseline.stages}
    return out


# ------------------------------------------------------------------------------------------------ plan command

def plan_cluster(model, boards: str, *, network: str | None = None, profile: Path | None = None, ctx: int = 8192,
                 kv_type: str = "f16", prefill_m: int = 512, pins: dict | None = None, ignore_unknown: bool = False,
                 goal: solver.Goal | None = None, prompt: int = 512, baseline: bool = True,
                 runtime: str | None = None, nf4_format: str | None = None, host_low: str | None = None,
                 host_high: str | None = None):
    """(plan, the memory-proportional plan of the same boards or None, manifest); ``model``: a path, a hub name or
    a located one (orkpack/sources/hub.py)."""
    from .manifest import manifest_from_path

    spec = parse_cluster(boards, network, runtime, nf4_format, host_low, host_high)
    man = manifest_from_path(model)
    kw = dict(profile=profile, prefill_m=prefill_m, ctx=ctx, kv_type=kv_type, pins=pins, goal=goal, prompt=prompt,
              ignore_unknown=ignore_unknown)
    plan = solve_cluster(man, spec, **kw)
    base = None
    if baseline and len(spec.boards) > 1:
        try:
            base = solve_cluster(man, spec, fixed=memory_proportional(spec.boards, int(man.facts["n_layers"])), **kw)
            base.split = "memory-proportional"
        except OrkError:
            base = None  # that split does not fit: said in the report
    return plan, base, man


def stage_optima(plan: ClusterPlan) -> str:
    """The stages' optima as people read them: decode and prefill in tokens per second, quality as is."""
    out = []
    for st in plan.stages:
        v = st.get("value")
        if v is None:
            out.append("-")
        elif st["metric"] == "decode":
            out.append(f"{1.0 / v:.3f}")
        elif st["metric"] == "prefill":
            out.append(f"{plan.options['prefill_m'] / v:.3f}")
        else:
            out.append(f"{v:.4f}")
    return " / ".join(out)


def _b(n: int) -> str:
    from .command import _b as shown

    return shown(n)


def render(plan: ClusterPlan, base: ClusterPlan | None, console) -> None:
    from rich.table import Table

    man = plan.full[0]
    o = plan.options
    console.print(f"[bold]{escape_name(man.source)}[/]: {man.facts.get('arch')}, {man.facts.get('n_layers')} layers, "
                  f"{len(man.items)} items; {len(plan.boards)} boards over {plan.network.name} (llama.cpp RPC), "
                  f"runtime {escape_name(', '.join(sorted({str(getattr(b, 'runtime', '?')) for b in plan.boards})))}, "
                  f"ctx {o['ctx']} ({o['kv_type']} KV), goal {plan.goal.name}")
    t = Table(title="Split per board (node 0 is the client: embedding, output head, its own layers)")
    for c in ("node", "board", "host", "layers", "NPU used / cap", "RAM used / cap", "KV", "decode s/tok",
              "prefill s/chunk"):
        t.add_column(c, justify="left" if c in ("board", "host", "layers") else "right")
    for j, n in enumerate(plan.nodes):
        a, b = n["layers"]
        lay = f"{a}-{b - 1} ({b - a})" if b > a else "none"
        if not n["used"]:
            t.add_row(str(j), n["board"], n["host"], lay, "-", "-", "-", "-", "-")
            continue
        bu = node_tiermap(plan, j).budget
        ph = n["phase"]
        t.add_row(str(j) + (" client" if j == 0 else ""), n["board"], n["host"], lay + (" + emb/head" if j == 0 else ""),
                  f"{_b(bu['npu']['used'])} / {_b(bu['npu']['cap'])}", f"{_b(bu['ram']['used'])} / {_b(bu['ram']['cap'])}",
                  _b(bu["ram"]["kv_cache"]), f"{ph['decode_s_per_token']:.4f}", f"{ph['prefill_s_per_chunk']:.3f}")
    console.print(t)
    t = Table(title=f"Predicted speed (prompt {o['prompt']} tokens; network {plan.network.name} included)")
    for c in ("split", "layers per node", "decode tok/s", "prefill tok/s", f"TTFT ({o['prompt']})", "network s/token",
              "KLD (predicted)", "stage optima"):
        t.add_column(c, justify="left" if c in ("split", "layers per node") else "right")
    for name, p_ in (("joint optimum (this plan)", plan), ("llama.cpp memory-proportional", base)):
        if p_ is None:
            continue
        pr = p_.prediction
        t.add_row(name, ",".join(str(b - a) for a, b in p_.ranges), f"{pr['decode_tok_s']:.3f}",
                  f"{pr['prefill_tok_s']:.2f}", f"{pr['ttft_s']:.2f} s", f"{pr['network']['decode_s_per_token']:.4f}",
                  f"{pr['kld']:.4f}", stage_optima(p_))
    console.print(t)
    console.print("stage optima: each objective stage's optimum in turn (decode tok/s, prefill tok/s, quality), what the "
                  "goal ranks plans by; the plan itself then sits within the goal's slacks of them")
    if base is None and len(plan.boards) > 1:
        console.print("llama.cpp's memory-proportional split of these boards does not fit this model within the budgets")
    proof = "optimal" if all(s["status"] == "optimal" for s in plan.stages) else "with a gap"
    pg = plan.program
    console.print(f"Objective: {' then '.join(s['metric'] + ' (' + s['sense'] + ')' for s in plan.stages)}; {proof}; "
                  f"{pg['variables']} variables ({pg['binaries']} binary), {pg['layer_classes']} layer class"
                  f"{'es' if pg['layer_classes'] != 1 else ''}; solved in {plan.solve_s:.2f} s")
    for w_ in plan.warnings or []:
        console.print(f"[yellow]warning:[/] {w_}")


def plan_cluster_command(model, boards: str, *, network: str | None, json_out: bool, output: Path | None,
                         console, revision: str | None = None, **kw) -> int:
    import json

    from ..files import refuse_over_inputs
    from ..sources.hub import locate
    from .command import plan_inputs, write_atomic

    if output is not None:
        refuse_over_inputs(Path(output), plan_inputs(model, runtime=kw.get("runtime"), profile=kw.get("profile"),
                                                     boards=boards, network=network), "the cluster plan")
    model = locate(model, revision=revision)  # a hub name downloaded (or found in the cache) once, here

    if output is not None and not Path(output).parent.is_dir():
        raise OrkError(f"{escape_name(str(output))}: folder {escape_name(str(Path(output).parent))} does not exist; "
                       "create it first")
    plan, base, _ = plan_cluster(model, boards, network=network, **kw)
    d = to_json(plan, base)
    text = json.dumps(d, indent=1) + "\n"
    if output is not None:
        write_atomic(Path(output), text)
    if json_out:
        print(text, end="")
    else:
        if console is None:
            from rich.console import Console

            console = Console()
        render(plan, base, console)
        if output is not None:
            console.print(f"cluster plan written to {escape_name(str(output))}")
    return 0
