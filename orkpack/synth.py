"""Seeded synthetic checkpoints: an HF folder and a GGUF holding the same weights.

Every family of :mod:`orkpack.archs` has a tiny config.json in :data:`TINY`
(its real config keys); ``write_hf_model(folder, config=TINY[family])`` writes
exactly the tensors the family's entry lists, under their real HF names and
dtypes: gpt-oss experts as MXFP4 ``*_blocks``/``*_scales`` (U8), DeepSeek-V3
linear weights as F8_E4M3 with ``weight_scale_inv`` (their releases' form).

``write_hf_model`` writes ``config.json``, safetensors shards
(``model-0000i-of-0000n.safetensors`` with ``model.safetensors.index.json``, or
one ``model.safetensors`` when ``shards == 1``) under real HF names.
``write_gguf_model`` writes the same model as one GGUF under GGUF names, with
MoE experts stacked as ``blk.N.ffn_{gate,up,down}_exps.weight`` of numpy shape
``(E, N_out, K_in)``.

Values. Every tensor (every expert of a stacked tensor) is drawn from its own
generator, seeded by ``(seed, canonical name, expert)``, so both writers produce
the same values whatever the order or sharding. Matrices are heavy-tailed:
Student-t with 3 degrees of freedom (a normal divided by sqrt(chi2_3 / 3), the
chi2 draw shared by 8 neighbours, which keeps every element's marginal exactly
t_3 at a fraction of the cost), scaled to std 0.02, plus a few outliers of
magnitude 0.2-0.6; norms are 1 + N(0, 0.05); biases N(0, 0.02). All values
are rounded to bfloat16 (round to nearest even) first, so they are exactly
representable in BF16 and F32: an HF build in bf16/f32 and a GGUF in
BF16/F32 hold bit-identical values after widening to float32. F16 rounds them
again (values below 2^-14 lose bits); Q8_0/Q4_0 quantize them (lossy).
Same arguments and seed -> the same bytes (numpy's Generator streams are stable).

The GGUF is NOT what ``convert_hf_to_gguf.py`` would write: it does not apply
llama.cpp's q/k rope permutation, and it keeps 1-D tensors and the MoE router
(``ffn_gate_inp``) in F32 as llama.cpp does. The point is that both files hold
identical weights under both naming schemes. No tokenizer is written.

Both writers stream: one tensor (one stacked expert tensor) in memory at a time.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import archs

_DT = {"bf16": ("BF16", np.uint16, "bfloat16"), "f16": ("F16", np.float16, "float16"),
       "f32": ("F32", np.float32, "float32")}
LEGACY_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")
_HF_CLASS = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
}

# A tiny config.json per family, with the real config keys (and quantization_config where the
# family's releases ship quantized): the fixtures every family is built, inspected and verified from.
_BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 4096,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "bfloat16"}


def _tiny(model_type: str, cls: str, **kw) -> dict:
    return {"architectures": [cls], "model_type": model_type, **_BASE, **kw}



_Q35 = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 4,
        "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default", "partial_rotary_factor": 0.25,
                            "mrope_section": [1, 1, 0], "mrope_interleaved": True}, "torch_dtype": "bfloat16"}
_Q35_MOE = {**_Q35, "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}
# Gemma 4: sliding (head 16, 2 KV heads) and full layers (head 32, 1 KV head: attention_k_eq_v, keys as values), the
# last 2 layers reusing earlier K/V with a double-wide MLP, per-layer embeddings of 8, a proportional RoPE
_G4 = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "hidden_size": 64, "intermediate_size": 96,
       "num_hidden_layers": 6, "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                                               "sliding_attention", "sliding_attention", "full_attention"],
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
       "num_global_key_value_heads": 1, "attention_k_eq_v": True, "num_kv_shared_layers": 2,
       "use_double_wide_mlp": True, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 128,
       "vocab_size": 128, "sliding_window": 8, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6,
       "max_position_embeddings": 4096, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
       "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                           "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                              "rope_theta": 1000000.0}}, "torch_dtype": "bfloat16"}
# Gemma 3n: sliding and full layers (one head size), the last 2 reusing earlier K/V, each layer its own FFN width, the
# first 2 with activation sparsity, 4 AltUp streams, LAuReL of rank 8, per-layer embeddings of 8
_G3N = {"architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text", "hidden_size": 64,
        "intermediate_size": [96, 96, 128, 128, 64, 64], "num_hidden_layers": 6,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                        "sliding_attention", "full_attention"],
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 128, "vocab_size": 128, "sliding_window": 8,
        "final_logit_softcapping": 30.0, "laurel_rank": 8, "altup_num_inputs": 4, "altup_active_idx": 0,
        "altup_correct_scale": True, "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
        "torch_dtype": "bfloat16"}
# Qwen3-Next: the Qwen3.5-MoE tiny shape with Qwen3NextConfig's keys (no MRoPE sections; every layer MoE)
_Q3N = {**{k: v for k, v in _Q35_MOE.items() if k != "rope_parameters"}, "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next", "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        "rope_parameters": {"rope_theta": 10000000.0, "rope_type": "default", "partial_rotary_factor": 0.25}}
# RWKV7 (fla-hub's RWKV7ForCausalLM): 2 layers, hidden 128 in 2 wkv heads of 64 (the head size llama.cpp's group norm
# eps assumes), LoRA ranks 32 / 32 / 16 / 32, channel mix 256
_RWKV7 = {"architectures": ["RWKV7ForCausalLM"], "model_type": "rwkv7", "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 2, "head_dim": 64, "decay_low_rank_dim": 32, "a_low_rank_dim": 32,
          "v_low_rank_dim": 16, "gate_low_rank_dim": 32, "norm_eps": 1e-5, "norm_first": True, "norm_bias": True,
          "hidden_act": "sqrelu", "vocab_size": 128, "max_position_embeddings": 4096, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}
TINY: dict[str, dict] = {
    "llama": _tiny("llama", "LlamaForCausalLM", tie_word_embeddings=False, attention_bias=False, mlp_bias=False),
    "mistral": _tiny("mistral", "MistralForCausalLM", tie_word_embeddings=False, sliding_window=None),
    "mixtral": _tiny("mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2,
                     tie_word_embeddings=False),
    "qwen2": _tiny("qwen2", "Qwen2ForCausalLM", tie_word_embeddings=True, use_sliding_window=False),
    "qwen2_moe": _tiny("qwen2_moe", "Qwen2MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=64, decoder_sparse_step=1,
                       mlp_only_layers=[1], tie_word_embeddings=False),
    "qwen3": _tiny("qwen3", "Qwen3ForCausalLM", tie_word_embeddings=True, attention_bias=False),
    "qwen3_moe": _tiny("qwen3_moe", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[],
                       norm_topk_prob=True, tie_word_embeddings=False),
    "gemma": _tiny("gemma", "GemmaForCausalLM", hidden_act="gelu_pytorch_tanh", num_key_value_heads=1),
    "gemma2": _tiny("gemma2", "Gemma2ForCausalLM", sliding_window=32, query_pre_attn_scalar=16,
                    final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    "gemma3_text": _tiny("gemma3_text", "Gemma3ForCausalLM", num_hidden_layers=3, sliding_window=32,
                         sliding_window_pattern=3, query_pre_attn_scalar=16),
    "gemma3": {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
               "text_config": _tiny("gemma3_text", "Gemma3ForCausalLM", num_hidden_layers=3, sliding_window=32,
                                    sliding_window_pattern=3),
               "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                                 "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 4,
                                 "image_size": 16, "num_channels": 3},
               "mm_tokens_per_image": 4, "torch_dtype": "bfloat16"},
    "phi3": _tiny("phi3", "Phi3ForCausalLM", tie_word_embeddings=False, sliding_window=2047),
    "internlm2": _tiny("internlm2", "InternLM2ForCausalLM", bias=False, tie_word_embeddings=False),
    "minicpm": _tiny("minicpm", "MiniCPMForCausalLM", scale_emb=12, dim_model_base=256, scale_depth=1.4),
    "minicpm3": _tiny("minicpm3", "MiniCPM3ForCausalLM", q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
                      qk_rope_head_dim=16, v_head_dim=16, scale_emb=12, dim_model_base=256, scale_depth=1.4),
    "chatglm": {"architectures": ["ChatGLMModel"], "model_type": "chatglm", "num_layers": 2, "hidden_size": 64,
                "ffn_hidden_size": 96, "kv_channels": 16, "num_attention_heads": 4, "multi_query_attention": True,
                "multi_query_group_num": 2, "padded_vocab_size": 128, "seq_length": 4096, "add_qkv_bias": True,
                "add_bias_linear": False, "layernorm_epsilon": 1e-5, "rmsnorm": True, "torch_dtype": "bfloat16"},
    "glm4": _tiny("glm4", "Glm4ForCausalLM", attention_bias=True, tie_word_embeddings=False),
    "deepseek_v2": _tiny("deepseek_v2", "DeepseekV2ForCausalLM", num_hidden_layers=3, q_lora_rank=None,
                         kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                         n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2, moe_intermediate_size=32,
                         first_k_dense_replace=1, moe_layer_freq=1, topk_method="greedy", tie_word_embeddings=False),
    "deepseek_v3": _tiny("deepseek_v3", "DeepseekV3ForCausalLM", num_hidden_layers=3, q_lora_rank=48,
                         kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
                         n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
                         first_k_dense_replace=1, moe_layer_freq=1, topk_method="noaux_tc",
                         num_nextn_predict_layers=1, tie_word_embeddings=False,
                         quantization_config={"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                              "weight_block_size": [128, 128]}),
    "gpt_oss": _tiny("gpt_oss", "GptOssForCausalLM", intermediate_size=64, num_local_experts=4,
                     num_experts_per_tok=2, sliding_window=32, layer_types=["sliding_attention", "full_attention"],
                     tie_word_embeddings=False, attention_bias=True,
                     quantization_config={"quant_method": "mxfp4",
                                          "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                     "model.embed_tokens", "lm_head"]}),
    "olmoe": _tiny("olmoe", "OlmoeForCausalLM", intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                   num_key_value_heads=4, tie_word_embeddings=False),
    "granite": _tiny("granite", "GraniteForCausalLM", attention_bias=False, mlp_bias=False,
                     embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
                     attention_multiplier=0.0625, tie_word_embeddings=True),
    "granitemoe": _tiny("granitemoe", "GraniteMoeForCausalLM", intermediate_size=32, num_local_experts=4,
                        num_experts_per_tok=2, embedding_multiplier=12.0, residual_multiplier=0.22,
                        logits_scaling=6.0, attention_multiplier=0.0625, tie_word_embeddings=True),
    "smollm3": _tiny("smollm3", "SmolLM3ForCausalLM", no_rope_layers=[1, 0], tie_word_embeddings=True),
    "starcoder2": _tiny("starcoder2", "Starcoder2ForCausalLM", use_bias=True, sliding_window=4096,
                        norm_epsilon=1e-5, tie_word_embeddings=True),
    # a hybrid: short-convolution and attention layers (4, to mix them); the FFN width auto-adjusted (144 -> 96)
    "lfm2": {"architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 64, "intermediate_size": 144,
             "block_auto_adjust_ff_dim": True, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 32,
             "num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "full_attention"],
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 4096,
             "norm_eps": 1e-5, "conv_L_cache": 3, "conv_bias": False, "tie_word_embeddings": True,
             "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "torch_dtype": "bfloat16"},
    # LFM2's hybrid with an MoE FFN after the first (dense) layer: 4 experts, top 2, a sigmoid router, expert bias
    "lfm2_moe": {"architectures": ["Lfm2MoeForCausalLM"], "model_type": "lfm2_moe", "hidden_size": 64,
                 "intermediate_size": 96, "moe_intermediate_size": 32, "num_hidden_layers": 4,
                 "layer_types": ["conv", "full_attention", "conv", "full_attention"], "num_dense_layers": 1,
                 "num_experts": 4, "num_experts_per_tok": 2, "use_expert_bias": True, "norm_topk_prob": True,
                 "routed_scaling_factor": 1.0, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "vocab_size": 128, "max_position_embeddings": 4096, "norm_eps": 1e-5, "conv_L_cache": 3,
                 "conv_bias": False, "tie_word_embeddings": True,
                 "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "torch_dtype": "bfloat16"},
    # Qwen3.5: Gated DeltaNet and gated-attention layers (2 value heads per key head: the converter tiles them)
    "qwen3_5_text": _Q35,
    "qwen3_5_moe_text": _Q35_MOE,
    "qwen3_next": _Q3N,
    # the releases' multimodal form: the text model in text_config (its vision tower is left out of a build)
    "qwen3_5": {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                "text_config": {k: v for k, v in _Q35.items() if k != "architectures"} | {"model_type": "qwen3_5_text"},
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "qwen3_5_moe": {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                    "text_config": {k: v for k, v in _Q35_MOE.items() if k != "architectures"}
                    | {"model_type": "qwen3_5_moe_text"}, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "gemma4_text": _G4,
    # a Gemma 4 release: the text model in text_config (its vision and audio towers are left out of a build)
    "gemma4": {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
               "text_config": {k: v for k, v in _G4.items() if k != "architectures"}, "tie_word_embeddings": True,
               "torch_dtype": "bfloat16"},
    "gemma3n_text": _G3N,
    # a Gemma 3n release: the text model in text_config (its vision and audio towers are left out of a build)
    "gemma3n": {"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
                "text_config": {k: v for k, v in _G3N.items() if k != "architectures"}, "tie_word_embeddings": True,
                "torch_dtype": "bfloat16"},
    # a hybrid: Mamba2 and NoPE attention layers (the published configs' names), 2 groups of B/C, an MoE FFN of 4
    # experts plus the shared MLP, the granite multipliers
    "granitemoehybrid": {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
                         "hidden_size": 64, "intermediate_size": 32, "shared_intermediate_size": 48,
                         "num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "attention"],
                         "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
                         "num_experts_per_tok": 2, "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2,
                         "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
                         "mamba_proj_bias": False, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                         "attention_multiplier": 0.0625, "logits_scaling": 6.0, "position_embedding_type": "nope",
                         "rms_norm_eps": 1e-5, "vocab_size": 128, "max_position_embeddings": 4096,
                         "tie_word_embeddings": True, "rope_theta": 10000.0, "torch_dtype": "bfloat16"},
    # attention and Mamba2 in parallel in every layer; d_inner 96 (mamba_d_ssm, not 2 x hidden), 6 heads of 16 in
    # 2 groups of B/C, no gated norm (as released); every muP multiplier away from 1
    "falcon_h1": {"architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "hidden_size": 64,
                  "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 16, "mamba_d_ssm": 96, "mamba_n_heads": 6, "mamba_d_head": 16, "mamba_n_groups": 2,
                  "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True,
                  "mamba_proj_bias": False, "mamba_rms_norm": False, "mamba_norm_before_gate": False,
                  "projectors_bias": False, "attention_bias": False, "mlp_bias": False,
                  "embedding_multiplier": 2.5, "lm_head_multiplier": 0.37, "key_multiplier": 0.6,
                  "attention_in_multiplier": 1.3, "attention_out_multiplier": 0.8, "ssm_in_multiplier": 1.2,
                  "ssm_out_multiplier": 0.7, "mlp_multipliers": [0.9, 1.4], "ssm_multipliers": [0.5, 1.5, 0.8, 1.25, 0.6],
                  "rms_norm_eps": 1e-5, "vocab_size": 128, "max_position_embeddings": 4096,
                  "tie_word_embeddings": False, "rope_theta": 10000.0, "torch_dtype": "bfloat16"},
    # Nemotron-H as released (hybrid_override_pattern, time_step_limit [0, Infinity]): M Mamba2, * attention, - MLP
    "nemotron_h": {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 64,
                   "intermediate_size": 96, "num_hidden_layers": 6, "hybrid_override_pattern": "M*-M-*",
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 8,
                   "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4, "expand": 2,
                   "use_conv_bias": True, "use_bias": False, "mlp_bias": False, "mlp_hidden_act": "relu2",
                   "mamba_hidden_act": "silu", "layer_norm_epsilon": 1e-5, "time_step_limit": [0.0, float("inf")],
                   "vocab_size": 128, "max_position_embeddings": 4096, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16"},
    # its MoE form (Nemotron-3-Nano-30B-A3B style: E blocks; llama.cpp's nemotron_h_moe)
    "nemotron_h_moe": {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 64,
                       "intermediate_size": 96, "num_hidden_layers": 6, "hybrid_override_pattern": "M*EME*",
                       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 8,
                       "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16, "conv_kernel": 4,
                       "use_conv_bias": True, "use_bias": False, "mlp_bias": False, "mlp_hidden_act": "relu2",
                       "layer_norm_epsilon": 1e-5, "time_step_limit": [0.0, float("inf")], "n_routed_experts": 4,
                       "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                       "moe_shared_expert_intermediate_size": 48, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                       "norm_topk_prob": True, "routed_scaling_factor": 1.0, "vocab_size": 128,
                       "max_position_embeddings": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    # the families of 2025/26 (issue 24)
    "ernie4_5": _tiny("ernie4_5", "Ernie4_5ForCausalLM", use_bias=False, rms_norm_eps=1e-5, rope_theta=500000.0,
                      tie_word_embeddings=True),
    # layer 0 dense, layers 1-2 MoE: 4 experts, top 2, one shared expert
    "ernie4_5_moe": _tiny("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", num_hidden_layers=3, use_bias=False,
                          moe_num_experts=4, moe_k=2, moe_intermediate_size=32, moe_num_shared_experts=1,
                          moe_layer_start_index=1, moe_layer_end_index=2, moe_layer_interval=1, moe_norm_min=1e-12,
                          rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False),
    "olmo2": _tiny("olmo2", "Olmo2ForCausalLM", attention_bias=False, rms_norm_eps=1e-6, rope_theta=500000.0,
                   tie_word_embeddings=False),
    # a sliding layer (window 16: shorter than the tests' 40 tokens) and a full one
    "olmo3": _tiny("olmo3", "Olmo3ForCausalLM", attention_bias=False, rms_norm_eps=1e-6, rope_theta=500000.0,
                   sliding_window=16, layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False),
    # a sliding layer with RoPE (window 16) and a full NoPE one; tied
    "exaone4": _tiny("exaone4", "Exaone4ForCausalLM", rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=16,
                     sliding_window_pattern=2, layer_types=["sliding_attention", "full_attention"],
                     tie_word_embeddings=True),
    # YaRN and the attention temperature with an original context of 8 positions: the tests' 40 tokens see it grow
    "ministral3": {**{k: v for k, v in _tiny("ministral3", "Ministral3ForCausalLM", rms_norm_eps=1e-5,
                                                tie_word_embeddings=False, sliding_window=None).items()
                      if k != "rope_theta"},
                   "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                                       "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}},
    # a Ministral 3 release (Mistral3ForConditionalGeneration): the text model in text_config beside a Pixtral
    # vision tower (left out of a build)
    "mistral3": {"architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    # q/k normed after RoPE; NTK-alpha RoPE (the converter's assumptions: base 10000, a 32k context)
    "hunyuan_v1_dense": {**{k: v for k, v in _tiny("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM", rms_norm_eps=1e-5,
                                                   attention_bias=False, max_position_embeddings=32768,
                                                   tie_word_embeddings=False).items() if k != "rope_theta"},
                         "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0,
                                             "factor": 1.0}},
    # layer 0 dense, 1-2 MoE (4 experts, top 2, a sigmoid router with the correction bias, one shared expert, scaled
    # 2.5), q/k/v biases and q/k norms, half the head rotated
    "glm4_moe": _tiny("glm4_moe", "Glm4MoeForCausalLM", num_hidden_layers=3, attention_bias=True, use_qk_norm=True,
                      partial_rotary_factor=0.5, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                      moe_intermediate_size=32, first_k_dense_replace=1, norm_topk_prob=True,
                      routed_scaling_factor=2.5, n_group=1, topk_group=1, rms_norm_eps=1e-5,
                      tie_word_embeddings=False),
    "rwkv7": _RWKV7,
}
TINY["mistral3"]["text_config"] = {k: v for k, v in TINY["ministral3"].items() if k != "architectures"}


@dataclass(frozen=True)
class _T:
    canonical: str  # GGUF name (stacked name for experts)
    hf: tuple[str, ...]  # one HF name, or one per expert
    shape: tuple[int, ...]  # per HF tensor (per expert)
    kind: str  # "w" matrix, "norm", "bias"
    experts: int = 0  # >0: stacked over this many experts
    stored: str = ""  # how the release stores it: "" (the float dtype), "MXFP4", "F8_E4M3"
    key: str = ""  # the seed key of its values ("": its canonical name; a converter's copy: its source's)


def _legacy_config(arch: str, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int,
                   experts: int, experts_used: int, tied: bool, dtype: str) -> dict:
    if arch not in LEGACY_ARCHS:
        raise ValueError(f"arch must be one of {LEGACY_ARCHS} (or pass config=, e.g. synth.TINY[family]), not {arch!r}")
    if experts > 0 and arch == "llama":
        arch = "qwen3_moe"  # documented: experts > 0 on the default arch writes qwen3_moe-style names
    if (experts > 0) != (arch in ("qwen3_moe", "mixtral")):
        raise ValueError(f"arch {arch} needs experts {'> 0' if arch in ('qwen3_moe', 'mixtral') else '== 0'}")
    if experts and not 0 < experts_used <= experts:
        raise ValueError("experts_used must be in 1..experts")
    if hidden % heads or heads % kv_heads:
        raise ValueError("hidden must be a multiple of heads, heads a multiple of kv_heads")
    cfg = {
        "architectures": [_HF_CLASS[arch]], "model_type": arch, "hidden_size": hidden,
        "intermediate_size": intermediate, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads, "vocab_size": vocab,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": tied, "torch_dtype": _DT[dtype][2],
    }
    if arch == "qwen3_moe":
        cfg.update(num_experts=experts, num_experts_per_tok=experts_used, moe_intermediate_size=intermediate,
                   decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    elif arch == "mixtral":
        cfg.update(num_local_experts=experts, num_experts_per_tok=experts_used)
    return cfg


def _plan(cfg: dict) -> list[_T]:
    """The tensors of a checkpoint with this config (orkpack.archs), grouped: experts stacked under one _T."""
    facts, tensors = archs.hf_tensors(cfg)
    L = archs.layers_in_config(cfg)
    out: list[_T] = []
    stacks: dict[str, list] = {}
    from .sources.names import canonical_name, split_expert

    for name, shape, tpl in tensors:
        canon = canonical_name(name, facts["arch"], L)
        stored = archs.stored_dtype(cfg, name, "")
        sp = split_expert(canon)
        if sp is None:
            out.append(_T(canon, (name,), tuple(shape), tpl.kind, 0, stored))
        elif sp[0] not in stacks:
            stacks[sp[0]] = [name]
            out.append(_T(sp[0], (), tuple(shape), tpl.kind, 0, stored))
        else:
            stacks[sp[0]].append(name)
    out = [_T(t.canonical, tuple(stacks[t.canonical]), t.shape, t.kind, len(stacks[t.canonical]), t.stored)
           if t.canonical in stacks else t for t in out]
    # what the converter stacks into one tensor (a stack over the parts, like experts) and writes twice (no HF tensor)
    for sname, parts in archs.converter_stacks(cfg, [t.canonical for t in out]):
        got = [next(t for t in out if t.canonical == p) for p in parts]
        at = out.index(got[0])
        out = [t for t in out if t.canonical not in parts]
        out.insert(at, _T(sname, tuple(t.hf[0] for t in got), got[0].shape, got[0].kind, len(got), got[0].stored))
    for new, old in archs.converter_copies(cfg, [t.canonical for t in out]):
        src = next(t for t in out if t.canonical == old)
        out.append(_T(new, (), src.shape, src.kind, 0, src.stored, key=src.key or src.canonical))
    return out


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even (inputs are finite)."""
    u = x.astype(np.float32, copy=False).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


_CHUNK = 1 << 20  # elements drawn per step (a multiple of 8); part of the value definition: do not change


def _values(seed: int, key: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """The seeded bf16 bits of one tensor (one expert), drawn in fixed chunks to bound temporaries."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, h])))
    n = math.prod(shape)
    out = np.empty(n, dtype=np.uint16)
    scale = np.float32(0.02 / math.sqrt(3.0))
    for a in range(0, n, _CHUNK):
        c = min(_CHUNK, n - a)
        if kind == "norm":
            x = np.float32(1.0) + np.float32(0.05) * rng.standard_normal(c, dtype=np.float32)
        elif kind == "bias":
            x = np.float32(0.02) * rng.standard_normal(c, dtype=np.float32)
        else:
            g = -(-c // 8)
            z = rng.standard_normal(g * 8, dtype=np.float32).reshape(g, 8)
            chi = rng.standard_gamma(1.5, g, dtype=np.float32) * np.float32(2.0 / 3.0)  # chi2_3 / 3
            z *= (scale / np.sqrt(np.maximum(chi, np.float32(1e-6))))[:, None]
            x = z.reshape(-1)[:c]
        out[a: a + c] = _bf16_bits(x)
    if kind == "w":
        k = 1 + n // 100_000
        idx = rng.integers(0, n, k)
        mag = rng.uniform(0.2, 0.6, k).astype(np.float32) * rng.choice(np.array([-1, 1], np.float32), k)
        out[idx] = _bf16_bits(mag)
    return out.reshape(shape)


def _arrays(t: _T, seed: int):
    """Per HF tensor (per expert): the bf16 bits."""
    if t.experts:
        for e in range(t.experts):
            yield _values(seed, f"{t.canonical}#{e}", t.shape, t.kind)
    else:
        yield _values(seed, t.key or t.canonical, t.shape, t.kind)


def _to_dtype(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return bits
    f32 = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return f32.astype(np.float16) if dtype == "f16" else f32


def _mxfp4(seed: int, key: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Seeded MXFP4 storage of a (E, N, K) tensor: (blocks (E, N, K/32, 16) u8, scales (E, N, K/32) u8 E8M0)."""
    if shape[-1] % 32:
        raise ValueError(f"MXFP4 needs K a multiple of 32, not {shape[-1]}")
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, h, 4])))
    blocks = rng.integers(0, 256, (*shape[:-1], shape[-1] // 32, 16), dtype=np.uint8)
    scales = rng.integers(119, 124, (*shape[:-1], shape[-1] // 32), dtype=np.uint8)  # 2^-8 .. 2^-4
    return blocks, scales


def _fp8(seed: int, key: str, shape: tuple[int, ...], block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Seeded F8_E4M3 storage of an (N, K) weight: (codes (N, K) u8, weight_scale_inv f32 per block)."""
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, h, 8])))
    n, k = shape
    exp = np.minimum(rng.geometric(0.35, (n, k)) + 3, 15).astype(np.uint8)  # mostly small magnitudes
    codes = (rng.integers(0, 2, (n, k), dtype=np.uint8) << 7) | (exp << 3) | rng.integers(0, 8, (n, k), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] &= 0xF7  # 0x7F / 0xFF are NaN in E4M3FN: never written
    sinv = (rng.uniform(0.5, 2.0, (-(-n // block[0]), -(-k // block[1]))) * 2.0 ** -9).astype(np.float32)
    return codes, sinv


def _hf_entries(plan: list[_T], cfg: dict, seed: int, dtype: str):
    """(HF name, safetensors dtype, shape, array factory) for every stored tensor, in plan order."""
    st, _, _ = _DT[dtype]
    qc = cfg.get("quantization_config") or {}
    block = tuple(qc.get("weight_block_size") or (128, 128))
    for t in plan:
        if not t.hf:  # a tensor the converter writes twice: no HF tensor of its own
            continue
        if t.stored == "MXFP4":  # gpt-oss experts: (E, N, K) as blocks of 32 e2m1 codes + one E8M0 scale
            blocks = (*t.shape[:-1], t.shape[-1] // 32)
            yield t.hf[0] + "_blocks", "U8", (*blocks, 16), lambda t=t: _mxfp4(seed, t.canonical, t.shape)[0]
            yield t.hf[0] + "_scales", "U8", blocks, lambda t=t: _mxfp4(seed, t.canonical, t.shape)[1]
        elif t.stored.startswith("F8"):
            for e, name in enumerate(t.hf):
                key = f"{t.canonical}#{e}" if t.experts else t.canonical
                nb = (-(-t.shape[0] // block[0]), -(-t.shape[1] // block[1]))
                yield name, "F8_E4M3", t.shape, lambda key=key, t=t: _fp8(seed, key, t.shape, block)[0]
                yield name + "_scale_inv", "F32", nb, lambda key=key, t=t: _fp8(seed, key, t.shape, block)[1]
        elif t.experts:
            for e, name in enumerate(t.hf):
                yield name, st, t.shape, lambda t=t, e=e: _to_dtype(_values(seed, f"{t.canonical}#{e}", t.shape, t.kind), dtype)
        else:
            yield t.hf[0], st, t.shape, lambda t=t: _to_dtype(_values(seed, t.canonical, t.shape, t.kind), dtype)


_ST_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "F8_E4M3": 1}


def write_hf_model(folder, *, arch: str = "llama", layers: int = 2, hidden: int = 256, intermediate: int = 688,
                   heads: int = 4, kv_heads: int = 2, vocab: int = 512, experts: int = 0, experts_used: int = 0,
                   shards: int = 2, dtype: str = "bf16", seed: int = 0, tied: bool = False,
                   config: dict | None = None) -> Path:
    """Write an HF folder (config.json, shards, index); returns the folder. dtype: bf16, f16 or f32.

    ``config``: a config.json dict of any family (``TINY[family]`` gives one per family);
    the tensors are exactly those ``orkpack.archs`` lists for it, under their real HF
    names, quantized releases (gpt-oss MXFP4, DeepSeek-V3 FP8) in their stored form.
    Without it, the keyword arguments describe a model of one of :data:`LEGACY_ARCHS`:
    ``experts > 0`` with ``arch="llama"`` writes a qwen3_moe model (per-expert
    ``mlp.experts.E.{gate,up,down}_proj`` and the ``mlp.gate`` router);
    ``arch="mixtral"`` uses ``block_sparse_moe.experts.E.w1/w2/w3``. Expert
    width is ``intermediate``.
    """
    if dtype not in _DT:
        raise ValueError(f"dtype must be one of {tuple(_DT)}")
    if config is None:
        config = _legacy_config(arch, layers, hidden, intermediate, heads, kv_heads, vocab, experts, experts_used,
                                tied, dtype)
    else:
        config = json.loads(json.dumps(config))
        config["torch_dtype"] = _DT[dtype][2]
    plan = _plan(config)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    flat = list(_hf_entries(plan, config, seed, dtype))  # (hf name, dtype, shape, factory)
    sizes = [math.prod(shape) * _ST_ITEMSIZE[st] for _, st, shape, _ in flat]
    total = sum(sizes)
    shards = max(1, min(int(shards), len(flat)))
    groups: list[list[int]] = [[] for _ in range(shards)]
    acc = 0
    for j, s in enumerate(sizes):  # contiguous runs of about total/shards bytes; an empty run is dropped
        g = min(shards - 1, acc * shards // max(total, 1))
        groups[g].append(j)
        acc += s
    groups = [g for g in groups if g]
    n = len(groups)
    fnames = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map = {}
    for fname, members in zip(fnames, groups):
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for j in members:
            hfname, st, shape, _ = flat[j]
            header[hfname] = {"dtype": st, "shape": list(shape), "data_offsets": [off, off + sizes[j]]}
            weight_map[hfname] = fname
            off += sizes[j]
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(folder / fname, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            for j in members:
                arr = np.ascontiguousarray(flat[j][3]())  # one tensor in memory at a time
                assert arr.nbytes == sizes[j], flat[j][0]
                f.write(arr.data)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if n > 1:
        idx = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / "model.safetensors.index.json").write_text(json.dumps(idx, indent=2) + "\n")
    else:
        try:
            os.remove(folder / "model.safetensors.index.json")
        except FileNotFoundError:
            pass
    return folder


def _convert(bits: np.ndarray, q) -> np.ndarray:
    """bf16 bits -> GGUF type q (F32, F16 or a gguf.quants type), in row chunks to bound temporaries."""
    import gguf

    k = bits.shape[-1]
    rows = bits.reshape(-1, k)
    if q.name in ("F32", "F16"):
        out = np.empty(rows.shape, dtype=np.float32 if q.name == "F32" else np.float16)
    else:
        block, tsize = gguf.GGML_QUANT_SIZES[q]
        out = np.empty((rows.shape[0], k // block * tsize), dtype=np.uint8)
    step = max(1, (1 << 20) // k)
    for r0 in range(0, rows.shape[0], step):
        f32 = (rows[r0: r0 + step].astype(np.uint32) << np.uint32(16)).view(np.float32)
        out[r0: r0 + step] = gguf.quants.quantize(f32, q)
    return out


_GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0")


def _gguf_header(w, cfg: dict, f: dict, name: str, extra: dict | None = None) -> None:
    """The GGUF metadata of a model with these facts (``orkpack.archs``): what llama.cpp's loader reads.

    ``extra``: further ``{arch}.`` keys (without the prefix), e.g. the forward pass's hyperparameters
    (:func:`orkpack.model.hparams.to_gguf`); they replace the fixed epsilon and RoPE base.
    """
    extra = dict(extra or {})
    own: dict = {}
    from .sources.modelkv import own_keys  # Gemma4Model's, Gemma3NModel's keys: head sizes, KV sharing, AltUp ...

    from .pack.model import value

    own = {k: value([k, t, v]) if t != "array[bool]" else [bool(x) for x in v] for k, (t, v) in own_keys(cfg).items()}
    w.add_name(name)
    w.add_block_count(f["n_layers"])
    w.add_context_length(4096)
    w.add_embedding_length(f["hidden"])
    if not f.get("ffn_layers") and "feed_forward_length" not in own:
        w.add_feed_forward_length(f["intermediate"])
    w.add_head_count(f["heads"])
    rec, kv, ffn = set(f.get("recurrent_layers") or ()), set(archs.kv_layers(f)), set(f.get("ffn_layers") or ())
    if ffn:  # FFN-only layers (Nemotron-H): their FFN width per layer, 0 for the others (llama.cpp's n_ff(il))
        w.add_feed_forward_length([f["intermediate"] if i in ffn else 0 for i in range(f["n_layers"])])
    if rec:  # a hybrid: per-layer KV heads, 0 for the layers without a KV cache (llama.cpp's is_recr), and the state's sizes
        w.add_head_count_kv([f["kv_heads"] if i in kv else 0 for i in range(f["n_layers"])])
        d = archs.dims(cfg)
        for dim, key in archs.FAMILIES[f["arch"]].blocks.gguf_dims:
            w.add_uint32(f"{w.arch}.{key}", int(d[dim]))
    elif "attention.head_count_kv" not in own:
        w.add_head_count_kv(f["kv_heads"])
    if "attention.key_length" not in own:
        w.add_key_length(f["head_dim"])
    w.add_layer_norm_rms_eps(float(extra.pop("attention.layer_norm_rms_epsilon", 1e-6)))
    w.add_rope_freq_base(float(extra.pop("rope.freq_base", 10000.0)))
    w.add_vocab_size(f["vocab"])
    if f["attention"] == "mla":
        d = archs.dims(cfg)
        w.add_value_length(d["vhd"])
        w.add_kv_lora_rank(d["kvlr"])
        if d["qlr"]:
            w.add_q_lora_rank(d["qlr"])
        w.add_rope_dimension_count(d["rope"])
        extra.pop("rope.dimension_count", None)
    elif "attention.value_length" not in own:
        w.add_value_length(f["head_dim"])
    if f["swa_window"]:
        w.add_sliding_window(f["swa_window"])
        if "attention.sliding_window_pattern" not in own:
            w.add_sliding_window_pattern([i in f["swa_layers"] for i in range(f["n_layers"])])
    if f["n_experts"]:
        w.add_expert_count(f["n_experts"])
        w.add_expert_used_count(f["n_experts_used"])
        w.add_expert_feed_forward_length(f["moe_intermediate"])
    if f["swa_window"]:
        extra.pop("attention.sliding_window", None)
    arch = w.arch
    extra.update(own)
    for key, v in sorted(extra.items()):
        k = f"{arch}.{key}"
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        else:
            w.add_string(k, str(v))


def write_gguf_model(path, *, arch: str = "llama", layers: int = 2, hidden: int = 256, intermediate: int = 688,
                     heads: int = 4, kv_heads: int = 2, vocab: int = 512, experts: int = 0, experts_used: int = 0,
                     seed: int = 0, tied: bool = False, tensor_type: str = "F16",
                     shards: int | None = None, dtype: str | None = None, config: dict | None = None,
                     kv: tuple = ()) -> Path:
    """Write the same model as ``write_hf_model`` (same arguments and seed) as one GGUF; returns the path.

    ``kv``: extra metadata, ``(key, value, GGUFValueType[, item GGUFValueType])`` tuples, written after the
    model's own (tokenizer keys, odd types for the pack's model record).

    ``tensor_type`` applies to 2-D and 3-D weights (F32, F16, BF16, Q8_0, Q4_0;
    a quantized type falls back to F16 when K is not a multiple of 32); 1-D
    tensors and the router stay F32. HF-only options (``shards``, ``dtype``) are
    accepted and ignored so one options dict can drive both writers. ``config``:
    as for ``write_hf_model``, for a family whose release is stored in float.
    """
    import gguf

    if tensor_type not in _GGUF_TYPES:
        raise ValueError(f"tensor_type must be one of {_GGUF_TYPES}")
    if config is None:
        config = _legacy_config(arch, layers, hidden, intermediate, heads, kv_heads, vocab, experts, experts_used,
                                tied, "bf16")
    plan = _plan(config)
    if any(t.stored for t in plan):
        raise ValueError("write_gguf_model writes float releases only (this config is MXFP4/FP8)")
    f = archs.facts_from_config(config)
    arch = f["arch"]
    path = Path(path)
    w = gguf.GGUFWriter(path, archs.gguf_arch_name(arch))
    _gguf_header(w, config, f, f"orkpack synthetic {arch} seed {seed}")
    for key, val, vtype, *sub in kv:
        w.add_key_value(key, val, vtype, sub_type=sub[0] if sub else None)
    Q = gguf.GGMLQuantizationType

    def qtype(t: _T) -> Q:
        if t.kind != "w" or t.canonical.endswith("ffn_gate_inp.weight"):
            return Q.F32
        q = Q[tensor_type]
        if q in (Q.Q8_0, Q.Q4_0) and t.shape[-1] % 32:
            return Q.F16
        return q

    types = []
    for t in plan:
        q = qtype(t)
        shape = ((t.experts,) if t.experts else ()) + t.shape
        block, tsize = gguf.GGML_QUANT_SIZES[q]
        nbytes = math.prod(shape) // block * tsize
        if q in (Q.F32, Q.F16):
            w.add_tensor_info(t.canonical, shape, np.dtype(np.float32 if q == Q.F32 else np.float16), nbytes)
        else:
            w.add_tensor_info(t.canonical, shape, np.dtype(np.uint16), nbytes, raw_dtype=q)
        types.append(q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t, q in zip(plan, types):
        if t.experts:
            bits = np.empty((t.experts, *t.shape), dtype=np.uint16)
            for e, a in enumerate(_arrays(t, seed)):
                bits[e] = a
        else:
            bits = next(_arrays(t, seed))
        w.write_tensor_data(bits if q == Q.BF16 else _convert(bits, q))
    w.close()
    return path


def write_gguf_from_hf(folder, path, *, llama_cpp: bool = False) -> Path:
    """Write the model in HF ``folder`` (any family) as one GGUF holding the same tensor data.

    Tensors are read through orkpack's own readers (quantized releases dequantized),
    stored under their canonical names in the type the reader returns (F32, F16 or
    BF16; experts stacked); the metadata carries the facts of ``orkpack.archs``
    (MLA ranks, sliding-window pattern). Like :func:`write_gguf_model` it is not
    what llama.cpp's converter writes (no rope permutation, fused tensors stay fused).
    One tensor in memory at a time.

    ``llama_cpp=True`` writes what llama.cpp's converter changes in the weights and metadata
    the reference forward pass reads (:mod:`orkpack.model`), by the converter's rules
    (:mod:`orkpack.sources.converter`, the copy ``orkpack export`` uses too: q/k rows permuted,
    gemma's norm offsets as F32, the fused tensors the converter splits split, its own names),
    and the hyperparameters (epsilon, RoPE base and scaling, softcaps, multipliers, routing)
    under llama.cpp's keys.
    """
    import gguf

    from .sources import converter, model_facts, open_source
    from .sources.base import as_float32

    src = open_source(folder)
    try:
        f = model_facts(src)
        cfg = src.config
        fam = archs.FAMILIES[f["arch"]]
        extra, added = None, {}
        conv = converter.rules(fam, f) if llama_cpp else None
        if llama_cpp:
            from .model.hparams import from_config, rope_factors, to_gguf

            hp = from_config(cfg)
            extra = to_gguf(hp)
            if rope_factors(hp) is not None and not any(t.name == "rope_freqs.weight" for t in src.tensors()):
                # llama3 RoPE: llama.cpp's converter writes the factors as a tensor (gemma4's: the reader lists it)
                added["rope_freqs.weight"] = rope_factors(hp)
        w = gguf.GGUFWriter(Path(path), archs.gguf_arch_name(f["arch"]))
        _gguf_header(w, cfg, f, f"orkpack synthetic {f['arch']}", extra)
        gt = {np.dtype(np.float32): gguf.GGMLQuantizationType.F32, np.dtype(np.float16): gguf.GGMLQuantizationType.F16,
              np.dtype(np.uint16): gguf.GGMLQuantizationType.BF16}
        infos = [t for t in src.tensors() if t.dtype not in ("BOOL", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64")]
        split = (lambda t: conv.tensors(t.name, t.shape)) if llama_cpp else \
            (lambda t: [(t.name, t.shape, lambda a: a)])
        entries = []  # (GGUF name, shape, type, the array from the source tensor's)
        for t in infos:  # the type each tensor is read as, from its source dtype
            q = {"F16": np.float16, "BF16": np.uint16}.get(t.dtype, np.float32)
            if llama_cpp and conv.float32(t.name):
                q = np.float32
            for name, shape, part in split(t):
                entries.append((name, t.name, shape, gt[np.dtype(q)], part))
                item = np.dtype(q).itemsize
                w.add_tensor_info(name, shape, np.dtype(np.uint16) if q is np.uint16 else np.dtype(q),
                                  math.prod(shape) * item, raw_dtype=gt[np.dtype(q)] if q is np.uint16 else None)
        for name, a in added.items():
            w.add_tensor_info(name, a.shape, np.dtype(np.float32), a.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name, src_name, _, k, part in entries:
            a = part(src.read(src_name))
            if k == gguf.GGMLQuantizationType.F32:
                a = as_float32(a)
            if gt[a.dtype] != k:
                raise ValueError(f"{name}: read as {a.dtype}, declared {k.name}")
            w.write_tensor_data(np.ascontiguousarray(a))
        for a in added.values():
            w.write_tensor_data(a)
        w.close()
    finally:
        src.close()
    return Path(path)


# ------------------------------------------------------------------------------ a tokenizer for fixtures

TOKENIZER_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_tokenizer(folder: Path, n_merges: int = 40) -> dict:
    """A byte-level BPE tokenizer.json (GPT-2 style, specials first as SmolLM's) + tokenizer_config.json in
    ``folder``: 3 + 256 + ``n_merges`` tokens, merges of random letter pairs (seeded); returns the tokenizer.json."""
    vocab = {t: i for i, t in enumerate(TOKENIZER_SPECIAL)}
    from .model.tokenizer import bytes_to_unicode

    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    merges = []
    rng = np.random.default_rng(7)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ"]
    while len(merges) < n_merges:
        a, b = rng.choice(letters), rng.choice(letters)
        if a + b not in vocab:
            merges.append(f"{a} {b}")
            vocab[a + b] = len(vocab)
    tok = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, t in enumerate(TOKENIZER_SPECIAL)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "add_bos_token": False, "chat_template": CHAT_TEMPLATE}))
    return tok
