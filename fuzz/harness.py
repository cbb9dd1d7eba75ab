"""Shared input shaping and the one property of every fuzz target.

The property: whatever bytes are fed in, orkpack raises nothing but
``orkpack.errors.OrkError`` (or a subclass). Anything else is a finding.

Checksums would stop almost every mutation at the first check, so the pack
target decodes its input in one of three modes (first byte, mod 3):

* 0 raw: the bytes are the file;
* 1 fixed: the bytes are the file, then the preamble's own checksum and the
  header/data checksums it declares are recomputed (when its offsets fit), so
  mutations reach the size checks and the header validation;
* 2 wrapped: byte 1 = data pages (0..255), the rest is header JSON, wrapped into
  a pack with a correct preamble, so mutations reach ``validate_header``.

Used by fuzz/fuzz.py (atheris) and tests/test_fuzz_properties.py (hypothesis).
The structure-aware fuzzer of both readers (fuzz/fuzz_structure.py) and its test forge packs
around mutated headers with ``split_pack``, ``forge_pack`` and ``refresh_part_checksums``.
"""
from __future__ import annotations

import atexit
import io
import shutil
import struct
import tempfile
from pathlib import Path

import xxhash

from orkpack.errors import OrkError
from orkpack.pack import spec
from orkpack.pack.writer import preamble_bytes

_DIR = Path(tempfile.mkdtemp(prefix="orkpack-fuzz-"))


def scratch(name: str, data: bytes) -> Path:
    p = _DIR / name
    p.write_bytes(data)
    return p


def wrap_pack(header: bytes, data_pages: int = 0, data: bytes = b"") -> bytes:
    """A pack file with correct preamble and checksums around arbitrary header bytes."""
    body = data[: data_pages * spec.ALIGN].ljust(data_pages * spec.ALIGN, b"\0")
    pre = preamble_bytes(
        file_size=spec.PREAMBLE_BLOCK + len(body) + len(header),
        data_size=len(body),
        header_size=len(header),
        data_xxh3=xxhash.xxh3_64_intdigest(body),
        header_xxh3=xxhash.xxh3_64_intdigest(header),
    )
    return pre + body + header


def fix_checksums(raw: bytes) -> bytes:
    """Recompute the checksums a pack file declares, leaving every other byte as is."""
    if len(raw) < spec.PREAMBLE_BLOCK:
        return raw
    b = bytearray(raw)
    f = list(struct.unpack_from(spec.PREAMBLE_FMT, b))
    data_off, data_size, hoff, hsize = f[5], f[6], f[7], f[8]
    if data_off <= len(b) and data_off + data_size <= len(b):
        struct.pack_into("<Q", b, 56, xxhash.xxh3_64_intdigest(bytes(b[data_off:data_off + data_size])))
    if hoff <= len(b) and hoff + hsize <= len(b):
        struct.pack_into("<Q", b, 64, xxhash.xxh3_64_intdigest(bytes(b[hoff:hoff + hsize])))
    b[120:128] = bytes(8)
    struct.pack_into("<Q", b, 120, xxhash.xxh3_64_intdigest(bytes(b[:spec.PREAMBLE_BLOCK])))
    return bytes(b)


def split_pack(raw: bytes) -> tuple[bytes, bytes, int]:
    """(header bytes, data section bytes, version minor) of a well-formed pack file."""
    f = struct.unpack_from(spec.PREAMBLE_FMT, raw)
    data_off, data_size, hoff, hsize = f[5], f[6], f[7], f[8]
    return raw[hoff:hoff + hsize], raw[data_off:data_off + data_size], f[2]


def forge_pack(header: bytes, data: bytes = b"", minor: int | None = None) -> bytes:
    """A pack file around a header and a data section (a multiple of 4096 bytes), every checksum
    (preamble, header, data) correct; ``minor`` sets the version minor (the preamble's checksum is
    recomputed), so that whatever the header says reaches the header validation and the checks after it.
    The forging helper of fuzz/fuzz_structure.py and tests/test_fuzz_structure.py."""
    raw = wrap_pack(header, len(data) // spec.ALIGN, data)
    if minor is None:
        return raw
    b = bytearray(raw)
    struct.pack_into("<H", b, 10, minor)
    b[120:128] = bytes(8)
    struct.pack_into("<Q", b, 120, xxhash.xxh3_64_intdigest(bytes(b[:spec.PREAMBLE_BLOCK])))
    return bytes(b)


def part_records(header) -> list[dict]:
    """Every part record of a (possibly mangled) parsed header: the slices' parts and the host copies'."""
    out = []
    tensors = header.get("tensors") if isinstance(header, dict) else None
    for t in tensors if isinstance(tensors, list) else []:
        slices = t.get("slices") if isinstance(t, dict) else None
        for s in slices if isinstance(slices, list) else []:
            if not isinstance(s, dict):
                continue
            hc = s.get("host_copy")
            for parts in (s.get("parts"), hc.get("parts") if isinstance(hc, dict) else None):
                if isinstance(parts, dict):
                    out.extend(pr for pr in parts.values() if isinstance(pr, dict))
    return out


def refresh_part_checksums(header, data: bytes, data_offset: int = spec.PREAMBLE_BLOCK) -> int:
    """Recompute the ``xxh3`` of every part record whose offset and size are ints (not bools) pointing
    inside ``data`` (the data section, at file offset ``data_offset``), so that a part moved onto
    other bytes, or bytes changed under it, passes its checksum and reaches the checks after it.
    Returns how many records changed."""
    n = 0
    for pr in part_records(header):
        off, size = pr.get("offset"), pr.get("size")
        if type(off) is not int or type(size) is not int or size < 0 or off < data_offset:
            continue
        if off - data_offset + size > len(data):
            continue
        h = xxhash.xxh3_64_hexdigest(data[off - data_offset:off - data_offset + size])
        if pr.get("xxh3") != h:
            pr["xxh3"] = h
            n += 1
    return n


def pack_input(data: bytes) -> bytes:
    """Fuzzer bytes -> pack file bytes (see the module docstring)."""
    if not data:
        return b""
    mode, rest = data[0] % 3, data[1:]
    if mode == 0:
        return rest
    if mode == 1:
        return fix_checksums(rest)
    pages = rest[0] if rest else 0
    return wrap_pack(rest[1:], pages)


def check_pack(raw: bytes) -> None:
    """Open, inspect, render and verify a pack file; only OrkError may escape."""
    from rich.console import Console

    from orkpack.inspect import pack_facts
    from orkpack.pack.reader import Pack
    from orkpack.render import pack_facts as render
    from orkpack.runtime.verify import verify_pack

    p = scratch("f.orkpack", raw)
    opened = False
    try:
        with Pack.open(p) as pack:
            opened = True
            for _t, s in pack.slices():
                for name in s["parts"]:
                    pack.typed_part(s, name)
    except OrkError:
        pass
    try:
        f = pack_facts(p, None)
        render(Console(file=io.StringIO(), width=120, color_system=None), f)
    except OrkError:
        pass
    if opened:
        r = verify_pack(p, threads=1, reference=True, keep_going=True)
        assert r.exit_code in (0, 1, 2)


def safetensors_input(data: bytes) -> bytes:
    """Mode (first byte, even/odd): the bytes as is, or JSON header + data with its length prefix filled in."""
    if not data:
        return b""
    if data[0] % 2 == 0:
        return data[1:]
    rest = data[1:]
    cut = rest.find(b"\n")
    header, body = (rest, b"") if cut < 0 else (rest[:cut], rest[cut + 1:])
    return struct.pack("<Q", len(header)) + header + body


def check_safetensors(raw: bytes) -> None:
    from orkpack.sources.safetensors import SafetensorsSource

    p = scratch("f.safetensors", raw)
    _read_all(lambda: SafetensorsSource(p, [p], None))


def check_gguf(raw: bytes) -> None:
    from orkpack.sources.gguf import GGUFSource

    p = scratch("f.gguf", raw)
    _read_all(lambda: GGUFSource(p, on_warning=lambda m: None))


def _read_all(open_source) -> None:
    """Open a source and read every tensor; only OrkError may escape (and is swallowed)."""
    try:
        src = open_source()
    except OrkError:
        return
    with src:
        for sk in src.skipped():  # derivable buffers: listed from the header alone
            assert sk.name and sk.reason
        for info in src.tensors():
            try:
                a = src.read(info.name)
                assert tuple(a.shape) == tuple(info.shape)
            except OrkError:
                pass


def model_entry_digest(typ: str, vals) -> str:
    """What ``orkpack-check --model`` prints for a model-record entry of type ``typ``: xxh3-64 of its values in turn
    (a string as its u64 length and UTF-8 bytes, a float as f64 with NaN as eight 0xff bytes, an integer as i64)."""
    inner = typ[6:-1] if typ.startswith("array[") else typ
    vals = vals if typ.startswith("array[") else [vals]
    out = bytearray()
    for v in vals:
        if inner == "string":
            b = v.encode("utf-8", "surrogatepass")
            out += struct.pack("<Q", len(b)) + b
        elif inner in ("float32", "float64"):
            out += b"\xff" * 8 if v != v else struct.pack("<d", v)
        else:
            out += struct.pack("<q", int(v))
    return f"{xxhash.xxh3_64_intdigest(bytes(out)):016x}"


def forked_map(fn, items: list, died, *, address_space: int | None = None) -> list:
    """``[fn(x) for x in items]`` in a forked child per batch, so that a native crash (a heap overflow aborts the
    process) or an exhausted address space is pinned to its item, not the end of the fuzzer: when the batch's child
    dies the items are run again one per child, and an item whose own child dies gets ``died(how)`` ("killed by
    signal N" or "exit N"). ``address_space``: the child's RLIMIT_AS in bytes. The results pickle back through a
    pipe."""
    import os
    import pickle

    def child(batch):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            os.close(r)
            try:
                if address_space is not None:
                    import resource

                    resource.setrlimit(resource.RLIMIT_AS, (address_space, resource.getrlimit(resource.RLIMIT_AS)[1]))
                data = pickle.dumps([fn(x) for x in batch])
                with os.fdopen(w, "wb") as f:
                    f.write(data)
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        try:
            return pickle.loads(data), status
        except Exception:  # noqa: BLE001 - a child that died mid-write left no (or half a) pickle
            return None, status

    outs, _ = child(items)
    if outs is not None and len(outs) == len(items):
        return outs
    res = []
    for x in items:
        one, st = child([x])
        if one is not None and len(one) == 1:
            res.append(one[0])
            continue
        res.append(died(f"killed by signal {os.WTERMSIG(st)}" if os.WIFSIGNALED(st) else f"exit {os.WEXITSTATUS(st)}"))
    return res


def cleanup() -> None:
    shutil.rmtree(_DIR, ignore_errors=True)


atexit.register(cleanup)
