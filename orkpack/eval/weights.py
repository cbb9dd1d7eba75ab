"""Weight providers (orkpack.model.weights.Weights) that run a pack, or a llama.cpp GGUF, in the board's numerics.

:class:`PackWeights` reads an :class:`orkpack.pack.reader.Pack` one layer at a time and runs every
matmul the way one path of the board runs it (docs/EVAL.md):

* ``path="prefill"`` (a chunk of M tokens): an NPU slice with ``M >= min_m`` is its int8 image (the
  ``q`` tiles de-tiled, or an nf4-stored slice inflated as FORMAT.md 5 defines it) against int8
  activations (:func:`numerics.int8_act`, per token or per tensor), products accumulated exactly and
  rescaled by both scales; below ``min_m`` it takes its CPU path (below).
* ``path="decode"`` (M = 1): every matmul on the CPU.
* the CPU path of a slice: a dual-resident slice's host NF4 copy; an NPU slice without one, its int8
  image (the CPU reads the tiles); a host slice as stored (int8, nf4, or float). With ``cpu_act="q8"``
  the activations of a quantized (int8 / nf4 / nf4dq / int5dq / int6dq / int8dq) weight are llama.cpp's Q8_0 blocks; float-kept
  weights always take float activations.

The embedding rows come from the CPU copy of the table (``token_embd.weight``, or a family's other tables) on both paths (a row lookup is a
CPU operation). Weights are dequantized in row blocks from the mapped file: memory is one layer's
int8 images plus one block of float32.

:class:`GGUFWeights` runs a (quantized) GGUF as llama.cpp's CPU backend does: each weight
dequantized by gguf-py, its activations converted to the weight type's ``vec_dot_type``
(:func:`numerics.llama_cpp_act`).

``keep=True`` (``orkpack generate``, which runs every matrix again for every token): each matrix is decoded to
float32 once and kept, across layers and runs (``release`` keeps it): the same products, decoded once instead of once
a token; the memory of the model's matrices in float32.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..codecs import get_codec, rows
from ..errors import OrkError, escape_name
from ..model.weights import EMBED, SourceWeights
from ..pack import spec
from ..pack.reader import Pack
from . import numerics

_BLOCK = 1 << 22  # weight elements dequantized to float32 at a time

PATHS = ("prefill", "decode")
ACT_SCHEMES = ("token", "tensor", "float")  # float: NPU weights with unquantized activations (to split the costs)
CPU_ACTS = ("float", "q8")


class EvalError(OrkError):
    pass


class _Operand:
    """One slice as a matmul runs it: ``rows(r0, r1)`` gives float32 weight rows; ``int8`` (q, scale)
    when it runs as int8 x int8 on the NPU; ``quantized``: the CPU quantizes its activations."""

    def __init__(self, n: int, k: int, rows: Callable[[int, int], np.ndarray], *, int8=None, quantized=False,
                 engine="cpu"):
        self.n, self.k, self.rows, self.int8, self.quantized, self.engine = n, k, rows, int8, quantized, engine
        self.dense: np.ndarray | None = None  # every row decoded (PackWeights keep=True)

    def decoded(self) -> "_Operand":
        """This operand with its rows decoded once and kept (float32 [n, k])."""
        if self.dense is None:
            self.dense = np.ascontiguousarray(self.rows(0, self.n), dtype=np.float32)
            self.rows = lambda r0, r1: self.dense[r0:r1]
        return self

    def matmul(self, x: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            return x @ self.dense.T
        out = np.empty((x.shape[0], self.n), dtype=np.float32)
        step = max(1, _BLOCK // max(self.k, 1))
        for r in range(0, self.n, step):
            out[:, r: r + step] = x @ self.rows(r, min(self.n, r + step)).T
        return out


from ..transforms.rotate import rotate_input  # noqa: E402


class PackWeights:
    """The board's numerics of one path over a pack (see the module docstring)."""

    def __init__(self, pack: Pack, path: str, *, m: int = 512, act: str = "token", cpu_act: str = "float",
                 on_matmul: Callable[[str, int | None, str], None] | None = None, keep: bool = False):
        if path not in PATHS or act not in ACT_SCHEMES or cpu_act not in CPU_ACTS:
            raise EvalError(f"unknown numerics: path {path!r}, activations {act!r}, CPU activations {cpu_act!r}")
        self.pack, self.path, self.m, self.act, self.cpu_act = pack, path, int(m), act, cpu_act
        self.on_matmul = on_matmul
        self.keep = keep
        self._tables: dict[str, _Operand] = {}  # keep=True: the embedding tables' decoded rows
        self._slices: dict[tuple[str, int | None], tuple[dict, dict]] = {}
        for t, s in pack.slices():
            self._slices[(t["name"], s["expert"])] = (t, s)
        self._names = {t["name"] for t in pack.tensors}
        self._cache: dict[tuple[str, int | None], _Operand] = {}
        from ..transforms.rotate import online_of
        self.r4 = online_of(pack)  # the pack's online R4 (preamble flag bit 0), applied before every ffn_down

    # -- the provider protocol ---------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self._names

    def _slice(self, name: str, expert: int | None) -> dict:
        ts = self._slices.get((name, expert))
        if ts is None:
            what = name if expert is None else f"{name}[{expert}]"
            raise EvalError(f"{escape_name(str(self.pack.path))}: tensor {escape_name(what)} is missing; the pack does "
                            "not hold this model's weights")
        return ts[1]

    def tensor(self, name: str) -> np.ndarray:
        s = self._slice(name, None)
        if s["encoding"] == spec.ENC_RAW:
            raise EvalError(f"{escape_name(name)}: a raw (non-float) tensor where the forward pass needs weights")
        return get_codec(s["encoding"]).decode(self.pack.typed_parts(s), s["shape"], s["layout"])

    def engine(self, name: str, expert: int | None = None) -> str:
        """Where this path runs the matmul: "npu" or "cpu"."""
        s = self._slice(name, expert)
        npu = s["tier"] == spec.TIER_NPU and self.path == "prefill" and self.m >= s["min_m"]
        return "npu" if npu else "cpu"

    def online_input(self, name: str, x: np.ndarray) -> np.ndarray:
        """``h -> h R4`` before each ffn_down of a pack whose preamble says so (flag bit 0), in float, before the
        activations are quantized; anything else as given."""
        return rotate_input(self.r4, name, x)

    def matmul(self, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        op = self._cache.get((name, expert))
        if op is None:
            shared = self._tables.get(name) if expert is None and self.engine(name) == "cpu" else None
            op = self._cache[(name, expert)] = shared or self._operand(name, expert)  # (a tied head: its table's rows)
            if self.keep and op.int8 is None:
                op.decoded()
        if self.on_matmul:
            self.on_matmul(name, expert, op.engine)
        x = self.online_input(name, np.asarray(x, dtype=np.float32))
        if op.int8 is not None and self.act != "float":
            qx, sx = numerics.int8_act(x, self.act)
            return numerics.int8_matmul(qx, sx, *op.int8)
        if op.quantized and self.cpu_act == "q8":
            x = numerics.q8_0(x)
        return op.matmul(x)

    def embed(self, ids: np.ndarray, name: str = EMBED) -> np.ndarray:
        op = self._tables.get(name)
        if op is None:
            op = self._cache.get((name, None)) if self.keep else None  # a tied head decoded first: its rows
            if op is None or op.int8 is not None:
                op = self._cpu_operand(self._slice(name, None))
            if self.keep:
                self._tables[name] = op.decoded()
        ids = np.asarray(ids, dtype=np.int64)
        if op.dense is not None:
            return op.dense[ids]
        out = np.empty((ids.size, op.k), dtype=np.float32)
        step = max(1, _BLOCK // max(op.k, 1))
        for r in range(0, op.n, step):
            sel = np.nonzero((ids >= r) & (ids < r + step))[0]
            if sel.size:
                out[sel] = op.rows(r, min(op.n, r + step))[ids[sel] - r]
        return out

    def release(self) -> None:
        if not self.keep:
            self._cache.clear()

    def preload(self) -> None:
        """keep=True: decode every matrix slice now (what the first run would decode as it goes), so that a caller can
        time the runs apart from the decoding."""
        if not self.keep:
            return
        for (name, expert), (_, s) in self._slices.items():
            if len(s["shape"]) == 2 and s["encoding"] != spec.ENC_RAW and (name, expert) not in self._cache \
                    and self.engine(name, expert) == "cpu":
                self._cache[(name, expert)] = self._cpu_operand(s).decoded()

    # -- operands ----------------------------------------------------------------------------
    def _operand(self, name: str, expert: int | None) -> _Operand:
        s = self._slice(name, expert)
        if len(s["shape"]) != 2:
            raise EvalError(f"{escape_name(name)}: a {len(s['shape'])}-D slice where the forward pass needs a matrix")
        if self.engine(name, expert) == "npu":
            q, scale = self._int8_image(s)
            return _Operand(q.shape[0], q.shape[1], rows.int8_rows(q, scale), int8=(q, scale), engine="npu")
        return self._cpu_operand(s)

    def _int8_image(self, s: dict) -> tuple[np.ndarray, np.ndarray]:
        """(q int8 [N, K] row-major, scale float32[N]) of an NPU slice: its tiles de-tiled, or its nf4 inflated."""
        return rows.int8_image(self.pack, s)

    def _cpu_operand(self, s: dict) -> _Operand:
        n, k = s["shape"]
        fn, quantized = rows.cpu_rows(self.pack, s)
        if fn is None:
            raise EvalError(f"{escape_name(str(self.pack.path))}: a {s['encoding']} slice where the forward pass needs "
                            "a matrix")
        return _Operand(n, k, fn, quantized=quantized)


class GGUFWeights(SourceWeights):
    """A GGUF's weights as llama.cpp's CPU backend runs them (see the module docstring): the source's
    float weights (:class:`orkpack.model.weights.SourceWeights`), each product with its activations
    quantized as llama.cpp's CPU kernels quantize them for that weight type.

    ``source``: an opened GGUF source (orkpack.sources.gguf.GGUFSource)."""

    _last: tuple | None = None  # (x, a copy of x, act, act(x)) of the last product

    def matmul(self, name: str, x: np.ndarray, expert: int | None = None) -> np.ndarray:
        act = numerics.llama_cpp_act(self.infos[name].dtype) if name in self.infos else None
        return super().matmul(name, self._act(act, x) if act else x, expert)

    def _act(self, act, x: np.ndarray) -> np.ndarray:
        """act(x); the last one kept, since several products take the same input (q, k and v; gate and up): the
        same array, holding the same bytes, with the same rule gives it again."""
        last = self._last
        if last is not None and last[0] is x and last[2] is act and last[1].shape == x.shape and \
                np.array_equal(last[1].view(np.uint8), np.ascontiguousarray(x).view(np.uint8)):
            return last[3]
        y = act(x)
        self._last = (x, np.array(x, copy=True), act, y)
        return y
