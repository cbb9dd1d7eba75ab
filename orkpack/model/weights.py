"""What the forward pass reads its weights through: a provider per run, one layer's tensors at a time.

The forward pass (:mod:`orkpack.model.forward`) never touches a file. It asks a provider for

* ``matmul(name, x, expert=None)``: ``x @ W.T`` for the matrix ``name`` (canonical GGUF-style name,
  e.g. ``blk.3.attn_q.weight``; ``expert``: one expert of a stacked ``*_exps`` tensor), ``x`` of
  shape (tokens, K) float32; the result (tokens, N) float32. Every weight product of the model goes
  through it, the router and the output head included, so a provider can run any of them in other
  numerics (a pack's int8 tiles with per-token int8 activations, NF4 host copies, ...).
* ``tensor(name)``: a small tensor (norm gain, bias, routing bias) as float32.
* ``embed(ids, name)``: the rows of the token ids of an embedding table (``token_embd.weight``, or another
  table a family declares, e.g. ``per_layer_token_embd.weight``), float32: a row lookup, never the whole table.
* ``release()``: called after each layer; a provider drops what it cached for it.

:class:`SourceWeights` is the float provider over an :mod:`orkpack.sources` reader: exact
float32 of what the source stores. It keeps the tensors one layer reads (as stored: BF16 stays
16-bit) until ``release``, and widens large matrices to float32 in row blocks, so its memory is
one layer's stored weights plus one block. ``keep=True``: it keeps every tensor it has read (``release`` keeps
them), for a caller that runs the model again and again (``orkpack generate``): the model's stored weights in memory.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import SourceError, escape_name
from ..sources.base import as_float32

_BLOCK = 1 << 22  # elements widened to float32 at a time
EMBED = "token_embd.weight"


class Weights(Protocol):
    def has(self, name: str) -> bool: ...

    def tensor(self, name: str) -> np.ndarray: ...

    def matmul(self, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray: ...

    def embed(self, ids: np.ndarray, name: str = EMBED) -> np.ndarray: ...

    def release(self) -> None: ...


class Wrapped:
    """A provider that passes everything through to ``inner``; a subclass watches or changes ``matmul``."""

    def __init__(self, inner):
        self.inner = inner

    def has(self, name: str) -> bool:
        return self.inner.has(name)

    def tensor(self, name: str) -> np.ndarray:
        return self.inner.tensor(name)

    def matmul(self, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        return self.inner.matmul(name, x, expert)

    def online_input(self, name: str, x: np.ndarray) -> np.ndarray:
        """``x`` as the matrix ``name`` reads it after the runtime's online rotation (build --online-hadamard)."""
        f = getattr(self.inner, "online_input", None)
        return f(name, x) if f is not None else x

    def embed(self, ids: np.ndarray, name: str = EMBED) -> np.ndarray:
        return self.inner.embed(ids, name)

    def release(self) -> None:
        self.inner.release()


class SourceWeights:
    """Float32 weights straight from a Source (see the module docstring)."""

    def __init__(self, source, keep: bool = False):
        self.source = source
        self._online = getattr(source, "online_input", None)  # a source with R4 folded (transforms/rotate.py)
        self.infos = {t.name: t for t in source.tensors()}
        self._cache: dict[str, np.ndarray] = {}
        self.keep = keep

    def has(self, name: str) -> bool:
        return name in self.infos

    def _raw(self, name: str) -> np.ndarray:
        a = self._cache.get(name)
        if a is None:
            if name not in self.infos:
                raise SourceError(f"{escape_name(str(self.source.root))}: tensor {escape_name(name)} is missing; "
                                  "the checkpoint is incomplete for its architecture")
            a = self.source.read(name)
            self._cache[name] = a
        return a

    def tensor(self, name: str) -> np.ndarray:
        return as_float32(self._raw(name))

    def online_input(self, name: str, x: np.ndarray) -> np.ndarray:
        """``x`` as ``name`` reads it: rotated online where the source folds R4 into it, else as given."""
        return self._online(name, x) if self._online is not None else x

    def matmul(self, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        x = self.online_input(name, x)
        w = self._raw(name)
        if expert is not None:
            w = w[expert]
        return matmul_rows(x, w)

    def embed(self, ids: np.ndarray, name: str = EMBED) -> np.ndarray:
        if name not in self.infos or self.keep:
            return as_float32(self._raw(name)[ids])  # (not there: the one-line error)
        w = self.source.read(name)  # not cached: the rows are read where a token needs them (the head reads its own)
        return as_float32(w[ids])

    def release(self) -> None:
        if not self.keep:
            self._cache.clear()

    def preload(self) -> None:
        """keep=True: read every tensor now (what the first run would read as it goes)."""
        if self.keep:
            for name in self.infos:
                self._raw(name)


def matmul_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` in float32, widening ``w`` (float16 / BF16 bits / float32) in row blocks."""
    if w.dtype == np.float32:
        return x @ w.T
    n, k = w.shape
    out = np.empty((x.shape[0], n), dtype=np.float32)
    step = max(1, _BLOCK // max(k, 1))
    for r in range(0, n, step):
        out[:, r: r + step] = x @ as_float32(w[r: r + step]).T
    return out
