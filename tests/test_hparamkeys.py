"""orkpack.ggufkeys: the one table of GGUF hyperparameter keys, and that its readers and writers behave as before.

* ``tests/fixtures/hparamkeys_golden.json`` holds, for every case of :func:`_cases` (every family's tiny config
  in orkpack.synth, every reference config in tests/fixtures/configs, and variants: RoPE scalings, transformers 5
  ``rope_parameters``, nested text configs, hostile values, unknown families), what the code produced at commit
  4877203, before the table: ``modelkv.from_hf``'s hyperparameter record and warnings, ``hparams.to_gguf`` of
  ``from_config``, and ``from_gguf`` reading to_gguf's keys, from_hf's record, no keys at all and further GGUF
  metadata (Hparams as sha256 digests). The table must reproduce it exactly (types and key order included: the
  comparison is of the JSON text). It was written by this file's ``__main__`` with that commit's orkpack:
  ``git archive 4877203 orkpack | tar -x -C /tmp/orig`` (plus the built ``_kernels.abi3.so``), then
  ``PYTHONPATH=/tmp/orig python tests/test_hparamkeys.py``; regenerate only for an intended change (since: the
  converter's keys of minicpm and minicpm3 and Gemma 3's sliding layers, issue 27, regenerated with this branch).
* The two paths agree: under every key both write, from_hf's record and to_gguf hold the same value (the known
  exceptions listed, with why), and what to_gguf writes from_gguf reads back under the same names.
* The table is the single source: no GGUF hyperparameter key is spelled in modelkv.py or hparams.py, every entry
  is used, every key the table marks as llama.cpp's is one of gguf-py's ``Keys`` with the type gguf-py's
  ``GGUFWriter`` writes it with, and orkpack's own keys are not gguf-py's.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import json
import os
import math
import re
from pathlib import Path

import numpy as np
import pytest

from orkpack import archs, synth
try:
    from orkpack import ggufkeys as G
except ImportError:  # writing the golden with commit 4877203's orkpack, before the table (see above)
    G = None
from orkpack.model import hparams
from orkpack.sources import modelkv

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "fixtures" / "hparamkeys_golden.json"
CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"


# ------------------------------------------------------------------------------------------ the cases

def _with(base: dict, **kw) -> dict:
    out = copy.deepcopy(base)
    for k, v in kw.items():
        if v is _DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


_DROP = object()


def _cases() -> dict[str, dict]:
    cases: dict[str, dict] = {}
    for name, cfg in synth.TINY.items():
        cases[f"tiny/{name}"] = copy.deepcopy(cfg)
    for p in sorted(CONFIGS.glob("*.json")):
        if p.name != "params.json":
            cases[f"fixture/{p.stem}"] = json.loads(p.read_text())
    llama = synth.TINY["llama"]
    scalings = {
        "linear": {"type": "linear", "factor": 2.0},
        "linear_stray": {"type": "linear", "factor": 2.0, "beta_fast": 32.0, "low_freq_factor": 1.0},
        "dynamic": {"type": "dynamic", "factor": 2.0},
        "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024, "beta_fast": 32.0,
                 "beta_slow": 1.0},
        "yarn_mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                        "mscale": 1.0, "mscale_all_dim": 1.0},
        "yarn_notrunc": {"rope_type": "yarn", "factor": 4, "truncate": False, "attention_factor": 1.2},
        "longrope": {"rope_type": "longrope", "factor": 4.0, "original_max_position_embeddings": 1024,
                     "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 1024},
        "llama3_partial": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": None,
                           "original_max_position_embeddings": -1},
        "su": {"type": "su", "factor": 2.0},
        "default": {"rope_type": "default"},
        "bad_factor": {"rope_type": "yarn", "factor": "x"},
        "no_kind": {"factor": 2.0},
    }
    for k, rs in scalings.items():
        cases[f"llama/rope_scaling/{k}"] = _with(llama, rope_scaling=rs)
    cases["llama/rope_parameters/flat"] = _with(llama, rope_theta=_DROP, rope_parameters={
        "rope_theta": 100000.0, "rope_type": "linear", "factor": 2.0})
    cases["llama/rope_parameters/default"] = _with(llama, rope_theta=_DROP, rope_parameters={
        "rope_theta": 500000, "rope_type": "default"})
    cases["llama/rope_parameters/yarn+scaling"] = _with(llama, rope_parameters={"rope_type": "yarn", "factor": 2.0},
                                                        rope_scaling={"type": "linear", "factor": 3.0})
    g3 = synth.TINY["gemma3_text"]
    cases["gemma3_text/rope_parameters/nested"] = _with(g3, rope_theta=_DROP, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    cases["gemma3_text/local_base"] = _with(g3, rope_local_base_freq=10000.0, rope_theta=1e6,
                                            final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    cases["llama/no_head_dim"] = _with(llama, head_dim=_DROP)
    cases["llama/head_dim_none"] = _with(llama, head_dim=None)
    cases["llama/partial_rotary"] = _with(llama, partial_rotary_factor=0.5)
    cases["llama/partial_rotary_bad"] = _with(llama, partial_rotary_factor=1.5)
    cases["llama/int_theta"] = _with(llama, rope_theta=500000)
    cases["llama/aliases"] = _with(llama, max_position_embeddings=_DROP, n_positions=2048, rope_theta=_DROP,
                                   rotary_emb_base=20000.0)
    cases["llama/layer_norm_eps"] = _with(llama, layer_norm_eps=1e-5, layer_norm_epsilon=1e-4)
    cases["llama/moe_keys"] = _with(llama, num_experts=8, num_experts_per_token=2, n_routed_experts=4)
    cases["llama/name"] = _with(llama, _name_or_path="/models/org/Tiny-Llama")
    for key, bad in (("rope_theta", "ten thousand"), ("rope_theta", True), ("partial_rotary_factor", 1e300),
                     ("max_position_embeddings", 2**40), ("rms_norm_eps", float("inf")), ("hidden_size", -1),
                     ("num_key_value_heads", 2.0), ("vocab_size", None), ("rms_norm_eps", 0)):
        cases[f"llama/hostile/{key}={bad!r}"] = _with(llama, **{key: bad})
    sc2 = synth.TINY["starcoder2"]
    cases["starcoder2/bad_layer_norm_eps"] = _with(sc2, layer_norm_eps="x")  # the family's own norm_epsilon
    cases["starcoder2/layer_norm_epsilon"] = _with(sc2, layer_norm_epsilon=1e-4)
    cases["gemma2/no_softcap"] = _with(synth.TINY["gemma2"], final_logit_softcapping=None,
                                       attn_logit_softcapping=None)
    cases["granitemoe/shared"] = _with(synth.TINY["granitemoe"], shared_intermediate_size=16)
    cases["qwen3_moe/no_norm"] = _with(synth.TINY["qwen3_moe"], norm_topk_prob=False)
    cases["deepseek_v3/yarn"] = _with(synth.TINY["deepseek_v3"], routed_scaling_factor=2.5, norm_topk_prob=True,
                                      n_group=2, topk_group=1, rope_scaling={
                                          "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                          "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})
    cases["deepseek_v2/group_limited"] = _with(synth.TINY["deepseek_v2"], topk_method="group_limited_greedy",
                                               n_group=2, topk_group=1, routed_scaling_factor=16.0)
    cases["mistral/window"] = _with(synth.TINY["mistral"], sliding_window=64)
    cases["smollm3/no_list"] = _with(synth.TINY["smollm3"], no_rope_layers=_DROP, num_hidden_layers=8)
    cases["unknown/gpt2"] = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 1024,
                             "n_inner": None, "layer_norm_epsilon": 1e-5, "vocab_size": 100}
    cases["unknown/none"] = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    cases["unknown/text_config"] = {"model_type": "weird", "text_config": {
        "hidden_size": 32, "num_attention_heads": 2, "rms_norm_eps": 1e-5, "rope_theta": 1e4,
        "rope_scaling": {"type": "linear", "factor": 2.0}}}
    return cases


# ------------------------------------------------------------------------------------------ what the code makes

# Hparams fields added after the golden was written (a hybrid's per-layer block types): every family the golden
# knows has them at their default, which the snapshot leaves out; the families that set them are new cases
_ADDED_SINCE_GOLDEN = ("blocks", "ssm", "attn_temp", "head_dim_swa", "kv_heads_swa", "kv_from", "per_layer",
                       "altup", "sparsity", "per_layer_vocab")


def _plain(v):
    """JSON-able, types kept (bool, int and float stay apart in the JSON text)."""
    if isinstance(v, np.ndarray):
        return {"ndarray": str(v.dtype), "shape": list(v.shape), "sha256": hashlib.sha256(v.tobytes()).hexdigest()}
    if isinstance(v, np.generic):
        return {"np": str(v.dtype), "value": v.item()}
    if isinstance(v, hparams.Rope):
        return {"rope": {"inv_freq": _plain(v.inv_freq), "attn_factor": _plain(v.attn_factor), "dim": v.dim,
                         "style": v.style, "params": _plain(v.params)}}
    if isinstance(v, archs.Forward):
        return "Forward"  # from archs, not under test here
    if isinstance(v, hparams.Hparams):  # a field added after the golden counts only where it is not its default
        fields = v.__dataclass_fields__
        default = lambda k: fields[k].default_factory() if fields[k].default is dataclasses.MISSING \
            else fields[k].default  # noqa: E731
        return {k: _plain(getattr(v, k)) for k in fields if not (k in _ADDED_SINCE_GOLDEN and getattr(v, k) == default(k))}
    if isinstance(v, (set, frozenset)):
        return {"set": sorted(v)}
    if isinstance(v, tuple):
        return {"tuple": [_plain(x) for x in v]}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return {"repr": repr(v)}


def _attempt(fn, digest: bool = False):
    """{"ok": the result} or {"error": "Class: message"}; ``digest``: the result's canonical JSON as a sha256
    (an Hparams: ~1 kB each in full)."""
    try:
        v = _plain(fn())
    except Exception as e:  # noqa: BLE001 - the error (class and message) is part of the behaviour
        return {"error": f"{type(e).__name__}: {e}"}
    return {"sha256": hashlib.sha256(_text(v).encode()).hexdigest()} if digest else {"ok": v}


def _kv_of(record_kv: list) -> dict:
    return {k: v for k, _, v in record_kv}


# further GGUF metadata over to_gguf's, read by from_gguf (keys llama.cpp's converter writes that to_gguf does not)
_GGUF_EXTRA = (
    {"attention.clamp_kqv": 8.0},
    {"attention.key_length_mla": 192},
    {"rope.scaling.type": "longrope", "rope.scaling.factor": 2.0},
    {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_log_multiplier": 0.1},
    {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 512,
     "rope.scaling.attn_factor": 1.5, "rope.scaling.yarn_truncate": False},
    {"rope.scaling.type": "linear"},
    {"expert_gating_func": 2, "expert_group_count": 4, "expert_group_used_count": 2, "expert_weights_norm": True,
     "expert_weights_scale": 2.5},
    {"attention.q_lora_rank": 24, "attention.kv_lora_rank": 16, "attention.value_length": 8,
     "rope.dimension_count": 8},
    {"embedding_scale": 3.0, "residual_scale": 0.5, "logit_scale": 2.0, "attention.scale": 0.125,
     "attn_logit_softcapping": 20.0, "final_logit_softcapping": 10.0, "attention.sliding_window": 16,
     "rope.freq_base_swa": 5000.0, "no_rope_layers": [0, 1, 1]},
    {"attention.layer_norm_epsilon": 1e-3, "context_length": 100},
    {"expert_group_count": 4},
    {"attention.layer_norm_rms_epsilon": 1e-5, "attention.layer_norm_epsilon": 1e-3, "rope.freq_base": 5e5,
     "rope.scaling.type": "yarn"},
)


def snapshot(cfg: dict, folder: Path) -> dict:
    """What from_hf, to_gguf and from_gguf make of one config (no tokenizer files: the hyperparameters only)."""
    warnings: list[str] = []
    rec = _attempt(lambda: modelkv.from_hf(folder, cfg, warnings.append))
    out = {"from_hf": rec, "from_hf_warnings": [w.replace(str(folder), "FOLDER") for w in warnings]}
    out["from_config"] = _attempt(lambda: hparams.from_config(cfg), digest=True)
    out["to_gguf"] = _attempt(lambda: hparams.to_gguf(hparams.from_config(cfg)))
    try:
        facts = archs.facts_from_config(cfg)
        hp = hparams.from_config(cfg)
        garch = archs.gguf_arch_name(facts["arch"])
        kv = {"general.architecture": garch, **{f"{garch}.{k}": v for k, v in hparams.to_gguf(hp).items()}}
    except Exception:  # noqa: BLE001 - not evaluable: from_gguf has nothing to read back
        return out
    bare = {"general.architecture": garch}  # every key missing: the readers' defaults
    out["from_gguf[bare]"] = _attempt(lambda: hparams.from_gguf(bare, facts, None, "m.gguf"), digest=True)
    for i, more in enumerate(_GGUF_EXTRA):
        more_kv = {**kv, **{f"{garch}.{k}": v for k, v in more.items()}}
        out[f"from_gguf[extra{i}]"] = _attempt(lambda: hparams.from_gguf(more_kv, facts, None, "m.gguf"),
                                               digest=True)
    for layout in ("llama.cpp", "hf"):
        out[f"from_gguf[to_gguf,{layout}]"] = _attempt(lambda: hparams.from_gguf(kv, facts, None, "m.gguf", layout),
                                                           digest=True)
    if "ok" in rec and rec["ok"] is not None:
        hkv = _kv_of(modelkv.from_hf(folder, cfg)["kv"])
        out["from_gguf[from_hf,hf]"] = _attempt(lambda: hparams.from_gguf(hkv, facts, None, "m.gguf", "hf"),
                                                    digest=True)
    return out


def _text(v) -> str:
    return json.dumps(v, allow_nan=True)  # key order kept: dicts (to_gguf's, a RoPE's params) compare in order too


def _write_golden(folder: Path) -> None:
    doc = {name: snapshot(cfg, folder) for name, cfg in sorted(_cases().items())}
    GOLDEN.write_text("{\n" + ",\n".join(f"{json.dumps(n)}: {_text(v)}" for n, v in doc.items()) + "\n}\n")


# ------------------------------------------------------------------------------------------ unchanged behaviour

_GOLD = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


def test_golden_covers_every_family_and_case():
    assert set(_GOLD) == set(_cases()), "regenerate tests/fixtures/hparamkeys_golden.json (see the module doc)"
    assert {n.split("/", 1)[1] for n in _GOLD if n.startswith("tiny/")} == {f.name for f in archs._F}


def _known(text: str) -> str:
    """The text with an error's list of known architectures elided: it grows with every family added since."""
    return re.sub(r"known: [a-z0-9_, ]+\.", "known: (the registry).", text)


@pytest.mark.parametrize("name", sorted(_cases()))
def test_same_records_as_before_the_table(name, tmp_path):
    got = snapshot(_cases()[name], tmp_path)
    want = _GOLD[name]
    for part in sorted(set(got) | set(want)):
        assert _known(_text(got.get(part))) == _known(_text(want.get(part))), f"{name}: {part} changed"


# ------------------------------------------------------------------------------------------ the two paths agree

def _evaluable(cfg: dict):
    try:
        return hparams.from_config(cfg), archs.facts_from_config(cfg)
    except Exception:  # noqa: BLE001 - not evaluable (the golden holds the error)
        return None, None


# keys from_hf and to_gguf both write with different values (behaviour before the table, kept): why
_DISAGREE = {
    # (from_hf wrote the head dim when config.json had no partial_rotary_factor, from_config the family's default:
    # from_hf now takes the family's default too, as llama.cpp's ChatGLM / GLM-4 converters do; issue 27)
    # from_config's one epsilon takes rms_norm_eps first (synth's tiny starcoder2 carries both)
    ("tiny/starcoder2", "attention.layer_norm_epsilon"): "rms_norm_eps first",
    ("starcoder2/bad_layer_norm_eps", "attention.layer_norm_epsilon"): "rms_norm_eps first",
    ("starcoder2/layer_norm_epsilon", "attention.layer_norm_epsilon"): "rms_norm_eps first",
    # config.json with both: from_hf keeps rope_scaling, from_config rope_parameters
    ("llama/rope_parameters/yarn+scaling", "rope.scaling.type"): "rope_scaling vs rope_parameters",
    ("llama/rope_parameters/yarn+scaling", "rope.scaling.factor"): "rope_scaling vs rope_parameters",
    # a factor above 1: from_hf leaves it out (the head dim), from_config applies it
    ("llama/partial_rotary_bad", "rope.dimension_count"): "partial_rotary_factor > 1",
    # from_hf reads llama.cpp's spellings (rotary_emb_base), from_config rope_theta only
    ("llama/aliases", "rope.freq_base"): "rotary_emb_base",
}


def test_from_hf_and_to_gguf_agree_key_by_key(tmp_path):
    """Under every key both write, the HF-folder record and to_gguf hold the same value (but for _DISAGREE)."""
    seen, compared = set(), 0
    for name, cfg in _cases().items():
        hp, facts = _evaluable(cfg)
        if hp is None:
            continue
        garch = archs.gguf_arch_name(facts["arch"])
        rec = {k: (t, v) for k, t, v in modelkv.from_hf(tmp_path, cfg)["kv"]}
        for key, v in hparams.to_gguf(hp).items():
            if f"{garch}.{key}" not in rec:
                continue
            typ, hv = rec[f"{garch}.{key}"]
            assert typ == G.BY_NAME[key].type
            compared += 1
            same = hv == v if not isinstance(v, float) else math.isclose(hv, v, rel_tol=1e-6)  # float32 in the record
            if not same:
                seen.add((name, key))
                assert (name, key) in _DISAGREE, f"{name}: {key}: from_hf {hv!r}, to_gguf {v!r}"
    assert seen == set(_DISAGREE), "a known disagreement is gone: drop it from _DISAGREE"
    assert compared > 300


def test_to_gguf_reads_back_through_from_gguf():
    """Every key to_gguf writes, from_gguf reads under the same name: written again, it is the same value
    (or left out where it is the table's default, which is what a reader then takes)."""
    for name, cfg in _cases().items():
        hp, facts = _evaluable(cfg)
        if hp is None:
            continue
        out = hparams.to_gguf(hp)
        garch = archs.gguf_arch_name(facts["arch"])
        kv = {"general.architecture": garch, **{f"{garch}.{k}": v for k, v in out.items()}}
        for layout in ("llama.cpp", "hf"):
            back = hparams.to_gguf(hparams.from_gguf(kv, facts, None, "m.gguf", layout))
            assert set(back) <= set(out), name
            for key, v in out.items():
                want = _text(v)
                if key == G.EXPERT_WEIGHTS_NORM.name and archs.FAMILIES[facts["arch"]].forward.router_norm_gguf == \
                        "always":  # llama.cpp's graph normalises whatever the key says (qwen3moe.cpp, lfm2moe.cpp):
                    want = _text(True)  # a GGUF of an unnormalised config (qwen3_moe/no_norm) runs normalised
                assert _text(back.get(key, G.BY_NAME[key].default)) == want, f"{name} ({layout}): {key}"


# ------------------------------------------------------------------------------------------ one table

_SOURCES = {"orkpack/sources/modelkv.py": ("_hparams", "_rope_scaling"),
            "orkpack/model/hparams.py": ("from_gguf", "to_gguf")}


def _literals(tree: ast.AST):
    """(line, string, the function it is in or "") of every string constant but docstrings and the settings
    an attribute is compared with (``f.rope_layers == "no_rope_layers"``: a Forward setting, not a key)."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    docs |= {id(c) for n in ast.walk(tree) if isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute)
             for c in n.comparators if isinstance(c, ast.Constant)}
    out = []

    def walk(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, fn or child.name)
            elif isinstance(child, ast.Constant) and isinstance(child.value, str) and id(child) not in docs:
                out.append((child.lineno, child.value, fn))
            else:
                walk(child, fn)
    walk(tree, "")
    return out


def _spelled_keys(source: str, gguf_fns: tuple[str, ...]) -> list[str]:
    """The GGUF hyperparameter keys a module's source spells: a dotted one (``attention.head_count``) or an
    f-string piece (``".rope.scaling"``, ``".vocab_size"``) anywhere, even in a message; an undotted one
    (``block_count``) at module level or in the functions ``gguf_fns`` that read or write GGUF keys."""
    names = [k.name for k in G.KEYS]
    dotted = [n for n in names if "." in n]
    bad = []
    for line, s, fn in _literals(ast.parse(source)):
        t = s.strip(".")
        if any(re.search(r"(?<![\w.])" + re.escape(n) + r"(?!\w)", s) for n in dotted) \
                or ("." in t and any(n.startswith(t + ".") or t.endswith("." + n) for n in names)) \
                or (s.startswith(".") and t in names):
            bad.append(f"{line}: {s!r}")
        elif t in names and (fn == "" or fn in gguf_fns):
            bad.append(f"{line}: {s!r} (in {fn or 'module level'})")
    return bad


def test_no_gguf_key_is_spelled_outside_the_table():
    """modelkv.py and hparams.py name every GGUF hyperparameter key through orkpack.ggufkeys (hparams'
    from_config reads config.json, whose keys some GGUF keys share, ``attn_logit_softcapping``: not checked
    for undotted ones)."""
    bad = [f"{path}:{b}" for path, fns in _SOURCES.items() for b in _spelled_keys((ROOT / path).read_text(), fns)]
    assert not bad, "GGUF keys belong in orkpack/ggufkeys.py:\n" + "\n".join(bad)


def test_the_literal_check_finds_keys():
    """The check above is not vacuous: spellings as commit 4877203 had them fail it, settings compared do not."""
    src = ('X = {"embed": "embedding_scale", "n": "ours (attention.clamp_kqv)"}\n'
           'def to_gguf(hp):\n    if hp.fwd.rope_layers == "no_rope_layers":\n'
           '        return {f"{a}.rope.scaling": 1, "block_count": 2, "attention.head_count": 3}\n'
           'def from_config(cfg):\n    return cfg.get("attn_logit_softcapping"), f"{a}.vocab_size"\n')
    assert [b.split(": ", 1)[1] for b in _spelled_keys(src, ("to_gguf",))] == [
        "'embedding_scale' (in module level)", "'ours (attention.clamp_kqv)'", "'.rope.scaling'",
        "'block_count' (in to_gguf)", "'attention.head_count'", "'.vocab_size'"]


def test_every_table_entry_is_used():
    used = set()
    for path in _SOURCES:
        for n in ast.walk(ast.parse((ROOT / path).read_text())):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "G":
                used.add(n.attr)
    names = {k.name for k in (*G.FROM_CONFIG, *G.ROPE_SCALING)}
    names |= {getattr(G, a).name for a in used if isinstance(getattr(G, a, None), G.Key)}
    assert names == set(G.BY_NAME), f"unused: {sorted(set(G.BY_NAME) - names)}"


def test_table_shape():
    assert len({k.name for k in G.KEYS}) == len(G.KEYS)
    for k in G.KEYS:
        assert k.type in ("uint32", "float32", "bool", "string", "array[int32]", "array[bool]", "array[float32]"), k
        assert set(k.family) <= set(archs.FAMILIES), k  # family names are orkpack.archs' families
        assert all(isinstance(v, tuple) and v for v in k.family.values()), k
        assert not k.rope_scaling or (k.name.startswith("rope.scaling.") and set(k.kinds) <= set(
            G.ROPE_SCALING_TYPE.kinds)), k
        if k.default is not None:
            assert modelkv._valid(k.type, k.default), k
    # from_hf writes from the table's order: every family's keys, then the family's own
    assert [k.name for k in G.KEYS[:3]] == ["context_length", "embedding_length", "feed_forward_length"]


def test_every_key_spells_a_gguf_key():
    """Each llama.cpp key of the table is one of gguf-py's (Keys.LLM, Keys.Attention, Keys.Rope, Keys.ShortConv, Keys.SSM,
    Keys.WKV); orkpack's own
    (``llama_cpp=False``) are not (if gguf-py gains one, mark it llama.cpp's)."""
    from gguf.constants import Keys

    known = {v for cls in (Keys.LLM, Keys.Attention, Keys.Rope, Keys.ShortConv, Keys.SSM, Keys.WKV)
             for n, v in vars(cls).items()
             if n.isupper() and isinstance(v, str)}
    # newer than the gguf release installed: in the gguf-py of llama.cpp 0c1e570 (the converter the tests run)
    newer = {"{arch}.attention.recurrent_layers"}
    vendored = Path(os.environ.get("ORKPACK_LLAMA_CPP", Path(__file__).resolve().parents[1] / ".cache" / "llama.cpp"))
    vendored = vendored / "gguf-py" / "gguf" / "constants.py"
    if vendored.is_file():
        text = vendored.read_text()
        assert all(f'"{k}"' in text for k in newer), newer
    known |= newer
    for k in G.KEYS:
        assert ("{arch}." + k.name in known) == k.llama_cpp, k.name
    assert sum(k.llama_cpp for k in G.KEYS) >= 40


def test_the_table_types_are_gguf_writers_types(tmp_path):
    """The type of each llama.cpp key is the one gguf-py's GGUFWriter writes it with (its one-value add_* methods,
    e.g. add_context_length: uint32)."""
    import inspect

    import gguf

    w = gguf.GGUFWriter(tmp_path / "t.gguf", "llama")
    written: dict[str, str] = {}
    for m in sorted(dir(w)):
        fn = getattr(w, m)
        if not m.startswith("add_") or m in ("add_key_value", "add_architecture") or not callable(fn):
            continue
        if len([p for p in inspect.signature(fn).parameters.values() if p.default is p.empty]) != 1:
            continue
        for sample in (1, gguf.RopeScalingType.LINEAR, "x"):
            before = set(w.kv_data[0])
            try:
                fn(sample)
            except Exception:  # noqa: BLE001 - not this sample's type
                continue
            finally:
                new = set(w.kv_data[0]) - before
                got = {k: w.kv_data[0].pop(k).type.name.lower() for k in new}
            written.update(got)
            if got:
                break
    # arrays: gguf-py's writer reports them as "array" (their item type is the table's own, checked against the
    # converter's GGUFs in tests/test_qwen35.py); recurrent_layers: newer than the installed gguf release
    mine = {k.at("llama"): k.type for k in G.KEYS if k.llama_cpp and not k.type.startswith("array[")}
    assert {k: written.get(k) for k in mine} == mine


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:  # the orkpack on PYTHONPATH (the commit the golden is of)
        _write_golden(Path(d))
    print(f"wrote {GOLDEN} ({len(_cases())} cases)")
