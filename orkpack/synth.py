"""Seeded synthetic checkpoints: an HF folder and a GGUF holding the same weights.

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

from .sources.names import ARCH_TO_GGUF_ARCH

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral")
_HF_CLASS = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
}
_DT = {"bf16": ("BF16", np.uint16, "bfloat16"), "f16": ("F16", np.float16, "float16"),
       "f32": ("F32", np.float32, "float32")}


@dataclass(frozen=True)
class _T:
    canonical: str  # GGUF name (stacked name for experts)
    hf: tuple[str, ...]  # one HF name, or one per expert
    shape: tuple[int, ...]  # per HF tensor (per expert)
    kind: str  # "w" matrix, "norm", "bias"
    experts: int = 0  # >0: stacked over this many experts


def _resolve(arch: str, experts: int, experts_used: int) -> str:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, not {arch!r}")
    if experts > 0 and arch == "llama":
        arch = "qwen3_moe"  # documented: experts > 0 on the default arch writes qwen3_moe-style names
    if (experts > 0) != (arch in ("qwen3_moe", "mixtral")):
        raise ValueError(f"arch {arch} needs experts {'> 0' if arch in ('qwen3_moe', 'mixtral') else '== 0'}")
    if experts and not 0 < experts_used <= experts:
        raise ValueError("experts_used must be in 1..experts")
    return arch


def _plan(arch: str, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int,
          experts: int, tied: bool) -> list[_T]:
    if hidden % heads or heads % kv_heads:
        raise ValueError("hidden must be a multiple of heads, heads a multiple of kv_heads")
    hd = hidden // heads
    out = [_T("token_embd.weight", ("model.embed_tokens.weight",), (vocab, hidden), "w")]
    for i in range(layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out.append(_T(b + "attn_norm.weight", (p + "input_layernorm.weight",), (hidden,), "norm"))
        for proj, gg, n in (("q", "attn_q", heads * hd), ("k", "attn_k", kv_heads * hd), ("v", "attn_v", kv_heads * hd)):
            out.append(_T(f"{b}{gg}.weight", (f"{p}self_attn.{proj}_proj.weight",), (n, hidden), "w"))
            if arch == "qwen2":
                out.append(_T(f"{b}{gg}.bias", (f"{p}self_attn.{proj}_proj.bias",), (n,), "bias"))
        out.append(_T(b + "attn_output.weight", (p + "self_attn.o_proj.weight",), (hidden, heads * hd), "w"))
        if arch in ("qwen3", "qwen3_moe"):
            out.append(_T(b + "attn_q_norm.weight", (p + "self_attn.q_norm.weight",), (hd,), "norm"))
            out.append(_T(b + "attn_k_norm.weight", (p + "self_attn.k_norm.weight",), (hd,), "norm"))
        out.append(_T(b + "ffn_norm.weight", (p + "post_attention_layernorm.weight",), (hidden,), "norm"))
        if experts:
            moe = "block_sparse_moe" if arch == "mixtral" else "mlp"
            names = {"gate": "w1", "up": "w3", "down": "w2"} if arch == "mixtral" else \
                {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
            out.append(_T(b + "ffn_gate_inp.weight", (f"{p}{moe}.gate.weight",), (experts, hidden), "w"))
            for proj in ("gate", "up", "down"):
                shape = (hidden, intermediate) if proj == "down" else (intermediate, hidden)
                hf = tuple(f"{p}{moe}.experts.{e}.{names[proj]}.weight" for e in range(experts))
                out.append(_T(f"{b}ffn_{proj}_exps.weight", hf, shape, "w", experts))
        else:
            out.append(_T(b + "ffn_gate.weight", (p + "mlp.gate_proj.weight",), (intermediate, hidden), "w"))
            out.append(_T(b + "ffn_up.weight", (p + "mlp.up_proj.weight",), (intermediate, hidden), "w"))
            out.append(_T(b + "ffn_down.weight", (p + "mlp.down_proj.weight",), (hidden, intermediate), "w"))
    out.append(_T("output_norm.weight", ("model.norm.weight",), (hidden,), "norm"))
    if not tied:
        out.append(_T("output.weight", ("lm_head.weight",), (vocab, hidden), "w"))
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
        yield _values(seed, t.canonical, t.shape, t.kind)


def _to_dtype(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return bits
    f32 = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return f32.astype(np.float16) if dtype == "f16" else f32


def _config(arch: str, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int,
            experts: int, experts_used: int, tied: bool, dtype: str) -> dict:
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


def write_hf_model(folder, *, arch: str = "llama", layers: int = 2, hidden: int = 256, intermediate: int = 688,
                   heads: int = 4, kv_heads: int = 2, vocab: int = 512, experts: int = 0, experts_used: int = 0,
                   shards: int = 2, dtype: str = "bf16", seed: int = 0, tied: bool = False) -> Path:
    """Write an HF folder (config.json, shards, index); returns the folder. dtype: bf16, f16 or f32.

    ``experts > 0`` with ``arch="llama"`` writes a qwen3_moe model (per-expert
    ``mlp.experts.E.{gate,up,down}_proj`` and the ``mlp.gate`` router);
    ``arch="mixtral"`` uses ``block_sparse_moe.experts.E.w1/w2/w3``. Expert
    width is ``intermediate``.
    """
    if dtype not in _DT:
        raise ValueError(f"dtype must be one of {tuple(_DT)}")
    arch = _resolve(arch, experts, experts_used)
    plan = _plan(arch, layers, hidden, intermediate, heads, kv_heads, vocab, experts, tied)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    st, npdt, _ = _DT[dtype]
    item = np.dtype(npdt).itemsize
    flat = [(t, i, h) for t in plan for i, h in enumerate(t.hf)]  # (tensor, expert, hf name)
    sizes = [math.prod(t.shape) * item for t, _, _ in flat]
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
    arrays = (a for t in plan for a in _arrays(t, seed))  # flat order; shards are contiguous runs of it
    for fname, members in zip(fnames, groups):
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for j in members:
            t, e, hfname = flat[j]
            header[hfname] = {"dtype": st, "shape": list(t.shape), "data_offsets": [off, off + sizes[j]]}
            weight_map[hfname] = fname
            off += sizes[j]
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(folder / fname, "wb") as f:
            f.write(len(hb).to_bytes(8, "little"))
            f.write(hb)
            for _ in members:
                arr = next(arrays)
                f.write(np.ascontiguousarray(_to_dtype(arr, dtype)).data)  # no copy
    cfg = _config(arch, layers, hidden, intermediate, heads, kv_heads, vocab, experts, experts_used, tied, dtype)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
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


def write_gguf_model(path, *, arch: str = "llama", layers: int = 2, hidden: int = 256, intermediate: int = 688,
                     heads: int = 4, kv_heads: int = 2, vocab: int = 512, experts: int = 0, experts_used: int = 0,
                     seed: int = 0, tied: bool = False, tensor_type: str = "F16",
                     shards: int | None = None, dtype: str | None = None) -> Path:
    """Write the same model as ``write_hf_model`` (same arguments and seed) as one GGUF; returns the path.

    ``tensor_type`` applies to 2-D and 3-D weights (F32, F16, BF16, Q8_0, Q4_0;
    a quantized type falls back to F16 when K is not a multiple of 32); 1-D
    tensors and the router stay F32. HF-only options (``shards``, ``dtype``) are
    accepted and ignored so one options dict can drive both writers.
    """
    import gguf

    if tensor_type not in _GGUF_TYPES:
        raise ValueError(f"tensor_type must be one of {_GGUF_TYPES}")
    arch = _resolve(arch, experts, experts_used)
    plan = _plan(arch, layers, hidden, intermediate, heads, kv_heads, vocab, experts, tied)
    path = Path(path)
    garch = ARCH_TO_GGUF_ARCH[arch]
    w = gguf.GGUFWriter(path, garch)
    w.add_name(f"orkpack synthetic {arch} seed {seed}")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(intermediate)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hidden // heads)
    w.add_value_length(hidden // heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(experts_used)
        if arch == "qwen3_moe":
            w.add_expert_feed_forward_length(intermediate)
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
