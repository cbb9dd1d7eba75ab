"""Safetensors reader: one file, or the shards of an HF folder, one tensor at a time.

Format: 8-byte little-endian header length n, n bytes of JSON
(``{name: {dtype, shape, data_offsets: [a, b]}}`` plus optional
``__metadata__``), then the data; offsets are relative to the end of the header.
The header is validated before any tensor is read: n against the file size and
a 100 MB cap, every byte range inside the data section, and ``b - a`` equal to
numel x itemsize of the dtype.

Exactness: F32 and F16 come back as float32 / float16 arrays of the stored bits;
BF16 comes back as the raw 16 bits in a uint16 array (``base.as_float32`` widens
exactly). No torch, no ml_dtypes. BOOL, U8-U64, I8-I64, F64 and C64 come back as
numpy arrays of their own type, bytes as stored (a build carries them raw).
Quantized releases (FP8 weights with their scales, gpt-oss MXFP4 blocks and
scales) are listed under the weight's name with the source dtype (F8_E4M3, ...,
MXFP4) and read as float32, dequantized exactly: orkpack/sources/quantized.py.

A fused tensor llama.cpp's converter writes as several (a family's ``archs.Split``: Granite-4.0-H's gate/up,
Qwen3-Next's ``in_proj_qkvz`` -> ``attn_qkv`` + ``attn_gate``) is listed as those tensors, each with the HF name as
its ``source_name`` and, as its parts, the byte ranges of its elements in the stored tensor (read in order, like an
expert stack: the stored bits, never mapped).

Derivable buffers (``position_ids``, ``rotary_emb.inv_freq``, GPT-2 causal
masks; the table is :mod:`orkpack.sources.derivable`) are left out of
``tensors()`` and listed by ``skipped()`` instead, from the header alone.

Experts: per-expert HF tensors (``model.layers.N.mlp.experts.E.gate_proj.weight``,
mixtral ``block_sparse_moe.experts.E.w1``) are listed once per layer and
projection under the stacked GGUF name ``blk.N.ffn_gate_exps.weight`` with numpy
shape ``(E, N_out, K_in)``, as a GGUF of the same model has it; ``read`` copies
each expert straight into its slice. Its ``TensorInfo.source_name`` is the HF
name with ``*`` for the expert index, ``file`` the shard of expert 0 (or the
distinct shards joined by ``,``), ``nbytes`` the sum.

Memory bound: ``read`` maps nothing; it allocates the returned array and
fills it with ``os.preadv`` (no intermediate copy). The page cache is left
alone: it is not the process's memory, and users convert the same files
repeatedly (a warm cache is the common case). Peak RSS of
a caller that reads every tensor in turn and drops each one is therefore
the largest tensor's bytes (plus the headers), whatever the model size; the
test holds it to 3 x largest tensor + 64 MB.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from .. import archs
from ..errors import SourceError, escape_name
from ..pack import spec
from .base import RAW_DTYPES, FileSource, TensorInfo, array_in, map_array
from .derivable import split_derivable
from . import convlayout, quantized
from .names import canonical_name, hf_expert, natural_key

HEADER_CAP = 100 * 1024 * 1024
# Caps on what a header may declare, checked before anything is sized from it.
MAX_NAME_BYTES = 4096  # a tensor name (real ones are < 200)
MAX_DIMS = 8  # numpy allows 64; checkpoints use <= 4
MAX_ELEMENTS = 1 << 56  # product of the non-zero dims (numpy refuses > 2**63 bytes even for an empty array)
MAX_LAYERS = 4096  # num_hidden_layers / layer index in a name (real models: <= 200)
# Float weights (quantized or kept float), then the types carried raw (base.RAW_DTYPES: bool, integers,
# F64, C64). Hook for quantized releases: F8_E4M3, F8_E5M2, F8_E8M0, the FNUZ fp8s, F4 and F6 are not
# here; orkpack/sources/quantized.py adds the FP8 and E8M0 ones below (dequantized on read) and refuses F4/F6.
FLOAT_DTYPES = ("F32", "F16", "BF16")
_NP_DTYPE = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
             **{k: np.dtype(spec.RAW_DTYPES[v]) for k, v in RAW_DTYPES.items()}}
SUPPORTED_DTYPES = FLOAT_DTYPES + tuple(RAW_DTYPES)
_NP_DTYPE.update({k: np.dtype("u1") for k in quantized.STORAGE_DTYPES})
SUPPORTED_DTYPES += quantized.STORAGE_DTYPES


def _fname(p: Path | str) -> str:
    return escape_name(str(p))


def read_into(fd: int, offset: int, dest: memoryview, path: Path) -> None:
    """Fill ``dest`` from ``fd`` at ``offset`` (positional, thread-safe)."""
    n, got = dest.nbytes, 0
    dest = dest.cast("B")
    while got < n:
        k = os.preadv(fd, [dest[got:]], offset + got) if hasattr(os, "preadv") else _pread_fallback(fd, dest[got:], offset + got)
        if k <= 0:
            raise SourceError(f"{_fname(path)}: file ends at byte {offset + got}, before the data it declares "
                              "(truncated?); download it again")
        got += k


def _pread_fallback(fd: int, dest: memoryview, offset: int) -> int:
    b = os.pread(fd, dest.nbytes, offset)
    dest[: len(b)] = b
    return len(b)


@dataclass(frozen=True)
class _Part:
    file: int  # index into files
    offset: int  # absolute byte offset
    nbytes: int


@dataclass
class _Entry:
    info: TensorInfo
    parts: list[_Part]  # one part, or one per expert (stacked)


def parse_header(path: Path, fd: int, size: int) -> tuple[dict, int]:
    """(tensor table without __metadata__, absolute offset of the data section); validated."""
    name = _fname(path)
    if size < 8:
        raise SourceError(f"{name}: {size} bytes is too short for a safetensors file (truncated?); download it again")
    (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if n < 2 or n > HEADER_CAP or n > size - 8:
        raise SourceError(f"{name}: header length {n} does not fit the file ({size} bytes, cap {HEADER_CAP}); "
                          "not a safetensors file or truncated; download it again")
    raw = os.pread(fd, n, 8)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SourceError(f"{name}: header is not valid JSON; not a safetensors file or damaged; download it again") from None
    if not isinstance(header, dict):
        raise SourceError(f"{name}: header is not a JSON object; not a safetensors file; download it again")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    for t, e in header.items():
        tn = f"{name}: tensor {escape_name(t)}"
        if len(t.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise SourceError(f"{tn}: name is over {MAX_NAME_BYTES} bytes; the file is damaged or not a checkpoint")
        if not isinstance(e, dict):
            raise SourceError(f"{tn}: header entry is not an object; the file is damaged; download it again")
        dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dtype, str):
            raise SourceError(f"{tn}: no dtype in the header; the file is damaged; download it again")
        if dtype in quantized.REFUSED_DTYPES:  # F4, F6: sub-byte floats of no scheme orkpack reads
            raise SourceError(f"{tn}: {quantized.REFUSED_DTYPES[dtype]} is not supported; {quantized.DEQUANTIZE_FIRST}")
        if dtype not in SUPPORTED_DTYPES:
            raise SourceError(f"{tn}: dtype {escape_name(dtype)} is not supported; supported: "
                              f"{', '.join(SUPPORTED_DTYPES)} (convert the checkpoint to one of them)")
        if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise SourceError(f"{tn}: bad shape {escape_name(str(shape), 80)}; the file is damaged; download it again")
        if len(shape) > MAX_DIMS or math.prod(max(d, 1) for d in shape) > MAX_ELEMENTS:
            raise SourceError(f"{tn}: shape {escape_name(str(shape), 80)} is too large; the file is damaged; download it again")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise SourceError(f"{tn}: bad data_offsets; the file is damaged; download it again")
        a, b = offs
        if not 0 <= a <= b <= data_len:
            raise SourceError(f"{tn}: bytes {a}..{b} lie outside the data section ({data_len} bytes); "
                              "the file is truncated or damaged; download it again")
        want = math.prod(shape) * _NP_DTYPE[dtype].itemsize
        if b - a != want:
            raise SourceError(f"{tn}: {b - a} bytes do not hold {dtype} {tuple(shape)} ({want} bytes); "
                              "the file is damaged; download it again")
    return header, 8 + n


def guess_arch(names: list[str]) -> tuple[str, int]:
    """(arch, n_layers) from HF tensor names alone, for a file without config.json."""
    layers = [int(m.group(1)) for n in names if (m := re.match(r"(?:model\.)?layers\.(\d+)\.", n))]
    n_layers = max(layers) + 1 if layers else 0
    joined = "\n".join(names)
    if ".block_sparse_moe." in joined:
        arch = "mixtral"
    elif ".mlp.experts." in joined:
        arch = "qwen3_moe"
    elif ".self_attn.q_norm." in joined:
        arch = "qwen3"
    elif ".self_attn.q_proj.bias" in joined:
        arch = "qwen2"
    else:
        arch = "llama"
    return arch, n_layers


class SafetensorsSource(FileSource):
    """A single .safetensors file or the shards of an HF folder (see module docstring)."""

    kind = "safetensors"

    def __init__(self, root: Path, files: list[Path], config: dict | None = None,
                 expected: dict[str, str] | None = None):
        self.root = Path(root)
        self.files = list(files)
        self.config = config
        self._fds: list[int] = []
        try:
            self._open(expected)
        except BaseException:
            self.close()
            raise

    def model_metadata(self, warn: Callable[[str], None] | None = None) -> dict | None:
        """The pack's ``model`` record from config.json and the tokenizer files beside the weights, or None
        without a config.json (orkpack.sources.modelkv)."""
        from .modelkv import from_hf

        folder = self.root if self.root.is_dir() else self.root.parent
        return from_hf(folder, self.config, warn or (lambda s: None))

    def _open(self, expected: dict[str, str] | None) -> None:
        raw: list[tuple[str, str, list[int], int, int, int]] = []  # hf name, dtype, shape, file, offset, nbytes
        for i, p in enumerate(self.files):
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError as e:
                raise SourceError(f"{_fname(p)}: cannot open ({e.strerror}); check the path and its permissions") from None
            self._fds.append(fd)
            size = os.fstat(fd).st_size
            header, base = parse_header(p, fd, size)
            for t, e in header.items():
                a, b = e["data_offsets"]
                raw.append((t, e["dtype"], list(e["shape"]), i, base + a, b - a))
        names = [r[0] for r in raw]
        dup = {n for n, c in Counter(names).items() if c > 1}
        if dup:
            n0 = sorted(dup)[0]
            raise SourceError(f"{_fname(self.root)}: tensor {escape_name(n0)} appears in more than one shard; "
                              "remove the stale shard")
        if expected:
            where = {r[0]: self.files[r[3]].name for r in raw}
            for t, shard in sorted(expected.items()):
                if where.get(t) != shard:
                    raise SourceError(f"{_fname(self.root)}: the index puts tensor {escape_name(t)} in "
                                      f"{escape_name(shard)} but that shard does not hold it; download the shard again")
        # the architecture names the tensors; without config.json it is guessed from the
        # names for naming only (self.arch stays None: provenance records no guess)
        name_arch, n_layers = guess_arch(names)
        self.arch = None
        if self.config is not None:
            fam = archs.config_family(self.config)
            arch = fam.name if fam is not None else self.config.get("model_type")
            self.arch = arch if isinstance(arch, str) else None
            name_arch = self.arch
            n_layers = max(n_layers, archs.layers_in_config(self.config))
        if n_layers > MAX_LAYERS:
            raise SourceError(f"{_fname(self.root)}: {n_layers} layers (from config.json or the tensor names) is over "
                              f"the cap of {MAX_LAYERS}; the checkpoint is damaged")
        fam = archs.config_family(self.config) if self.config is not None else None
        raw, self._skipped = split_derivable(raw, family_skip=fam.skip if fam is not None else ())
        # derivable buffers (position_ids, ...) and what the family leaves out (a vision tower): listed, not read
        q = quantized.prepare(raw, self.config, self.root, self.files, self._skipped)  # FP8 + scales, MXFP4 pairs
        raw, self._skipped, self._recipes = q.raw, q.skipped, q.recipes
        self._entries: dict[str, _Entry] = {}
        groups: dict[tuple[int, str], dict[int, tuple]] = {}
        stacks: dict[str, dict[int, tuple]] = {}  # the converter's stacked tensors (archs Stack, indexed)
        for r in raw:
            t, dtype, shape, fi, off, nb = r
            ex = hf_expert(t)
            if ex is not None:
                layer, e, proj = ex
                groups.setdefault((layer, proj), {})[e] = r
                continue
            st = archs.stacked_slice(t, name_arch)
            if st is not None:
                stacks.setdefault(st[0], {})[st[1]] = r
                continue
            cname = canonical_name(t, name_arch, n_layers)
            # the tensors as the converter lays them out: squeezed, reshaped, cut into parts (byte ranges) or renamed
            pieces = archs.converter_layout(self.config, cname, tuple(shape), _fname(self.root))
            if len(pieces) == 1 and pieces[0].of == 1:
                self._add(pieces[0].name, t, dtype, pieces[0].shape, [_Part(fi, off, nb)])
                continue
            if dtype in quantized.DEQUANTIZED_DTYPES or dtype not in _NP_DTYPE:
                raise SourceError(f"{_fname(self.root)}: {escape_name(t)} is {dtype}: llama.cpp's converter splits it, "
                                  "and orkpack splits float tensors only; convert the checkpoint to BF16 first")
            rows = sum(pc.shape[pc.axis] for pc in pieces)  # the pieces cover the stored tensor along their axis
            for pc in pieces:
                outer = math.prod(pc.shape[:pc.axis])
                inner = math.prod(pc.shape[pc.axis + 1:]) * _NP_DTYPE[dtype].itemsize
                self._add(pc.name, t, dtype, pc.shape, [_Part(fi, off + (o * rows + r0) * inner, n * inner)
                                                        for o in range(outer) for r0, n in pc.runs()])
        stacked = [(f"blk.{layer}.ffn_{proj}_exps.weight", experts, "expert", r"\.experts\.\d+\.", ".experts.*.")
                   for (layer, proj), experts in groups.items()]
        stacked += [(name, per, "slice", r"\.\d+\.(?=[^.]*$)", ".*.") for name, per in stacks.items()]
        for name, experts, what, rx, star in stacked:
            first = experts[min(experts)]
            missing = sorted(set(range(len(experts))) - set(experts))
            if missing:
                raise SourceError(f"{_fname(self.root)}: {escape_name(name)}: {what} {missing[0]} is missing "
                                  f"(found {len(experts)}); the checkpoint is incomplete; download it again")
            for e in range(len(experts)):
                r = experts[e]
                if r[1] != first[1] or r[2] != first[2]:
                    raise SourceError(f"{_fname(self.root)}: {escape_name(r[0])}: {r[1]} {tuple(r[2])} differs from "
                                      f"{what} 0 ({first[1]} {tuple(first[2])}); the checkpoint is inconsistent")
            src = re.sub(rx, star, first[0])
            parts = [_Part(experts[e][3], experts[e][4], experts[e][5]) for e in range(len(experts))]
            self._add(name, src, first[1], (len(experts), *first[2]), parts)
        # tensors the converter stacks into one (archs Stack, named parts: RWKV7's six token-shift mixes) and writes twice (archs
        # Family.copies: RWKV7's layer-0 v0/v1/v2), listed as it writes them: the parts' stored bytes in turn, the same
        # stored bytes again
        for stacked, names in archs.converter_stacks(self.config, list(self._entries)):
            got = [self._entries.pop(n) for n in names]
            i0 = got[0].info
            for e in got[1:]:
                if (e.info.dtype, e.info.shape) != (i0.dtype, i0.shape):
                    raise SourceError(f"{_fname(self.root)}: {escape_name(e.info.source_name)}: {e.info.dtype} "
                                      f"{e.info.shape} differs from {escape_name(i0.source_name)} ({i0.dtype} "
                                      f"{i0.shape}), which llama.cpp's converter stacks with it; the checkpoint is "
                                      "inconsistent")
            self._add(stacked, "+".join(e.info.source_name for e in got), i0.dtype, (len(got), *i0.shape),
                      [p for e in got for p in e.parts])
        for new, old in archs.converter_copies(self.config, list(self._entries)):
            e = self._entries[old]
            self._add(new, e.info.source_name, e.info.dtype, e.info.shape, list(e.parts))
        # tensors the converter computes from the config (archs Family.generated: gemma4's rope_freqs), listed and
        # read as it writes them
        self._generated = archs.generated_tensors(self.config, _fname(self.root)) if fam is not None else {}
        for name, a in self._generated.items():
            self._entries[name] = _Entry(TensorInfo(name=name, source_name=f"({name}: from config.json)", shape=a.shape,
                                                    dtype="F32", file="config.json", nbytes=a.nbytes), [])
        self._order = sorted(self._entries, key=natural_key)
        # the converter's value changes (A_log -> -exp, value heads tiled): made on read (convlayout)
        self._changes = {n: (ch, self._entries[n].info.dtype)  # (changes, the stored dtype)
                         for n, ch in convlayout.plan(fam, self.config, [(n, self._entries[n].info.shape)
                                                                          for n in self._order], _fname(self.root)).items()}
        for name, (ch, stored) in self._changes.items():
            info = self._entries[name].info
            dt = archs.converted_dtype(fam.name, name, stored)
            if dt != stored:
                self._entries[name] = _Entry(replace(info, dtype=dt, nbytes=math.prod(info.shape) * 4),
                                             self._entries[name].parts)

    def _add(self, name: str, src: str, dtype: str, shape: tuple[int, ...], parts: list[_Part]) -> None:
        if name in self._entries:
            raise SourceError(f"{_fname(self.root)}: tensors {escape_name(self._entries[name].info.source_name)} and "
                              f"{escape_name(src)} both map to {escape_name(name)}; remove one")
        files = sorted({self.files[p.file].name for p in parts})
        file = self.files[parts[0].file].name if len(files) == 1 else ",".join(files)
        info = TensorInfo(name=name, source_name=src, shape=shape, dtype=dtype, file=file,
                          nbytes=sum(p.nbytes for p in parts))
        self._entries[name] = _Entry(info, parts)

    def tensors(self) -> list[TensorInfo]:
        return [self._entries[n].info for n in self._order]

    def mapped(self, name: str) -> np.ndarray | None:
        """A float or raw tensor stored in one piece as a read-only view of its shard's pages
        (base.map_array); None for dequantized types and stacked experts (``read`` gathers them)."""
        ent = self._entries.get(name)
        if ent is None or not self._fds or len(ent.parts) != 1 or ent.info.dtype in quantized.DEQUANTIZED_DTYPES \
                or name in self._changes:
            return None
        p = ent.parts[0]
        return map_array(self._fds[p.file], p.offset, ent.info.shape, _NP_DTYPE[ent.info.dtype].newbyteorder("="))

    def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor as float32, float16, uint16 holding BF16 bits, or a raw type's own numpy dtype
        (BOOL as np.bool_; in ``out`` when given: see base.Source.read)."""
        ent = self._entries.get(name)
        if ent is None:
            raise SourceError(f"{_fname(self.root)}: no tensor {escape_name(name)} in this checkpoint; "
                              "use a name from Source.tensors()")
        if not self._fds:
            raise SourceError(f"{_fname(self.root)}: source is closed; open it again")
        if name in self._generated:
            got = self._generated[name]
            arr = array_in(out, got.shape, got.dtype)
            arr[...] = got
            return arr
        info = ent.info
        changed = self._changes.get(name)
        if changed and changed[1] in quantized.DEQUANTIZED_DTYPES:  # an FP8 release: the changes on its float32
            got = convlayout.apply(quantized.dequantize(
                info.shape, [self._recipes[(p.file, p.offset, p.nbytes)] for p in ent.parts],
                lambda fi, off, mv: read_into(self._fds[fi], off, mv, self.files[fi]), None), changed[0])
            arr = array_in(out, info.shape, got.dtype)
            arr[...] = got
            return arr
        if info.dtype in quantized.DEQUANTIZED_DTYPES:  # FP8, MXFP4: float32, dequantized in chunks
            return quantized.dequantize(info.shape, [self._recipes[(p.file, p.offset, p.nbytes)] for p in ent.parts],
                                        lambda fi, off, mv: read_into(self._fds[fi], off, mv, self.files[fi]), out)
        stored = changed[1] if changed else info.dtype
        arr = array_in(None if changed else out, info.shape, _NP_DTYPE[stored].newbyteorder("="))
        flat = arr.reshape(-1).view(np.uint8)
        pos = 0
        for p in ent.parts:
            read_into(self._fds[p.file], p.offset, memoryview(flat[pos: pos + p.nbytes]), self.files[p.file])
            pos += p.nbytes
        if changed:
            got = convlayout.apply(arr, changed[0])
            arr = array_in(out, info.shape, got.dtype)
            arr[...] = got
        return arr

