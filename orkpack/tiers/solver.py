"""The phase-aware solver: every item to host NF4, host int8, NPU int8 tiles, or NPU tiles + a host NF4 copy.

Constraints (docs/TIERMAP.md "The solver and the objectives"):
  NPU    sum of NPU bytes (int8 tiles with padding + scales, each part aligned) <= iova_usable
  RAM    reserve + KV cache + float tensors + every item's resident bytes <= total (or --max-ram)
         (an NPU item counts its NPU bytes once: UMA; a host copy counts too)
  speed  --min-decode-tok-s, --min-prefill-tok-s on the predicted speeds
  pins   --npu, --cpu, --int8, --nf4, --keep narrow an item's choices; fnmatch globs against the
         tensor name, the item name ``name[e]`` and the expert-slice name ``blk.N.ffn_gate.E.weight``.
         An exact name always matches itself (so ``name[3]`` needs no escaping).
         What always stays float (MoE routers, biases, ranks other than 2 and 3: orkpack/keepfloat.py) is no item.

Costs per item and choice come from the board's cost model (cost.py) and the hotness
profile: decode seconds per token (the bytes the CPU reads), prefill seconds per chunk,
RAM and NPU bytes, quality (the profile's sensitivity where the CPU decodes int8).

Objectives (Goal), lexicographic, each stage an exact integer program over groups of
identical items (milp.py, HiGHS): balanced (the default) = decode within 5 % of the
best, then prefill, then quality; or decode / prefill / quality first. The result is
optimal or carries the proven gap; deterministic.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from typing import Callable
from itertools import chain, compress, islice
from operator import getitem, ne

import numpy as np

from ..errors import OrkError, escape_name
from .. import archs, globs
from ..keepfloat import FLOAT_GLOBS, ROUTER, pin_warnings, recorded_globs, why_float
from ..sources import names as _names
from . import cost, milp
from .board import HOST_HIGH, HOST_LOW, Board
from .manifest import NON_FLOAT_DTYPES, Item, Manifest, cache_bytes, state_bytes
from .profile import Profile
from .tiermap import Decision, TierMap

PIN_KINDS = ("npu", "cpu", "int8", "nf4", "keep")
# what always stays float besides tensors that are not a matrix or a stack of expert matrices (orkpack/keepfloat.py):
# never items; a map records these, and the convolution kernels' globs when the model has one (recorded_globs)
DEFAULT_KEEP = FLOAT_GLOBS
_FLOAT_ENC = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
GiB = 1 << 30
BYTES_OF = ("file", "decode")  # what --max-bytes bounds: the pack's weight bytes, or what a decode token reads


def _item_names(it: Item) -> list[str]:
    out = [it.tensor, it.name]
    if it.expert is not None:
        m = it.tensor.split(".")
        if len(m) == 4 and m[2].endswith("_exps"):
            out.append(_names.expert_slice_name(int(m[1]), m[2][4:-5], it.expert))
    return out


def match_pins(manifest: Manifest, pins: dict[str, list[str]] | None) -> tuple[dict[int, set[str]], list[str]]:
    """item index -> pin kinds; warnings for globs that match nothing."""
    pins = pins or {}
    for k in pins:
        if k not in PIN_KINDS:
            raise OrkError(f"unknown pin kind {escape_name(str(k))!r}; use {', '.join(PIN_KINDS)}")
    out: dict[int, set[str]] = {}
    warnings = []
    if not any(pins.values()):
        return out, warnings
    names = [_item_names(it) for it in manifest.items]
    float_names = {t.name for t in manifest.floats}
    for kind in PIN_KINDS:
        for glob in pins.get(kind) or ():
            hit = False
            for i, ns in enumerate(names):
                if any(globs.matches(n, glob) for n in ns):  # "name[3]" is literal too
                    out.setdefault(i, set()).add(kind)
                    hit = True
            if not hit and not any(fnmatch.fnmatchcase(n, glob) for n in float_names):
                warnings.append(globs.no_match_warning(kind, glob, sorted({ns[0] for ns in names} | float_names)))
    warnings += pin_warnings(pins, [(t.name, t.shape) for t in manifest.tensors if t.dtype not in NON_FLOAT_DTYPES])
    for i, ks in out.items():
        it = manifest.items[i]
        for a, b in (("npu", "cpu"), ("npu", "keep"), ("int8", "nf4"), ("int8", "keep"), ("nf4", "keep")):
            if a in ks and b in ks:
                raise OrkError(f"{escape_name(it.name)}: pinned both --{a} and --{b}; make the globs disjoint")
        if "npu" in ks and it.role in ("embedding", "lookup"):
            what = "the token embedding" if it.role == "embedding" else "an embedding table"
            raise OrkError(f"{escape_name(it.name)}: {what} is a lookup, not a matmul; it cannot be pinned --npu")
    return out, warnings


@dataclass
class _Row:
    npu: int
    i8: int
    n4: int
    fl: int
    eligible: bool
    forced_tier: str | None
    forced_enc: str | None  # int8 | nf4 | float
    pin: str | None
    # the item's NPU slice is stored 4-bit (an --nf4 pin, or build --npu-storage nf4): nf4 (b64), inflated to
    # int8 tiles at load, and its own host copy (orkpack/build.py encode_slice)
    npu_nf4: bool = False
    copy_fmt: str = ""  # the format of its host copy (cost.copy_format): b64 when npu_nf4, else the host low level's
    copy: int = 0  # the host copy's bytes (cost.copy_bytes in copy_fmt)


NPU_STORAGES = ("int8", "nf4")  # orkpack build --npu-storage: how NPU slices are stored

# --npu-storage nf4 leaves the FFN down projections int8 on the NPU: they write the first token's massive
# activations (the attention sink), whose inputs there are one huge channel, so the NPU's per-token int8
# activations reduce the product to one weight column and NF4's error on it is not averaged (docs/EVAL.md,
# "The first token with --npu-storage nf4", issue 25). An --nf4 pin still stores them 4-bit.
_NPU_INT8_ONLY = re.compile(r"^blk\.\d+\.ffn_down(_exps|_shexp)?\.weight$")


def npu_nf4_storable(name: str) -> bool:
    """Whether ``build --npu-storage nf4`` stores this tensor's NPU slices 4-bit (else int8 tiles)."""
    return not _NPU_INT8_ONLY.match(name)


def _rows(manifest: Manifest, board: Board, pins: dict[int, set[str]], npu_storage: str = "int8",
          npu_nf4: list[bool] | None = None) -> list[_Row]:
    """One row per item: its sizes, pins and NPU storage. ``npu_storage`` "nf4" (build --npu-storage nf4)
    stores every NPU slice 4-bit but the FFN down projections' (:func:`npu_nf4_storable`), as an --nf4 pin stores
    its items'; ``npu_nf4`` (per item) says instead
    which NPU slices are stored 4-bit (what a followed tier map's NPU encodings say)."""
    if npu_storage not in NPU_STORAGES:
        raise OrkError(f"--npu-storage {escape_name(str(npu_storage))!r}: choose {' or '.join(NPU_STORAGES)}")
    rows = []
    has_npu = "npu" in board.engines and board.iova_usable_bytes > 0
    memo: dict[tuple, _Row] = {}  # items alike in shape, role, pins and NPU storage share one (read-only) row
    p, p_storable = None, True  # the previous item if it had no pins and no storage given: an alike next one has its
    # very key
    for i, it in enumerate(manifest.items):
        ks = pins.get(i)
        stored = None if npu_nf4 is None else bool(npu_nf4[i])
        storable = npu_nf4_storable(it.tensor) if npu_storage == "nf4" else True  # (only --npu-storage nf4 asks)
        if ks is None and stored is None and p is not None and it.n == p.n and it.k == p.k and it.dtype == p.dtype \
                and it.role == p.role and storable == p_storable:
            rows.append(rows[-1])
            continue
        p, p_storable = (it if ks is None and stored is None else None), storable
        key = (it.n, it.k, it.dtype, it.role, None if ks is None else frozenset(ks), stored, storable)
        r = memo.get(key)
        if r is not None:
            rows.append(r)
            continue
        ks = ks or set()
        keep = "keep" in ks
        forced_tier = "npu" if "npu" in ks else ("host" if ("cpu" in ks or keep) else None)
        forced_enc = "float" if keep else ("int8" if "int8" in ks else ("nf4" if "nf4" in ks else None))
        eligible = has_npu and it.role not in ("embedding", "lookup") and forced_tier != "host"
        pin = ",".join(f"--{k}" for k in PIN_KINDS if k in ks) or None
        if forced_tier == "npu" and not has_npu:
            raise OrkError(f"{escape_name(it.name)}: pinned --npu but board {board.name} has no NPU")
        if stored is None:
            stored = forced_enc == "nf4" or (npu_storage == "nf4" and storable)
        fmt = cost.copy_format(board, stored)
        r = memo[key] = _Row(cost.npu_bytes(it.n, it.k, board), cost.high_bytes(it.n, it.k, board),
                             cost.low_bytes(it.n, it.k, board), it.float_bytes, eligible, forced_tier,
                             forced_enc, pin, stored, fmt, cost.copy_bytes(it.n, it.k, fmt))
        rows.append(r)
    return rows


def _host_min(r: _Row) -> int:
    return {"float": r.fl, "int8": r.i8, "nf4": r.n4, None: r.n4}[r.forced_enc]


def _fmt(b: int) -> str:
    return f"{b / GiB:.2f} GiB" if abs(b) >= GiB // 4 else f"{b / (1 << 20):.1f} MiB"


def _no_fit(manifest: Manifest, board: Board, rows: list[_Row], need: int, cap: int, kv: int, ctx: int,
            kv_type: str, fixed_no_kv: int, max_ram: int | None = None) -> OrkError:
    short = need - cap
    hints = []
    if cap < board.total_bytes and need <= board.total_bytes:  # --max-ram binds, the board has the room
        hints.append(f"--max-ram {need} or more (the board has {board.total_bytes})")
    room = cap - fixed_no_kv
    if room > 0 and kv > 0:
        max_ctx = int(room // (kv / ctx))
        if max_ctx >= 256:
            hints.append(f"--ctx {max_ctx // 256 * 256} or shorter")
    if kv_type == "f16":
        kv8 = manifest.kv_bytes(ctx, "q8_0")
        if kv - kv8 >= short:
            hints.append("--kv-type q8_0")
    save = sum(_host_min(r) - r.n4 for r in rows if r.forced_tier != "npu" and r.forced_enc in ("int8", "float"))
    save += sum(r.npu - r.n4 for r in rows if r.forced_tier == "npu")
    if save >= short:
        hints.append("fewer --int8/--keep/--npu pins (more NF4)")
    if board.reserve_bytes >= short:
        hints.append(f"a smaller reserve (reserve_bytes <= {board.reserve_bytes - short} in a --board file)")
    what = "; it would fit with " + " or ".join(hints) if hints else "; no option fits it on this board: use a larger board"
    within = f" within --max-ram {max_ram}" if max_ram is not None and cap < board.total_bytes else ""
    return OrkError(f"{escape_name(manifest.source)} does not fit on {board.name}{within}: short by {short} bytes "
                    f"({_fmt(short)}) at ctx {ctx} with {kv_type} KV{what}")


GOALS = ("balanced", "decode", "prefill", "quality")
DECODE_SLACK = 0.05  # the default goal keeps decode within 5 % of the best the board allows
PREFILL_SLACK = 0.01  # ... and prefill within 1 % of the most it then allows, for quality


@dataclass
class Goal:
    """What the user asks of a plan (docs/TIERMAP.md "Objectives").

    balanced (default): decode within ``DECODE_SLACK`` of the best achievable, then
    prefill within ``PREFILL_SLACK`` of the most that allows, then the best quality. decode / prefill / quality: that first, then
    the other two in the order decode, prefill, quality. Constraints hold in every stage.
    """
    name: str = "balanced"
    min_decode_tok_s: float | None = None
    min_prefill_tok_s: float | None = None
    max_ram: int | None = None
    decode_floor: float | None = None  # frontier: decode tok/s >= this fraction of the best
    max_kld: float | None = None  # predicted KLD (the additive model of the sensitivities) at most this
    max_bytes: int | None = None  # weight bytes at most this: what the pack holds, or what a decode token reads
    bytes_of: str = "file"  # which bytes max_bytes bounds: "file" (the pack's weights) or "decode" (read a token)
    bpw: float | None = None  # instead of max_bytes: bits per weight (8 x bytes / the model's weight parameters)

    def __post_init__(self) -> None:
        if self.name not in GOALS:
            raise OrkError(f"--goal {escape_name(str(self.name))!r} is not one of {', '.join(GOALS)}")
        for k in ("min_decode_tok_s", "min_prefill_tok_s"):
            v = getattr(self, k)
            if v is not None and not (isinstance(v, (int, float)) and v > 0 and np.isfinite(v)):
                raise OrkError(f"--{k.replace('_', '-')} must be a positive number of tokens per second")
        if self.max_ram is not None and (not isinstance(self.max_ram, int) or self.max_ram <= 0):
            raise OrkError("--max-ram must be a positive number of bytes")
        if self.max_kld is not None and not (isinstance(self.max_kld, (int, float)) and self.max_kld >= 0
                                             and np.isfinite(self.max_kld)):
            raise OrkError("--max-kld must be a non-negative number (a mean KL divergence)")
        if self.max_bytes is not None and (not isinstance(self.max_bytes, int) or self.max_bytes <= 0):
            raise OrkError("--max-bytes must be a positive number of bytes")
        if self.bpw is not None and not (isinstance(self.bpw, (int, float)) and 0 < self.bpw and np.isfinite(self.bpw)):
            raise OrkError("--bpw must be a positive number of bits per weight")
        if self.bpw is not None and self.max_bytes is not None:
            raise OrkError("--bpw and --max-bytes both bound the size; give one")
        if self.bytes_of not in BYTES_OF:
            raise OrkError(f"--bytes-of {escape_name(str(self.bytes_of))!r} is not one of {', '.join(BYTES_OF)}")

    def to_json(self) -> dict:
        return {"goal": self.name, "min_decode_tok_s": self.min_decode_tok_s,
                "min_prefill_tok_s": self.min_prefill_tok_s, "max_ram": self.max_ram,
                "decode_floor": self.decode_floor, "max_kld": self.max_kld} \
            | ({} if self.max_bytes is None and self.bpw is None else
               {"max_bytes": self.max_bytes, "bpw": self.bpw, "bytes_of": self.bytes_of})

    def sized(self) -> bool:
        return self.max_bytes is not None or self.bpw is not None

    def byte_cap(self, params: int) -> int | None:
        """The weight bytes the plan may use: --max-bytes, or --bpw x the model's weight parameters / 8."""
        return self.max_bytes if self.bpw is None else int(self.bpw * params // 8)


@dataclass
class _Model:
    """Per item and choice: the linear costs the MILP sees, and the constants around them."""
    allowed: list[tuple[str, ...]]
    ram: list[tuple[float, ...]]
    npu: list[tuple[float, ...]]
    dec: list[tuple[float, ...]]  # seconds per decode token
    pre: list[tuple[float, ...]]  # seconds per prefill chunk of prefill_m tokens
    qual: list[tuple[float, ...]]
    share: list[float]  # decode: how often a token reads the item (routing share, 1 for dense)
    dec_const: float  # seconds per token besides the items (fixed cost, floats, KV read)
    pre_const: float  # seconds per chunk besides the items (forced floats, attention, fixed cost)
    klass: list[int] = field(default_factory=list)  # items of one class were costed once: all equal
    kld: list[tuple[float, ...]] = field(default_factory=list)  # predicted KLD: the sensitivity where decode reads NF4
    read: list[tuple[float, ...]] = field(default_factory=list)  # weight bytes a decode token reads (share x bytes)
    class_allowed: list[tuple[str, ...]] = field(default_factory=list)  # the allowed choices of each class


def _share(it: Item, m_eff: float, prefill_m: int, tied: bool) -> float:
    """How much of the item one decode token reads (1 = all of it)."""
    if it.role == "expert":
        return m_eff / prefill_m if prefill_m else 0.0
    if it.role == "embedding":  # one row per token; all of it when it doubles as the output head
        return 1.0 / max(it.n, 1) + (1.0 if tied else 0.0)
    if it.role == "lookup":  # another embedding table (gemma4's per-layer one): one row per token, never a head
        return 1.0 / max(it.n, 1)
    if it.role == "vision":
        return 0.0
    return 1.0


def _lookup_line(it: Item, d: Decision, tied: bool) -> dict:
    """An embedding table's line in the budget (``plan`` prints it): a row lookup on the host, never an NPU item;
    decode reads one row a token, and the whole table as well where it is the tied output head."""
    row = -(-d.bytes // max(it.n, 1))
    head = tied and it.role == "embedding"
    return {"tensor": it.tensor, "role": it.role, "rows": it.n, "row": it.k, "encoding": d.encoding,
            "bytes": d.bytes, "tied_head": head, "decode_bytes_per_token": row + (d.bytes if head else 0)}


def _allowed(r: _Row, it: Item, board: Board) -> tuple[str, ...]:
    """The item's choices its pins leave; a runtime path that decodes on the NPU never reads a host copy."""
    al = _pinned_choices(r)
    return tuple(c for c in al if c != "npu+nf4") if board.decode_engine == "npu" else al


def _pinned_choices(r: _Row) -> tuple[str, ...]:
    if r.forced_enc == "float":
        return ("float",)
    if r.forced_tier == "npu":
        return ("npu",) if r.forced_enc == "int8" else ("npu", "npu+nf4")
    npu = r.eligible and r.forced_tier != "host"
    if r.forced_enc == "int8":
        return ("int8", "npu") if npu else ("int8",)
    if r.forced_enc == "nf4":
        return ("nf4", "npu", "npu+nf4") if npu else ("nf4",)
    return ("nf4", "int8", "npu", "npu+nf4") if npu else ("nf4", "int8")


def _attention_s(manifest: Manifest, rows: int, pos: float, board: Board) -> float:
    """Attention score and value products of ``rows`` tokens at average position ``pos``, on the CPU;
    a sliding-window layer attends to at most its window; a hybrid's recurrent layers attend to nothing but
    run their own recurrence instead (``recurrent_flops`` a token and layer: the convolution, the scan or the
    delta rule), on the CPU in float."""
    f = manifest.facts
    width = f.get("heads", 0) * f.get("head_dim", 0)
    swa, win = set(f.get("swa_layers") or ()), f.get("swa_window") or 0
    rec, kv = set(f.get("recurrent_layers") or ()), set(archs.kv_layers(f))
    span = sum(min(pos, win) if (layer in swa and win) else pos for layer in range(f.get("n_layers", 0))
               if layer in kv)
    recurrence = rows * len(rec) * float(f.get("recurrent_flops") or 0)
    return (4.0 * rows * span * width + recurrence) / board.cpu_float_ops_per_s


def _float_enc(it: Item) -> str:
    return _FLOAT_ENC.get(it.dtype, "f32")  # quantized GGUF types are kept as f32


def _rho(it: Item, m: float, t4: float, tn: float, board: Board) -> tuple[float, float]:
    """How the profile scales the cost model at the item's rows m: (its host NF4 time / the model's,
    its NPU time / the model's); 1 where the model gives 0."""
    model4, modeln = cost.t_cpu(it.n, it.k, m, board, "nf4"), cost.t_npu(it.n, it.k, m, board)
    return (t4 / model4 if model4 > 0 else 1.0), (tn / modeln if modeln > 0 else 1.0)


def _pre(it: Item, c: str, m: float, rho: tuple[float, float], head: bool, board: Board,
         copy_fmt: str | None = None) -> float:
    """Seconds one item adds to a prefill chunk in which it sees ``m`` rows, under choice ``c``.

    Host paths: the profile-scaled host time of the encoding (a float item at its source bytes). NPU
    choices run on the NPU when m >= min_m of the host path they keep (NF4 copy, in ``copy_fmt``, default
    the board's; or int8 from the tiles), else on the CPU by that path. A tied embedding (``head``) also pays
    the output head: one row times the whole matrix, on the CPU, in the encoding it is stored in.
    """
    n, k = it.n, it.k
    if c in ("nf4", "int8", "tiles", "float"):  # a host path ("tiles": an NPU-only item below its min_m)
        enc = _float_enc(it) if c == "float" else c
        t = rho[0] * cost.t_cpu(n, k, m, board, enc)
        return t + cost.t_cpu(n, k, 1, board, enc) if head else t
    host = "nf4" if c == "npu+nf4" else "tiles"
    if c == "npu+nf4" and copy_fmt:
        board = cost.nf4_board(board, copy_fmt)
    if m >= cost.min_m(n, k, board, host):
        return rho[1] * cost.t_npu(n, k, m, board)
    return rho[0] * cost.t_cpu(n, k, m, board, host)


def _item_cost(it: Item, r: _Row, c: str, mi: float, rho: tuple[float, float], sens: float, share: float,
               head: bool, board: Board) -> tuple[float, float, float, float, float]:
    """(RAM bytes, NPU bytes, decode s/token, prefill s/chunk, quality) of one item under choice ``c``.

    Quality: the item's sensitivity where the CPU decodes int8 (host int8, or an NPU-only item's
    int8 tiles when not stored 4-bit); 0 otherwise (NF4, float). NPU + host NF4 copy: the copy's
    bytes and format (``r.copy``, ``r.copy_fmt``: b64 when the NPU slice is stored 4-bit).
    """
    pre = _pre(it, c, mi, rho, head, board, r.copy_fmt)
    if c == "float":
        return (float(r.fl), 0.0, share * r.fl / board.decode_bandwidth, pre, 0.0)
    ram = {"nf4": r.n4, "int8": r.i8, "npu": r.npu, "npu+nf4": r.npu + r.copy}[c]
    npu = r.npu if c.startswith("npu") else 0
    dec = share * cost.decode_s(it.n, it.k, c, cost.nf4_board(board, r.copy_fmt) if c == "npu+nf4" else board)
    return (float(ram), float(npu), dec, pre, sens - _kld(c, r, sens, board))


def _kld(c: str, r: _Row, sens: float, board: Board) -> float:
    """The predicted KLD an item adds under choice ``c`` (TIERMAP.md section 4): its sensitivity times the error
    ratio of the format the CPU decodes it from (cost.FORMAT_ERROR): host "nf4" the low level's (board.host_low),
    host "int8" the high level's (board.host_high), a host copy its format's (cost.copy_error: the low level's,
    or NF4's 1 for an NPU slice stored 4-bit), an NPU slice stored 4-bit 1, int8 tiles 0.
    With the default formats: the sensitivity where the CPU decodes NF4, else 0."""
    if c == "nf4":
        return sens * cost.format_error(board.host_low)
    if c == "int8":
        return sens * cost.format_error(board.host_high)
    if c == "npu+nf4":
        return sens * cost.copy_error(r.copy_fmt)
    return sens if _nf4_decoded(c, r) else 0.0


def _read_bytes(it: Item, r: _Row, c: str, board: Board) -> float:
    """Weight bytes the CPU reads when a decode token reads all of the item under choice ``c`` (a float item its
    source bytes; an NPU item with a host copy the copy, in its format; an NPU-only item its tiles)."""
    if c == "float":
        return float(r.fl)
    return cost.decode_bytes(it.n, it.k, c, cost.nf4_board(board, r.copy_fmt) if c == "npu+nf4" else board)


def _nf4_decoded(c: str, r: _Row) -> bool:
    """The CPU decodes this choice from NF4 (host NF4, an NPU item's NF4 copy, or the int8 image of an
    NPU item stored 4-bit): the item then adds its sensitivity to the predicted KLD (TIERMAP.md section 4)."""
    return c in ("nf4", "npu+nf4") or (c == "npu" and r.npu_nf4)


def _float_matmuls_s(manifest: Manifest, rows: float, board: Board) -> float:
    """Prefill seconds of the matmuls that always stay float and so are no items (MoE routers,
    orkpack/keepfloat.py), at ``rows`` rows on the CPU at the float rate and their source bytes, as a
    float-kept item."""
    return sum(cost.t_cpu(t.shape[0], t.shape[1], rows, board, _FLOAT_ENC.get(t.dtype, "f32")) for t in manifest.floats
               if len(t.shape) == 2 and t.dtype not in NON_FLOAT_DTYPES and why_float(t.name, t.shape) == ROUTER)


def _model(manifest: Manifest, board: Board, profile: Profile, rows: list[_Row], prompt: int, kv_type: str,
           allowed: list[tuple[str, ...]] | None = None) -> _Model:
    """The linear costs of every item's allowed choices (``allowed`` overrides the pins' choices)."""
    m = profile.prefill_m
    out = _Model([], [], [], [], [], [], [], 0.0, 0.0)
    # identical items (every expert of a uniform MoE) are computed once: one class each; the key holds
    # everything the costs depend on (the row object: pins and sizes; the item's shape, type, role and
    # profile values), so the per-item work is one lookup
    memo: dict[tuple, int] = {}
    classes: list[tuple] = []
    tied = not any(it.role == "output" for it in reversed(manifest.items))  # output.weight sorts last but one
    p = None  # the previous item's (item, row, m_eff, t_cpu, t_npu, sensitivity): an alike next one has its key
    for i, (it, r, mi, tc, tn, sens) in enumerate(zip(manifest.items, rows, profile.m_eff, profile.t_cpu,
                                                         profile.t_npu, profile.sensitivity)):
        if allowed is None and p is not None and r is p[1] and mi == p[2] and tc == p[3] and tn == p[4] \
                and sens == p[5] and it.n == p[0].n and it.k == p[0].k and it.dtype == p[0].dtype \
                and it.role == p[0].role:
            out.klass.append(got)
            continue
        p = (it, r, mi, tc, tn, sens)
        key = (id(r), it.n, it.k, it.dtype, it.role, mi, tc, tn, sens, None if allowed is None else allowed[i])
        got = memo.get(key)
        if got is None:
            share = _share(it, mi, m, tied)
            head = tied and it.role == "embedding"  # the tied head: the last row of each chunk times the embedding
            al = _allowed(r, it, board) if allowed is None else allowed[i]
            rho = _rho(it, mi, tc, tn, board)
            costs = [_item_cost(it, r, c, mi, rho, sens, share, head, board) for c in al]
            got = memo[key] = len(classes)
            kl = tuple(_kld(c, r, sens, board) for c in al)
            rd = tuple(share * _read_bytes(it, r, c, board) for c in al)
            classes.append((al,) + tuple(tuple(x[j] for x in costs) for j in range(5)) + (share, kl, rd))
        out.klass.append(got)
    for j, lst in enumerate((out.allowed, out.ram, out.npu, out.dec, out.pre, out.qual, out.share, out.kld,
                             out.read)):
        lst.extend(map([c[j] for c in classes].__getitem__, out.klass))
    out.class_allowed = [c[0] for c in classes]
    # the KV cache read, and a hybrid's recurrent state read (in kv_bytes) and written back, every token
    dec_bytes = sum(t.float_bytes for t in manifest.floats) + manifest.kv_bytes(max(prompt, 1), kv_type) \
        + state_bytes(manifest.facts)
    out.dec_const = board.decode_token_s + dec_bytes / board.decode_bandwidth
    out.pre_const = board.decode_token_s + _attention_s(manifest, m, m / 2.0, board) + _float_matmuls_s(manifest, m, board)
    return out


def evaluate(manifest: Manifest, board: Board, profile: Profile, choices: list[str], *, prompt: int = 512,
             kv_type: str = "f16", npu_nf4: list[bool] | None = None) -> dict:
    """Predicted prefill tok/s, decode tok/s and TTFT of an assignment (one of CHOICES or "float" per item).

    No budget is checked: this is how a given configuration would run (e.g. llama.cpp with
    every weight Q8_0: choices all "int8"). Used for the baselines and docs/CALIBRATION.md.
    ``npu_nf4`` (per item; default none): which NPU choices are stored 4-bit (a tier map's NPU slices of
    encoding nf4): their host copy is nf4 (b64), and the CPU decodes an NPU-only one from NF4.
    """
    rows = _rows(manifest, board, {}, npu_nf4=npu_nf4)
    md = _model(manifest, board, profile, rows, prompt, kv_type, allowed=[(c,) for c in choices])
    return _phase(md, [0] * len(choices), profile.prefill_m,
                  ttft_s(manifest, board, profile, choices, prompt, md.klass, rows), prompt)


def _totals(md: _Model, pick: list[int]) -> tuple[float, float, float, float, float]:
    """(ram, npu, decode s/token, prefill s/chunk, quality) of an assignment (choice index per item)."""
    ram = sum(md.ram[i][c] for i, c in enumerate(pick))
    npu = sum(md.npu[i][c] for i, c in enumerate(pick))
    dec = md.dec_const + sum(md.dec[i][c] for i, c in enumerate(pick))
    pre = md.pre_const + sum(md.pre[i][c] for i, c in enumerate(pick))
    q = sum(md.qual[i][c] for i, c in enumerate(pick))
    return ram, npu, dec, pre, q


def _baseline(md: _Model, enc: str) -> list[int]:
    """Per item, the index of choice ``enc`` among its allowed ones (0 where it has none): worked out per class."""
    per = [a.index(enc) if enc in a else 0 for a in md.class_allowed]
    return list(map(per.__getitem__, md.klass))


def _baseline_choices(md: _Model, enc: str) -> list[str]:
    """Per item, its choice at :func:`_baseline`'s index (``enc``, or its first allowed choice)."""
    per = [a[a.index(enc) if enc in a else 0] for a in md.class_allowed]
    return list(map(per.__getitem__, md.klass))


def ttft_s(manifest: Manifest, board: Board, profile: Profile, choices: list[str], prompt: int,
           klass: list[int] | None = None, rows: list[_Row] | None = None) -> float:
    """Seconds to process a ``prompt``-token prompt in chunks of prefill_m (the first token's wait):
    each chunk as a prefill chunk, at its own rows (an item sees m_eff x rows / prefill_m) and positions.
    ``klass`` (the solver's classes of alike items, optional) lets alike items be computed once; ``rows``
    (the items' _rows, optional: by default no NPU slice is stored 4-bit) give each host copy's NF4 format."""
    m = profile.prefill_m
    items = manifest.items
    tied = not any(it.role == "output" for it in reversed(items))  # output.weight sorts last but one
    if klass is None:
        fmts = [None] * len(items) if rows is None else [r.copy_fmt for r in rows]
        keys = zip(((it.n, it.k, it.dtype, it.role) for it in items), profile.m_eff, profile.t_cpu,
                   profile.t_npu, choices, fmts)
    else:  # a class holds items of one row: one copy format
        keys = zip(klass, choices)
    # each distinct key is computed once (at its first item); code[i]: item i's key, numbered in order
    first: dict[tuple, int] = {}
    code = np.fromiter((first.setdefault(key, len(first)) for key in keys), dtype=np.intp)
    at = np.full(len(first), len(code), dtype=np.intp)
    np.minimum.at(at, code, np.arange(len(code), dtype=np.intp))
    if klass is not None:  # the copy format of each key's first item
        fmts = {i: None if rows is None else rows[i].copy_fmt for i in at.tolist()}
    rhos: list[tuple[float, float]] = []
    for i in at.tolist():
        rhos.append(_rho(items[i], profile.m_eff[i], profile.t_cpu[i], profile.t_npu[i], board))
    total, done = board.request_s, 0  # the runtime's fixed cost per request, once
    while done < prompt:
        rows = min(m, prompt - done)
        f = rows / m
        t = board.decode_token_s + _attention_s(manifest, rows, done + rows / 2.0, board) + _float_matmuls_s(manifest, rows, board)
        per = np.array([_pre(items[i], choices[i], profile.m_eff[i] * f, rho, tied and items[i].role == "embedding",
                             board, fmts[i]) for i, rho in zip(at.tolist(), rhos)], dtype=np.float64)
        # item by item, in order: the same sum as ever (t += each item's seconds; accumulate adds left to right)
        t = float(np.add.accumulate(np.concatenate(([t], per[code])))[-1])
        total += t
        done += rows
    return total


def _decision_fields(it: Item, r: _Row, c: str, profile: Profile, i: int, board: Board) -> tuple:
    """(shape, encoding, tier, min_m, bytes, benefit_us, pin, host_copy, host_copy_bytes) of item ``i`` under choice ``c``."""
    shape = (it.n, it.k)
    if c.startswith("npu"):
        enc = "nf4" if r.npu_nf4 else "int8"
        host = "nf4" if c == "npu+nf4" else "tiles"
        hb = cost.nf4_board(board, r.copy_fmt) if c == "npu+nf4" else board  # the copy's format
        mi = profile.m_eff[i]
        mm = cost.min_m(it.n, it.k, hb, host)  # the router's threshold: against the host path it keeps
        # benefit_us: what the NPU saves per chunk against that host path (0 below min_m)
        rho = _rho(it, mi, profile.t_cpu[i], profile.t_npu[i], board)
        saved = _pre(it, host, mi, rho, False, hb) - _pre(it, c, mi, rho, False, board, r.copy_fmt)
        dual = c == "npu+nf4"
        return (shape, enc, "npu", mm, r.npu, saved * 1e6, r.pin, "nf4" if dual else None, r.copy if dual else 0)
    if c == "float":
        enc, nb = _FLOAT_ENC.get(it.dtype, "f32"), r.fl
    elif c == "int8":
        enc, nb = "int8", r.i8
    else:
        enc, nb = "nf4", r.n4
    return (shape, enc, "host", profile.min_m[i], nb, 0.0, r.pin, None, 0)


def _in_name_order(decisions: list[Decision]) -> list[Decision]:
    """``decisions`` sorted by (tensor in natural name order, expert; a tensor's own slice first).

    They come as the items do (each tensor's slices together, experts ascending), then the float tensors: the
    runs of one tensor are sorted, not the slices (a stable sort by the same key gives the same list); a list
    that is not so made is sorted slice by slice."""
    tensors = [d.tensor for d in decisions]
    order = {n: j for j, n in enumerate(sorted(set(tensors), key=_names.natural_key))}
    # (order, start, end) of each run of one tensor: a run starts where the name differs from the one before
    starts = [0, *compress(range(1, len(tensors)), map(ne, islice(tensors, 1, None), tensors))] if tensors else []
    runs = [(order[tensors[a]], a, b) for a, b in zip(starts, [*starts[1:], len(tensors)])]
    experts = [d.expert for d in decisions]
    whole = len(runs) == len(order) and all(
        (experts[a] is None and b - a == 1) or experts[a:b] == list(range(b - a)) for _, a, b in runs)
    if not whole:
        return sorted(decisions, key=lambda d: (order[d.tensor], -1 if d.expert is None else d.expert))
    runs.sort()
    return list(chain.from_iterable(decisions[a:b] for _, a, b in runs))


def _nf4_best_decode(manifest: Manifest, board: Board, profile: Profile, pinmap: dict, npu_storage: str, prompt: int,
                     kv_type: str, caps: dict[str, float], time_limit: float, dec_const: float) -> list | None:
    """The decode stage of the balanced goal when the host low level is not NF4 (--host-low int5dq, int6dq): the
    best decode the board allows is the one with host NF4 (the build's NF4 format, its smallest host format), so
    that "within 5 % of the best" means of the all-NF4 speed whatever the levels (docs/TIERMAP.md 5). That stage
    solved exactly on the NF4 model under the same RAM and NPU caps, its value taken to this model's constant
    (None if that model has no solution: the levels' own best stands, as it does when it is faster).""" 
    ref = replace(board, host_low="nf4")
    md = _model(manifest, ref, profile, _rows(manifest, ref, pinmap, npu_storage), prompt, kv_type)
    metrics = {"ram": list(md.ram), "npu": list(md.npu), "dec": list(md.dec)}
    prob = milp.Problem(tuple(metrics), list(md.allowed), metrics, [it.name for it in manifest.items], klass=md.klass)
    prob.prune({"ram": "min", "npu": "min", "dec": "min"})
    prob.group()
    try:
        _, st = milp.lexicographic(prob, [("dec", "min")], {k: caps[k] for k in ("ram", "npu")},
                                   time_limit=time_limit, assign=False)
    except OrkError:
        return None
    st[0].value += md.dec_const - dec_const
    st[0].bound += md.dec_const - dec_const
    return st


def solve(manifest: Manifest, board: Board, profile: Profile, *, ctx: int = 8192, kv_type: str = "f16",
          pins: dict[str, list[str]] | None = None, goal: Goal | None = None, prompt: int = 512,
          time_limit: float = milp.TIME_LIMIT, npu_storage: str = "int8") -> TierMap:
    """The optimal tier map for ``manifest`` on ``board`` under ``goal`` (see the module docstring), for a build
    that stores NPU slices as ``npu_storage`` says (build --npu-storage: int8, or nf4 as an --nf4 pin does)."""
    goal = goal or Goal()
    if not isinstance(prompt, int) or prompt < 1:
        raise OrkError(f"--prompt must be a positive number of tokens (got {prompt!r})")
    pinmap, pin_warn = match_pins(manifest, pins)
    items = manifest.items
    rows = _rows(manifest, board, pinmap, npu_storage)
    names = [it.name for it in items]
    kv = manifest.kv_bytes(ctx, kv_type)
    float_1d = sum(t.float_bytes for t in manifest.floats)
    md = _model(manifest, board, profile, rows, min(prompt, ctx), kv_type)

    pinned_npu = [i for i, r in enumerate(rows) if r.forced_tier == "npu"]
    npu_pinned_bytes = sum(rows[i].npu for i in pinned_npu)
    base_items = int(sum(map(min, md.ram)))
    fixed_no_kv = board.reserve_bytes + float_1d + base_items
    need = fixed_no_kv + kv
    cap_total = board.total_bytes if goal.max_ram is None else min(board.total_bytes, goal.max_ram)
    if need > cap_total:
        raise _no_fit(manifest, board, rows, need, cap_total, kv, ctx, kv_type, fixed_no_kv, goal.max_ram)
    if npu_pinned_bytes > board.iova_usable_bytes:
        raise OrkError(f"--npu pins need {npu_pinned_bytes} bytes ({_fmt(npu_pinned_bytes)}) of NPU memory; "
                       f"{board.name} allows {board.iova_usable_bytes} ({_fmt(board.iova_usable_bytes)}); pin fewer tensors")
    ram_items_cap = cap_total - board.reserve_bytes - float_1d - kv

    metrics = {"ram": list(md.ram), "npu": list(md.npu), "dec": list(md.dec), "pre": list(md.pre), "q": list(md.qual)}
    better = {"ram": "min", "npu": "min", "dec": "min", "pre": "min", "q": "max"}
    if goal.max_kld is not None:  # a hard cap on the predicted KLD: one more metric (only then)
        metrics["kld"], better["kld"] = list(md.kld), "min"
    params = weight_params(manifest)  # (what --bpw is per, and what the budget shows)
    byte_cap = goal.byte_cap(params)
    if byte_cap is not None:  # a size budget: the pack's weight bytes (= RAM per item), or a token's read
        metrics["bytes"], better["bytes"] = (list(md.ram) if goal.bytes_of == "file" else list(md.read)), "min"
    prob = milp.Problem(tuple(metrics), list(md.allowed), metrics, names, klass=md.klass)
    prob.prune(better)
    prob.group()
    caps = {"ram": float(ram_items_cap), "npu": float(board.iova_usable_bytes)}
    if goal.max_kld is not None:
        caps["kld"] = float(goal.max_kld)
    if byte_cap is not None:
        caps["bytes"] = float(byte_cap - _bytes_const(manifest, goal.bytes_of))
        if caps["bytes"] < sum(map(min, metrics["bytes"])):
            raise _too_small(manifest, goal, byte_cap, metrics["bytes"])
    m = profile.prefill_m
    if goal.min_decode_tok_s:
        caps["dec"] = 1.0 / goal.min_decode_tok_s - md.dec_const
    if goal.min_prefill_tok_s:
        caps["pre"] = m / goal.min_prefill_tok_s - md.pre_const
    for k in ("dec", "pre"):
        if k in caps and caps[k] < 0:
            raise _unreachable(goal, md, k)
    stages_json = []
    try:
        if goal.name in ("balanced",) or goal.decode_floor is not None:
            # the best decode first, then allow the slack (or the frontier's floor) and optimize the rest
            _, st0 = milp.lexicographic(prob, [("dec", "min")], caps, time_limit=time_limit, assign=False)
            prob.cost.pop("-q", None)
            own = st0[0].value
            if board.host_low != "nf4":  # the best the board allows is with host NF4, its fastest format
                ref = _nf4_best_decode(manifest, board, profile, pinmap, npu_storage, min(prompt, ctx), kv_type,
                                       caps, time_limit, md.dec_const)
                st0 = ref if ref is not None and ref[0].value < own else st0
            d_best = md.dec_const + st0[0].value
            frac = (1.0 - DECODE_SLACK) if goal.decode_floor is None else goal.decode_floor
            caps2 = dict(caps)
            if frac > 0:
                # (levels slower than that: as fast as they allow)
                caps2["dec"] = min(caps.get("dec", np.inf), max(d_best / frac - md.dec_const, own + milp.STAGE_TOL * abs(own)))
            if goal.decode_floor is None:  # balanced: prefill within PREFILL_SLACK of its best, for quality
                _, st1 = milp.lexicographic(prob, [("pre", "min")], caps2, time_limit=time_limit, assign=False)
                caps2["pre"] = min(caps2.get("pre", np.inf), (md.pre_const + st1[0].value) / (1.0 - PREFILL_SLACK) - md.pre_const)
                pick, st = milp.lexicographic(prob, [("q", "max")], caps2, time_limit=time_limit)
                st = st0 + st1 + st
            else:
                pick, st = milp.lexicographic(prob, [("pre", "min"), ("q", "max")], caps2, time_limit=time_limit)
                st = st0 + st
        else:
            order = {"decode": [("dec", "min"), ("pre", "min"), ("q", "max")],
                     "prefill": [("pre", "min"), ("dec", "min"), ("q", "max")],
                     "quality": [("q", "max"), ("dec", "min"), ("pre", "min")]}[goal.name]
            pick, st = milp.lexicographic(prob, order, caps, time_limit=time_limit)
    except OrkError as e:
        if str(e) == "infeasible":
            raise _unreachable(goal, md, None) from None
        raise
    for s_ in st:
        unit = {"dec": "s/token", "pre": "s/chunk", "q": "sensitivity"}[s_.metric]
        const = {"dec": md.dec_const, "pre": md.pre_const, "q": 0.0}[s_.metric]
        stages_json.append({"metric": {"dec": "decode", "pre": "prefill", "q": "quality"}[s_.metric],
                            "sense": s_.sense, "value": round(s_.value + const, 9), "bound": round(s_.bound + const, 9),
                            "status": s_.status, "unit": unit, "nodes": s_.nodes})
    choice = [pick[i] for i in range(len(items))]
    idx = [a.index(c) for a, c in zip(md.allowed, choice)]  # md keeps every allowed choice

    # ---- decisions
    decisions, npu_used, host_w = [], 0, {"int8": 0, "nf4": 0, "float": 0, "host_copy_nf4": 0}
    n_npu = 0
    # alike items (one class of the cost model, the same choice and profile min_m) get the same decision
    # but for their name: its fields are worked out once, the budget counted per class
    seen: dict[tuple, list] = {}
    new, put = object.__new__, object.__setattr__
    for i, (it, key) in enumerate(zip(items, zip(md.klass, choice, profile.min_m))):
        got = seen.get(key)
        if got is None:
            fields = _decision_fields(it, rows[i], choice[i], profile, i, board)
            first = Decision(it.tensor, it.expert, *fields)
            rest = dict(first.__dict__)
            del rest["tensor"], rest["expert"]
            got = seen[key] = [fields, 0, rest]
            decisions.append(first)
        else:  # what Decision(it.tensor, it.expert, *fields) makes, without one frozen __setattr__ per field
            d = new(Decision)
            put(d, "__dict__", {"tensor": it.tensor, "expert": it.expert, **got[2]})
            decisions.append(d)
        got[1] += 1
    # each embedding table's decision (the first of its tensor in name order: decisions follow the items' order)
    table_decision: dict[str, Decision] = {}
    for i in [i for i, it in enumerate(items) if it.role in ("embedding", "lookup")]:
        table_decision.setdefault(items[i].tensor, decisions[i])
    for fields, count, _ in seen.values():
        _, _, tier, _, nb, _, _, host_copy, copy_bytes = fields
        if tier == "npu":
            npu_used += nb * count
            n_npu += count
            host_w["host_copy_nf4"] += copy_bytes * count
        else:
            host_w["float" if fields[1] not in ("int8", "nf4") else fields[1]] += nb * count
    for t in manifest.floats:
        enc = "raw" if t.dtype in NON_FLOAT_DTYPES else _FLOAT_ENC.get(t.dtype, "f32")
        decisions.append(Decision(t.name, None, t.shape, enc, "host", cost.MIN_M_NEVER,
                                  t.float_bytes, 0.0, None))
        host_w["float"] += t.float_bytes
    decisions = _in_name_order(decisions)

    ram_used = board.reserve_bytes + kv + npu_used + sum(host_w.values())
    if npu_used > board.iova_usable_bytes or ram_used > cap_total:  # the MILP's constraints guarantee both
        raise OrkError(f"internal: plan exceeds a budget (NPU {npu_used}, RAM {ram_used}); please report")
    objective = {
        "goal": goal.to_json(),
        "order": [f"{x['metric']} ({'min' if x['sense'] == 'min' else 'max'})" for x in stages_json],
        "decode_slack": DECODE_SLACK if goal.name == "balanced" and goal.decode_floor is None else None,
        "prefill_slack": PREFILL_SLACK if goal.name == "balanced" and goal.decode_floor is None else None,
        "stages": stages_json,
        "status": "optimal" if all(x["status"] == "optimal" for x in stages_json) else "gap",
        "method": "lexicographic MILP over groups of identical items (HiGHS via scipy.optimize.milp)",
        "items": len(items), "groups": len(prob.groups), "variables": len(prob.cols),
        "ties": "members of a group of identical items take choices in name order",
    }
    budget = {
        "npu": {"used": npu_used, "cap": board.iova_usable_bytes, "headroom": board.iova_usable_bytes - npu_used,
                "items": n_npu},
        "ram": {"used": ram_used, "cap": cap_total, "headroom": cap_total - ram_used,
                "npu_weights": npu_used, "host_int8": host_w["int8"], "host_nf4": host_w["nf4"],
                "host_copy_nf4": host_w["host_copy_nf4"], "host_float": host_w["float"], "kv_cache": kv,
                "reserve": board.reserve_bytes},
    }
    tied = not any(it.role == "output" for it in reversed(items))  # output.weight sorts last but one
    budget["lookups"] = [_lookup_line(it, table_decision[it.tensor], tied)
                         for it in items if it.role in ("embedding", "lookup")]  # every embedding table: a line
    wb = weight_bytes(manifest, md, idx)
    budget["weights"] = {**wb, "params": params, "bpw": round(8 * wb["file"] / max(params, 1), 4),
                         "cap": byte_cap, "of": goal.bytes_of if byte_cap is not None else None}
    if manifest.facts.get("kv_shared_layers"):  # gemma4: layers reusing earlier K/V store none
        budget["ram"]["kv_unshared"] = cache_bytes(manifest.facts, ctx, kv_type)["kv_unshared"]
    if manifest.facts.get("recurrent_layers"):  # a hybrid: its state (part of kv_cache) and what it saves
        budget["ram"]["recurrent_state"] = state_bytes(manifest.facts)
        budget["ram"]["kv_all_attention"] = manifest.kv_bytes_all_attention(ctx, kv_type)
    prediction = _prediction(manifest, board, profile, md, idx, choice, prompt, rows)
    options = {"ctx": ctx, "kv_type": kv_type, "prefill_m": m, "prompt": prompt, "profile": profile.source,
               "pins": {k: list((pins or {}).get(k) or []) for k in PIN_KINDS},
               "default_keep": list(recorded_globs([t.name for t in manifest.tensors],
                                                   [t.shape for t in manifest.tensors]))}
    model = {"source": manifest.source, "origin": manifest.origin, **manifest.recorded_facts(),
             "tensors": len(manifest.tensors), "items": len(items), "assumptions": list(manifest.warnings)} \
        | ({"hub": manifest.hub} if manifest.hub else {})
    tm = TierMap(decisions, model=model, board=board.to_json(), options=options, objective=objective,
                 budget=budget, prediction=prediction)
    tm.warnings = list(manifest.source_warnings) + list(manifest.warnings) + pin_warn + list(profile.warnings)
    return tm


# The host levels a plan chooses between when neither --host-low nor --host-high is given (docs/TIERMAP.md 4, "The
# default levels"); the first pair is what a map without levels means. The balanced goal's: the others are planned
# only where they can decode within its floor, kept where they predict less KLD at that decode and prefill. A size
# bound's (--max-bytes / --bpw, the goal quality): every pair of host levels, the least predicted KLD kept.
AUTO_LEVELS = (("nf4", "int8"), ("int5dq", "int6dq"))
SIZE_LEVELS = AUTO_LEVELS[:1] + tuple((lo, hi) for lo in HOST_LOW for hi in HOST_HIGH
                                      if lo != hi and (lo, hi) != AUTO_LEVELS[0])


def fastest_decode(manifest: Manifest, board: Board, profile: Profile, pins: dict[str, list[str]] | None = None, *,
                   prompt: int = 512, kv_type: str = "f16", npu_storage: str = "int8") -> float:
    """The least decode seconds per token any plan in ``board``'s host levels can have: every item at its fastest
    allowed choice, no RAM or NPU cap (a bound: a plan under the caps is no faster)."""
    rows = _rows(manifest, board, match_pins(manifest, pins)[0], npu_storage)
    md = _model(manifest, board, profile, rows, prompt, kv_type)
    return md.dec_const + sum(map(min, md.dec))


def solve_default_levels(manifest: Manifest, board: Board, profile: Profile, *, ctx: int = 8192,
                         kv_type: str = "f16", pins: dict[str, list[str]] | None = None, goal: Goal | None = None,
                         prompt: int = 512, time_limit: float = milp.TIME_LIMIT, npu_storage: str = "int8",
                         profile_of: Callable[[Board], Profile] | None = None) -> TierMap:
    """``solve`` in the host levels a plan given none chooses: of the goal's candidate pairs, the least predicted KLD.

    The first pair (nf4 / int8: ``board``'s levels must be those) is planned as ever. The balanced goal then plans
    each other pair of ``AUTO_LEVELS`` whose fastest decode (``fastest_decode``) reaches the first plan's floor,
    (1 - DECODE_SLACK) of the best decode, and keeps it if its plan decodes at that floor or faster, prefills within
    PREFILL_SLACK of the first plan's best prefill, and predicts less KLD than every pair before it (ties: the earlier
    pair). A size bound with the goal quality plans every pair of ``SIZE_LEVELS`` under the bound and keeps the least
    predicted KLD (ties: the earlier). Any other goal, and a frontier's floor, keep the first. The map records every
    candidate's outcome (``options.host_levels``). ``profile`` is ``board``'s; ``profile_of(b)`` gives a pair's own
    (its NPU benefits and min_m are against that pair's host path), as an explicit --host-low / --host-high plan
    loads it; the bound reads only ``profile``'s decode shares (its routing), which are every pair's."""
    kw = dict(ctx=ctx, kv_type=kv_type, pins=pins, goal=goal, prompt=prompt, time_limit=time_limit,
              npu_storage=npu_storage)
    if (board.host_low, board.host_high) != AUTO_LEVELS[0]:
        raise ValueError("solve_default_levels plans from the first default pair")
    first = best = solve(manifest, board, profile, **kw)
    g = goal or Goal()
    sized = g.name == "quality" and (g.max_bytes is not None or g.bpw is not None)
    if g.decode_floor is not None or not (g.name == "balanced" or sized):
        return first
    dec_cap = pre_cap = np.inf
    if not sized:
        st = {x["metric"]: x["value"] for x in reversed(first.objective["stages"])}  # each metric's first stage
        dec_cap = st["decode"] / (1.0 - DECODE_SLACK) * (1.0 + milp.STAGE_TOL)
        pre_cap = st["prefill"] / (1.0 - PREFILL_SLACK) * (1.0 + milp.STAGE_TOL)
    tried = [{"levels": list(AUTO_LEVELS[0]), "kld": first.prediction["kld"], "outcome": "planned"}]
    for low, high in (SIZE_LEVELS if sized else AUTO_LEVELS)[1:]:
        b = replace(board, host_low=low, host_high=high)
        row = {"levels": [low, high]}
        tried.append(row)
        if not sized:
            fast = fastest_decode(manifest, b, profile, pins, prompt=min(prompt, ctx), kv_type=kv_type,
                                  npu_storage=npu_storage)
            if fast > dec_cap:
                row["outcome"] = "skipped: decodes at most %.3f tok/s, under the floor %.3f" % (1 / fast, 1 / dec_cap)
                continue
        try:
            tm = solve(manifest, b, profile if profile_of is None else profile_of(b), **kw)
        except OrkError as e:
            row["outcome"] = f"skipped: {e}"
            continue
        p = tm.prediction
        row["kld"] = p["kld"]
        if p["decode_s_per_token"] > dec_cap or p["prefill_s_per_chunk"] > pre_cap:
            row["outcome"] = "planned, slower than the first pair allows"
        elif p["kld"] < best.prediction["kld"]:
            row["outcome"], best = "planned", tm
        else:
            row["outcome"] = "planned, no less KLD"
    chosen = [best.board.get("host_low", AUTO_LEVELS[0][0]), best.board.get("host_high", AUTO_LEVELS[0][1])]
    for row in tried:
        if row["levels"] == chosen:
            row["outcome"] = "chosen"
        elif row["outcome"] == "planned":  # beaten by a later pair
            row["outcome"] = "planned, more KLD"
    best.options["host_levels"] = tried
    return best


def _bytes_const(manifest: Manifest, of: str) -> int:
    """The weight bytes no choice changes: the tensors kept float that are no item (norms, biases, routers), stored
    once and read whole by every decode token."""
    return sum(t.float_bytes for t in manifest.floats)


def weight_bytes(manifest: Manifest, md: _Model, pick: list[int]) -> dict:
    """The weight bytes of an assignment: what the pack holds (``file``) and what a decode token reads (``decode``),
    the float non-items included in both."""
    c = _bytes_const(manifest, "file")
    return {"file": int(c + sum(map(getitem, md.ram, pick))),  # item by item, as ever
            "decode": int(round(c + sum(map(getitem, md.read, pick))))}


def least_weight_bytes(manifest: Manifest, board: Board, profile: Profile, pins: dict[str, list[str]] | None,
                       of: str = "file", npu_storage: str = "int8") -> int:
    """The smallest weight bytes (``of``: file or decode) any plan can have: every item at its smallest allowed
    choice, plus the float non-items."""
    rows = _rows(manifest, board, match_pins(manifest, pins)[0], npu_storage)
    md = _model(manifest, board, profile, rows, 512, "f16")
    return int(_bytes_const(manifest, of) + sum(map(min, md.ram if of == "file" else md.read)))


def weight_params(manifest: Manifest) -> int:
    """The model's weight parameters: every item's and every float tensor's elements (what --bpw is per)."""
    return sum(it.n * it.k for it in manifest.items) + sum(t.numel for t in manifest.floats)


def _too_small(manifest: Manifest, goal: Goal, cap: int, per: list[tuple[float, ...]]) -> OrkError:
    least = int(_bytes_const(manifest, goal.bytes_of) + sum(map(min, per)))
    what = "the pack's weights" if goal.bytes_of == "file" else "the weight bytes a decode token reads"
    asked = f"--bpw {goal.bpw:g}" if goal.bpw is not None else "--max-bytes"
    bpw = 8 * least / max(weight_params(manifest), 1)
    return OrkError(f"{asked} allows {cap} bytes ({_fmt(cap)}) of weights, below the least {what} can be ({least}, "
                    f"{_fmt(least)}, {bpw:.3f} bits per weight: every item at its smallest choice); allow more")


def _unreachable(goal: Goal, md: _Model, which: str | None) -> OrkError:
    asked = []
    if goal.min_decode_tok_s:
        asked.append(f"--min-decode-tok-s {goal.min_decode_tok_s:g}")
    if goal.min_prefill_tok_s:
        asked.append(f"--min-prefill-tok-s {goal.min_prefill_tok_s:g}")
    if goal.max_ram:
        asked.append(f"--max-ram {goal.max_ram}")
    if goal.max_kld is not None:
        asked.append(f"--max-kld {goal.max_kld:g}")
    if goal.sized():
        asked.append(f"--bpw {goal.bpw:g}" if goal.bpw is not None else f"--max-bytes {goal.max_bytes}")
    best_dec = 1.0 / (md.dec_const + sum(min(d) for d in md.dec))
    return OrkError(f"no plan meets {' and '.join(asked) or 'the constraints'} on this board "
                    f"(decode can reach at most {best_dec:.2f} tok/s); relax a constraint "
                    "(orkpack plan --frontier shows what is reachable)")


def _phase(md: _Model, idx: list[int], prefill_m: int, ttft: float, prompt: int) -> dict:
    dec = md.dec_const + sum(map(getitem, md.dec, idx))  # as _totals sums them, item by item
    pre = md.pre_const + sum(map(getitem, md.pre, idx))
    kld = sum(map(getitem, md.kld, idx)) if md.kld else 0.0
    return {"prefill_tok_s": round(prefill_m / pre, 3), "decode_tok_s": round(1.0 / dec, 3),
            "ttft_s": round(ttft, 4), "prefill_s_per_chunk": round(pre, 9), "decode_s_per_token": round(dec, 9),
            "kld": round(kld, 6)}


def _prediction(manifest, board, profile, md: _Model, idx, choice, prompt, rows) -> dict:
    m = profile.prefill_m
    out = _phase(md, idx, m, ttft_s(manifest, board, profile, choice, prompt, md.klass, rows), prompt)
    base = {}
    for enc in ("nf4", "int8"):
        bi = _baseline(md, enc)
        bc = _baseline_choices(md, enc)  # = [md.allowed[i][c] for i, c in enumerate(bi)]
        base[f"cpu_{enc}"] = _phase(md, bi, m, ttft_s(manifest, board, profile, bc, prompt, md.klass, rows), prompt)
    out.update(prefill_m=m, prompt=prompt, baselines=base,
               model="cost model of the board (docs/TIERMAP.md; constants and their sources: the board TOML, "
                     "checked in docs/CALIBRATION.md); decode at the prompt's position, every item's CPU copy")
    return out


# ---------------------------------------------------------------------------------- baselines for the report

def greedy_benefit(manifest: Manifest, board: Board, profile: Profile, order: str) -> float:
    """NPU benefit (s per chunk) of a greedy fill: ``order`` 'model' (layer order, what llama.cpp
    -ngl / accelerate do) or 'hotness' (top-k by benefit alone); items that do not fit are skipped."""
    rows = _rows(manifest, board, {})
    idx = [i for i, r in enumerate(rows) if r.eligible and r.forced_tier is None]
    if order == "hotness":
        idx.sort(key=lambda i: (-profile.benefit[i], manifest.items[i].name))
    cap, got = board.iova_usable_bytes, 0.0
    for i in idx:
        if rows[i].npu <= cap:
            cap -= rows[i].npu
            got += profile.benefit[i]
    return got
