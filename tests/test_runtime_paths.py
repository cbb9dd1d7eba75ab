"""Runtime paths (orkpack/tiers/runtime.py, tiermaps/runtimes/): the loader refuses bad files in one line,
the board file holds the hardware only, each runtime path predicts by its own constants (submit cost,
efficiency, CPU rates, NPU decode, per-request cost), plan/build/inspect record and show it, and a tier
map planned before runtime paths (board v2 block) still reads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orkpack import synth
from orkpack.errors import OrkError
from orkpack.tiers import cost
from orkpack.tiers.board import board_from_json, load_board
from orkpack.tiers.command import plan
from orkpack.tiers.manifest import manifest_from_config
from orkpack.tiers.profile import load_profile
from orkpack.tiers.runtime import RUNTIME_DIR, load_runtime, runtime_names
from orkpack.tiers.solver import evaluate, ttft_s

ROOT = Path(__file__).resolve().parents[1]
TM = ROOT / "tiermaps"
GGML = (TM / "runtimes" / "ggml-ork.toml").read_text()
QWEN7 = TM / "configs" / "qwen2.5-7b" / "config.json"


def _cli(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "orkpack", *map(str, args)], capture_output=True, text=True, env=env)


# ------------------------------------------------------------------------------------------ the files

def test_shipped_runtime_paths_load_and_are_package_data():
    assert runtime_names() == ["ggml-ork", "llama.cpp-cpu", "rkllm"]
    for name in runtime_names():
        rt = load_runtime(name)
        assert rt.name == name and (RUNTIME_DIR / f"{name}.toml").read_text() == (TM / "runtimes" / f"{name}.toml").read_text()
        assert rt.decode_fraction <= 1.0
    assert load_runtime(None).name == "ggml-ork"  # the default
    assert load_runtime("ggml-ork").submit_overhead_s == 365e-6  # the field report's (DESIGN.md section 1)
    assert load_runtime("rkllm").decode_engine == "npu" and load_runtime("llama.cpp-cpu").engines == ("cpu",)


def test_every_shipped_value_is_commented():
    for p in (TM / "runtimes").glob("*.toml"):
        lines = [ln for ln in p.read_text().splitlines() if ln.strip() and not ln.startswith("[")]
        for i, ln in enumerate(lines):
            if "=" in ln and not ln.startswith("#"):
                assert i > 0 and (lines[i - 1].startswith("#") or "=" in lines[i - 1]), (p.name, ln)


BAD = [  # (name, edit of ggml-ork.toml, what the one line says)
    ("schema", lambda t: t.replace('schema = "orkpack.runtime"', 'schema = "orkpack.board"'), "not an orkpack runtime v1"),
    ("version", lambda t: t.replace("version = 1", "version = 7"), "not an orkpack runtime v1"),
    ("no name", lambda t: t.replace('name = "ggml-ork"', ""), "'name' is missing"),
    ("engines", lambda t: t.replace('engines = ["npu", "cpu", "gpu"]', 'engines = ["npu", "tpu"]'), "'engines' must list"),
    ("no cpu", lambda t: t.replace('engines = ["npu", "cpu", "gpu"]', 'engines = ["npu"]'), "'engines' must list"),
    ("no section", lambda t: t.replace("[request]\n", "").replace("\nfixed_s = 0.0\n", "\n"), "section [request] is missing"),
    ("no key", lambda t: t.replace("token_fixed_s = 0.01681\n", ""), "'token_fixed_s' must be a non-negative number"),
    ("negative", lambda t: t.replace("int8_ops_per_s = 1.048e11", "int8_ops_per_s = -1.0"),
     "'int8_ops_per_s' must be a positive number"),
    ("string", lambda t: t.replace("efficiency = 0.1461", 'efficiency = "fast"'), "'efficiency' must be a positive"),
    ("faster than physics", lambda t: t.replace("bandwidth_fraction = 1.0", "bandwidth_fraction = 1.4"),
     "bandwidth_fraction 1.4 is above 1"),
    ("efficiency over 1", lambda t: t.replace("efficiency = 0.1461", "efficiency = 2.0"), "efficiency 2 is above 1"),
    ("decode engine", lambda t: t.replace('engine = "cpu"', 'engine = "gpu"'), "[decode] engine must be cpu or npu"),
    ("npu section without the npu engine", lambda t: t.replace('engines = ["npu", "cpu", "gpu"]', 'engines = ["cpu"]'),
     "section [npu] given but 'engines' has no npu"),
    ("unknown top key", lambda t: t + "\nspeed = 3\n", "unknown key 'speed'"),
    ("unknown section key", lambda t: t.replace("\nfixed_s = 0.0", "\nfixed_s = 0.0\nfixed_ms = 3"),
     "[request] has unknown key 'fixed_ms'"),
    ("bad toml", lambda t: t + "\n[npu\n", "not valid TOML"),
]


@pytest.mark.parametrize("name,edit,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_runtime_file_is_one_line_exit_2(tmp_path, name, edit, needle):
    text = edit(GGML)
    assert text != GGML
    f = tmp_path / "rt.toml"
    f.write_text(text)
    with pytest.raises(OrkError, match=None) as e:
        load_runtime(f)
    assert needle in str(e.value) and "rt.toml" in str(e.value)
    out = tmp_path / "map.json"
    r = _cli("plan", QWEN7, "--runtime", f, "-o", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_unknown_runtime_name_and_missing_file(tmp_path):
    r = _cli("plan", QWEN7, "--runtime", "vllm", "--json")
    assert r.returncode == 2 and "unknown runtime 'vllm'; shipped runtimes: ggml-ork, llama.cpp-cpu, rkllm" in r.stderr
    r = _cli("plan", QWEN7, "--runtime", tmp_path / "none.toml", "--json")
    assert r.returncode == 2 and "runtime file not found" in r.stderr


def test_board_file_is_hardware_only(tmp_path):
    board = (TM / "boards" / "rk3588-32g.toml").read_text()
    assert "[stream]" in board and "[cpu]" not in board and "submit_overhead_s" not in board
    cases = [
        (board.replace("version = 3", "version = 2"), "a board v2 file"),
        (board + "\n[cpu]\nint8_ops_per_s = 1e11\n", "section [cpu] belongs to a runtime path"),
        (board.replace("k_ref = 2048", "k_ref = 2048\nsubmit_overhead_s = 1e-4"), "[npu] submit_overhead_s belongs"),
        (board.replace("[stream]", "[streams]"), "section [stream] is missing"),
        (board.replace("cpu_bytes_per_s = 2.294e10", "cpu_bytes_per_s = 0"), "'cpu_bytes_per_s' must be a positive"),
    ]
    for text, needle in cases:
        f = tmp_path / "b.toml"
        f.write_text(text)
        r = _cli("plan", QWEN7, "--board", f, "--json")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and needle in r.stderr, (needle, r.stderr)


def test_a_runtime_decoding_on_the_npu_needs_a_board_with_one(tmp_path):
    board = (TM / "boards" / "rk3588-32g.toml").read_text().replace('engines = ["npu", "cpu", "gpu"]',
                                                                     'engines = ["cpu", "gpu"]')
    f = tmp_path / "nonpu.toml"
    f.write_text(board)
    with pytest.raises(OrkError, match="decodes on the NPU, which the board lacks"):
        load_board(f, "rkllm")
    assert load_board(f, "ggml-ork").engines == ("cpu", "gpu")


# ------------------------------------------------------------------------------------------ predictions

def test_the_board_and_the_runtime_join_as_documented():
    hw = load_board("rk3588-32g")
    for name in runtime_names():
        b, rt = load_board("rk3588-32g", name), load_runtime(name)
        assert b.runtime == name and b.path() == rt
        assert b.decode_bandwidth == hw.cpu_stream_bytes_per_s * rt.decode_fraction <= 22.94e9
        assert b.npu_decode_bandwidth == hw.npu_stream_bytes_per_s * rt.decode_fraction
        assert b.engines == tuple(e for e in ("npu", "cpu", "gpu") if e in rt.engines)
        assert b.total_bytes == hw.total_bytes and b.npu_k_ref == hw.npu_k_ref


def test_submit_cost_and_efficiency_are_the_runtimes():
    """One matmul, M = 64, K = N = 2048, by hand: calls x submit + 2 M N K / (cores x peak x efficiency)."""
    for name in ("ggml-ork", "rkllm"):
        b = load_board("rk3588-32g", name)
        rt = load_runtime(name)
        want = rt.submit_overhead_s + 2 * 64 * 2048 * 2048 / (3 * 2.0e12 * rt.npu_efficiency)
        assert cost.t_npu(2048, 2048, 64, b) == pytest.approx(want, rel=1e-12)
    # ggml-ork's submit (365 us) makes the NPU win later than rkllm's (152 us)
    g, r = load_board("rk3588-32g", "ggml-ork"), load_board("rk3588-32g", "rkllm")
    assert cost.min_m(2048, 2048, g) > cost.min_m(2048, 2048, r) >= 2


def test_npu_decode_reads_tiles_at_the_npu_stream():
    r, g = load_board("rk3588-32g", "rkllm"), load_board("rk3588-32g", "ggml-ork")
    n, k = 4096, 4096
    tiles = cost.npu_tile_bytes(n, k, r)
    assert cost.decode_s(n, k, "npu", r) == tiles / (2.971e10 * r.decode_fraction)
    assert cost.decode_s(n, k, "npu+nf4", r) == tiles / r.npu_decode_bandwidth  # the NPU reads its own tiles
    assert cost.decode_s(n, k, "nf4", r) == cost.host_nf4_bytes(n, k, "dq32") / r.decode_bandwidth  # host items: the CPU
    assert cost.decode_s(n, k, "npu+nf4", g) == cost.host_nf4_bytes(n, k, "dq32") / g.decode_bandwidth  # ggml-ork: M = 1 on the CPU
    # the CPU reads host NF4 in the build's format: dq32 (the default) 4.25 bits a weight and a little, b64 4.5
    g64 = load_board("rk3588-32g", "ggml-ork", "b64")
    assert g.nf4_format == "dq32" and g64.nf4_format == "b64"
    assert cost.decode_s(n, k, "nf4", g) == (n * k // 2 + n * k // 32 + 4 * (n * k // 32 // 256) + 4) / g.decode_bandwidth
    assert cost.decode_s(n, k, "npu+nf4", g64) == (n * k // 2 + 4 * (n * k // 64)) / g64.decode_bandwidth


def test_request_cost_is_charged_once_in_the_ttft():
    man = manifest_from_config(json.loads(QWEN7.read_text()))
    r = load_board("rk3588-32g", "rkllm")
    prof = load_profile(None, man, r, 512)
    ch = ["int8" if it.role == "embedding" else "npu" for it in man.items]
    without = replace(r, request_s=0.0)
    for prompt in (100, 512, 1300):  # one chunk, and three
        assert ttft_s(man, r, prof, ch, prompt) - ttft_s(man, without, prof, ch, prompt) == pytest.approx(r.request_s, abs=1e-12)
    e = evaluate(man, r, prof, ch, prompt=512)
    assert e["prefill_s_per_chunk"] == evaluate(man, without, prof, ch, prompt=512)["prefill_s_per_chunk"]


def test_each_runtime_path_plans_differently():
    plans = {name: plan(QWEN7, runtime=name, ctx=8192)[0] for name in runtime_names()}
    cpu = plans["llama.cpp-cpu"]
    assert cpu.budget["npu"]["used"] == 0 and cpu.budget["npu"]["cap"] == 0
    assert all(d.tier == "host" for d in cpu.decisions)
    assert cpu.board["runtime"]["engines"] == ["cpu"] and cpu.board["engines"] == ["npu", "cpu", "gpu"]
    for name, tm in plans.items():
        assert tm.board["runtime"]["name"] == name
        assert TierMap_roundtrip(tm) == tm.board
    assert plans["ggml-ork"].budget["npu"]["used"] > 0
    # a host NF4 copy is for the CPU's decode: ggml-ork keeps some, rkllm (NPU decode) none
    assert any(d.host_copy for d in plans["ggml-ork"].decisions)
    assert plans["rkllm"].budget["npu"]["used"] > 0 and not any(d.host_copy for d in plans["rkllm"].decisions)
    pinned = plan(QWEN7, runtime="rkllm", ctx=8192, pins={"npu": ["blk.0.*"], "nf4": ["blk.0.*"]})[0]
    assert all(d.tier == "npu" and d.host_copy is None for d in pinned.decisions if d.tensor.startswith("blk.0.")
               and d.tensor.endswith("weight") and len(d.shape) == 2)
    # the same hardware: every runtime's decode bounded by the same stream
    for tm in plans.values():
        assert tm.board["cpu_stream_bytes_per_s"] == 2.294e10


def TierMap_roundtrip(tm) -> dict:
    """The board block read back (board_from_json) and written again."""
    return board_from_json(json.loads(json.dumps(tm.board)), "map").to_json()


def test_plan_prints_the_runtime_and_json_records_it():
    r = _cli("plan", QWEN7, "--runtime", "rkllm")
    assert r.returncode == 0 and "runtime rkllm" in r.stdout and "NPU items decode on the NPU" in r.stdout
    assert "runtime path rkllm: NPU submit 152 us, efficiency 0.288; decode NPU items on the NPU" in r.stdout
    assert "45.4 ms/request" in r.stdout
    r = _cli("plan", QWEN7, "--runtime", "llama.cpp-cpu")
    assert r.returncode == 0 and "runtime llama.cpp-cpu" in r.stdout and "always runs on the CPU" in r.stdout
    assert "runtime path llama.cpp-cpu: no NPU; decode on the CPU" in r.stdout and "does not use the NPU" in r.stdout
    js = json.loads(_cli("plan", QWEN7, "--json").stdout)
    assert js["board"]["runtime"]["name"] == "ggml-ork" and js["board"]["runtime"]["submit_overhead_s"] == 365e-6


def test_a_v2_board_block_still_reads_as_its_constants():
    """Tier maps planned before runtime paths carry the software constants in the board block: they read as
    runtime path "board-v2" with the same cost model (decode at that block's bandwidth)."""
    b = load_board("rk3588-32g", "rkllm")
    d = b.to_json()
    rt = d.pop("runtime")
    old = {k: v for k, v in d.items() if k not in ("cpu_stream_bytes_per_s", "npu_stream_bytes_per_s")}
    old.update({k: rt[k] for k in ("npu_efficiency", "npu_k_falloff", "submit_overhead_s", "cpu_int8_ops_per_s",
                                   "cpu_nf4_ops_per_s", "cpu_float_ops_per_s", "decode_token_s", "tile_read_factor")})
    old["decode_bandwidth_bytes_per_s"] = b.decode_bandwidth
    v2 = board_from_json(old, "old map")
    assert v2.runtime == "board-v2" and v2.decode_engine == "cpu" and v2.request_s == 0.0
    for f in ("npu_efficiency", "submit_overhead_s", "cpu_int8_ops_per_s", "decode_token_s", "total_bytes"):
        assert getattr(v2, f) == getattr(b, f), f
    assert v2.decode_bandwidth == b.decode_bandwidth
    del old["submit_overhead_s"]
    with pytest.raises(OrkError, match="'submit_overhead_s' must be"):
        board_from_json(old, "old map")


def test_build_records_the_runtime_and_inspect_shows_it(tmp_path):
    m = synth.write_hf_model(tmp_path / "m", layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=64,
                             shards=1, seed=5)
    out = tmp_path / "m.orkpack"
    r = _cli("build", m, "-o", out, "--runtime", "llama.cpp-cpu", "--json")
    assert r.returncode == 0, r.stderr
    r = _cli("inspect", out)
    assert r.returncode == 0 and "runtime llama.cpp-cpu" in r.stdout, r.stdout
    js = json.loads(_cli("inspect", out, "--json").stdout)
    assert js["tiermap"]["board"]["runtime"]["name"] == "llama.cpp-cpu"
    assert js["residency"].get("npu", {}).get("slices", 0) == 0
