"""The reference forward pass (orkpack.model) against transformers, on tiny random models of every family.

Each model is built by transformers from a config (random init, seeded; every parameter then
redrawn so norm gains, biases and routers are not at their neutral init), saved with
save_pretrained as safetensors, and its float32 logits on a token sequence longer than its
sliding windows compared with ours: from the HF folder, and from a GGUF of the same weights in
llama.cpp's converter layout (q/k rows permuted where the converter permutes them, gemma gains
stored as 1 + w, internlm2's wqkv and stacked gate_up experts split, hyperparameters as llama.cpp
keys). Families transformers cannot build offline (minicpm, internlm2, chatglm) are an equivalent
transformers model rewritten into the family's checkpoint form. Tolerance: max |ours - theirs| <= 1e-4 x
max |theirs|.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from orkpack import archs
from orkpack.errors import SourceError
from orkpack.model import NotEvaluable, Weights, logits, run
from orkpack.sources import open_source


def _oracle():
    """(torch, transformers), or skip: the reference logits need them (the test extra)."""
    return (pytest.importorskip("torch", reason="the reference logits need torch (test extra)"),
            pytest.importorskip("transformers", reason="the reference logits need transformers (test extra)"))


T = 40  # tokens: longer than the sliding windows below
TOL = 1e-4
_BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=160, max_position_embeddings=256,
             rms_norm_eps=1e-5, tie_word_embeddings=False)

# family -> config keywords over _BASE (transformers' own config classes fill in the rest)
CASES: dict[str, dict] = {
    "llama": dict(attention_bias=True, mlp_bias=True),
    "llama_rope_llama3": dict(model_type="llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "llama_rope_linear": dict(model_type="llama", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                                   "factor": 4.0}),
    "llama_rope_yarn": dict(model_type="llama", rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}),
    "mistral": dict(sliding_window=16),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=16),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False),
    "qwen3": dict(),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
    "gemma": dict(num_key_value_heads=1, tie_word_embeddings=True),
    "gemma2": dict(sliding_window=8, query_pre_attn_scalar=24, final_logit_softcapping=3.0,
                   attn_logit_softcapping=5.0, tie_word_embeddings=True),
    "gemma3_text": dict(num_hidden_layers=3, sliding_window=8, sliding_window_pattern=3, query_pre_attn_scalar=24,
                        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                            "rope_theta": 1000000.0},
                                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                        tie_word_embeddings=True),
    "gemma3": dict(model_type="gemma3", text_config=dict(
        _BASE, num_hidden_layers=3, sliding_window=8, sliding_window_pattern=3, query_pre_attn_scalar=24,
        tie_word_embeddings=True), vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                      num_attention_heads=2, patch_size=4, image_size=16),
        mm_tokens_per_image=4, image_token_index=150, boi_token_index=151, eoi_token_index=152, base=False),
    # families transformers cannot build offline (remote code): an equivalent transformers model, its
    # checkpoint rewritten into the family's own names, layout and config keys (_CONVERT)
    "minicpm": dict(model_type="granite", embedding_multiplier=6.0, residual_multiplier=1.4 / 2 ** 0.5,
                    attention_multiplier=0.25, logits_scaling=4.0, tie_word_embeddings=True, convert="minicpm"),
    "internlm2": dict(model_type="llama", convert="internlm2"),
    "chatglm": dict(model_type="glm", partial_rotary_factor=0.5, attention_bias=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, pad_token_id=0, eos_token_id=1,
                    convert="chatglm"),
    # gpt-oss's experts as its release stores them (MXFP4, out x in); transformers keeps them in x out
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48, sliding_window=8,
                    convert="gpt_oss"),
    "phi3": dict(sliding_window=16, partial_rotary_factor=0.5, pad_token_id=0),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, intermediate_size=32, num_key_value_heads=4),
    "granite": dict(embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.1,
                    logits_scaling=4.0, attention_bias=True),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, embedding_multiplier=6.0,
                       residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=4.0),
    "smollm3": dict(no_rope_layers=[1, 0], tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "starcoder2": dict(sliding_window=16, use_bias=True, norm_epsilon=1e-5),
    "glm4": dict(attention_bias=True, partial_rotary_factor=0.5, pad_token_id=0),
    "deepseek_v2": dict(num_hidden_layers=3, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, head_dim=8, num_key_value_heads=4, v_head_dim=16, n_routed_experts=4,
                        n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1, routed_scaling_factor=1.5, topk_method="group_limited_greedy",
                        n_group=2, topk_group=1),
    "deepseek_v3": dict(num_hidden_layers=3, q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, head_dim=8, num_key_value_heads=4, v_head_dim=16, n_routed_experts=8,
                        n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                        first_k_dense_replace=1, routed_scaling_factor=2.5, n_group=4, topk_group=2,
                        norm_topk_prob=True),
    # a hybrid: short-convolution layers (with conv_bias: every bias of the block) and GQA layers
    "lfm2": dict(base=False, hidden_size=64, intermediate_size=144, block_multiple_of=32, num_hidden_layers=4,
                 layer_types=["conv", "full_attention", "conv", "conv"], num_attention_heads=4, num_key_value_heads=2,
                 vocab_size=160, max_position_embeddings=256, norm_eps=1e-5, conv_L_cache=3, conv_bias=True,
                 tie_word_embeddings=True),
    "deepseek_v3_yarn": dict(model_type="deepseek_v3", num_hidden_layers=2, q_lora_rank=24, kv_lora_rank=32,
                             qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8, num_key_value_heads=4,
                             v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             n_group=2, topk_group=1, first_k_dense_replace=1, rope_parameters={
                                 "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 16, "mscale": 1.0, "mscale_all_dim": 0.8,
                                 "beta_fast": 32, "beta_slow": 1}),
    "minicpm3": dict(q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8,
                     num_key_value_heads=4, v_head_dim=16, scale_emb=6.0, dim_model_base=16, scale_depth=1.4),
}


def _build(name: str, folder) -> tuple[np.ndarray, np.ndarray]:
    """Save a tiny random model of case ``name`` in ``folder``; (tokens, transformers' logits)."""
    torch, transformers = _oracle()
    case = dict(CASES[name])
    kw = case if case.pop("base", True) is False else dict(_BASE, **case)
    mt = kw.pop("model_type", name)
    convert = kw.pop("convert", None)
    cfg = transformers.AutoConfig.for_model(mt, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname and p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_((0.4 if p.dim() == 1 else 1.0) * torch.randn(p.shape, generator=g) / max(p.shape[-1], 1) ** 0.5)
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
        model.tie_weights()
    model.save_pretrained(folder, safe_serialization=True)
    if convert:
        _CONVERT[convert](folder, kw)
    ids = np.random.default_rng(2).integers(0, 128, T)  # below the multimodal cases' image tokens
    with torch.no_grad():
        ref = model(torch.tensor(ids)[None]).logits[0].float().numpy()
    return ids, ref


def _rewrite(folder, config: dict, rename) -> None:
    """Replace the checkpoint in ``folder``: ``rename(tensors) -> tensors`` (numpy), and ``config`` as config.json."""
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    save_file(rename(load_file(path)), path, metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))


def _common(kw: dict) -> dict:
    return {k: kw[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                               "tie_word_embeddings")}


def _to_minicpm(folder, kw):  # MiniCPM = granite with scale_emb, scale_depth / sqrt(L), hidden / dim_model_base
    L, H = kw["num_hidden_layers"], kw["hidden_size"]
    cfg = dict(_common(kw), architectures=["MiniCPMForCausalLM"], model_type="minicpm", hidden_act="silu",
               scale_emb=kw["embedding_multiplier"], scale_depth=kw["residual_multiplier"] * L ** 0.5,
               dim_model_base=H / kw["logits_scaling"], rope_theta=10000.0)
    assert kw["attention_multiplier"] == (H // kw["num_attention_heads"]) ** -0.5
    _rewrite(folder, cfg, lambda t: t)


def _to_internlm2(folder, kw):  # InternLM2: llama with one wqkv grouped per KV head (its q heads, k, v)
    nh, nkv, hd = kw["num_attention_heads"], kw["num_key_value_heads"], kw["head_dim"]

    def rename(t):
        out = {}
        for n, a in t.items():
            n = n.replace("model.embed_tokens.", "model.tok_embeddings.").replace("lm_head.", "output.")
            n = n.replace(".self_attn.o_proj.", ".attention.wo.").replace(".input_layernorm.", ".attention_norm.")
            n = n.replace(".post_attention_layernorm.", ".ffn_norm.").replace(".mlp.gate_proj.", ".feed_forward.w1.")
            n = n.replace(".mlp.up_proj.", ".feed_forward.w3.").replace(".mlp.down_proj.", ".feed_forward.w2.")
            out[n] = a
        for i in range(kw["num_hidden_layers"]):
            p = f"model.layers.{i}.self_attn."
            q, k, v = (out.pop(p + f"{x}_proj.weight") for x in "qkv")
            g = np.concatenate([q.reshape(nkv, nh // nkv, hd, -1), k.reshape(nkv, 1, hd, -1),
                                v.reshape(nkv, 1, hd, -1)], 1)
            out[f"model.layers.{i}.attention.wqkv.weight"] = np.ascontiguousarray(g.reshape(-1, g.shape[-1]))
        return out

    cfg = dict(_common(kw), architectures=["InternLM2ForCausalLM"], model_type="internlm2", hidden_act="silu",
               bias=False, rope_theta=10000.0)
    _rewrite(folder, cfg, rename)


def _to_chatglm(folder, kw):  # ChatGLM3 / GLM-4-9B-chat: transformers' glm under transformer.encoder.* names
    def rename(t):
        out = {"transformer.embedding.word_embeddings.weight": t.pop("model.embed_tokens.weight"),
               "transformer.encoder.final_layernorm.weight": t.pop("model.norm.weight"),
               "transformer.output_layer.weight": t.pop("lm_head.weight")}
        for i in range(kw["num_hidden_layers"]):
            p, o = f"model.layers.{i}.", f"transformer.encoder.layers.{i}."
            for x in ("weight", "bias"):
                out[o + f"self_attention.query_key_value.{x}"] = np.concatenate(
                    [t.pop(p + f"self_attn.{c}_proj.{x}") for c in "qkv"])
            out[o + "self_attention.dense.weight"] = t.pop(p + "self_attn.o_proj.weight")
            out[o + "input_layernorm.weight"] = t.pop(p + "input_layernorm.weight")
            out[o + "post_attention_layernorm.weight"] = t.pop(p + "post_attention_layernorm.weight")
            out[o + "mlp.dense_h_to_4h.weight"] = t.pop(p + "mlp.gate_up_proj.weight")
            out[o + "mlp.dense_4h_to_h.weight"] = t.pop(p + "mlp.down_proj.weight")
        assert not t, sorted(t)
        return out

    cfg = {"architectures": ["ChatGLMModel"], "model_type": "chatglm", "num_layers": kw["num_hidden_layers"],
           "hidden_size": kw["hidden_size"], "ffn_hidden_size": kw["intermediate_size"], "kv_channels": kw["head_dim"],
           "num_attention_heads": kw["num_attention_heads"], "multi_query_attention": True,
           "multi_query_group_num": kw["num_key_value_heads"], "padded_vocab_size": kw["vocab_size"],
           "seq_length": kw["max_position_embeddings"], "add_qkv_bias": True, "add_bias_linear": False,
           "layernorm_epsilon": kw["rms_norm_eps"], "rmsnorm": True, "tie_word_embeddings": False,
           "rope_ratio": kw["rope_parameters"]["rope_theta"] / 10000.0}
    _rewrite(folder, cfg, rename)


def _to_gpt_oss(folder, kw):  # the released orientation of the stacked experts: (E, out, in)
    def rename(t):
        return {n: np.ascontiguousarray(a.transpose(0, 2, 1)) if n.endswith(("experts.gate_up_proj",
                                                                            "experts.down_proj")) else a
                for n, a in t.items()}

    _rewrite(folder, json.loads((folder / "config.json").read_text()), rename)


_CONVERT = {"minicpm": _to_minicpm, "internlm2": _to_internlm2, "chatglm": _to_chatglm, "gpt_oss": _to_gpt_oss}


def _close(ours: np.ndarray, ref: np.ndarray) -> float:
    assert ours.shape == ref.shape
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers(name, tmp_path):
    from orkpack.synth import write_gguf_from_hf

    ids, ref = _build(name, tmp_path / "hf")
    err = _close(logits(tmp_path / "hf", ids), ref)
    assert err <= TOL, f"{name} HF folder: relative error {err:.2e}"
    gguf = write_gguf_from_hf(tmp_path / "hf", tmp_path / "m.gguf", llama_cpp=True)
    err = _close(logits(gguf, ids), ref)
    assert err <= TOL, f"{name} GGUF: relative error {err:.2e}"


# ------------------------------------------------------------------ without transformers: refusals, streaming, hook

def _tiny(tmp_path, family: str, **over):
    from orkpack.synth import TINY, write_hf_model

    cfg = json.loads(json.dumps(TINY[family]))
    cfg.update(over)
    return write_hf_model(tmp_path / family, config=cfg, shards=1, dtype="f32", seed=3)


def test_a_family_without_a_declaration_refuses_in_one_line(tmp_path, monkeypatch):
    import dataclasses

    folder = _tiny(tmp_path, "starcoder2")
    monkeypatch.setitem(archs.FAMILIES, "starcoder2", dataclasses.replace(archs.FAMILIES["starcoder2"], forward=None))
    with pytest.raises(NotEvaluable) as e:
        logits(folder, [1, 2, 3])
    msg = str(e.value)
    assert "\n" not in msg and "architecture starcoder2 is not evaluable yet" in msg


def test_every_family_is_declared():
    assert [f.name for f in archs.FAMILIES.values() if f.forward is None] == []


def test_experts_stored_in_by_out_refuse(tmp_path):
    """transformers saves a float gpt-oss with (E, in, out) experts: the pass refuses rather than misread them."""
    from safetensors.numpy import load_file, save_file

    folder = _tiny(tmp_path, "granitemoe", intermediate_size=48)  # stacked (E, 2I, H) input_linear
    path = folder / "model.safetensors"
    t = load_file(path)
    for n in list(t):
        if n.endswith("input_linear.weight"):
            t[n] = np.ascontiguousarray(t[n].transpose(0, 2, 1))
    save_file(t, path)
    with pytest.raises(NotEvaluable, match=r"is not \(experts, out, 64\)"):
        logits(folder, [1, 2, 3])


@pytest.mark.parametrize("family, over, what", [
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("olmoe", {"clip_qkv": 8.0}, "clip_qkv"),
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
     "RoPE scaling 'longrope' is not evaluable yet"),
    ("llama", {"hidden_act": "quick_gelu"}, "activation 'quick_gelu' is not evaluable yet"),
])
def test_options_not_implemented_refuse_in_one_line(family, over, what, tmp_path):
    folder = _tiny(tmp_path, family, **over)
    with pytest.raises(NotEvaluable) as e:
        logits(folder, [1, 2, 3])
    assert what in str(e.value) and "\n" not in str(e.value)


def test_token_outside_the_vocabulary_is_one_line(tmp_path):
    folder = _tiny(tmp_path, "llama")
    with pytest.raises(SourceError, match="outside the vocabulary"):
        logits(folder, [1, 128])


class _Recording:
    """A provider over SourceWeights that records what is read between releases and every matmul."""

    def __init__(self, src):
        from orkpack.model import SourceWeights

        self.inner = SourceWeights(src)
        self.blocks: list[set[str]] = [set()]
        self.matmuls: list[tuple[str, int | None]] = []
        self.peak = 0
        inner_raw = self.inner._raw

        def raw(name):
            self.blocks[-1].add(name)
            a = inner_raw(name)
            self.peak = max(self.peak, sum(x.nbytes for x in self.inner._cache.values()))
            return a

        self.inner._raw = raw

    def has(self, name):
        return self.inner.has(name)

    def tensor(self, name):
        return self.inner.tensor(name)

    def matmul(self, name, x, expert=None):
        self.matmuls.append((name, expert))
        return self.inner.matmul(name, x, expert)

    def embed(self, ids):
        return self.inner.embed(ids)

    def release(self):
        self.inner.release()
        self.blocks.append(set())


@pytest.mark.parametrize("family", ["qwen2_moe", "deepseek_v2"])
def test_weights_stream_one_layer_at_a_time_and_every_matrix_goes_through_the_hook(family, tmp_path):
    import re

    folder = _tiny(tmp_path, family)
    src = open_source(folder)
    try:
        rec = _Recording(src)
        ref = run(src, np.arange(20) % 100)
        got = run(src, np.arange(20) % 100, weights=rec)
        infos = {t.name: t for t in src.tensors()}
    finally:
        src.close()
    np.testing.assert_array_equal(got, ref)  # the recording provider changes nothing
    layers = [b for b in rec.blocks if b]
    L = archs.facts_from_config(json.loads((folder / "config.json").read_text()))["n_layers"]
    for i, block in enumerate(layers[:L]):  # one block per layer, holding that layer's tensors only
        assert {int(re.match(r"blk\.(\d+)\.", n).group(1)) for n in block} == {i}, block
    assert all(not n.startswith("blk.") for b in layers[L:] for n in b)
    largest_layer = max(sum(infos[n].nbytes for n in infos if n.startswith(f"blk.{i}.")) for i in range(L))
    assert rec.peak <= largest_layer
    # every stored matrix is read through matmul (experts one by one), the embedding through embed()
    mats = {n for n, t in infos.items() if len(t.shape) >= 2 and n != "token_embd.weight"}
    assert {n for n, _ in rec.matmuls} == mats
    assert any(e is not None for _, e in rec.matmuls)


def test_the_hook_decides_the_products(tmp_path):
    """A provider's products are the ones the logits use: a zero output head gives zero logits."""
    folder = _tiny(tmp_path, "qwen3")
    src = open_source(folder)
    try:
        rec = _Recording(src)
        inner = rec.matmul
        rec.matmul = lambda name, x, expert=None: inner(name, x, expert) * (0.0 if name == "output.weight" else 1.0)
        out = run(src, [5, 6, 7], weights=rec)
    finally:
        src.close()
    assert out.shape == (3, 128) and not out.any()


def test_logits_in_blocks_equal_the_whole(tmp_path):
    folder = _tiny(tmp_path, "gemma2")
    whole = logits(folder, np.arange(50) % 128)
    got = np.full_like(whole, np.nan)
    done = []

    def take(t0, block):
        got[t0: t0 + block.shape[0]] = block

    assert logits(folder, np.arange(50) % 128, on_logits=take, chunk=16,
                  progress=lambda d, n: done.append((d, n))) is None
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-5 * np.abs(whole).max())  # BLAS rounds by block size
    assert done[-1][0] == done[-1][1] == 2 + 4  # layers, then logit blocks


def test_run_without_a_source_takes_hparams_and_weights(tmp_path):
    """What an eval of a pack does: the metadata's hyperparameters and its own provider, no Source."""
    from orkpack.model import SourceWeights, model_hparams

    folder = _tiny(tmp_path, "granite")
    src = open_source(folder)
    try:
        ref = run(src, [3, 1, 4, 1, 5])
        got = run(None, [3, 1, 4, 1, 5], hp=model_hparams(src), weights=SourceWeights(src))
    finally:
        src.close()
    np.testing.assert_array_equal(got, ref)
    with pytest.raises(ValueError, match="needs both hp and weights"):
        run(None, [1])


def test_transformers4_rope_keys_read_as_transformers5_rope_parameters():
    """Real config.json files mostly carry 4.x keys (rope_theta, rope_scaling, rope_local_base_freq)."""
    from orkpack.model.hparams import from_config
    from orkpack.synth import TINY

    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    old = dict(TINY["llama"], rope_theta=500000.0, rope_scaling=llama3)
    new = dict(TINY["llama"], rope_parameters=dict(llama3, rope_theta=500000.0))
    new.pop("rope_theta")
    a, b = from_config(old), from_config(new)
    np.testing.assert_array_equal(a.rope.inv_freq, b.rope.inv_freq)
    assert not np.array_equal(a.rope.inv_freq, from_config(TINY["llama"]).rope.inv_freq)
    g_old = dict(TINY["gemma3_text"], rope_theta=1e6, rope_local_base_freq=5e3, rope_scaling={"rope_type": "linear",
                                                                                                  "factor": 8.0})
    g_new = dict(TINY["gemma3_text"], rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e3}})
    g_new.pop("rope_theta")
    a, b = from_config(g_old), from_config(g_new)
    np.testing.assert_array_equal(a.rope.inv_freq, b.rope.inv_freq)
    np.testing.assert_array_equal(a.rope_swa.inv_freq, b.rope_swa.inv_freq)
    # a Gemma 3 config that states no base: transformers' defaults (1e6 global, 1e4 sliding)
    bare = dict(TINY["gemma3_text"])
    bare.pop("rope_theta")
    hp = from_config(bare)
    assert hp.rope.params["rope_theta"] == 1e6 and hp.rope_swa.params["rope_theta"] == 1e4


@pytest.mark.parametrize("family", ["llama", "gemma2", "internlm2"])
def test_gguf_metadata_beside_hf_layout_weights(family, tmp_path):
    """A pack built from an HF folder carries GGUF-style metadata but the HF weights: layout="hf"."""
    from orkpack.model.hparams import from_config, from_gguf, to_gguf
    from orkpack.synth import write_gguf_from_hf

    folder = _tiny(tmp_path, family)
    g = write_gguf_from_hf(folder, tmp_path / "m.gguf", llama_cpp=True)
    src, gsrc = open_source(folder), open_source(g)
    try:
        ref = run(src, np.arange(24) % 100)
        hp = from_gguf(gsrc.metadata, gsrc.config, None, "m.gguf", layout="hf")
        got = run(src, np.arange(24) % 100, hp=hp)
        wrong = run(src, np.arange(24) % 100, hp=from_gguf(gsrc.metadata, gsrc.config, None, "m.gguf"))
    finally:
        src.close()
        gsrc.close()
    assert _close(got, ref) <= TOL
    assert _close(wrong, ref) > 1e-2  # the llama.cpp layout's RoPE / gains on HF weights: a different model
    assert to_gguf(hp) == pytest.approx(to_gguf(from_config(json.loads((folder / "config.json").read_text()))))


def test_activations_of_large_negative_inputs_do_not_overflow():
    import warnings

    from orkpack.model.forward import _act

    x = np.array([-200.0, -90.0, 0.0, 5.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 1 / (1 + exp(200)) overflowed float32 before
        y = _act(x, "silu")
    np.testing.assert_allclose(y, x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6, atol=1e-30)
    assert y.dtype == np.float32


@pytest.mark.parametrize("family", ["gemma2", "qwen2_moe", "lfm2", "gemma3n_text", "gemma4_text", "rwkv7",
                                    "qwen3_next"])
def test_batch_gives_each_sequence_its_run(family, tmp_path):
    """forward.Batch (what orkpack eval runs its chunks as: layer by layer over every sequence, the embedding rows of
    all in one lookup, the output head kept) gives each sequence run()'s logits bit for bit, in the same blocks; from
    a later token on, only the blocks from the one holding it, the same bits; each layer's weights are read once for
    all sequences (SourceWeights' reads counted)."""
    from orkpack.model import SourceWeights, model_hparams
    from orkpack.model.forward import Batch, head_blocks

    folder = _tiny(tmp_path, family)
    src = open_source(folder)
    try:
        hp = model_hparams(src)
        seqs = [np.arange(37) % 128, (np.arange(24) * 7 + 3) % 128, np.array([5, 9, 2])]
        alone = [run(src, s, chunk=16) for s in seqs]
        reads: list[str] = []
        w = SourceWeights(src)
        raw = w._raw
        w._raw = lambda name: (reads.append(name) if name not in w._cache else None, raw(name))[1]
        b = Batch(src, seqs, weights=w, hp=hp)
        for i in range(hp.n_layers):
            b.layer(i)
        for k, s in enumerate(seqs):
            for start in (0, 17):
                got, steps = {}, []
                b.logits(k, lambda t0, lg: got.__setitem__(t0, lg.copy()), chunk=16, start=start,
                         step=lambda: steps.append(1))
                assert sorted(got) == list(range(start // 16 * 16, s.size, 16))
                assert len(steps) == head_blocks(s.size, 16, start)
                for t0, lg in got.items():
                    np.testing.assert_array_equal(lg.view(np.uint32), alone[k][t0: t0 + 16].view(np.uint32))
        b.release()
    finally:
        src.close()
    layer_reads = [n for n in reads if n.startswith("blk.")]
    assert layer_reads and len(layer_reads) == len(set(layer_reads))  # every layer tensor read once for all three
