"""LFM2 (a hybrid of gated short convolutions and GQA) end to end, against llama.cpp's converter and transformers.

A tiny random ``Lfm2ForCausalLM`` (seeded; hidden 64, 4 layers: conv, attention, conv, attention) is saved by
transformers and converted by llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` (the copy vendored in
llama-cpp-python 0.3.36, with its own gguf-py). The converter insists on recognizing the BPE pre-tokenizer by a
hash of a test text's tokens; our tiny tokenizer.json (orkpack.synth.write_tokenizer) is no released one, so the
converter is run with that one lookup answered "gpt-2" (it names the pre-tokenizer in tokenizer.ggml.pre only;
no tensor and no hyperparameter depends on it). Then, tensor for tensor, orkpack's readers of the HF folder and
of the converter's GGUF must give the converter's names, shapes and values; the model record the converter's
lfm2.* keys; the reference forward pass transformers' logits; and the planner the published LFM2-1.2B's facts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orkpack import archs, keepfloat, synth
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.sources.base import as_float32
from orkpack.sources.modelkv import from_gguf_fields, from_hf
from orkpack.tiers.manifest import manifest_from_config

# llama.cpp 0c1e570 as llama-cpp-python 0.3.36's source package vendors it: scripts/test.sh unpacks it there
LLAMA_CPP = Path(os.environ.get("ORKPACK_LLAMA_CPP", Path(__file__).resolve().parents[1] / ".cache" / "llama.cpp"))
FIXTURES = Path(__file__).parent / "fixtures" / "configs"
T = 40
TOL = 1e-4

# the converter with its pre-tokenizer lookup answered (see the module docstring); argv: llama.cpp dir, then its own
_RUN_CONVERTER = """
import runpy, sys
ll = sys.argv[1]
sys.path.insert(0, ll)
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
# a family whose converter reads a SentencePiece tokenizer.model (ERNIE-4.5) reads our tokenizer.json's BPE instead:
# only the tokenizer.ggml.* keys depend on it
base.TextModel._set_vocab_sentencepiece = lambda self, *a, **k: self._set_vocab_gpt2()
base.TextModel._set_vocab_glm = lambda self: self._set_vocab_gpt2()  # GLM's: special tokens ([gMASK]...) ours lacks
sys.argv = [ll + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(ll + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def _config() -> dict:
    cfg = {k: v for k, v in synth.TINY["lfm2"].items() if k not in ("architectures", "model_type", "torch_dtype")}
    return dict(cfg, vocab_size=320)  # the tokenizer's 3 + 256 + 61 tokens: the converter sizes its vocab by them


def redraw(m, g, torch) -> None:
    """Every parameter redrawn: norm gains away from 1, matrices at unit gain."""
    for name, p in m.named_parameters():
        if "norm" in name and p.dim() == 1:
            p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)


def tiny_model(root: Path, model_cls: str, config_cls: str, cfg: dict, redraw=redraw, convert_args: tuple = (),
               edit=None):
    """A seeded tiny transformers model saved to ``root``/hf with a tokenizer, converted by llama.cpp's converter to
    ``root``/conv.gguf (f32; ``convert_args``: more converter options): (HF folder, the converter's GGUF, tokens,
    transformers' logits on them). ``edit``: a function of the saved config.json's dict, returning the one to write
    before converting (e.g. a release's own spellings where transformers saves its newer ones)."""
    torch = pytest.importorskip("torch", reason="the reference model needs torch (test extra)")
    transformers = pytest.importorskip("transformers", reason="the reference model needs transformers (test extra)")
    if not (LLAMA_CPP / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's converter is not at {LLAMA_CPP} (scripts/test.sh unpacks it; or set ORKPACK_LLAMA_CPP)")
    hf, gg = root / "hf", root / "conv.gguf"
    torch.manual_seed(0)
    m = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**cfg)).float().eval()
    with torch.no_grad():
        redraw(m, torch.Generator().manual_seed(1), torch)
        m.tie_weights()
    m.save_pretrained(hf)
    synth.write_tokenizer(hf, n_merges=61)
    if edit is not None:
        (hf / "config.json").write_text(json.dumps(edit(json.loads((hf / "config.json").read_text())), indent=2))
    env = dict(os.environ, PYTHONPATH=str(LLAMA_CPP / "gguf-py"))
    r = subprocess.run([sys.executable, "-c", _RUN_CONVERTER, str(LLAMA_CPP), str(hf), "--outtype", "f32",
                        "--outfile", str(gg), *convert_args], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ids = np.random.default_rng(2).integers(0, 320, T)
    with torch.no_grad():
        ref = m(torch.tensor(ids)[None]).logits[0].float().numpy()
    return hf, gg, ids, ref


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(HF folder, the converter's GGUF, tokens, transformers' logits)."""
    return tiny_model(tmp_path_factory.mktemp("lfm2"), "Lfm2ForCausalLM", "Lfm2Config", _config())


def _converter(gg: Path):
    """The converter's GGUF as its own gguf-py reads it: {name: (ggml shape, numpy array)}, and its fields."""
    sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))
    try:
        import gguf
        r = gguf.GGUFReader(str(gg))
        return {t.name: (tuple(int(x) for x in t.shape), np.array(t.data)) for t in r.tensors}, r.fields
    finally:
        sys.path.remove(str(LLAMA_CPP / "gguf-py"))


def _read_all(path) -> dict:
    src = open_source(path)
    try:
        return {t.name: (tuple(t.shape), as_float32(src.read(t.name))) for t in src.tensors()}
    finally:
        src.close()


def tensors_match_converter(hf: Path, gg: Path, conv: dict, adjust=lambda name, a: a) -> None:
    """Orkpack's readers of the folder ``hf`` and of the converter's GGUF ``gg`` give the converter's tensors
    ``conv`` (from :func:`_converter`): the same names, shapes and values. ``adjust(name, a)``: a declared difference
    applied to the folder's array first (a q/k permutation, a norm offset); ``ssm_a`` = -exp(A_log) within one unit
    in the last place (orkpack's is correctly rounded, the converter's torch float32 exp not always)."""
    for what, ours in (("HF folder", _read_all(hf)), ("converter GGUF", _read_all(gg))):
        assert sorted(ours) == sorted(conv), what
        for name, (ggml_shape, data) in conv.items():
            shape, a = ours[name]
            assert shape == data.shape == ggml_shape[::-1], (what, name, shape, data.shape, ggml_shape)
            if what == "HF folder":
                a = adjust(name, a)
            if name.endswith(".ssm_a"):
                np.testing.assert_array_max_ulp(a, data, maxulp=1)
            else:
                assert np.array_equal(a, data), (what, name)


def test_tensors_equal_the_converters(model):
    hf, gg, _, _ = model
    conv, _ = _converter(gg)
    assert len(conv) == 40  # 2 top + 4 x 5 FFN / norms + 2 conv layers x 3 + 2 attention layers x 6
    for what, ours in (("HF folder", _read_all(hf)), ("converter GGUF", _read_all(gg))):
        assert sorted(ours) == sorted(conv), what
        for name, (ggml_shape, data) in conv.items():
            shape, a = ours[name]
            assert shape == data.shape == ggml_shape[::-1], (what, name, shape, data.shape, ggml_shape)
            assert np.array_equal(a, data), (what, name)
    # the conv kernel as the converter lays it out: ggml {l_cache, E}, numpy (E, l_cache), from HF's (E, 1, l_cache)
    assert conv["blk.0.shortconv.conv.weight"][0] == (3, 64)
    assert conv["blk.0.shortconv.in_proj.weight"][0] == (64, 192)
    assert "blk.1.shortconv.in_proj.weight" not in conv and "blk.0.attn_q.weight" not in conv
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}["blk.0.shortconv.conv.weight"]
        assert info.source_name == "model.layers.0.conv.conv.weight"
    finally:
        src.close()


def record_matches_converter(hf: Path, gg: Path, garch: str, required) -> dict:
    """Every ``garch``.* key the converter wrote into ``gg`` is in orkpack's model record of the folder ``hf``,
    with its type and value (float32 compared as float32); the ``required`` keys (after ``garch.``) among them.
    Returns the converter's keys: {key: [key, type, value]}."""
    _, fields = _converter(gg)
    theirs = {e[0]: e for e in from_gguf_fields(fields)["kv"] if e[0].startswith(garch + ".")}
    ours = {e[0]: e for e in from_hf(hf, json.loads((hf / "config.json").read_text()))["kv"]}
    assert {f"{garch}.{k}" for k in required} <= set(theirs)
    for key, (_, typ, v) in theirs.items():
        assert key in ours, key
        assert ours[key][1] == typ, (key, ours[key][1], typ)
        if typ == "float32":
            assert np.float32(ours[key][2]) == np.float32(v), key
        else:
            assert ours[key][2] == v, (key, ours[key][2], v)
    return theirs


def test_model_record_has_the_converters_keys(model):
    hf, gg, _, _ = model
    theirs = record_matches_converter(hf, gg, "lfm2", ("shortconv.l_cache", "attention.head_count_kv",
                                                       "feed_forward_length"))
    assert theirs["lfm2.attention.head_count_kv"][2] == [0, 2, 0, 2]
    assert theirs["lfm2.feed_forward_length"][2] == 96  # 144 auto-adjusted: 2/3, rounded up to 32


def test_facts_from_the_folder_and_the_converters_gguf_agree(model):
    hf, gg, _, _ = model
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    assert a["recurrent_layers"] == [0, 2] and a["state"] == 64 * 2 and a["intermediate"] == 96


def test_logits_match_transformers_from_folder_and_converter_gguf(model):
    hf, gg, ids, ref = model
    logits_match(hf, gg, ids, ref)


def logits_match(hf: Path, gg: Path, ids, ref, what: str = "") -> None:
    """The reference forward pass from the folder ``hf`` and from the converter's GGUF ``gg`` gives transformers'
    logits ``ref`` on ``ids`` within :data:`TOL`, relative to the largest logit."""
    from orkpack.model import logits

    for path in (hf, gg):
        err = float(np.abs(logits(path, ids) - ref).max())
        assert err <= TOL * float(np.abs(ref).max()), (what, path.name, err, float(np.abs(ref).max()))


def build_verify_eval(hf: Path, gg: Path, pack: Path, build_args: tuple = (), max_kld: float = 0.2,
                      eval_args: tuple = ()) -> None:
    """orkpack build the folder (with ``build_args``), verify the pack, and eval it (with ``eval_args``: token ids
    for a model whose tokenizer eval does not read) against the folder and against the converter's GGUF: the same
    float model, so the same reference and the same scores; the quantized paths' mean KLD under ``max_kld``."""
    run = lambda *a: subprocess.run([sys.executable, "-m", "orkpack", *a], capture_output=True, text=True,  # noqa: E731
                                    timeout=600, env=dict(os.environ, PYTHONPATH=str(Path(archs.__file__).parent.parent)))
    r = run("build", str(hf), "-o", str(pack), "--json", *build_args)
    assert r.returncode == 0, r.stderr[-2000:]
    r = run("verify", str(pack))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    got = {}
    for source in (hf, gg):
        r = run("eval", str(source), str(pack), "--json", *eval_args)
        assert r.returncode == 0, r.stderr[-2000:]
        got[source] = {p["path"]: p for p in json.loads(r.stdout)["paths"]}
    for path in ("reference", "prefill", "decode"):
        assert got[hf][path]["ppl"] == pytest.approx(got[gg][path]["ppl"], rel=1e-6), path
    for path in ("prefill", "decode"):
        kld = got[hf][path]["kld"]
        # these random models (unit-gain matrices) measure ~0.05 nats; a mishandled block costs whole nats
        assert 0 <= kld["mean"] < max_kld, (path, kld)


def test_build_verify_eval(model, tmp_path):
    hf, gg, _, _ = model
    build_verify_eval(hf, gg, tmp_path / "t.orkpack")


def test_plan_tiny_and_published_configs():
    tiny = manifest_from_config(synth.TINY["lfm2"])
    names = {i.tensor for i in tiny.items}
    assert "blk.0.shortconv.in_proj.weight" in names and "blk.1.attn_q.weight" in names
    convs = [t for t in tiny.floats if ".shortconv.conv." in t.name]
    assert [(t.name, t.shape) for t in convs] == [("blk.0.shortconv.conv.weight", (64, 3)),
                                                  ("blk.2.shortconv.conv.weight", (64, 3))]
    assert all(keepfloat.why_float(t.name, t.shape) == "a convolution kernel" for t in convs)
    assert keepfloat.why_float("blk.0.shortconv.conv.weight", (64, 1, 3)) == "a convolution kernel"  # not experts

    cfg = json.loads((FIXTURES / "lfm2.json").read_text())
    assert archs.param_count(cfg) == 1_170_340_608  # LiquidAI/LFM2-1.2B's published count
    m = manifest_from_config(cfg)
    f = m.facts
    assert f["recurrent_layers"] == [0, 1, 3, 4, 6, 7, 9, 11, 13, 15] and f["intermediate"] == 8192
    # 10 conv layers x 5 matrices + 6 attention layers x 7 + the tied embedding; the 10 conv kernels float
    assert len(m.items) == 93
    assert sum(".shortconv.conv." in t.name for t in m.floats) == 10
    # KV: the 6 attention layers only (8 KV heads x 64, K and V, f16); the conv state: 2048 x (3 - 1) f32 a layer
    for ctx in (512, 8192):
        assert m.kv_bytes(ctx) == 6 * ctx * 2 * 512 * 2 + 10 * 2048 * 2 * 4
    assert m.kv_bytes(8192, "q8_0") == 6 * 8192 * 2 * 34 * 16 + 10 * 2048 * 2 * 4


def test_plan_command_runs_on_the_published_config():
    from orkpack.tiers.command import plan

    tm, _, (man, _, _) = plan(FIXTURES / "lfm2.json", ctx=4096)
    quantized = {d.tensor for d in tm.decisions if d.encoding in ("int8", "nf4", "nf4dq")}
    assert quantized == {i.tensor for i in man.items} and len(quantized) == 93
    convs = [d for d in tm.decisions if ".shortconv.conv." in d.tensor]
    assert len(convs) == 10 and all((d.encoding, d.tier, d.shape) == ("bf16", "host", (2048, 3)) for d in convs)
    assert tm.budget["ram"]["kv_cache"] == man.kv_bytes(4096) == 6 * 4096 * 2048 + 10 * 2048 * 2 * 4


@pytest.mark.parametrize("over, key", [
    ({"layer_types": ["conv", "full_attention", "conv"]}, "'layer_types' lists 3 layers but 'num_hidden_layers' is 4"),
    ({"layer_types": ["conv", "full_attention", "conv", "mamba"]}, "'layer_types'[3] = 'mamba'"),
    ({"layer_types": None, "full_attn_idxs": [1, 7]}, "'full_attn_idxs' names layer 7 but 'num_hidden_layers' is 4"),
    ({"layer_types": "conv"}, "'layer_types' must be a list"),
    ({"conv_L_cache": 1}, "'conv_L_cache' = 1"),
    ({"block_multiple_of": 0}, "'block_multiple_of' is 0"),
    ({"block_ffn_dim_multiplier": "x"}, "'block_ffn_dim_multiplier' = 'x'"),
])
def test_a_contradictory_layer_pattern_is_one_line(over, key):
    cfg = {**synth.TINY["lfm2"], **over}
    with pytest.raises(SourceError) as e:
        manifest_from_config(cfg)
    msg = str(e.value)
    assert key in msg and "\n" not in msg and msg.endswith("fix the config"), msg


def test_full_attn_idxs_alone_gives_the_pattern():
    cfg = {**synth.TINY["lfm2"], "layer_types": None, "full_attn_idxs": [1, 3]}
    assert archs.layer_blocks(cfg) == ["shortconv", "attn", "shortconv", "attn"]
    cfg = {**synth.TINY["lfm2"], "layer_types": None}  # Lfm2Config: every layer attention
    assert archs.layer_blocks(cfg) == ["attn"] * 4
