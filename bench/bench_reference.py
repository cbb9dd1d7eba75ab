"""The reference forward pass (orkpack.model) on a Qwen2.5-0.5B-shaped model: wall and CPU time, peak RSS.

    python bench/bench_reference.py [--tokens 2048] [--workdir /tmp/orkpack-bench]

Writes (once) a seeded bf16 HF folder with Qwen2.5-0.5B's shapes (24 layers, hidden 896, 14 heads / 2 KV
heads, intermediate 4864, vocab 151936, tied head) and runs the float32 logits over ``--tokens`` random
token ids, the logits handed over in 256-token blocks and reduced to their argmax (the forward pass's own
memory, not a consumer's). One run: peak RSS is the process's; times are not medians.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import loadavg, machine  # noqa: E402

from orkpack import synth  # noqa: E402
from orkpack.model import logits  # noqa: E402

CONFIG = dict(synth.TINY["qwen2"], hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
              num_attention_heads=14, num_key_value_heads=2, head_dim=64, vocab_size=151936,
              tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--workdir", default="/tmp/orkpack-bench")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    folder = Path(a.workdir) / "reference-qwen2-0.5b-bf16-seed0"
    if not (folder / "config.json").exists():
        synth.write_hf_model(folder, config=CONFIG, shards=1, dtype="bf16", seed=0)
    ids = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], a.tokens)
    top = np.empty(a.tokens, dtype=np.int64)
    before = loadavg()
    cpu0, t0 = time.process_time(), time.perf_counter()
    logits(folder, ids, on_logits=lambda t, block: top.__setitem__(slice(t, t + len(block)), block.argmax(-1)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    out = {"tokens": a.tokens, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
           "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
           "load_before": before, "load_after": loadavg(), "machine": machine()}
    print(json.dumps(out, indent=1) if a.json else
          f"{a.tokens} tokens: wall {out['wall_s']} s, CPU {out['cpu_s']} s, peak RSS {out['peak_rss_mib']} MiB "
          f"(load {before} -> {out['load_after']})")


if __name__ == "__main__":
    main()
