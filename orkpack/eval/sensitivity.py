"""`orkpack eval SOURCE PACK --sensitivity`: each item's measured quality cost, as a hotness profile.

The sensitivity of an item (docs/TIERMAP.md section 3) is the KLD it adds in NF4 rather than int8.
Measured for every item would be two forward passes each; instead (docs/EVAL.md, "--sensitivity"):

1. Activation statistics, as llama.cpp's imatrix gathers them, from the reference pass of the same
   run: per item, the sum over the tokens of each input column's square ``s2[k]``, the rows seen,
   and the energy of its float output ``sum |y|^2``.
2. The expected output error of its NF4-vs-int8 weight difference on those inputs (inputs taken as
   uncorrelated across columns, imatrix's assumption): ``e = sum_k s2[k] sum_n (W_nf4 - W_int8)[n,k]^2``
   per token (``err = e / rows``; its output's relative error ``e / sum |y|^2`` is reported beside it).
3. Scaled to KLD: on a sample of items (per kind of item, ``attn_v``, ``ffn_down``, the head, ...:
   those of the largest, median and smallest ``err``), the true single-item KLD is measured (two
   forward passes: the item alone in NF4, and alone in int8, every other matrix float; the
   difference); the gain is the median of true / err over the sample; an item's estimate is
   ``gain x err``. (A gain per kind, fitted on its 3 items, ranked worse on SmolLM2: docs/EVAL.md.)
4. Checked: the Spearman rank correlation of the estimates with the true KLDs over the sample, each
   estimate's gain taken without that item (leave one out), so the check does not grade its own fit.

The profile's ``sensitivity`` is the estimate for every item, the measured value for sampled ones.
"""
from __future__ import annotations

import re
from statistics import median

import numpy as np

from ..codecs import reference as ref
from ..model.weights import EMBED, SourceWeights, matmul_rows

_KIND = re.compile(r"^blk\.\d+\.")


def kind(name: str) -> str:
    """The kind of an item: its tensor name without the layer (``attn_v.weight``)."""
    return _KIND.sub("", name)


def _versions(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(NF4, int8 per channel) dequantized images of one [N, K] matrix, as the pack's codecs store them
    (NF4 in the build's default mode, without statistics: orkpack/transforms/nf4.py)."""
    from ..codecs import get_codec
    from ..transforms.nf4 import NF4Choice

    ch = NF4Choice()
    nf4 = get_codec(ch.encoding).decode(ch.encode(np.ascontiguousarray(w, dtype=np.float32), tensor="",
                                                  expert=None, threads=1).parts, w.shape)
    i8 = ref.int8_decode(*ref.int8_encode(w))
    return nf4, i8


class _Weights:
    """The source's float weights for every matrix but one item, which uses ``w`` (and, for the
    embedding, its rows too: the pack's embedding lookup reads the same copy)."""

    def __init__(self, src, key: tuple[str, int | None], w: np.ndarray):
        self.ref, self.key, self.w = SourceWeights(src), key, w

    def has(self, name):
        return self.ref.has(name)

    def tensor(self, name):
        return self.ref.tensor(name)

    def embed(self, ids, name=EMBED):
        return self.w[ids] if self.key == (name, None) else self.ref.embed(ids, name)

    def matmul(self, name, x, expert=None):
        return matmul_rows(x, self.w) if (name, expert) == self.key else self.ref.matmul(name, x, expert)

    def release(self):
        self.ref.release()


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None for fewer than 3 pairs or a constant side."""
    if len(a) < 3:
        return None
    from scipy.stats import spearmanr

    if len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b).statistic)


def measure(src, items: list[tuple[str, int | None]], stats: dict, sample_kld, per_kind: int = 3,
            progress=None) -> dict:
    """Per item the estimate; the sample's true KLDs; the check. ``sample_kld(key, w) -> KLD`` runs the model
    with item ``key`` at weights ``w`` (every other matrix float) on the sample and returns its mean KLD."""
    srcw = SourceWeights(src)
    rel: dict = {}
    err: dict = {}  # the expected squared output error per token (the estimate's base)
    mats: dict = {}
    for key in items:
        name, expert = key
        st = stats.get(key)
        w = srcw.tensor(name)
        w = w[expert] if expert is not None else w
        nf4, i8 = _versions(np.ascontiguousarray(w, dtype=np.float32))
        if st is None:  # never multiplied (an untied embedding: a row lookup): no statistics, estimate 0
            rel[key] = err[key] = 0.0
        else:
            s2, _, rows, ysq = st
            d = (nf4.astype(np.float64) - i8) ** 2
            e = float(d.sum(axis=0) @ s2)
            rel[key] = e / ysq if ysq > 0 else 0.0
            err[key] = e / rows if rows else 0.0
        mats[key] = (nf4, i8) if kind(name) in ("token_embd.weight", "output.weight") else None
    by_kind: dict[str, list] = {}
    for key in items:
        by_kind.setdefault(kind(key[0]), []).append(key)
    sample = []
    for k, keys in sorted(by_kind.items()):
        keys = sorted(keys, key=lambda x: (err[x], x[0], -1 if x[1] is None else x[1]))
        picks = {keys[-1], keys[len(keys) // 2], keys[0]} if per_kind >= 3 else {keys[-1]}
        sample += sorted(picks, key=lambda x: (x[0], -1 if x[1] is None else x[1]))[:max(1, per_kind)]
    true: dict = {}
    for j, key in enumerate(sample):
        name, expert = key
        got = mats.get(key)
        if got is None:
            w = srcw.tensor(name)
            w = w[expert] if expert is not None else w
            got = _versions(np.ascontiguousarray(w, dtype=np.float32))
        nf4, i8 = got
        true[key] = max(0.0, sample_kld(key, nf4) - sample_kld(key, i8))
        if progress:
            progress(j + 1, len(sample), f"sensitivity {name}")
    srcw.release()

    def gain(without=None) -> float:
        own = [true[x] / err[x] for x in sample if x != without and err[x] > 0]
        return median(own) if own else 0.0

    est = {key: gain() * err[key] for key in items}
    loo = [gain(without=x) * err[x] for x in sample]
    rho = spearman(loo, [true[x] for x in sample])
    return {"estimate": est, "rel": rel, "err": err, "true": true, "loo": dict(zip(sample, loo)), "spearman": rho}


def item_name(key: tuple[str, int | None]) -> str:
    return key[0] if key[1] is None else f"{key[0]}[{key[1]}]"


def to_profile(res: dict, note: str) -> dict:
    """The hotness profile (docs/TIERMAP.md section 3): sensitivity = the measured KLD for sampled items,
    the estimate for the others."""
    sens = dict(res["estimate"])
    sens.update(res["true"])
    return {"schema": "orkpack.hotness", "version": 1, "note": note,
            "tensors": {item_name(k): {"sensitivity": float(v)} for k, v in sens.items()}}


def report(res: dict) -> dict:
    """What the eval report shows of it (JSON-ready)."""
    return {"items": len(res["estimate"]), "sample": [
        {"item": item_name(k), "kld": res["true"][k], "estimate": res["loo"][k], "rel_error": res["rel"][k],
         "error": res["err"][k]}
        for k in res["true"]], "spearman": res["spearman"], "total": float(sum(res["estimate"].values()))}


def write_profile(rep: dict, path) -> None:
    """Write the report's profile (``--sensitivity -o FILE``) whole, or nothing."""
    import json
    import os
    from pathlib import Path

    from ..errors import OrkError, escape_name

    prof = rep.get("_profile")
    if prof is None:
        raise OrkError("-o writes the profile of --sensitivity: add --sensitivity")
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        tmp.write_text(json.dumps(prof, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OrkError(f"{escape_name(str(p))}: cannot write the profile ({e.__class__.__name__})") from None
