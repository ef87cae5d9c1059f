"""memreport's bottom line comes first: for the config given, its plan, its peak and the phase
of the peak, what `none` and `recompute` would cost, whether it fits; then a glossary line; the
seed's arithmetic only for a config on the seed's graph or with `--detail seed`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nmt.cli import app
from nmt.config import load_config
from nmt.memreport.report import build_report
from nmt.memreport.text import GLOSSARY, mib, render
from tests.test_memreport import TINY

SEED_SECTION = "the seed's arithmetic (seq2seq-attn PR #45"


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bottom") / "tiny.yaml"
    path.write_text(TINY, encoding="utf-8")
    return path


def report_text(path: Path, sets: list[str] = (), **kwargs) -> tuple[object, str]:
    cfg = load_config(path, list(sets), require_data=False)
    report = build_report(cfg, str(path), device="meta", **kwargs)
    return report, render(report)


def paragraph(text: str) -> str:
    """The bottom line: the paragraph after the header's blank line, joined."""
    blocks = text.split("\n\n")
    assert blocks[1].startswith("bottom line: "), blocks[1]
    return " ".join(blocks[1].split())


def test_the_bottom_line_comes_first_with_the_configs_numbers(tiny_path: Path):
    report, text = report_text(tiny_path)
    frontier = report.frontiers[min(report.frontiers)]
    mine, none, recompute = (frontier.policy(p) for p in ("all", "none", "recompute"))
    line = paragraph(text)
    assert line.startswith(
        f"bottom line: train.prealloc all: a run of this config peaks at "
        f"{mib(mine.peak_bytes)} MiB, in "
    )
    assert f"none would peak at {mib(none.peak_bytes)} MiB" in line
    assert f"recompute at {mib(recompute.peak_bytes)} MiB" in line
    assert f"{recompute.extra_flops:+.1%} FLOPs a step" in line
    assert " It fits " in line or " It does NOT fit " in line
    blocks = text.split("\n\n")
    assert " ".join(blocks[2].split()) == GLOSSARY  # the terms before the first table
    assert blocks[3].startswith("one training step at maximum lengths")
    assert SEED_SECTION in text  # TINY is on the seed's graph (nngraph)


def test_the_seed_arithmetic_only_on_the_seed_graph_or_asked(tiny_path: Path):
    fused = ["model.granularity=fused"]
    _, text = report_text(tiny_path, fused)
    assert SEED_SECTION not in text
    report, text = report_text(tiny_path, fused, detail="seed")
    assert SEED_SECTION in text and report.detail_policy == "all"
    assert "largest buffers, policy all" in text


def test_whether_it_fits_a_budget(tiny_path: Path):
    report, text = report_text(tiny_path, budget=2**34)
    assert "It fits --budget 16.00 GiB" in paragraph(text)
    frontier = report.frontiers[min(report.frontiers)]
    recompute = frontier.policy("recompute").peak_bytes
    between = 64 * 2**20 + (recompute + frontier.policy("all").peak_bytes) // 2
    _, text = report_text(tiny_path, budget=between)  # recompute fits, all does not
    line = paragraph(text)
    assert "It does NOT fit --budget" in line and "recompute would fit" in line


def test_a_partial_recompute_and_auto_are_named(tiny_path: Path):
    _, text = report_text(tiny_path, ["train.recompute_encoder=2"])
    assert paragraph(text).startswith(
        "bottom line: train.prealloc all + recompute 2 of 6 encoder and 0 of 6 decoder clones: "
    )
    auto = ["train.prealloc=auto", "train.memory_budget=1GiB"]
    _, text = report_text(tiny_path, auto)
    assert paragraph(text).startswith("bottom line: train.prealloc auto chooses its plan as")
    _, text = report_text(tiny_path, auto, budget=2**30)
    assert paragraph(text).startswith("bottom line: train.prealloc auto, under --budget 1.00 GiB")


def test_the_command_prints_it_and_refuses_an_unknown_detail(tiny_path: Path):
    result = CliRunner().invoke(app, ["memreport", "-c", str(tiny_path), "--device", "meta"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\n\n")[1].startswith("bottom line: ")
    result = CliRunner().invoke(app, ["memreport", "-c", str(tiny_path), "--detail", "sed"])
    assert result.exit_code == 2 and "seed" in result.stderr
