"""Regenerate everything under tiermaps/ that the code produces: ``python -m orkpack.tiers.regenerate``.

* ``orkpack/data/boards/*.toml``: byte copies of ``tiermaps/boards/*.toml`` (package data).
* ``orkpack/data/runtimes/*.toml``: byte copies of ``tiermaps/runtimes/*.toml`` (package data).
* ``tiermaps/profiles/qwen3-30b-a3b.routing-example.json``: a SYNTHETIC, seeded, skewed
  routing profile (Zipf-like expert popularity per layer) to show non-uniform routing.
* ``tiermaps/compiled/<model>.<board>.ctx<ctx>[.<profile>].json``: the tier maps of the
  shipped configs (tiermaps/configs/*/config.json) on rk3588-32g at 8k context.

``--check`` compares instead of writing and exits 1 on any difference (the tests use
:func:`expected` directly).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from .board import BOARD_DIR
from .runtime import RUNTIME_DIR

ROOT = Path(__file__).resolve().parents[2] / "tiermaps"
BOARD = "rk3588-32g"
CTX = 8192
MODELS = ("qwen2.5-7b", "qwen2.5-32b", "qwen3-30b-a3b")
ROUTING_EXAMPLE = "qwen3-30b-a3b.routing-example.json"


def routing_example(n_layers: int = 48, n_experts: int = 128, top_k: int = 8, seed: int = 3588) -> dict:
    """Per layer: popularity 1/(rank+1)^0.9 over a seeded permutation, scaled to sum top_k, each <= 1."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(n_layers):
        w = 1.0 / (np.arange(n_experts) + 1.0) ** 0.9
        w = w[rng.permutation(n_experts)]
        f = w * top_k / w.sum()
        for _ in range(50):  # a token picks an expert at most once: cap at 1 and respread
            over = f > 1
            if not over.any():
                break
            f[over] = 1.0
            rest = ~over
            f[rest] *= (top_k - over.sum()) / f[rest].sum()
        tensors[f"blk.{layer}.ffn_gate_exps.weight"] = {"routing": [round(float(x), 6) for x in f]}
    return {"schema": "orkpack.hotness", "version": 1, "prefill_m": 512,
            "note": "SYNTHETIC example (seeded Zipf-like expert popularity), not measured; routing given on "
                    "ffn_gate_exps applies to the layer's up/down experts too",
            "tensors": tensors}


def expected() -> dict[Path, str]:
    """path -> the exact text the code produces for it."""
    from .command import plan
    from .tiermap import dumps

    out: dict[Path, str] = {}
    for p in sorted((ROOT / "boards").glob("*.toml")):
        out[BOARD_DIR / p.name] = p.read_text(encoding="utf-8")
    for p in sorted((ROOT / "runtimes").glob("*.toml")):
        out[RUNTIME_DIR / p.name] = p.read_text(encoding="utf-8")
    out[ROOT / "profiles" / ROUTING_EXAMPLE] = json.dumps(routing_example(), indent=1) + "\n"
    runs = [(m, None) for m in MODELS] + [("qwen3-30b-a3b", ROUTING_EXAMPLE)]
    for model, prof in runs:
        with tempfile.TemporaryDirectory() as tmp:
            prof_path = None
            if prof is not None:  # plan from the profile the code generates, not from a possibly stale file
                prof_path = Path(tmp) / prof
                prof_path.write_text(out[ROOT / "profiles" / prof], encoding="utf-8")
            tm, _, _ = plan(ROOT / "configs" / model / "config.json", board=BOARD, profile=prof_path, ctx=CTX)
        suffix = "" if prof is None else "." + prof.split(".")[1]
        out[ROOT / "compiled" / f"{model}.{BOARD}.ctx{CTX}{suffix}.json"] = dumps(tm)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    bad = 0
    for path, text in expected().items():
        cur = path.read_text(encoding="utf-8") if path.is_file() else None
        if cur == text:
            continue
        if check:
            print(f"out of date: {path}")
            bad += 1
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
