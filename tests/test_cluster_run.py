"""The cluster for real on this machine: ggml-rpc-server processes on 127.0.0.1 ports started with cluster.json's own
lines, the client's line run on the export of the node packs; llama.cpp's log puts each layer's tensors on the node
the plan put them, and the generated text and the perplexity equal the single-process run's.

Every process is bounded in time and stopped at the end; only loopback addresses."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llama_cpp import need, perplexity
from orkpack import synth
from orkpack.cli import app
from orkpack.tiers import cluster as tcluster

ROOT = Path(__file__).resolve().parents[1]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _board(tmp: Path, j: int, total: int) -> Path:
    t = (ROOT / "orkpack" / "data" / "boards" / "rk3588-32g.toml").read_text()
    t = re.sub(r'(?m)^name = .*', f'name = "small{j}"', t)
    t = re.sub(r"(?m)^total_bytes = .*", f"total_bytes = {total}", t)
    t = re.sub(r"(?m)^reserve_bytes = .*", "reserve_bytes = 1000000", t)
    p = tmp / f"small{j}.toml"
    p.write_text(t)
    return p


def _wait_listening(port: int, proc, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"rpc-server exited: {proc.stderr.read()[-1500:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"rpc-server on port {port} did not listen within {timeout} s")


def test_loopback_cluster_runs_the_plan(tmp_path):
    server = need("ggml-rpc-server", "rpc-server")
    completion = need("llama-completion")
    ppl_exe = need("llama-perplexity")
    hf = synth.write_hf_model(tmp_path / "hf", layers=6, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512,
                              seed=3)
    synth.write_tokenizer(hf, n_merges=200)
    ports = _free_ports(3)
    # three boards with room for about a third of the model each: the plan must use all three
    boards = [str(_board(tmp_path, j, 1_000_000 + 420_000)) for j in range(3)]
    cf = tmp_path / "cluster.toml"
    cf.write_text(f"boards = {json.dumps(boards)}\nhosts = [\"127.0.0.1\", \"127.0.0.1\", \"127.0.0.1\"]\n"
                  f"ports = {json.dumps(ports)}\ncpus = \"0\"\n")
    out = tmp_path / "cl"
    r = CliRunner().invoke(app, ["build", str(hf), "--boards", str(cf), "-o", str(out), "--ctx", "256", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads((out / "cluster.json").read_text())
    layers = {n["node"]: n["layers"] for n in d["nodes"]}
    assert all(b > a for a, b in layers.values()), layers  # every node holds layers
    cmd = d["commands"]
    assert not cmd["warnings"]
    # the client's model file, as cluster.json says to make it
    ex = cmd["export"]["argv"]
    assert ex[:2] == ["orkpack", "export"]
    r = CliRunner().invoke(app, ["export", str(out / ex[2]), *ex[3:-1], str(out / ex[-1])])
    assert r.exit_code == 0, r.output
    procs = []
    env = dict(os.environ, LLAMA_CACHE=str(tmp_path / "rpc-cache"))
    try:
        for s in cmd["rpc_servers"]:
            argv = s["argv"]
            assert argv[:3] == ["taskset", "-c", "0"] and argv[3] == "ggml-rpc-server"
            assert argv[argv.index("-H") + 1] == "127.0.0.1"
            procs.append(subprocess.Popen([argv[0], argv[1], argv[2], str(server), *argv[4:]], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            _wait_listening(int(argv[argv.index("-p") + 1]), procs[-1])
        client = cmd["client"]["argv"]
        assert client[3] == "llama-completion" and client[client.index("-m") + 1] == "model.gguf"
        gen = ["-p", "the of and to in is was", "-n", "24", "--temp", "0", "--seed", "1", "-no-cnv", "--no-warmup"]

        def run(argv, extra):
            res = subprocess.run(argv + extra, cwd=out, capture_output=True, text=True, timeout=300, env=env)
            assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
            return res

        dist = run([*client[:3], str(completion), *client[4:]], gen + ["-v"])
        log = dist.stdout + dist.stderr
        # llama.cpp's own log: every layer tensor's buffer is its node's (tensor ... buffer type overridden to ...)
        placed = dict(re.findall(r"tensor (blk\.\d+\.\S+) \(.*?\) buffer type overridden to (\S+)", log))
        want = {0: "CPU"} | {s["node"]: f"RPC0[127.0.0.1:{ports[s['node']]}]" for s in cmd["rpc_servers"]}
        n_layer_tensors = 0
        for name, buft in placed.items():
            il = int(name.split(".")[1])
            node = next(j for j, (a, b) in layers.items() if a <= il < b)
            assert buft == want[node], (name, buft)
            n_layer_tensors += 1
        assert n_layer_tensors == 6 * 9, sorted(placed)  # 9 tensors a layer, all found in the log
        single = run([str(completion), "-m", "model.gguf", "-t", "1"], gen)
        text_of = lambda res: res.stdout.strip()  # noqa: E731
        assert text_of(dist) and text_of(dist) == text_of(single), (text_of(dist), text_of(single))
        words = tmp_path / "words.txt"
        words.write_text(" ".join(["the of and to in is was that for on with as by at from"] * 60) + "\n")
        args = client[4:]
        p_dist, _ = perplexity(out / "model.gguf", words, 64, 4, *args[args.index("-t") + 2:], binary_path=ppl_exe)
        p_one, _ = perplexity(out / "model.gguf", words, 64, 4, binary_path=ppl_exe)
        assert p_dist == pytest.approx(p_one, rel=1e-5)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_cluster_file_launch_keys(tmp_path):
    """ports / cpus / bind in a cluster file: bad values are one line; bind = "0.0.0.0" by name binds every
    interface with llama.cpp's warning."""
    base = 'boards = ["rk3588-32g", "rk3588-32g"]\nhosts = ["10.0.0.1", "10.0.0.2"]\n'
    for extra, needle in (("ports = [1]\n", "'ports'"), ("ports = [0, 5]\n", "'ports'"), ('cpus = "4-7; rm"\n', "'cpus'"),
                          ('bind = "::"\n', "'bind'")):
        f = tmp_path / "c.toml"
        f.write_text(base + extra)
        with pytest.raises(Exception) as e:
            tcluster.parse_cluster(str(f))
        assert needle in str(e.value)
    f = tmp_path / "open.toml"
    f.write_text(base + 'bind = "0.0.0.0"\nports = [50052, 50060]\ncpus = "4-5"\n')
    spec = tcluster.parse_cluster(str(f))
    assert (spec.bind, spec.ports, spec.cpus) == ("0.0.0.0", [50052, 50060], "4-5")


def test_cluster_build_refuses_the_model_folder(tmp_path):
    hf = synth.write_hf_model(tmp_path / "hf", layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512,
                              seed=1)
    before = sorted(p.name for p in hf.iterdir())
    r = CliRunner().invoke(app, ["build", str(hf), "--boards", "rk3588-32g,rk3588-32g", "-o", str(hf)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "own folder" in r.output, r.output
    assert sorted(p.name for p in hf.iterdir()) == before


def test_cluster_build_refuses_a_folder_inside_or_holding_an_input(tmp_path):
    """-o inside the model's folder, or a folder that holds the model or a file an option names (a cluster file):
    one line, exit 2, nothing written anywhere."""
    hf = synth.write_hf_model(tmp_path / "hf", layers=2, hidden=64, intermediate=128, heads=2, kv_heads=1, vocab=512,
                              seed=1)
    conf = tmp_path / "conf"
    conf.mkdir()
    cl = conf / "c.toml"
    cl.write_text('boards = ["rk3588-32g", "rk3588-32g"]\n')
    (tmp_path / "g").mkdir()
    gg = synth.write_gguf_from_hf(hf, tmp_path / "g" / "m.gguf")
    two = ["--boards", "rk3588-32g,rk3588-32g"]
    cases = [([str(hf), *two, "-o", str(hf / "packs")], "inside the model's folder"),
             ([str(hf), *two, "-o", str(tmp_path)], "holds an input"),
             ([str(hf), "--boards", str(cl), "-o", str(conf)], "holds an input"),
             ([str(gg), *two, "-o", str(gg.parent)], "own folder"),
             ([str(gg), *two, "-o", str(tmp_path)], "holds an input")]
    snap = lambda: sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))  # noqa: E731
    before = snap()
    for args, needle in cases:
        r = CliRunner().invoke(app, ["build", *args])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and needle in r.output, (args, r.output)
        assert snap() == before, args
