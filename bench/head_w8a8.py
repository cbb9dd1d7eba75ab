"""The tied head alone in w8a8: its KLD against its float logits for a range of smoothing alphas, and what the
statistics' score (orkpack/transforms/smooth.py) says of each, to check the score's choice for the head (docs/EVAL.md,
"The tied head, untied and smoothed").

    python bench/head_w8a8.py SOURCE STATS.gguf [--text FILE] [--start 6000] [--tokens 512]

SOURCE: a model with a tied head (an HF folder or GGUF); STATS: `orkpack imatrix SOURCE -o STATS`. The head's
input (the final norm's output) is captured by orkpack's float forward pass on ``--tokens`` tokens of ``--text``
from token ``--start`` (default: a GPL-3 stretch that the statistics' first 8 chunks of 512 do not hold). For each
s (none, SmoothQuant's alpha 0 .. 1 rounded to powers of two as the build does): the head's logits with int8
per-channel weights of W x s and int8 per-token activations x / s ("w8a8"), or float activations ("weights
only"), each scored by the KLD from the float head's logits; and the score's weights' and activations' parts.
A measurement, not a test.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from orkpack import stats as act_stats
from orkpack.transforms import smooth
from orkpack.codecs import reference as ref
from orkpack.eval import numerics
from orkpack.eval.text import source_record
from orkpack.model.tokenizer import from_model
from orkpack.model import forward
from orkpack.model.weights import SourceWeights, Wrapped
from orkpack.sources import open_source
from orkpack.sources.base import as_float32


class _Capture(Wrapped):
    def __init__(self, inner):
        super().__init__(inner)
        self.x = []

    def matmul(self, name, x, expert=None):
        if name == smooth.EMBED:
            self.x.append(np.array(x, np.float32))
        return self.inner.matmul(name, x, expert)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64) - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("stats", type=Path)
    ap.add_argument("--text", type=Path, default=Path("/usr/share/common-licenses/GPL-3"))
    ap.add_argument("--start", type=int, default=6000)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    src = open_source(a.source)
    try:
        names = {i.name for i in src.tensors()}
        if smooth.HEAD in names:
            raise SystemExit(f"{a.source}: has its own output.weight; this measures a tied head")
        tok = from_model(source_record(src), str(a.source))
        ids = np.asarray(tok.encode(a.text.read_text()), np.int64)[a.start: a.start + a.tokens]
        w = _Capture(SourceWeights(src))
        forward.run(src, ids, weights=w)
        x = np.concatenate(w.x)
        emb = np.ascontiguousarray(as_float32(src.read(smooth.EMBED)), np.float32)
    finally:
        src.close()
    st = act_stats.load(a.stats)
    k = emb.shape[1]
    m = np.asarray(st.mean_sq(smooth.EMBED, k=k), np.float64)
    amax = np.asarray(st.absmax(smooth.EMBED, k=k), np.float64)
    wmax = np.abs(emb).max(axis=0).astype(np.float64)
    p_log = _log_softmax(x @ emb.T)
    p = np.exp(p_log)

    def kld(z):
        return float((p * (p_log - _log_softmax(z))).sum(axis=1).mean())

    rows = []
    for al in [None] + [round(0.1 * i, 1) for i in range(11)]:
        s = np.ones(k, np.float32) if al is None else smooth.pow2_scales(amax, wmax, al)
        ws = emb * s[None, :]
        wd = ref.int8_decode(*ref.int8_encode(ws))
        xs = x / s[None, :]
        qx, sx = numerics.int8_act(xs)
        w8a8, wonly = kld((qx.astype(np.float32) * sx[:, None]) @ wd.T), kld(xs @ wd.T)
        s64 = s.astype(np.float64)
        ms = m / (s64 * s64)
        step = math.sqrt(smooth.token_range_sq(ms, amax / s64)) / 127.0
        rows.append({"alpha": al, "w8a8": w8a8, "weights_only": wonly, "activation_cost": w8a8 - wonly,
                     "score_weights": float(smooth._int8_sq_err_cols(ws) @ ms),
                     "score_acts": step * step / 12.0 * float((ws.astype(np.float64) ** 2).sum()),
                     "log2_s": [int(v) for v in (np.min(np.log2(s)), np.max(np.log2(s)))]})
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{x.shape[0]} tokens of {a.text.name} from token {a.start}; head {emb.shape[0]} x {k}")
    print("| alpha | log2 s | w8a8 KLD | weights only | activation cost | score: weights | score: activations |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'none' if r['alpha'] is None else r['alpha']} | {r['log2_s'][0]}..{r['log2_s'][1]} | {r['w8a8']:.5f} | "
              f"{r['weights_only']:.5f} | {r['activation_cost']:.5f} | {r['score_weights']:.4g} | {r['score_acts']:.4g} |")


if __name__ == "__main__":
    main()
