"""bench/dithered_smollm2.py: the grid of a Q4_1 / Q8_0 block is smeared by at most half a step, nothing else moves."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def _load():
    p = Path(__file__).resolve().parents[1] / "bench" / "dithered_smollm2.py"
    spec = importlib.util.spec_from_file_location("dithered_smollm2", p)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_grid_smeared_within_half_a_step(tmp_path):
    rng = np.random.default_rng(0)
    n, k = 8, 64
    mn = rng.normal(size=(n, k // 32, 1)) * 0.1
    d = rng.uniform(0.01, 0.05, size=(n, k // 32, 1))
    q = rng.integers(0, 16, size=(n, k // 32, 32))
    q[..., 0], q[..., 1] = 0, 15  # a Q4_1 block holds its min and max
    w4 = (mn + d * q).reshape(n, k).astype(np.float32)
    d8 = rng.uniform(0.001, 0.01, size=(n, k // 32, 1))
    q8 = rng.integers(-127, 128, size=(n, k // 32, 32))
    q8[..., 0] = 127
    w8 = (d8 * q8).reshape(n, k).astype(np.float32)
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    save_file({"model.layers.0.mlp.up_proj.weight": w4, "model.embed_tokens.weight": w8,
               "model.norm.weight": np.ones(k, np.float32)}, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    _load().main(src, out)
    assert (out / "config.json").read_text() == (src / "config.json").read_text()
    with safe_open(str(out / "model.safetensors"), "np") as h:
        a, e, nw = (h.get_tensor(x) for x in ("model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight",
                                               "model.norm.weight"))
    assert a.dtype == np.float16 and e.dtype == np.float16
    step = np.repeat(d, 32, axis=2).reshape(n, k)
    err = np.abs(a.astype(np.float64) - w4)
    assert (err <= step / 2 + 1e-3 * np.abs(w4) + 1e-4).all()  # half a step, plus F16 rounding
    assert err.mean() > step.mean() / 8  # and really smeared (uniform: mean |noise| = step / 4)
    assert len(np.unique(a)) > 4 * len(np.unique(w4[0]))
    step8 = np.repeat(d8, 32, axis=2).reshape(n, k)
    assert (np.abs(e.astype(np.float64) - w8) <= step8 / 2 + 1e-3 * np.abs(w8) + 1e-5).all()
    np.testing.assert_array_equal(nw, np.ones(k, np.float32))
