"""A rotation of the residual stream folded into the weights (QuaRot, arXiv 2404.00456; SpinQuant, arXiv 2405.16406):
``build --rotate`` (docs/FORMAT.md section 11, docs/EVAL.md "Rotation").

A pre-norm decoder with RMSNorm touches its residual stream x only through matrices: the embedding writes it, each
block reads ``rmsnorm(x) * g`` through its matrices and adds a matrix's output back, the head reads the final norm's
output. For an orthogonal Q, ``rmsnorm(x Q) = rmsnorm(x) Q``, so once every norm's gain ``g`` is folded into the
matrices it feeds (``W diag(g)``; the gain becomes 1), the model with

* the embedding ``E Q`` (each token's row rotated),
* every matrix that reads the stream ``W diag(g) Q`` (its input columns rotated: ``W @ Q``),
* every matrix that writes it ``Q.T W`` (its output rows; and its bias ``b Q``),

computes the same logits in exact arithmetic: its stream is ``x Q`` everywhere. This is **R1**. Where attention
allows (separate or block-fused values, no MLA, no gated output), **R2** rotates each value head by an orthogonal
R of the head size: ``attn_v``'s rows of each head ``R.T W_h`` (and its bias), ``attn_output``'s columns of each head
``W_h R``; attention mixes values linearly per head, so the output is unchanged. The runtime is not told: the pack
holds the rotated weights in their ordinary encodings.

Q is a randomized Hadamard matrix ``diag(s) H / sqrt(n)`` (random signs s, seeded) where the width allows: n = m 2^k
with H = H_m (x) H_{2^k}, H_{2^k} Sylvester's and H_m of order 1, 2 or a Paley construction from a prime (m = q + 1,
q = 3 mod 4; or m = 2 (q + 1), q = 1 mod 4: 12, 20, 24, 28, 32, 36, 44, 48, 60, ...); any other width takes a seeded
random orthogonal matrix (QR of a Gaussian matrix, signs fixed by R's diagonal). The rotation's spread makes the
stream's outlier channels (and the weights' outlier columns) ordinary ones: the int8 per-token activation scale and
the NF4 blocks see near-Gaussian values. What one seed gives is reproducible: the signs and the Gaussian matrix come
from numpy's ``default_rng([seed, 1])`` (R1) and ``default_rng([seed, 2])`` (R2).

A tied head cannot take ``diag(g) Q`` in place (its matrix is also the embedding, which takes ``Q`` alone): the
rotated model stores the head as its own matrix ``output.weight`` (a copy of the embedding, folded and rotated),
as any untied model does; it costs the head's bytes once more.

What a family's graph allows is its archs entry's (``Forward.rotate``, ``Forward.block``, ``Forward.norm``):
:func:`refusal` says why a family is not rotated. Operations on a tensor (one list per name, in order):
``("fold", norm)``: the last axis times the norm's gain (plus the family's norm offset); ``("rot", which, axis,
first, count)``: entries ``first .. first + count`` along ``axis``, in blocks of the rotation's size, each
vector v -> v @ R; ``("unit",)``: a gain folded away (every entry 1, stored ``1 - offset``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from ..errors import OrkError, escape_name
from ..sources.base import array_in, as_float32

METHOD = "rotation"
EMBED = "token_embd.weight"
HEAD = "output.weight"
_ROWS = 4096  # rows per block when a large matrix is rotated along its last axis
TAG = "orkpack-rotation:"  # the statistics' dataset entry naming the rotation they were gathered under


# ------------------------------------------------------------------------------------------- Hadamard matrices

def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % p for p in range(2, int(math.isqrt(n)) + 1))


def _chi(q: int) -> np.ndarray:
    """The quadratic character mod q (prime): chi[a] = 0 (a = 0), 1 (a square), -1."""
    c = -np.ones(q, np.int64)
    c[0] = 0
    c[[(i * i) % q for i in range(1, q)]] = 1
    return c


@lru_cache(maxsize=None)
def paley(m: int) -> np.ndarray | None:
    """A Hadamard matrix of order m (float64, entries +-1, H H^T = m I) by Paley's constructions from a prime, or
    order 1 / 2; None when m is not such an order."""
    if m == 1:
        return np.ones((1, 1))
    if m == 2:
        return np.array([[1.0, 1.0], [1.0, -1.0]])
    h = None
    q = m - 1
    if m % 4 == 0 and _is_prime(q) and q % 4 == 3:  # Paley I
        c = _chi(q)
        jac = c[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q].astype(np.float64)
        s = np.zeros((m, m))
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jac
        h = np.eye(m) + s
    q = m // 2 - 1
    if h is None and m % 4 == 0 and _is_prime(q) and q % 4 == 1:  # Paley II
        c = _chi(q)
        jac = c[(np.arange(q)[None, :] - np.arange(q)[:, None]) % q].astype(np.float64)
        s = np.zeros((q + 1, q + 1))
        s[0, 1:], s[1:, 0], s[1:, 1:] = 1, 1, jac
        h = np.kron(s, np.array([[1.0, -1.0], [-1.0, -1.0]])) + np.kron(np.eye(q + 1), np.array([[1.0, 1.0], [1.0, -1.0]]))
    if h is None or not np.array_equal(h @ h.T, m * np.eye(m)):
        return None
    return h


def hadamard_factor(n: int) -> int | None:
    """The least m with n = m 2^k and a Hadamard matrix of order m that :func:`paley` builds; None if none."""
    if n < 1:
        return None
    k = n
    cands = []
    while True:
        cands.append(k)
        if k % 2:
            break
        k //= 2
    for m in sorted(cands):
        if paley(m) is not None:
            return m
    return None


class Rotation:
    """One orthogonal matrix Q of ``size`` (module docstring): ``apply(x, axis)`` maps each vector along ``axis`` to
    ``v @ Q`` (float64). ``which``: r1 (the stream), r2 (a value head) or r4 (SpinQuant's name for an online one of
    ``ffn_down``'s input; only bench/online_hadamard.py's measurement makes it); ``STREAMS``: its seed's second
    word."""

    STREAMS = {"r1": 1, "r2": 2, "r4": 4}

    def __init__(self, which: str, size: int, seed: int, kind: str | None = None):
        if which not in self.STREAMS or size < 1 or not (0 <= seed < 2 ** 63):
            raise OrkError(f"rotation {escape_name(str(which))} of size {size}, seed {seed}: not a rotation orkpack makes")
        self.which, self.size, self.seed = which, int(size), int(seed)
        m = hadamard_factor(self.size)
        self.kind = kind or ("hadamard" if m is not None else "random")
        if self.kind == "hadamard" and m is None:
            raise OrkError(f"rotation {which}: no Hadamard matrix of order {size} (m 2^k, m a Paley order)")
        self.factor = m if self.kind == "hadamard" else None
        rng = np.random.default_rng([self.seed, self.STREAMS[which]])
        if self.kind == "hadamard":
            self._signs = rng.integers(0, 2, self.size).astype(np.float64) * 2 - 1
            self._hm = paley(m)
            self._q = None
        elif self.kind == "random":
            a = rng.standard_normal((self.size, self.size))
            q, r = np.linalg.qr(a)
            self._q = q * np.sign(np.where(np.diag(r) == 0, 1.0, np.diag(r)))[None, :]
        else:
            raise OrkError(f"rotation {which}: unknown kind {escape_name(str(kind))}")

    def record(self) -> dict:
        return {"kind": self.kind, "size": self.size, "seed": self.seed} | (
            {"hadamard": [self.factor, self.size // self.factor]} if self.kind == "hadamard" else {})

    def tag(self) -> str:
        return f"{self.which}={self.kind}:{self.size}:{self.seed}"

    def _last(self, x: np.ndarray) -> np.ndarray:
        """Each row of x (..., size) times Q."""
        if self._q is not None:
            return x @ self._q
        n, m = self.size, self.factor
        k = n // m
        lead = x.shape[:-1]
        y = (x * self._signs).reshape(lead + (m, k))
        h = 1
        while h < k:  # Sylvester's H_k by the fast Walsh-Hadamard butterfly
            y = y.reshape(lead + (m, k // (2 * h), 2, h))
            y = np.stack((y[..., 0, :] + y[..., 1, :], y[..., 0, :] - y[..., 1, :]), axis=-2)
            h *= 2
        y = y.reshape(lead + (m, k))
        if m > 1:
            y = np.einsum("...ik,ij->...jk", y, self._hm)
        return y.reshape(x.shape) / math.sqrt(n)

    def apply(self, x: np.ndarray, axis: int = -1) -> np.ndarray:
        x = np.asarray(x, np.float64)
        if x.shape[axis] != self.size:
            raise ValueError(f"axis of {x.shape[axis]} entries, rotation of {self.size}")
        return np.moveaxis(self._last(np.moveaxis(x, axis, -1)), -1, axis)

    def matrix(self) -> np.ndarray:
        """Q itself (float64), for checks."""
        return self.apply(np.eye(self.size))


# ------------------------------------------------------------------------------------------- the plan

def refusal(fwd) -> str | None:
    """Why a family's graph does not allow a rotation folded into its weights (its Forward), or None."""
    if fwd is None or fwd.rotate is None:
        return "its archs entry declares no rotation (Forward.rotate)"
    if fwd.block == "sandwich":
        return ("its blocks are sandwich-normed: a norm after each block (post_attention_norm, post_ffw_norm) scales "
                "the block's output channel by channel in the stream's own basis, which no rotation commutes with")
    if fwd.block == "post":
        return ("its blocks are post-normed (the norm after each block, its gain in the stream's basis): no norm "
                "before the matrices to fold, and the post-norm gains do not commute with a rotation")
    if fwd.norm != "rms":
        return ("its norms are LayerNorms: the mean they subtract does not commute with a rotation (the stream would "
                "first have to be made mean-free in every writer; not done)")
    if fwd.per_layer_input or fwd.moe_beside_mlp:
        return "per-layer inputs / experts beside the MLP are normed in the stream's basis"
    return None


@dataclass
class Plan:
    """What a rotated build applies: per tensor its operations (module docstring), the rotations, the untied head."""
    r1: Rotation | None
    r2: Rotation | None
    r4: dict[int, Rotation] | None = None  # build --online-hadamard, per ffn_down input width: the runtime rotates online
    ops: dict[str, list[tuple]] = field(default_factory=dict)
    records: dict[str, dict] = field(default_factory=dict)
    untied: dict[str, str] = field(default_factory=dict)  # output.weight -> token_embd.weight (a tied head)
    norm_offset: float = 0.0
    provenance: dict = field(default_factory=dict)

    def rotation(self, which: str, count: int | None = None) -> Rotation:
        """R1, R2, or R4 of an input width ``count``."""
        r = {"r1": self.r1, "r2": self.r2}.get(which) if which != "r4" else (self.r4 or {}).get(count)
        if r is None:
            raise OrkError(f"rotation {escape_name(which)}: not in this plan")
        return r

    def tag(self) -> str:
        """The rotation, as the statistics gathered under it name it (``orkpack imatrix --rotate``)."""
        return TAG + " " + " ".join(r.tag() for r in (self.r1, self.r2, *(self.r4 or {}).values()) if r is not None)

    def transform(self, name: str, arr: np.ndarray, gain) -> np.ndarray:
        """The tensor ``name`` (values as read, any float dtype; for an untied copy, its original's) as rotated,
        float32. ``gain(norm)``: a norm's stored gain (float32, before its fold)."""
        ops = self.ops.get(name)
        v = as_float32(arr)
        if not ops:
            return v
        if ops == [("unit",)]:
            return np.full(v.shape, np.float32(1.0 - self.norm_offset), np.float32)
        folds = [np.asarray(gain(op[1]), np.float64) + self.norm_offset for op in ops if op[0] == "fold"]
        last = all(op[0] == "fold" or (op[0] == "rot" and op[2] == v.ndim - 1) for op in ops)
        if last and v.ndim >= 2:  # every operation acts along the rows: block by block, bounded memory
            flat = v.reshape(-1, v.shape[-1])
            ops = [op if op[0] != "rot" else op[:2] + (-1,) + op[3:] for op in ops]
            out = np.empty(flat.shape, np.float32)
            for r0 in range(0, flat.shape[0], _ROWS):
                out[r0: r0 + _ROWS] = self._ops(flat[r0: r0 + _ROWS], ops, folds)
            return out.reshape(v.shape)
        return self._ops(v, ops, folds)

    def _ops(self, v: np.ndarray, ops, folds) -> np.ndarray:
        x = v.astype(np.float64)
        fi = 0
        for op in ops:
            if op[0] == "fold":
                x = x * folds[fi]
                fi += 1
            elif op[0] == "rot":
                _, which, axis, first, count = op
                r = self.rotation(which, count)
                seg = np.moveaxis(x, axis, -1).copy()
                part = seg[..., first: first + count]
                blocks = part.reshape(part.shape[:-1] + (count // r.size, r.size))
                seg[..., first: first + count] = r.apply(blocks, -1).reshape(part.shape)
                x = np.moveaxis(seg, -1, axis)
        return x.astype(np.float32)


_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def _split(rest: str) -> tuple[str, str]:
    """(base, kind) of a layer tensor's name after ``blk.N.``: kind weight | bias | bare (ssm_a, attn_sinks)."""
    for k in ("weight", "bias"):
        if rest.endswith("." + k):
            return rest[: -len(k) - 1], k
    return rest, "bare"


def plan(names_shapes: dict[str, tuple], hp, seed: int = 0, heads: bool = True) -> Plan:
    """The rotation of every tensor of a model (canonical names and shapes) of the family ``hp.fwd``; OrkError
    (one line) when its graph does not allow one or a tensor is not understood."""
    fwd = hp.fwd
    why = refusal(fwd)
    if why:
        raise OrkError(f"--rotate: cannot rotate {escape_name(str(hp.arch))}: {why}")
    decl = fwd.rotate
    d = int(hp.hidden)
    r1 = Rotation("r1", d, seed)
    hd = int(hp.head_dim or 0)
    r2_ok = heads and hd > 0 and not hp.mla and not fwd.attn_gate and not hp.kv_from and not hp.head_dim_swa
    r2 = Rotation("r2", hd, seed) if r2_ok else None
    p = Plan(r1, r2, norm_offset=float(hp.norm_offset))

    def bad(name: str, what: str) -> OrkError:
        return OrkError(f"--rotate: {escape_name(name)}: {what}; this model is not rotated")

    def shape(name):
        return tuple(names_shapes[name])

    def add(name, *ops, rec):
        p.ops.setdefault(name, []).extend(ops)
        r = p.records.setdefault(name, {})
        for k, v in rec.items():
            if k == "rotate":
                r.setdefault("rotate", []).extend(v)
            else:
                r[k] = v

    def rot(name, which, axis, first, count):
        rr = p.rotation(which)
        if count <= 0 or count % rr.size or first < 0 or first + count > shape(name)[axis]:
            raise bad(name, f"{count} entries from {first} along axis {axis} do not take {which}'s {rr.size}")
        return ("rot", which, axis, first, count), [[which, axis, first, count]]

    def reader(name, norm):
        s = shape(name)
        if s[-1] != d:
            raise bad(name, f"{s} does not read the stream's {d} columns")
        op, rec = rot(name, "r1", len(s) - 1, 0, d)
        add(name, ("fold", norm), op, rec={"fold": norm, "rotate": rec})

    def writer(name, kind):
        s = shape(name)
        axis = len(s) - (1 if kind == "bias" else 2)
        if axis < 0 or s[axis] != d:
            raise bad(name, f"{s} does not write the stream's {d} rows")
        op, rec = rot(name, "r1", axis, 0, d)
        add(name, op, rec={"rotate": rec})

    def unit(name):
        if len(shape(name)) != 1 or shape(name)[0] != d:
            raise bad(name, f"a norm of {shape(name)}, not of the stream's {d}")
        add(name, ("unit",), rec={"unit": 1.0 - float(hp.norm_offset)})

    def norm_tensor(prefix: str, base: str) -> str | None:
        for n in (prefix + base + ".weight", prefix + base):
            if n in names_shapes:
                return n
        return None

    out_norm = norm_tensor("", fwd.output_norm)
    layers: dict[int, list[str]] = {}
    folded: set[str] = set()
    for name in names_shapes:
        m = _LAYER.match(name)
        if m:
            layers.setdefault(int(m.group(1)), []).append(name)
            continue
        if name == EMBED:
            s = shape(name)
            if len(s) != 2 or s[1] != d:
                raise bad(name, f"{s} is not an embedding of width {d}")
            op, rec = rot(name, "r1", 1, 0, d)
            add(name, op, rec={"rotate": rec})
        elif name == HEAD:
            if out_norm is None:
                raise bad(name, "a head without the final norm")
            reader(name, out_norm)
            folded.add(out_norm)
        elif name in (out_norm, "rope_freqs.weight"):
            continue
        else:
            raise bad(name, "not a tensor the rotation knows (neither embedding, head, final norm nor a layer's)")
    if EMBED not in names_shapes or out_norm is None:
        raise OrkError("--rotate: the model has no token_embd.weight or no final norm; not rotated")
    if HEAD not in names_shapes:  # a tied head: its own matrix now (module docstring)
        names_shapes = dict(names_shapes) | {HEAD: shape(EMBED)}
        p.untied[HEAD] = EMBED
        reader(HEAD, out_norm)
        p.records[HEAD]["untied"] = {"from": EMBED}
        folded.add(out_norm)
    unit(out_norm)
    for i in sorted(layers):
        if i >= hp.n_layers:
            raise bad(layers[i][0], f"layer {i} beyond the {hp.n_layers} the forward pass runs (a multi-token-prediction "
                                    "block?)")
        pre = f"blk.{i}."
        attn_norm = norm_tensor(pre, "attn_norm")
        ffn_norm = norm_tensor(pre, fwd.ffn_norm)
        norms = {n for n in (attn_norm, ffn_norm) if n}
        for name in sorted(layers[i]):
            if name in norms:
                continue
            base, kind = _split(name[len(pre):])
            if base in decl.mixer_reads or base in decl.ffn_reads:
                if kind != "weight":
                    continue  # a reader's bias is in its output's space
                norm = attn_norm if base in decl.mixer_reads else (ffn_norm or attn_norm)
                if norm is None:
                    raise bad(name, "reads the stream but no norm before it was found")
                reader(name, norm)
                folded.add(norm)
            elif base in decl.writes:
                if kind == "bare":
                    raise bad(name, "a writer that is neither weight nor bias")
                writer(name, kind)
            elif base in decl.inside:
                continue
            else:
                raise bad(name, f"not declared in the family's rotation (archs Forward.rotate) as reading, writing "
                                f"or inside a layer")
        for n in norms:
            if n in folded:
                unit(n)
            else:
                raise bad(n, "a norm whose output no declared matrix reads")
        if r2 is not None:
            _heads(p, pre, names_shapes, hd, rot, add, fwd)
    if r2 is not None and not any(op[1] == "r2" for ops in p.ops.values() for op in ops if op[0] == "rot"):
        p.r2 = r2 = None  # no layer's attention had a layout R2 takes (a grouped qkv)
    p.provenance = {
        "method": METHOD,
        "r1": r1.record(),
        "r2": None if r2 is None else r2.record(),
        "folded": sorted(folded),
        "rotated": sum(1 for r in p.records.values() if "rotate" in r),
        "untied_head": dict(p.untied) or None,
    }
    return p


def _heads(p: Plan, pre: str, names_shapes, hd: int, rot, add, fwd) -> None:
    """R2 on one attention layer: the value rows of each head (attn_v, or attn_qkv's value block) and the output's
    columns of each head; nothing where the layer has neither layout."""
    o = pre + "attn_output.weight"
    if o not in names_shapes or len(names_shapes[o]) != 2 or names_shapes[o][1] % hd:
        return
    nh = names_shapes[o][1] // hd
    v = pre + "attn_v.weight"
    qkv = pre + "attn_qkv.weight"
    if v in names_shapes and len(names_shapes[v]) == 2 and names_shapes[v][0] % hd == 0:
        first, count, vt = 0, names_shapes[v][0], v
    elif qkv in names_shapes and fwd.qkv == "blocks" and len(names_shapes[qkv]) == 2:
        rows = names_shapes[qkv][0]
        if rows % hd or (rows // hd - nh) % 2 or rows // hd <= nh:
            return
        nkv = (rows // hd - nh) // 2
        first, count, vt = (nh + nkv) * hd, nkv * hd, qkv
    else:
        return
    op, rec = rot(vt, "r2", 0, first, count)
    add(vt, op, rec={"rotate": rec})
    b = vt[: -len(".weight")] + ".bias"
    if b in names_shapes:
        op, rec = rot(b, "r2", 0, first, count)
        add(b, op, rec={"rotate": rec})
    op, rec = rot(o, "r2", 1, 0, nh * hd)
    add(o, op, rec={"rotate": rec})


# ------------------------------------------------------------------------------------------- the rotated model

class RotatedSource:
    """A source whose tensors are the rotated model's (an opened Source and its :class:`Plan`): what the build
    encodes, what ``orkpack imatrix --rotate`` gathers statistics on, what eval compares a rotated pack with.
    A rotated tensor reads as float32 (its info says F32); the untied head is listed right after the embedding."""

    def __init__(self, src, plan: Plan):
        self._src, self.plan = src, plan
        self._gains: dict[str, np.ndarray] = {}

    def __getattr__(self, k):
        return getattr(self._src, k)

    def tensors(self):
        out = []
        for i in self._src.tensors():
            out.append(self._info(i))
            out += [replace(self._info(i), name=c) for c, o in self.plan.untied.items() if o == i.name]
        return out

    def _info(self, i):
        if i.name in self.plan.ops or i.name in self.plan.untied:
            return replace(i, dtype="F32", nbytes=4 * i.numel)
        return i

    def gain(self, name: str) -> np.ndarray:
        if name not in self._gains:
            self._gains[name] = as_float32(self._src.read(name)).copy()
        return self._gains[name]

    def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        if name not in self.plan.ops:
            return self._src.read(name, out)
        orig = self.plan.untied.get(name, name)
        mapped = getattr(self._src, "mapped", None)
        arr = mapped(orig) if mapped is not None else None
        if arr is None:
            arr = self._src.read(orig)
        v = self.plan.transform(name, arr, self.gain)
        del arr
        res = array_in(out, v.shape, np.float32)
        res[...] = v
        return res

    def online_input(self, name: str, x: np.ndarray) -> np.ndarray:
        """What the model's runtime does before the matrix ``name`` reads ``x``: R4 before each ffn_down when the
        plan folds it (:func:`rotate_input`), else ``x``."""
        return rotate_input(self.plan.r4, name, x)

    def mapped(self, name: str):
        if name in self.plan.ops:
            return None
        m = getattr(self._src, "mapped", None)
        return m(name) if m is not None else None

    def close(self) -> None:
        self._src.close()


_DOWN = re.compile(r"\.ffn_down(_exps|_shexp|_chexps)?\.weight$")
ONLINE = "ffn_down"  # provenance.rotation.online: the matrices whose input the runtime rotates by R4


def online_block(width: int) -> int:
    """R4's block: the largest divisor of ffn_down's input width that has a Hadamard matrix (m 2^k): the whole
    width where it has one (SmolLM2's 1536 = 12 x 2^7), else a block-diagonal R4 of that many entries per block;
    the fast transform costs ~ width log2(block) additions per token, never a dense matrix."""
    for b in range(width, 0, -1):
        if width % b == 0 and hadamard_factor(b) is not None:
            return b
    return 1


def add_online(p: Plan | None, names_shapes: dict[str, tuple], hp, seed: int = 0) -> Plan:
    """R4 into ``p`` (a :class:`Plan`, or None: R4 alone): every ``ffn_down`` (dense, expert stack, shared expert)
    takes ``W -> W R4`` along its last axis (its input, the FFN's product), R4 block-diagonal in blocks of
    :func:`online_block` of that width (one R4 per distinct width, the same seed); the runtime must rotate that
    input ``h -> h R4`` (docs/RUNTIME.md). OrkError (one line) for a model without an ffn_down."""
    downs = {n: tuple(s) for n, s in names_shapes.items() if _LAYER.match(n) and _DOWN.search(n)}
    if not downs:
        raise OrkError(f"--online-hadamard: cannot rotate {escape_name(str(hp.arch))}: it has no ffn_down matrix "
                       "(the FFN's down projection) whose input to rotate")
    r4 = {}
    for w in sorted({s[-1] for s in downs.values()}):
        b = online_block(w)
        if b < 2:
            raise OrkError(f"--online-hadamard: ffn_down's input width {w} has no Hadamard block")
        r4[w] = Rotation("r4", b, seed)
    if p is None:
        p = Plan(None, None, norm_offset=float(hp.norm_offset))
        p.provenance = {"method": METHOD, "r1": None, "r2": None, "folded": [], "rotated": 0, "untied_head": None}
    p.r4 = r4
    for n in sorted(downs):
        ax, w = len(downs[n]) - 1, downs[n][-1]
        p.ops.setdefault(n, []).append(("rot", "r4", ax, 0, w))
        p.records.setdefault(n, {}).setdefault("rotate", []).append(["r4", ax, 0, w])
    p.provenance = p.provenance | {"r4": [{"width": w} | r.record() for w, r in r4.items()], "online": ONLINE,
                                   "rotated": sum(1 for r in p.records.values() if "rotate" in r)}
    return p


def _r4_of(recs) -> dict[int, Rotation]:
    """provenance.rotation.r4 (a list of ``{"width", kind, size, seed, hadamard}``) as width -> Rotation; OrkError
    when an entry is malformed or its block is not :func:`online_block` of its width."""
    if not isinstance(recs, list) or not recs:
        raise OrkError("rotation r4: not a list of per-width records")
    out = {}
    for rec in recs:
        if not isinstance(rec, dict) or not all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool)
                                                for k in ("width", "size", "seed")) \
                or not 1 <= rec["width"] <= 1 << 20 or rec.get("kind") != "hadamard" or rec["width"] in out:
            raise OrkError(f"rotation r4: malformed record {str(rec)[:80]}")
        w = rec["width"]
        if rec["size"] != online_block(w):
            raise OrkError(f"rotation r4: block {rec['size']} for width {w}, the rule gives {online_block(w)}")
        out[w] = _rotation_of({k: v for k, v in rec.items() if k != "width"}, "r4")
    return out


def online_of(pack) -> dict[int, Rotation] | None:
    """The R4 a pack's runtime must apply to every ffn_down input (preamble flag FLAG_ONLINE_R4 and its record),
    input width -> Rotation, or None; OrkError (one line) when the flag and the record disagree."""
    from ..pack import spec
    flag = bool(pack.preamble.flags & spec.FLAG_ONLINE_R4)
    rec = ((pack.header.get("provenance") or {}).get("rotation") or {}).get("r4")
    if flag != (rec is not None):
        raise OrkError(f"{escape_name(str(pack.path))}: the preamble's online-Hadamard flag and "
                       "provenance.rotation.r4 disagree; rebuild the pack")
    return _r4_of(rec) if flag else None


def rotate_input(r4: dict[int, Rotation] | None, name: str, x: np.ndarray) -> np.ndarray:
    """What a runtime does before each ffn_down (and nothing elsewhere): ``h -> h R4`` block by block, in float64
    rounded to float32, before any activation quantization."""
    if r4 is None or not _DOWN.search(name):
        return x
    x = np.asarray(x, np.float32)
    r = r4.get(x.shape[-1])
    if r is None:
        raise OrkError(f"{escape_name(name)}: an input of {x.shape[-1]} entries, no R4 recorded for that width")
    b = x.reshape(x.shape[:-1] + (x.shape[-1] // r.size, r.size))
    return r.apply(b).reshape(x.shape).astype(np.float32)


def unfold_online(r4: dict[int, Rotation] | None, name: str, w: np.ndarray) -> np.ndarray:
    """An ffn_down's values ``W R4`` (float32, as a path decodes them) back in the source's basis, ``(W R4) R4^T``
    along its last axis (float64, rounded to float32): what a runtime that cannot rotate online (llama.cpp, ``orkpack
    export``) multiplies instead; with float activations it computes what the pack's path does, ``(h R4)(W R4)^T =
    h W^T``. Anything else as given."""
    if r4 is None or not _DOWN.search(name):
        return w
    r = r4.get(w.shape[-1])
    if r is None:
        raise OrkError(f"{escape_name(name)}: {w.shape[-1]} input columns, no R4 recorded for that width")
    qt = r.matrix().T
    b = np.asarray(w, np.float64).reshape(w.shape[:-1] + (w.shape[-1] // r.size, r.size))
    return (b @ qt).reshape(w.shape).astype(np.float32)


def rotated(src, seed: int = 0, heads: bool = True, rotate: bool = True, online: bool = False) -> RotatedSource:
    """The opened source ``src`` as its rotated model: R1 (and R2 unless not ``heads``) when ``rotate``, R4 into
    every ffn_down when ``online`` (OrkError, one line, when its family's graph does not allow it)."""
    from ..model import forward
    from ..model.hparams import NotEvaluable

    try:
        hp = forward.model_hparams(src)
    except NotEvaluable as e:
        raise OrkError(f"--rotate: cannot rotate this model: {e}") from None
    names_shapes = {i.name: tuple(i.shape) for i in src.tensors()}
    p = plan(names_shapes, hp, seed, heads) if rotate else None
    if online:
        p = add_online(p, names_shapes, hp, seed)
    return RotatedSource(src, p)


# ------------------------------------------------------------------------------------------- a pack's records

def from_pack(pack) -> Plan | None:
    """The rotation a pack records (docs/FORMAT.md section 11) as a :class:`Plan`, or None for a pack without one;
    OrkError (one line) for records that do not hold together (:func:`check_pack` says which)."""
    prov = (pack.header.get("provenance") or {}).get("rotation")
    if prov is None:
        return None
    why = check_pack(pack)
    if why:
        raise OrkError(f"rotation records: {why}")
    return _plan_of(pack, prov)


def _rotation_of(rec, which: str) -> Rotation | None:
    if rec is None:
        return None
    r = Rotation(which, int(rec["size"]), int(rec["seed"]), rec["kind"])
    if r.record() != rec:
        raise OrkError(f"rotation {which}: recorded {rec}, regenerated {r.record()}")
    return r


def _plan_of(pack, prov) -> Plan:
    p = Plan(_rotation_of(prov.get("r1"), "r1"), _rotation_of(prov.get("r2"), "r2"),
             None if prov.get("r4") is None else _r4_of(prov["r4"]), provenance=prov)
    for t in pack.tensors:
        r = t.get("rotation")
        if not isinstance(r, dict):
            continue
        if r.get("unit") is not None:
            p.ops[t["name"]] = [("unit",)]
            p.norm_offset = 1.0 - float(r["unit"])
            continue
        ops = [("fold", r["fold"])] if "fold" in r else []
        ops += [("rot", w, int(a), int(f), int(c)) for w, a, f, c in r.get("rotate", [])]
        p.ops[t["name"]] = ops
        p.records[t["name"]] = r
        if isinstance(r.get("untied"), dict):
            p.untied[t["name"]] = r["untied"]["from"]
    return p


def check_pack(pack) -> str | None:
    """Why a pack's rotation records do not hold together, or None: the provenance's rotations regenerate from
    their seeds (the recorded kind, size and Hadamard factors) and are orthogonal; each tensor's operations fit
    its shape and name rotations the provenance holds; a fold names a norm of the pack recorded as folded away
    (``unit``); an untied copy names a tensor of its shape."""
    prov = (pack.header.get("provenance") or {}).get("rotation")
    shapes = {t["name"]: t["shape"] for t in pack.tensors}
    recs = {t["name"]: t.get("rotation") for t in pack.tensors if t.get("rotation") is not None}
    if prov is None:
        return "tensors carry rotation records but provenance.rotation is missing" if recs else None
    if not isinstance(prov, dict) or prov.get("method") != METHOD \
            or not (isinstance(prov.get("r1"), dict) or prov.get("r4") is not None):
        return "provenance.rotation is malformed"
    r4 = {}
    if prov.get("r4") is not None:
        if prov.get("online") != ONLINE:
            return "provenance.rotation.r4 without online: \"ffn_down\""
        try:
            r4 = _r4_of(prov["r4"])
        except OrkError as e:
            return str(e)
    rots = {}
    for which in ("r1", "r2"):
        rec = prov.get(which)
        if rec is None:
            continue
        if not isinstance(rec, dict) or rec.get("kind") not in ("hadamard", "random") \
                or not all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool) for k in ("size", "seed")) \
                or not 1 <= rec["size"] <= 65536:
            return f"rotation {which}: malformed record"
        try:
            r = _rotation_of(rec, which)
        except OrkError as e:
            return str(e)
        v = np.random.default_rng(0).standard_normal((4, r.size))
        back = r.apply(v)
        if not np.allclose(np.linalg.norm(back, axis=1), np.linalg.norm(v, axis=1), rtol=1e-9):
            return f"rotation {which}: not orthogonal"
        rots[which] = r
    for w, r in r4.items():
        v = np.random.default_rng(0).standard_normal((4, r.size))
        if not np.allclose(np.linalg.norm(r.apply(v), axis=1), np.linalg.norm(v, axis=1), rtol=1e-9):
            return f"rotation r4 of width {w}: not orthogonal"
    if r4:  # the runtime rotates every ffn_down input: each must hold W R4
        for name in shapes:
            if _DOWN.search(name) and not any(isinstance(e, list) and e[:1] == ["r4"]
                                              for e in (recs.get(name) or {}).get("rotate", [])):
                return f"{escape_name(name)}: an ffn_down without R4 in a pack whose runtime rotates its input"
    units = {n for n, r in recs.items() if isinstance(r, dict) and r.get("unit") is not None}
    for name, r in recs.items():
        label = escape_name(name)
        if not isinstance(r, dict) or not r or set(r) - {"fold", "rotate", "unit", "untied"}:
            return f"{label}: malformed rotation record"
        shape = shapes[name]
        if "unit" in r:
            if set(r) != {"unit"} or r["unit"] not in (0.0, 1.0) or len(shape) != 1:
                return f"{label}: a folded norm's record is {{\"unit\": 1.0 or 0.0}} on a 1-D gain"
            continue
        if "fold" in r and (r["fold"] not in units or shapes.get(r["fold"]) != [shape[-1]]):
            return f"{label}: folds {escape_name(str(r['fold']))}, which is not a folded norm of its width"
        rot = r.get("rotate")
        if not isinstance(rot, list) or not rot:
            return f"{label}: a rotated tensor names no rotation"
        for e in rot:
            if not (isinstance(e, list) and len(e) == 4 and (e[0] in rots or (e[0] == "r4" and r4))
                    and all(isinstance(x, int) and not isinstance(x, bool) for x in e[1:])):
                return f"{label}: rotation entry {e!r} is not [r1|r2|r4, axis, first, count] of a recorded rotation"
            _, ax, first, count = e
            if e[0] == "r4":
                if not _DOWN.search(name) or ax != len(shape) - 1 or first != 0 or count != shape[-1] \
                        or count not in r4:
                    return f"{label}: rotation entry {e!r} is not R4 over an ffn_down's whole input"
                continue
            n = rots[e[0]].size
            if not (0 <= ax < len(shape) and first >= 0 and count > 0 and count % n == 0 and first + count <= shape[ax]):
                return f"{label}: rotation entry {e!r} does not fit its shape {shape}"
        if "untied" in r:
            src = r["untied"].get("from") if isinstance(r["untied"], dict) else None
            if not isinstance(src, str) or src == name or shapes.get(src) != shape:
                return f"{label}: untied from {escape_name(str(src))}, which the pack does not hold in its shape"
    return None


def check_against_source(pack, source, *, min_db: float = 10.0, slack_db: float = 1.0) -> list[str]:
    """``verify --reference --source``: each rotated tensor of ``pack`` decoded as the CPU reads it against the
    source's tensor under the recorded operations (and the recorded smoothing, if any). A float slice must equal
    it to float32 rounding; a quantized one must reach its recorded SQNR against it (less ``slack_db``, and at
    least ``min_db``): a wrong seed, a missing fold or another model's tensor lands near 0 dB. Returns the
    failures (empty: passed)."""
    from ..codecs import get_codec, rows
    from ..sources import open_source
    from .smoothed import ops_of as smoothing_ops
    from .smooth import transform as smooth_transform

    p = from_pack(pack)
    if p is None:
        return []
    fails = []
    sm = smoothing_ops(pack)
    src = open_source(source, on_warning=lambda m: None)
    try:
        rs = RotatedSource(src, p)
        have = {i.name for i in src.tensors()}
        for t, s in pack.slices():
            name = t["name"]
            if name not in p.ops or (name not in have and name not in p.untied):
                if name in p.ops:
                    fails.append(f"{escape_name(name)}: not in the source")
                continue
            want = rs.read(name)
            if name in sm:
                want = smooth_transform(want, sm[name], p.norm_offset)
            if s["expert"] is not None:
                want = want[s["expert"]]
            if len(s["shape"]) == 2:
                fn, _ = rows.cpu_rows(pack, s)
                if fn is None:
                    continue
                got = fn(0, s["shape"][0])
            else:  # a 1-D gain or bias: float
                got = get_codec(s["encoding"]).decode(pack.typed_parts(s), s["shape"], s["layout"])
            got = np.asarray(got, np.float64).reshape(want.shape)
            w64 = want.astype(np.float64)
            err = float(((got - w64) ** 2).sum())
            sig = float((w64 ** 2).sum())
            label = escape_name(name if s["expert"] is None else f"{name}[{s['expert']}]")
            if s["encoding"] in ("f32", "f16", "bf16"):
                tol = {"f32": 1e-12, "f16": 1e-6, "bf16": 1e-4}[s["encoding"]]
                if err > tol * max(sig, 1e-30):
                    fails.append(f"{label}: stored values differ from the source under the recorded rotation")
                continue
            db = 10 * math.log10(sig / err) if err > 0 else float("inf")
            rec = s.get("sqnr_db")
            need = max(min_db, (rec - slack_db) if isinstance(rec, (int, float)) else min_db)
            if db < need:
                fails.append(f"{label}: {db:.1f} dB against the source under the recorded rotation, "
                             f"{'recorded ' + format(rec, '.1f') + ' dB' if rec is not None else 'expected more'}")
    finally:
        src.close()
    return fails


def shown(prov: dict | None) -> dict | None:
    """provenance.rotation (format 1.6) as shown: well-typed fields only; None when the build did not rotate."""
    r = (prov or {}).get("rotation")
    if not isinstance(r, dict):
        return None

    def rot(x):
        if not isinstance(x, dict):
            return None
        return {k: x.get(k) for k in ("kind", "size", "seed", "hadamard") if isinstance(x.get(k), (str, int, list))}

    uh = r.get("untied_head")
    return {
        "method": r.get("method") if isinstance(r.get("method"), str) else None,
        "r1": rot(r.get("r1")),
        "r2": rot(r.get("r2")),
        "r4": [dict(rot(x), width=x.get("width")) for x in r["r4"] if isinstance(x, dict)]
        if isinstance(r.get("r4"), list) else None,
        "online": r.get("online") if isinstance(r.get("online"), str) else None,
        "folded": len(r["folded"]) if isinstance(r.get("folded"), list) else None,
        "rotated": r.get("rotated") if isinstance(r.get("rotated"), int) else None,
        "untied_head": {k: v for k, v in uh.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(uh, dict) else None,
    }


def line(r: dict | None) -> str | None:
    """One line of a pack's rotation provenance, for people."""
    if not r:
        return None

    def one(x):
        if not x:
            return "none"
        h = x.get("hadamard")
        what = f"Hadamard {h[0]}x2^{int(math.log2(h[1]))}" if isinstance(h, list) and len(h) == 2 and h[1] > 0 \
            else "random orthogonal"
        return f"{what} of {x.get('size')}, seed {x.get('seed')}"

    uh = r.get("untied_head")
    head = f"; head untied from {escape_name(next(iter(uh.values())), 40)}" if uh else ""
    r4 = (f"; R4 {', '.join(one(x) for x in r['r4'])}, online before every {escape_name(str(r.get('online')), 20)}"
          if r.get("r4") else "")
    return (f"{escape_name(str(r.get('method')), 20)}: R1 {one(r.get('r1'))}; R2 {one(r.get('r2'))}{r4}; "
            f"{r.get('folded')} norms folded, {r.get('rotated')} tensors rotated{head}")
