"""Where and how each slice goes: one interface, ``decide(info, expert) -> Decision``, for every placement.

* :class:`TierMapPlacement`: a solved tier map (the default: solved here as ``orkpack plan`` solves it), a
  given ``--tiermap`` file (checked against the source by :func:`load_tiermap`), or a cluster node's map;
* :class:`RulePlacement`: rules and pins alone (``--no-plan``);
* :class:`UntiedHead`: either of them with the smoothed untied head (orkpack/transforms/smooth.py) added.

Before all of them: non-float tensors are carried raw (:func:`raw_decision`), and what always stays float
(orkpack/keepfloat.py) stays float whatever a map says. :func:`place` picks the placement a build's options ask for.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

from .. import globs
from ..errors import OrkError, escape_name
from ..keepfloat import is_expert_stack, pin_warnings, stays_float
from ..pack import spec
from ..sources.base import RAW_DTYPES, TensorInfo, is_raw
from ..tiers.board import check_nf4_format
from ..tiers.solver import npu_nf4_storable
from ..tiers.tiermap import TierMap
from ..transforms.nf4 import NF4Choice
from ..transforms.smooth import EMBED, HEAD
from .options import BuildOptions

# min_m for NPU slices placed by rules (no tier map): the batch size from which
# the NPU pays for its ~365 us submit cost on typical 4096-wide layers. The tier
# map computes it per tensor from the board's cost model. Never below 2.
RULES_MIN_M = 32


FLOAT_ENC_BY_DTYPE = {"F32": spec.ENC_F32, "F16": spec.ENC_F16, "BF16": spec.ENC_BF16}


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
    --nf4, then the defaults: what always stays float (orkpack/keepfloat.py: what is not a matrix or a stack of expert
    matrices, biases of any rank, MoE routers, convolution kernels; before every pin) stays float; the output head is int8
    (it is the most quantization-sensitive matrix, which is why llama.cpp's
    quantizer keeps it at higher precision); the token embedding is NF4 (row
    lookups), or int8 when it doubles as the output head (tied); every other
    matrix (every expert of a stack) is NF4. All non-NPU tensors live on the host (CPU/GPU).
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
            enc = spec.ENC_NF4 if o.npu_storage == "nf4" and npu_nf4_storable(info.name) else spec.ENC_INT8
            return Decision(enc, spec.TIER_NPU, RULES_MIN_M)
        if hit(o.int8):
            return Decision(spec.ENC_INT8, spec.TIER_HOST)
        if hit(o.nf4):
            return Decision(spec.ENC_NF4, spec.TIER_HOST)
        if info.name == "output.weight" or (self.tied and info.name == "token_embd.weight"):
            return Decision(spec.ENC_INT8, spec.TIER_HOST)
        return Decision(spec.ENC_NF4, spec.TIER_HOST)


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
            if self.opts.npu_storage == "nf4" and npu_nf4_storable(info.name):  # the down projections stay int8
                enc = spec.ENC_NF4
            return Decision(enc, tier, min_m, host_copy=getattr(d, "host_copy", None))
        if enc in spec.FLOAT_ENCODINGS:
            enc = FLOAT_ENC_BY_DTYPE.get(info.dtype, spec.ENC_F32)
        return Decision(enc, tier)


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


@dataclass
class Placed:
    """The placement a build follows, the tier map its pack embeds (None under rules), the warnings so far, and
    the options and NF4 choice as the placement leaves them (a followed map's NF4 format)."""
    placement: object  # .decide(info, expert) -> Decision
    tiermap: dict | None
    warnings: list[str]
    opts: BuildOptions
    nf4: NF4Choice

    def untie(self, infos: list[TensorInfo], untied: dict[str, str]) -> list[TensorInfo]:
        """With untied copies (the smoothed head): the placement decides them too, and the tensors to write are the
        source's with each copy right after its original."""
        if not untied:
            return infos
        self.placement = UntiedHead(self.placement, untied)
        return with_copies(infos, untied)


def place(inp, opts: BuildOptions, nf4: NF4Choice, placement_map=None) -> Placed:
    """The placement of a build of ``inp`` (orkpack.build.inputs.Inputs): a cluster node's ``placement_map``, the
    ``--tiermap`` file, a tier map solved now, or (``--no-plan``) the rules."""
    if placement_map is not None:
        return Placed(TierMapPlacement(placement_map, opts), placement_map.to_json(), [], opts, nf4)
    if opts.tiermap is not None:
        return follow(inp, opts, nf4)
    if opts.plan:
        return solve(inp, opts, nf4)
    return Placed(RulePlacement(opts, inp.infos), None, unmatched_globs(opts, inp.infos), opts, nf4)


def follow(inp, opts: BuildOptions, nf4: NF4Choice) -> Placed:
    """Follow the ``--tiermap`` file as it is: host NF4 in its NF4 format; the pack records what the map it follows
    predicts (recomputed from its board and options), not what it said (an edited map)."""
    tm, warnings = load_tiermap(Path(opts.tiermap), inp.infos)
    opts, nf4 = follow_nf4_format(tm, Path(opts.tiermap), opts, nf4)
    opts, nf4 = follow_host_formats(tm, Path(opts.tiermap), opts, nf4)
    tiermap = tm.to_json()
    if tm.prediction is not None and inp.src.kind in ("safetensors", "gguf"):
        from ..tiers.command import predict_followed  # the solver's modules (scipy) only when a plan is made

        try:
            tiermap["prediction"], said = predict_followed(tm, inp.located, Path(opts.tiermap))
        except OrkError as e:  # a hand-made map without a whole board block: no prediction at all
            tiermap["prediction"] = None
            said = [f"no prediction recorded: {e}"]
        warnings += said
    return Placed(TierMapPlacement(tm, opts), tiermap, warnings, opts, nf4)


def solve(inp, opts: BuildOptions, nf4: NF4Choice) -> Placed:
    """Solve the tier map as ``orkpack plan`` does, for the build's NF4 format, and follow it (its host levels too:
    given none, the plan chooses them)."""
    from ..tiers.command import plan

    tm, _solve_s, _ = plan(
        inp.located, board=opts.board, profile=opts.profile, ctx=opts.ctx, kv_type=opts.kv_type,
        prefill_m=opts.prefill_m, pins=opts.pins(), ignore_unknown=opts.ignore_unknown,
        goal=opts.goal_of(),
        prompt=opts.prompt, runtime=opts.runtime, nf4_format=nf4.format, npu_storage=opts.npu_storage,
        host_low=opts.host_low, host_high=opts.host_high,  # neither given: the plan chooses them
    )
    opts, nf4 = follow_host_formats(tm, Path("(the build's plan)"), opts, nf4)  # the levels it planned
    return Placed(TierMapPlacement(tm, opts), tm.to_json(), list(getattr(tm, "warnings", [])), opts, nf4)


# a tier map embeds in the pack header, so it can be no larger than the header's cap
MAX_TIERMAP_BYTES = spec.MAX_HEADER_SIZE


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def load_tiermap(path: Path, infos: list[TensorInfo]) -> tuple["TierMap", list[str]]:  # noqa: F821
    """The tier map in the JSON file ``path`` (``orkpack plan -o``), checked against the source:
    every float tensor (every expert of a stacked one) must have a decision of its shape.
    Returns (tier map, warning lines). Raises OrkError with one line otherwise."""
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
        stacked = is_expert_stack(info.name, info.shape)
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


def follow_nf4_format(tm, map_path: Path, opts: BuildOptions, nf4: NF4Choice) -> tuple[BuildOptions, NF4Choice]:
    """(options, NF4 choice) of a build that follows tier map ``tm``: host NF4 in the map's NF4 format, whose
    bytes its plan counts (docs/TIERMAP.md section 5; a map without one was planned at b64). An --nf4-format
    (or --nf4-mode bnb, which writes b64 only) that contradicts the map is refused in one line."""
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


def follow_host_formats(tm, map_path: Path, opts: BuildOptions, nf4: NF4Choice) -> tuple[BuildOptions, NF4Choice]:
    """(options, NF4 choice) of a build that follows tier map ``tm``: its host levels in the formats the map's board
    block records ("host_low", "host_high"; absent: nf4, int8), whose bytes its plan counts. A --host-low /
    --host-high that contradicts the map is refused in one line."""
    from ..pack.hostlevels import check_host_formats

    label = escape_name(str(map_path))
    board = tm.board if isinstance(tm.board, dict) else {}
    low, high = check_host_formats(board.get("host_low"), board.get("host_high"), f"tier map {label}")
    if (low, high) == (nf4.host_low, nf4.host_high):
        return opts, nf4
    for given, want, opt in ((opts.host_low, low, "--host-low"), (opts.host_high, high, "--host-high")):
        if given is not None and given != want:
            raise OrkError(f"tier map {label} was planned for host formats {low} / {high} (its bytes and predictions "
                           f"count them), but the build was given {opt} {given}: drop {opt} to follow the map, or "
                           f"plan again with orkpack plan {opt} {given}")
    return replace(opts, host_low=low, host_high=high), replace(nf4, host_low=low, host_high=high)


def unmatched_globs(opts: BuildOptions, infos: list[TensorInfo]) -> list[str]:
    """One warning line per glob that matches no tensor, with near names."""
    names = [i.name for i in infos]
    out = []
    for flag in ("keep", "npu", "cpu", "int8", "nf4"):
        for g in getattr(opts, flag):
            if not any(globs.matches(n, g) or globs.matches(f"{n}[0]", g) for n in names):
                out.append(globs.no_match_warning(flag, g, names))
    return out + pin_warnings(opts.pins(), [(i.name, i.shape) for i in infos if not is_raw(i.dtype)])


def head_on_npu(placement, infos: list[TensorInfo]) -> bool:
    """Whether the model's head is tied (no output.weight) and placed on the NPU: the head a build unties to smooth."""
    by = {i.name: i for i in infos}
    return HEAD not in by and EMBED in by and placement.decide(by[EMBED], None).tier == spec.TIER_NPU


def with_copies(infos: list[TensorInfo], untied: dict[str, str]) -> list[TensorInfo]:
    """The source's tensors with each untied copy inserted right after its original (same shape and source)."""
    out = []
    for i in infos:
        out.append(i)
        out += [replace(i, name=c) for c, o in untied.items() if o == i.name]
    return out
