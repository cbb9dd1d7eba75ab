"""Board profiles: memory budgets and the cost model of one RK3588 board.

A board is a small TOML file (schema in docs/TIERMAP.md). The three shipped
boards live in ``tiermaps/boards/`` (the documented, commented copies) and are
installed as package data in ``orkpack/data/boards/`` (byte-identical copies,
kept in sync by ``python -m orkpack.tiers.regenerate`` and checked by a test),
so ``load_board("rk3588-32g")`` works from an editable and a normal install.
``load_board(path)`` takes a user's own file.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OrkError, escape_name

BOARD_DIR = Path(__file__).resolve().parent.parent / "data" / "boards"
BOARD_SCHEMA = "orkpack.board"
BOARD_VERSION = 2


@dataclass(frozen=True)
class Board:
    name: str
    engines: tuple[str, ...]
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
    npu_efficiency: float
    npu_k_ref: int
    npu_k_falloff: float
    submit_overhead_s: float
    cpu_int8_ops_per_s: float
    cpu_nf4_ops_per_s: float
    cpu_float_ops_per_s: float
    decode_bandwidth: float
    decode_token_s: float
    tile_read_factor: float
    source: str = field(default="", compare=False)

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

    def to_json(self) -> dict:
        return {
            "name": self.name, "engines": list(self.engines),
            "total_bytes": self.total_bytes, "reserve_bytes": self.reserve_bytes,
            "iova_cap_bytes": self.iova_cap_bytes, "iova_usable_bytes": self.iova_usable_bytes,
            "alloc_granularity": self.alloc_granularity, "k_align": self.k_align, "n_align": self.n_align,
            "k_segment": self.k_segment, "npu_cores": self.npu_cores,
            "npu_ops_per_s_per_core": self.npu_ops_per_s_per_core, "npu_efficiency": self.npu_efficiency,
            "npu_k_ref": self.npu_k_ref, "npu_k_falloff": self.npu_k_falloff,
            "submit_overhead_s": self.submit_overhead_s, "cpu_int8_ops_per_s": self.cpu_int8_ops_per_s,
            "cpu_nf4_ops_per_s": self.cpu_nf4_ops_per_s, "cpu_float_ops_per_s": self.cpu_float_ops_per_s,
            "decode_bandwidth_bytes_per_s": self.decode_bandwidth, "decode_token_s": self.decode_token_s,
            "tile_read_factor": self.tile_read_factor,
        }


_INT_FIELDS = ("total_bytes", "reserve_bytes", "iova_cap_bytes", "iova_usable_bytes", "alloc_granularity", "k_align",
               "n_align", "k_segment", "npu_cores", "npu_k_ref")
_FLOAT_FIELDS = ("npu_ops_per_s_per_core", "npu_efficiency", "npu_k_falloff", "submit_overhead_s", "cpu_int8_ops_per_s",
                 "cpu_nf4_ops_per_s", "cpu_float_ops_per_s", "decode_bandwidth_bytes_per_s", "decode_token_s",
                 "tile_read_factor")


def board_from_json(d: object, where: str) -> Board:
    """The board a tier map records (``Board.to_json``'s block), checked as a board file is."""
    if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(d.get("engines"), list) \
            or not all(isinstance(e, str) for e in d["engines"]):
        raise OrkError(f"{where}: its board block is not a board (name, engines, ...); plan again")
    vals = {k: _num(d, k, where, int, positive=k not in ("reserve_bytes",)) for k in _INT_FIELDS}
    vals |= {k: _num(d, k, where, float, positive=k not in ("npu_k_falloff", "submit_overhead_s", "decode_token_s"))
             for k in _FLOAT_FIELDS}
    vals["decode_bandwidth"] = vals.pop("decode_bandwidth_bytes_per_s")
    return Board(name=d["name"], engines=tuple(d["engines"]), source=where, **vals)


def board_names() -> list[str]:
    return sorted(p.stem for p in BOARD_DIR.glob("*.toml"))


def _num(d: dict, key: str, where: str, kind=int, positive: bool = True):
    v = d.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
    if ok and kind is float:
        ok = math.isfinite(float(v))
    if not ok or (positive and v <= 0) or (not positive and v < 0):
        raise OrkError(f"{where}: '{key}' must be a {'positive' if positive else 'non-negative'} "
                       f"{'integer' if kind is int else 'number'}; fix the board file")
    return kind(v)


def parse_board(data: dict, where: str) -> Board:
    """Validate a parsed board TOML (OrkError naming the file and key on any problem)."""
    if data.get("schema", BOARD_SCHEMA) != BOARD_SCHEMA or data.get("version", 1) != BOARD_VERSION:
        raise OrkError(f"{where}: not an orkpack board v{BOARD_VERSION} file (schema/version); "
                       "start from tiermaps/boards/rk3588-32g.toml")
    for sec in ("memory", "npu", "cpu", "decode"):
        if not isinstance(data.get(sec), dict):
            raise OrkError(f"{where}: section [{sec}] is missing; start from tiermaps/boards/rk3588-32g.toml")
    mem, npu, cpu, dec = data["memory"], data["npu"], data["cpu"], data["decode"]
    engines = data.get("engines", ["npu", "cpu"])
    if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
        raise OrkError(f"{where}: 'engines' must be a list of names (npu, cpu, gpu)")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise OrkError(f"{where}: 'name' is missing")
    b = Board(
        name=name, engines=tuple(engines),
        total_bytes=_num(mem, "total_bytes", where), reserve_bytes=_num(mem, "reserve_bytes", where, positive=False),
        iova_cap_bytes=_num(npu, "iova_cap_bytes", where, positive=False),
        iova_usable_bytes=_num(npu, "iova_usable_bytes", where, positive=False),
        alloc_granularity=_num(npu, "alloc_granularity", where),
        k_align=_num(npu, "k_align", where), n_align=_num(npu, "n_align", where),
        k_segment=_num(npu, "k_segment", where), npu_cores=_num(npu, "cores", where),
        npu_ops_per_s_per_core=_num(npu, "int8_ops_per_s_per_core", where, float),
        npu_efficiency=_num(npu, "efficiency", where, float),
        npu_k_ref=_num(npu, "k_ref", where), npu_k_falloff=_num(npu, "k_falloff", where, float, positive=False),
        submit_overhead_s=_num(npu, "submit_overhead_s", where, float, positive=False),
        cpu_int8_ops_per_s=_num(cpu, "int8_ops_per_s", where, float),
        cpu_nf4_ops_per_s=_num(cpu, "nf4_ops_per_s", where, float),
        cpu_float_ops_per_s=_num(cpu, "float_ops_per_s", where, float),
        decode_bandwidth=_num(dec, "bandwidth_bytes_per_s", where, float),
        decode_token_s=_num(dec, "token_fixed_s", where, float, positive=False),
        tile_read_factor=_num(dec, "tile_read_factor", where, float),
        source=where,
    )
    if "npu" not in b.engines:
        b = Board(**{**b.__dict__, "iova_usable_bytes": 0})
    if b.iova_usable_bytes > b.iova_cap_bytes:
        raise OrkError(f"{where}: iova_usable_bytes exceeds iova_cap_bytes; fix the board file")
    if b.reserve_bytes >= b.total_bytes:
        raise OrkError(f"{where}: reserve_bytes must be below total_bytes; fix the board file")
    if b.k_segment % b.k_align:
        raise OrkError(f"{where}: k_segment must be a multiple of k_align; fix the board file")
    return b


def load_board(name_or_path: str | Path) -> Board:
    """A shipped board by name (rk3588-32g, rk3588-16g, rk3588-8g) or a TOML file path."""
    s = str(name_or_path)
    p = Path(s)
    if not (s.endswith(".toml") or p.exists()):
        p = BOARD_DIR / f"{s}.toml"
        if not p.is_file():
            raise OrkError(f"unknown board {escape_name(s)!r}; shipped boards: {', '.join(board_names())}, "
                           "or give a .toml file (see tiermaps/boards/)")
        where = s
    else:
        where = escape_name(str(p))
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OrkError(f"{where}: board file not found; give a path to a .toml board file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise OrkError(f"{where}: cannot read the board file ({e.__class__.__name__})") from None
    except tomllib.TOMLDecodeError as e:
        raise OrkError(f"{where}: not valid TOML ({e}); fix the board file") from None
    return parse_board(data, where)
