"""How a build chooses its NF4 bytes: the mode, the weighting and the activation statistics.

``bnb``: bitsandbytes' ``quantize_4bit`` bytes. ``opt`` (the default): the same format, each block's
absmax chosen to minimize the squared error (``reference.nf4opt_encode``). The format (``--nf4-format``):
``dq32`` (the default with ``opt``) writes the nf4dq encoding, bitsandbytes' NF4 at blocksize 32 with its
double-quantized absmax (4.25 bits a weight; ``reference.nf4dq_encode``); ``b64`` writes nf4, blocks of 64
with float32 absmax (4.5 bits; the only format of ``bnb``). NPU slices stored 4-bit (``--npu-storage nf4``,
inflated at load) are always nf4 (b64) with bitsandbytes' own block scale (``bnb``, whatever the mode: each
block's largest value kept exact; the error-minimizing scale broke the first token's massive activations on
the NPU's int8 path, docs/EVAL.md "The first token with --npu-storage nf4", issue 25). With ``--imatrix FILE``
(llama.cpp's imatrix format, ``orkpack imatrix`` or ``llama-imatrix``) the error of input column k
weighs the column's mean square activation, as llama-quantize weighs its scale search. A tensor the
imatrix does not cover is encoded with plain weights (and named in one build warning).

The choice is recorded in the pack's ``provenance.nf4`` (:meth:`NF4Choice.recorded`): mode,
weighting, and the imatrix file's name, xxh3, datasets and chunk count, so ``inspect`` and ``eval``
show it and a rebuild with the same inputs gives the same bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..codecs import NF4_MODES, NF4_WEIGHTINGS, Encoded, get_codec
from ..errors import OrkError, escape_name
from ..files import hash_file
from ..pack import spec
from .. import stats as act_stats
from ..pack.hostlevels import check_host_formats
from .smooth import smoothed_mean_sq

NF4_FORMATS = tuple(spec.NF4_FORMATS)  # dq32: nf4dq (blocksize 32, double-quantized absmax); b64: nf4 (blocksize 64)


@dataclass
class NF4Choice:
    mode: str = "opt"
    weighting: str = "plain"
    format: str = spec.NF4_DEFAULT_FORMAT
    imatrix: Path | None = None
    stats: act_stats.ActStats | None = None
    record: dict | None = None  # the imatrix's provenance record
    missing: list = field(default_factory=list)  # tensors encoded without statistics
    smoothing: object | None = None  # orkpack.transforms.smooth.Plan: a smoothed matrix meets x / s, so its weights are m / s^2
    # the encodings of the plan's host levels (--host-low, --host-high; tiers/board.py HOST_LOW, HOST_HIGH): a host
    # "nf4" item in host_low ("nf4": this choice's NF4), a host "int8" item in host_high; host copies stay NF4
    host_low: str = "nf4"
    host_high: str = spec.ENC_INT8

    def col_weights(self, tensor: str, expert: int | None, k: int) -> np.ndarray | None:
        """The imatrix mean squares of ``tensor``'s input columns (None: no statistics for it)."""
        if self.stats is None or self.mode != "opt":
            return None
        if tensor not in self.stats:
            self.missing.append(tensor if expert is None else f"{tensor}[{expert}]")
            return None
        ms = self.stats.mean_sq(tensor, expert)
        if ms is None:
            self.missing.append(tensor if expert is None else f"{tensor}[{expert}]")
            return None
        ms = np.asarray(ms, dtype=np.float64).reshape(-1)
        if self.smoothing is not None and ms.size == k:
            ms = smoothed_mean_sq(ms, self.smoothing.ops.get(tensor, []))
        if ms.size != k:
            raise OrkError(f"{escape_name(str(self.imatrix))}: {escape_name(tensor)} has {ms.size} columns of "
                           f"statistics, the tensor {k}; give the imatrix of this model")
        if not np.all(np.isfinite(ms)) or np.any(ms < 0):
            raise OrkError(f"{escape_name(str(self.imatrix))}: {escape_name(tensor)} has negative or non-finite "
                           "statistics; regenerate the imatrix")
        return ms.astype(np.float32)

    @property
    def encoding(self) -> str:
        """The pack encoding of this choice's host NF4 slices and host copies: nf4dq or nf4."""
        return spec.NF4_FORMATS[self.format] if self.mode == "opt" else spec.ENC_NF4

    def encode(self, x: np.ndarray, *, tensor: str, expert: int | None, threads: int, alloc=np.empty,
               b64: bool = False, npu: bool = False) -> Encoded:
        """The NF4 encoding of one slice under this choice (``b64``: nf4 whatever the format); its pack encoding
        is :attr:`encoding` (nf4 when ``b64``). ``npu``: an NPU slice stored 4-bit, inflated to int8 at load:
        nf4 with bitsandbytes' block scale (``quantize_4bit``'s bytes, absmax = max |x|), whatever the mode."""
        if npu:
            return get_codec(spec.ENC_NF4).encode(x, threads=threads, alloc=alloc, mode="bnb")
        k = int(x.shape[-1]) if x.ndim else 1
        cw = self.col_weights(tensor, expert, k) if x.ndim == 2 else None
        if self.encoding == spec.ENC_NF4DQ and not b64:
            return get_codec(spec.ENC_NF4DQ).encode(x, threads=threads, alloc=alloc, col_weights=cw,
                                                    weighting=self.weighting)
        return get_codec(spec.ENC_NF4).encode(x, threads=threads, alloc=alloc, mode=self.mode, col_weights=cw,
                                              weighting=self.weighting)

    def intdq_of(self, tier: str, encoding: str) -> str | None:
        """The intdq encoding a slice the plan puts on ``tier`` in ``encoding`` ("nf4" / "int8") is written in under
        this choice's host levels, or None (written as before: the build's NF4, int8, NPU tiles)."""
        if tier != spec.TIER_HOST:
            return None
        fmt = self.host_low if encoding == spec.ENC_NF4 else self.host_high if encoding == spec.ENC_INT8 else None
        return fmt if fmt in spec.INTDQ_BITS else None

    def encode_intdq(self, x: np.ndarray, encoding: str, *, tensor: str, expert: int | None, threads: int,
                     alloc=np.empty) -> Encoded:
        """A host level's intdq encoding of one slice, its columns weighed as the NF4 search's (the imatrix, the
        weighting; bitsandbytes' mode takes no statistics)."""
        k = int(x.shape[-1]) if x.ndim else 1
        cw = self.col_weights(tensor, expert, k) if x.ndim == 2 else None
        return get_codec(encoding).encode(x, threads=threads, alloc=alloc, col_weights=cw, weighting=self.weighting)

    def recorded(self) -> dict:
        out = {"mode": self.mode}
        if self.mode == "opt":
            out["format"] = self.format
            out["weighting"] = self.weighting
            out["imatrix"] = self.record
            out["npu"] = "bnb"  # NPU slices stored nf4 take bitsandbytes' block scale (FORMAT.md 5)
        if self.host_low != "nf4" or self.host_high != spec.ENC_INT8:  # only when not the defaults
            out["host_low"], out["host_high"] = self.host_low, self.host_high
        return out

    def warning(self) -> str | None:
        if not self.missing:
            return None
        names = self.missing if len(self.missing) <= 4 else self.missing[:3] + ["...", self.missing[-1]]
        return (f"{escape_name(str(self.imatrix))}: no statistics for {len(self.missing)} NF4 "
                f"tensor{'s' if len(self.missing) != 1 else ''} ({', '.join(escape_name(n) for n in names)}); "
                "encoded with plain weights")


def choose(mode: str, weighting: str, imatrix: Path | None, fmt: str | None = None, host_low: str | None = None,
           host_high: str | None = None) -> NF4Choice:
    """Check the options and load the imatrix once (bad input: one OrkError line naming the file).
    ``fmt`` None: dq32 with ``opt``, b64 with ``bnb``. ``host_low`` / ``host_high``: the host levels' encodings
    (None: nf4, int8)."""
    from dataclasses import replace

    low, high = check_host_formats(host_low, host_high, "--host-low / --host-high")
    return replace(_choose(mode, weighting, imatrix, fmt), host_low=low, host_high=high)


def _choose(mode: str, weighting: str, imatrix: Path | None, fmt: str | None) -> NF4Choice:
    if mode not in NF4_MODES:
        raise OrkError(f"--nf4-mode {mode!r}: choose {' or '.join(NF4_MODES)}")
    if weighting not in NF4_WEIGHTINGS:
        raise OrkError(f"--nf4-weighting {weighting!r}: choose {', '.join(NF4_WEIGHTINGS)}")
    if fmt is not None and fmt not in NF4_FORMATS:
        raise OrkError(f"--nf4-format {fmt!r}: choose {' or '.join(NF4_FORMATS)}")
    if mode == "bnb" and fmt is not None and fmt != spec.NF4_B64:
        raise OrkError("--nf4-mode bnb writes bitsandbytes' quantize_4bit bytes, blocksize 64: use --nf4-format b64, "
                       "or --nf4-mode opt for dq32")
    fmt = fmt or (spec.NF4_DEFAULT_FORMAT if mode == "opt" else spec.NF4_B64)
    if imatrix is None:
        return NF4Choice(mode, weighting, fmt)
    if not Path(imatrix).is_file():
        raise OrkError(f"--imatrix {escape_name(str(imatrix))}: no such file (write one with "
                       "`orkpack imatrix SOURCE -o FILE`)")
    if mode != "opt":  # bitsandbytes' bytes use no statistics (--imatrix still smooths and clips the int8 items)
        return NF4Choice(mode, weighting, fmt)
    p = Path(imatrix)
    stats = act_stats.load(p)
    record = {"file": p.name, "xxh3": hash_file(p), "datasets": [str(d) for d in (stats.datasets or [])],
              "chunks": int(stats.chunk_count or 0), "chunk_size": int(stats.chunk_size or 0)}
    return NF4Choice(mode, weighting, fmt, p, stats, record)


def pack_record(header: dict | None) -> dict | None:
    """A pack header's ``provenance.nf4`` (well-typed), or None. Packs written before it are ``bnb``."""
    rec = ((header or {}).get("provenance") or {}).get("nf4") if isinstance((header or {}).get("provenance"), dict) \
        else None
    if not isinstance(rec, dict) or rec.get("mode") not in NF4_MODES:
        return None
    return rec


def pack_mode(header: dict | None) -> str:
    """The NF4 mode a pack records: ``opt`` or ``bnb`` (packs without the record: bnb, all they could be)."""
    rec = pack_record(header)
    return rec["mode"] if rec else "bnb"


def describe(rec: dict | None) -> str | None:
    """One line for people: 'opt (plain weights; imatrix FILE xxh3 ..., N chunks of M on DATASETS)'."""
    if not isinstance(rec, dict):
        return None
    if rec.get("mode") != "opt":
        return f"{rec.get('mode')} (bitsandbytes quantize_4bit bytes)"
    im = rec.get("imatrix")
    fmt = "nf4dq: blocksize 32, double-quantized absmax" if rec.get("format") == spec.NF4_DEFAULT_FORMAT else "blocksize 64"
    what = f"opt ({fmt}): error-minimizing absmax, {rec.get('weighting', 'plain')} weights"
    if isinstance(im, dict):
        ds = ", ".join(str(d) for d in im.get("datasets") or []) or "unnamed text"
        what += (f" x imatrix {im.get('file')} (xxh3 {im.get('xxh3')}; {im.get('chunks')} chunks of "
                 f"{im.get('chunk_size')} on {ds})")
    if "host_low" in rec or "host_high" in rec:
        what += f"; host levels {rec.get('host_low')} / {rec.get('host_high')}"
    return escape_name(what, 400)
