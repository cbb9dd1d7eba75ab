"""llama.cpp-format quantizations of a model, made with gguf-py (to score them with ``orkpack eval``).

``python -m orkpack.eval.llamaquant SOURCE OUT.gguf --type Q4_0`` writes SOURCE (an HF folder, a
.safetensors or a .gguf; quantized GGUFs are dequantized first) as a GGUF whose 2-D and 3-D
weights are ``gguf.quants.quantize(w, TYPE)`` (llama.cpp's reference quantizers, bit-exact), 1-D
tensors F32. As llama-quantize does, the output head (``output.weight``, or ``token_embd.weight``
when the head is tied to it) is kept at Q8_0 when TYPE is 4- or 5-bit and its width is not a
multiple of 256 (its Q6_K would not fit). A GGUF source's metadata is copied as it is (so it keeps
its tokenizer); an HF source's is the model record orkpack builds from its config and tokenizer
files (orkpack.sources.modelkv), and its tensors are laid out as llama.cpp's converter lays them out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from ..errors import OrkError, escape_name
from ..pack.model import value
from ..sources import open_source
from ..sources.base import as_float32

TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


def _record(src) -> dict | None:
    if src.kind == "gguf":
        return src.model_metadata()
    from ..sources.modelkv import from_hf

    root = Path(src.root)
    return from_hf(root if root.is_dir() else root.parent, src.config)


def write(source, out, qtype: str = "Q4_0") -> Path:
    """SOURCE as a llama.cpp GGUF of ``qtype``. An HF source is first laid out as llama.cpp's converter
    lays it out (``orkpack.synth.write_gguf_from_hf(llama_cpp=True)``: q/k rows permuted, norm offsets,
    fused tensors split, llama3 RoPE factors), into a float GGUF beside OUT that is removed after, and
    keeps the tokenizer keys of its own model record; a GGUF source is read as it is."""
    if qtype not in TYPES:
        raise OrkError(f"--type {qtype!r}: choose one of {', '.join(TYPES)}")
    src = open_source(source, on_warning=lambda m: None)
    if src.kind == "gguf":
        return _write(src, out, qtype, src.model_metadata() or {"kv": []})
    from ..synth import write_gguf_from_hf

    rec = _record(src) or {"kv": []}
    src.close()
    tmp = Path(out).parent / f".{Path(out).name}.f32.gguf"
    try:
        write_gguf_from_hf(source, tmp, llama_cpp=True)
        laid = open_source(tmp, on_warning=lambda m: None)
        mine = laid.model_metadata() or {"kv": []}
        have = {e[0] for e in mine["kv"]}
        mine["kv"] += [e for e in rec["kv"] if e[0].startswith("tokenizer.") and e[0] not in have]
        return _write(laid, out, qtype, mine)
    finally:
        tmp.unlink(missing_ok=True)


def _write(src, out, qtype: str, rec: dict) -> Path:
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFValueType as VT

    try:
        kv = {e[0]: e for e in rec["kv"]}
        garch = value(kv["general.architecture"]) if "general.architecture" in kv else (src.arch or "llama")
        w = gguf.GGUFWriter(Path(out), garch)
        vt = {t.name.lower(): t for t in VT}
        for key, typ, _ in rec["kv"]:
            if key in ("general.architecture", "general.file_type"):
                continue
            v = value(kv[key])
            if typ.startswith("array["):
                inner = typ[6:-1]
                if inner.startswith("array["):
                    continue  # nested arrays: none of the keys a runtime reads
                w.add_key_value(key, v, VT.ARRAY, sub_type=vt[inner])
            else:
                w.add_key_value(key, v, vt[typ])
        w.add_file_type({"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9}[qtype])
        infos = src.tensors()
        names = {t.name for t in infos}
        head = "output.weight" if "output.weight" in names else "token_embd.weight"
        for t in infos:
            a = as_float32(src.read(t.name))
            if a.ndim < 2:
                w.add_tensor(t.name, np.ascontiguousarray(a, dtype=np.float32))
                continue
            q = Q[qtype]
            if t.name == head and qtype != "Q8_0" and a.shape[-1] % 256:
                q = Q.Q8_0
            if a.shape[-1] % 32:
                w.add_tensor(t.name, np.ascontiguousarray(a, dtype=np.float32))  # not quantizable: F32
                continue
            w.add_tensor(t.name, gguf.quants.quantize(a, q), raw_dtype=q)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    finally:
        src.close()
    return Path(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orkpack.eval.llamaquant", description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--type", default="Q4_0", choices=TYPES)
    a = ap.parse_args(argv)
    try:
        write(a.source, a.out, a.type)
    except OrkError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"wrote {escape_name(a.out)} ({a.type})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
