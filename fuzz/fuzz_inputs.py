"""Structure-aware fuzz of the inputs added since the pack fuzzing of issue 11 (issue 27), through the real CLI.

    nice -n 10 python fuzz/fuzz_inputs.py --kind imatrix --seconds 180 --seed 1
    nice -n 10 python fuzz/fuzz_inputs.py --kind model --cases 500 --seed 2 --check /tmp/b/orkpack-check
    nice -n 10 python fuzz/fuzz_inputs.py --kind csv --replay 17 --seed 3       # one case: its mutations, its outcome
    nice -n 10 python fuzz/fuzz_inputs.py --kind toml --cases 40 --seed 4 --subprocess   # through `python -m orkpack`

Kinds (``--kind``, several with commas; default all), each with its own structure-aware generator: the
input is held as a structure (fields, types, counts, lengths, nesting, encodings), mutated there, then
serialized by this module, so a mutation lands where a parser looks (not only random bytes):

* ``imatrix``: a GGUF imatrix (llama.cpp's layout plus orkpack's ``in_absmax``; serialized here field by field:
  version, tensor and key counts that may lie, key types, string lengths that may lie, array item types and
  counts, tensor dims / ggml types / offsets / alignment, the F32 data) and llama.cpp's legacy ``.dat``
  (entry count, name lengths, ncall, nval, the values, the trailing chunk count and dataset name), both
  made from statistics gathered on the tiny model with ``orkpack imatrix``; targets ``orkpack build MODEL
  --imatrix F`` (orkpack/stats/formats.py) and ``orkpack plan MODEL --profile F`` (orkpack/tiers/profile.py);
* ``tokenizer``: the tiny model folder's ``tokenizer.json`` and ``tokenizer_config.json`` (JSON mutations
  with a tokenizer's vocabulary: model types, vocab ids, merges as strings or pairs, added tokens, special
  flags, bos/eos tokens as strings or AddedToken objects, chat templates, NaN and huge numbers); targets
  ``orkpack build MODEL --no-plan`` (the folder's tokenizer becomes the pack's model record,
  orkpack/sources/modelkv.py), then on the built pack ``orkpack eval`` (the tokenizer built from the record,
  orkpack/model/tokenizer.py), ``orkpack inspect --json`` and the C reader (below);
* ``model``: the ``model`` record of a pack header (packs built from the tiny HF folder and from a GGUF with
  keys of every type), mutated (entry types swapped, malformed type names such as ``string]``,
  ``array[uint8``, ``array[]``, nested arrays, values at and beyond their type's limits, ``"nan"``,
  1e400, lone surrogates, entries of 2 or 4 items, duplicate and empty keys, the tokenizer keys of wrong
  types and lengths) and the pack forged with every checksum right (fuzz/harness.py forge_pack); targets
  ``orkpack verify``, ``orkpack inspect --json``, ``orkpack eval`` in process, and the C reader;
* ``toml``: board, runtime, network and cluster TOML files (from the shipped ones; values at int64 and
  float limits, NaN/inf, wrong types, sections deleted, made scalars or arrays of tables, unknown keys,
  schema/version, engine lists, a cluster's boards/hosts/ports/cpus/bind, board paths pointing at
  missing files, folders, the cluster file itself; and text-level damage: duplicate keys, a BOM, NUL,
  invalid UTF-8); targets ``orkpack plan CONFIG --board F``, ``--runtime F``, ``--boards F``,
  ``--boards B,B --network F``, ``orkpack build --board F``, and sometimes ``-o F`` (an output over the input);
* ``csv``: calibration CSVs (docs/calibration/published.csv split by runtime path, with the configs they
  name; cells swapped for numbers at their limits, 5000 digits, NaN, ``1_000``, Unicode digits, kinds
  and choices swapped, columns dropped, duplicated, reordered or unknown, cells added, quoting broken, config
  paths to missing files, folders, /dev/zero or the CSV itself, runtime paths mixed; a BOM, NUL, invalid
  UTF-8); target ``orkpack calibrate CSV -o OUT.toml`` (sometimes with ``--runtime R.toml -o R.toml``).

The contract, checked on every case: exit 0 with sane output (a pack that opens, a runtime file that loads,
strict JSON), or exit 2 (``verify``/``inspect``: 1, a damaged pack, too) with exactly one ``error:`` line on
stderr that names the input file (its name appears in the line); no traceback; no exception other than
orkpack's own; nothing at the output path after a failure; every input file byte for byte as it was; no
more than 20 s of CPU a case. ``model`` and ``tokenizer`` also run ``orkpack-check`` (--check, or built
here) on the packs: its exit code must equal ``orkpack verify``'s, and with ``--model`` each record entry
must read the same in both readers (the same values, hashed as tests/test_model_record.py does, or both
refusing it; the C API reads no nested arrays and no uint64 above INT64_MAX: those it may refuse).

Each case runs in a forked worker (a batch per child; a child that dies is rerun one case per child, so a
native crash is pinned to its case). Deterministic: case i of seed S of a kind is the same input whatever
the batch or time limit. A finding prints its case index and mutations; ``--save DIR`` writes the input
(and a sidecar with the command and outcome) for a regression test (tests/test_fuzz_inputs.py replays
fuzz/regressions/inputs/). docs/GUARANTEES.md has the runs.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fuzz"))
import harness  # noqa: E402

from fuzz_structure import Raw, dumps as jdumps  # noqa: E402

KINDS = ("imatrix", "tokenizer", "model", "toml", "csv")
REGRESSIONS = ROOT / "fuzz" / "regressions" / "inputs"
TIMEOUT = 20.0  # CPU seconds a case may take before it is a hang
WALL_TIMEOUT = 120.0
TINY = dict(layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=512, shards=1)
TEXT = "the quick brown fox jumps over the lazy dog; a cat sat on the mat and then it ran away again\n" * 3

# ------------------------------------------------------------------------------------------- shared values

INTS = [0, 1, -1, 2, 7, 255, 256, -129, 65535, 65536, 2 ** 31 - 1, 2 ** 31, -2 ** 31 - 1, 2 ** 32 - 1, 2 ** 32,
        2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, -2 ** 63, -2 ** 63 - 1, 2 ** 64 - 1, 2 ** 64, 10 ** 30, -10 ** 30]
FLOATS = [0.0, -0.0, 0.5, 1.5, 1e-308, 5e-324, 1e308, -1e308, 3.4e38, 3.5e38, float("nan"), float("inf"),
          float("-inf")]
STRS = ["", "x", "0", "1e400", "nan", "inf", "-inf", "\u0000", "\ud800", "\u202eevil", "\x1b[31m", "line\nline",
        "a" * 5000, "é", "../../etc/passwd"]


def interesting(rng: random.Random, cur=None):
    r = rng.random()
    if isinstance(cur, int) and not isinstance(cur, bool) and r < 0.3:
        return rng.choice([cur + 1, cur - 1, -cur, cur * 2, cur * 1000, float(cur), str(cur), 0, cur + 2 ** 32])
    if isinstance(cur, float) and r < 0.3:
        return rng.choice([-cur, cur * 1e300, cur / 1e300, 0.0, str(cur), int(cur) if math.isfinite(cur) else 0])
    if r < 0.5:
        return rng.choice(INTS)
    if r < 0.65:
        return rng.choice(FLOATS)
    if r < 0.8:
        return rng.choice(STRS)
    if r < 0.88:
        return rng.choice([None, True, False])
    if r < 0.95:
        return rng.choice([[], [cur], [cur, cur], [[cur]], [1, "a"]])
    return rng.choice([{}, {"x": cur}, {"type": cur}])


def _walk(v, path=(), out=None, depth=0):
    out = [] if out is None else out
    out.append((path, v))
    if depth < 10:
        if isinstance(v, dict):
            for k, x in list(v.items())[:400]:
                _walk(x, path + (k,), out, depth + 1)
        elif isinstance(v, list):
            idx = range(len(v)) if len(v) <= 40 else sorted({0, 1, 2, len(v) // 2, len(v) - 2, len(v) - 1})
            for i in idx:
                _walk(v[i], path + (i,), out, depth + 1)
    return out


def _get(v, path):
    for k in path:
        v = v[k]
    return v


def _set(root, path, value):
    if not path:
        return value
    _get(root, path[:-1])[path[-1]] = value
    return root


def mutate_tree(rng: random.Random, root, values=None, n: int | None = None, log: list | None = None):
    """1-4 structural mutations of a JSON/TOML-like tree: a value set (to ``values(rng, path, cur)`` or an
    interesting value), a key deleted, a key added, a list item deleted or duplicated, a list reversed or cut,
    a subtree copied over another, a container retyped (dict <-> list)."""
    n = n or 1 + (rng.random() < 0.5) + (rng.random() < 0.25) + (rng.random() < 0.1)
    log = [] if log is None else log
    for _ in range(n):
        nodes = _walk(root)
        path, cur = rng.choice(nodes)
        r = rng.random()
        try:
            if r < 0.45 or not path:
                v = values(rng, path, cur) if values and rng.random() < 0.6 else interesting(rng, cur)
                if not path and not isinstance(v, (dict, list)) and rng.random() < 0.8:
                    continue  # the whole file replaced by a scalar: rare
                root = _set(root, path, v)
                log.append(f"set {list(path)} = {_short(v)}")
            elif r < 0.6:
                parent = _get(root, path[:-1])
                del parent[path[-1]]
                log.append(f"del {list(path)}")
            elif r < 0.7 and isinstance(cur, dict):
                k = rng.choice(list(cur) + ["x_unknown", "type", "id", "name", ""]) if cur else "x_unknown"
                cur[k if rng.random() < 0.5 else k + "_"] = interesting(rng)
                log.append(f"add key under {list(path)}")
            elif r < 0.8 and isinstance(cur, list) and cur:
                i = rng.randrange(len(cur))
                if rng.random() < 0.5:
                    cur.insert(rng.randrange(len(cur) + 1), copy.deepcopy(cur[i]))
                    log.append(f"dup item {list(path)}[{i}]")
                else:
                    del cur[i]
                    log.append(f"del item {list(path)}[{i}]")
            elif r < 0.87 and isinstance(cur, list):
                root = _set(root, path, list(reversed(cur)) if rng.random() < 0.5 else cur[:rng.randrange(len(cur) + 1)])
                log.append(f"reorder/cut {list(path)}")
            elif r < 0.95:
                src, sv = rng.choice(nodes)
                if path[:len(src)] != src and src[:len(path)] != path:
                    root = _set(root, path, copy.deepcopy(sv))
                    log.append(f"copy {list(src)} -> {list(path)}")
            else:
                if isinstance(cur, dict):
                    root = _set(root, path, list(cur.values()))
                elif isinstance(cur, list):
                    root = _set(root, path, {str(i): x for i, x in enumerate(cur)})
                log.append(f"retype {list(path)}")
        except (KeyError, IndexError, TypeError):
            continue
    return root


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:60] + f"...({len(s)} chars)"


# ------------------------------------------------------------------------------------------- GGUF writer

GT = dict(u8=0, i8=1, u16=2, i16=3, u32=4, i32=5, f32=6, bool=7, str=8, arr=9, u64=10, i64=11, f64=12)
_PACK = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _gstr(s, lie=None) -> bytes:
    b = s if isinstance(s, bytes) else str(s).encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(b) if lie is None else lie & (2 ** 64 - 1)) + b


def _gval(t: int, v, item=None) -> bytes:
    if t == 8:
        return _gstr(v)
    if t == 9:
        it, items = item if item is not None else (8, v)
        return struct.pack("<IQ", it & 0xFFFFFFFF, len(items)) + b"".join(_gval(it, x, None if it != 9 else (8, x)) for x in items)
    fmt = _PACK.get(t)
    if fmt is None:
        return struct.pack("<I", 0)  # an unknown type: 4 bytes of something
    try:
        return struct.pack(fmt, v)
    except (struct.error, TypeError, OverflowError):
        return struct.pack(fmt, 0) if fmt[-1] not in "fd" else struct.pack(fmt, float("nan"))


def gguf_bytes(g: dict) -> bytes:
    """A GGUF file from its structure: {version, n_tensors?, n_kv?, kv: [[key, type, value, item?, keylen?]],
    tensors: [{name, dims, ttype, offset?, data, ndims?}], align, tail}; a ``?`` field given overrides the
    true value (a lie the reader must catch)."""
    out = bytearray(b"GGUF" + struct.pack("<I", g.get("version", 3) & 0xFFFFFFFF))
    kv, ts = g["kv"], g["tensors"]
    out += struct.pack("<QQ", (g["n_tensors"] if g.get("n_tensors") is not None else len(ts)) & (2 ** 64 - 1),
                       (g["n_kv"] if g.get("n_kv") is not None else len(kv)) & (2 ** 64 - 1))
    for e in kv:
        key, t, v = e[0], e[1], e[2]
        item = e[3] if len(e) > 3 else None
        out += _gstr(key, e[4] if len(e) > 4 else None) + struct.pack("<I", t & 0xFFFFFFFF) + _gval(t, v, item)
    align = g.get("align", 32) or 32
    offs, cur = [], 0
    for t in ts:
        offs.append(cur)
        cur += -(-len(t["data"]) // align) * align
    for t, off in zip(ts, offs):
        dims = t["dims"]
        out += _gstr(t["name"]) + struct.pack("<I", t.get("ndims", len(dims)) & 0xFFFFFFFF)
        out += b"".join(struct.pack("<Q", d & (2 ** 64 - 1)) for d in dims)
        out += struct.pack("<IQ", t["ttype"] & 0xFFFFFFFF, (t["offset"] if t.get("offset") is not None else off) & (2 ** 64 - 1))
    out += bytes(-len(out) % align)
    for t in ts:
        out += t["data"] + bytes(-len(t["data"]) % align)
    out += g.get("tail", b"")
    return bytes(out[:g["cut"]] if g.get("cut") is not None else out)


def imatrix_structure(stats) -> dict:
    """The GGUF structure orkpack.stats.formats.save writes for ``stats`` (ActStats)."""
    import numpy as np

    kv = [["general.architecture", GT["str"], "imatrix"], ["general.type", GT["str"], "imatrix"],
          ["imatrix.datasets", GT["arr"], list(stats.datasets) or ["text"], (GT["str"], list(stats.datasets) or ["text"])],
          ["imatrix.chunk_count", GT["u32"], int(stats.chunk_count)], ["imatrix.chunk_size", GT["u32"], int(stats.chunk_size)]]
    ts = []
    for name in sorted(stats.entries):
        e = stats.entries[name]
        s2 = np.ascontiguousarray(e.sum2, dtype=np.float32)
        ts.append(dict(name=f"{name}.in_sum2", dims=[s2.shape[1], s2.shape[0]], ttype=0, data=s2.tobytes()))
        c = np.ascontiguousarray(e.counts.reshape(-1, 1), dtype=np.float32)
        ts.append(dict(name=f"{name}.counts", dims=[1, c.shape[0]], ttype=0, data=c.tobytes()))
        if e.absmax is not None:
            a = np.ascontiguousarray(e.absmax, dtype=np.float32)
            ts.append(dict(name=f"{name}.in_absmax", dims=[a.shape[1], a.shape[0]], ttype=0, data=a.tobytes()))
    return dict(version=3, kv=kv, tensors=ts, align=32)


def dat_structure(stats) -> dict:
    import numpy as np

    ents = []
    for name in sorted(stats.entries):
        e = stats.entries[name]
        n = float(e.counts.reshape(-1)[0]) or 1.0
        ents.append(dict(name=name.encode(), ncall=int(n), vals=np.asarray(e.sum2[0], np.float32).tolist()))
    return dict(entries=ents, chunks=int(stats.chunk_count) or 1, dataset=b"text")


def dat_bytes(d: dict) -> bytes:
    out = bytearray(struct.pack("<i", _i32(d.get("n_entries", len(d["entries"])))))
    for e in d["entries"]:
        out += struct.pack("<i", _i32(e.get("namelen", len(e["name"])))) + e["name"]
        out += struct.pack("<ii", _i32(e["ncall"]), _i32(e.get("nval", len(e["vals"]))))
        out += b"".join(_f32(x) for x in e["vals"])
    if d.get("chunks") is not None:
        out += struct.pack("<i", _i32(d["chunks"]))
        if d.get("dataset") is not None:
            out += struct.pack("<i", _i32(d.get("dslen", len(d["dataset"])))) + d["dataset"]
    out += d.get("tail", b"")
    return bytes(out[:d["cut"]] if d.get("cut") is not None else out)


def _i32(x) -> int:
    return ((int(x) + 2 ** 31) % 2 ** 32) - 2 ** 31


def _f32(x) -> bytes:
    try:
        return struct.pack("<f", x)
    except (OverflowError, struct.error):
        return struct.pack("<f", float("inf") if x > 0 else float("-inf"))


F32_SPECIAL = [float("nan"), float("inf"), float("-inf"), -1.0, -0.0, 0.0, 3.4e38, 1e-45, 1e30]


def mutate_imatrix_gguf(rng, g, log):
    import numpy as np

    for _ in range(1 + (rng.random() < 0.4) + (rng.random() < 0.15)):
        r = rng.random()
        ts, kv = g["tensors"], g["kv"]
        if r < 0.12 and kv:  # a key's type or value
            e = rng.choice(kv)
            what = rng.random()
            if what < 0.4:
                e[1] = rng.choice([0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 99, 2 ** 32 - 1])
                e[2] = rng.choice([0, 1, -1, 2 ** 32 - 1, 2 ** 63, "imatrix", 1.5, True, [1, 2]])
                if e[1] == 9:
                    it = rng.choice([0, 4, 8, 9, 6, 77])
                    e[2] = [] if rng.random() < 0.2 else ["a", "b"] if it == 8 else [[1], [2]] if it == 9 else [1, 2]
                    e[3:] = [(it, e[2] if it != 9 else [["a"], ["b"]])]
            elif what < 0.7:
                e[2] = interesting(rng, e[2] if not isinstance(e[2], list) else 0)
                if e[1] == 9:
                    e[3:] = [(rng.choice([8, 4, 6]), e[2] if isinstance(e[2], list) else [e[2]])]
            else:
                e[4:] = [rng.choice([0, 1, 2 ** 20, 2 ** 40, 2 ** 63, 2 ** 64 - 1])] if len(e) >= 4 else []
                if len(e) < 4:
                    e[3:] = [None, rng.choice([0, 1, 2 ** 20, 2 ** 40, 2 ** 63, 2 ** 64 - 1])]
            log.append(f"kv {e[0]} -> {e[1:]!r}"[:160])
        elif r < 0.2:
            which = rng.choice(["n_tensors", "n_kv", "version"])
            base = len(ts) if which == "n_tensors" else len(kv) if which == "n_kv" else 3
            g[which] = rng.choice([0, base - 1, base + 1, 2 ** 31, 2 ** 63, 2 ** 64 - 1, 1, 2, 4])
            log.append(f"{which} = {g[which]}")
        elif r < 0.26:
            if rng.random() < 0.5 and kv:
                i = rng.randrange(len(kv))
                log.append(f"drop key {kv[i][0]}")
                del kv[i]
            else:
                k = rng.choice(["general.alignment", "general.type", "imatrix.chunk_count", "imatrix.datasets", "x"])
                t = rng.choice([4, 8, 10, 5])
                kv.append([k, t, rng.choice([0, 1, 7, 64, 2 ** 32 - 1, "model", "imatrix"])])
                if k == "general.alignment" and t == 4 and isinstance(kv[-1][2], int):
                    g["align"] = max(1, kv[-1][2]) if kv[-1][2] <= 4096 else 32
                log.append(f"add key {kv[-1]}")
        elif r < 0.4 and ts:  # a tensor's name
            t = rng.choice(ts)
            t["name"] = rng.choice([t["name"].replace("in_sum2", "in_sum"), t["name"].replace(".counts", ""), "",
                                    rng.choice(ts)["name"], t["name"] + "\udcff", "x" * 70000,
                                    t["name"].replace("blk.0", "blk.9"), t["name"].rsplit(".", 1)[0] + ".in_absmax",
                                    ".in_sum2", "blk.0.ffn_up.weight"])
            log.append(f"tensor name -> {_short(t['name'])}")
        elif r < 0.55 and ts:  # dims, type, offset
            t = rng.choice(ts)
            what = rng.random()
            if what < 0.45:
                d = list(t["dims"])
                choice = rng.random()
                if choice < 0.3 or not d:
                    d = rng.choice([[], [1], [len(t["data"]) // 4], d + [1], d + [2], d[::-1], [0, 0], [1, 1, 1, 1, 1]])
                else:
                    i = rng.randrange(len(d))
                    d[i] = rng.choice([0, 1, d[i] + 1, d[i] - 1, d[i] * 2, 2 ** 31, 2 ** 40, 2 ** 63, 2 ** 64 - 1])
                t["dims"] = d
                if rng.random() < 0.2:
                    t["ndims"] = rng.choice([0, 5, 2 ** 32 - 1, len(d) + 1])
            elif what < 0.75:
                t["ttype"] = rng.choice([1, 30, 8, 2, 24, 26, 99, 2 ** 32 - 1])
            else:
                t["offset"] = rng.choice([1, 31, 2 ** 40, 2 ** 64 - 32, len(t["data"]), 0])
            log.append(f"tensor {_short(t['name'])} dims {t['dims']} type {t['ttype']} off {t.get('offset')}")
        elif r < 0.72 and ts:  # the numbers
            t = rng.choice(ts)
            a = np.frombuffer(t["data"], np.float32).copy()
            if a.size:
                k = rng.choice([1, 1, 2, a.size])
                idx = rng.sample(range(a.size), min(k, a.size))
                a[idx] = rng.choice(F32_SPECIAL)
                t["data"] = a.tobytes()
            log.append(f"values of {_short(t['name'])} -> {a[:3].tolist() if a.size else []}")
        elif r < 0.82 and ts:  # a tensor dropped, duplicated or its data cut / grown
            i = rng.randrange(len(ts))
            what = rng.random()
            if what < 0.4:
                log.append(f"drop tensor {ts[i]['name']}")
                del ts[i]
            elif what < 0.7:
                ts.insert(rng.randrange(len(ts) + 1), copy.deepcopy(ts[i]))
                log.append(f"dup tensor {ts[i]['name']}")
            else:
                t = ts[i]
                t["data"] = t["data"][:rng.randrange(len(t["data"]) + 1)] if rng.random() < 0.5 else t["data"] * 2
                log.append(f"data of {t['name']} now {len(t['data'])} bytes")
        elif r < 0.9:
            raw_len = len(gguf_bytes(g))
            g["cut"] = rng.randrange(max(raw_len, 1))
            log.append(f"cut at {g['cut']}")
        elif r < 0.95:
            g["align"] = rng.choice([1, 8, 64, 4096])
            log.append(f"align {g['align']} (no key)")
        else:
            g["tail"] = rng.choice([b"\0", b"GGUF" * 8, bytes(4096)])
            log.append("tail bytes")
    return g


def mutate_dat(rng, d, log):
    for _ in range(1 + (rng.random() < 0.4) + (rng.random() < 0.15)):
        r = rng.random()
        es = d["entries"]
        if r < 0.1:
            d["n_entries"] = rng.choice([0, -1, len(es) + 1, len(es) - 1, 2 ** 20, 2 ** 20 + 1, 2 ** 31 - 1, -2 ** 31])
            log.append(f"n_entries = {d['n_entries']}")
        elif r < 0.25 and es:
            e = rng.choice(es)
            what = rng.random()
            if what < 0.35:
                e["namelen"] = rng.choice([0, -1, len(e["name"]) + 1, len(e["name"]) - 1, 4096, 4097, 2 ** 31 - 1])
            elif what < 0.7:
                e["name"] = rng.choice([b"", b"\xff\xfe", b"x" * 4096, b"x" * 4097, b"blk.9.attn_q.weight",
                                        rng.choice(es)["name"], e["name"] + b"\0", b"\x1b[31m" + e["name"]])
            else:
                e["nval"] = rng.choice([0, -1, len(e["vals"]) + 1, len(e["vals"]) - 1, 2 ** 31 - 1, 1])
            log.append(f"entry {e['name'][:40]!r}: namelen {e.get('namelen')} nval {e.get('nval')}")
        elif r < 0.4 and es:
            e = rng.choice(es)
            e["ncall"] = rng.choice([0, -1, 1, 2 ** 31 - 1, -2 ** 31])
            log.append(f"ncall = {e['ncall']}")
        elif r < 0.6 and es:
            e = rng.choice(es)
            if e["vals"]:
                i = rng.randrange(len(e["vals"]))
                e["vals"][i] = rng.choice(F32_SPECIAL)
            if rng.random() < 0.2:
                e["vals"] = e["vals"][: rng.randrange(len(e["vals"]) + 1)] if rng.random() < 0.5 else e["vals"] * 2
            log.append(f"values of {e['name'][:40]!r}")
        elif r < 0.7 and es:
            i = rng.randrange(len(es))
            if rng.random() < 0.5:
                del es[i]
                log.append("drop entry")
            else:
                es.insert(rng.randrange(len(es) + 1), copy.deepcopy(es[i]))
                log.append("dup entry")
        elif r < 0.8:
            what = rng.random()
            if what < 0.3:
                d["chunks"] = None
            elif what < 0.6:
                d["chunks"] = rng.choice([-1, 0, 2 ** 31 - 1])
            else:
                d["dslen"] = rng.choice([-1, 0, 2 ** 31 - 1, len(d.get("dataset") or b"") + 5])
                d["dataset"] = rng.choice([b"", b"\xff" * 3, b"text", "é".encode()])
            log.append(f"trailer chunks {d['chunks']} dslen {d.get('dslen')}")
        elif r < 0.92:
            d["cut"] = rng.randrange(max(1, len(dat_bytes(d))))
            log.append(f"cut at {d['cut']}")
        else:
            d["tail"] = rng.choice([b"\0" * 3, b"GGUF", bytes(100)])
            log.append("tail bytes")
    return d


# ------------------------------------------------------------------------------------------- TOML writer

def _tkey(k) -> str:
    k = str(k)
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _tval(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_tval(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_tkey(k)} = {_tval(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))  # None: TOML has no null; a string


def toml_dumps(d: dict, prefix: str = "") -> str:
    """TOML text of a dict (tables as [sections], lists of dicts as [[arrays of tables]], other values inline)."""
    plain = {k: v for k, v in d.items() if not (isinstance(v, dict) or (isinstance(v, list) and v and all(isinstance(x, dict) for x in v)))}
    lines = [f"{_tkey(k)} = {_tval(v)}" for k, v in plain.items()]
    for k, v in d.items():
        if k in plain:
            continue
        name = f"{prefix}{_tkey(k)}"
        if isinstance(v, dict):
            lines.append(f"\n[{name}]")
            lines.append(toml_dumps(v, name + "."))
        else:
            for x in v:
                lines.append(f"\n[[{name}]]")
                lines.append(toml_dumps(x, name + "."))
    return "\n".join(ln for ln in lines if ln != "") + "\n"


def text_damage(rng, text: str, log) -> bytes:
    b = text.encode("utf-8", "surrogatepass")
    r = rng.random()
    if r < 0.2:
        lines = b.split(b"\n")
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        log.append("a line duplicated")
        return b"\n".join(lines)
    if r < 0.35:
        log.append("BOM")
        return b"\xef\xbb\xbf" + b
    if r < 0.5:
        i = rng.randrange(len(b) + 1)
        ins = rng.choice([b"\0", b"\xff\xfe", b"\xed\xa0\x80", b"\r", b'"', b"[", b"=", b"\n[x\n"])
        log.append(f"bytes {ins!r} at {i}")
        return b[:i] + ins + b[i:]
    if r < 0.65:
        log.append("CRLF")
        return b.replace(b"\n", b"\r\n")
    if r < 0.8:
        i = rng.randrange(len(b) + 1)
        log.append(f"cut at {i}")
        return b[:i]
    i = rng.randrange(max(1, len(b)))
    log.append(f"byte {i} flipped")
    return b[:i] + bytes([b[i] ^ (1 << rng.randrange(8))]) + b[i + 1:] if b else b


# ------------------------------------------------------------------------------------------- the environment

class Env:
    """What the cases share, made once per worker folder: the tiny model with its tokenizer, statistics
    gathered on it, packs with model records, the shipped TOML files, the calibration CSVs and configs."""

    def __init__(self, work: Path):
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self._app = None
        self._cli = None
        done = self.work / "env.done"
        if not done.exists():
            self._make()
            done.write_text("ok\n")
        self.hf = self.work / "hf"
        self.gguf_pack = self.work / "g.orkpack"
        self.hf_pack = self.work / "h.orkpack"

    @property
    def app(self):
        if self._app is None:
            from typer.testing import CliRunner

            from orkpack.cli import app

            self._app, self._cli = app, CliRunner()
        return self._app

    def invoke(self, argv: list[str]):
        app = self.app
        return self._cli.invoke(app, argv)

    def _make(self) -> None:
        from orkpack import synth
        from orkpack.build import BuildOptions, build
        from orkpack.stats import formats

        w = self.work
        hf = synth.write_hf_model(w / "hf", seed=0, **TINY)
        synth.write_tokenizer(hf)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(hf / name, w / f"orig.{name}")
        (w / "text.txt").write_text(TEXT)
        r = self.invoke(["imatrix", str(hf), "-o", str(w / "stats.gguf"), "--ctx", "32", "--chunks", "2",
                         "--text", str(w / "text.txt"), "--json"])
        if r.exit_code != 0:
            raise RuntimeError(f"orkpack imatrix failed: {r.stdout} {r.stderr}")
        st = formats.load(w / "stats.gguf")
        (w / "stats.json").write_text(json.dumps(imatrix_structure_json(imatrix_structure(st))))
        (w / "dat.json").write_text(json.dumps(dat_structure_json(dat_structure(st))))
        build(hf, w / "h.orkpack", BuildOptions(threads=1, plan=False))
        kv = _odd_kv()
        src = synth.write_gguf_model(w / "m.gguf", kv=kv, layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1,
                                     vocab=64)
        build(src, w / "g.orkpack", BuildOptions(threads=1, plan=False))
        # calibration CSVs: published.csv by runtime path, with the configs it names
        cal = w / "cal"
        shutil.copytree(ROOT / "docs" / "calibration" / "configs", cal / "configs")
        lines = (ROOT / "docs" / "calibration" / "published.csv").read_text(encoding="utf-8").splitlines()
        import csv as _csv

        head = next(_csv.reader([lines[0]]))
        ri = head.index("runtime")
        for rt in ("ggml-ork", "llama.cpp-cpu", "rkllm"):
            rows = [ln for ln in lines[1:] if next(_csv.reader([ln]))[ri] == rt]
            (cal / f"{rt}.csv").write_text("\n".join([lines[0]] + rows) + "\n", encoding="utf-8")


def _odd_kv():
    from gguf import GGUFValueType as VT

    return (
        ("test.u8", 200, VT.UINT8), ("test.i8", -100, VT.INT8), ("test.u16", 60000, VT.UINT16),
        ("test.i16", -30000, VT.INT16), ("test.u64", 2 ** 62 + 5, VT.UINT64), ("test.i64", -2 ** 62, VT.INT64),
        ("test.f64", 0.1, VT.FLOAT64), ("test.f32", 0.1, VT.FLOAT32), ("test.nan", math.nan, VT.FLOAT32),
        ("test.inf", -math.inf, VT.FLOAT64), ("test.flag", True, VT.BOOL), ("test.utf8", "Grüße ✓ 😀", VT.STRING),
        ("test.floats", [1.5, -0.0, 3.25e-5], VT.ARRAY, VT.FLOAT32), ("test.ints", [-1, 0, 7], VT.ARRAY, VT.INT32),
        ("tokenizer.ggml.model", "gpt2", VT.STRING),
        ("tokenizer.ggml.tokens", ["<s>", "a", "b", "ab", "Ġ"], VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.token_type", [3, 1, 1, 1, 1], VT.ARRAY, VT.INT32),
        ("tokenizer.ggml.merges", ["a b"], VT.ARRAY, VT.STRING),
        ("tokenizer.ggml.bos_token_id", 0, VT.UINT32),
        ("tokenizer.ggml.add_bos_token", True, VT.BOOL),
    )


def imatrix_structure_json(g):
    g = copy.deepcopy(g)
    for t in g["tensors"]:
        t["data"] = t["data"].hex()
    return g


def imatrix_structure_load(g):
    for t in g["tensors"]:
        t["data"] = bytes.fromhex(t["data"])
    for e in g["kv"]:
        if len(e) > 3 and e[3] is not None:
            e[3] = tuple(e[3])
    return g


def dat_structure_json(d):
    d = copy.deepcopy(d)
    for e in d["entries"]:
        e["name"] = e["name"].hex()
    d["dataset"] = d["dataset"].hex()
    return d


def dat_structure_load(d):
    for e in d["entries"]:
        e["name"] = bytes.fromhex(e["name"])
    d["dataset"] = bytes.fromhex(d["dataset"])
    return d


# ------------------------------------------------------------------------------------------- cases

@dataclass
class Case:
    kind: str
    index: int
    target: str  # what runs: see run_case
    files: dict  # file name (relative to the case folder) -> bytes
    argv: list  # the CLI arguments; "{D}" is the case folder, "{HF}" the tiny model, "{E}" the env folder
    inputs: list  # file names (in files) the command reads: must be unchanged
    named: list  # one of these must appear in an error line
    output: str | None = None  # the output path (relative to the case folder) that must be absent after a failure
    log: list = field(default_factory=list)
    post: str = ""  # a check of a success (see _post)


def make_case(env: Env, kind: str, seed: int, index: int) -> Case:
    rng = random.Random(f"orkpack-inputs:{kind}:{seed}:{index}")
    return globals()[f"case_{kind}"](env, rng, index)


def case_imatrix(env: Env, rng, index) -> Case:
    log: list = []
    if rng.random() < 0.6:
        g = imatrix_structure_load(json.loads((env.work / "stats.json").read_text()))
        mutate_imatrix_gguf(rng, g, log)
        data, name = gguf_bytes(g), rng.choice(["stats.gguf", "stats.dat", "stats"])
    else:
        d = dat_structure_load(json.loads((env.work / "dat.json").read_text()))
        mutate_dat(rng, d, log)
        data, name = dat_bytes(d), rng.choice(["stats.dat", "stats.gguf", "imatrix.dat"])
    if rng.random() < 0.6:
        argv = ["build", "{HF}", "-o", "{D}/out.orkpack", "--imatrix", "{D}/" + name, "--threads", "1", "--json"]
        if rng.random() < 0.3:
            argv.append("--no-plan")
        return Case("imatrix", index, "build", {name: data}, argv, [name], [name], "out.orkpack", log, "pack")
    argv = ["plan", "{HF}", "--profile", "{D}/" + name, "--json"]
    if name.endswith(".gguf") or name.endswith(".dat"):
        return Case("imatrix", index, "plan", {name: data}, argv, [name], [name], None, log, "json")
    argv[3] = "{D}/" + name + ".gguf"
    return Case("imatrix", index, "plan", {name + ".gguf": data}, argv, [name + ".gguf"], [name + ".gguf"], None, log, "json")


TOK_VALUES = {
    "type": ["BPE", "WordPiece", "Unigram", "WordLevel", "bpe", "", "Sequence", "ByteLevel", "Split", "Metaspace"],
    "tokenizer_class": ["GPT2Tokenizer", "LlamaTokenizer", "PreTrainedTokenizerFast", "", "Nope"],
    "bos_token": ["<|im_start|>", "<s>", "", "not-a-token", {"content": "<s>", "__type": "AddedToken"}, None, 5],
    "eos_token": ["<|im_end|>", "</s>", "", None, {"content": 7}],
    "chat_template": ["{{ messages }}", "{% for m in messages %}{{ m.content }}{% endfor %}", "{% if %}", 3,
                      [{"name": "default", "template": "{{ x }}"}], [{"name": 1}], None],
    "add_bos_token": [True, False, "yes", 1, None],
    "add_eos_token": [True, False, "no", 0],
    "model_max_length": [1e30, 2 ** 64, -1, 0, float("inf"), float("nan")],
    "id": [0, 1, -1, 2 ** 31, 2 ** 63, 2 ** 64, 511, 512, 10 ** 6, "3", 1.0],
    "content": ["", "<s>", "a", "\ud800", "x" * 5000, None, 3],
    "special": [True, False, "true", 1, None],
    "merges": [[], ["a b"], [["a", "b"]], ["ab"], ["a  b"], [" "], [1], "a b"],
    "vocab": [{}, {"a": 0}, {"a": -1}, {"a": 2 ** 40}, [["a", 0.0]], {"a": 0, "b": 0}, {"a": "0"}],
    "unk_token": ["<unk>", "", None, 0, "nonexistent"],
}


def _tok_values(rng, path, cur):
    key = next((k for k in reversed(path) if isinstance(k, str)), None)
    if key in TOK_VALUES:
        return rng.choice(TOK_VALUES[key])
    if isinstance(cur, dict) and "type" in cur:
        return dict(cur, type=rng.choice(TOK_VALUES["type"]))
    if isinstance(cur, int) and not isinstance(cur, bool):
        return rng.choice(TOK_VALUES["id"])
    return interesting(rng, cur)


def _json_text(rng, v, log) -> bytes:
    r = rng.random()
    if r < 0.85:
        return jdumps(v).encode("utf-8", "surrogatepass")
    if r < 0.9:
        log.append("1e400 / NaN token")
        return jdumps(v).replace("null", rng.choice(["NaN", "1e400", "-Infinity"]), 1).encode()
    return text_damage(rng, jdumps(v), log)


def case_tokenizer(env: Env, rng, index) -> Case:
    log: list = []
    files = {}
    which = rng.random()
    for name, p in (("tokenizer.json", 0.75), ("tokenizer_config.json", 0.4)):
        doc = json.loads((env.work / f"orig.{name}").read_text(encoding="utf-8"))
        if which < p or (name == "tokenizer_config.json" and which >= 0.75):
            if name == "tokenizer.json" and rng.random() < 0.3:  # a tokenizer-aware change first
                m = doc["model"]
                r = rng.random()
                if r < 0.3:
                    m["type"] = rng.choice(TOK_VALUES["type"])
                    log.append(f"model.type = {m['type']}")
                elif r < 0.6:
                    m["merges"] = [m2.split(" ") for m2 in m["merges"]] if rng.random() < 0.5 else m["merges"][::-1]
                    log.append("merges as pairs / reversed")
                else:
                    doc["added_tokens"].append({"id": rng.choice(TOK_VALUES["id"]), "content": rng.choice(["<x>", "a", ""]),
                                                "special": rng.choice([True, False]), "normalized": False,
                                                "lstrip": False, "rstrip": False, "single_word": False})
                    log.append(f"added token id {doc['added_tokens'][-1]['id']}")
            before = len(log)
            doc = mutate_tree(rng, doc, _tok_values, log=log)
            log[before:] = [f"{name}: {x}" for x in log[before:]]
            files[name] = _json_text(rng, doc, log)
        else:
            files[name] = (env.work / f"orig.{name}").read_bytes()
    if rng.random() < 0.08:
        gone = rng.choice(list(files))
        del files[gone]
        log.append(f"{gone} removed")
    names = list(files)
    return Case("tokenizer", index, "tokenizer", files, ["build", "{D}/hf", "-o", "{D}/out.orkpack", "--no-plan",
                "--threads", "1", "--json"], names, names + ["hf"], "out.orkpack", log, "tokenizer")


MODEL_TYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "uint64",
               "int64", "float64", "array[string]", "array[int32]", "array[float32]", "array[bool]", "array[uint64]",
               "array[array[int32]]", "array[array[string]]", "string]", "uint8]", "array[uint8", "array[]", "array[string]]",
               "array[[int32]", "array", "", "STRING", "float16", "array[array[array[array[array[array[array[array[array[int32]]]]]]]]]"]
LIMITS = {"uint8": [255, 256, -1], "int8": [-128, 127, -129, 128], "uint16": [65535, 65536], "int16": [-32768, 32768],
          "uint32": [2 ** 32 - 1, 2 ** 32, -1], "int32": [-2 ** 31, 2 ** 31 - 1, 2 ** 31],
          "uint64": [2 ** 64 - 1, 2 ** 64, 2 ** 63 - 1, 2 ** 63, -1], "int64": [-2 ** 63, 2 ** 63 - 1, 2 ** 63, -2 ** 63 - 1]}
MODEL_VALUES = [0, -0, 1, True, False, None, "nan", "inf", "-inf", "NaN", "", "\ud800", "\udcff", "x" * 5000,
                Raw("1e400"), Raw("-1e400"), Raw("1" + "0" * 400), Raw("-0"), Raw("-0.0"), Raw("1.0"), Raw("1E2"),
                Raw("5e-324"), Raw("3.4028235e38"), Raw("3.5e38"), Raw("1e-400"), 1.5, [], [1], ["a"], [[1]], {}, [True]]


def _model_value(rng, typ, cur):
    t = typ[6:-1] if isinstance(typ, str) and typ.startswith("array[") and typ.endswith("]") else typ
    pool = list(MODEL_VALUES)
    if isinstance(t, str) and t in LIMITS:
        pool += LIMITS[t] * 3
    v = rng.choice(pool)
    if isinstance(typ, str) and typ.startswith("array[") and rng.random() < 0.7:
        base = list(cur) if isinstance(cur, list) else []
        if base and rng.random() < 0.6:
            base[rng.randrange(len(base))] = v
            return base
        return [v] * rng.choice([0, 1, 2, 3])
    return v


def mutate_model(rng, model, log):
    kv = model.get("kv") if isinstance(model, dict) else None
    for _ in range(1 + (rng.random() < 0.5) + (rng.random() < 0.2)):
        r = rng.random()
        if r < 0.08:
            k = rng.choice(["source", "kv", "x"])
            v = rng.choice(["gguf", "hf", "GGUF", "", None, 1, [], {}, [["a", "string", "b"]]])
            if rng.random() < 0.3 and k in model:
                del model[k]
                log.append(f"model.{k} deleted")
            else:
                model[k] = v
                log.append(f"model.{k} = {_short(v)}")
            kv = model.get("kv") if isinstance(model.get("kv"), list) else None
        elif not isinstance(kv, list) or not kv:
            continue
        elif r < 0.3:
            e = rng.choice(kv)
            if isinstance(e, list) and len(e) == 3:
                e[1] = rng.choice(MODEL_TYPES)
                if rng.random() < 0.5:
                    e[2] = _model_value(rng, e[1], e[2])
                log.append(f"{_short(e[0])}: type {e[1]} value {_short(e[2])}")
        elif r < 0.6:
            e = rng.choice(kv)
            if isinstance(e, list) and len(e) == 3:
                e[2] = _model_value(rng, e[1], e[2])
                log.append(f"{_short(e[0])}: value {_short(e[2])}")
        elif r < 0.7:
            i = rng.randrange(len(kv))
            what = rng.random()
            e = kv[i]
            if what < 0.25 and isinstance(e, list):
                kv[i] = e[:2] if rng.random() < 0.5 else e + [0]
            elif what < 0.5 and isinstance(e, list):
                e[0] = rng.choice(["", 1, None, "\ud800", "a" * 5000, "general.architecture", "tokenizer.ggml.tokens",
                                   "tokenizer.huggingface.json", "tokenizer.ggml.model"])
            elif what < 0.75:
                kv.insert(rng.randrange(len(kv) + 1), copy.deepcopy(e))
            else:
                kv[i] = rng.choice([None, "x", 1, {}, [], {"key": "a"}])
            log.append(f"kv[{i}] -> {_short(kv[i] if i < len(kv) else None)}")
        elif r < 0.85:  # the tokenizer keys
            keys = {e[0]: e for e in kv if isinstance(e, list) and len(e) == 3 and isinstance(e[0], str)}
            pick = rng.choice(["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                               "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.bos_token_id",
                               "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token", "tokenizer.huggingface.json",
                               "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.add_space_prefix"])
            vals = {
                "tokenizer.ggml.model": [("string", "gpt2"), ("string", "llama"), ("string", "bert"), ("int32", 1)],
                "tokenizer.ggml.tokens": [("array[string]", []), ("array[string]", ["", "a", "a"]), ("array[int32]", [1, 2]),
                                          ("array[string]", ["\udcff", "ab"]), ("string", "abc")],
                "tokenizer.ggml.token_type": [("array[int32]", [3]), ("array[int32]", [3] * 9), ("array[int32]", [4, 4, 4]),
                                              ("array[string]", ["3"]), ("array[float32]", [3.0]), ("int32", 3)],
                "tokenizer.ggml.merges": [("array[string]", ["ab"]), ("array[string]", ["a b c"]), ("array[string]", [""]),
                                          ("array[int32]", [1]), ("array[array[string]]", [["a", "b"]])],
                "tokenizer.ggml.scores": [("array[float32]", ["nan", 1.0]), ("array[float32]", []), ("array[string]", ["x"]),
                                          ("array[float32]", [1e308] * 5)],
                "tokenizer.ggml.bos_token_id": [("uint32", 2 ** 32 - 1), ("int32", -1), ("uint32", 4), ("string", "0")],
                "tokenizer.ggml.pre": [("string", "llama3"), ("string", "qwen2"), ("int32", 0), ("string", "")],
                "tokenizer.ggml.add_bos_token": [("bool", True), ("string", "yes"), ("uint8", 1)],
                "tokenizer.huggingface.json": [("string", "{}"), ("string", "not json"), ("string", '{"model": 1}'),
                                               ("int32", 0), ("string", '{"version": "1.0", "model": {"type": "BPE"}}')],
                "tokenizer.ggml.unknown_token_id": [("uint32", 99999), ("int32", -5), ("uint32", 1)],
                "tokenizer.ggml.add_space_prefix": [("bool", False), ("string", "x")],
            }[pick]
            typ, v = rng.choice(vals)
            if pick in keys:
                keys[pick][1:] = [typ, v]
            else:
                kv.append([pick, typ, v])
            log.append(f"{pick} = [{typ}, {_short(v)}]")
        else:
            i = rng.randrange(len(kv))
            log.append(f"kv[{i}] deleted")
            del kv[i]
    return model


def case_model(env: Env, rng, index) -> Case:
    log: list = []
    src = env.gguf_pack if rng.random() < 0.5 else env.hf_pack
    hb, data, minor = harness.split_pack(src.read_bytes())
    h = json.loads(hb)
    if rng.random() < 0.05:
        h["model"] = rng.choice([None, [], "x", 1, {"source": "gguf"}])
        log.append(f"model = {h['model']!r}")
    else:
        mutate_model(rng, h["model"], log)
    raw = harness.forge_pack(jdumps(h).encode("ascii"), data, minor)
    r = rng.random()
    if r < 0.4:
        argv, target = ["verify", "{D}/m.orkpack", "--device", "host", "--json"], "verify"
    elif r < 0.7:
        argv, target = ["inspect", "{D}/m.orkpack", "--json"], "inspect"
    else:
        argv, target = ["eval", "{D}/m.orkpack", "--ctx", "16", "--chunks", "1", "--json"], "eval"
    return Case("model", index, target, {"m.orkpack": raw}, argv, ["m.orkpack"], ["m.orkpack"], None, log,
                "model:" + src.stem)


def _shipped_tomls():
    return {
        "board": sorted((ROOT / "tiermaps" / "boards").glob("*.toml")),
        "runtime": sorted((ROOT / "tiermaps" / "runtimes").glob("*.toml")),
    }


TOML_VALUES = {
    "schema": ["orkpack.board", "orkpack.runtime", "orkpack.cluster", "", 1],
    "version": [1, 2, 3, 4, 0, -1, "3", 3.0, True, 2 ** 63],
    "engines": [[], ["cpu"], ["npu"], ["npu", "cpu"], ["gpu", "cpu"], ["cpu", "cpu"], ["NPU", "cpu"], "cpu", [1], [["cpu"]]],
    "engine": ["cpu", "npu", "gpu", "", 1],
    "name": ["", "x", "a" * 5000, "\u202e", "line\nline", 1, None, "rk3588-8g"],
    "boards": [[], ["rk3588-8g"], ["rk3588-8g"] * 64, [""], ["nope"], ["/dev/null"], ["/"], [1], "rk3588-8g",
               ["{D}/cluster.toml"], ["{D}/runtime.toml"], ["{D}"], ["/dev/zero.toml"], ["{D}/missing.toml"]],
    "hosts": [[], ["a", "b"], ["a"], ["bad host"], ["[::1]", "[::1]"], ["a" * 300, "b"], [1, 2]],
    "ports": [[1, 2], [0, 1], [65536, 1], [8080, 8080], [True, 2], [1], [-1, 2], [2 ** 63, 1]],
    "cpus": ["4-7", "", "7-4", "0-99999", "a", "1,2,3", 4, "0" * 5000],
    "bind": ["0.0.0.0", "127.0.0.1", "", 0],
}


def _toml_values(rng, path, cur):
    key = path[-1] if path else None
    if key in TOML_VALUES:
        v = rng.choice(TOML_VALUES[key])
        return json.loads(json.dumps(v).replace("{D}", "@D@"))
    if isinstance(cur, (int, float)) and not isinstance(cur, bool):
        return rng.choice([0, -1, 1, 2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64, 10 ** 30, 0.0, -0.0, 1e-300, 5e-324,
                           1e300, 1e308, float("inf"), float("nan"), 1.5, str(cur), [cur], cur * 1e6, cur / 1e6])
    return interesting(rng, cur)


def _sub(x, d: Path):
    if isinstance(x, str):
        return x.replace("@D@", str(d))
    if isinstance(x, list):
        return [_sub(v, d) for v in x]
    if isinstance(x, dict):
        return {k: _sub(v, d) for k, v in x.items()}
    return x


def case_toml(env: Env, rng, index) -> Case:
    import tomllib

    log: list = []
    sub = rng.choice(["board", "runtime", "network", "cluster"])
    cfg = "{HF}/config.json"
    files: dict = {}
    if sub in ("board", "runtime"):
        src = rng.choice(_shipped_tomls()[sub])
        doc = tomllib.loads(src.read_text(encoding="utf-8"))
        log.append(f"from {src.name}")
    elif sub == "network":
        shipped = tomllib.loads((ROOT / "tiermaps" / "networks" / "networks.toml").read_text(encoding="utf-8"))
        doc = {"network": shipped[rng.choice(["1gbe", "2.5gbe", "10gbe"])]}
    else:
        doc = {"boards": ["rk3588-8g", "rk3588-16g"], "hosts": ["a", "b"], "ports": [50052, 50053], "cpus": "4-7",
               "bind": "0.0.0.0"}
        if rng.random() < 0.5:
            doc["network"] = {"latency_s": 0.0002, "bandwidth_bytes_per_s": 117.5e6, "round_trips_per_eval": 39}
        if rng.random() < 0.3:  # a board file among the names
            bdoc = tomllib.loads((ROOT / "tiermaps" / "boards" / "rk3588-8g.toml").read_text(encoding="utf-8"))
            if rng.random() < 0.5:
                bdoc = mutate_tree(rng, bdoc, _toml_values, log=log)
            files["b.toml"] = (toml_dumps(bdoc) if isinstance(bdoc, dict) else _tval(bdoc)).encode("utf-8", "surrogatepass")
            doc["boards"][0] = "@D@/b.toml"
    name = f"{sub}.toml"
    doc = mutate_tree(rng, doc, _toml_values, log=log)
    text = toml_dumps(doc) if isinstance(doc, dict) else _tval(doc)
    d = "{D}"
    files[name] = text_damage(rng, text, log) if rng.random() < 0.15 else text.encode("utf-8", "surrogatepass")
    files[name] = files[name].replace(b"@D@", d.encode())
    flag = {"board": ["--board"], "runtime": ["--runtime"], "cluster": ["--boards"],
            "network": ["--boards", "rk3588-8g,rk3588-8g", "--network"]}[sub]
    output, post = None, "json"
    if rng.random() < 0.12 and sub in ("board", "runtime"):
        argv = ["build", "{HF}", "-o", "{D}/out.orkpack", *flag, "{D}/" + name, "--threads", "1", "--json"]
        output, post = "out.orkpack", "pack"
    else:
        argv = ["plan", cfg, *flag, "{D}/" + name, "--json"]
        if rng.random() < 0.1:  # an output over the input: must be refused, the input untouched
            argv += ["-o", "{D}/" + name]
            log.append("-o over the input")
    return Case("toml", index, sub, files, argv, list(files), list(files), output, log, post)


CSV_CELLS = {
    "kind": ["matmul", "prefill", "ttft", "decode", "", "MATMUL", "x"],
    "engine": ["npu", "cpu", "gpu", ""],
    "encoding": ["int8", "nf4", "f16", "f32", ""],
    "choice": ["all-nf4", "all-int8", "all-float", "npu", "", "npu2"],
    "set": ["fit", "holdout", "", "train"],
    "runtime": ["ggml-ork", "rkllm", "llama.cpp-cpu", "", "other"],
    "config": ["configs/qwen2-0.5b.json", "configs/nope.json", "configs", "/dev/zero", "@CSV@", "/", "", "../cal/configs/llama3-8b.json",
               "configs/qwen2-0.5b.json\0", "x" * 5000, "@TOML@"],
}
NUMS = ["0", "-1", "1", "1e400", "-1e400", "nan", "inf", "1e-320", "1_000", "0x10", "١٢", " 12 ", "1" * 5000,
        "9" * 30, "2147483648", "9223372036854775808", "1.5", "1e308", "5e-324", "", "abc", "+3", "1e3"]


def case_csv(env: Env, rng, index) -> Case:
    import csv
    import io

    log: list = []
    rt = rng.choice(["ggml-ork", "llama.cpp-cpu", "rkllm"])
    text = (env.work / "cal" / f"{rt}.csv").read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text)))
    head = rows[0]
    for _ in range(1 + (rng.random() < 0.5) + (rng.random() < 0.25)):
        r = rng.random()
        if r < 0.45 and len(rows) > 1:
            i = rng.randrange(1, len(rows))
            j = rng.randrange(len(head))
            col = head[j] if j < len(head) else ""
            v = rng.choice(CSV_CELLS[col]) if col in CSV_CELLS else rng.choice(NUMS)
            while len(rows[i]) <= j:
                rows[i].append("")
            rows[i][j] = v
            log.append(f"row {i} {col} = {_short(v)}")
        elif r < 0.55:
            j = rng.randrange(len(head))
            what = rng.random()
            if what < 0.4:
                log.append(f"column {head[j]} dropped")
                for row in rows:
                    if j < len(row):
                        del row[j]
            elif what < 0.7:
                log.append(f"column {head[j]} duplicated")
                for row in rows:
                    if j < len(row):
                        row.insert(j, row[j])
            else:
                head[j] = rng.choice(["kinds", "", "KIND", "x" * 300, "runtime", "kind"])
                log.append(f"column {j} renamed {head[j]!r}")
        elif r < 0.63:
            perm = list(range(len(head)))
            rng.shuffle(perm)
            rows = [[row[p] for p in perm if p < len(row)] for row in rows]
            log.append("columns shuffled")
        elif r < 0.72 and len(rows) > 1:
            i = rng.randrange(1, len(rows))
            what = rng.random()
            if what < 0.35:
                rows[i] = rows[i] + ["extra"]
            elif what < 0.6:
                rows[i] = rows[i][:rng.randrange(len(rows[i]) + 1)]
            elif what < 0.8:
                rows.insert(i, list(rows[i]))
            else:
                del rows[i]
            log.append(f"row {i} changed length / duplicated / dropped")
        elif r < 0.8:
            rows = rows[:1] + rows[1:][:rng.randrange(len(rows))]
            log.append(f"rows cut to {len(rows) - 1}")
        elif r < 0.88 and len(rows) > 1:
            i = rng.randrange(1, len(rows))
            if "runtime" in head:
                j = head.index("runtime")
                if j < len(rows[i]):
                    rows[i][j] = rng.choice(["rkllm", "ggml-ork", "other"])
                    log.append(f"row {i} runtime {rows[i][j]}")
        else:
            rows.append([rng.choice(NUMS) for _ in head])
            log.append("a row of numbers")
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    body = out.getvalue()
    raw = text_damage(rng, body, log) if rng.random() < 0.15 else body.encode("utf-8", "surrogatepass")
    raw = raw.replace(b"@CSV@", b"times.csv").replace(b"@TOML@", b"base.toml")
    files = {"times.csv": raw, "base.toml": (ROOT / "tiermaps" / "runtimes" / f"{rt}.toml").read_bytes()}
    for c in (env.work / "cal" / "configs").glob("*.json"):
        files[f"configs/{c.name}"] = c.read_bytes()
    argv = ["calibrate", "{D}/times.csv", "-o", "{D}/out.toml", "--json"]
    output = "out.toml"
    r = rng.random()
    if r < 0.3:
        argv += ["--runtime", rt]
    elif r < 0.45:
        argv += ["--runtime", "{D}/base.toml"]
    elif r < 0.55:  # the output over an input
        argv = ["calibrate", "{D}/times.csv", "-o", "{D}/base.toml", "--runtime", "{D}/base.toml", "--json"]
        output = None
        log.append("-o over the --runtime input")
    inputs = list(files)
    return Case("csv", index, "calibrate", files, argv, inputs, ["times.csv", "base.toml", "configs/"], output, log,
                "runtime" if output else "")


# ------------------------------------------------------------------------------------------- running a case

@dataclass
class Outcome:
    ok: bool
    kind: str = ""  # exception | traceback | exit-code | multi-line | unnamed | leftover | changed | bad-output | hang | c-*
    sig: str = ""
    detail: str = ""
    code: int | None = None
    error: str = ""
    seconds: float = 0.0
    pack: bytes | None = None  # the pack a model / tokenizer case leaves for the C reader
    entries: list | None = None  # the Python reader's view of the pack's model record, per entry
    c: dict | None = None


def _signature(exc: BaseException, tb=None) -> str:
    frames = traceback.extract_tb(tb or exc.__traceback__)
    own = [f for f in frames if f"{os.sep}orkpack{os.sep}" in f.filename]
    f = (own or frames or [None])[-1]
    where = f"{Path(f.filename).name}:{f.name}:{f.lineno}" if f is not None else "?"
    return f"{type(exc).__name__} at {where}"


def _fill(argv: list, d: Path, env: Env) -> list:
    return [a.replace("{D}", str(d)).replace("{HF}", str(env.hf)).replace("{E}", str(env.work)) for a in argv]


def python_entries(model) -> list:
    """Per entry of a model record: ("good", type, count, digest) or ("bad", why) as the Python reader sees it
    (orkpack.pack.model.check_type and value); ("crash", signature) when the reader raised."""
    from orkpack.pack import model as M

    out = []
    kv = model.get("kv") if isinstance(model, dict) else None
    for e in kv if isinstance(kv, list) else []:
        try:
            if not (isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and e[0]):
                out.append(("bad", "not an entry"))
                continue
            why = M.check_type(e[1], e[2])
            if why:
                out.append(("bad", why))
                continue
            v = M.value(e)
            typ = e[1]
            n = len(v) if typ.startswith("array[") else 1
            inner = typ[6:-1] if typ.startswith("array[") else typ
            if inner.startswith("array["):
                out.append(("nested", typ, n))
            elif inner == "uint64" and any(x > 2 ** 63 - 1 for x in (v if typ.startswith("array[") else [v])):
                out.append(("u64", typ, n))
            else:
                out.append(("good", typ, n, harness.model_entry_digest(typ, v)))
        except Exception as ex:  # noqa: BLE001 - the reader's own crash is the finding
            out.append(("crash", _signature(ex)))
    return out


def _check_cli(res, allowed=(0, 2), want_json=False) -> Outcome:
    from orkpack.errors import OrkError

    if res.exception is not None and not isinstance(res.exception, SystemExit):
        exc = res.exception
        tb = res.exc_info[2] if res.exc_info else None
        detail = "".join(traceback.format_exception(type(exc), exc, tb))[-3000:]
        if isinstance(exc, OrkError):
            return Outcome(False, "exception", "OrkError escaped the CLI", detail)
        return Outcome(False, "exception", _signature(exc, tb), detail)
    out, err = res.stdout or "", res.stderr or ""
    if "Traceback (most recent call last)" in out + err:
        return Outcome(False, "traceback", "traceback in output", (out + err)[-3000:])
    if res.exit_code not in allowed:
        return Outcome(False, "exit-code", f"exit {res.exit_code}", (out + err)[-3000:], res.exit_code)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    stray = [ln for ln in lines if not ln.startswith(("error: ", "warning: ", "info: "))]
    if res.exit_code == 2:
        if len(errors) != 1 or stray:
            return Outcome(False, "multi-line", "exit 2 without exactly one error line", err[-3000:], 2)
        return Outcome(True, code=2, error=errors[0][len("error: "):])
    if res.exit_code == 0 and (errors or stray):
        return Outcome(False, "multi-line", "exit 0 with error or stray stderr lines", err[-3000:], 0)
    if res.exit_code == 0 and want_json:
        def _no_constant(c):
            raise ValueError(f"non-standard JSON constant {c}")
        try:
            json.loads(out, parse_constant=_no_constant)
        except ValueError as e:
            return Outcome(False, "bad-output", f"stdout is not strict JSON ({type(e).__name__})", out[:2000], 0)
    return Outcome(True, code=res.exit_code)


def run_case(env: Env, case: Case) -> Outcome:
    d = env.work / f"case-{os.getpid()}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    if case.kind == "tokenizer":
        shutil.copytree(env.hf, d / "hf")
        for n in ("tokenizer.json", "tokenizer_config.json"):
            (d / "hf" / n).unlink(missing_ok=True)
    for name, data in case.files.items():
        p = (d / "hf" / name) if case.kind == "tokenizer" else d / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    inputs = {n: ((d / "hf" / n) if case.kind == "tokenizer" else d / n) for n in case.inputs}
    before = {n: hashlib.sha256(p.read_bytes()).hexdigest() for n, p in inputs.items()}
    argv = _fill(case.argv, d, env)
    t0 = time.perf_counter()
    allowed = (0, 1, 2) if case.kind == "model" else (0, 2)  # 1: a damaged pack
    res = env.invoke(argv)
    o = _check_cli(res, allowed, want_json="--json" in argv)
    o.seconds = time.perf_counter() - t0
    if not o.ok:
        return o
    changed = [n for n, p in inputs.items() if not p.exists() or hashlib.sha256(p.read_bytes()).hexdigest() != before[n]]
    if changed:
        return Outcome(False, "changed", f"{case.argv[0]}: an input changed ({changed[0]})", ", ".join(changed), o.code)
    if o.code == 2 and not any(n.rstrip("/") in o.error for n in case.named):
        return Outcome(False, "unnamed", f"{case.argv[0]}: the error line names no input: " + _shape(o.error),
                       o.error, 2, o.error)
    if case.output:
        outp = d / case.output
        left = [x.name for x in outp.parent.iterdir() if x.name.startswith(outp.name) or x.name.startswith("." + outp.name)]
        if o.code != 0 and left:
            return Outcome(False, "leftover", f"{case.argv[0]}: a failure left files at the output", ", ".join(left), o.code)
        if o.code == 0:
            bad = _post(env, case, outp, d)
            if bad:
                return Outcome(False, "bad-output", f"{case.argv[0]}: " + bad, bad, 0)
    if case.kind in ("model", "tokenizer"):
        return _model_followups(env, case, d, o)
    return o


def _post(env: Env, case: Case, outp: Path, d: Path) -> str:
    from orkpack.errors import OrkError

    if not outp.exists():
        return "exit 0 but no output"
    if case.post in ("pack", "tokenizer"):
        from orkpack.pack.reader import Pack

        try:
            Pack.open(outp).close()
        except OrkError as e:
            return f"the written pack does not open ({e})"
    elif case.post == "runtime":
        from orkpack.tiers.runtime import load_runtime

        try:
            load_runtime(outp)
        except OrkError as e:
            return f"the written runtime file does not load ({e})"
    return ""


def _model_followups(env: Env, case: Case, d: Path, o: Outcome) -> Outcome:
    """The pack of a model case (or the one a tokenizer case built): the Python reader's view of its model
    record (for the comparison with the C reader), and for a built pack, eval and inspect on it."""
    p = d / ("m.orkpack" if case.kind == "model" else "out.orkpack")
    if not p.exists():
        return o
    from orkpack.errors import OrkError
    from orkpack.pack.reader import Pack

    try:
        with Pack.open(p) as pk:
            model = pk.header.get("model")
    except OrkError:
        model = None
    o.pack = p.read_bytes()
    o.entries = python_entries(model)
    crash = next((e for e in o.entries if e[0] == "crash"), None)
    if crash:
        return Outcome(False, "exception", f"model record entry: {crash[1]}", "", o.code, pack=o.pack, entries=o.entries)
    if case.kind == "tokenizer" and o.code == 0:
        for argv in (["eval", str(p), "--ctx", "16", "--chunks", "1", "--json"], ["inspect", str(p), "--json"]):
            res = env.invoke(argv)
            o2 = _check_cli(res, (0, 2), want_json=True)
            if not o2.ok:
                o2.sig = f"{argv[0]} of the built pack: {o2.sig}"
                o2.pack, o2.entries = o.pack, o.entries
                return o2
            if o2.code == 2 and "out.orkpack" not in o2.error:
                return Outcome(False, "unnamed", f"{argv[0]} of the built pack: the error names no input: "
                               + _shape(o2.error), o2.error, 2, pack=o.pack, entries=o.entries)
    return o


def _shape(msg: str) -> str:
    msg = re.sub(r"'[^']*'|\"[^\"]*\"", "S", msg)
    msg = re.sub(r"/\S+", "PATH", msg)
    msg = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", msg)
    return " ".join(msg.split()[:10])


# ------------------------------------------------------------------------------------------- workers

class _Hang(BaseException):
    pass


def _alarm(_s, _f):
    raise _Hang()


def run_guarded(env: Env, case: Case) -> Outcome:
    import signal

    # TIMEOUT seconds of this process's CPU time (a loaded shared box does not make a slow case a hang), and
    # WALL_TIMEOUT of wall time as a backstop (a case blocked on something)
    old = signal.signal(signal.SIGPROF, _alarm), signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_PROF, TIMEOUT)
    signal.setitimer(signal.ITIMER_REAL, WALL_TIMEOUT)
    t0 = time.perf_counter()
    try:
        return run_case(env, case)
    except _Hang as e:
        return Outcome(False, "hang", f"hang (> {TIMEOUT:.0f} s CPU) at " + _signature(e).split(" at ", 1)[1],
                       traceback.format_exc()[-3000:], seconds=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - the harness's own trouble is reported, never hidden
        return Outcome(False, "harness", _signature(e), traceback.format_exc()[-3000:])
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGPROF, old[0])
        signal.signal(signal.SIGALRM, old[1])


def outcomes(env: Env, cases: list[Case], fork: bool = True) -> list[Outcome]:
    """run_guarded on each case, in a forked child per batch (one per case again if the child dies)."""
    if not fork:
        return [run_guarded(env, c) for c in cases]
    return harness.forked_map(lambda c: run_guarded(env, c), cases,
                              lambda how: Outcome(False, "native", f"the worker process was {how}"),
                              address_space=4 << 30)


# ------------------------------------------------------------------------------------------- the C reader

def c_check(exe: Path, packs: list[tuple[Path, Outcome]]) -> list[tuple[str, str, str]]:
    """Findings of the C reader on packs with the Python outcomes beside them: its exit code against
    ``orkpack verify``'s (run here, the Python reader) and, with ``--model``, each model entry against the Python
    reader's view."""
    import fuzz_structure as fs

    if not packs:
        return []
    paths = [p for p, _ in packs]
    findings = []
    couts = fs.CReader(exe).check(paths)
    pys = fs.python_outcomes(paths)
    for (p, o), c, py in zip(packs, couts, pys):
        if c.crash:
            findings.append((str(p), "c-crash", c.crash))
        elif py.crash:
            findings.append((str(p), "python-crash", py.crash))
        elif c.code != py.code:
            findings.append((str(p), "c-diff", f"verify {py.code} ({fs._norm(py.msg)}) / orkpack-check {c.code}"))
    for p, o in packs:
        res = subprocess.run([str(exe), "--model", str(p)], capture_output=True, text=True, errors="replace",
                             timeout=60)
        if fs.SAN_RE.search(res.stderr) or res.returncode not in (0, 1, 2):
            findings.append((str(p), "c-crash", f"--model: exit {res.returncode} {fs.SAN_RE.findall(res.stderr)[:1]}"))
            continue
        lines = [ln.split("\t", 4) for ln in res.stdout.splitlines() if ln.startswith("kv\t")]
        if res.returncode != 0:
            continue  # the pack itself is refused: no record read
        want = o.entries or []
        if len(lines) != len(want):
            findings.append((str(p), "c-model", f"{len(lines)} entries in C, {len(want)} in Python"))
            continue
        for i, (ln, w) in enumerate(zip(lines, want)):
            val = ln[4] if len(ln) == 5 else "?"
            cbad = val.startswith("bad ")
            if w[0] == "good":
                if cbad or val != w[3] or ln[3] != str(w[2]):
                    findings.append((str(p), "c-model", f"entry {i} ({w[1]}): Python reads it, C says "
                                     f"{_shape(val[:120])!r}"))
                    break
            elif w[0] == "bad":
                if not cbad:
                    findings.append((str(p), "c-model", f"entry {i} type {_shape(ln[2][:60])!r}: Python refuses it "
                                     f"({_shape(w[1])}), C reads it"))
                    break
            elif w[0] in ("nested", "u64"):
                if not cbad:
                    findings.append((str(p), "c-model", f"entry {i}: C reads a {w[0]} entry"))
                    break
    return findings


def build_check(out: Path, sanitize: bool = False) -> Path:
    import fuzz_structure as fs

    return fs.build_check(out, sanitize)


# ------------------------------------------------------------------------------------------- campaigns

@dataclass
class Finding:
    kind: str
    sig: str
    case: Case
    outcome: Outcome | None
    count: int = 1
    detail: str = ""


@dataclass
class Stats:
    cases: int = 0
    wall: float = 0.0
    codes: dict = field(default_factory=dict)
    c_packs: int = 0
    findings: dict = field(default_factory=dict)


def fuzz(env: Env, kind: str, *, seed: int = 0, cases: int | None = None, seconds: float | None = None,
         batch: int = 40, check: Path | None = None, fork: bool = True, log=print, start: int = 0) -> Stats:
    if cases is None and seconds is None:
        raise ValueError("give cases or seconds")
    st = Stats()
    t0 = time.monotonic()
    i = start
    while True:
        n = batch if cases is None else min(batch, start + cases - i)
        if n <= 0 or (seconds is not None and time.monotonic() - t0 >= seconds):
            break
        cs = [make_case(env, kind, seed, j) for j in range(i, i + n)]
        outs = outcomes(env, cs, fork)
        packs = []
        cdir = env.work / f"cpacks-{os.getpid()}"
        shutil.rmtree(cdir, ignore_errors=True)
        cdir.mkdir()
        for c, o in zip(cs, outs):
            st.codes[o.code] = st.codes.get(o.code, 0) + 1
            if not o.ok:
                _note(st, kind, o.sig, c, o, log)
            if check is not None and o.pack is not None:
                p = cdir / f"c{c.index}.orkpack"
                p.write_bytes(o.pack)
                packs.append((p, o))
        if check is not None and packs:
            st.c_packs += len(packs)
            byname = {str(p): c for (p, _), c in zip(packs, [c for c, o in zip(cs, outs) if o.pack is not None])}
            for path, fkind, sig in c_check(check, packs):
                _note(st, kind, f"[{fkind}] {sig}", byname[path], None, log)
        i += n
    st.cases = i - start
    st.wall = time.monotonic() - t0
    return st


def _note(st: Stats, kind: str, sig: str, case: Case, o: Outcome | None, log) -> None:
    f = st.findings.get(sig)
    if f:
        f.count += 1
        return
    st.findings[sig] = Finding(kind, sig, case, o, detail=o.detail if o else "")
    log(f"FINDING [{kind}] {sig}  (case {case.index}; {'; '.join(case.log)[:300]})")


def save_finding(f: Finding, folder: Path, seed: int) -> Path:
    """The case's input files and a sidecar (kind, seed, index, argv, the finding) under ``folder``."""
    name = f"{f.kind}-{hashlib.sha256(f.sig.encode()).hexdigest()[:10]}"
    d = folder / name
    d.mkdir(parents=True, exist_ok=True)
    for fn, data in f.case.files.items():
        if f.case.kind == "csv" and fn.startswith("configs/"):
            continue  # the CSV regressions take their configs from docs/calibration/configs
        (d / fn).parent.mkdir(parents=True, exist_ok=True)
        (d / fn).write_bytes(data)
    (d / "case.json").write_text(json.dumps({
        "kind": f.kind, "seed": seed, "index": f.case.index, "argv": f.case.argv, "inputs": f.case.inputs,
        "named": f.case.named, "output": f.case.output, "post": f.case.post, "mutations": f.case.log,
        "finding": f.sig, "expect": None, "note": "expect: {code, message substring} once the finding is fixed",
    }, indent=1, ensure_ascii=True) + "\n")
    return d


def _generic(text: str, d: Path, env: Env) -> str:
    """An error line with the case folder and the environment's paths spelled as the argv templates spell them."""
    return text.replace(str(d), "{D}").replace(str(env.hf), "{HF}").replace(str(env.work), "{E}")


def save_case(env: Env, kind: str, seed: int, index: int, folder: Path, finding: str) -> Path:
    """Case ``index`` of ``seed`` saved as a regression (after its fix): its input files and a sidecar with the
    command and the outcome it must keep (exit code and error line); raises if the case is not clean now."""
    case = make_case(env, kind, seed, index)
    o = run_guarded(env, case)
    if not o.ok:
        raise RuntimeError(f"{kind} case {index} of seed {seed} is still a finding: {o.sig}")
    f = Finding(kind, finding, case, o)
    d = save_finding(f, folder, seed)
    side = json.loads((d / "case.json").read_text())
    side["expect"] = {"code": o.code, "error": _generic(o.error, env.work / f"case-{os.getpid()}", env)}
    side["note"] = "found by fuzz/fuzz_inputs.py before its fix; replayed by tests/test_fuzz_inputs.py"
    (d / "case.json").write_text(json.dumps(side, indent=1, ensure_ascii=True) + "\n")
    return d


def replay_saved(env: Env, d: Path) -> tuple[Outcome, dict]:
    """Run a saved regression; (outcome, sidecar)."""
    side = json.loads((d / "case.json").read_text())
    o = run_guarded(env, load_saved(d))
    o.error = _generic(o.error, env.work / f"case-{os.getpid()}", env)
    return o, side


def load_saved(d: Path) -> Case:
    side = json.loads((d / "case.json").read_text())
    files = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.name != "case.json":
            files[str(p.relative_to(d))] = p.read_bytes()
    if side["kind"] == "csv":
        for c in (ROOT / "docs" / "calibration" / "configs").glob("*.json"):
            files.setdefault(f"configs/{c.name}", c.read_bytes())
    return Case(side["kind"], side["index"], side.get("target", side["argv"][0]), files, side["argv"], side["inputs"],
                side["named"], side.get("output"), side.get("mutations", []), side.get("post", ""))


def subprocess_sample(env: Env, kind: str, seed: int, n: int, log=print) -> int:
    """``n`` cases through ``python -m orkpack`` in a child process: exit 0/2 (1 for verify/inspect), no
    traceback, one error line naming the input. Returns the number of findings (printed)."""
    bad = 0
    for j in range(n):
        case = make_case(env, kind, seed, j)
        d = env.work / f"case-{os.getpid()}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        if kind == "tokenizer":
            shutil.copytree(env.hf, d / "hf")
        for name, data in case.files.items():
            p = (d / "hf" / name) if kind == "tokenizer" else d / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        argv = _fill(case.argv, d, env)
        res = subprocess.run([sys.executable, "-m", "orkpack", *argv], capture_output=True, text=True,
                             errors="replace", timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        allowed = (0, 1, 2) if kind == "model" else (0, 2)
        errs = [ln for ln in res.stderr.splitlines() if ln.startswith("error: ")]
        problem = None
        if "Traceback" in res.stdout + res.stderr:
            problem = "traceback"
        elif res.returncode not in allowed:
            problem = f"exit {res.returncode}"
        elif res.returncode == 2 and (len(errs) != 1 or not any(x.rstrip("/") in errs[0] for x in case.named)):
            problem = "not one error line naming the input: " + res.stderr[-300:]
        if problem:
            bad += 1
            log(f"SUBPROCESS FINDING [{kind}] case {j}: {problem}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default=",".join(KINDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int)
    ap.add_argument("--seconds", type=float, help="per kind")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--check", type=Path, help="an orkpack-check (default: built in a temp folder, for model/tokenizer)")
    ap.add_argument("--sanitize", action="store_true", help="build orkpack-check with ASan + UBSan")
    ap.add_argument("--no-c", action="store_true")
    ap.add_argument("--no-fork", action="store_true")
    ap.add_argument("--work", type=Path, help="the environment folder (default: a temp folder, removed)")
    ap.add_argument("--save", type=Path, nargs="?", const=REGRESSIONS)
    ap.add_argument("--replay", type=int, help="run this one case and print its mutations and outcome")
    ap.add_argument("--subprocess", type=int, metavar="N", help="also N cases per kind through python -m orkpack")
    ap.add_argument("--save-case", nargs=2, metavar=("INDEX", "NOTE"), help="save case INDEX of --seed "
                    "(one --kind) as a regression under fuzz/regressions/inputs/ with its outcome now (after the "
                    "fix); NOTE: what it found")
    a = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    kinds = [k.strip() for k in a.kind.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown kind {k}; kinds: {', '.join(KINDS)}")
    tmp = Path(tempfile.mkdtemp(prefix="orkpack-inputs-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        env = Env(a.work or tmp / "env")
        check = a.check
        if not a.no_c and check is None and {"model", "tokenizer"} & set(kinds):
            check = build_check(tmp / "c", a.sanitize)
        if a.save_case:
            print(save_case(env, kinds[0], a.seed, int(a.save_case[0]), REGRESSIONS, a.save_case[1]))
            return 0
        if a.replay is not None:
            for k in kinds:
                c = make_case(env, k, a.seed, a.replay)
                print(f"[{k}] case {a.replay}: {c.argv}\n  mutations: {c.log}")
                o = run_guarded(env, c)
                print(f"  outcome: ok={o.ok} code={o.code} {o.kind} {o.sig}\n  error: {o.error}\n{o.detail[-2000:]}")
            return 0
        if a.cases is None and a.seconds is None:
            a.cases = 200
        total = 0
        for k in kinds:
            st = fuzz(env, k, seed=a.seed, cases=a.cases, seconds=a.seconds, batch=a.batch,
                      check=None if a.no_c or k not in ("model", "tokenizer") else check, fork=not a.no_fork,
                      start=a.start)
            print(f"[{k}] seed {a.seed}: {st.cases} cases in {st.wall / 60:.2f} min "
                  f"({st.cases / max(st.wall, 1e-9):.1f}/s); exit codes {dict(sorted(st.codes.items(), key=str))}; "
                  f"C reader on {st.c_packs} packs; {len(st.findings)} findings")
            for f in st.findings.values():
                print(f"  [{k}] {f.sig}: {f.count} cases (first: case {f.case.index})")
                if a.save:
                    print(f"    saved {save_finding(f, a.save, a.seed)}")
            total += len(st.findings)
            if a.subprocess:
                total += subprocess_sample(env, k, a.seed, a.subprocess)
                print(f"[{k}] {a.subprocess} cases through python -m orkpack checked")
        return 1 if total else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
