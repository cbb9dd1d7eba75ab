"""The NPU arena: the IOVA space of one IOMMU domain and where each NPU slice sits in it.

The RK3588 NPU's IOMMU has a 32-bit address space (0x0-0xffffffff); on a freshly
booted board about 3.9 GiB of it is usable (DESIGN.md section 2; rknn-llm issues
232 and 335). Without a cap from the pack's tier map, the arena's cap is
``4 GiB - IOVA_MARGIN`` = 3992 MiB (3.898 GiB): the margin of 104 MiB covers the
driver's own mappings and fragmentation. Every buffer is rounded up to the
driver's 4096-byte alignment. Placing more than the cap is a check failure.

The arena is a model of the IOVA space (the rknpu driver chooses the real
addresses, top-down); the backends own the memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

IOVA_SPACE = 1 << 32
IOVA_MARGIN = 104 << 20
DEFAULT_IOVA_CAP = IOVA_SPACE - IOVA_MARGIN
IOVA_ALIGN = 4096

# where a tier map may state the usable IOVA (first found wins); see docs/RUNTIME.md
_CAP_KEYS = (
    ("board", "iova_usable_bytes"),
    ("board", "iova_usable"),
    ("budget", "npu", "cap"),
    ("budgets", "npu", "cap"),
    ("npu", "cap"),
)


def align_up(v: int, a: int = IOVA_ALIGN) -> int:
    return -(-int(v) // a) * a


def cap_from_header(header: dict) -> tuple[int, str]:
    """(usable IOVA bytes, where the number came from) for a pack header."""
    tm = header.get("tiermap") if isinstance(header, dict) else None
    if isinstance(tm, dict):
        for keys in _CAP_KEYS:
            v = tm
            for key in keys:
                v = v.get(key) if isinstance(v, dict) else None
            if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= IOVA_SPACE:
                return v, "tiermap." + ".".join(keys)
    return DEFAULT_IOVA_CAP, "default (4 GiB - 104 MiB)"


class ArenaFull(Exception):
    """A placement would pass the arena's cap."""


@dataclass
class Placement:
    key: str
    offset: int  # IOVA offset in the domain
    size: int  # bytes the slice needs
    span: int  # size rounded up to the alignment


@dataclass
class Arena:
    """A bump allocator over [0, cap) with the driver's alignment."""

    cap: int = DEFAULT_IOVA_CAP
    align: int = IOVA_ALIGN
    used: int = 0
    placements: list[Placement] = field(default_factory=list)

    def place(self, key: str, size: int) -> Placement:
        span = align_up(max(int(size), 1), self.align)
        if self.used + span > self.cap:
            raise ArenaFull(
                f"{key}: needs {span} bytes at IOVA offset {self.used}, past the arena cap of {self.cap} bytes"
            )
        p = Placement(key, self.used, int(size), span)
        self.used += span
        self.placements.append(p)
        return p

    @property
    def free(self) -> int:
        return self.cap - self.used
