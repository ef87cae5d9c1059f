"""The memory peak of beam search (`nmt memreport --translate BEAM[,BATCH]`), on meta.

Beam search decides as it goes (which hypotheses end, which sentences leave the batch), so
it cannot run where no value exists. Its peak, though, is reached in a known state: every
sentence of the batch still searching, at the last positions its limit allows. `beam_peak`
builds the search itself (`search.Search`, whose history buffers have their full width from
the start) and runs its own `step` at the first and the last two positions, then the
gathering of the output's attention: the same code as `nmt translate`, no copy of it. What
depends on values - the host's looks, which cut done sentences - only ever makes the batch
smaller and is left out.
tests/test_memreport_phases.py holds the replay to a real CPU search under the same tracker.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.data.vocab import BOS
from nmt.errors import NmtError
from nmt.memreport.tracker import StorageTracker
from nmt.model import Seq2SeqAttn
from nmt.translate.search import Search, SearchOptions, searching_first

DEFAULT_BATCH = 32  # nmt translate's --batch-size default
DEFAULT_MAX_LENGTH = 250  # nmt translate's --max-length default


@dataclass(frozen=True)
class Translation:
    """What a translation's memory depends on beyond the model: beam size, sentences per
    batch and the longest output (the source length is the config's maximum)."""

    beam_size: int
    batch_size: int = DEFAULT_BATCH
    max_length: int = DEFAULT_MAX_LENGTH

    @classmethod
    def parse(cls, text: str) -> Translation:
        """'5' or '5,32': beam size, and optionally the batch size."""
        parts = [p.strip() for p in text.split(",")]
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            numbers = []
        if len(numbers) not in (1, 2) or min(numbers) < 1:
            raise NmtError(
                f"--translate {text!r}: expected BEAM or BEAM,BATCH (positive integers), "
                "e.g. 5 or 5,32"
            )
        return cls(*numbers)


def beam_peak(model: Seq2SeqAttn, source_length: int, t: Translation) -> int:
    """Bytes of the tensors beam search holds at its peak (parameters not counted) for
    `t.batch_size` sources of `source_length` tokens (<s> and </s> included), on the model's
    device (meta: nothing is allocated)."""
    device = next(model.parameters()).device
    B, S = t.batch_size, source_length
    tracker = StorageTracker(list(model.parameters()))
    was_training = model.training
    model.eval()
    try:
        with tracker, torch.inference_mode():
            src = torch.full((B, S), BOS, dtype=torch.long, device=device)
            src_mask = torch.ones(B, S, dtype=torch.bool, device=device)
            options = SearchOptions(  # </s> held back: every sentence runs to its limit
                beam_size=t.beam_size, n_best=1, max_length=t.max_length, min_length=t.max_length
            )
            search = Search(model, src, src_mask, options, lengths=[S] * B)
            del src, src_mask
            for step in sorted({0, search.steps - 2, search.steps - 1} - {-1}):
                search.step(step)  # its buffers are full-size from the start: the first
                # step, and the last two (where every sentence is cut), are every step's peak
            order = searching_first(search.searching())  # the last look: all done, output
            outputs = search.outputs(order, search.steps - 1)
            del search, outputs, order
    finally:
        model.train(was_training)
    return tracker.peak
