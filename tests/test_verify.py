"""`orkpack verify` (orkpack/runtime/verify.py, command.py) on packs written with PackWriter."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import xxhash

from orkpack.codecs.reference import int8_encode, nf4_encode
from orkpack.layout import npu_layout, tile_int8
from orkpack.pack.writer import PackWriter
from orkpack.runtime.command import verify_command
from orkpack.runtime.inflate import inflate_reference
from orkpack.runtime.verify import verify_pack


def _npu_int8(w, min_m=32):
    q, s = int8_encode(w)
    n, k = w.shape
    return {"expert": None, "shape": [n, k], "encoding": "int8", "tier": "npu", "layout": npu_layout(n, k),
            "parts": {"q": tile_int8(q), "scale": s}, "sqnr_db": 40.0, "min_m": min_m}


def _npu_nf4(w, min_m=16, expert=None, corrupt_image=False):
    codes, absmax = nf4_encode(w)
    n, k = w.shape
    q, s, lay = inflate_reference(codes, absmax, (n, k))
    if corrupt_image:
        q = q.copy()
        q[0] ^= 1
    rec = {"layout": lay, "q_xxh3": xxhash.xxh3_64_hexdigest(q), "q_size": int(q.size),
           "scale_xxh3": xxhash.xxh3_64_hexdigest(s)}
    return {"expert": expert, "shape": [n, k], "encoding": "nf4", "tier": "npu", "layout": {"kind": "row_major"},
            "parts": {"codes": codes, "absmax": absmax}, "sqnr_db": 20.0, "min_m": min_m, "inflate": rec}


def _host_nf4(w):
    codes, absmax = nf4_encode(w)
    return {"expert": None, "shape": list(w.shape), "encoding": "nf4", "tier": "host", "layout": {"kind": "row_major"},
            "parts": {"codes": codes, "absmax": absmax}, "sqnr_db": 20.0}


def _host_f32(w):
    return {"expert": None, "shape": list(w.shape), "encoding": "f32", "tier": "host", "layout": {"kind": "row_major"},
            "parts": {"data": w}, "sqnr_db": None}


def build(path: Path, *, storage="both", tiermap=None, seed=0, big=False, corrupt_image=False) -> Path:
    rng = np.random.default_rng(seed)
    w = PackWriter(path, provenance={"source_format": "safetensors", "sources": [], "arch": None, "options": {}},
                   config=None, tiermap=tiermap)
    shape = (70, 8250) if big else (32, 32)
    if storage in ("int8", "both"):
        w.add_tensor("blk.0.attn_q.weight", "q_proj", shape, "F32",
                     [_npu_int8(rng.standard_t(2, size=shape).astype(np.float32))])
    if storage in ("nf4", "both"):
        nshape = (33, 8200) if big else (32, 64)
        w.add_tensor("blk.0.ffn_up.weight", "up_proj", nshape, "F32",
                     [_npu_nf4(rng.standard_t(2, size=nshape).astype(np.float32), corrupt_image=corrupt_image)])
    if storage == "experts":
        sl = [_npu_nf4(rng.standard_normal((32, 96)).astype(np.float32), expert=e) for e in range(2)]
        w.add_tensor("blk.0.ffn_up_exps.weight", "experts", (2, 32, 96), "F32", sl)
    if big:
        w.add_tensor("blk.0.ffn_down.weight", "down", (40, 100), "F32", [_host_nf4(rng.standard_normal((40, 100)).astype(np.float32))])
    w.add_tensor("output_norm.weight", "norm", (16,), "F32", [_host_f32(rng.standard_normal(16).astype(np.float32))])
    return w.finish()


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    return build(tmp_path_factory.mktemp("p") / "small.orkpack")


@pytest.mark.parametrize("storage", ["int8", "nf4", "both", "experts"])
@pytest.mark.parametrize("method", ["direct", "two-step"])
def test_verify_passes(tmp_path, storage, method):
    p = build(tmp_path / "m.orkpack", storage=storage)
    r = verify_pack(p, inflate=method, reference=True)
    assert r.exit_code == 0, r.failures
    assert r.checks["load"]["passed"] == r.stats["npu_slices"] > 0
    assert r.checks["reference"]["failed"] == 0 and r.checks["reference"]["passed"] > 0
    if storage != "int8":
        assert r.stats["bytes_inflated"] > 0
    if storage in ("int8", "both"):
        assert r.stats["bytes_filled"] > 0


def test_verify_passes_big_shapes_threads(tmp_path):
    p = build(tmp_path / "big.orkpack", big=True)
    for threads in (1, 2):
        r = verify_pack(p, threads=threads, reference=True)
        assert r.exit_code == 0, r.failures
        assert r.stats["bytes_filled"] == 96 * (8192 + 64) and r.stats["bytes_inflated"] == 64 * (8192 + 32)


def test_wrong_recorded_image_names_the_tensor(tmp_path):
    p = build(tmp_path / "bad.orkpack", storage="nf4", corrupt_image=True)
    r = verify_pack(p)
    assert r.exit_code == 1 and len(r.failures) == 1
    assert "blk.0.ffn_up.weight" in r.failures[0] and "q_xxh3" in r.failures[0]


def test_arena_cap_from_tiermap(tmp_path):
    p = build(tmp_path / "cap.orkpack", tiermap={"board": {"iova_usable_bytes": 4096}})
    r = verify_pack(p)
    assert r.exit_code == 1 and "arena cap" in r.failures[0] and r.stats["arena_cap"] == 4096
    p2 = build(tmp_path / "cap2.orkpack", tiermap={"board": {"iova_usable_bytes": 8192}})
    assert verify_pack(p2).exit_code == 0


def test_keep_going_reports_all(tmp_path, small_pack):
    data = bytearray(small_pack.read_bytes())
    from orkpack.pack.reader import Pack

    with Pack.open(small_pack) as pk:
        offs = [pr["offset"] for _, s in pk.slices() for pr in s["parts"].values()]
    for o in offs[:3]:
        data[o] ^= 0x10
    bad = tmp_path / "multi.orkpack"
    bad.write_bytes(bytes(data))
    first = verify_pack(bad)
    assert first.exit_code == 1 and len(first.failures) == 1 and "data section" in first.failures[0]
    assert "blk.0.attn_q.weight part q" in first.failures[0]
    allf = verify_pack(bad, keep_going=True)
    assert allf.exit_code == 1 and allf.checks["parts"]["failed"] == 3 and allf.checks["load"]["failed"] >= 1


def _flip_sweep(path: Path, tmp: Path):
    import os

    data = path.read_bytes()
    target = tmp / "flip.orkpack"
    target.write_bytes(data)
    survivors = []
    fd = os.open(target, os.O_WRONLY)
    try:
        header_offset = int.from_bytes(data[40:48], "little")
        for i in range(len(data)):
            # every bit of the preamble fields and of the header; one bit of every other byte
            bits = range(8) if i < 128 or i >= header_offset else (i % 8,)
            for bit in bits:
                os.pwrite(fd, bytes([data[i] ^ (1 << bit)]), i)
                r = verify_pack(target)
                if r.exit_code != 1:
                    survivors.append((i, bit, r.exit_code, r.error))
            os.pwrite(fd, data[i : i + 1], i)
    finally:
        os.close(fd)
    return survivors


def test_every_single_bit_flip_fails(small_pack, tmp_path):
    """One bit flipped at every byte position (bit i % 8): verify exits 1 every time."""
    size = small_pack.stat().st_size
    assert size < 40000
    survivors = _flip_sweep(small_pack, tmp_path)
    assert survivors == []


@pytest.mark.parametrize("cut", [0, 7, 100, 4095, 4096, 5000, -1, -100, "header"])
def test_truncation_is_unusable(small_pack, tmp_path, cut):
    data = small_pack.read_bytes()
    if cut == "header":
        from orkpack.pack.reader import Pack

        with Pack.open(small_pack) as pk:
            cut = pk.preamble.header_offset
    t = tmp_path / "cut.orkpack"
    t.write_bytes(data[:cut])
    r = verify_pack(t)
    assert r.exit_code == 2 and r.error and "truncated" in r.error or "not an orkpack" in (r.error or "")
    assert r.exit_code == 2


def test_not_a_pack(tmp_path):
    t = tmp_path / "model.safetensors"
    t.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(5000))
    assert verify_pack(t).exit_code == 2
    assert verify_pack(tmp_path / "missing.orkpack").exit_code == 2
    assert verify_pack(tmp_path).exit_code == 2


def _console():
    from rich.console import Console

    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf


def test_command_json_and_worst_exit_code(small_pack, tmp_path):
    bad = tmp_path / "bad.orkpack"
    b = bytearray(small_pack.read_bytes())
    b[4096 + 5] ^= 4
    bad.write_bytes(bytes(b))
    junk = tmp_path / "junk.orkpack"
    junk.write_bytes(b"hello")
    con, buf = _console()
    code = verify_command([small_pack, bad, junk], device="host", inflate="direct", threads=1, reference=False,
                          keep_going=False, json_out=True, console=con)
    doc = json.loads(buf.getvalue())
    assert code == 2 and doc["exit_code"] == 2
    assert [p["exit_code"] for p in doc["packs"]] == [0, 1, 2]
    assert list(doc) == ["exit_code", "device", "inflate", "threads", "packs"]
    assert list(doc["packs"][0]) == ["path", "ok", "exit_code", "error", "failures", "checks", "stats"]
    assert list(doc["packs"][0]["checks"]) == ["open", "data", "parts", "layout", "arena", "load", "min_m", "reference"]
    con, buf = _console()
    assert verify_command([small_pack, bad], device="host", inflate="two-step", threads=2, reference=True,
                          keep_going=True, json_out=False, console=con) == 1
    out = buf.getvalue()
    assert "FAIL" in out and "blk.0.attn_q.weight" in out and "orkpack verify" in out
    con, buf = _console()
    assert verify_command([small_pack], device="host", inflate="sideways", threads=1, reference=False,
                          keep_going=False, json_out=False, console=con) == 2


def test_command_with_fake_rknpu(small_pack, monkeypatch):
    from test_runtime_backends import FakeRknpu
    from orkpack.runtime import backends as B

    dev = FakeRknpu()
    monkeypatch.setattr(B, "find_rknpu_node", lambda *a, **k: "/dev/dri/renderD129")
    monkeypatch.setattr(B.RknpuBackend.__init__, "__defaults__", None, raising=False)
    real = B.RknpuBackend

    class Fake(real):
        def __init__(self, node, **kw):
            super().__init__(node, opener=dev.open, ioctl=dev.ioctl, mmapper=dev.mmap, closer=dev.close)

    monkeypatch.setattr(B, "RknpuBackend", Fake)
    con, buf = _console()
    assert verify_command([small_pack], device="auto", inflate="direct", threads=1, reference=True,
                          keep_going=False, json_out=True, console=con) == 0
    doc = json.loads(buf.getvalue())
    assert doc["device"] == "rknpu"
    creates = [c for c in dev.calls if c[0] == "create"]
    syncs = [c for c in dev.calls if c[0] == "sync"]
    assert creates and all(c[1] == 0x403 and c[2] % 4096 == 0 for c in creates)
    # every load is cleaned over exactly its written range: int8 [32,32] -> 1024 B, nf4 [32,64] -> 2048 B
    assert sorted(s[4] for s in syncs) == [1024, 2048, 2048] and all(s[1] == 1 and s[3] == 0 for s in syncs)
    assert dev.objects == {} and dev.closed == [77]


def test_fail_line_names_the_pack_once(small_pack, tmp_path):
    """A pack that fails to open: `FAIL PATH: damaged pack: ...`, not `FAIL PATH: PATH: damaged pack: ...`."""
    bad = tmp_path / "hdr.orkpack"
    b = bytearray(small_pack.read_bytes())
    b[-3] ^= 1  # in the header: header checksum mismatch
    bad.write_bytes(bytes(b))
    r = verify_pack(bad)
    assert r.exit_code == 1 and r.failures == ["damaged pack: header checksum mismatch"]
    con, buf = _console()
    assert verify_command([bad], device="host", inflate="direct", threads=1, reference=False,
                          keep_going=False, json_out=False, console=con) == 1
    fail = [ln for ln in buf.getvalue().splitlines() if ln.startswith("FAIL")]
    assert fail == [f"FAIL {bad}: damaged pack: header checksum mismatch"]
    assert buf.getvalue().count(str(bad)) == 1
