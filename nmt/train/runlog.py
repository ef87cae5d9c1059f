"""What a run leaves beside its checkpoints: `train.log` (the log lines) and `metrics.jsonl`
(one JSON object per progress point and per validation), so that a run can be read or
plotted afterwards (`scripts/plot_training.py RUN_DIR`). Resumed runs append."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class RunLog:
    """Tees log lines into `DIR/train.log` and appends metric records to `DIR/metrics.jsonl`."""

    def __init__(self, out_dir: Path | None, echo: Callable[[str], None]):
        self.out_dir, self.echo = out_dir, echo

    def __call__(self, message: str) -> None:
        self.echo(message)
        self._append("train.log", message)

    def record(self, message: str) -> None:
        """Into `train.log` only (a line the progress bar already shows)."""
        self._append("train.log", message)

    def metrics(self, **record: Any) -> None:
        self._append("metrics.jsonl", json.dumps(record, sort_keys=True))

    def _append(self, name: str, line: str) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / name, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`; for a resumed run, a step logged twice keeps
    its last record."""
    path = Path(run_dir) / "metrics.jsonl"
    records: dict[tuple[str, int], dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rec = json.loads(line)
                records[(rec["kind"], rec["step"])] = rec
    return sorted(records.values(), key=lambda r: (r["step"], r["kind"]))
