"""Determinism: the same inputs give the same bytes, whatever the process, folder,
environment or thread count; the header holds no time (unless asked) and no path."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from orkpack.build import BuildOptions, build
from orkpack.pack.reader import Pack
from orkpack.synth import write_hf_model

ROOT = Path(__file__).resolve().parents[1]
OPTS = dict(npu=["blk.0.attn_q.weight"], keep=["output_norm.weight"])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_hf_model(tmp_path_factory.mktemp("det") / "model", layers=2, hidden=128, intermediate=352, vocab=256, seed=11)


def _header(path: Path) -> bytes:
    raw = path.read_bytes()
    return raw[struct.unpack_from("<Q", raw, 40)[0]:]


def test_same_bytes_across_processes_envs_and_folders(model, tmp_path):
    ref = build(model, tmp_path / "ref.orkpack", BuildOptions(threads=1, **OPTS)).path.read_bytes()
    # the same model copied to another folder, built by another process with another cwd, TMPDIR,
    # locale, hash seed, thread count, and relative paths
    # (same folder name: the tier map records the model folder's *name*, as provenance records file names)
    other = tmp_path / "elsewhere" / "deeper" / model.name
    shutil.copytree(model, other)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir), PYTHONHASHSEED="12345", LC_ALL="C", TZ="Pacific/Kiritimati",
               OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = ("import sys, json; from orkpack.build import BuildOptions, build; "
            "build(sys.argv[1], sys.argv[2], BuildOptions(threads=int(sys.argv[3]), **json.loads(sys.argv[4])))")
    for threads in (1, 2):
        out = f"out{threads}.orkpack"
        subprocess.run([sys.executable, "-c", code, os.path.relpath(other, cwd), out, str(threads), json.dumps(OPTS)],
                       cwd=cwd, env=env, check=True, capture_output=True)
        assert (cwd / out).read_bytes() == ref
    # and in this process, from the copy, with another thread count
    assert build(other, tmp_path / "again.orkpack", BuildOptions(threads=2, **OPTS)).path.read_bytes() == ref


def test_header_has_no_time_and_no_paths(model, tmp_path):
    out = build(model, tmp_path / "m.orkpack", BuildOptions(threads=1, **OPTS)).path
    hb = _header(out).decode("ascii")
    for path in (str(tmp_path), str(model), str(model.parent), os.getcwd(), str(Path.home()), sys.prefix):
        assert path not in hb
    h = json.loads(hb)
    assert "created" not in h["provenance"]
    for s in h["provenance"]["sources"]:
        assert s["file"] == Path(s["file"]).name and len(s["xxh3"]) == 16


def test_timestamp_only_when_asked(model, tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    plain = build(model, tmp_path / "a.orkpack", BuildOptions(threads=1, **OPTS)).path
    stamped = build(model, tmp_path / "b.orkpack", BuildOptions(threads=1, timestamp=True, **OPTS)).path
    with Pack.open(plain) as a, Pack.open(stamped) as b:
        assert "created" not in a.header["provenance"]
        assert b.header["provenance"]["created"] == "2023-11-14T22:13:20Z"
        pb = dict(b.header["provenance"])
        del pb["created"]
        assert pb == a.header["provenance"]  # the stamp is the only difference in the header
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    again = build(model, tmp_path / "c.orkpack", BuildOptions(threads=1, timestamp=True, **OPTS)).path
    with Pack.open(again) as c:
        assert c.header["provenance"]["created"].endswith("Z") and c.header["provenance"]["created"][:2] == "20"


def test_same_bytes_at_every_simd_level_and_thread_count(tmp_path, monkeypatch):
    # issue 26: the default build (the plan: its host levels, their host slices and copies, int8 NPU tiles), a pinned
    # one and the same in nf4 / int8,
    # at every SIMD level the CPU has and 1, 2 and 3 threads, give one set of bytes. The kernels' chunks are made
    # small so that every tensor is split across the threads (rows 360 wide: no multiple of 32 or 16)
    from orkpack import codecs

    monkeypatch.setattr(codecs, "NF4_CHUNK_BLOCKS", 7)
    monkeypatch.setattr(codecs, "INT8_CHUNK_ELEMS", 3000)
    src = write_hf_model(tmp_path / "m", layers=2, hidden=128, intermediate=360, vocab=256, seed=5)
    levels = [lvl for lvl in ("portable", "avx2", "avx512") if codecs.set_isa(lvl) == lvl]
    kinds, copies = set(), []
    try:
        for name, opts in (("default", {}), ("pinned", dict(OPTS, int8=["token_embd.weight"])),
                           ("pinned-nf4", dict(OPTS, int8=["token_embd.weight"], host_low="nf4"))):
            codecs.set_isa("portable")
            ref = build(src, tmp_path / f"{name}.orkpack", BuildOptions(threads=1, **opts)).path.read_bytes()
            for lvl in levels:
                codecs.set_isa(lvl)
                for threads in (1, 2, 3):
                    out = build(src, tmp_path / f"{name}-{lvl}-{threads}.orkpack", BuildOptions(threads=threads, **opts))
                    assert out.path.read_bytes() == ref, f"{name} build at {lvl}, {threads} threads: other bytes"
            with Pack.open(tmp_path / f"{name}.orkpack") as p:
                kinds |= {(s["encoding"], s["tier"]) for t in p.tensors for s in t["slices"]}
                copies += [s["host_copy"]["encoding"] for t in p.tensors for s in t["slices"] if s.get("host_copy")]
    finally:
        codecs.set_isa(None)
    # every encoder ran: nf4dq host slices, int8 host and NPU tiles, nf4dq host copies of NPU slices (the nf4 levels);
    # int5dq / int6dq host slices and int5dq copies (the levels the default plan takes for this tiny model)
    assert {("nf4dq", "host"), ("int8", "host"), ("int8", "npu"), ("int5dq", "host"), ("int6dq", "host")} <= kinds \
        and {"nf4dq", "int5dq"} <= set(copies), (kinds, copies)
