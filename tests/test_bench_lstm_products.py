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
        a, t, r = float(apart), float(together), float(ratio)
        assert r > 0
        if t > 0.005:  # the ratio is of the unrounded times: within the 0.005 ms rounding
            assert max(a - 0.005, 0) / (t + 0.005) - 0.005 <= r <= (a + 0.005) / (t - 0.005) + 0.005
