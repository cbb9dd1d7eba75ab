"""``orkpack generate PACK [--source SRC] -p TEXT``: the pack's answer to a prompt, in the board's decode numerics.

The prompt is tokenized by the pack's own tokenizer (its model record, orkpack/model/tokenizer.py); with ``chat``
it is the user message of a conversation rendered by the record's chat template with the generation prompt
(orkpack/model/chat.py). The model is orkpack's reference forward pass with the provider ``orkpack eval`` scores the
decode path with (:class:`orkpack.eval.weights.PackWeights` ``"decode"``: every matmul on the CPU, host copies,
activations float or Q8_0 by ``cpu_act``); the prompt runs as one batch through the same per-row numerics (a batch
of M rows at decode numerics equals M single-token steps, docs/EVAL.md), then one token a step.

With the cache (the default) each step runs the one new token against the KV cache and the recurrent states the
sequence left (orkpack/model/state.py); without it every step runs the whole sequence again (the reference the cache
is checked against, and the speedup it buys). Tokens are greedy (the most likely; ties to the lowest id, as
``argmax``), or sampled with a seeded generator: logits / temperature, then the top-k, then the top-p nucleus (the
fewest most likely tokens whose probability reaches p), then one draw. Generation stops at an end-of-generation
token (the record's EOS / EOT / EOM ids, and with ``chat`` the token the template ends a turn with) or after
``max_tokens``.

With a source, its float model (the source's weights in float32) answers the same prompt with the same sampling
(its own generator of the same seed), and the report names the first token where the two answers part.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np

from ..errors import escape_name
from ..model import forward
from ..model.chat import end_of_turn, render
from ..model.state import State
from ..model.tokenizer import Tokenizer, TokenizerError, from_model
from ..model.weights import SourceWeights
from ..pack.model import check_model, get
from ..pack.reader import Pack
from ..sources import open_source
from ..transforms.smoothed import untied_of
from .run import _check_same_model, _is_gguf, _rotation_untied, pack_hparams
from .weights import CPU_ACTS, EvalError, PackWeights

KEEP_BYTES = 4 << 30  # matrices decoded once and kept across steps when their float32 fits in this (else per step)
# the record's end-of-generation ids (llama.cpp's EOG set: EOS, end of turn, end of message), by what they mean
_STOP_KEYS = (("eos", "tokenizer.ggml.eos_token_id"), ("end of turn", "tokenizer.ggml.eot_token_id"),
              ("end of message", "tokenizer.ggml.eom_token_id"))


@dataclass
class Options:
    prompt: str | None = None
    tokens: str | None = None  # token ids ("1 5 9" or "1,5,9") instead of a prompt
    chat: bool = False  # the prompt is a user message through the record's chat template
    max_tokens: int = 64
    temp: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: every token
    top_p: float = 1.0
    seed: int | None = None  # the sampling generator's seed (None: 0)
    cpu_act: str = "float"
    cache: bool = True  # False: every step runs the whole sequence again
    threads: int = 1


# ------------------------------------------------------------------------------------------- sampling

class Sampler:
    """The next token from one row of logits: greedy at temperature 0, else top-k, top-p and a seeded draw."""

    def __init__(self, temp: float, top_k: int, top_p: float, seed: int):
        self.temp, self.top_k, self.top_p = temp, top_k, top_p
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        z = np.asarray(logits, dtype=np.float64).reshape(-1)
        if self.temp == 0:
            return int(np.argmax(z))
        z = z / self.temp
        if 0 < self.top_k < z.size:
            kth = np.partition(z, z.size - self.top_k)[z.size - self.top_k]
            z = np.where(z >= kth, z, -np.inf)
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p, kind="stable")
            n = int(np.searchsorted(np.cumsum(p[order]), self.top_p)) + 1  # the fewest whose mass reaches top_p
            keep = np.zeros(p.size, dtype=bool)
            keep[order[:n]] = True
            p = np.where(keep, p, 0.0)
            p /= p.sum()
        return int(self.rng.choice(p.size, p=p))


def check_options(opts: Options) -> None:
    """Refuse options that make no sense, in one line each."""
    if opts.max_tokens < 1:
        raise EvalError(f"-n {opts.max_tokens}: give at least 1 token to generate")
    if not math.isfinite(opts.temp) or opts.temp < 0:
        raise EvalError(f"--temp {opts.temp}: give 0 (greedy) or a positive temperature such as 0.8")
    if opts.top_k < 0:
        raise EvalError(f"--top-k {opts.top_k}: give 0 (every token) or a positive count")
    if not (math.isfinite(opts.top_p) and 0 < opts.top_p <= 1):
        raise EvalError(f"--top-p {opts.top_p}: give a probability in (0, 1]")
    if opts.temp == 0 and (opts.top_k or opts.top_p < 1 or opts.seed is not None):
        flags = (("--top-k", opts.top_k), ("--top-p", opts.top_p < 1), ("--seed", opts.seed is not None))
        given = [f for f, on in flags if on]
        raise EvalError(f"{' / '.join(given)} shape sampling, and greedy decoding (--temp 0, the default) samples "
                        "nothing: add --temp T (e.g. 0.8), or drop them")
    if opts.cpu_act not in CPU_ACTS:
        raise EvalError(f"--cpu-act {opts.cpu_act!r}: choose {' or '.join(CPU_ACTS)}")
    if opts.threads < 0:
        raise EvalError(f"--threads {opts.threads}: give 0 (all cores) or a positive count")
    if (opts.prompt is None) == (opts.tokens is None):
        raise EvalError("give the prompt as -p TEXT, or its token ids as --tokens IDS (one of them)")
    if opts.chat and opts.prompt is None:
        raise EvalError("--chat puts the -p TEXT in the chat template: give -p TEXT instead of --tokens")


def parse_ids(text: str, vocab: int) -> list[int]:
    """``--tokens``: integers separated by spaces or commas, each in the vocabulary."""
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise EvalError(f"--tokens {escape_name(text, 60)!s}: give token ids as integers separated by spaces, e.g. "
                        "--tokens '1 520 33'") from None
    if not ids:
        raise EvalError("--tokens: no token ids given; give at least one, e.g. --tokens '1 520 33'")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise EvalError(f"--tokens: id {bad} is outside the vocabulary (0..{vocab - 1})")
    return ids


# ------------------------------------------------------------------------------------------- one answer

@dataclass
class Answer:
    tokens: list
    stop: str  # "eos" | "end of turn" | ... | "max tokens"
    load_s: float  # the weights decoded (kept) before the prompt ran
    prompt_s: float
    generation_s: float
    steps: int  # forward passes after the prompt's

    def report(self, tok: Tokenizer | None, n_prompt: int, stops: dict) -> dict:
        body = self.tokens[:-1] if self.tokens and self.tokens[-1] in stops else self.tokens
        return {
            "tokens": list(self.tokens),
            "texts": [tok.decode([t]) for t in self.tokens] if tok else None,
            "text": tok.decode(body) if tok else None,
            "generated": len(self.tokens),
            "stop": self.stop,
            "load_s": self.load_s,
            "prompt_s": self.prompt_s,
            "prompt_tokens_per_s": n_prompt / self.prompt_s if self.prompt_s > 0 else None,
            "generation_s": self.generation_s,
            "tokens_per_s": self.steps / self.generation_s if self.steps and self.generation_s > 0 else None,
        }


class _Stream:
    """The text of an answer as it grows: each token's new characters, a character split across tokens held back
    until it is whole (or the ids themselves without a tokenizer)."""

    def __init__(self, tok: Tokenizer | None, stops: dict, emit: Callable[[int, str], None] | None):
        self.tok, self.stops, self.emit, self.ids, self.shown = tok, stops, emit, [], ""

    def add(self, tid: int) -> None:
        self.ids.append(tid)
        if self.emit is None:
            return
        if self.tok is None:
            self.emit(tid, f"{tid} ")
            return
        if tid in self.stops:
            self.emit(tid, "")
            return
        text = self.tok.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.shown):
            self.emit(tid, "")  # an unfinished UTF-8 character (or a decoder that rewrites the start): wait
            return
        piece, self.shown = text[len(self.shown):], text
        self.emit(tid, piece)

    def flush(self) -> None:
        if self.emit is None or self.tok is None:
            return
        body = [t for t in self.ids if t not in self.stops]
        text = self.tok.decode(body)
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.emit(-1, text[len(self.shown):])


def _answer(hp, weights, stub, prompt: list[int], opts: Options, stops: dict, stream: _Stream) -> Answer:
    t0 = time.perf_counter()
    weights.preload()  # (kept weights: decoded before the clock starts)
    load_s = time.perf_counter() - t0
    sample = Sampler(opts.temp, opts.top_k, opts.top_p, opts.seed or 0)
    state = State() if opts.cache else None
    seq = list(prompt)
    t0 = time.perf_counter()
    lg = forward.run(stub, np.asarray(seq), weights=weights, hp=hp, state=state, last=True)
    prompt_s = time.perf_counter() - t0
    out, gen_s, steps, stop = [], 0.0, 0, "max tokens"
    while True:
        tid = sample(lg[-1])
        out.append(tid)
        seq.append(tid)
        stream.add(tid)
        if tid in stops:
            stop = stops[tid]
            break
        if len(out) >= opts.max_tokens:
            break
        t0 = time.perf_counter()
        step = np.asarray([tid]) if opts.cache else np.asarray(seq)
        lg = forward.run(stub, step, weights=weights, hp=hp, state=state, last=True)
        gen_s += time.perf_counter() - t0
        steps += 1
    stream.flush()
    return Answer(out, stop, load_s, prompt_s, gen_s, steps)


# ------------------------------------------------------------------------------------------- entry

def _float32_bytes(shapes) -> int:
    return sum(4 * math.prod(s) for s in shapes if len(s) >= 2)


def generate(pack_path: Path, opts: Options, source: Path | None = None,
             on_token: Callable[[str, int, str], None] | None = None,
             on_answer: Callable[[str], None] | None = None) -> dict:
    """The pack's answer (and the source's float model's, when given) to the prompt; the report as a dict.

    ``on_answer(label)``: an answer begins ("pack", then "source"); ``on_token(label, id, text)``: a token came, with
    the text it adds (empty while a character is unfinished, or for the stop token)."""
    check_options(opts)
    pack_path = Path(pack_path)
    if not pack_path.exists():
        raise EvalError(f"{escape_name(str(pack_path))}: no such file; give an .orkpack")
    if _is_gguf(pack_path):
        raise EvalError(f"{escape_name(str(pack_path))}: a GGUF, not an .orkpack; build a pack from it first "
                        "(orkpack build), or give it as --source of one")
    from threadpoolctl import threadpool_limits

    closers = []
    try:
        with threadpool_limits(limits=opts.threads or None, user_api="blas"):
            return _generate(pack_path, opts, source, on_token, on_answer, closers)
    finally:
        for c in reversed(closers):
            c()


def _generate(pack_path, opts, source, on_token, on_answer, closers) -> dict:
    where = escape_name(str(pack_path))
    pack = Pack.open(pack_path)
    closers.append(pack.close)
    hp = pack_hparams(pack)
    record = pack.header.get("model") if not check_model(pack.header.get("model")) else None
    names_shapes = {t["name"]: t["shape"] for t in pack.tensors}
    src = hp_src = None
    if source is not None:
        src = open_source(source, on_warning=lambda m: None)
        closers.append(src.close)
        hp_src = forward.model_hparams(src)
        _check_same_model(src, names_shapes, hp_src, hp, where, untied_of(pack) | _rotation_untied(pack))
    try:
        tok = from_model(record, where, instead="give the prompt as token ids instead: --tokens IDS")
    except TokenizerError:
        if opts.prompt is not None:
            raise
        tok = None
    rendered = None
    if opts.tokens is not None:
        prompt = parse_ids(opts.tokens, hp.vocab)
    elif opts.chat:
        rendered = render(record, [{"role": "user", "content": opts.prompt}], where)
        prompt = tok.encode(rendered, special=False)
    else:
        prompt = tok.encode(opts.prompt)
    if not prompt:
        raise EvalError("-p: the prompt tokenizes to nothing; give some text")
    stops = {}
    for label, key in _STOP_KEYS:
        tid = get(record, key)
        if isinstance(tid, int) and 0 <= tid < hp.vocab:
            stops.setdefault(tid, label)
    if opts.chat:
        eot = end_of_turn(record, tok, where)
        if eot is not None:
            stops.setdefault(eot, "end of turn")

    stub = SimpleNamespace(root=pack_path, config=pack.header.get("config"))
    keep = _float32_bytes(names_shapes.values()) <= KEEP_BYTES
    weights = PackWeights(pack, "decode", cpu_act=opts.cpu_act, keep=keep)
    if on_answer:
        on_answer("pack")
    emit = (lambda tid, piece: on_token("pack", tid, piece)) if on_token else None
    ans = _answer(hp, weights, stub, prompt, opts, stops, _Stream(tok, stops, emit))
    del weights  # its decoded matrices, before the source's
    answers = {"pack": ans.report(tok, len(prompt), stops)}
    parted = None
    if src is not None:
        skeep = _float32_bytes(t.shape for t in src.tensors()) <= KEEP_BYTES
        if on_answer:
            on_answer("source")
        emit = (lambda tid, piece: on_token("source", tid, piece)) if on_token else None
        ref = _answer(hp_src, SourceWeights(src, keep=skeep), src, prompt, opts, stops, _Stream(tok, stops, emit))
        answers["source"] = ref.report(tok, len(prompt), stops)
        a, b = ans.tokens, ref.tokens
        parted = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if parted is None and len(a) != len(b):
            parted = min(len(a), len(b))
    sampling = {"greedy": True} if opts.temp == 0 else {"greedy": False, "temp": opts.temp, "top_k": opts.top_k,
                                                         "top_p": opts.top_p, "seed": opts.seed or 0}
    return {
        "pack": str(pack_path),
        "source": None if source is None else str(source),
        "numerics": f"the decode path: every matmul on the CPU (host copies, host slices as stored, NPU-only "
                    f"slices from their int8 tiles), activations {opts.cpu_act}",
        "cpu_act": opts.cpu_act,
        "cache": opts.cache,
        "weights": "decoded once, kept" if keep else "decoded per layer and step",
        "prompt": opts.prompt,
        "chat": opts.chat,
        "rendered": rendered,
        "prompt_tokens": [int(t) for t in prompt],
        "sampling": sampling,
        "max_tokens": opts.max_tokens,
        "stop_tokens": {int(t): label for t, label in stops.items()},
        "tokenizer": tok is not None,
        "answers": answers,
        "parted_at": parted,
    }
