"""The reference forward pass (orkpack.model) against transformers, on tiny random models of every family.

Each model is built by transformers from a config (random init, seeded; every parameter then
redrawn so norm gains, biases and routers are not at their neutral init), saved with
save_pretrained as safetensors, and its float32 logits on a token sequence longer than its
sliding windows compared with ours: from the HF folder, and from a GGUF of the same weights in
llama.cpp's converter layout (q/k rows permuted where the converter permutes them, gemma gains
stored as 1 + w, hyperparameters as llama.cpp keys). Tolerance: max |ours - theirs| <= 1e-4 x
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

torch = pytest.importorskip("torch", reason="the reference logits need torch (test extra)")
transformers = pytest.importorskip("transformers", reason="the reference logits need transformers (test extra)")

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
    "minicpm3": dict(q_lora_rank=24, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8,
                     num_key_value_heads=4, v_head_dim=16, scale_emb=6.0, dim_model_base=16, scale_depth=1.4),
}


def _build(name: str, folder) -> tuple[np.ndarray, np.ndarray]:
    """Save a tiny random model of case ``name`` in ``folder``; (tokens, transformers' logits)."""
    kw = dict(_BASE, **CASES[name])
    mt = kw.pop("model_type", name)
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
    ids = np.random.default_rng(2).integers(0, kw["vocab_size"], T)
    with torch.no_grad():
        ref = model(torch.tensor(ids)[None]).logits[0].float().numpy()
    return ids, ref


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
