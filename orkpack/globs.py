"""Tensor-name globs (--npu, --int8, ...): one matching rule and one warning for all commands."""
from __future__ import annotations

import fnmatch
import functools
import re
from difflib import get_close_matches

from orkpack.errors import escape_name


def matches(name: str, glob: str) -> bool:
    """fnmatch, except that an exact name always matches itself ("x[3]" is literal too)."""
    return name == glob or fnmatch.fnmatchcase(name, glob)


def matches_any(name: str, globs: tuple[str, ...]) -> bool:
    """Whether ``name`` :func:`matches` one of ``globs`` (a tuple, asked again and again: the planner's always-float
    rows over every tensor of a model), by one regular expression for all of them: the alternation of what
    fnmatch makes of each, which matches a name exactly when one of them does (issue 26)."""
    exact, rx = _any_of(globs)
    return name in exact or (rx is not None and rx(name) is not None)


@functools.lru_cache(maxsize=None)
def _any_of(globs: tuple[str, ...]):
    return frozenset(globs), re.compile("|".join(map(fnmatch.translate, globs))).match if globs else None


def no_match_warning(flag: str, glob: str, names: list[str]) -> str:
    """The line for a glob that matches no tensor, with up to three near names."""
    near = get_close_matches(glob, names, n=3, cutoff=0.5)
    if not near:
        stem = glob.strip("*").split(".")
        key = max(stem, key=len) if stem else ""
        near = sorted({n for n in names if key and key in n})[:3]
    hint = f"; near: {', '.join(escape_name(n) for n in near)}" if near else ""
    return f"--{flag} {escape_name(glob)!r} matches no tensor{hint}"
