"""Runtime paths: what a prediction owes to the software that runs the pack, not to the board.

A board profile (board.py, ``tiermaps/boards/*.toml``) describes the hardware: memory, the NPU's
IOVA window, alignment and peak, and the bandwidth its CPU cores and its NPU are measured to
stream. A runtime path (this module, ``tiermaps/runtimes/*.toml``, installed as package data in
``orkpack/data/runtimes/``) holds what depends on the software (docs/TIERMAP.md section 2,
docs/CALIBRATION.md): the engines it uses, the cost of one NPU submit, the NPU efficiency it
reaches and its fall with K, its CPU kernels' rates per encoding, the fraction of the hardware's
stream bandwidth its decode reaches, a fixed cost per token (and per prefill chunk), a fixed cost
per request, and the engine it decodes on.

``load_runtime("ggml-ork")`` takes a shipped runtime by name, ``load_runtime(path)`` a user's file
(``orkpack calibrate`` writes one). ``board.load_board(board, runtime)`` joins the two into the one
cost model the planner reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OrkError, escape_name

RUNTIME_DIR = Path(__file__).resolve().parent.parent / "data" / "runtimes"
RUNTIME_SCHEMA = "orkpack.runtime"
RUNTIME_VERSION = 1
DEFAULT_RUNTIME = "ggml-ork"
DECODE_ENGINES = ("cpu", "npu")
ENGINES = ("npu", "cpu", "gpu")


@dataclass(frozen=True)
class Runtime:
    name: str
    engines: tuple[str, ...]  # the engines this runtime computes on (intersected with the board's)
    npu_efficiency: float  # fraction of the board's NPU peak a call with K <= k_ref sustains
    npu_k_falloff: float  # beyond k_ref columns per call: throughput x (k_ref / K) ** k_falloff
    submit_overhead_s: float  # fixed software cost of one NPU matmul submit
    cpu_int8_ops_per_s: float  # prefill GEMM ops/s of the CPU kernels by weight encoding
    cpu_nf4_ops_per_s: float
    cpu_float_ops_per_s: float
    tile_read_factor: float  # the CPU reading an NPU-only item's int8 tiles, against row-major int8
    decode_engine: str  # cpu: M = 1 always on the CPU (ggml-ork, llama.cpp); npu: NPU items decode on the NPU
    decode_fraction: float  # of the board's stream bandwidth of the decoding engine, <= 1 (physics)
    decode_token_s: float  # fixed seconds per decode token, and per prefill chunk
    request_s: float  # fixed seconds per request (once per prompt: in the TTFT)
    source: str = field(default="", compare=False)

    def to_json(self) -> dict:
        return {"name": self.name, "engines": list(self.engines), **{f: getattr(self, f) for f in TOML_KEYS}}


TOML_KEYS = {  # Runtime field -> (section, key); the order of the shipped files
    "npu_efficiency": ("npu", "efficiency"), "npu_k_falloff": ("npu", "k_falloff"),
    "submit_overhead_s": ("npu", "submit_overhead_s"),
    "cpu_int8_ops_per_s": ("cpu", "int8_ops_per_s"), "cpu_nf4_ops_per_s": ("cpu", "nf4_ops_per_s"),
    "cpu_float_ops_per_s": ("cpu", "float_ops_per_s"), "tile_read_factor": ("cpu", "tile_read_factor"),
    "decode_engine": ("decode", "engine"), "decode_fraction": ("decode", "bandwidth_fraction"),
    "decode_token_s": ("decode", "token_fixed_s"), "request_s": ("request", "fixed_s"),
}
_NONNEG = ("npu_k_falloff", "submit_overhead_s", "decode_token_s", "request_s")
_NO_NPU = {"npu_efficiency": 1.0, "npu_k_falloff": 0.0, "submit_overhead_s": 0.0}  # a runtime without the NPU


def runtime_names() -> list[str]:
    return sorted(p.stem for p in RUNTIME_DIR.glob("*.toml"))


# the range a runtime constant may take (a value beyond it is no runtime's: the cost model's seconds overflow,
# or round to nothing, and the planner's MILP stalls on the coefficients; a plan said NaN or hung)
RANGES = {
    "npu_efficiency": (1e-6, 1.0), "npu_k_falloff": (0.0, 10.0), "submit_overhead_s": (0.0, 10.0),
    "cpu_int8_ops_per_s": (1e3, 1e16), "cpu_nf4_ops_per_s": (1e3, 1e16), "cpu_float_ops_per_s": (1e3, 1e16),
    "tile_read_factor": (1e-3, 1e3), "decode_fraction": (1e-6, 1.0), "decode_token_s": (0.0, 10.0),
    "request_s": (0.0, 3600.0),
}


def _num(sec: dict, key: str, where: str, nonneg: bool, rng: tuple[float, float] | None = None) -> float:
    v = sec.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    if not ok or (v < 0 if nonneg else v <= 0):
        raise OrkError(f"{where}: '{key}' must be a {'non-negative' if nonneg else 'positive'} number; "
                       "fix the runtime file")
    if rng is not None and not rng[0] <= v <= rng[1] and not (key in ("efficiency", "bandwidth_fraction") and v > 1):
        raise OrkError(f"{where}: '{key}' = {v:g} is outside {rng[0]:g}..{rng[1]:g}; fix the runtime file")
    return float(v)


def parse_runtime(data: dict, where: str) -> Runtime:
    """Validate a parsed runtime TOML (OrkError naming the file and key on any problem)."""
    hint = "start from tiermaps/runtimes/ggml-ork.toml"
    if data.get("schema") != RUNTIME_SCHEMA or data.get("version") != RUNTIME_VERSION:
        raise OrkError(f"{where}: not an orkpack runtime v{RUNTIME_VERSION} file (schema = {RUNTIME_SCHEMA!r}, "
                       f"version = {RUNTIME_VERSION}); {hint}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise OrkError(f"{where}: 'name' is missing; {hint}")
    engines = data.get("engines")
    if not isinstance(engines, list) or not engines or not all(isinstance(e, str) and e in ENGINES for e in engines) \
            or "cpu" not in engines:
        raise OrkError(f"{where}: 'engines' must list the engines the runtime uses ({', '.join(ENGINES)}; "
                       "the CPU always); fix the runtime file")
    uses_npu = "npu" in engines
    vals: dict = {}
    for fld, (sec, key) in TOML_KEYS.items():
        s = data.get(sec)
        if sec == "npu" and not uses_npu:
            if s is not None:
                raise OrkError(f"{where}: section [npu] given but 'engines' has no npu; remove one of them")
            vals[fld] = _NO_NPU[fld]
            continue
        if not isinstance(s, dict):
            raise OrkError(f"{where}: section [{sec}] is missing; {hint}")
        if fld == "decode_engine":
            v = s.get(key)
            if v not in DECODE_ENGINES or (v == "npu" and not uses_npu):
                raise OrkError(f"{where}: [decode] engine must be cpu or npu (npu only with the npu engine); "
                               "fix the runtime file")
            vals[fld] = v
            continue
        vals[fld] = _num(s, key, where, fld in _NONNEG, RANGES[fld])
    if vals["decode_fraction"] > 1.0:
        raise OrkError(f"{where}: [decode] bandwidth_fraction {vals['decode_fraction']:g} is above 1: no runtime "
                       "decodes faster than the board's cores stream (the board's [stream]); fix the runtime file")
    if uses_npu and vals["npu_efficiency"] > 1.0:
        raise OrkError(f"{where}: [npu] efficiency {vals['npu_efficiency']:g} is above 1 (a fraction of the "
                       "board's peak); fix the runtime file")
    known = {"schema", "version", "name", "engines", "description", "npu", "cpu", "decode", "request"}
    extra = sorted(k for k in data if k not in known)
    if extra:
        raise OrkError(f"{where}: unknown key {escape_name(extra[0], 40)!r}; keys are {', '.join(sorted(known))}")
    for sec in ("npu", "cpu", "decode", "request"):
        s = data.get(sec)
        if isinstance(s, dict):
            keys = {k for f_, (sc, k) in TOML_KEYS.items() if sc == sec}
            bad = sorted(k for k in s if k not in keys)
            if bad:
                raise OrkError(f"{where}: [{sec}] has unknown key {escape_name(bad[0], 40)!r}; it takes "
                               f"{', '.join(sorted(keys))}")
    return Runtime(name=name, engines=tuple(engines), source=where, **vals)


def runtime_from_json(d: object, where: str) -> Runtime:
    """The runtime a tier map records (``Runtime.to_json``), checked as a runtime file is."""
    if not isinstance(d, dict):
        raise OrkError(f"{where}: its runtime block is not a runtime path; plan again")
    data: dict = {"schema": RUNTIME_SCHEMA, "version": RUNTIME_VERSION, "name": d.get("name"),
                  "engines": d.get("engines")}
    uses_npu = isinstance(d.get("engines"), list) and "npu" in d["engines"]
    for fld, (sec, key) in TOML_KEYS.items():
        if sec == "npu" and not uses_npu:
            continue
        data.setdefault(sec, {})[key] = d.get(fld)
    return parse_runtime(data, where)


def load_runtime(name_or_path: str | Path | None = None) -> Runtime:
    """A shipped runtime path by name (ggml-ork, llama.cpp-cpu, rkllm) or a TOML file path."""
    from .tomlfile import read_shipped

    data, where = read_shipped(DEFAULT_RUNTIME if name_or_path is None else name_or_path, "runtime", RUNTIME_DIR,
                               runtime_names, "tiermaps/runtimes/")
    return parse_runtime(data, where)
