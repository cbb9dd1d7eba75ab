"""Write a .orkpack file (docs/FORMAT.md), streaming: parts go out as they are
encoded, the header and the preamble are written last.

The file is built under a temporary name in the target folder
(``.<name>.<pid>.<random>.orkpack-partial``), flushed and fsynced, then renamed
over the target, so an interrupted build never leaves a partial file at the
target path and never damages a pack already there (rename is atomic: a
reader, or a second build racing to the same path, sees the old pack or the
new one, never a mix).

Orphans. A build killed by SIGKILL (or a power cut) leaves its temp file
behind. The writer holds an exclusive ``flock`` on its temp file for as long as
it writes; the next writer into the same folder removes every
``.*.<pid>.*.orkpack-partial`` whose pid is not a live process AND whose lock it
can take (:func:`clean_orphans`). Both tests must agree, so a live build's temp
file is never touched, even across pid namespaces or after pid reuse (a lock
dies with its process, whatever the pid).

Errors (ENOSPC, a read-only folder, ...) abort: the temp file is removed and
:class:`OrkError` says what happened; the target path is left as it was.

Write-behind: parts are written (and checksummed) by one background thread,
in order, while the caller encodes the next tensor; at most ``write_behind``
bytes of parts wait in its queue, which bounds the memory it adds. Offsets are
assigned when a part is queued, so the bytes do not depend on the timing.

Determinism: nothing in the file depends on the time, the machine's paths, the
environment or the thread count, unless ``set_provenance(..., timestamp=True)``
asks for a ``created`` time (UTC, or ``SOURCE_DATE_EPOCH`` when set).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import struct
import tempfile
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import xxhash

from orkpack import __version__
from orkpack.errors import OrkError, escape_name
from orkpack.pack import spec

PARTIAL_SUFFIX = ".orkpack-partial"
_ZEROS = bytes(spec.ALIGN)


def partial_owner(name: str) -> int | None:
    """The pid recorded in a temp file name ``.<name>.<pid>.<random>.orkpack-partial``, or None."""
    if not (name.startswith(".") and name.endswith(PARTIAL_SUFFIX)):
        return None
    bits = name[: -len(PARTIAL_SUFFIX)].rsplit(".", 2)
    if len(bits) != 3 or not bits[1].isdigit() or len(bits[1]) > 10:
        return None
    return int(bits[1])


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a real owner: never delete on its word
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, someone else's
        return True
    return True


def clean_orphans(folder: Path) -> list[Path]:
    """Remove temp files of dead builds in ``folder``; return what was removed.

    A file is removed only when its name records a pid that is not a live
    process and nobody holds its lock (see the module docstring).
    """
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        pid = partial_owner(name)
        if pid is None or _pid_alive(pid):
            continue
        path = Path(folder) / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer holds it
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
        finally:
            os.close(fd)
    return removed


def created_stamp() -> str:
    """UTC time for ``provenance.created``: ``SOURCE_DATE_EPOCH`` when set (reproducible builds), else now."""
    sde = os.environ.get("SOURCE_DATE_EPOCH", "")
    t = int(sde) if sde.isdigit() else int(time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def header_bytes(header: dict) -> bytes:
    """The canonical JSON encoding of a header: ASCII only, no NaN, no spaces."""
    return json.dumps(header, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def preamble_bytes(*, file_size: int, data_size: int, header_size: int, data_xxh3: int, header_xxh3: int) -> bytes:
    """The 4096-byte preamble block, its own checksum filled in."""
    header_offset = spec.PREAMBLE_BLOCK + data_size
    fields = struct.pack(
        spec.PREAMBLE_FMT,
        spec.MAGIC,
        spec.VERSION_MAJOR,
        spec.VERSION_MINOR,
        spec.PREAMBLE_SIZE,
        file_size,
        spec.PREAMBLE_BLOCK,
        data_size,
        header_offset,
        header_size,
        data_xxh3,
        header_xxh3,
        spec.ALIGN,
        0,
        bytes(40),
        0,
    )
    block = bytearray(spec.PREAMBLE_BLOCK)
    block[: spec.PREAMBLE_SIZE] = fields
    digest = xxhash.xxh3_64_intdigest(bytes(block))
    struct.pack_into("<Q", block, spec.PREAMBLE_XXH3_OFFSET, digest)
    return bytes(block)


def _as_bytes(arr: np.ndarray) -> memoryview:
    a = np.ascontiguousarray(arr)
    if a.dtype.byteorder == ">":  # the format is little-endian
        a = a.astype(a.dtype.newbyteorder("<"))
    return memoryview(a).cast("B")


class PackWriter:
    """Stream tensors into a new pack at ``path``.

    >>> w = PackWriter(path, provenance=..., config=..., tiermap=None)
    >>> w.add_tensor(name, source_name, shape, source_dtype, slices)   # repeatedly
    >>> w.finish()    # or w.abort() on any failure

    Each slice is a dict: expert, shape, encoding, tier, layout, parts
    (name -> array, in ``spec.PARTS[encoding]`` order), sqnr_db, and optionally
    min_m (NPU slices), inflate (NPU slices stored nf4), dtype (raw slices
    only: the element type, a key of ``spec.RAW_DTYPES``) and host_copy (NPU
    slices only: a dict encoding "nf4", layout, parts, sqnr_db; its parts are
    written right after the slice's own).
    """

    def __init__(self, path: Path, *, provenance: dict, config: dict | None, tiermap: dict | None,
                 write_behind: int = 64 << 20, model: dict | None = None):
        self.path = Path(path)
        folder = self.path.parent if str(self.path.parent) else Path(".")
        if not folder.is_dir():
            raise OrkError(f"{escape_name(str(folder))}: output folder does not exist; create it first or choose another -o path")
        if self.path.is_dir():
            raise OrkError(f"{escape_name(str(self.path))}: is a folder; give a file name such as model.orkpack")
        self.cleaned = clean_orphans(folder)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.{os.getpid()}.", suffix=PARTIAL_SUFFIX, dir=folder)
        except OSError as e:
            raise OrkError(f"{escape_name(str(folder))}: cannot write here ({e.strerror}); choose another -o path") from None
        self.tmp = Path(tmp)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the file is closed: "a live build owns this"
        except OSError:
            pass  # a file system without locks: the pid in the name still protects it
        self._f = os.fdopen(fd, "wb")
        self._meta = {
            "format": "orkpack",
            "version": [spec.VERSION_MAJOR, spec.VERSION_MINOR],
            "tool": {"name": "orkpack", "version": __version__},
            "provenance": provenance,
            "config": config,
            "model": model,
            "tiermap": tiermap,
        }
        self._tensors: list[dict] = []
        self._data_hash = xxhash.xxh3_64()
        self._offset = spec.PREAMBLE_BLOCK
        self._closed = False
        self._write_behind = max(0, int(write_behind))
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orkpack-write")
        self._queue: deque[tuple[Future, int]] = deque()
        self._queued = 0
        self._write_raw(_ZEROS)  # the preamble block, rewritten at the end
        self._offset = spec.PREAMBLE_BLOCK

    # -- low level -------------------------------------------------------
    def _write_raw(self, buf) -> None:
        try:
            self._f.write(buf)
        except OSError as e:
            self.abort()
            raise OrkError(f"{escape_name(str(self.path))}: write failed ({_why(e)}); nothing was written at the output path") from None

    def _write_part(self, arr: np.ndarray) -> dict:
        buf = _as_bytes(arr)
        pad = (-len(buf)) % spec.ALIGN
        rec = {"offset": self._offset, "size": len(buf), "xxh3": None}
        self._offset += len(buf) + pad
        self._wait_for_room(len(buf))
        self._queue.append((self._io.submit(self._emit, buf, pad, rec), len(buf)))
        self._queued += len(buf)
        return rec

    def _emit(self, buf: memoryview, pad: int, rec: dict) -> None:
        """On the write thread: write one part and its padding, checksum both."""
        self._f.write(buf)
        self._data_hash.update(buf)
        if pad:
            self._f.write(_ZEROS[:pad])
            self._data_hash.update(_ZEROS[:pad])
        rec["xxh3"] = xxhash.xxh3_64_hexdigest(buf)

    def _wait_for_room(self, incoming: int) -> None:
        while self._queue and (self._queued + incoming > self._write_behind or self._queue[0][0].done()):
            fut, n = self._queue.popleft()
            self._queued -= n
            try:
                fut.result()
            except OSError as e:
                self.abort()
                raise OrkError(f"{escape_name(str(self.path))}: write failed ({_why(e)}); nothing was written at the output path") from None

    def _drain(self) -> None:
        self._wait_for_room(1 << 62)

    def set_provenance(self, provenance: dict | None, *, timestamp: bool = False) -> None:
        """Set the header's provenance; ``timestamp`` adds ``created`` (the only time a header may hold)."""
        if timestamp:
            provenance = dict(provenance or {})
            provenance["created"] = created_stamp()
        self._meta["provenance"] = provenance

    # -- tensors ---------------------------------------------------------
    def add_tensor(self, name: str, source_name: str, shape, source_dtype: str, slices: list[dict]) -> dict:
        recs = []
        for s in slices:
            enc = s["encoding"]
            names = spec.PARTS[enc]
            if tuple(s["parts"]) != names:
                raise ValueError(f"slice of {name}: parts {tuple(s['parts'])} != {names}")
            if (enc == spec.ENC_RAW) != (s.get("dtype") is not None) or (enc == spec.ENC_RAW and s["dtype"] not in spec.RAW_DTYPES):
                raise ValueError(f"slice of {name}: a raw slice, and only a raw slice, names its dtype "
                                 f"({', '.join(spec.RAW_DTYPES)}); got {s.get('dtype')!r} for {enc}")
            rec = {
                "expert": s.get("expert"),
                "shape": [int(d) for d in s["shape"]],
                "encoding": enc,
            }
            if enc == spec.ENC_RAW:
                rec["dtype"] = s["dtype"]
            rec |= {
                "tier": s["tier"],
                "layout": s["layout"],
                "parts": {p: self._write_part(s["parts"][p]) for p in names},
                "sqnr_db": None if s.get("sqnr_db") is None else round(float(s["sqnr_db"]), 3),
            }
            if s.get("min_m") is not None:
                rec["min_m"] = int(s["min_m"])
            if s.get("inflate") is not None:
                rec["inflate"] = s["inflate"]
            if s.get("host_copy") is not None:
                rec["host_copy"] = self._host_copy(name, s)
            recs.append(rec)
        t = {
            "name": name,
            "source_name": source_name,
            "shape": [int(d) for d in shape],
            "source_dtype": source_dtype,
            "slices": recs,
        }
        self._tensors.append(t)
        return t

    def _host_copy(self, name: str, s: dict) -> dict:
        """The record of an NPU slice's host copy (docs/FORMAT.md 8); its parts follow the slice's own."""
        hc = s["host_copy"]
        enc = hc["encoding"]
        if s["tier"] != spec.TIER_NPU or enc not in spec.HOST_COPY_ENCODINGS:
            raise ValueError(f"slice of {name}: only an NPU slice has a host copy, encoded as "
                             f"{', '.join(spec.HOST_COPY_ENCODINGS)}; got a {enc!r} copy of a {s['tier']} slice")
        names = spec.PARTS[enc]
        if tuple(hc["parts"]) != names:
            raise ValueError(f"host copy of {name}: parts {tuple(hc['parts'])} != {names}")
        return {
            "encoding": enc,
            "layout": hc.get("layout") or {"kind": spec.LAYOUT_ROW_MAJOR},
            "parts": {p: self._write_part(hc["parts"][p]) for p in names},
            "sqnr_db": None if hc.get("sqnr_db") is None else round(float(hc["sqnr_db"]), 3),
        }

    def finish(self) -> Path:
        self._drain()
        self._io.shutdown(wait=True)
        header = dict(self._meta)
        header["tensors"] = self._tensors
        hb = header_bytes(header)
        if len(hb) > spec.MAX_HEADER_SIZE:
            self.abort()
            raise OrkError(f"{escape_name(str(self.path))}: header would be {len(hb)} bytes, over the format's cap")
        data_size = self._offset - spec.PREAMBLE_BLOCK
        self._write_raw(hb)
        file_size = self._offset + len(hb)
        pre = preamble_bytes(
            file_size=file_size,
            data_size=data_size,
            header_size=len(hb),
            data_xxh3=self._data_hash.intdigest(),
            header_xxh3=xxhash.xxh3_64_intdigest(hb),
        )
        try:
            self._f.seek(0)
            self._f.write(pre)
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._closed = True
            os.chmod(self.tmp, 0o644)
            os.replace(self.tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as e:
            self.abort()
            raise OrkError(f"{escape_name(str(self.path))}: could not finish the pack ({_why(e)}); nothing was written at the output path") from None
        return self.path

    def abort(self) -> None:
        self._io.shutdown(wait=True, cancel_futures=True)
        if not self._closed:
            try:
                self._f.close()
            except OSError:
                pass
            self._closed = True
        try:
            self.tmp.unlink()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if et is not None:
            self.abort()
        return False


def _why(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return "no space left on the device; free some space or choose another -o folder"
    if e.errno == errno.EDQUOT:
        return "disk quota exceeded; free some space or choose another -o folder"
    return e.strerror or e.__class__.__name__


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
