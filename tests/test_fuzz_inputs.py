"""The structure-aware fuzzer of the inputs added since issue 11 (fuzz/fuzz_inputs.py, issue 27), in CI:

* every finding saved under fuzz/regressions/inputs/ (its input files and case.json: the command and the
  outcome it must keep after its fix) replays through the CLI in process with that exit code and error line,
  and the whole contract (no traceback, one line naming the input, nothing at the output, inputs untouched);
  the model-record and tokenizer ones also through orkpack-check (exit code, and every record entry read the
  same by both readers);
* a small deterministic campaign per input kind (imatrix, tokenizer, model record, TOML, calibration CSV):
  no finding, and the cases reach both outcomes (some accepted, some refused);
* a few cases of each kind through ``python -m orkpack`` in a child process (exit codes, no traceback);
* the fixes spelled out: an output over an input refused (plan, calibrate), type names the two readers
  read alike, tokenizer keys of the wrong shape, the bounds of the board, runtime and network values.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fuzz"))
import fuzz_inputs as fi  # noqa: E402

SAVED = sorted(p for p in fi.REGRESSIONS.glob("*") if (p / "case.json").exists())


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return fi.Env(tmp_path_factory.mktemp("inputs-env"))


def test_regressions_are_saved_and_decided():
    assert len(SAVED) >= 10, "fuzz/regressions/inputs/ holds the findings of fuzz/fuzz_inputs.py"
    for d in SAVED:
        side = json.loads((d / "case.json").read_text())
        assert side["kind"] in fi.KINDS and isinstance(side["expect"], dict), d.name
        assert side["expect"]["code"] in (0, 1, 2), d.name
        assert sum(p.stat().st_size for p in d.rglob("*") if p.is_file()) <= 256 << 10, d.name


@pytest.mark.parametrize("d", SAVED, ids=lambda d: d.name)
def test_regression_replays(env, d):
    o, side = fi.replay_saved(env, d)
    assert o.ok, f"{o.kind}: {o.sig}\n{o.detail}"
    assert o.code == side["expect"]["code"], (o.code, o.error)
    assert o.error == side["expect"]["error"]


def test_regressions_c(env, check, tmp_path):
    packs = []
    for d in SAVED:
        if json.loads((d / "case.json").read_text())["kind"] not in ("model", "tokenizer"):
            continue
        o, _ = fi.replay_saved(env, d)
        if o.pack is not None:
            p = tmp_path / f"{d.name}.orkpack"
            p.write_bytes(o.pack)
            packs.append((p, o))
    assert packs
    assert fi.c_check(check, packs) == []


# the small campaigns: (kind, cases) of a few seconds each on a 2-core box
SAMPLE = [("imatrix", 30), ("tokenizer", 6), ("model", 40), ("toml", 60), ("csv", 3)]


@pytest.mark.parametrize("kind, cases", SAMPLE, ids=[k for k, _ in SAMPLE])
def test_sample_campaign(env, check, kind, cases):
    st = fi.fuzz(env, kind, seed=20261203, cases=cases, check=check if kind in ("model", "tokenizer") else None,
                 log=lambda m: None)
    assert st.findings == {}, "\n".join(f"{f.sig} (case {f.case.index}: {f.case.log})" for f in st.findings.values())
    assert st.cases == cases
    assert st.codes.get(0, 0) > 0 and st.codes.get(2, 0) > 0, st.codes  # the mutations reach both outcomes
    if kind in ("model", "tokenizer"):
        assert st.c_packs > 0


@pytest.mark.parametrize("kind", fi.KINDS)
def test_subprocess_sample(env, kind):
    assert fi.subprocess_sample(env, kind, seed=7, n=2, log=print) == 0


def test_generators_are_deterministic(env):
    for kind in fi.KINDS:
        a, b = fi.make_case(env, kind, 5, 11), fi.make_case(env, kind, 5, 11)
        assert a.files == b.files and a.argv == b.argv and a.log == b.log


# ---------------------------------------------------------------------------------------------- the fixes


def _cli(env, argv):
    res = env.invoke([str(a) for a in argv])
    return res.exit_code, (res.stderr or "").strip()


def test_outputs_never_replace_inputs(env, tmp_path):
    board = tmp_path / "b.toml"
    board.write_bytes((ROOT / "tiermaps" / "boards" / "rk3588-8g.toml").read_bytes())
    before = board.read_bytes()
    code, err = _cli(env, ["plan", env.hf / "config.json", "--board", board, "-o", board])
    assert code == 2 and err.startswith("error: ") and "b.toml: is the --board file" in err and board.read_bytes() == before
    code, err = _cli(env, ["plan", env.hf, "-o", env.hf / "config.json"])
    assert code == 2 and "a file of the model folder" in err
    cluster = tmp_path / "c.toml"
    cluster.write_text(f'boards = ["{board}", "rk3588-8g"]\n')
    code, err = _cli(env, ["plan", env.hf / "config.json", "--boards", cluster, "-o", board])
    assert code == 2 and "board file of the cluster" in err and board.read_bytes() == before
    rt = tmp_path / "r.toml"
    rt.write_bytes((ROOT / "tiermaps" / "runtimes" / "llama.cpp-cpu.toml").read_bytes())
    csv = env.work / "cal" / "llama.cpp-cpu.csv"
    code, err = _cli(env, ["calibrate", csv, "--runtime", rt, "-o", rt])
    assert code == 2 and "r.toml: is the --runtime file" in err
    assert rt.read_bytes() == (ROOT / "tiermaps" / "runtimes" / "llama.cpp-cpu.toml").read_bytes()


@pytest.mark.parametrize("typ, v, python_ok", [
    ("string]", "x", False), ("uint8]", 1, False), ("array[uint8", [1], False), ("array[]", [], False),
    ("array[string]]", ["a"], False), ("array[array[int32]]", [[1]], True), ("float32", [], False),
    ("float32", {}, False), ("float32", "nan", True), ("string", "\ud800", True), ("uint64", 2 ** 64 - 1, True),
])
def test_type_names_both_readers(typ, v, python_ok):
    from orkpack.pack import model as M

    assert (M.check_type(typ, v) is None) == python_ok


def _record_pack(env, tmp_path, entries) -> Path:
    import harness

    hb, data, minor = harness.split_pack(env.hf_pack.read_bytes())
    h = json.loads(hb)
    h["model"]["kv"] += entries
    p = tmp_path / "m.orkpack"
    p.write_bytes(harness.forge_pack(fi.jdumps(h).encode("ascii"), data, minor))
    return p


def test_c_reader_reads_the_type_names_python_reads(env, check, tmp_path):
    entries = [["x.a", "string]", "x"], ["x.b", "array[uint8", [1]], ["x.c", "array[]", []], ["", "uint32", 1],
               ["x.d", "array[string]]", ["a"]], ["x.e", "string", "\ud800"], ["x.f", "float32", [1.0]]]
    p = _record_pack(env, tmp_path, entries)
    from orkpack.pack.reader import Pack

    with Pack.open(p) as pk:
        model = pk.header["model"]
    o = fi.Outcome(True, code=0, entries=fi.python_entries(model))
    assert [e[0] for e in o.entries[-len(entries):]] == ["bad"] * 5 + ["good", "bad"]
    assert fi.c_check(check, [(p, o)]) == []


def test_eval_names_bad_tokenizer_keys(env, tmp_path):
    p = _record_pack(env, tmp_path, [])
    import harness

    for key, typ, val, needle in [
        ("tokenizer.ggml.merges", "array[string]", ["ab"], "tokenizer.ggml.merges is not a list"),
        ("tokenizer.ggml.token_type", "array[int32]", [1], "holds 1 values"),
        ("tokenizer.huggingface.json", "string", "{not json", "does not load in the tokenizers library"),
    ]:
        hb, data, minor = harness.split_pack(p.read_bytes())
        h = json.loads(hb)
        kv = [e for e in h["model"]["kv"] if e[0] != key]
        if key != "tokenizer.huggingface.json":
            kv = [e for e in kv if e[0] != "tokenizer.huggingface.json"]
        h["model"]["kv"] = kv + [[key, typ, val]]
        q = tmp_path / "t.orkpack"
        q.write_bytes(harness.forge_pack(fi.jdumps(h).encode("ascii"), data, minor))
        code, err = _cli(env, ["eval", q, "--ctx", "16", "--chunks", "1"])
        assert code == 2 and err.count("\n") == 0 and "t.orkpack" in err and needle in err, err


@pytest.mark.parametrize("section, key, value", [
    ("npu", "submit_overhead_s", 1e30), ("cpu", "int8_ops_per_s", 5e-324), ("decode", "token_fixed_s", 1e9),
])
def test_runtime_values_are_bounded(env, tmp_path, section, key, value):
    import tomllib

    from orkpack.errors import OrkError
    from orkpack.tiers.runtime import parse_runtime

    d = tomllib.loads((ROOT / "tiermaps" / "runtimes" / "ggml-ork.toml").read_text())
    d[section][key] = value
    with pytest.raises(OrkError, match=f"'{key}' = .* is outside"):
        parse_runtime(d, "r.toml")


@pytest.mark.parametrize("section, key, value", [
    ("memory", "total_bytes", 2 ** 63), ("npu", "k_segment", 2 ** 40), ("stream", "npu_bytes_per_s", 1e-300),
])
def test_board_values_are_bounded(section, key, value):
    import tomllib

    from orkpack.errors import OrkError
    from orkpack.tiers.board import parse_board_hw

    d = tomllib.loads((ROOT / "tiermaps" / "boards" / "rk3588-8g.toml").read_text())
    d[section][key] = value
    with pytest.raises(OrkError, match=f"'{key}' = .* is outside"):
        parse_board_hw(d, "b.toml")


def test_shipped_files_are_inside_the_bounds():
    from orkpack.tiers.board import board_names, load_board
    from orkpack.tiers.network import load_network, network_names
    from orkpack.tiers.runtime import load_runtime, runtime_names

    for r in runtime_names():
        for b in board_names():
            load_board(b, r)
        load_runtime(r)
    for n in network_names():
        assert math.isfinite(load_network(n).eval_s(512, 4096))
