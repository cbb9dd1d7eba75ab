"""The one tensor model every reader produces.

A :class:`Source` lists :class:`TensorInfo` records and hands out one tensor at a
time as a numpy array in numpy (row-major) order: for a linear layer that is
``(N_out, K_in)``, the same for Hugging Face and GGUF (GGUF's ggml order is
reversed by the reader). Readers never keep a whole model in memory and release
mapped source pages as they go.
"""
from __future__ import annotations

import math
import mmap
import os

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

# Element types a reader may hand to the codecs. BF16 is carried exactly as its
# raw 16 bits in a uint16 array (widening to float32 is a 16-bit shift).
FLOAT_DTYPES = ("F32", "F16", "BF16")

# Source element types carried through unchanged (the pack's ``raw`` encoding,
# docs/FORMAT.md 3): source dtype name (safetensors spelling; GGUF's I8..I64 and
# F64 are spelled the same) -> the raw slice's element type. Readers hand them
# out as numpy arrays of that type (BOOL as np.bool_, one byte each). F64 is
# carried raw because float32 cannot hold it losslessly.
RAW_DTYPES = {
    "BOOL": "bool",
    "U8": "u8", "U16": "u16", "U32": "u32", "U64": "u64",
    "I8": "i8", "I16": "i16", "I32": "i32", "I64": "i64",
    "F64": "f64", "C64": "c64",
}


def is_raw(dtype: str) -> bool:
    """True for a source dtype that is carried raw (not quantized, never planned)."""
    return dtype in RAW_DTYPES


@dataclass(frozen=True)
class Skipped:
    """A source tensor a reader leaves out because the config derives it (see orkpack.sources.derivable)."""

    name: str  # the name in the source file
    dtype: str  # source dtype
    shape: tuple[int, ...]
    reason: str  # why it is derivable, for people

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "reason": self.reason}


@dataclass(frozen=True)
class TensorInfo:
    name: str  # canonical name: GGUF-style (blk.0.attn_q.weight) where the architecture is known
    source_name: str  # the name in the source file
    shape: tuple[int, ...]  # numpy order
    dtype: str  # source dtype: F32, F16, BF16, a raw type (RAW_DTYPES), or a GGUF quantized type name (Q4_0, ...)
    file: str  # file name within the source (no directory)
    nbytes: int  # bytes in the source file

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Source(Protocol):
    kind: str  # "safetensors" or "gguf"
    root: Path  # what the user named
    files: list[Path]  # every weight file read, in a stable order
    config: dict | None  # HF config.json, or architecture facts from GGUF metadata
    arch: str | None  # architecture (llama, qwen2, qwen3_moe, ...) when known

    def tensors(self) -> list[TensorInfo]: ...

    def skipped(self) -> list[Skipped]:
        """Source tensors left out of ``tensors()`` because they are derivable (from the headers; no data read)."""
        ...

    def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor ``name`` (canonical name) as an array the caller owns.

        dtype float32 or float16, or uint16 holding BF16 bits; GGUF quantized
        types are dequantized to float32 (with a warning, once per build);
        raw types (RAW_DTYPES) come back as their own numpy type, bytes as stored.
        ``out``: an optional C-contiguous uint8 buffer of at least the
        tensor's bytes, reused across reads to spare fresh pages (page
        faults); the result is then a view of it.
        """
        ...

    def mapped(self, name: str) -> np.ndarray | None:
        """The tensor ``name`` as a read-only view of the source file's pages (no copy), when it is
        stored as plain bytes in one piece (float or raw types); None otherwise: use ``read``.
        The mapping lives as long as the array (or a view of it) does."""
        ...

    def close(self) -> None: ...


# MAP_POPULATE (Linux): map every page at once, reading it from disk when the page cache does not hold
# it; a warm 1 GB tensor maps in milliseconds, with no copy and no fresh memory (the page cache's pages)
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def map_array(fd: int, offset: int, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A read-only array of ``shape``/``dtype`` over ``fd``'s bytes at ``offset`` (checked against the
    file size by the caller's header validation). The mapping is released when the array (and every
    view of it) is gone. Unlike ``os.preadv`` into a buffer, nothing is copied and no anonymous memory
    is touched: on VMs that hand free memory back to the host, fresh pages cost ~2 s per GB."""
    dt = np.dtype(dtype)
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype=dt)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    m = mmap.mmap(fd, offset - start + count * dt.itemsize, flags=_MAP_FLAGS, prot=mmap.PROT_READ, offset=start)
    return np.frombuffer(m, dtype=dt, count=count, offset=offset - start).reshape(shape)


class FileSource:
    """close() and the context manager for a reader holding OS file descriptors in ``self._fds``."""

    _fds: list[int]
    _skipped: tuple = ()  # a reader sets its own list

    def skipped(self) -> list[Skipped]:
        return list(self._skipped)

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def array_in(out: np.ndarray | None, shape: tuple[int, ...], dtype) -> np.ndarray:
    """An array of ``shape``/``dtype``: a view of the reusable uint8 buffer ``out`` when it is large enough, else fresh."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if out is not None and out.dtype == np.uint8 and out.flags.c_contiguous and out.nbytes >= nbytes:
        return out.reshape(-1)[:nbytes].view(dt).reshape(shape)
    return np.empty(shape, dtype=dt)


def as_float32(a: np.ndarray) -> np.ndarray:
    """Widen a reader's array to float32 exactly (uint16 means BF16 bits)."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32, copy=False)
