"""The `nmt` entry point: a Ctrl-C while the command line loads is one line and exit 130."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from nmt import launch

REPO = Path(__file__).resolve().parents[1]


def test_the_nmt_command_is_the_launcher() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    scripts = pyproject.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.findall(r'^nmt = "(.+)"$', scripts, re.MULTILINE) == ["nmt.launch:main"]


class _InterruptedImport(types.ModuleType):
    """A module whose names raise KeyboardInterrupt, as a Ctrl-C during its import would."""

    def __getattr__(self, name: str):
        raise KeyboardInterrupt


def test_ctrl_c_while_the_command_line_loads_is_one_line_and_130(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "nmt.cli", _InterruptedImport("nmt.cli"))
    with pytest.raises(SystemExit) as exit_:
        try:
            launch.main()
        except KeyboardInterrupt:  # let through, it would stop the whole test session
            pytest.fail("the Ctrl-C came through as a KeyboardInterrupt")
    assert exit_.value.code == 130
    captured = capsys.readouterr()
    assert captured.err == "interrupted\n" and captured.out == ""


def test_the_launcher_runs_the_command_line(monkeypatch) -> None:
    ran: list[bool] = []
    cli = types.ModuleType("nmt.cli")
    cli.main = lambda: ran.append(True)
    monkeypatch.setitem(sys.modules, "nmt.cli", cli)
    launch.main()
    assert ran == [True]
