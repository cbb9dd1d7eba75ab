"""Byte sizes and the cost model of both phases (docs/TIERMAP.md "Cost model"; constants: the board TOML).

Byte sizes (docs/FORMAT.md):
  NPU int8   align(Np * sum(kp over K segments)) + align(4 * N)   (Np, kp: N and each
             K segment padded to the board's alignment; align: the allocation granularity)
  host int8  N*K + 4*N
  host nf4   the build's NF4 format (board.nf4_format, --nf4-format), n = N*K:
             b64   ceil(n/2) + 4*ceil(n/64)                        (the nf4 encoding)
             dq32  ceil(n/2) + nb + 4*ceil(nb/256) + 4, nb = ceil(n/32)   (the nf4dq encoding)
  host low / high items in another format (board.host_low / host_high, --host-low / --host-high):
             intdq ceil(n*b/8) + nb + 4*ceil(nb/256) + 4           (int5dq, int6dq, int8dq: b = 5, 6, 8)
  float      the source bytes

Prefill, one item at M rows of activations:
  t_npu(M)      = calls * submit_overhead + sum over K segments of 2*M*Np*kp / npu_ops(kp)
                  npu_ops(kp) = cores * per_core * efficiency * min(1, (k_ref / kp) ** k_falloff)
  t_cpu(M, enc) = max(2*M*N*K / cpu_ops[enc], weight bytes[enc] / decode bandwidth)
  min_m         = the smallest integer M >= 2 with t_npu(M) < t_cpu(M, the host path the item keeps:
                  its NF4 copy, or "tiles" = int8 from an NPU-only item's tiles);
                  MIN_M_NEVER if there is none. M = 1 never goes to the NPU.
Decode, one token (M = 1): the bytes of the copy the CPU reads (decode_bytes: host nf4 / int8 as
  stored, an NPU-only item's int8 tiles x tile_read_factor) over the decode bandwidth (the board's
  CPU stream x the runtime path's fraction), plus a fixed per-token cost. A runtime path that decodes
  on the NPU (rkllm) reads an NPU item's tiles (unaligned bytes) at the NPU's stream x that fraction.
An NPU slice's host copy is in the host low level's format (copy_format: the build's NF4 format, or
  --host-low's int5dq / int6dq), except when the slice is stored 4-bit (an --nf4 pin, build --npu-storage nf4):
  the slice is nf4 (b64) and its own copy. A copy's costs are those of ``nf4_board(board, its format)``: the
  board's cost model with the host low ("nf4") path in that format.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from ..pack import spec
from .board import Board

MIN_M_FLOOR = 2  # M = 1 (decode) never goes to the NPU, whatever is resident
MIN_M_NEVER = 1 << 30  # the NPU never wins for this shape


# the NF4 format of the host copy of an NPU slice stored 4-bit: the slice itself, inflated at load, which the
# build encodes nf4 (b64) whatever its --nf4-format (orkpack/build.py encode_slice; docs/FORMAT.md 8)
COPY_OF_NF4_STORED = spec.NF4_B64


def copy_format(board: Board, stored_nf4: bool) -> str:
    """The format of an NPU slice's host copy (docs/FORMAT.md 8): the slice itself (nf4, b64) when it is stored
    4-bit, else the host low level's format (the build's NF4 format, or an intdq encoding of --host-low)."""
    if stored_nf4:
        return COPY_OF_NF4_STORED
    return board.nf4_format if board.host_low == "nf4" else board.host_low


@lru_cache(maxsize=64)
def nf4_board(board: Board, fmt: str) -> Board:
    """``board``'s cost model with its host low ("nf4") path in format ``fmt``: an NF4 format (board.NF4_FORMATS;
    an NPU slice stored 4-bit: COPY_OF_NF4_STORED) or an intdq encoding (copy_format). The model of a host copy:
    the model's host "nf4" path is the copy."""
    if fmt in spec.NF4_FORMATS:
        if board.nf4_format == fmt and board.host_low == "nf4":
            return board
        return replace(board, nf4_format=fmt, host_low="nf4")
    return board if board.host_low == fmt else replace(board, host_low=fmt)


def copy_bytes(n: int, k: int, fmt: str) -> int:
    """Stored bytes of an N x K host copy in ``fmt`` (copy_format)."""
    return host_nf4_bytes(n, k, fmt) if fmt in spec.NF4_FORMATS else host_format_bytes(n, k, fmt, "")


def copy_error(fmt: str) -> float:
    """FORMAT_ERROR of a host copy in ``fmt`` (copy_format): an NF4 format 1."""
    return 1.0 if fmt in spec.NF4_FORMATS else FORMAT_ERROR[fmt]


def _pad(x: int, a: int) -> int:
    return -(-x // a) * a


def k_segments(k: int, board: Board) -> list[tuple[int, int, int]]:
    """[(k0, k1, kp)]: K cut at the board's segment limit, each width padded to k_align."""
    out = []
    for k0 in range(0, k, board.k_segment):
        k1 = min(k, k0 + board.k_segment)
        out.append((k0, k1, _pad(k1 - k0, board.k_align)))
    return out


def npu_padded(n: int, k: int, board: Board) -> tuple[int, int, int]:
    """(Np, total padded K, calls)."""
    segs = k_segments(k, board)
    return _pad(n, board.n_align), sum(s[2] for s in segs), len(segs)


def npu_bytes(n: int, k: int, board: Board) -> int:
    np_, kp, _ = npu_padded(n, k, board)
    return board.align(np_ * kp) + board.align(4 * n)


def host_int8_bytes(n: int, k: int) -> int:
    return n * k + 4 * n


def host_nf4_bytes(n: int, k: int, fmt: str) -> int:
    """Stored bytes of an N x K slice as host NF4 in format ``fmt`` (board.NF4_FORMATS; docs/FORMAT.md 3):
    b64 = nf4 (4-bit codes, a float32 absmax per 64), dq32 = nf4dq (4-bit codes, a uint8 absmax code per 32,
    a float32 scale per 256 of them, one float32 offset)."""
    nk = n * k
    enc = spec.NF4_FORMATS.get(fmt)
    if enc == spec.ENC_NF4:
        return -(-nk // 2) + 4 * (-(-nk // spec.NF4_BLOCK))
    if enc == spec.ENC_NF4DQ:
        nb = -(-nk // spec.NF4DQ_BLOCK)
        return -(-nk // 2) + nb + 4 * (-(-nb // spec.NF4DQ_GROUP)) + 4
    raise ValueError(f"NF4 format {fmt!r}")


def host_format_bytes(n: int, k: int, fmt: str, nf4_format: str) -> int:
    """Stored bytes of an N x K slice on the host in a host level's format (board.HOST_LOW / HOST_HIGH): "nf4"
    (the build's NF4 format ``nf4_format``), int8, or an intdq encoding (docs/FORMAT.md 3)."""
    if fmt == "nf4":
        return host_nf4_bytes(n, k, nf4_format)
    if fmt == spec.ENC_INT8:
        return host_int8_bytes(n, k)
    nk = n * k
    nb = -(-nk // spec.NF4DQ_BLOCK)
    return -(-nk * spec.INTDQ_BITS[fmt] // 8) + nb + 4 * (-(-nb // spec.NF4DQ_GROUP)) + 4


def low_bytes(n: int, k: int, board: Board) -> int:
    """Stored bytes of a host "nf4" item: its low level's format (board.host_low)."""
    return host_format_bytes(n, k, board.host_low, board.nf4_format)


def high_bytes(n: int, k: int, board: Board) -> int:
    """Stored bytes of a host "int8" item: its high level's format (board.host_high)."""
    return host_format_bytes(n, k, board.host_high, board.nf4_format)


# The quantization error energy of each host format, relative to the default NF4 format's above per-row int8's:
# (MSE(format) - MSE(int8)) / (MSE(nf4dq) - MSE(int8)). nf4dq = 1 and int8 = 0 by definition (the sensitivities
# are "the KLD an item adds as NF4 rather than int8", profile.py); the item's predicted KLD under a format is its
# sensitivity times this. Measured by `python bench/format_error.py $S` (the codecs' default encoders, no
# statistics; 2026-12-03):
#                 Gaussian 512x1024   Student-t(3) 512x1024   SmolLM2-135M (Q4_1 GGUF), its 211 matrices summed
#   int5dq        0.2740              0.4352                  0.3074
#   int6dq        0.0600              0.0538                  0.0653
#   int8dq       -0.0063             -0.0694                 -0.0105   (below per-row int8: blocks of 32)
# The constants are SmolLM2's (real weights); nf4 (b64) counts as nf4dq (1), as it did before there were formats.
FORMAT_ERROR = {"nf4": 1.0, spec.ENC_INT8: 0.0, spec.ENC_INT5DQ: 0.3074, spec.ENC_INT6DQ: 0.0653,
                spec.ENC_INT8DQ: -0.0105}


def format_error(fmt: str) -> float:
    """FORMAT_ERROR of a host level's format ("nf4": the build's NF4 format, whichever)."""
    return FORMAT_ERROR[fmt]


# An item's placements (docs/TIERMAP.md "Choices"): host NF4, host int8, NPU int8 tiles (the CPU
# decodes from the tiles), NPU int8 tiles plus a host NF4 copy that the CPU reads at decode.
CHOICES = ("nf4", "int8", "npu", "npu+nf4")


def npu_ops(kp: int, board: Board) -> float:
    """Sustained int8 ops/s of one call with ``kp`` (padded) columns: falls beyond k_ref."""
    f = 1.0 if kp <= board.npu_k_ref else (board.npu_k_ref / kp) ** board.npu_k_falloff
    return board.npu_ops_per_s * f


def host_bytes(n: int, k: int, encoding: str, nf4_format: str) -> int:
    """Stored bytes of an N x K weight on the host in ``encoding`` (nf4: in ``nf4_format``; a float encoding:
    2 bytes an element, 4 for f32)."""
    if encoding == "int8":
        return host_int8_bytes(n, k)
    if encoding == "nf4":
        return host_nf4_bytes(n, k, nf4_format)
    return 4 * n * k if encoding == "f32" else 2 * n * k


def _cpu_rate(board: Board, path: str) -> float:
    """Prefill GEMM ops/s of a host path: the CPU reads an NPU-only item's tiles with its int8 kernel."""
    return board.cpu_ops("int8" if path == "tiles" else path)


def path_bytes(n: int, k: int, path: str, board: Board) -> float:
    """Bytes the CPU streams to multiply by an N x K weight once by host ``path``: a host encoding's stored
    bytes, or ``"tiles"`` (an NPU-only item's int8 tiles: their unaligned bytes x tile_read_factor)."""
    if path == "tiles":
        return npu_tile_bytes(n, k, board) * board.tile_read_factor
    if path == "nf4":
        return float(low_bytes(n, k, board))
    if path == "int8":
        return float(high_bytes(n, k, board))
    return float(host_bytes(n, k, path, board.nf4_format))


def t_cpu(n: int, k: int, m: float, board: Board, encoding: str = "nf4") -> float:
    """Host GEMM time at M rows by host path ``encoding`` (nf4, int8, tiles = int8 from an NPU-only item's
    tiles, or a float type): compute, or streaming the weights, whichever binds."""
    if m <= 0:
        return 0.0
    return max(2.0 * m * n * k / _cpu_rate(board, encoding), path_bytes(n, k, encoding, board) / board.decode_bandwidth)


def t_npu(n: int, k: int, m: float, board: Board) -> float:
    if m <= 0:
        return 0.0
    np_ = _pad(n, board.n_align)
    segs = k_segments(k, board)
    return len(segs) * board.submit_overhead_s + sum(2.0 * m * np_ * kp / npu_ops(kp, board) for _, _, kp in segs)


@lru_cache(maxsize=4096)
def min_m(n: int, k: int, board: Board, encoding: str = "nf4") -> int:
    """Smallest M >= 2 at which the NPU beats the host path (weights in ``encoding``); never below 2."""
    if "npu" not in board.engines or board.npu_ops_per_s <= 0:
        return MIN_M_NEVER
    if t_npu(n, k, MIN_M_FLOOR, board) < t_cpu(n, k, MIN_M_FLOOR, board, encoding):
        return MIN_M_FLOOR
    # both are affine in M beyond the bandwidth floor: t_npu = c + b*M, t_cpu = a*M
    np_ = _pad(n, board.n_align)
    segs = k_segments(k, board)
    a = 2.0 * n * k / _cpu_rate(board, encoding)
    b = sum(2.0 * np_ * kp / npu_ops(kp, board) for _, _, kp in segs)
    if a <= b:
        return MIN_M_NEVER
    c = len(segs) * board.submit_overhead_s
    m = max(MIN_M_FLOOR, int(math.floor(c / (a - b))) - 2)
    while not t_npu(n, k, m, board) < t_cpu(n, k, m, board, encoding):
        m += 1
        if m >= MIN_M_NEVER:
            return MIN_M_NEVER
    while m > MIN_M_FLOOR and t_npu(n, k, m - 1, board) < t_cpu(n, k, m - 1, board, encoding):
        m -= 1
    return m


def npu_tile_bytes(n: int, k: int, board: Board) -> int:
    """Bytes of an item's int8 tiles and scales (unaligned): what the CPU streams decoding from the NPU copy."""
    np_, kp, _ = npu_padded(n, k, board)
    return np_ * kp + 4 * n


def decode_bytes(n: int, k: int, choice: str, board: Board) -> float:
    """Bytes the CPU reads for one token of this item under ``choice`` (CHOICES); npu+nf4 reads the host copy in
    the host low level's format (pass ``nf4_board(board, copy_format)``: an NPU slice stored 4-bit has a b64 copy)."""
    if choice in ("nf4", "npu+nf4"):
        return float(low_bytes(n, k, board))
    if choice == "int8":
        return float(high_bytes(n, k, board))
    if choice == "npu":
        return path_bytes(n, k, "tiles", board)
    raise ValueError(choice)


def decode_s(n: int, k: int, choice: str, board: Board) -> float:
    """Seconds one decode token spends reading this item under ``choice``: on the CPU (decode_bytes over the
    decode bandwidth), or, for an NPU item of a runtime path that decodes on the NPU, its tiles on the NPU."""
    if board.decode_engine == "npu" and choice in ("npu", "npu+nf4"):
        return npu_tile_bytes(n, k, board) / board.npu_decode_bandwidth
    return decode_bytes(n, k, choice, board) / board.decode_bandwidth
