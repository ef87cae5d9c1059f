"""scripts/bench_op_dispatch.py prints both forms' cost per call (tiny: no timing is checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_both_forms_are_timed() -> None:
    script = REPO / "scripts" / "bench_op_dispatch.py"
    tiny = ["--rows", "2", "--cols", "3", "--calls", "3", "--repeat", "1"]
    proc = subprocess.run([sys.executable, str(script), *tiny], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^python function: [\d.]+$", proc.stdout, re.M)
    assert re.search(r"^custom_op: [\d.]+$", proc.stdout, re.M)
