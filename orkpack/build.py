"""`orkpack build`: source checkpoint -> placement -> codecs/layout -> pack writer.

Pipeline: an I/O thread maps the next tensor while this one is encoded (C
kernels, ``--threads`` of them, reading bf16/f16/f32 directly), and the
writer's thread writes and checksums the previous tensor's parts; a third
thread hashes the source files for the provenance. The bytes never depend on
the timing or the thread count.

I/O (issue 14; bench/README.md has the profile before and after): float and
raw source tensors are the source file's own pages (``Source.mapped``: no
read into a buffer, no copy); the codecs encode into the pack writer's
reused, page-aligned buffers (``alloc=w.alloc``), which go to the file with
no copy, by ``O_DIRECT`` where the file system takes it (no page cache to
fill, then flush again at fsync). Fresh pages, which the kernel faults in and
zeroes, are touched about once for the largest tensor's parts, not for every
tensor.

Memory: tensors stream one at a time. A build maps at most two source
tensors (one when the source is float32; dequantized types are read into at
most two reused buffers instead), holds the parts being encoded (int8: 1/4 of
the float32 size, NF4: ~1/7; both for a dual-resident slice: int8 tiles plus
its host NF4 copy), and at most half the largest tensor as float32 queued for
writing: under 2x the largest tensor as float32, plus the interpreter
(~100 MB). tests/test_build.py and bench/bench_build.py measure it.

Every source tensor is accounted for: float tensors are placed (tier map or
rules) and encoded; non-float tensors (bool, integers, f64, c64) are carried
raw on the host, before any placement is asked (:func:`raw_decision`); buffers
the config derives (``position_ids``, ``rotary_emb.inv_freq``, GPT-2 causal
masks: orkpack/sources/derivable.py) are left out by the reader, named in one
info line and recorded in ``provenance.skipped``.
"""
from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import xxhash

from orkpack import globs
from orkpack.codecs import get_codec
from orkpack.codecs.nf4opt import NF4Choice, choose as choose_nf4
from orkpack.codecs.reference import nf4_to_npu_int8
from orkpack.errors import OrkError, SourceError, escape_name
from orkpack.keepfloat import pin_warnings, stays_float
from orkpack.pack import spec
from orkpack.pack.writer import PackWriter
from orkpack.sources import open_source
from orkpack.sources.base import RAW_DTYPES, Skipped, TensorInfo, is_raw

# min_m for NPU slices placed by rules (no tier map): the batch size from which
# the NPU pays for its ~365 us submit cost on typical 4096-wide layers. The tier
# map computes it per tensor from the board's cost model. Never below 2.
RULES_MIN_M = 32

_HASH_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)

FLOAT_ENC = {np.dtype(np.float32): spec.ENC_F32, np.dtype(np.float16): spec.ENC_F16, np.dtype(np.uint16): spec.ENC_BF16}


@dataclass
class BuildOptions:
    threads: int = 0  # 0: all cores
    int8: list[str] = field(default_factory=list)
    nf4: list[str] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    npu: list[str] = field(default_factory=list)
    cpu: list[str] = field(default_factory=list)
    npu_storage: str = "int8"  # int8 tiles, or nf4 inflated at load (w4a8)
    # NF4 bytes (orkpack/codecs/nf4opt.py): "opt" error-minimizing absmax, or "bnb" (quantize_4bit's bytes);
    # the opt search's weighting, and the activation statistics (orkpack imatrix, or llama.cpp's) that weigh its
    # columns, smooth the NPU's activations and clip int8 rows
    nf4_mode: str = NF4Choice.mode
    nf4_weighting: str = NF4Choice.weighting
    nf4_format: str | None = None  # dq32 (nf4dq) or b64 (nf4); None: dq32 with opt, b64 with bnb, a --tiermap's own
    imatrix: Path | None = None
    allow_nonfinite: bool = False
    # placement: the tier-map compiler (default) or the rules alone (plan=False)
    plan: bool = True
    board: str = "rk3588-32g"
    runtime: str | None = None  # the runtime path the plan is for (None: ggml-ork, the default)
    profile: Path | None = None
    ctx: int = 8192
    kv_type: str = "f16"
    prefill_m: int = 512
    ignore_unknown: bool = False
    timestamp: bool = False  # record provenance.created (the only time a header may hold)
    # a tier-map JSON file (orkpack plan -o FILE, or edited by hand) to follow instead of planning;
    # the only source of dual-resident slices (NPU tiles + a host copy)
    tiermap: Path | None = None
    # what the plan optimizes (orkpack.tiers.solver.Goal)
    goal: str = "balanced"
    min_decode_tok_s: float | None = None
    min_prefill_tok_s: float | None = None
    max_ram: int | None = None
    max_kld: float | None = None
    prompt: int = 512
    # activation smoothing (orkpack/smooth.py), from the same statistics file (`imatrix` above); on when it is
    # given unless smooth is False; smooth_alpha fixes SmoothQuant's alpha (None: searched per group)
    smooth: bool = True
    smooth_alpha: float | None = None
    clip: bool = True  # with imatrix: clamp int8 rows to their least-error ratio (orkpack/clip.py)
    # with smoothing, a tied head placed on the NPU is stored as a smoothed untied copy (orkpack/smooth.py)
    untie_head: bool = True
    # the options the user gave explicitly (the CLI fills it), so that --tiermap can refuse the planning
    # options it would ignore even when they equal their defaults (:func:`refuse_ignored_plan_options`)
    given: frozenset = frozenset()

    def resolved_threads(self) -> int:
        return self.threads if self.threads > 0 else (os.cpu_count() or 1)

    def recorded(self) -> dict:
        """The options that shape the bytes (threads do not)."""
        return {
            "int8": list(self.int8),
            "nf4": list(self.nf4),
            "keep": list(self.keep),
            "npu": list(self.npu),
            "cpu": list(self.cpu),
            "npu_storage": self.npu_storage,
            "nf4_mode": self.nf4_mode,
            "allow_nonfinite": self.allow_nonfinite,
            "plan": self.plan,
            "board": self.board,
            "runtime": self.runtime,
            "profile": None if self.profile is None else Path(self.profile).name,
            "ctx": self.ctx,
            "kv_type": self.kv_type,
            "prefill_m": self.prefill_m,
            "goal": self.goal,
            "min_decode_tok_s": self.min_decode_tok_s,
            "min_prefill_tok_s": self.min_prefill_tok_s,
            "max_ram": self.max_ram,
            "prompt": self.prompt,
        } | ({} if self.nf4_mode != "opt" else {"nf4_weighting": self.nf4_weighting,
                                                "nf4_format": self.nf4_format or NF4Choice.format}) \
            | ({} if self.tiermap is None else {"tiermap": Path(self.tiermap).name}) \
            | ({} if self.imatrix is None else {"imatrix": Path(self.imatrix).name, "smooth": self.smooth,
                                                "smooth_alpha": self.smooth_alpha, "clip": self.clip}
               | ({} if self.untie_head else {"untie_head": False})) \
            | ({} if self.max_kld is None else {"max_kld": self.max_kld})

    def pins(self) -> dict[str, list[str]]:
        return {"npu": list(self.npu), "cpu": list(self.cpu), "int8": list(self.int8), "nf4": list(self.nf4), "keep": list(self.keep)}


@dataclass(frozen=True)
class Decision:
    encoding: str
    tier: str
    min_m: int | None = None
    dtype: str | None = None  # raw only: the element type (spec.RAW_DTYPES)
    host_copy: str | None = None  # NPU only: also keep a host copy in this encoding (spec.HOST_COPY_ENCODINGS)


def raw_decision(info: TensorInfo) -> Decision | None:
    """Non-float tensors (bool, integers, f64, c64) are carried raw on the host, whatever the pins:
    never quantized, never on the NPU, never asked of the planner. None for float tensors."""
    if not is_raw(info.dtype):
        return None
    return Decision(spec.ENC_RAW, spec.TIER_HOST, None, RAW_DTYPES[info.dtype])


def _match(name: str, gl: list[str]) -> bool:
    return any(globs.matches(name, g) for g in gl)


class RulePlacement:
    """Precision and placement from rules alone (``--no-plan``).

    Precedence: --keep (stay float), --npu (int8 tiles on the NPU), --int8,
    --nf4, then the defaults: what always stays float (orkpack/keepfloat.py: ranks other than 2 and 3, biases of any
    rank, MoE routers; before every pin) stays float; the output head is int8
    (it is the most quantization-sensitive matrix, which is why llama.cpp's
    quantizer keeps it at higher precision); the token embedding is NF4 (row
    lookups), or int8 when it doubles as the output head (tied); every other
    2-D or 3-D weight is NF4. All non-NPU tensors live on the host (CPU/GPU).
    Before all of these: non-float tensors are carried raw (:func:`raw_decision`).
    """

    def __init__(self, opts: BuildOptions, infos: list[TensorInfo]):
        self.opts = opts
        names = {i.name for i in infos}
        self.tied = "output.weight" not in names

    def decide(self, info: TensorInfo, expert: int | None) -> Decision:
        raw = raw_decision(info)
        if raw is not None:
            return raw
        o = self.opts
        names = [info.name] if expert is None else [info.name, f"{info.name}[{expert}]"]
        hit = lambda gl: any(_match(n, gl) for n in names)  # noqa: E731
        if stays_float(info.name, info.shape) or hit(o.keep):
            return Decision(FLOAT_ENC_BY_DTYPE.get(info.dtype, spec.ENC_F32), spec.TIER_HOST)
        if hit(o.npu):
            enc = spec.ENC_NF4 if o.npu_storage == "nf4" else spec.ENC_INT8
            return Decision(enc, spec.TIER_NPU, RULES_MIN_M)
        if hit(o.int8):
            return Decision(spec.ENC_INT8, spec.TIER_HOST)
        if hit(o.nf4):
            return Decision(spec.ENC_NF4, spec.TIER_HOST)
        if info.name == "output.weight" or (self.tied and info.name == "token_embd.weight"):
            return Decision(spec.ENC_INT8, spec.TIER_HOST)
        return Decision(spec.ENC_NF4, spec.TIER_HOST)


FLOAT_ENC_BY_DTYPE = {"F32": spec.ENC_F32, "F16": spec.ENC_F16, "BF16": spec.ENC_BF16}


class TierMapPlacement:
    """Precision and placement from a solved tier map (the default).

    The rule flags became the solver's pins. ``--npu-storage nf4`` stores the
    NPU's int8 items 4-bit, to be inflated to int8 tiles at load. An NPU item
    the map gives a host copy (dual residency) keeps it, whatever the storage.
    """

    def __init__(self, tm, opts: BuildOptions):
        self.tm = tm
        self.opts = opts

    def decide(self, info: TensorInfo, expert: int | None) -> Decision:
        raw = raw_decision(info)
        if raw is not None:  # before the tier map: whatever it says of this tensor, its values are not weights
            return raw
        if stays_float(info.name, info.shape):  # the one float rule, whatever the map says (load_tiermap warns)
            return Decision(FLOAT_ENC_BY_DTYPE.get(info.dtype, spec.ENC_F32), spec.TIER_HOST)
        d = self.tm.get(info.name, expert)
        enc, tier, min_m = d.encoding, d.tier, d.min_m
        if tier == spec.TIER_NPU:
            if self.opts.npu_storage == "nf4":
                enc = spec.ENC_NF4
            return Decision(enc, tier, min_m, host_copy=getattr(d, "host_copy", None))
        if enc in spec.FLOAT_ENCODINGS:
            enc = FLOAT_ENC_BY_DTYPE.get(info.dtype, spec.ENC_F32)
        return Decision(enc, tier)


# a tier map embeds in the pack header, so it can be no larger than the header's cap
MAX_TIERMAP_BYTES = spec.MAX_HEADER_SIZE


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def load_tiermap(path: Path, infos: list[TensorInfo]) -> tuple["TierMap", list[str]]:  # noqa: F821
    """The tier map in the JSON file ``path`` (``orkpack plan -o``), checked against the source:
    every float tensor (every expert of a stacked one) must have a decision of its shape.
    Returns (tier map, warning lines). Raises OrkError with one line otherwise."""
    import json
    import math

    from orkpack.tiers.tiermap import TierMap

    label = escape_name(str(path))
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_TIERMAP_BYTES:
                raise OrkError(f"tier map {label}: {size} bytes, over the {MAX_TIERMAP_BYTES}-byte cap")
            text = f.read(MAX_TIERMAP_BYTES + 1)
    except FileNotFoundError:
        raise OrkError(f"tier map {label}: no such file (write one with `orkpack plan SOURCE -o FILE`)") from None
    except IsADirectoryError:
        raise OrkError(f"tier map {label}: is a folder, not a tier-map JSON file") from None
    except OSError as e:
        raise OrkError(f"tier map {label}: cannot read ({e.strerror})") from None
    try:
        d = json.loads(text.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise OrkError(f"tier map {label}: not valid JSON ({escape_name(str(e), 120)})") from None
    except RecursionError:
        raise OrkError(f"tier map {label}: JSON nests too deep") from None
    try:
        tm = TierMap.from_json(d)
    except OrkError as e:
        raise OrkError(f"tier map {label}: {e}") from None
    if not all(math.isfinite(x.benefit_us) for x in tm.decisions):
        raise OrkError(f"tier map {label}: a benefit_us is not a finite number; plan again")
    missing, wrong, used, overruled = [], [], set(), []
    for info in infos:
        if is_raw(info.dtype):  # carried raw whatever the map says (raw_decision)
            continue
        stacked = len(info.shape) == 3
        want = tuple(info.shape[1:] if stacked else info.shape)
        for e in (range(info.shape[0]) if stacked else [None]):
            item = info.name if e is None else f"{info.name}[{e}]"
            try:
                dec = tm.get(info.name, e)
            except OrkError:
                missing.append(item)
                continue
            used.add(id(dec))
            if dec.encoding not in spec.FLOAT_ENCODINGS and stays_float(info.name, info.shape):
                overruled.append(info.name)
            if tuple(dec.shape) != want:
                wrong.append(f"{escape_name(item)} is {list(dec.shape)} in the map, {list(want)} in the source")
            elif dec.encoding == spec.ENC_RAW:
                wrong.append(f"{escape_name(item)} is raw in the map but a float tensor in the source")
            elif dec.tier == spec.TIER_NPU and len(want) != 2:
                wrong.append(f"{escape_name(item)} is on the NPU in the map but is not a matrix")
    if missing:
        shown = ", ".join(escape_name(m, 80) for m in missing[:4]) + (", ..." if len(missing) > 4 else "")
        raise OrkError(f"tier map {label} does not cover {len(missing)} item{'s' if len(missing) != 1 else ''} of the "
                       f"source ({shown}); plan this source again (orkpack plan SOURCE -o FILE)")
    if wrong:
        raise OrkError(f"tier map {label} does not fit this source: {wrong[0]}"
                       f"{f' (and {len(wrong) - 1} more)' if len(wrong) > 1 else ''}; plan this source again")
    warnings = list(getattr(tm, "warnings", []))
    overruled = sorted(set(overruled), key=overruled.index)
    if overruled:
        warnings.append(f"tier map {label} quantizes {len(overruled)} tensor{'s' if len(overruled) != 1 else ''} "
                        f"that always stay float ({', '.join(escape_name(m, 80) for m in overruled[:4])}"
                        f"{', ...' if len(overruled) > 4 else ''}); kept float")
    extra = [x.name for x in tm.decisions if id(x) not in used and x.encoding != spec.ENC_RAW]
    if extra:
        shown = ", ".join(escape_name(m, 80) for m in extra[:4]) + (", ..." if len(extra) > 4 else "")
        warnings.append(f"tier map {label} lists {len(extra)} item{'s' if len(extra) != 1 else ''} the source "
                        f"does not have ({shown}); ignored")
    return tm, warnings


# the options that shape a plan, which a given tier map makes meaningless: field -> flag
PLAN_OPTIONS = {"board": "--board", "runtime": "--runtime", "profile": "--profile", "ctx": "--ctx", "kv_type": "--kv-type",
                "prefill_m": "--prefill-m", "ignore_unknown": "--ignore-unknown", "goal": "--goal",
                "min_decode_tok_s": "--min-decode-tok-s", "min_prefill_tok_s": "--min-prefill-tok-s",
                "max_ram": "--max-ram", "max_kld": "--max-kld", "prompt": "--prompt"}


def refuse_ignored_plan_options(opts: BuildOptions) -> None:
    """With --tiermap (the map is followed as it is) or --no-plan (no plan at all), refuse in one line the
    planning options the build would silently ignore: those given explicitly (``opts.given``) and those
    that differ from their defaults."""
    if opts.tiermap is None and opts.plan:
        return
    default = BuildOptions()
    flags = [flag for f, flag in PLAN_OPTIONS.items() if f in opts.given or getattr(opts, f) != getattr(default, f)]
    if not flags:
        return
    it, these = ("it", "this option") if len(flags) == 1 else ("them", "these options")
    if opts.tiermap is not None:
        head, why, alt = "--tiermap", "a given tier map is followed as it is", f"plan with {it} (orkpack plan SOURCE ... -o FILE)"
    else:
        head, why, alt = "--no-plan", "no tier map is solved", "drop --no-plan"
    raise OrkError(f"{head} with {', '.join(flags)}: {why}, so {these} would be ignored; drop {it}, or {alt}")


def follow_nf4_format(tm, map_path: Path, opts: BuildOptions, nf4: NF4Choice) -> tuple[BuildOptions, NF4Choice]:
    """(options, NF4 choice) of a build that follows tier map ``tm``: host NF4 in the map's NF4 format, whose
    bytes its plan counts (docs/TIERMAP.md section 5; a map without one was planned at b64). An --nf4-format
    (or --nf4-mode bnb, which writes b64 only) that contradicts the map is refused in one line."""
    from orkpack.tiers.board import check_nf4_format

    label = escape_name(str(map_path))
    fmt = check_nf4_format(tm.nf4_format, f"tier map {label}")
    if fmt == nf4.format:
        return opts, nf4
    head = f"tier map {label} was planned for NF4 format {fmt} (its bytes and predictions count it), but"
    if opts.nf4_format is not None:
        raise OrkError(f"{head} the build was given --nf4-format {nf4.format}: drop --nf4-format to follow the map, "
                       f"or plan again with orkpack plan --nf4-format {nf4.format}")
    if nf4.mode != "opt":
        raise OrkError(f"{head} --nf4-mode {nf4.mode} writes {nf4.format} only: plan again with orkpack plan "
                       f"--nf4-format {nf4.format}, or build with --nf4-mode opt")
    return replace(opts, nf4_format=fmt), replace(nf4, format=fmt)


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file ``path`` names (symlinks followed), or None when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def build_inputs(src, src_path: Path, opts: BuildOptions) -> list[tuple[Path, str]]:
    """Every file a build reads, as (path, what it is): the source's weight files; for a model folder
    every other file in it too (config, index, tokenizer, ...; previous ``*.orkpack`` packs excepted);
    a lone .safetensors file's config.json beside it; the --tiermap, --profile, --board, --runtime and --imatrix
    files."""
    out = [(Path(f), "a weight file of the source") for f in src.files]
    root = Path(src_path)
    if root.is_dir():
        try:
            listing = sorted(root.iterdir())
        except OSError:
            listing = []
        out += [(q, "a file of the source model folder") for q in listing
                if not q.name.endswith(".orkpack") and q.is_file()]
    elif src.kind == "safetensors":
        out.append((root.parent / "config.json", "the config.json of the source"))
    for flag, p in (("--tiermap", opts.tiermap), ("--profile", opts.profile), ("--board", opts.board),
                    ("--runtime", opts.runtime), ("--imatrix", opts.imatrix)):
        if p is not None and Path(p).is_file():
            out.append((Path(p), f"the {flag} file"))
    return out


def refuse_overwriting_inputs(out_path: Path, src, src_path: Path, opts: BuildOptions) -> None:
    """OrkError when ``out_path`` is one of the build's own input files, compared by identity (device and
    inode), so a symlink, a hard link or another spelling of the path is caught as well as the same name.
    Writing the pack there would replace the user's model (often the only copy) with the pack."""
    target = _identity(out_path)
    if target is None:  # nothing there yet: nothing to destroy
        return
    for path, what in build_inputs(src, src_path, opts):
        if _identity(path) == target:
            same = "" if os.path.abspath(path) == os.path.abspath(out_path) else f" ({escape_name(str(path))})"
            raise OrkError(f"{escape_name(str(out_path))}: is {what}{same}; the pack would replace it; "
                           "give another output path")


def unmatched_globs(opts: BuildOptions, infos: list[TensorInfo]) -> list[str]:
    """One warning line per glob that matches no tensor, with near names."""
    names = [i.name for i in infos]
    out = []
    for flag in ("keep", "npu", "cpu", "int8", "nf4"):
        for g in getattr(opts, flag):
            if not any(globs.matches(n, g) or globs.matches(f"{n}[0]", g) for n in names):
                out.append(globs.no_match_warning(flag, g, names))
    return out + pin_warnings(opts.pins(), [(i.name, i.shape) for i in infos if not is_raw(i.dtype)])


@dataclass
class BuildResult:
    path: Path
    tensors: int
    source_bytes: int
    pack_bytes: int
    seconds: float
    by_kind: dict  # (encoding, tier) -> {"slices": n, "bytes": b}; host copies under (encoding, "host copy")
    worst_sqnr: tuple[str, float] | None
    warnings: list[str]
    info: list[str] = field(default_factory=list)  # lines for people that are not warnings (dropped buffers)
    skipped: list[dict] = field(default_factory=list)  # provenance.skipped: derivable buffers left out

    @property
    def gbps(self) -> float:
        return self.source_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def hash_file(path: Path, window: int = 64 << 20) -> str:
    """xxh3 of a whole source file, hashed from its own pages through a moving 64 MB mapping: no copy,
    no buffer (a read into one costs ~1 s per GB on a 2-core VM), at most one window resident."""
    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        for off in range(0, size, window):
            n = min(window, size - off)
            with mmap.mmap(f.fileno(), n, flags=_HASH_MAP_FLAGS, prot=mmap.PROT_READ, offset=off) as m:
                h.update(m)
    return h.hexdigest()


def skipped_of(src) -> list[Skipped]:
    """The source's derivable buffers left out of its tensors (sources/derivable.py), from its headers."""
    fn = getattr(src, "skipped", None)
    return list(fn()) if fn is not None else []


def skipped_line(skipped: list[Skipped], per_reason: int = 4) -> str | None:
    """One line naming the dropped buffers, grouped by reason (at most ``per_reason`` names each; the
    pack's provenance.skipped and ``orkpack inspect`` list them all). None when nothing was dropped."""
    if not skipped:
        return None
    groups: dict[str, list[str]] = {}
    for s in skipped:
        groups.setdefault(s.reason, []).append(escape_name(s.name, 80))
    bits = []
    for reason, names in groups.items():
        shown = names if len(names) <= per_reason else names[: per_reason - 1] + ["...", names[-1]]
        what = reason.split(":")[0]
        bits.append(f"{what}{f' x{len(names)}' if len(names) > 1 else ''}: {', '.join(shown)}")
    n = len(skipped)
    return (f"dropped {n} tensor{'s' if n != 1 else ''} that are not weights (buffers the runtime derives from "
            f"the config, activation scales; listed in the pack's provenance.skipped): " + "; ".join(bits))


def source_provenance(src, opts: BuildOptions, smoothing: dict | None = None) -> dict:
    return {
        "source_format": src.kind,
        "sources": [{"file": f.name, "size": f.stat().st_size, "xxh3": hash_file(f)} for f in src.files],
        "arch": src.arch,
        "options": opts.recorded(),
        "skipped": [s.to_json() for s in skipped_of(src)],
    } | ({} if smoothing is None else {"smoothing": smoothing})


def _head_on_npu(placement, infos: list[TensorInfo]) -> bool:
    """Whether the model's head is tied (no output.weight) and placed on the NPU: the head a build unties to smooth."""
    from orkpack.smooth import EMBED, HEAD

    by = {i.name: i for i in infos}
    return HEAD not in by and EMBED in by and placement.decide(by[EMBED], None).tier == spec.TIER_NPU


def _with_copies(infos: list[TensorInfo], untied: dict[str, str]) -> list[TensorInfo]:
    """The source's tensors with each untied copy inserted right after its original (same shape and source)."""
    out = []
    for i in infos:
        out.append(i)
        out += [replace(i, name=c) for c, o in untied.items() if o == i.name]
    return out


class UntiedHead:
    """A placement with untied copies (the smoothed head): a copy takes the decision its original had (the head's:
    the NPU), the original host int8 (encoded and clipped as when it was tied: the rows its lookups read before)."""

    def __init__(self, inner, untied: dict[str, str]):
        self.inner, self.untied = inner, untied
        self.originals = set(untied.values())

    def decide(self, info: TensorInfo, expert: int | None) -> Decision:
        if info.name in self.untied:
            return self.inner.decide(replace(info, name=self.untied[info.name]), expert)
        if info.name in self.originals:
            return Decision(spec.ENC_INT8, spec.TIER_HOST)
        return self.inner.decide(info, expert)


def _clipped(x: np.ndarray, name: str, expert: int | None, stats, smoothing, counts: dict) -> np.ndarray:
    """An int8 slice clamped row by row (orkpack/clip.py) with the statistics of its input columns (divided by the
    smoothing scales its columns took: the input it meets is x / s); unchanged without statistics for it."""
    from orkpack.clip import clamp
    from orkpack.sources.base import as_float32

    k = x.shape[1]
    if name not in stats and smoothing is not None and name in smoothing.untied:
        name_st = smoothing.untied[name]  # the head's statistics, gathered from the tied model
    else:
        name_st = name
    m = stats.mean_sq(name_st, expert, k=k) if name_st in stats else None
    if m is None:
        return x
    from orkpack.smooth import smoothed_mean_sq

    m = smoothed_mean_sq(m, smoothing.ops.get(name, []) if smoothing is not None else [])
    out, rows = clamp(as_float32(x), m)
    if rows:
        counts["slices"] += 1
        counts["rows"] += rows
    return out


def encode_slice(x: np.ndarray, dec: Decision, *, name: str, threads: int, opts: BuildOptions,
                 alloc=np.empty, nf4: NF4Choice | None = None, tensor: str | None = None,
                 expert: int | None = None) -> dict:
    """Encode one 1-D/2-D slice per its decision into a writer slice dict; the parts' arrays come from
    ``alloc(shape, dtype)`` (the pack writer's reused buffers in a build). NF4 is encoded as ``nf4``
    chooses (default: the options' mode, no statistics) for ``tensor`` / ``expert``."""
    if nf4 is None:
        nf4 = choose_nf4(opts.nf4_mode, opts.nf4_weighting, None, opts.nf4_format)
    tensor = name if tensor is None else tensor

    def nf4_encode(b64: bool = False):
        return nf4.encode(x, tensor=tensor, expert=expert, threads=threads, alloc=alloc, b64=b64)

    if dec.encoding == spec.ENC_RAW:
        # the source bytes verbatim, copied out of the source's pages (or the reused read buffer)
        enc = get_codec(spec.ENC_RAW).encode(x, dtype=dec.dtype, alloc=alloc)
        encoding = spec.ENC_RAW
    elif dec.encoding in spec.FLOAT_ENCODINGS:
        # a copy: the source array lives in mapped pages or a reused read buffer, the part waits for the write thread
        enc = get_codec(FLOAT_ENC[x.dtype]).encode(x, alloc=alloc)
        encoding = FLOAT_ENC[x.dtype]
    else:
        npu_tiles = dec.tier == spec.TIER_NPU and dec.encoding == spec.ENC_INT8
        encoding = dec.encoding
        if dec.encoding == spec.ENC_NF4:  # the NF4 of the build's --nf4-format; an NPU slice inflates nf4 (b64)
            b64 = dec.tier == spec.TIER_NPU
            enc = nf4_encode(b64)
            encoding = spec.ENC_NF4 if b64 else nf4.encoding
        else:
            enc = get_codec(dec.encoding).encode(x, npu=npu_tiles, threads=threads, alloc=alloc)
        if enc.nonfinite:
            if not opts.allow_nonfinite:
                raise SourceError(
                    f"{escape_name(name)}: {enc.nonfinite} NaN/Inf values; fix the checkpoint, "
                    "or pass --allow-nonfinite (they are then encoded as 0)"
                )
            # the kernels already encoded the non-finite values as 0 (docs/FORMAT.md 3)
    s = {
        "shape": list(x.shape),
        "encoding": encoding,
        "tier": dec.tier,
        "layout": enc.layout,
        "parts": enc.parts,
        "sqnr_db": enc.sqnr_db,
        "min_m": dec.min_m if dec.tier == spec.TIER_NPU else None,
    }
    if encoding == spec.ENC_RAW:
        s["dtype"] = enc.dtype
    if dec.tier == spec.TIER_NPU and encoding == spec.ENC_NF4:
        q, scale, layout = nf4_to_npu_int8(enc.parts["codes"], enc.parts["absmax"], tuple(x.shape))
        s["inflate"] = {
            "layout": layout,
            "q_size": int(q.nbytes),
            "q_xxh3": xxhash.xxh3_64_hexdigest(np.ascontiguousarray(q)),
            "scale_xxh3": xxhash.xxh3_64_hexdigest(np.ascontiguousarray(scale)),
        }
    if dec.host_copy is not None and dec.tier == spec.TIER_NPU:
        # dual residency (docs/FORMAT.md 8): the same source slice through the host codec, so the
        # copy is bit-identical to a host slice of that encoding; an NPU slice stored nf4 already is one
        if dec.host_copy not in spec.NF4_ENCODINGS:
            raise OrkError(f"{escape_name(name)}: host copy encoding {escape_name(str(dec.host_copy))!r}; "
                           f"a host copy is {', '.join(spec.HOST_COPY_ENCODINGS)}")
        # the plan says "nf4": the build's NF4 format; an NPU slice stored nf4 is its own copy (byte-identical)
        hc_enc = spec.ENC_NF4 if encoding == spec.ENC_NF4 else nf4.encoding
        hc = enc if encoding == hc_enc else nf4_encode()
        s["host_copy"] = {"encoding": hc_enc, "layout": hc.layout, "parts": hc.parts, "sqnr_db": hc.sqnr_db}
    return s


def _read_ahead(src, infos: list[TensorInfo], io: ThreadPoolExecutor, alias: dict[str, str] | None = None):
    """Yield (info, array) in order; a name in ``alias`` (an untied copy) is read as the source tensor it names.

    Float and raw tensors stored in one piece are handed out as the source
    file's own pages (``src.mapped``: no copy, no buffer, nothing for the
    kernel to zero; issue 14); the others (dequantized types, experts gathered
    from several places) are read into reused buffers, made when first needed
    (fresh pages cost page faults: up to 2 s per GB on some VMs).

    When two source tensors fit in the largest tensor as float32 (16-bit
    sources), the next tensor is mapped or read on the I/O thread while this
    one is encoded (a cold file is read from disk there), alternating two
    buffers; otherwise (float32 sources) one at a time, so the memory bound of
    the module docstring holds. The caller must not keep a reference to a
    yielded array past the next step.
    """
    # the array a read returns: the stored bytes for float and raw tensors, float32 for dequantized ones
    # (FP8, MXFP4, GGUF quantized types), which are 2-8x their stored bytes
    def out_bytes(i: TensorInfo) -> int:
        return i.nbytes if i.dtype in ("F32", "F16", "BF16") or is_raw(i.dtype) else 4 * i.numel

    biggest = max(out_bytes(i) for i in infos)
    ahead = 2 * biggest <= 4 * max(i.numel for i in infos)
    bufs: list[np.ndarray | None] = [None, None]
    mapped = getattr(src, "mapped", None)

    def fetch(i: int) -> np.ndarray:
        name = (alias or {}).get(infos[i].name, infos[i].name)
        arr = mapped(name) if mapped is not None else None
        if arr is not None:
            return arr
        k = i % 2 if ahead else 0
        if bufs[k] is None:
            bufs[k] = np.empty(biggest, np.uint8)
        return src.read(name, out=bufs[k])

    if not ahead:
        for i, info in enumerate(infos):
            arr = fetch(i)
            yield info, arr
            del arr
        return
    pending = io.submit(fetch, 0)
    for i, info in enumerate(infos):
        arr = pending.result()
        if i + 1 < len(infos):
            pending = io.submit(fetch, i + 1)
        yield info, arr
        del arr  # the mapping goes with the last view of it


def build(
    src_path: Path,
    out_path: Path,
    opts: BuildOptions,
    *,
    on_start: Callable[[int], None] | None = None,
    on_progress: Callable[[int, str], None] | None = None,
    placement_map=None,
    select: set[str] | None = None,
) -> BuildResult:
    """Build ``out_path`` from the checkpoint at ``src_path``. Raises OrkError on bad input.

    ``placement_map`` (a TierMap) and ``select`` (tensor names) build one node of a cluster
    (orkpack/tiers/cluster.py): only the selected tensors, placed by that node's tier map."""
    t0 = time.perf_counter()
    out_path = Path(out_path)
    if opts.tiermap is not None and not opts.plan:
        raise OrkError("--tiermap and --no-plan contradict each other: a tier map places every item; drop one")
    if opts.tiermap is not None and any(opts.pins().values()):
        raise OrkError("--tiermap with --npu/--cpu/--int8/--nf4/--keep: pins shape a plan, and a given tier map is "
                       "followed as it is; re-plan with the pins (orkpack plan ... -o FILE) or edit the map")
    refuse_ignored_plan_options(opts)
    if not out_path.parent.is_dir():
        raise OrkError(f"{escape_name(str(out_path.parent))}: output folder does not exist; create it first")
    threads = opts.resolved_threads()
    nf4 = choose_nf4(opts.nf4_mode, opts.nf4_weighting, opts.imatrix, opts.nf4_format)  # bad --imatrix: one line, nothing written
    late: list[str] = []  # what the source says while it is read (a quantized GGUF): into the result, not stderr
    src = open_source(Path(src_path), on_warning=late.append)
    try:
        refuse_overwriting_inputs(out_path, src, Path(src_path), opts)
        infos = src.tensors()
        if select is not None:
            infos = [i for i in infos if i.name in select]
        if not infos:
            raise SourceError(f"{escape_name(str(src_path))}: no tensors found")
        for i in infos:
            if len(i.shape) > spec.MAX_DIMS:
                raise SourceError(f"{escape_name(i.source_name)}: {len(i.shape)} dimensions {i.shape}; a pack holds "
                                  f"tensors of at most {spec.MAX_DIMS} dimensions")
        skipped = skipped_of(src)
        info_lines = [line] if (line := skipped_line(skipped)) else []
        tiermap = None
        if placement_map is not None:
            placement, tiermap, warnings = TierMapPlacement(placement_map, opts), placement_map.to_json(), []
        elif opts.tiermap is not None:
            tm, warnings = load_tiermap(Path(opts.tiermap), infos)
            opts, nf4 = follow_nf4_format(tm, Path(opts.tiermap), opts, nf4)
            placement = TierMapPlacement(tm, opts)
            tiermap = tm.to_json()
            if tm.prediction is not None and src.kind in ("safetensors", "gguf"):
                from orkpack.tiers.command import predict_followed

                # the pack records what the map it follows predicts, not what it said (an edited map)
                try:
                    tiermap["prediction"], said = predict_followed(tm, Path(src_path), Path(opts.tiermap))
                except OrkError as e:  # a hand-made map without a whole board block: no prediction at all
                    tiermap["prediction"] = None
                    said = [f"no prediction recorded: {e}"]
                warnings += said
        elif opts.plan:
            from orkpack.tiers.command import plan

            from orkpack.tiers.solver import Goal

            tm, _solve_s, _ = plan(
                Path(src_path), board=opts.board, profile=opts.profile, ctx=opts.ctx, kv_type=opts.kv_type,
                prefill_m=opts.prefill_m, pins=opts.pins(), ignore_unknown=opts.ignore_unknown,
                goal=Goal(opts.goal, opts.min_decode_tok_s, opts.min_prefill_tok_s, opts.max_ram, max_kld=opts.max_kld),
                prompt=opts.prompt, runtime=opts.runtime, nf4_format=nf4.format,
            )
            placement = TierMapPlacement(tm, opts)
            tiermap = tm.to_json()
            warnings = list(getattr(tm, "warnings", []))
        else:
            placement = RulePlacement(opts, infos)
            warnings = unmatched_globs(opts, infos)
        smoothing = stats = None
        clipped = {"slices": 0, "rows": 0}
        if opts.imatrix is not None:
            from orkpack import smooth

            if opts.smooth_alpha is not None and not 0 <= opts.smooth_alpha <= 1:
                raise OrkError(f"--smooth-alpha {opts.smooth_alpha}: give a value from 0 to 1")
            stats = nf4.stats if nf4.stats is not None else smooth.load_stats(Path(opts.imatrix))  # read once
            if opts.smooth:
                smoothing, said = smooth.plan(src, infos, Path(opts.imatrix), stats, alpha=opts.smooth_alpha,
                                              stats_hash=hash_file(Path(opts.imatrix)),
                                              untie_head=opts.untie_head and _head_on_npu(placement, infos))
                warnings += said
        total = sum(i.nbytes for i in infos)
        nf4.smoothing = smoothing  # the NF4 search weighs the smoothed matrices' columns by the smoothed statistics
        if smoothing is not None and smoothing.untied:  # the smoothed head copy, written right after its original
            placement = UntiedHead(placement, smoothing.untied)
            infos = _with_copies(infos, smoothing.untied)
        if on_start:
            on_start(sum(i.nbytes for i in infos))
        # the source files are hashed on a side thread while the tensors are
        # encoded (both release the GIL); the header is written last anyway
        hasher = ThreadPoolExecutor(max_workers=1)
        provenance = hasher.submit(source_provenance, src, opts, smoothing and smoothing.provenance)
        io = ThreadPoolExecutor(max_workers=1)
        by_kind: dict = {}
        worst: tuple[str, float] | None = None
        # parts wait for the write thread up to half the largest tensor as float32; the writer's buffers
        # (reused from tensor to tensor) can hold that plus one tensor's parts (<= 2 bytes per element)
        write_behind = max(16 << 20, 2 * max(i.numel for i in infos))
        model = src.model_metadata(warnings.append)
        with PackWriter(out_path, provenance=None, config=src.config, tiermap=tiermap, write_behind=write_behind,
                        pool_bytes=2 * write_behind + (64 << 20), model=model) as w:
            for info, arr in _read_ahead(src, infos, io, smoothing.untied if smoothing is not None else None):
                if tuple(arr.shape) != tuple(info.shape):
                    raise SourceError(f"{escape_name(info.name)}: read shape {arr.shape} != header shape {info.shape}")
                if smoothing is not None:  # the norm gains and matrices as smoothed (float32), the rest as read
                    arr = smoothing.apply(info.name, arr)
                # a 3-D float tensor is stacked experts (one slice each); a raw tensor is one slice
                subs = list(enumerate(arr)) if arr.ndim == 3 and not is_raw(info.dtype) else [(None, arr)]
                slices = []
                for e, sub in subs:
                    dec = placement.decide(info, e)
                    if stats is not None and opts.clip and dec.encoding == spec.ENC_INT8 and sub.ndim == 2:
                        # (an untied original is clipped as it was when tied: the lookups read the same int8 rows)
                        sub = _clipped(sub, info.name, e, stats, smoothing, clipped)
                    s = encode_slice(sub, dec, name=info.name if e is None else f"{info.name}[{e}]", threads=threads,
                                     opts=opts, alloc=w.alloc, nf4=nf4, tensor=info.name, expert=e)
                    s["expert"] = e
                    slices.append(s)
                    nbytes = sum(int(p.nbytes) for p in s["parts"].values())
                    k = (s["encoding"], s["tier"])
                    d = by_kind.setdefault(k, {"slices": 0, "bytes": 0})
                    d["slices"] += 1
                    d["bytes"] += nbytes
                    if s.get("host_copy") is not None:
                        hc = by_kind.setdefault((s["host_copy"]["encoding"], "host copy"), {"slices": 0, "bytes": 0})
                        hc["slices"] += 1
                        hc["bytes"] += sum(int(p.nbytes) for p in s["host_copy"]["parts"].values())
                    if s["sqnr_db"] is not None and (worst is None or s["sqnr_db"] < worst[1]):
                        worst = (info.name if e is None else f"{info.name}[{e}]", float(s["sqnr_db"]))
                w.add_tensor(info.name, info.source_name, info.shape, info.dtype, slices,
                             smoothing=None if smoothing is None else smoothing.records.get(info.name))
                arr = subs = slices = sub = s = None  # drop every view of the source pages
                if on_progress:
                    on_progress(info.nbytes, info.name)
            prov = provenance.result() | {"nf4": nf4.recorded()}
            if stats is not None and opts.clip:
                from orkpack.clip import RATIOS

                prov["clipping"] = {"method": "int8 rows clamped to the ratio of their max |w| with the least "
                                              "squared error weighted by the statistics' mean squares (orkpack/clip.py)",
                                    "ratios": list(RATIOS), "stats": Path(opts.imatrix).name} | clipped
            w.set_provenance(prov, timestamp=opts.timestamp)
            if smoothing is not None and smoothing.provenance is not None:
                sp = smoothing.provenance
                al = f"{min(sp['alphas'])}..{max(sp['alphas'])}" if sp["alphas"] else "-"
                info_lines.append(f"smoothed {sp['smoothed']} of {sp['groups']} groups (alpha {al}; the statistics' "
                                  f"w8a8 error {sp['error_ratio']} of unsmoothed)")
                if sp.get("head"):
                    info_lines.append(f"untied the head to smooth it: output.weight, a copy of {sp['head']['untied_from']} "
                                      f"with its columns x s (alpha {sp['head']['alpha']}; the statistics' w8a8 error "
                                      f"{sp['head']['error_ratio']} of unsmoothed); --no-untie-head keeps it tied")
            if "clipping" in prov:
                info_lines.append(f"clipped {prov['clipping']['rows']} int8 rows of {prov['clipping']['slices']} slices")
            path = w.finish()
    finally:
        for pool in ("hasher", "io"):
            if pool in locals():
                locals()[pool].shutdown(wait=True, cancel_futures=True)
        src.close()
    return BuildResult(
        path=path,
        tensors=len(infos),
        source_bytes=total,
        pack_bytes=path.stat().st_size,
        seconds=time.perf_counter() - t0,
        by_kind=by_kind,
        worst_sqnr=worst,
        warnings=list(dict.fromkeys(warnings + late + ([m] if (m := nf4.warning()) else []))),  # a plan may have said the same already
        info=info_lines,
        skipped=[s.to_json() for s in skipped],
    )
