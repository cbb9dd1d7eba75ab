"""The C reader (kernels/reader: liborkpack + orkpack-check) against the Python one, differentially.

For every pack the Python side makes, good and bad, ``orkpack verify`` (verify_pack) and
``orkpack-check`` must agree on the exit code (0 passed, 1 a check failed, 2 unusable); for good
packs the bytes the C reader returns for every part, and the NPU images it loads through the real
paths, must hash to what the Python reader returns. Bad packs: a sample of single bit flips,
truncations, and hostile headers with valid checksums (the forging helpers and mutation lists of
tests/test_pack.py, tests/test_reliability_hostile.py, plus cases of Python's JSON semantics that a C
reader easily gets wrong: duplicate keys, 1 == 1.0 == true, NUL and lone surrogates in names).

Skips (saying why) without cc, make, or the libcjson-dev / libxxhash-dev headers.
"""
from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xxhash

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fuzz"))
import harness  # noqa: E402

from orkpack.pack import spec  # noqa: E402
from orkpack.pack.reader import Pack  # noqa: E402
from orkpack.pack.writer import header_bytes, preamble_bytes  # noqa: E402
from orkpack.runtime.backends import HostBackend  # noqa: E402
from orkpack.runtime.verify import _load, verify_pack  # noqa: E402

import test_pack  # noqa: E402
import test_reliability_hostile  # noqa: E402
from test_pack import INTDQ_BAD, write_intdq, write_nf4dq, write_raw, write_small  # noqa: E402
from test_verify import build as build_verify  # noqa: E402

def c_codes(check: Path, paths: list[Path]) -> list[int]:
    """orkpack-check on many packs in one run: one line per pack, its first word the result."""
    res = subprocess.run([str(check), "--", *map(str, paths)], capture_output=True, text=True, timeout=300)
    lines = res.stdout.splitlines()
    assert len(lines) == len(paths), res.stdout + res.stderr
    codes = [{"ok": 0, "FAIL": 1, "unusable": 2}[ln.split(" ", 1)[0]] for ln in lines]
    assert res.returncode == max(codes, default=0)
    return codes


def agree(check: Path, paths: list[Path]) -> None:
    got = c_codes(check, paths)
    bad = []
    for p, c in zip(paths, got):
        py = verify_pack(p).exit_code
        if py != c:
            one = subprocess.run([str(check), str(p)], capture_output=True, text=True).stdout.strip()
            bad.append(f"{p.name}: python {py}, C {c}: {one}")
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------- packs

def _rewrite(src: Path, dst: Path, mutate=None, raw_header: bytes | None = None, minor: int | None = None) -> Path:
    """dst = src with its header mutated (or replaced) and every checksum recomputed."""
    raw = src.read_bytes()
    pre = struct.unpack_from(spec.PREAMBLE_FMT, raw)
    data_size, hoff = pre[6], pre[7]
    if raw_header is None:
        h = json.loads(raw[hoff:])
        mutate(h)
        hb = header_bytes(h)
    else:
        hb = raw_header
    data = raw[4096:hoff]
    block = bytearray(preamble_bytes(file_size=hoff + len(hb), data_size=data_size, header_size=len(hb),
                                     data_xxh3=xxhash.xxh3_64_intdigest(data), header_xxh3=xxhash.xxh3_64_intdigest(hb)))
    if minor is not None:
        struct.pack_into("<H", block, 10, minor)
        block[120:128] = bytes(8)
        struct.pack_into("<Q", block, 120, xxhash.xxh3_64_intdigest(bytes(block[:4096])))
    dst.write_bytes(bytes(block) + data + hb)
    return dst


def _untied_head_pack(d: Path) -> Path:
    """A smoothed pack whose tied head became a smoothed copy output.weight (orkpack/transforms/smooth.py): one tensor more,
    the same source_name twice, smoothing records with an ``untied`` role."""
    import numpy as np

    from orkpack.build import BuildOptions, build
    from orkpack import stats as act_stats
    from orkpack.eval import imatrix
    from orkpack.synth import TINY, write_hf_model

    model = write_hf_model(d / "tied", config=json.loads(json.dumps(TINY["qwen2"])), shards=1, seed=4)
    ids = d / "ids.txt"
    ids.write_text(" ".join(str(int(i)) for i in np.random.default_rng(1).integers(0, 128, 96)))
    st = d / "st.gguf"
    act_stats.save(imatrix.collect(model, tokens=ids, ctx=48), st)
    out = build(model, d / "untied_head.orkpack", BuildOptions(threads=1, plan=False, npu=["*"], imatrix=st,
                                                               smooth_alpha=0.5)).path
    with Pack.open(out) as p:
        assert "output.weight" in {t["name"] for t in p.tensors}
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("good")
    packs = {}
    for storage in ("int8", "nf4", "both", "experts"):
        packs[storage] = build_verify(d / f"{storage}.orkpack", storage=storage)
    packs["big"] = build_verify(d / "big.orkpack", big=True)  # K > 8192: two segments, N not a multiple of 32
    write_small(d / "small.orkpack")
    packs["small"] = d / "small.orkpack"
    write_raw(d / "raw.orkpack")
    packs["raw"] = d / "raw.orkpack"
    write_nf4dq(d / "nf4dq.orkpack")  # format 1.5: nf4dq host slices and host copies
    packs["nf4dq"] = d / "nf4dq.orkpack"
    write_intdq(d / "intdq.orkpack")  # format 1.7: int5dq, int6dq, int8dq host slices
    packs["intdq"] = d / "intdq.orkpack"
    packs["untied_head"] = _untied_head_pack(d)
    try:
        import test_dual_residency as tdr

        if "host_copy" in tdr.Decision.__dataclass_fields__:
            from orkpack.build import BuildOptions, build
            from orkpack.synth import write_hf_model

            model = write_hf_model(d / "model", seed=3, **tdr.MODEL)
            tmf = tdr.write_tiermap(d / "map.json", tdr.hand_tiermap(model))
            packs["dual_int8"] = build(model, d / "dual_int8.orkpack", BuildOptions(threads=1, tiermap=tmf)).path
            packs["dual_nf4"] = build(model, d / "dual_nf4.orkpack",
                                      BuildOptions(threads=1, tiermap=tmf, npu_storage="nf4")).path
            packs["moe_rules"] = build(model, d / "moe.orkpack", BuildOptions(threads=1)).path
    except ImportError:
        pass
    return packs


def test_good_packs_pass_in_both(check, good):
    paths = list(good.values())
    assert c_codes(check, paths) == [0] * len(paths)
    assert [verify_pack(p).exit_code for p in paths] == [0] * len(paths)
    if "dual_int8" not in good:
        pytest.skip("dual-residency packs not built (needs Decision.host_copy in orkpack/tiers/tiermap.py)")


def _reference_decode(pack: Pack, rec: dict) -> np.ndarray:
    """The numpy reference decode (orkpack/codecs/reference.py) of a host nf4, nf4dq or intdq slice record."""
    from orkpack.codecs.reference import intdq_decode, nf4_decode, nf4dq_decode

    parts = pack.typed_parts(rec)
    n = int(np.prod(rec["shape"], dtype=np.int64))
    with np.errstate(over="ignore", invalid="ignore"):
        if rec["encoding"] == spec.ENC_NF4:
            return nf4_decode(parts["codes"], parts["absmax"], (n,))
        if rec["encoding"] in spec.INTDQ_BITS:
            return intdq_decode(*(parts[k] for k in spec.PARTS[rec["encoding"]]), (n,), spec.INTDQ_BITS[rec["encoding"]])
        return nf4dq_decode(*(parts[k] for k in spec.PARTS[spec.ENC_NF4DQ]), (n,))


def test_c_bytes_equal_python_bytes(check, good):
    """Every part's bytes and every NPU image loaded by the C paths hash as the Python reader's do, and the
    C decode (orkpack_decode_nf4) of every host nf4 / nf4dq slice and host copy is the numpy reference's,
    bit for bit."""
    from orkpack.pack.reader import host_copy_slice

    backend = HostBackend()
    ndq = 0
    for name, p in good.items():
        res = subprocess.run([str(check), "--dump", str(p)], capture_output=True, text=True)
        assert res.returncode == 0, res.stdout
        parts, npu, dec = {}, {}, {}
        for ln in res.stdout.splitlines():
            f = ln.split("\t")
            if f[0] in ("part", "host"):
                parts[(f[0], int(f[1]), int(f[2]), f[3])] = (int(f[4]), int(f[5]), f[6])
            elif f[0] == "npu":
                npu[(int(f[1]), int(f[2]))] = (int(f[3]), f[4], f[5])
            elif f[0] == "dec":
                dec[(f[3], int(f[1]), int(f[2]))] = (f[4], int(f[5]), f[6])
        want_parts, want_npu, want_dec = {}, {}, {}
        with Pack.open(p) as pack:
            for ti, t in enumerate(pack.tensors):
                for si, s in enumerate(t["slices"]):
                    for pn, pr in s["parts"].items():
                        want_parts[("part", ti, si, pn)] = (pr["offset"], pr["size"], xxhash.xxh3_64_hexdigest(pack.part(pr)))
                    for pn, pr in (s.get("host_copy") or {}).get("parts", {}).items():
                        want_parts[("host", ti, si, pn)] = (pr["offset"], pr["size"], xxhash.xxh3_64_hexdigest(pack.part(pr)))
                    for where, rec in (("part", s), ("host", host_copy_slice(s))):
                        if rec is not None and rec["tier"] == "host" and \
                                rec["encoding"] in spec.NF4_ENCODINGS + spec.INTDQ_ENCODINGS:
                            d = _reference_decode(pack, rec)
                            want_dec[(where, ti, si)] = (rec["encoding"], d.size, xxhash.xxh3_64_hexdigest(d))
                            ndq += rec["encoding"] in (spec.ENC_NF4DQ, spec.ENC_INT5DQ)  # a default build's low level
                    if s["tier"] == "npu":
                        buf, q, scale = _load(pack, s, backend, "direct", None, {"fill_seconds": 0.0, "bytes_filled": 0,
                                                                                 "inflate_seconds": 0.0, "bytes_inflated": 0})
                        want_npu[(ti, si)] = (q.nbytes, xxhash.xxh3_64_hexdigest(q), xxhash.xxh3_64_hexdigest(scale))
                        del q
                        backend.free(buf)
        assert parts == want_parts, name
        assert npu == want_npu, name
        assert dec == want_dec, name
        if name == "nf4dq":
            assert sum(v[0] == "nf4dq" for v in dec.values()) == 7  # its 5 host slices and 2 host copies
        if name == "intdq":
            assert sorted(v[0] for v in dec.values()) == ["int5dq", "int5dq", "int6dq", "int8dq", "int8dq"]
    assert ndq > 7 or "dual_int8" not in good  # and those a build writes (its low level: nf4dq, or int5dq where the
    # plan chooses it, as on these tiny models)
    backend.close()


def test_bit_flips_agree(check, good, tmp_path):
    """A sample of single bit flips (every preamble field bit, header and data bytes): both exit 1."""
    rnd = random.Random(11)
    paths = []
    for name in ("both", "experts", "raw", "small", "nf4dq") + (("dual_nf4",) if "dual_nf4" in good else ()):
        data = good[name].read_bytes()
        hoff = int.from_bytes(data[40:48], "little")
        spots = [(i, b) for i in range(0, 128) for b in range(8) if rnd.random() < 0.15]
        spots += [(rnd.randrange(128, 4096), rnd.randrange(8)) for _ in range(5)]
        spots += [(rnd.randrange(4096, hoff), rnd.randrange(8)) for _ in range(25)]
        spots += [(rnd.randrange(hoff, len(data)), rnd.randrange(8)) for _ in range(40)]
        for i, b in spots:
            bad = bytearray(data)
            bad[i] ^= 1 << b
            q = tmp_path / f"{name}-{i}-{b}.orkpack"
            q.write_bytes(bad)
            paths.append(q)
    agree(check, paths)


def test_truncations_agree(check, good, tmp_path):
    data = good["both"].read_bytes()
    hoff = int.from_bytes(data[40:48], "little")
    paths = []
    for cut in (0, 1, 7, 8, 100, 4095, 4096, 5000, hoff, hoff + 1, len(data) - 1):
        q = tmp_path / f"cut{cut}.orkpack"
        q.write_bytes(data[:cut])
        paths.append(q)
    q = tmp_path / "long.orkpack"
    q.write_bytes(data + b"\0")
    paths.append(q)
    q = tmp_path / "notpack.safetensors"
    q.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(5000))
    paths.append(q)
    agree(check, paths)


def _marked(fn) -> list:
    """The (mutate, why) cases of a parametrized test of another module."""
    for m in getattr(fn, "pytestmark", []):
        if m.name == "parametrize":
            return [v[0] for v in m.args[1]]
    return []


def _set(path, value):
    def f(h):
        o = h
        for k in path[:-1]:
            o = o[k]
        o[path[-1]] = value
    return f


S = ("tensors", 0, "slices", 0)  # first slice of the "both" pack: blk.0.attn_q.weight, NPU int8 [32, 32]
N = ("tensors", 1, "slices", 0)  # blk.0.ffn_up.weight, NPU nf4 [32, 64]

HOSTILE_BOTH = [
    _set(S + ("parts", "q", "offset"), 10 ** 12),              # offset past the data
    _set(S + ("parts", "q", "offset"), -4096),
    _set(S + ("parts", "q", "offset"), 2 ** 70),
    _set(S + ("parts", "q", "offset"), 4096.0),               # a float offset
    _set(S + ("parts", "q", "size"), True),
    _set(N + ("parts", "codes", "offset"), 4096),             # overlapping parts
    _set(("tensors", 0, "shape"), [2 ** 47, 2 ** 47]),        # huge shape
    _set(("tensors", 0, "shape"), [-32, 32]),                 # negative shape
    _set(("tensors", 0, "shape"), [2 ** 64, 1]),
    _set(S + ("encoding",), "int3"),                          # unknown encoding
    _set(S + ("encoding",), ["int8"]),
    _set(S + ("min_m",), 1),                                  # min_m < 2 on an NPU slice
    _set(S + ("min_m",), 2.0),
    _set(S + ("min_m",), True),
    _set(S + ("min_m",), 10 ** 30),                           # a huge min_m is valid
    _set(S + ("min_m",), -10 ** 30),
    _set(S + ("layout", "k_segment"), 96),
    _set(S + ("layout", "n_pad"), 32.0),                      # 32.0 == 32: valid
    _set(S + ("layout", "n_pad"), 32.5),
    _set(S + ("layout", "segments"), [[False, 32, 32]]),       # False == 0: valid
    _set(S + ("layout", "segments"), [[0, 32, 32], [32, 32, 0]]),
    _set(S + ("layout", "tile_n"), True),
    _set(S + ("shape",), [32.0, True * 32]),                  # slice shape equal to the tensor's: valid
    _set(S + ("shape",), [32, 31]),
    _set(S + ("expert",), 0),
    _set(S + ("expert",), False),
    _set(S + ("sqnr_db",), "40"),
    _set(S + ("sqnr_db",), 1e300),
    _set(S + ("tier",), "host"),                              # npu_int8 layout off the NPU
    _set(S + ("tier",), None),
    _set(S + ("parts", "q", "xxh3"), "ABCDEF0123456789"),
    _set(S + ("parts", "q", "xxh3"), "abcdef012345678"),
    _set(N + ("inflate", "q_size"), 1024),                    # verify's layout check: not the tiled size
    _set(N + ("inflate", "q_size"), -1),
    _set(N + ("inflate", "layout", "k_segment"), 64),
    _set(N + ("inflate", "layout", "k_segment"), 8192.0),
    _set(N + ("inflate", "q_xxh3"), "0" * 16),                # the inflated image differs
    _set(N + ("inflate",), None),
    _set(N + ("tier",), "host"),                              # a host nf4 slice with a stray inflate: valid
    _set(("tensors", 0, "name"), "\x00" * 4097),
    _set(("tensors", 0, "name"), "\x00" * 4096),
    _set(("tensors", 0, "name"), "\ud800" * 1365),            # lone surrogates, 3 bytes each: 4095
    _set(("tensors", 0, "name"), "\ud800" * 1366),
    _set(("tensors", 1, "slices", 0, "host_copy"), None),
    _set(("tensors", 1, "slices", 0, "host_copy"), {"encoding": "nf5"}),
    _set(("tiermap",), {"board": {"iova_usable_bytes": 4096}}),  # arena: the NPU slices do not fit
    _set(("tiermap",), {"board": {"iova_usable_bytes": 2 ** 33}, "npu": {"cap": 100}}),
    _set(("tiermap",), {"npu": {"cap": True}}),
    _set(("tiermap",), 3),
    _set(("config",), []),
    _set(("format",), "orkpack2"),
    _set(("tensors",), {}),
]

DQ0 = ("tensors", 0, "slices", 0)  # the nf4dq pack (test_pack.write_nf4dq): a host nf4dq [33, 70]
DQ4 = ("tensors", 4, "slices", 0)  # NPU int8 [40, 96] with an nf4dq host copy

NF4DQ_MORE = [
    _set(DQ0 + ("parts", "absmax_q", "size"), 2 ** 64),
    _set(DQ0 + ("parts", "absmax_scale", "size"), -4),
    _set(DQ0 + ("parts", "absmax_offset", "size"), 4.0),       # a float size
    _set(DQ0 + ("parts", "absmax_offset", "offset"), 2 ** 70),
    _set(DQ0 + ("parts", "absmax_q", "xxh3"), "0" * 16),        # a damaged part: the parts check
    _set(DQ4 + ("host_copy", "parts", "absmax_scale", "xxh3"), "0" * 16),
    _set(DQ0 + ("parts",), {}),
    _set(DQ0 + ("parts",), None),
    _set(DQ0 + ("tier",), "npu"),                                # NPU nf4dq, no min_m
    _set(DQ0 + ("inflate",), {"q_size": 1}),                     # a host nf4dq with a stray inflate: valid, as nf4
    _set(DQ0 + ("min_m",), 7),                                   # a host slice's min_m: valid
    _set(DQ4 + ("host_copy", "sqnr_db"), "x"),
    _set(DQ4 + ("host_copy", "parts", "absmax_q"), None),
    _set(DQ4 + ("host_copy", "parts", "absmax_scale", "size"), 2 ** 63),
    _set(DQ4 + ("encoding",), "nf4dq"),                          # NPU nf4dq with tiles as parts
    _set(("tensors", 0, "shape"), [2 ** 47, 2 ** 47]),
    _set(("tensors", 0, "shape"), [33 * 70]),
    _set(("tensors", 0, "shape"), [0, 70]),
]

RAW_HEADERS = [
    b"[" * 100000 + b"]" * 100000,                            # deep JSON
    b"[" * 50 + b"]" * 50,
    b'{"format": "orkpack", "tensors": [], "x": NaN}',        # NaN in JSON
    b'{"format": "orkpack", "tensors": [], "x": Infinity}',
    b'{"format": "orkpack", "tensors": [], "x": -Infinity}',
    b'{"format": "orkpack", "tensors": [], "x": 1e400}',      # inf from a number: Python accepts
    b'{"format": "orkpack", "tensors": [], "x": 01}',
    b'{"format": "orkpack", "tensors": [], "x": 1.}',
    b'{"format": "orkpack", "tensors": [], "x": .5}',
    b'{"format": "orkpack", "tensors": [], "x": -}',
    b'{"format": "orkpack", "tensors": [], "x": 1' + b"0" * 100 + b"}",
    b'{"format": "orkpack", "tensors": [], "x": 1' + b"0" * 4300 + b"}",  # 4301 digits: Python refuses
    b'{"format": "orkpack", "tensors": [], "x": "\\ud800"}',
    b'{"format": "orkpack", "tensors": [], "x": "\\udc00\\ud800"}',
    b'{"format": "orkpack", "tensors": [], "x": "a\tb"}',     # a raw tab in a string
    b'{"format": "orkpack", "tensors": [], "x": "\\x"}',
    b'{"format": "orkpack", "tensors": []}\x0c',             # form feed is not JSON whitespace
    b'{"format": "orkpack", "tensors": []}   \n',
    b'{"format": "orkpack", "tensors": [],}',
    b'{"format": "orkpack", "tensors": []} {}',
    b'{"format": "orkpack", "tensors": [], "format": "x"}',  # duplicate key: the last wins
    b'{"format": "x", "tensors": [], "format": "orkpack"}',
    b'{"format": "orkpack", "tensors": [], "x": "\xc3\xa9"}',  # not ASCII
    b'{"format": "orkpack", "tensors": [], "x": "\\u00e9\\u0000"}',
    b'{"format": "orkpack", "tensors": [], "x": tru}',
    b'{"format": "orkpack", "tensors": [], "x": [1, 2,]}',
    b'"orkpack"',
    b" ",
]


def test_hostile_headers_agree(check, good, tmp_path):
    both, raw, small = good["both"], good["raw"], good["small"]
    paths = []
    k = 0

    def add(src, **kw):
        nonlocal k
        k += 1
        paths.append(_rewrite(src, tmp_path / f"h{k}.orkpack", **kw))

    for fn in HOSTILE_BOTH:
        add(both, mutate=fn)
    for fn in _marked(test_pack.test_inconsistent_header_refused):
        add(small, mutate=fn)
    for fn in _marked(test_pack.test_inconsistent_raw_refused):
        add(raw, mutate=fn)
    for fn in _marked(test_pack.test_inconsistent_nf4dq_refused):
        add(good["nf4dq"], mutate=fn)
    for fn in NF4DQ_MORE:
        add(good["nf4dq"], mutate=fn)
    for fn in _marked(test_reliability_hostile.test_crafted_header_is_damage_not_a_crash):
        add(small, mutate=fn)
    for hb in RAW_HEADERS:
        add(both, raw_header=hb)
    # duplicate keys inside a slice: Python keeps the last value at the first key's place
    hb = (good["both"].read_bytes()[int.from_bytes(good["both"].read_bytes()[40:48], "little"):])
    assert b'"min_m":32' in hb and b'"parts":{"q":' in hb  # (the writer's compact JSON: the edits below bite)
    add(both, raw_header=hb.replace(b'"min_m":32', b'"min_m": 1, "min_m": 32', 1))
    add(both, raw_header=hb.replace(b'"min_m":32', b'"min_m": 32, "min_m": 1', 1))
    add(both, raw_header=hb.replace(b'"parts":{"q":', b'"parts": {"scale": 0, "q": ', 1))
    # an unknown encoding (slice, raw dtype, host copy) from a newer minor version: unusable (2), not damage
    add(both, mutate=_set(S + ("encoding",), "q3_z"), minor=spec.VERSION_MINOR_MAX + 1)
    add(raw, mutate=_set(("tensors", 0, "slices", 0, "dtype"), "i128"), minor=spec.VERSION_MINOR_MAX + 1)
    add(both, mutate=_set(N + ("host_copy",), {"encoding": "nf5"}), minor=spec.VERSION_MINOR_MAX + 1)
    dq = good["nf4dq"]
    add(dq, mutate=_set(DQ4 + ("host_copy", "encoding"), "nf4dq2"), minor=spec.VERSION_MINOR_MAX + 1)
    add(dq, mutate=_set(DQ0 + ("encoding",), "nf4dq2"), minor=spec.VERSION_MINOR_MAX + 1)
    add(dq, mutate=_set(DQ0 + ("encoding",), "nf4dq2"), minor=spec.VERSION_MINOR)   # same minor: damaged
    idq = good["intdq"]
    add(idq, mutate=_set(DQ0 + ("encoding",), "int4dq"), minor=spec.VERSION_MINOR_MAX + 1)
    add(idq, mutate=_set(DQ0 + ("encoding",), "int7dq"), minor=spec.VERSION_MINOR)    # same minor: damaged
    for fn, _ in INTDQ_BAD:  # the Python reader's intdq refusals: the C reader refuses them too
        add(idq, mutate=fn)
    # nf4dq parts with repeated keys: Python keeps the last value at the first key's place
    hdq = dq.read_bytes()[int.from_bytes(dq.read_bytes()[40:48], "little"):]
    first = hdq.index(b'"absmax_offset":{')
    rec = hdq[first:hdq.index(b"}", first) + 1]
    add(dq, raw_header=hdq.replace(rec, rec + b', "codes": ' + rec[len(b'"absmax_offset":'):], 1))  # codes -> offset's record: size
    add(dq, raw_header=hdq.replace(rec, rec + b', "absmax_offset": ' + rec[len(b'"absmax_offset":'):], 1))  # the same: valid
    assert hdq.startswith(b"{") and b'"parts":{"codes":' in hdq  # (compact JSON: the edits bite)
    add(dq, raw_header=hdq.replace(b'"parts":{"codes":', b'"parts":{"absmax_q":0,"codes":', 1))  # out of order
    # ... unless the header is damaged before that slice
    add(both, mutate=lambda h: (h["tensors"][0].update(shape=[-1, 1]), h["tensors"][1]["slices"][0].update(encoding="q3_z")),
        minor=spec.VERSION_MINOR_MAX + 1)
    add(both, mutate=_set(S + ("encoding",), "q3_z"), minor=0)
    # wrapped arbitrary headers around zero pages (the fuzz harness's mode 2)
    for hb in (b"{}", b'{"format": "orkpack", "tensors": []}', b"[]"):
        k += 1
        q = tmp_path / f"w{k}.orkpack"
        q.write_bytes(harness.wrap_pack(hb, 0))
        paths.append(q)
    agree(check, paths)


@pytest.fixture(scope="module")
def check_aarch64(tmp_path_factory, check) -> Path:
    """orkpack-check cross-built for aarch64, run under qemu (a wrapper script)."""
    cc = shutil.which("aarch64-linux-gnu-gcc")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    libs = [Path("/usr/lib/aarch64-linux-gnu") / n for n in ("libcjson.so", "libxxhash.so")]
    if not cc or not qemu or not all(p.exists() for p in libs):
        pytest.skip("aarch64 C reader not checked: needs aarch64-linux-gnu-gcc, qemu-aarch64 and the arm64 libraries "
                    "(dpkg --add-architecture arm64; apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross "
                    "qemu-user-static libcjson-dev:arm64 libxxhash-dev:arm64)")
    out = tmp_path_factory.mktemp("creader-aarch64")
    res = subprocess.run(["make", "-s", "-C", str(ROOT / "kernels" / "reader"), f"O={out}", "CROSS=aarch64-linux-gnu-"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    wrapper = out / "run.sh"
    wrapper.write_text(f"#!/bin/sh\nQEMU_LD_PREFIX=/usr/aarch64-linux-gnu LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu "
                       f"exec {qemu} {out / 'orkpack-check'} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def test_aarch64_build_agrees(check, check_aarch64, good, tmp_path):
    """The aarch64 build (NEON inflate) returns the same part bytes and NPU images, and the same exit codes."""
    for name, p in good.items():
        x86 = subprocess.run([str(check), "--dump", str(p)], capture_output=True, text=True)
        arm = subprocess.run([str(check_aarch64), "--dump", str(p)], capture_output=True, text=True)
        assert arm.returncode == x86.returncode == 0, arm.stdout + arm.stderr
        assert arm.stdout.splitlines()[:-1] == x86.stdout.splitlines()[:-1], name  # all but the timing line
    data = good["both"].read_bytes()
    paths = []
    for i, cut in enumerate((0, 100, 4096, len(data) - 1)):
        q = tmp_path / f"cut{i}.orkpack"
        q.write_bytes(data[:cut])
        paths.append(q)
    for i in (9, 60, 200, 5000, len(data) - 3):
        q = tmp_path / f"flip{i}.orkpack"
        b = bytearray(data)
        b[i] ^= 4
        q.write_bytes(b)
        paths.append(q)
    assert c_codes(check_aarch64, paths) == c_codes(check, paths)


def test_readme_example_loads_a_tensor(check, good, tmp_path):
    """The example of docs/READER.md compiles against the library and loads an NPU tensor."""
    import re

    text = (ROOT / "docs" / "READER.md").read_text()
    src = re.search(r"## Example: load one NPU tensor\n\n```c\n(.*?)```", text, re.S).group(1)
    (tmp_path / "example.c").write_text(src)
    lib = check.parent / "liborkpack.a"
    cc = shutil.which("cc") or shutil.which("gcc")
    res = subprocess.run([cc, "-std=c99", f"-I{ROOT / 'kernels' / 'reader'}", str(tmp_path / "example.c"), str(lib),
                          "-lcjson", "-lxxhash", "-lm", "-lpthread", "-o", str(tmp_path / "example")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight"):  # int8 tiles (fill), nf4 (inflate)
        run = subprocess.run([str(tmp_path / "example"), str(good["both"]), name], capture_output=True, text=True)
        assert run.returncode == 0 and f"{name} [32, " in run.stdout, run.stdout + run.stderr


def test_intdq_on_the_npu_refused_by_both_with_one_meaning(check, good, tmp_path):
    """An intdq slice on the NPU tier: both readers refuse it at open as a damaged pack (exit 1), in the same words;
    the intdq pack passes both, and the C reader lists the four parts of each slice."""
    idq = good["intdq"]
    for i, (where, enc) in enumerate([((0, 0), "int5dq"), ((1, 0), "int6dq"), ((3, 1), "int8dq")]):
        p = _rewrite(idq, tmp_path / f"npu{i}.orkpack",
                     mutate=lambda h, w=where: h["tensors"][w[0]]["slices"][w[1]].update(tier="npu", min_m=32))
        py = verify_pack(p)
        c = subprocess.run([str(check), str(p)], capture_output=True, text=True)
        assert py.exit_code == c.returncode == 1, (py.failures, c.stdout)
        want = f"{enc} slices live on the host (an NPU slice is int8, or nf4 to inflate)"
        assert want in py.failures[0] and want in c.stdout, (py.failures, c.stdout)
    assert c_codes(check, [idq]) == [0] and verify_pack(idq).exit_code == 0
    out = subprocess.run([str(check), "--dump", str(idq)], capture_output=True, text=True).stdout
    assert sorted(ln.split("\t")[3] for ln in out.splitlines() if ln.startswith("part\t1\t")) == sorted(spec.PARTS["int6dq"])


def test_nf4dq_on_the_npu_refused_by_both_with_one_meaning(check, good, tmp_path):
    """An nf4dq slice on the NPU tier (with or without min_m, a stacked expert, an nf4 NPU slice recoded): both
    readers refuse it at open as a damaged pack (exit 1) and say why in the same words; nf4dq host slices and
    nf4dq host copies of NPU int8 / nf4 slices pass both."""
    dq = good["nf4dq"]
    cases = [_set(DQ0 + ("tier",), "npu"), lambda h: h["tensors"][0]["slices"][0].update(tier="npu", min_m=32),
             lambda h: h["tensors"][3]["slices"][1].update(tier="npu", min_m=2)]
    paths = [_rewrite(dq, tmp_path / f"npu{i}.orkpack", mutate=fn) for i, fn in enumerate(cases)]
    for p in paths:
        py = verify_pack(p)
        c = subprocess.run([str(check), str(p)], capture_output=True, text=True)
        assert py.exit_code == c.returncode == 1, (py.failures, c.stdout)
        want = "nf4dq slices live on the host (an NPU slice is int8, or nf4 to inflate)"
        assert want in py.failures[0] and want in c.stdout, (py.failures, c.stdout)
    assert c_codes(check, [dq]) == [0] and verify_pack(dq).exit_code == 0
    out = subprocess.run([str(check), "--dump", str(dq)], capture_output=True, text=True).stdout
    host = sorted(ln.split("\t")[3] for ln in out.splitlines() if ln.startswith("host\t4\t"))
    assert host == sorted(spec.PARTS[spec.ENC_NF4DQ])  # the int8 NPU slice's host copy: the 4 nf4dq parts
