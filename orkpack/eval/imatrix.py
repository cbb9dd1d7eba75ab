"""Activation statistics of a model's matrix products: llama.cpp's importance matrix, and per-column maxima.

``orkpack imatrix SOURCE -o stats.gguf`` runs the source's float model (orkpack.model.forward) on a
text, tokenized and chunked as ``orkpack eval`` does (docs/EVAL.md), and records for every matrix
product ``x @ W.T`` (canonical GGUF names, ``blk.3.attn_q.weight``; the output head; each expert of
a stacked ``*_exps`` tensor on its own row) and every input column ``k``:

* ``sum2[k]``: the sum over the tokens that reached it of ``x[:, k]**2`` (float64 while gathered),
* ``absmax[k]``: the largest ``|x[:, k]|``,
* ``count``: those tokens.

``sum2 / count`` is what llama.cpp calls the importance matrix (tools/imatrix/imatrix.cpp gathers the
same sums of squares; tools/quantize/quantize.cpp divides by the count). The file is llama.cpp's GGUF
imatrix format, so ``llama-quantize --imatrix`` reads it and orkpack reads llama.cpp's:

* KV ``general.type = "imatrix"``, ``imatrix.datasets`` (array of strings), ``imatrix.chunk_count``
  and ``imatrix.chunk_size`` (u32);
* per matrix, ``<name>.in_sum2``: F32, ne0 = K, ne1 = matrices (1, or the experts) and
  ``<name>.counts``: F32, ne0 = 1, ne1 = matrices;
* orkpack's own ``<name>.in_absmax``: F32 like ``in_sum2``. llama.cpp's loader keeps only the tensors
  named ``*.in_sum2`` and ``*.counts`` and ignores it; a llama.cpp file has none (``absmax`` is None).

llama.cpp's legacy ``.dat`` files load too (no per-expert counts and no maxima: the sums come flat,
divided back by their call count as llama-quantize does).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import escape_name
from ..model.weights import Wrapped
from .weights import EvalError


@dataclass
class Entry:
    """One matrix's statistics: ``sum2`` and ``absmax`` are [matrices, K], ``counts`` [matrices]."""

    sum2: np.ndarray
    counts: np.ndarray
    absmax: np.ndarray | None = None

    def row(self, a: np.ndarray, expert: int | None, k: int | None) -> np.ndarray | None:
        if a.shape[0] == 1 and expert is not None and k is not None and a.shape[1] % k == 0 and a.shape[1] > k:
            a = a.reshape(-1, k)  # a legacy file's flat per-expert sums
        e = 0 if expert is None else expert
        if e >= a.shape[0] or (k is not None and a.shape[1] != k):
            return None
        return a[e]


class ActStats:
    """Statistics per matrix name (see the module docstring)."""

    def __init__(self, entries: dict[str, Entry] | None = None, *, datasets: list[str] | None = None,
                 chunk_count: int = 0, chunk_size: int = 0, legacy: bool = False):
        self.entries = entries if entries is not None else {}
        self.datasets = datasets or []
        self.chunk_count, self.chunk_size, self.legacy = chunk_count, chunk_size, legacy

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def mean_sq(self, name: str, expert: int | None = None, k: int | None = None) -> np.ndarray | None:
        """The importance ``sum2 / count`` of each input column (float32), or None when the matrix (or the
        expert) saw no token or the file does not hold it; ``k``, when given, must match its width."""
        e = self.entries.get(name)
        if e is None:
            return None
        s = e.row(e.sum2, expert, k)
        if s is None:
            return None
        c = e.counts[0] if e.counts.shape[0] == 1 else (e.counts[expert or 0] if (expert or 0) < e.counts.shape[0]
                                                          else 0)
        if c <= 0:
            return None
        return (s / np.float64(c)).astype(np.float32)

    def absmax(self, name: str, expert: int | None = None, k: int | None = None) -> np.ndarray | None:
        """The largest ``|x|`` of each input column (float32), or None (no maxima in the file, or no token)."""
        e = self.entries.get(name)
        if e is None or e.absmax is None:
            return None
        c = e.counts[expert or 0] if (expert or 0) < e.counts.shape[0] else 0
        if c <= 0:
            return None
        return e.row(e.absmax, expert, k)


class Collector(Wrapped):
    """Wraps a weight provider; every ``matmul`` adds its input's column statistics to ``acc``.

    ``acc[(name, expert)]`` is ``[sum2 float64 [K], absmax float32 [K], rows, output energy]``; the
    output energy ``sum |y|^2`` is gathered only when ``output_energy`` (the sensitivity estimate uses it)."""

    def __init__(self, inner, acc: dict, *, output_energy: bool = False):
        super().__init__(inner)
        self.acc, self.output_energy = acc, output_energy

    def matmul(self, name, x, expert=None):
        y = self.inner.matmul(name, x, expert)
        a = self.acc.get((name, expert))
        if a is None:
            a = self.acc[(name, expert)] = [np.zeros(x.shape[1]), np.zeros(x.shape[1], dtype=np.float32), 0, 0.0]
        x64 = x.astype(np.float64)
        a[0] += (x64 * x64).sum(axis=0)
        if x.shape[0]:
            np.maximum(a[1], np.abs(x).max(axis=0), out=a[1])
        a[2] += x.shape[0]
        if self.output_energy:
            a[3] += float((y.astype(np.float64) ** 2).sum())
        return y


def from_acc(acc: dict, experts: dict[str, int], **meta) -> ActStats:
    """The gathered ``acc`` of a :class:`Collector` as ActStats; ``experts[name]``: a stacked tensor's
    expert count (its rows; an expert no token reached keeps count 0 and zero sums)."""
    entries: dict[str, Entry] = {}
    names = sorted({n for n, _ in acc})
    for n in names:
        keys = [e for m, e in acc if m == n]
        k = acc[(n, keys[0])][0].shape[0]
        nmat = experts.get(n, 1) if any(e is not None for e in keys) else 1
        s2, am, cnt = np.zeros((nmat, k)), np.zeros((nmat, k), dtype=np.float32), np.zeros(nmat)
        for e in keys:
            a = acc[(n, e)]
            r = 0 if e is None else e
            s2[r], am[r], cnt[r] = a[0], a[1], a[2]
        entries[n] = Entry(s2, cnt, am)
    return ActStats(entries, **meta)


def gather(source: Path, output: Path, **kw) -> ActStats:
    """``orkpack imatrix``: :func:`collect` then :func:`save` to ``output``, which must not be one of the
    inputs (the source's files, the text)."""
    from ..build import _identity
    from ..sources import open_source

    target = _identity(Path(output))
    if target is not None:
        src = open_source(source, on_warning=lambda m: None)
        try:
            files = [Path(f) for f in src.files] + ([Path(source)] if Path(source).is_file() else [])
        finally:
            src.close()
        files += [Path(kw[k]) for k in ("text", "tokens") if kw.get(k) is not None]
        if any(_identity(f) == target for f in files):
            raise EvalError(f"{escape_name(str(output))}: is one of the inputs; the statistics would replace it; "
                            "give another output path")
    stats = collect(source, **kw)
    save(stats, output)
    return stats


def collect(source: Path, *, text: Path | None = None, tokens: Path | None = None, ctx: int = 512, chunks: int = 0,
            threads: int = 1, progress: Callable[[float, float, str], None] | None = None) -> ActStats:
    """Run the float model of ``source`` on the text and gather its statistics (module docstring)."""
    from threadpoolctl import threadpool_limits

    from ..model import forward
    from ..model.weights import SourceWeights
    from ..sources import open_source
    from .run import PROSE, _source_record, token_ids

    if ctx < 2:
        raise EvalError(f"--ctx {ctx}: give a chunk length of at least 2 tokens")
    if chunks < 0:
        raise EvalError(f"--chunks {chunks}: give 0 (all) or a positive count")
    src = open_source(source, on_warning=lambda m: None)
    try:
        hp = forward.model_hparams(src)
        ids, bos, where = token_ids(text, tokens, _source_record(src), hp.vocab, escape_name(str(source)))
        n = ids.size // ctx
        if n == 0:
            raise EvalError(f"{where}: {ids.size} tokens, fewer than one chunk of --ctx {ctx}; give a longer text or "
                            "a smaller --ctx")
        n = min(n, chunks) if chunks else n
        experts = {t.name: t.shape[0] for t in src.tensors() if len(t.shape) == 3}
        acc: dict = {}
        per = hp.n_layers + -(-ctx // 128)
        with threadpool_limits(limits=threads or None, user_api="blas"):
            for c in range(n):
                chunk = ids[c * ctx: (c + 1) * ctx].copy()
                if bos is not None:
                    chunk[0] = bos

                def prog(d, t, c=c):
                    if progress:
                        progress(c * per + d, n * per, f"chunk {c + 1}/{n}")

                forward.run(src, chunk, weights=Collector(SourceWeights(src), acc), hp=hp,
                            on_logits=lambda t0, lg: None, progress=prog, chunk=128)
        dataset = Path(tokens).name if tokens is not None else Path(text or PROSE).name
        return from_acc(acc, experts, datasets=[dataset], chunk_count=n, chunk_size=ctx)
    finally:
        src.close()


# ------------------------------------------------------------------------------------------- files

def save(stats: ActStats, path: Path) -> None:
    """Write ``stats`` as a GGUF imatrix (module docstring), whole or not at all."""
    import gguf

    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch="imatrix")
    try:
        w.add_type("imatrix")
        w.add_array("imatrix.datasets", list(stats.datasets))
        w.add_uint32("imatrix.chunk_count", int(stats.chunk_count))
        w.add_uint32("imatrix.chunk_size", int(stats.chunk_size))
        for name in sorted(stats.entries):
            e = stats.entries[name]
            w.add_tensor(f"{name}.in_sum2", np.ascontiguousarray(e.sum2, dtype=np.float32))
            w.add_tensor(f"{name}.counts", np.ascontiguousarray(e.counts.reshape(-1, 1), dtype=np.float32))
            if e.absmax is not None:
                w.add_tensor(f"{name}.in_absmax", np.ascontiguousarray(e.absmax, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, p)
    except OSError as e:
        w.close()
        tmp.unlink(missing_ok=True)
        raise EvalError(f"{escape_name(str(p))}: cannot write the statistics ({e.__class__.__name__})") from None


def load(path: Path) -> ActStats:
    """Read a GGUF imatrix (orkpack's or llama.cpp's) or llama.cpp's legacy ``.dat``."""
    p = Path(path)
    where = escape_name(str(p))
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise EvalError(f"{where}: cannot read the statistics ({e.__class__.__name__}); give a file written by "
                        "orkpack imatrix or llama-imatrix") from None
    try:
        return _load_gguf(p) if magic == b"GGUF" else _load_legacy(p)
    except EvalError:
        raise
    except Exception as e:  # noqa: BLE001 - any parse failure of a hostile file is one line
        raise EvalError(f"{where}: not an imatrix file ({e.__class__.__name__}); give a file written by "
                        "orkpack imatrix or llama-imatrix") from None


def _load_gguf(p: Path) -> ActStats:
    import gguf

    where = escape_name(str(p))
    r = gguf.GGUFReader(str(p))
    kv = {f.name: f for f in r.fields.values()}

    def u32(key):
        f = kv.get(key)
        return int(f.parts[f.data[0]][0]) if f is not None and f.data else 0

    datasets = []
    f = kv.get("imatrix.datasets")
    if f is not None:
        datasets = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
    parts: dict[str, dict[str, np.ndarray]] = {}
    for t in r.tensors:
        for sfx in ("in_sum2", "counts", "in_absmax"):
            if t.name.endswith("." + sfx):
                if t.tensor_type != gguf.GGMLQuantizationType.F32:
                    raise EvalError(f"{where}: {escape_name(t.name)} is {t.tensor_type.name}, not F32; not an imatrix")
                ne = [int(x) for x in t.shape]  # ne0 first
                a = np.asarray(t.data, dtype=np.float32).reshape(-1)
                ne1 = ne[1] if len(ne) > 1 else 1
                parts.setdefault(t.name[: -len(sfx) - 1], {})[sfx] = a.reshape(ne1, -1)
    if not parts:
        raise EvalError(f"{where}: a GGUF without imatrix tensors (*.in_sum2); give a file written by orkpack "
                        "imatrix or llama-imatrix")
    entries = {}
    for name, d in parts.items():
        if "in_sum2" not in d or "counts" not in d:
            raise EvalError(f"{where}: {escape_name(name)} has {'no counts' if 'counts' in d or 'in_sum2' in d else 'no sums'}; "
                            "the file is incomplete")
        s2, cnt = d["in_sum2"].astype(np.float64), d["counts"].reshape(-1).astype(np.float64)
        am = d.get("in_absmax")
        if cnt.shape[0] != s2.shape[0] or (am is not None and am.shape != s2.shape):
            raise EvalError(f"{where}: {escape_name(name)}: sums, counts and maxima disagree in shape; the file is damaged")
        if not (np.isfinite(s2).all() and np.isfinite(cnt).all()) or (s2 < 0).any() or (cnt < 0).any():
            raise EvalError(f"{where}: {escape_name(name)} holds negative or non-finite statistics; the file is damaged")
        entries[name] = Entry(s2, cnt, am)
    return ActStats(entries, datasets=datasets, chunk_count=u32("imatrix.chunk_count"),
                    chunk_size=u32("imatrix.chunk_size"))


def _load_legacy(p: Path) -> ActStats:
    """llama.cpp's ``.dat``: n_entries (i32); per entry: name length (i32), name, ncall (i32), nval (i32),
    nval f32 (sums scaled to ncall calls); then optionally the chunk count (i32) and the dataset name."""
    where = escape_name(str(p))
    b = p.read_bytes()
    off = 0

    def take(fmt):
        nonlocal off
        n = struct.calcsize(fmt)
        if off + n > len(b):
            raise EvalError(f"{where}: truncated; not an imatrix file (GGUF or llama.cpp's legacy .dat)")
        v = struct.unpack_from(fmt, b, off)
        off += n
        return v

    (n_entries,) = take("<i")
    if n_entries < 1 or n_entries > 1 << 20:
        raise EvalError(f"{where}: not an imatrix file (GGUF or llama.cpp's legacy .dat)")
    entries = {}
    for _ in range(n_entries):
        (ln,) = take("<i")
        if ln <= 0 or ln > 4096:
            raise EvalError(f"{where}: not an imatrix file (GGUF or llama.cpp's legacy .dat)")
        name = take(f"<{ln}s")[0].decode("utf-8", "replace")
        ncall, nval = take("<ii")
        if nval <= 0 or ncall < 0 or off + 4 * nval > len(b):
            raise EvalError(f"{where}: {escape_name(name)}: truncated or damaged entry")
        vals = np.frombuffer(b, dtype="<f4", count=nval, offset=off).astype(np.float64)
        off += 4 * nval
        if not np.isfinite(vals).all() or (vals < 0).any():
            raise EvalError(f"{where}: {escape_name(name)} holds negative or non-finite statistics; the file is damaged")
        entries[name] = Entry(vals.reshape(1, -1), np.array([float(max(ncall, 0))]), None)
        if ncall == 0:  # llama-quantize uses the values as they are
            entries[name].counts[0] = 1.0
    chunks, dataset = 0, []
    if off + 4 <= len(b):
        (chunks,) = take("<i")
        if off + 4 <= len(b):
            (ln,) = take("<i")
            if 0 < ln <= len(b) - off:
                dataset = [b[off: off + ln].decode("utf-8", "replace")]
    return ActStats(entries, datasets=dataset, chunk_count=max(chunks, 0), legacy=True)
