"""What every layer may ask of a file: its identity (to refuse an output that is one of the inputs) and its xxh3."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import xxhash

from .errors import OrkError, escape_name

_HASH_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file ``path`` names (symlinks followed), or None when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def refuse_over_inputs(output: Path, inputs, writes: str = "the output") -> None:
    """OrkError when ``output`` is one of ``inputs`` (``(path, what)`` pairs; a path may be None), compared by
    identity (device and inode: symlinks, hard links and other spellings caught), so that no output ever
    replaces an input. Nothing at ``output`` yet: nothing to destroy."""
    target = identity(Path(output))
    if target is None:
        return
    for path, what in inputs:
        if path is not None and identity(Path(path)) == target:
            raise OrkError(f"{escape_name(str(output))}: is {what}; {writes} would replace it; give another output path")


def is_file(path) -> bool:
    """Path.is_file that says False for a path the OS refuses to look up (a name over 255 bytes: ENAMETOOLONG,
    a NUL byte), which pathlib raises for."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def exists(path) -> bool:
    """Path.exists, False for a path the OS refuses to look up (see is_file)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def option_file(value) -> Path | None:
    """The file an option that takes a name or a path names, when it is a file (else None: a shipped name)."""
    if value is None:
        return None
    p = Path(str(value))
    try:
        return p if p.is_file() else None
    except (OSError, ValueError):
        return None


def hash_file(path: Path, window: int = 64 << 20, stop=None) -> str | None:
    """xxh3 of a whole source file, hashed from its own pages through a moving 64 MB mapping: no copy,
    no buffer (a read into one costs ~1 s per GB on a 2-core VM), at most one window resident.
    ``stop()`` true (checked before each window): give up, return None (a build that failed meanwhile)."""
    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        for off in range(0, size, window):
            if stop is not None and stop():
                return None
            n = min(window, size - off)
            with mmap.mmap(f.fileno(), n, flags=_HASH_MAP_FLAGS, prot=mmap.PROT_READ, offset=off) as m:
                h.update(m)
    return h.hexdigest()
