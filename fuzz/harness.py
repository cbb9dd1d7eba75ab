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


def cleanup() -> None:
    shutil.rmtree(_DIR, ignore_errors=True)


atexit.register(cleanup)
