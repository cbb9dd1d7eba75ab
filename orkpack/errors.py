"""The project's one error type.

Anything the user can cause (a bad path, a damaged file, an option that makes
no sense) is raised as :class:`OrkError` with one line that names the file or
tensor and says what to do. The CLI prints that line and exits with code 2
(``verify`` uses 1 for a failed check). Any other exception is a bug.
"""
from __future__ import annotations


class OrkError(Exception):
    """A user-facing error: one clear line, exit code 2."""

    exit_code = 2


class PackError(OrkError):
    """A file is not a usable pack (not a pack, truncated, newer version, damaged)."""


class SourceError(OrkError):
    """A checkpoint cannot be read (missing, truncated, unsupported dtype, ...)."""


class CheckFailed(OrkError):
    """A verification check failed (exit code 1)."""

    exit_code = 1


def escape_name(name: str, limit: int = 200) -> str:
    """Show a tensor or file name safely: control and odd characters escaped, long names cut."""
    out = name.encode("unicode_escape").decode("ascii")
    if len(out) > limit:
        out = out[: limit - 3] + "..."
    return out
