"""The loopback cluster's per-token decode cost (docs/CLUSTER.md section 3): ggml-rpc-server processes on 127.0.0.1 started
with cluster.json's own lines, the client line against the single-process run of the same export, wall clock per
token ((N1 + N tokens) - (N1 tokens)) / N, interleaved pairs, medians; every server stopped at the end.
Usage: PYTHONPATH=. python bench/cluster_loopback.py WORKDIR REPEATS N CPUS   (the doc's figures: W 5 64 0)"""
import json, os, re, socket, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from typer.testing import CliRunner
from orkpack import synth
from orkpack.cli import app
import test_cluster_run as T
from llama_cpp import need

w = Path(sys.argv[1]); w.mkdir(exist_ok=True)
reps, npred = int(sys.argv[2]), int(sys.argv[3])
server, completion = need("ggml-rpc-server", "rpc-server"), need("llama-completion")
hf = w / "hf"
if not hf.exists():
    synth.write_hf_model(hf, layers=6, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=512, seed=3)
    synth.write_tokenizer(hf, n_merges=200)
ports = T._free_ports(3)
boards = [str(T._board(w, j, 1_000_000 + 420_000)) for j in range(3)]
cf = w / "cluster.toml"
cf.write_text(f"boards = {json.dumps(boards)}\nhosts = [\"127.0.0.1\", \"127.0.0.1\", \"127.0.0.1\"]\n"
              f"ports = {json.dumps(ports)}\ncpus = \"{sys.argv[4]}\"\n")
out = w / "cl"
r = CliRunner().invoke(app, ["build", str(hf), "--boards", str(cf), "-o", str(out), "--ctx", "256", "--json"])
assert r.exit_code == 0, r.output
d = json.loads((out / "cluster.json").read_text())
print("layers", {n["node"]: n["layers"] for n in d["nodes"]}, "prediction network", d["prediction"].get("network"))
cmd = d["commands"]
ex = cmd["export"]["argv"]
r = CliRunner().invoke(app, ["export", str(out / ex[2]), *ex[3:-1], str(out / ex[-1])])
assert r.exit_code == 0, r.output
env = dict(os.environ, LLAMA_CACHE=str(w / "rpc-cache"))
procs = []
gen = ["-p", "the of and to in is was", "-n", str(npred), "--temp", "0", "--seed", "1", "-no-cnv", "--ignore-eos"]

def _wall(argv, n):
    g = list(gen); g[g.index("-n") + 1] = str(n)
    t0 = time.perf_counter()
    res = subprocess.run(argv + g, cwd=out, capture_output=True, text=True, timeout=600, env=env,
                         stdin=subprocess.DEVNULL)
    t = time.perf_counter() - t0
    assert res.returncode == 0, (res.stdout + res.stderr)[-2000:]
    return t, res.stdout.strip()


def per_token(argv):
    """ms per decoded token from wall clock: (run of N2 tokens - run of N1 tokens) / (N2 - N1); no log parsing
    (llama.cpp's logger loses its last lines at exit, issue 22142)."""
    n1, n2 = 8, 8 + npred
    a, _ = _wall(argv, n1)
    b, text = _wall(argv, n2)
    return 1000 * (b - a) / (n2 - n1), n2 - n1, text


try:
    for s in cmd["rpc_servers"]:
        argv = s["argv"]
        procs.append(subprocess.Popen([argv[0], argv[1], argv[2], str(server), *argv[4:]], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        T._wait_listening(int(argv[argv.index("-p") + 1]), procs[-1])
    client = cmd["client"]["argv"]
    print("client", " ".join(client), flush=True)
    dist_argv = [*client[:3], str(completion), *client[4:]]
    one_argv = [*client[:3], str(completion), "-m", "model.gguf", "-t", client[client.index("-t") + 1]]
    rows = []
    for i in range(reps):
        a = per_token(one_argv); b = per_token(dist_argv)
        rows.append((a[0], b[0]))
        print(f"rep {i}: single {a[0]:.4f} ms/token ({a[1]} runs), cluster {b[0]:.4f} ms/token ({b[1]} runs), "
              f"same text {a[2] == b[2]}", flush=True)
    import statistics as st
    s1 = st.median(r[0] for r in rows); s2 = st.median(r[1] for r in rows)
    print(f"median single {s1:.4f} ms/token, cluster {s2:.4f} ms/token, extra {s2 - s1:.4f} ms/token over "
          f"{len(cmd['rpc_servers'])} remote nodes = {(s2 - s1) / len(cmd['rpc_servers']):.4f} ms per node")
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill(); p.wait()
    print("servers stopped:", [p.returncode for p in procs])
