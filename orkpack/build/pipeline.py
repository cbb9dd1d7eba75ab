"""``build()``: the build's stages in order (the package docstring names them)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..sources.hub import locate
from ..transforms.nf4 import choose as choose_nf4
from . import encode, options
from .inputs import open_inputs
from .options import BuildOptions
from .placement import place
from .write import write_pack


@dataclass
class BuildResult:
    path: Path
    tensors: int
    source_bytes: int
    pack_bytes: int
    seconds: float
    by_kind: dict  # (encoding, tier) -> {"slices": n, "bytes": b}; host copies under (encoding, "host copy")
    worst_sqnr: tuple[str, float] | None
    warnings: list[str]
    info: list[str] = field(default_factory=list)  # lines for people that are not warnings (dropped buffers)
    skipped: list[dict] = field(default_factory=list)  # provenance.skipped: derivable buffers left out

    @property
    def gbps(self) -> float:
        return self.source_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def build(
    src_path: Path,
    out_path: Path,
    opts: BuildOptions,
    *,
    on_start: Callable[[int], None] | None = None,
    on_open: Callable[[], None] | None = None,
    on_progress: Callable[[int, str], None] | None = None,
    placement_map=None,
    select: set[str] | None = None,
) -> BuildResult:
    """Build ``out_path`` from the checkpoint at ``src_path`` (a path, or a hub name downloaded into or found in
    huggingface_hub's cache: orkpack/sources/hub.py). Raises OrkError on bad input, with nothing written.

    ``placement_map`` (a TierMap) and ``select`` (tensor names) build one node of a cluster
    (orkpack/build/cluster.py): only the selected tensors, placed by that node's tier map. ``on_open()`` is called
    once the source is open (a hub model downloaded: huggingface_hub's own bars are done), before planning;
    ``on_start(total)`` before encoding, with the bytes ``on_progress(n, tensor)`` will count."""
    t0 = time.perf_counter()
    out_path = Path(out_path)
    options.check(opts, out_path)
    nf4 = choose_nf4(opts.nf4_mode, opts.nf4_weighting, opts.imatrix, opts.nf4_format, opts.host_low,
                     opts.host_high)  # bad --imatrix: one line
    inp = open_inputs(locate(src_path, revision=opts.revision), out_path, opts, select)
    try:
        if on_open:
            on_open()
        placed = place(inp, opts, nf4, placement_map)
        tr = encode.prepare(inp, placed, placed.opts)
        placed.nf4.smoothing = tr.smoothing  # the NF4 search weighs smoothed matrices' columns by smoothed statistics
        infos = placed.untie(inp.infos, tr.untied)  # the smoothed head copy, written right after its original
        if on_start:
            on_start(sum(i.nbytes for i in infos))
        done = write_pack(inp, infos, placed, tr, out_path, threads=opts.resolved_threads(), on_progress=on_progress)
    finally:
        inp.close()
    nf4_said = placed.nf4.warning()
    return BuildResult(
        path=done.path,
        tensors=len(infos),
        source_bytes=sum(i.nbytes for i in inp.infos),
        pack_bytes=done.path.stat().st_size,
        seconds=time.perf_counter() - t0,
        by_kind=done.by_kind,
        worst_sqnr=done.worst,
        warnings=list(dict.fromkeys(placed.warnings + inp.late + ([nf4_said] if nf4_said else []))),  # a plan may say one twice
        info=inp.info_lines,
        skipped=[s.to_json() for s in inp.skipped],
    )
