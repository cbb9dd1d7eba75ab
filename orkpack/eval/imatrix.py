"""``orkpack imatrix``: run the source's float model on a text and gather its activation statistics (what they
are and their file format: orkpack/stats/), written where llama-quantize reads them too."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import escape_name
from ..files import identity
from ..keepfloat import is_expert_stack
from ..model import forward
from ..model.weights import SourceWeights
from ..sources import open_source
from ..sources.hub import locate
from ..stats import ActStats, save
from .collect import Collector, from_acc
from .text import PROSE, source_record, token_ids
from .weights import EvalError


GROUP_BYTES = 256 << 20  # the hidden states (float32, tokens x hidden) of the chunks run together


def gather(source, output: Path, *, revision: str | None = None, **kw) -> ActStats:
    """``orkpack imatrix``: :func:`collect` then :func:`save` to ``output``, which must not be one of the
    inputs (the source's files, the text). ``source``: a path or a hub name (``revision``: its branch, tag or
    commit; orkpack/sources/hub.py)."""
    source = locate(source, revision=revision).path
    target = identity(Path(output))
    if target is not None:
        src = open_source(source, on_warning=lambda m: None)
        try:
            files = [Path(f) for f in src.files] + ([Path(source)] if Path(source).is_file() else [])
        finally:
            src.close()
        files += [Path(kw[k]) for k in ("text", "tokens") if kw.get(k) is not None]
        if any(identity(f) == target for f in files):
            raise EvalError(f"{escape_name(str(output))}: is one of the inputs; the statistics would replace it; "
                            "give another output path")
    stats = collect(source, **kw)
    save(stats, output)
    return stats


def collect(source: Path, *, text: Path | None = None, tokens: Path | None = None, ctx: int = 512, chunks: int = 0,
            threads: int = 1, progress: Callable[[float, float, str], None] | None = None,
            rotate: tuple[int, bool] | None = None, online: bool = False, seed: int = 0) -> ActStats:
    """Run the float model of ``source`` on the text and gather its statistics (module docstring)."""
    from threadpoolctl import threadpool_limits

    if ctx < 2:
        raise EvalError(f"--ctx {ctx}: give a chunk length of at least 2 tokens")
    if chunks < 0:
        raise EvalError(f"--chunks {chunks}: give 0 (all) or a positive count")
    src = open_source(source, on_warning=lambda m: None)
    try:
        if rotate is not None or online:  # the rotated model (build --rotate: its seed and whether R2 too;
            from ..transforms.rotate import rotated  # --online-hadamard: R4 folded, ffn_down's input rotated online)

            src = rotated(src, rotate[0] if rotate else seed, rotate[1] if rotate else True, rotate=rotate is not None,
                          online=online)
        hp = forward.model_hparams(src)
        ids, bos, where = token_ids(text, tokens, source_record(src), hp.vocab, escape_name(str(source)))
        n = ids.size // ctx
        if n == 0:
            raise EvalError(f"{where}: {ids.size} tokens, fewer than one chunk of --ctx {ctx}; give a longer text or "
                            "a smaller --ctx")
        n = min(n, chunks) if chunks else n
        experts = {t.name: t.shape[0] for t in src.tensors() if is_expert_stack(t.name, t.shape)}
        acc: dict = {}
        per = hp.n_layers + -(-ctx // 128)
        # the chunks in groups run layer by layer (forward.Batch): each layer's weights read (and, rotated,
        # transformed) once per group, not once per chunk; a group's hidden states at most GROUP_BYTES. Every
        # matrix's statistics add the chunks in the same order, each chunk's numbers run()'s: the same bytes.
        group = max(1, GROUP_BYTES // max(1, 4 * ctx * hp.hidden))
        w = Collector(SourceWeights(src), acc)
        done = 0
        with threadpool_limits(limits=threads or None, user_api="blas"):
            for g0 in range(0, n, group):
                chunks = []
                for c in range(g0, min(n, g0 + group)):
                    chunk = ids[c * ctx: (c + 1) * ctx].copy()
                    if bos is not None:
                        chunk[0] = bos
                    chunks.append(chunk)
                b = forward.Batch(src, chunks, weights=w, hp=hp)
                for i in range(hp.n_layers):
                    b.layer(i)
                    done += len(chunks)
                    if progress:
                        progress(done, n * per, f"chunks {g0 + 1}-{g0 + len(chunks)}/{n}")

                def step():
                    nonlocal done
                    done += 1
                    if progress:
                        progress(done, n * per, f"chunks {g0 + 1}-{g0 + len(chunks)}/{n}")

                for k in range(len(chunks)):
                    b.logits(k, lambda t0, lg: None, chunk=128, step=step)
                b.release()
                del b
        dataset = Path(tokens).name if tokens is not None else Path(text or PROSE).name
        tag = [src.plan.tag()] if rotate is not None or online else []  # the rotation they were gathered under
        return from_acc(acc, experts, datasets=[dataset] + tag, chunk_count=n, chunk_size=ctx)
    finally:
        src.close()
