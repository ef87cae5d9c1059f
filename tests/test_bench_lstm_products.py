"""scripts/bench_lstm_products.py times both forms of each batchable product (tiny sizes: no
timing is checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_product_in_both_forms() -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "bench_lstm_products.py")]
    tiny = ["--rnn", "8", "--input", "6", "--batch", "3", "--positions", "4", "--repeats", "1"]
    proc = subprocess.run([*cmd, *tiny, "--threads", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("4 positions x 3 rows, input 6, gates 32, 1 thread(s), cpu")
    rows = re.findall(r"^\| ([^|]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|$", proc.stdout, re.M)
    names = [name for name, *_ in rows]
    assert names == ["input product (forward)", "input's gradient", "weight gradient"]
    for _, apart, together, ratio in rows:
        assert float(apart) >= 0 and float(together) >= 0  # tiny: may round to 0.00 ms
        assert float(ratio) > 0
