"""Structure-aware fuzz of config.json through ``orkpack plan`` and ``orkpack build`` (issue 9, item 5).

    nice python fuzz/fuzz_config.py --seconds 300          # run for 5 minutes (wall time)
    nice python fuzz/fuzz_config.py --cases 500 --seed 7    # exactly 500 cases, reproducible
    nice python fuzz/fuzz_config.py --replay 435 --seed 3   # one case: its mutations and every outcome

Seeds: every ``orkpack.synth.TINY`` config and every real published config in
``tests/fixtures/configs/*.json`` (``params.json`` skipped). A case is a seed
plus 1-8 mutations (half the cases one, the rest 2-8 at once), drawn from
``random.Random(f"orkpack-config-fuzz:{seed}:{case}")``: the same (seed, case)
gives the same config as long as the seed list and this file do not change.

* ``set``: a value (top level, or inside text_config / vision_config /
  quantization_config / rope_scaling / any list) swapped for a huge int
  (2**31, 2**62, 2**63, 10**30, just over a cap), a value at a cap, a negative
  int, 0/1/odd ints, a float (1.5, 2.0, 1e308, NaN, +-Infinity: ``json.dumps``
  emits them), null, a wrong type (string, list, dict, bool, empty list), a
  hostile string (newline, ANSI escape, lone surrogate, bidi override, 5000
  characters), another family's model_type, another quant_method; or an int
  value's near miss (+-1, x2, /2, x1000, negated, the same as a float);
* ``del``: a key deleted;
* ``add``: a key orkpack reads (orkpack.archs' tables, the readers' keys)
  added with such a value, or a nested object (quantization_config, rope_scaling,
  text_config, vision_config, layer_types) added whole;
* ``root``: the whole file replaced by a non-object (rare).

Targets, each run on the mutated config.json:

* ``plan``: ``orkpack plan CONFIG.json --json`` through typer's CliRunner (in process);
* ``source``: ``open_source`` (+ ``tensors()``) and ``manifest_from_path`` on a tiny
  model folder of the seed's family (written once with ``write_hf_model``)
  whose config.json is replaced by the mutated one;
* ``build``: ``orkpack build FOLDER -o OUT --threads 1 --json`` (default options:
  the planner runs) on that folder; a pack it makes must open;
* ``build-noplan`` (only with ``--targets``): the same with ``--no-plan``.

A FINDING is: any exception other than ``orkpack.errors.OrkError`` (and
subclasses); a CLI exit code other than 0 or 2; a traceback in the output; an
error that is not exactly one ``error: ...`` line on stderr; --json output that
is not strict JSON; anything written to the process's own stdout/stderr around
the CLI's streams (C code printing: it would corrupt ``--json``); a failed
build that leaves anything at the output path (or a temp file beside it); a
target slower than ``--timeout`` seconds on one case (20: a hang). Each case
runs in a forked worker process (killed and restarted on a hang; its address
space is capped so an absurd allocation is a MemoryError, not the OOM killer).
Every new finding (by target, exception type and the innermost orkpack frame)
is minimized (mutations dropped one by one while the same finding remains) and
printed with its minimized mutation list and config; exit code 1 if any.

Used by tests/test_fuzz_config.py (a bounded deterministic sample in CI, and
the regression cases). docs/GUARANTEES.md (section 1, "Fuzzing") has the runs.
"""
from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "configs"
TARGETS = ("plan", "source", "build")  # the default set
EXTRA_TARGETS = ("build-noplan",)  # on request (--targets): build --no-plan, the rules placement
TIMEOUT = 20.0
MEM_LIMIT = 3 << 30  # address-space cap of the worker (numpy/xxhash need ~1 GB of mappings)

# ----------------------------------------------------------------------------------------------- seeds


def seeds() -> list[tuple[str, str, dict]]:
    """[(seed name, family whose tiny folder the build uses, config)]: TINY first, then the real configs."""
    from orkpack.synth import TINY

    out = [(f"tiny:{fam}", fam, copy.deepcopy(cfg)) for fam, cfg in sorted(TINY.items())]
    if FIXTURES.is_dir():
        for p in sorted(FIXTURES.glob("*.json")):
            if p.name == "params.json":
                continue
            try:
                cfg = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(cfg, dict):
                continue
            mt = cfg.get("model_type")
            fam = p.stem if p.stem in TINY else (mt if mt in TINY else "llama")
            out.append((f"real:{p.name}", fam, cfg))
    return out


# ------------------------------------------------------------------------------------------- mutations

NAN, INF = float("nan"), float("inf")
HUGE = [2**31, 2**62, 10**30, 2**63, (1 << 24) + 1, 4097, 65537, 1 << 21]
AT_CAPS = [1 << 24, 4096, 65536, 1 << 20, 1 << 16, 1 << 18]  # at orkpack.archs' caps (old and new): the slow corner
NEGATIVE = [-1, -2**31, -(10**30)]
SMALL = [0, 1, 3, 7]
FLOATS = [1.5, 2.0, 0.5, 1e308, -1e308, NAN, INF, -INF, -0.0]
WRONG = [None, "abc", "", "2", "sliding_attention", [], [1, 2], [[]], ["a"], {}, {"a": 1}, True, False]
HOSTILE_STR = ["line one\nline two", "\x1b[31mred\x1b[0m", "\ud800", "\u202eevil", "../../etc/passwd", "a" * 5000]
VALUES = HUGE + AT_CAPS + NEGATIVE + SMALL + FLOATS + WRONG + HOSTILE_STR

QUANT_TEMPLATES = [
    {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    {"quant_method": "fp8", "fmt": "e5m2"},
    {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]},
    {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    {"quant_method": "gptq", "bits": 4, "group_size": 128},
    {"quant_method": "awq", "bits": 4},
    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "block_structure": [128, 128]}}}},
]
ROPE_TEMPLATES = [
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"type": "linear", "factor": 2.0},
    {"rope_type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [2.0, 2.0]},
]


@functools.lru_cache(maxsize=1)
def _key_pools() -> dict[str, list[str]]:
    """Keys worth adding, per container: the ones orkpack reads, from its own tables."""
    from orkpack import archs

    top: set[str] = set()
    for keys in archs.COMMON_KEYS.values():
        top.update(keys)
    for fam in archs.FAMILIES.values():
        for keys in fam.keys.values():
            top.update(keys)
        top.update(k for k in fam.defaults)
    top.update(archs.BOOL_KEYS + archs.LAYER_LIST_KEYS + archs.STR_KEYS)
    top.update(("model_type", "text_config", "vision_config", "quantization_config", "compression_config",
                "rope_scaling", "layer_types", "torch_dtype", "dtype", "architectures", "use_sliding_window",
                "max_window_layers", "no_rope_layers", "sliding_window_pattern", "num_nextn_predict_layers"))
    return {
        "top": sorted(top),
        "vision_config": ["hidden_size", "intermediate_size", "num_hidden_layers", "patch_size", "image_size",
                          "num_channels", "num_attention_heads", "model_type"],
        "quantization_config": ["quant_method", "fmt", "weight_block_size", "config_groups", "activation_scheme",
                                "modules_to_not_convert", "bits"],
        "rope_scaling": ["type", "rope_type", "factor", "original_max_position_embeddings", "low_freq_factor",
                         "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"],
    }


@dataclass(frozen=True)
class Mutation:
    op: str  # set | del | add | root
    path: tuple  # keys / list indices from the top
    value: Any = None

    def describe(self) -> str:
        where = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p))
                        for i, p in enumerate(self.path)) or "<root>"
        if self.op == "del":
            return f"del {where}"
        return f"{self.op} {where} = {_show(self.value)}"


def _show(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1 << 20:
        for b in (31, 62, 63):
            if abs(v) == 1 << b:
                return ("-" if v < 0 else "") + f"2**{b}"
        if abs(v) == 10**30:
            return ("-" if v < 0 else "") + "10**30"
    s = json.dumps(v, allow_nan=True)
    return s if len(s) <= 120 else s[:117] + "..."


def _paths(obj: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Every path to a value inside obj (dict keys, list indices), depth-limited."""
    out: list[tuple] = []
    if depth > 4:
        return out
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,), depth + 1))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,), depth + 1))
    return out


def _containers(obj: Any) -> list[tuple]:
    """Paths of the dicts inside obj (the top level is ())."""
    out = [()]
    for p in _paths(obj):
        v = _get(obj, p)
        if isinstance(v, dict):
            out.append(p)
    return out


def _get(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


_READ_KEYS = None


def _interesting(path: tuple) -> bool:
    global _READ_KEYS
    if _READ_KEYS is None:
        pools = _key_pools()
        _READ_KEYS = set(k for v in pools.values() for k in v)
    return any(isinstance(p, str) and p in _READ_KEYS for p in path[-1:]) or (
        len(path) > 0 and path[0] in ("text_config", "vision_config", "quantization_config", "rope_scaling",
                                      "layer_types", "mlp_only_layers"))


def _value(rng: random.Random, path: tuple) -> Any:
    from orkpack import archs

    last = path[-1] if path else None
    r = rng.random()
    if last == "model_type" and r < 0.5:
        return rng.choice(sorted(archs.FAMILIES) + ["bert", "siglip_vision_model", "LLAMA"])
    if last == "quant_method" and r < 0.5:
        return rng.choice(["fp8", "mxfp4", "bitsandbytes", "gptq", "awq", "compressed-tensors", "hqq", "FP8"])
    if last in ("quantization_config", "compression_config") and r < 0.5:
        return copy.deepcopy(rng.choice(QUANT_TEMPLATES))
    if last == "rope_scaling" and r < 0.5:
        return copy.deepcopy(rng.choice(ROPE_TEMPLATES))
    if last == "layer_types" and r < 0.5:
        n = rng.choice([0, 1, 2, 3, 5, 64])
        return [rng.choice(["sliding_attention", "full_attention", "linear_attention"]) for _ in range(n)]
    if last in ("weight_block_size", "mlp_only_layers", "no_rope_layers") and r < 0.5:
        return [rng.choice(VALUES) for _ in range(rng.choice([0, 1, 2, 3]))]
    if last in ("text_config", "vision_config") and r < 0.3:
        from orkpack.synth import TINY

        return copy.deepcopy(TINY["gemma3"][last])
    return copy.deepcopy(rng.choice(VALUES))


def _tweak(rng: random.Random, v: int) -> Any:
    """A near miss of an int value: off by one, doubled, halved, zero, negated, scaled, or the same as a float."""
    return rng.choice([v + 1, v - 1, v * 2, v // 2, 0, 1, -v, v * 1000, v * 3 + 1, float(v), rng.randint(0, 300),
                       1 << rng.randint(0, 20)])


def random_mutation(rng: random.Random, cfg: Any) -> Mutation:
    """One mutation of cfg (a dict; see the module docstring for the kinds)."""
    if rng.random() < 0.01:
        return Mutation("root", (), rng.choice([[], [1, 2], "config", 3, None, 1.5, True]))
    r = rng.random()
    paths = _paths(cfg)
    if r < 0.55 and paths:
        hot = [p for p in paths if _interesting(p)]
        p = rng.choice(hot if hot and rng.random() < 0.8 else paths)
        v = _get(cfg, p)
        if isinstance(v, int) and not isinstance(v, bool) and rng.random() < 0.35:
            return Mutation("set", p, _tweak(rng, v))
        return Mutation("set", p, _value(rng, p))
    if r < 0.72 and paths:
        keyed = [p for p in paths if isinstance(p[-1], str)]
        hot = [p for p in keyed if _interesting(p)]
        if keyed:
            return Mutation("del", rng.choice(hot if hot and rng.random() < 0.8 else keyed))
    pools = _key_pools()
    cont = rng.choice(_containers(cfg))
    name = cont[-1] if cont else None
    pool = pools.get(name, pools["top"]) if name in pools else pools["top"]
    key = rng.choice(pool)
    return Mutation("add", cont + (key,), _value(rng, cont + (key,)))


def apply(cfg: Any, muts: list[Mutation]) -> Any:
    """The mutated copy of cfg; a mutation whose path no longer exists is skipped."""
    out = copy.deepcopy(cfg)
    for m in muts:
        if m.op == "root":
            out = copy.deepcopy(m.value)
            continue
        try:
            parent = _get(out, m.path[:-1])
        except (KeyError, IndexError, TypeError):
            continue
        k = m.path[-1]
        if isinstance(parent, dict) and isinstance(k, str):
            if m.op == "del":
                parent.pop(k, None)
            elif m.op == "add" or k in parent:
                parent[k] = copy.deepcopy(m.value)
        elif isinstance(parent, list) and isinstance(k, int) and k < len(parent):
            if m.op == "del":
                del parent[k]
            else:
                parent[k] = copy.deepcopy(m.value)
    return out


def case(seed: int, n: int, seed_list: list) -> tuple[str, str, dict, list[Mutation]]:
    """(seed name, family, seed config, mutations) of case n: the same for the same (seed, n)."""
    rng = random.Random(f"orkpack-config-fuzz:{seed}:{n}")
    name, fam, base = seed_list[rng.randrange(len(seed_list))]
    r = rng.random()
    k = 1 if r < 0.5 else (rng.randint(2, 4) if r < 0.85 else rng.randint(5, 8))
    muts: list[Mutation] = []
    cur = base
    for _ in range(k):
        if not isinstance(cur, dict):  # the whole file was replaced: nothing left to mutate
            break
        m = random_mutation(rng, cur)
        muts.append(m)
        cur = apply(cur, [m])
    return name, fam, base, muts


def dumps(cfg: Any) -> str:
    return json.dumps(cfg, allow_nan=True, indent=1)


# ------------------------------------------------------------------------------------------- checking

@dataclass
class Outcome:
    target: str
    ok: bool
    kind: str = ""  # exception | exit-code | traceback | multi-line | bad-json | leftover | hang
    sig: str = ""  # what makes two findings the same
    detail: str = ""
    error: str = ""  # the OrkError line, when there is one
    seconds: float = 0.0


def _signature(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if f"{os.sep}orkpack{os.sep}" in f.filename]
    f = (own or frames or [None])[-1]
    where = f"{Path(f.filename).name}:{f.name}:{f.lineno}" if f is not None else "?"
    return f"{type(exc).__name__} at {where}"


def _exc_outcome(target: str, exc: BaseException) -> Outcome:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Outcome(target, False, "exception", _signature(exc), tb[-3000:])


def _check_cli(target: str, res, *, want_json: bool) -> Outcome:
    """The CLI properties: exit 0 or 2; no traceback; exit 2 is one ``error:`` line; JSON output is strict."""
    from orkpack.errors import OrkError

    if res.exception is not None and not isinstance(res.exception, SystemExit):
        if isinstance(res.exception, OrkError):  # escaped the CLI's handler
            return Outcome(target, False, "exception", "OrkError escaped the CLI", str(res.exception))
        exc = res.exception
        if res.exc_info is not None:
            exc.__traceback__ = res.exc_info[2]
        return _exc_outcome(target, exc)
    out, err = res.stdout or "", res.stderr or ""
    if "Traceback (most recent call last)" in out + err:
        return Outcome(target, False, "traceback", "traceback in output", (out + err)[-3000:])
    if res.exit_code not in (0, 2):
        return Outcome(target, False, "exit-code", f"exit {res.exit_code}", (out + err)[-3000:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    stray = [ln for ln in lines if not ln.startswith(("error: ", "warning: ", "info: "))]
    if res.exit_code == 2:
        if len(errors) != 1 or stray:
            return Outcome(target, False, "multi-line", "exit 2 without exactly one error line", err[-3000:])
        return Outcome(target, True, error=errors[0][len("error: "):])
    if errors or stray:
        return Outcome(target, False, "multi-line", "exit 0 with error or stray stderr lines", err[-3000:])
    if want_json:
        def _no_constant(c):
            raise ValueError(f"non-standard JSON constant {c}")
        try:
            json.loads(out, parse_constant=_no_constant)
        except ValueError as e:
            return Outcome(target, False, "bad-json", f"stdout is not strict JSON ({e})", out[:2000])
    return Outcome(target, True)


class Runner:
    """Runs the targets in this process (the worker side)."""

    def __init__(self, workdir: Path):
        from typer.testing import CliRunner

        self.work = Path(workdir)
        self.cli = CliRunner()
        (self.work / "out").mkdir(parents=True, exist_ok=True)

    def folder(self, fam: str) -> Path:
        """The tiny model of a family (written once; its config.json is replaced per case)."""
        d = self.work / "models" / fam
        if not (d / ".done").exists():
            from orkpack.synth import TINY, write_hf_model

            shutil.rmtree(d, ignore_errors=True)
            write_hf_model(d, config=TINY[fam], shards=2, seed=0)
            (d / "config.orig.json").write_text((d / "config.json").read_text())
            (d / ".done").write_text("")
        return d

    def run(self, target: str, fam: str, text: str) -> Outcome:
        t0 = time.perf_counter()
        try:
            o = getattr(self, "_" + target.replace("-", "_"))(fam, text)
        except BaseException as e:  # noqa: BLE001 - anything escaping a target is the finding
            if isinstance(e, KeyboardInterrupt):
                raise
            from orkpack.errors import OrkError

            o = Outcome(target, True, error=str(e)) if isinstance(e, OrkError) else _exc_outcome(target, e)
        o.seconds = time.perf_counter() - t0
        return o

    def _plan(self, fam: str, text: str) -> Outcome:
        p = self.work / "plan" / "config.json"
        p.parent.mkdir(exist_ok=True)
        p.write_text(text)
        res = self.cli.invoke(_app(), ["plan", str(p), "--json"])
        return _check_cli("plan", res, want_json=True)

    def _source(self, fam: str, text: str) -> Outcome:
        from orkpack.errors import OrkError
        from orkpack.sources.open import open_source
        from orkpack.tiers.manifest import manifest_from_path

        d = self.folder(fam)
        (d / "config.json").write_text(text)
        first = None
        try:
            src = open_source(d)
            try:
                src.tensors()
            finally:
                src.close()
        except OrkError as e:
            first = str(e)
        try:
            manifest_from_path(d)
        except OrkError as e:
            first = first or str(e)
        return Outcome("source", True, error=first or "")

    def _build(self, fam: str, text: str, *extra: str, target: str = "build") -> Outcome:
        d = self.folder(fam)
        (d / "config.json").write_text(text)
        outdir = self.work / "out"
        for stale in outdir.iterdir():
            stale.unlink()
        out = outdir / "m.orkpack"
        res = self.cli.invoke(_app(), ["build", str(d), "-o", str(out), "--threads", "1", "--json", *extra])
        o = _check_cli(target, res, want_json=True)
        left = sorted(x.name for x in outdir.iterdir())
        if o.ok and res.exit_code != 0 and left:
            return Outcome(target, False, "leftover", "failed build left files at the output", ", ".join(left))
        if o.ok and res.exit_code == 0:
            if left != ["m.orkpack"]:
                return Outcome(target, False, "leftover", "build left other files beside the pack", ", ".join(left))
            from orkpack.errors import OrkError
            from orkpack.pack.reader import Pack

            try:
                Pack.open(out).close()
            except OrkError as e:
                return Outcome(target, False, "exception", "the built pack does not open", str(e))
        return o

    def _build_noplan(self, fam: str, text: str) -> Outcome:
        return self._build(fam, text, "--no-plan", target="build-noplan")


_APP = None


def _app():
    global _APP
    if _APP is None:
        from orkpack.cli import app

        _APP = app
    return _APP


# --------------------------------------------------------------------------------------------- workers

def _serve(conn, workdir: str, mem_limit: int) -> None:
    try:
        import resource

        if mem_limit:
            resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
    except (ImportError, ValueError, OSError):
        pass
    # the worker's own stdout and stderr (file descriptors 1 and 2) go to a file: whatever lands there went
    # around the CLI's streams (C code printing, a stray print), and would corrupt `orkpack plan --json`
    stray = tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stray.fileno(), 1)
    os.dup2(stray.fileno(), 2)
    runner = Runner(Path(workdir))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        target, fam, text = job
        stray.seek(0)
        stray.truncate()
        o = runner.run(target, fam, text)
        sys.stdout.flush()
        sys.stderr.flush()
        stray.seek(0)
        extra = stray.read().decode("utf-8", "replace")
        bad = [ln for ln in extra.splitlines() if ln.strip() and not ln.startswith(("warning: ", "info: "))]
        if o.ok and bad:
            o = Outcome(target, False, "stray-output", "wrote to the process's stdout/stderr around the CLI: "
                        + bad[0][:80], extra[-3000:], seconds=o.seconds)
        conn.send(o)


class Worker:
    """One forked worker; ``run`` returns an Outcome, or a ``hang`` Outcome after ``timeout`` (worker restarted)."""

    def __init__(self, workdir: Path, timeout: float = TIMEOUT, mem_limit: int = MEM_LIMIT):
        self.workdir, self.timeout, self.mem_limit = Path(workdir), timeout, mem_limit
        self.proc = None
        self.restarts = 0

    def _start(self) -> None:
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, str(self.workdir), self.mem_limit), daemon=True)
        self.proc.start()
        child.close()

    def run(self, target: str, fam: str, text: str) -> Outcome:
        if self.proc is None or not self.proc.is_alive():
            self._start()
        t0 = time.perf_counter()
        self.conn.send((target, fam, text))
        if self.conn.poll(self.timeout):
            try:
                return self.conn.recv()
            except EOFError:
                pass
            self.stop()
            return Outcome(target, False, "crash", "worker died (signal or exit)", "",
                           seconds=time.perf_counter() - t0)
        self.stop()
        return Outcome(target, False, "hang", f"over {self.timeout:g} s", "", seconds=time.perf_counter() - t0)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
            self.proc = None
            self.restarts += 1

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
        self.proc = None


# ------------------------------------------------------------------------------------------------ the run

@dataclass
class Finding:
    target: str
    kind: str
    sig: str
    seed: str
    family: str
    case: int
    mutations: list[Mutation]
    config: Any
    detail: str

    def report(self) -> str:
        muts = "; ".join(m.describe() for m in self.mutations) or "(none: the seed itself)"
        return (f"FINDING [{self.target}] {self.kind}: {self.sig}\n  seed {self.seed} (case {self.case}), "
                f"minimized mutations: {muts}\n  config: {json.dumps(self.config, allow_nan=True)[:1500]}\n"
                + "\n".join("  | " + ln for ln in self.detail.strip().splitlines()[-12:]))


@dataclass
class Stats:
    executions: dict = field(default_factory=lambda: {t: 0 for t in TARGETS + EXTRA_TARGETS})
    seconds: dict = field(default_factory=lambda: {t: 0.0 for t in TARGETS + EXTRA_TARGETS})
    findings: dict = field(default_factory=lambda: {t: [] for t in TARGETS + EXTRA_TARGETS})
    refused: dict = field(default_factory=lambda: {t: 0 for t in TARGETS + EXTRA_TARGETS})  # OrkError: fine
    messages: dict = field(default_factory=lambda: {t: {} for t in TARGETS + EXTRA_TARGETS})  # refusal shapes
    cases: int = 0
    wall: float = 0.0


def _shape(msg: str) -> str:
    """An error line without its file name and numbers: what kind of refusal it is."""
    import re

    msg = msg.split(": ", 1)[1] if ": " in msg else msg
    return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", msg)[:110]


def _minimize(worker: Worker, target: str, fam: str, base: Any, muts: list[Mutation], sig: str) -> list[Mutation]:
    cur = list(muts)
    changed = True
    while changed and len(cur) > 1:
        changed = False
        for i in range(len(cur)):
            trial = cur[:i] + cur[i + 1:]
            o = worker.run(target, fam, dumps(apply(base, trial)))
            if not o.ok and o.sig == sig:
                cur, changed = trial, True
                break
    if cur:
        o = worker.run(target, fam, dumps(base))
        if not o.ok and o.sig == sig:
            return []
    return cur


def fuzz(*, seconds: float | None = None, cases: int | None = None, seed: int = 0, targets=TARGETS,
         timeout: float = TIMEOUT, workdir: Path | None = None, minimize: bool = True, log=print,
         start: int = 0) -> Stats:
    """Run cases start, start+1, ... until ``cases`` are done or ``seconds`` have passed."""
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="orkpack-config-fuzz-")) if own else Path(workdir)
    seed_list = seeds()
    worker = Worker(work, timeout)
    st = Stats()
    seen: set[tuple[str, str]] = set()
    t0 = time.perf_counter()
    n = start
    try:
        while True:
            if cases is not None and n - start >= cases:
                break
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
            name, fam, base, muts = case(seed, n, seed_list)
            text = dumps(apply(base, muts))
            for target in targets:
                o = worker.run(target, fam, text)
                st.executions[target] += 1
                st.seconds[target] += o.seconds
                if o.ok and o.error:
                    st.refused[target] += 1
                    shape = _shape(o.error)
                    st.messages[target][shape] = st.messages[target].get(shape, 0) + 1
                if o.ok or (target, o.sig) in seen:
                    continue
                seen.add((target, o.sig))
                small = _minimize(worker, target, fam, base, muts, o.sig) if minimize else muts
                f = Finding(target, o.kind, o.sig, name, fam, n, small, apply(base, small), o.detail)
                st.findings[target].append(f)
                log(f.report())
            st.cases += 1
            n += 1
    finally:
        worker.close()
        st.wall = time.perf_counter() - t0
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return st


def replay(seed: int, n: int) -> None:
    """Print case n of seed: its seed config, mutations and the outcome of every target."""
    seed_list = seeds()
    name, fam, base, muts = case(seed, n, seed_list)
    print(f"case {n} (seed {seed}): {name}, folder {fam}")
    for m in muts:
        print("  " + m.describe())
    with tempfile.TemporaryDirectory(prefix="orkpack-config-fuzz-") as work:
        w = Worker(Path(work))
        try:
            for target in TARGETS:
                o = w.run(target, fam, dumps(apply(base, muts)))
                print(f"  {target}: {'ok' if o.ok else 'FINDING ' + o.kind + ' ' + o.sig} "
                      f"{o.error or ''} ({o.seconds:.2f} s)")
                if not o.ok:
                    print(o.detail)
        finally:
            w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=None, help="wall time to run (default 60 unless --cases)")
    ap.add_argument("--cases", type=int, default=None, help="number of cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds one target may take on one case")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help="comma-separated, from plan,source,build (the default) and build-noplan")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--stats", action="store_true", help="also show how often each kind of refusal came up")
    ap.add_argument("--replay", type=int, default=None, metavar="N", help="run case N alone and show everything")
    a = ap.parse_args(argv)
    if a.replay is not None:
        replay(a.seed, a.replay)
        return 0
    if a.seconds is None and a.cases is None:
        a.seconds = 60.0
    targets = tuple(t for t in a.targets.split(",") if t)
    bad = [t for t in targets if t not in TARGETS + EXTRA_TARGETS]
    if bad:
        ap.error(f"unknown target(s) {bad}; choose from {TARGETS + EXTRA_TARGETS}")
    print(f"seeds: {len(seeds())} configs; targets: {', '.join(targets)}; seed {a.seed}, from case {a.start}",
          flush=True)
    st = fuzz(seconds=a.seconds, cases=a.cases, seed=a.seed, targets=targets, timeout=a.timeout,
              minimize=not a.no_minimize, start=a.start, log=lambda s: print(s, flush=True))
    print(f"\n{st.cases} cases (cases {a.start}..{a.start + st.cases - 1}, seed {a.seed}) in {st.wall:.1f} s wall")
    total = 0
    for t in targets:
        n = len(st.findings[t])
        total += n
        print(f"  {t:7s} executions {st.executions[t]:6d}  seconds {st.seconds[t]:7.1f}  "
              f"refused (OrkError) {st.refused[t]:6d}  findings {n}")
        for f in st.findings[t]:
            print(f"    - {f.kind}: {f.sig} <- {'; '.join(m.describe() for m in f.mutations) or '(seed)'}"
                  f" [{f.seed}]")
    if a.stats:
        for t in targets:
            print(f"  most common refusals, {t}:")
            for shape, c in sorted(st.messages[t].items(), key=lambda x: -x[1])[:12]:
                print(f"    {c:6d}  {shape}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
