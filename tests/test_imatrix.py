"""orkpack imatrix: activation statistics against transformers' own activations, llama.cpp's file formats, bad input.

The oracle for the sums is independent of orkpack's forward pass: forward pre-hooks on transformers'
nn.Linear modules of the same tiny model see the inputs of every product and sum their squares.
The file format is checked against its definition in llama.cpp (tools/imatrix/imatrix.cpp writes,
common/imatrix-loader.cpp reads): tensor names, types and shapes as gguf-py reads them; legacy
``.dat`` files are written here byte by byte from that definition.
"""
from __future__ import annotations

import struct

import numpy as np
import pytest
from typer.testing import CliRunner

from orkpack.cli import app
from orkpack.eval.imatrix import collect
from orkpack.stats import ActStats, Entry, StatsError, load, save

runner = CliRunner()

_HF = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
       "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def _tokens(tmp_path, ids) -> str:
    p = tmp_path / "ids.txt"
    p.write_text(" ".join(str(int(i)) for i in ids))
    return p


def test_sums_and_maxima_equal_transformers_inputs(tmp_path):
    from test_model_reference import _build

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    _build("llama", folder)
    ids = np.random.default_rng(5).integers(0, 128, 48)
    ctx = 16
    stats = collect(folder, tokens=_tokens(tmp_path, ids), ctx=ctx)
    assert (stats.chunk_count, stats.chunk_size) == (3, 16)

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    want: dict = {}

    def hook(name):
        def pre(mod, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            s2, am, n = want.get(name, (0.0, 0.0, 0))
            want[name] = (s2 + (x * x).sum(0), torch.maximum(torch.as_tensor(am, dtype=torch.float64),
                                                              x.abs().max(0).values), n + x.shape[0])
        return pre

    for mname, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            leaf = mname.rsplit(".", 1)[-1]
            if leaf == "lm_head":
                name = "output.weight"
            else:
                name = f"blk.{int(mname.split('.')[2])}.{_HF[leaf]}.weight"
            mod.register_forward_pre_hook(hook(name))
    with torch.no_grad():
        for c in range(3):  # the same chunks, each its own sequence
            model(torch.as_tensor(ids[c * ctx:(c + 1) * ctx][None]))
    assert set(want) == set(stats.entries)
    for name, (s2, am, n) in want.items():
        e = stats.entries[name]
        assert e.counts.tolist() == [n] == [48]
        np.testing.assert_allclose(e.sum2[0], s2.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(e.absmax[0], am.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(stats.mean_sq(name), s2.numpy() / n, rtol=1e-4, atol=1e-7)


def test_experts_get_their_own_rows_and_counts(tmp_path):
    from test_model_reference import _build

    pytest.importorskip("transformers")
    folder = tmp_path / "hf"
    _build("qwen3_moe", folder)  # 4 experts, 2 per token
    ids = np.random.default_rng(6).integers(0, 128, 32)
    stats = collect(folder, tokens=_tokens(tmp_path, ids), ctx=32)
    e = stats.entries["blk.0.ffn_gate_exps.weight"]
    assert e.sum2.shape == (4, 64) and e.counts.shape == (4,)
    assert e.counts.sum() == 32 * 2  # each token reaches two experts
    for x in range(4):
        if e.counts[x]:
            np.testing.assert_allclose(stats.mean_sq("blk.0.ffn_gate_exps.weight", x), e.sum2[x] / e.counts[x],
                                       rtol=1e-6)
        else:
            assert stats.mean_sq("blk.0.ffn_gate_exps.weight", x) is None
    # the router's input is the same normed activation the experts see, every token
    assert stats.entries["blk.0.ffn_gate_inp.weight"].counts.tolist() == [32]


def _stats() -> ActStats:
    rng = np.random.default_rng(0)
    return ActStats({"blk.0.attn_q.weight": Entry(rng.random((1, 8)) * 10, np.array([7.0]),
                                                  rng.random((1, 8)).astype(np.float32)),
                     "blk.0.ffn_up_exps.weight": Entry(rng.random((3, 4)), np.array([2.0, 0.0, 5.0]),
                                                       rng.random((3, 4)).astype(np.float32))},
                    datasets=["wiki.txt"], chunk_count=4, chunk_size=512)


def test_file_is_llama_cpp_gguf_imatrix_and_round_trips(tmp_path):
    import gguf

    s = _stats()
    p = tmp_path / "s.gguf"
    save(s, p)
    r = gguf.GGUFReader(str(p))
    kv = {f.name: f for f in r.fields.values()}
    assert bytes(kv["general.type"].parts[-1]).decode() == "imatrix"
    assert [bytes(kv["imatrix.datasets"].parts[i]).decode() for i in kv["imatrix.datasets"].data] == ["wiki.txt"]
    assert kv["imatrix.chunk_count"].types == [gguf.GGUFValueType.UINT32]
    shapes = {t.name: ([int(x) for x in t.shape], t.tensor_type) for t in r.tensors}
    f32 = gguf.GGMLQuantizationType.F32
    assert shapes["blk.0.attn_q.weight.in_sum2"] == ([8, 1], f32)  # ne0 = K, ne1 = matrices
    assert shapes["blk.0.attn_q.weight.counts"] == ([1, 1], f32)
    assert shapes["blk.0.ffn_up_exps.weight.in_sum2"] == ([4, 3], f32)
    assert shapes["blk.0.ffn_up_exps.weight.counts"] == ([1, 3], f32)
    assert shapes["blk.0.ffn_up_exps.weight.in_absmax"] == ([4, 3], f32)
    back = load(p)
    assert (back.datasets, back.chunk_count, back.chunk_size) == (["wiki.txt"], 4, 512)
    for name, e in s.entries.items():
        np.testing.assert_array_equal(back.entries[name].sum2, e.sum2.astype(np.float32))
        np.testing.assert_array_equal(back.entries[name].absmax, e.absmax)
        np.testing.assert_array_equal(back.entries[name].counts, e.counts)
    assert back.mean_sq("blk.0.ffn_up_exps.weight", 1) is None  # an expert no token reached
    np.testing.assert_allclose(back.mean_sq("blk.0.ffn_up_exps.weight", 2),
                               s.entries["blk.0.ffn_up_exps.weight"].sum2[2] / 5, rtol=1e-6)
    assert back.mean_sq("blk.0.attn_q.weight", k=9) is None  # another width: not this matrix
    assert back.mean_sq("nothing") is None


def test_a_llama_cpp_file_without_maxima_loads(tmp_path):
    import gguf

    p = tmp_path / "l.gguf"
    w = gguf.GGUFWriter(str(p), arch="imatrix")
    w.add_type("imatrix")
    w.add_array("imatrix.datasets", ["x"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 512)
    w.add_tensor("output.weight.in_sum2", np.full((1, 6), 12.0, dtype=np.float32))
    w.add_tensor("output.weight.counts", np.full((1, 1), 4.0, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    s = load(p)
    np.testing.assert_array_equal(s.mean_sq("output.weight"), np.full(6, 3.0, dtype=np.float32))
    assert s.absmax("output.weight") is None


def _legacy(entries, chunks=None, dataset=None) -> bytes:
    """llama.cpp's legacy .dat (save_imatrix_legacy): n, then per entry len, name, ncall, nval, values."""
    b = struct.pack("<i", len(entries))
    for name, ncall, vals in entries:
        nb = name.encode()
        b += struct.pack("<i", len(nb)) + nb + struct.pack("<ii", ncall, len(vals)) + np.asarray(vals, "<f4").tobytes()
    if chunks is not None:
        b += struct.pack("<i", chunks)
        if dataset is not None:
            b += struct.pack("<i", len(dataset)) + dataset.encode()
    return b


def test_legacy_dat_loads_as_llama_quantize_reads_it(tmp_path):
    p = tmp_path / "old.dat"
    p.write_bytes(_legacy([("blk.0.attn_q.weight", 10, [20.0, 40.0, 0.0]),
                           ("blk.0.ffn_up_exps.weight", 5, [5.0] * 4 + [10.0] * 4),
                           ("output.weight", 0, [2.0, 3.0])], chunks=9, dataset="wiki.train.raw"))
    s = load(p)
    assert s.legacy and s.chunk_count == 9 and s.datasets == ["wiki.train.raw"]
    np.testing.assert_allclose(s.mean_sq("blk.0.attn_q.weight"), [2.0, 4.0, 0.0])  # values / ncall
    np.testing.assert_allclose(s.mean_sq("output.weight"), [2.0, 3.0])  # ncall 0: as they are
    np.testing.assert_allclose(s.mean_sq("blk.0.ffn_up_exps.weight", 1, k=4), [2.0] * 4)  # flat experts split
    p.write_bytes(_legacy([("a", 1, [1.0])]))  # no trailer
    assert load(p).chunk_count == 0


@pytest.mark.parametrize("data, what", [
    (b"", "truncated"),
    (b"GGUF" + b"\0" * 20, "not an imatrix"),
    (struct.pack("<i", 1) + struct.pack("<i", 5) + b"ab", "truncated"),
    (struct.pack("<i", -3), "not an imatrix"),
    (_legacy([("x", 1, [1.0, float("nan")])]), "non-finite"),
    (_legacy([("x", 1, [1.0, -2.0])]), "negative"),
])
def test_damaged_files_are_one_line(tmp_path, data, what):
    p = tmp_path / "bad.dat"
    p.write_bytes(data)
    with pytest.raises(StatsError, match=what) as e:
        load(p)
    assert "\n" not in str(e.value) and "bad.dat" in str(e.value)


def test_gguf_without_imatrix_tensors_is_refused(tmp_path):
    import gguf

    p = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(p), arch="llama")
    w.add_tensor("output.weight", np.ones((2, 2), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(StatsError, match="without imatrix tensors"):
        load(p)


def test_cli_writes_refuses_to_overwrite_inputs_and_is_deterministic(tmp_path):
    from orkpack import synth

    from test_model_record import write_tokenizer

    folder = synth.write_hf_model(tmp_path / "hf", layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1,
                                  vocab=512, seed=1)
    write_tokenizer(folder, n_merges=200)
    out = tmp_path / "a.gguf"
    r = runner.invoke(app, ["imatrix", str(folder), "-o", str(out), "--ctx", "64", "--chunks", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert '"matrices"' in r.output
    s = load(out)
    assert s.chunk_count == 2 and s.chunk_size == 64 and s.datasets == ["prose.txt"]
    assert "output.weight" in s or "token_embd.weight" in s
    r2 = runner.invoke(app, ["imatrix", str(folder), "-o", str(tmp_path / "b.gguf"), "--ctx", "64", "--chunks", "2"])
    assert r2.exit_code == 0
    assert out.read_bytes() == (tmp_path / "b.gguf").read_bytes()
    st = next(folder.glob("*.safetensors"))
    before = st.read_bytes()
    r3 = runner.invoke(app, ["imatrix", str(folder), "-o", str(st), "--ctx", "64"])
    assert r3.exit_code != 0 and "one of the inputs" in r3.output
    assert st.read_bytes() == before
    r4 = runner.invoke(app, ["imatrix", str(folder), "-o", str(tmp_path / "c.gguf"), "--ctx", "1000000"])
    assert r4.exit_code != 0 and "fewer than one chunk" in r4.output
    assert not (tmp_path / "c.gguf").exists() and not (tmp_path / "c.gguf.tmp").exists()
