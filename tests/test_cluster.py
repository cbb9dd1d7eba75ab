"""Tier maps across boards over llama.cpp RPC (orkpack/tiers/cluster.py, docs/CLUSTER.md)."""
from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from orkpack.build import cluster as cluster_build
from orkpack.tiers import cluster, cost, llamacpp, network, solver
from orkpack.tiers.board import load_board
from orkpack.tiers.manifest import manifest_from_config, manifest_from_path
from orkpack.tiers.profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
CFG = ROOT / "tests" / "fixtures" / "configs"


def _tiny_cfg(layers: int = 3, hidden: int = 64) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": layers, "vocab_size": 256,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}


# a few free items per layer keep the brute force small: the rest kept float
KEEP = ["blk.*.attn_q.weight", "blk.*.attn_k.weight", "blk.*.attn_v.weight", "blk.*.attn_output.weight",
        "blk.*.ffn_up.weight"]


def _brute(man, boards, net, *, ctx, kv_type, prompt, pins, goal):
    """Every contiguous split x every choice of every item, each node costed by the single-board cost model of
    the tensors it holds (solver._model on its sub-manifest), the network added; the goal's stages in turn."""
    L = man.facts["n_layers"]
    B = len(boards)
    hidden = man.facts["hidden"]
    P = min(prompt, ctx)
    best = []  # per split: arrays of (dec, pre, q) of every feasible assignment
    for cuts in itertools.combinations_with_replacement(range(L + 1), B - 1):
        bounds = [0, *cuts, L]
        per_node = []
        ok = True
        for j in range(B):
            a, b = bounds[j], bounds[j + 1]
            if j > 0 and b == a:
                per_node.append(np.zeros((1, 3)))
                continue
            sub, idx = cluster.sub_manifest(man, list(range(a, b)), client=j == 0)
            prof = cluster.sub_profile(load_profile(None, man, boards[j], 512), idx)
            pinmap, _ = solver.match_pins(sub, pins)
            rows = solver._rows(sub, boards[j], pinmap)
            md = solver._model(sub, boards[j], prof, rows, P, kv_type)
            kv = sub.kv_bytes(ctx, kv_type) if b > a else 0
            room = boards[j].total_bytes - boards[j].reserve_bytes - kv - sum(t.float_bytes for t in sub.floats)
            combos = []
            for pick in itertools.product(*[range(len(al)) for al in md.allowed]):
                ram = sum(md.ram[i][c] for i, c in enumerate(pick))
                npu = sum(md.npu[i][c] for i, c in enumerate(pick))
                if ram > room or npu > boards[j].iova_usable_bytes:
                    continue
                dec = md.dec_const + sum(md.dec[i][c] for i, c in enumerate(pick))
                pre = md.pre_const + sum(md.pre[i][c] for i, c in enumerate(pick))
                q = sum(md.qual[i][c] for i, c in enumerate(pick))
                if j > 0:
                    dec += net.eval_s(1, hidden)
                    pre += net.eval_s(512, hidden)
                combos.append((dec, pre, q))
            if not combos:
                ok = False
                break
            per_node.append(np.array(combos))
        if not ok:
            continue
        tot = per_node[0]
        for arr in per_node[1:]:
            tot = (tot[:, None, :] + arr[None, :, :]).reshape(-1, 3)
        best.append(tot)
    allv = np.concatenate(best)
    dec, pre, q = allv[:, 0], allv[:, 1], allv[:, 2]
    tol = 1e-6
    if goal == "balanced":
        d = dec.min()
        m1 = dec <= d / 0.95
        p = pre[m1].min()
        m2 = m1 & (pre <= p / 0.99)
        return d, p, q[m2].max()
    d = dec.min()
    m1 = dec <= d + tol * d
    p = pre[m1].min()
    m2 = m1 & (pre <= p + tol * p)
    return d, p, q[m2].max()


SPLITS_SEEN: set = set()


@pytest.mark.parametrize("seed", range(12))
def test_joint_split_is_exact_against_brute_force(seed):
    """Random small instances: budgets that bind (a fraction of the model's least bytes per board, room for
    0-3 NPU items), boards of different bandwidths, a network of 0 to 2 ms a hop; both goal kinds."""
    rng = random.Random(seed)
    man = manifest_from_config(_tiny_cfg(3, hidden=512))
    base = load_board("rk3588-32g")
    B = 2 if seed < 3 else 3
    kept, _ = solver.match_pins(man, {"keep": KEEP + (["blk.1.ffn_gate.weight"] if seed >= 4 else [])})
    least = sum(it.float_bytes if i in kept else solver.cost.host_nf4_bytes(it.n, it.k, base.nf4_format) for i, it in enumerate(man.items)) \
        + sum(t.float_bytes for t in man.floats) + man.kv_bytes(256)
    npu_item = solver.cost.npu_bytes(1024, 512, base)
    boards = []
    for j in range(B):
        boards.append(replace(base, name=f"b{j}", reserve_bytes=1 << 20,
                              total_bytes=(1 << 20) + int(least * rng.choice([0.45, 0.6, 0.8, 1.2])),
                              iova_usable_bytes=npu_item * rng.choice([0, 1, 2, 3]),
                              cpu_stream_bytes_per_s=base.cpu_stream_bytes_per_s * rng.choice([0.5, 1.0])))
    net = network.Network("t", latency_s=rng.choice([0.0, 2e-5, 2e-3]), bandwidth_bytes_per_s=117.5e6,
                          round_trips_per_eval=3)
    spec = cluster.ClusterSpec(boards, [f"h{j}" for j in range(B)], net)
    goal = "balanced" if seed % 2 == 0 else "decode"
    # seeds 4-7: layer 1 unlike the others (one more item kept float): two layer classes, so the split is one
    # binary per layer and node; seed 3 forces that formulation on alike layers too
    keep = KEEP + (["blk.1.ffn_gate.weight"] if seed >= 4 else [])
    kw = dict(ctx=256, kv_type="f16", prompt=64, pins={"keep": keep})
    contiguity = "binary" if seed == 3 else "auto"
    try:
        want = _brute(man, boards, net, goal=goal, **kw)
    except ValueError:  # nothing feasible: the program must say so too
        with pytest.raises(Exception, match="does not fit"):
            cluster.solve_cluster(man, spec, goal=solver.Goal(goal), contiguity=contiguity, **kw)
        return
    plan = cluster.solve_cluster(man, spec, goal=solver.Goal(goal), contiguity=contiguity, **kw)
    assert plan.program["split_variables"] == ("layer counts" if seed < 3 else "one binary per layer and node")
    got = {s["metric"]: s["value"] for s in plan.stages}
    assert all(s["status"] == "optimal" for s in plan.stages)
    assert got["decode"] == pytest.approx(want[0], rel=1e-6, abs=1e-9)
    assert got["prefill"] == pytest.approx(want[1], rel=1e-6, abs=1e-9)
    assert got["quality"] == pytest.approx(want[2], rel=1e-6, abs=1e-9)
    # the assembled plan (each node through the single-board cost model, the network added) keeps the stages
    assert plan.prediction["decode_s_per_token"] <= got["decode"] / (0.95 if goal == "balanced" else 1 - 1e-6) + 1e-9
    SPLITS_SEEN.add((seed >= 3, tuple(b - a for a, b in plan.ranges)))


def test_the_brute_force_instances_are_not_trivial():
    """The instances above put layers on more than one board and do not all agree (run after them)."""
    if len(SPLITS_SEEN) < 2:
        pytest.skip("run with the brute-force test")
    for binary in (False, True):  # both formulations split some instance across boards
        assert any(sum(1 for n in s if n) >= 2 for b, s in SPLITS_SEEN if b == binary)


def test_one_board_cluster_is_the_single_board_plan():
    """A cluster of one board is the board: the same stage optima as orkpack plan, and the single-board plan's
    choices costed the cluster's way (the node's sub-model through node_phase) give its predictions exactly."""
    man = manifest_from_path(CFG / "qwen2.json")
    b = load_board("rk3588-32g")
    prof = load_profile(None, man, b, 512)
    tm = solver.solve(man, b, prof, ctx=4096)
    plan = cluster.solve_cluster(man, cluster.ClusterSpec([b], ["h"], network.load_network(None)), ctx=4096)
    assert [s["value"] for s in plan.stages] == pytest.approx([s["value"] for s in tm.objective["stages"]], rel=1e-6)
    sub, idx = cluster.sub_manifest(man, list(range(man.facts["n_layers"])), client=True)
    assert [man.items[i].key for i in idx] == [it.key for it in man.items]
    choices = []
    for it in man.items:
        d = tm.get(it.tensor, it.expert)
        choices.append(("npu+nf4" if d.host_copy else "npu") if d.tier == "npu" else d.encoding)
    ph = cluster.node_phase(sub, b, cluster.sub_profile(prof, idx), choices, prompt=512, ctx=4096, kv_type="f16")
    for k in ("decode_s_per_token", "prefill_s_per_chunk", "ttft_s"):
        assert ph[k] == pytest.approx(tm.prediction[k], rel=1e-6)
    # and the plan found keeps the goal's slacks around those optima
    assert plan.prediction["decode_s_per_token"] <= plan.stages[0]["value"] / 0.95 * (1 + 1e-6)
    assert plan.prediction["prefill_s_per_chunk"] <= plan.stages[1]["value"] / 0.99 * (1 + 1e-6)


@pytest.mark.parametrize("goal", ["balanced", "quality"])
def test_nf4_pinned_npu_slices_across_boards(goal):
    """--nf4 pins across boards: an NPU slice stored 4-bit is its own host copy, nf4 (b64) whatever the boards'
    NF4 format (docs/TIERMAP.md section 2); each node's map counts it so, each node's part (node_phase: its
    items' pinned rows) agrees with the program (the self-check), and the cluster's predicted KLD counts the
    sensitivity of every item decode reads as NF4 (an NPU-only slice stored 4-bit among them)."""
    man = manifest_from_path(CFG / "qwen2.json")
    pins = {"nf4": ["blk.*.ffn_*", "blk.*.attn_q.weight"]}
    spec = cluster.parse_cluster("rk3588-16g,rk3588-16g")
    plan = cluster.solve_cluster(man, spec, ctx=4096, pins=pins, goal=solver.Goal(goal), fixed=[(0, 12), (12, 24)])
    prof = load_profile(None, man, spec.boards[0], 512)
    sens = {it.key: prof.sensitivity[i] for i, it in enumerate(man.items)}
    kld = stored = 0
    for j in range(2):
        tm = cluster.node_tiermap(plan, j)
        for d in tm.decisions:
            if (d.tensor, d.expert) not in sens:
                continue
            nf4_stored = d.tier == "npu" and d.encoding == "nf4"
            if d.host_copy:
                want = 4 * -(-d.shape[0] * d.shape[1] // 64) + d.shape[0] * d.shape[1] // 2 if nf4_stored else \
                    cost.host_nf4_bytes(*d.shape, "dq32")
                assert d.host_copy_bytes == want, d
                stored += nf4_stored
            if d.encoding == "nf4":  # host NF4, an NPU slice stored 4-bit (with or without its copy)
                kld += sens[(d.tensor, d.expert)]
    assert plan.prediction["kld"] == pytest.approx(kld, abs=1e-6)
    assert stored or goal == "quality"


@pytest.mark.parametrize("goal", ["decode", "balanced"])
def test_a_model_that_fits_one_board_is_not_worse_on_two(goal):
    man = manifest_from_path(CFG / "qwen2.json")
    b = load_board("rk3588-32g")
    one = solver.solve(man, b, load_profile(None, man, b, 512), ctx=4096, goal=solver.Goal(goal))
    two = cluster.solve_cluster(man, cluster.parse_cluster("rk3588-32g,rk3588-32g"), ctx=4096, goal=solver.Goal(goal))
    d1 = one.objective["stages"][0]["value"]
    d2 = two.stages[0]["value"]
    assert d2 <= d1 * (1 + 1e-6)  # the best decode across two boards is at least the one board's
    if goal == "decode":
        assert two.prediction["decode_tok_s"] >= one.prediction["decode_tok_s"] * (1 - 1e-6)
        if two.prediction["decode_tok_s"] <= one.prediction["decode_tok_s"] * (1 + 1e-6):
            assert two.prediction["prefill_tok_s"] >= one.prediction["prefill_tok_s"] * (1 - 1e-6)
    else:  # within the same 5 % of a best decode no worse, and prefill no worse
        assert two.prediction["decode_tok_s"] >= 0.95 / d1 * (1 - 1e-6)
        assert two.prediction["prefill_tok_s"] >= one.prediction["prefill_tok_s"] * (1 - 1e-6)


def test_memory_proportional_split_is_llama_cpp_s():
    b32, b16 = load_board("rk3588-32g"), load_board("rk3588-16g")
    assert cluster.memory_proportional([b32, b32], 80) == [(0, 40), (40, 80)]
    r = cluster.memory_proportional([b32, b16, b16], 32)
    free = [30, 14, 14]
    # llama.cpp: layer il to the first device whose cumulative share exceeds il / n_layer
    cum = np.cumsum(free) / sum(free)
    dev = [int(np.argmax(cum > il / 32)) for il in range(32)]
    assert [dev.count(j) for j in range(3)] == [b - a for a, b in r]


# ------------------------------------------------------------------------------------------ build

def _tiny_board(path: Path, total: int, iova: int) -> Path:
    t = (ROOT / "tiermaps" / "boards" / "rk3588-32g.toml").read_text()
    t = re.sub(r"(?m)^name = .*", 'name = "tiny"', t)
    t = re.sub(r"(?m)^total_bytes = .*", f"total_bytes = {total}", t)
    t = re.sub(r"(?m)^reserve_bytes = .*", "reserve_bytes = 1000000", t)
    t = re.sub(r"(?m)^iova_usable_bytes = .*", f"iova_usable_bytes = {iova}", t)
    path.write_text(t)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from orkpack.build import BuildOptions
    from orkpack.synth import write_hf_model

    d = tmp_path_factory.mktemp("cluster")
    model = write_hf_model(d / "m", layers=4, seed=1, vocab=512)
    board = _tiny_board(d / "tiny.toml", 2_600_000, 600_000)
    boards = f"{board},{board},{board}"
    plan, results, cj = cluster_build.build_cluster(model, d / "out", BuildOptions(ctx=256), boards)
    return d, model, plan, results, cj


def test_cluster_build_writes_one_verified_pack_per_node(built, check):
    from orkpack.runtime.command import verify_command

    d, model, plan, results, cj = built
    used = [n for n in cj["nodes"] if n["used"]]
    assert len(used) >= 2  # the model does not fit one tiny board
    assert [n["pack"] for n in used] == [r.path.name for r in results]
    for r in results:
        assert verify_command([r.path], device="host", inflate="direct", threads=1, reference=True, keep_going=False,
                              json_out=True, console=None) == 0
        res = subprocess.run([str(check), str(r.path)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout + res.stderr
    # the split on record: contiguous, covering every layer once
    ranges = [n["layers"] for n in cj["nodes"]]
    assert ranges[0][0] == 0 and ranges[-1][1] == 4 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


def test_cluster_packs_hold_exactly_the_single_board_build(built, tmp_path):
    """Together the node packs hold every tensor of the model once, byte for byte what one single-board build
    with the same decisions writes."""
    from orkpack.build import BuildOptions, build
    from orkpack.inspect import pack_facts
    from orkpack.tiers.tiermap import dumps

    d, model, plan, results, cj = built
    maps = [cluster.node_tiermap(plan, j) for j, n in enumerate(plan.nodes) if n["used"]]
    merged = maps[0].to_json()
    merged["tensors"] = [t for m in maps for t in m.to_json()["tensors"]]
    merged["options"] = {k: v for k, v in merged["options"].items() if k != "cluster"}
    (tmp_path / "all.json").write_text(dumps(merged))
    one = build(model, tmp_path / "all.orkpack", BuildOptions(tiermap=tmp_path / "all.json"))

    def rows(p):
        return {r["name"]: [s["xxh3"] for s in r["slices"]] for r in pack_facts(p)["tensors"]}

    whole = rows(one.path)
    parts: dict = {}
    for r in results:
        got = rows(r.path)
        assert not (got.keys() & parts.keys())  # no tensor in two packs
        parts.update(got)
    assert parts == whole


def test_inspect_shows_the_node(built):
    from orkpack.inspect import pack_facts

    d, model, plan, results, cj = built
    second = [n for n in cj["nodes"] if n["used"]][1]  # the second pack's node (a node may hold no layer)
    f = pack_facts(results[1].path)
    cl = f["tiermap"]["options"]["cluster"]
    assert cl["node"] == second["node"] and cl["layers"] == second["layers"]
    out = subprocess.run([sys.executable, "-m", "orkpack", "inspect", str(d / "out" / "cluster.json")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "node1" in out.stdout and "layers" in out.stdout


# ------------------------------------------------------------------------------------------ command lines

def _llama_cli_parser() -> argparse.ArgumentParser:
    """The flags llama.cpp documents for the client (tools/rpc/README.md, common/arg.cpp): -m, --rpc
    SERVERS (comma-separated host:port), -ngl N, -ot PATTERN=BUFFER_TYPE (repeatable), --tensor-split N0,N1,..."""
    p = argparse.ArgumentParser(prog="llama-cli", exit_on_error=False)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--rpc", type=lambda s: [tuple(x.rsplit(":", 1)) for x in s.split(",")])
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int)
    p.add_argument("-ot", "--override-tensor", action="append", default=[])
    p.add_argument("-ts", "--tensor-split", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("-t", "--threads", type=int)
    return p


def _rpc_server_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rpc-server", exit_on_error=False)
    p.add_argument("-H", "--host")
    p.add_argument("-p", "--port", type=int)
    p.add_argument("-c", "--cache", action="store_true")
    p.add_argument("-t", "--threads", type=int)
    return p


def _pinned(argv: list[str], program: str) -> list[str]:
    """The arguments after ``program`` of a line pinned to the A76 cores: ``taskset -c 4-7 PROGRAM ...``."""
    assert argv[:4] == ["taskset", "-c", "4-7", program], argv
    return argv[4:]


@pytest.mark.parametrize("config,boards,goal", [("llama31_70b.json", "rk3588-32g,rk3588-32g,rk3588-32g", "balanced"),
                                                 ("mixtral.json", "rk3588-32g,rk3588-16g", "prefill"),
                                                 ("mixtral.json", "rk3588-16g,rk3588-16g", "balanced")])
def test_command_lines_parse_and_realise_the_split(config, boards, goal):
    man = manifest_from_path(CFG / config)
    spec = cluster.parse_cluster(boards)
    plan = cluster.solve_cluster(man, spec, goal=solver.Goal(goal))
    cmd = llamacpp.commands(plan)
    L = man.facts["n_layers"]
    remote = [n for n in plan.nodes[1:] if n["used"]]
    for s, n in zip(cmd["rpc_servers"], remote):
        a = _rpc_server_parser().parse_args(_pinned(s["argv"], "ggml-rpc-server"))
        assert a.port == llamacpp.RPC_PORT and a.cache and a.threads == 4
        assert a.host == n["host"] != "0.0.0.0"  # bound to the node's own address, never every interface
    assert len(remote) == len(cmd["rpc_servers"]) and not any(w.startswith("rpc-server bound to 0.0.0.0")
                                                              for w in cmd["warnings"])
    # the line is a shell line as printed
    argv = cmd["client"]["argv"]
    assert shlex.split(shlex.join(argv)) == argv
    a = _llama_cli_parser().parse_args(_pinned(argv, "llama-completion"))
    assert a.threads == 4 and a.model == "model.gguf" and cmd["export"]["argv"][-1] == a.model
    assert a.rpc == [(n["host"], str(llamacpp.RPC_PORT)) for n in remote]
    # llama.cpp applies the first -ot pattern that std::regex_search finds in a tensor name
    rules = [(re.compile(x.split("=", 1)[0]), x.split("=", 1)[1]) for x in a.override_tensor]
    want_buft = {0: "CPU"} | {n["node"]: f"RPC0[{n['host']}:{llamacpp.RPC_PORT}]" for n in remote}
    for t in man.tensors:
        hit = next((b for r, b in rules if r.search(t.name)), None)
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else None
        if layer is None:
            assert hit in (None, "CPU"), t.name  # the embedding (always CPU in llama.cpp) and the head: client
        else:
            node = next(j for j, (lo, hi) in enumerate(plan.ranges) if lo <= layer < hi)
            assert hit == want_buft[node], t.name
    # the --tensor-split form, by llama.cpp's rule (llama-model.cpp load_tensors, current: the output layer is one of
    # the -ngl slots): slot il >= n_layer + 1 - ngl is offloaded to device upper_bound(cumulative split fractions,
    # (il - start) / min(ngl, n_layer + 1)); float arithmetic as llama.cpp's
    b = _llama_cli_parser().parse_args(_pinned(cmd["client_tensor_split"]["argv"], "llama-completion"))
    start = max(L + 1 - b.n_gpu_layers, 0)
    act = min(b.n_gpu_layers, L + 1)
    cum = np.cumsum(np.array(b.tensor_split, dtype=np.float32))
    cum = cum / np.float32(cum[-1])
    def device(il):
        if il < start or il - start >= act:
            return None  # the client's CPU
        return int(np.searchsorted(cum, np.float32(il - start) / np.float32(act), side="right"))
    for il in range(L):
        node = next(j for j, (lo, hi) in enumerate(plan.ranges) if lo <= il < hi)
        want = None if node == 0 else [n["node"] for n in remote].index(node)
        assert device(il) == want, il
    ts_rules = [x.split("=", 1) for x in b.override_tensor]
    assert any(re.search(r, "output.weight") and buft == "CPU" for r, buft in ts_rules)  # the head stays home


# ------------------------------------------------------------------------------------------ bad input

@pytest.mark.parametrize("args,needle", [
    (["--boards", "rk3588-32g,rk3588-99g"], "unknown board"),
    (["--boards", ""], "--boards"),
    (["--boards", "rk3588-32g,,rk3588-32g"], "--boards"),
    (["--boards", "rk3588-16g,rk3588-8g"], "does not fit"),
    (["--boards", "rk3588-32g,rk3588-32g", "--network", "carrier-pigeon"], "unknown network"),
    (["--network", "1gbe"], "--boards"),
])
def test_bad_cluster_input_is_one_line(args, needle, tmp_path):
    for cmd in (["plan", str(CFG / "llama31_70b.json")], ["build", str(CFG / "llama31_70b.json"), "-o", str(tmp_path / "o")]):
        res = subprocess.run([sys.executable, "-m", "orkpack", *cmd, *args], capture_output=True, text=True)
        assert res.returncode == 2, res.stderr
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr
        assert "Traceback" not in res.stderr
        assert not (tmp_path / "o").exists()


def test_network_option_and_file(tmp_path):
    slow = network.load_network("1gbe")
    fast = network.load_network("2.5gbe")
    assert fast.eval_s(512, 8192) < slow.eval_s(512, 8192)
    f = tmp_path / "c.toml"
    f.write_text('boards = ["rk3588-32g", "rk3588-32g"]\nhosts = ["a", "b"]\n'
                 '[network]\nlatency_s = 0.001\nbandwidth_bytes_per_s = 1e6\nround_trips_per_eval = 2\n')
    spec = cluster.parse_cluster(str(f))
    assert spec.hosts == ["a", "b"] and spec.network.latency_s == 0.001
    assert cluster.parse_cluster(str(f), "2.5gbe").network == fast  # --network wins
    assert spec.network.eval_s(1, 1000) == pytest.approx(2 * 0.001 + 2 * 1000 * 4 / 1e6)


def test_shipped_networks_are_installed_byte_identical():
    assert (ROOT / "tiermaps" / "networks" / "networks.toml").read_bytes() == network.NETWORK_FILE.read_bytes()
    assert set(network.network_names()) == {"1gbe", "2.5gbe", "10gbe"}


def test_plan_json_and_output(tmp_path):
    out = tmp_path / "plan.json"
    res = subprocess.run([sys.executable, "-m", "orkpack", "plan", str(CFG / "qwen2.json"), "--boards",
                          "rk3588-16g,rk3588-16g", "--ctx", "2048", "--json", "-o", str(out)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d == json.loads(out.read_text())
    assert d["schema"] == "orkpack.cluster" and len(d["nodes"]) == 2
    assert d["nodes"][0]["layers"][0] == 0 and d["nodes"][-1]["layers"][1] == 24
    assert d["memory_proportional"]["layers"] == [[0, 12], [12, 24]]
    for n in d["nodes"]:
        if n["used"]:
            assert n["budget"]["npu"]["used"] <= n["budget"]["npu"]["cap"]
            assert n["budget"]["ram"]["used"] <= n["budget"]["ram"]["cap"]
    net = d["prediction"]["network"]
    remote = sum(1 for n in d["nodes"][1:] if n["used"])
    assert net["remote_nodes"] == remote
    assert d["prediction"]["decode_s_per_token"] == pytest.approx(
        sum(n["prediction"]["decode_s_per_token"] for n in d["nodes"] if n["used"]) + net["decode_s_per_token"], rel=1e-6)


def test_the_client_board_file_may_carry_the_network(tmp_path):
    t = (ROOT / "tiermaps" / "boards" / "rk3588-32g.toml").read_text()
    b = tmp_path / "mine.toml"
    b.write_text(t + '\n[network]\nlatency_s = 0.0005\nbandwidth_bytes_per_s = 50e6\nround_trips_per_eval = 10\n')
    spec = cluster.parse_cluster(f"{b},rk3588-32g")
    assert spec.network.latency_s == 0.0005 and spec.network.round_trips_per_eval == 10
    assert cluster.parse_cluster(f"{b},rk3588-32g", "1gbe").network == network.load_network("1gbe")
    assert cluster.parse_cluster("rk3588-32g,rk3588-32g").network == network.load_network("1gbe")  # the default


def test_the_plan_is_deterministic():
    args = [sys.executable, "-m", "orkpack", "plan", str(CFG / "mixtral.json"), "--boards", "rk3588-16g,rk3588-16g",
            "--json"]
    a = subprocess.run(args, capture_output=True, text=True)
    b = subprocess.run(args, capture_output=True, text=True)
    assert a.returncode == 0 and a.stdout == b.stdout


def test_hosts_and_cluster_files_are_checked(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('boards = ["rk3588-32g", "rk3588-32g"]\nhosts = ["a b", "c"]\n')
    with pytest.raises(Exception, match="'hosts' must list"):
        cluster.parse_cluster(str(f))
    bad = tmp_path / "cluster.json"
    bad.write_text(json.dumps({"schema": "orkpack.cluster", "nodes": [], "commands": {"client": {"argv": ["x\x1b[31m"]}}}))
    res = subprocess.run([sys.executable, "-m", "orkpack", "inspect", str(bad)], capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.startswith("error:") and "\x1b" not in res.stdout + res.stderr


def test_the_joint_split_is_never_behind_llama_cpp_s():
    """llama.cpp's memory-proportional split is one of the splits the program considers: stage by stage the joint
    optimum is at least as good (the first stage strictly better here: the 16 GB board is left out)."""
    man = manifest_from_path(CFG / "mixtral.json")
    spec = cluster.parse_cluster("rk3588-32g,rk3588-16g")
    joint = cluster.solve_cluster(man, spec)
    mem = cluster.solve_cluster(man, spec, fixed=llamacpp.memory_proportional(spec.boards, 32))
    assert mem.ranges == [(0, 22), (22, 32)] and joint.ranges == [(0, 32), (32, 32)]
    assert joint.stages[0]["value"] < mem.stages[0]["value"] * (1 - 1e-3)
    assert not joint.nodes[1]["used"] and cluster.commands(joint)["rpc_servers"] == []


def test_a_failed_cluster_build_leaves_nothing(built, tmp_path, monkeypatch):
    import orkpack.build.pipeline as ob
    from orkpack.build import BuildOptions
    from orkpack.errors import OrkError

    d, model, plan, results, cj = built
    board = d / "tiny.toml"
    real, calls = ob.build, []

    def failing(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OrkError("the second node's source broke")
        return real(*a, **kw)

    monkeypatch.setattr(ob, "build", failing)
    out = tmp_path / "out"
    with pytest.raises(OrkError, match="second node"):
        cluster_build.build_cluster(model, out, BuildOptions(ctx=256), f"{board},{board},{board}")
    assert not out.exists()


@pytest.mark.parametrize("args,needle", [(["--boards", "rk3588-16g", "--frontier"], "--frontier"),
                                         (["--boards", "rk3588-16g", "--board", "rk3588-8g"], "--board and --boards")])
def test_options_that_contradict_boards(args, needle):
    res = subprocess.run([sys.executable, "-m", "orkpack", "plan", str(CFG / "qwen2.json"), *args],
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and needle in res.stderr


def test_the_runtime_path_reaches_every_board():
    spec = cluster.parse_cluster("rk3588-32g,rk3588-16g", runtime="rkllm")
    assert [b.runtime for b in spec.boards] == ["rkllm", "rkllm"]
    assert [b.runtime for b in cluster.parse_cluster("rk3588-32g,rk3588-16g").boards] == ["ggml-ork", "ggml-ork"]
    man = manifest_from_path(CFG / "qwen2.json")
    a = cluster.solve_cluster(man, cluster.parse_cluster("rk3588-16g,rk3588-16g"), ctx=2048)
    b = cluster.solve_cluster(man, cluster.parse_cluster("rk3588-16g,rk3588-16g", runtime="rkllm"), ctx=2048)
    assert a.prediction["decode_s_per_token"] != b.prediction["decode_s_per_token"]
    assert cluster.to_json(b)["nodes"][0]["runtime"] == "rkllm"


def test_the_nf4_format_reaches_every_board():
    """--nf4-format: every board counts host NF4 at the build's format, each node's tier map and cluster.json
    record it; the default is dq32, whose host NF4 takes fewer bytes than b64."""
    from orkpack.tiers import cost

    assert [b.nf4_format for b in cluster.parse_cluster("rk3588-32g,rk3588-16g", nf4_format="b64").boards] == ["b64"] * 2
    assert [b.nf4_format for b in cluster.parse_cluster("rk3588-32g,rk3588-16g").boards] == ["dq32"] * 2
    man = manifest_from_path(CFG / "qwen2.json")
    host_nf4 = {}
    for fmt in ("b64", "dq32"):
        plan = cluster.solve_cluster(man, cluster.parse_cluster("rk3588-16g,rk3588-16g", nf4_format=fmt), ctx=2048)
        assert {n["nf4_format"] for n in cluster.to_json(plan)["nodes"]} == {fmt}
        host_nf4[fmt] = 0
        for j, n in enumerate(plan.nodes):
            if not n["used"]:
                continue
            tm = cluster.node_tiermap(plan, j)
            assert tm.board["nf4_format"] == fmt
            for d in tm.decisions:
                if d.tier == "host" and d.encoding == "nf4":
                    assert d.bytes == cost.host_nf4_bytes(*d.shape, fmt)
                    host_nf4[fmt] += 1
                assert d.host_copy is None or d.host_copy_bytes == cost.host_nf4_bytes(*d.shape, fmt)
    assert host_nf4["b64"] and host_nf4["dq32"]
    # build --boards plans at the format it writes: --nf4-format, else dq32 with --nf4-mode opt, b64 with bnb
    from orkpack.build import BuildOptions
    from orkpack.errors import OrkError

    assert [cluster_build.build_nf4_format(BuildOptions(**kw)) for kw in
            ({}, {"nf4_format": "b64"}, {"nf4_mode": "bnb"})] == ["dq32", "b64", "b64"]
    with pytest.raises(OrkError, match="--nf4-mode bnb"):
        cluster_build.build_nf4_format(BuildOptions(nf4_mode="bnb", nf4_format="dq32"))


def test_cluster_packs_store_the_node_maps_bytes(built):
    """The default cluster build plans at dq32 and writes it: every host NF4 slice is nf4dq, of the bytes its
    node's tier map counts."""
    from orkpack.pack import spec
    from orkpack.pack.reader import Pack
    from orkpack.tiers.tiermap import TierMap

    d, model, plan, results, cj = built
    nf4 = 0
    for r in results:
        with Pack.open(r.path) as p:
            tm = TierMap.from_json(p.header["tiermap"])
            assert tm.nf4_format == "dq32"
            for t, s in p.slices():
                dec = tm.get(t["name"], s["expert"])
                if dec.tier == "host" and dec.encoding == "nf4":
                    assert s["encoding"] == spec.ENC_NF4DQ
                    assert sum(v["size"] for v in s["parts"].values()) == dec.bytes
                    nf4 += 1
    assert nf4


# ------------------------------------------------------------------------------------------ issue 27's refusals

def _orkpack(*args: str) -> tuple[int, list[str]]:
    res = subprocess.run([sys.executable, "-m", "orkpack", *map(str, args)], capture_output=True, text=True)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, [x for x in res.stderr.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from orkpack import synth

    return synth.write_hf_model(tmp_path_factory.mktemp("small") / "m", hidden=64, intermediate=128, heads=2,
                                kv_heads=1, vocab=512, seed=3)


@pytest.mark.parametrize("boards", ["rk3588-8g,rk3588-8g", "rk3588-8g"])
def test_cluster_refusal_names_the_max_ram_that_binds(small_model, boards):
    """A --max-ram below the boards' reserves: the refusal says the model does not fit within --max-ram (not that
    the boards offer their whole RAM) and names a least --max-ram it needs (a bound: one byte less is refused;
    on one board it is exact: that value plans)."""
    rc, lines = _orkpack("plan", small_model, "--boards", boards, "--max-ram", "1GiB")
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "within --max-ram 1073741824" in lines[0] and "offer 13.00 GiB in all" not in lines[0], lines
    least = int(re.search(r"raise --max-ram to at least (\d+) ", lines[0]).group(1))
    assert least > load_board("rk3588-8g").reserve_bytes
    rc, lines = _orkpack("plan", small_model, "--boards", boards, "--max-ram", least - 1)
    assert rc == 2 and "within --max-ram" in lines[0], lines
    if "," not in boards:
        rc, lines = _orkpack("plan", small_model, "--boards", boards, "--max-ram", least, "--json")
        assert rc == 0, lines
    rc, lines = _orkpack("plan", small_model, "--boards", boards, "--max-ram", "7GiB", "--json")
    assert rc == 0, lines


def test_cluster_refusal_names_only_the_constraints_given(small_model):
    rc, lines = _orkpack("plan", small_model, "--boards", "rk3588-8g,rk3588-8g", "--min-decode-tok-s", "1e9")
    assert rc == 2 and len(lines) == 1 and "--min-decode-tok-s 1e+09" in lines[0], lines
    assert "--max-ram" not in lines[0] and "--max-kld" not in lines[0], lines
    rc, lines = _orkpack("plan", small_model, "--boards", "rk3588-8g,rk3588-8g", "--min-decode-tok-s", "1e9",
                         "--max-kld", "1e-12")
    assert rc == 2 and len(lines) == 1 and "--min-decode-tok-s 1e+09 and --max-kld 1e-12" in lines[0], lines
    # a model that does not fit at all is told so, whatever else was asked
    rc, lines = _orkpack("plan", small_model, "--boards", "rk3588-8g,rk3588-8g", "--min-decode-tok-s", "1e9",
                         "--max-ram", "1GiB")
    assert rc == 2 and "does not fit" in lines[0] and "within --max-ram" in lines[0], lines
    # the KV cache at its smallest already: --kv-type q8_0 is not offered again
    for extra in ([], ["--max-ram", "1GiB"]):
        rc, lines = _orkpack("plan", small_model, "--boards", "rk3588-8g,rk3588-8g", "--kv-type", "q8_0",
                             "--ctx", "200000000", *extra)
        assert rc == 2 and "does not fit" in lines[0] and "q8_0 KV" in lines[0], lines
        assert "try --kv-type" not in lines[0] and "a shorter --ctx" in lines[0], lines


@pytest.mark.parametrize("text", ["boards = [", 'boards = ["rk3588-8g"]\nhosts = [\n'])
def test_a_bad_cluster_file_is_called_a_cluster_file(small_model, tmp_path, text):
    f = tmp_path / "c.toml"
    f.write_text(text)
    for cmd in (["plan", small_model], ["build", small_model, "-o", tmp_path / "o"]):
        rc, lines = _orkpack(*cmd, "--boards", f)
        assert rc == 2 and len(lines) == 1 and "not valid TOML" in lines[0], lines
        assert "network file" not in lines[0] and "fix the cluster or board file" in lines[0], lines
        assert not (tmp_path / "o").exists()


def test_host_formats_apply_to_every_board(tmp_path):
    """--host-low / --host-high with --boards: every node's board is priced in those formats (one build writes
    every node's pack), its tier map records them, and the cluster build writes its host items in them."""
    from orkpack.build import BuildOptions
    from orkpack.pack.reader import Pack
    from orkpack.synth import write_hf_model

    model = write_hf_model(tmp_path / "m", layers=4, seed=1, vocab=512)
    board = _tiny_board(tmp_path / "tiny.toml", 2_600_000, 600_000)
    boards = f"{board},{board},{board}"
    plan, _, _ = cluster.plan_cluster(model, boards, ctx=256, host_low="int5dq", host_high="int6dq", baseline=False)
    used = [j for j, n in enumerate(plan.nodes) if n["used"]]
    assert len(used) >= 2 and all((b.host_low, b.host_high) == ("int5dq", "int6dq") for b in plan.boards)
    for j in used:
        bb = cluster.node_tiermap(plan, j).board
        assert (bb["host_low"], bb["host_high"]) == ("int5dq", "int6dq")
    _, results, _ = cluster_build.build_cluster(model, tmp_path / "out",
                                                BuildOptions(ctx=256, host_low="int5dq", host_high="int6dq"), boards)
    encs = set()
    for r in results:
        with Pack.open(r.path) as p:
            encs |= {s["encoding"] for _, s in p.slices() if len(s["shape"]) == 2}
    assert encs <= {"int5dq", "int6dq", "int8", "nf4", "nf4dq"} and encs & {"int5dq", "int6dq"}, encs
    res = subprocess.run([sys.executable, "-m", "orkpack", "plan", str(model), "--boards", boards, "--ctx", "256",
                          "--host-low", "int5dq", "--host-high", "int8dq", "--json"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([sys.executable, "-m", "orkpack", "plan", str(model), "--boards", boards,
                          "--host-low", "int8"], capture_output=True, text=True)
    assert res.returncode == 2 and "host low format 'int8'" in res.stderr and "Traceback" not in res.stderr
