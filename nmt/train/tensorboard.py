"""TensorBoard's event files beside `metrics.jsonl` (`train.tensorboard: true`).

Every number of every record the run log writes to `metrics.jsonl` (training windows:
loss, perplexity, target tokens/s, learning rate, peak memory; validations: perplexity,
BLEU, learning rate; the memory plan's accounted peak) becomes the scalar `KIND/KEY` at the
record's step, written by torch's `SummaryWriter` into `OUT/tensorboard/` - so OpenNMT-py's,
JoeyNMT's and fairseq's users find their curves where they look for them.

A resumed run continues the same curves: its writer starts with TensorBoard's purge marker at
the step after the checkpoint's, so that what the interrupted process wrote past its last
checkpoint (and a resumed run writes again) is dropped by every reader, and no step is shown
twice. A new run in a directory that held one starts with no event files of the old run.

TensorBoard is an optional extra (`pip install 'nmt[tensorboard]'`): a run that asks for it
without it installed is refused before it builds anything (`require`).
"""

from __future__ import annotations

import math
import weakref
from pathlib import Path
from typing import Any

from nmt.errors import NmtError

FOLDER = "tensorboard"
EVENT_FILES = "events.out.tfevents.*"
INSTALL = "pip install 'nmt[tensorboard]'"


def require() -> None:
    """Refuse `train.tensorboard` without TensorBoard installed, in one line saying how to
    install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        raise NmtError(
            f"train.tensorboard: needs the tensorboard package, which is not installed: "
            f"{INSTALL} (or set train.tensorboard false)"
        ) from None


class ScalarWriter:
    """Writes each metrics record's numbers as TensorBoard scalars `KIND/KEY` at its step,
    flushed at once (a record is written at a log step or a validation, never often)."""

    def __init__(self, out_dir: Path, resumed_at: int | None):
        """`resumed_at`: the step of the checkpoint a resumed run starts from (None: a new
        run, whose folder is emptied of a previous run's event files)."""
        from torch.utils.tensorboard import SummaryWriter

        self.folder = Path(out_dir) / FOLDER
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if resumed_at is None:
                for old in self.folder.glob(EVENT_FILES):
                    old.unlink()
        except OSError as exc:
            raise NmtError(f"{self.folder}: cannot write ({exc.strerror or exc})") from None
        purge = None if resumed_at is None else resumed_at + 1
        self.writer = SummaryWriter(str(self.folder), purge_step=purge)
        # closed (its writer thread ended) with the run that holds it; every record is
        # flushed as it comes, so an interrupted process loses none
        weakref.finalize(self, self.writer.close)

    def __call__(self, record: dict[str, Any]) -> None:
        step, kind = int(record["step"]), record["kind"]
        for key, value in record.items():
            if scalar(value) and key not in ("step", "kind"):
                self.writer.add_scalar(f"{kind}/{key}", value, step)
        self.writer.flush()


def scalar(value: Any) -> bool:
    """Whether a record's value is a number to plot (not a flag, a text or a missing BLEU)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value)
