"""``orkpack eval [SOURCE] PACK``: the next-token distributions of a pack's paths beside its source's float model.

Scoring follows ``llama-perplexity --kl-divergence``: the token ids are cut into chunks of ``ctx``
tokens (the remainder is dropped; a model that wants a BOS gets it as each chunk's first token), each
chunk runs as its own sequence, and the logits at positions ``ctx/2 .. ctx-2`` are scored (each
predicts the next token of the chunk). Per scored token: the reference's and each path's negative
log-likelihood of the next token, KL(reference || path) of the next-token distribution, and whether
their most likely tokens agree. The chunks of a run go through the model together, layer by layer
(forward.Batch: each layer's weights are read and dequantized once for all chunks), every run in step;
then chunk by chunk each run's scored logits: one chunk's scored reference log-probabilities are kept
while its paths score, nothing else of the vocabulary size (but each run's output head weights).

PACK is an ``.orkpack`` (its paths: prefill and decode, orkpack.eval.weights.PackWeights) or a
GGUF (one path: llama.cpp's CPU numerics, GGUFWeights). With SOURCE the reference is its float
model; without, the pack's first path is the reference of the others (and perplexities are
reported for every path). Docs: docs/EVAL.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np

from ..transforms.nf4 import pack_record as nf4_pack_record
from ..errors import escape_name
from ..model import forward
from ..model.hparams import Hparams, from_config, from_gguf
from ..model.weights import EMBED, SourceWeights, Wrapped
from ..pack import spec
from ..pack.model import check_model, value
from ..pack.reader import Pack
from ..sources import open_source
from ..transforms.smoothed import Smoothed, ops_of, shown as smoothing_shown, untied_of
from ..transforms.rotate import RotatedSource, from_pack as rotation_from_pack, shown as rotation_shown
from ..sources.gguf import GGUFSource
from ..sources.hub import Located, locate
from . import sensitivity
from .collect import Collector
from .text import PROSE, source_record, token_ids
from .weights import ACT_SCHEMES, CPU_ACTS, EvalError, GGUFWeights, PackWeights

_LOGIT_BLOCK = 128  # tokens per output-head call
_KLD_ROWS = 32  # tokens per float64 log-softmax


@dataclass
class Options:
    text: Path | None = None
    tokens: Path | None = None  # token ids (whitespace-separated or a JSON list) instead of a text
    ctx: int = 512
    chunks: int = 0  # 0: every whole chunk of the text
    act: str = "token"  # NPU activations: per token or per tensor
    cpu_act: str = "float"  # CPU activations of quantized weights: float or q8 (llama.cpp Q8_0 blocks)
    per_tensor: bool = False
    per_tensor_tokens: int = 128  # the sample the single-item KLDs are measured on (the first chunk's first N tokens)
    sensitivity: bool = False  # each item's NF4-vs-int8 KLD, estimated from activation statistics (sensitivity.py)
    sensitivity_per_kind: int = 3  # items per kind whose true single-item KLD checks (and scales) the estimate
    threads: int = 1  # BLAS threads (0: the library's default, all cores)
    revision: str | None = None  # the hub revision of SOURCE (of PACK without SOURCE) named ORG/NAME (sources/hub.py)


@dataclass
class _Target:
    """Something that yields logits: a label, its hparams and a fresh weight provider per run."""
    label: str
    hp: Hparams
    make: Callable[[], object]
    numerics: str
    wrap: Callable | None = None


@dataclass
class _Stats:
    nll: list = field(default_factory=list)
    kld: list = field(default_factory=list)
    top1: list = field(default_factory=list)


# ------------------------------------------------------------------------------------------- inputs

def _is_gguf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def pack_hparams(pack: Pack) -> Hparams:
    """The forward pass's numbers from the pack alone: its config and model record (FORMAT.md 9), in the
    weight layout of the source it was built from (an HF folder's, or llama.cpp's GGUF layout)."""
    h = pack.header
    where = escape_name(str(pack.path))
    cfg, model = h.get("config"), h.get("model")
    fmt = (h.get("provenance") or {}).get("source_format")
    if not isinstance(cfg, dict):
        raise EvalError(f"{where}: the pack has no architecture config; give its source: orkpack eval SOURCE PACK")
    if fmt == "gguf":
        why = check_model(model)
        if model is None or why:
            raise EvalError(f"{where}: the pack's model record is {'missing' if model is None else why} (packs before "
                            "format 1.3 carry none): rebuild it, or give its source: orkpack eval SOURCE PACK")
        kv = {e[0]: value(e) for e in model["kv"]}
        freqs = None
        if any(t["name"] == "rope_freqs.weight" for t in pack.tensors):
            freqs = PackWeights(pack, "decode").tensor("rope_freqs.weight")
        return from_gguf(kv, cfg, freqs, where)
    return from_config(cfg, where)


def _check_same_model(src, names_shapes: dict, hp_src: Hparams, hp: Hparams, what: str,
                      untied: dict | None = None) -> None:
    """``untied``: a pack's untied copies (the smoothed head, orkpack/transforms/smooth.py), checked as the tensor they copy."""
    s = {t.name: tuple(t.shape) for t in src.tensors()}
    where = escape_name(str(src.root))
    for name, shape in names_shapes.items():
        name = (untied or {}).get(name, name) if name not in s else name
        if name not in s:
            raise EvalError(f"{where}: has no tensor {escape_name(name)} that {what} holds; give the source the pack "
                            "was built from")
        if s[name] != tuple(shape):
            raise EvalError(f"{where}: {escape_name(name)} is {list(s[name])} here and {list(shape)} in {what}; "
                            "give the source the pack was built from")
    if (hp_src.vocab, hp_src.n_layers, hp_src.hidden) != (hp.vocab, hp.n_layers, hp.hidden):
        raise EvalError(f"{where}: a different model from {what} (vocabulary, layers or width differ)")


# ------------------------------------------------------------------------------------------- scoring

def _log_softmax64(lg: np.ndarray) -> np.ndarray:
    x = lg.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    x -= np.log(np.exp(x).sum(-1, keepdims=True))
    return x


def _score(base_lp: np.ndarray | None, lg: np.ndarray, nxt: np.ndarray, st: _Stats) -> None:
    """Add one block of a path's scored logits (rows predicting ``nxt``) to its stats."""
    for r in range(0, lg.shape[0], _KLD_ROWS):
        lp = _log_softmax64(lg[r: r + _KLD_ROWS])
        st.nll.extend((-lp[np.arange(lp.shape[0]), nxt[r: r + _KLD_ROWS]]).tolist())
        if base_lp is not None:
            b = base_lp[r: r + _KLD_ROWS].astype(np.float64)
            st.kld.extend(np.maximum(0.0, (np.exp(b) * (b - lp)).sum(-1)).tolist())
            st.top1.extend((b.argmax(-1) == lp.argmax(-1)).tolist())


def _summary(st: _Stats) -> dict:
    out = {"ppl": float(math.exp(np.mean(st.nll))) if st.nll else None}
    if st.kld:
        k = np.asarray(st.kld)
        out["kld"] = {"mean": float(k.mean()), "se": float(k.std(ddof=1) / math.sqrt(k.size)) if k.size > 1 else 0.0,
                      "median": float(np.median(k)), "p99": float(np.percentile(k, 99)), "max": float(k.max())}
        out["top1"] = float(np.mean(st.top1))
    return out


class _ErrorMeter(Wrapped):
    """--per-tensor: wraps a path's provider; beside every matmul, the same inputs through the source's float
    weights; per item, the relative error of its output: sum |y_path - y_float|^2 / sum |y_float|^2."""

    def __init__(self, inner, ref: SourceWeights, acc: dict):
        super().__init__(inner)
        self.ref, self.acc = ref, acc

    def matmul(self, name, x, expert=None):
        y = self.inner.matmul(name, x, expert)
        yf = self.ref.matmul(name, x, expert)
        key = name if expert is None else f"{name}[{expert}]"
        e, s = self.acc.get(key, (0.0, 0.0))
        d = (y - yf).astype(np.float64)
        self.acc[key] = (e + float((d * d).sum()), s + float((yf.astype(np.float64) ** 2).sum()))
        return y

    def release(self):
        self.inner.release()
        self.ref.release()


class _OneItem:
    """The source's float weights except one item (a tensor, or one expert), which runs in a path's numerics."""

    def __init__(self, ref: SourceWeights, path, name: str, expert: int | None):
        self.ref, self.path, self.key = ref, path, (name, expert)

    def has(self, name):
        return self.ref.has(name)

    def tensor(self, name):
        return self.ref.tensor(name)

    def embed(self, ids, name=EMBED):
        return (self.path if self.key == (name, None) else self.ref).embed(ids, name)

    def matmul(self, name, x, expert=None):
        return (self.path if (name, expert) == self.key else self.ref).matmul(name, x, expert)

    def release(self):
        self.ref.release()
        self.path.release()


def _second_half(stub, ids, hp):
    """(a weight provider -> its logits on the second half of ``ids``, the next tokens they predict): how
    --per-tensor and --sensitivity score a sample."""
    T = ids.size
    first = T // 2

    def logits(w):
        rows = []
        forward.run(stub, ids, weights=w, hp=hp, chunk=_LOGIT_BLOCK,
                    on_logits=lambda t0, lg: rows.append(lg[max(0, first - t0): max(0, T - 1 - t0)]))
        return np.concatenate(rows)

    return logits, ids[first + 1:]


def _single_item_klds(pack, src, hp, stub, ids, opts, progress) -> dict:
    """--per-tensor: per path, the KLD of each quantized item run alone in that path's numerics (every other
    matrix float), on the sample ``ids`` scored on its second half. A host item runs the same on both paths
    (its CPU path), so prefill measures only the items it puts on the NPU and takes the rest from decode."""
    logits, nxt = _second_half(stub, ids, hp)

    fl = _float_of(pack, src, hp)
    ref_lg = logits(fl())
    base = _log_softmax64(ref_lg).astype(np.float32)
    items = [(t["name"], s["expert"]) for t, s in pack.slices()
             if len(s["shape"]) == 2 and s["encoding"] in spec.QUANT_ENCODINGS]
    paths = {"decode": PackWeights(pack, "decode", cpu_act=opts.cpu_act),
             "prefill": PackWeights(pack, "prefill", m=opts.ctx, act=opts.act, cpu_act=opts.cpu_act)}
    out: dict = {"decode": {}, "prefill": {}}
    todo = [(p, it) for p in ("decode", "prefill") for it in items
            if p == "decode" or paths["prefill"].engine(*it) == "npu"]
    for n, (p, (name, expert)) in enumerate(todo):
        st = _Stats()
        _score(base, logits(_OneItem(fl(), paths[p], name, expert)), nxt, st)
        out[p][name if expert is None else f"{name}[{expert}]"] = float(np.mean(st.kld))
        if progress:
            progress(n + 1, len(todo), f"per-tensor {p} {name}")
    for k, v in out["decode"].items():
        out["prefill"].setdefault(k, v)
    return out


# ------------------------------------------------------------------------------------------- entry

def evaluate(source: Path | None, pack_path: Path, opts: Options,
             progress: Callable[[float, float, str], None] | None = None) -> dict:
    """Score PACK (and SOURCE's float model, when given) on the text; the report as a dict (docs/EVAL.md).
    SOURCE and PACK may be hub names (``ORG/NAME``, ``ORG/NAME:FILE.gguf``: orkpack/sources/hub.py);
    ``opts.revision`` is SOURCE's (PACK's without SOURCE)."""
    if opts.ctx < 4 or opts.ctx % 2:
        raise EvalError(f"--ctx {opts.ctx}: give an even chunk length of at least 4 tokens")
    if opts.act not in ACT_SCHEMES:
        raise EvalError(f"--act {opts.act!r}: choose {' or '.join(ACT_SCHEMES)}")
    if opts.cpu_act not in CPU_ACTS:
        raise EvalError(f"--cpu-act {opts.cpu_act!r}: choose {' or '.join(CPU_ACTS)}")
    if opts.chunks < 0:
        raise EvalError(f"--chunks {opts.chunks}: give 0 (all) or a positive count")
    if opts.threads < 0:
        raise EvalError(f"--threads {opts.threads}: give 0 (all cores) or a positive count")
    pack_loc = locate(pack_path, revision=opts.revision if source is None else None)
    pack_path = pack_loc.path
    if not pack_path.exists():
        raise EvalError(f"{escape_name(str(pack_path))}: no such file; give an .orkpack or a .gguf")
    if source is not None:
        source = locate(source, revision=opts.revision)
    from threadpoolctl import threadpool_limits

    closers = []
    try:
        with threadpool_limits(limits=opts.threads or None, user_api="blas"):
            report = _evaluate(source, pack_path, opts, progress, closers)
    finally:
        for c in reversed(closers):
            c()
    if source is not None:
        report["source"] = source.shown
        if source.origin is not None:
            report["source_hub"] = source.origin.recorded()
    if pack_loc.origin is not None:
        report["pack"], report["pack_hub"] = pack_loc.shown, pack_loc.origin.recorded()
    return report


def _name(source: Located) -> str:
    """A source's name in a profile's note: its hub name, or its file or folder name."""
    return source.origin.label if source.origin else source.path.name


def _evaluate(source: Located | None, pack_path: Path, opts, progress, closers) -> dict:
    quiet = lambda m: None  # noqa: E731 - dequantizing a quantized GGUF is the point here, not a warning
    targets: list[_Target] = []
    if _is_gguf(pack_path):
        g = GGUFSource(pack_path, on_warning=quiet)
        closers.append(g.close)
        hp = forward.model_hparams(g)
        record = g.model_metadata()
        kind = "gguf"
        stub_config = g.config
        names_shapes = {t.name: t.shape for t in g.tensors()}
        types = sorted({t.dtype for t in g.tensors() if len(t.shape) >= 2})
        targets.append(_Target("llama.cpp CPU", hp, lambda: GGUFWeights(g),
                               f"weights as stored ({', '.join(types)}), activations as llama.cpp's CPU kernels "
                               "quantize them for each weight type"))
    else:
        pack = Pack.open(pack_path)
        closers.append(pack.close)
        try:
            hp = pack_hparams(pack)
        except EvalError:
            if source is None:
                raise
            hp = None  # a pack without its model record (before 1.3): the source's numbers, set below
        record = pack.header.get("model") if not check_model(pack.header.get("model")) else None
        kind = "pack"
        stub_config = pack.header.get("config")
        names_shapes = {t["name"]: t["shape"] for t in pack.tensors}
        m = opts.ctx
        npu = f"int8 x int8 (activations int8 per {opts.act})" if opts.act != "float" else \
            "int8 weights x float activations"
        targets.append(_Target("prefill", hp, lambda: PackWeights(pack, "prefill", m=m, act=opts.act,
                                                                  cpu_act=opts.cpu_act),
                               f"M = {m}: NPU slices with min_m <= {m} as {npu}, others on the CPU (activations "
                               f"{opts.cpu_act})"))
        targets.append(_Target("decode", hp, lambda: PackWeights(pack, "decode", cpu_act=opts.cpu_act),
                               f"M = 1: every matmul on the CPU: host copies, host slices as stored, NPU-only "
                               f"slices from their int8 tiles (activations {opts.cpu_act})"))
    ref_target = None
    src = None
    if source is not None:
        src = open_source(source, on_warning=quiet)
        closers.append(src.close)
        hp_src = forward.model_hparams(src)
        if hp is None:
            hp = hp_src
            for t in targets:
                t.hp = hp
        _check_same_model(src, names_shapes, hp_src, hp, escape_name(str(pack_path)),
                          (untied_of(pack) | _rotation_untied(pack)) if kind == "pack" else None)
        ref_target = _Target("reference", hp_src, lambda: SourceWeights(src), "the source's weights in float32")
        if record is None:
            record = source_record(src)
    if opts.per_tensor or opts.sensitivity:
        what = "--per-tensor" if opts.per_tensor else "--sensitivity"
        if kind != "pack":
            raise EvalError(f"{what} ranks the items of an orkpack; a GGUF has no paths to split")
        if opts.per_tensor_tokens < 4:
            raise EvalError(f"--per-tensor-tokens {opts.per_tensor_tokens}: give at least 4")
        if src is None:
            raise EvalError(f"{what} compares each matmul with the source's float weights: give the source too "
                            "(orkpack eval SOURCE PACK)")
        if opts.sensitivity and kind == "pack" and (pack.header.get("provenance") or {}).get("rotation"):
            raise EvalError("--sensitivity estimates the source's items, and this pack is rotated (build --rotate): "
                            "give a pack built without --rotate")
        if opts.sensitivity and kind == "pack" and (pack.header.get("provenance") or {}).get("smoothing"):
            raise EvalError("--sensitivity estimates the source's unsmoothed items, and this pack is smoothed "
                            "(build --imatrix): give a pack built without --imatrix (or with --no-smooth)")
        if hp_src.layout != hp.layout:
            raise EvalError(f"{what} needs the source the pack was built from ({'a GGUF' if hp.layout == 'gguf' else 'an HF folder'}): "
                            "the two hold the attention rows in different orders")
    ids, bos, text_where = token_ids(opts.text, opts.tokens, record, hp.vocab, escape_name(str(pack_path)))
    text_path = opts.tokens if opts.tokens is not None else (opts.text or PROSE)
    n_chunks = ids.size // opts.ctx
    if n_chunks == 0:
        raise EvalError(f"{text_where}: {ids.size} tokens, fewer than one chunk of --ctx {opts.ctx}; "
                        "give a longer text or a smaller --ctx")
    if opts.chunks:
        n_chunks = min(n_chunks, opts.chunks)
    stub = SimpleNamespace(root=pack_path, config=stub_config)  # what forward.run reads of a source
    runs = ([ref_target] if ref_target else []) + targets
    float_of = _float_of(pack, src, hp) if opts.per_tensor else None
    first = opts.ctx // 2
    # every chunk runs as its own sequence, all chunks of a run together layer by layer (forward.Batch: each layer's
    # weights decoded once, not once a chunk), every run in step; then chunk by chunk each run's scored logits (the
    # blocks of the head from the first scored token on), the reference's first: nothing of the vocabulary size is
    # kept but one chunk's scored reference log-probabilities (and each run's head weights)
    chunks = []
    for c in range(n_chunks):
        chunk = ids[c * opts.ctx: (c + 1) * opts.ctx].copy()
        if bos is not None:
            chunk[0] = bos
        chunks.append(chunk)
    # the head from the first scored token's block on; from token 0 when every product is measured (--per-tensor's
    # errors, --sensitivity's statistics: over the whole chunk, as they always were)
    head_from = 0 if opts.per_tensor or opts.sensitivity else first
    head_blocks = forward.head_blocks(opts.ctx, _LOGIT_BLOCK, head_from)
    per_run = hp.n_layers + head_blocks
    total = float(n_chunks * len(runs) * per_run)
    stats = {r.label: _Stats() for r in runs}
    acc: dict = {}
    sacc: dict = {}  # --sensitivity: the reference pass's activation statistics
    done = 0.0
    batches = []
    for r in runs:
        w = r.make()
        if opts.per_tensor and r is not ref_target:
            w = _ErrorMeter(w, float_of(), acc.setdefault(r.label, {}))
        if opts.sensitivity and r is ref_target:
            w = Collector(w, sacc, output_energy=True)
        batches.append(forward.Batch(src if r is ref_target else stub, chunks, weights=w, hp=r.hp))
    try:
        for i in range(hp.n_layers):
            for r, b in zip(runs, batches):
                b.layer(i)
                done += n_chunks
                if progress:
                    progress(done, total, f"layer {i + 1}/{hp.n_layers} {r.label}")
        for c in range(n_chunks):
            nxt = chunks[c][first + 1:]
            base_lp = None
            for ri, (r, b) in enumerate(zip(runs, batches)):
                rows = []

                def on_logits(t0, lg, rows=rows):
                    lo, hi = max(t0, first), min(t0 + lg.shape[0], opts.ctx - 1)
                    if hi > lo:
                        rows.append(lg[lo - t0: hi - t0])

                def step(label=r.label):
                    nonlocal done
                    done += 1
                    if progress:
                        progress(done, total, f"chunk {c + 1}/{n_chunks} {label}")

                b.logits(c, on_logits, chunk=_LOGIT_BLOCK, start=head_from, step=step)
                lg = np.concatenate(rows)
                if ri == 0:
                    base_lp = np.concatenate([_log_softmax64(lg[i: i + _KLD_ROWS]).astype(np.float32)
                                              for i in range(0, lg.shape[0], _KLD_ROWS)])
                    _score(None, lg, nxt, stats[r.label])
                else:
                    _score(base_lp, lg, nxt, stats[r.label])
                del rows, lg
    finally:
        for b in batches:
            b.release()
    report = {
        "source": None if source is None else str(source),
        "pack": str(pack_path),
        "kind": kind,
        "text": str(text_path) if (opts.text or opts.tokens) else "built-in prose",
        "tokens": int(ids.size),
        "ctx": opts.ctx,
        "chunks": n_chunks,
        "scored": n_chunks * (opts.ctx - 1 - first),
        "reference": runs[0].label,
        "nf4": nf4_pack_record(pack.header) if kind == "pack" else None,
        "note": None if ref_target else ("no SOURCE: there is no float reference; KL divergence and top-1 agreement "
                                         f"are of each path against the {runs[0].label} path"),
        "paths": [{"path": r.label, "numerics": r.numerics, **_summary(stats[r.label])} for r in runs],
        "smoothing": _smoothing(pack if kind == "pack" else None),
        "rotation": rotation_shown(pack.header.get("provenance")) if kind == "pack" else None,
    }
    if opts.per_tensor:
        sample = ids[: min(opts.ctx, opts.per_tensor_tokens)].copy()
        if bos is not None:
            sample[0] = bos
        klds = _single_item_klds(pack, src, hp, stub, sample, opts, progress and (
            lambda d, t, what: progress(total + d, total + t, what)))
        report["per_tensor_tokens"] = int(sample.size)
        report["per_tensor"] = {label: _ranked(a, klds[label]) for label, a in acc.items()}
    if opts.sensitivity:
        sample = ids[: min(opts.ctx, opts.per_tensor_tokens)].copy()
        if bos is not None:
            sample[0] = bos
        items = [(t["name"], s["expert"]) for t, s in pack.slices()
                 if len(s["shape"]) == 2 and s["encoding"] in spec.QUANT_ENCODINGS]
        score = _sample_scorer(src, hp, stub, sample)
        res = sensitivity.measure(src, items, sacc, lambda key, w: score(sensitivity._Weights(src, key, w)),
                                  per_kind=opts.sensitivity_per_kind,
                                  progress=progress and (lambda d, t, what: progress(total + d, total + t, what)))
        report["sensitivity"] = sensitivity.report(res)
        report["sensitivity"]["per_tensor_tokens"] = int(sample.size)
        report["_profile"] = sensitivity.to_profile(
            res, f"orkpack eval --sensitivity: KLD each item adds in NF4 rather than int8, {pack_path.name} against "
                 f"{_name(source)}, {report['scored']} tokens of statistics, {sample.size}-token sample; "
                 f"Spearman {res['spearman']}")
    return report


def _smoothing(pack) -> dict | None:
    """The pack's activation smoothing (its provenance, docs/EVAL.md), as inspect shows it; None without."""
    if pack is None:
        return None
    return smoothing_shown(pack.header.get("provenance"))


def _rotation_untied(pack) -> dict[str, str]:
    """A rotated pack's untied head (orkpack/transforms/rotate.py): output.weight -> token_embd.weight; {} without."""
    return {t["name"]: t["rotation"]["untied"]["from"] for t in pack.tensors
            if isinstance(t.get("rotation"), dict) and isinstance(t["rotation"].get("untied"), dict)}


def _float_of(pack, src, hp):
    """The source's float weights as the pack's weights hold them: rotated (orkpack/transforms/rotate.py) and smoothed
    (orkpack/transforms/smooth.py) as the pack was, so that each matmul compares like with like; the plain source
    when the pack is neither."""
    rp = rotation_from_pack(pack)
    if rp is not None:
        src = RotatedSource(src, rp)
    ops, untied = ops_of(pack), untied_of(pack)
    return (lambda: Smoothed(SourceWeights(src), ops, hp.norm_offset, untied)) if ops else (lambda: SourceWeights(src))


def _sample_scorer(src, hp, stub, ids):
    """A function of a weight provider: its mean KLD against the source's float model on ``ids``, scored on
    the second half (as --per-tensor)."""
    logits, nxt = _second_half(stub, ids, hp)

    base = _log_softmax64(logits(SourceWeights(src))).astype(np.float32)

    def score(w) -> float:
        st = _Stats()
        _score(base, logits(w), nxt, st)
        return float(np.mean(st.kld))
    return score


def _ranked(acc: dict, kld: dict) -> list[dict]:
    """Items by their single-item KLD; share = its KLD / the sum of all items' single-item KLDs. rel_error is None
    for an item the path never multiplies by (an untied embedding: a row lookup)."""
    rel = {k: (e / s if s > 0 else 0.0) for k, (e, s) in acc.items()}
    tot = sum(kld.values()) or 1.0
    rows = [{"item": k, "kld_alone": kld.get(k, 0.0), "share": kld.get(k, 0.0) / tot, "rel_error": rel.get(k),
             "snr_db": (10 * math.log10(1 / rel[k]) if rel.get(k) else None)} for k in sorted(set(rel) | set(kld))]
    rows.sort(key=lambda r: (-r["kld_alone"], -(r["rel_error"] or 0), r["item"]))
    return rows
