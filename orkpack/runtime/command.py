"""The body of ``orkpack verify`` (the CLI in orkpack/cli.py parses the options and calls
:func:`verify_command`). Exit code: 0 all passed, 1 a check failed, 2 unusable input;
with several packs, the worst.

JSON output (``--json``), stable keys::

    {"exit_code": 0, "device": "host", "inflate": "direct", "threads": 1,
     "packs": [{"path", "ok", "exit_code", "error", "failures": [..],
                "checks": {"open"|"data"|"parts"|"layout"|"arena"|"load"|"min_m"|"reference":
                           {"passed", "failed", "run"}},
                "stats": {"device", "inflate", "threads", "slices", "npu_slices",
                          "dual_slices", "host_copy_bytes",
                          "bytes_filled", "fill_seconds", "fill_gbps",
                          "bytes_inflated", "inflate_seconds", "inflate_gbps",
                          "arena_used", "arena_cap", "arena_cap_source"}}]}
"""
from __future__ import annotations

import json
from pathlib import Path

from orkpack.errors import OrkError, escape_name
from orkpack.runtime.backends import open_backend
from orkpack.runtime.verify import CHECKS, verify_pack


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n} B"


def verify_command(
    paths: list[Path],
    *,
    device: str = "auto",
    inflate: str = "direct",
    threads: int = 1,
    reference: bool = False,
    keep_going: bool = False,
    json_out: bool = False,
    console=None,
    source: Path | str | None = None,
    revision: str | None = None,
) -> int:
    if console is None:
        from rich.console import Console

        console = Console()
    if inflate not in ("direct", "two-step"):
        return _usage(console, json_out, f"--inflate {inflate!r}: choose direct or two-step")
    if threads < 1:
        return _usage(console, json_out, f"--threads {threads}: must be at least 1")
    if source is not None and not reference:
        return _usage(console, json_out, "--source is what --reference compares a rotated pack's tensors with: add --reference")
    if revision is not None and source is None:
        return _usage(console, json_out, "--revision is the hub revision of --source ORG/NAME: add --source")
    if source is not None:  # a hub name: downloaded, or found in huggingface_hub's cache (orkpack/sources/hub.py)
        from ..sources.hub import locate

        try:
            source = locate(source, revision=revision).path
        except OrkError as e:
            return _usage(console, json_out, f"--source {e}")
    if source is not None and not Path(source).exists():
        return _usage(console, json_out, f"--source {escape_name(str(source))}: no such file or folder")
    try:
        backend = open_backend(device)
    except OrkError as e:
        return _usage(console, json_out, str(e))
    try:
        results = [
            verify_pack(p, backend=backend, inflate=inflate, threads=threads, reference=reference, keep_going=keep_going,
                        source=source)
            for p in paths
        ]
    finally:
        backend.close()
    code = max((r.exit_code for r in results), default=0)
    if json_out:
        doc = {"exit_code": code, "device": backend.name, "inflate": inflate, "threads": threads,
               "packs": [r.to_json() for r in results]}
        console.print(json.dumps(doc, indent=2), markup=False, highlight=False, soft_wrap=True)
        return code
    _render(console, results, backend.name)
    return code


def _usage(console, json_out: bool, line: str) -> int:
    if json_out:
        console.print(json.dumps({"exit_code": 2, "error": line, "packs": []}, indent=2),
                      markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"[red]error:[/red] {escape_name(line, 1000)}", highlight=False)
    return 2


def _render(console, results, device: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    for r in results:
        label = escape(escape_name(r.path))
        if r.error:
            console.print(f"[red]unusable:[/red] {escape(r.error)}", highlight=False)
        for line in r.failures:
            console.print(f"[red]FAIL[/red] {label}: {escape(line)}", highlight=False)
    method = results[0].stats.get("inflate", "") if results else ""
    table = Table(title=f"orkpack verify (device {device}, inflate {method})")
    for col in ("pack", "result", "checks", "NPU", "dual", "filled", "fill GB/s", "inflated", "infl GB/s", "arena used/cap"):
        table.add_column(col, justify="left" if col in ("pack", "result") else "right")
    for r in results:
        st = r.stats
        passed = sum(r.checks[c]["passed"] for c in CHECKS)
        failed = sum(r.checks[c]["failed"] for c in CHECKS)
        result = "[green]ok[/green]" if r.ok else ("[red]unusable[/red]" if r.error else "[red]FAILED[/red]")
        arena = "-" if st.get("arena_cap") is None else f"{_size(st['arena_used'])} / {_size(st['arena_cap'])}"
        table.add_row(
            escape(escape_name(Path(r.path).name)),
            result,
            f"{passed}/{passed + failed}",
            str(st.get("npu_slices", "-")),
            str(st.get("dual_slices", "-")),
            _size(st.get("bytes_filled")),
            "-" if st.get("fill_gbps") is None else f"{st['fill_gbps']:.2f}",
            _size(st.get("bytes_inflated")),
            "-" if st.get("inflate_gbps") is None else f"{st['inflate_gbps']:.2f}",
            arena,
        )
    console.print(table)
