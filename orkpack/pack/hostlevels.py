"""The encodings a build's two host levels may be written in (orkpack build / plan --host-low, --host-high).

A plan item the MILP puts on host "nf4" is written in the low level's encoding ("nf4": the build's NF4 format,
--nf4-format), one it puts on host "int8" in the high level's (docs/TIERMAP.md section 2, "Host formats"). The
defaults are the formats there were before (nf4, int8): what a tier map without levels means, and the other level when
one is given; given neither, the balanced plan chooses the pair (tiers/solver.py AUTO_LEVELS). A tier map records
others in its board block ("host_low", "host_high"). Used by the planner (tiers/board.py) and the build
(transforms/nf4.py NF4Choice).
"""
from __future__ import annotations

from ..errors import OrkError, escape_name
from . import spec

HOST_LOW = ("nf4", spec.ENC_INT5DQ, spec.ENC_INT6DQ)
HOST_HIGH = (spec.ENC_INT8, spec.ENC_INT8DQ, spec.ENC_INT6DQ)
DEFAULT_HOST_LOW, DEFAULT_HOST_HIGH = "nf4", spec.ENC_INT8


def check_host_formats(low: object, high: object, where: str) -> tuple[str, str]:
    """(low, high) checked (None: the default); anything else is one OrkError line naming ``where``."""
    low = DEFAULT_HOST_LOW if low is None else low
    high = DEFAULT_HOST_HIGH if high is None else high
    if low not in HOST_LOW:
        raise OrkError(f"{where}: host low format {escape_name(str(low), 40)!r}: choose {', '.join(HOST_LOW)}")
    if high not in HOST_HIGH:
        raise OrkError(f"{where}: host high format {escape_name(str(high), 40)!r}: choose {', '.join(HOST_HIGH)}")
    if low == high:
        raise OrkError(f"{where}: the host low and high formats are both {low}; give two levels")
    return low, high


def level_names(board: object, title: bool = False) -> dict[str, str]:
    """The formats a plan's two host levels are written in, by the plan's tier name ("nf4": the low level,
    "int8": the high level), read from a tier map's board block (absent or not a dict: the defaults). ``title``:
    NF4 as a label names it ("NF4"; the plan's baselines), else as the encoding it is (its lookup lines)."""
    b = board if isinstance(board, dict) else {}
    low, high = str(b.get("host_low", DEFAULT_HOST_LOW)), str(b.get("host_high", DEFAULT_HOST_HIGH))
    return {"nf4": "NF4" if title and low == "nf4" else low, "int8": high}
