"""Issue 25: why ``build --rotate`` makes NF4 worse. Per matrix, nf4dq's weight SQNR and its output SQNR on the
float model's own inputs, for the model as it is (``plain``), with the pre-norm gains folded into the matrices
they feed and no rotation (``fold``), and folded and rotated as ``build --rotate`` does (``rot``,
orkpack/transforms/rotate.py, seed 0); and per pre-norm, the cost the fold predicts.

    python bench/rotate_nf4.py MODEL [--tokens 512] [--json OUT]

Output SQNR of a matrix W (the nf4dq image Wq): ``10 log10(sum |X W^T|^2 / sum |X (Wq - W)^T|^2)`` over every call
of it in one float forward pass of the first ``--tokens`` tokens of the built-in prose (X: its float inputs; the
local damage, not what the model amplifies). Weight SQNR: ``10 log10(sum W^2 / sum (Wq - W)^2)``.

The predicted cost, per pre-norm with gain g and the normed stream's per-channel mean square m (before the gain):
``10 log10(mean(g^2) mean(m) / mean(g^2 m))``. Unrotated, a matrix's NF4 error meets the input ``x * g``; folded
and rotated, an error of the same size relative to the folded weights ``W diag(g)`` is spread evenly over the
channels (a rotation makes it isotropic) and meets ``x`` itself: where the stream's energy sits in channels the
gain all but shuts off (SmolLM2's massive-activation channels), the output error grows by that ratio.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = ("plain", "fold", "rot")


def _model(src, variant: str):
    from orkpack.transforms.rotate import rotated

    if variant == "plain":
        return src
    rs = rotated(src)
    if variant == "fold":
        rs.plan.ops = {n: [op for op in ops if op[0] != "rot"] for n, ops in rs.plan.ops.items()}
    return rs


def measure(path: Path, variant: str, ids: np.ndarray, hp) -> tuple[dict, dict]:
    """({matrix: {wsqnr, osqnr}}, {matrix: per-column mean square of its input}) of one variant."""
    from orkpack.codecs import get_codec
    from orkpack.model import forward
    from orkpack.model.weights import SourceWeights, Wrapped
    from orkpack.sources import open_source

    src = open_source(path, on_warning=lambda m: None)
    model = _model(src, variant)
    codec = get_codec("nf4dq")
    acc: dict = {}
    ms: dict = {}

    class Meter(Wrapped):
        err: dict = {}

        def matmul(self, name, x, expert=None):
            y = self.inner.matmul(name, x, expert)
            if name not in self.err:
                w = np.ascontiguousarray(self.inner.tensor(name), dtype=np.float32)
                e = codec.encode(w, threads=1)
                d = codec.decode(e.parts, w.shape, e.layout) - w
                ws = float((w.astype(np.float64) ** 2).sum() / (d.astype(np.float64) ** 2).sum())
                self.err[name] = (d, ws)
            d, ws = self.err[name]
            a = acc.setdefault(name, {"wsqnr": 10 * np.log10(ws), "sig": 0.0, "err": 0.0})
            a["sig"] += float((y.astype(np.float64) ** 2).sum())
            a["err"] += float(((x @ d.T).astype(np.float64) ** 2).sum())
            ms[name] = (x.astype(np.float64) ** 2).mean(0)
            return y

    forward.run(model, ids, weights=Meter(SourceWeights(model, keep=True)), hp=hp)
    src.close()
    return ({n: {"wsqnr": a["wsqnr"], "osqnr": float(10 * np.log10(a["sig"] / a["err"]))} for n, a in acc.items()},
            ms)


def fold_costs(path: Path, ms: dict) -> dict:
    """Per pre-norm: the predicted cost (dB) and the three channels holding most of the normed stream's energy."""
    from orkpack.sources import open_source

    src = open_source(path, on_warning=lambda m: None)
    out = {}
    for name, s2 in ms.items():
        m = re.match(r"^(blk\.\d+\.)(attn_q|ffn_gate)\.weight$", name)
        if not m:
            continue
        norm = m.group(1) + ("attn_norm.weight" if m.group(2) == "attn_q" else "ffn_norm.weight")
        g = np.asarray(src.read(norm), np.float64)
        x2 = s2 / np.maximum(g * g, 1e-30)  # the normed stream's mean square before the gain
        top = np.argsort(x2)[::-1][:3]
        out[norm] = {"predicted_db": float(10 * np.log10((g * g).mean() * x2.mean() / s2.mean())),
                     "top_channels": [int(c) for c in top], "top_share": float(x2[top].sum() / x2.sum()),
                     "top_gain": [float(abs(g[c])) for c in top], "median_gain": float(np.median(np.abs(g)))}
    src.close()
    return out


def main() -> None:
    from orkpack.eval.text import source_record, token_ids
    from orkpack.model import forward
    from orkpack.sources import open_source

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--json", type=Path, help="also write every matrix's figures here")
    a = ap.parse_args()
    src = open_source(a.model, on_warning=lambda m: None)
    hp = forward.model_hparams(src)
    ids, bos, _ = token_ids(None, None, source_record(src), hp.vocab, str(a.model))
    ids = ids[: a.tokens].copy()
    if bos is not None:
        ids[0] = bos
    src.close()
    res, ms = {}, None
    for v in VARIANTS:
        res[v], m = measure(a.model, v, ids, hp)
        ms = m if v == "plain" else ms
    costs = fold_costs(a.model, ms)
    kinds: dict = {}
    for n in res["plain"]:
        kinds.setdefault(re.sub(r"^blk\.\d+\.", "", n), []).append(n)
    print(f"{a.model.name}, {ids.size} tokens; medians over each kind's matrices (dB)")
    print(f"{'matrix':20s} " + " ".join(f"{v + ' w':>8s} {v + ' out':>9s}" for v in VARIANTS))
    for k, names in kinds.items():
        cells = []
        for v in VARIANTS:
            got = [res[v].get(n) or res[v].get("output.weight") for n in names]
            cells.append(f"{np.median([g['wsqnr'] for g in got]):8.2f} {np.median([g['osqnr'] for g in got]):9.2f}")
        print(f"{k:20s} " + " ".join(cells))
    for kind in ("attn_norm", "ffn_norm"):
        c = [v for n, v in costs.items() if n.endswith(kind + ".weight")]
        print(f"{kind}: predicted cost median {np.median([x['predicted_db'] for x in c]):.2f} dB "
              f"(range {min(x['predicted_db'] for x in c):.2f} .. {max(x['predicted_db'] for x in c):.2f}); the three "
              f"largest channels hold a median {100 * np.median([x['top_share'] for x in c]):.0f} % of the normed "
              f"stream's energy")
    if a.json:
        a.json.write_text(json.dumps({"matrices": res, "norms": costs}, indent=1))


if __name__ == "__main__":
    main()
