"""Issue 25: what an online Hadamard before ``ffn_down`` (SpinQuant's R4) would buy the w8a8 prefill path, measured in
the eval's own numerics before any runtime is asked for it.

    python bench/folded_gguf.py S.gguf rotH.gguf --rotate --down-hadamard       # ffn_down's columns W -> W R4
    orkpack build rotH.gguf -o rotH.orkpack --no-plan --npu '*'
    python bench/online_hadamard.py S.gguf rotH.orkpack --down-hadamard [--act token|float] [--chunks 2]

SOURCE is the float model the pack's logits are compared with (the original: the folded, rotated model computes
the same logits). Every matmul runs in ``orkpack eval``'s prefill numerics (orkpack.eval.weights.PackWeights: int8
weights per channel, int8 activations per token, M = ``--ctx``); with ``--down-hadamard`` each ffn_down's input
``h`` (the SwiGLU output) is first rotated ``h -> h R4`` in float (float64, rounded to float32), what a runtime
would do before quantizing it. Scored as ``orkpack eval`` scores: chunks of ``--ctx`` from the built-in prose, the
BOS first, the second half of each chunk; KLD against SOURCE's float logits. Without ``--down-hadamard`` it is the
eval's prefill KLD of the pack (the check of this script).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def online(inner, seed: int = 0):
    """A weight provider that rotates each ffn_down input ``h -> h R4`` (float64, rounded to float32) before ``inner``
    (any provider: a pack's numerics, or a float model) multiplies it: what a runtime would do."""
    from orkpack.model.weights import Wrapped
    from orkpack.transforms.rotate import Rotation

    r4: dict = {}

    class Online(Wrapped):
        def matmul(self, name, x, expert=None):
            if name.endswith(".ffn_down.weight"):
                r = r4.setdefault(x.shape[-1], Rotation("r4", x.shape[-1], seed))
                x = r.apply(x).astype(np.float32)
            return self.inner.matmul(name, x, expert)

    return Online(inner)


def main() -> None:
    from orkpack.eval import run as ev
    from orkpack.eval.text import source_record, token_ids
    from orkpack.eval.weights import PackWeights
    from orkpack.model import forward
    from orkpack.model.weights import SourceWeights
    from orkpack.pack.reader import Pack
    from orkpack.sources import open_source

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("pack", type=Path)
    ap.add_argument("--down-hadamard", action="store_true", help="rotate each ffn_down input online (h -> h R4)")
    ap.add_argument("--seed", type=int, default=0, help="R4's seed (bench/folded_gguf.py --seed)")
    ap.add_argument("--act", default="token", choices=("token", "tensor", "float"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=2)
    a = ap.parse_args()

    src = open_source(a.source, on_warning=lambda m: None)
    pack = Pack.open(a.pack)
    hp_src, hp = forward.model_hparams(src), ev.pack_hparams(pack)
    ids, bos, _ = token_ids(None, None, source_record(src), hp.vocab, str(a.source))
    stub = SimpleNamespace(root=a.pack, config=pack.header.get("config"))
    first = a.ctx // 2
    st = ev._Stats()
    for c in range(min(a.chunks, ids.size // a.ctx)):
        chunk = ids[c * a.ctx: (c + 1) * a.ctx].copy()
        if bos is not None:
            chunk[0] = bos
        nxt = chunk[first + 1:]
        ref = forward.run(src, chunk, weights=SourceWeights(src), hp=hp_src)[first: a.ctx - 1]
        base = ev._log_softmax64(ref).astype(np.float32)
        w = PackWeights(pack, "prefill", m=a.ctx, act=a.act)
        lg = forward.run(stub, chunk, weights=online(w, a.seed) if a.down_hadamard else w, hp=hp)[first: a.ctx - 1]
        ev._score(base, lg, nxt, st)
    out = {"pack": str(a.pack), "down_hadamard": a.down_hadamard, "act": a.act, "chunks": c + 1,
           "scored": len(st.kld), **ev._summary(st)}
    print(json.dumps(out))
    pack.close()
    src.close()


if __name__ == "__main__":
    main()
