"""Gemma 3n (``gemma3n_text`` and the text model of a ``gemma3n`` release) end to end, against llama.cpp's converter
and transformers.

A tiny random ``Gemma3nForCausalLM`` (seeded; synth.TINY's shape: hidden 64, 6 layers sliding, sliding, full,
sliding, sliding, full; FFN widths [96, 96, 128, 128, 64, 64] as a list; activation sparsity 0.95 on the first 2;
the last 2 layers reusing earlier K/V; 4 AltUp streams, LAuReL of rank 8, per-layer embeddings of 8; final softcap),
saved by transformers and converted by llama.cpp's own ``convert_hf_to_gguf.py --outtype f32`` (test_lfm2's
helpers; Gemma3Model.set_vocab reads our GPT-2-style tokenizer.json with its gpt2 reader already). Its vocabulary is
321: transformers' AutoTokenizer loads a gemma3n folder's tokenizer.json as a GemmaTokenizer, which adds one token
to our 320, and the converter asserts every token id is below vocab_size. The release form
(``Gemma3nForConditionalGeneration``: the text model under ``model.language_model.``, vision and audio towers
beside it) packs the same text model, its towers left out by name.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orkpack import archs, synth
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.tiers.manifest import manifest_from_config

from test_lfm2 import (_converter, build_verify_eval, logits_match, record_matches_converter, tensors_match_converter,
                       tiny_model)

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
_TEXT = {k: v for k, v in synth.TINY["gemma3n_text"].items() if k not in ("architectures", "model_type", "torch_dtype")}
_TEXT = dict(_TEXT, vocab_size=321, vocab_size_per_layer_input=321)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("g3n"), "Gemma3nForCausalLM", "Gemma3nTextConfig", _TEXT)


def test_tensors_equal_the_converters(text):
    hf, gg, _, _ = text
    conv, _ = _converter(gg)
    # 7 top (embedding, output norm, the per-layer table, its projection and norm, the two stacked AltUp projections)
    # + 6 x 21 (4 norms, q, o, q_norm, 3 FFN, PLE gate / projection / norm, 5 AltUp, 3 LAuReL) + k, v, k_norm in the
    # 4 layers with their own K/V
    assert len(conv) == 7 + 6 * 21 + 4 * 3
    tensors_match_converter(hf, gg, conv)
    assert conv["altup_proj.weight"][0] == (64, 64, 3) and conv["altup_unembd_proj.weight"][0] == (64, 64, 3)
    assert conv["per_layer_token_embd.weight"][0] == (6 * 8, 321)
    assert [conv[f"blk.{i}.ffn_up.weight"][0][1] for i in range(6)] == [96, 96, 128, 128, 64, 64]
    assert conv["blk.0.altup_predict_coef.weight"][0] == (4, 16) and conv["blk.0.laurel_l.weight"][0] == (64, 8)
    assert "blk.4.attn_k.weight" not in conv and "blk.3.attn_k.weight" in conv  # KV sharing
    src = open_source(hf)
    try:
        info = {t.name: t for t in src.tensors()}
    finally:
        src.close()
    assert info["altup_proj.weight"].source_name == "model.altup_projections.*.weight"
    assert info["blk.0.altup_correct_scale.weight"].source_name == "model.layers.0.altup.correct_output_scale"


def test_model_record_has_the_converters_keys(text):
    hf, gg, _, _ = text
    theirs = record_matches_converter(hf, gg, "gemma3n", (
        "altup.active_idx", "altup.num_inputs", "embedding_length_per_layer_input", "attention.shared_kv_layers",
        "activation_sparsity_scale", "attention.sliding_window_pattern", "feed_forward_length",
        "final_logit_softcapping", "rope.freq_base_swa"))
    assert theirs["gemma3n.feed_forward_length"][2] == [96, 96, 128, 128, 64, 64]
    assert theirs["gemma3n.activation_sparsity_scale"][2][2:] == ["-inf"] * 4
    assert abs(theirs["gemma3n.activation_sparsity_scale"][2][0] - 1.6448536) < 1e-6


def test_facts_and_logits_from_folder_and_converter_gguf(text):
    hf, gg, ids, ref = text
    a, b = model_facts(open_source(hf)), model_facts(open_source(gg))
    assert a == b
    assert a["swa_layers"] == [0, 1, 3, 4] and a["kv_shared_layers"] == [4, 5] and a["intermediate"] == 128
    logits_match(hf, gg, ids, ref)


def test_each_mechanism_matters(text):
    """The reference is not right by accident: without the activation sparsity, LAuReL, or AltUp's correction, it is
    off transformers' logits by far more than the tolerance."""
    from dataclasses import replace

    from orkpack.model.forward import model_hparams, run

    hf, _, ids, ref = text
    src = open_source(hf)
    try:
        hp = model_hparams(src)
        for what, other in (("sparsity", replace(hp, sparsity={})),
                            ("laurel", replace(hp, fwd=replace(hp.fwd, laurel=False))),
                            ("altup scale", replace(hp, altup=(hp.altup[0], hp.altup[1], False)))):
            err = float(np.abs(run(src, ids, hp=other) - ref).max())
            assert err > 1e-2 * float(np.abs(ref).max()), (what, err)
    finally:
        src.close()


def test_build_verify_eval(text, tmp_path):
    """An all-float pack is the reference (the pack path is exact); the default pack's error is spread over every
    matrix of this random model (unit-gain matrices): measured mean KLD 0.14 (prefill and decode), held under 0.3."""
    hf, gg, _, _ = text
    build_verify_eval(hf, gg, tmp_path / "f.orkpack", build_args=("--keep", "*"), max_kld=1e-6)
    build_verify_eval(hf, gg, tmp_path / "t.orkpack", max_kld=0.3)


def test_release_packs_its_text_model_and_names_the_towers(tmp_path):
    """A release's checkpoint (the text model under model.language_model., towers beside it, as synth writes it):
    the towers are left out by name, the rest reads as the text model's."""
    from orkpack.synth import write_hf_model

    folder = write_hf_model(tmp_path / "rel", config=synth.TINY["gemma3n"], shards=1, seed=3)
    m = manifest_from_config(synth.TINY["gemma3n"])
    t = manifest_from_config(synth.TINY["gemma3n_text"])
    assert [(x.name, x.shape) for x in m.tensors] == [(x.name, x.shape) for x in t.tensors]
    src = open_source(folder)
    try:
        names = {x.name: x for x in src.tensors()}
    finally:
        src.close()
    assert names["altup_proj.weight"].shape == (3, 64, 64)
    assert names["altup_proj.weight"].source_name == "model.language_model.altup_projections.*.weight"
    assert archs.config_family({"architectures": ["Gemma3nForConditionalGeneration"]}).name == "gemma3n"
    import re

    skip = archs.FAMILIES["gemma3n"].skip  # the towers and their embedders, by name (as gemma4's release)
    for tower in ("model.vision_tower.timm_model.conv_stem.conv.weight", "model.audio_tower.conformer.0.norm.weight",
                  "model.embed_vision.embedding.weight", "model.embed_audio.embedding.weight"):
        assert any(re.match(rx, tower) for rx, _ in skip), tower
    assert not any(re.match(rx, "model.language_model.altup_projections.0.weight") for rx, _ in skip)


def test_kv_sharing_layers_store_no_kv_and_the_table_is_a_lookup():
    from orkpack.tiers.manifest import cache_bytes

    m = manifest_from_config(synth.TINY["gemma3n_text"])
    f = m.facts
    assert f["kv_shared_layers"] == [4, 5] and f["intermediate"] == 128
    c = cache_bytes(f, 1024)
    # layers 0, 1, 3 sliding (8 positions), 2 full (1024); 4, 5 reuse: nothing; f16 K + V of 2 x 16 each
    assert c["kv"] == 128 * (3 * 8 + 1024)
    lk = [i for i in m.items if i.tensor == "per_layer_token_embd.weight"]
    assert len(lk) == 1 and lk[0].role == "lookup" and (lk[0].n, lk[0].k) == (128, 48)
    ups = {i.tensor: i.n for i in m.items if i.tensor.endswith("ffn_up.weight")}
    assert [ups[f"blk.{i}.ffn_up.weight"] for i in range(6)] == [96, 96, 128, 128, 64, 64]  # each layer its width
    assert {t.name for t in m.floats} >= {"altup_proj.weight", "altup_unembd_proj.weight"}  # 3-D: kept float


@pytest.mark.parametrize("name,params,L,shared,table", [
    ("gemma3n_text", 4_435_182_688, 30, 10, 262144 * 30 * 256),
    ("gemma3n_text_e4b", 6_835_235_568, 35, 15, 262144 * 35 * 256)])
def test_published_configs_count_and_plan(name, params, L, shared, table):
    cfg = json.loads((FIXTURES / f"{name}.json").read_text())
    assert archs.param_count(cfg) == params
    m = manifest_from_config(cfg)
    f = m.facts
    assert f["kv_shared_layers"] == list(range(L - shared, L)) and f["swa_layers"] == [i for i in range(L) if i % 5 != 4]
    lk = next(i for i in m.items if i.tensor == "per_layer_token_embd.weight")
    assert (lk.role, lk.n * lk.k) == ("lookup", table)
    own = L - shared  # 32k context, f16: the layers with their own K/V (every 5th full, the others 512 positions)
    full = sum(1 for i in range(own) if i % 5 == 4)
    assert m.kv_bytes(32768) == full * 32768 * 2048 + (own - full) * 512 * 2048


def test_fixture_count_is_what_transformers_builds():
    torch = pytest.importorskip("torch", reason="transformers' count needs torch (test extra)")
    transformers = pytest.importorskip("transformers", reason="transformers' count needs transformers (test extra)")
    for name in ("gemma3n_text", "gemma3n_text_e4b"):
        cfg = json.loads((FIXTURES / f"{name}.json").read_text())
        c = transformers.Gemma3nTextConfig(**{k: v for k, v in cfg.items()
                                              if k not in ("architectures", "model_type", "torch_dtype")})
        with torch.device("meta"):
            m = transformers.Gemma3nForCausalLM(c)
        sd = {k: v for k, v in m.state_dict().items() if k != "lm_head.weight"}  # tied
        assert sum(v.numel() for v in sd.values()) == archs.param_count(cfg)
        assert set(sd) == {n for n, _, _ in archs.hf_tensors(cfg)[1]}


def test_plan_shows_the_lookup_and_the_shared_kv():
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "orkpack", "plan", str(FIXTURES / "gemma3n_text.json"), "--ctx", "32768"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(Path(archs.__file__).parent.parent), "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())
    assert "lookup per_layer_token_embd.weight: 262144 rows x 7680" in out and "never the NPU" in out
    assert "10 of 30 layers reuse earlier layers' K/V and store none" in out


@pytest.mark.parametrize("over,key", [
    ({"intermediate_size": [96, 96]}, "intermediate_size"),
    ({"intermediate_size": [96, 96, 128, 128, 64, "x"]}, r"intermediate_size\[5\]"),
    ({"activation_sparsity_pattern": [0.95]}, "activation_sparsity_pattern"),
    ({"altup_active_idx": 4}, "altup_active_idx"),
    ({"num_kv_shared_layers": 7}, "num_kv_shared_layers")])
def test_a_contradictory_config_is_one_line(over, key):
    with pytest.raises(SourceError, match=key) as e:
        archs.facts_from_config(dict(synth.TINY["gemma3n_text"], **over))
    assert "\n" not in str(e.value)


def test_a_release_folder_converts_to_the_text_models_gguf(text, tmp_path):
    """The release through llama.cpp's converter: transformers' Gemma3nForConditionalGeneration needs timm for its
    vision tower (not installed here), so the release folder is the transformers text model's weights under
    model.language_model. beside tower tensors by their release names, its config the text config as text_config.
    The converter's GGUF of it is the text model's GGUF (the same tensors, bytes and gemma3n.* keys), and orkpack
    reads the folder as that GGUF (its towers left out by name)."""
    import os
    import subprocess
    import sys

    from safetensors.numpy import load_file, save_file

    import test_lfm2

    hf, gg, _, _ = text
    rel = tmp_path / "rel"
    rel.mkdir()
    w = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
         for k, v in load_file(str(hf / "model.safetensors")).items()}
    rng = np.random.default_rng(5)
    for tower in ("model.vision_tower.timm_model.conv_stem.conv.weight", "model.embed_vision.embedding.weight",
                  "model.audio_tower.conformer.0.norm.weight", "model.embed_audio.embedding.weight"):
        w[tower] = rng.standard_normal((4, 8)).astype(np.float32)
    save_file(w, str(rel / "model.safetensors"))
    cfg = json.loads((hf / "config.json").read_text())
    (rel / "config.json").write_text(json.dumps({"architectures": ["Gemma3nForConditionalGeneration"],
                                                 "model_type": "gemma3n", "text_config": cfg,
                                                 "vision_config": {}, "audio_config": {}}))
    for f in hf.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            (rel / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "rel.gguf"
    env = dict(os.environ, PYTHONPATH=str(test_lfm2.LLAMA_CPP / "gguf-py"))
    r = subprocess.run([sys.executable, "-c", test_lfm2._RUN_CONVERTER, str(test_lfm2.LLAMA_CPP), str(rel), "--outtype",
                        "f32", "--outfile", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    a, fa = _converter(gg)
    b, fb = _converter(out)
    assert sorted(a) == sorted(b)
    assert all(a[n][0] == b[n][0] and np.array_equal(a[n][1], b[n][1]) for n in a)
    keys = [k for k in fa if k.startswith("gemma3n.")]
    assert keys and all(k in fb and fa[k].contents() == fb[k].contents() for k in keys)
    tensors_match_converter(rel, out, b)
    src = open_source(rel)
    try:
        skipped = {s.name for s in src.skipped()}
    finally:
        src.close()
    assert skipped == {n for n in w if n.startswith(("model.vision_tower.", "model.embed_vision.",
                                                     "model.audio_tower.", "model.embed_audio."))}
