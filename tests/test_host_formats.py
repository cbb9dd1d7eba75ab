"""The plan's host levels in a format each (--host-low nf4|int5dq|int6dq, --host-high int8|int8dq|int6dq; issue 25).

* the board carries the two formats, checked; a tier map's board block records them only when not the defaults
  (so a default plan's map is unchanged: tests/test_plan_golden.py) and reads them back;
* the plan counts each format's bytes by the codec's formula (the Python reader's part sizes) and an item's
  predicted KLD as its sensitivity times the format's error ratio (cost.FORMAT_ERROR); the size-bounded plan is
  still the exact optimum (an independent dynamic program over bytes);
* a build writes the host items in those formats, holding exactly the bytes the plan counted; verify --reference
  passes; a build that follows the map writes the same bytes, and a contradicting --host-low is one line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orkpack import synth
from orkpack.errors import OrkError
from orkpack.pack import spec
from orkpack.pack.reader import Pack, expected_part_sizes
from orkpack.tiers import cost, solver
from orkpack.tiers.board import board_from_json, load_board, with_host_formats
from orkpack.tiers.manifest import manifest_from_config
from orkpack.tiers.profile import load_profile
from orkpack.tiers.solver import Goal, solve

ROOT = Path(__file__).resolve().parents[1]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "orkpack", *args], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _host_only(low=None, high=None):
    man = manifest_from_config(synth.TINY["llama"])
    board = with_host_formats(load_board("rk3588-32g", "llama.cpp-cpu"), low, high, "test")
    return man, board, load_profile(None, man, board)


def test_board_formats_checked_and_recorded_only_when_not_the_defaults():
    b = load_board("rk3588-32g")
    assert (b.host_low, b.host_high) == ("nf4", "int8") and "host_low" not in b.to_json()
    f = with_host_formats(b, "int5dq", "int8dq", "w")
    assert f.to_json()["host_low"] == "int5dq" and f.to_json()["host_high"] == "int8dq"
    back = board_from_json(f.to_json(), "map")
    assert (back.host_low, back.host_high) == ("int5dq", "int8dq") and back == f
    assert board_from_json(b.to_json(), "map") == b
    for low, high, why in (("int8dq", None, "host low format 'int8dq'"), (None, "nf4", "host high format 'nf4'"),
                           ("int6dq", "int6dq", "both int6dq")):
        with pytest.raises(OrkError, match=why):
            with_host_formats(b, low, high, "w")


@pytest.mark.parametrize("enc", spec.INTDQ_ENCODINGS)
def test_bytes_are_the_codec_formula(enc):
    for n, k in ((1, 1), (3, 33), (64, 256), (576, 1536), (257, 32 * 256 + 1)):
        assert cost.host_format_bytes(n, k, enc, "dq32") == sum(expected_part_sizes([n, k], enc, {}).values())
    assert cost.host_format_bytes(8, 64, "nf4", "dq32") == cost.host_nf4_bytes(8, 64, "dq32")
    assert cost.host_format_bytes(8, 64, "int8", "dq32") == cost.host_int8_bytes(8, 64)


def test_the_model_prices_each_level_in_its_format():
    man, board, prof = _host_only("int6dq", "int8dq")
    rows = solver._rows(man, board, {})
    md = solver._model(man, board, prof, rows, 512, "f16")
    r6, r8 = cost.FORMAT_ERROR["int6dq"], cost.FORMAT_ERROR["int8dq"]
    assert r6 > 0 > r8 and cost.FORMAT_ERROR["nf4"] == 1.0 and cost.FORMAT_ERROR["int8"] == 0.0
    for it, al, ram, kl, q, sens in zip(man.items, md.allowed, md.ram, md.kld, md.qual, prof.sensitivity):
        got = dict(zip(al, zip(ram, kl, q)))
        assert got["nf4"][0] == cost.host_format_bytes(it.n, it.k, "int6dq", "dq32")
        assert got["int8"][0] == cost.host_format_bytes(it.n, it.k, "int8dq", "dq32")
        assert got["nf4"][1] == sens * r6 and got["int8"][1] == sens * r8
        assert got["nf4"][2] == sens - sens * r6 and got["int8"][2] == sens - sens * r8
    # the defaults: the sensitivity where the CPU decodes NF4, else 0 (what the model was before formats)
    man, board, prof = _host_only()
    md = solver._model(man, board, prof, solver._rows(man, board, {}), 512, "f16")
    for al, kl, q, sens in zip(md.allowed, md.kld, md.qual, prof.sensitivity):
        assert dict(zip(al, kl)) == {"nf4": sens, "int8": 0.0} and dict(zip(al, q)) == {"nf4": 0.0, "int8": sens}


@pytest.mark.parametrize("frac", [0.0, 0.3, 0.7, 1.0])
def test_the_size_bounded_plan_is_still_the_exact_optimum(frac):
    from test_size_budget import _knapsack, _md_pick

    man, board, prof = _host_only("int5dq", "int8dq")
    small = solver.weight_bytes(man, *_md_pick(man, board, prof, "nf4"))["file"]
    large = solver.weight_bytes(man, *_md_pick(man, board, prof, "int8"))["file"]
    cap = int(small + frac * (large - small))
    tm = solve(man, board, prof, goal=Goal("quality", max_bytes=cap))
    assert tm.budget["weights"]["file"] <= cap
    q = next(s["value"] for s in tm.objective["stages"] if s["metric"] == "quality")
    assert q == pytest.approx(_knapsack(man, board, prof, cap), rel=0, abs=2e-9)
    assert tm.board["host_low"] == "int5dq" and tm.board["host_high"] == "int8dq"


def test_build_writes_the_formats_and_holds_the_planned_bytes(tmp_path):
    src = tmp_path / "m"
    synth.write_hf_model(src, config=synth.TINY["llama"])
    fmt = ["--host-low", "int5dq", "--host-high", "int8dq", "--runtime", "llama.cpp-cpu"]
    r = _run("plan", str(src), "--bpw", "7", "--json", "-o", str(tmp_path / "map.json"), *fmt)
    assert r.returncode == 0, r.stderr[-2000:]
    p = json.loads(r.stdout)
    assert p["board"]["host_low"] == "int5dq" and p["board"]["host_high"] == "int8dq"
    encs = {d["encoding"] for d in p["tensors"].values()} if isinstance(p.get("tensors"), dict) else None
    out = tmp_path / "a.orkpack"
    r = _run("build", str(src), "-o", str(out), "--bpw", "7", "--json", *fmt)
    assert r.returncode == 0, r.stderr[-2000:]
    b = json.loads(r.stdout)
    assert sum(k["bytes"] for k in b["by_kind"]) == p["budget"]["weights"]["file"] <= p["budget"]["weights"]["cap"]
    with Pack.open(out) as pack:
        got = {s["encoding"] for _, s in pack.slices() if len(s["shape"]) == 2}
        assert got == {"int5dq", "int8dq"}, (got, encs)
        assert pack.header["provenance"]["nf4"]["host_low"] == "int5dq"
    r = _run("verify", str(out), "--reference")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # following the map: the same formats, the same bytes; a contradicting --host-low is one line, nothing written
    fol = tmp_path / "f.orkpack"
    r = _run("build", str(src), "-o", str(fol), "--tiermap", str(tmp_path / "map.json"), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    with Pack.open(fol) as a, Pack.open(out) as c:
        assert [(s["encoding"], s["parts"]["codes"]["xxh3"] if "codes" in s["parts"] else None)
                for _, s in a.slices()] == \
            [(s["encoding"], s["parts"]["codes"]["xxh3"] if "codes" in s["parts"] else None) for _, s in c.slices()]
    bad = tmp_path / "bad.orkpack"
    r = _run("build", str(src), "-o", str(bad), "--tiermap", str(tmp_path / "map.json"), "--host-low", "int6dq",
             "--json")  # (no progress bar)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--host-low int6dq" in r.stderr and not bad.exists()
    r = _run("build", str(src), "-o", str(bad), "--host-high", "nf4", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "host high format 'nf4'" in r.stderr
    assert not bad.exists()


def test_rules_build_writes_the_low_format_with_column_weights(tmp_path):
    """--no-plan: every NF4 (low) item in the low format; an imatrix weighs its search (the bytes differ)."""
    src = tmp_path / "m"
    synth.write_hf_model(src, config=synth.TINY["llama"])
    a, b = tmp_path / "a.orkpack", tmp_path / "b.orkpack"
    assert _run("build", str(src), "-o", str(a), "--no-plan", "--host-low", "int6dq").returncode == 0
    with Pack.open(a) as pack:
        encs = [s["encoding"] for _, s in pack.slices() if len(s["shape"]) == 2]
        assert "int6dq" in encs and "nf4dq" not in encs
        assert all(np.isfinite(s["sqnr_db"]) and s["sqnr_db"] > 25 for _, s in pack.slices() if s["encoding"] == "int6dq")


def test_eval_and_export_read_the_formats(tmp_path):
    """The eval's decode path reads intdq slices as the codec decodes them (its KLD is finite, below an all-NF4
    pack's), and the export holds exactly those values."""
    import gguf

    from orkpack import codecs
    from orkpack.eval.export import export

    src = synth.write_hf_model(tmp_path / "m", layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512,
                               seed=3, tied=True)
    synth.write_tokenizer(src, n_merges=200)
    a, n = tmp_path / "a.orkpack", tmp_path / "n.orkpack"
    r = _run("build", str(src), "-o", str(a), "--no-plan", "--host-low", "int5dq", "--host-high", "int8dq",
             "--int8", "blk.0.*", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _run("build", str(src), "-o", str(n), "--no-plan", "--json").returncode == 0
    kld = {}
    for p in (a, n):
        r = _run("eval", str(src), str(p), "--json", "--cpu-act", "q8", "--chunks", "1")
        assert r.returncode == 0, r.stderr[-2000:]
        kld[p.name] = next(x for x in json.loads(r.stdout)["paths"] if x["path"] == "decode")["kld"]["mean"]
    assert 0 <= kld["a.orkpack"] < kld["n.orkpack"], kld
    res = export(a, tmp_path / "a.gguf")
    tensors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(res.path)).tensors}
    seen = set()
    with Pack.open(a) as pack:
        for t, s in pack.slices():
            if s["encoding"] in spec.INTDQ_ENCODINGS and t["name"] != "token_embd.weight" \
                    and not t["name"].endswith(("attn_q.weight", "attn_k.weight")):  # (q/k: the converter's row order)
                want = codecs.get_codec(s["encoding"]).decode(pack.typed_parts(s), s["shape"])
                np.testing.assert_array_equal(tensors[t["name"]].reshape(want.shape), want, err_msg=t["name"])
                seen.add(s["encoding"])
    assert seen == {"int5dq", "int8dq"}


def test_plan_labels_name_the_host_formats(tmp_path):
    """The plan's baselines and its lookup lines name the host levels' formats, not the tier names (nf4/int8)."""
    src = tmp_path / "m"
    synth.write_hf_model(src, config=synth.TINY["llama"])
    r = _run("plan", str(src), "--host-low", "int5dq", "--host-high", "int6dq", "--runtime", "llama.cpp-cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    out = " ".join(r.stdout.split())  # rich wraps lines at the terminal width
    assert "CPU only, all int5dq" in out and "CPU only, all int6dq" in out, out[-3000:]
    assert "all NF4" not in out and "all int8" not in out and "Q8_0" not in out
    lookups = [ln for ln in r.stdout.splitlines() if ln.startswith("lookup ")]
    assert lookups and all((" host int5dq " in ln or " host int6dq " in ln) for ln in lookups), lookups
    r = _run("plan", str(src), "--runtime", "llama.cpp-cpu", "--host-low", "nf4")  # nf4 / int8 keep their names
    out = " ".join(r.stdout.split())
    assert r.returncode == 0 and "CPU only, all NF4" in out and "all int8 (like llama.cpp Q8_0)" in out


def test_inspect_prediction_line_names_the_low_format():
    from orkpack.render import _prediction_line
    pr = {"decode_tok_s": 1, "prefill_tok_s": 2, "ttft_s": 3, "prompt": 4,
          "baselines": {"cpu_nf4": {"decode_tok_s": 1, "prefill_tok_s": 2}}}
    assert "all int6dq:" in _prediction_line(pr, {"host_low": "int6dq", "host_high": "int8"})
    assert "all NF4:" in _prediction_line(pr, {})
