"""The GGUF hyperparameter keys (``{arch}.*``), in one table: each key once, with where it comes from.

An entry (:class:`Key`) names one key by its suffix after ``{arch}.`` and says:

* ``type``: its GGUF type, as the pack's model record spells types (orkpack.pack.model);
* ``hf``: the config.json keys llama.cpp's converter reads it from for every family (its
  ``TextModel.set_gguf_parameters``; the first one present wins);
* ``family``: a family's own config.json keys (the converter's model class for that family), tried
  after the common ones (``hf``), for the families listed only;
* ``rope_scaling`` / ``kinds``: for ``rope.scaling.*``, the key inside config.json's ``rope_scaling``
  it comes from and the scaling types it is written for;
* ``default``: the value a reader takes when a GGUF lacks the key (None: none, or one the reader derives,
  e.g. ``rope.dimension_count`` is the head dim);
* ``llama_cpp``: False for the few keys that are orkpack's own (no llama.cpp reader: llama3's factors,
  YaRN truncation, SmolLM3's no-RoPE layers).

The order of :data:`KEYS` is the order :func:`orkpack.sources.modelkv.from_hf` writes them in.

Readers and writers: :func:`orkpack.sources.modelkv.from_hf` (config.json -> GGUF keys),
:func:`orkpack.model.hparams.from_gguf` (GGUF keys -> the forward pass's numbers) and
:func:`orkpack.model.hparams.to_gguf` (the numbers -> GGUF keys, for test GGUFs). Which keys are read
is said there; where a key lives and how it is spelled is said here only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

_DEEPSEEK = ("deepseek_v2", "deepseek_v3")
_GLM4_MOE = ("glm4_moe",)
_GRANITE = ("granite", "granitemoe", "granitemoehybrid")
_NEMOTRON = ("nemotron_h", "nemotron_h_moe")
_NEMOTRON_MOE = ("nemotron_h_moe",)
_GEMMA3 = ("gemma3_text", "gemma3")
_ERNIE_MOE = ("ernie4_5_moe",)
_SCALED = ("linear", "yarn", "longrope", "dynamic")  # rope_scaling types written with their factor


def _fam(*pairs: tuple[tuple[str, ...], tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """{family: its config keys} from (families, config keys) pairs."""
    return {f: keys for fams, keys in pairs for f in fams}


@dataclass(frozen=True)
class Key:
    name: str  # after "{arch}."
    type: str  # uint32 | float32 | bool | string | array[int32] | array[bool] | array[float32] (gemma3n)
    hf: tuple[str, ...] = ()  # config.json keys, every family, first present wins
    family: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)  # family -> its config keys
    rope_scaling: str = ""  # the config.json rope_scaling key it comes from
    kinds: tuple[str, ...] = ()  # the rope_scaling types it is written for
    default: Any = None  # a reader's value when the GGUF lacks it
    llama_cpp: bool = True  # a key of llama.cpp (gguf-py's Keys); False: orkpack's own

    def at(self, garch: str) -> str:
        """The full key of GGUF architecture ``garch``."""
        return f"{garch}.{self.name}"


# ---------------------------------------------------------------------------- llama.cpp's TextModel, every family
CONTEXT_LENGTH = Key("context_length", "uint32", ("max_position_embeddings", "n_ctx", "n_positions", "max_length",
                                                  "max_sequence_length"), default=4096,
                     family=_fam((("chatglm",), ("seq_length",))))  # ChatGLMModel: seq_length
EMBEDDING_LENGTH = Key("embedding_length", "uint32", ("hidden_size", "n_embd", "dim"))
FEED_FORWARD_LENGTH = Key("feed_forward_length", "uint32", ("intermediate_size", "n_inner", "ffn_hidden_size"))
BLOCK_COUNT = Key("block_count", "uint32", ("num_hidden_layers", "n_layer", "num_layers"))
HEAD_COUNT = Key("attention.head_count", "uint32", ("num_attention_heads", "n_head", "num_heads"))
HEAD_COUNT_KV = Key("attention.head_count_kv", "uint32", ("num_key_value_heads", "n_head_kv", "multi_query_group_num"))
ROPE_FREQ_BASE = Key("rope.freq_base", "float32", ("rope_theta", "rotary_emb_base"), default=10000.0)
RMS_EPS = Key("attention.layer_norm_rms_epsilon", "float32", ("rms_norm_eps",),
              family=_fam((("lfm2", "lfm2_moe"), ("norm_eps",)), (("chatglm",), ("layernorm_epsilon",))), default=1e-6)
# starcoder2's own norm_epsilon: tried again after the common spellings (one of them too)
LAYER_NORM_EPS = Key("attention.layer_norm_epsilon", "float32",
                     ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"),
                     family=_fam((("starcoder2",), ("norm_epsilon",)), (("rwkv7",), ("norm_eps",))), default=1e-6)
EXPERT_COUNT = Key("expert_count", "uint32", ("num_local_experts", "num_experts", "n_routed_experts"),
                   family=_fam((_ERNIE_MOE, ("moe_num_experts",))))
EXPERT_USED_COUNT = Key("expert_used_count", "uint32",
                        ("num_experts_per_tok", "num_experts_per_token", "top_k_experts"),
                        family=_fam((_ERNIE_MOE, ("moe_k",))))
KEY_LENGTH = Key("attention.key_length", "uint32", ("head_dim",))
VALUE_LENGTH = Key("attention.value_length", "uint32", ("head_dim",))  # default: the key length
VOCAB_SIZE = Key("vocab_size", "uint32", ("vocab_size", "padded_vocab_size"))

# ---------------------------------------------------------------------------- a family's own (its converter class)
ATTN_SOFTCAP = Key("attn_logit_softcapping", "float32", family=_fam((("gemma2",), ("attn_logit_softcapping",))),
                   default=0.0)
FINAL_SOFTCAP = Key("final_logit_softcapping", "float32",
                    family=_fam((("gemma2", "gemma4_text", "gemma4", "gemma3n_text", "gemma3n"),
                                 ("final_logit_softcapping",))),
                    default=0.0)
SLIDING_WINDOW = Key("attention.sliding_window", "uint32",
                     family=_fam((("gemma2",) + _GEMMA3 + ("gpt_oss", "olmo2", "olmo3", "exaone4", "gemma4_text",
                                  "gemma4", "gemma3n_text", "gemma3n"), ("sliding_window",))),
                     default=0)
# one bool per layer, true for a sliding one (Olmo2Model; modelkv from archs' swa layers: Family.record_swa)
SLIDING_WINDOW_PATTERN = Key("attention.sliding_window_pattern", "array[bool]")
# olmo3 (TextModel): transformers 5's nested rope_parameters.sliding_attention (a dotted key: modelkv follows it)
ROPE_FREQ_BASE_SWA = Key("rope.freq_base_swa", "float32", family=_fam(
    (_GEMMA3, ("rope_local_base_freq",)),
    (("olmo2", "olmo3", "gemma3n_text", "gemma3n"), ("rope_parameters.sliding_attention.rope_theta",
                                                  "rope_local_base_freq"))))
EMBEDDING_SCALE = Key("embedding_scale", "float32",
                      family=_fam((_GRANITE, ("embedding_multiplier",)), (("minicpm",), ("scale_emb",))), default=1.0)
RESIDUAL_SCALE = Key("residual_scale", "float32", family=_fam((_GRANITE, ("residual_multiplier",))), default=1.0)
ATTENTION_SCALE = Key("attention.scale", "float32", family=_fam((_GRANITE, ("attention_multiplier",))))  # 1/sqrt(hd)
LOGIT_SCALE = Key("logit_scale", "float32", family=_fam((_GRANITE, ("logits_scaling",))), default=1.0)
LEADING_DENSE_BLOCK_COUNT = Key("leading_dense_block_count", "uint32",
                                family=_fam((_DEEPSEEK + _GLM4_MOE, ("first_k_dense_replace",)),
                                           (("lfm2_moe",), ("num_dense_layers",)),
                                           (_ERNIE_MOE, ("moe_layer_start_index",))))
INTERLEAVE_MOE_LAYER_STEP = Key("interleave_moe_layer_step", "uint32",
                                family=_fam((_ERNIE_MOE, ("moe_layer_interval",))))
Q_LORA_RANK = Key("attention.q_lora_rank", "uint32", family=_fam((_DEEPSEEK, ("q_lora_rank",))), default=0)
KV_LORA_RANK = Key("attention.kv_lora_rank", "uint32", family=_fam((_DEEPSEEK, ("kv_lora_rank",))), default=0)
EXPERT_FEED_FORWARD_LENGTH = Key("expert_feed_forward_length", "uint32", family=_fam(
    (("qwen2_moe", "qwen3_moe", "lfm2_moe", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next", "gemma4_text", "gemma4")
     + _DEEPSEEK + _NEMOTRON_MOE + _ERNIE_MOE + _GLM4_MOE,
     ("moe_intermediate_size",)),
    (("granitemoe", "gpt_oss"), ("intermediate_size",))))
EXPERT_SHARED_FEED_FORWARD_LENGTH = Key("expert_shared_feed_forward_length", "uint32",
                                        family=_fam((("qwen2_moe", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"),
                                                     ("shared_expert_intermediate_size",)),
                                                    (("granitemoehybrid",), ("shared_intermediate_size",)),
                                                    (_NEMOTRON_MOE, ("moe_shared_expert_intermediate_size",))))
EXPERT_SHARED_COUNT = Key("expert_shared_count", "uint32",
                          family=_fam((_DEEPSEEK + _NEMOTRON_MOE + _GLM4_MOE, ("n_shared_experts",)),
                                      (_ERNIE_MOE, ("moe_num_shared_experts",))))
EXPERT_WEIGHTS_SCALE = Key("expert_weights_scale", "float32",
                           family=_fam((_DEEPSEEK + _NEMOTRON_MOE + _GLM4_MOE, ("routed_scaling_factor",))),
                           default=1.0)
EXPERT_WEIGHTS_NORM = Key("expert_weights_norm", "bool",
                          family=_fam((_DEEPSEEK + _NEMOTRON_MOE + _GLM4_MOE, ("norm_topk_prob",))), default=False)
SHORTCONV_L_CACHE = Key("shortconv.l_cache", "uint32", family=_fam((("lfm2", "lfm2_moe"), ("conv_L_cache",))))
NEXTN_PREDICT_LAYERS = Key("nextn_predict_layers", "uint32",
                           family=_fam((("deepseek_v3",) + _GLM4_MOE, ("num_nextn_predict_layers",))))
# Gated DeltaNet (Qwen3NextModel.set_gguf_parameters): in llama.cpp's SSM terms
_DELTANET = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next")
# Mamba2 (GraniteHybridModel.set_gguf_parameters: conv kernel, state size, groups, heads as the time-step rank;
# d_inner = mamba_expand x hidden is derived: modelkv)
_MAMBA2 = ("granitemoehybrid", "falcon_h1")  # falcon_h1's are rewritten from the dims (modelkv)
# Nemotron-H (NemotronHModel, a GraniteHybridModel: the same keys from its own spellings; d_inner = heads x head dim)
SSM_CONV_KERNEL = Key("ssm.conv_kernel", "uint32", family=_fam((_DELTANET, ("linear_conv_kernel_dim",)),
                                                               (_MAMBA2, ("mamba_d_conv",)), (_NEMOTRON, ("conv_kernel",))))
SSM_STATE_SIZE = Key("ssm.state_size", "uint32", family=_fam((_DELTANET, ("linear_key_head_dim",)),
                                                             (_MAMBA2, ("mamba_d_state",)),
                                                             (_NEMOTRON, ("ssm_state_size",))))
SSM_GROUP_COUNT = Key("ssm.group_count", "uint32", family=_fam((_DELTANET, ("linear_num_key_heads",)),
                                                               (_MAMBA2, ("mamba_n_groups",)), (_NEMOTRON, ("n_groups",))))
SSM_TIME_STEP_RANK = Key("ssm.time_step_rank", "uint32", family=_fam((_DELTANET, ("linear_num_value_heads",)),
                                                                     (_MAMBA2, ("mamba_n_heads",)),
                                                                     (_NEMOTRON, ("mamba_num_heads",))))

# Llama 4's attention temperature (Ministral3Model: rope_parameters' llama_4_scaling_beta; a dotted key)
ATTN_TEMPERATURE_SCALE = Key("attention.temperature_scale", "float32",
                             family=_fam((("ministral3", "mistral3"), ("rope_parameters.llama_4_scaling_beta",))))

# ---------------------------------------------------------------------------- per layer (modelkv, for a hybrid: a family
# with archs ``blocks``): head_count_kv as one count per layer, 0 for the recurrent layers (llama.cpp's is_recr)
HEAD_COUNT_KV_PER_LAYER = "array[int32]"
# or (archs Blocks.record "recurrent_layers") one bool per layer, true for the recurrent ones, beside the interval
# RWKV7 (Rwkv7Model): the wkv head size, the LoRA ranks (null in a config: the converter's calc_lora_rank, which the
# family's record writes over them: archs Family.record)
_RWKV7 = ("rwkv7",)
WKV_HEAD_SIZE = Key("wkv.head_size", "uint32", family=_fam((_RWKV7, ("head_size", "head_dim"))))
DECAY_LORA_RANK = Key("attention.decay_lora_rank", "uint32",
                      family=_fam((_RWKV7, ("lora_rank_decay", "decay_low_rank_dim"))))
ICLR_LORA_RANK = Key("attention.iclr_lora_rank", "uint32", family=_fam((_RWKV7, ("lora_rank_iclr", "a_low_rank_dim"))))
VALUE_RESIDUAL_MIX_LORA_RANK = Key("attention.value_residual_mix_lora_rank", "uint32",
                                   family=_fam((_RWKV7, ("lora_rank_value_residual_mix", "v_low_rank_dim"))))
GATE_LORA_RANK = Key("attention.gate_lora_rank", "uint32", family=_fam((_RWKV7, ("lora_rank_gate", "gate_low_rank_dim"))))
RECURRENT_LAYERS = Key("attention.recurrent_layers", "array[bool]")
FULL_ATTENTION_INTERVAL = Key("full_attention_interval", "uint32", default=4)
SSM_INNER_SIZE = Key("ssm.inner_size", "uint32")  # value heads x value head dim (Qwen3.5), d_inner (Mamba2)
ROPE_DIMENSION_SECTIONS = Key("rope.dimension_sections", "array[int32]")  # Qwen3.5's MRoPE sections, 4 entries
# (_Qwen35MRopeMixin; Qwen3-Next's converter writes none)

# ---------------------------------------------------------------------------- derived (modelkv: head dim x partial
# rotary factor, MLA: qk_rope_head_dim; a reader's default: the head dim)
ROPE_DIMENSION_COUNT = Key("rope.dimension_count", "uint32")
# gemma4: the sliding layers' own head size and rotated dims, the KV-sharing layers, the per-layer embedding width
ROPE_DIMENSION_COUNT_SWA = Key("rope.dimension_count_swa", "uint32")
KEY_LENGTH_SWA = Key("attention.key_length_swa", "uint32")
VALUE_LENGTH_SWA = Key("attention.value_length_swa", "uint32")
SHARED_KV_LAYERS = Key("attention.shared_kv_layers", "uint32", default=0)
EMBEDDING_LENGTH_PER_LAYER = Key("embedding_length_per_layer_input", "uint32", default=0)
# gemma3n (Gemma3NModel): the AltUp streams and the active one, each layer's activation-sparsity std multiplier
# (the normal quantile of its activation_sparsity_pattern; -inf for none)
ALTUP_ACTIVE_IDX = Key("altup.active_idx", "uint32", default=0)
ALTUP_NUM_INPUTS = Key("altup.num_inputs", "uint32", default=4)
ACTIVATION_SPARSITY_SCALE = Key("activation_sparsity_scale", "array[float32]")

# ---------------------------------------------------------------------------- RoPE scaling (config.json rope_scaling)
ROPE_SCALING_TYPE = Key("rope.scaling.type", "string", kinds=_SCALED + ("llama3",), default="none")
ROPE_SCALING_FACTOR = Key("rope.scaling.factor", "float32", rope_scaling="factor", kinds=_SCALED + ("llama3",),
                          default=1.0)
# llama.cpp's converter turns llama3 scaling into a rope_freqs tensor; a pack keeps its parameters
ROPE_SCALING_LOW_FREQ_FACTOR = Key("rope.scaling.low_freq_factor", "float32", rope_scaling="low_freq_factor",
                                   kinds=("llama3",), llama_cpp=False)
ROPE_SCALING_HIGH_FREQ_FACTOR = Key("rope.scaling.high_freq_factor", "float32", rope_scaling="high_freq_factor",
                                    kinds=("llama3",), llama_cpp=False)
ROPE_SCALING_ORIG_CTX_LEN = Key("rope.scaling.original_context_length", "uint32",
                                rope_scaling="original_max_position_embeddings", kinds=_SCALED + ("llama3",))
ROPE_SCALING_YARN_BETA_FAST = Key("rope.scaling.yarn_beta_fast", "float32", rope_scaling="beta_fast", kinds=("yarn",))
ROPE_SCALING_YARN_BETA_SLOW = Key("rope.scaling.yarn_beta_slow", "float32", rope_scaling="beta_slow", kinds=("yarn",))
ROPE_SCALING_YARN_LOG_MUL = Key("rope.scaling.yarn_log_multiplier", "float32", rope_scaling="mscale_all_dim",
                                kinds=("yarn",))
ROPE_SCALING_ATTN_FACTOR = Key("rope.scaling.attn_factor", "float32")
ROPE_SCALING_YARN_TRUNCATE = Key("rope.scaling.yarn_truncate", "bool", llama_cpp=False)  # ggml always truncates
# llama.cpp's granite-hybrid reads it as its RoPE switch (default true): false for a NoPE model (modelkv)
ROPE_SCALING_FINETUNED = Key("rope.scaling.finetuned", "bool", default=True)

# ---------------------------------------------------------------------------- read or written from the numbers only
EXPERT_GATING_FUNC = Key("expert_gating_func", "uint32")  # 1 softmax, 2 sigmoid
# (llama.cpp's TextModel writes them from n_group / topk_group for any config that has them; listed for
# Nemotron-H and glm4_moe so far)
EXPERT_GROUP_COUNT = Key("expert_group_count", "uint32", family=_fam((_NEMOTRON + _GLM4_MOE, ("n_group",))),
                         default=1)
EXPERT_GROUP_USED_COUNT = Key("expert_group_used_count", "uint32", family=_fam((_NEMOTRON + _GLM4_MOE, ("topk_group",))),
                              default=1)
NO_ROPE_LAYERS = Key("no_rope_layers", "array[int32]", llama_cpp=False)  # 1 = RoPE (llama.cpp: every 4th has none)
CLAMP_KQV = Key("attention.clamp_kqv", "float32")
KEY_LENGTH_MLA = Key("attention.key_length_mla", "uint32")

# the table, in definition order (the order from_hf writes the keys in)
KEYS: tuple[Key, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Key))
BY_NAME: dict[str, Key] = {k.name: k for k in KEYS}
assert len(BY_NAME) == len(KEYS), "a GGUF key appears twice in orkpack.ggufkeys"
# from config.json as it is: every family's (hf), then the family's own (family); then rope_scaling's
FROM_CONFIG: tuple[Key, ...] = tuple(k for k in KEYS if k.hf or k.family)
ROPE_SCALING: tuple[Key, ...] = tuple(k for k in KEYS if k.rope_scaling)
