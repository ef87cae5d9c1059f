"""The memory peak of beam search (`nmt memreport --translate BEAM[,BATCH]`), on meta.

Beam search decides as it goes (which hypotheses end, which sentences leave the batch), so
it cannot run where no value exists. Its peak, though, is reached in a known state: every
sentence of the batch still searching, at the last position its limit allows, with the
longest history. `beam_peak` replays the search's loop body in that state with the search's
own pieces (`Beam`, `next_log_probs`, `candidates`, `live_candidates`, `decode_step`), two
iterations in one scope so that what the previous iteration leaves referenced (its log-
probabilities and scores) is live while the next one computes, as in `beam_search`. What
depends on values - hypotheses that end, sentences that leave - only ever makes the batch
smaller and is left out.
tests/test_memreport_phases.py holds the replay to a real CPU search under the same tracker.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nmt.data.vocab import BOS, EOS
from nmt.errors import NmtError
from nmt.memreport.tracker import StorageTracker
from nmt.model import Seq2SeqAttn
from nmt.translate.search import SCORES, Beam, candidates, live_candidates, next_log_probs

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
    B, K, S = t.batch_size, t.beam_size, source_length
    history = max(t.max_length - 2, 0)  # tokens before the two replayed positions
    tracker = StorageTracker(list(model.parameters()))
    was_training = model.training
    model.eval()
    try:
        with tracker, torch.inference_mode():
            src = torch.full((B, S), BOS, dtype=torch.long, device=device)
            src_mask = torch.ones(B, S, dtype=torch.bool, device=device)
            context, final = model.encode(src, src_mask)
            rep = torch.arange(B, device=device).repeat_interleave(K)
            beam = Beam(
                alive=torch.arange(B, device=device),
                scores=context.new_zeros(B, K, dtype=SCORES),
                tokens=src.new_zeros(B * K, history),
                attns=context.new_zeros(B * K, history, S),
                state=model.init_decoder_state(final).index_select(rep),
                context=context.index_select(0, rep),
                src_mask=src_mask.index_select(0, rep),
            )
            y = src.new_full((B * K,), BOS)
            for _ in range(2):  # names as in beam_search: each replaces the previous one's
                out, beam.state, attn = model.decode_step(
                    y, beam.state, beam.context, beam.src_mask
                )
                logp = next_log_probs(model, out, forbid_eos=False)
                cand_scores, cand_rows, cand_tokens = candidates(beam.scores, logp, 2 * K)
                live_scores, live_rows, live_tokens = live_candidates(
                    cand_scores, cand_rows, cand_tokens, K, cand_tokens == EOS
                )
                beam = beam.select(
                    live_rows.reshape(-1), live_scores, live_tokens.reshape(-1), attn
                )
                y = beam.tokens[:, -1]
            del context, final, beam, out, attn, logp
    finally:
        model.train(was_training)
    return tracker.peak
