"""What a user sees while a command runs: the progress bar only where it can redraw its line
(a terminal, or `--progress`), so a redirected stderr holds no carriage-return frames."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from typer.testing import CliRunner

from nmt.cli import app
from nmt.terminal import shows_bar
from tests.conftest import TOY, write_toy_config


def run(*args: str):
    return CliRunner().invoke(app, list(args))


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_on_a_terminal_unless_told(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert shows_bar(None) and shows_bar(True) and not shows_bar(False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # `2> err.txt`
    assert not shows_bar(None) and shows_bar(True)


def test_a_redirected_stderr_gets_no_progress_frames(tmp_path: Path):
    """Train and translate with stderr captured (not a terminal): no carriage return in it
    unless --progress forces the bar; translate still says which decoding options it used."""
    cfg = write_toy_config(
        tmp_path / "c.yaml",
        "num_layers: 1, rnn_size: 8, word_vec_size: 4",
        "max_steps: 4, batch_size: 8, log_every: 2, device: cpu",
    )
    quiet = run("train", "-c", str(cfg), "--out", str(tmp_path / "a"))
    assert quiet.exit_code == 0, quiet.output
    assert "\r" not in quiet.stderr
    assert any(line.startswith("step 4") for line in quiet.stdout.splitlines()), quiet.stdout
    forced = run("train", "-c", str(cfg), "--out", str(tmp_path / "b"), "--progress")
    assert forced.exit_code == 0, forced.output
    assert "\r" in forced.stderr

    translate = ["translate", "-m", str(tmp_path / "a" / "model.pt"), "--src"]
    quiet = run(*translate, str(TOY / "test.src"))
    assert quiet.exit_code == 0, quiet.output
    assert "\r" not in quiet.stderr and "decoding:" in quiet.stderr
    forced = run(*translate, str(TOY / "test.src"), "--progress")
    assert forced.exit_code == 0 and "\r" in forced.stderr
