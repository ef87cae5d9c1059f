"""Source word dropout: training sources with some words replaced by `<unk>`.

Sennrich and Zhang (2019) found dropping whole source words one of the regularisers that
help recurrent models most on small corpora: the decoder cannot lean on any one source word,
and the `<unk>` embedding learns to stand for a word the model cannot see. Each source
token (not `<s>`, `</s>` or padding) becomes `<unk>` with probability p, drawn anew every
time a batch is trained on. Validation and translation read the sources as they are.

The draw depends only on (seed, epoch, batch index), never on the global generator, so a
resumed run and every rank of a distributed one drop the same words.
"""

from __future__ import annotations

import torch

from nmt.data.batching import Batch
from nmt.data.vocab import BOS, EOS, PAD, UNK


def batch_seed(seed: int, epoch: int, index: int) -> int:
    """The draw's seed for batch `index` of epoch `epoch`."""
    return (seed * 1_000_003 + epoch * 7_919 + index * 104_729 + 17) % (2**63)


def drop_source_words(batch: Batch, p: float, seed: int, epoch: int, index: int) -> Batch:
    """`batch` with each source word replaced by `<unk>` with probability `p` (a new batch:
    the stored one is kept for the next epoch's own draw)."""
    if p <= 0:
        return batch
    gen = torch.Generator().manual_seed(batch_seed(seed, epoch, index))
    src = batch.src
    words = (src != BOS) & (src != EOS) & (src != PAD)
    drop = (torch.rand(src.shape, generator=gen) < p) & words
    return Batch(src.masked_fill(drop, UNK), batch.tgt_in, batch.tgt_out, batch.pad_rows)
