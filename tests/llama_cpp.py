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
    """llama-perplexity's perplexity of ``model`` on the first ``chunks`` chunks of ``text`` (chunks of ``ctx``,
    F32 KV cache, no flash attention, one thread: orkpack eval's float32 attention), and its log: the running
    perplexity ``[chunks]x``, which is the final estimate of a run of ``chunks`` chunks. llama.cpp's asynchronous
    log loses its last lines at exit (its logger is never flushed: llama.cpp issue 22142; seen on 0c1e570 in one
    run of six, and in most runs on a loaded machine), so the run scores one chunk more than asked (``text`` must
    hold it) and reads the value printed before that last chunk's work; a run missing it is repeated, at most
    twice."""
    exe = binary_path or need("llama-perplexity")
    argv = [str(exe), "-m", str(model), "-f", str(text), "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks + 1),
            "-t", "1", "-ctk", "f32", "-ctv", "f32", "-fa", "off", *extra]
    log = ""
    for _ in range(3):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-2000:]
        assert f"over {chunks + 1} chunks" in log, f"{text} holds fewer than {chunks + 1} chunks of {ctx}: {log[-800:]}"
        m = re.search(rf"\[{chunks}\]([0-9.]+)", log)
        if m:
            return float(m.group(1)), log
    raise AssertionError(f"no perplexity of chunk {chunks} in llama-perplexity's output: {log[-1500:]}")


def tokenize(model: Path, texts: list[str], tmp: Path) -> list[list[int]]:
    """llama.cpp's own token ids of each of ``texts`` for the GGUF ``model`` (BOS as its vocabulary adds it, special
    tokens not parsed: llama-perplexity's ``common_tokenize(ctx, text, true)``), by tests/oracle/tokenize.c compiled
    here against the built libllama. Skips, saying why, without the build, its headers or a C compiler."""
    import numpy as np

    lib = next((d for d in bin_dirs() if (d / "libllama.so").is_file()), None)
    if lib is None:
        pytest.skip("llama.cpp's libllama is not built (bash scripts/build_llama_cpp.sh builds it)")
    src_tree = lib.parent.parent
    if not (src_tree / "include" / "llama.h").is_file():
        pytest.skip(f"llama.cpp's headers are not beside its build ({src_tree / 'include'})")
    cc = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler for tests/oracle/tokenize.c")
    exe = tmp / "tokenize"
    r = subprocess.run([cc, "-O2", "-o", str(exe), str(ROOT / "tests" / "oracle" / "tokenize.c"),
                        f"-I{src_tree / 'include'}", f"-I{src_tree / 'ggml' / 'include'}", f"-L{lib}", "-lllama",
                        "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = []
    for i, text in enumerate(texts):
        txt, ids = tmp / f"text{i}.txt", tmp / f"ids{i}.i32"
        txt.write_bytes(text.encode("utf-8"))
        r = subprocess.run([str(exe), str(model), str(txt), str(ids)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out.append(np.fromfile(ids, dtype=np.int32).tolist())
    return out
