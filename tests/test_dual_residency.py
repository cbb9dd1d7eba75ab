"""Dual residency (format 1.2, issue 10 part 2): an NPU slice that also keeps an NF4 host copy for
decode. Packs are built from a synthetic MoE model with a hand-made tier map (`build --tiermap`)
that puts items NPU-only, NPU + host nf4 (int8 tiles and nf4 storage), host nf4 and host int8."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash
from typer.testing import CliRunner

from orkpack import cli
from orkpack.build import BuildOptions, build
from orkpack.errors import OrkError, PackError
from orkpack.inspect import pack_facts
from orkpack.layout import npu_tiled_size
from orkpack.pack import spec
from orkpack.pack.reader import Pack, PackDamaged, host_copy_slice
from orkpack.pack.writer import header_bytes, preamble_bytes
from orkpack.runtime.verify import verify_pack
from orkpack.sources import open_source
from orkpack.sources.base import is_raw
from orkpack.synth import write_hf_model
from orkpack.tiers.tiermap import Decision, TierMap, dumps

# the tier map's side of dual residency (Decision.host_copy / host_copy_bytes) is the lead's change to
# orkpack/tiers/tiermap.py; without it there is no way to ask for a dual slice
pytestmark = pytest.mark.skipif("host_copy" not in Decision.__dataclass_fields__,
                                reason="needs Decision.host_copy in orkpack/tiers/tiermap.py (the lead's tier-map change)")

MODEL = dict(layers=2, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=64, experts=4, experts_used=2, shards=1)

# item -> placement; everything else 2-D is host nf4, 1-D and the router stay float
PLACE = {
    "blk.0.attn_q.weight": "npu",
    "blk.0.attn_k.weight": "dual",
    "blk.0.attn_output.weight": "dual",
    "blk.1.attn_q.weight": "host int8",
    "blk.1.attn_v.weight": "host nf4",
    "output.weight": "host int8",
    "blk.0.ffn_up_exps.weight[0]": "dual",
    "blk.0.ffn_up_exps.weight[1]": "npu",
    "blk.0.ffn_up_exps.weight[2]": "dual",
    "blk.0.ffn_up_exps.weight[3]": "host nf4",
    "blk.0.ffn_down_exps.weight[0]": "dual",  # K = 96: NF4 blocks straddle rows
    "blk.0.ffn_down_exps.weight[1]": "dual",
    "blk.0.ffn_down_exps.weight[2]": "host int8",
}
DUAL = sorted(k for k, v in PLACE.items() if v == "dual")


def _nf4_bytes(n: int, fmt: str = "b64") -> int:
    """docs/FORMAT.md 3: nf4 (b64) and nf4dq (dq32) bytes of n values."""
    if fmt == "b64":
        return (n + 1) // 2 + 4 * -(-n // 64)
    nb = -(-n // 32)
    return (n + 1) // 2 + nb + 4 * -(-nb // 256) + 4


def hand_tiermap(model: Path, place: dict[str, str] = PLACE, fmt: str = "b64") -> TierMap:
    """A tier map placing ``model`` by ``place``, its host nf4 bytes counted at NF4 format ``fmt`` (b64: the
    board block without "nf4_format", as maps were before there were two formats)."""
    src = open_source(model)
    try:
        infos = src.tensors()
    finally:
        src.close()
    decs = []
    for info in infos:
        if is_raw(info.dtype):
            continue
        stacked = len(info.shape) == 3
        for e in (range(info.shape[0]) if stacked else [None]):
            shape = tuple(info.shape[1:] if stacked else info.shape)
            item = info.name if e is None else f"{info.name}[{e}]"
            n = int(np.prod(shape))
            kind = place.get(item, "host nf4" if len(shape) == 2 and "ffn_gate_inp" not in item else "float")
            host_copy, hc_bytes = None, 0
            if kind in ("npu", "dual"):
                enc, tier, min_m, nbytes = "int8", "npu", 16, npu_tiled_size(*shape) + 4 * shape[0]
                if kind == "dual":
                    host_copy, hc_bytes = "nf4", _nf4_bytes(n, fmt)
            elif kind == "host int8":
                enc, tier, min_m, nbytes = "int8", "host", 1 << 30, n + 4 * shape[0]
            elif kind == "host nf4":
                enc, tier, min_m, nbytes = "nf4", "host", 1 << 30, _nf4_bytes(n, fmt)
            else:
                enc, tier, min_m, nbytes = "bf16", "host", 1 << 30, 2 * n
            decs.append(Decision(info.name, e, shape, enc, tier, min_m, nbytes, 10.0 if tier == "npu" else 0.0, None,
                                 host_copy, hc_bytes))
    return TierMap(decs, model={"source": "hand", "arch": "qwen3_moe", "n_layers": MODEL["layers"]},
                   board={"name": "hand-made", "iova_usable_bytes": 1 << 30} | ({} if fmt == "b64" else {"nf4_format": fmt}),
                   options={}, objective={},
                   budget={}, prediction={})


def write_tiermap(path: Path, tm: TierMap) -> Path:
    path.write_text(dumps(tm))
    return path


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    d = tmp_path_factory.mktemp("dual")
    model = write_hf_model(d / "model", seed=3, **MODEL)
    tmf = write_tiermap(d / "map.json", hand_tiermap(model))
    packs = {
        "int8": build(model, d / "dual_int8.orkpack", BuildOptions(threads=1, tiermap=tmf)).path,
        # bitsandbytes' NF4 bytes: each block's absmax is its max |w|, so a row's int8 scale is its absmax / 127
        "int8_bnb": build(model, d / "dual_int8_bnb.orkpack", BuildOptions(threads=1, tiermap=tmf, nf4_mode="bnb")).path,
        "nf4": build(model, d / "dual_nf4.orkpack", BuildOptions(threads=1, tiermap=tmf, npu_storage="nf4")).path,
        # every matrix NF4 on the host: what a host NF4 slice of each weight holds (at the map's format, b64)
        "host": build(model, d / "host_nf4.orkpack", BuildOptions(threads=1, plan=False, nf4=["*"], nf4_format="b64")).path,
    }
    return {"dir": d, "model": model, "tiermap": tmf, **packs}


def _items(pack: Pack) -> dict[str, tuple[dict, dict]]:
    out = {}
    for t, s in pack.slices():
        out[t["name"] if s["expert"] is None else f"{t['name']}[{s['expert']}]"] = (t, s)
    return out


# ---------------------------------------------------------------- the pack

@pytest.mark.parametrize("storage", ["int8", "nf4"])
def test_dual_slices_in_the_pack(w, storage):
    with Pack.open(w[storage]) as pack:
        assert (pack.preamble.version_major, pack.preamble.version_minor) == (1, spec.VERSION_MINOR) and pack.header["version"] == [1, spec.VERSION_MINOR]
        items = _items(pack)
        duals = sorted(k for k, (_, s) in items.items() if "host_copy" in s)
        assert duals == DUAL
        for k, (t, s) in items.items():
            want = PLACE.get(k)
            if want in ("npu", "dual"):
                # --npu-storage nf4 leaves the FFN down projections int8 tiles (issue 25, docs/EVAL.md)
                enc = "int8" if storage == "nf4" and ".ffn_down" in k else storage
                assert s["tier"] == "npu" and s["encoding"] == enc and s["min_m"] == 16
            elif want is not None:
                assert s["tier"] == "host" and s["encoding"] == want.split()[1]
        for k in DUAL:
            t, s = items[k]
            hc = s["host_copy"]
            assert list(s)[-1] == "host_copy" and list(hc) == ["encoding", "layout", "parts", "sqnr_db"]
            assert hc["encoding"] == "nf4" and hc["layout"] == {"kind": "row_major"} and hc["sqnr_db"] > 5
            own_end = max(p["offset"] + p["size"] for p in s["parts"].values())
            for pn, pr in hc["parts"].items():
                assert pr["offset"] % spec.ALIGN == 0 and pr["offset"] >= own_end  # right after the slice's own parts
                assert Pack.part_checksum(pack.part(pr)) == pr["xxh3"]
            parts = pack.host_copy_parts(s)
            assert parts["codes"].dtype == np.uint8 and parts["absmax"].dtype == np.float32
            assert host_copy_slice(s)["tier"] == "host"
            if s["encoding"] == "nf4":  # an NPU slice stored nf4 and its host copy: the same encoding of one source slice
                for pn in ("codes", "absmax"):
                    assert pack.part(hc["parts"][pn]).tobytes() == pack.part(s["parts"][pn]).tobytes()
        # the embedded tier map says which items are dual
        embedded = {(t["name"], sl["expert"]): sl.get("host_copy") for t in pack.header["tiermap"]["tensors"] for sl in t["slices"]}
        assert embedded[("blk.0.attn_k.weight", None)] == "nf4" and embedded[("blk.0.attn_q.weight", None)] is None
        assert pack.header["provenance"]["options"]["tiermap"] == "map.json"


def test_host_copy_bytes_equal_a_host_nf4_build(w):
    with Pack.open(w["int8"]) as dual, Pack.open(w["host"]) as host:
        d, h = _items(dual), _items(host)
        for k in DUAL:
            s, hs = d[k][1], h[k][1]
            assert hs["tier"] == "host" and hs["encoding"] == "nf4"
            for pn in ("codes", "absmax"):
                assert dual.part(s["host_copy"]["parts"][pn]).tobytes() == host.part(hs["parts"][pn]).tobytes()
                assert s["host_copy"]["parts"][pn]["xxh3"] == hs["parts"][pn]["xxh3"]
            assert s["host_copy"]["sqnr_db"] == hs["sqnr_db"]


def test_same_bytes_twice_whatever_the_threads(w, tmp_path):
    again = build(w["model"], tmp_path / "again.orkpack", BuildOptions(threads=2, tiermap=w["tiermap"])).path
    assert again.read_bytes() == w["int8"].read_bytes()


# ---------------------------------------------------------------- verify, inspect

@pytest.mark.parametrize("storage", ["int8", "nf4"])
def test_verify_passes_and_counts_dual_slices(w, storage):
    r = verify_pack(w[storage], reference=True)
    assert r.exit_code == 0, r.failures
    st = r.stats
    assert st["dual_slices"] == len(DUAL)
    with Pack.open(w[storage]) as pack:
        hc_bytes = sum(pr["size"] for _, s in pack.slices() if "host_copy" in s for pr in s["host_copy"]["parts"].values())
        n_parts = sum(len(s["parts"]) + len(s.get("host_copy", {}).get("parts", {})) for _, s in pack.slices())
    assert st["host_copy_bytes"] == hc_bytes > 0
    assert r.checks["parts"]["passed"] == n_parts  # the host copies' parts are checked like any part
    # --reference checks each host copy once more (decode, then against its NPU copy)
    n_quant = sum(1 for t, s in Pack.open(w[storage]).slices() if s["encoding"] in ("int8", "nf4"))
    assert r.checks["reference"]["passed"] == n_quant + len(DUAL)
    out = CliRunner().invoke(cli.app, ["verify", str(w[storage]), "--device", "host", "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["packs"][0]["stats"]["dual_slices"] == len(DUAL)
    out = CliRunner().invoke(cli.app, ["verify", str(w[storage]), "--device", "host"])
    assert out.exit_code == 0 and "dual" in out.output


def test_inspect_shows_dual_slices(w):
    f = pack_facts(w["int8"])
    assert f["untrusted"] is None and f["provenance"]["source_format"] == "safetensors" and f["arch"] == "qwen3_moe"
    assert f["tiermap"]["board"]["name"] == "hand-made" and f["format_version"] == f"1.{spec.VERSION_MINOR}"
    rows = {r["name"]: r for r in f["tensors"]}
    assert rows["blk.0.attn_k.weight"]["tier"] == "npu+host nf4"
    assert rows["blk.0.attn_q.weight"]["tier"] == "npu"
    assert rows["blk.0.ffn_up_exps.weight"]["tier"] == "mixed"
    sl = rows["blk.0.attn_k.weight"]["slices"][0]
    hc = sl["host_copy"]
    assert sl["tier"] == "npu" and sl["placement"] == "npu+host nf4"
    assert hc["encoding"] == "nf4" and hc["layout"] == "row_major" and set(hc["xxh3"]) == {"codes", "absmax"}
    assert hc["stored_bytes"] == _nf4_bytes(32 * 64)
    assert rows["blk.0.attn_q.weight"]["slices"][0]["host_copy"] is None
    assert rows["blk.0.attn_k.weight"]["stored_bytes"] == sl["stored_bytes"] + hc["stored_bytes"]
    # residency: the NPU copies on the NPU, the host copies on the host
    res = f["residency"]
    with Pack.open(w["int8"]) as pack:
        npu_res = sum(s["parts"]["q"]["size"] + s["parts"]["scale"]["size"] for _, s in pack.slices() if s["tier"] == "npu")
        host_res = sum(sum(p["size"] for p in s["parts"].values()) for _, s in pack.slices() if s["tier"] == "host")
        hc_res = sum(sum(p["size"] for p in s["host_copy"]["parts"].values()) for _, s in pack.slices() if "host_copy" in s)
    assert res["npu"]["resident_bytes"] == npu_res and res["npu"]["host_copies"] == 0
    assert res["host"]["resident_bytes"] == host_res + hc_res and res["host"]["host_copies"] == len(DUAL)
    assert f["encodings"]["nf4"]["host_copies"] == len(DUAL)
    assert sum(e["stored_bytes"] for e in f["encodings"].values()) == sum(r["stored_bytes"] for r in f["tensors"])
    json.dumps(f)
    out = CliRunner().invoke(cli.app, ["inspect", str(w["int8"]), "--all"])
    assert out.exit_code == 0 and "npu+host nf4" in out.output and f"+ {len(DUAL)} host copies" in out.output
    out = CliRunner().invoke(cli.app, ["inspect", str(w["int8"]), "--json"])
    doc = json.loads(out.output)
    assert {r["name"]: r for r in doc["tensors"]}["blk.0.attn_output.weight"]["slices"][0]["host_copy"]["encoding"] == "nf4"


def test_build_summary_counts_host_copies(w, tmp_path):
    r = CliRunner().invoke(cli.app, ["build", str(w["model"]), "-o", str(tmp_path / "c.orkpack"), "--tiermap",
                                     str(w["tiermap"]), "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    row = [k for k in doc["by_kind"] if k["tier"] == "host copy"]
    assert row == [{"encoding": "nf4", "tier": "host copy", "slices": len(DUAL), "bytes": row[0]["bytes"]}] and row[0]["bytes"] > 0
    assert (tmp_path / "c.orkpack").read_bytes() == w["int8"].read_bytes()


# ---------------------------------------------------------------- damage

def _first_dual(pack: Pack, name="blk.0.attn_k.weight") -> dict:
    return _items(pack)[name][1]


def test_every_bit_flip_in_a_host_copy_is_caught(w, tmp_path):
    p = tmp_path / "flip.orkpack"
    p.write_bytes(w["int8"].read_bytes())
    with Pack.open(p) as pack:
        spans = [(pr["offset"], pr["size"]) for pr in _first_dual(pack)["host_copy"]["parts"].values()]
    missed = []
    fd = os.open(p, os.O_RDWR)
    try:
        for off, size in spans:
            for pos in range(off, off + size):
                orig = os.pread(fd, 1, pos)[0]
                for bit in range(8):
                    os.pwrite(fd, bytes([orig ^ (1 << bit)]), pos)
                    r = verify_pack(p)
                    if r.exit_code != 1 or "host copy" not in r.failures[0]:
                        missed.append((pos, bit, r.exit_code, r.failures[:1]))
                os.pwrite(fd, bytes([orig]), pos)
    finally:
        os.close(fd)
    assert missed == []
    assert verify_pack(p).exit_code == 0
    # with --keep-going the part check names the host copy's part as well
    raw = bytearray(p.read_bytes())
    raw[spans[0][0] + 5] ^= 0x10
    p.write_bytes(raw)
    r = verify_pack(p, keep_going=True)
    assert r.exit_code == 1 and any("part host copy codes checksum mismatch" in f for f in r.failures)


def test_truncated_inside_a_host_copy_is_unusable(w, tmp_path):
    with Pack.open(w["int8"]) as pack:
        off = _first_dual(pack)["host_copy"]["parts"]["codes"]["offset"]
    p = tmp_path / "cut.orkpack"
    p.write_bytes(w["int8"].read_bytes()[: off + 10])
    r = verify_pack(p)
    assert r.exit_code == 2 and "truncated" in r.error
    assert CliRunner().invoke(cli.app, ["verify", str(p), "--device", "host"]).exit_code == 2


def _forge(src: Path, dst: Path, mutate_header=None, mutate_data=None) -> Path:
    """Rewrite a pack's header (and data), every checksum recomputed: a forged pack whose checksums hold."""
    raw = bytearray(src.read_bytes())
    pre = struct.unpack_from(spec.PREAMBLE_FMT, raw)
    data_size, hoff = pre[6], pre[7]
    h = json.loads(bytes(raw[hoff:]))
    data = bytearray(raw[spec.PREAMBLE_BLOCK:hoff])
    if mutate_data:
        mutate_data(h, data)
    if mutate_header:
        mutate_header(h)
    hb = header_bytes(h)
    block = preamble_bytes(file_size=hoff + len(hb), data_size=data_size, header_size=len(hb),
                           data_xxh3=xxhash.xxh3_64_intdigest(bytes(data)), header_xxh3=xxhash.xxh3_64_intdigest(hb))
    dst.write_bytes(block + bytes(data) + hb)
    return dst


def _sl(h, name, expert=None):
    t = next(t for t in h["tensors"] if t["name"] == name)
    return t["slices"][0 if expert is None else expert]


def _hc_of(h):
    return _sl(h, "blk.0.attn_k.weight")["host_copy"]


FORGED = [
    # a host copy on a host-tier slice
    (lambda h: _sl(h, "blk.1.attn_v.weight").update(host_copy=json.loads(json.dumps(_hc_of(h)))), "only NPU slices"),
    (lambda h: _sl(h, "blk.1.attn_v.weight").update(host_copy={"encoding": "nf4"}), "only NPU slices"),
    # a host-copy part overlapping another part (the slice's own, another slice's, another host copy's)
    (lambda h: _hc_of(h)["parts"]["codes"].update(offset=_sl(h, "blk.0.attn_k.weight")["parts"]["q"]["offset"]), "overlap"),
    (lambda h: _hc_of(h)["parts"]["absmax"].update(offset=_sl(h, "token_embd.weight")["parts"]["codes"]["offset"]), "overlap"),
    (lambda h: _hc_of(h)["parts"]["codes"].update(
        offset=_sl(h, "blk.0.attn_output.weight")["host_copy"]["parts"]["codes"]["offset"]), "overlap"),
    # wrong sizes
    (lambda h: _hc_of(h)["parts"]["codes"].update(size=_hc_of(h)["parts"]["codes"]["size"] + 1), "host copy part codes is"),
    (lambda h: _hc_of(h)["parts"]["absmax"].update(size=4), "host copy part absmax is 4 bytes"),
    # unknown or malformed host copies
    (lambda h: _hc_of(h).update(encoding="q4_0"), "unknown host copy encoding 'q4_0'"),
    (lambda h: _hc_of(h).update(encoding=None), "unknown host copy encoding"),
    (lambda h: _sl(h, "blk.0.attn_k.weight").update(host_copy=None), "host_copy is not an object"),
    (lambda h: _sl(h, "blk.0.attn_k.weight").update(host_copy=[1]), "host_copy is not an object"),
    (lambda h: _hc_of(h).update(layout={"kind": "npu_int8"}), "row_major"),
    (lambda h: _hc_of(h).update(sqnr_db="high"), "sqnr_db"),
    (lambda h: _hc_of(h)["parts"].pop("absmax"), "host copy parts"),
    (lambda h: _hc_of(h).update(parts={"q": _hc_of(h)["parts"]["codes"], "scale": _hc_of(h)["parts"]["absmax"]}), "host copy parts"),
    (lambda h: _hc_of(h)["parts"]["codes"].update(offset=10**12), "outside the data section"),
    (lambda h: _hc_of(h)["parts"]["codes"].update(offset=_hc_of(h)["parts"]["codes"]["offset"] + 8), "unaligned"),
    (lambda h: _hc_of(h)["parts"]["codes"].update(xxh3="nope"), "no checksum"),
    (lambda h: _hc_of(h)["parts"]["codes"].update(offset="4096"), "malformed host copy part"),
]


@pytest.mark.parametrize("mutate,why", FORGED)
def test_forged_host_copy_is_damage(w, tmp_path, mutate, why):
    p = _forge(w["int8"], tmp_path / "forged.orkpack", mutate)
    with pytest.raises(PackDamaged, match=why):
        Pack.open(p)
    r = verify_pack(p)
    assert r.exit_code == 1 and why.split("'")[0].split()[0] in r.failures[0]
    assert CliRunner().invoke(cli.app, ["verify", str(p), "--device", "host"]).exit_code == 1
    f = pack_facts(p)  # inspect shows it untrusted, without the header it cannot trust
    assert f["exit_code"] == 1 and f["untrusted"] and f["tensors"] == []
    assert CliRunner().invoke(cli.app, ["inspect", str(p)]).exit_code == 1


def test_unknown_host_copy_encoding_from_a_newer_minor(w, tmp_path):
    """docs/FORMAT.md 7: an encoding a reader does not know is "newer orkpack" (exit 2) in a pack of a
    larger minor version, damage (exit 1) otherwise; host copy encodings follow the same rule."""
    p = _forge(w["int8"], tmp_path / "newer.orkpack", lambda h: _hc_of(h).update(encoding="q4_0"))
    raw = bytearray(p.read_bytes())
    struct.pack_into("<H", raw, 10, spec.VERSION_MINOR_MAX + 1)
    raw[120:128] = bytes(8)
    struct.pack_into("<Q", raw, 120, xxhash.xxh3_64_intdigest(bytes(raw[:4096])))
    p.write_bytes(raw)
    with pytest.raises(PackError) as e:
        Pack.open(p)
    assert not isinstance(e.value, PackDamaged) and e.value.exit_code == 2
    assert f"newer orkpack (format 1.{spec.VERSION_MINOR_MAX + 1}" in str(e.value) and "unknown host copy encoding 'q4_0'" in str(e.value)


def test_a_reader_that_ignores_host_copy_still_has_a_correct_pack(w, tmp_path):
    """What a 1.0 or 1.1 reader sees (they ignore slice keys they do not know, and check only the parts
    they know; the data checksum covers the copies' bytes too): the same pack without the copies."""
    def drop(h):
        for t in h["tensors"]:
            for s in t["slices"]:
                s.pop("host_copy", None)

    for storage in ("int8", "nf4"):
        p = _forge(w[storage], tmp_path / f"old_{storage}.orkpack", drop)
        assert p.stat().st_size < w[storage].stat().st_size  # the data section is unchanged, the header shorter
        r = verify_pack(p, reference=True)
        assert r.exit_code == 0 and r.stats["dual_slices"] == 0, r.failures
        with Pack.open(p) as old, Pack.open(w[storage]) as new:
            for (t, s), (t2, s2) in zip(old.slices(), new.slices()):
                assert s == {k: v for k, v in s2.items() if k != "host_copy"}


def _swap_host_copies(a, b):
    def mutate(h):
        sa, sb = _sl(h, *a), _sl(h, *b)
        sa["host_copy"], sb["host_copy"] = sb["host_copy"], sa["host_copy"]
    return mutate


@pytest.mark.parametrize("storage,a,b,why", [
    ("int8_bnb", ("blk.0.ffn_up_exps.weight", 0), ("blk.0.ffn_up_exps.weight", 2), "absmax / 127"),  # K = 64: exact scales
    ("int8", ("blk.0.ffn_up_exps.weight", 0), ("blk.0.ffn_up_exps.weight", 2), "cannot come from one source value"),
    ("int8", ("blk.0.ffn_down_exps.weight", 0), ("blk.0.ffn_down_exps.weight", 1), "cannot come from one source value"),
    ("nf4", ("blk.0.ffn_up_exps.weight", 0), ("blk.0.ffn_up_exps.weight", 2), "differs from the NPU copy"),
])
def test_reference_catches_a_host_copy_of_another_slice(w, tmp_path, storage, a, b, why):
    """A structurally sound, checksummed pack whose host copies were swapped between two experts:
    only --reference can tell, by checking each copy against its NPU copy."""
    p = _forge(w[storage], tmp_path / "swapped.orkpack", _swap_host_copies(a, b))
    assert verify_pack(p).exit_code == 0
    r = verify_pack(p, reference=True, keep_going=True)
    assert r.exit_code == 1 and r.checks["reference"]["failed"] == 2
    assert all("host copy:" in f and why in f for f in r.failures), r.failures


@pytest.mark.parametrize("name,expert", [("blk.0.attn_k.weight", None), ("blk.0.ffn_down_exps.weight", 1)])
def test_reference_catches_one_changed_code(w, tmp_path, name, expert):
    """One nibble of a host copy changed, its part checksum recomputed: --reference names the element."""
    def mutate(h, data):
        pr = _sl(h, name, expert)["host_copy"]["parts"]["codes"]
        at = pr["offset"] - spec.PREAMBLE_BLOCK + 37
        data[at] ^= 0x80  # element 74's code moves by 8 (about half the codebook)
        pr["xxh3"] = xxhash.xxh3_64_hexdigest(bytes(data[pr["offset"] - spec.PREAMBLE_BLOCK:][:pr["size"]]))

    p = _forge(w["int8"], tmp_path / "nibble.orkpack", mutate_data=mutate)
    assert verify_pack(p).exit_code == 0
    r = verify_pack(p, reference=True)
    k = 96 if expert is not None else 64
    assert r.exit_code == 1 and f"element [{74 // k}, {74 % k}]" in r.failures[0], r.failures


# ---------------------------------------------------------------- build --tiermap

def test_tiermap_missing_a_tensor_is_one_clear_line(w, tmp_path):
    tm = hand_tiermap(w["model"])
    short = TierMap([d for d in tm.decisions if d.tensor != "blk.1.ffn_norm.weight"], model=tm.model, board=tm.board,
                    options={}, objective={}, budget={}, prediction={})
    f = write_tiermap(tmp_path / "short.json", short)
    with pytest.raises(OrkError, match=r"does not cover 1 item of the source \(blk\.1\.ffn_norm\.weight\)"):
        build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=f))
    r = CliRunner().invoke(cli.app, ["build", str(w["model"]), "-o", str(tmp_path / "x.orkpack"), "--tiermap", str(f)])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "blk.1.ffn_norm.weight" in lines[0] and "orkpack plan" in lines[0]
    assert not (tmp_path / "x.orkpack").exists()


@pytest.mark.parametrize("edit,why", [
    (lambda d: d["tensors"][0]["slices"][0].update(shape=[3, 3]), "does not fit this source"),
    (lambda d: d.update(schema="nope"), "not an orkpack tier map"),
    (lambda d: d["tensors"][0]["slices"][0].update(min_m=1), "min_m"),
    (lambda d: d["tensors"][0]["slices"][0].update(benefit_us="nan"), "finite"),
    (lambda d: next(s for t in d["tensors"] for s in t["slices"] if s["tier"] == "host").update(host_copy="nf4"),
     "only an NPU slice may have one"),
])
def test_bad_tiermap_is_refused(w, tmp_path, edit, why):
    d = hand_tiermap(w["model"]).to_json()
    edit(d)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(d))
    with pytest.raises(OrkError, match=why):
        build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=f))


def test_tiermap_file_problems(w, tmp_path):
    f = tmp_path / "t.json"
    for text, why in (("{", "not valid JSON"), ('{"a": NaN}', "not valid JSON"), ("[" * 100000, "nests too deep|not valid JSON")):
        f.write_text(text)
        with pytest.raises(OrkError, match=why):
            build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=f))
    with pytest.raises(OrkError, match="no such file"):
        build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=tmp_path / "none.json"))
    with pytest.raises(OrkError, match="contradict"):
        build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=w["tiermap"], plan=False))
    with pytest.raises(OrkError, match="pins"):
        build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=w["tiermap"], npu=["*"]))


def test_tiermap_with_extra_items_warns(w, tmp_path):
    tm = hand_tiermap(w["model"])
    extra = Decision("blk.9.attn_q.weight", None, (64, 64), "nf4", "host", 1 << 30, 2560, 0.0, None)
    f = write_tiermap(tmp_path / "extra.json", TierMap(tm.decisions + [extra], model=tm.model, board=tm.board, options={},
                                                        objective={}, budget={}, prediction={}))
    r = build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=f))
    assert any("blk.9.attn_q.weight" in x and "ignored" in x for x in r.warnings)
    assert verify_pack(r.path).exit_code == 0


def test_rules_never_make_dual_slices(w):
    with Pack.open(w["host"]) as pack:
        assert not any("host_copy" in s for _, s in pack.slices())
        assert pack.header["tiermap"] is None


# ---------------------------------------------------------------- hostile headers (property)

def test_host_copy_records_with_random_values_never_crash(w):
    """A dual pack's header with values of its host-copy records (and the slices holding them) swapped
    for random JSON, checksums correct: open, inspect, render and verify --reference raise nothing but
    OrkError (the fuzz harness's property, fuzz/harness.py)."""
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
    import harness

    raw = w["int8"].read_bytes()
    hoff = struct.unpack_from("<Q", raw, 40)[0]
    base = json.loads(raw[hoff:])
    paths = []
    for i, t in enumerate(base["tensors"]):
        for j, s in enumerate(t["slices"]):
            if "host_copy" in s:
                paths += [("tensors", i, "slices", j, k) for k in s]
                paths += [("tensors", i, "slices", j, "host_copy", k) for k in s["host_copy"]]
                paths += [("tensors", i, "slices", j, "host_copy", "parts", p, k)
                          for p in s["host_copy"]["parts"] for k in ("offset", "size", "xxh3")]
    host = next(i for i, t in enumerate(base["tensors"]) if t["slices"][0]["tier"] == "host" and len(t["shape"]) == 2)
    paths.append(("tensors", host, "slices", 0, "host_copy"))
    values = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from(
        [0, 4096, hoff, hoff - 4096, "nf4", "int8", "row_major", {"kind": "row_major"}, [], {}]) | st.text(max_size=8) | \
        st.sampled_from([json.loads(json.dumps(s["host_copy"])) for t in base["tensors"] for s in t["slices"] if "host_copy" in s])

    def put(h, path, v):
        o = h
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = v

    @hyp.settings(max_examples=150, deadline=None, derandomize=True,
                  suppress_health_check=[hyp.HealthCheck.too_slow, hyp.HealthCheck.data_too_large])
    @hyp.given(edits=st.lists(st.tuples(st.sampled_from(paths), values), min_size=1, max_size=3))
    def run(edits):
        h = json.loads(json.dumps(base))
        for path, v in edits:
            try:
                put(h, path, v)
            except (KeyError, IndexError, TypeError):
                pass
        harness.check_pack(harness.wrap_pack(json.dumps(h).encode("ascii"), (hoff - 4096) // 4096, raw[4096:hoff]))

    run()


# ---------------------------------------------------------------- the map's NF4 format

def _stored(parts: dict) -> int:
    return sum(p["size"] for p in parts.values())


def test_a_dq32_map_builds_nf4dq_of_the_bytes_it_counts(w, tmp_path):
    """A map planned at dq32: its host nf4 slices and host copies are written nf4dq, each taking exactly the
    bytes the map counts (host nf4: ``bytes``; a copy: ``host_copy_bytes``); the copies are byte-identical to
    a dq32 host build's slices; verify --reference proves them. With --npu-storage nf4 an NPU slice is nf4 (b64)
    and its own copy, the host slices still nf4dq."""
    tm = hand_tiermap(w["model"], fmt="dq32")
    f = write_tiermap(tmp_path / "dq32.json", tm)
    dual = build(w["model"], tmp_path / "dq32.orkpack", BuildOptions(threads=1, tiermap=f)).path
    host = build(w["model"], tmp_path / "host.orkpack", BuildOptions(threads=1, plan=False, nf4=["*"])).path
    with Pack.open(dual) as pack, Pack.open(host) as hp:
        items, h = _items(pack), _items(hp)
        assert pack.header["tiermap"]["board"]["nf4_format"] == "dq32"
        seen = 0
        for d in tm.decisions:
            t, s = items[d.name]
            if d.tier == "host" and d.encoding == "nf4":
                assert s["encoding"] == spec.ENC_NF4DQ and _stored(s["parts"]) == d.bytes, d.name
                seen += 1
            if d.host_copy is not None:
                hc = s["host_copy"]
                assert hc["encoding"] == spec.ENC_NF4DQ and _stored(hc["parts"]) == d.host_copy_bytes, d.name
                hs = h[d.name][1]
                assert hs["encoding"] == spec.ENC_NF4DQ and set(hc["parts"]) == set(hs["parts"])
                for pn in hc["parts"]:
                    assert pack.part(hc["parts"][pn]).tobytes() == hp.part(hs["parts"][pn]).tobytes(), (d.name, pn)
                seen += 1
        assert seen > len(DUAL)
    r = verify_pack(dual, reference=True)
    assert r.exit_code == 0 and r.stats["dual_slices"] == len(DUAL), r.failures
    stored4 = build(w["model"], tmp_path / "dq32_nf4.orkpack", BuildOptions(threads=1, tiermap=f, npu_storage="nf4")).path
    with Pack.open(stored4) as pack:
        items = _items(pack)
        down = [k for k in DUAL if ".ffn_down" in k]  # the FFN down projections stay int8 tiles (issue 25)
        assert down and all(items[k][1]["encoding"] == spec.ENC_INT8 and items[k][1]["host_copy"]["encoding"] ==
                            spec.ENC_NF4DQ for k in down)
        assert all(items[k][1]["encoding"] == items[k][1]["host_copy"]["encoding"] == spec.ENC_NF4
                   for k in DUAL if k not in down)
        assert items["blk.1.attn_v.weight"][1]["encoding"] == spec.ENC_NF4DQ


@pytest.mark.parametrize("fmt,opts,why", [
    ("dq32", dict(nf4_format="b64"), "planned for NF4 format dq32 .* given --nf4-format b64: drop --nf4-format"),
    ("dq32", dict(nf4_mode="bnb"), "planned for NF4 format dq32 .* --nf4-mode bnb writes b64 only"),
    ("b64", dict(nf4_format="dq32"), "planned for NF4 format b64 .* given --nf4-format dq32"),
])
def test_a_build_format_that_contradicts_the_map_is_refused(w, tmp_path, fmt, opts, why):
    f = write_tiermap(tmp_path / "m.json", hand_tiermap(w["model"], fmt=fmt))
    with pytest.raises(OrkError, match=why):
        build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=f, **opts))
    args = ["build", str(w["model"]), "-o", str(tmp_path / "x.orkpack"), "--tiermap", str(f)]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
    r = CliRunner().invoke(cli.app, args)
    assert r.exit_code == 2 and len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1, r.output
    assert not (tmp_path / "x.orkpack").exists()


def test_a_map_of_an_unknown_nf4_format_is_refused(w, tmp_path):
    d = hand_tiermap(w["model"]).to_json()
    d["board"]["nf4_format"] = "b128"
    f = tmp_path / "m.json"
    f.write_text(json.dumps(d))
    with pytest.raises(OrkError, match="nf4_format 'b128' is not dq32 or b64; plan again"):
        build(w["model"], tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=f))
    # the same format given explicitly is no contradiction
    ok = build(w["model"], tmp_path / "y.orkpack", BuildOptions(threads=1, tiermap=w["tiermap"], nf4_format="b64")).path
    assert ok.read_bytes() == w["int8"].read_bytes()
