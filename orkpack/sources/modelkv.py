"""The model a runtime runs, as GGUF key-value pairs (the pack's ``model`` header key, docs/FORMAT.md 9).

A pack carries what a llama.cpp-based runtime needs to run the model without its
source: the architecture's hyperparameters, RoPE base and scaling, norm epsilons,
context length, sliding-window and softcap settings, the tokenizer and the chat
template, with the keys and meanings of GGUF metadata (llama.cpp builds its
model from exactly these keys).

* From a GGUF: its key-value pairs as they are, types included (only gguf-py's
  synthesized ``GGUF.*`` entries, which describe the file rather than the model,
  are left out).
* From an HF folder: config.json, tokenizer.json and tokenizer_config.json,
  converted as llama.cpp's converter (convert_hf_to_gguf.py) converts them:
  ``{arch}.*`` hyperparameters (the common ones of its ``TextModel``, and the
  family's own: the table :mod:`orkpack.ggufkeys`), ``tokenizer.ggml.*`` through gguf-py's
  own vocabulary readers (``gguf.vocab``: the same code the converter uses), and
  the tokenizer.json itself as ``tokenizer.huggingface.json`` (a key of the GGUF
  specification), so a reader can tokenize exactly as transformers does.

The record's format (entries, types, values as JSON) is orkpack.pack.model.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .. import ggufkeys as G
from ..errors import SourceError, escape_name
from ..pack.model import json_value

# ------------------------------------------------------------------------------------------ from a GGUF

def from_gguf_fields(fields: Mapping[str, Any]) -> dict:
    """The ``model`` record of a GGUF's metadata: gguf-py ``GGUFReader.fields``, in file order, types kept."""
    from gguf import GGUFValueType

    def tname(types: list) -> str:
        if types[0] == GGUFValueType.ARRAY:
            return f"array[{tname(types[1:])}]" if len(types) > 1 else "array[uint8]"
        return types[0].name.lower()

    kv = []
    for key, f in fields.items():
        if key.startswith("GGUF.") or not f.types:
            continue
        typ = tname(list(f.types))
        if typ == "array[uint8]" and len(f.types) == 1:  # an empty array of unknown type: gguf-py gives no item type
            kv.append([key, typ, []])
            continue
        kv.append([key, typ, json_value(typ, f.contents())])
    return {"source": "gguf", "kv": kv}


# ------------------------------------------------------------------------------------------ from an HF folder

# The {arch}.* keys, where config.json keeps each and its type: orkpack.ggufkeys (llama.cpp's TextModel and the
# family's own converter class). config.json's rope_scaling types llama.cpp has no name for: dynamic is linear
_SCALING_TYPE_NAME = {"dynamic": "linear"}

# GGUF token types (llama.cpp's llama_token_type / gguf.TokenType)
MAX_VOCAB = 1 << 20  # token ids of a tokenizer.json (the largest published vocabularies hold 262k tokens)
_TOKEN_TYPES = {"NORMAL": 1, "UNKNOWN": 2, "CONTROL": 3, "USER_DEFINED": 4, "UNUSED": 5, "BYTE": 6}


def _first(cfg: Mapping, keys: Iterable[str]) -> Any:
    """The first key present (not None); a dotted key is a path into nested objects (rope_parameters.x.y)."""
    for k in keys:
        v: Any = cfg
        for part in k.split("."):
            v = v.get(part) if isinstance(v, Mapping) else None
        if v is not None:
            return v
    return None


def _valid(typ: str, v: Any) -> bool:
    """A config value that is a well-formed value of GGUF type ``typ`` (others are left out, as the
    converter would fail on them: a config's own checks name them elsewhere)."""
    if typ == "uint32":
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32
    if typ == "float32":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 3.4e38
    if typ == "bool":
        return isinstance(v, bool)
    return isinstance(v, str)


def _hparams(cfg: Mapping, fam_name: str | None, garch: str, kv: list, warn: Callable[[str], None]) -> None:
    from .. import archs

    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), Mapping) else None
    c = {**cfg, **text} if text else cfg
    rp = c.get("rope_parameters")  # transformers 5 keeps rope_theta and the scaling here
    if isinstance(rp, Mapping):
        rp = rp.get("full_attention", rp) if isinstance(rp.get("full_attention"), Mapping) else rp
        c = {**c, "rope_theta": c.get("rope_theta", rp.get("rope_theta"))}
        if rp.get("rope_type", "default") != "default" and not isinstance(c.get("rope_scaling"), Mapping):
            c["rope_scaling"] = rp
    seen = set()
    # every family's config keys, then the family's own (a key found by the first is not looked up again)
    for source in (lambda k: k.hf, lambda k: k.family.get(fam_name or "", ())):
        for k in G.FROM_CONFIG:
            keys, name = source(k), k.at(garch)
            if not keys or name in seen:
                continue
            v = _first(c, keys)
            if not _valid(k.type, v):
                continue
            seen.add(name)
            kv.append([name, k.type, json_value(k.type, v)])
    # head dims and the rotary dimensions (partial rotary: phi, glm, stablelm)
    hd = _first(c, ("head_dim",))
    nh, hidden = _first(c, ("num_attention_heads", "n_head")), _first(c, ("hidden_size", "n_embd"))
    if hd is None and _valid("uint32", nh) and _valid("uint32", hidden) and nh > 0:
        hd = hidden // nh
    fam = archs.family(fam_name) if fam_name else None
    if fam is not None and fam.attention == "mla":
        rope = _first(c, ("qk_rope_head_dim",))
        if _valid("uint32", rope):
            kv.append([G.ROPE_DIMENSION_COUNT.at(garch), G.ROPE_DIMENSION_COUNT.type, rope])
    elif _valid("uint32", hd):
        frac = _first(c, ("partial_rotary_factor",))
        if frac is None and isinstance(rp, Mapping):  # transformers 5 keeps it in rope_parameters
            frac = rp.get("partial_rotary_factor")
        if frac is None and fam is not None:  # the family's own default share (ChatGLMModel: 0.5, as transformers')
            frac = fam.defaults.get("partial_rotary_factor")
        rot = int(hd * frac) if _valid("float32", frac) and 0 < frac <= 1 else hd
        kv.append([G.ROPE_DIMENSION_COUNT.at(garch), G.ROPE_DIMENSION_COUNT.type, rot])
    _rope_scaling(c, garch, kv, warn)
    if fam is not None and (fam.blocks is not None or fam.more_dims is not None or fam.record or fam.record_swa
                            or fam.name in _GATING_WRITTEN or fam.name in _OWN_KEYS):
        _derived(cfg, fam, garch, kv)


def _derived(cfg: Mapping, fam, garch: str, kv: list) -> None:
    """What the converter writes from the family's own arithmetic (archs): the FFN width the entry derives
    (``more_dims``: LFM2's auto-adjusted width), and a hybrid's per-layer KV heads, 0 for recurrent layers."""
    from .. import archs

    try:
        d = archs.dims(cfg)
        blocks = archs.layer_blocks(cfg)
    except SourceError:
        return  # a config the plan refuses in one line elsewhere; the record keeps the plain keys

    def put(key: G.Key, typ: str, v: Any) -> None:
        name = key.at(garch)
        for e in kv:
            if e[0] == name:
                e[1], e[2] = typ, v
                return
        kv.append([name, typ, v])

    if fam.more_dims is not None:
        put(G.FEED_FORWARD_LENGTH, G.FEED_FORWARD_LENGTH.type, d["I"])
    tc0 = cfg.get("text_config") if fam.text_config and isinstance(cfg.get("text_config"), Mapping) else cfg
    if fam.record_swa and tc0.get("sliding_window") is not None:  # Olmo2Model: the window's layers, one bool per layer
        swa = set(archs.facts_from_config(cfg)["swa_layers"])
        put(G.SLIDING_WINDOW_PATTERN, G.SLIDING_WINDOW_PATTERN.type, [i in swa for i in range(d["L"])])
    for name, v in archs.record_values(cfg):  # the converter's own arithmetic (archs Family.record)
        key = G.BY_NAME[name]
        put(key, key.type, v)
    own = _OWN_KEYS.get(fam.name)
    if own is not None:  # the family's converter class's own keys (Gemma4Model, Gemma3NModel)
        own(cfg, fam, d, put)
    if fam.blocks is not None and fam.blocks.record in ("kv_heads", "kv_heads_ffn"):
        put(G.HEAD_COUNT_KV, G.HEAD_COUNT_KV_PER_LAYER, [d["nkv"] if b == archs.ATTN else 0 for b in blocks])
        if "di" in d:  # Mamba2's d_inner (GraniteHybridModel: mamba_expand x hidden; NemotronHModel: heads x head dim)
            put(G.SSM_INNER_SIZE, G.SSM_INNER_SIZE.type, d["di"])
        if fam.blocks.record == "kv_heads_ffn":  # NemotronHModel: the FFN width on the FFN-only layers, else 0
            put(G.FEED_FORWARD_LENGTH, G.HEAD_COUNT_KV_PER_LAYER,
                [d["I"] if fam.blocks.parts.get(b) == "ffn" else 0 for b in blocks])
    elif fam.blocks is not None and fam.blocks.record == "all":  # FalconH1Model: one KV head count, Mamba2's sizes
        # (RWKV7: every layer recurrent, its sizes the family's record)
        for key, dim in ((G.SSM_CONV_KERNEL, "ck"), (G.SSM_INNER_SIZE, "di"), (G.SSM_STATE_SIZE, "ds"),
                         (G.SSM_TIME_STEP_RANK, "nm"), (G.SSM_GROUP_COUNT, "ng")) if "ck" in d else ():
            put(key, key.type, d[dim])  # d_inner // mamba_d_head = the heads; mamba_d_ssm, not expand x hidden
    elif fam.blocks is not None:  # Qwen3NextModel: the list, the interval (its default 4 when absent), d_inner
        put(G.RECURRENT_LAYERS, G.RECURRENT_LAYERS.type, [b != archs.ATTN for b in blocks])
        tc = cfg.get("text_config") if fam.text_config and isinstance(cfg.get("text_config"), Mapping) else cfg
        n = tc.get(fam.blocks.interval)
        put(G.FULL_ATTENTION_INTERVAL, G.FULL_ATTENTION_INTERVAL.type,
            n if _valid("uint32", n) else G.FULL_ATTENTION_INTERVAL.default)
        put(G.SSM_INNER_SIZE, G.SSM_INNER_SIZE.type, d["di"])
        rp = tc.get("rope_parameters")
        if fam.name in _MROPE_WRITTEN:
            sec = rp.get("mrope_section") if isinstance(rp, Mapping) else None
            put(G.ROPE_DIMENSION_SECTIONS, G.ROPE_DIMENSION_SECTIONS.type,
                (list(sec) + [0] * 4)[:4] if isinstance(sec, list) and all(_valid("uint32", x) for x in sec)
                else [11, 11, 10, 0])  # _Qwen35MRopeMixin's default
        frac = tc.get("partial_rotary_factor", rp.get("partial_rotary_factor") if isinstance(rp, Mapping) else None)
        hd, dflt = d["hd"], fam.defaults.get("partial_rotary_factor")
        if frac is None and dflt is not None:  # Qwen3NextModel: the rotary share defaults to 0.25, as transformers'
            put(G.ROPE_DIMENSION_COUNT, G.ROPE_DIMENSION_COUNT.type, int(hd * dflt))
    switch = fam.forward.rope_switch if fam.forward is not None else ""
    nope = fam.forward is not None and fam.forward.rope_layers == "none"
    if switch or nope:  # granite-hybrid's RoPE switch (Nemotron-H: always NoPE); a NoPE model's context is unbounded
        # (GraniteHybridModel: 2**20)
        tc = cfg.get("text_config") if fam.text_config and isinstance(cfg.get("text_config"), Mapping) else cfg
        rope = not nope and tc.get(switch) == "rope"
        put(G.ROPE_SCALING_FINETUNED, G.ROPE_SCALING_FINETUNED.type, rope)
        if not rope:
            put(G.CONTEXT_LENGTH, G.CONTEXT_LENGTH.type, 2 ** 20)
    if fam.name in _GATING_WRITTEN and d["E"]:
        put(G.EXPERT_GATING_FUNC, G.EXPERT_GATING_FUNC.type, 2 if fam.forward.router == "sigmoid" else 1)


def own_keys(cfg: Mapping) -> dict:
    """{key after "{arch}.": (GGUF type, value)}: what the family's converter class writes beyond the common keys
    (Gemma4Model, Gemma3NModel; synthetic GGUFs); {} for every other family."""
    from .. import archs

    fam = archs.config_family(cfg)
    out: dict = {}
    own = _OWN_KEYS.get(fam.name) if fam is not None else None
    if own is not None:
        own(cfg, fam, archs.dims(cfg), lambda key, typ, v: out.__setitem__(key.name, (typ, v)))
    return out


def _gemma4(cfg: Mapping, fam, d: dict, put: Callable) -> None:
    """Gemma4Model's keys: each layer type's head size and rotated dims, per-layer KV heads when the full layers have
    their own, the FFN widths of a double-wide MLP, the KV-sharing layers, the per-layer embedding width, the
    sliding pattern and the sliding layers' RoPE base."""
    tc = cfg.get("text_config") if fam.text_config and isinstance(cfg.get("text_config"), Mapping) else cfg
    L, swa = d["L"], [k == "sliding_attention" for k in d["kinds"]]
    u = "uint32"
    put(G.SHARED_KV_LAYERS, u, d["nshared"])
    put(G.EMBEDDING_LENGTH_PER_LAYER, u, d["hpl"])
    put(G.SLIDING_WINDOW_PATTERN, G.SLIDING_WINDOW_PATTERN.type, swa)
    for key, v in ((G.KEY_LENGTH, d["hf"]), (G.VALUE_LENGTH, d["hf"]), (G.KEY_LENGTH_SWA, d["hs"]),
                   (G.VALUE_LENGTH_SWA, d["hs"]), (G.ROPE_DIMENSION_COUNT, d["hf"])):
        put(key, u, v)
    if d["Iw"] != d["I0"]:
        put(G.FEED_FORWARD_LENGTH, G.HEAD_COUNT_KV_PER_LAYER, [d["I0"] if i < L - d["nshared"] else d["Iw"]
                                                              for i in range(L)])
    else:
        put(G.FEED_FORWARD_LENGTH, u, d["I0"])
    plc = tc.get("per_layer_config")
    own_kv = tc.get("num_global_key_value_heads") is not None or (isinstance(plc, Mapping) and any(
        isinstance(x, Mapping) and "num_key_value_heads" in x and str(k).isdigit() and int(k) < L and not swa[int(k)]
        for k, x in plc.items()))
    if own_kv:  # the converter's condition: the full layers' KV heads are given
        put(G.HEAD_COUNT_KV, G.HEAD_COUNT_KV_PER_LAYER, [d["nks"] if s else d["nkf"] for s in swa])
    rp = tc.get("rope_parameters")
    sl = rp.get("sliding_attention") if isinstance(rp, Mapping) else None
    sl = sl if isinstance(sl, Mapping) else {}
    frac = sl.get("partial_rotary_factor", 1.0)
    put(G.ROPE_DIMENSION_COUNT_SWA, u, int(d["hs"] * frac) if _valid("float32", frac) else d["hs"])
    if _valid("float32", sl.get("rope_theta")):
        put(G.ROPE_FREQ_BASE_SWA, "float32", float(sl["rope_theta"]))

def _gemma3n(cfg: Mapping, fam, d: dict, put: Callable) -> None:
    """Gemma3NModel's keys: the FFN widths (one per layer when the config lists them), the AltUp streams, the
    per-layer embedding width, the KV-sharing layers, each layer's activation-sparsity std multiplier (-inf: none)
    and the sliding pattern."""
    from .. import archs

    u = "uint32"
    if "I_layers" in d:
        put(G.FEED_FORWARD_LENGTH, G.HEAD_COUNT_KV_PER_LAYER, list(d["I_layers"]))
    put(G.ALTUP_ACTIVE_IDX, u, d["active"])
    put(G.ALTUP_NUM_INPUTS, u, d["na"])
    put(G.EMBEDDING_LENGTH_PER_LAYER, u, d["hpl"])
    put(G.SHARED_KV_LAYERS, u, d["nshared"])
    put(G.ACTIVATION_SPARSITY_SCALE, G.ACTIVATION_SPARSITY_SCALE.type,
        json_value(G.ACTIVATION_SPARSITY_SCALE.type, [archs.activation_sparsity_scale(p) for p in d["sparsity"]]))
    put(G.SLIDING_WINDOW_PATTERN, G.SLIDING_WINDOW_PATTERN.type, [k == "sliding_attention" for k in d["kinds"]])


def _minicpm(cfg: Mapping, fam, d: dict, put: Callable) -> None:
    """MiniCPMModel's keys: the residual scale scale_depth / sqrt(layers) and the logit scale hidden /
    dim_model_base (llama.cpp's minicpm reads both; without them it scales neither)."""
    depth, base = cfg.get("scale_depth"), cfg.get("dim_model_base")
    if _valid("float32", depth):
        put(G.RESIDUAL_SCALE, "float32", float(depth) / d["L"] ** 0.5)
    if _valid("float32", base) and base:
        put(G.LOGIT_SCALE, "float32", d["H"] / float(base))


_OWN_KEYS: dict[str, Callable] = {"gemma4_text": _gemma4, "gemma4": _gemma4, "gemma3n_text": _gemma3n,
                                  "gemma3n": _gemma3n, "minicpm": _minicpm}


# families whose converter writes rope.dimension_sections (_Qwen35MRopeMixin)
_MROPE_WRITTEN = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe")

# families whose converter writes expert_gating_func from the router alone (LFM2MoeModel, Glm4MoeModel: always
# sigmoid, 2; LFM2MoeModel writes neither expert_weights_norm nor expert_weights_scale: llama.cpp always normalises)
_GATING_WRITTEN = ("lfm2_moe", "glm4_moe", "deepseek_v3")  # DeepSeek-V3: TextModel's, from scoring_func "sigmoid"
# (every release has it; orkpack's forward routes V3 by sigmoid whatever it says)


def _rope_scaling(c: Mapping, garch: str, kv: list, warn: Callable[[str], None]) -> None:
    rs = c.get("rope_scaling")
    if not isinstance(rs, Mapping):
        return
    kind = rs.get("rope_type", rs.get("type"))
    factor = G.ROPE_SCALING_FACTOR
    alpha, theta = rs.get("alpha"), rs.get("rope_theta", c.get("rope_theta", 10000.0))
    hd = _first(c, ("head_dim",))
    if kind == "dynamic" and _valid("float32", alpha) and alpha > 0 and _valid("uint32", hd) and hd > 2 \
            and _valid("float32", theta):
        # HunYuan's NTK-alpha (HunYuanModel): the scaled base, no scaling, and a 256k context
        def put(key: G.Key, v: Any) -> None:
            name = key.at(garch)
            kv[:] = [e for e in kv if e[0] != name] + [[name, key.type, v]]
        put(G.ROPE_FREQ_BASE, float(theta * alpha ** (hd / (hd - 2))))
        put(G.ROPE_SCALING_TYPE, "none")
        put(G.ROPE_SCALING_FACTOR, 1.0)
        put(G.ROPE_SCALING_ORIG_CTX_LEN, 256 * 1024)
        put(G.CONTEXT_LENGTH, 256 * 1024)
        return
    # written with a valid factor only; llama3 always (llama.cpp's converter turns llama3 scaling into a
    # rope_freqs tensor; the pack keeps its parameters)
    if kind in G.ROPE_SCALING_TYPE.kinds and (kind == "llama3" or _valid(factor.type, rs.get(factor.rope_scaling))):
        kv.append([G.ROPE_SCALING_TYPE.at(garch), G.ROPE_SCALING_TYPE.type, _SCALING_TYPE_NAME.get(kind, kind)])
        for k in G.ROPE_SCALING:
            v = rs.get(k.rope_scaling)
            if kind in k.kinds and _valid(k.type, v):
                kv.append([k.at(garch), k.type, json_value(k.type, v)])
    elif kind not in (None, "default", "proportional"):  # proportional (gemma4): the rope_freqs tensor carries it
        warn(f"config.json: rope_scaling type {escape_name(repr(kind), 40)} is not carried into the pack's model "
             "metadata; a runtime will run the model without it")


PRE_TABLE = Path(__file__).resolve().parents[1] / "data" / "tokenizer_pre.json"


def pre_name(tokenizer_json: str) -> str:
    """The ``tokenizer.ggml.pre`` llama.cpp's converter gives this tokenizer.json (``get_vocab_base_pre``: the sha256
    of ``str()`` of the ids it encodes the converter's check text to, special tokens added, looked up in the
    converter's table, orkpack/data/tokenizer_pre.json from scripts/tokenizer_pre_table.py), or ``default`` where
    the hash is not in the table (where the converter refuses the model) or the tokenizer cannot be loaded."""
    import hashlib

    try:
        import tokenizers

        table = json.loads(PRE_TABLE.read_text(encoding="utf-8"))
        ids = tokenizers.Tokenizer.from_str(tokenizer_json).encode(table["chktxt"]).ids
    except Exception:  # no tokenizers library, a tokenizer.json it cannot load: the pack still carries the file
        return "default"
    return table["names"].get(hashlib.sha256(str(list(ids)).encode()).hexdigest(), "default")


def _tokenizer(folder: Path, kv: list, warn: Callable[[str], None]) -> None:
    """tokenizer.ggml.* as llama.cpp's converter writes them, plus tokenizer.json as tokenizer.huggingface.json."""
    import gguf
    from gguf.vocab import SentencePieceVocab, SpecialVocab

    tj = folder / "tokenizer.json"
    tok_model = None
    vocab = None
    if tj.is_file():
        try:
            text = tj.read_text(encoding="utf-8")
            tdata = json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise SourceError(f"{escape_name(str(tj))}: cannot read ({e.__class__.__name__}); restore the original") from None
        model = tdata.get("model") if isinstance(tdata, dict) else None
        mtype = model.get("type") if isinstance(model, dict) else None
        if mtype == "BPE" and isinstance(model.get("vocab"), dict):
            vocab = _HfVocab(tdata, escape_name(str(tj)))
            tok_model = "llama" if model.get("byte_fallback") else "gpt2"
        else:
            warn(f"{escape_name(str(tj))}: tokenizer model {escape_name(repr(mtype), 30)} is carried only as "
                 "tokenizer.huggingface.json (no tokenizer.ggml.* keys)")
        kv.append(["tokenizer.huggingface.json", "string", text])
    elif (folder / "tokenizer.model").is_file():
        try:
            vocab, tok_model = SentencePieceVocab(folder), "llama"
        except Exception as e:  # sentencepiece missing (ImportError) or the model unreadable
            warn(f"{escape_name(str(folder / 'tokenizer.model'))}: not read ({e.__class__.__name__}); "
                 "the pack carries no tokenizer")
            vocab = None
    else:
        warn(f"{escape_name(str(folder))}: no tokenizer.json or tokenizer.model; the pack carries no tokenizer")
    if vocab is not None:
        tokens, scores, types = [], [], []
        for text_, score, ttype in vocab.all_tokens():
            tokens.append(text_)
            scores.append(score)
            types.append(int(ttype))
        kv.append(["tokenizer.ggml.model", "string", tok_model])
        if tok_model == "gpt2":
            # named as llama.cpp's converter names it (a hash of a check text's ids); the pack carries
            # tokenizer.json too, whose pre-tokenizer is the exact one
            kv.append(["tokenizer.ggml.pre", "string", pre_name(text) if tj.is_file() else "default"])
        kv.append(["tokenizer.ggml.tokens", "array[string]", json_value("array[string]", tokens)])
        if tok_model == "llama":
            kv.append(["tokenizer.ggml.scores", "array[float32]", json_value("array[float32]", scores)])
        kv.append(["tokenizer.ggml.token_type", "array[int32]", types])
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        try:
            cfg = json.loads(tc.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise SourceError(f"{escape_name(str(tc))}: cannot read ({e.__class__.__name__}); restore the original") from None
        if not isinstance(cfg, dict):
            raise SourceError(f"{escape_name(str(tc))}: not a JSON object; restore the original")
    import logging

    class _ToWarn(logging.Handler):  # gguf-py logs what it skips (a chat template of a bad type, ...): one warning line each
        def emit(self, record):
            warn(f"{escape_name(str(folder))}: " + escape_name(record.getMessage(), 200))

    log, handler = logging.getLogger("gguf.vocab"), _ToWarn(logging.WARNING)
    log.addHandler(handler)
    propagate, log.propagate = log.propagate, False
    try:
        special = SpecialVocab(folder, load_merges=(tok_model == "gpt2"), n_vocab=None)
    except Exception as e:  # noqa: BLE001 - gguf-py's reader of the two files, on any hostile content
        raise SourceError(f"{escape_name(str(tc))} / tokenizer.json: the special tokens, merges or chat template do "
                          f"not read ({e.__class__.__name__}); restore the original files") from None
    finally:
        log.removeHandler(handler)
        log.propagate = propagate
    if special.merges:
        kv.append(["tokenizer.ggml.merges", "array[string]", [str(m) for m in special.merges]])
    keys = gguf.Keys.Tokenizer  # the GGUF key of each special token type, as SpecialVocab.add_to_gguf names it
    for typ, tid in sorted(special.special_token_ids.items()):
        key = getattr(keys, f"{typ.upper()}_ID", None)
        if key and isinstance(tid, int) and not isinstance(tid, bool) and 0 <= tid < 2**32:
            kv.append([key, "uint32", tid])
    for typ, flag in sorted(special.add_special_token.items()):
        key = getattr(keys, f"ADD_{typ.upper()}", None)
        if key:
            kv.append([key, "bool", bool(flag)])
    tmpl = special.chat_template
    if isinstance(tmpl, str):
        kv.append(["tokenizer.chat_template", "string", tmpl])
    elif isinstance(tmpl, list):  # named templates: the default one, and each by name (as llama.cpp stores them)
        for t in tmpl:
            if isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str):
                key = "tokenizer.chat_template" if t["name"] == "default" else f"tokenizer.chat_template.{t['name']}"
                kv.append([key, "string", t["template"]])


class _HfVocab:
    """The tokens of a BPE tokenizer.json in id order, typed as llama.cpp's converter types them.

    Added tokens marked special are CONTROL, other added tokens USER_DEFINED, ``<0xXX>`` tokens of a
    byte-fallback (SentencePiece-style) model BYTE, its unknown token UNKNOWN, ids no token names
    ``[PADn]`` UNUSED, the rest NORMAL. Scores (used by the ``llama`` model only): minus the id, the merge
    order of a BPE vocabulary (llama.cpp's ``LlamaHfVocab`` does the same).
    """

    def __init__(self, tdata: dict, where: str = "tokenizer.json"):
        model = tdata["model"]
        vocab = model["vocab"]

        def bad(what: str):
            return SourceError(f"{where}: {what}; restore the original tokenizer.json")

        def text_ok(t) -> bool:
            if not isinstance(t, str):
                return False
            try:
                t.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate (\ud800 in the JSON): no UTF-8 for it
                return False
            return True

        def id_ok(i) -> bool:
            return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_VOCAB

        for tok, i in vocab.items():
            if not text_ok(tok):
                raise bad(f"model.vocab has a token that is not text ({escape_name(repr(tok), 40)})")
            if not id_ok(i):
                raise bad(f"model.vocab {escape_name(repr(tok), 40)} has id {escape_name(repr(i), 40)}, not an integer "
                          f"0..{MAX_VOCAB - 1}")
        added_list = tdata.get("added_tokens") or []
        if not isinstance(added_list, list):
            raise bad("added_tokens is not a list")
        added = {}
        for a in added_list:
            if not isinstance(a, dict) or not id_ok(a.get("id")) or not text_ok(a.get("content", "")):
                raise bad(f"added_tokens has an entry that is not {{id: 0..{MAX_VOCAB - 1}, content: text}} "
                          f"({escape_name(repr(a), 60)})")
            added[a["id"]] = a
        n = max([*vocab.values(), *added, -1]) + 1
        named = len(set(vocab.values()) | set(added))
        if n - named > max(1024, named):  # the padding a pack's header would carry as [PADn] tokens
            raise bad(f"token ids run to {n - 1} but only {named} ids have a token")
        by_id: list = [None] * n
        for tok, i in vocab.items():
            by_id[i] = tok
        for i, a in added.items():
            by_id[i] = a.get("content", "")
        fallback, unk = bool(model.get("byte_fallback")), model.get("unk_token")
        self._items = []
        for i, tok in enumerate(by_id):
            if tok is None:
                self._items.append((f"[PAD{i}]".encode(), -1000.0, _TOKEN_TYPES["UNUSED"]))
                continue
            if i in added:
                ttype = _TOKEN_TYPES["CONTROL" if added[i].get("special") else "USER_DEFINED"]
            elif fallback and len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
                ttype = _TOKEN_TYPES["BYTE"]
            elif fallback and tok == unk:
                ttype = _TOKEN_TYPES["UNKNOWN"]
            else:
                ttype = _TOKEN_TYPES["NORMAL"]
            self._items.append((tok.encode("utf-8"), -float(i), ttype))

    def all_tokens(self):
        return iter(self._items)


def _pad_vocab(kv: list, garch: str) -> None:
    """Tokens up to the config's vocabulary size, as llama.cpp's converter pads them (``get_vocab_base``,
    ``_set_vocab_sentencepiece``: ``[PADn]``, UNUSED, score -1000): the embedding has that many rows, and llama.cpp
    refuses a model whose token list is shorter than its embedding ("token_embd.weight has wrong shape")."""
    at = {e[0]: e for e in kv}
    size, toks = at.get(G.VOCAB_SIZE.at(garch)), at.get("tokenizer.ggml.tokens")
    if size is None or toks is None or not isinstance(size[2], int) or len(toks[2]) >= size[2]:
        return
    n0 = len(toks[2])
    toks[2].extend(f"[PAD{i}]" for i in range(n0, size[2]))
    if "tokenizer.ggml.token_type" in at and len(at["tokenizer.ggml.token_type"][2]) == n0:
        at["tokenizer.ggml.token_type"][2].extend([_TOKEN_TYPES["UNUSED"]] * (size[2] - n0))
    if "tokenizer.ggml.scores" in at and len(at["tokenizer.ggml.scores"][2]) == n0:
        at["tokenizer.ggml.scores"][2].extend([-1000.0] * (size[2] - n0))


def from_hf(folder: Path, config: Mapping | None, warn: Callable[[str], None] = lambda s: None) -> dict | None:
    """The ``model`` record of an HF folder (config.json + tokenizer files), or None without a config.json."""
    from .. import archs

    if not isinstance(config, Mapping):
        return None
    fam = archs.config_family(config)
    kv: list = []
    if fam is not None:
        garch = archs.gguf_arch_name(fam.name)
    else:
        garch = str(config.get("model_type") or "unknown")
        warn(f"model_type {escape_name(repr(config.get('model_type')), 40)} is not a known architecture: the pack's "
             "model metadata holds the common hyperparameters only")
    kv.append(["general.architecture", "string", garch])
    kv.append(["general.type", "string", "model"])
    name = config.get("_name_or_path")
    if isinstance(name, str) and name:
        kv.append(["general.name", "string", Path(name).name])
    _hparams(config, fam.name if fam else None, garch, kv, warn)
    _tokenizer(Path(folder), kv, warn)
    _pad_vocab(kv, garch)
    # keep the first of any duplicate (a tokenizer key the config path also wrote): keys are unique in GGUF
    out, seen = [], set()
    for e in kv:
        if e[0] not in seen:
            seen.add(e[0])
            out.append(e)
    return {"source": "hf", "kv": out}
