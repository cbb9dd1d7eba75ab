"""``orkpack verify``: load a pack the way the board does and prove that what lands in NPU
memory is, bit for bit, what the pack promises.

Checks, in this order (stopping at the first failure unless ``keep_going``):

1. ``open``       preamble and header checksums, sizes, header consistency (Pack.open)
2. ``data``       the data-section checksum (every byte between preamble and header)
3. ``parts``      each part's own checksum (names the tensor a damaged byte belongs to); raw
                  slices (non-float tensors carried verbatim) are checked here like any part
4. ``layout``     offsets in range, aligned, not overlapping; sizes match shape/encoding/layout;
                  NPU slices are 2-D int8 tiles or nf4 with an ``inflate`` record
5. ``arena``      every NPU slice placed in the IOVA arena within its cap
6. ``load``       every NPU slice through its load path (int8: fill; nf4: direct or two-step
                  inflate) into a backend buffer, cleaned, equals its recorded image checksums
7. ``min_m``      every NPU slice has min_m >= 2 (M = 1 never goes to the NPU)
8. ``reference``  (``reference=True``) each quantized slice decoded by the numpy reference and
                  by the C path, compared byte for byte

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

from orkpack.errors import PackError, escape_name
from orkpack.layout import npu_layout, untile_int8, tile_int8
from orkpack.pack import spec
from orkpack.pack.reader import Pack, PackDamaged, check_layout, expected_part_sizes
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
) -> Result:
    """Run every check on one pack; never raises for a bad pack (see Result.exit_code)."""
    if inflate not in inf.METHODS:
        raise ValueError(f"inflate must be one of {inf.METHODS}")
    backend = backend or HostBackend()
    res = Result(str(path))
    res.stats = {
        "device": backend.name, "inflate": inflate, "threads": int(threads),
        "slices": 0, "npu_slices": 0,
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
            _checks(pack, run, backend, inflate, pool, reference)
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
    for t, s in pack.slices():
        for pn, pr in s["parts"].items():
            yield t, s, pn, pr


def _checks(pack: Pack, run: _Run, backend, method: str, pool, reference: bool) -> None:
    res = run.res
    slices = list(pack.slices())
    res.stats["slices"] = len(slices)
    npu = [(t, s) for t, s in slices if s.get("tier") == spec.TIER_NPU]
    res.stats["npu_slices"] = len(npu)

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
        why = _layout_problem(pack, s)
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
        for t, s in slices:
            if s["encoding"] not in (spec.ENC_INT8, spec.ENC_NF4) or id(s) in bad:
                continue
            why = _reference_one(pack, s, backend, method, pool)
            if why:
                run.fail("reference", f"{slice_label(t, s)}: {why}")
            else:
                run.ok("reference")


def _npu_size(s: dict) -> int:
    n, k = s["shape"]
    if s["encoding"] == spec.ENC_NF4:
        return int(s["inflate"]["q_size"])
    return int(s["parts"]["q"]["size"])


def _is_hex16(v) -> bool:
    return isinstance(v, str) and len(v) == 16 and all(c in "0123456789abcdef" for c in v)


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
    ks = lay.get("k_segment") if isinstance(lay, dict) else None
    if not isinstance(ks, int) or ks < 32 or ks % 32:
        return "inflate layout has no valid k_segment"
    if lay != npu_layout(n, k, ks):
        return "inflate layout does not match the slice shape"
    if rec.get("q_size") != inf.tiled_size(n, k, ks):
        return f"inflate q_size {rec.get('q_size')!r} is not the tiled size {inf.tiled_size(n, k, ks)}"
    if not (_is_hex16(rec.get("q_xxh3")) and _is_hex16(rec.get("scale_xxh3"))):
        return "inflate record lacks its image checksums"
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
            ks = s["inflate"]["layout"]["k_segment"]
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
        ks = s["inflate"]["layout"]["k_segment"]
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
        lay = s["layout"]
        if not np.array_equal(tile_int8(untile_int8(q, n, k, lay), lay["k_segment"]), q):
            return "int8 tiles are not a valid npu_int8 image (non-zero padding)"
    return None
