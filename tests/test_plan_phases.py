"""Issue 10 from the command line: predictions in every plan, goals and constraints, the frontier,
and building any frontier point with --tiermap."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from orkpack.cli import app, parse_bytes
from orkpack.errors import OrkError
from orkpack.synth import TINY, write_hf_model
from orkpack.tiers.tiermap import TierMap

runner = CliRunner()
QWEN7 = "tiermaps/configs/qwen2.5-7b/config.json"
QWEN30 = "tiermaps/configs/qwen3-30b-a3b/config.json"


def _plan(*args):
    r = runner.invoke(app, ["plan", *map(str, args)])
    assert r.exit_code == 0, r.output
    return r


def test_plan_json_predicts_both_phases_and_the_baselines():
    d = json.loads(_plan(QWEN7, "--json", "--prompt", "1000").stdout)
    p = d["prediction"]
    for k in ("prefill_tok_s", "decode_tok_s", "ttft_s"):
        assert p[k] > 0 and p["baselines"]["cpu_nf4"][k] > 0 and p["baselines"]["cpu_int8"][k] > 0
    assert p["prompt"] == 1000 and d["options"]["prompt"] == 1000
    # the bar: decode within 5 % of the all-NF4 baseline, not half of it
    assert p["decode_tok_s"] >= 0.95 * p["baselines"]["cpu_nf4"]["decode_tok_s"] * (1 - 1e-4)
    assert p["baselines"]["cpu_int8"]["decode_tok_s"] < 0.75 * p["baselines"]["cpu_nf4"]["decode_tok_s"]
    assert p["prefill_tok_s"] > p["baselines"]["cpu_nf4"]["prefill_tok_s"]
    assert all(d_["min_m"] >= 2 for t in d["tensors"] for d_ in t["slices"] if d_["tier"] == "npu")


def test_plan_table_shows_the_predictions_side_by_side():
    out = _plan(QWEN7).stdout
    for want in ("Predicted speed", "this plan", "CPU only, all NF4", "CPU only, all int8", "TTFT", "within 5%"):
        assert want in out, want


@pytest.mark.parametrize("goal", ["decode", "prefill", "quality"])
def test_goals_order_the_objectives(goal):
    d = json.loads(_plan(QWEN7, "--json", "--goal", goal).stdout)
    assert d["objective"]["goal"]["goal"] == goal and d["objective"]["status"] == "optimal"
    assert d["objective"]["order"][0].startswith(goal)


def test_constraints_and_bad_values_are_one_line():
    d = json.loads(_plan(QWEN7, "--json", "--goal", "quality", "--min-decode-tok-s", "5", "--max-ram", "20GiB").stdout)
    assert d["prediction"]["decode_tok_s"] >= 5 and d["budget"]["ram"]["used"] <= 20 << 30
    for args, msg in ((["--goal", "fast"], "--goal"), (["--max-ram", "lots"], "--max-ram"),
                      (["--min-decode-tok-s", "900"], "decode can reach at most"),
                      (["--min-prefill-tok-s", "-1"], "positive")):
        r = runner.invoke(app, ["plan", QWEN7, *args])
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, (args, r.output)
    assert parse_bytes("24GiB", "x") == 24 << 30 and parse_bytes("1.5G", "x") == 1_500_000_000
    with pytest.raises(OrkError):
        parse_bytes("0", "x")


def test_frontier_on_qwen3_30b_a3b_has_distinct_optimal_points(tmp_path):
    r = _plan(QWEN30, "--frontier", "--json")
    pts = json.loads(r.stdout)["frontier"]
    keys = {(p["prediction"]["decode_tok_s"], p["prediction"]["prefill_tok_s"]) for p in pts}
    assert len(pts) >= 3 and len(keys) >= 3
    assert all(p["objective"]["status"] == "optimal" for p in pts)
    dec = [p["prediction"]["decode_tok_s"] for p in pts]
    assert dec == sorted(dec, reverse=True)
    def key(p):
        q = next(x["value"] for x in p["objective"]["stages"] if x["metric"] == "quality")
        return (p["prediction"]["decode_tok_s"], p["prediction"]["prefill_tok_s"], q)

    for a in pts:  # no point dominates another in (decode, prefill, quality)
        for b in pts:
            if a is not b:
                ka, kb = key(a), key(b)
                assert not (all(y >= x for x, y in zip(ka, kb)) and kb != ka)
    out = _plan(QWEN30, "--frontier").stdout
    assert "Pareto frontier" in out


def test_a_frontier_point_builds_with_tiermap(tmp_path):
    folder = write_hf_model(tmp_path / "m", config=TINY["qwen3_moe"], seed=3)
    d = tmp_path / "front"
    d.mkdir()
    _plan(folder, "--frontier", "-o", d)
    files = sorted(d.glob("frontier-*.json"))
    assert files
    for f in (files[0], files[-1]):
        tm = TierMap.from_json(json.loads(f.read_text()))
        out = tmp_path / f"{f.stem}.orkpack"
        r = runner.invoke(app, ["build", str(folder), "-o", str(out), "--tiermap", str(f), "--threads", "1"])
        assert r.exit_code == 0, r.output
        assert runner.invoke(app, ["verify", str(out)]).exit_code == 0
        from orkpack.pack.reader import Pack

        with Pack.open(out) as p:
            assert TierMap.from_json(p.header["tiermap"]).to_json()["tensors"] == tm.to_json()["tensors"]


def test_a_planned_pack_shows_its_predictions(tmp_path):
    folder = write_hf_model(tmp_path / "m", config=TINY["llama"], seed=2)
    out = tmp_path / "m.orkpack"
    assert runner.invoke(app, ["build", str(folder), "-o", str(out)]).exit_code == 0
    text = runner.invoke(app, ["inspect", str(out)]).stdout
    d = json.loads(runner.invoke(app, ["inspect", str(out), "--json"]).stdout)
    low = d["tiermap"]["board"].get("host_low", "nf4")  # the level this tiny model's plan chose: int5dq
    assert "predicted" in text and "tok/s" in text and f"CPU only, all {'NF4' if low == 'nf4' else low}" in text
    assert d["tiermap"]["prediction"]["decode_tok_s"] > 0
