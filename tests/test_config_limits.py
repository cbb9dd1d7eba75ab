"""A released config's Infinity where the field means "no limit" (Nemotron-H / Mamba2's ``time_step_limit``
[0.0, Infinity]) is accepted, and the pack's header holds it as the string "Infinity" (JSON has no Infinity);
NaN anywhere, and Infinity under any other key, are refused in one line naming the key."""
from __future__ import annotations

import json

import pytest

from orkpack import archs, synth
from orkpack.errors import SourceError
from orkpack.pack.reader import Pack
from orkpack.tiers.manifest import manifest_from_config


def _cfg(**over) -> dict:
    return {**synth.TINY["lfm2"], **over}


def test_time_step_limit_infinity_is_a_limit():
    cfg = _cfg(time_step_limit=[0.0, float("inf")])
    assert manifest_from_config(cfg).facts["arch"] == "lfm2"
    assert archs.layers_in_config(cfg) == 4
    assert archs.header_config(cfg)["time_step_limit"] == [0.0, "Infinity"]
    assert archs.header_config({"a": [float("-inf")]}) == {"a": ["-Infinity"]}


@pytest.mark.parametrize("over, key", [
    ({"time_step_limit": [0.0, float("nan")]}, "'time_step_limit[1]' = nan"),
    ({"norm_eps": float("inf")}, "'norm_eps' = inf"),
    ({"rope_parameters": {"rope_theta": float("inf")}}, "'rope_parameters.rope_theta' = inf"),
])
def test_other_non_finite_values_are_one_line(over, key):
    with pytest.raises(SourceError) as e:
        manifest_from_config(_cfg(**over))
    msg = str(e.value)
    assert key in msg and "\n" not in msg and msg.endswith("fix the config"), msg


def test_a_build_keeps_the_header_json(tmp_path):
    from orkpack.build import BuildOptions, build

    folder = synth.write_hf_model(tmp_path / "m", config=_cfg(time_step_limit=[0.0, float("inf")]), seed=3)
    text = (folder / "config.json").read_text()
    assert "Infinity" in text  # as the released files have it (Python's json writes and reads it)
    res = build(folder, tmp_path / "m.orkpack", BuildOptions(threads=1, plan=False))
    with Pack.open(res.path) as p:
        assert p.header["config"]["time_step_limit"] == [0.0, "Infinity"]
    raw = (tmp_path / "m.orkpack").read_bytes()
    assert b"Infinity]" not in raw.replace(b'"Infinity"]', b"")  # no bare Infinity token anywhere
    json.loads(json.dumps(p.header, allow_nan=False))
