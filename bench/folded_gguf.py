"""The model ``orkpack build --rotate`` encodes, as a float GGUF: every pre-norm's gain folded into the matrices it
feeds (the gains stored as 1, the head untied), and with ``--rotate`` the rotation too (R1 and R2 of
orkpack/transforms/rotate.py, seed ``--seed``). Every metadata key of the input is kept; tensors F32.

    python bench/folded_gguf.py IN.gguf OUT.gguf [--rotate] [--seed N] [--down-hadamard]

Issue 25's question: does folding the gains alone (no rotation) change what NF4 does? ``orkpack build OUT.gguf``
then encodes the folded model without any rotation, and ``orkpack eval OUT.gguf PACK`` scores it against the folded
float model (the same logits as IN's within float32 rounding: tests/test_rotate.py). With ``--rotate`` it is the
rotated model as a plain source: a cross-check of a ``--rotate`` pack's eval (same weights, no rotation records).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def folded(src_path: Path, out: Path, rotate: bool, seed: int = 0, down: bool = False) -> None:
    from orkpack.sources import open_source
    from orkpack.transforms.rotate import Rotation, rotated

    src = open_source(src_path, on_warning=lambda m: None)
    rs = rotated(src, seed)
    if not rotate:  # the folds alone: every rotation dropped from the plan
        rs.plan.ops = {n: [op for op in ops if op[0] != "rot"] for n, ops in rs.plan.ops.items()}
    r4 = []

    def tensors():
        for i in rs.tensors():  # the untied head right after the embedding
            v = rs.read(i.name)
            if down and i.name.endswith(".ffn_down.weight"):  # W -> W H: its input must then be rotated online
                r4[:] = r4 or [Rotation("r4", v.shape[1], seed)]
                v = r4[0].apply(v, 1)
            yield i.name, v

    write_f32_gguf(src_path, out, tensors())
    src.close()


def write_f32_gguf(src_path: Path, out: Path, tensors) -> None:
    """A GGUF of every metadata key of ``src_path`` (file type ALL_F32) and the (name, array) ``tensors``, as F32."""
    import gguf

    r = gguf.GGUFReader(str(src_path))
    w = gguf.GGUFWriter(str(out), arch=str(r.fields["general.architecture"].contents()))
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.file_type"):
            continue
        sub = f.types[1] if f.types and f.types[0] == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    w.add_key_value("general.file_type", int(gguf.LlamaFileType.ALL_F32), gguf.GGUFValueType.UINT32)
    for name, v in tensors:
        w.add_tensor(name, np.ascontiguousarray(v, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rotate", action="store_true", help="fold and rotate (default: fold the gains only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--down-hadamard", action="store_true",
                    help="also each ffn_down's columns times the randomized Hadamard R4 of its width (seed --seed): "
                         "the model is then only right with h -> h R4 online before ffn_down (bench/online_hadamard.py)")
    a = ap.parse_args()
    folded(a.src, a.out, a.rotate, a.seed, a.down_hadamard)
    print(f"wrote {a.out}")
