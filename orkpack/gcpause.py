"""Python's cyclic garbage collector paused around work that makes many small objects and no reference cycles."""
from __future__ import annotations

import functools
import gc


def without_gc(fn):
    """Run ``fn`` with Python's cyclic garbage collector paused (issue 26). A plan of an 18,626-item MoE makes some
    10^5 small objects (items, rows, tuples, decisions), a GGUF header with a 49k-token vocabulary and its merges
    ~3 x 10^5 (gguf-py's fields: one array view per part); they form no reference cycles, and the collector's
    passes over them, triggered by their number alone, were ~15 % of the planning and ~7 % of the CPU time of
    opening such a GGUF.
    Reference counting frees them as ever; whatever cycles there are wait for the collector's next pass after.
    Nested calls keep it paused until the outermost returns. When it resumes, what the call left alive is moved to
    the collector's oldest generation (gc.freeze then gc.unfreeze, when nothing else is frozen): the young
    generation's pass that the allocations made meanwhile trigger right away would otherwise examine every one of
    them (~5 ms after a plan of that MoE, its imports included); the next full pass still examines them all."""
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*a, **kw)
        finally:
            if was:
                if not gc.get_freeze_count():
                    gc.freeze()
                    gc.unfreeze()
                gc.enable()

    return wrapper
