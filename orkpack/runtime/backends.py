"""NPU memory backends behind one small interface: alloc(size) -> Buffer, sync(buf, offset, size)
(the clean before submit, over exactly the written range), free(buf), close().

* ``host``: ordinary process memory (numpy). Runs anywhere; the default. Its clean is the C
  kernel's (DC CVAC + DSB on aarch64, nothing on x86), so ``c_clean`` is True.
* ``rknpu``: buffers of the rknpu DRM driver (0.9.x, ``include/rknpu_ioctl.h``), on the render
  node that driver owns. alloc = MEM_CREATE (flags 0x403 = NON_CONTIGUOUS | CACHEABLE |
  IOMMU_LIMIT_IOVA_ALIGNMENT) then MEM_MAP and mmap of the DRM fd at the returned offset;
  sync = MEM_SYNC with TO_DEVICE; free = munmap then MEM_DESTROY. **Unverified on hardware**:
  the ioctl numbers and structs are tested against DESIGN.md and the backend is driven
  through a fake device in tests, but it has not yet run on a board.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from orkpack.errors import OrkError

# ---------------------------------------------------------------- rknpu ABI (DESIGN.md section 2)

_IOC_WRITE, _IOC_READ = 1, 2
DRM_IOCTL_BASE = ord("d")
DRM_COMMAND_BASE = 0x40


def _iowr(nr: int, size: int) -> int:
    return ((_IOC_READ | _IOC_WRITE) << 30) | (size << 16) | (DRM_IOCTL_BASE << 8) | nr


# struct layouts, little-endian, natural alignment (no padding: every field already aligned)
MEM_CREATE_FMT = "<IIQQQQiI"  # handle, flags, size, obj_addr, dma_addr, sram_size, iommu_domain_id, core_mask
MEM_MAP_FMT = "<IIQ"  # handle, reserved, offset
MEM_DESTROY_FMT = "<IIQ"  # handle, reserved, obj_addr
MEM_SYNC_FMT = "<IIQQQ"  # flags, reserved, obj_addr, offset, size

RKNPU_MEM_CREATE = 0x02
RKNPU_MEM_MAP = 0x03
RKNPU_MEM_DESTROY = 0x04
RKNPU_MEM_SYNC = 0x05

DRM_IOCTL_RKNPU_MEM_CREATE = _iowr(DRM_COMMAND_BASE + RKNPU_MEM_CREATE, struct.calcsize(MEM_CREATE_FMT))
DRM_IOCTL_RKNPU_MEM_MAP = _iowr(DRM_COMMAND_BASE + RKNPU_MEM_MAP, struct.calcsize(MEM_MAP_FMT))
DRM_IOCTL_RKNPU_MEM_DESTROY = _iowr(DRM_COMMAND_BASE + RKNPU_MEM_DESTROY, struct.calcsize(MEM_DESTROY_FMT))
DRM_IOCTL_RKNPU_MEM_SYNC = _iowr(DRM_COMMAND_BASE + RKNPU_MEM_SYNC, struct.calcsize(MEM_SYNC_FMT))

RKNPU_MEM_NON_CONTIGUOUS = 0x1
RKNPU_MEM_CACHEABLE = 0x2
RKNPU_MEM_IOMMU_LIMIT_IOVA_ALIGNMENT = 0x400
RKNPU_MEM_FLAGS = RKNPU_MEM_NON_CONTIGUOUS | RKNPU_MEM_CACHEABLE | RKNPU_MEM_IOMMU_LIMIT_IOVA_ALIGNMENT  # 0x403
RKNPU_MEM_SYNC_TO_DEVICE = 0x1
RKNPU_MEM_SYNC_FROM_DEVICE = 0x2

PAGE = 4096


@dataclass
class Buffer:
    size: int
    view: np.ndarray  # writable uint8[size]
    handle: int = 0
    obj_addr: int = 0
    dma_addr: int = 0
    _keep: Any = field(default=None, repr=False)


class HostBackend:
    """NPU buffers in ordinary memory (CI, any machine)."""

    name = "host"
    c_clean = True  # the fill kernel cleans each chunk itself (a no-op on x86)

    def alloc(self, size: int) -> Buffer:
        return Buffer(int(size), np.empty(int(size), dtype=np.uint8))

    def sync(self, buf: Buffer, offset: int, size: int) -> None:
        if offset < 0 or offset + size > buf.size:
            raise ValueError("sync range outside the buffer")

    def free(self, buf: Buffer) -> None:
        buf.view = None

    def close(self) -> None:
        pass


def _default_mmap(fd: int, size: int, offset: int):
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)


def _default_ioctl(fd: int, request: int, arg: bytearray) -> int:
    import fcntl

    return fcntl.ioctl(fd, request, arg, True)


class RknpuBackend:
    """NPU buffers from the rknpu DRM driver. ``opener``, ``ioctl``, ``mmapper`` and ``closer`` are
    injectable so tests can drive it through a fake device."""

    name = "rknpu"
    c_clean = False  # the clean is MEM_SYNC TO_DEVICE over the written range

    def __init__(
        self,
        node: str | os.PathLike,
        *,
        opener: Callable[[str, int], int] = os.open,
        ioctl: Callable[[int, int, bytearray], int] = _default_ioctl,
        mmapper: Callable[[int, int, int], Any] = _default_mmap,
        closer: Callable[[int], None] = os.close,
        iommu_domain_id: int = 0,
    ):
        self.node = str(node)
        self._ioctl, self._mmap, self._close = ioctl, mmapper, closer
        self.domain = int(iommu_domain_id)
        try:
            self.fd = opener(self.node, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise OrkError(f"{self.node}: cannot open the rknpu device ({e.strerror}); use --device host") from None

    def _call(self, request: int, fmt: str, *fields) -> tuple:
        arg = bytearray(struct.pack(fmt, *fields))
        try:
            self._ioctl(self.fd, request, arg)
        except OSError as e:
            raise OrkError(f"{self.node}: rknpu ioctl 0x{request:08X} failed ({e.strerror})") from None
        return struct.unpack(fmt, arg)

    def alloc(self, size: int) -> Buffer:
        size = int(size)
        span = -(-max(size, 1) // PAGE) * PAGE
        handle, _, _, obj_addr, dma_addr, _, _, _ = self._call(
            DRM_IOCTL_RKNPU_MEM_CREATE, MEM_CREATE_FMT, 0, RKNPU_MEM_FLAGS, span, 0, 0, 0, self.domain, 0
        )
        try:
            _, _, offset = self._call(DRM_IOCTL_RKNPU_MEM_MAP, MEM_MAP_FMT, handle, 0, 0)
            mm = self._mmap(self.fd, span, offset)
        except BaseException:
            self._call(DRM_IOCTL_RKNPU_MEM_DESTROY, MEM_DESTROY_FMT, handle, 0, obj_addr)
            raise
        view = np.frombuffer(mm, dtype=np.uint8, count=size)
        return Buffer(size, view, handle, obj_addr, dma_addr, _keep=mm)

    def sync(self, buf: Buffer, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > buf.size:
            raise ValueError("sync range outside the buffer")
        self._call(DRM_IOCTL_RKNPU_MEM_SYNC, MEM_SYNC_FMT, RKNPU_MEM_SYNC_TO_DEVICE, 0, buf.obj_addr, offset, size)

    def free(self, buf: Buffer) -> None:
        buf.view = None  # drop our export of the mapping before unmapping it
        mm, buf._keep = buf._keep, None
        if mm is not None and hasattr(mm, "close"):
            try:
                mm.close()
            except BufferError:  # a view is still alive somewhere; the mapping goes when it does
                pass
        self._call(DRM_IOCTL_RKNPU_MEM_DESTROY, MEM_DESTROY_FMT, buf.handle, 0, buf.obj_addr)

    def close(self) -> None:
        if self.fd is not None and self.fd >= 0:
            self._close(self.fd)
            self.fd = -1


def find_rknpu_node(sys_drm: str | os.PathLike = "/sys/class/drm", dev_dri: str | os.PathLike = "/dev/dri") -> str | None:
    """The /dev/dri/renderD* node whose driver is rknpu, or None."""
    sys_drm, dev_dri = Path(sys_drm), Path(dev_dri)
    try:
        nodes = sorted(p.name for p in sys_drm.iterdir() if p.name.startswith("renderD"))
    except OSError:
        return None
    for name in nodes:
        dev = sys_drm / name / "device"
        driver = ""
        try:
            driver = os.path.basename(os.readlink(dev / "driver"))
        except OSError:
            try:
                for line in (dev / "uevent").read_text().splitlines():
                    if line.startswith("DRIVER="):
                        driver = line[7:]
            except OSError:
                pass
        if driver.lower() == "rknpu" and (dev_dri / name).exists():
            return str(dev_dri / name)
    return None


def open_backend(device: str = "auto", **rknpu_kw):
    """``auto`` picks rknpu when its render node exists, else host."""
    if device == "host":
        return HostBackend()
    if device not in ("auto", "rknpu"):
        raise OrkError(f"--device {device!r}: choose auto, host or rknpu")
    node = rknpu_kw.pop("node", None) or find_rknpu_node()
    if node is None:
        if device == "rknpu":
            raise OrkError("--device rknpu: no rknpu render node (/dev/dri/renderD*) on this machine; use --device host")
        return HostBackend()
    return RknpuBackend(node, **rknpu_kw)
