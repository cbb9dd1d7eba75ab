"""The IOVA arena and the NPU memory backends; the rknpu backend through a fake device."""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from orkpack.errors import OrkError
from orkpack.runtime import backends as B
from orkpack.runtime.arena import DEFAULT_IOVA_CAP, IOVA_SPACE, Arena, ArenaFull, cap_from_header

DESIGN = Path(__file__).resolve().parents[2] / "shared" / "DESIGN.md"


def _iowr(nr, size):  # Linux _IOWR(type, nr, size), written out independently of the module
    return (3 << 30) | (size << 16) | (ord("d") << 8) | nr


def test_ioctl_numbers_and_struct_sizes():
    assert struct.calcsize(B.MEM_CREATE_FMT) == 48
    assert struct.calcsize(B.MEM_MAP_FMT) == 16
    assert struct.calcsize(B.MEM_DESTROY_FMT) == 16
    assert struct.calcsize(B.MEM_SYNC_FMT) == 32
    assert B.DRM_IOCTL_RKNPU_MEM_CREATE == _iowr(0x40 + 2, 48) == 0xC0306442
    assert B.DRM_IOCTL_RKNPU_MEM_MAP == _iowr(0x40 + 3, 16) == 0xC0106443
    assert B.DRM_IOCTL_RKNPU_MEM_DESTROY == _iowr(0x40 + 4, 16) == 0xC0106444
    assert B.DRM_IOCTL_RKNPU_MEM_SYNC == _iowr(0x40 + 5, 32) == 0xC0206445
    assert B.RKNPU_MEM_FLAGS == 0x403 and B.RKNPU_MEM_SYNC_TO_DEVICE == 0x1


def test_struct_field_offsets_match_the_driver():
    import ctypes

    class MemCreate(ctypes.Structure):  # include/rknpu_ioctl.h, driver 0.9.8
        _fields_ = [("handle", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("size", ctypes.c_uint64),
                    ("obj_addr", ctypes.c_uint64), ("dma_addr", ctypes.c_uint64), ("sram_size", ctypes.c_uint64),
                    ("iommu_domain_id", ctypes.c_int32), ("core_mask", ctypes.c_uint32)]

    class MemSync(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("obj_addr", ctypes.c_uint64),
                    ("offset", ctypes.c_uint64), ("size", ctypes.c_uint64)]

    assert ctypes.sizeof(MemCreate) == 48 and ctypes.sizeof(MemSync) == 32
    raw = struct.pack(B.MEM_CREATE_FMT, 1, 0x403, 2, 3, 4, 5, -6, 7)
    c = MemCreate.from_buffer_copy(raw)
    assert (c.handle, c.flags, c.size, c.obj_addr, c.dma_addr, c.sram_size, c.iommu_domain_id, c.core_mask) == (
        1, 0x403, 2, 3, 4, 5, -6, 7)
    s = MemSync.from_buffer_copy(struct.pack(B.MEM_SYNC_FMT, 1, 0, 9, 10, 11))
    assert (s.flags, s.obj_addr, s.offset, s.size) == (1, 9, 10, 11)


@pytest.mark.skipif(not DESIGN.exists(), reason="shared/DESIGN.md is not beside the repository")
def test_numbers_match_design_md():
    text = DESIGN.read_text()
    for name, value in [("MEM_CREATE", B.DRM_IOCTL_RKNPU_MEM_CREATE), ("MEM_MAP", B.DRM_IOCTL_RKNPU_MEM_MAP),
                        ("MEM_DESTROY", B.DRM_IOCTL_RKNPU_MEM_DESTROY), ("MEM_SYNC", B.DRM_IOCTL_RKNPU_MEM_SYNC)]:
        m = re.search(name + r"\s+(0x[0-9A-Fa-f]{8})", text)
        assert m and int(m.group(1), 16) == value, name
    assert "0x403 = NON_CONTIGUOUS | CACHEABLE" in text.replace("**", "")
    sizes = dict(re.findall(r"struct rknpu_(mem_create)`,\s*(\d+) bytes", text))
    assert int(sizes["mem_create"]) == struct.calcsize(B.MEM_CREATE_FMT)


class FakeRknpu:
    """A stand-in for the rknpu render node: records every ioctl and hands out bytearray 'mappings'."""

    def __init__(self):
        self.calls, self.objects, self.next_handle, self.closed = [], {}, 1, []
        self.fd = 77

    def open(self, path, flags):
        assert flags & os.O_RDWR
        self.path = path
        return self.fd

    def close(self, fd):
        self.closed.append(fd)

    def ioctl(self, fd, req, arg):
        assert fd == self.fd and isinstance(arg, bytearray)
        if req == B.DRM_IOCTL_RKNPU_MEM_CREATE:
            f = list(struct.unpack(B.MEM_CREATE_FMT, arg))
            h = self.next_handle
            self.next_handle += 1
            f[0], f[3], f[4] = h, 0xFFFF000000 + h * 0x100000, 0xF0000000 - h * 0x100000
            self.objects[h] = {"size": f[2], "obj_addr": f[3], "mem": bytearray(f[2])}
            arg[:] = struct.pack(B.MEM_CREATE_FMT, *f)
            self.calls.append(("create", f[1], f[2], f[6]))
        elif req == B.DRM_IOCTL_RKNPU_MEM_MAP:
            h, _, _ = struct.unpack(B.MEM_MAP_FMT, arg)
            arg[:] = struct.pack(B.MEM_MAP_FMT, h, 0, h << 32)
            self.calls.append(("map", h))
        elif req == B.DRM_IOCTL_RKNPU_MEM_SYNC:
            flags, _, obj, off, size = struct.unpack(B.MEM_SYNC_FMT, arg)
            self.calls.append(("sync", flags, obj, off, size))
        elif req == B.DRM_IOCTL_RKNPU_MEM_DESTROY:
            h, _, obj = struct.unpack(B.MEM_DESTROY_FMT, arg)
            assert self.objects.pop(h)["obj_addr"] == obj
            self.calls.append(("destroy", h))
        else:
            raise OSError(22, "Invalid argument")
        return 0

    def mmap(self, fd, size, offset):
        h = offset >> 32
        assert fd == self.fd and size == self.objects[h]["size"]
        self.calls.append(("mmap", h, size))
        return self.objects[h]["mem"]

    def backend(self):
        return B.RknpuBackend("/dev/dri/renderD129", opener=self.open, ioctl=self.ioctl, mmapper=self.mmap, closer=self.close)


def test_rknpu_backend_through_a_fake_device():
    dev = FakeRknpu()
    be = dev.backend()
    buf = be.alloc(5000)
    assert buf.size == 5000 and buf.view.size == 5000 and buf.view.flags.writeable
    buf.view[:] = 7
    be.sync(buf, 0, 5000)
    obj = buf.obj_addr
    be.free(buf)
    be.close()
    assert dev.calls == [("create", 0x403, 8192, 0), ("map", 1), ("mmap", 1, 8192), ("sync", 1, obj, 0, 5000), ("destroy", 1)]
    assert dev.objects == {} and dev.closed == [77]
    with pytest.raises(ValueError):
        dev.backend().sync(B.Buffer(10, np.zeros(10, np.uint8)), 4, 7)


def test_rknpu_ioctl_failure_is_one_line():
    dev = FakeRknpu()

    def bad_ioctl(fd, req, arg):
        raise OSError(12, "Cannot allocate memory")

    be = B.RknpuBackend("/dev/dri/renderD129", opener=dev.open, ioctl=bad_ioctl, mmapper=dev.mmap, closer=dev.close)
    with pytest.raises(OrkError, match="0xC0306442"):
        be.alloc(100)


def test_find_rknpu_node(tmp_path):
    sysd, devd = tmp_path / "sys", tmp_path / "dev"
    devd.mkdir()
    for name, drv in [("renderD128", "panfrost"), ("renderD129", "RKNPU")]:
        d = sysd / name / "device"
        d.mkdir(parents=True)
        (tmp_path / "drivers" / drv).mkdir(parents=True)
        os.symlink(tmp_path / "drivers" / drv, d / "driver")
        (devd / name).touch()
    assert B.find_rknpu_node(sysd, devd) == str(devd / "renderD129")
    assert B.find_rknpu_node(tmp_path / "nope", devd) is None
    (devd / "renderD129").unlink()
    assert B.find_rknpu_node(sysd, devd) is None


def test_open_backend_choice():
    dev = FakeRknpu()
    be = B.open_backend("rknpu", node="/dev/dri/renderD129", opener=dev.open, ioctl=dev.ioctl, mmapper=dev.mmap, closer=dev.close)
    assert be.name == "rknpu"
    assert B.open_backend("host").name == "host"
    if B.find_rknpu_node() is None:
        assert B.open_backend("auto").name == "host"
        with pytest.raises(OrkError, match="rknpu"):
            B.open_backend("rknpu")
    with pytest.raises(OrkError):
        B.open_backend("gpu")


def test_arena_alignment_and_cap():
    a = Arena(cap=3 * 4096)
    p1 = a.place("a", 1)
    p2 = a.place("b", 4097)
    assert (p1.offset, p1.span, p2.offset, p2.span) == (0, 4096, 4096, 8192)
    with pytest.raises(ArenaFull, match="c: needs 4096"):
        a.place("c", 10)
    assert a.used == 3 * 4096 and a.free == 0
    assert DEFAULT_IOVA_CAP == IOVA_SPACE - (104 << 20) and DEFAULT_IOVA_CAP % 4096 == 0
    assert 3.85 * 2**30 < DEFAULT_IOVA_CAP < 3.95 * 2**30  # DESIGN.md: about 3.9 GiB usable


def test_cap_from_header():
    assert cap_from_header({"tiermap": None})[0] == DEFAULT_IOVA_CAP
    assert cap_from_header({"tiermap": {"board": {"iova_usable_bytes": 1 << 30}}}) == (1 << 30, "tiermap.board.iova_usable_bytes")
    assert cap_from_header({"tiermap": {"board": {"iova_usable_bytes": True}}})[0] == DEFAULT_IOVA_CAP
    assert cap_from_header({"tiermap": {"board": {"iova_usable_bytes": 1 << 40}}})[0] == DEFAULT_IOVA_CAP
