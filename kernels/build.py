"""cffi out-of-line API build of orkpack's C kernels into ``orkpack._kernels``.

Every ``kernels/*.c`` is compiled into the one extension. Each kernel header
(``kernels/*.h``) marks the declarations Python may call between the lines
``/* CDEF BEGIN */`` and ``/* CDEF END */``; only those lines are given to cffi,
so the headers can keep include guards and macros for C readers.

Flags: ``-O3`` for vectorization and ``-ffp-contract=off`` everywhere, because the
kernels must be bit-identical to their numpy references (no fused multiply-add
that numpy does not do). Nothing here is specific to x86-64: the same sources
build on aarch64 (the packer also runs on the board).
"""
from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
_MARK = re.compile(r"/\* CDEF BEGIN \*/(.*?)/\* CDEF END \*/", re.S)


def _cdef_text() -> str:
    parts = []
    for h in sorted(HERE.glob("*.h")):
        for block in _MARK.findall(h.read_text()):
            parts.append(block)
    return "\n".join(parts)


def _sources() -> list[str]:
    # relative paths keep the build reproducible and setuptools happy
    return sorted(str(p.relative_to(HERE.parent)) for p in HERE.glob("*.c"))


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "orkpack._kernels",
    "\n".join(f'#include "{h.name}"' for h in sorted(HERE.glob("*.h"))),
    sources=_sources(),
    include_dirs=[str(HERE.relative_to(HERE.parent))],
    extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno", "-std=c11", "-Wall"],
    extra_link_args=["-lpthread"],
    # the stable ABI (the generated C defines Py_LIMITED_API itself), said to the build so that a by-hand build
    # names the module _kernels.abi3.so as pip install does (cffi's setuptools hook sets the same), never a second
    # _kernels.cpython-3XX-*.so that the importer would prefer; not on a debug or free-threaded CPython, where
    # cffi does not define Py_LIMITED_API
    py_limited_api=not hasattr(sys, "gettotalrefcount") and not sysconfig.get_config_var("Py_GIL_DISABLED"),
)

if __name__ == "__main__":  # developer loop: python kernels/build.py (builds in place)
    import os

    os.chdir(HERE.parent)
    ffibuilder.compile(verbose=False)
