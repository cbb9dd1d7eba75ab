"""Fit a runtime path's cost-model constants to timings measured on a board (docs/CALIBRATION.md).

    orkpack calibrate TIMES.csv -o myruntime.toml [--board BOARD] [--runtime BASE] [--json]
    python -m orkpack.tiers.calibrate --published [--fit | --update-doc]

TIMES.csv: one header row, columns in any order, a blank cell = not given. Each row is one timing:

  kind       matmul | prefill | ttft | decode
  matmul     engine (npu | cpu), encoding (int8 | nf4 | f16; the NPU runs int8), m, n, k,
             seconds (one call: [m x k] activations times an [n x k] weight)
  prefill    config, choice, prompt, tok_s     (prompt tokens / seconds to process them: llama-bench ppN)
  ttft       config, choice, prompt, seconds   (time to first token of a prompt-token prompt)
  decode     config, choice, prompt, tok_s     (generation speed with about `prompt` tokens in the context)
  optional   chunk (prefill/ttft: rows per pass, default min(prompt, 512)), set (fit | holdout,
             default fit), runtime (the runtime path that ran the row: one per file), id, note

``config`` is a model's config.json, as a path relative to the CSV's folder. ``choice`` says how
the model ran: all-nf4 | all-int8 | all-float (every weight on the CPU in that encoding) or npu
(every matmul on the NPU as int8 tiles, the token embedding int8 on the host; decode, M = 1,
reads the int8 weights at the decode bandwidth either way: the cost model's assumption).

The fit: least squares on log(predicted / measured) over the ``set = fit`` rows
(scipy.optimize.least_squares, trust-region reflective, bounded, deterministic), over the constants
the rows constrain: the NPU's efficiency, submit_overhead_s and k_falloff, the CPU's int8 / nf4 /
float ops/s, the decode bandwidth fraction, token_fixed_s and the per-request cost: the runtime path's
constants (runtime.py); the board's hardware (its stream bandwidth: the ceiling of the decode) is
never fitted. A constant is fitted when some fit row's prediction depends on it and it is not
degenerate with the constants before it (checked on the Jacobian at the start point); every other
value is kept from the base runtime path. Predictions are the
planner's own (solver.py, cost.py), so a calibrated board predicts what ``orkpack plan`` will say.
"""
from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import OrkError, escape_name
from ..files import is_file
from . import cost, solver
from .board import Board, load_board
from .runtime import RUNTIME_SCHEMA, RUNTIME_VERSION, TOML_KEYS, parse_runtime
from .manifest import Manifest, manifest_from_path
from .profile import load_profile

KINDS = ("matmul", "prefill", "ttft", "decode")
CHOICES = ("all-nf4", "all-int8", "all-float", "npu")
# what a timing row's nf4 weighs: 4.5 bits a weight, the b64 NF4 format (llama.cpp's Q4_0 ran the published
# all-nf4 rows); the fitted rates and fractions then price any format by its bytes (cost.host_nf4_bytes)
MEASURED_NF4_FORMAT = "b64"
SETS = ("fit", "holdout")
NEEDS = {
    "matmul": ("engine", "encoding", "m", "n", "k", "seconds"),
    "prefill": ("config", "choice", "prompt", "tok_s"),
    "ttft": ("config", "choice", "prompt", "seconds"),
    "decode": ("config", "choice", "prompt", "tok_s"),
}
OPTIONAL = ("chunk", "set", "runtime", "id", "note")
COLUMNS = ("kind",) + tuple(dict.fromkeys(c for cs in NEEDS.values() for c in cs)) + OPTIONAL
DEFAULT_CHUNK = 512
MAX_INT = 1 << 20  # a timing's m, n, k, prompt or chunk (the cost model loops over K segments and chunks)
MIN_VALUE, MAX_VALUE = 1e-15, 1e15  # a timing's seconds or tok/s: beyond these it is not a measurement
DIGITS = 4  # significant digits of a fitted constant in the written board
ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = ROOT / "docs" / "calibration" / "published.csv"
DOC = ROOT / "docs" / "CALIBRATION.md"
TABLE_BEGIN = "<!-- published-table:begin (python -m orkpack.tiers.calibrate --published --update-doc) -->"
TABLE_END = "<!-- published-table:end -->"


@dataclass(frozen=True)
class Param:
    field: str  # Board attribute (a runtime path's: runtime.TOML_KEYS)
    section: str  # the runtime TOML's section and key
    key: str
    lo: float
    hi: float
    log: bool  # fitted as log(value) (positive constants) or as the value itself
    start_floor: float  # a start value below this would hide the constant from the Jacobian


PARAMS = (
    Param("npu_efficiency", "npu", "efficiency", 1e-3, 1.0, True, 1e-3),
    Param("submit_overhead_s", "npu", "submit_overhead_s", 1e-6, 0.05, True, 1e-5),
    Param("npu_k_falloff", "npu", "k_falloff", 0.0, 3.0, False, 0.0),
    Param("cpu_int8_ops_per_s", "cpu", "int8_ops_per_s", 1e9, 1e13, True, 1e9),
    Param("cpu_nf4_ops_per_s", "cpu", "nf4_ops_per_s", 1e9, 1e13, True, 1e9),
    Param("cpu_float_ops_per_s", "cpu", "float_ops_per_s", 1e9, 1e13, True, 1e9),
    Param("decode_fraction", "decode", "bandwidth_fraction", 0.02, 1.0, True, 0.02),  # <= 1: physics
    Param("decode_token_s", "decode", "token_fixed_s", 1e-5, 1.0, True, 1e-3),
    Param("request_s", "request", "fixed_s", 1e-5, 5.0, True, 1e-2),
)
SENSITIVE = 1e-2  # |d log(prediction) / d parameter| below this on every row: the data do not constrain it
INDEPENDENT = 1e-2  # smallest singular value of the normalized Jacobian columns a new parameter may bring


@dataclass(frozen=True)
class Point:
    """One timing row of the CSV, validated."""
    line: int
    id: str
    kind: str
    set: str
    value: float  # seconds (matmul, ttft) or tokens/s (prefill, decode), as measured
    engine: str = ""
    encoding: str = ""
    m: int = 0
    n: int = 0
    k: int = 0
    config: Path | None = None
    config_text: str = ""
    choice: str = ""
    prompt: int = 0
    chunk: int = 0
    runtime: str = ""
    note: str = ""

    @property
    def unit(self) -> str:
        return "tok/s" if self.kind in ("prefill", "decode") else "s"

    def setup(self) -> str:
        if self.kind == "matmul":
            return f"{self.engine} {self.encoding} M={self.m} N={self.n} K={self.k}"
        extra = f" chunk {self.chunk}" if self.kind in ("prefill", "ttft") and self.chunk != min(self.prompt, DEFAULT_CHUNK) else ""
        cfg = Path(self.config_text)
        model = cfg.parent.name if cfg.name == "config.json" and cfg.parent.name else cfg.stem
        return f"{model} {self.choice} prompt {self.prompt}{extra}"


# -------------------------------------------------------------------------------------------- reading the CSV

def _where(path: Path) -> str:
    return escape_name(str(path))


def _posint(raw: str, col: str, where: str, allow_zero: bool = False) -> int:
    try:
        v = int(raw)
    except ValueError:
        v = None
    if v is None or v < 0 or (v == 0 and not allow_zero) or v > MAX_INT:
        raise OrkError(f"{where}: '{col}' must be a {'non-negative' if allow_zero else 'positive'} integer up to "
                       f"{MAX_INT} (got {escape_name(raw, 40)!r})")
    return v


def _posnum(raw: str, col: str, where: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and MIN_VALUE <= v <= MAX_VALUE):
        raise OrkError(f"{where}: '{col}' must be a positive number from {MIN_VALUE:g} to {MAX_VALUE:g} "
                       f"(got {escape_name(raw, 40)!r})")
    return v


def read_times(path: str | Path) -> list[Point]:
    """The rows of a timing CSV (module docstring, docs/CALIBRATION.md); OrkError names the line and column."""
    path = Path(path)
    w = _where(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise OrkError(f"{w}: no such file; give a timing CSV (format: docs/CALIBRATION.md)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise OrkError(f"{w}: cannot read the timing CSV ({e.__class__.__name__})") from None
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise OrkError(f"{w}: empty; the first line must be a header with at least 'kind' (docs/CALIBRATION.md)")
    rows = list(csv.reader(lines))
    header = [h.strip() for h in rows[0]]
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        raise OrkError(f"{w}: unknown column {escape_name(unknown[0], 40)!r}; columns are {', '.join(COLUMNS)}")
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise OrkError(f"{w}: column {dup[0]!r} appears twice")
    if "kind" not in header:
        raise OrkError(f"{w}: missing column 'kind' (matmul, prefill, ttft or decode); see docs/CALIBRATION.md")
    base = path.parent
    points: list[Point] = []
    # line numbers as the user sees them (comments and blank lines counted)
    numbers = [i + 1 for i, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    for lineno, row in zip(numbers[1:], rows[1:]):
        where = f"{w} line {lineno}"
        if len(row) > len(header):
            raise OrkError(f"{where}: {len(row)} cells but the header has {len(header)} columns")
        cell = {h: (row[i].strip() if i < len(row) else "") for i, h in enumerate(header)}
        kind = cell["kind"]
        if kind not in KINDS:
            raise OrkError(f"{where}: unknown kind {escape_name(kind, 40)!r}; use {', '.join(KINDS)}")
        for col in NEEDS[kind]:
            if col not in header:
                raise OrkError(f"{w}: missing column {col!r} ({kind} rows need {', '.join(NEEDS[kind])}); "
                               "see docs/CALIBRATION.md")
            if not cell[col]:
                raise OrkError(f"{where}: {col!r} is empty ({kind} rows need {', '.join(NEEDS[kind])})")
        st = cell.get("set", "") or "fit"
        if st not in SETS:
            raise OrkError(f"{where}: set {escape_name(st, 40)!r} is not fit or holdout")
        common = dict(line=lineno, id=cell.get("id", "") or f"line{lineno}", kind=kind, set=st,
                      runtime=cell.get("runtime", ""), note=cell.get("note", ""))
        if kind == "matmul":
            eng, enc = cell["engine"], cell["encoding"]
            if eng not in ("npu", "cpu"):
                raise OrkError(f"{where}: engine {escape_name(eng, 40)!r} is not npu or cpu")
            if enc not in ("int8", "nf4", "f16"):
                raise OrkError(f"{where}: encoding {escape_name(enc, 40)!r} is not int8, nf4 or f16")
            if eng == "npu" and enc != "int8":
                raise OrkError(f"{where}: the NPU computes int8 (encoding {enc!r} on engine npu is not modelled)")
            points.append(Point(**common, value=_posnum(cell["seconds"], "seconds", where), engine=eng, encoding=enc,
                                m=_posint(cell["m"], "m", where), n=_posint(cell["n"], "n", where),
                                k=_posint(cell["k"], "k", where)))
            continue
        choice = cell["choice"]
        if choice not in CHOICES:
            raise OrkError(f"{where}: choice {escape_name(choice, 40)!r} is not one of {', '.join(CHOICES)}")
        cfg = base / cell["config"]
        if not is_file(cfg):
            raise OrkError(f"{where}: config {escape_name(cell['config'], 80)!r} not found (a config.json path "
                           f"relative to {escape_name(str(base) or '.', 80)})")
        prompt = _posint(cell["prompt"], "prompt", where, allow_zero=kind == "decode")
        if kind in ("prefill", "ttft"):
            chunk = _posint(cell["chunk"], "chunk", where) if cell.get("chunk") else min(prompt, DEFAULT_CHUNK)
        else:
            chunk = DEFAULT_CHUNK
        col = "tok_s" if kind in ("prefill", "decode") else "seconds"
        points.append(Point(**common, value=_posnum(cell[col], col, where), config=cfg, config_text=cell["config"],
                            choice=choice, prompt=prompt, chunk=chunk))
    if not points:
        raise OrkError(f"{w}: no timing rows after the header; see docs/CALIBRATION.md")
    return points


# -------------------------------------------------------------------------------------------- predictions

@lru_cache(maxsize=256)
def _manifest(path: Path, mtime: float) -> Manifest:
    return manifest_from_path(path)


def manifest_of(p: Point) -> Manifest:
    try:
        return _manifest(p.config, p.config.stat().st_mtime)
    except OrkError as e:
        raise OrkError(f"line {p.line}: {e}") from None


def choices_for(man: Manifest, choice: str) -> list[str]:
    """Per item: the published setup as the cost model's choices (module docstring)."""
    if choice == "npu":
        return ["int8" if it.role in ("embedding", "lookup") else "npu" for it in man.items]
    return [choice[4:]] * len(man.items)


def predict(p: Point, board: Board) -> float:
    """The cost model's value for a timing row, in the row's unit (seconds or tokens/s); unrounded."""
    if p.kind == "matmul":
        if p.engine == "npu":
            return cost.t_npu(p.n, p.k, p.m, board)
        return cost.t_cpu(p.n, p.k, p.m, board, p.encoding)
    man = manifest_of(p)
    ch = choices_for(man, p.choice)
    prof = load_profile(None, man, board, p.chunk)
    if p.kind == "decode":  # solver.evaluate's decode_tok_s, before its rounding
        rows = solver._rows(man, board, {})
        md = solver._model(man, board, prof, rows, max(p.prompt, 1), "f16", allowed=[(c,) for c in ch])
        return 1.0 / solver._totals(md, [0] * len(ch))[2]
    t = solver.ttft_s(man, board, prof, ch, p.prompt)
    return t if p.kind == "ttft" else p.prompt / t


def predict_all(points: list[Point], board: Board) -> np.ndarray:
    return np.array([predict(p, board) for p in points])


# -------------------------------------------------------------------------------------------- the fit

def _get(board: Board, prm: Param) -> float:
    return float(getattr(board, prm.field))


def _to_x(v: float, prm: Param) -> float:
    return math.log(v) if prm.log else v


def _from_x(x: float, prm: Param) -> float:
    return math.exp(x) if prm.log else x


def _board(base: Board, params: list[Param], x) -> Board:
    return replace(base, **{prm.field: _from_x(float(xi), prm) for prm, xi in zip(params, x)})


def _round(v: float, digits: int = DIGITS) -> float:
    return float(f"{v:.{digits - 1}e}") if v else 0.0


def _jacobian(points: list[Point], board: Board, params: list[Param], h: float = 1e-4) -> np.ndarray:
    """d log(prediction) / d x (x: log of the constant, or the constant itself), central differences."""
    J = np.zeros((len(points), len(params)))
    for j, prm in enumerate(params):
        x = _to_x(_get(board, prm), prm)
        up = np.log(predict_all(points, replace(board, **{prm.field: _from_x(x + h, prm)})))
        dn = np.log(predict_all(points, replace(board, **{prm.field: _from_x(x - h, prm)})))
        J[:, j] = (up - dn) / (2 * h)
    return J


def constrained(points: list[Point], start: Board, only: tuple[str, ...] | None = None
                ) -> tuple[list[Param], dict[str, str]]:
    """(the parameters the fit rows constrain, in PARAMS order; reason per parameter left out)."""
    J = _jacobian(points, start, list(PARAMS))
    chosen: list[int] = []
    why: dict[str, str] = {}
    for j, prm in enumerate(PARAMS):
        if only is not None and prm.field not in only:
            why[prm.field] = "not fitted by this design"
            continue
        col = J[:, j]
        if np.max(np.abs(col)) < SENSITIVE:
            why[prm.field] = "no fit row depends on it"
            continue
        cols = J[:, chosen + [j]]
        cols = cols / np.linalg.norm(cols, axis=0)
        if cols.shape[1] > cols.shape[0] or np.linalg.svd(cols, compute_uv=False)[-1] < INDEPENDENT:
            unit = cols / np.maximum(np.linalg.norm(cols, axis=0), 1e-300)
            near = [PARAMS[i].key for n, i in enumerate(chosen) if abs(unit[:, n] @ unit[:, -1]) >= 0.1]
            why[prm.field] = "the fit rows cannot tell it from " + ", ".join(near or [PARAMS[i].key for i in chosen])
            continue
        chosen.append(j)
    return [PARAMS[j] for j in chosen], why


@dataclass
class Fit:
    base: Board
    board: Board  # the written board: fitted constants rounded to DIGITS significant digits
    raw: dict[str, float]  # fitted constants before rounding
    params: list[Param]
    why: dict[str, str]
    points: list[Point]
    before: np.ndarray  # predictions of the base board
    after: np.ndarray  # predictions of the written board
    per_param: dict[str, tuple[int, float]] = field(default_factory=dict)  # field -> (fit points, rms rel error)
    nfev: int = 0

    def errors(self, which: np.ndarray) -> np.ndarray:
        """Relative errors predicted / measured - 1."""
        return which / np.array([p.value for p in self.points]) - 1.0

    def stats(self, st: str) -> dict:
        """Errors of the written board over the ``st`` rows (fit or holdout)."""
        e = self.errors(self.after)[[p.set == st for p in self.points]]
        if not len(e):
            return {"n": 0}
        return {"n": int(len(e)), "median_abs_pct": round(float(np.median(np.abs(e))) * 100, 1),
                "worst_abs_pct": round(float(np.max(np.abs(e))) * 100, 1),
                "within_35_pct": int((np.abs(e) <= 0.35).sum()),
                "rms_log_pct": round(float(np.sqrt(np.mean(self.log_errors(st) ** 2))) * 100, 1)}

    def log_errors(self, st: str) -> np.ndarray:
        """log(predicted) - log(measured) over the ``st`` rows: log1p of a relative error of -1 + 1e-17 (a
        measurement 1e17 times the prediction) is not -inf in this form."""
        keep = np.array([p.set == st for p in self.points])
        meas = np.array([p.value for p in self.points])[keep]
        return np.log(self.after[keep]) - np.log(meas)


def fit(points: list[Point], base: Board, *, digits: int = DIGITS, only: tuple[str, ...] | None = None) -> Fit:
    """Least squares on log(predicted / measured) over the ``set = fit`` points (module docstring).
    ``only``: fit at most these constants (Board fields; a published design's choice, docs/CALIBRATION.md)."""
    from scipy.optimize import least_squares

    fit_pts = [p for p in points if p.set == "fit"]
    if not fit_pts:
        raise OrkError("no timing row has set = fit; at least one row must be fitted")
    if "npu" not in base.engines and any(p.engine == "npu" or p.choice == "npu" for p in points):
        raise OrkError(f"{base.name} running {base.runtime} has no NPU, but some rows ran on it; use a board "
                       "and a base --runtime with an NPU")
    start = replace(base, **{prm.field: min(max(_get(base, prm), prm.start_floor, prm.lo), prm.hi) for prm in PARAMS})
    params, why = constrained(fit_pts, start, only)
    if not params:
        raise OrkError("the fit rows constrain none of the fitted constants (efficiency, submit_overhead_s, "
                       "k_falloff, CPU ops/s, decode bandwidth fraction, token_fixed_s, request fixed_s); add "
                       "matmul, prefill or decode rows")
    meas = np.log(np.array([p.value for p in fit_pts]))
    x0 = np.array([_to_x(_get(start, prm), prm) for prm in params])
    lo = np.array([_to_x(prm.lo, prm) for prm in params])
    hi = np.array([_to_x(prm.hi, prm) for prm in params])
    x0 = np.clip(x0, lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))

    def resid(x):
        return np.log(predict_all(fit_pts, _board(base, params, x))) - meas

    def jac(x):
        # forward differences at an absolute step (scipy's diff_step is relative to |x|: at x = 0, a
        # constant whose log is 0 (a fraction of 1) would get a zero step and a zero gradient), away from
        # the nearer bound
        r0 = resid(x)
        J = np.empty((len(r0), len(x)))
        for j in range(len(x)):
            h = 1e-7 * max(1.0, abs(x[j]))
            if x[j] + h > hi[j]:
                h = -h
            xp = x.copy()
            xp[j] += h
            J[:, j] = (resid(xp) - r0) / h
        return J

    sol = least_squares(resid, x0, jac=jac, bounds=(lo, hi), method="trf", x_scale=1.0,
                        ftol=1e-15, xtol=1e-15, gtol=1e-15, max_nfev=400 * (len(params) + 1))
    raw = {prm.field: _from_x(float(x), prm) for prm, x in zip(params, sol.x)}
    board = replace(base, **{f: _round(v, digits) for f, v in raw.items()})
    before, after = predict_all(points, base), predict_all(points, board)
    out = Fit(base, board, raw, params, why, points, before, after, nfev=int(sol.nfev))
    J = _jacobian(fit_pts, board, params)
    err = out.errors(after)[[p.set == "fit" for p in points]]
    for j, prm in enumerate(params):
        dep = np.abs(J[:, j]) >= SENSITIVE
        out.per_param[prm.field] = (int(dep.sum()), float(np.sqrt(np.mean(err[dep] ** 2))) if dep.any() else 0.0)
    return out


# -------------------------------------------------------------------------------------------- the board file

def _points(n: int) -> str:
    return f"{n} point" if n == 1 else f"{n} points"


def _fmt(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, int):
        return str(v)
    s = repr(float(v))
    return s if any(c in s for c in ".eE") else s + ".0"


def runtime_toml(f: Fit, name: str, times_name: str, board_name: str, base_name: str) -> str:
    """The runtime TOML of a fit: every fitted constant says so, every other value comes from the base path."""
    nfit = sum(p.set == "fit" for p in f.points)
    rt = f.board.path()
    L = [f"# Runtime path written by `orkpack calibrate` from {times_name} (docs/CALIBRATION.md):",
         f"# {len(f.points)} timing rows ({nfit} fitted, {len(f.points) - nfit} held out) measured on board "
         f"{board_name}, base runtime path {base_name}.",
         "# FITTED: least squares on log(predicted / measured); residual = rms relative error of the fitted",
         "# rows that depend on the constant. Every other value is the base runtime path's.",
         "# Schema: docs/TIERMAP.md section \"Runtime path\".",
         "schema = " + json.dumps(RUNTIME_SCHEMA), f"version = {RUNTIME_VERSION}",
         f"# The name --runtime takes (this file's name; the base runtime path was {base_name}).",
         "name = " + json.dumps(name), f"# from {base_name}", "engines = " + json.dumps(list(rt.engines))]
    fitted = {prm.field for prm in f.params}
    section = None
    for fld, (sec, key) in TOML_KEYS.items():
        if sec == "npu" and "npu" not in rt.engines:
            continue
        if sec != section:
            L += ["", f"[{sec}]"]
            section = sec
        if fld in fitted:
            n, r = f.per_param[fld]
            L.append(f"# FITTED by orkpack calibrate on {_points(n)}, residual {r * 100:.1f}% "
                     f"(was {_fmt(getattr(f.base, fld))} in {base_name})")
        elif fld in f.why:
            L.append(f"# from {base_name} (not fitted: {f.why[fld]})")
        else:
            L.append(f"# from {base_name}")
        L.append(f"{key} = {_fmt(getattr(rt, fld))}")
    return "\n".join(L) + "\n"


def calibrate(times: str | Path, output: str | Path, *, board: str = "rk3588-32g",
              runtime: str | None = None) -> tuple[Fit, str]:
    """Read, fit, write the runtime path ``output`` atomically (only after everything succeeded); (fit, text)."""
    import tomllib

    from .command import write_atomic

    times, output = Path(times), Path(output)
    if output.suffix != ".toml":
        raise OrkError(f"{_where(output)}: the runtime file must end in .toml")
    name = output.stem
    if not name or any(c in name for c in "\"\\\n\r\t"):
        raise OrkError(f"{_where(output)}: choose a plain file name (it becomes the runtime path's name)")
    base = load_board(board, runtime, MEASURED_NF4_FORMAT)
    points = read_times(times)
    named = sorted({p.runtime for p in points if p.runtime})
    if len(named) > 1:
        raise OrkError(f"{_where(times)}: the rows name runtime paths {', '.join(named)}; one file calibrates one "
                       "runtime path (split it)")
    from ..files import option_file, refuse_over_inputs

    refuse_over_inputs(output, [(times, "the timing CSV"), (option_file(board), "the --board file"),
                                (option_file(runtime), "the --runtime file")]
                       + [(p.config, f"the config of line {p.line}") for p in points if p.config is not None],
                       "the runtime file")
    try:
        f = fit(points, base)
    except OrkError as e:  # the fit's own refusals (no fit row, NPU rows on a runtime without it) name the file too
        msg = str(e)
        raise OrkError(msg if msg.startswith(_where(times)) else f"{_where(times)}: {msg}") from None
    f.board = replace(f.board, runtime=name)
    text = runtime_toml(f, name, times.name, base.name, base.runtime)
    check = parse_runtime(tomllib.loads(text), _where(output))  # never write a file load_runtime would refuse
    assert check == f.board.path(), "written runtime path differs from the fitted one"
    write_atomic(output, text)
    return f, text


# -------------------------------------------------------------------------------------------- reports

def _num(v: float) -> str:
    return f"{v:.4g}"


def _show(p: Point, v: float) -> str:
    if p.unit == "s":
        return f"{v * 1e3:.4g} ms"
    return f"{v:.4g} tok/s"


def report_json(f: Fit, output: str | None = None) -> dict:
    fitted = {prm.field for prm in f.params}
    return {
        "board": f.base.name, "base": f.base.runtime, "output": output, "name": f.board.runtime,
        "constants": [{"key": f"{prm.section}.{prm.key}", "before": _get(f.base, prm), "after": _get(f.board, prm),
                       "fitted": prm.field in fitted,
                       **({"points": f.per_param[prm.field][0], "residual_pct": round(f.per_param[prm.field][1] * 100, 2),
                           "raw": f.raw[prm.field]} if prm.field in fitted else {"reason": f.why.get(prm.field, "")})}
                      for prm in PARAMS],
        "points": [{"id": p.id, "line": p.line, "kind": p.kind, "set": p.set, "setup": p.setup(), "unit": p.unit,
                    "measured": p.value, "predicted": float(a), "error_pct": round((a / p.value - 1) * 100, 2),
                    "before": float(b), "error_before_pct": round((b / p.value - 1) * 100, 2)}
                   for p, a, b in zip(f.points, f.after, f.before)],
        "fit": f.stats("fit"), "holdout": f.stats("holdout"), "evaluations": f.nfev,
    }


def report_text(f: Fit, output: str | None = None) -> str:
    fitted = {prm.field for prm in f.params}
    L = [f"board {f.base.name}, base runtime path {f.base.runtime}; {len(f.points)} rows: {f.stats('fit')['n']} fitted, "
         f"{f.stats('holdout').get('n', 0)} held out" + (f"; wrote {output}" if output else ""), "",
         f"{'constant':<28} {'before':>11} {'after':>11}  status"]
    for prm in PARAMS:
        b, a = _get(f.base, prm), _get(f.board, prm)
        if prm.field in fitted:
            n, r = f.per_param[prm.field]
            st = f"FITTED on {_points(n)}, residual {r * 100:.1f}%"
        else:
            st = f"kept ({f.why.get(prm.field, '')})"
        L.append(f"{prm.section + '.' + prm.key:<28} {_num(b):>11} {_num(a):>11}  {st}")
    L += ["", f"{'id':<34} {'set':<7} {'setup':<44} {'measured':>12} {'predicted':>12} {'error':>7} {'before':>7}"]
    for p, a, b in zip(f.points, f.after, f.before):
        L.append(f"{p.id[:34]:<34} {p.set:<7} {p.setup()[:44]:<44} {_show(p, p.value):>12} {_show(p, a):>12} "
                 f"{(a / p.value - 1) * 100:>+6.1f}% {(b / p.value - 1) * 100:>+6.1f}%")
    for st in SETS:
        s = f.stats(st)
        if s["n"]:
            L.append(f"{st}: {s['n']} rows, median |error| {s['median_abs_pct']}%, worst {s['worst_abs_pct']}%")
    return "\n".join(L)


# -------------------------------------------------------------------------------------------- published data

SOURCES = {  # id prefix -> short source (full references: docs/calibration/SOURCES.md)
    "rkb": "airockchip/rknn-llm benchmark.md @878f9361",
    "rkbold": "airockchip/rknn-llm benchmark.md @aca06744",
    "rk110": "airockchip/rknn-llm README.md @1a502afb (v1.1.0)",
    "inv": "invisiofficial/rk-llama.cpp ggml-rknpu2/README.md @39bb8e92",
    "mojo": "Mojo24x7/rk-llama.cpp BENCHMARKS.md @17a3200d",
    "wtw": "wtwver/rk3588-matmul-bench result.csv @04f53389",
    "ven": "VenomekPL/RockchipLlama docs/BENCHMARKS.md",
    "rk409": "airockchip/rknn-llm issue 409",
    "ll7176": "ggml-org/llama.cpp issue 7176",
}


def measurements() -> dict[str, dict]:
    with open(ROOT / "docs" / "calibration" / "measurements.csv", newline="", encoding="utf-8") as fh:
        return {r["id"]: r for r in csv.DictReader(fh)}


def published_boards(board: str = "rk3588-32g") -> dict[str, Board]:
    """Every shipped runtime path of the published rows on ``board``."""
    return {rt: load_board(board, rt, MEASURED_NF4_FORMAT) for rt in RUNTIME_FITS}


def predict_published(points: list[Point], boards: dict[str, Board]) -> np.ndarray:
    """Each published row predicted by the runtime path that ran it."""
    return np.array([predict(p, boards[p.runtime]) for p in points])


def _summary(label: str, pts: list[Point], e: np.ndarray) -> str:
    worst = int(np.argmax(e))
    return (f"{label}: {len(pts)} points, median |error| {np.median(e) * 100:.0f}%, worst {e[worst] * 100:.0f}% "
            f"({pts[worst].id}), within ±35%: {int((e <= 0.35).sum())} of {len(pts)}")


def published_table(boards: dict[str, Board] | None = None, points: list[Point] | None = None) -> str:
    """The markdown table of docs/CALIBRATION.md: every published row we model, predicted by the shipped
    runtime path that ran it (on the shipped board), and each runtime path's fit and held-out errors."""
    points = read_times(PUBLISHED) if points is None else points
    boards = published_boards() if boards is None else boards
    meas = measurements()
    pred = predict_published(points, boards)
    L = ["| # | id | runtime | kind | model / setup | as | published | predicted | error | set | source |",
         "|---:|---|---|---|---|---|---:|---:|---:|---|---|"]
    for i, (p, v) in enumerate(zip(points, pred), 1):
        r = meas[p.id]
        setup = (f"{r['model'] or 'matmul'} {r['quant']}".strip() if p.kind != "matmul"
                 else f"rknn_matmul int8 M={p.m} K={p.k} N={p.n}")
        L.append(f"| {i} | {p.id} | {p.runtime} | {r['kind']} | {setup} | {p.setup()} | {_show(p, p.value)} | "
                 f"{_show(p, v)} | {(v / p.value - 1) * 100:+.0f}% | {p.set} | {SOURCES[p.id.split('-')[0]]} |")
    e = np.abs(pred / np.array([p.value for p in points]) - 1.0)
    L.append("")
    for rt in RUNTIME_FITS:
        for st in SETS:
            sel = [i for i, p in enumerate(points) if p.runtime == rt and p.set == st]
            if sel:
                L.append(_summary(f"{rt} {st}", [points[i] for i in sel], e[sel]) + "  ")
    for st in SETS:
        sel = [i for i, p in enumerate(points) if p.set == st]
        L.append(_summary(f"all {st}", [points[i] for i in sel], e[sel]) + "  ")
    L[-1] = L[-1].rstrip()
    return "\n".join(L) + "\n"


@dataclass(frozen=True)
class Design:
    """How one runtime path's shipped constants are fitted to the published rows (docs/CALIBRATION.md section 3)."""
    fit: object  # Point -> bool: the row is in the fit set (the runtime's other rows are held out)
    params: tuple[str, ...]  # the constants fitted (Board fields)
    inherit: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (runtime path, its fitted constants this one takes)


def _inv_cpu(p: Point) -> bool:
    return p.id.startswith("inv-gemma-3-1b-it-") and p.choice != "npu"


CPU_FIELDS = ("cpu_int8_ops_per_s", "cpu_nf4_ops_per_s", "cpu_float_ops_per_s", "decode_fraction")
RUNTIME_FITS = {  # in fit order: a runtime path inheriting constants comes after the one it takes them from
    # llama.cpp's CPU backend: invisiofficial's Gemma3-1B Q8_0 / Q4_0 / F16 pp512 and tg128 (one build, board)
    "llama.cpp-cpu": Design(_inv_cpu, CPU_FIELDS + ("decode_token_s",)),
    # Rockchip's runtime: its matmul API's M sweep (Mojo24x7) and rkllm's current TTFT and decode tables; its
    # CPU work (attention, a tied head) at llama.cpp's CPU rates (no published row measures it alone)
    "rkllm": Design(lambda p: p.id.startswith("mojo-mm-") or p.id.startswith("rkb-"),
                    ("npu_efficiency", "submit_overhead_s", "npu_k_falloff", "decode_fraction", "decode_token_s",
                     "request_s"), inherit=(("llama.cpp-cpu", CPU_FIELDS[:3]),)),
    # ggml-ork: a llama.cpp backend; its nearest published evidence, invisiofficial's NPU build of the same
    # Gemma3-1B (pp512, tg128); submit_overhead_s is the field report's, its CPU side llama.cpp's
    "ggml-ork": Design(lambda p: p.id.startswith("inv-gemma-3-1b-it-"), ("npu_efficiency", "decode_token_s"),
                       inherit=(("llama.cpp-cpu", CPU_FIELDS), ("rkllm", ("npu_k_falloff",)))),
}


def design_points(points: list[Point], runtime: str) -> list[Point]:
    """The published rows of ``runtime``, each in the fit or the held-out set as its Design says."""
    d = RUNTIME_FITS[runtime]
    return [replace(p, set="fit" if d.fit(p) else "holdout") for p in points if p.runtime == runtime]


def published_fits(board: str = "rk3588-32g", base: dict[str, Board] | None = None) -> dict[str, Fit]:
    """Every runtime path of RUNTIME_FITS fitted to its published rows (docs/CALIBRATION.md section 3), from
    ``base`` (default: the shipped runtime paths), in order; inherited constants from the fits before."""
    pts = read_times(PUBLISHED)
    base = published_boards(board) if base is None else base
    fits: dict[str, Fit] = {}
    for rt, d in RUNTIME_FITS.items():
        b = base[rt]
        for src, fields in d.inherit:
            b = replace(b, **{f: getattr(fits[src].board, f) for f in fields})
        fits[rt] = fit(design_points(pts, rt), b, only=d.params)
    return fits


def fit_report(fits: dict[str, Fit]) -> str:
    out = []
    for rt, f in fits.items():
        inh = "; ".join(f"{', '.join(fl)} from {src}'s fit" for src, fl in RUNTIME_FITS[rt].inherit)
        out.append(f"== runtime path {rt}" + (f" (inherits {inh})" if inh else ""))
        out.append(report_text(f))
        out.append("")
    return "\n".join(out)


def update_doc(table: str) -> bool:
    text = DOC.read_text(encoding="utf-8")
    a, b = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    new = text[:a] + "\n" + table + text[b:]
    if new != text:
        DOC.write_text(new, encoding="utf-8")
    return new != text


def doc_table() -> str:
    text = DOC.read_text(encoding="utf-8")
    return text[text.index(TABLE_BEGIN) + len(TABLE_BEGIN):text.index(TABLE_END)].lstrip("\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--published" not in argv:
        print("usage: python -m orkpack.tiers.calibrate --published [--fit | --update-doc] [--board NAME]\n"
              "(users: orkpack calibrate TIMES.csv -o RUNTIME.toml)", file=sys.stderr)
        return 2
    name = argv[argv.index("--board") + 1] if "--board" in argv else "rk3588-32g"
    if "--fit" in argv:  # what the shipped runtime paths' constants were set from
        print(fit_report(published_fits(name)), end="")
        return 0
    table = published_table(published_boards(name))
    if "--update-doc" in argv:
        print(f"{'updated' if update_doc(table) else 'unchanged'}: {DOC}")
    else:
        print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
