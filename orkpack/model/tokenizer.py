"""Token ids for the eval, from the model record a pack or a source carries (docs/FORMAT.md 9).

The same ids as transformers' tokenizer of the same model:

* a record with ``tokenizer.huggingface.json`` (an HF source): that tokenizer.json, loaded by the
  ``tokenizers`` library, special tokens added as its post-processor adds them;
* a GGUF-style record (``tokenizer.ggml.*``): rebuilt as transformers rebuilds a GGUF's tokenizer
  (``transformers.integrations.gguf``), the reference the tests hold it to: ``gpt2`` is a byte-level
  BPE over the record's tokens and merges, split by the pre-tokenizer its ``tokenizer.ggml.pre``
  names when that is one of :data:`SPLITS` (else GPT-2's own split). Where transformers 5.24 has no
  split for a name llama.cpp implements (``smollm`` and the other digit-first names), this follows
  llama.cpp, which is the original tokenizer.json's split (docs/EVAL.md, "The tokenizer against llama.cpp's"), not
  transformers' GPT-2 fallback; ``llama`` is a SentencePiece-style
  BPE with byte fallback, whose merges come from the tokens' scores. CONTROL tokens are special and
  USER_DEFINED ones whole; the BOS token is prepended when ``tokenizer.ggml.add_bos_token`` says so
  (a ``llama`` vocabulary that does not say adds it, as llama.cpp does).

Other tokenizer models are refused with one line (:class:`TokenizerError`).
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import OrkError, escape_name
from ..pack.model import get

# pre-tokenizer splits by the name llama.cpp gives them in tokenizer.ggml.pre (llama.cpp src/llama-vocab.cpp, the
# published models' regexes): each regex in turn splits every piece the one before it left ("isolated": what no
# match covers stays a piece of its own), as llama.cpp applies its regex_exprs, then the byte-level spelling.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# every digit its own piece first, then GPT-2's split of what lies between (HF: Digits(individual_digits=True),
# then ByteLevel(use_regex=True); SmolLM's vocabulary has no token of two digits and no merge with one)
_DIGITS_GPT2 = (r"\p{N}", _GPT2)
SPLITS: dict[str, tuple[str, ...]] = {
    **{name: (_LLAMA3,) for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx")},
    **{name: (_QWEN2,) for name in ("qwen2", "deepseek-r1-qwen", "megrez")},
    **{name: _DIGITS_GPT2 for name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                       "minerva-7b", "mellum2")},
}

CONTROL, USER_DEFINED = 3, 4


class TokenizerError(OrkError):
    pass


class Tokenizer:
    """``encode(text) -> list[int]`` (with the model's BOS where it wants one) and ``decode(ids)``."""

    def __init__(self, backend: Any, bos: int | None):
        self._t = backend
        self._bos = bos

    def encode(self, text: str, special: bool = True) -> list[int]:
        """The ids of ``text``; ``special=False``: no special tokens added (no BOS: a rendered chat template writes
        its own, as transformers' ``apply_chat_template`` tokenizes it)."""
        ids = list(self._t.encode(text, add_special_tokens=special).ids)
        if special and self._bos is not None and (not ids or ids[0] != self._bos):
            ids.insert(0, self._bos)
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._t.decode(list(ids), skip_special_tokens=False)

    def is_special(self, tid: int) -> bool:
        """Whether ``tid`` is a special (control) token: one the text never spells, such as an end of turn."""
        tok = self._t.get_added_tokens_decoder().get(int(tid))
        return bool(tok is not None and tok.special)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values (the byte-level BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _scored_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: every split of a token into two tokens, best score first."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for tok, score in zip(tokens, scores):
        local = [(tok[:i], tok[i:], score) for i in range(1, len(tok)) if tok[:i] in vocab and tok[i:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def from_model(model: Mapping | None, where: str = "the pack",
               instead: str = "give --tokens FILE with token ids instead") -> Tokenizer:
    """The tokenizer a model record describes (TokenizerError naming what is missing and, for a record that has
    none, what to do ``instead``)."""
    try:
        import tokenizers
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    except ImportError:
        raise TokenizerError("the eval needs the tokenizers library: pip install tokenizers") from None
    if not model:
        raise TokenizerError(f"{where}: carries no model record (a pack before format 1.3, or a source without "
                             f"config.json): rebuild the pack, or {instead}")
    hf = get(model, "tokenizer.huggingface.json")
    if hf is not None:
        if not isinstance(hf, str):
            raise TokenizerError(f"{where}: its tokenizer.huggingface.json is not a string; rebuild the pack")
        try:
            return Tokenizer(tokenizers.Tokenizer.from_str(hf), None)
        except BaseException as e:  # noqa: BLE001 - the tokenizers library refuses it (any class, a Rust panic too)
            if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
                raise
            why = (str(e).splitlines() or [""])[0][:160]
            raise TokenizerError(f"{where}: its tokenizer.huggingface.json does not load in the tokenizers library "
                                 f"({escape_name(why)}); give --tokens FILE with token ids instead") from None
    kind = get(model, "tokenizer.ggml.model")
    tokens = get(model, "tokenizer.ggml.tokens")
    if kind is None or not isinstance(tokens, list):
        raise TokenizerError(f"{where}: carries no tokenizer (its source had no tokenizer.json, tokenizer.model or "
                             f"tokenizer.ggml.* keys); {instead}")
    if kind not in ("gpt2", "llama"):
        raise TokenizerError(f"{where}: tokenizer {kind!r} cannot be built for the eval yet (gpt2 and llama "
                             f"vocabularies can, or a tokenizer.json); {instead}")
    _check_ggml(model, tokens, where)

    def build() -> Tokenizer:
        types = get(model, "tokenizer.ggml.token_type") or [1] * len(tokens)
        if kind == "gpt2":
            spell = bytes_to_unicode()
            alphabet = set(spell.values())
            vocab = {(t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8", "surrogateescape"))): i
                     for i, t in enumerate(tokens)}
            merges = [tuple(m.split(" ", 1)) for m in get(model, "tokenizer.ggml.merges") or []]
            t = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
            split = SPLITS.get(get(model, "tokenizer.ggml.pre"))
            if split is None:
                t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            else:
                t.pre_tokenizer = pre_tokenizers.Sequence(
                    [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in split]
                    + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            t.decoder = decoders.ByteLevel()
            special = [AddedToken(x, normalized=False, special=True) for x, ty in zip(tokens, types)
                       if ty == CONTROL and set(x) <= alphabet]
            add_bos = get(model, "tokenizer.ggml.add_bos_token", False)
        else:
            scores = get(model, "tokenizer.ggml.scores") or [0.0] * len(tokens)
            vocab = {x: i for i, x in enumerate(tokens)}
            unk_id = get(model, "tokenizer.ggml.unknown_token_id")
            unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
            t = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=_scored_merges(tokens, scores), unk_token=unk,
                                                fuse_unk=True, byte_fallback=True))
            t.normalizer = None
            add_prefix = get(model, "tokenizer.ggml.add_space_prefix", True)
            t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if add_prefix else "never",
                                                       split=False)
            seq = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
            if add_prefix:
                seq.append(decoders.Strip(content=" ", left=1))
            t.decoder = decoders.Sequence(seq)
            special = [AddedToken(x, normalized=False, special=True) for x, ty in zip(tokens, types) if ty == CONTROL]
            add_bos = get(model, "tokenizer.ggml.add_bos_token", True)
        if special:
            t.add_special_tokens(special)
        user = [AddedToken(x, normalized=False, special=False) for x, ty in zip(tokens, types)
                if ty == USER_DEFINED and x in vocab]
        if user:
            t.add_tokens(user)
        bos_id = get(model, "tokenizer.ggml.bos_token_id")
        return Tokenizer(t, bos_id if add_bos and isinstance(bos_id, int) else None)

    try:
        return build()
    except TokenizerError:
        raise
    except BaseException as e:  # noqa: BLE001 - the tokenizers library refuses the vocabulary (a Rust panic too)
        if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
            raise
        why = (str(e).splitlines() or [""])[0][:160]
        raise TokenizerError(f"{where}: its tokenizer.ggml.* keys do not make a tokenizer ({escape_name(why)}); give "
                             "--tokens FILE with token ids instead") from None


def _check_ggml(model: Mapping, tokens: list, where: str) -> None:
    """TokenizerError naming the first tokenizer.ggml.* key a tokenizer cannot be built from (a record of the right
    GGUF types can still hold numbers where tokens belong, merges without a space, lists of another length)."""
    def bad(key: str, what: str):
        return TokenizerError(f"{where}: its model record's {key} {what}; rebuild the pack from its source, or give "
                              "--tokens FILE with token ids instead")

    if not all(isinstance(x, str) for x in tokens):
        raise bad("tokenizer.ggml.tokens", "holds something that is not a string")
    for key, ok, what in (
            ("tokenizer.ggml.token_type", lambda v: isinstance(v, list) and all(type(x) is int for x in v),
             "is not a list of integers"),
            ("tokenizer.ggml.scores", lambda v: isinstance(v, list) and all(isinstance(x, (int, float)) and
                                                                            not isinstance(x, bool) for x in v),
             "is not a list of numbers"),
            ("tokenizer.ggml.merges", lambda v: isinstance(v, list) and all(isinstance(x, str) and " " in x for x in v),
             "is not a list of \"left right\" strings"),
            ("tokenizer.ggml.pre", lambda v: isinstance(v, str), "is not a string")):
        v = get(model, key)
        if v is not None and not ok(v):
            raise bad(key, what)
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        v = get(model, key)
        if v is not None and len(v) != len(tokens):
            raise bad(key, f"holds {len(v)} values for {len(tokens)} tokens")
