"""Quantized safetensors releases as they ship, dequantized exactly on read.

Two schemes are read; every other quantized form is refused with one line
that says to dequantize first.

FP8 (``F8_E4M3``, ``F8_E5M2``, and the FNUZ variants ``F8_E4M3FNUZ`` /
``F8_E5M2FNUZ``). A weight ``T`` (e.g. ``X.weight``) comes with one scale
tensor, F32, F16 or BF16:

* ``T_scale_inv`` (DeepSeek-V3/R1, Qwen3-*-FP8; ``quant_method: "fp8"``):
  one scale per block of ``weight_block_size`` = [bn, bk] elements
  (``quantization_config.weight_block_size``, default [128, 128]), shape
  ``(ceil(N/bn), ceil(K/bk))``; edge blocks are ragged. Despite the name
  it multiplies (DeepSeek's ``weight_dequant``: ``y = x.float() * s``).
* ``T_scale`` (compressed-tensors, modelopt, fbgemm FP8): per tensor (shape
  ``[]`` or ``[1]``), per channel (``[N]`` or ``[N, 1]``), or per block as
  above (compressed-tensors ``strategy: block``).

A weight with leading dimensions (stacked experts) takes them on its scale
too (``(E, N)``, ``(E, nb, kb)``, or ``(E, 1, 1)`` per matrix). The value is
``float32(fp8) * float32(scale)``, computed in float32: one IEEE rounding,
the same product DeepSeek's and transformers' dequantizers compute before
they cast to bf16. The FP8 decode is a 256-entry table built from the format
definitions (E4M3FN: bias 7, no infinities, NaN at 0x7F/0xFF; E5M2: bias 15,
IEEE infinities and NaNs; FNUZ: bias 8 / 16, one NaN at 0x80, no -0, no
infinities); NaNs come out as the quiet NaN with the byte's sign.

MXFP4 (gpt-oss, ``quant_method: "mxfp4"``): ``P_blocks`` U8 of shape
``(..., G, 16)`` and ``P_scales`` U8 (or F8_E8M0) of shape ``(..., G)`` are the
logical tensor ``P`` of shape ``(..., G * 32)``. Each group of 32 values is 16
bytes; byte j holds value 2j in its low nibble and value 2j+1 in its high
nibble (OpenAI's ``gpt_oss/torch/weights.py`` and transformers'
``convert_moe_packed_tensors``: ``out[:, 0::2] = lut[b & 0x0F]``,
``out[:, 1::2] = lut[b >> 4]``; llama.cpp's converter repacks this to ggml's
MXFP4 block, where byte j holds values j and j+16). A nibble is FP4 E2M1
(0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated), the scale byte E8M0:
``2 ** (e - 127)``, and 0xFF is NaN (OCP MX spec v1.0; gguf-py and
transformers compute 2**128 there instead; no real release holds 0xFF). Every
product is exact in float32 except an overflow to inf (e = 254 with |v| >= 2),
so the result equals gguf-py's MXFP4 dequantizer bit for bit for e <= 254,
except that code 0b1000 is -0 (OCP, OpenAI, transformers) where gguf-py's
integer table gives +0.
The logical tensor keeps the source's axes: gpt-oss's
``model.layers.N.mlp.experts.gate_up_proj`` is ``(E, 2I, H)``, numpy
``(E, N_out, K_in)``, whose rows interleave gate (even) and up (odd).

Listing: the weight (FP8) or the logical tensor (MXFP4) is listed with its
source dtype name (``F8_E4M3``, ..., ``MXFP4``) so users see what it was;
``read`` returns float32. Scale tensors are consumed: they are listed nowhere.
``TensorInfo.nbytes`` counts the weight's and its scale's bytes. Static
activation and KV-cache scales (``input_scale``, ``activation_scale``,
``k_scale``, ...) of a quantized checkpoint are not weights: they are left out
and reported as skipped.

Memory: a read fills the float32 output in chunks of :data:`CHUNK` elements
through one small byte buffer; besides the output it holds that buffer, the
scale tensor (a small fraction of the weight) and one chunk's temporaries.

Refused, each with one line naming the file and tensor: GPTQ / AWQ
(``qweight``, ``qzeros``, ``g_idx``) and bitsandbytes (``absmax``,
``quant_map``, ``quant_state.*``, ``SCB``) tensors or such a ``quant_method``;
packed-integer and NVFP4 compressed-tensors/modelopt forms; an FP8 tensor with
no scale; a weight scale beside a weight that is not FP8; F8_E8M0 tensors that
are not MXFP4 scales; F4 / F6 tensors.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import SourceError, escape_name

DEQUANTIZE_FIRST = ("dequantize it first (e.g. with transformers: load and save_pretrained in bf16, "
                    "or use the original unquantized release)")

FP8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
MXFP4 = "MXFP4"
# dtypes the safetensors header parser accepts for these schemes: one byte per element
STORAGE_DTYPES = FP8_DTYPES + ("F8_E8M0",)
# dtypes a listed tensor may carry that ``dequantize`` reads (to float32)
DEQUANTIZED_DTYPES = FP8_DTYPES + (MXFP4,)
# sub-byte dtypes: refused in the header, before their (fractional) sizes are checked
REFUSED_DTYPES = {
    "F4": "dtype F4 (4-bit float e2m1, two a byte)",
    "F6_E2M3": "dtype F6_E2M3 (6-bit float)",
    "F6_E3M2": "dtype F6_E3M2 (6-bit float)",
}
SCALE_DTYPES = ("F32", "F16", "BF16")
CHUNK = 1 << 20  # elements dequantized at a time (1 MB of FP8 bytes, 4 MB of float32)
MAX_BLOCK = 1 << 24  # a weight_block_size side (real: 128)

# quant_method values whose weights orkpack cannot read: the user dequantizes first
REFUSED_METHODS = {
    "gptq": "GPTQ", "awq": "AWQ", "bitsandbytes": "bitsandbytes", "aqlm": "AQLM", "hqq": "HQQ",
    "eetq": "EETQ", "quanto": "quanto", "exl2": "EXL2", "vptq": "VPTQ", "higgs": "HIGGS", "spqr": "SpQR",
    "bitnet": "BitNet", "gptq_marlin": "GPTQ (marlin)", "awq_marlin": "AWQ (marlin)", "marlin": "marlin",
    "auto-round": "AutoRound", "autoround": "AutoRound",
}

# tensor-name suffixes of foreign packed forms -> what they are
_FOREIGN = (
    (re.compile(r"(?:^|\.)(?:qweight|qzeros|g_idx)$"), "part of a GPTQ/AWQ packed integer weight"),
    (re.compile(r"\.(?:absmax|quant_map|nested_absmax|nested_quant_map)$|\.quant_state\.bitsandbytes__\w+$"),
     "part of a bitsandbytes 4-bit weight (its saved quant state)"),
    (re.compile(r"(?:^|\.)SCB$"), "part of a bitsandbytes 8-bit weight (its SCB scales)"),
    (re.compile(r"(?:^|\.|_)weight_(?:packed|zero_point|shape|global_scale)$"),
     "part of a compressed-tensors packed-integer or NVFP4 weight"),
    (re.compile(r"(?:^|\.)weight_scale_2$"), "part of an NVFP4 (modelopt) weight"),
    (re.compile(r"(?:^|\.)(?:q_weight|q_invperm|q_groups)$"), "part of an EXL2 weight"),
)
# static activation / KV-cache scales of FP8 checkpoints: not weights
_ACT_SCALE = re.compile(r"(?:^|\.)(?:input_scale|input_scale_ub|activation_scale|k_scale|v_scale|kv_scale|"
                        r"q_scale|prob_scale|output_scale)$")
_ACT_SCALE_MAX = 1 << 20  # elements: per tensor, per channel or per token group at most


def _fp8_table(exp_bits: int, man_bits: int, bias: int, fnuz: bool, ieee_special: bool) -> np.ndarray:
    """float32 value of every byte of an 8-bit float format (1 sign bit)."""
    bits = np.empty(256, np.uint32)
    top = (1 << exp_bits) - 1
    for b in range(256):
        s, e, m = b >> 7, (b >> man_bits) & top, b & ((1 << man_bits) - 1)
        nan = False
        if fnuz:
            nan = b == 0x80
        elif ieee_special:
            if e == top:
                if m == 0:
                    bits[b] = (s << 31) | 0x7F800000
                    continue
                nan = True
        else:  # E4M3FN: only S.1111.111 is NaN
            nan = e == top and m == (1 << man_bits) - 1
        if nan:
            bits[b] = (s << 31) | 0x7FC00000
            continue
        v = math.ldexp(m, 1 - bias - man_bits) if e == 0 else math.ldexp((1 << man_bits) + m, e - bias - man_bits)
        bits[b] = np.array(-v if s else v, np.float32).view(np.uint32)
    return bits.view(np.float32)


FP8_TABLES = {
    "F8_E4M3": _fp8_table(4, 3, 7, fnuz=False, ieee_special=False),
    "F8_E5M2": _fp8_table(5, 2, 15, fnuz=False, ieee_special=True),
    "F8_E4M3FNUZ": _fp8_table(4, 3, 8, fnuz=True, ieee_special=False),
    "F8_E5M2FNUZ": _fp8_table(5, 2, 16, fnuz=True, ieee_special=False),
}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def _e8m0_table() -> np.ndarray:
    bits = np.empty(256, np.uint32)
    bits[0] = 0x00400000  # 2**-127, a float32 subnormal
    bits[1:255] = np.arange(1, 255, dtype=np.uint32) << 23
    bits[255] = 0x7FC00000  # NaN
    return bits.view(np.float32)


E8M0 = _e8m0_table()
# byte -> its two float32 values (low nibble first in memory), as one uint64 per byte
_E2M1_PAIRS = (E2M1.view(np.uint32)[np.arange(256) & 15].astype(np.uint64)
               | (E2M1.view(np.uint32)[np.arange(256) >> 4].astype(np.uint64) << np.uint64(32)))


@dataclass(frozen=True)
class _Bytes:
    file: int
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Recipe:
    """How to dequantize one source part (a weight, or one expert of a stacked weight)."""

    scheme: str  # "fp8" or "mxfp4"
    data: _Bytes  # the FP8 weight, or the MXFP4 blocks
    scale: _Bytes  # the scale tensor, or the MXFP4 scales
    block: tuple[int, int] = (1, 1)  # FP8: rows, columns of the weight sharing one scale


def _name(files: list[Path], fi: int, t: str) -> str:
    return f"{escape_name(str(files[fi]))}: tensor {escape_name(t)}"


def check_config(config: dict | None, root: Path | str) -> None:
    """Refuse a config.json whose quantization_config names a scheme orkpack cannot read."""
    qc = _qconfig(config)
    method = qc.get("quant_method")
    if isinstance(method, str) and method.lower() in REFUSED_METHODS:
        raise SourceError(f"{escape_name(str(root))}: config.json says the weights are "
                          f"{REFUSED_METHODS[method.lower()]}-quantized (quant_method {escape_name(method)!r}), "
                          f"which orkpack does not read; {DEQUANTIZE_FIRST}")


def _qconfig(config: dict | None) -> dict:
    if not isinstance(config, dict):
        return {}
    for key in ("quantization_config", "compression_config"):
        qc = config.get(key)
        if isinstance(qc, dict):
            return qc
    return {}


def _block_size(config: dict | None, root) -> tuple[int, int]:
    qc = _qconfig(config)
    bs = qc.get("weight_block_size")
    where = "quantization_config.weight_block_size"
    if bs is None:
        groups = qc.get("config_groups")
        if isinstance(groups, dict):
            for g in groups.values():
                w = g.get("weights") if isinstance(g, dict) else None
                if isinstance(w, dict) and w.get("strategy") == "block" and w.get("block_structure") is not None:
                    bs, where = w["block_structure"], "quantization_config block_structure"
                    if isinstance(bs, str) and (m := re.fullmatch(r"(\d{1,9})x(\d{1,9})", bs)):
                        bs = [int(m.group(1)), int(m.group(2))]  # older compressed-tensors: "128x128"
                    break
    if bs is None:
        return 128, 128
    if not (isinstance(bs, list) and len(bs) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_BLOCK for v in bs)):
        raise SourceError(f"{escape_name(str(root))}: config.json {where} is "
                          f"{escape_name(str(bs), 60)}, not two positive block sides; fix the config")
    return bs[0], bs[1]


@dataclass
class Prepared:
    raw: list  # the reader's records with scales consumed and MXFP4 pairs merged
    recipes: dict  # (file, offset, nbytes) of a listed record -> Recipe
    skipped: list  # base.Skipped: the reader's, plus the activation scales left out, by name


def prepare(raw: list, config: dict | None, root: Path | str, files: list[Path], skipped: list = ()) -> Prepared:
    """Pair FP8 weights with their scales and MXFP4 blocks with theirs; refuse foreign schemes.

    ``raw``: the reader's records ``(name, dtype, shape, file index, absolute
    offset, nbytes)``. Returns the records to list: an FP8 weight keeps its
    name, dtype and shape; an MXFP4 pair becomes one record named without
    ``_blocks``, dtype ``MXFP4``, the logical shape. Their nbytes include the
    scale's bytes; ``recipes`` says how to read each. ``skipped``: the reader's
    skipped tensors, returned with the dropped activation scales added.
    """
    from .base import Skipped
    from .names import natural_key

    check_config(config, root)
    by_name = {r[0]: r for r in raw}
    for r in raw:
        for pat, what in _FOREIGN:
            if pat.search(r[0]):
                raise SourceError(f"{_name(files, r[3], r[0])}: this is {what}, which orkpack does not read; "
                                  f"{DEQUANTIZE_FIRST}")
    consumed: set[str] = set()
    out: list = []
    recipes: dict = {}
    dropped: list = []

    def add(rec: tuple, recipe: Recipe) -> None:
        key = (rec[3], rec[4], rec[5])
        if key in recipes:
            raise SourceError(f"{_name(files, rec[3], rec[0])}: its bytes are declared by another quantized "
                              "tensor too; the file is damaged; download it again")
        recipes[key] = recipe
        out.append(rec)

    # MXFP4: P_blocks + P_scales -> P
    mxfp4 = _qconfig(config).get("quant_method") == "mxfp4"
    for r in raw:
        t, dtype, shape, fi, off, nb = r
        if not t.endswith("_blocks"):
            continue
        base = t[: -len("_blocks")]
        sc = by_name.get(base + "_scales")
        if sc is None:
            if dtype == "U8" and mxfp4:
                raise SourceError(f"{_name(files, fi, t)}: MXFP4 blocks without {escape_name(base)}_scales; "
                                  "the checkpoint is incomplete; download it again")
            continue
        tn = _name(files, fi, t)
        if dtype != "U8" and not mxfp4:
            continue  # float tensors that merely share the names: not MXFP4
        if dtype != "U8" or sc[1] not in ("U8", "F8_E8M0"):
            raise SourceError(f"{tn}: MXFP4 blocks must be U8 and their scales U8 or F8_E8M0, not {escape_name(dtype)} "
                              f"and {escape_name(sc[1])}; the checkpoint is damaged or of an unknown scheme; "
                              f"{DEQUANTIZE_FIRST}")
        if len(shape) < 2 or shape[-1] != 16 or list(sc[2]) != list(shape[:-1]):
            raise SourceError(f"{tn}: MXFP4 blocks {tuple(shape)} and scales {tuple(sc[2])} do not fit "
                              "(expected (..., G, 16) and (..., G)); the checkpoint is damaged; download it again")
        if base in by_name:
            raise SourceError(f"{tn}: both {escape_name(base)} and its MXFP4 blocks are present; remove one")
        logical = (*shape[:-2], shape[-2] * 32)
        rec = (base, MXFP4, list(logical), fi, off, nb + sc[5])
        add(rec, Recipe("mxfp4", _Bytes(fi, off, nb, dtype, tuple(shape)),
                        _Bytes(sc[3], sc[4], sc[5], sc[1], tuple(sc[2]))))
        consumed.update((t, sc[0]))

    # FP8 weights and their scales
    block = None
    for r in raw:
        t, dtype, shape, fi, off, nb = r
        if dtype not in FP8_DTYPES:
            continue
        tn = _name(files, fi, t)
        if t.endswith(("_scale", "_scale_inv")):
            raise SourceError(f"{tn}: an {dtype} scale tensor (NVFP4-style two-level scales); this quantization "
                              f"scheme is not supported; {DEQUANTIZE_FIRST}")
        cands = [by_name[s] for s in (t + "_scale_inv", t + "_scale") if s in by_name]
        if not cands:
            raise SourceError(f"{tn}: {dtype} weight with no scale tensor ({escape_name(t)}_scale_inv or "
                              f"{escape_name(t)}_scale); the checkpoint is incomplete or of an unknown scheme; "
                              f"{DEQUANTIZE_FIRST}")
        if len(cands) > 1:
            raise SourceError(f"{tn}: has both {escape_name(t)}_scale_inv and {escape_name(t)}_scale; "
                              "the checkpoint is inconsistent; remove one")
        sc = cands[0]
        if sc[1] not in SCALE_DTYPES:
            raise SourceError(f"{_name(files, sc[3], sc[0])}: a weight scale of dtype {escape_name(sc[1])}; "
                              f"supported: {', '.join(SCALE_DTYPES)}; {DEQUANTIZE_FIRST}")
        if block is None:
            block = _block_size(config, root)
        blk = _fp8_scale_layout(tuple(shape), tuple(sc[2]), block)
        if blk is None:
            raise SourceError(f"{_name(files, sc[3], sc[0])}: scale shape {tuple(sc[2])} does not fit the weight "
                              f"{tuple(shape)} (per tensor [], per channel [N] or [N, 1], or one per "
                              f"{block[0]}x{block[1]} block); the checkpoint is damaged or of an unknown scheme")
        rec = (t, dtype, list(shape), fi, off, nb + sc[5])
        add(rec, Recipe("fp8", _Bytes(fi, off, nb, dtype, tuple(shape)),
                        _Bytes(sc[3], sc[4], sc[5], sc[1], tuple(sc[2])), blk))
        consumed.update((t, sc[0]))

    quantized = bool(recipes) or bool(_qconfig(config))
    for r in raw:
        t, dtype, shape, fi, off, nb = r
        if t in consumed:
            continue
        tn = _name(files, fi, t)
        if dtype == "F8_E8M0":
            raise SourceError(f"{tn}: an F8_E8M0 (exponent-only) tensor that is not the _scales of MXFP4 "
                              f"_blocks; this quantization scheme is not supported; {DEQUANTIZE_FIRST}")
        if t.endswith("_scale_inv") or t.endswith("weight_scale"):
            w = by_name.get(t[: -len("_scale_inv")] if t.endswith("_scale_inv") else t[: -len("_scale")])
            what = f"{escape_name(w[0])}, which is {escape_name(w[1])}, not FP8" if w else "no tensor of this checkpoint"
            raise SourceError(f"{tn}: a weight scale for {what}; this quantization scheme is not supported; "
                              f"{DEQUANTIZE_FIRST}")
        if quantized and _ACT_SCALE.search(t) and math.prod(shape) <= _ACT_SCALE_MAX:
            dropped.append(Skipped(t, dtype, tuple(shape), "static activation/KV-cache scale: used by the "
                                                           "source's FP8 kernels, not a weight"))
            continue
        out.append(r)
    # keep the reader's order for the rest; merged records sit where their first part was
    order = {r[0]: i for i, r in enumerate(raw)}
    out.sort(key=lambda r: order.get(r[0], order.get(r[0] + "_blocks", 0)))
    return Prepared(out, recipes, sorted([*skipped, *dropped], key=lambda s: natural_key(s.name)))


def _fp8_scale_layout(shape: tuple[int, ...], sshape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int] | None:
    """(rows, columns) of the weight sharing one scale, or None if ``sshape`` fits no known layout.

    Leading dimensions of the weight (stacked matrices) must lead the scale too,
    except for one scale for the whole tensor.
    """
    if math.prod(sshape) == 1 and len(sshape) <= max(len(shape), 1):
        n, k = (shape[-2] if len(shape) >= 2 else 1), (shape[-1] if shape else 1)
        return max(n, 1), max(k, 1)
    if len(shape) < 2:
        return None
    lead, n, k = shape[:-2], shape[-2], shape[-1]
    if sshape[: len(lead)] != lead:
        return None
    rest = sshape[len(lead):]
    bn, bk = block
    if rest == (-(-n // bn), -(-k // bk)):
        return bn, bk
    if rest in ((n,), (n, 1)):
        return 1, max(k, 1)
    if rest in ((), (1, 1)):
        return max(n, 1), max(k, 1)
    return None


def _scale_array(scale: _Bytes, read_bytes: Callable) -> np.ndarray:
    raw = np.empty(scale.nbytes, np.uint8)
    read_bytes(scale.file, scale.offset, memoryview(raw))
    if scale.dtype == "F32":
        return raw.view("<f4").astype(np.float32, copy=False)
    if scale.dtype == "F16":
        return raw.view("<f2").astype(np.float32)
    return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)  # BF16


def dequantize(shape: tuple[int, ...], recipes: list[Recipe], read_bytes: Callable,
               out: np.ndarray | None = None) -> np.ndarray:
    """The float32 tensor of ``shape`` from one recipe per part (stacked experts: one per expert, in order).

    ``read_bytes(file, offset, memoryview)`` fills the view from the source.
    ``out``: an optional reusable uint8 buffer (see base.Source.read).
    """
    from .base import array_in

    arr = array_in(out, tuple(shape), np.float32)
    flat = arr.reshape(-1)
    per = flat.size // len(recipes) if recipes else 0
    scratch = np.empty(min(CHUNK, max(per, 1)) + 16, np.uint8) if per else None
    with np.errstate(over="ignore", invalid="ignore"):  # inf (overflow) and NaN (inf x 0) are values here
        for i, rc in enumerate(recipes):
            if per == 0:
                break
            dest = flat[i * per: (i + 1) * per]
            if rc.scheme == "mxfp4":
                _mxfp4(rc, dest, read_bytes, scratch)
            else:
                _fp8(rc, dest, read_bytes, scratch)
    return arr


def _mxfp4(rc: Recipe, dest: np.ndarray, read_bytes: Callable, scratch: np.ndarray) -> None:
    groups = rc.scale.nbytes  # one scale byte per 32-value group
    step = max(1, (scratch.size - 16) // 17)
    blk_buf = scratch[: step * 16]
    sc_buf = scratch[step * 16: step * 17]
    for g0 in range(0, groups, step):
        n = min(step, groups - g0)
        b, s = blk_buf[: n * 16], sc_buf[:n]
        read_bytes(rc.data.file, rc.data.offset + g0 * 16, memoryview(b))
        read_bytes(rc.scale.file, rc.scale.offset + g0, memoryview(s))
        o = dest[g0 * 32: (g0 + n) * 32]
        np.take(_E2M1_PAIRS, b, out=o.view(np.uint64), mode="clip")
        o.reshape(n, 32)[...] *= E8M0[s][:, None]


def _fp8(rc: Recipe, dest: np.ndarray, read_bytes: Callable, scratch: np.ndarray) -> None:
    shape = rc.data.shape
    n = shape[-2] if len(shape) >= 2 else 1
    k = shape[-1] if shape else 1
    mats = math.prod(shape[:-2]) if len(shape) >= 2 else 1
    if n * k == 0:
        return
    lut = FP8_TABLES[rc.data.dtype]
    s = _scale_array(rc.scale, read_bytes)
    bn, bk = rc.block
    nb, kb = -(-n // bn), -(-k // bk)
    s = s.reshape(-1, nb, kb) if s.size > 1 else s.reshape(1, 1, 1)
    cap = scratch.size - 16
    rows = max(1, cap // k)  # rows per chunk (1 when a row is over the chunk: then columns in chunks)
    cols = k if rows > 1 or k <= cap else cap
    # kb == 1: the scale varies by rows only (per tensor, per matrix, per channel, or row blocks)
    bands = [(0, 0, n)] if kb == 1 else [(i, i * bn, min(n, (i + 1) * bn)) for i in range(nb)]
    for m in range(mats):
        sm = s[m if s.shape[0] > 1 else 0]
        base = m * n * k
        for i, a, z in bands:
            for r0 in range(a, z, rows):
                r1 = min(r0 + rows, z)
                for c0 in range(0, k, cols):
                    c1 = min(c0 + cols, k)
                    cnt = (r1 - r0) * (c1 - c0)
                    start = base + r0 * k + c0
                    b = scratch[:cnt]
                    read_bytes(rc.data.file, rc.data.offset + start, memoryview(b))
                    o = dest[start: start + cnt]
                    np.take(lut, b, out=o, mode="clip")
                    ov = o.reshape(r1 - r0, c1 - c0)
                    if kb > 1:
                        ov *= _expand(sm[i], bk, c0, c1)[None, :]
                    elif nb == 1:
                        ov *= sm[0, 0]
                    else:
                        ov *= _expand(sm[:, 0], bn, r0, r1)[:, None]


def _expand(s: np.ndarray, b: int, c0: int, c1: int) -> np.ndarray:
    """``s[j // b]`` for j in [c0, c1): scale j covers elements [j*b, (j+1)*b)."""
    j0, j1 = c0 // b, (c1 - 1) // b + 1
    counts = np.full(j1 - j0, b, np.int64)
    counts[0] -= c0 - j0 * b
    counts[-1] -= j1 * b - c1
    return np.repeat(s[j0:j1], counts)
