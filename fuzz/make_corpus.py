"""Seed the fuzz corpora from real small files built with orkpack.synth + orkpack.build.

    python fuzz/make_corpus.py corpus/      # writes corpus/pack, corpus/safetensors, corpus/gguf

Each seed is prefixed with the mode byte the target's harness expects
(fuzz/harness.py): packs raw (0), with checksums to fix (1) and as a wrapped
header (2); safetensors as is (0) and as header + data (1); GGUF files as is.
"""
from __future__ import annotations

import struct
import sys
import tempfile
from pathlib import Path

from orkpack.build import BuildOptions, build
from orkpack.pack import spec
from orkpack.synth import write_gguf_model, write_hf_model

TINY = dict(layers=1, hidden=64, intermediate=96, heads=2, kv_heads=1, vocab=64)


def _dual_tiermap(model: Path, path: Path) -> Path:
    """A tier map with two NPU items, both dual-resident (NPU int8 tiles + a host NF4 copy, format 1.2)."""
    from dataclasses import replace

    from orkpack.tiers.command import plan
    from orkpack.tiers.tiermap import TierMap, dumps

    pins = {"npu": ["blk.0.attn_q.weight", "blk.0.ffn_up.weight"], "cpu": [], "int8": [], "nf4": [], "keep": []}
    tm, _, _ = plan(model, pins=pins)
    nf4 = lambda n: (n + 1) // 2 + 4 * -(-n // 64)  # noqa: E731
    decs = [replace(d, host_copy="nf4", host_copy_bytes=nf4(d.shape[0] * d.shape[1])) if d.tier == "npu" else d
            for d in tm.decisions]
    path.write_text(dumps(TierMap(decs, model=tm.model, board=tm.board, options=tm.options, objective=tm.objective,
                                  budget=tm.budget, prediction=tm.prediction)))
    return path


def main(out: Path) -> None:
    for sub in ("pack", "safetensors", "gguf"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        hf = write_hf_model(td / "hf", seed=0, **TINY)
        moe = write_hf_model(td / "moe", seed=1, experts=2, experts_used=1, shards=1, dtype="f16", **TINY)
        packs = [
            build(hf, td / "a.orkpack", BuildOptions(threads=1, npu=["blk.0.attn_q.weight"])).path,
            build(hf, td / "b.orkpack", BuildOptions(threads=1, npu=["blk.0.ffn_up.weight"], npu_storage="nf4",
                                                     keep=["token_embd.weight"])).path,
            build(moe, td / "c.orkpack", BuildOptions(threads=1, int8=["blk.0.ffn_down_exps.weight"])).path,
            build(hf, td / "d.orkpack", BuildOptions(threads=1, tiermap=_dual_tiermap(hf, td / "dual.json"))).path,
            # the double-quantized integer encodings (format 1.7): every host item int5dq / int6dq, then int8dq
            build(hf, td / "e.orkpack", BuildOptions(threads=1, host_low="int5dq", host_high="int6dq",
                                                     nf4=["blk.0.attn_q.weight", "blk.0.ffn_up.weight"])).path,
            build(hf, td / "f.orkpack", BuildOptions(threads=1, host_low="int6dq", host_high="int8dq",
                                                     int8=["blk.0.attn_v.weight"])).path,
        ]
        for i, p in enumerate(packs):
            raw = p.read_bytes()
            hoff = struct.unpack_from("<Q", raw, 40)[0]
            (out / "pack" / f"raw{i}").write_bytes(b"\0" + raw)
            (out / "pack" / f"fix{i}").write_bytes(b"\1" + raw)
            pages = (hoff - spec.PREAMBLE_BLOCK) // spec.ALIGN
            (out / "pack" / f"hdr{i}").write_bytes(b"\2" + bytes([min(pages, 255)]) + raw[hoff:])
        for i, f in enumerate(sorted(hf.glob("*.safetensors")) + sorted(moe.glob("*.safetensors"))):
            raw = f.read_bytes()
            n = struct.unpack_from("<Q", raw)[0]
            (out / "safetensors" / f"raw{i}").write_bytes(b"\0" + raw)
            (out / "safetensors" / f"hdr{i}").write_bytes(b"\1" + raw[8:8 + n] + b"\n" + raw[8 + n:8 + n + 4096])
        for i, tt in enumerate(("F16", "BF16", "Q8_0", "Q4_0", "F32")):
            g = write_gguf_model(td / f"m{i}.gguf", seed=i, tensor_type=tt, **TINY)
            (out / "gguf" / f"{tt}").write_bytes(g.read_bytes())
        g = write_gguf_model(td / "moe.gguf", seed=3, experts=2, experts_used=1, tensor_type="Q8_0", **TINY)
        (out / "gguf" / "moe").write_bytes(g.read_bytes())
    for sub in ("pack", "safetensors", "gguf"):
        print(sub, len(list((out / sub).iterdir())), "seeds")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "corpus"))
