"""Writing: the source read one tensor ahead, each tensor encoded and handed to the pack writer, the source files
hashed on a side thread, the provenance last.

Pipeline: an I/O thread maps the next tensor while this one is encoded (C kernels, ``--threads`` of them, reading
bf16/f16/f32 directly), and the writer's thread writes and checksums the previous tensor's parts; side threads
hash the source files for the provenance and read the model record (config, tokenizer) for the header. The bytes
never depend on the timing or the thread count.

I/O (issue 14; bench/README.md has the profile before and after): float and raw source tensors are the source
file's own pages (``Source.mapped``: no read into a buffer, no copy); the codecs encode into the pack writer's
reused, page-aligned buffers (``alloc=w.alloc``), which go to the file with no copy, by ``O_DIRECT`` where the file
system takes it (no page cache to fill, then flush again at fsync). Fresh pages, which the kernel faults in and
zeroes, are touched once for up to twice the largest tensor's parts (one tensor encoded while the one before it
is written), not for every tensor.

Memory: tensors stream one at a time. A build maps at most two source tensors (one when the source is float32;
dequantized types are read into at most two reused buffers instead), holds the parts being encoded (int8: 1/4 of
the float32 size, NF4: ~1/7; both for a dual-resident slice: int8 tiles plus its host NF4 copy), and at most half
the largest tensor as float32 queued for writing: under 2x the largest tensor as float32, plus the interpreter
(~100 MB). tests/test_build.py and bench/bench_build.py measure it.
"""
from __future__ import annotations

from .. import archs

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..pack.writer import PackWriter
from ..sources.base import TensorInfo, is_raw
from .encode import Transforms, encode_tensor
from .inputs import Inputs, source_provenance
from .placement import Placed


@dataclass
class Written:
    """The pack written, and what is in it: (encoding, tier) -> {"slices", "bytes"} (host copies under (encoding,
    "host copy")), and the slice of the least SQNR."""
    path: Path
    by_kind: dict = field(default_factory=dict)
    worst: tuple[str, float] | None = None

    def count(self, name: str, slices: list[dict]) -> None:
        for s in slices:
            d = self.by_kind.setdefault((s["encoding"], s["tier"]), {"slices": 0, "bytes": 0})
            d["slices"] += 1
            d["bytes"] += sum(int(p.nbytes) for p in s["parts"].values())
            if s.get("host_copy") is not None:
                hc = self.by_kind.setdefault((s["host_copy"]["encoding"], "host copy"), {"slices": 0, "bytes": 0})
                hc["slices"] += 1
                hc["bytes"] += sum(int(p.nbytes) for p in s["host_copy"]["parts"].values())
            e = s["expert"]
            if s["sqnr_db"] is not None and (self.worst is None or s["sqnr_db"] < self.worst[1]):
                self.worst = (name if e is None else f"{name}[{e}]", float(s["sqnr_db"]))


def write_pack(inp: Inputs, infos: list[TensorInfo], placed: Placed, tr: Transforms, out_path: Path, *,
               threads: int, on_progress: Callable[[int, str], None] | None = None) -> Written:
    """Write ``infos`` (the source's tensors, with any untied copies) to ``out_path`` (module docstring); the pack
    appears there whole or not at all."""
    src, opts = inp.src, placed.opts
    # side threads, while the tensors are encoded: the provenance (the source files' xxh3, hashed on the inputs'
    # thread since the source was opened) and the model record (config, tokenizer; only the header needs it)
    side = ThreadPoolExecutor(max_workers=2)
    io = ThreadPoolExecutor(max_workers=1)
    try:
        provenance = side.submit(source_provenance, src, opts, tr.smoothing and tr.smoothing.provenance, inp.origin,
                                 inp.file_xxh3)  # the files' xxh3: hashing since the source was opened
        said: list[str] = []
        model = side.submit(src.model_metadata, said.append)
        done = Written(out_path)
        # parts wait for the write thread up to half the largest tensor as float32; the writer's buffers
        # (reused from tensor to tensor) can hold that plus one tensor's parts (<= 2 bytes per element)
        write_behind = max(16 << 20, 2 * max(i.numel for i in infos))
        with PackWriter(out_path, provenance=None, config=archs.header_config(src.config), tiermap=placed.tiermap,
                        write_behind=write_behind,
                        pool_bytes=2 * write_behind + (64 << 20), model=None) as w:
            for info, arr in read_ahead(src, infos, io, tr.untied):
                if model.done() and model.exception() is not None:
                    model.result()  # bad tokenizer files: the build stops here, not after the last tensor
                slices = encode_tensor(info, arr, placed, tr, threads=threads, alloc=w.alloc)
                done.count(info.name, slices)
                rot = getattr(src, "plan", None)
                w.add_tensor(info.name, info.source_name, info.shape, info.dtype, slices,
                             smoothing=None if tr.smoothing is None else tr.smoothing.records.get(info.name),
                             rotation=None if rot is None else rot.records.get(info.name))
                arr = slices = None  # drop every view of the source pages
                if on_progress:
                    on_progress(info.nbytes, info.name)
            w.set_model(model.result())
            placed.warnings += said
            prov = provenance.result() | {"nf4": placed.nf4.recorded()}
            tr.record(prov, opts)
            w.set_provenance(prov, timestamp=opts.timestamp)
            inp.info_lines += tr.info_lines(prov)
            done.path = w.finish()
    except BaseException:
        inp.stop_hashing()  # the provenance's future below need not wait for the rest of the source's xxh3
        raise
    finally:
        for pool in (side, io):
            pool.shutdown(wait=True, cancel_futures=True)
    return done


def read_ahead(src, infos: list[TensorInfo], io: ThreadPoolExecutor, alias: dict[str, str] | None = None):
    """Yield (info, array) in order; a name in ``alias`` (an untied copy) is read as the source tensor it names.

    Float and raw tensors stored in one piece are handed out as the source
    file's own pages (``src.mapped``: no copy, no buffer, nothing for the
    kernel to zero; issue 14); the others (dequantized types, experts gathered
    from several places) are read into reused buffers, made when first needed
    (fresh pages cost page faults: up to 2 s per GB on some VMs).

    When two source tensors fit in the largest tensor as float32 (16-bit
    sources), the next tensor is mapped or read on the I/O thread while this
    one is encoded (a cold file is read from disk there), alternating two
    buffers; otherwise (float32 sources) one at a time, so the memory bound of
    the module docstring holds. The caller must not keep a reference to a
    yielded array past the next step.
    """
    # the array a read returns: the stored bytes for float and raw tensors, float32 for dequantized ones
    # (FP8, MXFP4, GGUF quantized types), which are 2-8x their stored bytes
    def out_bytes(i: TensorInfo) -> int:
        return i.nbytes if i.dtype in ("F32", "F16", "BF16") or is_raw(i.dtype) else 4 * i.numel

    biggest = max(out_bytes(i) for i in infos)
    ahead = 2 * biggest <= 4 * max(i.numel for i in infos)
    bufs: list[np.ndarray | None] = [None, None]
    mapped = getattr(src, "mapped", None)

    def fetch(i: int) -> np.ndarray:
        name = (alias or {}).get(infos[i].name, infos[i].name)
        arr = mapped(name) if mapped is not None else None
        if arr is not None:
            return arr
        k = i % 2 if ahead else 0
        if bufs[k] is None:
            bufs[k] = np.empty(biggest, np.uint8)
        return src.read(name, out=bufs[k])

    if not ahead:
        for i, info in enumerate(infos):
            arr = fetch(i)
            yield info, arr
            del arr
        return
    pending = io.submit(fetch, 0)
    for i, info in enumerate(infos):
        arr = pending.result()
        if i + 1 < len(infos):
            pending = io.submit(fetch, i + 1)
        yield info, arr
        del arr  # the mapping goes with the last view of it
