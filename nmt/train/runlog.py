"""The run directory, and what a run leaves beside its checkpoints: `train.log` (the log
lines), `metrics.jsonl` (one JSON object per progress point and per validation), so that a
run can be read or plotted afterwards (`scripts/plot_training.py RUN_DIR`), and
`config.yaml` (the resolved config, from which `nmt train --config OUT/config.yaml` starts
the same run). Resumed runs append; a new run in a directory that held one (`--force`)
starts both files afresh and removes the old run's checkpoints once it has built every part,
so that nothing of the two runs mixes (a stale `ckpt_step*.pt` of a longer run would outlive
the new run's in pruning and in `nmt average`). A write that fails (a full disk) is one
NmtError naming the file."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt.atomic import replacing
from nmt.checkpoint import RUN_CONFIG, step_checkpoints
from nmt.config import Config, commented_yaml
from nmt.errors import NmtError


class RunLog:
    """Tees log lines into `DIR/train.log` and appends metric records to `DIR/metrics.jsonl`."""

    def __init__(self, out_dir: Path | None, echo: Callable[[str], None], fresh: bool = False):
        self.out_dir, self.echo = out_dir, echo
        self._unstarted = {"train.log", "metrics.jsonl"} if fresh else set()
        # where each metrics record also goes (train.tensorboard: `ScalarWriter`)
        self.scalars: Callable[[dict[str, Any]], None] | None = None

    def __call__(self, message: str) -> None:
        self.echo(message)
        self._append("train.log", message)

    def record(self, message: str) -> None:
        """Into `train.log` only (a line the progress bar already shows)."""
        self._append("train.log", message)

    def metrics(self, **record: Any) -> None:
        self._append("metrics.jsonl", json.dumps(record, sort_keys=True))
        if self.scalars is not None:
            self.scalars(record)

    def _append(self, name: str, line: str) -> None:
        if self.out_dir is None:
            return
        path = self.out_dir / name
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            mode = "w" if name in self._unstarted else "a"  # a new run's first line
            with open(path, mode, encoding="utf-8") as handle:
                handle.write(line + "\n")
            self._unstarted.discard(name)
        except OSError as exc:
            raise NmtError(f"{path}: cannot write ({exc.strerror or exc})") from None


def prepare_run_dir(out_dir: Path, *, resume: Path | None, force: bool) -> list[Path]:
    """Make `out_dir` ready for a run, refusing one that holds a run (without `--resume` or
    `--force`), a file, or a place that cannot be written. Returns the folders this made,
    deepest first: what `remove_if_empty` removes if the run fails before writing to them."""
    if out_dir.exists() and not out_dir.is_dir():
        raise NmtError(f"--out {out_dir}: is a file, not a directory")
    if not force:
        _refuse_to_write_over_a_run(out_dir, resume)
    # a link to a directory yet to be made: make it where the link points (mkdir would
    # refuse the link itself as an existing file)
    where = out_dir.resolve() if out_dir.is_symlink() and not out_dir.exists() else out_dir
    made = [p for p in (where, *where.parents) if not p.exists()]
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise NmtError(f"--out {out_dir}: cannot create the run directory ({reason})") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        remove_if_empty(made)
        raise NmtError(f"--out {out_dir}: the run directory is not writable")
    return made


def _refuse_to_write_over_a_run(out_dir: Path, resume: Path | None) -> None:
    """A new run refuses a directory that holds checkpoints; a resumed one refuses a
    directory whose last.pt is not the checkpoint it resumes (another run's, or a later one
    of the same run: resuming model.pt would overwrite it)."""
    last = out_dir / "last.pt"
    if not out_dir.is_dir():
        return
    if resume is None:
        found = [p.name for p in (last, out_dir / "model.pt", *step_checkpoints(out_dir))]
        found = [name for name in found if (out_dir / name).is_file()]
        if found:
            again = f"pass --resume {last} to continue it or " if last.is_file() else "pass "
            raise NmtError(
                f"{out_dir}: already holds a run ({', '.join(found)}); {again}--force to start over"
            )
    elif last.is_file() and resume.is_file() and not last.samefile(resume):
        raise NmtError(
            f"{out_dir}: holds a last.pt that resuming {resume} would write over; resume "
            f"{last}, give another --out, or pass --force"
        )


def clear_previous_run(out_dir: Path) -> list[str]:
    """Remove the checkpoints a previous run left in `out_dir` (`last.pt`, `model.pt`,
    `ckpt_step*.pt`), for a new run there; returns the names removed."""
    found = [out_dir / "last.pt", out_dir / "model.pt", *step_checkpoints(out_dir)]
    removed = [path.name for path in found if path.is_file()]
    for name in removed:
        (out_dir / name).unlink(missing_ok=True)
    return removed


def log_failure(out_dir: Path, since: float, error: str) -> None:
    """Append the error that stopped a run to `out_dir/train.log` if the run wrote to that
    log (modified at or after `since`, a `time.time()` from before the run began), so that
    the log says why it ends; a log this run never touched is a previous run's and is left
    as it is. A log that cannot be written is left too: the error is on stderr already."""
    path = out_dir / "train.log"
    try:
        if path.stat().st_mtime >= since:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(error + "\n")
    except OSError:
        pass


def write_run_config(out_dir: Path, cfg: Config) -> Path:
    """Write `cfg` to `out_dir/config.yaml` (whole or not at all), each key under its doc:
    the config this run trains with (its `auto` choices made concrete, as its checkpoints
    hold it), from which the same run starts again elsewhere."""
    path = out_dir / RUN_CONFIG
    header = [
        f"the config of the run in {out_dir}: defaults filled in, --set applied, auto resolved",
        f"the same run again: nmt train --config {path} --out OTHER_DIR",
        "relative data paths are taken from the working directory",
    ]
    try:
        with replacing(path) as handle:
            handle.write(commented_yaml(cfg, header))
    except OSError as exc:
        raise NmtError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return path


def remove_if_empty(made: list[Path]) -> None:
    """Remove the folders `prepare_run_dir` made (deepest first) that are still empty, so
    that a run failing on bad input leaves nothing behind."""
    for folder in made:
        try:
            folder.rmdir()  # only ever removes an empty directory
        except OSError:
            return


RESUMED = "resumed"  # the record a resumed run starts with: the step of its checkpoint


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of `run_dir/metrics.jsonl`, as the run that holds its last checkpoint saw
    them: a resumed run's first record (`RESUMED`) drops what the interrupted process wrote
    past that checkpoint, and a step logged twice keeps its last record."""
    path = Path(run_dir) / "metrics.jsonl"
    records: dict[tuple[str, int], dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                rec = json.loads(line)
                if rec["kind"] == RESUMED:
                    records = {k: r for k, r in records.items() if r["step"] <= rec["step"]}
                else:
                    records[(rec["kind"], rec["step"])] = rec
    return sorted(records.values(), key=lambda r: (r["step"], r["kind"]))


def acknowledge_stop(signum: int, last: Path, fresh_line: bool) -> None:
    """Say on stderr, from the signal handler, that the stop was heard: `fresh_line` when a
    progress bar holds the line. A handler that interrupts a write to stderr cannot write to
    it again (a reentrant call): the line goes to its file descriptor instead."""
    again = "; Ctrl-C again aborts" if signum == signal.SIGINT else ""
    line = f"{signal.Signals(signum).name}: stopping after this step, saving {last}{again}"
    text = ("\n" if fresh_line else "") + line + "\n"
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (RuntimeError, OSError, AttributeError, ValueError):
        with contextlib.suppress(OSError):
            os.write(2, text.encode())
