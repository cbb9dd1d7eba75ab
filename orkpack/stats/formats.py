"""The statistics files: llama.cpp's GGUF imatrix (with orkpack's ``in_absmax`` maxima beside ``in_sum2``) and its
legacy ``.dat`` (the layouts: :mod:`orkpack.stats`)."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from ..errors import escape_name
from .data import ActStats, Entry, StatsError


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
        raise StatsError(f"{escape_name(str(p))}: cannot write the statistics ({e.__class__.__name__})") from None


def load(path: Path) -> ActStats:
    """Read a GGUF imatrix (orkpack's or llama.cpp's) or llama.cpp's legacy ``.dat``."""
    p = Path(path)
    where = escape_name(str(p))
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise StatsError(f"{where}: cannot read the statistics ({e.__class__.__name__}); give a file written by "
                        "orkpack imatrix or llama-imatrix") from None
    try:
        return _load_gguf(p) if magic == b"GGUF" else _load_legacy(p)
    except StatsError:
        raise
    except Exception as e:  # noqa: BLE001 - any parse failure of a hostile file is one line
        raise StatsError(f"{where}: not an imatrix file ({e.__class__.__name__}); give a file written by "
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
                    raise StatsError(f"{where}: {escape_name(t.name)} is {t.tensor_type.name}, not F32; not an imatrix")
                ne = [int(x) for x in t.shape]  # ne0 first
                a = np.asarray(t.data, dtype=np.float32).reshape(-1)
                ne1 = ne[1] if len(ne) > 1 else 1
                parts.setdefault(t.name[: -len(sfx) - 1], {})[sfx] = a.reshape(ne1, -1)
    if not parts:
        raise StatsError(f"{where}: a GGUF without imatrix tensors (*.in_sum2); give a file written by orkpack "
                        "imatrix or llama-imatrix")
    entries = {}
    for name, d in parts.items():
        if "in_sum2" not in d or "counts" not in d:
            raise StatsError(f"{where}: {escape_name(name)} has {'no counts' if 'counts' in d or 'in_sum2' in d else 'no sums'}; "
                            "the file is incomplete")
        s2, cnt = d["in_sum2"].astype(np.float64), d["counts"].reshape(-1).astype(np.float64)
        am = d.get("in_absmax")
        if cnt.shape[0] != s2.shape[0] or (am is not None and am.shape != s2.shape):
            raise StatsError(f"{where}: {escape_name(name)}: sums, counts and maxima disagree in shape; the file is damaged")
        if not (np.isfinite(s2).all() and np.isfinite(cnt).all()) or (s2 < 0).any() or (cnt < 0).any():
            raise StatsError(f"{where}: {escape_name(name)} holds negative or non-finite statistics; the file is damaged")
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
            raise StatsError(f"{where}: truncated; not an imatrix file (GGUF or llama.cpp's legacy .dat)")
        v = struct.unpack_from(fmt, b, off)
        off += n
        return v

    (n_entries,) = take("<i")
    if n_entries < 1 or n_entries > 1 << 20:
        raise StatsError(f"{where}: not an imatrix file (GGUF or llama.cpp's legacy .dat)")
    entries = {}
    for _ in range(n_entries):
        (ln,) = take("<i")
        if ln <= 0 or ln > 4096:
            raise StatsError(f"{where}: not an imatrix file (GGUF or llama.cpp's legacy .dat)")
        name = take(f"<{ln}s")[0].decode("utf-8", "replace")
        ncall, nval = take("<ii")
        if nval <= 0 or ncall < 0 or off + 4 * nval > len(b):
            raise StatsError(f"{where}: {escape_name(name)}: truncated or damaged entry")
        vals = np.frombuffer(b, dtype="<f4", count=nval, offset=off).astype(np.float64)
        off += 4 * nval
        if not np.isfinite(vals).all() or (vals < 0).any():
            raise StatsError(f"{where}: {escape_name(name)} holds negative or non-finite statistics; the file is damaged")
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
