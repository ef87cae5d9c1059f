"""Every command's --help reads at a terminal's 80 columns: nothing cut with "…", no Python
type names, paragraphs wrapped as paragraphs (no line broken before it had to be), each line
within the width; `-h` as `--help`, `--version`, and no shell completion offered."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import nmt
from nmt.cli import app

COMMANDS = [[], ["train"], ["config"], ["translate"], ["average"], ["memreport"]]
PYTHON_TYPE = re.compile(r"<(list|path|int|float|str|bool|text|dict|tuple)\b|\blist\[|Path\]")


def help_text(args: list[str], flag: str = "--help", columns: int = 80) -> str:
    result = CliRunner().invoke(app, [*args, flag], env={"COLUMNS": str(columns)}, prog_name="nmt")
    assert result.exit_code == 0, result.output
    return result.stdout


def text_start(line: str) -> int | None:
    """Where the wrapped text of `line` begins: an option row's text column (after its names
    and two spaces or more), a paragraph's indent; None for names alone or a heading."""
    body = line.lstrip()
    indent = len(line) - len(body)
    if not body or body.endswith(":") and indent == 0:
        return None
    if body.startswith("-") or (indent == 2 and re.match(r"[A-Z\[][A-Z.\[\]]*\s", body)):
        gap = re.search(r"\S\s{2,}(?=\S)", line[indent:])  # names, then the text column
        return indent + gap.end() if gap else None
    if indent == 2 and re.match(r"[a-z]+\s{2,}", body):  # a command in the list
        return indent + re.match(r"[a-z]+\s{2,}", body).end()
    return indent


def hard_breaks(text: str, width: int) -> list[str]:
    """Lines broken before they had to be: the next line continues the same text (it starts
    at this line's text column) and its first word would have fit on this line."""
    lines, found = text.splitlines(), []
    for line, following in zip(lines, lines[1:], strict=False):
        start = text_start(line)
        body = following.lstrip()
        if start is None or not body or len(following) - len(body) != start:
            continue
        if body.startswith("-") and start <= 2:  # the next option
            continue
        word = re.match(r"\[[^\]]*\]|\S+", body).group()  # `[default: 32]` is one
        if len(line.rstrip()) + 1 + len(word) <= width:
            found.append(f"{line.rstrip()!r} / {word!r}")
    return found


def test_the_check_finds_a_hard_break_and_a_cut():
    broken = "  Train a model; checkpoints go to OUT/last.pt (the latest) and\n  OUT/model.pt\n"
    assert hard_breaks(broken, 80) == [
        "'  Train a model; checkpoints go to OUT/last.pt (the latest) and' / 'OUT/model.pt'"
    ]
    row = "  --beam-size N".ljust(24) + "Beam size, 1 = greedy\n" + " " * 24 + "(default: 5).\n"
    assert len(hard_breaks(row, 80)) == 1
    assert PYTHON_TYPE.search("  CHECKPOINTS...  <list[Path]>  Checkpoints")
    assert not PYTHON_TYPE.search("  --min-length N  Shortest output (</s> held back), <unk>")


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(["nmt", *a]))
def test_help_reads_at_80_columns(args):
    text = help_text(args)
    assert "…" not in text
    assert not re.search(r"\[default:\s*$", text, re.MULTILINE)  # a default on one line
    assert not PYTHON_TYPE.search(text), PYTHON_TYPE.search(text)
    assert max(map(len, text.splitlines())) <= 80
    assert hard_breaks(text, 80) == []
    assert text.startswith(f"Usage: nmt {' '.join(args)}".rstrip() + " [OPTIONS]")
    assert help_text(args, "-h") == text


@pytest.mark.parametrize("args", [["translate"], ["train"], ["memreport"]], ids=" ".join)
def test_options_are_grouped_and_defaults_shown(args):
    text = help_text(args)
    headings = [line for line in text.splitlines() if re.fullmatch(r"[A-Z][a-z ]+:", line)]
    assert len(headings) >= 3, headings
    if args == ["translate"]:
        assert {"Input:", "Decoding:", "Output:"} <= set(headings)
        assert re.search(r"--batch-size N\s+Sentences per batch\. \[default: 32\]", text)
        assert re.search(r"--device TEXT\s+auto, cpu, cuda or cuda:N\. \[default: auto\]", text)


def test_a_wide_terminal_is_used_up_to_100_columns():
    wide = help_text(["translate"], columns=200)
    assert 90 < max(map(len, wide.splitlines())) <= 100
    assert len(wide.splitlines()) < len(help_text(["translate"]).splitlines())


def test_version_and_no_completion():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith(f"nmt {nmt.__version__} (torch ")
    assert "completion" not in help_text([])
    result = CliRunner().invoke(app, ["--install-completion"], prog_name="nmt")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: No such option: --install-completion (see 'nmt --help')"
    ]
