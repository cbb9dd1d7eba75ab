"""TII Falcon-H1 (falcon_h1: attention and a Mamba2 mixer in parallel in every layer, then a SwiGLU MLP, muP multipliers
folded into the weights) against llama.cpp's converter and transformers.

A tiny random ``FalconH1ForCausalLM`` (seeded; hidden 64, 3 layers, d_inner 96 = mamba_d_ssm, not 2 x hidden; 6 Mamba2
heads of 16 in 2 groups; every multiplier away from 1) is saved by transformers and converted by llama.cpp's own
``convert_hf_to_gguf.py --outtype f32`` as tests/test_lfm2.py does. The converter (FalconH1Model) folds the
multipliers into the weights: embedding_multiplier into token_embd, lm_head_multiplier into output, key_multiplier x
attention_in_multiplier into attn_k (two float32 products, in that order), attention_in_multiplier into attn_q and
attn_v, attention_out_multiplier into attn_output, ssm_in_multiplier and then ssm_multipliers[0..4] (per z / x / B / C /
dt segment of the rows) into ssm_in, ssm_out_multiplier into ssm_out, mlp_multipliers into ffn_gate and ffn_down.
orkpack's reader of the folder must make the same folds (archs Convert "scale"), so that, tensor for tensor, the
folder reads as the converter's GGUF; the model record must hold the converter's falcon-h1.* keys; the forward pass
(attention + Mamba2 summed, no multiplier left to apply) transformers' logits, from the folder and from the GGUF.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from orkpack import archs, keepfloat, synth
from orkpack.errors import SourceError
from orkpack.sources import model_facts, open_source
from orkpack.sources.modelkv import from_gguf_fields, from_hf
from orkpack.tiers.manifest import manifest_from_config

from test_granite_hybrid import _redraw
from test_lfm2 import FIXTURES, TOL, _converter, _read_all, build_verify_eval, tiny_model

ARCH = "falcon_h1"


def _config(**over) -> dict:
    cfg = {k: v for k, v in synth.TINY[ARCH].items() if k not in ("architectures", "model_type", "torch_dtype")}
    return dict(cfg, vocab_size=320, **over)  # the tokenizer's 3 + 256 + 61 tokens


def _tiny(tmp_path_factory, name: str, **over):
    return tiny_model(tmp_path_factory.mktemp(name), "FalconH1ForCausalLM", "FalconH1Config", _config(**over), _redraw)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(HF folder, the converter's GGUF, tokens, transformers' logits)."""
    return _tiny(tmp_path_factory, "falconh1")


@pytest.fixture(scope="module")
def normed(tmp_path_factory):
    """The gated-norm variant (mamba_rms_norm, the gate before the norm as llama.cpp's graph has it)."""
    return _tiny(tmp_path_factory, "falconh1n", mamba_rms_norm=True, mamba_norm_before_gate=False)
