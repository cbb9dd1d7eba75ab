"""config.json as it comes (issue 9, item 5): the structure-aware fuzzer of fuzz/fuzz_config.py.

* every finding the fuzzer made is a regression case below: the minimized mutated
  config (a seed plus the mutations left after minimizing) now gets one clear
  ``error:`` line (exit 2) naming the key from ``plan``, and an OrkError from the
  readers, ``manifest_from_path`` and ``build`` (nothing left at the output path);
  the one finding outside the config validation (HiGHS printing on stdout) is an
  expected failure until orkpack/tiers/milp.py silences it;
* a bounded deterministic sample of the fuzzer (all three targets) finds nothing;
* the fuzzer's oracle itself works: a planted bug and a planted hang are reported.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))
import fuzz_config as fz  # noqa: E402
from fuzz_config import Mutation as M  # noqa: E402

NAN, INF = float("nan"), float("inf")
# the worker's hang limit in these tests: only a real hang reaches it, however loaded the machine (the
# fuzzer's own 20 s default made a slow but finished case a "hang" finding on a busy 2-core box)
HANG_S = 600.0

# (id, seed, minimized mutations, substring every refusing target's error line holds, targets that must refuse)
FINDINGS = [
    # 1. NaN / Infinity in config.json (Python's json reads them): the build crashed writing the pack header
    #    (ValueError: Out of range float values are not JSON compliant). Now refused by the config validation.
    ("nan-top-level", "tiny:phi3", [M("set", ("architectures",), NAN)],
     "'architectures' = nan is not a finite number", ("plan", "source", "build")),
    ("nan-added-key", "real:deepseek_v2.json", [M("add", ("kv_channels",), NAN)],
     "'kv_channels' = nan is not a finite number", ("plan", "source", "build")),
    ("inf-nested-rope", "real:llama.json", [M("set", ("rope_scaling", "factor"), INF)],
     "'rope_scaling.factor' = inf is not a finite number", ("plan", "source", "build")),
    ("inf-nested-text-config", "tiny:gemma3", [M("set", ("text_config", "rms_norm_eps"), -INF)],
     "'text_config.rms_norm_eps' = -inf is not a finite number", ("plan", "source", "build")),
    ("nan-in-list", "tiny:llama", [M("set", ("architectures", 0), NAN)],
     "'architectures[0]' = nan is not a finite number", ("plan", "source", "build")),
    ("nan-unknown-arch", "tiny:llama", [M("set", ("model_type",), "bert"), M("add", ("layer_norm_eps",), NAN)],
     "'layer_norm_eps' = nan is not a finite number", ("source", "build")),  # the generic plan (from weights)
    ("nan-no-plan", "tiny:gpt_oss", [M("set", ("quantization_config", "modules_to_not_convert"), NAN)],
     "'quantization_config.modules_to_not_convert' = nan is not a finite number", ("plan", "source", "build",
                                                                                  "build-noplan")),
    # 2. A matrix side at the old cap (2**24) on a real config: the plan walked K in NPU segments for minutes
    #    (a hang > 20 s). Now matrix sides are capped at archs.MAX_WIDTH (2**18; the widest real: 73728).
    ("wide-hidden", "real:qwen3_moe.json", [M("set", ("hidden_size",), 1 << 24)],
     "'hidden_size' = 16777216 is beyond any real model (cap 262144)", ("plan", "source", "build")),
    ("wide-heads-x-head-dim", "tiny:llama", [M("set", ("num_attention_heads",), 1 << 16),
                                             M("set", ("head_dim",), 1 << 16)],
     "'num_attention_heads' x 'head_dim' = 4294967296 is beyond any real model", ("plan", "source", "build")),
    ("wide-vision", "tiny:gemma3", [M("set", ("vision_config", "intermediate_size"), 1 << 24)],
     "'vision_config.intermediate_size' = 16777216 is beyond any real model", ("plan", "source", "build")),
    ("wide-shared-expert", "tiny:deepseek_v2", [M("set", ("n_shared_experts",), 1 << 20)],
     "'n_shared_experts' x 'moe_intermediate_size' = 33554432 is beyond any real model", ("plan", "source", "build")),
    # 3. (found by hand while fixing 2) layers x experts up to the old cap (2**20): a plan of a million expert
    #    slices took about a minute. Now archs.MAX_EXPERT_SLICES = 2**16 (Kimi K2: 61 x 384 = 23424).
    ("expert-slices", "real:gpt_oss.json", [M("set", ("num_hidden_layers",), 4096)],
     "4096 layers x 32 experts is beyond any real model", ("plan", "source", "build")),
]


def _seed(name: str):
    for n, fam, cfg in fz.seeds():
        if n == name:
            return fam, cfg
    pytest.skip(f"seed {name} is not there (tests/fixtures/configs changed?)")


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = fz.Worker(tmp_path_factory.mktemp("config-fuzz"), timeout=HANG_S)
    yield w
    w.close()


@pytest.mark.parametrize("name,seed,muts,needle,refusing", FINDINGS, ids=[f[0] for f in FINDINGS])
def test_fuzz_finding_is_one_clear_line(worker, name, seed, muts, needle, refusing):
    fam, base = _seed(seed)
    text = fz.dumps(fz.apply(base, muts))
    for target in fz.TARGETS + tuple(t for t in refusing if t not in fz.TARGETS):
        o = worker.run(target, fam, text)
        assert o.ok, f"{target}: {o.kind} {o.sig}\n{o.detail}"
        # (a hang is the worker's own finding: it stops a case after its timeout)
        if target in refusing:
            assert needle in o.error and "fix the config" in o.error, f"{target}: {o.error!r}"
            assert "\n" not in o.error


def test_plan_json_stdout_is_only_json(worker):
    """Finding: HiGHS (under scipy.optimize.milp) printed 'HighsMipSolverData::transformNewIntegerFeasibleSolution
    tmpSolver.run();' on file descriptor 1 (ERGO-Code/HiGHS#2783), so `orkpack plan --json` was not JSON;
    orkpack/tiers/milp.py now points fd 1 at /dev/null around milp()."""
    fam, base = _seed("real:smollm3.json")
    o = worker.run("plan", fam, fz.dumps(fz.apply(base, [M("add", ("num_key_value_heads",), 3)])))
    assert o.ok, f"{o.kind}: {o.sig}\n{o.detail}"


def test_widest_allowed_configs_plan(tmp_path):
    """The caps are loose enough for every real config and tight enough that the worst config they allow plans
    (the slowest shapes: many expert slices, or every matrix side at the cap; ~10 s each on the shared 2-core
    box, measured by the fuzzer's runs; no time is asserted here, only a generous hang limit)."""
    from orkpack import archs

    worker = fz.Worker(tmp_path, timeout=HANG_S)
    w = archs.MAX_WIDTH
    _, q = _seed("real:qwen3_moe.json")
    many_slices = {**q, "num_hidden_layers": archs.MAX_EXPERT_SLICES // q["num_experts"], "hidden_size": 256,
                   "moe_intermediate_size": 64, "intermediate_size": 64, "vocab_size": 1000}
    _, llama = _seed("tiny:llama")
    wide = {**llama, "num_hidden_layers": archs.CAPS["n_layers"], "hidden_size": w, "intermediate_size": w,
            "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": w}
    for cfg in (many_slices, wide):
        o = worker.run("plan", "llama", fz.dumps(cfg))
        assert o.ok and "beyond any real model" not in o.error, o.error or o.detail
    worker.close()


def test_real_configs_pass_the_caps():
    from orkpack import archs

    real = [(n, cfg) for n, _, cfg in fz.seeds() if n.startswith("real:")]
    assert real
    for n, cfg in real:
        archs.facts_from_config(cfg, n)  # raises on a cap or a non-finite value


def test_bounded_sample_finds_nothing(tmp_path):
    """A fixed, deterministic sample of the fuzzer (a few hundred cases, every target): zero findings."""
    st = fz.fuzz(cases=300, seed=0, workdir=tmp_path, minimize=False, log=lambda s: None, timeout=HANG_S)
    found = [f.report() for fs in st.findings.values() for f in fs]
    assert not found, "\n\n".join(found)
    assert st.cases == 300 and all(st.executions[t] == 300 for t in fz.TARGETS)


def test_mutator_covers_what_the_docs_say():
    seed_list = fz.seeds()
    assert any(n.startswith("tiny:") for n, _, _ in seed_list) and any(n.startswith("real:") for n, _, _ in seed_list)
    assert not any(n.endswith("params.json") for n, _, _ in seed_list)
    ops, values, nested, counts = set(), [], set(), []
    for n in range(600):
        _, _, base, muts = fz.case(0, n, seed_list)
        assert [m.describe() for m in fz.case(0, n, seed_list)[3]] == [m.describe() for m in muts]  # deterministic
        counts.append(len(muts))
        for m in muts:
            ops.add(m.op)
            values.append(m.value)
            if m.path and m.path[0] in ("text_config", "vision_config", "quantization_config", "rope_scaling"):
                nested.add(m.path[0])
    assert ops == {"set", "del", "add", "root"}
    assert nested == {"text_config", "vision_config", "quantization_config", "rope_scaling"}
    assert max(counts) >= 5 and min(counts) == 1

    def has(pred):
        return any(pred(v) for v in values)

    assert has(lambda v: v == 2**62) and has(lambda v: v == 10**30) and has(lambda v: v == 2**31)
    assert has(lambda v: isinstance(v, int) and not isinstance(v, bool) and v < 0)
    assert has(lambda v: isinstance(v, float) and math.isnan(v)) and has(lambda v: v == INF)
    assert has(lambda v: v is None) and has(lambda v: v == []) and has(lambda v: isinstance(v, bool))
    assert has(lambda v: isinstance(v, str)) and has(lambda v: isinstance(v, dict))
    assert "NaN" in fz.dumps({"x": NAN})  # json.dumps emits it, orkpack's json.loads reads it


def test_oracle_reports_a_planted_bug_and_a_hang(tmp_path, monkeypatch):
    """The fuzzer's checks work: an exception that is not an OrkError, and a slow case, are findings."""
    from orkpack import archs

    fam, base = _seed("tiny:llama")
    real = archs.facts_from_config

    def planted(cfg, where="config.json"):
        if cfg.get("vocab_size") == 7:
            raise KeyError("planted")
        if cfg.get("vocab_size") == 9:
            time.sleep(3600)  # a hang whatever the limit below and the machine's load
        return real(cfg, where)

    monkeypatch.setattr(archs, "facts_from_config", planted)  # the forked worker inherits it
    w = fz.Worker(tmp_path, timeout=HANG_S)
    try:
        o = w.run("plan", fam, fz.dumps({**base, "vocab_size": 7}))
        assert not o.ok and o.kind == "exception" and o.sig.startswith("KeyError"), o
        o = w.run("build", fam, fz.dumps({**base, "vocab_size": 7}))
        assert not o.ok and o.kind == "exception", o
        w.timeout = 3  # only the planted hang runs under a short limit: it never ends, so it is always over it
        o = w.run("plan", fam, fz.dumps({**base, "vocab_size": 9}))
        assert not o.ok and o.kind == "hang", o
        w.timeout = HANG_S
        o = w.run("plan", fam, fz.dumps(base))  # a fresh worker after the hang
        assert o.ok and not o.error, o
        muts = [M("del", ("mlp_bias",)), M("set", ("vocab_size",), 7), M("add", ("rope_theta",), 1.5)]
        sig = w.run("plan", fam, fz.dumps(fz.apply(base, muts))).sig
        assert fz._minimize(w, "plan", fam, base, muts, sig) == [muts[1]]
    finally:
        w.close()
