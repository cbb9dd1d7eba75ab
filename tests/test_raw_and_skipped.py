"""Issue 9, part 1: every source tensor is accounted for.

Derivable buffers (position_ids, rotary_emb.inv_freq, GPT-2 causal masks) are
listed by the readers and left out of a build, named in one info line and in
``provenance.skipped``; every other non-float tensor (bool, integers, f64,
c64) is carried through unchanged as a ``raw`` slice on the host.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from orkpack.build import BuildOptions, Decision, RulePlacement, TierMapPlacement, build, raw_decision
from orkpack.cli import app
from orkpack.codecs import get_codec
from orkpack.errors import SourceError
from orkpack.pack import spec
from orkpack.pack.reader import Pack
from orkpack.sources import open_source
from orkpack.sources.base import RAW_DTYPES, TensorInfo
from orkpack.sources.derivable import RULES, derivable_reason

runner = CliRunner()

# safetensors dtype -> numpy dtype, for writing test files
NP = {"F32": "<f4", "F16": "<f2", "BOOL": "|b1", "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8",
      "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "F64": "<f8", "C64": "<c8"}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> Path:
    """A safetensors file, header padded to 8 bytes as the reference writer does; no torch needed."""
    header, blobs, off = {}, [], 0
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr, dtype=NP[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(np.shape(arr)), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hb = json.dumps({"__metadata__": {"format": "pt"}, **header}).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
    return path


def minilm_like(folder: Path, seed: int = 0) -> Path:
    """A small checkpoint named and typed like sentence-transformers' all-MiniLM-L6-v2 (f32 BERT) with its
    I64 ``embeddings.position_ids`` [1, 512], an I64 ``embeddings.token_type_ids`` buffer (not derivable
    by our table: carried raw), and GPT-2-style attention buffers (BOOL and F32 causal masks, the
    scalar masked_bias) beside a real ``c_attn.bias`` that must not be dropped."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    H, I, V, P, L = 32, 64, 64, 512, 2
    f = lambda *s: ("F32", rng.standard_normal(s).astype(np.float32))  # noqa: E731
    t = {
        "embeddings.word_embeddings.weight": f(V, H),
        "embeddings.position_embeddings.weight": f(P, H),
        "embeddings.token_type_embeddings.weight": f(2, H),
        "embeddings.LayerNorm.weight": f(H),
        "embeddings.LayerNorm.bias": f(H),
        "embeddings.position_ids": ("I64", np.arange(P, dtype=np.int64)[None, :]),
        "embeddings.token_type_ids": ("I64", np.zeros((1, P), np.int64) + np.arange(P) % 2),
    }
    for i in range(L):
        p = f"encoder.layer.{i}."
        for m in ("query", "key", "value"):
            t[p + f"attention.self.{m}.weight"] = f(H, H)
            t[p + f"attention.self.{m}.bias"] = f(H)
        t[p + "attention.output.dense.weight"] = f(H, H)
        t[p + "attention.output.dense.bias"] = f(H)
        t[p + "attention.output.LayerNorm.weight"] = f(H)
        t[p + "attention.output.LayerNorm.bias"] = f(H)
        t[p + "intermediate.dense.weight"] = f(I, H)
        t[p + "intermediate.dense.bias"] = f(I)
        t[p + "output.dense.weight"] = f(H, I)
        t[p + "output.dense.bias"] = f(H)
        t[p + "output.LayerNorm.weight"] = f(H)
        t[p + "output.LayerNorm.bias"] = f(H)
    t["pooler.dense.weight"] = f(H, H)
    t["pooler.dense.bias"] = f(H)
    n = 16
    t["h.0.attn.bias"] = ("BOOL", np.tril(np.ones((n, n), bool))[None, None])
    t["h.1.attn.bias"] = ("F32", np.tril(np.ones((n, n), np.float32))[None, None])
    t["h.0.attn.masked_bias"] = ("F32", np.array(-1e4, np.float32))
    t["h.0.attn.c_attn.bias"] = f(3 * H)
    t["h.0.attn.c_attn.weight"] = f(H, 3 * H)
    write_safetensors(folder / "model.safetensors", t)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["BertModel"], "model_type": "bert", "hidden_size": H, "num_hidden_layers": L,
        "num_attention_heads": 4, "intermediate_size": I, "vocab_size": V, "max_position_embeddings": P,
        "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12, "torch_dtype": "float32",
    }))
    return folder


SKIPPED = ["embeddings.position_ids", "h.0.attn.bias", "h.0.attn.masked_bias", "h.1.attn.bias"]


def all_dtypes(path: Path) -> tuple[Path, dict[str, tuple[str, np.ndarray]]]:
    """One tensor of every raw dtype (odd shapes, 0-D, 3-D, 4-D) beside a float matrix."""
    rng = np.random.default_rng(7)
    t = {
        "blk.0.attn_q.weight": ("F32", rng.standard_normal((32, 64)).astype(np.float32)),
        "mask.bool": ("BOOL", rng.integers(0, 2, (3, 5)).astype(bool)),
        "ids.u8": ("U8", rng.integers(0, 256, (2, 3, 4), dtype=np.uint8)),  # 3-D: one raw slice, not experts
        "ids.u16": ("U16", rng.integers(0, 2**16, (7,), dtype=np.uint16)),
        "ids.u32": ("U32", rng.integers(0, 2**32, (2, 2), dtype=np.uint32)),
        "ids.u64": ("U64", rng.integers(0, 2**63, (3,), dtype=np.uint64) * 2 + 1),
        "ids.i8": ("I8", rng.integers(-128, 128, (1, 1, 2, 3), dtype=np.int8)),
        "ids.i16": ("I16", rng.integers(-2**15, 2**15, (5,), dtype=np.int16)),
        "ids.i32": ("I32", rng.integers(-2**31, 2**31, (4, 1), dtype=np.int32)),
        "ids.i64": ("I64", np.array(-(2**62) - 3, np.int64)),  # 0-D
        "vals.f64": ("F64", np.array([np.pi, -0.0, np.nan, np.inf, 1e300], np.float64)),
        "vals.c64": ("C64", (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex64)),
    }
    return write_safetensors(path, t), t


# ---------------------------------------------------------------- the table

@pytest.mark.parametrize("name,dtype,shape,dropped", [
    ("embeddings.position_ids", "I64", (1, 512), True),
    ("bert.embeddings.position_ids", "I64", (512,), True),
    ("text_model.embeddings.position_ids", "F32", (1, 77), True),  # old CLIP checkpoints: F32
    ("embeddings.token_type_ids", "I64", (1, 512), False),
    ("model.layers.3.self_attn.rotary_emb.inv_freq", "F32", (64,), True),
    ("model.rotary_emb.inv_freq", "F32", (32,), True),
    ("h.0.attn.bias", "BOOL", (1, 1, 1024, 1024), True),
    ("transformer.h.11.attn.bias", "F32", (1, 1, 1024, 1024), True),
    ("transformer.h.0.attn.attention.bias", "BOOL", (1, 1, 2048, 2048), True),  # GPT-Neo
    ("h.0.attn.masked_bias", "F32", (), True),
    ("h.0.attn.c_attn.bias", "F32", (2304,), False),  # a real parameter (vLLM's note)
    ("h.0.attn.bias", "F32", (768,), False),  # a learned 1-D bias by that name is carried, not dropped
    ("encoder.layer.0.attention.self.query.bias", "F32", (384,), False),
    ("model.layers.0.self_attn.q_proj.weight", "BF16", (64, 64), False),
])
def test_derivable_table(name, dtype, shape, dropped):
    why = derivable_reason(name, dtype, shape)
    assert (why is not None) == dropped, (name, why)
    if dropped:
        assert why in {r[2] for r in RULES} and ":" in why


# ---------------------------------------------------------------- readers

def test_safetensors_lists_skipped_and_reads_raw_exactly(tmp_path):
    m = minilm_like(tmp_path / "m")
    with open_source(m) as src:
        sk = src.skipped()
        assert [s.name for s in sk] == SKIPPED
        by = {s.name: s for s in sk}
        assert by["embeddings.position_ids"].dtype == "I64" and by["embeddings.position_ids"].shape == (1, 512)
        assert by["h.0.attn.bias"].dtype == "BOOL" and by["h.0.attn.bias"].shape == (1, 1, 16, 16)
        assert by["h.0.attn.masked_bias"].shape == ()
        assert all(s.reason for s in sk)
        names = {t.source_name for t in src.tensors()}
        assert not names & set(SKIPPED)
        assert {"embeddings.token_type_ids", "h.0.attn.c_attn.bias"} <= names

    p, want = all_dtypes(tmp_path / "d.safetensors")
    with open_source(p) as src:
        assert src.skipped() == []
        infos = {t.source_name: t for t in src.tensors()}
        for name, (dt, arr) in want.items():
            info = infos[name]
            assert info.dtype == dt and info.shape == np.shape(arr)
            got = src.read(info.name)
            assert got.dtype == np.dtype(NP[dt]) and got.shape == np.shape(arr)
            assert got.tobytes() == np.ascontiguousarray(arr, NP[dt]).tobytes()
        # into a reused buffer, as the build reads
        buf = np.empty(1 << 12, np.uint8)
        got = src.read(infos["ids.u64"].name, out=buf)
        assert got.dtype == np.uint64 and got.tobytes() == want["ids.u64"][1].tobytes()


@pytest.mark.parametrize("entry,match", [
    ({"dtype": "I64", "shape": [3], "data_offsets": [0, 16]}, "do not hold I64 (3,) (24 bytes)"),
    ({"dtype": "BOOL", "shape": [2, 4], "data_offsets": [0, 16]}, "do not hold BOOL (2, 4) (8 bytes)"),
    ({"dtype": "C64", "shape": [3], "data_offsets": [0, 16]}, "do not hold"),
    ({"dtype": "F64", "shape": [4], "data_offsets": [0, 64]}, "outside the data section"),
    ({"dtype": "I128", "shape": [1], "data_offsets": [0, 16]}, "I128 is not supported"),
])
def test_safetensors_raw_sizes_still_checked(tmp_path, entry, match):
    hb = json.dumps({"w": entry}).encode()
    p = tmp_path / "e.safetensors"
    p.write_bytes(struct.pack("<Q", len(hb)) + hb + bytes(16))
    with pytest.raises(SourceError) as e:
        open_source(p)
    assert match in str(e.value) and "\n" not in str(e.value)


def _gguf_with_ints(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    t = {
        "blk.0.attn_q.weight": rng.standard_normal((32, 64)).astype(np.float32),
        "blk.0.ids_i8": rng.integers(-128, 128, 33, dtype=np.int8),
        "blk.0.ids_i16": rng.integers(-2**15, 2**15, (3, 5), dtype=np.int16),
        "blk.0.ids_i32": rng.integers(-2**31, 2**31, 32, dtype=np.int32),
        "blk.0.ids_i64": rng.integers(-2**62, 2**62, (2, 4), dtype=np.int64),
        "blk.0.vals_f64": rng.standard_normal(9),
    }
    w = gguf.GGUFWriter(path, "llama")
    for k, v in t.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return t


def test_gguf_integer_and_f64_tensors_are_raw(tmp_path):
    p = tmp_path / "i.gguf"
    want = _gguf_with_ints(p)
    with open_source(p) as src:
        assert src.skipped() == []
        infos = {t.name: t for t in src.tensors()}
        for name, arr in want.items():
            got = src.read(name)
            assert got.dtype == arr.dtype and got.shape == arr.shape and got.tobytes() == arr.tobytes(), name
        assert infos["blk.0.ids_i64"].dtype == "I64" and infos["blk.0.vals_f64"].dtype == "F64"
    out = build(p, tmp_path / "i.orkpack", BuildOptions(threads=1, plan=False))
    with Pack.open(out.path) as pack:
        recs = {t["name"]: t for t in pack.tensors}
        for name, arr in want.items():
            s = recs[name]["slices"][0]
            if arr.dtype == np.float32:
                assert s["encoding"] != "raw"
                continue
            assert s["encoding"] == "raw" and s["tier"] == "host" and s["dtype"] == RAW_DTYPES[recs[name]["source_dtype"]]
            assert pack.typed_part(s, "data").tobytes() == arr.tobytes()


# ---------------------------------------------------------------- codec and placement

@pytest.mark.parametrize("dt", sorted(spec.RAW_DTYPES))
def test_raw_codec_bytes_verbatim(dt):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, 5 * 3 * np.dtype(spec.RAW_DTYPES[dt]).itemsize, dtype=np.uint8)
    x = x.view(spec.RAW_DTYPES[dt]).reshape(5, 3) if dt != "bool" else (x % 2).astype(bool).reshape(5, 3)
    c = get_codec("raw")
    enc = c.encode(x, dtype=dt)
    assert list(enc.parts) == ["data"] and enc.parts["data"].dtype == np.uint8
    assert enc.parts["data"].tobytes() == x.tobytes() and enc.dtype == dt and enc.sqnr_db is None
    assert enc.layout == {"kind": "row_major"}
    back = c.decode(enc.parts, x.shape, dtype=dt)
    assert back.dtype == np.dtype(spec.RAW_DTYPES[dt]) and back.tobytes() == x.tobytes()
    with pytest.raises(ValueError):
        c.encode(x, dtype=dt, npu=True)


def test_raw_codec_refuses_mismatched_types():
    c = get_codec("raw")
    with pytest.raises(TypeError):
        c.encode(np.zeros(3, np.int32), dtype="i64")
    with pytest.raises(ValueError):
        c.encode(np.zeros(3, np.int32), dtype="i24")
    assert c.encode(np.zeros(3, np.uint16)).dtype == "u16"  # bf16 bits are named by the build, never guessed


def test_placement_routes_raw_before_rules_and_tier_map():
    info = TensorInfo("ids", "ids", (4, 64), "I32", "m.safetensors", 1024)

    class NoPlanner:
        def decision(self, *a):
            raise AssertionError("the planner was asked about a raw tensor")

    want = Decision("raw", "host", None, "i32")
    assert raw_decision(info) == want
    assert TierMapPlacement(NoPlanner(), BuildOptions()).decide(info, None) == want
    opts = BuildOptions(npu=["*"], int8=["ids"], plan=False)
    assert RulePlacement(opts, [info]).decide(info, None) == want
    assert raw_decision(TensorInfo("w", "w", (4, 64), "BF16", "m", 512)) is None


# ---------------------------------------------------------------- a real checkpoint, end to end

def test_minilm_like_checkpoint_builds_inspects_verifies(tmp_path):
    m = minilm_like(tmp_path / "minilm")
    out = tmp_path / "m.orkpack"
    r = runner.invoke(app, ["build", str(m), "-o", str(out), "--no-plan", "--threads", "1"])
    assert r.exit_code == 0, r.output
    info = [ln for ln in r.stderr.splitlines() if ln.startswith("info:")]
    assert len(info) == 1 and all(n in info[0] for n in SKIPPED) and "dropped 4 tensors that are not weights" in info[0]
    assert "raw" in r.stdout  # the build summary's (encoding, engine) rows

    with Pack.open(out) as pack:
        h = pack.header
        assert h["version"] == [1, spec.VERSION_MINOR] and pack.preamble.version_minor == spec.VERSION_MINOR  # raw came in 1.1
        assert [s["name"] for s in h["provenance"]["skipped"]] == SKIPPED
        assert h["provenance"]["skipped"][0] == {
            "name": "embeddings.position_ids", "dtype": "I64", "shape": [1, 512],
            "reason": derivable_reason("embeddings.position_ids", "I64", (1, 512))}
        recs = {t["source_name"]: t for t in pack.tensors}
        assert not set(recs) & set(SKIPPED)
        tt = recs["embeddings.token_type_ids"]
        s = tt["slices"][0]
        assert tt["source_dtype"] == "I64" and tt["shape"] == [1, 512]
        assert (s["encoding"], s["dtype"], s["tier"], s["sqnr_db"]) == ("raw", "i64", "host", None) and "min_m" not in s
        src_bytes = (np.zeros((1, 512), np.int64) + np.arange(512) % 2).tobytes()
        assert pack.part(s["parts"]["data"]).tobytes() == src_bytes
        assert pack.typed_part(s, "data").dtype == np.int64
        assert recs["h.0.attn.c_attn.bias"]["slices"][0]["encoding"] == "f32"

    r = runner.invoke(app, ["inspect", str(out)])
    assert r.exit_code == 0, r.output
    row = next(ln for ln in r.stdout.splitlines() if "embeddings.token_type_ids" in ln)
    assert "raw i64" in row and "1x512" in row
    assert "left out: 4 tensors that are not weights" in r.stdout
    for n in SKIPPED:
        assert n in r.stdout

    r = runner.invoke(app, ["inspect", str(out), "--json"])
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)
    assert [s["name"] for s in f["skipped"]] == SKIPPED and f["skipped"][1]["dtype"] == "BOOL"
    row = next(t for t in f["tensors"] if t["source_name"] == "embeddings.token_type_ids")
    assert row["encoding"] == "raw" and row["dtype"] == "i64" and row["slices"][0]["dtype"] == "i64"
    assert f["encodings"]["raw"]["slices"] == 1 and f["format_version"] == f"1.{spec.VERSION_MINOR}"

    r = runner.invoke(app, ["verify", str(out), "--reference"])
    assert r.exit_code == 0, r.output

    r = runner.invoke(app, ["build", str(m), "-o", str(tmp_path / "j.orkpack"), "--no-plan", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [s["name"] for s in doc["skipped"]] == SKIPPED and len(doc["info"]) == 1
    assert {"encoding": "raw", "tier": "host", "slices": 1, "bytes": 4096} in doc["by_kind"]
    assert (tmp_path / "j.orkpack").read_bytes() == out.read_bytes()  # same inputs, same bytes


def test_every_raw_dtype_survives_a_build_bit_for_bit(tmp_path):
    p, want = all_dtypes(tmp_path / "d.safetensors")
    opts = BuildOptions(threads=1, plan=False, npu=["*"])  # pins never move raw tensors
    r = build(p, tmp_path / "a.orkpack", opts)
    assert r.info == [] and r.skipped == []
    with Pack.open(r.path) as pack:
        assert pack.header["provenance"]["skipped"] == []
        recs = {t["source_name"]: t for t in pack.tensors}
        for name, (dt, arr) in want.items():
            t = recs[name]
            if dt == "F32":
                assert t["slices"][0]["tier"] == "npu"
                continue
            assert len(t["slices"]) == 1, name  # the 3-D U8 is one slice, not experts
            s = t["slices"][0]
            assert (s["encoding"], s["tier"], s["dtype"], s["expert"]) == ("raw", "host", RAW_DTYPES[dt], None)
            assert s["shape"] == list(np.shape(arr)) == t["shape"]
            got = pack.typed_part(s, "data")
            assert got.dtype == np.dtype(NP[dt]) and got.tobytes() == np.ascontiguousarray(arr, NP[dt]).tobytes()
            dec = get_codec("raw").decode({"data": pack.part(s["parts"]["data"])}, s["shape"], dtype=s["dtype"])
            assert dec.tobytes() == got.tobytes()
    # byte-reproducible, whatever the threads
    r2 = build(p, tmp_path / "b.orkpack", BuildOptions(threads=2, plan=False, npu=["*"]))
    assert r2.path.read_bytes() == r.path.read_bytes()


def test_verify_checks_raw_parts(tmp_path):
    p, _ = all_dtypes(tmp_path / "d.safetensors")
    out = build(p, tmp_path / "a.orkpack", BuildOptions(threads=1, plan=False)).path
    from orkpack.runtime.verify import verify_pack

    assert verify_pack(out, reference=True).exit_code == 0
    with Pack.open(out) as pack:
        rec = next(t for t in pack.tensors if t["source_name"] == "ids.i32")
        off = rec["slices"][0]["parts"]["data"]["offset"]
    b = bytearray(out.read_bytes())
    b[off + 5] ^= 0x10
    bad = tmp_path / "bad.orkpack"
    bad.write_bytes(bytes(b))
    r = verify_pack(bad, keep_going=True)
    assert r.exit_code == 1
    assert any("ids.i32: part data checksum mismatch" in f for f in r.failures), r.failures


def test_tensor_over_four_dims_is_one_line(tmp_path):
    p = write_safetensors(tmp_path / "x.safetensors", {
        "w": ("F32", np.zeros((4, 4), np.float32)), "ids": ("I32", np.zeros((1, 1, 1, 2, 2), np.int32))})
    r = runner.invoke(app, ["build", str(p), "-o", str(tmp_path / "x.orkpack"), "--no-plan"])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.exit_code == 2 and len(errors) == 1 and "ids: 5 dimensions" in errors[0] and "Traceback" not in r.output
    assert not (tmp_path / "x.orkpack").exists()


def test_tier_map_lists_raw_tensors_raw_with_their_real_size():
    from orkpack.tiers.board import load_board
    from orkpack.tiers.manifest import Manifest, TensorEntry
    from orkpack.tiers.profile import analytic
    from orkpack.tiers.solver import solve

    facts = dict(arch=None, n_layers=1, hidden=64, intermediate=64, heads=1, kv_heads=1, head_dim=64, vocab=32,
                 n_experts=0, n_experts_used=0, moe_intermediate=0, tie_word_embeddings=True, attention="gqa",
                 kv_k=64, kv_v=64, swa_window=0, swa_layers=[])
    man = Manifest(facts, [TensorEntry("blk.0.ffn_up.weight", (64, 64), "BF16"),
                           TensorEntry("embeddings.token_type_ids", (1, 512), "I64"),
                           TensorEntry("blk.0.mask", (4, 4), "BOOL")], "test", "test")
    assert [i.tensor for i in man.items] == ["blk.0.ffn_up.weight"]
    b = load_board("rk3588-32g")
    tm = solve(man, b, analytic(man, b, 512), ctx=64)
    d = {x.tensor: x for x in tm.decisions}
    assert (d["embeddings.token_type_ids"].encoding, d["embeddings.token_type_ids"].bytes) == ("raw", 512 * 8)
    assert (d["blk.0.mask"].encoding, d["blk.0.mask"].bytes) == ("raw", 16)
