"""The structure-aware fuzzer of both pack readers (fuzz/fuzz_structure.py), in CI:

* every finding saved under fuzz/regressions/ (NAME.orkpack, NAME.json with the exit code both readers
  must give) replays through the Python reader (verify_pack, and --reference --keep-going) and
  orkpack-check with that exit code, no exception other than orkpack's own, no crash;
* the saved structure corpus (fuzz/structure_corpus/, slimmed good packs) passes both;
* a bounded deterministic sample of the fuzzer (a few hundred mutated packs of the corpus): no finding
  (no crash in either reader, no disagreement between their exit codes);
* issue 11's known finding, spelled out: a huge k_segment in an nf4 slice's inflate record.

The C side skips, saying why, when orkpack-check cannot be built (no cc/make, no libcjson-dev /
libxxhash-dev); the Python side runs regardless.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fuzz"))
import fuzz_structure as fs  # noqa: E402
import harness  # noqa: E402

REGRESSIONS = sorted(fs.REGRESSIONS.glob("*.orkpack"))
CORPUS = sorted(fs.CORPUS.glob("*.orkpack"))


def _expect(p: Path) -> int:
    return json.loads(p.with_suffix(".json").read_text())["expect"]


def test_regressions_are_small_and_decided():
    assert REGRESSIONS, "fuzz/regressions/ holds the fuzzers' findings"
    for p in REGRESSIONS:
        side = p.with_suffix(".json")
        assert side.exists(), f"{p.name}: no sidecar"
        assert _expect(p) in (0, 1, 2), f"{p.name}: no expected exit code decided"
        assert p.stat().st_size <= 64 << 10, f"{p.name}: {p.stat().st_size} bytes; minimize it"


@pytest.mark.parametrize("p", REGRESSIONS, ids=lambda p: p.stem)
def test_regression_python(p):
    out = fs.python_outcomes([p])[0]  # in a forked child: a native crash fails the test, not the session
    assert out.crash is None, out.trace
    assert out.code == _expect(p), out.msg


def test_regressions_c(check):
    outs = fs.CReader(check).check(REGRESSIONS)
    bad = [f"{p.name}: C {o.code} {o.crash or o.msg}, expected {_expect(p)}"
           for p, o in zip(REGRESSIONS, outs) if o.crash or o.code != _expect(p)]
    assert not bad, "\n".join(bad)


def test_corpus_passes_both(check):
    assert len(CORPUS) >= 5
    for p in CORPUS:
        out = fs.run_python(p)
        assert (out.code, out.crash) == (0, None), (p.name, out.msg, out.trace)
    assert [o.code for o in fs.CReader(check).check(CORPUS)] == [0] * len(CORPUS)


def _sample(check, cases: int):
    s = fs.fuzz(fs.load_corpus(), seed=20251201, cases=cases, check=check, batch=200, save=None, log=lambda m: None)
    assert not s.findings, "\n".join(f"[{f.target}] {f.sig} (case {f.case.index}: {f.case.to_json()})"
                                     for f in s.findings.values())
    assert s.py_execs == cases
    # the mutations get past the header checks: some packs pass, some fail in the later checks
    assert s.stages.get("ok", 0) > cases // 20
    assert sum(v for k, v in s.stages.items() if k not in ("open", "ok", "unusable")) > 0
    return s


def test_structure_sample_python():
    """A bounded deterministic sample, the Python reader alone (runs without a C compiler)."""
    _sample(None, 300)


def test_structure_sample_both(check):
    s = _sample(check, 400)
    assert s.c_execs == 400 and s.compared == 400


def _with_inflate_k_segment(src: bytes, ks: int) -> bytes:
    """src (a corpus pack with an nf4 NPU slice) with that slice's inflate layout rebuilt for ``ks`` and its
    q_size following; every checksum recomputed."""
    hb, data, _ = harness.split_pack(src)
    h = json.loads(hb)
    s = next(s for t in h["tensors"] for s in t["slices"] if s.get("inflate"))
    n, k = s["shape"]
    lay = s["inflate"]["layout"]
    lay["k_segment"] = ks
    lay["segments"] = [[0, k, -(-k // 32) * 32]] if ks >= k else lay["segments"]
    return harness.forge_pack(json.dumps(h).encode("ascii"), data)


HUGE = [2 ** 63, 2 ** 63 + 32, 2 ** 64, 2 ** 70, 10 ** 30]  # beyond int64: damaged (liborkpack: exit 1)
WIDE = [2 ** 31, 2 ** 62, 2 ** 63 - 64, 2 ** 63 - 32]  # int64, >= K: one segment, a valid pack


def test_huge_inflate_k_segment_is_damage(tmp_path):
    """Issue 11: an inflate k_segment beyond int64 made verify raise OverflowError; it is a damaged pack
    (exit 1), as liborkpack says. One that fits int64 and is >= K is a single-segment tiling, loaded."""
    src = (fs.CORPUS / "dual_nf4.orkpack").read_bytes()
    for ks in HUGE + WIDE:
        p = tmp_path / f"ks{ks}.orkpack"
        p.write_bytes(_with_inflate_k_segment(src, ks))
        out = fs.run_python(p)
        assert out.crash is None, out.trace
        if ks in HUGE:
            assert (out.code, out.stage) == (1, "layout") and "inflate layout has no valid k_segment" in out.msg
        else:
            assert out.code == 0, out.msg


def test_huge_inflate_k_segment_c_agrees(check, tmp_path):
    src = (fs.CORPUS / "dual_nf4.orkpack").read_bytes()
    paths = []
    for ks in HUGE + WIDE:
        p = tmp_path / f"ks{ks}.orkpack"
        p.write_bytes(_with_inflate_k_segment(src, ks))
        paths.append(p)
    outs = fs.CReader(check).check(paths)
    assert [(o.code, o.crash) for o in outs] == [(1, None)] * len(HUGE) + [(0, None)] * len(WIDE)
    assert all("inflate layout has no valid k_segment" in o.msg for o in outs[:len(HUGE)])
