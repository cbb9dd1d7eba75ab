"""``orkpack verify``: load a pack the way the board does and prove that what lands in NPU
memory is, bit for bit, what the pack promises.

Checks, in this order (stopping at the first failure unless ``keep_going``):

1. ``open``       preamble and header checksums, sizes, header consistency (Pack.open)
2. ``data``       the data-section checksum (every byte between preamble and header)
3. ``parts``      each part's own checksum (names the tensor a damaged byte belongs to); raw
                  slices (non-float tensors carried verbatim) and the host copies of dual-resident
                  NPU slices (format 1.2) are checked here like any part
4. ``layout``     offsets in range, aligned, not overlapping; sizes match shape/encoding/layout;
                  NPU slices are 2-D int8 tiles or nf4 with an ``inflate`` record; a host copy is
                  nf4, row_major, on an NPU slice
5. ``arena``      every NPU slice placed in the IOVA arena within its cap
6. ``load``       every NPU slice through its load path (int8: fill; nf4: direct or two-step
                  inflate) into a backend buffer, cleaned, equals its recorded image checksums
7. ``min_m``      every NPU slice has min_m >= 2 (M = 1 never goes to the NPU)
8. ``reference``  (``reference=True``) the activation-smoothing records hold together (each carrier's
                  scales fit the tensors it names, each matrix names its carrier back; an untied head's
                  columns are its embedding's times the recorded powers of two); each
                  quantized slice decoded by the numpy reference and
                  by the C path, compared byte for byte; each host copy likewise, and checked against
                  its NPU copy (:func:`_reference_host_copy`): byte-identical to an NPU copy stored
                  nf4; for int8 tiles, every element's two codes could come from one source value
                  and each row's scale is its blocks' absmax / 127 when K is a multiple of 64

Exit codes: 0 all passed, 1 a check failed (a damaged pack), 2 unusable input (not a pack,
truncated, newer version).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from orkpack.transforms.nf4 import pack_mode as nf4_pack_mode
from orkpack.errors import PackError, escape_name
from orkpack.layout import npu_layout, untile_int8, tile_int8
from orkpack.codecs import get_codec
from orkpack.pack import spec
from orkpack.pack.reader import (Pack, PackDamaged, check_layout, expected_part_sizes, inflate_k_segment,
                                 runtime_k_segment)
from orkpack.runtime import inflate as inf
from orkpack.runtime.arena import Arena, ArenaFull, cap_from_header
from orkpack.runtime.backends import HostBackend

CHECKS = ("open", "data", "parts", "layout", "arena", "load", "min_m", "reference")


class _Stop(Exception):
    pass


@dataclass
class Result:
    path: str
    exit_code: int = 0
    error: str | None = None  # unusable input (exit 2)
    failures: list[str] = field(default_factory=list)
    checks: dict = field(default_factory=lambda: {c: {"passed": 0, "failed": 0, "run": False} for c in CHECKS})
    stats: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "error": self.error,
            "failures": list(self.failures),
            "checks": {c: dict(self.checks[c]) for c in CHECKS},
            "stats": dict(self.stats),
        }


def slice_label(t: dict, s: dict) -> str:
    name = escape_name(str(t.get("name")))
    return name if s.get("expert") is None else f"{name}[expert {s.get('expert')}]"


class _Run:
    def __init__(self, res: Result, keep_going: bool):
        self.res, self.keep_going = res, keep_going

    def start(self, check: str) -> None:
        self.res.checks[check]["run"] = True

    def ok(self, check: str) -> None:
        self.res.checks[check]["passed"] += 1

    def fail(self, check: str, line: str) -> None:
        self.res.checks[check]["failed"] += 1
        self.res.failures.append(line)
        self.res.exit_code = max(self.res.exit_code, 1)
        if not self.keep_going:
            raise _Stop


def _gbps(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 and nbytes else None


def verify_pack(
    path: str | Path,
    *,
    backend=None,
    inflate: str = "direct",
    threads: int = 1,
    reference: bool = False,
    keep_going: bool = False,
    source: str | Path | None = None,
) -> Result:
    """Run every check on one pack; never raises for a bad pack (see Result.exit_code)."""
    if inflate not in inf.METHODS:
        raise ValueError(f"inflate must be one of {inf.METHODS}")
    backend = backend or HostBackend()
    res = Result(str(path))
    res.stats = {
        "device": backend.name, "inflate": inflate, "threads": int(threads),
        "slices": 0, "npu_slices": 0, "dual_slices": 0, "host_copy_bytes": 0,
        "bytes_filled": 0, "fill_seconds": 0.0, "fill_gbps": None,
        "bytes_inflated": 0, "inflate_seconds": 0.0, "inflate_gbps": None,
        "arena_used": 0, "arena_cap": None, "arena_cap_source": None,
    }
    run = _Run(res, keep_going)
    run.start("open")
    try:
        pack = Pack.open(path)
    except PackDamaged as e:
        res.checks["open"]["failed"] += 1
        res.failures.append(_without_path(str(e), path))
        res.exit_code = 1
        return res
    except PackError as e:
        res.error = str(e)
        res.exit_code = e.exit_code
        return res
    run.ok("open")
    pool = ThreadPoolExecutor(max_workers=threads) if threads > 1 else None
    try:
        with pack:
            _checks(pack, run, backend, inflate, pool, reference, source)
    except _Stop:
        pass
    finally:
        if pool is not None:
            pool.shutdown()
    st = res.stats
    st["fill_seconds"] = round(st["fill_seconds"], 6)
    st["inflate_seconds"] = round(st["inflate_seconds"], 6)
    st["fill_gbps"] = _gbps(st["bytes_filled"], st["fill_seconds"])
    st["inflate_gbps"] = _gbps(st["bytes_inflated"], st["inflate_seconds"])
    return res


def _without_path(line: str, path) -> str:
    """A reader's message without its leading ``PATH: ``: failures are shown under the pack's path already."""
    prefix = f"{escape_name(str(Path(path)))}: "  # as Pack.open names it
    return line[len(prefix):] if line.startswith(prefix) else line


def _parts_of(pack: Pack):
    """(tensor, slice, part label, part record) for every part, host copies' parts included
    (labelled "host copy codes", ...)."""
    yield from pack.all_parts()


def _checks(pack: Pack, run: _Run, backend, method: str, pool, reference: bool, ref_source=None) -> None:
    res = run.res
    slices = list(pack.slices())
    res.stats["slices"] = len(slices)
    npu = [(t, s) for t, s in slices if s.get("tier") == spec.TIER_NPU]
    res.stats["npu_slices"] = len(npu)
    dual = [s for _, s in slices if isinstance(s.get("host_copy"), dict)]
    res.stats["dual_slices"] = len(dual)
    res.stats["host_copy_bytes"] = sum(pr["size"] for s in dual for pr in s["host_copy"]["parts"].values())

    # 2. data section
    run.start("data")
    if pack.check_data_checksum():
        run.ok("data")
    else:
        where = "in the padding between parts"
        for t, s, pn, pr in _parts_of(pack):
            if Pack.part_checksum(pack.part(pr)) != pr["xxh3"]:
                where = f"in {slice_label(t, s)} part {pn}"
                break
        run.fail("data", f"data section checksum mismatch: damaged bytes {where}")

    # 3. parts
    run.start("parts")
    for t, s, pn, pr in _parts_of(pack):
        got = Pack.part_checksum(pack.part(pr))
        if got != pr["xxh3"]:
            run.fail("parts", f"{slice_label(t, s)}: part {pn} checksum mismatch (recorded {pr['xxh3']}, found {got})")
        else:
            run.ok("parts")

    # 4. layout
    run.start("layout")
    bad = set()  # slices whose layout is wrong are not loaded (keep_going)
    for t, s in slices:
        why = _layout_problem(pack, s) or _host_copy_problem(pack, s)
        if why:
            bad.add(id(s))
            run.fail("layout", f"{slice_label(t, s)}: {why}")
        else:
            run.ok("layout")
    npu = [(t, s) for t, s in npu if id(s) not in bad]
    spans = sorted((pr["offset"], pr["offset"] + pr["size"], slice_label(t, s)) for t, s, _, pr in _parts_of(pack))
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            run.fail("layout", f"{bn}: a part overlaps a part of {an}")

    # 5. arena
    run.start("arena")
    cap, source = cap_from_header(pack.header)
    arena = Arena(cap=cap)
    res.stats["arena_cap"], res.stats["arena_cap_source"] = cap, source
    for t, s in npu:
        try:
            arena.place(slice_label(t, s), _npu_size(s))
            run.ok("arena")
        except ArenaFull as e:
            run.fail("arena", f"{e} ({source})")
    res.stats["arena_used"] = arena.used

    # 6. load paths
    run.start("load")
    for t, s in npu:
        why = _load_one(pack, s, backend, method, pool, res.stats, reference=False)
        if why:
            run.fail("load", f"{slice_label(t, s)}: {why}")
        else:
            run.ok("load")

    # 7. min_m
    run.start("min_m")
    for t, s in npu:
        m = s.get("min_m")
        if isinstance(m, int) and not isinstance(m, bool) and m >= 2:
            run.ok("min_m")
        else:
            run.fail("min_m", f"{slice_label(t, s)}: NPU slice min_m is {m!r}, must be >= 2 (M = 1 never goes to the NPU)")

    # 8. reference
    if reference:
        run.start("reference")
        from orkpack.transforms.smoothed import check_pack, check_untied_values

        if any(t.get("smoothing") is not None for t in pack.tensors):  # activation smoothing (format 1.4)
            # its records must hold together, and an untied copy (the smoothed head) be its original times the scales
            why = check_pack(pack) or check_untied_values(pack)
            if why:
                run.fail("reference", f"smoothing: {why}")
            else:
                run.ok("reference")
        if any(t.get("rotation") is not None for t in pack.tensors) \
                or (pack.header.get("provenance") or {}).get("rotation") is not None:  # rotation (format 1.6)
            from orkpack.transforms.rotate import check_against_source, check_pack as check_rotation

            why = check_rotation(pack)
            if why:
                run.fail("reference", f"rotation: {why}")
            else:
                run.ok("reference")
                # with the source: each rotated tensor against it under the recorded rotation
                for why in (check_against_source(pack, ref_source) if ref_source is not None else []):
                    run.fail("reference", f"rotation: {why}")
        for t, s in slices:
            if s["encoding"] not in spec.QUANT_ENCODINGS or id(s) in bad:
                continue
            why = _reference_one(pack, s, backend, method, pool)
            if why:
                run.fail("reference", f"{slice_label(t, s)}: {why}")
            else:
                run.ok("reference")
            if s.get("host_copy") is not None:
                why = _reference_host_copy(pack, s)
                if why:
                    run.fail("reference", f"{slice_label(t, s)}: host copy: {why}")
                else:
                    run.ok("reference")


def _npu_size(s: dict) -> int:
    n, k = s["shape"]
    if s["encoding"] == spec.ENC_NF4:
        return int(s["inflate"]["q_size"])
    return int(s["parts"]["q"]["size"])


def _is_hex16(v) -> bool:
    return isinstance(v, str) and len(v) == 16 and all(c in "0123456789abcdef" for c in v)


def _npu_layout_of(s: dict) -> dict:
    """An int8 NPU slice's layout record rebuilt from its shape and k_segment: equal (==) to the record,
    which check_layout has compared, but with ints where the record may hold 32.0 or true."""
    n, k = s["shape"]
    return npu_layout(n, k, s["layout"]["k_segment"])


def _layout_problem(pack: Pack, s: dict) -> str | None:
    """Re-assert what the load paths rely on (Pack.open checks the same; a verifier trusts no one)."""
    p = pack.preamble
    enc, shape, layout = s["encoding"], s["shape"], s["layout"]
    why = check_layout(shape, enc, layout)
    if why:
        return why
    sizes = expected_part_sizes(shape, enc, layout, s.get("dtype"))
    for pn, pr in s["parts"].items():
        off, size = pr["offset"], pr["size"]
        if off % spec.ALIGN:
            return f"part {pn} offset {off} is not {spec.ALIGN}-aligned"
        if off < p.data_offset or off + size > p.header_offset:
            return f"part {pn} at {off}+{size} lies outside the data section"
        if size != sizes.get(pn):
            return f"part {pn} is {size} bytes, its shape and encoding say {sizes.get(pn)}"
    if s["tier"] != spec.TIER_NPU:
        return None
    if len(shape) != 2 or min(shape) < 1:
        return f"NPU slice has shape {shape}, not a non-empty 2-D matrix"
    n, k = shape
    if enc == spec.ENC_INT8:
        if layout.get("kind") != spec.LAYOUT_NPU_INT8:
            return "NPU int8 slice is not in the npu_int8 tile layout"
        return None
    if enc != spec.ENC_NF4:
        return f"NPU slice has encoding {enc}; the NPU takes int8 tiles or nf4 to inflate"
    rec = s.get("inflate")
    if not isinstance(rec, dict):
        return "NPU nf4 slice has no inflate record"
    lay = rec.get("layout")
    ks = inflate_k_segment(rec)  # an int64 multiple of 32 (liborkpack refuses a wider one too)
    if ks is None:
        return "inflate layout has no valid k_segment"
    if lay != npu_layout(n, k, ks):
        return "inflate layout does not match the slice shape"
    size = inf.tiled_size(n, k, runtime_k_segment(k, ks))
    if rec.get("q_size") != size:
        return f"inflate q_size {rec.get('q_size')!r} is not the tiled size {size}"
    if not (_is_hex16(rec.get("q_xxh3")) and _is_hex16(rec.get("scale_xxh3"))):
        return "inflate record lacks its image checksums"
    return None


def _host_copy_problem(pack: Pack, s: dict) -> str | None:
    """Re-assert the host copy's structure (docs/FORMAT.md 8; Pack.open checks the same)."""
    if "host_copy" not in s:
        return None
    hc = s["host_copy"]
    if not isinstance(hc, dict) or hc.get("encoding") not in spec.HOST_COPY_ENCODINGS:
        return "host copy is not an nf4 record"
    if s["tier"] != spec.TIER_NPU:
        return f"a {s['tier']} slice has a host copy (only NPU slices have one)"
    if hc.get("layout") != {"kind": spec.LAYOUT_ROW_MAJOR}:
        return "host copy layout is not row_major"
    p = pack.preamble
    sizes = expected_part_sizes(s["shape"], hc["encoding"], hc["layout"])
    if list(hc.get("parts", {})) != list(sizes):
        return f"host copy parts are not {list(sizes)}"
    for pn, pr in hc["parts"].items():
        off, size = pr["offset"], pr["size"]
        if off % spec.ALIGN:
            return f"host copy part {pn} offset {off} is not {spec.ALIGN}-aligned"
        if off < p.data_offset or off + size > p.header_offset:
            return f"host copy part {pn} at {off}+{size} lies outside the data section"
        if size != sizes[pn]:
            return f"host copy part {pn} is {size} bytes, its shape and encoding say {sizes[pn]}"
    return None


def _load(pack: Pack, s: dict, backend, method: str, pool, stats: dict):
    """Load one NPU slice through its path: (buffer, q view, scale float32[N])."""
    n, k = s["shape"]
    size = _npu_size(s)
    buf = backend.alloc(size)
    q = buf.view[:size]
    try:
        if s["encoding"] == spec.ENC_INT8:
            src = pack.part(s["parts"]["q"])
            t0 = time.perf_counter()
            inf.fill(q, src, clean=backend.c_clean, pool=pool)
            backend.sync(buf, 0, size)
            stats["fill_seconds"] += time.perf_counter() - t0
            stats["bytes_filled"] += size
            scale = np.frombuffer(pack.part(s["parts"]["scale"]).tobytes(), dtype=np.float32)
        else:
            ks = runtime_k_segment(k, s["inflate"]["layout"]["k_segment"])
            scale = np.empty(n, dtype=np.float32)
            codes, ab = pack.part(s["parts"]["codes"]), pack.part(s["parts"]["absmax"])
            t0 = time.perf_counter()
            inf.inflate_into(codes, ab, n, k, q, scale, method=method, k_segment=ks, pool=pool)
            backend.sync(buf, 0, size)
            stats["inflate_seconds"] += time.perf_counter() - t0
            stats["bytes_inflated"] += size
    except BaseException:
        del q
        backend.free(buf)
        raise
    return buf, q, scale


def _load_one(pack: Pack, s: dict, backend, method: str, pool, stats: dict, reference: bool) -> str | None:
    try:
        buf, q, scale = _load(pack, s, backend, method, pool, stats)
    except ValueError as e:
        return f"cannot load: {e}"

    try:
        if s["encoding"] == spec.ENC_INT8:
            want_q, want_s = s["parts"]["q"]["xxh3"], s["parts"]["scale"]["xxh3"]
            what = "filled"
        else:
            want_q, want_s = s["inflate"]["q_xxh3"], s["inflate"]["scale_xxh3"]
            what = f"inflated ({method})"
        got_q, got_s = xxhash.xxh3_64_hexdigest(q), xxhash.xxh3_64_hexdigest(scale)
        if got_q != want_q:
            return f"{what} int8 tiles differ from the recorded image (q_xxh3 {want_q}, loaded {got_q})"
        if got_s != want_s:
            return f"{what} scales differ from the recorded image (scale_xxh3 {want_s}, loaded {got_s})"
        return None
    finally:
        del q
        backend.free(buf)


def _reference_one(pack: Pack, s: dict, backend, method: str, pool) -> str | None:
    from orkpack.codecs.reference import nf4_decode

    enc, shape = s["encoding"], s["shape"]
    if enc == spec.ENC_NF4 and s["tier"] == spec.TIER_NPU:
        n, k = shape
        ks = runtime_k_segment(k, s["inflate"]["layout"]["k_segment"])
        codes, ab = pack.part(s["parts"]["codes"]), pack.part(s["parts"]["absmax"])
        rq, rs, _ = inf.inflate_reference(codes, ab.view(np.float32), (n, k), ks)
        buf, q, scale = _load(pack, s, backend, method, pool, {"inflate_seconds": 0.0, "bytes_inflated": 0})
        try:
            if not np.array_equal(q.view(np.int8), rq):
                bad = int(np.flatnonzero(q.view(np.int8) != rq)[0])
                return f"C {method} inflate differs from the numpy reference at tile byte {bad}"
            if not np.array_equal(scale.view(np.uint32), rs.view(np.uint32)):
                return f"C {method} inflate scales differ from the numpy reference"
        finally:
            del q
            backend.free(buf)
        return None
    if enc == spec.ENC_NF4DQ or enc in spec.INTDQ_BITS:
        return _reference_nf4dq(pack, s)
    if enc == spec.ENC_NF4:
        n = int(np.prod(shape, dtype=np.int64))
        codes, ab = pack.part(s["parts"]["codes"]), pack.part(s["parts"]["absmax"])
        with np.errstate(invalid="ignore", over="ignore"):
            want = nf4_decode(codes, ab.view(np.float32), (n,))
        got = inf.nf4_decode_c(codes, ab, n)
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            return "C nf4 decode differs from the numpy reference"
        return None
    # int8
    q = pack.part(s["parts"]["q"]).view(np.int8)
    if np.any(q == -128):
        return "int8 codes hold -128 (the codec's range is -127..127)"
    sc = pack.part(s["parts"]["scale"]).view(np.float32)
    if not np.all(np.isfinite(sc)) or np.any(sc < 0):
        return "int8 scales are negative or not finite"
    if s["layout"].get("kind") == spec.LAYOUT_NPU_INT8:
        n, k = shape
        lay = _npu_layout_of(s)
        if not np.array_equal(tile_int8(untile_int8(q, n, k, lay), lay["k_segment"]), q):
            return "int8 tiles are not a valid npu_int8 image (non-zero padding)"
    return None


# NF4 code c holds the scaled values in (MIDPOINTS[c-1], MIDPOINTS[c]], the ends closed at -1 and 1
_NF4_LO = None
_NF4_HI = None
# relative slack for float32 rounding in the encoders (their error is ~1e-7 of the block / row maximum)
_SLACK = 1e-5
# blocks / rows with a maximum this small are not checked: the encoders clamp their reciprocals there
_TINY = 1e-30
_CHUNK = 1 << 18  # elements per step of the consistency check (bounds its memory)


def _nf4_edges():
    global _NF4_LO, _NF4_HI
    if _NF4_LO is None:
        from orkpack.codecs.reference import MIDPOINTS

        mid = MIDPOINTS.astype(np.float64)
        _NF4_LO = np.concatenate([[-1.0], mid])
        _NF4_HI = np.concatenate([mid, [1.0]])
    return _NF4_LO, _NF4_HI


def _nf4dq_absmax(pack: Pack, s: dict) -> np.ndarray:
    """An nf4dq slice's per-block float32 absmax (FORMAT.md 3)."""
    from orkpack.codecs.reference import nf4dq_absmax

    p = pack.typed_parts(s)
    return nf4dq_absmax(p["absmax_q"], p["absmax_scale"], p["absmax_offset"])


def _reference_nf4dq(pack: Pack, s: dict) -> str | None:
    """An nf4dq slice (or host copy), or an int5dq / int6dq / int8dq slice (the same double-quantized scales): its
    scales and offset finite, scales >= 0 (a group's max |absmax - offset|), and the C decode equal to the numpy
    reference's, bit for bit."""
    from orkpack.codecs.reference import intdq_decode, nf4dq_decode

    enc = s["encoding"]
    p = pack.typed_parts(s)
    sc, off = p["absmax_scale"], p["absmax_offset"]
    if not np.all(np.isfinite(sc)) or np.any(sc < 0) or not np.all(np.isfinite(off)):
        return f"{enc} absmax scales are negative or not finite, or its offset is not finite"
    n = int(np.prod(s["shape"], dtype=np.int64))
    with np.errstate(invalid="ignore", over="ignore"):
        if enc == spec.ENC_NF4DQ:
            want = nf4dq_decode(p["codes"], p["absmax_q"], sc, off, (n,))
            got = inf.nf4dq_decode_c(p["codes"], p["absmax_q"], sc, off, n)
        else:
            want = intdq_decode(p["codes"], p["absmax_q"], sc, off, (n,), spec.INTDQ_BITS[enc])
            got = get_codec(enc).decode_range(p, 0, n)
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        return f"C {enc} decode differs from the numpy reference"
    return None


def _reference_host_copy(pack: Pack, s: dict) -> str | None:
    """What ``--reference`` proves of an NPU slice's host copy (there is no source at verify time):

    * its C nf4 decode equals the numpy reference (as for any host nf4 slice), absmax finite, >= 0;
    * NPU copy stored nf4: the host copy is byte-identical to it (both are the NF4 encoding of the
      same source slice, docs/FORMAT.md 8);
    * NPU copy as int8 tiles: the two copies are consistent, i.e. for every element there is a
      source value that NF4 codes to the host copy's code (under its block absmax) and int8 codes to
      the tile's value (under its row scale), within a float32 rounding slack of 1e-5 of the block /
      row maximum; and when K is a multiple of 64 (blocks never straddle rows) each row's int8 scale
      is exactly float32(max of the row's block absmaxes / 127). A host copy of another tensor or
      expert, or a changed code, fails this; requantizing the host copy to int8 would not give the
      tiles (one NF4 step spans 10 to 40 int8 steps), so that is not what is compared.
    * an int5dq / int6dq host copy (1.8, the host low level's format): its C decode equals the numpy
      reference, and it is consistent with the int8 tiles as above, its code c standing for the values
      (c -/+ 1/2) x the block's step (its lowest and highest codes for anything beyond).

    A pack whose ``provenance.nf4.mode`` is ``opt`` (the default since issue 16) chose each block's
    absmax to minimize the error: it may be negative, codes 0 and 15 stand for any value beyond
    their midpoint (clipping), and the row scale is not tied to the absmaxes; the rest holds as above.
    """
    from orkpack.codecs.reference import nf4_decode
    from orkpack.pack.reader import host_copy_slice

    hs = host_copy_slice(s)
    n, k = s["shape"]
    numel = n * k
    codes = pack.part(hs["parts"]["codes"])
    bits = spec.INTDQ_BITS.get(hs["encoding"])  # an int5dq / int6dq copy (1.8): integer codes under each block's step
    if hs["encoding"] == spec.ENC_NF4DQ or bits:  # always the error-minimizing encoders (FORMAT.md 3)
        why = _reference_nf4dq(pack, hs)
        if why:
            return why
        absmax, block, opt = _nf4dq_absmax(pack, hs), spec.NF4DQ_BLOCK, True
    else:
        ab = pack.part(hs["parts"]["absmax"])
        absmax, block = ab.view(np.float32), spec.NF4_BLOCK
        # an opt-mode pack (provenance.nf4) chooses each block's scale: it may clip the block's largest values
        # (codes 0 / 15 then stand for anything beyond) or be negative (the codebook flipped)
        opt = nf4_pack_mode(pack.header) == "opt"
        if not np.all(np.isfinite(absmax)) or (not opt and np.any(absmax < 0)):
            return "nf4 absmax values are negative or not finite"
        want = nf4_decode(codes, absmax, (numel,))
        got = inf.nf4_decode_c(codes, ab, numel)
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            return "C nf4 decode differs from the numpy reference"
        del want, got
    if s["encoding"] == spec.ENC_NF4:
        if hs["encoding"] != spec.ENC_NF4:
            return f"an NPU slice stored nf4 has a {hs['encoding']} host copy; its copy is the same nf4 bytes"
        for pn in ("codes", "absmax"):
            if not np.array_equal(pack.part(s["parts"][pn]), pack.part(hs["parts"][pn])):
                return f"part {pn} differs from the NPU copy's (both are the nf4 encoding of one source slice)"
        return None
    # int8 tiles
    q2 = untile_int8(pack.part(s["parts"]["q"]).view(np.int8), n, k, _npu_layout_of(s))
    scale = pack.part(s["parts"]["scale"]).view(np.float32)
    if not np.all(np.isfinite(scale)) or np.any(scale < 0):
        return "int8 scales of the NPU copy are negative or not finite"
    if k % spec.NF4_BLOCK == 0 and not opt:
        row_amax = absmax.reshape(n, k // spec.NF4_BLOCK).max(axis=1)
        want_scale = (row_amax / np.float32(127)).astype(np.float32)
        off = np.flatnonzero(want_scale.view(np.uint32) != scale.view(np.uint32))
        if off.size:
            r = int(off[0])
            return (f"row {r}: the NPU copy's int8 scale {float(scale[r])!r} is not the host copy's row absmax / 127 "
                    f"({float(want_scale[r])!r}): the copies are not of one source slice")
    if bits:  # code c of an intdq copy stands for [c - 1/2, c + 1/2] steps (rounded to nearest), its extremes for
        from orkpack.codecs.reference import intdq_levels, intdq_unpack  # anything beyond (clipped)

        lo_c, hi_c = intdq_levels(bits)
        grid = np.arange(lo_c, hi_c + 1, dtype=np.float64)
        lo_edge, hi_edge = grid - 0.5, grid + 0.5
        lo_edge[0], hi_edge[-1] = -np.inf, np.inf
        ints = intdq_unpack(codes, numel, bits)
    else:
        lo_edge, hi_edge = _nf4_edges()
        if opt:
            lo_edge, hi_edge = lo_edge.copy(), hi_edge.copy()
            lo_edge[0], hi_edge[15] = -np.inf, np.inf
    rows = max(1, _CHUNK // k)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        idx = np.arange(r0 * k, r1 * k, dtype=np.int64)
        if bits:
            c = ints[r0 * k: r1 * k] - lo_c  # the code's index in the grid
        else:
            byte = codes[idx >> 1]
            c = np.where(idx & 1, byte & 15, byte >> 4)
        a = absmax[idx // block].astype(np.float64)
        with np.errstate(invalid="ignore"):  # inf x 0 (an all-zero block: not checked)
            n_lo, n_hi = lo_edge[c] * a, hi_edge[c] * a
        n_lo, n_hi = np.minimum(n_lo, n_hi), np.maximum(n_lo, n_hi)  # a negative absmax flips the interval
        sc = np.repeat(scale[r0:r1].astype(np.float64), k)
        qv = q2[r0:r1].ravel().astype(np.float64)
        i_lo, i_hi = (qv - 0.5) * sc, (qv + 0.5) * sc
        slack = _SLACK * (np.abs(a) + 127.0 * sc)
        bad = (np.maximum(n_lo, i_lo) > np.minimum(n_hi, i_hi) + slack) & (np.abs(a) > _TINY) & (sc * 127.0 > _TINY)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            r, col = r0 + j // k, j % k
            code = f"{hs['encoding']} code {int(c[j]) + lo_c}" if bits else f"nf4 code {int(c[j])}"
            return (f"element [{r}, {col}]: {code} (values {n_lo[j]:.6g}..{n_hi[j]:.6g}) and int8 tile "
                    f"{int(qv[j])} (values {i_lo[j]:.6g}..{i_hi[j]:.6g}) cannot come from one source value")
    return None
