"""Issue 16's table: orkpack's 4-bit and int8 encodings against llama.cpp's quantizations of the same weights,
all scored by `orkpack eval` on the same text in the same numerics.

    python bench/quality_table.py SOURCE --gguf F32.gguf --quantize /path/to/llama-quantize [--work DIR]
                                  [--stats-text FILE] [--chunks N] [--only ROW,...] [--mixes] [--json]

SOURCE: the float model (an HF folder); F32.gguf: the same weights as a llama.cpp GGUF (what
llama-quantize reads). Statistics for every "with statistics" row come from one file,
`orkpack imatrix SOURCE --text STATS_TEXT` (default /usr/share/common-licenses/GPL-3, 8 chunks of 512),
used by orkpack (`build --imatrix`) and by llama-quantize (`--imatrix`, which reads the same GGUF
imatrix format). Scoring: `orkpack eval SOURCE X --cpu-act q8 --json` on the built-in prose: a GGUF
in llama.cpp's CPU numerics (Q8 activation blocks), an orkpack pack's decode path with Q8_0
activations (the same numerics), and for the w8a8 rows the prefill path (NPU: int8 weights x int8
activations per token). Every pack and GGUF is built into --work and kept (rerunning reuses them;
delete the folder to rebuild). Rows whose tool is missing are skipped with a note.

--mixes (issue 25's table) adds, for each of llama.cpp's mixes Q4_K_S, Q4_K_M, IQ4_XS, Q5_K_M, Q6_K and Q8_0, without
and with the statistics: the mix as llama-quantize makes it (its own head and embedding types), and the orkpack pack
of no more weight bytes (`build --max-bytes` = the GGUF's tensor bytes; the goal is then quality), scored on the
decode path (Q8_0 activations, the GGUF's numerics) and on the board's prefill path. "weights MB" is what the sizes
are compared on: a GGUF's tensor bytes, a pack's encoded tensor bytes (neither counts headers, the tokenizer, padding).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

STATS_TEXT = Path("/usr/share/common-licenses/GPL-3")

# (name, what, how, path reported): how is ("orkpack", build args) or ("llama", type, extra args)
HEAD8 = ["--token-embedding-type", "q8_0", "--output-tensor-type", "q8_0"]
ROWS = [
    ("nf4-bnb", "NF4 body, head int8: bitsandbytes' rounding (--nf4 bnb)", ("orkpack", ["--no-plan", "--nf4-mode", "bnb"]), "decode"),
    ("nf4-b64", "NF4 body, head int8: error-minimizing, blocksize 64 (--nf4-format b64, 4.5 bpw)", ("orkpack", ["--no-plan", "--nf4-format", "b64"]), "decode"),
    ("nf4", "NF4 body, head int8: error-minimizing nf4dq (default, dq32: blocksize 32, 4.25 bpw)", ("orkpack", ["--no-plan"]), "decode"),
    ("nf4-imat-b64", "NF4 body, head int8: error-minimizing, blocksize 64, with statistics", ("orkpack", ["--no-plan", "--nf4-format", "b64", "--imatrix", "@stats"]), "decode"),
    ("nf4-imat", "NF4 body, head int8: error-minimizing nf4dq (default), with statistics", ("orkpack", ["--no-plan", "--imatrix", "@stats"]), "decode"),
    ("q4_0", "llama.cpp Q4_0, head Q8_0", ("llama", "Q4_0", HEAD8), "llama.cpp CPU"),
    ("iq4_nl", "llama.cpp IQ4_NL, head Q8_0", ("llama", "IQ4_NL", HEAD8), "llama.cpp CPU"),
    ("q4_k_m", "llama.cpp Q4_K_M, head Q8_0", ("llama", "Q4_K_M", HEAD8), "llama.cpp CPU"),
    ("q4_0-imat", "llama.cpp Q4_0, head Q8_0, with statistics", ("llama", "Q4_0", HEAD8 + ["--imatrix", "@stats"]), "llama.cpp CPU"),
    ("iq4_nl-imat", "llama.cpp IQ4_NL, head Q8_0, with statistics", ("llama", "IQ4_NL", HEAD8 + ["--imatrix", "@stats"]), "llama.cpp CPU"),
    ("q4_k_m-imat", "llama.cpp Q4_K_M, head Q8_0, with statistics", ("llama", "Q4_K_M", HEAD8 + ["--imatrix", "@stats"]), "llama.cpp CPU"),
    ("nf4-imat-w", "NF4 body, head int8: error-minimizing, statistics for the NF4 search only (--no-smooth --no-clip)",
     ("orkpack", ["--no-plan", "--imatrix", "@stats", "--no-smooth", "--no-clip"]), "decode"),
    # the default plan, without and with statistics: both paths (one pack each, NAME@TARGET shares a pack)
    ("default", "default plan", ("orkpack", []), "decode"),
    ("default-prefill@default", "default plan", ("orkpack", []), "prefill"),
    ("default-imat", "default plan, --imatrix", ("orkpack", ["--imatrix", "@stats"]), "decode"),
    ("default-imat-prefill@default-imat", "default plan, --imatrix", ("orkpack", ["--imatrix", "@stats"]), "prefill"),
    # w8a8: every matrix int8 on the NPU, prefill path, activations int8 per token (the NPU) or float (weights only)
    ("w8a8", "every matrix int8 on the NPU, int8 activations", ("orkpack", ["--no-plan", "--npu", "*"]), "prefill"),
    ("w8-float@w8a8", "every matrix int8 on the NPU, float activations", ("orkpack", ["--no-plan", "--npu", "*"]), "prefill", ["--act", "float"]),
    ("w8a8-imat", "every matrix int8 on the NPU, int8 activations, --imatrix (smoothed, clipped)", ("orkpack", ["--no-plan", "--npu", "*", "--imatrix", "@stats"]), "prefill"),
    ("w8-float-imat@w8a8-imat", "every matrix int8 on the NPU, float activations, --imatrix", ("orkpack", ["--no-plan", "--npu", "*", "--imatrix", "@stats"]), "prefill", ["--act", "float"]),
    # the same with the tied head kept tied (--no-untie-head): what smoothing the head's untied copy buys
    ("w8a8-imat-tied", "every matrix int8 on the NPU, int8 activations, --imatrix --no-untie-head", ("orkpack", ["--no-plan", "--npu", "*", "--imatrix", "@stats", "--no-untie-head"]), "prefill"),
    ("w8-float-imat-tied@w8a8-imat-tied", "every matrix int8 on the NPU, float activations, --imatrix --no-untie-head", ("orkpack", ["--no-plan", "--npu", "*", "--imatrix", "@stats", "--no-untie-head"]), "prefill", ["--act", "float"]),
]


MIXES = ("Q4_K_S", "Q4_K_M", "IQ4_XS", "Q5_K_M", "Q6_K", "Q8_0")
# the host levels' formats of the orkpack pack at each mix's bytes (--host-low, --host-high; docs/EVAL.md, "llama.cpp's
# mixes at the same bytes"): the pair of the least predicted KLD at those bytes (`orkpack plan --max-bytes B
# --host-low L --host-high H` over every pair); IQ4_XS keeps NF4 / int8, named so a change of the defaults leaves it
MIX_FORMATS = {"Q4_K_S": ("int5dq", "int6dq"), "Q4_K_M": ("int5dq", "int6dq"), "IQ4_XS": ("nf4", "int8"),
               "Q5_K_M": ("int6dq", "int8dq"), "Q6_K": ("int6dq", "int8dq"), "Q8_0": ("int6dq", "int8dq")}


def mix_rows() -> list[tuple]:
    """Issue 25's rows: each llama.cpp mix, and the orkpack pack of its weight bytes (both paths), +- statistics."""
    rows = []
    for t in MIXES:
        for imat in (False, True):
            lname = "mix-" + t.lower() + ("-imat" if imat else "")  # not q4_k_m: that row has a Q8_0 head
            stats = ["--imatrix", "@stats"] if imat else []
            what = f"llama.cpp {t}" + (", with statistics" if imat else "")
            rows.append((lname, what, ("llama", t, stats), "llama.cpp CPU"))
            oname = "ork-" + lname[4:]
            fmt = MIX_FORMATS.get(t)
            levels = ["--host-low", fmt[0], "--host-high", fmt[1]] if fmt else []
            owhat = f"orkpack{' ' + '/'.join(fmt) if fmt else ''}, the bytes of {t}" + (", with statistics" if imat else "")
            args = ["--max-bytes", "@bytes:" + lname] + levels + stats
            rows.append((oname, owhat, ("orkpack", args), "decode"))
            rows.append((oname + "-prefill@" + oname, owhat, ("orkpack", args), "prefill"))
    return rows


def weight_bytes(target: Path) -> int:
    """The tensors' bytes: a GGUF's (gguf-py's n_bytes), a pack's (its slices' stored bytes, `orkpack inspect`)."""
    if target.suffix == ".gguf":
        import gguf

        return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(target)).tensors)
    r = subprocess.run(["orkpack", "inspect", str(target), "--json"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"failed: orkpack inspect {target}\n{r.stderr}")
    return sum(t["stored_bytes"] for t in json.loads(r.stdout)["tensors"])


def run(cmd: list[str], log: Path) -> None:
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}; see {log}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("--gguf", type=Path, help="the same weights as an F32/F16 llama.cpp GGUF (for llama-quantize)")
    ap.add_argument("--quantize", default=shutil.which("llama-quantize"), help="llama-quantize (default: $PATH)")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "orkpack-quality")
    ap.add_argument("--stats-text", type=Path, default=STATS_TEXT)
    ap.add_argument("--stats-chunks", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=0, help="eval chunks (0: every chunk of the prose)")
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--extra-rows", type=Path, help="a JSON list of more rows [name, what, [\"orkpack\", args], path]")
    ap.add_argument("--mixes", action="store_true", help="add issue 25's rows: llama.cpp's mixes and packs of their bytes")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    log = a.work / "log.txt"
    rows = list(ROWS) + (mix_rows() if a.mixes else [])
    if a.extra_rows:
        rows += [tuple(r) if r[2][0] != "orkpack" else (r[0], r[1], (r[2][0], r[2][1]), r[3])
                 for r in json.loads(a.extra_rows.read_text())]
    if a.only:
        keep = set(a.only.split(","))
        rows = [r for r in rows if r[0].partition("@")[0] in keep]
    stats = a.work / "stats.gguf"
    if any("@stats" in (r[2][1] if r[2][0] == "orkpack" else r[2][2]) for r in rows) and not stats.exists():
        run(["orkpack", "imatrix", str(a.source), "--text", str(a.stats_text), "--chunks", str(a.stats_chunks),
             "-o", str(stats), "--json"], log)
    out = []
    for row in rows:
        name, what, how, path = row[:4]
        extra_eval = list(row[4]) if len(row) > 4 else []
        name, _, tname = name.partition("@")
        tname = tname or name
        def sub(args):
            return [str(stats) if x == "@stats" else str(weight_bytes(a.work / f"{x[7:]}.gguf"))
                    if x.startswith("@bytes:") else x for x in args]
        if how[0] == "orkpack":
            target = a.work / f"{tname}.orkpack"
            if not target.exists():
                run(["orkpack", "build", str(a.source), "-o", str(target), "--threads", "1", "--json"] + sub(how[1]), log)
            ev = ["--cpu-act", "q8"] + (extra_eval or (["--act", "token"] if path == "prefill" else []))
        else:
            if not (a.quantize and a.gguf):
                out.append({"row": name, "what": what, "skipped": "no llama-quantize or --gguf"})
                continue
            target = a.work / f"{tname}.gguf"
            if not target.exists():
                run([a.quantize] + sub(how[2]) + [str(a.gguf), str(target), how[1], "1"], log)
            ev = []
        key = tname + "".join("_" + x.lstrip("-") for x in extra_eval)
        cache = a.work / f"{key}.eval.json"  # one eval per pack and eval options: it reports every path
        if not cache.exists():
            cmd = ["orkpack", "eval", str(a.source), str(target), "--json"] + ev + (["--chunks", str(a.chunks)] if a.chunks else [])
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
            cache.write_text(r.stdout)
        rep = json.loads(cache.read_text())
        p = next(x for x in rep["paths"] if x["path"] == path)
        out.append({"row": name, "what": what, "path": path, "bytes": target.stat().st_size,
                    "weights": weight_bytes(target), "kld": p["kld"]["mean"],
                    "kld_se": p["kld"]["se"], "top1": p["top1"], "ppl": p["ppl"], "scored": rep["scored"]})
    base = {r["row"]: r["kld"] for r in out if "kld" in r}
    for r in out:
        if "kld" in r:
            q = base.get("q4_0")  # the ratios are all against plain Q4_0
            r["vs_q4_0"] = r["kld"] / q if q else None
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print("| row | path | file MB | weights MB | KLD mean ± se | / Q4_0 | top-1 | ppl |")
    print("|---|---|---|---|---|---|---|---|")
    for r in out:
        if "kld" not in r:
            print(f"| {r['what']} | skipped: {r['skipped']} | | | | | | |")
            continue
        vs = f"{r['vs_q4_0']:.2f}" if r.get("vs_q4_0") is not None else ""
        print(f"| {r['what']} | {r['path']} | {r['bytes'] / 1e6:.1f} | {r['weights'] / 1e6:.1f} | "
              f"{r['kld']:.4f} ± {r['kld_se']:.4f} | {vs} | "
              f"{100 * r['top1']:.1f} % | {r['ppl']:.2f} |")


if __name__ == "__main__":
    main()
