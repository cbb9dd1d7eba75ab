"""``orkpack imatrix`` runs its chunks layer by layer (forward.Batch): with --rotate each tensor is rotated once
per group of chunks (once per run when they fit imatrix.GROUP_BYTES), not once per chunk, and the statistics are
byte for byte the per-chunk runs' (forward.run on each chunk in turn, as before)."""
from __future__ import annotations

import numpy as np
import pytest

from orkpack import synth
from orkpack.eval import imatrix
from orkpack.eval.collect import Collector, from_acc
from orkpack.model import forward
from orkpack.model.weights import SourceWeights
from orkpack.sources import open_source
from orkpack.transforms import rotate


def _per_chunk(model, ids, ctx, rot):
    """The statistics as collect() gathered them before: each chunk its own forward.run."""
    src = rotate.rotated(open_source(model, on_warning=lambda m: None), *rot) if rot else \
        open_source(model, on_warning=lambda m: None)
    try:
        hp = forward.model_hparams(src)
        acc: dict = {}
        for c in range(ids.size // ctx):
            forward.run(src, ids[c * ctx:(c + 1) * ctx].copy(), weights=Collector(SourceWeights(src), acc), hp=hp,
                        on_logits=lambda t0, lg: None, chunk=128)
        return acc
    finally:
        src.close()


def _bytes(stats):
    return {n: (e.sum2.tobytes(), e.absmax.tobytes(), e.counts.tolist()) for n, e in stats.entries.items()}


@pytest.mark.parametrize("group_bytes", [1, 2 * 4 * 24 * 64, 1 << 30])  # groups of 1, 2, all 5 chunks
def test_stats_are_the_per_chunk_runs_and_each_tensor_rotates_once_per_group(tmp_path, monkeypatch, group_bytes):
    model = synth.write_hf_model(tmp_path / "m", layers=2, hidden=64, intermediate=96, heads=2, kv_heads=1,
                                 vocab=128, seed=3)
    ctx, n = 24, 5
    ids = np.random.default_rng(1).integers(0, 128, ctx * n)
    tok = tmp_path / "ids.txt"
    tok.write_text(" ".join(map(str, ids)))
    src = open_source(model, on_warning=lambda m: None)
    hp = forward.model_hparams(src)
    src.close()
    group = max(1, group_bytes // (4 * ctx * hp.hidden))
    for rot in (None, (0, True)):
        want = _per_chunk(model, ids, ctx, rot)
        calls: dict = {}
        orig = rotate.Plan.transform

        def counting(self, name, arr, gain):
            calls[name] = calls.get(name, 0) + 1
            return orig(self, name, arr, gain)

        monkeypatch.setattr(rotate.Plan, "transform", counting)
        monkeypatch.setattr(imatrix, "GROUP_BYTES", group_bytes)
        got = imatrix.collect(model, tokens=tok, ctx=ctx, rotate=rot)
        monkeypatch.setattr(rotate.Plan, "transform", orig)
        assert _bytes(got) == _bytes(from_acc(want, {}, datasets=["x"], chunk_count=n, chunk_size=ctx))
        if rot:
            groups = -(-n // group)
            # every rotated matrix read once per group (the embedding: the lookup and, tied, the head)
            assert calls and max(calls.values()) <= 2 * groups, calls
            assert calls["blk.0.attn_q.weight"] == groups
