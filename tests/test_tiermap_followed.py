"""build --tiermap records the prediction of the placement it follows (issue 15): an edited map's stale
prediction never reaches the pack."""
from __future__ import annotations

import json

from orkpack import synth
from orkpack.build import BuildOptions, build
from orkpack.pack.reader import Pack
from orkpack.tiers.command import plan
from orkpack.tiers.tiermap import dumps


def _map(tmp_path, **kw):
    model = synth.write_hf_model(tmp_path / "m")
    tm, _, _ = plan(model, **kw)
    p = tmp_path / "map.json"
    p.write_text(dumps(tm))
    return model, p, json.loads(p.read_text())


def test_unedited_map_keeps_its_prediction(tmp_path):
    model, p, d = _map(tmp_path)
    r = build(model, tmp_path / "a.orkpack", BuildOptions(threads=1, tiermap=p))
    assert not any("predicted" in w for w in r.warnings)
    with Pack.open(r.path) as pack:
        assert pack.header["tiermap"]["prediction"] == d["prediction"]


def test_unedited_map_with_nf4_stored_npu_slices_keeps_its_prediction(tmp_path):
    """NPU slices of encoding nf4 (--nf4 pins) are stored 4-bit, each its own host copy in nf4 (b64): the
    followed map's prediction counts them so (the copy's bytes at decode, their sensitivity in the KLD), as the
    plan did."""
    model, p, d = _map(tmp_path, pins={"nf4": ["blk.*"]}, host_low="nf4")  # NPU slices stored NF4: the nf4 level
    npu = [s for t in d["tensors"] for s in t["slices"] if s["tier"] == "npu"]
    assert any(s.get("host_copy") for s in npu) and all(s["encoding"] == "nf4" for s in npu)
    r = build(model, tmp_path / "a.orkpack", BuildOptions(threads=1, tiermap=p))
    assert not any("predicted" in w for w in r.warnings), r.warnings
    with Pack.open(r.path) as pack:
        assert pack.header["tiermap"]["prediction"] == d["prediction"]


def test_edited_map_records_what_it_makes(tmp_path):
    model, p, d = _map(tmp_path)
    moved = 0
    for t in d["tensors"]:
        for s in t["slices"]:
            if s["tier"] == "npu" or s["encoding"] == "int8":  # every item host NF4
                moved += s["tier"] == "npu"
                s.update(tier="host", encoding="nf4", host_copy=None)
    assert moved
    p.write_text(json.dumps(d))
    r = build(model, tmp_path / "e.orkpack", BuildOptions(threads=1, tiermap=p))
    assert any("for other choices than it makes" in w for w in r.warnings)
    with Pack.open(r.path) as pack:
        pred = pack.header["tiermap"]["prediction"]
    base = d["prediction"]["baselines"]["cpu_nf4"]  # nothing on the NPU and every item NF4: the NF4 baseline
    for k in ("prefill_tok_s", "decode_tok_s", "ttft_s", "prefill_s_per_chunk", "decode_s_per_token"):
        assert pred[k] == base[k], k
    assert pred["prefill_tok_s"] < d["prediction"]["prefill_tok_s"]


def test_missing_profile_is_said(tmp_path):
    model, p, d = _map(tmp_path)
    d["options"]["profile"] = "hot.json"
    p.write_text(json.dumps(d))
    r = build(model, tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=p))
    assert any("hot.json, which is not beside it" in w for w in r.warnings)
