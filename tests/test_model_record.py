"""The pack's model record (format 1.3, docs/FORMAT.md 9): what a runtime needs to run the model alone.

From a GGUF: its key-value pairs as they are (checked against gguf-py's own reading of the source, types
and values). From an HF folder: config.json + tokenizer.json + tokenizer_config.json converted with the
keys and meanings of llama.cpp's converter. Older readers ignore the record; a malformed one is reported.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType as VT
from typer.testing import CliRunner

from orkpack import cli, synth
from orkpack.build import BuildOptions, build
from orkpack.pack import model as M
from orkpack.pack import spec
from orkpack.pack.reader import Pack
from orkpack.sources import modelkv

# ---------------------------------------------------------------- a tokenizer.json like a real byte-level BPE one


from orkpack.synth import CHAT_TEMPLATE as TEMPLATE  # noqa: E402
from orkpack.synth import TOKENIZER_SPECIAL as SPECIAL  # noqa: E402
from orkpack.synth import write_tokenizer  # noqa: E402,F401  (tests/test_eval*.py import it from here)


# ---------------------------------------------------------------- GGUF: as they are


ODD_KV = (
    ("test.u8", 200, VT.UINT8), ("test.i8", -100, VT.INT8), ("test.u16", 60000, VT.UINT16),
    ("test.i16", -30000, VT.INT16), ("test.u64", 2**63 + 5, VT.UINT64), ("test.i64", -2**62, VT.INT64),
    ("test.f64", 0.1, VT.FLOAT64), ("test.f32", 0.1, VT.FLOAT32), ("test.nan", math.nan, VT.FLOAT32),
    ("test.inf", -math.inf, VT.FLOAT64), ("test.flag", True, VT.BOOL), ("test.utf8", "Grüße ✓ 😀", VT.STRING),
    ("test.floats", [1.5, -0.0, 3.25e-5], VT.ARRAY, VT.FLOAT32), ("test.ints", [-1, 0, 7], VT.ARRAY, VT.INT32),
    ("tokenizer.ggml.model", "gpt2", VT.STRING),
    ("tokenizer.ggml.tokens", ["<s>", "a", "b", "ab", "Ġ"], VT.ARRAY, VT.STRING),
    ("tokenizer.ggml.token_type", [3, 1, 1, 1, 1], VT.ARRAY, VT.INT32),
    ("tokenizer.ggml.merges", ["a b"], VT.ARRAY, VT.STRING),
    ("tokenizer.chat_template", TEMPLATE, VT.STRING),
)


def _equal(typ: str, ours, theirs) -> bool:
    if typ.startswith("array["):
        return len(ours) == len(theirs) and all(_equal(typ[6:-1], a, b) for a, b in zip(ours, theirs))
    if typ == "float32":
        return np.array(ours, np.float32).tobytes() == np.array(theirs, np.float32).tobytes()
    if typ == "float64":
        return np.array(ours, np.float64).tobytes() == np.array(theirs, np.float64).tobytes()
    return type(ours) is type(theirs) and ours == theirs


def test_gguf_pairs_are_carried_as_they_are(tmp_path):
    src = synth.write_gguf_model(tmp_path / "m.gguf", kv=ODD_KV)
    out = tmp_path / "m.orkpack"
    build(src, out, BuildOptions(threads=1))
    with Pack.open(out) as p:
        model = p.header["model"]
        assert p.preamble.version_minor == spec.VERSION_MINOR >= 3  # the model record came with 1.3
    assert M.check_model(model) is None and model["source"] == "gguf"
    fields = {k: f for k, f in GGUFReader(src).fields.items() if not k.startswith("GGUF.")}
    assert [e[0] for e in model["kv"]] == list(fields)  # every pair, in file order
    names = {VT.UINT8: "uint8", VT.INT8: "int8", VT.UINT16: "uint16", VT.INT16: "int16", VT.UINT32: "uint32",
             VT.INT32: "int32", VT.FLOAT32: "float32", VT.BOOL: "bool", VT.STRING: "string", VT.UINT64: "uint64",
             VT.INT64: "int64", VT.FLOAT64: "float64"}
    for key, typ, _ in model["kv"]:
        f = fields[key]
        want = names[f.types[0]] if f.types[0] != VT.ARRAY else f"array[{names.get(f.types[1], 'uint8') if len(f.types) > 1 else 'uint8'}]"
        assert typ == want, key
        theirs = f.contents()
        ours = M.get(model, key)
        if typ in ("float32", "float64") and math.isnan(theirs):
            assert math.isnan(ours)
        else:
            assert _equal(typ, ours, theirs), (key, ours, theirs)
    assert M.get(model, "test.nan") != M.get(model, "test.nan")  # "nan" restored as NaN
    assert M.get(model, "test.inf") == -math.inf and M.get(model, "test.u64") == 2**63 + 5
    s = M.summary(model)
    assert s["architecture"] == "llama" and s["tokenizer"] == "gpt2" and s["vocab"] == 5 and s["merges"] == 1
    assert s["chat_template"] and s["rope_freq_base"] == 10000.0 and s["context_length"] == 4096


def test_gguf_string_that_is_not_utf8_round_trips():
    class F:  # a gguf-py field whose string bytes are not valid UTF-8
        types = [VT.STRING]
        def contents(self):
            return b"ok\xff\xfe".decode("utf-8", "surrogateescape")
    model = modelkv.from_gguf_fields({"x.bad": F()})
    assert M.check_model(model) is None
    js = json.loads(json.dumps(model, ensure_ascii=True))
    assert M.get(js, "x.bad").encode("utf-8", "surrogateescape") == b"ok\xff\xfe"


# ---------------------------------------------------------------- HF: converted as llama.cpp's converter does


def test_hf_folder_config_and_tokenizer(tmp_path):
    cfg = dict(synth.TINY["qwen2"])
    cfg["rope_theta"] = 100000.0
    cfg["rms_norm_eps"] = 1e-5
    cfg["max_position_embeddings"] = 8192
    cfg["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
    folder = synth.write_hf_model(tmp_path / "m", config=cfg)
    tok = write_tokenizer(folder)
    out = tmp_path / "m.orkpack"
    r = build(folder, out, BuildOptions(threads=1))
    assert not any("tokenizer" in w for w in r.warnings)
    with Pack.open(out) as p:
        model = p.header["model"]
    assert M.check_model(model) is None and model["source"] == "hf"
    g = lambda k: M.get(model, k)
    assert g("general.architecture") == "qwen2"
    assert g("qwen2.context_length") == 8192 and g("qwen2.block_count") == cfg["num_hidden_layers"]
    assert g("qwen2.embedding_length") == cfg["hidden_size"] and g("qwen2.feed_forward_length") == cfg["intermediate_size"]
    assert g("qwen2.attention.head_count") == cfg["num_attention_heads"]
    assert g("qwen2.attention.head_count_kv") == cfg["num_key_value_heads"]
    assert g("qwen2.rope.freq_base") == 100000.0 and np.float32(g("qwen2.attention.layer_norm_rms_epsilon")) == np.float32(1e-5)
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert g("qwen2.rope.dimension_count") == hd
    assert g("qwen2.rope.scaling.type") == "yarn" and g("qwen2.rope.scaling.factor") == 4.0
    assert g("qwen2.rope.scaling.original_context_length") == 2048
    types = {e[0]: e[1] for e in model["kv"]}
    assert types["qwen2.context_length"] == "uint32" and types["qwen2.rope.freq_base"] == "float32"
    # the tokenizer, typed as llama.cpp types it
    by_id = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    assert g("tokenizer.ggml.model") == "gpt2" and g("tokenizer.ggml.pre") == "default"
    assert g("tokenizer.ggml.tokens") == [t for t, _ in by_id]
    assert g("tokenizer.ggml.token_type") == [3] * len(SPECIAL) + [1] * (len(by_id) - len(SPECIAL))
    assert g("tokenizer.ggml.merges") == tok["model"]["merges"]
    assert g("tokenizer.ggml.bos_token_id") == 1 and g("tokenizer.ggml.eos_token_id") == 2
    assert g("tokenizer.ggml.padding_token_id") == 0 and g("tokenizer.ggml.add_bos_token") is False
    assert g("tokenizer.chat_template") == TEMPLATE
    assert json.loads(g("tokenizer.huggingface.json")) == tok
    assert "tokenizer.ggml.scores" not in types  # gpt2 vocabularies carry no scores


def test_hf_byte_fallback_tokenizer_is_the_llama_model(tmp_path):
    folder = synth.write_hf_model(tmp_path / "m")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}, "▁a": 259, "b": 260}
    (folder / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": i, "content": t, "special": True} for t, i in list(vocab.items())[:3]],
        "model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>", "vocab": vocab, "merges": []}}))
    model = modelkv.from_hf(folder, json.loads((folder / "config.json").read_text()))
    assert M.get(model, "tokenizer.ggml.model") == "llama"
    tt = M.get(model, "tokenizer.ggml.token_type")
    assert tt[:3] == [3, 3, 3] and tt[3:259] == [6] * 256 and tt[259:261] == [1, 1]
    assert M.get(model, "tokenizer.ggml.scores")[259] == -259.0
    # padded to the config's vocab_size (512) as the converter pads (llama.cpp refuses a shorter token list)
    toks = M.get(model, "tokenizer.ggml.tokens")
    assert len(toks) == len(tt) == len(M.get(model, "tokenizer.ggml.scores")) == 512
    assert tt[261:] == [5] * 251 and toks[261] == "[PAD261]" and M.get(model, "tokenizer.ggml.scores")[511] == -1000.0


def test_hf_folder_without_tokenizer_warns_and_still_carries_the_hyperparameters(tmp_path):
    folder = synth.write_hf_model(tmp_path / "m")
    r = CliRunner().invoke(cli.app, ["build", str(folder), "-o", str(tmp_path / "m.orkpack"), "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert any("no tokenizer.json or tokenizer.model" in w for w in doc["warnings"])
    with Pack.open(tmp_path / "m.orkpack") as p:
        assert M.get(p.header["model"], "llama.block_count") == 2


def test_inspect_shows_the_model(tmp_path):
    folder = synth.write_hf_model(tmp_path / "m")
    write_tokenizer(folder)
    build(folder, tmp_path / "m.orkpack", BuildOptions(threads=1))
    r = CliRunner().invoke(cli.app, ["inspect", str(tmp_path / "m.orkpack"), "--json"])
    f = json.loads(r.stdout)
    assert f["model"]["architecture"] == "llama" and f["model"]["tokenizer"] == "gpt2" and f["model"]["chat_template"]
    assert {"key": "llama.block_count", "type": "uint32", "value": 2} in f["model"]["keys"]
    r = CliRunner().invoke(cli.app, ["inspect", str(tmp_path / "m.orkpack")])
    assert "tokenizer gpt2" in r.stdout and "chat template" in r.stdout


@pytest.mark.parametrize("bad, why", [
    ({"source": "gguf"}, "keys source and kv"),
    ({"source": "x", "kv": []}, "model.source"),
    ({"source": "gguf", "kv": [["a", "uint8", 256]]}, "out of range"),
    ({"source": "gguf", "kv": [["a", "uint32", True]]}, "out of range"),
    ({"source": "gguf", "kv": [["a", "float32", "1.0"]]}, "not a number"),
    ({"source": "gguf", "kv": [["a", "string", "x"], ["a", "string", "y"]]}, "appears twice"),
    ({"source": "gguf", "kv": [["a", "array[int32]", [1, "2"]]]}, "out of range"),
    ({"source": "gguf", "kv": [["a", "complex", 1]]}, "unknown type"),
    ({"source": "gguf", "kv": [["a", "string"]]}, "not a [key, type, value]"),
])
def test_malformed_records_are_named(bad, why):
    assert why in M.check_model(bad)
    assert "problem" in M.summary(bad)


# ---------------------------------------------------------------- the C reader exposes the same record


def _digest(typ: str, vals) -> str:
    """What orkpack-check --model prints for an entry (fuzz/harness.py, which the fuzzer checks the C reader with)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
    import harness

    return harness.model_entry_digest(typ, vals)


def test_c_reader_reads_the_same_record(check, tmp_path):
    import subprocess

    src = synth.write_gguf_model(tmp_path / "m.gguf", kv=ODD_KV)
    gpack = build(src, tmp_path / "g.orkpack", BuildOptions(threads=1)).path
    folder = synth.write_hf_model(tmp_path / "hf")
    write_tokenizer(folder)
    hpack = build(folder, tmp_path / "h.orkpack", BuildOptions(threads=1)).path
    for pack in (gpack, hpack):
        with Pack.open(pack) as p:
            model = p.header["model"]
        res = subprocess.run([str(check), "--model", str(pack)], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        lines = [ln.split("\t") for ln in res.stdout.splitlines() if ln.startswith("kv\t")]
        want = []
        for key, typ, _ in model["kv"]:
            v = M.get(model, key)
            if typ == "uint64" and v > 2**63 - 1:  # not an int64: the C reader says so
                want.append(["kv", key, typ, "1", "bad model key test.u64: value above INT64_MAX"])
                continue
            want.append(["kv", key, typ, str(len(v) if typ.startswith("array[") else 1), _digest(typ, v)])
        assert lines == want


def test_c_reader_names_a_malformed_value(check, tmp_path):
    import subprocess

    sys_path = Path(__file__).resolve().parent
    import sys

    sys.path.insert(0, str(sys_path))
    from test_c_reader import _rewrite

    folder = synth.write_hf_model(tmp_path / "hf")
    pack = build(folder, tmp_path / "h.orkpack", BuildOptions(threads=1)).path

    def mutate(h):
        h["model"]["kv"][1][2] = "not a uint32"  # general.type is a string: make the block count wrong instead
        h["model"]["kv"].append(["x.count", "uint32", -1])
    bad = _rewrite(pack, tmp_path / "bad.orkpack", mutate)
    res = subprocess.run([str(check), "--model", str(bad)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0  # the record is read on demand; the pack itself is sound
    assert "kv\tx.count\tuint32\t1\tbad" in res.stdout and "uint32 value out of range" in res.stdout
    with Pack.open(bad) as p:
        assert "out of range" in M.check_model(p.header["model"])


@pytest.mark.parametrize("key, bad", [("rope_theta", "ten thousand"), ("rope_theta", True), ("partial_rotary_factor", 1e300),
                                      ("max_position_embeddings", 2**40), ("rms_norm_eps", -1e300 * 1e300),
                                      ("rope_scaling", {"rope_type": "yarn", "factor": "x"}),
                                      ("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": None,
                                                        "original_max_position_embeddings": -1})])
def test_hostile_config_values_are_left_out_not_raised(tmp_path, key, bad):
    cfg = dict(synth.TINY["llama"])
    cfg[key] = bad
    model = modelkv.from_hf(tmp_path, cfg)  # no tokenizer files: only the hyperparameters
    assert M.check_model(json.loads(json.dumps(model))) is None


# ---------------------------------------------------------------- a quantized source is said out loud, in every mode


def test_quantized_gguf_warning_reaches_build_json_and_plan(tmp_path):
    src = synth.write_gguf_model(tmp_path / "q.gguf", tensor_type="Q8_0")
    r = CliRunner().invoke(cli.app, ["build", str(src), "-o", str(tmp_path / "q.orkpack"), "--json", "--threads", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    said = [w for w in doc["warnings"] if "holds quantized tensors" in w]
    assert len(said) == 1  # once, though the plan and the reader both notice
    r = CliRunner().invoke(cli.app, ["plan", str(src), "--json"])
    assert r.exit_code == 0, r.output
    json.loads(r.stdout)  # stdout stays JSON
    assert "holds quantized tensors" in r.stderr
    r = CliRunner().invoke(cli.app, ["plan", str(src)])
    assert "holds quantized tensors" in r.output
    f16 = synth.write_gguf_model(tmp_path / "f.gguf", tensor_type="F16")
    r = CliRunner().invoke(cli.app, ["plan", str(f16), "--json"])
    assert "quantized" not in r.stderr


def test_transformers_5_rope_parameters(tmp_path):
    """transformers 5 writes rope_theta and the scaling under rope_parameters: the record still has them."""
    cfg = dict(synth.TINY["llama"])
    cfg.pop("rope_theta", None)
    cfg["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "linear", "factor": 2.0}
    model = modelkv.from_hf(tmp_path, cfg)
    assert M.get(model, "llama.rope.freq_base") == 100000.0
    assert M.get(model, "llama.rope.scaling.type") == "linear" and M.get(model, "llama.rope.scaling.factor") == 2.0


# ------------------------------------------------------------------------------ tokenizer.ggml.pre of an HF folder

def _llama_cpp_tree() -> Path | None:
    import os

    for p in ([Path(os.environ["ORKPACK_LLAMA_CPP"])] if os.environ.get("ORKPACK_LLAMA_CPP") else []) + \
            [Path(__file__).resolve().parents[1] / ".cache" / "llama.cpp"]:
        if (p / "conversion" / "base.py").is_file() or (p / "convert_hf_to_gguf.py").is_file():
            return p
    return None


def test_pre_tokenizer_table_is_the_pinned_converters():
    """orkpack/data/tokenizer_pre.json is scripts/tokenizer_pre_table.py's copy of the pinned llama.cpp's table."""
    import importlib.util

    tree = _llama_cpp_tree()
    if tree is None:
        pytest.skip("llama.cpp's converter source is not unpacked (scripts/test.sh unpacks it into .cache/llama.cpp)")
    spec_ = importlib.util.spec_from_file_location(
        "tokenizer_pre_table", Path(__file__).resolve().parents[1] / "scripts" / "tokenizer_pre_table.py")
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    shipped = json.loads(modelkv.PRE_TABLE.read_text(encoding="utf-8"))
    fresh = mod.table(tree, "x")
    assert shipped["chktxt"] == fresh["chktxt"] and shipped["names"] == fresh["names"]
    assert "smollm" in shipped["names"].values() and len(shipped["names"]) > 50


def test_hf_record_names_the_pre_tokenizer_as_the_converter_does(tmp_path):
    """An HF folder's record names its pre-tokenizer as convert_hf_to_gguf.py's get_vocab_base_pre does: the
    sha256 of str() of transformers' ids of the converter's check text (computed here with transformers itself),
    looked up in the converter's table; SmolLM2's tokenizer (rebuilt from the real GGUF's vocabulary with its
    tokenizer.json's pre-tokenizer, Digits then ByteLevel) is "smollm"; a tokenizer the table lacks is "default"."""
    import hashlib

    transformers = pytest.importorskip("transformers")
    from tokenizers import pre_tokenizers

    from orkpack.model.tokenizer import from_model
    from orkpack.sources.gguf import GGUFSource
    from test_eval_tokenizer import real_smollm2

    with GGUFSource(real_smollm2()) as s:
        tok = from_model(s.model_metadata())._t
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    table = json.loads(modelkv.PRE_TABLE.read_text(encoding="utf-8"))
    for name, write in (("smol", lambda f: (f / "tokenizer.json").write_text(tok.to_str())),
                        ("synthetic", lambda f: write_tokenizer(f, n_merges=200))):
        folder = synth.write_hf_model(tmp_path / name, layers=1, hidden=64, intermediate=128, heads=2, kv_heads=1,
                                      vocab=512)
        write(folder)
        if name == "smol":
            (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
        ids = transformers.AutoTokenizer.from_pretrained(str(folder)).encode(table["chktxt"])
        want = table["names"].get(hashlib.sha256(str(ids).encode()).hexdigest(), "default")
        model = modelkv.from_hf(folder, json.loads((folder / "config.json").read_text()))
        assert M.get(model, "tokenizer.ggml.pre") == want == {"smol": "smollm", "synthetic": "default"}[name]
