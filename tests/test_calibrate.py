"""orkpack calibrate: the fit recovers known constants, the runtime path it writes loads, bad CSVs are one
line, and docs/CALIBRATION.md's table is what the shipped runtime paths predict (docs/CALIBRATION.md)."""
from __future__ import annotations

import csv
import re
import shutil
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from orkpack.cli import app
from orkpack.errors import OrkError
from orkpack.tiers import calibrate as cal
from orkpack.tiers.board import load_board
from orkpack.tiers.profile import load_profile
from orkpack.tiers.solver import evaluate

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
BASE = load_board("rk3588-32g", nf4_format=cal.MEASURED_NF4_FORMAT)  # what calibrate's rows weigh
runner = CliRunner()

# constants the synthetic timings are generated with: far from the base runtime path's
TRUE = replace(BASE, npu_efficiency=0.21, submit_overhead_s=2.2e-4, npu_k_falloff=0.65, cpu_int8_ops_per_s=1.3e11,
               cpu_nf4_ops_per_s=2.0e11, cpu_float_ops_per_s=0.8e11, decode_fraction=0.8, decode_token_s=0.009,
               request_s=0.03)
HEADER = "kind,engine,encoding,m,n,k,config,choice,prompt,chunk,seconds,tok_s"


def _synthetic_rows() -> list[str]:
    rows = [f"matmul,npu,int8,{m},{n},{k},,,,,X," for m, n, k in
            [(1, 768, 2048), (64, 768, 2048), (512, 768, 2048), (128, 4096, 4096), (128, 2048, 8192), (256, 1024, 6144)]]
    rows += [f"matmul,cpu,{enc},256,2048,2048,,,,,X," for enc in ("int8", "nf4", "f16")]
    for cfg in ("qwen2.json", "llama.json"):
        rows += [f"decode,,,,,,{cfg},{ch},64,,,X" for ch in ("all-int8", "all-nf4")]
        rows += [f"prefill,,,,,,{cfg},npu,512,,,X", f"ttft,,,,,,{cfg},npu,128,128,X,", f"ttft,,,,,,{cfg},npu,32,32,X,"]
    return rows


def synthetic_csv(folder: Path, board=TRUE, rows: list[str] | None = None) -> Path:
    """Timings the cost model itself predicts for ``board`` (configs copied next to the CSV)."""
    for name in ("qwen2.json", "llama.json"):
        shutil.copy(CONFIGS / name, folder / name)
    rows = _synthetic_rows() if rows is None else rows
    tmp = folder / "shape.csv"
    tmp.write_text("\n".join([HEADER] + [r.replace("X", "1") for r in rows]) + "\n")
    pts = cal.read_times(tmp)
    out = folder / "times.csv"
    out.write_text("\n".join([HEADER] + [r.replace("X", repr(cal.predict(p, board))) for r, p in zip(rows, pts)]) + "\n")
    tmp.unlink()
    return out


# ------------------------------------------------------------------------------------------ the fit

def test_fit_recovers_the_constants_that_generated_the_timings(tmp_path):
    f = cal.fit(cal.read_times(synthetic_csv(tmp_path)), BASE)
    assert [p.field for p in f.params] == [p.field for p in cal.PARAMS]  # every constant is constrained
    for prm in cal.PARAMS:
        want = getattr(TRUE, prm.field)
        assert f.raw[prm.field] == pytest.approx(want, rel=1e-6), prm.field
    assert np.max(np.abs(f.errors(f.after))) < 1e-3  # the written board is rounded to 4 digits


def test_fit_keeps_what_the_rows_do_not_constrain(tmp_path):
    # one decode row cannot tell the bandwidth from the fixed cost; no NPU, no prefill rows
    rows = ["decode,,,,,,qwen2.json,all-int8,64,,,X"]
    f = cal.fit(cal.read_times(synthetic_csv(tmp_path, replace(TRUE, decode_token_s=BASE.decode_token_s), rows)), BASE)
    assert [p.key for p in f.params] == ["bandwidth_fraction"]
    assert f.raw["decode_fraction"] == pytest.approx(TRUE.decode_fraction, rel=1e-6)
    assert "cannot tell it from bandwidth_fraction" in f.why["decode_token_s"]
    assert f.why["npu_efficiency"] == "no fit row depends on it"
    assert f.why["request_s"] == "no fit row depends on it"
    for prm in cal.PARAMS:
        if prm.key != "bandwidth_fraction":
            assert getattr(f.board, prm.field) == getattr(BASE, prm.field), prm.field
    assert np.max(np.abs(f.errors(f.after))) < 1e-3


def test_holdout_rows_are_predicted_not_fitted(tmp_path):
    p = synthetic_csv(tmp_path)
    lines = p.read_text().splitlines()
    lines[0] += ",set"
    lines[1:] = [ln + ",fit" for ln in lines[1:]]
    lines.append("decode,,,,,,qwen2.json,all-nf4,64,,,1000,holdout")  # absurd, but held out: no effect on the fit
    p.write_text("\n".join(lines) + "\n")
    f = cal.fit(cal.read_times(p), BASE)
    assert f.raw["decode_fraction"] == pytest.approx(TRUE.decode_fraction, rel=1e-6)
    assert f.stats("holdout")["n"] == 1 and f.stats("holdout")["worst_abs_pct"] > 90


def test_exact_predictions_agree_with_solver_evaluate():
    """calibrate predicts with the solver's own functions before evaluate() rounds them."""
    pts = {p.id: p for p in cal.read_times(cal.PUBLISHED)}
    for pid in ("inv-gemma-3-1b-it-q8-0-cpu-pp", "inv-gemma-3-1b-it-q4-0-cpu-tg", "rkb-phi3-3.8b-ttft",
                "rk110-llama3-8b-w8a8-decode"):
        p = pts[pid]
        man = cal.manifest_of(p)
        r = evaluate(man, BASE, load_profile(None, man, BASE, p.chunk), cal.choices_for(man, p.choice), prompt=p.prompt)
        v = cal.predict(p, BASE)
        if p.kind == "decode":
            assert v == pytest.approx(r["decode_tok_s"], abs=1e-3)
        elif p.kind == "ttft":
            assert v == pytest.approx(r["ttft_s"], abs=1e-4)
        else:
            assert p.prompt / v == pytest.approx(r["ttft_s"], abs=1e-4)


# ------------------------------------------------------------------------------------------ the command

def test_cli_writes_a_runtime_path_that_loads_and_round_trips(tmp_path):
    """Timings synthesized from known constants on rk3588-16g: the written runtime path recovers them, and
    `plan --board rk3588-16g --runtime FILE` predicts with them."""
    times = synthetic_csv(tmp_path, board=replace(TRUE, **{f: getattr(load_board("rk3588-16g"), f) for f in
                                                          ("name", "total_bytes", "reserve_bytes")}))
    out = tmp_path / "myruntime.toml"
    r = runner.invoke(app, ["calibrate", str(times), "-o", str(out), "--board", "rk3588-16g"])
    assert r.exit_code == 0, r.output
    assert "FITTED on" in r.stdout and "wrote" in r.stdout
    b = load_board("rk3588-16g", out)
    assert b.runtime == "myruntime" and b.name == "rk3588-16g" and b.total_bytes == load_board("rk3588-16g").total_bytes
    for prm in cal.PARAMS:
        assert getattr(b, prm.field) == pytest.approx(getattr(TRUE, prm.field), rel=1e-3), prm.field
    assert b.decode_bandwidth == pytest.approx(0.8 * b.cpu_stream_bytes_per_s, rel=1e-3)  # the board's, not fitted
    text = out.read_text()
    assert text.count("# FITTED by orkpack calibrate on ") == len(cal.PARAMS)
    assert "# from ggml-ork" in text and 'engine = "cpu"' in text
    assert re.search(r"# FITTED by orkpack calibrate on \d+ points?, residual \d+\.\d%", text)
    # every value commented, like the shipped boards (tests/test_tiers.py's rule)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[")]
    for i, ln in enumerate(lines):
        if "=" in ln and not ln.startswith("#"):
            assert i > 0 and (lines[i - 1].startswith("#") or "=" in lines[i - 1]), ln
    # the file is the fit's runtime path: writing it again from the same CSV gives the same bytes
    out2 = tmp_path / "myruntime2.toml"
    assert runner.invoke(app, ["calibrate", str(times), "-o", str(out2), "--board", "rk3588-16g"]).exit_code == 0
    assert out2.read_text().replace("myruntime2", "myruntime") == text
    assert load_board("rk3588-16g", out2) == replace(b, runtime="myruntime2")
    # the plan records it and predicts with it
    from orkpack.tiers.command import plan

    tm, _, _ = plan(tmp_path / "qwen2.json", board="rk3588-16g", runtime=str(out), ctx=1024)
    assert tm.board["runtime"]["name"] == "myruntime" and tm.board["runtime"]["request_s"] == b.request_s


def test_calibrate_a_runtime_path_without_the_npu(tmp_path):
    """Base llama.cpp-cpu: CPU rows fit its CPU constants; the written file has no [npu] section; NPU rows
    are refused in one line."""
    cpu = load_board("rk3588-32g", "llama.cpp-cpu", cal.MEASURED_NF4_FORMAT)
    true = replace(cpu, cpu_int8_ops_per_s=0.9e11, cpu_nf4_ops_per_s=1.9e11, cpu_float_ops_per_s=0.7e11,
                   decode_fraction=0.7, decode_token_s=0.012)
    rows = [f"matmul,cpu,{enc},256,2048,2048,,,,,X," for enc in ("int8", "nf4", "f16")]
    rows += [f"decode,,,,,,{c},{ch},64,,,X" for c in ("qwen2.json", "llama.json") for ch in ("all-int8", "all-nf4")]
    times = synthetic_csv(tmp_path, board=true, rows=rows)
    out = tmp_path / "mycpu.toml"
    r = runner.invoke(app, ["calibrate", str(times), "-o", str(out), "--runtime", "llama.cpp-cpu"])
    assert r.exit_code == 0, r.output
    assert "[npu]" not in out.read_text()
    b = load_board("rk3588-32g", out)
    assert b.engines == ("cpu",) and b.iova_usable_bytes == 0
    for f in ("cpu_int8_ops_per_s", "cpu_nf4_ops_per_s", "cpu_float_ops_per_s", "decode_fraction", "decode_token_s"):
        assert getattr(b, f) == pytest.approx(getattr(true, f), rel=1e-3), f
    (tmp_path / "npu.csv").write_text("kind,engine,encoding,m,n,k,seconds\nmatmul,npu,int8,64,768,2048,0.0003\n")
    r = runner.invoke(app, ["calibrate", str(tmp_path / "npu.csv"), "-o", str(tmp_path / "x.toml"),
                            "--runtime", "llama.cpp-cpu"])
    assert r.exit_code == 2 and "has no NPU" in r.stderr and not (tmp_path / "x.toml").exists()


def test_cli_json(tmp_path):
    import json

    times = synthetic_csv(tmp_path)
    r = runner.invoke(app, ["calibrate", str(times), "-o", str(tmp_path / "b.toml"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert {c["key"] for c in d["constants"] if c["fitted"]} == {f"{p.section}.{p.key}" for p in cal.PARAMS}
    assert len(d["points"]) == len(_synthetic_rows()) and all(abs(p["error_pct"]) < 0.1 for p in d["points"])


BAD = [
    ("missing column", "kind,engine,encoding,m,n,k\nmatmul,npu,int8,1,768,2048\n", "missing column 'seconds'"),
    ("negative time", "kind,engine,encoding,m,n,k,seconds\nmatmul,npu,int8,1,768,2048,-0.1\n",
     "line 2: 'seconds' must be a positive number"),
    ("zero time", "kind,config,choice,prompt,tok_s\ndecode,qwen2.json,all-nf4,64,0\n", "'tok_s' must be a positive"),
    ("unknown kind", "kind,seconds\nbenchmark,1\n", "line 2: unknown kind 'benchmark'"),
    ("unknown config", "kind,config,choice,prompt,tok_s\ndecode,nope/config.json,all-nf4,64,10\n",
     "config 'nope/config.json' not found"),
    ("unknown column", "kind,secs\nmatmul,1\n", "unknown column 'secs'"),
    ("bad choice", "kind,config,choice,prompt,tok_s\ndecode,qwen2.json,q4_k_m,64,10\n", "choice 'q4_k_m' is not one of"),
    ("npu f16", "kind,engine,encoding,m,n,k,seconds\nmatmul,npu,f16,1,768,2048,0.001\n", "the NPU computes int8"),
    ("empty cell", "kind,engine,encoding,m,n,k,seconds\nmatmul,npu,int8,,768,2048,0.001\n", "line 2: 'm' is empty"),
    ("empty file", "", "empty"),
    ("all held out", "kind,config,choice,prompt,tok_s,set\ndecode,qwen2.json,all-nf4,64,10,holdout\n", "set = fit"),
    ("two runtimes", "kind,config,choice,prompt,tok_s,runtime\ndecode,qwen2.json,all-nf4,64,10,a\n"
                     "decode,qwen2.json,all-int8,64,8,b\n", "one file calibrates one runtime path"),
]


@pytest.mark.parametrize("name,text,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_csv_is_one_line_exit_2_nothing_written(tmp_path, name, text, needle):
    shutil.copy(CONFIGS / "qwen2.json", tmp_path / "qwen2.json")
    times = tmp_path / "times.csv"
    times.write_text(text)
    out = tmp_path / "b.toml"
    r = runner.invoke(app, ["calibrate", str(times), "-o", str(out)])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output
    assert set(tmp_path.iterdir()) == {times, tmp_path / "qwen2.json"}  # nothing written, no temp file left


def test_missing_times_file_and_bad_output_name(tmp_path):
    r = runner.invoke(app, ["calibrate", str(tmp_path / "no.csv"), "-o", str(tmp_path / "b.toml")])
    assert r.exit_code == 2 and "no such file" in r.stderr
    times = synthetic_csv(tmp_path)
    r = runner.invoke(app, ["calibrate", str(times), "-o", str(tmp_path / "b.json")])
    assert r.exit_code == 2 and "must end in .toml" in r.stderr
    r = runner.invoke(app, ["calibrate", str(times), "-o", str(tmp_path / "b.toml"), "--runtime", "nope"])
    assert r.exit_code == 2 and "unknown runtime 'nope'" in r.stderr and not (tmp_path / "b.toml").exists()
    r = runner.invoke(app, ["calibrate", str(times), "-o", str(tmp_path / "nodir" / "b.toml")])
    assert r.exit_code == 2 and "does not exist" in r.stderr
    assert not (tmp_path / "b.json").exists()


# ------------------------------------------------------------------------------------------ published data

def _doc() -> str:
    return cal.DOC.read_text(encoding="utf-8")


def test_published_and_excluded_cover_every_measurement_once():
    meas = cal.measurements()
    with open(cal.PUBLISHED, newline="") as fh:
        pub = list(csv.DictReader(fh))
    with open(cal.PUBLISHED.parent / "excluded.csv", newline="") as fh:
        exc = list(csv.DictReader(fh))
    ids = [r["id"] for r in pub] + [r["id"] for r in exc]
    assert sorted(ids) == sorted(meas) and len(set(ids)) == len(ids)
    for code in {r["reason"] for r in exc}:  # every exclusion reason is explained in the doc
        assert f"| `{code}` | {sum(r['reason'] == code for r in exc)} |" in _doc(), code
    for r in pub:  # every value is the measurement's, converted to seconds or tok/s
        m = meas[r["id"]]
        if m["unit"] == "ms":
            assert Decimal(r["seconds"]) * 1000 == Decimal(m["value"]), r["id"]
        else:
            assert m["unit"] == "tok/s" and Decimal(r["tok_s"]) == Decimal(m["value"]), r["id"]


def test_shipped_fit_set_is_the_documented_design():
    """published.csv's set column is each runtime path's Design (docs/CALIBRATION.md section 3)."""
    pts = cal.read_times(cal.PUBLISHED)
    assert {p.runtime for p in pts} == set(cal.RUNTIME_FITS)
    for rt in cal.RUNTIME_FITS:
        own = [p for p in pts if p.runtime == rt]
        assert [p.set for p in cal.design_points(pts, rt)] == [p.set for p in own], rt


def test_doc_table_is_what_the_shipped_runtime_paths_predict():
    """docs/CALIBRATION.md section 4 = `python -m orkpack.tiers.calibrate --published` (so it cannot go stale)."""
    table = cal.published_table()
    assert cal.doc_table() == table, "run: python -m orkpack.tiers.calibrate --published --update-doc"
    for name in ("rk3588-16g", "rk3588-8g"):  # the three boards share the hardware constants of the cost model
        for rt in cal.RUNTIME_FITS:
            b, base = load_board(name, rt), load_board("rk3588-32g", rt)
            assert replace(b, name=base.name, total_bytes=base.total_bytes, reserve_bytes=base.reserve_bytes) == base


def test_held_out_error_stays_within_the_claim():
    """Section 4's claim, per runtime path: held-out median, worst and the count within ±35 %."""
    pts = cal.read_times(cal.PUBLISHED)
    pred = cal.predict_published(pts, cal.published_boards())
    e_all = np.abs(pred / np.array([p.value for p in pts]) - 1)
    claims = re.findall(r"`([\w.-]+)` held out: median \|error\| <= (\d+) %, worst <= (\d+) %, at least (\d+) of "
                        r"(\d+) within ±35 %", _doc())
    assert {c[0] for c in claims} == set(cal.RUNTIME_FITS), "a runtime path's claim is missing in docs/CALIBRATION.md"
    for rt, med, worst, within, n in claims:
        e = e_all[[p.runtime == rt and p.set == "holdout" for p in pts]]
        assert len(e) == int(n), rt
        assert np.median(e) * 100 <= int(med) and np.max(e) * 100 <= int(worst) and int((e <= 0.35).sum()) >= int(within), rt


def test_shipped_constants_are_the_fit_from_any_start():
    """Every shipped runtime path's constants are what the published fit gives (fitted, inherited or kept),
    also from a start far from them."""
    boards = cal.published_boards()
    far = {rt: replace(b, npu_efficiency=0.5, submit_overhead_s=1e-5 if rt == "rkllm" else b.submit_overhead_s,
                       npu_k_falloff=0.1, cpu_int8_ops_per_s=3e11, cpu_nf4_ops_per_s=5e10, cpu_float_ops_per_s=3e11,
                       decode_fraction=0.3, decode_token_s=0.0, request_s=0.0 if rt == "rkllm" else b.request_s)
           if "npu" in b.engines else replace(b, cpu_int8_ops_per_s=3e11, cpu_nf4_ops_per_s=5e10,
                                               cpu_float_ops_per_s=3e11, decode_fraction=0.3, decode_token_s=0.0)
           for rt, b in boards.items()}
    for start, rel in ((None, 0.0), (far, 2e-3)):
        fits = cal.published_fits(base=start)
        for rt, f in fits.items():
            assert [p.field for p in f.params] == list(cal.RUNTIME_FITS[rt].params), rt
            for fld in cal.TOML_KEYS:
                want, got = getattr(boards[rt], fld), getattr(f.board, fld)
                fitted = fld in cal.RUNTIME_FITS[rt].params or any(fld in fl for _, fl in cal.RUNTIME_FITS[rt].inherit)
                if start is None or fitted:
                    assert got == (want if rel == 0 else pytest.approx(want, rel=rel)), (rt, fld)


def test_published_fit_is_physical():
    """No runtime path decodes faster than the board's cores (or NPU) stream: fraction <= 1 and the CPU
    decode bandwidth <= 22.94 GB/s (docs/CALIBRATION.md)."""
    for rt, b in cal.published_boards().items():
        assert b.decode_fraction <= 1.0 and b.decode_bandwidth <= 22.94e9 and b.npu_decode_bandwidth <= 29.71e9, rt


def test_published_mode_prints_the_table(capsys):
    assert cal.main(["--published"]) == 0
    assert capsys.readouterr().out == cal.published_table()
    assert cal.main([]) == 2


def test_read_times_errors_name_the_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("# a comment\nkind,engine,encoding,m,n,k,seconds\n\nmatmul,gpu,int8,1,2,3,0.1\n")
    with pytest.raises(OrkError, match=r"line 4: engine 'gpu' is not npu or cpu"):
        cal.read_times(p)


def test_written_runtime_covers_every_runtime_field():
    """A new Runtime constant must get a line in the runtime files `orkpack calibrate` writes, and a Board field."""
    from dataclasses import fields

    from orkpack.tiers.board import Board
    from orkpack.tiers.runtime import Runtime

    assert set(cal.TOML_KEYS) == {f.name for f in fields(Runtime)} - {"name", "engines", "source"}
    assert set(cal.TOML_KEYS) <= {f.name for f in fields(Board)}
    assert {p.field for p in cal.PARAMS} <= set(cal.TOML_KEYS)
