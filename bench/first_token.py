"""The KLD of each path at the first position of a sequence, for many first tokens at once (issue 25).

    python bench/first_token.py SOURCE PACK[:prefill|:decode] ... [--n 1024] [--text FILE ...]

The first token of a sequence (no BOS in SmolLM2) is the attention sink, where the residual stream carries the
massive activations; ``orkpack eval`` never scores it (it scores the second half of each chunk). Here every layer's
attention window is 1, so each row of one forward pass attends to itself alone and is the first token of its own
sequence (RoPE at distance 0 is the identity). The tokens: the first N distinct tokens of the texts (default: the
built-in prose, GPL-3, then this repository's orkpack/eval/*.py). The prefill path is the one of a 512-token
chunk (every NPU slice with min_m <= 512 on the NPU, activations int8 per token); decode every matmul on the CPU.
Prints per pack and path: the mean, 99th percentile and maximum over the tokens, and the worst tokens.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from threadpoolctl import threadpool_limits

from orkpack.eval.text import PROSE, source_record
from orkpack.eval.weights import PackWeights
from orkpack.model import forward
from orkpack.model.tokenizer import from_model
from orkpack.model.weights import SourceWeights
from orkpack.pack.reader import Pack
from orkpack.sources import open_source

ROOT = Path(__file__).resolve().parents[1]


def _log_softmax(lg: np.ndarray) -> np.ndarray:
    x = lg.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("packs", nargs="+", help="PACK, PACK:prefill or PACK:decode (default: both paths)")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--text", action="append")
    a = ap.parse_args()
    threadpool_limits(1, "blas")
    texts = a.text or [str(PROSE), "/usr/share/common-licenses/GPL-3"] + sorted(
        str(p) for p in (ROOT / "orkpack" / "eval").glob("*.py"))
    with open_source(Path(a.source), on_warning=lambda m: None) as src:
        hp = forward.model_hparams(src)
        tok = from_model(source_record(src))
        seen: dict[int, None] = {}
        for f in texts:
            if Path(f).exists():
                for t in tok.encode(Path(f).read_text(encoding="utf-8")):
                    seen.setdefault(t)
        ids = np.asarray(list(seen)[: a.n], dtype=np.int64)
        hp1 = dataclasses.replace(hp, swa_window=1, swa_layers=set(range(hp.n_layers)))

        def logits(source, w):
            rows = []
            forward.run(source, ids, weights=w, hp=hp1, chunk=128, on_logits=lambda t0, lg: rows.append(lg.copy()))
            return _log_softmax(np.concatenate(rows))

        base = logits(src, SourceWeights(src))
        print(f"{ids.size} first tokens")
        for spec in a.packs:
            p, _, path = spec.partition(":")
            for pth in ([path] if path else ["prefill", "decode"]):
                with Pack.open(Path(p)) as pack:
                    w = PackWeights(pack, pth, m=512) if pth == "prefill" else PackWeights(pack, pth)
                    lp = logits(SimpleNamespace(root=Path(p), config=pack.header.get("config")), w)
                k = (np.exp(base) * (base - lp)).sum(-1)
                o = np.argsort(-k)[: a.top]
                worst = ", ".join(f"{tok.decode([int(ids[i])])!r} {k[i]:.2f}" for i in o)
                print(f"{Path(p).name} {pth}: first-token KLD mean {k.mean():.4f} p99 {np.percentile(k, 99):.3f} "
                      f"max {k.max():.3f}; worst: {worst}", flush=True)


if __name__ == "__main__":
    main()
