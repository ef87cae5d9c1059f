"""Batches as seq2seq-attn builds them: one source length per batch, targets padded."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        src, tgt_in, tgt_out = (
            t.to(device, non_blocking=non_blocking) for t in (self.src, self.tgt_in, self.tgt_out)
        )
        return Batch(src, tgt_in, tgt_out, self.pad_rows)

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory, which a copy to a GPU can read without the
        host waiting (`to(device, non_blocking=True)`); CUDA builds of torch only."""
        src, tgt_in, tgt_out = (t.pin_memory() for t in (self.src, self.tgt_in, self.tgt_out))
        return Batch(src, tgt_in, tgt_out, self.pad_rows)


def on_device(batches: Iterable[Batch], device: torch.device) -> Iterator[Batch]:
    """`batches` on `device`, each sent one ahead of its use. On CUDA a batch is pinned and
    copied with `non_blocking=True`: a copy from pageable memory is a `cudaMemcpy` that
    makes the host wait for the GPU, a pinned one is queued on the stream like a kernel, so
    the next batch's copy is queued while the current one trains and no step waits."""
    cuda = device.type == "cuda"

    def send(batch: Batch) -> Batch:
        return batch.pin_memory().to(device, non_blocking=True) if cuda else batch.to(device)

    pending: Batch | None = None
    for batch in batches:
        ready = send(batch)
        if pending is not None:
            yield pending
        pending = ready
    if pending is not None:
        yield pending


def leading_pad_rows(tgt_out: Tensor) -> tuple[int, ...]:
    """Per target position, the number of leading rows that are PAD there. `make_batches`
    sorts a batch's sentences by target length, so the short ones lead: at a position past
    their end the output layer need not run on them. Read on the host, so call it where
    the batch is built, not inside a step (on a GPU it would wait for the device)."""
    leading = (tgt_out == PAD).to(torch.int32).cumprod(0).sum(0)
    return tuple(int(k) for k in leading.tolist())


def bucketed(batch: Batch, multiple: int, limit: int) -> Batch:
    """`batch` with its targets padded with PAD up to a length that is a multiple of
    `multiple` (at most `limit`, the longest target a step takes), so that batches of
    nearby lengths share one shape (`train.cuda_graph_bucket`). The padded positions weigh
    nothing in the loss and send no gradient back."""
    length = batch.tgt_in.size(1)
    want = min(-(-length // multiple) * multiple, max(limit, length))
    if want == length:
        return batch
    extra = want - length

    def pad(t: Tensor) -> Tensor:
        return torch.nn.functional.pad(t, (0, extra), value=PAD)

    rows = None if batch.pad_rows is None else (*batch.pad_rows, *[batch.size] * extra)
    return Batch(batch.src, pad(batch.tgt_in), pad(batch.tgt_out), rows)


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
