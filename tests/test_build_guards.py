"""Issue 14: a source with nothing to plan, an output path that is one of the build's inputs, one rule for
what stays float (planner and --no-plan), options --tiermap ignores, the build line's speed unit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orkpack import synth
from orkpack.build import BuildOptions, build
from orkpack.errors import OrkError
from orkpack.pack.reader import Pack
from orkpack.pack.writer import PARTIAL_SUFFIX
from orkpack.runtime.verify import verify_pack
from orkpack.tiers.manifest import manifest_from_path

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "orkpack", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    save_file(tensors, str(path))
    return path


def _encodings(pack: Path) -> dict[str, str]:
    """tensor name -> the encodings of its slices (one name when they agree)."""
    with Pack.open(pack) as p:
        return {t["name"]: "/".join(sorted({s["encoding"] for s in t["slices"]})) for t in p.tensors}


# ----------------------------------------------------------------------------- nothing to plan

NOTHING_TO_PLAN = {
    # the case: one complex64 "matrix" (carried raw: never a weight to quantize)
    "complex64": {"model.layers.0.mlp.up_proj.weight": (np.arange(16).reshape(4, 4) * (1 + 2j)).astype(np.complex64)},
    # only what always stays float: norms, a router, a stacked bias; and an integer buffer
    "floats only": {"model.layers.0.input_layernorm.weight": np.ones(8, np.float32),
                    "model.layers.0.mlp.gate.weight": np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8),
                    "model.layers.0.self_attn.o_proj.bias": np.zeros(8, np.float32),
                    "model.layers.0.counts": np.arange(6, dtype=np.int64)},
}


@pytest.mark.parametrize("case", sorted(NOTHING_TO_PLAN))
def test_a_source_with_nothing_to_plan_plans_and_builds(tmp_path, case):
    src = _write_safetensors(tmp_path / "m.safetensors", NOTHING_TO_PLAN[case])
    man = manifest_from_path(src)
    assert man.items == []
    r = _cli("plan", src, "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    tm = json.loads(r.stdout)
    assert tm["objective"]["status"] == "optimal" and tm["budget"]["npu"]["items"] == 0
    # the tier map still lists every tensor (raw or float, on the host)
    assert {d["name"] for d in tm["tensors"]} == {t.name for t in man.tensors}
    assert all(s["tier"] == "host" and s["encoding"] in ("raw", "f32") for d in tm["tensors"] for s in d["slices"])
    out = tmp_path / "out.orkpack"
    r = _cli("build", src, "-o", out, "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert verify_pack(out).exit_code == 0
    enc = _encodings(out)
    assert set(enc.values()) <= {"raw", "f32"} and len(enc) == len(NOTHING_TO_PLAN[case])


# ----------------------------------------------------------------------------- output path = an input

@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    m = synth.write_hf_model(d / "model", layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=64,
                             shards=2, seed=3)
    (m / "tokenizer.json").write_text('{"version": "1.0"}\n')
    return m


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _refused(src: Path, out: Path, watch: Path, **kw) -> str:
    before = _snapshot(watch)
    with pytest.raises(OrkError) as e:
        build(src, out, BuildOptions(threads=1, **kw))
    msg = str(e.value)
    assert "\n" not in msg and "another output path" in msg
    assert _snapshot(watch) == before  # the source untouched, no temp file left beside it
    assert not list(watch.glob("*" + PARTIAL_SUFFIX))
    return msg


def test_output_over_the_source_is_refused(sharded, tmp_path):
    shard = sorted(sharded.glob("*.safetensors"))[0]
    # a shard of the folder, by its own name and by another spelling of it
    assert "weight file of the source" in _refused(sharded, shard, sharded)
    assert "weight file" in _refused(sharded, sharded / ".." / sharded.name / shard.name, sharded)
    # the index, the config and the tokenizer of the folder
    for name in ("model.safetensors.index.json", "config.json", "tokenizer.json"):
        assert "source model folder" in _refused(sharded, sharded / name, sharded)
    # the same file as the source: a lone .safetensors file, and its config.json beside it
    assert "weight file" in _refused(shard, shard, sharded)
    assert "config.json" in _refused(shard, sharded / "config.json", sharded)


def test_output_that_is_a_link_to_the_source_is_refused(sharded, tmp_path):
    shard = sorted(sharded.glob("*.safetensors"))[0]
    sym = tmp_path / "sym.orkpack"
    sym.symlink_to(shard)
    hard = tmp_path / "hard.orkpack"
    os.link(shard, hard)
    for out in (sym, hard):
        before = out.read_bytes()
        assert shard.name in _refused(sharded, out, sharded)
        assert out.read_bytes() == before and not list(tmp_path.glob("*" + PARTIAL_SUFFIX))


def test_output_over_an_option_file_is_refused(sharded, tmp_path):
    tm = tmp_path / "map.json"
    assert _cli("plan", sharded, "-o", tm).returncode == 0
    assert "--tiermap file" in _refused(sharded, tm, tmp_path, tiermap=tm)
    board = tmp_path / "b.toml"
    board.write_text((ROOT / "tiermaps" / "boards" / "rk3588-32g.toml").read_text())
    assert "--board file" in _refused(sharded, board, tmp_path, board=str(board))


def test_cli_refuses_with_exit_2_and_a_previous_pack_may_be_replaced(sharded, tmp_path):
    shard = sorted(sharded.glob("*.safetensors"))[0]
    before = shard.read_bytes()
    r = _cli("build", sharded, "-o", shard)
    assert r.returncode == 2 and r.stderr.count("error:") == 1 and "Traceback" not in r.stderr
    assert shard.read_bytes() == before
    # a pack already in the model folder is no input: rebuilding over it is fine
    out = sharded / "m.orkpack"
    try:
        assert _cli("build", sharded, "-o", out, "--no-plan").returncode == 0
        assert _cli("build", sharded, "-o", out, "--no-plan").returncode == 0
        assert verify_pack(out).exit_code == 0
    finally:
        out.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- one float rule

def _floats_by_rules(man) -> set[str]:
    from types import SimpleNamespace

    from orkpack.build import RulePlacement

    infos = [SimpleNamespace(name=t.name, shape=t.shape, dtype=t.dtype) for t in man.tensors]
    rp = RulePlacement(BuildOptions(), infos)
    out = set()
    for i in infos:
        for e in (range(i.shape[0]) if len(i.shape) == 3 else [None]):
            if rp.decide(i, e).encoding in ("f32", "f16", "bf16"):
                out.add(i.name)
    return out


@pytest.mark.parametrize("family", sorted(synth.TINY))
def test_planner_and_rules_keep_the_same_tensors_float(family):
    """The planner's items and --no-plan's defaults come from one rule: the tensors each keeps float are
    the same, for every family's fixture."""
    from orkpack.tiers.manifest import manifest_from_config

    man = manifest_from_config(synth.TINY[family])
    planner = {t.name for t in man.floats}
    assert planner == _floats_by_rules(man)
    assert not {it.tensor for it in man.items} & planner


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    return synth.write_hf_model(tmp_path_factory.mktemp("gptoss") / "m", config=synth.TINY["gpt_oss"], shards=1)


ALWAYS_FLOAT_GPT_OSS = ("blk.{}.ffn_gate_inp.weight", "blk.{}.ffn_gate_inp.bias", "blk.{}.ffn_gate_up_exps.bias",
                        "blk.{}.ffn_down_exps.bias", "blk.{}.attn_sinks", "blk.{}.attn_q.bias", "blk.{}.attn_norm.weight")


@pytest.mark.parametrize("how", ["plan", "no-plan", "no-plan, pinned", "plan, pinned"])
def test_gpt_oss_routers_and_stacked_biases_stay_float_on_both_paths(gpt_oss, tmp_path, how):
    pins = ["--int8", "blk.*.ffn_gate_inp.weight", "--nf4", "*_exps.bias"] if "pinned" in how else []
    out = tmp_path / "g.orkpack"
    r = _cli("build", gpt_oss, "-o", out, *(["--no-plan"] if how.startswith("no-plan") else []), *pins)
    assert r.returncode == 0, r.stderr
    enc = _encodings(out)
    for layer in (0, 1):
        for t in ALWAYS_FLOAT_GPT_OSS:
            assert enc[t.format(layer)] == "bf16", (t.format(layer), enc[t.format(layer)])
        assert enc[f"blk.{layer}.ffn_gate_up_exps.weight"] != "bf16"  # the matrices are quantized
    if pins:  # a pin on what always stays float changes nothing, and says so
        assert "--int8 'blk.*.ffn_gate_inp.weight' matches only tensors that always stay float" in r.stderr
        assert "--nf4 '*_exps.bias' matches only tensors that always stay float" in r.stderr
    assert verify_pack(out).exit_code == 0


def test_a_tier_map_that_quantizes_a_router_is_overruled(gpt_oss, tmp_path):
    tm = tmp_path / "map.json"
    assert _cli("plan", gpt_oss, "-o", tm).returncode == 0
    d = json.loads(tm.read_text())
    for t in d["tensors"]:
        if t["name"] == "blk.0.ffn_gate_inp.weight":
            t["slices"][0].update(encoding="nf4", bytes=144)
    tm.write_text(json.dumps(d))
    out = tmp_path / "g.orkpack"
    r = _cli("build", gpt_oss, "-o", out, "--tiermap", tm)
    assert r.returncode == 0, r.stderr
    assert "quantizes 1 tensor that always stay float (blk.0.ffn_gate_inp.weight); kept float" in r.stderr
    assert _encodings(out)["blk.0.ffn_gate_inp.weight"] == "bf16"


# ----------------------------------------------------------------------------- the build line's speed

@pytest.mark.parametrize("nbytes,seconds,shown", [
    (1_382_000_000, 1.0, "1.38 GB/s"), (1_382_000_000, 10.0, "138 MB/s"), (1_500_000, 0.3, "5.00 MB/s"),
    (300_000, 0.4, "750 kB/s"), (52_000_000, 1.0, "52.0 MB/s"), (12, 4.0, "3.00 B/s"), (5, 0.0, "n/a"),
])
def test_build_line_speed_has_a_unit_that_shows_a_number(tmp_path, nbytes, seconds, shown):
    from rich.console import Console

    from orkpack.build import BuildResult
    from orkpack.render import build_summary

    con = Console(record=True, width=200)
    r = BuildResult(path=tmp_path / "x.orkpack", tensors=3, source_bytes=nbytes, pack_bytes=nbytes // 3,
                    seconds=seconds, by_kind={}, worst_sqnr=None, warnings=[])
    build_summary(con, r)
    assert f"({shown} of source)" in con.export_text()


# ----------------------------------------------------------------------------- --tiermap and the plan options

@pytest.mark.parametrize("extra,named", [
    (["--board", "rk3588-32g"], "--board"),  # given, even at its default value
    (["--runtime", "rkllm"], "--runtime"),
    (["--ctx", "4096"], "--ctx"),
    (["--profile", "{map}"], "--profile"),
    (["--goal", "decode", "--prompt", "128"], "--goal, --prompt"),
    (["--kv-type", "q8_0", "--prefill-m", "64", "--ignore-unknown"], "--kv-type, --prefill-m, --ignore-unknown"),
    (["--min-decode-tok-s", "1", "--min-prefill-tok-s", "1", "--max-ram", "20G"],
     "--min-decode-tok-s, --min-prefill-tok-s, --max-ram"),
])
def test_tiermap_refuses_the_plan_options_it_would_ignore(sharded, tmp_path, extra, named):
    tm = tmp_path / "map.json"
    assert _cli("plan", sharded, "-o", tm).returncode == 0
    out = tmp_path / "m.orkpack"
    r = _cli("build", sharded, "-o", out, "--tiermap", tm, *[x.format(map=tm) for x in extra], "--json")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: --tiermap with {named}: ") and "would be ignored" in r.stderr
    assert not out.exists() and not list(tmp_path.glob("*" + PARTIAL_SUFFIX))


def test_no_plan_refuses_the_plan_options_too(sharded, tmp_path):
    out = tmp_path / "m.orkpack"
    r = _cli("build", sharded, "-o", out, "--no-plan", "--board", "rk3588-32g", "--max-ram", "8G", "--json")
    assert r.returncode == 2 and r.stderr.startswith("error: --no-plan with --board, --max-ram: "), r.stderr
    assert not out.exists()
    assert _cli("build", sharded, "-o", out, "--no-plan", "--threads", "1", "--json").returncode == 0


def test_tiermap_takes_the_options_that_still_apply(sharded, tmp_path):
    tm = tmp_path / "map.json"
    assert _cli("plan", sharded, "-o", tm).returncode == 0
    out = tmp_path / "m.orkpack"
    r = _cli("build", sharded, "-o", out, "--tiermap", tm, "--threads", "1", "--npu-storage", "nf4", "--json")
    assert r.returncode == 0, r.stderr
    # the library refuses a changed plan option the same way (no CLI: values against their defaults)
    with pytest.raises(OrkError, match="^--tiermap with --ctx, --goal: "):
        build(sharded, tmp_path / "n.orkpack", BuildOptions(tiermap=tm, ctx=4096, goal="decode"))
