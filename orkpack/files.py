"""What every layer may ask of a file: its identity (to refuse an output that is one of the inputs) and its xxh3."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import xxhash

_HASH_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file ``path`` names (symlinks followed), or None when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def hash_file(path: Path, window: int = 64 << 20) -> str:
    """xxh3 of a whole source file, hashed from its own pages through a moving 64 MB mapping: no copy,
    no buffer (a read into one costs ~1 s per GB on a 2-core VM), at most one window resident."""
    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        for off in range(0, size, window):
            n = min(window, size - off)
            with mmap.mmap(f.fileno(), n, flags=_HASH_MAP_FLAGS, prot=mmap.PROT_READ, offset=off) as m:
                h.update(m)
    return h.hexdigest()
