"""The .orkpack container: writer, reader, and the reader's refusals."""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

from orkpack.errors import PackError
from orkpack.pack import spec
from orkpack.pack.reader import Pack, PackDamaged
from orkpack.pack.writer import PARTIAL_SUFFIX, PackWriter, header_bytes, preamble_bytes

ROOT = Path(__file__).resolve().parents[1]


def _rng(seed=0):
    return np.random.default_rng(seed)


def write_small(path: Path, seed=0) -> dict:
    """A pack with one slice of each encoding, parts filled with seeded bytes."""
    r = _rng(seed)
    tensors = {}
    with PackWriter(path, provenance={"source_format": "test", "sources": [], "arch": None, "options": {}}, config=None, tiermap=None) as w:
        norm = r.standard_normal(67).astype(np.float32)
        w.add_tensor("blk.0.attn_norm.weight", "n", [67], "F32", [dict(expert=None, shape=[67], encoding="f32", tier="host", layout={"kind": "row_major"}, parts={"data": norm}, sqnr_db=None)])
        tensors["blk.0.attn_norm.weight"] = {"data": norm}
        bf = r.integers(0, 2**16, size=(5, 9), dtype=np.uint16)
        w.add_tensor("token_embd.weight", "e", [5, 9], "BF16", [dict(expert=None, shape=[5, 9], encoding="bf16", tier="host", layout={"kind": "row_major"}, parts={"data": bf}, sqnr_db=None)])
        n = 33 * 70
        codes = r.integers(0, 256, size=(n + 1) // 2, dtype=np.uint8)
        absmax = r.random((n + 63) // 64, dtype=np.float32)
        w.add_tensor("blk.0.ffn_up.weight", "u", [33, 70], "BF16", [dict(expert=None, shape=[33, 70], encoding="nf4", tier="host", layout={"kind": "row_major"}, parts={"codes": codes, "absmax": absmax}, sqnr_db=20.5)])
        q = r.integers(-127, 128, size=(3, 40), dtype=np.int8)
        sc = r.random(3, dtype=np.float32)
        slices = []
        for e in range(2):
            slices.append(dict(expert=e, shape=[3, 40], encoding="int8", tier="host", layout={"kind": "row_major"}, parts={"q": q + e, "scale": sc}, sqnr_db=30.0 + e))
        w.add_tensor("blk.0.ffn_down_exps.weight", "d", [2, 3, 40], "F16", slices)
        tensors["blk.0.ffn_up.weight"] = {"codes": codes, "absmax": absmax}
        w.finish()
    return tensors


def test_roundtrip_parts_aligned_and_checksummed(tmp_path):
    p = tmp_path / "a.orkpack"
    want = write_small(p)
    with Pack.open(p) as pack:
        assert pack.preamble.version_major == 1
        assert os.path.getsize(p) == pack.preamble.file_size
        assert pack.check_data_checksum()
        seen = 0
        for t, s in pack.slices():
            for name, pr in s["parts"].items():
                assert pr["offset"] % 4096 == 0
                view = pack.part(pr)
                assert xxhash.xxh3_64_hexdigest(view) == pr["xxh3"]
                if t["name"] in want:
                    assert view.tobytes() == np.ascontiguousarray(want[t["name"]][name]).tobytes()
                    seen += 1
        assert seen == 3
        names = [t["name"] for t in pack.tensors]
        assert names[-1] == "blk.0.ffn_down_exps.weight" and len(pack.tensors[-1]["slices"]) == 2


def test_deterministic_bytes(tmp_path):
    write_small(tmp_path / "a.orkpack", seed=3)
    write_small(tmp_path / "b.orkpack", seed=3)
    assert (tmp_path / "a.orkpack").read_bytes() == (tmp_path / "b.orkpack").read_bytes()


def test_format_page_names_the_version_the_writer_writes():
    """docs/FORMAT.md names the format's version in its title, the preamble table, the header example, the version
    table's last row and what orkpack writes today: each must be the writer's (spec.VERSION_MINOR)."""
    page = (ROOT / "docs" / "FORMAT.md").read_text()
    want = f"{spec.VERSION_MAJOR}.{spec.VERSION_MINOR}"
    title = re.match(r"# The \.orkpack v(\d+) format \((\d+\.\d+)\)", page)
    assert title and title.group(1) == str(spec.VERSION_MAJOR) and title.group(2) == want
    assert re.search(r"\| 10 \| u16 \| version_minor \| (\d+)\.", page).group(1) == str(spec.VERSION_MINOR)
    assert re.search(r'"version": \[(\d+), (\d+)\]', page).groups() == (str(spec.VERSION_MAJOR), str(spec.VERSION_MINOR))
    rows = re.findall(r"^\| (\d+\.\d+) \| ", page, re.M)  # up to 1.8, written only for a flagged pack
    assert rows and rows == [f"1.{i}" for i in range(spec.VERSION_MINOR_MAX + 1)]
    assert spec.VERSION_MINOR_MAX == spec.VERSION_MINOR_ONLINE == spec.VERSION_MINOR + 1
    assert re.search(r"orkpack today writes (\d+\.\d+)", page).group(1) == want


def test_c_header_matches_spec():
    h = (ROOT / "kernels" / "orkpack.h").read_text()
    defs = dict(re.findall(r"#define (ORKPACK_\w+) (.+)", h))
    assert defs["ORKPACK_VERSION_MAJOR"] == str(spec.VERSION_MAJOR)
    assert defs["ORKPACK_VERSION_MINOR"] == str(spec.VERSION_MINOR)
    assert defs["ORKPACK_VERSION_MINOR_MAX"] == str(spec.VERSION_MINOR_MAX)
    assert defs["ORKPACK_FLAG_ONLINE_R4"] == f"{spec.FLAG_ONLINE_R4}u"
    assert defs["ORKPACK_PREAMBLE_SIZE"] == str(spec.PREAMBLE_SIZE)
    assert defs["ORKPACK_PREAMBLE_BLOCK"] == str(spec.PREAMBLE_BLOCK)
    assert defs["ORKPACK_ALIGN"] == str(spec.ALIGN)
    assert defs["ORKPACK_PREAMBLE_XXH3_OFFSET"] == str(spec.PREAMBLE_XXH3_OFFSET)
    assert defs["ORKPACK_NPU_K_SEGMENT"] == str(spec.NPU_K_SEGMENT)
    assert defs["ORKPACK_NF4_BLOCK"] == str(spec.NF4_BLOCK)
    assert defs["ORKPACK_NF4DQ_BLOCK"].split()[0] == str(spec.NF4DQ_BLOCK)
    assert defs["ORKPACK_NF4DQ_GROUP"].split()[0] == str(spec.NF4DQ_GROUP)
    assert defs["ORKPACK_NPU_TILE_N"] == str(spec.NPU_TILE_N) and defs["ORKPACK_NPU_TILE_K"] == str(spec.NPU_TILE_K)
    # the kernels' own copy (kernels/nf4dq_code.h, the C nf4dq encoder and decoders)
    kdefs = dict(re.findall(r"#define (ORK_NF4DQ_\w+) (\w+)", (ROOT / "kernels" / "nf4dq_code.h").read_text()))
    assert kdefs == {"ORK_NF4DQ_BLOCK": "ORKPACK_NF4DQ_BLOCK", "ORK_NF4DQ_GROUP": "ORKPACK_NF4DQ_GROUP"}  # one copy: orkpack.h
    from orkpack._kernels import ffi

    assert ffi.sizeof("orkpack_preamble_t") == spec.PREAMBLE_SIZE
    assert ffi.offsetof("orkpack_preamble_t", "preamble_xxh3") == spec.PREAMBLE_XXH3_OFFSET
    assert ffi.offsetof("orkpack_preamble_t", "data_xxh3") == 56


def test_not_a_pack(tmp_path):
    p = tmp_path / "x.orkpack"
    p.write_bytes(b"GGUF" + bytes(5000))
    with pytest.raises(PackError) as e:
        Pack.open(p)
    assert not isinstance(e.value, PackDamaged) and "not an orkpack" in str(e.value)
    with pytest.raises(PackError, match="no such file"):
        Pack.open(tmp_path / "missing.orkpack")
    with pytest.raises(PackError, match="folder"):
        Pack.open(tmp_path)


@pytest.mark.parametrize("cut", [10, 200, 4096, 5000, -1])
def test_truncated(tmp_path, cut):
    p = tmp_path / "a.orkpack"
    write_small(p)
    data = p.read_bytes()
    p.write_bytes(data[:cut])
    with pytest.raises(PackError) as e:
        Pack.open(p)
    assert e.value.exit_code == 2 and "truncated" in str(e.value)


def test_newer_major_version_refused(tmp_path):
    p = tmp_path / "a.orkpack"
    write_small(p)
    raw = bytearray(p.read_bytes())
    struct.pack_into("<H", raw, 8, 2)
    raw[120:128] = bytes(8)
    struct.pack_into("<Q", raw, 120, xxhash.xxh3_64_intdigest(bytes(raw[:4096])))
    p.write_bytes(raw)
    with pytest.raises(PackError) as e:
        Pack.open(p)
    assert e.value.exit_code == 2 and "newer orkpack" in str(e.value)


def test_flips_in_preamble_and_header_are_damage(tmp_path):
    p = tmp_path / "a.orkpack"
    write_small(p)
    raw = p.read_bytes()
    hoff = struct.unpack_from("<Q", raw, 40)[0]
    positions = list(range(0, 128)) + [200, 4095] + list(range(hoff, len(raw), max(1, (len(raw) - hoff) // 50)))
    for pos in positions:
        for bit in (0, 7):
            bad = bytearray(raw)
            bad[pos] ^= 1 << bit
            p.write_bytes(bad)
            with pytest.raises(PackError) as e:
                Pack.open(p)
            assert e.value.exit_code == 1, (pos, bit, str(e.value))


def _rewrite_header(p: Path, mutate) -> None:
    raw = p.read_bytes()
    pre = struct.unpack_from(spec.PREAMBLE_FMT, raw)
    data_size, hoff = pre[6], pre[7]
    h = json.loads(raw[hoff:])
    mutate(h)
    hb = header_bytes(h)
    data = raw[4096:hoff]
    block = preamble_bytes(file_size=hoff + len(hb), data_size=data_size, header_size=len(hb), data_xxh3=xxhash.xxh3_64_intdigest(data), header_xxh3=xxhash.xxh3_64_intdigest(hb))
    p.write_bytes(block + data + hb)


@pytest.mark.parametrize(
    "mutate,why",
    [
        (lambda h: h["tensors"][2]["slices"][0]["parts"]["codes"].update(offset=h["tensors"][1]["slices"][0]["parts"]["data"]["offset"]), "overlap"),
        (lambda h: h["tensors"][2]["slices"][0]["parts"]["codes"].update(offset=4097), "unaligned"),
        (lambda h: h["tensors"][2]["slices"][0]["parts"]["codes"].update(offset=10**12), "outside"),
        (lambda h: h["tensors"][2]["slices"][0]["parts"]["codes"].update(size=7), "bytes"),
        (lambda h: h["tensors"][2].update(shape=[33, 71]), "shape"),
        (lambda h: h["tensors"][3]["slices"].pop(), "slices"),
        (lambda h: h["tensors"][2]["slices"][0].update(encoding="int3"), "encoding"),
        (lambda h: h["tensors"][2]["slices"][0].update(tier="npu", min_m=1), "min_m"),
        (lambda h: h["tensors"][2]["slices"][0].update(tier="tpu"), "tier"),
    ],
)
def test_inconsistent_header_refused(tmp_path, mutate, why):
    p = tmp_path / "a.orkpack"
    write_small(p)
    _rewrite_header(p, mutate)
    with pytest.raises(PackDamaged, match=why):
        Pack.open(p)


def test_abort_leaves_target_untouched(tmp_path):
    p = tmp_path / "a.orkpack"
    write_small(p)
    before = p.read_bytes()
    with pytest.raises(RuntimeError):
        with PackWriter(p, provenance={}, config=None, tiermap=None) as w:
            w.add_tensor("x", "x", [4], "F32", [dict(expert=None, shape=[4], encoding="f32", tier="host", layout={"kind": "row_major"}, parts={"data": np.zeros(4, np.float32)}, sqnr_db=None)])
            raise RuntimeError("boom")
    assert p.read_bytes() == before
    assert not list(tmp_path.glob("*" + PARTIAL_SUFFIX))


def test_missing_output_folder(tmp_path):
    from orkpack.errors import OrkError

    with pytest.raises(OrkError, match="does not exist"):
        PackWriter(tmp_path / "nope" / "a.orkpack", provenance={}, config=None, tiermap=None)


# ---------------------------------------------------------------- raw slices (format 1.1)

def _raw_slice(arr: np.ndarray, dtype: str, **kw) -> dict:
    return dict(expert=None, shape=list(arr.shape), encoding="raw", dtype=dtype, tier="host", layout={"kind": "row_major"},
                parts={"data": np.ascontiguousarray(arr).reshape(-1).view(np.uint8)}, sqnr_db=None, **kw)


def write_raw(path: Path) -> dict:
    """A pack with raw slices (i64 2-D, bool 3-D, f64 0-D) beside an f32 and a stacked int8 tensor."""
    ids = np.arange(-3, 9, dtype=np.int64).reshape(3, 4)
    mask = (np.arange(12).reshape(2, 2, 3) % 3 == 0)
    pi = np.array(np.pi, np.float64)
    with PackWriter(path, provenance={"source_format": "test", "sources": [], "arch": None, "options": {}, "skipped": []},
                    config=None, tiermap=None) as w:
        w.add_tensor("ids", "embeddings.token_type_ids", [3, 4], "I64", [_raw_slice(ids, "i64")])
        w.add_tensor("mask", "mask", [2, 2, 3], "BOOL", [_raw_slice(mask, "bool")])
        w.add_tensor("pi", "pi", [], "F64", [_raw_slice(pi, "f64")])
        q = np.ones((3, 40), np.int8)
        sc = np.ones(3, np.float32)
        w.add_tensor("blk.0.ffn_down_exps.weight", "d", [2, 3, 40], "F16", [
            dict(expert=e, shape=[3, 40], encoding="int8", tier="host", layout={"kind": "row_major"},
                 parts={"q": q, "scale": sc}, sqnr_db=30.0) for e in range(2)])
        w.finish()
    return {"ids": ids, "mask": mask, "pi": pi}


def test_raw_roundtrip(tmp_path):
    p = tmp_path / "r.orkpack"
    want = write_raw(p)
    with Pack.open(p) as pack:
        assert pack.header["version"] == [1, spec.VERSION_MINOR] and (pack.preamble.version_major, pack.preamble.version_minor) == (1, spec.VERSION_MINOR)
        seen = 0
        for t, s in pack.slices():
            if t["name"] in want:
                assert s["encoding"] == "raw" and s["tier"] == "host" and "min_m" not in s
                got = pack.typed_part(s, "data")
                assert got.dtype == want[t["name"]].dtype and got.tobytes() == want[t["name"]].tobytes()
                assert list(s)[:4] == ["expert", "shape", "encoding", "dtype"]
                seen += 1
        assert seen == 3
    write_raw(tmp_path / "r2.orkpack")
    assert (tmp_path / "r2.orkpack").read_bytes() == p.read_bytes()


def test_writer_names_raw_dtype_only_for_raw(tmp_path):
    with PackWriter(tmp_path / "w.orkpack", provenance={}, config=None, tiermap=None) as w:
        with pytest.raises(ValueError, match="dtype"):
            w.add_tensor("x", "x", [2], "I64", [{**_raw_slice(np.zeros(2, np.int64), "i64"), "dtype": None}])
        with pytest.raises(ValueError, match="dtype"):
            w.add_tensor("x", "x", [2], "I64", [_raw_slice(np.zeros(2, np.int64), "i128")])
        with pytest.raises(ValueError, match="dtype"):
            w.add_tensor("x", "x", [2], "F32", [dict(expert=None, shape=[2], encoding="f32", dtype="i32", tier="host",
                                                   layout={"kind": "row_major"}, parts={"data": np.zeros(2, np.float32)})])
        w.abort()


@pytest.mark.parametrize(
    "mutate,why",
    [
        (lambda h: h["tensors"][0]["slices"][0].update(dtype="i128"), "unknown raw element type"),
        (lambda h: h["tensors"][0]["slices"][0].pop("dtype"), "unknown raw element type"),
        (lambda h: h["tensors"][0]["slices"][0].update(dtype=["i64"]), "unknown raw element type"),
        (lambda h: h["tensors"][0]["slices"][0].update(dtype="i32"), "its shape and encoding say 48"),
        (lambda h: h["tensors"][0]["slices"][0].update(tier="npu", min_m=32), "raw slices live on the host"),
        (lambda h: h["tensors"][0]["slices"][0].update(min_m=4), "no min_m"),
        (lambda h: h["tensors"][0]["slices"][0].update(sqnr_db=40.0), "no min_m, sqnr_db"),
        (lambda h: h["tensors"][1]["slices"].append(dict(h["tensors"][1]["slices"][0], expert=1)), "raw tensor must have one slice"),
        (lambda h: h["tensors"][1]["slices"][0].update(shape=[2, 3], expert=0), "shape or expert"),
        (lambda h: h["tensors"][3]["slices"][1].update(encoding="raw", dtype="i8"), "only slice"),
        (lambda h: h["tensors"][0]["slices"][0].update(layout={"kind": "npu_int8", "tile_n": 32, "tile_k": 32, "n_pad": 32,
                                                               "k_segment": 8192, "segments": [[0, 4, 32]]}), "npu_int8"),
    ],
)
def test_inconsistent_raw_refused(tmp_path, mutate, why):
    p = tmp_path / "r.orkpack"
    write_raw(p)
    _rewrite_header(p, mutate)
    with pytest.raises(PackDamaged, match=why):
        Pack.open(p)


def _set_minor(p: Path, minor: int) -> None:
    raw = bytearray(p.read_bytes())
    struct.pack_into("<H", raw, 10, minor)
    raw[120:128] = bytes(8)
    struct.pack_into("<Q", raw, 120, xxhash.xxh3_64_intdigest(bytes(raw[:4096])))
    p.write_bytes(raw)


def test_unknown_encoding_from_a_newer_minor_is_not_damage(tmp_path):
    p = tmp_path / "r.orkpack"
    write_raw(p)
    _rewrite_header(p, lambda h: h["tensors"][2]["slices"][0].update(encoding="q3_z"))
    with pytest.raises(PackDamaged, match="unknown encoding 'q3_z'"):  # same minor: the header is wrong
        Pack.open(p)
    _set_minor(p, spec.VERSION_MINOR_MAX + 1)  # (1.8, the flagged packs' minor, is not newer: this reader knows it)
    with pytest.raises(PackError) as e:
        Pack.open(p)
    msg = str(e.value)
    assert not isinstance(e.value, PackDamaged) and e.value.exit_code == 2
    assert f"newer orkpack (format 1.{spec.VERSION_MINOR_MAX + 1}" in msg and "unknown encoding 'q3_z'" in msg and "upgrade" in msg


def test_raw_pack_under_a_reader_without_raw(tmp_path, monkeypatch):
    """What docs/FORMAT.md 7 promises: a reader that predates an encoding refuses the pack naming it.

    Simulated: this reader with the 1.0 encodings and minor version (the real 1.0 reader, orkpack 0.1.0,
    says "damaged pack: ...: unknown encoding 'raw'" and exits 1: it had no newer-minor wording)."""
    p = tmp_path / "r.orkpack"
    write_raw(p)
    written = spec.VERSION_MINOR
    monkeypatch.setattr(spec, "ENCODINGS", ("f32", "f16", "bf16", "int8", "nf4"))
    monkeypatch.setattr(spec, "VERSION_MINOR", 0)
    monkeypatch.setattr(spec, "VERSION_MINOR_MAX", 0)
    with pytest.raises(PackError) as e:
        Pack.open(p)
    assert e.value.exit_code == 2 and f"newer orkpack (format 1.{written}" in str(e.value) and "unknown encoding 'raw'" in str(e.value)


# ---------------------------------------------------------------- nf4dq (format 1.5)

def _nf4dq_parts(x: np.ndarray) -> dict:
    from orkpack.codecs import get_codec

    return dict(get_codec("nf4dq").encode(x).parts)


def write_nf4dq(path: Path, seed: int = 0) -> dict:
    """A pack with nf4dq (docs/FORMAT.md 3) where it may be: host slices (2-D with one absmax group, 2-D
    with two groups and block tails, 1-D of odd length, stacked experts), and host copies of an NPU int8
    slice and of an NPU nf4 slice; beside them an NPU nf4 slice with an nf4 host copy. Real encodings
    (the nf4dq codec), so that a decode means something. Returns {tensor name: {part: array}} of the
    nf4dq slices and copies."""
    import xxhash as _x

    from orkpack.codecs.reference import int8_encode, nf4_encode
    from orkpack.layout import npu_layout, tile_int8
    from orkpack.runtime.inflate import inflate_reference

    r = _rng(seed)
    want = {}
    with PackWriter(path, provenance={"source_format": "test", "sources": [], "arch": None, "options": {},
                                      "nf4": {"format": "dq32"}}, config=None, tiermap=None) as w:
        def host(name, shape, expert=None):
            x = r.standard_t(3, size=shape).astype(np.float32)
            p = _nf4dq_parts(x)
            want[name if expert is None else f"{name}[{expert}]"] = p
            return dict(expert=expert, shape=list(shape), encoding="nf4dq", tier="host", layout={"kind": "row_major"},
                        parts=p, sqnr_db=19.5)

        w.add_tensor("blk.0.ffn_up.weight", "up", [33, 70], "F32", [host("blk.0.ffn_up.weight", (33, 70))])
        w.add_tensor("blk.0.ffn_down.weight", "down", [9, 1001], "F32", [host("blk.0.ffn_down.weight", (9, 1001))])
        w.add_tensor("blk.0.attn_norm.bias", "b", [67], "F32", [host("blk.0.attn_norm.bias", (67,))])
        w.add_tensor("blk.0.ffn_gate_exps.weight", "g", [2, 3, 40], "F32",
                     [host("blk.0.ffn_gate_exps.weight", (3, 40), e) for e in range(2)])
        x = r.standard_t(3, size=(40, 96)).astype(np.float32)
        q, s = int8_encode(x)
        hc = _nf4dq_parts(x)
        want["blk.0.attn_q.weight"] = hc
        w.add_tensor("blk.0.attn_q.weight", "q", [40, 96], "F32", [dict(
            expert=None, shape=[40, 96], encoding="int8", tier="npu", layout=npu_layout(40, 96),
            parts={"q": tile_int8(q), "scale": s}, sqnr_db=40.0, min_m=8,
            host_copy={"encoding": "nf4dq", "parts": hc, "sqnr_db": 19.0})])
        for name, hce in (("blk.0.attn_k.weight", "nf4dq"), ("blk.0.attn_v.weight", "nf4")):
            y = r.standard_t(3, size=(33, 64)).astype(np.float32)
            codes, absmax = nf4_encode(y)
            iq, isc, lay = inflate_reference(codes, absmax, (33, 64))
            hp = _nf4dq_parts(y) if hce == "nf4dq" else {"codes": codes, "absmax": absmax}
            if hce == "nf4dq":
                want[name] = hp
            w.add_tensor(name, name, [33, 64], "F32", [dict(
                expert=None, shape=[33, 64], encoding="nf4", tier="npu", layout={"kind": "row_major"},
                parts={"codes": codes, "absmax": absmax}, sqnr_db=20.0, min_m=4,
                inflate={"layout": lay, "q_xxh3": _x.xxh3_64_hexdigest(iq), "q_size": int(iq.size),
                         "scale_xxh3": _x.xxh3_64_hexdigest(isc)},
                host_copy={"encoding": hce, "parts": hp, "sqnr_db": 20.0})])
        w.finish()
    return want


def test_nf4dq_roundtrip(tmp_path):
    """nf4dq slices and host copies are written, opened and read back as the codec made them; the decode of
    what the reader returns is the codec's decode."""
    from orkpack.codecs.reference import nf4dq_decode
    from orkpack.pack.reader import host_copy_slice

    p = tmp_path / "dq.orkpack"
    want = write_nf4dq(p)
    seen = 0
    with Pack.open(p) as pack:
        assert pack.preamble.version_minor == spec.VERSION_MINOR >= 5  # nf4dq is 1.5; a pack is written at the writer's version
        for t, s in pack.slices():
            for rec in (s, host_copy_slice(s)):
                if rec is None or rec["encoding"] != spec.ENC_NF4DQ:
                    continue
                key = t["name"] if rec["expert"] is None else f"{t['name']}[{rec['expert']}]"
                parts = pack.typed_parts(rec)
                assert list(parts) == list(spec.PARTS[spec.ENC_NF4DQ]) and rec["tier"] == spec.TIER_HOST
                for pn, a in parts.items():
                    assert a.dtype == np.dtype(spec.PART_DTYPES[(spec.ENC_NF4DQ, pn)])
                    assert a.tobytes() == np.ascontiguousarray(want[key][pn]).tobytes(), (key, pn)
                n = int(np.prod(rec["shape"]))
                assert parts["absmax_scale"].size == -(-(-(-n // spec.NF4DQ_BLOCK)) // spec.NF4DQ_GROUP)
                got = nf4dq_decode(*(parts[k] for k in spec.PARTS[spec.ENC_NF4DQ]), rec["shape"])
                assert got.shape == tuple(rec["shape"]) and np.all(np.isfinite(got))
                seen += 1
    assert seen == len(want) == 7
    write_nf4dq(tmp_path / "dq2.orkpack")
    assert (tmp_path / "dq2.orkpack").read_bytes() == p.read_bytes()


def test_nf4dq_part_sizes():
    from orkpack.pack.reader import expected_part_sizes

    for shape, want in (([1], (1, 1, 4)), ([32], (16, 1, 4)), ([33], (17, 2, 4)), ([256 * 32], (4096, 256, 4)),
                        ([256 * 32 + 1], (4097, 257, 8)), ([3, 5, 7], (53, 4, 4)), ([0, 5], (0, 0, 0))):
        sz = expected_part_sizes(shape, spec.ENC_NF4DQ, {"kind": "row_major"})
        assert list(sz) == list(spec.PARTS[spec.ENC_NF4DQ])
        assert (sz["codes"], sz["absmax_q"], sz["absmax_scale"], sz["absmax_offset"]) == want + (4,)


def _dq(i, s=0):
    """tensor i, slice s of the write_nf4dq pack: 0 up [33, 70] host nf4dq, 1 down [9, 1001] (two groups),
    2 a 1-D [67], 3 stacked experts, 4 attn_q NPU int8 + nf4dq host copy, 5 attn_k NPU nf4 + nf4dq host
    copy, 6 attn_v NPU nf4 + nf4 host copy."""
    return lambda h: h["tensors"][i]["slices"][s]


def _reorder(d: dict, order) -> dict:
    return {k: d[k] for k in order}


NF4DQ_BAD = [
    # the slice's own parts: sizes, order, count, names
    (lambda h: _dq(0)(h)["parts"]["absmax_q"].update(size=_dq(0)(h)["parts"]["absmax_q"]["size"] + 1), "absmax_q is 74 bytes"),
    (lambda h: _dq(1)(h)["parts"]["absmax_scale"].update(size=4), "absmax_scale is 4 bytes, its shape and encoding say 8"),
    (lambda h: _dq(0)(h)["parts"]["absmax_offset"].update(size=8), "absmax_offset is 8 bytes"),
    (lambda h: _dq(0)(h)["parts"]["codes"].update(size=1156), "codes is 1156 bytes"),
    (lambda h: _dq(0)(h).update(parts=_reorder(_dq(0)(h)["parts"], ["codes", "absmax_scale", "absmax_q", "absmax_offset"])), "parts are not"),
    (lambda h: _dq(0)(h).update(parts=_reorder(_dq(0)(h)["parts"], ["absmax_offset", "codes", "absmax_q", "absmax_scale"])), "parts are not"),
    (lambda h: _dq(0)(h)["parts"].pop("absmax_offset"), "parts are not"),
    (lambda h: _dq(0)(h).update(parts=_reorder(_dq(0)(h)["parts"], ["codes", "absmax_q"])), "parts are not"),
    (lambda h: _dq(0)(h)["parts"].update(absmax=_dq(0)(h)["parts"]["absmax_q"]), "parts are not"),
    (lambda h: _dq(0)(h).update(encoding="nf4"), "parts are not"),                  # nf4dq parts under nf4
    (lambda h: _dq(6)(h).update(tier="host", encoding="nf4dq"), "parts are not"),   # nf4 parts under nf4dq
    (lambda h: _dq(0)(h)["parts"]["absmax_offset"].update(offset=_dq(0)(h)["parts"]["absmax_q"]["offset"]), "overlap"),
    (lambda h: _dq(0)(h)["parts"]["absmax_scale"].update(offset=_dq(0)(h)["parts"]["absmax_scale"]["offset"] + 4), "unaligned"),
    (lambda h: h["tensors"][0].update(shape=[33, 71]), "shape"),
    # the tier rule: nf4dq lives on the host (an NPU slice is int8, or nf4 to inflate)
    (lambda h: _dq(0)(h).update(tier="npu", min_m=32), "nf4dq slices live on the host"),
    (lambda h: _dq(0)(h).update(tier="npu"), "nf4dq slices live on the host"),
    (lambda h: _dq(3, 1)(h).update(tier="npu", min_m=2), "nf4dq slices live on the host"),
    (lambda h: _dq(5)(h).update(encoding="nf4dq", parts=_dq(5)(h)["host_copy"]["parts"]), "nf4dq slices live on the host"),
    (lambda h: _dq(0)(h).update(layout={"kind": "npu_int8", "tile_n": 32, "tile_k": 32, "n_pad": 64, "k_segment": 8192,
                                        "segments": [[0, 70, 96]]}), "npu_int8 layout is only for int8"),
    # host copies in nf4dq: parts, sizes, order, where a host copy may be
    (lambda h: _dq(4)(h)["host_copy"]["parts"]["absmax_q"].update(size=121), "host copy part absmax_q is 121 bytes"),
    (lambda h: _dq(4)(h)["host_copy"]["parts"]["absmax_offset"].update(size=0), "host copy part absmax_offset is 0 bytes"),
    (lambda h: _dq(4)(h)["host_copy"].update(parts=_reorder(_dq(4)(h)["host_copy"]["parts"],
                                                            ["codes", "absmax_q", "absmax_offset", "absmax_scale"])), "host copy parts are not"),
    (lambda h: _dq(4)(h)["host_copy"]["parts"].pop("absmax_scale"), "host copy parts are not"),
    (lambda h: _dq(4)(h)["host_copy"].update(encoding="nf4"), "host copy parts are not"),       # nf4dq parts under nf4
    (lambda h: _dq(6)(h)["host_copy"].update(encoding="nf4dq"), "host copy parts are not"),     # nf4 parts under nf4dq
    (lambda h: _dq(4)(h)["host_copy"].update(layout={"kind": "npu_int8"}), "host copy layout"),
    (lambda h: _dq(4)(h)["host_copy"]["parts"]["codes"].update(offset=_dq(4)(h)["parts"]["q"]["offset"]), "overlap"),
    (lambda h: _dq(0)(h).update(host_copy=_dq(4)(h)["host_copy"]), "a host slice has a host copy"),
    (lambda h: _dq(4)(h)["host_copy"].update(encoding="nf4dq "), "unknown host copy encoding"),
    (lambda h: _dq(4)(h)["host_copy"].update(encoding="NF4DQ"), "unknown host copy encoding"),
]


@pytest.mark.parametrize("mutate,why", NF4DQ_BAD)
def test_inconsistent_nf4dq_refused(tmp_path, mutate, why):
    p = tmp_path / "dq.orkpack"
    write_nf4dq(p)
    _rewrite_header(p, mutate)
    with pytest.raises(PackDamaged, match=re.escape(why)):
        Pack.open(p)


def test_nf4dq_unknown_to_an_older_reader_is_newer_not_damage(tmp_path, monkeypatch):
    """A 1.4 reader (no nf4dq) refuses a 1.5 pack's nf4dq slice, and a 1.5 pack's nf4dq host copy, as
    "made by a newer orkpack" (exit 2), naming the encoding (simulated as test_raw_pack_under_a_reader_without_raw)."""
    p, copies = tmp_path / "dq.orkpack", tmp_path / "copies.orkpack"
    write_nf4dq(p)
    write_nf4dq(copies)
    _rewrite_header(copies, lambda h: h.update(tensors=h["tensors"][4:]))  # only the NPU slices with host copies
    spec_minor = spec.VERSION_MINOR  # the writer's (1.5 or later)
    monkeypatch.setattr(spec, "ENCODINGS", tuple(e for e in spec.ENCODINGS if e != "nf4dq"))
    monkeypatch.setattr(spec, "HOST_COPY_ENCODINGS", ("nf4",))
    monkeypatch.setattr(spec, "VERSION_MINOR", 4)
    monkeypatch.setattr(spec, "VERSION_MINOR_MAX", 4)
    with pytest.raises(PackError) as e:
        Pack.open(p)
    assert e.value.exit_code == 2 and f"newer orkpack (format 1.{spec_minor}" in str(e.value) and "unknown encoding 'nf4dq'" in str(e.value)
    with pytest.raises(PackError) as e:
        Pack.open(copies)
    assert e.value.exit_code == 2 and "unknown host copy encoding 'nf4dq'" in str(e.value)


# ---------------------------------------------------------------- int5dq, int6dq, int8dq (format 1.7)

def write_intdq(path: Path, seed: int = 0) -> dict:
    """A pack with the three intdq encodings (docs/FORMAT.md 3) as host slices: 2-D with one group, 2-D with two
    groups and block tails, 1-D of odd length, stacked experts of two encodings; beside them an int8 NPU slice.
    Real encodings (the codecs). Returns {tensor name: (encoding, {part: array})} of the intdq slices."""
    from orkpack.codecs import get_codec
    from orkpack.codecs.reference import int8_encode
    from orkpack.layout import npu_layout, tile_int8

    r = _rng(seed)
    want = {}
    with PackWriter(path, provenance={"source_format": "test", "sources": [], "arch": None, "options": {}},
                    config=None, tiermap=None) as w:
        def host(name, shape, enc, expert=None):
            x = r.standard_t(3, size=shape).astype(np.float32)
            e = get_codec(enc).encode(x)
            want[name if expert is None else f"{name}[{expert}]"] = (enc, dict(e.parts))
            return dict(expert=expert, shape=list(shape), encoding=enc, tier="host", layout={"kind": "row_major"},
                        parts=dict(e.parts), sqnr_db=float(e.sqnr_db))

        w.add_tensor("blk.0.ffn_up.weight", "up", [33, 70], "F32", [host("blk.0.ffn_up.weight", (33, 70), "int5dq")])
        w.add_tensor("blk.0.ffn_down.weight", "down", [9, 1001], "F32",
                     [host("blk.0.ffn_down.weight", (9, 1001), "int6dq")])
        w.add_tensor("blk.0.attn_norm.bias", "b", [67], "F32", [host("blk.0.attn_norm.bias", (67,), "int8dq")])
        w.add_tensor("blk.0.ffn_gate_exps.weight", "g", [2, 3, 40], "F32",
                     [host("blk.0.ffn_gate_exps.weight", (3, 40), enc, e) for e, enc in enumerate(("int5dq", "int8dq"))])
        x = r.standard_t(3, size=(40, 96)).astype(np.float32)
        q, s = int8_encode(x)
        w.add_tensor("blk.0.attn_q.weight", "q", [40, 96], "F32", [dict(
            expert=None, shape=[40, 96], encoding="int8", tier="npu", layout=npu_layout(40, 96),
            parts={"q": tile_int8(q), "scale": s}, sqnr_db=40.0, min_m=8)])
        w.finish()
    return want


def test_intdq_roundtrip(tmp_path):
    """intdq slices are written, opened and read back as the codec made them; their decode is the codec's."""
    from orkpack.codecs import get_codec

    p = tmp_path / "idq.orkpack"
    want = write_intdq(p)
    seen = 0
    with Pack.open(p) as pack:
        assert pack.preamble.version_minor == spec.VERSION_MINOR >= 7  # intdq is 1.7
        for t, s in pack.slices():
            if s["encoding"] not in spec.INTDQ_ENCODINGS:
                continue
            key = t["name"] if s["expert"] is None else f"{t['name']}[{s['expert']}]"
            enc, wp = want[key]
            parts = pack.typed_parts(s)
            assert s["encoding"] == enc and list(parts) == list(spec.PARTS[enc]) and s["tier"] == spec.TIER_HOST
            for pn, a in parts.items():
                assert a.dtype == np.dtype(spec.PART_DTYPES[(enc, pn)])
                assert a.tobytes() == np.ascontiguousarray(wp[pn]).tobytes(), (key, pn)
            got = get_codec(enc).decode(parts, s["shape"])
            assert got.tobytes() == get_codec(enc).decode(wp, s["shape"]).tobytes() and np.all(np.isfinite(got))
            seen += 1
    assert seen == len(want) == 5
    write_intdq(tmp_path / "idq2.orkpack")
    assert (tmp_path / "idq2.orkpack").read_bytes() == p.read_bytes()


def test_intdq_part_sizes():
    from orkpack.pack.reader import expected_part_sizes

    for enc, b in spec.INTDQ_BITS.items():
        for shape in ([1], [32], [33], [256 * 32], [256 * 32 + 1], [3, 5, 7], [0, 5]):
            n = int(np.prod(shape))
            nb = -(-n // 32)
            sz = expected_part_sizes(shape, enc, {"kind": "row_major"})
            assert list(sz) == list(spec.PARTS[enc])
            assert (sz["codes"], sz["absmax_q"], sz["absmax_scale"], sz["absmax_offset"]) == \
                (-(-n * b // 8), nb, 4 * -(-nb // 256), 4)
    assert expected_part_sizes([33], "int5dq", {})["codes"] == 21  # 165 bits


def _idq(i, s=0):
    """tensor i, slice s of the write_intdq pack: 0 up [33, 70] int5dq, 1 down [9, 1001] int6dq (two groups),
    2 a 1-D [67] int8dq, 3 stacked experts (int5dq, int8dq), 4 attn_q NPU int8."""
    return lambda h: h["tensors"][i]["slices"][s]


INTDQ_BAD = [
    (lambda h: _idq(0)(h)["parts"]["codes"].update(size=1443), "codes is 1443 bytes"),  # 33*70*5/8 = 1443.75 -> 1444
    (lambda h: _idq(1)(h)["parts"]["codes"].update(size=9 * 1001), "codes is 9009 bytes"),  # int8dq's size under int6dq
    (lambda h: _idq(1)(h)["parts"]["absmax_scale"].update(size=4), "absmax_scale is 4 bytes, its shape and encoding say 8"),
    (lambda h: _idq(2)(h)["parts"]["absmax_q"].update(size=2), "absmax_q is 2 bytes"),
    (lambda h: _idq(0)(h).update(encoding="int6dq"), "codes is 1444 bytes"),  # another width: other code bytes
    (lambda h: _idq(0)(h).update(encoding="nf4dq"), "codes is 1444 bytes"),
    (lambda h: _idq(0)(h).update(parts=_reorder(_idq(0)(h)["parts"], ["codes", "absmax_scale", "absmax_q", "absmax_offset"])), "parts are not"),
    (lambda h: _idq(0)(h)["parts"].pop("absmax_offset"), "parts are not"),
    (lambda h: _idq(0)(h).update(tier="npu", min_m=32), "int5dq slices live on the host"),
    (lambda h: _idq(3, 1)(h).update(tier="npu", min_m=2), "int8dq slices live on the host"),
    (lambda h: _idq(4)(h).update(host_copy={"encoding": "int8dq", "parts": _idq(2)(h)["parts"], "sqnr_db": 1.0}),
     "unknown host copy encoding"),  # never a host copy
]


@pytest.mark.parametrize("mutate,why", INTDQ_BAD)
def test_inconsistent_intdq_refused(tmp_path, mutate, why):
    p = tmp_path / "idq.orkpack"
    write_intdq(p)
    _rewrite_header(p, mutate)
    with pytest.raises(PackDamaged, match=re.escape(why)):
        Pack.open(p)


def test_intdq_unknown_to_an_older_reader_is_newer_not_damage(tmp_path, monkeypatch):
    """A 1.6 reader (no intdq) refuses a 1.7 pack's intdq slice as "made by a newer orkpack" (exit 2), naming it."""
    p = tmp_path / "idq.orkpack"
    write_intdq(p)
    spec_minor = spec.VERSION_MINOR
    monkeypatch.setattr(spec, "ENCODINGS", tuple(e for e in spec.ENCODINGS if e not in spec.INTDQ_ENCODINGS))
    monkeypatch.setattr(spec, "VERSION_MINOR", 6)
    monkeypatch.setattr(spec, "VERSION_MINOR_MAX", 6)
    with pytest.raises(PackError) as e:
        Pack.open(p)
    assert e.value.exit_code == 2 and f"newer orkpack (format 1.{spec_minor}" in str(e.value) \
        and "unknown encoding 'int5dq'" in str(e.value)
