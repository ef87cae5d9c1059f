"""The registered ops (`nmt.kernels` lists them), their references, and the helpers layers
call them through; each faster form registers itself from its own file."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from nmt.kernels import reference
from nmt.kernels.registry import KernelOp

ROW_DOTS = KernelOp("row_dots", "out[b, s] = context[b, s] . vector[b]", reference.row_dots)
ADD_ROW_SUMS = KernelOp("add_row_sums", "acc += the sum of rows' rows", reference.add_row_sums)
KEEP_MASK = KernelOp("keep_mask", "dropout's 0/1 keep draws into a mask", reference.keep_mask_)
LOGITS_BLOCKS = KernelOp(
    "logits_blocks", "the output weight's rows per product", reference.logits_block_rows
)
PACKED_LINEAR = KernelOp(
    "packed_linear", "a weight packed once for search's products", reference.NoPack
)
LSTM_CELL = KernelOp(
    "lstm_cell", "the fused LSTM cell step", reference.OwnCellForm, own_buffers=True
)
GRU_CELL = KernelOp("gru_cell", "the fused GRU cell step", reference.OwnCellForm, own_buffers=True)


def row_dots(context: Tensor, vector: Tensor, out: Tensor | None = None) -> Tensor:
    """`ROW_DOTS` on `context`'s device and dtype."""
    return ROW_DOTS.choose(context.device, context.dtype)(context, vector, out)


def add_row_sums(acc: Tensor, rows: Tensor, ones: Tensor) -> Tensor:
    """`ADD_ROW_SUMS` on `rows`' device and dtype."""
    return ADD_ROW_SUMS.choose(rows.device, rows.dtype)(acc, rows, ones)


def keep_mask_(mask: Tensor, p: float) -> Tensor:
    """`KEEP_MASK` on `mask`'s device (and dtype)."""
    return KEEP_MASK.choose(mask.device, mask.dtype)(mask, p)


def dropout_mask(shape: tuple[int, ...], p: float, like: Tensor) -> Tensor:
    """An inverted-dropout mask (0 or 1/(1-p)) of `like`'s device and dtype, drawn by
    `keep_mask_` from the RNG of that device."""
    mask = torch.empty(shape, dtype=like.dtype, device=like.device)
    return keep_mask_(mask, p).div_(1.0 - p)


def dropout_masks(
    n: int, kinds: Sequence[tuple[tuple[int, ...], float]], like: Tensor
) -> list[Tensor]:
    """n rounds of successive `dropout_mask(shape, p, like)` calls, one per (shape, p) of
    `kinds` in order (the same draws from the same generator), as one n x shape tensor per
    kind, each divided once: slice k of the j-th is what the j-th call of round k draws."""
    masks = [torch.empty((n, *shape), dtype=like.dtype, device=like.device) for shape, _ in kinds]
    for k in range(n):
        for mask, (_, p) in zip(masks, kinds, strict=True):
            keep_mask_(mask[k], p)
    return [mask.div_(1.0 - p) for mask, (_, p) in zip(masks, kinds, strict=True)]
