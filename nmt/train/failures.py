"""A failure on one rank stops every rank at the next collective, not minutes later.

Ranks meet only in collectives. A rank that raised and left would leave the others waiting in
their next collective until its timeout (with NCCL nothing else wakes them). So within the
training loop a rank does not raise at once: `attempt` keeps its failure (an out-of-memory
error becomes its one-line `NmtError`), the rank skips its remaining work and joins the next
collective with its flag set - summed with the statistics that collective carries anyway
(`flag`), or in a `vote` of its own - and when the sum says that some rank failed, every rank
raises (`settle`): the failed rank its own error, the others one line naming it.
With a single process, `attempt` raises at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from nmt.data.batching import Batch
from nmt.errors import NmtError
from nmt.out_of_memory import batch_shape, is_out_of_memory, ran_out
from nmt.train import distributed as dd

T = TypeVar("T")
Describe = Callable[[str, Batch], str]  # (what was running, its batch) -> one line


def plain_description(device: torch.device) -> Describe:
    """An out-of-memory line without training advice (for callers outside the trainer)."""

    def describe(where: str, batch: Batch) -> str:
        shape = batch_shape(batch.size, batch.src.size(1), batch.tgt_in.size(1))
        return f"out of memory on {ran_out(device)} in {where} ({shape})"

    return describe


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return first if isinstance(exc, NmtError) else f"{type(exc).__name__}: {first}"


class RankFailures:
    """This rank's failure, held until the ranks next meet (see the module docstring)."""

    def __init__(self, ctx: dd.DistContext, device: torch.device, describe: Describe):
        self.ctx, self.device, self.describe = ctx, device, describe
        self.error: BaseException | None = None

    @property
    def flag(self) -> float:
        """1.0 once this rank has failed: add it to the next collective's sums."""
        return float(self.error is not None)

    def attempt(self, where: str, batch: Batch, fn: Callable[[], T], default: T) -> T:
        """fn(), or `default` when it fails (or this rank failed before) on one of several
        ranks; with one process a failure raises here."""
        if self.error is not None:
            return default
        try:
            return fn()
        except Exception as exc:
            if not is_out_of_memory(exc):
                if not self.ctx.enabled:
                    raise
                self.error = exc
                return default
            error = NmtError(self.describe(where, batch))
        if not self.ctx.enabled:
            raise error
        self.error = error  # the out-of-memory exception (and its frames' tensors) is gone
        return default

    def settle(self, flags: float) -> None:
        """After a collective that summed every rank's `flag`: raise on every rank if any
        failed (one more collective, only then, tells the others which and why)."""
        if flags <= 0:
            return
        reports = dd.gather_objects(None if self.error is None else one_line(self.error), self.ctx)
        if self.error is not None:
            raise self.error
        rank, message = next((r, m) for r, m in enumerate(reports) if m is not None)
        raise NmtError(f"rank {rank} failed, so every rank stopped: {message}")

    def vote(self) -> None:
        """A collective of its own: every rank raises if any rank has failed."""
        if self.ctx.enabled:
            [flags] = dd.all_reduce_sums([self.flag], self.ctx, self.device)
            self.settle(flags)
        elif self.error is not None:
            raise self.error
