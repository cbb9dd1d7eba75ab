"""Architecture knowledge, in one place: one declarative :class:`Family` entry per model family.

An entry says, for one family of Hugging Face checkpoints:

* which ``model_type`` values it covers and which gguf-py architecture its
  tensors are named by (``gguf``; gguf-py's ``TensorNameMap`` does the HF ->
  GGUF renaming, ``renames`` add what that map lacks: fused tensors, prefixes);
* where its config.json keeps each fact (``keys``; :data:`COMMON_KEYS` holds
  the usual spellings) and the defaults of its transformers config class
  (``defaults``) for keys a real config.json leaves out;
* the tensors a checkpoint of it holds (``top`` and per-layer ``layer``
  templates, each a name, a shape over named dimensions, and a condition);
* its attention: ``gqa`` (K and V of ``kv_heads x head_dim`` per token and
  layer) or ``mla`` (the compressed latent, ``kv_lora_rank +
  qk_rope_head_dim``); which layers use a sliding window (``swa``) and which
  layers are MoE (``moe``);
* how its forward pass computes the logits (``forward``, a :class:`Forward`: norms
  and their placement, activation, RoPE style, QK norms, multipliers, MoE routing),
  read by the reference forward pass :mod:`orkpack.model`.

Adding a family is one entry here plus a fixture (``orkpack.synth.TINY``).
Everything else reads these tables: :func:`facts_from_config` (the facts a
plan needs), :func:`hf_tensors` (the exact tensor list of a checkpoint, from
its config alone), :func:`canonical_name` (HF name -> GGUF-style name),
:func:`facts_from_gguf` (the same facts from GGUF metadata).

Fused tensors stay fused (one matmul, one NPU call): phi3 ``qkv_proj`` and
``gate_up_proj``, internlm2 ``wqkv``, chatglm ``query_key_value`` and
``dense_h_to_4h``, gpt-oss and granitemoe expert ``gate_up`` (stacked
``blk.N.ffn_gate_up_exps.weight``). llama.cpp's converter splits some of them;
orkpack keeps the checkpoint's own matrices, except where a family's entry
declares the converter's split (:class:`Split`: Granite-4.0-H's ``input_linear``,
Qwen3-Next's ``in_proj_qkvz`` read as the converter's ``attn_qkv`` +
``attn_gate``), byte ranges of the stored tensor, no value changed.

Facts every source gives (:data:`FACT_KEYS`): arch, n_layers, hidden,
intermediate, heads, kv_heads, head_dim, vocab, n_experts, n_experts_used,
moe_intermediate, tie_word_embeddings, and the KV cache layout the runtime
(llama.cpp) allocates: attention (gqa, mla or unknown), kv_k and kv_v
(elements per token and layer for K and V), swa_window and swa_layers (the
layers whose cache holds only the last ``swa_window`` positions); and for hybrids (a family with
``blocks``) recurrent_layers (the layers whose block keeps a fixed-size state per sequence instead of a KV
cache: LFM2's short convolutions) and state (the float32 elements of that state per recurrent layer and
sequence, llama.cpp's ``n_embd_r() + n_embd_s()``), recurrent_flops (the float operations a token costs a recurrent
layer besides its matrices: the convolution, the scan or delta rule), parallel_layers (the recurrent layers that run
attention beside their recurrence, so hold a KV cache as well as the state: Falcon-H1's, every one; :func:`kv_layers`)
and ffn_layers (the layers that are an FFN alone, no mixer: no KV cache and no state; Nemotron-H's MLP and MoE
blocks); [], 0, 0, [] and [] for every other family; swa_kv_k and swa_kv_v (the sliding layers' K and V elements
per token when they differ from the other layers': Gemma 4's sliding and full layers have their own head sizes and
KV heads; 0: the same) and kv_shared_layers (the layers that store no K/V but reuse an earlier layer's: Gemma 4's
num_kv_shared_layers; llama.cpp allocates no cache for them); 0, 0 and [] for every other family.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, Mapping

from .errors import SourceError, escape_name


class _GgufNames:
    """What the name maps read of gguf-py: ``MODEL_ARCH``, ``MODEL_ARCH_NAMES``, ``MODEL_TENSORS``, ``TENSOR_NAMES``
    (gguf/constants.py) and ``get_tensor_name_map`` (gguf/tensor_mapping.py).

    ``import gguf`` runs the package's __init__, which also imports its reader, writer, quantizers, vocab and
    metadata modules (yaml among them), ~0.04 s that a plan from a config.json never uses (issue 26). Where gguf
    is not imported yet, the two modules are loaded alone, registered under their own names, so a later
    ``import gguf`` shares them (its __init__ imports them with ``from .constants import *``); the package then
    also gets them as attributes (``gguf.constants``), as an ordinary import gives it. Any surprise (another
    gguf layout) falls back to ``import gguf``."""

    def __getattr__(self, name: str):
        mods = _gguf_modules()
        for m in mods:
            if hasattr(m, name):
                value = getattr(m, name)
                setattr(self, name, value)
                return value
        raise AttributeError(name)


@lru_cache(maxsize=1)
def _gguf_modules() -> tuple:
    full = sys.modules.get("gguf")
    if full is None:
        try:
            return _gguf_alone()
        except Exception:
            pass
    import gguf

    return (gguf,)


def _gguf_alone() -> tuple:
    import importlib.abc
    import importlib.util

    spec = importlib.util.find_spec("gguf")  # the package's spec; its __init__ is not run
    folder = spec.submodule_search_locations[0]
    loaded = []
    for sub in ("constants", "tensor_mapping"):  # tensor_mapping imports from .constants: found registered
        name = f"gguf.{sub}"
        if name in sys.modules:
            loaded.append(sys.modules[name])
            continue
        sub_spec = importlib.util.spec_from_file_location(name, f"{folder}/{sub}.py")
        mod = importlib.util.module_from_spec(sub_spec)
        sys.modules[name] = mod
        try:
            sub_spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[name]
            raise
        loaded.append(mod)

    class Parent(importlib.abc.MetaPathFinder):
        """At the later ``import gguf``: the package as ever, with the two modules as its attributes."""

        def find_spec(self, fullname, path=None, target=None):
            if fullname != "gguf":
                return None
            sys.meta_path.remove(self)
            pkg = importlib.util.find_spec("gguf")
            if pkg is None or pkg.loader is None or not hasattr(pkg.loader, "exec_module"):
                return pkg
            real = pkg.loader

            class Loader(importlib.abc.Loader):
                def create_module(self, spec):
                    return real.create_module(spec)

                def exec_module(self, module):
                    for sub in ("constants", "tensor_mapping"):
                        if f"gguf.{sub}" in sys.modules:
                            setattr(module, sub, sys.modules[f"gguf.{sub}"])
                    real.exec_module(module)

                def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
                    return getattr(real, name)

            pkg.loader = Loader()
            return pkg

    sys.meta_path.insert(0, Parent())
    mods = tuple(loaded)
    if not all(hasattr(mods[0], n) for n in ("MODEL_ARCH", "MODEL_ARCH_NAMES", "MODEL_TENSORS", "TENSOR_NAMES")) \
            or not hasattr(mods[1], "get_tensor_name_map"):
        raise ImportError("gguf layout")
    return mods


gguf = _GgufNames()

FACT_KEYS = (
    "arch", "n_layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab",
    "n_experts", "n_experts_used", "moe_intermediate", "tie_word_embeddings",
    "attention", "kv_k", "kv_v", "swa_window", "swa_layers", "recurrent_layers", "state", "recurrent_flops",
    "parallel_layers", "ffn_layers", "swa_kv_k", "swa_kv_v", "kv_shared_layers",
)

# Sanity caps (a hostile config must not make a plan enumerate billions of items): far above any real model.
# A matrix side (hidden, intermediate, heads x head_dim, LoRA ranks): the widest real ones are 18432 (hidden) and
# 73728 (intermediate). The plan's cost model walks K in NPU segments, so this cap also keeps a plan quick.
MAX_WIDTH = 1 << 18
CAPS = {"n_layers": 4096, "n_experts": 65536, "n_nextn": 16, **{f: MAX_WIDTH for f in (
    "hidden", "intermediate", "head_dim", "moe_intermediate", "shared_intermediate", "q_lora_rank", "kv_lora_rank",
    "qk_nope", "qk_rope", "v_head_dim")}}
CAP_DEFAULT = 1 << 24
# layers x experts: Kimi K2 has 61 x 384 = 23424; a config at the cap plans in ~10 s on a 2-core box
MAX_EXPERT_SLICES = 1 << 16
MAX_TENSORS = 1 << 21  # tensors a config may describe (DeepSeek-V3: ~92k with per-expert names)

# where a config.json keeps each fact; a family's ``keys`` replace single entries
COMMON_KEYS: dict[str, tuple[str, ...]] = {
    "n_layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "intermediate": ("intermediate_size",),
    "heads": ("num_attention_heads",),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "vocab": ("vocab_size",),
    "n_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "n_experts_used": ("num_experts_per_tok",),
    "moe_intermediate": ("moe_intermediate_size",),
    "shared_intermediate": ("shared_expert_intermediate_size",),
    "n_shared": ("n_shared_experts",),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_nope": ("qk_nope_head_dim",),
    "qk_rope": ("qk_rope_head_dim",),
    "v_head_dim": ("v_head_dim",),
    "first_dense": ("first_k_dense_replace",),
    "moe_freq": ("moe_layer_freq",),
    "sparse_step": ("decoder_sparse_step",),
    "n_nextn": ("num_nextn_predict_layers",),
    "sliding_window": ("sliding_window",),
    "swa_pattern": ("sliding_window_pattern",),
}
# facts a family must have (others default to 0 / derived)
REQUIRED = ("n_layers", "hidden", "heads", "vocab")


@dataclass(frozen=True)
class T:
    """One tensor template: HF name (``{i}``: layer), shape over named dimensions, condition.

    Shape entries are ints or expressions over dims: ``"nh*hd"``, ``"2*I"``, ``"kvlr+rope"``.
    ``when``: the names of layer/model flags that must all hold (``!flag``: must not).
    ``experts``: one HF tensor per expert (``{e}`` in the name), stacked on read.
    ``each``: a dim: one HF tensor per k in 0..each-1 (``{k}`` in the name), which the converter stacks into one
    tensor (a ``Family.stack`` entry with ``hf``; gemma3n's altup_projections.{k}).
    """
    name: str
    shape: tuple
    when: tuple[str, ...] = ()
    experts: bool = False
    kind: str = "w"  # w (matrix), norm, bias: what synthetic values look like
    each: str = ""


def t(name: str, *shape, when: str = "", experts: bool = False, kind: str | None = None, each: str = "") -> T:
    if kind is None:
        kind = "bias" if name.endswith(".bias") or name.endswith("_bias") else ("norm" if len(shape) == 1 else "w")
    return T(name, tuple(shape), tuple(w for w in when.split() if w), experts, kind, each)


@dataclass(frozen=True)
class Smooth:
    """One place where activation smoothing (SmoothQuant, arXiv 2211.10438; ``build --imatrix``, orkpack/transforms/smooth.py)
    may fold a per-input-channel scale s into a layer's weights, leaving the model unchanged in exact arithmetic:
    the ``matrices`` (GGUF names inside a layer) take s on their input columns, and their input's producer, the
    carrier, is divided by it: a norm's gain (and bias), ``norm``; or a matrix's output rows (and bias), ``rows``,
    when its output reaches the matrices through something linear in it (a gated FFN's up projection:
    down(act(gate) * up)); ``half``: only the second half of those rows (a fused gate_up: the up half).
    ``needs``: the layer must hold these; ``blockers``: when it holds any of these, the carrier feeds them too
    (an MoE router, experts, a shared expert) and the group is left alone."""
    matrices: tuple[str, ...]
    norm: str = ""
    rows: str = ""
    half: bool = False
    needs: tuple[str, ...] = ()
    blockers: tuple[str, ...] = ()


# the groups of a pre-norm decoder layer (names as GGUF). The attention norm feeds q/k/v (or the fused qkv, or
# MLA's first projections); the FFN norm feeds gate/up (or the fused gate_up) of a dense FFN; a gated FFN's up
# projection feeds down. An MoE FFN's router must see unchanged inputs, so a layer with a router (or experts)
# keeps its FFN as it is
_MOE = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_up_shexp")
SMOOTH_ATTN = Smooth(("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_q_a", "attn_kv_a_mqa"), norm="attn_norm")
SMOOTH_FFN = Smooth(("ffn_gate", "ffn_up", "ffn_gate_up"), norm="ffn_norm", blockers=_MOE)
SMOOTH_DOWN = Smooth(("ffn_down",), rows="ffn_up", needs=("ffn_gate",), blockers=_MOE)
SMOOTH_DOWN_FUSED = Smooth(("ffn_down",), rows="ffn_up", half=True, blockers=_MOE + ("ffn_gate",))  # Forward.mlp fused
SMOOTH_GATED = (SMOOTH_ATTN, SMOOTH_FFN, SMOOTH_DOWN)
SMOOTH_FUSED = (SMOOTH_ATTN, SMOOTH_FFN, SMOOTH_DOWN_FUSED)


@dataclass(frozen=True)
class Rotate:
    """Where a rotation of the residual stream (QuaRot, arXiv 2404.00456; ``build --rotate``,
    orkpack/transforms/rotate.py) may be folded into a decoder's weights: the names (GGUF, inside a layer) of the
    matrices that read a pre-norm's output (``mixer_reads``: the attention norm's, or a recurrent mixer's;
    ``ffn_reads``: the FFN norm's, or the layer's one norm in a layer that is an FFN alone), of those whose output
    is added to the stream (``writes``; their biases too), and of the tensors that neither read nor write it
    (``inside``: q/k norms, MLA's inner projections, convolutions, state parameters, a reader's bias). A layer
    tensor in none of them is not understood, and the model is refused rather than rotated wrongly. Whether the
    family's graph allows a rotation at all (pre-norm blocks, RMSNorm) is read from its Forward
    (``block``, ``norm``); ``None``: never rotated."""
    mixer_reads: tuple[str, ...]
    ffn_reads: tuple[str, ...]
    writes: tuple[str, ...]
    inside: tuple[str, ...]


ROTATE_DECODER = Rotate(
    mixer_reads=("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_q_a", "attn_kv_a_mqa", "attn_gate", "ssm_in",
                 "ssm_beta", "ssm_alpha", "ssm_ba", "shortconv.in_proj"),
    ffn_reads=("ffn_gate", "ffn_up", "ffn_gate_up", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps",
               "ffn_gate_shexp", "ffn_up_shexp", "ffn_gate_inp_shexp"),
    writes=("attn_output", "ffn_down", "ffn_down_exps", "ffn_down_shexp", "ssm_out", "shortconv.out_proj"),
    inside=("attn_q_norm", "attn_k_norm", "attn_q_a_norm", "attn_kv_a_norm", "attn_q_b", "attn_kv_b", "attn_sinks",
            "exp_probs_b", "shortconv.conv", "ssm_a", "ssm_d", "ssm_dt", "ssm_conv1d", "ssm_norm"),
)


@dataclass(frozen=True)
class Forward:
    """How a family computes its logits: what :mod:`orkpack.model` reads (the Hugging Face layout).

    Numbers (epsilons, RoPE bases, softcaps, multipliers) come from the config or the GGUF metadata
    (:mod:`orkpack.model.hparams`); this says which of them apply and how the blocks are wired.
    A family without one (``Family.forward is None``) is not evaluable yet: the forward pass refuses it.
    """
    norm: str = "rms"  # rms | layer (LayerNorm; adds the stored bias when there is one)
    norm_offset: float = 0.0  # gemma: the gain is (offset + w); llama.cpp's converter stores w + offset
    block: str = "pre"  # pre: x + f(norm(x)) | sandwich: x + post_norm(f(norm(x))) (gemma2/3, glm4)
    # | post: x + post_norm(f(x)), no norm before (olmo2/3: post_attention_norm, post_ffw_norm)
    act: str = "silu"  # silu | gelu_tanh | gelu (exact): the activation when the config names none
    # | swiglu_oai (gpt-oss: gate clamped <= limit, up to +-limit, gate * sigmoid(alpha * gate) * (up + 1))
    act_key: str = "hidden_act"  # the config key naming it (gemma: hidden_activation; its hidden_act is ignored)
    qkv: str = "blocks"  # a fused attn_qkv: blocks (all q rows, all k, all v) | grouped (per KV head: its q heads,
    # k, v: internlm2's wqkv; llama.cpp's converter splits it into attn_q/k/v)
    mlp: str = "gated"  # gated: down(act(gate) * up) | fused: ffn_up holds gate then up rows | plain: down(act(up))
    # | interleaved: the fused gate_up holds gate and up rows alternately (gpt-oss)
    ffn_norm: str = "ffn_norm"  # the pre-FFN norm's GGUF name (gpt-oss: post_attention_norm)
    rope: str = "neox"  # neox (rotate the halves of each head) | interleaved (rotate pairs (2i, 2i+1))
    rope_ratio: bool = False  # chatglm: the RoPE base is 10000 x the config's rope_ratio (default 1)
    rope_layers: str = "all"  # all | no_rope_layers (smollm3: the config's per-layer list, 1 = RoPE) | none (NoPE:
    # Nemotron-H's attention has no positions but the Mamba2 layers')
    # | swa (exaone4: RoPE on the sliding-window layers only when there are any, the full ones NoPE; else every layer)
    rope_switch: str = ""  # a config key whose value "rope" turns RoPE on, anything else (None, "nope") off
    # (granitemoehybrid: position_embedding_type); from a GGUF rope.scaling.finetuned (llama.cpp's granite-hybrid
    # switch, default true)
    qk_norm: str = ""  # "" | head (RMS over head_dim, one gain for every head) | full (RMS over all heads)
    qk_norm_after_rope: bool = False  # hunyuan_v1_dense: q and k normed after RoPE, not before
    window: str = "facts"  # facts: the layers archs lists (swa_layers) | config: sliding_window on every layer
    swa_rope_base: float = 0.0  # gemma3: sliding layers use their own RoPE base (this default), never scaled
    swa_rope_unscaled: bool = False  # olmo3: sliding layers use their own RoPE (rope_parameters' sliding_attention;
    # a GGUF's rope.freq_base_swa), by default the full layers' base, never scaled (llama.cpp's olmo2 with SWA)
    embed_scale: str = ""  # "" | sqrt_hidden (gemma) | a config key (granite embedding_multiplier, minicpm scale_emb)
    residual_scale: str = ""  # "" | a config key (granite residual_multiplier) | depth (scale_depth / sqrt(L))
    attn_scale: str = ""  # "" (head_dim^-0.5) | a config key (granite attention_multiplier) | qpas (gemma2/3)
    # | unit (1: gemma4, whose q and k are RMS-normed)
    v_norm: bool = False  # gemma4: V RMS-normed per head, without a gain
    moe_beside_mlp: bool = False  # gemma4 (enable_moe_block): the dense MLP and the experts side by side on the same
    # input, each with its own norms (ffn_norm -> MLP -> post_ffw_norm_1; pre_ffw_norm_2 -> experts -> post_ffw_norm_2),
    # summed; the router reads the input RMS-normed without a gain, times ffn_gate_inp.scale / sqrt(hidden); each
    # chosen expert's weight times its ffn_down_exps.scale
    per_layer_input: bool = False  # gemma4: per-layer embeddings (per_layer_token_embd looked up, plus the projection
    # of the embeddings, per_layer_model_proj, normed per layer) gate each layer's output: x + post_norm(proj(act(
    # inp_gate(x)) * pli_i)); then each layer's output times its layer_output_scale
    altup: bool = False  # gemma3n: AltUp. The embeddings become altup_num_inputs streams (stream 0 the embeddings,
    # stream k altup_proj[k - 1] of them at their RMS); each layer predicts every stream from all (a router on the
    # active stream: tanh(altup_router(altup_router_norm(x) / hidden)) -> altup_predict_coef), runs on the active
    # prediction, corrects every stream by its innovation (altup_correct_coef + 1); the per-layer input gates the
    # corrected active stream (times altup_correct_scale) back into the other streams; the streams' mean (each
    # but 0 through altup_unembd_proj at stream 0's RMS) goes to the output norm
    laurel: bool = False  # gemma3n: LAuReL, beside the attention: h + laurel_post_norm(laurel_r(laurel_l(h))) on the
    # normed input h, added to the attention's residual output and the sum times 2^-1/2
    act_sparsity: bool = False  # gemma3n: a layer's MLP gate cut at its mean + std x the normal quantile of its
    # activation_sparsity_pattern (relu(gate - cutoff); llama.cpp's activation_sparsity_scale) before the activation
    logit_scale: str = ""  # "" | a config key the logits are divided by (granite logits_scaling) | dim_base (minicpm)
    gguf_fixed: tuple[tuple[str, float], ...] = ()  # (config key, value): the numbers llama.cpp's graph of the
    # family holds as constants, for a GGUF without the scale keys (minicpm3.cpp: scale_emb 12, scale_depth 1.4,
    # dim_model_base 256, MiniCPM3-4B's; MiniCPM3Model writes none of them)
    router: str = "softmax"  # MoE gate scores: softmax | sigmoid (deepseek-v3 noaux_tc)
    router_norm: str = "config"  # always (mixtral, granitemoe) | config (norm_topk_prob, default false)
    router_norm_gguf: str = "key"  # a GGUF's: key (expert_weights_norm) | always (lfm2_moe: the converter writes no
    # expert_weights_norm and llama.cpp always normalises)
    router_eps: float = 1e-20  # added to the chosen sigmoid weights' sum before normalising (transformers'
    # deepseek-v3: 1e-20; lfm2_moe: 1e-6)
    router_groups: str = ""  # deepseek: experts chosen in the best topk_group of n_group groups, a group scored by its
    # max (v2, topk_method group_limited_greedy) | top2sum (v3: the sum of its two best bias-corrected scores)
    router_scale: bool = False  # deepseek: routed_scaling_factor multiplies the routed experts' sum
    shared_gate: bool = False  # qwen2_moe: a sigmoid gate (ffn_gate_inp_shexp) on the shared expert
    gguf_permuted_qk: bool = False  # llama.cpp's converter permutes q/k rows: the GGUF rotates pairs
    attn_temp: bool = False  # ministral3 (Llama 4's attention temperature): q times 1 + beta log(1 + floor(pos / n)),
    # beta rope_parameters.llama_4_scaling_beta, n its original_max_position_embeddings (GGUF attention.temperature_scale,
    # rope.scaling.original_context_length)
    yarn_log_mul: bool = False  # a GGUF's rope.scaling.yarn_log_multiplier m is llama.cpp's YaRN attention factor
    # mscale(1) / mscale(m) (llama_context; ministral3's converter writes mscale_all_dim there); without: refused
    attn_gate: bool = False  # Qwen3.5 / Qwen3-Next: attn_q holds per head [q | gate]; the attention output is
    # multiplied by sigmoid(gate) before attn_output
    vheads: str = "tiled"  # a Gated DeltaNet's value heads as the converter lays them out: tiled (Qwen3.5's
    # _LinearAttentionVReorderBase: value head h reads key head h % ng) | grouped (Qwen3-Next, HF's order: h // (nv/ng))
    beta_alpha: str = "split"  # split: ssm_beta and ssm_alpha | fused: one ssm_ba, per key head [beta of its value
    # heads | alpha of them] (Qwen3-Next's in_proj_ba, which the converter keeps as it is)
    refuse: tuple[tuple[str, str], ...] = ()  # (config key, what is missing) when that key is set and truthy
    smooth: tuple[Smooth, ...] = SMOOTH_GATED  # where activation smoothing may fold its scales
    rotate: Rotate | None = ROTATE_DECODER  # where a rotation of the residual stream may be folded (build --rotate)
    output_norm: str = "output_norm"  # the final norm's GGUF name (lfm2: token_embd_norm, applied after the layers)
    embed_norm: str = ""  # a norm on the embeddings before the first layer (rwkv7: token_embd_norm, layer 0's pre-norm)
    ffn: str = "mlp"  # the FFN block: mlp (the MLP / experts above) | channel_mix (rwkv7's token-shift lerp into a
    # squared-ReLU key and a value: orkpack/model/rwkv7.py)


@dataclass(frozen=True)
class Blocks:
    """A hybrid's layer pattern: each layer's block type, read from the config.

    The block type of layer i is a template flag (``when="attn"``, ``when="shortconv"``) and names the
    mixer the forward pass runs (orkpack.model.forward): ``attn`` is attention, every other block is
    recurrent (no KV cache; a state of ``state`` float32 elements per sequence, whatever the context).
    A block type naming several mixers joined by ``+`` (``attn+mamba2``: Falcon-H1) runs them in parallel on the
    same normed input and sums their outputs (:func:`mixers`); with ``attn`` among them the layer is recurrent and
    holds a KV cache too (facts ``parallel_layers``).
    """
    key: str  # the config key listing one type per layer (transformers' layer_types)
    names: Mapping[str, str]  # config value -> block type ("conv" -> "shortconv", "full_attention" -> "attn")
    indices: str = ""  # a config key listing the attention layers, read when ``key`` is absent (full_attn_idxs)
    default: str = "attn"  # every layer's type when the config gives neither (Lfm2Config: all attention)
    interval: str = ""  # a config key: every n-th layer is attention, the others recurrent (full_attention_interval)
    interval_default: int = 0  # its value when the config gives none of the keys (Qwen3_5TextConfig: 4)
    record: str = "kv_heads"  # how the converter's GGUF names the recurrent layers: kv_heads (a per-layer
    # head_count_kv, 0 for recurrent layers: LFM2) | kv_heads_ffn (per-layer head_count_kv and feed_forward_length:
    # neither is a recurrent layer, an FFN length alone an FFN layer: Nemotron-H, llama.cpp's is_recr) |
    # recurrent_layers (one bool per layer, attention.recurrent_layers, beside full_attention_interval: Qwen3.5 /
    # Qwen3-Next) | all (every layer is of the one type ``default``, the GGUF says nothing per layer: Falcon-H1)
    state: str = "0"  # float32 state elements per recurrent layer and sequence (an expression over the dims)
    gguf_dims: tuple[tuple[str, str], ...] = ()  # (dim, GGUF key after "{arch}.") the state needs from a GGUF
    flops: str = "0"  # float ops a token costs a recurrent layer besides its matrices (an expression over the dims;
    # the planner's prefill term, docs/TIERMAP.md): its convolution and its recurrence
    pattern: str = ""  # a config key holding one letter per layer (Nemotron-H's hybrid_override_pattern "M-M*-"),
    # read when ``key`` is absent; ``names`` maps its letters too. It and ``key`` give the layer count when the config
    # has none (transformers 5 derives num_hidden_layers from the list and saves none)
    parts: Mapping[str, str] = field(default_factory=dict)  # block type -> "mixer" | "ffn": a layer that is that one
    # block alone, with its own pre-norm (attn_norm) and residual (Nemotron-H: mamba2 / attn mixers, mlp / moe FFNs);
    # a block type not listed is a mixer followed by the FFN, each with its norm and residual (every other hybrid)


ATTN = "attn"  # the block type of an attention layer


def mixers(block: str) -> tuple[str, ...]:
    """The mixers a block type runs in parallel (their outputs summed): ``attn+mamba2`` -> (attn, mamba2)."""
    return tuple(block.split("+"))


def kv_layers(facts: Mapping[str, Any]) -> list[int]:
    """The layers with a KV cache: every layer but the recurrent ones and the FFN-only ones (``ffn_layers``:
    Nemotron-H's MLP / MoE blocks), and the recurrent ones that run attention beside their recurrence
    (``parallel_layers``: Falcon-H1's)."""
    rec, par = set(facts.get("recurrent_layers") or ()), set(facts.get("parallel_layers") or ())
    ffn = set(facts.get("ffn_layers") or ())
    return [i for i in range(int(facts.get("n_layers") or 0)) if (i not in rec or i in par) and i not in ffn]


@dataclass(frozen=True)
class Convert:
    """One value change llama.cpp's converter makes to a family's tensors, which an HF reader makes too, so that a
    folder reads tensor for tensor as the converter's GGUF (orkpack/sources/convlayout.py applies them):

    * ``neg_exp``: ``-exp(x)`` (Mamba2 / Gated DeltaNet ``A_log`` -> ``ssm_a``), stored float32;
    * ``scale``: multiplied by the config numbers ``factors`` in turn (each a config key, or ``key[i]`` for an entry
      of a list; each product rounded to float32 as the converter's torch multiplies round it), on the rows
      ``rows`` = (first, end) of axis 0 (expressions over the dims; all rows when empty); stored back in the
      tensor's own dtype (Falcon-H1's muP multipliers, folded into the weights by its converter);
    * ``vheads``: value heads from grouped order (``groups`` K heads, each followed by its ``per`` V heads) to tiled
      order (V head r of every K head, then r + 1: what ggml's broadcast expects) along ``axis``, on the part of
      that axis after the first ``skip`` entries, in heads of ``head`` entries (the converter's
      ``_LinearAttentionVReorderBase``). Identity when ``per`` is 1.

    ``glob``: canonical names; ``groups``, ``per``, ``head``, ``skip``: expressions over the family's dims."""
    glob: str
    op: str  # neg_exp | scale | vheads
    axis: int = 0
    skip: str = "0"
    head: str = "1"
    groups: str = "1"
    per: str = "1"
    factors: tuple[str, ...] = ()  # scale: config numbers (key or key[i])
    rows: tuple[str, str] | tuple = ()  # scale: (first, end) rows of axis 0; () all


@dataclass(frozen=True)
class Split:
    """One checkpoint tensor llama.cpp's converter writes as ``len(parts)`` tensors of equal size along ``axis`` (numpy
    order of the checkpoint's shape), named by replacing ``old`` in its canonical name with each part in turn; one
    part is a rename. ``when``: model-level flags that must hold (``!flag``: must not), as the templates' ``when``.
    The parts are byte ranges of the stored tensor (orkpack/sources/safetensors.py reads them as such), so a split
    changes no value. Granite-4.0-H: the fused gate/up ``input_linear`` of the experts and of the shared MLP.

    A grouped split (``groups`` set): the axis holds ``groups`` groups, each the ``blocks`` in turn (sizes: expressions
    over the dims); part ``k`` gathers blocks ``picks[k]`` of every group, block by block (each block of group 0, then
    of group 1, ...; then the next block). Qwen3-Next's ``in_proj_qkvz``: per key head [q, k, v, z] -> ``attn_qkv``
    (every head's q, then every k, then every v) and ``attn_gate`` (every z), as Qwen3NextModel.modify_tensors cuts it."""
    glob: str  # canonical name (after ``renames``)
    old: str
    parts: tuple[str, ...]
    axis: int = 0
    when: tuple[str, ...] = ()
    groups: str = ""
    blocks: tuple[str, ...] = ()
    picks: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class Stack:
    """Checkpoint tensors llama.cpp's converter writes as one, stacked along a new first axis; each piece a whole
    stored tensor (the same dtype and shape), so the stack is their bytes in turn and changes no value. ``glob`` is
    the stacked tensor's canonical name (a glob over layers). The pieces are named one of two ways:

    * ``old`` and ``parts``: the stacked name with ``old`` replaced by each part is a piece's canonical name, in the
      order of ``parts`` (RWKV7's token-shift mixes ``x_r, x_w, x_k, x_v, x_a, x_g`` (1, 1, H) ->
      ``time_mix_lerp_fused`` (6, 1, 1, H); Rwkv7Model.modify_tensors);
    * ``hf``: a regex on the HF name (after the family's ``renames``) whose one group is the piece's index k, as
      many pieces as the checkpoint holds, slice k the one of index k (gemma3n's
      ``model.altup_projections.{k}.weight`` -> ``altup_proj.weight``); the readers stack them on read, as experts.
    """
    glob: str
    old: str = ""
    parts: tuple[str, ...] = ()
    hf: str = ""


@dataclass(frozen=True)
class Family:
    name: str  # our id: the HF model_type
    gguf: str  # gguf-py MODEL_ARCH member whose TensorNameMap names the tensors
    layer: tuple[T, ...]
    top: tuple[T, ...]
    model_types: tuple[str, ...] = ()  # other HF model_type spellings
    gguf_names: tuple[str, ...] = ()  # GGUF general.architecture values read as this family (default: gguf's name)
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    renames: tuple[tuple[str, str], ...] = ()  # (regex on the HF name, replacement), before the gguf map
    attention: str = "gqa"  # gqa | mla
    swa: str | None = None  # None | "all" | "even" (every other, from layer 0) | "pattern" (gemma3) | "layer_types"
    moe: str = "all"  # which layers are MoE when n_experts > 0: all | qwen (sparse step, mlp_only_layers) | deepseek
    # | interval (ernie4_5_moe: every moe_freq-th from first_dense to the dims' moe_last)
    text_config: bool = False  # facts live in config["text_config"] (multimodal wrappers)
    classes: tuple[str, ...] = ()  # HF ``architectures`` class names, for configs without a model_type
    head_stored_when_tied: bool = False  # the release stores lm_head.weight even with tied embeddings
    flags: Callable[[dict, dict], dict] | None = None  # extra model-level flags from (config, dims)
    forward: Forward | None = None  # the reference forward pass (orkpack.model); None: not evaluable yet
    blocks: Blocks | None = None  # a hybrid's per-layer block types (None: every layer is attention)
    more_dims: Callable[[Mapping, dict, str], dict] | None = None  # (config, dims, where) -> dims it adds/overrides
    conv_kernels: tuple[str, ...] = ()  # canonical-name globs of convolution kernels (always float: keepfloat.py)
    squeeze: tuple[tuple[str, int], ...] = ()  # (canonical glob, axis): a size-1 HF axis the converter drops
    convert: tuple["Convert", ...] = ()  # value changes llama.cpp's converter makes (orkpack/sources/convlayout.py)
    split: tuple[Split, ...] = ()  # checkpoint tensors the converter cuts into several (or renames): :class:`Split`
    reshape: tuple[tuple[str, tuple], ...] = ()  # (canonical glob, shape over dims): the converter's reshape of the
    # same elements (Mamba2's A and D (H,) -> (H, 1); its grouped norm (D,) -> (G, D / G))
    record_swa: bool = False  # the record holds attention.sliding_window_pattern, one bool per layer (true:
    # sliding), whenever the config has sliding_window (Olmo2Model writes it; for Gemma 3 llama.cpp reads it)
    record: tuple[tuple[str, str, str], ...] = ()  # (GGUF key after "{arch}.", expression over the dims, model
    # flags that must hold): a value the converter writes from its own arithmetic (modelkv; :func:`record_values`)
    nextn: bool = False  # the releases hold num_nextn_predict_layers multi-token-prediction layers after the decoder
    # layers (model.layers.{L + j}; templates ``when="nextn"``): DeepSeek-V3, GLM-4.5
    skip: tuple[tuple[str, str], ...] = ()  # (regex on the HF name, why): tensors a build leaves out, by name
    # (a multimodal release's vision tower, which llama.cpp's converter writes to a separate mmproj GGUF)
    variant: Callable[[Mapping], str | None] | None = None  # config -> the entry it reads as instead, or None
    # (nemotron_h: nemotron_h_moe when its layer pattern holds MoE blocks, as llama.cpp has two GGUF architectures)
    layer_flags: Callable[[Mapping, dict, int], dict] | None = None  # (text config, dims, layer) -> that layer's
    # template flags (gemma4: its attention type, whether it stores its own K/V)
    lookups: tuple[str, ...] = ()  # canonical names of embedding tables besides token_embd (gemma4's per-layer
    # embeddings): row lookups, never matmuls (manifest role "lookup": never an NPU item; decode reads one row)
    kv_shared: str = ""  # a dim: the last that many layers reuse earlier layers' K/V and store none (gemma4)
    generated: tuple[tuple[str, Callable[[Mapping, dict], Any]], ...] = ()  # (canonical name, (text config, dims)
    # -> float32 array or None): tensors llama.cpp's converter computes from the config (generate_extra_tensors),
    # which an HF reader lists too (gemma4's rope_freqs.weight: the full layers' proportional RoPE)
    ffn_widths: bool = False  # intermediate_size may be a list, one FFN width per layer (gemma3n); the facts'
    # intermediate is the widest, each layer's tensors its own (dims ``I_layers``)
    stack: tuple[Stack, ...] = ()  # checkpoint tensors the converter writes as one stacked tensor (:class:`Stack`:
    # named canonical parts, or indexed HF tensors)
    copies: tuple[tuple[str, str], ...] = ()  # (canonical name, canonical name of its source): a tensor the converter
    # writes a second time under another name (RWKV7's layer-0 time_mix_v0/v1/v2, copies of a0/a1/a2 that llama.cpp
    # loads and never uses), which an HF reader lists too, the same stored bytes

# --------------------------------------------------------------------------------------- shared templates

def _llama_top(embed: str = "model.embed_tokens.weight", norm: str = "model.norm.weight",
               head: str = "lm_head.weight") -> tuple[T, ...]:
    return (t(embed, "V", "H", kind="w"), t(norm, "H"), t(head, "V", "H", when="!tied"))


P = "model.layers.{i}."
_NORMS = (t(P + "input_layernorm.weight", "H"), t(P + "post_attention_layernorm.weight", "H"))
_QKVO = (
    t(P + "self_attn.q_proj.weight", "nh*hd", "H"), t(P + "self_attn.k_proj.weight", "nkv*hd", "H"),
    t(P + "self_attn.v_proj.weight", "nkv*hd", "H"), t(P + "self_attn.o_proj.weight", "H", "nh*hd"),
)
_QKV_BIAS = (t(P + "self_attn.q_proj.bias", "nh*hd", when="qkv_bias"), t(P + "self_attn.k_proj.bias", "nkv*hd", when="qkv_bias"),
             t(P + "self_attn.v_proj.bias", "nkv*hd", when="qkv_bias"))
_O_BIAS = (t(P + "self_attn.o_proj.bias", "H", when="o_bias"),)
_QK_NORM = (t(P + "self_attn.q_norm.weight", "hd"), t(P + "self_attn.k_norm.weight", "hd"))
_MLP = (t(P + "mlp.gate_proj.weight", "I", "H", when="dense"), t(P + "mlp.up_proj.weight", "I", "H", when="dense"),
        t(P + "mlp.down_proj.weight", "H", "I", when="dense"))
_MLP_BIAS = (t(P + "mlp.gate_proj.bias", "I", when="dense mlp_bias"), t(P + "mlp.up_proj.bias", "I", when="dense mlp_bias"),
             t(P + "mlp.down_proj.bias", "H", when="dense mlp_bias"))
_EXPERTS = (
    t(P + "mlp.gate.weight", "E", "H", when="moe"),
    t(P + "mlp.experts.{e}.gate_proj.weight", "Im", "H", when="moe", experts=True),
    t(P + "mlp.experts.{e}.up_proj.weight", "Im", "H", when="moe", experts=True),
    t(P + "mlp.experts.{e}.down_proj.weight", "H", "Im", when="moe", experts=True),
)
_LLAMA_LAYER = _NORMS + _QKVO + _QKV_BIAS + _O_BIAS + _MLP + _MLP_BIAS
_GEMMA2_NORMS = (t(P + "pre_feedforward_layernorm.weight", "H"), t(P + "post_feedforward_layernorm.weight", "H"))
_MLA = (
    t(P + "self_attn.q_proj.weight", "nh*(nope+rope)", "H", when="!q_lora"),
    t(P + "self_attn.q_a_proj.weight", "qlr", "H", when="q_lora"),
    t(P + "self_attn.q_a_layernorm.weight", "qlr", when="q_lora"),
    t(P + "self_attn.q_b_proj.weight", "nh*(nope+rope)", "qlr", when="q_lora"),
    t(P + "self_attn.kv_a_proj_with_mqa.weight", "kvlr+rope", "H"),
    t(P + "self_attn.kv_a_layernorm.weight", "kvlr"),
    t(P + "self_attn.kv_b_proj.weight", "nh*(nope+vhd)", "kvlr"),
    t(P + "self_attn.o_proj.weight", "H", "nh*vhd"),
)
_DEEPSEEK_MOE = (
    t(P + "mlp.gate.weight", "E", "H", when="moe"),
    t(P + "mlp.gate.e_score_correction_bias", "E", when="moe noaux"),
    t(P + "mlp.experts.{e}.gate_proj.weight", "Im", "H", when="moe", experts=True),
    t(P + "mlp.experts.{e}.up_proj.weight", "Im", "H", when="moe", experts=True),
    t(P + "mlp.experts.{e}.down_proj.weight", "H", "Im", when="moe", experts=True),
    t(P + "mlp.shared_experts.gate_proj.weight", "Is", "H", when="moe shared"),
    t(P + "mlp.shared_experts.up_proj.weight", "Is", "H", when="moe shared"),
    t(P + "mlp.shared_experts.down_proj.weight", "H", "Is", when="moe shared"),
)
# DeepSeek-V3's multi-token-prediction layers (model.layers.{n_layers + j}): a decoder layer plus these
_NEXTN = (
    t(P + "embed_tokens.weight", "V", "H", when="nextn", kind="w"), t(P + "enorm.weight", "H", when="nextn"),
    t(P + "hnorm.weight", "H", when="nextn"), t(P + "eh_proj.weight", "H", "2*H", when="nextn"),
    t(P + "shared_head.norm.weight", "H", when="nextn"), t(P + "shared_head.head.weight", "V", "H", when="nextn"),
)
_SIGLIP = "vision_tower.vision_model."
_SIGLIP_LAYER = tuple(
    t(_SIGLIP + "encoder.layers.{i}." + n, *s, when="vision")
    for n, s in (
        ("layer_norm1.weight", ("vH",)), ("layer_norm1.bias", ("vH",)),
        ("self_attn.q_proj.weight", ("vH", "vH")), ("self_attn.q_proj.bias", ("vH",)),
        ("self_attn.k_proj.weight", ("vH", "vH")), ("self_attn.k_proj.bias", ("vH",)),
        ("self_attn.v_proj.weight", ("vH", "vH")), ("self_attn.v_proj.bias", ("vH",)),
        ("self_attn.out_proj.weight", ("vH", "vH")), ("self_attn.out_proj.bias", ("vH",)),
        ("layer_norm2.weight", ("vH",)), ("layer_norm2.bias", ("vH",)),
        ("mlp.fc1.weight", ("vI", "vH")), ("mlp.fc1.bias", ("vI",)),
        ("mlp.fc2.weight", ("vH", "vI")), ("mlp.fc2.bias", ("vH",)),
    )
)


def _qkv_bias_flag(cfg: dict, d: dict) -> dict:
    return {"qkv_bias": bool(cfg.get("attention_bias")), "o_bias": bool(cfg.get("attention_bias")),
            "mlp_bias": bool(cfg.get("mlp_bias"))}


# the head sizes of MLA as llama.cpp's deepseek2 reads an unabsorbed model (one attn_kv_b, no key_length_mla: every
# head decompressed, "MHA" mode): q/k heads nope + rope, value heads v_head_dim (the record's own: today's converter
# writes the absorbed layout instead, attn_k_b / attn_v_b with key_length kv_lora_rank + rope)
_MLA_HEADS = (("attention.key_length", "nope+rope", ""), ("attention.value_length", "vhd", ""))
# the converter's block_count counts the multi-token-prediction layers after the decoder layers (DeepseekV3Model,
# Glm4MoeModel: num_hidden_layers + num_nextn_predict_layers; llama.cpp's n_layer() is the difference)
_NEXTN_BLOCKS = (("block_count", "L+n_nextn", ""),)


def _deepseek_flags(default_topk_method: str) -> Callable[[dict, dict], dict]:
    """DeepSeek-V2/V3: a q LoRA when q_lora_rank is set, shared experts, and the routing bias of noaux_tc
    (``topk_method``: V2's default is greedy, V3's noaux_tc)."""
    return lambda cfg, d: {"q_lora": bool(d["qlr"]), "shared": d["n_shared"] > 0,
                           "noaux": cfg.get("topk_method", default_topk_method) == "noaux_tc"}


def _always(*names: str) -> Callable[[dict, dict], dict]:
    return lambda cfg, d: {n: True for n in names}


# --------------------------------------------------------------------------------------------- the families

# the forward passes shared by several entries (orkpack.model reads them)
_NO_QWEN_SWA = (("use_sliding_window", "Qwen2-style sliding-window layers (use_sliding_window)"),)
_FWD_LLAMA = Forward(gguf_permuted_qk=True, window="config")  # a mistral GGUF says llama: its window applies
_GEMMA = dict(norm_offset=1.0, act="gelu_tanh", act_key="hidden_activation", embed_scale="sqrt_hidden")
_FWD_GEMMA2 = Forward(block="sandwich", attn_scale="qpas", **_GEMMA)
_FWD_GEMMA3 = Forward(block="sandwich", attn_scale="qpas", qk_norm="head", swa_rope_base=10000.0, **_GEMMA)
_FWD_GRANITE = dict(gguf_permuted_qk=True, embed_scale="embedding_multiplier", residual_scale="residual_multiplier",
                    attn_scale="attention_multiplier", logit_scale="logits_scaling")


_F = [
    Family("llama", "LLAMA", _LLAMA_LAYER, _llama_top(), flags=_qkv_bias_flag,
           defaults={"tie_word_embeddings": False},
           forward=_FWD_LLAMA),
    Family("mistral", "LLAMA", _LLAMA_LAYER, _llama_top(), defaults={"tie_word_embeddings": False},
           forward=_FWD_LLAMA),
    Family("mixtral", "LLAMA", _NORMS + _QKVO + (
        t(P + "block_sparse_moe.gate.weight", "E", "H", when="moe"),
        t(P + "block_sparse_moe.experts.{e}.w1.weight", "Im", "H", when="moe", experts=True),
        t(P + "block_sparse_moe.experts.{e}.w3.weight", "Im", "H", when="moe", experts=True),
        t(P + "block_sparse_moe.experts.{e}.w2.weight", "H", "Im", when="moe", experts=True),
    ), _llama_top(), keys={"moe_intermediate": ("intermediate_size",)}, defaults={"tie_word_embeddings": False},
           forward=Forward(gguf_permuted_qk=True, window="config", router_norm="always")),
    Family("qwen2", "QWEN2", _LLAMA_LAYER, _llama_top(), flags=_always("qkv_bias"),
           defaults={"tie_word_embeddings": False},
           forward=Forward(refuse=_NO_QWEN_SWA)),
    Family("qwen2_moe", "QWEN2MOE", _NORMS + _QKVO + _QKV_BIAS + _MLP + _EXPERTS + (
        t(P + "mlp.shared_expert.gate_proj.weight", "Is", "H", when="moe shared"),
        t(P + "mlp.shared_expert.up_proj.weight", "Is", "H", when="moe shared"),
        t(P + "mlp.shared_expert.down_proj.weight", "H", "Is", when="moe shared"),
        t(P + "mlp.shared_expert_gate.weight", 1, "H", when="moe shared"),
    ), _llama_top(), moe="qwen", flags=lambda cfg, d: {"qkv_bias": True, "shared": d["Is"] > 0},
        defaults={"tie_word_embeddings": False},
           forward=Forward(shared_gate=True, refuse=_NO_QWEN_SWA)),
    # Qwen3's tied releases (0.6B, 1.7B, 4B) store lm_head.weight anyway (Qwen3-0.6B: 751,632,384 params)
    Family("qwen3", "QWEN3", _LLAMA_LAYER + _QK_NORM, _llama_top(), flags=_qkv_bias_flag,
           defaults={"tie_word_embeddings": False}, head_stored_when_tied=True,
           forward=Forward(qk_norm="head", refuse=_NO_QWEN_SWA)),
    Family("qwen3_moe", "QWEN3MOE", _NORMS + _QKVO + _QKV_BIAS + _O_BIAS + _QK_NORM + _MLP + _EXPERTS, _llama_top(),
           moe="qwen", flags=_qkv_bias_flag, defaults={"tie_word_embeddings": False},
           # qwen3moe.cpp normalises the chosen experts' weights always (build_moe_ffn's norm_w = true) and the
           # converter writes no expert_weights_norm: a GGUF's routing is normalised (every release: norm_topk_prob)
           forward=Forward(qk_norm="head", refuse=_NO_QWEN_SWA, router_norm_gguf="always")),
    Family("gemma", "GEMMA", _NORMS + _QKVO + _MLP, _llama_top(), defaults={"tie_word_embeddings": True},
           forward=Forward(**_GEMMA)),
    Family("gemma2", "GEMMA2", _NORMS + _GEMMA2_NORMS + _QKVO + _MLP, _llama_top(), swa="even",
           defaults={"tie_word_embeddings": True, "query_pre_attn_scalar": 256},
           forward=_FWD_GEMMA2),
    # Gemma3TextConfig defaults (a real config.json leaves some of them out)
    # record_swa: llama.cpp's gemma3 takes a period of 6 unless the GGUF lists the sliding layers, and Gemma3Model
    # writes no pattern (every release has 6); the record lists them, so a model of another period runs as it is
    Family("gemma3_text", "GEMMA3", _NORMS + _GEMMA2_NORMS + _QKVO + _QK_NORM + _MLP, _llama_top(), swa="pattern",
           record_swa=True,
           defaults={"tie_word_embeddings": True, "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                     "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                     "sliding_window": 4096, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
                     "rope_theta": 1000000.0},
           forward=_FWD_GEMMA3),
    # Gemma3ForConditionalGeneration: the text model under language_model., a SigLIP vision tower, a projector
    Family("gemma3", "GEMMA3", tuple(T(x.name.replace("model.layers.", "language_model.model.layers."), x.shape, x.when,
                                       x.experts, x.kind)
                                     for x in _NORMS + _GEMMA2_NORMS + _QKVO + _QK_NORM + _MLP) + _SIGLIP_LAYER,
           _llama_top("language_model.model.embed_tokens.weight", "language_model.model.norm.weight",
                      "language_model.lm_head.weight") + (
               t(_SIGLIP + "embeddings.patch_embedding.weight", "vH", "vC", "vP", "vP", when="vision"),
               t(_SIGLIP + "embeddings.patch_embedding.bias", "vH", when="vision"),
               t(_SIGLIP + "embeddings.position_embedding.weight", "vN", "vH", when="vision", kind="w"),
               t(_SIGLIP + "post_layernorm.weight", "vH", when="vision"),
               t(_SIGLIP + "post_layernorm.bias", "vH", when="vision"),
               t("multi_modal_projector.mm_input_projection_weight", "vH", "H", when="vision"),
               t("multi_modal_projector.mm_soft_emb_norm.weight", "vH", when="vision"),
           ), swa="pattern", text_config=True, record_swa=True,
           renames=((r"^(?:language_model\.model\.|model\.language_model\.)", "model."),
                    (r"^language_model\.lm_head\.", "lm_head.")),
           defaults={"tie_word_embeddings": True, "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                     "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                     "sliding_window": 4096, "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
                     "rope_theta": 1000000.0},
           forward=_FWD_GEMMA3),
    Family("phi3", "PHI3", _NORMS + (
        t(P + "self_attn.qkv_proj.weight", "(nh+2*nkv)*hd", "H"), t(P + "self_attn.o_proj.weight", "H", "nh*hd"),
        t(P + "mlp.gate_up_proj.weight", "2*I", "H"), t(P + "mlp.down_proj.weight", "H", "I"),
    ), _llama_top(), defaults={"tie_word_embeddings": False},
        forward=Forward(mlp="fused", window="config", smooth=SMOOTH_FUSED)),
    Family("internlm2", "INTERNLM2", (
        t(P + "attention_norm.weight", "H"), t(P + "ffn_norm.weight", "H"),
        t(P + "attention.wqkv.weight", "(nh+2*nkv)*hd", "H"), t(P + "attention.wqkv.bias", "(nh+2*nkv)*hd", when="qkv_bias"),
        t(P + "attention.wo.weight", "H", "nh*hd"), t(P + "attention.wo.bias", "H", when="qkv_bias"),
        t(P + "feed_forward.w1.weight", "I", "H"), t(P + "feed_forward.w3.weight", "I", "H"),
        t(P + "feed_forward.w2.weight", "H", "I"),
    ), _llama_top("model.tok_embeddings.weight", "model.norm.weight", "output.weight"),
        renames=((r"^model\.layers\.(\d+)\.attention\.wqkv\.", r"blk.\1.attn_qkv."),),
        flags=lambda cfg, d: {"qkv_bias": bool(cfg.get("bias"))}, defaults={"tie_word_embeddings": False},
        classes=("InternLM2ForCausalLM",), forward=Forward(qkv="grouped", gguf_permuted_qk=True)),
    # MiniCPM-2B's config.json has no model_type: its architectures class names it
    Family("minicpm", "MINICPM", _LLAMA_LAYER, _llama_top(), flags=_qkv_bias_flag,
           defaults={"tie_word_embeddings": True}, classes=("MiniCPMForCausalLM",),
           forward=Forward(gguf_permuted_qk=True, embed_scale="scale_emb", residual_scale="depth",
                           logit_scale="dim_base")),
    Family("minicpm3", "MINICPM3", _NORMS + _MLA + _MLP, _llama_top(), attention="mla",
           flags=lambda cfg, d: {"q_lora": bool(d["qlr"])}, defaults={"tie_word_embeddings": True},
           classes=("MiniCPM3ForCausalLM",),
           # MiniCPM3Model.set_gguf_parameters: both LoRA ranks (q's when set) and the q/k head size nope + rope
           record=(("attention.q_lora_rank", "qlr", "q_lora"), ("attention.kv_lora_rank", "kvlr", ""),
                   ("attention.key_length", "nope+rope", "")),
           forward=Forward(embed_scale="scale_emb", residual_scale="depth", logit_scale="dim_base",
                           gguf_fixed=(("scale_emb", 12.0), ("scale_depth", 1.4), ("dim_model_base", 256.0)))),
    # ChatGLM3 and GLM-4-9B-chat (model_type chatglm): the transformer.encoder.* layout
    Family("chatglm", "CHATGLM", (
        t("transformer.encoder.layers.{i}.input_layernorm.weight", "H"),
        t("transformer.encoder.layers.{i}.self_attention.query_key_value.weight", "(nh+2*nkv)*hd", "H"),
        t("transformer.encoder.layers.{i}.self_attention.query_key_value.bias", "(nh+2*nkv)*hd", when="qkv_bias"),
        t("transformer.encoder.layers.{i}.self_attention.dense.weight", "H", "nh*hd"),
        t("transformer.encoder.layers.{i}.post_attention_layernorm.weight", "H"),
        t("transformer.encoder.layers.{i}.mlp.dense_h_to_4h.weight", "2*I", "H"),
        t("transformer.encoder.layers.{i}.mlp.dense_4h_to_h.weight", "H", "I"),
    ), (t("transformer.embedding.word_embeddings.weight", "V", "H", kind="w"),
        t("transformer.encoder.final_layernorm.weight", "H"),
        t("transformer.output_layer.weight", "V", "H", when="!tied")),
        keys={"n_layers": ("num_layers",), "intermediate": ("ffn_hidden_size",), "vocab": ("padded_vocab_size",),
              "head_dim": ("kv_channels",), "kv_heads": ("multi_query_group_num",)},
        renames=((r"^transformer\.embedding\.word_embeddings\.", "token_embd."),
                 (r"^transformer\.encoder\.final_layernorm\.", "output_norm."),
                 (r"^transformer\.output_layer\.", "output."),
                 (r"^transformer\.encoder\.layers\.(\d+)\.input_layernorm\.", r"blk.\1.attn_norm."),
                 (r"^transformer\.encoder\.layers\.(\d+)\.self_attention\.query_key_value\.", r"blk.\1.attn_qkv."),
                 (r"^transformer\.encoder\.layers\.(\d+)\.self_attention\.dense\.", r"blk.\1.attn_output."),
                 (r"^transformer\.encoder\.layers\.(\d+)\.post_attention_layernorm\.", r"blk.\1.ffn_norm."),
                 (r"^transformer\.encoder\.layers\.(\d+)\.mlp\.dense_h_to_4h\.", r"blk.\1.ffn_up."),
                 (r"^transformer\.encoder\.layers\.(\d+)\.mlp\.dense_4h_to_h\.", r"blk.\1.ffn_down.")),
        flags=lambda cfg, d: {"qkv_bias": bool(cfg.get("add_qkv_bias"))},
        defaults={"tie_word_embeddings": False, "partial_rotary_factor": 0.5},
        classes=("ChatGLMModel", "ChatGLMForConditionalGeneration"),
        forward=Forward(mlp="fused", rope="interleaved", rope_ratio=True, smooth=SMOOTH_FUSED)),
    # GLM-4-0414 (model_type glm4): llama-style names, fused gate_up, sandwich norms
    Family("glm4", "GLM4", _NORMS + _QKVO + _QKV_BIAS + (
        t(P + "post_self_attn_layernorm.weight", "H"), t(P + "post_mlp_layernorm.weight", "H"),
        t(P + "mlp.gate_up_proj.weight", "2*I", "H"), t(P + "mlp.down_proj.weight", "H", "I"),
    ), _llama_top(), flags=lambda cfg, d: {"qkv_bias": bool(cfg.get("attention_bias"))},
        defaults={"tie_word_embeddings": False, "partial_rotary_factor": 0.5},
        forward=Forward(block="sandwich", mlp="fused", rope="interleaved", smooth=SMOOTH_FUSED)),
    Family("deepseek_v2", "DEEPSEEK2", _NORMS + _MLA + _MLP + _DEEPSEEK_MOE, _llama_top(), attention="mla",
           moe="deepseek", flags=_deepseek_flags("greedy"), record=_MLA_HEADS,
           defaults={"tie_word_embeddings": False},
           forward=Forward(rope="interleaved", router_groups="max", router_scale=True)),
    Family("deepseek_v3", "DEEPSEEK2", _NORMS + _MLA + _MLP + _DEEPSEEK_MOE + _NEXTN, _llama_top(), attention="mla",
           moe="deepseek", flags=_deepseek_flags("noaux_tc"), nextn=True, record=_MLA_HEADS + _NEXTN_BLOCKS,
           renames=((r"^model\.layers\.(\d+)\.(embed_tokens|enorm|hnorm|eh_proj)\.", r"blk.\1.nextn.\2."),
                    (r"^model\.layers\.(\d+)\.shared_head\.norm\.", r"blk.\1.nextn.shared_head_norm."),
                    (r"^model\.layers\.(\d+)\.shared_head\.head\.", r"blk.\1.nextn.shared_head_head."),
                    (r"^model\.layers\.(\d+)\.mlp\.gate\.e_score_correction_bias$", r"blk.\1.exp_probs_b.bias")),
           defaults={"tie_word_embeddings": False},
           forward=Forward(rope="interleaved", router="sigmoid", router_groups="top2sum", router_scale=True)),
    Family("gpt_oss", "GPT_OSS", _NORMS + _QKVO + (
        t(P + "self_attn.q_proj.bias", "nh*hd"), t(P + "self_attn.k_proj.bias", "nkv*hd"),
        t(P + "self_attn.v_proj.bias", "nkv*hd"), t(P + "self_attn.o_proj.bias", "H"),
        t(P + "self_attn.sinks", "nh", kind="bias"),
        t(P + "mlp.router.weight", "E", "H"), t(P + "mlp.router.bias", "E"),
        t(P + "mlp.experts.gate_up_proj", "E", "2*Im", "H"), t(P + "mlp.experts.gate_up_proj_bias", "E", "2*Im"),
        t(P + "mlp.experts.down_proj", "E", "H", "Im"), t(P + "mlp.experts.down_proj_bias", "E", "H"),
    ), _llama_top(), swa="layer_types", keys={"moe_intermediate": ("intermediate_size",)},
        renames=((r"\.mlp\.experts\.gate_up_proj$", ".mlp.experts.gate_up_proj.weight"),
                 (r"\.mlp\.experts\.down_proj$", ".mlp.experts.down_proj.weight"),
                 (r"^model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj\.weight$", r"blk.\1.ffn_gate_up_exps.weight"),
                 (r"^model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj_bias$", r"blk.\1.ffn_gate_up_exps.bias"),
                 (r"^model\.layers\.(\d+)\.mlp\.experts\.down_proj_bias$", r"blk.\1.ffn_down_exps.bias")),
        defaults={"tie_word_embeddings": False},
        forward=Forward(act="swiglu_oai", act_key="", mlp="interleaved", ffn_norm="post_attention_norm",
                        router_norm="always", smooth=(SMOOTH_ATTN,))),
    Family("olmoe", "OLMOE", _NORMS + _QKVO + (
        t(P + "self_attn.q_norm.weight", "nh*hd"), t(P + "self_attn.k_norm.weight", "nkv*hd"),
    ) + _EXPERTS, _llama_top(), keys={"moe_intermediate": ("intermediate_size",)},
        defaults={"tie_word_embeddings": False},
        forward=Forward(qk_norm="full", refuse=(("clip_qkv", "OLMoE's clip_qkv"),))),
    Family("granite", "GRANITE", _LLAMA_LAYER, _llama_top(), flags=_qkv_bias_flag,
           defaults={"tie_word_embeddings": True}, forward=Forward(**_FWD_GRANITE)),
    Family("granitemoe", "GRANITE_MOE", _NORMS + _QKVO + (
        t(P + "block_sparse_moe.router.layer.weight", "E", "H"),
        t(P + "block_sparse_moe.input_linear.weight", "E", "2*Im", "H"),
        t(P + "block_sparse_moe.output_linear.weight", "E", "H", "Im"),
    ), _llama_top(), keys={"moe_intermediate": ("intermediate_size",)},
        renames=((r"^model\.layers\.(\d+)\.block_sparse_moe\.input_linear\.weight$", r"blk.\1.ffn_gate_up_exps.weight"),),
        defaults={"tie_word_embeddings": True}, forward=Forward(router_norm="always", **_FWD_GRANITE)),
    Family("smollm3", "SMOLLM3", _LLAMA_LAYER, _llama_top(), flags=_qkv_bias_flag,
           defaults={"tie_word_embeddings": True},
           forward=Forward(gguf_permuted_qk=True, rope_layers="no_rope_layers",
                           refuse=(("use_sliding_window", "SmolLM3 sliding-window layers (use_sliding_window)"),))),
    Family("starcoder2", "STARCODER2", (
        t(P + "input_layernorm.weight", "H"), t(P + "input_layernorm.bias", "H"),
        t(P + "post_attention_layernorm.weight", "H"), t(P + "post_attention_layernorm.bias", "H"),
    ) + _QKVO + tuple(t(P + f"self_attn.{p}_proj.bias", n, when="use_bias")
                      for p, n in (("q", "nh*hd"), ("k", "nkv*hd"), ("v", "nkv*hd"), ("o", "H"))) + (
        t(P + "mlp.c_fc.weight", "I", "H"), t(P + "mlp.c_fc.bias", "I", when="use_bias"),
        t(P + "mlp.c_proj.weight", "H", "I"), t(P + "mlp.c_proj.bias", "H", when="use_bias"),
    ), _llama_top() + (t("model.norm.bias", "H"),),
        flags=lambda cfg, d: {"use_bias": bool(cfg.get("use_bias", True))}, defaults={"tie_word_embeddings": True},
        forward=Forward(norm="layer", mlp="plain", act="gelu_tanh", window="config",
                        smooth=(SMOOTH_ATTN, SMOOTH_FFN))),  # down(act(up)): no linear carrier for down
]

# ------------------------------------------------------------------------------ the families of 2025/26 (issue 24)

_USE_BIAS = lambda cfg, d: {k: bool(cfg.get("use_bias")) for k in ("qkv_bias", "o_bias", "mlp_bias")}  # noqa: E731


def _ernie_moe_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """ERNIE-4.5-MoE: the last MoE layer (moe_layer_end_index; -1 or absent: the last layer), and the shared
    experts' width as llama.cpp's converter writes it (Ernie4_5MoeModel: intermediate_size // num_key_value_heads;
    the model's own is moe_num_shared_experts x moe_intermediate_size, ``Is``)."""
    v = cfg.get("moe_layer_end_index")
    return {"moe_last": d["L"] - 1 if v is None or v == -1 else _int(v, "moe_layer_end_index", where),
            "Is_conv": d["I"] // d["nkv"] if d["nkv"] else 0}


# ERNIE-4.5-MoE's multi-token-prediction layers (model.mtp_*), which llama.cpp's converter filters out
_ERNIE_MTP_SKIP = ((r"^model\.mtp_(?:block|emb_norm|hidden_norm|linear_proj)\.", "the multi-token-prediction layers "
                    "(model.mtp_*): left out as llama.cpp's converter leaves them out; this pack holds the main model"),)

_F += [
    # ERNIE-4.5 dense (0.3B): llama's layout (use_bias on every projection), RoPE on pairs (2i, 2i+1) as the
    # checkpoint stores q/k: llama.cpp's converter writes them unpermuted (rope type NORM)
    Family("ernie4_5", "ERNIE4_5", _LLAMA_LAYER, _llama_top(), flags=_USE_BIAS,
           defaults={"tie_word_embeddings": True}, classes=("Ernie4_5ForCausalLM", "Ernie4_5_ForCausalLM"),
           forward=Forward(rope="interleaved")),
    # ERNIE-4.5-MoE (21B-A3B, 300B-A47B): a softmax top-k MoE on every moe_layer_interval-th layer from
    # moe_layer_start_index to moe_layer_end_index (dense before), experts chosen on the scores plus
    # moe_statics.e_score_correction_bias (GGUF exp_probs_b), always normalised; moe_num_shared_experts shared
    # experts as one MLP of n_shared x moe_intermediate_size
    Family("ernie4_5_moe", "ERNIE4_5_MOE", _LLAMA_LAYER + _EXPERTS + (
        t(P + "mlp.moe_statics.e_score_correction_bias", 1, "E", when="moe", kind="bias"),
        t(P + "mlp.shared_experts.gate_proj.weight", "Is", "H", when="moe shared"),
        t(P + "mlp.shared_experts.up_proj.weight", "Is", "H", when="moe shared"),
        t(P + "mlp.shared_experts.down_proj.weight", "H", "Is", when="moe shared"),
    ), _llama_top(), moe="interval",
        keys={"n_experts": ("moe_num_experts",), "n_experts_used": ("moe_k",), "n_shared": ("moe_num_shared_experts",),
              "first_dense": ("moe_layer_start_index",), "moe_freq": ("moe_layer_interval",)},
        defaults={"tie_word_embeddings": True, "moe_num_experts": 64, "moe_k": 6, "moe_num_shared_experts": 2,
                  "moe_layer_start_index": 1, "moe_layer_interval": 1, "moe_intermediate_size": 1536},
        renames=((r"^model\.layers\.(\d+)\.mlp\.moe_statics\.e_score_correction_bias$", r"blk.\1.exp_probs_b.bias"),),
        flags=lambda cfg, d: {**_USE_BIAS(cfg, d), "shared": d["n_shared"] > 0}, more_dims=_ernie_moe_dims,
        classes=("Ernie4_5_MoeForCausalLM",), skip=_ERNIE_MTP_SKIP, record=(("expert_shared_feed_forward_length", "Is_conv", "shared"),),
        forward=Forward(rope="interleaved", router_norm="always", router_norm_gguf="always")),
    # OLMo 2: post-norm layers (each block's output normed, nothing before it), q and k RMS-normed over all heads
    # at once; the converter keeps q/k as stored (NeoX RoPE). Smoothing: only down's (no norm feeds q/k/v or gate/up
    # unchanged by the residual)
    Family("olmo2", "OLMO2", (
        t(P + "post_attention_layernorm.weight", "H"), t(P + "post_feedforward_layernorm.weight", "H"),
    ) + _QKVO + _QKV_BIAS + _O_BIAS + (
        t(P + "self_attn.q_norm.weight", "nh*hd"), t(P + "self_attn.k_norm.weight", "nkv*hd"),
    ) + _MLP, _llama_top(), swa="pattern", flags=_qkv_bias_flag, defaults={"tie_word_embeddings": False},
        classes=("Olmo2ForCausalLM",), record_swa=True,
        # (a GGUF "olmo2" with a window is an OLMo 3: llama.cpp's olmo2 runs its sliding layers' RoPE unscaled)
        forward=Forward(block="post", qk_norm="full", swa_rope_unscaled=True, smooth=(SMOOTH_DOWN,))),
]
# OLMo 3: OLMo 2 with sliding-window layers (layer_types; Olmo3Config's default: every 4th layer full, the others
# sliding, window 4096); the converter writes it as olmo2 with the window and its per-layer pattern
_F.append(replace(_F[-1], name="olmo3", classes=("Olmo3ForCausalLM",),
                  defaults={"tie_word_embeddings": False, "sliding_window": 4096, "sliding_window_pattern": 4}))
_F.append(
    # EXAONE 4.0: OLMo 2's post-norm layers with q/k RMS-normed per head; sliding-window layers (layer_types, or
    # sliding_window_pattern: every n-th full, or a string such as "LLLG"), and then RoPE on those only (the full
    # layers NoPE); no window (sliding_window null): RoPE everywhere
    replace(_F[-2], name="exaone4", gguf="EXAONE4", layer=(
        t(P + "post_attention_layernorm.weight", "H"), t(P + "post_feedforward_layernorm.weight", "H"),
    ) + _QKVO + _QK_NORM + _MLP, classes=("Exaone4ForCausalLM",), flags=None,
        defaults={"tie_word_embeddings": False, "sliding_window_pattern": 4},
        forward=Forward(block="post", qk_norm="head", rope_layers="swa", smooth=(SMOOTH_DOWN,))),
)
_F.append(
    # Ministral 3 (the text model, Ministral3ForCausalLM): Mistral's layout with YaRN RoPE and Llama 4's attention
    # temperature on q; llama.cpp's converter permutes q/k as llama's
    Family("ministral3", "MISTRAL3", _LLAMA_LAYER, _llama_top(), flags=_qkv_bias_flag,
           defaults={"tie_word_embeddings": False}, classes=("Ministral3ForCausalLM",),
           forward=Forward(gguf_permuted_qk=True, window="config", attn_temp=True, yarn_log_mul=True)),
)
_MINISTRAL3 = _F[-1]
_F.append(
    # Hunyuan dense (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B/1.8B/4B/7B): llama's layout with q/k RMS-normed per head
    # after RoPE (query_layernorm, key_layernorm); RoPE "dynamic" with an alpha is NTK-alpha (a static base of
    # rope_theta x alpha^(hd / (hd - 2)), which llama.cpp's converter writes as the base)
    Family("hunyuan_v1_dense", "HUNYUAN_DENSE", _LLAMA_LAYER + (
        t(P + "self_attn.query_layernorm.weight", "hd"), t(P + "self_attn.key_layernorm.weight", "hd"),
    ), _llama_top(), flags=_qkv_bias_flag, defaults={"tie_word_embeddings": False},
        classes=("HunYuanDenseV1ForCausalLM",), forward=Forward(qk_norm="head", qk_norm_after_rope=True)),
)
_F.append(
    # GLM-4.5 / 4.5-Air (Glm4MoeForCausalLM): GQA with q/k/v biases (attention_bias), q/k RMS-normed per head when
    # use_qk_norm, partial NeoX RoPE (partial_rotary_factor 0.5); DeepSeek-V3's MoE after the first
    # first_k_dense_replace layers: a sigmoid router with the e_score_correction_bias (GGUF exp_probs_b) choosing
    # top-k (in groups when n_group > 1), the chosen scores normalised (norm_topk_prob) and scaled
    # (routed_scaling_factor), plus n_shared_experts shared experts as one MLP; the releases' multi-token-prediction
    # layers (num_nextn_predict_layers, model.layers.{L + j}: a decoder layer plus DeepSeek-V3's extra tensors), which
    # llama.cpp's converter writes as extra blocks
    Family("glm4_moe", "GLM4_MOE", _NORMS + _QKVO + _QKV_BIAS + (
        t(P + "self_attn.q_norm.weight", "hd", when="qk_norm"), t(P + "self_attn.k_norm.weight", "hd", when="qk_norm"),
    ) + _MLP + _DEEPSEEK_MOE + _NEXTN, _llama_top(), moe="deepseek", nextn=True, record=_NEXTN_BLOCKS,
        renames=_F[[f.name for f in _F].index("deepseek_v3")].renames,
        flags=lambda cfg, d: {"qkv_bias": bool(cfg.get("attention_bias")), "qk_norm": bool(cfg.get("use_qk_norm")),
                              "shared": d["n_shared"] > 0, "noaux": True},
        defaults={"tie_word_embeddings": False, "partial_rotary_factor": 0.5, "norm_topk_prob": True,
                  "n_routed_experts": 128, "num_experts_per_tok": 8, "n_shared_experts": 1,
                  "moe_intermediate_size": 1408, "first_k_dense_replace": 1},
        classes=("Glm4MoeForCausalLM",),
        # the converter names the pre-FFN norm post_attention_norm (GLM4_MOE's tensor table)
        forward=Forward(qk_norm="head", router="sigmoid", router_groups="top2sum", router_scale=True,
                        ffn_norm="post_attention_norm",
                        smooth=(SMOOTH_ATTN, replace(SMOOTH_FFN, norm="post_attention_norm"), SMOOTH_DOWN),
                        refuse=(("use_sliding_window", "sliding-window layers (use_sliding_window)"),))),
)

# ------------------------------------------------------------------------------------------------ hybrids

def _lfm2_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """LFM2: the FFN width transformers' Lfm2MLP builds from block_ff_dim / intermediate_size (2/3 of it, times
    block_ffn_dim_multiplier, rounded up to block_multiple_of, when block_auto_adjust_ff_dim), and the
    short convolution's length ``Lc`` (conv_L_cache)."""
    def get(key: str, default: Any) -> Any:
        v = cfg.get(key)
        return default if v is None else v

    ff, auto = d["I"], get("block_auto_adjust_ff_dim", True)
    mult, multiple = get("block_ffn_dim_multiplier", 1.0), get("block_multiple_of", 256)
    if not isinstance(auto, bool):
        raise SourceError(f"{where}: 'block_auto_adjust_ff_dim' = {escape_name(repr(auto), 40)} is not true or false; "
                          "fix the config")
    if auto:
        ff = int(2 * ff / 3)
        if mult is not None:  # transformers rounds only when a multiplier is set (llama.cpp's converter always)
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not 0 < mult <= 64:
                raise SourceError(f"{where}: 'block_ffn_dim_multiplier' = {escape_name(repr(mult), 40)} is not a "
                                  "positive number; fix the config")
            multiple = _int(multiple, "block_multiple_of", where, cap=MAX_WIDTH)
            if multiple == 0:
                raise SourceError(f"{where}: 'block_multiple_of' is 0; fix the config")
            ff = multiple * ((int(mult * ff) + multiple - 1) // multiple)
    return {"I": _lfm2_ffn_cap(ff, where), "Lc": _lfm2_lc(cfg, where)}


def _lfm2_lc(cfg: Mapping, where: str) -> int:
    """The short convolution's length ``Lc`` (conv_L_cache, default 3; at least 2 taps)."""
    v = cfg.get("conv_L_cache")
    lc = _int(3 if v is None else v, "conv_L_cache", where, cap=1024)
    if lc < 2:
        raise SourceError(f"{where}: 'conv_L_cache' = {lc}: a short convolution needs at least 2 taps; fix the config")
    return lc


def _lfm2_ffn_cap(ff: int, where: str) -> int:
    if ff > MAX_WIDTH:
        raise SourceError(f"{where}: the FFN width {ff} is beyond any real model (cap {MAX_WIDTH}); fix the config")
    return ff


def _lfm2_moe_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """LFM2-MoE: the dense layers' FFN is intermediate_size as it stands (Lfm2MoeMLP adjusts nothing); ``Lc``."""
    return {"Lc": _lfm2_lc(cfg, where)}


_LFM2_SHORTCONV = (
    t(P + "conv.in_proj.weight", "3*H", "H", when="shortconv"),
    t(P + "conv.in_proj.bias", "3*H", when="shortconv conv_bias"),
    t(P + "conv.conv.weight", "H", 1, "Lc", when="shortconv"),  # depthwise Conv1d (H, 1, Lc); GGUF {Lc, H}
    t(P + "conv.conv.bias", "H", when="shortconv conv_bias"),
    t(P + "conv.out_proj.weight", "H", "H", when="shortconv"),
    t(P + "conv.out_proj.bias", "H", when="shortconv conv_bias"),
)
_LFM2_ATTN = (
    t(P + "self_attn.q_proj.weight", "nh*hd", "H", when="attn"), t(P + "self_attn.k_proj.weight", "nkv*hd", "H", when="attn"),
    t(P + "self_attn.v_proj.weight", "nkv*hd", "H", when="attn"),
    t(P + "self_attn.out_proj.weight", "H", "nh*hd", when="attn"),
    t(P + "self_attn.q_layernorm.weight", "hd", when="attn"), t(P + "self_attn.k_layernorm.weight", "hd", when="attn"),
)
_LFM2_FFN = (
    t(P + "operator_norm.weight", "H"), t(P + "ffn_norm.weight", "H"),
    t(P + "feed_forward.w1.weight", "I", "H"), t(P + "feed_forward.w3.weight", "I", "H"),
    t(P + "feed_forward.w2.weight", "H", "I"),
)
_F.append(
    # LFM2 (Liquid AI): gated short-convolution layers and GQA layers (config layer_types, or full_attn_idxs), each
    # with a SwiGLU FFN; the final norm is model.embedding_norm (GGUF token_embd_norm), applied after the last layer
    Family("lfm2", "LFM2", _LFM2_FFN + _LFM2_ATTN + _LFM2_SHORTCONV,
           _llama_top(norm="model.embedding_norm.weight"),
           keys={"intermediate": ("block_ff_dim", "intermediate_size"), "n_layers": ("num_hidden_layers", "num_layers")},
           defaults={"tie_word_embeddings": True, "intermediate_size": 12288, "num_key_value_heads": 8,
                     "rope_theta": 1000000.0},
           flags=lambda cfg, d: {"conv_bias": bool(cfg.get("conv_bias"))},
           classes=("Lfm2ForCausalLM", "LFM2ForCausalLM"),
           blocks=Blocks("layer_types", {"conv": "shortconv", "full_attention": ATTN}, indices="full_attn_idxs",
                         state="H*(Lc-1)", gguf_dims=(("Lc", "shortconv.l_cache"),), flops="2*H*Lc+2*H"),
           more_dims=_lfm2_dims, conv_kernels=("blk.*.shortconv.conv.weight",),
           squeeze=(("blk.*.shortconv.conv.weight", 1),),
           forward=Forward(qk_norm="head", output_norm="token_embd_norm",
                           smooth=(Smooth(("attn_q", "attn_k", "attn_v", "shortconv.in_proj"), norm="attn_norm"),
                                   SMOOTH_FFN, SMOOTH_DOWN))),
)

_LFM2 = _F[-1]
_LFM2_MOE_FFN = (
    t(P + "feed_forward.gate.weight", "E", "H", when="moe"),
    t(P + "feed_forward.expert_bias", "E", when="moe expert_bias", kind="bias"),
    t(P + "feed_forward.experts.{e}.w1.weight", "Im", "H", when="moe", experts=True),
    t(P + "feed_forward.experts.{e}.w3.weight", "Im", "H", when="moe", experts=True),
    t(P + "feed_forward.experts.{e}.w2.weight", "H", "Im", when="moe", experts=True),
)
_F.append(
    # LFM2-MoE: LFM2 whose FFN is, after the first num_dense_layers (dense, LFM2's w1/w3/w2 at intermediate_size,
    # never auto-adjusted), a sparse MoE: a sigmoid router (feed_forward.gate), top-k chosen on the scores plus
    # feed_forward.expert_bias (GGUF exp_probs_b), the chosen sigmoid scores as weights, normalised (norm_topk_prob,
    # transformers: sum + 1e-6), times routed_scaling_factor; no shared expert
    replace(_LFM2, name="lfm2_moe", gguf="LFM2MOE",
            layer=tuple(replace(x, when=x.when + ("dense",)) if ".feed_forward.w" in x.name else x
                        for x in _LFM2.layer) + _LFM2_MOE_FFN,
            moe="deepseek",
            keys={**_LFM2.keys, "intermediate": ("intermediate_size",), "first_dense": ("num_dense_layers",)},
            defaults={"tie_word_embeddings": True, "intermediate_size": 7168, "moe_intermediate_size": 1792,
                      "num_key_value_heads": 8, "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4,
                      "rope_theta": 1000000.0, "norm_topk_prob": True, "routed_scaling_factor": 1.0},
            flags=lambda cfg, d: {"conv_bias": bool(cfg.get("conv_bias")),
                                  "expert_bias": cfg.get("use_expert_bias", True) is not False},
            classes=("Lfm2MoeForCausalLM",),
            renames=((r"^model\.layers\.(\d+)\.feed_forward\.expert_bias$", r"blk.\1.exp_probs_b.bias"),),
            more_dims=_lfm2_moe_dims,
            forward=replace(_LFM2.forward, router="sigmoid", router_norm="config", router_norm_gguf="always",
                            router_eps=1e-6, router_scale=True)),
)



def _config_int(cfg: Mapping, where: str) -> Callable[..., int]:
    """``get(key, default, cap=MAX_WIDTH)``: a config key as a checked non-negative integer (its default when absent
    or null), for a family's ``more_dims``."""
    def get(key: str, default: Any, cap: int = MAX_WIDTH) -> int:
        v = cfg.get(key)
        return _int(default if v is None else v, key, where, cap=cap)
    return get


def _qwen35_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """Qwen3.5 / Qwen3-Next's Gated DeltaNet: key heads ``nk`` of ``dk``, value heads ``nv`` of ``dv`` (``vper`` value
    heads per key head), the conv kernel ``ck`` over the ``cc`` = q + k + v channels; in llama.cpp's terms the SSM
    inner size ``di`` = nv x dv, groups ``ng`` = nk, state size ``ds`` = dk (its ssm.* keys)."""
    def get(key: str, default: int, cap: int = MAX_WIDTH) -> int:
        v = cfg.get(key)
        return _int(default if v is None else v, key, where, cap=cap)

    nk, nv = get("linear_num_key_heads", 16, 4096), get("linear_num_value_heads", 32, 4096)
    dk, dv = get("linear_key_head_dim", 128), get("linear_value_head_dim", 128)
    ck = get("linear_conv_kernel_dim", 4, 1024)
    for key, v in (("linear_num_key_heads", nk), ("linear_key_head_dim", dk), ("linear_value_head_dim", dv)):
        if v == 0:
            raise SourceError(f"{where}: '{key}' is 0; fix the config")
    if nv == 0 or nv % nk:
        raise SourceError(f"{where}: 'linear_num_value_heads' = {nv} is not a multiple of 'linear_num_key_heads' = "
                          f"{nk} (each key head serves whole value heads); fix the config")
    if ck < 2:
        raise SourceError(f"{where}: 'linear_conv_kernel_dim' = {ck}: the convolution needs at least 2 taps; "
                          "fix the config")
    if 2 * nk * dk + nv * dv > MAX_WIDTH:
        raise SourceError(f"{where}: the linear attention's q + k + v width {2 * nk * dk + nv * dv} is beyond any "
                          f"real model (cap {MAX_WIDTH}); fix the config")
    return {"nk": nk, "nv": nv, "dk": dk, "dv": dv, "ck": ck, "vper": nv // nk, "cc": 2 * nk * dk + nv * dv,
            "di": nv * dv, "ng": nk, "ds": dk}


# Gated DeltaNet (transformers' Qwen3_5GatedDeltaNet; llama.cpp's build_layer_attn_linear): q, k, v through one
# depthwise causal conv, a gate z, beta and alpha per value head, A and dt per value head, a gated RMSNorm per head
_DELTANET = (
    t(P + "linear_attn.in_proj_qkv.weight", "cc", "H", when="deltanet"),
    t(P + "linear_attn.in_proj_z.weight", "nv*dv", "H", when="deltanet"),
    t(P + "linear_attn.in_proj_b.weight", "nv", "H", when="deltanet"),
    t(P + "linear_attn.in_proj_a.weight", "nv", "H", when="deltanet"),
    t(P + "linear_attn.conv1d.weight", "cc", 1, "ck", when="deltanet"),  # depthwise Conv1d; GGUF {ck, cc}
    t(P + "linear_attn.dt_bias", "nv", when="deltanet", kind="bias"),
    t(P + "linear_attn.A_log", "nv", when="deltanet", kind="bias"),
    t(P + "linear_attn.norm.weight", "dv", when="deltanet"),
    t(P + "linear_attn.out_proj.weight", "H", "nv*dv", when="deltanet"),
)
# gated attention: q_proj holds per head [q | gate] (2 x nh x hd rows), RMS-normed q and k per head
_GATED_ATTN = (
    t(P + "self_attn.q_proj.weight", "2*nh*hd", "H", when="attn"),
    t(P + "self_attn.k_proj.weight", "nkv*hd", "H", when="attn"),
    t(P + "self_attn.v_proj.weight", "nkv*hd", "H", when="attn"),
    t(P + "self_attn.o_proj.weight", "H", "nh*hd", when="attn"),
    t(P + "self_attn.q_norm.weight", "hd", when="attn"), t(P + "self_attn.k_norm.weight", "hd", when="attn"),
)
# the converter's layout (_LinearAttentionVReorderBase, Qwen3NextModel.modify_tensors): value heads tiled, A negated
_VHEADS = dict(groups="nk", per="vper")
_DELTANET_CONVERT = (
    Convert("blk.*.ssm_a", "neg_exp"),
    Convert("blk.*.attn_qkv.weight", "vheads", skip="2*nk*dk", head="dv", **_VHEADS),
    Convert("blk.*.ssm_conv1d.weight", "vheads", skip="2*nk*dk", head="dv", **_VHEADS),
    Convert("blk.*.attn_gate.weight", "vheads", head="dv", **_VHEADS),
    Convert("blk.*.ssm_beta.weight", "vheads", **_VHEADS),
    Convert("blk.*.ssm_alpha.weight", "vheads", **_VHEADS),
    Convert("blk.*.ssm_a", "vheads", **_VHEADS),
    Convert("blk.*.ssm_dt.bias", "vheads", **_VHEADS),
    Convert("blk.*.ssm_out.weight", "vheads", axis=1, head="dv", **_VHEADS),
)
_DELTANET_BLOCKS = Blocks("layer_types", {"linear_attention": "deltanet", "full_attention": ATTN},
                          interval="full_attention_interval", interval_default=4, record="recurrent_layers",
                          state="(ck-1)*(di+2*ng*ds)+ds*di", flops="2*ck*(di+2*ng*ds)+7*ds*di",
                          gguf_dims=(("ck", "ssm.conv_kernel"), ("ds", "ssm.state_size"), ("ng", "ssm.group_count"),
                                     ("di", "ssm.inner_size")))
_Q35_RENAMES = ((r"\.linear_attn\.dt_bias$", ".linear_attn.dt_proj.bias"),)
# every norm but the gated one is (1 + w) (Qwen3_5RMSNorm; the converter stores w + 1); attn_norm also feeds the
# linear attention's projections, which smoothing must then scale alike
_FWD_QWEN35 = Forward(norm_offset=1.0, qk_norm="head", attn_gate=True, ffn_norm="post_attention_norm",
                      smooth=(Smooth(("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha"),
                                     norm="attn_norm"),
                              replace(SMOOTH_FFN, norm="post_attention_norm"), SMOOTH_DOWN))
_Q35_DEFAULTS = {"tie_word_embeddings": False, "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256}
# a multimodal release (Qwen3_5ForConditionalGeneration): the text model under model.language_model., the vision
# tower under model.visual. (llama.cpp's converter writes it to a separate mmproj GGUF: left out, by name)
_MM_RENAMES = ((r"^model\.language_model\.", "model."),)
_VISION_SKIP = ((r"^model\.visual\.", "the vision tower (model.visual.*): llama.cpp's converter writes it to a "
                 "separate mmproj GGUF; this pack holds the text model"),)
# the releases' multi-token-prediction layer (mtp.*): a speculative-decoding draft, which the converter folds in as
# extra blocks unless --no-mtp; orkpack packs the main model (transformers' classes build no MTP layers either)
_MTP_SKIP = ((r"^(?:model\.)?mtp\.", "the multi-token-prediction layer (mtp.*): a speculative-decoding draft, "
              "left out as llama.cpp's converter leaves it out with --no-mtp; this pack holds the main model"),)
_F.append(
    # Qwen3.5 (dense): Gated DeltaNet layers and gated-attention layers (layer_types, or every
    # full_attention_interval-th layer), each with a SwiGLU MLP; partial RoPE (partial_rotary_factor, default 0.25;
    # the interleaved MRoPE of the release is plain RoPE for text: its three position streams are equal)
    Family("qwen3_5_text", "QWEN35", _NORMS + _DELTANET + _GATED_ATTN + _MLP, _llama_top(),
           defaults=_Q35_DEFAULTS, renames=_Q35_RENAMES, classes=("Qwen3_5ForCausalLM",),
           blocks=_DELTANET_BLOCKS, more_dims=_qwen35_dims, conv_kernels=("blk.*.ssm_conv1d.weight",), skip=_MTP_SKIP,
           squeeze=(("blk.*.ssm_conv1d.weight", 1),), convert=_DELTANET_CONVERT, forward=_FWD_QWEN35),
)
_QWEN35 = _F[-1]


def _multimodal(fam: Family, name: str, cls: str) -> Family:
    """A release's Qwen3_5*ForConditionalGeneration form of a text family: its text model under
    model.language_model. (config text_config), its vision tower left out by name."""
    mm = lambda x: replace(x, name=x.name.replace("model.", "model.language_model.", 1))  # noqa: E731
    return replace(fam, name=name, text_config=True, layer=tuple(mm(x) for x in fam.layer),
                   top=tuple(mm(x) if x.name.startswith("model.") else x for x in fam.top),
                   renames=_MM_RENAMES + fam.renames, skip=_VISION_SKIP + fam.skip, classes=(cls,))


_F.append(_multimodal(_QWEN35, "qwen3_5", "Qwen3_5ForConditionalGeneration"))
_F.append(replace(
    # the Ministral 3 releases (Mistral3ForConditionalGeneration, model_type mistral3): the text model above under
    # model.language_model. (config text_config) beside a Pixtral vision tower and its projector, which llama.cpp's
    # converter writes to a separate mmproj GGUF (its text GGUF is the ministral3 one, general.architecture mistral3)
    _multimodal(_MINISTRAL3, "mistral3", "Mistral3ForConditionalGeneration"),
    # transformers saves it as the releases are stored: language_model.model.*, language_model.lm_head.*
    renames=((r"^(?:language_model\.model\.|model\.language_model\.)", "model."),
             (r"^language_model\.lm_head\.", "lm_head.")) + _MINISTRAL3.renames,
    skip=((r"^(?:model\.)?(?:vision_tower|multi_modal_projector)\.",
           "the vision tower and its projector (model.vision_tower.*, model.multi_modal_projector.*): llama.cpp's "
           "converter writes them to a separate mmproj GGUF; this pack holds the text model"),)))
_Q35_MOE_FFN = _EXPERTS + (
    t(P + "mlp.shared_expert.gate_proj.weight", "Is", "H", when="moe"),
    t(P + "mlp.shared_expert.up_proj.weight", "Is", "H", when="moe"),
    t(P + "mlp.shared_expert.down_proj.weight", "H", "Is", when="moe"),
    t(P + "mlp.shared_expert_gate.weight", 1, "H", when="moe"),
)
_F.append(
    # Qwen3.5-MoE: every layer's FFN a softmax top-k MoE (normalised) with a sigmoid-gated shared expert
    replace(_QWEN35, name="qwen3_5_moe_text", gguf="QWEN35MOE", layer=_NORMS + _DELTANET + _GATED_ATTN + _Q35_MOE_FFN,
            classes=("Qwen3_5MoeForCausalLM",),
            defaults={**_Q35_DEFAULTS, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
                      "num_key_value_heads": 2, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                      "num_experts": 256, "num_experts_per_tok": 8},
            forward=replace(_FWD_QWEN35, router_norm="always", shared_gate=True,
                            smooth=_FWD_QWEN35.smooth[:1])),
)
_QWEN35_MOE = _F[-1]
_F.append(_multimodal(_QWEN35_MOE, "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"))



def _granite_hybrid_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """Granite-4.0-H's Mamba2 mixer (transformers' GraniteMoeHybridMambaLayer): ``nm`` heads of ``pd`` channels
    (mamba_n_heads, mamba_d_head: "auto" is d_inner / heads), d_inner ``di`` = mamba_expand x hidden, ``ng`` groups
    (mamba_n_groups) of B and C of ``ds`` = mamba_d_state each, the conv kernel ``ck`` (mamba_d_conv) over the
    ``cc`` = di + 2 ng ds channels, the gated norm's group size ``gs`` = di / ng; llama.cpp's ssm.* are these."""
    get = _config_int(cfg, where)

    H = d["H"]
    expand, nm = get("mamba_expand", 2, 64), get("mamba_n_heads", 128, 1 << 16)
    ng, ds, ck = get("mamba_n_groups", 1, 1 << 16), get("mamba_d_state", 256), get("mamba_d_conv", 4, 1024)
    di = expand * H
    for key, v in (("mamba_expand", expand), ("mamba_n_heads", nm), ("mamba_n_groups", ng), ("mamba_d_state", ds)):
        if v == 0:
            raise SourceError(f"{where}: '{key}' is 0; fix the config")
    if di > MAX_WIDTH or di + 2 * ng * ds > MAX_WIDTH:
        raise SourceError(f"{where}: the Mamba2 width ('mamba_expand' x 'hidden_size' + 2 x 'mamba_n_groups' x "
                          f"'mamba_d_state' = {di + 2 * ng * ds}) is beyond any real model (cap {MAX_WIDTH}); fix the config")
    if ck < 2:
        raise SourceError(f"{where}: 'mamba_d_conv' = {ck}: the convolution needs at least 2 taps; fix the config")
    if di % nm:
        raise SourceError(f"{where}: 'mamba_n_heads' = {nm} does not divide 'mamba_expand' x 'hidden_size' = {di}; "
                          "fix the config")
    pd = cfg.get("mamba_d_head")
    pd = di // nm if pd is None or pd == "auto" else _int(pd, "mamba_d_head", where)
    if pd * nm != di:
        raise SourceError(f"{where}: 'mamba_d_head' = {pd} x 'mamba_n_heads' = {nm} is not 'mamba_expand' x "
                          f"'hidden_size' = {di}; fix the config")
    if nm % ng:
        raise SourceError(f"{where}: 'mamba_n_groups' = {ng} does not divide 'mamba_n_heads' = {nm} (each group serves "
                          "whole heads); fix the config")
    if not d["E"] and not d["Is"]:
        raise SourceError(f"{where}: 'shared_intermediate_size' is 0 and there are no experts: the layers would have no "
                          "FFN; fix the config")
    return {"nm": nm, "pd": pd, "di": di, "ng": ng, "ds": ds, "ck": ck, "cc": di + 2 * ng * ds, "gs": di // ng}


def _mamba2_tensors(prefix: str) -> tuple[T, ...]:
    """A Mamba2 mixer's tensors under ``prefix`` (Granite-4.0-H's model.layers.N.mamba., Nemotron-H's
    backbone.layers.N.mixer.), on the layers whose block is mamba2."""
    return (
        t(prefix + "in_proj.weight", "2*di+2*ng*ds+nm", "H", when="mamba2"),  # z, x B C, dt
        t(prefix + "in_proj.bias", "2*di+2*ng*ds+nm", when="mamba2 proj_bias"),
        t(prefix + "conv1d.weight", "cc", 1, "ck", when="mamba2"),  # depthwise Conv1d; GGUF {ck, cc}
        t(prefix + "conv1d.bias", "cc", when="mamba2 conv_bias"),
        t(prefix + "dt_bias", "nm", when="mamba2", kind="bias"),
        t(prefix + "A_log", "nm", when="mamba2", kind="bias"),
        t(prefix + "D", "nm", when="mamba2", kind="norm"),
        t(prefix + "norm.weight", "di", when="mamba2"),
        t(prefix + "out_proj.weight", "H", "di", when="mamba2"),
        t(prefix + "out_proj.bias", "H", when="mamba2 proj_bias"),
    )


_MAMBA2 = _mamba2_tensors(P + "mamba.")
# a Mamba2 layer's state per sequence (llama.cpp's n_embd_r + n_embd_s: the conv's last ck - 1 inputs of the di + 2 ng ds
# channels, one ds x (di / heads) state per head) and its float work a token besides ssm_in / ssm_out: the depthwise
# conv (a multiply-add per tap and channel) and the scan (per state element: decay, + dt x B, . C: 5 ops; docs/TIERMAP.md)
_MAMBA2_STATE = "(ck-1)*(di+2*ng*ds)+ds*di"
_MAMBA2_FLOPS = "2*ck*(di+2*ng*ds)+5*ds*di"
_MAMBA2_GGUF_DIMS = (("ck", "ssm.conv_kernel"), ("ds", "ssm.state_size"), ("ng", "ssm.group_count"),
                     ("di", "ssm.inner_size"))
_GRANITE_HYBRID_ATTN = tuple(replace(x, when=x.when + ("attn",)) for x in _QKVO + _QKV_BIAS + _O_BIAS)
_GRANITE_HYBRID_FFN = (
    t(P + "block_sparse_moe.router.layer.weight", "E", "H", when="moe"),
    t(P + "block_sparse_moe.input_linear.weight", "E", "2*Im", "H", when="moe"),  # per expert [gate; up]
    t(P + "block_sparse_moe.output_linear.weight", "E", "H", "Im", when="moe"),
    t(P + "shared_mlp.input_linear.weight", "2*Is", "H"),  # [gate; up]: the shared expert, or the dense FFN
    t(P + "shared_mlp.output_linear.weight", "H", "Is"),
)
_F.append(
    # IBM Granite-4.0-H (GraniteMoeHybrid): Mamba2 layers and NoPE GQA layers (layer_types "mamba" / "attention",
    # transformers 5: "linear_attention" / "full_attention"; or attn_layer_indices), each with a softmax top-k MoE
    # (normalised) plus an always-on shared SwiGLU MLP, or the shared MLP alone (num_local_experts 0: H-Micro); the
    # granite multipliers. llama.cpp's converter (GraniteHybridModel) splits both fused input_linear into gate and up
    # (ffn_{gate,up}_exps, ffn_{gate,up}_shexp; without experts the shared MLP is ffn_gate / ffn_up / ffn_down),
    # squeezes the conv kernel, writes A = -exp(A_log) and A, D as (H, 1) and the gated norm as (G, D / G)
    Family("granitemoehybrid", "GRANITE_HYBRID", _NORMS + _GRANITE_HYBRID_ATTN + _MAMBA2 + _GRANITE_HYBRID_FFN,
           _llama_top(),
           keys={"moe_intermediate": ("intermediate_size",), "shared_intermediate": ("shared_intermediate_size",),
                 "n_experts": ("num_local_experts",)},
           defaults={"tie_word_embeddings": False, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
                     "num_hidden_layers": 32, "num_attention_heads": 32, "num_local_experts": 8,
                     "num_experts_per_tok": 2, "shared_intermediate_size": 1024},  # GraniteMoeHybridConfig's
           flags=lambda cfg, d: {"qkv_bias": bool(cfg.get("attention_bias")), "o_bias": bool(cfg.get("attention_bias")),
                                 "conv_bias": cfg.get("mamba_conv_bias") is not False,
                                 "proj_bias": bool(cfg.get("mamba_proj_bias")), "experts": d["E"] > 0},
           classes=("GraniteMoeHybridForCausalLM",),
           renames=((r"^model\.layers\.(\d+)\.block_sparse_moe\.input_linear\.weight$", r"blk.\1.ffn_gate_up_exps.weight"),
                    (r"^model\.layers\.(\d+)\.shared_mlp\.input_linear\.weight$", r"blk.\1.ffn_gate_up_shexp.weight"),
                    (r"\.mamba\.dt_bias$", ".mamba.dt_proj.bias")),
           split=(Split("blk.*.ffn_gate_up_exps.weight", "gate_up", ("gate", "up"), axis=1),
                  Split("blk.*.ffn_gate_up_shexp.weight", "gate_up", ("gate", "up"), when=("experts",)),
                  Split("blk.*.ffn_gate_up_shexp.weight", "gate_up_shexp", ("gate", "up"), when=("!experts",)),
                  Split("blk.*.ffn_down_shexp.weight", "down_shexp", ("down",), when=("!experts",))),
           reshape=(("blk.*.ssm_a", ("nm", 1)), ("blk.*.ssm_d", ("nm", 1)), ("blk.*.ssm_norm.weight", ("ng", "gs"))),
           blocks=Blocks("layer_types", {"mamba": "mamba2", "attention": ATTN, "linear_attention": "mamba2",
                                         "full_attention": ATTN}, indices="attn_layer_indices", default="mamba2",
                         state=_MAMBA2_STATE, flops=_MAMBA2_FLOPS, gguf_dims=_MAMBA2_GGUF_DIMS),
           more_dims=_granite_hybrid_dims, conv_kernels=("blk.*.ssm_conv1d.weight",),
           squeeze=(("blk.*.ssm_conv1d.weight", 1),), convert=(Convert("blk.*.ssm_a", "neg_exp"),),
           forward=Forward(router_norm="always", rope_switch="position_embedding_type", **_FWD_GRANITE)),
)

# FalconH1Config's muP multipliers and their defaults (transformers); llama.cpp's converter (FalconH1Model) folds every
# one into the weights
_FALCON_MULT = {"embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "key_multiplier": 1.0,
                "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0, "ssm_in_multiplier": 1.0,
                "ssm_out_multiplier": 1.0, "mlp_multipliers": [1.0, 1.0], "ssm_multipliers": [1.0] * 5}


def _falcon_h1_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """Falcon-H1's Mamba2 mixer (transformers' FalconH1Mixer): d_inner ``di`` = mamba_d_ssm (FalconH1Config: 1024
    when absent; mamba_expand x hidden when null), ``nm`` heads of ``pd`` channels (mamba_d_head, "auto": di / heads),
    ``ng`` groups of B and C of ``ds`` = mamba_d_state, the conv kernel ``ck`` over ``cc`` = di + 2 ng ds channels, the
    optional gated norm's group size ``gs``; and the multipliers' shapes and the combinations llama.cpp's converter
    folds differently from transformers (one line naming the key)."""
    get = _config_int(cfg, where)

    H = d["H"]
    expand, nm = get("mamba_expand", 2, 64), get("mamba_n_heads", 128, 1 << 16)
    ng, ds, ck = get("mamba_n_groups", 1, 1 << 16), get("mamba_d_state", 256), get("mamba_d_conv", 4, 1024)
    di = get("mamba_d_ssm", 1024) if cfg.get("mamba_d_ssm", 0) is not None else expand * H
    for key, v in (("mamba_d_ssm", di), ("mamba_n_heads", nm), ("mamba_n_groups", ng), ("mamba_d_state", ds)):
        if v == 0:
            raise SourceError(f"{where}: '{key}' is 0; fix the config")
    if 2 * di + 2 * ng * ds + nm > MAX_WIDTH:
        raise SourceError(f"{where}: the Mamba2 projection width (2 x 'mamba_d_ssm' + 2 x 'mamba_n_groups' x "
                          f"'mamba_d_state' + 'mamba_n_heads' = {2 * di + 2 * ng * ds + nm}) is beyond any real model "
                          f"(cap {MAX_WIDTH}); fix the config")
    if ck < 2:
        raise SourceError(f"{where}: 'mamba_d_conv' = {ck}: the convolution needs at least 2 taps; fix the config")
    if di % nm:
        raise SourceError(f"{where}: 'mamba_n_heads' = {nm} does not divide 'mamba_d_ssm' = {di}; fix the config")
    pd = cfg.get("mamba_d_head")
    pd = di // nm if pd is None or pd == "auto" else _int(pd, "mamba_d_head", where)
    if pd * nm != di:
        raise SourceError(f"{where}: 'mamba_d_head' = {pd} x 'mamba_n_heads' = {nm} is not 'mamba_d_ssm' = {di}; "
                          "fix the config")
    if nm % ng:
        raise SourceError(f"{where}: 'mamba_n_groups' = {ng} does not divide 'mamba_n_heads' = {nm} (each group serves "
                          "whole heads); fix the config")
    mult = {}
    for key, default in _FALCON_MULT.items():
        v = cfg.get(key)
        v = default if v is None else v
        n = len(default) if isinstance(default, list) else 0
        ok = (isinstance(v, list) and len(v) == n and all(_number(x) for x in v)) if n else _number(v)
        if not ok:
            want = f"a list of {n} numbers" if n else "a number"
            raise SourceError(f"{where}: '{key}' = {escape_name(repr(v), 60)} is not {want}; fix the config")
        mult[key] = v
    # where llama.cpp's converter and transformers part: the converter scales the q/k/v and in_proj biases by the
    # input multipliers (transformers scales the input, not the bias), and a tied head keeps the embedding's multiplier
    if cfg.get("attention_bias") and (mult["attention_in_multiplier"] != 1 or mult["key_multiplier"] != 1):
        raise SourceError(f"{where}: 'attention_bias' with 'attention_in_multiplier' / 'key_multiplier' not 1: llama.cpp's "
                          "converter scales the q/k/v biases by them, transformers does not; not supported")
    if cfg.get("mamba_proj_bias") and mult["ssm_in_multiplier"] != 1:
        raise SourceError(f"{where}: 'mamba_proj_bias' with 'ssm_in_multiplier' not 1: llama.cpp's converter scales the "
                          "in_proj bias by it, transformers does not; not supported")
    if d["tied"] and mult["embedding_multiplier"] != mult["lm_head_multiplier"]:
        raise SourceError(f"{where}: 'tie_word_embeddings' with 'embedding_multiplier' != 'lm_head_multiplier': the one "
                          "stored matrix cannot hold both (llama.cpp's converter folds the embedding's into it and its "
                          "output head then scales by that); not supported")
    if cfg.get("mamba_rms_norm") and cfg.get("mamba_norm_before_gate", True):
        raise SourceError(f"{where}: 'mamba_rms_norm' with 'mamba_norm_before_gate' true (FalconH1Config's default): "
                          "transformers normalizes before the gate, llama.cpp's graph after it; not supported")
    return {"nm": nm, "pd": pd, "di": di, "ng": ng, "ds": ds, "ck": ck, "cc": di + 2 * ng * ds, "gs": di // ng}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_FALCON_H1_LAYER = (
    t(P + "input_layernorm.weight", "H"), t(P + "pre_ff_layernorm.weight", "H"),
) + _QKVO + _QKV_BIAS + _O_BIAS + (
    t(P + "mamba.in_proj.weight", "2*di+2*ng*ds+nm", "H"),  # z, x B C, dt
    t(P + "mamba.in_proj.bias", "2*di+2*ng*ds+nm", when="proj_bias"),
    t(P + "mamba.conv1d.weight", "cc", 1, "ck"),  # depthwise Conv1d; GGUF {ck, cc}
    t(P + "mamba.conv1d.bias", "cc", when="conv_bias"),
    t(P + "mamba.dt_bias", "nm", kind="bias"),
    t(P + "mamba.A_log", "nm", kind="bias"),
    t(P + "mamba.D", "nm", kind="norm"),
    t(P + "mamba.norm.weight", "di", when="rms_norm"),
    t(P + "mamba.out_proj.weight", "H", "di"),
    t(P + "mamba.out_proj.bias", "H", when="projectors_bias"),
    t(P + "feed_forward.gate_proj.weight", "I", "H"), t(P + "feed_forward.up_proj.weight", "I", "H"),
    t(P + "feed_forward.down_proj.weight", "H", "I"),
    t(P + "feed_forward.gate_proj.bias", "I", when="mlp_bias"), t(P + "feed_forward.up_proj.bias", "I", when="mlp_bias"),
    t(P + "feed_forward.down_proj.bias", "H", when="mlp_bias"),
)
# the converter's folds (FalconH1Model.modify_tensors, after Mamba2Model's A = -exp(A_log)), in its order; each
# glob covers the bias too, as the converter's name test does
_ZXBCDT = ("0", "di", "2*di", "2*di+ng*ds", "2*di+2*ng*ds", "2*di+2*ng*ds+nm")
_FALCON_H1_CONVERT = (
    Convert("blk.*.ssm_a", "neg_exp"),
    Convert("blk.*.ffn_down.*", "scale", factors=("mlp_multipliers[1]",)),
    Convert("blk.*.ffn_gate.*", "scale", factors=("mlp_multipliers[0]",)),
    Convert("blk.*.attn_k.*", "scale", factors=("key_multiplier", "attention_in_multiplier")),
    Convert("blk.*.attn_q.*", "scale", factors=("attention_in_multiplier",)),
    Convert("blk.*.attn_v.*", "scale", factors=("attention_in_multiplier",)),
    Convert("blk.*.attn_output.*", "scale", factors=("attention_out_multiplier",)),
    Convert("blk.*.ssm_out.*", "scale", factors=("ssm_out_multiplier",)),
    Convert("blk.*.ssm_in.*", "scale", factors=("ssm_in_multiplier",)),
) + tuple(Convert("blk.*.ssm_in.*", "scale", factors=(f"ssm_multipliers[{k}]",), rows=(_ZXBCDT[k], _ZXBCDT[k + 1]))
          for k in range(5)) + (
    Convert("output.weight", "scale", factors=("lm_head_multiplier",)),
    Convert("token_embd.weight", "scale", factors=("embedding_multiplier",)),
)
_F.append(
    # TII Falcon-H1: every layer runs GQA attention and a Mamba2 mixer in parallel on the same normed input (their
    # outputs summed), then a SwiGLU MLP; the muP multipliers (embedding, lm_head, key, attention in / out, ssm in /
    # out, mlp gate / down, ssm_multipliers per z / x / B / C / dt segment of in_proj) folded into the weights as
    # llama.cpp's converter folds them (archs Convert "scale"), so the graph applies none; the gated norm optional
    # (mamba_rms_norm); the FFN norm named blk.N.ffn_norm, without ".weight", as the converter names it
    Family("falcon_h1", "FALCON_H1", _FALCON_H1_LAYER,
           (t("model.embed_tokens.weight", "V", "H", kind="w"), t("model.final_layernorm.weight", "H"),
            t("lm_head.weight", "V", "H", when="!tied")),
           defaults={"tie_word_embeddings": False, "vocab_size": 128000, "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, **_FALCON_MULT},  # FalconH1Config's
           flags=lambda cfg, d: {"qkv_bias": bool(cfg.get("attention_bias")), "o_bias": bool(cfg.get("attention_bias")),
                                 "mlp_bias": bool(cfg.get("mlp_bias")),
                                 "conv_bias": cfg.get("mamba_conv_bias") is not False,
                                 "proj_bias": bool(cfg.get("mamba_proj_bias")),
                                 "projectors_bias": bool(cfg.get("projectors_bias")),
                                 "rms_norm": bool(cfg.get("mamba_rms_norm"))},
           classes=("FalconH1ForCausalLM",), renames=((r"\.mamba\.dt_bias$", ".mamba.dt_proj.bias"),),
           reshape=(("blk.*.ssm_a", ("nm", 1)), ("blk.*.ssm_d", ("nm", 1)), ("blk.*.ssm_norm.weight", ("ng", "gs"))),
           blocks=Blocks("layers_block_type", {"hybrid": "attn+mamba2"}, default="attn+mamba2", record="all",
                         state="(ck-1)*(di+2*ng*ds)+ds*di", flops="2*ck*(di+2*ng*ds)+5*ds*di",
                         gguf_dims=(("ck", "ssm.conv_kernel"), ("ds", "ssm.state_size"), ("ng", "ssm.group_count"),
                                    ("di", "ssm.inner_size"))),
           more_dims=_falcon_h1_dims, conv_kernels=("blk.*.ssm_conv1d.weight",),
           squeeze=(("blk.*.ssm_conv1d.weight", 1),), convert=_FALCON_H1_CONVERT,
           forward=Forward(smooth=(Smooth(("attn_q", "attn_k", "attn_v", "ssm_in"), norm="attn_norm"), SMOOTH_DOWN))),
)


# Nemotron-H's layer letters (hybrid_override_pattern) and transformers 5's names (layers_block_type) -> block types
_NH_NAMES = {"M": "mamba2", "*": ATTN, "-": "mlp", "E": "moe", "linear_attention": "mamba2", "full_attention": ATTN,
             "mlp": "mlp", "moe": "moe"}


def _nemotron_variant(cfg: Mapping) -> str | None:
    """nemotron_h_moe when the layer pattern holds an MoE block (llama.cpp's second GGUF architecture); else None.
    (llama.cpp's converter asks whether num_experts_per_tok is in the config, which transformers 5's NemotronHConfig
    always fills in: the pattern is what says it.)"""
    lt, pat = cfg.get("layers_block_type"), cfg.get("hybrid_override_pattern")
    items = lt if isinstance(lt, list) else (pat if isinstance(pat, str) else ())
    return "nemotron_h_moe" if any(isinstance(x, str) and _NH_NAMES.get(x) == "moe" for x in items) else None


def _nemotron_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """Nemotron-H's Mamba2 mixer (transformers' NemotronHMamba2Mixer): ``nm`` heads (mamba_num_heads) of ``pd``
    (mamba_head_dim), d_inner ``di`` = nm x pd (not expand x hidden: llama.cpp's converter takes the heads too),
    ``ng`` groups (n_groups) of B and C of ``ds`` (ssm_state_size), the conv kernel ``ck`` (conv_kernel) over
    ``cc`` = di + 2 ng ds channels, the gated norm's group ``gs`` = di / ng. An MoE model's FFN blocks are all MoE
    (llama.cpp's nemotron_h_moe builds every FFN block as one); the latent MoE (moe_latent_size) is not supported."""
    get = _config_int(cfg, where)

    if cfg.get("layers_block_type") is None and cfg.get("hybrid_override_pattern") is None:
        raise SourceError(f"{where}: neither 'hybrid_override_pattern' nor 'layers_block_type' is given: the layer "
                          "pattern of a Nemotron-H model is its config's; fix the config")
    nm, pd = get("mamba_num_heads", 128, 1 << 16), get("mamba_head_dim", 64)
    ng, ds, ck = get("n_groups", 8, 1 << 16), get("ssm_state_size", 128), get("conv_kernel", 4, 1024)
    for key, v in (("mamba_num_heads", nm), ("mamba_head_dim", pd), ("n_groups", ng), ("ssm_state_size", ds)):
        if v == 0:
            raise SourceError(f"{where}: '{key}' is 0; fix the config")
    di = nm * pd
    if di + 2 * ng * ds > MAX_WIDTH:
        raise SourceError(f"{where}: the Mamba2 width ('mamba_num_heads' x 'mamba_head_dim' + 2 x 'n_groups' x "
                          f"'ssm_state_size' = {di + 2 * ng * ds}) is beyond any real model (cap {MAX_WIDTH}); "
                          "fix the config")
    if ck < 2:
        raise SourceError(f"{where}: 'conv_kernel' = {ck}: the convolution needs at least 2 taps; fix the config")
    if nm % ng:
        raise SourceError(f"{where}: 'n_groups' = {ng} does not divide 'mamba_num_heads' = {nm} (each group serves "
                          "whole heads); fix the config")
    if cfg.get("moe_latent_size") is not None:
        raise SourceError(f"{where}: 'moe_latent_size' is set: the latent MoE projections (Nemotron 3 Super) are not "
                          "supported yet")
    lt, pat = cfg.get("layers_block_type"), cfg.get("hybrid_override_pattern")
    items = lt if isinstance(lt, list) else (pat if isinstance(pat, str) else ())  # other types: _layer_blocks says
    kinds = {_NH_NAMES.get(x) for x in items if isinstance(x, str)}
    if "moe" in kinds and "mlp" in kinds:
        raise SourceError(f"{where}: the layer pattern mixes MLP ('-', mlp) and MoE ('E', moe) blocks: llama.cpp's "
                          "nemotron_h_moe builds every FFN block as MoE; fix the config")
    if "moe" in kinds and not (d["E"] and d["Im"] and d["Is"]):
        raise SourceError(f"{where}: MoE blocks ('E') need 'n_routed_experts', 'moe_intermediate_size' and "
                          "'moe_shared_expert_intermediate_size'; fix the config")
    return {"nm": nm, "pd": pd, "di": di, "ng": ng, "ds": ds, "ck": ck, "cc": di + 2 * ng * ds, "gs": di // ng}


NB = "backbone.layers.{i}."
_NEMOTRON_LAYER = (
    t(NB + "norm.weight", "H"),  # the one pre-norm of every block (GGUF attn_norm)
) + _mamba2_tensors(NB + "mixer.") + (
    t(NB + "mixer.q_proj.weight", "nh*hd", "H", when="attn"), t(NB + "mixer.k_proj.weight", "nkv*hd", "H", when="attn"),
    t(NB + "mixer.v_proj.weight", "nkv*hd", "H", when="attn"), t(NB + "mixer.o_proj.weight", "H", "nh*hd", when="attn"),
    t(NB + "mixer.up_proj.weight", "I", "H", when="mlp"), t(NB + "mixer.up_proj.bias", "I", when="mlp mlp_bias"),
    t(NB + "mixer.down_proj.weight", "H", "I", when="mlp"), t(NB + "mixer.down_proj.bias", "H", when="mlp mlp_bias"),
    t(NB + "mixer.gate.weight", "E", "H", when="moe"),
    t(NB + "mixer.gate.e_score_correction_bias", "E", when="moe", kind="bias"),
    t(NB + "mixer.experts.{e}.up_proj.weight", "Im", "H", when="moe", experts=True),
    t(NB + "mixer.experts.{e}.down_proj.weight", "H", "Im", when="moe", experts=True),
    t(NB + "mixer.shared_experts.up_proj.weight", "Is", "H", when="moe"),
    t(NB + "mixer.shared_experts.down_proj.weight", "H", "Is", when="moe"),
)
_NEMOTRON_DEFAULTS = {"tie_word_embeddings": False, "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 21504,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "layer_norm_epsilon": 1e-5}  # NemotronHConfig's
_F.append(
    # NVIDIA Nemotron-H (NemotronHForCausalLM; Nemotron-H-8B, Nemotron-Nano-9B/12B-v2): every layer ONE block, chosen by
    # hybrid_override_pattern (M Mamba2, * NoPE GQA attention, - a squared-ReLU MLP of up / down) or transformers 5's
    # layers_block_type, each block with its own pre-norm and residual. llama.cpp's converter (NemotronHModel, a
    # GraniteHybridModel) names them as Granite-4.0-H's: conv squeezed, A = -exp(A_log), A and D (H, 1), the gated norm
    # (G, D / G); per-layer head_count_kv and feed_forward_length (neither: a Mamba2 layer)
    Family("nemotron_h", "NEMOTRON_H", _NEMOTRON_LAYER,
           (t("backbone.embeddings.weight", "V", "H", kind="w"), t("backbone.norm_f.weight", "H"),
            t("lm_head.weight", "V", "H", when="!tied")),
           keys={"n_experts": (), "n_experts_used": (), "moe_intermediate": ()},  # NemotronHConfig's MoE defaults
           # are in every config transformers 5 saves: a model without MoE blocks has no experts
           defaults=_NEMOTRON_DEFAULTS,
           flags=lambda cfg, d: {"conv_bias": cfg.get("use_conv_bias") is not False,
                                 "proj_bias": bool(cfg.get("use_bias")), "mlp_bias": bool(cfg.get("mlp_bias"))},
           classes=("NemotronHForCausalLM",),
           renames=((r"\.mixer\.dt_bias$", ".mixer.dt.bias"),
                    (r"^backbone\.layers\.(\d+)\.mixer\.gate\.e_score_correction_bias$", r"blk.\1.exp_probs_b.bias")),
           reshape=(("blk.*.ssm_a", ("nm", 1)), ("blk.*.ssm_d", ("nm", 1)), ("blk.*.ssm_norm.weight", ("ng", "gs"))),
           blocks=Blocks("layers_block_type", _NH_NAMES, pattern="hybrid_override_pattern", record="kv_heads_ffn",
                         parts={"mamba2": "mixer", ATTN: "mixer", "mlp": "ffn", "moe": "ffn"},
                         state=_MAMBA2_STATE, flops=_MAMBA2_FLOPS, gguf_dims=_MAMBA2_GGUF_DIMS),
           more_dims=_nemotron_dims, conv_kernels=("blk.*.ssm_conv1d.weight",),
           squeeze=(("blk.*.ssm_conv1d.weight", 1),), convert=(Convert("blk.*.ssm_a", "neg_exp"),),
           variant=_nemotron_variant,
           forward=Forward(act="relu2", act_key="mlp_hidden_act", mlp="plain", rope_layers="none",
                           router="sigmoid", router_groups="top2sum", router_scale=True,
                           # a layer's one norm feeds its one block's input matrices (relu2 leaves down alone)
                           smooth=(Smooth(("attn_q", "attn_k", "attn_v", "ssm_in", "ffn_up"), norm="attn_norm",
                                          blockers=_MOE),))),
)
_NEMOTRON = _F[-1]
_F.append(
    # Nemotron-H MoE (NVIDIA-Nemotron-3-Nano-30B-A3B: 'E' blocks): the FFN blocks are a DeepSeek-V3-style sigmoid router
    # (e_score_correction_bias, GGUF exp_probs_b; top-k normalised, times routed_scaling_factor) over squared-ReLU
    # up / down experts, plus an always-on shared expert; llama.cpp's architecture nemotron_h_moe
    replace(_NEMOTRON, name="nemotron_h_moe", gguf="NEMOTRON_H_MOE", variant=None, classes=(),
            keys={"n_experts": ("n_routed_experts",), "intermediate": ("moe_intermediate_size",),
                  "shared_intermediate": ("moe_shared_expert_intermediate_size",)},
            defaults={**_NEMOTRON_DEFAULTS, "norm_topk_prob": True, "routed_scaling_factor": 1.0}),
)

# Qwen3-Next's Gated DeltaNet (transformers' Qwen3NextGatedDeltaNet): q, k, v and the gate z in one projection, beta
# and alpha in another, both per key head ([q, k, v, z] and [b, a] groups: fix_query_key_value_ordering)
_DELTANET_FUSED = (
    t(P + "linear_attn.in_proj_qkvz.weight", "cc+di", "H", when="deltanet"),
    t(P + "linear_attn.in_proj_ba.weight", "2*nv", "H", when="deltanet"),
) + tuple(x for x in _DELTANET if ".in_proj_" not in x.name)
# the converter's layout (Qwen3NextModel.modify_tensors; not a _LinearAttentionVReorderBase, so no value head moves):
# in_proj_qkvz split into attn_qkv (every key head's q rows, then every k, then every v: value heads stay grouped) and
# attn_gate (z); in_proj_ba kept fused (ssm_ba); A negated
_QKVZ_SPLIT = Split("blk.*.ssm_in.weight", "ssm_in", ("attn_qkv", "attn_gate"), groups="nk",
                    blocks=("dk", "dk", "vper*dv", "vper*dv"), picks=((0, 1, 2), (3,)))
_F.append(
    # Qwen3-Next: Gated DeltaNet and gated-attention layers (layer_types, or every full_attention_interval-th), each
    # FFN a softmax top-k MoE (norm_topk_prob) with a sigmoid-gated shared expert, or a SwiGLU MLP on the layers
    # mlp_only_layers / decoder_sparse_step leave dense (transformers builds them; llama.cpp's converter maps no dense
    # FFN for qwen3next, and its loader wants a router in every layer); (1 + w) norms as Qwen3.5's
    Family("qwen3_next", "QWEN3NEXT", _NORMS + _DELTANET_FUSED + _GATED_ATTN + _Q35_MOE_FFN + _MLP, _llama_top(),
           moe="qwen", classes=("Qwen3NextForCausalLM",), renames=_Q35_RENAMES,
           defaults={"tie_word_embeddings": False, "vocab_size": 151936, "hidden_size": 2048,
                     "intermediate_size": 5632, "num_hidden_layers": 48, "num_attention_heads": 16,
                     "num_key_value_heads": 2, "head_dim": 256, "moe_intermediate_size": 512,
                     "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10,
                     "norm_topk_prob": True, "partial_rotary_factor": 0.25},  # Qwen3NextConfig's
           blocks=_DELTANET_BLOCKS, more_dims=_qwen35_dims, conv_kernels=("blk.*.ssm_conv1d.weight",),
           squeeze=(("blk.*.ssm_conv1d.weight", 1),), convert=(Convert("blk.*.ssm_a", "neg_exp"),),
           split=(_QKVZ_SPLIT,),
           forward=replace(_FWD_QWEN35, vheads="grouped", beta_alpha="fused", shared_gate=True,
                           router_norm_gguf="always",  # qwen3next.cpp normalises; the converter writes no key
                           smooth=(Smooth(("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_gate", "ssm_ba"),
                                          norm="attn_norm"),) + _FWD_QWEN35.smooth[1:])),
)

def _rwkv7_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """RWKV7 (fla-hub's RWKV7ForCausalLM, as Rwkv7Model reads it): the wkv head size ``hs`` (head_size or head_dim)
    and ``nwh`` = H / hs heads of the recurrent state; the LoRA ranks of the decay ``rw``, the in-context learning
    rate ``ra``, the value residual ``rv`` and the gate ``rg`` (the converter's calc_lora_rank when null: a multiple
    of 32 near H^e x m); the channel mix's width ``I`` (4 H when null). No attention: heads, KV heads and head_dim
    are 0, as the converter's head_count ("required by llama.cpp, unused")."""
    get = _config_int(cfg, where)
    H, hs = d["H"], d["nh"]
    if hs == 0 or H % hs:
        raise SourceError(f"{where}: the wkv head size ('head_size' / 'head_dim') = {hs} does not divide "
                          f"'hidden_size' = {H}; fix the config")
    for key, want in (("wkv_has_gate", True), ("norm_first", True), ("norm_bias", True)):
        if cfg.get(key, want) is not want:  # llama.cpp's rwkv7 loads a gate, the first layer's pre-norm, norm biases
            raise SourceError(f"{where}: '{key}' = {escape_name(repr(cfg.get(key)), 20)}: llama.cpp's rwkv7 needs "
                              f"{str(want).lower()}; not supported")

    def rank(keys: tuple[str, str], e: float, m: float) -> int:
        k = next((k for k in keys if cfg.get(k) is not None), None)
        return get(k, 0, MAX_WIDTH) if k else max(1, round(H ** e * m / 32)) * 32  # Rwkv7Model.calc_lora_rank

    return {"hs": hs, "nwh": H // hs, "nh": 0, "nkv": 0, "hd": 0, "I": d["I"] or 4 * H,
            "rw": rank(("lora_rank_decay", "decay_low_rank_dim"), 0.5, 1.8),
            "ra": rank(("lora_rank_iclr", "a_low_rank_dim"), 0.5, 1.8),
            "rv": rank(("lora_rank_value_residual_mix", "v_low_rank_dim"), 0.5, 1.3),
            "rg": rank(("lora_rank_gate", "gate_low_rank_dim"), 0.8, 0.6)}


R7 = "model.layers.{i}."
_RWKV7_LAYER = (
    t(R7 + "attn_norm.weight", "H"), t(R7 + "attn_norm.bias", "H"),
    *(t(R7 + f"attn.x_{c}", 1, 1, "H", kind="bias") for c in "rwkvag"),
    t(R7 + "attn.k_k", 1, 1, "H", kind="norm"), t(R7 + "attn.k_a", 1, 1, "H", kind="norm"),
    t(R7 + "attn.r_k", "nwh", "hs", kind="bias"),
    *(t(R7 + f"attn.{c}_proj.weight", "H", "H") for c in "rkvo"),
    t(R7 + "attn.w_lora.lora.0.weight", "rw", "H"), t(R7 + "attn.w_lora.lora.2.weight", "H", "rw"),
    t(R7 + "attn.w_lora.lora.2.bias", "H"),
    t(R7 + "attn.a_lora.lora.0.weight", "ra", "H"), t(R7 + "attn.a_lora.lora.2.weight", "H", "ra"),
    t(R7 + "attn.a_lora.lora.2.bias", "H"),
    t(R7 + "attn.v_lora.lora.0.weight", "rv", "H", when="vres"), t(R7 + "attn.v_lora.lora.2.weight", "H", "rv",
                                                                    when="vres"),
    t(R7 + "attn.v_lora.lora.2.bias", "H", when="vres"),
    t(R7 + "attn.g_lora.lora.0.weight", "rg", "H"), t(R7 + "attn.g_lora.lora.2.weight", "H", "rg"),
    t(R7 + "attn.g_norm.weight", "H"), t(R7 + "attn.g_norm.bias", "H"),
    t(R7 + "ffn_norm.weight", "H"), t(R7 + "ffn_norm.bias", "H"),
    t(R7 + "ffn.x_k", "H", kind="bias"), t(R7 + "ffn.key.weight", "I", "H"), t(R7 + "ffn.value.weight", "H", "I"),
)
_RW = r"^model\.layers\.(\d+)\."
_F.append(
    # RWKV7 (fla-hub/rwkv7-*-world, RWKV7ForCausalLM), every layer recurrent: a time mix (token shift into six
    # lerps r w k v a g, fused by the converter into time_mix_lerp_fused; receptance / key / value / output
    # projections; LoRA pairs for the decay w, the in-context learning rate a, the value residual v (from layer 1:
    # a lerp towards layer 0's values) and the gate g; k_k, k_a, r_k; the wkv7 delta-rule state of H x head size
    # floats; a LayerNorm per head, the group norm ln_x) and a channel mix (a token-shift lerp, squared-ReLU key,
    # value), LayerNorms with biases, layer 0's pre-norm on the embeddings. The converter drops layer 0's value LoRA
    # (unused) and writes its a0/a1/a2 a second time as v0/v1/v2, which llama.cpp loads and never uses; its
    # quantizer keeps the LoRA factors float (keepfloat.py). State per layer and sequence: the two token shifts
    # (2 H) and the wkv state (H x hs), llama.cpp's n_embd_r() + n_embd_s()
    Family("rwkv7", "RWKV7", _RWKV7_LAYER,
           (t("model.embeddings.weight", "V", "H"), t("model.layers.0.pre_norm.weight", "H"),
            t("model.layers.0.pre_norm.bias", "H"), t("model.norm.weight", "H"), t("model.norm.bias", "H"),
            t("lm_head.weight", "V", "H", when="!tied")),
           classes=("RWKV7ForCausalLM", "Rwkv7ForCausalLM"),
           keys={"heads": ("head_size", "head_dim")}, defaults={"tie_word_embeddings": False},
           renames=((_RW + r"attn\.x_([rwkvag])$", r"blk.\1.time_mix_lerp_\2.weight"),
                    (_RW + r"attn\.(k_k|k_a|r_k)$", r"blk.\1.time_mix_\2.weight"),
                    (_RW + r"attn\.r_proj\.weight$", r"blk.\1.time_mix_receptance.weight"),
                    (_RW + r"attn\.k_proj\.weight$", r"blk.\1.time_mix_key.weight"),
                    (_RW + r"attn\.v_proj\.weight$", r"blk.\1.time_mix_value.weight"),
                    (_RW + r"attn\.o_proj\.weight$", r"blk.\1.time_mix_output.weight"),
                    (_RW + r"attn\.([wavg])_lora\.lora\.0\.weight$", r"blk.\1.time_mix_\g<2>1.weight"),
                    (_RW + r"attn\.([wavg])_lora\.lora\.2\.weight$", r"blk.\1.time_mix_\g<2>2.weight"),
                    (_RW + r"attn\.([wav])_lora\.lora\.2\.bias$", r"blk.\1.time_mix_\g<2>0.weight"),
                    (_RW + r"attn\.g_norm\.", r"blk.\1.time_mix_ln."),
                    (_RW + r"attn_norm\.", r"blk.\1.attn_norm."),
                    (_RW + r"ffn_norm\.", r"blk.\1.attn_norm_2."),
                    (_RW + r"ffn\.x_k$", r"blk.\1.channel_mix_lerp_k.weight"),
                    (_RW + r"ffn\.key\.weight$", r"blk.\1.channel_mix_key.weight"),
                    (_RW + r"ffn\.value\.weight$", r"blk.\1.channel_mix_value.weight")),
           skip=((r"^model\.layers\.0\.attn\.v_lora\.", "layer 0's value-residual LoRA (attn.v_lora): unused (the "
                  "residual is layer 0's own values); llama.cpp's converter drops it"),),
           stack=(Stack("blk.*.time_mix_lerp_fused.weight", "lerp_fused",
                        tuple(f"lerp_{c}" for c in "rwkvag")),),
           copies=tuple((f"blk.0.time_mix_v{j}.weight", f"blk.0.time_mix_a{j}.weight") for j in range(3)),
           reshape=tuple((f"blk.*.{n}.weight", ("H",)) for n in ("time_mix_k_k", "time_mix_k_a", "time_mix_r_k",
                                                                   "channel_mix_lerp_k")),
           layer_flags=lambda cfg, d, i: {"vres": i > 0},
           blocks=Blocks("layer_types", {"rwkv7": "rwkv7"}, default="rwkv7", record="all", state="2*H+H*hs",
                         gguf_dims=(("hs", "wkv.head_size"),), flops="9*H*hs"),
           more_dims=_rwkv7_dims,
           # (rope.dimension_count 0: no attention, no RoPE; the config's head_dim is the wkv head size)
           record=(("context_length", "1048576", ""), ("attention.head_count", "0", ""), ("wkv.head_size", "hs", ""),
                   ("rope.dimension_count", "hd", ""),
                   ("attention.decay_lora_rank", "rw", ""), ("attention.iclr_lora_rank", "ra", ""),
                   ("attention.value_residual_mix_lora_rank", "rv", ""), ("attention.gate_lora_rank", "rg", "")),
           forward=Forward(norm="layer", act="relu2", act_key="", mlp="plain", ffn_norm="attn_norm_2",
                           embed_norm="token_embd_norm", ffn="channel_mix", smooth=())),
)


def _gemma4_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """Gemma 4 (transformers' Gemma4TextConfig): sliding layers of ``hs`` = head_dim with ``nks`` KV heads, full
    layers of ``hf`` = global_head_dim with ``nkf`` (num_global_key_value_heads when attention_k_eq_v, else the
    sliding count); the last ``nshared`` = num_kv_shared_layers layers reuse the K/V of the last earlier layer of
    their type; per-layer embeddings of ``hpl`` = hidden_size_per_layer_input (0: none) over ``Vpl`` =
    vocab_size_per_layer_input tokens, ``plw`` = L x hpl wide; the double-wide MLP (``I0`` x 2 = ``Iw`` on the
    KV-sharing layers). ``hd`` / ``nkv`` become the full layers' (llama.cpp's key_length, the largest head_count_kv)
    and ``I`` the widest FFN (the largest feed_forward_length), as the converter's GGUF states them."""
    get = _config_int(cfg, where)

    L, nks, hs = d["L"], d["nkv"], d["hd"]
    kinds = _gemma4_kinds(cfg, L, where)
    k_eq_v = cfg.get("attention_k_eq_v") is True
    hf = get("global_head_dim", 512)
    nkf = get("num_global_key_value_heads", nks, 4096) if k_eq_v else nks
    plc = cfg.get("per_layer_config")  # as transformers saves it: {layer: {head_dim, num_key_value_heads}}
    if plc is not None and cfg.get("global_head_dim") is None:
        if not isinstance(plc, Mapping) or not all(isinstance(v, Mapping) for v in plc.values()):
            raise SourceError(f"{where}: 'per_layer_config' must map layers to objects; fix the config")
        full = [plc[k] for k in plc if str(k).isdigit() and int(k) < L and kinds[int(k)] == "full_attention"]
        if full:  # the converter's reading: the first full layer's
            hf = _int(full[0].get("head_dim", hf), "per_layer_config.head_dim", where, cap=MAX_WIDTH)
            nkf = _int(full[0].get("num_key_value_heads", nks), "per_layer_config.num_key_value_heads", where,
                       cap=4096)
            if any(x.get("head_dim", hf) != hf or x.get("num_key_value_heads", nkf) != nkf for x in full):
                raise SourceError(f"{where}: 'per_layer_config' gives the full layers different head sizes; "
                                  "orkpack (and llama.cpp's converter) take one; fix the config")
    nshared = get("num_kv_shared_layers", 0, CAPS["n_layers"])
    if nshared > L:
        raise SourceError(f"{where}: 'num_kv_shared_layers' = {nshared} is more than the {L} layers; fix the config")
    hpl = cfg.get("hidden_size_per_layer_input", 256)
    hpl = _int(hpl or 0, "hidden_size_per_layer_input", where)
    vpl = get("vocab_size_per_layer_input", 262144, CAP_DEFAULT)
    if hf == 0 or nkf == 0:
        raise SourceError(f"{where}: 'global_head_dim' and the full layers' KV heads must be positive; fix the config")
    if max(d["nh"] * hf, nkf * hf, L * hpl) > MAX_WIDTH:
        raise SourceError(f"{where}: the full layers' heads x 'global_head_dim' or the layers x "
                          f"'hidden_size_per_layer_input' is beyond any real model (cap {MAX_WIDTH}); fix the config")
    first = L - nshared
    if nshared and set(kinds[first:]) - set(kinds[:first]):
        raise SourceError(f"{where}: a KV-sharing layer's type ('layer_types') has no earlier layer of that type to "
                          "reuse; fix the config")
    wide = cfg.get("use_double_wide_mlp") is True and nshared > 0
    I0 = d["I"]
    moe = {} if cfg.get("enable_moe_block") is True else {"E": 0, "top_k": 0, "Im": 0}  # experts only in MoE blocks
    return {"hs": hs, "nks": nks, "hf": hf, "nkf": nkf, "hd": hf, "nkv": max(nks, nkf), "nshared": nshared,
            "hpl": hpl, "Vpl": vpl, "plw": L * hpl, "I0": I0, "Iw": 2 * I0 if wide else I0,
            "I": 2 * I0 if wide else I0, "kinds": tuple(kinds), "k_eq_v": k_eq_v,
            "kv_widths": (nkf * hf, nkf * hf, nks * hs, nks * hs), **moe}


def _gemma4_kinds(cfg: Mapping, L: int, where: str) -> list[str]:
    """Each layer's attention type (layer_types; Gemma4TextConfig's default: every 6th full, the last full)."""
    return _layer_kinds(cfg, L, 6, True, where)


def _gemma4_rope_freqs(cfg: Mapping, d: dict):
    """Gemma4Model.generate_extra_tensors: the full layers' proportional RoPE as llama.cpp's frequency factors, 1 for
    the partial_rotary_factor of the pairs that turn, 1e30 (frequency 0) for the others."""
    import numpy as np

    rp = cfg.get("rope_parameters")
    full = rp.get("full_attention") if isinstance(rp, Mapping) else None
    if not isinstance(full, Mapping) or full.get("rope_type") != "proportional":
        return None
    prf = full.get("partial_rotary_factor", 1.0)
    if isinstance(prf, bool) or not isinstance(prf, (int, float)) or not 0 <= prf <= 1:
        raise SourceError("config.json: 'rope_parameters.full_attention.partial_rotary_factor' must be a "
                          "number in 0..1; fix the config")
    n = int(d["hf"] * prf / 2)
    return np.array([1.0] * n + [1e30] * (d["hf"] // 2 - n), dtype=np.float32)


def _gemma4_layer(cfg: Mapping, d: dict, i: int) -> dict:
    """Gemma 4's per-layer flags: its attention type, whether it reuses earlier K/V, keys-as-values, the wide MLP."""
    full = d["kinds"][i] == "full_attention"
    shared = i >= d["L"] - d["nshared"]
    return {"full": full, "swa_layer": not full, "kv_own": not shared,
            "v_own": not shared and not (full and d["k_eq_v"]),
            "wide": shared and d["Iw"] != d["I0"]}


def _gemma4_attn(kind: str, hd: str, nkv: str) -> tuple[T, ...]:
    return (
        t(P + "self_attn.q_proj.weight", f"nh*{hd}", "H", when=kind),
        t(P + "self_attn.k_proj.weight", f"{nkv}*{hd}", "H", when=kind + " kv_own"),
        t(P + "self_attn.v_proj.weight", f"{nkv}*{hd}", "H", when=kind + " v_own"),
        t(P + "self_attn.o_proj.weight", "H", f"nh*{hd}", when=kind),
        t(P + "self_attn.q_norm.weight", hd, when=kind), t(P + "self_attn.k_norm.weight", hd, when=kind + " kv_own"),
    )


# Gemma 4: sandwich norms (plain RMS gains: Gemma4RMSNorm has no 1 + w), sliding layers and full layers each with their
# own head size, KV heads and RoPE (the full layers' proportional RoPE over partial_rotary_factor of the head), q/k/v
# RMS-normed per head (v without a gain), scores unscaled; full layers without v_proj take the keys as values
# (attention_k_eq_v); per-layer embeddings; every layer's output times its layer_scalar
_GEMMA4_LAYER = (
    _NORMS + _GEMMA2_NORMS + _gemma4_attn("swa_layer", "hs", "nks") + _gemma4_attn("full", "hf", "nkf") + (
        t(P + "mlp.gate_proj.weight", "I0", "H", when="!wide"), t(P + "mlp.up_proj.weight", "I0", "H", when="!wide"),
        t(P + "mlp.down_proj.weight", "H", "I0", when="!wide"),
        t(P + "mlp.gate_proj.weight", "Iw", "H", when="wide"), t(P + "mlp.up_proj.weight", "Iw", "H", when="wide"),
        t(P + "mlp.down_proj.weight", "H", "Iw", when="wide"),
        t(P + "per_layer_input_gate.weight", "hpl", "H", when="ple"),
        t(P + "per_layer_projection.weight", "H", "hpl", when="ple"),
        t(P + "post_per_layer_input_norm.weight", "H", when="ple"),
        t(P + "layer_scalar", 1, kind="norm"),
        # enable_moe_block (26B-A4B): experts beside the dense MLP, each with its own norms
        t(P + "router.proj.weight", "E", "H", when="moe"), t(P + "router.scale", "H", when="moe", kind="norm"),
        t(P + "router.per_expert_scale", "E", when="moe", kind="norm"),
        t(P + "experts.gate_up_proj", "E", "2*Im", "H", when="moe"),
        t(P + "experts.down_proj", "E", "H", "Im", when="moe"),
        t(P + "pre_feedforward_layernorm_2.weight", "H", when="moe"),
        t(P + "post_feedforward_layernorm_1.weight", "H", when="moe"),
        t(P + "post_feedforward_layernorm_2.weight", "H", when="moe"),
    ))
_GEMMA4_TOP = _llama_top() + (
    t("model.embed_tokens_per_layer.weight", "Vpl", "plw", when="ple", kind="w"),
    t("model.per_layer_model_projection.weight", "plw", "H", when="ple"),
    t("model.per_layer_projection_norm.weight", "hpl", when="ple"),
)
_FWD_GEMMA4 = Forward(block="sandwich", act="gelu_tanh", act_key="hidden_activation", embed_scale="sqrt_hidden",
                      qk_norm="head", v_norm=True, attn_scale="unit", swa_rope_base=10000.0, per_layer_input=True,
                      moe_beside_mlp=True, router_norm="always", smooth=(SMOOTH_ATTN,))
_GEMMA4_DEFAULTS = {"tie_word_embeddings": True, "vocab_size": 262144, "hidden_size": 2304, "intermediate_size": 9216,
                    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "sliding_window": 512}  # Gemma4TextConfig's
_F.append(
    Family("gemma4_text", "GEMMA4", _GEMMA4_LAYER, _GEMMA4_TOP, swa="layer_types", defaults=_GEMMA4_DEFAULTS,
           classes=("Gemma4ForCausalLM",), more_dims=_gemma4_dims, layer_flags=_gemma4_layer,
           keys={"n_experts_used": ("top_k_experts",)},
           flags=lambda cfg, d: {"ple": d["hpl"] > 0},
           renames=((r"\.layer_scalar$", ".layer_scalar.weight"),
                    (r"\.experts\.(gate_up_proj|down_proj)$", r".experts.\1.weight"),
                    (r"^model\.layers\.(\d+)\.router\.scale$", r"blk.\1.ffn_gate_inp.scale"),
                    (r"^model\.layers\.(\d+)\.router\.per_expert_scale$", r"blk.\1.ffn_down_exps.scale")),
           lookups=("per_layer_token_embd.weight",), kv_shared="nshared",
           generated=(("rope_freqs.weight", _gemma4_rope_freqs),), forward=_FWD_GEMMA4),
)
_GEMMA4 = _F[-1]


def generated_tensors(cfg: Mapping[str, Any], where: str = "config.json") -> dict:
    """{canonical name: float32 array} of the tensors the converter computes from this config (``Family.generated``)."""
    fam = config_family(cfg) if isinstance(cfg, Mapping) else None
    if fam is None or not fam.generated:
        return {}
    d = _dims(cfg, fam, where)
    tc = _text_config(cfg, fam, where)
    out = {}
    for name, fn in fam.generated:
        a = fn(tc, d)
        if a is not None:
            out[name] = a
    return out
# a release (Gemma4ForConditionalGeneration): the text model under model.language_model., the vision and audio towers
# and their embedders beside it, which llama.cpp's converter writes to a separate mmproj GGUF: left out by name
_GEMMA4_MM_SKIP = ((r"^model\.(?:vision_tower|audio_tower|embed_vision|embed_audio)\.",
                    "the vision / audio towers and their embedders (model.vision_tower.*, model.audio_tower.*, "
                    "model.embed_vision.*, model.embed_audio.*): llama.cpp's converter writes them to a separate "
                    "mmproj GGUF; this pack holds the text model"),)
_F.append(replace(_multimodal(_GEMMA4, "gemma4", "Gemma4ForConditionalGeneration"),
                  skip=_GEMMA4_MM_SKIP + _GEMMA4.skip))



def _gemma3n_dims(cfg: Mapping, d: dict, where: str) -> dict:
    """Gemma 3n (transformers' Gemma3nTextConfig): one head size for every layer; the last ``nshared`` =
    num_kv_shared_layers layers reuse the K/V of the last earlier layer of their type; per-layer embeddings of
    ``hpl`` = hidden_size_per_layer_input over ``Vpl`` = vocab_size_per_layer_input tokens (``plw`` = L x hpl wide);
    AltUp over ``na`` = altup_num_inputs streams (the active one ``altup_active_idx``); LAuReL of rank ``lr`` =
    laurel_rank; ``sparsity``: each layer's activation_sparsity_pattern (the MLP's gaussian top-k target, 0: none;
    the config class's default: 0.95 on the first 10 layers of a model of more than 10)."""
    get = _config_int(cfg, where)
    L = d["L"]
    kinds = _layer_kinds(cfg, L, 5, False, where)
    nshared = get("num_kv_shared_layers", 15, CAPS["n_layers"])
    if nshared > L:
        raise SourceError(f"{where}: 'num_kv_shared_layers' = {nshared} is more than the {L} layers; fix the config")
    first = L - nshared
    if nshared and set(kinds) - set(kinds[:first]):
        raise SourceError(f"{where}: a KV-sharing layer's type ('layer_types') has no earlier layer of that type to "
                          "reuse; fix the config")
    hpl, vpl = get("hidden_size_per_layer_input", 256), get("vocab_size_per_layer_input", 262144, CAP_DEFAULT)
    na, lr = get("altup_num_inputs", 4, 64), get("laurel_rank", 64)
    active = get("altup_active_idx", 0, 64)
    if not 0 <= active < na:
        raise SourceError(f"{where}: 'altup_active_idx' = {active} is not one of the {na} AltUp streams "
                          "('altup_num_inputs'); fix the config")
    if L * hpl > MAX_WIDTH:
        raise SourceError(f"{where}: the layers x 'hidden_size_per_layer_input' = {L * hpl} is beyond any real model "
                          f"(cap {MAX_WIDTH}); fix the config")
    sp = cfg.get("activation_sparsity_pattern")
    if sp is None:
        sp = [0.95] * (10 if L > 10 else 0) + [0.0] * (L - (10 if L > 10 else 0))
    elif _number(sp):
        sp = [sp] * L
    if not (isinstance(sp, list) and len(sp) == L and all(_number(x) and 0 <= x < 1 for x in sp)):
        raise SourceError(f"{where}: 'activation_sparsity_pattern' must give a number in [0, 1) for each of the {L} "
                          "layers; fix the config")
    return {"kinds": tuple(kinds), "nshared": nshared, "hpl": hpl, "Vpl": vpl, "plw": L * hpl, "na": na,
            "active": active, "lr": lr, "sparsity": tuple(float(x) for x in sp)}


def activation_sparsity_scale(p: float) -> float:
    """A layer's activation-sparsity std multiplier as Gemma3NModel (and transformers' Gemma3nTextMLP) compute it:
    torch's float32 Normal(0, 1).icdf(p), sqrt(2) erfinv(2p - 1); -inf for p = 0 (no sparsity)."""
    import numpy as np
    from scipy.special import erfinv

    a = np.float32(2 * np.float32(p) - 1)
    return float(np.float32(np.float32(erfinv(np.float64(a))) * np.float32(math.sqrt(2))))


def _layer_kinds(cfg: Mapping, L: int, every: int, last_full: bool, where: str) -> list[str]:
    """Each layer's attention type (layer_types; the config class's default: every ``every``-th full; Gemma 4's
    forces the last layer full)."""
    lt = cfg.get("layer_types")
    if lt is None:
        lt = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(L)]
    if not (isinstance(lt, list) and len(lt) == L and all(x in ("sliding_attention", "full_attention") for x in lt)):
        raise SourceError(f"{where}: 'layer_types' must list 'sliding_attention' or 'full_attention' for each of the "
                          f"{L} layers; fix the config")
    lt = list(lt)
    if L and last_full:
        lt[-1] = "full_attention"
    return lt


def _gemma3n_layer(cfg: Mapping, d: dict, i: int) -> dict:
    """Gemma 3n's per-layer flags: whether the layer stores its own K/V."""
    return {"kv_own": i < d["L"] - d["nshared"]}


# Gemma 3n: Gemma 4's attention with one head size (q/k/v RMS-normed per head, v without a gain, scores unscaled,
# the last num_kv_shared_layers reusing earlier K/V), sandwich norms (plain gains), each layer its own FFN width
# (the first layers' gate cut at a gaussian top-k: activation sparsity), LAuReL (a low-rank residual beside the
# attention) and AltUp (the layer runs on one of altup_num_inputs streams, predicted from all of them and corrected
# after; the router reads the active one), per-layer embeddings gating the other streams
_GEMMA3N_LAYER = _NORMS + _GEMMA2_NORMS + (
    t(P + "self_attn.q_proj.weight", "nh*hd", "H"), t(P + "self_attn.k_proj.weight", "nkv*hd", "H", when="kv_own"),
    t(P + "self_attn.v_proj.weight", "nkv*hd", "H", when="kv_own"), t(P + "self_attn.o_proj.weight", "H", "nh*hd"),
    t(P + "self_attn.q_norm.weight", "hd"), t(P + "self_attn.k_norm.weight", "hd", when="kv_own"),
    t(P + "mlp.gate_proj.weight", "I", "H"), t(P + "mlp.up_proj.weight", "I", "H"),
    t(P + "mlp.down_proj.weight", "H", "I"),
    t(P + "per_layer_input_gate.weight", "hpl", "H"), t(P + "per_layer_projection.weight", "H", "hpl"),
    t(P + "post_per_layer_input_norm.weight", "H"),
    t(P + "altup.correct_output_scale", "H", kind="norm"), t(P + "altup.correction_coefs.weight", "na", "na"),
    t(P + "altup.prediction_coefs.weight", "na*na", "na"), t(P + "altup.modality_router.weight", "na", "H"),
    t(P + "altup.router_norm.weight", "H"),
    t(P + "laurel.linear_left.weight", "lr", "H"), t(P + "laurel.linear_right.weight", "H", "lr"),
    t(P + "laurel.post_laurel_norm.weight", "H"),
)
_GEMMA3N_TOP = _llama_top() + (
    t("model.embed_tokens_per_layer.weight", "Vpl", "plw", kind="w"),
    t("model.per_layer_model_projection.weight", "plw", "H"),
    t("model.per_layer_projection_norm.weight", "hpl"),
    t("model.altup_projections.{k}.weight", "H", "H", each="na-1"),
    t("model.altup_unembed_projections.{k}.weight", "H", "H", each="na-1"),
)
# the attention norm feeds LAuReL too (and LAuReL adds its input back): only the FFN's groups are smoothed
_FWD_GEMMA3N = replace(_FWD_GEMMA4, moe_beside_mlp=False, altup=True, laurel=True, act_sparsity=True,
                       smooth=(SMOOTH_FFN, SMOOTH_DOWN))
_GEMMA3N_DEFAULTS = {"tie_word_embeddings": True, "vocab_size": 262400, "hidden_size": 2048,
                     "intermediate_size": 16384, "num_hidden_layers": 35, "num_attention_heads": 8,
                     "num_key_value_heads": 2, "head_dim": 256, "sliding_window": 512}  # Gemma3nTextConfig's
_F.append(
    Family("gemma3n_text", "GEMMA3N", _GEMMA3N_LAYER, _GEMMA3N_TOP, swa="layer_types", defaults=_GEMMA3N_DEFAULTS,
           classes=("Gemma3nForCausalLM",), more_dims=_gemma3n_dims, layer_flags=_gemma3n_layer, ffn_widths=True,
           renames=((r"\.altup\.correct_output_scale$", ".altup.correct_output_scale.weight"),),
           stack=(Stack("altup_proj.weight", hf=r"^model\.altup_projections\.(\d+)\.weight$"),
                  Stack("altup_unembd_proj.weight", hf=r"^model\.altup_unembed_projections\.(\d+)\.weight$")),
           lookups=("per_layer_token_embd.weight",), kv_shared="nshared", forward=_FWD_GEMMA3N),
)
_GEMMA3N = _F[-1]
# a release (Gemma3nForConditionalGeneration): the text model under model.language_model., the vision and audio
# towers and their embedders beside it, left out by name as Gemma 4's
_F.append(replace(_multimodal(_GEMMA3N, "gemma3n", "Gemma3nForConditionalGeneration"),
                  skip=_GEMMA4_MM_SKIP + _GEMMA3N.skip))

FAMILIES: dict[str, Family] = {f.name: f for f in _F}
_BY_MODEL_TYPE: dict[str, Family] = {mt: f for f in _F for mt in (f.name, *f.model_types)}
SUPPORTED = tuple(sorted(_BY_MODEL_TYPE))


_BY_CLASS: dict[str, Family] = {c: f for f in _F for c in f.classes}


def family(model_type: str | None) -> Family | None:
    """The entry for an HF ``model_type`` (None for an unknown one)."""
    return _BY_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None


def config_family(cfg: Mapping[str, Any]) -> Family | None:
    """The entry for a config.json: by ``model_type``, else (no model_type) by its ``architectures`` class."""
    mt = cfg.get("model_type")
    if mt is not None:
        fam = family(mt)
    else:
        arch = cfg.get("architectures")
        fam = _BY_CLASS.get(arch[0]) if isinstance(arch, list) and arch and isinstance(arch[0], str) else None
    if fam is not None and fam.variant is not None:
        other = fam.variant(cfg)
        fam = FAMILIES[other] if other else fam
    return fam


# ------------------------------------------------------------------------------------------- config -> facts

def _int(v: Any, key: str, where: str, *, allow_none: bool = False, cap: int = CAP_DEFAULT) -> int | None:
    if v is None and allow_none:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SourceError(f"{where}: '{escape_name(key)}' = {escape_name(repr(v), 40)} is not a non-negative "
                          "integer; fix the config")
    if v > cap:
        raise SourceError(f"{where}: '{escape_name(key)}' = {v} is beyond any real model (cap {cap}); fix the config")
    return v


def _lookup(cfg: Mapping, fam: Family, fact: str) -> tuple[str | None, Any]:
    """(key found, value) of one fact in a config (family keys first, then the common ones, then defaults)."""
    keys = fam.keys.get(fact, COMMON_KEYS.get(fact, ()))
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return k, cfg[k]
    for k in keys:
        if k in fam.defaults:
            return k, fam.defaults[k]
    return (keys[0] if keys else None), None


def _text_config(cfg: Mapping, fam: Family, where: str) -> Mapping:
    if not fam.text_config:
        return cfg
    tc = cfg.get("text_config")
    if tc is None:
        tc = {}
    if not isinstance(tc, Mapping):
        raise SourceError(f"{where}: 'text_config' is not an object; fix the config")
    return tc


# keys the entries read as true/false, as lists of layer numbers, as names
BOOL_KEYS = ("attention_bias", "mlp_bias", "bias", "add_qkv_bias", "use_bias", "multi_query_attention",
             "tie_word_embeddings", "conv_bias", "mamba_conv_bias", "mamba_proj_bias", "projectors_bias",
             "mamba_rms_norm", "mamba_norm_before_gate")
LAYER_LIST_KEYS = ("mlp_only_layers",)
STR_KEYS = ("topk_method",)


# keys whose Infinity means "no limit", as released configs write them (Nemotron-H / Mamba2's time_step_limit
# [0.0, Infinity]: dt unclamped); a pack's header holds them as the strings "Infinity" / "-Infinity" (header_config)
NO_LIMIT_KEYS = ("time_step_limit",)


def _finite(cfg: Any, where: str) -> None:
    """No NaN anywhere in a config, and no Infinity but under :data:`NO_LIMIT_KEYS` (Python's json reads them;
    a pack header cannot hold them)."""
    stack: list[tuple[str, str, Any]] = [("", "", cfg)]
    while stack:
        path, key, v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v) and not (math.isinf(v) and key in NO_LIMIT_KEYS):
            raise SourceError(f"{where}: '{escape_name(path, 80)}' = {v!r} is not a finite number (NaN and Infinity "
                              "are not JSON); fix the config")
        if isinstance(v, Mapping):
            stack.extend((f"{path}.{k}" if path else str(k), str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{path}[{i}]", key, x) for i, x in enumerate(v))


def header_config(cfg: Any) -> Any:
    """A config as a pack's header holds it: an Infinity (a "no limit", :data:`NO_LIMIT_KEYS`) as the string
    "Infinity" / "-Infinity", every other value as it is."""
    if isinstance(cfg, float) and math.isinf(cfg):
        return "Infinity" if cfg > 0 else "-Infinity"
    if isinstance(cfg, Mapping):
        return {k: header_config(v) for k, v in cfg.items()}
    if isinstance(cfg, list):
        return [header_config(v) for v in cfg]
    return cfg


def _check_keys(cfg: Mapping, where: str) -> None:
    """Type checks of the non-numeric keys the entries read (one line naming the key)."""
    for k in BOOL_KEYS:
        v = cfg.get(k)
        if v is not None and not isinstance(v, bool):
            raise SourceError(f"{where}: '{k}' = {escape_name(repr(v), 40)} is not true or false; fix the config")
    for k in LAYER_LIST_KEYS:
        v = cfg.get(k)
        if v is not None and not (isinstance(v, list) and len(v) <= CAPS["n_layers"] and
                                  all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
            raise SourceError(f"{where}: '{k}' must be a list of layer numbers; fix the config")
    for k in STR_KEYS:
        v = cfg.get(k)
        if v is not None and not isinstance(v, str):
            raise SourceError(f"{where}: '{k}' = {escape_name(repr(v), 40)} is not a string; fix the config")


def _dims(cfg: Mapping, fam: Family, where: str) -> dict:
    """Every dimension the templates and the facts use, checked for type and range."""
    tc = _text_config(cfg, fam, where)
    _check_keys(cfg, where)
    if tc is not cfg:
        _check_keys(tc, where + " text_config")
    d: dict[str, Any] = {}

    def get(fact: str, default: int | None = None, cap: int | None = None) -> int | None:
        k, v = _lookup(tc, fam, fact)
        if v is None:
            if default is None and fact in REQUIRED:
                raise SourceError(f"{where}: '{k}' is missing; fix the config")
            return default
        return _int(v, k or fact, where, cap=cap or CAPS.get(fact, CAP_DEFAULT))

    listed = _listed_layers(fam.blocks, tc) if fam.blocks is not None and fam.blocks.pattern else None
    d["L"] = listed if listed is not None and _lookup(tc, fam, "n_layers")[1] is None else get("n_layers")
    d["H"] = get("hidden")
    d["nh"] = get("heads")
    d["V"] = get("vocab")
    if d["nh"] == 0:
        raise SourceError(f"{where}: '{_lookup(tc, fam, 'heads')[0]}' is 0; fix the config")
    d["nkv"] = get("kv_heads", d["nh"])
    if fam.name == "chatglm" and not tc.get("multi_query_attention"):
        d["nkv"] = d["nh"]
    d["hd"] = get("head_dim", d["H"] // d["nh"])
    if fam.attention == "mla":  # the q/k head: its no-rope and rope parts (GGUF key_length)
        d["hd"] = get("qk_nope", 0) + get("qk_rope", 0)
    iw = _lookup(tc, fam, "intermediate")
    if fam.ffn_widths and isinstance(iw[1], list):  # one width per layer (Gemma3nTextConfig)
        if len(iw[1]) != d["L"]:
            raise SourceError(f"{where}: '{iw[0]}' lists {len(iw[1])} widths but '{_lookup(tc, fam, 'n_layers')[0]}' "
                              f"is {d['L']}; give one per layer; fix the config")
        d["I_layers"] = tuple(_int(v, f"{iw[0]}[{i}]", where, cap=CAPS["intermediate"]) for i, v in enumerate(iw[1]))
        d["I"] = max(d["I_layers"], default=0)
    else:
        d["I"] = get("intermediate", 0)
    d["E"] = get("n_experts", 0)
    d["top_k"] = get("n_experts_used", 0)
    d["Im"] = get("moe_intermediate", 0)
    d["n_shared"] = get("n_shared", 0)
    d["Is"] = get("shared_intermediate", d["n_shared"] * d["Im"])
    d["qlr"] = get("q_lora_rank", 0)
    d["kvlr"] = get("kv_lora_rank", 0)
    d["nope"] = get("qk_nope", 0)
    d["rope"] = get("qk_rope", 0)
    d["vhd"] = get("v_head_dim", 0)
    if fam.attention == "mla" and not d["vhd"]:  # MiniCPM3's config has none: its model uses hidden / heads
        d["vhd"] = d["H"] // d["nh"]
    d["first_dense"] = get("first_dense", 0)
    d["moe_freq"] = get("moe_freq", 1) or 1
    d["sparse_step"] = get("sparse_step", 1) or 1
    d["n_nextn"] = get("n_nextn", 0) if fam.nextn else 0
    d["window"] = get("sliding_window", 0) if fam.swa else 0
    pat = _lookup(tc, fam, "swa_pattern")[1] if fam.swa == "pattern" else None
    # a string pattern ("LLLG": L sliding, G full, repeated; exaone4) is read by _swa_layers
    d["swa_pattern"] = 0 if pat is None or isinstance(pat, str) else get("swa_pattern", 0)
    if fam.attention == "mla" and not (d["kvlr"] and d["rope"] and d["nope"] + d["rope"] and d["vhd"]):
        raise SourceError(f"{where}: an MLA model needs kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and "
                          "v_head_dim; fix the config")
    heads, kvh = _lookup(tc, fam, "heads")[0], _lookup(tc, fam, "kv_heads")[0]
    hdk = "qk_nope_head_dim + qk_rope_head_dim" if fam.attention == "mla" else _lookup(tc, fam, "head_dim")[0]
    for what, w in ((f"'{heads}' x '{hdk}'", d["nh"] * d["hd"]), (f"'{kvh}' x '{hdk}'", d["nkv"] * d["hd"]),
                    (f"'{heads}' x 'v_head_dim'", d["nh"] * d["vhd"]),
                    ("'n_shared_experts' x 'moe_intermediate_size'", d["Is"])):
        if w > MAX_WIDTH:
            raise SourceError(f"{where}: {what} = {w} is beyond any real model (cap {MAX_WIDTH}); fix the config")
    if d["E"]:
        if not 0 < d["top_k"] <= d["E"]:
            raise SourceError(f"{where}: 'num_experts_per_tok' = {d['top_k']} must be in 1..{d['E']} "
                              "(the number of experts); fix the config")
        if d["L"] * d["E"] > MAX_EXPERT_SLICES:
            raise SourceError(f"{where}: {d['L']} layers x {d['E']} experts is beyond any real model; fix the config")
    if fam.name == "gemma3":
        vc = cfg.get("vision_config") or {}
        if not isinstance(vc, Mapping):
            raise SourceError(f"{where}: 'vision_config' is not an object; fix the config")
        vdef = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "patch_size": 14,
                "image_size": 896, "num_channels": 3}  # SiglipVisionConfig as Gemma3 uses it
        for key, name in (("hidden_size", "vH"), ("intermediate_size", "vI"), ("num_hidden_layers", "vL"),
                          ("patch_size", "vP"), ("image_size", "vS"), ("num_channels", "vC")):
            d[name] = _int(vc.get(key, vdef[key]), "vision_config." + key, where,
                           cap=4096 if key == "num_hidden_layers" else
                           MAX_WIDTH if key in ("hidden_size", "intermediate_size") else CAP_DEFAULT)
        if d["vP"] == 0:
            raise SourceError(f"{where}: 'vision_config.patch_size' is 0; fix the config")
        d["vN"] = (d["vS"] // d["vP"]) ** 2
    tied = tc.get("tie_word_embeddings", cfg.get("tie_word_embeddings", fam.defaults.get("tie_word_embeddings", False)))
    if not isinstance(tied, bool):
        raise SourceError(f"{where}: 'tie_word_embeddings' = {escape_name(repr(tied), 40)} is not true or false; "
                          "fix the config")
    d["tied"] = tied
    if fam.more_dims is not None:
        d.update(fam.more_dims(tc, d, where))
    return d


def _listed_layers(b: Blocks, tc: Mapping) -> int | None:
    """The layer count a hybrid's layer list or pattern gives (transformers 5 saves no num_hidden_layers for
    Nemotron-H: the list is the count); None when it gives none (its type is checked in :func:`_layer_blocks`)."""
    lt = tc.get(b.key)
    if isinstance(lt, list) and len(lt) <= CAPS["n_layers"]:
        return len(lt)
    pat = tc.get(b.pattern)
    return len(pat) if isinstance(pat, str) and len(pat) <= CAPS["n_layers"] else None


def layer_blocks(cfg: Mapping[str, Any], where: str = "config.json") -> list[str]:
    """Each layer's block type (:class:`Blocks`; ``attn`` for every layer of a family without ``blocks``),
    checked against the layer count (SourceError: one line naming the key)."""
    fam = config_family(cfg)
    if fam is None:
        raise SourceError(f"{where}: model_type {escape_name(repr(cfg.get('model_type')), 60)} is not a known "
                          "architecture")
    return _layer_blocks(fam, cfg, _dims(cfg, fam, where), where)


def _layer_blocks(fam: Family, cfg: Mapping, d: dict, where: str) -> list[str]:
    L, b = d["L"], fam.blocks
    if b is None:
        return [ATTN] * L
    if b.record == "all":  # one block type for every layer, whatever the config (Falcon-H1)
        return [b.default] * L
    tc = _text_config(cfg, fam, where)
    nl = _lookup(tc, fam, "n_layers")[0]
    known = ", ".join(repr(x) for x in b.names)
    lt, key = tc.get(b.key), b.key
    if lt is not None and (not isinstance(lt, list) or len(lt) > CAPS["n_layers"] or
                           not all(isinstance(x, str) for x in lt)):
        raise SourceError(f"{where}: '{b.key}' must be a list of layer types ({known}); fix the config")
    pat = tc.get(b.pattern) if b.pattern else None
    if pat is not None:  # one letter per layer (Nemotron-H); with the list too, the two must agree
        if not isinstance(pat, str) or len(pat) > CAPS["n_layers"]:
            raise SourceError(f"{where}: '{b.pattern}' must be a string of one letter per layer ({known}); "
                              "fix the config")
        if lt is not None and [b.names.get(x, x) for x in lt] != [b.names.get(x, x) for x in pat]:
            raise SourceError(f"{where}: '{b.pattern}' = {escape_name(repr(pat), 60)} contradicts '{b.key}'; "
                              "fix the config")
        lt, key = (list(pat), b.pattern) if lt is None else (lt, key)
    if lt is not None:
        if len(lt) != L:
            raise SourceError(f"{where}: '{key}' lists {len(lt)} layers but '{nl}' is {L}; fix the config")
        for i, x in enumerate(lt):
            if x not in b.names:
                raise SourceError(f"{where}: '{key}'[{i}] = {escape_name(repr(x), 40)} is not a layer type "
                                  f"orkpack knows ({known}); fix the config")
        out = [b.names[x] for x in lt]
        if b.interval and tc.get(b.interval) is not None:
            n = _interval(b, tc, where)
            bad = next((i for i, x in enumerate(out) if (x == ATTN) != ((i + 1) % n == 0)), None)
            if bad is not None:
                raise SourceError(f"{where}: '{key}'[{bad}] = {escape_name(repr(lt[bad]), 40)} contradicts "
                                  f"'{b.interval}' = {n}; fix the config")
        return out
    idx = tc.get(b.indices) if b.indices else None
    if idx is not None:
        if not (isinstance(idx, list) and len(idx) <= CAPS["n_layers"] and
                all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in idx)):
            raise SourceError(f"{where}: '{b.indices}' must be a list of layer numbers; fix the config")
        if idx and max(idx) >= L:
            raise SourceError(f"{where}: '{b.indices}' names layer {max(idx)} but '{nl}' is {L}; fix the config")
        other = next(v for v in b.names.values() if v != ATTN)
        return [ATTN if i in set(idx) else other for i in range(L)]
    n = _interval(b, tc, where)
    if n:
        other = next(v for v in b.names.values() if v != ATTN)
        return [ATTN if (i + 1) % n == 0 else other for i in range(L)]
    return [b.default] * L


def _interval(b: Blocks, tc: Mapping, where: str) -> int:
    """Every n-th layer is attention (``Blocks.interval``; 0: the family has no such key)."""
    if not b.interval:
        return 0
    v = tc.get(b.interval)
    n = _int(b.interval_default if v is None else v, b.interval, where, cap=CAPS["n_layers"])
    if n == 0:
        raise SourceError(f"{where}: '{b.interval}' is 0; fix the config")
    return n


def recurrent_block(fam: Family) -> str | None:
    """The block type of a hybrid's recurrent layers (what a GGUF's layers without KV heads run)."""
    if fam.blocks is None:
        return None
    return next((v for v in fam.blocks.names.values() if v != ATTN and fam.blocks.parts.get(v) != "ffn"), None)


def ffn_block(fam: Family) -> str | None:
    """The block type a hybrid GGUF's FFN-only layers run (Blocks.parts "ffn"; MoE or not by their tensors)."""
    if fam.blocks is None:
        return None
    return next((v for v in fam.blocks.names.values() if fam.blocks.parts.get(v) == "ffn"), None)


def converter_shape(arch: str | None, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A checkpoint tensor's shape as llama.cpp's converter lays it out (numpy order): the size-1 axes a family
    declares (``squeeze``: LFM2's depthwise conv kernel (H, 1, Lc) -> (H, Lc)) dropped; else ``shape``."""
    fam = FAMILIES.get(arch) if arch else None
    if fam is None or not fam.squeeze:
        return tuple(shape)
    from .globs import matches

    for glob, axis in fam.squeeze:
        if matches(name, glob) and len(shape) > axis and shape[axis] == 1:
            return tuple(shape[:axis]) + tuple(shape[axis + 1:])
    return tuple(shape)


@dataclass(frozen=True)
class Piece:
    """One tensor as llama.cpp's converter writes it from one checkpoint tensor (:func:`converter_layout`): its canonical
    name and shape (numpy order), and where its elements lie in the stored tensor: part ``part`` of ``of`` equal parts
    along ``axis`` of the stored shape (``of`` 1: all of it), or, for a grouped split, the ``gather`` runs
    (first index, count) along that axis, in order."""
    name: str
    shape: tuple[int, ...]
    axis: int = 0
    part: int = 0
    of: int = 1
    gather: tuple[tuple[int, int], ...] = ()

    def runs(self) -> tuple[tuple[int, int], ...]:
        """(first index, count) along ``axis`` of the stored tensor, in order, that make this piece."""
        n = self.shape[self.axis]
        return self.gather or ((self.part * n, n),)


def converter_layout(cfg: Mapping[str, Any] | None, name: str, shape: tuple[int, ...],
                     where: str = "config.json") -> list[Piece]:
    """The tensors llama.cpp's converter writes for the checkpoint tensor ``name`` (canonical) of ``shape``, of a model
    with config ``cfg``: its size-1 axes dropped (``squeeze``), reshaped (``reshape``), cut or renamed (``split``);
    one :class:`Piece` of the same name and shape for every tensor of a family that declares none of them."""
    fam = config_family(cfg) if isinstance(cfg, Mapping) else None
    shape = converter_shape(fam.name if fam is not None else None, name, tuple(shape))
    if fam is None or not (fam.split or fam.reshape):
        return [Piece(name, shape)]
    from .globs import matches

    d = _dims(cfg, fam, where)
    for glob, sh in fam.reshape:
        if matches(name, glob):
            new = tuple(_eval(x, d) for x in sh)
            if math.prod(new) != math.prod(shape):
                raise SourceError(f"{where}: {escape_name(name)} {shape} does not hold {new}, the shape llama.cpp's "
                                  "converter gives it; the checkpoint does not match its config")
            shape = new
    flags = _model_flags(fam, cfg, d)
    for sp in fam.split:
        if matches(name, sp.glob) and _holds(sp.when, flags):
            n, ax = len(sp.parts), sp.axis
            if sp.groups:
                return _grouped_split(sp, d, name, shape, where)
            if len(shape) <= ax or shape[ax] % n:
                raise SourceError(f"{where}: {escape_name(name)} {shape} does not split in {n} along axis {ax} as "
                                  "llama.cpp's converter splits it; the checkpoint does not match its config")
            sub = shape[:ax] + (shape[ax] // n,) + shape[ax + 1:]
            return [Piece(name.replace(sp.old, part), sub, ax, k, n) for k, part in enumerate(sp.parts)]
    return [Piece(name, shape)]


def converter_stacks(cfg: Mapping[str, Any] | None, names) -> list[tuple[str, tuple[str, ...]]]:
    """[(stacked name, its parts' canonical names in order)] of the family's named-part :class:`Stack` entries whose
    parts are all among ``names`` (canonical names as the converter layout gives them, before stacking)."""
    fam = config_family(cfg) if isinstance(cfg, Mapping) else None
    if fam is None or not fam.stack:
        return []
    from .globs import matches

    have, out = set(names), []
    for st in fam.stack:
        if not st.parts:  # indexed HF pieces: stacked on read (stacked_slice)
            continue
        for n in sorted(have):
            stacked = n.replace(st.parts[0], st.old)
            if st.parts[0] not in n or not matches(stacked, st.glob):
                continue
            parts = tuple(stacked.replace(st.old, p) for p in st.parts)
            if all(p in have for p in parts):
                out.append((stacked, parts))
    return out


def converter_copies(cfg: Mapping[str, Any] | None, names) -> list[tuple[str, str]]:
    """[(canonical name, its source's)] of the family's ``copies`` whose source is among ``names`` and which is not."""
    fam = config_family(cfg) if isinstance(cfg, Mapping) else None
    if fam is None:
        return []
    have = set(names)
    return [(new, old) for new, old in fam.copies if old in have and new not in have]


def _grouped_split(sp: Split, d: Mapping, name: str, shape: tuple[int, ...], where: str) -> list[Piece]:
    """The pieces of a grouped :class:`Split` (Qwen3-Next's in_proj_qkvz), each a row gather of the stored tensor."""
    ax, groups, blocks = sp.axis, _eval(sp.groups, d), [_eval(x, d) for x in sp.blocks]
    width = sum(blocks)
    if len(shape) <= ax or shape[ax] != groups * width:
        raise SourceError(f"{where}: {escape_name(name)} {shape} is not {groups} groups of {width} along axis {ax} as "
                          "llama.cpp's converter splits it; the checkpoint does not match its config")
    starts = [sum(blocks[:j]) for j in range(len(blocks))]
    out = []
    for part, picks in zip(sp.parts, sp.picks):
        runs = tuple((g * width + starts[j], blocks[j]) for j in picks for g in range(groups))
        sub = shape[:ax] + (sum(c for _, c in runs),) + shape[ax + 1:]
        out.append(Piece(name.replace(sp.old, part), sub, ax, gather=runs))
    return out


def _model_flags(fam: Family, cfg: Mapping, d: dict) -> dict:
    """The model-level template flags (``tied``, ``vision`` and the family's own ``flags``)."""
    base = {"tied": d["tied"] and not fam.head_stored_when_tied, "vision": fam.name == "gemma3"}
    if fam.flags is not None:
        base.update(fam.flags(cfg, d))
    return base


def _moe_layer(fam: Family, d: dict, cfg: Mapping, i: int) -> bool:
    if not d["E"]:
        return False
    if fam.moe == "qwen":
        mlp_only = cfg.get("mlp_only_layers") or ()
        return i not in mlp_only and (i + 1) % d["sparse_step"] == 0
    if fam.moe == "deepseek":
        return i >= d["first_dense"] and i % d["moe_freq"] == 0
    if fam.moe == "interval":  # ernie4_5_moe: every moe_freq-th layer (counting from 1) in first_dense..moe_last
        return (i + 1) % d["moe_freq"] == 0 and d["first_dense"] <= i <= d.get("moe_last", d["L"] - 1)
    return True


def _swa_layers(fam: Family, d: dict, cfg: Mapping, where: str) -> list[int]:
    L, w = d["L"], d["window"]
    if not fam.swa or not w:
        return []
    if "kinds" in d:  # the family's own reading of the layer types (gemma4: its config class's default pattern)
        return [i for i, k in enumerate(d["kinds"]) if k == "sliding_attention"]
    if fam.swa == "all":
        return list(range(L))
    if fam.swa == "even":
        return [i for i in range(L) if i % 2 == 0]
    lt = _text_config(cfg, fam, where).get("layer_types")
    if lt is not None:
        if not (isinstance(lt, list) and len(lt) == L and all(isinstance(x, str) for x in lt)):
            raise SourceError(f"{where}: 'layer_types' must list one attention type per layer ({L}); fix the config")
        return [i for i, x in enumerate(lt) if x == "sliding_attention"]
    if fam.swa == "layer_types":  # gpt-oss without layer_types: alternating, sliding first
        return [i for i in range(L) if i % 2 == 0]
    pat = _lookup(_text_config(cfg, fam, where), fam, "swa_pattern")[1]
    if isinstance(pat, str):
        if not pat or set(pat) - {"L", "G"}:
            raise SourceError(f"{where}: 'sliding_window_pattern' = {escape_name(repr(pat), 40)} is neither a number "
                              "nor a string of L (sliding) and G (full); fix the config")
        return [i for i in range(L) if pat[i % len(pat)] == "L"]
    p = d["swa_pattern"]
    return [i for i in range(L) if p and (i + 1) % p != 0]


def _kv(fam: Family, d: dict) -> tuple[int, int]:
    if fam.attention == "mla":  # the compressed latent: one row of kv_lora_rank + rope dims, no separate V
        return d["kvlr"] + d["rope"], 0
    if "kv_widths" in d:  # gemma4: the full layers' K, V (then the sliding layers', in _facts)
        return d["kv_widths"][0], d["kv_widths"][1]
    return d["nkv"] * d["hd"], d["nkv"] * d["hd"]


def facts_from_config(cfg: Mapping[str, Any], where: str = "config.json") -> dict:
    """The plan's facts from a parsed config.json of a known family (SourceError: one line naming the key)."""
    if not isinstance(cfg, Mapping):
        raise SourceError(f"{where}: config.json is not a JSON object; restore the original")
    fam = config_family(cfg)
    if fam is None:
        raise SourceError(f"{where}: model_type {escape_name(repr(cfg.get('model_type')), 60)} is not a known "
                          f"architecture; known: {', '.join(SUPPORTED)}. Plan from the weights instead (a folder "
                          "with safetensors, or a .gguf) for a generic plan")
    _finite(cfg, where)
    return _facts(fam, cfg, _dims(cfg, fam, where), where)


def _facts(fam: Family, cfg: Mapping, d: dict, where: str) -> dict:
    k, v = _kv(fam, d)
    blocks, parts = _layer_blocks(fam, cfg, d, where), (fam.blocks.parts if fam.blocks is not None else {})
    rec = [i for i, b in enumerate(blocks) if b != ATTN and parts.get(b) != "ffn"]
    return {
        "arch": fam.name, "n_layers": d["L"], "hidden": d["H"], "intermediate": d["I"], "heads": d["nh"],
        "kv_heads": d["nkv"] if fam.attention != "mla" else 1, "head_dim": d["hd"], "vocab": d["V"],
        "n_experts": d["E"], "n_experts_used": d["top_k"] if d["E"] else 0,
        # tied = no separate output tensor (the GGUF meaning): a release that stores the head is not
        "moe_intermediate": d["Im"] if d["E"] else 0, "tie_word_embeddings": d["tied"] and not fam.head_stored_when_tied,
        "attention": fam.attention, "kv_k": k, "kv_v": v,
        "swa_window": d["window"] if fam.swa else 0, "swa_layers": _swa_layers(fam, d, cfg, where),
        "recurrent_layers": rec, "state": _eval(fam.blocks.state, d) if rec else 0,
        "recurrent_flops": _eval(fam.blocks.flops, d) if rec else 0,
        "parallel_layers": [i for i in rec if ATTN in mixers(blocks[i])],
        "ffn_layers": [i for i, b in enumerate(blocks) if parts.get(b) == "ffn"],
        "swa_kv_k": _swa_kv(d, 2), "swa_kv_v": _swa_kv(d, 3),
        "kv_shared_layers": list(range(d["L"] - _eval(fam.kv_shared, d), d["L"])) if fam.kv_shared else [],
    }


def _swa_kv(d: dict, j: int) -> int:
    """The sliding layers' K (j 2) or V (j 3) width where it differs from the other layers' (0: the same)."""
    w = d.get("kv_widths")
    return w[j] if w and w[j] != w[j - 2] else 0


# ------------------------------------------------------------------------------------------ config -> tensors

_EXPR = re.compile(r"\s*(\d+|[A-Za-z_]\w*|[-+*()])")


def _eval(expr: Any, d: Mapping[str, int]) -> int:
    """An int, or an expression of dims with + - * and parentheses."""
    if isinstance(expr, int):
        return expr
    toks = _EXPR.findall(expr)
    pos = 0

    def atom() -> int:
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok == "(":
            v = add()
            pos += 1  # ')'
            return v
        return int(tok) if tok.isdigit() else int(d[tok])

    def mul() -> int:
        nonlocal pos
        v = atom()
        while pos < len(toks) and toks[pos] == "*":
            pos += 1
            v *= atom()
        return v

    def add() -> int:
        nonlocal pos
        v = mul()
        while pos < len(toks) and toks[pos] in "+-":
            sign = 1 if toks[pos] == "+" else -1
            pos += 1
            v += sign * mul()
        return v

    return add()


def _holds(when: tuple[str, ...], flags: Mapping[str, bool]) -> bool:
    return all((not flags.get(w[1:], False)) if w.startswith("!") else flags.get(w, False) for w in when)


def hf_tensors(cfg: Mapping[str, Any], where: str = "config.json",
               expert_runs: dict[int, tuple[int, str]] | None = None) -> tuple[dict, list[tuple[str, tuple[int, ...], T]]]:
    """(facts, [(HF name, shape, template)]): every tensor a checkpoint of this config holds, per expert.

    Derivable buffers (``inv_freq``, ``position_ids``, masks) are not listed: they are dropped on read.
    ``expert_runs`` (a dict, optional) receives, for each run of a stack's experts, its first entry's index ->
    (the count of experts, the name with ``{e}`` where the expert index goes): entries index .. index + count - 1
    are experts 0 .. count - 1 of one template, of one shape.
    """
    facts = facts_from_config(cfg, where)
    fam = FAMILIES[facts["arch"]]
    d = _dims(cfg, fam, where)
    base = _model_flags(fam, cfg, d)
    out: list[tuple[str, tuple[int, ...], T]] = []

    def emit(tpl: T, flags: Mapping[str, bool], i: int | None) -> None:
        if not _holds(tpl.when, flags):
            return
        # a layer's own FFN width where the config lists one per layer (Family.ffn_widths)
        di = dict(d, I=d["I_layers"][i]) if i is not None and i < len(d.get("I_layers", ())) else d
        shape = tuple(_eval(s, di) for s in tpl.shape)
        name = tpl.name if i is None else tpl.name.replace("{i}", str(i))
        if tpl.experts:
            if expert_runs is not None and d["E"] > 0:
                expert_runs[len(out)] = (d["E"], name)
            for e in range(d["E"]):
                out.append((name.replace("{e}", str(e)), shape, tpl))
        elif tpl.each:
            for k in range(_eval(tpl.each, d)):
                out.append((name.replace("{k}", str(k)), shape, tpl))
        else:
            out.append((name, shape, tpl))
        if len(out) > MAX_TENSORS:
            raise SourceError(f"{where}: describes over {MAX_TENSORS} tensors; beyond any real model; fix the config")

    for tpl in fam.top:
        emit(tpl, base, None)
    layer_tpls = [x for x in fam.layer if not x.name.startswith(_SIGLIP)]
    blocks = _layer_blocks(fam, cfg, d, where)
    kinds = {ATTN, *fam.blocks.names.values()} if fam.blocks else {ATTN}
    kinds |= {m for k in kinds for m in mixers(k)}
    for i in range(d["L"] + d["n_nextn"]):
        moe = _moe_layer(fam, d, cfg, i)
        blk = blocks[i] if i < len(blocks) else ATTN
        flags = dict(base, moe=moe, dense=not moe, nextn=i >= d["L"])
        # after the base flags: a block type named moe (Nemotron-H) says which layers are; a parallel block
        # (Falcon-H1's attn+mamba2) sets the flags of each of its mixers
        flags.update({k: k == blk or k in mixers(blk) for k in kinds})
        if fam.layer_flags is not None and i < d["L"]:
            flags.update(fam.layer_flags(_text_config(cfg, fam, where), d, i))
        for tpl in layer_tpls:
            emit(tpl, flags, i)
    if base["vision"]:
        for i in range(d["vL"]):
            for tpl in fam.layer:
                if tpl.name.startswith(_SIGLIP):
                    emit(tpl, base, i)
    return facts, out


# --------------------------------------------------------------------------------------------------- names

@lru_cache(maxsize=64)
def _name_map(gguf_arch: str, n_blocks: int):
    """gguf-py's name map of ``gguf_arch`` for ``n_blocks`` blocks, or what answers its ``get_name`` the same
    without building it (:class:`_BlockNames`)."""
    arch = getattr(gguf.MODEL_ARCH, gguf_arch)
    make = gguf.get_tensor_name_map  # (loads gguf-py's tables)
    cls = getattr(sys.modules.get(make.__module__), "TensorNameMap", None)
    if cls is not None and getattr(make, "__code__", None) is not None and make.__code__.co_names == ("TensorNameMap",):
        try:
            return _BlockNames(cls, arch, n_blocks)
        except _Unlike:
            pass
    return make(arch, n_blocks)


class _Unlike(Exception):
    """The tables hold a template :class:`_BlockNames` does not read: use gguf-py's own map."""


class _BlockNames:
    """``TensorNameMap(arch, n_blocks).get_name`` without the map (issue 26): gguf-py's constructor writes every
    block template's name for every block (a 30B MoE: 64 x some 300 templates, ~0.02 s of a plan) and a plan looks
    up a few hundred names. Here each name is looked up as the constructor's writes would leave it: the last write
    of the key wins, in the constructor's order (the plain templates, then block by block each tensor's own name
    and then its templates), a block's key being its template with ``{bid}`` as the block number (``str(bid)``).
    Built as the constructor runs: it first merges the architecture's own block templates into the class's table
    (``block_mappings_cfg.update``, which gguf-py does to the class itself, so later maps see it too), and so does
    this. Only templates holding at most one ``{bid}``, next to no digit, and no other brace are read (a block
    number is then a whole run of digits of the key); the tables of any other layout raise :class:`_Unlike`.
    tests/test_plan_speed.py compares it with gguf-py's map on every architecture."""

    _SAFE = re.compile(r"[^{}]*(?:(?<![0-9])\{bid\}(?![0-9])[^{}]*)?")
    _RUN = re.compile(r"[0-9]+")

    def __init__(self, cls, arch, n_blocks: int):
        tensors, names = gguf.MODEL_TENSORS[arch], gguf.TENSOR_NAMES
        self.plain: dict[str, tuple] = {}
        for tensor, keys in cls.mappings_cfg.items():
            if tensor not in tensors:
                continue
            name = names[tensor]
            self.plain[name] = (tensor, name)
            for key in keys:
                self.plain[key] = (tensor, name)
        if arch in cls.arch_block_mappings_cfg:
            cls.block_mappings_cfg.update(cls.arch_block_mappings_cfg[arch])
        # template with "{bid}" -> its last write within a block: (order, tensor); one without: the same
        self.per_block: dict[str, tuple] = {}
        self.same: dict[str, tuple] = {}
        self.names, self.n_blocks = names, int(n_blocks)
        for t_index, (tensor, keys) in enumerate(cls.block_mappings_cfg.items()):
            if tensor not in tensors:
                continue
            for pos, key in enumerate((names[tensor], *keys)):
                if not isinstance(key, str) or not self._SAFE.fullmatch(key):
                    raise _Unlike(key)
                (self.per_block if "{bid}" in key else self.same)[key] = ((t_index, pos), tensor)

    def _block(self, key: str):
        """(block, (order), tensor) of the last block write of ``key``, or None."""
        best = None
        if self.n_blocks > 0 and key in self.same:
            order, tensor = self.same[key]
            best = (self.n_blocks - 1, order, tensor)
        for m in self._RUN.finditer(key):
            run = m.group()
            if run != str(int(run)) or int(run) >= self.n_blocks:
                continue
            got = self.per_block.get(key[: m.start()] + "{bid}" + key[m.end():])
            if got is not None and (best is None or (int(run), got[0]) > best[:2]):
                best = (int(run), got[0], got[1])
        return best

    def _get(self, key: str):
        b = self._block(key)
        if b is None:
            return self.plain.get(key)
        return b[2], self.names[b[2]].format(bid=b[0])

    def get_type_and_name(self, key: str, try_suffixes=()):
        result = self._get(key)
        if result is not None:
            return result
        for suffix in try_suffixes:
            if key.endswith(suffix):
                result = self._get(key[: -len(suffix)])
                if result is not None:
                    return result[0], result[1] + suffix
        return None

    def get_name(self, key: str, try_suffixes=()):
        result = self.get_type_and_name(key, try_suffixes)
        return None if result is None else result[1]


@lru_cache(maxsize=64)
def _renames(arch: str) -> tuple[tuple[re.Pattern, str], ...]:
    fam = FAMILIES.get(arch)
    return tuple((re.compile(a), b) for a, b in fam.renames) if fam else ()


def canonical_name(hf_name: str, arch: str | None, n_layers: int) -> str | None:
    """The GGUF-style name of a (non-expert) HF tensor of a known family; None when no rule or map knows it."""
    fam = FAMILIES.get(arch) if arch else None
    if fam is None:
        return None
    name = hf_name
    for rx, repl in _renames(fam.name):
        name = rx.sub(repl, name)
    if name.startswith("blk.") or name in ("token_embd.weight", "output.weight", "output_norm.weight"):
        return name
    # MTP layers sit after the last decoder layer: the map must know their block numbers too
    got = _name_map(fam.gguf, int(n_layers) + 16).get_name(name, try_suffixes=(".weight", ".bias"))
    if got is None:  # a llama-style tensor the family's GGUF table leaves out (qwen2_moe's mlp_only_layers)
        got = _name_map("LLAMA", int(n_layers) + 16).get_name(name, try_suffixes=(".weight", ".bias"))
    return got


@lru_cache(maxsize=64)
def _stacks(arch: str) -> tuple[tuple[re.Pattern, str], ...]:
    fam = FAMILIES.get(arch)
    return tuple((re.compile(st.hf), st.glob) for st in fam.stack if st.hf) if fam else ()


def stacked_slice(hf_name: str, arch: str | None) -> tuple[str, int] | None:
    """(canonical stacked name, index) of an HF tensor the converter stacks with its siblings (a ``Family.stack`` entry with ``hf``:
    gemma3n's ``model.altup_projections.1.weight`` -> ("altup_proj.weight", 1)); None for every other tensor."""
    if not arch or not _stacks(arch):
        return None
    name = hf_name
    for rx, repl in _renames(arch):
        name = rx.sub(repl, name)
    for rx, stacked in _stacks(arch):
        m = rx.match(name)
        if m is not None:
            return stacked, int(m.group(1))
    return None


def gguf_arch_name(arch: str) -> str:
    """The GGUF ``general.architecture`` string a family's GGUF files carry."""
    return gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, FAMILIES[arch].gguf)]


@lru_cache(maxsize=1)
def _by_gguf_name() -> dict[str, Family]:
    out: dict[str, Family] = {}
    for f in _F:  # the first family with a GGUF architecture is the one read for it (llama, not mistral)
        for g in f.gguf_names or (gguf_arch_name(f.name),):
            out.setdefault(g, f)
    return out


def family_for_gguf(garch: str | None, has_experts: bool) -> Family | None:
    """The family a GGUF ``general.architecture`` is read as (a ``llama`` GGUF with experts is mixtral)."""
    if not isinstance(garch, str):
        return None
    fam = _by_gguf_name().get(garch)
    if fam is not None and fam.name == "llama" and has_experts:
        return FAMILIES["mixtral"]
    return fam


# ------------------------------------------------------------------------------------------- GGUF -> facts

def facts_from_gguf(kv: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], where: str) -> dict:
    """Facts from GGUF metadata (``{arch}.*`` keys) and tensor shapes (numpy order); generic over families."""
    garch = kv.get("general.architecture")
    n_exp_raw = kv.get(f"{garch}.expert_count", 0)
    fam = family_for_gguf(garch, bool(n_exp_raw))
    if fam is None:
        raise SourceError(f"{where}: GGUF architecture {escape_name(repr(garch), 40)} is not a known family; "
                          f"known: {', '.join(sorted(_by_gguf_name()))}")

    def get(key: str, default: Any = None) -> Any:
        v = kv.get(f"{garch}.{key}", default)
        return default if v is None else v

    def num(key: str, default: int | None = None, cap: int = CAP_DEFAULT) -> int:
        v = get(key, default)
        if v is None:
            raise SourceError(f"{where}: GGUF key '{escape_name(str(garch))}.{key}' is missing; the file is incomplete")
        if isinstance(v, (list, tuple)):  # per-layer arrays (e.g. head_count_kv): the largest
            v = max(v) if v else 0
        if hasattr(v, "item"):
            v = v.item()
        return _int(v, f"{garch}.{key}", where, cap=cap)

    L = num("block_count", cap=CAPS["n_layers"])
    if fam.nextn:  # block_count counts the converter's MTP blocks after the decoder layers; llama.cpp's n_layer()
        # does not (DeepSeek-V3, GLM-4.5: the forward pass runs the decoder layers; a converter's GGUF of a folder
        # without the MTP layer still counts transformers' default one)
        L -= min(num("nextn_predict_layers", 0, cap=CAPS["n_nextn"]), L)
    if not fam.nextn and num("nextn_predict_layers", 0):  # the converter's MTP blocks (Qwen3.5 / Qwen3-Next: its default)
        raise SourceError(f"{where}: the GGUF holds {num('nextn_predict_layers', 0)} multi-token-prediction block(s) "
                          f"after the decoder layers ({escape_name(str(garch))}.nextn_predict_layers), which orkpack "
                          "does not pack for this family; convert with llama.cpp's --no-mtp")
    H = num("embedding_length")
    nh = num("attention.head_count")
    nkv = num("attention.head_count_kv", nh)
    hd = num("attention.key_length", (H // nh) if nh else 0)
    vd = num("attention.value_length", hd)
    E = num("expert_count", 0, cap=CAPS["n_experts"])
    used = num("expert_used_count", 0)
    ff = num("feed_forward_length", 0)
    moe = num("expert_feed_forward_length", 0) or (ff if E else 0)
    if "token_embd.weight" in shapes:
        vocab = int(shapes["token_embd.weight"][0])
    elif get("vocab_size") is not None:
        vocab = num("vocab_size")
    else:
        vocab = len(kv.get("tokenizer.ggml.tokens") or ())
    if fam.attention == "mla":
        kvlr, rope = num("attention.kv_lora_rank", 0), num("rope.dimension_count", 0)
        k_dim, v_dim, nkv_f = kvlr + rope, 0, 1
    else:
        k_dim, v_dim, nkv_f = nkv * hd, nkv * vd, nkv
    window = num("attention.sliding_window", 0) if fam.swa else 0
    pat = get("attention.sliding_window_pattern")  # newer GGUFs: one bool per layer
    if not window:
        swa = []
    elif isinstance(pat, (list, tuple)):
        swa = [i for i in range(min(L, len(pat))) if pat[i] is True]
    elif fam.swa in ("even", "layer_types"):  # llama.cpp: every other layer, from layer 0
        swa = [i for i in range(L) if i % 2 == 0]
    elif fam.swa == "pattern":  # llama.cpp's gemma3 default: 5 sliding layers, then a global one
        p = num("attention.sliding_window_pattern", 6)
        swa = [i for i in range(L) if p and (i + 1) % p != 0]
    else:
        swa = list(range(L))
    swa_k = swa_v = 0
    if get("attention.key_length_swa") is not None and fam.attention != "mla":  # gemma4: each type its own head size
        per = kv.get(f"{garch}.attention.head_count_kv")
        per = [int(x) for x in per] if isinstance(per, (list, tuple)) and len(per) == L else [nkv] * L
        hs, vs = num("attention.key_length_swa"), num("attention.value_length_swa", num("attention.key_length_swa"))
        sw = set(swa)
        full = [per[i] for i in range(L) if i not in sw] or [0]
        part = [per[i] for i in range(L) if i in sw] or [0]
        k_dim, v_dim = max(full) * hd, max(full) * vd
        swa_k, swa_v = max(part) * hs, max(part) * vs
        swa_k, swa_v = (swa_k if swa_k != k_dim else 0), (swa_v if swa_v != v_dim else 0)
    n_shared = num("attention.shared_kv_layers", 0, cap=CAPS["n_layers"])
    shared = list(range(max(L - n_shared, 0), L)) if n_shared else []
    rec: list[int] = []
    par: list[int] = []
    ffn: list[int] = []
    state = flops = 0
    if fam.blocks is not None:  # a hybrid: the layers without KV heads are recurrent (llama.cpp's is_recr)
        per = kv.get(f"{garch}.attention.head_count_kv")
        if fam.blocks.record == "all":  # every layer the one block type (Falcon-H1: attention + Mamba2 in each)
            rec = list(range(L)) if fam.blocks.default != ATTN else []
            par = rec if ATTN in mixers(fam.blocks.default) else []
        elif isinstance(per, (list, tuple)):
            if len(per) != L:
                raise SourceError(f"{where}: GGUF key '{escape_name(str(garch))}.attention.head_count_kv' lists "
                                  f"{len(per)} layers but block_count is {L}; the file is damaged")
            rec = [i for i, n in enumerate(per) if int(n) == 0]
            ffl = kv.get(f"{garch}.feed_forward_length")
            if fam.blocks.record == "kv_heads_ffn" and isinstance(ffl, (list, tuple)):  # llama.cpp's is_recr: neither
                if len(ffl) != L:
                    raise SourceError(f"{where}: GGUF key '{escape_name(str(garch))}.feed_forward_length' lists "
                                      f"{len(ffl)} layers but block_count is {L}; the file is damaged")
                ffn = [i for i in rec if int(ffl[i]) > 0]
                rec = [i for i in rec if int(ffl[i]) == 0]
        elif fam.blocks.record == "recurrent_layers":  # llama.cpp: the list, else every interval-th is attention
            flags = kv.get(f"{garch}.attention.recurrent_layers")
            if isinstance(flags, (list, tuple)):
                if len(flags) != L:
                    raise SourceError(f"{where}: GGUF key '{escape_name(str(garch))}.attention.recurrent_layers' "
                                      f"lists {len(flags)} layers but block_count is {L}; the file is damaged")
                rec = [i for i, f in enumerate(flags) if bool(f)]
            else:
                n = num("full_attention_interval", 4)
                if n == 0:
                    raise SourceError(f"{where}: GGUF key '{escape_name(str(garch))}.full_attention_interval' is 0; "
                                      "the file is damaged")
                rec = [i for i in range(L) if (i + 1) % n]
        if rec:
            sd = {"H": H, **{dim: num(key) for dim, key in fam.blocks.gguf_dims}}
            state, flops = _eval(fam.blocks.state, sd), _eval(fam.blocks.flops, sd)
    return {
        "arch": fam.name, "n_layers": L, "hidden": H, "intermediate": ff, "heads": nh, "kv_heads": nkv_f,
        "head_dim": hd, "vocab": vocab, "n_experts": E, "n_experts_used": used if E else 0,
        "moe_intermediate": moe if E else 0, "tie_word_embeddings": "output.weight" not in shapes,
        "attention": fam.attention, "kv_k": k_dim, "kv_v": v_dim, "swa_window": window if swa else 0,
        "swa_layers": swa, "recurrent_layers": rec, "state": state, "recurrent_flops": flops, "parallel_layers": par,
        "ffn_layers": ffn, "swa_kv_k": swa_k, "swa_kv_v": swa_v, "kv_shared_layers": shared,
    }


# ------------------------------------------------------------------------------------------ generic (unknown)

def generic_facts(cfg: Mapping[str, Any] | None, names: list[str], where: str) -> tuple[dict, list[str]]:
    """(facts, warnings) for an architecture no entry describes: every 2-D weight is a dense matmul.

    The KV cache is counted from the usual config keys when they are there
    (num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
    hidden_size), else it is left out, and the warnings say so.
    """
    cfg = cfg if isinstance(cfg, Mapping) else {}
    _finite(cfg, where)
    mt = cfg.get("model_type")
    arch = mt if isinstance(mt, str) and mt else None
    layers = [int(m.group(1)) for n in names if (m := re.search(r"(?:^|\.)(?:layers|h|blocks?|blk)\.(\d+)\.", n))]
    warnings = [f"architecture {escape_name(repr(arch), 40) if arch else '(no config.json model_type)'} has no "
                "entry in orkpack: generic plan, every 2-D weight taken as a dense matmul run once per token, "
                "no MoE routing; or pass --no-plan to place by rules"]

    def opt(key: str) -> int:
        v = cfg.get(key)
        if v is None:
            return 0
        return _int(v, key, where, cap=CAPS["n_layers"] if key == "num_hidden_layers" else CAP_DEFAULT) or 0

    L = opt("num_hidden_layers") or (max(layers) + 1 if layers else 0)
    H, nh = opt("hidden_size"), opt("num_attention_heads")
    nkv = opt("num_key_value_heads") or nh
    hd = opt("head_dim") or (H // nh if nh else 0)
    if not (L and nkv and hd):
        warnings.append("KV cache not counted: config.json lacks num_hidden_layers / num_attention_heads / "
                        "hidden_size; leave headroom for it")
        kk = 0
    else:
        kk = nkv * hd
    return {
        "arch": arch, "n_layers": L, "hidden": H, "intermediate": opt("intermediate_size"), "heads": nh,
        "kv_heads": nkv, "head_dim": hd, "vocab": opt("vocab_size"), "n_experts": 0, "n_experts_used": 0,
        "moe_intermediate": 0, "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "attention": "gqa" if kk else "unknown", "kv_k": kk, "kv_v": kk, "swa_window": 0, "swa_layers": [],
        "recurrent_layers": [], "state": 0, "recurrent_flops": 0, "parallel_layers": [], "ffn_layers": [],
        "swa_kv_k": 0, "swa_kv_v": 0, "kv_shared_layers": [],
    }, warnings


def param_count(cfg: Mapping[str, Any]) -> int:
    """Parameters of a checkpoint with this config (every listed tensor's elements)."""
    return sum(math.prod(s) for _, s, _ in hf_tensors(cfg)[1])


def layers_in_config(cfg: Mapping[str, Any] | None) -> int:
    """Decoder layers (MTP layers included) a config declares, for naming; 0 when unknown or malformed.

    SourceError for NaN or Infinity anywhere in it: every reader of a config.json beside weights calls this,
    and such a config could not go into a pack's header.
    """
    if isinstance(cfg, Mapping):
        _finite(cfg, "config.json")
    fam = config_family(cfg) if isinstance(cfg, Mapping) else None
    if fam is None:
        v = cfg.get("num_hidden_layers") if isinstance(cfg, Mapping) else None
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= CAPS["n_layers"] else 0
    try:
        d = _dims(cfg, fam, "config.json")
    except SourceError:
        return 0
    return d["L"] + d["n_nextn"]


# FP8 quantizes the linear layers only: not norms, embeddings, the head, routers, biases, convolution kernels
# (Qwen3.5's linear_attn.conv1d, LFM2's conv.conv, Mamba2's conv1d)
_FP8_SKIP = re.compile(r"(?:norm|embed_tokens|lm_head|\.gate\.weight$|router|e_score_correction_bias|\.bias$|sinks"
                       r"|conv1d\.weight$|\.conv\.conv\.weight$)")


def converted_dtype(arch: str | None, name: str, dtype: str) -> str:
    """The dtype a tensor reads as once the converter's value changes are made (``Family.convert``: ``neg_exp``
    is computed and stored in float32); else ``dtype``."""
    fam = FAMILIES.get(arch) if arch else None
    if fam is None or not fam.convert:
        return dtype
    from .globs import matches

    return "F32" if any(c.op == "neg_exp" and matches(name, c.glob) for c in fam.convert) else dtype


def stored_dtype(cfg: Mapping[str, Any], hf_name: str, default: str) -> str:
    """The dtype a tensor of a quantized release is stored in (as the readers report it), else ``default``.

    MXFP4 (gpt-oss): the expert ``gate_up_proj`` / ``down_proj``. FP8 (block or
    per-channel scales): the linear weights of the decoder layers; embeddings,
    the head, norms, routers and biases stay in the checkpoint's float type.
    """
    qc = cfg.get("quantization_config") if isinstance(cfg, Mapping) else None
    method = qc.get("quant_method") if isinstance(qc, Mapping) else None
    if method == "mxfp4":
        return "MXFP4" if re.search(r"\.mlp\.experts\.(gate_up_proj|down_proj)$", hf_name) else default
    if method in ("fp8", "compressed-tensors") and ".layers." in hf_name and hf_name.endswith(".weight") \
            and not _FP8_SKIP.search(hf_name):
        fmt = qc.get("fmt", "e4m3")
        return "F8_E5M2" if fmt == "e5m2" else "F8_E4M3"
    return default


def record_values(cfg: Mapping[str, Any], where: str = "config.json") -> list[tuple[str, int]]:
    """The family's ``record`` entries of a config: [(GGUF key after "{arch}.", value)] whose flags hold."""
    fam = config_family(cfg)
    if fam is None or not fam.record:
        return []
    d = _dims(cfg, fam, where)
    flags = _model_flags(fam, cfg, d)
    return [(key, _eval(expr, d)) for key, expr, when in fam.record if _holds(tuple(when.split()), flags)]


def dims(cfg: Mapping[str, Any], where: str = "config.json") -> dict:
    """The named dimensions of a known family's config (``H``, ``nh``, ``kvlr``, ...), checked."""
    fam = config_family(cfg)
    if fam is None:
        raise SourceError(f"{where}: model_type {escape_name(repr(cfg.get('model_type')), 60)} is not a known "
                          "architecture")
    return _dims(cfg, fam, where)


def evaluate(expr: Any, d: Mapping[str, int]) -> int:
    """A shape or state expression (an int, or dims with + - * and parentheses) over the dims of :func:`dims`."""
    return _eval(expr, d)


def gguf_generic_config(kv: Mapping[str, Any]) -> dict:
    """The config.json keys :func:`generic_facts` reads, from the GGUF metadata of an architecture
    without an entry (``{arch}.block_count`` ... are the same keys for every GGUF architecture)."""
    garch = kv.get("general.architecture")
    out: dict[str, Any] = {"model_type": garch if isinstance(garch, str) else None}
    for hf, key in (("num_hidden_layers", "block_count"), ("hidden_size", "embedding_length"),
                    ("num_attention_heads", "attention.head_count"), ("num_key_value_heads", "attention.head_count_kv"),
                    ("head_dim", "attention.key_length"), ("intermediate_size", "feed_forward_length")):
        v = kv.get(f"{garch}.{key}")
        if isinstance(v, (list, tuple)):  # per-layer arrays: the largest
            v = max(v) if v else None
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, int) and not isinstance(v, bool):
            out[hf] = v
    return out
