"""scripts/bench_checkouts.py: two checkouts' searches in one process (here the same one
twice, so that their outputs must agree), each loaded first once; a bad checkout is refused
in one line. No timing is checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_checkouts.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), "--threads", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_one_checkout_against_itself_prints_a_row_per_batch_size(toy_model, toy_test):
    src, _ = toy_test
    proc = bench(
        *("--checkouts", f"{REPO},{REPO}", "--model", str(toy_model), "--src", str(src)),
        *("--lines", "6", "--batch-sizes", "3,1", "--rounds", "2", "--length", "5"),
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split("|")[1].strip() for row in rows] == ["3", "1"]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert all(float(c) > 0 for c in cells[1:6]) and cells[6] == "yes"


def test_a_directory_without_nmt_is_refused_in_one_line(tmp_path, toy_model):
    proc = bench("--checkouts", f"{REPO},{tmp_path}", "--model", str(toy_model))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"--checkouts: {tmp_path} holds no nmt/translate"
