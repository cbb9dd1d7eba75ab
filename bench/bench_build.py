"""Issue 5 build benchmark: `orkpack build` end to end against `cp`, threads, peak RSS, and the C kernels.

    python bench/bench_build.py                    # ~1.4 GB bf16 checkpoint, 5 interleaved rounds
    python bench/bench_build.py --quick            # ~0.3 GB, 2 rounds: a smoke run
    python bench/bench_build.py --size-gb 1.4 --reps 5 --workdir /tmp/orkpack-bench --json

Inputs are built here, seeded and heavy-tailed: a bf16 llama-style HF checkpoint
in 4 safetensors shards (orkpack.synth.write_hf_model: hidden 2048,
intermediate 5504, 16 heads / 8 KV heads, vocab 32000, untied head, as many
layers as --size-gb needs), cached in the workdir between runs, and one
4096 x 4096 float32 array (Student-t, 3 dof, plus outliers) for the kernels.

One run measures everything interleaved (every case once per round, --reps
rounds, after one untimed warm-up round that also warms the page cache):

  * `orkpack build MODEL -o OUT --threads 1 --no-plan` as a subprocess, end to end
    (interpreter start and imports included), in GB/s of source bytes; the same with
    --threads 2; the same at --threads 1 with the default plan (tier map);
  * `cp` of the same shard files into the same output folder: the anchor;
    build time / cp time and threads-2 / threads-1 speed are per-round (paired) ratios;
  * peak RSS of the --threads 1 build (`/usr/bin/time -v`, "Maximum resident set size");
  * the kernels alone on one core: C NF4 and int8 encode, xxh3 (xxhash), against numpy
    memcpy, the numpy NF4 reference, gguf-py's numpy Q8_0 / Q4_0 quantizers and
    bitsandbytes' CPU quantize_4bit (nf4, blocksize 64) when torch + bitsandbytes import.

Outputs are deleted and the page cache synced (os.sync) after every case, untimed.
Before timing, the C encoders are checked against the numpy references, and the
--threads 1 and --threads 2 packs against each other, byte for byte.
Targets (issue 5) are shown beside each figure; nothing fails when one is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import xxhash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from common import Case, emit, heavy_tailed, interleave, loadavg, machine, machine_lines, median_minmax, paired, rates  # noqa: E402

# the model's shapes (a ~1B llama); layers follow from --size-gb
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB, SHARDS, SEED = 2048, 5504, 16, 8, 32000, 4, 0
MB = 1 << 20  # RSS figures are MiB (/usr/bin/time reports KiB)
TIME_BIN = "/usr/bin/time"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- inputs

def model_dims(size_gb: float) -> dict:
    """write_hf_model arguments for a bf16 checkpoint of about size_gb (1e9 bytes), at least one layer."""
    hd = HIDDEN // HEADS
    per_layer = (2 * HIDDEN * HIDDEN + 2 * KV_HEADS * hd * HIDDEN + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN) * 2
    fixed = (2 * VOCAB * HIDDEN + HIDDEN) * 2  # embedding, output head, final norm
    layers = max(1, round((size_gb * 1e9 - fixed) / per_layer))
    return dict(arch="llama", layers=layers, hidden=HIDDEN, intermediate=INTERMEDIATE, heads=HEADS,
                kv_heads=KV_HEADS, vocab=VOCAB, shards=SHARDS, dtype="bf16", seed=SEED, tied=False)


def largest_f32_bytes(d: dict) -> int:
    """The largest tensor of the model (from its shapes), as float32."""
    hd = d["hidden"] // d["heads"]
    shapes = [(d["vocab"], d["hidden"]), (d["intermediate"], d["hidden"]), (d["hidden"], d["intermediate"]),
              (d["hidden"], d["hidden"]), (d["kv_heads"] * hd, d["hidden"])]
    return max(a * b for a, b in shapes) * 4


def ensure_model(workdir: Path, d: dict) -> Path:
    """The cached checkpoint for these options (written once, atomically by rename)."""
    from orkpack.synth import write_hf_model

    key = "model-{arch}-L{layers}-h{hidden}-i{intermediate}-a{heads}x{kv_heads}-v{vocab}-s{shards}-{dtype}-seed{seed}".format(**d)
    folder = workdir / key
    if (folder / ".complete").is_file():
        return folder
    tmp = workdir / (key + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    log(f"synthesizing {key} (cached for the next runs) ...")
    write_hf_model(tmp, **d)
    (tmp / ".complete").write_text(json.dumps(d, sort_keys=True) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    log(f"  done in {time.perf_counter() - t0:.0f} s")
    return folder


def shard_files(model: Path) -> list[Path]:
    return sorted(model.glob("*.safetensors"))


def warm(files: list[Path]) -> None:
    """Read every file once so the builds and cp run with a warm page cache."""
    buf = bytearray(8 * MB)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def file_xxh3(path: Path) -> int:
    h = xxhash.xxh3_64()
    buf = bytearray(8 * MB)
    mv = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(mv[:n])
    return h.intdigest()


# ---------------------------------------------------------------- subprocess cases

class Proc:
    """One subprocess command, timed around the child alone; records peak RSS and any JSON on stdout."""

    def __init__(self, argv: list[str], *, rss: bool):
        self.argv = argv
        self.rss = rss and os.access(TIME_BIN, os.X_OK)
        self.rss_mb: list[float] = []
        self.inner_s: list[float] = []
        self.last_json: dict | None = None

    def __call__(self) -> float:
        argv = self.argv
        rss_file = None
        if self.rss:
            rss_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"orkpack-bench-time-{os.getpid()}.txt"
            argv = [TIME_BIN, "-v", "-o", str(rss_file)] + argv
        t0 = time.perf_counter()
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        dt = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"bench: command failed ({p.returncode}): {' '.join(self.argv)}\n{p.stderr.strip()}")
        if rss_file is not None:
            m = re.search(r"Maximum resident set size \(kbytes\):\s*(\d+)", rss_file.read_text())
            rss_file.unlink(missing_ok=True)
            if m:
                self.rss_mb.append(int(m.group(1)) * 1024 / MB)
        if p.stdout.lstrip().startswith("{"):
            self.last_json = json.loads(p.stdout)
            if "seconds" in self.last_json:
                self.inner_s.append(float(self.last_json["seconds"]))
        return dt


def clear(folder: Path) -> None:
    """Delete everything in the output folder and flush dirty pages, so no case pays for another's writeback."""
    for p in folder.iterdir():
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    os.sync()


def prefault(nbytes: int) -> None:
    """Touch and free nbytes of fresh memory just before a case (untimed).

    On VMs with free page reporting (virtio-balloon), memory left free for ~2 s
    goes back to the host, and the next process to use it pays ~2 s per GB of
    page faults (measured on this project's 2-core VM: 0.09 s to touch 1.4 GB
    right after freeing it, 2.4-3.5 s after a 5 s pause). Which case follows a
    pause would then decide its time (cp, which needs fresh page cache for every
    byte, moved 0.4 s <-> 2.9 s). Touching what the next case will need, right
    before it, puts every case in the same state; it costs nothing on bare metal.
    """
    a = np.ones(max(1, nbytes // 8))
    del a


# ---------------------------------------------------------------- kernel cases

def kernel_cases(x32: np.ndarray) -> tuple[list[Case], list[str], str]:
    """The one-core kernel cases on x32, after checking the C encoders against the numpy references."""
    from orkpack import codecs
    from orkpack.codecs import reference as R

    notes = []
    nf4, i8 = codecs.get_codec("nf4"), codecs.get_codec("int8")
    c, a = R.nf4_encode(x32)
    e = nf4.encode(x32)
    if not (e.parts["codes"].tobytes() == c.tobytes() and e.parts["absmax"].tobytes() == a.tobytes()):
        sys.exit("bench: C NF4 encode differs from the numpy reference; the figures would mean nothing")
    q, s = R.int8_encode(x32)
    e = i8.encode(x32)
    if not (e.parts["q"].tobytes() == q.tobytes() and e.parts["scale"].tobytes() == s.tobytes()):
        sys.exit("bench: C int8 encode differs from the numpy reference; the figures would mean nothing")
    xbf = (x32.view(np.uint32) >> np.uint32(16)).astype(np.uint16)  # bf16 bits: what a build reads
    c, a = R.nf4_encode(xbf)
    e = nf4.encode(xbf)
    if not (e.parts["codes"].tobytes() == c.tobytes() and e.parts["absmax"].tobytes() == a.tobytes()):
        sys.exit("bench: C NF4 encode of bf16 differs from the numpy reference; the figures would mean nothing")
    del c, a, q, s, e
    dst = np.empty_like(x32)
    cases = [
        Case("memcpy", lambda: np.copyto(dst, x32)),
        Case("nf4", lambda: nf4.encode(x32, threads=1)),
        Case("nf4_bf16", lambda: nf4.encode(xbf, threads=1)),
        Case("int8", lambda: i8.encode(x32, threads=1)),
        Case("xxh3", lambda: xxhash.xxh3_64_intdigest(x32)),
        Case("numpy_nf4", lambda: R.nf4_encode(x32)),
    ]
    try:
        import gguf

        Q = gguf.GGMLQuantizationType
        cases += [Case("gguf_q8_0", lambda: gguf.quants.quantize(x32, Q.Q8_0)),
                  Case("gguf_q4_0", lambda: gguf.quants.quantize(x32, Q.Q4_0))]
    except Exception as exc:  # noqa: BLE001 - an optional anchor
        notes.append(f"gguf-py quantizers skipped: {exc}")
    try:
        import torch
        import bitsandbytes.functional as bnbf

        torch.set_num_threads(1)
        t = torch.from_numpy(x32)
        cases.append(Case("bnb_nf4", lambda: bnbf.quantize_4bit(t, blocksize=64, quant_type="nf4")))
    except Exception as exc:  # noqa: BLE001 - an optional anchor
        notes.append(f"bitsandbytes skipped (install torch + bitsandbytes for the NF4 >= 20x figure): {exc}")
    return cases, notes, codecs.isa()


# ---------------------------------------------------------------- the run

def row(figure, vals, unit, *, anchor="", target="", met=None) -> dict:
    med, lo, hi = vals
    return {"figure": figure, "median": med, "min": lo, "max": hi, "unit": unit, "vs_anchor": anchor,
            "target": target, "met": met}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=None, help="checkpoint size in GB (1e9 bytes) of bf16; default 1.4")
    ap.add_argument("--reps", type=int, default=None, help="interleaved rounds (default 5)")
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "orkpack-bench",
                    help="where the cached checkpoint and the outputs live (default $TMPDIR/orkpack-bench)")
    ap.add_argument("--quick", action="store_true", help="smoke run: ~0.3 GB, 2 rounds (explicit options win)")
    ap.add_argument("--kernel-size", type=int, default=4096, help="the kernel array is N x N float32 (default 4096)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    a = ap.parse_args(argv)
    size_gb = a.size_gb if a.size_gb is not None else (0.3 if a.quick else 1.4)
    reps = a.reps if a.reps is not None else (2 if a.quick else 5)
    if reps < 1 or size_gb <= 0:
        ap.error("--reps must be >= 1 and --size-gb > 0")

    load_before = loadavg()
    mach = machine()
    log(f"machine: {mach['cpu']}, {mach['cores']} cores; load average {load_before}")
    workdir = a.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    dims = model_dims(size_gb)
    model = ensure_model(workdir, dims)
    files = shard_files(model)
    src_bytes = sum(f.stat().st_size for f in files)  # the shards as they are on disk (== what cp moves)
    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    log(f"model: {model.name}, {len(files)} shards, {src_bytes / 1e9:.2f} GB; warming the page cache ...")
    warm(files)

    py = [sys.executable, "-m", "orkpack", "build", str(model)]
    t1 = Proc(py + ["-o", str(out / "t1.orkpack"), "--threads", "1", "--no-plan", "--json"], rss=True)
    t2 = Proc(py + ["-o", str(out / "t2.orkpack"), "--threads", "2", "--no-plan", "--json"], rss=True)  # wrapped too: same overhead
    tp = Proc(py + ["-o", str(out / "plan.orkpack"), "--threads", "1", "--json"], rss=True)
    cp = Proc(["cp"] + [str(f) for f in files] + [str(out) + "/"], rss=False)

    log("building the kernel input and checking the C encoders against the references ...")
    n = a.kernel_size
    x32 = heavy_tailed(n, n, seed=SEED)
    kcases, notes, isa = kernel_cases(x32)

    # the warm-up round (untimed), which also checks that --threads 1 and --threads 2 give the same bytes
    log("warm-up round; checking that --threads 1 and --threads 2 write the same pack ...")
    t1(), t2()
    if file_xxh3(out / "t1.orkpack") != file_xxh3(out / "t2.orkpack"):
        sys.exit("bench: --threads 1 and --threads 2 packs differ; the build is not deterministic")
    pack_bytes = (out / "t1.orkpack").stat().st_size
    clear(out)
    tp(), clear(out)
    cp(), clear(out)
    for c in kcases:
        c.run()
    for p in (t1, t2, tp):
        p.rss_mb.clear(), p.inner_s.clear()
    prefault(src_bytes + 512 * MB)

    fresh = src_bytes + 512 * MB  # cp's page cache for the copies; a build's RSS and its pack's page cache

    def reset() -> None:
        clear(out)
        prefault(fresh)

    kcases[-1].after = lambda: prefault(fresh)  # the round's first build follows the kernels
    cases = [
        Case("build_t1", t1, reset, self_timed=True),
        Case("cp", cp, reset, self_timed=True),
        Case("build_t2", t2, reset, self_timed=True),
        Case("build_plan", tp, reset, self_timed=True),
    ] + kcases
    log(f"measuring: {len(cases)} cases x {reps} interleaved rounds ...")
    t_start = time.perf_counter()
    T = interleave(cases, reps, warmup=False)
    wall = time.perf_counter() - t_start
    load_after = loadavg()

    rows = []
    gbs = lambda key: rates(src_bytes, T[key])  # noqa: E731
    rows.append(row("cp of the shard files (anchor)", gbs("cp"), "GB/s", anchor="anchor"))
    r_t1cp = paired(T["build_t1"], T["cp"])
    b1 = gbs("build_t1")
    rows.append(row("build --threads 1 --no-plan", b1, "GB/s", anchor=f"{1 / r_t1cp[0]:.2f}x cp speed",
                    target=">= 1 GB/s", met=b1[0] >= 1.0))
    rows.append(row("  build time / cp time (t1)", r_t1cp, "ratio", anchor="paired per round",
                    target="<= 1.5", met=r_t1cp[0] <= 1.5))
    if t1.inner_s:
        inner = rates(src_bytes, t1.inner_s)
        start = median_minmax([o - i for o, i in zip(T["build_t1"], t1.inner_s)])
        rows.append(row("  of which inside build() (t1)", inner, "GB/s",
                        anchor=f"start+imports+exit {start[0]:.2f} s"))
    b2 = gbs("build_t2")
    r21 = paired(T["build_t1"], T["build_t2"])  # t1 time / t2 time = t2 speed / t1 speed
    rows.append(row("build --threads 2 --no-plan", b2, "GB/s", anchor=f"{r21[0]:.2f}x t1 speed"))
    rows.append(row("  threads 2 / threads 1 speed", r21, "ratio", anchor="paired per round",
                    target=">= 1.7", met=r21[0] >= 1.7))
    bp = gbs("build_plan")
    rp = paired(T["build_t1"], T["build_plan"])
    rows.append(row("build --threads 1, tier-map plan", bp, "GB/s", anchor=f"{rp[0]:.2f}x --no-plan speed"))
    limit_mb = (2 * largest_f32_bytes(dims) + 256 * MB) / MB
    if t1.rss_mb:
        rss = median_minmax(t1.rss_mb)
        rows.append(row("peak RSS, build --threads 1 --no-plan", rss, "MiB", anchor=f"{rss[0] / limit_mb:.2f}x limit",
                        target=f"<= {limit_mb:.0f} MiB", met=rss[2] <= limit_mb))
    if tp.rss_mb:
        rss = median_minmax(tp.rss_mb)
        rows.append(row("peak RSS, build --threads 1, plan", rss, "MiB", anchor=f"{rss[0] / limit_mb:.2f}x limit",
                        target=f"<= {limit_mb:.0f} MiB", met=rss[2] <= limit_mb))
    if not os.access(TIME_BIN, os.X_OK):
        notes.append(f"{TIME_BIN} not found: no peak RSS figures")

    kb = x32.nbytes
    kr = lambda key: rates(kb, T[key])  # noqa: E731
    speedup = lambda key, anchor: paired(T[anchor], T[key])  # noqa: E731 - anchor time / key time
    rows.append(row("memcpy, np.copyto (anchor)", kr("memcpy"), "GB/s", anchor="anchor"))
    kernel_rows = [("nf4", f"NF4 encode, C [{isa}]", ">= 2 GB/s", 2.0),
                   ("int8", f"int8 encode, C [{isa}]", ">= 3 GB/s", 3.0),
                   ("xxh3", "xxh3 checksum (xxhash)", ">= 5 GB/s", 5.0)]
    for key, label, tgt, goal in kernel_rows:
        v = kr(key)
        rows.append(row(label, v, "GB/s", anchor=f"{speedup(key, 'memcpy')[0]:.2f}x memcpy", target=tgt, met=v[0] >= goal))
    v = rates(kb // 2, T["nf4_bf16"])
    rows.append(row(f"NF4 encode, C [{isa}], bf16 input", v, "GB/s",
                    anchor=f"{v[0] / 2:.2f} G elements/s (f32: {kr('nf4')[0] / 4:.2f})"))
    rows.append(row("NF4 numpy reference", kr("numpy_nf4"), "GB/s", anchor="anchor"))
    rows.append(row("  C NF4 / numpy NF4", speedup("nf4", "numpy_nf4"), "x", anchor="paired per round"))
    if "gguf_q8_0" in T:
        rows.append(row("gguf-py Q8_0 quantize (numpy)", kr("gguf_q8_0"), "GB/s", anchor="anchor"))
        rows.append(row("  C int8 / gguf-py Q8_0", speedup("int8", "gguf_q8_0"), "x", anchor="paired per round"))
        rows.append(row("gguf-py Q4_0 quantize (numpy)", kr("gguf_q4_0"), "GB/s", anchor="anchor"))
        rows.append(row("  C NF4 / gguf-py Q4_0", speedup("nf4", "gguf_q4_0"), "x", anchor="paired per round"))
    if "bnb_nf4" in T:
        rows.append(row("bitsandbytes quantize_4bit nf4 (CPU)", kr("bnb_nf4"), "GB/s", anchor="anchor"))
        r = speedup("nf4", "bnb_nf4")
        rows.append(row("  C NF4 / bitsandbytes", r, "x", anchor="paired per round", target=">= 20x", met=r[0] >= 20))

    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]) if argv is None else "main(...)",
        "machine": mach, "kernels_isa": isa, "load_before": load_before, "load_after": load_after,
        "model": {"folder": str(model), **dims, "shard_files": len(files), "shards_bytes": src_bytes, "pack_bytes_no_plan": pack_bytes,
                  "largest_tensor_f32_bytes": largest_f32_bytes(dims)},
        "kernel_input": {"shape": [n, n], "dtype": "float32", "bytes": kb},
        "reps": reps, "measure_seconds": round(wall, 1), "rows": rows, "notes": notes,
    }
    return emit(result, a.json, print_table)


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    md = res["model"]
    con = Console(width=max(132, Console().width))
    for line in machine_lines(res, f", kernels {escape(res['kernels_isa'])}"):
        con.print(line, highlight=False)
    con.print(f"model: {md['layers']} layers, hidden {md['hidden']}, intermediate {md['intermediate']}, "
              f"vocab {md['vocab']}, bf16, {md['shard_files']} shards = {md['shards_bytes'] / 1e9:.2f} GB "
              f"(pack {md['pack_bytes_no_plan'] / 1e9:.2f} GB with --no-plan)", highlight=False)
    con.print(f"kernels on {res['kernel_input']['shape'][0]}x{res['kernel_input']['shape'][1]} float32, one core; "
              f"{res['reps']} interleaved rounds, medians; {res['measure_seconds']:.0f} s", highlight=False)
    t = Table(show_lines=False)
    for col, just in (("figure", "left"), ("median", "right"), ("min-max", "right"), ("unit", "left"),
                      ("vs anchor", "left"), ("target", "left"), ("met?", "center")):
        t.add_column(col, justify=just, no_wrap=(col != "vs anchor"))
    fmt = lambda v, u: f"{v:.0f}" if u == "MiB" else (f"{v:.1f}" if u == "x" and v >= 10 else f"{v:.2f}")  # noqa: E731
    for r in res["rows"]:
        met = "" if r["met"] is None else ("[green]yes[/]" if r["met"] else "[red]NO[/]")
        t.add_row(escape(r["figure"]), fmt(r["median"], r["unit"]), f"{fmt(r['min'], r['unit'])}-{fmt(r['max'], r['unit'])}",
                  r["unit"], escape(r["vs_anchor"]), escape(r["target"]), met)
    con.print(t)
    for note in res["notes"]:
        con.print(f"note: {escape(note)}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())
