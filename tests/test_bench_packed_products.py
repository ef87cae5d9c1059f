"""scripts/bench_packed_products.py times each weight shape and row count both ways and says
which shapes oneDNN declined; bad --shapes are refused (tiny sizes: no timing is checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt import onednn

REPO = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(REPO / "scripts" / "bench_packed_products.py")]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SCRIPT, *args], capture_output=True, text=True)


@pytest.mark.skipif(not onednn.available(), reason="this torch carries no oneDNN linear op")
def test_a_row_per_shape_and_row_count_or_a_line_for_those_declined() -> None:
    proc = run("--shapes", "32x16,16x8", "--rows", "1,3", "--rounds", "1", "--calls", "1")
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(
        r"^\| (\d+ x \d+) \| (\d+) \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$", proc.stdout, re.M
    )
    shown = {shape for shape, _ in rows}
    declined = re.search(r"^(\d) shape\(s\) left out", proc.stdout, re.M)
    assert len(shown) + (int(declined.group(1)) if declined else 0) == 2
    assert rows == [(shape, n) for shape in ("32 x 16", "16 x 8") if shape in shown for n in "13"]


@pytest.mark.parametrize("bad", [["--shapes", "32-16"], ["--shapes", "32x0"], ["--rows", "0"]])
def test_bad_shapes_or_rows_are_refused(bad: list[str]) -> None:
    proc = run(*bad)
    assert proc.returncode == 2
    assert "--shapes takes OUTxIN" in proc.stderr
    assert "Traceback" not in proc.stderr
