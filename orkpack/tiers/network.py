"""The link between boards for llama.cpp RPC: a [network] table (docs/CLUSTER.md section 3).

Shipped links (1gbe, 2.5gbe, 10gbe) live in ``tiermaps/networks/networks.toml`` (commented: every
value's source) and, byte-identical, as package data in ``orkpack/data/networks/``.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import OrkError, escape_name
from ..files import exists
from .board import BOARD_DIR

NETWORK_FILE = BOARD_DIR.parent / "networks" / "networks.toml"
DEFAULT_NETWORK = "1gbe"
# what a [network] value may be: a link of 1 byte/s to 1 PB/s, up to an hour a round trip and a million of them an
# evaluation (beyond these the cost model's seconds overflow, or round to nothing, and a plan says NaN tok/s)
LIMITS = {"latency_s": (0.0, 3600.0), "bandwidth_bytes_per_s": (1.0, 1e15), "round_trips_per_eval": (0.0, 1e6)}


@dataclass(frozen=True)
class Network:
    name: str
    latency_s: float
    bandwidth_bytes_per_s: float
    round_trips_per_eval: float
    source: str = ""

    def eval_s(self, rows: float, hidden: int) -> float:
        """Seconds one remote device adds to one graph evaluation of ``rows`` tokens: the protocol's round
        trips, and the hidden state (f32) sent to it and read back through the client."""
        if rows <= 0:
            return 0.0
        return self.round_trips_per_eval * self.latency_s + 2.0 * rows * hidden * 4 / self.bandwidth_bytes_per_s

    def to_json(self) -> dict:
        return {"name": self.name, "latency_s": self.latency_s, "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                "round_trips_per_eval": self.round_trips_per_eval}


def _network_from(d: object, where: str) -> Network:
    if not isinstance(d, dict):
        raise OrkError(f"{where}: [network] must be a table (latency_s, bandwidth_bytes_per_s, round_trips_per_eval)")
    vals = {}
    for k in ("latency_s", "bandwidth_bytes_per_s", "round_trips_per_eval"):
        v = d.get(k)
        lo, hi = LIMITS[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
            raise OrkError(f"{where}: [network] '{k}' must be a number from {lo:g} to {hi:g}; "
                           "see tiermaps/networks/networks.toml")
        vals[k] = float(v)
    return Network(str(d.get("name") or where), source=where, **vals)


def network_names() -> list[str]:
    return list(tomllib.loads(NETWORK_FILE.read_text(encoding="utf-8")).keys() - {"schema", "version"})


def load_network(spec: str | None) -> Network:
    """A shipped link by name (1gbe, 2.5gbe, 10gbe) or a TOML file with a [network] table."""
    s = DEFAULT_NETWORK if spec is None else str(spec)
    if s.endswith(".toml") or exists(s):
        data = _read_toml(Path(s))
        if "network" not in data:
            raise OrkError(f"{escape_name(s)}: no [network] table; see tiermaps/networks/networks.toml")
        return _network_from(data["network"], escape_name(s))
    shipped = tomllib.loads(NETWORK_FILE.read_text(encoding="utf-8"))
    key = s.lower()
    if key not in shipped or key in ("schema", "version"):
        raise OrkError(f"unknown network {escape_name(s)!r}; shipped: {', '.join(sorted(network_names()))}, "
                       "or a .toml file with a [network] table")
    return _network_from(shipped[key], key)


def _read_toml(p: Path) -> dict:
    from .tomlfile import read_toml

    return read_toml(p, escape_name(str(p)), "network")
