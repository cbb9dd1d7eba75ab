"""Rich tables for people: build summaries and pack facts."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape as markup_escape
from rich.table import Table

from orkpack.transforms.nf4 import describe as nf4_describe
from orkpack.errors import escape_name
from orkpack.pack.hostlevels import level_names


def human_bytes(n: int | float) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def human_rate(nbytes: int | float, seconds: float) -> str:
    """A speed in the decimal unit that shows it with three significant digits: 1.41 GB/s, 215 MB/s,
    3.40 MB/s, 812 kB/s (a small model's build would read "0.00 GB/s")."""
    if not seconds > 0:
        return "n/a"
    v = nbytes / seconds
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if v < 999.5 or unit == "GB/s":
            return f"{v:.{2 if v < 9.995 else 1 if v < 99.95 else 0}f} {unit}"
        v /= 1000
    return f"{v:.2f} GB/s"  # not reached


def build_summary(console: Console, r) -> None:
    t = Table(title=f"built {escape_name(r.path.name)}", show_lines=False)
    t.add_column("encoding")
    t.add_column("engine")
    t.add_column("slices", justify="right")
    t.add_column("bytes", justify="right")
    for (enc, tier), d in sorted(r.by_kind.items()):
        t.add_row(enc, tier, str(d["slices"]), human_bytes(d["bytes"]))
    console.print(t)
    worst = f"{r.worst_sqnr[1]:.2f} dB ({escape_name(r.worst_sqnr[0])})" if r.worst_sqnr else "n/a"
    console.print(
        f"{r.tensors} tensors, {human_bytes(r.source_bytes)} source -> {human_bytes(r.pack_bytes)} pack "
        f"in {r.seconds:.2f} s ({human_rate(r.source_bytes, r.seconds)} of source); worst SQNR {worst}"
    )


def hub_line(h: dict) -> str:
    """A hub origin (provenance.hub, a tier map's model.hub) for people: ``ORG/NAME[:FILE] @ COMMIT12 (REVISION)``."""
    name = escape_name(h["repo"], 100) + (f":{escape_name(h['file'], 100)}" if h.get("file") else "")
    rev = h.get("revision")
    return f"{name} @ {escape_name(h['commit'], 40)[:12]}" + (f" ({escape_name(rev, 60)})" if rev and rev != h["commit"] else "")


def pack_facts(console: Console, f: dict, *, rows_limit: int | None = None) -> None:
    prov = f.get("provenance") or {}
    head = Table(title=f"{escape_name(f['file'])}", show_header=False)
    head.add_column("key", style="bold")
    head.add_column("value")
    head.add_row("format", f"orkpack {f['format_version']} (tool {f['tool'].get('version') if f.get('tool') else '?'})"
                 + (f"; flags {', '.join(f['flags'])}" if f.get("flags") else ""))
    head.add_row("size", f"{human_bytes(f['file_size'])} (data {human_bytes(f['data_size'])}, header {human_bytes(f['header_size'])})")
    head.add_row("checksums", ", ".join(f"{k}: {v}" for k, v in f["checksums"].items()))
    head.add_row("source", f"{prov.get('source_format', '?')}: " + ", ".join(escape_name(s["file"]) for s in prov.get("sources", []))
                 + (f" (hub {hub_line(prov['hub'])})" if prov.get("hub") else ""))
    head.add_row("arch", str(f.get("arch")))
    head.add_row("tensors", str(f["tensor_count"]))
    line = _model_line(f.get("model"))
    if line:
        head.add_row("model", line)
    from orkpack.inspect import smoothing_line

    line = smoothing_line(f.get("smoothing"))
    if line:
        head.add_row("smoothing", markup_escape(line))
    from orkpack.transforms.rotate import line as rotation_line

    line = rotation_line(f.get("rotation"))
    if line:
        head.add_row("rotation", markup_escape(line))
    c = f.get("clipping")
    if c:
        head.add_row("clipping", markup_escape(f"{c['rows']} int8 rows of {c['slices']} slices clamped to their least-error "
                                               f"ratio, weighted by {escape_name(str(c['stats']), 80)}"))
    if line := nf4_describe(prov.get("nf4")):
        head.add_row("nf4", markup_escape(line))
    if f.get("tiermap"):
        tm = f["tiermap"]
        b = tm.get("board") if isinstance(tm.get("board"), dict) else {}
        rt = b.get("runtime") if isinstance(b.get("runtime"), dict) else {}
        head.add_row("tier map", escape_name(f"board {b.get('name', tm.get('board'))}, runtime {rt.get('name', 'board-v2')}"))
        cl = (tm.get("options") or {}).get("cluster") if isinstance(tm.get("options"), dict) else None
        if isinstance(cl, dict) and isinstance(cl.get("layers"), list) and len(cl["layers"]) == 2:
            a, b_ = cl["layers"]
            head.add_row("cluster", escape_name(f"node {cl.get('node')} of {len(cl.get('nodes') or [])}: layers {a}-{b_ - 1} "
                                                f"({b_ - a}){' + embedding/head (client)' if cl.get('node') == 0 else ''}; "
                                                "the whole split: orkpack inspect DIR/cluster.json"))
        pr = tm.get("prediction")
        line = _prediction_line(pr, b) if isinstance(pr, dict) else None
        if line:
            head.add_row("predicted", line)
    console.print(head)

    res = Table(title="residency per engine")
    res.add_column("engine")
    res.add_column("slices", justify="right")
    res.add_column("resident", justify="right")
    res.add_column("stored", justify="right")
    for tier, d in f["residency"].items():
        n = str(d["slices"]) + (f" + {d['host_copies']} host copies" if d.get("host_copies") else "")
        res.add_row(tier + (" (int8 tiles)" if tier == "npu" else " (CPU/GPU, as stored)"), n, human_bytes(d["resident_bytes"]), human_bytes(d["stored_bytes"]))
    console.print(res)

    t = Table(title="tensors")
    for c in ("name", "shape", "encoding", "tier", "bytes", "SQNR dB", "xxh3"):
        t.add_column(c, justify="right" if c in ("bytes", "SQNR dB") else "left", overflow="fold")
    rows = f["tensors"] if rows_limit is None else f["tensors"][:rows_limit]
    for r in rows:
        sq = "" if r["sqnr_db"] is None else f"{r['sqnr_db']:.2f}"
        if r.get("decode_sqnr_db") is not None and r["decode_sqnr_db"] != r["sqnr_db"]:
            sq += f" / {r['decode_sqnr_db']:.2f} decode"  # dual residency: decode reads the host NF4 copy
        first = r["slices"][0]["xxh3"]
        ck = next(iter(first.values())) if first else ""
        if len(r["slices"]) > 1:
            ck += f" (+{len(r['slices']) - 1} slices)"
        enc = r["encoding"] if r.get("dtype") is None else f"{r['encoding']} {escape_name(str(r['dtype']), 16)}"
        if r.get("smoothed"):
            enc += f", smoothed: {markup_escape(r['smoothed'])}"
        if r.get("rotated"):
            enc += f", rotated: {markup_escape(r['rotated'])}"
        t.add_row(escape_name(r["name"]), _shape(r["shape"]), enc, r["tier"], human_bytes(r["stored_bytes"]), sq, ck)
    console.print(t)
    if rows_limit is not None and len(f["tensors"]) > rows_limit:
        console.print(f"... {len(f['tensors']) - rows_limit} more tensors (--tensor GLOB to filter, --json for all)")
    skipped = f.get("skipped") or []
    if skipped:
        t = Table(title=f"left out: {len(skipped)} tensor{'s' if len(skipped) != 1 else ''} that are not weights (see why)")
        for c in ("source name", "dtype", "shape", "why"):
            t.add_column(c, overflow="fold")
        for s in skipped:
            t.add_row(*(markup_escape(c) for c in (escape_name(s["name"]), escape_name(str(s["dtype"]), 16),
                                                    "?" if s["shape"] is None else _shape(s["shape"]),
                                                    escape_name(str(s["reason"]), 120))))
        console.print(t)


def _model_line(m: dict | None) -> str | None:
    """One line of the pack's model record: what a runtime needs to run it alone (docs/FORMAT.md 9)."""
    if not m:
        return "none (packs before format 1.3, or a source without config.json)" if m is None else None
    if m.get("problem"):
        return f"malformed: {escape_name(m['problem'], 120)}"
    bits = [f"{escape_name(str(m['architecture']), 40)} (from {m['source']}, {len(m['keys'])} keys)"]
    for k, label in (("context_length", "ctx"), ("block_count", "blocks"), ("embedding_length", "hidden"),
                     ("rope_freq_base", "rope base"), ("rms_epsilon", "rms eps")):
        if m.get(k) is not None:
            bits.append(f"{label} {m[k]:g}" if isinstance(m[k], float) else f"{label} {m[k]}")
    if m.get("tokenizer"):
        bits.append(f"tokenizer {escape_name(str(m['tokenizer']), 20)} ({m.get('vocab')} tokens"
                    + (f", {m['merges']} merges)" if m.get("merges") else ")"))
    elif m.get("hf_tokenizer_json"):
        bits.append("tokenizer.json")
    else:
        bits.append("no tokenizer")
    bits.append("chat template" if m.get("chat_template") else "no chat template")
    return markup_escape(", ".join(bits))


def _shape(shape) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def _prediction_line(pr: dict, board: dict) -> str | None:
    """The tier map's predicted speeds beside the CPU baseline of every item at the host low level (named by its
    format, from the map's ``board`` block), or None for an older map without them."""
    try:
        base = pr["baselines"]["cpu_nf4"]
        low = escape_name(level_names(board, title=True)["nf4"], 20)
        return (f"decode {float(pr['decode_tok_s']):.2f} tok/s, prefill {float(pr['prefill_tok_s']):.1f} tok/s, "
                f"TTFT {float(pr['ttft_s']):.2f} s at {int(pr['prompt'])} tokens (CPU only, all {low}: decode "
                f"{float(base['decode_tok_s']):.2f}, prefill {float(base['prefill_tok_s']):.1f})")
    except (KeyError, TypeError, ValueError):
        return None


def imatrix_report(console: Console, r: dict) -> None:
    """``orkpack imatrix``: what was written."""
    console.print(f"wrote {markup_escape(escape_name(r['output']))}: statistics of {r['matrices']} matrices over "
                  f"{r['chunks']} chunks of {r['chunk_size']} tokens "
                  f"({markup_escape(escape_name(', '.join(r['datasets'])))})")


def eval_report(console: Console, r: dict, *, rows: int = 20) -> None:
    """``orkpack eval``: one row per path (KLD against the reference, top-1 agreement, perplexity)."""
    src = f"{escape_name(r['source'])} (float) vs " if r.get("source") else ""
    t = Table(title=markup_escape(f"{src}{escape_name(r['pack'])}: {r['scored']} tokens scored "
                                  f"({r['chunks']} chunks of {r['ctx']}, {escape_name(r['text'])})"))
    for c in ("path", "KLD mean", "± se", "median", "p99", "max", "top-1", "ppl"):
        t.add_column(c, justify="left" if c == "path" else "right")
    for p in r["paths"]:
        k = p.get("kld")
        cells = [f"{k['mean']:.5f}", f"{k['se']:.5f}", f"{k['median']:.5f}", f"{k['p99']:.4f}", f"{k['max']:.4f}",
                 f"{100 * p['top1']:.1f} %"] if k else ["(reference)", "", "", "", "", ""]
        t.add_row(p["path"], *cells, f"{p['ppl']:.3f}")
    console.print(t)
    for p in r["paths"]:
        console.print(markup_escape(f"{p['path']}: {p['numerics']}"))
    if r.get("note"):
        console.print(markup_escape(f"note: {r['note']}"))
    if line := nf4_describe(r.get("nf4")):
        console.print(markup_escape(f"nf4: {line}"))
    from orkpack.transforms.rotate import line as rotation_line

    if line := rotation_line(r.get("rotation")):
        console.print(markup_escape(f"rotation: {line}"))
    sv = r.get("sensitivity")
    if sv:
        rho = "n/a" if sv["spearman"] is None else f"{sv['spearman']:.3f}"
        console.print(markup_escape(
            f"sensitivity: {sv['items']} items, estimated NF4-vs-int8 KLD total {sv['total']:.4f}; checked on "
            f"{len(sv['sample'])} items ({sv['per_tensor_tokens']}-token sample): Spearman {rho} (estimate vs true)"))
    for label, items in (r.get("per_tensor") or {}).items():
        pt = Table(title=f"{label}: items by the KLD each adds alone (top {min(rows, len(items))} of {len(items)}; "
                         f"{r.get('per_tensor_tokens')}-token sample)")
        for c in ("item", "KLD alone", "share", "output SNR dB"):
            pt.add_column(c, justify="left" if c == "item" else "right")
        for it in items[:rows]:
            pt.add_row(escape_name(it["item"]), f"{it['kld_alone']:.5f}", f"{100 * it['share']:.1f} %",
                       "" if it["rel_error"] is None else "exact" if it["snr_db"] is None else f"{it['snr_db']:.2f}")
        console.print(pt)


class GenerationStream:
    """``orkpack generate``'s answers as they come: a label line per answer, then its text (or ids) token by token,
    written straight to ``out`` and flushed (the pack's numerics are slow; a person watches them arrive)."""

    _LABELS = {"pack": "pack (decode numerics)", "source": "source (float32)"}

    def __init__(self, out):
        self.out, self.started = out, False

    def answer(self, label: str) -> None:
        if self.started:
            self.out.write("\n")
        self.out.write(f"--- {self._LABELS.get(label, label)}:\n")
        self.out.flush()
        self.started = True

    def token(self, label: str, tid: int, piece: str) -> None:
        if piece:
            self.out.write(piece)
            self.out.flush()

    def end(self) -> None:
        if self.started:
            self.out.write("\n")
            self.out.flush()


def _rate(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} tok/s"


def generation_report(console: Console, r: dict) -> None:
    """What follows the streamed answers: per answer its stop and rates, then where the two answers part."""
    how = "greedy" if r["sampling"]["greedy"] else (
        "sampled: temp {temp}, top-k {top_k}, top-p {top_p}, seed {seed}".format(**r["sampling"]))
    console.print(f"{len(r['prompt_tokens'])} prompt tokens{' (chat template)' if r['chat'] else ''}, {how}, "
                  f"{'KV cache and recurrent states' if r['cache'] else 'no cache: the whole sequence every step'}; "
                  f"weights {r['weights']}", highlight=False)
    for label, a in r["answers"].items():
        console.print(f"{label}: {a['generated']} tokens, stopped at {a['stop']}; weights {a['load_s']:.2f} s, prompt "
                      f"{_rate(a['prompt_tokens_per_s'])} ({a['prompt_s']:.2f} s), generation {_rate(a['tokens_per_s'])} "
                      f"({a['generation_s']:.2f} s)", highlight=False)
    if "source" in r["answers"]:
        p, s = r["answers"]["pack"], r["answers"]["source"]
        at = r["parted_at"]
        if at is None:
            console.print(f"the answers agree on every token ({p['generated']})", highlight=False)
        else:
            def tok(a):
                if at >= len(a["tokens"]):
                    return "(stopped)"
                return repr(a["texts"][at]) if a["texts"] else str(a["tokens"][at])
            console.print(f"the answers part at token {at}: pack {markup_escape(tok(p))}, source {markup_escape(tok(s))}",
                          highlight=False)
