"""Faster forms of small ops on a CPU: the column form of the attention's dot products and
the bias gradient as a reduction in bfloat16/float16, and dropout's draws as uniform
numbers and a comparison."""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.kernels.ops import ADD_ROW_SUMS, KEEP_MASK, ROW_DOTS
from nmt.randomness import generator

LOW = (torch.bfloat16, torch.float16)


def column_row_dots(context: Tensor, vector: Tensor, out: Tensor | None = None) -> Tensor:
    """`ROW_DOTS` as context times a column vector: oneDNN runs it 1.2-1.7x faster than the
    row form in bfloat16 on a CPU (B 5-80, S 20-45, H 256-600; float16 and float32 the other
    way round). The same dot products."""
    B, S, _ = context.shape
    column = vector.unsqueeze(2)
    if out is None:
        return torch.bmm(context, column).view(B, S)
    torch.bmm(context, column, out=out.view(B, S, 1))
    return out


def reduced_row_sums(acc: Tensor, rows: Tensor, ones: Tensor) -> Tensor:
    """`ADD_ROW_SUMS` as a reduction over the rows: torch's matrix-vector product runs 4-5x
    slower than it in bfloat16 and float16 on a CPU (64 x 1,024: 29 against 7 us; 512 x
    8,000: 593 against 114 us; 2 threads, Zen 4); it sums in float32 as the product does and
    rounds the sum once before adding it."""
    return acc.add_(rows.sum(0))


def uniform_keep_mask_(mask: Tensor, p: float) -> Tensor:
    """`KEEP_MASK` as float32 uniform draws below 1 - p: torch's CPU `bernoulli_` draws each
    element on its own at about 9 ns (152 us for a 64 x 256 mask, 2 threads, Zen 4),
    `uniform_` and a comparison take 51 us; the masks were 3.5% of a float32 training step
    (Multi30k's model). Other draws than `bernoulli_`'s, the same distribution; both
    executors and the autograd model draw through this op, so they draw the same masks."""
    draws = mask if mask.dtype == torch.float32 else torch.empty(mask.shape, device=mask.device)
    draws.uniform_(generator=generator(mask.device))
    return torch.lt(draws, 1.0 - p, out=mask)


ROW_DOTS.register(
    "cpu_bfloat16_column",
    lambda device, dtype: device == "cpu" and dtype == torch.bfloat16,
    column_row_dots,
    note="bfloat16 on a CPU: context times a column vector (oneDNN's faster form there)",
)
ADD_ROW_SUMS.register(
    "cpu_low_precision_sum",
    lambda device, dtype: device == "cpu" and dtype in LOW,
    reduced_row_sums,
    note="bfloat16/float16 on a CPU: a reduction over the rows, not a matrix-vector product",
)
KEEP_MASK.register(
    "cpu_uniform",
    lambda device, dtype: device == "cpu",
    uniform_keep_mask_,
    note="a CPU: uniform draws and a comparison, 3x faster than `bernoulli_` there",
)
