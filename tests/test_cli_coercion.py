"""orkpack.cli coerces plain option values without pydantic (issue 26); every value must come out as typer's own
pydantic adapter gives it, or with its error. Checked on every option of every command, with values of the plain
forms and of the forms left to typer (signs, exponents, spaces, underscores, leading zeros, junk, empty), paths
that exist, do not, and cannot be read."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer
from typer import _coercion, core
from typer._click.exceptions import BadParameter

from orkpack import cli

VALUES = ["0", "7", "-3", "8192", "08", "+5", " 12", "1_000", "1.5", "-0.25", "2.", ".5", "1e3", "1E-2", "inf", "nan",
          "abc", "", "24GiB", "blk.*.ffn_*", "näme[3]", "123456789012345678901234"]


def _params():
    cmd = typer.main.get_command(cli.app)
    for name, sub in sorted(cmd.commands.items()):
        for p in sub.params:
            if isinstance(p, core._TyperParameter):
                yield name, p


def _outcome(rp, value, param):
    try:
        got = rp.coerce(value, param=param, ctx=None)
        return ("ok", type(got), got if not isinstance(got, float) or got == got else "nan")
    except BadParameter as e:
        return ("error", e.format_message())


def test_plain_coercion_is_installed():
    assert typer.__version__ == "0.29.2", "check _plain_coercion against this typer version, then update the test"
    assert core.build_runtime_param is not _coercion.build_runtime_param


def test_plain_coercion_gives_typers_values(tmp_path):
    unreadable = tmp_path / "secret.json"
    unreadable.write_text("{}")
    unreadable.chmod(0)
    paths = [str(tmp_path), str(tmp_path / "none.json"), str(Path(__file__)), "rel/a//b/", str(unreadable)]
    seen = 0
    for command, param in _params():
        plain = core.build_runtime_param(param.type_descriptor)
        full = _coercion.build_runtime_param(param.type_descriptor)
        values = VALUES + paths
        many = param.multiple or param.nargs == -1
        cases = [tuple(values[:3]), tuple(values), (), tuple(paths)] if many else values + [param.default]
        for v in cases:
            if os.geteuid() == 0 and v == str(unreadable):
                continue  # root reads anything: typer would accept it too, nothing to compare
            assert _outcome(plain, v, param) == _outcome(full, v, param), (command, param.name, v)
            seen += 1
    assert seen > 500
    # and the plain path did take most of them (else the speed-up is gone)
    assert sum(isinstance(core.build_runtime_param(p.type_descriptor), _coercion.AdapterRuntimeParam)
               for _, p in _params()) < 5
