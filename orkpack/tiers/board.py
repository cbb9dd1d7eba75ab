"""Board profiles: memory budgets and the cost model of one RK3588 board.

A board is a small TOML file (schema in docs/TIERMAP.md): the hardware only. What depends on the
software that runs the pack (per-submit cost, NPU efficiency, CPU kernel rates, fixed costs, the
decode engine) is a runtime path (runtime.py); ``load_board(board, runtime)`` joins the two. The three shipped
boards live in ``tiermaps/boards/`` (the documented, commented copies) and are
installed as package data in ``orkpack/data/boards/`` (byte-identical copies,
kept in sync by ``python -m orkpack.tiers.regenerate`` and checked by a test),
so ``load_board("rk3588-32g")`` works from an editable and a normal install.
``load_board(path)`` takes a user's own file.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import OrkError, escape_name
from ..pack import spec
from ..pack.hostlevels import DEFAULT_HOST_HIGH, DEFAULT_HOST_LOW, HOST_HIGH, HOST_LOW, check_host_formats  # noqa: F401
from .runtime import DEFAULT_RUNTIME, TOML_KEYS, Runtime, load_runtime, runtime_from_json

BOARD_DIR = Path(__file__).resolve().parent.parent / "data" / "boards"
BOARD_SCHEMA = "orkpack.board"
BOARD_VERSION = 3
# The NF4 format of the build's host NF4 slices and host copies (orkpack build --nf4-format; pack/spec.py
# NF4_FORMATS, one list for the build and the planner): dq32 = the nf4dq encoding, b64 = nf4. A plan counts
# the bytes of one of them (cost.host_nf4_bytes); a tier map records it in its board block, and a map without
# it was planned at b64 (the only format before there were two).
NF4_FORMATS = tuple(spec.NF4_FORMATS)
DEFAULT_NF4_FORMAT = spec.NF4_DEFAULT_FORMAT
LEGACY_NF4_FORMAT = spec.NF4_B64
# the encodings of the build's two host levels (HOST_LOW, HOST_HIGH and their check: orkpack/pack/hostlevels.py)


@dataclass(frozen=True)
class Board:
    """The cost model of one board running one runtime path (docs/TIERMAP.md section 2).

    The hardware fields come from the board file (this module); the software fields (from
    ``npu_efficiency`` on) from the runtime path (runtime.py). ``load_board(board, runtime)`` joins them.
    """
    name: str
    engines: tuple[str, ...]  # the engines the plan may use: the board's that the runtime uses
    total_bytes: int
    reserve_bytes: int
    iova_cap_bytes: int
    iova_usable_bytes: int
    alloc_granularity: int
    k_align: int
    n_align: int
    k_segment: int
    npu_cores: int
    npu_ops_per_s_per_core: float
    npu_k_ref: int
    cpu_stream_bytes_per_s: float  # what the CPU cores stream (measured): physics
    npu_stream_bytes_per_s: float  # what the NPU streams (measured): physics
    # ---- the runtime path (runtime.Runtime)
    npu_efficiency: float
    npu_k_falloff: float
    submit_overhead_s: float
    cpu_int8_ops_per_s: float
    cpu_nf4_ops_per_s: float
    cpu_float_ops_per_s: float
    tile_read_factor: float
    decode_fraction: float
    decode_token_s: float
    request_s: float = 0.0
    decode_engine: str = "cpu"
    runtime: str = DEFAULT_RUNTIME
    board_engines: tuple[str, ...] = ()  # the board file's engines (the hardware)
    runtime_engines: tuple[str, ...] = ()  # the runtime's engines
    # ---- the build: the NF4 format its host NF4 slices and host copies are written in (NF4_FORMATS)
    nf4_format: str = DEFAULT_NF4_FORMAT
    # ---- the build: the encodings of its host low ("nf4") and high ("int8") items (HOST_LOW, HOST_HIGH)
    host_low: str = DEFAULT_HOST_LOW
    host_high: str = DEFAULT_HOST_HIGH
    source: str = field(default="", compare=False)

    @property
    def decode_bandwidth(self) -> float:
        """Bytes/s the runtime's CPU kernels stream: the cores' measured stream x the runtime's fraction."""
        return self.cpu_stream_bytes_per_s * self.decode_fraction

    @property
    def npu_decode_bandwidth(self) -> float:
        """Bytes/s an NPU-decoding runtime streams NPU tiles at: the NPU's measured stream x the fraction."""
        return self.npu_stream_bytes_per_s * self.decode_fraction

    @property
    def npu_ops_per_s(self) -> float:
        """Sustained int8 ops/s of the whole NPU for K <= k_ref (cores x per-core peak x efficiency)."""
        return self.npu_cores * self.npu_ops_per_s_per_core * self.npu_efficiency

    def cpu_ops(self, encoding: str) -> float:
        """Prefill GEMM ops/s of the host path for weights in ``encoding`` (int8, nf4, or a float one)."""
        return {"int8": self.cpu_int8_ops_per_s, "nf4": self.cpu_nf4_ops_per_s}.get(encoding, self.cpu_float_ops_per_s)

    def align(self, nbytes: int) -> int:
        """``nbytes`` rounded up to the allocation granularity."""
        g = self.alloc_granularity
        return -(-nbytes // g) * g

    def path(self) -> Runtime:
        """The runtime path of this cost model."""
        return Runtime(name=self.runtime, engines=self.runtime_engines or self.engines,
                       **{f: getattr(self, f) for f in TOML_KEYS})

    def to_json(self) -> dict:
        """The tier map's board block: the hardware, and the runtime path under "runtime"."""
        return {
            "name": self.name, "engines": list(self.board_engines or self.engines),
            "total_bytes": self.total_bytes, "reserve_bytes": self.reserve_bytes,
            "iova_cap_bytes": self.iova_cap_bytes, "iova_usable_bytes": self.iova_usable_bytes,
            "alloc_granularity": self.alloc_granularity, "k_align": self.k_align, "n_align": self.n_align,
            "k_segment": self.k_segment, "npu_cores": self.npu_cores,
            "npu_ops_per_s_per_core": self.npu_ops_per_s_per_core, "npu_k_ref": self.npu_k_ref,
            "cpu_stream_bytes_per_s": self.cpu_stream_bytes_per_s, "npu_stream_bytes_per_s": self.npu_stream_bytes_per_s,
            "runtime": self.path().to_json(), "nf4_format": self.nf4_format,
            # only when not the defaults: a default plan's map is what it was before there were host formats
            **({"host_low": self.host_low} if self.host_low != DEFAULT_HOST_LOW else {}),
            **({"host_high": self.host_high} if self.host_high != DEFAULT_HOST_HIGH else {}),
        }


_INT_FIELDS = ("total_bytes", "reserve_bytes", "iova_cap_bytes", "iova_usable_bytes", "alloc_granularity", "k_align",
               "n_align", "k_segment", "npu_cores", "npu_k_ref")
_HW_FLOATS = ("npu_ops_per_s_per_core", "cpu_stream_bytes_per_s", "npu_stream_bytes_per_s")
# a version-2 board block (tier maps planned before runtime paths): the software constants sat in the board
_LEGACY_FLOATS = ("npu_efficiency", "npu_k_falloff", "submit_overhead_s", "cpu_int8_ops_per_s", "cpu_nf4_ops_per_s",
                  "cpu_float_ops_per_s", "decode_bandwidth_bytes_per_s", "decode_token_s", "tile_read_factor")
LEGACY_RUNTIME = "board-v2"


def check_nf4_format(fmt: object, where: str) -> str:
    """``fmt`` when it names an NF4 format (NF4_FORMATS), else OrkError naming ``where``."""
    if fmt not in NF4_FORMATS:
        raise OrkError(f"{where}: nf4_format {escape_name(str(fmt), 40)!r} is not {' or '.join(NF4_FORMATS)}; plan again")
    return fmt


def with_host_formats(b: Board, low: object, high: object, where: str) -> Board:
    """``b`` for a build whose host levels are written in ``low`` (HOST_LOW) and ``high`` (HOST_HIGH); None:
    the defaults. Anything else: one OrkError line naming ``where``."""
    low, high = check_host_formats(low, high, where)
    return b if (low, high) == (b.host_low, b.host_high) else replace(b, host_low=low, host_high=high)




def combine(hw: dict, rt: Runtime, where: str, nf4_format: str = DEFAULT_NF4_FORMAT) -> Board:
    """The cost model of hardware ``hw`` (the checked board values) running runtime path ``rt``, for a build
    that writes host NF4 in ``nf4_format``."""
    board_engines = tuple(hw.pop("engines"))
    engines = tuple(e for e in board_engines if e in rt.engines)
    if "cpu" not in engines:
        raise OrkError(f"{where}: the board has no cpu engine, which runtime {escape_name(rt.name)} needs")
    if rt.decode_engine == "npu" and "npu" not in engines:
        raise OrkError(f"{where}: runtime {escape_name(rt.name)} decodes on the NPU, which the board lacks; "
                       "choose another --runtime")
    if "npu" not in engines:
        hw["iova_usable_bytes"] = 0
    b = Board(engines=engines, board_engines=board_engines, runtime_engines=rt.engines, runtime=rt.name,
              nf4_format=check_nf4_format(nf4_format, where), source=where, **hw, **{f: getattr(rt, f) for f in TOML_KEYS})
    if b.iova_usable_bytes > b.iova_cap_bytes:
        raise OrkError(f"{where}: iova_usable_bytes exceeds iova_cap_bytes; fix the board file")
    if b.reserve_bytes >= b.total_bytes:
        raise OrkError(f"{where}: reserve_bytes must be below total_bytes; fix the board file")
    if b.k_segment % b.k_align:
        raise OrkError(f"{where}: k_segment must be a multiple of k_align; fix the board file")
    return b


def board_from_json(d: object, where: str) -> Board:
    """The board a tier map records (``Board.to_json``'s block), checked as a board file is.

    A block without "runtime" is a version-2 one (its software constants in the board): it is read as
    runtime path "board-v2" with those constants, the decode at its bandwidth (fraction 1). A block without
    "nf4_format" was planned at b64 (LEGACY_NF4_FORMAT)."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(d.get("engines"), list) \
            or not all(isinstance(e, str) for e in d["engines"]):
        raise OrkError(f"{where}: its board block is not a board (name, engines, ...); plan again")
    hw = {k: _num(d, k, where, int, positive=k not in ("reserve_bytes", "iova_cap_bytes", "iova_usable_bytes"))
          for k in _INT_FIELDS}
    hw["name"], hw["engines"] = d["name"], list(d["engines"])
    fmt = d.get("nf4_format", LEGACY_NF4_FORMAT)
    if "runtime" in d:
        hw |= {k: _num(d, k, where, float) for k in _HW_FLOATS}
        return with_host_formats(combine(hw, runtime_from_json(d["runtime"], f"{where} (runtime)"), where, fmt),
                                 d.get("host_low"), d.get("host_high"), where)
    old = {k: _num(d, k, where, float, positive=k not in ("npu_k_falloff", "submit_overhead_s", "decode_token_s"))
           for k in _LEGACY_FLOATS}
    hw["npu_ops_per_s_per_core"] = _num(d, "npu_ops_per_s_per_core", where, float)
    bw = old.pop("decode_bandwidth_bytes_per_s")
    hw["cpu_stream_bytes_per_s"] = hw["npu_stream_bytes_per_s"] = bw
    engines = tuple(e for e in ("npu", "cpu", "gpu") if e in d["engines"]) or ("cpu",)
    rt = Runtime(name=LEGACY_RUNTIME, engines=engines, decode_engine="cpu", decode_fraction=1.0, request_s=0.0,
                 source=where, **old)
    return combine(hw, rt, where, fmt)


def board_names() -> list[str]:
    return sorted(p.stem for p in BOARD_DIR.glob("*.toml"))


# the range a board value may take, by key (beyond it no board's: byte counts up to 1 PiB, alignments and
# segments up to 2^20, 1024 cores, rates from 1e3 to 1e18 a second; the cost model's numbers overflow or round
# to nothing beyond them)
RANGES = {"total_bytes": (1, 1 << 50), "reserve_bytes": (0, 1 << 50), "iova_cap_bytes": (0, 1 << 50),
          "iova_usable_bytes": (0, 1 << 50), "alloc_granularity": (1, 1 << 20), "k_align": (1, 1 << 20),
          "n_align": (1, 1 << 20), "k_segment": (1, 1 << 20), "cores": (1, 1024), "k_ref": (1, 1 << 20),
          "int8_ops_per_s_per_core": (1e3, 1e18), "cpu_bytes_per_s": (1e3, 1e18), "npu_bytes_per_s": (1e3, 1e18)}


def _num(d: dict, key: str, where: str, kind=int, positive: bool = True):
    v = d.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
    if ok and kind is float:
        ok = math.isfinite(float(v))
    if not ok or (positive and v <= 0) or (not positive and v < 0):
        raise OrkError(f"{where}: '{key}' must be a {'positive' if positive else 'non-negative'} "
                       f"{'integer' if kind is int else 'number'}; fix the board file")
    lo, hi = RANGES.get(key, (-math.inf, math.inf))
    if not lo <= v <= hi:
        raise OrkError(f"{where}: '{key}' = {v:g} is outside {lo:g}..{hi:g}; fix the board file")
    return kind(v)


def parse_board_hw(data: dict, where: str) -> dict:
    """The hardware values of a parsed board TOML, checked (OrkError naming the file and key on any problem)."""
    hint = "start from tiermaps/boards/rk3588-32g.toml"
    if data.get("schema", BOARD_SCHEMA) != BOARD_SCHEMA:
        raise OrkError(f"{where}: not an orkpack board file (schema); {hint}")
    if data.get("version", 1) != BOARD_VERSION:
        if data.get("version") == 2:
            raise OrkError(f"{where}: a board v2 file: its [cpu], [decode] and NPU efficiency / submit / falloff "
                           "constants now belong to a runtime path (orkpack calibrate writes one, tiermaps/runtimes/); "
                           f"make it v3 with [memory], [npu] hardware and [stream]; {hint}")
        raise OrkError(f"{where}: not an orkpack board v{BOARD_VERSION} file (schema/version); {hint}")
    for sec in ("memory", "npu", "stream"):
        if not isinstance(data.get(sec), dict):
            raise OrkError(f"{where}: section [{sec}] is missing; {hint}")
    for sec in ("cpu", "decode"):
        if sec in data:
            raise OrkError(f"{where}: section [{sec}] belongs to a runtime path now (tiermaps/runtimes/); "
                           "remove it from the board file")
    mem, npu, st = data["memory"], data["npu"], data["stream"]
    for key in ("efficiency", "k_falloff", "submit_overhead_s"):
        if key in npu:
            raise OrkError(f"{where}: [npu] {key} belongs to a runtime path now (tiermaps/runtimes/); "
                           "remove it from the board file")
    engines = data.get("engines", ["npu", "cpu"])
    if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
        raise OrkError(f"{where}: 'engines' must be a list of names (npu, cpu, gpu)")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise OrkError(f"{where}: 'name' is missing")
    return dict(
        name=name, engines=list(engines),
        total_bytes=_num(mem, "total_bytes", where), reserve_bytes=_num(mem, "reserve_bytes", where, positive=False),
        iova_cap_bytes=_num(npu, "iova_cap_bytes", where, positive=False),
        iova_usable_bytes=_num(npu, "iova_usable_bytes", where, positive=False),
        alloc_granularity=_num(npu, "alloc_granularity", where),
        k_align=_num(npu, "k_align", where), n_align=_num(npu, "n_align", where),
        k_segment=_num(npu, "k_segment", where), npu_cores=_num(npu, "cores", where),
        npu_ops_per_s_per_core=_num(npu, "int8_ops_per_s_per_core", where, float),
        npu_k_ref=_num(npu, "k_ref", where),
        cpu_stream_bytes_per_s=_num(st, "cpu_bytes_per_s", where, float),
        npu_stream_bytes_per_s=_num(st, "npu_bytes_per_s", where, float),
    )


def parse_board(data: dict, where: str, runtime: Runtime | None = None, nf4_format: str | None = None) -> Board:
    """A parsed board TOML running ``runtime`` (default: the default runtime path), checked; host NF4 in
    ``nf4_format`` (default dq32)."""
    return combine(parse_board_hw(data, where), runtime or load_runtime(None), where, nf4_format or DEFAULT_NF4_FORMAT)


def read_board_toml(name_or_path: str | Path) -> tuple[dict, str]:
    """(parsed TOML, the name to report) of a shipped board by name or a TOML file path."""
    from .tomlfile import read_shipped

    return read_shipped(name_or_path, "board", BOARD_DIR, board_names, "tiermaps/boards/")


def load_board(name_or_path: str | Path, runtime: str | Path | Runtime | None = None,
               nf4_format: str | None = None) -> Board:
    """A shipped board by name (rk3588-32g, rk3588-16g, rk3588-8g) or a TOML file path, running a runtime
    path (a name, a TOML file path or a Runtime; default ggml-ork), for a build that writes host NF4 in
    ``nf4_format`` (NF4_FORMATS; default dq32)."""
    if nf4_format is not None and nf4_format not in NF4_FORMATS:
        raise OrkError(f"--nf4-format {escape_name(str(nf4_format), 40)!r}: choose {' or '.join(NF4_FORMATS)}")
    data, where = read_board_toml(name_or_path)
    rt = runtime if isinstance(runtime, Runtime) else load_runtime(runtime)
    return parse_board(data, where, rt, nf4_format)
