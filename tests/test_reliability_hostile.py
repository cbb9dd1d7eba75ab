"""Hostile input: crafted packs, safetensors and GGUF headers are refused with one
OrkError line (never another exception, never a huge allocation), and names are
shown escaped. Each case is a regression test for a hole found by auditing or fuzzing."""
from __future__ import annotations

import io
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
import harness  # noqa: E402

from orkpack.errors import OrkError, PackError, SourceError  # noqa: E402
from orkpack.inspect import pack_facts  # noqa: E402
from orkpack.pack.reader import Pack, PackDamaged  # noqa: E402
from orkpack.pack.writer import header_bytes  # noqa: E402
from orkpack.sources import open_source  # noqa: E402
from orkpack.sources.gguf import GGUFSource  # noqa: E402
from orkpack.sources.safetensors import SafetensorsSource  # noqa: E402

from test_pack import write_nf4dq, write_small  # noqa: E402


def _header_and_data(raw: bytes) -> tuple[dict, bytes]:
    """A pack's header JSON (from the preamble's header offset) and its data section's bytes."""
    hoff = struct.unpack_from("<Q", raw, 40)[0]
    return json.loads(raw[hoff:]), raw[4096:hoff]


@pytest.fixture(scope="module")
def header(tmp_path_factory):
    p = tmp_path_factory.mktemp("h") / "a.orkpack"
    write_small(p)
    head, data = _header_and_data(p.read_bytes())
    return head, len(data) // 4096


def _wrapped(tmp_path, h, pages, raw_header: bytes | None = None) -> Path:
    p = tmp_path / "x.orkpack"
    p.write_bytes(harness.wrap_pack(raw_header if raw_header is not None else header_bytes(h), pages))
    return p


def _mut(h, fn):
    h = json.loads(json.dumps(h))
    fn(h)
    return h


@pytest.mark.parametrize(
    "fn,why",
    [
        (lambda h: h.update(tool="x"), "tool"),
        (lambda h: h.update(provenance=[1]), "provenance"),
        (lambda h: h.update(tiermap=7), "tiermap"),
        (lambda h: h["tensors"][0].pop("source_name"), "source_name"),
        (lambda h: h["tensors"][0]["slices"][0].update(sqnr_db="high"), "sqnr_db"),
        (lambda h: h["tensors"][0]["slices"][0].update(expert=False), "expert"),
        (lambda h: h["tensors"][0]["slices"][0]["parts"]["data"].update(xxh3="zzzzzzzzzzzzzzzz"), "checksum"),
        # a shape whose product is astronomically larger than the file (no allocation, no long loop)
        (lambda h: (h["tensors"][2].update(shape=[2**47, 2**47]), h["tensors"][2]["slices"][0].update(shape=[2**47, 2**47])), "data section"),
        (lambda h: (h["tensors"][2].update(shape=[2**60, 1]), h["tensors"][2]["slices"][0].update(shape=[2**60, 1])), "bad shape"),
        # npu_int8 with a huge K: refused before a segment list is built
        (lambda h: (h["tensors"][2].update(shape=[1, 2**40]), h["tensors"][2]["slices"][0].update(
            shape=[1, 2**40], encoding="int8", tier="npu", min_m=32,
            layout={"kind": "npu_int8", "k_segment": 32, "segments": []})), "shape"),
        # an NPU nf4 slice without its inflate record used to crash `orkpack inspect` (KeyError)
        (lambda h: h["tensors"][2]["slices"][0].update(tier="npu", min_m=32), "inflate"),
    ],
)
def test_crafted_header_is_damage_not_a_crash(tmp_path, header, fn, why):
    h, pages = header
    p = _wrapped(tmp_path, _mut(h, fn), pages)
    with pytest.raises(PackDamaged, match=why):
        Pack.open(p)
    harness.check_pack(p.read_bytes())  # inspect, render, verify: OrkError only


@pytest.fixture(scope="module")
def dq_pack(tmp_path_factory):
    """test_pack.write_nf4dq: nf4dq host slices (0-3), NPU int8 (4) and nf4 (5) slices with nf4dq host copies."""
    p = tmp_path_factory.mktemp("dq") / "dq.orkpack"
    write_nf4dq(p)
    return _header_and_data(p.read_bytes())


def _dq_slice(h, i=0, s=0):
    return h["tensors"][i]["slices"][s]


@pytest.mark.parametrize(
    "fn,why",
    [
        # nf4dq (format 1.5) sizes the reader must not trust: each refused before anything is sized from it
        (lambda h: _dq_slice(h)["parts"]["absmax_q"].update(size=2**62), "absmax_q is"),
        (lambda h: _dq_slice(h)["parts"]["absmax_scale"].update(size=-4), "absmax_scale is"),
        (lambda h: _dq_slice(h)["parts"]["absmax_offset"].update(size=True), "malformed part absmax_offset"),
        (lambda h: _dq_slice(h)["parts"].pop("absmax_scale"), "parts are not"),
        (lambda h: _dq_slice(h)["parts"].update(absmax_offset=None), "malformed part absmax_offset"),
        (lambda h: (h["tensors"][0].update(shape=[2**47, 2**47]), _dq_slice(h).update(shape=[2**47, 2**47])), "data section"),
        (lambda h: _dq_slice(h).update(tier="npu", min_m=32), "nf4dq slices live on the host"),
        (lambda h: _dq_slice(h, 4)["host_copy"]["parts"]["absmax_q"].update(size=2**64), "host copy part absmax_q"),
        (lambda h: _dq_slice(h, 4)["host_copy"]["parts"].pop("absmax_offset"), "host copy parts are not"),
        (lambda h: _dq_slice(h, 4)["host_copy"].update(encoding=["nf4dq"]), "unknown host copy encoding"),
    ],
)
def test_crafted_nf4dq_header_is_damage_not_a_crash(tmp_path, dq_pack, fn, why):
    h, data = dq_pack
    p = tmp_path / "x.orkpack"
    p.write_bytes(harness.wrap_pack(header_bytes(_mut(h, fn)), len(data) // 4096, data))
    with pytest.raises(PackDamaged, match=why):
        Pack.open(p)
    harness.check_pack(p.read_bytes())  # inspect, render, verify: OrkError only


def test_nf4dq_host_slices_through_every_reader_path(dq_pack):
    """A valid pack of nf4dq host slices (no host copies): open, inspect, render and verify --reference."""
    h, data = dq_pack
    h = _mut(h, lambda h: h.update(tensors=h["tensors"][:4]))
    raw = harness.wrap_pack(header_bytes(h), len(data) // 4096, data)
    harness.check_pack(raw)
    from orkpack.runtime.verify import verify_pack

    assert verify_pack(harness.scratch("dq.orkpack", raw), reference=True).exit_code == 0


def test_nf4dq_host_copies_through_verify_reference(dq_pack):
    """nf4dq host copies of NPU int8 and nf4 slices through open, inspect, render and verify --reference (which
    read a host copy's 'absmax' part before it knew nf4dq: a KeyError). The nf4dq copy of an NPU slice stored nf4
    (tensor 5) opens in both readers, but --reference wants that copy to be the slice's own nf4 bytes; without
    it the pack passes --reference."""
    h, data = dq_pack
    raw = harness.wrap_pack(header_bytes(h), len(data) // 4096, data)
    harness.check_pack(raw)
    from orkpack.runtime.verify import verify_pack

    r = verify_pack(harness.scratch("dq.orkpack", raw), reference=True)
    assert r.exit_code == 1 and len(r.failures) == 1 and r.failures[0].startswith("blk.0.attn_k.weight: host copy")
    h = _mut(h, lambda h: h["tensors"].pop(5))
    r = verify_pack(harness.scratch("dq.orkpack", harness.wrap_pack(header_bytes(h), len(data) // 4096, data)), reference=True)
    assert r.exit_code == 0, r.failures


def test_deep_json_nesting(tmp_path):
    deep = b"[" * 100000 + b"]" * 100000
    p = _wrapped(tmp_path, None, 0, raw_header=deep)
    with pytest.raises(PackDamaged, match="nest"):
        Pack.open(p)
    st = tmp_path / "deep.safetensors"
    st.write_bytes(struct.pack("<Q", len(deep)) + deep)
    with pytest.raises(SourceError, match="not valid JSON"):
        SafetensorsSource(st, [st])
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_bytes(b'{"a":' * 100000 + b"1" + b"}" * 100000)
    (folder / "model.safetensors").write_bytes(st.read_bytes())
    with pytest.raises(SourceError, match="config.json"):
        open_source(folder)


def test_hostile_names_are_escaped_everywhere(tmp_path, header):
    h, pages = header
    evil = "\x1b[31mred\x07\n../../etc/passwd\u202e\ud800" + "A" * 300
    h2 = _mut(h, lambda h: h["tensors"][1].update(name=evil))
    p = _wrapped(tmp_path, h2, pages)
    from rich.console import Console
    from orkpack.render import pack_facts as render

    f = pack_facts(p)
    assert f["tensors"][1]["name"] == evil  # data, kept as is in JSON
    buf = io.StringIO()
    render(Console(file=buf, width=400, color_system=None), f)
    out = buf.getvalue()
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\\x1b[31mred" in out
    h3 = _mut(h, lambda h: h["tensors"][1].update(name="\x1b" * 5000))
    with pytest.raises(PackDamaged) as e:
        Pack.open(_wrapped(tmp_path, h3, pages))
    assert "too long" in str(e.value) and "\x1b" not in str(e.value) and len(str(e.value)) < 400


def _st(tmp_path, header: dict, data: bytes = b"") -> Path:
    hb = json.dumps(header).encode()
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + data)
    return p


@pytest.mark.parametrize(
    "entry,why",
    [
        ({"dtype": "F32", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}, "too large"),
        ({"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}, "too large"),
        ({"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 0]}, "bad shape"),
        ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}, "bad shape"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}, "outside"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0, 2**70]}, "outside"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [0.0, 4.0]}, "data_offsets"),
        ({"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}, "dtype"),
    ],
)
def test_safetensors_hostile_entries(tmp_path, entry, why):
    p = _st(tmp_path, {"w": entry}, bytes(16))
    with pytest.raises(SourceError, match=why):
        SafetensorsSource(p, [p])


def test_safetensors_long_name_and_absurd_layers(tmp_path):
    ok = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    p = _st(tmp_path, {"\x00" * 5000: ok}, bytes(4))
    with pytest.raises(SourceError, match="over 4096 bytes") as e:
        SafetensorsSource(p, [p])
    assert "\x00" not in str(e.value)
    # a layer index of 10**9 used to build a 10**9-layer name map (minutes, gigabytes)
    p = _st(tmp_path, {"model.layers.999999999.mlp.up_proj.weight": ok}, bytes(4))
    with pytest.raises(SourceError, match="layers"):
        SafetensorsSource(p, [p])
    p = _st(tmp_path, {"w": ok}, bytes(4))
    s = SafetensorsSource(p, [p], {"model_type": ["llama"], "num_hidden_layers": 2})
    assert s.read("w").shape == (1,)
    s.close()


def _gguf(kv_bytes: bytes, n_kv: int, tensors: bytes = b"", n_t: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_t, n_kv) + kv_bytes + tensors + bytes(64)


def _gstr(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


@pytest.mark.parametrize(
    "blob,why",
    [
        # a string array claiming 2**40 elements: gguf-py would loop (and allocate) per element
        (_gguf(_gstr(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40), 1), "elements|past the end"),
        # 5M one-byte elements fit a 5 MB file but would cost gguf-py ~1 GB of numpy views
        (_gguf(_gstr(b"k") + struct.pack("<IIQ", 9, 0, 5 << 20) + bytes(5 << 20), 1), "elements"),
        (_gguf(_gstr(b"k") + struct.pack("<IQ", 8, 2**62), 1), "string"),
        (_gguf(b"", 2**40), "metadata keys"),
        (_gguf(b"", 0, b"", 2**40), "tensors"),
        (_gguf(_gstr(b"k") + struct.pack("<II", 9, 9) + struct.pack("<Q", 1) + struct.pack("<IQ", 9, 1) * 3, 1), "nested|past the end"),
        (_gguf(b"", 0, _gstr(b"t") + struct.pack("<I", 9) + struct.pack("<Q", 2) * 9, 1), "dimensions"),
        (_gguf(b"", 0, _gstr(b"t") + struct.pack("<I", 4) + struct.pack("<Q", 2**30) * 4 + struct.pack("<IQ", 0, 0), 1), "shape too large"),
        (_gguf(_gstr(b"k") + struct.pack("<I", 77), 1), "unknown value type"),
    ],
    ids=["string-array-2^40", "5M-elements", "string-2^62", "kv-2^40", "tensors-2^40", "nested-arrays", "9-dims",
         "shape-2^120", "bad-type"],
)
def test_gguf_header_counts_are_capped(tmp_path, blob, why):
    p = tmp_path / "x.gguf"
    p.write_bytes(blob)
    with pytest.raises(SourceError, match=why):
        GGUFSource(p)


def test_gguf_hostile_metadata_types_do_not_crash(tmp_path):
    """Metadata of the wrong types: the tensors stay readable, no config (no TypeError)."""
    from orkpack.synth import write_gguf_model
    import gguf

    src = write_gguf_model(tmp_path / "m.gguf", layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=64)
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(tmp_path / "bad.gguf", "llama")
    w.add_string("llama.block_count", "many")  # should be an int
    w.add_array("llama.embedding_length", [1, 2])
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = GGUFSource(tmp_path / "bad.gguf", on_warning=lambda m: None)
    assert s.config is None and s.tensors()
    s.read(s.tensors()[0].name)
    s.close()


def test_only_orkerror_on_garbage_everywhere(tmp_path):
    rng = np.random.default_rng(0)
    for n in (0, 1, 8, 24, 100, 5000):
        blob = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        for prefix in (b"", b"ORKPACK\0", b"GGUF", struct.pack("<Q", max(0, n - 8))):
            raw = prefix + blob
            harness.check_pack(raw)
            harness.check_safetensors(raw)
            harness.check_gguf(raw)
    with pytest.raises(OrkError):
        Pack.open(tmp_path)
    assert issubclass(PackDamaged, PackError)


def test_fuzz_finding_empty_quantized_gguf_tensor(tmp_path):
    """atheris (fuzz/fuzz.py gguf) found: a Q4_1 tensor with a zero dimension made gguf-py's
    dequantize raise ValueError (cannot reshape array of size 0) from GGUFSource.read."""
    import base64

    blob = base64.b64decode("R0dVRgMAAAABAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABAAAAAAAAAAAAAAADAAAAAAAAAAAAAAAAAAAA+E8F3gAA")
    p = tmp_path / "empty.gguf"
    p.write_bytes(blob)
    s = GGUFSource(p, on_warning=lambda m: None)
    (info,) = s.tensors()
    assert info.dtype == "Q4_1" and 0 in info.shape
    assert s.read(info.name).shape == info.shape
    s.close()
