"""Integrity end to end: verify refuses every truncation; inspect shows a damaged
pack as far as it can, marked UNTRUSTED, with exit code 1 (damaged) or 2 (truncated)."""
from __future__ import annotations

import io
import json
import struct

import pytest
from rich.console import Console

from orkpack.pack import spec
from orkpack.errors import PackError
from orkpack.inspect import pack_facts, untrusted_line
from orkpack.render import pack_facts as render
from orkpack.runtime.verify import verify_pack

from test_verify import build as build_pack


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return build_pack(tmp_path_factory.mktemp("i") / "small.orkpack")


def test_every_truncation_is_refused(small, tmp_path):
    """Cut the pack at every length from 0 to size-1: verify exits 2 every time, saying why."""
    data = small.read_bytes()
    t = tmp_path / "cut.orkpack"
    fd = None
    survivors = []
    import os

    t.write_bytes(data)
    fd = os.open(t, os.O_WRONLY)
    try:
        for cut in range(len(data) - 1, -1, -1):
            os.ftruncate(fd, cut)
            r = verify_pack(t)
            if r.exit_code != 2 or not r.error or not ("truncated" in r.error or "not an orkpack" in r.error):
                survivors.append((cut, r.exit_code, r.error, r.failures[:1]))
    finally:
        os.close(fd)
    assert survivors == []


def _render(f) -> str:
    buf = io.StringIO()
    render(Console(file=buf, width=220, color_system=None), f)
    return buf.getvalue()


def test_inspect_damaged_header_shows_it_untrusted(small, tmp_path):
    data = bytearray(small.read_bytes())
    hoff = struct.unpack_from("<Q", data, 40)[0]
    at = data.index(b"output_norm", hoff)
    data[at] ^= 0x20  # "Output_norm": the JSON still parses, the header checksum does not hold
    bad = tmp_path / "bad.orkpack"
    bad.write_bytes(bytes(data))
    assert verify_pack(bad).exit_code == 1
    f = pack_facts(bad)
    assert f["exit_code"] == 1 and "header checksum" in f["untrusted"]
    assert f["checksums"]["header"] == "MISMATCH" and f["checksums"]["preamble"] == "ok"
    assert "Output_norm.weight" in [t["name"] for t in f["tensors"]] and f["tensor_count"] == 3
    out = _render(f)
    assert "UNTRUSTED" in out and "Output_norm.weight" in out
    assert untrusted_line(f).startswith("UNTRUSTED: ")
    json.dumps(f)
    # a sound pack: trusted, exit 0
    ok = pack_facts(small)
    assert ok["untrusted"] is None and ok["exit_code"] == 0 and untrusted_line(ok) is None


def test_inspect_unparsable_header_shows_the_preamble(small, tmp_path):
    data = bytearray(small.read_bytes())
    data[-1] ^= 0xFF
    bad = tmp_path / "bad.orkpack"
    bad.write_bytes(bytes(data))
    f = pack_facts(bad)
    assert f["exit_code"] == 1 and f["tensors"] == [] and "not valid JSON" in f["checksums"]["header"]
    assert f["file_size"] == len(data) and "UNTRUSTED" in _render(f)


def test_inspect_truncated_shows_preamble_facts(small, tmp_path):
    data = small.read_bytes()
    cut = tmp_path / "cut.orkpack"
    cut.write_bytes(data[:5000])
    f = pack_facts(cut)
    assert f["exit_code"] == 2 and "truncated" in f["untrusted"]
    assert f["file_size"] == len(data) and f["format_version"] == f"1.{spec.VERSION_MINOR}" and f["checksums"]["preamble"] == "ok"
    assert "5000 bytes on disk" in _render(f)
    cut.write_bytes(data[:100])  # not even a preamble: nothing to show, the error stands
    with pytest.raises(PackError, match="truncated"):
        pack_facts(cut)
    cut.write_bytes(b"GGUF" + bytes(9000))
    with pytest.raises(PackError, match="not an orkpack"):
        pack_facts(cut)


def test_cli_inspect_damaged_exit_code(small, tmp_path):
    import inspect as pyinspect

    import orkpack.cli as cli

    if "untrusted_line" not in pyinspect.getsource(cli.inspect):
        pytest.skip("needs the lead's 4-line edit to cli.py's inspect (docs/GUARANTEES.md, 'CLI hook')")
    from typer.testing import CliRunner

    data = bytearray(small.read_bytes())
    data[-3] ^= 1
    bad = tmp_path / "bad.orkpack"
    bad.write_bytes(bytes(data))
    r = CliRunner().invoke(cli.app, ["inspect", str(bad)])
    assert r.exit_code == 1 and "UNTRUSTED" in r.output
    r = CliRunner().invoke(cli.app, ["inspect", str(small)])
    assert r.exit_code == 0
