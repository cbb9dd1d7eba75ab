"""NPU slices' host copies in the host low level's format (format 1.8; issue 25: the default pack's decode path).

* with --host-low int5dq / int6dq the plan prices an NPU item's host copy in that format (bytes by the codec's
  formula, predicted KLD its sensitivity times cost.FORMAT_ERROR), and the build writes the copy so: an int5dq /
  int6dq ``host_copy`` record, bit for bit the host slice of that weight in that encoding;
* the balanced goal keeps decode within 5 % of the best the board allows with host NF4 (its fastest format),
  whatever the levels: the decode stage is the NF4 plan's, and levels too slow for that decode as fast as they can;
* verify --reference checks such a copy against the NPU's int8 tiles (one changed code is named by element);
  the C reader (orkpack-check) decodes it as the Python reader does; a default build still writes NF4 copies.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

from orkpack import synth
from orkpack.codecs import get_codec
from orkpack.pack import spec
from orkpack.pack.reader import Pack, expected_part_sizes, host_copy_slice
from orkpack.pack.writer import header_bytes, preamble_bytes
from orkpack.runtime.verify import verify_pack
from orkpack.tiers import cost
from orkpack.tiers.board import load_board, with_host_formats
from orkpack.tiers.manifest import manifest_from_config
from orkpack.tiers.profile import load_profile
from orkpack.tiers.solver import DECODE_SLACK, solve

ROOT = Path(__file__).resolve().parents[1]
QWEN7B = ROOT / "tiermaps" / "configs" / "qwen2.5-7b" / "config.json"


def _run(*args):
    return subprocess.run([sys.executable, "-m", "orkpack", *args], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _plan(config, low=None, high=None):
    man = manifest_from_config(config)
    board = with_host_formats(load_board("rk3588-32g"), low, high, "test")
    return solve(man, board, load_profile(None, man, board)).to_json()


def _decode_stage(p):
    return next(s for s in p["objective"]["stages"] if s["metric"] == "decode")


def _configs():
    return {"qwen2.5-7b": json.loads(QWEN7B.read_text()), "tiny llama": dict(synth.TINY["llama"])}


@pytest.mark.parametrize("low,high", [("int5dq", "int6dq"), ("int6dq", "int8dq")])
def test_copies_are_priced_in_the_low_format(low, high):
    p = _plan(_configs()["qwen2.5-7b"], low, high)
    dual = [s for t in p["tensors"] for s in t["slices"] if s.get("host_copy")]
    assert dual, "the balanced plan of Qwen2.5-7B keeps host copies"
    for s in dual:
        n, k = s["shape"]
        sizes = expected_part_sizes([n, k], low, {"kind": spec.LAYOUT_ROW_MAJOR})
        assert s["host_copy_bytes"] == cost.copy_bytes(n, k, low) == sum(sizes.values())
    assert p["budget"]["ram"]["host_copy_nf4"] == sum(s["host_copy_bytes"] for s in dual)


@pytest.mark.parametrize("model", ["qwen2.5-7b", "tiny llama"])
@pytest.mark.parametrize("low,high", [("int5dq", "int6dq"), ("int6dq", "int8dq")])
def test_balanced_decode_is_within_slack_of_the_nf4_best(model, low, high):
    """The decode stage of an intdq-low plan is the NF4 plan's (the board's fastest); the plan decodes within
    DECODE_SLACK of it, or, where these levels cannot, as fast as they can (every item in the low level)."""
    cfg = _configs()[model]
    ref = _plan(cfg)
    best = _decode_stage(ref)["value"]
    p = _plan(cfg, low, high)
    assert _decode_stage(p)["value"] == pytest.approx(best, rel=1e-9)
    own = 1.0 / p["prediction"]["baselines"]["cpu_nf4"]["decode_tok_s"]  # every item in the low level
    got = 1.0 / p["prediction"]["decode_tok_s"]
    assert got <= max(best / (1 - DECODE_SLACK), own) * (1 + 1e-4)
    assert p["prediction"]["kld"] <= ref["prediction"]["kld"] + 1e-12


def test_the_default_levels_plan_as_before():
    """With host NF4 (the default) nothing changes: the decode stage is the plan's own, copies are NF4."""
    p = _plan(_configs()["qwen2.5-7b"])
    dual = [s for t in p["tensors"] for s in t["slices"] if s.get("host_copy")]
    assert dual and all(s["host_copy_bytes"] == cost.host_nf4_bytes(*s["shape"], "dq32") for s in dual)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """test_dual_residency's hand-placed MoE model (dual slices, K = 96 blocks straddling rows) built from a map
    whose board has the host levels int5dq / int6dq, and the same map with the default levels."""
    from orkpack.build import BuildOptions, build
    from orkpack.tiers.tiermap import Decision, TierMap
    from test_dual_residency import MODEL, hand_tiermap, write_tiermap

    d = tmp_path_factory.mktemp("copies")
    model = synth.write_hf_model(d / "model", seed=3, **MODEL)
    tm = hand_tiermap(model, fmt="dq32")
    decs = [Decision(x.tensor, x.expert, x.shape, x.encoding, x.tier, x.min_m, x.bytes, x.benefit_us, x.pin,
                     x.host_copy, cost.copy_bytes(*x.shape, "int5dq") if x.host_copy else 0) for x in tm.decisions]
    l5 = TierMap(decs, model=tm.model, board=dict(tm.board, host_low="int5dq", host_high="int6dq"), options={},
                 objective={}, budget={}, prediction={})
    out = {"model": model}
    for tag, m in (("l5", l5), ("default", tm)):
        out[tag] = build(model, d / f"{tag}.orkpack",
                         BuildOptions(threads=1, tiermap=write_tiermap(d / f"{tag}.json", m))).path
    return out


def test_build_writes_int5dq_copies_equal_to_host_slices(built):
    with Pack.open(built["l5"]) as pack:
        assert pack.header["version"] == [1, 8]
        duals = [(t, s) for t, s in pack.slices() if s.get("host_copy")]
        assert duals and all(s["host_copy"]["encoding"] == "int5dq" for _, s in duals)
        t, s = duals[0]
        hc = host_copy_slice(s)
        got = get_codec("int5dq").decode(pack.typed_parts(hc), tuple(s["shape"]))
        assert np.all(np.isfinite(got)) and hc["sqnr_db"] > 20
    with Pack.open(built["default"]) as pack:
        assert {s["host_copy"]["encoding"] for _, s in pack.slices() if s.get("host_copy")} <= {"nf4dq"}
    r = verify_pack(built["l5"], reference=True)
    assert r.exit_code == 0, r.failures


def _forge_code(src: Path, dst: Path) -> Path:
    """One int5dq code of the first host copy moved by half its range, every checksum recomputed."""
    raw = bytearray(src.read_bytes())
    pre = struct.unpack_from(spec.PREAMBLE_FMT, raw)
    data_size, hoff = pre[6], pre[7]
    h = json.loads(bytes(raw[hoff:]))
    data = bytearray(raw[spec.PREAMBLE_BLOCK:hoff])
    s = next(s for t in h["tensors"] for s in t["slices"] if s.get("host_copy"))
    pr = s["host_copy"]["parts"]["codes"]
    at = pr["offset"] - spec.PREAMBLE_BLOCK + 40  # bits 320..327: element 64's code (5 bits from bit 320)
    data[at] ^= 0x10  # its top bit: the code moves by 16 steps
    pr["xxh3"] = xxhash.xxh3_64_hexdigest(bytes(data[pr["offset"] - spec.PREAMBLE_BLOCK:][:pr["size"]]))
    hb = header_bytes(h)
    block = preamble_bytes(file_size=hoff + len(hb), data_size=data_size, header_size=len(hb),
                           data_xxh3=xxhash.xxh3_64_intdigest(bytes(data)), header_xxh3=xxhash.xxh3_64_intdigest(hb))
    dst.write_bytes(block + bytes(data) + hb)
    return dst, s["shape"][1]


def test_reference_names_one_changed_intdq_code(built, tmp_path):
    p, k = _forge_code(built["l5"], tmp_path / "code.orkpack")
    assert verify_pack(p).exit_code == 0  # checksums hold: only --reference can tell
    r = verify_pack(p, reference=True)
    assert r.exit_code == 1 and f"element [{64 // k}, {64 % k}]: int5dq code" in r.failures[0], r.failures


def test_c_reader_decodes_intdq_copies_as_python(check, built):
    """orkpack-check's decode of the int5dq copies (--dump) equals the Python codec's, hash for hash."""
    r = subprocess.run([str(check), "--dump", str(built["l5"])], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln.split("\t") for ln in r.stdout.splitlines() if ln.startswith("dec\t") and ln.split("\t")[3] == "host"]
    assert lines and all(ln[4] == "int5dq" for ln in lines)
    with Pack.open(built["l5"]) as pack:
        tensors = pack.tensors
        for ln in lines:
            s = tensors[int(ln[1])]["slices"][int(ln[2])]
            v = get_codec("int5dq").decode(pack.typed_parts(host_copy_slice(s)), tuple(s["shape"]))
            assert ln[6] == xxhash.xxh3_64_hexdigest(np.ascontiguousarray(v, dtype=np.float32))
