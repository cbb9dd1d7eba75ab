"""The tier map: every item's encoding, tier and min_m, with the budget and the proof that produced it.

Schema ``orkpack.tiermap`` version 1 (docs/TIERMAP.md). ``to_json()`` is
deterministic (no times, no paths); ``TierMap.from_json`` validates and rebuilds.

Invariant enforced here, in the constructor and in ``from_json``: every ``min_m``
is an integer >= 2. M = 1 (decode) never goes to the NPU, whatever is resident:
a tier map that would let it is rejected.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from ..errors import OrkError, escape_name
from ..sources import names as _names
from .board import LEGACY_NF4_FORMAT
from .cost import MIN_M_FLOOR

TIERMAP_SCHEMA = "orkpack.tiermap"
TIERMAP_VERSION = 1
ENCODINGS = ("f32", "f16", "bf16", "int8", "nf4", "raw")  # raw: integer/bool tensors carried as stored (host only)
TIERS = ("npu", "host")
HOST_COPY_ENCODINGS = ("nf4",)  # an NPU slice's second copy, read by the CPU at decode


@dataclass(frozen=True)
class Decision:
    tensor: str
    expert: int | None
    shape: tuple[int, ...]  # the slice's shape
    encoding: str
    tier: str
    min_m: int
    bytes: int  # resident bytes (NPU tiles + scales for NPU, stored bytes for host)
    benefit_us: float  # prefill time the NPU saves per chunk (0 for host / float)
    pin: str | None  # the pin flag that forced it, if any
    # dual residency: an NPU slice that also keeps a host copy in this encoding ("nf4"), which the
    # CPU reads at decode (M = 1); None: the CPU decodes from the NPU's int8 tiles
    host_copy: str | None = None
    host_copy_bytes: int = 0

    @property
    def name(self) -> str:
        return self.tensor if self.expert is None else f"{self.tensor}[{self.expert}]"


def _check(d: Decision) -> None:
    if not isinstance(d.min_m, int) or isinstance(d.min_m, bool) or d.min_m < MIN_M_FLOOR:
        raise OrkError(f"tier map: {escape_name(d.name)} has min_m {d.min_m!r}; min_m must be an integer >= 2 "
                       "(M = 1 never goes to the NPU)")
    if d.encoding not in ENCODINGS:
        raise OrkError(f"tier map: {escape_name(d.name)} has unknown encoding {escape_name(str(d.encoding))!r}")
    if d.tier not in TIERS:
        raise OrkError(f"tier map: {escape_name(d.name)} has unknown tier {escape_name(str(d.tier))!r}")
    if d.tier == "npu" and d.encoding not in ("int8", "nf4"):
        raise OrkError(f"tier map: {escape_name(d.name)} is on the NPU as {d.encoding}; the NPU holds int8 only")
    if d.host_copy is not None and (d.tier != "npu" or d.host_copy not in HOST_COPY_ENCODINGS):
        raise OrkError(f"tier map: {escape_name(d.name)} has a host copy {escape_name(str(d.host_copy))!r}; only an "
                       f"NPU slice may have one, encoded as {', '.join(HOST_COPY_ENCODINGS)}")


class TierMap:
    """Decisions for every tensor/expert slice, plus the facts they were solved under."""

    def __init__(self, decisions: list[Decision], *, model: dict, board: dict, options: dict,
                 objective: dict, budget: dict, prediction: dict):
        checked = set()  # _check reads min_m (and its type), encoding, tier, host_copy: alike decisions pass once
        p = None  # the previous decision: one whose fields are its very objects passed with it
        for d in decisions:
            if p is not None and d.min_m is p.min_m and d.encoding is p.encoding and d.tier is p.tier \
                    and d.host_copy is p.host_copy:
                continue
            p = d
            key = (type(d.min_m), d.min_m, d.encoding, d.tier, d.host_copy)
            try:
                if key in checked:
                    continue
            except TypeError:  # an unhashable value (a damaged JSON): _check names it
                pass
            _check(d)
            checked.add(key)
        self.decisions = list(decisions)
        self.model, self.board, self.options = model, board, options
        self.objective, self.budget, self.prediction = objective, budget, prediction

    @functools.cached_property
    def _index(self) -> dict[tuple[str, int | None], Decision]:
        """(tensor, expert) -> decision; made at the first lookup (a plan that is only printed makes none)."""
        return {(d.tensor, d.expert): d for d in self.decisions}

    @property
    def nf4_format(self) -> object:
        """The NF4 format the map's host nf4 bytes count (its board block's "nf4_format", unchecked): the format
        a build that follows the map writes. A map without it was planned at b64 (before there were two)."""
        return self.board.get("nf4_format", LEGACY_NF4_FORMAT)

    # ------------------------------------------------------------------ lookup
    def get(self, tensor_name: str, expert: int | None = None) -> Decision:
        key = (tensor_name, expert)
        d = self._index.get(key)
        if d is None:
            name = tensor_name
            arch, L = self.model.get("arch"), int(self.model.get("n_layers") or 0)
            if expert is None:
                sp = _names.split_expert(name)
                if sp is not None:
                    name, expert = sp
            if (name, expert) not in self._index and arch:
                name = _names.normalize_name(name, arch, L)
                sp = _names.split_expert(name)
                if sp is not None:
                    name, expert = sp
            d = self._index.get((name, expert))
        if d is None:
            what = tensor_name if expert is None else f"{tensor_name}[{expert}]"
            raise OrkError(f"{escape_name(what)}: not in the tier map; plan this model again (orkpack plan)")
        return d

    def decision(self, tensor_name: str, expert: int | None = None) -> tuple[str, str, int]:
        """(encoding, tier, min_m) for a tensor (canonical, HF or expert-slice name) or one expert."""
        d = self.get(tensor_name, expert)
        return d.encoding, d.tier, d.min_m

    # ------------------------------------------------------------------ JSON
    def _slice(self, d: Decision) -> dict:
        out = {"expert": d.expert, "shape": list(d.shape), "encoding": d.encoding, "tier": d.tier,
               "min_m": d.min_m, "bytes": d.bytes, "benefit_us": round(d.benefit_us, 3), "pin": d.pin}
        if d.host_copy is not None:  # only dual-resident slices carry the keys (older maps stay as they were)
            out.update(host_copy=d.host_copy, host_copy_bytes=d.host_copy_bytes)
        return out

    def _head(self) -> dict:
        return {"schema": TIERMAP_SCHEMA, "version": TIERMAP_VERSION,
                "model": self.model, "board": self.board, "options": self.options,
                "objective": self.objective, "budget": self.budget, "prediction": self.prediction}

    def to_json(self) -> dict:
        tensors: dict[str, dict] = {}
        for d in self.decisions:
            t = tensors.get(d.tensor)
            if t is None:
                t = tensors[d.tensor] = {"name": d.tensor, "slices": []}
            t["slices"].append(self._slice(d))
        return {**self._head(), "tensors": list(tensors.values())}

    def _tensor_lines(self) -> list[str]:
        """``json.dumps(tensor, separators=(",", ":"), ensure_ascii=False)`` of every entry of
        ``to_json()["tensors"]``, without building them: slices alike but for their expert index
        (every expert of a MoE layer, mostly) are encoded once. TypeError on an unhashable value."""
        enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        tails: dict[tuple, str] = {}
        tensors: dict[str, list[str]] = {}
        p = None  # the previous decision: a slice whose fields are its very objects has its text (alike experts)
        for d in self.decisions:
            if (p is not None and d.shape is p.shape and d.encoding is p.encoding and d.tier is p.tier
                    and d.min_m is p.min_m and d.bytes is p.bytes and d.benefit_us is p.benefit_us and d.pin is p.pin
                    and d.host_copy is p.host_copy and d.host_copy_bytes is p.host_copy_bytes):
                pass  # the same objects print the same: tail stays
            else:
                b = d.benefit_us
                # types and the sign of zero too: values equal as numbers can print differently (1 / 1.0 / True, -0.0)
                key = (d.shape, d.encoding, d.tier, type(d.min_m), d.min_m, type(d.bytes), d.bytes, type(b), b,
                       math.copysign(1.0, b) if type(b) is float else 0, d.pin, d.host_copy, type(d.host_copy_bytes),
                       d.host_copy_bytes)
                tail = tails.get(key)
                if tail is None:  # the slice's JSON after its "expert" member
                    one = self._slice(d)
                    del one["expert"]
                    tail = tails[key] = enc(one)[1:]
            if p is None or d.tensor != p.tensor:
                parts = tensors.get(d.tensor)
                if parts is None:
                    parts = tensors[d.tensor] = []
            p = d
            e = d.expert
            head = f'{{"expert":{e},' if type(e) is int else f'{{"expert":{enc(e)},'
            parts.append(head + tail)
        return [f'{{"name":{enc(name)},"slices":[{",".join(parts)}]}}' for name, parts in tensors.items()]

    @classmethod
    def from_json(cls, d: Any) -> "TierMap":
        if not isinstance(d, dict) or d.get("schema") != TIERMAP_SCHEMA:
            raise OrkError(f"not an orkpack tier map (schema must be {TIERMAP_SCHEMA!r})")
        if d.get("version") != TIERMAP_VERSION:
            raise OrkError(f"tier map version {d.get('version')!r} is not supported (this orkpack reads {TIERMAP_VERSION})")
        decisions = []
        try:
            for t in d["tensors"]:
                for s in t["slices"]:
                    e = s["expert"]
                    if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e < 0):
                        raise TypeError
                    decisions.append(Decision(str(t["name"]), e, tuple(int(x) for x in s["shape"]), s["encoding"],
                                              s["tier"], s["min_m"], int(s["bytes"]), float(s["benefit_us"]), s.get("pin"),
                                              s.get("host_copy"), int(s.get("host_copy_bytes", 0))))
            return cls(decisions, model=dict(d["model"]), board=dict(d["board"]), options=dict(d["options"]),
                       objective=dict(d["objective"]), budget=dict(d["budget"]), prediction=dict(d["prediction"]))
        except (KeyError, TypeError, ValueError):
            raise OrkError("tier map is damaged (a required key is missing or has the wrong type); plan again") from None


def dumps(tm: TierMap | dict) -> str:
    """The tier map as text: stable key order, one tensor per line (diff-friendly), trailing newline."""
    lines = None
    if isinstance(tm, TierMap):
        head = tm._head()
        try:
            lines = tm._tensor_lines()
        except TypeError:  # an unhashable value (a hand-edited map): encode it the plain way
            d = tm.to_json()
    else:
        d = tm
        head = {k: v for k, v in d.items() if k != "tensors"}
    if lines is None:
        lines = [json.dumps(t, separators=(",", ":"), ensure_ascii=False) for t in d["tensors"]]
    text = json.dumps(head, indent=1, ensure_ascii=False)[:-2]  # drop the closing "\n}"
    return text + ',\n "tensors": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"
