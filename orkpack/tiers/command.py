"""``orkpack plan``: solve a tier map and show it (rich tables) or print it (--json); -o writes it atomically."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from ..errors import OrkError, escape_name
from .board import load_board
from .manifest import manifest_from_path
from .profile import load_profile
from .solver import GiB, solve
from .tiermap import TierMap, dumps


def _b(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB // 8 else f"{n / (1 << 20):.1f} MiB"


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the target folder, fsync, rename: never a partial file at ``path``."""
    path = Path(path)
    if not path.parent.is_dir():
        raise OrkError(f"{escape_name(str(path))}: folder {escape_name(str(path.parent))} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def plan(model: Path, *, board: str = "rk3588-32g", profile: Path | None = None, ctx: int = 8192,
         kv_type: str = "f16", prefill_m: int = 512, pins: dict[str, list[str]] | None = None,
         ignore_unknown: bool = False) -> tuple[TierMap, float, list]:
    """(tier map, solve seconds, [manifest, board, profile]) for the build and for ``plan_command``."""
    b = load_board(board)
    man = manifest_from_path(model)
    prof = load_profile(profile, man, b, prefill_m, ignore_unknown=ignore_unknown)
    t0 = time.perf_counter()
    tm = solve(man, b, prof, ctx=ctx, kv_type=kv_type, pins=pins)
    return tm, time.perf_counter() - t0, [man, b, prof]


def render(tm: TierMap, console, solve_s: float, top: int = 12) -> None:
    from rich.table import Table

    d = tm.to_json()
    ob, bu, pr = d["objective"], d["budget"], d["prediction"]
    m = d["model"]
    console.print(f"[bold]{escape_name(m['source'])}[/]: {m['arch']}, {m['n_layers']} layers, "
                  f"{m['items']} items; board [bold]{d['board']['name']}[/], ctx {d['options']['ctx']} "
                  f"({d['options']['kv_type']} KV), profile {escape_name(str(d['options']['profile']))}")
    t = Table(title="Budget per engine")
    for c in ("engine", "used", "cap", "headroom", "what"):
        t.add_column(c, justify="left" if c in ("engine", "what") else "right")
    n, r = bu["npu"], bu["ram"]
    t.add_row("NPU (IOVA)", _b(n["used"]), _b(n["cap"]), _b(n["headroom"]), f"{n['items']} int8 items")
    t.add_row("RAM (UMA)", _b(r["used"]), _b(r["cap"]), _b(r["headroom"]),
              f"NPU {_b(r['npu_weights'])}, int8 {_b(r['host_int8'])}, NF4 {_b(r['host_nf4'])}, "
              f"float {_b(r['host_float'])}, KV {_b(r['kv_cache'])}, reserve {_b(r['reserve'])}")
    console.print(t)
    ben = getattr(tm, "benefits", {})  # the profile's benefit of every item, NPU or not
    hot = sorted((x for x in tm.decisions if ben.get(x.name, x.benefit_us) > 0),
                 key=lambda x: (-ben.get(x.name, x.benefit_us), x.name))[:top]
    if not hot:
        console.print(f"No item gains from the NPU at M = {pr['prefill_m']} on this board (every min_m is larger).")
    else:
        t = Table(title=f"Hottest {len(hot)} items (NPU benefit per prefill chunk of {pr['prefill_m']} tokens)")
        for c in ("item", "benefit", "encoding", "tier", "min_m"):
            t.add_column(c, justify="left" if c == "item" else "right")
        for x in hot:
            t.add_row(escape_name(x.name, 60), f"{ben.get(x.name, x.benefit_us) / 1e3:.3f} ms", x.encoding, x.tier,
                      str(x.min_m) if x.min_m < (1 << 30) else "never")
        console.print(t)
    fell = [x for x in tm.decisions if x.tier == "host" and ben.get(x.name, 0) > 0]
    fell.sort(key=lambda x: (x.pin == "default-keep", -ben[x.name], x.name))  # built-in keeps (MoE routers) last
    if fell:
        t = Table(title=f"Fell off the NPU ({len(fell)} items with a benefit; top {min(top, len(fell))})")
        for c in ("item", "benefit", "why"):
            t.add_column(c)
        for x in fell[:top]:
            why = (f"pinned {x.pin}" if x.pin else
                   f"NPU full: {_b(n['headroom'])} free, needs {_b(getattr(tm, 'npu_bytes', {}).get(x.name, 0))}; "
                   "the resident set saves more in total")
            t.add_row(escape_name(x.name, 60), f"{ben[x.name] / 1e3:.3f} ms", why)
        console.print(t)
    s1 = ob["stage1"]
    proof = ("optimal (bound = value)" if s1["status"] == "optimal"
             else f"gap {s1['gap']:.1f} us (bound {s1['bound']:.1f})")
    console.print(f"NPU benefit {ob['npu_benefit_us'] / 1e3:.1f} ms per chunk: {proof}; "
                  f"{s1['items']} candidates in {s1['groups']} groups, {s1['nodes']} nodes; solved in {solve_s * 1e3:.0f} ms")
    console.print(f"Predicted prefill: {pr['planned_tok_s']} tok/s vs CPU-only {pr['cpu_only_tok_s']} tok/s "
                  f"([bold]{pr['speedup']}x[/]); decode (M = 1) always runs on the CPU")
    for w in getattr(tm, "warnings", []):
        console.print(f"[yellow]warning:[/] {w}")


def plan_command(model: Path, *, board: str = "rk3588-32g", profile: Path | None = None, ctx: int = 8192,
                 kv_type: str = "f16", prefill_m: int = 512, pins: dict[str, list[str]] | None = None,
                 ignore_unknown: bool = False, json_out: bool = False, output: Path | None = None, console=None) -> int:
    """The whole ``orkpack plan``: returns the exit code; raises OrkError for bad input."""
    if console is None:
        from rich.console import Console

        console = Console()
    if output is not None and not Path(output).parent.is_dir():
        raise OrkError(f"{escape_name(str(output))}: folder {escape_name(str(Path(output).parent))} does not exist; create it first")
    tm, solve_s, (man, b, prof) = plan(Path(model), board=board, profile=profile, ctx=ctx, kv_type=kv_type,
                                       prefill_m=prefill_m, pins=pins, ignore_unknown=ignore_unknown)
    tm.benefits = {it.name: prof.benefit[i] * 1e6 for i, it in enumerate(man.items)}
    from . import cost

    tm.npu_bytes = {it.name: cost.npu_bytes(it.n, it.k, b) for it in man.items}
    text = dumps(tm)
    if output is not None:
        write_atomic(Path(output), text)
    if json_out:
        console.file.write(text) if hasattr(console, "file") else print(text, end="")
    else:
        render(tm, console, solve_s)
        if output is not None:
            console.print(f"tier map written to {escape_name(str(output))}")
    return 0
