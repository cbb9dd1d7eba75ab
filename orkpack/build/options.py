"""The build's options, and the checks that refuse contradicting ones before anything is read or written."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OrkError, escape_name
from ..transforms.nf4 import NF4Choice


def available_cpus() -> int:
    """The cores this process may run on (its affinity: ``taskset -c 0`` gives 1, where os.cpu_count() says
    every core of the machine, and two encoder threads would take turns on the one core)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count() or 1


@dataclass
class BuildOptions:
    threads: int = 0  # 0: every core this process may run on (available_cpus)
    int8: list[str] = field(default_factory=list)
    nf4: list[str] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    npu: list[str] = field(default_factory=list)
    cpu: list[str] = field(default_factory=list)
    npu_storage: str = "int8"  # int8 tiles, or nf4 inflated at load (w4a8)
    # NF4 bytes (orkpack/transforms/nf4.py): "opt" error-minimizing absmax, or "bnb" (quantize_4bit's bytes);
    # the opt search's weighting, and the activation statistics (orkpack imatrix, or llama.cpp's) that weigh its
    # columns, smooth the NPU's activations and clip int8 rows
    nf4_mode: str = NF4Choice.mode
    nf4_weighting: str = NF4Choice.weighting
    nf4_format: str | None = None  # dq32 (nf4dq) or b64 (nf4); None: dq32 with opt, b64 with bnb, a --tiermap's own
    # the encodings of the plan's host levels (tiers/board.py HOST_LOW, HOST_HIGH); None: nf4 and int8, a --tiermap's
    host_low: str | None = None
    host_high: str | None = None
    imatrix: Path | None = None
    allow_nonfinite: bool = False
    # placement: the tier-map compiler (default) or the rules alone (plan=False)
    plan: bool = True
    board: str = "rk3588-32g"
    runtime: str | None = None  # the runtime path the plan is for (None: ggml-ork, the default)
    profile: Path | None = None
    ctx: int = 8192
    kv_type: str = "f16"
    prefill_m: int = 512
    ignore_unknown: bool = False
    timestamp: bool = False  # record provenance.created (the only time a header may hold)
    # a tier-map JSON file (orkpack plan -o FILE, or edited by hand) to follow instead of planning;
    # the only source of dual-resident slices (NPU tiles + a host copy)
    tiermap: Path | None = None
    # what the plan optimizes (orkpack.tiers.solver.Goal)
    goal: str = "balanced"
    min_decode_tok_s: float | None = None
    min_prefill_tok_s: float | None = None
    max_ram: int | None = None
    max_kld: float | None = None
    max_bytes: int | None = None  # the best pack of this size (Goal.max_bytes / bpw / bytes_of)
    bpw: float | None = None
    bytes_of: str = "file"
    prompt: int = 512
    # activation smoothing (orkpack/transforms/smooth.py), from the same statistics file (`imatrix` above); on when it is
    # given unless smooth is False; smooth_alpha fixes SmoothQuant's alpha (None: searched per group)
    smooth: bool = True
    smooth_alpha: float | None = None
    clip: bool = True  # with imatrix: clamp int8 rows to their least-error ratio (orkpack/transforms/clip.py)
    # with smoothing, a tied head placed on the NPU is stored as a smoothed untied copy (orkpack/transforms/smooth.py)
    untie_head: bool = True
    # a rotation of the residual stream folded into the weights (orkpack/transforms/rotate.py): R1 (and R2 per value
    # head unless rotate_heads is False), from rotate_seed
    rotate: bool = False
    rotate_seed: int = 0
    rotate_heads: bool = True
    online_hadamard: bool = False  # R4 folded into every ffn_down; the runtime rotates its input online (flag bit 0)
    # the hub revision (branch, tag or commit) of a source named ORG/NAME (orkpack/sources/hub.py); the pack records
    # it with the commit it resolved to in provenance.hub, not among the options
    revision: str | None = None
    # the options the user gave explicitly (the CLI fills it), so that --tiermap can refuse the planning
    # options it would ignore even when they equal their defaults (:func:`refuse_ignored_plan_options`)
    given: frozenset = frozenset()

    def resolved_threads(self) -> int:
        return self.threads if self.threads > 0 else available_cpus()

    def recorded(self) -> dict:
        """The options that shape the bytes (threads do not)."""
        return {
            "int8": list(self.int8),
            "nf4": list(self.nf4),
            "keep": list(self.keep),
            "npu": list(self.npu),
            "cpu": list(self.cpu),
            "npu_storage": self.npu_storage,
            "nf4_mode": self.nf4_mode,
            "allow_nonfinite": self.allow_nonfinite,
            "plan": self.plan,
            "board": self.board,
            "runtime": self.runtime,
            "profile": None if self.profile is None else Path(self.profile).name,
            "ctx": self.ctx,
            "kv_type": self.kv_type,
            "prefill_m": self.prefill_m,
            "goal": self.goal,
            "min_decode_tok_s": self.min_decode_tok_s,
            "min_prefill_tok_s": self.min_prefill_tok_s,
            "max_ram": self.max_ram,
            "prompt": self.prompt,
        } | ({} if self.nf4_mode != "opt" else {"nf4_weighting": self.nf4_weighting,
                                                "nf4_format": self.nf4_format or NF4Choice.format}) \
            | ({} if self.host_low is None else {"host_low": self.host_low}) \
            | ({} if self.host_high is None else {"host_high": self.host_high}) \
            | ({} if self.tiermap is None else {"tiermap": Path(self.tiermap).name}) \
            | ({} if self.imatrix is None else {"imatrix": Path(self.imatrix).name, "smooth": self.smooth,
                                                "smooth_alpha": self.smooth_alpha, "clip": self.clip}
               | ({} if self.untie_head else {"untie_head": False})) \
            | ({} if self.max_kld is None else {"max_kld": self.max_kld}) \
            | ({} if self.max_bytes is None and self.bpw is None else
               {"max_bytes": self.max_bytes, "bpw": self.bpw, "bytes_of": self.bytes_of}) \
            | ({} if not self.online_hadamard else {"online_hadamard": True, "rotate_seed": self.rotate_seed}) \
            | ({} if not self.rotate else {"rotate": True, "rotate_seed": self.rotate_seed,
                                           "rotate_heads": self.rotate_heads})

    def goal_of(self):
        """What the plan optimizes, as the solver takes it."""
        from ..tiers.solver import Goal

        return Goal(self.goal, self.min_decode_tok_s, self.min_prefill_tok_s, self.max_ram, max_kld=self.max_kld,
                    max_bytes=self.max_bytes, bpw=self.bpw, bytes_of=self.bytes_of)

    def pins(self) -> dict[str, list[str]]:
        return {"npu": list(self.npu), "cpu": list(self.cpu), "int8": list(self.int8), "nf4": list(self.nf4), "keep": list(self.keep)}


PLAN_OPTIONS = {"board": "--board", "runtime": "--runtime", "profile": "--profile", "ctx": "--ctx", "kv_type": "--kv-type",
                "prefill_m": "--prefill-m", "ignore_unknown": "--ignore-unknown", "goal": "--goal",
                "min_decode_tok_s": "--min-decode-tok-s", "min_prefill_tok_s": "--min-prefill-tok-s",
                "max_ram": "--max-ram", "max_kld": "--max-kld", "max_bytes": "--max-bytes", "bpw": "--bpw",
                "bytes_of": "--bytes-of", "prompt": "--prompt"}


def refuse_ignored_plan_options(opts: BuildOptions) -> None:
    """With --tiermap (the map is followed as it is) or --no-plan (no plan at all), refuse in one line the
    planning options the build would silently ignore: those given explicitly (``opts.given``) and those
    that differ from their defaults."""
    if opts.tiermap is None and opts.plan:
        return
    default = BuildOptions()
    flags = [flag for f, flag in PLAN_OPTIONS.items() if f in opts.given or getattr(opts, f) != getattr(default, f)]
    if not flags:
        return
    it, these = ("it", "this option") if len(flags) == 1 else ("them", "these options")
    if opts.tiermap is not None:
        head, why, alt = "--tiermap", "a given tier map is followed as it is", f"plan with {it} (orkpack plan SOURCE ... -o FILE)"
    else:
        head, why, alt = "--no-plan", "no tier map is solved", "drop --no-plan"
    raise OrkError(f"{head} with {', '.join(flags)}: {why}, so {these} would be ignored; drop {it}, or {alt}")


def check(opts: BuildOptions, out_path: Path) -> None:
    """OrkError (one line) for options that contradict each other, or an output folder that does not exist."""
    if opts.tiermap is not None and not opts.plan:
        raise OrkError("--tiermap and --no-plan contradict each other: a tier map places every item; drop one")
    if opts.tiermap is not None and any(opts.pins().values()):
        raise OrkError("--tiermap with --npu/--cpu/--int8/--nf4/--keep: pins shape a plan, and a given tier map is "
                       "followed as it is; re-plan with the pins (orkpack plan ... -o FILE) or edit the map")
    refuse_ignored_plan_options(opts)
    if not out_path.parent.is_dir():
        raise OrkError(f"{escape_name(str(out_path.parent))}: output folder does not exist; create it first")
