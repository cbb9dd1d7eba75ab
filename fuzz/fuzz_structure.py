"""Structure-aware fuzzer of both pack readers: the Python reference (orkpack/pack/reader.py, verify.py)
and the C reader (kernels/reader: liborkpack + orkpack-check).

Byte-level fuzzing (fuzz/fuzz.py, kernels/reader/fuzz_reader.c) rarely gets a header that parses and
passes its checksums and is still wrong in an interesting way. This one starts from good packs (built
in-process with orkpack.synth + orkpack.build, or PackWriter for raw tensors and multi-segment
layouts; cached in a temp folder), parses the header JSON, mutates it (values swapped for huge,
negative, float, NaN-like, string, null, list or dict values; deleted, added and duplicated keys;
subtrees copied or swapped between slices and tensors; shapes, offsets and sizes nudged by +-1, x2, to
0, to 2**63, shapes changed coherently; k_segments, encodings, tiers, layouts and dtypes swapped;
parts pointed at other parts' bytes; bytes inside parts changed; the version minor changed),
re-serializes it and rewrites the pack with every checksum recomputed (preamble, header, data and,
when a mutation moved a part or changed bytes, the part checksums: fuzz/harness.py forge_pack,
refresh_part_checksums), so that each mutation reaches the semantic checks. Then:

* python: ``verify_pack`` in-process (Pack.open, then every check of ``orkpack verify``), and again
  with ``--reference --keep-going``; any exception other than orkpack's own errors is a finding;
* c: ``orkpack-check`` on a batch of packs per process (hundreds per invocation); a crash, a
  sanitizer report (``--sanitize``: built with clang -fsanitize=address,undefined), a hang or an exit
  code other than 0/1/2 is a finding;
* diff: the two exit codes (0 passed, 1 damaged, 2 unusable) must be equal; a difference is a finding.

    python fuzz/fuzz_structure.py --seconds 600 --seed 1 --sanitize
    python fuzz/fuzz_structure.py --cases 2000 --seed 7 --check /tmp/b/orkpack-check
    python fuzz/fuzz_structure.py --write-corpus fuzz/structure_corpus     # the small saved seed corpus

Deterministic: case i of seed S is the same mutation of the same seed pack whatever the batch size,
time limit or machine. Every finding is minimized (mutations dropped, tensors dropped, unreferenced
data pages dropped, metadata emptied, while the finding stays the same) and saved under
fuzz/regressions/ (``--save``) as NAME.orkpack with NAME.json beside it: "expect" is the exit code both
readers must give (null until a human decides, for a disagreement), and the mutations that made it.
tests/test_fuzz_structure.py replays fuzz/regressions/ and fuzz/structure_corpus/ through both readers
and runs a bounded sample of this fuzzer.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import random
import re
import shutil
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

from orkpack.errors import OrkError  # noqa: E402
from orkpack.pack import spec  # noqa: E402

CORPUS = ROOT / "fuzz" / "structure_corpus"
REGRESSIONS = ROOT / "fuzz" / "regressions"
SEEDS_VERSION = "4"  # bump when the seed set changes (names the cache folder)
ALIGN = spec.ALIGN


# ------------------------------------------------------------------ JSON with tokens json.dumps never writes

class Raw(str):
    """A JSON token written verbatim: NaN, Infinity, 1e400, -0, a 4301-digit number, ..."""


class DupDict(dict):
    """A JSON object written with repeated keys: ``extra`` holds (key, value, first) members, written
    before (first) or after the dict's own members. Python's json keeps the last value of a key, at
    the position of its first occurrence."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.extra: list = []


def dumps(v) -> str:
    """JSON text of ``v`` (ASCII, Python's escapes), with Raw tokens and DupDict's repeated keys."""
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, dict):
        items = [(k, x) for k, x, first in getattr(v, "extra", ()) if first] + list(v.items()) + \
                [(k, x) for k, x, first in getattr(v, "extra", ()) if not first]
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(x) for k, x in items) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    if isinstance(v, float) and v != v:
        return "NaN"
    return json.dumps(v)


def enc_value(v):
    """A mutation value as plain JSON (for the sidecar): Raw tokens as {"$raw": token}."""
    if isinstance(v, Raw):
        return {"$raw": str(v)}
    if isinstance(v, dict):
        return {k: enc_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [enc_value(x) for x in v]
    return v


def dec_value(v):
    if isinstance(v, dict):
        if list(v) == ["$raw"]:
            return Raw(v["$raw"])
        return {k: dec_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [dec_value(x) for x in v]
    return v


# ------------------------------------------------------------------ seed packs

TINY = dict(layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=64)


def _writer_pack(path: Path) -> Path:
    """PackWriter: raw tensors (i64 2-D, bool 3-D, f64 0-D, c64 1-D), an int8 NPU slice cut in 3 K
    segments (k_segment 32, N not a multiple of 32), an nf4 NPU slice inflated with k_segment 64 and a
    host copy, an nf4dq host slice (format 1.5: two absmax groups, a block tail), stacked host int8
    experts, f16/bf16/f32 host slices."""
    import numpy as np
    import xxhash

    from orkpack.codecs.reference import int8_encode, nf4_encode
    from orkpack.layout import npu_layout, tile_int8
    from orkpack.pack.writer import PackWriter
    from orkpack.runtime.inflate import inflate_reference

    r = np.random.default_rng(5)
    with PackWriter(path, provenance={"source_format": "test", "sources": [], "arch": None, "options": {},
                                      "skipped": []}, config={"hidden_size": 80}, tiermap=None) as w:
        def raw(a, dt):
            return dict(expert=None, shape=list(np.shape(a)), encoding="raw", dtype=dt, tier="host",
                        layout={"kind": "row_major"}, parts={"data": a}, sqnr_db=None)

        w.add_tensor("ids", "token_type_ids", [3, 4], "I64", [raw(np.arange(-3, 9, dtype=np.int64).reshape(3, 4), "i64")])
        w.add_tensor("mask", "mask", [2, 2, 3], "BOOL", [raw(np.arange(12).reshape(2, 2, 3) % 3 == 0, "bool")])
        w.add_tensor("pi", "pi", [], "F64", [raw(np.array(np.pi), "f64")])
        w.add_tensor("rot", "rot", [3], "C64", [raw(np.array([1 + 2j, 3, -1j], np.complex64), "c64")])
        x = r.standard_normal((40, 80)).astype(np.float32)
        q, s = int8_encode(x)
        w.add_tensor("blk.0.attn_q.weight", "q_proj", [40, 80], "F32", [dict(
            expert=None, shape=[40, 80], encoding="int8", tier="npu", layout=npu_layout(40, 80, 32),
            parts={"q": tile_int8(q, 32), "scale": s}, sqnr_db=40.0, min_m=8)])
        y = r.standard_normal((33, 96)).astype(np.float32)
        codes, absmax = nf4_encode(y)
        iq, isc, lay = inflate_reference(codes, absmax, (33, 96), 64)
        w.add_tensor("blk.0.ffn_up.weight", "up", [33, 96], "F32", [dict(
            expert=None, shape=[33, 96], encoding="nf4", tier="npu", layout={"kind": "row_major"},
            parts={"codes": codes, "absmax": absmax}, sqnr_db=20.0, min_m=4,
            inflate={"layout": lay, "q_xxh3": xxhash.xxh3_64_hexdigest(iq), "q_size": int(iq.size),
                     "scale_xxh3": xxhash.xxh3_64_hexdigest(isc)},
            host_copy={"encoding": "nf4", "parts": {"codes": codes, "absmax": absmax}, "sqnr_db": 20.0})])
        from orkpack.codecs import get_codec

        z = r.standard_t(3, size=(9, 1001)).astype(np.float32)
        w.add_tensor("blk.0.ffn_down.weight", "down", [9, 1001], "F32", [dict(
            expert=None, shape=[9, 1001], encoding="nf4dq", tier="host", layout={"kind": "row_major"},
            parts=dict(get_codec("nf4dq").encode(z).parts), sqnr_db=19.0)])
        e = r.integers(-127, 128, size=(3, 40), dtype=np.int8)
        w.add_tensor("blk.0.ffn_down_exps.weight", "d", [2, 3, 40], "F16", [dict(
            expert=i, shape=[3, 40], encoding="int8", tier="host", layout={"kind": "row_major"},
            parts={"q": e + i, "scale": np.ones(3, np.float32)}, sqnr_db=30.0) for i in range(2)])
        w.add_tensor("n16", "n16", [8], "F16", [dict(expert=None, shape=[8], encoding="f16", tier="host",
                     layout={"kind": "row_major"}, parts={"data": np.ones(8, np.float16)}, sqnr_db=None)])
        w.add_tensor("nbf", "nbf", [2, 4], "BF16", [dict(expert=None, shape=[2, 4], encoding="bf16", tier="host",
                     layout={"kind": "row_major"}, parts={"data": np.ones((2, 4), np.uint16)}, sqnr_db=None)])
        w.add_tensor("n32", "n32", [5], "F32", [dict(expert=None, shape=[5], encoding="f32", tier="host",
                     layout={"kind": "row_major"}, parts={"data": np.ones(5, np.float32)}, sqnr_db=None)])
        w.finish()
    return path


def build_seeds(folder: Path, log=print) -> dict[str, bytes]:
    """The seed packs: int8 and nf4 NPU storage, MoE experts (NPU and host), dual residency (host copies,
    int8 and nf4 NPU storage), rules placement, raw tensors and multi-segment layouts. Built once into
    ``folder`` (a cache); a seed that cannot be built is left out with a message."""
    folder.mkdir(parents=True, exist_ok=True)
    done = folder / "done"
    if done.exists():
        return {p.stem: p.read_bytes() for p in sorted(folder.glob("*.orkpack"))}
    from orkpack.build import BuildOptions, build
    from orkpack.synth import write_hf_model

    import make_corpus

    work = Path(tempfile.mkdtemp(prefix="seeds-", dir=folder))
    try:
        hf = write_hf_model(work / "hf", seed=0, **TINY)
        moe = write_hf_model(work / "moe", seed=1, experts=2, experts_used=1, shards=1, dtype="f16", **TINY)
        specs = {
            "int8_npu": lambda: build(hf, work / "a.orkpack", BuildOptions(threads=1, npu=["blk.0.attn_q.weight"])),
            "nf4_npu": lambda: build(hf, work / "b.orkpack", BuildOptions(
                threads=1, npu=["blk.0.ffn_up.weight"], npu_storage="nf4", keep=["token_embd.weight"])),
            "moe_int8": lambda: build(moe, work / "c.orkpack", BuildOptions(
                threads=1, npu=["blk.0.ffn_up_exps.weight"], int8=["blk.0.ffn_down_exps.weight"])),
            "moe_nf4": lambda: build(moe, work / "d.orkpack", BuildOptions(
                threads=1, npu=["blk.0.ffn_gate_exps.weight"], npu_storage="nf4")),
            "dual_int8": lambda: build(hf, work / "e.orkpack", BuildOptions(
                threads=1, tiermap=make_corpus._dual_tiermap(hf, work / "dual.json"))),
            "dual_nf4": lambda: build(hf, work / "f.orkpack", BuildOptions(
                threads=1, npu_storage="nf4", tiermap=make_corpus._dual_tiermap(hf, work / "dual2.json"))),
            "rules": lambda: build(moe, work / "g.orkpack", BuildOptions(
                threads=1, plan=False, npu=["blk.0.attn_q.weight"], int8=["blk.0.ffn_up_exps.weight"])),
            "writer": lambda: _writer_pack(work / "h.orkpack"),
        }
        for name, make in specs.items():
            try:
                res = make()
                p = getattr(res, "path", res)
                shutil.copyfile(p, folder / f"{name}.orkpack")
            except Exception as e:  # a seed the tree cannot build today (e.g. a tier-map change in flight)
                log(f"seed {name} not built: {type(e).__name__}: {e}")
        done.write_text("ok\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {p.stem: p.read_bytes() for p in sorted(folder.glob("*.orkpack"))}


def default_seed_cache() -> Path:
    import orkpack

    key = hashlib.sha256(f"{SEEDS_VERSION} {getattr(orkpack, '__version__', '?')}".encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"orkpack-structure-seeds-{key}"


def load_corpus(folder: Path = CORPUS) -> dict[str, bytes]:
    return {f"corpus/{p.stem}": p.read_bytes() for p in sorted(folder.glob("*.orkpack"))}


# ------------------------------------------------------------------ editing a header

def _get(h, path):
    for k in path:
        h = h[k]
    return h


def _set(h, path, value):
    _get(h, path[:-1])[path[-1]] = value


def compact(h: dict, data: bytes) -> bytes:
    """Drop the data pages no part record touches; part offsets are moved with their pages. Returns the
    new data section (``h`` is changed in place)."""
    npages = len(data) // ALIGN
    pages = set()
    for pr in harness.part_records(h):
        off, size = pr.get("offset"), pr.get("size")
        if type(off) is not int or off < ALIGN or off >= ALIGN + len(data):
            continue
        size = size if type(size) is int and size > 0 else 1
        first = (off - ALIGN) // ALIGN
        last = min(npages - 1, (off - ALIGN + size - 1) // ALIGN)
        pages.update(range(first, last + 1))
    order = sorted(pages)
    where = {p: i for i, p in enumerate(order)}
    new = b"".join(data[p * ALIGN:(p + 1) * ALIGN] for p in order)
    for pr in harness.part_records(h):
        off = pr.get("offset")
        if type(off) is not int or off < ALIGN:
            continue
        rel = off - ALIGN
        pr["offset"] = (off - len(data) + len(new)) if rel >= len(data) else ALIGN + where[rel // ALIGN] * ALIGN + rel % ALIGN
    return new


def apply_op(h, data: bytearray, state: dict, op: dict):
    """Apply one mutation record; returns the (possibly new) header root. Raises (KeyError, IndexError,
    TypeError, ValueError) when the record does not apply (minimization tries records out of order)."""
    kind = op["op"]
    if kind == "set":
        v = dec_value(op["value"])
        if not op["path"]:
            return v
        _set(h, op["path"], v)
    elif kind == "del":
        del _get(h, op["path"][:-1])[op["path"][-1]]
    elif kind == "insert":
        _get(h, op["path"]).insert(op["index"], dec_value(op["value"]))
    elif kind == "copy":
        _set(h, op["dst"], copy.deepcopy(_get(h, op["src"])))
    elif kind == "swap":
        a, b = _get(h, op["a"]), _get(h, op["b"])
        _set(h, op["a"], b)
        _set(h, op["b"], a)
    elif kind == "dup":
        obj = _get(h, op["path"])
        if not isinstance(obj, dict):
            raise TypeError("dup on a non-object")
        if not isinstance(obj, DupDict):
            d = DupDict(obj)
            if op["path"]:
                _set(h, op["path"], d)
            else:
                h = d
            obj = d
        obj.extra.append((op["key"], dec_value(op["value"]), op["first"]))
    elif kind == "minor":
        state["minor"] = op["value"]
    elif kind == "bytes":
        b = bytes.fromhex(op["hex"])
        off = op["at"]
        if off < 0 or off + len(b) > len(data):
            raise ValueError("bytes outside the data")
        data[off:off + len(b)] = b
    elif kind == "refresh":
        harness.refresh_part_checksums(h, bytes(data))
    elif kind == "drop_tensor":
        del h["tensors"][op["index"]]
    elif kind == "compact":
        new = compact(h, bytes(data))
        data[:] = new
    else:
        raise ValueError(f"unknown op {kind}")
    return h


@dataclass
class Case:
    seed: str
    ops: list
    index: int = -1

    def to_json(self) -> dict:
        return {"seed": self.seed, "index": self.index, "ops": self.ops}


def materialize(seeds: dict[str, bytes], case: Case) -> bytes:
    hb, data, _minor = harness.split_pack(seeds[case.seed])
    h = json.loads(hb)
    data = bytearray(data)
    state = {"minor": None}
    for op in case.ops:
        h = apply_op(h, data, state, op)
    return harness.forge_pack(dumps(h).encode("ascii"), bytes(data), state["minor"])


# ------------------------------------------------------------------ mutations

INTS = [0, 1, -1, 2, 3, 31, 32, 33, 63, 64, 96, 127, 128, 4095, 4096, 4097, 8191, 8192, 8193, 2 ** 16, 2 ** 31 - 1,
        2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 32 + 4096, 2 ** 40, 2 ** 47, 2 ** 48, 2 ** 48 + 1, 2 ** 53 + 1, 2 ** 62,
        2 ** 63 - 64, 2 ** 63 - 32, 2 ** 63 - 1, 2 ** 63, 2 ** 63 + 32, 2 ** 64 - 32, 2 ** 64 - 1, 2 ** 64, 2 ** 70,
        10 ** 30, -2 ** 31, -2 ** 63, -2 ** 63 - 1, -2 ** 64, -4096, -32]
FLOATS = [0.0, -0.0, 0.5, 1.0, 2.0, 32.0, 4096.0, 8192.0, 1e308, -1e308, 5e-324, 2.0 ** 63, 2.0 ** 64, 1e19, 1.5]
TOKENS = ["NaN", "-NaN", "Infinity", "-Infinity", "1e400", "-1e400", "-0", "1E2", "32E0", "3.2e1", "0.0e5",
          "1" + "0" * 4299, "1" + "0" * 4300, "-1" + "0" * 30, "4096.000000000000001"]
STRINGS = ["", "0", "32", "4096", "npu", "host", "int8", "nf4", "raw", "f32", "f16", "bf16", "i64", "row_major",
           "npu_int8", "q", "codes", "data", "null", "\u0000", "\ud800", "\udc00\ud800", "\u00e9", "a" * 5000,
           "0123456789abcdef", "0" * 16, "ABCDEF0123456789", "orkpack", "blk.0.attn_q.weight"]
ENUMS = {
    "encoding": list(spec.ENCODINGS) + ["q3_z", "INT8", "nf4 "],
    "tier": list(spec.TIERS) + ["gpu", "cpu", "NPU"],
    "kind": [spec.LAYOUT_ROW_MAJOR, spec.LAYOUT_NPU_INT8, "npu_int4", "tiled"],
    "dtype": list(spec.RAW_DTYPES) + ["i128", "f8", "I64"],
    "source_dtype": ["F32", "BF16", "I64", "Q4_K", ""],
    "format": ["orkpack", "orkpack2", ""],
}
NPU_KSEGS = [32, 64, 96, 8192, 2 ** 31, 2 ** 48, 2 ** 62, 2 ** 63 - 64, 2 ** 63 - 32, 2 ** 63, 2 ** 64, 2 ** 70, 16, 0]


def _walk(v, path, out, depth=0):
    out.append((path, v))
    if depth > 12:
        return
    if isinstance(v, dict):
        for k, x in v.items():
            _walk(x, path + (k,), out, depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _walk(x, path + (i,), out, depth + 1)


def nodes(h) -> tuple[list, list]:
    """(tensor-part nodes, other nodes) as (path, value); the tier map's own tables and the provenance
    and config internals are left out, apart from the arena cap's keys."""
    tens, other = [], [((), h)]
    if not isinstance(h, dict):
        return tens, other
    for k, v in h.items():
        if k == "tensors":
            _walk(v, ("tensors",), tens)
        elif k == "tiermap" and isinstance(v, dict):
            other.append((("tiermap",), v))
            for kk in ("board", "budget", "budgets", "npu"):
                if isinstance(v.get(kk), dict):
                    _walk(v[kk], ("tiermap", kk), other, 10)
                elif kk in v:
                    other.append((("tiermap", kk), v[kk]))
        else:
            other.append(((k,), v))
            if isinstance(v, (dict, list)) and k in ("version", "tool"):
                _walk(v, (k,), other, 11)
    return tens, other


def _pick(rng, h):
    tens, other = nodes(h)
    pool = tens if tens and rng.random() < 0.85 else other
    return rng.choice(pool)


def interesting(rng, cur):
    r = rng.random()
    if isinstance(cur, int) and not isinstance(cur, bool) and r < 0.35:
        return nudge(rng, cur)
    if r < 0.55:
        return rng.choice(INTS)
    if r < 0.63:
        return rng.choice(FLOATS) if rng.random() < 0.6 or not isinstance(cur, (int, float)) else float(cur)
    if r < 0.72:
        return Raw(rng.choice(TOKENS))
    if r < 0.82:
        return rng.choice(STRINGS)
    if r < 0.88:
        return rng.choice([None, True, False])
    if r < 0.94:
        return rng.choice([[], [cur], [cur, cur], [0, 32, 32], [[0, 32, 32]], [32, 32], [1], [0]])
    return rng.choice([{}, {"kind": "row_major"}, {"kind": "npu_int8"}, {"x": cur}, {"offset": 4096, "size": 0}])


def nudge(rng, x: int):
    return rng.choice([
        x + 1, x - 1, x + 32, x - 32, x + 4096, x - 4096, x * 2, x // 2, 0, -x, 2 ** 63, 2 ** 63 - 1, 2 ** 64 + x,
        x + 2 ** 64, x + 2 ** 32, float(x), x + 0.5, Raw(f"{x}.0"), Raw(f"{x}e0"), str(x), x == 1, [x]])


def g_set(rng, h, data):
    path, cur = _pick(rng, h)
    return [{"op": "set", "path": list(path), "value": enc_value(interesting(rng, cur))}]


def g_nudge(rng, h, data):
    ints = [(p, v) for p, v in nodes(h)[0] if isinstance(v, int) and not isinstance(v, bool)]
    if not ints:
        return g_set(rng, h, data)
    path, cur = rng.choice(ints)
    return [{"op": "set", "path": list(path), "value": enc_value(nudge(rng, cur))}]


def g_delete(rng, h, data):
    cands = [(p, v) for p, v in nodes(h)[0] + nodes(h)[1] if p]
    if not cands:
        return []
    path, _ = rng.choice(cands)
    return [{"op": "del", "path": list(path)}]


SLICE_KEYS = ["expert", "shape", "encoding", "dtype", "tier", "layout", "parts", "sqnr_db", "min_m", "inflate",
              "host_copy", "x_unknown"]


def g_add_key(rng, h, data):
    dicts = [(p, v) for p, v in nodes(h)[0] + [((), h)] if isinstance(v, dict)]
    if not dicts:
        return []
    path, d = rng.choice(dicts)
    key = rng.choice(SLICE_KEYS + list(d) if d else SLICE_KEYS)
    tens, _ = nodes(h)
    same = [v for p, v in tens if p and p[-1] == key]
    val = copy.deepcopy(rng.choice(same)) if same and rng.random() < 0.5 else interesting(rng, d.get(key))
    return [{"op": "set", "path": list(path) + [key], "value": enc_value(val)}]


def g_dup(rng, h, data):
    dicts = [(p, v) for p, v in nodes(h)[0] + [((), h)] if isinstance(v, dict) and v]
    if not dicts:
        return []
    path, d = rng.choice(dicts)
    key = rng.choice(list(d))
    val = d[key] if rng.random() < 0.3 else interesting(rng, d[key])
    return [{"op": "dup", "path": list(path), "key": key, "value": enc_value(copy.deepcopy(val)),
             "first": rng.random() < 0.5}]


def _same_key_pairs(rng, h):
    tens, _ = nodes(h)
    by = {}
    for p, v in tens:
        if p:
            by.setdefault(p[-1] if isinstance(p[-1], str) else ("#", len(p)), []).append(p)
    keys = [k for k, ps in by.items() if len(ps) >= 2]
    if not keys:
        return None
    ps = by[rng.choice(keys)]
    a, b = rng.sample(ps, 2)
    if a[:len(b)] == b or b[:len(a)] == a:  # one inside the other
        return None
    return a, b


def g_copy(rng, h, data):
    r = rng.random()
    ts = h.get("tensors") if isinstance(h, dict) else None
    if r < 0.25 and isinstance(ts, list) and ts:
        # a whole tensor or slice duplicated / copied into another tensor
        i = rng.randrange(len(ts))
        if rng.random() < 0.4:
            return [{"op": "insert", "path": ["tensors"], "index": rng.randrange(len(ts) + 1),
                     "value": enc_value(copy.deepcopy(ts[i]))}]
        j = rng.randrange(len(ts))
        si = ts[i].get("slices") if isinstance(ts[i], dict) else None
        sj = ts[j].get("slices") if isinstance(ts[j], dict) else None
        if isinstance(si, list) and si and isinstance(sj, list):
            s = copy.deepcopy(rng.choice(si))
            if sj and rng.random() < 0.6:
                return [{"op": "set", "path": ["tensors", j, "slices", rng.randrange(len(sj))], "value": enc_value(s)}]
            return [{"op": "insert", "path": ["tensors", j, "slices"], "index": rng.randrange(len(sj) + 1),
                     "value": enc_value(s)}]
    pair = _same_key_pairs(rng, h)
    if not pair:
        return g_set(rng, h, data)
    return [{"op": "copy", "src": list(pair[0]), "dst": list(pair[1])}]


def g_swap(rng, h, data):
    pair = _same_key_pairs(rng, h)
    if not pair:
        return g_set(rng, h, data)
    return [{"op": "swap", "a": list(pair[0]), "b": list(pair[1])}]


def g_enum(rng, h, data):
    tens, other = nodes(h)
    cands = [(p, v) for p, v in tens + other if p and p[-1] in ENUMS]
    if not cands:
        return g_set(rng, h, data)
    path, cur = rng.choice(cands)
    return [{"op": "set", "path": list(path), "value": rng.choice(ENUMS[path[-1]])}]


def g_list(rng, h, data):
    lists = [(p, v) for p, v in nodes(h)[0] + nodes(h)[1] if isinstance(v, list) and p]
    if not lists:
        return []
    path, lst = rng.choice(lists)
    r = rng.random()
    if lst and r < 0.35:
        return [{"op": "del", "path": list(path) + [rng.randrange(len(lst))]}]
    if lst and r < 0.65:
        return [{"op": "insert", "path": list(path), "index": rng.randrange(len(lst) + 1),
                 "value": enc_value(copy.deepcopy(rng.choice(lst)))}]
    if r < 0.8:
        return [{"op": "set", "path": list(path), "value": enc_value(list(reversed(lst)))}]
    return [{"op": "set", "path": list(path), "value": enc_value(lst[:rng.randrange(len(lst) + 1)] if lst else [0])}]


def _slices(h):
    out = []
    ts = h.get("tensors") if isinstance(h, dict) else None
    for ti, t in enumerate(ts if isinstance(ts, list) else []):
        ss = t.get("slices") if isinstance(t, dict) else None
        for si, s in enumerate(ss if isinstance(ss, list) else []):
            if isinstance(s, dict):
                out.append((ti, si, t, s))
    return out


def _layout(n, k, ks):
    """npu_layout, refusing (ValueError) a record of more than 4096 segments (the reader compares the
    segment count before it builds one; the fuzzer must not build a huge one either)."""
    from orkpack.layout import npu_layout

    if not (type(k) is int and type(ks) is int and ks > 0) or -(-k // ks) > 4096:
        raise ValueError("too many segments")
    return npu_layout(n, k, ks)


def g_reshape(rng, h, data):
    """A tensor's shape changed coherently (tensor, slices, npu layouts, inflate records, part sizes), so
    the change reaches the size, bounds and overlap checks rather than the first shape comparison."""
    from orkpack.pack.reader import expected_part_sizes

    ts = h.get("tensors") if isinstance(h, dict) else None
    if not isinstance(ts, list) or not ts:
        return []
    ti = rng.randrange(len(ts))
    t = ts[ti]
    if not isinstance(t, dict) or not isinstance(t.get("shape"), list) or not t["shape"]:
        return g_set(rng, h, data)
    shape = list(t["shape"])
    d = rng.randrange(len(shape))
    if not all(type(x) is int for x in shape):
        return g_set(rng, h, data)
    shape[d] = rng.choice([shape[d] + 1, shape[d] - 1, shape[d] * 2, 0, 1, shape[d] + 32, 2 ** 20, 2 ** 33, 2 ** 47])
    ops = [{"op": "set", "path": ["tensors", ti, "shape"], "value": shape}]
    stacked = len(shape) == 3 and len(t.get("slices") or []) != 1
    sshape = shape[1:] if stacked else shape
    for si, s in enumerate(t.get("slices") if isinstance(t.get("slices"), list) else []):
        if not isinstance(s, dict):
            continue
        base = ["tensors", ti, "slices", si]
        ops.append({"op": "set", "path": base + ["shape"], "value": sshape})
        lay = s.get("layout")
        try:
            if isinstance(lay, dict) and lay.get("kind") == spec.LAYOUT_NPU_INT8 and len(sshape) == 2:
                lay = _layout(sshape[0], sshape[1], lay.get("k_segment", 8192))
                ops.append({"op": "set", "path": base + ["layout"], "value": lay})
            inf = s.get("inflate")
            if isinstance(inf, dict) and len(sshape) == 2 and isinstance(inf.get("layout"), dict):
                il = _layout(sshape[0], sshape[1], inf["layout"].get("k_segment", 8192))
                ops.append({"op": "set", "path": base + ["inflate", "layout"], "value": il})
                ops.append({"op": "set", "path": base + ["inflate", "q_size"],
                            "value": il["n_pad"] * sum(x[2] for x in il["segments"])})
            sizes = expected_part_sizes(sshape, s.get("encoding"), lay if isinstance(lay, dict) else {}, s.get("dtype"))
            for pn, sz in sizes.items():
                if isinstance(s.get("parts"), dict) and isinstance(s["parts"].get(pn), dict):
                    ops.append({"op": "set", "path": base + ["parts", pn, "size"], "value": sz})
            hc = s.get("host_copy")  # a host copy's parts follow too (nf4: 2 parts, nf4dq: 4)
            if isinstance(hc, dict) and isinstance(hc.get("parts"), dict) and hc.get("encoding") in spec.HOST_COPY_ENCODINGS:
                for pn, sz in expected_part_sizes(sshape, hc["encoding"], {"kind": spec.LAYOUT_ROW_MAJOR}).items():
                    if isinstance(hc["parts"].get(pn), dict):
                        ops.append({"op": "set", "path": base + ["host_copy", "parts", pn, "size"], "value": sz})
        except Exception:
            pass
    return ops


def g_kseg(rng, h, data):
    """An npu_int8 layout (a slice's, or an inflate record's) rebuilt for another k_segment, huge ones
    included; the inflate q_size follows."""
    cands = []
    for ti, si, t, s in _slices(h):
        sh = s.get("shape")
        if not (isinstance(sh, list) and len(sh) == 2 and all(type(x) is int and x >= 1 for x in sh)):
            continue
        if isinstance(s.get("layout"), dict) and s["layout"].get("kind") == spec.LAYOUT_NPU_INT8:
            cands.append((["tensors", ti, "slices", si, "layout"], sh, None))
        if isinstance(s.get("inflate"), dict):
            cands.append((["tensors", ti, "slices", si, "inflate", "layout"], sh,
                          ["tensors", ti, "slices", si, "inflate", "q_size"]))
    if not cands:
        return g_set(rng, h, data)
    path, (n, k), qpath = rng.choice(cands)
    ks = rng.choice(NPU_KSEGS)
    try:
        lay = _layout(n, k, ks)
    except ValueError:
        lay = dict(_get(h, path), k_segment=ks)
    ops = [{"op": "set", "path": path, "value": lay}]
    if qpath and rng.random() < 0.8 and "segments" in lay:
        ops.append({"op": "set", "path": qpath, "value": lay["n_pad"] * sum(x[2] for x in lay["segments"])})
    return ops


def g_repoint(rng, h, data):
    """Parts pointed at other parts' bytes: offsets swapped or aliased, sizes taken over, offsets moved."""
    parts = []
    for ti, si, t, s in _slices(h):
        for where in ("parts", "host_copy"):
            rec = s.get(where)
            if where == "host_copy":
                rec = rec.get("parts") if isinstance(rec, dict) else None
            if isinstance(rec, dict):
                base = ["tensors", ti, "slices", si] + (["host_copy", "parts"] if where == "host_copy" else ["parts"])
                parts += [(base + [pn], pr) for pn, pr in rec.items() if isinstance(pr, dict)]
    if len(parts) < 2:
        return g_set(rng, h, data)
    (pa, a), (pb, b) = rng.sample(parts, 2)
    r = rng.random()
    if r < 0.3:
        return [{"op": "swap", "a": pa + ["offset"], "b": pb + ["offset"]}, {"op": "refresh"}]
    if r < 0.5:
        return [{"op": "copy", "src": pb + ["offset"], "dst": pa + ["offset"]}, {"op": "refresh"}]
    if r < 0.65:
        return [{"op": "copy", "src": pb, "dst": pa}]
    if r < 0.8:
        off = a.get("offset")
        if type(off) is int:
            return [{"op": "set", "path": pa + ["offset"], "value": off + rng.choice([-4096, 4096, 8192, -1, 1, 2048])},
                    {"op": "refresh"}]
    return [{"op": "swap", "a": pa, "b": pb}]


FLOAT_BYTES = [b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x00\x00\x80\xff", b"\x00\x00\x80\xbf", b"\xff\xff\x7f\x7f",
               b"\x01\x00\x00\x00", b"\x00\x00\x00\x80", b"\x00\x00\x00\x00"]


def g_bytes(rng, h, data):
    """Bytes inside a part changed (NaN/inf/negative floats, int8 -128, random codes), its checksum and the
    data checksum recomputed: the loads and the image comparison see bytes no encoder writes."""
    prs = [pr for pr in harness.part_records(h) if type(pr.get("offset")) is int and type(pr.get("size")) is int
           and pr["size"] > 0 and ALIGN <= pr["offset"] and pr["offset"] - ALIGN + pr["size"] <= len(data)]
    if not prs:
        return g_set(rng, h, data)
    pr = rng.choice(prs)
    rel, size = pr["offset"] - ALIGN, pr["size"]
    ops = []
    for _ in range(rng.choice([1, 1, 2, 8])):
        r = rng.random()
        if r < 0.4 and size >= 4:
            at = rel + rng.randrange(size // 4) * 4
            b = rng.choice(FLOAT_BYTES)
        elif r < 0.6:
            at, b = rel + rng.randrange(size), bytes([rng.choice([0x80, 0x7f, 0xff, 0x00, 0x77])])
        else:
            n = min(size, rng.choice([1, 4, 16, 64]))
            at = rel + rng.randrange(size - n + 1)
            b = bytes(rng.randrange(256) for _ in range(n))
        ops.append({"op": "bytes", "at": at, "hex": b.hex()})
    ops.append({"op": "refresh"})
    return ops


def g_retype(rng, h, data):
    """An int replaced by an equal value of another JSON type (64.0, 6.4e1, 64E0, true for 1, -0 for 0):
    Python's == still holds, so the pack may stay valid while the code after the checks sees a float."""
    ints = [(p, v) for p, v in nodes(h)[0] if type(v) is int]
    if not ints:
        return g_set(rng, h, data)
    ops = []
    for path, x in rng.sample(ints, min(len(ints), rng.choice([1, 1, 2, 3]))):
        v = rng.choice([float(x), Raw(f"{x}.0"), Raw(f"{x}e0"), Raw(f"{x}E+0"), Raw(f"{x}.000")]
                       + ([x == 1] if x in (0, 1) else []) + ([Raw("-0"), Raw("-0.0")] if x == 0 else [])
                       + ([Raw(f"{x / 10}e1")] if x % 10 == 0 and x < 2 ** 50 else []))
        ops.append({"op": "set", "path": list(path), "value": enc_value(v)})
    return ops


def g_minor(rng, h, data):
    return [{"op": "minor", "value": rng.choice([0, 1, 2, 3, 4, 255, 65535])}]


GENERATORS = [(g_set, 20), (g_nudge, 18), (g_delete, 7), (g_add_key, 5), (g_dup, 4), (g_copy, 9), (g_swap, 6),
              (g_enum, 9), (g_list, 6), (g_reshape, 6), (g_kseg, 5), (g_repoint, 8), (g_bytes, 5), (g_minor, 2),
              (g_retype, 8)]


def make_case(seeds: dict[str, bytes], names: list[str], seed: int, index: int) -> Case:
    rng = random.Random(f"{seed}:{index}")
    name = rng.choice(names)
    hb, data, _ = harness.split_pack(seeds[name])
    h = json.loads(hb)
    data = bytearray(data)
    state = {"minor": None}
    ops = []
    n = 1 + (rng.random() < 0.5) + (rng.random() < 0.25) + (rng.random() < 0.1)
    fns, weights = zip(*GENERATORS)
    for _ in range(n):
        gen = rng.choices(fns, weights)[0]
        try:
            new_ops = gen(rng, h, bytes(data))
        except Exception:  # a generator that cannot make sense of an already mangled header: skip it
            new_ops = []
        for op in new_ops:
            try:
                h = apply_op(h, data, state, op)
            except (KeyError, IndexError, TypeError, ValueError, AttributeError):
                continue
            ops.append(op)
    if ops and ops[-1]["op"] != "refresh" and rng.random() < 0.3:
        ops.append({"op": "refresh"})
    return Case(name, ops, index)


# ------------------------------------------------------------------ running the readers

@dataclass
class PyOut:
    code: int | None  # exit code of verify_pack, None when it raised something that is not an OrkError
    stage: str  # the check that failed ("open", "load", ...), "ok", "unusable" or "crash"
    msg: str
    crash: str | None = None  # signature of a non-OrkError exception (any of the runs)
    trace: str = ""


def _crash_sig(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    mine = [f for f in tb if "/orkpack/" in f.filename.replace("\\", "/")] or tb
    f = mine[-1] if mine else None
    where = f"{Path(f.filename).name}:{f.lineno} in {f.name}" if f else "?"
    return f"{type(e).__name__} at {where}"


_BACKEND = None
PY_TIMEOUT = 20.0  # seconds a pack may take in the Python reader before it counts as a hang


class _Hang(BaseException):
    """Raised by the watchdog in the main thread (a BaseException: no reader code catches it)."""


def _alarm(_sig, _frame):
    raise _Hang()


def run_python(path: Path, extra: bool = True) -> PyOut:
    """verify_pack (orkpack verify --device host) in-process; then, for crashes only, --reference
    --keep-going (and the two-step inflate). A pack that takes more than PY_TIMEOUT s is a hang."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _run_python(path, extra)
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, PY_TIMEOUT)
    try:
        return _run_python(path, extra)
    except _Hang as e:
        return PyOut(None, "hang", f"no answer in {PY_TIMEOUT:.0f} s", f"hang (> {PY_TIMEOUT:.0f} s) at "
                     + _crash_sig(e).split(" at ", 1)[1], traceback.format_exc())
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _run_python(path: Path, extra: bool) -> PyOut:
    global _BACKEND
    from orkpack.runtime.backends import HostBackend
    from orkpack.runtime.verify import verify_pack

    if _BACKEND is None:
        _BACKEND = HostBackend()
    try:
        r = verify_pack(path, backend=_BACKEND)
        if r.error:
            out = PyOut(r.exit_code, "unusable", r.error)
        elif r.exit_code:
            stage = next((c for c, v in r.checks.items() if v["failed"]), "?")
            out = PyOut(r.exit_code, stage, r.failures[0] if r.failures else "")
        else:
            out = PyOut(0, "ok", "")
    except OrkError as e:
        out = PyOut(getattr(e, "exit_code", 2), "raised", str(e))
    except (KeyboardInterrupt, SystemExit, _Hang):
        raise
    except BaseException as e:
        return PyOut(None, "crash", f"{type(e).__name__}: {e}"[:300], _crash_sig(e), traceback.format_exc())
    if extra and out.code != 2:
        try:
            r2 = verify_pack(path, backend=_BACKEND, reference=True, keep_going=True, inflate="two-step")
            if r2.exit_code not in (0, 1, 2):
                out.crash = f"exit code {r2.exit_code!r} (--reference --keep-going)"
        except OrkError:
            pass
        except (KeyboardInterrupt, SystemExit, _Hang):
            raise
        except BaseException as e:
            out.crash = _crash_sig(e) + " (--reference --keep-going)"
            out.trace = traceback.format_exc()
    return out


def python_outcomes(paths: list[Path], fork: bool = True) -> list[PyOut]:
    """run_python on each pack; with ``fork``, in a forked child per batch, so that a native crash in the
    Python reader's C parts (the cffi runtime: a heap overflow aborts the process) is a finding pinned
    to its pack (by re-running the batch's packs one per child), not the end of the fuzzer."""
    if not fork or not hasattr(os, "fork"):
        return [run_python(p) for p in paths]
    return harness.forked_map(run_python, paths, lambda how: PyOut(
        None, "crash", f"the Python reader's process was {how}",  # (the signal varies with the heap: not in the sig)
        "python process killed (a native crash in the reader's C parts)"))


@dataclass
class COut:
    code: int | None  # 0/1/2 from the pack's line, None on a crash / hang / bad output
    stage: str
    msg: str
    crash: str | None = None
    stderr: str = ""


SAN_RE = re.compile(r"(ERROR: AddressSanitizer[^\n]*|ERROR: LeakSanitizer[^\n]*|runtime error:[^\n]*|"
                    r"SUMMARY: \w+Sanitizer[^\n]*)")


def _c_line(line: str) -> COut:
    word, _, rest = line.partition(" ")
    code = {"ok": 0, "FAIL": 1, "unusable": 2}.get(word)
    if code is None:
        return COut(None, "bad-output", line, f"unexpected output line {line[:80]!r}")
    stage = "ok" if code == 0 else "unusable" if code == 2 else (rest.split(": ", 2)[1] if rest.count(": ") >= 1 else "?")
    return COut(code, stage, rest)


class CReader:
    """orkpack-check on batches of packs (one process per batch); crashes, sanitizer reports, hangs and
    exit codes other than 0/1/2 are pinned to the pack that caused them by re-running it alone."""

    def __init__(self, exe: Path, timeout: float = 120.0):
        self.exe = Path(exe)
        self.timeout = timeout
        self.invocations = 0
        self.env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:exitcode=86:"
                        "handle_abort=1", UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87")

    def _run(self, paths: list[Path], timeout: float):
        self.invocations += 1
        try:
            res = subprocess.run([str(self.exe), "--", *map(str, paths)], capture_output=True, text=True,
                                 errors="replace", timeout=timeout, env=self.env, preexec_fn=_unlimit)
            return res.returncode, res.stdout.splitlines(), res.stderr
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return "timeout", out.splitlines(), ""

    def _alone(self, p: Path) -> COut:
        rc, lines, err = self._run([p], min(self.timeout, 30.0))
        san = SAN_RE.findall(err)
        if rc == "timeout":
            return COut(None, "hang", "", "hang (no answer in 30 s)", err[-4000:])
        if san or len(lines) != 1 or rc not in (0, 1, 2):
            what = san[0] if san else (f"killed by signal {-rc}" if isinstance(rc, int) and rc < 0 else f"exit {rc}")
            frame = next((ln.strip() for ln in err.splitlines() if re.match(r"\s*#\d+ .* in .*(reader|jscan|runtime|"
                                                                            r"orkpack_check)\.c", ln)), "")
            sig = re.sub(r"\b\d+\b", "N", re.sub(r"0x[0-9a-f]+", "0x", what))  # one bug, one signature
            if frame:
                sig += " | " + re.sub(r"^#\d+ 0x[0-9a-f]+ ", "", frame)
            out = _c_line(lines[0]) if lines else COut(None, "crash", "")
            out.code = None
            out.crash, out.stderr = sig[:300], err[-4000:]
            return out
        out = _c_line(lines[0])
        if out.crash is None and out.code != rc:
            out.crash = f"exit {rc} for a line saying {out.code}"
            out.code = None
        return out

    def check(self, paths: list[Path]) -> list[COut]:
        results: list[COut] = []
        todo = list(paths)
        while todo:
            rc, lines, err = self._run(todo, self.timeout)
            outs = [_c_line(ln) for ln in lines[:len(todo)]]
            clean = rc in (0, 1, 2) and not SAN_RE.search(err) and len(lines) == len(todo) \
                and all(o.code is not None for o in outs) and rc == max(o.code for o in outs)
            if clean:
                results += outs
                return results
            if len(lines) < len(todo) and rc != "timeout":
                # died on the first pack without a line (or, after printing it, on the one before):
                # keep the lines before it, pin it, go on after it
                at = len(outs)
                one = self._alone(todo[at])
                if one.crash is None and at > 0:
                    prev = self._alone(todo[at - 1])
                    if prev.crash is not None:
                        outs[at - 1] = prev
                results += outs
                results.append(one)
                todo = todo[at + 1:]
                continue
            # a leak report at exit, a hang or an inconsistent exit code: pin it pack by pack
            results += [self._alone(p) for p in todo]
            return results
        return results


def _unlimit() -> None:
    """In the orkpack-check child: lift the address-space limit the fuzzer set on itself (ASan maps
    terabytes of shadow memory)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.getrlimit(resource.RLIMIT_AS)[1]))


def limit_memory(mb: int) -> None:
    """Cap this process's address space, so that a reader that sizes something from a hostile number
    raises MemoryError (a finding) instead of being killed by the OOM killer."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (mb << 20, hard))


def build_check(out: Path, sanitize: bool = False) -> Path:
    """orkpack-check built into ``out``: with make (gcc, as the tests do), or with clang and
    -fsanitize=address,undefined (the reader, the JSON pre-pass and kernels/runtime.c instrumented)."""
    out.mkdir(parents=True, exist_ok=True)
    src = ROOT / "kernels" / "reader"
    if not sanitize:
        subprocess.run(["make", "-s", "-C", str(src), f"O={out}"], check=True, capture_output=True)
        return out / "orkpack-check"
    exe = out / "orkpack-check-asan"
    cc = shutil.which("clang") or "clang"
    subprocess.run([cc, "-g", "-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    "-fno-omit-frame-pointer", "-ffp-contract=off", "-fno-math-errno", "-I/usr/include/cjson",
                    str(src / "orkpack_check.c"), str(src / "reader.c"), str(src / "jscan.c"),
                    str(ROOT / "kernels" / "runtime.c"), "-lcjson", "-lxxhash", "-lm", "-lpthread", "-o", str(exe)],
                   check=True, capture_output=True)
    return exe


# ------------------------------------------------------------------ findings

@dataclass
class Finding:
    target: str  # "python", "c" or "diff"
    sig: str
    case: Case
    py: PyOut
    c: COut | None
    count: int = 1
    saved: Path | None = None


def _norm(msg: str) -> str:
    """A reader's message as a signature: the reason after the last "NAME: ", numbers and quoted values out."""
    msg = msg.rsplit(": ", 1)[-1]
    msg = re.sub(r"'[^']*'|\"[^\"]*\"", "S", msg)
    msg = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "N", msg)
    return " ".join(msg.split()[:6])


def classify(py: PyOut, c: COut | None) -> list[tuple[str, str]]:
    """(target, signature) of every finding of one case."""
    out = []
    if py.crash:
        out.append(("python", py.crash))
    if c is not None and c.crash:
        out.append(("c", c.crash))
    if c is not None and py.code is not None and c.code is not None and py.code != c.code:
        out.append(("diff", f"python {py.code} ({py.stage}: {_norm(py.msg)}) / C {c.code} ({c.stage})"))
    return out


def outcome_sig(py: PyOut, c: COut | None) -> list[tuple[str, str]]:
    return sorted(classify(py, c))


class Session:
    def __init__(self, seeds: dict[str, bytes], creader: CReader | None, work: Path, log=print, fork: bool = True):
        self.seeds, self.c, self.work, self.log, self.fork = seeds, creader, work, log, fork
        self.py_execs = self.c_execs = self.compared = 0
        self.py_time = self.c_time = 0.0
        self.findings: dict[tuple[str, str], Finding] = {}
        self.stages: dict[str, int] = {}
        self.codes: dict[tuple, int] = {}

    def run_one(self, raw: bytes, name: str = "one.orkpack") -> tuple[PyOut, COut | None]:
        p = self.work / name
        p.write_bytes(raw)
        py = python_outcomes([p], self.fork)[0]
        c = self.c.check([p])[0] if self.c else None
        return py, c

    def run_batch(self, cases: list[Case]) -> None:
        paths, kept = [], []
        for i, case in enumerate(cases):
            try:
                raw = materialize(self.seeds, case)
            except Exception as e:  # the fuzzer's own bug: say so, never hide it
                self.log(f"case {case.index}: cannot materialize ({type(e).__name__}: {e})")
                continue
            p = self.work / f"c{i}.orkpack"
            p.write_bytes(raw)
            paths.append(p)
            kept.append(case)
        t0 = time.perf_counter()
        pys = python_outcomes(paths, self.fork)
        self.py_time += time.perf_counter() - t0
        self.py_execs += len(paths)
        cs: list = [None] * len(paths)
        if self.c is not None and paths:
            t0 = time.perf_counter()
            cs = self.c.check(paths)
            self.c_time += time.perf_counter() - t0
            self.c_execs += len(paths)
            self.compared += sum(1 for py in pys if py.code is not None)
        for case, p, py, c in zip(kept, paths, pys, cs):
            self.stages[py.stage] = self.stages.get(py.stage, 0) + 1
            key = (py.code, None if c is None else c.code)
            self.codes[key] = self.codes.get(key, 0) + 1
            for target, sig in classify(py, c):
                f = self.findings.get((target, sig))
                if f:
                    f.count += 1
                    continue
                self.findings[(target, sig)] = Finding(target, sig, case, py, c)
                self.log(f"FINDING [{target}] {sig}  (case {case.index}, seed pack {case.seed}, {len(case.ops)} ops)")

    # -- minimization and saving
    def _same(self, raw: bytes, want: list) -> bool:
        py, c = self.run_one(raw, "min.orkpack")
        return outcome_sig(py, c) == want

    def minimize(self, f: Finding) -> tuple[Case, bytes]:
        want = outcome_sig(f.py, f.c)
        case = Case(f.case.seed, list(f.case.ops), f.case.index)

        def ok(c: Case) -> bytes | None:
            try:
                raw = materialize(self.seeds, c)
            except Exception:
                return None
            return raw if self._same(raw, want) else None

        raw = materialize(self.seeds, case)
        changed = True
        while changed:  # drop mutations one at a time while the finding stays
            changed = False
            for i in range(len(case.ops) - 1, -1, -1):
                c2 = Case(case.seed, case.ops[:i] + case.ops[i + 1:], case.index)
                r2 = ok(c2)
                if r2 is not None:
                    case, raw, changed = c2, r2, True
        hb, _, _ = harness.split_pack(raw)
        try:
            ntens = len(json.loads(hb).get("tensors", []))
        except Exception:
            ntens = 0
        for i in range(ntens - 1, -1, -1):  # drop tensors
            c2 = Case(case.seed, case.ops + [{"op": "drop_tensor", "index": i}], case.index)
            r2 = ok(c2)
            if r2 is not None:
                case, raw = c2, r2
        try:  # drop host copies (two data pages each)
            hcs = [["tensors", ti, "slices", si, "host_copy"] for ti, si, t, sl in _slices(json.loads(
                harness.split_pack(raw)[0])) if "host_copy" in sl]
        except Exception:
            hcs = []
        for path in reversed(hcs):
            c2 = Case(case.seed, case.ops + [{"op": "del", "path": path}], case.index)
            r2 = ok(c2)
            if r2 is not None:
                case, raw = c2, r2
        for meta in (["tiermap"], ["provenance"], ["config"]):  # empty the metadata
            for v in ({}, None):
                c2 = Case(case.seed, case.ops + [{"op": "set", "path": meta, "value": v}], case.index)
                r2 = ok(c2)
                if r2 is not None:
                    case, raw = c2, r2
                    break
        c2 = Case(case.seed, case.ops + [{"op": "compact"}], case.index)
        r2 = ok(c2)
        if r2 is not None:
            case, raw = c2, r2
        return case, raw

    def save(self, f: Finding, folder: Path, minimize: bool = True) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        case, raw = self.minimize(f) if minimize else (f.case, materialize(self.seeds, f.case))
        py, c = self.run_one(raw, "min.orkpack")
        name = f"{f.target}-{hashlib.sha256(f.sig.encode()).hexdigest()[:10]}"
        if f.target == "python":
            expect = c.code if c is not None and c.crash is None else None
        elif f.target == "c":
            expect = py.code if py.crash is None else None
        else:
            expect = None
        side = {
            "expect": expect,
            "finding": {"target": f.target, "signature": f.sig},
            "python": {"code": py.code, "stage": py.stage, "message": py.msg[:400], "crash": py.crash,
                       "traceback": py.trace[-3000:]},
            "c": None if c is None else {"code": c.code, "stage": c.stage, "message": c.msg[:400], "crash": c.crash,
                                          "stderr": c.stderr[-3000:]},
            "case": case.to_json(),
            "found_by": "fuzz/fuzz_structure.py",
            "note": "expect: the exit code both readers must give; null until the finding is fixed and decided",
        }
        p = folder / f"{name}.orkpack"
        p.write_bytes(raw)
        (folder / f"{name}.json").write_text(json.dumps(side, indent=1, ensure_ascii=True) + "\n")
        f.saved = p
        return p


def fuzz(seeds: dict[str, bytes], *, seed: int = 0, cases: int | None = None, seconds: float | None = None,
         check: Path | None = None, batch: int = 250, save: Path | None = None, minimize: bool = True,
         start: int = 0, fork: bool = True, log=print) -> Session:
    """Run the fuzzer; returns the session (counters, findings). Stops after ``cases`` cases or
    ``seconds`` seconds (whichever comes first; one of them must be given)."""
    if cases is None and seconds is None:
        raise ValueError("give cases or seconds")
    names = sorted(seeds)
    work = Path(tempfile.mkdtemp(prefix="orkpack-structure-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        s = Session(seeds, CReader(check) if check else None, work, log, fork)
        t0 = time.monotonic()
        i = start
        while True:
            n = batch if cases is None else min(batch, start + cases - i)
            if n <= 0 or (seconds is not None and time.monotonic() - t0 >= seconds):
                break
            batch_cases = [make_case(seeds, names, seed, j) for j in range(i, i + n)]
            s.run_batch(batch_cases)
            i += n
        s.cases = i - start
        s.wall = time.monotonic() - t0
        if save is not None:
            for f in s.findings.values():
                try:
                    p = s.save(f, save, minimize)
                    log(f"saved {p} ({p.stat().st_size} bytes)")
                except Exception as e:
                    log(f"could not save the finding {f.sig}: {type(e).__name__}: {e}")
        return s
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(s: Session, seed: int, check_name: str | None, log=print) -> None:
    by = {"python": [], "c": [], "diff": []}
    for f in s.findings.values():
        by[f.target].append(f)
    n = lambda t: f"{len(by[t])} findings ({sum(f.count for f in by[t])} cases)"  # noqa: E731
    log(f"seed {seed}: {s.cases} cases in {s.wall / 60:.2f} min ({s.cases / max(s.wall, 1e-9) * 60:.0f} cases/min)")
    log(f"  python  (verify_pack: Pack.open + every check; again --reference --keep-going, two-step inflate; "
        f"{'a forked process per batch' if s.fork else 'in-process'}): {s.py_execs} executions, "
        f"{s.py_time / 60:.2f} min, {n('python')}")
    if check_name:
        log(f"  c       ({check_name}, {s.c.invocations} invocations): {s.c_execs} executions, {s.c_time / 60:.2f} min, "
            f"{n('c')}")
        log(f"  diff    (exit codes compared): {s.compared} comparisons, {n('diff')}")
    log("  python verdicts by check: " + ", ".join(f"{k} {v}" for k, v in sorted(s.stages.items(), key=lambda x: -x[1])))
    log("  exit codes (python, C): " + ", ".join(f"{k} {v}" for k, v in sorted(s.codes.items(), key=str)))
    for f in s.findings.values():
        log(f"  [{f.target}] {f.sig}: {f.count} cases" + (f", saved {f.saved}" if f.saved else ""))


# ------------------------------------------------------------------ the saved corpus

def slim(raw: bytes, keep: int = 3) -> bytes:
    """A smaller copy of a good pack for the saved corpus: its NPU tensors (at most 2), and a few others of
    distinct encodings (raw ones all kept), the tier map reduced to its board's IOVA facts, the
    unreferenced data pages dropped."""
    hb, data, minor = harness.split_pack(raw)
    h = json.loads(hb)
    chosen, seen, others = [], set(), 0
    npu = [t for t in h["tensors"] if any(s["tier"] == "npu" for s in t["slices"])][:2]
    for t in h["tensors"]:
        kind = tuple(sorted({(s["encoding"], s["tier"], "host_copy" in s, len(t["shape"])) for s in t["slices"]}))
        raw_t = t["slices"][0]["encoding"] == "raw"
        if any(t is x for x in npu) or raw_t or (kind not in seen and others < keep):
            chosen.append(t)
            seen.add(kind)
            others += not raw_t and not any(t is x for x in npu)
    h["tensors"] = [t for t in h["tensors"] if any(t is c for c in chosen)]
    tm = h.get("tiermap")
    if isinstance(tm, dict):
        board = tm.get("board") or {}
        h["tiermap"] = {k: tm[k] for k in ("schema", "version") if k in tm}
        h["tiermap"]["board"] = {k: board[k] for k in ("name", "iova_cap_bytes", "iova_usable_bytes") if k in board}
    new = compact(h, data)
    return harness.forge_pack(dumps(h).encode("ascii"), new)


# the seeds the saved corpus keeps (int8_npu and nf4_npu are what dual_int8 and dual_nf4 hold, and more)
CORPUS_SEEDS = ("dual_int8", "dual_nf4", "moe_int8", "moe_nf4", "rules", "writer")


def write_corpus(seeds: dict[str, bytes], folder: Path, log=print) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, raw in seeds.items():
        if name not in CORPUS_SEEDS:
            continue
        out = slim(raw)
        (folder / f"{name}.orkpack").write_bytes(out)
        log(f"{folder / name}.orkpack: {len(out)} bytes")


# ------------------------------------------------------------------ command line

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cases", type=int)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--start", type=int, default=0, help="first case index (to resume or split a run)")
    ap.add_argument("--check", type=Path, help="an orkpack-check to use (default: build one in a temp folder)")
    ap.add_argument("--sanitize", action="store_true", help="build orkpack-check with clang -fsanitize=address,undefined")
    ap.add_argument("--no-c", action="store_true", help="the Python reader only")
    ap.add_argument("--batch", type=int, default=250, help="packs per orkpack-check process")
    ap.add_argument("--seeds", type=Path, help="seed cache folder (default: a temp folder)")
    ap.add_argument("--corpus-only", action="store_true", help=f"seed only from {CORPUS.relative_to(ROOT)}")
    ap.add_argument("--no-corpus", action="store_true", help=f"seed only from the built packs, not {CORPUS.relative_to(ROOT)}")
    ap.add_argument("--save", type=Path, nargs="?", const=REGRESSIONS, help=f"save findings (default folder "
                    f"{REGRESSIONS.relative_to(ROOT)})")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--no-fork", action="store_true", help="run the Python reader in this process (a native crash "
                    "then ends the run)")
    ap.add_argument("--max-mem-mb", type=int, default=6144, help="address-space cap of the Python side (MemoryError "
                    "is a finding); 0: none")
    ap.add_argument("--write-corpus", type=Path, help="write the slimmed seed packs to this folder and stop")
    ap.add_argument("--replay", type=Path, nargs="+", help="run these packs through both readers and print the verdicts")
    a = ap.parse_args(argv)
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: where is it?
    sys.stdout.reconfigure(line_buffering=True)

    seeds = {} if a.corpus_only else build_seeds(a.seeds or default_seed_cache())
    if a.max_mem_mb:
        limit_memory(a.max_mem_mb)
    if a.write_corpus:
        write_corpus(seeds, a.write_corpus)
        return 0
    if not a.no_corpus:
        seeds.update(load_corpus())
    check = a.check
    tmp = Path(tempfile.mkdtemp(prefix="orkpack-structure-"))
    if not a.no_c and check is None:
        check = build_check(tmp, a.sanitize)
    creader = CReader(check) if check and not a.no_c else None
    try:
        if a.replay:
            s = Session(seeds, creader, tmp, fork=not a.no_fork)
            for p in a.replay:
                py, c = s.run_one(p.read_bytes())
                print(f"{p}: python {py.code} {py.stage} {py.msg[:160]!r}{' CRASH ' + py.crash if py.crash else ''}")
                if c:
                    print(f"{' ' * len(str(p))}  C      {c.code} {c.stage} {c.msg[:160]!r}{' CRASH ' + c.crash if c.crash else ''}")
            return 0
        if a.cases is None and a.seconds is None:
            a.cases = 1000
        print(f"{len(seeds)} seed packs: {', '.join(sorted(seeds))}")
        # the seeds themselves must pass both readers
        s0 = Session(seeds, creader, tmp, fork=not a.no_fork)
        for name, raw in sorted(seeds.items()):
            py, c = s0.run_one(raw)
            if py.code != 0 or (c is not None and c.code != 0):
                print(f"seed {name} does not pass: python {py.code} {py.msg[:200]}; C {c and c.code} {c and c.msg[:200]}")
        name = None if a.no_c else (f"{check.name}" + (" [ASan+UBSan]" if a.sanitize else ""))
        s = fuzz(seeds, seed=a.seed, cases=a.cases, seconds=a.seconds, check=None if a.no_c else check,
                 batch=a.batch, save=a.save, minimize=not a.no_minimize, start=a.start, fork=not a.no_fork)
        report(s, a.seed, name)
        return 1 if s.findings else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
