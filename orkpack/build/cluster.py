"""``orkpack build --boards`` and ``orkpack inspect DIR``: one self-contained pack per board of a cluster plan
and ``DIR/cluster.json`` (docs/CLUSTER.md section 4)."""
from __future__ import annotations

from pathlib import Path

from ..errors import OrkError, escape_name
from ..tiers import solver
from ..tiers.cluster import ClusterPlan, _b, node_tiermap, plan_cluster, render, to_json


def node_pack_name(plan: ClusterPlan, j: int) -> str:
    return f"node{j}-{plan.boards[j].name}.orkpack"


def build_nf4_format(opts) -> str:
    """The NF4 format the build writes (--nf4-format; unset: dq32 with --nf4-mode opt, b64 with bnb), checked."""
    from ..transforms.nf4 import choose

    return choose(opts.nf4_mode, opts.nf4_weighting, None, opts.nf4_format).format


def _input_files(opts, boards: str, network: str | None) -> list[Path]:
    """The files a cluster build reads besides the source: --profile, --imatrix, --runtime, --network and the
    --boards files (a cluster file and the board files it or the list names)."""
    out = [Path(p) for p in (opts.profile, getattr(opts, "imatrix", None), getattr(opts, "runtime", None), network)
           if p is not None]
    names = [x.strip() for x in str(boards or "").split(",")]
    if len(names) == 1 and names[0].endswith(".toml") and Path(names[0]).is_file():
        import tomllib

        try:
            listed = tomllib.loads(Path(names[0]).read_text(encoding="utf-8")).get("boards")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            listed = None  # the plan names the bad file
        if isinstance(listed, list):
            names += [x for x in listed if isinstance(x, str)]
    out += [Path(x) for x in names if x]
    return [p for p in out if p.is_file()]


def _refuse_input_folder(src: Path, out_dir: Path, opts, boards: str, network: str | None) -> None:
    """-o must not be the model's folder, lie inside it, or hold any input (the source, or a file an option
    names): the packs and cluster.json are never written among or over what the build reads."""
    out = out_dir.resolve()
    where = escape_name(str(out_dir))
    if src.is_dir():
        home = src.resolve()
        if out == home:
            raise OrkError(f"{where}: is the model's own folder; the packs and cluster.json would be written among "
                           "its files: give another folder")
        if out.is_relative_to(home):
            raise OrkError(f"{where}: is inside the model's folder {escape_name(str(src))}; the packs and "
                           "cluster.json would be written among its files: give a folder outside it")
    elif src.exists() and out == src.resolve().parent:
        raise OrkError(f"{where}: is the model's own folder; the packs and cluster.json would be written among "
                       "its files: give another folder")
    for p in ([src] if src.exists() else []) + _input_files(opts, boards, network):
        if p.resolve().is_relative_to(out):
            raise OrkError(f"{where}: holds an input of this build ({escape_name(str(p))}); the packs and "
                           "cluster.json would be written beside it: give a folder that holds none of the inputs")


def prepare_cluster_build(source, out_dir: Path, opts, boards: str, network: str | None = None):
    """Every check and the plan, before anything is written: (plan, the memory-proportional plan or None, the
    source located: a hub name downloaded or found in the cache once the options are checked, orkpack/sources/hub.py)."""
    if opts.tiermap is not None or not opts.plan:
        raise OrkError("--boards plans the cluster itself: drop --tiermap / --no-plan")
    out_dir = Path(out_dir)
    if out_dir.suffix == ".orkpack" or (out_dir.exists() and not out_dir.is_dir()):
        raise OrkError(f"{escape_name(str(out_dir))}: with --boards, -o names a folder (one pack per board and "
                       "cluster.json)")
    from ..sources.hub import locate

    if not out_dir.parent.is_dir():
        raise OrkError(f"{escape_name(str(out_dir))}: folder {escape_name(str(out_dir.parent))} does not exist; create it first")
    source = locate(source, revision=opts.revision)
    _refuse_input_folder(source.path, out_dir, opts, boards, network)
    goal = opts.goal_of()
    plan, base, _ = plan_cluster(source, boards, network=network, profile=opts.profile, ctx=opts.ctx,
                                 kv_type=opts.kv_type, prefill_m=opts.prefill_m, pins=opts.pins(),
                                 ignore_unknown=opts.ignore_unknown, goal=goal, prompt=opts.prompt,
                                 runtime=getattr(opts, "runtime", None), nf4_format=build_nf4_format(opts),
                                 host_low=opts.host_low, host_high=opts.host_high)
    return plan, base, source


def write_cluster(source, out_dir: Path, opts, plan: ClusterPlan, base: ClusterPlan | None, *, on_node=None):
    """One self-contained pack per used node (only its tensors, placed by its own tier map), then
    ``out_dir/cluster.json``. On any failure what this call wrote is removed. Returns ([BuildResult], cluster dict)."""
    import json
    from dataclasses import replace as _replace

    from ..tiers.command import write_atomic
    from .pipeline import build as run_build

    out_dir = Path(out_dir)
    made = not out_dir.exists()
    out_dir.mkdir(exist_ok=True)
    results, packs, written = [], [], []
    node_opts = _replace(opts, npu=[], cpu=[], int8=[], nf4=[], keep=[])  # the pins shaped the plan already
    try:
        for j, n in enumerate(plan.nodes):
            if not n["used"]:
                packs.append(None)
                continue
            tm = node_tiermap(plan, j)
            sub, _ = plan.subs[j]
            name = node_pack_name(plan, j)
            if on_node:
                on_node(j, name)
            results.append(run_build(source, out_dir / name, node_opts, placement_map=tm,
                                     select={t.name for t in sub.tensors}))
            written.append(out_dir / name)
            packs.append(name)
        d = to_json(plan, base, packs)
        write_atomic(out_dir / "cluster.json", json.dumps(d, indent=1) + "\n")
    except BaseException:
        for p in written:
            p.unlink(missing_ok=True)
        if made:
            try:
                out_dir.rmdir()
            except OSError:
                pass
        raise
    return results, d


def build_cluster(source: Path, out_dir: Path, opts, boards: str, network: str | None = None, *, on_node=None):
    """Plan ``source`` across ``boards``, then write the packs and ``cluster.json`` (write_cluster).
    Returns (plan, [BuildResult], cluster dict)."""
    plan, base, source = prepare_cluster_build(source, out_dir, opts, boards, network)
    results, d = write_cluster(source, out_dir, opts, plan, base, on_node=on_node)
    return plan, results, d


def build_cluster_command(source: Path, output: Path, opts, boards: str, network: str | None, *, json_out: bool,
                          console, progress) -> int:
    import json
    import sys

    plan, base, source = prepare_cluster_build(source, output, opts, boards, network)  # bad input: one line, no bar
    with progress(not json_out) as prog:
        task = prog.add_task("build", total=None, tensor="")
        results, d = write_cluster(source, output, opts, plan, base,
                                   on_node=lambda j, name: prog.update(task, tensor=name))
    for r in results:
        for w_ in r.warnings:
            print(f"warning: {r.path.name}: {w_}", file=sys.stderr)
    if json_out:
        print(json.dumps({"cluster": str(Path(output) / "cluster.json"),
                          "packs": [{"path": str(r.path), "tensors": r.tensors, "pack_bytes": r.pack_bytes,
                                     "seconds": round(r.seconds, 4)} for r in results],
                          "prediction": plan.prediction}, indent=1))
    else:
        render(plan, None, console)
        for r in results:
            console.print(f"wrote {escape_name(str(r.path))}: {r.tensors} tensors, {r.pack_bytes} bytes")
        console.print(f"wrote {escape_name(str(Path(output) / 'cluster.json'))} (which pack goes to which node, and the "
                      "rpc-server and client command lines)")
    return 0


def inspect_cluster(path: Path, *, json_out: bool, console) -> int:
    """``orkpack inspect DIR`` or ``DIR/cluster.json``: the split per board, the packs, the command lines."""
    import json
    import shlex

    p = Path(path)
    if p.is_dir():
        p = p / "cluster.json"
    where = escape_name(str(p))
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OrkError(f"{where}: no such file (orkpack build ... --boards ... -o DIR writes DIR/cluster.json)") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise OrkError(f"{where}: not a readable cluster.json ({e.__class__.__name__})") from None
    cmd = d.get("commands") if isinstance(d, dict) else None
    lines = [] if not isinstance(cmd, dict) else [cmd.get("client"), *(cmd.get("rpc_servers") or [])]
    if not isinstance(d, dict) or d.get("schema") != "orkpack.cluster" or not isinstance(d.get("nodes"), list) \
            or not all(isinstance(c, dict) and isinstance(c.get("argv"), list)
                       and all(isinstance(a, str) and a.isprintable() for a in c["argv"]) for c in lines if c is not None):
        raise OrkError(f"{where}: not an orkpack cluster file (schema orkpack.cluster)")
    if json_out:
        print(json.dumps(d, indent=1))
        return 0
    from rich.table import Table

    pr = d.get("prediction") or {}
    console.print(f"[bold]{escape_name(str(d.get('model', {}).get('source')))}[/]: {len(d['nodes'])} nodes over "
                  f"{escape_name(str(d.get('network', {}).get('name')))}; split {d.get('split')}; predicted decode "
                  f"{pr.get('decode_tok_s')} tok/s, prefill {pr.get('prefill_tok_s')} tok/s, TTFT {pr.get('ttft_s')} s")
    t = Table(title="Split per board")
    for c in ("node", "board", "host", "layers", "pack", "NPU used", "RAM used"):
        t.add_column(c)
    for n in d["nodes"]:
        a, b = n.get("layers", [0, 0])
        bu = n.get("budget") or {}
        t.add_row(str(n.get("node")), escape_name(str(n.get("board"))), escape_name(str(n.get("host"))),
                  f"{a}-{b - 1} ({b - a})" if b > a else "none", escape_name(str(n.get("pack"))),
                  _b(bu["npu"]["used"]) if bu else "-", _b(bu["ram"]["used"]) if bu else "-")
    console.print(t)
    cmd = d.get("commands") or {}
    for s in cmd.get("rpc_servers", []):
        console.print(f"node {s['node']} ({escape_name(s['host'])}): {shlex.join(s['argv'])}", highlight=False, markup=False)
    if cmd.get("client"):
        console.print(f"client: {shlex.join(cmd['client']['argv'])}", highlight=False, soft_wrap=True, markup=False)
    return 0
