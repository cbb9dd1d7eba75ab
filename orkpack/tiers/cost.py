"""Byte sizes and the analytic cost model (docs/TIERMAP.md "Cost model").

Byte sizes (docs/FORMAT.md):
  NPU int8   align(Np * sum(kp over K segments)) + align(4 * N)   (Np, kp: N and each
             K segment padded to the board's alignment; align: the allocation granularity)
  host int8  N*K + 4*N
  host nf4   ceil(N*K/2) + 4*ceil(N*K/64)
  float      the source bytes

Times for one item at M rows of activations:
  t_npu(M) = calls * submit_overhead + 2*M*Np*Kp / (cores * per_core * efficiency)
             (one call per K segment)
  t_cpu(M) = max(2*M*N*K / cpu_ops, nf4_bytes / mem_bandwidth)   (compute or bandwidth, whichever binds)
  min_m    = the smallest integer M >= 2 with t_npu(M) < t_cpu(M); MIN_M_NEVER if there is none.
"""
from __future__ import annotations

import math

from .board import Board

MIN_M_FLOOR = 2  # M = 1 (decode) never goes to the NPU, whatever is resident
MIN_M_NEVER = 1 << 30  # the NPU never wins for this shape


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


def host_nf4_bytes(n: int, k: int) -> int:
    nk = n * k
    return -(-nk // 2) + 4 * (-(-nk // 64))


def t_cpu(n: int, k: int, m: float, board: Board) -> float:
    if m <= 0:
        return 0.0
    return max(2.0 * m * n * k / board.cpu_ops_per_s, host_nf4_bytes(n, k) / board.mem_bandwidth)


def t_npu(n: int, k: int, m: float, board: Board) -> float:
    if m <= 0:
        return 0.0
    np_, kp, calls = npu_padded(n, k, board)
    return calls * board.submit_overhead_s + 2.0 * m * np_ * kp / board.npu_ops_per_s


def min_m(n: int, k: int, board: Board) -> int:
    """Smallest M >= 2 at which the NPU beats the CPU for an N x K weight (never below 2)."""
    if "npu" not in board.engines or board.npu_ops_per_s <= 0:
        return MIN_M_NEVER
    m = MIN_M_FLOOR
    if t_npu(n, k, m, board) < t_cpu(n, k, m, board):
        return m
    np_, kp, calls = npu_padded(n, k, board)
    a = 2.0 * n * k / board.cpu_ops_per_s  # cpu slope
    b = 2.0 * np_ * kp / board.npu_ops_per_s  # npu slope
    if a <= b:
        return MIN_M_NEVER
    c = calls * board.submit_overhead_s
    m = max(MIN_M_FLOOR, int(math.floor(c / (a - b))) - 2)
    while not t_npu(n, k, m, board) < t_cpu(n, k, m, board):
        m += 1
        if m >= MIN_M_NEVER:
            return MIN_M_NEVER
    while m > MIN_M_FLOOR and t_npu(n, k, m - 1, board) < t_cpu(n, k, m - 1, board):
        m -= 1
    return m
