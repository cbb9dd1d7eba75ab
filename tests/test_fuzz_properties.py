"""Property tests (hypothesis): whatever the bytes, the pack reader (and inspect, render,
verify behind it), the safetensors header parser and the GGUF header parser raise only
OrkError. The same checks drive the atheris targets in fuzz/ (fuzz/harness.py)."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
import harness  # noqa: E402

from orkpack.build import BuildOptions, build  # noqa: E402
from orkpack.synth import write_gguf_model, write_hf_model  # noqa: E402

TINY = dict(layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=64)
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    d = tmp_path_factory.mktemp("fz")
    hf = write_hf_model(d / "hf", seed=0, shards=1, **TINY)
    pack = build(hf, d / "a.orkpack", BuildOptions(threads=1, npu=["blk.0.attn_q.weight"])).path.read_bytes()
    gg = write_gguf_model(d / "m.gguf", seed=0, tensor_type="Q8_0", **TINY).read_bytes()
    return pack, next(hf.glob("*.safetensors")).read_bytes(), gg


def _mutate(raw: bytes, edits, cut) -> bytes:
    b = bytearray(raw)
    for pos, val in edits:
        if b:
            b[pos % len(b)] = val
    if cut is not None and b:
        b = b[: cut % (len(b) + 1)]
    return bytes(b)


EDITS = st.lists(st.tuples(st.integers(0, 2**32), st.integers(0, 255)), max_size=8)
CUT = st.none() | st.integers(0, 2**32)


@SETTINGS
@given(edits=EDITS, cut=CUT, fix=st.booleans())
def test_pack_mutated_real_pack(real, edits, cut, fix):
    raw = _mutate(real[0], edits, cut)
    harness.check_pack(harness.fix_checksums(raw) if fix else raw)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=20,
)


def _leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))
    yield path


def _replace(obj, path, value):
    if not path:
        return value
    obj[path[0]] = _replace(obj[path[0]], path[1:], value)
    return obj


@SETTINGS
@given(data=st.data())
def test_pack_header_with_one_value_replaced(real, data):
    """A real header with one value anywhere swapped for random JSON, checksums correct."""
    raw = real[0]
    hoff = struct.unpack_from("<Q", raw, 40)[0]
    h = json.loads(raw[hoff:])
    # four pools, drawn alike: the top-level values; provenance values; the keys of tensor, slice
    # and part records; any value outside the (large, opaque) tier map
    everything = [q for q in _leaves(h) if q[:1] != ("tiermap",)]
    top = [(k,) for k in h]
    prov = [q for q in everything if q[:1] == ("provenance",)]
    records = [q for q in everything if q[:1] == ("tensors",) and len(q) in (3, 5, 7)]
    pools = st.sampled_from(top) | st.sampled_from(prov) | st.sampled_from(records) | st.sampled_from(everything)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(pools)
        try:
            h = _replace(h, path, data.draw(JSON))
        except (KeyError, IndexError, TypeError):
            pass
    hb = json.dumps(h).encode("ascii")
    harness.check_pack(harness.wrap_pack(hb, (hoff - 4096) // 4096, raw[4096:hoff]))


@SETTINGS
@given(header=JSON, pages=st.integers(0, 3))
def test_pack_random_header(header, pages):
    harness.check_pack(harness.wrap_pack(json.dumps(header).encode("ascii"), pages))


INT = st.integers(-(2**65), 2**65) | st.integers(0, 64) | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=3)
ENTRY = st.fixed_dictionaries(
    {"dtype": st.sampled_from(["F32", "F16", "BF16", "I8", "", 3]),
     "shape": st.lists(INT, max_size=4) | INT,
     "data_offsets": st.lists(INT, max_size=3) | INT}
)


@SETTINGS
@given(header=st.dictionaries(st.text(max_size=40), ENTRY | JSON, max_size=4), data=st.binary(max_size=300),
       raw_len=st.none() | st.integers(0, 2**64 - 1))
def test_safetensors_random_header(header, data, raw_len):
    hb = json.dumps(header).encode()
    n = len(hb) if raw_len is None else raw_len
    harness.check_safetensors(struct.pack("<Q", n) + hb + data)


@SETTINGS
@given(edits=EDITS, cut=CUT)
def test_safetensors_mutated_real_file(real, edits, cut):
    harness.check_safetensors(_mutate(real[1], edits, cut))


@SETTINGS
@given(edits=EDITS, cut=CUT)
def test_gguf_mutated_real_file(real, edits, cut):
    # aim half the edits at the header (the first ~3 kB: metadata and tensor table)
    edits = [(p % 3000 if i % 2 else p, v) for i, (p, v) in enumerate(edits)]
    harness.check_gguf(_mutate(real[2], edits, cut))


U64 = st.integers(0, 2**64 - 1) | st.integers(0, 40)


@SETTINGS
@given(n_t=U64, n_kv=U64, body=st.lists(st.one_of(
    st.binary(max_size=12), U64.map(lambda v: struct.pack("<Q", v)), st.integers(0, 13).map(lambda v: struct.pack("<I", v))),
    max_size=30))
def test_gguf_random_header(n_t, n_kv, body):
    harness.check_gguf(b"GGUF" + struct.pack("<IQQ", 3, n_t, n_kv) + b"".join(body))
