"""What makes `orkpack plan` fast must not change what it computes (issue 14).

Each shortcut is checked against the plain computation it replaces: the tier-map text
against json.dumps of to_json(), the HiGHS binding loaded directly against
scipy.optimize.milp, grouping by the solver's classes against grouping item by item, the
per-projection parse of per-expert HF names against canonical_name + split_expert, and
`orkpack plan --json` imports no module it does not use. No test here times anything.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orkpack.sources import names as _names
from orkpack.tiers import milp
from orkpack.tiers.board import load_board
from orkpack.tiers.command import plan
from orkpack.tiers.manifest import manifest_from_config
from orkpack.tiers.profile import load_profile
from orkpack.tiers.solver import _model, _rows
from orkpack.tiers.tiermap import TierMap, dumps

ROOT = Path(__file__).resolve().parents[1]
MOE = ROOT / "tiermaps/configs/qwen3-30b-a3b/config.json"
ROUTING = ROOT / "tiermaps/profiles/qwen3-30b-a3b.routing-example.json"
CONFIGS = sorted((ROOT / "tests/fixtures/configs").glob("*.json")) + sorted((ROOT / "tiermaps/configs").glob("*/config.json"))


def _plain_dumps(tm: TierMap) -> str:
    d = tm.to_json()
    head = {k: v for k, v in d.items() if k != "tensors"}
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    lines = [json.dumps(t, separators=(",", ":"), ensure_ascii=False) for t in d["tensors"]]
    return text + ',\n "tensors": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def test_tiermap_text_is_json_dumps_of_to_json():
    tm, _, _ = plan(MOE, profile=ROUTING)  # experts alike and not, NPU slices with and without a host copy
    assert any(d.host_copy for d in tm.decisions) and any(d.tier == "npu" and not d.host_copy for d in tm.decisions)
    assert dumps(tm) == _plain_dumps(tm)
    # values equal as numbers but printed differently must not share a cached slice text
    d = tm.to_json()
    sl = d["tensors"][0]["slices"]
    d["tensors"][0]["slices"] = [dict(sl[0], benefit_us=0.0), dict(sl[0], benefit_us=-0.0), dict(sl[0], benefit_us=0),
                                 dict(sl[0], bytes=7, expert=3), dict(sl[0], bytes=7, expert=None)]
    d["tensors"].append({"name": 'odd "näme"\\', "slices": [dict(sl[0], pin="--npu,--int8")]})
    odd = TierMap.from_json(json.loads(json.dumps(d)))
    assert dumps(odd) == _plain_dumps(odd)
    assert '"benefit_us":-0.0' in dumps(odd) and '"benefit_us":0.0,' in dumps(odd)
    # an int benefit (a caller's own Decision) prints as an int, the float beside it as a float
    from dataclasses import replace

    first = odd.decisions[0]
    mixed = TierMap([replace(first, benefit_us=0), replace(first, benefit_us=0.0, expert=1)], model=odd.model,
                    board=odd.board, options=odd.options, objective=odd.objective, budget=odd.budget,
                    prediction=odd.prediction)
    assert dumps(mixed) == _plain_dumps(mixed) and '"benefit_us":0,' in dumps(mixed)
    # an unhashable value from a hand-edited map: the plain encoding, same text
    d["tensors"][0]["slices"][0]["pin"] = ["--npu"]
    odd = TierMap.from_json(d)
    assert dumps(odd) == _plain_dumps(odd)


def _random_problem(rng, n_items: int, alike: int):
    """Items in runs of ``alike`` identical ones (one class each), 2-4 choices, 5 metrics."""
    choices, cost, klass = [], {m: [] for m in ("ram", "npu", "dec", "pre", "q")}, []
    while len(choices) < n_items:
        ch = ("nf4", "int8", "npu", "npu+nf4")[: int(rng.integers(2, 5))]
        vals = {m: tuple(float(x) for x in rng.integers(1, 50, len(ch))) for m in cost}
        # like the planner's: host choices use no NPU memory; the first (NF4) needs the least RAM
        vals["npu"] = tuple(0.0 if c in ("nf4", "int8") else v for c, v in zip(ch, vals["npu"]))
        vals["ram"] = tuple(sorted(vals["ram"]))
        for _ in range(alike):
            klass.append(len(choices) // alike)  # the run's number
            choices.append(ch)
            for m in cost:
                cost[m].append(vals[m])
    return choices[:n_items], {m: v[:n_items] for m, v in cost.items()}, klass[:n_items]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_highs_as_loaded_gives_scipy_milp_solutions(seed):
    """The planner drives scipy's own HiGHS binding without scipy.optimize; the model it hands over is the one
    scipy.optimize.milp builds, so the solutions (ties included) are scipy's."""
    from scipy.optimize import LinearConstraint
    from scipy.optimize import milp as scipy_milp
    from scipy.sparse import csr_matrix

    rng = np.random.default_rng(seed)
    for trial in range(6):
        ch, cost, _ = _random_problem(rng, int(rng.integers(4, 30)), 1)
        p = milp.Problem(tuple(cost), ch, cost, [f"i{j:03d}" for j in range(len(ch))])
        p.group()
        caps = {"ram": float(sum(min(x) for x in cost["ram"]) * 1.3), "npu": float(rng.integers(20, 200)),
                "dec": float(sum(max(x) for x in cost["dec"]))}
        c = p.vector("pre")
        res, scale = milp._solve(p, c, caps, 10.0)
        # the same model through scipy.optimize.milp (the code this replaces)
        n = len(p.cols)
        r_idx, c_idx, vals = [g for g, _ in p.cols], list(range(n)), [1.0] * n
        sizes = np.array([len(m) for m in p.groups], dtype=np.float64)
        lo, hi = [sizes], [sizes]
        for k, (metric, cap) in enumerate(caps.items()):
            v = p.vector(metric)
            sc = float(np.abs(v).max(initial=0.0)) or 1.0
            nz = np.nonzero(v)[0]
            r_idx += [len(p.groups) + k] * len(nz)
            c_idx += nz.tolist()
            vals += (v[nz] / sc).tolist()
            lo.append(np.array([-np.inf]))
            hi.append(np.array([cap / sc]))
        A = csr_matrix((vals, (r_idx, c_idx)), shape=(len(p.groups) + len(caps), n))
        ub = np.array([len(p.groups[g]) for g, _ in p.cols], dtype=np.float64)
        ref = scipy_milp(c / scale, integrality=np.ones(n), bounds=(np.zeros(n), ub),
                         constraints=LinearConstraint(A, np.concatenate(lo), np.concatenate(hi)),
                         options={"mip_rel_gap": milp.REL_GAP, "time_limit": 10.0, "presolve": False})
        if ref.x is None:
            assert res.x is None and res.infeasible == (ref.status == 2), trial
            continue
        assert res.optimal == (ref.status == 0) and res.nodes == ref.mip_node_count, trial
        assert np.array_equal(res.x, ref.x), trial


def test_grouping_by_classes_is_grouping_item_by_item():
    rng = np.random.default_rng(7)
    ch, cost, klass = _random_problem(rng, 600, 12)
    names = [f"blk.{j // 40}.w[{j % 40}]" for j in range(600)]
    a = milp.Problem(tuple(cost), list(ch), {m: list(v) for m, v in cost.items()}, names, klass=klass)
    b = milp.Problem(tuple(cost), list(ch), {m: list(v) for m, v in cost.items()}, names)
    for p in (a, b):
        p.prune({"ram": "min", "npu": "min", "dec": "min", "pre": "min", "q": "max"})
        p.group()
    assert a.choices == b.choices and a.cost == b.cost and a.groups == b.groups and a.cols == b.cols
    assert len(a.groups) < 600
    # and on the real MoE: the solver's classes group exactly as item-by-item keys do
    board = load_board("rk3588-32g")
    from orkpack.tiers.manifest import manifest_from_path

    man = manifest_from_path(MOE)
    prof = load_profile(ROUTING, man, board, 512)
    md = _model(man, board, prof, _rows(man, board, {}), 512, "f16")
    names = [it.name for it in man.items]
    kw = lambda: ({"ram": list(md.ram), "npu": list(md.npu), "dec": list(md.dec), "pre": list(md.pre),  # noqa: E731
                   "q": list(md.qual)})
    a = milp.Problem(("ram", "npu", "dec", "pre", "q"), list(md.allowed), kw(), names, klass=md.klass)
    b = milp.Problem(("ram", "npu", "dec", "pre", "q"), list(md.allowed), kw(), names)
    for p in (a, b):
        p.prune({"ram": "min", "npu": "min", "dec": "min", "pre": "min", "q": "max"})
        p.group()
    assert a.groups == b.groups and a.cols == b.cols and a.choices == b.choices


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda p: p.parent.name if p.name == "config.json" else p.stem)
def test_per_expert_names_parse_as_canonical_then_split(cfg):
    """manifest_from_config parses a per-expert HF name once per projection; the result is what
    canonical_name + split_expert give name by name."""
    from orkpack import archs
    from orkpack.errors import OrkError

    data = json.loads(cfg.read_text())
    try:
        man = manifest_from_config(data, cfg.name)
    except OrkError:
        pytest.skip("not a plannable config")
    from orkpack.tiers.manifest import _TORCH_DTYPE

    facts, hf = archs.hf_tensors(data, cfg.name)
    L = archs.layers_in_config(data) or facts["n_layers"]
    dtype = _TORCH_DTYPE.get(str(data.get("torch_dtype", data.get("dtype", "bfloat16"))), "BF16")
    stacked: dict[str, dict[int, tuple]] = {}
    want = set()
    for hf_name, shape, _ in hf:  # name by name, as the manifest was built before
        name = _names.canonical_name(hf_name, facts["arch"], L)
        # an expert's slice, or a slice of a tensor the converter stacks (gemma3n's AltUp projections)
        sp = _names.split_expert(name) or archs.stacked_slice(hf_name, facts["arch"])
        if sp is not None:
            stacked.setdefault(sp[0], {})[sp[1]] = (shape, hf_name)
        else:
            # as the converter lays it out (LFM2's conv kernel squeezed, Granite-4.0-H's input_linear split):
            # archs.converter_layout
            want.update((pc.name, pc.shape,
                         archs.converted_dtype(facts["arch"], pc.name, archs.stored_dtype(data, hf_name, dtype)))
                        for pc in archs.converter_layout(data, name, tuple(shape)))
    # what the converter stacks from named parts and writes twice (RWKV7's lerp_fused and layer-0 v0/v1/v2)
    for sname, parts in archs.converter_stacks(data, [n for n, _, _ in want]):
        got = [next(w for w in want if w[0] == p) for p in parts]
        want -= set(got)
        want.add((sname, (len(got),) + tuple(got[0][1]), got[0][2]))
    for new, old in archs.converter_copies(data, [n for n, _, _ in want]):
        src = next(w for w in want if w[0] == old)
        want.add((new, src[1], src[2]))
    for name, per in stacked.items():
        shape, hf_name = per[0]
        want.add((name, (len(per),) + tuple(shape), archs.stored_dtype(data, hf_name, dtype)))
    # and what the converter computes from the config (gemma4's rope_freqs: archs.generated_tensors)
    want.update((n, tuple(a.shape), "F32") for n, a in archs.generated_tensors(data, cfg.name).items())
    assert {(t.name, t.shape, t.dtype) for t in man.tensors} == want
    assert len(man.tensors) == len(want)


def test_plan_json_imports_only_what_it_uses(tmp_path):
    """`orkpack plan --json` of a config loads no table renderer, no weight reader and not scipy.optimize
    (only its HiGHS binding)."""
    code = ("import sys\nfrom orkpack.cli import main\nsys.argv = ['orkpack', 'plan', sys.argv[1], '--json']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code, str(MOE)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["schema"] == "orkpack.tiermap"
    mods = set(r.stderr.split())
    assert "scipy.optimize._highspy._core" in mods
    for m in ("scipy.optimize", "scipy.sparse", "rich", "rich.console", "pydantic", "gguf", "yaml", "safetensors", "orkpack.sources.gguf",
              "orkpack.sources.safetensors", "orkpack.sources.open"):
        assert m not in mods, m


@pytest.mark.parametrize("goal", ["balanced", "decode", "prefill", "quality"])
def test_many_group_path_still_matches_brute_force(goal, monkeypatch):
    """Presolve and the Lagrangian bound tightening (the path of models with many groups) forced onto the
    brute-force instances of tests/test_tiers_solver.py: the same optima."""
    import test_tiers_solver as ts

    monkeypatch.setattr(milp, "PRESOLVE_MIN_GROUPS", 0)
    ts.test_solver_matches_brute_force_with_alignment_and_pins(goal)


def test_bound_tightening_keeps_every_stage_optimum(monkeypatch):
    """Random multiple-choice programs of 100-200 groups with 2-4 caps, solved lexicographically with and
    without the tightening: equal stage values; and every bound it derives holds at every optimum found."""
    rng = np.random.default_rng(11)
    seen_fixed = 0
    real = milp._tighten

    def spy(*a, **k):
        nonlocal seen_fixed
        got = real(*a, **k)
        if got is not None:
            seen_fixed += int(np.sum(got[0] == got[1]))
        return got

    for trial in range(6):
        alike = (2, 30)[trial % 2]
        ch, cost, klass = _random_problem(rng, int(rng.integers(150, 400)) * (alike // 2), alike)
        order = [("dec", "min"), ("pre", "min"), ("q", "max")]
        caps = {"ram": float(sum(min(x) for x in cost["ram"]) * 1.15), "npu": float(sum(max(x) for x in cost["npu"]) / 4)}
        vals = []
        for threshold in (10**9, 0):
            monkeypatch.setattr(milp, "PRESOLVE_MIN_GROUPS", threshold)
            monkeypatch.setattr(milp, "_tighten", spy)
            p = milp.Problem(tuple(cost), list(ch), {m: list(v) for m, v in cost.items()},
                             [f"i{j:04d}" for j in range(len(ch))], klass=klass)
            p.group()
            assert len(p.groups) > 64
            try:
                _, st = milp.lexicographic(p, order, caps, time_limit=30.0)
            except Exception as e:  # noqa: BLE001 (both paths must agree on infeasibility too)
                vals.append(str(e))
                continue
            assert all(s.status == "optimal" for s in st), (trial, threshold, st)
            vals.append([s.value for s in st])
        if isinstance(vals[0], str):
            assert vals[0] == vals[1]
            continue
        for a, b in zip(*vals):
            assert a == pytest.approx(b, rel=1e-6, abs=1e-9), (trial, vals)
    assert seen_fixed > 0  # the tightening did fix counts on these instances


@pytest.mark.parametrize("first", ["names", "gguf"])
def test_gguf_name_tables_alone_then_the_whole_package(first):
    """archs loads gguf-py's constants and tensor_mapping alone where gguf is not imported (a plan from a config
    never needs the rest); an ``import gguf`` after it, or before it, gives the whole package as ever, sharing
    those modules, with them as its attributes; the names mapped are the same either way."""
    code = f"""
import sys
if {first!r} == "gguf":
    import gguf
from orkpack.sources import names
from orkpack.archs import gguf as tables, canonical_name
got = canonical_name("model.layers.3.self_attn.k_proj.weight", "qwen3_moe", 48)
assert got == "blk.3.attn_k.weight", got
assert names._is_gguf_name("blk.3.attn_k.weight", "qwen3_moe", 48)
if {first!r} == "names":
    assert "gguf" not in sys.modules and "gguf.constants" in sys.modules and "yaml" not in sys.modules
import gguf
assert gguf.constants is sys.modules["gguf.constants"] and gguf.tensor_mapping is sys.modules["gguf.tensor_mapping"]
assert tables.MODEL_ARCH is gguf.MODEL_ARCH is gguf.constants.MODEL_ARCH
assert tables.get_tensor_name_map is gguf.get_tensor_name_map
assert gguf.GGUFReader and gguf.GGUFWriter and gguf.quants and gguf.metadata.Metadata
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_plan_pauses_the_collector_and_restores_it(monkeypatch, capsys):
    """plan_command and plan run with the cyclic collector paused (their 10^5 small objects hold no cycles) and
    leave it as they found it, on success and on error alike."""
    import gc

    from orkpack.errors import OrkError
    from orkpack.tiers import command

    seen = []

    def spying(real):
        def spy(*a, **k):
            seen.append(gc.isenabled())
            return real(*a, **k)
        return spy

    for name in ("solve", "solve_default_levels"):  # given no host levels, plan solves through the latter
        monkeypatch.setattr(command, name, spying(getattr(command, name)))
    assert gc.isenabled()
    assert command.plan_command(ROOT / "tests/fixtures/configs/qwen2.json", json_out=True) == 0
    assert seen == [False] and gc.isenabled()
    with pytest.raises(OrkError):
        command.plan_command(ROOT / "tests/fixtures/configs/qwen2.json", json_out=True, ctx=-1)
    assert gc.isenabled()
    gc.disable()
    try:  # a caller's own choice stays
        command.plan(ROOT / "tests/fixtures/configs/qwen2.json")
        assert not gc.isenabled()
    finally:
        gc.enable()
    capsys.readouterr()


def test_cli_plan_pauses_the_collector_over_its_imports(monkeypatch):
    """The `plan` command itself runs paused (its imports of numpy and the planner included) and leaves the
    collector on after, on success and on error."""
    import gc

    from typer.testing import CliRunner

    from orkpack import cli

    seen = []
    real = cli._numpy_with_one_blas_thread
    monkeypatch.setattr(cli, "_numpy_with_one_blas_thread", lambda: (seen.append(gc.isenabled()), real())[1])
    cfg = str(ROOT / "tests/fixtures/configs/qwen2.json")
    r = CliRunner().invoke(cli.app, ["plan", cfg, "--json"])
    assert r.exit_code == 0, r.output
    assert seen == [False] and gc.isenabled()
    assert CliRunner().invoke(cli.app, ["plan", cfg, "--ctx", "-1"]).exit_code != 0
    assert seen == [False, False] and gc.isenabled()


def test_paused_work_survives_into_the_oldest_generation():
    """What a paused call leaves alive goes to the collector's oldest generation when it resumes (the young
    generation's next pass does not examine it), unless something else is frozen, which stays frozen."""
    import gc

    from orkpack.gcpause import without_gc

    made = without_gc(lambda: [[i] for i in range(1000)])()
    assert any(o is made for o in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        again = without_gc(lambda: [[i] for i in range(1000)])()
        # nothing more frozen (frozen objects freed meanwhile leave the count lower), and what the call made sits in
        # the collector's generations, not frozen
        assert gc.get_freeze_count() <= frozen and len(again) == len(made)
        assert any(o is again for o in gc.get_objects())
    finally:
        gc.unfreeze()


def test_matches_any_is_any_of_matches():
    """globs.matches_any (one regular expression for a tuple of globs) says what any(globs.matches) says: on every
    tensor name of the test and shipped configs and odd names, against every always-float row and odd globs."""
    from orkpack import globs
    from orkpack.keepfloat import ALWAYS_FLOAT

    from orkpack.errors import OrkError

    names = set()
    for cfg in CONFIGS:
        try:
            names |= {t.name for t in manifest_from_config(json.loads(cfg.read_text()), cfg.name).tensors}
        except OrkError:  # not a plannable config
            pass
    names |= {"", "x", "x[3]", "x3", "a.b", "a\nb.bias", "blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp_shexp.weight",
              "[!a]b", "ab", "bb", "*.bias", "blk.1.time_mix_w1.weight", "blk.1.ssm_a"}
    rows = [gl for _, gl in ALWAYS_FLOAT if gl]
    rows += [("x[3]",), ("x[3]", "*.bias"), ("[!a]*", "a?"), ("*[0-9]", "**", ""), ("a*b",), ("blk.?.*",), ()]
    hits = 0
    for gl in rows:
        for n in names:
            want = any(globs.matches(n, g) for g in gl)
            assert globs.matches_any(n, gl) == want, (n, gl)
            hits += want
    assert hits > 100


def test_name_order_is_the_stable_sort_by_name():
    """solver._in_name_order (runs of one tensor found by comparing neighbours, then the runs sorted) gives the list a
    stable sort by (tensor in natural name order, expert; a tensor's own slice first) gives: on lists made as the
    solver makes them and on shuffled, repeated and empty ones."""
    import random

    from orkpack.sources import names
    from orkpack.tiers.solver import _in_name_order

    class D:
        def __init__(self, tensor, expert):
            self.tensor, self.expert = tensor, expert

    rng = random.Random(5)
    pool = [f"blk.{i}.{t}.weight" for i in (0, 1, 2, 10, 11) for t in ("attn_q", "ffn_up_exps")] + ["output.weight", "token_embd.weight"]
    for trial in range(2000):
        ds = []
        for t in rng.sample(pool, rng.randint(0, len(pool))):
            ds += [D(t, None)] if rng.random() < 0.4 else [D(t, e) for e in range(rng.randint(1, 5))]
        if trial % 3 == 1:
            rng.shuffle(ds)
        if trial % 5 == 2 and ds:
            ds.append(ds[rng.randrange(len(ds))])
        order = {n: j for j, n in enumerate(sorted({d.tensor for d in ds}, key=names.natural_key))}
        want = sorted(ds, key=lambda d: (order[d.tensor], -1 if d.expert is None else d.expert))
        assert [id(d) for d in _in_name_order(ds)] == [id(d) for d in want], trial


def test_stages_without_the_assignment_are_the_stages():
    """milp.lexicographic(assign=False) (what the solver asks of a stage whose values alone it reads) solves the same
    stages and hands back no assignment."""
    rng = np.random.default_rng(3)
    for _ in range(5):
        n = 40
        choices = [("a", "b", "c")] * n
        cost = {m: [tuple(float(v) for v in rng.integers(1, 20, 3)) for _ in range(n)] for m in ("ram", "dec", "q")}
        caps = {"ram": float(sum(min(c) for c in cost["ram"]) + 60)}

        def run(assign):
            p = milp.Problem(("ram", "dec", "q"), list(choices), {m: list(v) for m, v in cost.items()}, [f"i{i}" for i in range(n)])
            return milp.lexicographic(p, [("dec", "min"), ("q", "max")], caps, assign=assign)

        (pick, st), (none, st2) = run(True), run(False)
        assert none == {} and len(pick) == n and st == st2


@pytest.mark.parametrize("n_blocks", [0, 1, 3, 64])
def test_block_names_answer_as_gguf_name_map(n_blocks):
    """archs._BlockNames (what canonical_name looks names up in, without building gguf-py's map) answers
    get_type_and_name as gguf-py's TensorNameMap does, on every architecture gguf-py knows: every key of the real
    map, with a suffix, with its block number past the last block, and names no map holds."""
    from orkpack import archs

    make = archs.gguf.get_tensor_name_map
    cls = sys.modules[make.__module__].TensorNameMap
    assert archs._name_map("QWEN3MOE", 64).__class__ is archs._BlockNames  # the plan's path reads these tables
    # gguf-py's constructor merges an architecture's own block templates into the class's table, for good (ARCTIC's
    # rename llama's): put the table back as it was, so the later tests of this process name tensors as before
    table = dict(cls.block_mappings_cfg)
    checked = 0
    try:
        for arch in list(archs.gguf.MODEL_ARCH):
            lazy = archs._BlockNames(cls, arch, n_blocks)  # both merge the architecture's templates, as gguf-py does
            real = make(arch, n_blocks)
            keys = list(real.mapping)
            probes = keys + [k + s for k in keys[::7] for s in (".weight", ".bias", ".scale")]
            probes += [k.replace(f".{b}.", f".{b + n_blocks}.") for k in keys[:: 5] for b in (0, 1, 2)]
            probes += [f"model.layers.{b}.self_attn.q_proj.weight" for b in (0, 1, 2, 10, 63, 64, 65)]
            probes += ["model.layers.01.self_attn.q_proj.weight", "nothing", ""]
            for k in probes:
                got, want = lazy.get_type_and_name(k, (".weight", ".bias")), real.get_type_and_name(k, (".weight", ".bias"))
                assert got == want, (arch, k)
                checked += 1
    finally:
        cls.block_mappings_cfg.clear()
        cls.block_mappings_cfg.update(table)
        archs._name_map.cache_clear()
    assert checked > 10_000


def test_plan_freezes_the_objects_at_exit():
    """`orkpack plan` registers gc.freeze as an exit handler (once, however many plans run): finalization then
    skips the collector's pass over the objects still alive, and the output is whole."""
    code = ("import atexit, gc, sys\nfrom orkpack.tiers import command\nseen = []\nreal = atexit.register\n"
            "atexit.register = lambda f, *a, **k: (seen.append(f), real(f, *a, **k))[1]\n"
            "for _ in range(2):\n    assert command.plan_command(sys.argv[1], json_out=True) == 0\n"
            "assert seen.count(gc.freeze) == 1, seen\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests/fixtures/configs/qwen2.json")], capture_output=True,
                       text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    texts = r.stdout.split('{\n "schema"')
    assert len(texts) == 3 and all(json.loads('{\n "schema"' + t)["schema"] == "orkpack.tiermap" for t in texts[1:])


@pytest.mark.parametrize("preset", [None, "2"])
def test_plan_loads_numpy_with_one_blas_thread(preset):
    """`orkpack plan` imports numpy with OpenBLAS at one thread (no idle threads spinning through the plan) and
    leaves the environment as it was; a user's own OPENBLAS_NUM_THREADS is kept."""
    code = ("import os, sys\nfrom orkpack.cli import main\nsys.argv = ['orkpack', 'plan', sys.argv[1], '--json']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "from threadpoolctl import threadpool_info\n"
            "print([p['num_threads'] for p in threadpool_info() if p['internal_api'] == 'openblas'],"
            " os.environ.get('OPENBLAS_NUM_THREADS'), file=sys.stderr)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("OPENBLAS_NUM_THREADS", None)
    env.pop("OMP_NUM_THREADS", None)
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests/fixtures/configs/qwen2.json")],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["schema"] == "orkpack.tiermap"
    assert r.stderr.split("\n")[-2] == ("[1] None" if preset is None else f"[{preset}] {preset}")
