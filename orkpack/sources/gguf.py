"""GGUF reader, one tensor at a time.

gguf-py's ``GGUFReader`` parses the header (metadata and tensor table) and is
then dropped, with its memmap: tensor bytes are read with ``os.preadv`` into a
fresh buffer (the page cache is left alone), as in
the safetensors reader. Any exception the parser raises on a truncated or
garbage file becomes one :class:`SourceError` line, and every tensor's byte
range is checked against the file size before anything is read.

Shapes: GGUF stores ggml order (ne[0] fastest); this reader reports numpy
order (reversed), so a linear layer is ``(N_out, K_in)`` and stacked experts
``blk.N.ffn_*_exps.weight`` are ``(E, N_out, K_in)``, keeping the expert axis.
Names are GGUF names already: they are the canonical names.

Exactness: F32 and F16 come back bit-exact as float32 / float16; BF16 as its
raw bits in a uint16 array; I8, I16, I32, I64 and F64 as numpy arrays of their
own type, bytes as stored (a build carries them raw: :data:`RAW_TYPES`).

Derivable buffers: llama.cpp's converter already dropped them, and a GGUF's
tensor set is what llama.cpp loads, so this reader drops nothing
(``skipped()`` is empty). Quantized types that ``gguf.quants.dequantize``
implements (:data:`DEQUANT_TYPES`) come back as float32, exactly what
gguf-py computes, dequantized in row chunks of about 4 MB so temporaries stay
small; the first such read of a source reports once, through the
``on_warning`` callback if one was given, else ``warnings.warn`` with
:class:`LossyDequantWarning`, that re-quantizing a quantized source loses
accuracy.

Memory bound: one read holds the returned array, plus for quantized types the
raw block bytes and one chunk's temporaries: at most about 2 x the float32
output + 16 MB. The test holds a full pass to 3 x largest tensor + 64 MB.
"""
from __future__ import annotations

import mmap
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf import quants as _quants

from ..errors import SourceError, escape_name
from ..gcpause import without_gc
from ..pack import spec
from .base import FLOAT_DTYPES, RAW_DTYPES, FileSource, TensorInfo, array_in, is_raw, map_array
from .. import archs
from .config import facts_from_gguf_kv
from .modelkv import from_gguf_fields
from .names import natural_key
from .safetensors import read_into


class LossyDequantWarning(UserWarning):
    """A quantized GGUF is being dequantized: re-quantizing it loses accuracy."""


def _dequant_types() -> tuple[str, ...]:
    out = []
    for t, q in _quants._type_traits.items():
        base = next(c for c in q.__mro__ if c.__name__ == "__Quant")
        if t is not GGMLQuantizationType.BF16 and q.dequantize_blocks.__func__ is not base.dequantize_blocks.__func__:
            out.append(t.name)
    return tuple(out)


# Caps on what a GGUF header may declare, checked by :func:`prescan` before
# gguf-py's GGUFReader sees the file (it builds one numpy view per array element
# and string, so counts must be bounded by the file and by a cap).
MAX_TENSORS = 1 << 17  # real models: < 10k (experts are stacked)
MAX_KV = 1 << 16  # real models: ~50
MAX_ARRAY_ITEMS = 1 << 22  # all metadata array elements together (a 262k vocab with scores, types, merges: ~1.3M)
MAX_ARRAY_DEPTH = 2  # an array of arrays at most
MAX_NAME_BYTES = 4096  # keys and tensor names (llama.cpp: 64)
MAX_STRING_BYTES = 64 << 20  # one metadata string (a chat template is ~10 kB)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ELEMENTS = 1 << 56  # product of a tensor's dims

_SCALAR_SIZE = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def prescan(buf, size: int, name: str) -> None:
    """Walk a GGUF header (metadata and tensor table) without allocating from
    its counts: every length, count and dimension is checked against the bytes
    left in the file and the caps above. Raises SourceError on the first
    violation; returns when the header is safe to hand to GGUFReader.

    ``buf`` is anything ``struct.unpack_from`` reads (an mmap of the file).
    """
    def bad(why: str):
        return SourceError(f"{name}: damaged GGUF header ({why}); download it again")

    if size < 24:
        raise bad("file too short")
    (ver,) = struct.unpack_from("<I", buf, 4)
    e = ">" if ver & 0xFFFF == 0 else "<"  # gguf-py reads byte-swapped files the same way
    ver, n_tensors, n_kv = struct.unpack_from(e + "IQQ", buf, 4)
    if n_tensors > MAX_TENSORS:
        raise bad(f"{n_tensors} tensors, over the cap of {MAX_TENSORS}")
    if n_kv > MAX_KV:
        raise bad(f"{n_kv} metadata keys, over the cap of {MAX_KV}")
    pos = 24
    items = 0

    def need(n: int, what: str) -> None:
        if n < 0 or pos + n > size:
            raise bad(f"{what} runs past the end of the file")

    def u32() -> int:
        nonlocal pos
        need(4, "a count")
        (v,) = struct.unpack_from(e + "I", buf, pos)
        pos += 4
        return v

    def u64() -> int:
        nonlocal pos
        need(8, "a count")
        (v,) = struct.unpack_from(e + "Q", buf, pos)
        pos += 8
        return v

    def string(cap: int, what: str) -> None:
        nonlocal pos
        n = u64()
        if n > cap:
            raise bad(f"{what} of {n} bytes, over the cap of {cap}")
        need(n, what)
        pos += n

    def value(vtype: int, depth: int) -> None:
        nonlocal pos, items
        if vtype in _SCALAR_SIZE:
            need(_SCALAR_SIZE[vtype], "a value")
            pos += _SCALAR_SIZE[vtype]
        elif vtype == _STRING:
            string(MAX_STRING_BYTES, "a string")
        elif vtype == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise bad("arrays nested too deep")
            itype, count = u32(), u64()
            items += count
            if items > MAX_ARRAY_ITEMS:
                raise bad(f"metadata arrays hold over {MAX_ARRAY_ITEMS} elements")
            if itype in _SCALAR_SIZE:
                need(count * _SCALAR_SIZE[itype], "an array")
                pos += count * _SCALAR_SIZE[itype]
            elif itype in (_STRING, _ARRAY):
                need(count * 8, "an array")  # every element takes at least 8 bytes
                for _ in range(count):
                    value(itype, depth + 1)
            else:
                raise bad(f"unknown array element type {itype}")
        else:
            raise bad(f"unknown value type {vtype}")

    for _ in range(n_kv):
        string(MAX_NAME_BYTES, "a key")
        value(u32(), 0)
    for _ in range(n_tensors):
        string(MAX_NAME_BYTES, "a tensor name")
        n_dims = u32()
        if n_dims > MAX_DIMS:
            raise bad(f"a tensor with {n_dims} dimensions (at most {MAX_DIMS})")
        numel = 1
        for _ in range(n_dims):
            numel *= max(1, u64())
        if numel > MAX_ELEMENTS:
            raise bad("a tensor shape too large")
        u32()  # type: gguf-py refuses unknown ones
        u64()  # offset: checked against the file size after parsing


DEQUANT_TYPES = _dequant_types()
# integer and F64 tensors are carried raw (base.RAW_DTYPES), like safetensors' non-float types
RAW_TYPES = tuple(t.name for t in GGMLQuantizationType if t.name in RAW_DTYPES)
SUPPORTED_TYPES = ("F32", "F16", "BF16") + RAW_TYPES + DEQUANT_TYPES
_CHUNK = 4 << 20


class _HeaderReader(GGUFReader):
    """gguf-py's ``GGUFReader`` with its one primitive, ``_get``, on a plain ndarray view of its memmap: the same
    parse and the same fields (tests/test_sources.py compares them with gguf-py's own), without ``np.memmap``'s
    Python-level ``__getitem__`` / ``__array_finalize__`` on each of the ~6 views a string takes (a 49k-token
    vocabulary with its merges: ~3x faster to open)."""

    _itemsize: dict = {}

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        size = self._itemsize.get(dtype)
        if size is None:
            size = self._itemsize[dtype] = int(np.empty([], dtype=dtype).itemsize)
        arr = plain[offset: offset + size * count].view(dtype=dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


@dataclass(frozen=True)
class _Entry:
    info: TensorInfo
    qtype: GGMLQuantizationType
    offset: int


def _field_value(field):
    """Scalars and strings as Python values; arrays of strings/numbers as lists (token lists as a length-only range)."""
    t = field.types
    if not t:
        return None
    if t[0] == GGUFValueType.ARRAY:
        if len(field.data) > 4096:
            return range(len(field.data))
        return field.contents()
    return field.contents()


class GGUFSource(FileSource):
    """A .gguf file (see module docstring)."""

    kind = "gguf"

    def __init__(self, path: Path, on_warning: Callable[[str], None] | None = None):
        self.root = Path(path)
        self.files = [self.root]
        self._on_warning = on_warning
        self._warned = False
        self._fds: list[int] = []
        name = escape_name(str(path))
        try:
            self._fds.append(os.open(path, os.O_RDONLY))
        except OSError as e:
            raise SourceError(f"{name}: cannot open ({e.strerror}); check the path and its permissions") from None
        try:
            self._parse(name)
        except BaseException:
            self.close()
            raise

    @property
    def _fd(self) -> int:
        return self._fds[0] if self._fds else -1

    @without_gc
    def _parse(self, name: str) -> None:
        size = os.fstat(self._fd).st_size
        if size < 24 or os.pread(self._fd, 4, 0) != b"GGUF":
            raise SourceError(f"{name}: not a GGUF file (no GGUF magic or too short); check the path")
        mm = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
        try:
            prescan(mm, size, name)
        finally:
            mm.close()
        reader = None
        try:
            reader = _HeaderReader(self.root)
            kv = {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
            model = from_gguf_fields(reader.fields)  # the pack's model record, from this one parse
            swapped = reader.byte_order == "S"  # the file's byte order is not this machine's (a big-endian GGUF)
            raw = [(t.name, t.tensor_type, tuple(int(d) for d in reversed(t.shape.tolist())), int(t.n_bytes),
                    int(t.data_offset)) for t in reader.tensors]
        except SourceError:
            raise
        except (Exception, RecursionError) as e:  # gguf-py raises many kinds on damaged input
            raise SourceError(f"{name}: damaged or truncated GGUF ({e.__class__.__name__}: "
                              f"{escape_name(str(e), 120)}); download it again") from None
        finally:
            reader = None  # drop the memmap (and its plain view)
        self._swapped = swapped
        self._entries: dict[str, _Entry] = {}
        for tname, qtype, shape, nbytes, offset in raw:
            tn = f"{name}: tensor {escape_name(tname)}"
            if qtype.name not in SUPPORTED_TYPES:
                raise SourceError(f"{tn}: type {qtype.name} is not supported; supported: {', '.join(SUPPORTED_TYPES)}")
            if swapped and self._np_dtype(qtype.name) is None:
                # gguf-py writes a quantized tensor's bytes as given (no swap of its blocks' scales), and
                # gguf_convert_endian swaps them for a few types only: which order its scales are in is not known
                raise SourceError(f"{tn}: a {qtype.name} tensor in a big-endian GGUF is not supported (its block "
                                  "scales' byte order is not recorded); convert the file to little-endian, or use "
                                  "an F32/F16/BF16 GGUF")
            block, tsize = GGML_QUANT_SIZES[qtype]
            numel = 1
            for d in shape:
                numel *= d
            if numel % block or numel * tsize // block != nbytes:
                raise SourceError(f"{tn}: {qtype.name} {shape} does not match its {nbytes} bytes; the file is damaged")
            if offset < 0 or offset + nbytes > size:
                raise SourceError(f"{tn}: bytes {offset}..{offset + nbytes} run past the end of the file "
                                  f"({size} bytes); the file is truncated; download it again")
            dtype = qtype.name
            info = TensorInfo(name=tname, source_name=tname, shape=shape, dtype=dtype, file=self.root.name, nbytes=nbytes)
            self._entries[tname] = _Entry(info, qtype, offset)
        self._order = sorted(self._entries, key=natural_key)
        self.metadata = kv
        self._model = model
        garch = kv.get("general.architecture")
        try:
            self.config = facts_from_gguf_kv(kv, {n: e.info.shape for n, e in self._entries.items()}, name)
            self.arch = self.config["arch"]
        except (SourceError, TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as e:
            # an architecture we have no facts for, or metadata of the wrong types: tensors still readable; a known
            # family's own refusal (e.g. the converter's MTP blocks) is what asking for the facts says
            self.config = None
            self.arch = garch if isinstance(garch, str) else None
            known = isinstance(garch, str) and archs.family_for_gguf(garch, bool(kv.get(f"{garch}.expert_count")))
            self.facts_error = e if isinstance(e, SourceError) and known else None

    def tensors(self) -> list[TensorInfo]:
        return [self._entries[n].info for n in self._order]

    def model_metadata(self, warn: Callable[[str], None] | None = None) -> dict:
        """The pack's ``model`` record: this file's key-value pairs as they are (orkpack.sources.modelkv),
        read when the file was opened (a fresh list: a caller may add to it)."""
        return {"source": self._model["source"], "kv": list(self._model["kv"])}

    def quantized_warning(self) -> str | None:
        """The one line that says this GGUF holds quantized tensors (re-quantizing loses accuracy), or None."""
        if not any(e.info.dtype not in FLOAT_DTYPES and not is_raw(e.info.dtype) for e in self._entries.values()):
            return None
        return (f"{escape_name(str(self.root))} holds quantized tensors; they are dequantized to float32 and "
                "re-quantizing them loses accuracy: prefer an F16/BF16/F32 GGUF or the original safetensors")

    def _warn(self) -> None:
        if self._warned:
            return
        self._warned = True
        msg = self.quantized_warning() or ""
        if self._on_warning is not None:
            self._on_warning(msg)
        else:
            warnings.warn(msg, LossyDequantWarning, stacklevel=3)

    def _np_dtype(self, qname: str):
        """The numpy type a tensor of GGUF type ``qname`` is handed out as; None for quantized types."""
        if qname in ("F32", "F16", "BF16"):
            return {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[qname]
        if qname in RAW_TYPES:  # bytes as stored, as their own numpy type
            return np.dtype(spec.RAW_DTYPES[RAW_DTYPES[qname]]).newbyteorder("=")
        return None

    def mapped(self, name: str) -> np.ndarray | None:
        """Float and raw tensors as a read-only view of the file's pages (base.map_array); None for
        quantized types (dequantized by ``read``)."""
        ent = self._entries.get(name)
        if ent is None or self._fd < 0:
            return None
        dt = self._np_dtype(ent.qtype.name)
        if dt is None or self._swapped:  # a big-endian file's values need a swap: read() makes the copy
            return None
        return map_array(self._fd, ent.offset, ent.info.shape, dt)

    def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor in numpy order (see module docstring for dtypes); raw types land in ``out`` when given."""
        ent = self._entries.get(name)
        if ent is None:
            raise SourceError(f"{escape_name(str(self.root))}: no tensor {escape_name(name)} in this GGUF; "
                              "use a name from Source.tensors()")
        if self._fd < 0:
            raise SourceError(f"{escape_name(str(self.root))}: source is closed; open it again")
        info, q = ent.info, ent.qtype
        dt = self._np_dtype(q.name)
        if dt is not None:  # float (exact bits) and raw types
            arr = array_in(out, info.shape, dt)
            read_into(self._fd, ent.offset, memoryview(arr.reshape(-1).view(np.uint8)), self.root)
            if self._swapped and arr.dtype.itemsize > 1:  # a big-endian file: to this machine's order, in place
                arr.byteswap(inplace=True)
            return arr
        self._warn()
        if info.numel == 0:  # an empty tensor: nothing to dequantize (gguf-py cannot reshape it)
            return np.empty(info.shape, dtype=np.float32)
        raw = np.empty(info.nbytes, dtype=np.uint8)
        read_into(self._fd, ent.offset, memoryview(raw), self.root)
        block, tsize = GGML_QUANT_SIZES[q]
        k = info.shape[-1] if info.shape else 1
        row_bytes = k // block * tsize if k % block == 0 else 0
        out = np.empty(info.numel, dtype=np.float32)
        if row_bytes:
            rows = raw.reshape(-1, row_bytes)
            step = max(1, _CHUNK // row_bytes)
            for r0 in range(0, rows.shape[0], step):
                part = _quants.dequantize(rows[r0: r0 + step], q)
                out[r0 * k: r0 * k + part.size] = part.reshape(-1)
        else:  # rows not block-aligned: whole tensor as one stream of blocks
            out[:] = _quants.dequantize(raw.reshape(-1, tsize), q).reshape(-1)
        return out.reshape(info.shape)

