"""llama.cpp's own binaries for the tests that run them (export, the loopback cluster): found in one place.

Where: ``$ORKPACK_LLAMA_CPP_BIN`` (a folder), else ``$ORKPACK_LLAMA_CPP/build/bin`` (the source tree
scripts/build_llama_cpp.sh builds), else this checkout's ``.cache/llama.cpp/build/bin``, else the PATH. A test
that needs a binary that is not there skips and says which and where it looked.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the RPC server's name: ggml-rpc-server since llama.cpp renamed it (0c1e570 builds that), rpc-server before
RPC_SERVER = ("ggml-rpc-server", "rpc-server")


def bin_dirs() -> list[Path]:
    out = []
    if os.environ.get("ORKPACK_LLAMA_CPP_BIN"):
        out.append(Path(os.environ["ORKPACK_LLAMA_CPP_BIN"]))
    if os.environ.get("ORKPACK_LLAMA_CPP"):
        out.append(Path(os.environ["ORKPACK_LLAMA_CPP"]) / "build" / "bin")
    out.append(ROOT / ".cache" / "llama.cpp" / "build" / "bin")
    return out


def binary(*names: str) -> Path | None:
    """The first of ``names`` found (see the module docstring), or None."""
    for d in bin_dirs():
        for n in names:
            if (d / n).is_file() and os.access(d / n, os.X_OK):
                return d / n
    for n in names:
        w = shutil.which(n)
        if w:
            return Path(w)
    return None


def need(*names: str) -> Path:
    b = binary(*names)
    if b is None:
        pytest.skip(f"llama.cpp's {' / '.join(names)} not found (looked in $ORKPACK_LLAMA_CPP_BIN, "
                    f"$ORKPACK_LLAMA_CPP/build/bin, {ROOT / '.cache/llama.cpp/build/bin'}, PATH; "
                    "bash scripts/build_llama_cpp.sh builds them)")
    return b


def perplexity(model: Path, text: Path, ctx: int, chunks: int, *extra: str, binary_path: Path | None = None,
               timeout: float = 600) -> tuple[float, str]:
    """llama-perplexity's final perplexity of ``model`` on ``text`` (chunks of ``ctx``, F32 KV cache, no flash
    attention, one thread: orkpack eval's float32 attention), and its log. The value is the last chunk's running
    perplexity ``[chunks]x``, which is the final estimate; llama.cpp's asynchronous log can lose its last lines
    at exit (seen on 0c1e570: one run in six lacked them, more often on a loaded machine), so a run missing it is
    repeated, at most five times; the "Final estimate: PPL = " line is read as well where the running value was lost."""
    exe = binary_path or need("llama-perplexity")
    argv = [str(exe), "-m", str(model), "-f", str(text), "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks),
            "-t", "1", "-ctk", "f32", "-ctv", "f32", "-fa", "off", *extra]
    log = ""
    for _ in range(6):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-2000:]
        m = re.search(rf"\[{chunks}\]([0-9.]+)", log) or re.search(r"Final estimate: PPL = ([0-9.]+)", log)
        if m:
            return float(m.group(1)), log
    raise AssertionError(f"no perplexity of chunk {chunks} in llama-perplexity's output: {log[-1500:]}")
