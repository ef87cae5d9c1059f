"""scripts/count_step_ops.py counts one trainer step on meta with a device's kernel forms: on
cuda's, the fused cell kernels appear (one op each per cell step) and the step takes fewer
ops than with the CPU's forms."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _count(device: str) -> tuple[int, str]:
    script = REPO / "scripts" / "count_step_ops.py"
    tiny = ["--rnn", "8", "--vocab", "40", "--batch", "3", "--length", "4", "--top", "40"]
    proc = subprocess.run(
        [sys.executable, str(script), "--kernels-of", device, *tiny],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"kernels of (\w+): ([\d,]+) ops, 0 host syncs a step", proc.stdout)
    assert found and found.group(1) == device, proc.stdout
    return int(found.group(2).replace(",", "")), proc.stdout


def test_the_cuda_forms_take_fewer_ops_than_the_cpus() -> None:
    cuda, cuda_out = _count("cuda")
    cpu, cpu_out = _count("cpu")
    cell_steps = 2 * ((4 + 2) + (4 + 1))  # layers x (source + target positions)
    assert re.search(rf"aten\._thnn_fused_lstm_cell +{cell_steps}$", cuda_out, re.M)
    assert "_thnn_fused" not in cpu_out
    assert cpu - cuda >= 10 * cell_steps
