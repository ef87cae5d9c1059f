"""Batches as seq2seq-attn builds them: one source length per batch, targets padded."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.data.vocab import BOS, EOS, PAD

Example = tuple[list[int], list[int]]
"""(source ids, target ids) without BOS/EOS, as `nmt.data.corpus` produces them."""


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
    # pad_rows[t]: how many leading rows are PAD at target position t, known on the host when
    # the batch is built (`leading_pad_rows`); the fused output layer skips them. None: unknown
    pad_rows: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        return self.src.size(0)

    @property
    def n_tokens(self) -> int:
        """Non-PAD target tokens: the denominator of perplexity."""
        return int((self.tgt_out != PAD).sum())

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.pad_rows
        )


def leading_pad_rows(tgt_out: Tensor) -> tuple[int, ...]:
    """Per target position, the number of leading rows that are PAD there. `make_batches`
    sorts a batch's sentences by target length, so the short ones lead: at a position past
    their end the output layer need not run on them. Read on the host, so call it where
    the batch is built, not inside a step (on a GPU it would wait for the device)."""
    leading = (tgt_out == PAD).to(torch.int32).cumprod(0).sum(0)
    return tuple(int(k) for k in leading.tolist())


def _batch(chunk: list[Example]) -> Batch:
    width = max(len(t) for _, t in chunk) + 1
    tgt_in = [[BOS, *t] + [PAD] * (width - len(t) - 1) for _, t in chunk]
    tgt_out = [[*t, EOS] + [PAD] * (width - len(t) - 1) for _, t in chunk]
    src = [[BOS, *s, EOS] for s, _ in chunk]
    out = torch.tensor(tgt_out, dtype=torch.long)
    return Batch(
        torch.tensor(src, dtype=torch.long),
        torch.tensor(tgt_in, dtype=torch.long),
        out,
        leading_pad_rows(out),
    )


def make_batches(examples: list[Example], batch_size: int) -> list[Batch]:
    """Batches as seq2seq-attn's preprocess.py cuts them, deterministically.

    Examples are sorted by source length, then target length (stable, so ties keep their
    input order); a batch ends when it is full or the source length changes, so every
    batch has ONE source length and the encoder needs neither padding nor a mask.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(examples, key=lambda ex: (len(ex[0]), len(ex[1])))
    batches: list[Batch] = []
    start = 0
    while start < len(order):
        length = len(order[start][0])
        end = start
        while end < len(order) and end - start < batch_size and len(order[end][0]) == length:
            end += 1
        batches.append(_batch(order[start:end]))
        start = end
    return batches


def epoch_order(n_batches: int, seed: int, epoch: int) -> list[int]:
    """The batch order of one epoch: a permutation that depends only on (seed, epoch).

    A private generator keeps it independent of the global RNG, so dropout or
    initialisation draws never change the order, and a resumed run replays it exactly.
    """
    gen = torch.Generator()
    gen.manual_seed((seed * 1_000_003 + epoch) % (2**63))
    return torch.randperm(n_batches, generator=gen).tolist()
