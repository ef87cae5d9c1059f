"""scripts/bench_wide_linear.py times one product against each block size and says whether
each gave the one product's logits (tiny sizes: no timing is checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_one_product_against_each_block_size() -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "bench_wide_linear.py")]
    tiny = ["--vocab", "300", "--hidden", "16", "--rows", "3,20", "--blocks", "64,128"]
    proc = subprocess.run(
        [*cmd, *tiny, "--rounds", "1", "--calls", "1", "--threads", "1"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "V 300 x H 16, float32, 1 thread(s)" in proc.stdout
    assert "| rows | one product GFLOP/s | blocks of 64 | blocks of 128 |" in proc.stdout
    cell = r" \d+ \([\d.]+x, (?:bitwise|not bitwise)\) \|"
    rows = re.findall(rf"^\| (\d+) \| \d+ \|{cell}{cell}$", proc.stdout, re.M)
    assert rows == ["3", "20"]
