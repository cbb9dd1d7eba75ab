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

I/O path (issue 14: the kernel ate a third of the build). Parts live in
page-aligned buffers of a :class:`BufferPool` that are reused from tensor to
tensor: ``alloc(shape, dtype)`` hands one out and the codecs encode straight
into it (``encode(..., alloc=w.alloc)``), so a build does not fault in and
zero fresh pages for every tensor, and a part goes to the file with no copy
(an array from elsewhere is copied into a pool buffer first). Every part
starts on a 4 KiB boundary (spec.ALIGN) and its zero padding is part of its
buffer, so each write is aligned and is issued with ``O_DIRECT`` where the file
system takes it: the bytes go from the buffer to the disk without passing
through the page cache (which would cost a copy and fresh page-cache pages,
then the same disk write again at fsync). Where ``O_DIRECT`` is refused (open
or a write fails with EINVAL) the writer falls back to ordinary writes. The
file is fsynced once, at the end, either way.

Determinism: nothing in the file depends on the time, the machine's paths, the
environment or the thread count, unless ``set_provenance(..., timestamp=True)``
asks for a ``created`` time (UTC, or ``SOURCE_DATE_EPOCH`` when set).
"""
from __future__ import annotations

import bisect
import errno
import fcntl
import json
import mmap
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


def flags_of(provenance: dict | None) -> int:
    """The preamble flags a pack's provenance calls for: FLAG_ONLINE_R4 when its rotation holds an online R4."""
    rot = (provenance or {}).get("rotation") if isinstance(provenance, dict) else None
    return spec.FLAG_ONLINE_R4 if isinstance(rot, dict) and rot.get("r4") is not None else 0


def preamble_bytes(*, file_size: int, data_size: int, header_size: int, data_xxh3: int, header_xxh3: int,
                   flags: int = 0) -> bytes:
    """The 4096-byte preamble block, its own checksum filled in; a flagged pack says format 1.9, any other 1.8."""
    header_offset = spec.PREAMBLE_BLOCK + data_size
    fields = struct.pack(
        spec.PREAMBLE_FMT,
        spec.MAGIC,
        spec.VERSION_MAJOR,
        spec.VERSION_MINOR_ONLINE if flags else spec.VERSION_MINOR,
        spec.PREAMBLE_SIZE,
        file_size,
        spec.PREAMBLE_BLOCK,
        data_size,
        header_offset,
        header_size,
        data_xxh3,
        header_xxh3,
        spec.ALIGN,
        flags,
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


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


_HASH_PIECE = 256 << 10  # bytes hashed by both checksums in turn (stays in the L2 cache)
_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # private: a shared anonymous mapping is shmem (slower faults)


class _Buf:
    """A page-aligned piece of memory as a uint8 array: ``off`` is its place in the pool's region
    (None: a one-off mapping of its own); ``addr`` is its first byte's address."""

    __slots__ = ("arr", "addr", "off", "size")

    def __init__(self, arr: np.ndarray, off: int | None):
        self.arr, self.off, self.size = arr, off, arr.size
        self.addr = arr.__array_interface__["data"][0]


class BufferPool:
    """Page-aligned buffers carved first-fit out of one reserved region of ``reserve`` bytes.

    The region is mapped once with MAP_NORESERVE: a page costs something only once it is
    touched, and first-fit from the low end reuses the same pages from tensor to tensor, so a
    whole build touches about its peak of live parts (``high_water``), not the sum of all
    parts (each fresh page is a fault and a page the kernel zeroes: ~1 s per GB on a VM that
    hands free memory back to its host). A request that does not fit in what is free gets a
    one-off mapping of its own (``extra_bytes``). ``give`` returns a buffer; neighbours
    coalesce. No huge pages: a huge page is zeroed whole on its first fault, measured slower.
    Main thread only.
    """

    def __init__(self, reserve: int):
        self.reserve = _round_up(max(int(reserve), spec.ALIGN), spec.ALIGN)
        self._region = np.frombuffer(mmap.mmap(-1, self.reserve, flags=_ANON | getattr(mmap, "MAP_NORESERVE", 0)),
                                     dtype=np.uint8)
        self._free: list[list[int]] = [[0, self.reserve]]  # sorted [offset, size] runs
        self.high_water = 0
        self.extra_bytes = 0

    @property
    def fresh_bytes(self) -> int:
        """At most the bytes of fresh pages this pool has touched."""
        return self.high_water + self.extra_bytes

    def take(self, n: int) -> _Buf:
        size = _round_up(max(int(n), 1), spec.ALIGN)
        for i, (off, free) in enumerate(self._free):
            if free >= size:
                if free == size:
                    del self._free[i]
                else:
                    self._free[i] = [off + size, free - size]
                self.high_water = max(self.high_water, off + size)
                return _Buf(self._region[off: off + size], off)
        self.extra_bytes += size
        return _Buf(np.frombuffer(mmap.mmap(-1, size, flags=_ANON), dtype=np.uint8), None)

    def touched_after(self, n: int) -> int | None:
        """``high_water`` after ``take(n)``; None when it would need a one-off mapping (nothing free fits)."""
        size = _round_up(max(int(n), 1), spec.ALIGN)
        for off, free in self._free:
            if free >= size:
                return max(self.high_water, off + size)
        return None

    def fits_touched(self, n: int) -> bool:
        """Whether ``take(n)`` would be served from pages already touched (below ``high_water``)."""
        after = self.touched_after(n)
        return after is not None and after <= self.high_water

    def give(self, b: _Buf) -> None:
        if b.off is None:
            return  # a one-off mapping: unmapped when its last view goes
        runs = self._free
        i = bisect.bisect_left(runs, [b.off, 0])
        runs.insert(i, [b.off, b.size])
        if i + 1 < len(runs) and runs[i][0] + runs[i][1] == runs[i + 1][0]:
            runs[i][1] += runs.pop(i + 1)[1]
        if i > 0 and runs[i - 1][0] + runs[i - 1][1] == runs[i][0]:
            runs[i - 1][1] += runs.pop(i)[1]

    def clear(self) -> None:
        """Forget the region (unmapped once no view of it is left); later takes map one-off buffers."""
        self._free = []
        self._region = np.empty(0, dtype=np.uint8)


class _Job:
    __slots__ = ("fut", "buf", "n", "tensor")

    def __init__(self, fut: Future, buf: _Buf | None, n: int, tensor: int):
        self.fut, self.buf, self.n, self.tensor = fut, buf, n, tensor


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

    Parts may come from ``w.alloc(shape, dtype)`` (a pool buffer: written with no
    copy) or be any array (copied when it is queued). An array from ``alloc`` belongs
    to the writer again once the ``add_tensor`` that wrote it returns.
    """

    def __init__(self, path: Path, *, provenance: dict, config: dict | None, tiermap: dict | None,
                 write_behind: int = 64 << 20, model: dict | None = None, pool_bytes: int | None = None,
                 direct: bool = True):
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
        self._fd = fd
        # a second descriptor that bypasses the page cache (see the module docstring); None: plain writes
        self._dfd: int | None = None
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self._dfd = os.open(self.tmp, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError:
                self._dfd = None
        self._meta = {
            "format": "orkpack",
            "version": [spec.VERSION_MAJOR, spec.VERSION_MINOR],  # 1.8 at finish() for a flagged pack
            "tool": {"name": "orkpack", "version": __version__},
            "provenance": provenance,
            "config": config,
            "model": model,
            "tiermap": tiermap,
        }
        self._tensors: list[dict] = []
        self._data_hash = xxhash.xxh3_64()
        self._offset = spec.PREAMBLE_BLOCK  # the preamble block is written last, at offset 0
        self._closed = False
        self._write_behind = max(0, int(write_behind))
        self.pool = BufferPool(2 * self._write_behind + (64 << 20) if pool_bytes is None else pool_bytes)
        self._lent: dict[int, tuple[_Buf, int]] = {}  # address -> (buffer, bytes asked) of alloc()'s arrays
        self._hold: list[_Buf] = []  # written buffers of the tensor being added: free once add_tensor returns
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orkpack-write")
        self._queue: deque[_Job] = deque()
        self._queued = 0
        self._seq = 0  # tensors added so far
        self._parts_now = 0  # bytes (padded) of the parts of the tensor being added
        self._largest = 0  # ... of the tensor with the most, so far: the pool may grow to twice that

    # -- buffers ---------------------------------------------------------
    def alloc(self, shape, dtype) -> np.ndarray:
        """An uninitialized array of ``shape``/``dtype`` in a reused, page-aligned buffer, for a part
        (the codecs' ``alloc``): queued for writing with no copy."""
        dt = np.dtype(dtype)
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if n == 0:
            return np.empty(shape, dtype=dt)
        b = self._take(n)
        self._lent[b.addr] = (b, n)
        return b.arr[:n].view(dt).reshape(shape)

    def _take(self, n: int) -> _Buf:
        """A pool buffer. The pool may grow to twice the largest tensor's parts written so far, so that a
        tensor is encoded while the one before it is still being written (issue 26: the encoder waited for the
        disk ~0.5 s a build); beyond that, rather than touch fresh pages, first wait for the writes of earlier
        tensors (their buffers come back): a build touches at most about twice its largest tensor's parts, once."""
        self._reap()
        while self._queue and self._queue[0].tensor < self._seq:
            after = self.pool.touched_after(n)
            if after is not None and after <= max(self.pool.high_water, 2 * self._largest):
                break
            self._retire(self._queue.popleft())
        return self.pool.take(n)

    # -- low level -------------------------------------------------------
    def _fail(self, e: OSError) -> OrkError:
        self.abort()
        return OrkError(f"{escape_name(str(self.path))}: write failed ({_why(e)}); nothing was written at the output path")

    def _pwrite_all(self, mv: memoryview, offset: int) -> None:
        """Write all of ``mv`` at ``offset``; an O_DIRECT refusal (EINVAL) switches to plain writes for good."""
        while len(mv):
            fd = self._dfd if self._dfd is not None else self._fd
            try:
                k = os.pwrite(fd, mv, offset)
            except OSError as e:
                if e.errno == errno.EINVAL and fd == self._dfd:
                    self._dfd = None
                    os.close(fd)
                    continue
                raise
            if k <= 0:
                raise OSError(errno.EIO, "short write")
            mv, offset = mv[k:], offset + k

    def _write_part(self, arr: np.ndarray) -> dict:
        a = np.asarray(arr)
        n = int(a.nbytes)
        rec = {"offset": self._offset, "size": n, "xxh3": None}
        if n == 0:
            rec["xxh3"] = xxhash.xxh3_64_hexdigest(b"")
            return rec
        lent = self._lent.pop(a.__array_interface__["data"][0], None)
        if lent is not None and (lent[1] != n or not a.flags.c_contiguous or a.dtype.byteorder == ">"):
            self._hold.append(lent[0])  # a view of part of a lent buffer: copied below, the buffer kept for now
            lent = None
        self._wait_for_room(n)
        if lent is not None:
            b = lent[0]
        else:
            src = _as_bytes(a)
            b = self._take(n)
            b.arr[:n] = np.frombuffer(src, dtype=np.uint8)
        padded = _round_up(n, spec.ALIGN)
        b.arr[n:padded] = 0
        self._parts_now += padded
        self._queue.append(_Job(self._io.submit(self._emit, memoryview(b.arr[:padded]), n, rec, self._offset), b, n, self._seq))
        self._queued += n
        self._offset += padded
        return rec

    def _emit(self, mv: memoryview, n: int, rec: dict, offset: int) -> None:
        """On the write thread: write one part with its padding, checksum both: the part's own xxh3 and the
        data region's running one in one pass, a cache-sized piece at a time (each piece read from memory once,
        not the whole part twice)."""
        self._pwrite_all(mv, offset)
        part = xxhash.xxh3_64()
        for i in range(0, n, _HASH_PIECE):
            piece = mv[i: min(n, i + _HASH_PIECE)]
            part.update(piece)
            self._data_hash.update(piece)
        self._data_hash.update(mv[n:])  # the padding
        rec["xxh3"] = part.hexdigest()

    def _retire(self, job: _Job) -> None:
        self._queued -= job.n
        try:
            job.fut.result()
        except OSError as e:
            raise self._fail(e) from None
        if job.buf is not None:
            (self.pool.give if job.tensor < self._seq else self._hold.append)(job.buf)

    def _reap(self) -> None:
        while self._queue and self._queue[0].fut.done():
            self._retire(self._queue.popleft())

    def _wait_for_room(self, incoming: int) -> None:
        while self._queue and (self._queued + incoming > self._write_behind or self._queue[0].fut.done()):
            self._retire(self._queue.popleft())

    def _drain(self) -> None:
        self._wait_for_room(1 << 62)

    def set_model(self, model: dict | None) -> None:
        """Set the header's ``model`` record (the constructor's ``model``), any time before :meth:`finish`."""
        self._meta["model"] = model

    def set_provenance(self, provenance: dict | None, *, timestamp: bool = False) -> None:
        """Set the header's provenance; ``timestamp`` adds ``created`` (the only time a header may hold)."""
        if timestamp:
            provenance = dict(provenance or {})
            provenance["created"] = created_stamp()
        self._meta["provenance"] = provenance

    # -- tensors ---------------------------------------------------------
    def add_tensor(self, name: str, source_name: str, shape, source_dtype: str, slices: list[dict],
                   smoothing: dict | None = None, rotation: dict | None = None) -> dict:
        """``smoothing``: the tensor's activation-smoothing record (format 1.4, docs/FORMAT.md 10), if any;
        ``rotation``: its rotation record (format 1.6, docs/FORMAT.md 11), if any."""
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
        }
        if smoothing is not None:
            t["smoothing"] = smoothing
        if rotation is not None:
            t["rotation"] = rotation
        t["slices"] = recs
        self._tensors.append(t)
        # the caller is done with this tensor's arrays: their buffers serve the next tensors
        self._seq += 1
        self._largest = max(self._largest, self._parts_now)
        self._parts_now = 0
        for b in self._hold:
            self.pool.give(b)
        self._hold.clear()
        for b, _n in self._lent.values():  # lent but not written (the caller chose another array)
            self.pool.give(b)
        self._lent.clear()
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

    def _write_block(self, data: bytes, offset: int) -> None:
        """``data`` at ``offset`` (4 KiB-aligned) from an aligned buffer, zero-padded to a 4 KiB multiple
        (the file is cut to its size afterwards)."""
        n = len(data)
        b = self.pool.take(n)
        b.arr[:n] = np.frombuffer(data, dtype=np.uint8)
        padded = _round_up(n, spec.ALIGN)
        b.arr[n:padded] = 0
        self._pwrite_all(memoryview(b.arr[:padded]), offset)
        self.pool.give(b)

    def finish(self) -> Path:
        self._drain()
        self._io.shutdown(wait=True)
        header = dict(self._meta)
        flags = flags_of(header.get("provenance"))
        if flags:
            header["version"] = [spec.VERSION_MAJOR, spec.VERSION_MINOR_ONLINE]
        header["tensors"] = self._tensors
        hb = header_bytes(header)
        if len(hb) > spec.MAX_HEADER_SIZE:
            self.abort()
            raise OrkError(f"{escape_name(str(self.path))}: header would be {len(hb)} bytes, over the format's cap")
        data_size = self._offset - spec.PREAMBLE_BLOCK
        file_size = self._offset + len(hb)
        pre = preamble_bytes(
            file_size=file_size,
            data_size=data_size,
            header_size=len(hb),
            data_xxh3=self._data_hash.intdigest(),
            header_xxh3=xxhash.xxh3_64_intdigest(hb),
            flags=flags,
        )
        try:
            self._write_block(hb, self._offset)
            self._write_block(pre, 0)
            os.ftruncate(self._fd, file_size)
        except OSError as e:
            raise self._fail(e) from None
        try:
            os.fsync(self._fd)
            self._close_fds()
            os.chmod(self.tmp, 0o644)
            os.replace(self.tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as e:
            self.abort()
            raise OrkError(f"{escape_name(str(self.path))}: could not finish the pack ({_why(e)}); nothing was written at the output path") from None
        self.pool.clear()
        return self.path

    def _close_fds(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self._dfd, self._fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._dfd = None

    def abort(self) -> None:
        self._io.shutdown(wait=True, cancel_futures=True)
        self._close_fds()
        try:
            self.tmp.unlink()
        except OSError:
            pass
        self.pool.clear()

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
