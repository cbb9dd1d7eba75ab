"""The build's inputs: the source opened and its tensors listed (the ones a cluster node builds), refusing an
output path that is one of the inputs, the derivable buffers the reader left out, and the provenance of it all.

Every source tensor is accounted for: float tensors are placed (tier map or rules) and encoded; non-float
tensors (bool, integers, f64, c64) are carried raw on the host, before any placement is asked
(:func:`orkpack.build.placement.raw_decision`); buffers the config derives (``position_ids``,
``rotary_emb.inv_freq``, GPT-2 causal masks: orkpack/sources/derivable.py) are left out by the reader, named in
one info line and recorded in ``provenance.skipped``.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OrkError, SourceError, escape_name
from ..files import hash_file, identity
from ..pack import spec
from ..sources import open_source
from ..sources.base import Skipped, TensorInfo
from ..sources.hub import Located, Origin, locate
from .options import BuildOptions


@dataclass
class Inputs:
    """An opened source and what the build takes of it."""
    path: Path
    src: object  # orkpack.sources.base.Source
    infos: list[TensorInfo]
    skipped: list[Skipped]
    late: list[str] = field(default_factory=list)  # what the source says while it is read: into the result, not stderr
    info_lines: list[str] = field(default_factory=list)
    origin: Origin | None = None  # where a hub model came from (provenance.hub)
    _hashing: ThreadPoolExecutor | None = None
    _hashes: dict = field(default_factory=dict)  # source file -> Future of its xxh3
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def located(self) -> Located:
        """The source as the planner takes it: its path with its hub origin."""
        return Located(self.path, self.origin)

    def start_hashing(self) -> None:
        """Hash the source files on a side thread from now on (xxhash releases the GIL): while the build plans
        and encodes, so the provenance's xxh3 never holds up the first tensor (issue 26)."""
        if self._hashing is None:
            self._hashing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orkpack-hash")
            stop = self._stop.is_set
            self._hashes = {Path(f): self._hashing.submit(hash_file, Path(f), stop=stop) for f in self.src.files}

    def file_xxh3(self, path: Path) -> str | None:
        """A source file's xxh3 (hex): the side thread's, or hashed here."""
        fut = self._hashes.get(Path(path))
        return fut.result() if fut is not None else hash_file(Path(path))

    def stop_hashing(self) -> None:
        """A build that fails: the side thread gives up before its next window (no wait for the rest of a
        large file); :meth:`file_xxh3` is then None."""
        self._stop.set()

    def close(self) -> None:
        if self._hashing is not None:
            self.stop_hashing()
            self._hashing.shutdown(wait=True, cancel_futures=True)
        self.src.close()


def open_inputs(src_path, out_path: Path, opts: BuildOptions, select: set[str] | None = None) -> Inputs:
    """Open the source (a path or a :class:`~orkpack.sources.hub.Located`), refuse an output that is one of the
    inputs, list its tensors (only ``select``'s, for a cluster node); OrkError (one line) for bad input, with the
    source closed again."""
    late: list[str] = []
    loc = locate(src_path)
    src_path = loc.path
    src = open_source(src_path, on_warning=late.append)
    try:
        refuse_overwriting_inputs(out_path, src, Path(src_path), opts)
        if opts.rotate or opts.online_hadamard:  # the rotated model is the source from here on (transforms/rotate.py)
            from ..transforms.rotate import rotated

            src = rotated(src, opts.rotate_seed, opts.rotate_heads, rotate=opts.rotate, online=opts.online_hadamard)
        infos = src.tensors()
        if select is not None:
            infos = [i for i in infos if i.name in select]
        if not infos:
            raise SourceError(f"{escape_name(str(src_path))}: no tensors found")
        for i in infos:
            if len(i.shape) > spec.MAX_DIMS:
                raise SourceError(f"{escape_name(i.source_name)}: {len(i.shape)} dimensions {i.shape}; a pack holds "
                                  f"tensors of at most {spec.MAX_DIMS} dimensions")
        skipped = skipped_of(src)
    except BaseException:
        src.close()
        raise
    inp = Inputs(Path(src_path), src, infos, skipped, late, [line] if (line := skipped_line(skipped)) else [],
                 loc.origin)
    inp.start_hashing()
    return inp


def build_inputs(src, src_path: Path, opts: BuildOptions) -> list[tuple[Path, str]]:
    """Every file a build reads, as (path, what it is): the source's weight files; for a model folder
    every other file in it too (config, index, tokenizer, ...; previous ``*.orkpack`` packs excepted);
    a lone .safetensors file's config.json beside it; the --tiermap, --profile, --board, --runtime and --imatrix
    files."""
    out = [(Path(f), "a weight file of the source") for f in src.files]
    root = Path(src_path)
    if root.is_dir():
        try:
            listing = sorted(root.iterdir())
        except OSError:
            listing = []
        out += [(q, "a file of the source model folder") for q in listing
                if not q.name.endswith(".orkpack") and q.is_file()]
    elif src.kind == "safetensors":
        out.append((root.parent / "config.json", "the config.json of the source"))
    for flag, p in (("--tiermap", opts.tiermap), ("--profile", opts.profile), ("--board", opts.board),
                    ("--runtime", opts.runtime), ("--imatrix", opts.imatrix)):
        if p is not None and Path(p).is_file():
            out.append((Path(p), f"the {flag} file"))
    return out


def refuse_overwriting_inputs(out_path: Path, src, src_path: Path, opts: BuildOptions) -> None:
    """OrkError when ``out_path`` is one of the build's own input files, compared by identity (device and
    inode), so a symlink, a hard link or another spelling of the path is caught as well as the same name.
    Writing the pack there would replace the user's model (often the only copy) with the pack."""
    target = identity(out_path)
    if target is None:  # nothing there yet: nothing to destroy
        return
    for path, what in build_inputs(src, src_path, opts):
        if identity(path) == target:
            same = "" if os.path.abspath(path) == os.path.abspath(out_path) else f" ({escape_name(str(path))})"
            raise OrkError(f"{escape_name(str(out_path))}: is {what}{same}; the pack would replace it; "
                           "give another output path")


def skipped_of(src) -> list[Skipped]:
    """The source's derivable buffers left out of its tensors (sources/derivable.py), from its headers."""
    fn = getattr(src, "skipped", None)
    return list(fn()) if fn is not None else []


def skipped_line(skipped: list[Skipped], per_reason: int = 4) -> str | None:
    """One line naming the dropped buffers, grouped by reason (at most ``per_reason`` names each; the
    pack's provenance.skipped and ``orkpack inspect`` list them all). None when nothing was dropped."""
    if not skipped:
        return None
    groups: dict[str, list[str]] = {}
    for s in skipped:
        groups.setdefault(s.reason, []).append(escape_name(s.name, 80))
    bits = []
    for reason, names in groups.items():
        shown = names if len(names) <= per_reason else names[: per_reason - 1] + ["...", names[-1]]
        what = reason.split(":")[0]
        bits.append(f"{what}{f' x{len(names)}' if len(names) > 1 else ''}: {', '.join(shown)}")
    n = len(skipped)
    return (f"dropped {n} tensor{'s' if n != 1 else ''} that are not weights (buffers the runtime derives from "
            f"the config, activation scales; listed in the pack's provenance.skipped): " + "; ".join(bits))


def source_provenance(src, opts: BuildOptions, smoothing: dict | None = None, origin: Origin | None = None,
                      xxh3=hash_file) -> dict:
    """The header's provenance of the source (docs/FORMAT.md section 2); ``origin``: a hub model's (provenance.hub);
    ``xxh3(path)``: a source file's hash (default: hashed here; a build's :meth:`Inputs.file_xxh3`)."""
    plan = getattr(src, "plan", None)  # a rotated source (orkpack/transforms/rotate.py)
    return {
        "source_format": src.kind,
        "sources": [{"file": f.name, "size": f.stat().st_size, "xxh3": xxh3(f)} for f in src.files],
        "arch": src.arch,
        "options": opts.recorded(),
        "skipped": [s.to_json() for s in skipped_of(src)],
    } | ({} if origin is None else {"hub": origin.recorded()}) \
        | ({} if smoothing is None else {"smoothing": smoothing}) \
        | ({} if plan is None else {"rotation": plan.provenance})
