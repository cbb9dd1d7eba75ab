"""What orkpack knows of how llama.cpp splits a model across devices and how its command lines say it
(docs/CLUSTER.md sections 1 and 4): its memory-proportional layer split, and the rpc-server and
client command lines (--rpc, -ot, -ngl, --tensor-split) that realise a cluster plan."""
from __future__ import annotations

import numpy as np

RPC_PORT = 50052  # rpc-server's default port (llama.cpp tools/rpc)


def _cum_split(fracs: list[float], n_layers: int) -> list[tuple[int, int]]:
    """llama.cpp's layer split (llama-model.cpp, load_tensors): cumulative fractions of --tensor-split;
    layer il goes to the first device whose cumulative fraction exceeds il / n_layers."""
    tot = sum(fracs)
    cum = list(np.cumsum(np.array(fracs, dtype=np.float32)) / np.float32(tot))
    dev = [next((j for j, c in enumerate(cum) if c > np.float32(il) / np.float32(n_layers)), len(fracs) - 1)
           for il in range(n_layers)]
    out, a = [], 0
    for j in range(len(fracs)):
        b = a + dev.count(j)
        out.append((a, b))
        a = b
    return out


def memory_proportional(boards: list, n_layers: int) -> list[tuple[int, int]]:
    """The split llama.cpp makes by default: layers in proportion to each device's free memory (here the
    board's RAM less its reserve)."""
    return _cum_split([float(b.total_bytes - b.reserve_bytes) for b in boards], n_layers)


def _layer_regex(a: int, b: int) -> str:
    """A regular expression matching the tensor names of layers a .. b-1 (``blk\\.(a|...|b-1)\\.``)."""
    return r"^blk\.(" + "|".join(str(x) for x in range(a, b)) + r")\."


RPC_SERVER = "ggml-rpc-server"  # tools/rpc's binary (rpc-server before llama.cpp renamed it; 0c1e570 builds this)
CLIENT = "llama-completion"  # the non-interactive client (llama-cli is the chat UI since late 2025; same arguments)
MODEL_GGUF = "model.gguf"  # the client's model file: orkpack export DIR -o DIR/model.gguf
OPEN_WARNING = ("rpc-server bound to 0.0.0.0 (asked for by name: bind = \"0.0.0.0\"): llama.cpp's RPC README says the "
                "RPC backend is fragile and insecure, \"Never run the RPC server on an open network or in a sensitive "
                "environment!\"; anyone who reaches the port can read and write the node's memory through it "
                "(GHSA-j8rj-fmpv-wcxw: unauthenticated remote code execution)")


def _ipv4(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) <= 255 for p in parts)


def cpu_count(cpus: str) -> int:
    """The number of CPUs in a taskset list ("4-7" -> 4, "0,2-3" -> 3)."""
    n = 0
    for part in cpus.split(","):
        a, _, b = part.partition("-")
        n += (int(b) - int(a) + 1) if b else 1
    return max(n, 1)


def commands(plan, model_gguf: str = MODEL_GGUF, port: int = RPC_PORT) -> dict:
    """The exact llama.cpp command lines that realise the split: one ``ggml-rpc-server`` per remote node, bound to
    that node's own address (0.0.0.0 only when the cluster file asks for it by name, with llama.cpp's warning), and
    the client's command with ``--rpc`` and ``-ot`` patterns (each layer range to its node's RPC buffer, the client's
    own range and the head to CPU; ``-ngl`` above the layer count, so it holds under either -ngl rule), or the
    equivalent ``-ngl`` / ``--tensor-split`` for current llama.cpp (the output layer counted in -ngl). Every process
    pinned to the A76 cores (``taskset -c 4-7``, the cluster file's ``cpus``) with as many threads; the client's
    model file is the export of the same packs (``orkpack export DIR -o DIR/model.gguf``)."""
    launch = getattr(plan, "launch", None) or {}
    cpus = launch.get("cpus") or "4-7"
    bind = launch.get("bind")
    threads = str(cpu_count(cpus))
    pin = ["taskset", "-c", cpus]
    remote = [n for n in plan.nodes[1:] if n["used"]]
    L = plan.ranges[-1][1]
    eps = [f"{n['host']}:{n.get('port') or port}" for n in remote]
    servers = [{"node": n["node"], "host": n["host"],
                "argv": pin + [RPC_SERVER, "-H", bind or n["host"], "-p", str(n.get("port") or port), "-t", threads,
                               "-c"]}
               for n in remote]
    warnings = []
    if bind:
        warnings.append(OPEN_WARNING)
    names = [n["host"] for n in remote if not _ipv4(n["host"])]
    if names and not bind:
        warnings.append(f"rpc-server binds an IPv4 address only (inet_addr; llama.cpp 0c1e570): give the nodes' "
                        f"addresses in the cluster file's hosts instead of {', '.join(names)}")
    ot = ["-ot", r"^output=CPU"]  # the head (output.weight, output_norm.weight) stays on the client
    a0, b0 = plan.ranges[0]
    if b0 > a0:
        ot += ["-ot", f"{_layer_regex(a0, b0)}=CPU"]
    for n, ep in zip(remote, eps):
        a, b = n["layers"]
        # the buffer type of the first device an rpc-server exposes: "RPC" + device index + "[" + endpoint + "]"
        # (ggml-rpc.cpp ggml_backend_rpc_buffer_type)
        ot += ["-ot", f"{_layer_regex(a, b)}=RPC0[{ep}]"]
    base = pin + [CLIENT, "-m", model_gguf, "-t", threads]
    rpc = ["--rpc", ",".join(eps)] if eps else []
    with_ot = base + rpc + ["-ngl", str(L + 1) if eps else "0"] + ot
    # the same without per-layer patterns. llama.cpp (llama-model.cpp load_tensors) counts the output layer as one
    # of -ngl's N: slots il >= n_layer + 1 - N are offloaded (layers, then the output at il = n_layer), and
    # --tensor-split divides those N slots among the RPC devices in --rpc order. So N = the remote layers + 1, the
    # last device's count takes the output's slot too, and -ot keeps the head itself on the client.
    counts = [n["layers"][1] - n["layers"][0] for n in remote]
    if counts:
        counts[-1] += 1
    split = base + rpc + (["-ngl", str(L - b0 + 1), "--tensor-split", ",".join(map(str, counts)),
                           "-ot", r"^output=CPU"] if eps else ["-ngl", "0"])
    return {"rpc_servers": servers, "client": {"node": 0, "host": plan.nodes[0]["host"], "argv": with_ot},
            "client_tensor_split": {"node": 0, "host": plan.nodes[0]["host"], "argv": split},
            "export": {"argv": ["orkpack", "export", ".", "-o", model_gguf],
                       "note": "run in this folder: the client's model file, the node packs' weights as one GGUF"},
            "warnings": warnings,
            "notes": f"{RPC_SERVER} and the client as in llama.cpp tools/rpc/README.md (-H host, -p port, -t threads, "
                     "-c local cache; --rpc host:port,...; -ot PATTERN=BUFFER_TYPE; -ngl; --tensor-split); the "
                     f"client's arguments after {CLIENT} serve llama-cli, llama-server, llama-perplexity and "
                     f"llama-bench alike (append -p PROMPT, or -cnv); {model_gguf} is orkpack export's GGUF of these "
                     "packs, each node's .orkpack the weights its ggml-ork backend loads; the RPC protocol has no "
                     "authentication and no encryption (docs/CLUSTER.md)"}
