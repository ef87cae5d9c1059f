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

from nmt import atomic, policies
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
    _check_outputs(config_path, json_path, plot_path)
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


def _check_outputs(config_path: str, json_path: Path | None, plot_path: Path | None) -> None:
    """Refuse, before any accounting work, an output that is a directory, that would write
    over the config or the other output, that cannot be written where it is asked for, or a
    plot that is not a .png file."""
    written: dict[str, Path] = {"the config": Path(config_path)} if config_path else {}
    for flag, path in (("--json", json_path), ("--plot", plot_path)):
        if path is None:
            continue
        if path.is_dir():
            suffix = "json" if flag == "--json" else "png"
            raise NmtError(
                f"{flag} {path}: is a directory; give a file name, e.g. "
                f"{path / f'memreport.{suffix}'}"
            )
        if flag == "--plot" and path.suffix.lower() != ".png":
            raise NmtError(f"--plot {path}: the plot is a PNG; give a file name ending in .png")
        for other, given in written.items():
            if atomic.same_file(path, given):
                raise NmtError(f"{flag} {path}: is {other}; it would be written over")
        if (file := atomic.file_in_the_way(path)) is not None:
            raise NmtError(f"{flag} {path}: {file} is a file, not a directory")
        folder = next(p for p in path.parents if p.exists())
        if not os.access(folder, os.W_OK | os.X_OK):
            raise NmtError(f"{flag} {path}: cannot write in {folder}")
        written[f"the {flag} file"] = path


def _write_json(path: Path, data: dict) -> None:
    """Written whole or not at all (`nmt.atomic`)."""
    try:
        atomic.write_text(path, json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise NmtError(f"--json {path}: cannot write ({exc.strerror or exc})") from None
