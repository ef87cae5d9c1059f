"""Batches as seq2seq-attn builds them: one source length per batch, targets padded."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.vocab import PAD


@dataclass
class Batch:
    """One training batch. The source has no padding (all sentences share its length).

    src:     B x S  <s> w1 .. wn </s>
    tgt_in:  B x T  <s> w1 .. wm <blank>...   (decoder inputs)
    tgt_out: B x T  w1 .. wm </s> <blank>...  (what the decoder must predict)
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor

    @property
    def size(self) -> int:
        return self.src.size(0)

    @property
    def n_tokens(self) -> int:
        """Non-PAD target tokens: the denominator of perplexity."""
        return int((self.tgt_out != PAD).sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device))
