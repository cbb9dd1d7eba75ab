"""Encoding: each source tensor as read becomes writer slices. Smoothing applied to the tensor (its carriers and
matrices as smoothed, float32), a stack of expert matrices split into its experts, each slice placed, an int8 slice clipped,
then encoded by its codec (int8 tiles for the NPU, the build's NF4, float or raw copies) into the writer's
buffers. :class:`Transforms` holds what the activation statistics make of the slices (orkpack/transforms/).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xxhash

from ..codecs import get_codec
from ..codecs.reference import nf4_to_npu_int8, sqnr_db
from ..errors import OrkError, SourceError, escape_name
from ..files import hash_file
from ..keepfloat import is_expert_stack
from ..pack import spec
from ..sources.base import TensorInfo, is_raw
from ..stats import ActStats
from ..transforms import clip, smooth
from ..transforms.nf4 import NF4Choice, choose as choose_nf4
from .options import BuildOptions
from .placement import Decision, Placed, head_on_npu

FLOAT_ENC = {np.dtype(np.float32): spec.ENC_F32, np.dtype(np.float16): spec.ENC_F16, np.dtype(np.uint16): spec.ENC_BF16}


@dataclass
class Transforms:
    """What a build's activation statistics (``--imatrix``) do: smooth tensors as they are read, clip int8 slices
    (and, through ``nf4.smoothing``, weigh the NF4 search's columns); nothing without statistics."""
    stats: ActStats | None = None
    smoothing: smooth.Plan | None = None
    clip: bool = False
    clipped: dict = field(default_factory=lambda: {"slices": 0, "rows": 0})

    @property
    def untied(self) -> dict[str, str]:
        """The smoothed untied copies (the head): copy -> the source tensor it copies."""
        return self.smoothing.untied if self.smoothing is not None else {}

    def tensor(self, name: str, arr: np.ndarray) -> np.ndarray:
        """The norm gains and matrices as smoothed (float32), the rest as read."""
        return self.smoothing.apply(name, arr) if self.smoothing is not None else arr

    def slice(self, x: np.ndarray, dec: Decision, name: str, expert: int | None) -> np.ndarray:
        """An int8 matrix slice clamped to its least-error ratios (orkpack/transforms/clip.py); others as they are."""
        if self.stats is None or not self.clip or dec.encoding != spec.ENC_INT8 or x.ndim != 2:
            return x
        x, rows = clip.clip_slice(x, name, expert, self.stats, self.smoothing)
        if rows:
            self.clipped["slices"] += 1
            self.clipped["rows"] += rows
        return x

    def record(self, prov: dict, opts: BuildOptions) -> None:
        """Add ``provenance.clipping`` (the smoothing's is in the source provenance)."""
        if self.stats is not None and self.clip:
            prov["clipping"] = clip.record(Path(opts.imatrix).name, self.clipped)

    def info_lines(self, prov: dict) -> list[str]:
        out = []
        if self.smoothing is not None and self.smoothing.provenance is not None:
            sp = self.smoothing.provenance
            al = f"{min(sp['alphas'])}..{max(sp['alphas'])}" if sp["alphas"] else "-"
            out.append(f"smoothed {sp['smoothed']} of {sp['groups']} groups (alpha {al}; the statistics' "
                       f"w8a8 error {sp['error_ratio']} of unsmoothed)")
            if sp.get("head"):
                out.append(f"untied the head to smooth it: output.weight, a copy of {sp['head']['untied_from']} "
                           f"with its columns x s (alpha {sp['head']['alpha']}; the statistics' w8a8 error "
                           f"{sp['head']['error_ratio']} of unsmoothed); --no-untie-head keeps it tied")
        if "clipping" in prov:
            out.append(f"clipped {prov['clipping']['rows']} int8 rows of {prov['clipping']['slices']} slices")
        return out


def prepare(inp, placed: Placed, opts: BuildOptions) -> Transforms:
    """The statistics read once and the smoothing chosen (its warnings into ``placed.warnings``); OrkError (one line)
    for a bad --smooth-alpha or statistics that do not fit the source."""
    if opts.imatrix is None:
        return Transforms()
    if opts.smooth_alpha is not None and not 0 <= opts.smooth_alpha <= 1:
        raise OrkError(f"--smooth-alpha {opts.smooth_alpha}: give a value from 0 to 1")
    nf4 = placed.nf4
    stats = nf4.stats if nf4.stats is not None else smooth.load_stats(Path(opts.imatrix))  # read once
    check_rotation(stats, getattr(inp.src, "plan", None), Path(opts.imatrix))
    smoothing = None
    if opts.smooth:
        smoothing, said = smooth.plan(inp.src, inp.infos, Path(opts.imatrix), stats, alpha=opts.smooth_alpha,
                                      stats_hash=hash_file(Path(opts.imatrix)),
                                      untie_head=opts.untie_head and head_on_npu(placed.placement, inp.infos))
        placed.warnings += said
    return Transforms(stats, smoothing, opts.clip)


def check_rotation(stats, plan, path: Path) -> None:
    """OrkError (one line) when the statistics were gathered under another rotation than the build's, or under one
    when the build does not rotate (or without one when it does): their columns would be another basis's."""
    from ..transforms.rotate import TAG

    said = [d for d in (getattr(stats, "datasets", None) or []) if isinstance(d, str) and d.startswith(TAG)]
    want = plan.tag() if plan is not None else None
    where = escape_name(str(path))
    if want is not None and want not in said:
        got = f"under {escape_name(said[0][len(TAG):].strip())}" if said else "on the model without rotation"
        raise OrkError(f"--imatrix {where}: gathered {got}, and this build rotates ({escape_name(want[len(TAG):].strip())}): "
                       "gather them on the rotated model: orkpack imatrix SOURCE with the build's --rotate / --online-hadamard "
                       "(the same --rotate-seed) -o FILE")
    if want is None and said:
        raise OrkError(f"--imatrix {where}: gathered on a rotated model ({escape_name(said[0][len(TAG):].strip())}); "
                       "build with the same --rotate / --online-hadamard and seed, or gather them without")


def encode_tensor(info: TensorInfo, arr: np.ndarray, placed: Placed, tr: Transforms, *, threads: int,
                  alloc) -> list[dict]:
    """The writer slices of one source tensor as read (module docstring)."""
    if tuple(arr.shape) != tuple(info.shape):
        raise SourceError(f"{escape_name(info.name)}: read shape {arr.shape} != header shape {info.shape}")
    arr = tr.tensor(info.name, arr)
    # a stack of expert matrices (keepfloat.is_expert_stack): one slice per expert; any other tensor: one
    subs = list(enumerate(arr)) if is_expert_stack(info.name, info.shape) and not is_raw(info.dtype) else [(None, arr)]
    slices = []
    for e, sub in subs:
        dec = placed.placement.decide(info, e)
        read = sub
        if placed.nf4.intdq_of(dec.tier, dec.encoding) is None:  # an intdq level weighs its columns instead of clipping
            sub = tr.slice(sub, dec, info.name, e)
        s = encode_slice(sub, dec, name=info.name if e is None else f"{info.name}[{e}]", threads=threads,
                         opts=placed.opts, alloc=alloc, nf4=placed.nf4, tensor=info.name, expert=e)
        if sub is not read and not np.array_equal(sub, read):  # clipped: the SQNR against the slice as read
            # (FORMAT.md 2, "against the source"), the clipping's error with the rounding's
            for rec in (s, s.get("host_copy")):
                if rec is not None and rec["sqnr_db"] is not None:
                    got = get_codec(rec["encoding"]).decode(rec["parts"], tuple(s["shape"]), rec["layout"])
                    rec["sqnr_db"] = sqnr_db(read, got)
        s["expert"] = e
        slices.append(s)
    return slices


def encode_slice(x: np.ndarray, dec: Decision, *, name: str, threads: int, opts: BuildOptions,
                 alloc=np.empty, nf4: NF4Choice | None = None, tensor: str | None = None,
                 expert: int | None = None) -> dict:
    """Encode one 1-D/2-D slice per its decision into a writer slice dict; the parts' arrays come from
    ``alloc(shape, dtype)`` (the pack writer's reused buffers in a build). NF4 is encoded as ``nf4``
    chooses (default: the options' mode, no statistics) for ``tensor`` / ``expert``."""
    if nf4 is None:
        nf4 = choose_nf4(opts.nf4_mode, opts.nf4_weighting, None, opts.nf4_format, opts.host_low, opts.host_high)
    tensor = name if tensor is None else tensor

    def nf4_encode(b64: bool = False, npu: bool = False):
        return nf4.encode(x, tensor=tensor, expert=expert, threads=threads, alloc=alloc, b64=b64, npu=npu)

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
        level = nf4.intdq_of(dec.tier, dec.encoding)  # a host level written in int5dq / int6dq / int8dq
        if level is not None:
            enc = nf4.encode_intdq(x, level, tensor=tensor, expert=expert, threads=threads, alloc=alloc)
            encoding = level
        elif dec.encoding == spec.ENC_NF4:  # the NF4 of the build's --nf4-format; an NPU slice inflates nf4 (b64)
            b64 = dec.tier == spec.TIER_NPU  # with bitsandbytes' block scale (FORMAT.md 5; docs/EVAL.md, issue 25)
            enc = nf4_encode(b64, npu=b64)
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
        # the plan says "nf4": the host low level (the build's NF4 format, or --host-low's intdq encoding); an NPU
        # slice stored nf4 is its own copy (byte-identical)
        low = nf4.intdq_of(spec.TIER_HOST, spec.ENC_NF4)
        if encoding == spec.ENC_NF4:
            hc_enc, hc = spec.ENC_NF4, enc
        elif low is not None:
            hc_enc = low
            hc = nf4.encode_intdq(x, low, tensor=tensor, expert=expert, threads=threads, alloc=alloc)
        else:
            hc_enc = nf4.encoding
            hc = nf4_encode()
        s["host_copy"] = {"encoding": hc_enc, "layout": hc.layout, "parts": hc.parts, "sqnr_db": hc.sqnr_db}
    return s
