"""llama.cpp's converter layout for the value changes it makes: what an HF reader applies so that a folder reads,
tensor for tensor, as the converter's GGUF of it (names and squeezed shapes are archs' ``renames`` and ``squeeze``).

A family declares its changes as :class:`orkpack.archs.Convert` entries; :func:`plan` evaluates them for one config
into :class:`Change` lists by canonical name, and :func:`apply` makes them on an array as read:

* ``neg_exp``: ``-exp(A_log)`` (the converter's ``ssm_a``), computed and stored in float32;
* ``scale``: times config numbers in turn, on all rows or a row range of axis 0 (Falcon-H1's muP multipliers): each
  product in float32 (``x * float32(m)``, correctly rounded, as the converter's torch multiply of a float32 tensor by a
  Python number), then back in the tensor's own dtype (BF16 rounded to nearest even, as gguf-py writes BF16); a factor
  of exactly 1 changes nothing and is skipped;
* ``vheads``: Qwen3.5 / Qwen3-Next's value heads from grouped order (K head g's V heads g*per .. g*per + per - 1
  together) to tiled order (V head r of every K head, then r + 1), along one axis after its first ``skip`` entries,
  in heads of ``head`` entries: ``reshape(groups, per, head) -> swap the first two -> reshape`` (the converter's
  ``_LinearAttentionVReorderBase._reorder_v_heads``). A pure permutation: the stored bits move, BF16 stays 16-bit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import archs
from ..errors import SourceError, escape_name
from ..globs import matches
from .base import as_float32


@dataclass(frozen=True)
class Change:
    op: str  # neg_exp | vheads
    axis: int = 0
    skip: int = 0
    head: int = 1
    groups: int = 1
    per: int = 1
    factors: tuple[float, ...] = ()
    rows: tuple[int, ...] = ()


_FACTOR = re.compile(r"^([A-Za-z_]\w*)(?:\[(\d+)\])?$")


def _factor(expr: str, config: Mapping, defaults: Mapping) -> float:
    """A config number: ``key`` or ``key[i]`` (the family's defaults for a key the config leaves out)."""
    m = _FACTOR.match(expr)
    if m is None:
        raise ValueError(f"bad factor {expr!r}")
    v: Any = config.get(m.group(1))
    if v is None:
        v = defaults.get(m.group(1))
    if m.group(2) is not None:
        v = v[int(m.group(2))]
    return float(v)


def plan(fam: archs.Family | None, config: Mapping | None, tensors, where: str) -> dict[str, list[Change]]:
    """{canonical name: its changes in order} for the ``tensors`` ((name, shape) pairs) of a checkpoint of ``fam``
    (SourceError, one line naming the tensor, for a shape the config's heads do not describe)."""
    if fam is None or not fam.convert or config is None:
        return {}
    d = archs.dims(config)
    out: dict[str, list[Change]] = {}
    for name, shape in tensors:
        for c in fam.convert:
            if matches(name, c.glob):
                ch = Change(c.op, c.axis, *(archs.evaluate(x, d) for x in (c.skip, c.head, c.groups, c.per)))
                if ch.op == "vheads" and ch.per == 1:
                    continue  # as many V heads as K heads: the order is the same
                if ch.op == "vheads" and not (len(shape) > ch.axis % max(len(shape), 1) and
                                              shape[ch.axis] - ch.skip == ch.groups * ch.per * ch.head):
                    raise SourceError(f"{where}: tensor {escape_name(name)} {tuple(shape)} does not hold the "
                                      f"value heads config.json describes ({ch.skip} + {ch.groups} key heads x "
                                      f"{ch.per} value heads x {ch.head} on axis {ch.axis}); the checkpoint and "
                                      "its config.json disagree")
                if ch.op == "scale":
                    fs = tuple(f for f in (_factor(x, config, fam.defaults) for x in c.factors) if f != 1.0)
                    if not fs:
                        continue  # times 1: the same values
                    ch = Change("scale", factors=fs, rows=tuple(archs.evaluate(x, d) for x in c.rows))
                out.setdefault(name, []).append(ch)
    return out


def apply(a: np.ndarray, changes: list[Change]) -> np.ndarray:
    for c in changes:
        if c.op == "neg_exp":
            a = (-np.exp(as_float32(a).astype(np.float64))).astype(np.float32)  # correctly rounded
        elif c.op == "scale":
            a = _scale(a, c)
        else:
            a = _vheads(a, c)
    return a


def _scale(a: np.ndarray, c: Change) -> np.ndarray:
    stored = a.dtype
    x = np.array(as_float32(a), dtype=np.float32, copy=True)
    part = x[c.rows[0]: c.rows[1]] if c.rows else x
    for f in c.factors:
        part *= np.float32(f)  # float32 x float32, correctly rounded: torch's float32 multiply
    if stored == np.float32:
        return x
    if stored == np.uint16:  # BF16 bits, round to nearest even (finite values)
        b = x.view(np.uint32)
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return x.astype(stored)


def _vheads(a: np.ndarray, c: Change) -> np.ndarray:
    ax = c.axis % a.ndim
    n = a.shape[ax] - c.skip
    if n != c.groups * c.per * c.head:
        raise ValueError(f"{n} entries after {c.skip} on axis {ax} are not {c.groups} x {c.per} x {c.head}")
    m = np.moveaxis(a, ax, 0)
    tail = m[c.skip:].reshape(c.groups, c.per, c.head, *m.shape[1:]).swapaxes(0, 1).reshape(n, *m.shape[1:])
    return np.ascontiguousarray(np.moveaxis(np.concatenate([m[:c.skip], tail]), 0, ax))
