"""scripts/bench_output_layer.py times every product form of a search step's output layer by
rows and names the form the rule picks (tiny sizes: no timing is checked)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

from nmt.translate.output_layer import FORMS, RULES

REPO = Path(__file__).resolve().parents[1]


def test_every_form_by_rows_with_the_rules_choice() -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "bench_output_layer.py")]
    tiny = ["--vocab", "300", "--hidden", "16", "--rows", "1,5,20,70", "--rounds", "1"]
    tiny += ["--vendor", "AuthenticAMD"]  # the rule of several forms, whatever this CPU
    proc = subprocess.run(
        [*cmd, *tiny, "--repeats", "1", "--threads", "1"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "V = 300, H = 16" in proc.stdout
    header = re.search(r"^\| rows \| (.+) \| chosen \|$", proc.stdout, re.M)
    assert header is not None and header.group(1).split(" | ") == list(FORMS)
    rows = re.findall(r"^\| (\d+) \| (.+) \| ([^|]+) \|$", proc.stdout, re.M)
    assert [int(n) for n, _, _ in rows] == [1, 5, 20, 70]
    for n, cells, chosen in rows:
        times = re.findall(r"([\d.]+) \(([\d.]+)x\)", cells)
        assert len(times) == len(FORMS) and times[0][1] == "1.00"  # the base form's own ratio
        assert chosen == RULES["AuthenticAMD"].form(torch.zeros(int(n), 16))
    assert "chosen: the rule for AuthenticAMD" in proc.stdout


def test_int8_is_the_last_form() -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "bench_output_layer.py"), "--int8"]
    tiny = ["--vocab", "300", "--hidden", "16", "--rows", "5", "--rounds", "1", "--repeats", "1"]
    proc = subprocess.run([*cmd, *tiny, "--threads", "1"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    header = re.search(r"^\| rows \| (.+) \| chosen \|$", proc.stdout, re.M)
    assert header is not None and header.group(1).split(" | ") == [*FORMS, "int8 (--quantize int8)"]
    row = re.search(r"^\| 5 \| (.+) \| [^|]+ \|$", proc.stdout, re.M)
    assert (
        row is not None and len(re.findall(r"[\d.]+ \([\d.]+x\)", row.group(1))) == len(FORMS) + 1
    )
