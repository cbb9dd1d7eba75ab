"""A GGUF's weights dequantized to F32, every metadata key kept (tokenizer, chat template, hyperparameters).

    python bench/gguf_f32.py IN.gguf OUT.gguf

What llama-quantize reads to re-quantize the same float weights an orkpack build of IN.gguf (or of an HF
folder made from it) starts from; docs/EVAL.md's NF4 table feeds it the SmolLM2-135M Q4_1 release.
bench/dithered_smollm2.py is the same copy with one step of noise per weight (native-like F16).
"""
from __future__ import annotations

import sys

import numpy as np


def rewrite(src: str, out: str, tensor, file_type: int) -> None:
    """Copy the GGUF ``src`` to ``out`` with every metadata key, ``general.file_type`` set to ``file_type`` and
    each tensor replaced by ``tensor(t)`` (a numpy array, numpy order) of its gguf-py ReaderTensor ``t``."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, arch=str(r.fields["general.architecture"].contents()))
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.file_type"):
            continue
        sub = f.types[1] if f.types and f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    w.add_key_value("general.file_type", int(file_type), gguf.GGUFValueType.UINT32)
    for t in r.tensors:
        w.add_tensor(t.name, tensor(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def shape_of(t) -> list[int]:
    """A ReaderTensor's shape in numpy order."""
    return [int(x) for x in reversed(t.shape)]


def to_f32(src: str, out: str) -> None:
    import gguf
    from gguf.quants import dequantize

    rewrite(src, out, lambda t: dequantize(t.data, t.tensor_type).reshape(shape_of(t)).astype(np.float32),
            gguf.LlamaFileType.ALL_F32)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1].strip())
    to_f32(sys.argv[1], sys.argv[2])
    print(f"wrote {sys.argv[2]}")
