"""The rotated model (R1, R2 folded as ``orkpack build --rotate`` folds them: bench/folded_gguf.py --rotate) with each
ffn_down's input smoothed *before* the online R4, as a float GGUF: ffn_up's rows divided by s, ffn_down's columns
times s (SmoothQuant: s = a^alpha / w^(1 - alpha) per column, normalized and rounded to powers of two,
orkpack.transforms.smooth.pow2_scales; a: the largest |h| of the column in the statistics, w: the column's largest
|W|). Every metadata key of the input is kept; tensors F32.

    python bench/smooth_down_gguf.py IN.gguf STATS.gguf OUT.gguf --alpha A [--seed N]

STATS: ``orkpack imatrix IN --rotate`` (its ffn_down columns are h's own: R1 and R2 do not touch h's basis; under
``--online-hadamard`` they would be h R4's). ``orkpack build OUT.gguf --online-hadamard`` then folds R4 on top,
``W diag(s) R4``, its input ``(h / s) R4`` online, which a build cannot do itself: smoothing (orkpack/transforms/smooth.py)
leaves ffn_down's groups out under R4, since a scale after R4 has no carrier (docs/EVAL.md, issue 25). Since every
s is a power of two, OUT computes IN's logits to float32 rounding (tests/test_bench_rotate.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/folded_gguf.py's writer


def scales(rs, stats, alpha: float) -> dict[str, np.ndarray]:
    """Per ffn_up (the carrier of its layer's ffn_down input), the powers of two s of that input's columns."""
    from orkpack.transforms import smooth

    out = {}
    for i in rs.tensors():
        if i.name.endswith(".ffn_down.weight"):
            w = np.asarray(rs.read(i.name), np.float32)
            a = np.asarray(stats.absmax(i.name, k=w.shape[1]), np.float64).reshape(-1)
            out[i.name.replace(".ffn_down.", ".ffn_up.")] = smooth.pow2_scales(a, np.abs(w).max(axis=0).astype(np.float64),
                                                                             alpha)
    return out


def smoothed_down(src_path: Path, stats_path: Path, out: Path, alpha: float, seed: int = 0) -> dict[str, np.ndarray]:
    from folded_gguf import write_f32_gguf

    from orkpack import stats as act_stats
    from orkpack.sources import open_source
    from orkpack.transforms.rotate import rotated

    src = open_source(src_path, on_warning=lambda m: None)
    rs = rotated(src, seed)
    s = scales(rs, act_stats.load(stats_path), alpha)
    def tensors():
        for i in rs.tensors():
            v = np.asarray(rs.read(i.name), np.float32)
            if i.name in s:  # ffn_up [I, K]: its rows carry 1 / s
                v = v / s[i.name][:, None]
            elif i.name.endswith(".ffn_down.weight"):  # [K, I]: its columns take s
                v = v * s[i.name.replace(".ffn_down.", ".ffn_up.")][None, :]
            yield i.name, v

    write_f32_gguf(src_path, out, tensors())
    src.close()
    return s


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("stats", type=Path, help="orkpack imatrix SRC --rotate -o STATS (the same --seed)")
    ap.add_argument("out", type=Path)
    ap.add_argument("--alpha", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    s = smoothed_down(a.src, a.stats, a.out, a.alpha, a.seed)
    lg = np.concatenate([np.log2(v) for v in s.values()])
    print(f"wrote {a.out}: alpha {a.alpha}, log2 s from {lg.min():.0f} to {lg.max():.0f}, "
          f"{np.mean(lg != 0):.1%} of ffn_down's input columns scaled")
