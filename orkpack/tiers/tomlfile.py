"""Reading the planner's TOML files (boards, runtime paths, networks): one place for their bad-input lines."""
from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Callable

from ..errors import OrkError, escape_name
from ..files import exists, is_file


def read_toml(p: Path, where: str, kind: str) -> dict:
    """The parsed TOML file ``p`` (named ``where`` in messages), or one OrkError line about the ``kind`` file."""
    try:
        return tomllib.loads(Path(p).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OrkError(f"{where}: {kind} file not found; give a path to a .toml {kind} file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise OrkError(f"{where}: cannot read the {kind} file ({e.__class__.__name__})") from None
    except tomllib.TOMLDecodeError as e:
        raise OrkError(f"{where}: not valid TOML ({e}); fix the {kind} file") from None


def read_shipped(name_or_path: str | Path, kind: str, directory: Path, names: Callable[[], list[str]],
                 folder: str) -> tuple[dict, str]:
    """(parsed TOML, the name to report) of a shipped ``kind`` by name (``directory/NAME.toml``) or a TOML path."""
    s = str(name_or_path)
    p = Path(s)
    if not (s.endswith(".toml") or exists(p)):
        p = directory / f"{s}.toml"
        if not is_file(p):
            raise OrkError(f"unknown {kind} {escape_name(s)!r}; shipped {kind}s: {', '.join(names())}, "
                           f"or give a .toml file (see {folder})")
        return read_toml(p, s, kind), s
    where = escape_name(str(p))
    return read_toml(p, where, kind), where
