"""llama.cpp's converter's rules: what ``convert_hf_to_gguf.py`` (llama.cpp 0c1e570) changes in the tensors an HF
reader gives under their canonical names, so that they are the converter's GGUF tensors, name, shape and value.

One copy, used by ``orkpack.synth.write_gguf_from_hf(llama_cpp=True)`` (synthetic converter-like GGUFs) and by
``orkpack export`` of a pack built from an HF folder (orkpack/eval/export.py). What an HF reader already does the
converter's way (renames, ``orkpack.archs.Convert``: Mamba's ``-exp(A_log)``, the value-head reorder, Falcon-H1's
multipliers; ``orkpack.archs.Split``) is not repeated here; this module holds what the reader leaves in the
checkpoint's own layout because orkpack's forward pass reads that layout:

* q/k rows (and biases) permuted for the families whose converter permutes them (``Forward.gguf_permuted_qk``:
  LlamaModel.permute, pairs of rotary halves interleaved);
* norm gains stored as ``offset + w`` (gemma's and Qwen3.5 / Qwen3-Next's ``Forward.norm_offset``), but the
  Gated DeltaNet's gated norm ``ssm_norm`` (a plain gain, which the converter leaves as it is);
* fused tensors the converter splits: internlm2's grouped ``wqkv`` into ``attn_q`` / ``attn_k`` / ``attn_v``,
  stacked ``gate_up`` experts into gate and up (halves; gpt-oss: even / odd rows);
* a multimodal release's vision tower and projector, which a pack may hold under their checkpoint names: not in the
  text model's GGUF (the converter writes them to a separate mmproj file);
* names the converter spells its own way: gpt-oss's attention sinks, ``blk.N.attn_sinks`` in the checkpoint's
  naming, written ``blk.N.attn_sinks.weight`` (GptOssModel.modify_tensors appends ``.weight``; llama.cpp looks
  the tensor up under that name).

The hyperparameter keys are the model record's (orkpack/sources/modelkv.py), and llama3's RoPE factors tensor
``rope_freqs.weight`` is computed from the config by orkpack.model.hparams (the layer above), by both users.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .base import as_float32

_Q = re.compile(r"^blk\.\d+\.attn_q\.(weight|bias)$")
_K = re.compile(r"^blk\.\d+\.attn_k\.(weight|bias)$")
_GATE_UP_EXPS = re.compile(r"^(blk\.\d+\.)ffn_gate_up_exps\.(weight|bias)$")
_QKV = re.compile(r"^(blk\.\d+\.)attn_qkv\.(weight|bias)$")
_SINKS = re.compile(r"^(blk\.\d+\.attn_sinks)$")
# a multimodal release's towers a pack keeps under their checkpoint names (Gemma 3's SigLIP and projector): the
# converter writes them to a separate mmproj GGUF, never the text model's
_MMPROJ = re.compile(r"^(?:model\.)?(?:vision_tower|multi_modal_projector|visual|audio_tower|embed_vision|embed_audio)\.")

# the norms of an offset family that are plain gains: the Gated DeltaNet's gated RMSNorm (Qwen3NextModel.modify_tensors:
# every norm.weight + 1 but linear_attn.norm.weight, which is ssm_norm)
_UNOFFSET = ("ssm_norm.weight",)

Part = Callable[[np.ndarray], np.ndarray]


def _same(a: np.ndarray) -> np.ndarray:
    return a


@dataclass(frozen=True)
class Rules:
    """The converter's rules for one model (:func:`rules`)."""
    fam: object  # orkpack.archs.Family
    facts: dict

    def split(self, name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], Part]]:
        """[(the converter's name, its numpy shape, source array -> that tensor's array)] of the source tensor
        ``name`` of ``shape``: one entry unless the converter splits it, none for a tower it writes to the mmproj
        GGUF."""
        fwd = self.fam.forward
        shape = tuple(int(x) for x in shape)
        if _MMPROJ.match(name):
            return []
        e = _GATE_UP_EXPS.match(name)
        if e:  # stacked gate_up experts: gate and up apart (granitemoe: halves; gpt-oss: even / odd rows)
            n = shape[1] // 2
            interleaved = fwd is not None and fwd.mlp == "interleaved"
            sl = ((slice(None), slice(0, None, 2)), (slice(None), slice(1, None, 2))) if interleaved else \
                ((slice(None), slice(0, n)), (slice(None), slice(n, None)))
            return [(f"{e.group(1)}ffn_{x}_exps.{e.group(2)}", (shape[0], n, *shape[2:]),
                     lambda a, s=s: np.ascontiguousarray(a[s])) for x, s in zip(("gate", "up"), sl)]
        s = _SINKS.match(name)
        if s:
            return [(f"{s.group(1)}.weight", shape, _same)]
        m = _QKV.match(name)
        if not (m and fwd is not None and fwd.qkv == "grouped"):
            return [(name, shape, _same)]
        nh, nkv, hd = self.facts["heads"], self.facts["kv_heads"], self.facts["head_dim"]
        rest = shape[1:]

        def part(which: str) -> Part:
            def fn(a: np.ndarray) -> np.ndarray:
                g = a.reshape(nkv, nh // nkv + 2, hd, *rest)
                sel = g[:, : nh // nkv] if which == "q" else g[:, -2 if which == "k" else -1]
                return np.ascontiguousarray(sel).reshape(-1, *rest)
            return fn

        return [(f"{m.group(1)}attn_{x}.{m.group(2)}", ((nh if x == "q" else nkv) * hd, *rest), part(x))
                for x in ("q", "k", "v")]

    def fix(self, name: str, a: np.ndarray) -> np.ndarray:
        """The array of the converter's tensor ``name`` (after :meth:`split`) as the converter stores it."""
        fwd = self.fam.forward
        if fwd is None:
            return a
        if fwd.gguf_permuted_qk and _Q.match(name):
            return np.ascontiguousarray(_permute(a, self.facts["heads"]))
        if fwd.gguf_permuted_qk and _K.match(name):
            return np.ascontiguousarray(_permute(a, self.facts["kv_heads"]))
        if self.float32(name):
            return as_float32(a) + np.float32(fwd.norm_offset)
        return a

    def float32(self, name: str) -> bool:
        """Whether the converter writes ``name`` as F32 whatever the source's type (an offset norm gain)."""
        fwd = self.fam.forward
        return fwd is not None and bool(fwd.norm_offset) and name.endswith("norm.weight") and \
            not name.endswith(_UNOFFSET)

    def tensors(self, name: str, shape) -> list[tuple[str, tuple[int, ...], Part]]:
        """:meth:`split` with :meth:`fix` applied to each part."""
        return [(g, s, lambda a, g=g, part=part: self.fix(g, part(a))) for g, s, part in self.split(name, shape)]


def _permute(a: np.ndarray, heads: int) -> np.ndarray:  # llama.cpp's LlamaModel.permute
    return a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


def rules(fam, facts: dict) -> Rules:
    """The converter's rules for a model of family ``fam`` (orkpack.archs.Family) with ``facts``
    (orkpack.sources.model_facts: heads, kv_heads, head_dim)."""
    return Rules(fam, facts)
