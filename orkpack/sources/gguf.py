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
raw bits in a uint16 array. Quantized types that ``gguf.quants.dequantize``
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

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf import quants as _quants

from ..errors import SourceError, escape_name
from .base import TensorInfo
from .config import facts_from_gguf_kv
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


DEQUANT_TYPES = _dequant_types()
SUPPORTED_TYPES = ("F32", "F16", "BF16") + DEQUANT_TYPES
_CHUNK = 4 << 20


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


class GGUFSource:
    """A .gguf file (see module docstring)."""

    kind = "gguf"

    def __init__(self, path: Path, on_warning: Callable[[str], None] | None = None):
        self.root = Path(path)
        self.files = [self.root]
        self._on_warning = on_warning
        self._warned = False
        self._fd = -1
        name = escape_name(str(path))
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise SourceError(f"{name}: cannot open ({e.strerror}); check the path and its permissions") from None
        try:
            self._parse(name)
        except BaseException:
            self.close()
            raise

    def _parse(self, name: str) -> None:
        size = os.fstat(self._fd).st_size
        if size < 24 or os.pread(self._fd, 4, 0) != b"GGUF":
            raise SourceError(f"{name}: not a GGUF file (no GGUF magic or too short); check the path")
        try:
            reader = GGUFReader(self.root)
            kv = {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
            raw = [(t.name, t.tensor_type, tuple(int(d) for d in reversed(t.shape.tolist())), int(t.n_bytes),
                    int(t.data_offset)) for t in reader.tensors]
        except SourceError:
            raise
        except (Exception, RecursionError) as e:  # gguf-py raises many kinds on damaged input
            raise SourceError(f"{name}: damaged or truncated GGUF ({e.__class__.__name__}: "
                              f"{escape_name(str(e), 120)}); download it again") from None
        finally:
            reader = None  # drop the memmap
        self._entries: dict[str, _Entry] = {}
        for tname, qtype, shape, nbytes, offset in raw:
            tn = f"{name}: tensor {escape_name(tname)}"
            if qtype.name not in SUPPORTED_TYPES:
                raise SourceError(f"{tn}: type {qtype.name} is not supported; supported: {', '.join(SUPPORTED_TYPES)}")
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
        garch = kv.get("general.architecture")
        try:
            self.config = facts_from_gguf_kv(kv, {n: e.info.shape for n, e in self._entries.items()}, name)
            self.arch = self.config["arch"]
        except SourceError:
            self.config = None  # an architecture we have no facts for: tensors still readable
            self.arch = garch if isinstance(garch, str) else None

    def tensors(self) -> list[TensorInfo]:
        return [self._entries[n].info for n in self._order]

    def _warn(self) -> None:
        if self._warned:
            return
        self._warned = True
        msg = (f"{escape_name(str(self.root))} holds quantized tensors; they are dequantized to float32 and "
               "re-quantizing them loses accuracy: prefer an F16/BF16/F32 GGUF or the original safetensors")
        if self._on_warning is not None:
            self._on_warning(msg)
        else:
            warnings.warn(msg, LossyDequantWarning, stacklevel=3)

    def read(self, name: str) -> np.ndarray:
        """The tensor as a fresh array in numpy order (see module docstring for dtypes)."""
        ent = self._entries.get(name)
        if ent is None:
            raise SourceError(f"{escape_name(str(self.root))}: no tensor {escape_name(name)} in this GGUF; "
                              "use a name from Source.tensors()")
        if self._fd < 0:
            raise SourceError(f"{escape_name(str(self.root))}: source is closed; open it again")
        info, q = ent.info, ent.qtype
        if q.name in ("F32", "F16", "BF16"):
            out = np.empty(info.shape, dtype={"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[q.name])
            read_into(self._fd, ent.offset, memoryview(out.reshape(-1).view(np.uint8)), self.root)
            return out
        self._warn()
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

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
