"""Read a .orkpack file (docs/FORMAT.md) and check everything a reader can
check without touching the data: the preamble and its checksum, the sizes, the
header checksum, and every part's offset, alignment, overlap and size against
the slice's shape, encoding and layout. Every length and offset is checked
against the file size and the format's caps before anything is allocated.
An NPU slice's host copy (format 1.2, docs/FORMAT.md 8) is checked the same
way; ``Pack.host_copy_parts`` and :func:`host_copy_slice` read it.

Errors: :class:`PackError` (exit 2) for a file that is not a pack, is
truncated, or comes from a newer major version; :class:`PackDamaged` (exit 1)
for a checksum mismatch or an inconsistent header, i.e. a damaged pack.
"""
from __future__ import annotations

import json
import mmap
import os
import stat
import struct
from collections import namedtuple
from pathlib import Path
from typing import Iterator

import numpy as np
import xxhash

from orkpack.errors import PackError, escape_name
from orkpack.pack import spec

Preamble = namedtuple(
    "Preamble",
    "magic version_major version_minor preamble_size file_size data_offset data_size "
    "header_offset header_size data_xxh3 header_xxh3 alignment flags reserved preamble_xxh3",
)


class PackDamaged(PackError):
    """A pack whose checksums or tables do not hold: damaged (exit code 1)."""

    exit_code = 1


def _bits_differ(a: bytes, b: bytes) -> int:
    return sum(bin(x ^ y).count("1") for x, y in zip(a, b))


def _itemsize(enc: str) -> int:
    return {spec.ENC_F32: 4, spec.ENC_F16: 2, spec.ENC_BF16: 2}[enc]


class _Newer(str):
    """A header problem a newer minor version explains (an encoding or raw element type this reader
    does not know): with a larger minor version it means "made by a newer orkpack", not "damaged"."""


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def expected_part_sizes(shape: list[int], encoding: str, layout: dict, dtype: str | None = None) -> dict[str, int]:
    """The byte size of each part of a slice, from its shape, encoding and layout (and a raw slice's dtype)."""
    n = _numel(shape)
    if encoding in spec.FLOAT_ENCODINGS:
        return {"data": n * _itemsize(encoding)}
    if encoding == spec.ENC_RAW:
        return {"data": n * np.dtype(spec.RAW_DTYPES[dtype]).itemsize}
    if encoding == spec.ENC_NF4:
        return {"codes": (n + 1) // 2, "absmax": 4 * ((n + spec.NF4_BLOCK - 1) // spec.NF4_BLOCK)}
    if encoding == spec.ENC_NF4DQ:
        nb = (n + spec.NF4DQ_BLOCK - 1) // spec.NF4DQ_BLOCK
        return {"codes": (n + 1) // 2, "absmax_q": nb, "absmax_scale": 4 * ((nb + spec.NF4DQ_GROUP - 1) // spec.NF4DQ_GROUP),
                "absmax_offset": 4}
    if encoding in spec.INTDQ_BITS:  # 1.7: ceil(n b / 8) code bytes, then nf4dq's double-quantized scales
        nb = (n + spec.NF4DQ_BLOCK - 1) // spec.NF4DQ_BLOCK
        return {"codes": (n * spec.INTDQ_BITS[encoding] + 7) // 8, "absmax_q": nb,
                "absmax_scale": 4 * ((nb + spec.NF4DQ_GROUP - 1) // spec.NF4DQ_GROUP), "absmax_offset": 4}
    if encoding == spec.ENC_INT8:
        rows = shape[0] if len(shape) == 2 else 1
        if layout.get("kind") == spec.LAYOUT_NPU_INT8:
            q = layout["n_pad"] * sum(seg[2] for seg in layout["segments"])
        else:
            q = n
        return {"q": q, "scale": 4 * rows}
    raise KeyError(encoding)


def check_layout(shape: list[int], encoding: str, layout: dict) -> str | None:
    """Why a slice's layout record is inconsistent with its shape, or None."""
    if not isinstance(layout, dict) or "kind" not in layout:
        return "layout record missing"
    kind = layout["kind"]
    if kind == spec.LAYOUT_ROW_MAJOR:
        return None if layout == {"kind": kind} else "row_major layout has extra keys"
    if kind != spec.LAYOUT_NPU_INT8:
        return f"unknown layout {kind!r}"
    if len(shape) != 2:
        return "npu_int8 layout needs a 2-D slice"
    from orkpack.layout import npu_layout

    ks = layout.get("k_segment")
    if not isinstance(ks, int) or isinstance(ks, bool) or ks <= 0 or ks % spec.NPU_TILE_K:
        return "npu_int8 k_segment invalid"
    segs = layout.get("segments")
    if not all(_is_int(d) and d >= 1 for d in shape) or not isinstance(segs, list) or len(segs) != -(-shape[1] // ks):
        return "npu_int8 layout record does not match the slice shape"
    try:
        want = npu_layout(shape[0], shape[1], k_segment=ks)
    except ValueError as e:
        return str(e)
    if layout != want:
        return "npu_int8 layout record does not match the slice shape"
    return None


# The widest k_segment a reader takes in an nf4 slice's inflate record: the load paths (kernels/runtime.c,
# liborkpack) take it as an int64. A wider one is a damaged record, as liborkpack says (exit 1).
MAX_INFLATE_K_SEGMENT = (1 << 63) - 1


def inflate_k_segment(rec) -> int | None:
    """The k_segment of an NPU nf4 slice's inflate record (docs/FORMAT.md 5) when it is one the load paths
    take (an int, a multiple of 32, 32 <= k_segment < 2**63), else None."""
    lay = rec.get("layout") if isinstance(rec, dict) else None
    ks = lay.get("k_segment") if isinstance(lay, dict) else None
    if not _is_int(ks) or ks < spec.NPU_TILE_K or ks % spec.NPU_TILE_K or ks > MAX_INFLATE_K_SEGMENT:
        return None
    return ks


def runtime_k_segment(k: int, ks: int) -> int:
    """The k_segment to hand the C load paths for a slice of K = k columns: ``ks`` itself, or, when it is
    at least k (one segment either way), the same single-segment tiling with a width that cannot overflow
    the runtime's int64 arithmetic (k + ks - 1)."""
    return ks if ks < k else max(spec.NPU_TILE_K, -(-int(k) // 64) * 64)


class Pack:
    """An open pack: ``Pack.open(path)``; use as a context manager."""

    def __init__(self, path: Path, preamble: Preamble, header: dict, mm: mmap.mmap | None, fd: int):
        self.path = path
        self.preamble = preamble
        self.header = header
        self.tensors: list[dict] = header["tensors"]
        self._mm = mm
        self._fd = fd

    # -- opening ----------------------------------------------------------
    @classmethod
    def open(cls, path: Path | str) -> "Pack":
        path = Path(path)
        label = escape_name(str(path))
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise PackError(f"{label}: no such file") from None
        except IsADirectoryError:
            raise PackError(f"{label}: is a folder, not a pack") from None
        except OSError as e:
            raise PackError(f"{label}: cannot open ({e.strerror})") from None
        try:
            return cls._open_fd(path, fd, label)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _open_fd(cls, path: Path, fd: int, label: str) -> "Pack":
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise PackError(f"{label}: is a folder, not a pack")
        if not stat.S_ISREG(st.st_mode):
            raise PackError(f"{label}: not a regular file")
        size = st.st_size
        head = os.pread(fd, spec.PREAMBLE_BLOCK, 0)
        magic = head[:8]
        if magic != spec.MAGIC:
            if len(magic) == 8 and _bits_differ(magic, spec.MAGIC) <= 3:
                raise PackDamaged(f"{label}: damaged pack: the magic number is corrupted")
            raise PackError(f"{label}: not an orkpack file (build one with `orkpack build`)")
        if len(head) < spec.PREAMBLE_BLOCK:
            raise PackError(f"{label}: truncated pack ({size} bytes, less than the 4096-byte preamble); rebuild or re-copy it")
        p = Preamble(*struct.unpack_from(spec.PREAMBLE_FMT, head))
        block = bytearray(head)
        block[spec.PREAMBLE_XXH3_OFFSET : spec.PREAMBLE_XXH3_OFFSET + 8] = bytes(8)
        if xxhash.xxh3_64_intdigest(bytes(block)) != p.preamble_xxh3:
            raise PackDamaged(f"{label}: damaged pack: preamble checksum mismatch")
        if p.version_major > spec.VERSION_MAJOR:
            raise PackError(
                f"{label}: made by a newer orkpack (format {p.version_major}.{p.version_minor}, this one reads "
                f"{spec.VERSION_MAJOR}.x); upgrade orkpack"
            )
        if p.version_major < 1:
            raise PackDamaged(f"{label}: damaged pack: format version {p.version_major}.{p.version_minor} does not exist")
        bad = None
        if p.preamble_size != spec.PREAMBLE_SIZE or p.alignment != spec.ALIGN or p.data_offset != spec.PREAMBLE_BLOCK:
            bad = "preamble constants are wrong"
        elif p.flags & ~spec.KNOWN_FLAGS:
            bad = f"unknown flags 0x{p.flags & ~spec.KNOWN_FLAGS:x}"
        elif p.flags and p.version_minor < spec.VERSION_MINOR_ONLINE:
            bad = f"flags 0x{p.flags:x} in a format {p.version_major}.{p.version_minor} pack (they are 1.8's)"
        elif p.reserved != bytes(40):
            bad = "reserved preamble bytes are not zero"
        elif p.data_size % spec.ALIGN or p.header_offset != p.data_offset + p.data_size:
            bad = "data section bounds are inconsistent"
        elif p.file_size != p.header_offset + p.header_size:
            bad = "file size does not add up"
        elif p.header_size > spec.MAX_HEADER_SIZE or p.header_size == 0:
            bad = f"header size {p.header_size} is out of range"
        if bad:
            raise PackDamaged(f"{label}: damaged pack: {bad}")
        if size < p.file_size:
            raise PackError(f"{label}: truncated pack ({size} of {p.file_size} bytes); rebuild or re-copy it")
        if size > p.file_size:
            raise PackDamaged(f"{label}: damaged pack: {size - p.file_size} unexpected bytes after the end")
        hb = os.pread(fd, p.header_size, p.header_offset)
        if len(hb) != p.header_size:
            raise PackError(f"{label}: truncated pack (header cut short)")
        if xxhash.xxh3_64_intdigest(hb) != p.header_xxh3:
            raise PackDamaged(f"{label}: damaged pack: header checksum mismatch")
        header = parse_header_json(hb, label)
        problem = validate_header(header, p)
        if isinstance(problem, _Newer) and p.version_minor > spec.VERSION_MINOR_MAX:
            raise PackError(
                f"{label}: made by a newer orkpack (format {p.version_major}.{p.version_minor}, this one reads up to "
                f"{spec.VERSION_MAJOR}.{spec.VERSION_MINOR_MAX}): {problem}; upgrade orkpack"
            )
        prov = header.get("provenance") if isinstance(header, dict) else None
        rot = prov.get("rotation") if isinstance(prov, dict) else None
        if not problem and bool(p.flags & spec.FLAG_ONLINE_R4) != (isinstance(rot, dict) and rot.get("r4") is not None):
            problem = "the preamble's online-Hadamard flag and provenance.rotation.r4 disagree"
        if problem:
            raise PackDamaged(f"{label}: damaged pack: {problem}")
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None
        return cls(path, p, header, mm, fd)

    # -- access -------------------------------------------------------------
    def slices(self) -> Iterator[tuple[dict, dict]]:
        for t in self.tensors:
            for s in t["slices"]:
                yield t, s

    def part(self, part_rec: dict) -> np.ndarray:
        """A read-only uint8 view of one part, straight from the mapped file."""
        return np.frombuffer(self._mm, dtype=np.uint8, count=part_rec["size"], offset=part_rec["offset"])

    def typed_part(self, slice_rec: dict, name: str) -> np.ndarray:
        """One part of a slice as its element type (float32 scales, int8 codes, a raw slice's dtype, ...)."""
        if slice_rec["encoding"] == spec.ENC_RAW:
            dt = np.dtype(spec.RAW_DTYPES[slice_rec["dtype"]])
        else:
            dt = np.dtype(spec.PART_DTYPES[(slice_rec["encoding"], name)])
        return self.part(slice_rec["parts"][name]).view(dt)

    def typed_parts(self, slice_rec: dict) -> dict[str, np.ndarray]:
        return {k: self.typed_part(slice_rec, k) for k in slice_rec["parts"]}

    def host_copy_parts(self, slice_rec: dict) -> dict[str, np.ndarray] | None:
        """The typed parts of an NPU slice's host copy (nf4: codes uint8, absmax float32), or None."""
        hs = host_copy_slice(slice_rec)
        return None if hs is None else self.typed_parts(hs)

    def all_parts(self) -> Iterator[tuple[dict, dict, str, dict]]:
        """(tensor, slice, label, part record) for every part in the file, host copies included;
        label is the part name, "host copy codes" for a host copy's part."""
        for t, s in self.slices():
            for pn, pr in s["parts"].items():
                yield t, s, pn, pr
            hc = s.get("host_copy")
            if hc is not None:
                for pn, pr in hc["parts"].items():
                    yield t, s, f"host copy {pn}", pr

    def data_view(self) -> np.ndarray:
        p = self.preamble
        return np.frombuffer(self._mm, dtype=np.uint8, count=p.data_size, offset=p.data_offset)

    def check_data_checksum(self) -> bool:
        if self.preamble.data_size == 0:
            return xxhash.xxh3_64_intdigest(b"") == self.preamble.data_xxh3
        return xxhash.xxh3_64_intdigest(self.data_view()) == self.preamble.data_xxh3

    @staticmethod
    def part_checksum(view: np.ndarray) -> str:
        return xxhash.xxh3_64_hexdigest(view)

    def close(self) -> None:
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a caller still holds a view; the mapping goes with it
                pass
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def parse_header_json(hb: bytes, label: str) -> dict:
    """The header bytes as JSON, or PackDamaged (bad UTF-8/ASCII, bad JSON, nesting too deep)."""
    try:
        return json.loads(hb.decode("ascii"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise PackDamaged(f"{label}: damaged pack: header is not valid JSON ({escape_name(str(e), 120)})") from None
    except RecursionError:
        raise PackDamaged(f"{label}: damaged pack: header JSON nests too deep") from None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_hex16(v) -> bool:
    return isinstance(v, str) and len(v) == 16 and all(c in "0123456789abcdef" for c in v)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# A dimension above this is refused outright (no real tensor is 2**48 wide); the
# element count is also bounded by the data section before any layout is built.
MAX_DIM = 1 << 48


def validate_header(h, p: Preamble) -> str | None:
    """Why a parsed header is inconsistent with itself or the preamble, or None.

    Hostile input: every field a reader or ``orkpack inspect`` touches is type
    checked here, and every count, shape and offset is bounded by the data
    section before anything is sized from it (a slice needs at least half a
    byte per element, so its element count is at most 2 x the data section).
    """
    if not isinstance(h, dict) or h.get("format") != "orkpack" or not isinstance(h.get("tensors"), list):
        return "header is not an orkpack header"
    for key in ("tool", "provenance", "config", "model", "tiermap"):
        if h.get(key) is not None and not isinstance(h[key], dict):
            return f"header key {key!r} is not an object"
    if len(h["tensors"]) > spec.MAX_TENSORS:
        return "too many tensors"
    lo, hi = p.data_offset, p.header_offset
    max_numel = 2 * max(0, hi - lo) + 2
    spans = []
    for t in h["tensors"]:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("slices"), list):
            return "malformed tensor record"
        name = escape_name(t["name"])
        if len(t["name"].encode("utf-8", "surrogatepass")) > spec.MAX_NAME_BYTES:
            return f"tensor name too long ({name})"
        if not isinstance(t.get("source_name"), str) or not isinstance(t.get("source_dtype"), str):
            return f"{name}: source_name or source_dtype missing"
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > spec.MAX_DIMS or not all(_is_int(d) and 0 <= d <= MAX_DIM for d in shape):
            return f"{name}: bad shape"
        # a tensor is one slice covering it ("expert": null), whatever its rank (a raw tensor always is); a 3-D
        # tensor whose first slice has an expert index is a stack of experts, one slice per expert
        first = t["slices"][0] if t["slices"] and isinstance(t["slices"][0], dict) else {}
        raw = first.get("encoding") == spec.ENC_RAW
        stacked = len(shape) == 3 and not raw and first.get("expert", "missing") is not None
        if stacked:
            if len(t["slices"]) != shape[0]:
                return f"{name}: {len(t['slices'])} slices for {shape[0]} experts"
        elif len(t["slices"]) != 1:
            return f"{name}: a {len(shape)}-D {'raw ' if raw else ''}tensor must have one slice"
        for i, s in enumerate(t["slices"]):
            if not isinstance(s, dict):
                return f"{name}: malformed slice"
            enc, sshape = s.get("encoding"), s.get("shape")
            if not isinstance(enc, str) or enc not in spec.ENCODINGS:
                return _Newer(f"{name}: unknown encoding {escape_name(repr(enc), 40)}")
            if s.get("tier") not in spec.TIERS:
                return f"{name}: unknown tier {escape_name(repr(s.get('tier')), 40)}"
            if enc == spec.ENC_RAW:
                dt = s.get("dtype")
                if not isinstance(dt, str) or dt not in spec.RAW_DTYPES:
                    return _Newer(f"{name}: unknown raw element type {escape_name(repr(dt), 40)}")
                if not raw:
                    return f"{name}: a raw slice must be its tensor's only slice"
                if s["tier"] != spec.TIER_HOST:
                    return f"{name}: raw slices live on the host (tier {s['tier']!r})"
                if s.get("min_m") is not None or s.get("sqnr_db") is not None or "inflate" in s:
                    return f"{name}: a raw slice has no min_m, sqnr_db or inflate record"
            want_shape = shape[1:] if stacked else shape
            want_expert = i if stacked else None
            expert = s.get("expert", "missing")
            if sshape != want_shape or expert != want_expert or isinstance(expert, bool):
                return f"{name}: slice {i} shape or expert index does not match the tensor"
            if _numel(sshape) > max_numel:
                return f"{name}: shape {sshape} cannot fit in the data section"
            if s.get("sqnr_db") is not None and not _is_num(s["sqnr_db"]):
                return f"{name}: sqnr_db is not a number"
            why = check_layout(sshape, enc, s.get("layout"))  # (it wants the slice's own shape values ints)
            if why:
                return f"{name}: {why}"
            # the shape and expert index equal the tensor's by Python's == (64.0, 6.4e1 and true pass): from
            # here on, hold the tensor's ints, as liborkpack does, so that nothing is sized from a float
            sshape = s["shape"] = list(want_shape)
            s["expert"] = want_expert
            if enc == spec.ENC_INT8 and len(sshape) > 2:
                return f"{name}: int8 slices are 1-D or 2-D"
            if s["layout"]["kind"] == spec.LAYOUT_NPU_INT8 and (enc != spec.ENC_INT8 or s["tier"] != spec.TIER_NPU):
                return f"{name}: npu_int8 layout is only for int8 slices on the NPU"
            if (enc == spec.ENC_NF4DQ or enc in spec.INTDQ_BITS) and s["tier"] != spec.TIER_HOST:
                return f"{name}: {enc} slices live on the host (an NPU slice is int8, or nf4 to inflate)"
            if s["tier"] == spec.TIER_NPU:
                m = s.get("min_m")
                if not _is_int(m) or m < 2:
                    return f"{name}: NPU slice min_m {escape_name(repr(m), 40)} (must be >= 2: M = 1 never goes to the NPU)"
                if enc == spec.ENC_NF4:
                    inf = s.get("inflate")
                    if not isinstance(inf, dict) or not isinstance(inf.get("layout"), dict) or not _is_int(inf.get("q_size")) \
                            or inf["q_size"] < 0 or not _is_hex16(inf.get("q_xxh3")) or not _is_hex16(inf.get("scale_xxh3")):
                        return f"{name}: NPU nf4 slice has no valid inflate record"
            elif s.get("min_m") is not None and not _is_int(s["min_m"]):
                return f"{name}: min_m is not an integer"
            parts = s.get("parts")
            sizes = expected_part_sizes(sshape, enc, s["layout"], s.get("dtype"))
            if not isinstance(parts, dict) or list(parts) != list(spec.PARTS[enc]):
                return f"{name}: parts are not {list(spec.PARTS[enc])}"
            why = _check_parts(parts, sizes, name, "", name, lo, hi, spans)
            if why:
                return why
            if "host_copy" in s:
                why = _check_host_copy(s, name, lo, hi, spans)
                if why:
                    return why
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            return f"parts of {an} and {bn} overlap"
    return None


def _check_host_copy(s: dict, name: str, lo: int, hi: int, spans: list) -> str | None:
    """Why an NPU slice's host copy record (format 1.2, docs/FORMAT.md 8) is inconsistent, or None;
    its parts join ``spans`` so that the overlap check covers them like any part."""
    hc = s["host_copy"]
    if not isinstance(hc, dict):
        return f"{name}: host_copy is not an object"
    enc = hc.get("encoding")
    if not isinstance(enc, str) or enc not in spec.HOST_COPY_ENCODINGS:
        return _Newer(f"{name}: unknown host copy encoding {escape_name(repr(enc), 40)}")
    if s["tier"] != spec.TIER_NPU:
        return f"{name}: a {s['tier']} slice has a host copy (only NPU slices have one)"
    if s["encoding"] not in (spec.ENC_INT8, spec.ENC_NF4) or len(s["shape"]) != 2:
        return f"{name}: a host copy belongs to a 2-D int8 or nf4 NPU slice"
    if hc.get("layout") != {"kind": spec.LAYOUT_ROW_MAJOR}:
        return f"{name}: host copy layout must be row_major"
    if hc.get("sqnr_db") is not None and not _is_num(hc["sqnr_db"]):
        return f"{name}: host copy sqnr_db is not a number"
    parts = hc.get("parts")
    if not isinstance(parts, dict) or list(parts) != list(spec.PARTS[enc]):
        return f"{name}: host copy parts are not {list(spec.PARTS[enc])}"
    sizes = expected_part_sizes(s["shape"], enc, hc["layout"])
    return _check_parts(parts, sizes, name, "host copy ", f"{name} (host copy)", lo, hi, spans)


def _check_parts(parts: dict, sizes: dict, name: str, what: str, span_name: str, lo: int, hi: int,
                 spans: list) -> str | None:
    """Why a parts record (``what``: "" for a slice's own, "host copy " for its copy) is inconsistent, or
    None; each part must be well-typed, checksummed, the size its shape and encoding give, aligned and
    inside the data section [lo, hi). Its spans join ``spans`` for the overlap check."""
    for pn, pr in parts.items():
        if not isinstance(pr, dict) or not _is_int(pr.get("offset")) or not _is_int(pr.get("size")):
            return f"{name}: malformed {what}part {pn}"
        if not _is_hex16(pr.get("xxh3")):
            return f"{name}: {what}part {pn} has no checksum"
        off, size = pr["offset"], pr["size"]
        if size != sizes[pn]:
            return f"{name}: {what}part {pn} is {size} bytes, its shape and encoding say {sizes[pn]}"
        if off % spec.ALIGN or off < lo or off + size > hi:
            return f"{name}: {what}part {pn} at {off}+{size} is outside the data section or unaligned"
        spans.append((off, off + size, span_name))
    return None


def host_copy_slice(s: dict) -> dict | None:
    """An NPU slice's host copy as a host slice record (expert, shape, encoding, tier "host", layout,
    parts, sqnr_db), for code that reads slices; None when the slice has no host copy."""
    hc = s.get("host_copy")
    if hc is None:
        return None
    return {"expert": s.get("expert"), "shape": s["shape"], "encoding": hc["encoding"], "tier": spec.TIER_HOST,
            "layout": hc["layout"], "parts": hc["parts"], "sqnr_db": hc.get("sqnr_db")}
