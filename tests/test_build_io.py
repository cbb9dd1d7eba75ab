"""The build's I/O path (issue 14): sources mapped instead of copied, parts encoded into the pack
writer's reused buffers, O_DIRECT writes with a plain-write fallback, source hashing from mappings.
Every test here checks bytes or bookkeeping, never time."""
from __future__ import annotations

import errno
import json
import math
import mmap
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

from orkpack.build import BuildOptions, build
from orkpack.files import hash_file
from orkpack.pack import spec
from orkpack.pack.reader import Pack
from orkpack.pack.writer import BufferPool, PackWriter
from orkpack.sources import open_source
from orkpack.synth import write_gguf_model, write_hf_model


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    header, blobs, off = {}, [], 0
    for name, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def test_mapped_equals_read_safetensors(tmp_path):
    """Every float and raw tensor mapped (no copy) holds exactly what read() returns, dtype and shape
    included; the mapping is read-only and outlives the source's close()."""
    r = np.random.default_rng(0)
    p = tmp_path / "m.safetensors"
    _write_safetensors(p, {
        "model.layers.0.mlp.up_proj.weight": ("BF16", r.integers(0, 2**16, (33, 70), dtype=np.uint16)),
        "model.layers.0.mlp.down_proj.weight": ("F16", r.standard_normal((7, 9)).astype(np.float16)),
        "model.norm.weight": ("F32", r.standard_normal(13).astype(np.float32)),
        "model.layers.0.counts": ("I32", r.integers(-5, 5, (3, 5), dtype=np.int32)),
        "model.layers.0.mask": ("BOOL", r.integers(0, 2, (4, 4)).astype(np.bool_)),
        "model.layers.0.empty": ("F32", np.zeros((0, 4), np.float32)),
    })
    src = open_source(p)
    try:
        kept = {}
        for info in src.tensors():
            m, want = src.mapped(info.name), src.read(info.name)
            assert m is not None, info.name
            assert m.dtype == want.dtype and m.shape == want.shape and np.array_equal(m, want), info.name
            if m.size:
                assert not m.flags.writeable
            kept[info.name] = (m, want.copy())
    finally:
        src.close()
    for name, (m, want) in kept.items():  # still readable: the mapping belongs to the array
        assert np.array_equal(m, want), name


def test_mapped_is_none_where_read_must_gather(tmp_path):
    """Per-expert HF tensors (stacked from several places) are not mapped: read() gathers them."""
    model = write_hf_model(tmp_path / "moe", arch="qwen3_moe", experts=4, experts_used=2, seed=3)
    src = open_source(model)
    try:
        stacked = [i for i in src.tensors() if len(i.shape) == 3]
        assert stacked and all(src.mapped(i.name) is None for i in stacked)
        plain = [i for i in src.tensors() if len(i.shape) == 2]
        assert all(np.array_equal(src.mapped(i.name), src.read(i.name)) for i in plain)
    finally:
        src.close()


@pytest.mark.parametrize("ttype", ["F32", "F16", "BF16", "Q8_0"])
def test_mapped_equals_read_gguf(tmp_path, ttype):
    path = write_gguf_model(tmp_path / "m.gguf", arch="qwen3_moe", experts=4, experts_used=2, seed=4, tensor_type=ttype)
    src = open_source(path)
    try:
        for info in src.tensors():
            m = src.mapped(info.name)
            if info.dtype not in ("F32", "F16", "BF16"):  # quantized: dequantized by read(), never mapped
                assert m is None, info.name
                continue
            want = src.read(info.name)
            assert m.dtype == want.dtype and m.shape == want.shape and np.array_equal(m, want), info.name
    finally:
        src.close()


def _pack_parts(path: Path) -> list[tuple[str, int]]:
    """(tensor name, bytes of its parts, each rounded up to ALIGN) per tensor of a pack."""
    out = []
    with Pack.open(path) as p:
        for t in p.header["tensors"]:
            n = 0
            for s in t["slices"]:
                recs = list(s["parts"].values()) + list((s.get("host_copy") or {}).get("parts", {}).values())
                n += sum(-(-r["size"] // spec.ALIGN) * spec.ALIGN for r in recs)
            out.append((t["name"], n))
    return out


def test_build_encodes_into_reused_writer_buffers(tmp_path, monkeypatch):
    """Issue 14: every quantized part is encoded straight into the writer's pool (written with no
    copy), and the pool touches about the largest tensor's parts once, not every tensor's parts:
    before, each tensor's parts were fresh arrays (fresh pages the kernel faults in and zeroes)."""
    model = write_hf_model(tmp_path / "m", layers=6, hidden=256, intermediate=688, vocab=512, shards=2, seed=5)
    seen = {"lent": 0, "copied": 0}
    pools = []
    real_write_part, real_init = PackWriter._write_part, PackWriter.__init__

    def spy_init(self, *a, **k):
        real_init(self, *a, **k)
        pools.append(self.pool)

    def spy_write_part(self, arr):
        a = np.asarray(arr)
        if a.nbytes:
            seen["lent" if a.__array_interface__["data"][0] in self._lent else "copied"] += 1
        return real_write_part(self, arr)

    monkeypatch.setattr(PackWriter, "__init__", spy_init)
    monkeypatch.setattr(PackWriter, "_write_part", spy_write_part)
    out = tmp_path / "m.orkpack"
    build(model, out, BuildOptions(threads=2))  # the default: a tier map, dual-resident slices included
    assert seen["copied"] == 0 and seen["lent"] > 0, seen
    per_tensor = _pack_parts(out)
    largest, total = max(n for _, n in per_tensor), sum(n for _, n in per_tensor)
    pool = pools[0]
    assert total > 4 * largest  # the bound below means something
    assert pool.extra_bytes == 0
    assert pool.fresh_bytes <= 2 * largest, (pool.fresh_bytes, largest, total)


def test_writer_direct_and_plain_writes_give_the_same_bytes(tmp_path):
    """O_DIRECT (where the file system takes it) and plain writes produce the same file; parts from
    alloc() and from anywhere else alike."""
    r = np.random.default_rng(1)
    arrays = [r.integers(0, 256, n, dtype=np.uint8) for n in (1, 4095, 4096, 4097, 70_000, 0, 3)]
    paths = {}
    for direct in (True, False):
        p = tmp_path / f"{direct}.orkpack"
        with PackWriter(p, provenance={}, config=None, tiermap=None, direct=direct) as w:
            if direct and w._dfd is None:
                pytest.skip("this file system refuses O_DIRECT; the plain path is covered below")
            for i, a in enumerate(arrays):
                part = w.alloc(a.shape, a.dtype) if i % 2 else a
                if i % 2:
                    part[...] = a
                w.add_tensor(f"t{i}", f"t{i}", [a.size], "U8", [dict(
                    expert=None, shape=[a.size], encoding="raw", dtype="u8", tier="host",
                    layout={"kind": "row_major"}, parts={"data": part}, sqnr_db=None)])
            w.finish()
        paths[direct] = p
    assert paths[True].read_bytes() == paths[False].read_bytes()
    with Pack.open(paths[True]) as p:
        assert p.check_data_checksum()
        for (t, s), a in zip(p.slices(), arrays):
            assert p.part(s["parts"]["data"]).tobytes() == a.tobytes()


def test_o_direct_refused_mid_build_falls_back_to_plain_writes(model_and_pack, monkeypatch):
    """A file system that opens O_DIRECT but refuses the writes (EINVAL) gets plain writes: same pack."""
    model, want, tmp_path = model_and_pack
    real = os.pwrite
    refused = []

    def pwrite(fd, data, offset):
        if fd not in refused and fcntl_flags(fd) & getattr(os, "O_DIRECT", 0):
            refused.append(fd)
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    out = tmp_path / "fallback.orkpack"
    build(model, out, BuildOptions(threads=1, plan=False))
    assert out.read_bytes() == want
    if hasattr(os, "O_DIRECT"):
        assert refused  # the direct descriptor was tried, refused, and closed


def fcntl_flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


@pytest.fixture
def model_and_pack(tmp_path):
    model = write_hf_model(tmp_path / "m", layers=2, seed=6)
    ref = tmp_path / "ref.orkpack"
    build(model, ref, BuildOptions(threads=1, plan=False))
    return model, ref.read_bytes(), tmp_path


def test_pool_first_fit_reuses_and_coalesces():
    A = spec.ALIGN
    pool = BufferPool(16 * A)
    a, b, c = pool.take(A), pool.take(2 * A - 7), pool.take(A)
    assert (a.off, b.off, c.off) == (0, A, 3 * A) and pool.high_water == 4 * A
    assert a.addr % mmap.PAGESIZE == 0 and b.addr == a.addr + A
    pool.give(b)
    pool.give(a)  # a and b coalesce into one run of 3 pages at 0
    assert pool.fits_touched(3 * A) and not pool.fits_touched(4 * A)
    d = pool.take(3 * A)
    assert d.off == 0 and pool.high_water == 4 * A
    big = pool.take(64 * A)  # larger than the region: a one-off mapping, counted apart
    assert big.off is None and pool.extra_bytes == 64 * A
    pool.give(big), pool.give(c), pool.give(d)
    assert pool.take(16 * A).off == 0  # everything coalesced back into the whole region


@pytest.mark.parametrize("size", [0, 1, mmap.ALLOCATIONGRANULARITY - 1, 2 * mmap.ALLOCATIONGRANULARITY,
                                  5 * mmap.ALLOCATIONGRANULARITY + 3])
def test_hash_file_from_mapped_windows(tmp_path, size):
    p = tmp_path / "f.bin"
    p.write_bytes(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes())
    want = xxhash.xxh3_64_hexdigest(p.read_bytes())
    assert hash_file(p, window=2 * mmap.ALLOCATIONGRANULARITY) == want
    assert hash_file(p) == want
    # a build that stopped: the side thread gives up before the next window
    windows = []
    got = hash_file(p, window=mmap.ALLOCATIONGRANULARITY, stop=lambda: windows.append(1) or len(windows) > 2)
    assert got == (None if size > 2 * mmap.ALLOCATIONGRANULARITY else want)


def test_build_hashes_the_source_from_when_it_is_opened(tmp_path, monkeypatch):
    """Issue 26: the source files are hashed on a side thread from open_inputs on (while the build plans and
    encodes); the provenance holds the same xxh3 as a hash of the file, and a build that fails after opening stops
    the hashing instead of waiting for it."""
    from orkpack.build import inputs as build_inputs
    from orkpack.errors import OrkError

    model = write_hf_model(tmp_path / "m", layers=1, hidden=64, intermediate=128, vocab=64, shards=2, seed=3)
    started = []
    real = build_inputs.Inputs.start_hashing
    monkeypatch.setattr(build_inputs.Inputs, "start_hashing", lambda self: (started.append(self), real(self))[1])
    out = build(model, tmp_path / "m.orkpack", BuildOptions(threads=1)).path
    assert len(started) == 1 and len(started[0]._hashes) == 2
    with Pack.open(out) as pk:
        recs = pk.header["provenance"]["sources"]
    assert [r["xxh3"] for r in recs] == [xxhash.xxh3_64_hexdigest((model / r["file"]).read_bytes()) for r in recs]
    with pytest.raises(OrkError):
        build(model, tmp_path / "x.orkpack", BuildOptions(threads=1, tiermap=str(tmp_path / "none.json")))
    assert started[1]._stop.is_set() and not list(tmp_path.glob("x.orkpack*"))
    # a failure while encoding (a NaN refused) stops the hashing too, before the pipeline closes the source
    stops = []
    real_stop = build_inputs.Inputs.stop_hashing
    monkeypatch.setattr(build_inputs.Inputs, "stop_hashing", lambda self: (stops.append(1), real_stop(self))[1])
    bad = write_hf_model(tmp_path / "bad", layers=1, hidden=64, intermediate=128, vocab=64, shards=1, seed=3)
    st = bad / "model.safetensors"
    raw = bytearray(st.read_bytes())
    hlen = struct.unpack_from("<Q", raw, 0)[0]
    head = json.loads(raw[8: 8 + hlen])
    name = next(k for k in head if k.endswith("mlp.up_proj.weight"))
    off = 8 + hlen + head[name]["data_offsets"][0]
    raw[off: off + 2] = b"\xc0\x7f"  # a bf16 NaN
    st.write_bytes(bytes(raw))
    with pytest.raises(OrkError, match="NaN"):
        build(bad, tmp_path / "y.orkpack", BuildOptions(threads=1))
    assert len(stops) >= 2 and not list(tmp_path.glob("y.orkpack*"))  # write_pack's, then close()'s


def test_mapped_equals_read_gguf_raw_types(tmp_path):
    """GGUF integer and F64 tensors mapped hold their bytes as read() gives them (own numpy type)."""
    from test_raw_and_skipped import _gguf_with_ints

    p = tmp_path / "i.gguf"
    want = _gguf_with_ints(p)
    with open_source(p) as src:
        for name, arr in want.items():
            m = src.mapped(name)
            assert m is not None and m.dtype == arr.dtype and m.shape == arr.shape, name
            assert m.tobytes() == arr.tobytes() == src.read(name).tobytes(), name


def test_default_threads_are_the_process_cores(monkeypatch):
    """--threads 0 means the cores the process may run on: under `taskset -c 0` one encoder thread, not one per core
    of the machine taking turns on the one core (issue 26: 1.1-1.3x slower)."""
    from orkpack.build import options

    monkeypatch.setattr(options.os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(options.os, "cpu_count", lambda: 64)
    assert BuildOptions(threads=0).resolved_threads() == 1
    assert BuildOptions(threads=5).resolved_threads() == 5
    monkeypatch.setattr(options.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert BuildOptions().resolved_threads() == 3
