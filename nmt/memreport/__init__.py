"""`nmt memreport`: what one training step holds in memory, per preallocation policy.

measure.py   accounting per row and phase on the meta device (clones: the engine's
             inventory; autograd: the storage tracker with saved-tensor hooks; validation)
tracker.py   the storage tracker: live bytes, their peak, what was live then
translation.py  beam search's peak, replayed on meta (--translate)
live.py      one real step per policy on cpu / cuda, checked against the accounting
budget.py    sizes like 16GiB; the largest batch / target length that fits a budget
plan.py      the frontier of plans (policies, partial recompute, micro-batches) and auto's choice
flops.py     a step's FLOPs and what recomputing clones adds to them
report.py    assembling the numbers; the JSON schema
text.py      the plain-text tables
plot.py      the PNG (matplotlib, optional)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from nmt import policies
from nmt.config import Config
from nmt.errors import NmtError
from nmt.memreport.budget import parse_size
from nmt.memreport.report import Report, build_report, to_json
from nmt.memreport.text import render
from nmt.memreport.translation import Translation

__all__ = ["Report", "build_report", "parse_size", "render", "run", "to_json"]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(
    cfg: Config,
    config_path: str = "",
    *,
    device: str = "auto",
    json_path: Path | None = None,
    plot_path: Path | None = None,
    budget: str | None = None,
    detail: str = policies.DEFAULT,
    top: int = 15,
    translate: str | None = None,
    compare: tuple[str, ...] = (),
    quiet: bool = False,
) -> Report:
    """Build the report, print it, and write the JSON / PNG asked for. Progress goes to
    stderr, the report to stdout."""
    budget_bytes = parse_size(budget) if budget is not None else None
    translation = Translation.parse(translate) if translate is not None else None
    if plot_path is not None:
        from nmt.plotting import require_matplotlib

        require_matplotlib("--plot")
    report = build_report(
        cfg,
        config_path,
        device=device,
        budget=budget_bytes,
        detail=detail,
        top=top,
        lengths=plot_path is not None,
        translation=translation,
        compare=compare,
        log=(lambda _: None) if quiet else _log,
    )
    print(render(report), flush=True)
    data = to_json(report)
    if json_path is not None:
        _write_json(json_path, data)
    if plot_path is not None:
        from nmt.memreport.plot import write_plot

        write_plot(report, data, plot_path)
    return report


def _write_json(path: Path, data: dict) -> None:
    """Written atomically: a temporary file next to it, renamed when complete."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise NmtError(f"--json {path}: cannot write ({exc.strerror or exc})") from None
