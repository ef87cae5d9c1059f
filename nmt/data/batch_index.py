"""Training batches cut from a prepared corpus's lengths, each built when it is trained on.

seq2seq-attn's rule, on arrays: the pairs are ordered by source length, then target length
(stable: ties keep the corpus order), and a batch ends when it is full or the source length
changes, so that every batch has ONE source length and the encoder needs neither padding nor
a mask. Full means `train.batch_size` pairs, or with `train.batch_type: tokens` that one more
pair would take the batch's tensors past `train.batch_size` tokens: rows x (source length +
2 + longest target + 1), source and target counted because the clone executor's work and
buffers grow with both (one source length per batch: the source has no padding to count).

What is kept for an epoch is two integer arrays, the pairs in batch order and where each
batch starts, and the target tokens of each batch: nothing per pair as a Python object. A
batch's tensors are gathered from the memory-mapped ids when it is asked for.

`train.shuffle: within_length` shuffles the pairs of each source length anew every epoch
before the cut (each batch's rows are then sorted by target length, as the fused output
layer wants them); each epoch's batches then depend only on (seed, epoch), so a resumed run
and every rank cut the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np
import torch

from nmt.data.batching import Batch, leading_pad_rows
from nmt.data.prepared import PreparedPairs, length_order, order_dtype
from nmt.data.vocab import BOS, EOS, PAD


@dataclass(frozen=True)
class BatchRule:
    """How batches are cut: `size` pairs, or tokens when `by_tokens`; `within_length`: the
    pairs of each source length shuffled every epoch first (`seed`); `weights`: one per
    training corpus (several: each epoch draws from them in these proportions)."""

    size: int
    by_tokens: bool = False
    within_length: bool = False
    seed: int = 0
    weights: tuple[float, ...] = ()

    @property
    def varies(self) -> bool:
        """Whether each epoch has batches of its own."""
        return self.within_length or len(self.weights) > 1

    def draws(self, pairs: PreparedPairs) -> list[int]:
        """How many pairs an epoch draws from each corpus: all pairs together, shared in
        proportion to the weights (a corpus drawn past its size is taken whole as many
        times as it fits, the rest drawn without repeats)."""
        sizes = pairs.corpus_sizes
        if len(self.weights) < 2:
            return list(sizes)
        total, weight = sum(sizes), sum(self.weights)
        return [round(total * w / weight) for w in self.weights]

    def selection(self, pairs: PreparedPairs, epoch: int) -> np.ndarray | None:
        """The pairs epoch `epoch` trains on, with repeats (None: every pair once)."""
        if len(self.weights) < 2:
            return None
        gen = np.random.Generator(np.random.PCG64([self.seed, epoch, 1]))
        parts, start = [], 0
        for n, m in zip(pairs.corpus_sizes, self.draws(pairs), strict=True):
            whole, rest = divmod(m, n)
            parts.append(np.tile(np.arange(start, start + n), whole))
            parts.append(start + np.sort(gen.choice(n, rest, replace=False)))
            start += n
        return np.concatenate(parts)

    def order(self, pairs: PreparedPairs, epoch: int) -> np.ndarray:
        """The pairs in the order the batches take them, grouped by source length."""
        chosen = self.selection(pairs, epoch)
        if chosen is None and not self.within_length:
            return pairs.sorted_by_length()
        src, tgt = pairs.src_lengths, pairs.tgt_lengths
        if chosen is not None:
            src, tgt = src[chosen], tgt[chosen]
        if not self.within_length:
            order = length_order(src, tgt)
        else:
            gen = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            order = np.lexsort((gen.permutation(len(src)), src))
        return order if chosen is None else chosen[order]

    def bounds(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray) -> np.ndarray:
        """Where each batch starts (and, last, where the pairs end) in pairs already in
        batch order, given by their source and target lengths."""
        n = len(src_lengths)
        groups = np.flatnonzero(np.diff(src_lengths.astype(np.int64))) + 1
        starts, ends = np.concatenate(([0], groups)), np.concatenate((groups, [n]))
        bounds = [0]
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            if not self.by_tokens:
                bounds.extend(range(a + self.size, b, self.size))
                bounds.append(b)
                continue
            source = int(src_lengths[a]) + 2  # <s> .. </s>
            most = max(self.size // (source + 1), 1)  # a target takes one token at least
            i = a
            while i < b:
                group = tgt_lengths[i : min(i + most, b)].astype(np.int64)
                widths = np.maximum.accumulate(group + 1)
                rows = np.arange(1, len(widths) + 1)
                fits = int(np.count_nonzero(rows * (source + widths) <= self.size))
                i += max(fits, 1)  # a pair alone over the size still forms a batch
                bounds.append(i)
        return np.asarray(bounds, dtype=np.int64)


class EpochBatches(Sequence[Batch]):
    """One epoch's batches of a prepared corpus, in the order they were cut (the trainer
    shuffles the order, `nmt.data.batching.epoch_order`); `tokens[k]`: batch k's target
    tokens (the end-of-sentence included), counted without building it."""

    def __init__(self, pairs: PreparedPairs, rule: BatchRule, epoch: int = 1):
        self.pairs = pairs
        order = rule.order(pairs, epoch)
        self.order = order.astype(order_dtype(len(order)), copy=False)  # a mapped order stays so
        tgt_lengths = pairs.tgt_lengths[order]
        self.bounds = rule.bounds(pairs.src_lengths[order], tgt_lengths)
        targets = tgt_lengths.astype(np.int64) + 1
        self.tokens = np.add.reduceat(targets, self.bounds[:-1]) if len(order) else targets

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @overload
    def __getitem__(self, index: int) -> Batch: ...

    @overload
    def __getitem__(self, index: slice) -> list[Batch]: ...

    def __getitem__(self, index: int | slice) -> Batch | list[Batch]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        k = index % len(self)
        rows = self.order[self.bounds[k] : self.bounds[k + 1]]
        return gather_batch(self.pairs, rows)


def gather_batch(pairs: PreparedPairs, rows: np.ndarray) -> Batch:
    """The batch of pairs `rows` (all of one source length), its rows sorted by target
    length (stable), as `nmt.data.batching.make_batches` builds one."""
    p = pairs
    rows = rows[np.argsort(p.tgt_lengths[rows], kind="stable")]
    source = int(p.src_lengths[rows[0]])
    src = np.empty((len(rows), source + 2), dtype=np.int64)
    src[:, 0], src[:, -1] = BOS, EOS
    src[:, 1:-1] = p.src_ids[p.src_offsets[rows][:, None] + np.arange(source)]
    lengths = p.tgt_lengths[rows].astype(np.int64)
    width = int(lengths.max()) + 1
    within = np.arange(width - 1) < lengths[:, None]
    where = np.minimum(p.tgt_offsets[rows][:, None] + np.arange(width - 1), len(p.tgt_ids) - 1)
    words = np.where(within, p.tgt_ids[where] if len(p.tgt_ids) else PAD, PAD)
    tgt_in = np.full((len(rows), width), PAD, dtype=np.int64)
    tgt_out = np.full((len(rows), width), PAD, dtype=np.int64)
    tgt_in[:, 0] = BOS
    tgt_in[:, 1:] = words
    tgt_out[:, :-1] = words
    tgt_out[np.arange(len(rows)), lengths] = EOS
    out = torch.from_numpy(tgt_out)
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), out, leading_pad_rows(out))


class TrainingBatches:
    """Every epoch's batches under one rule: the same batches each epoch unless the rule
    shuffles within lengths or draws from weighted corpora."""

    def __init__(self, pairs: PreparedPairs, rule: BatchRule):
        self.pairs, self.rule = pairs, rule
        self._fixed: EpochBatches | None = None

    def epoch(self, epoch: int) -> EpochBatches:
        if self.rule.varies:
            return EpochBatches(self.pairs, self.rule, epoch)
        if self._fixed is None:
            self._fixed = EpochBatches(self.pairs, self.rule)
        return self._fixed
