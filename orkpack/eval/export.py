"""``orkpack export PACK -o OUT.gguf``: a pack's weights, as one of its paths computes them, as a GGUF llama.cpp runs.

Every matrix is written as the path reads it (orkpack.eval.weights.PackWeights, the numerics of docs/EVAL.md with
float activations): ``decode`` (the default) takes each slice's CPU weights (a dual-resident slice's host NF4 copy,
an NPU slice without one its int8 image, a host slice as stored); ``prefill`` takes an NPU slice whose ``min_m`` is
at most ``m`` (the chunk length, 512 by default as ``orkpack eval --ctx``) as its int8 image (tiles de-tiled, or an
nf4-stored slice inflated) and every other slice as decode does. Tensors kept float are written F32, the values the
forward pass uses. The embedding rows are the CPU copy on both paths (a row lookup is a CPU operation); where a
tied head's path weights differ from them (prefill of an NPU head with a host copy) the head is written as
``output.weight`` beside ``token_embd.weight``, which llama.cpp then takes as the head.

Key-value pairs: the pack's model record (docs/FORMAT.md 9) as it is, but ``general.file_type`` (the export's
type) and two of orkpack's own (``orkpack.export.path``, ``orkpack.export.prefill_m``). A pack built from a GGUF
holds llama.cpp's layout already; one built from an HF folder is laid out as llama.cpp's converter lays it out
(the converter's rules, orkpack/sources/converter.py, the one copy synth.write_gguf_from_hf uses too: q/k rows
permuted where the converter permutes them, gemma's norm offset, the fused tensors the converter splits split, the
converter's own names; llama3's RoPE factors as ``rope_freqs.weight``).

A cluster folder (``orkpack build --boards ... -o DIR``: DIR or DIR/cluster.json) exports as one model: every node
pack's tensors, node by node, under node 0's record (the client's model file, docs/CLUSTER.md).

The output is written under a temporary name in its folder and renamed when complete; it is never one of the
inputs. The same pack and options give the same bytes.

A pack built with ``--online-hadamard`` (preamble flag bit 0: its runtime rotates each ffn_down input by R4) is
exported with each ffn_down unfolded, ``(W R4) R4^T`` of the path's decoded values (transforms/rotate.py
:func:`unfold_online`): llama.cpp cannot rotate online, and with the float activations it runs, the unfolded matrix
computes what the path does, ``(h R4)(W R4)^T``, to float rounding.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..codecs import get_codec, rows as slice_rows
from ..errors import OrkError, escape_name
from ..files import identity
from ..pack import spec
from ..pack.model import check_model, value
from ..pack.reader import Pack
from ..sources.base import as_float32
from ..transforms.rotate import unfold_online
from .weights import PATHS, PackWeights

TYPES = ("f32", "f16", "bf16")
_FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32}  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_BF16
_RAW_DTYPES = {"i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "f64": np.float64}
_QUANTIZED = spec.QUANT_ENCODINGS


class ExportError(OrkError):
    pass


@dataclass
class ExportResult:
    path: Path
    tensors: int
    bytes: int
    arch: str
    kv: int
    packs: list[str] = field(default_factory=list)
    layout: str = "gguf"  # "gguf": the pack held llama.cpp's layout; "hf": laid out as the converter lays it out
    dropped_keys: list[str] = field(default_factory=list)
    head_untied: bool = False


def _packs_of(path: Path) -> list[Path]:
    """PACK, or the node packs of a cluster folder / cluster.json in node order."""
    p = Path(path)
    if p.is_dir() or p.name == "cluster.json":
        cj = p / "cluster.json" if p.is_dir() else p
        try:
            d = json.loads(cj.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ExportError(f"{escape_name(str(cj))}: no such file; give a pack, or a folder that "
                              "orkpack build --boards wrote") from None
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise ExportError(f"{escape_name(str(cj))}: not a readable cluster.json ({e.__class__.__name__})") from None
        nodes = d.get("nodes") if isinstance(d, dict) and d.get("schema") == "orkpack.cluster" else None
        if not isinstance(nodes, list) or not nodes:
            raise ExportError(f"{escape_name(str(cj))}: not an orkpack cluster file (schema orkpack.cluster)")
        out = []
        for n in nodes:
            name = n.get("pack") if isinstance(n, dict) else None
            if name is None:
                continue  # a node that holds nothing
            if not isinstance(name, str) or Path(name).name != name:
                raise ExportError(f"{escape_name(str(cj))}: a node's pack {escape_name(repr(name))} is not a file name "
                                  "in the folder")
            out.append(cj.parent / name)
        return out
    return [p]


def _layout_of(header: dict, where: str):
    """(kind, the converter's rules or None) of a pack: how its tensors become llama.cpp's (module docstring)."""
    fmt = (header.get("provenance") or {}).get("source_format")
    if fmt == "gguf":
        return "gguf", None
    from .. import archs
    from ..sources import converter, model_facts

    cfg = header.get("config")
    if not isinstance(cfg, dict):
        raise ExportError(f"{where}: the pack records no config.json; llama.cpp needs its hyperparameters")
    if archs.config_family(cfg) is None:  # (model_facts' line advises plan-from-weights: the planner's way out)
        raise ExportError(f"{where}: model_type {escape_name(repr(cfg.get('model_type')), 60)} is not a known "
                          "architecture: its tensor layout and hyperparameter keys for llama.cpp are unknown, so it "
                          "cannot be exported; orkpack verify checks the pack itself")
    try:
        facts = model_facts(cfg)
    except OrkError as e:
        raise ExportError(f"{where}: {e}") from None
    fam = archs.FAMILIES.get(facts["arch"])
    if fam is None:
        raise ExportError(f"{where}: architecture {escape_name(str(facts['arch']))} has no orkpack family; its layout "
                          "for llama.cpp is unknown")
    return "hf", converter.rules(fam, facts)


def _kv_entries(model: dict, arch: str):
    """(entries to write, keys dropped): the record less what the writer sets itself and nested arrays."""
    keep, dropped = [], []
    for e in model["kv"]:
        key, typ = e[0], e[1]
        if key in ("general.architecture", "general.file_type") or key.startswith("orkpack.export."):
            continue
        if typ.startswith("array[array["):
            dropped.append(key)  # gguf-py writes no nested arrays; none of llama.cpp's keys is one
            continue
        keep.append(e)
    return keep, dropped


class _Tensor:
    """One GGUF tensor to write: name, numpy shape, its GGML type and a function that gives its array."""

    def __init__(self, name, shape, qtype, make):
        self.name, self.shape, self.qtype, self.make = name, tuple(int(x) for x in shape), qtype, make


def _slice_values(pk: Pack, pw: PackWeights, s: dict, name: str, expert) -> np.ndarray:
    """The float32 values a path's matmul (or lookup) reads of one slice."""
    if len(s["shape"]) == 2 and s["encoding"] != spec.ENC_RAW:
        if pw.engine(name, expert) == "npu":
            q, scale = slice_rows.int8_image(pk, s)
            return q.astype(np.float32) * scale[:, None]
        fn, _ = slice_rows.cpu_rows(pk, s)
        if fn is None:
            raise ExportError(f"{escape_name(name)}: a {s['encoding']} slice where llama.cpp needs weights")
        return as_float32(fn(0, s["shape"][0]))
    return as_float32(get_codec(s["encoding"]).decode(pk.typed_parts(s), s["shape"], s["layout"]))


def _embed_values(pk: Pack, s: dict) -> np.ndarray:
    fn, _ = slice_rows.cpu_rows(pk, s)
    return as_float32(fn(0, s["shape"][0]))


def _plan_tensors(pk: Pack, path: str, m: int, qtype_of, conv, tied_head: bool):
    """The _Tensors of one pack, in its order (a stacked tensor from its expert slices)."""
    import gguf

    Q = gguf.GGMLQuantizationType
    pw = PackWeights(pk, path, m=m)
    out, untied = [], False
    for t in pk.tensors:
        sl = sorted(t["slices"], key=lambda s: -1 if s["expert"] is None else s["expert"])
        name, shape = t["name"], tuple(t["shape"])
        if sl[0]["encoding"] == spec.ENC_RAW:
            dt = _RAW_DTYPES.get(sl[0].get("dtype") or t.get("source_dtype", "").lower())
            if dt is None:
                raise ExportError(f"{escape_name(name)}: a raw {escape_name(str(t.get('source_dtype')))} tensor; GGUF "
                                  "holds integers I8-I64 and F64 only")
            s0 = sl[0]
            out.append(_Tensor(name, shape, {np.int8: Q.I8, np.int16: Q.I16, np.int32: Q.I32, np.int64: Q.I64,
                                              np.float64: Q.F64}[dt],
                               lambda s0=s0, dt=dt, shape=shape: np.frombuffer(
                                   pk.part(s0["parts"]["data"]).tobytes(), dtype=dt).reshape(shape)))
            continue
        quantized = any(s["encoding"] in _QUANTIZED for s in sl)
        q = qtype_of(quantized)

        def make(t=t, sl=sl, shape=shape, name=name):
            if len(sl) == 1 and sl[0]["expert"] is None:
                return unfold_online(pw.r4, name, _slice_values(pk, pw, sl[0], name, None))
            a = np.empty(shape, dtype=np.float32)
            for s in sl:
                a[s["expert"]] = unfold_online(pw.r4, name, _slice_values(pk, pw, s, name, s["expert"]))
            return a

        if name == "token_embd.weight" and tied_head and len(sl) == 1 and len(shape) == 2:
            s = sl[0]
            if pw.engine(name) == "npu" and "host_copy" in s:
                # the path's head (the NPU's int8 image) is not the rows the lookup reads (the host copy): both
                untied = True
                out.append(_Tensor(name, shape, q, lambda s=s: _embed_values(pk, s)))
                out.append(_Tensor("output.weight", shape, q, make))
                continue
            make = (lambda s=s: _embed_values(pk, s)) if pw.engine(name) == "cpu" else make
        if conv is None:
            out.append(_Tensor(name, shape, q, make))
            continue
        for gname, gshape, part in conv.tensors(name, shape):
            out.append(_Tensor(gname, gshape, q, lambda make=make, part=part: as_float32(part(make()))))
    return out, untied


def _cast(a: np.ndarray, qtype):
    import gguf

    Q = gguf.GGMLQuantizationType
    if qtype == Q.F32:
        return np.ascontiguousarray(a, dtype=np.float32)
    if qtype == Q.F16:
        return np.ascontiguousarray(a.astype(np.float16))
    if qtype == Q.BF16:
        return gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), Q.BF16).view(np.uint16).reshape(a.shape)
    return np.ascontiguousarray(a)


def export(source: Path, out: Path, *, path: str = "decode", dtype: str = "f32", m: int = 512) -> ExportResult:
    """Write the GGUF (module docstring). ``source``: a pack, or a cluster folder / its cluster.json."""
    import gguf

    if path not in PATHS:
        raise ExportError(f"--path {path!r}: choose one of {', '.join(PATHS)}")
    if dtype not in TYPES:
        raise ExportError(f"--type {dtype!r}: choose one of {', '.join(TYPES)}")
    if m < 1:
        raise ExportError(f"--prefill-m {m}: must be at least 1")
    out = Path(out)
    packs = _packs_of(Path(source))
    target = identity(out)
    if out.is_dir():
        raise ExportError(f"{escape_name(str(out))}: is a folder; -o names the GGUF file to write")
    inputs = packs + ([Path(source) / "cluster.json"] if Path(source).is_dir() else [Path(source)])
    if target is not None and any(identity(p) == target for p in inputs):
        raise ExportError(f"{escape_name(str(out))}: is one of the inputs; the export would replace it; give another "
                          "output path")
    if not out.parent.is_dir():
        raise ExportError(f"{escape_name(str(out))}: folder {escape_name(str(out.parent))} does not exist; create it first")
    Q = gguf.GGMLQuantizationType
    big = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16}[dtype]

    def qtype_of(quantized: bool):
        return big if quantized else Q.F32

    opened: list[Pack] = []
    tmp = None
    try:
        for p in packs:
            try:
                opened.append(Pack.open(p))
            except FileNotFoundError:
                raise ExportError(f"{escape_name(str(p))}: no such pack") from None
        first = opened[0]
        where = escape_name(str(first.path))
        model = first.header.get("model")
        why = check_model(model) if model is not None else None
        if model is None or why:
            raise ExportError(f"{where}: the pack's model record is {'missing' if model is None else why}; llama.cpp "
                              "needs the hyperparameters and tokenizer it holds (rebuild the pack from a GGUF, or from "
                              "an HF folder with its config.json and tokenizer files)")
        kv = {e[0]: e for e in model["kv"]}
        arch = value(kv["general.architecture"]) if "general.architecture" in kv else None
        if not isinstance(arch, str):
            raise ExportError(f"{where}: the model record has no general.architecture")
        for pk in opened[1:]:
            if pk.header.get("model") != model:
                raise ExportError(f"{escape_name(str(pk.path))}: its model record is not node 0's; these packs are "
                                  "not one model")
        kind, conv = _layout_of(first.header, where)
        names = [t["name"] for pk in opened for t in pk.tensors]
        tied_head = "output.weight" not in names
        tensors, untied = [], False
        for pk in opened:
            ts, u = _plan_tensors(pk, path, m, qtype_of, conv, tied_head)
            tensors += ts
            untied |= u
        if kind == "hf":
            from ..model.hparams import from_config, rope_factors

            rf = rope_factors(from_config(first.header["config"]))
            if rf is not None and "rope_freqs.weight" not in names:
                tensors.append(_Tensor("rope_freqs.weight", rf.shape, Q.F32, lambda rf=rf: as_float32(rf)))
        seen = set()
        for t in tensors:
            if t.name in seen:
                raise ExportError(f"{escape_name(t.name)}: held twice (two packs of one cluster hold it)")
            seen.add(t.name)
        entries, dropped = _kv_entries(model, arch)

        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.{os.getpid()}.", suffix=".export-partial", dir=out.parent)
        os.close(fd)
        w = gguf.GGUFWriter(tmp, arch)
        vt = {t.name.lower(): t for t in gguf.GGUFValueType}
        for key, typ, _ in entries:
            v = value(kv[key])
            if typ.startswith("array["):
                w.add_key_value(key, v, gguf.GGUFValueType.ARRAY, sub_type=vt[typ[6:-1]])
            else:
                w.add_key_value(key, v, vt[typ])
        w.add_file_type(_FILE_TYPE[dtype])
        w.add_string("orkpack.export.path", path)
        if path == "prefill":
            w.add_uint32("orkpack.export.prefill_m", int(m))
        total = 0
        for t in tensors:
            n = int(np.prod(t.shape)) if t.shape else 1
            if t.qtype in (Q.F16, Q.BF16):
                nbytes, dt = 2 * n, np.dtype(np.float16) if t.qtype == Q.F16 else np.dtype(np.uint16)
            else:
                dt = {Q.F32: np.float32, Q.I8: np.int8, Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64,
                      Q.F64: np.float64}[t.qtype]
                nbytes, dt = n * np.dtype(dt).itemsize, np.dtype(dt)
            w.add_tensor_info(t.name, t.shape, dt, nbytes, raw_dtype=t.qtype if t.qtype == Q.BF16 else None)
            total += nbytes
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in tensors:
            a = _cast(t.make(), t.qtype)
            if a.shape != t.shape:
                raise ExportError(f"{escape_name(t.name)}: read as {list(a.shape)}, recorded {list(t.shape)}; the pack "
                                  "is not consistent")
            w.write_tensor_data(a)
        w.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
        tmp = None
        return ExportResult(out, len(tensors), total, arch, len(entries) + 2, [str(p) for p in packs], kind, dropped,
                            untied)
    except OSError as e:
        raise ExportError(f"{escape_name(str(out))}: cannot write the export ({e.__class__.__name__}: "
                          f"{escape_name(str(e.strerror or e))})") from None
    finally:
        for pk in opened:
            pk.close()
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
