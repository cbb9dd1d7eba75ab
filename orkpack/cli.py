"""The `orkpack` command: one function per command; parse, call, print.

User errors (OrkError) print one line on stderr and exit with their code
(2, or 1 for a failed check); Ctrl-C exits 130. Anything else is a bug and
keeps its traceback.

Unlike the rest of the package, this module has no ``from __future__ import annotations``: typer reads every
command's parameters from their annotations, and objects cost it half of what strings do (get_type_hints
evaluates each string again; ~4 ms of every command, issue 26).
"""
import functools
import json
import os
import sys
import warnings
from pathlib import Path
from typing import List, Optional

import typer

from orkpack import __version__
from orkpack.errors import OrkError
from orkpack.gcpause import without_gc

def _plain_coercion() -> None:
    """Coerce plain option values without pydantic (issue 26): typer 0.29 hands every option's value to a pydantic
    TypeAdapter, and importing pydantic and building one adapter per option took ~0.08 s of every `orkpack plan`.

    For the option types orkpack declares (str, int, float, bool, Path, their Optional forms and List[str]; no
    parser, bounds, choices or path checks), a value of the simplest form converts here to what the adapter returns:
    a str as it is; an int of plain digits by int() (an int default as it is; a float one too); a float of plain decimals by float() (both correctly rounded,
    as pydantic's parser is); a Path by Path() after the checks typer makes with the default flags (stat, readable).
    Anything else (another form, a bad value, a path typer would refuse) goes through typer's own adapter, which
    gives its answer or its error message. Only for the typer version this was checked against
    (tests/test_cli_coercion.py compares both on every option of every command)."""
    try:
        if typer.__version__ != "0.29.2":
            return
        from dataclasses import dataclass
        from typer import _coercion, core

        if core.build_runtime_param is not _coercion.build_runtime_param:
            return
    except (AttributeError, ImportError):
        return
    import re

    full = _coercion.build_runtime_param
    digits, decimal = re.compile(r"-?(?:0|[1-9][0-9]{0,17})"), re.compile(r"-?[0-9]{1,17}(?:\.[0-9]{1,17})?")

    def scalar(kind, value):  # the value, or _NO when typer's adapter must decide
        if type(value) is not str:  # a default: an int or a float of its own type is what the adapter returns
            return value if kind in (int, float) and type(value) is kind else _NO
        if kind is str:
            return value
        if kind is int:
            return int(value) if digits.fullmatch(value) else _NO
        if kind is float:
            return float(value) if decimal.fullmatch(value) else _NO
        if kind is Path:
            if not value or "\0" in value:
                return _NO
            p = Path(value)
            try:
                os.stat(p)
            except OSError:
                return p
            except ValueError:
                return _NO
            return p if os.access(p, os.R_OK) else _NO
        return _NO

    @dataclass(frozen=True)
    class _Plain(_coercion.RuntimeParam):
        kind: object
        many: bool
        descriptor: object

        def _coerce_value(self, value, param, ctx):
            if self.many:
                got = [scalar(self.kind, v) for v in value] if isinstance(value, (list, tuple)) else [_NO]
                if _NO not in got:
                    return got
            elif self.kind is bool and type(value) is bool:
                return value
            else:
                got = scalar(self.kind, value)
                if got is not _NO:
                    return got
            return full(self.descriptor)._coerce_value(value, param=param, ctx=ctx)

    def plain(descriptor):
        a, pi = descriptor.annotation, descriptor.parameter_info
        many = getattr(a, "__origin__", None) is list and getattr(a, "__args__", None) == (str,)
        kind = str if many else a
        simple = (descriptor.file_annotation is None and pi.parser is None and pi.min is None and pi.max is None
                  and not pi.clamp and kind in (str, int, float, bool, Path))
        if simple and kind is Path:
            simple = (not pi.exists and pi.file_okay and pi.dir_okay and not pi.writable and pi.readable
                      and not pi.resolve_path and not pi.allow_dash and pi.path_type is None)
        if not simple:
            return full(descriptor)
        return _Plain(pi, a, kind, many, descriptor)

    core.build_runtime_param = plain


_NO = object()
_plain_coercion()

app = typer.Typer(
    name="orkpack",
    help="Compile LLM checkpoints (safetensors, GGUF) into mixed int8/NF4 .orkpack files for the RK3588 NPU.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@functools.lru_cache(maxsize=None)
def _out():
    """The stdout console (rich is imported only by commands that print tables or progress)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


NF4_MODE_HELP = ("How NF4 blocks are chosen: opt (default): each block's absmax minimizes the squared error, still "
                 "bitsandbytes NF4 (dequantize_4bit reads it); bnb: byte-identical to bitsandbytes' quantize_4bit.")
NF4_FORMAT_HELP = ("NF4 format of host tensors: dq32 (default with --nf4-mode opt): bitsandbytes NF4 at blocksize 32 "
                   "with double-quantized absmax, 4.25 bits a weight; b64: blocksize 64, float32 absmax, 4.5 bits "
                   "(the only format of --nf4-mode bnb). bitsandbytes' dequantize_4bit reads both.")
LEVELS_DEFAULT = (" Given neither level, the default goal plans nf4 / int8 and int5dq / int6dq and keeps the one of less "
                  "predicted KLD that decodes within its 5 %, a size bound every pair (docs/TIERMAP.md 4); given one, "
                  "the other is nf4 or int8.")
HOST_LOW_HELP = ("Encoding of the host tensors the plan puts at its low level (NF4): nf4 (the --nf4-format), "
                 "int5dq or int6dq (5 or 6-bit integers in blocks of 32, double-quantized scale; 5.25 / 6.25 bits). "
                 "The plan counts its bytes and error." + LEVELS_DEFAULT)
HOST_HIGH_HELP = ("Encoding of the host tensors the plan puts at its high level (int8): int8 (per row), int8dq "
                  "or int6dq (8 or 6-bit integers in blocks of 32; 8.25 / 6.25 bits). The plan counts its bytes and error.")
NF4_WEIGHTING_HELP = ("The opt search's error weight per value: plain (default), x2 (the value squared) or sigma "
                      "(sqrt(sigma^2 + x^2), llama.cpp's with an imatrix); times the imatrix column weight if given.")
ROTATE_HELP = ("Rotate the residual stream (QuaRot): fold each norm's gain into the matrices it feeds, then a randomized "
               "Hadamard (or seeded orthogonal) matrix into the embedding and every matrix that reads or writes the stream, "
               "and one per value head into V and O. The float model is unchanged; the runtime is not told. A tied head "
               "is stored as its own matrix (output.weight). Statistics for --imatrix must be gathered on the rotated "
               "model: orkpack imatrix SOURCE --rotate (the same --rotate-seed). docs/EVAL.md, \"Rotation\".")
IMATRIX_HELP = ("Activation statistics (orkpack imatrix SOURCE -o FILE, or llama.cpp's imatrix .gguf/.dat): weigh each "
                "input column's error in the opt NF4 search by its mean square activation; smooth the NPU's int8 "
                "activations (SmoothQuant folded into the weights) and clip int8 rows (docs/EVAL.md).")
BOARDS_HELP = ("Plan across several boards over llama.cpp RPC: a comma-separated list of board names or TOML files "
               "(node 0 is the client), or a cluster TOML file (docs/CLUSTER.md).")
HUB_HELP = ("ORG/NAME downloads a Hugging Face hub model (only config, tokenizer and safetensors files; "
            "ORG/NAME:FILE.gguf one GGUF file) into huggingface_hub's cache, or finds it there offline; an existing "
            "local path always wins (hf://ORG/NAME forces the hub, ./ORG/NAME is always a path).")
REVISION_HELP = ("The hub revision of a model named ORG/NAME: a branch, tag or commit (default main); the pack or "
                 "tier map records the commit it resolved to. HF_TOKEN, HF_HUB_OFFLINE and HF_HUB_CACHE apply.")
NETWORK_HELP = "The link between the boards with --boards: 1gbe (default), 2.5gbe, 10gbe, or a TOML file with a [network] table."


def _cluster_only(boards, *, frontier: bool = False, board_given: bool = False) -> None:
    """--boards / --network: the flags that contradict a cluster plan, refused in one line."""
    if boards is None:
        raise OrkError("--network applies to a plan across boards: add --boards B1,B2,...")
    if frontier:
        raise OrkError("--frontier is for one board; drop it or --boards")
    if board_given:
        raise OrkError("--board and --boards contradict each other: give the boards once, in --boards")


MAX_BYTES_HELP = ("The best pack of this size: the least predicted KLD whose weights take at most BYTES (e.g. 120MB, "
                  "3.5GiB); --bytes-of says which bytes. Without --goal the goal is then quality (decode, then "
                  "prefill, second), and without --host-low / --host-high every pair of host levels is planned.")
BPW_HELP = "As --max-bytes, in bits per weight: X x the model's weight parameters / 8 bytes (e.g. 4.8)."
BYTES_OF_HELP = ("What --max-bytes / --bpw bound: file (the weights the pack holds: NPU tiles, host copies, host "
                 "tensors, floats) or decode (the weight bytes the CPU reads for one decode token).")
MAX_KLD_HELP = "Only plans whose predicted KLD (the sensitivities of the items decode reads as NF4, docs/TIERMAP.md) is at most X."
RUNTIME_HELP = ("The runtime path the plan is for (what the software decides: submit cost, NPU efficiency, CPU rates, "
                "fixed costs, decode engine): ggml-ork (default), llama.cpp-cpu, rkllm, or a TOML file (orkpack calibrate).")
GOAL_HELP = ("balanced (default): decode within 5% of the best this board allows, then prefill within 1% of the "
             "most that allows, then the best quality (least predicted KLD); decode, prefill or quality: that first.")
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000 ** 2, "mb": 1000 ** 2, "mib": 1 << 20,
          "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1000 ** 4, "tb": 1000 ** 4, "tib": 1 << 40}


def frontier_axis(speed: bool, size: bool) -> bool | str:
    """--frontier (speed) or --frontier-size (size), not both."""
    if speed and size:
        raise OrkError("--frontier and --frontier-size are two frontiers; give one")
    return "size" if size else speed


def sized_goal(goal: str, goal_given: bool, max_bytes: str | None, bpw: float | None) -> str:
    """The goal: as given; with a size bound (--max-bytes / --bpw) and no --goal, quality (the best pack of that size)."""
    return goal if goal_given or (max_bytes is None and bpw is None) else "quality"


def parse_bytes(text: str | None, flag: str) -> int | None:
    """'24GiB', '20G', '21474836480' -> bytes (None stays None); OrkError on anything else."""
    if text is None:
        return None
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise OrkError(f"{flag} {text!r}: give a size such as 24GiB, 20G or 21474836480")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _fail_cleanly(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        try:
            return fn(*a, **kw)
        except OrkError as e:
            print(f"error: {e}", file=sys.stderr)
            raise typer.Exit(e.exit_code)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(130)

    return wrapper


def _given(context: typer.Context) -> frozenset:
    """The parameters given on the command line (not left at their defaults)."""
    names = (p.name for p in context.command.params)
    return frozenset(n for n in names if getattr(context.get_parameter_source(n), "name", None) == "COMMANDLINE")


def _numpy_with_one_blas_thread() -> None:
    """Import numpy with OpenBLAS held to one thread, for commands whose numpy work is small (issue 26): numpy's
    OpenBLAS starts a thread per core when it loads, and its idle threads spin for a while, ~0.03 s of CPU time of
    every `orkpack plan` on the 2-core test machine, for a plan whose vectors are a few hundred long (OpenBLAS runs
    products that short on one thread anyway). OPENBLAS_NUM_THREADS is set only for numpy's import, and only when
    the user did not set it; nothing changes once numpy is loaded (a test process, a build that plans)."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def _warn_line(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


warnings.showwarning = _warn_line


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[tensor]}"),
        console=Console(stderr=True, highlight=False),
        disable=not enabled,
        transient=False,
    )


class _BuildBar:
    """The build's bar on stderr, from the moment the source is open (after huggingface_hub's own download bars, which
    a live bar would swallow) until the end."""

    def __init__(self, enabled: bool):
        self.enabled, self.prog, self.task = enabled, None, None

    def open(self) -> None:
        if self.enabled and self.prog is None:
            self.prog = _progress(True)
            self.prog.start()
            self.task = self.prog.add_task("build", total=None, tensor="")

    def start(self, total: int) -> None:
        self.open()
        if self.prog is not None:
            self.prog.update(self.task, total=total)

    def advance(self, n: int, name: str) -> None:
        if self.prog is not None:
            self.prog.update(self.task, advance=n, tensor=name)

    def stop(self) -> None:
        if self.prog is not None:
            self.prog.stop()


class _LazyBar:
    """A progress bar on stderr that appears with the first progress report (so an early error is one line)."""

    def __init__(self, enabled: bool, label: str = "eval"):
        self.enabled, self.label, self.prog, self.task = enabled, label, None, None

    def update(self, done: float, total: float, what: str) -> None:
        if not self.enabled:
            return
        if self.prog is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.prog = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                 TimeRemainingColumn(), TextColumn("{task.fields[what]}"),
                                 console=Console(stderr=True, highlight=False))
            self.prog.start()
            self.task = self.prog.add_task("eval", total=total, what="")
        self.prog.update(self.task, completed=done, total=total, what=what)

    def stop(self) -> None:
        if self.prog is not None:
            self.prog.stop()


def version_callback(value: bool):
    if value:
        print(f"orkpack {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=version_callback, is_eager=True, help="Print the version.")):
    pass


@app.command()
@_fail_cleanly
def build(
    context: typer.Context,
    source: str = typer.Argument(..., metavar="SOURCE", help="An HF folder (config.json + safetensors), a .safetensors file, a .gguf file, "
                                 "or a hub model: " + HUB_HELP),
    output: Path = typer.Option(..., "-o", "--output", help="The .orkpack file to write (atomically)."),
    revision: Optional[str] = typer.Option(None, "--revision", metavar="REV", help=REVISION_HELP),
    int8: List[str] = typer.Option([], "--int8", metavar="GLOB", help="Store matching tensors as int8 (per-channel)."),
    nf4: List[str] = typer.Option([], "--nf4", metavar="GLOB", help="Store matching tensors as NF4."),
    keep: List[str] = typer.Option([], "--keep", metavar="GLOB", help="Keep matching tensors in their source float type."),
    npu: List[str] = typer.Option([], "--npu", metavar="GLOB", help="Place matching tensors on the NPU as int8 tiles."),
    cpu: List[str] = typer.Option([], "--cpu", metavar="GLOB", help="Keep matching tensors off the NPU (host: CPU/GPU)."),
    npu_storage: str = typer.Option("int8", "--npu-storage", help="How NPU tensors are stored: int8 tiles, or nf4 inflated to int8 at load (w4a8)."),
    nf4_mode: str = typer.Option("opt", "--nf4-mode", help=NF4_MODE_HELP),
    nf4_weighting: str = typer.Option("plain", "--nf4-weighting", help=NF4_WEIGHTING_HELP),
    nf4_format: Optional[str] = typer.Option(None, "--nf4-format", help=NF4_FORMAT_HELP + " The plan counts its "
                                             "bytes; with --tiermap the default is the map's format."),
    host_low: Optional[str] = typer.Option(None, "--host-low", help=HOST_LOW_HELP + " With --tiermap: the map's."),
    host_high: Optional[str] = typer.Option(None, "--host-high", help=HOST_HIGH_HELP + " With --tiermap: the map's."),
    imatrix: Optional[Path] = typer.Option(None, "--imatrix", metavar="FILE", help=IMATRIX_HELP),
    board: str = typer.Option("rk3588-32g", "--board", help="Board profile the tier map is solved for (name or TOML file)."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help=RUNTIME_HELP),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Hotness profile (orkpack JSON, imatrix .gguf/.dat, timing CSV). Default: analytic."),
    ctx: int = typer.Option(8192, "--ctx", help="Context length the KV cache must hold."),
    kv_type: str = typer.Option("f16", "--kv-type", help="KV cache type: f16 or q8_0."),
    prefill_m: int = typer.Option(512, "--prefill-m", help="Prefill chunk size M for the analytic hotness."),
    ignore_unknown: bool = typer.Option(False, "--ignore-unknown", help="Go on when the profile names tensors the model lacks."),
    no_plan: bool = typer.Option(False, "--no-plan", help="Place by rules alone (NF4 bulk, int8 head, --npu pins): no tier map."),
    goal: str = typer.Option("balanced", "--goal", help=GOAL_HELP),
    min_decode_tok_s: Optional[float] = typer.Option(None, "--min-decode-tok-s", metavar="X", help="Only plans that decode at least X tokens/s."),
    min_prefill_tok_s: Optional[float] = typer.Option(None, "--min-prefill-tok-s", metavar="X", help="Only plans that prefill at least X tokens/s."),
    max_ram: Optional[str] = typer.Option(None, "--max-ram", metavar="BYTES", help="Use at most this much RAM (e.g. 24GiB)."),
    max_kld: Optional[float] = typer.Option(None, "--max-kld", metavar="X", help=MAX_KLD_HELP),
    max_bytes: Optional[str] = typer.Option(None, "--max-bytes", metavar="BYTES", help=MAX_BYTES_HELP),
    bpw: Optional[float] = typer.Option(None, "--bpw", metavar="X", help=BPW_HELP),
    bytes_of: str = typer.Option("file", "--bytes-of", help=BYTES_OF_HELP),
    prompt: int = typer.Option(512, "--prompt", metavar="N", help="Prompt length the TTFT and decode predictions are for."),
    boards: Optional[str] = typer.Option(None, "--boards", metavar="B1,B2,...", help=BOARDS_HELP + " -o then names a folder: one pack per board and cluster.json."),
    network: Optional[str] = typer.Option(None, "--network", metavar="NAME", help=NETWORK_HELP),
    tiermap: Optional[Path] = typer.Option(None, "--tiermap", metavar="FILE", help="Follow this tier-map JSON (orkpack plan -o FILE, or edited) instead of planning; it must cover every tensor of SOURCE. The planning options (--board, --ctx, --profile, --goal, ...) are refused with it: give them to orkpack plan."),
    no_smooth: bool = typer.Option(False, "--no-smooth", help="With --imatrix: do not smooth."),
    no_clip: bool = typer.Option(False, "--no-clip", help="With --imatrix: do not clip int8 rows (by default each is clamped to the ratio of its max with the least error weighted by the statistics)."),
    no_untie_head: bool = typer.Option(False, "--no-untie-head", help="With --imatrix: keep a tied output head tied (by default, when the head runs on the NPU, the pack stores a smoothed copy output.weight beside the unsmoothed embedding: 28 MB more on a 49k x 576 head)."),
    smooth_alpha: Optional[float] = typer.Option(None, "--smooth-alpha", metavar="X", help="SmoothQuant's alpha (0..1) for every group instead of the one the statistics score best per group."),
    rotate: bool = typer.Option(False, "--rotate", help=ROTATE_HELP),
    rotate_seed: int = typer.Option(0, "--rotate-seed", metavar="N", help="With --rotate: the seed of the rotation's random signs (or random orthogonal matrix); recorded in the pack."),
    no_rotate_heads: bool = typer.Option(False, "--no-rotate-heads", help="With --rotate: the residual stream only (R1), not each value head (R2)."),
    online_hadamard: bool = typer.Option(False, "--online-hadamard", help="Fold a randomized Hadamard R4 (seed --rotate-seed) into every ffn_down; the pack's preamble flag tells the runtime to rotate ffn_down's input online (format 1.9; docs/RUNTIME.md). With or without --rotate."),
    threads: int = typer.Option(0, "--threads", "-t", help="Encoder threads (0: every core this process may run on). The output does not depend on it."),
    allow_nonfinite: bool = typer.Option(False, "--allow-nonfinite", help="Encode NaN/Inf weights as 0 instead of stopping."),
    timestamp: bool = typer.Option(False, "--timestamp", help="Record the build time (UTC, or SOURCE_DATE_EPOCH) as provenance.created; off by default so builds are byte-reproducible."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
):
    """Quantize a checkpoint into one .orkpack file, placed by the tier map (or by rules with --no-plan).

    The tier map (see `orkpack plan`) keeps decode within 5% of the best the
    board allows, then puts the items that save the most prefill time on the NPU
    as int8 tiles (with a host NF4 copy for decode where it pays), then spends
    what is left on int8 quality; --goal and the --min-*/--max-ram constraints
    change that. --npu/--cpu/--int8/--nf4/--keep pin items.

    A hub model is fetched (or found in the cache) by its name:
    orkpack build HuggingFaceTB/SmolLM2-135M-Instruct -o smol.orkpack
    """
    from orkpack.build import BuildOptions, build as run_build
    from orkpack.render import build_summary

    if npu_storage not in ("int8", "nf4"):
        raise OrkError(f"--npu-storage {npu_storage!r}: choose int8 or nf4")
    opts = BuildOptions(
        threads=threads, int8=int8, nf4=nf4, keep=keep, npu=npu, cpu=cpu, npu_storage=npu_storage, allow_nonfinite=allow_nonfinite,
        nf4_mode=nf4_mode, nf4_weighting=nf4_weighting, nf4_format=nf4_format, imatrix=imatrix,
        host_low=host_low, host_high=host_high,
        timestamp=timestamp, plan=not no_plan, board=board, runtime=runtime, profile=profile, ctx=ctx, kv_type=kv_type, prefill_m=prefill_m, ignore_unknown=ignore_unknown,
        tiermap=tiermap, goal=sized_goal(goal, "goal" in _given(context), max_bytes, bpw),
        min_decode_tok_s=min_decode_tok_s, min_prefill_tok_s=min_prefill_tok_s,
        max_ram=parse_bytes(max_ram, "--max-ram"), max_kld=max_kld, max_bytes=parse_bytes(max_bytes, "--max-bytes"),
        bpw=bpw, bytes_of=bytes_of, prompt=prompt, given=_given(context),
        smooth=not no_smooth, smooth_alpha=smooth_alpha, clip=not no_clip, untie_head=not no_untie_head,
        rotate=rotate, rotate_seed=rotate_seed, rotate_heads=not no_rotate_heads, revision=revision,
        online_hadamard=online_hadamard,
    )
    if not rotate and (("rotate_seed" in opts.given and not online_hadamard) or no_rotate_heads):
        raise OrkError("--rotate-seed / --no-rotate-heads without --rotate: add --rotate, or drop them")
    if boards is not None or network is not None:
        from orkpack.build.cluster import build_cluster_command

        _cluster_only(boards, board_given="board" in opts.given)
        raise typer.Exit(build_cluster_command(source, output, opts, boards, network, json_out=json_out,
                                               console=_out(), progress=_progress))
    bar = _BuildBar(not json_out)
    try:
        r = run_build(source, output, opts, on_open=bar.open, on_start=bar.start, on_progress=bar.advance)
    finally:
        bar.stop()
    for line in r.info:
        print(f"info: {line}", file=sys.stderr)
    for w in r.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if json_out:
        print(
            json.dumps(
                {
                    "path": str(r.path),
                    "tensors": r.tensors,
                    "source_bytes": r.source_bytes,
                    "pack_bytes": r.pack_bytes,
                    "seconds": round(r.seconds, 4),
                    "gb_per_s": round(r.gbps, 4),
                    "by_kind": [{"encoding": e, "tier": t, **d} for (e, t), d in sorted(r.by_kind.items())],
                    "worst_sqnr": None if r.worst_sqnr is None else {"slice": r.worst_sqnr[0], "db": r.worst_sqnr[1]},
                    "warnings": r.warnings,
                    "info": r.info,
                    "skipped": r.skipped,
                },
                indent=1,
            )
        )
    else:
        build_summary(_out(), r)


@app.command()
@_fail_cleanly
def inspect(
    pack: Path = typer.Argument(..., help="The .orkpack file."),
    tensor: Optional[str] = typer.Option(None, "--tensor", metavar="GLOB", help="Only tensors whose name matches."),
    json_out: bool = typer.Option(False, "--json", help="Print the facts as JSON (stable keys)."),
    all_rows: bool = typer.Option(False, "--all", help="Show every tensor row (default: the first 60)."),
):
    """Show a pack's header facts, residency per engine and per-tensor rows (a cluster folder or its cluster.json:
    the split per board)."""
    from orkpack.inspect import pack_facts, untrusted_line

    if pack.is_dir() or pack.suffix == ".json":
        from orkpack.build.cluster import inspect_cluster

        raise typer.Exit(inspect_cluster(pack, json_out=json_out, console=_out()))
    from orkpack.render import pack_facts as render

    f = pack_facts(pack, tensor)
    if json_out:
        print(json.dumps(f, indent=1))
    else:
        render(_out(), f, rows_limit=None if (all_rows or tensor) else 60)
    if f["untrusted"]:
        print(f"warning: {untrusted_line(f)}", file=sys.stderr)
        raise typer.Exit(f["exit_code"])


@app.command()
@_fail_cleanly
@without_gc  # its imports too (numpy's, orkpack's: ~40 passes of the collector over young module dicts)
def plan(
    context: typer.Context,
    model: str = typer.Argument(..., metavar="MODEL", help="A config.json, an HF folder, a .safetensors or a .gguf file (headers only: no "
                                "weights are read), or a hub model: " + HUB_HELP),
    revision: Optional[str] = typer.Option(None, "--revision", metavar="REV", help=REVISION_HELP),
    board: str = typer.Option("rk3588-32g", "--board", help="A board profile name (rk3588-32g, rk3588-16g, rk3588-8g) or a TOML file."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help=RUNTIME_HELP),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Hotness profile: orkpack JSON, llama.cpp imatrix (.gguf or .dat), or a timing CSV. Default: analytic."),
    ctx: int = typer.Option(8192, "--ctx", help="Context length the KV cache must hold."),
    kv_type: str = typer.Option("f16", "--kv-type", help="KV cache type: f16 or q8_0."),
    prefill_m: int = typer.Option(512, "--prefill-m", help="Prefill chunk size M for the analytic hotness."),
    npu: List[str] = typer.Option([], "--npu", metavar="GLOB", help="Pin matching items to the NPU (int8)."),
    cpu: List[str] = typer.Option([], "--cpu", metavar="GLOB", help="Pin matching items to the host (CPU/GPU)."),
    int8: List[str] = typer.Option([], "--int8", metavar="GLOB", help="Pin matching items to int8."),
    nf4: List[str] = typer.Option([], "--nf4", metavar="GLOB", help="Pin matching items to NF4."),
    keep: List[str] = typer.Option([], "--keep", metavar="GLOB", help="Keep matching tensors float on the host."),
    ignore_unknown: bool = typer.Option(False, "--ignore-unknown", help="Go on when the profile names tensors the model lacks."),
    goal: str = typer.Option("balanced", "--goal", help=GOAL_HELP),
    min_decode_tok_s: Optional[float] = typer.Option(None, "--min-decode-tok-s", metavar="X", help="Only plans that decode at least X tokens/s."),
    min_prefill_tok_s: Optional[float] = typer.Option(None, "--min-prefill-tok-s", metavar="X", help="Only plans that prefill at least X tokens/s."),
    max_ram: Optional[str] = typer.Option(None, "--max-ram", metavar="BYTES", help="Use at most this much RAM (e.g. 24GiB, 20G, 21474836480)."),
    max_kld: Optional[float] = typer.Option(None, "--max-kld", metavar="X", help=MAX_KLD_HELP),
    max_bytes: Optional[str] = typer.Option(None, "--max-bytes", metavar="BYTES", help=MAX_BYTES_HELP),
    bpw: Optional[float] = typer.Option(None, "--bpw", metavar="X", help=BPW_HELP),
    bytes_of: str = typer.Option("file", "--bytes-of", help=BYTES_OF_HELP),
    prompt: int = typer.Option(512, "--prompt", metavar="N", help="Prompt length the TTFT and decode predictions are for."),
    frontier: bool = typer.Option(False, "--frontier", help="Print the Pareto set of (decode, prefill, quality) plans; with -o DIR, write each as DIR/frontier-K.json."),
    frontier_size: bool = typer.Option(False, "--frontier-size", help="Print the least predicted KLD at each size, from the smallest pack to the best-quality one (weight bytes as --bytes-of says); with -o DIR, write each as DIR/frontier-K.json."),
    boards: Optional[str] = typer.Option(None, "--boards", metavar="B1,B2,...", help=BOARDS_HELP),
    network: Optional[str] = typer.Option(None, "--network", metavar="NAME", help=NETWORK_HELP),
    nf4_format: Optional[str] = typer.Option(None, "--nf4-format", help=NF4_FORMAT_HELP + " The plan counts its bytes and "
                                             "records it; orkpack build --tiermap writes it."),
    host_low: Optional[str] = typer.Option(None, "--host-low", help=HOST_LOW_HELP),
    host_high: Optional[str] = typer.Option(None, "--host-high", help=HOST_HIGH_HELP),
    json_out: bool = typer.Option(False, "--json", help="Print the tier map as JSON."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the tier map JSON here (a folder with --frontier)."),
):
    """Solve the tier map (what goes int8 on the NPU, with or without a host NF4 copy; what stays NF4 or int8
    on the host) and predict decode tok/s, prefill tok/s and TTFT, without converting anything."""
    _numpy_with_one_blas_thread()
    from orkpack.tiers.command import plan_command
    from orkpack.tiers.solver import Goal

    pins = {"npu": npu, "cpu": cpu, "int8": int8, "nf4": nf4, "keep": keep}
    g = Goal(sized_goal(goal, "goal" in _given(context), max_bytes, bpw), min_decode_tok_s, min_prefill_tok_s,
             parse_bytes(max_ram, "--max-ram"), max_kld=max_kld, max_bytes=parse_bytes(max_bytes, "--max-bytes"),
             bpw=bpw, bytes_of=bytes_of)
    if boards is not None or network is not None:
        from orkpack.tiers.cluster import plan_cluster_command

        _cluster_only(boards, frontier=frontier or frontier_size, board_given="board" in _given(context))
        raise typer.Exit(plan_cluster_command(model, boards, network=network, json_out=json_out, output=output,
                                              console=None if json_out else _out(), profile=profile, ctx=ctx,
                                              kv_type=kv_type, prefill_m=prefill_m, pins=pins,
                                              ignore_unknown=ignore_unknown, goal=g, prompt=prompt, runtime=runtime,
                                              nf4_format=nf4_format, revision=revision, host_low=host_low,
                                              host_high=host_high))
    code = plan_command(model, board=board, profile=profile, ctx=ctx, kv_type=kv_type, prefill_m=prefill_m, pins=pins,
                        ignore_unknown=ignore_unknown, json_out=json_out, output=output, console=None if json_out else _out(), goal=g,
                        prompt=prompt, frontier_out=frontier_axis(frontier, frontier_size), runtime=runtime,
                        nf4_format=nf4_format, revision=revision, host_low=host_low, host_high=host_high)
    raise typer.Exit(code)


@app.command()
@_fail_cleanly
def verify(
    packs: List[Path] = typer.Argument(..., help="One or more .orkpack files."),
    device: str = typer.Option("auto", "--device", help="auto (rknpu when its device node exists, else host), host, or rknpu."),
    inflate: str = typer.Option("direct", "--inflate", help="NF4 NPU tensors: direct int4->int8 tiled inflate, or two-step."),
    threads: int = typer.Option(0, "--threads", "-t", help="Load threads (0: all cores)."),
    reference: bool = typer.Option(False, "--reference", help="Also compare every quantized tensor against the numpy reference."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Report every failure, not only the first."),
    source: Optional[str] = typer.Option(None, "--source", metavar="SOURCE", help="With --reference: the checkpoint a rotated pack (build --rotate) was built from (a path, or a hub model ORG/NAME); each rotated tensor is checked against it under the recorded rotation."),
    revision: Optional[str] = typer.Option(None, "--revision", metavar="REV", help="With --source ORG/NAME: its hub revision (branch, tag or commit)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
):
    """Load packs the way the board does and check every byte. Exit 0: passed; 1: a check failed; 2: unusable input."""
    from orkpack.runtime.command import verify_command

    code = verify_command(packs, device=device, inflate=inflate, threads=threads or (os.cpu_count() or 1), reference=reference, keep_going=keep_going, json_out=json_out, console=_out(), source=source, revision=revision)
    raise typer.Exit(code)


@app.command()
@_fail_cleanly
def demo(
    folder: Path = typer.Option(Path("orkpack-demo"), "--dir", help="Where to write the demo model and pack."),
):
    """Synthesize a small seeded llama-style model (no network), build it, inspect it, verify it."""
    from orkpack.build import BuildOptions, build as run_build
    from orkpack.inspect import pack_facts
    from orkpack.render import build_summary, pack_facts as render
    from orkpack.runtime.command import verify_command
    from orkpack.synth import write_hf_model, write_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    model = write_hf_model(folder / "model", seed=0, vocab=512)
    write_tokenizer(model, n_merges=512 - 259)  # a byte-level BPE of the model's 512 tokens: the pack runs alone
    _out().print(f"wrote a seeded llama-style model (bf16, 2 shards, a tokenizer) to {model}")
    # the tier map places the model; ffn_down pinned to NF4 shows both NPU load paths (fill and inflate)
    opts = BuildOptions(nf4=["blk.*.ffn_down.weight"])
    with _progress(True) as prog:
        task = prog.add_task("build", total=None, tensor="")
        r = run_build(model, folder / "demo.orkpack", opts, on_start=lambda t: prog.update(task, total=t), on_progress=lambda n, name: prog.update(task, advance=n, tensor=name))
    build_summary(_out(), r)
    render(_out(), pack_facts(r.path), rows_limit=12)
    code = verify_command([r.path], device="host", inflate="direct", threads=os.cpu_count() or 1, reference=True, keep_going=False, json_out=False, console=_out())
    _out().print(f"next: orkpack inspect {r.path} --all   |   orkpack verify {r.path}   |   orkpack eval {model} {r.path}")
    raise typer.Exit(code)


@app.command()
@_fail_cleanly
def calibrate(
    times: Path = typer.Argument(..., help="Timings measured on your board: a CSV of matmul, prefill, ttft and decode rows (docs/CALIBRATION.md)."),
    output: Path = typer.Option(..., "-o", "--output", help="The runtime TOML to write (atomically); its file name becomes the runtime path's name."),
    board: str = typer.Option("rk3588-32g", "--board", help="The board the timings were measured on (name or TOML file): its hardware is not fitted."),
    runtime: Optional[str] = typer.Option(None, "--runtime", help="The runtime path the unfitted values come from (name or TOML file; default ggml-ork)."),
    json_out: bool = typer.Option(False, "--json", help="Print the fit as JSON."),
):
    """Fit a runtime path's cost-model constants to timings measured on your board and write a runtime TOML for --runtime."""
    from orkpack.tiers.calibrate import calibrate as run_calibrate, report_json, report_text

    f, _ = run_calibrate(times, output, board=board, runtime=runtime)
    print(json.dumps(report_json(f, str(output)), indent=1) if json_out else report_text(f, str(output)))


@app.command(name="eval")
@_fail_cleanly
def eval_(
    models: List[str] = typer.Argument(..., metavar="[SOURCE] PACK", help="PACK: an .orkpack or a (quantized) GGUF; SOURCE (optional, first): the float checkpoint it came from, the reference. Either may be a hub model: " + HUB_HELP),
    revision: Optional[str] = typer.Option(None, "--revision", metavar="REV", help="The hub revision (branch, tag or commit) of SOURCE named ORG/NAME (of PACK without SOURCE)."),
    text: Optional[Path] = typer.Option(None, "--text", metavar="FILE", help="UTF-8 text to score (default: the built-in prose, ~2,300 tokens)."),
    tokens: Optional[Path] = typer.Option(None, "--tokens", metavar="FILE", help="Token ids to score instead of a text (integers separated by spaces)."),
    ctx: int = typer.Option(512, "--ctx", metavar="N", help="Chunk length: each chunk is one sequence, scored on its second half (as llama-perplexity)."),
    chunks: int = typer.Option(0, "--chunks", metavar="N", help="Score only the first N chunks (0: all)."),
    act: str = typer.Option("token", "--act", help="NPU activations quantized to int8 per token (as the public RK3588 llama.cpp backends) or per tensor; float: not quantized (to tell the weights' cost from the activations')."),
    cpu_act: str = typer.Option("float", "--cpu-act", help="CPU activations for int8/NF4 weights: float, or q8 (llama.cpp's Q8_0 blocks)."),
    per_tensor: bool = typer.Option(False, "--per-tensor", help="Rank the items by the KLD each adds alone (its path's numerics, every other matrix float) on a sample, with its matmul output SNR over the run (needs SOURCE)."),
    per_tensor_tokens: int = typer.Option(128, "--per-tensor-tokens", metavar="N", help="The sample of --per-tensor: the first N tokens (one forward pass per item and path)."),
    rows: int = typer.Option(20, "--rows", metavar="N", help="Per-tensor rows shown."),
    sens: bool = typer.Option(False, "--sensitivity", help="Estimate each item's KLD in NF4 rather than int8 from the run's activation statistics, checked against the true single-item KLD on a sample (Spearman); with -o, write it as a hotness profile for orkpack plan --profile (needs SOURCE)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE", help="With --sensitivity: write the hotness profile (JSON) here."),
    threads: int = typer.Option(1, "--threads", "-t", help="BLAS threads (0: all cores). One is fastest on a busy machine: the attention's many small products lose to thread synchronisation."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
):
    """What a pack does to the model's answers: KL divergence, top-1 agreement and perplexity of each path
    (prefill and decode, in the board's numerics) against the source's float model (docs/EVAL.md)."""
    from orkpack.eval.run import Options, evaluate
    from orkpack.eval.sensitivity import write_profile
    from orkpack.render import eval_report

    if len(models) not in (1, 2):
        raise OrkError(f"give PACK, or SOURCE PACK ({len(models)} paths given)")
    source, pack = (None, models[0]) if len(models) == 1 else models
    opts = Options(text=text, tokens=tokens, ctx=ctx, chunks=chunks, act=act, cpu_act=cpu_act, per_tensor=per_tensor,
                   per_tensor_tokens=per_tensor_tokens, threads=threads, sensitivity=sens, revision=revision)
    if output is not None and not sens:
        raise OrkError("-o writes the profile of --sensitivity: add --sensitivity")
    bar = _LazyBar(not json_out)
    try:
        r = evaluate(source, pack, opts, progress=bar.update)
    finally:
        bar.stop()
    if output is not None:
        write_profile(r, output)
    r.pop("_profile", None)
    if json_out:
        print(json.dumps(r, indent=1))
    else:
        eval_report(_out(), r, rows=rows)


@app.command()
@_fail_cleanly
def generate(
    pack: Path = typer.Argument(..., metavar="PACK", help="The .orkpack whose answer to give."),
    prompt: Optional[str] = typer.Option(None, "-p", "--prompt", metavar="TEXT", help="The prompt, tokenized by the pack's own tokenizer (its model record)."),
    tokens: Optional[str] = typer.Option(None, "--tokens", metavar="IDS", help="Token ids instead of a prompt (e.g. '1 520 33'); a pack without a tokenizer answers in ids too."),
    chat: bool = typer.Option(False, "--chat", help="The prompt is a user message: rendered with the pack's chat template (tokenizer.chat_template) and its generation prompt, and the template's end-of-turn token stops the answer."),
    source: Optional[Path] = typer.Option(None, "--source", metavar="SRC", help="The float checkpoint the pack was built from: its answer (same prompt, same sampling) beside the pack's, and the first token where they part."),
    max_tokens: int = typer.Option(64, "-n", "--max-tokens", metavar="N", help="Stop after N tokens (or earlier, at an end-of-generation token)."),
    temp: float = typer.Option(0.0, "--temp", metavar="T", help="0 (default): greedy, the most likely token; above 0: sample at temperature T."),
    top_k: int = typer.Option(0, "--top-k", metavar="K", help="With --temp: sample among the K most likely tokens (0: all)."),
    top_p: float = typer.Option(1.0, "--top-p", metavar="P", help="With --temp: sample among the fewest most likely tokens whose probability reaches P (1: all)."),
    seed: Optional[int] = typer.Option(None, "--seed", metavar="N", help="With --temp: the sampling generator's seed (default 0); the same seed gives the same answer."),
    cpu_act: str = typer.Option("float", "--cpu-act", help="CPU activations for int8/NF4 weights: float, or q8 (llama.cpp's Q8_0 blocks), as orkpack eval."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Run the whole sequence again for every token instead of the KV cache and recurrent states (the same answer, slower: to check the cache, or time it)."),
    threads: int = typer.Option(1, "--threads", "-t", help="BLAS threads (0: all cores)."),
    json_out: bool = typer.Option(False, "--json", help="Print the token ids, their texts, where the answers part and the rates as JSON (nothing streamed)."),
):
    """The pack's answer to a prompt, streamed as it comes, in the board's decode numerics (the weights orkpack eval's
    decode path runs: host copies, host slices, floats; every matmul on the CPU), greedy or seeded sampling; prompt and
    generation tokens per second. Every family orkpack's forward pass runs generates with a KV cache and the
    recurrent families' states (docs/EVAL.md, "Check a pack by its answers")."""
    from orkpack.eval.generate import Options, generate as run_generate
    from orkpack.render import GenerationStream, generation_report

    opts = Options(prompt=prompt, tokens=tokens, chat=chat, max_tokens=max_tokens, temp=temp, top_k=top_k,
                   top_p=top_p, seed=seed, cpu_act=cpu_act, cache=not no_cache, threads=threads)
    stream = None if json_out else GenerationStream(sys.stdout)
    try:
        r = run_generate(pack, opts, source=source, on_token=stream and stream.token, on_answer=stream and stream.answer)
    finally:
        if stream is not None:
            stream.end()
    if json_out:
        print(json.dumps(r, indent=1))
    else:
        generation_report(_out(), r)


@app.command()
@_fail_cleanly
def export(
    pack: Path = typer.Argument(..., metavar="PACK", help="An .orkpack, or a cluster folder (orkpack build --boards -o DIR) or its cluster.json: the node packs as one model."),
    output: Path = typer.Option(..., "-o", "--output", metavar="OUT.gguf", help="The GGUF to write (atomically; never one of the inputs)."),
    path: str = typer.Option("decode", "--path", help="Whose weights: decode (the CPU's: host copies, host slices, NPU int8 images without a copy) or prefill (NPU slices as their int8 images)."),
    dtype: str = typer.Option("f32", "--type", help="The type of the quantized matrices: f32 (exact), f16 or bf16; tensors the pack keeps float are F32."),
    prefill_m: int = typer.Option(512, "--prefill-m", metavar="M", help="With --path prefill: the chunk length; an NPU slice runs on the NPU when its min_m <= M (as orkpack eval --ctx M)."),
    json_out: bool = typer.Option(False, "--json", help="Print a summary as JSON."),
):
    """The pack's weights as one path computes them, dequantized, with its model record, as a GGUF llama.cpp
    runs (llama-perplexity of it gives orkpack eval's perplexity of that path with float activations)."""
    from orkpack.eval.export import export as run_export

    r = run_export(pack, output, path=path, dtype=dtype, m=prefill_m)
    d = {"output": str(r.path), "arch": r.arch, "tensors": r.tensors, "bytes": r.bytes, "kv": r.kv, "path": path,
         "type": dtype, "layout": r.layout, "packs": r.packs, "head_untied": r.head_untied,
         "dropped_keys": r.dropped_keys}
    if json_out:
        print(json.dumps(d, indent=1))
        return
    for k in r.dropped_keys:
        print(f"warning: {k}: a nested array GGUF writers cannot hold; left out", file=sys.stderr)
    laid = "llama.cpp's layout as built" if r.layout == "gguf" else "laid out as llama.cpp's converter lays it out"
    print(f"wrote {r.path}: {r.arch}, {r.tensors} tensors ({r.bytes} bytes of {dtype} and F32 data), {r.kv} keys; "
          f"the {path} path's weights, {laid}" + ("; the head written as output.weight" if r.head_untied else ""))


@app.command()
@_fail_cleanly
def imatrix(
    source: str = typer.Argument(..., metavar="SOURCE", help="The float checkpoint: an HF folder, .safetensors or .gguf, or a hub model: " + HUB_HELP),
    revision: Optional[str] = typer.Option(None, "--revision", metavar="REV", help=REVISION_HELP),
    output: Path = typer.Option(..., "-o", "--output", metavar="FILE", help="The statistics to write (GGUF imatrix, atomically); llama-quantize --imatrix reads it too."),
    text: Optional[Path] = typer.Option(None, "--text", metavar="FILE", help="UTF-8 text to run (default: the built-in prose, ~2,300 tokens). Gather on a text other than the one you score."),
    tokens: Optional[Path] = typer.Option(None, "--tokens", metavar="FILE", help="Token ids to run instead of a text (integers separated by spaces)."),
    ctx: int = typer.Option(512, "--ctx", metavar="N", help="Chunk length: each chunk is one sequence."),
    chunks: int = typer.Option(0, "--chunks", metavar="N", help="Run only the first N chunks (0: all)."),
    threads: int = typer.Option(1, "--threads", "-t", help="BLAS threads (0: all cores)."),
    rotate: bool = typer.Option(False, "--rotate", help="Gather them on the rotated model (build --rotate), for build --rotate --imatrix."),
    rotate_seed: int = typer.Option(0, "--rotate-seed", metavar="N", help="With --rotate: the rotation's seed (the build's)."),
    no_rotate_heads: bool = typer.Option(False, "--no-rotate-heads", help="With --rotate: R1 only (as build --no-rotate-heads)."),
    online_hadamard: bool = typer.Option(False, "--online-hadamard", help="Gather them on the model with R4 folded into ffn_down and its input rotated online (build --online-hadamard; seed --rotate-seed)."),
    json_out: bool = typer.Option(False, "--json", help="Print a summary as JSON."),
):
    """Activation statistics of the float model on a text (llama.cpp's importance matrix, plus each input
    column's largest |x|), for build --imatrix (docs/EVAL.md)."""
    from orkpack.eval.imatrix import gather
    from orkpack.render import imatrix_report

    bar = _LazyBar(not json_out, "imatrix")
    try:
        if not rotate and ((rotate_seed and not online_hadamard) or no_rotate_heads):
            raise OrkError("--rotate-seed / --no-rotate-heads without --rotate: add --rotate, or drop them")
        stats = gather(source, output, revision=revision, text=text, tokens=tokens, ctx=ctx, chunks=chunks, threads=threads,
                       progress=bar.update, rotate=(rotate_seed, not no_rotate_heads) if rotate else None,
                       online=online_hadamard, seed=rotate_seed)
    finally:
        bar.stop()
    r = {"output": str(output), "matrices": len(stats.entries), "chunks": stats.chunk_count,
         "chunk_size": stats.chunk_size, "datasets": stats.datasets}
    if json_out:
        print(json.dumps(r, indent=1))
    else:
        imatrix_report(_out(), r)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
